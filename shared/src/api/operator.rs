//! The operator API's task routes (every route under `/operator`, always behind IAM): `GET
//! /tasks?state=&workflow=` lists every caller's tasks by state through the state index, `GET
//! /counts` counts them; `POST /tasks/{taskId}/{action}` acts on one ([`OperatorAction`]),
//! recording who and why. A caller's own cancel on the task API is the same action.

use super::deps::ApiDeps;
use super::error::{Answer, ApiError, respond};
use super::request::{PageQuery, SearchQuery, action_body};
use super::tasks::{input_problems, load_for};
use super::views::{ActionTaken, ListPage, TaskSummary, TaskView};
use crate::domain::transition::{self, Actor, Rejection, Transition};
use crate::domain::{Caller, ProcessState, StateRecord, TaskId};
use crate::handlers::{HandlerError, count_outcome, perform_no_step, workflow_of, write};
use crate::ports::StoreError;
use crate::ports::{Guarded, InState, KeyQuery, Paging};
use http::StatusCode;
use serde_json::{Value, json};
use std::fmt;
use std::str::FromStr;
use tracing::{error, info};

/// What an operator (or, `Cancel` only, a task's caller) may do to a task: the last segment of
/// `POST /tasks/{taskId}/{action}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OperatorAction {
    /// Run the failed step (or undo) again.
    Retry,
    /// Run the failed step again on a new task input (`input`).
    RetryWithInput,
    /// Undo the steps that may have taken effect.
    Compensate,
    /// Undo from an earlier step (`fromStep`), the later ones settled by hand.
    CompensateFrom,
    /// Stop a task that runs, and undo what it did.
    Cancel,
    /// Close a failed task by hand (a `reason` is required).
    Resolve,
    /// Mark the failed step done by hand, with its `result` (a `reason` is required).
    Skip,
    /// End the waits the task is in now (its wait step, or its branches').
    Wake,
    /// Stop the branches still out of a parallel group a failure stopped: the task fails or
    /// is compensated at once.
    StopBranches,
}

impl OperatorAction {
    pub const ALL: [OperatorAction; 9] = [
        Self::Retry,
        Self::RetryWithInput,
        Self::Compensate,
        Self::CompensateFrom,
        Self::Cancel,
        Self::Resolve,
        Self::Skip,
        Self::Wake,
        Self::StopBranches,
    ];

    /// The action's name in the path.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Retry => "retry",
            Self::RetryWithInput => "retry-with-input",
            Self::Compensate => "compensate",
            Self::CompensateFrom => "compensate-from",
            Self::Cancel => "cancel",
            Self::Resolve => "resolve",
            Self::Skip => "skip",
            Self::Wake => "wake",
            Self::StopBranches => "stop-branches",
        }
    }

    /// Whether the action needs a reason: it settles the task by hand.
    pub fn needs_reason(self) -> bool {
        matches!(self, Self::Resolve | Self::Skip)
    }
}

impl fmt::Display for OperatorAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is no [`OperatorAction`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no operator action is called {0:?}")]
pub struct UnknownAction(pub String);

impl FromStr for OperatorAction {
    type Err = UnknownAction;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|a| a.as_str() == s)
            .ok_or_else(|| UnknownAction(s.to_owned()))
    }
}

/// What an action's body gave: its reason, and the field only that action reads.
struct ActionInput {
    reason: Option<String>,
    /// `skip`: the step's result, as JSON text.
    result: Option<String>,
    /// `retry-with-input`: the task's new input.
    new_input: Option<Value>,
    /// `compensate-from`: the step compensation starts from.
    from_step: Option<String>,
}

/// Reads an action's body: each action reads its own fields, any other is an unknown field.
fn action_input(action: OperatorAction, body: &[u8]) -> Result<ActionInput, ApiError> {
    #[derive(serde::Deserialize, Default)]
    #[serde(deny_unknown_fields)]
    struct ActionBody {
        reason: Option<String>,
    }
    #[derive(serde::Deserialize, Default)]
    #[serde(deny_unknown_fields)]
    struct SkipBody {
        reason: Option<String>,
        /// The step's result, supplied by hand.
        result: Option<Value>,
    }
    #[derive(serde::Deserialize, Default)]
    #[serde(deny_unknown_fields)]
    struct InputBody {
        reason: Option<String>,
        /// The task's new input.
        input: Option<Value>,
    }
    #[derive(serde::Deserialize, Default)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    struct FromBody {
        reason: Option<String>,
        /// The step compensation starts from.
        from_step: Option<String>,
    }
    let mut got = ActionInput {
        reason: None,
        result: None,
        new_input: None,
        from_step: None,
    };
    let mut result = None;
    match action {
        OperatorAction::Skip => {
            let b = action_body(body, |b: &SkipBody| b.reason.as_ref())?;
            (got.reason, result) = (b.reason, b.result);
        }
        OperatorAction::RetryWithInput => {
            let b = action_body(body, |b: &InputBody| b.reason.as_ref())?;
            got.reason = b.reason;
            got.new_input = b.input.filter(|v| !v.is_null());
            if got.new_input.is_none() {
                return Err(ApiError::validation(
                    "input is required: the task's new input",
                ));
            }
        }
        OperatorAction::CompensateFrom => {
            let b = action_body(body, |b: &FromBody| b.reason.as_ref())?;
            (got.reason, got.from_step) = (b.reason, b.from_step);
            if got.from_step.is_none() {
                return Err(ApiError::validation(
                    "fromStep is required: the step compensation starts from",
                ));
            }
        }
        OperatorAction::Retry
        | OperatorAction::Compensate
        | OperatorAction::Cancel
        | OperatorAction::Resolve
        | OperatorAction::Wake
        | OperatorAction::StopBranches => {
            got.reason = action_body(body, |b: &ActionBody| b.reason.as_ref())?.reason;
        }
    }
    if action.needs_reason() && got.reason.as_deref().is_none_or(|r| r.trim().is_empty()) {
        return Err(ApiError::validation(format!(
            "reason is required to {action} a task: say how the step was settled"
        )));
    }
    got.result = match result {
        Some(Value::Null) | None => None,
        Some(v) => {
            let text = v.to_string();
            if text.len() > crate::domain::task::MAX_RESULT_BYTES {
                return Err(ApiError::validation(format!(
                    "result is {} bytes (at most {})",
                    text.len(),
                    crate::domain::task::MAX_RESULT_BYTES
                )));
            }
            Some(text)
        }
    };
    Ok(got)
}

/// A conflict on a task, naming the state it is in.
fn conflict(record: &StateRecord, message: String) -> ApiError {
    ApiError::Conflict {
        message,
        process_state: Some(record.process_state),
    }
}

/// `POST /tasks/{id}/{action}`: one conditional write, then its effects. A resolve or skip
/// needs a reason; a skip may carry the step's `result`.
pub(super) async fn act(
    deps: &ApiDeps,
    caller: &Caller,
    id: &str,
    action: OperatorAction,
    body: &[u8],
) -> Answer {
    if let Err(e) = id.parse::<TaskId>() {
        return Err(ApiError::InvalidTaskId(e.to_string()));
    }
    let input = action_input(action, body)?;
    let actor = Actor {
        by: caller.to_string(),
        reason: input.reason,
        operator: deps.operator_api,
    };
    let (task, record) = load_for(deps, caller, id).await?;
    tracing::Span::current().record("workflow", record.workflow.as_str());
    let workflow = workflow_of(&deps.ports.definitions, &record)
        .await
        .map_err(ApiError::unavailable)?;
    let policies = workflow.policies();
    let now = deps.ports.clock.now();
    if let Some(new) = &input.new_input {
        workflow
            .check_input(new)
            .map_err(|e| input_problems(&workflow, e))?;
    }
    let from = match input.from_step.as_deref() {
        None => None,
        Some(name) => match workflow.steps.iter().position(|s| s.name == name) {
            Some(i) => Some(i),
            None => {
                return Err(ApiError::validation(format!(
                    "fromStep {name:?} is not a step of {} v{}",
                    workflow.name, workflow.version
                )));
            }
        },
    };
    let t: Result<Transition, Rejection> = match action {
        OperatorAction::Retry => transition::retry(&record, &actor, now, &policies),
        OperatorAction::RetryWithInput => {
            transition::retry_with_input(&record, &actor, now, &policies, task.input_revision)
        }
        OperatorAction::CompensateFrom => {
            transition::compensate_from(&record, &actor, now, &policies, from.unwrap_or_default())
        }
        OperatorAction::Compensate => transition::compensate(&record, &actor, now, &policies),
        OperatorAction::Resolve => transition::resolve(&record, &actor, now),
        OperatorAction::Skip => transition::skip(&record, &actor, now, &policies, input.result),
        OperatorAction::Cancel => transition::cancel(&record, &actor, now, &policies),
        OperatorAction::Wake => transition::wake(&record, &actor, now, &policies),
        OperatorAction::StopBranches => transition::stop_branches(&record, &actor, now, &policies),
    };
    let mut t = t.map_err(|why| conflict(&record, why.to_string()))?;
    let task = match input.new_input {
        Some(new) => match task.with_new_input(new, &t.record) {
            Ok(changed) => {
                // A new input kept by reference: the task's retention must delete it.
                t.record.payloads |= changed.has_large_input();
                Some(changed)
            }
            Err(bytes) => {
                return Err(conflict(
                    &record,
                    format!(
                        "too_many_inputs: the inputs this task's steps ran with would take {bytes} bytes (at most {}): resolve or compensate it instead",
                        crate::domain::task::MAX_EARLIER_INPUTS_BYTES
                    ),
                ));
            }
        },
        None => None,
    }
    .ok_or(task);
    let written = match &task {
        // The input and the record in one transaction, the record under its condition.
        Ok(changed) => match deps
            .ports
            .store
            .put_with_input(Guarded::new(&t.record, &t.condition), changed)
            .await
        {
            Ok(()) => Ok(true),
            Err(StoreError::ConditionFailed) => Ok(false),
            Err(e) => Err(e),
        },
        Err(_) => write(deps.ports.store.as_ref(), &t)
            .await
            .map_err(|e| match e {
                HandlerError::Store(e) => e,
                other => StoreError::Unavailable(other.to_string()),
            }),
    };
    match written {
        Ok(true) => {}
        Ok(false) => {
            return Err(conflict(
                &record,
                "the task changed meanwhile (another operator, or the task moved on); read it and try again".into(),
            ));
        }
        Err(e) => return Err(ApiError::unavailable(e)),
    }
    let task = task.unwrap_or_else(|unchanged| unchanged);
    count_outcome(&deps.ports.metrics, record.process_state, &t);
    tracing::Span::current().record("attempt", t.record.attempt);
    info!(from = %record.process_state, to = %t.record.process_state, by = %actor.by, "action applied");
    if let Err(e) = perform_no_step(&deps.ports.outlets(), &t).await {
        // The write stands; the supervisor finishes what is owed (a lost work message is
        // re-enqueued at the pickup deadline, an undelivered notice at once).
        error!(error = %e, "operator action written, effects left to the supervisor");
    }
    Ok(if deps.operator_api {
        respond(
            StatusCode::ACCEPTED,
            &TaskView::of(&task, &t.record, Some(&workflow)),
        )
    } else {
        respond(
            StatusCode::ACCEPTED,
            &ActionTaken {
                task_id: task.id.to_string(),
                process_state: t.record.process_state,
            },
        )
    })
}

/// `GET /tasks?state=Error&workflow=loan-application&limit=50&cursor=...`, or a search by key
/// `GET /tasks?key=customerId:c-77` (with `state`, `workflow`, `from`, `to` if wanted).
pub(super) async fn list(deps: &ApiDeps, query: &str) -> Answer {
    let (mut state, mut page, mut workflow) = (None, PageQuery::default(), None);
    let mut search = SearchQuery::default();
    for (k, v) in url::form_urlencoded::parse(query.as_bytes()) {
        match k.as_ref() {
            "workflow" => workflow = Some(v.into_owned()),
            "state" => {
                state = Some(
                    v.parse::<ProcessState>()
                        .map_err(|e| ApiError::InvalidState(e.to_string()))?,
                )
            }
            other => {
                if !page.read(other, &v)? && !search.read(other, &v)? {
                    return Err(ApiError::UnknownParameter {
                        name: other.to_owned(),
                        known: "state, workflow, key, from, to, limit, cursor",
                    });
                }
            }
        }
    }
    let paging = Paging {
        limit: page.limit,
        after: page.cursor.as_ref(),
    };
    let store = &deps.ports.store;
    let found = match (search.key()?, state) {
        (Some(key), state) => {
            let q = KeyQuery {
                state,
                workflow: workflow.as_deref(),
                from: search.from,
                to: search.to,
                ..KeyQuery::new(key)
            };
            store.list_by_key(q, paging).await
        }
        (None, Some(state)) => {
            let of = InState {
                state,
                workflow: workflow.as_deref(),
            };
            store.list(of, paging).await
        }
        (None, None) => {
            let names: Vec<_> = ProcessState::ALL.iter().map(|s| s.as_str()).collect();
            return Err(ApiError::MissingState(names.join(", ")));
        }
    }
    .map_err(ApiError::unavailable)?;
    Ok(respond(
        StatusCode::OK,
        &ListPage {
            tasks: found.items.iter().map(TaskSummary::of).collect(),
            next_cursor: found.next.map(|c| c.encode()),
        },
    ))
}

/// Counts stop here (`capped`): a count reads the state index.
pub const MAX_COUNT: u64 = 1000;

/// `GET /counts?workflow=...`: how many tasks are in each state (of a workflow, or of all),
/// each exact up to [`MAX_COUNT`].
pub(super) async fn counts(deps: &ApiDeps, query: &str) -> Answer {
    let mut workflow = None;
    for (k, v) in url::form_urlencoded::parse(query.as_bytes()) {
        match k.as_ref() {
            "workflow" if !v.is_empty() => workflow = Some(v.into_owned()),
            "workflow" => {}
            other => {
                return Err(ApiError::UnknownParameter {
                    name: other.to_owned(),
                    known: "workflow",
                });
            }
        }
    }
    let counted = futures::future::join_all(ProcessState::ALL.iter().map(|&state| {
        let workflow = workflow.as_deref();
        deps.ports
            .store
            .count(InState { state, workflow }, MAX_COUNT)
    }))
    .await;
    let mut counts = serde_json::Map::new();
    for (state, c) in ProcessState::ALL.iter().zip(counted) {
        counts.insert(
            state.as_str().to_owned(),
            json!(c.map_err(ApiError::unavailable)?),
        );
    }
    Ok(respond(
        StatusCode::OK,
        &json!({"workflow": workflow, "counts": counts, "cap": MAX_COUNT}),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_action_parses_from_its_name_and_nothing_else_does() {
        for a in OperatorAction::ALL {
            assert_eq!(a.as_str().parse::<OperatorAction>(), Ok(a));
        }
        for bad in ["", "Retry", "pause", "callbacks", "retry_with_input"] {
            assert!(bad.parse::<OperatorAction>().is_err(), "{bad}");
        }
    }
}
