//! The forEach cases (issue 40), on the run's world (its failpoints, its services' faults, its
//! supervisors), with manual compensation and nobody acting but the case's own operator:
//!
//! - **Retries on new inputs**: `restock` tasks pick their items (a forEach, two at once), then
//!   fail at the shipping (no dock); the operator retries each on a new input whose list has
//!   other items (and another length), it fails again, and the operator compensates. Checked
//!   at the services: every call of an element (its step's, any retry's, its undo's) carries
//!   the item it was made with, and no element's key comes with two bodies.
//! - **Long lists at low concurrency**: `stocktake` tasks count `lots` lots one at a time,
//!   with a pickup timeout far shorter than the list takes. Checked: no element waiting for
//!   room is re-enqueued (the recorder sees every applied write), and each task takes about
//!   its calls' time (the floor: `lots` × the service's latency), not rounds of growing
//!   re-enqueue delays.

use super::checks::effects;
use super::config::Config;
use super::report::Report;
use super::world::World;
use crate::operator::{Operator, OperatorPlan};
use sas::ports::StateStore;
use sas::{ProcessState, StateRecord, TaskId};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The sizes of the forEach cases.
#[derive(Debug, Clone, Copy)]
pub struct ForEachCases {
    /// `restock` tasks, each retried on a new input, then compensated.
    pub restocks: usize,
    /// `stocktake` tasks, each of `lots` lots at one at once, each call `latency` long.
    pub stocktakes: usize,
    pub lots: usize,
    pub latency: Duration,
}

/// What the forEach cases found (`violations`, each a line) and measured.
#[derive(Debug, Default)]
pub struct ForEachReport {
    pub violations: Vec<String>,
    /// Retries on a new input the API applied (of the restocks).
    pub retried: usize,
    /// Each stocktake's time from its submission to its end, and the floor.
    pub took: Vec<Duration>,
    pub floor: Duration,
}

/// Runs the forEach cases on fresh in-memory adapters, from `cfg` (its faults, failpoints and
/// policy; made to compensate by hand, with no other operator).
pub async fn run_for_each_cases(
    cfg: &Config,
    cases: ForEachCases,
) -> anyhow::Result<ForEachReport> {
    let mut cfg = cfg.clone();
    cfg.for_each_cases = true;
    cfg.manual_compensation();
    cfg.operator = None;
    let ports = sas_local::ports(sas_local::Backend::Memory, &cfg.settings).await?;
    let mut world = World::set_up(ports, &cfg).await?;
    let operator = Arc::new(Operator::new(
        world.base.clone(),
        world.system.store.clone(),
        OperatorPlan::default(),
        cfg.seed,
    ));
    let http = reqwest::Client::new();
    let mut out = ForEachReport::default();
    let (patience, seed) = (cfg.patience, cfg.seed);

    let runs = (0..cases.restocks).map(|i| {
        let (http, base, operator) = (http.clone(), world.base.clone(), operator.clone());
        async move { restock(&http, &base, &operator, seed, i, patience).await }
    });
    for outcome in futures::future::join_all(runs).await {
        if let Err(e) = outcome {
            out.violations.push(e);
        }
    }
    out.retried = operator
        .log
        .by_action()
        .get("retry-with-input")
        .copied()
        .unwrap_or(0);
    if cases.restocks > 0 && out.retried == 0 {
        out.violations
            .push("no retry on a new input applied: the case proves nothing".into());
    }

    // The long lists: the service answers in `latency`, with no fault of its own.
    world
        .system
        .services
        .get("inventory")
        .set_faults(sas::remote::Faults {
            latency: cases.latency,
            ..sas::remote::Faults::default()
        });
    out.floor = cases.latency * u32::try_from(cases.lots).unwrap_or(u32::MAX);
    let bound = out.floor * 2 + Duration::from_secs(2);
    let lots: Vec<String> = (0..cases.lots).map(|k| format!("lot-{k}")).collect();
    let runs = (0..cases.stocktakes).map(|i| {
        let (http, base, store) = (http.clone(), world.base.clone(), world.system.store.clone());
        let input = json!({ "lots": lots });
        async move {
            let key = format!("stocktake-{seed}-{i}");
            let id = submit(&http, &base, "stocktake", &key, &input).await?;
            // Far past the bound is a stall: given up on (the planted bug's rounds of
            // growing delays take minutes).
            let r = until(&*store, id, bound * 3, |r| r.process_state.is_terminal()).await?;
            Ok::<_, String>((id, r))
        }
    });
    for outcome in futures::future::join_all(runs).await {
        match outcome {
            Ok((id, r)) => {
                let took = (r.updated_at - r.created_at).to_std().unwrap_or_default();
                out.took.push(took);
                if r.process_state != ProcessState::Processed || took > bound {
                    out.violations.push(format!(
                        "stocktake {id}: {} after {took:?} (its calls take {:?}, at most {bound:?})",
                        r.process_state, out.floor
                    ));
                }
            }
            Err(e) => out.violations.push(e),
        }
    }

    world.stop_supervisors().await;
    let left = world.shut_down().await;
    out.violations.extend(
        left.chaos
            .recorder
            .waiting_requeued
            .lock()
            .map(|w| w.iter().cloned().collect::<Vec<_>>())
            .unwrap_or_default()
            .into_iter()
            .map(|w| format!("re-enqueued while waiting for room: {w}")),
    );
    let mut report = Report::default();
    effects::tally_services(&left.services, &mut report).await;
    for (what, list) in [
        ("applied twice", &report.doubled),
        ("leaked", &report.leaked),
        ("wrong body", &report.wrong_bodies),
    ] {
        out.violations
            .extend(list.iter().map(|l| format!("{what}: {l}")));
    }
    Ok(out)
}

/// Restock task `i`: picked, failed at the shipping, retried on a new input (other items,
/// another count), failed again, compensated. `Err` if it never got anywhere.
async fn restock(
    http: &reqwest::Client,
    base: &str,
    operator: &Operator,
    seed: u64,
    i: usize,
    patience: Duration,
) -> Result<(), String> {
    let items = |round: &str, n: usize| -> Vec<String> {
        (0..n).map(|k| format!("{round}-{i}-{k}")).collect()
    };
    let input = json!({ "items": items("first", 2 + i % 3) });
    let id = submit(
        http,
        base,
        "restock",
        &format!("restock-{seed}-{i}"),
        &input,
    )
    .await?;
    let store = &*operator.store;
    let waits =
        |r: &StateRecord| r.process_state == ProcessState::Error || r.process_state.is_terminal();
    if until(store, id, patience, waits).await?.process_state != ProcessState::Error {
        // (A service's refusal compensated it already.)
        return Ok(());
    }
    if let Ok(mut m) = operator.new_inputs.lock() {
        m.insert(id, json!({ "items": items("second", 1 + (i + 1) % 4) }));
    }
    operator.act(id, "retry-with-input").await;
    let retried = operator
        .log
        .applied()
        .get(&id)
        .is_some_and(|a| a.iter().any(|a| a.action == "retry-with-input"));
    if retried {
        // In Error again (or ended), past the retry's line (an operator's: never pushed out).
        let again = |r: &StateRecord| {
            waits(r)
                && r.history
                    .iter()
                    .rposition(|h| h.reason.contains("retry with a new input"))
                    .is_some_and(|at| at + 1 < r.history.len())
        };
        if until(store, id, patience, again).await?.process_state != ProcessState::Error {
            return Ok(());
        }
    }
    // A compensate that lost a race (409: the task changed meanwhile, a deliverer clearing its
    // outbox) leaves it in Error: asked again, as the answer says to.
    for _ in 0..5 {
        operator.act(id, "compensate").await;
        match store.get_state(id).await {
            Ok(Some(r)) if r.process_state == ProcessState::Error => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            _ => break,
        }
    }
    let r = until(store, id, patience, |r| {
        r.process_state.is_terminal() && !r.notice_pending()
    })
    .await?;
    match r.process_state {
        ProcessState::Compensated | ProcessState::Refused | ProcessState::CompensationFailed => {
            Ok(())
        }
        other => Err(format!("restock {id} ended {other}")),
    }
}

/// Submits a task of `workflow` on `input` under idempotency key `key`, as a client would
/// (retrying 5xx answers and connection errors).
pub(super) async fn submit(
    http: &reqwest::Client,
    base: &str,
    workflow: &str,
    key: &str,
    input: &Value,
) -> Result<TaskId, String> {
    for attempt in 0..20u64 {
        let resp = http
            .post(format!("{base}/workflows/{workflow}/tasks"))
            .header("idempotency-key", key)
            .json(input)
            .send()
            .await;
        match resp {
            Ok(r) if r.status() == reqwest::StatusCode::ACCEPTED => {
                let v: Value = r.json().await.map_err(|e| e.to_string())?;
                return v["taskId"]
                    .as_str()
                    .and_then(|t| t.parse().ok())
                    .ok_or_else(|| format!("no task id in {v}"));
            }
            Ok(r) if r.status().is_client_error() => {
                return Err(format!("{workflow} refused: {}", r.status()));
            }
            _ => tokio::time::sleep(Duration::from_millis(20 * (attempt + 1))).await,
        }
    }
    Err(format!("{workflow}: never accepted"))
}

/// Task `id`'s record once `done` holds of it, read every 50 ms for up to `within`.
pub(super) async fn until(
    store: &dyn StateStore,
    id: TaskId,
    within: Duration,
    done: impl Fn(&StateRecord) -> bool,
) -> Result<StateRecord, String> {
    let end = Instant::now() + within;
    let mut last = None;
    while Instant::now() < end {
        if let Ok(Some(r)) = store.get_state(id).await {
            if done(&r) {
                return Ok(r);
            }
            last = Some(r);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(format!(
        "{id} stalled: {:?} after {within:?}",
        last.map(|r| (r.process_state, r.last_error))
    ))
}
