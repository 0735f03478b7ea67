//! The pure domain: no AWS types, no I/O, no clocks (time is always passed in).

pub mod backoff;
pub mod breaker;
pub mod caller;
pub mod mapping;
pub mod rate;
pub mod state;
pub mod task;
pub mod transition;
pub mod workflow;

pub use backoff::Backoff;
pub use breaker::{BreakerPolicy, BreakerRecord, BreakerState, Decision};
pub use caller::Caller;
pub use mapping::{Mapping, MappingError};
pub use state::{
    HistoryEntry, Invariant, Owed, ProcessState, StateRecord, Status, StepState, StepStatus,
};
pub use task::{Task, TaskId, ValidationError};
pub use transition::{
    Actor, Condition, Effect, Guard, Policies, Policy, Rejection, Transition, write_label,
};
pub use workflow::{DefinitionError, Document, Format, ServiceDef, Step, Target, Workflow};
