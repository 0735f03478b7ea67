//! Payloads past the record's limits (issue 42): a workflow the code has never seen takes a
//! 1 MB input (a quote with its lines), its first service answers a 1 MB report, and a later
//! step's body carries both intact, byte for byte; the task's items stay small. On the
//! in-memory system and on the stack's own resources on the emulator (S3 on moto).

use axum::Json;
use axum::extract::{Path, State};
use axum::routing::post;
use sas::TaskId;
use sas::ports::TaskStore;
use sas_blackbox::serve_loopback;
use sas_local::{Backend, Settings, System};
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const MB: usize = 1024 * 1024;

/// What the service received: each call's action and body.
type Calls = Arc<Mutex<Vec<(String, Value)>>>;

/// A service with two actions: `fetch-report` answers a report of 1 MB, `file-report` answers
/// what it was sent, in short.
async fn reports() -> (String, Calls) {
    let calls: Calls = Arc::default();
    let app = axum::Router::new()
        .route(
            "/{action}",
            post(
                |State(calls): State<Calls>,
                 Path(action): Path<String>,
                 Json(body): Json<Value>| async move {
                    calls
                        .lock()
                        .expect("lock")
                        .push((action.clone(), body.clone()));
                    Json(match action.as_str() {
                        "fetch-report" => json!({"id": "r-1", "report": report()}),
                        _ => json!({"filed": true}),
                    })
                },
            ),
        )
        .with_state(calls.clone())
        // A service taking a body of a few MB (axum's own default is 2 MB).
        .layer(axum::extract::DefaultBodyLimit::max(16 * MB));
    (serve_loopback(app).await, calls)
}

fn report() -> String {
    "0123456789abcdef".repeat(MB / 16)
}

fn quote() -> Value {
    let lines: Vec<Value> = (0..8_000)
        .map(|i| json!({"sku": format!("sku-{i:05}"), "quantity": i % 7 + 1, "note": "n".repeat(100)}))
        .collect();
    json!({"customerId": "c-77", "lines": lines})
}

fn definitions(base: &str) -> Vec<(String, String)> {
    let services =
        format!("services:\n  - name: reports\n    target: {{type: http, baseUrl: \"{base}\"}}\n");
    let workflow = r#"name: quote-report
description: A quote of 1 MB, a report of 1 MB, both filed.
steps:
  - name: fetch
    service: reports
    action: fetch-report
    input: {customerId: $.input.customerId}
  - name: file
    service: reports
    action: file-report
    input: {quote: $.input, report: $.steps.fetch.result.report}
"#;
    vec![
        ("services.yaml".into(), services),
        ("quote-report.yaml".into(), workflow.into()),
    ]
}

async fn run(mut system: System, calls: &Calls) {
    system.start();
    let input = quote();
    assert!(input.to_string().len() > MB, "the input is over 1 MB");
    let id = sas_blackbox::submit_task(&system, "quote-report", &input).await;
    let record = wait_processed(&system, id).await;
    assert_eq!(
        record.process_state,
        sas::ProcessState::Processed,
        "(never the whole record here: it holds megabytes) {:?}",
        record.last_error
    );

    let calls = calls.lock().expect("lock").clone();
    let filed: Vec<&Value> = calls
        .iter()
        .filter(|(a, _)| a == "file-report")
        .map(|(_, b)| b)
        .collect();
    assert_eq!(filed.len(), 1, "one filing");
    // (Compared, never printed: megabytes.)
    assert!(
        filed[0]["quote"] == input,
        "the 1 MB input reached the body intact"
    );
    assert!(
        filed[0]["report"].as_str() == Some(report().as_str()),
        "the 1 MB result reached the body intact"
    );

    let (task, whole) = system.store.get(id).await.expect("reads").expect("stored");
    assert!(task.input == input, "read back whole");
    assert!(
        whole.steps[0]
            .result
            .as_deref()
            .is_some_and(|r| r.len() > MB)
    );
    // In memory, the items as stored: references, not the payloads.
    if let Some((raw, _, _)) = system.memory.clone() {
        let (task, stored) = raw.get(id).await.expect("reads").expect("stored");
        assert!(task.input.is_null(), "the task's item holds no input");
        assert!(task.input_ref.is_some_and(|r| r.bytes as usize > MB));
        assert!(
            serde_json::to_string(&stored).expect("json").len() < 16 * 1024,
            "the state record holds the result by reference"
        );
        assert!(stored.steps[0].result.is_none() && stored.steps[0].result_ref.is_some());
    }
    system.shutdown().await;
}

async fn wait_processed(system: &System, id: TaskId) -> sas::StateRecord {
    for _ in 0..600 {
        let r = sas_blackbox::state(system, id).await;
        if r.process_state.is_final() {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    sas_blackbox::state(system, id).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_1_mb_input_and_a_1_mb_result_reach_a_later_steps_body_in_memory() {
    let (base, calls) = reports().await;
    let settings = Settings {
        definitions: definitions(&base),
        ..Settings::default()
    };
    let system = System::new(Backend::Memory, settings, Arc::new(sas::ports::SystemClock))
        .await
        .expect("builds");
    run(system, &calls).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_1_mb_input_and_a_1_mb_result_reach_a_later_steps_body_on_the_emulator() {
    let (base, calls) = reports().await;
    let settings = Settings {
        definitions: definitions(&base),
        ..Settings::default()
    };
    let (system, _clock) = sas_blackbox::aws_system("lp", settings).await;
    run(system, &calls).await;
}
