//! The state record's transitions, as pure functions:
//! (record, event, now, policy) → new record + the conditional write that must succeed for the
//! transition to count ([`Condition`]) + the effects to perform after it did, or a typed
//! rejection.
//!
//! Events: a scheduler [`claim`]s, an agent's reply is applied ([`apply_reply`]), a callback
//! step's service calls back ([`apply_callback`]), the supervisor finds a deadline passed
//! ([`expire`]; a wait step's time, `waiting`), the outbox is delivered ([`notice_delivered`])
//! (`running`); a failed task is
//! compensated (`compensating`); and an operator [`retry`]s, [`compensate`]s, [`cancel`]s,
//! [`resolve`]s or [`skip`]s (`operator`). What they share is in `common`.

mod branches;
mod common;
mod compensating;
mod deadline;
mod operator;
#[cfg(test)]
mod properties;
mod route;
mod run;
mod running;
#[cfg(test)]
mod testkit;
mod waiting;

pub use super::condition::{Condition, Guard, write_label};
pub use super::policy::{CallbackPolicy, MAX_REQUEUE_DELAY, Policies, Policy};
pub use common::{Actor, Effect, Rejection, StepOutcome, Transition};
pub use operator::{
    cancel, compensate, compensate_from, release_child, resolve, retry, retry_with_input, skip,
    stop_branches, undo_as_unit,
};
pub use route::{EachPlan, Linear, Parallel, Route, RouteError, Router, TaskRouter, elements};
pub use run::{apply_ends, new_run, recheck, undo_run};
pub use running::{
    apply_callback, apply_reply, claim, claimed_in_place, expire, goes_on_at_once,
    notice_delivered, park, resumed,
};
pub use waiting::{deliver, wake};
