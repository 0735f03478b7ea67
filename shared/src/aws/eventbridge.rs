use super::Described;
use crate::messages::EVENT_SOURCE;
use crate::ports::{EventBus, PublishError};
use async_trait::async_trait;
use aws_sdk_eventbridge::types::PutEventsRequestEntry;
use serde_json::Value;

/// Publishes to an EventBridge bus with source `sas.tasks`.
#[derive(Debug, Clone)]
pub struct EventBridgeBus {
    client: aws_sdk_eventbridge::Client,
    bus_name: String,
}

impl EventBridgeBus {
    pub fn new(client: aws_sdk_eventbridge::Client, bus_name: impl Into<String>) -> Self {
        Self {
            client,
            bus_name: bus_name.into(),
        }
    }
}

#[async_trait]
impl EventBus for EventBridgeBus {
    async fn publish(&self, detail_type: &str, detail: &Value) -> Result<(), PublishError> {
        let entry = PutEventsRequestEntry::builder()
            .event_bus_name(&self.bus_name)
            .source(EVENT_SOURCE)
            .detail_type(detail_type)
            .detail(detail.to_string())
            .build();
        let out = self
            .client
            .put_events()
            .entries(entry)
            .send()
            .await
            .described(PublishError)?;
        if out.failed_entry_count() > 0 {
            let why = out
                .entries()
                .iter()
                .filter_map(|e| e.error_message())
                .collect::<Vec<_>>()
                .join("; ");
            return Err(PublishError(format!("event rejected: {why}")));
        }
        Ok(())
    }
}
