//! The sample Lambda events in `events/` (for `sam local invoke -e` and `cargo lambda invoke
//! --data-file`) stay true: every file is listed in `events/manifest.json`, deserializes into
//! the input type its Lambda really receives, and, fed to its handler on an in-memory system,
//! gives the outcome the manifest documents (answer, batch response or sweep report, state
//! record, queue contents, bus events). See `events/README.md` for the manifest's schema.

use aws_lambda_events::event::apigw::ApiGatewayV2httpRequest;
use aws_lambda_events::event::eventbridge::EventBridgeEvent;
use aws_lambda_events::event::sqs::SqsEvent;
use lambda_http::request::LambdaRequest;
use sas::api;
use sas::domain::state::to_millis;
use sas::handlers::{agent, scheduler, supervisor};
use sas::messages::{SchedulerMessage, StepRequest};
use sas::ports::{Clock, CreateOutcome, SystemClock};
use sas::transition::{self, StepOutcome};
use sas::{ProcessState, StateRecord, StepStatus, Task, TaskId, Workflow};
use sas_blackbox::{drain, memory_system};
use sas_local::{Settings, System};
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
    task_id: TaskId,
    #[serde(rename = "as")]
    state: SeedState,
    /// The workflow of the seeded task (default `ecommerce-order`).
    #[serde(default = "default_workflow")]
    workflow: String,
}

fn default_workflow() -> String {
    "ecommerce-order".into()
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
enum SeedState {
    /// A new task: Pending, pickup deadline now + pickup timeout.
    Pending,
    /// A Pending task claimed once: Processing, attempt 1, step 0 Running.
    Claimed,
    /// A Pending task whose pickup deadline passed a minute ago (a lost work message).
    Overdue,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Expect {
    // api
    status: Option<u16>,
    code: Option<String>,
    message_contains: Option<String>,
    problem_at: Option<String>,
    task_id: Option<TaskId>,
    workflow: Option<String>,
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
    tasks: Option<usize>,
    #[serde(default)]
    queues: BTreeMap<String, usize>,
    #[serde(default)]
    events: Vec<String>,
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
        ("problemAt", x.problem_at.is_some()),
        ("taskId", x.task_id.is_some()),
        ("workflow", x.workflow.is_some()),
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
            "problemAt",
            "taskId",
            "workflow",
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
            let status = x.status.expect("expect.status is required for api");
            let error = status >= 400;
            assert!(
                error == x.code.is_some(),
                "expect.code is required for, and only for, an error status"
            );
            assert!(
                error || (x.message_contains.is_none() && x.problem_at.is_none()),
                "expect.messageContains and expect.problemAt are for error answers"
            );
            assert!(
                x.problem_at.is_none()
                    || matches!(
                        x.code.as_deref(),
                        Some("validation_failed" | "invalid_definition")
                    ),
                "expect.problemAt is for answers that list problems"
            );
            assert!(
                !error
                    || (x.task_id.is_none() && x.process_state.is_none() && x.workflow.is_none()),
                "expect.taskId, expect.workflow and expect.processState are for success answers"
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
    assert!(
        !e.rewrite_reply_queue_url || e.function == Function::Agent,
        "rewriteReplyQueueUrl is for agent entries"
    );
    assert!(
        x.state.is_none() || e.seed.is_some(),
        "expect.state describes the seeded task: it needs a seed"
    );
}

/// What the invocation was about, for the checks that follow it.
#[derive(Default)]
struct Subject {
    /// The task the checks look at (seeded, or created by the invocation).
    task: Option<TaskId>,
    /// The record bodies of the SQS event as handed to the handler.
    bodies: Vec<String>,
}

async fn run(entry: Entry) {
    validate(&entry);
    let json = read_json(&events_dir().join(&entry.file));
    // With progress events on (`PROGRESS_EVENTS=true`), so that the samples show every status
    // a function publishes; by default `TaskReceived` and `TaskStepCompleted` stay off the bus.
    let mut settings = Settings::default();
    settings.policy.progress_events = true;
    let system = memory_system(settings).await;
    let mut subject = Subject::default();
    if let Some(seed) = &entry.seed {
        seed_task(&system, seed).await;
        subject.task = Some(seed.task_id);
    }
    match entry.function {
        Function::Submission => invoke_api(&system, &entry, json, &mut subject).await,
        Function::Scheduler | Function::Agent => {
            invoke_sqs(&system, &entry, json, &mut subject).await
        }
        Function::Supervisor => invoke_supervisor(&system, &entry, json).await,
    }
    check_store(&system, &entry, &subject).await;
    check_queues(&system, &entry, &subject).await;
    let (_, _, bus) = system.memory.as_ref().expect("memory backend");
    let published = bus.published();
    let types: Vec<&str> = published.iter().map(|(t, _)| t.as_str()).collect();
    assert_eq!(types, entry.expect.events, "bus events: {published:?}");
    for (_, detail) in &published {
        assert_eq!(
            detail["taskId"].as_str(),
            subject.task.map(|t| t.to_string()).as_deref(),
            "an event about the subject task: {detail}"
        );
        let id = subject.task.expect("a subject task");
        let r = sas_blackbox::state(&system, id).await;
        assert_eq!(detail["workflow"], r.workflow.as_str(), "{detail}");
    }
}

/// The workflow a seed names, as published.
async fn workflow(system: &System, name: &str) -> Arc<Workflow> {
    sas_blackbox::latest_workflow(system, name).await
}

/// The input every seeded task of `workflow` has.
fn seed_input(workflow: &str) -> Value {
    match workflow {
        "loan-application" => json!({"applicantId": "a-42", "amount": 25000, "currency": "EUR"}),
        _ => json!({
            "customerId": "c-42",
            "items": [{"sku": "SKU-1", "quantity": 2}, {"sku": "SKU-7", "quantity": 1}]
        }),
    }
}

async fn seed_task(system: &System, seed: &Seed) {
    let now = SystemClock.now();
    let w = workflow(system, &seed.workflow).await;
    w.check_input(&seed_input(&seed.workflow))
        .expect("the seed input is valid");
    let policies = w.policies();
    let (created, pickup_by) = match seed.state {
        SeedState::Pending | SeedState::Claimed => (now, now + policies.at(0).pickup_timeout),
        SeedState::Overdue => (
            now - chrono::Duration::minutes(2),
            now - chrono::Duration::minutes(1),
        ),
    };
    let task = Task {
        input_ref: None,
        id: seed.task_id,
        workflow: w.name.clone(),
        workflow_version: w.version,
        input: seed_input(&seed.workflow),
        input_revision: 0,
        earlier_inputs: vec![],
        reply_queue_url: None,
        created_at: to_millis(created),
        // The samples' caller (their IAM authorizer context), so they may read it.
        caller: sas::Caller::from_iam_arn("arn:aws:sts::123456789012:assumed-role/shop/i-0example")
            .expect("caller"),
        keys: vec![],
    };
    let record = StateRecord::new(seed.task_id, &w, None, created, pickup_by);
    assert_eq!(
        system
            .store
            .create(sas::ports::NewTask::new(&task, &record))
            .await
            .expect("seed"),
        CreateOutcome::Created
    );
    if let SeedState::Claimed = seed.state {
        let t = transition::claim(
            &record,
            &system.scheduler.instance_id,
            now,
            &policies,
            &transition::Linear,
        )
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
    if let Some(body) = v.get("body") {
        let body = body.as_str().expect("body is a string");
        if let Some(len) = headers.get("content-length") {
            assert_eq!(
                len.as_str(),
                Some(body.len().to_string().as_str()),
                "content-length is the body's length"
            );
        }
    }
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

async fn call_api(system: &System, json: &Value) -> http::Response<String> {
    // The real Lambda input: lambda_http's LambdaRequest, then its http::Request.
    let lambda: LambdaRequest =
        serde_json::from_value(json.clone()).expect("deserializes as a LambdaRequest");
    let LambdaRequest::ApiGatewayV2(_) = &lambda else {
        panic!("not read as an API Gateway HTTP API (v2) request: {lambda:?}")
    };
    let req = lambda_http::Request::from(lambda);
    // The caller, as the deployed function takes it: from the IAM authorizer's context.
    use lambda_http::RequestExt;
    let identity = match req.request_context_ref() {
        Some(lambda_http::request::RequestContext::ApiGatewayV2(ctx)) => {
            sas::auth::from_api_gateway(sas::auth::AuthMode::Iam, ctx)
        }
        other => panic!("not an HTTP API request context: {other:?}"),
    };
    api::handle(
        &system.api,
        &identity,
        req.method(),
        req.uri().path(),
        req.headers(),
        req.body().as_ref(),
    )
    .await
}

async fn invoke_api(system: &System, entry: &Entry, json: Value, subject: &mut Subject) {
    check_http_shape(&json);
    // For a precise error if the file does not match the HTTP API event.
    let _: ApiGatewayV2httpRequest =
        serde_json::from_value(json.clone()).expect("an API Gateway HTTP API request");
    let x = &entry.expect;
    let resp = call_api(system, &json).await;
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
        if let Some(at) = &x.problem_at {
            let first = &body["error"]["problems"][0];
            assert_eq!(
                first["at"],
                at.as_str(),
                "the first problem's place: {body}"
            );
            assert!(
                first["message"].as_str().is_some_and(|m| !m.is_empty()),
                "the first problem's message: {body}"
            );
        }
        return;
    }
    assert!(body.get("error").is_none(), "{body}");
    if let Some(state) = x.process_state {
        assert_eq!(body["processState"], state.as_str(), "{body}");
    }
    if let Some(id) = x.task_id {
        assert_eq!(body["taskId"], id.to_string(), "{body}");
    }
    if let Some(w) = &x.workflow {
        assert_eq!(body["workflow"], w.as_str(), "{body}");
        assert_eq!(body["workflowVersion"], 1, "{body}");
    }
    let id: TaskId = body["taskId"]
        .as_str()
        .expect("taskId in the answer")
        .parse()
        .expect("taskId is a UUID");
    if resp.status() == http::StatusCode::ACCEPTED {
        assert!(
            resp.headers().get("idempotent-replayed").is_none(),
            "a first request is not a replay"
        );
        subject.task = Some(id);
        // The stored input is the body as sent.
        let sent: Value =
            serde_json::from_str(json["body"].as_str().expect("a body")).expect("a JSON body");
        let (task, _) = sas_blackbox::task_and_state(system, id).await;
        assert_eq!(task.input, sent, "the stored input");
    }
    if x.replay {
        let again = call_api(system, &json).await;
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
            again_body["taskId"],
            id.to_string(),
            "the replay names the first task"
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
            for body in &subject.bodies {
                let Ok(q) = serde_json::from_str::<StepRequest>(body) else {
                    continue;
                };
                // A request for a published workflow names that step and its service.
                if let Ok(Some(w)) = system
                    .definitions
                    .workflow(&q.workflow, q.workflow_version)
                    .await
                {
                    let step = w.step(q.step_index).expect("the step exists");
                    assert_eq!(step.name, q.step, "the step at stepIndex");
                    let action = if q.undo {
                        step.undo.as_ref().map(|u| u.action.clone())
                    } else {
                        Some(step.action.clone())
                    };
                    assert_eq!(Some(q.action.clone()), action, "the step's action");
                    if system
                        .definitions
                        .services()
                        .await
                        .expect("services")
                        .contains_key(&q.service)
                    {
                        assert_eq!(step.service, q.service, "the step's service");
                    }
                }
            }
            agent::handle(&system.agent, event).await
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
        // Effects only at the services the requests name, under the requests' keys.
        let named: BTreeMap<String, String> = subject
            .bodies
            .iter()
            .filter_map(|b| serde_json::from_str::<StepRequest>(b).ok())
            .map(|q| (q.idempotency_key(), q.service))
            .collect();
        let mut total = 0u64;
        for (service, sim) in system.services.all() {
            for (key, count) in sim.stats().effects {
                assert_eq!(
                    named.get(&key),
                    Some(&service),
                    "{service} applied {key}, which no request of the event names for it"
                );
                total += u64::from(count);
            }
        }
        assert_eq!(total, n, "effects applied by the services");
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
    for r in &states {
        sas_blackbox::assert_valid(system, r).await;
    }
    let seeded = usize::from(entry.seed.is_some());
    assert_eq!(
        states.len(),
        entry.expect.tasks.unwrap_or(seeded),
        "tasks in the store"
    );
    if let Some(id) = subject.task {
        assert!(
            system.store.get(id).await.expect("read").is_some(),
            "task {id} is stored"
        );
    }
    let Some(want) = &entry.expect.state else {
        return;
    };
    let id = entry.seed.as_ref().expect("a seed").task_id;
    let r = sas_blackbox::state(system, id).await;
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
    let named: Vec<(&str, String)> = vec![
        ("work", res.work_queue_url.clone()),
        ("reply", res.reply_queue_url.clone()),
        ("agent", res.agent_queue_url.clone()),
        ("timers", res.timer_queue_url.clone()),
        ("deadLetter", res.dead_letter_url.clone()),
    ];
    for name in entry.expect.queues.keys() {
        assert!(
            named.iter().any(|(n, _)| n == name),
            "expect.queues names an unknown queue {name:?}"
        );
    }
    for (name, url) in &named {
        let want = entry.expect.queues.get(*name).copied().unwrap_or(0);
        let depth = queues.depth(url);
        assert_eq!(
            depth.visible + depth.invisible,
            want,
            "messages on the {name} queue"
        );
        if *name == "timers" {
            // Deadline timers are delayed until their deadline: counted, not received.
            continue;
        }
        let bodies = drain(system, url).await;
        assert_eq!(bodies.len(), want, "{name}: every message is visible");
        for body in &bodies {
            check_message(system, name, body, subject).await;
        }
    }
}

/// Checks that a message the invocation left on queue `name` is what that queue carries, for
/// the task (or the requests) the invocation was about.
async fn check_message(system: &System, name: &str, body: &str, subject: &Subject) {
    match name {
        "work" => {
            let msg: SchedulerMessage = serde_json::from_str(body).expect("a scheduler message");
            let SchedulerMessage::Work(w) = msg else {
                panic!("not a work message: {body}")
            };
            assert_eq!(Some(w.task_id), subject.task, "work message's task");
        }
        "reply" => {
            let msg: SchedulerMessage = serde_json::from_str(body).expect("a scheduler message");
            let SchedulerMessage::Reply(r) = msg else {
                panic!("not a reply: {body}")
            };
            let answers = subject.bodies.iter().any(|b| {
                serde_json::from_str::<StepRequest>(b).is_ok_and(|q| {
                    q.task_id == r.task_id
                        && q.step == r.step
                        && q.step_index == r.step_index
                        && q.attempt == r.attempt
                        && q.undo == r.undo
                })
            });
            assert!(answers, "the reply answers a request of the event: {body}");
            let StepOutcome::Succeeded {
                result: Some(result),
            } = &r.outcome
            else {
                panic!("a success with the service's answer: {body}")
            };
            let result: Value = serde_json::from_str(result).expect("the result is JSON");
            assert!(result["id"].is_string(), "{result}");
        }
        "deadLetter" => assert!(
            subject.bodies.iter().any(|b| b == body),
            "the dead letter is a record of the event, unchanged: {body}"
        ),
        "agent" => {
            let q: StepRequest = serde_json::from_str(body).expect("a step request");
            let id = subject
                .task
                .expect("a step request concerns the subject task");
            assert_eq!(q.task_id, id, "step request's task");
            let (task, r) = sas_blackbox::task_and_state(system, id).await;
            let w = sas_blackbox::workflow_of(system, &r).await;
            let step = w.step(r.step_index).expect("a current step");
            assert_eq!(
                (q.workflow.as_str(), q.workflow_version),
                (r.workflow.as_str(), r.workflow_version),
                "workflow"
            );
            assert_eq!(
                q.service, step.service,
                "sent for the current step's service"
            );
            assert_eq!(q.step, step.name, "step");
            assert_eq!(q.action, step.action, "action");
            assert!(!q.undo, "a step, not an undo");
            assert_eq!(q.step_index, r.step_index, "stepIndex");
            assert_eq!(q.attempt, r.attempt, "attempt");
            assert_eq!(Some(q.complete_by), r.complete_by, "completeBy");
            assert_eq!(
                q.idempotency_key(),
                format!("{id}:{}:{}", step.name, step.action),
                "idempotencyKey"
            );
            assert_eq!(
                q.reply_queue_url, system.resources.reply_queue_url,
                "replyQueueUrl"
            );
            let context = sas::domain::context::context(&w, &task, &r, r.step_index)
                .expect("the step's input");
            assert_eq!(
                q.input.clone(),
                step.input
                    .render(&context, sas::domain::task::MAX_REQUEST_BYTES)
                    .ok(),
                "the input is what the step's mapping builds"
            );
        }
        other => panic!("no check for queue {other}"),
    }
}
