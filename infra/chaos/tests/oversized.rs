//! Services whose answers are oversized, in memory: 5% of step keys get an answer of
//! megabytes, half of them a refusal with a huge message (no effect), half a success with a
//! huge result (the effect took place). The chaos queue and store refuse, as SQS and DynamoDB
//! do, a message over 256 KB and a record over 400 KB, so an answer kept uncapped shows up as
//! a violation. Every refusal must end its task Refused (with a capped message) and every
//! huge success must fault its step (`result_too_large`) and compensate the task, with the
//! usual guarantees (nothing lost, nothing done twice, one alert per failure).

use sas_chaos::{Config, run_in_memory};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn oversized_answers_are_refused_or_faulted_within_aws_limits() {
    let tasks = 300;
    let mut cfg = Config::new(tasks, 13);
    cfg.oversized(0.05);
    cfg.patience = Duration::from_secs(60);
    let report = run_in_memory(&cfg).await.expect("the run completes");
    println!("{}", report.table());
    let violations = report.violations();
    assert!(violations.is_empty(), "{violations:#?}\n{}", report.table());
    let oversized: u64 = report.services.values().map(|s| s.oversized).sum();
    assert!(oversized > 0, "no oversized answer\n{}", report.table());
    let faulted: usize = report.failed_steps.values().map(|f| f.faulted).sum();
    assert!(faulted > 0, "no result too large\n{}", report.table());
    assert!(
        report.states.get("Refused").copied().unwrap_or(0) > 0,
        "no refusal\n{}",
        report.table()
    );
    for name in sas_chaos::WORKFLOWS {
        assert_eq!(
            report.workflows[name].accepted,
            tasks / sas_chaos::WORKFLOWS.len(),
            "{name}\n{}",
            report.table()
        );
    }
}
