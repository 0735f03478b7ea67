//! The notices on the bus match the records: every notice published is one a record owed
//! (same id) and every owed one went out; and a task ended Processed, Compensated,
//! CompensationFailed, Refused or Resolved exactly when that event is on the bus.

use crate::failpoints::Recorder;
use crate::harness::report::Report;
use crate::operator::Applied;
use sas::{NoticeKind, ProcessState, StateRecord, TaskId};
use std::collections::{BTreeSet, HashMap};

/// Every notice on the bus is one a record owed (same id), and every owed one went out.
pub(super) fn check_notices_owed_and_published(
    recorder: &Recorder,
    finals: &HashMap<TaskId, Option<StateRecord>>,
    report: &mut Report,
) {
    // Every notice on the bus is one a record owed (same id), and every owed one went out.
    for status in [
        NoticeKind::Processed,
        NoticeKind::Failed,
        NoticeKind::Compensated,
        NoticeKind::CompensationFailed,
        NoticeKind::Refused,
        NoticeKind::Resolved,
    ] {
        let published = recorder.notices(status.detail_type());
        let owed = recorder.owed(status.as_str());
        let tasks: BTreeSet<&String> = published.keys().chain(owed.keys()).collect();
        for task in tasks {
            let got: BTreeSet<&String> = published
                .get(task)
                .map(|m| m.keys().collect())
                .unwrap_or_default();
            let want: BTreeSet<&String> = owed
                .get(task)
                .map(|s| s.iter().collect())
                .unwrap_or_default();
            for id in got.symmetric_difference(&want) {
                // The record as the run ended, to tell a notice still owed (and why the sweep
                // left it) from one cleared without its delivery.
                let record = task
                    .parse::<TaskId>()
                    .ok()
                    .and_then(|t| finals.get(&t).cloned().flatten())
                    .map(|r| {
                        format!(
                            "{} v{}, outbox {:?}, due key {:?}, updated {}, last: {:?}",
                            r.process_state,
                            r.version,
                            r.owed(),
                            r.due_key,
                            r.updated_at,
                            r.history.last().map(|h| h.reason.clone())
                        )
                    });
                report.notice_mismatch.push(format!(
                    "{id}: published {}, owed by a record {}; the record at the end: {record:?}",
                    got.contains(id),
                    want.contains(id)
                ));
            }
        }
    }
}

/// A task ended in a state exactly when that state's event is on the bus (a task an operator
/// acted on may have had the event and ended otherwise).
pub(super) fn check_events_match_final_states(
    recorder: &Recorder,
    ended: &HashMap<ProcessState, BTreeSet<String>>,
    applied: &HashMap<TaskId, Vec<Applied>>,
    report: &mut Report,
) {
    for (state, event) in [
        (ProcessState::Processed, "TaskProcessed"),
        (ProcessState::Compensated, "TaskCompensated"),
        (ProcessState::CompensationFailed, "TaskCompensationFailed"),
        (ProcessState::Refused, "TaskRefused"),
        (ProcessState::Resolved, "TaskResolved"),
    ] {
        let published = recorder.published(event);
        let empty = BTreeSet::new();
        let in_state = ended.get(&state).unwrap_or(&empty);
        for id in in_state.symmetric_difference(&published) {
            // A task an operator acted on may have had this event and ended otherwise (a
            // compensation that failed, retried to Compensated); the notice ids above still
            // match each event to the record that owed it.
            let touched = id.parse::<TaskId>().is_ok_and(|t| applied.contains_key(&t));
            if touched && !in_state.contains(id) {
                continue;
            }
            report.notice_mismatch.push(format!(
                "{id}: ended {state}; {event} on the bus: {}",
                published.contains(id)
            ));
        }
    }
}
