//! sas: the Scheduler Agent Supervisor pattern as a set of AWS Lambda functions.
//!
//! The crate is layered from the inside out (see `ARCHITECTURE.md`):
//! - [`domain`]: orders, the workflow, the state record and its pure transitions. No I/O.
//! - [`messages`]: the JSON bodies that travel on the queues.
//! - [`ports`]: the small traits the handlers talk to (state store, queue, event bus, remote
//!   service, clock).
//! - [`memory`] and [`aws`]: the two implementations of the ports.
//! - [`remote`]: the simulated remote service and the HTTP client for a real one.
//! - [`handlers`]: the four functions' logic as plain async functions over the ports.
//! - [`local`]: wiring that hosts the four handlers in one process (local runner and tests).

pub mod aws;
pub mod config;
pub mod domain;
pub mod handlers;
pub mod local;
pub mod memory;
pub mod messages;
pub mod ports;
pub mod remote;
pub mod telemetry;

pub use domain::*;
