//! The task API's own routes: `POST /workflows/{name}/tasks` starts a task of the newest
//! version of a workflow (idempotently per caller), `GET /tasks` lists the caller's tasks, `GET
//! /tasks/{taskId}` reports one (the caller's view on the task API, everything on the operator
//! API), `GET /tasks/{taskId}/steps/{step}/result` reads one step's result whole. A caller sees
//! only its own tasks (another's answers 404). The cancel is an action:
//! [`super::operator::act`].

use super::deps::ApiDeps;
use super::error::{Answer, ApiError, respond};
use super::request::{PageQuery, SearchQuery, json_content_type};
use super::views::{Accepted, CallerTaskSummary, CallerTaskView, ListPage, TaskView};
use crate::domain::task::MAX_INPUT_BYTES;
use crate::domain::workflow;
use crate::domain::{Caller, StateRecord, Task, TaskId};
use crate::handlers::start::{StartError, StartRequest, start};
use crate::ports::{KeyQuery, Paging};
use http::{HeaderMap, StatusCode};
use serde_json::Value;

/// The idempotency header.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// The header naming a queue for the task's status messages.
pub const REPLY_QUEUE_URL: &str = "reply-queue-url";
/// Longest accepted idempotency key.
pub const MAX_KEY_LEN: usize = 255;

fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(v) = headers.get(IDEMPOTENCY_KEY) else {
        return Ok(None);
    };
    let invalid = ApiError::InvalidIdempotencyKey {
        max_len: MAX_KEY_LEN,
    };
    let s = v.to_str().map_err(|_| invalid.clone())?;
    if s.is_empty() || s.len() > MAX_KEY_LEN || !s.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(invalid);
    }
    Ok(Some(s.to_owned()))
}

/// The answer to a task input that does not match its workflow's schema: `400
/// validation_failed` with each problem at its JSON pointer.
pub(super) fn input_problems(workflow: &crate::Workflow, e: workflow::InputError) -> ApiError {
    ApiError::ValidationFailed {
        message: format!(
            "the input does not match {}'s input schema: {e}",
            workflow.name
        ),
        problems: Some(e.0),
    }
}

/// `POST /workflows/{name}/tasks`.
pub(super) async fn submit(
    deps: &ApiDeps,
    caller: &Caller,
    name: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Answer {
    if body.len() > MAX_INPUT_BYTES {
        return Err(ApiError::InputTooLarge {
            bytes: body.len(),
            limit: MAX_INPUT_BYTES,
        });
    }
    json_content_type(headers)?;
    let key = idempotency_key(headers)?;
    let reply_queue_url = match headers.get(REPLY_QUEUE_URL) {
        None => None,
        Some(v) => Some(
            v.to_str()
                .map_err(|_| "Reply-Queue-Url: must be visible ASCII".to_owned())
                .and_then(|u| deps.reply_queues.check(u).map_err(|e| e.to_string()))
                .map_err(ApiError::InvalidReplyQueueUrl)?,
        ),
    };
    let now = deps.ports.clock.now();
    let start_at = start_at(headers, now)?;
    let priority = priority(headers)?;
    let input: Value =
        serde_json::from_slice(body).map_err(|e| ApiError::InvalidJson(e.to_string()))?;
    let request = StartRequest {
        caller,
        workflow: name,
        input,
        key,
        reply_queue_url,
        start_at,
        turn: None,
        child: None,
        priority,
        dispatch: deps
            .dispatch
            .as_deref()
            .map(|d| d as &dyn crate::handlers::start::Dispatch),
    };
    let started = match start(&deps.ports, request).await {
        Ok(started) => started,
        Err(StartError::WorkflowNotFound(name)) => {
            return Err(ApiError::WorkflowNotFound(format!(
                "no workflow {name:?} is published"
            )));
        }
        Err(StartError::Input { workflow, error }) => {
            return Err(input_problems(&workflow, error));
        }
        Err(StartError::KeyReused) => return Err(ApiError::IdempotencyKeyReused),
        Err(StartError::Store(_)) => {
            return Err(ApiError::StoreUnavailable(
                "the task could not be stored; retry with the same Idempotency-Key",
            ));
        }
        Err(StartError::Inconsistent) => return Err(ApiError::Internal("inconsistent store")),
        // Only a schedule's run takes a turn.
        Err(StartError::TurnTaken) => return Err(ApiError::Internal("a submission took a turn")),
        Err(StartError::Catalog(e)) => return Err(e.into()),
    };
    let mut r = respond(
        StatusCode::ACCEPTED,
        &Accepted {
            task_id: started.task_id.to_string(),
            workflow: started.workflow,
            workflow_version: started.workflow_version,
            process_state: started.process_state,
        },
    );
    if started.replayed {
        r.headers_mut().insert(
            "idempotent-replayed",
            http::HeaderValue::from_static("true"),
        );
    }
    Ok(r)
}

/// The header of a delayed start.
pub const START_AT: &str = "start-at";
/// How far ahead a task may start.
pub const MAX_START_DELAY_DAYS: i64 = 366;

/// A delayed start (`Start-At`: an RFC 3339 time, at most [`MAX_START_DELAY_DAYS`] ahead; a
/// time passed starts now).
fn start_at(
    headers: &HeaderMap,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<Option<chrono::DateTime<chrono::Utc>>, ApiError> {
    let Some(v) = headers.get(START_AT) else {
        return Ok(None);
    };
    let t = v
        .to_str()
        .ok()
        .and_then(|s| chrono::DateTime::parse_from_rfc3339(s).ok())
        .ok_or_else(|| ApiError::InvalidRequest("Start-At: an RFC 3339 time".into()))?
        .with_timezone(&chrono::Utc);
    if t > now + chrono::Duration::days(MAX_START_DELAY_DAYS) {
        return Err(ApiError::InvalidRequest(format!(
            "Start-At: at most {MAX_START_DELAY_DAYS} days ahead"
        )));
    }
    Ok((t > now).then_some(t))
}

/// The header of a task's priority.
pub const PRIORITY: &str = "priority";

/// The task's priority (`Priority: urgent`; absent: `normal`): the lane its messages take.
fn priority(headers: &HeaderMap) -> Result<crate::domain::Priority, ApiError> {
    let Some(v) = headers.get(PRIORITY) else {
        return Ok(crate::domain::Priority::Normal);
    };
    v.to_str()
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .ok_or_else(|| ApiError::InvalidRequest("Priority: give `normal` or `urgent`".into()))
}

/// Reads a task for `caller`: the operator API reads any; the task API only the caller's own.
/// Another caller's task answers exactly as a task that does not exist.
pub(super) async fn load_for(
    deps: &ApiDeps,
    caller: &Caller,
    id: &str,
) -> Result<(Task, StateRecord), ApiError> {
    let id: TaskId = id
        .parse()
        .map_err(|e: crate::domain::ValidationError| ApiError::InvalidTaskId(e.to_string()))?;
    match deps.ports.store.get(id).await {
        Ok(Some((task, record))) if deps.operator_api || &task.caller == caller => {
            Ok((task, record))
        }
        Ok(_) => Err(ApiError::TaskNotFound(id)),
        Err(e) => Err(ApiError::unavailable(e)),
    }
}

/// `GET /tasks/{taskId}`: the caller's view, or on the operator API everything (a
/// distributed forEach's run listing its elements from `elements_from`, 0 unless given).
pub(super) async fn get_task(deps: &ApiDeps, caller: &Caller, id: &str, query: &str) -> Answer {
    let from = if deps.operator_api {
        elements_from(query)?
    } else {
        None
    };
    let (task, record) = load_for(deps, caller, id).await?;
    let workflow = crate::handlers::workflow_of(&deps.ports.definitions, &record).await;
    if deps.operator_api {
        // An operator sees the task even when its workflow cannot be read (without the steps'
        // inputs then): that is when they need it most.
        let workflow = workflow.as_deref().ok();
        let mut view = linked(deps, TaskView::of(&task, &record, workflow), &record, from).await;
        // A task waiting at its gate: who holds it, and its place in line.
        if let (Some(hold), Some(shown)) =
            (record.gate.as_ref().filter(|g| g.waits()), view.gate.take())
        {
            let place = crate::ports::GatePlace::of(hold, task.id, task.created_at);
            view.gate = Some(match deps.ports.store.gate_state(place).await {
                Ok(state) => shown.with_state(state),
                Err(e) => {
                    tracing::warn!(error = %e, "the gate not read; the view shows the task's place without it");
                    shown
                }
            });
        }
        return Ok(respond(StatusCode::OK, &view));
    }
    let workflow = workflow.map_err(ApiError::unavailable)?;
    Ok(respond(
        StatusCode::OK,
        &CallerTaskView::of(&task, &record, workflow.doc.public_errors)
            .with_children(&workflow, &record),
    ))
}

/// How long a read URL of a step's result lasts (S3's presigned GET): long enough to follow
/// the redirect and read gigabytes, short enough that a URL copied somewhere soon reads nothing.
pub const RESULT_URL_TTL: std::time::Duration = std::time::Duration::from_secs(300);

/// `GET /tasks/{taskId}/steps/{step}/result`: the step's result whole (the caller's own task;
/// everything on the operator API). A result kept by reference past what an answer carries (a
/// distributed forEach's JSON Lines, or a JSON result past [`VIEW_PAYLOADS_BYTES`]) is `303`
/// to a read URL of its object ([`RESULT_URL_TTL`]) where the store has one (S3), else its
/// bytes (`sas-local`); JSON Lines as `application/x-ndjson`. `404` `result_not_found` for a
/// step the task does not have, or one without a result yet.
///
/// [`VIEW_PAYLOADS_BYTES`]: super::views::VIEW_PAYLOADS_BYTES
pub(super) async fn step_result(deps: &ApiDeps, caller: &Caller, id: &str, step: &str) -> Answer {
    let (_, record) = load_for(deps, caller, id).await?;
    let Some(st) = record.steps.iter().find(|s| s.name == step) else {
        return Err(ApiError::ResultNotFound(format!(
            "task {} has no step {step:?}",
            record.task_id
        )));
    };
    let by_reference = st.result_ref.as_ref().filter(|r| {
        (r.lines.is_some() && st.result.is_none())
            || r.bytes > super::views::VIEW_PAYLOADS_BYTES as u64
    });
    if let Some(r) = by_reference {
        let payloads = deps.ports.payloads.as_ref();
        if let Some(url) = payloads
            .read_url(r, RESULT_URL_TTL)
            .await
            .map_err(ApiError::unavailable)?
        {
            // Not logged: the URL reads the object until it expires.
            let mut answer = respond(StatusCode::SEE_OTHER, &serde_json::json!({"url": url}));
            if let Ok(location) = http::HeaderValue::from_str(&url) {
                answer
                    .headers_mut()
                    .insert(http::header::LOCATION, location);
            }
            return Ok(answer);
        }
        let body = payloads.get(r).await.map_err(ApiError::unavailable)?;
        let text = String::from_utf8(body)
            .map_err(|_| ApiError::Internal("a kept result is not UTF-8"))?;
        let mut answer = http::Response::new(text);
        let kind = if r.lines.is_some() {
            "application/x-ndjson"
        } else {
            "application/json"
        };
        answer.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static(kind),
        );
        return Ok(answer);
    }
    match super::views::whole_result(st) {
        Some(v) => Ok(respond(StatusCode::OK, &v)),
        None => Err(ApiError::ResultNotFound(format!(
            "step {step:?} of task {} has no result yet",
            record.task_id
        ))),
    }
}

/// The operator's `elements_from` (where a run's page of elements starts), if given.
fn elements_from(query: &str) -> Result<Option<u32>, ApiError> {
    let Some((_, v)) =
        url::form_urlencoded::parse(query.as_bytes()).find(|(k, _)| k == "elements_from")
    else {
        return Ok(None);
    };
    v.parse::<u32>().map(Some).map_err(|_| {
        ApiError::InvalidRequest(format!(
            "elements_from: an element's index (a whole number from 0), not {v:?}"
        ))
    })
}

/// How many records the operator's view of a run reads at once (its page of elements).
const VIEW_READS_AT_ONCE: usize = 16;

/// The operator's view of `record` linked to the records beside it: its distributed forEach
/// steps' runs (their states and counts) and, for a run, its page of elements from `from` with
/// each opened element's state. At most one read per run and [`super::views::ELEMENTS_PAGE`]
/// per run's view, never the whole run. Best effort: a record not read is shown without its
/// state (the view is what the operator needs when the store struggles).
async fn linked(
    deps: &ApiDeps,
    view: TaskView,
    record: &StateRecord,
    from: Option<u32>,
) -> TaskView {
    let store = deps.ports.store.as_ref();
    let ids: Vec<TaskId> = view
        .steps
        .iter()
        .filter_map(|s| s.run.as_ref()?.task_id.parse().ok())
        .collect();
    let mut runs = Vec::with_capacity(ids.len());
    for id in ids {
        if let Some(r) = read_linked(store, id).await {
            runs.push((id, r));
        }
    }
    let mut view = view.with_runs(&runs);
    if let Some(from) = from {
        view.run = super::views::RunView::of(record, from);
    }
    if let Some(run) = &mut view.run {
        // The opened elements' records, a few at a time.
        let opened: Vec<(usize, TaskId)> = run
            .elements
            .iter()
            .enumerate()
            .filter(|(_, e)| e.mark.is_some())
            .map(|(k, e)| {
                (
                    k,
                    crate::handlers::runs::element_id(record.task_id, e.index),
                )
            })
            .collect();
        for chunk in opened.chunks(VIEW_READS_AT_ONCE) {
            let mut reads = Vec::with_capacity(chunk.len());
            for (_, id) in chunk {
                reads.push(read_linked(store, *id));
            }
            let read = futures::future::join_all(reads).await;
            for ((k, _), r) in chunk.iter().zip(read) {
                if let Some(e) = run.elements.get_mut(*k) {
                    e.process_state = r.flatten().map(|r| r.process_state.to_string());
                }
            }
        }
    }
    view
}

/// A record a view links to, as read (`None`: not read, logged).
async fn read_linked(
    store: &dyn crate::ports::StateStore,
    id: TaskId,
) -> Option<Option<StateRecord>> {
    match store.get_state(id).await {
        Ok(r) => Some(r),
        Err(e) => {
            tracing::warn!(task_id = %id, error = %e, "a linked record not read; the view shows it without its state");
            None
        }
    }
}

/// `GET /tasks?limit=20&cursor=...` on the task API: the caller's own tasks, newest first; with
/// `key=name:value` (and `from`, `to`), those of its own tasks found by that key.
pub(super) async fn list_mine(deps: &ApiDeps, caller: &Caller, query: &str) -> Answer {
    let mut page = PageQuery::default();
    let mut search = SearchQuery::default();
    for (k, v) in url::form_urlencoded::parse(query.as_bytes()) {
        if !page.read(&k, &v)? && !search.read(&k, &v)? {
            return Err(ApiError::UnknownParameter {
                name: k.into_owned(),
                known: "key, from, to, limit, cursor",
            });
        }
    }
    let paging = Paging {
        limit: page.limit,
        after: page.cursor.as_ref(),
    };
    let found = match search.key()? {
        Some(key) => {
            let q = KeyQuery {
                caller: Some(caller),
                from: search.from,
                to: search.to,
                ..KeyQuery::new(key)
            };
            deps.ports.store.list_by_key(q, paging).await
        }
        None => deps.ports.store.list_by_caller(caller, paging).await,
    }
    .map_err(ApiError::unavailable)?;
    let tasks = found
        .items
        .iter()
        .map(|t| CallerTaskSummary {
            task_id: t.task_id.to_string(),
            workflow: t.workflow.clone(),
            process_state: t.process_state,
            current_step: t.step.clone(),
            updated_at: t.updated_at,
        })
        .collect();
    Ok(respond(
        StatusCode::OK,
        &ListPage {
            tasks,
            next_cursor: found.next.map(|c| c.encode()),
        },
    ))
}
