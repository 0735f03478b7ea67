//! A task's named events (`POST /tasks/{id}/events/{name}`): one delivered before the step
//! that waits for it is reached is kept here and consumed when that step is reached; the ids of
//! the events taken are remembered, so a repeat (the same `Event-Id`) is harmless.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// The most events a task keeps for steps it has not reached.
pub const MAX_KEPT: usize = 8;
/// The most event ids a task remembers (the newest).
pub const MAX_SEEN: usize = 32;
/// The largest payload an event carries (as its JSON text): within a step's result's limit
/// (`state::MAX_RESULT_BYTES`, which a test holds it to), since it becomes the step's result.
/// One kept for a step not reached yet waits in the record, by reference when it is past the
/// inline size ([`crate::domain::payload`]), as a result does. (An event from the task-events
/// bus is smaller still: EventBridge carries at most 256 KB.)
pub const MAX_PAYLOAD_BYTES: usize = 1024 * 1024;

#[cfg(test)]
mod tests {
    #[test]
    fn a_payload_fits_where_a_result_does() {
        const { assert!(super::MAX_PAYLOAD_BYTES <= crate::domain::state::MAX_RESULT_BYTES) };
    }
}

/// The events kept for steps not reached yet, and the ids of those taken.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Inbox {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kept: Vec<KeptEvent>,
    /// The ids of the events taken (kept or consumed), oldest first, at most [`MAX_SEEN`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub seen: Vec<String>,
}

/// An event delivered before its step was reached.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KeptEvent {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The payload, as JSON text (empty in the item while it is kept by reference).
    pub payload: String,
    /// Where the payload is kept when it is past the inline size (set by the store's edge).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload_ref: Option<crate::domain::payload::PayloadRef>,
    pub at: DateTime<Utc>,
}

impl KeptEvent {
    /// The bytes it takes as its step's result, once its wait is reached: counted with the
    /// task's results from when it is kept (`StateRecord::results_bytes`).
    pub fn result_bytes(&self) -> usize {
        result_of(&self.name, &self.payload).len()
    }
}

/// One event as delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    pub name: String,
    /// The sender's `Event-Id`, if any: a second delivery under it changes nothing.
    pub id: Option<String>,
    /// The payload, as JSON text.
    pub payload: String,
}

impl Inbox {
    pub fn is_empty(&self) -> bool {
        self.kept.is_empty() && self.seen.is_empty()
    }

    /// Whether an event under `id` was taken already.
    pub fn has_seen(&self, id: Option<&str>) -> bool {
        id.is_some_and(|id| self.seen.iter().any(|s| s == id))
    }

    /// Remembers `id` (the oldest forgotten past [`MAX_SEEN`]).
    pub fn remember(&mut self, id: Option<&str>) {
        if let Some(id) = id {
            if self.seen.len() >= MAX_SEEN {
                self.seen.remove(0);
            }
            self.seen.push(id.to_owned());
        }
    }

    /// Takes the first kept event named one of `names`, if any.
    pub fn take(&mut self, names: &[String]) -> Option<KeptEvent> {
        let k = self.kept.iter().position(|e| names.contains(&e.name))?;
        Some(self.kept.remove(k))
    }
}

/// A wait for an event step's result: which event came, and its payload.
pub fn result_of(name: &str, payload: &str) -> String {
    let payload: serde_json::Value =
        serde_json::from_str(payload).unwrap_or(serde_json::Value::Null);
    serde_json::json!({"event": name, "payload": payload}).to_string()
}
