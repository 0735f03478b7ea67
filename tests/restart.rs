//! `sas-local --data`: a restart keeps the tasks, their history and the published versions,
//! and the tasks it interrupted finish after it, each step applied once. The queues stay in
//! memory: what they held is lost with the process, and the supervisor's sweep of the due
//! index (kept in the data folder) recovers every task it was for.

use sas::domain::{ProcessState, StateRecord, TaskId};
use sas::ports::{Kind, SystemClock};
use sas::remote::{Faults, SimulatedService};
use sas_blackbox::{order_input, serve_loopback, submit_task};
use sas_local::{Backend, Settings, System};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a call to `payment` takes: long enough to stop the runner in the middle of it.
const PAYMENT_LATENCY: Duration = Duration::from_secs(3);

/// The example services over HTTP (they outlive the runner, as real ones would), `payment`
/// slow; the e-commerce workflow on them.
async fn services() -> (
    Vec<(String, String)>,
    HashMap<&'static str, Arc<SimulatedService>>,
) {
    let mut app = axum::Router::new();
    let mut sims = HashMap::new();
    for name in ["inventory", "payment", "shipping"] {
        let faults = Faults {
            latency: if name == "payment" {
                PAYMENT_LATENCY
            } else {
                Duration::ZERO
            },
            ..Faults::default()
        };
        let sim = Arc::new(SimulatedService::new(name, faults, Arc::new(SystemClock)));
        app = app.nest(
            &format!("/{name}"),
            sas_local::simulated::router(sim.clone()),
        );
        sims.insert(name, sim);
    }
    let base = serve_loopback(app).await;
    let services: String = sims
        .keys()
        .map(|name| {
            format!("  - name: {name}\n    target: {{type: http, baseUrl: \"{base}/{name}\"}}\n")
        })
        .collect();
    let mut files = sas::catalog::example_files();
    files.retain(|(name, _)| name == "ecommerce-order.yaml");
    files.push(("services.yaml".into(), format!("services:\n{services}")));
    (files, sims)
}

/// Quick deadlines and sweeps, so that the restart's recovery takes seconds.
fn settings(definitions: &[(String, String)]) -> Settings {
    let mut s = Settings {
        definitions: definitions.to_vec(),
        supervisor_interval: Duration::from_millis(200),
        poll_wait: Duration::from_millis(100),
        ..Settings::default()
    };
    s.policy.step_timeout = chrono::Duration::seconds(6);
    s.policy.pickup_timeout = chrono::Duration::seconds(2);
    s.policy.retry_base_delay = chrono::Duration::milliseconds(200);
    s
}

async fn on_data(dir: &Path, definitions: &[(String, String)]) -> System {
    System::new(
        Backend::Data(dir.to_owned()),
        settings(definitions),
        Arc::new(SystemClock),
    )
    .await
    .expect("a system on the data folder")
}

async fn record(system: &System, id: TaskId) -> StateRecord {
    system
        .store
        .get_state(id)
        .await
        .expect("read")
        .expect("the task is kept")
}

/// Waits until `done` holds for every task (failing after `within`: a task left behind).
async fn wait_for(
    system: &System,
    ids: &[TaskId],
    within: Duration,
    what: &str,
    done: impl Fn(&StateRecord) -> bool,
) -> Vec<StateRecord> {
    let until = Instant::now() + within;
    loop {
        let mut records = Vec::new();
        for id in ids {
            records.push(record(system, *id).await);
        }
        if records.iter().all(&done) {
            return records;
        }
        assert!(
            Instant::now() < until,
            "not every task {what} within {within:?}: {:#?}",
            records
                .iter()
                .map(|r| (r.task_id, r.process_state, r.current_step(), &r.history))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn reasons(r: &StateRecord) -> Vec<&str> {
    r.history.iter().map(|h| h.reason.as_str()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_started_before_a_restart_finish_after_it_each_step_once() {
    let dir = tempfile::tempdir().expect("a data folder");
    let (definitions, sims) = services().await;

    // First life, never started: two tasks accepted and claimed by the task API, their first
    // requests lost with it.
    let first = on_data(dir.path(), &definitions).await;
    let mut waiting = Vec::new();
    for _ in 0..2 {
        waiting.push(submit_task(&first, "ecommerce-order", &order_input()).await);
    }
    first.shutdown().await;

    // Second life: four tasks, stopped while every one is in the middle of its slow payment.
    let mut second = on_data(dir.path(), &definitions).await;
    second.start();
    let mut paying = Vec::new();
    for _ in 0..4 {
        paying.push(submit_task(&second, "ecommerce-order", &order_input()).await);
    }
    wait_for(
        &second,
        &paying,
        Duration::from_secs(20),
        "reached its payment",
        |r| {
            r.process_state == ProcessState::Processing
                && r.current_step() == Some("charge-payment")
                && r.locked_by.is_some()
        },
    )
    .await;
    let mut before = BTreeMap::new();
    for id in waiting.iter().chain(&paying) {
        before.insert(*id, record(&second, *id).await.history);
    }
    second.shutdown().await;

    // Third life: the same folder; everything finishes.
    let third = on_data(dir.path(), &definitions).await;
    let entries = third
        .definitions
        .catalog()
        .entries(Kind::Workflow)
        .await
        .expect("the catalog");
    assert_eq!(
        entries
            .iter()
            .map(|e| (e.name.as_str(), e.latest))
            .collect::<Vec<_>>(),
        [("ecommerce-order", 1)],
        "the same file published again keeps its version"
    );
    let mut third = third;
    third.start();
    let ids: Vec<TaskId> = before.keys().copied().collect();
    let finals = wait_for(&third, &ids, Duration::from_secs(60), "finished", |r| {
        r.process_state.is_final()
    })
    .await;
    for r in &finals {
        assert_eq!(r.process_state, ProcessState::Processed, "{:#?}", r.history);
        let kept = &before[&r.task_id];
        assert!(
            r.history.starts_with(kept),
            "the history before the restart is kept as it was: {:#?} then {:#?}",
            kept,
            r.history
        );
        // Each of the three steps took effect once, under its one key.
        let effects: BTreeMap<String, u32> = sims
            .values()
            .flat_map(|s| s.effects_for(&r.task_id.to_string()))
            .collect();
        assert_eq!(effects.len(), 3, "{effects:?}");
        assert!(effects.values().all(|n| *n == 1), "{effects:?}");
    }
    // How each was recovered: a lost first request at its step's deadline, a step cut off at
    // its deadline (the payment then made again under the same key, once).
    for r in finals.iter().filter(|r| waiting.contains(&r.task_id)) {
        assert!(
            reasons(r)
                .iter()
                .any(|why| why.contains("reserve-inventory: no reply by")),
            "{:#?}",
            reasons(r)
        );
    }
    for r in finals.iter().filter(|r| paying.contains(&r.task_id)) {
        assert!(
            reasons(r)
                .iter()
                .any(|why| why.contains("charge-payment: no reply by")),
            "{:#?}",
            reasons(r)
        );
    }
    third.shutdown().await;
}
