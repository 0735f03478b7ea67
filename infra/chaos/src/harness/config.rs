//! The options of a chaos run: how many tasks, the seed, the system's settings and each
//! service's faults, the failpoints' plan, the operator; and the switches that turn on a kind of
//! trouble (realistic services, every rough edge of AWS, overload, a service down, a planted
//! bug).

use crate::failpoints::Plan;
use sas::domain::workflow;
use sas::remote::Faults;
use sas_local::Settings;
use std::time::Duration;

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
    /// Services given limits ([`Config::limit`]): published with them, and checked at the
    /// service (calls at once, calls in any second).
    pub limits: Vec<ServiceLimit>,
    /// The forEach cases' workflows are published too (`restock`, `stocktake`: see
    /// `harness/for_each.rs`).
    pub for_each_cases: bool,
    /// The sub-workflow case's workflows are published too (`settle-payment`, `checkout`: see
    /// `harness/sub_workflows.rs`).
    pub sub_workflow_case: bool,
    /// The distributed forEach case's workflows (`month-end` and its variants) and services
    /// (`ledger`, `clearing`) are published too: see `harness/distributed.rs`.
    pub distributed_case: bool,
}

/// A service's limits in a run: at most `concurrency` calls at once and `per_second` a second
/// with `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServiceLimit {
    pub service: &'static str,
    pub concurrency: u32,
    pub per_second: u32,
    pub burst: u32,
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
            limits: vec![],
            for_each_cases: false,
            sub_workflow_case: false,
            distributed_case: false,
        }
    }

    /// Gives `limit.service` its limits, and a burst of tasks every call of which must keep
    /// them: the services answer after 5 ms without business faults (no refusal, no outage,
    /// no transient fault: every task that only calls services must end Processed, however
    /// long the limit makes it wait) and nobody acts at the operator API (a cancel is not
    /// Processed). The failpoints stay as they are: with [`Config::every_switch`], crashes,
    /// duplicates, throttles and lost answers around every write. Every submission at once.
    pub fn limit(&mut self, limit: ServiceLimit) {
        for f in self.settings.faults.values_mut() {
            *f = Faults {
                latency: Duration::from_millis(5),
                seed: f.seed,
                ..Faults::default()
            };
        }
        self.operator = None;
        self.rate = None;
        // The limited service's calls queue: tasks wait for it as long as it takes.
        let calls = self.tasks as f64 / f64::from(limit.per_second.max(1));
        self.patience = self
            .patience
            .max(Duration::from_secs_f64(calls * 2.0 + 30.0));
        self.limits.push(limit);
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
}

/// Agent pollers in an overload run, each taking one request at a time...
pub const OVERLOAD_AGENTS: usize = 4;
/// ...and the time each call takes there...
pub const OVERLOAD_CALL_MS: u64 = 25;
/// ...so the calls a second the agents serve.
pub const OVERLOAD_CAPACITY: f64 = OVERLOAD_AGENTS as f64 * 1000.0 / OVERLOAD_CALL_MS as f64;

#[cfg(test)]
mod tests {
    use super::*;

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
}
