//! The four functions' logic as plain async functions over the ports: the Lambda `main`s, the
//! local runner and the tests all call these.

pub mod agent;
pub mod scheduler;
pub mod submission;
pub mod supervisor;

use crate::domain::transition::notice_delivered;
use crate::domain::{StateRecord, Transition};
use crate::messages::OrderNotice;
use crate::ports::{Clock, EventBus, PublishError, Queue, QueueError, StateStore, StoreError};
use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use std::future::Future;
use std::time::Duration;
use tracing::{error, info, warn};

/// Why handling a message or a sweep step failed.
#[derive(Debug, thiserror::Error)]
pub enum HandlerError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Queue(#[from] QueueError),
    #[error(transparent)]
    Publish(#[from] PublishError),
    /// The message can never be processed (unknown order, inconsistent with the workflow).
    #[error("poison message: {0}")]
    Poison(String),
    /// The deployment is missing something the message needs (e.g. an agent's queue URL).
    #[error("configuration: {0}")]
    Config(String),
}

/// What became of one SQS record.
#[derive(Debug)]
pub enum RecordOutcome {
    /// Processed, or dropped on purpose (duplicate, stale): delete it.
    Done,
    /// Can never be processed: move it to the dead-letter queue and delete it.
    Poison(String),
    /// Failed for a reason that may pass: leave it for redelivery.
    Retry(String),
}

impl From<Result<(), HandlerError>> for RecordOutcome {
    fn from(r: Result<(), HandlerError>) -> Self {
        match r {
            Ok(()) => Self::Done,
            Err(HandlerError::Poison(why)) => Self::Poison(why),
            Err(e) => Self::Retry(e.to_string()),
        }
    }
}

/// Runs `f` on every record of an SQS batch concurrently and builds the partial batch response
/// (`ReportBatchItemFailures`): records to retry are reported; poison records are copied to the
/// dead-letter queue `poison_url` and acknowledged (or reported, so that SQS's own redrive moves
/// them, if there is no such queue or the copy fails).
pub async fn process_batch<'a, F, Fut>(
    event: SqsEvent,
    queue: &'a dyn Queue,
    poison_url: Option<&'a str>,
    f: F,
) -> SqsBatchResponse
where
    F: Fn(String) -> Fut,
    Fut: Future<Output = RecordOutcome>,
{
    let work = event.records.into_iter().map(|record| {
        let id = record.message_id.clone().unwrap_or_default();
        let body = record.body.unwrap_or_default();
        let fut = f(body.clone());
        async move {
            let keep = match fut.await {
                RecordOutcome::Done => false,
                RecordOutcome::Retry(why) => {
                    warn!(message_id = %id, %why, "message left for redelivery");
                    true
                }
                RecordOutcome::Poison(why) => match poison_url {
                    Some(dlq) => match queue.send(dlq, &body, Duration::ZERO).await {
                        Ok(()) => {
                            error!(message_id = %id, %why, "poison message moved to the dead-letter queue");
                            false
                        }
                        Err(e) => {
                            error!(message_id = %id, %why, error = %e, "poison message could not be moved; left for redrive");
                            true
                        }
                    },
                    None => {
                        error!(message_id = %id, %why, "poison message left for redrive (no dead-letter queue configured)");
                        true
                    }
                },
            };
            keep.then_some(id)
        }
    });
    let mut response = SqsBatchResponse::default();
    response.set_failures(futures::future::join_all(work).await.into_iter().flatten());
    response
}

/// Writes a transition's record under its condition. `Ok(false)`: the condition failed because
/// another writer moved the record first, which callers treat as a normal race, not an error.
pub(crate) async fn write(store: &dyn StateStore, t: &Transition) -> Result<bool, HandlerError> {
    match store.put(&t.record, &t.condition).await {
        Ok(()) => Ok(true),
        Err(StoreError::ConditionFailed) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Delivers a terminal record's notice (the outbox) and clears the flag.
///
/// The event goes to the bus first (`OrderFailed` is the operator alert; delivery is at least
/// once, consumers deduplicate on order id and state). The copy to the order's own reply queue
/// is best effort: that URL comes from the application and a bad one must not keep the record
/// in the outbox forever, so a failure there is logged and not retried.
pub async fn deliver_notice(
    store: &dyn StateStore,
    queue: &dyn Queue,
    events: &dyn EventBus,
    clock: &dyn Clock,
    record: &StateRecord,
) -> Result<(), HandlerError> {
    let notice = OrderNotice::of(record);
    let detail = serde_json::to_value(&notice)
        .map_err(|e| HandlerError::Poison(format!("notice does not serialize: {e}")))?;
    events.publish(notice.detail_type(), &detail).await?;
    if notice.detail_type() == "OrderFailed" {
        warn!(order_id = %record.order_id, attempt = record.attempt, last_error = ?record.last_error, "operator alert: order failed");
    }
    if let Some(url) = &record.reply_queue_url
        && let Err(e) = queue.send(url, &detail.to_string(), Duration::ZERO).await
    {
        error!(order_id = %record.order_id, error = %e, "could not send the notice to the order's reply queue");
    }
    let Ok(t) = notice_delivered(record, clock.now()) else {
        return Ok(());
    };
    // A lost race with another deliverer means the notice went out twice, which consumers
    // tolerate; the flag is cleared either way.
    write(store, &t).await?;
    info!(state = %record.process_state, "notice delivered");
    Ok(())
}
