//! The chaos run: orders submitted over HTTP to the real handlers, on ports wrapped with
//! failpoints, with several scheduler and agent pollers and several supervisors at once, and
//! seeded remote-service faults. At the end every order is checked.

use crate::failpoints::{Chaos, ChaosBus, ChaosQueue, ChaosStore, Plan};
use futures::StreamExt;
use sas::handlers::supervisor;
use sas::local::{Ports, Settings, System};
use sas::ports::SystemClock;
use sas::remote::Faults;
use sas::{OrderId, ProcessState, StateRecord};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// A chaos run.
#[derive(Debug, Clone)]
pub struct Config {
    pub orders: usize,
    pub seed: u64,
    /// Supervisors sweeping at once (each with its own instance id).
    pub supervisors: usize,
    /// Submissions in flight at once.
    pub concurrency: usize,
    /// How long the orders have to finish after the last submission.
    pub budget: Duration,
    /// Submissions per second at most (`None`: as fast as `concurrency` allows). A paced run
    /// keeps the pollers near, not far past, what they can serve within the deadlines.
    pub rate: Option<u32>,
    pub plan: Plan,
    /// The system's settings: deadlines, pollers, and each service's faults.
    pub settings: Settings,
}

impl Config {
    /// A run of `orders` orders from `seed`, sized for the in-memory adapters.
    pub fn new(orders: usize, seed: u64) -> Self {
        let mut settings = Settings::default();
        settings.policy.step_timeout = chrono::Duration::milliseconds(2000);
        settings.policy.pickup_timeout = chrono::Duration::milliseconds(4000);
        settings.policy.retry_base_delay = chrono::Duration::milliseconds(100);
        settings.policy.retry_max_delay = chrono::Duration::milliseconds(1000);
        settings.policy.failure_threshold = 4;
        settings.supervisor_interval = Duration::from_millis(200);
        settings.poll_wait = Duration::from_millis(50);
        settings.scheduler_concurrency = 4;
        settings.agent_concurrency = 12;
        // Shorter than the slowest agent run: messages come back while still being handled.
        settings.visibility_timeout = Some(Duration::from_millis(700));
        settings.breaker.cooldown = chrono::Duration::milliseconds(300);
        let now = chrono::Utc::now();
        for (i, agent) in ["inventory", "payment", "shipping"].into_iter().enumerate() {
            let mut f = Faults {
                latency: Duration::from_millis(1),
                transient_rate: 0.1,
                permanent_rate: 0.01,
                lost_response_rate: 0.03,
                slow_rate: 0.02,
                slow_latency: Duration::from_secs(4),
                seed: Some(seed.wrapping_add(i as u64)),
                ..Faults::default()
            };
            if agent == "payment" {
                // A whole-service outage early in the run.
                let from = now + chrono::Duration::milliseconds(500);
                f.outage = Some((from, from + chrono::Duration::milliseconds(1500)));
            }
            settings.faults.insert(agent.into(), f);
        }
        Self {
            orders,
            seed,
            supervisors: 6,
            concurrency: 32,
            budget: Duration::from_secs(120),
            rate: Some(500),
            plan: Plan::new(seed),
            settings,
        }
    }
}

/// What the run found.
#[derive(Debug, Default)]
pub struct Report {
    pub submitted: usize,
    pub accepted: usize,
    /// Final state → orders.
    pub states: BTreeMap<String, usize>,
    /// Accepted orders with no record, or not terminal when the budget ran out.
    pub lost: Vec<String>,
    /// Idempotency keys applied more than once, or steps whose net effect is not 1 for a
    /// Processed order and 0 for a compensated one.
    pub doubled: Vec<String>,
    /// Terminal records still locked.
    pub locked_terminal: Vec<String>,
    /// Records that break an invariant of the state record.
    pub invalid: Vec<String>,
    /// Orders that failed (a refusal, or the threshold) and orders with an `OrderFailed` alert.
    pub failed: usize,
    pub alerted: usize,
    /// Orders in one set and not the other.
    pub alert_mismatch: Vec<String>,
    /// Crash point → (reached, crashed).
    pub points: BTreeMap<String, (u64, u64)>,
    /// Crash points the run must reach but did not.
    pub unreached: Vec<String>,
    /// (sent, duplicated, delayed, deadline timers lost)
    pub messaging: (u64, u64, u64, u64),
    pub dead_letters: usize,
    pub elapsed: Duration,
}

/// The crash points every run of a few hundred orders reaches.
pub const REQUIRED_POINTS: [&str; 9] = [
    "create",
    "put:claimed",
    "put:step done",
    "put:outbox cleared",
    "send:work",
    "send:agent",
    "send:replies",
    "send:timers",
    "publish:OrderProcessed",
];

impl Report {
    /// Every broken guarantee, one line each; empty when the run is clean.
    pub fn violations(&self) -> Vec<String> {
        let mut v = Vec::new();
        let mut check = |bad: bool, what: String| {
            if bad {
                v.push(what);
            }
        };
        check(
            self.accepted != self.submitted,
            format!(
                "{} of {} submissions never accepted",
                self.submitted - self.accepted,
                self.submitted
            ),
        );
        check(
            !self.lost.is_empty(),
            format!("lost: {:?}", first(&self.lost)),
        );
        check(
            !self.doubled.is_empty(),
            format!("doubled effects: {:?}", first(&self.doubled)),
        );
        check(
            !self.locked_terminal.is_empty(),
            format!(
                "locked terminal records: {:?}",
                first(&self.locked_terminal)
            ),
        );
        check(
            !self.invalid.is_empty(),
            format!("invalid records: {:?}", first(&self.invalid)),
        );
        check(
            !self.alert_mismatch.is_empty(),
            format!(
                "alerts do not match failures: {:?}",
                first(&self.alert_mismatch)
            ),
        );
        check(
            !self.unreached.is_empty(),
            format!("crash points never reached: {:?}", self.unreached),
        );
        let not_crashed: Vec<_> = self
            .points
            .iter()
            .filter(|(_, (reached, crashed))| *reached > 0 && *crashed == 0)
            .map(|(p, _)| p.clone())
            .collect();
        check(
            !not_crashed.is_empty(),
            format!("crash points reached but never crashed: {not_crashed:?}"),
        );
        v
    }

    /// The report as markdown tables.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let mut row = |k: &str, v: String, must: &str| {
            out.push_str(&format!("| {k} | {v} | {must} |\n"));
        };
        row("orders submitted", self.submitted.to_string(), "");
        row("orders accepted", self.accepted.to_string(), "= submitted");
        for (state, n) in &self.states {
            row(&format!("final state {state}"), n.to_string(), "");
        }
        row("lost", self.lost.len().to_string(), "0");
        row("doubled effects", self.doubled.len().to_string(), "0");
        row(
            "terminal records still locked",
            self.locked_terminal.len().to_string(),
            "0",
        );
        row(
            "records breaking an invariant",
            self.invalid.len().to_string(),
            "0",
        );
        row(
            "failed orders / OrderFailed alerts",
            format!("{} / {}", self.failed, self.alerted),
            "equal, same orders",
        );
        let (sent, dup, delayed, lost_timers) = self.messaging;
        row(
            "messages sent / duplicated / delayed / timers lost",
            format!("{sent} / {dup} / {delayed} / {lost_timers}"),
            "",
        );
        row("dead letters", self.dead_letters.to_string(), "");
        row(
            "elapsed",
            format!("{:.1} s", self.elapsed.as_secs_f64()),
            "",
        );
        let mut t = format!("| check | value | must be |\n|---|---|---|\n{out}");
        t.push_str("\n| crash point | reached | crashed |\n|---|---|---|\n");
        for (p, (reached, crashed)) in &self.points {
            t.push_str(&format!("| `{p}` | {reached} | {crashed} |\n"));
        }
        t
    }
}

fn first(v: &[String]) -> &[String] {
    &v[..v.len().min(5)]
}

/// Wraps `ports` with the failpoints of `plan`.
pub fn wrap(ports: Ports, chaos: &Arc<Chaos>) -> Ports {
    let queue = ChaosQueue::new(ports.queue, chaos.clone(), &ports.resources);
    Ports {
        store: Arc::new(ChaosStore {
            inner: ports.store,
            chaos: chaos.clone(),
        }),
        queue: Arc::new(queue),
        events: Arc::new(ChaosBus {
            inner: ports.events,
            chaos: chaos.clone(),
        }),
        resources: ports.resources,
        memory: ports.memory,
    }
}

/// Runs `cfg` on `ports` (unwrapped: the harness adds the failpoints).
pub async fn run(ports: Ports, cfg: &Config) -> anyhow::Result<Report> {
    let chaos = Chaos::new(cfg.plan.clone());
    let ports = wrap(ports, &chaos);
    let dlq = ports.resources.dead_letter_url.clone();
    let memory_queues = ports.memory.as_ref().map(|(_, q, _)| q.clone());
    let mut system = System::from_ports(ports, cfg.settings.clone(), Arc::new(SystemClock));
    system.supervisor.lease_ttl = chrono::Duration::seconds(2);
    let addr = system.serve("127.0.0.1:0".parse()?).await?;
    system.start();
    // More supervisors, each its own instance (its own lease owner).
    let stop = Arc::new(AtomicBool::new(false));
    let mut extra = Vec::new();
    for i in 1..cfg.supervisors.max(1) {
        let mut deps = system.supervisor.clone();
        deps.instance_id = format!("chaos-supervisor-{i}");
        let (stop, every) = (stop.clone(), cfg.settings.supervisor_interval);
        extra.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let _ = supervisor::sweep(&deps).await;
                tokio::time::sleep(every).await;
            }
        }));
    }

    let started = Instant::now();
    let http = reqwest::Client::new();
    let base = format!("http://{addr}");
    let pace = cfg
        .rate
        .map(|r| Duration::from_secs_f64(1.0 / f64::from(r.max(1))));
    let accepted: Vec<Option<OrderId>> = futures::stream::iter(0..cfg.orders)
        .map(|i| {
            let (http, base) = (&http, &base);
            async move {
                if let Some(p) = pace {
                    tokio::time::sleep_until((started + p * i as u32).into()).await;
                }
                submit(http, base, cfg.seed, i).await
            }
        })
        .buffer_unordered(cfg.concurrency.max(1))
        .collect()
        .await;
    let ids: Vec<OrderId> = accepted.iter().flatten().copied().collect();

    let until = Instant::now() + cfg.budget;
    let mut finals: HashMap<OrderId, Option<StateRecord>> = HashMap::new();
    loop {
        finals.clear();
        for id in &ids {
            finals.insert(*id, system.store.get_state(*id).await.ok().flatten());
        }
        let done = finals.values().all(|r| {
            r.as_ref()
                .is_some_and(|r| r.process_state.is_terminal() && !r.notice_pending())
        });
        if done || Instant::now() >= until {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let elapsed = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    for t in extra {
        let _ = t.await;
    }
    let services = system.services.clone();
    let threshold = cfg.settings.policy.failure_threshold;
    system.shutdown().await;

    let mut report = Report {
        submitted: cfg.orders,
        accepted: ids.len(),
        elapsed,
        points: chaos.recorder.points(),
        messaging: chaos.recorder.messaging(),
        dead_letters: memory_queues.map_or(0, |q| q.depth(&dlq).visible),
        ..Report::default()
    };
    let mut failed = BTreeSet::new();
    for (id, r) in &finals {
        let Some(r) = r else {
            report.lost.push(format!("{id}: no record"));
            continue;
        };
        *report
            .states
            .entry(r.process_state.to_string())
            .or_default() += 1;
        if !r.process_state.is_terminal() {
            report.lost.push(format!("{id}: still {}", r.process_state));
        }
        if r.process_state.is_terminal() && r.locked_by.is_some() {
            report.locked_terminal.push(id.to_string());
        }
        if let Err(e) = r.check(threshold) {
            report.invalid.push(format!("{id}: {e}"));
        }
        let failure = r
            .history
            .iter()
            .any(|h| h.reason.starts_with("refused") || h.reason.contains("at the threshold"));
        if failure {
            failed.insert(id.to_string());
        }
    }
    // Effects: every key applied at most once; per step, net 1 (Processed) or 0 (compensated).
    let mut net: HashMap<String, i32> = HashMap::new();
    for sim in services.values() {
        let stats = sim.stats();
        for (key, n) in &stats.effects {
            if *n > 1 {
                report.doubled.push(format!("{key} applied {n} times"));
            }
        }
        net.extend(stats.net);
    }
    for (key, n) in &net {
        let Some(id) = key
            .split(':')
            .next()
            .and_then(|s| s.parse::<OrderId>().ok())
        else {
            continue;
        };
        let want = match finals
            .get(&id)
            .and_then(|r| r.as_ref())
            .map(|r| r.process_state)
        {
            Some(ProcessState::Processed) => 1,
            Some(ProcessState::Compensated) => 0,
            _ => continue,
        };
        if *n != want {
            report.doubled.push(format!("{key} nets {n}, not {want}"));
        }
    }
    let alerted = chaos.recorder.alerted();
    report.failed = failed.len();
    report.alerted = alerted.len();
    report.alert_mismatch = failed.symmetric_difference(&alerted).cloned().collect();
    report.unreached = REQUIRED_POINTS
        .iter()
        .filter(|p| !report.points.contains_key(**p))
        .map(|p| p.to_string())
        .collect();
    Ok(report)
}

/// Submits order `i` with an idempotency key, retrying 5xx answers and connection errors (a
/// crashed submission answers 503) as a client would.
async fn submit(http: &reqwest::Client, base: &str, seed: u64, i: usize) -> Option<OrderId> {
    let body = serde_json::json!({
        "customerId": format!("chaos-{}", i % 101),
        "items": [{"sku": format!("SKU-{}", i % 17), "quantity": 1 + i % 4}],
    });
    for attempt in 0..20u32 {
        let resp = http
            .post(format!("{base}/orders"))
            .header("idempotency-key", format!("chaos-{seed}-{i}"))
            .json(&body)
            .send()
            .await;
        match resp {
            Ok(r) if r.status() == reqwest::StatusCode::ACCEPTED => {
                let v: serde_json::Value = r.json().await.ok()?;
                return v["orderId"].as_str()?.parse().ok();
            }
            Ok(r) if r.status().is_client_error() => return None,
            _ => tokio::time::sleep(Duration::from_millis(20 * u64::from(attempt + 1))).await,
        }
    }
    None
}
