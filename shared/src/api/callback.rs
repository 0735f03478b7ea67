//! Callbacks: how a callback step's service (or a person) completes it, through the task API's
//! `POST /tasks/{taskId}/callbacks/{token}`. The token came with the step's request
//! (`Sas-Callback-Token`, inside `Sas-Callback-Url`); it names the step and its idempotency
//! key's generation (the same for every attempt of the step, as the key is) and is signed with
//! the task's own key, so it cannot be guessed from the task id.
//!
//! The body is `{"status": "succeeded", "result": ...}`, `{"status": "refused", "code": ...,
//! "message": ...}` or `{"status": "heartbeat"}`. A valid callback becomes a reply on the
//! scheduler's queue, applied by [`crate::domain::transition::apply_callback`]: fenced by the
//! step and the key generation, so the first callback completes a step that was sent again
//! meanwhile (the service answers a repeated key with its first acceptance and calls back once),
//! and a late or replayed one changes nothing. Answers: 202 accepted; 404 for an unknown task
//! or a token that is not this task's; 409 `stale_callback` when the step no longer waits for
//! it (an earlier callback was applied, the step is being undone, an operator retried it under
//! a new key, or the task moved on); 400 for a malformed body.

use super::deps::ApiDeps;
use super::error::{Answer, ApiError, respond};
use super::views::CallbackAccepted;
use crate::domain::TaskId;
use crate::domain::state::{CallbackFence, check_callback_token};
use crate::domain::task::MAX_RESULT_BYTES;
use crate::domain::transition::{self, Rejection, StepOutcome};
use crate::domain::workflow::Problem;
use crate::messages::{SchedulerMessage, StepReply};
use http::StatusCode;
use serde::Deserialize;
use serde_json::Value;
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

/// A malformed callback: `validation_failed` with its one problem.
fn invalid(at: &str, message: String) -> ApiError {
    ApiError::ValidationFailed {
        message: format!("{at}: {message}"),
        problems: Some(vec![Problem {
            at: at.to_owned(),
            message,
        }]),
    }
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
pub async fn callback(deps: &ApiDeps, id: &str, token: &str, body: &[u8]) -> Answer {
    let Ok(id) = id.parse::<TaskId>() else {
        return Err(ApiError::CallbackNotFound);
    };
    let outcome = outcome(body).map_err(|(at, message)| invalid(at, message))?;
    let record = match deps.ports.store.get(id).await {
        Ok(Some((_, r))) => r,
        Ok(None) => return Err(ApiError::CallbackNotFound),
        Err(e) => return Err(ApiError::unavailable(e)),
    };
    // The same answer for an unknown task and a token that is not this task's: an id alone
    // tells nothing.
    let Some(fence) = check_callback_token(&record.callback_key, &id, token) else {
        warn!("callback with a token that is not this task's");
        return Err(ApiError::CallbackNotFound);
    };
    let (step_index, attempt, generation) = match fence {
        CallbackFence::Step {
            step_index,
            generation,
        } => (step_index, record.attempt, Some(generation)),
        CallbackFence::Attempt {
            attempt,
            step_index,
        } => (step_index, attempt, None),
    };
    let workflow = crate::handlers::workflow_of(&deps.ports.definitions, &record)
        .await
        .map_err(ApiError::unavailable)?;
    // The scheduler applies the callback under this same rule, to the record as it then is;
    // here it only picks the answer. Whether it applies does not depend on the conditions in
    // front of the next step: those the scheduler decides.
    let (now, p, linear) = (
        deps.ports.clock.now(),
        workflow.policies(),
        transition::Linear,
    );
    let applies = match generation {
        Some(g) => transition::apply_callback(&record, step_index, g, &outcome, now, &p, &linear),
        None => transition::apply_reply(
            &record, attempt, step_index, false, &outcome, now, &p, &linear,
        ),
    };
    let name = record
        .steps
        .get(step_index)
        .map(|s| s.name.clone())
        .unwrap_or_default();
    match applies {
        Ok(_) => {}
        Err(Rejection::NotWaiting(_)) if outcome == StepOutcome::Heartbeat => {
            // The step's key is out again (or about to be): the service's work goes on and
            // its outcome is still awaited; there is no callback wait to extend.
            info!(
                attempt,
                step_index, "heartbeat while the step is sent again: nothing to extend"
            );
            return Ok(accepted(id, name, attempt));
        }
        Err(why) => {
            info!(attempt, step_index, state = %record.process_state, %why, "stale callback");
            return Err(ApiError::StaleCallback);
        }
    }
    // A large result is kept before the message that names it goes out.
    let reply = crate::payloads::packed_reply(
        deps.ports.payloads.as_ref(),
        StepReply {
            task_id: id,
            step: name.clone(),
            step_index,
            attempt,
            undo: false,
            outcome,
            result_ref: None,
            generation,
        },
    )
    .await
    .map_err(ApiError::unavailable)?;
    let reply = SchedulerMessage::Reply(reply);
    let body = serde_json::to_string(&reply).map_err(ApiError::unavailable)?;
    // To the work queue of the task's lane, in its tenant's group.
    let message = crate::ports::FairMessage {
        queue_url: deps.ports.work_queue(record.priority),
        group: record.tenant.as_deref(),
        body: &body,
        delay: Duration::ZERO,
    };
    deps.ports
        .queue
        .send_fair(message)
        .await
        .map_err(ApiError::unavailable)?;
    info!(workflow = %record.workflow, attempt, step = %name, "callback accepted");
    Ok(accepted(id, name, attempt))
}

/// `202`: the callback is on the scheduler's queue (or, a heartbeat, has nothing to extend).
fn accepted(id: TaskId, step: String, attempt: u64) -> http::Response<String> {
    respond(
        StatusCode::ACCEPTED,
        &CallbackAccepted {
            task_id: id.to_string(),
            step,
            attempt,
            accepted: true,
        },
    )
}
