//! Tasks: instances of a workflow. A task's input is any JSON value its workflow's input schema
//! accepts; it is stored once, beside the task's state record, and never changes.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;
use uuid::Uuid;

/// The largest task input accepted (serialized JSON): with the history and the results of up
/// to [`MAX_STEPS`](super::workflow::MAX_STEPS) steps the task's items stay far below
/// DynamoDB's 400 KB, and a step request built from it below SQS's 256 KB.
pub const MAX_INPUT_BYTES: usize = 64 * 1024;
/// The largest result of one step kept in the state record (serialized JSON).
pub const MAX_RESULT_BYTES: usize = 16 * 1024;
/// The most all of a task's kept results may take together (serialized JSON).
pub const MAX_RESULTS_BYTES: usize = 128 * 1024;
/// The largest request body a mapping may build (serialized JSON), below SQS's 256 KB with
/// room for the request's envelope.
pub const MAX_REQUEST_BYTES: usize = 192 * 1024;
/// Longest reply queue URL accepted (SQS URLs are far shorter).
pub const MAX_URL_LEN: usize = 1024;

/// A request field that did not parse, with the field's name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct ValidationError {
    pub field: String,
    pub problem: String,
}

impl ValidationError {
    pub fn new(field: impl Into<String>, problem: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            problem: problem.into(),
        }
    }
}

/// The id of a task: a UUID, chosen by the submission function.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct TaskId(Uuid);

impl TaskId {
    pub fn new_random() -> Self {
        Self(Uuid::new_v4())
    }
    pub fn as_uuid(&self) -> Uuid {
        self.0
    }
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for TaskId {
    type Err = ValidationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Uuid::parse_str(s)
            .map(Self)
            .map_err(|_| ValidationError::new("taskId", "must be a UUID"))
    }
}

/// Checks a reply queue URL (`Reply-Queue-Url`): an http(s) URL with a host.
pub fn parse_queue_url(u: &str) -> Result<String, ValidationError> {
    const FIELD: &str = "Reply-Queue-Url";
    if u.len() > MAX_URL_LEN {
        return Err(ValidationError::new(
            FIELD,
            format!("must be at most {MAX_URL_LEN} characters"),
        ));
    }
    let parsed = url::Url::parse(u)
        .map_err(|e| ValidationError::new(FIELD, format!("must be a URL ({e})")))?;
    if !matches!(parsed.scheme(), "https" | "http" | "memory") || parsed.host_str().is_none() {
        return Err(ValidationError::new(
            FIELD,
            "must be an http(s) queue URL with a host",
        ));
    }
    Ok(u.to_owned())
}

/// An accepted task, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Task {
    pub id: TaskId,
    pub workflow: String,
    pub workflow_version: u32,
    /// The input, as the workflow's input schema accepted it.
    pub input: serde_json::Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_queue_url: Option<String>,
    pub created_at: DateTime<Utc>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_id_parses_only_uuids() {
        assert!("not-a-uuid".parse::<TaskId>().is_err());
        let id = TaskId::new_random();
        assert_eq!(id.to_string().parse::<TaskId>().ok(), Some(id));
    }

    #[test]
    fn reply_queue_urls_need_a_scheme_and_host() {
        assert!(parse_queue_url("https://sqs.eu-west-1.amazonaws.com/1/q").is_ok());
        for bad in ["nope", "ftp://x/q", "https://", &"h".repeat(2000)] {
            assert!(parse_queue_url(bad).is_err(), "{bad}");
        }
    }
}
