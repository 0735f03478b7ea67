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

/// The most bytes (as JSON text) a view shows of one payload whole; a larger one shows as its
/// size and hash. A distributed forEach's result past it is kept as JSON Lines by reference
/// (never read back into its task's record unless a query reads it): below it, the result is
/// an ordinary one, which views show whole as they always did.
pub const SHOWN_WHOLE_BYTES: usize = 256 * 1024;

/// The largest payload a queue message carries inline (a step request's body, a reply's
/// result): SQS bills a message per 64 KiB, and this leaves room for the envelope. A larger
/// one travels by reference.
pub const MESSAGE_INLINE_BYTES: usize = 48 * 1024;

/// What a JSON Lines reference ([`PayloadRef::lines`]) takes in an item, at most: a
/// [`REF_BYTES`] reference with its line count and its object's name.
pub const LINES_REF_BYTES: usize = 256;

/// A payload kept outside the task's items: the task it belongs to, the SHA-256 of its bytes
/// (hex) and their length; and, for a JSON Lines payload, its lines.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PayloadRef {
    pub task_id: TaskId,
    pub sha256: String,
    pub bytes: u64,
    /// Set for a JSON Lines payload: an array kept one element per line, in order (a
    /// distributed forEach's result past [`MESSAGE_INLINE_BYTES`]), written as it was read,
    /// never whole in memory. Absent (and not written) for every other payload, so references
    /// stored or sent before it existed read as they were.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lines: Option<Lines>,
}

/// What a JSON Lines payload's reference adds: how many lines (the array's elements) and the
/// name of its object. The name is drawn when the write begins, not made from the bytes (S3
/// takes a multipart upload's key before its first part, when no hash is known): a writer that
/// dies and runs again writes a second object under a second name, which nothing references
/// and the task's retention deletes with the rest of its prefix.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Lines {
    pub count: u64,
    pub name: String,
}

impl Lines {
    /// Whether `name` may name an object: letters, digits, `-` and `_` only, so that a
    /// reference read from a damaged item never names a key outside its task's prefix (or a
    /// path outside a folder, on disk).
    fn plain(name: &str) -> bool {
        !name.is_empty()
            && name.len() <= 64
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    }
}

/// A line that cannot be one line of a JSON Lines payload (it holds a line break).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {index} of a JSON Lines payload holds a line break")]
pub struct NotALine {
    pub index: u64,
}

/// A JSON Lines payload as it is written: its object's name, drawn at the start, and the
/// SHA-256, length and count of the lines given so far. Each payload store writes the bytes
/// [`LinesWriter::push`] appends, in order, and answers [`LinesWriter::finish`].
pub struct LinesWriter {
    task_id: TaskId,
    name: String,
    hasher: Sha256,
    bytes: u64,
    count: u64,
}

impl LinesWriter {
    /// A new payload of `task_id`, under a name of its own (a random UUID's hex).
    pub fn new(task_id: TaskId) -> Self {
        Self {
            task_id,
            name: uuid::Uuid::new_v4().simple().to_string(),
            hasher: Sha256::new(),
            bytes: 0,
            count: 0,
        }
    }

    /// The object's name: `tasks/<task id>/<name>.jsonl`.
    pub fn key(&self) -> String {
        lines_key(self.task_id, &self.name)
    }

    /// Appends `line` (one JSON value, compact) and its `\n` to `out`, hashed and counted.
    pub fn push(&mut self, line: &[u8], out: &mut Vec<u8>) -> Result<(), NotALine> {
        if line.contains(&b'\n') {
            return Err(NotALine { index: self.count });
        }
        self.hasher.update(line);
        self.hasher.update(b"\n");
        out.extend_from_slice(line);
        out.push(b'\n');
        self.bytes += line.len() as u64 + 1;
        self.count += 1;
        Ok(())
    }

    /// The bytes appended so far.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The reference of what was pushed.
    pub fn finish(self) -> PayloadRef {
        PayloadRef {
            task_id: self.task_id,
            sha256: hex::encode(self.hasher.finalize()),
            bytes: self.bytes,
            lines: Some(Lines {
                count: self.count,
                name: self.name,
            }),
        }
    }
}

fn lines_key(task_id: TaskId, name: &str) -> String {
    format!("{}{name}.jsonl", PayloadRef::prefix(task_id))
}

/// The JSON array a JSON Lines payload holds: each line parsed, in order (an empty line, as a
/// last line's break leaves, is no element).
pub fn parse_lines(body: &[u8]) -> Result<serde_json::Value, serde_json::Error> {
    body.split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(serde_json::from_slice)
        .collect::<Result<Vec<_>, _>>()
        .map(serde_json::Value::Array)
}

impl PayloadRef {
    /// The reference `body` of `task` is kept under.
    pub fn of(task_id: TaskId, body: &[u8]) -> Self {
        Self {
            task_id,
            sha256: hex::encode(Sha256::digest(body)),
            bytes: body.len() as u64,
            lines: None,
        }
    }

    /// The prefix of every object of `task`: what its retention deletes.
    pub fn prefix(task_id: TaskId) -> String {
        format!("tasks/{task_id}/")
    }

    /// The object's name: `tasks/<task id>/<sha256>.json`; a JSON Lines payload's,
    /// `tasks/<task id>/<name>.jsonl` (a name that is not plain names its hash instead, which
    /// no write makes: such a reference reads as not found).
    pub fn key(&self) -> String {
        match &self.lines {
            Some(l) if Lines::plain(&l.name) => lines_key(self.task_id, &l.name),
            Some(_) => lines_key(self.task_id, &self.sha256),
            None => format!("{}{}.json", Self::prefix(self.task_id), self.sha256),
        }
    }

    /// What this reference takes in an item, budgeted ([`REF_BYTES`], [`LINES_REF_BYTES`]).
    pub fn stored_bytes(&self) -> usize {
        if self.lines.is_some() {
            LINES_REF_BYTES
        } else {
            REF_BYTES
        }
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

    #[test]
    fn a_reference_of_before_json_lines_reads_as_it_was_and_writes_no_lines() {
        let task = TaskId::new_random();
        let old = format!(r#"{{"taskId":"{task}","sha256":"ab","bytes":2}}"#);
        let r: PayloadRef = serde_json::from_str(&old).expect("an old reference parses");
        assert_eq!(r.lines, None);
        assert_eq!(
            serde_json::to_string(&r).expect("json"),
            old,
            "written as before"
        );
        let lines = PayloadRef {
            lines: Some(Lines {
                count: 3,
                name: "n1".into(),
            }),
            ..r.clone()
        };
        let text = serde_json::to_string(&lines).expect("json");
        assert!(
            text.contains(r#""lines":{"count":3,"name":"n1"}"#),
            "{text}"
        );
        assert_eq!(
            serde_json::from_str::<PayloadRef>(&text).expect("parses"),
            lines
        );
        assert!(text.len() <= LINES_REF_BYTES);
        assert_eq!(lines.stored_bytes(), LINES_REF_BYTES);
        assert_eq!(r.stored_bytes(), REF_BYTES);
    }

    #[test]
    fn a_json_lines_writer_hashes_counts_and_names_what_it_appends_under_its_task() {
        let task = TaskId::new_random();
        let mut w = LinesWriter::new(task);
        let key = w.key();
        let mut out = vec![];
        for line in [&b"{\"a\":1}"[..], b"null", b"[1,2]"] {
            w.push(line, &mut out).expect("a line");
        }
        assert_eq!(
            w.push(b"{\"a\":\n1}", &mut out),
            Err(NotALine { index: 3 }),
            "a line break is refused"
        );
        assert_eq!(out, b"{\"a\":1}\nnull\n[1,2]\n");
        let r = w.finish();
        assert!(r.matches(&out), "its hash and length are the bytes'");
        assert_eq!(r.lines.as_ref().map(|l| l.count), Some(3));
        assert_eq!(r.key(), key);
        assert!(key.starts_with(&PayloadRef::prefix(task)) && key.ends_with(".jsonl"));
        assert_eq!(
            parse_lines(&out).expect("JSON Lines"),
            serde_json::json!([{"a": 1}, null, [1, 2]])
        );
        // A second write of the same lines is a second name (see `Lines`).
        assert_ne!(LinesWriter::new(task).key(), key);
        // A damaged name never leaves the task's prefix.
        let mut bad = r.clone();
        if let Some(l) = &mut bad.lines {
            l.name = "../../other/x".into();
        }
        assert_eq!(
            bad.key(),
            format!("{}{}.jsonl", PayloadRef::prefix(task), r.sha256)
        );
    }
}
