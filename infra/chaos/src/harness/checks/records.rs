//! Each accepted task's record as the run ended, in task order: counted (final states,
//! latencies, the failed steps), and checked: it exists and is terminal (or waits for a service
//! down for the whole run), its workflow is the one it was submitted to, a terminal record is
//! unlocked, it keeps the state record's invariants, it is not in Error before its pivot, its
//! callbacks were not waited out, and its steps net what its final state says.

use super::Ending;
use super::callbacks::ignored_callbacks;
use super::effects::{Effects, check_net_effects};
use crate::harness::config::Config;
use crate::harness::report::Report;
use sas::remote::PostedCallback;
use sas::{ProcessState, StateRecord, StepStatus, TaskId, Workflow};
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

/// What the records came to, for the checks after them.
pub(super) struct Outcomes {
    /// The keys of every step and undo of an accepted task.
    pub known_keys: BTreeSet<String>,
    /// Tasks that failed (owing an alert): not refusals before the pivot.
    pub failed: BTreeSet<String>,
    /// Final state → the tasks that ended there.
    pub ended: HashMap<ProcessState, BTreeSet<String>>,
}

/// Counts and checks every record (see the module's doc).
pub(super) async fn check_records(
    cfg: &Config,
    end: &Ending,
    effects: &Effects,
    report: &mut Report,
) -> Outcomes {
    // Each key's callback as posted: when, and whether sas took it (202) or called it stale.
    let posted: HashMap<String, PostedCallback> = end
        .left
        .callbacks
        .lock()
        .map(|log| log.iter().map(|c| (c.key.clone(), c.clone())).collect())
        .unwrap_or_default();
    let mut workflows: HashMap<(String, u32), Arc<Workflow>> = HashMap::new();
    let mut out = Outcomes {
        known_keys: BTreeSet::new(),
        failed: BTreeSet::new(),
        ended: HashMap::new(),
    };
    let mut sorted: Vec<_> = end.finals.iter().collect();
    sorted.sort_by_key(|(id, _)| **id);
    for (id, r) in sorted {
        let name = end.ids.get(id).copied().unwrap_or("?");
        let Some(r) = r else {
            report.lost.push(format!("{id} ({name}): no record"));
            continue;
        };
        let version = (r.workflow.clone(), r.workflow_version);
        let workflow = match workflows.get(&version) {
            Some(w) => w.clone(),
            None => match end
                .left
                .definitions
                .workflow(&r.workflow, r.workflow_version)
                .await
            {
                Ok(Some(w)) => {
                    workflows.insert(version, w.clone());
                    w
                }
                other => {
                    report.invalid.push(format!(
                        "{id}: its workflow {} v{} cannot be read: {:?}",
                        r.workflow,
                        r.workflow_version,
                        other.err()
                    ));
                    continue;
                }
            },
        };
        if r.workflow != name {
            report.invalid.push(format!(
                "{id}: submitted to {name}, its record runs {}",
                r.workflow
            ));
        }
        count_final_state(id, r, &mut out, report);
        check_settled(cfg, id, name, r, &workflow, report);
        check_unlocked(id, r, report);
        report
            .ignored_callbacks
            .extend(ignored_callbacks(r, &workflow, &posted));
        check_invariants(id, name, r, &workflow, report);
        check_not_in_error_before_pivot(cfg, id, name, r, report);
        note_failure(id, r, &mut out, report);
        super::events::check_deadline(id, r, &workflow, report);
        let by_hand = end.operator.applied_to(id);
        check_net_effects(
            id,
            name,
            r,
            &workflow,
            effects,
            by_hand,
            &mut out.known_keys,
            report,
        );
    }
    out
}

/// The record's final state (per workflow and in all), how long it took, and its latency from
/// submission to its first terminal state.
fn count_final_state(id: &TaskId, r: &StateRecord, out: &mut Outcomes, report: &mut Report) {
    let counts = report.workflows.entry(r.workflow.clone()).or_default();
    *counts
        .states
        .entry(r.process_state.to_string())
        .or_default() += 1;
    *report
        .states
        .entry(r.process_state.to_string())
        .or_default() += 1;
    report.slowest = report
        .slowest
        .max((r.updated_at - r.created_at).to_std().unwrap_or_default());
    out.ended
        .entry(r.process_state)
        .or_default()
        .insert(id.to_string());
    if let Some(at) = r.history.iter().find(|h| h.to.is_terminal()).map(|h| h.at) {
        counts
            .latencies_ms
            .push((at - r.created_at).num_milliseconds());
    }
}

/// Not lost: the task is terminal, or its current step (or undo) is on a service down for the
/// whole run (it can only wait: it defers, or times out and is handed back, again and again).
fn check_settled(
    cfg: &Config,
    id: &TaskId,
    name: &str,
    r: &StateRecord,
    workflow: &Workflow,
    report: &mut Report,
) {
    let terminal = r.process_state.is_terminal();
    let on_down = workflow
        .step(r.step_index)
        .is_some_and(|s| cfg.down.contains(&s.service));
    if !terminal && on_down {
        report
            .waiting
            .push(format!("{id} ({name}): {}", r.process_state));
    } else if !terminal {
        report
            .lost
            .push(format!("{id} ({name}): still {}", r.process_state));
    }
}

/// A terminal record holds no lock.
fn check_unlocked(id: &TaskId, r: &StateRecord, report: &mut Report) {
    if r.process_state.is_terminal() && r.locked_by.is_some() {
        report.locked_terminal.push(id.to_string());
    }
}

/// The record keeps the state record's invariants under its workflow's policies.
fn check_invariants(
    id: &TaskId,
    name: &str,
    r: &StateRecord,
    workflow: &Workflow,
    report: &mut Report,
) {
    if let Err(e) = r.check(&workflow.policies()) {
        let statuses: Vec<String> = r
            .steps
            .iter()
            .map(|s| {
                format!(
                    "{}={}{}",
                    s.name,
                    s.status,
                    s.undo.map(|u| format!("/undo {u}")).unwrap_or_default()
                )
            })
            .collect();
        report.invalid.push(format!(
            "{id} ({name}, {} at step {}): {e} [{}]",
            r.process_state,
            r.step_index,
            statuses.join(", ")
        ));
    }
}

/// With automatic compensation on, a task is in Error only past its pivot. (A step its service
/// answered as misconfigured too often stops in Error whatever the policy: no business
/// failure, for an operator to mend.)
fn check_not_in_error_before_pivot(
    cfg: &Config,
    id: &TaskId,
    name: &str,
    r: &StateRecord,
    report: &mut Report,
) {
    let misconfigured = r
        .steps
        .get(r.step_index)
        .is_some_and(|s| s.misconfigured > 0 && s.status == StepStatus::Pending);
    if cfg.settings.policy.auto_compensate
        && r.process_state == ProcessState::Error
        && !r.past_pivot()
        && !misconfigured
    {
        report.invalid.push(format!(
            "{id} ({name}): in Error before its pivot (automatic compensation is on)"
        ));
    }
}

/// The first step that failed (refused, timed out or faulted): counted per step with how the
/// task ended; the task owes an alert unless it was a refusal (a business outcome) before the
/// pivot. The record keeps a refusal only when it was the first failure (in a parallel group,
/// a branch's step may time out after a sibling's refusal stopped the group): then the
/// refused step is the one counted, whatever failed at a lower index.
fn note_failure(id: &TaskId, r: &StateRecord, out: &mut Outcomes, report: &mut Report) {
    let failed = |s: &sas::StepState| {
        matches!(
            s.status,
            StepStatus::Failed | StepStatus::TimedOut | StepStatus::Faulted
        )
    };
    let refused = r.refusal.as_ref().and_then(|f| {
        r.steps
            .iter()
            .enumerate()
            .find(|(_, s)| s.name == f.step && s.status == StepStatus::Failed)
    });
    // A task its deadline failed while it waited has no failed step: the step it was at.
    let by_deadline = || {
        super::events::failed_by_deadline(r)
            .then(|| r.steps.get(r.step_index).map(|s| (r.step_index, s)))
            .flatten()
    };
    let first = refused
        .or_else(|| r.steps.iter().enumerate().find(|(_, s)| failed(s)))
        .or_else(by_deadline);
    if let Some((i, s)) = first {
        // A refusal is a business outcome: no TaskFailed alert, unless it came past the
        // pivot (the task then waits in Error for a person).
        let refusal = refused.is_some() && r.process_state != ProcessState::Error;
        if !refusal {
            out.failed.insert(id.to_string());
        }
        let by = report
            .failed_steps
            .entry((r.workflow.clone(), i, s.name.clone()))
            .or_default();
        match s.status {
            StepStatus::Failed => by.refused += 1,
            StepStatus::TimedOut | StepStatus::Waiting | StepStatus::Pending => by.timed_out += 1,
            _ => by.faulted += 1,
        }
        *by.ended.entry(r.process_state.to_string()).or_default() += 1;
    }
}
