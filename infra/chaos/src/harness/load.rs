//! Driving the load: tasks of the two example workflows, the shipped `order-triage` and the
//! run's own `agreement`, in turn, submitted over HTTP at the run's pace, within its window of
//! tasks in flight, as a client would (an idempotency key, retries of 5xx answers); the operator
//! may cancel each one a while after, and each agreement's applicant answers it.

use super::config::Config;
use super::operating::Operating;
use super::settle::Progress;
use super::signing::Signing;
use super::world::World;
use futures::StreamExt;
use sas::TaskId;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The workflows a run submits tasks of, in turn: task `i` is of `WORKFLOWS[i % 4]`.
pub const WORKFLOWS: [&str; 4] = [
    "ecommerce-order",
    "loan-application",
    "order-triage",
    "agreement",
];

/// The workflow of task `i`.
pub fn workflow_of(i: usize) -> &'static str {
    WORKFLOWS[i % WORKFLOWS.len()]
}

/// The input of task `i` (valid for [`workflow_of`]`(i)`'s input schema).
pub fn input(i: usize) -> Value {
    if workflow_of(i) == "order-triage" {
        // Every path: by card or invoice (amount), express or not, in a cycle of 4 triage
        // tasks.
        let k = i / WORKFLOWS.len();
        // 1 to 5 items, picked by a forEach (2 at once).
        let items: Vec<Value> = (0..1 + i % 5)
            .map(|n| serde_json::json!(format!("SKU-{}", (i + n) % 17)))
            .collect();
        serde_json::json!({
            "customerId": format!("chaos-{}", i % 97),
            "amount": if k.is_multiple_of(2) { 900 } else { 120 },
            "express": k % 4 < 2,
            "items": items,
        })
    } else if workflow_of(i) == "agreement" {
        serde_json::json!({
            "applicantId": super::signing::signer(i),
            "amount": 500 * (1 + i % 20),
        })
    } else if workflow_of(i) == "loan-application" {
        serde_json::json!({
            "applicantId": format!("chaos-{}", i % 89),
            "amount": 1000 * (1 + i % 50),
            "currency": "EUR",
        })
    } else if (i / WORKFLOWS.len()) % 8 == 7 {
        // One order in 8 is a large one: 100 lines, its input (about 9 KB) over the inline
        // size, so its task keeps it by reference, and its retention purges it.
        let items: Vec<Value> = (0..100)
            .map(|n| serde_json::json!({"sku": format!("SKU-{n:03}-{}", "L".repeat(56)), "quantity": 1 + n % 4}))
            .collect();
        serde_json::json!({"customerId": format!("chaos-{}", i % 101), "items": items})
    } else {
        serde_json::json!({
            "customerId": format!("chaos-{}", i % 101),
            "items": [{"sku": format!("SKU-{}", i % 17), "quantity": 1 + i % 4}],
        })
    }
}

/// Submits the run's tasks (paced from `started`, within the window) and hands each accepted
/// one to the operator; the accepted tasks with their workflows, and with their submission
/// index (which gave their input, [`input`]).
pub(super) async fn submit_all(
    cfg: &Config,
    world: &World,
    operator: &Operating,
    signing: &Signing,
    progress: &Progress,
    started: Instant,
) -> (HashMap<TaskId, &'static str>, HashMap<TaskId, usize>) {
    let http = reqwest::Client::new();
    let base = &world.base;
    let pace = cfg
        .rate
        .map(|r| Duration::from_secs_f64(1.0 / f64::from(r.max(1))));
    let recorder = &world.chaos.recorder;
    let begun = AtomicUsize::new(0);
    let accepted: Vec<Option<(TaskId, usize)>> = futures::stream::iter(0..cfg.tasks)
        .map(|i| {
            let (http, begun) = (&http, &begun);
            async move {
                if let Some(p) = pace {
                    tokio::time::sleep_until((started + p * i as u32).into()).await;
                }
                // Room in the window: fewer than `window` tasks begun and not yet settled (or
                // no task settling for the run's patience: submit anyway, and let the checks
                // tell).
                if let Some(window) = cfg.window {
                    loop {
                        let n = begun.load(Ordering::Relaxed);
                        let settled = recorder.settled();
                        if (n < settled + window || progress.stalled(settled))
                            && begun
                                .compare_exchange(n, n + 1, Ordering::Relaxed, Ordering::Relaxed)
                                .is_ok()
                        {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
                let id = submit(http, base, cfg.seed, i).await?;
                operator.maybe_cancel(id, i);
                signing.accepted(id, i);
                Some((id, i))
            }
        })
        .buffer_unordered(cfg.concurrency.max(1))
        .collect()
        .await;
    let accepted: Vec<(TaskId, usize)> = accepted.into_iter().flatten().collect();
    (
        accepted
            .iter()
            .map(|(id, i)| (*id, workflow_of(*i)))
            .collect(),
        accepted.into_iter().collect(),
    )
}

/// Submits task `i` (of [`workflow_of`]`(i)`) with an idempotency key, retrying 5xx answers and
/// connection errors (a crashed submission answers 503) as a client would.
async fn submit(http: &reqwest::Client, base: &str, seed: u64, i: usize) -> Option<TaskId> {
    let body = input(i);
    let workflow = workflow_of(i);
    for attempt in 0..20u32 {
        let resp = http
            .post(format!("{base}/workflows/{workflow}/tasks"))
            .header("idempotency-key", format!("chaos-{seed}-{i}"))
            .json(&body)
            .send()
            .await;
        match resp {
            Ok(r) if r.status() == reqwest::StatusCode::ACCEPTED => {
                let v: Value = r.json().await.ok()?;
                return v["taskId"].as_str()?.parse().ok();
            }
            Ok(r) if r.status().is_client_error() => return None,
            _ => tokio::time::sleep(Duration::from_millis(20 * u64::from(attempt + 1))).await,
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use sas::Policy;
    use sas::domain::workflow;

    #[test]
    fn inputs_alternate_and_match_their_workflows() {
        let policy = Policy::default();
        let order = workflow::examples::ecommerce_order(&policy);
        let loan = workflow::examples::loan_application(&policy);
        let triage = sas::Workflow::from_value(
            workflow::parse_value(super::super::definitions::ORDER_TRIAGE, sas::Format::Yaml)
                .expect("YAML"),
            None,
            &policy,
        )
        .expect("valid");
        let agreement = sas::Workflow::from_value(
            workflow::parse_value(super::super::definitions::AGREEMENT, sas::Format::Yaml)
                .expect("YAML"),
            None,
            &policy,
        )
        .expect("valid");
        let mut paths = std::collections::BTreeSet::new();
        for i in 0..32 {
            let w = [&order, &loan, &triage, &agreement][i % 4];
            assert_eq!(workflow_of(i), w.name);
            let v = input(i);
            w.check_input(&v).expect("a valid input");
            if i % 4 == 2 {
                paths.insert((v["amount"].to_string(), v["express"].to_string()));
            }
        }
        assert_eq!(paths.len(), 4, "every path of the triage: {paths:?}");
    }
}
