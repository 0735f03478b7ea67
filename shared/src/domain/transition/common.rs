//! What every transition shares: the accepted [`Transition`] (new record, write condition,
//! effects), the [`Rejection`] of an event that does not apply, an agent's [`StepOutcome`], the
//! [`Actor`] of an operator action, and the small helpers that make the next record version,
//! append its history line and end a task.

use super::super::policy::Policy;
use super::super::state::{
    HistoryEntry, NoticeKind, ProcessState, StateRecord, StepStatus, cap_history,
};
use super::Condition;
use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};

// Here rather than in `policy`: it builds a transition's [`Effect`].
impl Policy {
    /// The effect that reports a progress status: published, or (progress events off) only
    /// sent to the task's reply queue.
    pub fn progress(&self, status: NoticeKind) -> Effect {
        if self.progress_events {
            Effect::Publish(status)
        } else {
            Effect::Progress(status)
        }
    }
}

/// What must happen once the write succeeded, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Send the request for the record's current step (or, while Compensating, its undo) under
    /// its current attempt.
    SendStepRequest,
    /// Send the request for the current step of branch `0` of the running parallel group (see
    /// [`StateRecord::seen_from`]).
    SendBranchStep(usize),
    /// Deliver the outbox (event bus, and the task's reply queue if it has one), then clear it.
    DeliverNotice,
    /// Publish a status that does not go through the outbox (best effort).
    Publish(NoticeKind),
    /// A progress status with progress events off ([`Policy::progress_events`]): only to the
    /// task's reply queue, if it has one (best effort).
    Progress(NoticeKind),
    /// Put a work message for the task on the scheduler's queue, visible after `delay`.
    Enqueue { delay: Duration },
    /// Arm a deadline timer for the wait of step `step` (under `attempt`), due `at`. A timer is
    /// delayed at most SQS's longest delay: a longer wait is carried by the due index, and the
    /// sweep finds it (or an earlier timer re-arms on arrival).
    Timer {
        step: usize,
        attempt: u64,
        at: DateTime<Utc>,
    },
}

/// An accepted transition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    pub record: StateRecord,
    pub condition: Condition,
    pub effects: Vec<Effect>,
}

impl Transition {
    /// The transition from `r` to `record`: `record.since` is the write's time if the state
    /// changed, else `r`'s; `record.due_key` follows [`next_due_key`](super::super::state::next_due_key) (every
    /// transition is made here, so neither can drift).
    pub(super) fn from(
        r: &StateRecord,
        condition: Condition,
        mut record: StateRecord,
        effects: Vec<Effect>,
    ) -> Self {
        record.since = if record.process_state == r.process_state {
            r.since
        } else {
            record.updated_at
        };
        // Once a payload may be kept by reference, always: the purge must find its objects.
        record.payloads = r.payloads || record.payloads || record.holds_large_result();
        record.due_key = super::super::state::next_due_key(r.due_key, record.due_at());
        // One deadline timer per task, a fan-out's requests included: it watches the earliest
        // request out.
        let sends = effects
            .iter()
            .any(|e| matches!(e, Effect::SendStepRequest | Effect::SendBranchStep(_)));
        record.timer_at = if sends {
            super::super::state::next_timer(
                record.timer_at,
                record.timer_deadline(),
                record.updated_at,
            )
        } else {
            record.timer_at
        };
        Self {
            record,
            condition,
            effects,
        }
    }
}

/// Why an event does not apply to a record. Rejections are normal (duplicates, stale messages,
/// races, an operator acting on a task that moved on): callers log and drop, or answer 409.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    #[error("record is {0}, which no scheduler claims")]
    NotClaimable(ProcessState),
    #[error("record is {0}, which is not waiting for a reply")]
    NotRunning(ProcessState),
    #[error("reply for attempt {message} but the record is at attempt {record}")]
    StaleAttempt { record: u64, message: u64 },
    #[error("reply for step {message} but the record is at step {record}")]
    WrongStep { record: usize, message: usize },
    #[error("a {got} reply but the record is {state}")]
    WrongDirection {
        state: ProcessState,
        got: &'static str,
    },
    #[error("record is not due (due at {due:?})")]
    NotDue { due: Option<DateTime<Utc>> },
    #[error("no notice is owed")]
    NoNoticeOwed,
    #[error("no parent holds this task")]
    NotHeld,
    #[error("a task that is {0} cannot be retried (only Error or CompensationFailed)")]
    NotRetryable(ProcessState),
    #[error("a task that is {0} cannot be compensated (only Error or CompensationFailed)")]
    NotCompensable(ProcessState),
    #[error("a task that is {0} cannot be cancelled (only Pending or Processing)")]
    NotCancellable(ProcessState),
    #[error("a task that is {0} cannot be resolved (only Error or CompensationFailed)")]
    NotResolvable(ProcessState),
    #[error("a task that is {0} has no step to skip (only Error)")]
    NotSkippable(ProcessState),
    #[error(
        "step {0} never started (the task failed before it, at its deadline): retry or compensate the task"
    )]
    NotStarted(usize),
    #[error(
        "step {0} may have taken effect (it timed out or faulted): it cannot run on a new input; compensate, skip or resolve the task"
    )]
    MayHaveTakenEffect(String),
    #[error("the task is {0} past its pivot step: it only goes forward (retry it)")]
    PastPivot(ProcessState),
    #[error("the undo waits until {until} for the step it undoes to be surely over")]
    TooEarly { until: DateTime<Utc> },
    #[error("a callback for key generation {message} but the step is at generation {record}")]
    StaleGeneration { record: u32, message: u32 },
    #[error("step {0} is not a callback step")]
    NotACallbackStep(usize),
    #[error("step {0} is a wait: no reply or callback answers it, its time does")]
    AWait(usize),
    #[error("a task that is {0} waits in no wait step")]
    NoWait(ProcessState),
    #[error(
        "step {0} waits for a named event, which only the event ends: deliver it (POST /operator/tasks/{{taskId}}/events/{{name}}, or the caller's POST /tasks/{{taskId}}/events/{{name}})"
    )]
    WaitsForEvent(String),
    #[error("an event under this Event-Id was taken already")]
    DuplicateEvent,
    #[error("a task that is {0} has no step still to come that waits for this event")]
    EventTooLate(ProcessState),
    #[error(
        "the task keeps at most {} events for steps it has not reached",
        super::super::inbox::MAX_KEPT
    )]
    TooManyEvents,
    #[error("the task's deadline {deadline} passed: no step goes out for it")]
    PastDeadline { deadline: DateTime<Utc> },
    #[error("step {0} is not waiting for its callback")]
    NotWaiting(usize),
    #[error("step {0} takes no heartbeats")]
    NoHeartbeat(usize),
    #[error(
        "payload: the event takes {bytes} bytes as a result, and the task's results and the events kept for it take {used} of at most {} bytes",
        super::super::state::MAX_RESULTS_BYTES
    )]
    OverResultsBudget { bytes: usize, used: usize },
    #[error(
        "a task that is {0} has no group stopped at a failure with branches still out (stop-branches stops those)"
    )]
    NotStopping(ProcessState),
    #[error("no step of the task waits for service {0}, which was paused")]
    NotPaused(String),
}

/// What an agent reported for a step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "camelCase")]
pub enum StepOutcome {
    /// The remote service confirmed the step; `result` is what it returned (JSON text), kept
    /// for the step's undo.
    Succeeded {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        result: Option<String>,
    },
    /// sas could not build the step's request (a mapping found nothing): the step had no
    /// effect, and the task fails (an operator alert).
    Failed { error: String },
    /// The service refused the step with a business outcome (`code`): the step had no effect;
    /// the task is compensated and ends Refused, without an alert.
    Refused { code: String, message: String },
    /// A callback step: the service accepted the request and will complete the step through
    /// its callback.
    Accepted,
    /// A callback step's service is still at work: its deadline moves on by the heartbeat
    /// interval (never past the callback timeout).
    Heartbeat,
    /// The service confirmed the step but its answer cannot be used (`result_too_large`): the
    /// step took effect, and the task fails.
    Faulted { error: String },
    /// The step could not be done now: its service's circuit breaker is open until `until`, or
    /// the call would go over one of the service's limits (nothing was called), or, with `misconfigured`, the service answered every try of this
    /// attempt as misconfigured (401, 403, 404...: the error) while its breaker stayed closed,
    /// so maybe only this task's request is wrong. Hand the step back now rather than at its
    /// deadline; an open circuit is no failure of the task, a misconfigured attempt is one.
    Deferred {
        until: DateTime<Utc>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        misconfigured: Option<String>,
        /// The circuit is open because an operator paused the service: who, why, since when.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        paused: Option<String>,
        /// Not the circuit: the call would have gone over one of the service's limits (which,
        /// e.g. `service#bank over its limit of 5 calls in flight`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        limited: Option<String>,
    },
    /// The agent spent the step's whole timeout (start to close) on transient faults, before
    /// the step's deadline (which also allows for the request's wait in the queue): a timed-out
    /// attempt, handed back now rather than at the deadline.
    TimedOut { error: String },
}

impl StepOutcome {
    pub fn succeeded() -> Self {
        Self::Succeeded { result: None }
    }
}

/// An undo of a child or a run by its parent's `attempt`: refused as stale if the record
/// answers a later attempt of that undo already (a delayed copy of an earlier request must not
/// take the answer from the attempt the parent waits on, which would then wait its whole undo
/// timeout). Keeps "a child or run answers its parent's newest undo".
pub(super) fn newest_undo(r: &StateRecord, attempt: u64) -> Result<(), Rejection> {
    match r.parent.as_ref().and_then(|l| l.undo_attempt) {
        Some(answered) if answered > attempt => Err(Rejection::StaleAttempt {
            record: answered,
            message: attempt,
        }),
        _ => Ok(()),
    }
}

/// Drops what only a step's current status justifies: a callback wait once the step is no
/// longer Waiting, an undo wait outside compensation.
pub(super) fn tidy(n: &mut StateRecord) {
    for step in &mut n.steps {
        if step.status != StepStatus::Waiting {
            step.waiting_until = None;
        }
        // Kept while the step may still be in flight: handed back, timed out, cancelled, or
        // done without its request answered (a callback for an attempt handed back, an
        // operator's skip of one that timed out): its undo waits past it.
        if !matches!(
            step.status,
            StepStatus::Pending | StepStatus::TimedOut | StepStatus::Cancelled | StepStatus::Done
        ) {
            step.sent_until = None;
        }
    }
    if n.process_state != ProcessState::Compensating {
        n.undo_after = None;
    }
}

/// The next version of `r`, written at `now`.
pub(super) fn next(r: &StateRecord, now: DateTime<Utc>) -> StateRecord {
    let mut n = r.clone();
    n.version = r.version + 1;
    n.updated_at = now;
    n
}

/// Appends a history line for the move from `from` to `n`'s state.
pub(super) fn log(
    n: &mut StateRecord,
    from: ProcessState,
    step: Option<usize>,
    reason: impl Into<String>,
) {
    log_by(n, from, step, reason, None);
}

/// What the end of the line `n` is seen from means, for its history line: an element of a
/// forEach step or a branch of a parallel group ended (the task goes on), or every step of the
/// task is done.
pub(super) fn end_line(n: &StateRecord) -> String {
    if let Some((step, k)) = n.element() {
        let name = n.steps.get(step).map_or("", |s| s.name.as_str());
        return format!("element {k} of {name} done");
    }
    match n.fanout.as_ref().filter(|_| n.branch().is_some()) {
        Some(f) => format!("branch {} of {} done", f.current.unwrap_or(0), f.group),
        None => "every step done".to_owned(),
    }
}

/// Appends a history line, naming who acted (an operator's or a caller's principal).
pub(super) fn log_by(
    n: &mut StateRecord,
    from: ProcessState,
    step: Option<usize>,
    reason: impl Into<String>,
    by: Option<&str>,
) {
    n.history.push(HistoryEntry {
        at: n.updated_at,
        from,
        to: n.process_state,
        step: step.and_then(|i| n.steps.get(i)).map(|s| s.name.clone()),
        attempt: n.attempt,
        reason: reason.into(),
        by: by.map(str::to_owned),
    });
    // Over the cap, sas's own oldest line goes first: none of its lines pushes out an
    // operator's.
    cap_history(&mut n.history);
}

/// Who asked for an operator action (or a caller's cancel), and why: recorded in the history
/// and announced in the action's notice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Actor {
    /// The principal (an IAM ARN, a JWT subject).
    pub by: String,
    /// The reason given, if any.
    pub reason: Option<String>,
    /// An operator (the operator API) rather than the task's own caller (the task API).
    pub operator: bool,
}

impl Actor {
    /// The history line of `action` (e.g. `operator retry: stuck on a bad address`).
    pub(super) fn line(&self, action: &str) -> String {
        let who = if self.operator { "operator" } else { "caller" };
        match &self.reason {
            Some(r) => format!("{who} {action}: {r}"),
            None => format!("{who} {action}"),
        }
    }
}

/// Leaves the record unlocked and without a deadline in terminal state `to`, owing `notice`.
pub(super) fn finish(n: &mut StateRecord, to: ProcessState, notice: NoticeKind) -> Vec<Effect> {
    n.process_state = to;
    n.locked_by = None;
    n.complete_by = None;
    n.undo_after = None;
    n.owe(notice);
    vec![Effect::DeliverNotice]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::state::{MAX_HISTORY, MAX_OPERATOR_HISTORY};
    use crate::domain::transition::testkit::*;
    use crate::domain::transition::*;

    #[test]
    fn the_due_key_stays_put_through_a_quick_task_and_never_passes_the_due_time() {
        // base(): steps time out after 10 s, a pickup after 30 s.
        let p = policy();
        let t0 = t0();
        let mut r = fresh(t0);
        let key = r.due_key.expect("a new record is due");
        assert_eq!(
            key,
            t0 + Duration::seconds(10),
            "the first step's deadline, not the pickup's"
        );
        assert_eq!(r.due_at(), Some(t0 + Duration::seconds(30)));
        // Claimed and answered within a few seconds: every deadline is a little later than the
        // key, which stays (no index write).
        let mut at = t0 + Duration::seconds(1);
        apply(&mut r, |r| claim(r, "s-1", at, &p, &Linear));
        assert_eq!(r.due_key, Some(key));
        for i in 0..2 {
            at += Duration::seconds(2);
            apply(&mut r, |r| {
                apply_reply(r, 1, i, false, &ok(), at, &p, &Linear)
            });
            assert_eq!(r.due_key, Some(key), "after step {i}");
            assert!(r.due_key <= r.due_at());
        }
        // The last step: the notice's writer delivers it; the sweep's backstop waits for the
        // key, which is within `notice_backstop` of the write: the key stays.
        at += Duration::seconds(2);
        apply(&mut r, |r| {
            apply_reply(r, 1, 2, false, &ok(), at, &p, &Linear)
        });
        assert_eq!(r.due_key, Some(key));
        assert_eq!(r.due_at(), Some(key));
        let t = notice_delivered(&r, at, None).expect("owed");
        assert_eq!(t.record.due_key, None, "a settled record leaves the index");
        // A notice owed after its key passed stays due at the key (due at once: the next
        // sweep); one owed long before its key is due at its write.
        let mut late = r.clone();
        late.updated_at = key + Duration::seconds(100);
        assert_eq!(late.due_at(), Some(key));
        let mut early = r.clone();
        early.updated_at = key - crate::domain::state::notice_backstop() - Duration::seconds(1);
        assert_eq!(early.due_at(), Some(early.updated_at));
        // A record still running owes its notice no later than its own deadline.
        let mut running = r.clone();
        running.process_state = ProcessState::Compensating;
        running.complete_by = Some(key - Duration::seconds(5));
        running.updated_at = key - Duration::seconds(30);
        assert_eq!(running.due_at(), running.complete_by);
        running.complete_by = Some(key + Duration::seconds(5));
        assert_eq!(running.due_at(), Some(key));
        // A slow task: a deadline more than the slack past the key moves it.
        let mut r = fresh(t0);
        let late = t0 + Duration::seconds(100);
        apply(&mut r, |r| claim(r, "s-1", late, &p, &Linear));
        assert_eq!(r.due_key, Some(late + Duration::seconds(10)));
    }

    #[test]
    fn progress_statuses_reach_the_bus_only_with_progress_events_on() {
        let now = t0();
        for (on, want) in [
            (false, Effect::Progress(NoticeKind::StepCompleted)),
            (true, Effect::Publish(NoticeKind::StepCompleted)),
        ] {
            let p = with(|p| p.progress_events = on);
            let mut r = fresh(now);
            apply(&mut r, |r| claim(r, "s-1", now, &p, &Linear));
            let t = apply(&mut r, |r| {
                apply_reply(r, 1, 0, false, &ok(), now, &p, &Linear)
            });
            assert_eq!(
                t.effects,
                [want.clone(), Effect::SendStepRequest],
                "on: {on}"
            );
            // A skipped step is progress too.
            let mut r = fresh(now);
            apply(&mut r, |r| claim(r, "s-1", now, &p, &Linear));
            r.process_state = ProcessState::Error;
            r.locked_by = None;
            let t = apply(&mut r, |r| skip(r, &ops(None), now, &p, None));
            assert_eq!(t.effects[0], want, "on: {on}");
        }
    }

    #[test]
    fn a_stale_write_fails_its_version_check() {
        let p = policy();
        let now = t0();
        let r = fresh(now);
        let first = claim(&r, "s-1", now, &p, &Linear).expect("claims");
        let second = claim(&r, "s-2", now, &p, &Linear).expect("claims from the same read");
        // The first write lands; the second was computed from the same read and must fail.
        assert!(first.condition.holds(Some(&r)));
        assert!(!second.condition.holds(Some(&first.record)));
    }

    #[test]
    fn history_keeps_its_newest_entries() {
        let p = policy();
        let mut now = t0();
        let mut r = fresh(now);
        for _ in 0..MAX_HISTORY {
            now = r.complete_by.expect("pickup deadline");
            apply(&mut r, |r| expire(r, now, &p, 0.5));
        }
        assert_eq!(r.history.len(), MAX_HISTORY);
        assert!(r.history.iter().all(|h| h.reason != "received"));
    }

    /// (Issue 40, finding 3: a forEach's waiting elements re-enqueued one history line each,
    /// which pushed the operators' lines out.) However many lines sas writes after an
    /// operator's, the operator's stays; operators' own lines keep their newest
    /// `MAX_OPERATOR_HISTORY`.
    #[test]
    fn no_line_sas_writes_pushes_an_operators_line_out_of_the_history() {
        let p = manual();
        let mut now = t0();
        let mut r = fresh(now);
        run_to(&mut r, 1, now, &p);
        apply(&mut r, |r| {
            apply_reply(r, 1, 1, false, &refused(), now, &p, &Linear)
        });
        assert_eq!(r.process_state, ProcessState::Error);
        apply(&mut r, |r| retry(r, &ops(Some("stock is back")), now, &p));
        for _ in 0..2 * MAX_HISTORY {
            now = r.complete_by.expect("pickup deadline");
            apply(&mut r, |r| expire(r, now, &p, 0.5));
        }
        assert_eq!(r.history.len(), MAX_HISTORY);
        assert!(
            r.history
                .iter()
                .any(|h| h.by.is_some() && h.reason.contains("stock is back")),
            "the operator's retry is still in the history"
        );
        // Operators' lines: the newest of them, within their own cap.
        let mut h: Vec<HistoryEntry> = (0..MAX_HISTORY + 10)
            .map(|k| HistoryEntry {
                at: now,
                from: ProcessState::Error,
                to: ProcessState::Pending,
                step: None,
                attempt: 0,
                reason: format!("line {k}"),
                by: (k % 2 == 0).then(|| "ops".to_owned()),
            })
            .collect();
        cap_history(&mut h);
        let by: Vec<&str> = h
            .iter()
            .filter(|l| l.by.is_some())
            .map(|l| l.reason.as_str())
            .collect();
        assert_eq!(by.len(), MAX_OPERATOR_HISTORY);
        assert_eq!(by.last(), Some(&"line 108"));
        assert!(h.len() <= MAX_HISTORY);
    }
}
