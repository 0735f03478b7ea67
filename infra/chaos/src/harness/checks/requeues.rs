//! Re-enqueues after a missed pickup deadline stay proportional to the tasks: none re-enqueued
//! more often in a row than growing delays need to outlast the slow work queue
//! ([`requeue_limit`]), nor the run more per task on average.

use crate::failpoints::Recorder;
use crate::harness::config::Config;
use crate::harness::report::Report;
use sas::Policy;
use std::time::Duration;

/// Counts the re-enqueues (of `accepted` tasks) and checks them against [`requeue_limit`].
pub(super) fn check_requeues(
    cfg: &Config,
    recorder: &Recorder,
    accepted: usize,
    report: &mut Report,
) {
    let requeues = recorder.requeues();
    report.requeues = requeues.values().map(|(n, _)| *n).sum();
    report.requeued_tasks = requeues.len();
    report.max_requeues = requeues
        .values()
        .map(|(_, longest)| *longest as usize)
        .max()
        .unwrap_or(0);
    report.requeue_limit = requeue_limit(&cfg.settings.policy, cfg.plan.slow_work_queue);
    for (task, (n, longest)) in &requeues {
        if *longest as usize > report.requeue_limit {
            report.over_requeued.push(format!(
                "{task}: re-enqueued {longest} times in a row ({n} in all)"
            ));
        }
    }
    // On average: 2 per task up to a stall that growing delays outlast in 2 (three pickup
    // timeouts); beyond, one more than they need (a task may wait through a stall twice: for
    // its first step and after a step handed back).
    let needed = report.requeue_limit - 2;
    let mean = if needed <= 2 { 2 } else { needed + 1 };
    if report.requeues > mean * accepted.max(1) {
        report.over_requeued.push(format!(
            "{} re-enqueues for {} tasks: more than {mean} per task",
            report.requeues, accepted
        ));
    }
}

/// The most re-enqueues in a row a task waiting behind a work queue that stalls for `stall`
/// may need if re-enqueues come at growing delays as documented (the first at once, the
/// `n`-th after at least `pickup × 2^(n-1)`; modelled here, not taken from the code under
/// test): the pickup deadlines that pass before the stall ends (and its
/// burst of a second), plus one for a work message lost outright (a crash after the write
/// that made the task Pending), plus one for a run's other delays (duplicates, throttles,
/// timed-out batches). At a fixed period it would be `stall / pickup` and more.
pub fn requeue_limit(p: &Policy, stall: Option<Duration>) -> usize {
    let pickup = p
        .pickup_timeout
        .to_std()
        .unwrap_or_default()
        .max(Duration::from_millis(1));
    let Some(stall) = stall else {
        return 3;
    };
    let end = stall + Duration::from_secs(1);
    let mut deadline = pickup;
    let mut n: u32 = 0;
    while deadline <= end && n < 64 {
        n += 1;
        let delay = if n <= 1 {
            Duration::ZERO
        } else {
            (pickup * 2u32.saturating_pow(n - 1).min(1 << 20)).min(Duration::from_secs(900))
        };
        deadline += delay + pickup;
    }
    n as usize + 2
}
