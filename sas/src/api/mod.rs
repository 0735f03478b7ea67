//! The HTTP APIs. Framework-free: the Lambda (`lambda_http`) and the local runner (`axum`)
//! both adapt their requests to [`handle`], with the caller's [`Identity`] as the API's
//! authorizer established it.
//!
//! **The task API** (`SubmissionDeps::operator_api` off; authenticated by IAM, a JWT, or
//! nothing, as deployed): `POST /workflows/{name}/tasks` starts a task of the newest version of
//! a workflow (idempotently per caller), `GET /tasks` lists the caller's tasks, `GET
//! /tasks/{taskId}` reports one of them, `POST /tasks/{taskId}/cancel` cancels one. A caller sees
//! only its own tasks (another's answers 404) and not sas's internals (lock holder, attempts,
//! raw errors unless the workflow has `publicErrors`). `POST /tasks/{taskId}/callbacks/{token}`
//! completes a callback step (see [`super::callback`]); its token is its credential.
//!
//! **The operator API** (on; every route under `/operator`, always behind IAM): `GET
//! /tasks?state=&workflow=` lists every caller's tasks by state through the state index;
//! `GET /tasks/{taskId}` shows everything; `POST /tasks/{taskId}/retry|compensate|cancel` acts
//! on one, recording who and why; `GET /workflows`, `GET|PUT /workflows/{name}`,
//! `GET /workflows/{name}/versions/{version}`, `GET /services` and `GET|PUT /services/{name}`
//! read and publish definitions.

use crate::handlers::{Outlets, perform_no_step, progress_status, publish_status, write};
pub mod callback;
pub mod console;

use crate::auth::Identity;
use crate::catalog::{CatalogError, Definitions};
use crate::domain::rate::{Admission, RateLimit};
use crate::domain::task::{MAX_INPUT_BYTES, ReplyQueues};
use crate::domain::transition::{self, Actor, Effect, Rejection, Transition};
use crate::domain::workflow::{self, MAX_DEFINITION_BYTES, ServiceDef};
use crate::domain::{Caller, ProcessState, StateRecord, Status, StepStatus, Task, TaskId};
use crate::messages::{SchedulerMessage, WorkMessage};
use crate::ports::{Clock, CreateOutcome, EventBus, IdempotencyRecord, Queue, StateStore};
use crate::ports::{Cursor, Kind, canonical};
use http::{HeaderMap, Method, Response, StatusCode};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use std::sync::Arc;
use std::time::Duration;
use tracing::{Instrument, error, info, info_span};

/// Largest accepted request body (a definition; a task's input is limited further, to
/// [`MAX_INPUT_BYTES`]).
pub const MAX_BODY_BYTES: usize = 256 * 1024;
/// The idempotency header.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// The header naming a queue for the task's status messages.
pub const REPLY_QUEUE_URL: &str = "reply-queue-url";
/// Longest accepted idempotency key.
pub const MAX_KEY_LEN: usize = 255;

#[derive(Clone)]
pub struct SubmissionDeps {
    pub store: Arc<dyn StateStore>,
    pub queue: Arc<dyn Queue>,
    pub events: Arc<dyn EventBus>,
    pub clock: Arc<dyn Clock>,
    pub definitions: Arc<Definitions>,
    pub work_queue_url: String,
    /// This is the operator API (every route under [`OPERATOR_PREFIX`]; tasks of every caller,
    /// retry, compensate, cancel, definitions). Off on the task API.
    pub operator_api: bool,
    /// The queues a task's caller may name for its status messages.
    pub reply_queues: ReplyQueues,
    /// Each caller's allowance on the task API (`None`: unlimited).
    pub rate_limit: Option<RateLimit>,
    /// Where the handler's EMF metrics go.
    pub metrics: crate::metrics::Metrics,
}

/// The path every operator route starts with.
pub const OPERATOR_PREFIX: &str = "/operator";

/// The most tasks one list page returns.
pub const MAX_PAGE: usize = 100;
/// The longest reason an operator may give for a cancel.
pub const MAX_REASON_CHARS: usize = 500;

/// An error answer: `{"error": {"code": ..., "message": ...}}`.
pub(crate) fn error(
    status: StatusCode,
    code: &str,
    message: impl Into<String>,
) -> Response<String> {
    respond(
        status,
        &json!({"error": {"code": code, "message": message.into()}}),
    )
}

pub(crate) fn respond(status: StatusCode, body: &Value) -> Response<String> {
    let mut r = Response::new(body.to_string());
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

/// Routes and answers one request of `identity`.
pub async fn handle(
    deps: &SubmissionDeps,
    identity: &Identity,
    method: &Method,
    path_and_query: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Response<String> {
    let (path, query) = path_and_query
        .split_once('?')
        .unwrap_or((path_and_query, ""));
    let path = path.trim_end_matches('/');
    let op = deps.operator_api;
    let routed = if op {
        match path.strip_prefix(OPERATOR_PREFIX) {
            Some(rest) if rest.is_empty() || rest.starts_with('/') => rest,
            _ => return no_route(method, path),
        }
    } else {
        path
    };
    let segments: Vec<&str> = routed.split('/').skip(1).collect();
    // The callback route is the only one a credential in the path authenticates.
    if let (["tasks", id, "callbacks", token], &Method::POST) = (segments.as_slice(), method)
        && !op
    {
        let span = info_span!("callback", task_id = %id);
        return callback::callback(deps, id, token, body)
            .instrument(span)
            .await;
    }
    if op && segments.first() == Some(&"console") {
        return match identity {
            Identity::Caller(caller) => {
                let span = info_span!("console", caller = %caller, path = %routed);
                console::page(deps, caller, method, &segments[1..], query, headers, body)
                    .instrument(span)
                    .await
            }
            Identity::Unauthenticated(_) => error(
                StatusCode::UNAUTHORIZED,
                "unauthenticated",
                "the console is part of the operator API: sign the request (sasctl console does)",
            ),
        };
    }
    let Some(allowed) = allowed_methods(&segments, op) else {
        return no_route(method, path);
    };
    if !allowed.split(", ").any(|m| m == method.as_str()) {
        let mut r = error(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            format!("{method} is not allowed on {path}"),
        );
        r.headers_mut()
            .insert(http::header::ALLOW, http::HeaderValue::from_static(allowed));
        return r;
    }
    let caller = match identity {
        Identity::Caller(c) => c,
        Identity::Unauthenticated(why) => {
            info!(why = %why, "unauthenticated request");
            return error(
                StatusCode::UNAUTHORIZED,
                "unauthenticated",
                "this API needs authentication: a SigV4 signature or a bearer token, as deployed",
            );
        }
    };
    // The caller is neither a secret nor personal data beyond a principal's name: operators
    // need it in every log line of the request.
    let span = info_span!("api", caller = %caller, operator = op);
    if !op && let Some(limit) = &deps.rate_limit {
        // A caller allowed more than one item takes is spread over several (no hot key):
        // each request is admitted by one, at random, against its share.
        let shard = rand::random_range(0..limit.shards());
        let key = crate::domain::rate::shard_key(&caller.digest(), shard);
        match deps
            .store
            .admit(&key, &limit.per_shard(), deps.clock.now())
            .instrument(span.clone())
            .await
        {
            Ok(Admission::Admitted) => {}
            Ok(Admission::Limited { retry_after }) => {
                let seconds = (retry_after.num_milliseconds().max(1) + 999) / 1000;
                let _entered = span.enter();
                info!(retry_after_s = seconds, "caller over its rate limit");
                let mut r = error(
                    StatusCode::TOO_MANY_REQUESTS,
                    "rate_limited",
                    format!(
                        "over this caller's limit of {} requests a second (bursts of {}); retry after {seconds} s",
                        limit.per_second, limit.burst
                    ),
                );
                r.headers_mut()
                    .insert(http::header::RETRY_AFTER, http::HeaderValue::from(seconds));
                return r;
            }
            // The limit protects the service; an unreadable limit item must not take the API
            // down with it (the request's own writes fail anyway if the table is down).
            Err(e) => error!(error = %e, "rate limit unavailable; request admitted"),
        }
    }
    let started = crate::xray::now_seconds();
    let resp = route(deps, caller, method, &segments, query, headers, body)
        .instrument(span)
        .await;
    // Traced: the request's subsegment names its task (from the path, or a new task's answer).
    let task = match segments.as_slice() {
        _ if !crate::xray::enabled() => None,
        ["tasks", id, ..] => id.parse::<TaskId>().ok().map(|id| id.to_string()),
        ["workflows", _, "tasks"] => serde_json::from_str::<Value>(resp.body())
            .ok()
            .and_then(|v| v["taskId"].as_str().map(str::to_owned)),
        _ => None,
    };
    if let Some(id) = task {
        crate::xray::record(
            if op { "operator" } else { "api" },
            started,
            &[("task_id", &id)],
        );
    }
    resp
}

/// The methods a path allows (`None`: no such route).
fn allowed_methods(segments: &[&str], op: bool) -> Option<&'static str> {
    const ACTIONS: [&str; 7] = [
        "retry",
        "compensate",
        "cancel",
        "resolve",
        "skip",
        "retry-with-input",
        "compensate-from",
    ];
    Some(match segments {
        ["workflows", _, "tasks"] => "POST",
        ["tasks"] => "GET",
        ["tasks", _] => "GET",
        ["tasks", _, "callbacks", _] if !op => "POST",
        ["tasks", _, "cancel"] if !op => "POST",
        ["tasks", _, action] if op && ACTIONS.contains(action) => "POST",
        ["workflows" | "services" | "counts"] if op => "GET",
        ["workflows" | "services", _] if op => "GET, PUT",
        ["services", _, "pause" | "resume"] if op => "POST",
        ["workflows", _, "versions", _] if op => "GET",
        _ => return None,
    })
}

fn no_route(method: &Method, path: &str) -> Response<String> {
    error(
        StatusCode::NOT_FOUND,
        "route_not_found",
        format!("no route for {method} {path}"),
    )
}

/// Answers an authenticated request on a route and method that exist (the console calls it
/// in process for the data of its pages).
pub(crate) async fn route(
    deps: &SubmissionDeps,
    caller: &Caller,
    method: &Method,
    segments: &[&str],
    query: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Response<String> {
    let op = deps.operator_api;
    match (segments, method) {
        (["workflows", name, "tasks"], &Method::POST) => {
            let span = info_span!("submit", workflow = %name, task_id = tracing::field::Empty);
            submit(deps, caller, name, headers, body)
                .instrument(span)
                .await
        }
        (["tasks"], _) if op => list(deps, query).instrument(info_span!("list_tasks")).await,
        (["tasks"], _) => {
            list_mine(deps, caller, query)
                .instrument(info_span!("list_my_tasks"))
                .await
        }
        (["tasks", id], _) => {
            let span = info_span!("get_task", task_id = %id);
            get_task(deps, caller, id).instrument(span).await
        }
        (["tasks", id, action], _) => {
            let span = info_span!("act", task_id = %id, action = %action, workflow = tracing::field::Empty, attempt = tracing::field::Empty);
            let actor = |reason| Actor {
                by: caller.to_string(),
                reason,
                operator: op,
            };
            operate(deps, caller, id, action, body, actor)
                .instrument(span)
                .await
        }
        (["counts"], _) => counts(deps, query).await,
        (["workflows"], _) => entries(deps, Kind::Workflow).await,
        (["services"], _) => services(deps).await,
        (["workflows", name], &Method::GET) => definition(deps, Kind::Workflow, name, None).await,
        (["workflows", name, "versions", v], _) => {
            let Ok(v) = v.parse::<u32>() else {
                return error(
                    StatusCode::BAD_REQUEST,
                    "invalid_version",
                    "a version is a positive whole number",
                );
            };
            definition(deps, Kind::Workflow, name, Some(v)).await
        }
        (["services", name], &Method::GET) => definition(deps, Kind::Service, name, None).await,
        (["services", name, action], _) => {
            let span = info_span!("service_action", service = %name, action = %action);
            pause_or_resume(deps, caller, name, action, body)
                .instrument(span)
                .await
        }
        (["workflows", name], _) => {
            let span = info_span!("publish_workflow", workflow = %name);
            publish_workflow(deps, name, headers, body)
                .instrument(span)
                .await
        }
        (["services", name], _) => {
            let span = info_span!("publish_service", service = %name);
            publish_service(deps, name, headers, body)
                .instrument(span)
                .await
        }
        _ => no_route(method, &format!("/{}", segments.join("/"))),
    }
}

/// A malformed `Idempotency-Key` header.
struct InvalidKey;

fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, InvalidKey> {
    let Some(v) = headers.get(IDEMPOTENCY_KEY) else {
        return Ok(None);
    };
    let s = v.to_str().map_err(|_| InvalidKey)?;
    if s.is_empty() || s.len() > MAX_KEY_LEN || !s.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(InvalidKey);
    }
    Ok(Some(s.to_owned()))
}

/// The answer to a body over [`MAX_BODY_BYTES`] (also used by adapters that stop reading).
pub fn too_large() -> Response<String> {
    error(
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
        format!("the body is over {MAX_BODY_BYTES} bytes, the most accepted"),
    )
}

/// Checks the Content-Type (absent, or `application/json` with any parameters).
fn json_content_type(headers: &HeaderMap) -> Result<(), Box<Response<String>>> {
    if let Some(ct) = headers.get(http::header::CONTENT_TYPE) {
        let ct = ct.to_str().unwrap_or_default();
        // The media type, without parameters; media types are case-insensitive (RFC 9110).
        let media = ct.split(';').next().unwrap_or_default().trim();
        if !media.eq_ignore_ascii_case("application/json") {
            return Err(Box::new(error(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                format!("Content-Type must be application/json, not {ct:?}"),
            )));
        }
    }
    Ok(())
}

/// The answer to a definition or service that cannot be read.
fn catalog_error(e: CatalogError) -> Response<String> {
    match e {
        CatalogError::Store(e) => unavailable(e),
        CatalogError::Invalid(d) => respond(
            StatusCode::BAD_REQUEST,
            &json!({"error": {"code": "invalid_definition", "message": d.to_string(), "problems": d.0}}),
        ),
    }
}

async fn submit(
    deps: &SubmissionDeps,
    caller: &Caller,
    name: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Response<String> {
    if body.len() > MAX_INPUT_BYTES {
        return error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "input_too_large",
            format!(
                "the task input is {} bytes; at most {MAX_INPUT_BYTES} are accepted",
                body.len()
            ),
        );
    }
    if let Err(answer) = json_content_type(headers) {
        return *answer;
    }
    let Ok(key) = idempotency_key(headers) else {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_idempotency_key",
            format!("Idempotency-Key must be 1 to {MAX_KEY_LEN} visible ASCII characters"),
        );
    };
    let reply_queue_url = match headers.get(REPLY_QUEUE_URL) {
        None => None,
        Some(v) => match v
            .to_str()
            .map_err(|_| "Reply-Queue-Url: must be visible ASCII".to_owned())
            .and_then(|u| deps.reply_queues.check(u).map_err(|e| e.to_string()))
        {
            Ok(u) => Some(u),
            Err(why) => {
                return error(StatusCode::BAD_REQUEST, "invalid_reply_queue_url", why);
            }
        },
    };
    let input: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_json",
                format!("the body is not JSON: {e}"),
            );
        }
    };
    let workflow = match deps.definitions.latest(name).await {
        Ok(Some(w)) => w,
        Ok(None) => {
            return error(
                StatusCode::NOT_FOUND,
                "workflow_not_found",
                format!("no workflow {name:?} is published"),
            );
        }
        Err(e) => return catalog_error(e),
    };
    if let Err(e) = workflow.check_input(&input) {
        return input_problems(&workflow, e);
    }
    let now = deps.clock.now();
    let id = TaskId::new_random();
    tracing::Span::current().record("task_id", tracing::field::display(id));
    let task = Task {
        id,
        workflow: workflow.name.clone(),
        workflow_version: workflow.version,
        input,
        input_revision: 0,
        earlier_inputs: vec![],
        reply_queue_url,
        created_at: crate::domain::state::to_millis(now),
        caller: caller.clone(),
    };
    let record = StateRecord::new(
        id,
        &workflow,
        task.reply_queue_url.clone(),
        now,
        now + workflow.policies().at(0).pickup_timeout,
    );
    // Keys are the caller's own: the same key from two callers names two tasks, and one
    // caller can neither block nor discover another's.
    let key = key.map(|key| IdempotencyRecord {
        key: format!("{}#{key}", caller.digest()),
        request_hash: request_hash(&task),
        task_id: id,
        created_at: task.created_at,
    });
    match deps.store.create(&task, &record, key.as_ref()).await {
        Ok(CreateOutcome::Created) => {
            deps.metrics
                .count("TasksAccepted", &[("Workflow", task.workflow.as_str())]);
        }
        Ok(CreateOutcome::KeyExists(first)) => return replay(deps, key.as_ref(), first).await,
        Err(e) => {
            error!(error = %e, "could not store the task");
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                "store_unavailable",
                "the task could not be stored; retry with the same Idempotency-Key",
            );
        }
    }
    // Crash point: the task is stored but not yet enqueued. Its pickup deadline is in the due
    // index, so the supervisor re-enqueues it if this send never happens.
    match workflow.policies().at(0).progress(Status::Received) {
        Effect::Publish(status) => {
            publish_status(deps.queue.as_ref(), deps.events.as_ref(), &record, status).await
        }
        _ => progress_status(deps.queue.as_ref(), &record, Status::Received).await,
    }
    let work = SchedulerMessage::Work(WorkMessage::new(id));
    match serde_json::to_string(&work) {
        Ok(body) => {
            if let Err(e) = deps
                .queue
                .send(&deps.work_queue_url, &body, Duration::ZERO)
                .await
            {
                error!(error = %e, "task stored but not enqueued; the supervisor will pick it up");
            }
        }
        Err(e) => error!(error = %e, "work message does not serialize"),
    }
    info!(version = workflow.version, "task accepted");
    respond(
        StatusCode::ACCEPTED,
        &json!({"taskId": id, "workflow": workflow.name, "workflowVersion": workflow.version, "processState": record.process_state}),
    )
}

async fn replay(
    deps: &SubmissionDeps,
    key: Option<&IdempotencyRecord>,
    first: IdempotencyRecord,
) -> Response<String> {
    if key.map(|k| &k.request_hash) != Some(&first.request_hash) {
        return error(
            StatusCode::CONFLICT,
            "idempotency_key_reused",
            "this Idempotency-Key was used with a different request body",
        );
    }
    let state = match deps.store.get_state(first.task_id).await {
        Ok(Some(r)) => r,
        Ok(None) => {
            error!(task_id = %first.task_id, "idempotency key points to a missing task");
            return error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "inconsistent store",
            );
        }
        Err(e) => {
            error!(error = %e, "could not read the task");
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                "store_unavailable",
                "retry later",
            );
        }
    };
    info!(task_id = %first.task_id, "idempotent replay");
    let mut r = respond(
        StatusCode::ACCEPTED,
        &json!({"taskId": first.task_id, "workflow": state.workflow, "workflowVersion": state.workflow_version, "processState": state.process_state}),
    );
    r.headers_mut().insert(
        "idempotent-replayed",
        http::HeaderValue::from_static("true"),
    );
    r
}

/// Parses a body that must be one JSON object of shape `T`: `invalid_json` if it is not JSON at
/// all, `invalid_request` if it is JSON of another shape (an array is not an object, although
/// serde would build a struct from one by position).
fn json_object<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, Box<Response<String>>> {
    // A full parse checks the syntax (and the UTF-8 of every string) before the shape, so a
    // body that is not JSON is named as such even when its shape is wrong early on.
    if let Err(e) = serde_json::from_slice::<serde_json::Value>(body) {
        return Err(Box::new(error(
            StatusCode::BAD_REQUEST,
            "invalid_json",
            format!("the body is not JSON: {e}"),
        )));
    }
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(Box::new(error(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "the body must be a JSON object",
        )));
    }
    serde_json::from_slice(body).map_err(|e| {
        Box::new(error(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            e.to_string(),
        ))
    })
}

/// SHA-256 of the request in canonical form (workflow, input, reply queue): two bodies that
/// differ only in whitespace or key order are the same request.
fn request_hash(task: &Task) -> String {
    let request = json!({"workflow": task.workflow, "input": task.input, "replyQueueUrl": task.reply_queue_url});
    hex::encode(Sha256::digest(canonical(&request)))
}

/// Reads a task for `caller`: the operator API reads any; the task API only the caller's own.
/// Another caller's task answers exactly as a task that does not exist.
async fn load_for(
    deps: &SubmissionDeps,
    caller: &Caller,
    id: &str,
) -> Result<(Task, StateRecord), Box<Response<String>>> {
    let id: TaskId = id.parse().map_err(|e: crate::domain::ValidationError| {
        Box::new(error(
            StatusCode::BAD_REQUEST,
            "invalid_task_id",
            e.to_string(),
        ))
    })?;
    match deps.store.get(id).await {
        Ok(Some((task, record))) if deps.operator_api || &task.caller == caller => {
            Ok((task, record))
        }
        Ok(_) => Err(Box::new(error(
            StatusCode::NOT_FOUND,
            "task_not_found",
            format!("no task {id}"),
        ))),
        Err(e) => Err(Box::new(unavailable(e))),
    }
}

async fn get_task(deps: &SubmissionDeps, caller: &Caller, id: &str) -> Response<String> {
    let (task, record) = match load_for(deps, caller, id).await {
        Ok(found) => found,
        Err(answer) => return *answer,
    };
    let workflow = crate::handlers::workflow_of(&deps.definitions, &record).await;
    if deps.operator_api {
        // An operator sees the task even when its workflow cannot be read (without the steps'
        // inputs then): that is when they need it most.
        let workflow = workflow.as_deref().ok();
        return respond(StatusCode::OK, &task_view(&task, &record, workflow));
    }
    let public_errors = match workflow {
        Ok(w) => w.doc.public_errors,
        Err(e) => return unavailable(e),
    };
    respond(StatusCode::OK, &caller_view(&task, &record, public_errors))
}

pub(crate) fn unavailable(e: impl std::fmt::Display) -> Response<String> {
    error!(error = %e, "the store is unavailable");
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        "store_unavailable",
        "retry later",
    )
}

/// `GET /tasks?state=Error&workflow=loan-application&limit=50&cursor=...`
async fn list(deps: &SubmissionDeps, query: &str) -> Response<String> {
    let (mut state, mut limit, mut cursor, mut workflow) = (None, 50usize, None, None);
    for (k, v) in url::form_urlencoded::parse(query.as_bytes()) {
        match k.as_ref() {
            "workflow" => workflow = Some(v.into_owned()),
            "state" => match v.parse::<ProcessState>() {
                Ok(s) => state = Some(s),
                Err(e) => return error(StatusCode::BAD_REQUEST, "invalid_state", e),
            },
            "limit" => match v.parse::<usize>() {
                Ok(n) if (1..=MAX_PAGE).contains(&n) => limit = n,
                _ => {
                    return error(
                        StatusCode::BAD_REQUEST,
                        "invalid_limit",
                        format!("limit must be 1 to {MAX_PAGE}"),
                    );
                }
            },
            "cursor" => match Cursor::decode(&v) {
                Some(c) => cursor = Some(c),
                None => {
                    return error(
                        StatusCode::BAD_REQUEST,
                        "invalid_cursor",
                        "cursor is not one this API returned",
                    );
                }
            },
            other => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "unknown_parameter",
                    format!("unknown query parameter {other:?} (state, workflow, limit, cursor)"),
                );
            }
        }
    }
    let Some(state) = state else {
        let names: Vec<_> = ProcessState::ALL.iter().map(|s| s.as_str()).collect();
        return error(
            StatusCode::BAD_REQUEST,
            "missing_state",
            format!("state is required: one of {}", names.join(", ")),
        );
    };
    match deps
        .store
        .list(state, workflow.as_deref(), limit, cursor.as_ref())
        .await
    {
        Ok(page) => respond(
            StatusCode::OK,
            &json!({"tasks": page.items, "nextCursor": page.next.map(|c| c.encode())}),
        ),
        Err(e) => unavailable(e),
    }
}

/// `GET /tasks?limit=20&cursor=...` on the task API: the caller's own tasks, newest first.
async fn list_mine(deps: &SubmissionDeps, caller: &Caller, query: &str) -> Response<String> {
    let (mut limit, mut cursor) = (50usize, None);
    for (k, v) in url::form_urlencoded::parse(query.as_bytes()) {
        match k.as_ref() {
            "limit" => match v.parse::<usize>() {
                Ok(n) if (1..=MAX_PAGE).contains(&n) => limit = n,
                _ => {
                    return error(
                        StatusCode::BAD_REQUEST,
                        "invalid_limit",
                        format!("limit must be 1 to {MAX_PAGE}"),
                    );
                }
            },
            "cursor" => match Cursor::decode(&v) {
                Some(c) => cursor = Some(c),
                None => {
                    return error(
                        StatusCode::BAD_REQUEST,
                        "invalid_cursor",
                        "cursor is not one this API returned",
                    );
                }
            },
            other => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "unknown_parameter",
                    format!("unknown query parameter {other:?} (limit, cursor)"),
                );
            }
        }
    }
    match deps
        .store
        .list_by_caller(caller, limit, cursor.as_ref())
        .await
    {
        Ok(page) => {
            let tasks: Vec<Value> = page
                .items
                .iter()
                .map(|t| {
                    json!({"taskId": t.task_id, "workflow": t.workflow, "processState": t.process_state,
                           "currentStep": t.step, "updatedAt": t.updated_at})
                })
                .collect();
            respond(
                StatusCode::OK,
                &json!({"tasks": tasks, "nextCursor": page.next.map(|c| c.encode())}),
            )
        }
        Err(e) => unavailable(e),
    }
}

/// The answer to a task input that does not match its workflow's schema: `400
/// validation_failed` with each problem at its JSON pointer.
fn input_problems(workflow: &crate::Workflow, e: workflow::InputError) -> Response<String> {
    respond(
        StatusCode::BAD_REQUEST,
        &json!({"error": {
            "code": "validation_failed",
            "message": format!("the input does not match {}'s input schema: {e}", workflow.name),
            "problems": e.0,
        }}),
    )
}

/// An action's optional JSON body (empty: the default), and its `reason` held to
/// [`MAX_REASON_CHARS`].
fn action_body<T: serde::de::DeserializeOwned + Default>(
    body: &[u8],
    reason: impl Fn(&T) -> Option<&String>,
) -> Result<T, Box<Response<String>>> {
    let parsed = if body.iter().all(u8::is_ascii_whitespace) {
        T::default()
    } else {
        json_object::<T>(body)?
    };
    if reason(&parsed).is_some_and(|r| r.chars().count() > MAX_REASON_CHARS) {
        return Err(Box::new(error(
            StatusCode::BAD_REQUEST,
            "validation_failed",
            format!("reason is over {MAX_REASON_CHARS} characters"),
        )));
    }
    Ok(parsed)
}

/// `POST /tasks/{id}/retry|compensate|cancel|resolve|skip`: one conditional write, then its
/// effects. A resolve or skip needs a reason; a skip may carry the step's `result`.
async fn operate(
    deps: &SubmissionDeps,
    caller: &Caller,
    id: &str,
    action: &str,
    body: &[u8],
    actor: impl FnOnce(Option<String>) -> Actor,
) -> Response<String> {
    if let Err(e) = id.parse::<TaskId>() {
        return error(StatusCode::BAD_REQUEST, "invalid_task_id", e.to_string());
    }
    #[derive(serde::Deserialize, Default)]
    #[serde(deny_unknown_fields)]
    struct ActionBody {
        reason: Option<String>,
    }
    #[derive(serde::Deserialize, Default)]
    #[serde(deny_unknown_fields)]
    struct SkipBody {
        reason: Option<String>,
        /// The step's result, supplied by hand.
        result: Option<Value>,
    }
    #[derive(serde::Deserialize, Default)]
    #[serde(deny_unknown_fields)]
    struct InputBody {
        reason: Option<String>,
        /// The task's new input.
        input: Option<Value>,
    }
    #[derive(serde::Deserialize, Default)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    struct FromBody {
        reason: Option<String>,
        /// The step compensation starts from.
        from_step: Option<String>,
    }
    // Each action reads its own fields: any other is an unknown field.
    let parsed = match action {
        "skip" => {
            action_body(body, |b: &SkipBody| b.reason.as_ref()).map(|b| (b.reason, b.result, None))
        }
        "retry-with-input" => action_body(body, |b: &InputBody| b.reason.as_ref())
            .map(|b| (b.reason, b.input.filter(|v| !v.is_null()), None)),
        "compensate-from" => action_body(body, |b: &FromBody| b.reason.as_ref())
            .map(|b| (b.reason, None, b.from_step)),
        _ => action_body(body, |b: &ActionBody| b.reason.as_ref()).map(|b| (b.reason, None, None)),
    };
    let (reason, payload, from_step) = match parsed {
        Ok(b) => b,
        Err(answer) => return *answer,
    };
    let (result, new_input) = if action == "skip" {
        (payload, None)
    } else {
        (None, payload)
    };
    if action == "retry-with-input" && new_input.is_none() {
        return error(
            StatusCode::BAD_REQUEST,
            "validation_failed",
            "input is required: the task's new input",
        );
    }
    if action == "compensate-from" && from_step.is_none() {
        return error(
            StatusCode::BAD_REQUEST,
            "validation_failed",
            "fromStep is required: the step compensation starts from",
        );
    }
    if matches!(action, "resolve" | "skip") && reason.as_deref().is_none_or(|r| r.trim().is_empty())
    {
        return error(
            StatusCode::BAD_REQUEST,
            "validation_failed",
            format!("reason is required to {action} a task: say how the step was settled"),
        );
    }
    let result = match (action, result) {
        ("skip", Some(Value::Null) | None) => None,
        ("skip", Some(v)) => {
            let text = v.to_string();
            if text.len() > crate::domain::task::MAX_RESULT_BYTES {
                return error(
                    StatusCode::BAD_REQUEST,
                    "validation_failed",
                    format!(
                        "result is {} bytes (at most {})",
                        text.len(),
                        crate::domain::task::MAX_RESULT_BYTES
                    ),
                );
            }
            Some(text)
        }
        _ => None,
    };
    let actor = actor(reason);
    let (task, record) = match load_for(deps, caller, id).await {
        Ok(found) => found,
        Err(answer) => return *answer,
    };
    tracing::Span::current().record("workflow", record.workflow.as_str());
    let workflow = match crate::handlers::workflow_of(&deps.definitions, &record).await {
        Ok(w) => w,
        Err(e) => return unavailable(e),
    };
    let policies = workflow.policies();
    let now = deps.clock.now();
    if let Some(input) = &new_input
        && let Err(e) = workflow.check_input(input)
    {
        return input_problems(&workflow, e);
    }
    let from = match from_step.as_deref() {
        None => None,
        Some(name) => match workflow.steps.iter().position(|s| s.name == name) {
            Some(i) => Some(i),
            None => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "validation_failed",
                    format!(
                        "fromStep {name:?} is not a step of {} v{}",
                        workflow.name, workflow.version
                    ),
                );
            }
        },
    };
    let t: Result<Transition, Rejection> = match action {
        "retry" => transition::retry(&record, &actor, now, &policies),
        "retry-with-input" => {
            transition::retry_with_input(&record, &actor, now, &policies, task.input_revision)
        }
        "compensate-from" => {
            transition::compensate_from(&record, &actor, now, &policies, from.unwrap_or_default())
        }
        "compensate" => transition::compensate(&record, &actor, now, &policies),
        "resolve" => transition::resolve(&record, &actor, now),
        "skip" => transition::skip(&record, &actor, now, &policies, result),
        _ => transition::cancel(&record, &actor, now, &policies),
    };
    let t = match t {
        Ok(t) => t,
        Err(why) => return conflict(&record, why.to_string()),
    };
    let task = match new_input {
        Some(input) => match task.with_new_input(input, &t.record) {
            Ok(changed) => Some(changed),
            Err(bytes) => {
                return conflict(
                    &record,
                    format!(
                        "too_many_inputs: the inputs this task's steps ran with would take {bytes} bytes (at most {}): resolve or compensate it instead",
                        crate::domain::task::MAX_EARLIER_INPUTS_BYTES
                    ),
                );
            }
        },
        None => None,
    }
    .ok_or(task);
    let written = match &task {
        // The input and the record in one transaction, the record under its condition.
        Ok(changed) => match deps
            .store
            .put_with_input(&t.record, &t.condition, changed)
            .await
        {
            Ok(()) => Ok(true),
            Err(crate::ports::StoreError::ConditionFailed) => Ok(false),
            Err(e) => Err(e),
        },
        Err(_) => write(deps.store.as_ref(), &t).await.map_err(|e| match e {
            crate::handlers::HandlerError::Store(e) => e,
            other => crate::ports::StoreError::Unavailable(other.to_string()),
        }),
    };
    match written {
        Ok(true) => {}
        Ok(false) => {
            return conflict(
                &record,
                "the task changed meanwhile (another operator, or the task moved on); read it and try again".into(),
            );
        }
        Err(e) => return unavailable(e),
    }
    let task = task.unwrap_or_else(|unchanged| unchanged);
    crate::handlers::count_outcome(&deps.metrics, record.process_state, &t);
    tracing::Span::current().record("attempt", t.record.attempt);
    info!(from = %record.process_state, to = %t.record.process_state, by = %actor.by, "action applied");
    let outlets = Outlets {
        store: deps.store.as_ref(),
        queue: deps.queue.as_ref(),
        events: deps.events.as_ref(),
        clock: deps.clock.as_ref(),
        work_queue_url: &deps.work_queue_url,
    };
    if let Err(e) = perform_no_step(&outlets, &t).await {
        // The write stands; the supervisor finishes what is owed (a lost work message is
        // re-enqueued at the pickup deadline, an undelivered notice at once).
        error!(error = %e, "operator action written, effects left to the supervisor");
    }
    if deps.operator_api {
        respond(
            StatusCode::ACCEPTED,
            &task_view(&task, &t.record, Some(&workflow)),
        )
    } else {
        respond(
            StatusCode::ACCEPTED,
            &json!({"taskId": task.id, "processState": t.record.process_state}),
        )
    }
}

fn conflict(record: &StateRecord, message: String) -> Response<String> {
    respond(
        StatusCode::CONFLICT,
        &json!({"error": {"code": "conflict", "message": message}, "processState": record.process_state}),
    )
}

/// What a task's caller sees: its input, states and results, the refusal if any, and (only if
/// its workflow has `publicErrors`) the last error and the history's reasons. Never the lock
/// holder, deadlines, attempts or counts: those are sas's, and the operator API shows them.
pub fn caller_view(task: &Task, r: &StateRecord, public_errors: bool) -> Value {
    let steps: Vec<Value> = r
        .steps
        .iter()
        .map(|st| {
            let mut v = json!({"name": st.name, "status": st.status});
            if let Some(result) = &st.result {
                v["result"] = serde_json::from_str(result).unwrap_or(Value::String(result.clone()));
            }
            v
        })
        .collect();
    let history: Vec<Value> = r
        .history
        .iter()
        .map(|h| {
            let mut v = json!({"at": h.at, "from": h.from, "to": h.to, "step": h.step});
            if public_errors {
                v["reason"] = Value::String(h.reason.clone());
            }
            v
        })
        .collect();
    let mut view = json!({
        "taskId": task.id,
        "workflow": task.workflow,
        "workflowVersion": task.workflow_version,
        "input": task.input,
        "inputRevision": task.input_revision,
        "earlierInputs": task.earlier_inputs,
        "replyQueueUrl": task.reply_queue_url,
        "processState": r.process_state,
        "currentStep": r.current_step(),
        "steps": steps,
        "refusal": r.refusal,
        "history": history,
        "createdAt": r.created_at,
        "updatedAt": r.updated_at,
        "since": r.since,
    });
    if public_errors {
        view["lastError"] = json!(r.last_error);
    }
    view
}

/// A rendered input as a view shows it: the body, or what stopped it.
fn shown(rendered: Result<Value, crate::domain::MappingError>) -> Value {
    rendered.unwrap_or_else(|e| json!({"error": e.to_string()}))
}

/// The operator's view of a task and its state record: everything (each step's result as
/// JSON). With its workflow, each step also names its service and action and shows the input
/// its request was (or would be) built from, and its undo's once compensation reached it:
/// rendered from the task's input and the results so far, as the scheduler does.
pub fn task_view(task: &Task, r: &StateRecord, workflow: Option<&crate::Workflow>) -> Value {
    let steps: Vec<Value> = r
        .steps
        .iter()
        .enumerate()
        .map(|(i, st)| {
            let mut v = serde_json::to_value(st).unwrap_or(Value::Null);
            if let Some(result) = &st.result {
                v["result"] = serde_json::from_str(result).unwrap_or(Value::String(result.clone()));
            }
            if let Some(step) = workflow.and_then(|w| w.step(i)) {
                // The input this step ran with (or will run with): the view shows what its
                // request and its undo's were built from.
                let context = crate::handlers::scheduler::mapping_context(task, r, i).unwrap_or(Value::Null);
                v["service"] = json!(step.service);
                v["action"] = json!(step.action);
                let reached = i <= r.step_index || st.status != StepStatus::Pending;
                if reached {
                    v["input"] = shown(
                        step.input
                            .render_lenient(&context, crate::domain::task::MAX_REQUEST_BYTES),
                    );
                }
                if let (Some(undo), Some(_)) = (&step.undo, st.undo) {
                    v["undoAction"] = json!(undo.action);
                    v["undoInput"] = shown(
                        undo.input
                            .render_lenient(&context, crate::domain::task::MAX_REQUEST_BYTES),
                    );
                }
            }
            v
        })
        .collect();
    json!({
        "taskId": task.id,
        "workflow": task.workflow,
        "workflowVersion": task.workflow_version,
        "caller": task.caller,
        "input": task.input,
        "inputRevision": task.input_revision,
        "earlierInputs": task.earlier_inputs,
        "replyQueueUrl": task.reply_queue_url,
        "processState": r.process_state,
        "lockedBy": r.locked_by,
        "completeBy": r.complete_by,
        "failureCount": r.failure_count,
        "attempt": r.attempt,
        "currentStep": r.current_step(),
        "round": r.round,
        "steps": steps,
        "lastError": r.last_error,
        "history": r.history,
        "createdAt": r.created_at,
        "updatedAt": r.updated_at,
        "since": r.since,
    })
}

/// Counts stop here (`capped`): a count reads the state index.
pub const MAX_COUNT: u64 = 1000;

/// `GET /counts?workflow=...`: how many tasks are in each state (of a workflow, or of all),
/// each exact up to [`MAX_COUNT`].
async fn counts(deps: &SubmissionDeps, query: &str) -> Response<String> {
    let mut workflow = None;
    for (k, v) in url::form_urlencoded::parse(query.as_bytes()) {
        match k.as_ref() {
            "workflow" if !v.is_empty() => workflow = Some(v.into_owned()),
            "workflow" => {}
            other => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "unknown_parameter",
                    format!("unknown query parameter {other:?} (workflow)"),
                );
            }
        }
    }
    let counted = futures::future::join_all(
        ProcessState::ALL
            .iter()
            .map(|s| deps.store.count(*s, workflow.as_deref(), MAX_COUNT)),
    )
    .await;
    let mut counts = serde_json::Map::new();
    for (state, c) in ProcessState::ALL.iter().zip(counted) {
        match c {
            Ok(c) => {
                counts.insert(state.as_str().to_owned(), json!(c));
            }
            Err(e) => return unavailable(e),
        }
    }
    respond(
        StatusCode::OK,
        &json!({"workflow": workflow, "counts": counts, "cap": MAX_COUNT}),
    )
}

/// `GET /services`: every service, its newest version and its circuit breaker (`closed` with
/// its count of consecutive faults, `open` until when, `half-open` with its probes left).
async fn services(deps: &SubmissionDeps) -> Response<String> {
    let entries = match deps.definitions.catalog().entries(Kind::Service).await {
        Ok(entries) => entries,
        Err(e) => return unavailable(e),
    };
    let breakers =
        futures::future::join_all(entries.iter().map(|e| deps.store.get_breaker(&e.name))).await;
    let mut services = Vec::with_capacity(entries.len());
    for (entry, breaker) in entries.iter().zip(breakers) {
        let breaker = match breaker {
            Ok(b) => breaker_view(b.as_ref()),
            Err(e) => return unavailable(e),
        };
        services.push(json!({"name": entry.name, "latest": entry.latest, "breaker": breaker}));
    }
    respond(StatusCode::OK, &json!({ "services": services }))
}

/// A breaker as the API shows it: `closed` with its count of consecutive faults, `open` until
/// when, `half-open` with its probes left, `paused` since when, by whom and why.
fn breaker_view(b: Option<&crate::domain::BreakerRecord>) -> Value {
    use crate::domain::BreakerState as B;
    match b.map(|b| (b.state, b.note.as_deref())) {
        None => json!({"state": "closed", "failures": 0}),
        Some((B::Closed { failures }, _)) => json!({"state": "closed", "failures": failures}),
        Some((B::Open { until }, _)) => json!({"state": "open", "until": until}),
        Some((B::HalfOpen { probes_left, until }, _)) => {
            json!({"state": "half-open", "probesLeft": probes_left, "until": until})
        }
        Some((B::Paused { since }, note)) => {
            json!({"state": "paused", "since": since, "note": note})
        }
    }
}

/// `POST /services/{name}/pause|resume`: an operator stops every call to a service (its steps
/// wait, deferred, and nothing fails) or lets them go again. A conditional write of the
/// service's breaker, retried on a lost race with an agent's move of it.
async fn pause_or_resume(
    deps: &SubmissionDeps,
    caller: &Caller,
    name: &str,
    action: &str,
    body: &[u8],
) -> Response<String> {
    #[derive(serde::Deserialize, Default)]
    #[serde(deny_unknown_fields)]
    struct PauseBody {
        reason: Option<String>,
    }
    let reason = match action_body(body, |b: &PauseBody| b.reason.as_ref()) {
        Ok(b) => b.reason.filter(|r| !r.trim().is_empty()),
        Err(answer) => return *answer,
    };
    let pausing = action == "pause";
    let Some(reason) = reason.or_else(|| (!pausing).then(String::new)) else {
        return error(
            StatusCode::BAD_REQUEST,
            "validation_failed",
            "reason is required to pause a service: say why its steps wait",
        );
    };
    match deps.definitions.services().await {
        Ok(services) if services.contains_key(name) => {}
        Ok(_) => {
            return error(
                StatusCode::NOT_FOUND,
                "service_not_found",
                format!("no service {name:?} is published"),
            );
        }
        Err(e) => return catalog_error(e),
    }
    for _ in 0..5 {
        let current = match deps.store.get_breaker(name).await {
            Ok(b) => b.unwrap_or_else(|| crate::domain::BreakerRecord::closed(name)),
            Err(e) => return unavailable(e),
        };
        let next = if pausing {
            current.pause(deps.clock.now(), format!("{caller}: {reason}"))
        } else {
            current.resume()
        };
        let Some(next) = next else {
            return respond(
                StatusCode::OK,
                &json!({"name": name, "breaker": breaker_view(Some(&current)), "changed": false}),
            );
        };
        // Condition (in put_breaker): the version read - keeps "a pause or resume starts from
        // the breaker as it is": an agent's move in between makes this read again.
        match deps.store.put_breaker(&next).await {
            Ok(true) => {
                info!(service = %name, action, by = %caller, %reason, "service {action}d");
                return respond(
                    StatusCode::OK,
                    &json!({"name": name, "breaker": breaker_view(Some(&next)), "changed": true}),
                );
            }
            Ok(false) => continue,
            Err(e) => return unavailable(e),
        }
    }
    error(
        StatusCode::CONFLICT,
        "conflict",
        "the service's breaker kept moving; try again",
    )
}

/// `GET /workflows`, `GET /services`: every name and its newest version.
async fn entries(deps: &SubmissionDeps, kind: Kind) -> Response<String> {
    match deps.definitions.catalog().entries(kind).await {
        Ok(entries) => {
            let key = match kind {
                Kind::Workflow => "workflows",
                Kind::Service => "services",
            };
            respond(StatusCode::OK, &json!({ key: entries }))
        }
        Err(e) => unavailable(e),
    }
}

/// `GET /workflows/{name}[/versions/{v}]`, `GET /services/{name}`.
async fn definition(
    deps: &SubmissionDeps,
    kind: Kind,
    name: &str,
    version: Option<u32>,
) -> Response<String> {
    match deps
        .definitions
        .catalog()
        .definition(kind, name, version)
        .await
    {
        Ok(Some(d)) => respond(
            StatusCode::OK,
            &json!({"name": d.name, "version": d.version, "publishedAt": d.published_at, "definition": d.body}),
        ),
        Ok(None) => error(
            StatusCode::NOT_FOUND,
            match kind {
                Kind::Workflow => "workflow_not_found",
                Kind::Service => "service_not_found",
            },
            match version {
                Some(v) => format!("no version {v} of {name:?}"),
                None => format!("nothing published as {name:?}"),
            },
        ),
        Err(e) => unavailable(e),
    }
}

fn json_body(headers: &HeaderMap, body: &[u8]) -> Result<Value, Box<Response<String>>> {
    json_content_type(headers)?;
    serde_json::from_slice(body).map_err(|e| {
        Box::new(error(
            StatusCode::BAD_REQUEST,
            "invalid_json",
            format!("the body is not JSON: {e}"),
        ))
    })
}

/// A definition's body: JSON, and (if it names itself) named as the path says.
fn definition_body(
    path_name: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Value, Box<Response<String>>> {
    if body.len() > MAX_DEFINITION_BYTES {
        return Err(Box::new(error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "definition_too_large",
            format!(
                "the definition is {} bytes; at most {MAX_DEFINITION_BYTES} are accepted",
                body.len()
            ),
        )));
    }
    let value = json_body(headers, body)?;
    let named = value.get("name").and_then(Value::as_str);
    if named.is_some() && named != Some(path_name) {
        return Err(Box::new(error(
            StatusCode::BAD_REQUEST,
            "name_mismatch",
            format!("the path names {path_name:?} but the definition's name is {named:?}"),
        )));
    }
    Ok(value)
}

fn published(name: &str, p: crate::ports::Published) -> Response<String> {
    respond(
        if p.created {
            StatusCode::CREATED
        } else {
            StatusCode::OK
        },
        &json!({"name": name, "version": p.version, "created": p.created}),
    )
}

/// `PUT /workflows/{name}`: publishes a new version (201), or answers the newest one if the
/// definition is the same (200). A running task stays on the version it started with.
async fn publish_workflow(
    deps: &SubmissionDeps,
    name: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Response<String> {
    let value = match definition_body(name, headers, body) {
        Ok(v) => v,
        Err(answer) => return *answer,
    };
    match deps.definitions.publish_workflow(value).await {
        Ok((p, w)) => {
            info!(
                version = p.version,
                created = p.created,
                "workflow published"
            );
            published(&w.name, p)
        }
        Err(e) => catalog_error(e),
    }
}

/// `PUT /services/{name}`: publishes a service (201), or answers its newest version if the
/// definition is the same (200).
async fn publish_service(
    deps: &SubmissionDeps,
    name: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Response<String> {
    let value = match definition_body(name, headers, body) {
        Ok(v) => v,
        Err(answer) => return *answer,
    };
    // The problems are at /services/0/...: point them at the body.
    let in_body = |e: workflow::DefinitionError| {
        let problems: Vec<_> =
            e.0.into_iter()
                .map(|p| workflow::Problem {
                    at: p.at.trim_start_matches("/services/0").to_owned(),
                    message: p.message,
                })
                .collect();
        catalog_error(CatalogError::Invalid(workflow::DefinitionError(problems)))
    };
    let doc = match workflow::parse_services(json!({ "services": [value] })) {
        Ok(doc) => doc,
        Err(e) => return in_body(e),
    };
    let Some(service): Option<&ServiceDef> = doc.services.first() else {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_definition",
            "no service given",
        );
    };
    match deps.definitions.publish_services(&doc).await {
        Ok(mut out) => match out.pop() {
            Some((_, p)) => {
                info!(
                    version = p.version,
                    created = p.created,
                    "service published"
                );
                published(&service.name, p)
            }
            None => error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "nothing published",
            ),
        },
        Err(CatalogError::Invalid(e)) => in_body(e),
        Err(e) => catalog_error(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::workflow::examples;

    #[test]
    fn a_caller_sees_errors_only_if_the_workflow_makes_them_public() {
        let w = examples::ecommerce_order(&crate::Policy::default());
        let now = crate::domain::state::to_millis(chrono::Utc::now());
        let id = TaskId::new_random();
        let task = Task {
            id,
            workflow: w.name.clone(),
            workflow_version: w.version,
            input: json!({"customerId": "c"}),
            input_revision: 0,
            earlier_inputs: vec![],
            reply_queue_url: None,
            created_at: now,
            caller: Caller::new("alice").expect("caller"),
        };
        let mut r = StateRecord::new(id, &w, None, now, now);
        r.last_error = Some("payment: HTTP 500 from https://internal.example/charge".into());
        r.locked_by = Some("scheduler-1".into());
        let private = caller_view(&task, &r, false);
        for hidden in [
            "lastError",
            "lockedBy",
            "attempt",
            "failureCount",
            "completeBy",
            "caller",
        ] {
            assert!(private.get(hidden).is_none(), "{hidden}: {private}");
        }
        assert!(private["history"][0].get("reason").is_none(), "{private}");
        assert!(
            !private.to_string().contains("internal.example"),
            "{private}"
        );
        let public = caller_view(&task, &r, true);
        assert_eq!(public["lastError"], json!(r.last_error), "{public}");
        assert_eq!(public["history"][0]["reason"], "received", "{public}");
        assert!(public.get("lockedBy").is_none(), "{public}");
        // The operator sees everything.
        let ops = task_view(&task, &r, None);
        assert_eq!(ops["lockedBy"], "scheduler-1");
        assert_eq!(ops["caller"], "alice");
    }
}
