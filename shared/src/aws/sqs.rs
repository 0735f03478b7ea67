use super::Described;
use crate::ports::{
    DeadLetter, FairMessage, GroupedMessage, Queue, QueueError, ReceiveRequest, ReceivedMessage,
};
use async_trait::async_trait;
use aws_sdk_sqs::types::MessageSystemAttributeName;

/// SQS queues, addressed by the URLs SQS returns (never built by hand).
#[derive(Debug, Clone)]
pub struct SqsQueue {
    client: aws_sdk_sqs::Client,
}

impl SqsQueue {
    pub fn new(client: aws_sdk_sqs::Client) -> Self {
        Self { client }
    }
}

#[async_trait]
impl Queue for SqsQueue {
    async fn send_grouped(&self, message: GroupedMessage<'_>) -> Result<(), QueueError> {
        // No `DelaySeconds`: SQS refuses a per-message delay on a FIFO queue. The ids go as
        // given: SQS refuses one it does not take, which the caller sees.
        self.client
            .send_message()
            .queue_url(message.queue_url)
            .message_body(message.body)
            .message_group_id(message.group)
            .message_deduplication_id(message.dedup_id)
            .send()
            .await
            .described(QueueError)?;
        Ok(())
    }

    async fn send_fair(&self, message: FairMessage<'_>) -> Result<(), QueueError> {
        // SQS delays are whole seconds up to 15 minutes: round up, never deliver early.
        let secs = message.delay.as_millis().div_ceil(1000).min(900) as i32;
        self.client
            .send_message()
            .queue_url(message.queue_url)
            .message_body(message.body)
            .delay_seconds(secs)
            .set_message_group_id(message.group.map(str::to_owned))
            .send()
            .await
            .described(QueueError)?;
        Ok(())
    }

    async fn send_dead_letter(&self, letter: DeadLetter<'_>) -> Result<(), QueueError> {
        // An attribute value is at most the message's size; a reason is short. Keep 1 KB.
        let reason: String = letter.reason.chars().take(1024).collect();
        let attribute = aws_sdk_sqs::types::MessageAttributeValue::builder()
            .data_type("String")
            .string_value(if reason.is_empty() {
                "unknown"
            } else {
                &reason
            })
            .build()
            .map_err(|e| QueueError(e.to_string()))?;
        self.client
            .send_message()
            .queue_url(letter.queue_url)
            .message_body(letter.body)
            .message_attributes(crate::ports::DEAD_LETTER_REASON, attribute)
            .send()
            .await
            .described(QueueError)?;
        Ok(())
    }

    async fn receive(&self, ask: ReceiveRequest<'_>) -> Result<Vec<ReceivedMessage>, QueueError> {
        let out = self
            .client
            .receive_message()
            .queue_url(ask.queue_url)
            .max_number_of_messages(ask.max.clamp(1, 10) as i32)
            .wait_time_seconds(ask.wait.as_secs().min(20) as i32)
            .message_system_attribute_names(MessageSystemAttributeName::ApproximateReceiveCount)
            .send()
            .await
            .described(QueueError)?;
        Ok(out
            .messages()
            .iter()
            .map(|m| ReceivedMessage {
                message_id: m.message_id().unwrap_or_default().to_owned(),
                receipt_handle: m.receipt_handle().unwrap_or_default().to_owned(),
                body: m.body().unwrap_or_default().to_owned(),
                receive_count: m
                    .attributes()
                    .and_then(|a| a.get(&MessageSystemAttributeName::ApproximateReceiveCount))
                    .and_then(|c| c.parse().ok())
                    .unwrap_or(1),
            })
            .collect())
    }

    async fn delete(&self, queue_url: &str, receipt_handle: &str) -> Result<(), QueueError> {
        self.client
            .delete_message()
            .queue_url(queue_url)
            .receipt_handle(receipt_handle)
            .send()
            .await
            .described(QueueError)?;
        Ok(())
    }
}
