//! [`ApiDeps`]: what the API's handlers work with, built once per process (the Lambda's `main`,
//! `sas-local`, the tests).

use crate::catalog::Definitions;
use crate::domain::rate::RateLimit;
use crate::domain::task::ReplyQueues;
use crate::ports::{Clock, EventBus, Queue, StateStore};
use std::sync::Arc;

#[derive(Clone)]
pub struct ApiDeps {
    pub store: Arc<dyn StateStore>,
    pub queue: Arc<dyn Queue>,
    pub events: Arc<dyn EventBus>,
    pub clock: Arc<dyn Clock>,
    pub definitions: Arc<Definitions>,
    pub work_queue_url: String,
    /// This is the operator API (every route under [`super::OPERATOR_PREFIX`]; tasks of every
    /// caller, the actions, definitions). Off on the task API.
    pub operator_api: bool,
    /// The queues a task's caller may name for its status messages.
    pub reply_queues: ReplyQueues,
    /// Each caller's allowance on the task API (`None`: unlimited).
    pub rate_limit: Option<RateLimit>,
    /// Where the handler's EMF metrics go.
    pub metrics: crate::metrics::Metrics,
}

impl ApiDeps {
    /// Where an action's effects go.
    pub(crate) fn outlets(&self) -> crate::handlers::Outlets<'_> {
        crate::handlers::Outlets {
            store: self.store.as_ref(),
            queue: self.queue.as_ref(),
            events: self.events.as_ref(),
            clock: self.clock.as_ref(),
            work_queue_url: &self.work_queue_url,
        }
    }
}
