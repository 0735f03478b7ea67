//! The state record's transitions, as pure functions:
//! (record, event, now, policy) → new record + the conditional write that must succeed for the
//! transition to count + the effects to perform after it did, or a typed rejection.
//!
//! Every condition pins the record's `Version` (so a write computed from a stale read can never
//! overwrite a newer record) and names the semantic guard that keeps the transition's invariant;
//! the stores evaluate exactly these guards (`ConditionExpression` on DynamoDB,
//! [`Condition::holds`] in memory).
//!
//! Events: a scheduler [`claim`]s, an agent's reply is applied ([`apply_reply`]), the supervisor
//! finds a deadline passed ([`expire`]), the outbox is delivered ([`notice_delivered`]), and an
//! operator [`retry`]s, [`compensate`]s or [`cancel`]s.

use super::state::{
    HistoryEntry, MAX_HISTORY, ProcessState, Refusal, StateRecord, Status, StepState, StepStatus,
    to_millis,
};
use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};

pub use super::condition::{Condition, Guard, write_label};
pub use super::policy::{CallbackPolicy, MAX_REQUEUE_DELAY, Policies, Policy};

impl Policy {
    /// The effect that reports a progress status: published, or (progress events off) only
    /// sent to the task's reply queue.
    pub fn progress(&self, status: Status) -> Effect {
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
    /// Deliver the outbox (event bus, and the task's reply queue if it has one), then clear it.
    DeliverNotice,
    /// Publish a status that does not go through the outbox (best effort).
    Publish(Status),
    /// A progress status with progress events off ([`Policy::progress_events`]): only to the
    /// task's reply queue, if it has one (best effort).
    Progress(Status),
    /// Put a work message for the task on the scheduler's queue, visible after `delay`.
    Enqueue { delay: Duration },
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
    /// changed, else `r`'s; `record.due_key` follows [`super::state::next_due_key`] (every
    /// transition is made here, so neither can drift).
    fn from(
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
        record.due_key = super::state::next_due_key(r.due_key, record.due_at());
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
    #[error("step {0} is not waiting for its callback")]
    NotWaiting(usize),
    #[error("step {0} takes no heartbeats")]
    NoHeartbeat(usize),
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
    /// The step could not be done now: its service's circuit breaker is open until `until`
    /// (nothing was called), or, with `misconfigured`, the service answered every try of this
    /// attempt as misconfigured (401, 403, 404...: the error) while its breaker stayed closed,
    /// so maybe only this task's request is wrong. Hand the step back now rather than at its
    /// deadline; an open circuit is no failure of the task, a misconfigured attempt is one.
    Deferred {
        until: DateTime<Utc>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        misconfigured: Option<String>,
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

/// Drops what only a step's current status justifies: a callback wait once the step is no
/// longer Waiting, an undo wait outside compensation.
fn tidy(n: &mut StateRecord) {
    for step in &mut n.steps {
        if step.status != StepStatus::Waiting {
            step.waiting_until = None;
        }
        if !matches!(
            step.status,
            StepStatus::Pending | StepStatus::TimedOut | StepStatus::Cancelled
        ) {
            step.sent_until = None;
        }
    }
    if n.process_state != ProcessState::Compensating {
        n.undo_after = None;
    }
}

/// The next version of `r`, written at `now`.
fn next(r: &StateRecord, now: DateTime<Utc>) -> StateRecord {
    let mut n = r.clone();
    n.version = r.version + 1;
    n.updated_at = now;
    n
}

/// Appends a history line for the move from `from` to `n`'s state.
fn log(n: &mut StateRecord, from: ProcessState, step: Option<usize>, reason: impl Into<String>) {
    log_by(n, from, step, reason, None);
}

/// Appends a history line, naming who acted (an operator's or a caller's principal).
fn log_by(
    n: &mut StateRecord,
    from: ProcessState,
    step: Option<usize>,
    reason: impl Into<String>,
    by: Option<&str>,
) {
    if n.history.len() >= MAX_HISTORY {
        n.history.drain(..=n.history.len() - MAX_HISTORY);
    }
    n.history.push(HistoryEntry {
        at: n.updated_at,
        from,
        to: n.process_state,
        step: step.and_then(|i| n.steps.get(i)).map(|s| s.name.clone()),
        attempt: n.attempt,
        reason: reason.into(),
        by: by.map(str::to_owned),
    });
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
    fn line(&self, action: &str) -> String {
        let who = if self.operator { "operator" } else { "caller" };
        match &self.reason {
            Some(r) => format!("{who} {action}: {r}"),
            None => format!("{who} {action}"),
        }
    }
}

/// Leaves the record unlocked and without a deadline in terminal state `to`, owing `notice`.
fn finish(n: &mut StateRecord, to: ProcessState, notice: Status) -> Vec<Effect> {
    n.process_state = to;
    n.locked_by = None;
    n.complete_by = None;
    n.undo_after = None;
    n.owe(notice);
    vec![Effect::DeliverNotice]
}

/// Starts undoing, last first, every step that may have taken effect: the record becomes
/// Compensating and unlocked, to be claimed after `delay`; with nothing to undo it is
/// Compensated at once.
///
/// `in_flight_until`: the deadline of the current step if it may still be in flight (timed
/// out or cancelled). Its undo then waits [`Policy::undo_wait`] past it, or past the latest
/// deadline a request for the step went out with if that is later (see
/// [`StepState::sent_until`]), and [`claim`] enforces that wait, so a stray work message cannot
/// send the undo early.
fn begin_compensation(
    n: &mut StateRecord,
    now: DateTime<Utc>,
    delay: Duration,
    p: &Policies,
    in_flight_until: Option<DateTime<Utc>>,
) -> Vec<Effect> {
    n.failure_count = 0;
    n.round = 0;
    n.locked_by = None;
    match n.steps.iter().rposition(StepState::needs_undo) {
        Some(i) => {
            let mut delay = delay;
            n.undo_after = None;
            if let Some(t) = in_flight_until.filter(|_| i == n.step_index) {
                let t = n.steps[i].sent_until.map_or(t, |s| s.max(t));
                let after = to_millis(t + p.at(i).undo_wait);
                delay = delay.max(after - now);
                n.undo_after = Some(after);
            }
            n.process_state = ProcessState::Compensating;
            n.step_index = i;
            n.complete_by = Some(now + delay + p.at(i).pickup_timeout);
            vec![Effect::Enqueue { delay }]
        }
        None => compensated(n),
    }
}

/// Every step that needed it is undone: the task ends Refused if a service refused a step, else
/// Compensated.
fn compensated(n: &mut StateRecord) -> Vec<Effect> {
    if n.refusal.is_some() {
        finish(n, ProcessState::Refused, Status::Refused)
    } else {
        finish(n, ProcessState::Compensated, Status::Compensated)
    }
}

/// The task failed for good (`reason`): the operator alert is owed, and the task is either
/// compensated at once or left in Error, as the policy says. Past the pivot it only goes
/// forward: it is left in Error for an operator to retry.
fn fail(
    n: &mut StateRecord,
    now: DateTime<Utc>,
    reason: String,
    p: &Policies,
    in_flight_until: Option<DateTime<Utc>>,
) -> Vec<Effect> {
    n.last_error = Some(reason);
    n.owe(Status::Failed);
    let mut effects = vec![Effect::DeliverNotice];
    if p.at(n.step_index).auto_compensate && !n.past_pivot() {
        effects.extend(
            begin_compensation(n, now, Duration::zero(), p, in_flight_until)
                .into_iter()
                .filter(|e| *e != Effect::DeliverNotice),
        );
    } else {
        n.process_state = ProcessState::Error;
        n.locked_by = None;
        n.complete_by = None;
    }
    effects
}

/// A work message arrived: a scheduler instance claims the record, which is Pending (the
/// current step goes out) or Compensating and unlocked (the current step's undo goes out).
///
/// Condition: same state and unlocked (at the version read) - keeps "one claim per waiting
/// period": of two schedulers holding the same work message only one wins, and a duplicate work
/// message arriving while a step is out is rejected.
pub fn claim(
    r: &StateRecord,
    instance: &str,
    now: DateTime<Utc>,
    p: &Policies,
) -> Result<Transition, Rejection> {
    let undo = match r.process_state {
        ProcessState::Pending => false,
        ProcessState::Compensating if r.locked_by.is_none() => true,
        other => return Err(Rejection::NotClaimable(other)),
    };
    let now = to_millis(now);
    if let Some(until) = r.undo_after.filter(|u| undo && *u > now) {
        return Err(Rejection::TooEarly { until });
    }
    let mut n = next(r, now);
    n.locked_by = Some(instance.to_owned());
    n.attempt = r.attempt + 1;
    n.requeues = 0;
    n.complete_by = Some(p.at(r.step_index).dispatch_deadline(now));
    let step = &mut n.steps[r.step_index];
    if undo {
        step.undo = Some(StepStatus::Running);
    } else {
        n.process_state = ProcessState::Processing;
        step.status = StepStatus::Running;
        step.sent = true;
    }
    log(
        &mut n,
        r.process_state,
        Some(r.step_index),
        if undo { "undo claimed" } else { "claimed" },
    );
    tidy(&mut n);
    Ok(Transition::from(
        r,
        Condition::on(r, vec![Guard::StateIs(r.process_state), Guard::Unlocked]),
        n,
        vec![Effect::SendStepRequest],
    ))
}

/// An agent's reply arrived for (`attempt`, `step_index`); `undo` says whether it answers the
/// step itself or its undo.
///
/// Condition: same state, attempt and step (at the version read) - keeps "a reply counts only
/// for the claim and step it answers": a stale reply from before a recovery, a reply to a step
/// of a cancelled task, or a duplicate of a reply already applied, changes nothing.
pub fn apply_reply(
    r: &StateRecord,
    attempt: u64,
    step_index: usize,
    undo: bool,
    outcome: &StepOutcome,
    now: DateTime<Utc>,
    p: &Policies,
) -> Result<Transition, Rejection> {
    let expected_undo = match r.process_state {
        ProcessState::Processing => false,
        ProcessState::Compensating if r.locked_by.is_some() => true,
        other => return Err(Rejection::NotRunning(other)),
    };
    if undo != expected_undo {
        return Err(Rejection::WrongDirection {
            state: r.process_state,
            got: if undo { "undo" } else { "step" },
        });
    }
    if r.attempt != attempt {
        return Err(Rejection::StaleAttempt {
            record: r.attempt,
            message: attempt,
        });
    }
    if r.step_index != step_index {
        return Err(Rejection::WrongStep {
            record: r.step_index,
            message: step_index,
        });
    }
    let now = to_millis(now);
    let mut n = next(r, now);
    if !matches!(outcome, StepOutcome::Deferred { .. }) {
        // The service answered: the next outage's deferrals start short again.
        n.deferrals = 0;
    }
    let name = r.steps[step_index].name.clone();
    let effects = match (outcome, undo) {
        (
            StepOutcome::Deferred {
                until,
                misconfigured,
            },
            _,
        ) => {
            let what = if undo {
                format!("undo of {name}")
            } else {
                name.clone()
            };
            let wait = (*until - now).max(Duration::zero());
            match misconfigured {
                // Only this task may be affected (the breaker stayed closed): a failed attempt,
                // so the step fails, with the alert, within its threshold instead of waiting
                // for ever with none.
                Some(error) => {
                    let reason = format!("{what}: {error} (attempt {attempt})");
                    hand_back(
                        r,
                        &mut n,
                        now,
                        p,
                        stable_jitter(r),
                        "misconfigured",
                        reason,
                        wait,
                    )
                }
                None => {
                    let reason = format!(
                        "{what}: circuit open until {}",
                        until.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
                    );
                    defer(r, &mut n, now, p, reason, wait)
                }
            }
        }
        (StepOutcome::TimedOut { error }, _) => {
            let what = if undo {
                format!("undo of {name}")
            } else {
                name.clone()
            };
            let reason = format!("{what}: {error} (attempt {attempt})");
            hand_back(
                r,
                &mut n,
                now,
                p,
                stable_jitter(r),
                "timed out",
                reason,
                Duration::zero(),
            )
        }
        (StepOutcome::Accepted, true) | (StepOutcome::Heartbeat, true) => {
            return Err(Rejection::NotACallbackStep(step_index));
        }
        (StepOutcome::Accepted, false) => {
            let Some(cb) = p.at(step_index).callback else {
                return Err(Rejection::NotACallbackStep(step_index));
            };
            if r.steps[step_index].status != StepStatus::Running {
                return Err(Rejection::NotRunning(r.process_state));
            }
            let until = now + cb.timeout;
            let step = &mut n.steps[step_index];
            step.status = StepStatus::Waiting;
            step.waiting_until = Some(until);
            n.complete_by = Some(cb.heartbeat.map_or(until, |h| until.min(now + h)));
            log(
                &mut n,
                r.process_state,
                Some(step_index),
                "accepted; waiting for its callback",
            );
            vec![]
        }
        (StepOutcome::Heartbeat, false) => {
            let step = &r.steps[step_index];
            let (Some(until), StepStatus::Waiting) = (step.waiting_until, step.status) else {
                return Err(Rejection::NotWaiting(step_index));
            };
            let Some(h) = p.at(step_index).callback.and_then(|c| c.heartbeat) else {
                return Err(Rejection::NoHeartbeat(step_index));
            };
            // No history line: heartbeats would push the transitions out of it.
            n.complete_by = Some(until.min(now + h));
            vec![]
        }
        (StepOutcome::Refused { code, message }, true) => apply_undo_reply(
            &mut n,
            step_index,
            Some(&format!("{code}: {message}")),
            now,
            p,
        ),
        (StepOutcome::Refused { code, message }, false) => {
            step_refused(&mut n, step_index, attempt, code, message, now, p)
        }
        (StepOutcome::Succeeded { .. }, true) => apply_undo_reply(&mut n, step_index, None, now, p),
        (StepOutcome::Failed { error }, true) => {
            apply_undo_reply(&mut n, step_index, Some(error), now, p)
        }
        (StepOutcome::Succeeded { result }, false) => {
            step_done(&mut n, step_index, attempt, result, now, p)
        }
        (StepOutcome::Faulted { .. }, true) => {
            // An undo that took effect but whose answer is unusable still undid the step.
            apply_undo_reply(&mut n, step_index, None, now, p)
        }
        (StepOutcome::Faulted { error }, false) | (StepOutcome::Failed { error }, false) => {
            let (status, how) = if matches!(outcome, StepOutcome::Faulted { .. }) {
                (StepStatus::Faulted, "faulted")
            } else {
                (StepStatus::Failed, "refused")
            };
            let reason = format!("{name}: {error}");
            let e = step_failed(&mut n, step_index, attempt, status, &reason, now, p);
            log(
                &mut n,
                r.process_state,
                Some(step_index),
                format!("{how}: {reason}"),
            );
            e
        }
    };
    tidy(&mut n);
    Ok(Transition::from(
        r,
        Condition::on(
            r,
            vec![
                Guard::StateIs(r.process_state),
                Guard::AttemptIs(attempt),
                Guard::StepIndexIs(step_index),
            ],
        ),
        n,
        effects,
    ))
}

/// Step `i` succeeded under `attempt` with `result`. From Processing the next step goes out at
/// once under the same claim; from Pending or Error (a step handed back for another attempt, or
/// failed waiting, and completed by its callback meanwhile) the next step waits for a claim,
/// enqueued now.
fn step_done(
    n: &mut StateRecord,
    i: usize,
    attempt: u64,
    result: &Option<String>,
    now: DateTime<Utc>,
    p: &Policies,
) -> Vec<Effect> {
    let from = n.process_state;
    let step = &mut n.steps[i];
    step.finished_attempt = Some(attempt);
    step.finished_at = Some(now);
    step.status = StepStatus::Done;
    step.result = result.clone();
    n.step_index = i + 1;
    if n.step_index >= n.steps.len() {
        let e = finish(n, ProcessState::Processed, Status::Processed);
        log(n, from, Some(i), "step done; every step done");
        return e;
    }
    let progress = p.at(i).progress(Status::StepCompleted);
    if from != ProcessState::Processing {
        if from == ProcessState::Error {
            // The failure was the wait for this outcome: the next step starts afresh.
            n.failure_count = 0;
            n.round = 0;
            n.last_error = None;
        }
        n.process_state = ProcessState::Pending;
        n.complete_by = Some(now + p.at(n.step_index).pickup_timeout);
        log(n, from, Some(i), "step done by its callback");
        return vec![
            progress,
            Effect::Enqueue {
                delay: Duration::zero(),
            },
        ];
    }
    n.steps[n.step_index].status = StepStatus::Running;
    n.steps[n.step_index].sent = true;
    n.complete_by = Some(p.at(n.step_index).dispatch_deadline(now));
    log(n, from, Some(i), "step done");
    vec![progress, Effect::SendStepRequest]
}

/// The service refused step `i` (under `attempt`) with a business outcome: the step had no
/// effect; the task is compensated (or, past the pivot, fails for a person to decide).
fn step_refused(
    n: &mut StateRecord,
    i: usize,
    attempt: u64,
    code: &str,
    message: &str,
    now: DateTime<Utc>,
    p: &Policies,
) -> Vec<Effect> {
    let from = n.process_state;
    let name = n.steps[i].name.clone();
    let reason = format!("{name}: refused ({code}): {message}");
    let step = &mut n.steps[i];
    step.finished_attempt = Some(attempt);
    step.finished_at = Some(now);
    step.status = StepStatus::Failed;
    n.last_error = Some(reason.clone());
    n.refusal = Some(Refusal {
        step: name,
        code: code.to_owned(),
        message: message.to_owned(),
    });
    let e = if n.past_pivot() {
        // Past the pivot the task cannot go back: a person must decide (alert).
        fail(n, now, reason.clone(), p, None)
    } else {
        begin_compensation(n, now, Duration::zero(), p, None)
    };
    log(n, from, Some(i), format!("refused: {reason}"));
    e
}

/// A callback arrived for step `step_index` under its key's `generation` (see
/// [`super::state::callback_token`]): the outcome of the service's first acceptance of the
/// step's key, which holds for every attempt of the step. It applies while the step is out
/// (Processing, Running or Waiting, whatever the attempt: a step sent again after its
/// acceptance is completed by the first callback, which the service sends once), while it is
/// handed back for another attempt (Pending, sent before), and once the task failed waiting
/// for it (Error, the step TimedOut: the outcome the failure was waiting for came late; an
/// operator's retry would send the key again, and the service would not call back twice). Once
/// the step is being undone, or the task ended for good, it is stale. A token of another generation
/// (an operator retried a refused step under a new key) or another step is stale.
///
/// Condition: as [`apply_reply`] (same state, attempt and step at the version read) - keeps
/// "a callback counts only for the step and key generation it answers, once".
pub fn apply_callback(
    r: &StateRecord,
    step_index: usize,
    generation: u32,
    outcome: &StepOutcome,
    now: DateTime<Utc>,
    p: &Policies,
) -> Result<Transition, Rejection> {
    let Some(step) = r
        .steps
        .get(step_index)
        .filter(|_| r.step_index == step_index)
    else {
        return Err(Rejection::WrongStep {
            record: r.step_index,
            message: step_index,
        });
    };
    if step.generation != generation {
        return Err(Rejection::StaleGeneration {
            record: step.generation,
            message: generation,
        });
    }
    if p.at(step_index).callback.is_none()
        || !matches!(
            outcome,
            StepOutcome::Succeeded { .. } | StepOutcome::Refused { .. } | StepOutcome::Heartbeat
        )
    {
        return Err(Rejection::NotACallbackStep(step_index));
    }
    match (r.process_state, step.status) {
        (ProcessState::Processing, StepStatus::Running | StepStatus::Waiting) => {
            apply_reply(r, r.attempt, step_index, false, outcome, now, p)
        }
        (ProcessState::Pending, StepStatus::Pending)
        | (ProcessState::Error, StepStatus::TimedOut)
            if step.sent =>
        {
            let now = to_millis(now);
            let mut n = next(r, now);
            n.deferrals = 0;
            let effects = match outcome {
                StepOutcome::Succeeded { result } => {
                    step_done(&mut n, step_index, r.attempt, result, now, p)
                }
                StepOutcome::Refused { code, message } => {
                    step_refused(&mut n, step_index, r.attempt, code, message, now, p)
                }
                _ => return Err(Rejection::NotWaiting(step_index)),
            };
            tidy(&mut n);
            Ok(Transition::from(
                r,
                Condition::on(
                    r,
                    vec![
                        Guard::StateIs(r.process_state),
                        Guard::AttemptIs(r.attempt),
                        Guard::StepIndexIs(step_index),
                    ],
                ),
                n,
                effects,
            ))
        }
        (state, _) => Err(Rejection::NotRunning(state)),
    }
}

/// Step `i` ended for good as `status` (refused, or faulted) under `attempt`: the task fails.
#[allow(clippy::too_many_arguments)]
fn step_failed(
    n: &mut StateRecord,
    i: usize,
    attempt: u64,
    status: StepStatus,
    reason: &str,
    now: DateTime<Utc>,
    p: &Policies,
) -> Vec<Effect> {
    let step = &mut n.steps[i];
    step.finished_attempt = Some(attempt);
    step.finished_at = Some(now);
    step.status = status;
    fail(n, now, reason.to_owned(), p, None)
}

/// Applies an undo's answer: `refused` is the service's refusal, `None` a success.
fn apply_undo_reply(
    n: &mut StateRecord,
    i: usize,
    refused: Option<&String>,
    now: DateTime<Utc>,
    p: &Policies,
) -> Vec<Effect> {
    let from = n.process_state;
    match refused {
        None => {
            n.steps[i].undo = Some(StepStatus::Done);
            n.undo_after = None;
            match n.steps[..i].iter().rposition(StepState::needs_undo) {
                Some(j) => {
                    n.step_index = j;
                    n.steps[j].undo = Some(StepStatus::Running);
                    n.complete_by = Some(p.at(j).dispatch_deadline(now));
                    log(n, from, Some(i), "undone");
                    vec![Effect::SendStepRequest]
                }
                None => {
                    let e = compensated(n);
                    log(n, from, Some(i), "undone; every step undone");
                    e
                }
            }
        }
        Some(error) => {
            n.steps[i].undo = Some(StepStatus::Failed);
            let reason = format!("undo of {}: {error}", n.steps[i].name);
            n.last_error = Some(reason.clone());
            let e = finish(
                n,
                ProcessState::CompensationFailed,
                Status::CompensationFailed,
            );
            log(n, from, Some(i), format!("undo refused: {reason}"));
            e
        }
    }
}

/// The supervisor found the record due; `jitter` in [0, 1) spreads the retry delay.
///
/// - A step (or undo) out past `CompleteBy`: its agent died or overran. `FailureCount` + 1;
///   below the threshold the record is handed back unlocked (a new pickup deadline after the
///   retry delay) and re-enqueued with that delay. At the threshold: with extended-wait rounds
///   left, the count restarts after a cool-down; else a step fails the task ([`fail`]) and an
///   undo ends in CompensationFailed.
/// - Unlocked past its pickup deadline: the work message was lost (e.g. the submission died
///   after its transaction). It is re-enqueued with a new pickup deadline; that is not a
///   failure of the task, so `FailureCount` stays.
///
/// (A record with a notice owed is also due; the supervisor delivers the notice and then applies
/// [`notice_delivered`].)
///
/// Condition: same state, attempt and deadline as read, and the deadline has passed (at the
/// version read) - keeps "each expiry is recovered once": of several supervisors racing on the
/// same record only one write succeeds, and a record a scheduler moved on meanwhile is left
/// alone.
pub fn expire(
    r: &StateRecord,
    now: DateTime<Utc>,
    p: &Policies,
    jitter: f64,
) -> Result<Transition, Rejection> {
    let now = to_millis(now);
    let due = match r.complete_by {
        Some(d) if d <= now && !r.process_state.is_terminal() => d,
        _ => return Err(Rejection::NotDue { due: r.due_at() }),
    };
    let guards = vec![
        Guard::StateIs(r.process_state),
        Guard::AttemptIs(r.attempt),
        Guard::CompleteByIs(due),
        Guard::CompleteByAtOrBefore(now),
    ];
    let mut n = next(r, now);
    let i = r.step_index;
    let effects = if r.locked_by.is_none() {
        // Growing delays: a backlog in the work queue must not be fed by the re-enqueues of
        // the tasks waiting in it (see `Policy::requeue_delay`).
        n.requeues = r.requeues.saturating_add(1);
        let delay = p.at(i).requeue_delay(n.requeues, jitter);
        n.complete_by = Some(now + delay + p.at(i).pickup_timeout);
        log(
            &mut n,
            r.process_state,
            Some(i),
            "pickup deadline passed; re-enqueued",
        );
        vec![Effect::Enqueue { delay }]
    } else {
        let what = if r.process_state == ProcessState::Compensating {
            "undo of "
        } else {
            ""
        };
        let awaited = if r.steps[i].status == StepStatus::Waiting {
            "callback"
        } else {
            "reply"
        };
        let reason = format!(
            "{what}{}: no {awaited} by {} (attempt {})",
            r.steps[i].name,
            due.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            r.attempt
        );
        hand_back(
            r,
            &mut n,
            now,
            p,
            jitter,
            "timed out",
            reason,
            Duration::zero(),
        )
    };
    tidy(&mut n);
    Ok(Transition::from(r, Condition::on(r, guards), n, effects))
}

/// A step (or undo) that was out came to nothing (`how`: it timed out, or its service's circuit
/// is open): `FailureCount` + 1; below the threshold the record is handed back unlocked and
/// re-enqueued after the retry delay (at least `at_least`); at the threshold, with
/// extended-wait rounds left, the count restarts after a cool-down; else a step fails the task
/// ([`fail`]) and an undo ends in CompensationFailed.
#[allow(clippy::too_many_arguments)]
fn hand_back(
    r: &StateRecord,
    n: &mut StateRecord,
    now: DateTime<Utc>,
    p: &Policies,
    jitter: f64,
    how: &str,
    reason: String,
    at_least: Duration,
) -> Vec<Effect> {
    let i = r.step_index;
    let pi = p.at(i);
    let undo = r.process_state == ProcessState::Compensating;
    n.failure_count = r.failure_count + 1;
    n.locked_by = None;
    n.last_error = Some(reason.clone());
    if !undo {
        keep_sent_until(r, n);
    }
    let exhausted = n.failure_count >= pi.failure_threshold;
    let cool_down = exhausted && n.round < pi.max_rounds;
    if !exhausted || cool_down {
        let delay = if cool_down {
            n.round += 1;
            n.failure_count = 0;
            pi.cooldown
        } else {
            pi.retry_delay(n.failure_count, jitter)
        }
        .max(at_least);
        if undo {
            n.steps[i].undo = None;
        } else {
            n.process_state = ProcessState::Pending;
            n.steps[i].status = StepStatus::Pending;
        }
        n.complete_by = Some(now + delay + pi.pickup_timeout);
        let why = if cool_down {
            format!("{how}; cooling down (round {}): {reason}", n.round)
        } else {
            format!("{how}; retry {}: {reason}", n.failure_count)
        };
        log(n, r.process_state, Some(i), why);
        vec![Effect::Enqueue { delay }]
    } else if undo {
        n.steps[i].undo = Some(StepStatus::TimedOut);
        let e = finish(
            n,
            ProcessState::CompensationFailed,
            Status::CompensationFailed,
        );
        log(
            n,
            r.process_state,
            Some(i),
            format!("{how} at the threshold: {reason}"),
        );
        e
    } else {
        let step = &mut n.steps[i];
        step.status = StepStatus::TimedOut;
        step.finished_at = Some(now);
        step.finished_attempt = Some(r.attempt);
        // The step may still be in flight: its undo waits past the deadline that just passed.
        let e = fail(n, now, reason.clone(), p, Some(now));
        log(
            n,
            r.process_state,
            Some(i),
            format!("{how} at the threshold: {reason}"),
        );
        e
    }
}

/// The current step of `r` is handed back before or at its deadline: `n` keeps that deadline
/// (or a later one kept before) as the step's [`StepState::sent_until`].
fn keep_sent_until(r: &StateRecord, n: &mut StateRecord) {
    let i = r.step_index;
    n.steps[i].sent_until = match (r.steps[i].sent_until, r.complete_by) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    };
}

/// The step (or undo) that was out could not be tried now (its service's circuit is open):
/// handed back unlocked and re-enqueued after `wait` at least, and at least the step's retry
/// delay for the deferrals in a row so far (exponential, capped at `maxDelay`, with jitter), so
/// a long outage costs a few wake-ups per task. Not a failure of the task: `FailureCount`
/// stays, so an outage or a misconfigured service makes tasks wait, never compensates them (the
/// breaker's opening alerts the operator). (A misconfigured answer to one task while the
/// breaker stays closed is a failed attempt instead: [`hand_back`].)
fn defer(
    r: &StateRecord,
    n: &mut StateRecord,
    now: DateTime<Utc>,
    p: &Policies,
    reason: String,
    wait: Duration,
) -> Vec<Effect> {
    let i = r.step_index;
    n.locked_by = None;
    n.last_error = Some(reason.clone());
    if r.process_state == ProcessState::Compensating {
        n.steps[i].undo = None;
    } else {
        keep_sent_until(r, n);
        n.process_state = ProcessState::Pending;
        n.steps[i].status = StepStatus::Pending;
    }
    n.deferrals = r.deferrals.saturating_add(1);
    let delay = wait.max(p.at(i).retry_delay(n.deferrals, stable_jitter(r)))
        + Duration::milliseconds((stable_jitter(r) * 1000.0) as i64);
    n.complete_by = Some(now + delay + p.at(i).pickup_timeout);
    log(n, r.process_state, Some(i), format!("deferred: {reason}"));
    vec![Effect::Enqueue { delay }]
}

/// A stable number in [0, 1) from a task and attempt: the jitter of transitions that have no
/// randomness passed in (spreads the retries of tasks deferred by the same open circuit).
fn stable_jitter(r: &StateRecord) -> f64 {
    let b = r.task_id.as_uuid().into_bytes();
    let x = u32::from_be_bytes([b[0], b[1], b[2], b[3]])
        .wrapping_add((r.attempt as u32).wrapping_mul(2_654_435_761));
    f64::from(x) / (f64::from(u32::MAX) + 1.0)
}

/// The outbox was delivered: clear it, which also takes a terminal record out of the due index.
///
/// Condition: a notice is still owed (at the version read) - keeps "the outbox is cleared only
/// after a delivery of exactly what it held".
pub fn notice_delivered(r: &StateRecord, now: DateTime<Utc>) -> Result<Transition, Rejection> {
    if !r.notice_pending() {
        return Err(Rejection::NoNoticeOwed);
    }
    let mut n = next(r, to_millis(now));
    n.outbox.clear();
    tidy(&mut n);
    Ok(Transition::from(
        r,
        Condition::on(r, vec![Guard::NoticePending]),
        n,
        vec![],
    ))
}

/// An operator resubmits the failed step: from Error the step runs again (Pending), from
/// CompensationFailed its undo does (Compensating). `FailureCount` and the rounds restart. A
/// step or undo the service refused gets a new idempotency key (a refused key stays refused); one
/// that timed out keeps its key, since it may have taken effect.
///
/// Condition: same state (at the version read) - keeps "one retry per failure": of two operators
/// retrying at once, one write wins and the other is told the task moved on.
pub fn retry(
    r: &StateRecord,
    actor: &Actor,
    now: DateTime<Utc>,
    p: &Policies,
) -> Result<Transition, Rejection> {
    let now = to_millis(now);
    let mut n = next(r, now);
    let i = r.step_index;
    match r.process_state {
        ProcessState::Error if i < r.steps.len() => {
            let step = &mut n.steps[i];
            if step.status == StepStatus::Failed {
                step.generation += 1;
                step.sent = false;
            }
            step.status = StepStatus::Pending;
            step.finished_at = None;
            step.finished_attempt = None;
            n.process_state = ProcessState::Pending;
        }
        ProcessState::CompensationFailed => {
            let step = &mut n.steps[i];
            if step.undo == Some(StepStatus::Failed) {
                step.undo_generation += 1;
            }
            step.undo = None;
            n.process_state = ProcessState::Compensating;
        }
        other => return Err(Rejection::NotRetryable(other)),
    }
    n.failure_count = 0;
    n.round = 0;
    n.last_error = None;
    if r.process_state == ProcessState::Error {
        n.refusal = None;
    }
    n.complete_by = Some(now + p.at(i).pickup_timeout);
    log_by(
        &mut n,
        r.process_state,
        Some(i),
        actor.line("retry"),
        Some(&actor.by),
    );
    tidy(&mut n);
    Ok(Transition::from(
        r,
        Condition::on(r, vec![Guard::StateIs(r.process_state)]),
        n,
        vec![
            Effect::Publish(Status::Retrying),
            Effect::Enqueue {
                delay: Duration::zero(),
            },
        ],
    ))
}

/// An operator asks for compensation: an Error task starts undoing its steps; a
/// CompensationFailed one retries its failed undo (as [`retry`] does).
///
/// Condition: same state (at the version read) - keeps "one compensation per failure".
pub fn compensate(
    r: &StateRecord,
    actor: &Actor,
    now: DateTime<Utc>,
    p: &Policies,
) -> Result<Transition, Rejection> {
    match r.process_state {
        ProcessState::CompensationFailed => retry(r, actor, now, p),
        ProcessState::Error if r.past_pivot() => Err(Rejection::PastPivot(r.process_state)),
        ProcessState::Error => {
            let now = to_millis(now);
            let mut n = next(r, now);
            // A step that timed out may still be in flight: its undo waits past the deadline.
            let in_flight = r.steps.get(r.step_index).and_then(|s| {
                matches!(s.status, StepStatus::TimedOut | StepStatus::Cancelled)
                    .then(|| s.finished_at.unwrap_or(now))
            });
            let effects = begin_compensation(&mut n, now, Duration::zero(), p, in_flight);
            log_by(
                &mut n,
                r.process_state,
                Some(r.step_index),
                actor.line("compensate"),
                Some(&actor.by),
            );
            tidy(&mut n);
            Ok(Transition::from(
                r,
                Condition::on(r, vec![Guard::StateIs(r.process_state)]),
                n,
                effects,
            ))
        }
        other => Err(Rejection::NotCompensable(other)),
    }
}

/// An operator cancels a Pending or Processing task: any reply to the step that is out is
/// dropped from now on, and every step that may have taken effect (including the one that was
/// out) is undone. The undo of a step that was out waits for that step's deadline, when its
/// agent has stopped calling the service.
///
/// Condition: same state, attempt and step (at the version read) - keeps "a cancelled task
/// takes no further step": a reply applied first makes the cancel retry on the new record.
pub fn cancel(
    r: &StateRecord,
    actor: &Actor,
    now: DateTime<Utc>,
    p: &Policies,
) -> Result<Transition, Rejection> {
    if r.past_pivot() {
        return Err(Rejection::PastPivot(r.process_state));
    }
    let now = to_millis(now);
    let mut n = next(r, now);
    let i = r.step_index;
    // The step that is out (or was out before a hand-back) may still be in flight until its
    // deadline: its undo waits past it.
    let in_flight = match r.process_state {
        ProcessState::Pending if r.steps[i].sent => Some(now),
        ProcessState::Pending => None,
        ProcessState::Processing => {
            n.steps[i].status = StepStatus::Cancelled;
            Some(r.complete_by.map_or(now, |d| d.max(now)))
        }
        other => return Err(Rejection::NotCancellable(other)),
    };
    if n.steps[i].status == StepStatus::Pending && n.steps[i].sent {
        // A step handed back after a timeout may have taken effect: mark it as such.
        n.steps[i].status = StepStatus::Cancelled;
    }
    n.last_error = Some(match &actor.reason {
        Some(reason) => format!("cancelled: {reason}"),
        None if actor.operator => "cancelled by the operator".to_owned(),
        None => "cancelled by the caller".to_owned(),
    });
    let mut effects = vec![Effect::Publish(Status::Cancelled)];
    effects.extend(begin_compensation(
        &mut n,
        now,
        Duration::zero(),
        p,
        in_flight,
    ));
    log_by(
        &mut n,
        r.process_state,
        Some(i),
        actor.line("cancel"),
        Some(&actor.by),
    );
    tidy(&mut n);
    Ok(Transition::from(
        r,
        Condition::on(
            r,
            vec![
                Guard::StateIs(r.process_state),
                Guard::AttemptIs(r.attempt),
                Guard::StepIndexIs(i),
            ],
        ),
        n,
        effects,
    ))
}

/// An operator closes a failed task by hand (it was reconciled outside sas): an `Error` or
/// `CompensationFailed` task becomes `Resolved`, unlocked and without deadlines, owing a
/// `Resolved` notice. Nothing is sent to any service; whatever the steps did stays as the
/// operator left it. The note is required (the API refuses a resolve without one).
///
/// Condition: same state (at the version read) - keeps "a resolved task was failed when it was
/// resolved": a retry or compensation that won the race makes the resolve fail as a conflict.
pub fn resolve(
    r: &StateRecord,
    actor: &Actor,
    now: DateTime<Utc>,
) -> Result<Transition, Rejection> {
    if !matches!(
        r.process_state,
        ProcessState::Error | ProcessState::CompensationFailed
    ) {
        return Err(Rejection::NotResolvable(r.process_state));
    }
    let now = to_millis(now);
    let mut n = next(r, now);
    n.round = 0;
    let effects = finish(&mut n, ProcessState::Resolved, Status::Resolved);
    log_by(
        &mut n,
        r.process_state,
        Some(r.step_index),
        actor.line("resolve"),
        Some(&actor.by),
    );
    tidy(&mut n);
    Ok(Transition::from(
        r,
        Condition::on(r, vec![Guard::StateIs(r.process_state)]),
        n,
        effects,
    ))
}

/// An operator did the failed step by hand and supplies its result: the Error task's current
/// step becomes Done with that result (what later steps' inputs and its own undo read), and the
/// task goes on from the next step (Pending), or is Processed if it was the last. Nothing is
/// sent for the skipped step.
///
/// Condition: same state (at the version read) - keeps "a step is skipped only while the task
/// waits for a person": a retry or compensation that won the race makes the skip a conflict.
pub fn skip(
    r: &StateRecord,
    actor: &Actor,
    now: DateTime<Utc>,
    p: &Policies,
    result: Option<String>,
) -> Result<Transition, Rejection> {
    let i = r.step_index;
    if r.process_state != ProcessState::Error || i >= r.steps.len() {
        return Err(Rejection::NotSkippable(r.process_state));
    }
    let now = to_millis(now);
    let mut n = next(r, now);
    let step = &mut n.steps[i];
    step.status = StepStatus::Done;
    step.result = result;
    step.finished_at = Some(now);
    step.finished_attempt = Some(r.attempt);
    n.failure_count = 0;
    n.round = 0;
    n.last_error = None;
    n.refusal = None;
    n.step_index = i + 1;
    let effects = if n.step_index < n.steps.len() {
        n.process_state = ProcessState::Pending;
        n.complete_by = Some(now + p.at(n.step_index).pickup_timeout);
        vec![
            p.at(i).progress(Status::StepCompleted),
            Effect::Enqueue {
                delay: Duration::zero(),
            },
        ]
    } else {
        finish(&mut n, ProcessState::Processed, Status::Processed)
    };
    log_by(
        &mut n,
        r.process_state,
        Some(i),
        actor.line(&format!("skip of {}", r.steps[i].name)),
        Some(&actor.by),
    );
    tidy(&mut n);
    Ok(Transition::from(
        r,
        Condition::on(r, vec![Guard::StateIs(ProcessState::Error)]),
        n,
        effects,
    ))
}

/// An operator compensates an Error task from step `from` down: the steps after `from` that may
/// have taken effect are recorded as settled by hand (their undo `Done`, nothing is sent for
/// them), and compensation undoes `from` and the steps before it, last first. `from` at or
/// past the current step is [`compensate`].
///
/// Condition: same state (at the version read), as [`compensate`].
pub fn compensate_from(
    r: &StateRecord,
    actor: &Actor,
    now: DateTime<Utc>,
    p: &Policies,
    from: usize,
) -> Result<Transition, Rejection> {
    if r.process_state != ProcessState::Error || from >= r.steps.len() {
        return compensate(r, actor, now, p);
    }
    if r.past_pivot() {
        return Err(Rejection::PastPivot(r.process_state));
    }
    if from >= r.step_index {
        return compensate(r, actor, now, p);
    }
    let mut settled = r.clone();
    for step in &mut settled.steps[from + 1..] {
        if step.needs_undo() {
            step.undo = Some(StepStatus::Done);
        }
    }
    let mut t = compensate(&settled, actor, now, p)?;
    // The condition is on the record as read, not on the settled copy.
    t.condition = Condition::on(r, vec![Guard::StateIs(r.process_state)]);
    if let Some(h) = t.record.history.last_mut() {
        h.reason = actor.line(&format!(
            "compensate from {} ({} settled by hand)",
            r.steps[from].name,
            r.steps[from + 1..]
                .iter()
                .filter(|s| s.needs_undo())
                .map(|s| s.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    Ok(t)
}

/// An operator retries an Error task's failed step with a new task input (the caller writes
/// the input with the record, in one transaction). Only a step that surely did not take effect
/// (refused, or never sent) may run on a new input: its key's generation moves on, since a
/// service must not see one key with two bodies. The steps before it ran on the task's input
/// of `input_revision` (or an earlier one they name already): they name it, so their views and
/// their undos keep reading what they ran with.
///
/// Condition: same state (at the version read), as [`retry`].
pub fn retry_with_input(
    r: &StateRecord,
    actor: &Actor,
    now: DateTime<Utc>,
    p: &Policies,
    input_revision: u32,
) -> Result<Transition, Rejection> {
    let i = r.step_index;
    let Some(step) = r
        .steps
        .get(i)
        .filter(|_| r.process_state == ProcessState::Error)
    else {
        return Err(Rejection::NotRetryable(r.process_state));
    };
    if step.status != StepStatus::Failed && step.sent {
        return Err(Rejection::MayHaveTakenEffect(step.name.clone()));
    }
    // A refused step gets its new key from `retry`; one never sent never used its key.
    let mut t = retry(r, actor, now, p)?;
    for s in t.record.steps[..i].iter_mut().filter(|s| s.sent) {
        s.input_revision.get_or_insert(input_revision);
    }
    t.record.steps[i].input_revision = None;
    if let Some(h) = t.record.history.last_mut() {
        h.reason = actor.line("retry with a new input");
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::state::{CallbackFence, callback_token, check_callback_token};
    use crate::domain::workflow::examples;
    use crate::domain::{TaskId, Workflow};
    use proptest::prelude::*;

    fn ops(reason: Option<&str>) -> Actor {
        Actor {
            by: "arn:aws:iam::123456789012:user/operator".into(),
            reason: reason.map(str::to_owned),
            operator: true,
        }
    }

    fn base() -> Policy {
        Policy {
            step_timeout: Duration::seconds(10),
            start_within: Duration::zero(),
            pickup_timeout: Duration::seconds(30),
            failure_threshold: 3,
            retry_base_delay: Duration::seconds(1),
            backoff_rate: 2.0,
            retry_max_delay: Duration::seconds(8),
            auto_compensate: true,
            cooldown: Duration::seconds(60),
            max_rounds: 0,
            callback: None,
            undo_wait: Duration::seconds(5),
            progress_events: false,
        }
    }

    fn with(f: impl FnOnce(&mut Policy)) -> Policies {
        let mut p = base();
        f(&mut p);
        Policies::uniform(p)
    }

    fn policy() -> Policies {
        with(|_| {})
    }

    fn manual() -> Policies {
        with(|p| p.auto_compensate = false)
    }

    fn t0() -> DateTime<Utc> {
        to_millis(Utc::now())
    }

    fn record(w: &Workflow, now: DateTime<Utc>) -> StateRecord {
        StateRecord::new(
            TaskId::new_random(),
            w,
            None,
            now,
            now + base().pickup_timeout,
        )
    }

    /// A Pending record of the three-step e-commerce order, each step with an undo.
    fn fresh(now: DateTime<Utc>) -> StateRecord {
        record(&examples::ecommerce_order(&base()), now)
    }

    fn ok() -> StepOutcome {
        StepOutcome::succeeded()
    }

    fn refused() -> StepOutcome {
        StepOutcome::Failed {
            error: "card declined".into(),
        }
    }

    fn apply(
        r: &mut StateRecord,
        f: impl FnOnce(&StateRecord) -> Result<Transition, Rejection>,
    ) -> Transition {
        let t = f(r).expect("transition applies");
        assert!(t.condition.holds(Some(r)), "condition holds on its source");
        t.record
            .check(&policy())
            .expect("valid after the transition");
        *r = t.record.clone();
        t
    }

    /// Claims and answers steps until the record's current step is `upto`.
    fn run_to(r: &mut StateRecord, upto: usize, now: DateTime<Utc>, p: &Policies) {
        apply(r, |r| claim(r, "s", now, p));
        for i in 0..upto {
            let a = r.attempt;
            apply(r, |r| apply_reply(r, a, i, false, &ok(), now, p));
        }
    }

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
        apply(&mut r, |r| claim(r, "s-1", at, &p));
        assert_eq!(r.due_key, Some(key));
        for i in 0..2 {
            at += Duration::seconds(2);
            apply(&mut r, |r| apply_reply(r, 1, i, false, &ok(), at, &p));
            assert_eq!(r.due_key, Some(key), "after step {i}");
            assert!(r.due_key <= r.due_at());
        }
        // The last step: the notice's writer delivers it; the sweep's backstop waits for the
        // key, which is within `notice_backstop` of the write: the key stays.
        at += Duration::seconds(2);
        apply(&mut r, |r| apply_reply(r, 1, 2, false, &ok(), at, &p));
        assert_eq!(r.due_key, Some(key));
        assert_eq!(r.due_at(), Some(key));
        let t = notice_delivered(&r, at).expect("owed");
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
        apply(&mut r, |r| claim(r, "s-1", late, &p));
        assert_eq!(r.due_key, Some(late + Duration::seconds(10)));
    }

    #[test]
    fn progress_statuses_reach_the_bus_only_with_progress_events_on() {
        let now = t0();
        for (on, want) in [
            (false, Effect::Progress(Status::StepCompleted)),
            (true, Effect::Publish(Status::StepCompleted)),
        ] {
            let p = with(|p| p.progress_events = on);
            let mut r = fresh(now);
            apply(&mut r, |r| claim(r, "s-1", now, &p));
            let t = apply(&mut r, |r| apply_reply(r, 1, 0, false, &ok(), now, &p));
            assert_eq!(
                t.effects,
                [want.clone(), Effect::SendStepRequest],
                "on: {on}"
            );
            // A skipped step is progress too.
            let mut r = fresh(now);
            apply(&mut r, |r| claim(r, "s-1", now, &p));
            r.process_state = ProcessState::Error;
            r.locked_by = None;
            let t = apply(&mut r, |r| skip(r, &ops(None), now, &p, None));
            assert_eq!(t.effects[0], want, "on: {on}");
        }
    }

    #[test]
    fn the_happy_path_claims_runs_every_step_and_owes_a_notice() {
        let p = policy();
        let now = t0();
        let mut r = fresh(now);
        let t = apply(&mut r, |r| claim(r, "s-1", now, &p));
        assert_eq!(t.effects, [Effect::SendStepRequest]);
        assert_eq!(r.attempt, 1);
        assert_eq!(r.locked_by.as_deref(), Some("s-1"));
        for i in 0..3 {
            let t = apply(&mut r, |r| {
                apply_reply(
                    r,
                    1,
                    i,
                    false,
                    &StepOutcome::Succeeded {
                        result: Some(format!("{{\"id\":{i}}}")),
                    },
                    now,
                    &p,
                )
            });
            if i < 2 {
                assert_eq!(
                    t.effects,
                    [
                        Effect::Progress(Status::StepCompleted),
                        Effect::SendStepRequest
                    ]
                );
            } else {
                assert_eq!(t.effects, [Effect::DeliverNotice]);
            }
        }
        assert_eq!(r.process_state, ProcessState::Processed);
        assert_eq!(r.locked_by, None);
        assert_eq!(r.owed(), [Status::Processed]);
        assert_eq!(r.steps[1].result.as_deref(), Some("{\"id\":1}"));
        // The notice's backstop waits for the key the record already has (the pickup
        // deadline): no index write.
        assert_eq!(r.due_at(), r.due_key);
        assert!(r.due_at() > Some(r.updated_at));
        apply(&mut r, |r| notice_delivered(r, now));
        assert_eq!(r.due_at(), None);
        assert_eq!(r.version, 6);
        let reasons: Vec<_> = r.history.iter().map(|h| h.reason.as_str()).collect();
        assert_eq!(
            reasons,
            [
                "received",
                "claimed",
                "step done",
                "step done",
                "step done; every step done"
            ]
        );
    }

    #[test]
    fn a_duplicate_claim_and_a_duplicate_reply_are_rejected() {
        let p = policy();
        let now = t0();
        let mut r = fresh(now);
        apply(&mut r, |r| claim(r, "s-1", now, &p));
        assert_eq!(
            claim(&r, "s-2", now, &p).err(),
            Some(Rejection::NotClaimable(ProcessState::Processing))
        );
        apply(&mut r, |r| apply_reply(r, 1, 0, false, &ok(), now, &p));
        assert!(matches!(
            apply_reply(&r, 1, 0, false, &ok(), now, &p),
            Err(Rejection::WrongStep {
                record: 1,
                message: 0
            })
        ));
        assert!(matches!(
            apply_reply(&r, 1, 1, true, &ok(), now, &p),
            Err(Rejection::WrongDirection { .. })
        ));
    }

    #[test]
    fn a_stale_write_fails_its_version_check() {
        let p = policy();
        let now = t0();
        let r = fresh(now);
        let first = claim(&r, "s-1", now, &p).expect("claims");
        let second = claim(&r, "s-2", now, &p).expect("claims from the same read");
        // The first write lands; the second was computed from the same read and must fail.
        assert!(first.condition.holds(Some(&r)));
        assert!(!second.condition.holds(Some(&first.record)));
    }

    #[test]
    fn expiry_hands_back_with_growing_delay_then_fails_at_the_threshold() {
        let p = manual();
        let mut now = t0();
        let mut r = fresh(now);
        let mut delays = vec![];
        for round in 1..=3u32 {
            apply(&mut r, |r| claim(r, "s", now, &p));
            assert!(matches!(
                expire(&r, now, &p, 0.0),
                Err(Rejection::NotDue { .. })
            ));
            now += p.at(0).step_timeout;
            let t = apply(&mut r, |r| expire(r, now, &p, 0.0));
            assert_eq!(r.failure_count, round);
            match t.effects.as_slice() {
                [Effect::Enqueue { delay }] => delays.push(*delay),
                [Effect::DeliverNotice] => assert_eq!(round, 3),
                other => panic!("unexpected effects {other:?}"),
            }
        }
        // Equal jitter at 0: half the exponential delay.
        assert_eq!(delays, [Duration::milliseconds(500), Duration::seconds(1)]);
        assert_eq!(r.process_state, ProcessState::Error);
        assert_eq!(r.steps[0].status, StepStatus::TimedOut);
        assert!(
            r.last_error
                .as_deref()
                .is_some_and(|e| e.starts_with("reserve-inventory"))
        );
        assert_eq!(r.owed(), [Status::Failed]);
    }

    #[test]
    fn an_extended_wait_cools_down_and_restarts_the_count_before_failing() {
        let p = with(|p| {
            p.max_rounds = 1;
            p.auto_compensate = false;
        });
        let mut now = t0();
        let mut r = fresh(now);
        let mut delays = vec![];
        while !r.process_state.is_terminal() {
            apply(&mut r, |r| claim(r, "s", now, &p));
            now += p.at(0).step_timeout;
            let t = apply(&mut r, |r| expire(r, now, &p, 0.999));
            if let [Effect::Enqueue { delay }] = t.effects.as_slice() {
                delays.push(delay.num_milliseconds());
                now += *delay;
            }
        }
        assert_eq!(delays, [999, 1999, 60_000, 999, 1999]);
        assert_eq!((r.round, r.failure_count), (1, 3));
        assert_eq!(r.process_state, ProcessState::Error);
    }

    #[test]
    fn a_reply_from_before_a_recovery_is_stale() {
        let p = policy();
        let mut now = t0();
        let mut r = fresh(now);
        apply(&mut r, |r| claim(r, "s", now, &p));
        now += p.at(0).step_timeout;
        apply(&mut r, |r| expire(r, now, &p, 0.5));
        apply(&mut r, |r| claim(r, "s", now, &p));
        assert_eq!(
            apply_reply(&r, 1, 0, false, &ok(), now, &p).err(),
            Some(Rejection::StaleAttempt {
                record: 2,
                message: 1
            })
        );
    }

    #[test]
    fn a_lost_work_message_is_re_enqueued_without_counting_a_failure() {
        let p = policy();
        let mut r = fresh(t0());
        let now = r.complete_by.expect("pickup deadline");
        let t = apply(&mut r, |r| expire(r, now, &p, 0.5));
        assert_eq!(
            t.effects,
            [Effect::Enqueue {
                delay: Duration::zero()
            }]
        );
        assert_eq!(r.failure_count, 0);
        assert_eq!(r.process_state, ProcessState::Pending);
        assert_eq!(r.complete_by, Some(now + p.at(0).pickup_timeout));
        assert_eq!(r.requeues, 1);
    }

    #[test]
    fn a_task_stuck_behind_a_backlog_is_re_enqueued_with_growing_delays_until_claimed() {
        // The work queue holds a backlog of an hour: every pickup deadline passes. The
        // re-enqueues must be a few per task (log of the backlog), not one per pickup period.
        let p = policy();
        let pickup = p.at(0).pickup_timeout;
        let mut r = fresh(t0());
        let start = r.complete_by.expect("pickup deadline") - pickup;
        let mut delays = Vec::new();
        while let Some(due) = r.complete_by.filter(|d| *d < start + Duration::hours(1)) {
            let t = apply(&mut r, |r| expire(r, due, &p, 1.0));
            let [Effect::Enqueue { delay }] = t.effects[..] else {
                panic!("{:?}", t.effects)
            };
            assert_eq!(
                r.complete_by,
                Some(due + delay + pickup),
                "waits out its delay"
            );
            delays.push(delay);
        }
        let secs: Vec<i64> = delays.iter().map(|d| d.num_seconds()).collect();
        assert_eq!(
            secs,
            [0, 30, 60, 120, 240, 480, 900, 900, 900],
            "pickup 30 s"
        );
        assert_eq!(r.requeues, 9);
        assert_eq!(r.failure_count, 0, "waiting in a queue is not a failure");
        // Jitter spreads a herd over [d/2, d]; the first re-enqueue never waits.
        assert_eq!(p.at(0).requeue_delay(1, 0.0), Duration::zero());
        assert_eq!(p.at(0).requeue_delay(3, 0.0), Duration::seconds(30));
        assert_eq!(p.at(0).requeue_delay(40, 0.0), Duration::seconds(450));
        // A claim ends the streak: the next lost message goes out at once again.
        let now = r.complete_by.expect("deadline") - Duration::seconds(1);
        apply(&mut r, |r| claim(r, "s", now, &p));
        assert_eq!(r.requeues, 0);
    }

    #[test]
    fn a_refusal_at_the_first_step_leaves_nothing_to_undo() {
        let now = t0();
        let mut r = fresh(now);
        apply(&mut r, |r| claim(r, "s", now, &manual()));
        apply(&mut r, |r| {
            apply_reply(r, 1, 0, false, &refused(), now, &manual())
        });
        assert_eq!(r.process_state, ProcessState::Error);
        assert_eq!(
            r.last_error.as_deref(),
            Some("reserve-inventory: card declined")
        );

        let mut r = fresh(now);
        apply(&mut r, |r| claim(r, "s", now, &policy()));
        let t = apply(&mut r, |r| {
            apply_reply(r, 1, 0, false, &refused(), now, &policy())
        });
        assert_eq!(t.effects, [Effect::DeliverNotice]);
        assert_eq!(r.process_state, ProcessState::Compensated);
        assert_eq!(r.owed(), [Status::Failed, Status::Compensated]);
    }

    #[test]
    fn a_refusal_at_step_three_undoes_steps_two_then_one() {
        let p = policy();
        let now = t0();
        let mut r = fresh(now);
        run_to(&mut r, 2, now, &p);
        let t = apply(&mut r, |r| apply_reply(r, 1, 2, false, &refused(), now, &p));
        assert_eq!(
            t.effects,
            [
                Effect::DeliverNotice,
                Effect::Enqueue {
                    delay: Duration::zero()
                }
            ]
        );
        assert_eq!(r.process_state, ProcessState::Compensating);
        assert_eq!(r.owed(), [Status::Failed]);
        apply(&mut r, |r| notice_delivered(r, now));
        let mut undone = vec![];
        let t = apply(&mut r, |r| claim(r, "s", now, &p));
        assert_eq!(t.effects, [Effect::SendStepRequest]);
        while r.process_state == ProcessState::Compensating {
            undone.push(r.step_index);
            let (a, i) = (r.attempt, r.step_index);
            assert!(matches!(
                apply_reply(&r, a, i, false, &ok(), now, &p),
                Err(Rejection::WrongDirection { .. })
            ));
            apply(&mut r, |r| apply_reply(r, a, i, true, &ok(), now, &p));
        }
        assert_eq!(undone, [1, 0]);
        assert_eq!(r.process_state, ProcessState::Compensated);
        assert_eq!(
            r.steps[2].undo, None,
            "the refused step had no effect to undo"
        );
        assert_eq!(r.owed(), [Status::Compensated]);
    }

    #[test]
    fn a_refused_undo_ends_in_compensation_failed_and_an_operator_retry_resumes_it() {
        let p = policy();
        let now = t0();
        let mut r = fresh(now);
        run_to(&mut r, 1, now, &p);
        apply(&mut r, |r| apply_reply(r, 1, 1, false, &refused(), now, &p));
        apply(&mut r, |r| claim(r, "s", now, &p));
        let a = r.attempt;
        apply(&mut r, |r| apply_reply(r, a, 0, true, &refused(), now, &p));
        assert_eq!(r.process_state, ProcessState::CompensationFailed);
        assert!(r.owed().contains(&Status::CompensationFailed));
        assert_eq!(
            compensate(&fresh(now), &ops(None), now, &p).err(),
            Some(Rejection::NotCompensable(ProcessState::Pending))
        );
        let t = apply(&mut r, |r| retry(r, &ops(None), now, &p));
        assert_eq!(
            t.effects,
            [
                Effect::Publish(Status::Retrying),
                Effect::Enqueue {
                    delay: Duration::zero()
                }
            ]
        );
        assert_eq!(r.steps[0].undo_generation, 1, "a refused key is not reused");
        apply(&mut r, |r| claim(r, "s", now, &p));
        let a = r.attempt;
        apply(&mut r, |r| apply_reply(r, a, 0, true, &ok(), now, &p));
        assert_eq!(r.process_state, ProcessState::Compensated);
    }

    #[test]
    fn an_undo_that_times_out_is_retried_then_fails_at_the_threshold() {
        let p = policy();
        let mut now = t0();
        let mut r = fresh(now);
        run_to(&mut r, 1, now, &p);
        apply(&mut r, |r| apply_reply(r, 1, 1, false, &refused(), now, &p));
        for n in 1..=3 {
            apply(&mut r, |r| claim(r, "s", now, &p));
            now += p.at(0).step_timeout;
            apply(&mut r, |r| expire(r, now, &p, 0.5));
            assert_eq!(r.failure_count, n);
            now += p.at(0).retry_max_delay;
        }
        assert_eq!(r.process_state, ProcessState::CompensationFailed);
        assert_eq!(r.steps[0].undo, Some(StepStatus::TimedOut));
    }

    #[test]
    fn operator_retry_of_an_error_runs_the_step_again_under_a_new_key() {
        let p = manual();
        let now = t0();
        let mut r = fresh(now);
        run_to(&mut r, 1, now, &p);
        apply(&mut r, |r| apply_reply(r, 1, 1, false, &refused(), now, &p));
        assert_eq!(r.process_state, ProcessState::Error);
        assert_eq!(
            cancel(&r, &ops(Some("x")), now, &p).err(),
            Some(Rejection::NotCancellable(ProcessState::Error))
        );
        let first = retry(&r, &ops(None), now, &p).expect("retries");
        let second = retry(&r, &ops(None), now, &p).expect("computed from the same read");
        apply(&mut r, |_| Ok(first));
        assert!(
            !second.condition.holds(Some(&r)),
            "a second operator's retry loses"
        );
        assert_eq!(
            retry(&r, &ops(None), now, &p).err(),
            Some(Rejection::NotRetryable(ProcessState::Pending))
        );
        assert_eq!((r.steps[1].generation, r.steps[1].sent), (1, false));
        run_to(&mut r, 0, now, &p);
        let a = r.attempt;
        apply(&mut r, |r| apply_reply(r, a, 1, false, &ok(), now, &p));
        apply(&mut r, |r| apply_reply(r, a, 2, false, &ok(), now, &p));
        assert_eq!(r.process_state, ProcessState::Processed);
    }

    #[test]
    fn an_operator_resolves_a_failed_task_by_hand_and_nothing_moves_it_again() {
        let p = manual();
        let now = t0();
        let mut r = fresh(now);
        assert_eq!(
            resolve(&r, &ops(Some("x")), now).err(),
            Some(Rejection::NotResolvable(ProcessState::Pending))
        );
        run_to(&mut r, 1, now, &p);
        apply(&mut r, |r| apply_reply(r, 1, 1, false, &refused(), now, &p));
        assert_eq!(r.process_state, ProcessState::Error);
        let later = now + Duration::seconds(5);
        let raced = retry(&r, &ops(None), later, &p).expect("retries");
        let t = apply(&mut r, |r| {
            resolve(r, &ops(Some("refunded by hand, ticket 42")), later)
        });
        assert!(!raced.condition.holds(Some(&r)), "a racing retry loses");
        assert_eq!(t.effects, [Effect::DeliverNotice]);
        assert_eq!(r.process_state, ProcessState::Resolved);
        assert!(r.process_state.is_final());
        assert_eq!(r.owed().last(), Some(&Status::Resolved));
        assert_eq!((r.locked_by.as_deref(), r.complete_by), (None, None));
        let h = r.history.last().expect("logged");
        assert_eq!(
            (h.from, h.to, h.reason.as_str(), h.by.as_deref()),
            (
                ProcessState::Error,
                ProcessState::Resolved,
                "operator resolve: refunded by hand, ticket 42",
                Some("arn:aws:iam::123456789012:user/operator")
            )
        );
        assert_eq!(
            retry(&r, &ops(None), later, &p).err(),
            Some(Rejection::NotRetryable(ProcessState::Resolved))
        );
        assert_eq!(
            resolve(&r, &ops(Some("again")), later).err(),
            Some(Rejection::NotResolvable(ProcessState::Resolved))
        );
    }

    #[test]
    fn an_operator_skips_a_failed_step_with_its_result_and_the_task_goes_on() {
        let p = manual();
        let now = t0();
        let mut r = fresh(now);
        assert_eq!(
            skip(&r, &ops(None), now, &p, None).err(),
            Some(Rejection::NotSkippable(ProcessState::Pending))
        );
        run_to(&mut r, 1, now, &p);
        apply(&mut r, |r| apply_reply(r, 1, 1, false, &refused(), now, &p));
        assert_eq!(r.process_state, ProcessState::Error);
        let raced = retry(&r, &ops(None), now, &p).expect("retries");
        let by_hand = Some(r#"{"id":"pay-by-phone-7"}"#.to_owned());
        let t = apply(&mut r, |r| {
            skip(r, &ops(Some("charged by phone")), now, &p, by_hand.clone())
        });
        assert!(!raced.condition.holds(Some(&r)), "a racing retry loses");
        assert_eq!(
            t.effects,
            [
                Effect::Progress(Status::StepCompleted),
                Effect::Enqueue {
                    delay: Duration::zero()
                }
            ]
        );
        assert_eq!((r.process_state, r.step_index), (ProcessState::Pending, 2));
        assert_eq!(r.steps[1].status, StepStatus::Done);
        assert_eq!(r.steps[1].result, by_hand);
        assert_eq!((r.failure_count, r.last_error.as_deref()), (0, None));
        assert_eq!(
            r.history.last().map(|h| h.reason.as_str()),
            Some("operator skip of charge-payment: charged by phone")
        );
        // The last step skipped: the task is Processed and owes its notice.
        run_to(&mut r, 0, now, &p);
        let a = r.attempt;
        apply(&mut r, |r| apply_reply(r, a, 2, false, &refused(), now, &p));
        apply(&mut r, |r| {
            skip(r, &ops(Some("shipped by hand")), now, &p, None)
        });
        assert_eq!(r.process_state, ProcessState::Processed);
        assert_eq!(r.owed().last(), Some(&Status::Processed));
    }

    #[test]
    fn compensation_from_an_earlier_step_leaves_the_later_ones_to_the_operator() {
        let p = manual();
        let now = t0();
        let mut r = fresh(now);
        run_to(&mut r, 2, now, &p);
        apply(&mut r, |r| apply_reply(r, 1, 2, false, &refused(), now, &p));
        assert_eq!((r.process_state, r.step_index), (ProcessState::Error, 2));
        let raced = retry(&r, &ops(None), now, &p).expect("retries");
        apply(&mut r, |r| {
            compensate_from(r, &ops(Some("payment refunded by phone")), now, &p, 0)
        });
        assert!(!raced.condition.holds(Some(&r)), "a racing retry loses");
        assert_eq!(
            (r.process_state, r.step_index),
            (ProcessState::Compensating, 0)
        );
        assert_eq!(r.steps[1].undo, Some(StepStatus::Done), "settled by hand");
        assert_eq!(r.steps[0].undo, None, "still to undo");
        assert_eq!(
            r.history.last().map(|h| h.reason.as_str()),
            Some(
                "operator compensate from reserve-inventory (charge-payment settled by hand): payment refunded by phone"
            )
        );
        apply(&mut r, |r| claim(r, "s", now, &p));
        let a = r.attempt;
        apply(&mut r, |r| apply_reply(r, a, 0, true, &ok(), now, &p));
        assert_eq!(r.process_state, ProcessState::Compensated);
    }

    #[test]
    fn a_refused_step_reruns_on_a_new_input_but_one_that_may_have_taken_effect_does_not() {
        let p = manual();
        let now = t0();
        let mut r = fresh(now);
        run_to(&mut r, 1, now, &p);
        apply(&mut r, |r| apply_reply(r, 1, 1, false, &refused(), now, &p));
        let t = apply(&mut r, |r| {
            retry_with_input(r, &ops(Some("card number fixed")), now, &p, 0)
        });
        assert_eq!(t.record.process_state, ProcessState::Pending);
        assert_eq!(r.steps[1].generation, 1, "a new key for the new body");
        assert_eq!(
            r.history.last().map(|h| h.reason.as_str()),
            Some("operator retry with a new input: card number fixed")
        );
        assert_eq!(
            (r.steps[0].input_revision, r.steps[1].input_revision),
            (Some(0), None),
            "the step that ran keeps the input it ran with; the retried one takes the new"
        );
        // Refused again, retried on a third input: the first step still names the first.
        apply(&mut r, |r| claim(r, "s", now, &p));
        let a = r.attempt;
        apply(&mut r, |r| apply_reply(r, a, 1, false, &refused(), now, &p));
        apply(&mut r, |r| retry_with_input(r, &ops(None), now, &p, 1));
        assert_eq!(
            (r.steps[0].input_revision, r.steps[1].input_revision),
            (Some(0), None)
        );
        // A step that timed out may have taken effect under its key: no new body for it.
        let mut late = fresh(now);
        run_to(&mut late, 0, now, &p);
        let mut t = now;
        for _ in 0..3 {
            t += p.at(0).step_timeout;
            apply(&mut late, |r| expire(r, t, &p, 0.5));
            if late.process_state == ProcessState::Pending {
                t += p.at(0).retry_max_delay;
                apply(&mut late, |r| claim(r, "s", t, &p));
            }
        }
        assert_eq!(late.process_state, ProcessState::Error);
        assert_eq!(
            retry_with_input(&late, &ops(None), t, &p, 0).err(),
            Some(Rejection::MayHaveTakenEffect("reserve-inventory".into()))
        );
    }

    #[test]
    fn cancel_mid_flight_drops_the_reply_and_undoes_the_running_step_after_its_deadline() {
        let p = policy();
        let now = t0();
        let mut r = fresh(now);
        run_to(&mut r, 1, now, &p);
        let deadline = r.complete_by.expect("deadline");
        let later = now + Duration::seconds(4);
        let t = apply(&mut r, |r| {
            cancel(r, &ops(Some("customer asked")), later, &p)
        });
        let wait = p.at(1).undo_wait;
        assert_eq!(
            t.effects,
            [
                Effect::Publish(Status::Cancelled),
                Effect::Enqueue {
                    delay: deadline + wait - later
                }
            ]
        );
        assert!(matches!(
            apply_reply(&r, 1, 1, false, &ok(), later, &p),
            Err(Rejection::NotRunning(ProcessState::Compensating))
        ));
        // A stray work message cannot send the undo while the step may still be in flight:
        // not before its deadline plus the undo wait.
        for early in [later, deadline, deadline + wait - Duration::milliseconds(1)] {
            assert_eq!(
                claim(&r, "s", early, &p).err(),
                Some(Rejection::TooEarly {
                    until: deadline + wait
                })
            );
        }
        let deadline = deadline + wait;
        apply(&mut r, |r| claim(r, "s", deadline, &p));
        let mut undone = vec![];
        while r.process_state == ProcessState::Compensating {
            let (a, i) = (r.attempt, r.step_index);
            undone.push(i);
            apply(&mut r, |r| apply_reply(r, a, i, true, &ok(), deadline, &p));
        }
        assert_eq!(undone, [1, 0]);

        let mut pending = fresh(now);
        apply(&mut pending, |r| {
            cancel(r, &ops(Some("changed my mind")), now, &p)
        });
        assert_eq!(pending.process_state, ProcessState::Compensated);
    }

    #[test]
    fn a_step_may_wait_for_an_agent_and_an_agent_out_of_time_hands_the_attempt_back() {
        // 10 s to run once picked up, 20 s to be picked up.
        let p = with(|p| p.start_within = Duration::seconds(20));
        let now = t0();
        let mut r = fresh(now);
        apply(&mut r, |r| claim(r, "s", now, &p));
        assert_eq!(r.complete_by, Some(now + Duration::seconds(30)));
        // The next step's deadline allows for its wait too.
        let later = now + Duration::seconds(25);
        apply(&mut r, |r| apply_reply(r, 1, 0, false, &ok(), later, &p));
        assert_eq!(r.complete_by, Some(later + Duration::seconds(30)));
        // Not expired within the allowance.
        assert!(expire(&r, later + Duration::seconds(29), &p, 0.5).is_err());
        // The agent spent its 10 s on faults: a timed-out attempt, now.
        let gave_up = later + Duration::seconds(11);
        let t = apply(&mut r, |r| {
            let error = "no answer within the step's timeout (7 retries)".to_owned();
            apply_reply(
                r,
                1,
                1,
                false,
                &StepOutcome::TimedOut { error },
                gave_up,
                &p,
            )
        });
        assert_eq!(r.process_state, ProcessState::Pending);
        assert_eq!(r.failure_count, 1);
        assert_eq!(r.locked_by, None);
        assert!(matches!(t.effects[..], [Effect::Enqueue { .. }]), "{t:?}");
        assert!(
            r.last_error
                .as_deref()
                .is_some_and(|e| e.contains("timeout") && e.contains("attempt 1")),
            "{r:?}"
        );
        // A late duplicate of it changes nothing (fenced by the attempt).
        let error = "again".to_owned();
        assert!(
            apply_reply(
                &r,
                1,
                1,
                false,
                &StepOutcome::TimedOut { error },
                gave_up,
                &p
            )
            .is_err()
        );
    }

    #[test]
    fn a_deferred_step_is_handed_back_at_once_no_earlier_than_the_circuit_reopens() {
        let p = policy();
        let now = t0();
        let mut r = fresh(now);
        run_to(&mut r, 1, now, &p);
        let until = now + Duration::seconds(5);
        let t = apply(&mut r, |r| {
            apply_reply(
                r,
                1,
                1,
                false,
                &StepOutcome::Deferred {
                    until,
                    misconfigured: None,
                },
                now,
                &p,
            )
        });
        assert_eq!(r.process_state, ProcessState::Pending);
        assert_eq!(
            r.failure_count, 0,
            "an open circuit is no failure of the task"
        );
        let [Effect::Enqueue { delay }] = t.effects[..] else {
            panic!("one enqueue: {:?}", t.effects)
        };
        assert!(
            delay >= Duration::seconds(5) && delay < Duration::seconds(6),
            "{delay}"
        );
        assert!(r.steps[1].sent, "a deferred step may have been sent before");
        // However often the circuit stays open, the task waits and never fails; the waits
        // grow (the step's retry delay for the deferrals in a row), up to its `maxDelay`.
        let soon = now + Duration::milliseconds(10);
        let mut last = Duration::zero();
        for _ in 0..10 {
            let a = r.attempt;
            apply(&mut r, |r| claim(r, "s", now, &p));
            let t = apply(&mut r, |r| {
                apply_reply(
                    r,
                    a + 1,
                    1,
                    false,
                    &StepOutcome::Deferred {
                        until: soon,
                        misconfigured: None,
                    },
                    now,
                    &p,
                )
            });
            if let [Effect::Enqueue { delay }] = t.effects[..] {
                last = delay;
            }
        }
        assert_eq!(
            (r.process_state, r.failure_count, r.deferrals),
            (ProcessState::Pending, 0, 11)
        );
        let cap = p.at(1).retry_max_delay;
        assert!(
            last >= cap / 2 && last <= cap + Duration::seconds(1),
            "{last} against a cap of {cap}"
        );
        // The service answers: the count starts again.
        let a = r.attempt;
        apply(&mut r, |r| claim(r, "s", now, &p));
        apply(&mut r, |r| apply_reply(r, a + 1, 1, false, &ok(), now, &p));
        assert_eq!(r.deferrals, 0);
    }

    #[test]
    fn a_misconfigured_attempt_counts_and_fails_the_step_at_the_threshold_with_the_alert() {
        let p = policy();
        let now = t0();
        let mut r = fresh(now);
        run_to(&mut r, 1, now, &p);
        let threshold = p.at(1).failure_threshold;
        for n in 1..=threshold {
            let a = r.attempt;
            if n > 1 {
                apply(&mut r, |r| claim(r, "s", now, &p));
            }
            let attempt = if n > 1 { a + 1 } else { a };
            apply(&mut r, |r| {
                apply_reply(
                    r,
                    attempt,
                    1,
                    false,
                    &StepOutcome::Deferred {
                        until: now + Duration::milliseconds(50),
                        misconfigured: Some(
                            "service misconfigured: HTTP 404: no such account".into(),
                        ),
                    },
                    now,
                    &p,
                )
            });
            if n < threshold {
                assert_eq!(
                    (r.process_state, r.failure_count),
                    (ProcessState::Pending, n),
                    "a misconfigured attempt is a failed one"
                );
            }
        }
        assert_eq!(r.steps[1].status, StepStatus::TimedOut, "{r:?}");
        assert!(
            r.outbox.iter().any(|o| o.status == Status::Failed),
            "the alert is owed: {r:?}"
        );
        assert!(
            r.last_error
                .as_deref()
                .is_some_and(|e| e.contains("HTTP 404")),
            "{r:?}"
        );
        assert!(
            r.history
                .iter()
                .any(|h| h.reason.starts_with("misconfigured; retry 1")),
            "{:?}",
            r.history
        );
    }

    fn declined() -> StepOutcome {
        StepOutcome::Refused {
            code: "declined".into(),
            message: "card declined".into(),
        }
    }

    #[test]
    fn a_refusal_compensates_and_ends_refused_without_an_alert() {
        let p = policy();
        let now = t0();
        let mut r = fresh(now);
        run_to(&mut r, 2, now, &p);
        let t = apply(&mut r, |r| {
            apply_reply(r, 1, 2, false, &declined(), now, &p)
        });
        assert_eq!(r.process_state, ProcessState::Compensating);
        assert!(r.outbox.is_empty(), "no TaskFailed alert: {:?}", r.owed());
        assert_eq!(
            t.effects,
            [Effect::Enqueue {
                delay: Duration::zero()
            }],
            "a refused step had no effect: nothing to wait for"
        );
        assert_eq!(r.step_index, 1, "the refused step needs no undo");
        while r.process_state == ProcessState::Compensating {
            if r.locked_by.is_none() {
                apply(&mut r, |r| claim(r, "s", now, &p));
            }
            let (a, i) = (r.attempt, r.step_index);
            apply(&mut r, |r| apply_reply(r, a, i, true, &ok(), now, &p));
        }
        assert_eq!(r.process_state, ProcessState::Refused);
        assert_eq!(r.owed(), [Status::Refused]);
        assert!(!Status::Refused.is_alert());
        let refusal = r.refusal.clone().expect("kept");
        assert_eq!(
            (refusal.step.as_str(), refusal.code.as_str()),
            ("arrange-shipping", "declined")
        );

        // Refused at the first step: nothing to undo, Refused at once.
        let mut first = fresh(now);
        run_to(&mut first, 0, now, &p);
        apply(&mut first, |r| {
            apply_reply(r, 1, 0, false, &declined(), now, &p)
        });
        assert_eq!(first.process_state, ProcessState::Refused);
        assert_eq!(first.owed(), [Status::Refused]);
    }

    #[test]
    fn a_refusal_past_the_pivot_stops_in_error_and_alerts() {
        let p = policy();
        let now = t0();
        let mut r = loan(now);
        run_to(&mut r, 3, now, &p);
        assert!(r.past_pivot());
        apply(&mut r, |r| {
            apply_reply(r, 1, 3, false, &declined(), now, &p)
        });
        assert_eq!(r.process_state, ProcessState::Error);
        assert_eq!(r.owed(), [Status::Failed], "a person must decide");
        let t = apply(&mut r, |r| retry(r, &ops(None), now, &p));
        assert!(t.record.refusal.is_none(), "a retry forgets the refusal");
    }

    #[test]
    fn an_undo_after_a_timeout_at_the_threshold_waits_past_the_deadline() {
        let p = policy();
        let now = t0();
        let mut r = fresh(now);
        run_to(&mut r, 1, now, &p);
        let mut at = now;
        while r.process_state != ProcessState::Compensating {
            if r.process_state == ProcessState::Pending {
                apply(&mut r, |r| claim(r, "s", at, &p));
            }
            at = r.complete_by.expect("deadline");
            apply(&mut r, |r| expire(r, at, &p, 0.5));
        }
        assert_eq!(r.steps[1].status, StepStatus::TimedOut);
        assert_eq!(r.step_index, 1, "the step that timed out is undone first");
        let after = at + p.at(1).undo_wait;
        assert_eq!(r.undo_after, Some(after));
        assert_eq!(
            claim(&r, "s", at, &p).err(),
            Some(Rejection::TooEarly { until: after })
        );
        apply(&mut r, |r| claim(r, "s", after, &p));
        let a = r.attempt;
        apply(&mut r, |r| apply_reply(r, a, 1, true, &ok(), after, &p));
        assert_eq!(
            r.undo_after, None,
            "the wait is over once that undo is done"
        );
    }

    #[test]
    fn an_undo_waits_past_the_deadline_of_an_attempt_handed_back_early() {
        // A start allowance: a request may wait for an agent, so the deadline is well after
        // the agent's give-up time, and a duplicated delivery may call until the deadline.
        let p = with(|p| p.start_within = Duration::seconds(60));
        let now = t0();
        let spent = StepOutcome::TimedOut {
            error: "spent its timeout on transient faults".into(),
        };

        // A timed-out reply at the threshold: the undo waits past the attempt's deadline, not
        // past the reply.
        let mut r = fresh(now);
        run_to(&mut r, 1, now, &p);
        let mut at = now;
        let mut deadline = r.complete_by.expect("deadline");
        while r.process_state != ProcessState::Compensating {
            if r.process_state == ProcessState::Pending {
                at = r.complete_by.expect("pickup");
                apply(&mut r, |r| claim(r, "s", at, &p));
            }
            deadline = r.complete_by.expect("deadline");
            at += p.at(1).step_timeout;
            let a = r.attempt;
            apply(&mut r, |r| apply_reply(r, a, 1, false, &spent, at, &p));
        }
        assert!(at < deadline, "the reply came before the deadline");
        assert_eq!(r.undo_after, Some(deadline + p.at(1).undo_wait));

        // A cancel of a step handed back by such a reply: the same.
        let mut r = fresh(now);
        run_to(&mut r, 1, now, &p);
        let deadline = r.complete_by.expect("deadline");
        let at = now + p.at(1).step_timeout;
        apply(&mut r, |r| apply_reply(r, 1, 1, false, &spent, at, &p));
        assert_eq!(r.process_state, ProcessState::Pending);
        assert_eq!(r.steps[1].sent_until, Some(deadline));
        apply(&mut r, |r| cancel(r, &ops(None), at, &p));
        assert_eq!(r.undo_after, Some(deadline + p.at(1).undo_wait));

        // An operator's compensation of a task that failed so, with compensation off.
        let manual = with(|p| {
            p.start_within = Duration::seconds(60);
            p.auto_compensate = false;
        });
        let mut r = fresh(now);
        run_to(&mut r, 1, now, &manual);
        let mut at = now;
        let mut deadline = r.complete_by.expect("deadline");
        while r.process_state != ProcessState::Error {
            if r.process_state == ProcessState::Pending {
                at = r.complete_by.expect("pickup");
                apply(&mut r, |r| claim(r, "s", at, &manual));
            }
            deadline = r.complete_by.expect("deadline");
            at += manual.at(1).step_timeout;
            let a = r.attempt;
            apply(&mut r, |r| apply_reply(r, a, 1, false, &spent, at, &manual));
        }
        assert_eq!(r.steps[1].sent_until, Some(deadline));
        apply(&mut r, |r| compensate(r, &ops(None), at, &manual));
        assert_eq!(r.undo_after, Some(deadline + manual.at(1).undo_wait));
    }

    /// The loan with `send-contract` (step 2) as a callback step.
    fn callback_policies() -> Policies {
        let cb = CallbackPolicy {
            timeout: Duration::hours(1),
            heartbeat: Some(Duration::minutes(5)),
        };
        let mut steps = vec![base(); 4];
        steps[2].callback = Some(cb);
        Policies::new(steps)
    }

    #[test]
    fn a_callback_step_waits_takes_heartbeats_and_completes_once() {
        let p = callback_policies();
        let now = t0();
        let mut r = loan(now);
        run_to(&mut r, 2, now, &p);
        assert_eq!(
            apply_reply(&r, 1, 1, false, &StepOutcome::Accepted, now, &p).err(),
            Some(Rejection::WrongStep {
                record: 2,
                message: 1
            })
        );
        let t1 = now + Duration::seconds(1);
        apply(&mut r, |r| {
            apply_reply(r, 1, 2, false, &StepOutcome::Accepted, t1, &p)
        });
        assert_eq!(r.steps[2].status, StepStatus::Waiting);
        assert_eq!(r.steps[2].waiting_until, Some(t1 + Duration::hours(1)));
        assert_eq!(r.complete_by, Some(t1 + Duration::minutes(5)));
        assert!(
            apply_reply(&r, 1, 2, false, &StepOutcome::Accepted, t1, &p).is_err(),
            "a duplicate acceptance changes nothing"
        );
        let t2 = t1 + Duration::minutes(4);
        apply(&mut r, |r| {
            apply_reply(r, 1, 2, false, &StepOutcome::Heartbeat, t2, &p)
        });
        assert_eq!(r.complete_by, Some(t2 + Duration::minutes(5)));
        let late = t1 + Duration::minutes(58);
        apply(&mut r, |r| {
            apply_reply(r, 1, 2, false, &StepOutcome::Heartbeat, late, &p)
        });
        assert_eq!(
            r.complete_by,
            Some(t1 + Duration::hours(1)),
            "heartbeats never move the deadline past the callback timeout"
        );
        let done = StepOutcome::Succeeded {
            result: Some("{\"id\":\"c-1\"}".into()),
        };
        apply(&mut r, |r| apply_reply(r, 1, 2, false, &done, late, &p));
        assert_eq!(r.steps[2].status, StepStatus::Done);
        assert_eq!(r.steps[2].waiting_until, None);
        assert!(
            apply_reply(&r, 1, 2, false, &done, late, &p).is_err(),
            "a replayed callback is fenced"
        );
        assert_eq!(
            apply_reply(&r, 1, 3, false, &StepOutcome::Heartbeat, late, &p).err(),
            Some(Rejection::NotWaiting(3))
        );
    }

    #[test]
    fn a_silent_callback_step_times_out_goes_out_again_and_keeps_its_token() {
        let p = callback_policies();
        let now = t0();
        let mut r = loan(now);
        run_to(&mut r, 2, now, &p);
        apply(&mut r, |r| {
            apply_reply(r, 1, 2, false, &StepOutcome::Accepted, now, &p)
        });
        let token = callback_token(&r.callback_key, &r.task_id, 2, r.steps[2].generation);
        let due = r.complete_by.expect("deadline");
        apply(&mut r, |r| expire(r, due, &p, 0.5));
        assert_eq!(r.process_state, ProcessState::Pending);
        assert_eq!(r.failure_count, 1);
        assert!(
            r.last_error
                .as_deref()
                .is_some_and(|e| e.contains("no callback"))
        );
        assert_eq!(r.steps[2].waiting_until, None);
        let later = r.complete_by.expect("pickup");
        apply(&mut r, |r| claim(r, "s", later, &p));
        assert_eq!(
            callback_token(&r.callback_key, &r.task_id, 2, r.steps[2].generation),
            token,
            "every attempt of a step carries its key, and so its token"
        );
        assert_eq!(
            check_callback_token(&r.callback_key, &r.task_id, &token),
            Some(CallbackFence::Step {
                step_index: 2,
                generation: 0
            })
        );
        let other = fresh(now);
        assert_eq!(
            check_callback_token(&other.callback_key, &r.task_id, &token),
            None,
            "a token is only good with its own task's key"
        );
        for bad in ["g0.2.00", "g.2.00", "0.2", ""] {
            assert_eq!(check_callback_token(&r.callback_key, &r.task_id, bad), None);
        }
    }

    /// The token of the form made before tokens named the key generation: `attempt.step.mac`
    /// over `task:attempt:step`.
    fn attempt_token(key: &str, id: &TaskId, attempt: u64, step: usize) -> String {
        use hmac::Mac;
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(key.as_bytes()).expect("key");
        mac.update(format!("{id}:{attempt}:{step}").as_bytes());
        let tag = hex::encode(&mac.finalize().into_bytes()[..16]);
        format!("{attempt}.{step}.{tag}")
    }

    #[test]
    fn a_token_made_before_generations_still_names_its_attempt() {
        let r = loan(t0());
        let old = attempt_token(&r.callback_key, &r.task_id, 3, 2);
        assert_eq!(
            check_callback_token(&r.callback_key, &r.task_id, &old),
            Some(CallbackFence::Attempt {
                attempt: 3,
                step_index: 2
            })
        );
        // The two forms sign different messages: neither passes for the other.
        let forged = old.replacen('3', "g3", 1);
        assert_eq!(
            check_callback_token(&r.callback_key, &r.task_id, &forged),
            None
        );
    }

    #[test]
    fn a_callback_step_sent_again_is_completed_by_its_first_callback() {
        let p = callback_policies();
        let now = t0();
        let done = StepOutcome::Succeeded {
            result: Some("{\"contract\":\"c-1\"}".into()),
        };
        // Handed back (its callback wait timed out): the first acceptance's callback completes
        // the step, and the next step is enqueued for a claim.
        let mut r = loan(now);
        run_to(&mut r, 2, now, &p);
        apply(&mut r, |r| {
            apply_reply(r, 1, 2, false, &StepOutcome::Accepted, now, &p)
        });
        let due = r.complete_by.expect("deadline");
        apply(&mut r, |r| expire(r, due, &p, 0.5));
        assert_eq!(r.process_state, ProcessState::Pending);
        let t = apply(&mut r, |r| apply_callback(r, 2, 0, &done, due, &p));
        assert_eq!(r.steps[2].status, StepStatus::Done);
        assert_eq!(r.steps[2].result.as_deref(), Some("{\"contract\":\"c-1\"}"));
        assert_eq!((r.process_state, r.step_index), (ProcessState::Pending, 3));
        assert!(t.effects.contains(&Effect::Enqueue {
            delay: Duration::zero()
        }));
        assert!(!r.steps[3].sent, "the next step waits for its claim");
        apply(&mut r, |r| claim(r, "s", due, &p));
        assert_eq!(r.current_step(), Some("disburse-funds"));

        // Sent again under a new attempt (the service answers the repeated key with its first
        // acceptance and will not call back again): the first callback completes it, and the
        // new attempt's late acceptance is stale.
        let mut r = loan(now);
        run_to(&mut r, 2, now, &p);
        apply(&mut r, |r| {
            apply_reply(r, 1, 2, false, &StepOutcome::Accepted, now, &p)
        });
        let due = r.complete_by.expect("deadline");
        apply(&mut r, |r| expire(r, due, &p, 0.5));
        let later = r.complete_by.expect("pickup");
        apply(&mut r, |r| claim(r, "s", later, &p));
        assert_eq!((r.attempt, r.steps[2].status), (2, StepStatus::Running));
        apply(&mut r, |r| apply_callback(r, 2, 0, &done, later, &p));
        assert_eq!(r.steps[2].status, StepStatus::Done);
        assert_eq!(
            (r.process_state, r.current_step()),
            (ProcessState::Processing, Some("disburse-funds"))
        );
        assert!(
            apply_reply(&r, 2, 2, false, &StepOutcome::Accepted, later, &p).is_err(),
            "the second attempt's acceptance comes after the step is done"
        );
        assert!(
            apply_callback(&r, 2, 0, &done, later, &p).is_err(),
            "a replayed callback is fenced"
        );

        // Failed waiting (the threshold, past the pivot... here with compensation off): the
        // late callback completes the step and the task goes on; an operator's retry would
        // have sent the key again to a service that calls back once.
        let mut manual = vec![base(); 4];
        manual[2].callback = p.at(2).callback;
        for s in &mut manual {
            s.auto_compensate = false;
        }
        let manual = Policies::new(manual);
        let mut r = loan(now);
        run_to(&mut r, 2, now, &manual);
        let mut at = now;
        while r.process_state != ProcessState::Error {
            if r.process_state == ProcessState::Pending {
                at = r.complete_by.expect("pickup");
                apply(&mut r, |r| claim(r, "s", at, &manual));
            }
            let a = r.attempt;
            apply(&mut r, |r| {
                apply_reply(r, a, 2, false, &StepOutcome::Accepted, at, &manual)
            });
            at = r.complete_by.expect("deadline");
            apply(&mut r, |r| expire(r, at, &manual, 0.5));
        }
        assert_eq!(r.steps[2].status, StepStatus::TimedOut);
        apply(&mut r, |r| apply_callback(r, 2, 0, &done, at, &manual));
        assert_eq!(
            (r.process_state, r.current_step(), r.failure_count),
            (ProcessState::Pending, Some("disburse-funds"), 0)
        );
        assert_eq!(r.steps[2].status, StepStatus::Done);
    }

    #[test]
    fn a_callback_of_an_older_key_generation_or_a_heartbeat_between_attempts_changes_nothing() {
        let p = callback_policies();
        let now = t0();
        // A step the scheduler could not send fails (a refused key: the step had no effect);
        // with compensation off it waits in Error, and the operator's retry gives it a new key.
        let manual = {
            let mut steps = vec![base(); 4];
            steps[2].callback = p.at(2).callback;
            for s in &mut steps {
                s.auto_compensate = false;
            }
            Policies::new(steps)
        };
        let mut r = loan(now);
        run_to(&mut r, 2, now, &manual);
        let failed = StepOutcome::Failed {
            error: "input_mapping_failed".into(),
        };
        apply(&mut r, |r| {
            apply_reply(r, 1, 2, false, &failed, now, &manual)
        });
        assert_eq!(r.process_state, ProcessState::Error);
        apply(&mut r, |r| retry(r, &ops(None), now, &manual));
        assert_eq!(r.steps[2].generation, 1, "a refused key is not used again");
        assert_eq!(
            apply_callback(&r, 2, 0, &StepOutcome::succeeded(), now, &manual).err(),
            Some(Rejection::StaleGeneration {
                record: 1,
                message: 0
            })
        );
        assert_eq!(
            apply_callback(&r, 2, 1, &StepOutcome::succeeded(), now, &manual).err(),
            Some(Rejection::NotRunning(ProcessState::Pending)),
            "the new key was never sent: no callback can answer it yet"
        );
        apply(&mut r, |r| claim(r, "s", now, &manual));
        apply(&mut r, |r| {
            apply_reply(r, 2, 2, false, &StepOutcome::Accepted, now, &manual)
        });
        let due = r.complete_by.expect("deadline");
        apply(&mut r, |r| expire(r, due, &manual, 0.5));
        assert_eq!(
            apply_callback(&r, 2, 1, &StepOutcome::Heartbeat, due, &manual).err(),
            Some(Rejection::NotWaiting(2)),
            "between attempts there is no callback wait to extend"
        );
        assert_eq!(
            apply_callback(&r, 1, 0, &StepOutcome::succeeded(), due, &manual).err(),
            Some(Rejection::WrongStep {
                record: 2,
                message: 1
            })
        );
    }

    /// A Pending record of the loan: check-credit (no undo), reserve-funds (undo),
    /// send-contract (the pivot, undo), disburse-funds (no undo).
    fn loan(now: DateTime<Utc>) -> StateRecord {
        record(&examples::loan_application(&base()), now)
    }

    #[test]
    fn compensation_skips_a_step_without_an_undo() {
        let p = policy();
        let now = t0();
        let mut r = loan(now);
        run_to(&mut r, 2, now, &p);
        let t = apply(&mut r, |r| apply_reply(r, 1, 2, false, &refused(), now, &p));
        assert_eq!(r.process_state, ProcessState::Compensating);
        assert_eq!(
            r.step_index, 1,
            "reserve-funds is undone first, send-contract was refused"
        );
        assert!(t.effects.contains(&Effect::DeliverNotice));
        apply(&mut r, |r| claim(r, "s", now, &p));
        let a = r.attempt;
        apply(&mut r, |r| apply_reply(r, a, 1, true, &ok(), now, &p));
        assert_eq!(r.process_state, ProcessState::Compensated);
        assert_eq!(r.steps[0].undo, None, "check-credit is never undone");
        assert_eq!(r.steps[0].status, StepStatus::Done);
    }

    #[test]
    fn past_the_pivot_a_failure_waits_in_error_and_cannot_be_cancelled_or_compensated() {
        let p = policy();
        let now = t0();
        let mut r = loan(now);
        run_to(&mut r, 3, now, &p);
        assert!(r.past_pivot());
        assert_eq!(
            cancel(&r, &ops(Some("x")), now, &p).err(),
            Some(Rejection::PastPivot(ProcessState::Processing))
        );
        let t = apply(&mut r, |r| apply_reply(r, 1, 3, false, &refused(), now, &p));
        assert_eq!(t.effects, [Effect::DeliverNotice]);
        assert_eq!(
            r.process_state,
            ProcessState::Error,
            "auto-compensation stops at the pivot"
        );
        assert_eq!(r.owed(), [Status::Failed]);
        assert_eq!(
            compensate(&r, &ops(None), now, &p).err(),
            Some(Rejection::PastPivot(ProcessState::Error))
        );
        apply(&mut r, |r| retry(r, &ops(None), now, &p));
        assert_eq!(r.process_state, ProcessState::Pending);
    }

    #[test]
    fn a_faulted_step_fails_the_task_and_is_undone_as_taking_effect() {
        let p = policy();
        let now = t0();
        let mut r = fresh(now);
        run_to(&mut r, 1, now, &p);
        let faulted = StepOutcome::Faulted {
            error: "result_too_large".into(),
        };
        apply(&mut r, |r| apply_reply(r, 1, 1, false, &faulted, now, &p));
        assert_eq!(r.steps[1].status, StepStatus::Faulted);
        assert_eq!(r.process_state, ProcessState::Compensating);
        assert_eq!(
            r.step_index, 1,
            "the faulted step took effect: it is undone first"
        );
    }

    #[test]
    fn each_step_runs_under_its_own_timeout_and_threshold() {
        let w = examples::loan_application(&base());
        let p = w.policies();
        let now = t0();
        let mut r = record(&w, now);
        apply_with(&mut r, &p, |r| claim(r, "s", now, &p));
        assert_eq!(
            r.complete_by,
            Some(now + Duration::seconds(5)),
            "check-credit: 5s"
        );
        apply_with(&mut r, &p, |r| apply_reply(r, 1, 0, false, &ok(), now, &p));
        assert_eq!(
            r.complete_by,
            Some(now + Duration::seconds(30)),
            "reserve-funds: 30s"
        );
        assert_eq!(p.at(3).failure_threshold, 5);
        assert_eq!(p.at(1).failure_threshold, 3);
    }

    fn apply_with(
        r: &mut StateRecord,
        p: &Policies,
        f: impl FnOnce(&StateRecord) -> Result<Transition, Rejection>,
    ) {
        let t = f(r).expect("transition applies");
        t.record.check(p).expect("valid after the transition");
        *r = t.record;
    }

    #[test]
    fn retry_delay_grows_with_equal_jitter_and_is_capped() {
        let p = policy();
        for (n, full) in [(1, 1000), (2, 2000), (3, 4000), (4, 8000), (5, 8000)] {
            assert_eq!(p.at(0).retry_delay(n, 0.0).num_milliseconds(), full / 2);
            assert_eq!(p.at(0).retry_delay(n, 1.0).num_milliseconds(), full);
            let mid = p.at(0).retry_delay(n, 0.5).num_milliseconds();
            assert!(full / 2 < mid && mid < full);
        }
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

    #[derive(Debug, Clone)]
    enum Ev {
        Claim(u8),
        Reply {
            attempt_back: u8,
            step_shift: i8,
            undo: bool,
            /// 0: failed, 1: deferred (circuit open), 2: refused (a business outcome),
            /// 3: accepted (callback), 4: heartbeat, otherwise succeeded.
            kind: u8,
        },
        /// A service's callback for the current step (shifted), under its key's generation
        /// (less `generation_back`); `kind` as for replies.
        Callback {
            generation_back: u8,
            step_shift: i8,
            kind: u8,
        },
        Advance(u16),
        Expire(u8),
        Delivered,
        Retry,
        Compensate,
        Cancel,
    }

    fn ev() -> impl Strategy<Value = Ev> {
        prop_oneof![
            3 => (0u8..3).prop_map(Ev::Claim),
            5 => (0u8..2, -1i8..2, proptest::bool::weighted(0.2), 0u8..13)
                .prop_map(|(a, s, undo, kind)| Ev::Reply { attempt_back: a, step_shift: s, undo, kind }),
            2 => (0u8..2, -1i8..2, 0u8..6)
                .prop_map(|(g, s, kind)| Ev::Callback { generation_back: g, step_shift: s, kind }),
            2 => (0u16..40).prop_map(Ev::Advance),
            2 => (0u8..10).prop_map(Ev::Expire),
            1 => Just(Ev::Delivered),
            1 => Just(Ev::Retry),
            1 => Just(Ev::Compensate),
            1 => Just(Ev::Cancel),
        ]
    }

    /// A workflow of 1 to 8 steps, each with or without an undo, perhaps with a pivot.
    fn shape() -> impl Strategy<Value = examples::Shape> {
        proptest::collection::vec(proptest::bool::ANY, 1..=8).prop_flat_map(|undos| {
            let n = undos.len();
            (Just(undos), proptest::option::of(0..n)).prop_map(|(undos, pivot)| {
                // Nothing after the pivot has an undo (validation refuses it).
                let undos = undos
                    .iter()
                    .enumerate()
                    .map(|(i, u)| *u && pivot.is_none_or(|p| i <= p))
                    .collect();
                examples::Shape { undos, pivot }
            })
        })
    }

    proptest! {
        /// No sequence of events reaches an invalid record, every accepted transition's
        /// condition holds on the record it came from and fails on the record it produced, the
        /// fencing attempt never goes back, and every transition leaves a history line.
        #[test]
        fn no_event_sequence_breaks_an_invariant(
            events in proptest::collection::vec(ev(), 0..80),
            shape in shape(),
            auto in proptest::bool::ANY,
            rounds in 0u32..2,
            callbacks in proptest::bool::ANY,
            start_within in 0i64..30,
        ) {
            let p = with(|p| {
                p.auto_compensate = auto;
                p.max_rounds = rounds;
                p.start_within = Duration::seconds(start_within);
                // Every step a callback step (Accepted then applies; otherwise it is refused).
                p.callback = callbacks.then_some(CallbackPolicy {
                    timeout: Duration::seconds(100),
                    heartbeat: Some(Duration::seconds(30)),
                });
            });
            let mut now = t0();
            let w = examples::synthetic(&shape, &base());
            let mut r = record(&w, now);
            for e in events {
                let out = match e {
                    Ev::Claim(i) => claim(&r, &format!("s-{i}"), now, &p),
                    Ev::Reply { attempt_back, step_shift, undo, kind } => {
                        let outcome = match kind {
                            0 => refused(),
                            1 => StepOutcome::Deferred {
                                until: now + Duration::seconds(20),
                                misconfigured: None,
                            },
                            2 => declined(),
                            3 => StepOutcome::Accepted,
                            4 => StepOutcome::Heartbeat,
                            5 => StepOutcome::TimedOut { error: "spent".into() },
                            _ => StepOutcome::succeeded(),
                        };
                        let step = (r.step_index as i64 + step_shift as i64).max(0) as usize;
                        apply_reply(&r, r.attempt.saturating_sub(attempt_back as u64), step, undo, &outcome, now, &p)
                    }
                    Ev::Callback { generation_back, step_shift, kind } => {
                        let outcome = match kind {
                            0 => declined(),
                            1 => StepOutcome::Heartbeat,
                            _ => StepOutcome::Succeeded { result: Some("{\"id\":1}".into()) },
                        };
                        let step = (r.step_index as i64 + step_shift as i64).max(0) as usize;
                        let generation = r.steps.get(step).map_or(0, |s| s.generation);
                        apply_callback(&r, step, generation.saturating_sub(u32::from(generation_back)), &outcome, now, &p)
                    }
                    Ev::Advance(s) => { now += Duration::seconds(s as i64); continue; }
                    Ev::Expire(j) => expire(&r, now, &p, f64::from(j) / 10.0),
                    Ev::Delivered => notice_delivered(&r, now),
                    Ev::Retry => retry(&r, &ops(None), now, &p),
                    Ev::Compensate => compensate(&r, &ops(None), now, &p),
                    Ev::Cancel => cancel(&r, &ops(Some("test")), now, &p),
                };
                if let Ok(t) = out {
                    prop_assert!(t.condition.holds(Some(&r)));
                    prop_assert!(!t.condition.holds(Some(&t.record)));
                    prop_assert!(t.record.attempt >= r.attempt);
                    if let Err(e) = t.record.check(&p) {
                        return Err(TestCaseError::fail(format!("{e} after {:?} from {:?} to {:?}", t.effects, r, t.record)));
                    }
                    let logged = t.record.history.last() != r.history.last() || t.effects.is_empty();
                    prop_assert!(logged, "no history line for {:?}", t.effects);
                    r = t.record;
                }
            }
        }
    }
}
