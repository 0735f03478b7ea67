//! `sasctl`: the operator CLI of sas (Scheduler Agent Supervisor).
//!
//! It talks to the sas HTTP API only (the submission function behind API Gateway, or
//! `cargo run -p sas-local` on `http://127.0.0.1:3000`): it lists orders by state, shows one
//! order's steps and history, asks for a retry, a compensation or a cancellation, and watches
//! an order until it reaches a terminal state (Processed, Error, Compensated,
//! CompensationFailed).
//!
//! # Usage
//!
//! ```text
//! # The endpoint: --endpoint, or SAS_ENDPOINT, or http://127.0.0.1:3000.
//! export SAS_ENDPOINT=https://abc123.execute-api.eu-west-1.amazonaws.com/prod
//!
//! # Orders that ended in Error (the default state), 50 per page.
//! sasctl list
//! sasctl list --state CompensationFailed --limit 20
//! sasctl list --state Error --cursor eyJrIjoi...    # the next page, as hinted by `list`
//! sasctl list --state Processing --all              # follow the cursor to the last page
//!
//! # One order: summary, steps (">" marks the current one), history.
//! sasctl show 3f2a8c1e-0d3b-4a57-9d0e-1b2c3d4e5f60
//!
//! # Operator actions; each prints `order <id>: <state>`.
//! sasctl retry 3f2a8c1e-0d3b-4a57-9d0e-1b2c3d4e5f60
//! sasctl compensate 3f2a8c1e-0d3b-4a57-9d0e-1b2c3d4e5f60
//! sasctl cancel 3f2a8c1e-0d3b-4a57-9d0e-1b2c3d4e5f60 --reason "customer asked"
//!
//! # Follow an order until it is terminal (exit 0), or give up after 60 s (exit 4).
//! sasctl watch 3f2a8c1e-0d3b-4a57-9d0e-1b2c3d4e5f60 --interval-ms 250 --timeout-secs 60
//!
//! # Raw JSON, for scripts.
//! sasctl --json list --all | jq -r '.orders[].orderId'
//! sasctl --json show 3f2a8c1e-0d3b-4a57-9d0e-1b2c3d4e5f60 | jq '.history'
//!
//! # Retry every order in Error.
//! sasctl --json list --all | jq -r '.orders[].orderId' | xargs -n1 sasctl retry
//! ```
//!
//! `sasctl list` prints:
//!
//! ```text
//! ORDER ID                              STATE  STEP            FAILURES  UPDATED               LAST ERROR
//! 3f2a8c1e-0d3b-4a57-9d0e-1b2c3d4e5f60  Error  charge-payment         2  2025-01-02T03:04:05Z  payment service refused: card declined
//! more: sasctl list --state Error --limit 50 --cursor eyJrIjoi...
//! ```
//!
//! # Exit codes
//!
//! | code | meaning |
//! |------|---------|
//! | 0 | success |
//! | 1 | the API answered an error (stderr: `error: <code>: <message>`), or an unreadable answer |
//! | 2 | usage error (bad arguments) |
//! | 3 | transport error: the endpoint could not be reached |
//! | 4 | `watch` timed out before the order was terminal |
//!
//! # As a library
//!
//! [`Client`] is a typed client of the API, [`render_list`] and [`render_order`] are the pure
//! renderers, and [`run`] drives a whole parsed command line against any writer.

pub mod api;
pub mod cli;
pub mod client;
pub mod render;

pub use api::{
    HistoryEntry, Item, KNOWN_STATES, ListPage, OrderSummary, OrderView, ProcessState, StepView,
    UnknownState,
};
pub use cli::{
    CancelArgs, Cli, Command, DEFAULT_ENDPOINT, IdArg, ListArgs, WatchArgs, run, run_with,
};
pub use client::{Client, ClientError, Request, decode};
pub use render::{render_confirmation, render_list, render_order, render_watch_line};

/// The exit codes of `sasctl`.
pub mod exit {
    /// Success.
    pub const OK: i32 = 0;
    /// The API answered an error, or an answer that could not be read.
    pub const API: i32 = 1;
    /// Bad arguments (clap's own exit code for usage errors).
    pub const USAGE: i32 = 2;
    /// The endpoint could not be reached.
    pub const TRANSPORT: i32 = 3;
    /// `watch` gave up before the order was terminal.
    pub const TIMEOUT: i32 = 4;
}
