//! The loan example on real service targets, as a team would run it: `credit-bureau` an HTTP
//! service that wants a bearer token (read from Secrets Manager on the emulator with the real
//! SDK client), `core-banking` an HTTP service with its own paths (`POST /holds`,
//! `DELETE /holds/{hold}`) that answers 401 for a window and 409 while a key is in progress,
//! and `e-sign` an AWS Lambda function (a stub of the Invoke API driven by the real
//! aws-sdk-lambda client) whose `send-contract` completes by callback through the task API.
//!
//! The 401 window trips core-banking's breaker and raises one `ServiceUnavailable` alert, but
//! compensates nothing: the tasks wait and then finish. A 409 on a retried key does not fail
//! the step.

use axum::extract::{Path, Request, State};
use axum::http::{Method, StatusCode, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use sas::aws::AwsCredentials;
use sas::catalog;
use sas::ports::SystemClock;
use sas::remote::{Faults, SimulatedService};
use sas_blackbox::{loan_input, sdk_config, serve_loopback, unique};
use sas_local::Settings;
use sas_local::simulated::router;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The credit bureau: the simulated service over HTTP, 401 without the right bearer token.
async fn credit_bureau(token: String, seen: Arc<AtomicUsize>) -> (Arc<SimulatedService>, String) {
    let sim = Arc::new(SimulatedService::new(
        "credit-bureau",
        Faults::default(),
        Arc::new(SystemClock),
    ));
    let check = move |req: Request, next: Next| {
        let (token, seen) = (token.clone(), seen.clone());
        async move {
            let want = format!("Bearer {token}");
            if req
                .headers()
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                != Some(want.as_str())
            {
                return (StatusCode::UNAUTHORIZED, "no").into_response();
            }
            seen.fetch_add(1, Ordering::SeqCst);
            next.run(req).await
        }
    };
    let app = router(sim.clone()).layer(middleware::from_fn(check));
    (sim, serve_loopback(app).await)
}

/// What core-banking's front door does besides serving the simulated service.
#[derive(Default)]
struct Bank {
    /// While set, every call answers 401 (a token rotated on one side only, say).
    unauthorized: AtomicBool,
    /// Calls per idempotency key of `reserve-funds`: the first answers 409 "in progress".
    holds: Mutex<HashMap<String, u32>>,
    conflicts: AtomicUsize,
}

/// Core banking: `POST /holds` (reserve-funds), `DELETE /holds/{hold}` (release-funds) and
/// `POST /disburse-funds`, mapped onto the simulated service's `POST /{action}`.
async fn core_banking(bank: Arc<Bank>) -> (Arc<SimulatedService>, String) {
    let sim = Arc::new(SimulatedService::new(
        "core-banking",
        Faults::default(),
        Arc::new(SystemClock),
    ));
    async fn front(State(bank): State<Arc<Bank>>, mut req: Request, next: Next) -> Response {
        if bank.unauthorized.load(Ordering::SeqCst) {
            return (StatusCode::UNAUTHORIZED, "token expired").into_response();
        }
        let path = req.uri().path().to_owned();
        let action = match (req.method().clone(), path.as_str()) {
            (Method::POST, "/holds") => "reserve-funds",
            (Method::DELETE, p) if p.starts_with("/holds/") => "release-funds",
            (Method::POST, "/disburse-funds") => "disburse-funds",
            _ => return (StatusCode::NOT_FOUND, "no such path").into_response(),
        };
        if action == "reserve-funds" {
            let key = req
                .headers()
                .get("idempotency-key")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            let mut holds = bank.holds.lock().expect("lock");
            let n = holds.entry(key).or_default();
            *n += 1;
            if *n == 1 {
                bank.conflicts.fetch_add(1, Ordering::SeqCst);
                return (
                    StatusCode::CONFLICT,
                    axum::Json(json!({"error": {"code": "in_progress", "message": "a request with this key is in progress"}})),
                )
                    .into_response();
            }
        }
        *req.method_mut() = Method::POST;
        *req.uri_mut() = Uri::try_from(format!("/{action}")).expect("uri");
        next.run(req).await
    }
    let app = router(sim.clone()).layer(middleware::from_fn_with_state(bank, front));
    (sim, serve_loopback(app).await)
}

/// What the e-sign function saw: (action, idempotency key, callback URL).
type Invocations = Arc<Mutex<Vec<(String, String, Option<String>)>>>;

/// The e-sign provider as a Lambda function: a stub of the Invoke API. `send-contract`
/// accepts at once and calls back a moment later with the signed contract, as a person signing
/// would; `void-contract` answers at once.
async fn e_sign(seen: Invocations) -> String {
    async fn invoke(
        State(seen): State<Invocations>,
        Path(name): Path<String>,
        body: axum::body::Bytes,
    ) -> Response {
        assert_eq!(name, "sas-test-svc-e-sign");
        let payload: Value = serde_json::from_slice(&body).expect("a JSON payload");
        let action = payload["action"].as_str().unwrap_or_default().to_owned();
        let key = payload["idempotencyKey"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let url = payload["callback"]["url"].as_str().map(str::to_owned);
        seen.lock()
            .expect("lock")
            .push((action.clone(), key.clone(), url.clone()));
        if let (Some(url), "send-contract") = (url, action.as_str()) {
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let answer = reqwest::Client::new()
                    .post(&url)
                    .json(&json!({"status": "succeeded", "result": {"id": format!("contract-{key}")}}))
                    .send()
                    .await
                    .expect("the callback is posted");
                assert_eq!(answer.status().as_u16(), 202, "the callback is accepted");
            });
            return (StatusCode::OK, json!({"accepted": true}).to_string()).into_response();
        }
        (
            StatusCode::OK,
            json!({"id": format!("{action}-{key}")}).to_string(),
        )
            .into_response()
    }
    let app = axum::Router::new()
        .route(
            "/2015-03-31/functions/{name}/invocations",
            axum::routing::post(invoke),
        )
        .with_state(seen);
    serve_loopback(app).await
}

/// The operator's view of a task (with sas's internals: failure counts, attempts).
async fn task(http: &reqwest::Client, base: &str, id: &str) -> Value {
    sas_blackbox::get_json(http, &format!("{base}/operator/tasks/{id}")).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_loan_runs_on_two_http_services_and_a_lambda_with_a_callback_through_a_401_window() {
    let config = sdk_config().await;
    let secret = format!("sas/test/{}", unique("bureau"));
    sas_blackbox::put_secret(&config, &secret, "bureau-t0ken").await;
    let bureau_calls = Arc::new(AtomicUsize::new(0));
    let (_, bureau) = credit_bureau("bureau-t0ken".into(), bureau_calls.clone()).await;
    let bank = Arc::new(Bank::default());
    bank.unauthorized.store(true, Ordering::SeqCst);
    let (banking, bank_url) = core_banking(bank.clone()).await;
    let signed: Invocations = Arc::default();
    let lambda = e_sign(signed.clone()).await;

    let services = format!(
        r#"services:
  - name: credit-bureau
    target:
      type: http
      baseUrl: {bureau}
      auth: {{type: bearer, secret: "{secret}"}}
  - name: core-banking
    target:
      type: http
      baseUrl: {bank_url}
      actions:
        reserve-funds: {{method: POST, path: /holds}}
        release-funds: {{method: DELETE, path: "/holds/{{$.input.hold}}"}}
  - name: e-sign
    target: {{type: lambda, function: sas-test-svc-e-sign}}
"#
    );
    let mut files = catalog::example_files();
    files.retain(|(name, _)| name == "loan-application.yaml");
    files.insert(0, ("services.yaml".into(), services));
    let mut settings = Settings {
        definitions: files,
        credentials: Arc::new(AwsCredentials::from_config(&config)),
        lambda: Some(sas::remote::lambda_client_at(&lambda)),
        ..Settings::default()
    };
    settings.policy.step_timeout = chrono::Duration::seconds(3);
    settings.policy.pickup_timeout = chrono::Duration::seconds(6);
    settings.breaker.threshold = 3;
    settings.breaker.cooldown = chrono::Duration::milliseconds(500);
    settings.breaker.probe_window = chrono::Duration::seconds(1);
    let mut system = sas_blackbox::memory_system(settings).await;
    let addr = system
        .serve(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .expect("serves");
    let base = format!("http://{addr}");
    system.start();
    let (_, _, bus) = system.memory.clone().expect("in memory");

    let http = reqwest::Client::new();
    let mut ids = Vec::new();
    for _ in 0..3 {
        let answer: Value = http
            .post(format!("{base}/workflows/loan-application/tasks"))
            .json(&loan_input())
            .send()
            .await
            .expect("POST")
            .json()
            .await
            .expect("JSON");
        let id = answer["taskId"].as_str().expect("taskId").to_owned();
        // The applicant signs early: the e-sign webhook's event is kept for the signature.
        let signed = http
            .post(format!("{base}/tasks/{id}/events/contract-signed"))
            .header("event-id", "esign-1")
            .json(&json!({"signedBy": "a-42"}))
            .send()
            .await
            .expect("POST event");
        assert_eq!(signed.status().as_u16(), 202);
        ids.push(id);
    }

    // The 401 window: the breaker opens once, with one alert; the tasks wait on core-banking.
    let until = Instant::now() + Duration::from_secs(20);
    while !bus
        .published()
        .iter()
        .any(|(t, _)| t == "ServiceUnavailable")
    {
        assert!(Instant::now() < until, "no alert: {:?}", bus.published());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    for id in &ids {
        let t = task(&http, &base, id).await;
        assert!(
            ["Pending", "Processing"].contains(&t["processState"].as_str().unwrap_or_default()),
            "a 401 compensates nothing: {t}"
        );
        assert_eq!(t["failureCount"], 0, "waiting is no failure: {t}");
        assert_eq!(t["steps"][1]["status"], "Pending", "{t}");
    }
    bank.unauthorized.store(false, Ordering::SeqCst);

    // Mended: every loan finishes, the contract signed by callback.
    let until = Instant::now() + Duration::from_secs(60);
    for id in &ids {
        loop {
            let t = task(&http, &base, id).await;
            if t["processState"] == "Processed" {
                break;
            }
            let at = t["steps"]
                .as_array()
                .and_then(|s| s.iter().find(|s| s["status"] == "Waiting"));
            if at.is_some_and(|s| s["name"] == "cooling-off") {
                // The applicant waives the 14-day cooling-off (an operator's wake).
                http.post(format!("{base}/operator/tasks/{id}/wake"))
                    .json(&json!({"reason": "waived"}))
                    .send()
                    .await
                    .expect("POST wake");
            }
            let state = t["processState"].as_str().unwrap_or_default().to_owned();
            assert!(
                ["Pending", "Processing"].contains(&state.as_str()),
                "only goes forward: {t}"
            );
            assert!(Instant::now() < until, "did not finish: {t}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let t = task(&http, &base, id).await;
        assert_eq!(t["failureCount"], 0, "{t}");
        assert_eq!(
            t["steps"][2]["result"]["id"],
            json!(format!("contract-{id}:send-contract:send-contract")),
            "the signed contract came by callback: {t}"
        );
        assert!(
            t["history"]
                .as_array()
                .expect("history")
                .iter()
                .any(|h| h["reason"] == "accepted; waiting for its callback"),
            "{t}"
        );
    }
    // A replayed callback is fenced (409), a forged token is unknown (404), a malformed body
    // is refused (400); none changes a task.
    let urls: Vec<String> = signed
        .lock()
        .expect("lock")
        .iter()
        .filter_map(|(_, _, url)| url.clone())
        .collect();
    let replay = http
        .post(&urls[0])
        .json(&json!({"status": "succeeded", "result": {"id": "again"}}))
        .send()
        .await
        .expect("POST");
    assert_eq!(replay.status().as_u16(), 409);
    let body: Value = replay.json().await.expect("JSON");
    assert_eq!(body["error"]["code"], "stale_callback");
    let forged = format!(
        "{}0",
        urls[0].trim_end_matches(|c: char| c.is_ascii_hexdigit())
    );
    let answer = http
        .post(&forged)
        .json(&json!({"status": "heartbeat"}))
        .send()
        .await
        .expect("POST");
    assert_eq!(answer.status().as_u16(), 404);
    let answer = http
        .post(&urls[0])
        .json(&json!({"status": "done"}))
        .send()
        .await
        .expect("POST");
    assert_eq!(answer.status().as_u16(), 400);
    for id in &ids {
        assert_eq!(task(&http, &base, id).await["processState"], "Processed");
    }
    system.shutdown().await;

    let alerts: Vec<_> = bus
        .published()
        .into_iter()
        .filter(|(t, _)| t == "ServiceUnavailable" || t == "TaskFailed")
        .collect();
    assert_eq!(alerts.len(), 1, "one alert for the window: {alerts:?}");
    assert_eq!(alerts[0].1["service"], "core-banking");
    assert_eq!(alerts[0].1["kind"], "misconfigured");
    assert!(
        !bus.published()
            .iter()
            .any(|(t, _)| t == "TaskCompensated" || t == "TaskRefused"),
        "nothing compensated"
    );
    assert_eq!(bureau_calls.load(Ordering::SeqCst), 3, "bearer token sent");
    // Each hold met a 409 once (its first call) and was still made exactly once.
    assert_eq!(bank.conflicts.load(Ordering::SeqCst), 3);
    let stats = banking.stats();
    for id in &ids {
        assert_eq!(
            stats
                .effects
                .get(&format!("{id}:reserve-funds:reserve-funds")),
            Some(&1)
        );
        assert_eq!(
            stats
                .effects
                .get(&format!("{id}:disburse-funds:disburse-funds")),
            Some(&1)
        );
    }
    let signed = signed.lock().expect("lock").clone();
    let contracts: Vec<_> = signed
        .iter()
        .filter(|(action, _, _)| action == "send-contract")
        .collect();
    assert_eq!(contracts.len(), 3, "{signed:?}");
    assert!(
        contracts
            .iter()
            .all(|(_, _, url)| url.as_deref().is_some_and(|u| u.starts_with(&base))),
        "each with its callback URL: {contracts:?}"
    );
}
