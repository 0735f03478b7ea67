//! The JSON bodies that travel on the queues and the event bus. Every message that can be
//! answered late carries the `attempt` (fencing token) and `stepIndex` it belongs to.

use crate::domain::transition::StepOutcome;
use crate::domain::{NoticeKind, ProcessState, StateRecord, TaskId};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// What the scheduler consumes: work messages (its work queue) and agents' replies (the reply
/// queue). One handler serves both queues; the `type` tag tells them apart.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum SchedulerMessage {
    Work(WorkMessage),
    Reply(StepReply),
    /// A schedule's run: sent by EventBridge Scheduler (the schedule's target input) or by
    /// `sas-local`'s timetable.
    Scheduled(ScheduledRun),
    /// Elements of a distributed forEach ended: their run applies them (the ends queue, FIFO,
    /// grouped by run, so one run's ends are applied one batch at a time).
    Ended(ElementsEnded),
}

/// Elements' ends, for their run's record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ElementsEnded {
    pub run_id: TaskId,
    pub ends: Vec<crate::domain::run::ElementEnd>,
}

/// One run of a schedule: `{"type": "scheduled", "schedule": NAME, "at": TIME}`, `at` the run's
/// scheduled time (Scheduler's `<aws.scheduler.scheduled-time>`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScheduledRun {
    pub schedule: String,
    pub at: DateTime<Utc>,
}

/// "This task needs a scheduler": sent by submission, by the supervisor's recoveries, by the
/// scheduler when compensation starts, and by the operator API.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkMessage {
    pub task_id: TaskId,
    /// Not to be acted on before this instant: set when the wanted delay is over SQS's 15
    /// minutes, so the scheduler sends the message again for the rest of the wait.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_before: Option<DateTime<Utc>>,
    /// The task's lane and tenant, so a message sent on (a long wait's) goes the way it came
    /// without reading the task (see [`crate::domain::lane`]).
    #[serde(default, skip_serializing_if = "crate::domain::Priority::is_normal")]
    pub priority: crate::domain::Priority,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

impl WorkMessage {
    /// A work message of no lane but the normal one, in no tenant's group (a task that is not
    /// read before it is sent: the next at a gate, a schedule's run).
    pub fn new(task_id: TaskId) -> Self {
        Self {
            task_id,
            not_before: None,
            priority: crate::domain::Priority::Normal,
            tenant: None,
        }
    }

    /// The work message of `record`'s task: in its lane, in its tenant's group.
    pub fn of(record: &crate::domain::StateRecord) -> Self {
        Self {
            task_id: record.task_id,
            not_before: None,
            priority: record.priority,
            tenant: record.tenant.clone(),
        }
    }
}

/// A deadline timer: sent by the scheduler when it dispatches a step (or undo), delayed to arrive
/// at `completeBy` (SQS delays cap at 15 minutes; the supervisor re-arms an early timer). The
/// supervisor then checks that one record; the scheduled sweep stays as the safety net.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeadlineTimer {
    pub task_id: TaskId,
    pub attempt: u64,
    pub step_index: usize,
    pub complete_by: DateTime<Utc>,
    /// Its task's tenant: the group it is sent in (and re-armed in), so that one caller's
    /// timers do not hold back another's recoveries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

impl DeadlineTimer {
    /// A timer for `record`'s current attempt and step, due at `complete_by`.
    pub fn of(record: &crate::domain::StateRecord, complete_by: DateTime<Utc>) -> Self {
        Self {
            task_id: record.task_id,
            attempt: record.attempt,
            step_index: record.step_index,
            complete_by,
            tenant: record.tenant.clone(),
        }
    }
}

/// The idempotency key of a step's action (or its undo's) as the remote service sees it: the
/// same for every attempt, so a retried or re-run step takes effect once; `generation` changes
/// it only when an operator retries a call the service refused.
pub fn idempotency_key(task_id: TaskId, step: &str, action: &str, generation: u32) -> String {
    if generation == 0 {
        format!("{task_id}:{step}:{action}")
    } else {
        format!("{task_id}:{step}:{action}:g{generation}")
    }
}

/// A scheduler asks an agent to perform one step (or its undo) on one service.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StepRequest {
    pub task_id: TaskId,
    pub workflow: String,
    pub workflow_version: u32,
    pub step: String,
    pub step_index: usize,
    /// The service that performs the step.
    pub service: String,
    /// What the service is asked to do (the step's action, or its undo's).
    pub action: String,
    pub attempt: u64,
    /// This request undoes the step (compensation): `action` is the undo's action and
    /// `undoes` the step's own idempotency key.
    #[serde(default)]
    pub undo: bool,
    pub undoes: Option<String>,
    /// The key to send to the remote service; absent in older messages, then derived.
    pub idempotency_key: Option<String>,
    /// The step's deadline: past it the agent stops and sends nothing.
    pub complete_by: DateTime<Utc>,
    /// The step's timeout (start to close), in milliseconds: the agent stops this long after it
    /// picked the request up, even if `complete_by` (which also allows for the request's wait in
    /// the queue) is later. Absent in older requests: `complete_by` alone.
    pub timeout_ms: Option<u64>,
    pub reply_queue_url: String,
    /// The request body, built by the step's input mapping: whole, or `null` when it travels
    /// by reference; absent when it travels in parts ([`StepRequest::input_parts`]), so an
    /// agent that knows no parts fails to read such a request rather than call its service
    /// with a body that lacks them.
    pub input: Option<serde_json::Value>,
    /// A body over [`MESSAGE_INLINE_BYTES`] travels by reference: the agent reads it from the
    /// payload store.
    ///
    /// [`MESSAGE_INLINE_BYTES`]: crate::domain::payload::MESSAGE_INLINE_BYTES
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_ref: Option<crate::domain::PayloadRef>,
    /// The parts of a body over [`MESSAGE_INLINE_BYTES`] that are payloads kept already (the
    /// task's input, a step's result): each travels by its reference and the agent puts it back
    /// where it was, so a large result passed on is neither written nor stored twice.
    ///
    /// [`MESSAGE_INLINE_BYTES`]: crate::domain::payload::MESSAGE_INLINE_BYTES
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub input_parts: Vec<BodyPart>,
    /// With parts: the body around them, each part's place `null` (absent when a part is the
    /// whole body).
    pub input_frame: Option<serde_json::Value>,
    /// For a callback step: where the service completes it later.
    pub callback: Option<crate::ports::CallbackAddress>,
    /// A sub-workflow step's request (its service is sas itself, its action the workflow):
    /// how its child task starts.
    pub child: Option<ChildRequest>,
    /// The values its service's `perKey` limit may count the call under: the task's search
    /// keys by name, and its caller's tenant under `caller`.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub limit_keys: crate::domain::limits::CallKeys,
}

/// A part of a step request's body kept by reference: the payload whose value the body holds
/// at `at`, a JSON Pointer (RFC 6901; `""` is the whole body).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BodyPart {
    pub at: String,
    pub payload: crate::domain::PayloadRef,
}

/// How the agent starts a sub-workflow step's child task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChildRequest {
    /// Pinned by the step; `None`: the newest published when the step starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<u32>,
    /// The parent's caller: the child's too, so the caller sees its task's children.
    pub caller: crate::domain::Caller,
    /// How deep the child is (1: a child of a task that is no child itself).
    pub depth: usize,
    /// The parent's priority: the child's (a run's elements') too.
    #[serde(default, skip_serializing_if = "crate::domain::Priority::is_normal")]
    pub priority: crate::domain::Priority,
}

impl StepRequest {
    /// Its task's tenant (its caller's digest, under [`crate::domain::limits::CALLER_KEY`]):
    /// the group its reply is sent in, so that one caller's replies do not hold back another's.
    pub fn tenant(&self) -> Option<&str> {
        self.limit_keys
            .get(crate::domain::limits::CALLER_KEY)
            .map(String::as_str)
    }

    /// The idempotency key the remote service sees: the same for every attempt of the same
    /// step of the same task, so a retried or re-run step takes effect once.
    pub fn idempotency_key(&self) -> String {
        self.idempotency_key
            .clone()
            .unwrap_or_else(|| idempotency_key(self.task_id, &self.step, &self.action, 0))
    }
}

/// An agent's answer to a [`StepRequest`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StepReply {
    pub task_id: TaskId,
    pub step: String,
    pub step_index: usize,
    pub attempt: u64,
    /// Answers the step's undo, not the step.
    #[serde(default)]
    pub undo: bool,
    pub outcome: StepOutcome,
    /// A success whose result is over [`MESSAGE_INLINE_BYTES`]: the result travels by
    /// reference (the outcome's own is then absent) and the scheduler reads it back.
    ///
    /// [`MESSAGE_INLINE_BYTES`]: crate::domain::payload::MESSAGE_INLINE_BYTES
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_ref: Option<crate::domain::PayloadRef>,
    /// A service's callback, not an agent's reply: the key generation its token names. It is
    /// fenced by the step and this generation instead of `attempt` (see
    /// [`crate::domain::transition::apply_callback`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<u32>,
}

/// A status message of a task: published to the event bus (detail-type `Task<NoticeKind>`, e.g.
/// `TaskFailed`, the operator alert; the detail names the workflow, so a rule can route one
/// workflow's events) and sent to the task's reply queue if it has one.
/// Delivery is at least once. Every notice has an `id`, `{taskId}:{sequence}:{status}`, where
/// `sequence` is the version of the task's record written by the transition that made the
/// status: a redelivered notice (after a crash, a lost race or a lost response) carries the same
/// id, so consumers deduplicate on `id`. A task's sequences grow with its transitions, so
/// consumers may reorder one task's notices on `sequence`. The statuses of the outbox (see
/// [`NoticeKind`]) are first published in the order they were made; the best-effort ones
/// (`TaskReceived`, `TaskStepCompleted`, `TaskRetrying`, `TaskCancelled`) may be missing or
/// arrive out of order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskNotice {
    /// `{taskId}:{sequence}:{status}`: the same on every delivery of this notice.
    pub id: String,
    pub task_id: TaskId,
    pub workflow: String,
    pub workflow_version: u32,
    pub status: NoticeKind,
    pub process_state: ProcessState,
    pub step: Option<String>,
    pub attempt: u64,
    pub failure_count: u32,
    pub last_error: Option<String>,
    /// The service's refusal (step, code, message), on `TaskRefused` and after.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refusal: Option<crate::domain::state::Refusal>,
    /// Who asked for this transition (an operator's principal, or the task's caller for a
    /// cancel), on the notices of those actions only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// The reason they gave, if any (with `by`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub sequence: u64,
    pub at: DateTime<Utc>,
}

/// The event source of everything sas publishes.
pub const EVENT_SOURCE: &str = "sas.tasks";

impl TaskNotice {
    /// The notice of `status`, made by the transition that wrote version `sequence` of the
    /// record; the other fields are `r`'s (the record as it is when the notice goes out).
    pub fn of(r: &StateRecord, status: NoticeKind, sequence: u64) -> Self {
        // The action that made this version, if someone asked for it: its history line was
        // written with it (same time, same state).
        let acted = r
            .history
            .last()
            .filter(|h| h.by.is_some() && h.at == r.updated_at && h.to == r.process_state);
        Self {
            id: format!("{}:{sequence}:{}", r.task_id, status.as_str()),
            task_id: r.task_id,
            workflow: r.workflow.clone(),
            workflow_version: r.workflow_version,
            status,
            process_state: r.process_state,
            step: r.steps.get(r.step_index).map(|s| s.name.clone()),
            attempt: r.attempt,
            failure_count: r.failure_count,
            last_error: r.last_error.clone(),
            refusal: r.refusal.clone(),
            by: acted.and_then(|h| h.by.clone()),
            reason: acted.map(|h| h.reason.clone()),
            sequence,
            at: r.updated_at,
        }
    }

    /// The EventBridge `detail-type`.
    pub fn detail_type(&self) -> &'static str {
        self.status.detail_type()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_notice_keeps_its_id_when_it_is_delivered_after_the_record_moved_on() {
        let policy = crate::Policy::default();
        let w = crate::domain::workflow::examples::ecommerce_order(&policy);
        let now = chrono::Utc::now();
        let mut r = StateRecord::new(TaskId::new_random(), &w, None, now, now);
        r.version = 5;
        r.owe(NoticeKind::Failed);
        // The task goes on compensating before the alert is delivered (its deliverer died).
        r.version = 8;
        r.owe(NoticeKind::Compensated);
        let ids: Vec<String> = r
            .outbox
            .iter()
            .map(|o| TaskNotice::of(&r, o.status, o.sequence).id)
            .collect();
        assert_eq!(
            ids,
            [
                format!("{}:5:Failed", r.task_id),
                format!("{}:8:Compensated", r.task_id)
            ]
        );
        let alert = TaskNotice::of(&r, NoticeKind::Failed, r.outbox[0].sequence);
        assert_eq!((alert.sequence, alert.detail_type()), (5, "TaskFailed"));
        let v = serde_json::to_value(&alert).expect("serializes");
        assert_eq!(v["id"], serde_json::json!(ids[0]));
        assert_eq!(v["sequence"], 5);
    }

    #[test]
    fn scheduler_messages_are_tagged_by_type() {
        let id = TaskId::new_random();
        let work =
            serde_json::to_value(SchedulerMessage::Work(WorkMessage::new(id))).expect("serializes");
        assert_eq!(work["type"], "work");
        assert_eq!(work["taskId"], id.to_string());
        let reply: SchedulerMessage = serde_json::from_value(serde_json::json!({
            "type": "reply", "taskId": id, "step": "charge-payment", "stepIndex": 1,
            "attempt": 2, "outcome": {"status": "failed", "error": "declined"}
        }))
        .expect("parses");
        let SchedulerMessage::Reply(r) = reply else {
            panic!("not a reply")
        };
        assert_eq!(
            r.outcome,
            StepOutcome::Failed {
                error: "declined".into()
            }
        );
    }
}
