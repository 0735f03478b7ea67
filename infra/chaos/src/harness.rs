//! The chaos run: tasks of both example workflows (e-commerce orders and loan applications,
//! alternately) submitted over HTTP to the real handlers, on ports wrapped with failpoints, with
//! several scheduler and agent pollers and several supervisors at once, and seeded
//! remote-service faults. At the end every task is checked against its workflow.

use crate::failpoints::{Chaos, ChaosBus, ChaosQueue, ChaosStore, Plan};
use crate::operator::{Operator, alerts_owed};
use futures::StreamExt;
use sas::domain::workflow::{self, Format};
use sas::handlers::supervisor;
use sas::messages::idempotency_key;
use sas::ports::SystemClock;
use sas::remote::Faults;
use sas::{Policy, ProcessState, StateRecord, Status, StepState, StepStatus, TaskId, Workflow};
use sas_local::{Ports, Settings, System};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The workflows a run submits tasks of, in turn: task `i` is of `WORKFLOWS[i % 2]`.
pub const WORKFLOWS: [&str; 2] = ["ecommerce-order", "loan-application"];

/// The workflow of task `i`.
pub fn workflow_of(i: usize) -> &'static str {
    WORKFLOWS[i % WORKFLOWS.len()]
}

/// The input of task `i` (valid for [`workflow_of`]`(i)`'s input schema).
pub fn input(i: usize) -> Value {
    if workflow_of(i) == "loan-application" {
        serde_json::json!({
            "applicantId": format!("chaos-{}", i % 89),
            "amount": 1000 * (1 + i % 50),
            "currency": "EUR",
        })
    } else {
        serde_json::json!({
            "customerId": format!("chaos-{}", i % 101),
            "items": [{"sku": format!("SKU-{}", i % 17), "quantity": 1 + i % 4}],
        })
    }
}

/// A chaos run.
#[derive(Debug, Clone)]
pub struct Config {
    pub tasks: usize,
    pub seed: u64,
    /// Supervisors sweeping at once (each with its own instance id).
    pub supervisors: usize,
    /// Submissions in flight at once.
    pub concurrency: usize,
    /// How long the run waits for a task to settle (end, its notices delivered) before it
    /// gives up: the run goes on as long as tasks keep settling, however slow the machine.
    pub patience: Duration,
    /// At most this many accepted tasks not yet settled at once (`None`: no limit): a
    /// submission waits for room, so a slow machine is loaded as much as a fast one.
    pub window: Option<usize>,
    /// The operator acting on tasks during the run (`None`: nobody touches them).
    pub operator: Option<crate::operator::OperatorPlan>,
    /// Submissions per second at most (`None`: as fast as `concurrency` allows). A paced run
    /// keeps the pollers near, not far past, what they can serve within the deadlines.
    pub rate: Option<u32>,
    pub plan: Plan,
    /// The system's settings: deadlines, pollers, and each service's faults. The definitions
    /// published are [`Config::definitions`], not `settings.definitions`.
    pub settings: Settings,
    /// The services [`Config::down`] took down for the whole run: its tasks wait for it (an open
    /// circuit defers a step and fails nothing), so at the end they are counted as waiting, not
    /// lost.
    pub down: Vec<String>,
}

impl Config {
    /// A run of `tasks` tasks from `seed`, sized for the in-memory adapters.
    pub fn new(tasks: usize, seed: u64) -> Self {
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
        // The catalog is written once, before the first submission: cache it as a deployment
        // does (on the emulator, every uncached read is a request).
        settings.catalog_ttl = chrono::Duration::seconds(5);
        let now = chrono::Utc::now();
        let services = workflow::examples::services();
        for (i, service) in services.iter().enumerate() {
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
            // A whole-service outage early in the run, in each workflow.
            let outage = match service.name.as_str() {
                "payment" => Some(500),
                "core-banking" => Some(1500),
                _ => None,
            };
            if let Some(ms) = outage {
                let from = now + chrono::Duration::milliseconds(ms);
                f.outage = Some((from, from + chrono::Duration::milliseconds(1500)));
            }
            settings.faults.insert(service.name.clone(), f);
        }
        Self {
            tasks,
            seed,
            supervisors: 6,
            concurrency: 32,
            patience: Duration::from_secs(60),
            window: None,
            operator: Some(crate::operator::OperatorPlan::default()),
            rate: Some(500),
            plan: Plan::new(seed),
            settings,
            down: vec![],
        }
    }

    /// Overload: the agents serve [`OVERLOAD_CAPACITY`] calls a second (4 agent pollers taking
    /// one request at a time, every call 25 ms, no faults), and for `seconds` the run submits
    /// three times the tasks a second that serves (orders make 3 calls, loans 4). A backlog of
    /// step requests builds in the agent queue for `seconds` and drains in about twice that:
    /// the last requests wait about `2 × seconds` for an agent. No random crashes (only the first
    /// two at each crash point) and no operator (a cancel compensates): any failure or
    /// compensation is the overload's doing. Each step's
    /// request may wait `start_within` for an agent (`START_WITHIN_SECONDS`).
    pub fn overload(&mut self, seconds: u64, start_within: chrono::Duration) {
        let latency = Duration::from_millis(OVERLOAD_CALL_MS);
        self.settings.agent_concurrency = OVERLOAD_AGENTS;
        self.settings.batch_size = 1;
        for f in self.settings.faults.values_mut() {
            *f = Faults {
                latency,
                seed: f.seed,
                ..Faults::default()
            };
        }
        self.settings.policy.start_within = start_within;
        self.plan.crash_rate = 0.0;
        self.operator = None;
        // Orders and loans alternate: 3.5 calls a task.
        let rate = (3.0 * OVERLOAD_CAPACITY / 3.5).round() as u32;
        self.rate = Some(rate);
        self.tasks = rate as usize * seconds as usize;
        // The backlog drains for about twice the overload: the run waits that long for tasks
        // that are late, not lost.
        self.patience = self.patience.max(Duration::from_secs(3 * seconds + 30));
    }

    /// Turns every rough edge of AWS on ([`Plan::every_switch`]), and the memory store's
    /// indexes lag its writes by up to half a second (DynamoDB's GSIs are eventually
    /// consistent: the sweep and the operator's lists then read stale entries).
    pub fn every_switch(&mut self) {
        let pickup = self
            .settings
            .policy
            .pickup_timeout
            .to_std()
            .unwrap_or_default();
        self.plan.every_switch(pickup);
        self.settings.index_lag = Some(Duration::from_millis(500));
    }

    /// Failures wait in Error for a person instead of compensating on their own (the
    /// deployment's `AUTO_COMPENSATE=false`): the operator's compensate and compensate-from
    /// then apply to tasks that failed before their pivot, not only to those past it.
    pub fn manual_compensation(&mut self) {
        self.settings.policy.auto_compensate = false;
    }

    /// Every service behaves like an ordinary real one (see `docs/services.md`): 2% of calls
    /// commit late (after the caller's timeout: the effect lands 12 s after it gave up), a key
    /// still in flight answers 409, and every service answers 401 for 3 s in the middle of the
    /// submissions (a rotated credential).
    pub fn realistic(&mut self) {
        let submitting_ms = self.tasks as f64 * 1000.0 / f64::from(self.rate.unwrap_or(500).max(1));
        let from = chrono::Utc::now()
            + chrono::Duration::milliseconds((submitting_ms / 2.0).max(1000.0) as i64);
        for f in self.settings.faults.values_mut() {
            f.late_commit_rate = 0.02;
            f.in_progress = true;
            // Calls slower than the deadline only time out, however slow: a late commit lands
            // long after, when the task may be compensating.
            f.slow_latency = Duration::from_secs(12);
            f.unauthorized = Some((from, from + chrono::Duration::seconds(3)));
        }
    }

    /// Every service answers a share `rate` of its step keys oversized
    /// ([`Faults::oversized`]): half refused with a message of megabytes, half applied with a
    /// result of megabytes. What sas keeps of them must stay within SQS's and DynamoDB's
    /// limits (checked), the refusals ending Refused and the results faulting their step.
    pub fn oversized(&mut self, rate: f64) {
        for f in self.settings.faults.values_mut() {
            f.oversized = rate;
        }
    }

    /// Plants the bug of services that keep no tombstone: an undo of a step they have not
    /// committed (yet) records nothing, so a late step commits after its undo and leaks.
    pub fn without_tombstones(&mut self) {
        for f in self.settings.faults.values_mut() {
            f.tombstones = false;
        }
    }

    /// Takes `service` down for the whole run (every call a transient fault).
    pub fn down(&mut self, service: &str) -> anyhow::Result<()> {
        let now = chrono::Utc::now();
        let f = self
            .settings
            .faults
            .get_mut(service)
            .ok_or_else(|| anyhow::anyhow!("no service {service:?} in the examples"))?;
        f.outage = Some((
            now - chrono::Duration::hours(1),
            now + chrono::Duration::days(1),
        ));
        self.down.push(service.to_owned());
        Ok(())
    }

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
            let mut value = workflow::parse_value(&text, format)?;
            if value.get("steps").is_none() {
                out.push((name, text));
                continue;
            }
            scale_durations(&mut value, &self.settings.policy)?;
            let stem = name.rsplit_once('.').map_or(name.as_str(), |(s, _)| s);
            out.push((format!("{stem}.json"), value.to_string()));
        }
        Ok(out)
    }
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
    if let Some(steps) = doc.get_mut("steps").and_then(Value::as_array_mut) {
        for step in steps {
            settings(step)?;
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

/// What one workflow's tasks came to.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct WorkflowCounts {
    pub submitted: usize,
    pub accepted: usize,
    /// Final state → tasks.
    pub states: BTreeMap<String, usize>,
    /// Failures that owe an alert (see `operator::alerts_owed`), and distinct `TaskFailed`
    /// alerts.
    pub failed: usize,
    pub alerted: usize,
    /// Effects the services applied for this workflow's tasks (steps and undos).
    pub effects: usize,
    /// Submission (the record's creation) to the first terminal state, per terminal task, in
    /// milliseconds, sorted.
    pub latencies_ms: Vec<i64>,
}

impl WorkflowCounts {
    /// The `p`-th percentile (nearest rank, `0 < p <= 1`) of the latencies.
    pub fn latency_ms(&self, p: f64) -> Option<i64> {
        let n = self.latencies_ms.len();
        let rank = ((p * n as f64).ceil() as usize).clamp(1, n.max(1));
        self.latencies_ms.get(rank - 1).copied()
    }
}

/// What one simulated service saw and did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ServiceCounts {
    pub calls: u64,
    pub transient: u64,
    pub in_progress: u64,
    pub misconfigured: u64,
    pub late_commits: u64,
    pub late_dropped: u64,
    /// Answers over the result limit or with a huge refusal message.
    pub oversized: u64,
}

/// How the tasks that failed at one step failed, and how they ended.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct StepFailures {
    pub refused: usize,
    pub timed_out: usize,
    pub faulted: usize,
    /// Final state → tasks.
    pub ended: BTreeMap<String, usize>,
}

/// What the run found.
#[derive(Debug, Default)]
pub struct Report {
    pub submitted: usize,
    pub accepted: usize,
    /// Workflow name → its tasks' counts.
    pub workflows: BTreeMap<String, WorkflowCounts>,
    /// Final state → tasks.
    pub states: BTreeMap<String, usize>,
    /// Accepted tasks with no record, or not terminal when the run stopped progressing.
    pub lost: Vec<String>,
    /// Tasks not terminal at the end because their current step (or undo) is on a service
    /// taken down for the whole run (`--down`): they wait for it (deferred by its open circuit,
    /// or timed out and handed back), they are not lost.
    pub waiting: Vec<String>,
    /// Idempotency keys applied more than once.
    pub doubled: Vec<String>,
    /// Steps whose net effect is not what the task's final state says (1 per step of a
    /// Processed task; 0 per undoable step of a Compensated one; for a step without an undo,
    /// and for the steps of a task left in Error past its pivot, what the step's status says),
    /// undos applied for a task that owes no compensation, and effects under a key that no step
    /// of an accepted task has.
    pub wrong_net: Vec<String>,
    /// Step keys that took effect at their service after their undo had succeeded: effects
    /// nothing will reverse (the service kept no tombstone).
    pub leaked: Vec<String>,
    /// Service → what it saw.
    pub services: BTreeMap<String, ServiceCounts>,
    /// Terminal records still locked.
    pub locked_terminal: Vec<String>,
    /// Records that break an invariant of the state record under their workflow's policies, or
    /// end in a state their workflow does not allow (Error before the pivot: automatic
    /// compensation is on).
    pub invalid: Vec<String>,
    /// Tasks that failed, and tasks with a `TaskFailed` alert.
    pub failed: usize,
    pub alerted: usize,
    /// Tasks whose distinct `TaskFailed` alerts (notice ids) are not one per failure.
    pub alert_mismatch: Vec<String>,
    /// `TaskFailed` deliveries (at least once: a notice may go out twice under one id).
    pub alert_deliveries: usize,
    /// Re-enqueues after a missed pickup deadline, the tasks that had any, and the most one
    /// task had.
    pub requeues: usize,
    pub requeued_tasks: usize,
    pub max_requeues: usize,
    /// The most re-enqueues in a row a task may have: enough to outlast the slow work queue's
    /// hold-back at growing delays (see [`requeue_limit`]).
    pub requeue_limit: usize,
    /// Tasks re-enqueued more often in a row than that, and the run if it re-enqueued more
    /// per task on average than growing delays need to outlast the stall (2 at least).
    pub over_requeued: Vec<String>,
    /// Applied writes reported to their writer as a lost race (after a lost response).
    pub misreported: Vec<String>,
    /// Messages over SQS's 256 KB and records over DynamoDB's 400 KB (refused, as AWS does).
    pub too_large: Vec<String>,
    /// (lost responses, throttles, slowed work messages, timed-out batches) injected.
    pub edges: (u64, u64, u64, u64),
    pub bus_refused: u64,
    pub overtaken: u64,
    /// (workflow, step index, step) → how the failed tasks failed there, and how they ended.
    pub failed_steps: BTreeMap<(String, usize, String), StepFailures>,
    /// Tasks that ended Processed, Compensated or CompensationFailed without that event on the
    /// bus, or with it while ending otherwise.
    pub notice_mismatch: Vec<String>,
    /// Callback steps that waited out a callback their service had already posted (the
    /// service calls back once, at the first URL it got).
    pub ignored_callbacks: Vec<String>,
    /// Crash point → (reached, crashed).
    pub points: BTreeMap<String, (u64, u64)>,
    /// Crash points the run must reach but did not.
    pub unreached: Vec<String>,
    /// (sent, duplicated, delayed, deadline timers lost)
    pub messaging: (u64, u64, u64, u64),
    pub dead_letters: usize,
    /// The operator's actions: asked for, applied, refused (409), answered 5xx; and the
    /// applied ones by action.
    pub operator: (u64, usize, u64, u64),
    pub operator_actions: BTreeMap<String, usize>,
    pub elapsed: Duration,
    /// The longest a task took from its submission to its last write.
    pub slowest: Duration,
}

/// Agent pollers in an overload run, each taking one request at a time...
pub const OVERLOAD_AGENTS: usize = 4;
/// ...and the time each call takes there...
pub const OVERLOAD_CALL_MS: u64 = 25;
/// ...so the calls a second the agents serve.
pub const OVERLOAD_CAPACITY: f64 = OVERLOAD_AGENTS as f64 * 1000.0 / OVERLOAD_CALL_MS as f64;

/// The crash points every run of a few hundred tasks reaches.
pub const REQUIRED_POINTS: [&str; 9] = [
    "create",
    "put:claimed",
    "put:step done",
    "put:outbox cleared",
    "send:work",
    "send:agent",
    "send:replies",
    "send:timers",
    "publish:TaskProcessed",
];

/// The terminal states, in the order the tables show them.
const TERMINAL: [ProcessState; 6] = [
    ProcessState::Processed,
    ProcessState::Refused,
    ProcessState::Compensated,
    ProcessState::CompensationFailed,
    ProcessState::Error,
    ProcessState::Resolved,
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
            format!("keys applied more than once: {:?}", first(&self.doubled)),
        );
        check(
            !self.wrong_net.is_empty(),
            format!("wrong net effects: {:?}", first(&self.wrong_net)),
        );
        check(
            !self.leaked.is_empty(),
            format!(
                "steps committed after their undo (leaked): {:?}",
                first(&self.leaked)
            ),
        );
        check(
            !self.ignored_callbacks.is_empty(),
            format!(
                "callbacks posted and then waited for: {:?}",
                first(&self.ignored_callbacks)
            ),
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
            !self.over_requeued.is_empty(),
            format!(
                "tasks re-enqueued too often: {:?}",
                first(&self.over_requeued)
            ),
        );
        check(
            !self.misreported.is_empty(),
            format!(
                "applied writes reported as lost races: {:?}",
                first(&self.misreported)
            ),
        );
        check(
            !self.too_large.is_empty(),
            format!(
                "messages or records over AWS's limits: {:?}",
                first(&self.too_large)
            ),
        );
        check(
            !self.notice_mismatch.is_empty(),
            format!(
                "events do not match final states: {:?}",
                first(&self.notice_mismatch)
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
        row("tasks submitted", self.submitted.to_string(), "");
        row("tasks accepted", self.accepted.to_string(), "= submitted");
        for (state, n) in &self.states {
            row(&format!("final state {state}"), n.to_string(), "");
        }
        row(
            "slowest task (submission to last write)",
            format!("{:.1} s", self.slowest.as_secs_f64()),
            "",
        );
        row("lost", self.lost.len().to_string(), "0");
        if !self.waiting.is_empty() {
            row(
                "waiting for the service that is down",
                self.waiting.len().to_string(),
                "",
            );
        }
        row(
            "keys applied more than once",
            self.doubled.len().to_string(),
            "0",
        );
        row("wrong net effects", self.wrong_net.len().to_string(), "0");
        row(
            "steps committed after their undo (leaked)",
            self.leaked.len().to_string(),
            "0",
        );
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
            "failed tasks / distinct TaskFailed alerts (deliveries)",
            format!(
                "{} / {} ({})",
                self.failed, self.alerted, self.alert_deliveries
            ),
            "one alert per failure",
        );
        row(
            "re-enqueues after a missed pickup / tasks / most in a row for one task",
            format!(
                "{} / {} / {}",
                self.requeues, self.requeued_tasks, self.max_requeues
            ),
            &format!("most in a row <= {}", self.requeue_limit),
        );
        row(
            "applied writes reported as lost races (and, inherent, overtaken before the retry)",
            format!("{} ({})", self.misreported.len(), self.overtaken),
            "0",
        );
        let (lost, throttled, slowed, batches) = self.edges;
        row(
            "lost responses / throttles / slowed work messages / timed-out batches / publishes refused by a bus outage",
            format!(
                "{lost} / {throttled} / {slowed} / {batches} / {}",
                self.bus_refused
            ),
            "",
        );
        row(
            "messages over SQS's 256 KB / records over DynamoDB's 400 KB",
            self.too_large.len().to_string(),
            "0",
        );
        row(
            "notices on the bus not owed by a record, or owed and never published",
            self.notice_mismatch.len().to_string(),
            "0",
        );
        let (sent, dup, delayed, lost_timers) = self.messaging;
        row(
            "messages sent / duplicated / delayed / timers lost",
            format!("{sent} / {dup} / {delayed} / {lost_timers}"),
            "",
        );
        row("dead letters", self.dead_letters.to_string(), "");
        let (asked, applied, refused, unavailable) = self.operator;
        let by: Vec<String> = self
            .operator_actions
            .iter()
            .map(|(a, n)| format!("{a} {n}"))
            .collect();
        row(
            "operator actions asked / applied / refused (409) / answered 5xx",
            format!(
                "{asked} / {applied} / {refused} / {unavailable} ({})",
                by.join(", ")
            ),
            "",
        );
        row(
            "elapsed",
            format!("{:.1} s", self.elapsed.as_secs_f64()),
            "",
        );
        let mut t = format!("| check | value | must be |\n|---|---|---|\n{out}");
        t.push_str("\n| workflow | submitted | accepted |");
        for s in TERMINAL {
            t.push_str(&format!(" {s} |"));
        }
        t.push_str(" not terminal | failed / TaskFailed alerts | effects applied |\n|---|---|---|");
        t.push_str(&"---|".repeat(TERMINAL.len() + 3));
        t.push('\n');
        for (name, w) in &self.workflows {
            let terminal: usize = TERMINAL
                .iter()
                .map(|s| w.states.get(s.as_str()).copied().unwrap_or(0))
                .sum();
            t.push_str(&format!("| {name} | {} | {} |", w.submitted, w.accepted));
            for s in TERMINAL {
                t.push_str(&format!(
                    " {} |",
                    w.states.get(s.as_str()).copied().unwrap_or(0)
                ));
            }
            t.push_str(&format!(
                " {} | {} / {} | {} |\n",
                w.accepted - terminal.min(w.accepted),
                w.failed,
                w.alerted,
                w.effects
            ));
        }
        t.push_str(
            "\n| workflow | terminal tasks | p50 submission→terminal | p99 | max |\n|---|---|---|---|---|\n",
        );
        let ms =
            |v: Option<i64>| v.map_or("-".to_owned(), |v| format!("{:.2} s", v as f64 / 1000.0));
        for (name, w) in &self.workflows {
            t.push_str(&format!(
                "| {name} | {} | {} | {} | {} |\n",
                w.latencies_ms.len(),
                ms(w.latency_ms(0.5)),
                ms(w.latency_ms(0.99)),
                ms(w.latencies_ms.last().copied()),
            ));
        }
        t.push_str("\n| service | calls | transient | 409 in progress | 401 misconfigured | late commits | late commits dropped | oversized |\n|---|---|---|---|---|---|---|---|\n");
        for (name, c) in &self.services {
            t.push_str(&format!(
                "| {name} | {} | {} | {} | {} | {} | {} | {} |\n",
                c.calls,
                c.transient,
                c.in_progress,
                c.misconfigured,
                c.late_commits,
                c.late_dropped,
                c.oversized
            ));
        }
        t.push_str("\n| workflow | failed at step | refused | timed out | faulted | ended |\n|---|---|---|---|---|---|\n");
        for ((workflow, i, step), f) in &self.failed_steps {
            let ended: Vec<String> = f.ended.iter().map(|(s, n)| format!("{s} {n}")).collect();
            t.push_str(&format!(
                "| {workflow} | {} `{step}` | {} | {} | {} | {} |\n",
                i + 1,
                f.refused,
                f.timed_out,
                f.faulted,
                ended.join(", ")
            ));
        }
        t.push_str("\n| crash point | reached | crashed |\n|---|---|---|\n");
        for (p, (reached, crashed)) in &self.points {
            t.push_str(&format!("| `{p}` | {reached} | {crashed} |\n"));
        }
        t
    }
}

/// Whether the run still progresses: a stall is `patience` without a task settling.
struct Progress {
    patience: Duration,
    last: std::sync::Mutex<(usize, Instant)>,
}

impl Progress {
    fn new(patience: Duration) -> Self {
        Self {
            patience,
            last: std::sync::Mutex::new((0, Instant::now())),
        }
    }

    /// Notes that `settled` tasks are settled; whether none settled for the patience.
    fn stalled(&self, settled: usize) -> bool {
        let Ok(mut last) = self.last.lock() else {
            return true;
        };
        if settled != last.0 {
            *last = (settled, Instant::now());
            return false;
        }
        last.1.elapsed() >= self.patience
    }
}

fn first(v: &[String]) -> &[String] {
    &v[..v.len().min(5)]
}

/// Wraps `ports` with the failpoints of `plan`. The catalog is passed through: it is written
/// once, before the run, and only read after.
pub fn wrap(ports: Ports, chaos: &Arc<Chaos>) -> Ports {
    let queue = ChaosQueue::new(ports.queue, chaos.clone(), &ports.resources);
    Ports {
        store: Arc::new(ChaosStore {
            inner: ports.store,
            chaos: chaos.clone(),
        }),
        catalog: ports.catalog,
        queue: Arc::new(queue),
        events: Arc::new(ChaosBus {
            inner: ports.events,
            chaos: chaos.clone(),
        }),
        resources: ports.resources,
        memory: ports.memory,
    }
}

/// [`run`] on fresh in-memory adapters built from the run's settings.
pub async fn run_in_memory(cfg: &Config) -> anyhow::Result<Report> {
    let ports = sas_local::ports(sas_local::Backend::Memory, &cfg.settings).await?;
    run(ports, cfg).await
}

/// Runs `cfg` on `ports` (unwrapped: the harness adds the failpoints).
pub async fn run(ports: Ports, cfg: &Config) -> anyhow::Result<Report> {
    let chaos = Chaos::new(cfg.plan.clone());
    let ports = wrap(ports, &chaos);
    let dlq = ports.resources.dead_letter_url.clone();
    let memory_queues = ports.memory.as_ref().map(|(_, q, _)| q.clone());
    // The simulated services keep the callback contract (they call back once, at the URL a key
    // first arrived with); what they posted is checked against the records at the end.
    let callbacks = sas::remote::CallbackLog::default();
    let mut settings = cfg.settings.clone();
    settings.callback_log = Some(callbacks.clone());
    let mut system = System::from_ports(ports, settings, Arc::new(SystemClock));
    system.publish(&cfg.definitions()?).await?;
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
    let recorder = chaos.recorder.clone();
    let progress = Progress::new(cfg.patience);
    // The operator: watching the lists of tasks waiting for a person, and cancelling some
    // tasks while they run.
    let operator = cfg.operator.clone().map(|plan| {
        Arc::new(Operator::new(
            base.clone(),
            system.store.clone(),
            plan,
            cfg.seed,
        ))
    });
    let operator_stop = Arc::new(AtomicBool::new(false));
    let mut operator_tasks = Vec::new();
    if let Some(op) = &operator {
        let (op, stop) = (op.clone(), operator_stop.clone());
        operator_tasks.push(tokio::spawn(async move { op.watch(&stop).await }));
    }
    let begun = std::sync::atomic::AtomicUsize::new(0);
    let accepted: Vec<Option<(TaskId, &'static str)>> = futures::stream::iter(0..cfg.tasks)
        .map(|i| {
            let (http, base, recorder, progress, begun) =
                (&http, &base, &recorder, &progress, &begun);
            let (operator, operator_stop) = (operator.clone(), operator_stop.clone());
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
                if let Some(op) = operator
                    && let Some(after) = op.cancel_after(id, i)
                {
                    op.pending.fetch_add(1, Ordering::Relaxed);
                    tokio::spawn(async move {
                        tokio::time::sleep(after).await;
                        if !operator_stop.load(Ordering::Relaxed) {
                            op.act(id, "cancel").await;
                        }
                        op.pending.fetch_sub(1, Ordering::Relaxed);
                    });
                }
                Some((id, workflow_of(i)))
            }
        })
        .buffer_unordered(cfg.concurrency.max(1))
        .collect()
        .await;
    let ids: HashMap<TaskId, &'static str> = accepted.iter().flatten().copied().collect();

    // Wait while tasks keep settling (the recorder sees every applied write, so waiting costs
    // the store nothing); then read every record. The operator stops once every task has
    // settled once (or progress stopped), and the run waits again for what it set going.
    let mut finals: HashMap<TaskId, Option<StateRecord>> = HashMap::new();
    for tick in 0u64.. {
        let settled = recorder.settled();
        let stalled = progress.stalled(settled);
        // With a service down for the whole run, some tasks only wait: read the store now
        // and then to see whether the rest are done.
        let look = !cfg.down.is_empty() && tick % 8 == 7;
        if settled >= ids.len() || stalled || look {
            if !look && !operator_stop.swap(true, Ordering::Relaxed) {
                for t in operator_tasks.drain(..) {
                    let _ = t.await;
                }
                while operator
                    .as_ref()
                    .is_some_and(|op| op.pending.load(Ordering::Relaxed) > 0)
                {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                if !stalled {
                    continue;
                }
            }
            finals.clear();
            for id in ids.keys() {
                finals.insert(*id, system.store.get_state(*id).await.ok().flatten());
            }
            let done = finals.values().all(|r| {
                r.as_ref().is_some_and(|r| {
                    (r.process_state.is_terminal() && !r.notice_pending())
                        || (!cfg.down.is_empty() && deferred(r))
                })
            });
            if done || stalled {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let elapsed = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    for t in extra {
        let _ = t.await;
    }
    let applied = operator
        .as_ref()
        .map(|op| op.log.applied())
        .unwrap_or_default();
    let operator_counts = operator.as_ref().map_or((0, 0, 0, 0), |op| {
        (
            op.log.asked.load(Ordering::Relaxed),
            applied.values().map(Vec::len).sum(),
            op.log.refused.load(Ordering::Relaxed),
            op.log.unavailable.load(Ordering::Relaxed),
        )
    });
    let operator_actions = operator.as_ref().map_or_else(BTreeMap::new, |op| {
        op.log
            .by_action()
            .into_iter()
            .map(|(a, n)| (a.to_owned(), n))
            .collect()
    });
    let services = system.services.clone();
    let definitions = system.definitions.clone();
    system.shutdown().await;

    let mut report = Report {
        submitted: cfg.tasks,
        accepted: ids.len(),
        elapsed,
        points: chaos.recorder.points(),
        messaging: chaos.recorder.messaging(),
        dead_letters: memory_queues.map_or(0, |q| q.depth(&dlq).visible),
        operator: operator_counts,
        operator_actions,
        ..Report::default()
    };
    for i in 0..cfg.tasks {
        report
            .workflows
            .entry(workflow_of(i).to_owned())
            .or_default()
            .submitted += 1;
    }
    for name in ids.values() {
        report
            .workflows
            .entry((*name).to_owned())
            .or_default()
            .accepted += 1;
    }

    // What the services applied: effects per key, and the net effect per step key.
    let mut effects: HashMap<String, u32> = HashMap::new();
    let mut net: HashMap<String, i32> = HashMap::new();
    for (name, sim) in services.all() {
        // Late commits still pending land (or are dropped) before anything is counted.
        sim.settle().await;
        let stats = sim.stats();
        effects.extend(stats.effects);
        net.extend(stats.net);
        report
            .leaked
            .extend(stats.leaked.iter().map(|k| format!("{name}: {k}")));
        report.services.insert(
            name,
            ServiceCounts {
                calls: stats.calls,
                transient: stats.transient_faults,
                in_progress: stats.in_progress_faults,
                misconfigured: stats.misconfigured_faults,
                late_commits: stats.late_commits,
                late_dropped: stats.late_dropped,
                oversized: stats.oversized,
            },
        );
    }
    for (key, n) in &effects {
        if *n > 1 {
            report.doubled.push(format!("{key} applied {n} times"));
        }
    }

    // Each key's callback as posted: when, and whether sas took it (202) or called it stale.
    let posted: HashMap<String, sas::remote::PostedCallback> = callbacks
        .lock()
        .map(|log| log.iter().map(|c| (c.key.clone(), c.clone())).collect())
        .unwrap_or_default();
    let mut workflows: HashMap<(String, u32), Arc<Workflow>> = HashMap::new();
    let mut known_keys: BTreeSet<String> = BTreeSet::new();
    let mut failed = BTreeSet::new();
    let mut ended: HashMap<ProcessState, BTreeSet<String>> = HashMap::new();
    let mut sorted: Vec<_> = finals.iter().collect();
    sorted.sort_by_key(|(id, _)| **id);
    for (id, r) in sorted {
        let name = ids.get(id).copied().unwrap_or("?");
        let Some(r) = r else {
            report.lost.push(format!("{id} ({name}): no record"));
            continue;
        };
        let version = (r.workflow.clone(), r.workflow_version);
        let workflow = match workflows.get(&version) {
            Some(w) => w.clone(),
            None => match definitions.workflow(&r.workflow, r.workflow_version).await {
                Ok(Some(w)) => {
                    workflows.insert(version, w.clone());
                    w
                }
                other => {
                    report.invalid.push(format!(
                        "{id}: its workflow {} v{} cannot be read: {:?}",
                        r.workflow,
                        r.workflow_version,
                        other.err()
                    ));
                    continue;
                }
            },
        };
        if r.workflow != name {
            report.invalid.push(format!(
                "{id}: submitted to {name}, its record runs {}",
                r.workflow
            ));
        }
        let counts = report.workflows.entry(r.workflow.clone()).or_default();
        *counts
            .states
            .entry(r.process_state.to_string())
            .or_default() += 1;
        *report
            .states
            .entry(r.process_state.to_string())
            .or_default() += 1;
        report.slowest = report
            .slowest
            .max((r.updated_at - r.created_at).to_std().unwrap_or_default());
        ended
            .entry(r.process_state)
            .or_default()
            .insert(id.to_string());
        let terminal = r.process_state.is_terminal();
        if let Some(at) = r.history.iter().find(|h| h.to.is_terminal()).map(|h| h.at) {
            counts
                .latencies_ms
                .push((at - r.created_at).num_milliseconds());
        }
        let on_down = workflow
            .step(r.step_index)
            .is_some_and(|s| cfg.down.contains(&s.service));
        // With a service down for the whole run, a task whose current step (or undo) is on it
        // can only wait: it defers, or times out and is handed back, again and again.
        if !terminal && on_down {
            report
                .waiting
                .push(format!("{id} ({name}): {}", r.process_state));
        } else if !terminal {
            report
                .lost
                .push(format!("{id} ({name}): still {}", r.process_state));
        }
        if terminal && r.locked_by.is_some() {
            report.locked_terminal.push(id.to_string());
        }
        report
            .ignored_callbacks
            .extend(ignored_callbacks(r, &workflow, &posted));
        if let Err(e) = r.check(&workflow.policies()) {
            report.invalid.push(format!("{id} ({name}): {e}"));
        }
        // (A step its service answered as misconfigured too often stops in Error whatever
        // the policy: no business failure, for an operator to mend.)
        let misconfigured = r
            .steps
            .get(r.step_index)
            .is_some_and(|s| s.misconfigured > 0 && s.status == StepStatus::Pending);
        if cfg.settings.policy.auto_compensate
            && r.process_state == ProcessState::Error
            && !r.past_pivot()
            && !misconfigured
        {
            report.invalid.push(format!(
                "{id} ({name}): in Error before its pivot (automatic compensation is on)"
            ));
        }
        if let Some((i, s)) = r.steps.iter().enumerate().find(|(_, s)| {
            matches!(
                s.status,
                StepStatus::Failed | StepStatus::TimedOut | StepStatus::Faulted
            )
        }) {
            // A refusal is a business outcome: no TaskFailed alert, unless it came past the
            // pivot (the task then waits in Error for a person).
            let refusal = s.status == StepStatus::Failed
                && r.refusal.is_some()
                && r.process_state != ProcessState::Error;
            if !refusal {
                failed.insert(id.to_string());
            }
            let by = report
                .failed_steps
                .entry((r.workflow.clone(), i, s.name.clone()))
                .or_default();
            match s.status {
                StepStatus::Failed => by.refused += 1,
                StepStatus::TimedOut => by.timed_out += 1,
                _ => by.faulted += 1,
            }
            *by.ended.entry(r.process_state.to_string()).or_default() += 1;
        }
        // The keys of the task's steps and undos, and the net effect each step must have.
        let owes_no_undo = matches!(
            r.process_state,
            ProcessState::Processed | ProcessState::Error
        );
        for (i, (step, state)) in workflow.steps.iter().zip(&r.steps).enumerate() {
            let key = idempotency_key(r.task_id, &step.name, &step.action, state.generation);
            counts.effects += effects.get(&key).map_or(0, |n| *n as usize);
            if let Some(undo) = &step.undo {
                let undo_key =
                    idempotency_key(r.task_id, &step.name, &undo.action, state.undo_generation);
                let applied = effects.get(&undo_key).copied().unwrap_or(0);
                counts.effects += applied as usize;
                if owes_no_undo && applied > 0 {
                    report.wrong_net.push(format!(
                        "{id} ({name}) {}: undone though the task is {} and owes no compensation",
                        step.name, r.process_state
                    ));
                }
                known_keys.insert(undo_key);
            }
            let got = net.get(&key).copied().unwrap_or(0);
            known_keys.insert(key);
            // By hand: a skipped step nets what it had when it was skipped (nothing is sent
            // for it); the steps a compensation from an earlier step settled by hand are the
            // operator's to account for.
            let by_hand = applied.get(id).map(Vec::as_slice).unwrap_or_default();
            let skipped = by_hand
                .iter()
                .find(|a| a.action == "skip" && a.step == i && state.status == StepStatus::Done);
            let settled = by_hand
                .iter()
                .any(|a| a.action == "compensate-from" && a.from == ProcessState::Error && i > 0);
            let want = match (skipped, settled) {
                (_, true) => None,
                (Some(a), _) if r.process_state != ProcessState::Resolved => {
                    Some(as_it_ran(a.step_status))
                }
                _ => wanted_net(r, i, state),
            };
            let Some(want) = want else {
                continue;
            };
            if !want.contains(&got) {
                report.wrong_net.push(format!(
                    "{id} ({name}) {}: nets {got}, not {want:?} (task {}, step {}{})",
                    step.name,
                    r.process_state,
                    state.status,
                    state
                        .undo
                        .map(|u| format!(", undo {u}"))
                        .unwrap_or_default()
                ));
            }
        }
    }
    for key in effects.keys() {
        if !known_keys.contains(key) {
            report.wrong_net.push(format!(
                "{key}: applied, but no step of an accepted task has this key"
            ));
        }
    }

    // Alerts as a multiset: every failure is one alert, i.e. one notice id however often it
    // is delivered (at least once). A task the operator never touched fails at most once.
    let alerts = chaos.recorder.notices("TaskFailed");
    for (task, ids_of) in &alerts {
        report.alerted += ids_of.len();
        report.alert_deliveries += ids_of.values().map(|n| *n as usize).sum::<usize>();
        if let Some(name) = task.parse::<TaskId>().ok().and_then(|t| ids.get(&t)) {
            report
                .workflows
                .entry((*name).to_owned())
                .or_default()
                .alerted += ids_of.len();
        }
    }
    let mut failures = 0;
    for (id, r) in &finals {
        let task = id.to_string();
        let n = alerts.get(&task).map_or(0, BTreeMap::len);
        let by_hand = applied.get(id).map(Vec::as_slice).unwrap_or_default();
        let want = match r {
            Some(r) => alerts_owed(failed.contains(&task), r, by_hand),
            None => 0,
        };
        failures += want;
        if let Some(name) = ids.get(id) {
            report
                .workflows
                .entry((*name).to_owned())
                .or_default()
                .failed += want;
        }
        if n != want {
            report.alert_mismatch.push(format!(
                "{task}: {n} distinct TaskFailed alerts, {want} failure(s) by its record and the operator's actions {by_hand:?}"
            ));
        }
    }
    // Every notice on the bus is one a record owed (same id), and every owed one went out.
    for status in [
        Status::Processed,
        Status::Failed,
        Status::Compensated,
        Status::CompensationFailed,
        Status::Refused,
        Status::Resolved,
    ] {
        let published = chaos.recorder.notices(status.detail_type());
        let owed = chaos.recorder.owed(status.as_str());
        let tasks: BTreeSet<&String> = published.keys().chain(owed.keys()).collect();
        for task in tasks {
            let got: BTreeSet<&String> = published
                .get(task)
                .map(|m| m.keys().collect())
                .unwrap_or_default();
            let want: BTreeSet<&String> = owed
                .get(task)
                .map(|s| s.iter().collect())
                .unwrap_or_default();
            for id in got.symmetric_difference(&want) {
                // The record as the run ended, to tell a notice still owed (and why the sweep
                // left it) from one cleared without its delivery.
                let record = task
                    .parse::<TaskId>()
                    .ok()
                    .and_then(|t| finals.get(&t).cloned().flatten())
                    .map(|r| {
                        format!(
                            "{} v{}, outbox {:?}, due key {:?}, updated {}, last: {:?}",
                            r.process_state,
                            r.version,
                            r.owed(),
                            r.due_key,
                            r.updated_at,
                            r.history.last().map(|h| h.reason.clone())
                        )
                    });
                report.notice_mismatch.push(format!(
                    "{id}: published {}, owed by a record {}; the record at the end: {record:?}",
                    got.contains(id),
                    want.contains(id)
                ));
            }
        }
    }
    let requeues = chaos.recorder.requeues();
    report.requeues = requeues.values().map(|(n, _)| *n).sum();
    report.requeued_tasks = requeues.len();
    report.max_requeues = requeues
        .values()
        .map(|(_, longest)| *longest as usize)
        .max()
        .unwrap_or(0);
    report.requeue_limit = requeue_limit(&cfg.settings.policy, cfg.plan.slow_work_queue);
    for (task, (n, longest)) in &requeues {
        if *longest as usize > report.requeue_limit {
            report.over_requeued.push(format!(
                "{task}: re-enqueued {longest} times in a row ({n} in all)"
            ));
        }
    }
    // On average: 2 per task up to a stall that growing delays outlast in 2 (three pickup
    // timeouts); beyond, one more than they need (a task may wait through a stall twice: for
    // its first step and after a step handed back).
    let needed = report.requeue_limit - 2;
    let mean = if needed <= 2 { 2 } else { needed + 1 };
    if report.requeues > mean * ids.len().max(1) {
        report.over_requeued.push(format!(
            "{} re-enqueues for {} tasks: more than {mean} per task",
            report.requeues,
            ids.len()
        ));
    }
    report.misreported = chaos
        .recorder
        .misreported
        .lock()
        .map(|m| m.clone())
        .unwrap_or_default();
    report.too_large = chaos
        .recorder
        .too_large
        .lock()
        .map(|m| m.clone())
        .unwrap_or_default();
    report.edges = chaos.recorder.edges();
    report.bus_refused = chaos.recorder.bus_refused.load(Ordering::Relaxed);
    report.overtaken = chaos.recorder.overtaken.load(Ordering::Relaxed);
    for w in report.workflows.values_mut() {
        w.latencies_ms.sort_unstable();
    }
    report.failed = failures;
    for (state, event) in [
        (ProcessState::Processed, "TaskProcessed"),
        (ProcessState::Compensated, "TaskCompensated"),
        (ProcessState::CompensationFailed, "TaskCompensationFailed"),
        (ProcessState::Refused, "TaskRefused"),
        (ProcessState::Resolved, "TaskResolved"),
    ] {
        let published = chaos.recorder.published(event);
        let empty = BTreeSet::new();
        let in_state = ended.get(&state).unwrap_or(&empty);
        for id in in_state.symmetric_difference(&published) {
            // A task an operator acted on may have had this event and ended otherwise (a
            // compensation that failed, retried to Compensated); the notice ids above still
            // match each event to the record that owed it.
            let touched = id.parse::<TaskId>().is_ok_and(|t| applied.contains_key(&t));
            if touched && !in_state.contains(id) {
                continue;
            }
            report.notice_mismatch.push(format!(
                "{id}: ended {state}; {event} on the bus: {}",
                published.contains(id)
            ));
        }
    }
    report.unreached = REQUIRED_POINTS
        .iter()
        .filter(|p| !report.points.contains_key(**p))
        .map(|p| p.to_string())
        .collect();
    Ok(report)
}

/// The most re-enqueues in a row a task waiting behind a work queue that stalls for `stall`
/// may need if re-enqueues come at growing delays as documented (the first at once, the
/// `n`-th after at least `pickup × 2^(n-1)`; modelled here, not taken from the code under
/// test): the pickup deadlines that pass before the stall ends (and its
/// burst of a second), plus one for a work message lost outright (a crash after the write
/// that made the task Pending), plus one for a run's other delays (duplicates, throttles,
/// timed-out batches). At a fixed period it would be `stall / pickup` and more.
pub fn requeue_limit(p: &Policy, stall: Option<Duration>) -> usize {
    let pickup = p
        .pickup_timeout
        .to_std()
        .unwrap_or_default()
        .max(Duration::from_millis(1));
    let Some(stall) = stall else {
        return 3;
    };
    let end = stall + Duration::from_secs(1);
    let mut deadline = pickup;
    let mut n: u32 = 0;
    while deadline <= end && n < 64 {
        n += 1;
        let delay = if n <= 1 {
            Duration::ZERO
        } else {
            (pickup * 2u32.saturating_pow(n - 1).min(1 << 20)).min(Duration::from_secs(900))
        };
        deadline += delay + pickup;
    }
    n as usize + 2
}

/// The net effects step `i` may have at its service given the task's final state (`None`: not
/// checked, the task is not terminal). A key never applied nets 0.
///
/// - Processed: every step took effect once: 1.
/// - Compensated or Refused: every step with an undo nets 0 (done and undone, or never done); a step
///   without one (a read-only check) stays as it ran.
/// - CompensationFailed: the steps after the one whose undo failed are undone (0); that one may
///   or may not be (its undo was refused, or timed out); those before it stay as they ran.
/// - Error (past the pivot): nothing is undone; every step stays as it ran.
/// - Resolved: not checked (an operator settled the task outside sas).
///
/// "As it ran": Done (or Faulted: the service applied it) is 1; refused (Failed) or never sent
/// (Pending) is 0; a step that timed out may have taken effect or not.
/// The callback steps of `r` that timed out waiting for their callback ("no callback by")
/// after their service had posted it, and never took it: the step did not end Done. sas lost
/// a callback it had taken (202), or called it stale (409) while the step still waited. (A
/// callback held up in a stalled queue may arrive after such a timeout: it completes the step
/// then, which is no violation.)
fn ignored_callbacks(
    r: &StateRecord,
    workflow: &Workflow,
    posted: &HashMap<String, sas::remote::PostedCallback>,
) -> Vec<String> {
    let mut out = Vec::new();
    for (i, s) in r.steps.iter().enumerate() {
        let Some(step) = workflow.step(i) else {
            continue;
        };
        let key = sas::messages::idempotency_key(r.task_id, &step.name, &step.action, s.generation);
        // A callback sas refused as malformed (400: an oversized result, say) is the service's
        // to mend; one it took (202) or called stale (409) is sas's to keep.
        let Some(c) = posted
            .get(&key)
            .filter(|c| matches!(c.status, Some(202 | 409)) && s.status != StepStatus::Done)
        else {
            continue;
        };
        let waited = r.history.iter().find(|h| {
            h.step.as_deref() == Some(s.name.as_str())
                && h.reason.contains("no callback by")
                && h.at > c.at + chrono::Duration::seconds(1)
        });
        if let Some(h) = waited {
            out.push(format!(
                "{} {}: callback posted at {} (answered {:?}), then {:?} at {}, and the step ended {}",
                r.task_id, s.name, c.at, c.status, h.reason, h.at, s.status
            ));
        }
    }
    out
}

fn wanted_net(r: &StateRecord, i: usize, s: &StepState) -> Option<&'static [i32]> {
    use ProcessState as P;
    let as_it_ran = as_it_ran(s.status);
    Some(match r.process_state {
        P::Processed => &[1],
        P::Compensated | P::Refused if s.undoable => &[0],
        P::CompensationFailed if i == r.step_index => &[0, 1],
        P::CompensationFailed if s.undoable && i > r.step_index => &[0],
        P::Compensated | P::Refused | P::CompensationFailed | P::Error => as_it_ran,
        // Settled outside sas by an operator: nothing for sas's books to add up.
        P::Pending | P::Processing | P::Compensating | P::Resolved => return None,
    })
}

/// The net effect of a step "as it ran" (see [`wanted_net`]).
fn as_it_ran(status: StepStatus) -> &'static [i32] {
    use StepStatus as S;
    match status {
        S::Done | S::Faulted => &[1],
        S::Failed | S::Pending => &[0],
        S::Running | S::Waiting | S::TimedOut | S::Cancelled => &[0, 1],
    }
}

/// Whether the record's last move was a deferral by an open circuit (it waits for the service).
fn deferred(r: &StateRecord) -> bool {
    !r.process_state.is_terminal() && r.deferrals > 0
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
                "loan-application.json"
            ]
        );
        let loan: Value = serde_json::from_str(&files[2].1).expect("JSON");
        assert_eq!(loan["defaults"]["timeout"], "2000ms");
        assert_eq!(loan["defaults"]["retry"]["baseDelay"], "100ms");
        assert_eq!(loan["defaults"]["retry"]["maxDelay"], "1000ms");
        // 5s of a 20s default: a quarter of 2s, raised to the run's step timeout.
        assert_eq!(loan["steps"][0]["timeout"], "2000ms");
        assert_eq!(loan["steps"][1]["timeout"], "3000ms");
        assert_eq!(loan["steps"][3]["retry"]["maxDelay"], "5000ms");
        assert_eq!(loan["steps"][3]["retry"]["failureThreshold"], 5);
        assert_eq!(loan["steps"][2]["pivot"], true);
        let w = Workflow::from_value(loan, None, &cfg.settings.policy).expect("valid");
        assert_eq!(w.pivot, Some(2));
        assert_eq!(w.steps[1].policy.step_timeout, chrono::Duration::seconds(3));
        let order: Value = serde_json::from_str(&files[1].1).expect("JSON");
        let original =
            workflow::parse_value(workflow::examples::ECOMMERCE_ORDER, Format::Yaml).expect("YAML");
        assert_eq!(order, original, "an order has no durations to scale");
    }

    #[test]
    fn inputs_alternate_and_match_their_workflows() {
        let policy = Policy::default();
        let order = workflow::examples::ecommerce_order(&policy);
        let loan = workflow::examples::loan_application(&policy);
        for i in 0..6 {
            let w = if i % 2 == 0 { &order } else { &loan };
            assert_eq!(workflow_of(i), w.name);
            w.check_input(&input(i)).expect("a valid input");
        }
    }

    fn record(state: ProcessState, statuses: &[StepStatus], index: usize) -> StateRecord {
        let loan = workflow::examples::loan_application(&Policy::default());
        let mut r = StateRecord::new(
            TaskId::new_random(),
            &loan,
            None,
            chrono::Utc::now(),
            chrono::Utc::now(),
        );
        r.process_state = state;
        r.step_index = index;
        for (s, st) in r.steps.iter_mut().zip(statuses) {
            s.status = *st;
        }
        r
    }

    #[test]
    fn wanted_nets_follow_the_final_state_and_the_steps_undo() {
        use StepStatus as S;
        let done = [S::Done, S::Done, S::Done, S::Done];
        let r = record(ProcessState::Processed, &done, 4);
        assert_eq!(wanted_net(&r, 3, &r.steps[3]), Some(&[1][..]));
        // Refused at reserve-funds: the credit check has no undo and stays at 1.
        let r = record(
            ProcessState::Compensated,
            &[S::Done, S::Failed, S::Pending, S::Pending],
            1,
        );
        assert_eq!(wanted_net(&r, 0, &r.steps[0]), Some(&[1][..]));
        assert_eq!(wanted_net(&r, 1, &r.steps[1]), Some(&[0][..]));
        // Refused at the payout, past the pivot: Error, nothing undone.
        let r = record(
            ProcessState::Error,
            &[S::Done, S::Done, S::Done, S::Failed],
            3,
        );
        assert_eq!(wanted_net(&r, 2, &r.steps[2]), Some(&[1][..]));
        assert_eq!(wanted_net(&r, 3, &r.steps[3]), Some(&[0][..]));
        let r = record(
            ProcessState::Error,
            &[S::Done, S::Done, S::Done, S::TimedOut],
            3,
        );
        assert_eq!(wanted_net(&r, 3, &r.steps[3]), Some(&[0, 1][..]));
        let r = record(ProcessState::Processing, &done, 1);
        assert_eq!(wanted_net(&r, 0, &r.steps[0]), None);
    }

    #[test]
    fn a_report_with_a_wrong_net_effect_is_a_violation() {
        let mut report = Report::default();
        assert!(report.violations().is_empty());
        report
            .wrong_net
            .push("t reserve-funds: nets 1, not [0]".into());
        let v = report.violations();
        assert_eq!(v.len(), 1);
        assert!(v[0].starts_with("wrong net effects"), "{v:?}");
        report.points.insert("put:claimed".into(), (3, 0));
        assert_eq!(report.violations().len(), 2);
    }
    #[test]
    fn realistic_no_tombstones_and_down_set_every_services_faults() {
        let mut cfg = Config::new(2000, 7);
        let before = cfg.settings.faults.clone();
        assert!(before.values().all(|f| f.tombstones && !f.in_progress));
        cfg.realistic();
        cfg.without_tombstones();
        cfg.down("e-sign").expect("a service of the examples");
        assert!(cfg.down("no-such-service").is_err());
        let now = chrono::Utc::now();
        for (name, f) in &cfg.settings.faults {
            assert!(
                f.late_commit_rate > 0.0 && f.in_progress && !f.tombstones,
                "{name}"
            );
            let (from, to) = f.unauthorized.expect("a 401 window");
            assert!(
                from > now && to - from == chrono::Duration::seconds(3),
                "{name}"
            );
            let whole_run = f.outage.is_some_and(|(a, b)| a < now && b > now);
            assert_eq!(whole_run, name == "e-sign", "{name}");
        }
    }

    #[test]
    fn latency_percentiles_are_nearest_rank_and_leaks_are_violations() {
        let w = WorkflowCounts {
            latencies_ms: (1..=100).collect(),
            ..WorkflowCounts::default()
        };
        assert_eq!(w.latency_ms(0.5), Some(50));
        assert_eq!(w.latency_ms(0.99), Some(99));
        assert_eq!(WorkflowCounts::default().latency_ms(0.5), None);
        let three = WorkflowCounts {
            latencies_ms: vec![10, 20, 30],
            ..WorkflowCounts::default()
        };
        assert_eq!(three.latency_ms(0.5), Some(20));
        assert_eq!(three.latency_ms(0.99), Some(30));
        let mut report = Report::default();
        report.workflows.insert("loan-application".into(), w);
        report
            .leaked
            .push("e-sign: t:send-contract:send-contract:0".into());
        let v = report.violations();
        assert!(v.iter().any(|v| v.contains("leaked")), "{v:?}");
        let t = report.table();
        assert!(
            t.contains("| loan-application | 100 | 0.05 s | 0.10 s | 0.10 s |"),
            "{t}"
        );
        assert!(
            t.contains("| steps committed after their undo (leaked) | 1 | 0 |"),
            "{t}"
        );
    }
}
