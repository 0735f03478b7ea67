//! The distributed forEach case, in memory with every switch on: month-end tasks open a period,
//! pay through a child task, post invoices (1,000 for one, 100 for the others) as a distributed
//! forEach (one in chunks of 10) and file. Some runs stop past their tolerance and undo
//! themselves, some tasks are undone after their run ended
//! `Processed`, some go through; nothing is lost or doubled at the services, no run has more
//! elements in calls at once than its `maxConcurrency`, no child or element is orphaned, and
//! nothing is left after the retention (see `harness/distributed.rs`).

use sas_chaos::{Config, DistributedCase, run_distributed_case};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_thousand_elements_beside_a_child_end_as_their_tasks_say_under_every_switch() {
    let mut cfg = Config::new(0, 42);
    cfg.every_switch();
    // The run of 1,000 elements takes about 80 s under every switch (the work queue stalls
    // 12 s in every 48): a run that stalls for good is reported well before this.
    cfg.patience = Duration::from_secs(150);
    let case = DistributedCase {
        processed: 1,
        returned: 1,
        stopped: 2,
        chunked: 1,
        elements: 1000,
        others: 100,
    };
    let report = run_distributed_case(&cfg, case)
        .await
        .expect("the case runs");
    println!(
        "tasks {:?}; runs {:?}; children {:?}; {} elements opened, marks {:?}; stopped and undone: {}; \
         undone after Processed: {}; most in calls at once {} (maxConcurrency {}); purged {}; took {:?}",
        report.tasks,
        report.runs,
        report.children,
        report.opened,
        report.marks,
        report.stopped_and_undone,
        report.undone_after_processed,
        report.most_in_flight,
        report.max_concurrency,
        report.purged,
        report.took
    );
    assert!(report.violations.is_empty(), "{:#?}", report.violations);
    for story in &report.off_path {
        println!("off its variant's path: {story}");
    }
    // Each variant's path is the case's data's (disputed invoices, a refused filing), not the
    // seeded faults': every strict run stops and undoes, every returned run is undone.
    assert_eq!(
        report.stopped_and_undone, case.stopped,
        "strict runs that stopped and undid their elements"
    );
    assert_eq!(
        report.undone_after_processed,
        case.returned + case.chunked,
        "returned runs (chunked ones too) undone by their task after they ended Processed"
    );
    assert!(
        report.tasks.get("Processed").copied().unwrap_or(0) > 0,
        "no task went through: {:?}",
        report.tasks
    );
    assert!(
        report.most_in_flight > report.max_concurrency / 2,
        "at most {} elements in calls at once: the cap was never approached",
        report.most_in_flight
    );
}
