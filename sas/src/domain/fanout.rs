//! A parallel group while it runs: one cursor per branch ([`Fanout`], in the state record).
//!
//! The record's own cursor (`StepIndex`, `Attempt`, `LockedBy`, `CompleteBy`, ...) moves one
//! step at a time. While a parallel group runs, each branch has a cursor of the same shape
//! ([`Branch`]), and the record's fields are their aggregate: Processing while a branch has a
//! step out, the earliest branch deadline as `CompleteBy` (the due index's key), the highest
//! attempt. Every event about a branch (its claim, a reply, a callback, a passed deadline) is
//! applied by the same transitions as on the main line, to the record seen from that branch
//! (see `transition::branches`). The fan-out ends when every branch is done (the main cursor
//! goes on after the group), or, after the first failure in a branch ([`Stop`]), once no branch
//! has a step out (the task then fails or compensates from that step, as on the main line).

use super::status::ProcessState;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// A parallel group running on a task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Fanout {
    /// The group's name.
    pub group: String,
    /// The first step of the group (where the record's cursor stands while it runs) and the
    /// first after it.
    pub start: usize,
    pub end: usize,
    pub branches: Vec<Branch>,
    /// The first failure in a branch: no branch sends another step from then on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<Stop>,
    /// A forEach step running, rather than a parallel group: branch `k` is element `k`, whose
    /// state is `steps[each.step].elements[k]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub each: Option<Each>,
    /// The branch whose event is being applied: set only on the record as seen from a branch,
    /// inside a transition; never stored.
    #[serde(skip)]
    pub current: Option<usize>,
}

/// A forEach step's run: its step, how many elements may be out at once, and how many
/// refusals it tolerates (and has met).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Each {
    pub step: usize,
    pub max_concurrency: u32,
    pub tolerated: u32,
    #[serde(default)]
    pub refused: u32,
}

/// One branch's cursor: the fields the record has for its main line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Branch {
    /// The branch's steps.
    pub start: usize,
    pub end: usize,
    /// Pending (its step waits for a claim), Processing (its step is out), Processed (every
    /// step of the branch is done or skipped), Error (it failed: see [`Fanout::stop`]).
    pub process_state: ProcessState,
    /// The branch's current step (`end` once Processed).
    pub step_index: usize,
    /// The attempt its current step went out under (the fencing token of its replies).
    pub attempt: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub locked_by: Option<String>,
    /// Processing: its step's deadline. Pending: its pickup deadline (claimable from that
    /// minus the step's pickup timeout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub complete_by: Option<DateTime<Utc>>,
    #[serde(default)]
    pub failure_count: u32,
    #[serde(default)]
    pub round: u32,
    #[serde(default)]
    pub deferrals: u32,
    #[serde(default)]
    pub requeues: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

impl Branch {
    /// A branch over steps `start..end`, not yet opened (see `branches::reopen`).
    pub fn new(start: usize, end: usize, attempt: u64) -> Self {
        Self {
            start,
            end,
            process_state: ProcessState::Pending,
            step_index: start,
            attempt,
            locked_by: None,
            complete_by: None,
            failure_count: 0,
            round: 0,
            deferrals: 0,
            requeues: 0,
            last_error: None,
        }
    }

    /// Whether the branch has a step out.
    pub fn is_out(&self) -> bool {
        self.process_state == ProcessState::Processing
    }
}

/// The first failure in a branch, which stops the group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Stop {
    /// The step that failed.
    pub step: usize,
    pub reason: String,
    pub kind: StopKind,
}

/// How the failed step ended, which decides what the task does once no branch is out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum StopKind {
    /// Its service refused it: compensation, ending Refused (as a refusal on the main line).
    Refused,
    /// It failed (faulted, timed out at its threshold, its request could not be built, its
    /// condition could not be decided): the task fails, with the alert.
    Failed,
    /// Its service answered as misconfigured at the threshold: Error for an operator, whatever
    /// the policy on compensation.
    Held,
}
