//! The conditions of state-record writes: every write pins the record's `Version` (so a write
//! computed from a stale read can never overwrite a newer record) and names the guards that keep
//! its transition's invariant. The stores evaluate exactly these guards (`ConditionExpression`
//! on DynamoDB, [`Condition::holds`] in memory).

use super::state::{ProcessState, StateRecord};
use chrono::{DateTime, Utc};

/// One predicate on the stored record that a conditional write requires.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Guard {
    StateIs(ProcessState),
    Unlocked,
    AttemptIs(u64),
    StepIndexIs(usize),
    /// The deadline is still the one the writer saw...
    CompleteByIs(DateTime<Utc>),
    /// ...and it has passed.
    CompleteByAtOrBefore(DateTime<Utc>),
    /// The outbox holds something to deliver.
    NoticePending,
}

/// The condition of a write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Condition {
    /// The record must not exist (creation).
    Absent,
    /// The record must be at `version` and satisfy every guard.
    Matches { version: u64, guards: Vec<Guard> },
}

impl Condition {
    /// The condition that `record`, as read, is still stored and satisfies `guards`.
    pub(crate) fn on(record: &StateRecord, guards: Vec<Guard>) -> Self {
        Self::Matches {
            version: record.version,
            guards,
        }
    }

    /// The condition of a write about the record's current step as read: same state, attempt
    /// and step (at the version read) - keeps "an answer counts only for the claim and step it
    /// answers" (replies, callbacks, a cancel of a step that may be out).
    pub(crate) fn on_step(record: &StateRecord, step_index: usize) -> Self {
        Self::on(
            record,
            vec![
                Guard::StateIs(record.process_state),
                Guard::AttemptIs(record.attempt),
                Guard::StepIndexIs(step_index),
            ],
        )
    }

    /// Whether the condition holds for the stored record (`None`: no record). The in-memory
    /// store uses this; the DynamoDB store translates the same guards to a condition expression.
    pub fn holds(&self, stored: Option<&StateRecord>) -> bool {
        match (self, stored) {
            (Self::Absent, s) => s.is_none(),
            (Self::Matches { .. }, None) => false,
            (Self::Matches { version, guards }, Some(r)) => {
                r.version == *version && guards.iter().all(|g| g.holds(r))
            }
        }
    }
}

/// The transition a state-record write makes, named for reports (the chaos harness's crash
/// points, the bench's write units): the head of its history line, digits as `#`, or
/// `outbox cleared` for a write that only empties the outbox.
pub fn write_label(record: &StateRecord, condition: &Condition) -> String {
    let clears_outbox = record.outbox.is_empty()
        && matches!(condition, Condition::Matches { guards, .. } if guards.contains(&Guard::NoticePending));
    if clears_outbox {
        return "outbox cleared".into();
    }
    let reason = record.history.last().map_or("", |h| h.reason.as_str());
    let head = reason.split(':').next().unwrap_or(reason);
    let name: String = head
        .chars()
        .map(|c| if c.is_ascii_digit() { '#' } else { c })
        .collect();
    name.trim().to_owned()
}

impl Guard {
    pub fn holds(&self, r: &StateRecord) -> bool {
        match self {
            Self::StateIs(s) => r.process_state == *s,
            Self::Unlocked => r.locked_by.is_none(),
            Self::AttemptIs(a) => r.attempt == *a,
            Self::StepIndexIs(i) => r.step_index == *i,
            Self::CompleteByIs(t) => r.complete_by == Some(*t),
            Self::CompleteByAtOrBefore(t) => r.complete_by.is_some_and(|c| c <= *t),
            Self::NoticePending => r.notice_pending(),
        }
    }
}
