//! Overload in memory: for 10 s the run submits three times the tasks a second the agents can
//! serve (no faults, no crashes, no operator). The agent queue's backlog peaks after 10 s and
//! drains in about 20 more: requests wait up to about 20 s for an agent, ten times the 2 s step
//! timeout. With each request allowed 30 s to be picked up (`START_WITHIN_SECONDS`), every
//! task without a time limit of its own ends Processed, late, with no failure (a loan's and an
//! agreement's event windows and deadlines are the business's: an overload makes most miss
//! them, which the run's checks cover); the deadline running from the dispatch
//! (`START_WITHIN_SECONDS=0`, the design before) fails and compensates them en masse (shown in
//! docs/guarantees.md: `sas-chaos --overload 10 --start-within 0`).

use sas_chaos::{Config, run_in_memory};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_times_what_the_agents_serve_makes_tasks_late_not_failed() {
    let mut cfg = Config::new(0, 5);
    cfg.overload(10, chrono::Duration::seconds(30));
    let step_timeout = cfg
        .settings
        .policy
        .step_timeout
        .to_std()
        .expect("a positive timeout");
    let report = run_in_memory(&cfg).await.expect("the run completes");
    println!("{}", report.table());
    let violations = report.violations();
    assert!(violations.is_empty(), "{violations:#?}\n{}", report.table());
    assert_eq!(report.accepted, cfg.tasks, "{}", report.table());
    for name in sas_chaos::WORKFLOWS
        .into_iter()
        .filter(|w| !["agreement", "loan-application"].contains(w))
    {
        let w = &report.workflows[name];
        assert_eq!(
            w.states.get("Processed").copied(),
            Some(w.accepted),
            "every {name} Processed (late, not failed or compensated)\n{}",
            report.table()
        );
        assert_eq!(w.failed, 0, "{name}\n{}", report.table());
    }
    // It was an overload: tasks waited far longer than a step may take.
    assert!(
        report.slowest > 3 * step_timeout,
        "slowest task {:?}: no backlog formed\n{}",
        report.slowest,
        report.table()
    );
}
