//! What the chaos cases share: an in-memory system behind the failpoints (crashes after
//! writes, duplicated and delayed messages, lost write responses, throttles), with the case's
//! definitions published and its pollers running, served on loopback for the operator API.

use crate::failpoints::{Chaos, Plan, wrap};
use sas::ports::SystemClock;
use sas::remote::Faults;
use sas_local::intercept::{Failure, Intercepted, Interceptor, Next, Reply};
use sas_local::{Backend, Settings, System};
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;

/// A running system of a case.
pub(super) struct CaseWorld {
    pub system: System,
    /// `http://127.0.0.1:{port}`.
    pub base: String,
    http: reqwest::Client,
}

/// Settings sized for a case in memory: short timeouts, failures waiting in `Error` for the
/// operator (`AUTO_COMPENSATE=false`), and `faults` for the case's services.
pub(super) fn settings(faults: Vec<(&str, Faults)>) -> Settings {
    let mut s = Settings {
        definitions: vec![],
        ..Settings::default()
    };
    s.policy.step_timeout = chrono::Duration::milliseconds(1500);
    // A work message lost to a crash is sent again soon.
    s.policy.pickup_timeout = chrono::Duration::milliseconds(500);
    s.policy.retry_base_delay = chrono::Duration::milliseconds(50);
    s.policy.retry_max_delay = chrono::Duration::milliseconds(200);
    s.policy.failure_threshold = 2;
    s.policy.auto_compensate = false;
    s.policy.undo_wait = chrono::Duration::milliseconds(200);
    s.supervisor_interval = Duration::from_millis(100);
    s.poll_wait = Duration::from_millis(20);
    s.scheduler_concurrency = 4;
    s.agent_concurrency = 8;
    s.breaker.cooldown = chrono::Duration::milliseconds(200);
    // As deployed: a service without limits of its own is capped by the share (more than the
    // case's agents, so it never holds a call back), its pace marked and its slow calls' slots
    // taken through the failpoints like every other write.
    s.service_share = Some(sas::config::DEFAULT_SERVICE_SHARE);
    s.catalog_ttl = chrono::Duration::milliseconds(200);
    // A message whose handler "died" comes back soon.
    s.visibility_timeout = Some(Duration::from_millis(500));
    for (name, f) in faults {
        s.faults.insert(name.to_owned(), f);
    }
    s
}

/// The services file of the cases whose one service is `ledger` (simulated; its faults are the
/// case's).
pub(super) fn ledger_services() -> (String, String) {
    (
        "services.yaml".into(),
        "services:\n  - {name: ledger, target: {type: simulated}}\n".into(),
    )
}

/// The failpoints of a case: the main run's random crashes and message faults, and lost write
/// responses and throttles (AWS's rough edges on the writes a case adds).
pub(super) fn plan(seed: u64) -> Plan {
    let mut plan = Plan::new(seed);
    // Random crashes only: the main run crashes every point it reaches (its first
    // occurrences); a case's few tasks would spend the run recovering from those.
    plan.crash_first = 0;
    plan.lost_response_rate = 0.03;
    plan.throttle_rate = 0.01;
    plan
}

impl CaseWorld {
    /// Builds, publishes `files` on, serves and starts a system of `settings` behind `plan`'s
    /// failpoints.
    pub async fn start(
        settings: Settings,
        plan: Plan,
        files: &[(String, String)],
    ) -> anyhow::Result<Self> {
        let mut ports = sas_local::ports(Backend::Memory, &settings).await?;
        // Every store call takes 1 to 5 ms, as a call to DynamoDB does: two handlers that
        // read and then write at once interleave.
        ports.store = Arc::new(Intercepted::new(ports.store, Arc::new(Latency)));
        let ports = wrap(ports, &Chaos::new(plan));
        let mut system = System::from_ports(ports, settings, Arc::new(SystemClock));
        system.publish(files).await?;
        let addr = system.serve("127.0.0.1:0".parse()?).await?;
        system.start();
        Ok(Self {
            system,
            base: format!("http://{addr}"),
            http: reqwest::Client::new(),
        })
    }

    /// `POST /operator{path}` with `body`: its status (`503` if it did not answer).
    pub async fn operator(&self, path: &str, body: &Value) -> u16 {
        let url = format!("{}/operator{path}", self.base);
        match self.http.post(&url).json(body).send().await {
            Ok(resp) => resp.status().as_u16(),
            Err(_) => 503,
        }
    }

    pub async fn shut_down(self) {
        self.system.shutdown().await;
    }
}

/// A store call's round trip (see [`CaseWorld::start`]).
struct Latency;

#[async_trait::async_trait]
impl Interceptor for Latency {
    async fn around<'a, R: Reply, E: Failure>(&'a self, next: Next<'a, R, E>) -> Result<R, E> {
        let ms = 1 + u64::from(rand_u8() % 5);
        tokio::time::sleep(Duration::from_millis(ms)).await;
        next.run(next.call()).await
    }
}

/// A random byte (the latencies need no seed: thread timing varies anyway).
fn rand_u8() -> u8 {
    uuid::Uuid::new_v4().as_bytes()[0]
}
