//! A noisy caller's burst against a quiet caller (issue 43): in memory, every store, queue and
//! bus call taking [`crate::MODELED_CALL_MS`], the pollers as deployed (the template's mapping
//! concurrencies and batch sizes), one service taking [`SERVICE_MS`] a call: the agents are the
//! bottleneck. First the quiet caller alone, one task every [`EVERY`] (its idle latency); then
//! the noisy caller submits a burst while the quiet caller goes on, and, a few seconds in, the
//! noisy caller submits one task with `Priority: urgent`. The quiet caller's latency during the
//! burst against its idle figure is what the fair queues keep; the urgent task's start (its
//! claim) is what the urgent lane keeps.

use crate::counting::Meter;
use crate::scenarios;
use sas::auth::Identity;
use sas::ports::{SystemClock, TaskStore};
use sas::remote::Faults;
use sas::{Caller, ProcessState, TaskId};
use sas_local::{Backend, Settings, System};
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One step on a service that takes [`SERVICE_MS`].
const WORKFLOW: &str = "bench-fair";
const SERVICE: &str = "bench-fair-bank";
/// What a call of the service takes.
pub const SERVICE_MS: u64 = 200;
/// The quiet caller submits one task this often.
const EVERY: Duration = Duration::from_secs(1);
/// The quiet caller's tasks alone.
const IDLE_TASKS: usize = 10;
/// When, into the burst, the urgent task is submitted.
const URGENT_AFTER: Duration = Duration::from_secs(5);

fn definitions() -> Vec<(String, String)> {
    vec![
        (
            "bench-fair-services.yaml".into(),
            format!("services:\n  - {{name: {SERVICE}, target: {{type: simulated}}}}\n"),
        ),
        (
            "bench-fair.yaml".into(),
            format!("name: {WORKFLOW}\nsteps:\n  - {{name: post, service: {SERVICE}}}\n"),
        ),
    ]
}

/// What a run measured, in ms.
#[derive(Debug, Clone)]
pub struct Fairness {
    pub burst: usize,
    /// The quiet caller's latencies (submission → Processed): alone, and during the burst.
    pub idle: Vec<f64>,
    pub during: Vec<f64>,
    /// The noisy caller's tasks' latencies.
    pub noisy: Vec<f64>,
    /// The urgent task: submission → claimed (its step on its way), → Processed.
    pub urgent_start: f64,
    pub urgent_end: f64,
    /// From the burst's first submission to its last task Processed.
    pub burst_ms: f64,
}

/// Submits one task as `who` (`urgent`: with `Priority: urgent`); its id.
async fn submit(system: &System, who: &Identity, urgent: bool) -> anyhow::Result<TaskId> {
    let mut headers = http::HeaderMap::new();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    if urgent {
        headers.insert("priority", http::HeaderValue::from_static("urgent"));
    }
    let path = format!("/workflows/{WORKFLOW}/tasks");
    let a = sas::api::handle(
        &system.api,
        who,
        &http::Method::POST,
        &path,
        &headers,
        b"{}",
    )
    .await;
    let v: serde_json::Value = serde_json::from_str(a.body())?;
    anyhow::ensure!(a.status() == 202, "submission answered {}: {v}", a.status());
    Ok(v["taskId"].as_str().unwrap_or_default().parse()?)
}

/// When the task's record first went to `to`, in ms after its creation (`None`: not yet).
fn first_ms(r: &sas::StateRecord, to: ProcessState) -> Option<f64> {
    r.history
        .iter()
        .find(|h| h.to == to)
        .map(|h| (h.at - r.created_at).num_microseconds().unwrap_or(0) as f64 / 1e3)
}

/// Waits (at most `within`) until every task of `ids` is Processed; their latencies in ms.
async fn processed(
    store: &dyn TaskStore,
    ids: &[TaskId],
    within: Duration,
) -> anyhow::Result<Vec<f64>> {
    let until = Instant::now() + within;
    loop {
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            let Some(r) = store.get_state(*id).await? else {
                break;
            };
            let Some(ms) = first_ms(&r, ProcessState::Processed) else {
                break;
            };
            out.push(ms);
        }
        if out.len() == ids.len() {
            return Ok(out);
        }
        anyhow::ensure!(
            Instant::now() < until,
            "{} of {} processed in {within:?}",
            out.len(),
            ids.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The run: the quiet caller alone, then a burst of `burst` tasks from the noisy caller.
pub async fn run(burst: usize) -> anyhow::Result<Fairness> {
    let mut settings = Settings {
        poll_wait: Duration::from_millis(200),
        // As the template's mappings: 20 schedulers a queue (batches of 10), 30 agents
        // (batches of 5); 5 of each on the urgent lane.
        scheduler_concurrency: 20,
        agent_concurrency: 30,
        urgent_concurrency: 5,
        batch_size: 5,
        ..Settings::default()
    };
    // The template's defaults: a step's request may wait 90 s for an agent, then has 60 s.
    settings.policy.step_timeout = chrono::Duration::seconds(60);
    settings.policy.start_within = chrono::Duration::seconds(90);
    settings.policy.pickup_timeout = chrono::Duration::seconds(120);
    settings.definitions.extend(definitions());
    settings.faults.insert(
        SERVICE.to_owned(),
        Faults {
            latency: Duration::from_millis(SERVICE_MS),
            ..Faults::default()
        },
    );
    // Its own concurrency: no share holds the service back below the agents.
    settings.service_share = None;
    settings.catalog_ttl = chrono::Duration::seconds(scenarios::CATALOG_TTL_SECONDS);
    let meter = Arc::new(Meter::with_latency(Duration::from_millis(
        crate::MODELED_CALL_MS,
    )));
    let p = scenarios::wrap(
        sas_local::ports(Backend::Memory, &settings).await?,
        &meter,
        settings.due_shards,
    );
    let files = settings.definitions.clone();
    let mut system = System::from_ports(p, settings, Arc::new(SystemClock));
    system.publish(&files).await?;
    let store: Arc<dyn TaskStore> = system
        .memory
        .as_ref()
        .map(|(store, _, _)| store.clone())
        .ok_or_else(|| anyhow::anyhow!("no memory store"))?;
    system.start();
    let system = Arc::new(system);
    let quiet = Identity::Caller(Caller::new("arn:aws:iam::1:role/checkout")?);
    let noisy = Identity::Caller(Caller::new("arn:aws:iam::1:role/backfill")?);

    // Alone.
    let mut idle_ids = Vec::new();
    for _ in 0..IDLE_TASKS {
        idle_ids.push(submit(&system, &quiet, false).await?);
        tokio::time::sleep(EVERY).await;
    }
    let idle = processed(store.as_ref(), &idle_ids, Duration::from_secs(60)).await?;

    // The burst, 64 submissions in flight, while the quiet caller goes on.
    let started = Instant::now();
    let bursting = {
        let system = system.clone();
        let noisy = noisy.clone();
        tokio::spawn(async move {
            let mut ids = Vec::with_capacity(burst);
            while ids.len() < burst {
                let n = (burst - ids.len()).min(64);
                let answers =
                    futures::future::join_all((0..n).map(|_| submit(&system, &noisy, false))).await;
                for a in answers {
                    ids.push(a?);
                }
            }
            anyhow::Ok(ids)
        })
    };
    let mut during_ids = Vec::new();
    let mut urgent = None;
    let mut noisy_ids = None;
    loop {
        during_ids.push(submit(&system, &quiet, false).await?);
        if urgent.is_none() && started.elapsed() >= URGENT_AFTER {
            urgent = Some(submit(&system, &noisy, true).await?);
        }
        tokio::time::sleep(EVERY).await;
        if noisy_ids.is_none() && bursting.is_finished() {
            noisy_ids = Some(bursting.await??);
            break;
        }
    }
    let noisy_ids = noisy_ids.unwrap_or_default();
    // Until the burst is done, the quiet caller goes on.
    let mut last_done = false;
    while !last_done {
        let last = noisy_ids.last().copied();
        last_done = match last {
            Some(id) => store
                .get_state(id)
                .await?
                .is_some_and(|r| r.process_state == ProcessState::Processed),
            None => true,
        };
        during_ids.push(submit(&system, &quiet, false).await?);
        tokio::time::sleep(EVERY).await;
    }
    let noisy_latencies = processed(store.as_ref(), &noisy_ids, Duration::from_secs(600)).await?;
    let burst_ms = started.elapsed().as_secs_f64() * 1e3;
    let during = processed(store.as_ref(), &during_ids, Duration::from_secs(60)).await?;
    let urgent = urgent.ok_or_else(|| anyhow::anyhow!("the burst ended before the urgent task"))?;
    let urgent_end = processed(store.as_ref(), &[urgent], Duration::from_secs(60)).await?[0];
    let r = store
        .get_state(urgent)
        .await?
        .ok_or_else(|| anyhow::anyhow!("no urgent record"))?;
    let urgent_start =
        first_ms(&r, ProcessState::Processing).ok_or_else(|| anyhow::anyhow!("never claimed"))?;
    if let Ok(system) = Arc::try_unwrap(system) {
        system.shutdown().await;
    }
    Ok(Fairness {
        burst,
        idle,
        during,
        noisy: noisy_latencies,
        urgent_start,
        urgent_end,
        burst_ms,
    })
}

/// The section's table.
pub fn table(f: &Fairness) -> String {
    // (The quantiles of a sorted copy.)
    let q = |v: &[f64], p: f64| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        crate::quantile(&v, p)
    };
    let mut md = String::new();
    let _ = writeln!(
        md,
        "In memory, each store, queue and bus call taking {} ms; one service taking {SERVICE_MS} ms a call; the template's default timeouts; pollers as deployed (20 schedulers a queue, 30 agents in batches of 5, 5 of each on the urgent lane); SQS fair queues' thresholds (a tenant is noisy past 10% of the messages in flight and 30 of them). The quiet caller submits a task a second, alone, then through a burst of {} tasks from the noisy caller ({:.1} s from its first submission to its last task done); {} s in, the noisy caller submits one urgent task.\n",
        crate::MODELED_CALL_MS,
        f.burst,
        f.burst_ms / 1e3,
        URGENT_AFTER.as_secs()
    );
    let _ = writeln!(
        md,
        "| tasks | n | latency p50 | latency p99 | latency max |\n|---|---|---|---|---|"
    );
    for (name, v) in [
        ("quiet caller, alone", &f.idle),
        ("quiet caller, during the burst", &f.during),
        ("noisy caller's burst", &f.noisy),
    ] {
        let _ = writeln!(
            md,
            "| {name} | {} | {:.0} ms | {:.0} ms | {:.0} ms |",
            v.len(),
            q(v, 0.5),
            q(v, 0.99),
            q(v, 1.0)
        );
    }
    let _ = writeln!(
        md,
        "| urgent task during the burst | 1 | claimed after {:.0} ms, processed after {:.0} ms | | |\n",
        f.urgent_start, f.urgent_end
    );
    let _ = writeln!(
        md,
        "The quiet caller's p99 during the burst is {:.2}× its idle p99.\n",
        q(&f.during, 0.99) / q(&f.idle, 0.99).max(1.0)
    );
    md
}
