//! The state record's transitions, as pure functions:
//! (record, event, now, policy) → new record + the conditional write that must succeed for the
//! transition to count + the effects to perform after it did, or a typed rejection.
//!
//! Every condition pins the record's `Version` (so a write computed from a stale read can never
//! overwrite a newer record) and names the semantic guard that keeps the transition's invariant;
//! the stores evaluate exactly these guards (`ConditionExpression` on DynamoDB,
//! [`Condition::holds`] in memory).

use super::state::{ProcessState, StateRecord, StepStatus, to_millis};
use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};

/// The knobs of the pattern. Defaults are production-sized; tests and the local runner shrink
/// the durations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// How long an agent has for one step (`CompleteBy` = claim or step start + this).
    pub step_timeout: Duration,
    /// How long a Pending record may wait for a scheduler before the supervisor re-enqueues it.
    pub pickup_timeout: Duration,
    /// Expired deadlines after which the task is failed for good.
    pub failure_threshold: u32,
    /// Delay before the first retry; doubles with every failure.
    pub retry_base_delay: Duration,
    /// Upper bound on the retry delay (SQS `DelaySeconds` caps at 15 minutes).
    pub retry_max_delay: Duration,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            step_timeout: Duration::seconds(60),
            pickup_timeout: Duration::seconds(120),
            failure_threshold: 3,
            retry_base_delay: Duration::seconds(5),
            retry_max_delay: Duration::seconds(900),
        }
    }
}

impl Policy {
    /// The delay before the retry that follows the `failures`-th failure: exponential, capped.
    pub fn retry_delay(&self, failures: u32) -> Duration {
        let exp = failures.saturating_sub(1).min(20);
        let ms = self
            .retry_base_delay
            .num_milliseconds()
            .saturating_mul(1i64 << exp);
        Duration::milliseconds(ms.min(self.retry_max_delay.num_milliseconds()))
    }
}

/// One predicate on the stored record that a conditional write requires.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Guard {
    StateIs(ProcessState),
    Unlocked,
    AttemptIs(u64),
    StepIndexIs(usize),
    /// The deadline is still the one the writer saw...
    CompleteByIs(DateTime<Utc>),
    /// ...and it has passed.
    CompleteByAtOrBefore(DateTime<Utc>),
    NoticePending,
}

/// The condition of a write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Condition {
    /// The record must not exist (creation).
    Absent,
    /// The record must be at `version` and satisfy every guard.
    Matches { version: u64, guards: Vec<Guard> },
}

impl Condition {
    fn on(record: &StateRecord, guards: Vec<Guard>) -> Self {
        Self::Matches {
            version: record.version,
            guards,
        }
    }

    /// Whether the condition holds for the stored record (`None`: no record). The in-memory
    /// store uses this; the DynamoDB store translates the same guards to a condition expression.
    pub fn holds(&self, stored: Option<&StateRecord>) -> bool {
        match (self, stored) {
            (Self::Absent, s) => s.is_none(),
            (Self::Matches { .. }, None) => false,
            (Self::Matches { version, guards }, Some(r)) => {
                r.version == *version && guards.iter().all(|g| g.holds(r))
            }
        }
    }
}

impl Guard {
    pub fn holds(&self, r: &StateRecord) -> bool {
        match self {
            Self::StateIs(s) => r.process_state == *s,
            Self::Unlocked => r.locked_by.is_none(),
            Self::AttemptIs(a) => r.attempt == *a,
            Self::StepIndexIs(i) => r.step_index == *i,
            Self::CompleteByIs(t) => r.complete_by == Some(*t),
            Self::CompleteByAtOrBefore(t) => r.complete_by.is_some_and(|c| c <= *t),
            Self::NoticePending => r.notice_pending,
        }
    }
}

/// What must happen once the write succeeded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Send the request for the record's current step under its current attempt.
    SendStepRequest,
    /// Put a work message for the order on the scheduler's queue, visible after `delay`.
    Enqueue { delay: Duration },
    /// Publish the terminal notice (event bus, and the order's reply queue if it has one).
    DeliverNotice,
}

/// An accepted transition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    pub record: StateRecord,
    pub condition: Condition,
    pub effects: Vec<Effect>,
}

/// Why an event does not apply to a record. Rejections are normal (duplicates, stale messages,
/// races): callers log and drop.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    #[error("record is {0}, not Pending")]
    NotPending(ProcessState),
    #[error("record is {0}, not Processing")]
    NotProcessing(ProcessState),
    #[error("reply for attempt {message} but the record is at attempt {record}")]
    StaleAttempt { record: u64, message: u64 },
    #[error("reply for step {message} but the record is at step {record}")]
    WrongStep { record: usize, message: usize },
    #[error("record is not due (due at {due:?})")]
    NotDue { due: Option<DateTime<Utc>> },
    #[error("no notice is owed")]
    NoNoticeOwed,
}

/// What an agent reported for a step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "camelCase")]
pub enum StepOutcome {
    /// The remote service confirmed the step.
    Succeeded,
    /// The remote service refused the step for good (a permanent fault).
    Failed { error: String },
}

fn next(r: &StateRecord, now: DateTime<Utc>) -> StateRecord {
    let mut n = r.clone();
    n.version = r.version + 1;
    n.updated_at = now;
    n
}

/// A work message arrived: a scheduler instance claims the Pending record.
///
/// Condition: Pending and unlocked (at the version read) - keeps "one claim per Pending period":
/// of two schedulers holding the same work message only one wins, and a duplicate work message
/// arriving while Processing is rejected.
pub fn claim(
    r: &StateRecord,
    instance: &str,
    now: DateTime<Utc>,
    p: &Policy,
) -> Result<Transition, Rejection> {
    if r.process_state != ProcessState::Pending {
        return Err(Rejection::NotPending(r.process_state));
    }
    let now = to_millis(now);
    let mut n = next(r, now);
    n.process_state = ProcessState::Processing;
    n.locked_by = Some(instance.to_owned());
    n.attempt = r.attempt + 1;
    n.complete_by = Some(now + p.step_timeout);
    n.steps[r.step_index].status = StepStatus::Running;
    Ok(Transition {
        condition: Condition::on(
            r,
            vec![Guard::StateIs(ProcessState::Pending), Guard::Unlocked],
        ),
        record: n,
        effects: vec![Effect::SendStepRequest],
    })
}

/// An agent's reply arrived for (`attempt`, `step_index`).
///
/// Condition: Processing at the same attempt and step (at the version read) - keeps "a reply
/// counts only for the claim and step it answers": a stale reply from before a recovery, or a
/// duplicate of a reply already applied, changes nothing.
pub fn apply_reply(
    r: &StateRecord,
    attempt: u64,
    step_index: usize,
    outcome: &StepOutcome,
    now: DateTime<Utc>,
    p: &Policy,
) -> Result<Transition, Rejection> {
    if r.process_state != ProcessState::Processing {
        return Err(Rejection::NotProcessing(r.process_state));
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
    let step = &mut n.steps[step_index];
    step.finished_attempt = Some(attempt);
    step.finished_at = Some(now);
    let effects = match outcome {
        StepOutcome::Succeeded => {
            step.status = StepStatus::Done;
            n.step_index = step_index + 1;
            if n.step_index < n.steps.len() {
                n.steps[n.step_index].status = StepStatus::Running;
                n.complete_by = Some(now + p.step_timeout);
                vec![Effect::SendStepRequest]
            } else {
                n.process_state = ProcessState::Processed;
                n.locked_by = None;
                n.complete_by = None;
                n.notice_pending = true;
                vec![Effect::DeliverNotice]
            }
        }
        StepOutcome::Failed { error } => {
            step.status = StepStatus::Failed;
            n.process_state = ProcessState::Error;
            n.locked_by = None;
            n.complete_by = None;
            n.last_error = Some(format!("{}: {error}", r.steps[step_index].name));
            n.notice_pending = true;
            vec![Effect::DeliverNotice]
        }
    };
    Ok(Transition {
        condition: Condition::on(
            r,
            vec![
                Guard::StateIs(ProcessState::Processing),
                Guard::AttemptIs(attempt),
                Guard::StepIndexIs(step_index),
            ],
        ),
        record: n,
        effects,
    })
}

/// The supervisor found the record due.
///
/// - Processing past `CompleteBy`: the step's agent died or overran. `FailureCount` + 1; below
///   the threshold the record goes back to Pending (unlocked, new pickup deadline after the
///   retry delay) and is re-enqueued with that delay; at the threshold it is failed for good.
/// - Pending past its pickup deadline: the work message was lost (e.g. the submission died
///   after its transaction). It is re-enqueued with a new pickup deadline; that is not a
///   failure of the task, so `FailureCount` stays.
///
/// (A terminal record with a notice owed is also due; the supervisor delivers the notice and
/// then applies [`notice_delivered`].)
///
/// Condition: same state, attempt and deadline as read, and the deadline has passed (at the
/// version read) - keeps "each expiry is recovered once": of several supervisors racing on the
/// same record only one write succeeds, and a record a scheduler moved on meanwhile is left
/// alone.
pub fn expire(r: &StateRecord, now: DateTime<Utc>, p: &Policy) -> Result<Transition, Rejection> {
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
    let effects = match r.process_state {
        ProcessState::Pending => {
            n.complete_by = Some(now + p.pickup_timeout);
            vec![Effect::Enqueue {
                delay: Duration::zero(),
            }]
        }
        ProcessState::Processing => {
            n.failure_count = r.failure_count + 1;
            let step = &r.steps[r.step_index].name;
            let reason = format!(
                "{step}: no reply by {} (attempt {})",
                due.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                r.attempt
            );
            n.locked_by = None;
            n.last_error = Some(reason);
            if n.failure_count >= p.failure_threshold {
                n.process_state = ProcessState::Error;
                n.complete_by = None;
                n.steps[r.step_index].status = StepStatus::Failed;
                n.steps[r.step_index].finished_at = Some(now);
                n.steps[r.step_index].finished_attempt = Some(r.attempt);
                n.notice_pending = true;
                vec![Effect::DeliverNotice]
            } else {
                let delay = p.retry_delay(n.failure_count);
                n.process_state = ProcessState::Pending;
                n.complete_by = Some(now + delay + p.pickup_timeout);
                n.steps[r.step_index].status = StepStatus::Pending;
                vec![Effect::Enqueue { delay }]
            }
        }
        ProcessState::Processed | ProcessState::Error => {
            return Err(Rejection::NotDue { due: r.due_at() });
        }
    };
    Ok(Transition {
        record: n,
        condition: Condition::on(r, guards),
        effects,
    })
}

/// The terminal notice was delivered: clear the outbox flag, which also takes the record out of
/// the due index.
///
/// Condition: the notice is still owed (at the version read) - keeps "the flag is cleared only
/// after a delivery of the record's final state".
pub fn notice_delivered(r: &StateRecord, now: DateTime<Utc>) -> Result<Transition, Rejection> {
    if !r.notice_pending {
        return Err(Rejection::NoNoticeOwed);
    }
    let mut n = next(r, to_millis(now));
    n.notice_pending = false;
    Ok(Transition {
        condition: Condition::on(r, vec![Guard::NoticePending]),
        record: n,
        effects: vec![],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{OrderId, Workflow};
    use proptest::prelude::*;

    fn policy() -> Policy {
        Policy {
            step_timeout: Duration::seconds(10),
            pickup_timeout: Duration::seconds(30),
            failure_threshold: 3,
            retry_base_delay: Duration::seconds(1),
            retry_max_delay: Duration::seconds(8),
        }
    }

    fn t0() -> DateTime<Utc> {
        to_millis(Utc::now())
    }

    fn fresh(now: DateTime<Utc>) -> StateRecord {
        let p = policy();
        StateRecord::new(
            OrderId::new_random(),
            &Workflow::ecommerce(),
            None,
            now,
            now + p.pickup_timeout,
        )
    }

    fn apply(
        r: &mut StateRecord,
        f: impl FnOnce(&StateRecord) -> Result<Transition, Rejection>,
    ) -> Transition {
        let t = f(r).expect("transition applies");
        assert!(t.condition.holds(Some(r)), "condition holds on its source");
        *r = t.record.clone();
        t
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
                apply_reply(r, 1, i, &StepOutcome::Succeeded, now, &p)
            });
            r.check(p.failure_threshold).expect("valid");
            if i < 2 {
                assert_eq!(t.effects, [Effect::SendStepRequest]);
            } else {
                assert_eq!(t.effects, [Effect::DeliverNotice]);
            }
        }
        assert_eq!(r.process_state, ProcessState::Processed);
        assert_eq!(r.locked_by, None);
        assert!(r.notice_pending);
        assert_eq!(r.due_at(), Some(r.updated_at));
        apply(&mut r, |r| notice_delivered(r, now));
        assert_eq!(r.due_at(), None);
        assert_eq!(r.version, 6);
    }

    #[test]
    fn a_duplicate_claim_and_a_duplicate_reply_are_rejected() {
        let p = policy();
        let now = t0();
        let mut r = fresh(now);
        apply(&mut r, |r| claim(r, "s-1", now, &p));
        assert_eq!(
            claim(&r, "s-2", now, &p).err(),
            Some(Rejection::NotPending(ProcessState::Processing))
        );
        apply(&mut r, |r| {
            apply_reply(r, 1, 0, &StepOutcome::Succeeded, now, &p)
        });
        assert!(matches!(
            apply_reply(&r, 1, 0, &StepOutcome::Succeeded, now, &p),
            Err(Rejection::WrongStep {
                record: 1,
                message: 0
            })
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
        let p = policy();
        let mut now = t0();
        let mut r = fresh(now);
        let mut delays = vec![];
        for round in 1..=3u32 {
            apply(&mut r, |r| claim(r, "s", now, &p));
            assert!(matches!(expire(&r, now, &p), Err(Rejection::NotDue { .. })));
            now += p.step_timeout;
            let t = apply(&mut r, |r| expire(r, now, &p));
            r.check(p.failure_threshold).expect("valid");
            assert_eq!(r.failure_count, round);
            match t.effects.as_slice() {
                [Effect::Enqueue { delay }] => delays.push(*delay),
                [Effect::DeliverNotice] => assert_eq!(round, 3),
                other => panic!("unexpected effects {other:?}"),
            }
        }
        assert_eq!(delays, [Duration::seconds(1), Duration::seconds(2)]);
        assert_eq!(r.process_state, ProcessState::Error);
        assert!(
            r.last_error
                .as_deref()
                .is_some_and(|e| e.starts_with("reserve-inventory"))
        );
        assert!(r.notice_pending);
    }

    #[test]
    fn a_reply_from_before_a_recovery_is_stale() {
        let p = policy();
        let mut now = t0();
        let mut r = fresh(now);
        apply(&mut r, |r| claim(r, "s", now, &p));
        now += p.step_timeout;
        apply(&mut r, |r| expire(r, now, &p));
        apply(&mut r, |r| claim(r, "s", now, &p));
        assert_eq!(
            apply_reply(&r, 1, 0, &StepOutcome::Succeeded, now, &p).err(),
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
        let t = apply(&mut r, |r| expire(r, now, &p));
        assert_eq!(
            t.effects,
            [Effect::Enqueue {
                delay: Duration::zero()
            }]
        );
        assert_eq!(r.failure_count, 0);
        assert_eq!(r.process_state, ProcessState::Pending);
        assert_eq!(r.complete_by, Some(now + p.pickup_timeout));
    }

    #[test]
    fn a_permanent_failure_is_an_error_with_its_reason() {
        let p = policy();
        let now = t0();
        let mut r = fresh(now);
        apply(&mut r, |r| claim(r, "s", now, &p));
        let failed = StepOutcome::Failed {
            error: "card declined".into(),
        };
        apply(&mut r, |r| apply_reply(r, 1, 0, &failed, now, &p));
        r.check(p.failure_threshold).expect("valid");
        assert_eq!(r.process_state, ProcessState::Error);
        assert_eq!(
            r.last_error.as_deref(),
            Some("reserve-inventory: card declined")
        );
    }

    #[test]
    fn retry_delay_doubles_and_is_capped() {
        let p = policy();
        let d: Vec<_> = (1..=6).map(|n| p.retry_delay(n).num_seconds()).collect();
        assert_eq!(d, [1, 2, 4, 8, 8, 8]);
    }

    #[derive(Debug, Clone)]
    enum Ev {
        Claim(u8),
        Reply {
            attempt_back: u8,
            step_shift: i8,
            ok: bool,
        },
        Advance(u16),
        Expire,
        Delivered,
    }

    fn ev() -> impl Strategy<Value = Ev> {
        prop_oneof![
            3 => (0u8..3).prop_map(Ev::Claim),
            4 => (0u8..2, -1i8..2, proptest::bool::weighted(0.9))
                .prop_map(|(a, s, ok)| Ev::Reply { attempt_back: a, step_shift: s, ok }),
            2 => (0u16..40).prop_map(Ev::Advance),
            2 => Just(Ev::Expire),
            1 => Just(Ev::Delivered),
        ]
    }

    proptest! {
        /// No sequence of events reaches an invalid record, every accepted transition's
        /// condition holds on the record it came from and fails on the record it produced, and
        /// the fencing attempt never goes back.
        #[test]
        fn no_event_sequence_breaks_an_invariant(events in proptest::collection::vec(ev(), 0..60)) {
            let p = policy();
            let mut now = t0();
            let mut r = fresh(now);
            for e in events {
                let out = match e {
                    Ev::Claim(i) => claim(&r, &format!("s-{i}"), now, &p),
                    Ev::Reply { attempt_back, step_shift, ok } => {
                        let outcome = if ok { StepOutcome::Succeeded } else { StepOutcome::Failed { error: "no".into() } };
                        let step = (r.step_index as i64 + step_shift as i64).max(0) as usize;
                        apply_reply(&r, r.attempt.saturating_sub(attempt_back as u64), step, &outcome, now, &p)
                    }
                    Ev::Advance(s) => { now += Duration::seconds(s as i64); continue; }
                    Ev::Expire => expire(&r, now, &p),
                    Ev::Delivered => notice_delivered(&r, now),
                };
                if let Ok(t) = out {
                    prop_assert!(t.condition.holds(Some(&r)));
                    prop_assert!(!t.condition.holds(Some(&t.record)));
                    prop_assert!(t.record.attempt >= r.attempt);
                    if let Err(e) = t.record.check(p.failure_threshold) {
                        return Err(TestCaseError::fail(format!("{e} after {:?} from {:?} to {:?}", t.effects, r, t.record)));
                    }
                    r = t.record;
                }
            }
        }
    }
}
