//! Sub-workflows: a step that runs another published workflow as a child task.
//!
//! Such a step is a callback step on [`CHILD_SERVICE`], sas itself. The agent's call starts the
//! child ([`start_child`]): its id is derived from the step's idempotency key, and the step's
//! key (under the parent's caller) is the child's idempotency key, so a step sent again starts
//! no second child. The child keeps the parent step it answers ([`ParentLink`]). When the
//! child ends for good, whoever delivers its final notice answers the parent first
//! ([`answer_parent`]): a reply fenced, as a callback is, by the step and its key's generation,
//! so an answer sent twice (a deliverer that died before clearing the outbox) counts once, and
//! a late one (the parent moved on) changes nothing.

use super::start::{ChildStart, StartError, StartRequest, start};
use super::{HandlerError, TaskPorts};
use crate::domain::state::{ParentLink, token_fence};
use crate::domain::transition::{self, Rejection, StepOutcome};
use crate::domain::workflow::{CHILD_SERVICE, MAX_CHILD_DEPTH};
use crate::domain::{ProcessState, StateRecord, TaskId};
use crate::messages::StepRequest;
use tracing::{info, warn};

/// The id of the child task a sub-workflow step starts under idempotency key `key`.
pub fn child_id(key: &str) -> TaskId {
    TaskId::derived(&format!("child:{key}"))
}

/// The child task a sub-workflow step of task `task_id` started under its key's `generation`.
pub fn child_of_step(
    task_id: TaskId,
    workflow: &crate::Workflow,
    i: usize,
    generation: u32,
) -> Option<TaskId> {
    let step = workflow.step(i).filter(|s| s.child.is_some())?;
    Some(child_id(&crate::messages::idempotency_key(
        task_id,
        &step.name,
        &step.action,
        generation,
    )))
}

/// Whether `request` is a sub-workflow step's (the agent starts its child, calling no service).
pub fn is_child_request(request: &StepRequest) -> bool {
    request.service == CHILD_SERVICE
}

/// Starts the child task of a sub-workflow step's request, with the request's body as its
/// input: the outcome the agent replies. `Accepted` once the child is stored (or was, by an
/// earlier attempt): the child's end completes the step. The workflow unknown or the input
/// refused by its schema refuse the step; a store that is down times the attempt out (it is
/// retried, under the same key: the same child).
pub async fn start_child(
    ports: &TaskPorts,
    dispatch: Option<&dyn super::start::Dispatch>,
    request: &StepRequest,
    input: serde_json::Value,
) -> StepOutcome {
    let (Some(child), Some(callback)) = (&request.child, &request.callback) else {
        return StepOutcome::Failed {
            error: "a sub-workflow step's request without its child or callback".into(),
        };
    };
    let Some((step_index, generation)) = token_fence(&callback.token) else {
        return StepOutcome::Failed {
            error: "a sub-workflow step's callback token names no step".into(),
        };
    };
    if child.depth > MAX_CHILD_DEPTH {
        return StepOutcome::Refused {
            code: "child_too_deep".into(),
            message: format!(
                "sub-workflows nest at most {MAX_CHILD_DEPTH} deep: workflow {:?} would run at depth {}",
                request.action, child.depth
            ),
        };
    }
    let key = request.idempotency_key();
    let id = child_id(&key);
    let start_request = StartRequest {
        caller: &child.caller,
        workflow: &request.action,
        input,
        key: Some(format!("sas-child:{key}")),
        reply_queue_url: None,
        start_at: None,
        turn: None,
        child: Some(ChildStart {
            id,
            version: child.version,
            parent: ParentLink {
                task_id: request.task_id,
                step: request.step.clone(),
                step_index,
                generation,
                reply_queue_url: request.reply_queue_url.clone(),
                depth: child.depth,
                undo_attempt: None,
                released: false,
                element: None,
            },
        }),
        priority: child.priority,
        // Its first step claimed as it is created, where that suits it (as at submission).
        dispatch,
    };
    match start(ports, start_request).await {
        Ok(started) => {
            info!(child = %started.task_id, replayed = started.replayed, workflow = %request.action, "the step's child task started");
            StepOutcome::Accepted
        }
        Err(StartError::WorkflowNotFound(name)) => StepOutcome::Refused {
            code: "child_workflow_not_found".into(),
            message: match child.version {
                Some(v) => format!("workflow {name:?} has no published version {v}"),
                None => format!("no workflow {name:?} is published"),
            },
        },
        Err(StartError::Input { error, .. }) => StepOutcome::Refused {
            code: "child_input_invalid".into(),
            message: format!(
                "the input does not match {:?}'s input schema: {error}",
                request.action
            ),
        },
        // The same key with another body: an operator retried the step with a new input; the
        // child the key started first runs on.
        Err(StartError::KeyReused) => {
            warn!(child = %id, "the step's child was started with another input; it runs on");
            StepOutcome::Accepted
        }
        Err(e) => StepOutcome::TimedOut {
            error: format!("the child task could not be started: {e}"),
        },
    }
}

/// How often [`undo_child`] and [`release_children`] read a child again after losing a race to
/// another writer.
const RACES: usize = 5;

/// The undo of a sub-workflow step: its child task is undone as a unit
/// ([`transition::undo_as_unit`]). `Accepted`: the child's end answers this undo (through
/// [`answer_parent`]), and the parent's undo may now wait the step's `timeout` for the child's
/// compensation. Otherwise the answer, now: success if nothing
/// of the child is in effect (never started, since the forward request's deadline has passed
/// before any undo goes out; or refused or compensated already), a refusal if it cannot be
/// undone (past its pivot, or left for an operator): the parent's compensation then fails and
/// alerts, for an operator to settle both.
pub async fn undo_child(
    ports: &TaskPorts,
    request: &StepRequest,
) -> Result<StepOutcome, HandlerError> {
    let Some(forward) = &request.undoes else {
        return Ok(StepOutcome::Failed {
            error: "a sub-workflow step's undo without the key it undoes".into(),
        });
    };
    let id = child_id(forward);
    for _ in 0..RACES {
        let Some(child) = ports.store.get_state(id).await? else {
            info!(child = %id, "the step's child was never started: nothing to undo");
            return Ok(StepOutcome::Succeeded { result: None });
        };
        match child.process_state {
            ProcessState::Compensated | ProcessState::Refused => {
                return Ok(StepOutcome::Succeeded { result: None });
            }
            ProcessState::Error | ProcessState::CompensationFailed | ProcessState::Resolved => {
                return Ok(StepOutcome::Refused {
                    code: "child_needs_operator".into(),
                    message: format!(
                        "child task {id} is {}: an operator settles it before its parent is undone",
                        child.process_state
                    ),
                });
            }
            ProcessState::Compensating
                if child.parent.as_ref().and_then(|l| l.undo_attempt) == Some(request.attempt) =>
            {
                // This undo was sent again: the child answers it already.
                return Ok(StepOutcome::Accepted);
            }
            _ => {}
        }
        let workflow = super::workflow_of(&ports.definitions, &child).await?;
        let now = ports.clock.now();
        let mut t = match transition::undo_as_unit(
            &child,
            request.attempt,
            now,
            &workflow.policies(),
        ) {
            Ok(t) => t,
            Err(Rejection::StaleAttempt { record, .. }) => {
                // A copy of an earlier attempt's undo, delivered late: the child answers the
                // newest (its parent fences this answer out).
                info!(child = %id, answers = record, "an earlier attempt's undo: the child answers a later one");
                return Ok(StepOutcome::Accepted);
            }
            Err(Rejection::PastPivot(_)) => {
                return Ok(StepOutcome::Refused {
                    code: "child_past_pivot".into(),
                    message: format!(
                        "child task {id} is past its pivot: its effects cannot be undone"
                    ),
                });
            }
            Err(e) => {
                return Ok(StepOutcome::Refused {
                    code: "child_not_undoable".into(),
                    message: format!("child task {id}: {e}"),
                });
            }
        };
        // A child with nothing to undo ends at once: its end (and its answer to this undo) is
        // delivered by the supervisor's sweep, which finds its notice owed. The agent delivers
        // no task's notices, and needs no grant to start a retention.
        t.effects
            .retain(|e| !matches!(e, transition::Effect::DeliverNotice));
        // Condition: the transition's (the child as read) - keeps "a child is undone once".
        if super::write(ports.store.as_ref(), &t).await? {
            info!(child = %id, from = %child.process_state, to = %t.record.process_state, "the step's child is undone as a unit");
            if let Err(e) = super::perform_no_step(&ports.outlets(), &t).await {
                // The write stands: a lost work message is re-enqueued at the child's pickup
                // deadline, an undelivered notice by the supervisor.
                warn!(child = %id, error = %e, "the child's undo is written, its effects left to the supervisor");
            }
            return Ok(StepOutcome::Accepted);
        }
    }
    Err(HandlerError::Store(crate::ports::StoreError::Unavailable(
        format!("child task {id} kept changing while its parent undid it"),
    )))
}

/// A parent that ended for good releases its `Processed` children: it will never undo them, so
/// their retention starts (see [`transition::release_child`]). Called as the parent's final
/// notices are delivered, before its outbox is cleared: a crash from here on releases again
/// (a released child is left alone).
pub async fn release_children(ports: &TaskPorts, record: &StateRecord) -> Result<(), HandlerError> {
    if !record.process_state.is_final() {
        return Ok(());
    }
    let workflow = super::workflow_of(&ports.definitions, record).await?;
    let children = record.steps.iter().enumerate().filter_map(|(i, state)| {
        state
            .sent
            .then(|| child_of_step(record.task_id, &workflow, i, state.generation))
            .flatten()
    });
    // A distributed forEach step's run, and its elements, are released alike.
    let runs: Vec<TaskId> = record
        .steps
        .iter()
        .enumerate()
        .filter_map(|(i, state)| {
            let step = workflow.step(i).filter(|s| s.run.is_some())?;
            state.sent.then(|| {
                super::runs::run_id(&crate::messages::idempotency_key(
                    record.task_id,
                    &step.name,
                    &step.action,
                    state.generation,
                ))
            })
        })
        .collect();
    for run in runs {
        super::release(ports, run).await?;
        super::runs::release_elements(ports, run).await?;
    }
    for id in children {
        super::release(ports, id).await?;
    }
    Ok(())
}

/// The answer a child being undone by its parent gives that undo when it ends: success once
/// its steps are undone (or it was cancelled before any took effect), a refusal if an undo of
/// its own failed.
fn undo_answer(record: &StateRecord) -> Option<StepOutcome> {
    match record.process_state {
        ProcessState::Compensated | ProcessState::Refused => {
            Some(StepOutcome::Succeeded { result: None })
        }
        ProcessState::CompensationFailed | ProcessState::Resolved => Some(StepOutcome::Refused {
            code: "child_undo_failed".into(),
            message: format!(
                "child task {} is {}: {}",
                record.task_id,
                record.process_state,
                record.last_error.as_deref().unwrap_or("its undo failed")
            ),
        }),
        _ => None,
    }
}

/// A child task that ended for good answers its parent step: `Processed` with its output (the
/// step's result), `Refused` with its refusal, `Compensated` as `child_failed` (or
/// `child_cancelled`), `Resolved` as `child_resolved`, `CompensationFailed` as `Faulted` (it
/// took effect and could not undo it); a child its parent undoes answers that
/// undo ([`undo_answer`]), also when an undo of its own failed (`CompensationFailed`, which an
/// operator then settles). Nothing for a task without a parent or not ended. Sent before the
/// child's outbox is cleared (see the module's text).
pub async fn answer_parent(ports: &TaskPorts, record: &StateRecord) -> Result<(), HandlerError> {
    let Some(link) = &record.parent else {
        return Ok(());
    };
    let child = record.task_id;
    if let Some(attempt) = link.undo_attempt {
        let Some(outcome) = undo_answer(record) else {
            return Ok(());
        };
        super::answer_step(ports, link, Some(attempt), outcome).await?;
        info!(parent = %link.task_id, step = %link.step, state = %record.process_state, "the child answered its parent's undo");
        return Ok(());
    }
    let outcome = match record.process_state {
        // An output that cannot be built (its mapping selects nothing) refuses the step: a
        // definition to fix, not a fault to retry.
        ProcessState::Processed => match output(ports, record).await? {
            Ok(result) => StepOutcome::Succeeded { result },
            Err(message) => StepOutcome::Refused {
                code: "child_output_invalid".into(),
                message,
            },
        },
        ProcessState::Refused => match &record.refusal {
            Some(r) => StepOutcome::Refused {
                code: r.code.clone(),
                message: format!("child task {child}, step {}: {}", r.step, r.message),
            },
            None => StepOutcome::Refused {
                code: "child_refused".into(),
                message: format!("child task {child} was refused"),
            },
        },
        ProcessState::Compensated => {
            let cancelled = record
                .last_error
                .as_deref()
                .is_some_and(|e| e.starts_with("cancelled"));
            StepOutcome::Refused {
                code: if cancelled {
                    "child_cancelled"
                } else {
                    "child_failed"
                }
                .into(),
                message: format!(
                    "child task {child} ended Compensated: {}",
                    record
                        .last_error
                        .as_deref()
                        .unwrap_or("its steps were undone")
                ),
            }
        }
        ProcessState::Resolved => StepOutcome::Refused {
            code: "child_resolved".into(),
            message: format!("child task {child} was resolved by an operator"),
        },
        // Its own compensation failed: what it did stays, for an operator. The step took
        // effect: it fails the parent now, whose undo of it is refused while the child waits
        // (`child_needs_operator`), so the parent ends CompensationFailed too.
        ProcessState::CompensationFailed => StepOutcome::Faulted {
            error: format!(
                "child task {child} ended CompensationFailed: {}",
                record
                    .last_error
                    .as_deref()
                    .unwrap_or("an undo of its own was refused")
            ),
        },
        _ => return Ok(()),
    };
    super::answer_step(ports, link, None, outcome).await?;
    info!(parent = %link.task_id, step = %link.step, state = %record.process_state, "the child answered its parent step");
    Ok(())
}

/// What a `Processed` task answers: its workflow's `output` rendered on its input and results
/// (`None`: the workflow declares none), or why it cannot be built.
async fn output(
    ports: &TaskPorts,
    record: &StateRecord,
) -> Result<Result<Option<String>, String>, HandlerError> {
    let workflow = super::workflow_of(&ports.definitions, record).await?;
    let Some(mapping) = &workflow.output else {
        return Ok(Ok(None));
    };
    let Some((task, whole)) = ports.store.get(record.task_id).await? else {
        return Err(HandlerError::Poison(format!(
            "child task {} has no task item",
            record.task_id
        )));
    };
    let context = crate::domain::context::context(&workflow, &task, &whole, whole.steps.len())
        .ok_or_else(|| HandlerError::Poison("the child's input is not kept".into()))?;
    match mapping.render(&context, crate::domain::task::MAX_RESULT_BYTES) {
        Ok(value) => Ok(Ok((!value.is_null()).then(|| value.to_string()))),
        Err(e) => Ok(Err(format!(
            "the output of child task {}: {e}",
            record.task_id
        ))),
    }
}
