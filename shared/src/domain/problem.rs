//! The problems found in a definition or in a task's input, each at the JSON pointer of its
//! place.

use serde::Serialize;
use std::fmt;

/// One problem in a definition, at a JSON pointer (`/steps/2/service`; empty: the document).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    pub at: String,
    pub message: String,
}

impl Problem {
    /// Writes a problem as its display shows it: `at /steps/2: message`, or the message alone
    /// at the document. Clients that decode problems (`sasctl`) show theirs the same way.
    pub fn write(f: &mut fmt::Formatter<'_>, at: &str, message: &str) -> fmt::Result {
        if at.is_empty() {
            f.write_str(message)
        } else {
            write!(f, "at {at}: {message}")
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        Self::write(f, &self.at, &self.message)
    }
}

/// Every problem found in a definition.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct DefinitionError(pub Vec<Problem>);

impl DefinitionError {
    /// One problem at `at`.
    pub fn one(at: impl Into<String>, message: impl Into<String>) -> Self {
        Self(vec![Problem {
            at: at.into(),
            message: message.into(),
        }])
    }
}

impl fmt::Display for DefinitionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lines: Vec<String> = self.0.iter().map(ToString::to_string).collect();
        f.write_str(&lines.join("; "))
    }
}

/// A task input that does not match the workflow's input schema: each problem at its JSON
/// pointer in the input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
pub struct InputError(pub Vec<Problem>);
