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
//! 16 KiB, over what is left of the task's 128 KiB results budget (its results and kept
//! events), or not what the step's `payload` schema wants.

use super::deps::ApiDeps;
use super::error::{Answer, ApiError, respond};
use crate::domain::Caller;
use crate::handlers::events::{
    Delivered, EventDelivery, EventError, MAX_EVENT_ID_LEN, deliver_event,
};
use http::{HeaderMap, StatusCode};
use serde::Serialize;
use serde_json::Value;

/// The header naming an event, so that a repeat of it changes nothing.
pub const EVENT_ID: &str = "event-id";

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
    let task_id: crate::TaskId = id
        .parse()
        .map_err(|e: crate::domain::ValidationError| ApiError::InvalidTaskId(e.to_string()))?;
    let delivery = EventDelivery {
        task_id,
        owner: (!deps.operator_api).then_some(caller),
        name,
        event_id,
        payload,
    };
    let dispatch = deps
        .dispatch
        .as_deref()
        .map(|d| d as &dyn crate::handlers::start::Dispatch);
    let (kept, duplicate) = match deliver_event(&deps.ports, delivery, dispatch).await {
        Ok(Delivered::Taken { kept }) => (kept, false),
        Ok(Delivered::Duplicate) => (false, true),
        Err(EventError::TaskNotFound(id)) => return Err(ApiError::TaskNotFound(id)),
        Err(EventError::NotExpected(m)) => return Err(ApiError::EventNotExpected(m)),
        Err(EventError::Refused {
            message,
            process_state,
        }) => {
            return Err(ApiError::EventRefused {
                message,
                process_state,
            });
        }
        Err(EventError::Payload { message, problems }) => {
            return Err(ApiError::ValidationFailed { message, problems });
        }
        Err(EventError::Contended) => {
            return Err(ApiError::Conflict {
                message: "the task kept changing while the event was delivered: try again".into(),
                process_state: None,
            });
        }
        Err(e) => return Err(ApiError::unavailable(e)),
    };
    Ok(respond(
        if duplicate {
            StatusCode::OK
        } else {
            StatusCode::ACCEPTED
        },
        &EventTaken {
            task_id: task_id.to_string(),
            event: name.to_owned(),
            kept,
            duplicate,
        },
    ))
}
