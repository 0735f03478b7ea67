//! The agent: calls the service each step request names. Retries transient faults with
//! exponential backoff and full jitter while the step's deadline allows; once `CompleteBy` has
//! passed it stops and sends nothing (the supervisor takes over); a permanent fault is reported
//! as a failed step.

use super::{HandlerError, RecordOutcome, process_batch};
use crate::domain::Backoff;
use crate::domain::task::MAX_RESULT_BYTES;
use crate::domain::transition::StepOutcome;
use crate::messages::{SchedulerMessage, StepReply, StepRequest};
use crate::ports::{Clock, Queue, RemoteCall, RemoteFault};
use crate::remote::{LookupError, Remotes};
use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use rand::Rng;
use std::sync::Arc;
use std::time::Duration;
use tracing::{Instrument, info, info_span, warn};

#[derive(Clone)]
pub struct AgentDeps {
    /// The agent's name, for the logs.
    pub name: String,
    pub queue: Arc<dyn Queue>,
    /// Each service's remote, from the catalog.
    pub remotes: Arc<Remotes>,
    pub clock: Arc<dyn Clock>,
    pub backoff: Backoff,
    /// Upper bound on one remote call (the remaining time to the deadline bounds it too).
    pub call_timeout: Duration,
    pub dead_letter_url: Option<String>,
}

/// Handles one SQS batch of step requests.
pub async fn handle(deps: &AgentDeps, event: SqsEvent) -> SqsBatchResponse {
    process_batch(
        event,
        deps.queue.as_ref(),
        deps.dead_letter_url.as_deref(),
        |body| async move { on_message(deps, &body).await },
    )
    .await
}

pub async fn on_message(deps: &AgentDeps, body: &str) -> RecordOutcome {
    let request: StepRequest = match serde_json::from_str(body) {
        Ok(r) => r,
        Err(e) => return RecordOutcome::Poison(format!("not a step request: {e}")),
    };
    let span = info_span!("step", agent = %deps.name, task_id = %request.task_id, workflow = %request.workflow, attempt = request.attempt, step = %request.step, service = %request.service);
    perform(deps, &request).instrument(span).await.into()
}

async fn perform(deps: &AgentDeps, request: &StepRequest) -> Result<(), HandlerError> {
    let remote = match deps.remotes.get(&request.service).await {
        Ok(r) => r,
        Err(LookupError::Catalog(crate::catalog::CatalogError::Store(e))) => return Err(e.into()),
        // Left for redelivery (and, after the redrive count, the dead-letter queue): the
        // deployment is missing the service, which an operator must fix.
        Err(e) => return Err(HandlerError::Config(e.to_string())),
    };
    let call = RemoteCall {
        service: request.service.clone(),
        step: request.step.clone(),
        action: request.action.clone(),
        idempotency_key: request.idempotency_key(),
        task_id: request.task_id,
        undoes: request.undoes.clone(),
        input: request.input.clone(),
        deadline: request.complete_by,
        callback: request.callback.clone(),
    };
    let mut retry = 0u32;
    loop {
        let Ok(remaining) = (request.complete_by - deps.clock.now()).to_std() else {
            info!("deadline passed; stopping without a reply");
            return Ok(());
        };
        if remaining.is_zero() {
            info!("deadline passed; stopping without a reply");
            return Ok(());
        }
        let outcome = match remote.call(&call, remaining.min(deps.call_timeout)).await {
            Ok(value) => {
                let result = value.to_string();
                if result.len() > MAX_RESULT_BYTES {
                    warn!(
                        bytes = result.len(),
                        "the service's answer is over the result limit"
                    );
                    StepOutcome::Faulted {
                        error: format!(
                            "result_too_large: the service's answer is {} bytes (at most {MAX_RESULT_BYTES})",
                            result.len()
                        ),
                    }
                } else {
                    StepOutcome::Succeeded {
                        result: (!value.is_null()).then_some(result),
                    }
                }
            }
            Err(RemoteFault::Refused { code, message }) => {
                warn!(%code, %message, "refused");
                StepOutcome::Failed {
                    error: format!("{code}: {message}"),
                }
            }
            Err(RemoteFault::CircuitOpen { until }) if until < request.complete_by => {
                // The breaker may close before the deadline: wait for it (spread a little, so
                // the agents waiting on one breaker do not all probe at once).
                let spread = chrono::Duration::milliseconds(rand::rng().random_range(0..100));
                let wait = (until + spread - deps.clock.now())
                    .to_std()
                    .unwrap_or_default();
                info!(%until, "circuit open; waiting for it");
                tokio::time::sleep(wait).await;
                continue;
            }
            Err(RemoteFault::CircuitOpen { until }) => {
                info!(%until, "circuit open past the deadline; the step is deferred");
                StepOutcome::Deferred { until }
            }
            Err(
                RemoteFault::Transient(error)
                | RemoteFault::InProgress(error)
                | RemoteFault::Misconfigured(error),
            ) => {
                let wait = deps
                    .backoff
                    .delay(retry, rand::rng().random::<f64>())
                    .to_std()
                    .unwrap_or_default();
                retry += 1;
                if deps.clock.now() + chrono::Duration::from_std(wait).unwrap_or_default()
                    >= request.complete_by
                {
                    info!(%error, retries = retry, "transient fault and no time left before the deadline; stopping without a reply");
                    return Ok(());
                }
                warn!(%error, retry, ?wait, "transient fault; retrying");
                tokio::time::sleep(wait).await;
                continue;
            }
        };
        let reply = SchedulerMessage::Reply(StepReply {
            task_id: request.task_id,
            step: request.step.clone(),
            step_index: request.step_index,
            attempt: request.attempt,
            undo: request.undo,
            outcome,
        });
        let body = serde_json::to_string(&reply)
            .map_err(|e| HandlerError::Poison(format!("reply does not serialize: {e}")))?;
        deps.queue
            .send(&request.reply_queue_url, &body, Duration::ZERO)
            .await?;
        info!(retries = retry, "reply sent");
        return Ok(());
    }
}
