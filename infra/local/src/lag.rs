//! Recovery lag (`sas-local recovery-lag`, `sas-bench`): how long after a step's deadline the
//! step is dispatched again, with deadline timers and with the scheduled sweep alone. In memory,
//! on this machine; the figures go in BENCHMARKS.md only, never in a timed test.

use crate::{Backend, Settings, System};
use sas::ports::SystemClock;
use sas::remote::Faults;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One measurement: `tasks` tasks (e-commerce orders) whose first step always overruns its
/// deadline.
pub async fn measure(
    tasks: usize,
    timers: bool,
    sweep_every: Duration,
) -> anyhow::Result<Vec<f64>> {
    let mut s = Settings::default();
    let step = chrono::Duration::seconds(1);
    s.policy.step_timeout = step;
    s.policy.pickup_timeout = chrono::Duration::seconds(2);
    // No retry delay: what is measured is the lag of the recovery, not a chosen wait.
    s.policy.retry_base_delay = chrono::Duration::zero();
    s.policy.retry_max_delay = chrono::Duration::zero();
    s.deadline_timers = timers;
    // Every call overruns: keep the shared circuit breaker shut, or it would defer the steps
    // (a recovery too, but not the one measured here).
    s.breaker.threshold = 1_000_000;
    s.supervisor_interval = sweep_every;
    s.faults.insert(
        "inventory".into(),
        Faults {
            latency: Duration::from_secs(3600),
            ..Faults::default()
        },
    );
    let mut system = System::new(Backend::Memory, s, Arc::new(SystemClock)).await?;
    system.start();
    let mut ids = Vec::with_capacity(tasks);
    let body = serde_json::json!({"customerId": "lag", "items": [{"sku": "SKU-1", "quantity": 1}]})
        .to_string();
    // Spread the submissions over about two seconds, so deadlines fall at every phase of the
    // sweep's interval rather than all at one.
    let gap = Duration::from_micros(2_000_000 / tasks.max(1) as u64);
    for _ in 0..tasks {
        tokio::time::sleep(gap.mul_f64(rand::random::<f64>() * 2.0)).await;
        ids.push(submit(&system, "ecommerce-order", &body).await?);
    }
    let lags = lags_of(&system, &ids, |r| {
        let claims: Vec<_> = r.history.iter().filter(|h| h.reason == "claimed").collect();
        match claims.as_slice() {
            [first, second, ..] => Some(second.at - (first.at + step)),
            _ => None,
        }
    })
    .await;
    system.shutdown().await;
    finish(lags?, ids.len(), "tasks were re-dispatched")
}

/// Starts a task of `workflow` on `body` through the task API, as its one caller; its id.
async fn submit(system: &System, workflow: &str, body: &str) -> anyhow::Result<sas::TaskId> {
    let mut headers = http::HeaderMap::new();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    let resp = sas::api::handle(
        &system.api,
        &sas::auth::Identity::anonymous(),
        &http::Method::POST,
        &format!("/workflows/{workflow}/tasks"),
        &headers,
        body.as_bytes(),
    )
    .await;
    let v: serde_json::Value = serde_json::from_str(resp.body())?;
    Ok(v["taskId"]
        .as_str()
        .unwrap_or_default()
        .parse::<sas::TaskId>()?)
}

/// Each task's lag as `lag` reads it from its record, polled until every task has one or two
/// minutes passed (then only those that have one), in seconds.
async fn lags_of(
    system: &System,
    ids: &[sas::TaskId],
    lag: impl Fn(&sas::StateRecord) -> Option<chrono::Duration>,
) -> anyhow::Result<Vec<f64>> {
    let until = Instant::now() + Duration::from_secs(120);
    let mut lags = Vec::with_capacity(ids.len());
    while Instant::now() < until {
        lags.clear();
        for id in ids {
            if let Some(l) = system.store.get_state(*id).await?.as_ref().and_then(&lag) {
                lags.push(l.num_milliseconds() as f64 / 1000.0);
            }
        }
        if lags.len() == ids.len() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(lags)
}

/// `lags`, sorted, if every one of the `of` tasks has one (`what` names what they waited for).
fn finish(mut lags: Vec<f64>, of: usize, what: &str) -> anyhow::Result<Vec<f64>> {
    anyhow::ensure!(
        lags.len() == of,
        "only {} of {of} {what} in time",
        lags.len()
    );
    lags.sort_by(f64::total_cmp);
    Ok(lags)
}

/// The value at quantile `q` of sorted `v`.
pub fn quantile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let i = ((v.len() as f64 - 1.0) * q).round() as usize;
    v[i.min(v.len() - 1)]
}

/// Both measurements as a markdown table.
pub async fn table(tasks: usize, sweep_ms: u64) -> anyhow::Result<String> {
    let mut out = String::from(
        "| recovery | sweep every | tasks | lag p50 | lag p99 | lag max |\n|---|---|---|---|---|---|\n",
    );
    for (label, timers, every) in [
        ("deadline timers", true, Duration::from_secs(60)),
        ("sweep only", false, Duration::from_millis(sweep_ms)),
    ] {
        let lags = measure(tasks, timers, every).await?;
        out.push_str(&format!(
            "| {label} | {:.1} s | {tasks} | {:.3} s | {:.3} s | {:.3} s |\n",
            every.as_secs_f64(),
            quantile(&lags, 0.5),
            quantile(&lags, 0.99),
            quantile(&lags, 1.0),
        ));
    }
    Ok(out)
}

/// Timer lag (`sas-local timer-lag`, `sas-bench`): how long after its time a wait ends, for
/// `waits` tasks whose waits are all due at the same instant. `long`: 20-minute waits (past
/// SQS's longest delay, so no timer is armed when they begin), the clock moved to 3 s before
/// their time and one sweep run, whose look-ahead arms their timers; otherwise 3-second waits,
/// each with its timer armed when it begins. The deadline-timer queue is polled as deployed.
pub async fn measure_waits(waits: usize, long: bool) -> anyhow::Result<Vec<f64>> {
    let clock = Arc::new(sas::ports::OffsetClock::default());
    let mut s = Settings {
        definitions: vec![(
            "lag-wait.yaml".into(),
            "name: lag-wait\ninput: {type: object, required: [at]}\nsteps:\n  - {name: hold, waitUntil: $.input.at}\n"
                .into(),
        )],
        // The sweep runs when this measurement says (the first, at start, finds nothing).
        supervisor_interval: Duration::from_secs(3600),
        ..Settings::default()
    };
    s.policy.pickup_timeout = chrono::Duration::minutes(30);
    let mut system = System::new(Backend::Memory, s, clock.clone()).await?;
    system.start();
    use sas::ports::Clock;
    let ahead = if long {
        chrono::Duration::minutes(20)
    } else {
        chrono::Duration::seconds(3)
    };
    let at = clock.now() + ahead;
    let at = at - chrono::Duration::nanoseconds(i64::from(at.timestamp_subsec_nanos()));
    let body = serde_json::json!({"at": at.to_rfc3339()}).to_string();
    let mut ids = Vec::with_capacity(waits);
    for _ in 0..waits {
        ids.push(submit(&system, "lag-wait", &body).await?);
    }
    // Every task waiting before its time comes.
    let by = Instant::now() + Duration::from_secs(60);
    loop {
        let mut waiting = 0;
        for id in &ids {
            if let Some(r) = system.store.get_state(*id).await?
                && r.steps.first().map(|s| s.status) == Some(sas::StepStatus::Waiting)
            {
                waiting += 1;
            }
        }
        if waiting == ids.len() {
            break;
        }
        anyhow::ensure!(Instant::now() < by, "only {waiting} of {waits} waits began");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if long {
        clock.advance(at - clock.now() - chrono::Duration::seconds(3));
        let report = system.sweep().await?;
        anyhow::ensure!(
            report.armed == waits,
            "the look-ahead armed {} timers for {waits} waits",
            report.armed
        );
    }
    let lags = lags_of(&system, &ids, |r| {
        r.steps
            .first()
            .and_then(|s| s.finished_at)
            .map(|done| done - at)
    })
    .await;
    system.shutdown().await;
    finish(lags?, ids.len(), "waits ended")
}

/// Both timer-lag measurements as a markdown table.
pub async fn timer_table(waits: usize) -> anyhow::Result<String> {
    let mut out = String::from(
        "| waits due at once | ended by | lag p50 | lag p99 | lag max |\n|---|---|---|---|---|\n",
    );
    for (label, long) in [
        ("3 s (a timer armed as each began)", false),
        (
            "20 min (the sweep's look-ahead armed the timers 3 s before)",
            true,
        ),
    ] {
        let lags = measure_waits(waits, long).await?;
        out.push_str(&format!(
            "| {waits} × {label} | deadline timers | {:.3} s | {:.3} s | {:.3} s |\n",
            quantile(&lags, 0.5),
            quantile(&lags, 0.99),
            quantile(&lags, 1.0),
        ));
    }
    Ok(out)
}
