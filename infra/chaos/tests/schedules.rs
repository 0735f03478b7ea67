//! A schedule's runs that overlap (delivered twice, late and at once; tasks slow and failing
//! into Error for an operator), in memory behind the failpoints: under `overlap: skip` no two
//! of its tasks are ever not ended at once (docs/guarantees.md).

use sas_chaos::{OverlappingRuns, overlapping_runs};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_skip_schedules_tasks_never_overlap() {
    let report = overlapping_runs(&OverlappingRuns::new(60, 7))
        .await
        .expect("the run completes");
    println!("{}", report.table());
    assert!(
        report.violations.is_empty(),
        "{:#?}\n{}",
        report.violations,
        report.table()
    );
    // The run made overlaps likely, else it proves nothing: runs skipped while a task ran or
    // waited in Error, and the operator acted on tasks in Error.
    assert!(
        report.tasks > 1 && report.tasks < report.runs,
        "{}",
        report.table()
    );
    assert!(
        report.in_error > 0 && report.retries > 0,
        "{}",
        report.table()
    );
}
