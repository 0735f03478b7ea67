//! The JSON bodies that travel on the queues and the event bus. Every message that can be
//! answered late carries the `attempt` (fencing token) and `stepIndex` it belongs to.

use crate::domain::transition::StepOutcome;
use crate::domain::{OrderId, ProcessState, StateRecord, Status};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// What the scheduler consumes: work messages (its work queue) and agents' replies (the reply
/// queue). One handler serves both queues; the `type` tag tells them apart.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum SchedulerMessage {
    Work(WorkMessage),
    Reply(StepReply),
}

/// "This order needs a scheduler": sent by submission, by the supervisor's recoveries, by the
/// scheduler when compensation starts, and by the operator API.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkMessage {
    pub order_id: OrderId,
    /// Not to be acted on before this instant: set when the wanted delay is over SQS's 15
    /// minutes, so the scheduler sends the message again for the rest of the wait.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_before: Option<DateTime<Utc>>,
}

impl WorkMessage {
    pub fn new(order_id: OrderId) -> Self {
        Self {
            order_id,
            not_before: None,
        }
    }
}

/// A deadline timer: sent by the scheduler when it dispatches a step (or undo), delayed to arrive
/// at `completeBy` (SQS delays cap at 15 minutes; the supervisor re-arms an early timer). The
/// supervisor then checks that one record; the scheduled sweep stays as the safety net.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeadlineTimer {
    pub order_id: OrderId,
    pub attempt: u64,
    pub step_index: usize,
    pub complete_by: DateTime<Utc>,
}

/// The idempotency key of a step's action (or its undo's) as the remote service sees it: the
/// same for every attempt, so a retried or re-run step takes effect once; `generation` changes
/// it only when an operator retries a call the service refused.
pub fn idempotency_key(order_id: OrderId, step: &str, action: &str, generation: u32) -> String {
    if generation == 0 {
        format!("{order_id}:{step}:{action}")
    } else {
        format!("{order_id}:{step}:{action}:g{generation}")
    }
}

/// A scheduler asks an agent to perform one step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StepRequest {
    pub order_id: OrderId,
    pub step: String,
    pub step_index: usize,
    /// The action the remote service performs (the step's name).
    pub action: String,
    pub attempt: u64,
    /// This request undoes the step (compensation); `action` is the undo action and `payload`
    /// carries `undoes` (the step's idempotency key) and the step's `result`.
    #[serde(default)]
    pub undo: bool,
    /// The key to send to the remote service; absent in older messages, then derived.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// Past this instant the agent stops and sends nothing.
    pub complete_by: DateTime<Utc>,
    pub reply_queue_url: String,
    /// The order's content, for the remote service.
    pub payload: serde_json::Value,
}

impl StepRequest {
    /// The idempotency key the remote service sees: the same for every attempt of the same
    /// step of the same order, so a retried or re-run step takes effect once.
    pub fn idempotency_key(&self) -> String {
        self.idempotency_key
            .clone()
            .unwrap_or_else(|| idempotency_key(self.order_id, &self.step, &self.action, 0))
    }
}

/// An agent's answer to a [`StepRequest`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StepReply {
    pub order_id: OrderId,
    pub step: String,
    pub step_index: usize,
    pub attempt: u64,
    /// Answers the step's undo, not the step.
    #[serde(default)]
    pub undo: bool,
    pub outcome: StepOutcome,
}

/// A status message of an order: published to the event bus (detail-type `Order<Status>`, e.g.
/// `OrderFailed`, the operator alert) and sent to the order's reply queue if it has one.
/// Delivery is at least once and, across statuses, in order of `sequence` (the record version
/// that produced it): consumers deduplicate on (`orderId`, `status`, `sequence`) and may reorder
/// on `sequence`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OrderNotice {
    pub order_id: OrderId,
    pub status: Status,
    pub process_state: ProcessState,
    pub step: Option<String>,
    pub attempt: u64,
    pub failure_count: u32,
    pub last_error: Option<String>,
    pub sequence: u64,
    pub at: DateTime<Utc>,
}

/// The event source of everything sas publishes.
pub const EVENT_SOURCE: &str = "sas.orders";

impl OrderNotice {
    pub fn of(r: &StateRecord, status: Status) -> Self {
        Self {
            order_id: r.order_id,
            status,
            process_state: r.process_state,
            step: r.steps.get(r.step_index).map(|s| s.name.clone()),
            attempt: r.attempt,
            failure_count: r.failure_count,
            last_error: r.last_error.clone(),
            sequence: r.version,
            at: r.updated_at,
        }
    }

    /// The EventBridge `detail-type`.
    pub fn detail_type(&self) -> &'static str {
        self.status.detail_type()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scheduler_messages_are_tagged_by_type() {
        let id = OrderId::new_random();
        let work =
            serde_json::to_value(SchedulerMessage::Work(WorkMessage::new(id))).expect("serializes");
        assert_eq!(work["type"], "work");
        assert_eq!(work["orderId"], id.to_string());
        let reply: SchedulerMessage = serde_json::from_value(serde_json::json!({
            "type": "reply", "orderId": id, "step": "charge-payment", "stepIndex": 1,
            "attempt": 2, "outcome": {"status": "failed", "error": "declined"}
        }))
        .expect("parses");
        let SchedulerMessage::Reply(r) = reply else {
            panic!("not a reply")
        };
        assert_eq!(
            r.outcome,
            StepOutcome::Failed {
                error: "declined".into()
            }
        );
    }
}
