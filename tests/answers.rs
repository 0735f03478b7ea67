//! What a remote service answers, end to end on the in-memory adapters with a real HTTP
//! service on loopback: an answer too large to keep, a refusal with a huge message, and a
//! request the service cannot serve (404 on one task's own path).

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use sas::catalog;
use sas::{ProcessState, StepStatus};
use sas_blackbox::{manual_settings, pump_until_quiet, serve_loopback, state, submit_task};
use sas_local::System;
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// SQS's largest message, and DynamoDB's largest item.
const SQS_MAX: usize = 256 * 1024;
const DYNAMODB_MAX: usize = 400 * 1024;

/// The catalog's example files with `payment` on `payment` (a target's YAML).
fn with_payment(payment: &str) -> Vec<(String, String)> {
    let services = format!(
        "services:\n  - name: inventory\n    target: {{type: simulated}}\n  - name: payment\n    target: {payment}\n  - name: shipping\n    target: {{type: simulated}}\n"
    );
    let mut files = catalog::example_files();
    files.retain(|(name, _)| name == "ecommerce-order.yaml");
    files.insert(0, ("services.yaml".into(), services));
    files
}

/// A payment service whose answers depend on the customer: `huge-result` gets a 200 with a
/// 64 MiB body (streamed; `sent` counts the bytes it handed to the connection),
/// `huge-refusal` a 422 whose message is 4 MiB, anyone else a small success. Refunds succeed.
async fn loud_payment(sent: Arc<AtomicUsize>) -> String {
    async fn handle(
        State(sent): State<Arc<AtomicUsize>>,
        Path(action): Path<String>,
        body: axum::Json<Value>,
    ) -> Response {
        if action != "charge-payment" {
            return axum::Json(json!({"id": "refund"})).into_response();
        }
        match body.0["customerId"].as_str() {
            Some("huge-result") => {
                let chunk = Bytes::from(vec![b' '; 64 * 1024]);
                let head = Bytes::from_static(b"{\"id\":\"p\",\"pad\":\"");
                let stream = futures::stream::iter(
                    std::iter::once(head).chain(std::iter::repeat_n(chunk, 1024)),
                )
                .map(move |c| {
                    sent.fetch_add(c.len(), Ordering::SeqCst);
                    Ok::<_, std::convert::Infallible>(c)
                });
                (StatusCode::OK, Body::from_stream(stream)).into_response()
            }
            Some("huge-refusal") => (
                StatusCode::UNPROCESSABLE_ENTITY,
                axum::Json(json!({"error": {"code": "declined", "message": "x".repeat(4 << 20)}})),
            )
                .into_response(),
            _ => axum::Json(json!({"id": "p"})).into_response(),
        }
    }
    serve_loopback(
        axum::Router::new()
            .route("/{action}", axum::routing::post(handle))
            .with_state(sent),
    )
    .await
}

use futures::StreamExt;

fn order(customer: &str) -> Value {
    json!({"customerId": customer, "items": [{"sku": "SKU-1", "quantity": 1}]})
}

/// An in-memory system whose payment service is [`loud_payment`].
async fn loud_system(sent: Arc<AtomicUsize>) -> System {
    let base = loud_payment(sent).await;
    let settings = sas_local::Settings {
        definitions: with_payment(&format!("{{type: http, baseUrl: \"{base}\"}}")),
        ..manual_settings()
    };
    sas_blackbox::memory_system(settings).await
}

/// Asserts that `r` fits well within DynamoDB's item limit and its history lines are short.
fn assert_small(r: &sas::StateRecord) {
    let size = serde_json::to_vec(r).expect("JSON").len();
    assert!(size < DYNAMODB_MAX / 4, "record of {size} bytes");
    assert!(
        r.history.iter().all(|h| h.reason.len() < 2048),
        "{:?}",
        r.history
    );
}

#[tokio::test]
async fn a_success_too_large_to_keep_is_read_no_further_than_the_limit_and_faults_the_step() {
    let sent = Arc::new(AtomicUsize::new(0));
    let system = loud_system(sent.clone()).await;
    // The step took effect, so the task fails (an alert) and is compensated; the agent read
    // no more of the answer than its limit.
    let id = submit_task(&system, "ecommerce-order", &order("huge-result")).await;
    pump_until_quiet(&system, 40).await;
    let r = state(&system, id).await;
    assert_eq!(r.process_state, ProcessState::Compensated, "{r:?}");
    assert_eq!(r.steps[1].status, StepStatus::Faulted, "{r:?}");
    assert!(
        r.last_error
            .as_deref()
            .is_some_and(|e| e.contains("result_too_large")),
        "{r:?}"
    );
    let total = 64 << 20;
    let read = sent.load(Ordering::SeqCst);
    assert!(
        read < total / 2,
        "the agent stopped reading: {read} of {total} bytes left the service"
    );
    assert_small(&r);
    system.shutdown().await;
}

#[tokio::test]
async fn a_refusal_with_a_huge_message_is_refused_with_a_capped_message() {
    let system = loud_system(Arc::default()).await;
    let (_, _, bus) = system.memory.clone().expect("in memory");
    let id = submit_task(&system, "ecommerce-order", &order("huge-refusal")).await;
    pump_until_quiet(&system, 40).await;
    let r = state(&system, id).await;
    assert_eq!(r.process_state, ProcessState::Refused, "{r:?}");
    let refusal = r.refusal.clone().expect("the refusal is kept");
    assert!(
        refusal.message.len() <= sas::remote::MAX_TEXT_BYTES,
        "capped: {} bytes",
        refusal.message.len()
    );
    assert_small(&r);
    let events = bus.published();
    assert!(events.iter().any(|(t, _)| t == "TaskRefused"), "{events:?}");
    for (t, detail) in &events {
        let size = detail.to_string().len();
        assert!(size < SQS_MAX / 4, "{t}: {size} bytes");
    }
    system.shutdown().await;
}

/// An accounts-style payment service: `POST /charges/{customerId}` answers 404 for the
/// customer `ghost` (an id it does not know) and succeeds for anyone else; refunds succeed.
async fn lookup_payment() -> String {
    async fn charge(Path(customer): Path<String>) -> Response {
        if customer == "ghost" {
            return (StatusCode::NOT_FOUND, "no such customer").into_response();
        }
        axum::Json(json!({"id": format!("p-{customer}")})).into_response()
    }
    async fn refund() -> Response {
        axum::Json(json!({"id": "refund"})).into_response()
    }
    serve_loopback(
        axum::Router::new()
            .route("/charges/{customer}", axum::routing::post(charge))
            .route("/refund-payment", axum::routing::post(refund)),
    )
    .await
}

/// A 404 on one task's own path (`/charges/{$.input.customerId}` with an unknown id) is about
/// that task, not the service: its retries do not open the shared breaker (which would defer,
/// or pause, every other task of the service), the other tasks go through undeferred, and the
/// task itself fails within its threshold, with the `Failed` alert, instead of waiting for
/// ever.
#[tokio::test]
async fn a_404_on_one_tasks_path_stops_that_task_with_an_alert_and_stalls_no_other() {
    let base = lookup_payment().await;
    let payment = format!(
        "{{type: http, baseUrl: \"{base}\", actions: {{charge-payment: {{method: POST, path: \"/charges/{{$.input.customerId}}\"}}}}}}"
    );
    let mut settings = sas_local::Settings {
        definitions: with_payment(&payment),
        ..manual_settings()
    };
    // Each attempt retries the 404 for a second (dozens of calls); three attempts fail the
    // step. A breaker counting every fault in a row would open within one attempt.
    settings.policy.step_timeout = chrono::Duration::seconds(1);
    settings.breaker.threshold = 3;
    settings.breaker.read_cache = chrono::Duration::zero();
    let system = sas_blackbox::memory_system(settings).await;
    let (_, _, bus) = system.memory.clone().expect("in memory");

    let ghost = submit_task(&system, "ecommerce-order", &order("ghost")).await;
    let mut others = Vec::new();
    for round in 0..2 {
        for i in 0..2 {
            others.push(
                submit_task(
                    &system,
                    "ecommerce-order",
                    &order(&format!("c-{round}-{i}")),
                )
                .await,
            );
        }
        pump_until_quiet(&system, 200).await;
    }

    // Each deferral of the ghost's step waits a little (a jitter of up to a second, so the
    // tasks deferred together do not come back together): pump until it has stopped (neither
    // waiting for a claim nor out).
    // (A wall-clock bound, not a count of rounds: on a loaded machine each round is slower.)
    let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while std::time::Instant::now() < until {
        if !matches!(
            state(&system, ghost).await.process_state,
            ProcessState::Pending | ProcessState::Processing
        ) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        pump_until_quiet(&system, 20).await;
    }
    let r = state(&system, ghost).await;
    // Stopped for an operator (automatic compensation is on: a misconfiguration is no
    // business failure), its step deferred, never failed by a timeout.
    assert_eq!(r.process_state, ProcessState::Error, "{r:?}");
    assert_eq!(
        (r.steps[1].status, r.steps[1].misconfigured, r.failure_count),
        (StepStatus::Pending, 3, 0),
        "{r:?}"
    );
    assert!(
        r.last_error.as_deref().is_some_and(|e| e.contains("404")),
        "{r:?}"
    );
    let events = bus.published();
    let failed: Vec<_> = events
        .iter()
        .filter(|(t, d)| t == "TaskFailed" && d["taskId"] == ghost.to_string())
        .collect();
    assert_eq!(failed.len(), 1, "one Failed alert: {events:?}");
    assert!(
        !events.iter().any(|(t, _)| t == "ServiceUnavailable"),
        "the breaker never opened: {events:?}"
    );
    let breaker = system
        .store
        .get_breaker("payment")
        .await
        .expect("read")
        .expect("written");
    assert!(breaker.is_closed(), "{breaker:?}");
    for id in others {
        let r = state(&system, id).await;
        assert_eq!(r.process_state, ProcessState::Processed, "{r:?}");
        assert!(
            r.history.iter().all(|h| !h.reason.starts_with("deferred")),
            "not deferred: {:?}",
            r.history
        );
    }
    system.shutdown().await;
}

/// Loses every write that would complete the loan's callback step (`send-contract`), as a
/// burst of other writes to the record would, while `on`.
#[derive(Default)]
struct Contend {
    on: std::sync::atomic::AtomicBool,
    lost: AtomicUsize,
}

/// A condition no stored record meets: the write is refused as a lost race.
static NEVER: sas::domain::Condition = sas::domain::Condition::Absent;

#[async_trait::async_trait]
impl sas_local::intercept::Interceptor for Contend {
    async fn around<'a, R: sas_local::intercept::Reply, E: sas_local::intercept::Failure>(
        &'a self,
        next: sas_local::intercept::Next<'a, R, E>,
    ) -> Result<R, E> {
        use sas_local::intercept::Call;
        let call = next.call();
        if let Call::PutAs { put, write } = call
            && self.on.load(Ordering::SeqCst)
            && put
                .record
                .steps
                .get(2)
                .is_some_and(|s| s.name == "send-contract" && s.status == StepStatus::Done)
        {
            self.lost.fetch_add(1, Ordering::SeqCst);
            let put = sas::ports::Guarded::new(put.record, &NEVER);
            return next.run(Call::PutAs { put, write }).await;
        }
        next.run(call).await
    }
}

/// An in-memory system (not started) whose store goes through `hook`, with the examples
/// published.
async fn intercepted(
    settings: sas_local::Settings,
    hook: Arc<impl sas_local::intercept::Interceptor + 'static>,
) -> System {
    let mut ports = sas_local::system::ports(sas_local::Backend::Memory, &settings)
        .await
        .expect("ports");
    ports.store = Arc::new(sas_local::intercept::Intercepted::new(
        ports.store.clone(),
        hook,
    ));
    let system = System::from_ports(ports, settings, Arc::new(sas::ports::SystemClock));
    system
        .publish(&catalog::example_files())
        .await
        .expect("the examples publish");
    system
}

/// A callback that loses every race for its record (its service calls back once) is not
/// dropped: its message comes back and completes the step once the record is quiet.
#[tokio::test]
async fn a_callback_that_loses_every_race_comes_back_and_completes_its_step() {
    let settings = sas_local::Settings {
        visibility_timeout: Some(std::time::Duration::from_secs(1)),
        ..manual_settings()
    };
    let hook = Arc::new(Contend::default());
    hook.on.store(true, Ordering::SeqCst);
    let system = intercepted(settings, hook.clone()).await;
    let id = sas_blackbox::submit_loan(&system).await;
    pump_until_quiet(&system, 50).await;
    let lost = hook.lost.load(Ordering::SeqCst);
    assert!(lost >= 4, "the callback lost its races: {lost}");
    let r = state(&system, id).await;
    assert_eq!(r.steps[2].status, StepStatus::Waiting, "{r:?}");
    // The record is quiet again: the callback's message comes back and applies.
    hook.on.store(false, Ordering::SeqCst);
    let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::time::Instant::now() < until {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        pump_until_quiet(&system, 20).await;
        let r = state(&system, id).await;
        if r.process_state == ProcessState::Processed {
            break;
        }
        if r.current_step() == Some("cooling-off") {
            // Signed; the applicant waives the cooling-off.
            sas_blackbox::wake(&system, id).await;
        }
    }
    let r = state(&system, id).await;
    assert_eq!(r.process_state, ProcessState::Processed, "{r:?}");
    assert_eq!(r.steps[2].status, StepStatus::Done);
}

/// Loses the first claim's write (the record Pending, the write Processing), as a write that
/// claims nothing (an event kept for a later step) coming first would.
#[derive(Default)]
struct FirstClaimLoses(AtomicUsize);

#[async_trait::async_trait]
impl sas_local::intercept::Interceptor for FirstClaimLoses {
    async fn around<'a, R: sas_local::intercept::Reply, E: sas_local::intercept::Failure>(
        &'a self,
        next: sas_local::intercept::Next<'a, R, E>,
    ) -> Result<R, E> {
        use sas_local::intercept::Call;
        let call = next.call();
        if let Call::PutAs { put, write } = call
            && put.record.process_state == ProcessState::Processing
            && put.record.attempt == 1
            && self.0.fetch_add(1, Ordering::SeqCst) == 0
        {
            let put = sas::ports::Guarded::new(put.record, &NEVER);
            return next.run(Call::PutAs { put, write }).await;
        }
        next.run(call).await
    }
}

/// A claim that loses its race to a write that claims nothing is tried again on the record
/// read anew, at once: the task does not wait for its pickup deadline.
#[tokio::test]
async fn a_claim_that_loses_its_race_claims_again_at_once() {
    let hook = Arc::new(FirstClaimLoses::default());
    let system = intercepted(manual_settings(), hook.clone()).await;
    let id = sas_blackbox::submit_ok(&system).await;
    let claimed = system.pump_scheduler().await.expect("scheduler poll");
    assert_eq!(claimed, 1, "one work message");
    assert_eq!(hook.0.load(Ordering::SeqCst), 2, "lost once, then claimed");
    let r = state(&system, id).await;
    assert_eq!(r.process_state, ProcessState::Processing, "{r:?}");
    assert_eq!(r.attempt, 1);
    pump_until_quiet(&system, 30).await;
    assert_eq!(
        state(&system, id).await.process_state,
        ProcessState::Processed
    );
}
