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
        undo_timeout: None,
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

/// The transitions' loan: check-credit (no undo, 5s), reserve-funds (undo, 30s), send-contract
/// (a callback step, the pivot, undo), disburse-funds (no undo, threshold 5). A fixture of its
/// own, so that the shipped example (`workflows/loan-application.yaml`, with its signature and
/// cooling-off) may change without moving these tests' steps.
pub(super) const LOAN: &str = r#"name: loan-application
description: >-
  A loan: score the applicant (read only, never undone), hold the funds, send the contract
  and wait for the signature (a callback step), pay out. Once the contract is signed the loan only goes forward: a failed payout waits for
  an operator instead of undoing the contract.
input:
  type: object
  additionalProperties: false
  required: [applicantId, amount, currency]
  properties:
    applicantId: {type: string, minLength: 1, maxLength: 64}
    amount: {type: number, exclusiveMinimum: 0, maximum: 10000000}
    currency: {type: string, pattern: "^[A-Z]{3}$"}
defaults:
  timeout: 20s
  retry: {failureThreshold: 3, baseDelay: 2s, backoffRate: 2, maxDelay: 1m}
steps:
  - name: check-credit
    service: credit-bureau
    timeout: 5s
    input: {applicantId: $.input.applicantId, amount: $.input.amount}
  - name: reserve-funds
    service: core-banking
    timeout: 30s
    input:
      applicantId: $.input.applicantId
      amount: $.input.amount
      currency: $.input.currency
      creditCheck: "$.steps['check-credit'].result.id"
    undo:
      action: release-funds
      input: {hold: "$.steps['reserve-funds'].result.id", amount: $.input.amount}
  - name: send-contract
    service: e-sign
    pivot: true
    # The applicant signs within a week: the e-sign service accepts the request at once and
    # calls back (POST to the Sas-Callback-Url it received) once they have signed, or declined.
    callback: {timeout: 7d}
    input:
      applicantId: $.input.applicantId
      hold: "$.steps['reserve-funds'].result.id"
      loan: $.task.id
    undo:
      action: void-contract
      input: {contract: "$.steps['send-contract'].result.id"}
  - name: disburse-funds
    service: core-banking
    retry: {failureThreshold: 5, maxDelay: 5m}
    input:
      hold: "$.steps['reserve-funds'].result.id"
      contract: "$.steps['send-contract'].result.id"
"#;

/// [`LOAN`] over the base policy, version 1.
pub(super) fn loan_workflow() -> Workflow {
    let names = ["credit-bureau", "core-banking", "e-sign"]
        .map(String::from)
        .into();
    crate::domain::workflow::parse_value(LOAN, crate::domain::workflow::Format::Yaml)
        .and_then(|v| Workflow::from_value(v, Some(&names), &base()))
        .expect("the transitions' loan is valid")
        .with_version(1)
}

/// A Pending record of [`LOAN`].
pub(super) fn loan(now: DateTime<Utc>) -> StateRecord {
    record(&loan_workflow(), now)
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
