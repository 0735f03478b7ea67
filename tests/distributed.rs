//! A distributed forEach (issue 42): each element runs as a record of its own, at most
//! `maxConcurrency` at once, its end applied by the step's run; the task's record stays the
//! size of one step. A refusal past the tolerance undoes exactly the elements that took effect.

use sas::handlers::runs::{element_id, run_id};
use sas::messages::idempotency_key;
use sas::{ProcessState, StateRecord, TaskId};
use sas_local::{Backend, Settings, System};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Arc;

const SERVICES: &str = "services:\n  - name: ledger\n    target: {type: simulated}\n";

const NIGHTLY: &str = r#"name: nightly
input:
  type: object
  required: [items, batch]
  properties: {items: {type: array}, batch: {type: string}}
steps:
  - name: post
    service: ledger
    forEach: $.input.items
    distributed: true
    maxConcurrency: 8
    input: {invoice: $.element, at: $.index, batch: $.input.batch}
    undo: {action: void, input: {posted: "$.steps['post'].result.id", invoice: $.element}}
  - name: report
    service: ledger
    input: {posted: "$.steps['post'].result"}
"#;

/// The same workflow, reading its list from an S3 object.
const FROM_S3: &str = r#"name: nightly-s3
steps:
  - name: post
    service: ledger
    forEach: s3://nightly-lists/invoices.jsonl
    distributed: true
    maxConcurrency: 3
    toleratedRefusals: "10%"
"#;

#[tokio::test]
async fn a_list_is_read_from_an_s3_object_of_json_lines() {
    let settings = Settings {
        definitions: vec![],
        ..sas_blackbox::manual_settings()
    };
    let mut ports = sas_local::ports(Backend::Memory, &settings)
        .await
        .expect("ports");
    let objects = Arc::new(sas::memory::MemoryPayloads::new());
    let lines: Vec<String> = (0..20).map(|i| json!({"invoice": i}).to_string()).collect();
    objects.put_object(
        "nightly-lists",
        "invoices.jsonl",
        lines.join("\n").into_bytes(),
    );
    ports.payloads = objects.clone();
    let system = System::from_ports(ports, settings, Arc::new(sas::ports::SystemClock));
    system
        .publish(&[
            ("services.yaml".into(), SERVICES.into()),
            ("nightly-s3.yaml".into(), FROM_S3.into()),
        ])
        .await
        .expect("publishes");
    let id = sas_blackbox::submit_task(&system, "nightly-s3", &json!({})).await;
    sas_blackbox::pump_until_quiet(&system, 300).await;
    let task = sas_blackbox::state(&system, id).await;
    assert_eq!(
        task.process_state,
        ProcessState::Processed,
        "{:?}",
        task.history
    );
    let requests = sas_blackbox::requests(&system, "ledger", &id.to_string());
    let mut seen: Vec<i64> = requests
        .iter()
        .filter_map(|(_, input)| input["invoice"].as_i64())
        .collect();
    seen.sort_unstable();
    assert_eq!(
        seen,
        (0..20).collect::<Vec<_>>(),
        "each line once, as its element"
    );

    // A list that is not there refuses the step: no retry finds it.
    let missing = FROM_S3
        .replace("name: nightly-s3", "name: nightly-missing")
        .replace("invoices.jsonl", "nowhere.jsonl");
    system
        .publish(&[("nightly-missing.yaml".into(), missing)])
        .await
        .expect("publishes");
    let id = sas_blackbox::submit_task(&system, "nightly-missing", &json!({})).await;
    sas_blackbox::pump_until_quiet(&system, 100).await;
    let task = sas_blackbox::state(&system, id).await;
    assert_eq!(task.process_state, ProcessState::Refused);
    let refusal = task.refusal.expect("a refusal");
    assert_eq!(refusal.code, "list_unreadable");
    assert!(
        refusal.message.contains("s3://nightly-lists/nowhere.jsonl"),
        "{}",
        refusal.message
    );
}

async fn system(faults: HashMap<String, sas::remote::Faults>) -> System {
    let settings = Settings {
        definitions: vec![],
        faults,
        ..sas_blackbox::manual_settings()
    };
    let system = System::new(Backend::Memory, settings, Arc::new(sas::ports::SystemClock))
        .await
        .expect("builds");
    system
        .publish(&[
            ("services.yaml".into(), SERVICES.into()),
            ("nightly.yaml".into(), NIGHTLY.into()),
        ])
        .await
        .expect("publishes");
    system
}

/// The run the task's `post` step started (its first key).
fn run_of(task: TaskId) -> TaskId {
    run_id(&idempotency_key(task, "post", "post", 0))
}

fn invoices(n: usize) -> Value {
    json!({"batch": "2026-11-29", "items": (0..n).map(|i| json!({"invoice": format!("inv-{i}")})).collect::<Vec<_>>()})
}

#[tokio::test]
async fn every_element_runs_once_as_a_record_of_its_own_and_the_step_answers_in_order() {
    let system = system(HashMap::new()).await;
    let id = sas_blackbox::submit_task(&system, "nightly", &invoices(50)).await;
    sas_blackbox::pump_until_quiet(&system, 400).await;
    let task = sas_blackbox::state(&system, id).await;
    assert_eq!(
        task.process_state,
        ProcessState::Processed,
        "{:?}",
        task.history
    );

    // The task's record holds one step's state for the forEach, whatever the list's length.
    assert!(task.steps[0].elements.is_empty());
    let bytes = serde_json::to_vec(&task).expect("json").len();
    let run = sas_blackbox::state(&system, run_of(id)).await;
    assert_eq!(run.process_state, ProcessState::Processed);
    let ledger = &run.run.as_ref().expect("a run").ledger;
    assert_eq!(ledger.marks, "d".repeat(50), "{ledger}");
    // The scheduler applies a batch's ends of one run in one write of its record: with 8 out
    // at once, the 50 ends moved the ledger in far fewer writes than 50.
    assert!(
        run.version <= 25,
        "the run was written {} times",
        run.version
    );

    // Each element: its own record, its element, and one call under the task's key for it.
    let effects = sas_blackbox::effects(&system, "ledger", id);
    for k in 0..50u32 {
        let (element_task, element) =
            sas_blackbox::task_and_state(&system, element_id(run.task_id, k)).await;
        assert_eq!(element.process_state, ProcessState::Processed);
        assert_eq!(element_task.input, json!({"invoice": format!("inv-{k}")}));
        // sas's own: out of the caller's list of its tasks.
        assert!(
            element_task.caller.is_reserved(),
            "{:?}",
            element_task.caller
        );
        let key = format!("{id}:post#{k}:post");
        assert_eq!(effects.get(&key), Some(&1), "{key}: {effects:?}");
    }
    // The element's mapping read its element, its index and the task's input.
    called_with_its_element(&system, id, 7);
    // The step's result: each element's result in its place; a later step read it.
    let result = step_result(&task);
    let list = result.as_array().expect("a list");
    assert_eq!(list.len(), 50);
    for (k, r) in list.iter().enumerate() {
        let element = sas_blackbox::state(&system, element_id(run.task_id, k as u32)).await;
        let own: Value =
            serde_json::from_str(element.steps[0].result.as_deref().expect("done")).expect("JSON");
        assert_eq!(r, &own, "element {k} in its place");
    }
    report_read(&system, id, &result);
    assert!(bytes < 16 * 1024, "the task's record is {bytes} bytes");
    // The task ended for good: it will never undo the step, so the run and its elements are
    // released (their retention runs).
    assert!(run.parent.as_ref().is_some_and(|l| l.released));
    for k in [0u32, 49] {
        let element = sas_blackbox::state(&system, element_id(run.task_id, k)).await;
        assert!(
            element.parent.as_ref().is_some_and(|l| l.released),
            "element {k}"
        );
    }
}

#[tokio::test]
async fn a_refusal_past_the_tolerance_undoes_exactly_the_elements_that_took_effect() {
    let faults = HashMap::from([(
        "ledger".to_owned(),
        sas::remote::Faults {
            permanent_rate: 0.15,
            seed: Some(42),
            ..sas::remote::Faults::default()
        },
    )]);
    let system = system(faults).await;
    let mut ids = vec![];
    for _ in 0..10 {
        ids.push(sas_blackbox::submit_task(&system, "nightly", &invoices(60)).await);
    }
    sas_blackbox::pump_until_quiet(&system, 2000).await;
    // Runs that met a refusal past the tolerance (then undone, or waiting for an operator).
    let mut stopped = 0;
    for id in ids {
        let task = sas_blackbox::state(&system, id).await;
        let run = sas_blackbox::state(&system, run_of(id)).await;
        let ledger = &run.run.as_ref().expect("a run").ledger;
        // Net effects of this task's elements at the service: every applied one undone.
        let net: i32 = sas_blackbox::net(&system, "ledger", id)
            .into_iter()
            .filter(|(key, _)| key.contains(":post#"))
            .map(|(_, n)| n)
            .sum();
        match task.process_state {
            ProcessState::Refused => {
                stopped += 1;
                assert_eq!(run.process_state, ProcessState::Refused, "{ledger}");
                assert_eq!(net, 0, "{id}: {ledger}");
                assert!(!ledger.marks.contains('d'), "{ledger}");
                assert!(
                    ledger.marks.len() < 60 || ledger.marks.contains('f'),
                    "{ledger}"
                );
            }
            ProcessState::Processed => {
                assert!(!ledger.marks.contains('f'), "{ledger}");
                assert_eq!(net, 60);
            }
            // An element's undo was refused too (the fault refuses undo keys alike): the run
            // waits for an operator with exactly those effects left; the step failed the task,
            // whose undo of it is refused meanwhile: it ends CompensationFailed, at once.
            ProcessState::CompensationFailed => {
                stopped += 1;
                assert_eq!(
                    run.process_state,
                    ProcessState::CompensationFailed,
                    "{ledger}"
                );
                let stuck = ledger.marks.matches('!').count() as i32;
                assert!(stuck > 0);
                assert_eq!(net, stuck, "{id}: {ledger}");
                assert!(!ledger.marks.contains('d'), "{ledger}");
            }
            other => panic!("{id} is {other}: {:?} {ledger}", task.history),
        }
    }
    // At 15% a run of 60 meets a refusal but once in 17,000.
    assert!(stopped > 0, "some runs meet a refusal at 15%");
}

#[tokio::test]
async fn elements_and_runs_stay_off_the_bus() {
    let system = system(HashMap::new()).await;
    let id = sas_blackbox::submit_task(&system, "nightly", &invoices(12)).await;
    sas_blackbox::pump_until_quiet(&system, 300).await;
    assert_eq!(
        sas_blackbox::state(&system, id).await.process_state,
        ProcessState::Processed
    );
    let Some((_, _, bus)) = &system.memory else {
        panic!("a memory system")
    };
    let about: Vec<Value> = bus
        .published()
        .into_iter()
        .map(|(_, detail)| detail["taskId"].clone())
        .collect();
    assert!(!about.is_empty());
    assert!(
        about.iter().all(|t| t == &json!(id)),
        "only the task's own statuses: {about:?}"
    );
}

/// The operator's views link a task, its run and the run's elements, the run's elements a page
/// at a time (issue 42); the console links them as it does parents and children. Neither the
/// run nor its elements are rows of the operator's lists: the task is.
#[tokio::test]
async fn the_views_and_the_console_link_task_run_and_elements_off_the_lists() {
    use sas_blackbox::operator_call;
    let system = system(HashMap::new()).await;
    let id = sas_blackbox::submit_task(&system, "nightly", &invoices(120)).await;
    sas_blackbox::pump_until_quiet(&system, 1000).await;
    let run = run_of(id);
    let get = |path: String| {
        let system = &system;
        async move { operator_call(system, http::Method::GET, &path, b"").await }
    };

    // The task's step names its run, with its state and counts.
    let (status, task) = get(format!("/tasks/{id}")).await;
    assert_eq!(status, 200, "{task}");
    assert_eq!(task["processState"], "Processed", "{task}");
    let link = &task["steps"][0]["run"];
    assert_eq!(link["taskId"], json!(run.to_string()), "{task}");
    assert_eq!(link["processState"], "Processed");
    assert_eq!(
        link["counts"],
        json!({"total": 120, "opened": 120, "done": 120, "refused": 0, "out": 0,
               "undoing": 0, "undone": 0, "undoFailed": 0})
    );
    assert!(task["steps"][1].get("run").is_none(), "{task}");

    // The run's view names its task and step, and pages its elements: 100, then the rest.
    let (status, r) = get(format!("/tasks/{run}")).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["run"]["taskId"], json!(id.to_string()), "{r}");
    assert_eq!(r["run"]["step"], "post");
    assert_eq!(r["run"]["counts"]["done"], 120);
    let elements = r["run"]["elements"].as_array().expect("elements");
    assert_eq!(elements.len(), 100);
    assert_eq!(
        elements[7],
        json!({"index": 7, "taskId": element_id(run, 7).to_string(), "mark": "done",
               "processState": "Processed"})
    );
    assert_eq!(r["run"]["nextElementsFrom"], 100);
    let (status, rest) = get(format!("/tasks/{run}?elements_from=100")).await;
    assert_eq!(status, 200, "{rest}");
    let elements = rest["run"]["elements"].as_array().expect("elements");
    assert_eq!(elements.len(), 20);
    assert_eq!(elements[0]["index"], 100);
    assert_eq!(
        elements[19]["taskId"],
        json!(element_id(run, 119).to_string())
    );
    assert!(rest["run"].get("nextElementsFrom").is_none(), "{rest}");
    let (status, bad) = get(format!("/tasks/{run}?elements_from=-1")).await;
    assert_eq!(status, 400, "{bad}");
    assert_eq!(bad["error"]["code"], "invalid_request", "{bad}");

    // An element's view names its run, its index and its task.
    let (status, e) = get(format!("/tasks/{}", element_id(run, 7))).await;
    assert_eq!(status, 200, "{e}");
    assert_eq!(
        e["element"],
        json!({"runId": run.to_string(), "index": 7, "taskId": id.to_string(), "step": "post"})
    );

    // The lists: the task, and none of its 121 records of sas's own.
    let (status, list) = get("/tasks?state=Processed&workflow=nightly".into()).await;
    assert_eq!(status, 200, "{list}");
    let ids: Vec<&str> = list["tasks"]
        .as_array()
        .expect("rows")
        .iter()
        .filter_map(|t| t["taskId"].as_str())
        .collect();
    assert_eq!(ids, [id.to_string()], "{list}");

    // The console links them.
    let page = |path: String| {
        let system = &system;
        async move {
            let resp = sas::api::handle(
                &system.operator,
                &sas_blackbox::operator(),
                &http::Method::GET,
                &format!("/operator/console{path}"),
                &http::HeaderMap::new(),
                b"",
            )
            .await;
            assert_eq!(resp.status().as_u16(), 200, "{path}: {}", resp.body());
            resp.body().clone()
        }
    };
    let html = page(format!("/tasks/{id}")).await;
    assert!(
        html.contains(&format!("href=\"/operator/console/tasks/{run}\"")),
        "the task links its run: {html}"
    );
    assert!(html.contains("120 of 120 done"), "{html}");
    let html = page(format!("/tasks/{run}")).await;
    assert!(
        html.contains(&format!("href=\"/operator/console/tasks/{id}\"")),
        "the run links its task: {html}"
    );
    assert!(html.contains(&format!(
        "href=\"/operator/console/tasks/{}\"",
        element_id(run, 99)
    )));
    assert!(
        !html.contains(&element_id(run, 100).to_string()),
        "one page"
    );
    assert!(
        html.contains(&format!(
            "href=\"/operator/console/tasks/{run}?elements_from=100\""
        )),
        "the next page: {html}"
    );
    let html = page(format!("/tasks/{run}?elements_from=100")).await;
    assert!(html.contains(&element_id(run, 119).to_string()), "{html}");
    let html = page(format!("/tasks/{}", element_id(run, 7))).await;
    assert!(
        html.contains(&format!("href=\"/operator/console/tasks/{run}\""))
            && html.contains(&format!("href=\"/operator/console/tasks/{id}\"")),
        "the element links its run and its task: {html}"
    );
}

/// A `nightly` task over `n` invoices, claimed, its run started by the agent: the run's record.
async fn started_run(system: &System, n: usize) -> (TaskId, StateRecord) {
    let id = sas_blackbox::submit_task(system, "nightly", &invoices(n)).await;
    system.pump_scheduler().await.expect("scheduler");
    system.pump_agents().await.expect("agent");
    (id, sas_blackbox::state(system, run_of(id)).await)
}

/// The forward ends, each a success, of elements `indices`.
fn done(indices: impl IntoIterator<Item = u32>) -> Vec<sas::domain::run::ElementEnd> {
    indices
        .into_iter()
        .map(|index| sas::domain::run::ElementEnd {
            index,
            direction: sas::domain::run::Direction::Forward,
            ok: true,
            refused: None,
        })
        .collect()
}

/// A scheduler applies `ends` to `run` and dies before its effects: the ledger's write alone.
async fn written_and_died(
    system: &System,
    run: &StateRecord,
    ends: &[sas::domain::run::ElementEnd],
) -> StateRecord {
    let (t, _) =
        sas::domain::transition::apply_ends(run, ends, chrono::Utc::now()).expect("applies");
    system
        .store
        .put(&t.record, &t.condition)
        .await
        .expect("written");
    t.record
}

/// `ends` of run `run` delivered (again) to the scheduler's handler.
async fn delivered(system: &System, run: TaskId, ends: Vec<sas::domain::run::ElementEnd>) {
    sas::handlers::runs::apply_ends(
        &system.scheduler.ports,
        &sas::messages::ElementsEnded { run_id: run, ends },
    )
    .await
    .expect("applied");
}

#[tokio::test]
async fn ends_delivered_again_after_their_writer_died_open_what_the_run_has_out() {
    let system = system(HashMap::new()).await;
    // The task claimed, its run started by the agent: its first window (8) opened.
    let (id, run) = started_run(&system, 20).await;
    assert_eq!(run.run.as_ref().expect("a run").ledger.marks, "o".repeat(8));

    // A scheduler applies two ends and dies before its effects: the ledger has elements 8 and
    // 9 out, which were never created.
    let ends = done([0, 1]);
    written_and_died(&system, &run, &ends).await;
    for k in [8, 9] {
        let e = system.store.get_state(element_id(run.task_id, k)).await;
        assert!(e.expect("reads").is_none(), "element {k} not opened yet");
    }

    // The same ends, delivered again beside a new one (element 2's): what the run has out
    // opens now (not at the run's check, minutes later), and the new end opens element 10.
    let mut again = ends.clone();
    again.extend(done([2]));
    delivered(&system, run.task_id, again).await;
    for k in [8, 9, 10] {
        let e = system.store.get_state(element_id(run.task_id, k)).await;
        assert!(e.expect("reads").is_some(), "element {k} opened");
    }
    // Alone, ends applied already change nothing and open again what is out.
    delivered(&system, run.task_id, ends).await;
    sas_blackbox::pump_until_quiet(&system, 400).await;
    let task = sas_blackbox::state(&system, id).await;
    assert_eq!(
        task.process_state,
        ProcessState::Processed,
        "{:?}",
        task.history
    );
}

#[tokio::test]
async fn ends_delivered_again_to_a_run_that_ended_send_the_answer_its_writer_died_before() {
    let system = system(HashMap::new()).await;
    let (id, run) = started_run(&system, 2).await;
    assert_eq!(run.run.as_ref().expect("a run").ledger.marks, "oo");

    // A scheduler applies both ends, which end the run, and dies before answering the task.
    let ends = done([0, 1]);
    let ended = written_and_died(&system, &run, &ends).await;
    assert_eq!(ended.process_state, ProcessState::Processed);
    assert!(ended.notice_pending(), "the run owes its answer");

    // The same ends come back with their message: the run answers now.
    delivered(&system, run.task_id, ends).await;
    let run = sas_blackbox::state(&system, run.task_id).await;
    assert!(!run.notice_pending(), "the run's answer went out");
    // No clock moved, no sweep: the scheduler alone takes the answer.
    for _ in 0..5 {
        system.pump_scheduler().await.expect("scheduler");
    }
    let task = sas_blackbox::state(&system, id).await;
    assert!(
        task.history
            .iter()
            .any(|h| h.step.as_deref() == Some("post") && h.reason == "step done"),
        "the run's answer completes its step: {:?}",
        task.history
    );
}

#[tokio::test]
async fn a_late_copy_of_an_earlier_undo_undoes_again_what_the_run_has_out() {
    let system = system(HashMap::new()).await;
    let (id, _) = started_run(&system, 2).await;
    sas_blackbox::pump_until_quiet(&system, 400).await;
    let run = sas_blackbox::state(&system, run_of(id)).await;
    assert_eq!(run.process_state, ProcessState::Processed);
    // The task's undo, attempt 6, is written to the run; its agent dies before the undos
    // begin: both elements are marked undoing, their records still Processed.
    let (t, fx) = sas::domain::transition::undo_run(&run, 6, chrono::Utc::now()).expect("undo");
    assert_eq!(fx.undo, vec![1, 0]);
    system
        .store
        .put(&t.record, &t.condition)
        .await
        .expect("written");
    // A late copy of attempt 5's request comes: stale, it answers `Accepted` (fenced out by
    // the task) and undoes again what the run has out.
    let request: sas::messages::StepRequest = serde_json::from_value(json!({
        "taskId": id,
        "workflow": "nightly",
        "workflowVersion": 1,
        "step": "post",
        "stepIndex": 0,
        "service": sas::domain::workflow::RUN_SERVICE,
        "action": "undo-run",
        "attempt": 5,
        "undo": true,
        "undoes": idempotency_key(id, "post", "post", 0),
        "completeBy": chrono::Utc::now() + chrono::Duration::seconds(30),
        "replyQueueUrl": "memory://sas/replies",
        "input": null
    }))
    .expect("a request");
    let call = sas::handlers::runs::undo_run_request(&system.scheduler.ports, &request)
        .await
        .expect("answers");
    assert_eq!(call.answer, sas::domain::transition::StepOutcome::Accepted);
    call.then(&system.scheduler.ports).await.expect("undoes");
    let run = sas_blackbox::state(&system, run_of(id)).await;
    assert_eq!(
        run.parent.as_ref().and_then(|l| l.undo_attempt),
        Some(6),
        "the run answers attempt 6"
    );
    for k in [0, 1] {
        let e = sas_blackbox::state(&system, element_id(run.task_id, k)).await;
        assert_ne!(
            e.process_state,
            ProcessState::Processed,
            "element {k}'s undo began"
        );
    }
}

#[tokio::test]
async fn an_element_left_with_its_effect_stops_its_run_and_its_task_waits_for_an_operator() {
    // Some posts answer more than a result may be (the step faults: it may have taken effect),
    // and every void is refused: such an element ends CompensationFailed on its own.
    let faults = HashMap::from([(
        "ledger".to_owned(),
        // (Decided per key, and keys hold the task's random id: at 0.1, one run in 70 had no
        // element oversized among 40; at 0.2, one in 7,500.)
        sas::remote::Faults {
            oversized: 0.2,
            refuse_actions: vec!["void".into()],
            seed: Some(7),
            ..sas::remote::Faults::default()
        },
    )]);
    let system = system(faults).await;
    let id = sas_blackbox::submit_task(&system, "nightly", &invoices(40)).await;
    sas_blackbox::pump_until_quiet(&system, 2000).await;
    let run = sas_blackbox::state(&system, run_of(id)).await;
    let ledger = &run.run.as_ref().expect("a run").ledger;
    // The run stopped at the stuck element, finished what was out and tried every undo: it
    // waits for an operator, and so does its task (not the step's 24 hours).
    assert!(ledger.marks.contains('!'), "{ledger}");
    assert!(!ledger.marks.contains('o'), "{ledger}");
    assert_eq!(
        run.process_state,
        ProcessState::CompensationFailed,
        "{ledger}"
    );
    let task = sas_blackbox::state(&system, id).await;
    assert_eq!(
        task.process_state,
        ProcessState::CompensationFailed,
        "{:?}",
        task.history
    );
}

/// A service whose `post` answers about 2 KB (the element's index and padding) and whose
/// `last` answers what it was sent; every body `last` received.
async fn bulky_service() -> (String, Arc<std::sync::Mutex<Vec<Value>>>) {
    use axum::extract::{Path, State};
    type Seen = Arc<std::sync::Mutex<Vec<Value>>>;
    let seen: Seen = Arc::default();
    let app = axum::Router::new()
        .route(
            "/{action}",
            axum::routing::post(
                |State(seen): State<Seen>,
                 Path(action): Path<String>,
                 axum::Json(body): axum::Json<Value>| async move {
                    axum::Json(if action == "post" {
                        json!({"at": body["at"], "pad": "p".repeat(2000)})
                    } else {
                        seen.lock().expect("lock").push(body.clone());
                        json!({"seen": true})
                    })
                },
            ),
        )
        .with_state(seen.clone())
        .layer(axum::extract::DefaultBodyLimit::max(16 * 1024 * 1024));
    (sas_blackbox::serve_loopback(app).await, seen)
}

/// A distributed forEach whose results pass a step's 6 MiB (4,000 elements answering about
/// 2 KB each): the step's result is a JSON Lines object of the task's, each element's result
/// on its line in order; the task's record keeps its reference; a later step's condition and
/// mapping read the array (its length, its last element) and the views show the reference.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_past_six_mib_are_json_lines_by_reference_and_later_steps_read_them() {
    const N: usize = 4_000;
    let (url, seen) = bulky_service().await;
    let settings = Settings {
        definitions: vec![],
        ..sas_blackbox::manual_settings()
    };
    let system = System::new(Backend::Memory, settings, Arc::new(sas::ports::SystemClock))
        .await
        .expect("builds");
    let services =
        format!("services:\n  - name: bulk\n    target: {{type: http, baseUrl: \"{url}\"}}\n");
    let workflow = format!(
        r#"name: bulky
steps:
  - name: post
    service: bulk
    forEach: $.input.items
    distributed: true
    maxConcurrency: 250
    input: {{at: $.index}}
  - name: last
    service: bulk
    action: last
    when: "size(steps.post.result) == {N}"
    input: {{last: "$.steps.post.result[{}]", first: "$.steps.post.result[0].at"}}
"#,
        N - 1
    );
    system
        .publish(&[
            ("services.yaml".into(), services),
            ("bulky.yaml".into(), workflow),
        ])
        .await
        .expect("publishes");
    let items: Vec<Value> = (0..N).map(|i| json!(i)).collect();
    let id = sas_blackbox::submit_task(&system, "bulky", &json!({"items": items})).await;
    sas_blackbox::pump_until_quiet(&system, 20_000).await;
    let task = sas_blackbox::state(&system, id).await;
    assert_eq!(
        task.process_state,
        ProcessState::Processed,
        "{:?} {:?}",
        task.last_error,
        task.history
    );

    // The step's result: a reference to JSON Lines of the task's, never the content.
    let kept = task.steps[0].result_ref.clone().expect("a reference");
    assert_eq!(task.steps[0].result, None);
    let lines = kept.lines.as_ref().expect("JSON Lines");
    assert_eq!(lines.count, N as u64);
    assert!(kept.bytes > 6 * 1024 * 1024, "{} bytes", kept.bytes);
    assert!(kept.key().starts_with(&sas::domain::PayloadRef::prefix(id)));
    let stored = serde_json::to_vec(&task).expect("json").len();
    assert!(stored < 16 * 1024, "the task's record is {stored} bytes");
    let body = system
        .scheduler
        .ports
        .payloads
        .get(&kept)
        .await
        .expect("the object is there and matches its reference");
    let text = std::str::from_utf8(&body).expect("UTF-8");
    let mut count = 0;
    for (k, line) in text.lines().enumerate() {
        let v: Value = serde_json::from_str(line).expect("each line one JSON value");
        assert_eq!(v["at"], json!(k), "element {k} on its line");
        assert_eq!(v["pad"].as_str().map(str::len), Some(2000));
        count += 1;
    }
    assert_eq!(count, N);

    // The later step ran (its condition read the list's length) with the last element.
    let bodies = seen.lock().expect("lock").clone();
    assert_eq!(bodies.len(), 1, "`last` called once");
    assert_eq!(bodies[0]["first"], json!(0));
    assert_eq!(bodies[0]["last"]["at"], json!(N - 1));
    assert_eq!(bodies[0]["last"]["pad"].as_str().map(str::len), Some(2000));

    // The views show the reference: its size, element count and hash.
    let (status, view) =
        sas_blackbox::operator_call(&system, http::Method::GET, &format!("/tasks/{id}"), b"").await;
    assert_eq!(status, 200, "{view}");
    let shown = &view["steps"][0]["result"]["jsonLines"];
    assert_eq!(shown["elements"], json!(N), "{}", view["steps"][0]);
    assert_eq!(shown["bytes"], json!(kept.bytes));
    assert_eq!(shown["sha256"], json!(kept.sha256));
    assert!(
        view.to_string().len() < 256 * 1024,
        "the view is {} bytes",
        view.to_string().len()
    );

    // The result whole, read through the API: sas-local's objects have no read URL, so the
    // answer is the JSON Lines themselves (S3's is a redirect: tests/payloads.rs).
    let api = &system.operator;
    let read = |path: String| async move {
        sas::api::handle(
            api,
            &sas_blackbox::operator(),
            &http::Method::GET,
            &format!("{}{path}", sas::api::OPERATOR_PREFIX),
            &http::HeaderMap::new(),
            b"",
        )
        .await
    };
    let answer = read(format!("/tasks/{id}/steps/post/result")).await;
    assert_eq!(answer.status(), 200);
    assert_eq!(
        answer.headers().get(http::header::CONTENT_TYPE),
        Some(&http::HeaderValue::from_static("application/x-ndjson"))
    );
    let lines: Vec<Value> = answer
        .body()
        .lines()
        .map(|l| serde_json::from_str(l).expect("a line of JSON"))
        .collect();
    assert_eq!(lines.len(), N);
    assert_eq!(lines[N - 1]["at"], json!(N - 1), "in order");
    assert_eq!(answer.body().len() as u64, kept.bytes);
    let answer = read(format!("/tasks/{id}/steps/nope/result")).await;
    assert_eq!(answer.status(), 404, "{}", answer.body());
    assert!(
        answer.body().contains("result_not_found"),
        "{}",
        answer.body()
    );
}

/// Element `k`'s call of task `id`: its mapping read its element, its index in the list and
/// the task's input.
fn called_with_its_element(system: &System, id: TaskId, k: usize) {
    let requests = sas_blackbox::requests(system, "ledger", &id.to_string());
    let call = requests
        .iter()
        .find(|(action, input)| action == "post" && input["at"] == json!(k))
        .unwrap_or_else(|| panic!("element {k} called"));
    assert_eq!(
        call.1,
        json!({"invoice": {"invoice": format!("inv-{k}")}, "at": k, "batch": "2026-11-29"})
    );
}

/// The forEach step's result (inline).
fn step_result(task: &StateRecord) -> Value {
    serde_json::from_str(task.steps[0].result.as_deref().expect("a result")).expect("JSON")
}

/// Task `id`'s report step read the forEach's `result`.
fn report_read(system: &System, id: TaskId, result: &Value) {
    let requests = sas_blackbox::requests(system, "ledger", &id.to_string());
    let report = requests
        .iter()
        .find(|(action, _)| action == "report")
        .expect("report called");
    assert_eq!(report.1, json!({"posted": result}));
}

/// The nightly workflow keeping its elements in chunks of 10, `at_once` chunks at once (each
/// one element at a time), tolerating `tolerated` refused elements.
fn chunked(tolerated: &str, at_once: u32) -> String {
    NIGHTLY
        .replace("name: nightly", "name: nightly-chunks")
        .replace(
            "    maxConcurrency: 8\n",
            &format!(
                "    maxConcurrency: {at_once}\n    chunk: 10\n    toleratedRefusals: {tolerated}\n"
            ),
        )
}

/// A system with [`chunked`] published, 4 chunks at once.
async fn chunked_system(faults: HashMap<String, sas::remote::Faults>, tolerated: &str) -> System {
    chunked_system_at(faults, tolerated, 4).await
}

async fn chunked_system_at(
    faults: HashMap<String, sas::remote::Faults>,
    tolerated: &str,
    at_once: u32,
) -> System {
    let system = system(faults).await;
    system
        .publish(&[("nightly-chunks.yaml".into(), chunked(tolerated, at_once))])
        .await
        .expect("publishes");
    system
}

/// The run of a `nightly-chunks` task.
fn chunked_run_of(task: TaskId) -> TaskId {
    run_id(&idempotency_key(task, "post", "post", 0))
}

#[tokio::test]
async fn chunks_run_each_element_once_under_its_own_key_and_index_and_the_step_answers_in_order() {
    let system = chunked_system(HashMap::new(), "0").await;
    let id = sas_blackbox::submit_task(&system, "nightly-chunks", &invoices(45)).await;
    sas_blackbox::pump_until_quiet(&system, 400).await;
    let task = sas_blackbox::state(&system, id).await;
    assert_eq!(
        task.process_state,
        ProcessState::Processed,
        "{:?}",
        task.history
    );
    let run = sas_blackbox::state(&system, chunked_run_of(id)).await;
    let ledger = &run.run.as_ref().expect("a run").ledger;
    // Five chunks (the last of 5), each one mark of the ledger.
    assert_eq!(ledger.marks, "ddddd", "{ledger}");
    assert_eq!(ledger.refused(), 0);
    // Each chunk: a record of its own running its elements (its input) as an in-record forEach.
    for c in 0..5u32 {
        let (chunk_task, chunk) =
            sas_blackbox::task_and_state(&system, element_id(run.task_id, c)).await;
        assert_eq!(chunk.process_state, ProcessState::Processed);
        let first = c * 10;
        assert_eq!(
            chunk.element_of().and_then(|e| e.first),
            Some(first),
            "chunk {c}"
        );
        let len = if c == 4 { 5 } else { 10 };
        assert_eq!(
            chunk_task.input,
            json!(
                (first..first + len)
                    .map(|k| json!({"invoice": format!("inv-{k}")}))
                    .collect::<Vec<_>>()
            )
        );
        assert_eq!(chunk.steps[0].elements.len(), len as usize);
    }
    // No sixth record: the elements live in their chunks.
    assert!(
        system
            .store
            .get_state(element_id(run.task_id, 5))
            .await
            .expect("read")
            .is_none()
    );
    // Every element called once, under the task's key for it, with its index in the list.
    let effects = sas_blackbox::effects(&system, "ledger", id);
    for k in 0..45u32 {
        let key = format!("{id}:post#{k}:post");
        assert_eq!(effects.get(&key), Some(&1), "{key}: {effects:?}");
    }
    called_with_its_element(&system, id, 17);
    // The step's result: every element's result in its place, which a later step read.
    let result = step_result(&task);
    let list = result.as_array().expect("a list");
    assert_eq!(list.len(), 45);
    for (k, r) in list.iter().enumerate() {
        let chunk = sas_blackbox::state(&system, element_id(run.task_id, k as u32 / 10)).await;
        let own: Value = serde_json::from_str(
            chunk.steps[0].elements[k % 10]
                .result
                .as_deref()
                .expect("done"),
        )
        .expect("JSON");
        assert_eq!(r, &own, "element {k} in its place");
    }
    report_read(&system, id, &result);
    // Released once the task ended for good, as elements are.
    let last = sas_blackbox::state(&system, element_id(run.task_id, 4)).await;
    assert!(last.parent.as_ref().is_some_and(|l| l.released));
}

/// 45 invoices, those at `disputed` marked so the service refuses them.
fn disputed(disputed: &[usize]) -> Value {
    json!({"batch": "2026-11-29", "items": (0..45).map(|i| json!({"invoice": format!("inv-{i}"), "disputed": disputed.contains(&i)})).collect::<Vec<_>>()})
}

fn refusing_disputed() -> HashMap<String, sas::remote::Faults> {
    HashMap::from([(
        "ledger".to_owned(),
        sas::remote::Faults {
            refuse_marked: Some("/invoice/disputed".into()),
            ..sas::remote::Faults::default()
        },
    )])
}

#[tokio::test]
async fn a_refused_element_counts_alone_against_the_tolerance_and_its_chunk_goes_on() {
    let system = chunked_system(refusing_disputed(), "3").await;
    let id = sas_blackbox::submit_task(&system, "nightly-chunks", &disputed(&[3, 17, 18])).await;
    sas_blackbox::pump_until_quiet(&system, 400).await;
    let task = sas_blackbox::state(&system, id).await;
    assert_eq!(
        task.process_state,
        ProcessState::Processed,
        "{:?}",
        task.history
    );
    let run = sas_blackbox::state(&system, chunked_run_of(id)).await;
    let ledger = &run.run.as_ref().expect("a run").ledger;
    assert_eq!(ledger.refused(), 3, "{ledger}");
    assert_eq!(ledger.marks, "ddddd", "{ledger}");
    // The refused elements took no effect and answer null; every other one took effect once.
    let net = sas_blackbox::net(&system, "ledger", id);
    let result = step_result(&task);
    for k in 0..45usize {
        let refused = [3, 17, 18].contains(&k);
        let key = format!("{id}:post#{k}:post");
        assert_eq!(
            net.get(&key).copied().unwrap_or(0),
            i32::from(!refused),
            "{key}"
        );
        assert_eq!(result[k].is_null(), refused, "element {k}: {}", result[k]);
    }
}

#[tokio::test]
async fn refusals_past_the_tolerance_undo_every_element_that_took_effect_chunk_by_chunk() {
    // One chunk at a time: the stop comes with the second chunk's end, before any other opens.
    let system = chunked_system_at(refusing_disputed(), "2", 1).await;
    let id = sas_blackbox::submit_task(&system, "nightly-chunks", &disputed(&[3, 17, 18])).await;
    sas_blackbox::pump_until_quiet(&system, 800).await;
    let task = sas_blackbox::state(&system, id).await;
    assert_eq!(
        task.process_state,
        ProcessState::Refused,
        "{:?}",
        task.history
    );
    let run = sas_blackbox::state(&system, chunked_run_of(id)).await;
    let ledger = &run.run.as_ref().expect("a run").ledger;
    assert_eq!(run.process_state, ProcessState::Refused, "{ledger}");
    assert_eq!(ledger.refused(), 3, "{ledger}");
    // The third refusal (element 18, in the second chunk) stopped the run: no chunk opened
    // after it, and each chunk that took effect was undone, element by element.
    assert_eq!(ledger.marks, "xx", "{ledger}");
    let net = sas_blackbox::net(&system, "ledger", id);
    assert!(net.values().all(|n| *n == 0), "{net:?}");
    let posted = sas_blackbox::effects(&system, "ledger", id)
        .keys()
        .filter(|k| k.ends_with(":post"))
        .count();
    assert_eq!(
        posted,
        9 + 8,
        "the two chunks' elements but the disputed ones"
    );
}

#[tokio::test]
async fn an_element_that_fails_fails_its_chunk_which_is_undone_and_counts_every_element_refused() {
    // Some posts answer more than a result may be (the element faults: it may have taken
    // effect), others are refused with an oversized message; voids succeed.
    let faults = HashMap::from([(
        "ledger".to_owned(),
        sas::remote::Faults {
            oversized: 0.1,
            seed: Some(11),
            ..sas::remote::Faults::default()
        },
    )]);
    let system = chunked_system(faults, "\"100%\"").await;
    // The report on a service of its own: faults are decided per key, and the report's key
    // holds the task's random id, so on the ledger a tenth of the runs would fault the report.
    system
        .publish(&[
            (
                "reports.yaml".into(),
                "services:\n  - name: reports\n    target: {type: simulated}\n".into(),
            ),
            (
                "nightly-chunks.yaml".into(),
                chunked("\"100%\"", 4).replace(
                    "  - name: report\n    service: ledger\n",
                    "  - name: report\n    service: reports\n",
                ),
            ),
        ])
        .await
        .expect("publishes");
    let id = sas_blackbox::submit_task(&system, "nightly-chunks", &invoices(100)).await;
    sas_blackbox::pump_until_quiet(&system, 3000).await;
    let task = sas_blackbox::state(&system, id).await;
    assert!(
        sas_blackbox::requests(&system, "ledger", &id.to_string())
            .iter()
            .all(|(action, _)| action != "report"),
        "the report went to its own service"
    );
    assert_eq!(
        task.process_state,
        ProcessState::Processed,
        "{:?}",
        task.history
    );
    let run = sas_blackbox::state(&system, chunked_run_of(id)).await;
    let ledger = &run.run.as_ref().expect("a run").ledger;
    let result = step_result(&task);
    let net = sas_blackbox::net(&system, "ledger", id);
    let mut failed = 0;
    let mut refused = 0;
    for c in 0..10u32 {
        let chunk = sas_blackbox::state(&system, element_id(run.task_id, c)).await;
        let keys = (c * 10..c * 10 + 10).map(|k| format!("{id}:post#{k}:post"));
        match chunk.process_state {
            // An element failed (faulted): the chunk undid every element that took effect,
            // and all ten count as refused, each answering null.
            ProcessState::Compensated => {
                failed += 1;
                refused += 10;
                assert_eq!(ledger.mark(c), Some(sas::domain::run::Mark::Failed));
                for (k, key) in keys.enumerate() {
                    assert_eq!(net.get(&key).copied().unwrap_or(0), 0, "{key}");
                    assert!(result[c as usize * 10 + k].is_null());
                }
            }
            ProcessState::Processed => {
                for (k, (key, e)) in keys.zip(&chunk.steps[0].elements).enumerate() {
                    let done = e.status == sas::StepStatus::Done;
                    refused += u32::from(!done);
                    assert_eq!(
                        net.get(&key).copied().unwrap_or(0),
                        i32::from(done),
                        "{key}"
                    );
                    assert_eq!(result[c as usize * 10 + k].is_null(), !done);
                }
            }
            other => panic!("chunk {c} is {other}: {:?}", chunk.history),
        }
    }
    assert_eq!(ledger.refused(), refused, "{ledger}");
    // (Decided per key: at 0.1 a tenth of the posts are oversized, half of them applied.)
    assert!(failed > 0, "some chunk met a faulted element: {ledger}");
}
