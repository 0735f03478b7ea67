//! A task's deadline (its workflow's `deadline`, from its submission): a task still going
//! forward (Pending, Processing) past it fails with `task_timeout`, whatever step it is at
//! ([`deadline_passed`], applied by the supervisor's `expire`); no scheduler claims a step for
//! it after the deadline (`claim` refuses: [`Rejection::PastDeadline`]).

use super::super::policy::Policies;
use super::super::state::{StateRecord, StepStatus, to_millis};
use super::branches;
use super::common::{Effect, Rejection, Transition, log, next, tidy};
use super::compensating::fail;
use super::{Condition, Guard};
use chrono::{DateTime, SecondsFormat, Utc};

/// The task's deadline passed (at `now`) while it went forward: every step out, or handed back
/// after it went out, may have taken effect: it timed out now, its undo waiting past the
/// deadline it went out with (a wait has nothing in flight); a group stops as on a failure.
/// Then as on any failure: the alert, and compensation (before the pivot, by the policy) or
/// `Error` for an operator.
///
/// Condition: same state (at the version read) - keeps "a deadline fails the task once": a
/// reply or a claim that won the race makes this read the record again.
pub(super) fn deadline_passed(
    r: &StateRecord,
    now: DateTime<Utc>,
    p: &Policies,
) -> Result<Transition, Rejection> {
    let now = to_millis(now);
    let Some(deadline) = r.task_deadline_applies().filter(|d| *d <= now) else {
        return Err(Rejection::NotDue { due: r.due_at() });
    };
    let mut n = next(r, now);
    let i = r.step_index;
    let deadline = deadline.to_rfc3339_opts(SecondsFormat::Millis, true);
    let effects: Vec<Effect> = if n.fanout.is_some() {
        // A group: the failure is at a step of it that did not finish, named with the group.
        branches::deadline_passed(&mut n, now, p, &deadline)
    } else {
        let reason = format!(
            "task_timeout: the task's deadline {deadline} passed at {}",
            r.steps.get(i).map_or("its end", |s| s.name.as_str())
        );
        let out = r.locked_by.is_some();
        let in_flight = out.then(|| r.complete_by.map_or(now, |d| d.max(now)));
        if let Some(step) = n.steps.get_mut(i).filter(|s| s.sent) {
            // Out, or handed back after it went out: it may have taken effect.
            step.status = StepStatus::TimedOut;
            step.finished_at = Some(now);
            step.finished_attempt = Some(r.attempt);
            step.sent_until = step.sent_until.max(in_flight);
        }
        n.locked_by = None;
        fail(&mut n, now, reason, p, in_flight)
    };
    log(
        &mut n,
        r.process_state,
        Some(i),
        "task_timeout: the task's deadline passed",
    );
    tidy(&mut n);
    Ok(Transition::from(
        r,
        Condition::on(r, vec![Guard::StateIs(r.process_state)]),
        n,
        effects,
    ))
}

#[cfg(test)]
mod tests {
    use super::super::testkit::*;
    use super::super::{apply_reply, deliver, retry, skip, wake};
    use super::*;
    use crate::domain::inbox::Delivery;
    use crate::domain::state::{NoticeKind, ProcessState};
    use chrono::Duration;
    use serde_json::json;

    /// Signed, a day's wait, then the payout; the task has an hour.
    const HOUR: &str = r#"name: hour
deadline: 1h
steps:
  - {name: sign, service: s, undo: {action: unsign}}
  - {name: cool-off, wait: 1d}
  - {name: payout, service: s, undo: {action: claw-back}}
"#;

    #[test]
    fn a_task_waiting_past_its_deadline_fails_and_what_it_did_is_undone() {
        let mut t = Harness::of(HOUR, json!({}), base());
        assert_eq!(t.r.deadline, Some(t.now + Duration::hours(1)));
        t.try_claim().expect("claims");
        let a = t.r.attempt;
        t.answer_at(0, a, &ok());
        // Waiting a day: the task is due at its deadline, an hour from its start.
        assert_eq!(t.r.due_at(), t.r.deadline);
        t.now += Duration::minutes(59);
        assert!(matches!(t.expire(), Err(Rejection::NotDue { .. })));
        t.now += Duration::minutes(1);
        let failed = t.expire().expect("the deadline passed");
        assert!(failed.effects.contains(&Effect::DeliverNotice));
        assert_eq!(t.r.owed(), [NoticeKind::Failed]);
        assert!(
            t.r.last_error
                .as_deref()
                .is_some_and(|e| e.starts_with("task_timeout: the task's deadline")
                    && e.ends_with("passed at cool-off")),
            "{:?}",
            t.r.last_error
        );
        // Its history names the code where it says why.
        assert!(
            t.r.history
                .iter()
                .any(|h| h.reason == "task_timeout: the task's deadline passed"),
            "{:?}",
            t.r.history
        );
        assert_eq!(t.r.process_state, ProcessState::Compensating);
        assert_eq!(
            (t.r.step_index, t.r.undo_after),
            (0, None),
            "the signature is undone at once: a wait has nothing in flight"
        );
    }

    #[test]
    fn a_step_out_at_the_deadline_timed_out_and_its_undo_waits_for_its_own_deadline() {
        const OUT: &str = r#"name: out
deadline: 5s
steps:
  - {name: sign, service: s, undo: {action: unsign}}
"#;
        let mut t = Harness::of(OUT, json!({}), base());
        t.try_claim().expect("claims");
        let step_deadline = t.r.complete_by.expect("out");
        t.now += Duration::seconds(5);
        t.expire().expect("the deadline passed");
        assert_eq!(t.r.steps[0].status, StepStatus::TimedOut);
        assert_eq!(t.r.process_state, ProcessState::Compensating);
        assert_eq!(
            t.r.undo_after,
            Some(step_deadline + t.p.at(0).undo_wait),
            "the undo waits past the step's own deadline"
        );
        // No step goes out for a task past its deadline.
        let mut t = Harness::of(OUT, json!({}), base());
        t.now += Duration::seconds(6);
        assert!(matches!(t.try_claim(), Err(Rejection::PastDeadline { .. })));
    }

    /// Found by the chaos run: an event (or an operator's wake) that comes after the deadline,
    /// before the supervisor applies it, must not end the wait and send the task on.
    #[test]
    fn past_the_deadline_an_event_or_a_wake_is_refused_and_the_deadline_fails_the_task() {
        const SIGN: &str = r#"name: sign
deadline: 1h
steps:
  - {name: hold, service: s, undo: {action: release}}
  - {name: answer, waitFor: signed, within: 2h}
  - {name: cool-off, wait: 2h}
"#;
        let signed = |id: Option<&str>| Delivery {
            name: "signed".into(),
            id: id.map(str::to_owned),
            payload: "{}".into(),
        };
        for case in ["event", "wake"] {
            let mut t = Harness::of(SIGN, json!({}), base());
            t.try_claim().expect("claims");
            let a = t.r.attempt;
            t.answer_at(0, a, &ok());
            if case == "wake" {
                let (p, now, d) = (t.p.clone(), t.now, signed(None));
                t.apply(|r, router| deliver(r, &d, now, &p, router))
                    .expect("signed in time");
            }
            t.now += Duration::hours(1);
            let (p, now, before) = (t.p.clone(), t.now, t.r.clone());
            let refused = if case == "event" {
                let d = signed(Some("e-1"));
                t.apply(|r, router| deliver(r, &d, now, &p, router))
            } else {
                t.apply(|r, _| wake(r, &ops(Some("go")), now, &p))
            };
            assert!(
                matches!(refused, Err(Rejection::PastDeadline { .. })),
                "{case}: {refused:?}"
            );
            assert_eq!(t.r, before, "{case}: nothing changed");
            t.expire().expect("the deadline passed");
            assert_eq!(t.r.process_state, ProcessState::Compensating, "{case}");
        }
    }

    #[test]
    fn past_the_pivot_the_deadline_leaves_the_task_in_error_and_a_retry_takes_it_over() {
        const PIVOT: &str = r#"name: pivot
deadline: 1h
steps:
  - {name: sign, service: s, undo: {action: unsign}}
  - {name: send, service: s, pivot: true}
  - {name: settle, wait: 2h}
  - {name: close, service: s}
"#;
        let mut t = Harness::of(PIVOT, json!({}), base());
        t.try_claim().expect("claims");
        let a = t.r.attempt;
        t.answer_at(0, a, &ok());
        t.answer_at(1, a, &ok());
        t.now += Duration::hours(1);
        t.expire().expect("the deadline passed");
        assert_eq!(t.r.process_state, ProcessState::Error, "past the pivot");
        let (p, now) = (t.p.clone(), t.now);
        t.apply(|r, _| retry(r, &ops(Some("late, but wanted")), now, &p))
            .expect("retry");
        assert_eq!(t.r.deadline, None, "the operator took it over");
        t.try_claim().expect("the wait starts again");
        t.now += Duration::hours(2);
        t.expire().expect("the wait ends");
        t.try_claim().expect("claims the last step");
        let a = t.r.attempt;
        t.answer_at(3, a, &ok());
        assert_eq!(t.r.process_state, ProcessState::Processed);
    }

    #[test]
    fn a_group_at_the_deadline_stops_every_branch_and_undoes_what_took_effect() {
        const GROUP: &str = r#"name: group
deadline: 30s
steps:
  - name: both
    parallel:
      - steps:
          - {name: hold, service: s, undo: {action: release}}
      - steps:
          - {name: book, service: s, undo: {action: unbook}}
          - {name: confirm, service: s}
"#;
        let mut t = Harness::of(GROUP, json!({}), base());
        t.try_claim().expect("claims");
        let book = t.r.fanout.as_ref().map_or(0, |f| f.branches[1].attempt);
        t.answer_at(1, book, &ok());
        t.now += Duration::seconds(30);
        t.expire().expect("the deadline passed");
        assert_eq!(t.r.process_state, ProcessState::Compensating);
        assert_eq!(
            t.r.steps[0].status,
            StepStatus::TimedOut,
            "the hold was out"
        );
        assert_eq!(t.r.steps[1].status, StepStatus::Done);
        assert_eq!(
            t.r.steps[2].status,
            StepStatus::TimedOut,
            "the confirm was out"
        );
        assert!(t.r.fanout.is_none());
        // Undone: the booking, and the hold (it may have taken effect), each after its own
        // step's deadline and the undo wait.
        let mut undone = vec![];
        while t.r.process_state == ProcessState::Compensating {
            if let Some(after) = t.r.undo_after.filter(|a| *a > t.now) {
                t.now = after;
            }
            if t.r.locked_by.is_none() {
                t.try_claim().expect("an undo");
            }
            let (i, a) = (t.r.step_index, t.r.attempt);
            undone.push(i);
            let (p, now) = (t.p.clone(), t.now);
            t.apply(|r, router| apply_reply(r, a, i, true, &ok(), now, &p, router))
                .expect("undone");
        }
        assert_eq!(undone, [1, 0]);
        assert_eq!(t.r.process_state, ProcessState::Compensated);
    }

    /// Found in review: one branch done (`a1`), the other deferred (its service paused), no
    /// branch out when the deadline passes. The failure is at the step that did not finish
    /// (`b1`, named with its group), never at the done one: an operator's skip gives `b1` its
    /// result and leaves `a1`'s (what its undo reads), and a retry runs `b1`, then the rest;
    /// every record on the way keeps its invariants.
    #[test]
    fn a_deadline_at_a_group_with_no_branch_out_fails_at_the_step_not_done() {
        const GROUP: &str = r#"name: group
deadline: 30s
steps:
  - name: both
    parallel:
      - steps:
          - {name: a1, service: s, undo: {action: unhold}}
      - steps:
          - {name: b1, service: p, undo: {action: unbook}}
  - {name: after, service: s}
"#;
        let mut t = Harness::of(
            GROUP,
            json!({}),
            Policy {
                auto_compensate: false,
                ..base()
            },
        );
        t.try_claim().expect("claims both branches");
        let attempt =
            |t: &Harness, b: usize| t.r.fanout.as_ref().map_or(0, |f| f.branches[b].attempt);
        let (a, b) = (attempt(&t, 0), attempt(&t, 1));
        let held = StepOutcome::Succeeded {
            result: Some(r#"{"hold":"h-1"}"#.into()),
        };
        t.answer_at(0, a, &held);
        let paused = StepOutcome::Deferred {
            until: t.now + Duration::minutes(5),
            misconfigured: None,
            paused: Some("p paused by ops".into()),
            limited: None,
        };
        t.answer_at(1, b, &paused);
        let a1_result = t.r.steps[0].result.clone();
        assert!(a1_result.is_some(), "a1 is done with its result");
        t.now += Duration::seconds(30);
        t.expire().expect("the deadline passed");
        assert_eq!(t.r.process_state, ProcessState::Error);
        assert_eq!(t.r.step_index, 1, "the failure is at b1, not at a1 (done)");
        let error = t.r.last_error.clone().unwrap_or_default();
        assert!(
            error.starts_with("task_timeout") && error.contains("both") && error.contains("b1"),
            "the reason names the group and the step not done: {error}"
        );
        assert_eq!(t.r.steps[0].status, StepStatus::Done);
        let failed = t.r.clone();

        // Skipped by hand: b1 gets the operator's result, a1 keeps its own.
        let (p, now) = (t.p.clone(), t.now);
        t.apply(|r, _| {
            skip(
                r,
                &ops(Some("booked by phone")),
                now,
                &p,
                Some(r#"{"booking":"by-hand"}"#.into()),
            )
        })
        .expect("skip");
        assert_eq!(t.r.steps[0].result, a1_result, "a1's result is untouched");
        assert_eq!(t.r.steps[1].status, StepStatus::Done);
        assert_eq!(
            t.r.steps[1].result.as_deref(),
            Some(r#"{"booking":"by-hand"}"#)
        );
        assert_eq!(
            (t.r.process_state, t.r.step_index),
            (ProcessState::Pending, 2),
            "the task goes on after the group"
        );

        // Retried instead: b1 runs (and only b1), then the rest; a1 stays as it ran.
        t.r = failed;
        let (p, now) = (t.p.clone(), t.now);
        t.apply(|r, _| retry(r, &ops(Some("p is back")), now, &p))
            .expect("retry");
        assert_eq!(t.r.steps[0].status, StepStatus::Done);
        assert_eq!(t.r.steps[0].result, a1_result);
        t.try_claim().expect("b1 goes out again");
        let fanout = t.r.fanout.clone().expect("the group runs");
        assert!(!fanout.branches[0].is_out(), "a1 is not sent again");
        assert!(fanout.branches[1].is_out(), "b1 is out");
        let b = fanout.branches[1].attempt;
        t.answer_at(1, b, &ok());
        assert_eq!(
            (t.r.process_state, t.r.step_index),
            (ProcessState::Pending, 2)
        );
        t.try_claim().expect("after");
        t.answer(2, &ok());
        assert_eq!(t.r.process_state, ProcessState::Processed);
        assert_eq!(t.r.steps[0].result, a1_result);
        assert!(t.r.steps.iter().all(|s| s.status == StepStatus::Done));
    }

    #[test]
    fn a_delayed_start_sends_nothing_before_its_time_and_is_enqueued_at_it() {
        const ONE: &str = "name: one\nsteps:\n  - {name: only, service: s}\n";
        let mut t = Harness::of(ONE, json!({}), base());
        let start = t.now + Duration::days(3);
        t.r = t.r.clone().starting_at(start);
        assert_eq!((t.r.complete_by, t.r.due_at()), (Some(start), Some(start)));
        assert!(matches!(t.try_claim(), Err(Rejection::TooEarly { until }) if until == start));
        t.now = start;
        let started = t.expire().expect("its time came");
        assert_eq!(
            started.effects,
            [Effect::Enqueue {
                delay: Duration::zero()
            }]
        );
        assert_eq!(t.r.requeues, 0, "not a missed pickup");
        t.try_claim().expect("claims");
        let a = t.r.attempt;
        t.answer_at(0, a, &ok());
        assert_eq!(t.r.process_state, ProcessState::Processed);
    }
}
