//! The end-of-run checks, the harness's value: what the run left (the records, the services'
//! books, what the recorder saw on the queues and the bus, what the operator did) checked
//! against what must hold (`docs/guarantees.md`). `check` runs them in order; each is a named
//! function in `checks/`:
//!
//! - `effects.rs`: `effects::tally_services` (keys applied twice, steps leaked after their
//!   undo), `effects::check_net_effects` (each step's net effect against the task's final
//!   state), `effects::check_no_stray_keys`;
//! - `records.rs`: `records::check_records`, each record: `records::check_settled` (not
//!   lost), `records::check_unlocked`, `records::check_invariants`,
//!   `records::check_not_in_error_before_pivot`, and the failures it counts;
//! - `callbacks.rs`: `callbacks::ignored_callbacks` (a callback posted, then waited out);
//! - `alerts.rs`: `alerts::check_one_alert_per_failure`;
//! - `notices.rs`: `notices::check_notices_owed_and_published`,
//!   `notices::check_events_match_final_states`;
//! - `requeues.rs`: `requeues::check_requeues` against `requeues::requeue_limit`;
//! - `paths.rs`: `paths::check_paths` (each order triage's steps against the path its input
//!   implies);
//! - `events.rs`: `events::check_deadline` (per record, from `records.rs`: nothing went on past
//!   the task's deadline),
//!   `events::check_events` (each agreement's named events: taken once, refused after the end);
//! - `crash_points.rs`: `crash_points::check_reached` (`crash_points::REQUIRED_POINTS`).
//!
//! One check runs before the world is shut down, as it moves the clock:
//! `World::end_retention` (no final task with payloads keeps its items or objects past its
//! retention; `Report::outlived`).

mod alerts;
mod callbacks;
pub(super) mod crash_points;
pub(super) mod effects;
mod events;
mod notices;
mod paths;
mod records;
pub(super) mod requeues;

use super::config::Config;
use super::load::workflow_of;
use super::operating::OperatorTally;
use super::report::Report;
use super::world::Leftovers;
use sas::{StateRecord, TaskId};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// What a run left to check.
pub(super) struct Ending {
    /// The accepted tasks and their workflows.
    pub ids: HashMap<TaskId, &'static str>,
    /// The accepted tasks' submission indexes (which gave their inputs).
    pub indexes: HashMap<TaskId, usize>,
    /// Each accepted task's record as read last (`None`: no record).
    pub finals: HashMap<TaskId, Option<StateRecord>>,
    pub elapsed: Duration,
    pub operator: OperatorTally,
    /// Every named event the applicant delivered, with its answer.
    pub sent: Vec<super::signing::Sent>,
    pub left: Leftovers,
}

/// Every end-of-run check, in order, into the report.
pub(super) async fn check(cfg: &Config, end: Ending) -> Report {
    let recorder = &end.left.chaos.recorder;
    let mut report = Report {
        submitted: cfg.tasks,
        accepted: end.ids.len(),
        elapsed: end.elapsed,
        points: recorder.points(),
        messaging: recorder.messaging(),
        dead_letters: end.left.dead_letters,
        operator: end.operator.counts,
        operator_actions: end.operator.actions.clone(),
        ..Report::default()
    };
    count_submissions(cfg, &end.ids, &mut report);
    let effects = effects::tally_services(&end.left.services, &mut report).await;
    check_limits(cfg, &mut report);
    let outcomes = records::check_records(cfg, &end, &effects, &mut report).await;
    effects::check_no_stray_keys(&effects, &outcomes.known_keys, &mut report);
    paths::check_paths(&end, &mut report);
    events::check_events(&end, &mut report);
    let alerts = recorder.notices("TaskFailed");
    alerts::count_alerts(&alerts, &end.ids, &mut report);
    let failures = alerts::check_one_alert_per_failure(&alerts, &end, &outcomes, &mut report);
    notices::check_notices_owed_and_published(recorder, &end.finals, &mut report);
    requeues::check_requeues(cfg, recorder, end.ids.len(), &mut report);
    take_recorded_edges(recorder, &mut report);
    for w in report.workflows.values_mut() {
        w.latencies_ms.sort_unstable();
    }
    report.failed = failures;
    notices::check_events_match_final_states(
        recorder,
        &outcomes.ended,
        &end.operator.applied,
        &mut report,
    );
    crash_points::check_reached(&mut report);
    report
}

/// Tasks submitted and accepted, per workflow.
/// Each limited service kept its limits, as it measured them: at most `concurrency` calls at
/// once, at most `per_second + burst` in any one second.
fn check_limits(cfg: &Config, report: &mut Report) {
    for l in &cfg.limits {
        let Some(s) = report.services.get(l.service) else {
            report
                .over_limits
                .push(format!("{}: never called", l.service));
            continue;
        };
        if s.most_in_flight > l.concurrency {
            report.over_limits.push(format!(
                "{}: {} calls at once, limit {}",
                l.service, s.most_in_flight, l.concurrency
            ));
        }
        let most = (l.per_second + l.burst) as usize;
        if s.most_in_a_second > most {
            report.over_limits.push(format!(
                "{}: {} calls in one second, limit {}/s burst {}",
                l.service, s.most_in_a_second, l.per_second, l.burst
            ));
        }
    }
}

fn count_submissions(cfg: &Config, ids: &HashMap<TaskId, &'static str>, report: &mut Report) {
    for i in 0..cfg.tasks {
        report
            .workflows
            .entry(workflow_of(i).to_owned())
            .or_default()
            .submitted += 1;
    }
    for name in ids.values() {
        report
            .workflows
            .entry((*name).to_owned())
            .or_default()
            .accepted += 1;
    }
}

/// What the failpoints recorded of AWS's rough edges: applied writes reported as lost races
/// (checked: none), messages and records over AWS's limits (checked: none), and the edges
/// injected (counted).
fn take_recorded_edges(recorder: &crate::failpoints::Recorder, report: &mut Report) {
    report.misreported = recorder
        .misreported
        .lock()
        .map(|m| m.clone())
        .unwrap_or_default();
    report.too_large = recorder
        .too_large
        .lock()
        .map(|m| m.clone())
        .unwrap_or_default();
    report.edges = recorder.edges();
    report.bus_refused = recorder.bus_refused.load(Ordering::Relaxed);
    report.overtaken = recorder.overtaken.load(Ordering::Relaxed);
}
