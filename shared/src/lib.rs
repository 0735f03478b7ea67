//! sas: the Scheduler Agent Supervisor pattern as a set of AWS Lambda functions.
//!
//! The crate is layered from the inside out (see `ARCHITECTURE.md`):
//! - [`domain`]: tasks, workflows (definitions as data), input mappings, the state record and
//!   its pure transitions. No I/O.
//! - [`messages`]: the JSON bodies that travel on the queues.
//! - [`ports`]: the small traits the handlers talk to (state store, queue, event bus, remote
//!   service, clock).
//! - [`memory`] and [`aws`]: the two implementations of the ports.
//! - [`payloads`]: payloads too large for a task's items kept by reference, at the store's
//!   edge ([`payloads::Offloading`]).
//! - [`catalog`]: the published workflows and services, read through the ports and cached.
//! - [`remote`]: each service's remote (simulated, or HTTP) behind its shared breaker.
//! - [`auth`]: who is calling the task API (the authorizer's principal as an `Identity`).
//! - [`handlers`]: the queue-driven functions' logic as plain async functions over the ports.
//! - [`api`]: the HTTP APIs (task and operator API, callbacks, console) over the handlers' helpers.
//!
//! What runs it outside AWS (the local runner, provisioning, test helpers) is the kit, in
//! `infra/local` (`sas_local`). The feature `testkit` (off by default, never enabled by the
//! functions) adds what the kit shares with this crate's own tests: the examples
//! (`domain::workflow::examples`, `catalog::example_files`) and `ports::OffsetClock`.

pub mod api;
pub mod auth;
pub mod aws;
pub mod catalog;
pub mod config;
pub mod domain;
pub mod handlers;
pub mod memory;
pub mod messages;
pub mod metrics;
pub mod payloads;
pub mod ports;
pub mod remote;
pub mod telemetry;
pub mod xray;

pub use domain::*;
