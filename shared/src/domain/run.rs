//! A distributed forEach's run: the ledger of its elements ([`Run`]) and the pure transitions
//! that move it ([`Run::start`], [`Run::apply`], [`Run::undo`]).
//!
//! A forEach step marked `distributed` keeps none of its elements in the task's record. To the
//! task it is one step, answered by its *run*: a record of its own that opens the elements
//! (each a record of its own, run as a task of one step) in order, at most `max_concurrency` at
//! once, applies their ends one run at a time, and answers the step once every element has
//! ended. The run's record holds only this ledger, one mark per element opened, so its size is
//! bounded by the list's length (one byte per element) and never by the elements' results.
//!
//! A run may keep its elements in *chunks* ([`Run::chunk`] elements to a record, an in-record
//! forEach that runs them one at a time and tolerates every refusal): the ledger's unit is then
//! a chunk, one mark per chunk opened, at most `max_concurrency` out (so as many elements in
//! calls), and a chunk's end says how many of its elements were refused
//! ([`ElementEnd::refused`]), so the step's tolerance still counts elements. A chunk that fails
//! (an element past its retries) is undone by itself, and all its elements count as refused.
//! A chunk is never longer than the list spread over `max_concurrency` chunks, so a short list
//! still has that many in calls at once. With a chunk of 1, a unit is an element.
//!
//! The rules the ledger keeps (checked by [`Run::check`]):
//! - elements open in order, and only while the run is not stopped;
//! - at most `max_concurrency` elements are out at once, forward and undo together;
//! - no undo begins while an element is still out forward (it may yet take effect);
//! - undos begin last first, and only for elements that took effect;
//! - an end that does not match its element's mark (a duplicate, or a late one) changes nothing.

use serde::{Deserialize, Serialize};
use std::fmt;

/// The most elements a distributed forEach runs over.
pub const MAX_RUN_ELEMENTS: usize = 10_000;
/// The most elements of a distributed forEach out at once.
pub const MAX_RUN_CONCURRENCY: u32 = 1_000;
/// The most elements of a distributed forEach kept in one record (a chunk): an in-record
/// forEach's list (see [`crate::domain::transition`]'s `MAX_ELEMENTS`).
pub const MAX_CHUNK: u32 = 100;

/// An S3 object holding a distributed forEach's list: `s3://bucket/key`, a JSON array, or
/// JSON Lines (one element per line) when its key ends in `.jsonl` or `.ndjson` (as Step
/// Functions' `ItemReader` reads them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectLocation {
    pub bucket: String,
    pub key: String,
    /// JSON Lines rather than one JSON array.
    pub lines: bool,
}

impl ObjectLocation {
    /// Parses `s3://bucket/key`: a bucket name as S3 names them (3 to 63 lowercase letters,
    /// digits, dots and hyphens) and a key of 1 to 1,024 bytes.
    pub fn parse(s: &str) -> Result<Self, String> {
        let rest = s
            .strip_prefix("s3://")
            .ok_or_else(|| format!("{s:?} is not an S3 location (s3://bucket/key)"))?;
        let (bucket, key) = rest
            .split_once('/')
            .ok_or_else(|| format!("{s:?} names no key (s3://bucket/key)"))?;
        let bucket_ok = (3..=63).contains(&bucket.len())
            && bucket
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-');
        if !bucket_ok {
            return Err(format!("{bucket:?} is not an S3 bucket name"));
        }
        if key.is_empty() || key.len() > 1024 {
            return Err(format!("the key of {s:?} is empty or over 1,024 bytes"));
        }
        Ok(Self {
            bucket: bucket.to_owned(),
            key: key.to_owned(),
            lines: key.ends_with(".jsonl") || key.ends_with(".ndjson"),
        })
    }
}

/// The most bytes of a list a run reads (from its body or its S3 object).
pub const MAX_LIST_BYTES: usize = 16 * 1024 * 1024;
/// The most bytes of one element (serialized JSON): each element's record keeps it inline.
pub const MAX_ELEMENT_BYTES: usize = 32 * 1024;

/// Where a run's list is: the step's body itself, or an S3 object it names.
#[derive(Debug, Clone, PartialEq)]
pub enum ListSource {
    Inline(Vec<serde_json::Value>),
    Object(ObjectLocation),
}

/// Why a list cannot run: the step is refused with this (its input is wrong, no retry helps).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ListError(pub String);

impl ListSource {
    /// The list a distributed forEach step's body names: an array, or a string holding an
    /// `s3://` location.
    pub fn of(body: serde_json::Value) -> Result<Self, ListError> {
        match body {
            serde_json::Value::Array(items) => {
                check_elements(&items)?;
                Ok(Self::Inline(items))
            }
            serde_json::Value::String(s) => ObjectLocation::parse(&s)
                .map(Self::Object)
                .map_err(ListError),
            other => Err(ListError(format!(
                "the forEach list is {}, not an array or an s3:// location",
                kind(&other)
            ))),
        }
    }
}

fn kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// Parses an S3 object's bytes as `location` says: a JSON array, or JSON Lines (one element
/// per non-blank line), within the run's bounds.
pub fn parse_list(
    location: &ObjectLocation,
    bytes: &[u8],
) -> Result<Vec<serde_json::Value>, ListError> {
    let at = || format!("s3://{}/{}", location.bucket, location.key);
    if bytes.len() > MAX_LIST_BYTES {
        return Err(ListError(format!(
            "{} is {} bytes; a list is at most {MAX_LIST_BYTES}",
            at(),
            bytes.len()
        )));
    }
    let items = if location.lines {
        let text = std::str::from_utf8(bytes)
            .map_err(|e| ListError(format!("{} is not UTF-8: {e}", at())))?;
        let mut items = vec![];
        for (n, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            if items.len() == MAX_RUN_ELEMENTS {
                return Err(ListError(format!(
                    "{} has over {MAX_RUN_ELEMENTS} lines; a distributed forEach takes at most {MAX_RUN_ELEMENTS} elements",
                    at()
                )));
            }
            items.push(
                serde_json::from_str(line)
                    .map_err(|e| ListError(format!("{} line {} is not JSON: {e}", at(), n + 1)))?,
            );
        }
        items
    } else {
        match serde_json::from_slice(bytes) {
            Ok(serde_json::Value::Array(items)) => items,
            Ok(other) => {
                return Err(ListError(format!(
                    "{} holds {}, not a JSON array (name it .jsonl for JSON Lines)",
                    at(),
                    kind(&other)
                )));
            }
            Err(e) => return Err(ListError(format!("{} is not JSON: {e}", at()))),
        }
    };
    check_elements(&items)?;
    Ok(items)
}

/// A list's bounds: at most [`MAX_RUN_ELEMENTS`] elements, each at most [`MAX_ELEMENT_BYTES`].
fn check_elements(items: &[serde_json::Value]) -> Result<(), ListError> {
    if items.len() > MAX_RUN_ELEMENTS {
        return Err(ListError(format!(
            "the list has {} elements; a distributed forEach takes at most {MAX_RUN_ELEMENTS}",
            items.len()
        )));
    }
    for (i, item) in items.iter().enumerate() {
        let bytes = serde_json::to_vec(item)
            .map(|b| b.len())
            .unwrap_or(usize::MAX);
        if bytes > MAX_ELEMENT_BYTES {
            return Err(ListError(format!(
                "element {i} is {bytes} bytes; an element is at most {MAX_ELEMENT_BYTES}"
            )));
        }
    }
    Ok(())
}

/// As the user wrote it: `s3://bucket/key`.
impl fmt::Display for ObjectLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "s3://{}/{}", self.bucket, self.key)
    }
}

/// Where one element (or chunk) stands, as the run's ledger keeps it (one character each).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mark {
    /// Opened: its record exists and it runs forward.
    Out,
    /// Ended `Processed`: it took effect.
    Done,
    /// Ended with no effect (refused, or failed and undone by itself).
    Failed,
    /// Its undo runs.
    Undoing,
    /// Undone.
    Undone,
    /// Its undo was refused (or failed for good): its effect stays, for an operator.
    UndoFailed,
}

impl Mark {
    fn to_char(self) -> char {
        match self {
            Self::Out => 'o',
            Self::Done => 'd',
            Self::Failed => 'f',
            Self::Undoing => 'u',
            Self::Undone => 'x',
            Self::UndoFailed => '!',
        }
    }

    fn from_char(c: char) -> Option<Self> {
        Some(match c {
            'o' => Self::Out,
            'd' => Self::Done,
            'f' => Self::Failed,
            'u' => Self::Undoing,
            'x' => Self::Undone,
            '!' => Self::UndoFailed,
            _ => return None,
        })
    }
}

/// Why a run stopped opening elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum RunStop {
    /// More elements refused than the step tolerates: the elements that took effect are
    /// undone, then the step is refused.
    Refused,
    /// The task undoes the step (as a unit): the elements that took effect are undone, then
    /// the step's undo is answered.
    Undo,
}

/// The ledger of a distributed forEach's run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Run {
    /// How many elements the list has.
    pub total: u32,
    pub max_concurrency: u32,
    /// How many elements may end with no effect before the step is refused.
    pub tolerated: u32,
    /// The step declares an undo: its elements that took effect are undone when it is.
    pub undoable: bool,
    /// Elements kept in one record (a chunk, the ledger's unit, which runs them one at a time);
    /// 1: each element its own. At most the step's `chunk`, and the list spread over
    /// `max_concurrency` chunks ([`Run::start`]).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub chunk: u32,
    /// With chunks: how many elements ended with no effect so far (each chunk's end says how
    /// many of its own). With a chunk of 1 the marks say it (`Failed`), and this stays 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub refused: u32,
    /// One mark per unit (element, or chunk) opened so far, in the list's order (see [`Mark`]).
    pub marks: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<RunStop>,
}

fn one() -> u32 {
    1
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Which way an element's end goes: its step, or its undo.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Direction {
    Forward,
    Undo,
    /// Ended forward with its effect left for an operator: its step failed and its own undo
    /// was refused (the element is `CompensationFailed`). It stops the run as a refused undo
    /// does.
    Stuck,
}

/// An element's (or a chunk's) end, as the run receives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ElementEnd {
    /// The unit's index in the ledger: the element's, or the chunk's.
    pub index: u32,
    pub direction: Direction,
    /// Forward: the element took effect (`Processed`; a chunk: at least one of its elements
    /// did); otherwise it ended with none. Undo: the element is undone; otherwise its undo was
    /// refused.
    pub ok: bool,
    /// A chunk's forward end: how many of its elements ended with no effect (refused, or all
    /// of them when the chunk failed and was undone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<u32>,
}

/// How a run ends: what it answers the task's step with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunEnd {
    /// Every element ended, no more refused than tolerated: the step succeeds with their
    /// results, in order.
    Processed,
    /// More refused than tolerated, and every element that took effect is undone: the step is
    /// refused, with no effect left.
    Refused { refused: u32 },
    /// The step's undo is done: every element that took effect is undone.
    Undone,
    /// An element's undo was refused: its effect stays. Stopped forward, the step fails;
    /// undoing, the step's undo is refused. Either way an operator decides.
    UndoFailed { index: u32 },
}

/// What a transition asks of the run's edge, after the run's record is written.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RunEffects {
    /// Elements to open: create their records and send their work.
    pub open: Vec<u32>,
    /// Elements whose undo to begin, last first.
    pub undo: Vec<u32>,
    /// The run ended: answer the task's step.
    pub end: Option<RunEnd>,
}

/// A ledger that breaks the run's rules.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("run ledger: {0}")]
pub struct RunInvariant(pub String);

/// Why a run cannot start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RunError {
    #[error("the list has {0} elements; a distributed forEach takes at most {MAX_RUN_ELEMENTS}")]
    TooManyElements(usize),
    #[error("maxConcurrency {0} is outside 1 to {MAX_RUN_CONCURRENCY}")]
    Concurrency(u32),
    #[error("chunk {0} is outside 1 to {MAX_CHUNK}")]
    Chunk(u32),
}

/// How a run starts: its list's length and the step's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunPlan {
    pub total: usize,
    pub max_concurrency: u32,
    pub tolerated: u32,
    pub undoable: bool,
    /// Elements per record at most (1: each element its own).
    pub chunk: u32,
}

impl Run {
    /// A run over `plan.total` elements, and the first window to open. An empty list ends at
    /// once, `Processed` (its result: an empty list).
    pub fn start(plan: RunPlan) -> Result<(Self, RunEffects), RunError> {
        if plan.total > MAX_RUN_ELEMENTS {
            return Err(RunError::TooManyElements(plan.total));
        }
        if !(1..=MAX_RUN_CONCURRENCY).contains(&plan.max_concurrency) {
            return Err(RunError::Concurrency(plan.max_concurrency));
        }
        if !(1..=MAX_CHUNK).contains(&plan.chunk) {
            return Err(RunError::Chunk(plan.chunk));
        }
        let mut run = Self {
            // Bounded by MAX_RUN_ELEMENTS above.
            total: plan.total as u32,
            max_concurrency: plan.max_concurrency,
            tolerated: plan.tolerated,
            undoable: plan.undoable,
            // No longer than the list spread over `max_concurrency` chunks (rounded down): at
            // least that many chunks, so every place is taken while the list lasts.
            chunk: plan
                .chunk
                .min(plan.total as u32 / plan.max_concurrency)
                .max(1),
            refused: 0,
            marks: String::new(),
            stop: None,
        };
        let effects = run.settle();
        Ok((run, effects))
    }

    /// The mark of element `index`, if it was opened.
    pub fn mark(&self, index: u32) -> Option<Mark> {
        self.marks
            .as_bytes()
            .get(index as usize)
            .and_then(|b| Mark::from_char(char::from(*b)))
    }

    /// How many elements bear `mark`.
    pub fn count(&self, mark: Mark) -> u32 {
        let c = mark.to_char() as u8;
        // At most MAX_RUN_ELEMENTS marks: fits.
        self.marks.bytes().filter(|b| *b == c).count() as u32
    }

    fn opened(&self) -> u32 {
        self.marks.len() as u32
    }

    /// How many units the ledger has: elements, or chunks.
    pub fn units(&self) -> u32 {
        self.total.div_ceil(self.chunk.max(1))
    }

    /// The elements unit `index` holds (one, or a chunk's), as indexes in the list.
    pub fn elements_of(&self, index: u32) -> std::ops::Range<u32> {
        let chunk = self.chunk.max(1);
        let first = index.saturating_mul(chunk).min(self.total);
        first..first.saturating_add(chunk).min(self.total)
    }

    /// How many elements ended with no effect so far.
    pub fn refused(&self) -> u32 {
        if self.chunk <= 1 {
            self.count(Mark::Failed)
        } else {
            self.refused
        }
    }

    fn set(&mut self, index: u32, mark: Mark) {
        let i = index as usize;
        if i < self.marks.len() {
            let c = mark.to_char().to_string();
            self.marks.replace_range(i..=i, &c);
        }
    }

    /// Whether the run has ended (it answered, or will answer, its step).
    pub fn ended(&self) -> Option<RunEnd> {
        let out = self.count(Mark::Out) + self.count(Mark::Undoing);
        if out > 0 {
            return None;
        }
        let failed_undo = self.marks.bytes().position(|b| b == b'!');
        match self.stop {
            None if self.opened() == self.units() => Some(RunEnd::Processed),
            None => None,
            Some(stop) => {
                // Every element that took effect is undone first, even past a refused undo:
                // the fewer effects left for the operator, the better.
                if self.undoable && self.count(Mark::Done) > 0 {
                    return None;
                }
                if let Some(i) = failed_undo {
                    return Some(RunEnd::UndoFailed { index: i as u32 });
                }
                Some(match stop {
                    RunStop::Refused => RunEnd::Refused {
                        refused: self.refused(),
                    },
                    RunStop::Undo => RunEnd::Undone,
                })
            }
        }
    }

    /// Applies elements' ends (one batch, as the ends queue delivers them), in order, and
    /// settles the run: the elements to open or undo next, or its end. An end whose element's
    /// mark does not match (a duplicate, a late one, an element never opened) is ignored.
    pub fn apply(&mut self, ends: &[ElementEnd]) -> RunEffects {
        let was_ended = self.ended().is_some();
        for end in ends {
            let Some(next) = self.after(end) else {
                continue;
            };
            if self.chunk > 1 && matches!(next, Mark::Done | Mark::Failed) {
                let len = self.elements_of(end.index).len() as u32;
                let refused = match (end.refused, next) {
                    (Some(n), _) => n.min(len),
                    (None, Mark::Failed) => len,
                    (None, _) => 0,
                };
                self.refused = self.refused.saturating_add(refused);
            }
            self.set(end.index, next);
        }
        // An element stuck with its effect: the run opens nothing more, undoes what took
        // effect, and ends waiting for an operator.
        if self.stop.is_none() && self.count(Mark::UndoFailed) > 0 {
            self.stop = Some(RunStop::Refused);
        }
        if was_ended {
            // An ended run answered its step already: ends after it change marks only (none
            // can, by the rules above), never open or undo anything.
            return RunEffects::default();
        }
        if self.stop.is_none() && self.refused() > self.tolerated {
            self.stop = Some(RunStop::Refused);
        }
        self.settle()
    }

    /// The mark `end` gives its element, if its element waits for it (`None`: a duplicate, a
    /// late end, an element never opened).
    fn after(&self, end: &ElementEnd) -> Option<Mark> {
        Some(match (self.mark(end.index)?, end.direction, end.ok) {
            (Mark::Out, Direction::Forward, true) => Mark::Done,
            (Mark::Out, Direction::Forward, false) => Mark::Failed,
            (Mark::Undoing, Direction::Undo, true) => Mark::Undone,
            (Mark::Undoing, Direction::Undo, false) => Mark::UndoFailed,
            (Mark::Out, Direction::Stuck, _) => Mark::UndoFailed,
            _ => return None,
        })
    }

    /// Whether `end` was applied already (or can never be): its element's mark does not wait
    /// for it. Such an end in a delivery means a writer may have died after the ledger moved and
    /// before its effects: what the run has out is opened again.
    pub fn stale(&self, end: &ElementEnd) -> bool {
        self.after(end).is_none()
    }

    /// The task undoes the step as a unit: no element opens from now on, and once none is out
    /// forward, every element that took effect is undone, last first. A run already stopped
    /// (refused) keeps its stop: its undos are under way or done, and its end answers.
    pub fn undo(&mut self) -> RunEffects {
        if self.stop.is_none() {
            self.stop = Some(RunStop::Undo);
        }
        self.settle()
    }

    /// What a run out again must have out (after a crash between its write and its effects,
    /// or a lost message): every element out forward or undoing. Opening and undoing are
    /// idempotent at the edge (records created on absence, keys per element), so this is safe
    /// to ask again.
    pub fn outstanding(&self) -> RunEffects {
        let mut fx = RunEffects::default();
        for (i, b) in self.marks.bytes().enumerate() {
            match b {
                b'o' => fx.open.push(i as u32),
                b'u' => fx.undo.push(i as u32),
                _ => {}
            }
        }
        fx.undo.reverse();
        fx.end = self.ended();
        fx
    }

    /// Fills the room `max_concurrency` leaves: forward while not stopped; else, once nothing
    /// is out forward, the undos of the elements that took effect, last first. Then the end,
    /// if it came.
    fn settle(&mut self) -> RunEffects {
        let mut fx = RunEffects::default();
        let out = self.count(Mark::Out);
        let undoing = self.count(Mark::Undoing);
        // (A chunk runs one element at a time: `max_concurrency` units out are as many
        // elements in calls.)
        let room = self.max_concurrency.saturating_sub(out + undoing);
        match self.stop {
            None => {
                let open = room.min(self.units() - self.opened());
                for _ in 0..open {
                    fx.open.push(self.opened());
                    self.marks.push(Mark::Out.to_char());
                }
            }
            Some(_) if out == 0 && self.undoable => {
                let picks: Vec<u32> = self
                    .marks
                    .bytes()
                    .enumerate()
                    .rev()
                    .filter(|(_, b)| *b == b'd')
                    .take(room as usize)
                    .map(|(i, _)| i as u32)
                    .collect();
                for i in &picks {
                    self.set(*i, Mark::Undoing);
                }
                fx.undo = picks;
            }
            Some(_) => {}
        }
        fx.end = self.ended();
        fx
    }

    /// The ledger's rules (see the module's doc).
    pub fn check(&self) -> Result<(), RunInvariant> {
        let bad = |m: String| Err(RunInvariant(m));
        if self.total as usize > MAX_RUN_ELEMENTS {
            return bad(format!("{} elements", self.total));
        }
        if !(1..=MAX_CHUNK).contains(&self.chunk) {
            return bad(format!("chunks of {}", self.chunk));
        }
        if self.opened() > self.units() {
            return bad(format!(
                "{} units opened of {}",
                self.opened(),
                self.units()
            ));
        }
        if self.chunk == 1 && self.refused > 0 {
            return bad("a refused count kept without chunks".into());
        }
        if let Some(c) = self.marks.chars().find(|c| Mark::from_char(*c).is_none()) {
            return bad(format!("an unknown mark {c:?}"));
        }
        let (out, undoing) = (self.count(Mark::Out), self.count(Mark::Undoing));
        if out + undoing > self.max_concurrency {
            return bad(format!(
                "{out} out and {undoing} undoing, over maxConcurrency {} (in units of {})",
                self.max_concurrency, self.chunk
            ));
        }
        if out > 0 && undoing > 0 {
            return bad("an undo runs while an element is still out".into());
        }
        let undo_marks = undoing + self.count(Mark::Undone) + self.count(Mark::UndoFailed);
        if self.stop.is_none() && undo_marks > 0 {
            return bad("an element is undone, but the run was not stopped".into());
        }
        if !self.undoable && undo_marks > 0 {
            return bad("an element is undone, but the step has no undo".into());
        }
        if self.stop.is_none()
            && self.opened() < self.units()
            && out < self.max_concurrency
            && self.refused() <= self.tolerated
        {
            return bad(format!(
                "{} of {} units opened with {out} of {} places taken",
                self.opened(),
                self.units(),
                self.max_concurrency
            ));
        }
        Ok(())
    }
}

impl fmt::Display for Run {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.chunk > 1 {
            write!(
                f,
                "chunks of {} ({} elements refused); ",
                self.chunk,
                self.refused()
            )?;
        }
        write!(
            f,
            "{} of {} opened: {} out, {} done, {} failed, {} undoing, {} undone, {} undo refused",
            self.opened(),
            self.units(),
            self.count(Mark::Out),
            self.count(Mark::Done),
            self.count(Mark::Failed),
            self.count(Mark::Undoing),
            self.count(Mark::Undone),
            self.count(Mark::UndoFailed)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(total: usize, max_concurrency: u32, tolerated: u32) -> RunPlan {
        RunPlan {
            total,
            max_concurrency,
            tolerated,
            undoable: true,
            chunk: 1,
        }
    }

    fn fwd(index: u32, ok: bool) -> ElementEnd {
        ElementEnd {
            index,
            direction: Direction::Forward,
            ok,
            refused: None,
        }
    }

    fn undone(index: u32, ok: bool) -> ElementEnd {
        ElementEnd {
            index,
            direction: Direction::Undo,
            ok,
            refused: None,
        }
    }

    #[test]
    fn a_run_opens_a_window_then_one_element_per_end_in_order() {
        let (mut run, fx) = Run::start(plan(5, 2, 0)).expect("start");
        assert_eq!(fx.open, vec![0, 1]);
        assert_eq!(fx.end, None);
        run.check().expect("valid");
        let fx = run.apply(&[fwd(1, true)]);
        assert_eq!(fx.open, vec![2]);
        let fx = run.apply(&[fwd(0, true), fwd(2, true)]);
        assert_eq!(fx.open, vec![3, 4]);
        run.check().expect("valid");
        let fx = run.apply(&[fwd(3, true)]);
        assert!(fx.open.is_empty() && fx.end.is_none());
        let fx = run.apply(&[fwd(4, true)]);
        assert_eq!(fx.end, Some(RunEnd::Processed));
        assert_eq!(run.count(Mark::Done), 5);
    }

    #[test]
    fn an_empty_list_ends_processed_at_once() {
        let (_, fx) = Run::start(plan(0, 3, 0)).expect("start");
        assert!(fx.open.is_empty());
        assert_eq!(fx.end, Some(RunEnd::Processed));
    }

    #[test]
    fn limits_are_refused() {
        assert_eq!(
            Run::start(plan(MAX_RUN_ELEMENTS + 1, 10, 0)),
            Err(RunError::TooManyElements(MAX_RUN_ELEMENTS + 1))
        );
        assert_eq!(
            Run::start(plan(10, MAX_RUN_CONCURRENCY + 1, 0)),
            Err(RunError::Concurrency(MAX_RUN_CONCURRENCY + 1))
        );
        assert_eq!(Run::start(plan(10, 0, 0)), Err(RunError::Concurrency(0)));
    }

    #[test]
    fn duplicate_and_late_ends_change_nothing() {
        let (mut run, _) = Run::start(plan(3, 1, 0)).expect("start");
        let fx = run.apply(&[fwd(0, true)]);
        assert_eq!(fx.open, vec![1]);
        let before = run.clone();
        // Element 0 again, an undo end for an element not undoing, one never opened.
        let fx = run.apply(&[fwd(0, false), undone(1, true), fwd(2, true), fwd(9, true)]);
        assert_eq!(run, before);
        assert_eq!(fx, RunEffects::default());
    }

    #[test]
    fn refusals_within_the_tolerance_end_processed() {
        let (mut run, _) = Run::start(plan(3, 3, 1)).expect("start");
        let fx = run.apply(&[fwd(0, false), fwd(1, true), fwd(2, true)]);
        assert_eq!(fx.end, Some(RunEnd::Processed));
        assert_eq!(run.stop, None);
    }

    #[test]
    fn a_refusal_past_the_tolerance_waits_for_those_out_then_undoes_last_first() {
        let (mut run, _) = Run::start(plan(10, 3, 0)).expect("start");
        run.apply(&[fwd(0, true)]); // opens 3
        let fx = run.apply(&[fwd(1, false)]);
        assert_eq!(run.stop, Some(RunStop::Refused));
        assert!(fx.open.is_empty(), "nothing opens once stopped");
        assert!(fx.undo.is_empty(), "2 and 3 are still out: no undo yet");
        run.check().expect("valid");
        let fx = run.apply(&[fwd(2, true)]);
        assert!(fx.undo.is_empty(), "3 is still out");
        let fx = run.apply(&[fwd(3, true)]);
        // Done: 0, 2, 3; undone last first, 3 at once.
        assert_eq!(fx.undo, vec![3, 2, 0]);
        run.check().expect("valid");
        let fx = run.apply(&[undone(3, true), undone(0, true)]);
        assert!(fx.undo.is_empty() && fx.end.is_none());
        let fx = run.apply(&[undone(2, true)]);
        assert_eq!(fx.end, Some(RunEnd::Refused { refused: 1 }));
    }

    #[test]
    fn undos_keep_within_max_concurrency() {
        let (mut run, _) = Run::start(plan(4, 2, 0)).expect("start");
        run.apply(&[fwd(0, true), fwd(1, true)]);
        run.apply(&[fwd(2, true), fwd(3, true)]);
        let fx = run.undo();
        assert_eq!(fx.undo, vec![3, 2]);
        run.check().expect("valid");
        let fx = run.apply(&[undone(2, true)]);
        assert_eq!(fx.undo, vec![1]);
        let fx = run.apply(&[undone(3, true), undone(1, true)]);
        assert_eq!(fx.undo, vec![0]);
        let fx = run.apply(&[undone(0, true)]);
        assert_eq!(fx.end, Some(RunEnd::Undone));
    }

    #[test]
    fn an_undo_refused_ends_the_run_for_an_operator_once_none_is_undoing() {
        let (mut run, _) = Run::start(plan(2, 2, 0)).expect("start");
        run.apply(&[fwd(0, true), fwd(1, true)]);
        run.undo();
        let fx = run.apply(&[undone(1, false)]);
        assert_eq!(fx.end, None, "0 is still undoing");
        let fx = run.apply(&[undone(0, true)]);
        assert_eq!(fx.end, Some(RunEnd::UndoFailed { index: 1 }));
    }

    #[test]
    fn undoing_a_running_run_stops_it_and_undoes_once_none_is_out() {
        let (mut run, _) = Run::start(plan(6, 2, 0)).expect("start");
        run.apply(&[fwd(0, true)]); // opens 2
        let fx = run.undo();
        assert!(fx.open.is_empty() && fx.undo.is_empty());
        let fx = run.apply(&[fwd(1, false), fwd(2, true)]);
        assert_eq!(fx.undo, vec![2, 0]);
        assert_eq!(run.mark(3), None, "never opened past the stop");
        run.apply(&[undone(2, true)]);
        let fx = run.apply(&[undone(0, true)]);
        assert_eq!(fx.end, Some(RunEnd::Undone));
    }

    #[test]
    fn a_step_without_an_undo_ends_refused_with_its_effects_left() {
        let (mut run, _) = Run::start(RunPlan {
            undoable: false,
            ..plan(3, 3, 0)
        })
        .expect("start");
        let fx = run.apply(&[fwd(0, true), fwd(1, false), fwd(2, true)]);
        assert!(fx.undo.is_empty());
        assert_eq!(fx.end, Some(RunEnd::Refused { refused: 1 }));
    }

    #[test]
    fn outstanding_names_what_is_out() {
        let (mut run, _) = Run::start(plan(5, 3, 0)).expect("start");
        assert_eq!(run.outstanding().open, vec![0, 1, 2]);
        run.apply(&[fwd(0, true), fwd(1, true), fwd(2, true)]);
        run.undo();
        let o = run.outstanding();
        assert_eq!(o.open, vec![3, 4], "opened before the stop, still out");
        assert!(o.undo.is_empty());
        run.apply(&[fwd(3, true), fwd(4, true)]);
        assert_eq!(
            run.outstanding().undo,
            vec![4, 3, 2],
            "last first, within the window"
        );
    }

    #[test]
    fn the_ledger_is_a_byte_per_element() {
        let (mut run, _) =
            Run::start(plan(MAX_RUN_ELEMENTS, MAX_RUN_CONCURRENCY, 0)).expect("start");
        let mut next = 0;
        while run.ended().is_none() {
            let ends: Vec<_> = (next..run.marks.len() as u32)
                .map(|i| fwd(i, true))
                .collect();
            next = run.marks.len() as u32;
            run.apply(&ends);
            run.check().expect("valid");
        }
        let json = serde_json::to_string(&run).expect("json");
        assert!(json.len() < MAX_RUN_ELEMENTS + 200, "{} bytes", json.len());
    }

    #[test]
    fn an_object_location_is_parsed() {
        let l = ObjectLocation::parse("s3://nightly-runs/2026/11/invoices.jsonl").expect("valid");
        assert_eq!(l.bucket, "nightly-runs");
        assert_eq!(l.key, "2026/11/invoices.jsonl");
        assert!(l.lines);
        assert_eq!(l.to_string(), "s3://nightly-runs/2026/11/invoices.jsonl");
        assert!(
            !ObjectLocation::parse("s3://b-1/list.json")
                .expect("valid")
                .lines
        );
        for bad in [
            "s3://",
            "s3://bucket",
            "s3://bucket/",
            "s3://Bucket/k",
            "https://b/k",
            "s3://ab/k",
        ] {
            assert!(ObjectLocation::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_list_is_an_array_or_an_object_of_json_or_json_lines() {
        use serde_json::json;
        assert_eq!(
            ListSource::of(json!([1, {"a": 2}])),
            Ok(ListSource::Inline(vec![json!(1), json!({"a": 2})]))
        );
        assert!(matches!(
            ListSource::of(json!("s3://lists/n.jsonl")),
            Ok(ListSource::Object(ObjectLocation { lines: true, .. }))
        ));
        let e = ListSource::of(json!({"items": []})).expect_err("an object");
        assert!(e.0.contains("an object, not an array"), "{e}");
        let e = ListSource::of(json!(vec![0; MAX_RUN_ELEMENTS + 1])).expect_err("too long");
        assert!(e.0.contains("at most 10000"), "{e}");
        let big = "x".repeat(MAX_ELEMENT_BYTES);
        let e = ListSource::of(json!(["ok", big])).expect_err("too big");
        assert!(e.0.starts_with("element 1 is"), "{e}");

        let lines = ObjectLocation::parse("s3://lists/n.ndjson").expect("valid");
        let items = parse_list(&lines, b"{\"id\": 1}\n\n  \n{\"id\": 2}\n").expect("two lines");
        assert_eq!(items, vec![json!({"id": 1}), json!({"id": 2})]);
        let e = parse_list(&lines, b"{\"id\": 1}\nnot json\n").expect_err("line 2");
        assert!(e.0.contains("line 2 is not JSON"), "{e}");
        let many = "1\n".repeat(MAX_RUN_ELEMENTS + 1);
        assert!(parse_list(&lines, many.as_bytes()).is_err());
        let array = ObjectLocation::parse("s3://lists/n.json").expect("valid");
        assert_eq!(
            parse_list(&array, b"[1, 2]").expect("array"),
            vec![json!(1), json!(2)]
        );
        let e = parse_list(&array, b"{\"id\": 1}\n{\"id\": 2}\n").expect_err("lines in .json");
        assert!(e.0.contains("is not JSON") || e.0.contains(".jsonl"), "{e}");
        let e = parse_list(&array, b"{}").expect_err("an object");
        assert!(e.0.contains("name it .jsonl"), "{e}");
    }

    #[test]
    fn the_check_finds_a_broken_ledger() {
        let (run, _) = Run::start(plan(5, 2, 0)).expect("start");
        let mut two_undos = run.clone();
        two_undos.marks = "ou".into();
        two_undos.stop = Some(RunStop::Undo);
        assert!(two_undos.check().is_err());
        let mut starved = run.clone();
        starved.marks = "do".into();
        assert!(starved.check().is_err(), "a free place left unused");
        let mut unstopped = run;
        unstopped.marks = "xo".into();
        assert!(unstopped.check().is_err());
    }

    mod model {
        use super::super::*;
        use proptest::prelude::*;
        use std::collections::BTreeSet;

        /// What the service does with unit `i` (an element, or a chunk): took effect or not
        /// (a chunk: how many of its elements were refused), and whether its undo would be
        /// refused.
        #[derive(Debug, Clone, Copy)]
        struct Fate {
            ok: bool,
            refused: u32,
            undo_refused: bool,
            /// Its step failed and its own undo was refused: its effect stays.
            stuck: bool,
        }

        proptest! {
            /// Any order of ends (with duplicates), any undo of the step at any moment, elements
            /// alone or in chunks: the ledger stays valid, never has more than maxConcurrency
            /// elements out, opens nothing past a stop, undoes exactly the units that took
            /// effect (each once, never while one is out forward), counts refused elements,
            /// and ends as the model says.
            #[test]
            fn a_run_ends_as_the_model_says(
                total in 0usize..40,
                max_concurrency in 1u32..6,
                tolerated in 0u32..3,
                undoable in any::<bool>(),
                chunk in prop::sample::select(vec![1u32, 1, 2, 3, 7]),
                fates in prop::collection::vec((prop::bool::weighted(0.85), prop::bool::weighted(0.1), prop::bool::weighted(0.04), 0u32..8), 40),
                picks in prop::collection::vec(any::<prop::sample::Index>(), 400),
                undo_at in prop::option::of(0usize..60),
                dup in prop::bool::weighted(0.3),
            ) {
                let (mut run, fx) = Run::start(RunPlan { total, max_concurrency, tolerated, undoable, chunk }).expect("start");
                let fates: Vec<Fate> = fates.into_iter().enumerate().map(|(i, (ok, undo_refused, stuck, some))| {
                    // (Only an element with an undo can have its own undo refused.)
                    let stuck = stuck && undoable;
                    let ok = ok && !stuck;
                    let len = run.elements_of(i as u32).len() as u32;
                    // A chunk that took effect may have had some of its elements refused; one
                    // that did not had all of them refused (or failed and undone).
                    let refused = match (stuck, ok) {
                        (true, _) => 0,
                        (false, true) => some.min(len.saturating_sub(1)),
                        (false, false) => len,
                    };
                    Fate { ok, refused, undo_refused, stuck }
                }).collect();
                let units = run.units() as usize;
                prop_assert!(run.chunk <= chunk && (run.chunk == 1 || units as u32 >= max_concurrency.min(total as u32)));
                let chunk = run.chunk;
                // Ends not yet delivered, as the queue holds them.
                let mut pending: Vec<ElementEnd> = vec![];
                let mut opened: BTreeSet<u32> = BTreeSet::new();
                let mut undos: Vec<u32> = vec![];
                let mut end = None;
                let take = |fx: RunEffects, pending: &mut Vec<ElementEnd>, opened: &mut BTreeSet<u32>, undos: &mut Vec<u32>, end: &mut Option<RunEnd>| {
                    for i in fx.open {
                        prop_assert!(opened.insert(i), "element {} opened twice", i);
                        let direction = if fates[i as usize].stuck { Direction::Stuck } else { Direction::Forward };
                        let refused = (chunk > 1 && direction == Direction::Forward).then_some(fates[i as usize].refused);
                        pending.push(ElementEnd { index: i, direction, ok: fates[i as usize].ok, refused });
                    }
                    for i in fx.undo {
                        prop_assert!(!undos.contains(&i), "element {} undone twice", i);
                        prop_assert!(fates[i as usize].ok, "element {} undone with no effect", i);
                        undos.push(i);
                        pending.push(ElementEnd { index: i, direction: Direction::Undo, ok: !fates[i as usize].undo_refused, refused: None });
                    }
                    if let Some(e) = fx.end {
                        prop_assert!(end.is_none(), "the run ended twice");
                        *end = Some(e);
                    }
                    Ok(())
                };
                take(fx, &mut pending, &mut opened, &mut undos, &mut end)?;
                let mut stopped_at = None;
                for (step, pick) in picks.iter().enumerate() {
                    // The task undoes the step: while it runs, or once it is processed (a
                    // refused step had no effect; one whose undo failed is the operator's).
                    if undo_at == Some(step) && matches!(end, None | Some(RunEnd::Processed)) {
                        end = None;
                        let fx = run.undo();
                        stopped_at.get_or_insert(opened.len());
                        take(fx, &mut pending, &mut opened, &mut undos, &mut end)?;
                    }
                    if pending.is_empty() {
                        continue;
                    }
                    let i = pick.index(pending.len());
                    let e = if dup { pending[i] } else { pending.swap_remove(i) };
                    if dup && pick.index(3) == 0 {
                        pending.swap_remove(i);
                    }
                    let fx = run.apply(&[e]);
                    if run.stop.is_some() {
                        stopped_at.get_or_insert(opened.len());
                    }
                    take(fx, &mut pending, &mut opened, &mut undos, &mut end)?;
                    prop_assert!(run.check().is_ok(), "{:?}: {}", run.check(), run);
                    // (A chunk runs one element at a time: as many elements in calls.)
                    prop_assert!(run.count(Mark::Out) + run.count(Mark::Undoing) <= max_concurrency);
                    if let Some(at) = stopped_at {
                        prop_assert_eq!(opened.len(), at, "opened past the stop");
                    }
                }
                // Deliver what is left, each once.
                while let Some(e) = pending.pop() {
                    let fx = run.apply(&[e]);
                    take(fx, &mut pending, &mut opened, &mut undos, &mut end)?;
                    prop_assert!(run.check().is_ok(), "{:?}: {}", run.check(), run);
                }
                let effected: BTreeSet<u32> = opened.iter().copied().filter(|i| fates[*i as usize].ok).collect();
                let stuck: BTreeSet<u32> = opened.iter().copied().filter(|i| fates[*i as usize].stuck).collect();
                let refused: u32 = opened.iter().filter(|i| !stuck.contains(i)).map(|i| fates[*i as usize].refused).sum();
                prop_assert_eq!(run.refused(), refused);
                let stop = run.stop;
                // The first element left with its effect: stuck, or its undo refused.
                let left = |undone: bool| {
                    opened.iter().copied().find(|i| {
                        stuck.contains(i) || (undone && effected.contains(i) && fates[*i as usize].undo_refused)
                    })
                };
                let expected = match stop {
                    None => {
                        prop_assert_eq!(opened.len(), units);
                        prop_assert!(refused <= tolerated);
                        prop_assert!(stuck.is_empty(), "a stuck element stops the run");
                        RunEnd::Processed
                    }
                    Some(_) if undoable => {
                        // Every element that took effect is undone, last first within a window.
                        let undone: BTreeSet<u32> = undos.iter().copied().collect();
                        prop_assert_eq!(&undone, &effected);
                        match left(true) {
                            Some(index) => RunEnd::UndoFailed { index },
                            None if stop == Some(RunStop::Refused) => RunEnd::Refused { refused },
                            None => RunEnd::Undone,
                        }
                    }
                    Some(stop) => match (left(false), stop) {
                        (Some(index), _) => RunEnd::UndoFailed { index },
                        (None, RunStop::Refused) => RunEnd::Refused { refused },
                        (None, RunStop::Undo) => RunEnd::Undone,
                    },
                };
                prop_assert_eq!(end, Some(expected), "{}", run);
                if stop == Some(RunStop::Refused) {
                    prop_assert!(refused > tolerated || !stuck.is_empty());
                }
            }
        }
    }
}
