//! Test support: the emulator connection, systems wired to it or to memory, submissions through
//! the HTTP handler, and the contract suite that both the in-memory and the AWS adapters must
//! pass.

pub mod contract;
pub mod iam;
pub mod schemas;
pub mod template;

use aws_config::{BehaviorVersion, Region};
use sas::ports::{Clock, OffsetClock, ReceiveRequest};
use sas::{Backoff, Policies, Policy, StateRecord, TaskId};
use sas_local::provision;
use sas_local::{Backend, Settings, System};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

/// The example workflow of an e-commerce order (`workflows/ecommerce-order.yaml`).
pub const ECOMMERCE: &str = "ecommerce-order";
/// The example workflow of a loan application (`workflows/loan-application.yaml`).
pub const LOAN: &str = "loan-application";

/// The emulator's endpoint, from `SAS_TEST_ENDPOINT` (set by `infra/test.sh`). Tests that need
/// it fail loudly without it, and refuse anything but a loopback address: tests never reach
/// real AWS.
pub fn endpoint() -> String {
    let ep = std::env::var("SAS_TEST_ENDPOINT").unwrap_or_else(|_| {
        panic!(
            "SAS_TEST_ENDPOINT is not set: these tests need the AWS API emulator; run ./infra/test.sh"
        )
    });
    let url = url_host(&ep);
    assert!(
        matches!(url.as_str(), "127.0.0.1" | "localhost" | "[::1]"),
        "SAS_TEST_ENDPOINT must be a loopback address, not {ep}"
    );
    ep
}

fn url_host(ep: &str) -> String {
    ep.split("://")
        .nth(1)
        .unwrap_or(ep)
        .split(['/', ':'])
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// The endpoint of a second DynamoDB (DynamoDB Local), from `AWS_ENDPOINT_URL_DYNAMODB` when
/// `infra/test.sh` reruns the DynamoDB-backed suites on it; loopback only, like [`endpoint`].
pub fn dynamodb_endpoint() -> Option<String> {
    let ep = std::env::var("AWS_ENDPOINT_URL_DYNAMODB").ok()?;
    let host = url_host(&ep);
    assert!(
        matches!(host.as_str(), "127.0.0.1" | "localhost" | "[::1]"),
        "AWS_ENDPOINT_URL_DYNAMODB must be a loopback address, not {ep}"
    );
    Some(ep)
}

/// SDK configuration for the emulator: dummy credentials, us-east-1, the loopback endpoint.
/// With `AWS_ENDPOINT_URL_DYNAMODB` set, DynamoDB clients go there and every other client to
/// the emulator: the endpoint then comes from the environment, because an endpoint set here
/// would override the per-service one.
pub async fn sdk_config() -> aws_config::SdkConfig {
    let loader = aws_config::defaults(BehaviorVersion::latest());
    let loader = if dynamodb_endpoint().is_some() {
        let global = std::env::var("AWS_ENDPOINT_URL").unwrap_or_default();
        assert_eq!(
            global,
            endpoint(),
            "with AWS_ENDPOINT_URL_DYNAMODB set, AWS_ENDPOINT_URL must be the emulator (SAS_TEST_ENDPOINT)"
        );
        loader
    } else {
        loader.endpoint_url(endpoint())
    };
    loader
        .region(Region::new("us-east-1"))
        .credentials_provider(aws_sdk_dynamodb::config::Credentials::new(
            "test",
            "test",
            None,
            None,
            "sas-tests",
        ))
        .load()
        .await
}

/// A resource-name prefix unique to one test run of one test.
pub fn unique(name: &str) -> String {
    let id = uuid::Uuid::new_v4().simple().to_string();
    format!("t-{name}-{}", &id[..8])
}

/// Settings for step-by-step tests: long deadlines (tests move the clock instead of waiting),
/// no retry delay (so re-enqueued work is visible at once), quick agent backoff. (The loan
/// example sets its own timeouts and retry delays, which take precedence for its steps.)
pub fn manual_settings() -> Settings {
    Settings {
        policy: Policy {
            step_timeout: chrono::Duration::seconds(30),
            start_within: chrono::Duration::zero(),
            pickup_timeout: chrono::Duration::seconds(60),
            failure_threshold: 3,
            retry_base_delay: chrono::Duration::zero(),
            backoff_rate: 2.0,
            retry_max_delay: chrono::Duration::zero(),
            auto_compensate: true,
            cooldown: chrono::Duration::zero(),
            max_rounds: 0,
            callback: None,
            wait: false,
            event: false,
            // The undo of a step that may be in flight still waits for its deadline; these
            // tests move the clock past it, with no margin on top.
            undo_wait: chrono::Duration::zero(),
            undo_timeout: None,
            progress_events: false,
        },
        backoff: Backoff {
            base: chrono::Duration::milliseconds(5),
            cap: chrono::Duration::milliseconds(50),
        },
        // The simulated services call back at once (still after they accepted).
        callback_delay: std::time::Duration::ZERO,
        // These tests drive each claim by hand, from the work message; the task API's own
        // claim of a first step has its tests (`flow::a_submission_claims_…`) and runs in every
        // system with the default settings.
        dispatch_at_submission: false,
        ..Settings::default()
    }
}

/// [`manual_settings`] with `faults` at the simulated service `service`.
pub fn faulty(service: &str, faults: sas::remote::Faults) -> Settings {
    let mut settings = manual_settings();
    settings.faults.insert(service.into(), faults);
    settings
}

/// Faults that refuse `actions` outright (the service's business "no").
pub fn refuse(actions: &[&str]) -> sas::remote::Faults {
    sas::remote::Faults {
        refuse_actions: actions.iter().map(|a| a.to_string()).collect(),
        ..Default::default()
    }
}

/// Faults of a service that is down (unreachable) from an hour ago for a day.
pub fn down_all_day() -> sas::remote::Faults {
    let from = chrono::Utc::now() - chrono::Duration::hours(1);
    sas::remote::Faults {
        outage: Some((from, from + chrono::Duration::days(1))),
        ..Default::default()
    }
}

/// [`manual_settings`] with `service` down all day and no automatic compensation: a task
/// that fails there waits in Error for an operator.
pub fn down_until_an_operator(service: &str) -> Settings {
    let mut settings = faulty(service, down_all_day());
    settings.policy.auto_compensate = false;
    settings
}

/// A system on the emulator with a clock the test can move, on its own copy of the
/// resources `template.yaml` defines (named with a unique stage), with the example definitions
/// published.
pub async fn aws_system(name: &str, settings: Settings) -> (System, Arc<OffsetClock>) {
    let clock = Arc::new(OffsetClock::default());
    let config = sdk_config().await;
    let stack = template::provision(&config, &unique(name)).await;
    let backend = Backend::Existing {
        config: Box::new(config),
        resources: Box::new(stack.resources),
    };
    let system = System::new(backend, settings, clock.clone() as Arc<dyn Clock>)
        .await
        .expect("system builds on the emulator");
    (system, clock)
}

/// A running system (the local runner's code) on `backend`, with nothing published but what
/// the test puts, serving on a free loopback port; and its operator API's base URL (which
/// publishes definitions, starts tasks and shows them whole).
pub async fn running_system(backend: Backend) -> (System, String) {
    let settings = Settings {
        definitions: vec![],
        ..Settings::default()
    };
    let mut system = System::new(backend, settings, Arc::new(sas::ports::SystemClock))
        .await
        .expect("system builds");
    let addr = serve_system(&mut system).await;
    system.start();
    (system, format!("http://{addr}/operator"))
}

/// A system on the in-memory adapters with the example definitions published.
pub async fn memory_system(settings: Settings) -> System {
    System::new(Backend::Memory, settings, Arc::new(sas::ports::SystemClock))
        .await
        .expect("an in-memory system builds")
}

/// Serves `system`'s APIs on a free loopback port; the address.
pub async fn serve_system(system: &mut System) -> std::net::SocketAddr {
    system
        .serve("127.0.0.1:0".parse().expect("addr"))
        .await
        .expect("serves")
}

/// Creates the secret `name` holding `value` on the emulator.
pub async fn put_secret(config: &aws_config::SdkConfig, name: &str, value: &str) {
    aws_sdk_secretsmanager::Client::new(config)
        .create_secret()
        .name(name)
        .secret_string(value)
        .send()
        .await
        .expect("create the secret");
}

/// Stores the SecureString parameter `name` holding `value` on the emulator.
pub async fn put_parameter(config: &aws_config::SdkConfig, name: &str, value: &str) {
    aws_sdk_ssm::Client::new(config)
        .put_parameter()
        .name(name)
        .value(value)
        .r#type(aws_sdk_ssm::types::ParameterType::SecureString)
        .send()
        .await
        .expect("put the parameter");
}

/// Simulated services (no faults, the system clock) under `/{name}` each, as one router.
pub fn simulated_services(names: &[&str]) -> axum::Router {
    let mut app = axum::Router::new();
    for &name in names {
        let clock = Arc::new(sas::ports::SystemClock);
        let sim = Arc::new(sas::remote::SimulatedService::new(
            name,
            sas::remote::Faults::default(),
            clock,
        ));
        app = app.nest(&format!("/{name}"), sas_local::simulated::router(sim));
    }
    app
}

/// A fresh queue on the emulator subscribed to the system's bus for the given detail types.
pub async fn subscribe(system: &System, detail_types: &[&str]) -> String {
    let config = sdk_config().await;
    let sqs = aws_sdk_sqs::Client::new(&config);
    let name = unique("events");
    let url = provision::create_queue(&sqs, &name, None, Default::default())
        .await
        .expect("queue");
    provision::route_to_queue(
        &config,
        &system.resources.bus_name,
        &name,
        detail_types,
        &url,
    )
    .await
    .expect("rule");
    url
}

/// Receives and deletes every message a queue holds now (bodies, in arrival order as far as
/// SQS tells).
pub async fn drain(system: &System, url: &str) -> Vec<String> {
    let mut out = Vec::new();
    loop {
        let got = system
            .queue
            .receive(ReceiveRequest::visible(url))
            .await
            .expect("receive");
        if got.is_empty() {
            return out;
        }
        for m in got {
            system
                .queue
                .delete(url, &m.receipt_handle)
                .await
                .expect("delete");
            out.push(m.body);
        }
    }
}

/// The items of the system's table by kind: the part of `pk` before `#` (`TASK`, `IDEM`,
/// `WORKFLOW`, `SERVICE`, `CATALOG`, `BREAKER`, `LEASE`). Tests own their table, so a scan is
/// fine here.
pub async fn items_by_kind(system: &System) -> BTreeMap<String, usize> {
    let ddb = aws_sdk_dynamodb::Client::new(&sdk_config().await);
    let mut out = BTreeMap::new();
    let mut start = None;
    loop {
        let page = ddb
            .scan()
            .table_name(&system.resources.table)
            .projection_expression("pk")
            .set_exclusive_start_key(start.take())
            .send()
            .await
            .expect("scan");
        for item in page.items() {
            let pk = item
                .get("pk")
                .and_then(|v| v.as_s().ok())
                .expect("every item has a string pk");
            let kind = pk.split('#').next().unwrap_or_default().to_owned();
            *out.entry(kind).or_default() += 1;
        }
        match page.last_evaluated_key() {
            Some(k) if !k.is_empty() => start = Some(k.clone()),
            _ => return out,
        }
    }
}

/// How many items of tasks the table holds: each task's items (task and state record) and its
/// idempotency key, if any. The catalog's items are not counted.
pub async fn task_items(system: &System) -> usize {
    let kinds = items_by_kind(system).await;
    kinds.get("TASK").copied().unwrap_or(0) + kinds.get("IDEM").copied().unwrap_or(0)
}

/// Pumps the scheduler and the agent until nothing moves, up to `rounds` turns.
pub async fn pump_until_quiet(system: &System, rounds: usize) {
    // Quiet means a few idle polls in a row: a callback step's simulated service calls back a
    // little after it accepted the request (`Settings::callback_delay`).
    let mut idle = 0;
    for _ in 0..rounds {
        let moved = system.pump_scheduler().await.expect("scheduler poll")
            + system.pump_agents().await.expect("agent poll");
        if moved > 0 {
            idle = 0;
        } else if idle == 3 {
            return;
        } else {
            idle += 1;
            tokio::time::sleep(std::time::Duration::from_millis(40)).await;
        }
    }
}

/// A valid input of the e-commerce order workflow.
pub fn order_input() -> Value {
    json!({"customerId": "c-42", "items": [{"sku": "SKU-1", "quantity": 2}]})
}

/// A valid input of the loan application workflow.
pub fn loan_input() -> Value {
    json!({"applicantId": "a-42", "amount": 25000, "currency": "EUR"})
}

/// The principal the tests' operators act as.
pub const OPERATOR_ARN: &str = "arn:aws:iam::123456789012:user/operator";

/// The identity of the tests' operator.
pub fn operator() -> sas::auth::Identity {
    caller(OPERATOR_ARN)
}

/// The identity of a caller named `name`.
pub fn caller(name: &str) -> sas::auth::Identity {
    sas::auth::Identity::Caller(sas::Caller::new(name).expect("caller"))
}

/// A simulated `ledger` service, which the ledger suites' workflows call.
const LEDGER_SERVICE: &str = "services:\n  - name: ledger\n    target: {type: simulated}\n";

/// Publishes the simulated `ledger` service and `workflow` (a definition's YAML) beside it.
pub async fn publish_with_ledger(system: &System, workflow: &str) {
    system
        .publish(&[
            ("services.yaml".into(), LEDGER_SERVICE.into()),
            ("workflow.yaml".into(), workflow.into()),
        ])
        .await
        .expect("publishes");
}

/// Calls the operator API (`/operator` + `path`) as [`operator`]; the status and JSON body.
pub async fn operator_call(
    system: &System,
    method: http::Method,
    path: &str,
    body: &[u8],
) -> (u16, Value) {
    let resp = sas::api::handle(
        &system.operator,
        &operator(),
        &method,
        &format!("{}{path}", sas::api::OPERATOR_PREFIX),
        &http::HeaderMap::new(),
        body,
    )
    .await;
    let status = resp.status().as_u16();
    (
        status,
        serde_json::from_str(resp.body()).expect("JSON body"),
    )
}

/// `POST`s `body` to the operator API (`/operator` + `path`) as [`operator`].
pub async fn operator_post(system: &System, path: &str, body: &[u8]) -> (u16, Value) {
    operator_call(system, http::Method::POST, path, body).await
}

/// `POST`s the JSON `body` to the operator API (`/operator` + `path`) as [`operator`].
pub async fn operator_json(system: &System, path: &str, body: &Value) -> (u16, Value) {
    operator_post(system, path, body.to_string().as_bytes()).await
}

/// Sends `POST /workflows/{workflow}/tasks` through the submission handler, as API Gateway
/// would: `Content-Type: application/json` and the given extra headers.
pub async fn post_task(
    system: &System,
    workflow: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, http::HeaderMap, Value) {
    post_task_as(
        system,
        &sas::auth::Identity::anonymous(),
        workflow,
        headers,
        body,
    )
    .await
}

/// [`post_task`] as the caller `who`.
pub async fn post_task_as(
    system: &System,
    who: &sas::auth::Identity,
    workflow: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, http::HeaderMap, Value) {
    let mut map = http::HeaderMap::new();
    map.insert(
        "content-type",
        http::HeaderValue::from_static("application/json"),
    );
    for (k, v) in headers {
        map.insert(
            http::HeaderName::from_bytes(k.as_bytes()).expect("header name"),
            http::HeaderValue::from_str(v).expect("header value"),
        );
    }
    let resp = sas::api::handle(
        &system.api,
        who,
        &http::Method::POST,
        &format!("/workflows/{workflow}/tasks"),
        &map,
        body,
    )
    .await;
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    (
        status,
        headers,
        serde_json::from_str(resp.body()).expect("JSON body"),
    )
}

/// Submits `input` to `workflow` (with an optional idempotency key).
pub async fn submit(
    system: &System,
    workflow: &str,
    key: Option<&str>,
    input: &Value,
) -> (u16, Value) {
    let headers: Vec<(&str, &str)> = key.map(|k| ("idempotency-key", k)).into_iter().collect();
    let (status, _, body) =
        post_task(system, workflow, &headers, input.to_string().as_bytes()).await;
    (status, body)
}

/// Submits `input` to `workflow` and returns the task's id (asserting the 202).
pub async fn submit_task(system: &System, workflow: &str, input: &Value) -> TaskId {
    let (status, body) = submit(system, workflow, None, input).await;
    assert_eq!(status, 202, "{body}");
    // Processing when the task API claimed its first step (`dispatch_at_submission`).
    assert!(
        body["processState"] == "Pending" || body["processState"] == "Processing",
        "{body}"
    );
    assert_eq!(body["workflow"], workflow, "{body}");
    assert!(
        body["workflowVersion"].as_u64().is_some_and(|v| v >= 1),
        "{body}"
    );
    body["taskId"]
        .as_str()
        .expect("taskId")
        .parse()
        .expect("uuid")
}

/// Submits a valid e-commerce order and returns its task id.
pub async fn submit_ok(system: &System) -> TaskId {
    submit_task(system, ECOMMERCE, &order_input()).await
}

/// Submits a valid loan application and returns its task id; the applicant signs at once
/// ([`sign_loan`]: the e-sign webhook's `contract-signed` comes early and is kept for the
/// signature step).
pub async fn submit_loan(system: &System) -> TaskId {
    let id = submit_task(system, LOAN, &loan_input()).await;
    sign_loan(system, id).await;
    id
}

/// Delivers the loan's `contract-signed` event (`{"signedBy": "a-42"}`) through the task API,
/// as the task's caller, asserting it was taken (`202`).
pub async fn sign_loan(system: &System, id: TaskId) {
    let mut headers = http::HeaderMap::new();
    headers.insert(
        "content-type",
        http::HeaderValue::from_static("application/json"),
    );
    headers.insert(
        "event-id",
        http::HeaderValue::from_static("esign-webhook-1"),
    );
    let resp = sas::api::handle(
        &system.api,
        &sas::auth::Identity::anonymous(),
        &http::Method::POST,
        &format!("/tasks/{id}/events/contract-signed"),
        &headers,
        br#"{"signedBy": "a-42"}"#,
    )
    .await;
    assert_eq!(resp.status(), 202, "contract-signed for {id}");
}

/// An operator ends each loan's cooling-off now (`POST /operator/tasks/{id}/wake`, audited),
/// then the pollers run until quiet (the payouts go out). Each loan must be cooling off.
pub async fn waive_cooling_off(system: &System, ids: &[TaskId]) {
    for id in ids {
        let (status, body) = wake(system, *id).await;
        assert_eq!(status, 202, "wake {id}: {body}");
    }
    pump_until_quiet(system, 60).await;
}

/// An operator's `wake` of the task (its wait ends now); the answer.
pub async fn wake(system: &System, id: TaskId) -> (u16, Value) {
    operator_json(
        system,
        &format!("/tasks/{id}/wake"),
        &json!({"reason": "the applicant waived the cooling-off"}),
    )
    .await
}

/// The loan's 14-day cooling-off passes: the clock moves past it, a sweep ends the wait, and
/// the pollers run until quiet (the payout goes out).
pub async fn cool_off(system: &System, clock: &OffsetClock) {
    clock.advance(chrono::Duration::days(14) + chrono::Duration::seconds(1));
    system.sweep().await.expect("sweep");
    pump_until_quiet(system, 30).await;
}

/// The task's state record (it must exist).
pub async fn state(system: &System, id: TaskId) -> StateRecord {
    system
        .store
        .get_state(id)
        .await
        .expect("read")
        .expect("record exists")
}

/// The task `id` and its state record (both must exist).
pub async fn task_and_state(system: &System, id: TaskId) -> (sas::Task, StateRecord) {
    system
        .store
        .get(id)
        .await
        .expect("read")
        .expect("the task exists")
}

/// The policies of the workflow version a record runs on.
pub async fn policies(system: &System, r: &StateRecord) -> Policies {
    workflow_of(system, r).await.policies()
}

/// The workflow version a record runs on (it must be published).
pub async fn workflow_of(system: &System, r: &StateRecord) -> Arc<sas::Workflow> {
    system
        .definitions
        .workflow(&r.workflow, r.workflow_version)
        .await
        .expect("the catalog answers")
        .unwrap_or_else(|| panic!("{} v{} is published", r.workflow, r.workflow_version))
}

/// The newest published version of workflow `name`.
pub async fn latest_workflow(system: &System, name: &str) -> Arc<sas::Workflow> {
    system
        .definitions
        .latest(name)
        .await
        .expect("the catalog answers")
        .unwrap_or_else(|| panic!("no workflow {name}"))
}

/// Asserts every invariant of the record under its workflow's policies.
pub async fn assert_valid(system: &System, r: &StateRecord) {
    let p = policies(system, r).await;
    if let Err(e) = r.check(&p) {
        panic!("task {} breaks an invariant: {e}\n{r:?}", r.task_id);
    }
}

/// The effects service `service` applied for task `id`: idempotency key → times applied.
pub fn effects(system: &System, service: &str, id: TaskId) -> HashMap<String, u32> {
    system.services.get(service).effects_for(&id.to_string())
}

/// The net effect of each of task `id`'s steps at `service` (+1 applied, 0 undone), by key.
pub fn net(system: &System, service: &str, id: TaskId) -> BTreeMap<String, i32> {
    let prefix = id.to_string();
    system
        .services
        .get(service)
        .stats()
        .net
        .into_iter()
        .filter(|(k, _)| k.starts_with(&prefix))
        .collect()
}

/// Every request whose key starts with `task` that simulated service `service` received:
/// (action, input), in order.
pub fn requests(system: &System, service: &str, task: &str) -> Vec<(String, Value)> {
    system
        .services
        .get(service)
        .stats()
        .requests
        .into_iter()
        .filter(|a| a.key.starts_with(task))
        .map(|a| (a.action, a.input))
        .collect()
}

/// The steps whose undo the task's history records, in the order they were undone.
pub fn undone_steps(r: &StateRecord) -> Vec<String> {
    r.history
        .iter()
        .filter(|h| h.reason.starts_with("undone"))
        .filter_map(|h| h.step.clone())
        .collect()
}

/// The record of task `id`, which must have ended Refused at step `step` (a valid record whose
/// refused step has nothing to undo).
pub async fn refused_at(system: &System, id: TaskId, step: usize) -> StateRecord {
    let r = state(system, id).await;
    assert_eq!(r.process_state, sas::ProcessState::Refused, "{r:?}");
    assert_valid(system, &r).await;
    assert_eq!(r.steps[step].status, sas::StepStatus::Failed);
    assert_eq!(
        r.steps[step].undo, None,
        "a refused step has nothing to undo"
    );
    r
}

/// The actions service `service` applied for task `id`, in order.
pub fn actions(system: &System, service: &str, id: TaskId) -> Vec<String> {
    requests(system, service, &id.to_string())
        .into_iter()
        .map(|(action, _)| action)
        .collect()
}

/// `GET url` and its JSON answer.
pub async fn get_json(http: &reqwest::Client, url: &str) -> Value {
    http.get(url)
        .send()
        .await
        .expect("GET")
        .json()
        .await
        .expect("JSON")
}

/// The JSON messages a queue receives within about five seconds, until there are `n`: events
/// or reply-queue messages, each checked against its published schema
/// ([`schemas::check_received`]).
pub async fn wait_for_messages(system: &System, url: &str, n: usize) -> Vec<Value> {
    let mut got = Vec::new();
    for _ in 0..50 {
        got.extend(drain(system, url).await.iter().map(|b| {
            let message = serde_json::from_str::<Value>(b).expect("JSON");
            schemas::check_received(&message);
            message
        }));
        if got.len() >= n {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    got
}

/// Serves `app` on a free loopback port; its base URL (`http://127.0.0.1:PORT`).
pub async fn serve_loopback(app: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

/// The SigV4 headers (`execute-api`, us-east-1) of a request signed at `at` over its method,
/// URL, the given headers and body, as `awscurl` or an SDK would make them.
pub fn sigv4_headers(
    (access_key_id, secret_access_key): (&str, &str),
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    at: std::time::SystemTime,
) -> Vec<(String, String)> {
    use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
    let identity = aws_credential_types::Credentials::new(
        access_key_id,
        secret_access_key,
        None,
        None,
        "tests",
    )
    .into();
    let params = aws_sigv4::sign::v4::SigningParams::builder()
        .identity(&identity)
        .region("us-east-1")
        .name("execute-api")
        .time(at)
        .settings(SigningSettings::default())
        .build()
        .expect("params")
        .into();
    let request = SignableRequest::new(
        method,
        url,
        headers.iter().copied(),
        SignableBody::Bytes(body),
    )
    .expect("signable");
    let (instructions, _) = sign(request, &params).expect("signs").into_parts();
    instructions
        .headers()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// Asserts that both items of task `id` (`TASK`, `STATE`) expire `days` from now, within the
/// two minutes the test may have taken since their write.
pub async fn assert_expires_in_days(system: &System, id: TaskId, days: i64) {
    let want = (chrono::Utc::now() + chrono::Duration::days(days)).timestamp();
    for sk in ["TASK", "STATE"] {
        let at = expires_at(system, id, sk)
            .await
            .unwrap_or_else(|| panic!("{sk} of task {id} has no ExpiresAt"));
        assert!(
            (want - 120..=want + 5).contains(&at),
            "{sk}: {at} vs {want}"
        );
    }
}

/// The `ExpiresAt` (epoch seconds) of a task's item (`TASK` or `STATE`), read raw.
pub async fn expires_at(system: &System, id: TaskId, sk: &str) -> Option<i64> {
    let ddb = aws_sdk_dynamodb::Client::new(&sdk_config().await);
    let item = ddb
        .get_item()
        .table_name(&system.resources.table)
        .key(
            "pk",
            aws_sdk_dynamodb::types::AttributeValue::S(format!("TASK#{id}")),
        )
        .key("sk", aws_sdk_dynamodb::types::AttributeValue::S(sk.into()))
        .consistent_read(true)
        .send()
        .await
        .expect("get")
        .item
        .expect("the item");
    item.get("ExpiresAt")
        .and_then(|v| v.as_n().ok())
        .map(|n| n.parse().expect("a number"))
}
