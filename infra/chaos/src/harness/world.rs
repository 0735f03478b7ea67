//! Setting up the world a run drives, from its options: the ports wrapped with failpoints, the
//! system with its pollers and the run's definitions published, its HTTP API served, and the
//! extra supervisors; and taking it down at the end, keeping what the checks read.

use super::config::Config;
use crate::failpoints::{Chaos, Plan, wrap};
use sas::catalog::Definitions;
use sas::handlers::supervisor;
use sas::memory::MemoryQueues;
use sas::ports::SystemClock;
use sas::remote::CallbackLog;
use sas_local::{Ports, Simulated, System};
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
        let mut system = System::from_ports(ports, settings, Arc::new(SystemClock));
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
        })
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
