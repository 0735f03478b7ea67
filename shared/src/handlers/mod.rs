//! The queue-driven functions' logic (scheduler, agent, supervisor) as plain async functions over
//! the ports, and the effects they share with the HTTP API ([`crate::api`]): the Lambda `main`s,
//! the local runner and the tests all call these.

pub mod agent;
pub mod children;
pub mod events;
pub mod runs;
pub mod scheduler;
pub mod start;
pub mod supervisor;

use crate::catalog::{CatalogError, Definitions};
use crate::domain::transition::{Effect, notice_delivered};
use crate::domain::{NoticeKind, ProcessState, StateRecord, Transition};
use crate::messages::{SchedulerMessage, TaskNotice, WorkMessage};
use crate::ports::StoreError;
use crate::ports::{Clock, DeadLetter, EventBus, PublishError, Queue, QueueError, StateStore};
use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tracing::{error, info, warn};

/// The workflow version a record runs on.
pub(crate) async fn workflow_of(
    definitions: &Definitions,
    record: &StateRecord,
) -> Result<std::sync::Arc<crate::Workflow>, HandlerError> {
    // A distributed forEach's run and its elements run the step's element view: one step; a
    // chunk of its elements, the chunk view (that step over the chunk's elements).
    let view_of = match (record.element_of(), &record.run, &record.parent) {
        (Some(e), _, _) => Some((e.step_index, e.first.is_some())),
        (None, Some(_), Some(link)) => Some((link.step_index, false)),
        _ => None,
    };
    match view_of {
        None => catalog_workflow(definitions, &record.workflow, record.workflow_version).await,
        Some((i, chunk)) => step_view(definitions, record, i, chunk).await,
    }
}

/// What the records of distributed forEach step `i` of `record`'s workflow version run: its
/// element view, or (`chunk`) its chunk view.
pub(crate) async fn step_view(
    definitions: &Definitions,
    record: &StateRecord,
    i: usize,
    chunk: bool,
) -> Result<std::sync::Arc<crate::Workflow>, HandlerError> {
    let w = catalog_workflow(definitions, &record.workflow, record.workflow_version).await?;
    let (view, missing) = if chunk {
        (w.chunk_view(i), "keeps no chunks")
    } else {
        (w.element_view(i), "is no distributed forEach")
    };
    view.ok_or_else(|| {
        HandlerError::Config(format!(
            "step {i} of workflow {} v{} {missing}",
            w.name, w.version
        ))
    })
}

/// A workflow version as the catalog holds it (whatever record runs on it).
pub(crate) async fn catalog_workflow(
    definitions: &Definitions,
    name: &str,
    version: u32,
) -> Result<std::sync::Arc<crate::Workflow>, HandlerError> {
    match definitions.workflow(name, version).await {
        Ok(Some(w)) => Ok(w),
        Ok(None) => Err(HandlerError::Config(format!(
            "workflow {name} v{version} is not in the catalog"
        ))),
        Err(CatalogError::Store(e)) => Err(e.into()),
        Err(CatalogError::Invalid(e)) => Err(HandlerError::Config(format!(
            "workflow {name} v{version} no longer validates: {e}"
        ))),
    }
}

/// How often [`release`] reads a record again after losing a race to another writer.
const RELEASE_RACES: usize = 5;

/// Releases one held record (a child, a run, an element): its retention starts.
pub(crate) async fn release(ports: &TaskPorts, id: crate::TaskId) -> Result<(), HandlerError> {
    for _ in 0..RELEASE_RACES {
        let Some(child) = ports.store.get_state(id).await? else {
            break;
        };
        let Ok(t) = crate::domain::transition::release_child(
            &child,
            ports.clock.now(),
            ports.store.retention(),
        ) else {
            // Not held: it ended otherwise, or was released already.
            break;
        };
        // Condition: the child as read (its state) - keeps "a child is kept while its
        // parent may undo it".
        if write(ports.store.as_ref(), &t).await? {
            // Its task item's expiry; its state record's came with the write.
            ports.store.expire_task(&t.record).await?;
            tracing::info!(child = %id, "released: its retention runs");
            break;
        }
    }
    Ok(())
}

/// Why handling a message or a sweep step failed.
#[derive(Debug, thiserror::Error)]
pub enum HandlerError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Queue(#[from] QueueError),
    #[error(transparent)]
    Publish(#[from] PublishError),
    /// The message can never be processed (unknown task, inconsistent with the workflow).
    #[error("poison message: {0}")]
    Poison(String),
    /// The deployment is missing something the message needs (e.g. an agent's queue URL).
    #[error("configuration: {0}")]
    Config(String),
}

/// What became of one SQS record.
#[derive(Debug, Clone)]
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
            // Never retried as if transient: five receives would fail five times the same way.
            Err(HandlerError::Store(StoreError::Rejected(why))) => {
                Self::Poison(format!("store_rejected: {why}"))
            }
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
    (metrics, function): (&'a crate::metrics::Metrics, &'a str),
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
            // Traced invocations get a subsegment per record, annotated with its task.
            let keep = match crate::xray::around_message(function, &body, fut).await {
                RecordOutcome::Done => false,
                RecordOutcome::Retry(why) => {
                    warn!(message_id = %id, %why, "message left for redelivery");
                    true
                }
                RecordOutcome::Poison(why) => {
                    metrics.count("PoisonMessages", &[("Function", function)]);
                    match poison_url {
                    Some(dlq) => match queue
                        .send_dead_letter(DeadLetter {
                            queue_url: dlq,
                            body: &body,
                            reason: &why,
                        })
                        .await
                    {
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
                }
                }
            };
            keep.then_some(id)
        }
    });
    let mut response = SqsBatchResponse::default();
    response.set_failures(futures::future::join_all(work).await.into_iter().flatten());
    response
}

/// Counts a transition that ended a task's run in `Tasks<State>` (by workflow): Processed,
/// Compensated, Refused, Error (`TasksFailed`), CompensationFailed, Resolved.
pub(crate) fn count_outcome(metrics: &crate::metrics::Metrics, from: ProcessState, t: &Transition) {
    let to = t.record.process_state;
    if to == from {
        return;
    }
    let name = match to {
        ProcessState::Processed => "TasksProcessed",
        ProcessState::Compensated => "TasksCompensated",
        ProcessState::Refused => "TasksRefused",
        ProcessState::Error => "TasksFailed",
        ProcessState::CompensationFailed => "TasksCompensationFailed",
        ProcessState::Resolved => "TasksResolved",
        _ => return,
    };
    metrics.count(name, &[("Workflow", t.record.workflow.as_str())]);
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

/// SQS `DelaySeconds` cannot exceed 15 minutes.
pub const MAX_SQS_DELAY: Duration = Duration::from_secs(900);

/// Puts `message` on the work queue of its lane (`ports`'), in its tenant's group, visible
/// after `delay`. A delay over SQS's 15 minutes is sent as 15 minutes with `notBefore` set:
/// the scheduler sends it again for the rest of the wait.
pub(crate) async fn enqueue(
    ports: &TaskPorts,
    mut message: WorkMessage,
    delay: chrono::Duration,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<(), HandlerError> {
    let wanted = delay.to_std().unwrap_or_default();
    message.not_before = (wanted > MAX_SQS_DELAY).then(|| now + delay);
    let url = ports.work_queue(message.priority);
    let group = message.tenant.clone();
    send_fair_json(
        ports.queue.as_ref(),
        url,
        group.as_deref(),
        "work message",
        &SchedulerMessage::Work(message),
        wanted.min(MAX_SQS_DELAY),
    )
    .await
}

/// Sends `message` (named `what` in the error) to the standard queue `url` as JSON after
/// `delay`, in `group` (its task's tenant) if any; a message that does not serialize is
/// poison.
pub(crate) async fn send_fair_json(
    queue: &dyn Queue,
    url: &str,
    group: Option<&str>,
    what: &str,
    message: &impl serde::Serialize,
    delay: Duration,
) -> Result<(), HandlerError> {
    let body = serde_json::to_string(message)
        .map_err(|e| HandlerError::Poison(format!("{what} does not serialize: {e}")))?;
    queue
        .send_fair(crate::ports::FairMessage {
            queue_url: url,
            group,
            body: &body,
            delay,
        })
        .await?;
    Ok(())
}

/// Sends `message` (named `what` in the error) to `url` as JSON after `delay`; a message that
/// does not serialize is poison.
pub(crate) async fn send_json(
    queue: &dyn Queue,
    url: &str,
    what: &str,
    message: &impl serde::Serialize,
    delay: Duration,
) -> Result<(), HandlerError> {
    send_fair_json(queue, url, None, what, message, delay).await
}

/// What the handlers that move tasks (the API, the scheduler, the supervisor) all work with,
/// built once per process and embedded in their `*Deps`.
#[derive(Clone)]
pub struct TaskPorts {
    pub store: Arc<dyn StateStore>,
    pub queue: Arc<dyn Queue>,
    pub events: Arc<dyn EventBus>,
    pub clock: Arc<dyn Clock>,
    /// Each record's workflow version gives its steps and their policies.
    pub definitions: Arc<Definitions>,
    /// The scheduler's work queue: new tasks, compensation and long waits are enqueued here
    /// (the normal lane's)...
    pub work_queue_url: String,
    /// ...and the urgent lane's, if the deployment has one (`None`: urgent tasks take the
    /// normal lane).
    pub urgent_work_queue_url: Option<String>,
    /// Where the handler's EMF metrics go.
    pub metrics: crate::metrics::Metrics,
    /// Where payloads too large for a task's items are kept (the stack's bucket).
    pub payloads: Arc<dyn crate::ports::Payloads>,
    /// The ends queue (FIFO): a distributed forEach's element that ends sends its end there,
    /// for its run. `None`: this deployment runs no distributed forEach.
    pub ends_queue_url: Option<String>,
    /// The context parts of the runs this process saw last (a distributed forEach's elements
    /// read theirs from here).
    pub run_contexts: Arc<runs::RunContexts>,
}

impl TaskPorts {
    /// The work queue of `priority`'s lane.
    pub fn work_queue(&self, priority: crate::domain::Priority) -> &str {
        crate::domain::lane::lane(
            priority,
            &self.work_queue_url,
            self.urgent_work_queue_url.as_deref(),
        )
    }

    /// Where a transition's effects go.
    pub(crate) fn outlets(&self) -> Outlets<'_> {
        Outlets {
            ports: self,
            queue: self.queue.as_ref(),
            events: self.events.as_ref(),
            clock: self.clock.as_ref(),
            timer_queue_url: None,
        }
    }
}

/// Where effects go: the ports a handler owns, and the work queue.
pub(crate) struct Outlets<'a> {
    /// The ports these are of (a child's end reads its task and workflow to answer its parent).
    pub ports: &'a TaskPorts,
    pub queue: &'a dyn Queue,
    pub events: &'a dyn EventBus,
    pub clock: &'a dyn Clock,
    /// The deadline-timer queue, for [`Effect::Timer`] (`None`: the sweep finds the time).
    pub timer_queue_url: Option<&'a str>,
}

/// Performs the effects of a written transition, in order. [`Effect::SendStepRequest`] and
/// [`Effect::SendBranchStep`] belong to the scheduler alone: `send_step` performs them (`None`:
/// the main line's step, `Some(b)`: branch `b`'s), or it is a configuration error.
pub(crate) async fn perform<'a, F, Fut>(
    o: &Outlets<'a>,
    t: &Transition,
    send_step: Option<F>,
) -> Result<(), HandlerError>
where
    F: Fn(Option<usize>) -> Fut,
    Fut: Future<Output = Result<(), HandlerError>>,
{
    for effect in &t.effects {
        match effect {
            Effect::SendStepRequest | Effect::SendBranchStep(_) => match &send_step {
                Some(f) => {
                    let branch = match effect {
                        Effect::SendBranchStep(b) => Some(*b),
                        _ => None,
                    };
                    f(branch).await?
                }
                None => {
                    return Err(HandlerError::Config(
                        "only the scheduler sends step requests".into(),
                    ));
                }
            },
            Effect::DeliverNotice => deliver_notice(o.ports, &t.record).await?,
            Effect::Publish(status) => publish_status(o.queue, o.events, &t.record, *status).await,
            Effect::Progress(status) => progress_status(o.queue, &t.record, *status).await,
            Effect::Enqueue { delay } => {
                enqueue(o.ports, WorkMessage::of(&t.record), *delay, o.clock.now()).await?
            }
            Effect::Timer { step, attempt, at } => {
                let now = o.clock.now();
                let soon = (*at - now).to_std().unwrap_or_default() <= MAX_SQS_DELAY;
                if let Some(url) = o.timer_queue_url.filter(|_| soon) {
                    let timer = crate::messages::DeadlineTimer {
                        task_id: t.record.task_id,
                        attempt: *attempt,
                        step_index: *step,
                        complete_by: *at,
                        tenant: t.record.tenant.clone(),
                    };
                    // Best effort, as a step's timer: the due index carries the wait to the
                    // sweep either way (and carries a longer wait alone: no timer per 15 min).
                    if let Err(e) = scheduler::arm(o.queue, url, &timer, now).await {
                        tracing::warn!(error = %e, "wait timer not armed; the sweep will find it");
                    }
                }
            }
        }
    }
    Ok(())
}

/// Performs the effects of a transition that sends no step request (the supervisor's and the
/// operator's).
pub(crate) async fn perform_no_step(o: &Outlets<'_>, t: &Transition) -> Result<(), HandlerError> {
    perform(
        o,
        t,
        None::<fn(Option<usize>) -> std::future::Ready<Result<(), HandlerError>>>,
    )
    .await
}

/// Sends one status to the bus and to the task's reply queue. Either may fail: the first is an
/// error for the caller to retry (or log); the copy to the reply queue is best effort, since
/// its URL comes from the application and a bad one must not hold up the task.
async fn send_status(
    queue: &dyn Queue,
    events: &dyn EventBus,
    record: &StateRecord,
    status: NoticeKind,
    sequence: u64,
) -> Result<(), HandlerError> {
    let notice = TaskNotice::of(record, status, sequence);
    let detail = serde_json::to_value(&notice)
        .map_err(|e| HandlerError::Poison(format!("notice does not serialize: {e}")))?;
    events.publish(notice.detail_type(), &detail).await?;
    if status.is_alert() {
        // The span carries the task id, workflow and attempt: once per line.
        warn!(
            status = status.as_str(),
            last_error = record.last_error.as_deref().unwrap_or(""),
            "operator alert"
        );
    }
    reply_copy(queue, record, &detail).await;
    Ok(())
}

/// Sends a status's copy to the task's reply queue, if it has one: best effort, logged if it
/// fails. The copy leaves out the raw error text, as the caller's view of the task does.
async fn reply_copy(queue: &dyn Queue, record: &StateRecord, detail: &serde_json::Value) {
    let Some(url) = &record.reply_queue_url else {
        return;
    };
    let mut copy = detail.clone();
    if let Some(m) = copy.as_object_mut() {
        m.remove("lastError");
    }
    if let Err(e) = queue.send(url, &copy.to_string(), Duration::ZERO).await {
        error!(error = %e, "could not send the status to the task's reply queue");
    }
}

/// Sends a progress status to the task's reply queue only (progress events are off).
pub(crate) async fn progress_status(queue: &dyn Queue, record: &StateRecord, status: NoticeKind) {
    match serde_json::to_value(TaskNotice::of(record, status, record.version)) {
        Ok(detail) => reply_copy(queue, record, &detail).await,
        Err(e) => error!(status = status.as_str(), error = %e, "status does not serialize"),
    }
}

/// Answers the step `link` names (a child's or a run's end): its forward call, fenced by the
/// step's key generation, or (`undo_attempt`) the undo of it that attempt sent. A large result
/// travels by reference. Sent to the parent's reply queue, before the sender's outbox is
/// cleared: a crash answers again, and the parent applies one answer.
pub(crate) async fn answer_step(
    ports: &TaskPorts,
    link: &crate::domain::state::ParentLink,
    undo_attempt: Option<u64>,
    outcome: crate::domain::transition::StepOutcome,
) -> Result<(), HandlerError> {
    answer_step_with(ports, link, undo_attempt, outcome, None).await
}

/// [`answer_step`] with a result kept already (`result_ref`: a JSON Lines result, written
/// before this message that names it), sent as it is.
pub(crate) async fn answer_step_with(
    ports: &TaskPorts,
    link: &crate::domain::state::ParentLink,
    undo_attempt: Option<u64>,
    outcome: crate::domain::transition::StepOutcome,
    result_ref: Option<crate::domain::PayloadRef>,
) -> Result<(), HandlerError> {
    let reply = crate::messages::StepReply {
        task_id: link.task_id,
        step: link.step.clone(),
        step_index: link.step_index,
        attempt: undo_attempt.unwrap_or(0),
        undo: undo_attempt.is_some(),
        outcome,
        result_ref,
        generation: undo_attempt.is_none().then_some(link.generation),
    };
    let reply = crate::payloads::packed_reply(ports.payloads.as_ref(), reply).await?;
    send_json(
        ports.queue.as_ref(),
        &link.reply_queue_url,
        "answer to the parent step",
        &SchedulerMessage::Reply(reply),
        Duration::ZERO,
    )
    .await
}

/// `record`'s task leaves its gate (held or in line) and the tasks then first in line are sent
/// a work message each: their entry is the next admission (a task parked waits for it).
async fn leave_gate(
    ports: &TaskPorts,
    record: &StateRecord,
    hold: &crate::domain::state::GateHold,
) -> Result<(), HandlerError> {
    let place = crate::ports::GatePlace::of(hold, record.task_id, record.created_at);
    let next = ports.store.leave(place).await?;
    for id in &next {
        // In its lane and its tenant's group (a read of its record; one that cannot be read
        // goes in the normal lane: its claim reads it anyway).
        let work = match ports.store.get_state(*id).await {
            Ok(Some(r)) => WorkMessage::of(&r),
            Ok(None) | Err(_) => WorkMessage::new(*id),
        };
        enqueue(ports, work, chrono::Duration::zero(), ports.clock.now()).await?;
    }
    info!(gate = %hold.gate, next = ?next, "left its gate");
    Ok(())
}

/// Publishes a status that does not go through the outbox: best effort, logged if it fails.
pub(crate) async fn publish_status(
    queue: &dyn Queue,
    events: &dyn EventBus,
    record: &StateRecord,
    status: NoticeKind,
) {
    // Made by the write of this very version.
    if let Err(e) = send_status(queue, events, record, status, record.version).await {
        error!(status = status.as_str(), error = %e, "status not published");
    }
}

/// Delivers a record's outbox and clears it.
///
/// Every status goes to the bus first (`TaskFailed` and `TaskCompensationFailed` are the
/// operator alerts; delivery is at least once, consumers deduplicate on the notice's id, made
/// from the sequence stored with the status), then, best effort, to the task's reply queue. A bus failure leaves the outbox
/// full: the record stays due and the supervisor delivers it again.
pub async fn deliver_notice(ports: &TaskPorts, record: &StateRecord) -> Result<(), HandlerError> {
    let (store, queue, events, clock) = (
        ports.store.as_ref(),
        ports.queue.as_ref(),
        ports.events.as_ref(),
        ports.clock.as_ref(),
    );
    // A distributed forEach's run and elements are no tasks of the caller's: their statuses
    // stay off the bus and the reply queue (ten thousand `Processed` for one step), but for
    // the operator's alerts.
    let inner = record.of_a_run();
    for owed in &record.outbox {
        if inner && !owed.status.is_alert() {
            continue;
        }
        send_status(queue, events, record, owed.status, owed.sequence).await?;
    }
    // A child that ended answers its parent step (or its parent's undo) before its outbox is
    // cleared: a crash from here on answers again, and the parent applies one answer (fenced).
    // An element answers its run; a run, its task's step.
    if record.notice_pending() {
        if record.run.is_some() {
            runs::answer_task(ports, record).await?;
        } else if record.element_of().is_some() {
            runs::answer_run(ports, record).await?;
        } else {
            children::answer_parent(ports, record).await?;
        }
    }
    // A parent that ended for good will never undo its children: their retention starts.
    children::release_children(ports, record).await?;
    // A task that ended leaves its gate, and sends on those then first in line, before its
    // notice is cleared: a crash from here on leaves (idempotent) and sends them again.
    if let Some(hold) = record
        .gate
        .as_ref()
        .filter(|g| g.leave_owed(record.process_state))
    {
        leave_gate(ports, record, hold).await?;
    }
    let Ok(t) = notice_delivered(record, clock.now(), store.retention()) else {
        return Ok(());
    };
    // A final task's retention starts now: its task item first, then (with the cleared
    // outbox) its state record. A crash in between leaves the outbox owed, so the supervisor
    // does both again.
    store.expire_task(&t.record).await?;
    // Condition: the outbox is still owed at the version delivered. A lost race (another
    // deliverer, or the record moved on) means a status may go out twice, which consumers
    // tolerate; whoever wrote the newer version delivers what it holds.
    write(store, &t).await?;
    info!(state = %record.process_state, outbox = ?record.owed(), "notices delivered");
    Ok(())
}
