//! Black-box tests of the whole flow on the AWS API emulator, through the handlers' real inputs:
//! HTTP requests, SQS events built from messages received from the emulator's queues, and
//! scheduled events for the supervisor.

use sas::local::{System, sqs_event};
use sas::messages::{SchedulerMessage, StepReply, StepRequest};
use sas::remote::Faults;
use sas::transition::StepOutcome;
use sas::{OrderId, ProcessState, StepStatus};
use sas_blackbox::{
    aws_system, drain, manual_settings, order_body, pump_until_quiet, state, submit, submit_ok,
    subscribe, wait_for_messages,
};
use serde_json::{Value, json};
use std::time::Duration;

/// Every step of the order took effect exactly once on its service.
fn assert_each_step_once(system: &System, id: OrderId) {
    for (agent, step) in [
        ("inventory", "reserve-inventory"),
        ("payment", "charge-payment"),
        ("shipping", "arrange-shipping"),
    ] {
        let effects = system.services[agent].effects_for(&id.to_string());
        assert_eq!(effects.len(), 1, "{step}: one key, got {effects:?}");
        let (key, count) = effects.iter().next().expect("one");
        assert!(key.contains(step), "{key}");
        assert_eq!(*count, 1, "{step} took effect {count} times");
    }
}

#[tokio::test]
async fn an_order_submitted_over_http_runs_to_processed_with_every_step_once() {
    let (mut system, _clock) = aws_system("happy", manual_settings()).await;
    let events = subscribe(&system, &["OrderProcessed", "OrderFailed"]).await;
    let addr = system
        .serve("127.0.0.1:0".parse().expect("addr"))
        .await
        .expect("serve");
    system.start();
    let http = reqwest::Client::new();
    let resp = http
        .post(format!("http://{addr}/orders"))
        .json(&order_body())
        .send()
        .await
        .expect("POST");
    assert_eq!(resp.status(), 202);
    let body: Value = resp.json().await.expect("JSON");
    let id: OrderId = body["orderId"].as_str().expect("id").parse().expect("uuid");

    let mut view = Value::Null;
    for _ in 0..150 {
        view = http
            .get(format!("http://{addr}/orders/{id}"))
            .send()
            .await
            .expect("GET")
            .json()
            .await
            .expect("JSON");
        if view["processState"] == "Processed" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(view["processState"], "Processed", "{view}");
    assert_eq!(view["lockedBy"], Value::Null);
    assert_eq!(view["failureCount"], 0);
    let steps = view["steps"].as_array().expect("steps");
    assert!(steps.iter().all(|s| s["status"] == "Done"), "{view}");
    assert_each_step_once(&system, id);

    let got = wait_for_messages(&system, &events, 1).await;
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0]["detail-type"], "OrderProcessed");
    assert_eq!(got[0]["detail"]["orderId"], id.to_string());
    let final_state = state(&system, id).await;
    assert!(!final_state.notice_pending(), "the outbox flag is cleared");
    system.shutdown().await;
}

#[tokio::test]
async fn transient_faults_and_lost_responses_are_retried_to_processed_once() {
    let mut settings = manual_settings();
    for agent in ["inventory", "payment", "shipping"] {
        settings.faults.insert(
            agent.into(),
            Faults {
                transient_rate: 0.4,
                lost_response_rate: 0.4,
                ..Faults::default()
            },
        );
    }
    let (system, _clock) = aws_system("transient", settings).await;
    let mut ids = Vec::new();
    for _ in 0..4 {
        ids.push(submit_ok(&system).await);
    }
    pump_until_quiet(&system, 40).await;
    for id in ids {
        let r = state(&system, id).await;
        assert_eq!(r.process_state, ProcessState::Processed, "{r:?}");
        assert_eq!(r.failure_count, 0, "agents absorbed the faults");
        assert_each_step_once(&system, id);
    }
    let faults: u64 = system
        .services
        .values()
        .map(|s| s.stats().transient_faults)
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
    assert!(system.services["inventory"].stats().effects.is_empty());

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
    assert_each_step_once(&system, id);
}

#[tokio::test]
async fn failures_up_to_the_threshold_end_in_error_with_an_order_failed_event() {
    let mut settings = manual_settings();
    settings.policy.auto_compensate = false;
    let forever = chrono::Utc::now() - chrono::Duration::hours(1);
    settings.faults.insert(
        "payment".into(),
        Faults {
            outage: Some((forever, forever + chrono::Duration::days(1))),
            ..Faults::default()
        },
    );
    let (system, clock) = aws_system("threshold", settings).await;
    let alerts = subscribe(&system, &["OrderFailed"]).await;
    let id = submit_ok(&system).await;
    for round in 1..=3u32 {
        // Claim (on the first round inventory is reserved and payment requested), then the
        // payment agent only gets to run after the deadline and stops without a reply.
        system.pump_scheduler().await.expect("poll");
        if round == 1 {
            system.pump_agents().await.expect("inventory");
            system.pump_scheduler().await.expect("reply");
        }
        clock.advance(chrono::Duration::seconds(31));
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
    assert!(system.services["payment"].stats().effects.is_empty());

    let got = wait_for_messages(&system, &alerts, 1).await;
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0]["detail-type"], "OrderFailed");
    let detail = &got[0]["detail"];
    assert_eq!(detail["orderId"], id.to_string());
    assert_eq!(detail["failureCount"], 3);
    assert_eq!(detail["step"], "charge-payment");
    assert!(
        detail["lastError"]
            .as_str()
            .is_some_and(|e| e.contains("charge-payment"))
    );
    assert!(!state(&system, id).await.notice_pending());
}

#[tokio::test]
async fn a_permanent_fault_fails_the_order_at_once_with_an_alert() {
    let mut settings = manual_settings();
    settings.policy.auto_compensate = false;
    settings.faults.insert(
        "shipping".into(),
        Faults {
            permanent_rate: 1.0,
            ..Faults::default()
        },
    );
    let (system, _clock) = aws_system("permanent", settings).await;
    let alerts = subscribe(&system, &["OrderFailed"]).await;
    let id = submit_ok(&system).await;
    pump_until_quiet(&system, 20).await;
    let r = state(&system, id).await;
    assert_eq!(r.process_state, ProcessState::Error);
    assert_eq!(r.failure_count, 0);
    assert_eq!(r.steps[2].status, StepStatus::Failed);
    let got = wait_for_messages(&system, &alerts, 1).await;
    assert_eq!(
        got.first().map(|e| e["detail"]["orderId"].clone()),
        Some(json!(id))
    );
}

#[tokio::test]
async fn a_submission_that_dies_before_enqueueing_is_recovered_by_the_supervisor() {
    let (mut system, clock) = aws_system("lostwork", manual_settings()).await;
    // The submission's enqueue fails (as if it died right after its transaction).
    system.submission.work_queue_url = format!("{}-gone", system.resources.work_queue_url);
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
    let r = state(&system, id).await;
    assert_eq!(r.failure_count, 0, "a lost message is not a task failure");
    pump_until_quiet(&system, 20).await;
    assert_eq!(
        state(&system, id).await.process_state,
        ProcessState::Processed
    );
    assert_each_step_once(&system, id);
}

#[tokio::test]
async fn the_same_work_message_and_the_same_reply_twice_take_effect_once() {
    let (system, _clock) = aws_system("dupes", manual_settings()).await;
    let id = submit_ok(&system).await;
    let res = &system.resources;

    let work = system
        .queue
        .receive(&res.work_queue_url, 10, Duration::ZERO)
        .await
        .expect("receive");
    assert_eq!(work.len(), 1);
    for _ in 0..2 {
        let resp = sas::handlers::scheduler::handle(&system.scheduler, sqs_event(&work)).await;
        assert!(resp.batch_item_failures.is_empty());
    }
    assert_eq!(state(&system, id).await.attempt, 1, "claimed once");
    let requests = drain(&system, &res.agent_queue_urls["inventory"]).await;
    assert_eq!(requests.len(), 1, "one step request");
    let request: StepRequest = serde_json::from_str(&requests[0]).expect("request");
    // Deliver the step request again, as SQS may.
    let redeliver = || {
        system.queue.send(
            &res.agent_queue_urls["inventory"],
            &requests[0],
            Duration::ZERO,
        )
    };
    redeliver().await.expect("requeue");

    system.pump_agents().await.expect("agent");
    let replies = system
        .queue
        .receive(&res.reply_queue_url, 10, Duration::ZERO)
        .await
        .expect("receive");
    assert_eq!(replies.len(), 1);
    for _ in 0..2 {
        sas::handlers::scheduler::handle(&system.scheduler, sqs_event(&replies)).await;
    }
    let r = state(&system, id).await;
    assert_eq!(r.step_index, 1, "the reply counted once");
    assert_eq!(r.attempt, request.attempt);
    assert_eq!(
        drain(&system, &res.agent_queue_urls["payment"]).await.len(),
        1,
        "one request for the next step"
    );
    // The duplicate agent run hits the remote again with the same key: one effect.
    redeliver().await.expect("requeue");
    system.pump_agents().await.expect("agent");
    assert_eq!(
        system.services["inventory"]
            .effects_for(&id.to_string())
            .values()
            .sum::<u32>(),
        1
    );
}

#[tokio::test]
async fn a_stale_reply_after_a_recovery_is_dropped() {
    let (system, clock) = aws_system("stale", manual_settings()).await;
    let id = submit_ok(&system).await;
    system.pump_scheduler().await.expect("claim");
    let first: StepRequest = serde_json::from_str(
        &drain(&system, &system.resources.agent_queue_urls["inventory"]).await[0],
    )
    .expect("request");
    clock.advance(chrono::Duration::seconds(31));
    assert_eq!(system.sweep().await.expect("sweep").retried, 1);
    system.pump_scheduler().await.expect("reclaim");
    assert_eq!(state(&system, id).await.attempt, 2);

    // The first attempt's agent answers late.
    let stale = SchedulerMessage::Reply(StepReply {
        order_id: id,
        step: first.step.clone(),
        step_index: first.step_index,
        attempt: first.attempt,
        undo: false,
        outcome: StepOutcome::succeeded(),
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
    drain(&system, &system.resources.agent_queue_urls["inventory"]).await;
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
async fn idempotent_submission_returns_the_first_order_and_refuses_another_body() {
    let (system, _clock) = aws_system("idem", manual_settings()).await;
    let (s1, b1) = submit(&system, Some("key-1"), &order_body()).await;
    let (s2, b2) = submit(&system, Some("key-1"), &order_body()).await;
    assert_eq!((s1, s2), (202, 202));
    assert_eq!(b1["orderId"], b2["orderId"]);
    let mut other = order_body();
    other["customerId"] = json!("someone-else");
    let (s3, b3) = submit(&system, Some("key-1"), &other).await;
    assert_eq!(s3, 409, "{b3}");
    assert_eq!(b3["error"]["code"], "idempotency_key_reused");
    // One order, one state record, one key; one work message.
    assert_eq!(sas_blackbox::item_count(&system).await, 3);
    assert_eq!(
        drain(&system, &system.resources.work_queue_url).await.len(),
        1
    );
}
