//! The JSON bodies that travel on the queues and the event bus. Every message that can be
//! answered late carries the `attempt` (fencing token) and `stepIndex` it belongs to.

use crate::domain::transition::StepOutcome;
use crate::domain::{OrderId, ProcessState, StateRecord};
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

/// "This order needs a scheduler": sent by submission and by the supervisor's recoveries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkMessage {
    pub order_id: OrderId,
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
        format!("{}:{}:{}", self.order_id, self.step, self.action)
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
    pub outcome: StepOutcome,
}

/// The terminal notice of an order: published to the event bus (`OrderProcessed`,
/// `OrderFailed` - the operator alert) and sent to the order's reply queue if it has one.
/// Delivery is at least once: consumers deduplicate on (`orderId`, `processState`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OrderNotice {
    pub order_id: OrderId,
    pub process_state: ProcessState,
    pub step: Option<String>,
    pub attempt: u64,
    pub failure_count: u32,
    pub last_error: Option<String>,
}

/// The event source of everything sas publishes.
pub const EVENT_SOURCE: &str = "sas.orders";

impl OrderNotice {
    pub fn of(r: &StateRecord) -> Self {
        Self {
            order_id: r.order_id,
            process_state: r.process_state,
            step: r.steps.get(r.step_index).map(|s| s.name.clone()),
            attempt: r.attempt,
            failure_count: r.failure_count,
            last_error: r.last_error.clone(),
        }
    }

    /// The EventBridge `detail-type`.
    pub fn detail_type(&self) -> &'static str {
        match self.process_state {
            ProcessState::Error => "OrderFailed",
            _ => "OrderProcessed",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scheduler_messages_are_tagged_by_type() {
        let id = OrderId::new_random();
        let work = serde_json::to_value(SchedulerMessage::Work(WorkMessage { order_id: id }))
            .expect("serializes");
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
