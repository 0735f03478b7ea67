//! The scheduler: claims Pending tasks, sends step requests to the agents, applies their
//! replies. Each task runs on the workflow version stored in its record.

use super::{
    HandlerError, RecordOutcome, TaskPorts, enqueue, perform, process_batch, send_json, write,
};
use crate::domain::state::callback_token;
use crate::domain::task::{MAX_REQUEST_BYTES, MAX_RESULT_BYTES, MAX_RESULTS_BYTES};
use crate::domain::transition::{self, StepOutcome, Transition};
use crate::domain::{ProcessState, StateRecord, Task, Workflow};
use crate::messages::{
    DeadlineTimer, ElementsEnded, SchedulerMessage, StepReply, StepRequest, WorkMessage,
    idempotency_key,
};
use crate::ports::CallbackAddress;
use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tracing::{Instrument, info, info_span, warn};

/// Everything the scheduler needs, built once per process.
#[derive(Clone)]
pub struct SchedulerDeps {
    /// The store, queue, bus, clock, definitions, work queue (compensation and long waits
    /// re-enqueue work there) and metrics.
    pub ports: TaskPorts,
    /// The agents' request queue (one queue for every service; each request names its
    /// service): the normal lane's...
    pub agent_queue_url: String,
    /// ...and the urgent lane's, if the deployment has one (`None`: urgent tasks' steps take
    /// the normal lane).
    pub urgent_agent_queue_url: Option<String>,
    /// Where agents send their replies.
    pub reply_queue_url: String,
    /// Where deadline timers go (the supervisor's timer queue); `None`: no timers, the sweep
    /// alone finds expired deadlines.
    pub timer_queue_url: Option<String>,
    /// Where poison messages go.
    pub dead_letter_url: Option<String>,
    /// This scheduler instance's id, written to `LockedBy`.
    pub instance_id: String,
    /// The task API's base URL: callback steps' services complete them at
    /// `{base}/tasks/{id}/callbacks/{token}`. `None`: callback steps cannot run here.
    pub callback_base_url: Option<String>,
}

impl std::fmt::Debug for SchedulerDeps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SchedulerDeps")
            .field("instance_id", &self.instance_id)
            .finish_non_exhaustive()
    }
}

/// The task API claims first steps with the scheduler's outlets.
#[async_trait::async_trait]
impl super::start::Dispatch for SchedulerDeps {
    fn instance_id(&self) -> &str {
        &self.instance_id
    }

    fn calls_back(&self) -> bool {
        self.callback_base_url.is_some()
    }

    async fn perform(
        &self,
        task: &Task,
        workflow: &Workflow,
        t: &Transition,
    ) -> Result<(), HandlerError> {
        run(self, task, workflow, t).await
    }
}

impl SchedulerDeps {
    /// Where the agents reply for a task of `priority`: the reply queue, or for an urgent
    /// task the urgent lane's work queue (the scheduler takes replies there too), so a backlog
    /// of replies never delays it either.
    pub fn reply_queue(&self, priority: crate::domain::Priority) -> &str {
        crate::domain::lane::lane(
            priority,
            &self.reply_queue_url,
            self.ports.urgent_work_queue_url.as_deref(),
        )
    }

    /// The agent queue of `priority`'s lane.
    pub fn agent_queue(&self, priority: crate::domain::Priority) -> &str {
        crate::domain::lane::lane(
            priority,
            &self.agent_queue_url,
            self.urgent_agent_queue_url.as_deref(),
        )
    }
}

/// Handles one SQS batch from the work queue, the reply queue or the ends queue.
pub async fn handle(deps: &SchedulerDeps, event: SqsEvent) -> SqsBatchResponse {
    // One task's messages in a batch are handled one after another, different tasks' at once:
    // the replies to a group's branches (or a forEach's elements) would otherwise race for
    // the one record, and a write that loses still bills the whole item.
    let turns: HashMap<crate::TaskId, Arc<tokio::sync::Mutex<()>>> = event
        .records
        .iter()
        .filter_map(|r| task_of(r.body.as_deref()?))
        .map(|id| (id, Arc::default()))
        .collect();
    let turns = &turns;
    let runs = &RunBatches::of(&event);
    process_batch(
        event,
        deps.ports.queue.as_ref(),
        deps.dead_letter_url.as_deref(),
        (&deps.ports.metrics, "scheduler"),
        |body| async move {
            let turn = task_of(&body).and_then(|id| turns.get(&id).cloned());
            let _turn = match &turn {
                Some(t) => Some(t.lock().await),
                None => None,
            };
            if let Some(batch) = runs.of_body(&body) {
                return batch.apply(deps).await;
            }
            on_message(deps, &body).await
        },
    )
    .await
}

/// A batch's ends, merged per run: one run's messages (a FIFO group, in order) are applied in
/// one write of its record, and each of them shares that write's outcome (so a write that must
/// be retried leaves them all for redelivery, in order).
struct RunBatches(HashMap<crate::TaskId, RunBatch>);

struct RunBatch {
    ended: ElementsEnded,
    /// The outcome of the one apply, shared by the batch's messages of this run.
    outcome: tokio::sync::OnceCell<RecordOutcome>,
}

impl RunBatches {
    fn of(event: &SqsEvent) -> Self {
        let mut runs: HashMap<crate::TaskId, RunBatch> = HashMap::new();
        for body in event.records.iter().filter_map(|r| r.body.as_deref()) {
            if let Ok(SchedulerMessage::Ended(e)) = serde_json::from_str(body) {
                runs.entry(e.run_id)
                    .or_insert_with(|| RunBatch {
                        ended: ElementsEnded {
                            run_id: e.run_id,
                            ends: vec![],
                        },
                        outcome: tokio::sync::OnceCell::new(),
                    })
                    .ended
                    .ends
                    .extend(e.ends);
            }
        }
        Self(runs)
    }

    fn of_body(&self, body: &str) -> Option<&RunBatch> {
        match serde_json::from_str(body).ok()? {
            SchedulerMessage::Ended(e) => self.0.get(&e.run_id),
            _ => None,
        }
    }
}

impl RunBatch {
    /// Applies the run's ends once (its turn is held: the batch's other messages of this run
    /// wait for it) and answers each message with the outcome.
    async fn apply(&self, deps: &SchedulerDeps) -> RecordOutcome {
        self.outcome
            .get_or_init(|| apply_ended(deps, &self.ended))
            .await
            .clone()
    }
}

/// Applies one run's ends (a message's, or a batch's merged), traced.
async fn apply_ended(deps: &SchedulerDeps, ended: &ElementsEnded) -> RecordOutcome {
    let span = info_span!("ended", task_id = %ended.run_id, workflow = tracing::field::Empty, ends = ended.ends.len());
    super::runs::apply_ends(&deps.ports, ended)
        .instrument(span)
        .await
        .into()
}

/// The task a scheduler message is about, if it parses.
fn task_of(body: &str) -> Option<crate::TaskId> {
    match serde_json::from_str::<SchedulerMessage>(body).ok()? {
        SchedulerMessage::Work(w) => Some(w.task_id),
        SchedulerMessage::Reply(r) => Some(r.task_id),
        SchedulerMessage::Ended(e) => Some(e.run_id),
        SchedulerMessage::Scheduled(_) => None,
    }
}

/// Handles one message body.
pub async fn on_message(deps: &SchedulerDeps, body: &str) -> RecordOutcome {
    let msg: SchedulerMessage = match serde_json::from_str(body) {
        Ok(m) => m,
        Err(e) => {
            // An event a service put on the task-events bus, sent here by the bus's rule.
            return match super::events::BusEvent::parse(body) {
                Some(Ok(event)) => {
                    let span = info_span!("bus_event", task_id = %event.detail.task_id, event = %event.detail.event, workflow = tracing::field::Empty);
                    super::events::on_bus_event(&deps.ports, &event, Some(deps))
                        .instrument(span)
                        .await
                        .into()
                }
                Some(Err(why)) => RecordOutcome::Poison(why),
                None => RecordOutcome::Poison(format!("not a scheduler message: {e}")),
            };
        }
    };
    match msg {
        SchedulerMessage::Work(w) => {
            let span = info_span!("work", task_id = %w.task_id, workflow = tracing::field::Empty, attempt = tracing::field::Empty);
            on_work(deps, w).instrument(span).await.into()
        }
        SchedulerMessage::Reply(r) => {
            let span = info_span!("reply", task_id = %r.task_id, workflow = tracing::field::Empty, attempt = r.attempt, step = %r.step);
            on_reply(deps, r).instrument(span).await.into()
        }
        SchedulerMessage::Ended(ended) => apply_ended(deps, &ended).await,
        SchedulerMessage::Scheduled(run) => {
            let span = info_span!("scheduled", schedule = %run.schedule, at = %run.at, task_id = tracing::field::Empty);
            super::start::run_schedule(&deps.ports, &run)
                .instrument(span)
                .await
                .map(drop)
                .into()
        }
    }
}

/// The task, its record and the workflow version it runs on.
async fn load(
    deps: &SchedulerDeps,
    id: crate::TaskId,
) -> Result<(Task, StateRecord, Arc<Workflow>), HandlerError> {
    let (task, record) = deps
        .ports
        .store
        .get(id)
        .await?
        .ok_or_else(|| HandlerError::Poison(format!("no task {id}")))?;
    tracing::Span::current().record("workflow", record.workflow.as_str());
    let workflow = super::workflow_of(&deps.ports.definitions, &record).await?;
    Ok((task, record, workflow))
}

/// The values a call may be limited by (a service's `perKey`): the task's search keys, and
/// its caller's tenant under `caller`. Every request carries them (a few dozen bytes), so the
/// scheduler reads no service to know which one it needs.
fn limit_keys(task: &crate::domain::Task, record: &StateRecord) -> crate::domain::limits::CallKeys {
    let mut keys: crate::domain::limits::CallKeys = task
        .keys
        .iter()
        .map(|k| (k.key.name.clone(), k.key.value.clone()))
        .collect();
    if let Some(tenant) = &record.tenant {
        keys.insert(crate::domain::limits::CALLER_KEY.to_owned(), tenant.clone());
    }
    keys
}

/// Sends a task's work message on, to come back at `until` (SQS delays at most 15 minutes).
async fn send_on(
    deps: &SchedulerDeps,
    w: &WorkMessage,
    until: chrono::DateTime<chrono::Utc>,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<(), HandlerError> {
    enqueue(&deps.ports, w.clone(), until - now, now).await
}

async fn on_work(deps: &SchedulerDeps, w: WorkMessage) -> Result<(), HandlerError> {
    let now = deps.ports.clock.now();
    if let Some(not_before) = w.not_before
        && not_before > now
    {
        // A wait longer than SQS's 15-minute delay: send it on for the rest.
        send_on(deps, &w, not_before, now).await?;
        info!(%not_before, "long wait: work message sent on");
        return Ok(());
    }
    // Whether the task waited at its gate when last read.
    let mut gated = false;
    for _ in 0..CLAIM_TRIES {
        let (task, record, workflow) = load(deps, w.task_id).await?;
        // The time of this try (a try after a lost race is later than the message's arrival).
        let now = deps.ports.clock.now();
        gated = record.gate.as_ref().is_some_and(|g| g.waits());
        let router = transition::TaskRouter {
            workflow: &workflow,
            task: &task,
        };
        let t = match transition::claim(
            &record,
            &deps.instance_id,
            now,
            &workflow.policies(),
            &router,
        ) {
            Ok(t) => t,
            Err(transition::Rejection::TooEarly { until }) => {
                // An undo whose step may still be in flight: the message came early (a stray,
                // or clock skew); send it on for the rest of the wait.
                send_on(deps, &w, until, now).await?;
                info!(%until, "undo not due yet: work message sent on");
                return Ok(());
            }
            Err(why) => {
                info!(%why, "work message dropped");
                return Ok(());
            }
        };
        // A task at its gate is admitted with its first claim, or parks there.
        if let Some(hold) = record.gate.as_ref().filter(|g| g.waits()) {
            match enter_gate(deps, &task, &record, hold, t, now).await? {
                Gate::Admitted(admitted) => {
                    super::count_outcome(&deps.ports.metrics, record.process_state, &admitted);
                    tracing::Span::current().record("attempt", admitted.record.attempt);
                    info!(gate = %hold.gate, "admitted at its gate and claimed");
                    return run(deps, &task, &workflow, &admitted).await;
                }
                Gate::Parked => return Ok(()),
                Gate::LostRace => continue,
            }
        }
        if !write(deps.ports.store.as_ref(), &t).await? {
            // Another write came first: another scheduler's claim (the claim read anew is
            // then refused and the message dropped), or a write that claims nothing (an event
            // kept for a later step, an operator's note): claim again on the record as it is.
            continue;
        }
        super::count_outcome(&deps.ports.metrics, record.process_state, &t);
        tracing::Span::current().record("attempt", t.record.attempt);
        info!(step = t.record.current_step().unwrap_or("-"), state = %t.record.process_state, "claimed");
        return run(deps, &task, &workflow, &t).await;
    }
    if gated {
        // Parked, it has no pickup deadline: the message comes back (SQS) instead.
        return Err(crate::ports::StoreError::Unavailable(
            "the task or its gate kept changing while it was admitted".into(),
        )
        .into());
    }
    info!(
        "the task kept changing while it was claimed; work message dropped (its pickup deadline recovers it)"
    );
    Ok(())
}

/// What an entry at a gate came to.
enum Gate {
    /// Admitted: the claim is written.
    Admitted(Box<Transition>),
    /// Others hold the gate or wait before the task: it waits, parked, for the leave of one
    /// before it to send it on.
    Parked,
    /// The record or the gate moved meanwhile: read again.
    LostRace,
}

/// Enters `record`'s task at its gate with its first claim `t`: admitted (the claim written
/// with it), or parked (written so: `Pending` with no deadline, the gate's line holding its
/// place). A race lost on the record or the gate is read again.
async fn enter_gate(
    deps: &SchedulerDeps,
    task: &crate::Task,
    record: &StateRecord,
    hold: &crate::domain::state::GateHold,
    mut t: Transition,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<Gate, HandlerError> {
    use crate::domain::state::GateStatus;
    use crate::ports::{GateAdmission, GateAnswer, GatePlace};
    let place = GatePlace::of(hold, task.id, task.created_at);
    if let Some(g) = t.record.gate.as_mut() {
        g.status = GateStatus::Held;
    }
    let admission = GateAdmission {
        place,
        put: crate::ports::Guarded::new(&t.record, &t.condition),
        now,
    };
    // Condition (the store's): the gate as read, the entry in line, and the record as the
    // claim read it - keeps "at most the limit hold a gate, admitted in the order created".
    match deps.ports.store.enter(admission).await {
        Ok(GateAnswer::Admitted) => Ok(Gate::Admitted(Box::new(t))),
        Ok(GateAnswer::Waiting(state)) => {
            info!(gate = %hold.gate, holders = ?state.holders, ahead = ?state.ahead, "waits at its gate");
            if hold.status == GateStatus::Parked {
                return Ok(Gate::Parked);
            }
            let Ok(parked) = transition::park(record, now) else {
                return Ok(Gate::Parked);
            };
            // Condition: the record as read - keeps "a parked task has no deadline only while
            // its place in line holds it" (a leave before it sends it on).
            Ok(if write(deps.ports.store.as_ref(), &parked).await? {
                Gate::Parked
            } else {
                Gate::LostRace
            })
        }
        Err(crate::ports::StoreError::ConditionFailed) => Ok(Gate::LostRace),
        Err(e) => Err(e.into()),
    }
}

/// How often a work message's claim is tried on the record read anew after losing a race.
const CLAIM_TRIES: u32 = 3;

/// How often a reply (an agent's, or a service's callback) that lost a race for its record,
/// or met a store fault, is applied again to the record read anew, and the first pause before a
/// try after a fault. Replies to the steps of one task's parallel branches meet on its record:
/// the one that loses is read again and applied again (it is fenced by its branch's attempt and
/// step, so a stale one is dropped then). A callback is sent once by its service: one that
/// still loses after its tries is not dropped but comes back with its message (a late
/// callback still completes its step: [`transition::apply_callback`]); an agent's reply that
/// still loses comes back too, or its step's deadline recovers it.
const REPLY_TRIES: u32 = 4;
const REPLY_PAUSE: Duration = Duration::from_millis(100);

async fn on_reply(deps: &SchedulerDeps, r: StepReply) -> Result<(), HandlerError> {
    // A large result travels by reference: read it back once for every try below.
    let r = crate::payloads::unpacked_reply(deps.ports.payloads.as_ref(), r).await?;
    let mut pause = REPLY_PAUSE;
    for attempt in 1..=REPLY_TRIES {
        match apply_one(deps, &r).await {
            Ok(Applied::Yes | Applied::Dropped) => return Ok(()),
            Ok(Applied::LostRace) if attempt < REPLY_TRIES => {
                // Another write is in between (a burst on a hot record, from another
                // scheduler): a short, growing, jittered pause lets it pass rather than losing
                // to it again at once, in step with the other losers.
                let jitter = rand::random_range(0.5..1.5);
                tokio::time::sleep((pause / 4).mul_f64(jitter)).await;
                pause *= 2;
            }
            Ok(Applied::LostRace) => {}
            Err(HandlerError::Store(e)) if attempt < REPLY_TRIES => {
                warn!(error = %e, attempt, "reply not applied: the store failed; trying again");
                tokio::time::sleep(pause).await;
                pause *= 2;
            }
            Err(e) => return Err(e),
        }
    }
    warn!("reply not applied: the record kept moving; its message comes back");
    Err(HandlerError::Store(
        crate::ports::StoreError::ConditionFailed,
    ))
}

/// What became of a reply.
enum Applied {
    Yes,
    /// Stale, a duplicate, or for a step that no longer waits for it.
    Dropped,
    /// Another write came between the read and this one.
    LostRace,
}

/// Applies `r` once to its record as read now.
async fn apply_one(deps: &SchedulerDeps, r: &StepReply) -> Result<Applied, HandlerError> {
    let (task, record, workflow) = load(deps, r.task_id).await?;
    if workflow.step(r.step_index).map(|s| s.name.as_str()) != Some(r.step.as_str()) {
        return Err(HandlerError::Poison(format!(
            "reply names step {:?} at index {}, which {} v{} does not have",
            r.step, r.step_index, workflow.name, workflow.version
        )));
    }
    // A JSON Lines result (a distributed forEach's, by reference) is kept as its reference;
    // its array is read only if a query of the workflow reads the step, so that this very
    // transition's conditions and the next request's mapping see it.
    let lines = r.result_ref.as_ref().filter(|p| p.lines.is_some());
    let outcome = match lines {
        Some(p) => keepable_lines(&record, p),
        None => keepable(&record, &r.outcome),
    };
    let mut record = record;
    if let (Some(p), StepOutcome::Succeeded { .. }) = (lines, &outcome)
        && workflow.reads_result(&r.step)
        && let Some(step) = record.steps.get_mut(r.step_index)
    {
        let body = deps
            .ports
            .payloads
            .get(p)
            .await
            .map_err(crate::payloads::store_error)?;
        let array = crate::domain::payload::parse_lines(&body).map_err(|e| {
            HandlerError::Poison(format!("the JSON Lines result {} is not: {e}", p.key()))
        })?;
        step.loaded = Some(std::sync::Arc::new(array));
    }
    let router = transition::TaskRouter {
        workflow: &workflow,
        task: &task,
    };
    let now = deps.ports.clock.now();
    let applied = match r.generation {
        Some(generation) => transition::apply_callback(
            &record,
            r.step_index,
            generation,
            &outcome,
            now,
            &workflow.policies(),
            &router,
        ),
        None => transition::apply_reply(
            &record,
            r.attempt,
            r.step_index,
            r.undo,
            &outcome,
            now,
            &workflow.policies(),
            &router,
        ),
    };
    let mut t = match applied {
        Ok(t) => t,
        Err(why) => {
            info!(%why, "stale or duplicate reply dropped");
            return Ok(Applied::Dropped);
        }
    };
    if let (Some(p), StepOutcome::Succeeded { .. }) = (lines, &outcome)
        && let Some(step) = t.record.steps.get_mut(r.step_index)
    {
        if step.status == crate::StepStatus::Done && step.result.is_none() {
            // The step's result is the reference (the store keeps it as it is).
            step.result_ref = Some(p.clone());
        } else {
            step.loaded = None;
        }
    }
    // A reply that hands the task back at once (an event kept for the next step, say) takes
    // that step's claim with it: no work message back to this scheduler.
    let t = transition::claimed_in_place(
        &record,
        t,
        &deps.instance_id,
        now,
        &workflow.policies(),
        &router,
    );
    if !write(deps.ports.store.as_ref(), &t).await? {
        info!("the record moved on meanwhile; reply dropped");
        return Ok(Applied::LostRace);
    }
    applied_reply(deps, r, &task, &record, &workflow, &t).await?;
    Ok(Applied::Yes)
}

/// A reply's transition was written: its metrics, and its effects.
async fn applied_reply(
    deps: &SchedulerDeps,
    r: &StepReply,
    task: &Task,
    record: &StateRecord,
    workflow: &Workflow,
    t: &Transition,
) -> Result<(), HandlerError> {
    super::count_outcome(&deps.ports.metrics, record.process_state, t);
    let i = r.step_index;
    let waits = |rec: &crate::StateRecord| {
        rec.steps
            .get(i)
            .is_some_and(|s| s.status == crate::StepStatus::Waiting)
    };
    if waits(&t.record)
        && !waits(record)
        && let Some(step) = workflow.step(i)
    {
        deps.ports.metrics.count(
            "CallbackWaits",
            &[
                ("Workflow", workflow.name.as_str()),
                ("Service", step.service.as_str()),
            ],
        );
    }
    info!(undo = r.undo, state = %t.record.process_state, "reply applied");
    run(deps, task, workflow, t).await
}

/// A success whose result is over the limits cannot be kept for later steps and undos: it
/// becomes a `Faulted` outcome (`result_too_large`), which fails the task; the step took
/// effect, so compensation undoes it.
fn keepable(record: &StateRecord, outcome: &StepOutcome) -> StepOutcome {
    if let StepOutcome::Succeeded { result: Some(r) } = outcome {
        // Budgeted as the record keeps it: inline, or its reference.
        let total = record.results_bytes() + crate::domain::payload::stored_bytes(r.len());
        if r.len() > MAX_RESULT_BYTES || total > MAX_RESULTS_BYTES {
            return StepOutcome::Faulted {
                error: format!(
                    "result_too_large: the service's answer is {} bytes (at most {MAX_RESULT_BYTES} per step, and {MAX_RESULTS_BYTES} of results, inline or referenced, per task)",
                    r.len()
                ),
            };
        }
    }
    outcome.clone()
}

/// [`keepable`] for a JSON Lines result: no bound on its size (S3's alone), only on what its
/// reference takes in the record ([`MAX_RESULTS_BYTES`], with the results kept so far).
fn keepable_lines(record: &StateRecord, r: &crate::domain::PayloadRef) -> StepOutcome {
    let total = record.results_bytes() + r.stored_bytes();
    if total > MAX_RESULTS_BYTES {
        return StepOutcome::Faulted {
            error: format!(
                "result_too_large: the step's results ({} bytes, {} elements, by reference) would take the task's results past {MAX_RESULTS_BYTES} bytes in its record",
                r.bytes,
                r.lines.as_ref().map_or(0, |l| l.count)
            ),
        };
    }
    StepOutcome::Succeeded { result: None }
}

/// Performs a written transition's effects, its step requests through `deps` (the task API's
/// first-step claims too, through [`super::start::Dispatch`]).
async fn run(
    deps: &SchedulerDeps,
    task: &Task,
    workflow: &Workflow,
    t: &Transition,
) -> Result<(), HandlerError> {
    let outlets = super::Outlets {
        timer_queue_url: deps.timer_queue_url.as_deref(),
        ..deps.ports.outlets()
    };
    perform(
        &outlets,
        t,
        Some(|branch: Option<usize>| async move {
            match branch {
                // The branch's step: built from the record as seen from the branch.
                Some(b) => send_step_request(deps, task, workflow, &t.record.seen_from(b)).await,
                None => send_step_request(deps, task, workflow, &t.record).await,
            }
        }),
    )
    .await
}

/// Sends the request for the record's current step, or for its undo while Compensating. Its
/// body is built by the step's (or undo's) input mapping; a mapping that selects nothing, or
/// builds a body over the size limit, means the request can never be sent: the scheduler
/// answers it itself with a refusal (`input_mapping_failed`), through the reply queue like any
/// answer, so the usual fencing applies and the step counts as never having taken effect.
async fn send_step_request(
    deps: &SchedulerDeps,
    task: &Task,
    workflow: &Workflow,
    record: &StateRecord,
) -> Result<(), HandlerError> {
    let i = record.step_index;
    let step = workflow
        .step(i)
        .ok_or_else(|| HandlerError::Poison(format!("no step {i}")))?;
    // A forEach step's element: the one this branch runs, or the one being undone. Its state
    // stands in the step's place (its own result, key generation, input revision).
    let undoing = record.process_state == ProcessState::Compensating;
    let element = match record.element() {
        Some((_, k)) => Some(k),
        None if undoing => record.undo_element(i),
        None => None,
    };
    let unit_record;
    let record = match element {
        Some(k) if undoing => {
            let mut r = record.clone();
            if let Some(e) = r.steps[i].element_unit(k) {
                r.steps[i] = e;
            }
            unit_record = r;
            &unit_record
        }
        _ => record,
    };
    let state = record
        .steps
        .get(i)
        .ok_or_else(|| HandlerError::Poison(format!("no step state {i}")))?;
    let name = match element {
        Some(k) => format!("{}#{k}", step.name),
        None => step.name.clone(),
    };
    let complete_by = record
        .complete_by
        .ok_or_else(|| HandlerError::Poison("a running step without a deadline".into()))?;
    // An element of a distributed forEach: its mappings read its task's context, and its keys
    // are made under its task's id (`{task}:{step}#{index}:{action}`), as an element kept in the
    // task's record.
    let element_of = super::runs::element_context(&deps.ports, record, task, &step.name).await?;
    // (A chunk's element: its index in the whole list.)
    let (key_owner, name) = match (&element_of, record.element_of()) {
        (Some((_, owner)), Some(e)) => (
            *owner,
            format!("{}#{}", step.name, e.element_index(element.unwrap_or(0))),
        ),
        _ => (record.task_id, name),
    };
    let forward_key = idempotency_key(key_owner, &name, &step.action, state.generation);
    let undo = record.process_state == ProcessState::Compensating;
    let (action, key, mapping, undoes) = match (&step.undo, undo) {
        (Some(u), true) => (
            u.action.clone(),
            idempotency_key(key_owner, &name, &u.action, state.undo_generation),
            &u.input,
            Some(forward_key),
        ),
        (None, true) => {
            return Err(HandlerError::Poison(format!(
                "step {} has no undo but is being compensated",
                step.name
            )));
        }
        (_, false) => (step.action.clone(), forward_key, &step.input, None),
    };
    let mut context = match element_of {
        Some((context, _)) => context,
        None => crate::domain::context::context(workflow, task, record, i).ok_or_else(|| {
            HandlerError::Poison(format!(
                "the input step {} ran with (revision {:?}) is not kept",
                step.name, state.input_revision
            ))
        })?,
    };
    if let Some(k) = element {
        // The element and its index, for the mapping (`$.element`, `$.index`).
        let list = transition::elements(workflow, task, record, i).map_err(HandlerError::Poison)?;
        context["element"] = list.get(k).cloned().unwrap_or_default();
        context["index"] = serde_json::json!(record.list_index(k));
    }
    // The undo of a step whose outcome is unknown (timed out, cancelled while out, or faulted)
    // has no result of the step to read: its mapping gets `null` there, and the service finds
    // the step by the key it undoes.
    // Rendering stops at the size limit: a mapping repeating a large input cannot make the
    // scheduler build more than that.
    let rendered = if undo && state.result.is_none() {
        mapping.render_lenient(&context, MAX_REQUEST_BYTES)
    } else {
        mapping.render(&context, MAX_REQUEST_BYTES)
    };
    let input = rendered.map_err(|e| e.to_string()).and_then(|v| {
        let bytes = v.to_string().len();
        if bytes > MAX_REQUEST_BYTES {
            Err(format!(
                "request_too_large: the mapped input is {bytes} bytes (at most {MAX_REQUEST_BYTES})"
            ))
        } else {
            Ok(v)
        }
    });
    let callback = match (&step.policy.callback, undo) {
        (Some(_), false) => {
            let token = callback_token(&record.callback_key, &record.task_id, i, state.generation);
            match (
                step.child.is_some() || step.run.is_some(),
                &deps.callback_base_url,
            ) {
                // A sub-workflow step: its child answers through sas itself, by the token alone
                // (so does a distributed forEach's run).
                (true, _) => Ok(Some(CallbackAddress {
                    url: String::new(),
                    token,
                })),
                (false, Some(base)) => Ok(Some(CallbackAddress {
                    url: format!(
                        "{}/tasks/{}/callbacks/{token}",
                        base.trim_end_matches('/'),
                        record.task_id
                    ),
                    token,
                })),
                (false, None) => {
                    Err("callback_unavailable: the deployment has no CALLBACK_BASE_URL".to_owned())
                }
            }
        }
        _ => Ok(None),
    };
    let input = match input.and_then(|v| callback.map(|c| (v, c))) {
        Ok(v) => v,
        Err(error) => {
            warn!(step = %step.name, %error, "the step's request cannot be built; refusing it");
            let reply = SchedulerMessage::Reply(StepReply {
                task_id: record.task_id,
                step: step.name.clone(),
                step_index: i,
                attempt: record.attempt,
                undo,
                outcome: StepOutcome::Failed { error },
                result_ref: None,
                generation: None,
            });
            return send_json(
                deps.ports.queue.as_ref(),
                &deps.reply_queue_url,
                "reply",
                &reply,
                Duration::ZERO,
            )
            .await;
        }
    };
    // A large body is kept before the request that names it goes out.
    let body =
        crate::payloads::packed_body(deps.ports.payloads.as_ref(), task, record, input.0).await?;
    let limit_keys = limit_keys(task, record);
    let request = StepRequest {
        task_id: record.task_id,
        workflow: workflow.name.clone(),
        workflow_version: workflow.version,
        step: step.name.clone(),
        step_index: i,
        service: step.service.clone(),
        action,
        attempt: record.attempt,
        undo,
        undoes,
        idempotency_key: Some(key),
        complete_by,
        timeout_ms: u64::try_from(step.policy.step_timeout.num_milliseconds()).ok(),
        reply_queue_url: deps.reply_queue(record.priority).to_owned(),
        input: body.input,
        input_ref: body.input_ref,
        input_parts: body.parts,
        input_frame: body.frame,
        callback: input.1,
        limit_keys,
        // A child's caller is the task's, so the caller sees it; a run reads only the depth (its
        // elements belong to sas's own caller, `Caller::run`).
        child: (step.child.is_some() || step.run.is_some()).then(|| {
            crate::messages::ChildRequest {
                version: step.child.as_ref().and_then(|c| c.version),
                caller: task.caller.clone(),
                depth: record.parent.as_ref().map_or(1, |p| p.depth + 1),
                priority: record.priority,
            }
        }),
    };
    // The agents of its lane, in its tenant's group.
    super::send_fair_json(
        deps.ports.queue.as_ref(),
        deps.agent_queue(record.priority),
        record.tenant.as_deref(),
        "step request",
        &request,
        Duration::ZERO,
    )
    .await?;
    info!(step = %step.name, action = %request.action, service = %step.service, %complete_by, "step request sent");
    // One timer per task: none if the one armed already arrives by this deadline (the
    // transition kept it: `StateRecord::timer_at`), one for the first of a fan-out's requests
    // with the new one's deadline; it re-arms on arrival.
    let arms = record.arms_timer();
    if let Some(timers) = deps.timer_queue_url.as_ref().filter(|_| arms) {
        let timer = DeadlineTimer::of(record, complete_by);
        // Best effort: a timer that is not armed leaves the deadline to the scheduled sweep.
        if let Err(e) = arm(
            deps.ports.queue.as_ref(),
            timers,
            &timer,
            deps.ports.clock.now(),
        )
        .await
        {
            warn!(error = %e, "deadline timer not armed; the sweep will find the deadline");
        }
    }
    Ok(())
}

/// Sends `timer` to arrive at its deadline (or after SQS's longest delay, to be re-armed), in
/// its task's tenant's group.
pub(crate) async fn arm(
    queue: &dyn crate::ports::Queue,
    url: &str,
    timer: &DeadlineTimer,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<(), HandlerError> {
    let delay = (timer.complete_by - now)
        .to_std()
        .unwrap_or_default()
        .min(super::MAX_SQS_DELAY);
    super::send_fair_json(queue, url, timer.tenant.as_deref(), "timer", timer, delay).await
}
