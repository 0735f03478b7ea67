//! The sub-workflow case, in memory under the run's faults and failpoints: checkouts pay
//! through a child task, and shipping refuses a third of them after the child ended
//! `Processed`: each such child is undone as a unit (refund, then void), exactly once, and no
//! child is orphaned, started twice or left holding its effects (see
//! `harness/sub_workflows.rs`).

use sas_chaos::{Config, run_sub_workflow_case};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn children_end_as_their_parents_say_and_are_undone_as_a_unit() {
    let mut cfg = Config::new(0, 31);
    cfg.patience = Duration::from_secs(45);
    let report = run_sub_workflow_case(&cfg, 60)
        .await
        .expect("the case runs");
    println!(
        "parents {:?}; children {:?}; undone as a unit: {}; resolved by the operator: {}",
        report.parents, report.children, report.undone_as_a_unit, report.resolved_children
    );
    assert!(report.violations.is_empty(), "{:#?}", report.violations);
    assert!(
        report.undone_as_a_unit > 0,
        "no child was undone as a unit: the case proves nothing"
    );
    assert!(
        report.parents.get("Processed").copied().unwrap_or(0) > 0,
        "no checkout went through: {:?}",
        report.parents
    );
}
