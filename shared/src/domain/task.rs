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

/// Where a task's status messages may go (`Reply-Queue-Url`): the deployment's allowed URL
/// patterns, each a queue URL whose name ends in `*` (the template's
/// `https://sqs.<region>.<suffix>/<account>/sasreply-<Stage>--*`). The account, the region and
/// a name prefix that no queue of a sas stack has (they all start `sas-`), and that no other
/// stage's prefix matches (a stage name has no `--`), so a caller can only name its own queues.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReplyQueues {
    patterns: Vec<String>,
}

/// The longest SQS queue name.
const MAX_QUEUE_NAME: usize = 80;

impl ReplyQueues {
    /// Patterns as the configuration gives them (comma-separated `...*`). A pattern without
    /// its trailing `*` is refused: it would allow exactly one queue, which is never meant.
    pub fn parse(spec: &str) -> Result<Self, ValidationError> {
        let patterns: Vec<String> = spec
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(|p| match p.strip_suffix('*') {
                Some(base) if base.contains("://") && !base.ends_with('/') => Ok(base.to_owned()),
                _ => Err(ValidationError::new(
                    "REPLY_QUEUES",
                    format!("{p:?} must be a queue URL ending in a name prefix and `*`"),
                )),
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { patterns })
    }

    /// No reply queue is allowed.
    pub fn none() -> Self {
        Self::default()
    }

    pub fn patterns(&self) -> impl Iterator<Item = String> + '_ {
        self.patterns.iter().map(|p| format!("{p}*"))
    }

    /// Checks `u` against the patterns: a URL that starts with one of them, followed by the
    /// rest of a standard queue's name (letters, digits, `-`, `_`; at most 80 characters in all).
    pub fn check(&self, u: &str) -> Result<String, ValidationError> {
        const FIELD: &str = "Reply-Queue-Url";
        let u = parse_queue_url(u)?;
        let allowed = self.patterns.iter().any(|base| {
            u.strip_prefix(base.as_str()).is_some_and(|rest| {
                let name_len = base.rsplit('/').next().map_or(0, str::len) + rest.len();
                !rest.is_empty()
                    && name_len <= MAX_QUEUE_NAME
                    && rest
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            })
        });
        if allowed {
            Ok(u)
        } else if self.patterns.is_empty() {
            Err(ValidationError::new(
                FIELD,
                "this deployment allows no reply queues",
            ))
        } else {
            Err(ValidationError::new(
                FIELD,
                format!(
                    "must be a standard queue matching {}",
                    self.patterns().collect::<Vec<_>>().join(" or ")
                ),
            ))
        }
    }
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
    /// Who started it: the only caller that may read, list or cancel it on the task API.
    pub caller: super::Caller,
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
    fn reply_queues_must_match_the_deployments_pattern() {
        let allowed = ReplyQueues::parse(
            "https://sqs.eu-west-1.amazonaws.com/123456789012/sasreply-prod--*, https://eu-west-1.queue.amazonaws.com/123456789012/sasreply-prod--*",
        )
        .expect("patterns");
        for ok in [
            "https://sqs.eu-west-1.amazonaws.com/123456789012/sasreply-prod--shop",
            "https://eu-west-1.queue.amazonaws.com/123456789012/sasreply-prod--shop_2",
        ] {
            assert_eq!(allowed.check(ok), Ok(ok.to_owned()), "{ok}");
        }
        for bad in [
            // Another account, another region, the stack's own queues, another stage.
            "https://sqs.eu-west-1.amazonaws.com/210987654321/sasreply-prod--shop",
            "https://sqs.us-east-1.amazonaws.com/123456789012/sasreply-prod--shop",
            "https://sqs.eu-west-1.amazonaws.com/123456789012/sas-prod-work",
            "https://sqs.eu-west-1.amazonaws.com/123456789012/sasreply-prod-client--shop",
            "https://sqs.eu-west-1.amazonaws.com/123456789012/sasreply-prod--",
            "https://sqs.eu-west-1.amazonaws.com/123456789012/sasreply-prod--a/b",
            "https://sqs.eu-west-1.amazonaws.com/123456789012/sasreply-prod--q.fifo",
            "http://sqs.eu-west-1.amazonaws.com/123456789012/sasreply-prod--shop",
            &format!(
                "https://sqs.eu-west-1.amazonaws.com/123456789012/sasreply-prod--{}",
                "x".repeat(80)
            ),
        ] {
            let e = allowed.check(bad).expect_err(bad);
            assert_eq!(e.field, "Reply-Queue-Url");
        }
        assert!(
            ReplyQueues::none()
                .check("https://sqs.eu-west-1.amazonaws.com/1/q")
                .is_err()
        );
        assert!(ReplyQueues::parse("https://sqs.eu-west-1.amazonaws.com/1/q").is_err());
        assert!(ReplyQueues::parse("sasreply-*").is_err());
    }

    #[test]
    fn reply_queue_urls_need_a_scheme_and_host() {
        assert!(parse_queue_url("https://sqs.eu-west-1.amazonaws.com/1/q").is_ok());
        for bad in ["nope", "ftp://x/q", "https://", &"h".repeat(2000)] {
            assert!(parse_queue_url(bad).is_err(), "{bad}");
        }
    }
}
