//! The supervisor: finds records whose deadline passed (through the sparse due index, never a
//! scan), and hands them back for retry, fails them, or re-delivers their notice.

use super::start::Dispatch;
use super::{HandlerError, TaskPorts, deliver_notice, perform_no_step, write};
use crate::domain::transition::{self, Transition};
use crate::domain::{NoticeKind, TaskId};
use crate::messages::DeadlineTimer;
use crate::ports::{DueQuery, LeaseClaim};
use chrono::{DateTime, Utc};
use rand::Rng;
use serde::Serialize;
use tracing::{Instrument, error, info, info_span, warn};

#[derive(Clone)]
pub struct SupervisorDeps {
    /// The store, queue, bus, clock, definitions, work queue and metrics.
    pub ports: TaskPorts,
    /// How the sweep reads and works through the due index.
    pub sweep: SweepSettings,
    /// The deadline-timer queue, to re-arm timers that arrive early (deadlines past 15 min).
    pub timer_queue_url: Option<String>,
    /// Where poison timer messages go.
    pub dead_letter_url: Option<String>,
    /// This supervisor instance's id: the owner of the shard leases it takes.
    pub instance_id: String,
    /// How long a shard's sweep lease lasts: longer than one sweep takes, so a dead holder
    /// stops blocking that shard after at most this long.
    pub lease_ttl: chrono::Duration,
    /// The scheduler's outlets, where the end of a wait claims the next step in the same write
    /// and sends its request, as the task API claims first steps: no work message. `None`: the
    /// work message.
    pub dispatch: Option<std::sync::Arc<super::scheduler::SchedulerDeps>>,
}

/// How a sweep works through the due index.
#[derive(Debug, Clone, Copy)]
pub struct SweepSettings {
    /// Entries read by one due-index query (one page).
    pub page_size: usize,
    /// Recoveries in flight at once, across every shard.
    pub concurrency: usize,
    /// How long one sweep keeps paging: less than the function's timeout and the shard lease's
    /// TTL, so a sweep ends (and releases its leases) before either runs out. What is left is
    /// the next sweep's.
    pub budget: chrono::Duration,
    /// How far ahead a sweep looks (the sweep's interval): a record due within it gets a
    /// deadline timer for its time (when timers are on), so a deadline past SQS's 15-minute
    /// delay (a long wait, a delayed start) is still met on the dot, not up to a sweep late.
    /// Zero: off.
    pub look_ahead: chrono::Duration,
}

impl Default for SweepSettings {
    fn default() -> Self {
        Self {
            page_size: 100,
            concurrency: 32,
            budget: chrono::Duration::seconds(60),
            look_ahead: chrono::Duration::seconds(60),
        }
    }
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
    /// Final tasks whose retention ended: their payloads and items deleted.
    pub purged: usize,
    /// Records no longer due, or recovered by another supervisor first.
    pub skipped: usize,
    /// Records whose recovery failed; they stay due and are retried next sweep. The sweep pages
    /// past them: a record that always fails never blocks the records behind it.
    pub errors: usize,
    /// Shards skipped because another supervisor holds their lease.
    pub leased_elsewhere: usize,
    /// Shards whose sweep stopped at the budget with due records left for the next sweep.
    pub cut_short: usize,
    /// Due-index queries made.
    pub pages: usize,
    /// Deadline timers armed for records due within the look-ahead.
    pub armed: usize,
    /// Due-index queries of the look-ahead (beyond `pages`).
    pub ahead_pages: usize,
}

impl SweepReport {
    fn add(&mut self, o: &Self) {
        self.due += o.due;
        self.retried += o.retried;
        self.requeued += o.requeued;
        self.failed += o.failed;
        self.notices += o.notices;
        self.purged += o.purged;
        self.skipped += o.skipped;
        self.errors += o.errors;
        self.leased_elsewhere += o.leased_elsewhere;
        self.cut_short += o.cut_short;
        self.pages += o.pages;
        self.armed += o.armed;
        self.ahead_pages += o.ahead_pages;
    }
}

enum Recovered {
    Retried,
    Requeued,
    Failed,
    Notice,
    Purged,
    Skipped,
}

/// One sweep over every shard of the due index: the shards side by side, each under its lease
/// and paged to the end of what was due when the sweep began (or to the budget), with at most
/// `concurrency` recoveries in flight. Every recovery re-reads its record and writes
/// conditionally, so running them concurrently (and alongside other supervisors' timers) is as
/// safe as running them one by one.
pub async fn sweep(deps: &SupervisorDeps) -> Result<SweepReport, HandlerError> {
    let now = deps.ports.clock.now();
    let sweep = Sweep {
        deps,
        now,
        stop_at: now + deps.sweep.budget,
        permits: tokio::sync::Semaphore::new(deps.sweep.concurrency.max(1)),
    };
    let shards = (0..deps.ports.store.due_shards()).map(|shard| sweep_shard(&sweep, shard));
    let mut report = SweepReport::default();
    let mut failure = None;
    for result in futures::future::join_all(shards).await {
        match result {
            Ok(r) => report.add(&r),
            Err(e) => {
                error!(error = %e, "a shard's sweep failed; its records stay due");
                failure.get_or_insert(e);
            }
        }
    }
    if report.due > 0 || failure.is_some() {
        info!(?report, "sweep done");
    }
    if let Some(e) = failure {
        return Err(e);
    }
    // The supervisor's heartbeat: an alarm fires when sweeps stop.
    deps.ports.metrics.count("SweepsCompleted", &[]);
    Ok(report)
}

/// One sweep's frame, shared by its shards: what is due at `now` is recovered until `stop_at`,
/// at most `permits` recoveries at once.
struct Sweep<'a> {
    deps: &'a SupervisorDeps,
    now: DateTime<Utc>,
    stop_at: DateTime<Utc>,
    permits: tokio::sync::Semaphore,
}

/// One shard of a sweep, under its lease.
async fn sweep_shard(sweep: &Sweep<'_>, shard: u32) -> Result<SweepReport, HandlerError> {
    let Sweep { deps, now, .. } = *sweep;
    let lease = format!("sweep#{shard}");
    if !deps
        .ports
        .store
        .acquire_lease(LeaseClaim {
            name: &lease,
            owner: &deps.instance_id,
            now,
            ttl: deps.lease_ttl,
        })
        .await?
    {
        info!(shard, "another supervisor is sweeping this shard");
        return Ok(SweepReport {
            leased_elsewhere: 1,
            ..SweepReport::default()
        });
    }
    let drained = drain_shard(sweep, shard).await;
    // Crash point: a supervisor that dies before this keeps the shard until the lease
    // expires; then another takes it over.
    let released = deps
        .ports
        .store
        .release_lease(&lease, &deps.instance_id)
        .await;
    let report = drained?;
    released?;
    Ok(report)
}

/// Pages through one shard's records due at the sweep's `now`, recovering each page
/// concurrently.
async fn drain_shard(sweep: &Sweep<'_>, shard: u32) -> Result<SweepReport, HandlerError> {
    let Sweep {
        deps,
        now,
        stop_at,
        ref permits,
    } = *sweep;
    let page_size = deps.sweep.page_size.max(1);
    let mut report = SweepReport::default();
    let mut after = None;
    loop {
        if deps.ports.clock.now() >= stop_at {
            warn!(
                shard,
                "sweep budget spent; the rest of the shard is the next sweep's"
            );
            report.cut_short += 1;
            return Ok(report);
        }
        let query = DueQuery {
            shard,
            now,
            limit: page_size,
            after: after.as_ref(),
        };
        let page = deps.ports.store.due(query).await?;
        report.pages += 1;
        report.due += page.len();
        // The next page starts after this one, whatever became of its entries: a record that
        // fails (or is no longer due) is not read again in this sweep.
        after = page.last().copied();
        let recoveries = page.iter().map(|entry| async move {
            let id = entry.task_id;
            let _permit = permits.acquire().await;
            let span = info_span!("recover", task_id = %id, workflow = tracing::field::Empty, attempt = tracing::field::Empty);
            // Each recovery judges its deadline at its own time, not the sweep's start.
            let at = deps.ports.clock.now();
            (id, recover(deps, id, at, "sweep").instrument(span).await)
        });
        for (id, outcome) in futures::future::join_all(recoveries).await {
            match outcome {
                Ok(Recovered::Retried) => report.retried += 1,
                Ok(Recovered::Requeued) => report.requeued += 1,
                Ok(Recovered::Failed) => report.failed += 1,
                Ok(Recovered::Notice) => report.notices += 1,
                Ok(Recovered::Purged) => report.purged += 1,
                Ok(Recovered::Skipped) => report.skipped += 1,
                Err(e) => {
                    error!(task_id = %id, error = %e, "recovery failed; will retry next sweep");
                    report.errors += 1;
                }
            }
        }
        if page.len() < page_size {
            look_ahead(sweep, shard, after, &mut report).await?;
            return Ok(report);
        }
    }
}

/// After a shard is drained: a deadline timer for each record due within the look-ahead, at its
/// own deadline (read from the record: its due-index key may be up to a minute early).
/// Best effort, as every timer: one that is lost leaves the record to the next sweep.
async fn look_ahead(
    sweep: &Sweep<'_>,
    shard: u32,
    mut after: Option<crate::ports::DueEntry>,
    report: &mut SweepReport,
) -> Result<(), HandlerError> {
    let Sweep { deps, now, .. } = *sweep;
    let ahead = deps.sweep.look_ahead;
    let Some(url) = deps.timer_queue_url.as_deref() else {
        return Ok(());
    };
    if ahead <= chrono::Duration::zero() {
        return Ok(());
    }
    let page_size = deps.sweep.page_size.max(1);
    loop {
        let query = DueQuery {
            shard,
            now: now + ahead,
            limit: page_size,
            after: after.as_ref(),
        };
        let page = deps.ports.store.due(query).await?;
        report.ahead_pages += 1;
        after = page.last().copied();
        for entry in page.iter().filter(|e| e.due_at > now) {
            let Some(record) = deps.ports.store.get_state(entry.task_id).await? else {
                continue;
            };
            let Some(due) = record.due_at().filter(|d| *d > now && *d <= now + ahead) else {
                continue;
            };
            let timer = DeadlineTimer::of(&record, due);
            match super::scheduler::arm(deps.ports.queue.as_ref(), url, &timer, now).await {
                Ok(()) => report.armed += 1,
                Err(e) => {
                    warn!(task_id = %record.task_id, error = %e, "look-ahead timer not armed; the next sweep finds it")
                }
            }
        }
        if page.len() < page_size {
            return Ok(());
        }
    }
}

async fn recover(
    deps: &SupervisorDeps,
    id: TaskId,
    now: DateTime<Utc>,
    cause: &str,
) -> Result<Recovered, HandlerError> {
    let Some(record) = deps.ports.store.get_state(id).await? else {
        return Ok(Recovered::Skipped);
    };
    tracing::Span::current().record("attempt", record.attempt);
    tracing::Span::current().record("workflow", record.workflow.as_str());
    if record.notice_pending() {
        deliver_notice(&deps.ports, &record).await?;
        return Ok(Recovered::Notice);
    }
    if record.purge_due(now) {
        return purge(deps, &record).await;
    }
    if record.run.is_some() {
        // A run is not a step out: its check opens again what it has out.
        return Ok(if super::runs::recheck(&deps.ports, &record).await? {
            Recovered::Requeued
        } else {
            Recovered::Skipped
        });
    }
    let jitter = rand::rng().random::<f64>();
    let workflow = super::workflow_of(&deps.ports.definitions, &record).await?;
    let t = match transition::expire(&record, now, &workflow.policies(), jitter) {
        Ok(t) => t,
        Err(why) => {
            info!(%why, "no longer due");
            if cause == "timer" {
                rearm(deps, &record, now).await;
            }
            return Ok(Recovered::Skipped);
        }
    };
    let (t, claimed) = with_claim(deps, &record, &workflow, t).await?;
    if !write(deps.ports.store.as_ref(), &t).await? {
        info!("recovered by someone else first");
        return Ok(Recovered::Skipped);
    }
    super::count_outcome(&deps.ports.metrics, record.process_state, &t);
    // A task never claimed in time is a pickup recovery, whoever found it.
    let cause = if record.process_state == crate::ProcessState::Pending {
        "pickup"
    } else {
        cause
    };
    deps.ports.metrics.count(
        "Recoveries",
        &[("Workflow", record.workflow.as_str()), ("Cause", cause)],
    );
    let outcome = if t.record.outbox.iter().any(|o| {
        matches!(
            o.status,
            NoticeKind::Failed | NoticeKind::CompensationFailed
        )
    }) {
        warn!(failure_count = t.record.failure_count, state = %t.record.process_state, last_error = t.record.last_error.as_deref().unwrap_or(""), "failure threshold reached");
        Recovered::Failed
    } else if t.record.failure_count != record.failure_count || t.record.round != record.round {
        warn!(
            failure_count = t.record.failure_count,
            round = t.record.round,
            last_error = t.record.last_error.as_deref().unwrap_or(""),
            "deadline expired; handed back for retry"
        );
        Recovered::Retried
    } else {
        info!("pickup deadline passed; work message re-enqueued");
        Recovered::Requeued
    };
    match claimed {
        // Claimed here: the step's request and its timer go out as the scheduler sends them (a
        // crash before leaves the claim to its deadline, in the due index).
        Some((dispatch, task)) => {
            info!(
                step = t.record.current_step().unwrap_or("-"),
                "claimed by the supervisor"
            );
            dispatch.perform(&task, &workflow, &t).await?
        }
        None => perform_no_step(&deps.ports.outlets(), &t).await?,
    }
    Ok(outcome)
}

/// `t` with the claim of the step it sends the task on to, where it hands the task back at
/// once (the end of a wait) and the supervisor has the scheduler's outlets
/// ([`transition::claimed_in_place`]); with the outlets and the task (the claim maps its
/// input) when it was made. The task is read with the record, which must be the one `t` was
/// made from (else `t` goes as it is).
#[allow(clippy::type_complexity)]
async fn with_claim(
    deps: &SupervisorDeps,
    record: &crate::StateRecord,
    workflow: &crate::domain::Workflow,
    t: Transition,
) -> Result<
    (
        Transition,
        Option<(
            std::sync::Arc<super::scheduler::SchedulerDeps>,
            crate::domain::Task,
        )>,
    ),
    HandlerError,
> {
    let on = transition::goes_on_at_once(record, &t);
    let Some(dispatch) = deps.dispatch.as_ref().filter(|d| on && d.calls_back()) else {
        return Ok((t, None));
    };
    let Some((task, read)) = deps.ports.store.get(record.task_id).await? else {
        return Ok((t, None));
    };
    if read.version != record.version {
        return Ok((t, None));
    }
    let router = transition::TaskRouter {
        workflow,
        task: &task,
    };
    let t = transition::claimed_in_place(
        record,
        t,
        dispatch.instance_id(),
        deps.ports.clock.now(),
        &workflow.policies(),
        &router,
    );
    if t.record.attempt > record.attempt {
        Ok((t, Some((dispatch.clone(), task))))
    } else {
        Ok((t, None))
    }
}

/// A task's deadline timer came with a request still out whose deadline is later (the timer
/// was armed for an earlier step's, or for a fan-out's request that has answered since: one
/// timer per task, see `StateRecord::timer_at`): it is armed again for the earliest request
/// out, unless a later timer is armed already. A callback step waiting for its callback and a
/// wait arm none here (the sweep's, or their own). Best effort, as every timer: one not armed
/// leaves the deadline to the sweep.
async fn rearm(deps: &SupervisorDeps, record: &crate::domain::StateRecord, now: DateTime<Utc>) {
    let (Some(url), Some(deadline), Some(armed)) = (
        &deps.timer_queue_url,
        record.timer_deadline(),
        record.timer_at,
    ) else {
        return;
    };
    // Under a fan-out the deadline is a request's out; on a line, the step's (or undo's) if
    // it is out.
    let out = record.fanout.is_some()
        || record.locked_by.is_some()
            && record
                .steps
                .get(record.step_index)
                .is_some_and(|step| match record.process_state {
                    crate::ProcessState::Processing => step.status == crate::StepStatus::Running,
                    crate::ProcessState::Compensating => {
                        step.undo == Some(crate::StepStatus::Running)
                    }
                    _ => false,
                });
    let later_armed = armed > now;
    let due = deadline <= now;
    if !out || later_armed || due {
        return;
    }
    let timer = DeadlineTimer::of(record, deadline);
    match super::scheduler::arm(deps.ports.queue.as_ref(), url, &timer, now).await {
        Ok(()) => info!(complete_by = %deadline, "timer armed again for the step out"),
        Err(e) => {
            warn!(error = %e, "deadline timer not armed again; the sweep will find the deadline")
        }
    }
}

/// The end of a final task's retention, for a task with payloads kept by reference
/// ([`crate::domain::StateRecord::purge_at`]): its objects are deleted, then its items. A crash
/// in between leaves its record due: the next sweep deletes what is left (no object, then the
/// items). Deleting the objects first never leaves one that nothing names.
async fn purge(
    deps: &SupervisorDeps,
    record: &crate::domain::StateRecord,
) -> Result<Recovered, HandlerError> {
    let objects = deps
        .ports
        .payloads
        .delete_task(record.task_id)
        .await
        .map_err(crate::payloads::store_error)?;
    // Condition (the store's): the record is at the version read - keeps "a task is forgotten
    // only as it was when its payloads were deleted".
    match deps.ports.store.forget_task(record).await {
        Ok(()) => {}
        Err(crate::ports::StoreError::ConditionFailed) => {
            info!("moved on before its purge");
            return Ok(Recovered::Skipped);
        }
        Err(e) => return Err(e.into()),
    }
    info!(objects, "retention ended: payloads and task deleted");
    Ok(Recovered::Purged)
}

/// Handles one batch of deadline timers (SQS, partial batch responses).
pub async fn handle_timers(
    deps: &SupervisorDeps,
    event: aws_lambda_events::event::sqs::SqsEvent,
) -> aws_lambda_events::event::sqs::SqsBatchResponse {
    super::process_batch(
        event,
        deps.ports.queue.as_ref(),
        deps.dead_letter_url.as_deref(),
        (&deps.ports.metrics, "supervisor"),
        |body| async move { on_timer(deps, &body).await },
    )
    .await
}

/// One deadline timer: a no-op if the step finished, a recovery of that one record if its
/// deadline passed, a re-arm if the timer came early.
pub async fn on_timer(deps: &SupervisorDeps, body: &str) -> super::RecordOutcome {
    let timer: DeadlineTimer = match serde_json::from_str(body) {
        Ok(t) => t,
        Err(e) => return super::RecordOutcome::Poison(format!("not a deadline timer: {e}")),
    };
    let span = info_span!("timer", task_id = %timer.task_id, workflow = tracing::field::Empty, attempt = timer.attempt);
    async {
        let now = deps.ports.clock.now();
        if timer.complete_by > now {
            let Some(url) = &deps.timer_queue_url else {
                return Ok(());
            };
            info!(complete_by = %timer.complete_by, "early timer re-armed");
            return super::scheduler::arm(deps.ports.queue.as_ref(), url, &timer, now).await;
        }
        match recover(deps, timer.task_id, now, "timer").await? {
            Recovered::Skipped => info!("timer: nothing to recover"),
            Recovered::Purged => info!("timer: retention ended"),
            _ => info!("timer: deadline recovered"),
        }
        Ok(())
    }
    .instrument(span)
    .await
    .into()
}

/// What one invocation of the supervisor function did.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum Invocation {
    /// A batch from the timer queue (the partial batch response for the event source mapping).
    Timers(aws_lambda_events::event::sqs::SqsBatchResponse),
    /// A scheduled sweep.
    Sweep(SweepReport),
}

/// The function's one entry point: a batch of deadline timers (an SQS event, with `Records`) or
/// a scheduled event (a sweep).
pub async fn invoke(
    deps: &SupervisorDeps,
    payload: serde_json::Value,
) -> Result<Invocation, HandlerError> {
    if payload.get("Records").is_some() {
        let event = serde_json::from_value(payload)
            .map_err(|e| HandlerError::Poison(format!("not an SQS event: {e}")))?;
        return Ok(Invocation::Timers(handle_timers(deps, event).await));
    }
    let event = serde_json::from_value(payload)
        .map_err(|e| HandlerError::Poison(format!("not a scheduled event: {e}")))?;
    Ok(Invocation::Sweep(handle(deps, event).await?))
}

/// The Lambda entry: one sweep per scheduled event (EventBridge `Scheduled Event`).
pub async fn handle(
    deps: &SupervisorDeps,
    event: aws_lambda_events::event::eventbridge::EventBridgeEvent<serde_json::Value>,
) -> Result<SweepReport, HandlerError> {
    let span = info_span!("sweep", event_id = event.id.as_deref().unwrap_or_default());
    sweep(deps).instrument(span).await
}
