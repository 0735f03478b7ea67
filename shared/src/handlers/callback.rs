//! Callbacks: how a callback step's service (or a person) completes it, through the task API's
//! `POST /tasks/{taskId}/callbacks/{token}`. The token came with the step's request
//! (`Sas-Callback-Token`, inside `Sas-Callback-Url`); it names the attempt and step it answers
//! and is signed with the task's own key, so it cannot be guessed from the task id.
//!
//! The body is `{"status": "succeeded", "result": ...}`, `{"status": "refused", "code": ...,
//! "message": ...}` or `{"status": "heartbeat"}`. A valid callback becomes a step reply on the
//! scheduler's queue, applied with the same fencing as an agent's reply (state, attempt and
//! step), so a late or replayed callback changes nothing. Answers: 202 accepted; 404 for an
//! unknown task or a token that is not this task's; 409 `stale_callback` when the step is no
//! longer waiting for this callback (an earlier callback was applied, or the step timed out and
//! went out again under a new token); 400 for a malformed body.

use super::submission::{SubmissionDeps, error, respond, unavailable};
use crate::domain::state::check_callback_token;
use crate::domain::task::MAX_RESULT_BYTES;
use crate::domain::transition::StepOutcome;
use crate::domain::{ProcessState, StepStatus, TaskId};
use crate::messages::{SchedulerMessage, StepReply};
use http::{Response, StatusCode};
use serde::Deserialize;
use serde_json::{Value, json};
use std::time::Duration;
use tracing::{info, warn};

/// The longest refusal message a callback may carry.
pub const MAX_MESSAGE_CHARS: usize = 1000;

/// A callback's body.
#[derive(Debug, Deserialize)]
#[serde(tag = "status", rename_all = "camelCase", deny_unknown_fields)]
enum Callback {
    Succeeded {
        #[serde(default)]
        result: Value,
    },
    Refused {
        code: String,
        #[serde(default)]
        message: String,
    },
    Heartbeat,
}

fn invalid(at: &str, message: impl Into<String>) -> Response<String> {
    let message = message.into();
    respond(
        StatusCode::BAD_REQUEST,
        &json!({"error": {
            "code": "validation_failed",
            "message": format!("{at}: {message}"),
            "problems": [{"at": at, "message": message}],
        }}),
    )
}

/// Checks a callback's body: the outcome it reports, or the 400 answer.
fn outcome(body: &[u8]) -> Result<StepOutcome, (&'static str, String)> {
    let callback: Callback = serde_json::from_slice(body).map_err(|e| {
        (
            "/status",
            format!(
                "not a callback ({e}): send {{\"status\": \"succeeded\", \"result\": ...}}, {{\"status\": \"refused\", \"code\": ..., \"message\": ...}} or {{\"status\": \"heartbeat\"}}"
            ),
        )
    })?;
    Ok(match callback {
        Callback::Succeeded { result } => {
            let text = result.to_string();
            if text.len() > MAX_RESULT_BYTES {
                return Err((
                    "/result",
                    format!(
                        "result_too_large: {} bytes (at most {MAX_RESULT_BYTES})",
                        text.len()
                    ),
                ));
            }
            StepOutcome::Succeeded {
                result: (!result.is_null()).then_some(text),
            }
        }
        Callback::Refused { code, message } => {
            let ok = (1..=64).contains(&code.len())
                && code
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
            if !ok {
                return Err((
                    "/code",
                    "a refusal code is 1 to 64 letters, digits, '_', '.' or '-'".into(),
                ));
            }
            if message.chars().count() > MAX_MESSAGE_CHARS {
                return Err((
                    "/message",
                    format!("at most {MAX_MESSAGE_CHARS} characters"),
                ));
            }
            StepOutcome::Refused { code, message }
        }
        Callback::Heartbeat => StepOutcome::Heartbeat,
    })
}

/// `POST /tasks/{id}/callbacks/{token}`.
pub async fn callback(
    deps: &SubmissionDeps,
    id: &str,
    token: &str,
    body: &[u8],
) -> Response<String> {
    let Ok(id) = id.parse::<TaskId>() else {
        return error(
            StatusCode::NOT_FOUND,
            "callback_not_found",
            "no such callback",
        );
    };
    let outcome = match outcome(body) {
        Ok(o) => o,
        Err((at, message)) => return invalid(at, message),
    };
    let record = match deps.store.get(id).await {
        Ok(Some((_, r))) => r,
        Ok(None) => {
            return error(
                StatusCode::NOT_FOUND,
                "callback_not_found",
                "no such callback",
            );
        }
        Err(e) => return unavailable(e),
    };
    // The same answer for an unknown task and a token that is not this task's: an id alone
    // tells nothing.
    let Some((attempt, step_index)) = check_callback_token(&record.callback_key, &id, token) else {
        warn!("callback with a token that is not this task's");
        return error(
            StatusCode::NOT_FOUND,
            "callback_not_found",
            "no such callback",
        );
    };
    let waiting = record.process_state == ProcessState::Processing
        && record.attempt == attempt
        && record.step_index == step_index
        && record
            .steps
            .get(step_index)
            .is_some_and(|s| matches!(s.status, StepStatus::Running | StepStatus::Waiting));
    let Some(step) = record.steps.get(step_index).filter(|_| waiting) else {
        info!(attempt, step_index, state = %record.process_state, "stale callback");
        return error(
            StatusCode::CONFLICT,
            "stale_callback",
            "this step no longer waits for this callback: an earlier callback was applied, the step timed out and went out again under a new token, or the task moved on",
        );
    };
    let reply = SchedulerMessage::Reply(StepReply {
        task_id: id,
        step: step.name.clone(),
        step_index,
        attempt,
        undo: false,
        outcome,
    });
    let body = match serde_json::to_string(&reply) {
        Ok(b) => b,
        Err(e) => return unavailable(e),
    };
    if let Err(e) = deps
        .queue
        .send(&deps.work_queue_url, &body, Duration::ZERO)
        .await
    {
        return unavailable(e);
    }
    info!(workflow = %record.workflow, attempt, step = %step.name, "callback accepted");
    respond(
        StatusCode::ACCEPTED,
        &json!({"taskId": id, "step": step.name, "attempt": attempt, "accepted": true}),
    )
}
