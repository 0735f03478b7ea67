//! Recovery in depth, on the AWS API emulator: compensation (undo in reverse order, each undo
//! once), a failing undo, the operator's loop over HTTP with `sasctl` (list by state and
//! workflow, show, retry, concurrent retries, cancel mid-flight, watch), and status messages
//! to the submitter.

use clap::Parser;
use sas::remote::Faults;
use sas::{ProcessState, StepStatus, TaskId};
use sas_blackbox::{
    ECOMMERCE, LOAN, aws_system, drain, manual_settings, net, order_input, post_task,
    pump_until_quiet, state, submit_loan, subscribe, wait_for_messages, waive_cooling_off,
};
use sas_local::System;
use sas_local::provision;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// A queue of the submitting application (named as the deployment's reply-queue pattern and
/// the IAM policies require).
async fn client_queue(system: &System) -> String {
    let sqs = aws_sdk_sqs::Client::new(&sas_blackbox::sdk_config().await);
    let name = format!(
        "{}{}",
        sas_local::LOCAL_REPLY_PREFIX,
        sas_blackbox::unique("c")
    );
    let url = provision::create_queue(&sqs, &name, None, Default::default())
        .await
        .expect("client queue");
    drain(system, &url).await;
    url
}

/// Submits an e-commerce order, with its status messages sent to `reply_queue_url` if given.
async fn submit_to(system: &System, reply_queue_url: Option<&str>) -> TaskId {
    let input = json!({"customerId": "c-7", "items": [{"sku": "SKU-9", "quantity": 1}]});
    let headers: Vec<(&str, &str)> = reply_queue_url
        .map(|u| ("reply-queue-url", u))
        .into_iter()
        .collect();
    let (status, _, answer) =
        post_task(system, ECOMMERCE, &headers, input.to_string().as_bytes()).await;
    assert_eq!(status, 202, "{answer}");
    answer["taskId"]
        .as_str()
        .expect("taskId")
        .parse()
        .expect("uuid")
}

/// Net effect and applied keys of task `id` at service `service`.
fn effects(system: &System, service: &str, id: TaskId) -> (Vec<i32>, Vec<(String, u32)>) {
    let net = net(system, service, id).into_values().collect();
    let mut applied: Vec<(String, u32)> = sas_blackbox::effects(system, service, id)
        .into_iter()
        .collect();
    applied.sort();
    (net, applied)
}

/// Serves the system's API (operator routes on) and returns `sasctl`'s client for it.
async fn operator(system: &mut System) -> sasctl::Client {
    let addr = sas_blackbox::serve_system(system).await;
    sasctl::Client::new(format!("http://{addr}/operator").parse().expect("url")).expect("client")
}

/// Runs `sasctl` with `args` against the operator API `ops` serves: its exit code, stdout and
/// stderr (a command line clap refuses: 2 and clap's message).
async fn sasctl_at(ops: &sasctl::Client, args: &[&str]) -> (i32, String, String) {
    let mut argv = vec!["sasctl", "--endpoint", ops.base().as_str()];
    argv.extend_from_slice(args);
    let cli = match sasctl::Cli::try_parse_from(argv) {
        Ok(cli) => cli,
        Err(e) => return (2, String::new(), e.to_string()),
    };
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = sasctl::run_with(cli, &mut out, &mut err)
        .await
        .expect("runs");
    (
        code,
        String::from_utf8_lossy(&out).into_owned(),
        String::from_utf8_lossy(&err).into_owned(),
    )
}

/// A served in-memory system (manual compensation) where the bank refuses every payout, with
/// `n` loans waiting in Error past their pivot, and an operator client.
async fn loans_in_error(n: usize) -> (System, sasctl::Client, Vec<TaskId>) {
    let settings = sas_blackbox::faulty("core-banking", sas_blackbox::refuse(&["disburse-funds"]));
    let mut system = sas_blackbox::memory_system(settings).await;
    let ops = operator(&mut system).await;
    let mut loans = Vec::new();
    for _ in 0..n {
        loans.push(submit_loan(&system).await);
    }
    pump_until_quiet(&system, 60).await;
    waive_cooling_off(&system, &loans).await;
    for id in &loans {
        assert_eq!(state(&system, *id).await.process_state, ProcessState::Error);
    }
    (system, ops, loans)
}

/// [`sasctl_at`], with stdout and stderr as one text.
async fn sasctl_text(ops: &sasctl::Client, args: &[&str]) -> (i32, String) {
    let (code, out, err) = sasctl_at(ops, args).await;
    (code, out + &err)
}

/// The stored breaker of `service` (it must have one).
async fn breaker(system: &System, service: &str) -> sas::domain::BreakerRecord {
    system
        .store
        .get_breaker(service)
        .await
        .expect("read")
        .expect("stored")
}

/// Submits an e-commerce order through the task API (202 asserted); the answer.
async fn post_order(system: &System) -> Value {
    let order = order_input().to_string();
    let (status, _, answer) = post_task(system, ECOMMERCE, &[], order.as_bytes()).await;
    assert_eq!(status, 202, "{answer}");
    answer
}

/// A loan on the emulator (a system named `name`) that the bank's refused payout left in
/// Error past its pivot.
async fn loan_in_error_on_the_emulator(name: &str) -> (System, TaskId) {
    let settings = sas_blackbox::faulty("core-banking", sas_blackbox::refuse(&["disburse-funds"]));
    let (system, _clock) = aws_system(name, settings).await;
    let id = submit_loan(&system).await;
    pump_until_quiet(&system, 30).await;
    waive_cooling_off(&system, &[id]).await;
    assert_eq!(state(&system, id).await.process_state, ProcessState::Error);
    (system, id)
}

/// A command line's words: split at spaces, but a '…' quoted word keeps its spaces.
fn words(line: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = line.trim_start();
    while !rest.is_empty() {
        let (word, after) = match rest.strip_prefix('\'') {
            Some(quoted) => quoted.split_once('\'').expect("a closing quote"),
            None => rest.split_once(' ').unwrap_or((rest, "")),
        };
        out.push(word);
        rest = after.trim_start();
    }
    out
}

/// [`sasctl_at`] with `--json`: the document on stdout (or what was printed, if it is none).
async fn sasctl_json(ops: &sasctl::Client, args: &[&str]) -> (i32, Value) {
    let mut argv = vec!["--json"];
    argv.extend_from_slice(args);
    let (code, out, err) = sasctl_at(ops, &argv).await;
    let doc = serde_json::from_str(&out).unwrap_or_else(|_| json!({"raw": out, "err": err}));
    (code, doc)
}

/// The ids `sasctl` lists in `state` (of `workflow`, if given): one page of up to 100, each
/// row checked against the filter.
async fn listed(
    ops: &sasctl::Client,
    state: sasctl::ProcessState,
    workflow: Option<&str>,
) -> Vec<String> {
    let page = ops
        .list(&state, workflow, Some(100), None)
        .await
        .expect("list");
    for t in &page.tasks {
        assert_eq!(t.process_state, state, "{t:?}");
        if let Some(w) = workflow {
            assert_eq!(t.workflow.as_deref(), Some(w), "{t:?}");
        }
    }
    page.tasks.into_iter().map(|t| t.task_id).collect()
}

/// Whether the API refused the call with this status and code.
fn refused(r: &Result<sasctl::TaskView, sasctl::ClientError>, want: u16, want_code: &str) -> bool {
    matches!(r, Err(sasctl::ClientError::Api { status, code, .. }) if *status == want && code == want_code)
}

#[tokio::test]
async fn a_permanent_fault_at_step_three_undoes_steps_two_then_one_each_once() {
    let settings = sas_blackbox::faulty("shipping", sas_blackbox::refuse(&["arrange-shipping"]));
    let (system, _clock) = aws_system("compensate", settings).await;
    let bus = subscribe(&system, &["TaskFailed", "TaskCompensated", "TaskRefused"]).await;
    let client = client_queue(&system).await;
    let id = submit_to(&system, Some(&client)).await;
    pump_until_quiet(&system, 30).await;

    let r = sas_blackbox::refused_at(&system, id, 2).await;
    assert_eq!(r.steps[1].undo, Some(StepStatus::Done));
    assert_eq!(r.steps[0].undo, Some(StepStatus::Done));
    let undone = sas_blackbox::undone_steps(&r);
    assert_eq!(
        undone,
        ["charge-payment", "reserve-inventory"],
        "last first"
    );
    let kept = |i: usize| -> Value {
        serde_json::from_str(r.steps[i].result.as_deref().expect("kept")).expect("JSON")
    };
    for (service, step, undo) in [
        ("inventory", "reserve-inventory", "release-inventory"),
        ("payment", "charge-payment", "refund-payment"),
    ] {
        let (net, applied) = effects(&system, service, id);
        assert_eq!(net, [0], "{step} is undone");
        assert_eq!(applied.len(), 2, "{applied:?}");
        assert!(applied.iter().all(|(_, n)| *n == 1), "{applied:?}");
        assert!(
            applied.iter().any(|(k, _)| k.ends_with(undo)),
            "{applied:?}"
        );
    }
    // Each undo's request was mapped from the step's kept result.
    let requests = |service: &str| system.services.get(service).stats().requests;
    let release = requests("inventory")
        .into_iter()
        .find(|a| a.action == "release-inventory")
        .expect("released");
    assert_eq!(
        release.input,
        json!({"reservation": kept(0)["id"], "items": [{"sku": "SKU-9", "quantity": 1}]})
    );
    let refund = requests("payment")
        .into_iter()
        .find(|a| a.action == "refund-payment")
        .expect("refunded");
    assert_eq!(refund.input, json!({"payment": kept(1)["id"]}));

    let events = wait_for_messages(&system, &bus, 1).await;
    let types: Vec<_> = events.iter().map(|e| e["detail-type"].clone()).collect();
    assert_eq!(types, [json!("TaskRefused")], "a refusal pages no one");
    assert!(
        events[0]["detail"]["lastError"]
            .as_str()
            .is_some_and(|e| e.contains("arrange-shipping"))
    );
    assert!(events.iter().all(|e| e["source"] == "sas.tasks"));

    // The submitter hears every status, in order.
    let statuses = wait_for_messages(&system, &client, 4).await;
    let names: Vec<_> = statuses.iter().map(|s| s["status"].clone()).collect();
    assert_eq!(
        names,
        [
            json!("Received"),
            json!("StepCompleted"),
            json!("StepCompleted"),
            json!("Refused")
        ]
    );
    let seq: Vec<u64> = statuses
        .iter()
        .map(|s| s["sequence"].as_u64().expect("sequence"))
        .collect();
    assert!(seq.windows(2).all(|w| w[0] < w[1]), "{seq:?}");
    // Each notice's id names its task, the version that made it and its status.
    for s in &statuses {
        let want = format!(
            "{id}:{}:{}",
            s["sequence"],
            s["status"].as_str().unwrap_or("?")
        );
        assert_eq!(s["id"], json!(want), "{s}");
    }
    assert_eq!(
        events[0]["detail"]["id"], statuses[3]["id"],
        "the bus and the submitter get the same notice"
    );
    assert!(statuses.iter().all(|s| s["taskId"] == json!(id)));
    assert!(statuses.iter().all(|s| s["workflow"] == ECOMMERCE));
}

#[tokio::test]
async fn a_failing_undo_ends_in_compensation_failed_with_an_alert_and_an_operator_retry_finishes_it()
 {
    let mut settings =
        sas_blackbox::faulty("shipping", sas_blackbox::refuse(&["arrange-shipping"]));
    settings.faults.insert(
        "inventory".into(),
        sas_blackbox::refuse(&["release-inventory"]),
    );
    let (mut system, _clock) = aws_system("undofails", settings).await;
    let alerts = subscribe(&system, &["TaskCompensationFailed"]).await;
    let id = submit_to(&system, None).await;
    pump_until_quiet(&system, 30).await;
    let r = state(&system, id).await;
    assert_eq!(r.process_state, ProcessState::CompensationFailed, "{r:?}");
    assert_eq!(r.steps[1].undo, Some(StepStatus::Done));
    assert_eq!(r.steps[0].undo, Some(StepStatus::Failed));
    assert!(
        r.last_error
            .as_deref()
            .is_some_and(|e| e.contains("release-inventory"))
    );
    let got = wait_for_messages(&system, &alerts, 1).await;
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0]["detail"]["taskId"], json!(id));

    // The operator finds it (by state, and by state and workflow), fixes the service and
    // retries the undo.
    let ops = operator(&mut system).await;
    let key = id.to_string();
    let failed = sasctl::ProcessState::CompensationFailed;
    assert!(listed(&ops, failed.clone(), None).await.contains(&key));
    assert!(
        listed(&ops, failed.clone(), Some(ECOMMERCE))
            .await
            .contains(&key)
    );
    assert!(
        !listed(&ops, failed, Some(LOAN)).await.contains(&key),
        "not a loan"
    );
    system
        .services
        .get("inventory")
        .set_faults(Faults::default());
    let view = ops.retry(&key).await.expect("retry");
    assert_eq!(view.process_state, sasctl::ProcessState::Compensating);
    assert_eq!(view.task_id, key);
    assert_eq!(view.workflow.as_deref(), Some(ECOMMERCE));
    pump_until_quiet(&system, 20).await;
    let r = state(&system, id).await;
    assert_eq!(r.process_state, ProcessState::Refused, "{r:?}");
    let (net, _) = effects(&system, "inventory", id);
    assert_eq!(net, [0]);
    let (net, _) = effects(&system, "payment", id);
    assert_eq!(net, [0]);
    assert!(
        listed(&ops, sasctl::ProcessState::Refused, Some(ECOMMERCE))
            .await
            .contains(&key)
    );
}

#[tokio::test]
async fn operator_retry_of_an_error_task_reaches_processed_and_two_concurrent_retries_start_one() {
    // A refusal past the loan's pivot (the contract is signed) cannot be compensated: the task
    // waits in Error for a person.
    let (mut system, id) = loan_in_error_on_the_emulator("opretry").await;

    let ops = operator(&mut system).await;
    let key = id.to_string();
    assert!(
        listed(&ops, sasctl::ProcessState::Error, None)
            .await
            .contains(&key)
    );
    system
        .services
        .get("core-banking")
        .set_faults(Faults::default());
    let (a, b) = tokio::join!(ops.retry(&key), ops.retry(&key));
    let outcomes = [a, b];
    let started = outcomes.iter().filter(|o| o.is_ok()).count();
    assert_eq!(started, 1, "exactly one retry starts: {outcomes:?}");
    assert!(
        outcomes.iter().any(|o| refused(o, 409, "conflict")),
        "{outcomes:?}"
    );
    assert_eq!(
        system.pump_scheduler().await.expect("poll"),
        1,
        "one work message"
    );
    pump_until_quiet(&system, 20).await;
    let r = state(&system, id).await;
    assert_eq!(r.process_state, ProcessState::Processed, "{r:?}");
    assert_eq!(r.failure_count, 0);
    let (_, applied) = effects(&system, "core-banking", id);
    let paid: Vec<_> = applied
        .iter()
        .filter(|(k, _)| k.contains(":disburse-funds:"))
        .collect();
    assert_eq!(paid.len(), 1, "paid out once: {applied:?}");
    assert_eq!(paid[0].1, 1, "{applied:?}");
    assert!(paid[0].0.ends_with(":g1"), "a refused key is not reused");
    // Retrying a Processed task is refused.
    assert!(refused(&ops.retry(&key).await, 409, "conflict"));
}

#[tokio::test]
async fn cancel_mid_flight_drops_the_step_reply_and_compensates() {
    let mut settings = manual_settings();
    // Short deadlines: the undo of the step that was out waits (in real time, as an SQS
    // delay) for that step's deadline.
    settings.policy.step_timeout = chrono::Duration::seconds(2);
    settings.policy.pickup_timeout = chrono::Duration::seconds(4);
    let (mut system, _clock) = aws_system("cancel", settings).await;
    let id = submit_to(&system, None).await;
    system.pump_scheduler().await.expect("claim");
    system.pump_agents().await.expect("inventory");
    system.pump_scheduler().await.expect("payment requested");
    assert_eq!(
        state(&system, id).await.current_step(),
        Some("charge-payment")
    );

    let ops = operator(&mut system).await;
    let view = ops
        .cancel(&id.to_string(), Some("customer changed their mind"))
        .await
        .expect("cancel");
    assert_eq!(view.process_state, sasctl::ProcessState::Compensating);
    // The agent still runs the payment request it holds; its reply is dropped.
    assert_eq!(system.pump_agents().await.expect("payment"), 1);
    system.pump_scheduler().await.expect("reply");
    let r = state(&system, id).await;
    assert_eq!(r.process_state, ProcessState::Compensating);
    assert_eq!(r.steps[1].status, StepStatus::Cancelled);

    let until = Instant::now() + Duration::from_secs(15);
    while Instant::now() < until && !state(&system, id).await.process_state.is_terminal() {
        pump_until_quiet(&system, 10).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let r = state(&system, id).await;
    assert_eq!(r.process_state, ProcessState::Compensated, "{r:?}");
    assert_eq!(effects(&system, "payment", id).0, [0], "payment refunded");
    assert_eq!(
        effects(&system, "inventory", id).0,
        [0],
        "inventory released"
    );
    assert!(
        effects(&system, "shipping", id).1.is_empty(),
        "never shipped"
    );
    assert!(
        r.history
            .iter()
            .any(|h| h.reason.contains("customer changed their mind"))
    );
    // A finished task cannot be cancelled.
    assert!(refused(
        &ops.cancel(&id.to_string(), None).await,
        409,
        "conflict"
    ));
}

#[tokio::test]
async fn a_deadline_timer_recovers_an_overrun_step_without_the_sweep() {
    let mut settings = manual_settings();
    // Timers travel as real SQS delays: keep the deadline short.
    settings.policy.step_timeout = chrono::Duration::seconds(2);
    let (system, _clock) = aws_system("timers", settings).await;
    let late = submit_to(&system, None).await;
    let on_time = submit_to(&system, None).await;
    assert_eq!(system.pump_scheduler().await.expect("claims"), 2);
    // One task's step is answered in time; the other's agent never runs before the deadline.
    let agent = &system.resources.agent_queue_url;
    let requests = drain(&system, agent).await;
    assert_eq!(requests.len(), 2);
    let answered = requests
        .iter()
        .find(|b| b.contains(&on_time.to_string()))
        .expect("request");
    system
        .queue
        .send(agent, answered, Duration::ZERO)
        .await
        .expect("requeue");
    system.pump_agents().await.expect("agent");
    system.pump_scheduler().await.expect("reply");
    // The on-time task runs to the end well before its deadlines.
    pump_until_quiet(&system, 10).await;
    assert_eq!(
        state(&system, on_time).await.process_state,
        ProcessState::Processed
    );
    assert_eq!(
        system.pump_timers().await.expect("timers"),
        0,
        "not yet due"
    );

    // One timer per task on a line: the late task's, and the on-time task's (its later steps'
    // deadlines come after the one armed at its claim: they arm none).
    let until = Instant::now() + Duration::from_secs(10);
    let mut fired = 0;
    while Instant::now() < until {
        fired += system.pump_timers().await.expect("timers");
        tokio::time::sleep(Duration::from_millis(100)).await;
        if fired >= 2 && state(&system, late).await.failure_count == 1 {
            break;
        }
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    fired += system.pump_timers().await.expect("timers");
    assert_eq!(fired, 2, "one timer a task arrived");
    let r = state(&system, late).await;
    assert_eq!(r.process_state, ProcessState::Pending, "{r:?}");
    assert_eq!(r.failure_count, 1, "recovered by its timer, no sweep ran");
    let r = state(&system, on_time).await;
    assert_eq!(r.process_state, ProcessState::Processed);
    assert_eq!(r.failure_count, 0, "a finished step's timers are no-ops");
}

#[tokio::test]
async fn the_one_timer_of_a_task_is_armed_again_for_the_step_out_and_recovers_it() {
    let mut settings = manual_settings();
    // (Wide enough that the answer below is applied within the first step's time on a loaded
    // machine: 0.5 s was not, on a fresh run beside the bootstraps' build.)
    settings.policy.step_timeout = chrono::Duration::seconds(4);
    let (system, _clock) = aws_system("rearm", settings).await;
    let id = submit_to(&system, None).await;
    assert_eq!(system.pump_scheduler().await.expect("claims"), 1);
    // The first step is answered two and a half seconds later: the second step's deadline
    // comes after the timer the claim armed, so it arms none.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    system.pump_agents().await.expect("agent");
    system.pump_scheduler().await.expect("reply");
    let r = state(&system, id).await;
    assert_eq!((r.step_index, r.steps[1].status), (1, StepStatus::Running));
    assert!(
        r.timer_at < r.complete_by,
        "{:?} {:?}",
        r.timer_at,
        r.complete_by
    );
    // Its agent dies: the request is lost.
    let lost = drain(&system, &system.resources.agent_queue_url).await;
    assert_eq!(lost.len(), 1);
    // The timer arrives with the second step out, is armed again for its deadline, and
    // recovers it there (no sweep runs here).
    let until = Instant::now() + Duration::from_secs(10);
    let mut fired = 0;
    while Instant::now() < until && state(&system, id).await.failure_count == 0 {
        fired += system.pump_timers().await.expect("timers");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let r = state(&system, id).await;
    assert_eq!(
        r.failure_count, 1,
        "recovered by the timer armed again: {r:?}"
    );
    assert_eq!(r.process_state, ProcessState::Pending);
    assert!(
        fired >= 2,
        "the claim's timer, then the one armed again: {fired}"
    );
}

#[tokio::test]
async fn a_for_eachs_one_timer_is_armed_again_for_the_element_out_and_recovers_it() {
    let mut settings = manual_settings();
    settings.policy.step_timeout = chrono::Duration::seconds(2);
    settings.definitions.push((
        "one-at-a-time.yaml".into(),
        "name: one-at-a-time\nsteps:\n  - name: reserve\n    service: inventory\n    \
         forEach: $.input.items\n    maxConcurrency: 1\n"
            .into(),
    ));
    let (system, _clock) = aws_system("rearm-each", settings).await;
    let (status, _, answer) =
        post_task(&system, "one-at-a-time", &[], br#"{"items": [1, 2]}"#).await;
    assert_eq!(status, 202, "{answer}");
    let id: TaskId = answer["taskId"]
        .as_str()
        .expect("id")
        .parse()
        .expect("uuid");
    assert_eq!(system.pump_scheduler().await.expect("claims"), 1);
    // The first element is answered a second and a half later: the second's deadline comes
    // after the timer the claim armed, so it arms none.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    system.pump_agents().await.expect("agent");
    system.pump_scheduler().await.expect("reply");
    let r = state(&system, id).await;
    let out = r
        .fanout
        .as_ref()
        .map(|f| f.branches.iter().filter(|b| b.is_out()).count());
    assert_eq!(out, Some(1), "the second element out: {r:?}");
    assert!(r.timer_at < r.timer_deadline(), "{r:?}");
    // Its agent dies: the request is lost.
    let lost = drain(&system, &system.resources.agent_queue_url).await;
    assert_eq!(lost.len(), 1);
    // The timer arrives with the element out, is armed again for its deadline, and recovers
    // it there (no sweep runs here).
    let until = Instant::now() + Duration::from_secs(10);
    let mut fired = 0;
    let retried = |r: &sas::StateRecord| {
        r.fanout
            .as_ref()
            .is_some_and(|f| f.branches.iter().any(|b| b.failure_count == 1))
    };
    while Instant::now() < until && !retried(&state(&system, id).await) {
        fired += system.pump_timers().await.expect("timers");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let r = state(&system, id).await;
    assert!(retried(&r), "recovered by the timer armed again: {r:?}");
    assert_eq!(fired, 2, "the claim's timer, then the one armed again");
}

#[tokio::test]
async fn a_supervisor_that_dies_holding_a_shard_lease_is_replaced_after_it_expires() {
    let (system, clock) = aws_system("lease", manual_settings()).await;
    let id = submit_to(&system, None).await;
    system.pump_scheduler().await.expect("claim");
    clock.advance(chrono::Duration::seconds(31));
    // Another supervisor took every shard's lease and died mid-sweep.
    let now = sas::ports::Clock::now(clock.as_ref());
    for shard in 0..system.store.due_shards() {
        assert!(
            system
                .store
                .acquire_lease(sas::ports::LeaseClaim {
                    name: &format!("sweep#{shard}"),
                    owner: "dead",
                    now,
                    ttl: chrono::Duration::seconds(60),
                })
                .await
                .expect("lease")
        );
    }
    let report = system.sweep().await.expect("sweep");
    assert_eq!(report.leased_elsewhere as u32, system.store.due_shards());
    assert_eq!(report.due, 0, "{report:?}");
    assert_eq!(state(&system, id).await.failure_count, 0);

    clock.advance(chrono::Duration::seconds(61));
    let report = system.sweep().await.expect("sweep");
    assert_eq!(report.leased_elsewhere, 0, "{report:?}");
    assert_eq!(report.retried, 1, "{report:?}");
    assert_eq!(state(&system, id).await.failure_count, 1);
    // The new holder released its leases: the next sweep by anyone proceeds.
    assert_eq!(system.sweep().await.expect("sweep").leased_elsewhere, 0);
}

#[tokio::test]
async fn a_record_that_always_fails_does_not_block_its_shard_and_one_sweep_pages_to_the_end() {
    // One shard, one entry a page: the poison record heads the shard, four good ones follow.
    let mut settings = manual_settings();
    settings.due_shards = 1;
    let (mut system, clock) = aws_system("poison", settings).await;
    system.supervisor.sweep.page_size = 1;
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(submit_to(&system, None).await);
        // Distinct pickup deadlines: the first submitted is the first due.
        clock.advance(chrono::Duration::milliseconds(5));
    }
    // The first one's record names a workflow version the catalog never had: every recovery of
    // it fails (a poison record), now and on every later sweep.
    let first = state(&system, ids[0]).await;
    let mut poison = first.clone();
    poison.workflow_version = 999;
    poison.version += 1;
    system
        .store
        .put(
            &poison,
            &sas::domain::Condition::Matches {
                version: first.version,
                guards: vec![],
            },
        )
        .await
        .expect("plant the poison record");
    // Nobody claims them: each misses its pickup deadline.
    clock.advance(chrono::Duration::seconds(61));
    // (Both emulators' indexes are read-after-write consistent.)
    let report = system.sweep().await.expect("sweep");
    assert_eq!(report.due, 5, "{report:?}");
    assert_eq!(report.errors, 1, "the poison record fails: {report:?}");
    assert_eq!(
        report.requeued, 4,
        "every good record behind it: {report:?}"
    );
    assert_eq!(
        report.pages, 6,
        "five pages of one and an empty one: {report:?}"
    );
    assert_eq!(report.cut_short, 0, "{report:?}");
    for id in &ids[1..] {
        assert!(
            state(&system, *id).await.version > first.version,
            "{id} was re-enqueued"
        );
    }
    // The next sweep tries the poison record again and still reaches nothing else first.
    let again = system.sweep().await.expect("sweep");
    assert_eq!(again.errors, 1, "{again:?}");
}

#[tokio::test]
async fn the_shared_breaker_opens_after_n_faults_stops_calls_half_opens_and_closes() {
    use sas::domain::{BreakerPolicy, BreakerState};
    use sas::ports::{RemoteCall, RemoteFault, RemoteService};
    let mut settings = manual_settings();
    settings.policy.step_timeout = chrono::Duration::seconds(3);
    let policy = BreakerPolicy {
        threshold: 3,
        cooldown: chrono::Duration::seconds(10),
        probes: 1,
        probe_window: chrono::Duration::seconds(5),
        pause_after: None,
        // This test reads the breaker's semantics across agents: every call reads it.
        read_cache: chrono::Duration::zero(),
    };
    settings.breaker = policy;
    let now = chrono::Utc::now();
    settings.faults.insert(
        "payment".into(),
        Faults {
            outage: Some((
                now - chrono::Duration::hours(1),
                now + chrono::Duration::hours(1),
            )),
            ..Faults::default()
        },
    );
    let (system, clock) = aws_system("breaker", settings).await;
    let alerts = subscribe(&system, &["ServiceUnavailable"]).await;
    let id = submit_to(&system, None).await;
    system.pump_scheduler().await.expect("claim");
    system.pump_agents().await.expect("inventory");
    system.pump_scheduler().await.expect("payment requested");
    let payment = system.services.get("payment");
    let calls = payment.stats().calls;
    system.pump_agents().await.expect("payment step");
    assert_eq!(
        payment.stats().calls - calls,
        3,
        "the breaker opened after 3 faults and stopped the calls"
    );
    let b = breaker(&system, "payment").await;
    assert!(matches!(b.state, BreakerState::Open { .. }), "{b:?}");
    // Its opening is an operator alert, once, naming the service and the fault.
    let got = wait_for_messages(&system, &alerts, 1).await;
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0]["detail"]["service"], "payment");
    assert_eq!(got[0]["detail"]["kind"], "unavailable");
    let inventory = system.store.get_breaker("inventory").await.expect("read");
    assert!(
        inventory.as_ref().is_none_or(|b| b.is_closed()),
        "each service has its own breaker: {inventory:?}"
    );
    // The circuit is open: the agent deferred the step at once (it does not wait on one
    // service's breaker while other services' steps queue behind it), and an open circuit is
    // no failure of the task.
    system.pump_scheduler().await.expect("deferral");
    let r = state(&system, id).await;
    assert_eq!(r.process_state, ProcessState::Pending, "{r:?}");
    assert_eq!(r.failure_count, 0);
    assert!(
        r.last_error
            .as_deref()
            .is_some_and(|e| e.contains("circuit open")),
        "{r:?}"
    );

    // Another instance of the agent sees the same breaker: no call while it is open.
    let other = sas::remote::SharedBreaker::new(
        "payment",
        payment.clone(),
        system.store.clone(),
        policy,
        clock.clone(),
    );
    let call = RemoteCall {
        service: "payment".into(),
        step: "step".into(),
        action: "charge-payment".into(),
        idempotency_key: format!("{}:probe", uuid::Uuid::new_v4()),
        task_id: id,
        undoes: None,
        input: json!({}),
        deadline: chrono::Utc::now() + chrono::Duration::seconds(30),
        callback: None,
        limit_keys: Default::default(),
    };
    let before = payment.stats().calls;
    assert!(matches!(
        other.call(&call, Duration::from_secs(1)).await,
        Err(RemoteFault::CircuitOpen { .. })
    ));
    assert_eq!(payment.stats().calls, before, "no call while open");

    // The outage ends and the cooldown passes: one probe goes out and closes the breaker.
    clock.advance(chrono::Duration::hours(2));
    other
        .call(&call, Duration::from_secs(1))
        .await
        .expect("the probe succeeds");
    assert_eq!(payment.stats().calls, before + 1);
    let b = breaker(&system, "payment").await;
    assert_eq!(b.state, BreakerState::Closed { failures: 0 });
}

/// Sends `message` to the scheduler's work queue, visible at once.
async fn send_work(system: &System, message: &sas::messages::SchedulerMessage) {
    let body = serde_json::to_string(message).expect("json");
    let url = &system.resources.work_queue_url;
    system
        .queue
        .send(url, &body, Duration::ZERO)
        .await
        .expect("send");
}

#[tokio::test]
async fn a_wait_longer_than_sqs_allows_is_sent_on_until_it_is_due() {
    use sas::messages::{SchedulerMessage, WorkMessage};
    let (system, _clock) = aws_system("longwait", manual_settings()).await;
    let id = submit_to(&system, None).await;
    drain(&system, &system.resources.work_queue_url).await;
    let later = chrono::Utc::now() + chrono::Duration::minutes(40);
    let early = SchedulerMessage::Work(WorkMessage {
        not_before: Some(later),
        ..WorkMessage::new(id)
    });
    send_work(&system, &early).await;
    assert_eq!(system.pump_scheduler().await.expect("poll"), 1);
    let r = state(&system, id).await;
    assert_eq!(
        (r.process_state, r.attempt),
        (ProcessState::Pending, 0),
        "not claimed before notBefore"
    );
    assert_eq!(
        system.pump_scheduler().await.expect("poll"),
        0,
        "sent on with a delay, so not visible yet"
    );
    // Once due, the same message claims the task.
    let due = SchedulerMessage::Work(WorkMessage {
        not_before: Some(chrono::Utc::now() - chrono::Duration::seconds(1)),
        ..WorkMessage::new(id)
    });
    send_work(&system, &due).await;
    system.pump_scheduler().await.expect("poll");
    assert_eq!(
        state(&system, id).await.process_state,
        ProcessState::Processing
    );
}

// ---------------------------------------------------------------------------------------------
// sasctl, the operator's CLI, against the same API.
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn sasctl_show_renders_a_failed_tasks_steps_and_history() {
    let (mut system, id) = loan_in_error_on_the_emulator("show").await;
    let ops = operator(&mut system).await;
    let cli = sasctl::Cli::try_parse_from([
        "sasctl",
        "--endpoint",
        ops.base().as_str(),
        "show",
        &id.to_string(),
    ])
    .expect("args");
    let mut out = Vec::new();
    assert_eq!(sasctl::run(cli, &mut out).await.expect("runs"), 0);
    let shown = String::from_utf8(out).expect("utf-8");
    assert!(shown.contains("refused: disburse-funds"), "{shown}");
    assert!(shown.contains("Error"), "{shown}");
    assert!(shown.contains("send-contract"), "{shown}");
    // Each reached step's service and request body, in full: what a reconciliation needs.
    assert!(shown.contains("core-banking.disburse-funds"), "{shown}");
    assert!(shown.contains("\nstep 1 "), "{shown}");
    assert!(shown.contains("  input:"), "{shown}");

    let id = id.to_string();
    // An operator settles the failed loan by hand and closes it with a note.
    let line = format!("resolve {id} --note 'disbursed by hand, ticket 42'");
    let (code, out, err) = sasctl_at(&ops, &words(&line)).await;
    assert_eq!(code, 0, "{out}{err}");
    let r = state(&system, id.parse().expect("id")).await;
    assert_eq!(r.process_state, ProcessState::Resolved, "{r:?}");
    let last = r.history.last().expect("history");
    assert_eq!(
        last.reason,
        "operator resolve: disbursed by hand, ticket 42"
    );
    assert!(last.by.is_some(), "who resolved it is recorded: {last:?}");
    // A second resolve is a conflict; under --json stdout is the error document.
    let (code, out, err) = sasctl_at(&ops, &["--json", "resolve", &id, "--note", "again"]).await;
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.is_empty(), "{err}");
    let doc: Value = serde_json::from_str(&out).expect("one JSON document");
    assert_eq!(doc["error"]["code"], "conflict", "{doc}");
    assert_eq!(doc["error"]["status"], 409, "{doc}");
    // Without --json the same error is a line on stderr.
    let (code, out, err) = sasctl_at(&ops, &["retry", &id, "--reason", "x"]).await;
    assert_eq!((code, out.as_str()), (1, ""), "{err}");
    assert!(err.starts_with("error: conflict: "), "{err}");
    // The paging hint repeats the endpoint it was given.
    let (code, out, err) = sasctl_at(&ops, &["list", "--state", "Resolved", "--limit", "1"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(&id), "{out}");
    let (_, out, _) = sasctl_at(&ops, &["show", &id]).await;
    assert!(out.contains("operator resolve: disbursed by hand"), "{out}");
}

#[tokio::test]
async fn sasctl_paging_hints_repeat_every_flag_given() {
    let mut system = sas_blackbox::memory_system(manual_settings()).await;
    let ops = operator(&mut system).await;
    for _ in 0..3 {
        post_order(&system).await;
    }
    let flags = format!("--sign never list --state Pending --workflow {ECOMMERCE} --limit 1");
    let mut argv = vec!["sasctl", "--endpoint", ops.base().as_str()];
    argv.extend(words(&flags));
    let mut out = Vec::new();
    let code = sasctl::run(sasctl::Cli::try_parse_from(&argv).expect("args"), &mut out)
        .await
        .expect("runs");
    let shown = String::from_utf8(out).expect("utf-8");
    assert_eq!(code, 0, "{shown}");
    let hint = shown
        .lines()
        .find_map(|l| l.strip_prefix("more: "))
        .unwrap_or_else(|| panic!("a paging hint: {shown}"));
    let words: Vec<&str> = hint.split_whitespace().collect();
    let cursor = words.last().copied().expect("a cursor");
    let mut expected: Vec<&str> = argv.to_vec();
    expected.extend(["--cursor", cursor]);
    assert_eq!(words, expected, "{hint}");
    // And the hint, run as given, is the next page.
    let mut out = Vec::new();
    let code = sasctl::run(
        sasctl::Cli::try_parse_from(&words).expect("hint parses"),
        &mut out,
    )
    .await
    .expect("runs");
    assert_eq!(code, 0);
    assert_ne!(String::from_utf8(out).expect("utf-8"), shown);
}

#[tokio::test]
async fn sasctl_watch_follows_a_task_until_it_is_terminal() {
    let mut system = sas_blackbox::memory_system(sas_local::Settings::default()).await;
    let ops = operator(&mut system).await;
    system.start();
    let answer = post_order(&system).await;
    let id = answer["taskId"].as_str().expect("taskId").to_owned();
    let cli = sasctl::Cli::try_parse_from([
        "sasctl",
        "--endpoint",
        ops.base().as_str(),
        "watch",
        &id,
        "--interval-ms",
        "20",
        "--timeout-secs",
        "30",
    ])
    .expect("args");
    let mut out = Vec::new();
    let code = sasctl::run(cli, &mut out).await.expect("runs");
    let shown = String::from_utf8(out).expect("utf-8");
    assert_eq!(code, 0, "{shown}");
    assert!(shown.contains("Processed"), "{shown}");
    system.shutdown().await;
}

/// A DynamoDB answer that no retry changes (here: the table does not exist) makes the message
/// poison at once: it is in the dead-letter queue after one receive, with the reason as its
/// `sas-reason` attribute, and not left to fail five times.
#[tokio::test]
async fn a_store_rejection_sends_the_message_to_the_dead_letter_queue_at_once_with_its_reason() {
    let config = sas_blackbox::sdk_config().await;
    let stack = sas_blackbox::template::provision(&config, &sas_blackbox::unique("rejected")).await;
    let mut resources = stack.resources;
    resources.table = sas_blackbox::unique("no-such-table");
    let ports = sas_local::aws_ports(&config, resources.clone(), 4, None);
    let system = System::from_ports(
        ports,
        sas_blackbox::manual_settings(),
        std::sync::Arc::new(sas::ports::SystemClock),
    );
    let work = json!({"type": "work", "taskId": TaskId::new_random()}).to_string();
    system
        .queue
        .send(&resources.work_queue_url, &work, Duration::ZERO)
        .await
        .expect("sent");
    let mut handled = 0;
    for _ in 0..20 {
        handled += system.pump_scheduler().await.expect("poll");
        if handled > 0 {
            break;
        }
    }
    assert_eq!(handled, 1, "the message was received once");
    let sqs = aws_sdk_sqs::Client::new(&config);
    let dead = sqs
        .receive_message()
        .queue_url(&resources.dead_letter_url)
        .message_attribute_names("All")
        .wait_time_seconds(2)
        .send()
        .await
        .expect("receive");
    let m = dead
        .messages()
        .first()
        .expect("in the dead-letter queue after one receive");
    assert_eq!(
        m.body(),
        Some(work.as_str()),
        "the body as it was, for a redrive"
    );
    let reason = m
        .message_attributes()
        .and_then(|a| a.get(sas::ports::DEAD_LETTER_REASON))
        .and_then(|v| v.string_value())
        .unwrap_or_default();
    assert!(
        reason.starts_with("store_rejected: ResourceNotFoundException"),
        "{reason}"
    );
    // Nothing left on the work queue to be received four more times.
    let left = sqs
        .get_queue_attributes()
        .queue_url(&resources.work_queue_url)
        .attribute_names(aws_sdk_sqs::types::QueueAttributeName::All)
        .send()
        .await
        .expect("attributes");
    let count = |name: aws_sdk_sqs::types::QueueAttributeName| {
        left.attributes()
            .and_then(|a| a.get(&name))
            .cloned()
            .unwrap_or_default()
    };
    assert_eq!(
        count(aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessages),
        "0"
    );
    assert_eq!(
        count(aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessagesNotVisible),
        "0"
    );
}

/// The classification on the emulator: a missing table and an item over 400 KB are rejected
/// (never retryable), and nothing else is.
#[tokio::test]
async fn dynamodb_answers_that_never_change_are_rejections() {
    use sas::ports::{StoreError, TaskStore};
    let config = sas_blackbox::sdk_config().await;
    let client = aws_sdk_dynamodb::Client::new(&config);
    let missing = sas::aws::DynamoStore::new(client.clone(), sas_blackbox::unique("nothing"), 4);
    assert!(
        matches!(missing.get_state(TaskId::new_random()).await, Err(StoreError::Rejected(ref m)) if m.starts_with("ResourceNotFoundException")),
        "{:?}",
        missing.get_state(TaskId::new_random()).await
    );
    let table = sas_blackbox::unique("rejects");
    provision::create_table(&client, &table)
        .await
        .expect("table");
    let store = sas::aws::DynamoStore::new(client, table, 4);
    let w = sas::domain::workflow::examples::ecommerce_order(&sas::Policy::default());
    let now = sas::domain::state::to_millis(chrono::Utc::now());
    let mut r = sas::StateRecord::new(TaskId::new_random(), &w, None, now, now);
    r.last_error = Some("x".repeat(500 * 1024));
    let too_big = store.put(&r, &sas::domain::Condition::Absent).await;
    assert!(
        matches!(too_big, Err(StoreError::Rejected(ref m)) if m.starts_with("ValidationException")),
        "{too_big:?}"
    );
    assert_eq!(
        store.get_state(r.task_id).await.expect("a read works"),
        None
    );
}

/// Retention: a final task's items (task and state record) carry `ExpiresAt` = when it got
/// there + the retention, for DynamoDB's TTL; a task waiting for an operator (`Error`) carries
/// none; with no retention, nothing expires.
#[tokio::test]
async fn final_tasks_expire_after_the_retention_and_tasks_waiting_for_an_operator_never() {
    let mut settings = manual_settings();
    settings.retention = Some(chrono::Duration::days(90));
    settings.faults.insert(
        "core-banking".into(),
        sas_blackbox::refuse(&["disburse-funds"]),
    );
    let (system, _clock) = aws_system("retention", settings).await;
    let processed = sas_blackbox::submit_ok(&system).await;
    let stuck = submit_loan(&system).await;
    pump_until_quiet(&system, 40).await;
    waive_cooling_off(&system, &[stuck]).await;
    assert_eq!(
        state(&system, processed).await.process_state,
        ProcessState::Processed
    );
    assert_eq!(
        state(&system, stuck).await.process_state,
        ProcessState::Error
    );
    sas_blackbox::assert_expires_in_days(&system, processed, 90).await;
    for sk in ["TASK", "STATE"] {
        assert_eq!(
            sas_blackbox::expires_at(&system, stuck, sk).await,
            None,
            "{sk} of an Error task"
        );
    }

    let mut keep = manual_settings();
    keep.retention = None;
    let (system, _clock) = aws_system("keep", keep).await;
    let id = sas_blackbox::submit_ok(&system).await;
    pump_until_quiet(&system, 40).await;
    assert_eq!(
        state(&system, id).await.process_state,
        ProcessState::Processed
    );
    for sk in ["TASK", "STATE"] {
        assert_eq!(
            sas_blackbox::expires_at(&system, id, sk).await,
            None,
            "RETENTION_DAYS=0 keeps {sk}"
        );
    }
}

/// An operator pauses a service: its steps wait (deferred, no failure, no call) while other
/// services' steps go on; `service list` shows who paused it and why; a resume closes it.
#[tokio::test]
async fn a_paused_service_makes_its_steps_wait_without_failing_until_it_is_resumed() {
    use sas::domain::BreakerState;
    let (mut system, _clock) = aws_system("paused", manual_settings()).await;
    let ops = operator(&mut system).await;
    let (code, text) = sasctl_text(&ops, &["service", "pause", "payment"]).await;
    assert_eq!(code, 1, "a pause needs a reason: {text}");
    assert!(text.contains("reason is required"), "{text}");
    let (code, text) = sasctl_text(&ops, &["service", "pause", "nope", "--reason", "x"]).await;
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("service_not_found"), "{text}");
    let line = "service pause payment --reason 'bank maintenance'";
    let (code, text) = sasctl_text(&ops, &words(line)).await;
    assert_eq!((code, text.trim()), (0, "payment paused"));
    let (code, text) =
        sasctl_text(&ops, &["service", "pause", "payment", "--reason", "again"]).await;
    assert_eq!((code, text.trim()), (0, "payment paused (already)"));
    let (_, listed) = sasctl_text(&ops, &["service", "list"]).await;
    let line = listed
        .lines()
        .find(|l| l.starts_with("payment"))
        .unwrap_or_else(|| panic!("{listed}"));
    assert!(line.contains("paused"), "{line}");
    assert!(line.contains(": bank maintenance"), "who and why: {line}");

    let payment = system.services.get("payment");
    let calls = payment.stats().calls;
    let id = sas_blackbox::submit_task(&system, ECOMMERCE, &order_input()).await;
    pump_until_quiet(&system, 30).await;
    let r = state(&system, id).await;
    assert_eq!(r.process_state, ProcessState::Pending, "{r:?}");
    assert_eq!(
        r.current_step(),
        Some("charge-payment"),
        "the inventory step went on"
    );
    assert_eq!(r.failure_count, 0, "waiting is no failure");
    assert_eq!(payment.stats().calls, calls, "no call to a paused service");
    assert!(
        r.complete_by
            .is_some_and(|d| d > chrono::Utc::now() + chrono::Duration::seconds(30))
    );
    // It says why it waits: who paused the service, why, since when (not "circuit open").
    let why = r.last_error.clone().unwrap_or_default();
    assert!(
        why.starts_with("charge-payment: service payment paused by ")
            && why.contains(": bank maintenance (since "),
        "{why}"
    );

    // The resume wakes the waiting task at once: it goes on well before its next look (a
    // minute away), with no supervisor's sweep.
    let (code, text) = sasctl_text(&ops, &["service", "resume", "payment"]).await;
    assert_eq!(
        (code, text.trim()),
        (0, "payment closed; 1 waiting task woken"),
        "{text}"
    );
    let b = breaker(&system, "payment").await;
    assert_eq!(
        (b.state, b.note),
        (BreakerState::Closed { failures: 0 }, None)
    );
    pump_until_quiet(&system, 30).await;
    let r = state(&system, id).await;
    assert_eq!(r.process_state, ProcessState::Processed, "{r:?}");
    assert!(payment.stats().calls > calls, "called once resumed");
}

/// `sasctl service resume` printed "2 waiting tasks woken" while a step in a parallel branch
/// stayed Pending until its pause's next look, a minute later. The resume wakes every step
/// waiting for the service at once, wherever it stands: in a branch whose sibling is out (its
/// task Processing, which the resume did not even read), and as a forEach step's elements; the
/// count it prints is the tasks it woke.
#[tokio::test]
async fn a_resume_wakes_the_steps_waiting_in_branches_and_elements_at_once() {
    let mut system = sas_blackbox::memory_system(manual_settings()).await;
    let ops = operator(&mut system).await;
    let probe = json!({
        "name": "resume-probe",
        "input": {"type": "object", "properties": {"items": {"type": "array"}}},
        "steps": [{"name": "group", "parallel": [
            {"name": "slow", "steps": [{"name": "hold", "wait": "1h"}]},
            {"name": "money", "steps": [{"name": "charge", "service": "payment"}]}
        ]}]
    });
    let each = json!({
        "name": "resume-each",
        "input": {"type": "object", "properties": {"items": {"type": "array"}}},
        "steps": [{"name": "per-item", "service": "payment", "forEach": "$.input.items",
                   "maxConcurrency": 2}]
    });
    for w in [&probe, &each] {
        let path = format!("/workflows/{}", w["name"].as_str().unwrap_or_default());
        let (code, body) = sas_blackbox::operator_call(
            &system,
            http::Method::PUT,
            &path,
            w.to_string().as_bytes(),
        )
        .await;
        assert_eq!(code, 201, "{body}");
    }
    let (code, text) = sasctl_text(
        &ops,
        &words("service pause payment --reason 'bank maintenance'"),
    )
    .await;
    assert_eq!(code, 0, "{text}");
    let beside = sas_blackbox::submit_task(&system, "resume-probe", &json!({})).await;
    let elements =
        sas_blackbox::submit_task(&system, "resume-each", &json!({"items": [1, 2, 3]})).await;
    pump_until_quiet(&system, 30).await;
    let r = state(&system, beside).await;
    assert_eq!(
        r.process_state,
        ProcessState::Processing,
        "the wait is out: {r:?}"
    );
    let charge = r
        .steps
        .iter()
        .position(|s| s.name == "charge")
        .expect("charge");
    assert_eq!(r.steps[charge].status, StepStatus::Pending, "{r:?}");
    let r = state(&system, elements).await;
    assert!(
        r.steps[0]
            .elements
            .iter()
            .all(|e| e.status == StepStatus::Pending),
        "{r:?}"
    );

    let (code, text) = sasctl_text(&ops, &["service", "resume", "payment"]).await;
    assert_eq!(
        (code, text.trim()),
        (0, "payment closed; 2 waiting tasks woken"),
        "{text}"
    );
    // At once: no supervisor's sweep, no clock moved.
    pump_until_quiet(&system, 30).await;
    let r = state(&system, beside).await;
    assert_eq!(r.steps[charge].status, StepStatus::Done, "{r:?}");
    assert_eq!(
        r.process_state,
        ProcessState::Processing,
        "the wait goes on"
    );
    let r = state(&system, elements).await;
    assert_eq!(r.process_state, ProcessState::Processed, "{r:?}");
    let (_, again) = sasctl_text(&ops, &["service", "resume", "payment"]).await;
    assert_eq!(again.trim(), "payment closed (already)");
}

/// `sasctl bulk`: a dry run counts what a selection holds and changes nothing; `--yes` acts on
/// each task once, with the reason in its history; the time range narrows the selection.
#[tokio::test]
async fn sasctl_bulk_counts_first_then_acts_on_each_task_of_the_selection() {
    let (system, ops, loans) = loans_in_error(3).await;
    let order = sas_blackbox::submit_task(&system, ECOMMERCE, &order_input()).await;
    pump_until_quiet(&system, 60).await;
    let line = "bulk resolve --state Error --reason 'paid by hand'";
    let (code, dry) = sasctl_json(&ops, &words(line)).await;
    assert_eq!(code, 0, "{dry}");
    assert_eq!(
        (dry["dryRun"].as_bool(), dry["count"].as_u64()),
        (Some(true), Some(3)),
        "{dry}"
    );
    for id in &loans {
        assert_eq!(
            state(&system, *id).await.process_state,
            ProcessState::Error,
            "a dry run changes nothing"
        );
    }
    // A range that ends before the tasks failed holds none of them.
    let (_, none) = sasctl_json(&ops, &words("bulk retry --state Error --until 1h")).await;
    assert_eq!(none["count"], 0, "{none}");
    let (code, _) = sasctl_json(&ops, &["bulk", "resolve", "--state", "Error"]).await;
    assert_eq!(code, 2, "resolve needs a reason");
    let line = format!(
        "bulk resolve --state Error --workflow {LOAN} --since 1h --reason 'paid by hand' --yes"
    );
    let (code, done) = sasctl_json(&ops, &words(&line)).await;
    assert_eq!(code, 0, "{done}");
    assert_eq!(
        done["tally"]["applied"].as_array().map(Vec::len),
        Some(3),
        "{done}"
    );
    for id in &loans {
        let r = state(&system, *id).await;
        assert_eq!(r.process_state, ProcessState::Resolved);
        assert_eq!(
            r.history.last().map(|h| h.reason.as_str()),
            Some("operator resolve: paid by hand")
        );
    }
    assert_eq!(
        state(&system, order).await.process_state,
        ProcessState::Processed
    );
    let (_, again) = sasctl_json(&ops, &words("bulk resolve --state Error --reason x")).await;
    assert_eq!(again["count"], 0, "{again}");
}

/// `sasctl skip`: an operator did the failed step by hand; its result is kept and the task
/// goes on (here the loan's last step, so it is Processed), with who and why in its history.
#[tokio::test]
async fn sasctl_skip_marks_the_failed_step_done_by_hand_and_the_task_goes_on() {
    let (system, ops, loans) = loans_in_error(1).await;
    let id = loans[0].to_string();
    let (code, text) = sasctl_text(&ops, &["skip", &id, "--result", "{}"]).await;
    assert_eq!(code, 2, "a skip needs a reason: {text}");
    let line = format!("skip {id} --reason x --result '{{not json'");
    let (code, text) = sasctl_text(&ops, &words(&line)).await;
    assert_eq!(code, 2, "{text}");
    let result = r#"{"transfer": "T-1"}"#;
    let line = format!("skip {id} --reason 'paid out by hand, transfer T-1' --result '{result}'");
    let (code, text) = sasctl_text(&ops, &words(&line)).await;
    assert_eq!(code, 0, "{text}");
    let r = state(&system, id.parse().expect("id")).await;
    assert_eq!(r.process_state, ProcessState::Processed, "{r:?}");
    let last = r.steps.last().expect("steps");
    assert_eq!(last.status, StepStatus::Done);
    assert_eq!(last.result.as_deref(), Some(r#"{"transfer":"T-1"}"#));
    assert_eq!(
        r.history.last().map(|h| h.reason.as_str()),
        Some("operator skip of disburse-funds: paid out by hand, transfer T-1")
    );
    let (code, text) = sasctl_text(&ops, &["skip", &id, "--reason", "again"]).await;
    assert_eq!(code, 1, "a Processed task has no step to skip: {text}");
    assert!(text.contains("conflict"), "{text}");
}

/// `sasctl retry --input`: a refused step runs again on the task's new input (checked against
/// the workflow's schema first), under a new key, and the input is the task's from then on.
#[tokio::test]
async fn sasctl_retry_with_a_new_input_reruns_the_refused_step_on_it() {
    let (system, ops, loans) = loans_in_error(1).await;
    let id = loans[0];
    let id_text = id.to_string();
    let line = format!(r#"retry {id_text} --input '{{"applicantId": "a-42"}}'"#);
    let (code, text) = sasctl_text(&ops, &words(&line)).await;
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("validation_failed"),
        "the schema is checked: {text}"
    );
    let new_input = json!({"applicantId": "a-42", "amount": 20000, "currency": "EUR"});
    let line =
        format!("retry {id_text} --reason 'the applicant lowered the amount' --input {new_input}");
    let (code, text) = sasctl_text(&ops, &words(&line)).await;
    assert_eq!(code, 0, "{text}");
    let (task, r) = sas_blackbox::task_and_state(&system, id).await;
    assert_eq!(task.input, new_input);
    assert_eq!(r.process_state, ProcessState::Pending);
    assert_eq!(r.steps[5].generation, 1, "a new key for the new body");
    system
        .services
        .get("core-banking")
        .set_faults(Faults::default());
    pump_until_quiet(&system, 60).await;
    assert_eq!(
        state(&system, id).await.process_state,
        ProcessState::Processed
    );
    let banking = system.services.get("core-banking").stats();
    let disbursed = banking
        .requests
        .iter()
        .rfind(|a| a.action == "disburse-funds")
        .expect("disbursed");
    assert!(
        disbursed.key.ends_with(":g1"),
        "under the new key: {disbursed:?}"
    );
}
