//! Sub-workflows (issue 42): a step runs another published workflow as a child task, waits for
//! its end without polling, and takes its output as the step's result; the child's refusal is
//! the step's. Publishing refuses an unknown child, a cycle and nesting past the bound. A parent
//! undone undoes its child as a unit (its own undos, last first); cancelling a parent cancels
//! its running child.

use sas::TaskId;
use sas::messages::idempotency_key;
use sas::remote::Faults;
use sas_local::{Backend, Settings, System};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Arc;

const SERVICES: &str = "services:\n  - name: ledger\n    target: {type: simulated}\n";

const PAYMENT: &str = r#"name: payment
description: Authorise, then capture; answers the receipt.
input:
  type: object
  required: [amount]
  properties: {amount: {type: integer}}
steps:
  - {name: authorise, service: ledger, input: {amount: $.input.amount}}
  - {name: capture, service: ledger, input: {auth: $.steps.authorise.result.id}}
output: {receipt: $.steps.capture.result.id, amount: $.input.amount}
"#;

const ORDER: &str = r#"name: order
steps:
  - {name: reserve, service: ledger}
  - {name: pay, workflow: payment, input: {amount: $.input.amount}}
  - {name: ship, service: ledger, input: {receipt: $.steps.pay.result.receipt}}
"#;

async fn system(faults: HashMap<String, Faults>) -> System {
    let settings = Settings {
        definitions: vec![],
        faults,
        ..sas_blackbox::manual_settings()
    };
    let system = System::new(Backend::Memory, settings, Arc::new(sas::ports::SystemClock))
        .await
        .expect("builds");
    publish_all(&system).await;
    system
}

async fn publish_all(system: &System) {
    system
        .publish(&[
            ("services.yaml".into(), SERVICES.into()),
            ("payment.yaml".into(), PAYMENT.into()),
            ("order.yaml".into(), ORDER.into()),
        ])
        .await
        .expect("publishes");
}

/// The child task step `step` of task `parent` started (its first key).
fn child_of(parent: TaskId, step: &str, workflow: &str) -> TaskId {
    sas::handlers::children::child_id(&idempotency_key(parent, step, workflow, 0))
}

#[tokio::test]
async fn a_child_runs_its_workflow_and_its_output_is_the_steps_result() {
    let system = system(HashMap::new()).await;
    let id = sas_blackbox::submit_task(&system, "order", &json!({"amount": 40})).await;
    sas_blackbox::pump_until_quiet(&system, 60).await;
    let parent = sas_blackbox::state(&system, id).await;
    assert_eq!(
        parent.process_state,
        sas::ProcessState::Processed,
        "{:?}",
        parent.history
    );

    let child_id = child_of(id, "pay", "payment");
    let child = sas_blackbox::state(&system, child_id).await;
    assert_eq!(child.process_state, sas::ProcessState::Processed);
    assert_eq!(
        (child.workflow.as_str(), child.workflow_version),
        ("payment", 1)
    );
    let link = child.parent.as_ref().expect("the child names its parent");
    assert_eq!(
        (link.task_id, link.step.as_str(), link.depth),
        (id, "pay", 1)
    );
    // The child's own steps called the service under the child's keys, once each.
    let effects = sas_blackbox::effects(&system, "ledger", child_id);
    assert_eq!(effects.len(), 2, "{effects:?}");
    assert!(effects.values().all(|n| *n == 1));

    // The step's result is the child's output; a later step read it.
    let capture: Value =
        serde_json::from_str(child.steps[1].result.as_deref().expect("captured")).expect("JSON");
    let pay: Value = serde_json::from_str(
        parent.steps[1]
            .result
            .as_deref()
            .expect("the step's result"),
    )
    .expect("JSON");
    assert_eq!(pay, json!({"receipt": capture["id"], "amount": 40}));
    let shipped = sas_blackbox::requests(&system, "ledger", &id.to_string());
    let ship = shipped
        .iter()
        .find(|(action, _)| action == "ship")
        .expect("ship called");
    assert_eq!(ship.1, json!({"receipt": capture["id"]}));
    // The caller sees its task's child: the child runs as the parent's caller.
    let (child_task, _) = system
        .store
        .get(child_id)
        .await
        .expect("reads")
        .expect("stored");
    let (parent_task, _) = system.store.get(id).await.expect("reads").expect("stored");
    assert_eq!(child_task.caller, parent_task.caller);
    // The views link them: the caller's (the task API) and the operator's.
    let api = &system.api;
    let caller_get = |path: String| async move {
        let resp = sas::api::handle(
            api,
            &sas::auth::Identity::anonymous(),
            &http::Method::GET,
            &path,
            &http::HeaderMap::new(),
            b"",
        )
        .await;
        let status = resp.status().as_u16();
        (
            status,
            serde_json::from_str::<Value>(resp.body()).expect("JSON"),
        )
    };
    let (status, view) = caller_get(format!("/tasks/{id}")).await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(
        view["steps"][1]["childTaskId"],
        json!(child_id.to_string()),
        "{view}"
    );
    assert!(view["steps"][0].get("childTaskId").is_none(), "{view}");
    assert!(view.get("parent").is_none(), "{view}");
    let (status, child_view) = caller_get(format!("/tasks/{child_id}")).await;
    assert_eq!(
        status, 200,
        "the caller reads its task's child: {child_view}"
    );
    assert_eq!(
        child_view["parent"],
        json!({"taskId": id.to_string(), "step": "pay"})
    );
    let (status, ops) =
        sas_blackbox::operator_call(&system, http::Method::GET, &format!("/tasks/{id}"), b"").await;
    assert_eq!(status, 200, "{ops}");
    assert_eq!(
        ops["steps"][1]["childTaskId"],
        json!(child_id.to_string()),
        "{ops}"
    );
    let (status, ops) = sas_blackbox::operator_call(
        &system,
        http::Method::GET,
        &format!("/tasks/{child_id}"),
        b"",
    )
    .await;
    assert_eq!(status, 200, "{ops}");
    assert_eq!(ops["parent"]["taskId"], json!(id.to_string()), "{ops}");
    system.shutdown().await;
}

#[tokio::test]
async fn an_operator_cancelling_a_child_refuses_its_parents_step() {
    let waiting = format!("{REFUNDABLE}  - {{name: settle, wait: 1h}}\n");
    let system = shop_system(HashMap::new(), &waiting).await;
    let id = sas_blackbox::submit_task(&system, "shop", &json!({})).await;
    sas_blackbox::pump_until_quiet(&system, 80).await;
    let child_id = child_of(id, "pay", "refundable");
    let (status, body) =
        sas_blackbox::operator_post(&system, &format!("/tasks/{child_id}/cancel"), b"{}").await;
    assert_eq!(status, 202, "{body}");
    sas_blackbox::pump_until_quiet(&system, 80).await;
    let child = sas_blackbox::state(&system, child_id).await;
    assert_eq!(child.process_state, sas::ProcessState::Compensated);
    let parent = sas_blackbox::state(&system, id).await;
    assert_eq!(
        parent.process_state,
        sas::ProcessState::Refused,
        "{:#?}",
        parent.history
    );
    let refusal = parent.refusal.expect("the step's refusal");
    assert_eq!(
        (refusal.step.as_str(), refusal.code.as_str()),
        ("pay", "child_cancelled")
    );
    // The child's own steps were undone by its cancel, the parent's by its compensation; the
    // child, already compensated, is not undone twice.
    assert_eq!(undos(&system), ["refund", "void", "release"]);
    system.shutdown().await;
}

#[tokio::test]
async fn a_childs_refusal_refuses_the_step_and_the_parent_goes_no_further() {
    let refuse_capture = Faults {
        refuse_actions: vec!["capture".into()],
        ..Faults::default()
    };
    let system = system(HashMap::from([("ledger".to_owned(), refuse_capture)])).await;
    let id = sas_blackbox::submit_task(&system, "order", &json!({"amount": 40})).await;
    sas_blackbox::pump_until_quiet(&system, 60).await;
    let child = sas_blackbox::state(&system, child_of(id, "pay", "payment")).await;
    assert_eq!(child.process_state, sas::ProcessState::Refused);
    let parent = sas_blackbox::state(&system, id).await;
    assert_eq!(
        parent.process_state,
        sas::ProcessState::Refused,
        "{:?}",
        parent.history
    );
    let refusal = parent.refusal.expect("the parent's refusal");
    let child_refusal = child.refusal.expect("the child's refusal");
    assert_eq!(refusal.step, "pay");
    assert_eq!(
        refusal.code, child_refusal.code,
        "the child's code is the step's"
    );
    assert!(
        refusal.message.contains(&child.task_id.to_string()),
        "{}",
        refusal.message
    );
    let actions: Vec<String> = sas_blackbox::requests(&system, "ledger", &id.to_string())
        .into_iter()
        .map(|(a, _)| a)
        .collect();
    assert!(!actions.contains(&"ship".to_owned()), "{actions:?}");
    system.shutdown().await;
}

#[tokio::test]
async fn publishing_refuses_an_unknown_child_a_cycle_and_nesting_past_three() {
    let system = system(HashMap::new()).await;
    let publish = |name: &str, text: String| {
        let files = vec![(format!("{name}.yaml"), text)];
        let system = &system;
        async move { system.publish(&files).await.map_err(|e| format!("{e:#}")) }
    };
    let calls = |name: &str, child: &str| {
        format!("name: {name}\nsteps:\n  - {{name: inner, workflow: {child}}}\n")
    };
    let err = publish("lost", calls("lost", "nowhere"))
        .await
        .expect_err("an unknown child");
    assert!(
        err.contains("/steps/0/workflow") && err.contains("\"nowhere\" is not published"),
        "{err}"
    );
    let err = publish(
        "pinned",
        "name: pinned\nsteps:\n  - {name: inner, workflow: payment, workflowVersion: 9}\n".into(),
    )
    .await
    .expect_err("a version that does not exist");
    assert!(err.contains("has no version 9"), "{err}");

    // a → b, then b → a: a cycle.
    publish(
        "cycle-b",
        "name: cycle-b\nsteps:\n  - {name: s, service: ledger}\n".into(),
    )
    .await
    .expect("a leaf");
    publish("cycle-a", calls("cycle-a", "cycle-b"))
        .await
        .expect("a calls b");
    let err = publish("cycle-b", calls("cycle-b", "cycle-a"))
        .await
        .expect_err("b calls a, which calls b");
    assert!(err.contains("cycle-b → cycle-a → cycle-b"), "{err}");

    // d1 → d2 → d3 → d4 → d5: d2 is three deep, d1 four.
    publish(
        "d5",
        "name: d5\nsteps:\n  - {name: s, service: ledger}\n".into(),
    )
    .await
    .expect("a leaf");
    for (name, child) in [("d4", "d5"), ("d3", "d4"), ("d2", "d3")] {
        publish(name, calls(name, child))
            .await
            .expect("within the bound");
    }
    let err = publish("d1", calls("d1", "d2"))
        .await
        .expect_err("four deep");
    assert!(
        err.contains("at most 3 deep") && err.contains("d1 → d2 → d3 → d4 → d5"),
        "{err}"
    );

    // A sub-workflow step is no service step.
    let err = publish(
        "both",
        "name: both\nsteps:\n  - {name: s, service: ledger, workflow: payment}\n".into(),
    )
    .await
    .expect_err("both");
    assert!(err.contains("names both a service and a workflow"), "{err}");
    let err = publish(
        "undoing",
        "name: undoing\nsteps:\n  - {name: s, workflow: payment, undo: {action: refund}}\n".into(),
    )
    .await
    .expect_err("an undo");
    assert!(err.contains("/steps/0/undo"), "{err}");
    system.shutdown().await;
}

/// A payment whose steps each have an undo, and a shop that runs it between two steps of its
/// own.
const REFUNDABLE: &str = r#"name: refundable
steps:
  - {name: authorise, service: ledger, undo: {action: void}}
  - {name: capture, service: ledger, undo: {action: refund}}
"#;

const SHOP: &str = r#"name: shop
steps:
  - {name: reserve, service: ledger, undo: {action: release}}
  - {name: pay, workflow: refundable}
  - {name: ship, service: ledger}
"#;

async fn shop_system(faults: HashMap<String, Faults>, child: &str) -> System {
    let system = system(faults).await;
    system
        .publish(&[
            ("refundable.yaml".into(), child.into()),
            ("shop.yaml".into(), SHOP.into()),
        ])
        .await
        .expect("publishes");
    system
}

/// Every undo the service was asked for, in order, for every task.
fn undos(system: &System) -> Vec<String> {
    sas_blackbox::requests(system, "ledger", "")
        .into_iter()
        .map(|(action, _)| action)
        .filter(|a| ["void", "refund", "release"].contains(&a.as_str()))
        .collect()
}

#[tokio::test]
async fn a_parent_undone_after_its_child_ended_undoes_the_child_as_a_unit_last_first() {
    let system = shop_system(
        HashMap::from([("ledger".to_owned(), sas_blackbox::refuse(&["ship"]))]),
        REFUNDABLE,
    )
    .await;
    let id = sas_blackbox::submit_task(&system, "shop", &json!({})).await;
    sas_blackbox::pump_until_quiet(&system, 80).await;
    let parent = sas_blackbox::state(&system, id).await;
    assert_eq!(
        parent.process_state,
        sas::ProcessState::Refused,
        "{:#?}",
        parent.history
    );
    let child_id = child_of(id, "pay", "refundable");
    let child = sas_blackbox::state(&system, child_id).await;
    assert_eq!(
        child.process_state,
        sas::ProcessState::Compensated,
        "{:#?}",
        child.history
    );
    // The child's undos ran last first, inside the parent's compensation, each once; then the
    // parent's own.
    assert_eq!(undos(&system), ["refund", "void", "release"]);
    assert!(
        sas_blackbox::net(&system, "ledger", child_id)
            .values()
            .all(|n| *n == 0),
        "every effect of the child is undone"
    );
    assert_eq!(
        sas_blackbox::undone_steps(&parent),
        ["pay", "reserve"],
        "{:#?}",
        parent.history
    );
    system.shutdown().await;
}

#[tokio::test]
async fn a_child_past_its_pivot_cannot_be_undone_and_its_parents_compensation_fails() {
    let past_pivot = REFUNDABLE.replace(
        "{name: capture, service: ledger, undo: {action: refund}}",
        "{name: capture, service: ledger, pivot: true}",
    );
    let system = shop_system(
        HashMap::from([("ledger".to_owned(), sas_blackbox::refuse(&["ship"]))]),
        &past_pivot,
    )
    .await;
    let id = sas_blackbox::submit_task(&system, "shop", &json!({})).await;
    sas_blackbox::pump_until_quiet(&system, 80).await;
    let parent = sas_blackbox::state(&system, id).await;
    assert_eq!(
        parent.process_state,
        sas::ProcessState::CompensationFailed,
        "{:#?}",
        parent.history
    );
    assert!(
        parent
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("child_past_pivot")),
        "{:?}",
        parent.last_error
    );
    let child = sas_blackbox::state(&system, child_of(id, "pay", "refundable")).await;
    assert_eq!(child.process_state, sas::ProcessState::Processed);
    assert!(
        undos(&system).is_empty(),
        "nothing is undone: the child cannot be, and the parent stops there for an operator"
    );
    system.shutdown().await;
}

#[tokio::test]
async fn a_child_whose_own_compensation_failed_fails_its_parent_at_once() {
    let confirming = format!("{REFUNDABLE}  - {{name: confirm, service: ledger}}\n");
    let system = shop_system(
        HashMap::from([(
            "ledger".to_owned(),
            sas_blackbox::refuse(&["confirm", "refund"]),
        )]),
        &confirming,
    )
    .await;
    let id = sas_blackbox::submit_task(&system, "shop", &json!({})).await;
    sas_blackbox::pump_until_quiet(&system, 80).await;
    let child = sas_blackbox::state(&system, child_of(id, "pay", "refundable")).await;
    assert_eq!(
        child.process_state,
        sas::ProcessState::CompensationFailed,
        "{:#?}",
        child.history
    );
    // The parent does not wait for its step's timeout: the step failed (it took effect), and
    // its undo waits for an operator to settle the child.
    let parent = sas_blackbox::state(&system, id).await;
    assert_eq!(
        parent.process_state,
        sas::ProcessState::CompensationFailed,
        "{:#?}",
        parent.history
    );
    assert_eq!(parent.steps[1].status, sas::StepStatus::Faulted);
    assert!(
        parent
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("child_needs_operator")),
        "{:?}",
        parent.last_error
    );
    system.shutdown().await;
}

#[tokio::test]
async fn cancelling_a_parent_cancels_its_running_child_and_undoes_what_it_did() {
    let waiting = format!("{REFUNDABLE}  - {{name: settle, wait: 1h}}\n");
    let system = shop_system(HashMap::new(), &waiting).await;
    let id = sas_blackbox::submit_task(&system, "shop", &json!({})).await;
    sas_blackbox::pump_until_quiet(&system, 80).await;
    let child_id = child_of(id, "pay", "refundable");
    let child = sas_blackbox::state(&system, child_id).await;
    assert_eq!(
        (child.process_state, child.step_index),
        (sas::ProcessState::Processing, 2),
        "the child waits: {:#?}",
        child.history
    );
    let (status, body) =
        sas_blackbox::operator_post(&system, &format!("/tasks/{id}/cancel"), b"{}").await;
    assert_eq!(status, 202, "{body}");
    sas_blackbox::pump_until_quiet(&system, 80).await;
    let child = sas_blackbox::state(&system, child_id).await;
    assert_eq!(
        child.process_state,
        sas::ProcessState::Compensated,
        "{:#?}",
        child.history
    );
    let parent = sas_blackbox::state(&system, id).await;
    assert_eq!(
        parent.process_state,
        sas::ProcessState::Compensated,
        "{:#?}",
        parent.history
    );
    assert_eq!(undos(&system), ["refund", "void", "release"]);
    system.shutdown().await;
}

/// On the emulator (DynamoDB, SQS and EventBridge through the real SDK clients): a child runs
/// and answers, a parent undone undoes its child as a unit, and a child is kept while its
/// parent may still undo it: a `Processed` child of a parent still running has no expiry, and
/// its retention starts when its parent ends.
#[tokio::test]
async fn on_the_emulator_children_answer_are_undone_as_a_unit_and_are_kept_while_their_parent_runs()
{
    let mut settings = Settings {
        definitions: vec![],
        ..sas_blackbox::manual_settings()
    };
    settings.retention = Some(chrono::Duration::days(90));
    settings
        .faults
        .insert("ledger".into(), sas_blackbox::refuse(&["ship"]));
    let (system, _clock) = sas_blackbox::aws_system("children", settings).await;
    publish_all(&system).await;
    let holding = format!(
        "{}  - {{name: settle, wait: 1h}}\n",
        SHOP.replace("name: shop", "name: holding")
            .replace("  - {name: ship, service: ledger}\n", "")
    );
    system
        .publish(&[
            ("refundable.yaml".into(), REFUNDABLE.into()),
            ("shop.yaml".into(), SHOP.into()),
            ("holding.yaml".into(), holding),
        ])
        .await
        .expect("publishes");
    let undone = sas_blackbox::submit_task(&system, "shop", &json!({})).await;
    let held = sas_blackbox::submit_task(&system, "holding", &json!({})).await;
    sas_blackbox::pump_until_quiet(&system, 80).await;

    let state = |id| sas_blackbox::state(&system, id);
    let parent = state(undone).await;
    assert_eq!(
        parent.process_state,
        sas::ProcessState::Refused,
        "{:#?}",
        parent.history
    );
    let undone_child = child_of(undone, "pay", "refundable");
    assert_eq!(
        state(undone_child).await.process_state,
        sas::ProcessState::Compensated
    );
    assert!(
        sas_blackbox::net(&system, "ledger", undone_child)
            .values()
            .all(|n| *n == 0),
        "every effect of the child is undone"
    );

    let parent = state(held).await;
    assert_eq!(
        (parent.process_state, parent.step_index),
        (sas::ProcessState::Processing, 2),
        "the parent waits after its child: {:#?}",
        parent.history
    );
    let held_child = child_of(held, "pay", "refundable");
    let child = state(held_child).await;
    assert_eq!(child.process_state, sas::ProcessState::Processed);
    assert!(child.outbox.is_empty(), "its end is delivered: {child:?}");
    for sk in ["TASK", "STATE"] {
        assert_eq!(
            sas_blackbox::expires_at(&system, held_child, sk).await,
            None,
            "{sk}: a child its parent may still undo is kept"
        );
    }
    // The parent ends (its wait skipped by an operator): it releases its child.
    let (status, body) = sas_blackbox::wake(&system, held).await;
    assert_eq!(status, 202, "{body}");
    sas_blackbox::pump_until_quiet(&system, 40).await;
    assert_eq!(
        state(held).await.process_state,
        sas::ProcessState::Processed
    );
    sas_blackbox::assert_expires_in_days(&system, held_child, 90).await;
    system.shutdown().await;
}
