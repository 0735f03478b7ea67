//! Compensation: a failed task starts undoing, last first, every step that may have taken
//! effect ([`begin_compensation`], [`fail`]), and each undo's answer moves it to the next undo or
//! ends it ([`apply_undo_reply`]).

use super::super::fanout::{Stop, StopKind};
use super::super::policy::Policies;
use super::super::state::{
    NoticeKind, ProcessState, StateRecord, StepState, StepStatus, to_millis,
};
use super::common::{Effect, finish, log};
use chrono::{DateTime, Duration, Utc};

/// Starts undoing, last first, every step that may have taken effect: the record becomes
/// Compensating and unlocked, to be claimed after `delay`; with nothing to undo it is
/// Compensated at once.
///
/// `in_flight_until`: the deadline of the current step if it may still be in flight (timed
/// out or cancelled). Its undo then waits [`Policy::undo_wait`] past it, or past the latest
/// deadline a request for the step went out with if that is later (see
/// [`StepState::sent_until`]), and [`claim`] enforces that wait, so a stray work message cannot
/// send the undo early.
pub(super) fn begin_compensation(
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
            let in_flight = in_flight_until.filter(|_| i == n.step_index);
            if let Some(after) = undo_not_before(n, i, in_flight, p) {
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

/// When the undo of step `i` may go out, if its step may still be in flight: [`Policy::undo_wait`]
/// past the latest deadline a request for it went out with ([`StepState::sent_until`]: a step
/// handed back, timed out, cancelled, or stopped with its group), or past `in_flight` (the
/// deadline of the step that was current when it failed) if later.
fn undo_not_before(
    n: &StateRecord,
    i: usize,
    in_flight: Option<DateTime<Utc>>,
    p: &Policies,
) -> Option<DateTime<Utc>> {
    let t = match (n.undo_unit(i).and_then(|u| u.sent_until), in_flight) {
        (Some(a), Some(b)) => a.max(b),
        (a, b) => a.or(b)?,
    };
    Some(to_millis(t + p.at(i).undo_wait))
}

/// Every step that needed it is undone: the task ends Refused if a service refused a step, else
/// Compensated.
pub(super) fn compensated(n: &mut StateRecord) -> Vec<Effect> {
    if n.refusal.is_some() {
        finish(n, ProcessState::Refused, NoticeKind::Refused)
    } else {
        finish(n, ProcessState::Compensated, NoticeKind::Compensated)
    }
}

/// The task stops in Error for an operator (`reason`), whatever the policy on compensation:
/// the alert is owed.
pub(super) fn stop_in_error(n: &mut StateRecord, reason: String) -> Vec<Effect> {
    if n.branch().is_some() {
        return stop_branch(n, StopKind::Held, reason);
    }
    n.last_error = Some(reason);
    n.owe(NoticeKind::Failed);
    n.process_state = ProcessState::Error;
    n.locked_by = None;
    n.complete_by = None;
    vec![Effect::DeliverNotice]
}

/// A step of a branch failed (`kind`, `reason`), on the record as seen from that branch: the
/// branch stops (Error), and its group with it ([`Fanout::stop`], the first failure kept); the
/// task fails or compensates once no branch has a step out (see `branches`).
///
/// [`Fanout::stop`]: super::super::fanout::Fanout::stop
pub(super) fn stop_branch(n: &mut StateRecord, kind: StopKind, reason: String) -> Vec<Effect> {
    let step = n.step_index;
    n.last_error = Some(reason.clone());
    n.process_state = ProcessState::Error;
    n.locked_by = None;
    n.complete_by = None;
    if let Some(f) = n.fanout.as_mut() {
        f.stop.get_or_insert(Stop {
            step,
            reason,
            kind,
            alerted: false,
        });
    }
    vec![]
}

/// The task failed for good (`reason`): the operator alert is owed, and the task is either
/// compensated at once or left in Error, as the policy says. Past the pivot it only goes
/// forward: it is left in Error for an operator to retry.
pub(super) fn fail(
    n: &mut StateRecord,
    now: DateTime<Utc>,
    reason: String,
    p: &Policies,
    in_flight_until: Option<DateTime<Utc>>,
) -> Vec<Effect> {
    if n.branch().is_some() {
        return stop_branch(n, StopKind::Failed, reason);
    }
    n.last_error = Some(reason);
    n.owe(NoticeKind::Failed);
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

/// Applies an undo's answer: `refused` is the service's refusal, `None` a success.
pub(super) fn apply_undo_reply(
    n: &mut StateRecord,
    i: usize,
    refused: Option<&String>,
    now: DateTime<Utc>,
    p: &Policies,
) -> Vec<Effect> {
    let from = n.process_state;
    match refused {
        None => {
            n.set_undo(i, Some(StepStatus::Done));
            n.undo_after = None;
            // The next undo counts its own expired deadlines (its step's threshold).
            n.failure_count = 0;
            n.round = 0;
            // The next undo: another element of this forEach step, or an earlier step.
            match n.steps[..=i].iter().rposition(StepState::needs_undo) {
                Some(j) if undo_not_before(n, j, None, p).is_some_and(|t| t > now) => {
                    // Step `j` may still be in flight (a branch stopped while it was out): its
                    // undo waits, as the first undo does.
                    let after = undo_not_before(n, j, None, p).unwrap_or(now);
                    n.step_index = j;
                    n.locked_by = None;
                    n.undo_after = Some(after);
                    n.complete_by = Some(after + p.at(j).pickup_timeout);
                    log(
                        n,
                        from,
                        Some(i),
                        "undone; the next undo waits for its step to be over",
                    );
                    vec![Effect::Enqueue { delay: after - now }]
                }
                Some(j) => {
                    if j == i {
                        // The next element of the same forEach step: a new attempt, so a
                        // late answer to this element's undo cannot pass for the next one's
                        // (replies are fenced by attempt and step).
                        n.attempt += 1;
                    }
                    n.step_index = j;
                    n.set_undo(j, Some(StepStatus::Running));
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
            n.set_undo(i, Some(StepStatus::Failed));
            let reason = format!("undo of {}: {error}", n.steps[i].name);
            n.last_error = Some(reason.clone());
            let e = finish(
                n,
                ProcessState::CompensationFailed,
                NoticeKind::CompensationFailed,
            );
            log(n, from, Some(i), format!("undo refused: {reason}"));
            e
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::transition::testkit::*;
    use crate::domain::transition::*;

    #[test]
    fn a_refusal_at_the_first_step_leaves_nothing_to_undo() {
        let now = t0();
        let mut r = fresh(now);
        apply(&mut r, |r| claim(r, "s", now, &manual(), &Linear));
        apply(&mut r, |r| {
            apply_reply(r, 1, 0, false, &refused(), now, &manual(), &Linear)
        });
        assert_eq!(r.process_state, ProcessState::Error);
        assert_eq!(
            r.last_error.as_deref(),
            Some("reserve-inventory: card declined")
        );

        let mut r = fresh(now);
        apply(&mut r, |r| claim(r, "s", now, &policy(), &Linear));
        let t = apply(&mut r, |r| {
            apply_reply(r, 1, 0, false, &refused(), now, &policy(), &Linear)
        });
        assert_eq!(t.effects, [Effect::DeliverNotice]);
        assert_eq!(r.process_state, ProcessState::Compensated);
        assert_eq!(r.owed(), [NoticeKind::Failed, NoticeKind::Compensated]);
    }

    #[test]
    fn a_refusal_at_step_three_undoes_steps_two_then_one() {
        let p = policy();
        let now = t0();
        let mut r = fresh(now);
        run_to(&mut r, 2, now, &p);
        let t = apply(&mut r, |r| {
            apply_reply(r, 1, 2, false, &refused(), now, &p, &Linear)
        });
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
        assert_eq!(r.owed(), [NoticeKind::Failed]);
        apply(&mut r, |r| notice_delivered(r, now, None));
        let mut undone = vec![];
        let t = apply(&mut r, |r| claim(r, "s", now, &p, &Linear));
        assert_eq!(t.effects, [Effect::SendStepRequest]);
        while r.process_state == ProcessState::Compensating {
            undone.push(r.step_index);
            let (a, i) = (r.attempt, r.step_index);
            assert!(matches!(
                apply_reply(&r, a, i, false, &ok(), now, &p, &Linear),
                Err(Rejection::WrongDirection { .. })
            ));
            apply(&mut r, |r| {
                apply_reply(r, a, i, true, &ok(), now, &p, &Linear)
            });
        }
        assert_eq!(undone, [1, 0]);
        assert_eq!(r.process_state, ProcessState::Compensated);
        assert_eq!(
            r.steps[2].undo, None,
            "the refused step had no effect to undo"
        );
        assert_eq!(r.owed(), [NoticeKind::Compensated]);
    }

    #[test]
    fn each_undo_counts_its_own_expired_deadlines() {
        let p = policy();
        let mut now = t0();
        let mut r = fresh(now);
        run_to(&mut r, 2, now, &p);
        apply(&mut r, |r| {
            apply_reply(r, 1, 2, false, &refused(), now, &p, &Linear)
        });
        apply(&mut r, |r| notice_delivered(r, now, None));
        // The undo of step 1 times out twice, then is done.
        for _ in 0..2 {
            apply(&mut r, |r| claim(r, "s", now, &p, &Linear));
            now += p.at(1).step_timeout + p.at(1).retry_max_delay;
            apply(&mut r, |r| expire(r, now, &p, 0.0));
            now += p.at(1).retry_max_delay;
        }
        assert_eq!((r.step_index, r.failure_count), (1, 2));
        apply(&mut r, |r| claim(r, "s", now, &p, &Linear));
        let a = r.attempt;
        apply(&mut r, |r| {
            apply_reply(r, a, 1, true, &ok(), now, &p, &Linear)
        });
        // Step 0's undo starts with none of them.
        assert_eq!(
            (r.process_state, r.step_index, r.failure_count),
            (ProcessState::Compensating, 0, 0)
        );
    }

    #[test]
    fn an_undo_that_answers_later_has_a_steps_deadline_until_its_agent_accepts_it() {
        // A sub-workflow step's undo: its child's compensation may take an hour once started.
        let p = with(|p| p.undo_timeout = Some(Duration::hours(1)));
        let now = t0();
        let mut r = fresh(now);
        run_to(&mut r, 2, now, &p);
        apply(&mut r, |r| {
            apply_reply(r, 1, 2, false, &refused(), now, &p, &Linear)
        });
        apply(&mut r, |r| notice_delivered(r, now, None));
        apply(&mut r, |r| claim(r, "s", now, &p, &Linear));
        let (a, i) = (r.attempt, r.step_index);
        // Until its agent accepts it, a lost request is sent again at an ordinary deadline.
        assert_eq!(r.complete_by, Some(now + p.at(i).step_timeout));
        let later = now + Duration::seconds(3);
        let t = apply(&mut r, |r| {
            apply_reply(r, a, i, true, &StepOutcome::Accepted, later, &p, &Linear)
        });
        assert!(t.effects.is_empty());
        assert_eq!(r.complete_by, Some(later + Duration::hours(1)));
        assert_eq!(r.steps[i].undo, Some(StepStatus::Running));
        // Its end answers as any undo's does.
        apply(&mut r, |r| {
            apply_reply(r, a, i, true, &ok(), later, &p, &Linear)
        });
        assert_eq!((r.step_index, r.steps[i].undo), (0, Some(StepStatus::Done)));

        // An undo that answers at once (no undo timeout) accepts nothing.
        let p = policy();
        let mut r = fresh(now);
        run_to(&mut r, 2, now, &p);
        apply(&mut r, |r| {
            apply_reply(r, 1, 2, false, &refused(), now, &p, &Linear)
        });
        apply(&mut r, |r| claim(r, "s", now, &p, &Linear));
        let (a, i) = (r.attempt, r.step_index);
        assert!(matches!(
            apply_reply(&r, a, i, true, &StepOutcome::Accepted, now, &p, &Linear),
            Err(Rejection::NotACallbackStep(1))
        ));
    }

    #[test]
    fn an_undo_that_times_out_is_retried_then_fails_at_the_threshold() {
        let p = policy();
        let mut now = t0();
        let mut r = fresh(now);
        run_to(&mut r, 1, now, &p);
        apply(&mut r, |r| {
            apply_reply(r, 1, 1, false, &refused(), now, &p, &Linear)
        });
        for n in 1..=3 {
            apply(&mut r, |r| claim(r, "s", now, &p, &Linear));
            now += p.at(0).step_timeout;
            apply(&mut r, |r| expire(r, now, &p, 0.5));
            assert_eq!(r.failure_count, n);
            now += p.at(0).retry_max_delay;
        }
        assert_eq!(r.process_state, ProcessState::CompensationFailed);
        assert_eq!(r.steps[0].undo, Some(StepStatus::TimedOut));
    }

    #[test]
    fn a_refusal_compensates_and_ends_refused_without_an_alert() {
        let p = policy();
        let now = t0();
        let mut r = fresh(now);
        run_to(&mut r, 2, now, &p);
        let t = apply(&mut r, |r| {
            apply_reply(r, 1, 2, false, &declined(), now, &p, &Linear)
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
                apply(&mut r, |r| claim(r, "s", now, &p, &Linear));
            }
            let (a, i) = (r.attempt, r.step_index);
            apply(&mut r, |r| {
                apply_reply(r, a, i, true, &ok(), now, &p, &Linear)
            });
        }
        assert_eq!(r.process_state, ProcessState::Refused);
        assert_eq!(r.owed(), [NoticeKind::Refused]);
        assert!(!NoticeKind::Refused.is_alert());
        let refusal = r.refusal.clone().expect("kept");
        assert_eq!(
            (refusal.step.as_str(), refusal.code.as_str()),
            ("arrange-shipping", "declined")
        );

        // Refused at the first step: nothing to undo, Refused at once.
        let mut first = fresh(now);
        run_to(&mut first, 0, now, &p);
        apply(&mut first, |r| {
            apply_reply(r, 1, 0, false, &declined(), now, &p, &Linear)
        });
        assert_eq!(first.process_state, ProcessState::Refused);
        assert_eq!(first.owed(), [NoticeKind::Refused]);
    }

    #[test]
    fn a_refusal_past_the_pivot_stops_in_error_and_alerts() {
        let p = policy();
        let now = t0();
        let mut r = loan(now);
        run_to(&mut r, 3, now, &p);
        assert!(r.past_pivot());
        apply(&mut r, |r| {
            apply_reply(r, 1, 3, false, &declined(), now, &p, &Linear)
        });
        assert_eq!(r.process_state, ProcessState::Error);
        assert_eq!(r.owed(), [NoticeKind::Failed], "a person must decide");
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
                apply(&mut r, |r| claim(r, "s", at, &p, &Linear));
            }
            at = r.complete_by.expect("deadline");
            apply(&mut r, |r| expire(r, at, &p, 0.5));
        }
        assert_eq!(r.steps[1].status, StepStatus::TimedOut);
        assert_eq!(r.step_index, 1, "the step that timed out is undone first");
        let after = at + p.at(1).undo_wait;
        assert_eq!(r.undo_after, Some(after));
        assert_eq!(
            claim(&r, "s", at, &p, &Linear).err(),
            Some(Rejection::TooEarly { until: after })
        );
        apply(&mut r, |r| claim(r, "s", after, &p, &Linear));
        let a = r.attempt;
        apply(&mut r, |r| {
            apply_reply(r, a, 1, true, &ok(), after, &p, &Linear)
        });
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
        // Runs to step 1 and answers each attempt at it "spent" a step timeout after its pickup
        // until the record is in `state`: the last answer's time and the last attempt's deadline.
        let spend_step_1 = |r: &mut StateRecord, state: ProcessState, p: &Policies| {
            run_to(r, 1, now, p);
            let mut at = now;
            let mut deadline = r.complete_by.expect("deadline");
            while r.process_state != state {
                if r.process_state == ProcessState::Pending {
                    at = r.complete_by.expect("pickup");
                    apply(r, |r| claim(r, "s", at, p, &Linear));
                }
                deadline = r.complete_by.expect("deadline");
                at += p.at(1).step_timeout;
                let a = r.attempt;
                apply(r, |r| apply_reply(r, a, 1, false, &spent, at, p, &Linear));
            }
            (at, deadline)
        };

        // A timed-out reply at the threshold: the undo waits past the attempt's deadline, not
        // past the reply.
        let mut r = fresh(now);
        let (at, deadline) = spend_step_1(&mut r, ProcessState::Compensating, &p);
        assert!(at < deadline, "the reply came before the deadline");
        assert_eq!(r.undo_after, Some(deadline + p.at(1).undo_wait));

        // A cancel of a step handed back by such a reply: the same.
        let mut r = fresh(now);
        run_to(&mut r, 1, now, &p);
        let deadline = r.complete_by.expect("deadline");
        let at = now + p.at(1).step_timeout;
        apply(&mut r, |r| {
            apply_reply(r, 1, 1, false, &spent, at, &p, &Linear)
        });
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
        let (at, deadline) = spend_step_1(&mut r, ProcessState::Error, &manual);
        assert_eq!(r.steps[1].sent_until, Some(deadline));
        apply(&mut r, |r| compensate(r, &ops(None), at, &manual));
        assert_eq!(r.undo_after, Some(deadline + manual.at(1).undo_wait));
    }

    #[test]
    fn compensation_skips_a_step_without_an_undo() {
        let p = policy();
        let now = t0();
        let mut r = loan(now);
        run_to(&mut r, 2, now, &p);
        let t = apply(&mut r, |r| {
            apply_reply(r, 1, 2, false, &refused(), now, &p, &Linear)
        });
        assert_eq!(r.process_state, ProcessState::Compensating);
        assert_eq!(
            r.step_index, 1,
            "reserve-funds is undone first, send-contract was refused"
        );
        assert!(t.effects.contains(&Effect::DeliverNotice));
        claim_and_answer(&mut r, 1, true, &ok(), now, &p);
        assert_eq!(r.process_state, ProcessState::Compensated);
        assert_eq!(r.steps[0].undo, None, "check-credit is never undone");
        assert_eq!(r.steps[0].status, StepStatus::Done);
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
        apply(&mut r, |r| {
            apply_reply(r, 1, 1, false, &faulted, now, &p, &Linear)
        });
        assert_eq!(r.steps[1].status, StepStatus::Faulted);
        assert_eq!(r.process_state, ProcessState::Compensating);
        assert_eq!(
            r.step_index, 1,
            "the faulted step took effect: it is undone first"
        );
    }
}
