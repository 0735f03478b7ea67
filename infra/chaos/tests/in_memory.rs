//! A chaos run in memory with every rough edge of AWS on and automatic compensation off
//! (`AUTO_COMPENSATE=false`): failures wait in Error, and the operator's compensate and
//! compensate-from apply to tasks that failed before their pivot. The larger runs
//! (`sas-chaos --tasks 20000 --every-switch --manual-compensation`, docs/guarantees.md) are
//! run by hand; this one keeps the path in every CI run.

use sas_chaos::{Config, run_in_memory};
use std::time::Duration;

mod common;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_switch_with_manual_compensation_loses_nothing_and_does_nothing_twice() {
    let tasks = 1000;
    let mut cfg = Config::new(tasks, 11);
    cfg.every_switch();
    cfg.manual_compensation();
    cfg.patience = Duration::from_secs(90);
    // Fail a step at its second timeout (not its fourth), and make 10% of calls slower than
    // the deadline (not 2%): on 1,000 tasks, enough failures for the operator to act on (the
    // 20,000-task runs get them from the stalls).
    cfg.settings.policy.failure_threshold = 2;
    for f in cfg.settings.faults.values_mut() {
        f.slow_rate = 0.1;
    }
    let report = run_in_memory(&cfg).await.expect("the run completes");
    common::assert_clean(&report, tasks);
    // Automatic compensation is off, so a failure waits in Error before its pivot, where a
    // compensation from the first step applies (with it on, only tasks past their pivot wait,
    // and the API refuses that action: the 20,000-task runs applied none).
    let from_first = report
        .operator_actions
        .get("compensate-from")
        .copied()
        .unwrap_or(0);
    assert!(
        from_first > 0,
        "no compensate-from applied\n{}",
        report.table()
    );
}
