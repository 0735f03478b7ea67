//! What a run found ([`Report`]), per workflow and per service, and the guarantees it breaks
//! ([`Report::violations`]). The checks that fill it are in `checks/`; its tables in `table.rs`.

use std::collections::BTreeMap;
use std::time::Duration;

/// What one workflow's tasks came to.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct WorkflowCounts {
    pub submitted: usize,
    pub accepted: usize,
    /// Final state → tasks.
    pub states: BTreeMap<String, usize>,
    /// Failures that owe an alert (see `operator::alerts_owed`), and distinct `TaskFailed`
    /// alerts.
    pub failed: usize,
    pub alerted: usize,
    /// Effects the services applied for this workflow's tasks (steps and undos).
    pub effects: usize,
    /// Submission (the record's creation) to the first terminal state, per terminal task, in
    /// milliseconds, sorted.
    pub latencies_ms: Vec<i64>,
}

impl WorkflowCounts {
    /// The `p`-th percentile (nearest rank, `0 < p <= 1`) of the latencies.
    pub fn latency_ms(&self, p: f64) -> Option<i64> {
        let n = self.latencies_ms.len();
        let rank = ((p * n as f64).ceil() as usize).clamp(1, n.max(1));
        self.latencies_ms.get(rank - 1).copied()
    }
}

/// What one simulated service saw and did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ServiceCounts {
    pub calls: u64,
    pub transient: u64,
    pub in_progress: u64,
    pub misconfigured: u64,
    pub late_commits: u64,
    pub late_dropped: u64,
    /// Answers over the result limit or with a huge refusal message.
    pub oversized: u64,
    /// The most calls in the service at once, and in any one second.
    pub most_in_flight: u32,
    pub most_in_a_second: usize,
}

/// How the tasks that failed at one step failed, and how they ended.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct StepFailures {
    pub refused: usize,
    pub timed_out: usize,
    pub faulted: usize,
    /// Final state → tasks.
    pub ended: BTreeMap<String, usize>,
}

/// What the run found.
#[derive(Debug, Default)]
pub struct Report {
    pub submitted: usize,
    pub accepted: usize,
    /// Workflow name → its tasks' counts.
    pub workflows: BTreeMap<String, WorkflowCounts>,
    /// Final state → tasks.
    pub states: BTreeMap<String, usize>,
    /// Accepted tasks with no record, or not terminal when the run stopped progressing.
    pub lost: Vec<String>,
    /// Tasks not terminal at the end because their current step (or undo) is on a service
    /// taken down for the whole run (`--down`): they wait for it (deferred by its open circuit,
    /// or timed out and handed back), they are not lost.
    pub waiting: Vec<String>,
    /// Idempotency keys applied more than once.
    pub doubled: Vec<String>,
    /// Steps whose net effect is not what the task's final state says (1 per step of a
    /// Processed task; 0 per undoable step of a Compensated one; for a step without an undo,
    /// and for the steps of a task left in Error past its pivot, what the step's status says),
    /// undos applied for a task that owes no compensation, and effects under a key that no step
    /// of an accepted task has.
    pub wrong_net: Vec<String>,
    /// Tasks whose steps did not follow the path their input implies (a step off it ran, a
    /// step on it was skipped, the wrong case of a choice was taken), by the independent
    /// model of `checks/paths.rs`.
    pub off_path: Vec<String>,
    /// Step keys that took effect at their service after their undo had succeeded: effects
    /// nothing will reverse (the service kept no tombstone).
    pub leaked: Vec<String>,
    /// forEach steps whose elements were in calls at a service more at once than their
    /// `maxConcurrency`; and the most of one step's elements seen in calls at once.
    pub over_concurrency: Vec<String>,
    /// forEach elements whose calls did not carry the element they were made with: a key
    /// that came with two bodies, or an element whose calls (its step's and its undo's)
    /// named two items (`sku`).
    pub wrong_bodies: Vec<String>,
    /// forEach elements re-enqueued while they waited for room (a waiting element has no
    /// pickup deadline), and what each forEach case measured.
    pub waiting_requeued: Vec<String>,
    /// Services that got more calls at once, or in a second, than their limits allow.
    pub over_limits: Vec<String>,
    pub most_elements_in_flight: u32,
    /// Service → what it saw.
    pub services: BTreeMap<String, ServiceCounts>,
    /// Terminal records still locked.
    pub locked_terminal: Vec<String>,
    /// Records that break an invariant of the state record under their workflow's policies, or
    /// end in a state their workflow does not allow (Error before the pivot: automatic
    /// compensation is on).
    pub invalid: Vec<String>,
    /// Tasks that failed, and tasks with a `TaskFailed` alert.
    pub failed: usize,
    pub alerted: usize,
    /// Tasks whose distinct `TaskFailed` alerts (notice ids) are not one per failure.
    pub alert_mismatch: Vec<String>,
    /// `TaskFailed` deliveries (at least once: a notice may go out twice under one id).
    pub alert_deliveries: usize,
    /// Re-enqueues after a missed pickup deadline, the tasks that had any, and the most one
    /// task had.
    pub requeues: usize,
    pub requeued_tasks: usize,
    pub max_requeues: usize,
    /// The most re-enqueues in a row a task may have: enough to outlast the slow work queue's
    /// hold-back at growing delays (see [`requeue_limit`]).
    pub requeue_limit: usize,
    /// Tasks re-enqueued more often in a row than that, and the run if it re-enqueued more
    /// per task on average than growing delays need to outlast the stall (2 at least).
    pub over_requeued: Vec<String>,
    /// Applied writes reported to their writer as a lost race (after a lost response).
    pub misreported: Vec<String>,
    /// Messages over SQS's 256 KB and records over DynamoDB's 400 KB (refused, as AWS does).
    pub too_large: Vec<String>,
    /// (lost responses, throttles, slowed work messages, timed-out batches) injected.
    pub edges: (u64, u64, u64, u64),
    pub bus_refused: u64,
    pub overtaken: u64,
    /// (workflow, step index, step) → how the failed tasks failed there, and how they ended.
    pub failed_steps: BTreeMap<(String, usize, String), StepFailures>,
    /// Tasks that ended Processed, Compensated or CompensationFailed without that event on the
    /// bus, or with it while ending otherwise.
    pub notice_mismatch: Vec<String>,
    /// Callback steps that waited out a callback their service had already posted (the
    /// service calls back once, at the first URL it got).
    pub ignored_callbacks: Vec<String>,
    /// Named events the applicant delivered to the agreements: answer (`taken`, `kept`,
    /// `duplicate`, or the error's code) → deliveries.
    pub events: BTreeMap<String, usize>,
    /// Events taken twice, answers they may not get, ended tasks an event changed, waits
    /// ended with another task's event (`checks/events.rs`).
    pub event_violations: Vec<String>,
    /// Steps and waits done after their task's deadline.
    pub past_deadline: Vec<String>,
    /// Final tasks with payloads kept by reference, purged at the end of their retention.
    pub purged: usize,
    /// Of those, the ones whose items or objects outlived their retention.
    pub outlived: Vec<String>,
    /// Tasks failed by their deadline (`task_timeout`).
    pub deadline_failures: usize,
    /// Crash point → (reached, crashed).
    pub points: BTreeMap<String, (u64, u64)>,
    /// Crash points the run must reach but did not.
    pub unreached: Vec<String>,
    /// (sent, duplicated, delayed, deadline timers lost)
    pub messaging: (u64, u64, u64, u64),
    pub dead_letters: usize,
    /// The operator's actions: asked for, applied, refused (409), answered 5xx; and the
    /// applied ones by action.
    pub operator: (u64, usize, u64, u64),
    pub operator_actions: BTreeMap<String, usize>,
    pub elapsed: Duration,
    /// The longest a task took from its submission to its last write.
    pub slowest: Duration,
}

impl Report {
    /// Every broken guarantee, one line each; empty when the run is clean.
    pub fn violations(&self) -> Vec<String> {
        let mut v = Vec::new();
        let mut check = |bad: bool, what: String| {
            if bad {
                v.push(what);
            }
        };
        check(
            self.accepted != self.submitted,
            format!(
                "{} of {} submissions never accepted",
                self.submitted - self.accepted,
                self.submitted
            ),
        );
        // Lists that must be empty: what each holds, and its first few.
        let must_be_empty: [(&str, &Vec<String>); 20] = [
            ("lost", &self.lost),
            ("tasks off the path their input implies", &self.off_path),
            ("keys applied more than once", &self.doubled),
            ("wrong net effects", &self.wrong_net),
            ("steps committed after their undo (leaked)", &self.leaked),
            (
                "forEach elements in calls past maxConcurrency",
                &self.over_concurrency,
            ),
            ("services called past their limits", &self.over_limits),
            (
                "forEach elements called without the element they were made with",
                &self.wrong_bodies,
            ),
            (
                "forEach elements re-enqueued while waiting for room",
                &self.waiting_requeued,
            ),
            (
                "callbacks posted and then waited for",
                &self.ignored_callbacks,
            ),
            ("locked terminal records", &self.locked_terminal),
            ("invalid records", &self.invalid),
            ("alerts do not match failures", &self.alert_mismatch),
            ("tasks re-enqueued too often", &self.over_requeued),
            ("applied writes reported as lost races", &self.misreported),
            ("messages or records over AWS's limits", &self.too_large),
            ("events do not match final states", &self.notice_mismatch),
            ("named events mishandled", &self.event_violations),
            ("tasks gone on past their deadline", &self.past_deadline),
            ("tasks that outlived their retention", &self.outlived),
        ];
        for (what, list) in must_be_empty {
            check(!list.is_empty(), format!("{what}: {:?}", first(list)));
        }
        check(
            !self.unreached.is_empty(),
            format!("crash points never reached: {:?}", self.unreached),
        );
        let not_crashed: Vec<_> = self
            .points
            .iter()
            .filter(|(_, (reached, crashed))| *reached > 0 && *crashed == 0)
            .map(|(p, _)| p.clone())
            .collect();
        check(
            !not_crashed.is_empty(),
            format!("crash points reached but never crashed: {not_crashed:?}"),
        );
        v
    }
}

fn first(v: &[String]) -> &[String] {
    &v[..v.len().min(5)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_with_a_wrong_net_effect_is_a_violation() {
        let mut report = Report::default();
        assert!(report.violations().is_empty());
        report
            .wrong_net
            .push("t reserve-funds: nets 1, not [0]".into());
        let v = report.violations();
        assert_eq!(v.len(), 1);
        assert!(v[0].starts_with("wrong net effects"), "{v:?}");
        report.points.insert("put:claimed".into(), (3, 0));
        assert_eq!(report.violations().len(), 2);
    }

    #[test]
    fn latency_percentiles_are_nearest_rank_and_leaks_are_violations() {
        let w = WorkflowCounts {
            latencies_ms: (1..=100).collect(),
            ..WorkflowCounts::default()
        };
        assert_eq!(w.latency_ms(0.5), Some(50));
        assert_eq!(w.latency_ms(0.99), Some(99));
        assert_eq!(WorkflowCounts::default().latency_ms(0.5), None);
        let three = WorkflowCounts {
            latencies_ms: vec![10, 20, 30],
            ..WorkflowCounts::default()
        };
        assert_eq!(three.latency_ms(0.5), Some(20));
        assert_eq!(three.latency_ms(0.99), Some(30));
        let mut report = Report::default();
        report.workflows.insert("loan-application".into(), w);
        report
            .leaked
            .push("e-sign: t:send-contract:send-contract:0".into());
        let v = report.violations();
        assert!(v.iter().any(|v| v.contains("leaked")), "{v:?}");
        let t = report.table();
        assert!(
            t.contains("| loan-application | 100 | 0.05 s | 0.10 s | 0.10 s |"),
            "{t}"
        );
        assert!(
            t.contains("| steps committed after their undo (leaked) | 1 | 0 |"),
            "{t}"
        );
    }
}
