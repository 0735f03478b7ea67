//! The state record: the pattern's one source of truth about a task.

pub use super::fanout::{Branch, Each, Fanout, Stop, StopKind, Within};
pub use super::inbox::Inbox;
use super::policy::Policies;
pub use super::status::{ProcessState, StepStatus};
use super::task_id::TaskId;
use super::workflow::Workflow;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::str::FromStr;

/// One step's progress, forward and (during compensation) backward.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StepState {
    pub name: String,
    pub status: StepStatus,
    /// The workflow declares an undo for this step: without one the step is never undone (a
    /// read-only check, or a step after the pivot).
    #[serde(default, skip_serializing_if = "is_false")]
    pub undoable: bool,
    /// The attempt under which the step finished (Done or Failed).
    pub finished_attempt: Option<u64>,
    pub finished_at: Option<DateTime<Utc>>,
    /// A request under the step's current idempotency key has gone out: unless the service
    /// refused it, the step may have taken effect and compensation must undo it.
    #[serde(default, skip_serializing_if = "is_false")]
    pub sent: bool,
    /// Bumped when an operator retries a step the service refused: a refused idempotency key
    /// stays refused, so the retry needs a new one.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub generation: u32,
    /// What the remote service returned when the step succeeded (JSON text): the data its undo
    /// needs, e.g. the payment id.
    pub result: Option<String>,
    /// Where the result is kept when it is over the inline size: stored, the record holds this
    /// reference and `result` is `None`; read back, both (see [`crate::payloads`]).
    /// A distributed forEach's result past a message's inline size is a JSON Lines payload
    /// (a reference with [`lines`](super::payload::PayloadRef::lines)): stored and read back,
    /// the record holds only this reference, and `result` stays `None`. It is never read back
    /// into `result`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_ref: Option<super::payload::PayloadRef>,
    /// A JSON Lines result's array, read for the queries that read it (its workflow's mappings
    /// and conditions read this step: see [`crate::payloads::Offloading`]); never stored.
    /// Mappings and conditions see it as the step's result; `result`, when set, wins (a result
    /// given later, by hand).
    #[serde(skip)]
    pub loaded: Option<std::sync::Arc<serde_json::Value>>,
    /// The undo's status: `None` until compensation starts on this step, then Running, Done,
    /// Failed (refused) or TimedOut.
    pub undo: Option<StepStatus>,
    /// Like `generation`, for the undo's idempotency key.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub undo_generation: u32,
    /// A callback step the service accepted: the latest instant its callback may come
    /// (heartbeats move the record's deadline, never past this).
    pub waiting_until: Option<DateTime<Utc>>,
    /// A step handed back (Pending again), timed out or cancelled after it was sent: the latest
    /// deadline a request for it went out with. A copy of that request (a duplicated delivery,
    /// a message that came back) may call the service until then, even when the attempt was
    /// handed back early (an agent out of time, an open circuit), so its undo waits past it. A
    /// step out again needs none: its new deadline is later.
    pub sent_until: Option<DateTime<Utc>>,
    /// The revision of the task's input the step ran with, once an operator's retry replaced
    /// that input (`None`: the task's current input). The step's view and its undo read that
    /// input, not the new one: the undo reverses what the step did.
    pub input_revision: Option<u32>,
    /// Attempts of the step its service answered as misconfigured (401, 403, 404...) while its
    /// breaker stayed closed: maybe only this task's request is wrong. Each defers the step;
    /// at the failure threshold the task stops in Error, with the alert.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub misconfigured: u32,
    /// A forEach step: one state per element (each its own request, key, result and undo).
    /// The step's result is the list of theirs, in order (`null` for a refused one).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub elements: Vec<StepState>,
}

// Defaults are left out of the stored body (it is billed by the KB): read back, they are
// their defaults again.
pub(crate) fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl StepState {
    fn new(name: &str, undoable: bool) -> Self {
        Self {
            result_ref: None,
            loaded: None,
            name: name.to_owned(),
            status: StepStatus::Pending,
            undoable,
            finished_attempt: None,
            finished_at: None,
            sent: false,
            generation: 0,
            result: None,
            undo: None,
            undo_generation: 0,
            waiting_until: None,
            sent_until: None,
            input_revision: None,
            misconfigured: 0,
            elements: vec![],
        }
    }

    /// A state for element `k` of this forEach step.
    pub fn element(&self) -> Self {
        Self::new(&self.name, self.undoable)
    }

    /// Element `k` of this forEach step as it stands in the step's place (a request or an
    /// undo for it is built from that): its own state, reading the input the step's list was
    /// rendered from (the step's [`StepState::input_revision`]: an element keeps none of its
    /// own, so its retries and its undo read the list it ran with, whatever input an
    /// operator's retry gave the task since).
    pub fn element_unit(&self, k: usize) -> Option<Self> {
        let mut e = self.elements.get(k)?.clone();
        e.input_revision = self.input_revision;
        Some(e)
    }

    /// Whether compensation must undo this step: it has an undo, it may have taken effect (a
    /// request went out and the service did not refuse it) and its undo has not succeeded yet.
    /// A forEach step: whether an element does.
    pub fn needs_undo(&self) -> bool {
        if !self.elements.is_empty() {
            return self.elements.iter().any(StepState::needs_undo);
        }
        self.undoable
            && self.sent
            && self.status != StepStatus::Failed
            && self.undo != Some(StepStatus::Done)
    }
}

/// What a task announces: status messages to its submitter and events on the bus. Those that
/// end a phase (Processed, Failed, Compensated, CompensationFailed, Refused, Resolved) go
/// through the record's outbox and are delivered at least once; the others are published after the write, best
/// effort.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum NoticeKind {
    Received,
    StepCompleted,
    Processed,
    /// The task failed (a refusal, or the failure threshold): the operator alert.
    Failed,
    Compensated,
    /// An undo failed for good: an operator alert too.
    CompensationFailed,
    /// An operator resubmitted the failed step.
    Retrying,
    /// An operator cancelled the task.
    Cancelled,
    /// A service refused a step (a business outcome) and the task is compensated: no alert.
    Refused,
    /// An operator closed a failed task by hand, with a note.
    Resolved,
}

impl NoticeKind {
    pub const ALL: [NoticeKind; 10] = [
        Self::Received,
        Self::StepCompleted,
        Self::Processed,
        Self::Failed,
        Self::Compensated,
        Self::CompensationFailed,
        Self::Retrying,
        Self::Cancelled,
        Self::Refused,
        Self::Resolved,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Received => "Received",
            Self::StepCompleted => "StepCompleted",
            Self::Processed => "Processed",
            Self::Failed => "Failed",
            Self::Compensated => "Compensated",
            Self::CompensationFailed => "CompensationFailed",
            Self::Retrying => "Retrying",
            Self::Cancelled => "Cancelled",
            Self::Refused => "Refused",
            Self::Resolved => "Resolved",
        }
    }

    /// The EventBridge `detail-type` (`Task` + the status).
    pub fn detail_type(self) -> &'static str {
        match self {
            Self::Received => "TaskReceived",
            Self::StepCompleted => "TaskStepCompleted",
            Self::Processed => "TaskProcessed",
            Self::Failed => "TaskFailed",
            Self::Compensated => "TaskCompensated",
            Self::CompensationFailed => "TaskCompensationFailed",
            Self::Retrying => "TaskRetrying",
            Self::Cancelled => "TaskCancelled",
            Self::Refused => "TaskRefused",
            Self::Resolved => "TaskResolved",
        }
    }

    /// Whether this status pages the operator.
    pub fn is_alert(self) -> bool {
        matches!(self, Self::Failed | Self::CompensationFailed)
    }
}

impl FromStr for NoticeKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| format!("unknown NoticeKind {s:?}"))
    }
}

/// One line of a task's history: every transition appends one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HistoryEntry {
    pub at: DateTime<Utc>,
    pub from: ProcessState,
    pub to: ProcessState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    pub attempt: u64,
    pub reason: String,
    /// Who asked for it: the principal of an operator action or of a caller's cancel. `None`
    /// for what sas did by itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
}

/// The most history entries a record keeps: keeps the item far below DynamoDB's 400 KB limit
/// however often an operator retries. Over it, the oldest line sas wrote by itself goes first:
/// an operator's line (one with `by`) is dropped only for a newer operator's line, once there
/// are [`MAX_OPERATOR_HISTORY`] of them ([`cap_history`]).
pub const MAX_HISTORY: usize = 100;

/// The most operators' lines (and callers' cancels) a record's history keeps, among its
/// [`MAX_HISTORY`]: the newest. Fewer than the cap, so a line sas writes always has a line of
/// its own kind to push out, never an operator's.
pub const MAX_OPERATOR_HISTORY: usize = 40;

/// Keeps `history` (oldest first) within its caps: the newest [`MAX_OPERATOR_HISTORY`] lines
/// with `by`, and at most [`MAX_HISTORY`] in all, dropping the oldest of sas's own lines first.
pub fn cap_history(history: &mut Vec<HistoryEntry>) {
    let mut operators = history.iter().filter(|h| h.by.is_some()).count();
    while operators > MAX_OPERATOR_HISTORY {
        if let Some(oldest) = history.iter().position(|h| h.by.is_some()) {
            history.remove(oldest);
        }
        operators -= 1;
    }
    while history.len() > MAX_HISTORY {
        match history.iter().position(|h| h.by.is_none()) {
            Some(oldest) => history.remove(oldest),
            None => history.remove(0),
        };
    }
}

/// The largest result of one step (serialized JSON): the most an agent reads of an answer.
/// Over [`INLINE_PAYLOAD_BYTES`](super::payload::INLINE_PAYLOAD_BYTES) it is kept by reference.
pub const MAX_RESULT_BYTES: usize = super::payload::MAX_PAYLOAD_BYTES;
/// The most all of a task's results may take together in its state record (serialized JSON,
/// each inline or its reference: [`super::payload::stored_bytes`]), with the events kept for
/// steps not reached yet (as the results they become).
pub const MAX_RESULTS_BYTES: usize = 128 * 1024;

/// A task's place at its workflow's concurrency gate ([`crate::ports::Gates`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GateHold {
    /// The gate: the workflow and the value of its concurrency key (`<workflow>#<value>`).
    pub gate: String,
    /// How many tasks may hold it at once (the workflow's, when the task was created).
    pub limit: u32,
    pub status: GateStatus,
}

/// Where a task stands at its gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum GateStatus {
    /// In line since its creation, not yet tried: `Pending` with its pickup deadline.
    InLine,
    /// Tried, and others hold the gate or wait before it: `Pending` with no deadline. The
    /// leave of a task before it sends it on.
    Parked,
    /// Admitted (with its first claim): it holds the gate until it ends.
    Held,
    /// It ended and left the gate (with the delivery of its final notice).
    Left,
}

impl GateHold {
    /// Whether the task must still leave its gate: it ended, holding it or in line.
    pub fn leave_owed(&self, state: ProcessState) -> bool {
        state.is_final() && self.status != GateStatus::Left
    }

    /// Whether the task must be admitted before its first step goes out.
    pub fn waits(&self) -> bool {
        matches!(self.status, GateStatus::InLine | GateStatus::Parked)
    }
}

/// The state record of one task. Field names follow the pattern (`LockedBy`, `CompleteBy`,
/// `ProcessState`, `FailureCount`) plus the fencing `Attempt` and a `Version` that every write
/// bumps and every conditional write checks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StateRecord {
    pub task_id: TaskId,
    /// The workflow and the version of it the task runs on, for its whole life.
    pub workflow: String,
    pub workflow_version: u32,
    /// The workflow's pivot step: once it is Done the task only goes forward.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pivot: Option<usize>,
    /// A delayed start (`Start-At` on submission): no step goes out before it; the record is
    /// due then (its `CompleteBy`), and the supervisor enqueues it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_at: Option<DateTime<Utc>>,
    /// Named events delivered before the step that waits for them (see [`Inbox`]).
    #[serde(default, skip_serializing_if = "Inbox::is_empty")]
    pub inbox: Inbox,
    /// The task's deadline (its workflow's `deadline` from its submission): a task still
    /// Pending or Processing past it fails (`task_timeout`), whatever step it is at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<DateTime<Utc>>,
    pub process_state: ProcessState,
    /// The scheduler instance holding the claim; `None` unless a step (or undo) is out.
    pub locked_by: Option<String>,
    /// Unlocked: the pickup deadline. Locked: the current step's (or undo's) deadline.
    /// Terminal: none.
    pub complete_by: Option<DateTime<Utc>>,
    /// When the task's deadline timer armed last arrives (one timer per task, see
    /// [`next_timer`] and [`StateRecord::timer_deadline`]): a request sent with a deadline no
    /// earlier than it arms none (a parallel group's and a forEach's included), and the timer
    /// re-arms on arrival for the earliest request then out. `None`: every request arms its own
    /// (a record written before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timer_at: Option<DateTime<Utc>>,
    /// Deadlines of the current step (or undo) that expired in the current round (counted by
    /// the supervisor; a step or undo done starts the next one at 0).
    pub failure_count: u32,
    /// Extended-wait rounds used: each one follows a cool-down after `FailureCount` reached the
    /// threshold.
    #[serde(default)]
    pub round: u32,
    /// Deferrals in a row of the current step (or undo) by its service's open circuit: each
    /// waits longer (the step's retry delay for that many), so a long outage costs a few
    /// wake-ups per task, not one per breaker window. Not failures: the task waits.
    #[serde(default)]
    pub deferrals: u32,
    /// Times in a row the supervisor re-enqueued the task because its pickup deadline passed
    /// unclaimed (a lost work message, or a backlog in the work queue). Each waits longer (see
    /// [`crate::Policy::requeue_delay`]), so a backlog costs a few messages per task, not one per
    /// pickup period. Reset by a claim. Not failures.
    #[serde(default)]
    pub requeues: u32,
    /// Bumped on every claim: the fencing token carried by step requests and replies.
    pub attempt: u64,
    /// The index of the current step (`steps.len()` once Processed). During compensation: the
    /// step being undone.
    pub step_index: usize,
    pub steps: Vec<StepState>,
    /// The groups decided so far (choices and parallel branches), in the order reached.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub decisions: Vec<Decision>,
    /// The parallel group running, with its branches' cursors (see [`Fanout`]); the fields
    /// above are then their aggregate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fanout: Option<Fanout>,
    pub last_error: Option<String>,
    /// The refusal that ended (or is ending) the task: the service's business outcome.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refusal: Option<Refusal>,
    /// While Compensating: the current undo is not claimed before this instant, because the
    /// step it undoes may still be in flight (its deadline, plus the longest call an agent may
    /// still make, plus a clock-skew margin).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub undo_after: Option<DateTime<Utc>>,
    /// The secret that signs this task's callback tokens (see [`callback_token`]). Never shown.
    #[serde(default, skip_serializing)]
    pub callback_key: String,
    /// Statuses owed to the bus and the submitter: the outbox. Written with the transition that
    /// causes them (which gives each its `sequence`, hence its notice id), cleared once
    /// delivered.
    #[serde(default)]
    pub outbox: Vec<Owed>,
    /// Where the application wants its status messages, if anywhere.
    pub reply_queue_url: Option<String>,
    /// Every transition, oldest first (at most [`MAX_HISTORY`]).
    #[serde(default)]
    pub history: Vec<HistoryEntry>,
    /// Optimistic-concurrency version: +1 on every write.
    pub version: u64,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// When the record entered its current `process_state` (the write that changed it): the
    /// state index's sort key, which therefore changes only when the state does, so a write
    /// within a state costs the index nothing.
    pub since: DateTime<Utc>,
    /// Whether some payload of this task may be kept by reference (an input or a result past
    /// the inline size: [`crate::domain::payload`]). Set by the store's edge when it keeps one,
    /// never cleared: the task's retention must then delete its objects (see `purge_at`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub payloads: bool,
    /// The end of a final task's retention, for a task with `payloads`: the record is due then,
    /// and the supervisor deletes its objects, then its items (DynamoDB's TTL, which knows
    /// nothing of S3, deletes the items of a task without payloads).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub purge_at: Option<DateTime<Utc>>,
    /// A child task (a sub-workflow step's): the step of the parent it answers when it ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<ParentLink>,
    /// A task of a workflow with a concurrency limit: its gate and where it stands there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate: Option<GateHold>,
    /// The lane its messages take (see [`crate::domain::lane`]).
    #[serde(default, skip_serializing_if = "crate::domain::Priority::is_normal")]
    pub priority: crate::domain::Priority,
    /// Its caller's tenant: its messages' group on the fair queues (`None`: a record written
    /// before tenants, whose messages go in no group).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// A distributed forEach's run: this record is the run, not a task (see [`RunState`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<RunState>,
    /// The due index's sort key: at or before [`StateRecord::due_at`] (so the sweep is never
    /// late), and kept across writes while the due time stays within [`DUE_KEY_SLACK`] after it
    /// (so a step done, whose next deadline is a little later, does not move the index entry:
    /// a delete and a put). The sweep may therefore find a record up to the slack early; it
    /// reads it and leaves it. `None` iff `due_at()` is.
    pub due_key: Option<DateTime<Utc>>,
}

impl StateRecord {
    /// A run's record (see [`RunState`]): it answers a parent step, holds one step (the one its
    /// elements run), and is held while its ledger has not ended, final once it has.
    fn check_run(&self, run: &RunState) -> Result<(), Invariant> {
        let bad = |m: String| Err(Invariant(format!("a run: {m}")));
        run.ledger.check().map_err(|e| Invariant(e.to_string()))?;
        if self.parent.as_ref().is_none_or(|p| p.element.is_some()) {
            return bad("it answers no task's step".into());
        }
        if self.steps.len() != 1 || self.fanout.is_some() {
            return bad(format!("{} steps", self.steps.len()));
        }
        let ended = run.ledger.ended().is_some();
        match self.process_state {
            ProcessState::Processing => {
                if self.locked_by.as_deref() != Some(RUN_HOLDER) || self.complete_by.is_none() {
                    return bad("running, but not held with a check due".into());
                }
                if ended {
                    return bad(format!(
                        "its ledger ended ({}), but it still runs",
                        run.ledger
                    ));
                }
            }
            s if s.is_terminal() => {
                if self.locked_by.is_some() || self.complete_by.is_some() {
                    return bad(format!("{s}, but still held"));
                }
                // An ended run's ledger has ended, unless an operator closed it (Resolved).
                if !ended && s != ProcessState::Resolved {
                    return bad(format!("{s}, but its ledger runs ({})", run.ledger));
                }
            }
            s => return bad(format!("{s}: a run only runs or ends")),
        }
        match (self.due_key, self.due_at()) {
            (None, None) => {}
            (Some(k), Some(d)) if k <= d => {}
            (k, d) => return bad(format!("due key {k:?} for a record due {d:?}")),
        }
        Ok(())
    }
}

/// How long after its purge a task with payloads keeps its items ([`StateRecord::expires_at`]):
/// the supervisor's sweep deletes its objects within a minute of its purge time; should sweeps
/// stop for this long, DynamoDB's TTL deletes the items and the objects stay (an alarm fires
/// long before: `SupervisorSilentAlarm`).
pub const PURGE_GRACE: chrono::Duration = chrono::Duration::days(2);

/// How far before its due time a record's due-index key may stay (see
/// [`StateRecord::due_key`]): a task that runs for up to this long after its first deadline
/// was set moves its entry only when its state ends.
pub fn due_key_slack() -> chrono::Duration {
    chrono::Duration::seconds(60)
}

/// How long after its write an undelivered notice may wait for the sweep (see
/// [`StateRecord::due_at`]): its writer delivers it at once, so this delays only the backstop
/// for a writer that died between the write and the delivery, or a bus that failed.
pub fn notice_backstop() -> chrono::Duration {
    chrono::Duration::minutes(5)
}

/// The deadline timer a transition that sends the step out (`deadline`, at `now`) leaves
/// armed: the one armed already (`armed`) if it arrives by the deadline and has not arrived
/// yet, else a new one, due at the deadline. The scheduler arms a timer only when this is the
/// step's deadline (see [`StateRecord::timer_at`]); a clean task of three steps whose deadlines
/// come later each time arms one timer, not three. Keeps "a step out has a timer arriving by
/// its deadline" (best effort: a timer not armed is the sweep's, as before).
pub fn next_timer(
    armed: Option<DateTime<Utc>>,
    deadline: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    match (armed, deadline) {
        (Some(t), Some(d)) if t > now && t <= d => Some(t),
        _ => deadline,
    }
}

/// The due-index key of a record due at `due` whose key was `before`: kept while it is at or
/// before `due` and at most [`due_key_slack`] before it, else `due` itself.
pub fn next_due_key(
    before: Option<DateTime<Utc>>,
    due: Option<DateTime<Utc>>,
) -> Option<DateTime<Utc>> {
    match (before, due) {
        (Some(k), Some(d)) if k <= d && d - k <= due_key_slack() => Some(k),
        (_, d) => d,
    }
}

/// A status in the outbox, with the version of the record whose transition made it: the
/// notice's `sequence`, from which its id comes. Stored with the record, so every delivery of
/// it (the first, and any after a crash or a lost race) carries the same id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owed {
    pub status: NoticeKind,
    pub sequence: u64,
}

impl Owed {
    /// The stored form: `Kind@sequence` (e.g. `Failed@7`).
    pub fn encode(&self) -> String {
        format!("{}@{}", self.status.as_str(), self.sequence)
    }

    /// Parses [`Owed::encode`]'s form. A bare status (written before notices had ids) gets
    /// `version`, the record's version: what its delivery would have used then.
    pub fn decode(s: &str, version: u64) -> Result<Self, String> {
        let (status, sequence) = match s.split_once('@') {
            Some((st, seq)) => (
                st,
                seq.parse()
                    .map_err(|e| format!("bad outbox sequence in {s:?}: {e}"))?,
            ),
            None => (s, version),
        };
        Ok(Self {
            status: status.parse()?,
            sequence,
        })
    }
}

/// A service's refusal of a step: a business outcome (`code`, e.g. `declined`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Refusal {
    pub step: String,
    pub code: String,
    pub message: String,
}

/// What a group of the workflow became on a task, decided once when the task reached it: the
/// arm of a choice that ran, or that the group was skipped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Decision {
    pub group: String,
    /// The arm that runs: a choice's case (its `otherwise` is the last arm). `None`: a choice
    /// none of whose cases held (and without `otherwise`), or parallel branches (all run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arm: Option<usize>,
    /// The arm that runs is the choice's `otherwise`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub otherwise: bool,
    /// The group did not run: its `when` did not hold, or a group around it did not run.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub skipped: bool,
    /// Parallel branches that run (every one of them).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub parallel: bool,
}

/// The token with which a callback step's service completes it. It names the step and its
/// idempotency key's generation, which is what the service can know: every attempt of a step
/// carries the same key, and the contract tells a service to answer a repeated key with its
/// first outcome (the first acceptance) and to call back once, at the first URL it got. So a
/// step sent again (after a timed-out attempt, a missed heartbeat, an agent that died) is
/// completed by the callback of its first acceptance. A token of an older generation (the step
/// was retried by an operator under a new key) stays stale. It carries a MAC under the task's
/// own `callback_key`, so it cannot be forged from the task id.
pub fn callback_token(key: &str, task_id: &TaskId, step_index: usize, generation: u32) -> String {
    use hmac::Mac;
    let tag = callback_mac(key, &format!("{task_id}:g{generation}:{step_index}"))
        .map(|m| hex::encode(&m.finalize().into_bytes()[..CALLBACK_TAG_BYTES]))
        .unwrap_or_default();
    format!("g{generation}.{step_index}.{tag}")
}

/// The parent step a child task answers when it ends: as that step's callback would, fenced by
/// the step and its key's generation (a late answer, after the step was sent again under
/// another key or the parent moved on, changes nothing).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ParentLink {
    pub task_id: TaskId,
    pub step: String,
    pub step_index: usize,
    pub generation: u32,
    /// The parent's scheduler's reply queue, where the answer goes.
    pub reply_queue_url: String,
    /// How deep the child is: 1 for a workflow's child, 2 for its child's, ...
    pub depth: usize,
    /// The parent is undoing this child as a unit: the attempt of the parent's undo that the
    /// child's end answers (the child's compensation, or its cancel, started for it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub undo_attempt: Option<u64>,
    /// The parent ended for good, so it will never undo this child: the child's retention
    /// runs (until then, a `Processed` child is kept, see [`StateRecord::held_by_parent`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub released: bool,
    /// An element of a distributed forEach: `task_id` above is its run's record, which its end
    /// goes to (through the ends queue), and this names the element and the task it runs for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub element: Option<ElementOf>,
}

/// Which element of which task's distributed forEach step a record runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ElementOf {
    /// Its unit in the run's ledger: the element's index in the list, or the chunk's.
    pub index: u32,
    /// The task whose step it is: its mappings read that task's input and earlier results,
    /// and its keys are made under that task's id.
    pub task_id: TaskId,
    pub step_index: usize,
    /// A chunk of elements (an in-record forEach of them): its first element's index in the
    /// list, so its element `k` is the list's element `first + k`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first: Option<u32>,
}

impl ElementOf {
    /// The index in the whole list of the record's element `k` (its forEach's, for a chunk; an
    /// element record's own, whatever `k`).
    pub fn element_index(&self, k: usize) -> u32 {
        match self.first {
            Some(first) => first.saturating_add(u32::try_from(k).unwrap_or(u32::MAX)),
            None => self.index,
        }
    }
}

/// A distributed forEach's run, kept in a record of its own (see [`super::run`]): held (locked
/// by [`RUN_HOLDER`], due at its next recheck) while it runs, final once it has answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunState {
    /// The list, kept once as JSON Lines (element `k` is line `k`), read as elements open.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub list: Option<super::payload::PayloadRef>,
    /// The part of its task's context its elements' mappings read
    /// ([`crate::domain::mapping::part_read`]), kept once as the run starts: an element reads
    /// this, not its task's whole input. `None` for a run started before it was kept: its
    /// elements read their task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<super::payload::PayloadRef>,
    pub ledger: super::run::Run,
}

/// Who holds a run's record while it runs: no scheduler claims it, and the supervisor, once
/// its check is due, opens again what it has out ([`RUN_RECHECK`] later).
pub const RUN_HOLDER: &str = "sas.forEach";
/// How often a running run is checked: what it has out is opened (or undone) again, so a
/// crash between its write and its effects delays an element by at most this long.
pub const RUN_RECHECK: chrono::Duration = chrono::Duration::minutes(5);

/// The step and generation a callback token names, read without checking its tag: for a
/// token sas itself made and handed to itself (a sub-workflow step's, to its child).
pub fn token_fence(token: &str) -> Option<(usize, u32)> {
    let mut parts = token.splitn(3, '.');
    let generation = parts.next()?.strip_prefix('g')?.parse().ok()?;
    let step_index = parts.next()?.parse().ok()?;
    Some((step_index, generation))
}

/// What a callback token answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallbackFence {
    /// A step under its key's generation ([`callback_token`]).
    Step { step_index: usize, generation: u32 },
    /// A token made before tokens named the generation: it names the attempt it answers, and
    /// is fenced by it as before (a step that was sent again cannot be completed with it).
    Attempt { attempt: u64, step_index: usize },
}

/// The MAC bytes a token carries (128 bits).
const CALLBACK_TAG_BYTES: usize = 16;

type CallbackMac = hmac::Hmac<sha2::Sha256>;

fn callback_mac(key: &str, message: &str) -> Option<CallbackMac> {
    use hmac::Mac;
    let mut mac = CallbackMac::new_from_slice(key.as_bytes()).ok()?;
    mac.update(message.as_bytes());
    Some(mac)
}

/// A callback token, checked against the task's key: what it answers, or `None` if it is
/// malformed or was not made with this key (compared in constant time).
pub fn check_callback_token(key: &str, task_id: &TaskId, token: &str) -> Option<CallbackFence> {
    use hmac::Mac;
    let mut parts = token.splitn(3, '.');
    let head = parts.next()?;
    let step_index: usize = parts.next()?.parse().ok()?;
    let given = hex::decode(parts.next()?).ok()?;
    if key.is_empty() || given.len() != CALLBACK_TAG_BYTES {
        return None;
    }
    // The generation's `g` keeps the two forms' signed messages apart: an attempt is digits.
    let (message, fence) = match head.strip_prefix('g') {
        Some(g) => {
            let generation: u32 = g.parse().ok()?;
            (
                format!("{task_id}:g{generation}:{step_index}"),
                CallbackFence::Step {
                    step_index,
                    generation,
                },
            )
        }
        None => {
            let attempt: u64 = head.parse().ok()?;
            (
                format!("{task_id}:{attempt}:{step_index}"),
                CallbackFence::Attempt {
                    attempt,
                    step_index,
                },
            )
        }
    };
    callback_mac(key, &message)?
        .verify_truncated_left(&given)
        .ok()
        .map(|()| fence)
}

/// A broken invariant of the state record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid state record: {0}")]
pub struct Invariant(pub String);

/// Drops sub-millisecond precision: the stores keep milliseconds, so every timestamp the domain
/// writes is already at that precision and survives a round trip unchanged.
pub fn to_millis(t: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(t.timestamp_millis()).unwrap_or(t)
}

impl StateRecord {
    /// A new Pending record that a scheduler must pick up by `pickup_by`.
    pub fn new(
        task_id: TaskId,
        workflow: &Workflow,
        reply_queue_url: Option<String>,
        now: DateTime<Utc>,
        pickup_by: DateTime<Utc>,
    ) -> Self {
        let now = to_millis(now);
        let pickup_by = to_millis(pickup_by);
        // The first step's deadline will be at least its dispatch deadline from now (its
        // start allowance and timeout): a key no later than that stays put when the task is
        // claimed, if the claim's deadline is within the slack of it.
        let first = workflow.policies().at(0).clone();
        let first_deadline = now
            .checked_add_signed(first.start_within + first.step_timeout)
            .unwrap_or(pickup_by);
        Self {
            payloads: false,
            purge_at: None,
            parent: None,
            gate: None,
            priority: crate::domain::Priority::Normal,
            tenant: None,
            run: None,
            task_id,
            workflow: workflow.name.clone(),
            workflow_version: workflow.version,
            pivot: workflow.pivot,
            deadline: workflow.deadline.and_then(|d| now.checked_add_signed(d)),
            start_at: None,
            inbox: Inbox::default(),
            process_state: ProcessState::Pending,
            locked_by: None,
            complete_by: Some(pickup_by),
            timer_at: None,
            failure_count: 0,
            round: 0,
            deferrals: 0,
            requeues: 0,
            attempt: 0,
            step_index: 0,
            steps: workflow
                .steps
                .iter()
                .map(|s| StepState::new(&s.name, s.undo.is_some()))
                .collect(),
            decisions: vec![],
            fanout: None,
            last_error: None,
            refusal: None,
            undo_after: None,
            callback_key: hex::encode(rand::random::<[u8; 16]>()),
            outbox: vec![],
            reply_queue_url,
            history: vec![HistoryEntry {
                at: now,
                from: ProcessState::Pending,
                to: ProcessState::Pending,
                step: None,
                attempt: 0,
                reason: "received".into(),
                by: None,
            }],
            version: 1,
            created_at: now,
            updated_at: now,
            since: now,
            due_key: Some(pickup_by.min(first_deadline)),
        }
    }

    /// The record of a task that starts at `start` (later than its creation): Pending and due
    /// then, no step going out before (see [`StateRecord::start_at`]).
    pub fn starting_at(mut self, start: DateTime<Utc>) -> Self {
        let start = to_millis(start);
        if start > self.created_at {
            self.start_at = Some(start);
            self.complete_by = Some(start);
            self.due_key = Some(start);
        }
        self
    }

    /// The end of the line the cursor walks: the number of steps, or, for the record as seen
    /// from a branch, the end of the branch.
    pub fn end(&self) -> usize {
        self.branch().map_or(self.steps.len(), |b| b.end)
    }

    /// The first step from `from` on the line the cursor walks that was not decided away
    /// (Skipped); the end of the line if none.
    pub fn next_not_skipped(&self, from: usize) -> usize {
        let end = self.end();
        (from..end)
            .find(|&j| self.steps[j].status != StepStatus::Skipped)
            .unwrap_or(end)
    }

    /// The branch this record is seen from, inside a transition (see [`Fanout::current`]).
    pub fn branch(&self) -> Option<&Branch> {
        let f = self.fanout.as_ref()?;
        f.branches.get(f.current?)
    }

    /// A distributed forEach's element record: which element of which task's step it is.
    pub fn element_of(&self) -> Option<&ElementOf> {
        self.parent.as_ref()?.element.as_ref()
    }

    /// The index in its list of element `k` of this record's forEach: `k`, but in a chunk of a
    /// distributed forEach its place in the whole list ([`ElementOf::element_index`]).
    pub fn list_index(&self, k: usize) -> u32 {
        self.element_of()
            .map_or(u32::try_from(k).unwrap_or(u32::MAX), |e| e.element_index(k))
    }

    /// A distributed forEach's run or one of its elements: sas's own records, not tasks of a
    /// caller's (off the bus but for alerts, out of the state lists but while they wait for an
    /// operator).
    pub fn of_a_run(&self) -> bool {
        self.run.is_some() || self.element_of().is_some()
    }

    /// Seen from an element of a forEach step, inside a transition: the step, and the
    /// element's index among its elements.
    pub fn element(&self) -> Option<(usize, usize)> {
        let f = self.fanout.as_ref()?;
        f.each_of(f.current?).map(|(e, k)| (e.step, k))
    }

    /// The current step's name, if the record has a current step.
    pub fn current_step(&self) -> Option<&str> {
        self.steps.get(self.step_index).map(|s| s.name.as_str())
    }

    /// The statuses the outbox holds, oldest first.
    pub fn owed(&self) -> Vec<NoticeKind> {
        self.outbox.iter().map(|o| o.status).collect()
    }

    /// Adds `status` to the outbox, made by this version of the record (call it on the record a
    /// transition writes, after its version was bumped).
    pub fn owe(&mut self, status: NoticeKind) {
        self.outbox.push(Owed {
            status,
            sequence: self.version,
        });
    }

    /// The deadline the task's one timer watches ([`StateRecord::timer_at`]): the current
    /// step's (or undo's) deadline; under a fan-out, the earliest deadline of the requests out
    /// (a branch waiting for its claim is the sweep's, as before).
    pub fn timer_deadline(&self) -> Option<DateTime<Utc>> {
        match &self.fanout {
            Some(f) => f
                .branches
                .iter()
                .filter(|br| br.process_state == ProcessState::Processing)
                .filter_map(|br| br.complete_by)
                .min(),
            None => self.complete_by,
        }
    }

    /// Whether the request sent from this record (under a fan-out, the record as the branch
    /// sending it sees it) arms the task's timer: its deadline is the timer the transition kept
    /// ([`StateRecord::timer_at`]; `None`, a record written before: every request arms its
    /// own), and under a fan-out it is the first branch out with that deadline, so a claim that
    /// sends ten elements with one deadline arms one timer.
    pub fn arms_timer(&self) -> bool {
        let Some(due) = self.complete_by else {
            return false;
        };
        let Some(armed) = self.timer_at else {
            return true;
        };
        let first_out = |f: &super::fanout::Fanout, b: usize| {
            f.branches.iter().position(|br| {
                br.process_state == ProcessState::Processing && br.complete_by == Some(armed)
            }) == Some(b)
        };
        armed == due
            && self
                .fanout
                .as_ref()
                .is_none_or(|f| f.current.is_none_or(|b| first_out(f, b)))
    }

    /// A notice is owed (the outbox is not empty).
    pub fn notice_pending(&self) -> bool {
        !self.outbox.is_empty()
    }

    /// When the supervisor must look at this record, if ever: if the outbox holds a notice,
    /// when the sweep delivers it should its writer not (see [`notice_backstop`]); else the
    /// deadline of a non-terminal record. This is what the sparse due index carries; `None`
    /// means the record is absent from the index.
    pub fn due_at(&self) -> Option<DateTime<Utc>> {
        if self.notice_pending() {
            // The writer of a notice delivers it at once; the sweep is the backstop for a
            // writer that died or a bus that failed. The backstop may wait for the record's
            // due key if that is no more than `notice_backstop` after the write (a key already
            // passed is due at once anyway): the index entry then stays where it is, where
            // moving it to the write's time would cost a delete and a put on `due-index` (the
            // final write of a clean task, or of a retried one).
            let backstop = match self.due_key {
                Some(k) if k <= self.updated_at + notice_backstop() => k,
                _ => self.updated_at,
            };
            // A record still running is due at its deadline if that comes first.
            Some(self.next_deadline().map_or(backstop, |d| d.min(backstop)))
        } else {
            // A final record is due only for its purge.
            self.next_deadline().or(self.purge_at)
        }
    }

    /// Whether a step's or element's result, or a kept event's payload, is past the inline
    /// size: kept by reference.
    pub fn holds_large_result(&self) -> bool {
        let large = |s: &StepState| {
            s.result
                .as_ref()
                .is_some_and(|r| !crate::domain::payload::is_inline(r.len()))
        };
        self.steps
            .iter()
            .any(|s| large(s) || s.elements.iter().any(large))
            || self
                .inbox
                .kept
                .iter()
                .any(|e| !crate::domain::payload::is_inline(e.payload.len()))
    }

    /// When a final record's items expire (DynamoDB's TTL on `ExpiresAt`) with a `retention`:
    /// its last write plus the retention; for a task with payloads, [`PURGE_GRACE`] after its
    /// purge, so the supervisor deletes its objects before its items go.
    pub fn expires_at(&self, retention: Option<chrono::Duration>) -> Option<DateTime<Utc>> {
        let keep = retention?;
        if !self.process_state.is_final() || self.held_by_parent() {
            return None;
        }
        Some(match self.purge_at {
            Some(at) => at + PURGE_GRACE,
            None => self.updated_at + keep,
        })
    }

    /// A `Processed` child task its parent may still undo as a unit: it is kept, whatever the
    /// retention, until its parent ends for good and releases it.
    pub fn held_by_parent(&self) -> bool {
        self.process_state == ProcessState::Processed
            && self.parent.as_ref().is_some_and(|l| !l.released)
    }

    /// The time the operator's lists order this record by: when it entered its state, but
    /// while it is active (`Pending`, `Processing`) and listed, when it was created. The two
    /// active states share one index entry keyed by this time, so that a claim, and a wait's or
    /// a callback's return to `Pending`, move no entry (a move deletes one and writes another: 2
    /// WRU); the lists of either state read the records' states. Every store orders by it.
    pub fn listed_since(&self) -> DateTime<Utc> {
        if self.process_state.is_active() && self.listed_by_state() {
            self.created_at
        } else {
            self.since
        }
    }

    /// Whether the operator's state index lists this record (the lists and counts by state
    /// and workflow): every task's, but a distributed forEach's run and its elements only
    /// while they wait for an operator (`Error`, `CompensationFailed`). A run of 10,000
    /// elements puts no row into `Processing` or `Processed`; its task, its view and the
    /// run's view name them instead. Every store keeps its state index by this one rule.
    pub fn listed_by_state(&self) -> bool {
        !self.of_a_run()
            || matches!(
                self.process_state,
                ProcessState::Error | ProcessState::CompensationFailed
            )
    }

    /// Whether this final record's retention has ended at `now`, its notices delivered: its
    /// payloads and items are to be deleted.
    pub fn purge_due(&self, now: DateTime<Utc>) -> bool {
        self.process_state.is_final()
            && !self.notice_pending()
            && self.purge_at.is_some_and(|at| at <= now)
    }

    /// The due-index shard of this record (see docs/capacity.md: the sharded sparse due index).
    pub fn due_shard(&self, shards: u32) -> u32 {
        due_shard(&self.task_id, shards)
    }

    /// The earliest deadline of a record still running: its step's (or pickup's), or the
    /// task's own while it goes forward (Pending, Processing).
    fn next_deadline(&self) -> Option<DateTime<Utc>> {
        if self.process_state.is_terminal() {
            return None;
        }
        match self.task_deadline_applies() {
            Some(d) => Some(self.complete_by.map_or(d, |c| c.min(d))),
            None => self.complete_by,
        }
    }

    /// The task's deadline, while it applies (the task goes forward: Pending, Processing).
    pub fn task_deadline_applies(&self) -> Option<DateTime<Utc>> {
        self.deadline.filter(|_| {
            matches!(
                self.process_state,
                ProcessState::Pending | ProcessState::Processing
            )
        })
    }

    /// Whether the pivot step is done: from then on the task only goes forward.
    pub fn past_pivot(&self) -> bool {
        self.pivot
            .and_then(|p| self.steps.get(p))
            .is_some_and(|s| s.status == StepStatus::Done)
    }

    /// The results kept so far, as `{<step>: {"result": ...}}`, for input mappings.
    pub fn results(&self) -> serde_json::Map<String, serde_json::Value> {
        let parse = |s: &StepState| -> Option<serde_json::Value> {
            serde_json::from_str(s.result.as_deref()?).ok()
        };
        self.steps
            .iter()
            .filter_map(|s| {
                // (An operator's skip of a forEach step gives its result by hand.)
                let result = if let (None, Some(array)) = (&s.result, &s.loaded) {
                    // A JSON Lines result, read for the queries that read it.
                    (**array).clone()
                } else if s.elements.is_empty() || s.result.is_some() {
                    parse(s)?
                } else if s.status == StepStatus::Done {
                    // A forEach step's: its elements', in order.
                    serde_json::Value::Array(
                        s.elements
                            .iter()
                            .map(|e| parse(e).unwrap_or(serde_json::Value::Null))
                            .collect(),
                    )
                } else {
                    return None;
                };
                Some((s.name.clone(), serde_json::json!({ "result": result })))
            })
            .collect()
    }

    /// The bytes the kept results take together (a forEach step's elements' included), and
    /// the events kept for steps not reached yet, as the results they become: what
    /// [`MAX_RESULTS_BYTES`] bounds.
    pub fn results_bytes(&self) -> usize {
        self.steps
            .iter()
            .flat_map(|s| std::iter::once(s).chain(&s.elements))
            .filter_map(|s| {
                // A JSON Lines result is its reference (and may be read into `loaded`).
                if let Some(r) = &s.result_ref
                    && r.lines.is_some()
                    && s.result.is_none()
                {
                    return Some(r.stored_bytes());
                }
                let text = s.result.as_ref().map(String::len);
                let kept = s.result_ref.as_ref().map(|r| r.bytes as usize);
                text.or(kept).map(super::payload::stored_bytes)
            })
            .chain(
                self.inbox
                    .kept
                    .iter()
                    .map(|e| super::payload::stored_bytes(e.result_bytes())),
            )
            .sum()
    }

    /// The element of forEach step `i` whose undo is out, or else the next to undo (the
    /// highest that needs it); `None` for a step that is not a forEach step.
    pub fn undo_element(&self, i: usize) -> Option<usize> {
        let elements = &self.steps.get(i)?.elements;
        elements
            .iter()
            .rposition(|e| e.undo == Some(StepStatus::Running))
            .or_else(|| elements.iter().rposition(StepState::needs_undo))
            .or_else(|| {
                elements.iter().rposition(|e| {
                    matches!(e.undo, Some(StepStatus::Failed | StepStatus::TimedOut))
                })
            })
    }

    /// The state of what an undo at step `i` acts on: the step, or its element being undone.
    pub fn undo_unit(&self, i: usize) -> Option<&StepState> {
        let step = self.steps.get(i)?;
        match self.undo_element(i) {
            Some(k) => step.elements.get(k),
            None => Some(step),
        }
    }

    /// Sets the undo status of what an undo at step `i` acts on (see [`Self::undo_unit`]); a
    /// forEach step's own undo status then follows its elements': Running while one is out,
    /// Failed or TimedOut once one ended so, Done once none needs one, else none.
    pub fn set_undo(&mut self, i: usize, status: Option<StepStatus>) {
        let k = self.undo_element(i);
        let Some(step) = self.steps.get_mut(i) else {
            return;
        };
        let Some(k) = k else {
            step.undo = status;
            return;
        };
        if let Some(e) = step.elements.get_mut(k) {
            e.undo = status;
        }
        let es = &step.elements;
        step.undo = if es.iter().any(|e| e.undo == Some(StepStatus::Running)) {
            Some(StepStatus::Running)
        } else if let Some(bad) = es.iter().find_map(|e| {
            e.undo
                .filter(|u| matches!(u, StepStatus::Failed | StepStatus::TimedOut))
        }) {
            Some(bad)
        } else if !es.iter().any(StepState::needs_undo) && es.iter().any(|e| e.undo.is_some()) {
            Some(StepStatus::Done)
        } else {
            None
        };
    }

    /// Checks every invariant of the record under the workflow's policies (`p`: each step's
    /// failure threshold).
    pub fn check(&self, p: &Policies) -> Result<(), Invariant> {
        use ProcessState as P;
        use StepStatus as S;
        let bad = |m: String| Err(Invariant(m));
        if let Some(run) = &self.run {
            return self.check_run(run);
        }
        let n = self.steps.len();
        if n == 0 {
            return bad("a record has at least one step".into());
        }
        // A task parks at its gate only before it ran. (It leaves once it ended; a child
        // undone as a unit after it ended runs its undos outside the gate.)
        if let Some(g) = &self.gate
            && g.status == GateStatus::Parked
            && self.process_state != P::Pending
        {
            return bad(format!("parked at its gate while {}", self.process_state));
        }
        // A purge is due only for a final task that kept payloads, its notices out: nothing
        // else is ever deleted by the supervisor.
        if self.purge_at.is_some()
            && !(self.process_state.is_final() && self.payloads && !self.notice_pending())
        {
            return bad(format!(
                "a purge time on a {} record (payloads: {}, notice owed: {})",
                self.process_state,
                self.payloads,
                self.notice_pending()
            ));
        }
        let threshold = p.at(self.step_index).failure_threshold;
        if self.past_pivot()
            && matches!(
                self.process_state,
                P::Compensating | P::Compensated | P::CompensationFailed
            )
        {
            return bad(format!("{} past the pivot", self.process_state));
        }
        if self.results_bytes() > MAX_RESULTS_BYTES {
            return bad("the kept results are over their limit".into());
        }
        if self.failure_count > threshold {
            return bad(format!(
                "FailureCount {} above the threshold {threshold}",
                self.failure_count
            ));
        }
        // A resolved task keeps the count it failed with (what the operator resolved).
        if self.failure_count == threshold
            && !matches!(
                self.process_state,
                P::Error | P::CompensationFailed | P::Resolved
            )
        {
            return bad(format!(
                "FailureCount at the threshold while {}",
                self.process_state
            ));
        }
        if self.history.len() > MAX_HISTORY
            || self.history.iter().filter(|h| h.by.is_some()).count() > MAX_OPERATOR_HISTORY
        {
            return bad("history over its cap".into());
        }
        if self.since < self.created_at || self.since > self.updated_at {
            return bad("entered its state outside its life".into());
        }
        match (self.due_key, self.due_at()) {
            (None, None) => {}
            (Some(k), Some(d)) if k <= d => {}
            (k, d) => return bad(format!("due key {k:?} for a record due {d:?}")),
        }
        if self.process_state.is_terminal()
            && (self.locked_by.is_some() || self.complete_by.is_some())
        {
            return bad(format!("{} record still locked or due", self.process_state));
        }
        if self
            .steps
            .iter()
            .any(|s| matches!(s.status, S::Running | S::Waiting) && !s.sent)
        {
            return bad("a Running step that was never sent".into());
        }
        if self
            .steps
            .iter()
            .any(|s| s.status == S::Skipped && (s.sent || s.undo.is_some() || s.result.is_some()))
        {
            return bad("a Skipped step that was sent, undone or has a result".into());
        }
        if self
            .steps
            .iter()
            .any(|s| s.waiting_until.is_some() != (s.status == S::Waiting))
        {
            return bad("a step waits for its callback iff it is Waiting".into());
        }
        if self.steps.iter().any(|s| {
            s.sent_until.is_some()
                && !matches!(s.status, S::Pending | S::TimedOut | S::Cancelled | S::Done)
        }) {
            return bad("a step out or refused keeps the deadline it was handed back at".into());
        }
        if self.undo_after.is_some() && self.process_state != P::Compensating {
            return bad(format!("{} with an undo wait", self.process_state));
        }
        if let Some(f) = &self.fanout {
            return self.check_fanout(f).map_err(Invariant);
        }
        let undo_running = self
            .steps
            .iter()
            .filter(|s| s.undo == Some(S::Running))
            .count();
        let forward = matches!(
            self.process_state,
            P::Pending | P::Processing | P::Processed | P::Error
        );
        if forward {
            if self.steps.iter().any(|s| s.undo.is_some()) {
                return bad(format!("{} with an undo started", self.process_state));
            }
            let done_before = self.steps[..self.step_index.min(n)]
                .iter()
                .all(|s| s.status.is_passed());
            let untouched_after = self.steps[(self.step_index + 1).min(n)..]
                .iter()
                .all(|s| matches!(s.status, S::Pending | S::Skipped) && !s.sent);
            if !done_before {
                return bad("a step before the current one is not Done or Skipped".into());
            }
            if !untouched_after {
                return bad("a step after the current one has started".into());
            }
        } else {
            if self.step_index >= n {
                return bad(format!("{} without a current step", self.process_state));
            }
            let later_need_undo = self.steps[self.step_index + 1..]
                .iter()
                .any(StepState::needs_undo);
            // (A task resolved by hand may keep steps an operator settled outside sas.)
            if later_need_undo && self.process_state != P::Resolved {
                return bad("compensation skipped a step that needs its undo".into());
            }
        }
        let current = self.steps.get(self.step_index);
        match self.process_state {
            P::Pending => {
                // (Parked at its gate, it has no deadline: the leave before it sends it on.)
                let parked = self
                    .gate
                    .as_ref()
                    .is_some_and(|g| g.status == GateStatus::Parked);
                if self.locked_by.is_some() || self.complete_by.is_none() != parked {
                    return bad(
                        "Pending must be unlocked and carry a pickup deadline, but parked at its gate"
                            .into(),
                    );
                }
                if current.map(|s| s.status) != Some(S::Pending) {
                    return bad("Pending must have its current step Pending".into());
                }
            }
            P::Processing => {
                if self.locked_by.is_none() || self.complete_by.is_none() || self.attempt == 0 {
                    return bad("Processing must be locked, claimed and carry a deadline".into());
                }
                if !matches!(current.map(|s| s.status), Some(S::Running | S::Waiting)) {
                    return bad("Processing must have its current step Running or Waiting".into());
                }
            }
            P::Processed => {
                if self.step_index != n || self.steps.iter().any(|s| !s.status.is_passed()) {
                    return bad("Processed with a step neither Done nor Skipped".into());
                }
            }
            P::Error => {
                if current.is_some_and(|s| {
                    !matches!(s.status, S::Pending | S::Failed | S::TimedOut | S::Faulted)
                }) {
                    return bad("Error with its current step still Running or Done".into());
                }
            }
            P::Compensating => {
                let Some(cur) = current else {
                    return bad("Compensating without a current step".into());
                };
                if !cur.needs_undo() || self.complete_by.is_none() {
                    return bad(
                        "Compensating on a step that needs no undo, or without a deadline".into(),
                    );
                }
                let locked = self.locked_by.is_some();
                if locked != (cur.undo == Some(S::Running)) || undo_running != usize::from(locked) {
                    return bad("Compensating: locked iff the current undo is Running".into());
                }
                if !locked && cur.undo.is_some() {
                    return bad(
                        "Compensating, unlocked, with the current undo already tried".into(),
                    );
                }
                if locked && self.attempt == 0 {
                    return bad("an undo out under attempt 0".into());
                }
            }
            P::Compensated | P::Refused => {
                if undo_running > 0 || self.steps.iter().any(StepState::needs_undo) {
                    return bad(format!("{} with a step still to undo", self.process_state));
                }
                if (self.process_state == P::Refused) != self.refusal.is_some() {
                    return bad("Refused iff a service refused a step".into());
                }
            }
            P::CompensationFailed => {
                if undo_running > 0
                    || !current.is_some_and(|s| matches!(s.undo, Some(S::Failed | S::TimedOut)))
                {
                    return bad("CompensationFailed without a failed undo".into());
                }
            }
            P::Resolved => {
                if undo_running > 0 || current.is_some_and(|s| s.status == S::Running) {
                    return bad("Resolved with a step or undo still out".into());
                }
            }
        }
        Ok(())
    }
}

/// The due-index shard of a task: a stable function of its id, spreading records evenly.
pub fn due_shard(id: &TaskId, shards: u32) -> u32 {
    let b = id.as_uuid().into_bytes();
    u32::from_be_bytes([b[12], b[13], b[14], b[15]]) % shards.max(1)
}

impl StateRecord {
    /// The invariants of a record whose parallel group runs (or stopped, in Error): see
    /// [`StateRecord::check`].
    fn check_fanout(&self, f: &Fanout) -> Result<(), String> {
        use ProcessState as P;
        use StepStatus as S;
        let steps = &self.steps;
        let passed = |r: std::ops::Range<usize>| steps[r].iter().all(|s| s.status.is_passed());
        let untouched = |r: std::ops::Range<usize>| {
            steps[r]
                .iter()
                .all(|s| matches!(s.status, S::Pending | S::Skipped) && !s.sent)
        };
        if !matches!(self.process_state, P::Pending | P::Processing | P::Error) {
            return Err(format!(
                "{} with a parallel group running",
                self.process_state
            ));
        }
        if f.current.is_some() {
            return Err("a stored record seen from a branch".into());
        }
        // Stopped in Error, the cursor is on the step that failed, for the operator.
        let cursor = match (&f.stop, self.process_state) {
            (Some(stop), P::Error) => stop.step,
            _ => f.start,
        };
        if f.start >= f.end || f.end > steps.len() || self.step_index != cursor {
            return Err("a parallel group's span, or the cursor not on it".into());
        }
        // The step that failed did not finish: an operator's skip gives it its result, a retry
        // runs it (never a step that is done: its result is what its undo reads).
        if self.process_state == P::Error && steps[cursor].status.is_passed() {
            return Err(format!(
                "a group stopped in Error at step {cursor}, which is {}",
                steps[cursor].status
            ));
        }
        if steps.iter().any(|s| s.undo.is_some()) {
            return Err("a parallel group running with an undo started".into());
        }
        if !passed(0..f.start) || !untouched(f.end..steps.len()) {
            return Err("a step before the group not done, or one after it started".into());
        }
        if let Some(each) = &f.each {
            let step = steps
                .get(each.step)
                .filter(|_| each.step == f.start && f.end == f.start + 1);
            let Some(step) = step else {
                return Err("a forEach run off its step".into());
            };
            let running = step.status == S::Running
                || (self.process_state == P::Error
                    && matches!(step.status, S::Failed | S::TimedOut | S::Faulted));
            if !running || !step.sent || step.elements.len() != f.branches.len() {
                return Err("a forEach step running: Running, sent, an element per branch".into());
            }
            let out = f.branches.iter().filter(|br| br.is_out()).count();
            if out > each.max_concurrency as usize || each.refused > each.tolerated {
                return Err(format!("{out} elements out, {} refused", each.refused));
            }
        }
        // A branch's forEach steps: their elements follow the group's own branches.
        let own = f
            .inner
            .iter()
            .filter_map(|e| e.within.as_ref())
            .map(|w| w.first)
            .min()
            .unwrap_or(f.branches.len());
        let mut next_first = own;
        for e in &f.inner {
            let Some(w) = &e.within else {
                return Err("a branch's forEach step without its place".into());
            };
            let Some(parent) = f.branches.get(w.branch).filter(|_| w.branch < own) else {
                return Err(format!("a forEach step of branch {}", w.branch));
            };
            let step = steps.get(e.step);
            if w.first != next_first
                || w.first + w.count > f.branches.len()
                || !(parent.start..parent.end).contains(&e.step)
                || step.is_none_or(|s| s.elements.len() != w.count || (!s.sent && w.count > 0))
            {
                return Err(format!(
                    "forEach step {} off its branch or elements",
                    e.step
                ));
            }
            next_first += w.count;
            let out = f.branches[w.first..w.first + w.count]
                .iter()
                .filter(|br| br.is_out())
                .count();
            if out > e.max_concurrency as usize || e.refused > e.tolerated {
                return Err(format!("{out} elements out, {} refused", e.refused));
            }
            if w.done == (parent.step_index == e.step) {
                return Err(format!(
                    "branch {}: at its forEach step {} iff its elements run",
                    w.branch, e.step
                ));
            }
        }
        if next_first != f.branches.len() || (f.each.is_some() && !f.inner.is_empty()) {
            return Err("branches that are no forEach step's elements after its own".into());
        }
        // An element waits for room (Pending, no deadline) only while its step has none: as
        // many elements out, or handed back to go out again (with their deadlines), as its
        // `maxConcurrency`. Else nothing would ever send it. Past the task's deadline nothing
        // goes out (a claim is refused): the record is due at that deadline, and its expiry
        // ends the task.
        let past_deadline = self
            .task_deadline_applies()
            .is_some_and(|d| d <= self.updated_at);
        for e in f.running().filter(|_| f.stop.is_none() && !past_deadline) {
            let range = f.elements_of(e);
            let branches = &f.branches[range];
            let waiting = branches
                .iter()
                .any(|br| br.process_state == P::Pending && br.complete_by.is_none());
            let taken = branches
                .iter()
                .filter(|br| {
                    br.is_out() || (br.process_state == P::Pending && br.complete_by.is_some())
                })
                .count();
            if waiting && taken < e.max_concurrency as usize {
                return Err(format!(
                    "forEach step {}: an element waits for room with {taken} of {} places taken",
                    e.step, e.max_concurrency
                ));
            }
        }
        let mut at = f.start;
        for (b, br) in f.branches.iter().enumerate() {
            let of = f.each_of(b);
            let element = of.and_then(|(e, k)| steps[e.step].elements.get(k));
            let closed = of.is_some_and(|(e, _)| e.within.as_ref().is_some_and(|w| w.done));
            let spans = match of {
                // Every element's branch is its forEach step.
                Some((e, _)) => br.start == e.step && br.end == e.step + 1 && element.is_some(),
                None => br.start == at && br.end > br.start,
            };
            if !spans || br.step_index < br.start || br.step_index > br.end {
                return Err(format!("branch {b}'s span or cursor"));
            }
            if of.is_none() {
                at = br.end;
            }
            if element.is_none()
                && (!passed(br.start..br.step_index)
                    || !untouched((br.step_index + 1).min(br.end)..br.end))
            {
                return Err(format!(
                    "branch {b}: a step before its cursor not done, or one after it started"
                ));
            }
            let waits = f.waits(b).is_some();
            let current = match element {
                Some(e) if br.step_index < br.end => Some(e.status),
                // An element of a forEach step an operator did by hand: as it ran.
                Some(_) if closed => None,
                // A done element: Done, or refused within the tolerance.
                Some(e) if matches!(e.status, S::Done | S::Failed) => None,
                Some(e) => return Err(format!("element {b} is over but {}", e.status)),
                None => steps
                    .get(br.step_index)
                    .filter(|_| br.step_index < br.end)
                    .map(|s| s.status),
            };
            let ok = match br.process_state {
                P::Processed => br.step_index == br.end,
                // Waiting for its forEach step's elements: Running while they run; as they
                // ended once the group stopped in Error.
                P::Processing if waits => {
                    br.complete_by.is_none()
                        && (current == Some(S::Running) || self.process_state == P::Error)
                }
                P::Processing => {
                    br.locked_by.is_some()
                        && br.complete_by.is_some()
                        && matches!(current, Some(S::Running | S::Waiting))
                }
                // (An element with no deadline waits for room: see below.)
                P::Pending => {
                    br.locked_by.is_none()
                        && current == Some(S::Pending)
                        && (f.stop.is_some() || br.complete_by.is_some() || of.is_some())
                }
                P::Error => {
                    f.stop.is_some()
                        && matches!(
                            current,
                            Some(S::Pending | S::Failed | S::TimedOut | S::Faulted)
                        )
                }
                _ => false,
            };
            if !ok {
                return Err(format!(
                    "branch {b} is {} with its step {current:?}",
                    br.process_state
                ));
            }
        }
        if at != f.end && f.each.is_none() {
            return Err("the branches do not cover the group".into());
        }
        if let Some(stop) = &f.stop
            && !(f.start..f.end).contains(&stop.step)
        {
            return Err("a parallel group stopped by a step outside it".into());
        }
        let out = f.branches.iter().any(Branch::is_out);
        let expected = match (out, self.process_state) {
            (true, P::Processing) => true,
            (false, P::Pending) => f.stop.is_none(),
            (false, P::Error) => f.stop.is_some(),
            _ => false,
        };
        if !expected || self.locked_by.is_some() != out {
            return Err(format!(
                "{} (locked: {}) while a branch is out: {out}",
                self.process_state,
                self.locked_by.is_some()
            ));
        }
        let stopping = f.stop.is_some();
        let due = f
            .branches
            .iter()
            .filter(|br| br.is_out() || (!stopping && br.process_state == P::Pending))
            .filter_map(|br| br.complete_by)
            .min();
        if self.process_state != P::Error && self.complete_by != due {
            return Err("CompleteBy is not the earliest branch deadline".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_arms_a_timer_unless_the_one_armed_arrives_by_its_deadline() {
        let now = Utc::now();
        let s = |n: i64| now + chrono::Duration::seconds(n);
        // None armed, or the one armed arrived: a new one at the deadline.
        assert_eq!(next_timer(None, Some(s(30)), now), Some(s(30)));
        assert_eq!(next_timer(Some(s(0)), Some(s(30)), now), Some(s(30)));
        // The one armed arrives first: kept (it re-arms on arrival).
        assert_eq!(next_timer(Some(s(5)), Some(s(30)), now), Some(s(5)));
        // A deadline earlier than the one armed: its own.
        assert_eq!(next_timer(Some(s(30)), Some(s(5)), now), Some(s(5)));
    }

    #[test]
    fn a_due_key_is_kept_only_at_or_before_the_due_time_and_within_the_slack() {
        let t = to_millis(chrono::Utc::now());
        let s = due_key_slack();
        assert_eq!(next_due_key(None, Some(t)), Some(t));
        assert_eq!(next_due_key(Some(t), None), None);
        assert_eq!(
            next_due_key(Some(t), Some(t + s)),
            Some(t),
            "within the slack: kept"
        );
        assert_eq!(
            next_due_key(Some(t), Some(t + s + chrono::Duration::milliseconds(1))),
            Some(t + s + chrono::Duration::milliseconds(1)),
            "past the slack: moved up"
        );
        let earlier = t - chrono::Duration::milliseconds(1);
        assert_eq!(
            next_due_key(Some(t), Some(earlier)),
            Some(earlier),
            "due before the key: moved down (the sweep is never late)"
        );
    }

    #[test]
    fn an_owed_status_round_trips_and_a_bare_one_takes_the_records_version() {
        let o = Owed {
            status: NoticeKind::CompensationFailed,
            sequence: 12,
        };
        assert_eq!(o.encode(), "CompensationFailed@12");
        assert_eq!(Owed::decode(&o.encode(), 99), Ok(o));
        assert_eq!(
            Owed::decode("Failed", 7),
            Ok(Owed {
                status: NoticeKind::Failed,
                sequence: 7
            })
        );
        assert!(Owed::decode("Failed@x", 7).is_err());
        assert!(Owed::decode("Nope@1", 7).is_err());
    }

    #[test]
    fn a_new_record_is_valid_pending_and_due_at_its_pickup_deadline() {
        let now = Utc::now();
        let pickup = now + chrono::Duration::seconds(30);
        let r = StateRecord::new(
            TaskId::new_random(),
            &crate::domain::workflow::examples::ecommerce_order(&Default::default()),
            None,
            now,
            pickup,
        );
        r.check(&Policies::uniform(Default::default()))
            .expect("valid");
        assert_eq!(r.process_state, ProcessState::Pending);
        assert_eq!(r.due_at(), Some(to_millis(pickup)));
        assert_eq!(r.current_step(), Some("reserve-inventory"));
    }

    /// Runs and elements are left out of the state index but while an operator is needed;
    /// a task (a sub-workflow's child too) is always in it.
    #[test]
    fn only_runs_and_elements_needing_an_operator_are_listed_by_state() {
        let w = crate::domain::workflow::examples::ecommerce_order(&crate::Policy::default());
        let now = Utc::now();
        let task = StateRecord::new(TaskId::new_random(), &w, None, now, now);
        let link = |element| ParentLink {
            task_id: TaskId::new_random(),
            step: "each".into(),
            step_index: 0,
            generation: 0,
            reply_queue_url: "https://sqs.example/replies".into(),
            depth: 1,
            undo_attempt: None,
            released: false,
            element,
        };
        let mut child = task.clone();
        child.parent = Some(link(None));
        let mut element = task.clone();
        element.parent = Some(link(Some(ElementOf {
            index: 3,
            task_id: TaskId::new_random(),
            step_index: 0,
            first: None,
        })));
        let mut run = task.clone();
        run.parent = Some(link(None));
        run.run = Some(RunState {
            list: None,
            context: None,
            ledger: crate::domain::run::Run {
                total: 2,
                max_concurrency: 1,
                tolerated: 0,
                undoable: false,
                chunk: 1,
                refused: 0,
                marks: "d".into(),
                stop: None,
            },
        });
        for state in ProcessState::ALL {
            let needs_operator = matches!(
                state,
                ProcessState::Error | ProcessState::CompensationFailed
            );
            for (r, listed) in [
                (&task, true),
                (&child, true),
                (&element, needs_operator),
                (&run, needs_operator),
            ] {
                let mut r = r.clone();
                r.process_state = state;
                assert_eq!(r.listed_by_state(), listed, "{state}: {:?}", r.parent);
            }
        }
    }

    #[test]
    fn shards_cover_the_range_and_are_stable() {
        let mut seen = [0u32; 4];
        for _ in 0..400 {
            let id = TaskId::new_random();
            let s = due_shard(&id, 4);
            assert_eq!(s, due_shard(&id, 4));
            seen[s as usize] += 1;
        }
        assert!(seen.iter().all(|&c| c > 40), "uneven shards: {seen:?}");
    }

    #[test]
    fn process_state_round_trips_through_its_name() {
        for s in ProcessState::ALL {
            assert_eq!(s.as_str().parse::<ProcessState>(), Ok(s));
        }
        for s in StepStatus::ALL {
            assert_eq!(s.as_str().parse::<StepStatus>(), Ok(s));
        }
        for s in NoticeKind::ALL {
            assert_eq!(s.as_str().parse::<NoticeKind>(), Ok(s));
            assert!(s.detail_type().starts_with("Task"));
        }
        assert!("Done".parse::<ProcessState>().is_err());
    }
}
