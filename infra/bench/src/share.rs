//! Services that share the agents: e-commerce orders submitted at a steady pace while a slow
//! service (every call 25 s) has more tasks waiting than there are agents, in memory, with
//! the deployment's agents (30 pollers, batches of 5). The orders' latency with the slow
//! service idle, busy under the deployment's share (`SERVICE_SHARE`, 10), and busy with no
//! share: the last is what the share prevents.

use sas::config::DEFAULT_SERVICE_SHARE;
use sas::ports::SystemClock;
use sas::remote::Faults;
use sas_local::{Backend, Settings, System};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long each call of the slow service takes.
pub const SLOW_CALL: Duration = Duration::from_secs(25);

const SLOW_SERVICE: &str = "services:\n  - name: archive\n    description: the bench's slow service\n    target: {type: simulated}\n";
const SLOW_WORKFLOW: &str = "name: archive-document\ndescription: one call of the slow service\ndefaults: {timeout: 60s}\nsteps:\n  - {name: store, service: archive}\n";

/// One run: the orders' latencies (ms) and the most calls the slow service had at once.
struct Run {
    latencies: Vec<f64>,
    slow_in_flight: u32,
}

async fn run(slow_tasks: usize, orders: usize, share: Option<u32>) -> anyhow::Result<Run> {
    let mut settings = Settings {
        poll_wait: Duration::from_millis(200),
        agent_concurrency: 30,
        batch_size: 5,
        service_share: share,
        ..Settings::default()
    };
    settings
        .definitions
        .push(("archive-services.yaml".into(), SLOW_SERVICE.into()));
    settings
        .definitions
        .push(("archive-document.yaml".into(), SLOW_WORKFLOW.into()));
    settings.faults.insert(
        "archive".into(),
        Faults {
            latency: SLOW_CALL,
            ..Faults::default()
        },
    );
    let mut system = System::new(Backend::Memory, settings, Arc::new(SystemClock)).await?;
    system.start();
    crate::submit_burst(&system, "archive-document", slow_tasks, slow_tasks.max(1)).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    // One order every 50 ms.
    let mut ids = Vec::with_capacity(orders);
    for _ in 0..orders {
        ids.extend(crate::submit_burst(&system, "ecommerce-order", 1, 1).await?);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let until = Instant::now() + SLOW_CALL * 3;
    let mut latencies = Vec::with_capacity(ids.len());
    for id in &ids {
        loop {
            let r = system.store.get_state(*id).await?;
            if let Some(r) = r.filter(|r| r.process_state == sas::ProcessState::Processed) {
                let end = r.history.last().map_or(r.updated_at, |h| h.at);
                latencies.push((end - r.created_at).num_microseconds().unwrap_or(0) as f64 / 1e3);
                break;
            }
            anyhow::ensure!(Instant::now() < until, "order {id} did not finish");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let slow_in_flight = system.services.get("archive").stats().most_calls_in_flight;
    system.shutdown().await;
    latencies.sort_by(f64::total_cmp);
    Ok(Run {
        latencies,
        slow_in_flight,
    })
}

/// The table: one row per run.
pub async fn table(slow_tasks: usize, orders: usize) -> anyhow::Result<String> {
    let share = Some(DEFAULT_SERVICE_SHARE);
    let runs = [
        ("slow service idle", 0, share),
        (
            "slow service busy, share 10 (the default)",
            slow_tasks,
            share,
        ),
        (
            "slow service busy, no share (`SERVICE_SHARE=0`)",
            slow_tasks,
            None,
        ),
    ];
    let mut t = format!(
        "In memory, the deployment's agents (30 pollers, batches of 5): {orders} e-commerce orders, one every 50 ms, while a slow service (every call {} s) has {slow_tasks} tasks waiting. Order latency is submission to `Processed`.\n\n| run | orders p50 | orders p99 | orders max | slow service's calls at once |\n|---|---|---|---|---|\n",
        SLOW_CALL.as_secs()
    );
    for (label, slow, share) in runs {
        let r = run(slow, orders, share).await?;
        let q = |p| crate::quantile(&r.latencies, p);
        t.push_str(&format!(
            "| {label} | {:.0} ms | {:.0} ms | {:.0} ms | {} |\n",
            q(0.5),
            q(0.99),
            q(1.0),
            r.slow_in_flight
        ));
    }
    Ok(t)
}
