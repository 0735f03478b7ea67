//! The sample Lambda events in `events/` (for `sam local invoke -e` and `cargo lambda invoke
//! --data-file`) stay true: every file is listed in `events/manifest.json`, deserializes into
//! the input type its Lambda really receives, and, fed to its handler on an in-memory system,
//! gives the outcome the manifest documents (answer, batch response or sweep report, state
//! record, queue contents, bus events). See `events/README.md` for the manifest's schema.

use aws_lambda_events::event::apigw::ApiGatewayV2httpRequest;
use aws_lambda_events::event::eventbridge::EventBridgeEvent;
use aws_lambda_events::event::sqs::SqsEvent;
use lambda_http::request::LambdaRequest;
use sas::domain::state::to_millis;
use sas::handlers::{agent, scheduler, submission, supervisor};
use sas::local::{Backend, Settings, System};
use sas::messages::{SchedulerMessage, StepRequest};
use sas::ports::{Clock, CreateOutcome, SystemClock};
use sas::remote::SimulatedService;
use sas::transition::{self, StepOutcome};
use sas::{Order, OrderId, OrderRequest, ProcessState, StateRecord, StepStatus};
use sas_blackbox::drain;
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// One entry of `events/manifest.json`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Entry {
    /// The event file, relative to `events/`, with `/` separators.
    file: String,
    function: Function,
    /// `agent` entries: which agent (`AGENT_NAME`) handles the event.
    #[serde(default)]
    agent: Option<String>,
    /// What the store must hold before the invocation.
    #[serde(default)]
    seed: Option<Seed>,
    /// `agent` entries: replace each record body's `replyQueueUrl` with the in-memory reply
    /// queue's URL before the invocation.
    #[serde(default)]
    rewrite_reply_queue_url: bool,
    expect: Expect,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Function {
    Submission,
    Scheduler,
    Agent,
    Supervisor,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Seed {
    order_id: OrderId,
    #[serde(rename = "as")]
    state: SeedState,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
enum SeedState {
    /// A new order: Pending, pickup deadline now + pickup timeout.
    Pending,
    /// A Pending order claimed once: Processing, attempt 1, step 0 Running.
    Claimed,
    /// A Pending order whose pickup deadline passed a minute ago (a lost work message).
    Overdue,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Expect {
    // submission
    status: Option<u16>,
    code: Option<String>,
    message_contains: Option<String>,
    order_id: Option<OrderId>,
    process_state: Option<ProcessState>,
    #[serde(default)]
    replay: bool,
    // scheduler, agent
    batch_item_failures: Option<usize>,
    remote_effects: Option<u64>,
    // supervisor
    report: Option<Value>,
    // every function
    state: Option<ExpectState>,
    orders: Option<usize>,
    #[serde(default)]
    queues: BTreeMap<String, usize>,
    #[serde(default)]
    events: usize,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ExpectState {
    process_state: Option<ProcessState>,
    attempt: Option<u64>,
    step_index: Option<usize>,
    failure_count: Option<u32>,
    steps: Option<Vec<StepStatus>>,
}

fn events_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../events")
}

/// Every `*.json` file under `dir`, as `/`-separated paths relative to `root`.
fn json_files(root: &Path, dir: &Path, out: &mut BTreeSet<String>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            json_files(root, &path, out);
        } else if path.extension().is_some_and(|e| e == "json") {
            let rel = path.strip_prefix(root).expect("under the root");
            let rel: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            out.insert(rel.join("/"));
        }
    }
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

fn manifest() -> Vec<Entry> {
    let path = events_dir().join("manifest.json");
    serde_json::from_value(read_json(&path))
        .unwrap_or_else(|e| panic!("{} does not follow the schema: {e}", path.display()))
}

/// Fails if an event file is missing from the manifest or the manifest names a missing file.
fn check_manifest_covers_the_files(entries: &[Entry]) {
    let dir = events_dir();
    let mut on_disk = BTreeSet::new();
    json_files(&dir, &dir, &mut on_disk);
    on_disk.remove("manifest.json");
    assert!(
        !on_disk.is_empty(),
        "no event files under {}",
        dir.display()
    );
    let mut named = BTreeSet::new();
    for entry in entries {
        assert!(
            named.insert(entry.file.clone()),
            "the manifest names {} twice",
            entry.file
        );
    }
    let unlisted: Vec<_> = on_disk.difference(&named).collect();
    let missing: Vec<_> = named.difference(&on_disk).collect();
    assert!(
        unlisted.is_empty(),
        "event files missing from events/manifest.json: {unlisted:?}"
    );
    assert!(
        missing.is_empty(),
        "events/manifest.json names files that do not exist: {missing:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_sample_event_is_in_the_manifest_and_gives_its_documented_outcome() {
    let entries = manifest();
    check_manifest_covers_the_files(&entries);
    // Each entry runs on its own system, in its own task, so one failure does not hide others.
    let runs: Vec<_> = entries
        .into_iter()
        .map(|entry| (entry.file.clone(), tokio::spawn(run(entry))))
        .collect();
    let mut failed = Vec::new();
    for (file, run) in runs {
        if let Err(e) = run.await {
            let why = match e.try_into_panic() {
                Ok(p) => p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_default(),
                Err(e) => e.to_string(),
            };
            failed.push(format!("{file}: {why}"));
        }
    }
    assert!(
        failed.is_empty(),
        "{} event(s) did not give their documented outcome:\n{}",
        failed.len(),
        failed.join("\n")
    );
}

/// Rejects manifest entries that carry expectations their function cannot meet, so that no
/// expectation is silently ignored.
fn validate(e: &Entry) {
    let x = &e.expect;
    let http = [
        ("status", x.status.is_some()),
        ("code", x.code.is_some()),
        ("messageContains", x.message_contains.is_some()),
        ("orderId", x.order_id.is_some()),
        ("processState", x.process_state.is_some()),
        ("replay", x.replay),
    ];
    let sqs = [
        ("batchItemFailures", x.batch_item_failures.is_some()),
        ("remoteEffects", x.remote_effects.is_some()),
    ];
    let sweep = [("report", x.report.is_some())];
    let allowed: &[&str] = match e.function {
        Function::Submission => &[
            "status",
            "code",
            "messageContains",
            "orderId",
            "processState",
            "replay",
        ],
        Function::Scheduler => &["batchItemFailures"],
        Function::Agent => &["batchItemFailures", "remoteEffects"],
        Function::Supervisor => &["report"],
    };
    for (name, set) in http.iter().chain(&sqs).chain(&sweep) {
        assert!(
            !set || allowed.contains(name),
            "expect.{name} does not apply to {:?}",
            e.function
        );
    }
    match e.function {
        Function::Submission => {
            let status = x.status.expect("expect.status is required for submission");
            let error = status >= 400;
            assert!(
                error == x.code.is_some(),
                "expect.code is required for, and only for, an error status"
            );
            assert!(
                error || x.message_contains.is_none(),
                "expect.messageContains is for error answers"
            );
            assert!(
                !error || (x.order_id.is_none() && x.process_state.is_none()),
                "expect.orderId and expect.processState are for success answers"
            );
            assert!(!x.replay || status == 202, "expect.replay needs status 202");
        }
        Function::Scheduler | Function::Agent => assert!(
            x.batch_item_failures.is_some(),
            "expect.batchItemFailures is required for SQS functions"
        ),
        Function::Supervisor => assert!(
            x.report.is_some(),
            "expect.report is required for supervisor"
        ),
    }
    assert_eq!(
        e.agent.is_some(),
        e.function == Function::Agent,
        "`agent` is required for, and only for, agent entries"
    );
    assert!(
        !e.rewrite_reply_queue_url || e.function == Function::Agent,
        "rewriteReplyQueueUrl is for agent entries"
    );
    assert!(
        x.state.is_none() || e.seed.is_some(),
        "expect.state describes the seeded order: it needs a seed"
    );
}

/// What the invocation was about, for the checks that follow it.
#[derive(Default)]
struct Subject {
    /// The order the checks look at (seeded, or created by the invocation).
    order: Option<OrderId>,
    /// The record bodies of the SQS event as handed to the handler.
    bodies: Vec<String>,
}

async fn run(entry: Entry) {
    validate(&entry);
    let json = read_json(&events_dir().join(&entry.file));
    let system = System::new(Backend::Memory, Settings::default(), Arc::new(SystemClock))
        .await
        .expect("in-memory system builds");
    let mut subject = Subject::default();
    if let Some(seed) = &entry.seed {
        seed_order(&system, seed).await;
        subject.order = Some(seed.order_id);
    }
    match entry.function {
        Function::Submission => invoke_submission(&system, &entry, json, &mut subject).await,
        Function::Scheduler | Function::Agent => {
            invoke_sqs(&system, &entry, json, &mut subject).await
        }
        Function::Supervisor => invoke_supervisor(&system, &entry, json).await,
    }
    check_store(&system, &entry, &subject).await;
    check_queues(&system, &entry, &subject).await;
    let (_, _, bus) = system.memory.as_ref().expect("memory backend");
    assert_eq!(
        bus.published().len(),
        entry.expect.events,
        "bus events: {:?}",
        bus.published()
    );
}

/// The order every seed uses.
fn seed_request() -> OrderRequest {
    serde_json::from_value(json!({
        "customerId": "c-42",
        "items": [{"sku": "SKU-1", "quantity": 2}, {"sku": "SKU-7", "quantity": 1}]
    }))
    .expect("seed request shape")
}

async fn seed_order(system: &System, seed: &Seed) {
    let now = SystemClock.now();
    let policy = &system.scheduler.policy;
    let (created, pickup_by) = match seed.state {
        SeedState::Pending | SeedState::Claimed => (now, now + policy.pickup_timeout),
        SeedState::Overdue => (
            now - chrono::Duration::minutes(2),
            now - chrono::Duration::minutes(1),
        ),
    };
    let order = Order::new(
        seed.order_id,
        seed_request().parse().expect("seed request is valid"),
        to_millis(created),
    );
    let record = StateRecord::new(
        seed.order_id,
        &system.scheduler.workflow,
        None,
        created,
        pickup_by,
    );
    assert_eq!(
        system
            .store
            .create(&order, &record, None)
            .await
            .expect("seed"),
        CreateOutcome::Created
    );
    if let SeedState::Claimed = seed.state {
        let t = transition::claim(&record, &system.scheduler.instance_id, now, policy)
            .expect("a Pending record can be claimed");
        system
            .store
            .put(&t.record, &t.condition)
            .await
            .expect("claim");
    }
}

/// Checks the API Gateway HTTP API (payload 2.0) shape that typed deserialization would let
/// pass silently (its fields default when missing).
fn check_http_shape(v: &Value) {
    assert_eq!(v["version"], "2.0", "version");
    assert_eq!(
        v["requestContext"]["stage"], "$default",
        "requestContext.stage"
    );
    assert_eq!(v["isBase64Encoded"], false, "isBase64Encoded");
    assert!(v["rawQueryString"].is_string(), "rawQueryString");
    let method = v["requestContext"]["http"]["method"]
        .as_str()
        .expect("requestContext.http.method");
    let path = v["rawPath"].as_str().expect("rawPath");
    assert_eq!(
        v["requestContext"]["http"]["path"], path,
        "requestContext.http.path is rawPath"
    );
    assert!(
        v["requestContext"]["http"]["sourceIp"].is_string(),
        "requestContext.http.sourceIp"
    );
    let headers = v["headers"].as_object().expect("headers");
    for name in headers.keys() {
        assert_eq!(*name, name.to_lowercase(), "header names are lower-case");
    }
    assert!(
        v.get("body").is_none_or(Value::is_string),
        "body is a string"
    );
    let route = v["routeKey"].as_str().expect("routeKey");
    assert_eq!(
        v["requestContext"]["routeKey"], route,
        "requestContext.routeKey"
    );
    if route != "$default" {
        let (route_method, template) = route.split_once(' ').expect("routeKey: METHOD /path");
        assert_eq!(route_method, method, "routeKey's method");
        let mut expanded = template.to_owned();
        if let Some(params) = v["pathParameters"].as_object() {
            for (name, value) in params {
                let value = value.as_str().expect("path parameters are strings");
                expanded = expanded.replace(&format!("{{{name}}}"), value);
            }
        }
        assert_eq!(expanded, path, "routeKey and pathParameters give rawPath");
    }
}

async fn call_submission(system: &System, json: &Value) -> http::Response<String> {
    // The real Lambda input: lambda_http's LambdaRequest, then its http::Request.
    let lambda: LambdaRequest =
        serde_json::from_value(json.clone()).expect("deserializes as a LambdaRequest");
    let LambdaRequest::ApiGatewayV2(_) = &lambda else {
        panic!("not read as an API Gateway HTTP API (v2) request: {lambda:?}")
    };
    let req = lambda_http::Request::from(lambda);
    submission::handle(
        &system.submission,
        req.method(),
        req.uri().path(),
        req.headers(),
        req.body().as_ref(),
    )
    .await
}

async fn invoke_submission(system: &System, entry: &Entry, json: Value, subject: &mut Subject) {
    check_http_shape(&json);
    // For a precise error if the file does not match the HTTP API event.
    let _: ApiGatewayV2httpRequest =
        serde_json::from_value(json.clone()).expect("an API Gateway HTTP API request");
    let x = &entry.expect;
    let resp = call_submission(system, &json).await;
    let body: Value = serde_json::from_str(resp.body()).expect("a JSON answer");
    assert_eq!(resp.status().as_u16(), x.status.expect("status"), "{body}");
    assert_eq!(
        resp.headers()
            .get(http::header::CONTENT_TYPE)
            .map(|v| v.as_bytes()),
        Some(&b"application/json"[..]),
        "content-type"
    );
    if let Some(code) = &x.code {
        assert_eq!(body["error"]["code"], code.as_str(), "{body}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(!message.is_empty(), "an error message: {body}");
        if let Some(part) = &x.message_contains {
            assert!(message.contains(part.as_str()), "{message:?} names {part}");
        }
        return;
    }
    assert!(body.get("error").is_none(), "{body}");
    if let Some(state) = x.process_state {
        assert_eq!(body["processState"], state.as_str(), "{body}");
    }
    if let Some(id) = x.order_id {
        assert_eq!(body["orderId"], id.to_string(), "{body}");
    }
    let id: OrderId = body["orderId"]
        .as_str()
        .expect("orderId in the answer")
        .parse()
        .expect("orderId is a UUID");
    if resp.status() == http::StatusCode::ACCEPTED {
        assert!(
            resp.headers().get("idempotent-replayed").is_none(),
            "a first request is not a replay"
        );
        subject.order = Some(id);
    }
    if x.replay {
        let again = call_submission(system, &json).await;
        let again_body: Value = serde_json::from_str(again.body()).expect("a JSON answer");
        assert_eq!(again.status().as_u16(), 202, "{again_body}");
        assert_eq!(
            again
                .headers()
                .get("idempotent-replayed")
                .map(|v| v.as_bytes()),
            Some(&b"true"[..]),
            "the repeat is a replay"
        );
        assert_eq!(
            again_body["orderId"],
            id.to_string(),
            "the replay names the first order"
        );
    }
}

async fn invoke_sqs(system: &System, entry: &Entry, mut json: Value, subject: &mut Subject) {
    let records = json["Records"].as_array_mut().expect("Records");
    assert!(!records.is_empty(), "an SQS event has at least one record");
    if entry.rewrite_reply_queue_url {
        let reply_url = &system.resources.reply_queue_url;
        for r in records.iter_mut() {
            let mut body: Value =
                serde_json::from_str(r["body"].as_str().expect("body")).expect("a JSON body");
            let field = body
                .get_mut("replyQueueUrl")
                .expect("rewriteReplyQueueUrl: the body has a replyQueueUrl");
            assert!(field.is_string(), "replyQueueUrl is a string");
            *field = Value::from(reply_url.as_str());
            r["body"] = Value::from(body.to_string());
        }
    }
    let event: SqsEvent = serde_json::from_value(json).expect("deserializes as an SqsEvent");
    let mut ids = BTreeSet::new();
    for r in &event.records {
        let id = r.message_id.clone().expect("messageId");
        assert!(ids.insert(id.clone()), "messageId {id} is unique");
        assert!(r.receipt_handle.is_some(), "{id}: receiptHandle");
        assert_eq!(
            r.event_source.as_deref(),
            Some("aws:sqs"),
            "{id}: eventSource"
        );
        assert!(
            r.event_source_arn
                .as_deref()
                .is_some_and(|a| a.starts_with("arn:aws:sqs:")),
            "{id}: eventSourceARN"
        );
        assert!(r.aws_region.is_some(), "{id}: awsRegion");
        let count: u32 = r
            .attributes
            .get("ApproximateReceiveCount")
            .expect("attributes.ApproximateReceiveCount")
            .parse()
            .expect("a count");
        assert!(count >= 1, "{id}: ApproximateReceiveCount");
        subject.bodies.push(r.body.clone().expect("body"));
    }
    let response = match entry.function {
        Function::Scheduler => scheduler::handle(&system.scheduler, event).await,
        _ => {
            let name = entry.agent.as_deref().expect("agent");
            let deps = system
                .agents
                .iter()
                .find(|a| a.name == name)
                .unwrap_or_else(|| panic!("no agent {name}"));
            for body in &subject.bodies {
                if let Ok(q) = serde_json::from_str::<StepRequest>(body) {
                    let step = system.scheduler.workflow.step(q.step_index);
                    assert!(
                        step.is_some_and(|s| s.agent == name && s.name == q.step),
                        "step {} at index {} is not {name}'s",
                        q.step,
                        q.step_index
                    );
                }
            }
            agent::handle(deps, event).await
        }
    };
    let failures: Vec<&str> = response
        .batch_item_failures
        .iter()
        .map(|f| f.item_identifier.as_str())
        .collect();
    assert_eq!(
        Some(failures.len()),
        entry.expect.batch_item_failures,
        "batch item failures: {failures:?}"
    );
    for f in failures {
        assert!(
            ids.contains(f),
            "a failure names a record of the batch: {f}"
        );
    }
    if let Some(n) = entry.expect.remote_effects {
        let effects = |service: &SimulatedService| -> u64 {
            service.stats().effects.into_values().map(u64::from).sum()
        };
        let name = entry.agent.as_deref().expect("agent");
        assert_eq!(
            effects(&system.services[name]),
            n,
            "effects applied by {name}'s remote service"
        );
        let total: u64 = system.services.values().map(|s| effects(s)).sum();
        assert_eq!(total, n, "effects applied by the other remote services");
    }
}

async fn invoke_supervisor(system: &System, entry: &Entry, json: Value) {
    let event: EventBridgeEvent<Value> =
        serde_json::from_value(json).expect("deserializes as an EventBridgeEvent");
    assert_eq!(event.detail_type, "Scheduled Event", "detail-type");
    assert_eq!(event.source, "aws.events", "source");
    assert!(event.id.is_some(), "id");
    assert!(event.time.is_some(), "time");
    assert!(event.detail.is_object(), "detail is an object");
    let resources = event.resources.clone().unwrap_or_default();
    assert!(
        !resources.is_empty() && resources.iter().all(|r| r.starts_with("arn:aws:events:")),
        "resources name the schedule rule: {resources:?}"
    );
    let report = supervisor::handle(&system.supervisor, event)
        .await
        .expect("the sweep runs");
    assert_eq!(
        Some(serde_json::to_value(&report).expect("report serializes")),
        entry.expect.report,
        "sweep report"
    );
}

async fn check_store(system: &System, entry: &Entry, subject: &Subject) {
    let (store, _, _) = system.memory.as_ref().expect("memory backend");
    let states = store.all_states();
    let policy = &system.scheduler.policy;
    for r in &states {
        r.check(policy.failure_threshold)
            .unwrap_or_else(|e| panic!("{}: {e}", r.order_id));
    }
    let seeded = usize::from(entry.seed.is_some());
    assert_eq!(
        states.len(),
        entry.expect.orders.unwrap_or(seeded),
        "orders in the store"
    );
    if let Some(id) = subject.order {
        assert!(
            system.store.get(id).await.expect("read").is_some(),
            "order {id} is stored"
        );
    }
    let Some(want) = &entry.expect.state else {
        return;
    };
    let id = entry.seed.as_ref().expect("a seed").order_id;
    let r = system
        .store
        .get_state(id)
        .await
        .expect("read")
        .expect("the seeded order exists");
    if let Some(s) = want.process_state {
        assert_eq!(r.process_state, s, "processState");
    }
    if let Some(a) = want.attempt {
        assert_eq!(r.attempt, a, "attempt");
    }
    if let Some(i) = want.step_index {
        assert_eq!(r.step_index, i, "stepIndex");
    }
    if let Some(n) = want.failure_count {
        assert_eq!(r.failure_count, n, "failureCount");
    }
    if let Some(steps) = &want.steps {
        let got: Vec<StepStatus> = r.steps.iter().map(|s| s.status).collect();
        assert_eq!(&got, steps, "step statuses");
    }
}

async fn check_queues(system: &System, entry: &Entry, subject: &Subject) {
    let res = &system.resources;
    let (_, queues, _) = system.memory.as_ref().expect("memory backend");
    let mut named: Vec<(String, String)> = vec![
        ("work".into(), res.work_queue_url.clone()),
        ("reply".into(), res.reply_queue_url.clone()),
        ("deadLetter".into(), res.dead_letter_url.clone()),
    ];
    named.extend(
        res.agent_queue_urls
            .iter()
            .map(|(a, u)| (a.clone(), u.clone())),
    );
    for name in entry.expect.queues.keys() {
        assert!(
            named.iter().any(|(n, _)| n == name),
            "expect.queues names an unknown queue {name:?}"
        );
    }
    for (name, url) in &named {
        let want = entry.expect.queues.get(name).copied().unwrap_or(0);
        let depth = queues.depth(url);
        assert_eq!(
            depth.visible + depth.invisible,
            want,
            "messages on the {name} queue"
        );
        let bodies = drain(system, url).await;
        assert_eq!(bodies.len(), want, "{name}: every message is visible");
        for body in &bodies {
            check_message(system, name, body, subject).await;
        }
    }
}

/// Checks that a message the invocation left on queue `name` is what that queue carries, for
/// the order (or the requests) the invocation was about.
async fn check_message(system: &System, name: &str, body: &str, subject: &Subject) {
    match name {
        "work" => {
            let msg: SchedulerMessage = serde_json::from_str(body).expect("a scheduler message");
            let SchedulerMessage::Work(w) = msg else {
                panic!("not a work message: {body}")
            };
            assert_eq!(Some(w.order_id), subject.order, "work message's order");
        }
        "reply" => {
            let msg: SchedulerMessage = serde_json::from_str(body).expect("a scheduler message");
            let SchedulerMessage::Reply(r) = msg else {
                panic!("not a reply: {body}")
            };
            let answers = subject.bodies.iter().any(|b| {
                serde_json::from_str::<StepRequest>(b).is_ok_and(|q| {
                    q.order_id == r.order_id
                        && q.step == r.step
                        && q.step_index == r.step_index
                        && q.attempt == r.attempt
                })
            });
            assert!(answers, "the reply answers a request of the event: {body}");
            assert!(matches!(r.outcome, StepOutcome::Succeeded { .. }), "{body}");
        }
        "deadLetter" => assert!(
            subject.bodies.iter().any(|b| b == body),
            "the dead letter is a record of the event, unchanged: {body}"
        ),
        agent_name => {
            let q: StepRequest = serde_json::from_str(body).expect("a step request");
            let id = subject
                .order
                .expect("a step request concerns the subject order");
            assert_eq!(q.order_id, id, "step request's order");
            let (order, r) = system
                .store
                .get(id)
                .await
                .expect("read")
                .expect("the order exists");
            let step = system
                .scheduler
                .workflow
                .step(r.step_index)
                .expect("a current step");
            assert_eq!(step.agent, agent_name, "sent to the current step's agent");
            assert_eq!(q.step, step.name, "step");
            assert_eq!(q.action, step.name, "action");
            assert_eq!(q.step_index, r.step_index, "stepIndex");
            assert_eq!(q.attempt, r.attempt, "attempt");
            assert_eq!(Some(q.complete_by), r.complete_by, "completeBy");
            assert_eq!(
                q.reply_queue_url, system.resources.reply_queue_url,
                "replyQueueUrl"
            );
            assert_eq!(
                q.payload["customerId"],
                order.customer_id.as_str(),
                "payload"
            );
        }
    }
}
