//! [`ApiDeps`]: what the API's handlers work with, built once per process (the Lambda's `main`,
//! `sas-local`, the tests).

use crate::domain::rate::RateLimit;
use crate::domain::task::ReplyQueues;
use crate::handlers::TaskPorts;
use crate::ports::Timetable;
use std::sync::Arc;

#[derive(Clone)]
pub struct ApiDeps {
    /// The store, queue, bus, clock, definitions, work queue and metrics.
    pub ports: TaskPorts,
    /// This is the operator API (every route under [`super::OPERATOR_PREFIX`]; tasks of every
    /// caller, the actions, definitions). Off on the task API.
    pub operator_api: bool,
    /// The queues a task's caller may name for its status messages.
    pub reply_queues: ReplyQueues,
    /// Each caller's allowance on the task API (`None`: unlimited).
    pub rate_limit: Option<RateLimit>,
    /// The timers of schedules, set when the operator API publishes one.
    pub timetable: Arc<dyn Timetable>,
    /// The agents' cap on the calls in flight of a service without its own `concurrency`
    /// (`SERVICE_SHARE`), shown with each service.
    pub service_share: Option<u32>,
    /// The scheduler's outlets, with which the task API claims a new task's first step and
    /// sends its request itself (`DISPATCH_AT_SUBMISSION`, on by default): no work message,
    /// no scheduler invocation, no claim write. `None`: every new task goes through the work
    /// queue (the operator API, which starts none).
    pub dispatch: Option<Arc<crate::handlers::scheduler::SchedulerDeps>>,
}
