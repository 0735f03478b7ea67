//! Starting a task: what the task API's submission and a schedule's run share. The task and its
//! state record are written in one transaction (with the caller's idempotency key, if any), then
//! the task's first work message is sent.
//!
//! A schedule's run ([`run_schedule`]) starts a task as the caller `arn:sas:schedule:{name}`
//! with the run's time as its idempotency key: EventBridge Scheduler delivers at least once, and
//! a run delivered twice starts one task. The task becomes the schedule's current task in the
//! same transaction, on condition that the current task is still the one the run read (and,
//! under `overlap: skip`, found ended): two runs at once cannot both start one.

use super::{HandlerError, TaskPorts, progress_status, publish_status};
use crate::catalog::CatalogError;
use crate::domain::schedule::Overlap;
use crate::domain::transition::Effect;
use crate::domain::workflow::InputError;
use crate::domain::{Caller, NoticeKind, ProcessState, StateRecord, Task, TaskId, Workflow};
use crate::messages::{ScheduledRun, WorkMessage};
use crate::ports::{CreateOutcome, IdempotencyRecord, NewTask, Turn, canonical};
use chrono::{DateTime, Timelike, Utc};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use std::sync::Arc;
use tracing::{error, info, warn};

/// A task to start.
#[derive(Debug, Clone)]
pub struct StartRequest<'a> {
    pub caller: &'a Caller,
    pub workflow: &'a str,
    pub input: Value,
    /// The caller's idempotency key.
    pub key: Option<String>,
    pub reply_queue_url: Option<String>,
    /// A delayed start (in the future).
    pub start_at: Option<DateTime<Utc>>,
    /// A schedule's run: the task becomes the schedule's current task, if the current task is
    /// still the one the run read.
    pub turn: Option<Turn<'a>>,
    /// A sub-workflow step's child: its id (derived from the step's key, so the parent names
    /// it), the version the step pins (`None`: the newest), and the parent step it answers.
    pub child: Option<ChildStart>,
    /// Its lane (a child's is its parent's).
    pub priority: crate::domain::Priority,
    /// Where a new task's first step goes when this process claims it itself (the task API):
    /// the record is created claimed and the step's request sent at once, with no work message
    /// and no claim of the scheduler's. `None` (a child started by an agent, a schedule's run),
    /// or a task this does not suit ([`first_claim`]): the work message.
    pub dispatch: Option<&'a dyn Dispatch>,
}

/// What claims a new task's first step at its creation and sends what the claim sends: the
/// scheduler's outlets (`SchedulerDeps`), lent to the task API.
#[async_trait::async_trait]
pub trait Dispatch: Send + Sync + std::fmt::Debug {
    /// The `LockedBy` of the claims it makes.
    fn instance_id(&self) -> &str;
    /// Whether it can build a callback step's request (it knows the task API's address).
    fn calls_back(&self) -> bool;
    /// Performs the written claim `t`'s effects: its step requests and the task's timer.
    async fn perform(
        &self,
        task: &Task,
        workflow: &Workflow,
        t: &crate::domain::Transition,
    ) -> Result<(), HandlerError>;
}

/// How a sub-workflow step's child task starts.
#[derive(Debug, Clone)]
pub struct ChildStart {
    pub id: TaskId,
    pub version: Option<u32>,
    pub parent: crate::domain::state::ParentLink,
}

/// A task started, or the one an idempotency key started before.
#[derive(Debug, Clone, PartialEq)]
pub struct Started {
    pub task_id: TaskId,
    pub workflow: String,
    pub workflow_version: u32,
    pub process_state: ProcessState,
    /// The key was used before with the same request: this is that task.
    pub replayed: bool,
}

/// Why a task was not started.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("no workflow {0:?} is published")]
    WorkflowNotFound(String),
    #[error("the input does not match {}'s input schema: {error}", workflow.name)]
    Input {
        workflow: Arc<Workflow>,
        error: InputError,
    },
    /// The key was used before for another request.
    #[error("the idempotency key was used for another request")]
    KeyReused,
    #[error("the task could not be stored: {0}")]
    Store(crate::ports::StoreError),
    #[error("the idempotency key points to a missing task")]
    Inconsistent,
    /// Another run of the schedule started a task since this one read the current task.
    #[error("another run of the schedule started a task first")]
    TurnTaken,
    #[error(transparent)]
    Catalog(#[from] CatalogError),
}

/// Starts a task of the newest version of `request.workflow`.
pub async fn start(ports: &TaskPorts, request: StartRequest<'_>) -> Result<Started, StartError> {
    let now = ports.clock.now();
    let pinned = request.child.as_ref().and_then(|c| c.version);
    let found = match pinned {
        Some(v) => ports.definitions.workflow(request.workflow, v).await?,
        None => ports.definitions.latest(request.workflow).await?,
    };
    let Some(workflow) = found else {
        return Err(StartError::WorkflowNotFound(request.workflow.to_owned()));
    };
    if let Err(error) = workflow.check_input(&request.input) {
        return Err(StartError::Input { workflow, error });
    }
    // Its search keys, read from the input it starts with.
    let keys = match workflow.keys.read(&request.input) {
        Ok(keys) => keys,
        Err(error) => return Err(StartError::Input { workflow, error }),
    };
    // Its gate, under a concurrency limit: it takes its place in line with its creation.
    let gate = match workflow
        .concurrency
        .as_ref()
        .map(|k| k.gate(&workflow.name, &request.input).map(|g| (g, k.limit)))
        .transpose()
    {
        Ok(gate) => gate,
        Err(error) => return Err(StartError::Input { workflow, error }),
    };
    let id = request
        .child
        .as_ref()
        .map_or_else(TaskId::new_random, |c| c.id);
    tracing::Span::current().record("task_id", tracing::field::display(id));
    let task = Task {
        input_ref: None,
        id,
        workflow: workflow.name.clone(),
        workflow_version: workflow.version,
        input: request.input,
        input_revision: 0,
        earlier_inputs: vec![],
        reply_queue_url: request.reply_queue_url,
        created_at: crate::domain::state::to_millis(now),
        caller: request.caller.clone(),
        keys,
    };
    let mut record = StateRecord::new(
        id,
        &workflow,
        task.reply_queue_url.clone(),
        now,
        now + workflow.policies().at(0).pickup_timeout,
    );
    if let Some(start) = request.start_at.filter(|s| *s > now) {
        record = record.starting_at(start);
    }
    // Its input is kept by reference: its retention must delete it.
    record.payloads = task.has_large_input();
    record.parent = request.child.map(|c| c.parent);
    record.priority = request.priority;
    record.tenant = Some(crate::domain::lane::tenant(request.caller));
    record.gate = gate
        .as_ref()
        .map(|(g, limit)| crate::domain::state::GateHold {
            gate: g.clone(),
            limit: *limit,
            status: crate::domain::state::GateStatus::InLine,
        });
    // Keys are the caller's own: the same key from two callers names two tasks, and one
    // caller can neither block nor discover another's.
    let key = request.key.map(|key| IdempotencyRecord {
        key: format!("{}#{key}", request.caller.digest()),
        request_hash: request_hash(&task, record.start_at, record.priority),
        task_id: id,
        created_at: task.created_at,
    });
    // Its first step claimed here, where that suits it: the create writes the claimed record.
    let claimed = request
        .dispatch
        .and_then(|d| first_claim(d, &task, &record, &workflow, now).map(|t| (d, t)));
    let written = claimed.as_ref().map_or(&record, |(_, t)| &t.record);
    let new = NewTask {
        task: &task,
        record: written,
        key: key.as_ref(),
        turn: request.turn,
        gate: gate.as_ref().map(|(g, limit)| crate::ports::GatePlace {
            gate: g,
            task_id: id,
            created_at: task.created_at,
            limit: *limit,
        }),
    };
    match ports.store.create(new).await {
        Ok(CreateOutcome::Created) => {
            ports
                .metrics
                .count("TasksAccepted", &[("Workflow", task.workflow.as_str())]);
        }
        Ok(CreateOutcome::KeyExists(first)) => {
            if key.map(|k| k.request_hash) != Some(first.request_hash) {
                return Err(StartError::KeyReused);
            }
            let state = match ports.store.get_state(first.task_id).await {
                Ok(Some(r)) => r,
                Ok(None) => {
                    error!(task_id = %first.task_id, "idempotency key points to a missing task");
                    return Err(StartError::Inconsistent);
                }
                Err(e) => return Err(StartError::Store(e)),
            };
            info!(task_id = %first.task_id, "idempotent replay");
            return Ok(Started {
                task_id: first.task_id,
                workflow: state.workflow,
                workflow_version: state.workflow_version,
                process_state: state.process_state,
                replayed: true,
            });
        }
        Ok(CreateOutcome::TurnTaken) => return Err(StartError::TurnTaken),
        Err(e) => {
            error!(error = %e, "could not store the task");
            return Err(StartError::Store(e));
        }
    }
    // Crash point: the task is stored but its work not yet sent. Its deadline (the pickup's, or
    // the claimed step's) is in the due index, so the supervisor recovers it if the send below
    // never happens.
    match workflow.policies().at(0).progress(NoticeKind::Received) {
        Effect::Publish(status) => {
            publish_status(ports.queue.as_ref(), ports.events.as_ref(), written, status).await
        }
        _ => progress_status(ports.queue.as_ref(), written, NoticeKind::Received).await,
    }
    if let Some((d, t)) = &claimed {
        tracing::Span::current().record("attempt", t.record.attempt);
        info!(
            step = t.record.current_step().unwrap_or("-"),
            "claimed at submission"
        );
        // The claim's effects: its step's request (or a parallel group's), and the timer.
        if let Err(e) = d.perform(&task, &workflow, t).await {
            error!(error = %e, "task stored claimed but its request not sent; the supervisor will take it up at its deadline");
        }
    } else {
        // A delayed start: its work message waits for it, if a message can wait that long; a
        // later one rides the due index (the supervisor enqueues it at its time).
        let delay = record.start_at.map_or(chrono::Duration::zero(), |s| {
            (s - now).max(chrono::Duration::zero())
        });
        if delay.to_std().unwrap_or_default() > super::MAX_SQS_DELAY {
            info!(start_at = ?record.start_at, "a delayed start: the supervisor enqueues it then");
        } else if let Err(e) = super::enqueue(ports, WorkMessage::of(&record), delay, now).await {
            error!(error = %e, "task stored but not enqueued; the supervisor will pick it up");
        }
    }
    info!(version = workflow.version, "task accepted");
    Ok(Started {
        task_id: id,
        workflow: workflow.name.clone(),
        workflow_version: workflow.version,
        process_state: written.process_state,
        replayed: false,
    })
}

/// The claim of a new task's first step, if the task API may make it with `dispatch` and write
/// the record claimed in its creation: not for a task at a gate (its admission is a transaction
/// with the claim), a delayed start, or a first transition that does more than send requests
/// (a wait, an event's, a step answered without a call): those take the work message, and
/// the scheduler's claim, as before. The claim is the scheduler's own transition; the record it
/// writes is locked by `dispatch`'s instance, with the step's deadline in the due index.
fn first_claim(
    dispatch: &dyn Dispatch,
    task: &Task,
    record: &StateRecord,
    workflow: &Workflow,
    now: DateTime<Utc>,
) -> Option<crate::domain::Transition> {
    if record.gate.is_some() || record.start_at.is_some() || !dispatch.calls_back() {
        return None;
    }
    let router = crate::domain::transition::TaskRouter { workflow, task };
    let t = crate::domain::transition::claim(
        record,
        dispatch.instance_id(),
        now,
        &workflow.policies(),
        &router,
    )
    .ok()?;
    let sends_only = t.effects.iter().all(|e| {
        matches!(
            e,
            Effect::SendStepRequest
                | Effect::SendBranchStep(_)
                | Effect::Progress(_)
                | Effect::Publish(_)
        )
    });
    (t.record.process_state == ProcessState::Processing && sends_only).then_some(t)
}

/// SHA-256 of the request in canonical form (workflow, input, reply queue, and a delayed
/// start's time and priority if any): two bodies that differ only in whitespace or key order are the same
/// request.
fn request_hash(
    task: &Task,
    start_at: Option<DateTime<Utc>>,
    priority: crate::domain::Priority,
) -> String {
    let mut request = json!({"workflow": task.workflow, "input": task.input, "replyQueueUrl": task.reply_queue_url});
    if let Some(s) = start_at {
        request["startAt"] = json!(s);
    }
    // (Normal: absent, so a request's hash is what it was before priorities.)
    if !priority.is_normal() {
        request["priority"] = json!(priority);
    }
    hex::encode(Sha256::digest(canonical(&request)))
}

/// The caller a schedule's tasks belong to.
pub fn schedule_caller(name: &str) -> Result<Caller, HandlerError> {
    Caller::schedule(name).map_err(|e| HandlerError::Poison(format!("schedule {name:?}: {e}")))
}

/// What a schedule's run did.
#[derive(Debug, Clone, PartialEq)]
pub enum RunOutcome {
    /// A task started (or the one this run started before, delivered again).
    Started(Started),
    /// Nothing started, and why (paused, deleted, the previous task still running, the
    /// workflow gone or no longer taking the input).
    Skipped(String),
}

/// One run of a schedule, at `run.at`: starts a task of its workflow with its input, unless the
/// schedule is paused or deleted (the catalog decides, whatever the timer that sent the run
/// thinks), or its overlap policy is `skip` and the schedule's current task has not ended
/// (reached `Processed`, `Compensated`, `Refused` or `Resolved`; `Error` and
/// `CompensationFailed` wait for an operator and have not).
pub async fn run_schedule(
    ports: &TaskPorts,
    run: &ScheduledRun,
) -> Result<RunOutcome, HandlerError> {
    let schedule = match ports.definitions.schedule(&run.schedule).await {
        Ok(Some(s)) => s,
        Ok(None) => return Ok(skipped(ports, run, "the schedule is deleted")),
        Err(CatalogError::Store(e)) => return Err(e.into()),
        Err(CatalogError::Invalid(e)) => {
            return Ok(skipped(
                ports,
                run,
                &format!("the stored schedule does not read: {e}"),
            ));
        }
    };
    if schedule.def.paused {
        return Ok(skipped(ports, run, "the schedule is paused"));
    }
    let caller = schedule_caller(&run.schedule)?;
    let skip = schedule.def.overlap == Overlap::Skip;
    // The run's time to the second: its idempotency key, and what the current task is told
    // apart by (Scheduler's runs are on whole seconds; two deliveries of one run are one).
    let at = run.at.with_nanosecond(0).unwrap_or(run.at);
    let key = at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    // Each lost race means another run started a task since this one read: read again (the
    // next read sees that task). Past a few, the message is redelivered.
    for _ in 0..RUN_RACES {
        let current = ports.store.current_run(&run.schedule).await?;
        if skip
            && let Some(c) = current
            // The task this very run started (delivered again): its key answers it below.
            && c.run_at != at
            && let Some(previous) = ports.store.get_state(c.task_id).await?
            // `Error` and `CompensationFailed` wait for an operator, who may retry them: not
            // ended. (A task gone at its retention had ended.)
            && !previous.process_state.is_final()
        {
            return Ok(skipped(
                ports,
                run,
                &format!(
                    "its previous task {} has not ended ({}; a task in Error or CompensationFailed ends only when an operator retries it to its end, compensates or resolves it)",
                    c.task_id, previous.process_state
                ),
            ));
        }
        let request = StartRequest {
            caller: &caller,
            workflow: &schedule.def.workflow,
            input: schedule.def.input.clone(),
            key: Some(key.clone()),
            reply_queue_url: None,
            start_at: None,
            turn: Some(Turn {
                schedule: &run.schedule,
                run_at: at,
                after: current.map(|c| c.task_id),
            }),
            child: None,
            priority: crate::domain::Priority::Normal,
            dispatch: None,
        };
        return match start(ports, request).await {
            Ok(started) => {
                info!(schedule = %run.schedule, at = %run.at, task_id = %started.task_id, replayed = started.replayed, "a schedule's run started its task");
                ports.metrics.count(
                    "ScheduledRuns",
                    &[("Schedule", run.schedule.as_str()), ("Outcome", "started")],
                );
                Ok(RunOutcome::Started(started))
            }
            Err(StartError::TurnTaken) => {
                info!(schedule = %run.schedule, at = %run.at, "another run started a task first: reading again");
                continue;
            }
            Err(StartError::Store(e)) => Err(e.into()),
            Err(StartError::Catalog(CatalogError::Store(e))) => Err(e.into()),
            // The schedule changed between the run's first delivery and this one: that run's
            // task was started with the input of then.
            Err(StartError::KeyReused) => {
                Ok(skipped(ports, run, "this run started its task before"))
            }
            Err(e) => {
                error!(schedule = %run.schedule, error = %e, "a schedule's run cannot start its task");
                Ok(skipped(ports, run, &e.to_string()))
            }
        };
    }
    warn!(schedule = %run.schedule, at = %run.at, "lost every race for the schedule's turn: redelivered");
    Err(crate::ports::StoreError::ConditionFailed.into())
}

/// How many times a run reads the schedule's current task again after another run started one
/// first, before it leaves its message for redelivery.
const RUN_RACES: usize = 4;

fn skipped(ports: &TaskPorts, run: &ScheduledRun, why: &str) -> RunOutcome {
    warn!(schedule = %run.schedule, at = %run.at, why, "a schedule's run started nothing");
    ports.metrics.count(
        "ScheduledRuns",
        &[("Schedule", run.schedule.as_str()), ("Outcome", "skipped")],
    );
    RunOutcome::Skipped(why.to_owned())
}
