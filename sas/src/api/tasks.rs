//! The task API's own routes: `POST /workflows/{name}/tasks` starts a task of the newest
//! version of a workflow (idempotently per caller), `GET /tasks` lists the caller's tasks, `GET
//! /tasks/{taskId}` reports one (the caller's view on the task API, everything on the operator
//! API). A caller sees only its own tasks (another's answers 404). The cancel is an action:
//! [`super::operator::act`].

use super::deps::ApiDeps;
use super::error::{Answer, ApiError, respond};
use super::request::{PageQuery, json_content_type};
use super::views::{Accepted, CallerTaskSummary, CallerTaskView, ListPage, TaskView};
use crate::domain::task::MAX_INPUT_BYTES;
use crate::domain::transition::Effect;
use crate::domain::workflow;
use crate::domain::{Caller, NoticeKind, StateRecord, Task, TaskId};
use crate::handlers::{progress_status, publish_status};
use crate::messages::{SchedulerMessage, WorkMessage};
use crate::ports::Paging;
use crate::ports::{CreateOutcome, IdempotencyRecord, NewTask, canonical};
use http::{HeaderMap, StatusCode};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use std::time::Duration;
use tracing::{error, info};

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
    let input: Value =
        serde_json::from_slice(body).map_err(|e| ApiError::InvalidJson(e.to_string()))?;
    let Some(workflow) = deps.ports.definitions.latest(name).await? else {
        return Err(ApiError::WorkflowNotFound(format!(
            "no workflow {name:?} is published"
        )));
    };
    workflow
        .check_input(&input)
        .map_err(|e| input_problems(&workflow, e))?;
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
    let mut record = StateRecord::new(
        id,
        &workflow,
        task.reply_queue_url.clone(),
        now,
        now + workflow.policies().at(0).pickup_timeout,
    );
    if let Some(start) = start_at {
        record = record.starting_at(start);
    }
    // Keys are the caller's own: the same key from two callers names two tasks, and one
    // caller can neither block nor discover another's.
    let key = key.map(|key| IdempotencyRecord {
        key: format!("{}#{key}", caller.digest()),
        request_hash: request_hash(&task, record.start_at),
        task_id: id,
        created_at: task.created_at,
    });
    let new = NewTask {
        task: &task,
        record: &record,
        key: key.as_ref(),
    };
    match deps.ports.store.create(new).await {
        Ok(CreateOutcome::Created) => {
            deps.ports
                .metrics
                .count("TasksAccepted", &[("Workflow", task.workflow.as_str())]);
        }
        Ok(CreateOutcome::KeyExists(first)) => return replay(deps, key.as_ref(), first).await,
        Err(e) => {
            error!(error = %e, "could not store the task");
            return Err(ApiError::StoreUnavailable(
                "the task could not be stored; retry with the same Idempotency-Key",
            ));
        }
    }
    // Crash point: the task is stored but not yet enqueued. Its pickup deadline is in the due
    // index, so the supervisor re-enqueues it if this send never happens.
    match workflow.policies().at(0).progress(NoticeKind::Received) {
        Effect::Publish(status) => {
            publish_status(
                deps.ports.queue.as_ref(),
                deps.ports.events.as_ref(),
                &record,
                status,
            )
            .await
        }
        _ => progress_status(deps.ports.queue.as_ref(), &record, NoticeKind::Received).await,
    }
    let work = SchedulerMessage::Work(WorkMessage::new(id));
    // A delayed start: its work message waits for it, if a message can wait that long; a later
    // one rides the due index (the supervisor enqueues it at its time).
    let delay = record
        .start_at
        .map(|s| (s - now).to_std().unwrap_or_default());
    match serde_json::to_string(&work) {
        Ok(_) if delay.is_some_and(|d| d > crate::handlers::MAX_SQS_DELAY) => {
            info!(start_at = ?record.start_at, "a delayed start: the supervisor enqueues it then");
        }
        Ok(body) => {
            if let Err(e) = deps
                .ports
                .queue
                .send(
                    &deps.ports.work_queue_url,
                    &body,
                    delay.unwrap_or(Duration::ZERO),
                )
                .await
            {
                error!(error = %e, "task stored but not enqueued; the supervisor will pick it up");
            }
        }
        Err(e) => error!(error = %e, "work message does not serialize"),
    }
    info!(version = workflow.version, "task accepted");
    Ok(respond(
        StatusCode::ACCEPTED,
        &Accepted {
            task_id: id.to_string(),
            workflow: workflow.name.clone(),
            workflow_version: workflow.version,
            process_state: record.process_state,
        },
    ))
}

/// The answer to a key used before: the first task, if the request is the same.
async fn replay(
    deps: &ApiDeps,
    key: Option<&IdempotencyRecord>,
    first: IdempotencyRecord,
) -> Answer {
    if key.map(|k| &k.request_hash) != Some(&first.request_hash) {
        return Err(ApiError::IdempotencyKeyReused);
    }
    let state = match deps.ports.store.get_state(first.task_id).await {
        Ok(Some(r)) => r,
        Ok(None) => {
            error!(task_id = %first.task_id, "idempotency key points to a missing task");
            return Err(ApiError::Internal("inconsistent store"));
        }
        Err(e) => {
            error!(error = %e, "could not read the task");
            return Err(ApiError::StoreUnavailable("retry later"));
        }
    };
    info!(task_id = %first.task_id, "idempotent replay");
    let mut r = respond(
        StatusCode::ACCEPTED,
        &Accepted {
            task_id: first.task_id.to_string(),
            workflow: state.workflow,
            workflow_version: state.workflow_version,
            process_state: state.process_state,
        },
    );
    r.headers_mut().insert(
        "idempotent-replayed",
        http::HeaderValue::from_static("true"),
    );
    Ok(r)
}

/// SHA-256 of the request in canonical form (workflow, input, reply queue, and a delayed
/// start's time if any): two bodies that differ only in whitespace or key order are the same
/// request.
fn request_hash(task: &Task, start_at: Option<chrono::DateTime<chrono::Utc>>) -> String {
    let mut request = json!({"workflow": task.workflow, "input": task.input, "replyQueueUrl": task.reply_queue_url});
    if let Some(s) = start_at {
        request["startAt"] = json!(s);
    }
    hex::encode(Sha256::digest(canonical(&request)))
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

/// `GET /tasks/{taskId}`: the caller's view, or on the operator API everything.
pub(super) async fn get_task(deps: &ApiDeps, caller: &Caller, id: &str) -> Answer {
    let (task, record) = load_for(deps, caller, id).await?;
    let workflow = crate::handlers::workflow_of(&deps.ports.definitions, &record).await;
    if deps.operator_api {
        // An operator sees the task even when its workflow cannot be read (without the steps'
        // inputs then): that is when they need it most.
        let workflow = workflow.as_deref().ok();
        return Ok(respond(
            StatusCode::OK,
            &TaskView::of(&task, &record, workflow),
        ));
    }
    let public_errors = workflow.map_err(ApiError::unavailable)?.doc.public_errors;
    Ok(respond(
        StatusCode::OK,
        &CallerTaskView::of(&task, &record, public_errors),
    ))
}

/// `GET /tasks?limit=20&cursor=...` on the task API: the caller's own tasks, newest first.
pub(super) async fn list_mine(deps: &ApiDeps, caller: &Caller, query: &str) -> Answer {
    let mut page = PageQuery::default();
    for (k, v) in url::form_urlencoded::parse(query.as_bytes()) {
        if !page.read(&k, &v)? {
            return Err(ApiError::UnknownParameter {
                name: k.into_owned(),
                known: "limit, cursor",
            });
        }
    }
    let found = deps
        .ports
        .store
        .list_by_caller(
            caller,
            Paging {
                limit: page.limit,
                after: page.cursor.as_ref(),
            },
        )
        .await
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
