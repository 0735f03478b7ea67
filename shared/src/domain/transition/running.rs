//! A step's way out and back: a scheduler [`claim`]s the record, an agent's reply is applied
//! ([`apply_reply`]), a callback step's service calls back ([`apply_callback`]), the supervisor
//! finds a deadline passed ([`expire`]) and the step is handed back or deferred, and the outbox
//! is delivered ([`notice_delivered`]).

use super::super::fanout::StopKind;
use super::super::policy::Policies;
use super::super::state::{NoticeKind, ProcessState, Refusal, StateRecord, StepStatus, to_millis};
use super::branches;
use super::common::{
    Effect, Rejection, StepOutcome, Transition, end_line, finish, log, next, tidy,
};
use super::compensating::{apply_undo_reply, begin_compensation, fail, stop_branch, stop_in_error};
use super::deadline;
use super::route::{Linear, Router, take};
use super::waiting::{event_timed_out, reach_wait, woke};
use super::{Condition, Guard};
use chrono::{DateTime, Duration, Utc};

/// A work message arrived: a scheduler instance claims the record, which is Pending (the
/// current step goes out) or Compensating and unlocked (the current step's undo goes out).
///
/// Condition: same state and unlocked (at the version read) - keeps "one claim per waiting
/// period": of two schedulers holding the same work message only one wins, and a duplicate work
/// message arriving while a step is out is rejected.
///
/// A step never sent yet is routed first ([`Router`]): the conditions in front of it may skip
/// it (and what follows), end the task (every step passed) or fail it (a condition that cannot
/// be decided).
pub fn claim(
    r: &StateRecord,
    instance: &str,
    now: DateTime<Utc>,
    p: &Policies,
    router: &dyn Router,
) -> Result<Transition, Rejection> {
    let claim_one = |seen: &StateRecord, by: &str| claim(seen, by, now, p, router);
    if let Some(deadline) = r.task_deadline_applies().filter(|d| *d <= to_millis(now)) {
        // The supervisor fails the task: its due key is the deadline.
        return Err(Rejection::PastDeadline { deadline });
    }
    if let Some(until) = r
        .start_at
        .filter(|s| *s > to_millis(now) && r.process_state == ProcessState::Pending)
    {
        // A delayed start: the work message came early; it is sent on.
        return Err(Rejection::TooEarly { until });
    }
    if r.fanout.is_some() && r.branch().is_none() {
        return branches::claim(r, instance, now, p, &claim_one);
    }
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
    let condition = Condition::on(r, vec![Guard::StateIs(r.process_state), Guard::Unlocked]);
    n.requeues = 0;
    let mut at = r.step_index;
    let main_line = r.branch().is_none();
    // A forEach step's element is the step itself: nothing opens there.
    let element = r.element().is_some();
    if !undo && !r.steps[at].sent {
        match router.route(r, at) {
            Ok(route) => {
                take(&mut n, &route);
                at = route.next;
            }
            Err(e) => {
                take(&mut n, &e.route);
                let effects = condition_failed(&mut n, e.step, &e.error, now, p);
                tidy(&mut n);
                return Ok(Transition::from(r, condition, n, effects));
            }
        }
        n.step_index = at;
        if at >= n.end() {
            let e = finish(&mut n, ProcessState::Processed, NoticeKind::Processed);
            log(&mut n, r.process_state, None, "every step passed");
            tidy(&mut n);
            return Ok(Transition::from(r, condition, n, e));
        }
        match (!element)
            .then(|| group_at(router, &n, at, main_line))
            .flatten()
        {
            Some(Ok(group)) => {
                let effects = enter(&mut n, at, group, instance, now, p, router);
                if !main_line {
                    // A branch's forEach step: its elements joined the branch's group, whose
                    // write settles them.
                    tidy(&mut n);
                    return Ok(Transition::from(r, condition, n, effects));
                }
                return Ok(branches::written(r, n, effects, now, p, &claim_one));
            }
            Some(Err(error)) => {
                let effects = condition_failed(&mut n, at, &error, now, p);
                tidy(&mut n);
                return Ok(Transition::from(r, condition, n, effects));
            }
            None => {}
        }
    }
    // A wait step never goes to an agent: reached (or claimed again), it waits.
    if let Some(until) = (!undo).then(|| router.wait_until(&n, at, now)).flatten() {
        let effects = match until {
            Ok(until) => {
                n.locked_by = Some(instance.to_owned());
                n.attempt = r.attempt + 1;
                reach_wait(
                    &mut n,
                    at,
                    until,
                    now,
                    r.process_state,
                    router.events(at),
                    p,
                )
            }
            Err(error) => condition_failed(&mut n, at, &error, now, p),
        };
        tidy(&mut n);
        return Ok(Transition::from(r, condition, n, effects));
    }
    n.locked_by = Some(instance.to_owned());
    n.attempt = r.attempt + 1;
    n.complete_by = Some(p.at(at).dispatch_deadline(now));
    if undo {
        n.set_undo(at, Some(StepStatus::Running));
    } else {
        n.process_state = ProcessState::Processing;
        let step = &mut n.steps[at];
        step.status = StepStatus::Running;
        step.sent = true;
    }
    log(
        &mut n,
        r.process_state,
        Some(at),
        if undo { "undo claimed" } else { "claimed" },
    );
    tidy(&mut n);
    Ok(Transition::from(
        r,
        condition,
        n,
        vec![Effect::SendStepRequest],
    ))
}

/// What opens at step `at`, if anything: a parallel group (on the main line only), or a
/// forEach step over its list (`Err`: why the list cannot be run, which fails the step).
enum Group {
    Parallel(super::route::Parallel),
    Each(super::route::EachPlan),
}

fn group_at(
    router: &dyn Router,
    n: &StateRecord,
    at: usize,
    main_line: bool,
) -> Option<Result<Group, String>> {
    if let Some(g) = router.parallel(at).filter(|_| main_line) {
        return Some(Ok(Group::Parallel(g)));
    }
    router.for_each(n, at).map(|plan| plan.map(Group::Each))
}

/// Opens `group` at step `at`: its branches (or a forEach's first elements) are claimed by
/// `instance` in this write.
fn enter(
    n: &mut StateRecord,
    at: usize,
    group: Group,
    instance: &str,
    now: DateTime<Utc>,
    p: &Policies,
    router: &dyn Router,
) -> Vec<Effect> {
    n.locked_by = Some(instance.to_owned());
    let claim_one = |seen: &StateRecord, by: &str| claim(seen, by, now, p, router);
    match group {
        Group::Parallel(g) => branches::fan_out(n, &g, instance, now, p, &claim_one),
        Group::Each(plan) => branches::fan_out_each(n, at, plan, instance, now, p, &claim_one),
    }
}

/// The condition in front of step `i` could not be decided (`error`): the step fails as one
/// whose request cannot be built does (it had no effect), and with it the task.
fn condition_failed(
    n: &mut StateRecord,
    i: usize,
    error: &str,
    now: DateTime<Utc>,
    p: &Policies,
) -> Vec<Effect> {
    n.step_index = i;
    let attempt = n.attempt;
    step_failed(n, i, attempt, StepStatus::Failed, error, now, p)
}

/// `t` with the claim its work message would bring, made in the same write. `t` hands the
/// task back (`Pending`) with a work message due at once, which a scheduler would read and
/// claim: the claim is made here on `t`'s record instead, and written with it under `t`'s
/// condition, both history lines kept, `t`'s other effects first, then the claim's (its step's
/// request, a wait's timer). One write instead of two, and no work message, read or scheduler
/// invocation between them. A crash after the write leaves the step claimed with its deadline
/// in the due index, as a claim whose request was lost.
///
/// Only the way forward is claimed so: the end of a wait (its time, or its event), an event
/// kept for the next step. `t` goes as it is where it recovers something (a retry, a lost
/// pickup, a deferral: its claim stays the scheduler's, after its delay), and where that claim
/// is not what would come next, or would not leave the task running: a delayed work message, a
/// task at its gate (its admission is a transaction of its own), a claim refused (the task's
/// deadline passed, an undo not yet due), or one that ends the task (its notice is the
/// scheduler's to deliver).
pub fn claimed_in_place(
    r: &StateRecord,
    t: Transition,
    instance: &str,
    now: DateTime<Utc>,
    p: &Policies,
    router: &dyn Router,
) -> Transition {
    if !goes_on_at_once(r, &t) {
        return t;
    }
    let Ok(c) = claim(&t.record, instance, now, p, router) else {
        return t;
    };
    if c.record.process_state != ProcessState::Processing {
        return t;
    }
    // One write: the version `t` would have written.
    let mut record = c.record;
    record.version = t.record.version;
    let effects = t
        .effects
        .into_iter()
        .filter(|e| !at_once(e))
        .chain(c.effects)
        .collect();
    Transition::from(r, t.condition, record, effects)
}

/// A work message due now.
fn at_once(e: &Effect) -> bool {
    matches!(e, Effect::Enqueue { delay } if *delay <= Duration::zero())
}

/// Whether `t` (from `r`) sends the task on at once, the way forward and no recovery: what
/// [`claimed_in_place`] may claim (a process reads the task for it only then).
pub fn goes_on_at_once(r: &StateRecord, t: &Transition) -> bool {
    let recovers = t.record.failure_count != r.failure_count
        || t.record.round != r.round
        || t.record.requeues != r.requeues
        || t.record.deferrals != r.deferrals;
    t.record.process_state == ProcessState::Pending
        && !recovers
        && t.effects.iter().any(at_once)
        && !t.record.gate.as_ref().is_some_and(|g| g.waits())
}

/// An agent's reply arrived for (`attempt`, `step_index`); `undo` says whether it answers the
/// step itself or its undo. Dispatches on the outcome: not now ([`deferred`]), out of time
/// ([`hand_back`]), a callback step's acceptance or heartbeat ([`accepted`], [`heartbeat`]),
/// an undo's answer ([`apply_undo_reply`]), or the step's own answer ([`step_done`],
/// [`step_refused`], [`step_failed`]).
///
/// Condition: same state, attempt and step (at the version read) - keeps "a reply counts only
/// for the claim and step it answers": a stale reply from before a recovery, a reply to a step
/// of a cancelled task, or a duplicate of a reply already applied, changes nothing.
///
/// `router` decides the way to the next step once this one is done ([`Router`]).
#[allow(clippy::too_many_arguments)]
pub fn apply_reply(
    r: &StateRecord,
    attempt: u64,
    step_index: usize,
    undo: bool,
    outcome: &StepOutcome,
    now: DateTime<Utc>,
    p: &Policies,
    router: &dyn Router,
) -> Result<Transition, Rejection> {
    if r.fanout.is_some() && r.branch().is_none() {
        let event = |seen: &StateRecord| {
            apply_reply(seen, attempt, step_index, undo, outcome, now, p, router)
        };
        let claim_one = |seen: &StateRecord, by: &str| claim(seen, by, now, p, router);
        return branches::reply(r, attempt, step_index, now, p, &event, &claim_one);
    }
    if p.at(step_index).wait {
        // No request goes out for a wait step: nothing can answer it (keeps "a wait ends at
        // its time, or with its task").
        return Err(Rejection::AWait(step_index));
    }
    answers(r, attempt, step_index, undo)?;
    let now = to_millis(now);
    let mut n = next(r, now);
    if !matches!(outcome, StepOutcome::Deferred { .. }) {
        // The service answered: the next outage's deferrals start short again.
        n.deferrals = 0;
    }
    let i = step_index;
    let effects = match (outcome, undo) {
        (
            StepOutcome::Deferred {
                until,
                misconfigured,
                paused,
                limited,
            },
            _,
        ) => deferred(
            r,
            &mut n,
            *until,
            Why {
                misconfigured: misconfigured.as_deref(),
                paused: paused.as_deref(),
                limited: limited.as_deref(),
            },
            now,
            p,
        ),
        (StepOutcome::TimedOut { error }, _) => {
            let reason = format!("{}: {error} (attempt {attempt})", subject(r));
            timed_out(r, &mut n, now, p, stable_jitter(r), reason)
        }
        (StepOutcome::Accepted, true) => undo_accepted(r, &mut n, now, p)?,
        (StepOutcome::Heartbeat, true) => return Err(Rejection::NotACallbackStep(i)),
        (StepOutcome::Accepted, false) => accepted(r, &mut n, now, p)?,
        (StepOutcome::Heartbeat, false) => heartbeat(r, &mut n, now, p)?,
        (StepOutcome::Refused { code, message }, true) => {
            apply_undo_reply(&mut n, i, Some(&format!("{code}: {message}")), now, p)
        }
        (StepOutcome::Failed { error }, true) => apply_undo_reply(&mut n, i, Some(error), now, p),
        // An undo that took effect but whose answer is unusable still undid the step.
        (StepOutcome::Succeeded { .. } | StepOutcome::Faulted { .. }, true) => {
            apply_undo_reply(&mut n, i, None, now, p)
        }
        (StepOutcome::Succeeded { result }, false) => {
            step_done(&mut n, i, attempt, result, now, p, router)
        }
        (StepOutcome::Refused { code, message }, false) => {
            step_refused(&mut n, i, attempt, code, message, now, p)
        }
        (StepOutcome::Faulted { error }, false) => {
            step_failed(&mut n, i, attempt, StepStatus::Faulted, error, now, p)
        }
        (StepOutcome::Failed { error }, false) => {
            step_failed(&mut n, i, attempt, StepStatus::Failed, error, now, p)
        }
    };
    tidy(&mut n);
    Ok(Transition::from(
        r,
        Condition::on_step(r, step_index),
        n,
        effects,
    ))
}

/// Whether a reply for (`attempt`, `step_index`, `undo`) answers what `r` waits for: a step
/// (Processing) or an undo (Compensating, claimed), under the current attempt and step.
fn answers(r: &StateRecord, attempt: u64, step_index: usize, undo: bool) -> Result<(), Rejection> {
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
        return Err(wrong_step(r, step_index));
    }
    Ok(())
}

/// What the current step of `r` is doing, for history lines: its name, or `undo of` it.
fn subject(r: &StateRecord) -> String {
    let name = &r.steps[r.step_index].name;
    if r.process_state == ProcessState::Compensating {
        format!("undo of {name}")
    } else {
        name.clone()
    }
}

/// The step (or undo) could not be done now, to be tried again no earlier than `until`: its
/// service's circuit is open ([`defer`]), or, `misconfigured`, the service answered every try of
/// the attempt as misconfigured while its breaker stayed closed. Then only this task's request
/// may be wrong, or the whole service (an expired credential at low traffic, where too few
/// tasks reach the breaker): no failure of the task, so no compensation, but a bound. The step
/// waits, deferred; at its failure threshold of such attempts it stops in Error with the alert,
/// for an operator to mend and retry. An undo so answered fails its attempt ([`hand_back`]),
/// and ends CompensationFailed, with the alert, within its threshold.
fn deferred(
    r: &StateRecord,
    n: &mut StateRecord,
    until: DateTime<Utc>,
    Why {
        misconfigured,
        paused,
        limited,
    }: Why<'_>,
    now: DateTime<Utc>,
    p: &Policies,
) -> Vec<Effect> {
    let what = subject(r);
    if let (None, Some(limit)) = (misconfigured, limited) {
        return defer_over_limit(
            r,
            n,
            now,
            p,
            format!("{what}: {limit}"),
            wait_of(until, now),
        );
    }
    let wait = (until - now).max(Duration::zero());
    let undo = r.process_state == ProcessState::Compensating;
    match misconfigured {
        Some(error) if !undo => {
            let i = r.step_index;
            let reason = format!("{what}: {error} (attempt {})", r.attempt);
            let count = r.steps[i].misconfigured.saturating_add(1);
            n.steps[i].misconfigured = count;
            let threshold = p.at(i).failure_threshold;
            if count >= threshold {
                n.locked_by = None;
                n.steps[i].status = StepStatus::Pending;
                let e = stop_in_error(n, reason.clone());
                log(
                    n,
                    r.process_state,
                    Some(i),
                    format!("misconfigured {count} times: {reason}"),
                );
                e
            } else {
                defer(
                    r,
                    n,
                    now,
                    p,
                    format!("misconfigured ({count} of {threshold}): {reason}"),
                    wait,
                )
            }
        }
        Some(error) => {
            let reason = format!("{what}: {error} (attempt {})", r.attempt);
            let jitter = stable_jitter(r);
            hand_back(r, n, now, p, jitter, "misconfigured", reason, wait)
        }
        None => {
            let reason = match paused {
                // An operator's pause: it says who and why, and the wait is until a resume.
                Some(paused) => format!("{what}: {paused}"),
                None => format!(
                    "{what}: circuit open until {}",
                    until.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
                ),
            };
            defer(r, n, now, p, reason, wait)
        }
    }
}

/// A callback step's service accepted the running step: it waits for the callback, until the
/// callback timeout (or, with heartbeats, the first heartbeat's deadline if sooner).
fn accepted(
    r: &StateRecord,
    n: &mut StateRecord,
    now: DateTime<Utc>,
    p: &Policies,
) -> Result<Vec<Effect>, Rejection> {
    let i = r.step_index;
    let Some(cb) = p.at(i).callback else {
        return Err(Rejection::NotACallbackStep(i));
    };
    if r.steps[i].status != StepStatus::Running {
        return Err(Rejection::NotRunning(r.process_state));
    }
    let until = now + cb.timeout;
    let step = &mut n.steps[i];
    step.status = StepStatus::Waiting;
    step.waiting_until = Some(until);
    n.complete_by = Some(cb.heartbeat.map_or(until, |h| until.min(now + h)));
    log(
        n,
        r.process_state,
        Some(i),
        "accepted; waiting for its callback",
    );
    Ok(vec![])
}

/// An undo that answers later was accepted by its agent (a sub-workflow step's: its child's
/// compensation started): it may now take the step's `undo_timeout`. A copy of the acceptance
/// (the request delivered twice) moves the deadline on by the time between the two.
fn undo_accepted(
    r: &StateRecord,
    n: &mut StateRecord,
    now: DateTime<Utc>,
    p: &Policies,
) -> Result<Vec<Effect>, Rejection> {
    let i = r.step_index;
    let Some(t) = p.at(i).undo_timeout else {
        return Err(Rejection::NotACallbackStep(i));
    };
    if r.process_state != ProcessState::Compensating || r.steps[i].undo != Some(StepStatus::Running)
    {
        return Err(Rejection::NotRunning(r.process_state));
    }
    n.complete_by = Some(now + t);
    log(
        n,
        r.process_state,
        Some(i),
        "undo accepted; waiting for it to end",
    );
    Ok(vec![])
}

/// A waiting callback step's service is still at work: its deadline moves on by the heartbeat
/// interval, never past the callback timeout.
fn heartbeat(
    r: &StateRecord,
    n: &mut StateRecord,
    now: DateTime<Utc>,
    p: &Policies,
) -> Result<Vec<Effect>, Rejection> {
    let i = r.step_index;
    let step = &r.steps[i];
    let (Some(until), StepStatus::Waiting) = (step.waiting_until, step.status) else {
        return Err(Rejection::NotWaiting(i));
    };
    let Some(h) = p.at(i).callback.and_then(|c| c.heartbeat) else {
        return Err(Rejection::NoHeartbeat(i));
    };
    // No history line: heartbeats would push the transitions out of it.
    n.complete_by = Some(until.min(now + h));
    Ok(vec![])
}

/// Step `i` succeeded under `attempt` with `result`. From Processing the next step goes out at
/// once under the same claim; from Pending or Error (a step handed back for another attempt, or
/// failed waiting, and completed by its callback meanwhile) the next step waits for a claim,
/// enqueued now. The way to the next step is routed ([`Router`]) when it goes out at once, and
/// by the claim otherwise.
#[allow(clippy::too_many_arguments)]
fn step_done(
    n: &mut StateRecord,
    i: usize,
    attempt: u64,
    result: &Option<String>,
    now: DateTime<Utc>,
    p: &Policies,
    router: &dyn Router,
) -> Vec<Effect> {
    let from = n.process_state;
    // The step is done: the next one counts its own expired deadlines against its own
    // threshold (`failureThreshold` is a step's). From Error (a late callback: the failure was
    // the wait for this outcome) the task starts afresh the same way.
    n.failure_count = 0;
    n.round = 0;
    let step = &mut n.steps[i];
    step.finished_attempt = Some(attempt);
    step.finished_at = Some(now);
    step.status = StepStatus::Done;
    step.result = result.clone();
    // The task moved on: an error of an earlier attempt is history now (its line stays there).
    n.last_error = None;
    let routed = if from == ProcessState::Processing {
        router.route(n, i + 1)
    } else {
        Linear.route(n, i + 1)
    };
    let route = match routed {
        Ok(route) => route,
        Err(e) => {
            take(n, &e.route);
            let mut effects = vec![p.at(i).progress(NoticeKind::StepCompleted)];
            effects.extend(condition_failed(n, e.step, &e.error, now, p));
            return effects;
        }
    };
    take(n, &route);
    n.step_index = route.next;
    let progress = p.at(i).progress(NoticeKind::StepCompleted);
    if n.step_index >= n.end() {
        let mut e = finish(n, ProcessState::Processed, NoticeKind::Processed);
        if n.branch().is_some() {
            // The end of a branch, not of the task.
            e.insert(0, progress);
        }
        let end = end_line(n);
        log(n, from, Some(i), format!("step done; {end}"));
        return e;
    }
    if n.fanout.as_ref().is_some_and(|f| f.stop.is_some()) {
        // The branch's group is stopping: its next step is not sent.
        n.process_state = ProcessState::Pending;
        n.locked_by = None;
        n.complete_by = None;
        log(n, from, Some(i), "step done; the group stops");
        return vec![progress];
    }
    if from == ProcessState::Processing && n.task_deadline_applies().is_some_and(|d| d <= now) {
        // Past the task's deadline nothing more goes out: the supervisor fails the task (its
        // due key is the deadline).
        n.process_state = ProcessState::Pending;
        n.locked_by = None;
        n.complete_by = Some(now + p.at(n.step_index).pickup_timeout);
        log(n, from, Some(i), "step done; the task's deadline passed");
        return vec![progress];
    }
    let at = n.step_index;
    let main_line = n.branch().is_none();
    // (An element's step is its whole line: it never gets here.)
    let opens = from == ProcessState::Processing && n.element().is_none();
    match opens.then(|| group_at(router, n, at, main_line)).flatten() {
        Some(Ok(group)) => {
            // The group (or, in a branch, a forEach step's elements) goes out under the
            // claim that sent this step.
            let instance = n.locked_by.clone().unwrap_or_default();
            log(n, from, Some(i), "step done");
            let mut effects = vec![progress];
            effects.extend(enter(n, at, group, &instance, now, p, router));
            if main_line {
                effects.extend(branches::settle(n, now, p));
            }
            return effects;
        }
        Some(Err(error)) => {
            let mut effects = vec![progress];
            effects.extend(condition_failed(n, at, &error, now, p));
            return effects;
        }
        None => {}
    }
    if from != ProcessState::Processing {
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
    if let Some(until) = router.wait_until(n, at, now) {
        // A wait step: it waits under the claim that sent this step.
        let mut effects = vec![progress];
        match until {
            Ok(until) => {
                log(n, from, Some(i), "step done");
                effects.extend(reach_wait(n, at, until, now, from, router.events(at), p));
            }
            Err(error) => effects.extend(condition_failed(n, at, &error, now, p)),
        }
        return effects;
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
    let reason = format!("{name}: {code}: {message}");
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
    let e = if n.branch().is_some() {
        stop_branch(n, StopKind::Refused, reason.clone())
    } else if n.past_pivot() {
        // Past the pivot the task cannot go back: a person must decide (alert).
        fail(n, now, reason.clone(), p, None)
    } else {
        begin_compensation(n, now, Duration::zero(), p, None)
    };
    log(n, from, Some(i), format!("refused: {reason}"));
    e
}

/// A callback arrived for step `step_index` under its key's `generation` (see
/// [`callback_token`](super::super::state::callback_token)): the outcome of the service's first acceptance of the
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
    router: &dyn Router,
) -> Result<Transition, Rejection> {
    if r.fanout.is_some() && r.branch().is_none() {
        let event = |seen: &StateRecord| {
            apply_callback(seen, step_index, generation, outcome, now, p, router)
        };
        let claim_one = |seen: &StateRecord, by: &str| claim(seen, by, now, p, router);
        return branches::callback(r, step_index, now, p, &event, &claim_one);
    }
    let Some(step) = r
        .steps
        .get(step_index)
        .filter(|_| r.step_index == step_index)
    else {
        return Err(wrong_step(r, step_index));
    };
    if step.generation != generation {
        return Err(Rejection::StaleGeneration {
            record: step.generation,
            message: generation,
        });
    }
    // A callback succeeds, refuses, or beats. `Faulted` comes from sas's own callers only (a
    // run or a child that took effect and could not undo it: the step failed and is undone
    // with its task); the task API's callbacks never build one.
    if p.at(step_index).callback.is_none()
        || !matches!(
            outcome,
            StepOutcome::Succeeded { .. }
                | StepOutcome::Refused { .. }
                | StepOutcome::Faulted { .. }
                | StepOutcome::Heartbeat
        )
    {
        return Err(Rejection::NotACallbackStep(step_index));
    }
    match (r.process_state, step.status) {
        (ProcessState::Processing, StepStatus::Running | StepStatus::Waiting) => {
            apply_reply(r, r.attempt, step_index, false, outcome, now, p, router)
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
                    step_done(&mut n, step_index, r.attempt, result, now, p, router)
                }
                StepOutcome::Refused { code, message } => {
                    step_refused(&mut n, step_index, r.attempt, code, message, now, p)
                }
                // What the step started took effect and could not undo itself (or its result
                // cannot be kept): the step failed, at once, as it would while out.
                StepOutcome::Faulted { error } => step_failed(
                    &mut n,
                    step_index,
                    r.attempt,
                    StepStatus::Faulted,
                    error,
                    now,
                    p,
                ),
                _ => return Err(Rejection::NotWaiting(step_index)),
            };
            tidy(&mut n);
            Ok(Transition::from(
                r,
                Condition::on_step(r, step_index),
                n,
                effects,
            ))
        }
        (state, _) => Err(Rejection::NotRunning(state)),
    }
}

/// Step `i` ended for good as `status` (`Failed`: sas could not build its request; `Faulted`:
/// its answer is unusable) under `attempt`, with `error`: the task fails.
fn step_failed(
    n: &mut StateRecord,
    i: usize,
    attempt: u64,
    status: StepStatus,
    error: &str,
    now: DateTime<Utc>,
    p: &Policies,
) -> Vec<Effect> {
    let from = n.process_state;
    let how = if status == StepStatus::Faulted {
        "faulted"
    } else {
        "refused"
    };
    let step = &mut n.steps[i];
    let reason = format!("{}: {error}", step.name);
    step.finished_attempt = Some(attempt);
    step.finished_at = Some(now);
    step.status = status;
    let e = fail(n, now, reason.clone(), p, None);
    log(n, from, Some(i), format!("{how}: {reason}"));
    e
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
    if r.branch().is_none()
        && r.task_deadline_applies()
            .is_some_and(|d| d <= to_millis(now))
    {
        return deadline::deadline_passed(r, now, p);
    }
    if r.fanout.is_some() && r.branch().is_none() {
        let event = |seen: &StateRecord| expire(seen, now, p, jitter);
        // (No element is claimed by the supervisor: its work messages are.)
        let claim_none = |_: &StateRecord, _: &str| Err(Rejection::NotClaimable(r.process_state));
        return branches::expire(r, now, p, &event, &claim_none);
    }
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
    let effects =
        if r.locked_by.is_some() && r.process_state == ProcessState::Processing && p.at(i).wait {
            if p.at(i).event {
                // A wait for an event passed its time: it failed.
                event_timed_out(&mut n, i, due, now, p)
            } else {
                // A wait step's deadline is its time: it is done.
                woke(&mut n, i, due, now, p)
            }
        } else if r.locked_by.is_none()
            && r.process_state == ProcessState::Pending
            && r.start_at == Some(due)
        {
            // A delayed start's time came (a start more than a work message's delay ahead
            // rides the due index): not a missed pickup.
            n.complete_by = Some(now + p.at(i).pickup_timeout);
            log(&mut n, r.process_state, None, "its start time came");
            vec![Effect::Enqueue {
                delay: Duration::zero(),
            }]
        } else if r.locked_by.is_none() {
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
            timed_out(r, &mut n, now, p, jitter, reason)
        };
    tidy(&mut n);
    Ok(Transition::from(r, Condition::on(r, guards), n, effects))
}

/// A step (or undo) timed out: [`hand_back`] with no minimum wait.
fn timed_out(
    r: &StateRecord,
    n: &mut StateRecord,
    now: DateTime<Utc>,
    p: &Policies,
    jitter: f64,
    reason: String,
) -> Vec<Effect> {
    hand_back(r, n, now, p, jitter, "timed out", reason, Duration::zero())
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
            n.set_undo(i, None);
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
        n.set_undo(i, Some(StepStatus::TimedOut));
        let e = finish(
            n,
            ProcessState::CompensationFailed,
            NoticeKind::CompensationFailed,
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
    let deferrals = r.deferrals.saturating_add(1);
    let delay = wait.max(p.at(r.step_index).retry_delay(deferrals, stable_jitter(r)))
        + Duration::milliseconds((stable_jitter(r) * 1000.0) as i64);
    back_to_pending(r, n, now, p, reason, delay)
}

/// Hands the step (or undo) that was out back unlocked, Pending, to be claimed again after
/// `delay` (its deadline moved by it), one more deferral in a row: what [`defer`] and
/// [`defer_over_limit`] share.
fn back_to_pending(
    r: &StateRecord,
    n: &mut StateRecord,
    now: DateTime<Utc>,
    p: &Policies,
    reason: String,
    delay: Duration,
) -> Vec<Effect> {
    let i = r.step_index;
    n.locked_by = None;
    n.last_error = Some(reason.clone());
    if r.process_state == ProcessState::Compensating {
        n.set_undo(i, None);
    } else {
        keep_sent_until(r, n);
        n.process_state = ProcessState::Pending;
        n.steps[i].status = StepStatus::Pending;
    }
    n.deferrals = r.deferrals.saturating_add(1);
    n.complete_by = Some(now + delay + p.at(i).pickup_timeout);
    log(n, r.process_state, Some(i), format!("deferred: {reason}"));
    vec![Effect::Enqueue { delay }]
}

/// Why a step was deferred (see [`StepOutcome::Deferred`]).
struct Why<'a> {
    misconfigured: Option<&'a str>,
    paused: Option<&'a str>,
    limited: Option<&'a str>,
}

/// How long from `now` until `until` (nothing if past).
fn wait_of(until: DateTime<Utc>, now: DateTime<Utc>) -> Duration {
    (until - now).max(Duration::zero())
}

/// The longest a step over its service's limit waits before it tries again.
pub const LIMIT_WAIT_CAP: Duration = Duration::seconds(10);

/// The step's call would have gone over its service's limit (nothing was called): it goes back
/// to Pending, to be tried again after `wait` (when the agent says a slot or a token is due)
/// or, the more often it was turned away, longer (doubling from a quarter second, at most
/// [`LIMIT_WAIT_CAP`], jittered per task): many steps waiting on one limit spread out instead
/// of coming back together. An urgent task's step does not back off: it asks again within a
/// quarter second each time, so it takes the next free slot before the normal steps that wait
/// longer. Not the step's retry policy (nothing failed: no failure counted), and its deadline
/// moves with the wait, as a start's does.
fn defer_over_limit(
    r: &StateRecord,
    n: &mut StateRecord,
    now: DateTime<Utc>,
    p: &Policies,
    reason: String,
    wait: Duration,
) -> Vec<Effect> {
    let turned_away = match r.priority {
        crate::domain::Priority::Urgent => 0,
        crate::domain::Priority::Normal => r.deferrals.min(7),
    };
    let grown = Duration::milliseconds(250) * (1i32 << turned_away);
    let spread =
        grown.min(LIMIT_WAIT_CAP).num_milliseconds() as f64 * (0.5 + stable_jitter(r) / 2.0);
    let delay = wait.max(Duration::milliseconds(spread as i64));
    back_to_pending(r, n, now, p, reason, delay)
}

/// A stable number in [0, 1) from a task and attempt: the jitter of transitions that have no
/// randomness passed in (spreads the retries of tasks deferred by the same open circuit).
fn stable_jitter(r: &StateRecord) -> f64 {
    let b = r.task_id.as_uuid().into_bytes();
    let x = u32::from_be_bytes([b[0], b[1], b[2], b[3]])
        .wrapping_add((r.attempt as u32).wrapping_mul(2_654_435_761));
    f64::from(x) / (f64::from(u32::MAX) + 1.0)
}

/// An operator resumed `service`: every step (or undo) of the task that waits for its pause,
/// on the main line, in a parallel group's branch or as a forEach element, may be claimed now
/// rather than at its next look ([`PAUSE_RECHECK`](crate::domain::breaker::PAUSE_RECHECK));
/// a work message, now, claims them. A step waits for the pause when its deferral says so
/// (its `lastError` names the pause: [`paused_by`](crate::domain::breaker::paused_by)).
///
/// Condition: the version read - keeps "only a step still deferred for the pause is moved": a
/// claim in between (its own next look) makes this read again, and find nothing to move.
pub fn resumed(
    r: &StateRecord,
    service: &str,
    now: DateTime<Utc>,
    p: &Policies,
) -> Result<Transition, Rejection> {
    let now = to_millis(now);
    let mark = crate::domain::breaker::paused_by(service);
    let waits = |e: &Option<String>| e.as_deref().is_some_and(|e| e.contains(&mark));
    let not_paused = || Rejection::NotPaused(service.to_owned());
    let mut n = next(r, now);
    if r.fanout.is_some() {
        if !branches::ready_now(&mut n, &waits, now, p) {
            return Err(not_paused());
        }
    } else {
        let deferred = match r.process_state {
            ProcessState::Pending => true,
            ProcessState::Compensating => r.locked_by.is_none(),
            _ => false,
        };
        if !deferred || !waits(&r.last_error) {
            return Err(not_paused());
        }
        n.complete_by = Some(now + p.at(r.step_index).pickup_timeout);
    }
    Ok(Transition::from(
        r,
        Condition::on(r, vec![]),
        n,
        vec![Effect::Enqueue {
            delay: Duration::zero(),
        }],
    ))
}

/// The outbox was delivered: clear it, which also takes a terminal record out of the due index;
/// a final task's `retention` starts, and one with payloads kept by reference stays due for its
/// purge at the retention's end ([`StateRecord::purge_at`]).
///
/// Condition: a notice is still owed (at the version read) - keeps "the outbox is cleared only
/// after a delivery of exactly what it held".
pub fn notice_delivered(
    r: &StateRecord,
    now: DateTime<Utc>,
    retention: Option<Duration>,
) -> Result<Transition, Rejection> {
    if !r.notice_pending() {
        return Err(Rejection::NoNoticeOwed);
    }
    let now = to_millis(now);
    let mut n = next(r, now);
    n.outbox.clear();
    // Its final notice goes with its leave of its gate (made before this write).
    if let Some(g) = n.gate.as_mut().filter(|g| g.leave_owed(r.process_state)) {
        g.status = super::super::state::GateStatus::Left;
    }
    if r.process_state.is_final() && r.payloads && !r.held_by_parent() {
        n.purge_at = retention.map(|keep| now + keep);
    }
    tidy(&mut n);
    Ok(Transition::from(
        r,
        Condition::on(r, vec![Guard::NoticePending]),
        n,
        vec![],
    ))
}

/// A task whose gate is full, or before which others wait, parks there: `Pending` with no
/// pickup deadline (so not due, and no work message comes back for it), until the leave of a
/// task before it sends it on ([`crate::ports::Gates::leave`]).
pub fn park(r: &StateRecord, now: DateTime<Utc>) -> Result<Transition, Rejection> {
    use super::super::state::GateStatus;
    let waits = r
        .gate
        .as_ref()
        .is_some_and(|g| g.status == GateStatus::InLine);
    if r.process_state != ProcessState::Pending || !waits {
        return Err(Rejection::NotClaimable(r.process_state));
    }
    let mut n = next(r, to_millis(now));
    if let Some(g) = n.gate.as_mut() {
        g.status = GateStatus::Parked;
    }
    n.complete_by = None;
    n.requeues = 0;
    tidy(&mut n);
    Ok(Transition::from(r, Condition::on(r, vec![]), n, vec![]))
}

/// The rejection of a message about step `step_index` while the record is at another.
fn wrong_step(r: &StateRecord, step_index: usize) -> Rejection {
    Rejection::WrongStep {
        record: r.step_index,
        message: step_index,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::state::{CallbackFence, callback_token, check_callback_token};
    use crate::domain::transition::testkit::*;
    use crate::domain::transition::*;

    #[test]
    fn an_error_of_an_earlier_attempt_clears_once_the_step_is_done() {
        let p = policy();
        let now = t0();
        let mut r = fresh(now);
        apply(&mut r, |r| claim(r, "s-1", now, &p, &Linear));
        let late = now + Duration::seconds(11);
        apply(&mut r, |r| expire(r, late, &p, 0.0));
        assert!(
            r.last_error
                .as_deref()
                .is_some_and(|e| e.contains("no reply")),
            "{r:?}"
        );
        let again = late + Duration::seconds(40);
        apply(&mut r, |r| claim(r, "s-1", again, &p, &Linear));
        apply(&mut r, |r| {
            apply_reply(r, r.attempt, 0, false, &ok(), again, &p, &Linear)
        });
        assert_eq!(r.last_error, None, "the task moved on");
        assert!(
            r.history.iter().any(|h| h.reason.contains("no reply")),
            "the error stays in the history"
        );
    }

    /// A task with a result past the inline size is marked for good (a later step's small
    /// result, or none, does not clear it); once final and its notice out, it is due at its
    /// retention's end for its purge, and its items expire two days after that. A task without
    /// one leaves the due index and expires at the retention by the TTL alone.
    #[test]
    fn a_task_with_a_large_result_stays_due_for_its_purge_at_the_retention_end() {
        use crate::domain::state::PURGE_GRACE;
        let p = policy();
        let now = t0();
        let keep = Duration::days(30);
        let run = |first: String| {
            let mut r = fresh(now);
            apply(&mut r, |r| claim(r, "s-1", now, &p, &Linear));
            for (i, result) in [first, "{}".into(), "{}".into()].into_iter().enumerate() {
                let outcome = StepOutcome::Succeeded {
                    result: Some(result),
                };
                apply(&mut r, |r| {
                    apply_reply(r, 1, i, false, &outcome, now, &p, &Linear)
                });
            }
            assert_eq!(r.process_state, ProcessState::Processed);
            r
        };
        let large = format!(
            "\"{}\"",
            "x".repeat(crate::domain::payload::INLINE_PAYLOAD_BYTES)
        );
        let mut r = run(large);
        assert!(
            r.payloads,
            "marked at the large result, kept through the later steps"
        );
        assert_eq!(r.purge_at, None, "not before its notice is out");
        let later = now + Duration::seconds(5);
        apply(&mut r, |r| notice_delivered(r, later, Some(keep)));
        let end = to_millis(later) + keep;
        assert_eq!(r.purge_at, Some(end));
        assert_eq!(r.due_at(), Some(end), "due for its purge");
        assert!(r.due_key.is_some_and(|k| k <= end));
        assert!(!r.purge_due(end - Duration::milliseconds(1)) && r.purge_due(end));
        assert_eq!(r.expires_at(Some(keep)), Some(end + PURGE_GRACE));
        r.check(&p)
            .expect("a purge time on a final record with payloads");
        let mut stray = r.clone();
        stray.payloads = false;
        assert!(
            stray.check(&p).is_err(),
            "no purge for a task without payloads"
        );

        let mut small = run("{}".into());
        assert!(!small.payloads);
        apply(&mut small, |r| notice_delivered(r, later, Some(keep)));
        assert_eq!((small.purge_at, small.due_at()), (None, None));
        assert_eq!(small.expires_at(Some(keep)), Some(to_millis(later) + keep));
        assert!(!small.purge_due(end + Duration::days(365)));
    }

    #[test]
    fn the_happy_path_claims_runs_every_step_and_owes_a_notice() {
        let p = policy();
        let now = t0();
        let mut r = fresh(now);
        let t = apply(&mut r, |r| claim(r, "s-1", now, &p, &Linear));
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
                    &Linear,
                )
            });
            if i < 2 {
                assert_eq!(
                    t.effects,
                    [
                        Effect::Progress(NoticeKind::StepCompleted),
                        Effect::SendStepRequest
                    ]
                );
            } else {
                assert_eq!(t.effects, [Effect::DeliverNotice]);
            }
        }
        assert_eq!(r.process_state, ProcessState::Processed);
        assert_eq!(r.locked_by, None);
        assert_eq!(r.owed(), [NoticeKind::Processed]);
        assert_eq!(r.steps[1].result.as_deref(), Some("{\"id\":1}"));
        // The notice's backstop waits for the key the record already has (the pickup
        // deadline): no index write.
        assert_eq!(r.due_at(), r.due_key);
        assert!(r.due_at() > Some(r.updated_at));
        apply(&mut r, |r| notice_delivered(r, now, None));
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
        apply(&mut r, |r| claim(r, "s-1", now, &p, &Linear));
        assert_eq!(
            claim(&r, "s-2", now, &p, &Linear).err(),
            Some(Rejection::NotClaimable(ProcessState::Processing))
        );
        apply(&mut r, |r| {
            apply_reply(r, 1, 0, false, &ok(), now, &p, &Linear)
        });
        assert!(matches!(
            apply_reply(&r, 1, 0, false, &ok(), now, &p, &Linear),
            Err(Rejection::WrongStep {
                record: 1,
                message: 0
            })
        ));
        assert!(matches!(
            apply_reply(&r, 1, 1, true, &ok(), now, &p, &Linear),
            Err(Rejection::WrongDirection { .. })
        ));
    }

    #[test]
    fn expiry_hands_back_with_growing_delay_then_fails_at_the_threshold() {
        let p = manual();
        let mut now = t0();
        let mut r = fresh(now);
        let mut delays = vec![];
        for round in 1..=3u32 {
            apply(&mut r, |r| claim(r, "s", now, &p, &Linear));
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
        assert_eq!(r.owed(), [NoticeKind::Failed]);
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
            apply(&mut r, |r| claim(r, "s", now, &p, &Linear));
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
        apply(&mut r, |r| claim(r, "s", now, &p, &Linear));
        now += p.at(0).step_timeout;
        apply(&mut r, |r| expire(r, now, &p, 0.5));
        apply(&mut r, |r| claim(r, "s", now, &p, &Linear));
        assert_eq!(
            apply_reply(&r, 1, 0, false, &ok(), now, &p, &Linear).err(),
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
        apply(&mut r, |r| claim(r, "s", now, &p, &Linear));
        assert_eq!(r.requeues, 0);
    }

    #[test]
    fn a_step_may_wait_for_an_agent_and_an_agent_out_of_time_hands_the_attempt_back() {
        // 10 s to run once picked up, 20 s to be picked up.
        let p = with(|p| p.start_within = Duration::seconds(20));
        let now = t0();
        let mut r = fresh(now);
        apply(&mut r, |r| claim(r, "s", now, &p, &Linear));
        assert_eq!(r.complete_by, Some(now + Duration::seconds(30)));
        // The next step's deadline allows for its wait too.
        let later = now + Duration::seconds(25);
        apply(&mut r, |r| {
            apply_reply(r, 1, 0, false, &ok(), later, &p, &Linear)
        });
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
                &Linear,
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
                &p,
                &Linear
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
                    paused: None,
                    limited: None,
                },
                now,
                &p,
                &Linear,
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
            apply(&mut r, |r| claim(r, "s", now, &p, &Linear));
            let t = apply(&mut r, |r| {
                apply_reply(
                    r,
                    a + 1,
                    1,
                    false,
                    &StepOutcome::Deferred {
                        until: soon,
                        misconfigured: None,
                        paused: None,
                        limited: None,
                    },
                    now,
                    &p,
                    &Linear,
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
        apply(&mut r, |r| claim(r, "s", now, &p, &Linear));
        apply(&mut r, |r| {
            apply_reply(r, a + 1, 1, false, &ok(), now, &p, &Linear)
        });
        assert_eq!(r.deferrals, 0);
    }

    #[test]
    fn a_step_over_its_services_limit_waits_no_failure_and_no_retry_policy() {
        let p = policy();
        let now = t0();
        let mut r = fresh(now);
        run_to(&mut r, 1, now, &p);
        let over = |until| StepOutcome::Deferred {
            until,
            misconfigured: None,
            paused: None,
            limited: Some("service#bank over its limit of 5 calls in flight".into()),
        };
        let mut delays = vec![];
        for k in 0..12 {
            let a = r.attempt;
            if k > 0 {
                apply(&mut r, |r| claim(r, "s", now, &p, &Linear));
            }
            let a = if k > 0 { a + 1 } else { a };
            let t = apply(&mut r, |r| {
                apply_reply(
                    r,
                    a,
                    1,
                    false,
                    &over(now + Duration::milliseconds(40)),
                    now,
                    &p,
                    &Linear,
                )
            });
            let [Effect::Enqueue { delay }] = t.effects[..] else {
                panic!("one enqueue: {:?}", t.effects)
            };
            assert_eq!(r.complete_by, Some(now + delay + p.at(1).pickup_timeout));
            delays.push(delay);
        }
        assert_eq!(
            (r.process_state, r.failure_count, r.steps[1].status),
            (ProcessState::Pending, 0, StepStatus::Pending),
            "a limit is no failure"
        );
        assert!(
            r.history
                .last()
                .is_some_and(|h| h.reason.contains("over its limit of 5 calls in flight")),
            "{:?}",
            r.history.last()
        );
        // Soon at first (a quarter second at most, not the 5 s retry delay), longer the more
        // often it was turned away, never past the cap.
        assert!(delays[0] >= Duration::milliseconds(40), "{delays:?}");
        assert!(delays[0] <= Duration::milliseconds(250), "{delays:?}");
        assert!(delays[4] > delays[0] * 4, "{delays:?}");
        assert!(delays.iter().all(|d| *d <= LIMIT_WAIT_CAP), "{delays:?}");
        assert!(*delays.last().unwrap() >= LIMIT_WAIT_CAP / 2, "{delays:?}");
        // An urgent task's step never backs off: within a quarter second every time.
        let mut urgent = fresh(now);
        urgent.priority = crate::domain::Priority::Urgent;
        run_to(&mut urgent, 1, now, &p);
        for k in 0..12 {
            let a = urgent.attempt;
            if k > 0 {
                apply(&mut urgent, |r| claim(r, "s", now, &p, &Linear));
            }
            let a = if k > 0 { a + 1 } else { a };
            let t = apply(&mut urgent, |r| {
                apply_reply(r, a, 1, false, &over(now), now, &p, &Linear)
            });
            let [Effect::Enqueue { delay }] = t.effects[..] else {
                panic!("one enqueue: {:?}", t.effects)
            };
            assert!(delay <= Duration::milliseconds(250), "{k}: {delay:?}");
        }
        assert_eq!(urgent.failure_count, 0);
        // The agent's time, when later than the spread, is kept.
        let a = r.attempt;
        apply(&mut r, |r| claim(r, "s", now, &p, &Linear));
        let t = apply(&mut r, |r| {
            apply_reply(
                r,
                a + 1,
                1,
                false,
                &over(now + Duration::minutes(2)),
                now,
                &p,
                &Linear,
            )
        });
        assert!(
            matches!(t.effects[..], [Effect::Enqueue { delay }] if delay == Duration::minutes(2))
        );
    }

    #[test]
    fn misconfigured_attempts_defer_the_step_then_stop_it_in_error_with_the_alert() {
        let p = policy();
        let now = t0();
        let mut r = fresh(now);
        run_to(&mut r, 1, now, &p);
        let threshold = p.at(1).failure_threshold;
        let misconfigured = StepOutcome::Deferred {
            until: now + Duration::milliseconds(50),
            misconfigured: Some("service misconfigured: HTTP 404: no such account".into()),
            paused: None,
            limited: None,
        };
        for n in 1..=threshold {
            if n > 1 {
                let at = r.complete_by.expect("pickup");
                apply(&mut r, |r| claim(r, "s", at, &p, &Linear));
            }
            let a = r.attempt;
            apply(&mut r, |r| {
                apply_reply(r, a, 1, false, &misconfigured, now, &p, &Linear)
            });
            if n < threshold {
                assert_eq!(
                    (r.process_state, r.failure_count, r.steps[1].misconfigured),
                    (ProcessState::Pending, 0, n),
                    "deferred, no failure of the task"
                );
            }
        }
        assert_eq!(
            (r.process_state, r.steps[1].status),
            (ProcessState::Error, StepStatus::Pending),
            "stopped for an operator, not compensated although compensation is automatic: {r:?}"
        );
        assert!(
            r.outbox.iter().any(|o| o.status == NoticeKind::Failed),
            "the alert is owed: {r:?}"
        );
        assert!(
            r.last_error
                .as_deref()
                .is_some_and(|e| e.contains("HTTP 404")),
            "{r:?}"
        );
        // The operator mends it and retries: the count starts again, under the same key.
        apply(&mut r, |r| retry(r, &ops(None), now, &p));
        assert_eq!(
            (
                r.process_state,
                r.steps[1].misconfigured,
                r.steps[1].generation
            ),
            (ProcessState::Pending, 0, 0)
        );
        // An undo answered so fails its attempts, and ends CompensationFailed at the threshold.
        let mut r = fresh(now);
        run_to(&mut r, 1, now, &p);
        let a = r.attempt;
        apply(&mut r, |r| {
            apply_reply(r, a, 1, false, &declined(), now, &p, &Linear)
        });
        assert_eq!(r.process_state, ProcessState::Compensating);
        for _ in 0..threshold {
            let at = r
                .complete_by
                .expect("pickup")
                .max(r.undo_after.unwrap_or(now));
            apply(&mut r, |r| claim(r, "s", at, &p, &Linear));
            let (a, i) = (r.attempt, r.step_index);
            apply(&mut r, |r| {
                apply_reply(r, a, i, true, &misconfigured, at, &p, &Linear)
            });
        }
        assert_eq!(r.process_state, ProcessState::CompensationFailed, "{r:?}");
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
            apply_reply(&r, 1, 1, false, &StepOutcome::Accepted, now, &p, &Linear).err(),
            Some(Rejection::WrongStep {
                record: 2,
                message: 1
            })
        );
        let t1 = now + Duration::seconds(1);
        apply(&mut r, |r| {
            apply_reply(r, 1, 2, false, &StepOutcome::Accepted, t1, &p, &Linear)
        });
        assert_eq!(r.steps[2].status, StepStatus::Waiting);
        assert_eq!(r.steps[2].waiting_until, Some(t1 + Duration::hours(1)));
        assert_eq!(r.complete_by, Some(t1 + Duration::minutes(5)));
        assert!(
            apply_reply(&r, 1, 2, false, &StepOutcome::Accepted, t1, &p, &Linear).is_err(),
            "a duplicate acceptance changes nothing"
        );
        let t2 = t1 + Duration::minutes(4);
        apply(&mut r, |r| {
            apply_reply(r, 1, 2, false, &StepOutcome::Heartbeat, t2, &p, &Linear)
        });
        assert_eq!(r.complete_by, Some(t2 + Duration::minutes(5)));
        let late = t1 + Duration::minutes(58);
        apply(&mut r, |r| {
            apply_reply(r, 1, 2, false, &StepOutcome::Heartbeat, late, &p, &Linear)
        });
        assert_eq!(
            r.complete_by,
            Some(t1 + Duration::hours(1)),
            "heartbeats never move the deadline past the callback timeout"
        );
        let done = StepOutcome::Succeeded {
            result: Some("{\"id\":\"c-1\"}".into()),
        };
        apply(&mut r, |r| {
            apply_reply(r, 1, 2, false, &done, late, &p, &Linear)
        });
        assert_eq!(r.steps[2].status, StepStatus::Done);
        assert_eq!(r.steps[2].waiting_until, None);
        assert!(
            apply_reply(&r, 1, 2, false, &done, late, &p, &Linear).is_err(),
            "a replayed callback is fenced"
        );
        assert_eq!(
            apply_reply(&r, 1, 3, false, &StepOutcome::Heartbeat, late, &p, &Linear).err(),
            Some(Rejection::NotWaiting(3))
        );
    }

    /// A loan whose callback step (2) its service accepted, then handed back when its wait
    /// timed out at `due`.
    fn callback_wait_timed_out(now: DateTime<Utc>, p: &Policies) -> (StateRecord, DateTime<Utc>) {
        let mut r = loan(now);
        run_to(&mut r, 2, now, p);
        apply(&mut r, |r| {
            apply_reply(r, 1, 2, false, &StepOutcome::Accepted, now, p, &Linear)
        });
        let due = r.complete_by.expect("deadline");
        apply(&mut r, |r| expire(r, due, p, 0.5));
        (r, due)
    }

    #[test]
    fn a_silent_callback_step_times_out_goes_out_again_and_keeps_its_token() {
        let p = callback_policies();
        let now = t0();
        let mut r = loan(now);
        run_to(&mut r, 2, now, &p);
        apply(&mut r, |r| {
            apply_reply(r, 1, 2, false, &StepOutcome::Accepted, now, &p, &Linear)
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
        apply(&mut r, |r| claim(r, "s", later, &p, &Linear));
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
        let (mut r, due) = callback_wait_timed_out(now, &p);
        assert_eq!(r.process_state, ProcessState::Pending);
        let t = apply(&mut r, |r| apply_callback(r, 2, 0, &done, due, &p, &Linear));
        assert_eq!(r.steps[2].status, StepStatus::Done);
        assert_eq!(r.steps[2].result.as_deref(), Some("{\"contract\":\"c-1\"}"));
        assert_eq!((r.process_state, r.step_index), (ProcessState::Pending, 3));
        assert!(t.effects.contains(&Effect::Enqueue {
            delay: Duration::zero()
        }));
        assert!(!r.steps[3].sent, "the next step waits for its claim");
        apply(&mut r, |r| claim(r, "s", due, &p, &Linear));
        assert_eq!(r.current_step(), Some("disburse-funds"));

        // Sent again under a new attempt (the service answers the repeated key with its first
        // acceptance and will not call back again): the first callback completes it, and the
        // new attempt's late acceptance is stale.
        let (mut r, _) = callback_wait_timed_out(now, &p);
        let later = r.complete_by.expect("pickup");
        apply(&mut r, |r| claim(r, "s", later, &p, &Linear));
        assert_eq!((r.attempt, r.steps[2].status), (2, StepStatus::Running));
        apply(&mut r, |r| {
            apply_callback(r, 2, 0, &done, later, &p, &Linear)
        });
        assert_eq!(r.steps[2].status, StepStatus::Done);
        assert_eq!(
            (r.process_state, r.current_step()),
            (ProcessState::Processing, Some("disburse-funds"))
        );
        assert!(
            apply_reply(&r, 2, 2, false, &StepOutcome::Accepted, later, &p, &Linear).is_err(),
            "the second attempt's acceptance comes after the step is done"
        );
        assert!(
            apply_callback(&r, 2, 0, &done, later, &p, &Linear).is_err(),
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
                apply(&mut r, |r| claim(r, "s", at, &manual, &Linear));
            }
            let a = r.attempt;
            apply(&mut r, |r| {
                apply_reply(r, a, 2, false, &StepOutcome::Accepted, at, &manual, &Linear)
            });
            at = r.complete_by.expect("deadline");
            apply(&mut r, |r| expire(r, at, &manual, 0.5));
        }
        assert_eq!(r.steps[2].status, StepStatus::TimedOut);
        apply(&mut r, |r| {
            apply_callback(r, 2, 0, &done, at, &manual, &Linear)
        });
        assert_eq!(
            (r.process_state, r.current_step(), r.failure_count),
            (ProcessState::Pending, Some("disburse-funds"), 0)
        );
        assert_eq!(r.steps[2].status, StepStatus::Done);
    }

    #[test]
    fn a_callback_step_answered_faulted_fails_its_task_and_is_undone_with_it() {
        let p = callback_policies();
        let now = t0();
        let mut r = loan(now);
        run_to(&mut r, 2, now, &p);
        apply(&mut r, |r| {
            apply_reply(
                r,
                r.attempt,
                2,
                false,
                &StepOutcome::Accepted,
                now,
                &p,
                &Linear,
            )
        });
        let faulted = StepOutcome::Faulted {
            error: "run r stopped and could not undo element 7".into(),
        };
        apply(&mut r, |r| {
            apply_callback(r, 2, 0, &faulted, now, &p, &Linear)
        });
        // It took effect: compensation begins with it, not with the step before.
        assert_eq!(
            r.process_state,
            ProcessState::Compensating,
            "{:?}",
            r.history
        );
        assert_eq!(r.steps[2].status, StepStatus::Faulted);
        assert_eq!(r.current_step(), Some(r.steps[2].name.as_str()));
    }

    /// A `Faulted` answer (a child or run that ended CompensationFailed, or a result too large
    /// to keep) for a callback step handed back after its wait timed out, or for the step the
    /// task failed at waiting for it, fails the step at once, as it does while the step is out:
    /// it took effect, and is undone with its task. (It was refused as "not waiting", and lost:
    /// the step went out again under the same key, which the service answers once, and waited
    /// its whole timeout again for an answer that had come.)
    #[test]
    fn a_late_faulted_callback_fails_the_step_handed_back_or_failed_waiting_for_it() {
        let p = callback_policies();
        let now = t0();
        let faulted = StepOutcome::Faulted {
            error: "child task c ended CompensationFailed".into(),
        };
        let (mut r, due) = callback_wait_timed_out(now, &p);
        assert_eq!(r.process_state, ProcessState::Pending);
        apply(&mut r, |r| {
            apply_callback(r, 2, 0, &faulted, due, &p, &Linear)
        });
        assert_eq!(r.steps[2].status, StepStatus::Faulted);
        assert_eq!(
            (r.process_state, r.current_step()),
            (ProcessState::Compensating, Some("send-contract")),
            "it took effect: its undo comes first"
        );
        assert!(r.owed().contains(&NoticeKind::Failed), "{:?}", r.owed());

        // Failed waiting for it, compensation off: the task stays in Error, at the step now
        // Faulted, and alerts with the reason.
        let mut manual = vec![base(); 4];
        manual[2].callback = p.at(2).callback;
        for s in &mut manual {
            s.auto_compensate = false;
            s.failure_threshold = 1;
        }
        let manual = Policies::new(manual);
        let (mut r, due) = callback_wait_timed_out(now, &manual);
        assert_eq!(
            (r.process_state, r.steps[2].status),
            (ProcessState::Error, StepStatus::TimedOut)
        );
        apply(&mut r, |r| {
            apply_callback(r, 2, 0, &faulted, due, &manual, &Linear)
        });
        assert_eq!(
            (r.process_state, r.steps[2].status),
            (ProcessState::Error, StepStatus::Faulted)
        );
        assert!(
            r.last_error
                .as_deref()
                .is_some_and(|e| e.contains("CompensationFailed")),
            "{:?}",
            r.last_error
        );
        // A heartbeat there is still no answer.
        assert_eq!(
            apply_callback(&r, 2, 0, &StepOutcome::Heartbeat, due, &manual, &Linear).err(),
            Some(Rejection::NotRunning(ProcessState::Error))
        );
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
            apply_reply(r, 1, 2, false, &failed, now, &manual, &Linear)
        });
        assert_eq!(r.process_state, ProcessState::Error);
        apply(&mut r, |r| retry(r, &ops(None), now, &manual));
        assert_eq!(r.steps[2].generation, 1, "a refused key is not used again");
        assert_eq!(
            apply_callback(&r, 2, 0, &StepOutcome::succeeded(), now, &manual, &Linear).err(),
            Some(Rejection::StaleGeneration {
                record: 1,
                message: 0
            })
        );
        assert_eq!(
            apply_callback(&r, 2, 1, &StepOutcome::succeeded(), now, &manual, &Linear).err(),
            Some(Rejection::NotRunning(ProcessState::Pending)),
            "the new key was never sent: no callback can answer it yet"
        );
        apply(&mut r, |r| claim(r, "s", now, &manual, &Linear));
        apply(&mut r, |r| {
            apply_reply(
                r,
                2,
                2,
                false,
                &StepOutcome::Accepted,
                now,
                &manual,
                &Linear,
            )
        });
        let due = r.complete_by.expect("deadline");
        apply(&mut r, |r| expire(r, due, &manual, 0.5));
        assert_eq!(
            apply_callback(&r, 2, 1, &StepOutcome::Heartbeat, due, &manual, &Linear).err(),
            Some(Rejection::NotWaiting(2)),
            "between attempts there is no callback wait to extend"
        );
        assert_eq!(
            apply_callback(&r, 1, 0, &StepOutcome::succeeded(), due, &manual, &Linear).err(),
            Some(Rejection::WrongStep {
                record: 2,
                message: 1
            })
        );
    }

    #[test]
    fn each_step_runs_under_its_own_timeout_and_threshold() {
        let w = loan_workflow();
        let p = w.policies();
        let now = t0();
        let mut r = record(&w, now);
        apply_with(&mut r, &p, |r| claim(r, "s", now, &p, &Linear));
        assert_eq!(
            r.complete_by,
            Some(now + Duration::seconds(5)),
            "check-credit: 5s"
        );
        apply_with(&mut r, &p, |r| {
            apply_reply(r, 1, 0, false, &ok(), now, &p, &Linear)
        });
        assert_eq!(
            r.complete_by,
            Some(now + Duration::seconds(30)),
            "reserve-funds: 30s"
        );
        assert_eq!(p.at(3).failure_threshold, 5);
        assert_eq!(p.at(1).failure_threshold, 3);
    }

    #[test]
    fn each_step_counts_its_own_expired_deadlines_against_its_threshold() {
        let p = manual();
        let mut now = t0();
        let mut r = fresh(now);
        for _ in 0..2 {
            apply(&mut r, |r| claim(r, "s", now, &p, &Linear));
            now += p.at(0).step_timeout;
            apply(&mut r, |r| expire(r, now, &p, 0.0));
        }
        assert_eq!(
            (r.process_state, r.failure_count),
            (ProcessState::Pending, 2)
        );
        apply(&mut r, |r| claim(r, "s", now, &p, &Linear));
        let a = r.attempt;
        apply(&mut r, |r| {
            apply_reply(r, a, 0, false, &ok(), now, &p, &Linear)
        });
        assert_eq!((r.step_index, r.failure_count), (1, 0), "a fresh count");
        // Step 1 times out twice: within its threshold of 3, whatever step 0 used.
        for _ in 0..2 {
            now += p.at(1).step_timeout;
            apply(&mut r, |r| expire(r, now, &p, 0.0));
            assert_eq!(r.process_state, ProcessState::Pending, "{:?}", r.last_error);
            apply(&mut r, |r| claim(r, "s", now, &p, &Linear));
        }
        assert_eq!(r.failure_count, 2);
        assert_eq!(p.at(1).failure_threshold, 3);
    }

    #[test]
    fn a_task_on_a_line_arms_one_deadline_timer_until_it_arrives() {
        let w = loan_workflow();
        let p = w.policies();
        let now = t0();
        let mut r = record(&w, now);
        apply_with(&mut r, &p, |r| claim(r, "s", now, &p, &Linear));
        let first = now + Duration::seconds(5);
        assert_eq!(r.timer_at, Some(first), "the claim's step arms the timer");
        // The next step's deadline is later: the timer armed arrives first and re-arms then.
        let soon = now + Duration::seconds(1);
        apply_with(&mut r, &p, |r| {
            apply_reply(r, 1, 0, false, &ok(), soon, &p, &Linear)
        });
        assert_eq!(r.complete_by, Some(soon + Duration::seconds(30)));
        assert_eq!(r.timer_at, Some(first), "no second timer");
        // Once it arrived, the next step sent arms one of its own.
        let after = now + Duration::seconds(6);
        apply_with(&mut r, &p, |r| {
            apply_reply(r, 1, 1, false, &ok(), after, &p, &Linear)
        });
        assert!(r.complete_by.is_some_and(|d| d > after));
        assert_eq!(r.timer_at, r.complete_by);
    }
}
