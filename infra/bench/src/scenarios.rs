//! Three orders driven through the real handlers on the AWS adapters (against the emulator at
//! `AWS_ENDPOINT_URL`), each on its own resources, with every API call counted: a clean order,
//! an order whose first step overruns once (recovered by its deadline timer), and an order
//! refused at step 3 and compensated.

use crate::counting::{CountingBus, CountingQueue, CountingStore, Counts, Meter};
use sas::local::{Backend, Ports, Settings, System, ports};
use sas::ports::{Clock, OffsetClock};
use sas::remote::Faults;
use sas::{OrderId, ProcessState};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// What one order cost, in calls.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub name: &'static str,
    pub counts: Counts,
    /// Lambda invocations by function (one per message: batches of one, the upper bound).
    pub invocations: BTreeMap<&'static str, u64>,
    /// The state transitions of the equivalent Step Functions state machine (see BENCHMARKS.md).
    pub sfn_transitions: u64,
    pub final_state: ProcessState,
    /// Wall time spent handling this order's messages, by function (on the emulator, including
    /// the poll's receive and delete, so an upper bound of what Lambda would bill).
    pub handler_seconds: BTreeMap<&'static str, f64>,
}

/// Accumulates handler wall time by function.
#[derive(Default)]
struct Clocked(BTreeMap<&'static str, f64>);

impl Clocked {
    async fn time<F: std::future::Future<Output = anyhow::Result<usize>>>(
        &mut self,
        function: &'static str,
        f: F,
    ) -> anyhow::Result<usize> {
        let t = std::time::Instant::now();
        let n = f.await?;
        if n > 0 {
            *self.0.entry(function).or_default() += t.elapsed().as_secs_f64();
        }
        Ok(n)
    }
}

fn wrap(p: Ports, meter: &Arc<Meter>, shards: u32) -> Ports {
    let queue = CountingQueue::new(p.queue, meter.clone(), &p.resources);
    Ports {
        store: Arc::new(CountingStore {
            inner: p.store,
            meter: meter.clone(),
            shards,
        }),
        queue: Arc::new(queue),
        events: Arc::new(CountingBus {
            inner: p.events,
            meter: meter.clone(),
        }),
        resources: p.resources,
        memory: p.memory,
    }
}

async fn build(
    config: &aws_config::SdkConfig,
    faults: &[(&str, Faults)],
    step: chrono::Duration,
) -> anyhow::Result<(System, Arc<Meter>, Arc<OffsetClock>)> {
    let mut settings = Settings::default();
    settings.policy.step_timeout = step;
    settings.policy.pickup_timeout = step * 2;
    settings.policy.retry_base_delay = chrono::Duration::zero();
    settings.policy.retry_max_delay = chrono::Duration::zero();
    for (agent, f) in faults {
        settings.faults.insert((*agent).to_owned(), f.clone());
    }
    let prefix = format!("bench-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let backend = Backend::Aws {
        config: Box::new(config.clone()),
        prefix,
    };
    let meter = Arc::new(Meter::default());
    let p = wrap(
        ports(backend, &settings).await?,
        &meter,
        settings.due_shards,
    );
    let clock = Arc::new(OffsetClock::default());
    let system = System::from_ports(p, settings, clock.clone() as Arc<dyn Clock>);
    Ok((system, meter, clock))
}

async fn submit(system: &System, clocked: &mut Clocked) -> anyhow::Result<OrderId> {
    let t = std::time::Instant::now();
    let mut headers = http::HeaderMap::new();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    let body =
        serde_json::json!({"customerId": "bench", "items": [{"sku": "SKU-1", "quantity": 1}]});
    let resp = sas::handlers::submission::handle(
        &system.submission,
        &http::Method::POST,
        "/orders",
        &headers,
        body.to_string().as_bytes(),
    )
    .await;
    *clocked.0.entry("submission").or_default() += t.elapsed().as_secs_f64();
    let v: serde_json::Value = serde_json::from_str(resp.body())?;
    anyhow::ensure!(
        resp.status() == 202,
        "submission answered {}: {v}",
        resp.status()
    );
    Ok(v["orderId"].as_str().unwrap_or_default().parse()?)
}

async fn quiet(system: &System, clocked: &mut Clocked) -> anyhow::Result<()> {
    for _ in 0..30 {
        let s = clocked.time("scheduler", system.pump_scheduler()).await?;
        let a = clocked.time("agent", system.pump_agents()).await?;
        if s + a == 0 {
            return Ok(());
        }
    }
    Ok(())
}

/// Turns the counted messages into invocations, and adds what the timers not delivered during
/// the scenario cost when they are (one supervisor invocation and one GetItem each: a no-op).
fn finish(
    name: &'static str,
    mut counts: Counts,
    timers_handled: u64,
    sfn_transitions: u64,
    final_state: ProcessState,
    clocked: Clocked,
) -> Scenario {
    let m = |k: &str| counts.messages.get(k).copied().unwrap_or(0);
    let timers = m("timers");
    let pending_timers = timers.saturating_sub(timers_handled);
    *counts.calls.entry("DynamoDB GetItem".into()).or_default() += pending_timers;
    counts.rru += pending_timers as f64;
    let invocations = BTreeMap::from([
        ("submission", 1),
        ("scheduler", m("work") + m("replies")),
        ("agent", m("agent")),
        ("supervisor", timers),
    ]);
    let mut handler_seconds = clocked.0;
    // Timers not delivered during the scenario: as long as a delivered one took, or a GetItem's
    // worth (the submission's own time per call) when none was.
    let per_timer = handler_seconds
        .get("supervisor")
        .map(|t| t / timers_handled.max(1) as f64)
        .unwrap_or_else(|| handler_seconds.get("submission").copied().unwrap_or(0.0) / 2.0);
    *handler_seconds.entry("supervisor").or_default() += per_timer * pending_timers as f64;
    Scenario {
        name,
        counts,
        invocations,
        sfn_transitions,
        final_state,
        handler_seconds,
    }
}

pub async fn measure(config: &aws_config::SdkConfig) -> anyhow::Result<Vec<Scenario>> {
    let mut out = Vec::new();

    // 1. Clean.
    let (system, meter, _) = build(config, &[], chrono::Duration::seconds(30)).await?;
    let mut clocked = Clocked::default();
    let id = submit(&system, &mut clocked).await?;
    quiet(&system, &mut clocked).await?;
    let counts = meter.take();
    let r = read(&system, id).await?;
    // Reserve, Charge, Ship, NotifyProcessed, Done: 5 transitions (see BENCHMARKS.md).
    out.push(finish("clean order", counts, 0, 5, r, clocked));

    // 2. One retry: the first step's agent never answers; its deadline timer recovers it.
    let step = chrono::Duration::seconds(2);
    let (system, meter, _) = build(config, &[], step).await?;
    let mut clocked = Clocked::default();
    let id = submit(&system, &mut clocked).await?;
    // Claimed; the request and its timer go out.
    clocked.time("scheduler", system.pump_scheduler()).await?;
    let inventory = system.resources.agent_queue_urls["inventory"].clone();
    let lost = system.queue.receive(&inventory, 10, Duration::ZERO).await?;
    for m in &lost {
        system.queue.delete(&inventory, &m.receipt_handle).await?;
    }
    tokio::time::sleep(Duration::from_millis(3200)).await;
    let mut handled = 0;
    for _ in 0..10 {
        handled += clocked.time("supervisor", system.pump_timers()).await? as u64;
        if handled > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    quiet(&system, &mut clocked).await?;
    let counts = meter.take();
    let r = read(&system, id).await?;
    // One more transition than the clean order: the retried task.
    out.push(finish("one retry (timer)", counts, handled, 6, r, clocked));

    // 3. Refused at step 3, compensated.
    let refuse = Faults {
        refuse_actions: vec!["arrange-shipping".into()],
        ..Faults::default()
    };
    let (system, meter, _) = build(
        config,
        &[("shipping", refuse)],
        chrono::Duration::seconds(30),
    )
    .await?;
    let mut clocked = Clocked::default();
    let id = submit(&system, &mut clocked).await?;
    quiet(&system, &mut clocked).await?;
    let counts = meter.take();
    let r = read(&system, id).await?;
    // Reserve, Charge, Ship (caught), NotifyFailed, Refund, Release, NotifyCompensated, Fail: 8.
    out.push(finish("compensated at step 3", counts, 0, 8, r, clocked));
    Ok(out)
}

async fn read(system: &System, id: OrderId) -> anyhow::Result<ProcessState> {
    system
        .store
        .get_state(id)
        .await?
        .map(|r| r.process_state)
        .ok_or_else(|| anyhow::anyhow!("order {id} has no record"))
}
