//! The wire types of the sas HTTP API, as `sasctl` reads them.
//!
//! Decoding is lenient: unknown fields are ignored, optional fields that are missing or `null`
//! become `None` (or an empty list), and a process state this version does not know is kept as
//! [`ProcessState::Other`] rather than failing the whole answer.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::str::FromStr;

/// The state of an order's process.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ProcessState {
    Pending,
    Processing,
    Processed,
    Error,
    Compensating,
    Compensated,
    CompensationFailed,
    /// A state this version of `sasctl` does not know (a newer server); never terminal.
    Other(String),
}

/// The states the API documents, in lifecycle order.
pub static KNOWN_STATES: [ProcessState; 7] = [
    ProcessState::Pending,
    ProcessState::Processing,
    ProcessState::Processed,
    ProcessState::Error,
    ProcessState::Compensating,
    ProcessState::Compensated,
    ProcessState::CompensationFailed,
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
            Self::Other(_) => return None,
        })
    }

    /// Whether the process has ended: Processed, Error, Compensated or CompensationFailed.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            Self::Processed | Self::Error | Self::Compensated | Self::CompensationFailed
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
    "unknown state {0:?}; expected one of Pending, Processing, Processed, Error, Compensating, Compensated, CompensationFailed"
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

/// One page of `GET /orders`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListPage {
    #[serde(default, deserialize_with = "null_as_default")]
    pub orders: Vec<OrderSummary>,
    /// Pass back as `cursor` for the next page; `None` on the last page.
    #[serde(default)]
    pub next_cursor: Option<String>,
}

/// One row of `GET /orders`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OrderSummary {
    pub order_id: String,
    pub process_state: ProcessState,
    #[serde(default)]
    pub step: Option<String>,
    #[serde(default)]
    pub failure_count: Option<u32>,
    #[serde(default)]
    pub attempt: Option<u64>,
    #[serde(default)]
    pub last_error: Option<String>,
    #[serde(default)]
    pub updated_at: Option<DateTime<Utc>>,
}

/// `GET /orders/{id}`, and the answer to the retry, compensate and cancel actions (which may
/// carry only `orderId` and `processState`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OrderView {
    pub order_id: String,
    pub process_state: ProcessState,
    #[serde(default)]
    pub customer_id: Option<String>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub items: Vec<Item>,
    #[serde(default)]
    pub step: Option<String>,
    #[serde(default)]
    pub failure_count: Option<u32>,
    #[serde(default)]
    pub attempt: Option<u64>,
    #[serde(default)]
    pub last_error: Option<String>,
    #[serde(default)]
    pub created_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub updated_at: Option<DateTime<Utc>>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub steps: Vec<StepView>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub history: Vec<HistoryEntry>,
}

/// A line item of an order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Item {
    pub sku: String,
    pub quantity: u64,
}

/// One workflow step of an order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StepView {
    pub name: String,
    /// Pending, Running, Done, Failed (refused), TimedOut or Cancelled.
    pub status: String,
    /// The compensation of this step: `None` (not started), Running, Done, Failed or TimedOut.
    #[serde(default)]
    pub undo: Option<String>,
}

/// One state transition of an order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HistoryEntry {
    pub at: DateTime<Utc>,
    #[serde(default)]
    pub from: Option<ProcessState>,
    pub to: ProcessState,
    #[serde(default)]
    pub step: Option<String>,
    #[serde(default)]
    pub attempt: Option<u64>,
    #[serde(default)]
    pub reason: Option<String>,
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
            ["Processed", "Error", "Compensated", "CompensationFailed"]
        );
        assert!(!ProcessState::Other("X".into()).is_terminal());
    }

    #[test]
    fn order_view_decodes_leniently() -> Result<(), serde_json::Error> {
        // A minimal action answer.
        let v: OrderView =
            serde_json::from_value(json!({"orderId": "o1", "processState": "Pending"}))?;
        assert_eq!(v.process_state, ProcessState::Pending);
        assert!(v.steps.is_empty() && v.history.is_empty() && v.step.is_none());

        // A full view with nulls, unknown fields and an unknown state.
        let v: OrderView = serde_json::from_value(json!({
            "orderId": "o2", "customerId": "c", "processState": "Cancelled",
            "items": [{"sku": "A", "quantity": 2}], "step": null, "failureCount": null,
            "attempt": 3, "lastError": null, "createdAt": "2025-01-02T03:04:05Z",
            "updatedAt": "2025-01-02T03:04:06.123Z", "lockedBy": "x",
            "steps": [{"name": "s1", "status": "Done", "undo": null, "finishedAt": "2025-01-02T03:04:05Z"}],
            "history": [{"at": "2025-01-02T03:04:05Z", "from": null, "to": "Pending", "reason": "submitted"}],
        }))?;
        assert_eq!(v.process_state, ProcessState::Other("Cancelled".into()));
        assert_eq!(v.items[0].quantity, 2);
        assert_eq!(v.steps[0].undo, None);
        assert_eq!(v.history[0].from, None);
        assert_eq!(v.history[0].attempt, None);
        assert_eq!(v.attempt, Some(3));

        let p: ListPage = serde_json::from_value(json!({"orders": null}))?;
        assert!(p.orders.is_empty() && p.next_cursor.is_none());
        Ok(())
    }
}
