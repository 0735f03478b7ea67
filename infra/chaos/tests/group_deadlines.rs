//! Task deadlines at parallel groups (one branch's service paused or slow), in memory behind
//! the failpoints, with an operator skipping or retrying the failures: every record keeps its
//! invariants and no step that was done is rewritten (docs/guarantees.md).

use sas_chaos::{GroupDeadlines, deadlines_at_groups};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deadlines_at_groups_keep_every_record_valid_and_every_done_step() {
    let report = deadlines_at_groups(&GroupDeadlines::new(40, 11))
        .await
        .expect("the run completes");
    println!("{}", report.table());
    assert!(
        report.violations.is_empty(),
        "{:#?}\n{}",
        report.violations,
        report.table()
    );
    assert!(
        report.timed_out > 0 && report.skips > 0 && report.retries > 0,
        "the case happened: {}",
        report.table()
    );
}
