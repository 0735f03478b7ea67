//! A distributed forEach's run record: its transitions, as pure functions over the record that
//! holds the ledger ([`RunState`], [`crate::domain::run`]). Each returns the write (conditional
//! on the version read, and on the run still being in the state read) and what the run's edge
//! must then do ([`RunEffects`]: elements to open, elements to undo, its end).
//!
//! A run is held ([`RUN_HOLDER`], Processing) while its ledger runs, due at its next check
//! ([`RUN_RECHECK`]); it ends in the state its answer says (Processed, Refused, Compensated or
//! CompensationFailed), with that notice owed: delivering it answers the task's step.

use super::common::{Effect, Rejection, Transition, log, newest_undo, next};
use crate::domain::condition::{Condition, Guard};
use crate::domain::run::{ElementEnd, Run, RunEffects, RunEnd};
use crate::domain::state::{
    NoticeKind, ParentLink, RUN_HOLDER, RUN_RECHECK, RunState, StateRecord, to_millis,
};
use crate::domain::{ProcessState, StepStatus, TaskId, Workflow};
use chrono::{DateTime, Utc};

/// The record of a run that starts: `view` is its task's element view of the step (the one
/// step its elements run), `parent` the step it answers. Held and due at its first check; the
/// ledger's first window is the caller's to open once the record is stored.
pub fn new_run(
    id: TaskId,
    view: &Workflow,
    parent: ParentLink,
    state: RunState,
    now: DateTime<Utc>,
) -> StateRecord {
    let now = to_millis(now);
    let mut r = StateRecord::new(id, view, None, now, now + RUN_RECHECK);
    r.parent = Some(parent);
    r.process_state = ProcessState::Processing;
    r.locked_by = Some(RUN_HOLDER.to_owned());
    r.complete_by = Some(now + RUN_RECHECK);
    r.due_key = r.complete_by;
    if let Some(s) = r.steps.first_mut() {
        s.status = StepStatus::Running;
    }
    r.history[0].reason = format!("run started: {}", state.ledger);
    r.history[0].to = ProcessState::Processing;
    r.run = Some(state);
    r
}

/// Elements' ends, applied to the run (a batch from the ends queue): the write, and what to
/// open, undo, or answer next. Rejected if the record is no run or has ended (its answer is
/// out: a late end changes nothing).
///
/// Condition: the version read, Processing - keeps "one run's ledger moves one batch at a
/// time", so no end is counted twice or lost to a concurrent writer.
pub fn apply_ends(
    r: &StateRecord,
    ends: &[ElementEnd],
    now: DateTime<Utc>,
) -> Result<(Transition, RunEffects), Rejection> {
    change(r, now, "elements ended", |ledger| ledger.apply(ends))
}

/// The task undoes the run's step as a unit (its undo's `attempt`): no element opens from now
/// on, and every element that took effect is undone, last first. A run that ended `Processed`
/// runs again for it; one still running stops opening. Its end answers this undo.
///
/// A copy of an earlier attempt's undo, delivered late, is stale ([`Rejection::StaleAttempt`]):
/// the run answers the newest attempt only.
///
/// Condition: the version read, its state - keeps "the undo is begun once" and "a run answers
/// its task's newest undo".
pub fn undo_run(
    r: &StateRecord,
    attempt: u64,
    now: DateTime<Utc>,
) -> Result<(Transition, RunEffects), Rejection> {
    newest_undo(r, attempt)?;
    let resumes = r.process_state == ProcessState::Processed;
    if !matches!(
        r.process_state,
        ProcessState::Processed | ProcessState::Processing
    ) {
        return Err(Rejection::NotRunning(r.process_state));
    }
    let mut r2 = r.clone();
    if let Some(link) = r2.parent.as_mut() {
        link.undo_attempt = Some(attempt);
    }
    if resumes {
        // Held again, as while it ran: its undos go out and its check is due.
        r2.process_state = ProcessState::Processing;
    }
    let (mut t, fx) = change_from(
        r,
        r2,
        now,
        "undone as a unit: its task's step is undone",
        |l| l.undo(),
    )?;
    t.condition = Condition::on(r, vec![Guard::StateIs(r.process_state)]);
    Ok((t, fx))
}

/// The run's check is due (the supervisor): it is held for another [`RUN_RECHECK`], and what
/// it has out is opened (or undone) again, idempotently - the recovery of a writer that died
/// between the ledger's write and its effects, or a lost work message.
///
/// Condition: the version read, Processing, the check as read and passed - keeps "one
/// supervisor rechecks a run per period".
pub fn recheck(r: &StateRecord, now: DateTime<Utc>) -> Result<(Transition, RunEffects), Rejection> {
    let Some(state) = &r.run else {
        return Err(Rejection::NotRunning(r.process_state));
    };
    let due = r.complete_by;
    if r.process_state != ProcessState::Processing || due.is_none_or(|d| d > now) {
        return Err(Rejection::NotDue { due });
    }
    let now = to_millis(now);
    let mut n = next(r, now);
    n.complete_by = Some(now + RUN_RECHECK);
    let fx = state.ledger.outstanding();
    let mut guards = vec![Guard::StateIs(ProcessState::Processing)];
    if let Some(d) = due {
        guards.extend([Guard::CompleteByIs(d), Guard::CompleteByAtOrBefore(now)]);
    }
    Ok((Transition::from(r, Condition::on(r, guards), n, vec![]), fx))
}

fn change(
    r: &StateRecord,
    now: DateTime<Utc>,
    reason: &str,
    f: impl FnOnce(&mut Run) -> RunEffects,
) -> Result<(Transition, RunEffects), Rejection> {
    if r.process_state != ProcessState::Processing {
        return Err(Rejection::NotRunning(r.process_state));
    }
    let (mut t, fx) = change_from(r, r.clone(), now, reason, f)?;
    t.condition = Condition::on(r, vec![Guard::StateIs(ProcessState::Processing)]);
    Ok((t, fx))
}

/// Moves `n` (a copy of `r`, maybe changed) by `f` on its ledger; ends the run if the ledger
/// ended: its state, the notice owed, the step done or failed.
fn change_from(
    r: &StateRecord,
    n: StateRecord,
    now: DateTime<Utc>,
    reason: &str,
    f: impl FnOnce(&mut Run) -> RunEffects,
) -> Result<(Transition, RunEffects), Rejection> {
    let now = to_millis(now);
    let mut n = StateRecord {
        version: r.version + 1,
        updated_at: now,
        ..n
    };
    let Some(state) = n.run.as_mut() else {
        return Err(Rejection::NotRunning(r.process_state));
    };
    let fx = f(&mut state.ledger);
    let summary = state.ledger.to_string();
    let mut effects = vec![];
    match fx.end {
        None => {
            n.locked_by = Some(RUN_HOLDER.to_owned());
            if n.complete_by.is_none() {
                n.complete_by = Some(now + RUN_RECHECK);
            }
        }
        Some(end) => {
            let (state, notice, step, error) = match end {
                RunEnd::Processed => (
                    ProcessState::Processed,
                    NoticeKind::Processed,
                    StepStatus::Done,
                    None,
                ),
                RunEnd::Refused { refused } => (
                    ProcessState::Refused,
                    NoticeKind::Refused,
                    StepStatus::Failed,
                    Some(format!("{refused} elements refused")),
                ),
                RunEnd::Undone => (
                    ProcessState::Compensated,
                    NoticeKind::Compensated,
                    StepStatus::Done,
                    None,
                ),
                RunEnd::UndoFailed { index } => (
                    ProcessState::CompensationFailed,
                    NoticeKind::CompensationFailed,
                    StepStatus::Failed,
                    Some(format!("the undo of element {index} failed")),
                ),
            };
            n.process_state = state;
            n.locked_by = None;
            n.complete_by = None;
            if let Some(s) = n.steps.first_mut() {
                s.status = step;
            }
            n.last_error = error;
            n.owe(notice);
            effects.push(Effect::DeliverNotice);
        }
    }
    log(
        &mut n,
        r.process_state,
        None,
        format!("{reason}: {summary}"),
    );
    Ok((
        Transition::from(r, Condition::on(r, vec![]), n, effects),
        fx,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::run::{Direction, RunPlan};

    /// The element view of a distributed forEach step with an undo.
    fn view() -> Workflow {
        let w = Workflow::from_value(
            serde_json::json!({"name": "nightly", "steps": [{"name": "each", "service": "s",
                "forEach": "$.input.items", "distributed": true, "undo": {"action": "u"}}]}),
            None,
            &crate::Policy::default(),
        )
        .expect("valid");
        (*w.element_view(0).expect("a view")).clone()
    }

    fn link() -> ParentLink {
        ParentLink {
            task_id: TaskId::derived("the task"),
            step: "each".into(),
            step_index: 0,
            generation: 0,
            reply_queue_url: "replies".into(),
            depth: 1,
            undo_attempt: None,
            released: false,
            element: None,
        }
    }

    fn started(total: usize, max: u32) -> (StateRecord, RunEffects) {
        let (ledger, fx) = Run::start(RunPlan {
            total,
            max_concurrency: max,
            tolerated: 0,
            undoable: true,
            chunk: 1,
        })
        .expect("start");
        let now = Utc::now();
        let r = new_run(
            TaskId::derived("run"),
            &view(),
            link(),
            RunState {
                list: None,
                context: None,
                ledger,
            },
            now,
        );
        (r, fx)
    }

    fn end(index: u32, ok: bool) -> ElementEnd {
        ElementEnd {
            index,
            direction: Direction::Forward,
            ok,
            refused: None,
        }
    }

    #[test]
    fn a_run_is_held_while_it_runs_and_ends_owing_its_answer() {
        let (r, fx) = started(3, 2);
        assert_eq!(fx.open, vec![0, 1]);
        let p = view().policies();
        r.check(&p).expect("a valid run");
        let now = Utc::now();
        let (t, fx) = apply_ends(&r, &[end(0, true)], now).expect("applies");
        assert_eq!(fx.open, vec![2]);
        t.record.check(&p).expect("valid");
        assert_eq!(t.record.locked_by.as_deref(), Some(RUN_HOLDER));
        let (t, fx) = apply_ends(&t.record, &[end(1, true), end(2, true)], now).expect("ends");
        assert_eq!(fx.end, Some(RunEnd::Processed));
        t.record.check(&p).expect("valid");
        assert_eq!(t.record.process_state, ProcessState::Processed);
        assert_eq!(t.record.owed(), vec![NoticeKind::Processed]);
        assert!(t.effects.contains(&Effect::DeliverNotice));
        // A late end changes nothing.
        assert!(apply_ends(&t.record, &[end(2, false)], now).is_err());
        // The task's undo runs it again, then it ends undone.
        let (u, fx) = undo_run(&t.record, 7, now).expect("undo");
        assert_eq!(fx.undo, vec![2, 1]);
        u.record.check(&p).expect("valid");
        assert_eq!(
            u.record.parent.as_ref().and_then(|l| l.undo_attempt),
            Some(7)
        );
        // A late copy of an earlier attempt's undo is stale: the run answers attempt 7.
        assert!(matches!(
            undo_run(&u.record, 6, now),
            Err(Rejection::StaleAttempt {
                record: 7,
                message: 6
            })
        ));
        // A later attempt's takes the answer over.
        let (later, _) = undo_run(&u.record, 8, now).expect("a later attempt's undo");
        assert_eq!(
            later.record.parent.as_ref().and_then(|l| l.undo_attempt),
            Some(8)
        );
        let undone = |i| ElementEnd {
            index: i,
            direction: Direction::Undo,
            ok: true,
            refused: None,
        };
        let (u, fx) = apply_ends(&u.record, &[undone(2), undone(1)], now).expect("applies");
        assert_eq!(fx.undo, vec![0]);
        let (u, fx) = apply_ends(&u.record, &[undone(0)], now).expect("applies");
        assert_eq!(fx.end, Some(RunEnd::Undone));
        assert_eq!(u.record.process_state, ProcessState::Compensated);
        u.record.check(&p).expect("valid");
    }

    #[test]
    fn a_recheck_is_due_at_the_check_and_names_what_is_out() {
        let (r, _) = started(5, 2);
        let early = r.created_at;
        assert!(recheck(&r, early).is_err(), "not due yet");
        let later = r.created_at + RUN_RECHECK;
        let (t, fx) = recheck(&r, later).expect("due");
        assert_eq!(fx.open, vec![0, 1]);
        assert_eq!(t.record.complete_by, Some(later + RUN_RECHECK));
        t.record.check(&view().policies()).expect("valid");
        // A second supervisor with the same read loses: its condition names the old check.
        assert!(!t.condition.holds(Some(&t.record)));
    }

    #[test]
    fn the_record_check_finds_a_run_that_ended_but_still_runs() {
        let (mut r, _) = started(1, 1);
        if let Some(s) = r.run.as_mut() {
            s.ledger = Run::start(RunPlan {
                total: 0,
                max_concurrency: 1,
                tolerated: 0,
                undoable: true,
                chunk: 1,
            })
            .expect("empty")
            .0;
        }
        assert!(r.check(&view().policies()).is_err());
    }
}
