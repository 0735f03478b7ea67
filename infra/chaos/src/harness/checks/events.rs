//! The agreements' events and every task's deadline, against what `signing.rs` delivered:
//!
//! - an event is taken once: under one `Event-Id`, a task takes (or keeps) at most one delivery,
//!   and answers `duplicate` only to a repeat of one it took, or to a retry (two agreements
//!   share each id: an id is the task's, not global);
//! - the answer a task's wait ended with is one delivered to that task (its own applicant's
//!   name), and the task remembers each id once;
//! - an event for a task that ended is refused (`409 event_refused`) and changes nothing; one for
//!   a task that does not exist is `task_not_found`, one the workflow never waits for
//!   `event_not_expected`; every delivery is answered (no 5xx left after retries);
//! - no task goes on past its deadline: no wait of it ends done after it, and no step goes out
//!   after it (at most the one out then ends done, late).
//!
//! It also counts the answers and the tasks failed by their deadline, and names what a run of
//! enough agreements must have exercised (an early event kept, a duplicate, a refusal, a
//! deadline).

use super::Ending;
use crate::harness::report::Report;
use crate::harness::signing::{Sent, signer};
use sas::{StateRecord, StepState, StepStatus, TaskId, Workflow};
use serde_json::Value;
use std::collections::{BTreeSet, HashMap, HashSet};

/// The fewest agreements a run needs for [`check_events`] to require every kind of delivery.
const ENOUGH: usize = 24;

pub(super) fn check_events(end: &Ending, report: &mut Report) {
    let bad = &mut report.event_violations;
    let mut taken: HashMap<(TaskId, &str), Vec<&Sent>> = HashMap::new();
    for s in &end.sent {
        *report.events.entry(s.answer.clone()).or_default() += 1;
        if matches!(s.answer.as_str(), "taken" | "kept") {
            taken.entry((s.task, &s.event_id)).or_default().push(s);
        }
    }
    for ((task, id), got) in &taken {
        if got.len() > 1 {
            bad.push(format!("{task}: event id {id} taken {} times", got.len()));
        }
    }
    // A retried delivery answered `duplicate` may have been taken by its first try (whose
    // answer was lost): a later repeat meets it. So may a first try on a task one of whose
    // writes was overtaken before its SDK retry (`Chaos::retried`): the delivery's write
    // landed, its answer was lost, a rival's write came between, and the delivery, reading
    // the task again, met its own event as another's.
    let overtaken = end
        .left
        .chaos
        .recorder
        .overtaken_tasks
        .lock()
        .map(|t| t.clone())
        .unwrap_or_default();
    let mut taken_maybe: HashSet<(TaskId, &str)> = taken.keys().copied().collect();
    taken_maybe.extend(
        end.sent
            .iter()
            .filter(|s| s.answer == "duplicate" && (s.tries > 1 || overtaken.contains(&s.task)))
            .map(|s| (s.task, s.event_id.as_str())),
    );
    for s in &end.sent {
        let what = format!("{} {} ({}) to {}", s.name, s.event_id, s.answer, s.task);
        match (s.answer.as_str(), &s.after_end) {
            // A retry (its first try's answer lost: a crash answers 503) may meet its own
            // first try, taken.
            ("duplicate", None)
                if s.tries == 1 && !taken_maybe.contains(&(s.task, s.event_id.as_str())) =>
            {
                let all: Vec<String> = end
                    .sent
                    .iter()
                    .filter(|o| o.task == s.task)
                    .map(|o| format!("{} {} {} x{}", o.name, o.event_id, o.answer, o.tries))
                    .collect();
                bad.push(format!(
                    "{what}: a duplicate of nothing this task took: {all:?}"
                ));
            }
            (_, Some((before, after))) => {
                if s.answer != "event_refused" {
                    bad.push(format!(
                        "{what}: the task had ended ({})",
                        before.process_state
                    ));
                }
                let same = after
                    .as_ref()
                    .is_some_and(|a| a.version == before.version && a.inbox == before.inbox);
                if !same {
                    bad.push(format!("{what}: the ended task's record changed"));
                }
            }
            ("taken" | "kept" | "duplicate" | "event_refused", None) => {}
            ("task_not_found", None) if !end.ids.contains_key(&s.task) => {}
            ("event_not_expected", None) if s.name == "cancelled" => {}
            _ => bad.push(format!("{what}: not an answer it may get")),
        }
    }
    for (id, r) in end
        .finals
        .iter()
        .filter_map(|(id, r)| Some((id, r.as_ref()?)))
    {
        if end.ids.get(id) != Some(&"agreement") {
            continue;
        }
        let seen: BTreeSet<&String> = r.inbox.seen.iter().collect();
        if seen.len() != r.inbox.seen.len() {
            bad.push(format!(
                "{id}: an event id remembered twice: {:?}",
                r.inbox.seen
            ));
        }
        let Some(i) = end.indexes.get(id) else {
            continue;
        };
        let answer = r.steps.iter().find(|s| s.name == "answer");
        let result = answer
            .filter(|s| s.status == StepStatus::Done)
            .and_then(|s| s.result.as_deref())
            .and_then(|t| serde_json::from_str::<Value>(t).ok());
        if let Some(result) = result.filter(|v| v.get("event").is_some()) {
            let from_here = end.sent.iter().any(|s| {
                s.task == *id
                    && matches!(s.answer.as_str(), "taken" | "kept" | "duplicate")
                    && result["event"] == s.name.as_str()
                    && result["payload"]["by"] == s.by.as_str()
            });
            if result["payload"]["by"] != signer(*i).as_str() || !from_here {
                bad.push(format!(
                    "{id}: its wait ended with {result}, not an event it took"
                ));
            }
        }
    }
    let agreements = end.ids.values().filter(|w| **w == "agreement").count();
    if agreements >= ENOUGH {
        for kind in ["kept", "duplicate", "event_refused", "task_not_found"] {
            if report.events.get(kind).is_none_or(|n| *n == 0) {
                bad.push(format!(
                    "no delivery answered {kind} in {agreements} agreements"
                ));
            }
        }
        if report.deadline_failures == 0 {
            bad.push(format!(
                "no task failed by its deadline in {agreements} agreements"
            ));
        }
    }
}

/// Whether the task's deadline failed it (`task_timeout`).
pub(super) fn failed_by_deadline(r: &StateRecord) -> bool {
    r.history
        .iter()
        .any(|h| h.reason.starts_with("task_timeout"))
        || r.last_error
            .as_deref()
            .is_some_and(|e| e.starts_with("task_timeout"))
}

/// The task did not go on past its deadline: no wait (for a time or an event) of it ended done
/// after it, and on its own line (no group) at most one step did (the one out when the deadline
/// passed: its service's answer came late; nothing goes out after it). Counts the tasks its
/// deadline failed. (Before [`check_events`], which requires some.)
pub(super) fn check_deadline(
    id: &TaskId,
    r: &StateRecord,
    workflow: &Workflow,
    report: &mut Report,
) {
    if failed_by_deadline(r) {
        report.deadline_failures += 1;
    }
    let Some(deadline) = r.deadline else {
        return;
    };
    let late =
        |s: &StepState| s.status == StepStatus::Done && s.finished_at.is_some_and(|f| f > deadline);
    let mut steps_done_late = Vec::new();
    for (step, s) in workflow.steps.iter().zip(&r.steps) {
        if step.wait.is_some() && late(s) {
            report.past_deadline.push(format!(
                "{id}: the wait {} ended at {:?}, past the task's deadline {deadline}",
                s.name, s.finished_at
            ));
        } else if late(s) || s.elements.iter().any(late) {
            steps_done_late.push(s.name.as_str());
        }
    }
    let one_line = r.fanout.is_none() && r.steps.iter().all(|s| s.elements.is_empty());
    if one_line && steps_done_late.len() > 1 {
        report.past_deadline.push(format!(
            "{id}: {steps_done_late:?} done past the task's deadline {deadline}: one went out after it"
        ));
    }
}
