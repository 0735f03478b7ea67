//! Which way a task's messages go: its **priority** picks the lane (a work queue and an agent
//! queue of its own, each with its own consumers), and its **tenant** (its caller) is the
//! message group by which SQS fair queues share a lane between callers.
//!
//! SQS has no priority within a queue, and a consumer (a Lambda event source mapping) cannot be
//! told to look at one queue only while another is empty. So a priority is a lane: the urgent
//! lane's queues have consumers that the normal lane's backlog cannot take, and an urgent task
//! starts while any backlog of normal ones waits. Within a lane, SQS fair queues (a standard
//! queue whose messages carry a `MessageGroupId`) deliver a quiet tenant's messages before a
//! noisy one's backlog: one caller's burst delays its own tasks, not the others'.

use super::Caller;
use serde::{Deserialize, Serialize};

/// A task's priority: the lane its messages take.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Priority {
    /// The default: the normal lane.
    #[default]
    Normal,
    /// The urgent lane: consumers of its own, so a backlog of normal tasks never delays it.
    Urgent,
}

impl Priority {
    pub const ALL: [Priority; 2] = [Priority::Normal, Priority::Urgent];

    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Normal => "normal",
            Priority::Urgent => "urgent",
        }
    }

    pub fn is_normal(&self) -> bool {
        *self == Priority::Normal
    }
}

impl std::fmt::Display for Priority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A priority that is none of the levels.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is no priority: give `normal` or `urgent`")]
pub struct UnknownPriority(pub String);

impl std::str::FromStr for Priority {
    type Err = UnknownPriority;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "normal" => Ok(Priority::Normal),
            "urgent" => Ok(Priority::Urgent),
            other => Err(UnknownPriority(other.to_owned())),
        }
    }
}

/// How many hex digits of the caller's digest name its tenant: 64 bits, so two callers share a
/// group (and a fair share) with odds of one in 2^64, in 16 bytes on each record and message.
pub const TENANT_DIGITS: usize = 16;

/// The tenant of `caller`'s tasks: the message group of their messages on the fair queues. A
/// digest, not the caller's id: an id may be an ARN of up to 2 KB and a group takes 128
/// characters, and the queues need not learn who the callers are.
pub fn tenant(caller: &Caller) -> String {
    let mut digest = caller.digest();
    digest.truncate(TENANT_DIGITS);
    digest
}

/// The queue of `priority`'s lane: `urgent` for an urgent task if the deployment has an
/// urgent lane (else urgent tasks share the normal lane, still fairly by tenant), `normal`
/// otherwise.
pub fn lane<'a>(priority: Priority, normal: &'a str, urgent: Option<&'a str>) -> &'a str {
    match (priority, urgent) {
        (Priority::Urgent, Some(url)) => url,
        _ => normal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_urgent_task_takes_the_urgent_lane_when_there_is_one() {
        assert_eq!(lane(Priority::Normal, "work", Some("urgent-work")), "work");
        assert_eq!(
            lane(Priority::Urgent, "work", Some("urgent-work")),
            "urgent-work"
        );
        assert_eq!(
            lane(Priority::Urgent, "work", None),
            "work",
            "no urgent lane"
        );
    }

    #[test]
    fn priorities_parse_and_print_as_their_names() {
        for p in Priority::ALL {
            assert_eq!(p.as_str().parse::<Priority>(), Ok(p));
            assert_eq!(serde_json::to_value(p).ok(), Some(p.as_str().into()));
        }
        assert_eq!(
            "high".parse::<Priority>(),
            Err(UnknownPriority("high".into()))
        );
        assert!(Priority::Urgent > Priority::Normal);
    }

    #[test]
    fn a_tenant_is_short_fixed_and_the_callers_own() {
        let a = Caller::new("arn:aws:iam::1:role/a").expect("caller");
        let b = Caller::new("arn:aws:iam::1:role/b").expect("caller");
        assert_eq!(tenant(&a).len(), TENANT_DIGITS);
        assert_eq!(tenant(&a), tenant(&a));
        assert_ne!(tenant(&a), tenant(&b));
        assert!(tenant(&a).chars().all(|c| c.is_ascii_hexdigit()));
    }
}
