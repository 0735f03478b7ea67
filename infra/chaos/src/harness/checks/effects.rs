//! The services' books: what each simulated service applied, per idempotency key. Checked: no
//! key applied twice, no step committed after its undo (leaked), each step's net effect what
//! its task's final state says, and no effect under a key no step of an accepted task has.

use crate::harness::report::{Report, ServiceCounts};
use crate::operator::Applied;
use sas::messages::idempotency_key;
use sas::{ProcessState, StateRecord, StepState, StepStatus, TaskId, Workflow};
use sas_local::Simulated;
use std::collections::{BTreeSet, HashMap};

/// What the services applied.
pub(in crate::harness) struct Effects {
    /// Idempotency key → times applied (steps and undos).
    pub applied: HashMap<String, u32>,
    /// Step key → its net effect (applied minus undone).
    pub net: HashMap<String, i32>,
    /// A forEach step's `{task}:{step}` → the most of its elements in calls at once.
    pub elements_in_flight: HashMap<String, u32>,
}

/// Lets every service settle its late commits, then counts what each saw and applied; keys
/// applied more than once are `doubled`, steps committed after their undo `leaked`.
pub(in crate::harness) async fn tally_services(
    services: &Simulated,
    report: &mut Report,
) -> Effects {
    let mut effects: HashMap<String, u32> = HashMap::new();
    let mut net: HashMap<String, i32> = HashMap::new();
    let mut elements_in_flight: HashMap<String, u32> = HashMap::new();
    for (name, sim) in services.all() {
        // Late commits still pending land (or are dropped) before anything is counted.
        sim.settle().await;
        let stats = sim.stats();
        let most_in_a_second = stats.most_calls_in_any_second();
        effects.extend(stats.effects);
        net.extend(stats.net);
        for (group, most) in stats.most_elements_in_flight {
            let m = elements_in_flight.entry(group).or_default();
            *m = (*m).max(most);
        }
        report
            .leaked
            .extend(stats.leaked.iter().map(|k| format!("{name}: {k}")));
        report.wrong_bodies.extend(
            stats
                .rebodied
                .iter()
                .map(|k| format!("{name}: {k} came with two bodies")),
        );
        check_element_items(&name, &stats.requests, report);
        report.services.insert(
            name,
            ServiceCounts {
                calls: stats.calls,
                transient: stats.transient_faults,
                in_progress: stats.in_progress_faults,
                misconfigured: stats.misconfigured_faults,
                late_commits: stats.late_commits,
                late_dropped: stats.late_dropped,
                oversized: stats.oversized,
                most_in_flight: stats.most_calls_in_flight,
                most_in_a_second,
            },
        );
    }
    for (key, n) in &effects {
        if *n > 1 {
            report.doubled.push(format!("{key} applied {n} times"));
        }
    }
    report.most_elements_in_flight = elements_in_flight.values().copied().max().unwrap_or(0);
    Effects {
        applied: effects,
        net,
        elements_in_flight,
    }
}

/// Every applied call of one forEach element (`{task}:{step}#{k}`: its step's, under any
/// generation, and its undo's) names the same item (`sku`, where a body has one): an element
/// runs, is retried and is undone with the element it was made with, whatever input an
/// operator's retry gave its task later.
fn check_element_items(service: &str, requests: &[sas::remote::Applied], report: &mut Report) {
    let mut items: HashMap<&str, &serde_json::Value> = HashMap::new();
    for a in requests {
        // `{task}:{step}#{k}:{action}` (`:g{generation}` after a first one)
        let mut parts = a.key.splitn(3, ':');
        let (Some(task), Some(unit), Some(_)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let element = &a.key[..task.len() + 1 + unit.len()];
        let Some(sku) = a.input.get("sku").filter(|_| unit.contains('#')) else {
            continue;
        };
        match items.get(element) {
            Some(first) if *first != sku => report.wrong_bodies.push(format!(
                "{service}: {element} {} with sku {sku}, its first call with {first}",
                a.action
            )),
            Some(_) => {}
            None => {
                items.insert(element, sku);
            }
        }
    }
}

/// Task `id`'s steps (record `r`, of `workflow`, submitted as `name`): counts their effects for
/// the workflow, notes their keys and their undos' in `known_keys`, and checks each step's net
/// effect ([`wanted_net`]; a step the operator skipped nets what it had when skipped, the steps
/// a compensation from an earlier step settled by hand are not checked) and that a task that
/// owes no compensation had nothing undone.
#[allow(clippy::too_many_arguments)]
pub(in crate::harness) fn check_net_effects(
    id: &TaskId,
    name: &str,
    r: &StateRecord,
    workflow: &Workflow,
    effects: &Effects,
    by_hand: &[Applied],
    known_keys: &mut BTreeSet<String>,
    report: &mut Report,
) {
    let workflow_name = name;
    let counts = report.workflows.entry(r.workflow.clone()).or_default();
    // The keys of the task's steps and undos, and the net effect each step must have.
    let owes_no_undo = matches!(
        r.process_state,
        ProcessState::Processed | ProcessState::Error
    );
    for (i, (step, state)) in workflow.steps.iter().zip(&r.steps).enumerate() {
        if step.wait.is_some() || step.child.is_some() || step.run.is_some() {
            // A wait (for a time or an event) calls no service: it nets nothing anywhere. A
            // sub-workflow step calls none either: its child's steps are checked on its record;
            // nor does a distributed forEach: its elements are records of their own, checked
            // against their run's ledger (`harness/distributed.rs`).
            continue;
        }
        if let Some(each) = &step.for_each {
            // Measured at the service: never more elements in calls at once than the cap.
            let group = format!("{}:{}", r.task_id, step.name);
            let most = effects.elements_in_flight.get(&group).copied().unwrap_or(0);
            if most > each.max_concurrency {
                report.over_concurrency.push(format!(
                    "{id} ({workflow_name}) {}: {most} elements in calls at once, maxConcurrency {}",
                    step.name, each.max_concurrency
                ));
            }
        }
        // By hand: a skipped step nets what it had when it was skipped (nothing is sent
        // for it); the steps a compensation from an earlier step settled by hand are the
        // operator's to account for.
        let skipped = by_hand
            .iter()
            .find(|a| a.action == "skip" && a.step == i && state.status == StepStatus::Done);
        let settled = by_hand
            .iter()
            .any(|a| a.action == "compensate-from" && a.from == ProcessState::Error && i > 0);
        // A forEach step: each element is a unit of its own, with its own key.
        let units: Vec<(String, &StepState)> = if state.elements.is_empty() {
            vec![(step.name.clone(), state)]
        } else {
            state
                .elements
                .iter()
                .enumerate()
                .map(|(k, e)| (format!("{}#{k}", step.name), e))
                .collect()
        };
        for (name, unit) in units {
            let key = idempotency_key(r.task_id, &name, &step.action, unit.generation);
            counts.effects += effects.applied.get(&key).map_or(0, |n| *n as usize);
            if let Some(undo) = &step.undo {
                let undo_key =
                    idempotency_key(r.task_id, &name, &undo.action, unit.undo_generation);
                let applied = effects.applied.get(&undo_key).copied().unwrap_or(0);
                counts.effects += applied as usize;
                if owes_no_undo && applied > 0 {
                    report.wrong_net.push(format!(
                        "{id} ({workflow_name}) {name}: undone though the task is {} and owes no compensation",
                        r.process_state,
                    ));
                }
                known_keys.insert(undo_key);
            }
            let got = effects.net.get(&key).copied().unwrap_or(0);
            known_keys.insert(key);
            let want = match (skipped, settled) {
                (_, true) => None,
                (Some(a), _)
                    if r.process_state != ProcessState::Resolved && state.elements.is_empty() =>
                {
                    Some(as_it_ran(a.step_status, true))
                }
                // A forEach step skipped by hand: its elements' real effects stay as they ran,
                // unless compensation reversed them as any other.
                (Some(_), _)
                    if matches!(
                        r.process_state,
                        ProcessState::Processed | ProcessState::Error
                    ) =>
                {
                    Some(as_it_ran(unit.status, unit.sent))
                }
                _ => wanted_net(r, i, unit),
            };
            let Some(want) = want else {
                continue;
            };
            if !want.contains(&got) {
                report.wrong_net.push(format!(
                    "{id} ({workflow_name}) {name}: nets {got}, not {want:?} (task {}, step {}{})",
                    r.process_state,
                    unit.status,
                    unit.undo.map(|u| format!(", undo {u}")).unwrap_or_default()
                ));
            }
        }
    }
}

/// Every key a service applied belongs to a step (or undo) of an accepted task.
pub(in crate::harness) fn check_no_stray_keys(
    effects: &Effects,
    known_keys: &BTreeSet<String>,
    report: &mut Report,
) {
    for key in effects.applied.keys() {
        if !known_keys.contains(key) {
            report.wrong_net.push(format!(
                "{key}: applied, but no step of an accepted task has this key"
            ));
        }
    }
}

/// The net effects step `i` may have at its service given the task's final state (`None`: not
/// checked, the task is not terminal). A key never applied nets 0.
///
/// - Processed: every step took effect once: 1.
/// - Compensated or Refused: every step with an undo nets 0 (done and undone, or never done); a step
///   without one (a read-only check) stays as it ran.
/// - CompensationFailed: the steps after the one whose undo failed are undone (0); that one may
///   or may not be (its undo was refused, or timed out); those before it stay as they ran.
/// - Error (past the pivot): nothing is undone; every step stays as it ran.
/// - Resolved: not checked (an operator settled the task outside sas).
///
/// "As it ran": Done (or Faulted: the service applied it) is 1; refused (Failed) or never sent
/// (Pending) is 0; a step that timed out may have taken effect or not.
fn wanted_net(r: &StateRecord, i: usize, s: &StepState) -> Option<&'static [i32]> {
    use ProcessState as P;
    let as_it_ran = as_it_ran(s.status, s.sent);
    Some(match r.process_state {
        // Never called.
        _ if s.status == StepStatus::Skipped => &[0],
        P::Processed => &[1],
        P::Compensated | P::Refused if s.undoable => &[0],
        // The step (or element) whose undo failed may or may not be undone; a forEach step's
        // elements after it were undone, those before it stay as they ran.
        P::CompensationFailed if i == r.step_index && s.undo == Some(StepStatus::Done) => &[0],
        P::CompensationFailed
            if i == r.step_index && s.undo.is_none() && r.steps[i].elements.is_empty() =>
        {
            &[0, 1]
        }
        P::CompensationFailed if i == r.step_index && s.undo.is_some() => &[0, 1],
        P::CompensationFailed if s.undoable && i > r.step_index => &[0],
        P::Compensated | P::Refused | P::CompensationFailed | P::Error => as_it_ran,
        // Settled outside sas by an operator: nothing for sas's books to add up.
        P::Pending | P::Processing | P::Compensating | P::Resolved => return None,
    })
}

/// The net effect of a step "as it ran" (see [`wanted_net`]); `sent`: a request for it went
/// out (a step handed back, Pending again, may have taken effect: one of a parallel group
/// that stopped is never sent again).
fn as_it_ran(status: StepStatus, sent: bool) -> &'static [i32] {
    use StepStatus as S;
    match status {
        S::Done | S::Faulted => &[1],
        S::Pending if sent => &[0, 1],
        S::Failed | S::Pending | S::Skipped => &[0],
        S::Running | S::Waiting | S::TimedOut | S::Cancelled => &[0, 1],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sas::Policy;
    use sas::domain::workflow;

    fn record(state: ProcessState, statuses: &[StepStatus], index: usize) -> StateRecord {
        let loan = workflow::examples::loan_application(&Policy::default());
        let mut r = StateRecord::new(
            TaskId::new_random(),
            &loan,
            None,
            chrono::Utc::now(),
            chrono::Utc::now(),
        );
        r.process_state = state;
        r.step_index = index;
        for (s, st) in r.steps.iter_mut().zip(statuses) {
            s.status = *st;
        }
        r
    }

    #[test]
    fn wanted_nets_follow_the_final_state_and_the_steps_undo() {
        use StepStatus as S;
        let done = [S::Done, S::Done, S::Done, S::Done];
        let r = record(ProcessState::Processed, &done, 4);
        assert_eq!(wanted_net(&r, 3, &r.steps[3]), Some(&[1][..]));
        // Refused at reserve-funds: the credit check has no undo and stays at 1.
        let r = record(
            ProcessState::Compensated,
            &[S::Done, S::Failed, S::Pending, S::Pending],
            1,
        );
        assert_eq!(wanted_net(&r, 0, &r.steps[0]), Some(&[1][..]));
        assert_eq!(wanted_net(&r, 1, &r.steps[1]), Some(&[0][..]));
        // Refused at the payout, past the pivot: Error, nothing undone.
        let r = record(
            ProcessState::Error,
            &[S::Done, S::Done, S::Done, S::Failed],
            3,
        );
        assert_eq!(wanted_net(&r, 2, &r.steps[2]), Some(&[1][..]));
        assert_eq!(wanted_net(&r, 3, &r.steps[3]), Some(&[0][..]));
        let r = record(
            ProcessState::Error,
            &[S::Done, S::Done, S::Done, S::TimedOut],
            3,
        );
        assert_eq!(wanted_net(&r, 3, &r.steps[3]), Some(&[0, 1][..]));
        let r = record(ProcessState::Processing, &done, 1);
        assert_eq!(wanted_net(&r, 0, &r.steps[0]), None);
    }
}
