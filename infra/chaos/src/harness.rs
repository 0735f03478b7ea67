//! The chaos run: tasks of the example workflows and of the run's `agreement` (a wait, a wait
//! for the first of two events, a deadline; in simulated days), in turn, submitted over HTTP to
//! the real handlers, on ports wrapped with failpoints, with
//! several scheduler and agent pollers and several supervisors at once, and seeded
//! remote-service faults. At the end every task is checked against its workflow.
//!
//! [`run`] goes through its phases in order, one module each: `world` (set the system up from
//! the [`Config`] in `config`, with the definitions of `definitions`), `operating` (the
//! operator at work), `load` (submit the tasks), `signing` (the agreements' applicant delivering
//! their events), `settle` (wait for quiescence), `checks` (the
//! end-of-run checks, one named function each), into the [`Report`] of `report` (shown by
//! `table`).
//!
//! Beside the run, cases of their own on its world: `for_each` (retries on new inputs, long
//! lists), `sub_workflows` (children undone as a unit by their parents) and `distributed` (a
//! distributed forEach of 1,000 elements beside a child, stopped, undone and processed).

mod checks;
mod config;
mod definitions;
mod distributed;
mod for_each;
mod load;
mod operating;
mod report;
mod settle;
mod signing;
mod sub_workflows;
mod table;
mod world;

pub use crate::failpoints::wrap;
pub use checks::crash_points::REQUIRED_POINTS;
pub use checks::requeues::requeue_limit;
pub use config::{Config, OVERLOAD_AGENTS, OVERLOAD_CALL_MS, OVERLOAD_CAPACITY, ServiceLimit};
pub use definitions::ORDER_TRIAGE;
pub use distributed::{DistributedCase, DistributedReport, MAX_CONCURRENCY, run_distributed_case};
pub use for_each::{ForEachCases, ForEachReport, run_for_each_cases};
pub use load::{WORKFLOWS, input, workflow_of};
pub use report::{Report, ServiceCounts, StepFailures, WorkflowCounts};
pub use sub_workflows::{SubWorkflowReport, run_sub_workflow_case};

use sas::TaskId;
use sas_local::Ports;
use std::collections::HashMap;
use std::time::Instant;

/// [`run`] on fresh in-memory adapters built from the run's settings.
pub async fn run_in_memory(cfg: &Config) -> anyhow::Result<Report> {
    let ports = sas_local::ports(sas_local::Backend::Memory, &cfg.settings).await?;
    run(ports, cfg).await
}

/// Runs `cfg` on `ports` (unwrapped: the harness adds the failpoints).
pub async fn run(ports: Ports, cfg: &Config) -> anyhow::Result<Report> {
    let mut world = world::World::set_up(ports, cfg).await?;
    let started = Instant::now();
    let progress = settle::Progress::new(cfg.patience);
    let mut operator = operating::Operating::start(cfg, &world);
    let day = definitions::simulated_day(&cfg.settings.policy);
    let signing = signing::Signing::new(&world.base, cfg.seed, day);
    let (ids, indexes) =
        load::submit_all(cfg, &world, &operator, &signing, &progress, started).await;
    let finals = settle::wait_for_quiescence(cfg, &world, &mut operator, &progress, &ids).await;
    let elapsed = started.elapsed();
    let agreements: HashMap<TaskId, usize> = indexes
        .iter()
        .filter(|(id, _)| ids.get(*id) == Some(&"agreement"))
        .map(|(id, i)| (*id, *i))
        .collect();
    let sent = signing.finish(&*world.system.store, &agreements).await;
    let (purged, outlived) = world.end_retention(cfg, &finals).await;
    world.stop_supervisors().await;
    let by_operator = operator.tally();
    let left = world.shut_down().await;
    let end = checks::Ending {
        ids,
        indexes,
        finals,
        elapsed,
        operator: by_operator,
        sent,
        left,
    };
    let mut report = checks::check(cfg, end).await;
    report.purged = purged;
    report.outlived = outlived;
    Ok(report)
}
