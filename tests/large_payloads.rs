//! Payloads past the record's limits (issue 42): a workflow the code has never seen takes a
//! 1 MB input (a quote with its lines), its first service answers a 1 MB report, and a later
//! step's body carries both intact, byte for byte; the task's items stay small, and the body
//! names the two objects kept already rather than keeping a third. At the end of
//! the task's retention its objects are deleted, then its items. On the in-memory system and on
//! the stack's own resources on the emulator (S3 on moto).

use axum::Json;
use axum::extract::{Path, State};
use axum::routing::post;
use sas::TaskId;
use sas::domain::payload::PayloadRef;
use sas::ports::{Clock, OffsetClock, PayloadError, TaskStore};
use sas_blackbox::serve_loopback;
use sas_local::{Backend, Settings, System};
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const MB: usize = 1024 * 1024;

/// How long a final task is kept, in these tests.
fn retention() -> chrono::Duration {
    chrono::Duration::days(7)
}

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
    input: {quote: $.input, report: $.steps.fetch.result}
"#;
    vec![
        ("services.yaml".into(), services),
        ("quote-report.yaml".into(), workflow.into()),
    ]
}

async fn run(mut system: System, calls: &Calls, clock: &OffsetClock) {
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

    let filed = filed(calls);
    assert_eq!(filed.len(), 1, "one filing");
    // (Compared, never printed: megabytes.)
    assert!(
        filed[0]["quote"] == input,
        "the 1 MB input reached the body intact"
    );
    assert!(
        filed[0]["report"]["report"].as_str() == Some(report().as_str()),
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

    // The retention: the task's notice out, its record is due at the retention's end; the
    // supervisor then deletes its objects, then its items.
    let kept = kept(&task, &whole);
    assert_eq!(
        kept.len(),
        2,
        "the input and the report are kept by reference"
    );
    let purge_at = purge_time(&system, id).await;
    let payloads = system.supervisor.ports.payloads.clone();
    // The body passed both on whole: it went as two parts, the objects above, not as a third.
    let body = PayloadRef::of(id, filed[0].to_string().as_bytes());
    assert!(
        matches!(payloads.get(&body).await, Err(PayloadError::NotFound(_))),
        "the body is not kept again"
    );
    for r in &kept {
        payloads
            .get(r)
            .await
            .expect("kept until the retention ends");
    }
    clock.advance(retention() + chrono::Duration::minutes(1));
    assert!(clock.now() > purge_at);
    for _ in 0..100 {
        if system.store.get(id).await.expect("reads").is_none() {
            break;
        }
        system.sweep().await.expect("sweeps");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        system.store.get(id).await.expect("reads").is_none(),
        "the task's items are deleted"
    );
    for r in &kept {
        assert!(
            matches!(payloads.get(r).await, Err(PayloadError::NotFound(_))),
            "the task's objects are deleted"
        );
    }
    system.shutdown().await;
}

/// The bodies the service's `file-report` action received.
fn filed(calls: &Calls) -> Vec<Value> {
    calls
        .lock()
        .expect("lock")
        .iter()
        .filter(|(a, _)| a == "file-report")
        .map(|(_, b)| b.clone())
        .collect()
}

/// What a quote-report task keeps by reference: its input, and its report (`fetch`'s result).
fn kept(task: &sas::Task, whole: &sas::StateRecord) -> Vec<PayloadRef> {
    [task.input_ref.clone(), whole.steps[0].result_ref.clone()]
        .into_iter()
        .flatten()
        .collect()
}

/// When task `id`'s retention ends: set once its final notice is out.
async fn purge_time(system: &System, id: TaskId) -> chrono::DateTime<chrono::Utc> {
    for _ in 0..200 {
        if let Some(at) = sas_blackbox::state(system, id).await.purge_at {
            return at;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("task {id}'s retention did not start");
}

/// An event of 300 KB delivered before its wait is reached is kept by reference, and becomes
/// the wait's result whole: a later step's body carries it intact.
#[tokio::test]
async fn a_300_kb_event_kept_for_a_wait_reaches_a_later_steps_body() {
    let (base, calls) = reports().await;
    let settings = Settings {
        definitions: vec![],
        ..sas_blackbox::manual_settings()
    };
    let system = System::new(Backend::Memory, settings, Arc::new(sas::ports::SystemClock))
        .await
        .expect("builds");
    let mut files = definitions(&base);
    files.push((
        "signed-report.yaml".into(),
        r#"name: signed-report
steps:
  - name: fetch
    service: reports
    action: fetch-report
  - name: sign
    waitFor: signed
    within: 1d
  - name: file
    service: reports
    action: file-report
    input: {signature: $.steps.sign.result.payload}
"#
        .into(),
    ));
    system.publish(&files).await.expect("publishes");
    let id = sas_blackbox::submit_task(&system, "signed-report", &json!({})).await;
    let signature = json!({"by": "ann", "scan": "s".repeat(300 * 1024)});
    let resp = sas::api::handle(
        &system.api,
        &sas::auth::Identity::anonymous(),
        &http::Method::POST,
        &format!("/tasks/{id}/events/signed"),
        &http::HeaderMap::new(),
        signature.to_string().as_bytes(),
    )
    .await;
    assert_eq!(resp.status(), 202, "taken");
    let (_, stored) = system
        .memory
        .clone()
        .expect("in memory")
        .0
        .get(id)
        .await
        .expect("reads")
        .expect("stored");
    let kept = &stored.inbox.kept;
    assert!(
        kept.len() == 1 && kept[0].payload.is_empty() && kept[0].payload_ref.is_some(),
        "kept by reference in the record"
    );
    sas_blackbox::pump_until_quiet(&system, 30).await;
    let r = sas_blackbox::state(&system, id).await;
    assert_eq!(r.process_state, sas::ProcessState::Processed);
    assert!(r.payloads, "its retention deletes the event's object");
    let filed = filed(&calls);
    assert_eq!(filed.len(), 1);
    assert!(
        filed[0]["signature"] == signature,
        "the event reached the body intact"
    );
}

/// Fails the first deletion of a task's items, as a supervisor that died between deleting the
/// task's objects and deleting its items would leave them.
#[derive(Default)]
struct DiesBeforeItems(std::sync::atomic::AtomicUsize);

#[async_trait::async_trait]
impl sas_local::intercept::Interceptor for DiesBeforeItems {
    async fn around<'a, R: sas_local::intercept::Reply, E: sas_local::intercept::Failure>(
        &'a self,
        next: sas_local::intercept::Next<'a, R, E>,
    ) -> Result<R, E> {
        use sas_local::intercept::Call;
        if let Call::ForgetTask { .. } = next.call()
            && self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0
        {
            return Err(E::unavailable("the supervisor died here".into()));
        }
        next.run(next.call()).await
    }
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
        retention: Some(retention()),
        ..Settings::default()
    };
    let clock = Arc::new(OffsetClock::default());
    let system = System::new(Backend::Memory, settings, clock.clone())
        .await
        .expect("builds");
    run(system, &calls, &clock).await;
}

/// A supervisor may die between any two writes of a purge: the objects deleted, the items not.
/// The record stays due, and the next sweep deletes the items (no object is left to delete).
#[tokio::test]
async fn a_purge_cut_between_the_objects_and_the_items_ends_at_the_next_sweep() {
    let (base, _calls) = reports().await;
    let settings = Settings {
        retention: Some(retention()),
        ..sas_blackbox::manual_settings()
    };
    let clock = Arc::new(OffsetClock::default());
    let hook = Arc::new(DiesBeforeItems::default());
    let mut ports = sas_local::system::ports(Backend::Memory, &settings)
        .await
        .expect("ports");
    ports.store = Arc::new(sas_local::intercept::Intercepted::new(
        ports.store.clone(),
        hook.clone(),
    ));
    let system = System::from_ports(ports, settings, clock.clone());
    system
        .publish(&definitions(&base))
        .await
        .expect("publishes");
    let id = sas_blackbox::submit_task(&system, "quote-report", &quote()).await;
    sas_blackbox::pump_until_quiet(&system, 30).await;
    let r = sas_blackbox::state(&system, id).await;
    assert_eq!(r.process_state, sas::ProcessState::Processed);
    let (task, whole) = system.store.get(id).await.expect("reads").expect("stored");
    let kept = kept(&task, &whole);
    assert_eq!(kept.len(), 2);
    let payloads = system.supervisor.ports.payloads.clone();

    let early = system.sweep().await.expect("sweeps");
    assert_eq!(early.purged, 0, "not before the retention ends");
    clock.advance(retention() + chrono::Duration::minutes(1));
    let cut = system.sweep().await.expect("sweeps");
    assert_eq!((cut.purged, cut.errors), (0, 1), "{cut:?}");
    for r in &kept {
        assert!(matches!(
            payloads.get(r).await,
            Err(PayloadError::NotFound(_))
        ));
    }
    assert!(
        system.store.get_state(id).await.expect("reads").is_some(),
        "the items are still there, due"
    );
    let again = system.sweep().await.expect("sweeps");
    assert_eq!((again.purged, again.errors), (1, 0), "{again:?}");
    assert!(system.store.get(id).await.expect("reads").is_none());
    assert_eq!(hook.0.load(std::sync::atomic::Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_1_mb_input_and_a_1_mb_result_reach_a_later_steps_body_on_the_emulator() {
    let (base, calls) = reports().await;
    let settings = Settings {
        definitions: definitions(&base),
        retention: Some(retention()),
        ..Settings::default()
    };
    let (system, clock) = sas_blackbox::aws_system("lp", settings).await;
    run(system, &calls, &clock).await;
}
