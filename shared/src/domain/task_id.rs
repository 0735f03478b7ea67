//! The id of a task.

use super::validation::ValidationError;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;
use uuid::Uuid;

/// The id of a task: a UUID, chosen by the submission function.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct TaskId(Uuid);

impl TaskId {
    pub fn new_random() -> Self {
        Self(Uuid::new_v4())
    }
    /// The id derived from `name` (a UUID v5 in sas's own namespace): the same name, the same
    /// id. A sub-workflow step's child is named by the step's idempotency key.
    pub fn derived(name: &str) -> Self {
        const NAMESPACE: Uuid = Uuid::from_u128(0x5a5c_4c1d_9e0f_4b7a_8d2e_6f1a_3b9c_0d42);
        Self(Uuid::new_v5(&NAMESPACE, name.as_bytes()))
    }
    pub fn as_uuid(&self) -> Uuid {
        self.0
    }
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for TaskId {
    type Err = ValidationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Uuid::parse_str(s)
            .map(Self)
            .map_err(|_| ValidationError::new("taskId", "must be a UUID"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_id_parses_only_uuids() {
        assert!("not-a-uuid".parse::<TaskId>().is_err());
        let id = TaskId::new_random();
        assert_eq!(id.to_string().parse::<TaskId>().ok(), Some(id));
    }
}
