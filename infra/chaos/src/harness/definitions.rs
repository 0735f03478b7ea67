//! The definitions a run publishes: the examples, each workflow's durations scaled to the
//! run's policy ([`Config::definitions`]).

use super::config::Config;
use sas::Policy;
use sas::domain::workflow::{self, Format};
use serde_json::Value;
use std::time::Duration;

impl Config {
    /// The definitions the run publishes: the examples (`workflows/`), each workflow's own
    /// durations scaled to the run's policy (its default step timeout becomes
    /// `settings.policy.step_timeout`, its retry delays the policy's, every other duration in
    /// proportion, no step timeout below the policy's), so that a loan application's deadlines and retries come in seconds, as an
    /// e-commerce order's do (it has no durations of its own). Steps, undos, the pivot and the
    /// failure thresholds are the examples' own.
    pub fn definitions(&self) -> anyhow::Result<Vec<(String, String)>> {
        let mut out = Vec::new();
        for (name, text) in sas::catalog::example_files() {
            let Some(format) = Format::of_path(&name) else {
                continue;
            };
            if name == "order-triage.yaml" {
                // Published as it is, below.
                continue;
            }
            let mut value = workflow::parse_value(&text, format)?;
            if value.get("steps").is_none() {
                if self.limits.is_empty() && !self.distributed_case {
                    out.push((name, text));
                } else {
                    self.add_limits(&mut value);
                    if self.distributed_case {
                        super::distributed::add_services(&mut value);
                    }
                    let stem = name.rsplit_once('.').map_or(name.as_str(), |(s, _)| s);
                    out.push((format!("{stem}.json"), value.to_string()));
                }
                continue;
            }
            scale_durations(&mut value, &self.settings.policy)?;
            let stem = name.rsplit_once('.').map_or(name.as_str(), |(s, _)| s);
            out.push((format!("{stem}.json"), value.to_string()));
        }
        let triage = workflow::parse_value(ORDER_TRIAGE, Format::Yaml)?;
        out.push(("order-triage.json".into(), triage.to_string()));
        let mut agreement = workflow::parse_value(AGREEMENT, Format::Yaml)?;
        scale_durations(&mut agreement, &self.settings.policy)?;
        out.push(("agreement.json".into(), agreement.to_string()));
        if self.for_each_cases {
            for (name, yaml) in [("restock", RESTOCK), ("stocktake", STOCKTAKE)] {
                let mut doc = workflow::parse_value(yaml, Format::Yaml)?;
                scale_durations(&mut doc, &self.settings.policy)?;
                out.push((format!("{name}.json"), doc.to_string()));
            }
        }
        if self.sub_workflow_case || self.distributed_case {
            // The child first: publishing checks that a parent's child is known.
            let mut files = vec![(
                "settle-payment".to_owned(),
                super::sub_workflows::SETTLE_PAYMENT.to_owned(),
            )];
            if self.sub_workflow_case {
                files.push(("checkout".into(), super::sub_workflows::CHECKOUT.into()));
            }
            if self.distributed_case {
                files.extend(super::distributed::workflows());
            }
            for (name, yaml) in files {
                let mut doc = workflow::parse_value(&yaml, Format::Yaml)?;
                scale_durations(&mut doc, &self.settings.policy)?;
                out.push((format!("{name}.json"), doc.to_string()));
            }
        }
        Ok(out)
    }
}

impl Config {
    /// Writes the run's limits ([`Config::limit`]) into the services of a services file.
    fn add_limits(&self, services: &mut Value) {
        let Some(list) = services.get_mut("services").and_then(Value::as_array_mut) else {
            return;
        };
        for s in list {
            let name = s.get("name").and_then(Value::as_str).unwrap_or_default();
            if let Some(l) = self.limits.iter().find(|l| l.service == name) {
                s["limits"] = serde_json::json!({
                    "concurrency": l.concurrency,
                    "rate": {"perSecond": l.per_second, "burst": l.burst},
                });
            }
        }
    }
}

/// The run's third workflow (YAML): the shipped example that uses every construct
/// (`workflows/order-triage.yaml`): an order whose items are picked by a forEach (2 at once),
/// then whose payment (a choice) and packing (with a condition, then a forEach that labels
/// each item, 3 at once) run at once, in two parallel branches.
pub const ORDER_TRIAGE: &str = sas::domain::workflow::examples::ORDER_TRIAGE;

/// The run's fourth workflow: time and events. Funds are held, then the applicant's answer is
/// awaited (the first of `signed` or `withdrawn`, which the harness delivers as the applicant's
/// e-sign webhook would: early, twice, late, after the end, see `signing.rs`), a signed
/// agreement cools off, then pays out; a withdrawn one releases the hold. The whole of it must
/// be decided within its deadline. Its days are the run's simulated time: [`Config::definitions`]
/// makes a day a quarter of the step timeout, so its 10-day deadline passes in seconds.
pub const AGREEMENT: &str = r#"
name: agreement
description: Hold, wait for the applicant's answer, cool off, pay out; decided within 10 days.
deadline: 10d
input:
  type: object
  additionalProperties: false
  required: [applicantId, amount]
  properties:
    applicantId: {type: string, minLength: 1}
    amount: {type: number, exclusiveMinimum: 0}
steps:
  - name: hold
    service: core-banking
    input: {applicantId: $.input.applicantId, amount: $.input.amount}
    undo:
      action: release-funds
      input: {hold: "$.steps['hold'].result.id"}
  - name: answer
    waitFor: [signed, withdrawn]
    within: 7d
    payload:
      type: object
      required: [by]
      properties:
        by: {type: string, minLength: 1}
  - name: cooling-off
    when: steps.answer.result.event == "signed"
    wait: 5d
  - name: payout
    service: core-banking
    when: steps.answer.result.event == "signed"
    input:
      hold: "$.steps['hold'].result.id"
      by: "$.steps['answer'].result.payload.by"
  - name: release
    service: core-banking
    when: steps.answer.result.event == "withdrawn"
    input: {hold: "$.steps['hold'].result.id"}
"#;

/// The forEach cases' first workflow: each item picked (two at once), each pick undone with
/// its item; then the shipping from the dock, which fails when the input names none (its
/// request cannot be built): the task waits in Error for the operator (the cases run with
/// manual compensation), who retries it on a new input (other items), then compensates.
pub const RESTOCK: &str = r#"
name: restock
input:
  type: object
  required: [items]
  properties:
    items: {type: array, items: {type: string}}
    dock: {type: string}
steps:
  - name: pick
    service: inventory
    action: pick-item
    forEach: $.input.items
    maxConcurrency: 2
    input: {sku: $.element, line: $.index}
    undo:
      action: unpick-item
      input: {sku: $.element, pick: "$.steps['pick'].result.id"}
  - name: ship
    service: shipping
    input: {dock: $.input.dock}
"#;

/// The forEach cases' second workflow: a long list at one element at once.
pub const STOCKTAKE: &str = r#"
name: stocktake
input:
  type: object
  required: [lots]
  properties:
    lots: {type: array, items: {type: string}}
steps:
  - name: count
    service: inventory
    action: count-lot
    forEach: $.input.lots
    maxConcurrency: 1
    input: {lot: $.element}
"#;

/// The run's simulated day: a quarter of its step timeout (the examples' and the agreement's
/// waits, event windows and deadlines are in days).
pub fn simulated_day(p: &Policy) -> Duration {
    p.step_timeout.to_std().unwrap_or_default() / 4
}

fn duration_of(v: &Value) -> anyhow::Result<Option<Duration>> {
    match v.as_str() {
        Some(s) => Ok(Some(humantime::parse_duration(s.trim())?)),
        None => Ok(None),
    }
}

fn ratio(to: chrono::Duration, from: Option<Duration>) -> f64 {
    match from {
        Some(f) if !f.is_zero() => to.num_milliseconds() as f64 / f.as_millis() as f64,
        _ => 1.0,
    }
}

/// Scales every duration of a workflow definition (see [`Config::definitions`]).
fn scale_durations(doc: &mut Value, p: &Policy) -> anyhow::Result<()> {
    let defaults = &doc["defaults"];
    let timeout = ratio(p.step_timeout, duration_of(&defaults["timeout"])?);
    let base = ratio(
        p.retry_base_delay,
        duration_of(&defaults["retry"]["baseDelay"])?,
    );
    let max = ratio(
        p.retry_max_delay,
        duration_of(&defaults["retry"]["maxDelay"])?,
    );
    // No step gets less time than the run's step timeout: under a burst of submissions the
    // queues alone take a good part of a second.
    let shortest = p
        .step_timeout
        .to_std()
        .unwrap_or_default()
        .clamp(workflow::MIN_TIMEOUT, workflow::MAX_TIMEOUT);
    let settings = |place: &mut Value| -> anyhow::Result<()> {
        let Some(obj) = place.as_object_mut() else {
            return Ok(());
        };
        if let Some(t) = obj.get_mut("timeout") {
            scale(t, timeout, shortest, workflow::MAX_TIMEOUT)?;
        }
        // A callback wait of days becomes a few step timeouts: long enough for the simulated
        // service's callback under load, short enough that a lost one times out within the run.
        if let Some(cb) = obj.get_mut("callback").and_then(Value::as_object_mut) {
            let cap = shortest * 5;
            for field in ["timeout", "heartbeat"] {
                if let Some(t) = cb.get_mut(field) {
                    scale(t, timeout, shortest, cap)?;
                }
            }
        }
        if let Some(retry) = obj.get_mut("retry").and_then(Value::as_object_mut) {
            if let Some(b) = retry.get_mut("baseDelay") {
                scale(b, base, Duration::ZERO, workflow::MAX_DELAY)?;
            }
            if let Some(m) = retry.get_mut("maxDelay") {
                scale(m, max, Duration::ZERO, workflow::MAX_DELAY)?;
            }
        }
        Ok(())
    };
    if let Some(d) = doc.get_mut("defaults") {
        settings(d)?;
    }
    // Simulated time: a day of a wait, of an event's window, of the task's deadline is
    // [`simulated_day`] (none below the 1 s a definition allows).
    let day = simulated_day(p).as_millis() as f64 / Duration::from_secs(86_400).as_millis() as f64;
    let floor = workflow::MIN_TIMEOUT;
    if let Some(d) = doc.get_mut("deadline") {
        scale(d, day, floor, workflow::MAX_WAIT)?;
    }
    if let Some(steps) = doc.get_mut("steps").and_then(Value::as_array_mut) {
        for step in steps {
            settings(step)?;
            for field in ["wait", "within"] {
                if let Some(t) = step.get_mut(field) {
                    scale(t, day, floor, workflow::MAX_WAIT)?;
                }
            }
        }
    }
    Ok(())
}

/// Multiplies the duration `v` (a string such as `5s`) by `by`, within `[min, cap]`.
fn scale(v: &mut Value, by: f64, min: Duration, cap: Duration) -> anyhow::Result<()> {
    if let Some(d) = duration_of(v)? {
        let ms = (d.as_millis() as f64 * by).round() as u64;
        let d = Duration::from_millis(ms).clamp(min, cap);
        *v = Value::String(format!("{}ms", d.as_millis()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use sas::Workflow;

    #[test]
    fn the_loan_is_scaled_to_the_runs_policy_and_keeps_its_shape() {
        let cfg = Config::new(10, 7);
        let files = cfg.definitions().expect("definitions");
        let names: Vec<_> = files.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "services.yaml",
                "ecommerce-order.json",
                "loan-application.json",
                "order-triage.json",
                "agreement.json"
            ]
        );
        // Simulated days: a day is a quarter of the 2 s step timeout.
        let agreement: Value = serde_json::from_str(&files[4].1).expect("JSON");
        assert_eq!(agreement["deadline"], "5000ms");
        assert_eq!(agreement["steps"][1]["within"], "3500ms");
        assert_eq!(agreement["steps"][2]["wait"], "2500ms");
        let a = Workflow::from_value(
            agreement,
            Some(&["core-banking"].map(String::from).into()),
            &cfg.settings.policy,
        )
        .expect("a valid workflow over the example services");
        assert_eq!(a.deadline, Some(chrono::Duration::seconds(5)));
        let triage = Workflow::from_value(
            serde_json::from_str(&files[3].1).expect("JSON"),
            Some(
                &["inventory", "payment", "shipping", "credit-bureau"]
                    .map(String::from)
                    .into(),
            ),
            &cfg.settings.policy,
        )
        .expect("a valid workflow over the example services");
        assert_eq!(
            triage.groups.len(),
            2,
            "the parallel group and the choice in it"
        );
        let loan: Value = serde_json::from_str(&files[2].1).expect("JSON");
        assert_eq!(loan["defaults"]["timeout"], "2000ms");
        assert_eq!(loan["defaults"]["retry"]["baseDelay"], "100ms");
        assert_eq!(loan["defaults"]["retry"]["maxDelay"], "1000ms");
        // 5s of a 20s default: a quarter of 2s, raised to the run's step timeout.
        assert_eq!(loan["steps"][0]["timeout"], "2000ms");
        assert_eq!(loan["steps"][1]["timeout"], "3000ms");
        assert_eq!(loan["steps"][5]["retry"]["maxDelay"], "5000ms");
        assert_eq!(loan["steps"][5]["retry"]["failureThreshold"], 5);
        assert_eq!(loan["steps"][4]["pivot"], true);
        // Its 14-day signature window and cooling-off and 30-day deadline, in simulated days.
        assert_eq!(loan["steps"][3]["within"], "7000ms");
        assert_eq!(loan["steps"][4]["wait"], "7000ms");
        assert_eq!(loan["deadline"], "15000ms");
        let w = Workflow::from_value(loan, None, &cfg.settings.policy).expect("valid");
        assert_eq!(w.pivot, Some(4));
        assert_eq!(w.steps[1].policy.step_timeout, chrono::Duration::seconds(3));
        let order: Value = serde_json::from_str(&files[1].1).expect("JSON");
        let original =
            workflow::parse_value(workflow::examples::ECOMMERCE_ORDER, Format::Yaml).expect("YAML");
        assert_eq!(order, original, "an order has no durations to scale");
    }
}
