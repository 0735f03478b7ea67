//! The chaos run on the AWS adapters against the emulator: a smaller seeded run than
//! `sas-chaos`'s default (tasks of e-commerce orders, loan applications, order triages and
//! agreements, whose events and deadline run in simulated days, in turn), so that the guarantees are checked on DynamoDB and SQS semantics too
//! (conditional expressions, GSI queries, SQS delays and visibility), not only in memory.
//! `infra/test.sh` runs it with DynamoDB on DynamoDB Local and SQS and EventBridge on moto
//! (`cargo test --test chaos` runs it on moto alone).
//!
//! It does not depend on the machine's speed: at most 16 tasks are in flight at once (a slow
//! machine gets the same load per task as a fast one, only later), and the run waits as long
//! as tasks keep settling instead of for a fixed time. It runs with one core kept busy by a
//! spinning thread, as on a loaded CI machine.

use sas_blackbox::{sdk_config, template, unique};
use sas_chaos::{Config, run};
use sas_local::{Backend, ports};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

#[path = "../infra/chaos/tests/common/mod.rs"]
mod common;

/// A thread spinning on one core until dropped.
struct Busy(Arc<AtomicBool>, Option<std::thread::JoinHandle<()>>);

impl Busy {
    fn start() -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let spinning = stop.clone();
        let handle = std::thread::spawn(move || {
            while !spinning.load(Ordering::Relaxed) {
                std::hint::spin_loop();
            }
        });
        Self(stop, Some(handle))
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
        if let Some(h) = self.1.take() {
            let _ = h.join();
        }
    }
}

async fn chaos_on_the_emulator(tasks: usize, seed: u64) {
    let _busy = Busy::start();
    let config = sdk_config().await;
    let stack = template::provision(&config, &unique("chaos")).await;
    let mut cfg = Config::new(tasks, seed);
    // The emulator serves one request at a time: long polls (not busy polling), fewer pollers,
    // wider deadlines (the loan application's are scaled from these), fewer submissions in
    // flight. Nine agent pollers on the one agent queue: as many as the three per-service
    // queues had before (with three, the agents fell behind and most steps timed out).
    cfg.settings.poll_wait = Duration::from_secs(1);
    cfg.settings.scheduler_concurrency = 3;
    cfg.settings.agent_concurrency = 9;
    cfg.settings.policy.step_timeout = chrono::Duration::seconds(4);
    cfg.settings.policy.pickup_timeout = chrono::Duration::seconds(8);
    cfg.settings.supervisor_interval = Duration::from_millis(1000);
    cfg.concurrency = 8;
    cfg.supervisors = 4;
    cfg.window = Some(16);
    cfg.patience = Duration::from_secs(90);
    // AWS's rough edges that cost no wall-clock time: lost write responses (the DynamoDB
    // store's read-back, on the emulator's DynamoDB), throttling, timed-out batches, a bus
    // outage. (The stalling work queue would only make the run longer.)
    cfg.plan.lost_response_rate = 0.02;
    cfg.plan.throttle_rate = 0.01;
    cfg.plan.batch_timeout_rate = 0.02;
    cfg.plan.bus_outage = Some(Duration::from_secs(1));
    let backend = Backend::Existing {
        config: Box::new(config),
        resources: Box::new(stack.resources),
    };
    let p = ports(backend, &cfg.settings).await.expect("ports");
    let report = run(p, &cfg).await.expect("the run completes");
    common::assert_clean(&report, tasks);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_seeded_chaos_run_on_the_emulator_loses_nothing_and_does_nothing_twice() {
    // 120 tasks: every workflow, crash point and answer comes up. `infra/test.sh` runs this
    // with DynamoDB on DynamoDB Local only (on moto's DynamoDB, 120 tasks took 364-557 s on a
    // 2-core machine; 200 took 824 s).
    let tasks = 120;
    chaos_on_the_emulator(tasks, 7).await;
}
