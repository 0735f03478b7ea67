//! `sasctl`: the operator CLI of sas (Scheduler Agent Supervisor).
//!
//! It talks to the sas operator API only (the stack's `OperatorApiUrl`, the HTTP API's
//! `/operator` routes behind IAM, or `cargo run -p sas-local` on
//! `http://127.0.0.1:3000/operator`): it lists tasks
//! by state (and workflow), shows one task's steps and history, asks for a retry, a
//! compensation or a cancellation, and watches a task until it reaches a terminal state
//! (Processed, Error, Compensated, CompensationFailed). It also validates workflow and service
//! definition files offline, publishes them, and reads what is published.
//!
//! # Usage
//!
//! ```text
//! # The endpoint: --endpoint, or SAS_ENDPOINT, or http://127.0.0.1:3000/operator. Requests
//! # to a non-loopback endpoint are signed with SigV4 (--sign auto|always|never), with the
//! # credentials and region of the AWS configuration.
//! export SAS_ENDPOINT=https://abc123.execute-api.eu-west-1.amazonaws.com/operator
//!
//! # Every state, newest first: one page (50) of each; --state for one state.
//! sasctl list
//! sasctl list --state CompensationFailed --limit 20
//! sasctl list --state Error --workflow loan-application
//! sasctl list --state Error --cursor eyJrIjoi...    # the next page, as hinted by `list`
//! sasctl list --state Processing --all              # follow the cursor to the last page
//!
//! # One task: summary (workflow and version, input), steps (">" marks the current one),
//! # history.
//! sasctl show 3f2a8c1e-0d3b-4a57-9d0e-1b2c3d4e5f60
//!
//! # Operator actions; each prints `task <id>: <state>`.
//! sasctl retry 3f2a8c1e-0d3b-4a57-9d0e-1b2c3d4e5f60
//! sasctl compensate 3f2a8c1e-0d3b-4a57-9d0e-1b2c3d4e5f60
//! sasctl cancel 3f2a8c1e-0d3b-4a57-9d0e-1b2c3d4e5f60 --reason "customer asked"
//!
//! # Follow a task until it is terminal (exit 0), or give up after 60 s (exit 4).
//! sasctl watch 3f2a8c1e-0d3b-4a57-9d0e-1b2c3d4e5f60 --interval-ms 250 --timeout-secs 60
//!
//! # Definitions: check a folder offline (no endpoint), then publish it (services first).
//! sasctl workflow validate workflows/
//! sasctl workflow apply workflows/
//! sasctl workflow list
//! sasctl workflow show loan-application                 # YAML, the newest version
//! sasctl --json workflow show loan-application --version 1 > loan-application.v1.json
//! sasctl service list
//!
//! # Check a live service against the service contract (docs/services.md); exit 5 if a check
//! # does not hold. The calls are real: use a test account.
//! sasctl service check --url https://payments.test.example.com/v1 --action charge-payment \
//!     --undo refund-payment --input charge.json
//!
//! # Raw JSON, for scripts.
//! sasctl --json list --all | jq -r '.tasks[].taskId'
//! sasctl --json show 3f2a8c1e-0d3b-4a57-9d0e-1b2c3d4e5f60 | jq '.history'
//!
//! # Retry every task in Error.
//! sasctl --json list --all | jq -r '.tasks[].taskId' | xargs -n1 sasctl retry
//! ```
//!
//! `sasctl list` prints:
//!
//! ```text
//! TASK ID                               WORKFLOW          STATE  STEP            FAILURES  UPDATED               LAST ERROR
//! 3f2a8c1e-0d3b-4a57-9d0e-1b2c3d4e5f60  loan-application  Error  disburse-funds         3  2025-01-02T03:04:05Z  core-banking refused: insufficient funds
//! more: sasctl list --state Error --limit 50 --cursor eyJrIjoi...
//! ```
//!
//! `sasctl workflow validate workflows/` prints one line per file, or one per problem:
//!
//! ```text
//! workflows/ecommerce-order.yaml: ok (workflow ecommerce-order, 3 steps)
//! workflows/loan-application.yaml: at /steps/1/input/creditCheck: ...
//! workflows/services.yaml: ok (6 services)
//! ```
//!
//! # Exit codes
//!
//! | code | meaning |
//! |------|---------|
//! | 0 | success |
//! | 1 | the API answered an error (stderr: `error: <code>: <message>`), an unreadable answer, or a definition file with a problem (`workflow validate`, `workflow apply`) |
//! | 2 | usage error (bad arguments) |
//! | 3 | transport error: the endpoint could not be reached |
//! | 4 | `watch` timed out before the task was terminal |
//! | 5 | `service check`: a check of the service contract does not hold |
//!
//! # As a library
//!
//! [`Client`] is a typed client of the API, [`render_list`] and [`render_task`] are the pure
//! renderers, [`definitions`] checks definition files and plans their publication, and [`run`]
//! drives a whole parsed command line against any writer.

pub mod api;
pub mod bulk;
pub mod cli;
pub mod client;
pub mod console;
pub mod definitions;
pub mod render;
pub mod service_check;
pub mod sign;
pub mod stack;

pub use api::{
    ApiProblem, BreakerView, CatalogEntry, DefinitionView, HistoryEntry, KNOWN_STATES, ListPage,
    ProcessState, Published, ServiceEntry, ServiceList, StepView, TaskSummary, TaskView,
    UnknownState, WorkflowList,
};
pub use cli::{
    ActArgs, BulkArgs, CheckArgs, Cli, Command, CompensateArgs, ConsoleArgs, DEFAULT_ENDPOINT,
    FilesArgs, IdArg, ListArgs, ResolveArgs, RetryArgs, ServiceCommand, SkipArgs, SubmitArgs,
    WatchArgs, WorkflowCommand, WorkflowShowArgs, run, run_with,
};
pub use client::{Action, Client, ClientError, Request, decode};
pub use definitions::{Validation, validate_paths};
pub use render::{
    render_confirmation, render_definition_json, render_definition_yaml, render_list,
    render_services, render_task, render_watch_line, render_workflows,
};

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
    /// `watch` gave up before the task was terminal.
    pub const TIMEOUT: i32 = 4;
    /// `service check`: a check of the service contract does not hold.
    pub const CONTRACT: i32 = 5;
    /// `workflow validate` or `workflow apply`: a definition file has a problem (the same code
    /// as [`API`]: either way the request was not carried out).
    pub const INVALID: i32 = 1;
}
