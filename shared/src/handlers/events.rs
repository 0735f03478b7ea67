//! Named events delivered to a task, from either door: the API (`POST /tasks/{id}/events/{name}`,
//! [`crate::api::events`]) or the stack's task-events bus (a `TaskEvent` a service put there with
//! `events:PutEvents`, which the bus's rule sends to the work queue: [`BusEvent`]). The wait the
//! task (or a branch) is in for the event ends with it; an event for a wait still to come is kept
//! for it ([`crate::domain::transition::deliver`]).

use super::start::Dispatch;
use super::{HandlerError, TaskPorts, count_outcome, perform_no_step, write};
use crate::domain::inbox::{Delivery, MAX_PAYLOAD_BYTES};
use crate::domain::transition::{self, Rejection, TaskRouter};
use crate::domain::workflow::{Problem, Wait};
use crate::domain::{Caller, ProcessState, TaskId};
use crate::ports::StoreError;
use serde::Deserialize;
use serde_json::Value;
use tracing::{error, info};

/// The longest event id.
pub const MAX_EVENT_ID_LEN: usize = 255;
/// How often a delivery that lost a race for its record is tried again.
const TRIES: usize = 4;
/// The detail type of an event for a task on the task-events bus.
pub const BUS_DETAIL_TYPE: &str = "TaskEvent";

/// One event for one task.
#[derive(Debug, Clone, PartialEq)]
pub struct EventDelivery<'a> {
    pub task_id: TaskId,
    /// The caller the task must belong to (the task API); `None`: any task (the operator API,
    /// the bus).
    pub owner: Option<&'a Caller>,
    pub name: &'a str,
    /// Makes a repeat of the event change nothing.
    pub event_id: Option<String>,
    pub payload: Value,
}

/// What a delivery did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivered {
    /// Taken: it ended its wait, or (`kept`) is kept for a wait not reached yet.
    Taken { kept: bool },
    /// Its event id was taken before: nothing changed.
    Duplicate,
}

/// Why an event was not taken.
#[derive(Debug, thiserror::Error)]
pub enum EventError {
    #[error("no task {0}")]
    TaskNotFound(TaskId),
    /// The task's workflow waits for no event of this name.
    #[error("{0}")]
    NotExpected(String),
    /// No wait still to come is for it, or the task keeps as many early events as it may.
    #[error("{message}")]
    Refused {
        message: String,
        process_state: ProcessState,
    },
    /// The payload is too large (by itself, or for the task's results budget, which its
    /// events count against) or not what the wait's schema wants.
    #[error("{message}")]
    Payload {
        message: String,
        problems: Option<Vec<Problem>>,
    },
    /// The task kept changing while the event was delivered.
    #[error("the task kept changing while the event was delivered: try again")]
    Contended,
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Handler(#[from] HandlerError),
}

/// Delivers `d` to its task: one conditional write of the task's record. With `dispatch` (the
/// scheduler's outlets: the task API's, the scheduler's own), an event that sends the task on
/// at once takes the next step's claim in that write, and the step's request goes out from
/// here: no work message.
pub async fn deliver_event(
    ports: &TaskPorts,
    d: EventDelivery<'_>,
    dispatch: Option<&dyn Dispatch>,
) -> Result<Delivered, EventError> {
    let text = d.payload.to_string();
    if text.len() > MAX_PAYLOAD_BYTES {
        return Err(EventError::Payload {
            message: format!(
                "the event's payload is {} bytes (at most {MAX_PAYLOAD_BYTES})",
                text.len()
            ),
            problems: None,
        });
    }
    let delivery = Delivery {
        name: d.name.to_owned(),
        id: d.event_id.clone(),
        payload: text,
    };
    for _ in 0..TRIES {
        let (task, record) = match ports.store.get(d.task_id).await? {
            Some((task, record)) if d.owner.is_none_or(|c| c == &task.caller) => (task, record),
            _ => return Err(EventError::TaskNotFound(d.task_id)),
        };
        let workflow = super::workflow_of(&ports.definitions, &record).await?;
        let Some((_, step)) = workflow.event_step(d.name) else {
            return Err(EventError::NotExpected(format!(
                "workflow {} v{} waits for no event {:?}",
                workflow.name, workflow.version, d.name
            )));
        };
        if let Some(Wait::Event {
            payload: Some(schema),
            ..
        }) = &step.wait
        {
            let problems: Vec<Problem> = schema
                .iter_errors(&d.payload)
                .map(|e| Problem {
                    at: e.instance_path().to_string(),
                    message: e.to_string(),
                })
                .collect();
            if !problems.is_empty() {
                return Err(EventError::Payload {
                    message: format!(
                        "the payload of {:?} does not match step {:?}'s payload schema",
                        d.name, step.name
                    ),
                    problems: Some(problems),
                });
            }
        }
        let router = TaskRouter {
            workflow: &workflow,
            task: &task,
        };
        let now = ports.clock.now();
        let t = match transition::deliver(&record, &delivery, now, &workflow.policies(), &router) {
            Ok(t) => t,
            Err(Rejection::DuplicateEvent) => {
                info!(event = %d.name, "event repeated under its id: nothing changes");
                return Ok(Delivered::Duplicate);
            }
            Err(why @ Rejection::OverResultsBudget { .. }) => {
                // Its payload is what does not fit: the task's results budget counts events.
                return Err(EventError::Payload {
                    message: why.to_string(),
                    problems: None,
                });
            }
            Err(why) => {
                return Err(EventError::Refused {
                    message: why.to_string(),
                    process_state: record.process_state,
                });
            }
        };
        // An event that sends the task on at once takes the next step's claim with it, where
        // this process has the scheduler's outlets.
        let claimer = dispatch.filter(|d| d.calls_back());
        let t = match claimer {
            Some(c) => transition::claimed_in_place(
                &record,
                t,
                c.instance_id(),
                now,
                &workflow.policies(),
                &router,
            ),
            None => t,
        };
        if !write(ports.store.as_ref(), &t).await? {
            // Another write came first (a reply, another event): read the task again.
            continue;
        }
        count_outcome(&ports.metrics, record.process_state, &t);
        let kept = t.record.inbox.kept.len() > record.inbox.kept.len();
        info!(event = %d.name, kept, state = %t.record.process_state, "event taken");
        let performed = match claimer.filter(|_| t.record.attempt > record.attempt) {
            // Claimed here: the step's request and its timer go out as the scheduler sends them
            // (a crash before leaves the claim to its deadline, in the due index).
            Some(c) => c.perform(&task, &workflow, &t).await,
            None => perform_no_step(&ports.outlets(), &t).await,
        };
        if let Err(e) = performed {
            // The write stands: a lost work message is re-enqueued at the pickup deadline, a
            // lost request at its step's deadline.
            error!(error = %e, "event written, effects left to the supervisor");
        }
        return Ok(Delivered::Taken { kept });
    }
    Err(EventError::Contended)
}

/// An event for a task a service put on the stack's task-events bus, as the bus's rule sends it
/// to the work queue (the EventBridge event, whole):
///
/// ```json
/// {"detail-type": "TaskEvent", "source": "<the sender's>", "id": "<EventBridge's>",
///  "detail": {"taskId": "…", "event": "contract-signed", "eventId": "…", "payload": {…}}}
/// ```
///
/// `eventId` is optional: without it, EventBridge's own id of the event stands in (a
/// redelivery of one event is then harmless, a second PutEvents of it is not).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct BusEvent {
    #[serde(rename = "detail-type")]
    pub detail_type: String,
    pub id: String,
    #[serde(default)]
    pub source: String,
    pub detail: BusEventDetail,
}

/// A bus event's `detail`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BusEventDetail {
    pub task_id: TaskId,
    pub event: String,
    #[serde(default)]
    pub event_id: Option<String>,
    #[serde(default)]
    pub payload: Value,
}

impl BusEvent {
    /// Reads a work-queue message as a bus event (`None`: it is not one).
    pub fn parse(body: &str) -> Option<Result<Self, String>> {
        let v: Value = serde_json::from_str(body).ok()?;
        if v.get("detail-type")?.as_str()? != BUS_DETAIL_TYPE {
            return None;
        }
        Some(serde_json::from_value(v).map_err(|e| format!("a TaskEvent that does not read: {e}")))
    }

    /// The delivery it asks for.
    pub fn delivery(&self) -> Result<EventDelivery<'_>, String> {
        let d = &self.detail;
        let event_id = d
            .event_id
            .clone()
            .unwrap_or_else(|| format!("eventbridge:{}", self.id));
        if event_id.is_empty()
            || event_id.len() > MAX_EVENT_ID_LEN
            || !event_id.bytes().all(|b| b.is_ascii_graphic())
        {
            return Err(format!(
                "eventId: 1 to {MAX_EVENT_ID_LEN} visible ASCII characters"
            ));
        }
        Ok(EventDelivery {
            task_id: d.task_id,
            owner: None,
            name: &d.event,
            event_id: Some(event_id),
            payload: d.payload.clone(),
        })
    }
}

/// A bus event taken from the work queue: delivered; one that can never be (a task or a name
/// unknown, refused, a bad payload) is a poison message, copied to the dead-letter queue with
/// its reason; a store that failed leaves it for redelivery.
pub async fn on_bus_event(
    ports: &TaskPorts,
    event: &BusEvent,
    dispatch: Option<&dyn Dispatch>,
) -> Result<(), HandlerError> {
    let delivery = event.delivery().map_err(HandlerError::Poison)?;
    match deliver_event(ports, delivery, dispatch).await {
        Ok(Delivered::Taken { kept }) => {
            info!(source = %event.source, kept, "an event from the bus taken");
            Ok(())
        }
        Ok(Delivered::Duplicate) => Ok(()),
        Err(EventError::Store(e)) => Err(e.into()),
        Err(EventError::Handler(e)) => Err(e),
        Err(EventError::Contended) => Err(HandlerError::Store(StoreError::Unavailable(
            "the task kept changing".into(),
        ))),
        Err(e) => Err(HandlerError::Poison(format!(
            "event {:?} for task {} from {:?}: {e}",
            event.detail.event, event.detail.task_id, event.source
        ))),
    }
}
