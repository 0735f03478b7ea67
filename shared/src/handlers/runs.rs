//! A distributed forEach at the edge: the run's record and its elements' records.
//!
//! To the task, such a step is a callback step on [`RUN_SERVICE`]. The agent's call starts its
//! run ([`start_run`]): it reads the list (the step's body, or the S3 object it names), keeps
//! it once as JSON Lines under the run, stores the run's record (its id derived from the
//! step's key, so a call sent again starts no second run); once the agent has answered, it
//! opens the first window of elements. Each element is a record of its own running the step's
//! element view (one step), created on absence and claimed, replied to, retried, timed out and
//! undone as any task.
//!
//! An element that ends for good sends its end to its run through the ends queue (FIFO,
//! grouped by run: [`answer_run`]), before its outbox is cleared. The scheduler applies a run's
//! ends one batch at a time ([`apply_ends`]): the ledger moves in one conditional write, then the
//! next elements open (or undo). The run's end answers the task's step ([`answer_task`]): its
//! elements' results in order, or a refusal; the task's undo of the step undoes every element
//! that took effect ([`undo_run_request`]). The supervisor rechecks a run at its check
//! ([`recheck`]): what it has out is opened again, idempotently.

use super::{HandlerError, TaskPorts};
use crate::domain::payload::SHOWN_WHOLE_BYTES;
use crate::domain::run::{
    Direction, ElementEnd, ListSource, MAX_LIST_BYTES, Run, RunEffects, RunPlan, parse_list,
};
use crate::domain::state::{ElementOf, ParentLink, RunState, token_fence};
use crate::domain::transition::{self, Rejection, StepOutcome, Transition};
use crate::domain::workflow::{RUN_SERVICE, Tolerated};
use crate::domain::{ProcessState, StateRecord, Task, TaskId, Workflow};
use crate::messages::{ElementsEnded, SchedulerMessage, StepRequest};
use crate::ports::{GroupedMessage, NewTask, PayloadError, StoreError};
use serde_json::Value;
use tracing::{info, warn};

/// The id of the run a distributed forEach step starts under idempotency key `key`.
pub fn run_id(key: &str) -> TaskId {
    TaskId::derived(&format!("run:{key}"))
}

/// The id of element `k` of run `run`.
pub fn element_id(run: TaskId, k: u32) -> TaskId {
    TaskId::derived(&format!("element:{run}:{k}"))
}

/// Whether `request` is a distributed forEach step's (the agent starts its run).
pub fn is_run_request(request: &StepRequest) -> bool {
    request.service == RUN_SERVICE
}

/// How often a run's writer reads it again after losing a race.
const RACES: usize = 5;

/// The agent's call on a run ([`start_run`], [`undo_run_request`]): the step's answer, sent
/// first, then the elements it opens or undoes ([`RunCall::then`]). The answer is due within
/// the attempt's timeout (an element's call's); a window of up to `maxConcurrency` elements
/// takes longer, and opening or undoing it is idempotent: an agent that dies after the answer
/// leaves its message to come back (the same run, what it has out opened or undone again), and
/// the run's check (`RUN_RECHECK`) as the backstop.
pub struct RunCall {
    pub answer: StepOutcome,
    then: Option<Then>,
}

/// What a call on a run does once its answer is sent.
enum Then {
    /// A new run's first window (its list as read).
    Open {
        record: StateRecord,
        open: Vec<u32>,
        items: Vec<Value>,
    },
    /// A run that existed: what it has out, again.
    Resume(StateRecord),
    /// A run just undone: its transition's effects.
    Effects(StateRecord, RunEffects),
}

impl RunCall {
    fn answered(answer: StepOutcome) -> Self {
        Self { answer, then: None }
    }

    /// `Accepted`, then `then`: the run's end answers.
    fn accepted(then: Then) -> Self {
        Self {
            answer: StepOutcome::Accepted,
            then: Some(then),
        }
    }

    /// Opens or undoes what the call asks for: call it once the answer is sent.
    pub async fn then(self, ports: &TaskPorts) -> Result<(), HandlerError> {
        match self.then {
            None => Ok(()),
            Some(Then::Open {
                record,
                open: indices,
                items,
            }) => open(ports, &record, &indices, Some(&items)).await,
            Some(Then::Resume(run)) => resume(ports, &run).await,
            Some(Then::Effects(run, fx)) => effects(ports, &run, &fx, false).await,
        }
    }
}

/// The agent's call of a distributed forEach step: starts its run (or, sent again, opens again
/// what the run has out) and answers `Accepted`: the run's end completes the step. A list that
/// is not one (or over the bounds) refuses the step; an S3 object that cannot be read now times
/// the attempt out (it is retried, under the same key: the same run).
pub async fn start_run(
    ports: &TaskPorts,
    request: &StepRequest,
    body: Value,
) -> Result<RunCall, HandlerError> {
    let (Some(callback), Some(child)) = (&request.callback, &request.child) else {
        return Ok(RunCall::answered(StepOutcome::Failed {
            error: "a distributed forEach's request without its callback or caller".into(),
        }));
    };
    let Some((step_index, generation)) = token_fence(&callback.token) else {
        return Ok(RunCall::answered(StepOutcome::Failed {
            error: "a distributed forEach's callback token names no step".into(),
        }));
    };
    let id = run_id(&request.idempotency_key());
    if let Some(existing) = ports.store.get_state(id).await? {
        info!(run = %id, "the step's run exists: opening again what it has out");
        return Ok(RunCall::accepted(Then::Resume(existing)));
    }
    let workflow = super::catalog_workflow(
        &ports.definitions,
        &request.workflow,
        request.workflow_version,
    )
    .await?;
    let (Some(def), Some(view)) = (
        workflow.step(step_index).and_then(|s| s.run.as_ref()),
        workflow.element_view(step_index),
    ) else {
        return Ok(RunCall::answered(StepOutcome::Failed {
            error: format!(
                "step {step_index} of {} v{} is no distributed forEach",
                workflow.name, workflow.version
            ),
        }));
    };
    let refused = |code: &str, message: String| {
        Ok(RunCall::answered(StepOutcome::Refused {
            code: code.into(),
            message,
        }))
    };
    let items = match ListSource::of(body) {
        Ok(ListSource::Inline(items)) => items,
        Ok(ListSource::Object(at)) => match ports.payloads.read_object(&at, MAX_LIST_BYTES).await {
            Ok(bytes) => match parse_list(&at, &bytes) {
                Ok(items) => items,
                Err(e) => return refused("list_invalid", e.0),
            },
            Err(PayloadError::Unavailable(e)) => {
                return Ok(RunCall::answered(StepOutcome::TimedOut {
                    error: format!("the list could not be read: {e}"),
                }));
            }
            Err(e) => return refused("list_unreadable", e.to_string()),
        },
        Err(e) => return refused("list_invalid", e.0),
    };
    if items.is_empty() {
        return Ok(RunCall::answered(StepOutcome::Succeeded {
            result: Some("[]".into()),
        }));
    }
    let tolerated = match def.tolerated {
        Tolerated::Count(n) => n,
        Tolerated::Percent(pc) => u32::try_from(items.len() * pc as usize / 100).unwrap_or(0),
    };
    let (ledger, fx) = match Run::start(RunPlan {
        total: items.len(),
        max_concurrency: def.max_concurrency,
        tolerated,
        undoable: def.element.undo.is_some(),
        chunk: def.chunk,
    }) {
        Ok(x) => x,
        Err(e) => return refused("list_invalid", e.to_string()),
    };
    // The part of the task's context the elements read, kept once (an element then never
    // reads its task's whole input and results).
    let Some(context) = context_part(ports, request, &workflow, &view, step_index).await? else {
        return Ok(RunCall::answered(StepOutcome::Failed {
            error: "the input the step ran with is not kept".into(),
        }));
    };
    let context = ports
        .payloads
        .put(id, context.to_string().as_bytes())
        .await
        .map_err(crate::payloads::store_error)?;
    // The list, kept once: elements open from it, in any later invocation.
    let lines: Vec<String> = items.iter().map(Value::to_string).collect();
    let list = ports
        .payloads
        .put(id, lines.join("\n").as_bytes())
        .await
        .map_err(crate::payloads::store_error)?;
    let now = ports.clock.now();
    let parent = ParentLink {
        task_id: request.task_id,
        step: request.step.clone(),
        step_index,
        generation,
        reply_queue_url: request.reply_queue_url.clone(),
        depth: child.depth,
        undo_attempt: None,
        released: false,
        element: None,
    };
    let mut record = transition::new_run(
        id,
        &view,
        parent,
        RunState {
            list: Some(list),
            context: Some(context),
            ledger,
        },
        now,
    );
    // The kept list is the run's payload: its retention deletes it.
    record.payloads = true;
    // Its task's lane and tenant, which its elements take.
    record.priority = child.priority;
    record.tenant = Some(crate::domain::lane::tenant(&child.caller));
    let task = Task {
        id,
        workflow: view.name.clone(),
        workflow_version: view.version,
        input: Value::Null,
        input_ref: None,
        input_revision: 0,
        earlier_inputs: vec![],
        reply_queue_url: None,
        created_at: record.created_at,
        caller: crate::domain::Caller::run(&id),
        keys: vec![],
    };
    // Condition: absent (the store's create) - keeps "one run per step and key".
    match ports.store.create(NewTask::new(&task, &record)).await {
        Ok(_) => {}
        Err(StoreError::ConditionFailed) => {
            // Another agent (a copy of this request) stored it first: it opens the window; this
            // one opens again what it has out, which changes nothing.
            return Ok(match ports.store.get_state(id).await? {
                Some(existing) => RunCall::accepted(Then::Resume(existing)),
                None => RunCall::answered(StepOutcome::Accepted),
            });
        }
        Err(e) => return Err(e.into()),
    }
    info!(run = %id, elements = items.len(), "the step's run started");
    Ok(RunCall::accepted(Then::Open {
        record,
        open: fx.open,
        items,
    }))
}

/// Opens again what a run has out (forward or undoing): a writer that died between the
/// ledger's write and its effects, or a call sent again.
async fn resume(ports: &TaskPorts, run: &StateRecord) -> Result<(), HandlerError> {
    let Some(state) = &run.run else {
        return Ok(());
    };
    if run.process_state != ProcessState::Processing {
        return Ok(());
    }
    effects(ports, run, &state.ledger.outstanding(), false).await
}

/// What a run's transition asks: elements to open, elements to undo; and, if it ended, its
/// notice delivered (`deliver`: by the scheduler; the agent and the supervisor leave it to the
/// sweep, which finds it owed).
async fn effects(
    ports: &TaskPorts,
    run: &StateRecord,
    fx: &RunEffects,
    deliver: bool,
) -> Result<(), HandlerError> {
    open(ports, run, &fx.open, None).await?;
    undo_elements(ports, run, &fx.undo).await?;
    if deliver && fx.end.is_some() {
        super::deliver_notice(ports, run).await?;
    }
    Ok(())
}

/// Opens elements `indices` of `run`: each element's record, created on absence, and its work
/// message (again, for one that exists and still waits for its claim: a work message lost
/// with the writer that died).
async fn open(
    ports: &TaskPorts,
    run: &StateRecord,
    indices: &[u32],
    items: Option<&[Value]>,
) -> Result<(), HandlerError> {
    if indices.is_empty() {
        return Ok(());
    }
    let (Some(state), Some(link)) = (&run.run, &run.parent) else {
        return Ok(());
    };
    let read;
    let items = match items {
        Some(items) => items,
        None => {
            read = kept_list(ports, state).await?;
            &read
        }
    };
    let ledger = &state.ledger;
    let chunked = ledger.chunk > 1;
    let view = super::step_view(&ports.definitions, run, link.step_index, chunked).await?;
    let now = ports.clock.now();
    let mut values = Vec::with_capacity(indices.len());
    for &k in indices {
        let range = ledger.elements_of(k);
        let Some(slice) = items
            .get(range.start as usize..range.end as usize)
            .filter(|s| !s.is_empty())
        else {
            return Err(HandlerError::Poison(format!(
                "run {} has no element {k} in its list",
                run.task_id
            )));
        };
        // A chunk runs its elements, in order: its input is their list.
        let unit = match slice {
            [value] if !chunked => Unit::Element(value.clone()),
            _ => Unit::Chunk {
                first: range.start,
                elements: Value::Array(slice.to_vec()),
            },
        };
        values.push((k, unit));
    }
    // A few at once: a window of hundreds opens within the agent's attempt.
    use futures::StreamExt;
    // (The futures are made first: a stream's closure over borrows is not `Send` for every
    // lifetime, as the Lambda runtime's handlers must be.)
    let opens: Vec<_> = values
        .into_iter()
        .map(|(k, unit)| open_one(ports, run, link, &view, k, unit, now))
        .collect();
    let opened: Vec<Result<(), HandlerError>> = futures::stream::iter(opens)
        .buffer_unordered(OPENS_AT_ONCE)
        .collect()
        .await;
    opened.into_iter().collect::<Result<(), _>>()?;
    info!(run = %run.task_id, opened = indices.len(), "elements opened");
    Ok(())
}

/// How many elements [`open`] opens at once.
const OPENS_AT_ONCE: usize = 16;

/// What one of a run's records runs: an element, or a chunk of them.
enum Unit {
    /// The list's element.
    Element(Value),
    /// The elements from the list's `first` on, as a list.
    Chunk { first: u32, elements: Value },
}

/// Opens unit `k` of `run` (an element, or a chunk): its record, created on absence, and its
/// work message (again, for one that exists and still waits for its claim).
async fn open_one(
    ports: &TaskPorts,
    run: &StateRecord,
    link: &ParentLink,
    view: &Workflow,
    k: u32,
    unit: Unit,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<(), HandlerError> {
    let id = element_id(run.task_id, k);
    let (input, first) = match unit {
        Unit::Element(value) => (value, None),
        Unit::Chunk { first, elements } => (elements, Some(first)),
    };
    let task = Task {
        id,
        workflow: view.name.clone(),
        workflow_version: view.version,
        input,
        input_ref: None,
        input_revision: 0,
        earlier_inputs: vec![],
        reply_queue_url: None,
        created_at: crate::domain::state::to_millis(now),
        caller: crate::domain::Caller::run(&run.task_id),
        keys: vec![],
    };
    let mut record = StateRecord::new(
        id,
        view,
        None,
        now,
        now + view.policies().at(0).pickup_timeout,
    );
    record.payloads = task.has_large_input();
    // The run's lane and tenant (its task's): one caller's forEach is its own share.
    record.priority = run.priority;
    record.tenant = run.tenant.clone();
    record.parent = Some(ParentLink {
        task_id: run.task_id,
        step: link.step.clone(),
        step_index: 0,
        generation: 0,
        reply_queue_url: String::new(),
        depth: link.depth,
        undo_attempt: None,
        released: false,
        element: Some(ElementOf {
            index: k,
            task_id: link.task_id,
            step_index: link.step_index,
            first,
        }),
    });
    // Condition: absent (the store's create) - keeps "an element is opened once".
    let send = match ports.store.create(NewTask::new(&task, &record)).await {
        Ok(_) => true,
        Err(StoreError::ConditionFailed) => ports
            .store
            .get_state(id)
            .await?
            .is_some_and(|e| e.process_state == ProcessState::Pending && e.attempt == 0),
        Err(e) => return Err(e.into()),
    };
    if send {
        super::enqueue(
            ports,
            crate::messages::WorkMessage::of(&record),
            chrono::Duration::zero(),
            now,
        )
        .await?;
    }
    Ok(())
}

/// The run's kept list, one element per line.
async fn kept_list(ports: &TaskPorts, state: &RunState) -> Result<Vec<Value>, HandlerError> {
    let Some(list) = &state.list else {
        return Ok(vec![]);
    };
    let bytes = ports
        .payloads
        .get(list)
        .await
        .map_err(crate::payloads::store_error)?;
    let text = String::from_utf8_lossy(&bytes);
    text.lines()
        .map(|l| {
            serde_json::from_str(l)
                .map_err(|e| HandlerError::Poison(format!("a kept list's line is not JSON: {e}")))
        })
        .collect()
}

/// Begins the undo of elements `indices` of `run` (each undone as a unit: its own undo, under
/// its own key and deadline). An element already undoing, or undone, is left as it is.
async fn undo_elements(
    ports: &TaskPorts,
    run: &StateRecord,
    indices: &[u32],
) -> Result<(), HandlerError> {
    use futures::StreamExt;
    let undos: Vec<_> = indices.iter().map(|&k| undo_one(ports, run, k)).collect();
    let undone: Vec<Result<(), HandlerError>> = futures::stream::iter(undos)
        .buffer_unordered(OPENS_AT_ONCE)
        .collect()
        .await;
    undone.into_iter().collect()
}

/// Begins the undo of element `k` of `run`, unless it is undoing or undone already.
async fn undo_one(ports: &TaskPorts, run: &StateRecord, k: u32) -> Result<(), HandlerError> {
    let id = element_id(run.task_id, k);
    for _ in 0..RACES {
        let Some(element) = ports.store.get_state(id).await? else {
            return Ok(());
        };
        if element.process_state != ProcessState::Processed {
            return Ok(());
        }
        let workflow = super::workflow_of(&ports.definitions, &element).await?;
        let now = ports.clock.now();
        let t = match transition::undo_as_unit(&element, run.version, now, &workflow.policies()) {
            Ok(t) => t,
            Err(e) => {
                warn!(element = %id, error = %e, "the element cannot be undone");
                return Ok(());
            }
        };
        // Condition: the transition's (the element as read) - keeps "an element is undone
        // once".
        if super::write(ports.store.as_ref(), &t).await? {
            super::perform_no_step(&ports.outlets(), &t).await?;
            return Ok(());
        }
    }
    Ok(())
}

/// An element that ended for good sends its end to its run, through the ends queue: called as
/// its final notice is delivered, before its outbox is cleared (a crash from here on sends it
/// again; the queue drops the copy within its window, and the run ignores one after it).
pub async fn answer_run(ports: &TaskPorts, record: &StateRecord) -> Result<(), HandlerError> {
    let Some(link) = &record.parent else {
        return Ok(());
    };
    let Some(element) = &link.element else {
        return Ok(());
    };
    use ProcessState as P;
    // A chunk's elements that ended with no effect: those refused (the chunk tolerates every
    // refusal), or all of them if the chunk itself failed and was undone.
    let chunk = element.first.map(|_| {
        let elements = record.steps.first().map_or(&[][..], |s| &s.elements[..]);
        let refused = elements
            .iter()
            .filter(|e| e.status != crate::domain::StepStatus::Done)
            .count();
        (refused, elements.len())
    });
    let (direction, ok) = match (link.undo_attempt.is_some(), record.process_state) {
        (false, P::Processed) if chunk.is_some_and(|(refused, len)| refused == len) => {
            (Direction::Forward, false)
        }
        (false, P::Processed) => (Direction::Forward, true),
        // Refused, or failed and undone by itself: no effect left. Resolved by an operator:
        // what it settled is theirs; the run counts it as having none.
        (false, P::Refused | P::Compensated | P::Resolved) => (Direction::Forward, false),
        (true, P::Compensated | P::Refused) => (Direction::Undo, true),
        (true, P::CompensationFailed | P::Resolved) => (Direction::Undo, false),
        // Its step failed and its own undo was refused: its effect stays, for an operator.
        (false, P::CompensationFailed) => (Direction::Stuck, false),
        _ => return Ok(()),
    };
    let Some(url) = &ports.ends_queue_url else {
        return Err(HandlerError::Config(
            "an element ended, but this deployment has no ENDS_QUEUE_URL".into(),
        ));
    };
    let refused = match (chunk, direction, record.process_state) {
        (Some((refused, _)), Direction::Forward, P::Processed) => Some(refused),
        // Failed and undone: none of its elements took effect. (A chunk's length is its
        // input's, which a record that never ran its step has not listed yet.)
        (Some(_), Direction::Forward, _) => Some(chunk_length(ports, record).await?),
        _ => None,
    };
    let message = SchedulerMessage::Ended(ElementsEnded {
        run_id: link.task_id,
        ends: vec![ElementEnd {
            index: element.index,
            direction,
            ok,
            refused: refused.map(|n| u32::try_from(n).unwrap_or(u32::MAX)),
        }],
    });
    let body = serde_json::to_string(&message)
        .map_err(|e| HandlerError::Poison(format!("an end does not serialize: {e}")))?;
    let group = link.task_id.to_string();
    let dedup = format!(
        "{}-{}",
        record.task_id,
        match direction {
            Direction::Forward | Direction::Stuck => "ended",
            Direction::Undo => "undone",
        }
    );
    ports
        .queue
        .send_grouped(GroupedMessage {
            queue_url: url,
            group: &group,
            dedup_id: &dedup,
            body: &body,
        })
        .await?;
    info!(run = %link.task_id, index = element.index, ?direction, ok, "the element's end sent to its run");
    Ok(())
}

/// How many elements chunk record `record` runs: its task's input's length.
async fn chunk_length(ports: &TaskPorts, record: &StateRecord) -> Result<usize, HandlerError> {
    let Some((task, _)) = ports.store.get(record.task_id).await? else {
        return Err(HandlerError::Poison(format!(
            "chunk {} has no task item",
            record.task_id
        )));
    };
    Ok(task.input.as_array().map_or(0, Vec::len))
}

/// The scheduler applies a batch of ends to their run: one conditional write, then what it
/// asks (elements opened or undone, its answer delivered).
pub async fn apply_ends(ports: &TaskPorts, ended: &ElementsEnded) -> Result<(), HandlerError> {
    for _ in 0..RACES {
        let Some(run) = ports.store.get_state(ended.run_id).await? else {
            return Err(HandlerError::Poison(format!("no run {}", ended.run_id)));
        };
        // An end applied already: delivered again after a writer died between the ledger's
        // write and its effects (or a copy past the queue's window), alone or beside new ends.
        // What the ledger has out is then opened (or undone) again now, not at the run's check.
        let stale = run.process_state == ProcessState::Processing
            && run
                .run
                .as_ref()
                .is_some_and(|s| ended.ends.iter().any(|e| s.ledger.stale(e)));
        if stale && let Some(state) = &run.run {
            let mut probe = state.ledger.clone();
            probe.apply(&ended.ends);
            if probe == state.ledger {
                info!(run = %ended.run_id, "ends applied already: opening again what the run has out");
                return resume(ports, &run).await;
            }
        }
        let (t, fx) = match transition::apply_ends(&run, &ended.ends, ports.clock.now()) {
            Ok(x) => x,
            Err(why) => {
                // The run's end was written and its writer died before answering the task: its
                // ends come back with their message, and the answer goes out now (not at the
                // notice's backstop, minutes later).
                if run.notice_pending() {
                    info!(run = %ended.run_id, "ends for a run that is over and owes its answer: answering");
                    return super::deliver_notice(ports, &run).await;
                }
                info!(run = %ended.run_id, %why, "ends for a run that is over: dropped");
                return Ok(());
            }
        };
        if write(ports, &t).await? {
            info!(run = %ended.run_id, ledger = %ledger(&t.record), "ends applied");
            effects(ports, &t.record, &fx, true).await?;
            if stale {
                info!(run = %ended.run_id, "some ends applied already: opening again what the run has out");
                resume(ports, &t.record).await?;
            }
            return Ok(());
        }
    }
    // Comes back with its message: the run's ends queue holds the group meanwhile.
    Err(HandlerError::Store(StoreError::ConditionFailed))
}

/// The task's undo of a distributed forEach step: its run is undone as a unit. `Accepted`:
/// the run's end answers this undo. Otherwise the answer, now: success if the run never
/// started or took no effect, a refusal if it waits for an operator.
pub async fn undo_run_request(
    ports: &TaskPorts,
    request: &StepRequest,
) -> Result<RunCall, HandlerError> {
    let Some(forward) = &request.undoes else {
        return Ok(RunCall::answered(StepOutcome::Failed {
            error: "a distributed forEach's undo without the key it undoes".into(),
        }));
    };
    let id = run_id(forward);
    for _ in 0..RACES {
        let Some(run) = ports.store.get_state(id).await? else {
            info!(run = %id, "the step's run never started: nothing to undo");
            return Ok(RunCall::answered(StepOutcome::Succeeded { result: None }));
        };
        let ours = run.parent.as_ref().and_then(|l| l.undo_attempt) == Some(request.attempt);
        match run.process_state {
            ProcessState::Compensated | ProcessState::Refused => {
                return Ok(RunCall::answered(StepOutcome::Succeeded { result: None }));
            }
            ProcessState::CompensationFailed | ProcessState::Resolved | ProcessState::Error => {
                return Ok(RunCall::answered(StepOutcome::Refused {
                    code: "run_needs_operator".into(),
                    message: format!(
                        "run {id} is {}: an operator settles its elements before its task is undone",
                        run.process_state
                    ),
                }));
            }
            // This undo was sent again (its first sender may have died after the run's write,
            // before its undos began): what the run has out is undone again; the run answers.
            ProcessState::Processing if ours => {
                return Ok(RunCall::accepted(Then::Resume(run)));
            }
            _ => {}
        }
        let (t, fx) = match transition::undo_run(&run, request.attempt, ports.clock.now()) {
            Ok(x) => x,
            Err(Rejection::StaleAttempt { record, .. }) => {
                // A copy of an earlier attempt's undo, delivered late (or come back after its
                // agent failed midway): the run answers the newest (its task fences this answer
                // out), and what it has out is undone again (the first delivery's undos may
                // not all have begun).
                info!(run = %id, answers = record, "an earlier attempt's undo: the run answers a later one");
                return Ok(RunCall::accepted(Then::Resume(run)));
            }
            Err(e) => {
                return Ok(RunCall::answered(StepOutcome::Refused {
                    code: "run_not_undoable".into(),
                    message: format!("run {id}: {e}"),
                }));
            }
        };
        if write(ports, &t).await? {
            info!(run = %id, ledger = %ledger(&t.record), "the step's run is undone as a unit");
            // Nothing took effect: answered now (its owed notice answers again, fenced).
            let answer = if fx.end.is_some() && t.record.process_state == ProcessState::Compensated
            {
                StepOutcome::Succeeded { result: None }
            } else {
                StepOutcome::Accepted
            };
            return Ok(RunCall {
                answer,
                then: Some(Then::Effects(t.record, fx)),
            });
        }
    }
    Err(HandlerError::Store(StoreError::Unavailable(format!(
        "run {id} kept changing while its task undid it"
    ))))
}

/// The supervisor finds a run's check due: it moves the check on and opens again what the run
/// has out. `false`: another writer came first.
pub async fn recheck(ports: &TaskPorts, run: &StateRecord) -> Result<bool, HandlerError> {
    let (t, fx) = match transition::recheck(run, ports.clock.now()) {
        Ok(x) => x,
        Err(Rejection::NotDue { .. }) => return Ok(false),
        Err(e) => {
            info!(run = %run.task_id, %e, "not rechecked");
            return Ok(false);
        }
    };
    if !write(ports, &t).await? {
        return Ok(false);
    }
    effects(ports, &t.record, &fx, false).await?;
    Ok(true)
}

/// A run that ended for good answers its task's step (or the task's undo of it): `Processed`
/// with its elements' results in order (`null` for one that ended with no effect), `Refused`
/// with how many were refused; `Faulted` if it stopped and could not undo an element (the step
/// took effect; the run waits for an operator). Sent before the run's outbox is cleared.
pub async fn answer_task(ports: &TaskPorts, record: &StateRecord) -> Result<(), HandlerError> {
    let (Some(link), Some(state)) = (&record.parent, &record.run) else {
        return Ok(());
    };
    let ledger = &state.ledger;
    if let Some(attempt) = link.undo_attempt {
        let outcome = match record.process_state {
            ProcessState::Compensated => StepOutcome::Succeeded { result: None },
            ProcessState::CompensationFailed => StepOutcome::Refused {
                code: "element_undo_failed".into(),
                message: format!(
                    "run {}: {}",
                    record.task_id,
                    record
                        .last_error
                        .as_deref()
                        .unwrap_or("an element's undo failed")
                ),
            },
            _ => return Ok(()),
        };
        super::answer_step(ports, link, Some(attempt), outcome).await?;
        info!(task = %link.task_id, step = %link.step, "the run answered its task's undo");
        return Ok(());
    }
    let mut kept = None;
    let outcome = match record.process_state {
        ProcessState::Processed => {
            match results(ports, record.task_id, link.task_id, ledger).await? {
                Results::Inline(text) => StepOutcome::Succeeded { result: Some(text) },
                Results::Lines(r) => {
                    info!(
                        run = %record.task_id,
                        key = %r.key(),
                        bytes = r.bytes,
                        "the step's results kept as JSON Lines"
                    );
                    kept = Some(r);
                    StepOutcome::Succeeded { result: None }
                }
            }
        }
        ProcessState::Refused => StepOutcome::Refused {
            code: "elements_refused".into(),
            message: format!(
                "{} of {} elements refused, more than the {} tolerated",
                ledger.refused(),
                ledger.total,
                ledger.tolerated
            ),
        },
        // Stopped, and an element's undo was refused: its effect stays, for an operator (the
        // run's alert went out). The step took effect: it fails the task now, whose undo of it
        // is refused while the run waits (`run_needs_operator`), so the task ends
        // CompensationFailed, its own alert naming the step.
        ProcessState::CompensationFailed => StepOutcome::Faulted {
            error: format!(
                "run {} stopped ({} of {} elements refused, more than the {} tolerated) and \
                 could not undo every element that took effect: {}",
                record.task_id,
                ledger.refused(),
                ledger.total,
                ledger.tolerated,
                record
                    .last_error
                    .as_deref()
                    .unwrap_or("an element's undo was refused")
            ),
        },
        _ => return Ok(()),
    };
    super::answer_step_with(ports, link, None, outcome, kept).await?;
    info!(task = %link.task_id, step = %link.step, "the run answered its task's step");
    Ok(())
}

/// A run's results as its step's result: a JSON array (text) when it is within what a view
/// shows whole ([`SHOWN_WHOLE_BYTES`]), else a JSON Lines payload of the task's, by reference.
enum Results {
    Inline(String),
    Lines(crate::domain::PayloadRef),
}

/// The step's result: each element's result in order (`null` for one with none). The
/// elements' records are read a few dozen at once, so a run of 10,000 answers in seconds, and
/// never held all at once: past [`SHOWN_WHOLE_BYTES`] they go to a JSON Lines payload of
/// task `task` as they are read (the object written before the reply that names it). A
/// writer that dies and answers again writes a second object, under a second name: the
/// task's reply is fenced (one answer applied), and its retention deletes both.
///
/// A result a view shows whole stays what it was: an ordinary result (by reference past a
/// message's and the record's inline sizes, read back whole with the record, shown whole). A
/// larger one costs a PutObject as JSON Lines as it would as a message's payload (or a
/// multipart upload past a part), and the task's record, read for every message of the task,
/// never reads it back unless a query reads the step; a view showed it as its size and hash
/// anyway, and now shows its reference.
async fn results(
    ports: &TaskPorts,
    run: TaskId,
    task: TaskId,
    ledger: &Run,
) -> Result<Results, HandlerError> {
    use futures::StreamExt;
    let parse = |r: Option<&str>| {
        r.and_then(|r| serde_json::from_str(r).ok())
            .unwrap_or(Value::Null)
    };
    let chunked = ledger.chunk > 1;
    let mut lines = futures::stream::iter(0..ledger.units())
        .map(move |k| async move {
            let len = ledger.elements_of(k).len();
            let values: Vec<Value> = match ports.store.get_state(element_id(run, k)).await? {
                // A chunk: its elements' results, in order (`null` for one refused).
                Some(e) if e.process_state == ProcessState::Processed && chunked => {
                    let elements = e.steps.first().map_or(&[][..], |s| &s.elements[..]);
                    (0..len)
                        .map(|i| match elements.get(i) {
                            Some(el) if el.status == crate::domain::StepStatus::Done => {
                                parse(el.result.as_deref())
                            }
                            _ => Value::Null,
                        })
                        .collect()
                }
                Some(e) if e.process_state == ProcessState::Processed => {
                    vec![parse(e.steps.first().and_then(|s| s.result.as_deref()))]
                }
                _ => vec![Value::Null; len],
            };
            // Compact: a line break within a string is escaped, so each is one line.
            values
                .iter()
                .map(|v| {
                    serde_json::to_vec(v)
                        .map_err(|e| HandlerError::Poison(format!("an element's result: {e}")))
                })
                .collect::<Result<Vec<_>, _>>()
        })
        .buffered(READS_AT_ONCE)
        .flat_map(|unit| {
            futures::stream::iter(match unit {
                Ok(lines) => lines.into_iter().map(Ok).collect::<Vec<_>>(),
                Err(e) => vec![Err(e)],
            })
        })
        .boxed();
    let mut held: Vec<Vec<u8>> = Vec::new();
    // As a JSON array: its brackets and a comma between two elements.
    let mut array_bytes = 1;
    while let Some(line) = lines.next().await {
        let line = line?;
        array_bytes += line.len() + 1;
        held.push(line);
        if array_bytes > SHOWN_WHOLE_BYTES {
            return lines_kept(ports, task, held, lines)
                .await
                .map(Results::Lines);
        }
    }
    let mut text = Vec::with_capacity(array_bytes);
    text.push(b'[');
    for (i, line) in held.iter().enumerate() {
        if i > 0 {
            text.push(b',');
        }
        text.extend_from_slice(line);
    }
    text.push(b']');
    String::from_utf8(text)
        .map(Results::Inline)
        .map_err(|e| HandlerError::Poison(format!("the run's results: {e}")))
}

/// Keeps `held` then the rest of `lines` as a JSON Lines payload of `task`. A line that could
/// not be read fails the write (nothing kept) with its own error.
async fn lines_kept(
    ports: &TaskPorts,
    task: TaskId,
    held: Vec<Vec<u8>>,
    rest: futures::stream::BoxStream<'_, Result<Vec<u8>, HandlerError>>,
) -> Result<crate::domain::PayloadRef, HandlerError> {
    use futures::StreamExt;
    let failed: std::sync::Arc<std::sync::Mutex<Option<HandlerError>>> = Default::default();
    let seen = failed.clone();
    let rest = rest.map(move |line| {
        line.map_err(|e| {
            let why = e.to_string();
            if let Ok(mut slot) = seen.lock() {
                slot.get_or_insert(e);
            }
            PayloadError::Unavailable(format!("an element's result could not be read: {why}"))
        })
    });
    let all = futures::stream::iter(held.into_iter().map(Ok))
        .chain(rest)
        .boxed();
    match ports.payloads.put_lines(task, all).await {
        Ok(r) => Ok(r),
        Err(e) => {
            let own = failed.lock().ok().and_then(|mut slot| slot.take());
            Err(own.unwrap_or_else(|| crate::payloads::store_error(e).into()))
        }
    }
}

/// How many element records [`results`] reads at once (in order: `buffered`).
const READS_AT_ONCE: usize = 32;

async fn write(ports: &TaskPorts, t: &Transition) -> Result<bool, HandlerError> {
    super::write(ports.store.as_ref(), t).await
}

fn ledger(r: &StateRecord) -> String {
    r.run
        .as_ref()
        .map_or_else(String::new, |s| s.ledger.to_string())
}

/// The run's elements that ended `Processed` are released (their task ended for good and
/// will never undo them): their retention starts. A few at once; idempotent, so a crash
/// releases again what is left.
pub(crate) async fn release_elements(ports: &TaskPorts, run: TaskId) -> Result<(), HandlerError> {
    use futures::StreamExt;
    let Some(record) = ports.store.get_state(run).await? else {
        return Ok(());
    };
    let Some(state) = &record.run else {
        return Ok(());
    };
    let done: Vec<TaskId> = (0..state.ledger.marks.len() as u32)
        .filter(|k| state.ledger.mark(*k) == Some(crate::domain::run::Mark::Done))
        .map(|k| element_id(run, k))
        .collect();
    let released: Vec<Result<(), HandlerError>> = futures::stream::iter(done)
        .map(|id| super::release(ports, id))
        .buffer_unordered(RELEASES_AT_ONCE)
        .collect()
        .await;
    released.into_iter().collect()
}

/// How many elements [`release_elements`] releases at once.
const RELEASES_AT_ONCE: usize = 16;

/// The part of task `request.task_id`'s context that the elements' mappings (`view`'s one
/// step: its input and its undo's) read. `None`: the input the step ran with is not kept.
async fn context_part(
    ports: &TaskPorts,
    request: &StepRequest,
    workflow: &Workflow,
    view: &Workflow,
    step_index: usize,
) -> Result<Option<Value>, HandlerError> {
    let Some((task, record)) = ports.store.get(request.task_id).await? else {
        return Err(HandlerError::Poison(format!(
            "a run for task {}, which is gone",
            request.task_id
        )));
    };
    let Some(context) = crate::domain::context::context(workflow, &task, &record, step_index)
    else {
        return Ok(None);
    };
    let Some(step) = view.steps.first() else {
        return Ok(Some(Value::Null));
    };
    let mut read = vec![&step.input];
    read.extend(step.undo.as_ref().map(|u| &u.input));
    Ok(Some(crate::domain::mapping::part_read(&context, &read)))
}

/// The context parts of the runs this process saw last, by run: kept once per run and never
/// changed, so an element of a run seen already reads nothing more.
#[derive(Default)]
pub struct RunContexts(std::sync::Mutex<std::collections::HashMap<TaskId, std::sync::Arc<Value>>>);

/// How many runs' context parts a process keeps (a run's is a few KB, as its mappings read).
const RUN_CONTEXTS: usize = 64;

impl RunContexts {
    fn get(&self, run: TaskId) -> Option<std::sync::Arc<Value>> {
        self.0.lock().ok()?.get(&run).cloned()
    }

    fn keep(&self, run: TaskId, part: std::sync::Arc<Value>) {
        if let Ok(mut kept) = self.0.lock() {
            if kept.len() >= RUN_CONTEXTS {
                kept.clear();
            }
            kept.insert(run, part);
        }
    }
}

/// The context part run `run` kept, from this process's cache or its record. `None`: a run
/// that kept none (started before they were kept).
async fn run_context(
    ports: &TaskPorts,
    run: TaskId,
) -> Result<Option<std::sync::Arc<Value>>, HandlerError> {
    if let Some(part) = ports.run_contexts.get(run) {
        return Ok(Some(part));
    }
    let Some(record) = ports.store.get_state(run).await? else {
        return Err(HandlerError::Poison(format!(
            "an element of run {run}, which is gone"
        )));
    };
    let Some(at) = record.run.as_ref().and_then(|s| s.context.as_ref()) else {
        return Ok(None);
    };
    let bytes = ports
        .payloads
        .get(at)
        .await
        .map_err(crate::payloads::store_error)?;
    let part: Value = serde_json::from_slice(&bytes)
        .map_err(|e| HandlerError::Poison(format!("run {run}'s context is not JSON: {e}")))?;
    let part = std::sync::Arc::new(part);
    ports.run_contexts.keep(run, part.clone());
    Ok(Some(part))
}

/// The context an element's mappings read: the part of its task's context its run kept (or,
/// for a run that kept none, its task's whole context), its own result, its element and its
/// index; and the task whose keys it makes.
pub(crate) async fn element_context(
    ports: &TaskPorts,
    record: &StateRecord,
    task: &Task,
    step: &str,
) -> Result<Option<(Value, TaskId)>, HandlerError> {
    let Some(link) = record.parent.as_ref() else {
        return Ok(None);
    };
    let Some(e) = link.element.as_ref() else {
        return Ok(None);
    };
    let mut context = match run_context(ports, link.task_id).await? {
        Some(part) => (*part).clone(),
        None => {
            let Some((ptask, precord)) = ports.store.get(e.task_id).await? else {
                return Err(HandlerError::Poison(format!(
                    "element {} of task {}, which is gone",
                    e.index, e.task_id
                )));
            };
            let full: std::sync::Arc<Workflow> = super::catalog_workflow(
                &ports.definitions,
                &precord.workflow,
                precord.workflow_version,
            )
            .await?;
            crate::domain::context::context(&full, &ptask, &precord, e.step_index)
                .ok_or_else(|| HandlerError::Poison("the task's input is not kept".into()))?
        }
    };
    // Its own result, for its undo (`$.steps['<step>'].result`).
    let own = record.results();
    if let (Some(steps), Some(mine)) = (
        context.get_mut("steps").and_then(Value::as_object_mut),
        own.get(step),
    ) {
        steps.insert(step.to_owned(), mine.clone());
    }
    context["element"] = task.input.clone();
    context["index"] = serde_json::json!(e.index);
    Ok(Some((context, e.task_id)))
}
