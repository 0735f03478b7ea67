//! The wire types of the sas HTTP API, as `sasctl` reads them.
//!
//! Decoding is lenient: unknown fields are ignored, optional fields that are missing or `null`
//! become `None` (or an empty list), and a process state this version does not know is kept as
//! [`ProcessState::Other`] rather than failing the whole answer.

use chrono::{DateTime, Utc};
use sas::api::views;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;
use std::fmt;
use std::str::FromStr;

/// The state of a task's process.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ProcessState {
    Pending,
    Processing,
    Processed,
    Error,
    Compensating,
    Compensated,
    CompensationFailed,
    /// A service refused a step (a business outcome) and the task is compensated.
    Refused,
    /// An operator closed a failed task by hand, with a note.
    Resolved,
    /// A state this version of `sasctl` does not know (a newer server); never terminal.
    Other(String),
}

/// The states the API documents, as a task goes through them.
pub static KNOWN_STATES: [ProcessState; 9] = [
    ProcessState::Pending,
    ProcessState::Processing,
    ProcessState::Processed,
    ProcessState::Error,
    ProcessState::Compensating,
    ProcessState::Compensated,
    ProcessState::CompensationFailed,
    ProcessState::Refused,
    ProcessState::Resolved,
];

impl ProcessState {
    /// The wire name, e.g. `"CompensationFailed"`.
    pub fn as_str(&self) -> &str {
        match self {
            Self::Other(s) => s,
            known => known.known_name().unwrap_or_default(),
        }
    }

    /// The wire name of a documented state; `None` for [`ProcessState::Other`].
    pub fn known_name(&self) -> Option<&'static str> {
        Some(match self {
            Self::Pending => "Pending",
            Self::Processing => "Processing",
            Self::Processed => "Processed",
            Self::Error => "Error",
            Self::Compensating => "Compensating",
            Self::Compensated => "Compensated",
            Self::CompensationFailed => "CompensationFailed",
            Self::Refused => "Refused",
            Self::Resolved => "Resolved",
            Self::Other(_) => return None,
        })
    }

    /// Whether the process has ended: Processed, Error, Compensated, CompensationFailed,
    /// Refused or Resolved.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            Self::Processed
                | Self::Error
                | Self::Compensated
                | Self::CompensationFailed
                | Self::Refused
                | Self::Resolved
        )
    }

    /// Maps a wire name to a state; unknown names become [`ProcessState::Other`].
    pub fn from_wire(s: &str) -> Self {
        KNOWN_STATES
            .iter()
            .find(|k| k.as_str() == s)
            .cloned()
            .unwrap_or_else(|| Self::Other(s.to_owned()))
    }
}

impl fmt::Display for ProcessState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An unknown state name given by a user.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown state {0:?}; expected one of Pending, Processing, Processed, Error, Compensating, Compensated, CompensationFailed, Refused, Resolved"
)]
pub struct UnknownState(pub String);

impl FromStr for ProcessState {
    type Err = UnknownState;
    /// Parses one of the documented states, ignoring ASCII case.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        KNOWN_STATES
            .iter()
            .find(|k| k.as_str().eq_ignore_ascii_case(s))
            .cloned()
            .ok_or_else(|| UnknownState(s.to_owned()))
    }
}

impl Serialize for ProcessState {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for ProcessState {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Ok(Self::from_wire(&s))
    }
}

impl clap::ValueEnum for ProcessState {
    fn value_variants<'a>() -> &'a [Self] {
        &KNOWN_STATES
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        self.known_name().map(clap::builder::PossibleValue::new)
    }
}

/// Deserializes a possibly `null` value as its default.
fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// One page of `GET /tasks`: the server's own type ([`sas::api::views`]) with this crate's
/// lenient [`ProcessState`].
pub type ListPage = views::ListPage<TaskSummary>;

/// One row of `GET /tasks`.
pub type TaskSummary = views::TaskSummary<ProcessState>;

/// `GET /tasks/{id}`, and the answer to the actions (which may carry only `taskId` and
/// `processState`).
pub type TaskView = views::TaskView<ProcessState>;

/// One workflow step of a task.
pub use views::StepView;

/// One state transition of a task.
pub type HistoryEntry = views::HistoryEntry<ProcessState>;

/// One name in the catalog and its newest version: a row of `GET /workflows` or
/// `GET /services`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CatalogEntry {
    pub name: String,
    pub latest: u32,
}

/// `GET /workflows`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkflowList {
    #[serde(default, deserialize_with = "null_as_default")]
    pub workflows: Vec<CatalogEntry>,
}

/// `GET /services`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceList {
    #[serde(default, deserialize_with = "null_as_default")]
    pub services: Vec<ServiceEntry>,
}

/// A published service, its newest version and its circuit breaker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceEntry {
    pub name: String,
    pub latest: u32,
    /// `None`: a server that does not show breakers.
    #[serde(default)]
    pub breaker: Option<BreakerView>,
    /// The service's declared limits (`concurrency`, `rate`, `actions`), if any.
    #[serde(default)]
    pub limits: Option<serde_json::Value>,
    /// Without a declared `concurrency`: the deployment's cap on its calls in flight.
    #[serde(default)]
    pub share: Option<u32>,
    /// Its calls in flight now.
    #[serde(default, rename = "inFlight")]
    pub in_flight: Option<u32>,
    /// Its steps waiting on a limit.
    #[serde(default)]
    pub waiting: Option<u32>,
}

/// A service's circuit breaker: `closed`, `open`, `half-open` or `paused`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BreakerView {
    pub state: String,
    #[serde(default)]
    pub failures: Option<u32>,
    #[serde(default)]
    pub until: Option<DateTime<Utc>>,
    #[serde(default)]
    pub since: Option<DateTime<Utc>>,
    /// Who paused it and why.
    #[serde(default)]
    pub note: Option<String>,
}

/// One published version of a definition: `GET /workflows/{name}`,
/// `GET /workflows/{name}/versions/{v}`, `GET /services/{name}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DefinitionView {
    pub name: String,
    pub version: u32,
    #[serde(default)]
    pub published_at: Option<DateTime<Utc>>,
    /// The definition as published (a workflow or one service), as JSON.
    pub definition: Value,
}

/// The answer to `PUT /workflows/{name}` and `PUT /services/{name}`: the version now newest,
/// and whether this call created it (201) or found the same definition already newest (200).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Published {
    pub name: String,
    pub version: u32,
    pub created: bool,
}

/// One problem the API found in a definition (`invalid_definition`) or a task input
/// (`validation_failed`), at a JSON pointer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiProblem {
    #[serde(default)]
    pub at: String,
    #[serde(default)]
    pub message: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub problems: Vec<ApiProblem>,
}

impl fmt::Display for ApiProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        sas::domain::problem::Problem::write(f, &self.at, &self.message)
    }
}

/// The error body: `{"error": {"code": ..., "message": ...}}`.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct ErrorDetail {
    pub code: String,
    #[serde(default)]
    pub message: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub problems: Vec<ApiProblem>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn states_round_trip_and_parse_case_insensitively() {
        for s in &KNOWN_STATES {
            assert_eq!(ProcessState::from_wire(s.as_str()), *s);
            assert_eq!(
                s.as_str().to_lowercase().parse::<ProcessState>(),
                Ok(s.clone())
            );
        }
        assert!("Bogus".parse::<ProcessState>().is_err());
        assert_eq!(
            ProcessState::from_wire("Cancelled"),
            ProcessState::Other("Cancelled".into())
        );
        let terminal: Vec<_> = KNOWN_STATES
            .iter()
            .filter(|s| s.is_terminal())
            .map(ProcessState::as_str)
            .collect();
        assert_eq!(
            terminal,
            [
                "Processed",
                "Error",
                "Compensated",
                "CompensationFailed",
                "Refused",
                "Resolved"
            ]
        );
        assert!(!ProcessState::Other("X".into()).is_terminal());
    }

    #[test]
    fn task_view_decodes_leniently() -> Result<(), serde_json::Error> {
        // A minimal action answer.
        let v: TaskView =
            serde_json::from_value(json!({"taskId": "t1", "processState": "Pending"}))?;
        assert_eq!(v.process_state, ProcessState::Pending);
        assert!(v.steps.is_empty() && v.history.is_empty() && v.current_step.is_none());
        assert!(v.workflow.is_none() && v.input.is_none());

        // A full view with nulls, unknown fields and an unknown state.
        let v: TaskView = serde_json::from_value(json!({
            "taskId": "t2", "workflow": "loan-application", "workflowVersion": 3,
            "input": {"applicantId": "a1", "amount": 500},
            "processState": "Cancelled", "currentStep": "reserve-funds", "failureCount": null,
            "attempt": 3, "lastError": null, "createdAt": "2025-01-02T03:04:05Z",
            "updatedAt": "2025-01-02T03:04:06.123Z", "lockedBy": "x", "round": 0,
            "steps": [
                {"name": "check-credit", "status": "Done", "undoable": false, "sent": true,
                 "generation": 0, "result": {"id": "r1"}, "finishedAt": "2025-01-02T03:04:05Z"},
                {"name": "reserve-funds", "status": "Faulted", "undo": null},
            ],
            "history": [{"at": "2025-01-02T03:04:05Z", "from": null, "to": "Pending", "reason": "submitted"}],
        }))?;
        assert_eq!(v.process_state, ProcessState::Other("Cancelled".into()));
        assert_eq!(v.workflow.as_deref(), Some("loan-application"));
        assert_eq!(v.workflow_version, Some(3));
        assert_eq!(v.input, Some(json!({"applicantId": "a1", "amount": 500})));
        assert_eq!(v.current_step.as_deref(), Some("reserve-funds"));
        assert_eq!(v.steps[0].undoable, Some(false));
        assert_eq!(v.steps[0].result, Some(json!({"id": "r1"})));
        assert_eq!(v.steps[1].undoable, None);
        assert_eq!(v.steps[1].undo, None);
        assert_eq!(v.history[0].from, None);
        assert_eq!(v.history[0].attempt, None);
        assert_eq!(v.attempt, Some(3));

        // `step` is read as the current step too.
        let v: TaskView = serde_json::from_value(
            json!({"taskId": "t3", "processState": "Processing", "step": "s1"}),
        )?;
        assert_eq!(v.current_step.as_deref(), Some("s1"));

        let p: ListPage = serde_json::from_value(json!({"tasks": null}))?;
        assert!(p.tasks.is_empty() && p.next_cursor.is_none());
        let p: ListPage = serde_json::from_value(json!({
            "tasks": [{"taskId": "t1", "workflow": "w", "processState": "Error", "step": null}],
            "nextCursor": "c",
        }))?;
        assert_eq!(p.tasks[0].workflow.as_deref(), Some("w"));
        assert_eq!(p.next_cursor.as_deref(), Some("c"));
        Ok(())
    }

    #[test]
    fn catalog_answers_decode() -> Result<(), serde_json::Error> {
        let l: WorkflowList = serde_json::from_value(
            json!({"workflows": [{"name": "loan-application", "latest": 2}]}),
        )?;
        assert_eq!(
            l.workflows,
            [CatalogEntry {
                name: "loan-application".into(),
                latest: 2
            }]
        );
        let l: ServiceList = serde_json::from_value(json!({"services": null}))?;
        assert!(l.services.is_empty());
        let d: DefinitionView = serde_json::from_value(json!({
            "name": "w", "version": 4, "publishedAt": "2025-01-02T03:04:05Z",
            "definition": {"name": "w", "steps": []},
        }))?;
        assert_eq!(d.version, 4);
        assert_eq!(d.definition["name"], json!("w"));
        let p: Published =
            serde_json::from_value(json!({"name": "w", "version": 1, "created": true}))?;
        assert!(p.created);
        let e: ErrorBody = serde_json::from_value(json!({"error": {
            "code": "invalid_definition", "message": "m",
            "problems": [{"at": "/steps/0/service", "message": "unknown service"}, {"at": "", "message": "x"}],
        }}))?;
        assert_eq!(e.error.problems.len(), 2);
        assert_eq!(
            e.error.problems[0].to_string(),
            "at /steps/0/service: unknown service"
        );
        assert_eq!(e.error.problems[1].to_string(), "x");
        Ok(())
    }
}
