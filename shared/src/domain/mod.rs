//! The pure domain: no AWS types, no I/O, no clocks (time is always passed in).

pub mod backoff;
pub mod breaker;
pub mod order;
pub mod state;
pub mod transition;
pub mod workflow;

pub use backoff::Backoff;
pub use breaker::{BreakerPolicy, BreakerRecord, BreakerState, Decision};
pub use order::{
    CustomerId, LineItem, Order, OrderId, OrderRequest, Quantity, Sku, ValidationError,
};
pub use state::{
    HistoryEntry, Invariant, ProcessState, StateRecord, Status, StepState, StepStatus,
};
pub use transition::{Condition, Effect, Guard, Policy, Rejection, Transition};
pub use workflow::{StepDef, Workflow};
