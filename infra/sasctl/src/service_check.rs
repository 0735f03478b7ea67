//! `sasctl service check`: runs the service contract (`docs/services.md`) against a live
//! service and says, per check, whether it holds, does not hold, or could not be told from
//! outside, with the evidence (each call's key and answer).
//!
//! The checks talk to a [`RemoteService`], so they run the same against an HTTP service
//! ([`sas::remote::HttpRemote`]) and an in-process simulated one. They make real calls with
//! fresh idempotency keys (`sas-check-<run>-<check>`): point them at a test account.
//!
//! A black box shows answers, not effects: a repeated key that answers the same may still have
//! applied twice, and an undo that answers success may not have reversed anything. The checks
//! say "holds" only for what the answers prove, and "could not tell" (with what to look at in
//! the service's own records) for the rest.

use sas::TaskId;
use sas::ports::{RemoteCall, RemoteFault, RemoteService};
use serde::Serialize;
use serde_json::Value;
use std::time::Duration;

/// What a check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Verdict {
    Holds,
    DoesNotHold,
    CouldNotTell,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Holds => "holds",
            Self::DoesNotHold => "does not hold",
            Self::CouldNotTell => "could not tell",
        }
    }
}

/// One check's verdict, why, and the calls it made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckResult {
    /// A stable name (`repeated-key`, ...).
    pub name: &'static str,
    /// What the contract asks.
    pub rule: &'static str,
    pub verdict: Verdict,
    /// Why the verdict.
    pub reason: String,
    /// Each call: what was sent (key) and what came back.
    pub evidence: Vec<String>,
}

/// What to run the checks with.
#[derive(Debug, Clone)]
pub struct Plan {
    /// What the service is called in the calls (`RemoteCall::service`).
    pub service: String,
    /// The step's action and its undo's.
    pub action: String,
    pub undo: String,
    /// The body of the step and of the undo.
    pub input: Value,
    /// How long an ordinary call may take.
    pub timeout: Duration,
    /// How long the caller waits in the "gave up" check: short enough that the call is
    /// abandoned while the service is still working on it.
    pub give_up: Duration,
    /// How long to wait after the undo of an abandoned call before asking again (so that a
    /// late commit has landed).
    pub settle: Duration,
    /// Makes the check's keys unique (e.g. a random id).
    pub run: String,
}

impl Plan {
    pub fn new(action: impl Into<String>, undo: impl Into<String>, input: Value) -> Self {
        Self {
            service: "checked".into(),
            action: action.into(),
            undo: undo.into(),
            input,
            timeout: Duration::from_secs(10),
            give_up: Duration::from_millis(1),
            settle: Duration::from_secs(2),
            run: uuid::Uuid::new_v4().simple().to_string()[..12].to_owned(),
        }
    }

    fn key(&self, check: &str, what: &str) -> String {
        format!("sas-check-{}-{check}-{what}", self.run)
    }

    fn step(&self, key: &str) -> RemoteCall {
        RemoteCall {
            service: self.service.clone(),
            step: "sas-check".into(),
            action: self.action.clone(),
            idempotency_key: key.to_owned(),
            task_id: TaskId::new_random(),
            undoes: None,
            input: self.input.clone(),
            deadline: chrono::Duration::from_std(self.timeout)
                .ok()
                .and_then(|t| chrono::Utc::now().checked_add_signed(t))
                .unwrap_or(chrono::DateTime::<chrono::Utc>::MAX_UTC),
            callback: None,
            limit_keys: Default::default(),
        }
    }

    fn undo_of(&self, key: &str, step_key: &str) -> RemoteCall {
        RemoteCall {
            action: self.undo.clone(),
            undoes: Some(step_key.to_owned()),
            ..self.step(key)
        }
    }
}

/// Every check's result, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub target: String,
    pub action: String,
    pub undo: String,
    pub checks: Vec<CheckResult>,
}

impl Report {
    /// Whether any check does not hold.
    pub fn broken(&self) -> bool {
        self.checks
            .iter()
            .any(|c| c.verdict == Verdict::DoesNotHold)
    }

    pub fn verdict(&self, name: &str) -> Option<Verdict> {
        self.checks
            .iter()
            .find(|c| c.name == name)
            .map(|c| c.verdict)
    }

    /// The report as text: a line per check, its reason, then its evidence indented.
    pub fn render(&self) -> String {
        let mut out = format!(
            "service check of {} (action {}, undo {})\n",
            self.target, self.action, self.undo
        );
        for c in &self.checks {
            out.push_str(&format!(
                "{:<15} {:<22} {}\n",
                c.verdict.as_str(),
                c.name,
                c.rule
            ));
            out.push_str(&format!("    {}\n", c.reason));
            for e in &c.evidence {
                out.push_str(&format!("    - {e}\n"));
            }
        }
        let count = |v| self.checks.iter().filter(|c| c.verdict == v).count();
        out.push_str(&format!(
            "{} hold, {} do not hold, {} could not tell\n",
            count(Verdict::Holds),
            count(Verdict::DoesNotHold),
            count(Verdict::CouldNotTell)
        ));
        out
    }
}

type Answer = Result<Value, RemoteFault>;

/// One call and its answer, as evidence.
fn said(what: &str, call: &RemoteCall, answer: &Answer) -> String {
    let got = match answer {
        Ok(v) => format!("success {}", crate::render::clean(&v.to_string(), 200)),
        Err(e) => crate::render::clean(&e.to_string(), 200),
    };
    format!("{what} [{}]: {got}", call.idempotency_key)
}

/// Why an answer tells nothing (a fault that is not an outcome), if it is one.
fn inconclusive(a: &Answer) -> Option<String> {
    match a {
        Ok(_) | Err(RemoteFault::Refused { .. }) => None,
        Err(e) => Some(format!("no outcome to judge ({e})")),
    }
}

/// Runs every check against `remote`; `target` names it in the report.
pub async fn run_checks(remote: &dyn RemoteService, plan: &Plan, target: &str) -> Report {
    let mut answers: Vec<Answer> = Vec::new();
    let call = async |c: &RemoteCall, timeout: Duration, answers: &mut Vec<Answer>| {
        let a = remote.call(c, timeout).await;
        answers.push(a.clone());
        a
    };
    let mut checks = Vec::new();

    // 1. A repeated key returns the first outcome.
    let k1 = plan.key("repeat", "step");
    let step1 = plan.step(&k1);
    let a = call(&step1, plan.timeout, &mut answers).await;
    let b = call(&step1, plan.timeout, &mut answers).await;
    let (verdict, reason) = match (&a, &b) {
        (Ok(x), Ok(y)) if x == y => (
            Verdict::Holds,
            "the same answer twice (a black box sees answers, not effects: that the second call \
             applied nothing shows only in the service's records)"
                .to_owned(),
        ),
        (Ok(_), Ok(_)) => (
            Verdict::DoesNotHold,
            "two different answers for one key: the second call was handled as new".to_owned(),
        ),
        (
            Err(RemoteFault::Refused { code: c1, .. }),
            Err(RemoteFault::Refused { code: c2, .. }),
        ) if c1 == c2 => (Verdict::Holds, format!("the same refusal twice ({c1})")),
        (Ok(_), Err(RemoteFault::Refused { .. })) | (Err(RemoteFault::Refused { .. }), Ok(_)) => (
            Verdict::DoesNotHold,
            "a success and a refusal for one key".to_owned(),
        ),
        (Err(RemoteFault::Refused { .. }), Err(RemoteFault::Refused { .. })) => (
            Verdict::DoesNotHold,
            "two different refusals for one key".to_owned(),
        ),
        _ => (
            Verdict::CouldNotTell,
            inconclusive(&a)
                .or_else(|| inconclusive(&b))
                .unwrap_or_default(),
        ),
    };
    checks.push(CheckResult {
        name: "repeated-key",
        rule: "a repeated key returns the first outcome and applies nothing",
        verdict,
        reason,
        evidence: vec![said("step", &step1, &a), said("step again", &step1, &b)],
    });

    // 2. An undo after its step succeeds (and cleans up check 1).
    let u1 = plan.undo_of(&plan.key("repeat", "undo"), &k1);
    let u = call(&u1, plan.timeout, &mut answers).await;
    let (verdict, reason) = match (&a, &u) {
        (_, Ok(_)) => (
            Verdict::Holds,
            "the undo answered success (that it reversed the step shows only in the service's \
             records)"
                .to_owned(),
        ),
        (_, Err(RemoteFault::Refused { code, .. })) => (
            Verdict::DoesNotHold,
            format!("the undo was refused ({code}): an undo must always succeed"),
        ),
        (_, other) => (
            Verdict::CouldNotTell,
            inconclusive(other).unwrap_or_default(),
        ),
    };
    checks.push(CheckResult {
        name: "undo-after-step",
        rule: "an undo of a step that took effect succeeds (and reverses it)",
        verdict,
        reason,
        evidence: vec![said("undo", &u1, &u)],
    });

    // 3. An undo of a key the service never saw succeeds...
    let k2 = plan.key("tombstone", "step");
    let u2 = plan.undo_of(&plan.key("tombstone", "undo"), &k2);
    let undo_first = call(&u2, plan.timeout, &mut answers).await;
    let (verdict, reason) = match &undo_first {
        Ok(_) => (
            Verdict::Holds,
            "the undo of an unseen key answered success".to_owned(),
        ),
        Err(RemoteFault::Refused { code, .. }) => (
            Verdict::DoesNotHold,
            format!(
                "refused ({code}): an undo of a key never seen must succeed (and leave a \
                 tombstone)"
            ),
        ),
        other => (
            Verdict::CouldNotTell,
            inconclusive(other).unwrap_or_default(),
        ),
    };
    checks.push(CheckResult {
        name: "undo-unknown-key",
        rule: "an undo of a key never seen succeeds",
        verdict,
        reason,
        evidence: vec![said("undo first", &u2, &undo_first)],
    });

    // 4. ...and leaves a tombstone: the step with that key is refused, not applied.
    let step2 = plan.step(&k2);
    let late_step = call(&step2, plan.timeout, &mut answers).await;
    let (verdict, reason) = match (&undo_first, &late_step) {
        (Ok(_), Err(RemoteFault::Refused { code, .. })) => (
            Verdict::Holds,
            format!("the step after its undo was refused ({code})"),
        ),
        (Ok(_), Ok(_)) => (
            Verdict::DoesNotHold,
            "the step after its undo was applied: a step still in flight when its task is \
             compensated would take effect and never be reversed (no tombstone)"
                .to_owned(),
        ),
        (Ok(_), other) => (
            Verdict::CouldNotTell,
            inconclusive(other).unwrap_or_default(),
        ),
        (_, _) => (
            Verdict::CouldNotTell,
            "the undo did not succeed, so there is no tombstone to test".to_owned(),
        ),
    };
    checks.push(CheckResult {
        name: "undo-first-tombstone",
        rule: "an undo before its step leaves a tombstone: the step's key is then refused",
        verdict,
        reason,
        evidence: vec![said("step after its undo", &step2, &late_step)],
    });

    // 5. A call the client gave up on, then undone: the key ends refused or reversed.
    let k3 = plan.key("abandoned", "step");
    let step3 = plan.step(&k3);
    let abandoned = call(&step3, plan.give_up, &mut answers).await;
    let u3 = plan.undo_of(&plan.key("abandoned", "undo"), &k3);
    let undo3 = call(&u3, plan.timeout, &mut answers).await;
    tokio::time::sleep(plan.settle).await;
    let again = call(&step3, plan.timeout, &mut answers).await;
    let answered = if abandoned.is_ok() {
        "answered in time after all"
    } else {
        "was given up on"
    };
    let (verdict, reason) = match (&undo3, &again) {
        (Err(RemoteFault::Refused { code, .. }), _) => (
            Verdict::DoesNotHold,
            format!("the undo was refused ({code}): an undo must always succeed"),
        ),
        (Ok(_), Err(RemoteFault::Refused { .. })) => (
            Verdict::Holds,
            format!("the step {answered}; after its undo the key is refused: it never took effect"),
        ),
        (Ok(_), Ok(_)) => (
            Verdict::CouldNotTell,
            format!(
                "the step {answered}; after its undo the key answers success: the step took \
                 effect before the undo, and the undo must have reversed it. A black box cannot \
                 see that: look for key {k3} in the service's records (it must be reversed)"
            ),
        ),
        (Ok(_), Err(RemoteFault::InProgress(_))) => (
            Verdict::CouldNotTell,
            format!(
                "the key is still in progress {} ms after its undo: the step may yet commit; \
                 try a longer --settle-ms, and look for key {k3} in the service's records",
                plan.settle.as_millis()
            ),
        ),
        (Ok(_), other) | (other, _) => (
            Verdict::CouldNotTell,
            inconclusive(other).unwrap_or_default(),
        ),
    };
    checks.push(CheckResult {
        name: "abandoned-then-undone",
        rule: "a call the client gave up on, then undone, leaves its key refused or reversed",
        verdict,
        reason,
        evidence: vec![
            said(
                &format!("step, given up after {} ms", plan.give_up.as_millis()),
                &step3,
                &abandoned,
            ),
            said("undo", &u3, &undo3),
            said(
                &format!("step again after {} ms", plan.settle.as_millis()),
                &step3,
                &again,
            ),
        ],
    });

    // 6. Every answer was in a documented class.
    let mut bad = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for a in &answers {
        match a {
            Ok(_) => {
                seen.insert("success");
            }
            Err(RemoteFault::Refused { code, message }) => {
                // A client that does not read the error body names the status instead
                // (`http_422`): judge the status then.
                let status = code
                    .strip_prefix("http_")
                    .and_then(|n| n.parse::<u16>().ok());
                match status {
                    None if !code.is_empty() => {
                        seen.insert("refusal");
                    }
                    Some(400 | 422) => {
                        seen.insert("refusal");
                    }
                    Some(409) => {
                        seen.insert("in progress");
                    }
                    Some(401 | 403 | 404) => {
                        seen.insert("misconfigured");
                        bad.push(format!(
                            "{code} ({}): 401/403/404 mean a wrong URL or credential",
                            crate::render::clean(message, 120)
                        ));
                    }
                    _ => {
                        seen.insert("undocumented");
                        bad.push(format!(
                            "{code:?} ({}): not a documented answer (a refusal is 400 or 422 \
                             with {{\"error\":{{\"code\",\"message\"}}}})",
                            crate::render::clean(message, 120)
                        ));
                    }
                }
            }
            Err(RemoteFault::Misconfigured(m)) => {
                seen.insert("misconfigured");
                bad.push(format!(
                    "misconfigured ({}): 401/403/404 mean a wrong URL or credential",
                    crate::render::clean(m, 120)
                ));
            }
            Err(RemoteFault::Transient(_)) => {
                seen.insert("transient");
            }
            Err(RemoteFault::InProgress(_)) => {
                seen.insert("in progress");
            }
            Err(RemoteFault::CircuitOpen { .. }) => {
                seen.insert("circuit open");
            }
            Err(RemoteFault::Limited { .. }) => {
                seen.insert("over its limits");
            }
            Err(RemoteFault::TooLarge(m)) => {
                seen.insert("too large");
                bad.push(format!(
                    "too large ({}): sas keeps a result of 16 KiB at most",
                    crate::render::clean(m, 120)
                ));
            }
        }
    }
    let classes: Vec<_> = seen.into_iter().collect();
    let (verdict, reason) = if !bad.is_empty() {
        (Verdict::DoesNotHold, bad.join("; "))
    } else if classes.iter().all(|c| *c == "transient") {
        (
            Verdict::CouldNotTell,
            "every call failed transiently: the service never answered an outcome".to_owned(),
        )
    } else {
        (
            Verdict::Holds,
            format!("answers seen: {}", classes.join(", ")),
        )
    };
    checks.push(CheckResult {
        name: "status-classes",
        rule: "every answer is in a documented class (2xx, 400/422 with an error body, 409, \
               transient)",
        verdict,
        reason,
        evidence: Vec::new(),
    });

    Report {
        target: target.to_owned(),
        action: plan.action.clone(),
        undo: plan.undo.clone(),
        checks,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sas::ports::SystemClock;
    use sas::remote::{Faults, SimulatedService};
    use std::sync::Arc;

    fn plan() -> Plan {
        Plan {
            settle: Duration::from_millis(50),
            ..Plan::new("charge", "refund", serde_json::json!({"amount": 1}))
        }
    }

    async fn check(faults: Faults) -> Report {
        let sim = SimulatedService::new("payment", faults, Arc::new(SystemClock));
        run_checks(&sim, &plan(), "simulated").await
    }

    /// Slower than the check's give-up timeout: the abandoned call never reaches its commit.
    fn slow(tombstones: bool) -> Faults {
        Faults {
            latency: Duration::from_millis(20),
            tombstones,
            ..Faults::default()
        }
    }

    #[tokio::test]
    async fn a_service_that_keeps_the_contract_holds_everywhere() {
        let r = check(slow(true)).await;
        for c in &r.checks {
            assert_eq!(c.verdict, Verdict::Holds, "{}", r.render());
        }
        assert!(!r.broken());
        let text = r.render();
        assert!(
            text.contains("holds           undo-first-tombstone"),
            "{text}"
        );
        assert!(
            text.contains("6 hold, 0 do not hold, 0 could not tell"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn a_service_without_tombstones_breaks_the_tombstone_check() {
        let r = check(slow(false)).await;
        assert_eq!(
            r.verdict("undo-first-tombstone"),
            Some(Verdict::DoesNotHold),
            "{}",
            r.render()
        );
        assert_eq!(
            r.verdict("abandoned-then-undone"),
            Some(Verdict::CouldNotTell),
            "{}",
            r.render()
        );
        assert_eq!(r.verdict("undo-unknown-key"), Some(Verdict::Holds));
        assert_eq!(r.verdict("repeated-key"), Some(Verdict::Holds));
        assert!(r.broken());
    }

    #[tokio::test]
    async fn refused_undos_and_misconfiguration_do_not_hold_and_an_outage_tells_nothing() {
        let r = check(Faults {
            refuse_actions: vec!["refund".into()],
            ..Faults::default()
        })
        .await;
        assert_eq!(r.verdict("undo-unknown-key"), Some(Verdict::DoesNotHold));
        assert_eq!(r.verdict("undo-after-step"), Some(Verdict::DoesNotHold));
        assert_eq!(
            r.verdict("abandoned-then-undone"),
            Some(Verdict::DoesNotHold)
        );

        let now = chrono::Utc::now();
        let window = Some((now, now + chrono::Duration::hours(1)));
        let r = check(Faults {
            unauthorized: window,
            ..Faults::default()
        })
        .await;
        assert_eq!(r.verdict("status-classes"), Some(Verdict::DoesNotHold));
        assert_eq!(r.verdict("repeated-key"), Some(Verdict::CouldNotTell));

        let r = check(Faults {
            outage: window,
            ..Faults::default()
        })
        .await;
        assert!(!r.broken(), "{}", r.render());
        assert!(
            r.checks.iter().all(|c| c.verdict == Verdict::CouldNotTell),
            "{}",
            r.render()
        );
    }

    #[tokio::test]
    async fn a_service_that_answers_anew_for_a_repeated_key_does_not_hold() {
        /// Applies every call as new: a fresh id each time.
        struct Forgetful;
        #[async_trait::async_trait]
        impl RemoteService for Forgetful {
            async fn call(&self, _: &RemoteCall, _: Duration) -> Answer {
                Ok(serde_json::json!({"id": uuid::Uuid::new_v4().to_string()}))
            }
        }
        let r = run_checks(&Forgetful, &plan(), "forgetful").await;
        assert_eq!(r.verdict("repeated-key"), Some(Verdict::DoesNotHold));
        assert_eq!(
            r.verdict("undo-first-tombstone"),
            Some(Verdict::DoesNotHold)
        );
        let json = serde_json::to_value(&r).expect("JSON");
        assert_eq!(json["checks"][0]["verdict"], "doesNotHold");
        assert_eq!(json["checks"][0]["name"], "repeated-key");
    }
}
