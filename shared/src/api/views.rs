//! The API's answers about tasks as types: what the server builds and what clients (`sasctl`)
//! read, one definition for both.
//!
//! The server fills every field it sends; a client decodes leniently: unknown fields are
//! ignored, and a field that is missing or `null` becomes `None` (or an empty list). The state
//! type `S` is the domain's [`ProcessState`] on the server; a client may use its own (one that
//! keeps a state it does not know rather than failing the answer).

use crate::domain::run::{Mark, Run};
use crate::domain::state::{Decision, Refusal};
use crate::domain::task::EarlierInput;
use crate::domain::{ProcessState, StateRecord, StepState, StepStatus, Task, TaskId, Workflow};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// Deserializes a possibly `null` value as its default.
fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// The operator's view of a task (`GET /operator/tasks/{id}`, and the operator actions'
/// answers): everything.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", bound(deserialize = "S: Deserialize<'de>"))]
pub struct TaskView<S = ProcessState> {
    pub task_id: String,
    pub process_state: S,
    /// The workflow the task runs, and the version it started on (and stays on).
    #[serde(default)]
    pub workflow: Option<String>,
    #[serde(default)]
    pub workflow_version: Option<u32>,
    /// Who started it.
    #[serde(default)]
    pub caller: Option<String>,
    /// Its search keys (name → value), as read from its input when it started.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub keys: BTreeMap<String, String>,
    /// The task's input: as submitted, or as an operator's retry replaced it.
    #[serde(default)]
    pub input: Option<Value>,
    #[serde(default)]
    pub input_revision: Option<u32>,
    /// The inputs replaced since steps ran with them.
    #[serde(default, deserialize_with = "null_as_default")]
    pub earlier_inputs: Vec<EarlierInput>,
    #[serde(default)]
    pub reply_queue_url: Option<String>,
    #[serde(default)]
    pub locked_by: Option<String>,
    #[serde(default)]
    pub complete_by: Option<DateTime<Utc>>,
    #[serde(default)]
    pub failure_count: Option<u32>,
    #[serde(default)]
    pub attempt: Option<u64>,
    /// The step being worked on (forward or, while compensating, backward).
    #[serde(default, alias = "step")]
    pub current_step: Option<String>,
    #[serde(default)]
    pub round: Option<u32>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub steps: Vec<StepView>,
    /// What each choice (and parallel group) reached became: the case that ran, or skipped.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub decisions: Vec<Decision>,
    /// The parallel group running (or stopped, in Error): each branch's state and step.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub branches: Vec<BranchView>,
    /// The workflow's pivot step, and whether it is done: past it the task only goes forward
    /// (no cancel, no compensation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pivot: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub past_pivot: Option<bool>,
    #[serde(default)]
    pub last_error: Option<String>,
    /// The service's business refusal that ended (or is ending) the task, as its caller sees it.
    #[serde(default)]
    pub refusal: Option<Refusal>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub history: Vec<HistoryEntry<S>>,
    #[serde(default)]
    pub created_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub updated_at: Option<DateTime<Utc>>,
    /// When the task entered its state.
    #[serde(default)]
    pub since: Option<DateTime<Utc>>,
    /// The task's deadline (its workflow's `deadline`): still going forward past it, it fails.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<DateTime<Utc>>,
    /// A delayed start (`Start-At`): no step went out before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_at: Option<DateTime<Utc>>,
    /// Its lane (left out: `normal`).
    #[serde(default, skip_serializing_if = "crate::domain::Priority::is_normal")]
    pub priority: crate::domain::Priority,
    /// A child task: the parent task and step it answers. (A distributed forEach's run: its
    /// task and step; an element: its run, and [`TaskView::element`] says more.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<ParentView>,
    /// A task of a workflow with a concurrency limit: its gate, where it stands there and,
    /// while it waits, who holds the gate and how many wait before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate: Option<GateView>,
    /// A distributed forEach's run: its task and step, its ledger's counts and one page of its
    /// elements.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<RunView>,
    /// An element of a distributed forEach: its run, its index and its task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub element: Option<ElementView>,
}

/// How many of a run's elements bear each mark of its ledger
/// ([`crate::domain::run::Mark`]). A run in chunks marks chunks: its counts are then of
/// chunks, but `total` and `refused`, which count elements.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunCounts {
    /// The list's length.
    pub total: u32,
    /// Elements kept in one record (a chunk), when over 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunk: Option<u32>,
    /// Opened so far (every mark).
    #[serde(default)]
    pub opened: u32,
    /// Ended `Processed`: took effect.
    #[serde(default)]
    pub done: u32,
    /// Ended with no effect (refused, or failed and undone by itself).
    #[serde(default)]
    pub refused: u32,
    /// Running forward.
    #[serde(default)]
    pub out: u32,
    #[serde(default)]
    pub undoing: u32,
    #[serde(default)]
    pub undone: u32,
    /// Their undo was refused: their effect stays, for an operator.
    #[serde(default)]
    pub undo_failed: u32,
}

impl RunCounts {
    pub fn of(run: &Run) -> Self {
        Self {
            total: run.total,
            chunk: (run.chunk > 1).then_some(run.chunk),
            // At most MAX_RUN_ELEMENTS marks: fits.
            opened: run.marks.len() as u32,
            done: run.count(Mark::Done),
            refused: run.refused(),
            out: run.count(Mark::Out),
            undoing: run.count(Mark::Undoing),
            undone: run.count(Mark::Undone),
            undo_failed: run.count(Mark::UndoFailed),
        }
    }
}

/// A mark of a run's ledger as the views name it.
pub fn mark_name(mark: Mark) -> &'static str {
    match mark {
        Mark::Out => "out",
        Mark::Done => "done",
        Mark::Failed => "refused",
        Mark::Undoing => "undoing",
        Mark::Undone => "undone",
        Mark::UndoFailed => "undoFailed",
    }
}

/// The run a distributed forEach step started, as its task's view names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunLink {
    /// The run's record (`GET /operator/tasks/{taskId}` reads it).
    pub task_id: String,
    /// The run's state and counts, once its record is read (absent: not created yet, or not
    /// read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process_state: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counts: Option<RunCounts>,
}

impl RunLink {
    /// The link to run `id`, with what its record (if read) says.
    pub fn of(id: TaskId, run: Option<&StateRecord>) -> Self {
        let ledger = run.and_then(|r| Some((r.process_state, &r.run.as_ref()?.ledger)));
        Self {
            task_id: id.to_string(),
            process_state: ledger.map(|(s, _)| s.to_string()),
            counts: ledger.map(|(_, l)| RunCounts::of(l)),
        }
    }
}

/// How many of a run's elements its view lists at once (`elementsFrom` pages on).
pub const ELEMENTS_PAGE: u32 = 100;

/// A distributed forEach's run, in its record's view: the task and step it runs for, its
/// ledger's counts, and one page of its elements (at most [`ELEMENTS_PAGE`], from
/// `elements_from`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunView {
    pub task_id: String,
    pub step: String,
    pub step_index: usize,
    pub counts: RunCounts,
    /// Why the run stopped opening elements (`refused`, `undo`), if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<crate::domain::run::RunStop>,
    /// The page's elements, by index from `elementsFrom`.
    #[serde(default, deserialize_with = "null_as_default")]
    pub elements: Vec<ElementRow>,
    #[serde(default)]
    pub elements_from: u32,
    /// Where the next page starts (`?elements_from=`); `None` on the last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_elements_from: Option<u32>,
}

/// One element in its run's view.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ElementRow {
    pub index: u32,
    /// The element's record.
    pub task_id: String,
    /// Its mark in the run's ledger ([`mark_name`]); absent: not opened yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mark: Option<String>,
    /// Its record's state, once read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process_state: Option<String>,
}

impl RunView {
    /// The view of run record `r` (`None` for a record that is no run), its elements from
    /// `from`. The elements' states are left for the caller to read
    /// ([`ElementRow::process_state`]).
    pub fn of(r: &StateRecord, from: u32) -> Option<Self> {
        let (run, link) = (r.run.as_ref()?, r.parent.as_ref()?);
        let ledger = &run.ledger;
        // A page of the ledger's units: elements, or chunks.
        let end = from.saturating_add(ELEMENTS_PAGE).min(ledger.units());
        Some(Self {
            task_id: link.task_id.to_string(),
            step: link.step.clone(),
            step_index: link.step_index,
            counts: RunCounts::of(ledger),
            stop: ledger.stop,
            elements: (from..end)
                .map(|k| ElementRow {
                    index: k,
                    task_id: crate::handlers::runs::element_id(r.task_id, k).to_string(),
                    mark: ledger.mark(k).map(|m| mark_name(m).to_owned()),
                    process_state: None,
                })
                .collect(),
            elements_from: from,
            next_elements_from: (end < ledger.units()).then_some(end),
        })
    }
}

/// An element of a distributed forEach, in its record's view: its run, its index, and the task
/// and step it runs for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ElementView {
    pub run_id: String,
    pub index: u32,
    pub task_id: String,
    pub step: String,
    /// A chunk: the index of its first element in the list (its elements' own follow).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first: Option<u32>,
}

impl ElementView {
    fn of(r: &StateRecord) -> Option<Self> {
        let link = r.parent.as_ref()?;
        let e = link.element.as_ref()?;
        Some(Self {
            run_id: link.task_id.to_string(),
            index: e.index,
            task_id: e.task_id.to_string(),
            step: link.step.clone(),
            first: e.first,
        })
    }
}

/// The run distributed forEach step `i` of `r` started, if its request went out.
pub fn run_of_step(w: &Workflow, r: &StateRecord, i: usize) -> Option<TaskId> {
    let st = r.steps.get(i).filter(|st| st.sent)?;
    let step = w.step(i).filter(|s| s.run.is_some())?;
    Some(crate::handlers::runs::run_id(
        &crate::messages::idempotency_key(r.task_id, &step.name, &step.action, st.generation),
    ))
}

/// The parent task and step a child task (a sub-workflow step's) answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ParentView {
    pub task_id: String,
    pub step: String,
}

impl ParentView {
    fn of(r: &StateRecord) -> Option<Self> {
        r.parent.as_ref().map(|l| Self {
            task_id: l.task_id.to_string(),
            step: l.step.clone(),
        })
    }
}

/// The child task step `i` of `r` started, if it is a sub-workflow step whose request went
/// out.
fn child_task_id(w: &Workflow, r: &StateRecord, i: usize) -> Option<String> {
    let st = r.steps.get(i).filter(|st| st.sent)?;
    crate::handlers::children::child_of_step(r.task_id, w, i, st.generation)
        .map(|id| id.to_string())
}

/// What a task's caller sees (`GET /tasks/{id}` on the task API): its input, states and
/// results, the refusal if any, and (only if its workflow has `publicErrors`) the last error and
/// the history's reasons, and the task's deadline if its workflow sets one. Never the lock
/// holder, a step's deadline, attempts or counts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", bound(deserialize = "S: Deserialize<'de>"))]
pub struct CallerTaskView<S = ProcessState> {
    pub task_id: String,
    pub process_state: S,
    #[serde(default)]
    pub workflow: Option<String>,
    #[serde(default)]
    pub workflow_version: Option<u32>,
    /// Its search keys (name → value).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub keys: BTreeMap<String, String>,
    #[serde(default)]
    pub input: Option<Value>,
    #[serde(default)]
    pub input_revision: Option<u32>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub earlier_inputs: Vec<EarlierInput>,
    #[serde(default)]
    pub reply_queue_url: Option<String>,
    #[serde(default)]
    pub current_step: Option<String>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub steps: Vec<StepView>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub decisions: Vec<Decision>,
    #[serde(default)]
    pub refusal: Option<Refusal>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub history: Vec<HistoryEntry<S>>,
    #[serde(default)]
    pub created_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub updated_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub since: Option<DateTime<Utc>>,
    /// Left out unless the workflow makes errors public; then the last error, or `null`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<Option<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_at: Option<DateTime<Utc>>,
    /// Its lane (left out: `normal`).
    #[serde(default, skip_serializing_if = "crate::domain::Priority::is_normal")]
    pub priority: crate::domain::Priority,
    /// A child task: the parent task and step it answers (the caller started both).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<ParentView>,
}

/// One branch of the parallel group a task runs (or one element of a forEach step, whose
/// `group` is the step): its state (Pending, Processing, Processed when done, Error when it
/// failed; Processing with no deadline while a branch waits for its forEach step's elements),
/// its current step, and that step's attempt and deadline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BranchView {
    pub group: String,
    /// The branch: a parallel branch's name (`branch k` if it has none), or a forEach
    /// element's step and index (`pick-items #2`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
    pub state: String,
    #[serde(default)]
    pub step: Option<String>,
    #[serde(default)]
    pub attempt: Option<u64>,
    #[serde(default)]
    pub complete_by: Option<DateTime<Utc>>,
    #[serde(default)]
    pub last_error: Option<String>,
}

impl BranchView {
    fn all(r: &StateRecord, workflow: Option<&Workflow>) -> Vec<Self> {
        let Some(f) = &r.fanout else {
            return vec![];
        };
        // The parallel group's branches, by name (the elements come after them).
        let arms: Vec<String> = workflow
            .and_then(|w| w.groups.iter().find(|g| g.name == f.group))
            .filter(|g| matches!(g.kind, crate::domain::workflow::GroupKind::Parallel { .. }))
            .map(|g| {
                g.kind
                    .arms()
                    .iter()
                    .enumerate()
                    .map(|(k, a)| a.name.clone().unwrap_or_else(|| format!("branch {k}")))
                    .collect()
            })
            .unwrap_or_default();
        f.branches
            .iter()
            .enumerate()
            .map(|(k, b)| Self {
                branch: match f.each_of(k) {
                    Some((e, n)) => r.steps.get(e.step).map(|s| format!("{} #{n}", s.name)),
                    None => arms.get(k).cloned(),
                },
                // An element's group is its forEach step (one in a branch adds its elements
                // to the branch's group).
                group: f
                    .each_of(k)
                    .and_then(|(e, _)| r.steps.get(e.step))
                    .map_or_else(|| f.group.clone(), |s| s.name.clone()),
                state: b.process_state.to_string(),
                step: r
                    .steps
                    .get(b.step_index)
                    .filter(|_| b.step_index < b.end)
                    .map(|s| s.name.clone()),
                attempt: Some(b.attempt),
                complete_by: b.complete_by,
                last_error: b.last_error.clone(),
            })
            .collect()
    }
}

/// One workflow step of a task. The caller's view has only `name`, `status` and `result`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StepView {
    pub name: String,
    /// Pending, Running, Waiting, Done, Failed (refused), TimedOut, Cancelled, Faulted (the
    /// service answered, but with a result over the size limit) or Skipped (a condition did not
    /// hold, or an element its forEach stopped before it went out: never called).
    pub status: String,
    /// Whether the workflow declares an undo for this step (`None`: the server did not say).
    /// A step without one is never undone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub undoable: Option<bool>,
    /// The attempt under which the step finished, and when.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_attempt: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<DateTime<Utc>>,
    /// A request under the step's current idempotency key has gone out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sent: Option<bool>,
    /// The generation of the step's idempotency key (bumped by a retry of a refused step).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<u32>,
    /// What the service returned when the step succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// The compensation of this step: `None` (not started), Running, Done, Failed or TimedOut.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub undo: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub undo_generation: Option<u32>,
    /// A callback step the service accepted: the latest its callback may come.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_until: Option<DateTime<Utc>>,
    /// The latest deadline a request for the step went out with, once it was handed back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sent_until: Option<DateTime<Utc>>,
    /// The revision of the task's input the step ran with, if not the current one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_revision: Option<u32>,
    /// Attempts its service answered as misconfigured (left out at 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub misconfigured: Option<u32>,
    /// Where the step stands among the workflow's groups, outermost first (`review › case 0`);
    /// absent at the top.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub within: Option<String>,
    /// The service the step calls and its action.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    /// The body of the step's request, once the task reached the step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Value>,
    /// The undo's action and body, once compensation reached the step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub undo_action: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub undo_input: Option<Value>,
    /// A forEach step's elements, in order: each one's status, result and undo.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub elements: Vec<StepView>,
    /// A sub-workflow step: the child task it started (once its request went out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub child_task_id: Option<String>,
    /// A distributed forEach step: the run it started (once its request went out), with the
    /// run's counts on the operator's view.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<RunLink>,
}

/// One state transition of a task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", bound(deserialize = "S: Deserialize<'de>"))]
pub struct HistoryEntry<S = ProcessState> {
    pub at: DateTime<Utc>,
    #[serde(default)]
    pub from: Option<S>,
    pub to: S,
    #[serde(default)]
    pub step: Option<String>,
    /// Left out of the caller's view.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u64>,
    /// Left out of the caller's view unless the workflow makes errors public.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Who asked for it (an operator's or caller's principal); `None` for sas itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
}

/// One page of a task list: `GET /operator/tasks` ([`TaskSummary`]) or the caller's `GET
/// /tasks` ([`CallerTaskSummary`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", bound(deserialize = "T: Deserialize<'de>"))]
pub struct ListPage<T> {
    #[serde(default = "Vec::new", deserialize_with = "null_as_default")]
    pub tasks: Vec<T>,
    /// Pass back as `cursor` for the next page; `None` on the last page.
    #[serde(default)]
    pub next_cursor: Option<String>,
}

impl<T> Default for ListPage<T> {
    fn default() -> Self {
        Self {
            tasks: Vec::new(),
            next_cursor: None,
        }
    }
}

/// One row of the operator's `GET /operator/tasks`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", bound(deserialize = "S: Deserialize<'de>"))]
pub struct TaskSummary<S = ProcessState> {
    pub task_id: String,
    /// The workflow the task runs.
    #[serde(default)]
    pub workflow: Option<String>,
    pub process_state: S,
    #[serde(default)]
    pub step: Option<String>,
    #[serde(default)]
    pub failure_count: Option<u32>,
    #[serde(default)]
    pub attempt: Option<u64>,
    #[serde(default)]
    pub last_error: Option<String>,
    #[serde(default)]
    pub updated_at: Option<DateTime<Utc>>,
    /// When the task entered its state: the list's order.
    #[serde(default)]
    pub since: Option<DateTime<Utc>>,
}

/// One row of a caller's `GET /tasks`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", bound(deserialize = "S: Deserialize<'de>"))]
pub struct CallerTaskSummary<S = ProcessState> {
    pub task_id: String,
    pub workflow: String,
    pub process_state: S,
    #[serde(default)]
    pub current_step: Option<String>,
    pub updated_at: DateTime<Utc>,
}

/// The answer to a new task (`202`), or to its replay.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", bound(deserialize = "S: Deserialize<'de>"))]
pub struct Accepted<S = ProcessState> {
    pub task_id: String,
    pub workflow: String,
    pub workflow_version: u32,
    pub process_state: S,
}

/// The answer to a caller's cancel (`202`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", bound(deserialize = "S: Deserialize<'de>"))]
pub struct ActionTaken<S = ProcessState> {
    pub task_id: String,
    pub process_state: S,
}

/// The answer to a callback the API took (`202`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CallbackAccepted {
    pub task_id: String,
    pub step: String,
    pub attempt: u64,
    pub accepted: bool,
}

/// A step's result as the views show it: the JSON it is, or (not JSON) its text.
fn result_value(result: &str) -> Value {
    serde_json::from_str(result).unwrap_or_else(|_| Value::String(result.to_owned()))
}

/// A rendered input as a view shows it: the body, or what stopped it.
fn shown(rendered: Result<Value, crate::domain::MappingError>) -> Value {
    rendered.unwrap_or_else(|e| json!({"error": e.to_string()}))
}

impl StepView {
    /// A step as the caller sees it: its name, status and result.
    pub fn for_caller(st: &StepState) -> Self {
        Self {
            name: st.name.clone(),
            status: st.status.as_str().to_owned(),
            result: caller_result(st),
            ..Self::default()
        }
    }

    /// A step as the operator sees it: everything the record holds.
    pub fn of(st: &StepState) -> Self {
        Self {
            name: st.name.clone(),
            status: st.status.as_str().to_owned(),
            undoable: Some(st.undoable),
            finished_attempt: st.finished_attempt,
            finished_at: st.finished_at,
            sent: Some(st.sent),
            generation: Some(st.generation),
            result: caller_result(st),
            undo: st.undo.map(|u| u.as_str().to_owned()),
            undo_generation: Some(st.undo_generation),
            waiting_until: st.waiting_until,
            sent_until: st.sent_until,
            input_revision: st.input_revision,
            misconfigured: (st.misconfigured != 0).then_some(st.misconfigured),
            within: None,
            service: None,
            action: None,
            input: None,
            undo_action: None,
            undo_input: None,
            elements: st.elements.iter().map(StepView::of).collect(),
            child_task_id: None,
            run: None,
        }
    }
}

/// A step's result as shown: a forEach step's is its elements' (`null` for one refused), once
/// it is done.
///
/// A JSON Lines result (a distributed forEach's past a message's inline size, by reference)
/// shows as its reference, never its content: `{"jsonLines": {"elements", "bytes", "sha256",
/// "key"}}`, the object `key` in the payload bucket (its retention is the task's); `GET
/// /tasks/{taskId}/steps/{step}/result` reads it.
fn caller_result(st: &StepState) -> Option<Value> {
    if st.result.is_none()
        && let Some(r) = &st.result_ref
        && let Some(lines) = &r.lines
    {
        return Some(json!({"jsonLines": {
            "elements": lines.count,
            "bytes": r.bytes,
            "sha256": r.sha256,
            "key": r.key(),
        }}));
    }
    whole_result(st)
}

/// A step's result whole, as the mappings read it (but a JSON Lines result, kept by reference):
/// a forEach step's is its elements' (`null` for one refused), once it is done.
pub(crate) fn whole_result(st: &StepState) -> Option<Value> {
    if st.elements.is_empty() {
        return st.result.as_deref().map(result_value);
    }
    (st.status == StepStatus::Done).then(|| {
        Value::Array(
            st.elements
                .iter()
                .map(|e| e.result.as_deref().map_or(Value::Null, result_value))
                .collect(),
        )
    })
}

impl HistoryEntry {
    /// A history line as the operator sees it.
    pub fn of(h: &crate::domain::state::HistoryEntry) -> Self {
        Self {
            at: h.at,
            from: Some(h.from),
            to: h.to,
            step: h.step.clone(),
            attempt: Some(h.attempt),
            reason: Some(h.reason.clone()),
            by: h.by.clone(),
        }
    }
}

impl TaskView {
    /// The operator's view of a task and its state record: everything (each step's result as
    /// JSON). With its workflow, each step also names its service and action and shows the
    /// input its request was (or would be) built from, and its undo's once compensation reached
    /// it: rendered from the task's input and the results so far, as the scheduler does.
    pub fn of(task: &Task, r: &StateRecord, workflow: Option<&Workflow>) -> Self {
        let steps = r
            .steps
            .iter()
            .enumerate()
            .map(|(i, st)| {
                let mut v = StepView::of(st);
                if let Some((w, step)) = workflow.and_then(|w| Some((w, w.step(i)?))) {
                    // The input this step ran with (or will run with): the view shows what its
                    // request and its undo's were built from.
                    let context =
                        crate::domain::context::context(w, task, r, i).unwrap_or(Value::Null);
                    v.within = w.place(i);
                    v.child_task_id = child_task_id(w, r, i);
                    v.run = run_of_step(w, r, i).map(|id| RunLink::of(id, None));
                    // (A wait step calls no service.)
                    let calls = step.wait.is_none();
                    v.service = calls.then(|| step.service.clone());
                    v.action = calls.then(|| step.action.clone());
                    let reached = st.status != StepStatus::Skipped
                        && (i <= r.step_index || st.status != StepStatus::Pending);
                    if step.for_each.is_some() {
                        // Each element's request is its own: the step's mapping with the
                        // element and its index (and, for its undo, its own result).
                        elements_inputs(&mut v, w, task, r, i);
                        return v;
                    }
                    if reached && calls {
                        v.input = Some(shown(
                            step.input
                                .render_lenient(&context, crate::domain::task::MAX_REQUEST_BYTES),
                        ));
                    }
                    if let (Some(undo), Some(_)) = (&step.undo, st.undo) {
                        v.undo_action = Some(undo.action.clone());
                        v.undo_input = Some(shown(
                            undo.input
                                .render_lenient(&context, crate::domain::task::MAX_REQUEST_BYTES),
                        ));
                    }
                }
                v
            })
            .collect();
        let mut steps: Vec<StepView> = steps;
        let never_forward = matches!(
            r.process_state,
            ProcessState::Compensating
                | ProcessState::Compensated
                | ProcessState::CompensationFailed
                | ProcessState::Refused
                | ProcessState::Resolved
        );
        if never_forward {
            // A forEach stopped before some elements went out: those will never run.
            for v in &mut steps {
                for e in &mut v.elements {
                    if e.status == StepStatus::Pending.as_str() && e.sent != Some(true) {
                        e.status = StepStatus::Skipped.as_str().to_owned();
                    }
                }
            }
        }
        Self {
            task_id: task.id.to_string(),
            workflow: Some(task.workflow.clone()),
            workflow_version: Some(task.workflow_version),
            caller: Some(task.caller.to_string()),
            keys: keys_of(task),
            input: Some(task.input.clone()),
            input_revision: Some(task.input_revision),
            earlier_inputs: task.earlier_inputs.clone(),
            reply_queue_url: task.reply_queue_url.clone(),
            process_state: r.process_state,
            locked_by: r.locked_by.clone(),
            complete_by: r.complete_by,
            failure_count: Some(r.failure_count),
            attempt: Some(r.attempt),
            current_step: r.current_step().map(str::to_owned),
            round: Some(r.round),
            steps,
            decisions: r.decisions.clone(),
            branches: BranchView::all(r, workflow),
            pivot: r.pivot.and_then(|p| r.steps.get(p)).map(|s| s.name.clone()),
            past_pivot: r.pivot.map(|_| r.past_pivot()),
            last_error: r.last_error.clone(),
            refusal: r.refusal.clone(),
            history: r.history.iter().map(HistoryEntry::of).collect(),
            created_at: Some(r.created_at),
            updated_at: Some(r.updated_at),
            since: Some(r.since),
            deadline: r.deadline,
            start_at: r.start_at,
            priority: r.priority,
            parent: ParentView::of(r),
            gate: r.gate.as_ref().map(GateView::of),
            run: RunView::of(r, 0),
            element: ElementView::of(r),
        }
        .bounded()
    }

    /// The view with its payloads within the caps (see [`VIEW_PAYLOADS_BYTES`]).
    fn bounded(mut self) -> Self {
        Shown::bound(&mut self.input, &mut self.earlier_inputs, &mut self.steps);
        self
    }

    /// The view with its distributed forEach steps' runs as read (`runs`: each run's id and
    /// record, if found): their states and counts.
    pub fn with_runs(mut self, runs: &[(TaskId, Option<StateRecord>)]) -> Self {
        for v in &mut self.steps {
            let Some(link) = &mut v.run else {
                continue;
            };
            if let Some((id, record)) = runs.iter().find(|(id, _)| id.to_string() == link.task_id) {
                *link = RunLink::of(*id, record.as_ref());
            }
        }
        self
    }
}

/// The most bytes (as JSON text) one payload of a view shows whole: an input, a request body,
/// a result.
pub const VIEW_PAYLOAD_BYTES: usize = crate::domain::payload::SHOWN_WHOLE_BYTES;
/// The most bytes a view's payloads show together, so that an answer stays well within
/// Lambda's 6 MB response whatever the task holds (inputs and results go up to 6 MiB each).
pub const VIEW_PAYLOADS_BYTES: usize = 4 * 1024 * 1024;

/// What is left of a view's [`VIEW_PAYLOADS_BYTES`], spent in the view's order.
struct Shown(usize);

impl Shown {
    /// Bounds the payloads of a view: the input, the earlier inputs, then each step's (and
    /// element's) result, body and undo body. One over [`VIEW_PAYLOAD_BYTES`], or past what is
    /// left, shows as `{"omitted": {"bytes", "sha256"}}`: its size, and the SHA-256 of its JSON
    /// text (which names its object in the payload bucket, when it is kept there).
    fn bound(input: &mut Option<Value>, earlier: &mut [EarlierInput], steps: &mut [StepView]) {
        let mut left = Self(VIEW_PAYLOADS_BYTES);
        if let Some(v) = input {
            left.cap(v);
        }
        for e in earlier {
            left.cap(&mut e.input);
        }
        for s in steps {
            left.step(s);
        }
    }

    fn step(&mut self, s: &mut StepView) {
        for v in [&mut s.result, &mut s.input, &mut s.undo_input]
            .into_iter()
            .flatten()
        {
            self.cap(v);
        }
        for e in &mut s.elements {
            self.step(e);
        }
    }

    fn cap(&mut self, v: &mut Value) {
        let text = v.to_string();
        if text.len() <= VIEW_PAYLOAD_BYTES && text.len() <= self.0 {
            self.0 -= text.len();
            return;
        }
        use sha2::Digest;
        *v = json!({"omitted": {
            "bytes": text.len(),
            "sha256": hex::encode(sha2::Sha256::digest(text.as_bytes())),
        }});
    }
}

/// The inputs of forEach step `i`'s elements, in their views (`v.elements`): each element's
/// request as the scheduler builds it (the step's mapping with `$.element` and `$.index`), once
/// it went out, and its undo's once compensation reached it (reading its own result).
fn elements_inputs(v: &mut StepView, w: &Workflow, task: &Task, r: &StateRecord, i: usize) {
    let (Some(step), Some(st)) = (w.step(i), r.steps.get(i)) else {
        return;
    };
    let Ok(list) = crate::domain::transition::elements(w, task, r, i) else {
        return;
    };
    let limit = crate::domain::task::MAX_REQUEST_BYTES;
    for (k, (ev, es)) in v.elements.iter_mut().zip(&st.elements).enumerate() {
        // The element's state stands in the step's place (its own result), as for its undo.
        let mut seen = r.clone();
        seen.steps[i] = es.clone();
        let Some(mut context) = crate::domain::context::context(w, task, &seen, i) else {
            continue;
        };
        context["element"] = list.get(k).cloned().unwrap_or_default();
        context["index"] = json!(r.list_index(k));
        if es.sent || es.status != StepStatus::Pending {
            ev.input = Some(shown(step.input.render_lenient(&context, limit)));
        }
        if let (Some(undo), Some(_)) = (&step.undo, es.undo) {
            ev.undo_action = Some(undo.action.clone());
            ev.undo_input = Some(shown(undo.input.render_lenient(&context, limit)));
        }
    }
    v.service = Some(step.service.clone());
    v.action = Some(step.action.clone());
    v.within = w.place(i);
}

/// A task's place at its gate, as the operator's view shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GateView {
    /// The workflow and the key's value.
    pub gate: String,
    pub limit: u32,
    /// `InLine`, `Parked`, `Held` or `Left`.
    pub status: String,
    /// While it waits: the tasks holding the gate.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub holders: Vec<String>,
    /// While it waits: how many wait before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ahead: Option<u32>,
}

impl GateView {
    fn of(g: &crate::domain::state::GateHold) -> Self {
        Self {
            gate: g.gate.clone(),
            limit: g.limit,
            status: format!("{:?}", g.status),
            holders: vec![],
            ahead: None,
        }
    }

    /// With who holds the gate and how many wait before the task, as read.
    pub fn with_state(mut self, state: crate::ports::GateState) -> Self {
        self.holders = state.holders.iter().map(ToString::to_string).collect();
        self.ahead = state.ahead;
        self
    }
}

/// A task's search keys as its views show them: name → value.
fn keys_of(task: &Task) -> BTreeMap<String, String> {
    task.keys
        .iter()
        .map(|k| (k.key.name.clone(), k.key.value.clone()))
        .collect()
}

impl CallerTaskView {
    /// What a task's caller sees (see the type); errors only if `public_errors`.
    pub fn of(task: &Task, r: &StateRecord, public_errors: bool) -> Self {
        Self {
            task_id: task.id.to_string(),
            workflow: Some(task.workflow.clone()),
            workflow_version: Some(task.workflow_version),
            keys: keys_of(task),
            input: Some(task.input.clone()),
            input_revision: Some(task.input_revision),
            earlier_inputs: task.earlier_inputs.clone(),
            reply_queue_url: task.reply_queue_url.clone(),
            process_state: r.process_state,
            current_step: r.current_step().map(str::to_owned),
            steps: r.steps.iter().map(StepView::for_caller).collect(),
            decisions: r.decisions.clone(),
            refusal: r.refusal.clone(),
            history: r
                .history
                .iter()
                .map(|h| HistoryEntry {
                    at: h.at,
                    from: Some(h.from),
                    to: h.to,
                    step: h.step.clone(),
                    attempt: None,
                    reason: public_errors.then(|| h.reason.clone()),
                    by: None,
                })
                .collect(),
            created_at: Some(r.created_at),
            updated_at: Some(r.updated_at),
            since: Some(r.since),
            deadline: r.deadline,
            start_at: r.start_at,
            priority: r.priority,
            parent: ParentView::of(r),
            last_error: public_errors.then(|| r.last_error.clone()),
        }
        .bounded()
    }

    /// The view with its payloads within the caps (see [`VIEW_PAYLOADS_BYTES`]).
    fn bounded(mut self) -> Self {
        Shown::bound(&mut self.input, &mut self.earlier_inputs, &mut self.steps);
        self
    }

    /// The view with its sub-workflow steps' child tasks, which the caller may read too.
    pub fn with_children(mut self, w: &Workflow, r: &StateRecord) -> Self {
        for (i, v) in self.steps.iter_mut().enumerate() {
            v.child_task_id = child_task_id(w, r, i);
        }
        self
    }
}

impl TaskSummary {
    /// A row of the operator's list.
    pub fn of(s: &crate::ports::Summary) -> Self {
        Self {
            task_id: s.task_id.to_string(),
            workflow: Some(s.workflow.clone()),
            process_state: s.process_state,
            step: s.step.clone(),
            failure_count: Some(s.failure_count),
            attempt: Some(s.attempt),
            last_error: s.last_error.clone(),
            updated_at: Some(s.updated_at),
            since: Some(s.since),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Caller;
    use crate::domain::workflow::examples;

    fn task_and_record() -> (Task, StateRecord, Workflow) {
        let w = examples::ecommerce_order(&crate::Policy::default());
        // Fixed, so the views' JSON can be compared with the golden files.
        let now = chrono::DateTime::parse_from_rfc3339("2026-01-02T03:04:05.678Z")
            .map(|t| t.with_timezone(&Utc))
            .expect("a fixed time");
        let id: crate::domain::TaskId = "0b6d3f9e-2c51-4a8e-9f1d-7a3c5e2b9d40"
            .parse()
            .expect("a fixed task id");
        let task = Task {
            input_ref: None,
            id,
            workflow: w.name.clone(),
            workflow_version: w.version,
            input: json!({"customerId": "c", "items": [{"sku": "a", "quantity": 1}]}),
            input_revision: 0,
            earlier_inputs: vec![],
            reply_queue_url: None,
            created_at: now,
            caller: Caller::new("alice").expect("caller"),
            keys: vec![],
        };
        let mut r = StateRecord::new(id, &w, None, now, now);
        r.last_error = Some("payment: HTTP 500 from https://internal.example/charge".into());
        r.locked_by = Some("scheduler-1".into());
        (task, r, w)
    }

    /// A view answers within Lambda's response whatever the task holds: a payload over 256 KiB
    /// shows as its size and hash (the name of its object), and past 4 MiB in all every
    /// payload that does not fit what is left does too, in the view's order.
    #[test]
    fn views_show_large_payloads_as_their_size_and_hash_within_a_budget() {
        let (mut task, mut r, w) = task_and_record();
        task.input = json!({"quote": "q".repeat(300 * 1024)});
        let object =
            crate::domain::payload::PayloadRef::of(task.id, task.input.to_string().as_bytes());
        r.steps[0].result = Some(json!({"id": "small"}).to_string());
        r.steps[1].result = Some(json!("r".repeat(1024 * 1024)).to_string());
        for v in [
            serde_json::to_value(TaskView::of(&task, &r, Some(&w))).expect("json"),
            serde_json::to_value(CallerTaskView::of(&task, &r, false)).expect("json"),
        ] {
            assert_eq!(
                v["input"],
                json!({"omitted": {"bytes": object.bytes, "sha256": object.sha256}})
            );
            assert_eq!(v["steps"][0]["result"], json!({"id": "small"}));
            assert_eq!(
                v["steps"][1]["result"]["omitted"]["bytes"],
                json!(1024 * 1024 + 2)
            );
            assert!(v.to_string().len() < 64 * 1024, "the view is small");
        }

        // The budget: 20 results of 250,000 bytes; 16 fit in 4 MiB, then only smaller ones.
        let mut steps: Vec<StepView> = (0..20)
            .map(|i| StepView {
                name: format!("s{i}"),
                result: Some(json!("x".repeat(250_000 - 2))),
                ..StepView::default()
            })
            .collect();
        steps.push(StepView {
            name: "last".into(),
            result: Some(json!({"ok": true})),
            ..StepView::default()
        });
        Shown::bound(&mut None, &mut [], &mut steps);
        let shown = |s: &StepView| {
            s.result
                .as_ref()
                .is_some_and(|v| v.get("omitted").is_none())
        };
        assert_eq!(steps.iter().take(20).filter(|s| shown(s)).count(), 16);
        assert!(steps[..16].iter().all(shown) && !shown(&steps[16]));
        assert!(shown(&steps[20]), "a small one after still fits");
    }

    /// Records in several shapes: new; a step done with a JSON result and one with text, an
    /// undo out, a refusal, an operator's entry, a replaced input, a misconfigured count.
    fn shapes() -> Vec<(Task, StateRecord, Workflow)> {
        let (task, r, w) = task_and_record();
        let mut out = vec![(task.clone(), r.clone(), w.clone())];
        let mut r2 = r.clone();
        let now = r.created_at;
        r2.process_state = ProcessState::Compensating;
        r2.step_index = 1;
        r2.steps[0].status = StepStatus::Done;
        r2.steps[0].result = Some(r#"{"id":"r1"}"#.into());
        r2.steps[0].finished_attempt = Some(1);
        r2.steps[0].finished_at = Some(now);
        r2.steps[0].sent = true;
        r2.steps[0].undo = Some(StepStatus::Running);
        r2.steps[1].status = StepStatus::Failed;
        r2.steps[1].result = Some("not json".into());
        r2.steps[1].generation = 2;
        r2.steps[1].misconfigured = 3;
        r2.steps[1].input_revision = Some(1);
        r2.steps[1].sent_until = Some(now);
        r2.refusal = Some(Refusal {
            step: r2.steps[1].name.clone(),
            code: "declined".into(),
            message: "no".into(),
        });
        r2.history.push(crate::domain::state::HistoryEntry {
            at: now,
            from: ProcessState::Error,
            to: ProcessState::Compensating,
            step: None,
            attempt: 2,
            reason: "operator compensate".into(),
            by: Some("bob".into()),
        });
        r2.complete_by = None;
        r2.locked_by = None;
        r2.last_error = None;
        let mut t2 = task.clone();
        t2.reply_queue_url = Some("https://sqs.example/q".into());
        t2.input_revision = 1;
        t2.earlier_inputs = vec![EarlierInput {
            input_ref: None,
            revision: 0,
            input: json!({"customerId": "old"}),
        }];
        out.push((t2, r2, w));
        out
    }

    /// The views' JSON as the server answered it when the views were built by hand with
    /// `json!` (the files were written from those builders, then checked equal to the typed
    /// views): per shape of [`shapes`], the caller's view without and with public errors, and
    /// the operator's without and with the workflow.
    const GOLDEN: [[&str; 4]; 2] = [
        [
            include_str!("testdata/new.caller.json"),
            include_str!("testdata/new.caller-public.json"),
            include_str!("testdata/new.operator.json"),
            include_str!("testdata/new.operator-workflow.json"),
        ],
        [
            include_str!("testdata/compensating.caller.json"),
            include_str!("testdata/compensating.caller-public.json"),
            include_str!("testdata/compensating.operator.json"),
            include_str!("testdata/compensating.operator-workflow.json"),
        ],
    ];

    #[test]
    fn the_typed_views_serialize_as_the_views_built_by_hand_did() {
        let shapes = shapes();
        assert_eq!(shapes.len(), GOLDEN.len());
        for ((task, r, w), golden) in shapes.iter().zip(GOLDEN) {
            let views = [
                serde_json::to_string_pretty(&CallerTaskView::of(task, r, false)),
                serde_json::to_string_pretty(&CallerTaskView::of(task, r, true)),
                serde_json::to_string_pretty(&TaskView::of(task, r, None)),
                serde_json::to_string_pretty(&TaskView::of(task, r, Some(w))),
            ];
            for (typed, golden) in views.into_iter().zip(golden) {
                let typed = typed.unwrap_or_default() + "\n";
                assert_eq!(typed, golden, "byte for byte");
            }
        }
    }

    #[test]
    fn a_caller_sees_errors_only_if_the_workflow_makes_them_public() {
        let (task, r, _) = task_and_record();
        let view = |public| {
            serde_json::to_value(CallerTaskView::of(&task, &r, public)).unwrap_or(Value::Null)
        };
        let private = view(false);
        for hidden in [
            "lastError",
            "lockedBy",
            "attempt",
            "failureCount",
            "completeBy",
            "caller",
        ] {
            assert!(private.get(hidden).is_none(), "{hidden}: {private}");
        }
        assert!(private["history"][0].get("reason").is_none(), "{private}");
        assert!(
            !private.to_string().contains("internal.example"),
            "{private}"
        );
        let public = view(true);
        assert_eq!(public["lastError"], json!(r.last_error), "{public}");
        assert_eq!(public["history"][0]["reason"], "received", "{public}");
        assert!(public.get("lockedBy").is_none(), "{public}");
        // The operator sees everything.
        let ops = serde_json::to_value(TaskView::of(&task, &r, None)).unwrap_or(Value::Null);
        assert_eq!(ops["lockedBy"], "scheduler-1");
        assert_eq!(ops["caller"], "alice");
    }

    /// The link of a run (or, with `element`, of an element) to step `post` (2) of `owner`.
    fn post_link(
        owner: TaskId,
        element: Option<crate::domain::state::ElementOf>,
    ) -> crate::domain::state::ParentLink {
        crate::domain::state::ParentLink {
            task_id: owner,
            step: "post".into(),
            step_index: 2,
            generation: 0,
            reply_queue_url: "https://sqs.example/q".into(),
            depth: 1,
            undo_attempt: None,
            released: false,
            element,
        }
    }

    /// A run's view names its task and step and pages its elements (never more than
    /// `ELEMENTS_PAGE`, each with its id and mark); an element's names its run, index and task;
    /// an ordinary task's has neither.
    #[test]
    fn a_run_pages_its_elements_and_an_element_names_its_run_and_task() {
        use crate::domain::state::{ElementOf, RunState};
        let (task, r, w) = task_and_record();
        let owner = TaskId::new_random();
        let link = |element| post_link(owner, element);
        let mut run = r.clone();
        run.parent = Some(link(None));
        run.run = Some(RunState {
            list: None,
            context: None,
            ledger: Run {
                total: 10_000,
                max_concurrency: 1_000,
                tolerated: 5,
                undoable: true,
                chunk: 1,
                refused: 0,
                marks: format!("{}{}{}", "d".repeat(150), "f".repeat(2), "o".repeat(48)),
                stop: None,
            },
        });
        let v = TaskView::of(&task, &run, Some(&w));
        let page = v.run.as_ref().expect("a run's view");
        assert_eq!(
            (page.task_id.as_str(), page.step.as_str()),
            (owner.to_string().as_str(), "post")
        );
        assert_eq!(page.step_index, 2);
        let c = page.counts;
        assert_eq!(
            (c.total, c.opened, c.done, c.refused, c.out),
            (10_000, 200, 150, 2, 48)
        );
        assert_eq!(page.elements.len(), ELEMENTS_PAGE as usize);
        assert_eq!(page.elements_from, 0);
        assert_eq!(page.next_elements_from, Some(100));
        assert_eq!(
            page.elements[7].task_id,
            crate::handlers::runs::element_id(run.task_id, 7).to_string()
        );
        assert_eq!(page.elements[7].mark.as_deref(), Some("done"));
        // Further on: refused, out, then never opened; the last page ends the list.
        let later = RunView::of(&run, 150).expect("a run");
        assert_eq!(later.elements[0].index, 150);
        assert_eq!(later.elements[0].mark.as_deref(), Some("refused"));
        assert_eq!(later.elements[2].mark.as_deref(), Some("out"));
        assert_eq!(later.elements[50].mark, None, "#200 is not opened");
        let last = RunView::of(&run, 9_950).expect("a run");
        assert_eq!((last.elements.len(), last.next_elements_from), (50, None));
        let past = RunView::of(&run, u32::MAX).expect("a run");
        assert!(past.elements.is_empty() && past.next_elements_from.is_none());
        assert!(v.element.is_none());

        let mut element = r.clone();
        element.parent = Some(link(Some(ElementOf {
            index: 42,
            task_id: owner,
            step_index: 2,
            first: None,
        })));
        let e = TaskView::of(&task, &element, Some(&w));
        assert_eq!(
            e.element,
            Some(ElementView {
                run_id: owner.to_string(),
                index: 42,
                task_id: owner.to_string(),
                step: "post".into(),
                first: None,
            })
        );
        assert!(e.run.is_none());
        let plain = TaskView::of(&task, &r, Some(&w));
        assert!(plain.run.is_none() && plain.element.is_none());
        assert!(plain.steps.iter().all(|s| s.run.is_none()));
        // Both decode back.
        for view in [v, e] {
            let text = serde_json::to_string(&view).unwrap_or_default();
            let back: Result<TaskView, _> = serde_json::from_str(&text);
            assert_eq!(back.ok(), Some(view));
        }
    }

    /// A run in chunks pages its chunks and counts them, but its elements' total and those
    /// refused; a chunk's view names the first element it holds.
    #[test]
    fn a_run_in_chunks_pages_its_chunks_and_counts_its_refused_elements() {
        use crate::domain::state::{ElementOf, RunState};
        let (task, r, w) = task_and_record();
        let owner = TaskId::new_random();
        let link = |element| post_link(owner, element);
        let mut run = r.clone();
        run.parent = Some(link(None));
        run.run = Some(RunState {
            list: None,
            context: None,
            ledger: Run {
                total: 1_005,
                max_concurrency: 50,
                tolerated: 5,
                undoable: true,
                chunk: 20,
                refused: 3,
                marks: format!("{}{}", "d".repeat(40), "o".repeat(11)),
                stop: None,
            },
        });
        let page = RunView::of(&run, 0).expect("a run's view");
        let c = page.counts;
        assert_eq!(
            (c.total, c.chunk, c.opened, c.done, c.refused, c.out),
            (1_005, Some(20), 51, 40, 3, 11)
        );
        // 51 chunks (the last of 5 elements): one page, all of them.
        assert_eq!((page.elements.len(), page.next_elements_from), (51, None));
        assert_eq!(page.elements[50].mark.as_deref(), Some("out"));
        let mut chunk = r.clone();
        chunk.parent = Some(link(Some(ElementOf {
            index: 3,
            task_id: owner,
            step_index: 2,
            first: Some(60),
        })));
        let e = TaskView::of(&task, &chunk, Some(&w));
        assert_eq!(e.element.and_then(|e| e.first), Some(60));
    }

    #[test]
    fn a_view_decodes_back_into_its_type() {
        for (task, r, w) in shapes() {
            let view = TaskView::of(&task, &r, Some(&w));
            let text = serde_json::to_string(&view).unwrap_or_default();
            let back: Result<TaskView, _> = serde_json::from_str(&text);
            assert_eq!(back.ok(), Some(view));
        }
    }
}
