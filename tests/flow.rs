//! Black-box tests of the whole flow on the AWS API emulator, through the handlers' real inputs:
//! HTTP requests, SQS events built from messages received from the emulator's queues, and
//! scheduled events for the supervisor. Both example workflows: the e-commerce order (every
//! step undoable) and the loan application (a read-only first step, a pivot, a last step
//! without an undo).

use sas::messages::{SchedulerMessage, StepReply, StepRequest};
use sas::ports::ReceiveRequest;
use sas::remote::Faults;
use sas::transition::StepOutcome;
use sas::{ProcessState, StepStatus, TaskId};
use sas_blackbox::{
    ECOMMERCE, LOAN, actions, assert_valid, aws_system, cool_off, drain, effects, loan_input,
    manual_settings, memory_system, net, operator_call, order_input, pump_until_quiet, state,
    submit, submit_loan, submit_ok, submit_task, subscribe, task_items, wait_for_messages,
};
use sas_local::{System, sqs_event};
use serde_json::{Value, json};
use std::time::Duration;

/// Every step of the task took effect exactly once, each at its own service under its own key,
/// and nothing else took effect for it.
async fn assert_each_step_once(system: &System, id: TaskId) {
    let r = state(system, id).await;
    let w = sas_blackbox::workflow_of(system, &r).await;
    let mut total = 0;
    for step in w.steps.iter().filter(|s| s.wait.is_none()) {
        // (A wait calls no service.)
        let key = format!("{id}:{}:{}", step.name, step.action);
        let applied = effects(system, &step.service, id);
        assert_eq!(
            applied.get(&key),
            Some(&1),
            "{}: applied once at {}: {applied:?}",
            step.name,
            step.service
        );
        total += 1;
    }
    let all: u32 = system
        .services
        .all()
        .iter()
        .map(|(_, s)| s.effects_for(&id.to_string()).values().sum::<u32>())
        .sum();
    assert_eq!(all, total, "no other effect for {id}");
}

/// The request body service `service` received for task `id`'s `action`.
fn request(system: &System, service: &str, id: TaskId, action: &str) -> Value {
    sas_blackbox::requests(system, service, &id.to_string())
        .into_iter()
        .find(|(a, _)| a == action)
        .unwrap_or_else(|| panic!("{service} applied no {action} for {id}"))
        .1
}

/// The result step `step` of the task kept (what its service answered).
async fn result(system: &System, id: TaskId, step: &str) -> Value {
    let r = state(system, id).await;
    let s = r
        .steps
        .iter()
        .find(|s| s.name == step)
        .unwrap_or_else(|| panic!("no step {step}"));
    serde_json::from_str(s.result.as_deref().expect("a kept result")).expect("JSON result")
}

/// Round `round` of a payment that never answers: the scheduler claims the task (on the first
/// round the inventory step runs and the payment is requested), then the clock moves past the
/// step's deadline.
async fn claim_then_miss_the_deadline(
    system: &System,
    clock: &sas::ports::OffsetClock,
    round: u32,
) {
    system.pump_scheduler().await.expect("poll");
    if round == 1 {
        system.pump_agents().await.expect("inventory");
        system.pump_scheduler().await.expect("reply");
    }
    clock.advance(chrono::Duration::seconds(31));
}

/// Up to ten messages visible on `url` now (received, not deleted).
async fn receive_now(system: &System, url: &str) -> Vec<sas::ports::ReceivedMessage> {
    system
        .queue
        .receive(ReceiveRequest::visible(url))
        .await
        .expect("receive")
}

/// The one step request on the agents' queue (drained): as sent, and parsed.
async fn one_step_request(system: &System, what: &str) -> (String, StepRequest) {
    let mut requests = drain(system, &system.resources.agent_queue_url).await;
    assert_eq!(requests.len(), 1, "{what}: {requests:?}");
    let raw = requests.remove(0);
    let request = serde_json::from_str(&raw).expect("request");
    (raw, request)
}

#[tokio::test]
async fn a_task_submitted_over_http_runs_to_processed_with_every_step_once() {
    let (mut system, _clock) = aws_system("happy", manual_settings()).await;
    let events = subscribe(&system, &["TaskProcessed", "TaskFailed"]).await;
    let addr = sas_blackbox::serve_system(&mut system).await;
    system.start();
    let http = reqwest::Client::new();
    let resp = http
        .post(format!("http://{addr}/workflows/{ECOMMERCE}/tasks"))
        .json(&order_input())
        .send()
        .await
        .expect("POST");
    assert_eq!(resp.status(), 202);
    let body: Value = resp.json().await.expect("JSON");
    assert_eq!(body["workflow"], ECOMMERCE, "{body}");
    assert_eq!(body["workflowVersion"], 1, "{body}");
    let id: TaskId = body["taskId"].as_str().expect("id").parse().expect("uuid");

    let mut view = Value::Null;
    for _ in 0..150 {
        // The operator's view: the caller's hides the lock holder and the counts.
        view = sas_blackbox::get_json(&http, &format!("http://{addr}/operator/tasks/{id}")).await;
        if view["processState"] == "Processed" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(view["processState"], "Processed", "{view}");
    assert_eq!(view["taskId"], id.to_string());
    assert_eq!(view["workflow"], ECOMMERCE);
    assert_eq!(view["input"], order_input(), "the input as submitted");
    assert_eq!(view["lockedBy"], Value::Null);
    assert_eq!(view["failureCount"], 0);
    let steps = view["steps"].as_array().expect("steps");
    let names: Vec<_> = steps.iter().map(|s| s["name"].clone()).collect();
    assert_eq!(
        names,
        [
            json!("reserve-inventory"),
            json!("charge-payment"),
            json!("arrange-shipping")
        ]
    );
    for s in steps {
        assert_eq!(s["status"], "Done", "{view}");
        assert_eq!(s["undoable"], true, "{view}");
        assert!(s["result"]["id"].is_string(), "the result as JSON: {view}");
    }
    assert_each_step_once(&system, id).await;

    // Each request was built by the step's input mapping, from the input and earlier results.
    let reservation = &steps[0]["result"]["id"];
    assert_eq!(
        request(&system, "inventory", id, "reserve-inventory"),
        order_input()
    );
    assert_eq!(
        request(&system, "payment", id, "charge-payment"),
        json!({"customerId": "c-42", "reservation": reservation})
    );
    assert_eq!(
        request(&system, "shipping", id, "arrange-shipping")["payment"],
        steps[1]["result"]["id"]
    );

    let got = wait_for_messages(&system, &events, 1).await;
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0]["detail-type"], "TaskProcessed");
    assert_eq!(got[0]["source"], "sas.tasks");
    assert_eq!(got[0]["detail"]["taskId"], id.to_string());
    assert_eq!(got[0]["detail"]["workflow"], ECOMMERCE);
    assert_eq!(got[0]["detail"]["status"], "Processed");
    let final_state = state(&system, id).await;
    assert!(!final_state.notice_pending(), "the outbox is cleared");
    assert_valid(&system, &final_state).await;
    system.shutdown().await;
}

#[tokio::test]
async fn a_loan_runs_to_processed_and_each_step_reads_the_results_before_it() {
    let (system, clock) = aws_system("loan", manual_settings()).await;
    let events = subscribe(&system, &["TaskProcessed"]).await;
    let id = submit_loan(&system).await;
    pump_until_quiet(&system, 30).await;
    // Signed (the event came early, kept for its step): the loan cools off for 14 days.
    let r = state(&system, id).await;
    assert_eq!(r.process_state, ProcessState::Processing, "{r:?}");
    assert_eq!(r.current_step(), Some("cooling-off"));
    assert!(!r.past_pivot(), "a withdrawal now still undoes the loan");
    cool_off(&system, &clock).await;
    let r = state(&system, id).await;
    assert_eq!(r.process_state, ProcessState::Processed, "{r:?}");
    assert_eq!(r.workflow, LOAN);
    assert_eq!(r.pivot, Some(4));
    assert!(r.past_pivot());
    let undoable: Vec<bool> = r.steps.iter().map(|s| s.undoable).collect();
    assert_eq!(undoable, [false, true, true, false, false, false]);
    assert_valid(&system, &r).await;
    assert_each_step_once(&system, id).await;

    let credit = result(&system, id, "check-credit").await;
    let hold = result(&system, id, "reserve-funds").await;
    let contract = result(&system, id, "send-contract").await;
    assert_eq!(
        request(&system, "credit-bureau", id, "check-credit"),
        json!({"applicantId": "a-42", "amount": 25000})
    );
    assert_eq!(
        request(&system, "core-banking", id, "reserve-funds"),
        json!({"applicantId": "a-42", "amount": 25000, "currency": "EUR", "creditCheck": credit["id"]})
    );
    assert_eq!(
        request(&system, "e-sign", id, "send-contract"),
        json!({"applicantId": "a-42", "hold": hold["id"], "loan": id.to_string()})
    );
    assert_eq!(
        request(&system, "core-banking", id, "disburse-funds"),
        json!({"hold": hold["id"], "contract": contract["id"], "signedBy": "a-42"})
    );

    let got = wait_for_messages(&system, &events, 1).await;
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0]["detail"]["taskId"], id.to_string());
    assert_eq!(got[0]["detail"]["workflow"], LOAN);
    assert_eq!(got[0]["detail"]["workflowVersion"], 1);
}

#[tokio::test]
async fn a_refused_contract_releases_the_funds_but_never_undoes_the_credit_check() {
    let settings = sas_blackbox::faulty("e-sign", sas_blackbox::refuse(&["send-contract"]));
    let (system, _clock) = aws_system("loanrefused", settings).await;
    let events = subscribe(&system, &["TaskFailed", "TaskCompensated", "TaskRefused"]).await;
    let id = submit_loan(&system).await;
    pump_until_quiet(&system, 30).await;
    let r = sas_blackbox::refused_at(&system, id, 2).await;
    assert_eq!(
        r.steps[1].undo,
        Some(StepStatus::Done),
        "the hold is released"
    );
    assert_eq!(r.steps[0].status, StepStatus::Done);
    assert_eq!(r.steps[0].undo, None, "the credit check has no undo");
    assert_eq!(r.steps[5].status, StepStatus::Pending, "never paid out");
    let undone = sas_blackbox::undone_steps(&r);
    assert_eq!(undone, ["reserve-funds"]);

    let hold_key = format!("{id}:reserve-funds:reserve-funds");
    assert_eq!(net(&system, "core-banking", id).get(&hold_key), Some(&0));
    assert_eq!(
        actions(&system, "core-banking", id),
        ["reserve-funds", "release-funds"]
    );
    // The release reads the hold's id from the step's kept result.
    let hold = result(&system, id, "reserve-funds").await;
    assert_eq!(
        request(&system, "core-banking", id, "release-funds"),
        json!({"hold": hold["id"], "amount": 25000})
    );
    assert_eq!(actions(&system, "credit-bureau", id), ["check-credit"]);
    assert_eq!(
        net(&system, "credit-bureau", id)
            .values()
            .collect::<Vec<_>>(),
        [&1],
        "the credit check stands"
    );
    assert!(
        actions(&system, "e-sign", id).is_empty(),
        "refused: no effect"
    );

    let got = wait_for_messages(&system, &events, 1).await;
    let types: Vec<_> = got.iter().map(|e| e["detail-type"].clone()).collect();
    assert_eq!(types, [json!("TaskRefused")], "no TaskFailed alert");
    // The event names the refusal: its step and the service's code.
    assert_eq!(
        got[0]["detail"]["refusal"]["step"],
        json!("send-contract"),
        "{}",
        got[0]
    );
    assert_eq!(got[0]["detail"]["workflow"], LOAN);
}

#[tokio::test]
async fn a_refused_payout_after_the_pivot_ends_in_error_and_only_goes_forward() {
    let settings = sas_blackbox::faulty("core-banking", sas_blackbox::refuse(&["disburse-funds"]));
    let (system, clock) = aws_system("loanpivot", settings).await;
    let alerts = subscribe(&system, &["TaskFailed", "TaskCompensated"]).await;
    let id = submit_loan(&system).await;
    pump_until_quiet(&system, 30).await;
    cool_off(&system, &clock).await;
    let r = state(&system, id).await;
    assert_eq!(
        r.process_state,
        ProcessState::Error,
        "automatic compensation stops at the pivot: {r:?}"
    );
    assert_valid(&system, &r).await;
    assert_eq!(r.current_step(), Some("disburse-funds"));
    assert_eq!(r.steps[5].status, StepStatus::Failed);
    assert!(r.steps.iter().all(|s| s.undo.is_none()), "nothing undone");
    for (service, n) in [("credit-bureau", 1), ("core-banking", 1), ("e-sign", 1)] {
        let nets = net(&system, service, id);
        assert_eq!(
            nets.values().filter(|v| **v == 1).count(),
            n,
            "{service}: {nets:?}"
        );
        assert!(nets.values().all(|v| *v == 1), "{service}: {nets:?}");
    }
    assert_eq!(actions(&system, "core-banking", id), ["reserve-funds"]);
    assert_eq!(actions(&system, "e-sign", id), ["send-contract"]);
    let got = wait_for_messages(&system, &alerts, 1).await;
    assert_eq!(got.len(), 1, "an alert and no compensation: {got:?}");
    assert_eq!(got[0]["detail-type"], "TaskFailed");
    assert_eq!(got[0]["detail"]["step"], "disburse-funds");

    // The operator cannot undo it past the pivot; a retry pays out once the bank accepts.
    for action in ["compensate", "cancel"] {
        let (status, body) =
            sas_blackbox::operator_post(&system, &format!("/tasks/{id}/{action}"), b"").await;
        assert_eq!(status, 409, "{action}: {body}");
        assert_eq!(body["error"]["code"], "conflict", "{body}");
        assert_eq!(body["processState"], "Error", "{body}");
    }
    assert_eq!(state(&system, id).await, r, "the refusals changed nothing");
    system
        .services
        .get("core-banking")
        .set_faults(Faults::default());
    let (status, body) =
        sas_blackbox::operator_post(&system, &format!("/tasks/{id}/retry"), b"").await;
    assert_eq!(status, 202, "{body}");
    pump_until_quiet(&system, 20).await;
    let r = state(&system, id).await;
    assert_eq!(r.process_state, ProcessState::Processed, "{r:?}");
    assert_eq!(
        actions(&system, "core-banking", id),
        ["reserve-funds", "disburse-funds"]
    );
    assert!(
        effects(&system, "core-banking", id)
            .contains_key(&format!("{id}:disburse-funds:disburse-funds:g1")),
        "a refused key is not reused"
    );
}

#[tokio::test]
async fn transient_faults_and_lost_responses_are_retried_to_processed_once() {
    let mut settings = manual_settings();
    settings.default_faults = Faults {
        transient_rate: 0.4,
        lost_response_rate: 0.4,
        ..Faults::default()
    };
    let (system, clock) = aws_system("transient", settings).await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(submit_ok(&system).await);
    }
    for _ in 0..2 {
        ids.push(submit_loan(&system).await);
    }
    pump_until_quiet(&system, 60).await;
    cool_off(&system, &clock).await;
    for id in ids {
        let r = state(&system, id).await;
        assert_eq!(r.process_state, ProcessState::Processed, "{r:?}");
        assert_eq!(r.failure_count, 0, "agents absorbed the faults");
        assert_each_step_once(&system, id).await;
    }
    let faults: u64 = system
        .services
        .all()
        .iter()
        .map(|(_, s)| s.stats().transient_faults)
        .sum();
    assert!(faults > 0, "the faults did happen");
}

#[tokio::test]
async fn an_agent_that_overruns_stops_silently_and_the_supervisor_recovers_it() {
    let (system, clock) = aws_system("overrun", manual_settings()).await;
    let id = submit_ok(&system).await;
    assert_eq!(
        system.pump_scheduler().await.expect("poll"),
        1,
        "work message"
    );
    let r = state(&system, id).await;
    assert_eq!((r.process_state, r.attempt), (ProcessState::Processing, 1));
    assert!(r.locked_by.is_some());

    // The agent gets the request only after its deadline: it must stop and send nothing.
    clock.advance(chrono::Duration::seconds(31));
    assert_eq!(system.pump_agents().await.expect("poll"), 1);
    assert!(
        drain(&system, &system.resources.reply_queue_url)
            .await
            .is_empty(),
        "no reply after the deadline"
    );
    assert!(system.services.get("inventory").stats().effects.is_empty());

    let report = system.sweep().await.expect("sweep");
    assert_eq!(report.retried, 1, "{report:?}");
    let r = state(&system, id).await;
    assert_eq!(r.process_state, ProcessState::Pending);
    assert_eq!(r.failure_count, 1);
    assert_eq!(r.locked_by, None);
    assert!(
        r.last_error
            .as_deref()
            .is_some_and(|e| e.contains("reserve-inventory"))
    );

    pump_until_quiet(&system, 20).await;
    let r = state(&system, id).await;
    assert_eq!(r.process_state, ProcessState::Processed, "{r:?}");
    assert_eq!(r.attempt, 2, "one claim per Pending period");
    assert_each_step_once(&system, id).await;
}

#[tokio::test]
async fn a_request_that_waited_in_the_queue_still_runs_within_its_start_allowance() {
    // 60 s to be picked up, 30 s to run: the deadline is the dispatch + 90 s.
    let mut settings = manual_settings();
    settings.policy.start_within = chrono::Duration::seconds(60);
    let (system, clock) = aws_system("late", settings).await;
    let id = submit_ok(&system).await;
    assert_eq!(system.pump_scheduler().await.expect("poll"), 1);
    let claimed = state(&system, id).await;
    // A backlog held the request 45 s: past the step's 30 s timeout, within its allowance.
    clock.advance(chrono::Duration::seconds(45));
    assert_eq!(system.pump_agents().await.expect("poll"), 1);
    let report = system.sweep().await.expect("sweep");
    assert_eq!(report.due, 0, "nothing expired: {report:?}");
    pump_until_quiet(&system, 20).await;
    let r = state(&system, id).await;
    assert_eq!(r.process_state, ProcessState::Processed, "{r:?}");
    assert_eq!(r.failure_count, 0, "late, not failed: {r:?}");
    assert_eq!(r.attempt, claimed.attempt, "no second claim");
    assert_each_step_once(&system, id).await;
}

#[tokio::test]
async fn an_agent_out_of_its_step_timeout_before_the_deadline_hands_the_attempt_back_at_once() {
    // A second to run, a minute to be picked up; the service fails every call, and the breaker
    // never opens (so the agent retries until the step's timeout).
    let mut settings = manual_settings();
    settings.policy.step_timeout = chrono::Duration::seconds(1);
    settings.policy.start_within = chrono::Duration::seconds(60);
    settings.breaker.threshold = 1_000_000;
    let always = Faults {
        transient_rate: 1.0,
        ..Faults::default()
    };
    settings.faults.insert("inventory".into(), always);
    let (system, _clock) = aws_system("gaveup", settings).await;
    let id = submit_ok(&system).await;
    assert_eq!(system.pump_scheduler().await.expect("poll"), 1);
    // The agent stops at the step's timeout (not at the deadline a minute away) and says so.
    assert_eq!(system.pump_agents().await.expect("poll"), 1);
    // Its reply, applied: a timed-out attempt, handed back now (not 61 s later by the sweep).
    assert_eq!(system.pump_scheduler().await.expect("reply"), 1);
    let r = state(&system, id).await;
    assert_eq!(
        (r.process_state, r.failure_count),
        (ProcessState::Pending, 1),
        "{r:?}"
    );
    assert!(
        r.last_error
            .as_deref()
            .is_some_and(|e| e.contains("reserve-inventory") && e.contains("timeout")),
        "{r:?}"
    );
}

#[tokio::test]
async fn failures_up_to_the_threshold_end_in_error_with_a_task_failed_event() {
    let settings = sas_blackbox::down_until_an_operator("payment");
    let (system, clock) = aws_system("threshold", settings).await;
    let alerts = subscribe(&system, &["TaskFailed"]).await;
    let id = submit_ok(&system).await;
    for round in 1..=3u32 {
        // Claim (on the first round inventory is reserved and payment requested), then the
        // agent only gets to run the payment after the deadline and stops without a reply.
        claim_then_miss_the_deadline(&system, &clock, round).await;
        assert_eq!(system.pump_agents().await.expect("payment"), 1);
        let report = system.sweep().await.expect("sweep");
        let r = state(&system, id).await;
        assert_eq!(r.failure_count, round, "{r:?}");
        if round < 3 {
            assert_eq!(report.retried, 1, "{report:?}");
            assert_eq!(r.process_state, ProcessState::Pending);
        } else {
            assert_eq!(report.failed, 1, "{report:?}");
        }
    }
    let r = state(&system, id).await;
    assert_eq!(r.process_state, ProcessState::Error);
    assert_eq!(r.locked_by, None);
    assert_eq!(r.current_step(), Some("charge-payment"));
    assert_eq!(r.steps[0].status, StepStatus::Done);
    assert!(system.services.get("payment").stats().effects.is_empty());

    let got = wait_for_messages(&system, &alerts, 1).await;
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0]["detail-type"], "TaskFailed");
    let detail = &got[0]["detail"];
    assert_eq!(detail["taskId"], id.to_string());
    assert_eq!(detail["workflow"], ECOMMERCE);
    assert_eq!(detail["failureCount"], 3);
    assert_eq!(detail["step"], "charge-payment");
    assert!(
        detail["lastError"]
            .as_str()
            .is_some_and(|e| e.contains("charge-payment"))
    );
    assert!(!state(&system, id).await.notice_pending()); // The metrics say the same: three recoveries by the sweep, one failed task.
    let m = &system.metrics;
    let order = ("Workflow", "ecommerce-order");
    assert_eq!(m.sum("Recoveries", &[order, ("Cause", "sweep")]), 3.0);
    assert_eq!(m.sum("Recoveries", &[("Cause", "pickup")]), 0.0);
    assert_eq!(m.sum("TasksFailed", &[order]), 1.0);
    assert_eq!(m.sum("SweepsCompleted", &[]), 3.0);
}

#[tokio::test]
async fn a_refusal_compensates_and_ends_refused_with_its_own_event_and_no_alert() {
    let mut settings = manual_settings();
    // Even with automatic compensation off: a refusal is a business outcome, not a failure
    // waiting for a person.
    settings.policy.auto_compensate = false;
    let refuses = Faults {
        permanent_rate: 1.0,
        ..Faults::default()
    };
    settings.faults.insert("shipping".into(), refuses);
    let (system, _clock) = aws_system("permanent", settings).await;
    let events = subscribe(&system, &["TaskFailed", "TaskRefused"]).await;
    let id = submit_ok(&system).await;
    pump_until_quiet(&system, 20).await;
    let r = state(&system, id).await;
    assert_eq!(r.process_state, ProcessState::Refused, "{r:?}");
    assert_eq!(r.failure_count, 0);
    assert_eq!(r.steps[2].status, StepStatus::Failed);
    assert_eq!(
        r.steps[..2].iter().map(|s| s.undo).collect::<Vec<_>>(),
        [Some(StepStatus::Done); 2],
        "the steps that took effect are undone"
    );
    let refusal = r.refusal.clone().expect("the refusal is kept");
    assert_eq!(refusal.step, "arrange-shipping");
    let got = wait_for_messages(&system, &events, 1).await;
    assert_eq!(
        got.iter()
            .map(|e| (e["detail-type"].clone(), e["detail"]["taskId"].clone()))
            .collect::<Vec<_>>(),
        [(json!("TaskRefused"), json!(id))],
        "TaskRefused, and no TaskFailed alert"
    );
}

#[tokio::test]
async fn a_submission_that_dies_before_enqueueing_is_recovered_by_the_supervisor() {
    let (mut system, clock) = aws_system("lostwork", manual_settings()).await;
    // The submission's enqueue fails (as if it died right after its transaction).
    system.api.ports.work_queue_url = format!("{}-gone", system.resources.work_queue_url);
    let id = submit_ok(&system).await;
    assert_eq!(
        system.pump_scheduler().await.expect("poll"),
        0,
        "nothing enqueued"
    );
    assert_eq!(system.sweep().await.expect("sweep").due, 0, "not due yet");

    clock.advance(chrono::Duration::seconds(61));
    let report = system.sweep().await.expect("sweep");
    assert_eq!(report.requeued, 1, "{report:?}");
    assert_eq!(
        system.metrics.sum(
            "Recoveries",
            &[("Workflow", "ecommerce-order"), ("Cause", "pickup")]
        ),
        1.0,
        "a task never picked up is a pickup recovery"
    );
    let r = state(&system, id).await;
    assert_eq!(r.failure_count, 0, "a lost message is not a task failure");
    pump_until_quiet(&system, 20).await;
    assert_eq!(
        state(&system, id).await.process_state,
        ProcessState::Processed
    );
    assert_each_step_once(&system, id).await;
}

/// The task API claims a new task's first step itself: the record is created claimed (by the
/// submission's instance, under attempt 1, with the step's deadline and the task's timer), the
/// step's request is sent, and no work message is: the scheduler's first invocation and claim
/// are saved. The task then runs as any other. A delayed start still takes the work message.
#[tokio::test]
async fn a_submission_claims_the_first_step_and_sends_its_request_with_no_work_message() {
    let settings = sas_local::Settings {
        dispatch_at_submission: true,
        ..manual_settings()
    };
    let (system, _clock) = aws_system("firstclaim", settings).await;
    let res = &system.resources;
    let (status, body) = submit(&system, ECOMMERCE, None, &order_input()).await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["processState"], "Processing", "{body}");
    let id: TaskId = body["taskId"].as_str().expect("id").parse().expect("uuid");
    let r = state(&system, id).await;
    assert_eq!(r.process_state, ProcessState::Processing);
    assert_eq!(r.attempt, 1);
    assert!(
        r.locked_by
            .as_deref()
            .is_some_and(|l| l.starts_with("local-submission-")),
        "locked by the submission: {:?}",
        r.locked_by
    );
    assert_eq!(r.steps[0].status, StepStatus::Running);
    assert!(r.steps[0].sent, "its request went out");
    assert_eq!(
        r.timer_at, r.complete_by,
        "the task's timer watches the step"
    );
    assert_valid(&system, &r).await;
    assert!(
        drain(&system, &res.work_queue_url).await.is_empty(),
        "no work message"
    );
    let (raw, request) = one_step_request(&system, "the first step's request").await;
    assert_eq!(
        (request.task_id, request.step.as_str(), request.attempt),
        (id, "reserve-inventory", 1)
    );
    assert_eq!(request.input, Some(order_input()), "the mapped input");
    system
        .queue
        .send(&res.agent_queue_url, &raw, Duration::ZERO)
        .await
        .expect("send it on");
    pump_until_quiet(&system, 20).await;
    assert_eq!(
        state(&system, id).await.process_state,
        ProcessState::Processed
    );
    assert_each_step_once(&system, id).await;

    // A delayed start is claimed by the scheduler, at its time.
    let later = (chrono::Utc::now() + chrono::Duration::minutes(5)).to_rfc3339();
    let (status, _, body) = sas_blackbox::post_task(
        &system,
        ECOMMERCE,
        &[("start-at", later.as_str())],
        order_input().to_string().as_bytes(),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["processState"], "Pending", "{body}");
    assert!(
        drain(&system, &res.agent_queue_url).await.is_empty(),
        "no request before its start"
    );
}

/// A submission that dies after its create and before its first step's request (the agents'
/// queue gone here): the record is claimed, with the step's deadline in the due index, and the
/// supervisor takes it up at that deadline, as any step whose request went missing.
#[tokio::test]
async fn a_submission_that_dies_before_sending_its_first_request_is_recovered_at_the_deadline() {
    let settings = sas_local::Settings {
        dispatch_at_submission: true,
        ..manual_settings()
    };
    let (mut system, clock) = aws_system("lostfirst", settings).await;
    let dispatch = system.api.dispatch.as_deref().expect("dispatch").clone();
    system.api.dispatch = Some(std::sync::Arc::new(
        sas::handlers::scheduler::SchedulerDeps {
            agent_queue_url: format!("{}-gone", system.resources.agent_queue_url),
            ..dispatch
        },
    ));
    // Stored, so accepted.
    let id = submit_ok(&system).await;
    assert_eq!(
        state(&system, id).await.process_state,
        ProcessState::Processing
    );
    assert!(
        drain(&system, &system.resources.agent_queue_url)
            .await
            .is_empty()
    );
    assert!(
        drain(&system, &system.resources.work_queue_url)
            .await
            .is_empty()
    );
    assert_eq!(
        system.sweep().await.expect("sweep").retried,
        0,
        "not due yet"
    );

    clock.advance(chrono::Duration::seconds(31));
    let report = system.sweep().await.expect("sweep");
    assert_eq!(report.retried, 1, "{report:?}");
    assert_eq!(
        state(&system, id).await.failure_count,
        1,
        "a missed deadline"
    );
    pump_until_quiet(&system, 20).await;
    assert_eq!(
        state(&system, id).await.process_state,
        ProcessState::Processed
    );
    assert_each_step_once(&system, id).await;
}

#[tokio::test]
async fn the_same_work_message_and_the_same_reply_twice_take_effect_once() {
    let (system, _clock) = aws_system("dupes", manual_settings()).await;
    let id = submit_ok(&system).await;
    let res = &system.resources;

    let work = receive_now(&system, &res.work_queue_url).await;
    assert_eq!(work.len(), 1);
    for _ in 0..2 {
        let resp = sas::handlers::scheduler::handle(&system.scheduler, sqs_event(&work)).await;
        assert!(resp.batch_item_failures.is_empty());
    }
    assert_eq!(state(&system, id).await.attempt, 1, "claimed once");
    let (raw, request) = one_step_request(&system, "one step request").await;
    assert_eq!(
        (request.service.as_str(), request.step.as_str()),
        ("inventory", "reserve-inventory")
    );
    assert_eq!(request.task_id, id);
    assert_eq!(request.workflow, ECOMMERCE);
    assert_eq!(request.input, Some(order_input()), "the mapped input");
    // Deliver the step request again, as SQS may.
    let redeliver = || {
        system
            .queue
            .send(&res.agent_queue_url, &raw, Duration::ZERO)
    };
    redeliver().await.expect("requeue");

    system.pump_agents().await.expect("agent");
    let replies = receive_now(&system, &res.reply_queue_url).await;
    assert_eq!(replies.len(), 1);
    for _ in 0..2 {
        sas::handlers::scheduler::handle(&system.scheduler, sqs_event(&replies)).await;
    }
    let r = state(&system, id).await;
    assert_eq!(r.step_index, 1, "the reply counted once");
    assert_eq!(r.attempt, request.attempt);
    let (_, next) = one_step_request(&system, "one request for the next step").await;
    assert_eq!(
        (next.service.as_str(), next.step.as_str()),
        ("payment", "charge-payment")
    );
    // The duplicate agent run hits the service again with the same key: one effect.
    redeliver().await.expect("requeue");
    system.pump_agents().await.expect("agent");
    assert_eq!(effects(&system, "inventory", id).values().sum::<u32>(), 1);
}

#[tokio::test]
async fn a_stale_reply_after_a_recovery_is_dropped() {
    let (system, clock) = aws_system("stale", manual_settings()).await;
    let id = submit_ok(&system).await;
    system.pump_scheduler().await.expect("claim");
    let first: StepRequest =
        serde_json::from_str(&drain(&system, &system.resources.agent_queue_url).await[0])
            .expect("request");
    clock.advance(chrono::Duration::seconds(31));
    assert_eq!(system.sweep().await.expect("sweep").retried, 1);
    system.pump_scheduler().await.expect("reclaim");
    assert_eq!(state(&system, id).await.attempt, 2);

    // The first attempt's agent answers late.
    let stale = SchedulerMessage::Reply(StepReply {
        result_ref: None,
        task_id: id,
        step: first.step.clone(),
        step_index: first.step_index,
        attempt: first.attempt,
        undo: false,
        outcome: StepOutcome::succeeded(),
        generation: None,
    });
    system
        .queue
        .send(
            &system.resources.reply_queue_url,
            &serde_json::to_string(&stale).expect("json"),
            Duration::ZERO,
        )
        .await
        .expect("send");
    let before = state(&system, id).await;
    assert_eq!(system.pump_scheduler().await.expect("poll"), 1);
    let after = state(&system, id).await;
    assert_eq!(before, after, "the stale reply changed nothing");
    assert_eq!(after.steps[0].status, StepStatus::Running);
    assert!(
        drain(&system, &system.resources.dead_letter_url)
            .await
            .is_empty(),
        "a stale reply is dropped, not dead-lettered"
    );
}

#[tokio::test]
async fn two_supervisors_racing_recover_a_record_once() {
    let (system, clock) = aws_system("race", manual_settings()).await;
    let id = submit_ok(&system).await;
    system.pump_scheduler().await.expect("claim");
    drain(&system, &system.resources.agent_queue_url).await;
    clock.advance(chrono::Duration::seconds(31));
    let other = system.supervisor.clone();
    let (a, b) = tokio::join!(
        sas::handlers::supervisor::sweep(&system.supervisor),
        sas::handlers::supervisor::sweep(&other)
    );
    let (a, b) = (a.expect("sweep a"), b.expect("sweep b"));
    assert_eq!(a.retried + b.retried, 1, "{a:?} {b:?}");
    let r = state(&system, id).await;
    assert_eq!(r.failure_count, 1);
    assert_eq!(
        drain(&system, &system.resources.work_queue_url).await.len(),
        1,
        "one re-enqueue"
    );
}

#[tokio::test]
async fn idempotent_submission_returns_the_first_task_and_refuses_another_request() {
    let (system, _clock) = aws_system("idem", manual_settings()).await;
    let (s1, b1) = submit(&system, ECOMMERCE, Some("key-1"), &order_input()).await;
    let (s2, b2) = submit(&system, ECOMMERCE, Some("key-1"), &order_input()).await;
    assert_eq!((s1, s2), (202, 202), "{b1} {b2}");
    assert_eq!(b1["taskId"], b2["taskId"]);
    assert_eq!(b2["workflow"], ECOMMERCE);
    let mut other = order_input();
    other["customerId"] = json!("someone-else");
    let (s3, b3) = submit(&system, ECOMMERCE, Some("key-1"), &other).await;
    assert_eq!(s3, 409, "{b3}");
    assert_eq!(b3["error"]["code"], "idempotency_key_reused");
    // A key names one request, whatever the workflow.
    let (s4, b4) = submit(&system, LOAN, Some("key-1"), &loan_input()).await;
    assert_eq!(s4, 409, "{b4}");
    assert_eq!(b4["error"]["code"], "idempotency_key_reused");
    // One task, one state record, one key; one work message.
    assert_eq!(task_items(&system).await, 3);
    assert_eq!(
        drain(&system, &system.resources.work_queue_url).await.len(),
        1
    );
}

/// An operator's step-level actions on a task that failed at its payment (the payment service
/// down until the threshold): compensation from the first step records the payment as settled
/// by hand and undoes only the reservation; on a twin task, a retry on a new input is refused
/// because the timed-out payment may have taken effect under its key.
#[tokio::test]
async fn compensation_from_a_step_and_a_retry_on_a_new_input_keep_their_rules() {
    let settings = sas_blackbox::down_until_an_operator("payment");
    let (system, clock) = aws_system("stepops", settings).await;
    let ids = [submit_ok(&system).await, submit_ok(&system).await];
    for round in 1..=3u32 {
        claim_then_miss_the_deadline(&system, &clock, round).await;
        system.pump_agents().await.expect("payment");
        system.sweep().await.expect("sweep");
    }
    for id in ids {
        let r = state(&system, id).await;
        assert_eq!(
            (r.process_state, r.current_step()),
            (ProcessState::Error, Some("charge-payment")),
            "{r:?}"
        );
    }
    let [first, second] = ids;
    let card = json!({"customerId": "c-42", "items": [{"sku": "SKU-1", "quantity": 1}]});
    let new_card = json!({"reason": "new card", "input": card});
    let retry = format!("/tasks/{second}/retry-with-input");
    let (status, body) = sas_blackbox::operator_json(&system, &retry, &new_card).await;
    assert_eq!(status, 409, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("may have taken effect")),
        "{body}"
    );
    let compensate = format!("/tasks/{first}/compensate-from");
    let nope = json!({"reason": "no charge at the bank", "fromStep": "nope"});
    let (status, body) = sas_blackbox::operator_json(&system, &compensate, &nope).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("validation_failed")),
        "{body}"
    );
    let from_first = json!({"reason": "no charge at the bank", "fromStep": "reserve-inventory"});
    let (status, body) = sas_blackbox::operator_json(&system, &compensate, &from_first).await;
    assert_eq!(status, 202, "{body}");
    pump_until_quiet(&system, 30).await;
    let r = state(&system, first).await;
    assert_eq!(r.process_state, ProcessState::Compensated, "{r:?}");
    assert_eq!(
        r.steps[1].undo,
        Some(StepStatus::Done),
        "the payment settled by hand"
    );
    let payment = system.services.get("payment").stats();
    assert!(
        payment.effects.is_empty(),
        "no refund was asked for: {payment:?}"
    );
    let inventory = system.services.get("inventory").stats();
    assert_eq!(
        inventory.net.values().sum::<i32>(),
        1,
        "the first order's reservation undone, the second's kept: {inventory:?}"
    );
}

/// An order whose payment step reads a card the input may lack: without it the step's request
/// cannot be built and the task waits in Error for an operator's retry on a new input.
const PATCHED_ORDER: &str = r#"
name: patched-order
input:
  type: object
  additionalProperties: false
  required: [customerId, items]
  properties:
    customerId: {type: string}
    items: {type: array}
    card: {type: string}
steps:
  - name: reserve-inventory
    service: inventory
    input: {customerId: $.input.customerId, items: $.input.items}
    undo:
      action: release-inventory
      input: {reservation: "$.steps['reserve-inventory'].result.id", items: $.input.items}
  - name: charge-payment
    service: payment
    input: {card: $.input.card}
"#;

#[tokio::test]
async fn a_retry_on_a_new_input_leaves_the_steps_that_ran_and_their_undos_on_the_input_they_ran_with()
 {
    let mut settings = manual_settings();
    settings.policy.auto_compensate = false;
    let system = memory_system(settings).await;
    system
        .publish(&[("patched-order.yaml".into(), PATCHED_ORDER.into())])
        .await
        .expect("published");
    let first = json!({"customerId": "c-1", "items": [{"sku": "A", "quantity": 1}]});
    let id = submit_task(&system, "patched-order", &first).await;
    pump_until_quiet(&system, 20).await;
    let r = state(&system, id).await;
    assert_eq!(
        (r.process_state, r.current_step()),
        (ProcessState::Error, Some("charge-payment")),
        "{r:?}"
    );

    // The operator fixes the input: another item list, and the card.
    let second =
        json!({"customerId": "c-1", "items": [{"sku": "B", "quantity": 9}], "card": "4242"});
    let retry = format!("/tasks/{id}/retry-with-input");
    let card_added = json!({"reason": "card added", "input": second});
    let (status, body) = sas_blackbox::operator_json(&system, &retry, &card_added).await;
    assert_eq!(status, 202, "{body}");
    // The payment service declines: the order is compensated.
    system.services.get("payment").set_faults(Faults {
        permanent_rate: 1.0,
        ..Faults::default()
    });
    pump_until_quiet(&system, 20).await;
    let r = state(&system, id).await;
    assert_eq!(r.process_state, ProcessState::Refused, "{r:?}");

    let inventory = system.services.get("inventory").stats().requests;
    let input_of = |action: &str| {
        inventory
            .iter()
            .find(|a| a.action == action && a.key.starts_with(&id.to_string()))
            .map(|a| a.input["items"].clone())
    };
    assert_eq!(input_of("reserve-inventory"), Some(first["items"].clone()));
    assert_eq!(
        input_of("release-inventory"),
        Some(first["items"].clone()),
        "the undo releases what the step reserved, not the new input's items"
    );

    // The operator's view shows both inputs, and each step with the one it ran with.
    let (status, view) =
        operator_call(&system, http::Method::GET, &format!("/tasks/{id}"), b"").await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["input"], second, "{view}");
    assert_eq!(view["inputRevision"], 1, "{view}");
    assert_eq!(
        view["earlierInputs"],
        json!([{"revision": 0, "input": first}]),
        "{view}"
    );
    assert_eq!(view["steps"][0]["inputRevision"], 0, "{view}");
    assert_eq!(view["steps"][0]["input"]["items"], first["items"], "{view}");
    assert_eq!(
        view["steps"][0]["undoInput"]["items"], first["items"],
        "{view}"
    );
    assert_eq!(view["steps"][1]["input"]["card"], "4242", "{view}");
}
