//! Operator actions on a task (and a caller's cancel): [`retry`] (or [`retry_with_input`]),
//! [`compensate`] (or [`compensate_from`] a step), [`cancel`], [`resolve`] by hand, [`skip`] a
//! failed step with its result, [`stop_branches`] still out of a group a failure stopped; and a
//! parent's undo of its child task as a unit ([`undo_as_unit`]).

use super::super::policy::Policies;
use super::super::state::{NoticeKind, ProcessState, StateRecord, StepStatus, to_millis};
use super::branches;
use super::common::{
    Actor, Effect, Rejection, Transition, finish, log_by, newest_undo, next, tidy,
};
use super::compensating::begin_compensation;
use super::{Condition, Guard};
use chrono::{DateTime, Duration, Utc};

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
            // A forEach step stopped in Error: its elements go on (`resume`, below).
            let each = n
                .fanout
                .as_ref()
                .is_some_and(|f| f.running().any(|e| e.step == i));
            let step = &mut n.steps[i];
            // The operator mended what the service answered as misconfigured (or retries
            // anyway): the count starts again.
            step.misconfigured = 0;
            if step.status == StepStatus::Failed && !each {
                step.generation += 1;
                step.sent = false;
            }
            step.status = StepStatus::Pending;
            step.finished_at = None;
            step.finished_attempt = None;
            n.process_state = ProcessState::Pending;
            taken_over(&mut n, now);
        }
        ProcessState::CompensationFailed => {
            // The undo that failed: the step's, or its element's (a forEach step).
            let k = n.undo_element(i);
            let unit = match k {
                Some(k) => &mut n.steps[i].elements[k],
                None => &mut n.steps[i],
            };
            if unit.undo == Some(StepStatus::Failed) {
                unit.undo_generation += 1;
            }
            n.set_undo(i, None);
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
    // A parallel group stopped in Error: every branch not done goes on from its step.
    branches::resume(&mut n, now, p);
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
            Effect::Publish(NoticeKind::Retrying),
            Effect::Enqueue {
                delay: Duration::zero(),
            },
        ],
    ))
}

/// An operator sends a failed task on (a retry, a skip): past its deadline, the operator takes
/// it over, and the deadline no longer applies (else the task would fail again at once).
fn taken_over(n: &mut StateRecord, now: DateTime<Utc>) {
    if n.deadline.is_some_and(|d| d <= now) {
        n.deadline = None;
    }
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
            n.fanout = None;
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
        // A parallel group runs: each of its steps that may be in flight keeps its own
        // deadline, which its undo waits past.
        ProcessState::Pending | ProcessState::Processing if r.fanout.is_some() => {
            super::branches::cancel_branches(&mut n, now);
            None
        }
        ProcessState::Pending if r.steps[i].sent => Some(now),
        ProcessState::Pending => None,
        // A sub-workflow step its child accepted has nothing in flight: its undo undoes the
        // child (a copy of its request starts no second one: the child keeps its key).
        ProcessState::Processing
            if p.at(i).accepted_leaves_nothing_in_flight()
                && r.steps[i].waiting_until.is_some() =>
        {
            n.steps[i].status = StepStatus::Cancelled;
            None
        }
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
    let mut effects = vec![Effect::Publish(NoticeKind::Cancelled)];
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
    Ok(Transition::from(r, Condition::on_step(r, i), n, effects))
}

/// Its parent undoes this child task as a unit (its sub-workflow step's undo, at the parent's
/// attempt `parent_attempt`), and the child's end answers that undo (see
/// [`ParentLink::undo_attempt`]):
/// - a Processed child starts undoing its steps, last first, as a failed task does; past its
///   pivot it cannot be undone ([`Rejection::PastPivot`]: the parent's undo is refused);
/// - a child still running is cancelled ([`cancel`]): its steps that may have taken effect are
///   undone, each past its deadline;
/// - a Compensating child is already being undone (the parent's undo went out again): it
///   answers this attempt instead, if it is a later one ([`Rejection::StaleAttempt`] for an
///   earlier attempt's copy, delivered late).
///
/// Any other state has nothing to start: the caller answers the parent itself.
///
/// Condition: same state (at the version read), or [`cancel`]'s - keeps "a child is undone
/// once": of two undos racing, one starts it and the other reads the child again; and "a
/// child answers its parent's newest undo".
///
/// [`ParentLink::undo_attempt`]: super::super::state::ParentLink::undo_attempt
pub fn undo_as_unit(
    r: &StateRecord,
    parent_attempt: u64,
    now: DateTime<Utc>,
    p: &Policies,
) -> Result<Transition, Rejection> {
    newest_undo(r, parent_attempt)?;
    let actor = Actor {
        by: r.parent.as_ref().map_or_else(
            || "its parent".to_owned(),
            |l| format!("parent task {}", l.task_id),
        ),
        reason: Some("its parent is undone".to_owned()),
        operator: false,
    };
    let mut t = match r.process_state {
        ProcessState::Processed if r.past_pivot() => {
            return Err(Rejection::PastPivot(r.process_state));
        }
        ProcessState::Processed => {
            let now = to_millis(now);
            let mut n = next(r, now);
            n.purge_at = None;
            n.last_error = Some("undone as a unit by its parent task".to_owned());
            // A `Processed` record is past its last step; compensation goes back from it (and a
            // child with nothing to undo ends `Compensated` at its last step, as any does).
            n.step_index = n.steps.len().saturating_sub(1);
            let effects = begin_compensation(&mut n, now, Duration::zero(), p, None);
            log_by(
                &mut n,
                r.process_state,
                None,
                "undone as a unit: its parent task is undone",
                Some(&actor.by),
            );
            tidy(&mut n);
            Transition::from(
                r,
                Condition::on(r, vec![Guard::StateIs(r.process_state)]),
                n,
                effects,
            )
        }
        ProcessState::Pending | ProcessState::Processing => cancel(r, &actor, now, p)?,
        ProcessState::Compensating => {
            let mut n = next(r, to_millis(now));
            tidy(&mut n);
            Transition::from(
                r,
                Condition::on(r, vec![Guard::StateIs(r.process_state)]),
                n,
                vec![],
            )
        }
        other => return Err(Rejection::NotCompensable(other)),
    };
    if let Some(link) = t.record.parent.as_mut() {
        link.undo_attempt = Some(parent_attempt);
    }
    Ok(t)
}

/// Its parent ended for good, so this `Processed` child will never be undone: its retention
/// starts (the task item's expiry is the caller's next write; a child with payloads gets its
/// purge time, or gets it when its notices are delivered).
///
/// Condition: same state (at the version read) - keeps "a child is kept while its parent may
/// undo it": a child its parent started undoing meanwhile is not released.
pub fn release_child(
    r: &StateRecord,
    now: DateTime<Utc>,
    retention: Option<Duration>,
) -> Result<Transition, Rejection> {
    if !r.held_by_parent() {
        return Err(Rejection::NotHeld);
    }
    let now = to_millis(now);
    let mut n = next(r, now);
    if let Some(link) = n.parent.as_mut() {
        link.released = true;
    }
    if r.payloads && !r.notice_pending() {
        n.purge_at = retention.map(|keep| now + keep);
    }
    tidy(&mut n);
    Ok(Transition::from(
        r,
        Condition::on(r, vec![Guard::StateIs(r.process_state)]),
        n,
        vec![],
    ))
}

/// An operator stops the branches still out of a parallel group that stopped at a failure
/// (whose alert went out then): a sibling's callback step would otherwise hold the task, and
/// its compensation, for up to its whole timeout. Each step out is over now (it may have
/// taken effect: it is undone; see `branches::give_up_out`), and the task fails or is
/// compensated at once, as it would once they ended. Audited: the history names the operator
/// and the reason.
///
/// Condition: same state (at the version read) - keeps "only the steps out when the operator
/// looked are stopped": a reply, callback or expiry that lands first makes this read again.
pub fn stop_branches(
    r: &StateRecord,
    actor: &Actor,
    now: DateTime<Utc>,
    p: &Policies,
) -> Result<Transition, Rejection> {
    let now = to_millis(now);
    let mut n = next(r, now);
    log_by(
        &mut n,
        r.process_state,
        r.fanout
            .as_ref()
            .and_then(|f| f.stop.as_ref())
            .map(|s| s.step),
        actor.line("stop-branches"),
        Some(&actor.by),
    );
    let Some(effects) = branches::give_up_out(&mut n, now, p) else {
        return Err(Rejection::NotStopping(r.process_state));
    };
    tidy(&mut n);
    Ok(Transition::from(
        r,
        Condition::on(r, vec![Guard::StateIs(r.process_state)]),
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
    n.fanout = None;
    let effects = finish(&mut n, ProcessState::Resolved, NoticeKind::Resolved);
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
    if r.steps[i].status == StepStatus::Pending && !r.steps[i].sent {
        // Nothing failed there: its conditions are not even decided (a retry routes it).
        return Err(Rejection::NotStarted(i));
    }
    let now = to_millis(now);
    let mut n = next(r, now);
    if n.fanout.as_ref().is_some_and(|f| f.each.is_some()) {
        // A forEach step done by hand as a whole (its elements stay as they ran, for their
        // undos): the task goes on after it.
        n.fanout = None;
    }
    taken_over(&mut n, now);
    let step = &mut n.steps[i];
    step.status = StepStatus::Done;
    step.result = result;
    step.finished_at = Some(now);
    step.finished_attempt = Some(r.attempt);
    n.failure_count = 0;
    n.round = 0;
    n.last_error = None;
    n.refusal = None;
    let progress = p.at(i).progress(NoticeKind::StepCompleted);
    let enqueue = Effect::Enqueue {
        delay: Duration::zero(),
    };
    let effects = if n.fanout.is_some() {
        // In a parallel group stopped in Error: its branches go on from their steps.
        n.process_state = ProcessState::Pending;
        let ended = branches::resume(&mut n, now, p);
        let mut effects = vec![progress];
        if ended.is_empty() {
            effects.push(enqueue);
        }
        effects.extend(ended);
        effects
    } else {
        // The steps already decided not to run are passed; the claim routes the rest.
        n.step_index = n.next_not_skipped(i + 1);
        if n.step_index < n.steps.len() {
            n.process_state = ProcessState::Pending;
            n.complete_by = Some(now + p.at(n.step_index).pickup_timeout);
            vec![progress, enqueue]
        } else {
            finish(&mut n, ProcessState::Processed, NoticeKind::Processed)
        }
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
            for e in step.elements.iter_mut().filter(|e| e.needs_undo()) {
                e.undo = Some(StepStatus::Done);
            }
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
/// their undos keep reading what they ran with. A forEach step whose elements were made runs
/// them on the list it was rendered from, retry or not: so do its elements' undos.
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
    // A parallel group stopped with other steps that may have taken effect: a retry would
    // send them again under their keys, which must not carry a new input.
    if let Some(other) =
        r.steps.iter().enumerate().find(|(j, s)| {
            *j != i && s.sent && !s.status.is_passed() && s.status != StepStatus::Failed
        })
    {
        return Err(Rejection::MayHaveTakenEffect(other.1.name.clone()));
    }
    // A refused step gets its new key from `retry`; one never sent never used its key.
    let mut t = retry(r, actor, now, p)?;
    for (_, s) in t
        .record
        .steps
        .iter_mut()
        .enumerate()
        .filter(|(j, s)| *j != i && s.sent)
    {
        s.input_revision.get_or_insert(input_revision);
    }
    let step = &mut t.record.steps[i];
    if step.elements.is_empty() {
        step.input_revision = None;
    } else {
        // A forEach step whose list was rendered (its elements made): the elements keep the
        // list they were made from, for their retries and their undos (an element's key
        // stands for its place in that list). The new input is for the steps after it.
        step.input_revision.get_or_insert(input_revision);
    }
    if let Some(h) = t.record.history.last_mut() {
        h.reason = actor.line("retry with a new input");
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::transition::testkit::*;
    use crate::domain::transition::*;

    /// A Processed e-commerce order as a child task of some parent's step.
    fn child(now: DateTime<Utc>, p: &Policies) -> StateRecord {
        let mut r = fresh(now);
        r.parent = Some(crate::domain::state::ParentLink {
            task_id: crate::domain::TaskId::new_random(),
            step: "pay".into(),
            step_index: 1,
            generation: 0,
            reply_queue_url: "q".into(),
            depth: 1,
            undo_attempt: None,
            released: false,
            element: None,
        });
        run_to(&mut r, 3, now, p);
        assert_eq!(r.process_state, ProcessState::Processed);
        r
    }

    #[test]
    fn a_processed_child_with_nothing_to_undo_ends_compensated_at_its_last_step() {
        // Its steps have no undo (the property test's case: a child whose steps were skipped).
        let p = policy();
        let now = t0();
        let w = examples::synthetic(
            &examples::Shape {
                undos: vec![false, false],
                pivot: None,
            },
            &base(),
        );
        let mut r = record(&w, now);
        run_to(&mut r, 2, now, &p);
        assert_eq!(r.process_state, ProcessState::Processed);
        let t = apply(&mut r, |r| undo_as_unit(r, 1, now, &p));
        assert_eq!(t.effects, [Effect::DeliverNotice]);
        assert_eq!(
            (r.process_state, r.step_index),
            (ProcessState::Compensated, 1)
        );
    }

    #[test]
    fn a_processed_child_undone_by_its_parent_compensates_its_steps_last_first() {
        let p = policy();
        let now = t0();
        let mut r = child(now, &p);
        assert!(r.held_by_parent(), "its parent may still undo it");
        assert_eq!(r.expires_at(Some(Duration::days(90))), None);
        let t = apply(&mut r, |r| undo_as_unit(r, 7, now, &p));
        assert_eq!(
            t.effects,
            [Effect::Enqueue {
                delay: Duration::zero()
            }]
        );
        assert_eq!(
            (r.process_state, r.step_index),
            (ProcessState::Compensating, 2),
            "the last step is undone first"
        );
        assert_eq!(r.parent.as_ref().and_then(|l| l.undo_attempt), Some(7));
        // The parent's undo sent again (attempt 8) is answered instead; nothing restarts.
        let t = apply(&mut r, |r| undo_as_unit(r, 8, now, &p));
        assert!(t.effects.is_empty());
        assert_eq!(r.parent.as_ref().and_then(|l| l.undo_attempt), Some(8));
        // A late copy of attempt 7's request is stale: the child keeps answering attempt 8,
        // the one its parent waits on.
        assert_eq!(
            undo_as_unit(&r, 7, now, &p).err(),
            Some(Rejection::StaleAttempt {
                record: 8,
                message: 7
            })
        );
        // Each undo's answer sends the next one.
        claim_and_answer(&mut r, 2, true, &ok(), now, &p);
        for i in [1, 0] {
            let a = r.attempt;
            apply(&mut r, |r| {
                apply_reply(r, a, i, true, &ok(), now, &p, &Linear)
            });
        }
        assert_eq!(r.process_state, ProcessState::Compensated);
        assert!(!r.held_by_parent());
        assert!(
            matches!(
                undo_as_unit(&r, 9, now, &p),
                Err(Rejection::NotCompensable(ProcessState::Compensated))
            ),
            "a compensated child has nothing left to start: the agent answers at once"
        );
    }

    #[test]
    fn a_child_past_its_pivot_is_not_undone_and_a_running_one_is_cancelled() {
        let p = policy();
        let now = t0();
        let mut r = child(now, &p);
        r.pivot = Some(1);
        assert_eq!(
            undo_as_unit(&r, 1, now, &p).err(),
            Some(Rejection::PastPivot(ProcessState::Processed))
        );
        let mut running = fresh(now);
        running.parent = r.parent.clone();
        run_to(&mut running, 1, now, &p);
        let t = apply(&mut running, |r| undo_as_unit(r, 3, now, &p));
        assert!(t.effects.contains(&Effect::Publish(NoticeKind::Cancelled)));
        assert_eq!(running.process_state, ProcessState::Compensating);
        assert_eq!(
            running.parent.as_ref().and_then(|l| l.undo_attempt),
            Some(3)
        );
    }

    #[test]
    fn a_child_is_released_once_and_not_while_it_is_undone() {
        let p = policy();
        let now = t0();
        let keep = Duration::days(90);
        let mut r = child(now, &p);
        apply(&mut r, |r| release_child(r, now, Some(keep)));
        assert!(!r.held_by_parent());
        assert_eq!(r.expires_at(Some(keep)), Some(r.updated_at + keep));
        assert_eq!(
            release_child(&r, now, Some(keep)).err(),
            Some(Rejection::NotHeld)
        );
        let mut undoing = child(now, &p);
        apply(&mut undoing, |r| undo_as_unit(r, 1, now, &p));
        assert_eq!(
            release_child(&undoing, now, Some(keep)).err(),
            Some(Rejection::NotHeld)
        );
    }

    #[test]
    fn a_refused_undo_ends_in_compensation_failed_and_an_operator_retry_resumes_it() {
        let p = policy();
        let now = t0();
        let mut r = fresh(now);
        run_to(&mut r, 1, now, &p);
        apply(&mut r, |r| {
            apply_reply(r, 1, 1, false, &refused(), now, &p, &Linear)
        });
        claim_and_answer(&mut r, 0, true, &refused(), now, &p);
        assert_eq!(r.process_state, ProcessState::CompensationFailed);
        assert!(r.owed().contains(&NoticeKind::CompensationFailed));
        assert_eq!(
            compensate(&fresh(now), &ops(None), now, &p).err(),
            Some(Rejection::NotCompensable(ProcessState::Pending))
        );
        let t = apply(&mut r, |r| retry(r, &ops(None), now, &p));
        assert_eq!(
            t.effects,
            [
                Effect::Publish(NoticeKind::Retrying),
                Effect::Enqueue {
                    delay: Duration::zero()
                }
            ]
        );
        assert_eq!(r.steps[0].undo_generation, 1, "a refused key is not reused");
        claim_and_answer(&mut r, 0, true, &ok(), now, &p);
        assert_eq!(r.process_state, ProcessState::Compensated);
    }

    #[test]
    fn operator_retry_of_an_error_runs_the_step_again_under_a_new_key() {
        let p = manual();
        let now = t0();
        let mut r = fresh(now);
        run_to(&mut r, 1, now, &p);
        apply(&mut r, |r| {
            apply_reply(r, 1, 1, false, &refused(), now, &p, &Linear)
        });
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
        apply(&mut r, |r| {
            apply_reply(r, a, 1, false, &ok(), now, &p, &Linear)
        });
        apply(&mut r, |r| {
            apply_reply(r, a, 2, false, &ok(), now, &p, &Linear)
        });
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
        apply(&mut r, |r| {
            apply_reply(r, 1, 1, false, &refused(), now, &p, &Linear)
        });
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
        assert_eq!(r.owed().last(), Some(&NoticeKind::Resolved));
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
        apply(&mut r, |r| {
            apply_reply(r, 1, 1, false, &refused(), now, &p, &Linear)
        });
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
                Effect::Progress(NoticeKind::StepCompleted),
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
        apply(&mut r, |r| {
            apply_reply(r, a, 2, false, &refused(), now, &p, &Linear)
        });
        apply(&mut r, |r| {
            skip(r, &ops(Some("shipped by hand")), now, &p, None)
        });
        assert_eq!(r.process_state, ProcessState::Processed);
        assert_eq!(r.owed().last(), Some(&NoticeKind::Processed));
    }

    #[test]
    fn compensation_from_an_earlier_step_leaves_the_later_ones_to_the_operator() {
        let p = manual();
        let now = t0();
        let mut r = fresh(now);
        run_to(&mut r, 2, now, &p);
        apply(&mut r, |r| {
            apply_reply(r, 1, 2, false, &refused(), now, &p, &Linear)
        });
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
        claim_and_answer(&mut r, 0, true, &ok(), now, &p);
        assert_eq!(r.process_state, ProcessState::Compensated);
    }

    #[test]
    fn a_refused_step_reruns_on_a_new_input_but_one_that_may_have_taken_effect_does_not() {
        let p = manual();
        let now = t0();
        let mut r = fresh(now);
        run_to(&mut r, 1, now, &p);
        apply(&mut r, |r| {
            apply_reply(r, 1, 1, false, &refused(), now, &p, &Linear)
        });
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
        claim_and_answer(&mut r, 1, false, &refused(), now, &p);
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
                apply(&mut late, |r| claim(r, "s", t, &p, &Linear));
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
                Effect::Publish(NoticeKind::Cancelled),
                Effect::Enqueue {
                    delay: deadline + wait - later
                }
            ]
        );
        assert!(matches!(
            apply_reply(&r, 1, 1, false, &ok(), later, &p, &Linear),
            Err(Rejection::NotRunning(ProcessState::Compensating))
        ));
        // A stray work message cannot send the undo while the step may still be in flight:
        // not before its deadline plus the undo wait.
        for early in [later, deadline, deadline + wait - Duration::milliseconds(1)] {
            assert_eq!(
                claim(&r, "s", early, &p, &Linear).err(),
                Some(Rejection::TooEarly {
                    until: deadline + wait
                })
            );
        }
        let deadline = deadline + wait;
        apply(&mut r, |r| claim(r, "s", deadline, &p, &Linear));
        let mut undone = vec![];
        while r.process_state == ProcessState::Compensating {
            let (a, i) = (r.attempt, r.step_index);
            undone.push(i);
            apply(&mut r, |r| {
                apply_reply(r, a, i, true, &ok(), deadline, &p, &Linear)
            });
        }
        assert_eq!(undone, [1, 0]);

        let mut pending = fresh(now);
        apply(&mut pending, |r| {
            cancel(r, &ops(Some("changed my mind")), now, &p)
        });
        assert_eq!(pending.process_state, ProcessState::Compensated);
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
        let t = apply(&mut r, |r| {
            apply_reply(r, 1, 3, false, &refused(), now, &p, &Linear)
        });
        assert_eq!(t.effects, [Effect::DeliverNotice]);
        assert_eq!(
            r.process_state,
            ProcessState::Error,
            "auto-compensation stops at the pivot"
        );
        assert_eq!(r.owed(), [NoticeKind::Failed]);
        assert_eq!(
            compensate(&r, &ops(None), now, &p).err(),
            Some(Rejection::PastPivot(ProcessState::Error))
        );
        apply(&mut r, |r| retry(r, &ops(None), now, &p));
        assert_eq!(r.process_state, ProcessState::Pending);
    }
}
