//! The agent: calls the service each step request names. Retries transient faults with
//! exponential backoff and full jitter for the step's timeout from when it picked the request
//! up (start to close), never past the step's deadline `CompleteBy` (which also allows for the
//! request's wait in the queue). Out of time before `CompleteBy`, it reports the attempt timed
//! out (handed back now); once `CompleteBy` has passed it stops and sends nothing (the
//! supervisor takes over); a permanent fault is reported as a failed step.

use super::{HandlerError, RecordOutcome, process_batch};
use crate::domain::Backoff;
use crate::domain::task::MAX_RESULT_BYTES;
use crate::domain::transition::StepOutcome;
use crate::messages::{SchedulerMessage, StepReply, StepRequest};
use crate::ports::{Clock, Queue, RemoteCall, RemoteFault};
use crate::remote::{LookupError, MAX_CODE_BYTES, MAX_TEXT_BYTES, Remotes, cap};
use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use rand::Rng;
use std::sync::Arc;
use std::time::Duration;
use tracing::{Instrument, error, info, info_span, warn};

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
    /// Where the handler's EMF metrics go.
    pub metrics: crate::metrics::Metrics,
    /// Where payloads too large for a task's items are kept (the stack's bucket).
    pub payloads: Arc<dyn crate::ports::Payloads>,
    /// What starts a sub-workflow step's child task (`None`: this agent starts none; such a
    /// step is refused).
    pub tasks: Option<Arc<super::TaskPorts>>,
    /// The scheduler's outlets, lent to claim a child task's first step as it is created and
    /// send its request (as the task API does at submission); `None`: the child's work message
    /// and the scheduler's claim.
    pub dispatch: Option<Arc<super::scheduler::SchedulerDeps>>,
}

/// Handles one SQS batch of step requests.
pub async fn handle(deps: &AgentDeps, event: SqsEvent) -> SqsBatchResponse {
    process_batch(
        event,
        deps.queue.as_ref(),
        deps.dead_letter_url.as_deref(),
        (&deps.metrics, "agent"),
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
    if super::children::is_child_request(request) {
        let outcome = match &deps.tasks {
            // An undo: the child is undone as a unit (its end answers, once `Accepted`), or the
            // answer is known now.
            Some(ports) if request.undo => super::children::undo_child(ports, request).await?,
            Some(ports) => {
                let input = crate::payloads::request_body(deps.payloads.as_ref(), request).await?;
                let dispatch = deps
                    .dispatch
                    .as_deref()
                    .map(|d| d as &dyn super::start::Dispatch);
                super::children::start_child(ports, dispatch, request, input).await
            }
            None => StepOutcome::Refused {
                code: "sub_workflows_unavailable".into(),
                message: "this deployment's agents start no child tasks".into(),
            },
        };
        return reply(deps, request, outcome).await;
    }
    if super::runs::is_run_request(request) {
        let Some(ports) = &deps.tasks else {
            let outcome = StepOutcome::Refused {
                code: "distributed_for_each_unavailable".into(),
                message: "this deployment's agents start no runs".into(),
            };
            return reply(deps, request, outcome).await;
        };
        let call = if request.undo {
            // An undo: the run undoes its elements (its end answers, once `Accepted`), or the
            // answer is known now.
            super::runs::undo_run_request(ports, request).await?
        } else {
            let input = crate::payloads::request_body(deps.payloads.as_ref(), request).await?;
            super::runs::start_run(ports, request, input).await?
        };
        // The answer first: it is due within the attempt's timeout (an element's call's); the
        // window of elements opens (or is undone) after it, as long as that takes.
        reply(deps, request, call.answer.clone()).await?;
        return call.then(ports).await;
    }
    let remote = match deps.remotes.get(&request.service).await {
        Ok(r) => r,
        Err(LookupError::Catalog(crate::catalog::CatalogError::Store(e))) => return Err(e.into()),
        // Left for redelivery (and, after the redrive count, the dead-letter queue): the
        // deployment is missing the service, which an operator must fix.
        Err(e) => return Err(HandlerError::Config(e.to_string())),
    };
    // A large body travels by reference; the service receives it whole.
    let input = crate::payloads::request_body(deps.payloads.as_ref(), request).await?;
    let call = RemoteCall {
        service: request.service.clone(),
        step: request.step.clone(),
        action: request.action.clone(),
        idempotency_key: request.idempotency_key(),
        task_id: request.task_id,
        undoes: request.undoes.clone(),
        input,
        deadline: request.complete_by,
        callback: request.callback.clone(),
        limit_keys: request.limit_keys.clone(),
    };
    // Start to close: the step's timeout from now, within its deadline.
    let picked_up = deps.clock.now();
    let give_up_at = request.timeout_ms.map_or(request.complete_by, |ms| {
        let timeout = chrono::Duration::milliseconds(i64::try_from(ms).unwrap_or(i64::MAX));
        request.complete_by.min(
            picked_up
                .checked_add_signed(timeout)
                .unwrap_or(request.complete_by),
        )
    });
    let mut retry = 0u32;
    // The last misconfigured answer of this attempt: a call that then times out at the
    // give-up time does not turn the attempt into silence (a timeout for the supervisor).
    let mut misconfigured: Option<String> = None;
    let started = std::time::Instant::now();
    let observe = |calls: u32| {
        deps.metrics.emit(
            &[
                ("Workflow", request.workflow.as_str()),
                ("Service", request.service.as_str()),
            ],
            &[
                (
                    "StepLatency",
                    crate::metrics::Unit::Milliseconds,
                    started.elapsed().as_secs_f64() * 1000.0,
                ),
                (
                    "StepAttempts",
                    crate::metrics::Unit::Count,
                    f64::from(calls),
                ),
            ],
        );
    };
    loop {
        let remaining = (give_up_at - deps.clock.now()).to_std().unwrap_or_default();
        if remaining.is_zero() {
            if let Some(error) = misconfigured.take() {
                // The pause before the next try ran past the give-up time (a loaded machine):
                // the attempt still failed on its misconfigured answers, and says so (no
                // silence for the supervisor to time out).
                error!(%error, retries = retry, "service misconfigured for this step and no time left; the attempt failed");
                observe(retry);
                let outcome = StepOutcome::Deferred {
                    until: deps.clock.now(),
                    misconfigured: Some(error),
                    paused: None,
                    limited: None,
                };
                return reply(deps, request, outcome).await;
            }
            if give_up_at < request.complete_by {
                // Only with a request picked up late enough that its timeout ends first, and a
                // clock that jumped: report it like a retry loop that ran out.
                info!("the step's timeout passed before a call; the attempt timed out");
                return reply(deps, request, timed_out(retry)).await;
            }
            info!("deadline passed; stopping without a reply");
            return Ok(());
        }
        let outcome = match remote.call(&call, remaining.min(deps.call_timeout)).await {
            // A callback step: the service accepted the request and completes it later.
            Ok(_) if call.callback.is_some() => StepOutcome::Accepted,
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
            Err(RemoteFault::TooLarge(error)) => {
                warn!(%error, "the service's answer is over the limit sas reads");
                StepOutcome::Faulted {
                    error: format!("result_too_large: {}", cap(&error, MAX_TEXT_BYTES)),
                }
            }
            Err(RemoteFault::Refused { code, message }) => {
                // Whatever the remote kept, only capped texts go into the reply (SQS's 256 KB),
                // the record (DynamoDB's 400 KB) and the events.
                let (code, message) = (cap(&code, MAX_CODE_BYTES), cap(&message, MAX_TEXT_BYTES));
                info!(%code, %message, "the service refused the step");
                StepOutcome::Refused { code, message }
            }
            Err(RemoteFault::CircuitOpen { until, paused }) => {
                // Hand the step back at once rather than wait here: an agent held by one
                // service's open breaker would delay the steps of every other service.
                info!(%until, "circuit open; the step is deferred");
                StepOutcome::Deferred {
                    until,
                    misconfigured: None,
                    paused,
                    limited: None,
                }
            }
            Err(RemoteFault::Limited { until, limit }) => {
                // Over one of the service's limits: no call was made. Hand the step back to
                // come again then, holding no agent meanwhile (no failure, like an open
                // breaker).
                info!(%until, %limit, "over the service's limit; the step is deferred");
                StepOutcome::Deferred {
                    until,
                    misconfigured: None,
                    paused: None,
                    limited: Some(limit),
                }
            }
            Err(
                fault @ (RemoteFault::Transient(_)
                | RemoteFault::InProgress(_)
                | RemoteFault::Misconfigured(_)),
            ) => {
                let wait = deps
                    .backoff
                    .delay(retry, rand::rng().random::<f64>())
                    .to_std()
                    .unwrap_or_default();
                retry += 1;
                if matches!(fault, RemoteFault::Misconfigured(_)) {
                    misconfigured = Some(cap(&fault.to_string(), MAX_TEXT_BYTES));
                }
                let until = deps.clock.now() + chrono::Duration::from_std(wait).unwrap_or_default();
                if until >= give_up_at {
                    if let Some(error) = misconfigured.take() {
                        // Never a refusal. Had the whole service been misconfigured, its
                        // breaker (counting distinct tasks) would have opened and deferred
                        // the step; it stayed closed, so maybe only this task's request is
                        // wrong (a 404 on its own path): a failed attempt, which fails the
                        // step, with the alert, at its threshold.
                        error!(%error, retries = retry, "service misconfigured for this step and no time left; the attempt failed");
                        StepOutcome::Deferred {
                            until,
                            misconfigured: Some(error),
                            paused: None,
                            limited: None,
                        }
                    } else if give_up_at < request.complete_by {
                        // The step's own timeout ran out before its deadline (the deadline
                        // also covers the wait in the queue): hand the attempt back now.
                        info!(error = %fault, retries = retry, "transient fault and the step's timeout spent; the attempt timed out");
                        observe(retry);
                        timed_out(retry)
                    } else {
                        info!(error = %fault, retries = retry, "transient fault and no time left before the deadline; stopping without a reply");
                        observe(retry);
                        return Ok(());
                    }
                } else {
                    if matches!(fault, RemoteFault::Misconfigured(_)) {
                        error!(error = %fault, retry, ?wait, "service misconfigured; retrying");
                    } else {
                        warn!(error = %fault, retry, ?wait, "transient fault; retrying");
                    }
                    tokio::time::sleep(wait).await;
                    continue;
                }
            }
        };
        let timed_out = matches!(outcome, StepOutcome::TimedOut { .. });
        reply(deps, request, outcome).await?;
        info!(retries = retry, "reply sent");
        if !timed_out {
            observe(retry + 1);
        }
        return Ok(());
    }
}

fn timed_out(retries: u32) -> StepOutcome {
    StepOutcome::TimedOut {
        error: format!("no answer within the step's timeout ({retries} retries)"),
    }
}

/// Sends the agent's answer to the step's reply queue.
async fn reply(
    deps: &AgentDeps,
    request: &StepRequest,
    outcome: StepOutcome,
) -> Result<(), HandlerError> {
    // A large result is kept before the reply that names it goes out.
    let reply = crate::payloads::packed_reply(
        deps.payloads.as_ref(),
        StepReply {
            task_id: request.task_id,
            step: request.step.clone(),
            step_index: request.step_index,
            attempt: request.attempt,
            undo: request.undo,
            outcome,
            result_ref: None,
            generation: None,
        },
    )
    .await?;
    let reply = SchedulerMessage::Reply(reply);
    // In its task's tenant's group, as the request came: a noisy caller's replies do not hold
    // back a quiet one's on the reply queue (SQS fair queues).
    super::send_fair_json(
        deps.queue.as_ref(),
        &request.reply_queue_url,
        request.tenant(),
        "reply",
        &reply,
        Duration::ZERO,
    )
    .await
}
