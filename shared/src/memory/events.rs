use crate::ports::{EventBus, PublishError};
use async_trait::async_trait;
use serde_json::Value;
use std::sync::Mutex;

/// An event bus that keeps what was published, in order.
#[derive(Debug, Default)]
pub struct MemoryEventBus {
    events: Mutex<Vec<(String, serde_json::Value)>>,
}

impl MemoryEventBus {
    /// Every (detail-type, detail) published so far.
    pub fn published(&self) -> Vec<(String, serde_json::Value)> {
        self.events.lock().map(|e| e.clone()).unwrap_or_default()
    }
}

#[async_trait]
impl EventBus for MemoryEventBus {
    async fn publish(&self, detail_type: &str, detail: &Value) -> Result<(), PublishError> {
        self.events
            .lock()
            .map_err(|_| PublishError("memory bus lock poisoned".into()))?
            .push((detail_type.to_owned(), detail.clone()));
        Ok(())
    }
}
