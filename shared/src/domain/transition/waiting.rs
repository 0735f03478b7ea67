//! Wait steps: a step that calls no service and is done when its time comes. Reached (by a
//! claim, or by the step before it done), it waits under that claim with its time as the
//! record's deadline ([`begin_wait`]); the supervisor, finding the deadline passed (on a timer
//! or its sweep), completes it ([`woke`]). Nothing runs while a task waits.

use super::super::inbox::{self, Delivery, KeptEvent};
use super::super::policy::Policies;
use super::super::state::{
    MAX_RESULTS_BYTES, NoticeKind, ProcessState, StateRecord, StepStatus, to_millis,
};
use super::branches;
use super::common::{
    Actor, Effect, Rejection, Transition, end_line, finish, log, log_by, next, tidy,
};
use super::compensating::fail;
use super::route::Router;
use super::{Condition, Guard};
use chrono::{DateTime, Duration, Utc};

/// An operator ends the waits the task is in, now (its wait step, or every branch's that
/// waits): each is done as at its time, and the task goes on. Audited: the history names the
/// operator and the reason.
///
/// Condition: same state and attempt (at the version read) - keeps "a wait ends once": a wait
/// that ended meanwhile (its time, a cancel) makes this read the record again.
pub fn wake(
    r: &StateRecord,
    actor: &Actor,
    now: DateTime<Utc>,
    p: &Policies,
) -> Result<Transition, Rejection> {
    let now = to_millis(now);
    if r.fanout.is_some() && r.branch().is_none() {
        let event = |seen: &StateRecord| wake(seen, actor, now, p);
        let claim_none = |_: &StateRecord, _: &str| Err(Rejection::NotClaimable(r.process_state));
        return branches::wake(r, now, p, &event, &claim_none);
    }
    if let Some(deadline) = r.task_deadline_applies().filter(|d| *d <= now) {
        // Past the task's deadline nothing goes on: the supervisor fails the task.
        return Err(Rejection::PastDeadline { deadline });
    }
    let i = r.step_index;
    let waits =
        r.process_state == ProcessState::Processing && r.locked_by.is_some() && p.at(i).wait;
    if !waits {
        return Err(Rejection::NoWait(r.process_state));
    }
    if p.at(i).event {
        // A wait for an event ends with its event: the operator delivers it.
        let name = r.steps.get(i).map_or_else(String::new, |s| s.name.clone());
        return Err(Rejection::WaitsForEvent(name));
    }
    let mut n = next(r, now);
    // One history line: the wait ended by the operator's wake (who and why).
    let effects = woke_by(&mut n, i, now, now, p, &actor.line("wake"), Some(&actor.by));
    tidy(&mut n);
    Ok(Transition::from(
        r,
        Condition::on(
            r,
            vec![Guard::StateIs(r.process_state), Guard::AttemptIs(r.attempt)],
        ),
        n,
        effects,
    ))
}

/// Wait step `at` is reached: it waits until `until` (its deadline; at once if that has
/// passed) under the claim that reached it, with nothing sent. A timer wakes it (or, for a wait
/// longer than a timer can be delayed, the sweep: see [`Effect::Timer`]); see [`woke`].
pub(super) fn begin_wait(
    n: &mut StateRecord,
    at: usize,
    until: DateTime<Utc>,
    now: DateTime<Utc>,
    from: ProcessState,
) -> Vec<Effect> {
    let until = to_millis(until.max(now));
    n.process_state = ProcessState::Processing;
    n.complete_by = Some(until);
    let step = &mut n.steps[at];
    step.status = StepStatus::Waiting;
    step.waiting_until = Some(until);
    step.sent = true;
    log(
        n,
        from,
        Some(at),
        format!(
            "waits until {}",
            until.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
        ),
    );
    vec![Effect::Timer {
        step: at,
        attempt: n.attempt,
        at: until,
    }]
}

/// Wait step `i` reached its time (`until`): it is done (its result that time), and the task
/// (or its branch) goes on from the next step, which a scheduler claims (the supervisor sends
/// nothing).
pub(super) fn woke(
    n: &mut StateRecord,
    i: usize,
    until: DateTime<Utc>,
    now: DateTime<Utc>,
    p: &Policies,
) -> Vec<Effect> {
    let result = serde_json::json!({
        "until": until.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
    })
    .to_string();
    wait_done(n, i, result, now, p, "waited", None)
}

/// As [`woke`], the wait ended by an operator: its one history line is `line`, by `by`.
pub(super) fn woke_by(
    n: &mut StateRecord,
    i: usize,
    until: DateTime<Utc>,
    now: DateTime<Utc>,
    p: &Policies,
    line: &str,
    by: Option<&str>,
) -> Vec<Effect> {
    let result = serde_json::json!({
        "until": until.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
    })
    .to_string();
    wait_done(n, i, result, now, p, line, by)
}

/// Wait step `at` is reached (see [`begin_wait`]); a wait for events whose event was kept
/// (delivered before it) ends at once with it, nothing armed.
#[allow(clippy::too_many_arguments)]
pub(super) fn reach_wait(
    n: &mut StateRecord,
    at: usize,
    until: DateTime<Utc>,
    now: DateTime<Utc>,
    from: ProcessState,
    events: &[String],
    p: &Policies,
) -> Vec<Effect> {
    let effects = begin_wait(n, at, until, now, from);
    match n.inbox.take(events) {
        Some(kept) => {
            let result = inbox::result_of(&kept.name, &kept.payload);
            let line = format!("event {} came before it", kept.name);
            wait_done(n, at, result, now, p, &line, None)
        }
        None => effects,
    }
}

/// Wait step `i` is over (`result`): done, and the task (or its branch) goes on from the next
/// step, which a scheduler claims.
fn wait_done(
    n: &mut StateRecord,
    i: usize,
    result: String,
    now: DateTime<Utc>,
    p: &Policies,
    line: &str,
    by: Option<&str>,
) -> Vec<Effect> {
    let from = n.process_state;
    let attempt = n.attempt;
    let step = &mut n.steps[i];
    step.status = StepStatus::Done;
    step.finished_at = Some(now);
    step.finished_attempt = Some(attempt);
    step.result = Some(result);
    n.locked_by = None;
    n.last_error = None;
    let progress = p.at(i).progress(NoticeKind::StepCompleted);
    // The steps already decided not to run are passed; the claim routes the rest.
    n.step_index = n.next_not_skipped(i + 1);
    if n.step_index >= n.end() {
        let mut e = finish(n, ProcessState::Processed, NoticeKind::Processed);
        if n.branch().is_some() {
            // The end of a branch, not of the task.
            e.insert(0, progress);
        }
        let end = end_line(n);
        log_by(n, from, Some(i), format!("{line}; {end}"), by);
        return e;
    }
    n.process_state = ProcessState::Pending;
    n.complete_by = if n.fanout.as_ref().is_some_and(|f| f.stop.is_some()) {
        // The branch's group is stopping: its next step is not claimed.
        None
    } else {
        Some(now + p.at(n.step_index).pickup_timeout)
    };
    log_by(n, from, Some(i), line, by);
    vec![
        progress,
        Effect::Enqueue {
            delay: Duration::zero(),
        },
    ]
}

/// A wait for events passed its time (`due`) with none delivered: the step fails
/// (`event_timeout`), and the task with it (as a failure: the alert, compensation or Error).
pub(super) fn event_timed_out(
    n: &mut StateRecord,
    i: usize,
    due: DateTime<Utc>,
    now: DateTime<Utc>,
    p: &Policies,
) -> Vec<Effect> {
    let attempt = n.attempt;
    let step = &mut n.steps[i];
    step.status = StepStatus::TimedOut;
    step.finished_at = Some(now);
    step.finished_attempt = Some(attempt);
    n.locked_by = None;
    let reason = format!(
        "event_timeout: {}: no event it waits for by {}",
        n.steps[i].name,
        due.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
    );
    let from = n.process_state;
    let effects = fail(n, now, reason, p, None);
    log(n, from, Some(i), "no event by its time");
    effects
}

/// A named event is delivered (`d`): the wait for it the task is in (its wait step, or a
/// branch's) ends with it, its result `{event, payload}`; else, if a step still to come waits
/// for it, it is kept for that step (see [`Inbox`]). Refused: a repeat of an event taken (its
/// `Event-Id`), one no step still to come waits for (too late: that step passed, or the task
/// ended), one past the task's deadline (the supervisor fails the task: nothing goes on, as
/// no step is claimed), one more than a task keeps, one whose result would take the task's
/// results (its kept events included) past [`MAX_RESULTS_BYTES`] (it would push a later
/// service's answer into `result_too_large`).
///
/// Condition: same state (at the version read) - keeps "an event is taken once": a delivery
/// or another write that won the race makes this one read the record again.
pub fn deliver(
    r: &StateRecord,
    d: &Delivery,
    now: DateTime<Utc>,
    p: &Policies,
    router: &dyn Router,
) -> Result<Transition, Rejection> {
    if r.inbox.has_seen(d.id.as_deref()) {
        return Err(Rejection::DuplicateEvent);
    }
    if !matches!(
        r.process_state,
        ProcessState::Pending | ProcessState::Processing
    ) {
        return Err(Rejection::EventTooLate(r.process_state));
    }
    let now = to_millis(now);
    if let Some(deadline) = r.task_deadline_applies().filter(|d| *d <= now) {
        return Err(Rejection::PastDeadline { deadline });
    }
    // As stored: a payload past the inline size counts as its reference.
    let used = r.results_bytes();
    let bytes = crate::domain::payload::stored_bytes(inbox::result_of(&d.name, &d.payload).len());
    if used + bytes > MAX_RESULTS_BYTES {
        return Err(Rejection::OverResultsBudget { bytes, used });
    }
    let waits_for = |i: usize| p.at(i).event && router.events(i).contains(&d.name);
    if let Some(f) = r.fanout.as_ref().filter(|_| r.branch().is_none()) {
        let waiting = (0..f.branches.len())
            .find(|b| f.branches[*b].is_out() && waits_for(f.branches[*b].step_index));
        if let Some(b) = waiting {
            let event = |seen: &StateRecord| deliver(seen, d, now, p, router);
            let claim_none =
                |_: &StateRecord, _: &str| Err(Rejection::NotClaimable(r.process_state));
            return branches::apply_to(r, vec![b], now, p, &event, &claim_none);
        }
    }
    let i = r.step_index;
    let mut n = next(r, now);
    let effects = if r.branch().is_some()
        || (r.fanout.is_none()
            && r.process_state == ProcessState::Processing
            && r.locked_by.is_some()
            && waits_for(i))
    {
        // (Seen from a branch, the branch waits for it: chosen above.)
        n.inbox.remember(d.id.as_deref());
        let line = format!("event {} came", d.name);
        wait_done(
            &mut n,
            i,
            inbox::result_of(&d.name, &d.payload),
            now,
            p,
            &line,
            None,
        )
    } else {
        let to_come = (0..r.steps.len()).any(|j| {
            router.events(j).contains(&d.name)
                && r.steps[j].status == StepStatus::Pending
                && !r.steps[j].sent
        });
        if !to_come {
            return Err(Rejection::EventTooLate(r.process_state));
        }
        if n.inbox.kept.len() >= inbox::MAX_KEPT {
            return Err(Rejection::TooManyEvents);
        }
        n.inbox.remember(d.id.as_deref());
        n.inbox.kept.push(KeptEvent {
            payload_ref: None,
            name: d.name.clone(),
            id: d.id.clone(),
            payload: d.payload.clone(),
            at: now,
        });
        log(
            &mut n,
            r.process_state,
            None,
            format!("event {} kept for its step", d.name),
        );
        vec![]
    };
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
    use super::super::common::{Rejection, Transition};
    use super::super::testkit::*;
    use super::super::{apply_reply, cancel, claimed_in_place, deliver, wake};
    use super::*;
    use crate::domain::state::{NoticeKind, ProcessState, StepStatus};
    use serde_json::json;

    /// A contract signed, then 14 days of cooling off, then the payout (which reads when the
    /// wait ended). Steps: sign 0, cooling-off 1, payout 2.
    const COOL: &str = r#"name: cool
steps:
  - {name: sign, service: s, undo: {action: unsign}}
  - {name: cooling-off, wait: 14d}
  - {name: payout, service: s, input: {after: "$.steps['cooling-off'].result.until"}}
"#;

    #[test]
    fn a_wait_holds_the_task_until_its_time_with_nothing_sent_then_the_next_step_goes_out() {
        let mut t = Harness::of(COOL, json!({}), base());
        t.claim();
        let done = t.answer(0, &ok());
        let until = t.now + Duration::days(14);
        // The signature's answer starts the wait in its write: no request, a timer.
        assert_eq!(
            done.effects,
            [
                Effect::Progress(NoticeKind::StepCompleted),
                Effect::Timer {
                    step: 1,
                    attempt: t.r.attempt,
                    at: until
                }
            ]
        );
        assert_eq!(
            (t.r.process_state, t.r.step_index, t.r.steps[1].status),
            (ProcessState::Processing, 1, StepStatus::Waiting)
        );
        assert_eq!((t.r.complete_by, t.r.due_at()), (Some(until), Some(until)));
        // Nothing answers a wait: a reply under its attempt (none can come: nothing went
        // out) changes nothing.
        let (p, now, a) = (t.p.clone(), t.now, t.r.attempt);
        assert!(matches!(
            t.apply(|r, router| apply_reply(r, a, 1, false, &ok(), now, &p, router)),
            Err(Rejection::AWait(1))
        ));
        // Not before its time.
        t.now += Duration::days(13);
        assert!(matches!(t.expire(), Err(Rejection::NotDue { .. })));
        t.now = until;
        let woke = t.expire().expect("its time came");
        assert_eq!(
            woke.effects,
            [
                Effect::Progress(NoticeKind::StepCompleted),
                Effect::Enqueue {
                    delay: Duration::zero()
                }
            ]
        );
        assert_eq!(t.r.steps[1].status, StepStatus::Done);
        assert_eq!(
            t.r.results()["cooling-off"]["result"],
            json!({"until": until.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)})
        );
        assert_eq!(
            (t.r.process_state, t.r.step_index),
            (ProcessState::Pending, 2)
        );
        t.claim();
        t.answer(2, &ok());
        assert_eq!(t.r.process_state, ProcessState::Processed);
    }

    #[test]
    fn a_wait_until_a_time_read_from_the_input_and_one_past_is_due_at_once() {
        const UNTIL: &str = r#"name: until
steps:
  - {name: remind, waitUntil: $.input.at}
  - {name: send, service: s}
"#;
        let now = t0();
        let at = now + Duration::hours(30);
        let mut t = Harness::of(UNTIL, json!({"at": at.to_rfc3339()}), base());
        let claimed = t.claim();
        assert!(matches!(claimed.effects[..], [Effect::Timer { step: 0, at: a, .. }] if a == at));
        assert_eq!(t.r.complete_by, Some(at));

        let mut t = Harness::of(
            UNTIL,
            json!({"at": (now - Duration::hours(1)).to_rfc3339()}),
            base(),
        );
        t.claim();
        assert_eq!(t.r.complete_by, Some(t.now), "past: due now");
        t.expire().expect("due at once");
        assert_eq!(
            (t.r.process_state, t.r.step_index),
            (ProcessState::Pending, 1)
        );
    }

    #[test]
    fn a_wait_whose_time_is_not_one_fails_its_step_and_what_was_done_is_undone() {
        const UNTIL: &str = r#"name: until
steps:
  - {name: sign, service: s, undo: {action: unsign}}
  - {name: remind, waitUntil: $.input.at}
"#;
        let mut t = Harness::of(UNTIL, json!({"at": "tomorrow at nine"}), base());
        t.claim();
        t.answer(0, &ok());
        assert_eq!(t.r.process_state, ProcessState::Compensating);
        assert_eq!(t.r.steps[1].status, StepStatus::Failed);
        assert!(
            t.r.last_error
                .as_deref()
                .is_some_and(|e| e.contains("input_mapping_failed: waitUntil")
                    && e.contains("not an RFC 3339 time")),
            "{:?}",
            t.r.last_error
        );
        assert_eq!(t.r.step_index, 0, "the signature is undone");
    }

    #[test]
    fn a_cancelled_wait_compensates_what_was_done_and_waits_for_nothing() {
        let mut t = Harness::of(COOL, json!({}), base());
        t.claim();
        t.answer(0, &ok());
        let (p, now) = (t.p.clone(), t.now);
        t.apply(|r, _| cancel(r, &ops(Some("changed their mind")), now, &p))
            .expect("cancel");
        assert_eq!(t.r.steps[1].status, StepStatus::Cancelled);
        assert_eq!(
            (t.r.process_state, t.r.step_index, t.r.undo_after),
            (ProcessState::Compensating, 0, None),
            "the signature's undo goes at once: the wait had nothing in flight"
        );
        t.claim();
        let a = t.r.attempt;
        t.apply(|r, router| apply_reply(r, a, 0, true, &ok(), now, &p, router))
            .expect("the undo");
        assert_eq!(t.r.process_state, ProcessState::Compensated);
    }

    #[test]
    fn a_wait_in_a_branch_ends_with_its_group_when_another_branch_is_refused() {
        const GROUP: &str = r#"name: group
steps:
  - name: both
    parallel:
      - steps:
          - {name: hold, service: s, undo: {action: release}}
      - steps:
          - {name: settle, wait: 2d}
          - {name: notify, service: s}
"#;
        let mut t = Harness::of(GROUP, json!({}), base());
        let opened = t.claim();
        assert!(
            opened
                .effects
                .iter()
                .any(|e| matches!(e, Effect::Timer { step: 1, .. })),
            "{opened:?}"
        );
        assert_eq!(t.r.steps[1].status, StepStatus::Waiting);
        let hold = t.r.fanout.as_ref().map_or(0, |f| f.branches[0].attempt);
        let (p, now) = (t.p.clone(), t.now);
        t.apply(|r, router| apply_reply(r, hold, 0, false, &declined(), now, &p, router))
            .expect("the hold refused");
        // Nothing is in flight in a wait: the group stops at once, not in two days.
        assert_eq!(t.r.process_state, ProcessState::Refused);
        assert_eq!(t.r.steps[1].status, StepStatus::Pending);
        assert_eq!(t.r.steps[2].status, StepStatus::Pending);
    }

    #[test]
    fn an_operator_ends_a_wait_early_and_the_history_says_who_and_why() {
        let mut t = Harness::of(COOL, json!({}), base());
        t.claim();
        t.answer(0, &ok());
        t.now += Duration::hours(1);
        let (p, now) = (t.p.clone(), t.now);
        let woken = t
            .apply(|r, _| wake(r, &ops(Some("the customer waived it")), now, &p))
            .expect("wake");
        assert!(woken.effects.contains(&Effect::Enqueue {
            delay: Duration::zero()
        }));
        assert_eq!(t.r.steps[1].status, StepStatus::Done);
        assert_eq!(
            t.r.results()["cooling-off"]["result"]["until"],
            json!(now.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        );
        let line = t.r.history.last().expect("a line");
        assert_eq!(line.reason, "operator wake: the customer waived it");
        assert!(line.by.is_some());
        // One wake, one line: the wait ended by the operator, from Processing on.
        let lines: Vec<_> = t.r.history.iter().filter(|h| h.at == now).collect();
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert_eq!(
            (lines[0].from, lines[0].to),
            (ProcessState::Processing, ProcessState::Pending)
        );
        // No wait now: a second wake is refused.
        assert!(matches!(
            t.apply(|r, _| wake(r, &ops(None), now, &p)),
            Err(Rejection::NoWait(ProcessState::Pending))
        ));
    }

    #[test]
    fn a_wake_ends_every_branch_that_waits() {
        const TWO: &str = r#"name: two
steps:
  - name: both
    parallel:
      - steps: [{name: a, wait: 1d}, {name: after-a, service: s}]
      - steps: [{name: b, wait: 2d}]
"#;
        let mut t = Harness::of(TWO, json!({}), base());
        t.claim();
        assert_eq!(
            (t.r.steps[0].status, t.r.steps[2].status),
            (StepStatus::Waiting, StepStatus::Waiting)
        );
        let (p, now) = (t.p.clone(), t.now);
        t.apply(|r, _| wake(r, &ops(Some("go")), now, &p))
            .expect("wake");
        assert_eq!(
            (t.r.steps[0].status, t.r.steps[2].status),
            (StepStatus::Done, StepStatus::Done)
        );
        t.claim();
        let a = t.r.fanout.as_ref().map_or(0, |f| f.branches[0].attempt);
        let (p, now) = (t.p.clone(), t.now);
        t.apply(|r, router| apply_reply(r, a, 1, false, &ok(), now, &p, router))
            .expect("after-a");
        assert_eq!(t.r.process_state, ProcessState::Processed);
    }

    /// A contract sent, then a wait for its signature (or its refusal), at most 7 days; the
    /// payout reads who signed. Steps: send 0, signature 1, payout 2.
    const SIGN: &str = r#"name: sign
steps:
  - {name: send, service: s, undo: {action: withdraw}}
  - name: signature
    waitFor: [contract-signed, contract-declined]
    within: 7d
    payload: {type: object, required: [by]}
  - {name: payout, service: s, input: {by: "$.steps['signature'].result.payload.by"}}
"#;

    fn event(name: &str, id: &str) -> Delivery {
        Delivery {
            name: name.into(),
            id: Some(id.into()),
            payload: json!({"by": "ann"}).to_string(),
        }
    }

    impl Harness {
        fn deliver(&mut self, d: &Delivery) -> Result<Transition, Rejection> {
            let (p, now) = (self.p.clone(), self.now);
            self.apply(|r, router| deliver(r, d, now, &p, router))
        }
    }

    /// A reply that reaches a wait whose event came before it hands the task back with a work
    /// message due at once; made in place, the claim that message brings goes in the same
    /// write: the next step goes out, and nothing comes back to the work queue.
    #[test]
    fn a_reply_that_hands_the_task_back_at_once_takes_its_claim_in_the_same_write() {
        let mut t = Harness::of(SIGN, json!({}), base());
        t.deliver(&event("contract-signed", "e-1")).expect("kept");
        t.claim();
        let before = t.r.clone();
        let (p, now) = (t.p.clone(), t.now);
        let reached = t
            .apply(|r, router| {
                let back = apply_reply(r, before.attempt, 0, false, &ok(), now, &p, router)?;
                assert_eq!(back.record.process_state, ProcessState::Pending);
                assert!(back.effects.contains(&Effect::Enqueue {
                    delay: Duration::zero()
                }));
                Ok(claimed_in_place(r, back, "scheduler-2", now, &p, router))
            })
            .expect("applies");
        assert_eq!(t.r.process_state, ProcessState::Processing);
        assert_eq!(t.r.steps[2].status, StepStatus::Running);
        assert_eq!(t.r.locked_by.as_deref(), Some("scheduler-2"));
        assert_eq!(
            (t.r.version, t.r.attempt),
            (before.version + 1, before.attempt + 1),
            "one write, one claim"
        );
        assert_eq!(
            t.r.since, before.since,
            "as stored, it never left Processing"
        );
        assert!(reached.effects.contains(&Effect::SendStepRequest));
        assert!(
            !reached
                .effects
                .iter()
                .any(|e| matches!(e, Effect::Enqueue { .. })),
            "{:?}",
            reached.effects
        );
        let reasons: Vec<&str> =
            t.r.history
                .iter()
                .rev()
                .take(2)
                .map(|h| h.reason.as_str())
                .collect();
        assert_eq!(reasons[0], "claimed");
        assert!(reasons[1].contains("came before it"), "{reasons:?}");
        // A retry due at once is a recovery: its claim stays the scheduler's, from the work
        // message.
        let mut retry = Harness::of(
            SIGN,
            json!({}),
            Policy {
                retry_base_delay: Duration::zero(),
                ..base()
            },
        );
        retry.claim();
        let (rp, rnow, ra) = (retry.p.clone(), retry.now, retry.r.attempt);
        let timed_out = StepOutcome::TimedOut {
            error: "no answer".into(),
        };
        retry
            .apply(|r, router| {
                let back = apply_reply(r, ra, 0, false, &timed_out, rnow, &rp, router)?;
                assert!(back.effects.contains(&Effect::Enqueue {
                    delay: Duration::zero()
                }));
                let same = claimed_in_place(r, back.clone(), "scheduler-2", rnow, &rp, router);
                assert_eq!(same, back, "a retry is not claimed in place");
                Ok(same)
            })
            .expect("applies");
        assert_eq!(retry.r.process_state, ProcessState::Pending);
        // A transition that does not hand the task back is left as it is.
        let (p, now, a) = (t.p.clone(), t.now, t.r.attempt);
        t.apply(|r, router| {
            let done = apply_reply(r, a, 2, false, &ok(), now, &p, router)?;
            let same = claimed_in_place(r, done.clone(), "scheduler-2", now, &p, router);
            assert_eq!(same, done);
            Ok(same)
        })
        .expect("applies");
        assert_eq!(t.r.process_state, ProcessState::Processed);
    }

    #[test]
    fn an_event_delivered_early_is_kept_and_ends_its_wait_when_reached_and_a_repeat_is_harmless() {
        let mut t = Harness::of(SIGN, json!({}), base());
        let kept = t.deliver(&event("contract-signed", "e-1")).expect("kept");
        assert!(kept.effects.is_empty());
        assert_eq!(t.r.inbox.kept.len(), 1);
        assert!(matches!(
            t.deliver(&event("contract-signed", "e-1")),
            Err(Rejection::DuplicateEvent)
        ));
        t.claim();
        let reached = t.answer(0, &ok());
        // Reached, the wait ends at once with the kept event: no timer.
        assert!(
            !reached
                .effects
                .iter()
                .any(|e| matches!(e, Effect::Timer { .. })),
            "{reached:?}"
        );
        assert_eq!(t.r.steps[1].status, StepStatus::Done);
        assert_eq!(
            t.r.results()["signature"]["result"],
            json!({"event": "contract-signed", "payload": {"by": "ann"}})
        );
        assert!(t.r.inbox.kept.is_empty());
        // Too late for the other name: the step that waited for it passed.
        assert!(matches!(
            t.deliver(&event("contract-declined", "e-2")),
            Err(Rejection::EventTooLate(ProcessState::Pending))
        ));
        t.claim();
        t.answer(2, &ok());
        assert_eq!(t.r.process_state, ProcessState::Processed);
    }

    /// An event whose payload (of text `len` bytes) is a JSON string.
    fn event_of(name: &str, id: &str, len: usize) -> Delivery {
        Delivery {
            name: name.into(),
            id: Some(id.into()),
            payload: json!("x".repeat(len - 2)).to_string(),
        }
    }

    /// An event becomes a step's result, so it counts against the task's results budget (128
    /// KiB as stored: a payload past the inline size counts as its reference), kept ones too:
    /// one that would take the task past it is refused, naming its payload, and a wait it was
    /// for goes on for one that fits.
    #[test]
    fn events_count_against_the_results_budget_kept_ones_too() {
        use crate::domain::inbox::MAX_PAYLOAD_BYTES;
        use crate::domain::payload::REF_BYTES;
        use crate::domain::state::MAX_RESULTS_BYTES;
        // 16 results of 8,000 bytes (inline), then `last` (events delivered while it runs are
        // kept) if `kept`, then the wait.
        let harness = |kept: bool| {
            let yaml = format!(
                "name: full\nsteps:\n{}{}  - {{name: signature, waitFor: contract-signed, within: 7d}}\n",
                (0..16)
                    .map(|i| format!("  - {{name: s{i}, service: s}}\n"))
                    .collect::<String>(),
                if kept {
                    "  - {name: last, service: s}\n"
                } else {
                    ""
                }
            );
            let mut t = Harness::of(&yaml, json!({}), base());
            t.claim();
            let answer = StepOutcome::Succeeded {
                result: Some(json!("r".repeat(8_000 - 2)).to_string()),
            };
            for i in 0..16 {
                t.answer(i, &answer);
            }
            assert_eq!(t.r.results_bytes(), 128_000);
            t
        };

        let mut t = harness(true);
        t.deliver(&event_of("contract-signed", "e-0", MAX_PAYLOAD_BYTES - 4))
            .expect("kept, by reference");
        assert_eq!(t.r.results_bytes(), 128_000 + REF_BYTES);
        let used = t.r.results_bytes();
        let over = t.deliver(&event_of("contract-signed", "e-1", 4_000));
        assert!(
            matches!(over, Err(Rejection::OverResultsBudget { used: u, .. }) if u == used),
            "{over:?}"
        );
        let Err(why) = over else { return };
        assert!(why.to_string().starts_with("payload: "), "{why}");
        assert_eq!(t.r.inbox.kept.len(), 1, "nothing more kept");
        t.deliver(&event_of("contract-signed", "e-2", 1_000))
            .expect("a small one fits");
        assert!(t.r.results_bytes() <= MAX_RESULTS_BYTES);

        let mut t = harness(false);
        assert_eq!(t.r.steps[16].status, StepStatus::Waiting);
        let over = t.deliver(&event_of("contract-signed", "e-1", 4_000));
        assert!(
            matches!(
                over,
                Err(Rejection::OverResultsBudget { used: 128_000, .. })
            ),
            "{over:?}"
        );
        assert_eq!(t.r.steps[16].status, StepStatus::Waiting);
        t.deliver(&event_of("contract-signed", "e-2", 1_000))
            .expect("fits");
        assert!(t.r.results_bytes() <= MAX_RESULTS_BYTES);
        assert_eq!(t.r.process_state, ProcessState::Processed);
    }

    #[test]
    fn an_event_ends_the_wait_it_finds_and_none_by_its_time_fails_the_task() {
        let mut t = Harness::of(SIGN, json!({}), base());
        t.claim();
        t.answer(0, &ok());
        assert_eq!(t.r.steps[1].status, StepStatus::Waiting);
        assert_eq!(t.r.complete_by, Some(t.now + Duration::days(7)));
        // Nothing but an event ends it: a wake is for waits on time, and its refusal says to
        // deliver the event.
        let (p, now) = (t.p.clone(), t.now);
        let woken = t.apply(|r, _| wake(r, &ops(None), now, &p));
        assert!(
            matches!(&woken, Err(Rejection::WaitsForEvent(step)) if step == "signature"),
            "{woken:?}"
        );
        let said = woken.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(
            said.contains("deliver it") && said.contains("/events/"),
            "{said}"
        );
        t.now += Duration::hours(2);
        let came = t.deliver(&event("contract-declined", "e-9")).expect("came");
        assert!(came.effects.contains(&Effect::Enqueue {
            delay: Duration::zero()
        }));
        assert_eq!(
            t.r.results()["signature"]["result"]["event"],
            json!("contract-declined"),
            "which came"
        );

        let mut t = Harness::of(SIGN, json!({}), base());
        t.claim();
        t.answer(0, &ok());
        t.now += Duration::days(7);
        t.expire().expect("its time passed");
        assert_eq!(t.r.steps[1].status, StepStatus::TimedOut);
        assert_eq!(t.r.process_state, ProcessState::Compensating);
        assert!(
            t.r.last_error
                .as_deref()
                .is_some_and(|e| e.starts_with("event_timeout: signature")),
            "{:?}",
            t.r.last_error
        );
        assert!(matches!(
            t.deliver(&event("contract-signed", "e-3")),
            Err(Rejection::EventTooLate(ProcessState::Compensating))
        ));
    }

    /// A wait may be the pivot: once the contract is signed the task only goes forward (a
    /// refused payout stops in Error for an operator, nothing undone); unsigned by its time, it
    /// is undone as before.
    #[test]
    fn a_wait_for_an_event_as_the_pivot_makes_the_task_go_only_forward_once_it_came() {
        let pivot = SIGN.replace("    within: 7d\n", "    within: 7d\n    pivot: true\n");
        let mut t = Harness::of(&pivot, json!({}), base());
        assert_eq!(t.w.pivot, Some(1));
        t.claim();
        t.answer(0, &ok());
        t.deliver(&event("contract-signed", "e-1")).expect("came");
        assert!(t.r.past_pivot());
        t.claim();
        t.answer(2, &super::super::testkit::refused());
        assert_eq!(t.r.process_state, ProcessState::Error, "past the pivot");
        assert_eq!(t.r.steps[0].status, StepStatus::Done, "nothing undone");

        let mut t = Harness::of(&pivot, json!({}), base());
        t.claim();
        t.answer(0, &ok());
        t.now += Duration::days(7);
        t.expire().expect("its time passed");
        assert!(!t.r.past_pivot());
        assert_eq!(
            t.r.process_state,
            ProcessState::Compensating,
            "before it: undone"
        );
    }

    #[test]
    fn a_branch_waiting_for_an_event_takes_it_and_an_early_one_waits_in_the_inbox() {
        const BRANCHES: &str = r#"name: both
steps:
  - name: both
    parallel:
      - steps: [{name: hold, service: s}]
      - steps:
          - {name: signed, waitFor: contract-signed, within: 1d}
          - {name: countersigned, waitFor: countersigned, within: 1d}
"#;
        let mut t = Harness::of(BRANCHES, json!({}), base());
        t.claim();
        // The second event comes first: kept; the first ends the branch's wait.
        t.deliver(&event("countersigned", "c-1")).expect("kept");
        assert_eq!(t.r.inbox.kept.len(), 1);
        t.deliver(&event("contract-signed", "s-1")).expect("came");
        assert_eq!(t.r.steps[1].status, StepStatus::Done);
        // The branch's next wait, reached by its claim, takes the kept one at once.
        t.claim();
        assert_eq!(t.r.steps[2].status, StepStatus::Done);
        assert!(t.r.inbox.kept.is_empty());
        let hold = t.r.fanout.as_ref().map_or(0, |f| f.branches[0].attempt);
        let (p, now) = (t.p.clone(), t.now);
        t.apply(|r, router| apply_reply(r, hold, 0, false, &ok(), now, &p, router))
            .expect("the hold");
        assert_eq!(t.r.process_state, ProcessState::Processed);
        assert_eq!(t.r.inbox.seen, ["c-1", "s-1"]);
    }
}
