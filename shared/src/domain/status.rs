//! The states a task and each of its steps go through.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// `ProcessState` of the pattern, with the compensation states of the Compensating Transaction
/// pattern. See ARCHITECTURE.md for the state diagram. Ordered as a task goes through them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ProcessState {
    /// Waiting for a scheduler to claim it (new, or handed back by the supervisor).
    Pending,
    /// Claimed by a scheduler; the current step must finish by `CompleteBy`.
    Processing,
    /// Every step done. Terminal.
    Processed,
    /// Failed and left for the operator (automatic compensation off). Terminal until an
    /// operator retries or compensates it.
    Error,
    /// Undoing the steps that may have taken effect, last first. Unlocked: waiting for a
    /// scheduler; locked: the current step's undo is out to its agent.
    Compensating,
    /// Every step that may have taken effect is undone. Terminal.
    Compensated,
    /// An undo was refused, or timed out at the failure threshold. Terminal until an operator
    /// retries it.
    CompensationFailed,
    /// A service refused a step with a business outcome the workflow can expect (a declined
    /// loan), and every step that had taken effect is undone. Terminal; no operator alert.
    Refused,
    /// An operator closed an `Error` or `CompensationFailed` task by hand (reconciled outside
    /// sas), with a note. Terminal for good: nothing moves it again.
    Resolved,
}

impl ProcessState {
    pub const ALL: [ProcessState; 9] = [
        Self::Pending,
        Self::Processing,
        Self::Processed,
        Self::Error,
        Self::Compensating,
        Self::Compensated,
        Self::CompensationFailed,
        Self::Refused,
        Self::Resolved,
    ];

    /// Going forward: waiting for a claim or claimed. The two share one entry of the state
    /// index (see [`StateRecord::listed_since`](super::StateRecord::listed_since)), so that a
    /// claim, and a wait's or a callback's return to `Pending`, rewrite no index entry.
    pub fn is_active(self) -> bool {
        matches!(self, Self::Pending | Self::Processing)
    }
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            Self::Processed
                | Self::Error
                | Self::Compensated
                | Self::CompensationFailed
                | Self::Refused
                | Self::Resolved
        )
    }
    /// Terminal for good: no operator action moves it again (`Error` and `CompensationFailed`
    /// wait for one). A final task expires after the deployment's retention.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            Self::Processed | Self::Compensated | Self::Refused | Self::Resolved
        )
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "Pending",
            Self::Processing => "Processing",
            Self::Processed => "Processed",
            Self::Error => "Error",
            Self::Compensating => "Compensating",
            Self::Compensated => "Compensated",
            Self::CompensationFailed => "CompensationFailed",
            Self::Refused => "Refused",
            Self::Resolved => "Resolved",
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
        Self::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| format!("unknown ProcessState {s:?}"))
    }
}

/// The status of one step, or of its undo.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum StepStatus {
    /// Not started, or handed back for retry.
    Pending,
    /// A request is out to the agent under the record's current attempt.
    Running,
    /// The remote service confirmed the step.
    Done,
    /// The remote service refused the step for good (so it had no effect).
    Failed,
    /// No reply came before the last allowed deadline: the step may or may not have taken effect.
    TimedOut,
    /// The task was cancelled while the step ran: it may or may not have taken effect.
    Cancelled,
    /// The service confirmed the step, but its answer cannot be kept (over the size limit,
    /// [`MAX_RESULT_BYTES`]): the step took effect and the
    /// task fails.
    Faulted,
    /// A callback step: the service accepted the request and completes the step later through
    /// the task API's callback (or the step times out).
    Waiting,
    /// Not run: its `when` (or its group's) did not hold, or it is in a case of a choice that
    /// did not run. Never called, never undone.
    Skipped,
}

impl StepStatus {
    pub(crate) const ALL: [StepStatus; 9] = [
        Self::Pending,
        Self::Running,
        Self::Done,
        Self::Failed,
        Self::TimedOut,
        Self::Cancelled,
        Self::Faulted,
        Self::Waiting,
        Self::Skipped,
    ];

    /// Done, or decided not to run: nothing more happens to the step going forward.
    pub fn is_passed(self) -> bool {
        matches!(self, Self::Done | Self::Skipped)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "Pending",
            Self::Running => "Running",
            Self::Done => "Done",
            Self::Failed => "Failed",
            Self::TimedOut => "TimedOut",
            Self::Cancelled => "Cancelled",
            Self::Faulted => "Faulted",
            Self::Waiting => "Waiting",
            Self::Skipped => "Skipped",
        }
    }
}

impl fmt::Display for StepStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for StepStatus {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| format!("unknown StepStatus {s:?}"))
    }
}
