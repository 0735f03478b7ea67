//! The sub-workflow case (issue 42), on the run's world (its failpoints, its services' faults,
//! several supervisors), with automatic compensation and no operator: `checkout` tasks reserve
//! stock, pay through a child task (`settle-payment`: authorise, then capture, each with its
//! undo), then ship. Shipping refuses often, so many parents are undone after their child ended
//! `Processed`: the child is undone as a unit (its capture refunded, then its authorisation
//! voided). Payment refuses sometimes, so some children refuse and their parents compensate.
//!
//! Checked, once every parent and every child settled:
//! A child whose own undo was refused (`CompensationFailed`) holds its parent's step for an
//! operator: the case's operator resolves it, and the parent compensates.
//!
//! - each parent ended, and its child's end agrees with it: a `Processed` parent has a
//!   `Processed` child; a compensated or refused parent has no child, or one that is
//!   `Compensated`, `Refused` or resolved by the operator; the child names its parent and is released (its retention
//!   runs) once the parent ended for good; no child is left running (orphaned);
//! - at the services, as for the main run: no key applied twice, no step leaked after its undo,
//!   each step's net effect what its task's final state says (the parents' and the children's),
//!   and no effect under a key that no parent's or child's step has (a child started twice,
//!   under another id, would show here).

use super::checks::effects;
use super::config::Config;
use super::for_each::{submit, until};
use super::report::Report;
use super::world::World;
use crate::operator::{Operator, OperatorPlan};
use sas::handlers::children::child_of_step;
use sas::{ProcessState, StateRecord, TaskId, Workflow};
use serde_json::json;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The child workflow of the case.
pub const SETTLE_PAYMENT: &str = r#"
name: settle-payment
description: Authorise, then capture; answers the receipt. Undone as a unit by its parent.
input:
  type: object
  required: [amount]
  properties: {amount: {type: integer}}
steps:
  - name: authorise
    service: payment
    action: authorise
    input: {amount: $.input.amount}
    undo:
      action: void
      input: {auth: "$.steps['authorise'].result.id"}
  - name: capture
    service: payment
    action: capture
    input: {auth: "$.steps['authorise'].result.id"}
    undo:
      action: refund
      input: {capture: "$.steps['capture'].result.id"}
output: {receipt: "$.steps['capture'].result.id"}
"#;

/// The parent workflow of the case: its second step is the child.
pub const CHECKOUT: &str = r#"
name: checkout
input:
  type: object
  required: [amount]
  properties: {amount: {type: integer}}
steps:
  - name: reserve
    service: inventory
    action: reserve-stock
    undo: {action: release-stock}
  - name: pay
    workflow: settle-payment
    input: {amount: $.input.amount}
  - name: ship
    service: shipping
    action: book-delivery
    input: {receipt: $.steps.pay.result.receipt}
"#;

/// What the case found (`violations`, each a line) and counted.
#[derive(Debug, Default)]
pub struct SubWorkflowReport {
    pub violations: Vec<String>,
    /// The parents' final states, and their children's.
    pub parents: std::collections::BTreeMap<String, usize>,
    pub children: std::collections::BTreeMap<String, usize>,
    /// Children that ended `Processed`, then were undone as a unit (`Compensated`).
    pub undone_as_a_unit: usize,
    /// Children the operator resolved (each waited for an operator, holding its parent).
    pub resolved_children: usize,
}

/// Runs `checkouts` checkout tasks on fresh in-memory adapters under `cfg`'s faults and
/// failpoints (shipping refusing a third of its calls, payment a tenth), then checks them.
pub async fn run_sub_workflow_case(
    cfg: &Config,
    checkouts: usize,
) -> anyhow::Result<SubWorkflowReport> {
    let mut cfg = cfg.clone();
    cfg.sub_workflow_case = true;
    cfg.operator = None;
    for (service, rate) in [("shipping", 0.3), ("payment", 0.1)] {
        if let Some(f) = cfg.settings.faults.get_mut(service) {
            f.permanent_rate = rate;
        }
    }
    let ports = sas_local::ports(sas_local::Backend::Memory, &cfg.settings).await?;
    let mut world = World::set_up(ports, &cfg).await?;
    let http = reqwest::Client::new();
    let (patience, seed) = (cfg.patience, cfg.seed);
    let store = world.system.store.clone();
    let mut out = SubWorkflowReport::default();

    let definitions = world.system.definitions.clone();
    let (Some(checkout), Some(payment)) = (
        definitions.workflow("checkout", 1).await?,
        definitions.workflow("settle-payment", 1).await?,
    ) else {
        anyhow::bail!("the case's workflows are not published");
    };
    let operator = Arc::new(Operator::new(
        world.base.clone(),
        store.clone(),
        OperatorPlan::default(),
        seed,
    ));
    let runs = (0..checkouts).map(|i| {
        let (http, base, operator) = (http.clone(), world.base.clone(), operator.clone());
        let checkout = checkout.clone();
        async move {
            let input = json!({ "amount": i + 1 });
            let id = submit(
                &http,
                &base,
                "checkout",
                &format!("checkout-{seed}-{i}"),
                &input,
            )
            .await?;
            settle_checkout(&operator, &checkout, id, patience).await
        }
    });
    let mut parents = vec![];
    for outcome in futures::future::join_all(runs).await {
        match outcome {
            Ok(r) => parents.push(r),
            Err(e) => out.violations.push(e),
        }
    }
    let mut children = vec![];
    for parent in &parents {
        *out.parents
            .entry(parent.process_state.to_string())
            .or_default() += 1;
        match settled_child(&*store, parent, &checkout, patience).await {
            Ok(Some(child)) => {
                *out.children
                    .entry(child.process_state.to_string())
                    .or_default() += 1;
                out.violations.extend(agree(parent, &child));
                if child.process_state == ProcessState::Compensated
                    && child
                        .history
                        .iter()
                        .any(|h| h.to == ProcessState::Processed)
                {
                    out.undone_as_a_unit += 1;
                }
                children.push(child);
            }
            Ok(None) => {
                if parent.process_state == ProcessState::Processed {
                    out.violations
                        .push(format!("{}: Processed without a child", parent.task_id));
                }
            }
            Err(e) => out.violations.push(e),
        }
    }

    world.stop_supervisors().await;
    let left = world.shut_down().await;
    let mut report = Report::default();
    let books = effects::tally_services(&left.services, &mut report).await;
    let mut known = BTreeSet::new();
    let tasks = parents
        .iter()
        .map(|r| (r, &checkout))
        .chain(children.iter().map(|r| (r, &payment)));
    for (r, workflow) in tasks {
        effects::check_net_effects(
            &r.task_id,
            &r.workflow,
            r,
            workflow,
            &books,
            &[],
            &mut known,
            &mut report,
        );
    }
    effects::check_no_stray_keys(&books, &known, &mut report);
    for (what, list) in [
        ("applied twice", &report.doubled),
        ("leaked", &report.leaked),
        ("wrong body", &report.wrong_bodies),
        ("wrong net effect", &report.wrong_net),
    ] {
        out.violations
            .extend(list.iter().map(|l| format!("{what}: {l}")));
    }
    out.resolved_children = operator
        .log
        .by_action()
        .get("resolve")
        .copied()
        .unwrap_or(0);
    Ok(out)
}

/// Checkout `id` once it ended and its notices went out. A child that waits for an operator
/// (an undo of its own refused: `CompensationFailed`) holds its parent's step until the step's
/// timeout: the operator resolves it, and its parent goes on (`child_resolved` refuses the
/// step, and the parent compensates).
pub(super) async fn settle_checkout(
    operator: &Operator,
    checkout: &Workflow,
    id: TaskId,
    patience: Duration,
) -> Result<StateRecord, String> {
    use ProcessState as P;
    let store = &*operator.store;
    let end = Instant::now() + patience;
    while Instant::now() < end {
        if let Ok(Some(r)) = store.get_state(id).await {
            if r.process_state.is_terminal() && !r.notice_pending() {
                return Ok(r);
            }
            if r.process_state == P::Processing
                && let Some(child) = child_of(&r, checkout)
                && let Ok(Some(c)) = store.get_state(child).await
                && matches!(c.process_state, P::Error | P::CompensationFailed)
            {
                operator.act(child, "resolve").await;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(format!(
        "{id} stalled after {patience:?}\n{}",
        story(store, checkout, id).await
    ))
}

/// The checkout's step that runs the child.
const PAY: usize = 1;

/// The child `parent`'s `pay` step starts (under its key's current generation).
fn child_of(parent: &StateRecord, checkout: &Workflow) -> Option<TaskId> {
    let generation = parent.steps.get(PAY).map_or(0, |s| s.generation);
    child_of_step(parent.task_id, checkout, PAY, generation)
}

/// The child of `parent`'s `pay` step once it settled (ended, its notices delivered, released
/// if its parent ended for good: a parent waiting for an operator keeps it held); `None` if
/// the step never started one.
pub(super) async fn settled_child(
    store: &dyn sas::ports::StateStore,
    parent: &StateRecord,
    workflow: &Arc<Workflow>,
    patience: Duration,
) -> Result<Option<StateRecord>, String> {
    let Some(id) = child_of(parent, workflow) else {
        return Err(format!(
            "{}: step {PAY} is not a sub-workflow",
            parent.task_id
        ));
    };
    match store.get_state(id).await {
        Ok(None) => return Ok(None),
        Ok(Some(_)) => {}
        Err(e) => return Err(format!("{id}: unreadable: {e}")),
    }
    // A parent that may still undo its child (it waits for an operator: `CompensationFailed`
    // at a later step) keeps it held.
    let for_good = parent.process_state.is_final();
    until(store, id, patience, |r| {
        r.process_state.is_terminal() && !r.notice_pending() && !(for_good && r.held_by_parent())
    })
    .await
    .map(Some)
    .map_err(|e| format!("child of {}: {e} (orphaned)", parent.task_id))
}

/// What is wrong with `child`'s end given its `parent`'s.
pub(super) fn agree(parent: &StateRecord, child: &StateRecord) -> Vec<String> {
    use ProcessState as P;
    let mut wrong = vec![];
    let (p, c) = (parent.process_state, child.process_state);
    let fine = match p {
        P::Processed => c == P::Processed,
        // (`Resolved`: it waited for an operator, who settled it.)
        P::Compensated | P::Refused => matches!(c, P::Compensated | P::Refused | P::Resolved),
        // An undo failed somewhere: the operator's to settle; the books are still checked.
        _ => true,
    };
    if !fine {
        wrong.push(format!(
            "{}: parent {p}, its child {} {c}",
            parent.task_id, child.task_id
        ));
    }
    match &child.parent {
        // A `Processed` child is kept while its parent may undo it, then released.
        Some(link) if link.task_id == parent.task_id => {
            if c == P::Processed && !link.released && p.is_final() {
                wrong.push(format!(
                    "{}: Processed child of a final parent not released",
                    child.task_id
                ));
            }
        }
        other => wrong.push(format!(
            "{}: names parent {:?}, not {}",
            child.task_id,
            other.as_ref().map(|l| l.task_id),
            parent.task_id
        )),
    }
    wrong
}

/// A stalled task's history, and its child's, for the report.
async fn story(store: &dyn sas::ports::StateStore, checkout: &Workflow, id: TaskId) -> String {
    let Ok(Some(r)) = store.get_state(id).await else {
        return format!("{id}: unreadable");
    };
    let mut lines = vec![format!(
        "{id} {} v{} steps {:?}",
        r.process_state,
        r.version,
        r.steps
            .iter()
            .map(|s| format!(
                "{} g{} u{:?} w{:?}",
                s.status, s.generation, s.undo, s.waiting_until
            ))
            .collect::<Vec<_>>()
    )];
    lines.extend(history("  ", &r));
    if let Some(child) = child_of(&r, checkout)
        && let Ok(Some(c)) = store.get_state(child).await
    {
        lines.push(format!(
            "  child {child} {} {:?}",
            c.process_state, c.parent
        ));
        lines.extend(history("    ", &c));
    }
    lines.join("\n")
}

/// A record's history as a story's lines, each under `indent`.
pub(super) fn history(indent: &str, r: &StateRecord) -> Vec<String> {
    r.history
        .iter()
        .map(|h| {
            format!(
                "{indent}{} {} -> {} {:?} a{} {}",
                h.at, h.from, h.to, h.step, h.attempt, h.reason
            )
        })
        .collect()
}
