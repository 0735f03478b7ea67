//! Named events: `POST /tasks/{taskId}/events/{name}` (the task's own caller, on the task API;
//! any task, on the operator API), the body the event's payload (JSON), an optional `Event-Id`
//! header making a repeat harmless. The wait the task (or a branch) is in for `name` ends with
//! it; an event for a wait still to come is kept for it (see
//! [`crate::domain::transition::deliver`]).
//!
//! Answers: `202` `{"taskId", "event", "kept"}` (kept: for a step not reached yet); `200` with
//! `"duplicate": true` for an `Event-Id` taken already; `404` `task_not_found`, or
//! `event_not_expected` when the workflow waits for no event of that name; `409`
//! `event_refused` when no step still to come waits for it (it passed, or the task ended) or
//! the task keeps as many early events as it may; `400` for a payload that is not JSON, over
//! 16 KiB or not what the step's `payload` schema wants.

use super::deps::ApiDeps;
use super::error::{Answer, ApiError, respond};
use crate::domain::Caller;
use crate::domain::inbox::{Delivery, MAX_PAYLOAD_BYTES};
use crate::domain::transition::{self, Rejection, TaskRouter};
use crate::domain::workflow::{Problem, Wait};
use crate::handlers::{count_outcome, perform_no_step, write};
use http::{HeaderMap, StatusCode};
use serde::Serialize;
use serde_json::Value;
use tracing::{error, info};

/// The header naming an event, so that a repeat of it changes nothing.
pub const EVENT_ID: &str = "event-id";
/// The longest event id.
pub const MAX_EVENT_ID_LEN: usize = 255;
/// How often a delivery that lost a race for its record is tried again.
const TRIES: usize = 4;

/// What a delivery answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EventTaken {
    pub task_id: String,
    pub event: String,
    /// Kept for a step the task has not reached yet.
    pub kept: bool,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub duplicate: bool,
}

fn event_id(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(v) = headers.get(EVENT_ID) else {
        return Ok(None);
    };
    let s = v
        .to_str()
        .ok()
        .filter(|s| {
            !s.is_empty() && s.len() <= MAX_EVENT_ID_LEN && s.bytes().all(|b| b.is_ascii_graphic())
        })
        .ok_or_else(|| {
            ApiError::InvalidRequest(format!(
                "Event-Id: 1 to {MAX_EVENT_ID_LEN} visible ASCII characters"
            ))
        })?;
    Ok(Some(s.to_owned()))
}

/// `POST /tasks/{id}/events/{name}`.
pub async fn deliver(
    deps: &ApiDeps,
    caller: &Caller,
    id: &str,
    name: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Answer {
    let event_id = event_id(headers)?;
    let payload: Value = if body.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(body).map_err(|e| ApiError::InvalidJson(e.to_string()))?
    };
    let text = payload.to_string();
    if text.len() > MAX_PAYLOAD_BYTES {
        return Err(ApiError::validation(format!(
            "the event's payload is {} bytes (at most {MAX_PAYLOAD_BYTES})",
            text.len()
        )));
    }
    let delivery = Delivery {
        name: name.to_owned(),
        id: event_id,
        payload: text,
    };
    for _ in 0..TRIES {
        let (task, record) = super::tasks::load_for(deps, caller, id).await?;
        let workflow = crate::handlers::workflow_of(&deps.ports.definitions, &record)
            .await
            .map_err(ApiError::unavailable)?;
        let Some((_, step)) = workflow.event_step(name) else {
            return Err(ApiError::EventNotExpected(format!(
                "workflow {} v{} waits for no event {name:?}",
                workflow.name, workflow.version
            )));
        };
        if let Some(Wait::Event {
            payload: Some(schema),
            ..
        }) = &step.wait
        {
            let problems: Vec<Problem> = schema
                .iter_errors(&payload)
                .map(|e| Problem {
                    at: e.instance_path().to_string(),
                    message: e.to_string(),
                })
                .collect();
            if !problems.is_empty() {
                return Err(ApiError::ValidationFailed {
                    message: format!(
                        "the payload of {name:?} does not match step {:?}'s payload schema",
                        step.name
                    ),
                    problems: Some(problems),
                });
            }
        }
        let router = TaskRouter {
            workflow: &workflow,
            task: &task,
        };
        let now = deps.ports.clock.now();
        let t = match transition::deliver(&record, &delivery, now, &workflow.policies(), &router) {
            Ok(t) => t,
            Err(Rejection::DuplicateEvent) => {
                info!(event = %name, "event repeated under its Event-Id: nothing changes");
                return Ok(respond(
                    StatusCode::OK,
                    &EventTaken {
                        task_id: task.id.to_string(),
                        event: name.to_owned(),
                        kept: false,
                        duplicate: true,
                    },
                ));
            }
            Err(why) => {
                return Err(ApiError::EventRefused {
                    message: why.to_string(),
                    process_state: record.process_state,
                });
            }
        };
        match write(deps.ports.store.as_ref(), &t).await {
            Ok(true) => {}
            // Another write came first (a reply, another event): read the task again.
            Ok(false) => continue,
            Err(e) => return Err(ApiError::unavailable(e)),
        }
        count_outcome(&deps.ports.metrics, record.process_state, &t);
        let kept = t.record.inbox.kept.len() > record.inbox.kept.len();
        info!(event = %name, kept, state = %t.record.process_state, "event taken");
        if let Err(e) = perform_no_step(&deps.ports.outlets(), &t).await {
            // The write stands: a lost work message is re-enqueued at the pickup deadline.
            error!(error = %e, "event written, effects left to the supervisor");
        }
        return Ok(respond(
            StatusCode::ACCEPTED,
            &EventTaken {
                task_id: task.id.to_string(),
                event: name.to_owned(),
                kept,
                duplicate: false,
            },
        ));
    }
    Err(ApiError::Conflict {
        message: "the task kept changing while the event was delivered: try again".into(),
        process_state: None,
    })
}
