//! The supervisor: finds records whose deadline passed (through the sparse due index, never a
//! scan), and hands them back for retry, fails them, or re-delivers their notice.

use super::{HandlerError, Outlets, deliver_notice, perform, write};
use crate::domain::transition;
use crate::domain::{OrderId, Policy, Status};
use crate::ports::{Clock, EventBus, Queue, StateStore};
use chrono::{DateTime, Utc};
use rand::Rng;
use serde::Serialize;
use std::sync::Arc;
use tracing::{Instrument, error, info, info_span, warn};

#[derive(Clone)]
pub struct SupervisorDeps {
    pub store: Arc<dyn StateStore>,
    pub queue: Arc<dyn Queue>,
    pub events: Arc<dyn EventBus>,
    pub clock: Arc<dyn Clock>,
    pub policy: Policy,
    pub work_queue_url: String,
    /// Most records taken from each shard per sweep; the rest wait for the next sweep.
    pub batch_limit: usize,
}

/// What one sweep did.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SweepReport {
    /// Records the due index returned.
    pub due: usize,
    /// Processing records handed back as Pending for retry.
    pub retried: usize,
    /// Pending records whose work message was re-enqueued.
    pub requeued: usize,
    /// Records failed for good at the threshold.
    pub failed: usize,
    /// Terminal notices (re)delivered.
    pub notices: usize,
    /// Records no longer due, or recovered by another supervisor first.
    pub skipped: usize,
    /// Records whose recovery failed; they stay due and are retried next sweep.
    pub errors: usize,
}

enum Recovered {
    Retried,
    Requeued,
    Failed,
    Notice,
    Skipped,
}

/// One sweep over every shard of the due index.
pub async fn sweep(deps: &SupervisorDeps) -> Result<SweepReport, HandlerError> {
    let now = deps.clock.now();
    let mut report = SweepReport::default();
    for shard in 0..deps.store.due_shards() {
        let due = deps.store.due(shard, now, deps.batch_limit).await?;
        report.due += due.len();
        for id in due {
            let span = info_span!("recover", order_id = %id, attempt = tracing::field::Empty);
            match recover(deps, id, now).instrument(span).await {
                Ok(Recovered::Retried) => report.retried += 1,
                Ok(Recovered::Requeued) => report.requeued += 1,
                Ok(Recovered::Failed) => report.failed += 1,
                Ok(Recovered::Notice) => report.notices += 1,
                Ok(Recovered::Skipped) => report.skipped += 1,
                Err(e) => {
                    error!(order_id = %id, error = %e, "recovery failed; will retry next sweep");
                    report.errors += 1;
                }
            }
        }
    }
    if report.due > 0 {
        info!(?report, "sweep done");
    }
    Ok(report)
}

async fn recover(
    deps: &SupervisorDeps,
    id: OrderId,
    now: DateTime<Utc>,
) -> Result<Recovered, HandlerError> {
    let Some(record) = deps.store.get_state(id).await? else {
        return Ok(Recovered::Skipped);
    };
    tracing::Span::current().record("attempt", record.attempt);
    if record.notice_pending() {
        deliver_notice(
            deps.store.as_ref(),
            deps.queue.as_ref(),
            deps.events.as_ref(),
            deps.clock.as_ref(),
            &record,
        )
        .await?;
        return Ok(Recovered::Notice);
    }
    let jitter = rand::rng().random::<f64>();
    let t = match transition::expire(&record, now, &deps.policy, jitter) {
        Ok(t) => t,
        Err(why) => {
            info!(%why, "no longer due");
            return Ok(Recovered::Skipped);
        }
    };
    if !write(deps.store.as_ref(), &t).await? {
        info!("recovered by someone else first");
        return Ok(Recovered::Skipped);
    }
    let outcome = if t
        .record
        .outbox
        .iter()
        .any(|s| matches!(s, Status::Failed | Status::CompensationFailed))
    {
        warn!(failure_count = t.record.failure_count, state = %t.record.process_state, last_error = ?t.record.last_error, "failure threshold reached");
        Recovered::Failed
    } else if t.record.failure_count != record.failure_count || t.record.round != record.round {
        warn!(failure_count = t.record.failure_count, round = t.record.round, last_error = ?t.record.last_error, "deadline expired; handed back for retry");
        Recovered::Retried
    } else {
        info!("pickup deadline passed; work message re-enqueued");
        Recovered::Requeued
    };
    let outlets = Outlets {
        store: deps.store.as_ref(),
        queue: deps.queue.as_ref(),
        events: deps.events.as_ref(),
        clock: deps.clock.as_ref(),
        work_queue_url: &deps.work_queue_url,
    };
    perform(
        &outlets,
        &t,
        None::<fn() -> std::future::Ready<Result<(), HandlerError>>>,
    )
    .await?;
    Ok(outcome)
}

/// The Lambda entry: one sweep per scheduled event (EventBridge `Scheduled Event`).
pub async fn handle(
    deps: &SupervisorDeps,
    event: aws_lambda_events::event::eventbridge::EventBridgeEvent<serde_json::Value>,
) -> Result<SweepReport, HandlerError> {
    let span = info_span!("sweep", event_id = event.id.as_deref().unwrap_or_default());
    sweep(deps).instrument(span).await
}
