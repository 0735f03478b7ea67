//! The state record: the pattern's one source of truth about a task.

use super::order::OrderId;
use super::workflow::Workflow;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// `ProcessState` of the pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ProcessState {
    /// Waiting for a scheduler to claim it (new, or handed back by the supervisor).
    Pending,
    /// Claimed by a scheduler; the current step must finish by `CompleteBy`.
    Processing,
    /// Every step done. Terminal.
    Processed,
    /// Failed for good (permanent fault or failure threshold reached). Terminal.
    Error,
}

impl ProcessState {
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Processed | Self::Error)
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "Pending",
            Self::Processing => "Processing",
            Self::Processed => "Processed",
            Self::Error => "Error",
        }
    }
}

impl fmt::Display for ProcessState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ProcessState {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "Pending" => Self::Pending,
            "Processing" => Self::Processing,
            "Processed" => Self::Processed,
            "Error" => Self::Error,
            other => return Err(format!("unknown ProcessState {other:?}")),
        })
    }
}

/// The status of one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum StepStatus {
    /// Not started, or handed back for retry.
    Pending,
    /// A request is out to the agent under the record's current attempt.
    Running,
    /// The remote service confirmed the step.
    Done,
    /// The remote service refused the step for good.
    Failed,
}

impl StepStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "Pending",
            Self::Running => "Running",
            Self::Done => "Done",
            Self::Failed => "Failed",
        }
    }
}

impl FromStr for StepStatus {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "Pending" => Self::Pending,
            "Running" => Self::Running,
            "Done" => Self::Done,
            "Failed" => Self::Failed,
            other => return Err(format!("unknown StepStatus {other:?}")),
        })
    }
}

/// One step's progress.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StepState {
    pub name: String,
    pub status: StepStatus,
    /// The attempt under which the step finished (Done or Failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_attempt: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<DateTime<Utc>>,
}

/// The state record of one order. Field names follow the pattern (`LockedBy`, `CompleteBy`,
/// `ProcessState`, `FailureCount`) plus the fencing `Attempt` and a `Version` that every write
/// bumps and every conditional write checks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StateRecord {
    pub order_id: OrderId,
    pub workflow: String,
    pub process_state: ProcessState,
    /// The scheduler instance holding the claim; `None` unless Processing.
    pub locked_by: Option<String>,
    /// Pending: the pickup deadline. Processing: the current step's deadline. Terminal: none.
    pub complete_by: Option<DateTime<Utc>>,
    /// Deadlines that expired (counted by the supervisor).
    pub failure_count: u32,
    /// Bumped on every claim: the fencing token carried by step requests and replies.
    pub attempt: u64,
    /// The index of the current step (`steps.len()` once Processed).
    pub step_index: usize,
    pub steps: Vec<StepState>,
    pub last_error: Option<String>,
    /// A terminal notice (event, reply-queue message) is owed: the outbox flag.
    pub notice_pending: bool,
    /// Where the application wants its completion notice, if anywhere.
    pub reply_queue_url: Option<String>,
    /// Optimistic-concurrency version: +1 on every write.
    pub version: u64,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// A broken invariant of the state record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid state record: {0}")]
pub struct Invariant(pub String);

/// Drops sub-millisecond precision: the stores keep milliseconds, so every timestamp the domain
/// writes is already at that precision and survives a round trip unchanged.
pub fn to_millis(t: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(t.timestamp_millis()).unwrap_or(t)
}

impl StateRecord {
    /// A new Pending record that a scheduler must pick up by `pickup_by`.
    pub fn new(
        order_id: OrderId,
        workflow: &Workflow,
        reply_queue_url: Option<String>,
        now: DateTime<Utc>,
        pickup_by: DateTime<Utc>,
    ) -> Self {
        let now = to_millis(now);
        Self {
            order_id,
            workflow: workflow.name.clone(),
            process_state: ProcessState::Pending,
            locked_by: None,
            complete_by: Some(to_millis(pickup_by)),
            failure_count: 0,
            attempt: 0,
            step_index: 0,
            steps: workflow
                .steps
                .iter()
                .map(|s| StepState {
                    name: s.name.clone(),
                    status: StepStatus::Pending,
                    finished_attempt: None,
                    finished_at: None,
                })
                .collect(),
            last_error: None,
            notice_pending: false,
            reply_queue_url,
            version: 1,
            created_at: now,
            updated_at: now,
        }
    }

    /// The current step's name, if the record has a current step.
    pub fn current_step(&self) -> Option<&str> {
        self.steps.get(self.step_index).map(|s| s.name.as_str())
    }

    /// When the supervisor must look at this record, if ever: the deadline of a non-terminal
    /// record, or at once for a terminal record whose notice is still owed. This is what the
    /// sparse due index carries; `None` means the record is absent from the index.
    pub fn due_at(&self) -> Option<DateTime<Utc>> {
        if self.notice_pending {
            Some(self.updated_at)
        } else if self.process_state.is_terminal() {
            None
        } else {
            self.complete_by
        }
    }

    /// The due-index shard of this record (see ARCHITECTURE.md: sharding the sparse index).
    pub fn due_shard(&self, shards: u32) -> u32 {
        due_shard(&self.order_id, shards)
    }

    /// Checks every invariant of the record. `threshold` is the failure threshold in force.
    pub fn check(&self, threshold: u32) -> Result<(), Invariant> {
        let bad = |m: String| Err(Invariant(m));
        let n = self.steps.len();
        let done_before = self.steps[..self.step_index.min(n)]
            .iter()
            .all(|s| s.status == StepStatus::Done);
        let untouched_after = self.steps[(self.step_index + 1).min(n)..]
            .iter()
            .all(|s| s.status == StepStatus::Pending);
        if n == 0 {
            return bad("a record has at least one step".into());
        }
        if self.failure_count > threshold {
            return bad(format!(
                "FailureCount {} above the threshold {threshold}",
                self.failure_count
            ));
        }
        if self.failure_count == threshold && self.process_state != ProcessState::Error {
            return bad(format!(
                "FailureCount at the threshold while {}",
                self.process_state
            ));
        }
        if self.notice_pending && !self.process_state.is_terminal() {
            return bad("a notice is owed only by a terminal record".into());
        }
        if self.process_state.is_terminal()
            && (self.locked_by.is_some() || self.complete_by.is_some())
        {
            return bad(format!("{} record still locked or due", self.process_state));
        }
        if !done_before {
            return bad("a step before the current one is not Done".into());
        }
        if !untouched_after {
            return bad("a step after the current one has started".into());
        }
        match self.process_state {
            ProcessState::Pending => {
                if self.locked_by.is_some() || self.complete_by.is_none() {
                    return bad("Pending must be unlocked and carry a pickup deadline".into());
                }
                if self.step_index >= n || self.steps[self.step_index].status != StepStatus::Pending
                {
                    return bad("Pending must have its current step Pending".into());
                }
            }
            ProcessState::Processing => {
                if self.locked_by.is_none() || self.complete_by.is_none() || self.attempt == 0 {
                    return bad("Processing must be locked, claimed and carry a deadline".into());
                }
                if self.step_index >= n || self.steps[self.step_index].status != StepStatus::Running
                {
                    return bad("Processing must have its current step Running".into());
                }
            }
            ProcessState::Processed => {
                if self.step_index != n || self.steps.iter().any(|s| s.status != StepStatus::Done) {
                    return bad("Processed with a step not Done".into());
                }
            }
            ProcessState::Error => {
                if self.step_index < n
                    && !matches!(
                        self.steps[self.step_index].status,
                        StepStatus::Pending | StepStatus::Failed
                    )
                {
                    return bad("Error with its current step still Running or Done".into());
                }
            }
        }
        Ok(())
    }
}

/// The due-index shard of an order: a stable function of its id, spreading records evenly.
pub fn due_shard(id: &OrderId, shards: u32) -> u32 {
    let b = id.as_uuid().into_bytes();
    u32::from_be_bytes([b[12], b[13], b[14], b[15]]) % shards.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_record_is_valid_pending_and_due_at_its_pickup_deadline() {
        let now = Utc::now();
        let pickup = now + chrono::Duration::seconds(30);
        let r = StateRecord::new(
            OrderId::new_random(),
            &Workflow::ecommerce(),
            None,
            now,
            pickup,
        );
        r.check(3).expect("valid");
        assert_eq!(r.process_state, ProcessState::Pending);
        assert_eq!(r.due_at(), Some(to_millis(pickup)));
        assert_eq!(r.current_step(), Some("reserve-inventory"));
    }

    #[test]
    fn shards_cover_the_range_and_are_stable() {
        let mut seen = [0u32; 4];
        for _ in 0..400 {
            let id = OrderId::new_random();
            let s = due_shard(&id, 4);
            assert_eq!(s, due_shard(&id, 4));
            seen[s as usize] += 1;
        }
        assert!(seen.iter().all(|&c| c > 40), "uneven shards: {seen:?}");
    }

    #[test]
    fn process_state_round_trips_through_its_name() {
        for s in [
            ProcessState::Pending,
            ProcessState::Processing,
            ProcessState::Processed,
            ProcessState::Error,
        ] {
            assert_eq!(s.as_str().parse::<ProcessState>(), Ok(s));
        }
        assert!("Done".parse::<ProcessState>().is_err());
    }
}
