//! `sas-local` keeps the deployment's promises and is closed to others.
//!
//! - Its settings come from the variables the functions read, through the same parsing: with
//!   every variable set, the policy (and the rest) it builds equals what the Lambdas build; an
//!   undo of a step that may still be in flight waits `CALL_TIMEOUT_MS` +
//!   `UNDO_MARGIN_SECONDS` past the step's deadline, as in a stack.
//! - Its HTTP API answers only requests addressed to it (`Host`: loopback names or its bound
//!   address, against DNS rebinding), only JSON bodies declared as such (a cross-site `text/plain`
//!   or Blob post needs no preflight), and no cross-origin browser request.
//! - Its operator API needs authentication whenever the task API does.
//! - Its agent reads services' credentials only under the secrets prefix, as the template's
//!   IAM policy allows.

use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::Response;
use reqwest::StatusCode;
use sas::config::{self, PolicyDefaults, Vars};
use sas::domain::workflow::CredentialSource;
use sas::ports::{Clock, OffsetClock};
use sas::remote::{CredentialError, Credentials, MemoryCredentials, Secret};
use sas::{ProcessState, StepStatus};
use sas_blackbox::{net, order_input, pump_until_quiet, serve_loopback, state, submit_ok};
use sas_local::auth::{JwtCheck, LocalAuth, TestIssuer};
use sas_local::{Backend, Settings, System};
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Every variable the functions read that `sas-local` honours, each set off its defaults.
fn every_variable() -> Vec<(&'static str, &'static str)> {
    vec![
        ("STEP_TIMEOUT_SECONDS", "7.5"),
        ("START_WITHIN_SECONDS", "4"),
        ("PICKUP_TIMEOUT_SECONDS", "33"),
        ("FAILURE_THRESHOLD", "6"),
        ("RETRY_BASE_DELAY_SECONDS", "0.25"),
        ("RETRY_BACKOFF_RATE", "3"),
        ("RETRY_MAX_DELAY_SECONDS", "77"),
        ("AUTO_COMPENSATE", "false"),
        ("COOLDOWN_SECONDS", "12"),
        ("MAX_ROUNDS", "2"),
        ("PROGRESS_EVENTS", "true"),
        ("CALL_TIMEOUT_MS", "3000"),
        ("UNDO_MARGIN_SECONDS", "3"),
        ("BACKOFF_BASE_MS", "7"),
        ("BACKOFF_CAP_MS", "700"),
        ("BREAKER_THRESHOLD", "9"),
        ("BREAKER_COOLDOWN_MS", "1234"),
        ("BREAKER_PROBES", "2"),
        ("BREAKER_PROBE_WINDOW_MS", "4321"),
        ("BREAKER_PAUSE_AFTER_SECONDS", "600"),
        ("BREAKER_CACHE_MS", "250"),
        ("CATALOG_CACHE_SECONDS", "9"),
        ("CREDENTIALS_CACHE_SECONDS", "60"),
        ("RETENTION_DAYS", "7"),
        ("CALLER_RATE_PER_SECOND", "20"),
        ("CALLER_BURST", "40"),
        ("SWEEP_PAGE_SIZE", "50"),
        ("SWEEP_CONCURRENCY", "8"),
        ("SWEEP_BUDGET_SECONDS", "40"),
        ("LEASE_SECONDS", "90"),
        ("DUE_SHARDS", "8"),
        ("DEADLINE_TIMERS", "false"),
    ]
}

#[test]
fn the_settings_sas_local_builds_from_an_environment_are_the_lambdas() {
    let vars = Vars::given(every_variable());
    let local = Settings::from_vars(&vars).expect("valid settings");
    // What the Lambdas build from the same variables (their `config::policy()` and the rest
    // are these functions on the process's environment, with the deployment's defaults).
    let lambda_policy = config::policy_in(&vars, &PolicyDefaults::default()).expect("policy");
    assert_eq!(local.policy, lambda_policy);
    assert_eq!(
        local.policy.undo_wait,
        chrono::Duration::seconds(6),
        "CALL_TIMEOUT_MS + UNDO_MARGIN_SECONDS"
    );
    assert_eq!(local.call_timeout, Duration::from_millis(3000));
    assert_eq!(
        local.backoff,
        config::backoff_in(
            &vars,
            sas::domain::Backoff {
                base: chrono::Duration::milliseconds(100),
                cap: chrono::Duration::milliseconds(5000),
            }
        )
        .expect("backoff")
    );
    assert_eq!(
        local.breaker,
        config::breaker_in(&vars, Default::default()).expect("breaker")
    );
    assert_eq!(local.catalog_ttl, chrono::Duration::seconds(9));
    assert_eq!(local.credentials_ttl, chrono::Duration::seconds(60));
    assert_eq!(local.retention, Some(chrono::Duration::days(7)));
    assert_eq!(
        local.rate_limit,
        config::rate_limit_in(&vars, 50.0, 100).expect("rate")
    );
    let lease = chrono::Duration::seconds(90);
    assert_eq!(local.lease_ttl, lease);
    let sweep = config::sweep_settings_in(&vars, lease, Default::default()).expect("sweep");
    assert_eq!(
        (
            local.sweep.page_size,
            local.sweep.concurrency,
            local.sweep.budget
        ),
        (sweep.page_size, sweep.concurrency, sweep.budget)
    );
    assert_eq!(local.due_shards, 8);
    assert!(!local.deadline_timers);

    // Unset: the local defaults, with the undo wait still CALL_TIMEOUT_MS + the margin.
    let local = Settings::from_vars(&Vars::given::<&str, &str>([])).expect("defaults");
    assert_eq!(
        local.policy.undo_wait,
        chrono::Duration::milliseconds(local.call_timeout.as_millis() as i64),
        "one clock: no skew margin on top of the longest call"
    );
    // A bad value stops it, naming the variable.
    let bad =
        Settings::from_vars(&Vars::given([("CALL_TIMEOUT_MS", "soon")])).expect_err("not a number");
    assert!(bad.to_string().contains("CALL_TIMEOUT_MS"), "{bad}");
}

/// Sends the scheduler a work message for `id` now (as a stray or early redelivery would).
async fn nudge(system: &System, id: sas::TaskId) {
    system
        .queue
        .send(
            &system.resources.work_queue_url,
            &json!({"type": "work", "taskId": id.to_string()}).to_string(),
            Duration::ZERO,
        )
        .await
        .expect("send");
}

#[tokio::test]
async fn the_undo_of_a_step_in_flight_waits_call_timeout_plus_the_margin() {
    let vars = Vars::given([
        ("CALL_TIMEOUT_MS", "3000"),
        ("UNDO_MARGIN_SECONDS", "3"),
        ("STEP_TIMEOUT_SECONDS", "30"),
        ("PICKUP_TIMEOUT_SECONDS", "60"),
    ]);
    let settings = Settings::from_vars(&vars).expect("settings");
    let clock = Arc::new(OffsetClock::default());
    let system = System::new(Backend::Memory, settings, clock.clone() as Arc<dyn Clock>)
        .await
        .expect("system");
    let id = submit_ok(&system).await;
    system.pump_scheduler().await.expect("claim");
    system.pump_agents().await.expect("inventory");
    system.pump_scheduler().await.expect("payment requested");
    let r = state(&system, id).await;
    assert_eq!(r.current_step(), Some("charge-payment"));
    let deadline = r.complete_by.expect("the payment's deadline");

    // Cancelled while the payment request is out: the agent still charges (the service
    // commits), its reply is dropped, and the refund must wait for the charge.
    let cancelled = sas::api::handle(
        &system.api,
        &sas::auth::Identity::anonymous(),
        &http::Method::POST,
        &format!("/tasks/{id}/cancel"),
        &http::HeaderMap::new(),
        b"",
    )
    .await;
    assert_eq!(cancelled.status(), 202, "{}", cancelled.body());
    assert_eq!(system.pump_agents().await.expect("payment"), 1);
    system.pump_scheduler().await.expect("reply dropped");
    assert_eq!(
        state(&system, id).await.steps[1].status,
        StepStatus::Cancelled
    );

    // Past the deadline by more than CALL_TIMEOUT_MS alone, less than with the margin: a
    // work message now (a stray, or an early redelivery) does not send the refund.
    let wait = chrono::Duration::seconds(6);
    let now = clock.now();
    clock.advance(deadline + chrono::Duration::seconds(4) - now);
    nudge(&system, id).await;
    system.pump_scheduler().await.expect("too early");
    system.pump_agents().await.expect("nothing to call");
    assert_eq!(
        payment_net(&system, id),
        [1],
        "refunded before deadline + {wait}"
    );
    assert_eq!(
        state(&system, id).await.process_state,
        ProcessState::Compensating
    );

    // From deadline + 6 s on, the undo goes out.
    clock.advance(chrono::Duration::seconds(2));
    nudge(&system, id).await;
    pump_until_quiet(&system, 20).await;
    assert_eq!(payment_net(&system, id), [0], "refunded once due");
    assert_eq!(
        state(&system, id).await.process_state,
        ProcessState::Compensated
    );
}

/// A memory system served on loopback with the given authorizers; its bound address.
async fn serve(api: LocalAuth, operator: LocalAuth) -> (System, SocketAddr) {
    let settings = Settings {
        api_auth: api,
        operator_auth: operator,
        ..Settings::default()
    };
    let mut system = sas_blackbox::memory_system(settings).await;
    let addr = sas_blackbox::serve_system(&mut system).await;
    (system, addr)
}

/// A request to `addr` with the given headers (a `Host` among them replaces reqwest's).
async fn call(
    addr: SocketAddr,
    method: reqwest::Method,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (StatusCode, Value) {
    let mut req = reqwest::Client::new()
        .request(method, format!("http://{addr}{path}"))
        .body(body.to_owned());
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.expect("answers");
    let status = resp.status();
    let text = resp.text().await.expect("body");
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// `POST`s `order` to the e-commerce workflow's task route with `headers`.
async fn submit_order(
    addr: SocketAddr,
    headers: &[(&str, &str)],
    order: &str,
) -> (StatusCode, Value) {
    let path = "/workflows/ecommerce-order/tasks";
    call(addr, reqwest::Method::POST, path, headers, order).await
}

/// The net effects the payment service holds for task `id`.
fn payment_net(system: &System, id: sas::TaskId) -> Vec<i32> {
    net(system, "payment", id).into_values().collect()
}

fn tasks_held(system: &System) -> usize {
    system.memory.as_ref().expect("memory").0.all_states().len()
}

#[tokio::test]
async fn a_request_for_another_host_is_refused() {
    let (system, addr) = serve(LocalAuth::None, LocalAuth::None).await;
    let port = addr.port();
    let order = order_input().to_string();
    let json_type = ("content-type", "application/json");
    // A page of evil.example whose name was rebound to 127.0.0.1 reaches the port with its
    // own name as the Host.
    for host in [
        format!("evil.example:{port}"),
        "evil.example".to_owned(),
        format!("localhost.evil.example:{port}"),
        format!("192.0.2.1:{port}"),
        // The right name on another port is another origin.
        format!("localhost:{}", port.wrapping_add(1)),
    ] {
        let (status, body) = submit_order(addr, &[("host", &host), json_type], &order).await;
        assert_eq!(status, StatusCode::MISDIRECTED_REQUEST, "{host}: {body}");
        let error = sas::api::error::code_and_message(&body);
        assert!(
            error.is_some_and(|(code, m)| code == "misdirected_request" && m.contains("Host")),
            "{body}"
        );
        let (status, _) = call(
            addr,
            reqwest::Method::GET,
            "/operator/tasks",
            &[("host", &host)],
            "",
        )
        .await;
        assert_eq!(status, StatusCode::MISDIRECTED_REQUEST, "{host}");
    }
    assert_eq!(tasks_held(&system), 0, "nothing written");
    // Its own names are answered.
    for host in [
        format!("localhost:{port}"),
        format!("LocalHost:{port}"),
        format!("127.0.0.1:{port}"),
    ] {
        let (status, body) = submit_order(addr, &[("host", &host), json_type], &order).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{host}: {body}");
    }
    assert_eq!(tasks_held(&system), 3);
}

#[tokio::test]
async fn a_post_whose_body_is_not_declared_json_is_refused() {
    let (system, addr) = serve(LocalAuth::None, LocalAuth::None).await;
    let order = order_input().to_string();
    // What a cross-site page may send without a preflight: text/plain, a form, or a Blob
    // without a type (no Content-Type at all).
    for content_type in [
        Some("text/plain"),
        Some("text/plain;charset=UTF-8"),
        Some("application/x-www-form-urlencoded"),
        Some("multipart/form-data; boundary=x"),
        None,
    ] {
        let headers: Vec<(&str, &str)> = content_type
            .map(|c| ("content-type", c))
            .into_iter()
            .collect();
        for path in ["/workflows/ecommerce-order/tasks", "/operator/workflows/w"] {
            let method = if path.starts_with("/operator") {
                reqwest::Method::PUT
            } else {
                reqwest::Method::POST
            };
            let (status, body) = call(addr, method, path, &headers, &order).await;
            assert_eq!(
                status,
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "{content_type:?} {path}: {body}"
            );
            assert_eq!(body["error"]["code"], "unsupported_media_type", "{body}");
        }
    }
    assert_eq!(tasks_held(&system), 0, "nothing written");
    // A cross-origin browser request is refused whatever it declares.
    let (status, body) = submit_order(
        addr,
        &[
            ("content-type", "application/json"),
            ("origin", "https://evil.example"),
        ],
        &order,
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["error"]["code"], "cross_origin", "{body}");
    assert_eq!(tasks_held(&system), 0, "nothing written");
    // Declared JSON (with parameters, any case) from no page or from its own origin: accepted.
    let own = format!("http://{addr}");
    for headers in [
        vec![("content-type", "application/json")],
        vec![("content-type", "Application/JSON; charset=utf-8")],
        vec![
            ("content-type", "application/json"),
            ("origin", own.as_str()),
        ],
    ] {
        let (status, body) = submit_order(addr, &headers, &order).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{headers:?}: {body}");
    }
}

#[tokio::test]
async fn the_operator_api_needs_authentication_whenever_the_task_api_does() {
    let issuer = TestIssuer::generate("https://issuer.sas-tests.invalid").expect("issuer");
    let jwt = LocalAuth::Jwt(Arc::new(JwtCheck::new(
        "https://issuer.sas-tests.invalid",
        vec!["sas-tests".into()],
        issuer.jwks().clone(),
    )));
    // `--auth jwt` without `--users`: no operator credentials were given, so none will do.
    let (system, addr) = serve(jwt, LocalAuth::None).await;
    let token = issuer
        .token(
            "alice",
            "sas-tests",
            &[],
            chrono::Utc::now(),
            chrono::Duration::hours(1),
        )
        .expect("token");
    let bearer = format!("Bearer {token}");
    let (status, body) = submit_order(
        addr,
        &[
            ("content-type", "application/json"),
            ("authorization", &bearer),
        ],
        &order_input().to_string(),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "the task API works: {body}");
    let id = body["taskId"].as_str().expect("taskId").to_owned();
    for (method, path, body) in [
        (reqwest::Method::GET, "/operator/tasks".to_owned(), ""),
        (reqwest::Method::GET, format!("/operator/tasks/{id}"), ""),
        (
            reqwest::Method::POST,
            format!("/operator/tasks/{id}/cancel"),
            "{}",
        ),
        (reqwest::Method::GET, "/operator/console".to_owned(), ""),
    ] {
        for headers in [vec![], vec![("authorization", bearer.as_str())]] {
            let mut headers = headers;
            headers.push(("content-type", "application/json"));
            let (status, answer) = call(addr, method.clone(), &path, &headers, body).await;
            assert_eq!(
                status,
                StatusCode::UNAUTHORIZED,
                "{method} {path} {headers:?}: {answer}"
            );
        }
    }
    let r = sas_blackbox::state(&system, id.parse().expect("uuid")).await;
    // Claimed at its submission or not, never cancelled.
    assert!(
        matches!(
            r.process_state,
            ProcessState::Pending | ProcessState::Processing
        ),
        "not cancelled: {}",
        r.process_state
    );
}

/// HTTP services that record every `Authorization` and `X-Api-Key` they are sent.
async fn recording(seen: Arc<Mutex<Vec<String>>>) -> String {
    async fn record(
        State(seen): State<Arc<Mutex<Vec<String>>>>,
        req: Request,
        next: Next,
    ) -> Response {
        for name in ["authorization", "x-api-key"] {
            if let Some(v) = req.headers().get(name).and_then(|v| v.to_str().ok()) {
                seen.lock().expect("lock").push(v.to_owned());
            }
        }
        next.run(req).await
    }
    let app = sas_blackbox::simulated_services(&["inventory", "payment", "shipping"]);
    serve_loopback(app.layer(middleware::from_fn_with_state(seen, record))).await
}

/// The developer's profile: it reaches every secret and parameter, and notes which were read.
#[derive(Debug, Default)]
struct Profile {
    values: MemoryCredentials,
    read: Mutex<Vec<CredentialSource>>,
}

#[async_trait::async_trait]
impl Credentials for Profile {
    async fn read(&self, source: &CredentialSource) -> Result<Secret, CredentialError> {
        self.read.lock().expect("lock").push(source.clone());
        self.values.read(source).await
    }
}

#[tokio::test]
async fn a_credential_outside_the_secrets_prefix_is_never_read() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let base = recording(seen.clone()).await;
    let profile = Arc::new(Profile::default());
    let inside = CredentialSource::Secret("sas/dev/inventory-token".into());
    let outside = [
        CredentialSource::Secret("prod/payments-db-password".into()),
        CredentialSource::Parameter("/prod/payments-api-key".into()),
    ];
    profile.values.set(inside.clone(), "allowed-token");
    profile.values.set(outside[0].clone(), "hunter2");
    profile.values.set(outside[1].clone(), "hunter3");
    let service = |name: &str, auth: &str| {
        format!(
            "  - name: {name}\n    target:\n      type: http\n      baseUrl: {base}/{name}\n      auth: {auth}\n"
        )
    };
    let services = [
        service(
            "inventory",
            "{type: bearer, secret: sas/dev/inventory-token}",
        ),
        service(
            "payment",
            "{type: bearer, secret: prod/payments-db-password}",
        ),
        service(
            "shipping",
            "{type: apiKey, header: X-Api-Key, parameter: /prod/payments-api-key}",
        ),
    ]
    .concat();
    let mut files = sas::catalog::example_files();
    files[0].1 = format!("services:\n{services}");
    files.retain(|(name, _)| name != "loan-application.yaml" && name != "order-triage.yaml");
    // sas-local's settings with no prefix given: the local default, the template's for the
    // default stage (sas/dev/). A short step: the agent gives up on the payment soon.
    let mut settings = Settings::from_vars(&Vars::given([
        ("STEP_TIMEOUT_SECONDS", "1"),
        ("RETRY_BASE_DELAY_SECONDS", "0"),
        ("BACKOFF_BASE_MS", "1"),
        ("BACKOFF_CAP_MS", "5"),
    ]))
    .expect("settings");
    settings.definitions = files;
    settings.credentials = profile.clone();
    let system = sas_blackbox::memory_system(settings).await;
    let id = submit_ok(&system).await;
    // The inventory step runs with its token; the payment step's credential is refused, so
    // the payment step is deferred, as a misconfigured service's (or, unfixed, the task goes
    // through on secrets the deployed agent could never read).
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            pump_until_quiet(&system, 5).await;
            let r = state(&system, id).await;
            // Tried: the payment's breaker recorded its misconfigured answer (it counts once
            // per task, so it may stay closed while the agent retries to its give-up time).
            let tried = system
                .store
                .get_breaker("payment")
                .await
                .ok()
                .flatten()
                .is_some();
            if r.process_state == ProcessState::Processed
                || (r.steps[0].status == StepStatus::Done
                    && (r.failure_count > 0 || r.deferrals > 0 || tried))
            {
                return;
            }
        }
    })
    .await
    .expect("the payment step is tried");
    let seen = seen.lock().expect("lock").clone();
    assert!(
        seen.iter().any(|a| a == "Bearer allowed-token"),
        "the credential under the prefix is used: {seen:?}"
    );
    assert!(
        !seen.iter().any(|a| a.contains("hunter")),
        "a credential outside the prefix reached a service: {seen:?}"
    );
    let read = profile.read.lock().expect("lock").clone();
    assert!(read.contains(&inside), "{read:?}");
    for source in &outside {
        assert!(!read.contains(source), "{source} was read: {read:?}");
    }
    let r = state(&system, id).await;
    assert_ne!(r.process_state, ProcessState::Processed, "{r:?}");
    assert_eq!(r.current_step(), Some("charge-payment"), "{r:?}");
}

/// A newcomer's first start, in memory with no AWS configuration at all (no region, no profile,
/// no credentials): the output holds no AWS SDK warning (a region looked for at the instance
/// metadata service, debug structures), and an empty folder of definitions is said so.
#[test]
fn a_first_start_in_memory_is_clean_and_says_an_empty_folder_is_empty() {
    use std::io::Read;
    use std::process::{Command, Stdio};
    let dir = tempfile::tempdir().expect("a folder");
    let home = tempfile::tempdir().expect("a home");
    let mut child = Command::new(env!("CARGO_BIN_EXE_doc-sas-local"))
        .args(["serve", "--listen", "127.0.0.1:0", "--workflows"])
        .arg(dir.path())
        .current_dir(home.path())
        .env_clear()
        .env("HOME", home.path())
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sas-local starts");
    // Its banner ends with "Ctrl-C stops it."; give it a few seconds, then stop it.
    let mut stdout = child.stdout.take().expect("stdout");
    let reader = std::thread::spawn(move || {
        let mut out = String::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = stdout.read(&mut buf) {
            if n == 0 {
                break;
            }
            out.push_str(&String::from_utf8_lossy(&buf[..n]));
            if out.contains("Ctrl-C stops it.") {
                break;
            }
        }
        out
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !reader.is_finished() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let out = reader.join().expect("read");
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    let _ = child.wait();
    assert!(out.contains("Ctrl-C stops it."), "{out}\n{err}");
    assert!(
        out.contains(&format!(
            "no workflow: {} holds no workflow definition",
            dir.path().display()
        )),
        "{out}"
    );
    let all = format!("{out}\n{err}");
    for noise in ["aws_config", "IMDS", "imds", "WARN", "Some(", "{ "] {
        assert!(
            !all.contains(noise),
            "{noise:?} in the start-up output:\n{all}"
        );
    }
}

/// A callback service over HTTP: it accepts every call (202) and keeps the callback URL each
/// carries.
async fn callback_service(urls: Arc<Mutex<Vec<String>>>) -> String {
    async fn accept(State(urls): State<Arc<Mutex<Vec<String>>>>, req: Request) -> StatusCode {
        if let Some(url) = req
            .headers()
            .get("sas-callback-url")
            .and_then(|v| v.to_str().ok())
        {
            urls.lock().expect("lock").push(url.to_owned());
        }
        StatusCode::ACCEPTED
    }
    serve_loopback(axum::Router::new().fallback(accept).with_state(urls)).await
}

/// A served system's first step, claimed and sent at submission, tells its callback service the
/// served address (the Python client example caught a placeholder host here), and the callback
/// posted there finishes the task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_callback_step_sent_at_submission_calls_back_to_the_served_address() {
    let urls = Arc::new(Mutex::new(Vec::new()));
    let service = callback_service(urls.clone()).await;
    let mut system = sas_blackbox::memory_system(Settings::default()).await;
    system
        .publish(&[
            (
                "services.yaml".into(),
                format!("services:\n  - name: signer\n    target: {{type: http, baseUrl: \"{service}\"}}\n"),
            ),
            (
                "workflow.yaml".into(),
                "name: sign\nsteps:\n  - name: sign\n    service: signer\n    callback: {timeout: 1h}\n"
                    .into(),
            ),
        ])
        .await
        .expect("publishes");
    let addr = sas_blackbox::serve_system(&mut system).await;
    system.start();
    let http = reqwest::Client::new();
    let started: Value = http
        .post(format!("http://{addr}/workflows/sign/tasks"))
        .json(&json!({}))
        .send()
        .await
        .expect("submits")
        .json()
        .await
        .expect("JSON");
    assert_eq!(
        started["processState"], "Processing",
        "claimed at submission: {started}"
    );
    let id = started["taskId"].as_str().expect("a task id").to_owned();
    let mut url = None;
    for _ in 0..200 {
        url = urls.lock().expect("lock").first().cloned();
        if url.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let url = url.expect("the service is called");
    assert!(
        url.starts_with(&format!("http://{addr}/tasks/{id}/callbacks/")),
        "the callback URL is the served address's: {url}"
    );
    let answer = http
        .post(&url)
        .json(&json!({"status": "succeeded", "result": {"signed": true}}))
        .send()
        .await
        .expect("calls back");
    assert_eq!(answer.status(), StatusCode::ACCEPTED);
    let mut task = Value::Null;
    for _ in 0..200 {
        task = sas_blackbox::get_json(&http, &format!("http://{addr}/tasks/{id}")).await;
        if task["processState"] == "Processed" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(task["processState"], "Processed", "{task}");
    assert_eq!(task["steps"][0]["result"], json!({"signed": true}));
}
