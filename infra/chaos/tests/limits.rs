//! A service's limits under every rough edge of AWS, in memory: `payment` takes 5 calls at once
//! and 20 a second (burst 5); every submission at once, crashes, duplicates, throttles and lost
//! answers around every write (`--every-switch`). The service's own count of calls at once and
//! in any second keeps the limits; every task of a workflow without a deadline of its own ends
//! Processed; nothing lost or done twice. The 1,000-task run is
//! `sas-chaos --tasks 1000 --every-switch --limit payment` (docs/guarantees.md).

use sas_chaos::{Config, ServiceLimit, run_in_memory};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_limited_service_gets_no_more_than_its_limits_and_every_task_ends() {
    let mut cfg = Config::new(240, 11);
    cfg.every_switch();
    let limit = ServiceLimit {
        service: "payment",
        concurrency: 5,
        per_second: 20,
        burst: 5,
    };
    cfg.limit(limit);
    let report = run_in_memory(&cfg).await.expect("the run completes");
    println!("{}", report.table());
    let violations = report.violations();
    assert!(violations.is_empty(), "{violations:#?}\n{}", report.table());
    let payment = &report.services["payment"];
    println!(
        "payment: {} calls, at most {} at once, {} in a second",
        payment.calls, payment.most_in_flight, payment.most_in_a_second
    );
    // The limits were reached (else the run proves nothing) and kept.
    assert!(payment.most_in_flight <= 5, "{payment:?}");
    assert!(payment.most_in_a_second <= 25, "{payment:?}");
    assert!(
        payment.most_in_a_second >= 15,
        "the burst reached the rate: {payment:?}"
    );
    // The workflows without a time limit of their own end Processed, however late; a loan's
    // and an agreement's deadlines are the business's (the burst makes some miss them, as in
    // the overload run).
    for (name, w) in &report.workflows {
        if !["agreement", "loan-application"].contains(&name.as_str()) {
            assert_eq!(
                w.states.get("Processed").copied(),
                Some(w.accepted),
                "every {name} Processed\n{}",
                report.table()
            );
        }
    }
}
