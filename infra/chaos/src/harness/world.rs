//! Setting up the world a run drives, from its options: the ports wrapped with failpoints, the
//! system with its pollers and the run's definitions published, its HTTP API served, and the
//! extra supervisors; and taking it down at the end, keeping what the checks read.

use super::config::Config;
use crate::failpoints::{Chaos, Plan, wrap};
use sas::catalog::Definitions;
use sas::handlers::supervisor;
use sas::memory::MemoryQueues;
use sas::ports::{Clock, OffsetClock};
use sas::remote::CallbackLog;
use sas::{StateRecord, TaskId};
use sas_local::{Ports, Simulated, System};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// A running system under chaos.
pub(super) struct World {
    pub system: System,
    pub chaos: Arc<Chaos>,
    /// The callbacks the simulated services posted (they keep the callback contract: once, at
    /// the URL a key first arrived with).
    pub callbacks: CallbackLog,
    /// The system's HTTP API, `http://127.0.0.1:{port}`.
    pub base: String,
    dlq: String,
    memory_queues: Option<Arc<MemoryQueues>>,
    supervisors: Supervisors,
    /// The system's clock: the time of day until the end, when it moves past the retention.
    clock: Arc<OffsetClock>,
}

/// What is left of the world once it is shut down, for the checks.
pub(super) struct Leftovers {
    pub chaos: Arc<Chaos>,
    pub callbacks: CallbackLog,
    pub services: Simulated,
    pub definitions: Arc<Definitions>,
    /// Messages in the dead-letter queue (in memory only; 0 on the AWS adapters).
    pub dead_letters: usize,
}

impl World {
    /// Builds and starts the system of `cfg` on `ports` (unwrapped: the failpoints are added
    /// here).
    pub async fn set_up(ports: Ports, cfg: &Config) -> anyhow::Result<Self> {
        let (ports, chaos) = with_failpoints(ports, &cfg.plan);
        let dlq = ports.resources.dead_letter_url.clone();
        let memory_queues = ports.memory.as_ref().map(|(_, q, _)| q.clone());
        // The simulated services keep the callback contract (they call back once, at the URL a
        // key first arrived with); what they posted is checked against the records at the end.
        let callbacks = sas::remote::CallbackLog::default();
        let mut settings = cfg.settings.clone();
        settings.callback_log = Some(callbacks.clone());
        let clock = Arc::new(OffsetClock::default());
        let mut system = System::from_ports(ports, settings, clock.clone());
        system.publish(&cfg.definitions()?).await?;
        system.supervisor.lease_ttl = chrono::Duration::seconds(2);
        let addr = system.serve("127.0.0.1:0".parse()?).await?;
        system.start();
        let supervisors = Supervisors::start(&system, cfg);
        Ok(Self {
            system,
            chaos,
            callbacks,
            base: format!("http://{addr}"),
            dlq,
            memory_queues,
            supervisors,
            clock,
        })
    }

    /// Ends the retention of the run's final tasks (`finals`, read once the run settled): the
    /// clock moves past it, and the sweeps purge each task that kept payloads (its objects,
    /// then its items). The tasks purged, and each one whose items or objects outlived it.
    pub async fn end_retention(
        &self,
        cfg: &Config,
        finals: &HashMap<TaskId, Option<StateRecord>>,
    ) -> (usize, Vec<String>) {
        let Some(keep) = cfg.settings.retention else {
            return (0, vec![]);
        };
        let kept: Vec<TaskId> = finals
            .iter()
            .filter(|(_, r)| {
                r.as_ref()
                    .is_some_and(|r| r.process_state.is_final() && r.payloads)
            })
            .map(|(id, _)| *id)
            .collect();
        self.clock.advance(keep + chrono::Duration::minutes(1));
        let store = &self.system.store;
        let until = std::time::Instant::now() + cfg.patience;
        loop {
            let mut left = 0;
            for id in &kept {
                // Reads pass the failpoints; an error counts as not purged yet.
                if !matches!(store.get_state(*id).await, Ok(None)) {
                    left += 1;
                }
            }
            if left == 0 || std::time::Instant::now() > until {
                break;
            }
            let _ = self.system.sweep().await;
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        let payloads = &self.system.supervisor.ports.payloads;
        let mut outlived = vec![];
        for id in &kept {
            match store.get_state(*id).await {
                Ok(None) => {}
                Ok(Some(_)) => outlived.push(format!("{id}: its items at {}", self.clock.now())),
                Err(e) => outlived.push(format!("{id}: its record unreadable: {e}")),
            }
            // Deleting what is left is the check: nothing should be.
            match payloads.delete_task(*id).await {
                Ok(0) => {}
                Ok(n) => outlived.push(format!("{id}: {n} objects")),
                Err(e) => outlived.push(format!("{id}: its objects unlisted: {e}")),
            }
        }
        (kept.len(), outlived)
    }

    /// Stops the extra supervisors and waits for their sweeps to end.
    pub async fn stop_supervisors(&mut self) {
        self.supervisors.stop().await;
    }

    /// Shuts the system down and keeps what the checks read.
    pub async fn shut_down(self) -> Leftovers {
        let services = self.system.services.clone();
        let definitions = self.system.definitions.clone();
        self.system.shutdown().await;
        Leftovers {
            chaos: self.chaos,
            callbacks: self.callbacks,
            services,
            definitions,
            dead_letters: self.memory_queues.map_or(0, |q| q.depth(&self.dlq).visible),
        }
    }
}

/// The failpoints of `plan` over `ports`: the one place the harness builds them.
fn with_failpoints(ports: Ports, plan: &Plan) -> (Ports, Arc<Chaos>) {
    let chaos = Chaos::new(plan.clone());
    let ports = wrap(ports, &chaos);
    (ports, chaos)
}

/// The supervisors besides the system's own, each its own instance (its own lease owner),
/// sweeping until stopped.
struct Supervisors {
    stop: Arc<AtomicBool>,
    sweeping: Vec<tokio::task::JoinHandle<()>>,
}

impl Supervisors {
    fn start(system: &System, cfg: &Config) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let mut sweeping = Vec::new();
        for i in 1..cfg.supervisors.max(1) {
            let mut deps = system.supervisor.clone();
            deps.instance_id = format!("chaos-supervisor-{i}");
            let (stop, every) = (stop.clone(), cfg.settings.supervisor_interval);
            sweeping.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let _ = supervisor::sweep(&deps).await;
                    tokio::time::sleep(every).await;
                }
            }));
        }
        Self { stop, sweeping }
    }

    async fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.sweeping.drain(..) {
            let _ = t.await;
        }
    }
}
