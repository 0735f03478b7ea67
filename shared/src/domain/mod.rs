//! The pure domain: no AWS types, no I/O, no clocks (time is always passed in).

pub mod backoff;
pub mod breaker;
pub mod caller;
pub mod condition;
pub mod context;
pub mod fanout;
pub mod gate;
pub mod inbox;
pub mod keys;
pub mod lane;
pub mod limits;
pub mod mapping;
pub mod payload;
pub mod policy;
pub mod problem;
pub mod rate;
pub mod run;
pub mod schedule;
pub mod state;
pub mod status;
pub mod task;
pub mod task_id;
pub mod transition;
pub mod validation;
pub mod when;
pub mod workflow;

pub use backoff::Backoff;
pub use breaker::{BreakerPolicy, BreakerRecord, BreakerState, Decision, Pace, PaceMark};
pub use caller::Caller;
pub use condition::{Condition, Guard, write_label};
pub use lane::Priority;
pub use mapping::{Mapping, MappingError};
pub use payload::PayloadRef;
pub use policy::{Policies, Policy};
pub use problem::DefinitionError;
pub use state::{
    HistoryEntry, Invariant, NoticeKind, Owed, ProcessState, StateRecord, StepState, StepStatus,
};
pub use task::{Task, TaskId, ValidationError};
pub use transition::{Actor, Effect, Rejection, Transition};
pub use workflow::{Document, Format, ServiceDef, Step, Target, Workflow};
