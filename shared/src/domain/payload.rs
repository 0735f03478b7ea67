//! Payloads by reference: a task's input, a step's result, a request body or an event's payload
//! too large to keep inline in the task's items is kept once, outside them (S3 in a stack), and
//! the items hold a [`PayloadRef`] to it. An object is named by its task and the SHA-256 of its
//! bytes, so writing it again is harmless (same name, same bytes) and a reader checks what it
//! reads. The objects live as long as their task: its retention deletes them.

use super::task_id::TaskId;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The largest payload kept inline in a task's items (serialized JSON); a larger one is kept by
/// reference. Small enough that a task's state record, holding a result of every step, stays
/// far below DynamoDB's 400 KB item, and that a write of it costs a few write units.
pub const INLINE_PAYLOAD_BYTES: usize = 8 * 1024;

/// The largest payload sas takes (a task's input, a step's result, a request body, an event's
/// or a callback's payload): Lambda's synchronous invocation payload, the smallest hop a payload
/// may cross (API Gateway takes 10 MB; a Lambda service answers at most this).
pub const MAX_PAYLOAD_BYTES: usize = 6 * 1024 * 1024;

/// What a [`PayloadRef`] takes in an item, at most (serialized JSON: a task id, a hash, a
/// length and their names).
pub const REF_BYTES: usize = 160;

/// What a payload of `bytes` (serialized JSON) takes in a task's items: itself when it is kept
/// inline, else its reference. Whether a payload is kept inline depends on its length alone,
/// so the domain budgets items without knowing where payloads are kept.
pub fn stored_bytes(bytes: usize) -> usize {
    if is_inline(bytes) { bytes } else { REF_BYTES }
}

/// Whether a payload of `bytes` is kept inline in a task's items.
pub fn is_inline(bytes: usize) -> bool {
    bytes <= INLINE_PAYLOAD_BYTES
}

/// The largest payload a queue message carries inline (a step request's body, a reply's
/// result): SQS bills a message per 64 KiB, and this leaves room for the envelope. A larger
/// one travels by reference.
pub const MESSAGE_INLINE_BYTES: usize = 48 * 1024;

/// A payload kept outside the task's items: the task it belongs to, the SHA-256 of its bytes
/// (hex) and their length.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PayloadRef {
    pub task_id: TaskId,
    pub sha256: String,
    pub bytes: u64,
}

impl PayloadRef {
    /// The reference `body` of `task` is kept under.
    pub fn of(task_id: TaskId, body: &[u8]) -> Self {
        Self {
            task_id,
            sha256: hex::encode(Sha256::digest(body)),
            bytes: body.len() as u64,
        }
    }

    /// The prefix of every object of `task`: what its retention deletes.
    pub fn prefix(task_id: TaskId) -> String {
        format!("tasks/{task_id}/")
    }

    /// The object's name: `tasks/<task id>/<sha256>.json`.
    pub fn key(&self) -> String {
        format!("{}{}.json", Self::prefix(self.task_id), self.sha256)
    }

    /// Whether `body` is the payload this reference names (its length and hash).
    pub fn matches(&self, body: &[u8]) -> bool {
        body.len() as u64 == self.bytes && hex::encode(Sha256::digest(body)) == self.sha256
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reference_names_its_task_and_its_bytes_and_checks_them() {
        let task = TaskId::new_random();
        let r = PayloadRef::of(task, b"{\"a\":1}");
        assert_eq!(r.bytes, 7);
        assert_eq!(
            r.sha256,
            "015abd7f5cc57a2dd94b7590f04ad8084273905ee33ec5cebeae62276a97f862"
        );
        assert_eq!(r.key(), format!("tasks/{task}/{}.json", r.sha256));
        assert!(r.key().starts_with(&PayloadRef::prefix(task)));
        assert!(r.matches(b"{\"a\":1}"));
        assert!(!r.matches(b"{\"a\":2}"));
        assert_eq!(
            PayloadRef::of(task, b"{\"a\":1}"),
            r,
            "the same bytes, the same name"
        );
    }
}
