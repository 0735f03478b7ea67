//! A hot key at a concurrency gate of 1 (one account's tasks while its service is slow and
//! refuses some, an operator retrying and resolving), in memory behind the failpoints: its
//! tasks run one at a time in the order submitted and none is left in line
//! (docs/guarantees.md).

use sas_chaos::{HotGate, hot_gate};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hot_accounts_tasks_run_one_at_a_time_in_order_and_none_is_left_in_line() {
    let report = hot_gate(&HotGate::new(30, 10, 5))
        .await
        .expect("the run completes");
    println!("{}", report.table());
    assert!(
        report.violations.is_empty(),
        "{:#?}\n{}",
        report.violations,
        report.table()
    );
    // The run made the line real, else it proves nothing: tasks waited for the one before
    // them, and the operator moved on tasks that held the gate in Error.
    assert!(report.waited > 5, "{}", report.table());
    assert!(report.retries > 0, "{}", report.table());
    // (A submission the failpoints throttle or crash is sent again under its key.)
    assert_eq!(report.tasks, 40, "{}", report.table());
}
