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

use super::state::{ProcessState, StateRecord, StepStatus};
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
    /// The branch whose event is being applied: set only on the record as seen from a branch,
    /// inside a transition; never stored.
    #[serde(skip)]
    pub current: Option<usize>,
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

impl StateRecord {
    /// The invariants of a record whose parallel group runs (or stopped, in Error): see
    /// [`StateRecord::check`].
    pub(super) fn check_fanout(&self, f: &Fanout) -> Result<(), String> {
        use ProcessState as P;
        use StepStatus as S;
        let steps = &self.steps;
        let passed = |r: std::ops::Range<usize>| steps[r].iter().all(|s| s.status.is_passed());
        let untouched = |r: std::ops::Range<usize>| {
            steps[r]
                .iter()
                .all(|s| matches!(s.status, S::Pending | S::Skipped) && !s.sent)
        };
        if !matches!(self.process_state, P::Pending | P::Processing | P::Error) {
            return Err(format!(
                "{} with a parallel group running",
                self.process_state
            ));
        }
        if f.current.is_some() {
            return Err("a stored record seen from a branch".into());
        }
        // Stopped in Error, the cursor is on the step that failed, for the operator.
        let cursor = match (&f.stop, self.process_state) {
            (Some(stop), P::Error) => stop.step,
            _ => f.start,
        };
        if f.start >= f.end || f.end > steps.len() || self.step_index != cursor {
            return Err("a parallel group's span, or the cursor not on it".into());
        }
        if steps.iter().any(|s| s.undo.is_some()) {
            return Err("a parallel group running with an undo started".into());
        }
        if !passed(0..f.start) || !untouched(f.end..steps.len()) {
            return Err("a step before the group not done, or one after it started".into());
        }
        let mut at = f.start;
        for (b, br) in f.branches.iter().enumerate() {
            if br.start != at
                || br.end <= br.start
                || br.step_index < br.start
                || br.step_index > br.end
            {
                return Err(format!("branch {b}'s span or cursor"));
            }
            at = br.end;
            if !passed(br.start..br.step_index)
                || !untouched((br.step_index + 1).min(br.end)..br.end)
            {
                return Err(format!(
                    "branch {b}: a step before its cursor not done, or one after it started"
                ));
            }
            let current = steps
                .get(br.step_index)
                .filter(|_| br.step_index < br.end)
                .map(|s| s.status);
            let ok = match br.process_state {
                P::Processed => br.step_index == br.end,
                P::Processing => {
                    br.locked_by.is_some()
                        && br.complete_by.is_some()
                        && matches!(current, Some(S::Running | S::Waiting))
                }
                P::Pending => {
                    br.locked_by.is_none()
                        && current == Some(S::Pending)
                        && (f.stop.is_some() || br.complete_by.is_some())
                }
                P::Error => {
                    f.stop.is_some()
                        && matches!(
                            current,
                            Some(S::Pending | S::Failed | S::TimedOut | S::Faulted)
                        )
                }
                _ => false,
            };
            if !ok {
                return Err(format!(
                    "branch {b} is {} with its step {current:?}",
                    br.process_state
                ));
            }
        }
        if at != f.end {
            return Err("the branches do not cover the group".into());
        }
        if let Some(stop) = &f.stop
            && !(f.start..f.end).contains(&stop.step)
        {
            return Err("a parallel group stopped by a step outside it".into());
        }
        let out = f.branches.iter().any(Branch::is_out);
        let expected = match (out, self.process_state) {
            (true, P::Processing) => true,
            (false, P::Pending) => f.stop.is_none(),
            (false, P::Error) => f.stop.is_some(),
            _ => false,
        };
        if !expected || self.locked_by.is_some() != out {
            return Err(format!(
                "{} (locked: {}) while a branch is out: {out}",
                self.process_state,
                self.locked_by.is_some()
            ));
        }
        let stopping = f.stop.is_some();
        let due = f
            .branches
            .iter()
            .filter(|br| br.is_out() || (!stopping && br.process_state == P::Pending))
            .filter_map(|br| br.complete_by)
            .min();
        if self.process_state != P::Error && self.complete_by != due {
            return Err("CompleteBy is not the earliest branch deadline".into());
        }
        Ok(())
    }
}
