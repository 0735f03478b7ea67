//! What the transitions' tests share: small policies, records of the example workflows, and
//! helpers that apply a transition and check the record it leaves.

pub(super) use super::super::state::{StateRecord, to_millis};
pub(super) use super::super::workflow::examples;
pub(super) use super::super::{TaskId, Workflow};
pub(super) use super::*;
pub(super) use chrono::{DateTime, Duration, Utc};

pub(super) fn ops(reason: Option<&str>) -> Actor {
    Actor {
        by: "arn:aws:iam::123456789012:user/operator".into(),
        reason: reason.map(str::to_owned),
        operator: true,
    }
}

pub(super) fn base() -> Policy {
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
        wait: false,
        event: false,
        undo_wait: Duration::seconds(5),
        progress_events: false,
    }
}

pub(super) fn with(f: impl FnOnce(&mut Policy)) -> Policies {
    let mut p = base();
    f(&mut p);
    Policies::uniform(p)
}

pub(super) fn policy() -> Policies {
    with(|_| {})
}

pub(super) fn manual() -> Policies {
    with(|p| p.auto_compensate = false)
}

pub(super) fn t0() -> DateTime<Utc> {
    to_millis(Utc::now())
}

pub(super) fn record(w: &Workflow, now: DateTime<Utc>) -> StateRecord {
    StateRecord::new(
        TaskId::new_random(),
        w,
        None,
        now,
        now + base().pickup_timeout,
    )
}

/// A Pending record of the three-step e-commerce order, each step with an undo.
pub(super) fn fresh(now: DateTime<Utc>) -> StateRecord {
    record(&examples::ecommerce_order(&base()), now)
}

pub(super) fn ok() -> StepOutcome {
    StepOutcome::succeeded()
}

pub(super) fn refused() -> StepOutcome {
    StepOutcome::Failed {
        error: "card declined".into(),
    }
}

pub(super) fn declined() -> StepOutcome {
    StepOutcome::Refused {
        code: "declined".into(),
        message: "card declined".into(),
    }
}

/// A Pending record of the loan: check-credit (no undo), reserve-funds (undo),
/// send-contract (the pivot, undo), disburse-funds (no undo).
pub(super) fn loan(now: DateTime<Utc>) -> StateRecord {
    record(&examples::loan_application(&base()), now)
}

pub(super) fn apply(
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

/// As [`apply`], checking the new record under the workflow's own policies `p`.
pub(super) fn apply_with(
    r: &mut StateRecord,
    p: &Policies,
    f: impl FnOnce(&StateRecord) -> Result<Transition, Rejection>,
) -> Transition {
    let t = f(r).expect("transition applies");
    assert!(t.condition.holds(Some(r)), "condition holds on its source");
    t.record.check(p).expect("valid after the transition");
    *r = t.record.clone();
    t
}

/// Claims the record and answers its attempt at step `i` (its undo if `undo`) with `outcome`.
pub(super) fn claim_and_answer(
    r: &mut StateRecord,
    i: usize,
    undo: bool,
    outcome: &StepOutcome,
    now: DateTime<Utc>,
    p: &Policies,
) -> Transition {
    apply(r, |r| claim(r, "s", now, p, &Linear));
    let a = r.attempt;
    apply(r, |r| apply_reply(r, a, i, undo, outcome, now, p, &Linear))
}

/// Claims and answers steps until the record's current step is `upto`.
pub(super) fn run_to(r: &mut StateRecord, upto: usize, now: DateTime<Utc>, p: &Policies) {
    apply(r, |r| claim(r, "s", now, p, &Linear));
    for i in 0..upto {
        let a = r.attempt;
        apply(r, |r| apply_reply(r, a, i, false, &ok(), now, p, &Linear));
    }
}

/// A task of a workflow written in YAML (over the deployment's policy `base`), driven one
/// transition at a time on the workflow's own policies; every transition's condition holds
/// on the record it was computed from, and the record it leaves keeps every invariant.
pub(super) struct Harness {
    pub w: Workflow,
    pub task: crate::domain::task::Task,
    pub r: StateRecord,
    pub p: Policies,
    pub now: DateTime<Utc>,
}

impl Harness {
    pub fn of(yaml: &str, input: serde_json::Value, base: Policy) -> Self {
        let v =
            crate::domain::workflow::parse_value(yaml, crate::domain::Format::Yaml).expect("yaml");
        let w = Workflow::from_value(v, None, &base)
            .expect("valid")
            .with_version(1);
        let now = t0();
        let r = record(&w, now);
        let task = super::route::test_task(&r, input);
        let p = w.policies();
        Self { w, task, r, p, now }
    }

    /// Applies `f` (given the record and the task's router) to the record.
    pub fn apply(
        &mut self,
        f: impl FnOnce(&StateRecord, &TaskRouter<'_>) -> Result<Transition, Rejection>,
    ) -> Result<Transition, Rejection> {
        let router = TaskRouter {
            workflow: &self.w,
            task: &self.task,
        };
        let t = f(&self.r, &router)?;
        assert!(t.condition.holds(Some(&self.r)));
        t.record.check(&self.p).expect("valid after the transition");
        self.r = t.record.clone();
        Ok(t)
    }

    pub fn try_claim(&mut self) -> Result<Transition, Rejection> {
        let (p, now) = (self.p.clone(), self.now);
        self.apply(|r, router| claim(r, "s", now, &p, router))
    }

    pub fn claim(&mut self) -> Transition {
        self.try_claim().expect("claims")
    }

    /// Answers step `i` out under `attempt` with `outcome`.
    pub fn answer_at(&mut self, i: usize, attempt: u64, outcome: &StepOutcome) -> Transition {
        let (p, now) = (self.p.clone(), self.now);
        self.apply(|r, router| apply_reply(r, attempt, i, false, outcome, now, &p, router))
            .expect("the reply applies")
    }

    /// Answers step `i`, out under the record's attempt, with `outcome`.
    pub fn answer(&mut self, i: usize, outcome: &StepOutcome) -> Transition {
        let attempt = self.r.attempt;
        self.answer_at(i, attempt, outcome)
    }

    pub fn expire(&mut self) -> Result<Transition, Rejection> {
        let (p, now) = (self.p.clone(), self.now);
        self.apply(|r, _| expire(r, now, &p, 0.5))
    }
}
