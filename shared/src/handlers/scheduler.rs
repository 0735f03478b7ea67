//! The scheduler: claims Pending orders, sends step requests to agents, applies their replies.

use super::{HandlerError, Outlets, RecordOutcome, enqueue, perform, process_batch, write};
use crate::domain::transition::{self, Transition};
use crate::domain::{Order, Policy, StateRecord, Workflow};
use crate::messages::{
    DeadlineTimer, SchedulerMessage, StepReply, StepRequest, WorkMessage, idempotency_key,
};
use crate::ports::{Clock, EventBus, Queue, StateStore};
use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tracing::{Instrument, info, info_span, warn};

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
    /// The scheduler's own work queue: compensation and long waits re-enqueue work here.
    pub work_queue_url: String,
    /// Where deadline timers go (the supervisor's timer queue); `None`: no timers, the sweep
    /// alone finds expired deadlines.
    pub timer_queue_url: Option<String>,
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
    let now = deps.clock.now();
    if let Some(not_before) = w.not_before
        && not_before > now
    {
        // A wait longer than SQS's 15-minute delay: send it on for the rest.
        enqueue(
            deps.queue.as_ref(),
            &deps.work_queue_url,
            w.order_id,
            not_before - now,
            now,
        )
        .await?;
        info!(%not_before, "long wait: work message sent on");
        return Ok(());
    }
    let (order, record) = load(deps, w.order_id).await?;
    let t = match transition::claim(&record, &deps.instance_id, now, &deps.policy) {
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
    info!(step = ?t.record.current_step(), state = %t.record.process_state, "claimed");
    run(deps, &order, &t).await
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
        r.undo,
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
    info!(outcome = ?r.outcome, undo = r.undo, state = %t.record.process_state, "reply applied");
    run(deps, &order, &t).await
}

async fn run(deps: &SchedulerDeps, order: &Order, t: &Transition) -> Result<(), HandlerError> {
    let outlets = Outlets {
        store: deps.store.as_ref(),
        queue: deps.queue.as_ref(),
        events: deps.events.as_ref(),
        clock: deps.clock.as_ref(),
        work_queue_url: &deps.work_queue_url,
    };
    perform(
        &outlets,
        t,
        Some(|| send_step_request(deps, order, &t.record)),
    )
    .await
}

/// Sends the request for the record's current step, or for its undo while Compensating.
async fn send_step_request(
    deps: &SchedulerDeps,
    order: &Order,
    record: &StateRecord,
) -> Result<(), HandlerError> {
    let step = deps
        .workflow
        .step(record.step_index)
        .ok_or_else(|| HandlerError::Poison(format!("no step {}", record.step_index)))?;
    let state = record
        .steps
        .get(record.step_index)
        .ok_or_else(|| HandlerError::Poison(format!("no step state {}", record.step_index)))?;
    let url = deps.agent_queues.get(&step.agent).ok_or_else(|| {
        HandlerError::Config(format!("no request queue for agent {}", step.agent))
    })?;
    let complete_by = record
        .complete_by
        .ok_or_else(|| HandlerError::Poison("a running step without a deadline".into()))?;
    let forward_key = idempotency_key(record.order_id, &step.name, &step.name, state.generation);
    let undo = record.process_state == crate::domain::ProcessState::Compensating;
    let mut payload = serde_json::json!({"customerId": order.customer_id, "items": order.items});
    let (action, key) = if undo {
        payload["undoes"] = serde_json::Value::String(forward_key);
        payload["result"] = state
            .result
            .as_deref()
            .and_then(|r| serde_json::from_str(r).ok())
            .unwrap_or(serde_json::Value::Null);
        let key = idempotency_key(
            record.order_id,
            &step.name,
            &step.undo,
            state.undo_generation,
        );
        (step.undo.clone(), key)
    } else {
        (step.name.clone(), forward_key)
    };
    let request = StepRequest {
        order_id: record.order_id,
        step: step.name.clone(),
        step_index: record.step_index,
        action,
        attempt: record.attempt,
        undo,
        idempotency_key: Some(key),
        complete_by,
        reply_queue_url: deps.reply_queue_url.clone(),
        payload,
    };
    let body = serde_json::to_string(&request)
        .map_err(|e| HandlerError::Poison(format!("step request does not serialize: {e}")))?;
    deps.queue.send(url, &body, Duration::ZERO).await?;
    info!(step = %step.name, action = %request.action, agent = %step.agent, %complete_by, "step request sent");
    if let Some(timers) = &deps.timer_queue_url {
        let timer = DeadlineTimer {
            order_id: record.order_id,
            attempt: record.attempt,
            step_index: record.step_index,
            complete_by,
        };
        // Best effort: a timer that is not armed leaves the deadline to the scheduled sweep.
        if let Err(e) = arm(deps.queue.as_ref(), timers, &timer, deps.clock.now()).await {
            warn!(error = %e, "deadline timer not armed; the sweep will find the deadline");
        }
    }
    Ok(())
}

/// Sends `timer` to arrive at its deadline (or after SQS's longest delay, to be re-armed).
pub(crate) async fn arm(
    queue: &dyn crate::ports::Queue,
    url: &str,
    timer: &DeadlineTimer,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<(), HandlerError> {
    let body = serde_json::to_string(timer)
        .map_err(|e| HandlerError::Poison(format!("timer does not serialize: {e}")))?;
    let delay = (timer.complete_by - now)
        .to_std()
        .unwrap_or_default()
        .min(super::MAX_SQS_DELAY);
    queue.send(url, &body, delay).await?;
    Ok(())
}
