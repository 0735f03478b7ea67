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
//!
//! A forEach step runs the same way: on the main line, each element is a branch of its own
//! group ([`Fanout::each`]); in a parallel group's branch, its elements join that group as
//! further branches ([`Fanout::inner`]) while the branch waits for them, so one group, one
//! stop and one aggregate cover a branch's elements too (the nesting is bounded: a parallel
//! group holds no parallel group, and a forEach step holds no steps).

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
    /// The forEach steps a parallel group's branches reached: the elements of each are
    /// branches of this group, after its own (see [`Each::within`]); the branch whose step it
    /// is waits for them ([`Fanout::waits`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inner: Vec<Each>,
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
    /// A forEach step in a parallel group's branch (one of [`Fanout::inner`]); `None` for a
    /// forEach step on the main line, whose elements are all the group's branches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub within: Option<Within>,
}

/// Where a forEach step run inside a branch keeps its elements among the group's branches.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Within {
    /// The branch whose step it is.
    pub branch: usize,
    /// Its elements are branches `first..first + count`.
    pub first: usize,
    pub count: usize,
    /// Every element is over (or an operator did the step by hand): the branch went on.
    #[serde(default)]
    pub done: bool,
}

impl Fanout {
    /// The forEach step branch `b` is an element of, and the element's index.
    pub fn each_of(&self, b: usize) -> Option<(&Each, usize)> {
        if let Some(e) = &self.each {
            return (b < self.branches.len()).then_some((e, b));
        }
        self.inner.iter().find_map(|e| {
            let w = e.within.as_ref()?;
            (w.first..w.first + w.count)
                .contains(&b)
                .then(|| (e, b - w.first))
        })
    }

    /// As [`Fanout::each_of`], to change the forEach step's run.
    pub fn each_of_mut(&mut self, b: usize) -> Option<&mut Each> {
        let n = self.branches.len();
        if let Some(e) = &mut self.each {
            return (b < n).then_some(e);
        }
        self.inner.iter_mut().find(|e| {
            e.within
                .as_ref()
                .is_some_and(|w| (w.first..w.first + w.count).contains(&b))
        })
    }

    /// Every forEach step whose elements still run: the main line's, or those of branches.
    pub fn running(&self) -> impl Iterator<Item = &Each> {
        self.each.iter().chain(
            self.inner
                .iter()
                .filter(|e| e.within.as_ref().is_some_and(|w| !w.done)),
        )
    }

    /// The branches that are the elements of `e`.
    pub fn elements_of(&self, e: &Each) -> std::ops::Range<usize> {
        match &e.within {
            Some(w) => w.first..w.first + w.count,
            None => 0..self.branches.len(),
        }
    }

    /// The forEach step (still running) branch `b` waits for: its step, whose elements are
    /// branches of the group.
    pub fn waits(&self, b: usize) -> Option<&Each> {
        let br = self.branches.get(b)?;
        self.inner.iter().find(|e| {
            e.step == br.step_index && e.within.as_ref().is_some_and(|w| w.branch == b && !w.done)
        })
    }
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
    #[serde(default, skip_serializing_if = "is_zero")]
    pub failure_count: u32,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub round: u32,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub deferrals: u32,
    #[serde(default, skip_serializing_if = "is_zero")]
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

    /// The branch moved on to step `at` with nothing out: Pending there, to be claimed by
    /// `pickup_by`, or Processed past its end; the counts of its last step's tries start again.
    pub fn moved_to(&self, at: usize, pickup_by: DateTime<Utc>) -> Branch {
        let open = at < self.end;
        Branch {
            process_state: if open {
                ProcessState::Pending
            } else {
                ProcessState::Processed
            },
            step_index: at,
            locked_by: None,
            complete_by: open.then_some(pickup_by),
            failure_count: 0,
            round: 0,
            deferrals: 0,
            requeues: 0,
            last_error: None,
            ..self.clone()
        }
    }

    /// Whether the branch has a step out (locked by the scheduler that sent it). A branch
    /// Processing without a lock waits for the elements of its forEach step
    /// ([`Fanout::waits`]): it has nothing out itself.
    pub fn is_out(&self) -> bool {
        self.process_state == ProcessState::Processing && self.locked_by.is_some()
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
    /// The failure's alert (`TaskFailed`) is owed already: it went out at the failure, while
    /// other branches were still out, and the task ending later owes no second one.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub alerted: bool,
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

/// A count left out of the stored body when zero (read back as its default).
fn is_zero(n: &u32) -> bool {
    *n == 0
}
