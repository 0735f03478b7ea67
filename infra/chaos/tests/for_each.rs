//! The forEach cases (docs/guarantees.md), in memory under the run's faults and failpoints:
//! restocks retried by the operator on new inputs, then compensated (every element's calls
//! carry the item it was made with), and long lists at one element at once with a pickup
//! timeout far shorter than they take (no waiting element re-enqueued; each list takes about
//! its calls' time).

use sas_chaos::{Config, ForEachCases, run_for_each_cases};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn for_each_elements_keep_their_items_and_wait_for_room_without_a_deadline() {
    let mut cfg = Config::new(0, 23);
    // Short pickup deadlines: a list of 30 takes several of them.
    cfg.settings.policy.pickup_timeout = chrono::Duration::milliseconds(500);
    // The crash points' first occurrences still crash (during the restocks); no random crash
    // afterwards, whose recovery (a step's deadline) the lists' timing would measure.
    cfg.plan.crash_rate = 0.0;
    cfg.patience = Duration::from_secs(30);
    let cases = ForEachCases {
        restocks: 24,
        stocktakes: 3,
        lots: 30,
        latency: Duration::from_millis(50),
    };
    let report = run_for_each_cases(&cfg, cases)
        .await
        .expect("the cases run");
    println!(
        "retries on a new input applied: {} of {}; stocktakes of {} lots took {:?} (their calls: {:?})",
        report.retried, cases.restocks, cases.lots, report.took, report.floor
    );
    assert!(report.violations.is_empty(), "{:#?}", report.violations);
}
