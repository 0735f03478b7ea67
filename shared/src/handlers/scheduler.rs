//! The scheduler: claims Pending orders, sends step requests to agents, applies their replies.

use super::{HandlerError, RecordOutcome, deliver_notice, process_batch, write};
use crate::domain::transition::{self, Effect, Transition};
use crate::domain::{Order, Policy, StateRecord, Workflow};
use crate::messages::{SchedulerMessage, StepReply, StepRequest, WorkMessage};
use crate::ports::{Clock, EventBus, Queue, StateStore};
use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tracing::{Instrument, info, info_span};

/// Everything the scheduler needs, built once per process.
#[derive(Clone)]
pub struct SchedulerDeps {
    pub store: Arc<dyn StateStore>,
    pub queue: Arc<dyn Queue>,
    pub events: Arc<dyn EventBus>,
    pub clock: Arc<dyn Clock>,
    pub workflow: Arc<Workflow>,
    pub policy: Policy,
    /// Agent name → its request queue URL.
    pub agent_queues: HashMap<String, String>,
    /// Where agents send their replies.
    pub reply_queue_url: String,
    /// Where poison messages go.
    pub dead_letter_url: Option<String>,
    /// This scheduler instance's id, written to `LockedBy`.
    pub instance_id: String,
}

/// Handles one SQS batch from the work queue or the reply queue.
pub async fn handle(deps: &SchedulerDeps, event: SqsEvent) -> SqsBatchResponse {
    process_batch(
        event,
        deps.queue.as_ref(),
        deps.dead_letter_url.as_deref(),
        |body| async move { on_message(deps, &body).await },
    )
    .await
}

/// Handles one message body.
pub async fn on_message(deps: &SchedulerDeps, body: &str) -> RecordOutcome {
    let msg: SchedulerMessage = match serde_json::from_str(body) {
        Ok(m) => m,
        Err(e) => return RecordOutcome::Poison(format!("not a scheduler message: {e}")),
    };
    match msg {
        SchedulerMessage::Work(w) => {
            let span = info_span!("work", order_id = %w.order_id, attempt = tracing::field::Empty);
            on_work(deps, w).instrument(span).await.into()
        }
        SchedulerMessage::Reply(r) => {
            let span =
                info_span!("reply", order_id = %r.order_id, attempt = r.attempt, step = %r.step);
            on_reply(deps, r).instrument(span).await.into()
        }
    }
}

async fn load(
    deps: &SchedulerDeps,
    w: crate::OrderId,
) -> Result<(Order, StateRecord), HandlerError> {
    deps.store
        .get(w)
        .await?
        .ok_or_else(|| HandlerError::Poison(format!("no order {w}")))
}

async fn on_work(deps: &SchedulerDeps, w: WorkMessage) -> Result<(), HandlerError> {
    let (order, record) = load(deps, w.order_id).await?;
    let t = match transition::claim(&record, &deps.instance_id, deps.clock.now(), &deps.policy) {
        Ok(t) => t,
        Err(why) => {
            info!(%why, "work message dropped");
            return Ok(());
        }
    };
    if !write(deps.store.as_ref(), &t).await? {
        info!("another scheduler claimed the order first; work message dropped");
        return Ok(());
    }
    tracing::Span::current().record("attempt", t.record.attempt);
    info!(step = ?t.record.current_step(), "claimed");
    perform(deps, &order, &t).await
}

async fn on_reply(deps: &SchedulerDeps, r: StepReply) -> Result<(), HandlerError> {
    let (order, record) = load(deps, r.order_id).await?;
    if deps.workflow.step(r.step_index).map(|s| s.name.as_str()) != Some(r.step.as_str()) {
        return Err(HandlerError::Poison(format!(
            "reply names step {:?} at index {}, which the workflow does not have",
            r.step, r.step_index
        )));
    }
    let t = match transition::apply_reply(
        &record,
        r.attempt,
        r.step_index,
        &r.outcome,
        deps.clock.now(),
        &deps.policy,
    ) {
        Ok(t) => t,
        Err(why) => {
            info!(%why, "stale or duplicate reply dropped");
            return Ok(());
        }
    };
    if !write(deps.store.as_ref(), &t).await? {
        info!("the record moved on meanwhile; reply dropped");
        return Ok(());
    }
    info!(outcome = ?r.outcome, state = %t.record.process_state, "reply applied");
    perform(deps, &order, &t).await
}

async fn perform(deps: &SchedulerDeps, order: &Order, t: &Transition) -> Result<(), HandlerError> {
    for effect in &t.effects {
        match effect {
            Effect::SendStepRequest => send_step_request(deps, order, &t.record).await?,
            Effect::DeliverNotice => {
                deliver_notice(
                    deps.store.as_ref(),
                    deps.queue.as_ref(),
                    deps.events.as_ref(),
                    deps.clock.as_ref(),
                    &t.record,
                )
                .await?
            }
            Effect::Enqueue { .. } => {
                return Err(HandlerError::Config(format!(
                    "the scheduler does not enqueue work ({effect:?})"
                )));
            }
        }
    }
    Ok(())
}

async fn send_step_request(
    deps: &SchedulerDeps,
    order: &Order,
    record: &StateRecord,
) -> Result<(), HandlerError> {
    let step = deps
        .workflow
        .step(record.step_index)
        .ok_or_else(|| HandlerError::Poison(format!("no step {}", record.step_index)))?;
    let url = deps.agent_queues.get(&step.agent).ok_or_else(|| {
        HandlerError::Config(format!("no request queue for agent {}", step.agent))
    })?;
    let complete_by = record
        .complete_by
        .ok_or_else(|| HandlerError::Poison("a running step without a deadline".into()))?;
    let request = StepRequest {
        order_id: record.order_id,
        step: step.name.clone(),
        step_index: record.step_index,
        action: step.name.clone(),
        attempt: record.attempt,
        complete_by,
        reply_queue_url: deps.reply_queue_url.clone(),
        payload: serde_json::json!({"customerId": order.customer_id, "items": order.items}),
    };
    let body = serde_json::to_string(&request)
        .map_err(|e| HandlerError::Poison(format!("step request does not serialize: {e}")))?;
    deps.queue.send(url, &body, Duration::ZERO).await?;
    info!(step = %step.name, agent = %step.agent, %complete_by, "step request sent");
    Ok(())
}
