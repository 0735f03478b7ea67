//! The command line: arguments ([`Cli`]) and the commands themselves ([`run`]).

use crate::api::{ListPage, ProcessState, Published, ServiceList, TaskView, WorkflowList};
use crate::client::{Action, Client, ClientError, Request, decode, describe};
use crate::definitions::{problem_line, validate_paths};
use crate::exit;
use crate::render::{
    clean, render_confirmation, render_definition_json, render_definition_yaml, render_list,
    render_services, render_task, render_watch_line, render_workflows,
};
use crate::service_check::{Plan, run_checks};
use clap::{Args, Parser, Subcommand};
use serde_json::Value;
use std::collections::HashSet;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use url::Url;

/// The endpoint used when neither `--endpoint` nor `SAS_ENDPOINT` is given.
pub const DEFAULT_ENDPOINT: &str = "http://127.0.0.1:3000/operator";

const LONG_ABOUT: &str = "\
Operator CLI for sas: list tasks by state and workflow, show a task's steps and history, \
retry, compensate or cancel a task, and watch a task until it reaches a terminal state; \
validate workflow and service definition files offline, publish them, and read what is \
published.

It talks to the sas operator API only: the stack's `OperatorApiUrl` output (the HTTP API's \
/operator routes, behind IAM), or `cargo run -p sas-local` (http://127.0.0.1:3000/operator). \
`workflow validate` needs no endpoint.

Exit codes:
  0  success
  1  the API answered an error (printed to stderr as `error: <code>: <message>`),
     an answer sasctl could not read, or (workflow validate, workflow apply)
     a definition file with a problem
  2  usage error (bad arguments)
  3  transport error: the endpoint could not be reached
  4  watch: the timeout passed before the task reached a terminal state
  5  service check: a check of the service contract does not hold";

/// sasctl: operate sas tasks and publish workflows over the HTTP API.
#[derive(Debug, Clone, Parser)]
#[command(name = "sasctl", version, about, long_about = LONG_ABOUT)]
pub struct Cli {
    /// Base URL of the sas HTTP API.
    #[arg(
        long,
        global = true,
        env = "SAS_ENDPOINT",
        default_value = DEFAULT_ENDPOINT,
        value_parser = parse_endpoint,
    )]
    pub endpoint: Url,

    /// The deployed stack to talk to: its `OperatorApiUrl` output (read with CloudFormation's
    /// DescribeStacks, credentials and region from the AWS configuration) instead of
    /// --endpoint.
    #[arg(long, global = true, env = "SAS_STACK", value_name = "NAME", value_parser = parse_non_empty)]
    pub stack: Option<String>,

    /// Print JSON instead of tables: the API's answer (pretty), or for `workflow show` the
    /// definition itself.
    #[arg(long, global = true)]
    pub json: bool,

    /// Sign requests with SigV4 (`execute-api`, credentials and region from the AWS
    /// configuration: environment, profile, SSO): `auto` signs unless the endpoint is loopback
    /// (a deployed stack's operator API needs it; `sas-local` only with `--users`).
    #[arg(long, global = true, env = "SAS_SIGN", default_value = "auto")]
    pub sign: Sign,

    #[command(subcommand)]
    pub command: Command,
}

/// When `sasctl` signs its requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Sign {
    /// Unless the endpoint is loopback.
    Auto,
    Always,
    Never,
}

/// The subcommands.
#[derive(Debug, Clone, PartialEq, Eq, Subcommand)]
pub enum Command {
    /// List the tasks in one state (of one workflow, or of all).
    List(ListArgs),
    /// Show one task: a summary, its steps, then its history (a distributed forEach's run: a
    /// page of its elements too).
    Show(ShowArgs),
    /// Process a task again from its failed step (or try its failed undo again).
    ///
    /// With --input, the task's input is replaced (checked against its workflow's schema) and
    /// the failed step runs on it under a new key: only for a step that surely did not take
    /// effect (refused, or never sent).
    Retry(RetryArgs),
    /// Undo a task's completed steps.
    ///
    /// With --from STEP, compensation starts at that step: STEP itself is undone, then the
    /// steps before it, last first; the steps after it that may have taken effect are recorded
    /// as settled by hand (nothing is sent for them).
    Compensate(CompensateArgs),
    /// Cancel a task.
    Cancel(ActArgs),
    /// End the waits for a time a task is in now (its wait step, or its branches'): each is
    /// done as at its time, and the task goes on.
    ///
    /// A wait for a named event is not ended this way (409): deliver the event instead, with
    /// `POST /operator/tasks/{id}/events/{name}` (or the caller's `POST /tasks/{id}/events/{name}`).
    Wake(ActArgs),
    /// Stop the branches still out of a parallel group a branch's failure stopped (its alert
    /// went out then): each step still out is given up (it may have taken effect, so it is
    /// undone, after its deadline if its request may still be in flight), and the task is
    /// compensated (or stops in Error) at once instead of when they end.
    StopBranches(ActArgs),
    /// Close a failed task (Error or CompensationFailed) by hand: it becomes Resolved, for
    /// good, with the note recorded in its history (who and why).
    ///
    /// Nothing is sent to any service: use it once the task's effects were settled outside sas
    /// (refunded by hand, reconciled with the service's owner).
    Resolve(ResolveArgs),
    /// Mark an Error task's failed step as done by hand, with its result, and go on from the
    /// next step (the last step skipped: Processed). Nothing is sent for the skipped step.
    Skip(SkipArgs),
    /// Follow a task until it is terminal, printing each change.
    ///
    /// Polls the task and prints a line whenever its state, step or failure count changes;
    /// exits 0 once it is terminal (Processed, Error, Compensated, CompensationFailed, Refused,
    /// Resolved), 4 if
    /// the timeout passes first.
    Watch(WatchArgs),
    /// One action on every task of a state (of a workflow, updated in a time range).
    ///
    /// A dry run unless --yes is given: it counts the tasks and lists them. With --yes each
    /// task gets the action (its own conditional write, recorded with who and why); a task
    /// that moved on meanwhile is counted as a conflict and left alone. Exits 1 if any action
    /// failed for another reason.
    Bulk(BulkArgs),
    /// Start a task of a workflow with an input (a JSON file, or - for stdin).
    ///
    /// Prints the task's id (the API's answer under --json). With --idempotency-key, sending
    /// the same command again returns the same task instead of starting a second one.
    Submit(SubmitArgs),
    /// Serve the operator console on a loopback address, signing what it forwards.
    ///
    /// A small proxy: the browser talks to it, it forwards the console's pages to the operator
    /// API (`--endpoint`) signed with SigV4 (as --sign says), so no credentials reach the
    /// browser. Runs until interrupted.
    Console(ConsoleArgs),
    /// Workflow definitions: validate files, apply (publish) them, list and show what is
    /// published.
    #[command(subcommand)]
    Workflow(WorkflowCommand),
    /// Services: list them with their breakers, pause and resume one, check a live one
    /// against the service contract.
    #[command(subcommand)]
    Service(ServiceCommand),
    /// Schedules (tasks of a workflow started on a cron or rate expression): list, apply,
    /// pause, resume and delete them.
    #[command(subcommand)]
    Schedule(ScheduleCommand),
}

/// `schedule` subcommands.
#[derive(Debug, Clone, PartialEq, Eq, Subcommand)]
pub enum ScheduleCommand {
    /// List the schedules: workflow, expression, time zone, overlap and next run.
    List,
    /// Publish the schedules of files (`schedules: [...]`; YAML or JSON): each a new version
    /// if it changed, and its EventBridge Scheduler schedule set to match.
    Apply(FilesArgs),
    /// Pause a schedule: no run starts a task until it is resumed.
    Pause(NameArg),
    /// Resume a paused schedule.
    Resume(NameArg),
    /// Delete a schedule: no run starts a task any more.
    Delete(NameArg),
}

/// A definition's name.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct NameArg {
    #[arg(value_parser = parse_name)]
    pub name: String,
}

/// `workflow` subcommands.
#[derive(Debug, Clone, PartialEq, Eq, Subcommand)]
pub enum WorkflowCommand {
    /// Check definition files offline (no endpoint needed).
    ///
    /// Parses every .yaml, .yml and .json file given (a folder: the definition files in it;
    /// schema.json is skipped) and checks it as the API would: the schema, step names, input
    /// mappings (which may refer only to earlier steps), durations, the pivot. A workflow may
    /// name only services declared in the same set of files. Prints `FILE: at POINTER:
    /// message` for each problem and `FILE: ok (...)` for each good file; exits 1 if any file
    /// has a problem.
    Validate(FilesArgs),
    /// Validate definition files, then publish them (services first).
    ///
    /// Sends every service (`PUT /services/{name}`), then every workflow
    /// (`PUT /workflows/{name}`); nothing is sent if any file has a problem. Prints `published <kind> NAME vN` for a new
    /// version, `unchanged <kind> NAME vN` when the newest version is already the same.
    Apply(FilesArgs),
    /// List the published workflows and their newest versions.
    List,
    /// Print a published workflow's definition: YAML, or JSON with --json.
    Show(WorkflowShowArgs),
}

/// `service` subcommands.
#[derive(Debug, Clone, PartialEq, Eq, Subcommand)]
pub enum ServiceCommand {
    /// List the published services, their newest versions and their circuit breakers.
    List,
    /// Pause a service: no call goes out to it and its tasks' steps wait (nothing fails) until
    /// it is resumed.
    Pause(ServiceActionArgs),
    /// Resume a paused service: the steps waiting for it (on the main line, in a parallel
    /// branch, as forEach elements) go out again at once, and the tasks woken are counted (up
    /// to 1,000 tasks read; any others look again within a minute).
    Resume(ServiceActionArgs),
    /// Check a live service against the service contract (docs/services.md); no sas endpoint
    /// needed.
    ///
    /// Calls the service directly, with fresh idempotency keys, and prints per check "holds",
    /// "does not hold" or "could not tell" with the evidence (each call's key and answer):
    /// a repeated key returns the first outcome; an undo after its step succeeds; an undo of
    /// an unknown key succeeds; an undo before its step leaves a tombstone (the step is then
    /// refused); a call given up on and then undone leaves its key refused or reversed; every
    /// answer is in a documented class. The calls are real: use a test account. Exits 5 if a
    /// check does not hold.
    Check(Box<CheckArgs>),
}

/// `service pause` and `service resume` arguments.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct ServiceActionArgs {
    /// The service's name.
    #[arg(value_parser = parse_name)]
    pub name: String,
    /// Why (required to pause; kept with the pause and shown with the service).
    #[arg(long, value_parser = parse_non_empty)]
    pub reason: Option<String>,
}

/// `service check` arguments.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct CheckArgs {
    /// The service's base URL (an HTTP target's `baseUrl`): calls go to `POST {url}/{action}`.
    #[arg(long, value_parser = parse_endpoint, required_unless_present = "function", conflicts_with = "function")]
    pub url: Option<Url>,
    /// A Lambda target: the function's name or ARN.
    #[arg(long, value_parser = parse_non_empty)]
    pub function: Option<String>,
    /// The step's action.
    #[arg(long, value_parser = parse_non_empty)]
    pub action: String,
    /// The undo's action.
    #[arg(long, value_parser = parse_non_empty)]
    pub undo: String,
    /// With --function: an `errorType` of the function's errors that is a business refusal
    /// (repeatable), as the service's declaration lists them.
    #[arg(long, value_name = "ERROR_TYPE", conflicts_with = "url")]
    pub refusal: Vec<String>,
    /// A JSON file with the body of the step and of the undo (default `{}`).
    #[arg(long, value_name = "FILE")]
    pub input: Option<PathBuf>,
    /// How long an ordinary call may take, in milliseconds.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub timeout_ms: u64,
    /// How long the "given up" call waits, in milliseconds.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub give_up_ms: u64,
    /// How long to wait after undoing the given-up call before asking for its key again.
    #[arg(long, default_value_t = 2_000)]
    pub settle_ms: u64,
}

/// `list` arguments.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct ListArgs {
    /// The state to list (default: every state, one page of each, newest first; with --key,
    /// the tasks found in any state).
    #[arg(long, value_enum, ignore_case = true)]
    pub state: Option<ProcessState>,
    /// Only the tasks found by this search key, `name:value` (a key their workflow declares,
    /// as in `customerId:c-77`), newest first by creation.
    #[arg(long, value_name = "NAME:VALUE", value_parser = parse_search_key)]
    pub key: Option<String>,
    /// With --key: only the tasks created at or after this time (RFC 3339).
    #[arg(long, value_name = "TIME", value_parser = parse_time, requires = "key")]
    pub from: Option<String>,
    /// With --key: only the tasks created before this time (RFC 3339).
    #[arg(long, value_name = "TIME", value_parser = parse_time, requires = "key")]
    pub to: Option<String>,
    /// Only the tasks of this workflow.
    #[arg(long, value_name = "NAME", value_parser = parse_non_empty)]
    pub workflow: Option<String>,
    /// Tasks per page (1 to 100).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub limit: u32,
    /// Start at this page (the `nextCursor` of a previous page).
    #[arg(long, value_parser = parse_non_empty)]
    pub cursor: Option<String>,
    /// Follow the cursor to the last page and print every task.
    #[arg(long)]
    pub all: bool,
}

/// `show` arguments.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct ShowArgs {
    /// The task id.
    #[arg(value_parser = parse_id)]
    pub id: String,
    /// A distributed forEach's run: list its elements from this index (100 at a time).
    #[arg(long, value_name = "INDEX")]
    pub elements_from: Option<u32>,
}

/// A task id argument.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct IdArg {
    /// The task id.
    #[arg(value_parser = parse_id)]
    pub id: String,
}

/// `retry`, `compensate` and `cancel` arguments.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct ActArgs {
    /// The task id.
    #[arg(value_parser = parse_id)]
    pub id: String,
    /// Why (recorded in the task's history with who asked).
    #[arg(long, value_parser = parse_non_empty)]
    pub reason: Option<String>,
}

/// `bulk` arguments.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct BulkArgs {
    /// The action: retry, compensate, cancel or resolve.
    #[arg(value_parser = ["retry", "compensate", "cancel", "resolve"])]
    pub action: String,
    /// The state of the tasks to act on.
    #[arg(long, value_enum, ignore_case = true)]
    pub state: ProcessState,
    /// Only the tasks of this workflow.
    #[arg(long, value_name = "NAME", value_parser = parse_non_empty)]
    pub workflow: Option<String>,
    /// Only tasks updated at or after this time (RFC 3339, or a duration ago: 2h).
    #[arg(long, value_parser = crate::bulk::parse_instant)]
    pub since: Option<chrono::DateTime<chrono::Utc>>,
    /// Only tasks updated before this time (RFC 3339, or a duration ago).
    #[arg(long, value_parser = crate::bulk::parse_instant)]
    pub until: Option<chrono::DateTime<chrono::Utc>>,
    /// Why (recorded in each task's history; required to resolve).
    #[arg(long, value_parser = parse_non_empty)]
    pub reason: Option<String>,
    /// Apply the action (without it, a dry run that only counts).
    #[arg(long)]
    pub yes: bool,
    /// Actions in flight at once.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub concurrency: u32,
}

/// `submit` arguments.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct SubmitArgs {
    /// The workflow's name.
    #[arg(value_parser = parse_name)]
    pub workflow: String,
    /// The task's input: JSON, @FILE, or - (stdin).
    #[arg(long, value_name = "JSON|@FILE|-", value_parser = parse_json_arg)]
    pub input: Value,
    /// An idempotency key: the same key gives the same task.
    #[arg(long, value_parser = parse_non_empty)]
    pub idempotency_key: Option<String>,
    /// Submit it in the urgent lane (`Priority: urgent`): a backlog of normal tasks never
    /// delays it.
    #[arg(long)]
    pub urgent: bool,
}

/// `console` arguments.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct ConsoleArgs {
    /// The loopback address to serve on (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:8321")]
    pub listen: std::net::SocketAddr,
}

/// `retry` arguments.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct RetryArgs {
    /// The task id.
    #[arg(value_parser = parse_id)]
    pub id: String,
    /// Why (recorded in the task's history with who asked).
    #[arg(long, value_parser = parse_non_empty)]
    pub reason: Option<String>,
    /// The task's new input: JSON, @FILE, or - (stdin).
    #[arg(long, value_name = "JSON|@FILE|-", value_parser = parse_json_arg)]
    pub input: Option<Value>,
}

/// `compensate` arguments.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct CompensateArgs {
    /// The task id.
    #[arg(value_parser = parse_id)]
    pub id: String,
    /// Why (recorded in the task's history with who asked).
    #[arg(long, value_parser = parse_non_empty)]
    pub reason: Option<String>,
    /// Start compensation at this step: it is undone too, then the ones before it; the later
    /// ones are settled by hand.
    #[arg(long, value_name = "STEP", value_parser = parse_non_empty)]
    pub from: Option<String>,
}

/// `skip` arguments.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct SkipArgs {
    /// The task id.
    #[arg(value_parser = parse_id)]
    pub id: String,
    /// How the step was done (required; recorded in the history).
    #[arg(long, value_parser = parse_non_empty)]
    pub reason: String,
    /// The step's result: JSON, @FILE, or - (stdin): what later steps and the step's undo
    /// read.
    #[arg(long, value_name = "JSON|@FILE|-", value_parser = parse_json_arg)]
    pub result: Option<Value>,
}

/// Every flag that takes JSON takes it one way: inline, `@FILE`, or `-` for stdin.
pub fn parse_json_arg(s: &str) -> Result<Value, String> {
    let (text, from) = if s == "-" {
        let mut text = String::new();
        io::Read::read_to_string(&mut io::stdin(), &mut text)
            .map_err(|e| format!("reading stdin: {e}"))?;
        (text, "stdin")
    } else if let Some(path) = s.strip_prefix('@') {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
        (text, path)
    } else {
        return serde_json::from_str(s).map_err(|e| {
            let hint = if Path::new(s).is_file() {
                format!(" (to read the file, give @{s})")
            } else {
                String::new()
            };
            format!("not JSON: {e}; give JSON, @FILE or - (stdin){hint}")
        });
    };
    serde_json::from_str(&text).map_err(|e| format!("{from}: not JSON: {e}"))
}

/// `resolve` arguments.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct ResolveArgs {
    /// The task id.
    #[arg(value_parser = parse_id)]
    pub id: String,
    /// How the task was settled (required; recorded in its history). `--note` is its old
    /// name.
    #[arg(long, alias = "note", value_parser = parse_non_empty)]
    pub reason: String,
}

/// `watch` arguments.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct WatchArgs {
    /// The task id.
    #[arg(value_parser = parse_id)]
    pub id: String,
    /// Time between polls, in milliseconds.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(10..))]
    pub interval_ms: u64,
    /// Give up (exit 4) if the task is not terminal after this many seconds.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..))]
    pub timeout_secs: u64,
    /// Stop watching (exit 0) once this step waits: for its time, its event or its callback
    /// (then `wake` it, or deliver the event).
    #[arg(long, value_name = "STEP")]
    pub until_waiting: Option<String>,
}

/// `workflow validate` and `workflow apply` arguments.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct FilesArgs {
    /// Definition files, or folders of them.
    #[arg(required = true, value_name = "FILE|DIR")]
    pub paths: Vec<PathBuf>,
}

/// `workflow show` arguments.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct WorkflowShowArgs {
    /// The workflow's name.
    #[arg(value_parser = parse_name)]
    pub name: String,
    /// This version instead of the newest.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub version: Option<u32>,
}

/// A search key as `list --key` takes it: `name:value`, checked as the API checks it.
fn parse_search_key(s: &str) -> Result<String, String> {
    sas::domain::keys::SearchKey::parse(s, "--key")
        .map(|k| k.to_string())
        .map_err(|e| e.problem)
}

/// An RFC 3339 time, passed on as written.
fn parse_time(s: &str) -> Result<String, String> {
    chrono::DateTime::parse_from_rfc3339(s)
        .map(|_| s.to_owned())
        .map_err(|e| format!("not an RFC 3339 time ({e}), as in 2026-11-30T12:00:00Z"))
}

fn parse_endpoint(s: &str) -> Result<Url, String> {
    let url = Url::parse(s).map_err(|e| format!("not a URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
        return Err("must be an http:// or https:// URL with a host".into());
    }
    Ok(url)
}

/// A path segment: not empty, `.` or `..` (which would change the route).
fn segment(s: &str, what: &str) -> Result<String, String> {
    let s = s.trim();
    if s.is_empty() || s == "." || s == ".." {
        return Err(format!("must be {what}"));
    }
    Ok(s.to_owned())
}

fn parse_id(s: &str) -> Result<String, String> {
    segment(s, "a task id")
}

fn parse_name(s: &str) -> Result<String, String> {
    segment(s, "a workflow name")
}

fn parse_non_empty(s: &str) -> Result<String, String> {
    if s.trim().is_empty() {
        return Err("must not be empty".into());
    }
    Ok(s.to_owned())
}

/// Why a command stopped early: an API/transport error (turned into an exit code) or a failed
/// write to the output (returned to the caller).
enum Failure {
    Client(ClientError),
    Io(io::Error),
}

impl From<ClientError> for Failure {
    fn from(e: ClientError) -> Self {
        Self::Client(e)
    }
}

impl From<io::Error> for Failure {
    fn from(e: io::Error) -> Self {
        Self::Io(e)
    }
}

/// Runs a parsed command line, writing results to `out` and errors to the process's stderr.
/// Returns the exit code (see the `--help` text); `Err` only if writing to `out` failed.
pub async fn run(cli: Cli, out: &mut (dyn Write + Send)) -> io::Result<i32> {
    run_with(cli, out, &mut io::stderr()).await
}

/// [`run`], with errors written to `err` instead of stderr.
pub async fn run_with(
    cli: Cli,
    out: &mut (dyn Write + Send),
    err: &mut (dyn Write + Send),
) -> io::Result<i32> {
    let json = cli.json;
    let mut cli = cli;
    let offline = matches!(
        &cli.command,
        Command::Workflow(WorkflowCommand::Validate(_))
            | Command::Service(ServiceCommand::Check(_))
    );
    if let (Some(stack), false) = (cli.stack.clone(), offline) {
        match crate::stack::operator_endpoint(&stack).await {
            Ok(url) => cli.endpoint = url,
            Err(e) => {
                let e = ClientError::Stack(e.to_string());
                if json {
                    print_json(out, &e.to_json())?;
                } else {
                    let _ = writeln!(err, "error: {e}");
                }
                return Ok(e.exit_code());
            }
        }
    }
    let cli = cli;
    let result = if let Command::Workflow(WorkflowCommand::Validate(args)) = &cli.command {
        // Offline: no client, no endpoint.
        validate(cli.json, args, out)
    } else if let Command::Service(ServiceCommand::Check(args)) = &cli.command {
        // The service itself, not the sas API.
        service_check(cli.json, args, out, err).await
    } else if let Command::Console(args) = &cli.command {
        console(&cli, args, out).await
    } else {
        match client(&cli).await {
            Ok(client) => dispatch(&client, &cli, out, err).await,
            Err(e) => Err(e.into()),
        }
    };
    match result {
        Ok(code) => {
            out.flush()?;
            Ok(code)
        }
        Err(Failure::Client(e)) if json => {
            // Under --json stdout is always one JSON document: the answer, or the error.
            print_json(out, &e.to_json())?;
            out.flush()?;
            Ok(e.exit_code())
        }
        Err(Failure::Client(e)) => {
            out.flush()?;
            // Best effort: a failing stderr must not hide the exit code.
            let _ = writeln!(err, "error: {e}");
            Ok(e.exit_code())
        }
        Err(Failure::Io(e)) => Err(e),
    }
}

/// The API client `cli` asks for, signing as `--sign` says.
async fn client(cli: &Cli) -> Result<Client, ClientError> {
    let client = Client::new(cli.endpoint.clone())?;
    Ok(match signer(cli).await? {
        Some(signer) => client.signed(signer),
        None => client,
    })
}

/// The signer `--sign` asks for (`None`: requests go unsigned).
async fn signer(cli: &Cli) -> Result<Option<crate::sign::Signer>, ClientError> {
    let loopback = cli.endpoint.host().is_some_and(|h| match h {
        url::Host::Domain(d) => d == "localhost",
        url::Host::Ipv4(a) => a.is_loopback(),
        url::Host::Ipv6(a) => a.is_loopback(),
    });
    // On a loopback endpoint (`sas-local`), `auto` signs when the environment names
    // credentials, as the AWS CLI would find them: `sas-local --users` then knows the caller.
    let named = ["AWS_ACCESS_KEY_ID", "AWS_PROFILE"]
        .iter()
        .any(|v| std::env::var_os(v).is_some_and(|x| !x.is_empty()));
    let sign = match cli.sign {
        Sign::Always => true,
        Sign::Never => false,
        Sign::Auto => !loopback || named,
    };
    if !sign {
        return Ok(None);
    }
    match crate::sign::Signer::from_environment(&cli.endpoint).await {
        Ok(signer) => Ok(Some(signer)),
        // `sas-local` takes any region: a loopback endpoint needs none configured.
        Err(_) if loopback => crate::sign::Signer::from_environment_in(&cli.endpoint, "us-east-1")
            .await
            .map(Some)
            .map_err(|e| ClientError::Signing(e.to_string())),
        Err(e) => Err(ClientError::Signing(e.to_string())),
    }
}

/// `bulk`: counts (a dry run) or acts on every task the selection holds.
async fn bulk(
    client: &Client,
    json: bool,
    args: &BulkArgs,
    out: &mut (dyn Write + Send),
    err: &mut (dyn Write + Send),
) -> Result<i32, Failure> {
    let action = match args.action.as_str() {
        "retry" => Action::Retry,
        "compensate" => Action::Compensate,
        "cancel" => Action::Cancel,
        _ => Action::Resolve,
    };
    if action == Action::Resolve && args.reason.is_none() {
        let _ = writeln!(
            err,
            "error: bulk resolve needs --reason (how the tasks were settled)"
        );
        return Ok(exit::USAGE);
    }
    let selection = crate::bulk::Selection {
        state: args.state.clone(),
        workflow: args.workflow.clone(),
        since: args.since,
        until: args.until,
    };
    let tasks = crate::bulk::select(client, &selection).await?;
    let what = format!(
        "{} {} task(s){}",
        tasks.len(),
        args.state,
        args.workflow
            .as_deref()
            .map(|w| format!(" of {w}"))
            .unwrap_or_default()
    );
    if !args.yes {
        if json {
            let ids: Vec<&str> = tasks.iter().map(|t| t.task_id.as_str()).collect();
            print_json(
                out,
                &serde_json::json!({"dryRun": true, "action": args.action, "count": tasks.len(), "taskIds": ids}),
            )?;
        } else {
            writeln!(out, "dry run: {} would be sent {}", what, args.action)?;
            for t in tasks.iter().take(20) {
                writeln!(out, "  {}", t.task_id)?;
            }
            if tasks.len() > 20 {
                writeln!(out, "  ... and {} more", tasks.len() - 20)?;
            }
            writeln!(out, "add --yes to apply")?;
        }
        return Ok(exit::OK);
    }
    let tally = crate::bulk::apply(
        client,
        &tasks,
        action,
        args.reason.as_deref(),
        args.concurrency as usize,
    )
    .await;
    if json {
        print_json(
            out,
            &serde_json::json!({"action": args.action, "tally": tally}),
        )?;
    } else {
        writeln!(
            out,
            "{}: {} applied, {} moved on meanwhile (conflict), {} failed",
            args.action,
            tally.applied.len(),
            tally.conflicts.len(),
            tally.failed.len()
        )?;
        for (id, e) in &tally.failed {
            writeln!(out, "  {id}: {e}")?;
        }
    }
    Ok(if tally.failed.is_empty() {
        exit::OK
    } else {
        exit::API
    })
}

/// `console`: serves the signing proxy until interrupted.
async fn console(
    cli: &Cli,
    args: &ConsoleArgs,
    out: &mut (dyn Write + Send),
) -> Result<i32, Failure> {
    let signer = signer(cli).await?;
    let signing = signer
        .as_ref()
        .map(|s| format!("signing for {}", s.region()))
        .unwrap_or_else(|| "not signing".to_owned());
    let (bound, serving) = crate::console::bind(&cli.endpoint, signer, args.listen)
        .await
        .map_err(|e| ClientError::Listen(e.to_string()))?;
    writeln!(
        out,
        "console: http://{bound}{} (the operator API at {}, {signing}; Ctrl-C stops it)",
        crate::console::CONSOLE_PATH,
        cli.endpoint
    )?;
    out.flush()?;
    tokio::select! {
        served = serving => served?,
        _ = tokio::signal::ctrl_c() => {}
    }
    Ok(exit::OK)
}

async fn dispatch(
    client: &Client,
    cli: &Cli,
    out: &mut (dyn Write + Send),
    err: &mut (dyn Write + Send),
) -> Result<i32, Failure> {
    match &cli.command {
        Command::List(args) => list(client, cli, args, out).await,
        Command::Show(ShowArgs { id, elements_from }) => {
            let request = Request::Show {
                id,
                elements_from: *elements_from,
            };
            let (view, raw): (TaskView, Value) = fetch(client, &request).await?;
            print_answer(out, cli.json, &raw, || render_task(&view))?;
            Ok(exit::OK)
        }
        Command::Retry(RetryArgs {
            id,
            reason,
            input: Some(input),
        }) => {
            let body = serde_json::json!({"reason": reason, "input": input});
            act_with(client, cli.json, id, "retry-with-input", &body, out).await
        }
        Command::Compensate(CompensateArgs {
            id,
            reason,
            from: Some(from),
        }) => {
            let body = serde_json::json!({"reason": reason, "fromStep": from});
            act_with(client, cli.json, id, "compensate-from", &body, out).await
        }
        Command::Retry(RetryArgs { id, reason, .. })
        | Command::Compensate(CompensateArgs { id, reason, .. })
        | Command::Cancel(ActArgs { id, reason })
        | Command::Wake(ActArgs { id, reason })
        | Command::StopBranches(ActArgs { id, reason }) => {
            let action = match &cli.command {
                Command::Retry(_) => Action::Retry,
                Command::Compensate(_) => Action::Compensate,
                Command::Wake(_) => Action::Wake,
                Command::StopBranches(_) => Action::StopBranches,
                _ => Action::Cancel,
            };
            let request = Request::Act {
                id,
                action,
                reason: reason.as_deref(),
            };
            act(client, cli.json, &request, out).await
        }
        Command::Skip(SkipArgs { id, reason, result }) => {
            let request = Request::Skip {
                id,
                reason,
                result: result.as_ref(),
            };
            act(client, cli.json, &request, out).await
        }
        Command::Resolve(ResolveArgs { id, reason }) => {
            let request = Request::Act {
                id,
                action: Action::Resolve,
                reason: Some(reason),
            };
            act(client, cli.json, &request, out).await
        }
        Command::Watch(args) => watch(client, cli.json, args, out, err).await,
        Command::Submit(args) => {
            let input = &args.input;
            let request = Request::Submit {
                workflow: &args.workflow,
                input,
                idempotency_key: args.idempotency_key.as_deref(),
                urgent: args.urgent,
            };
            let raw = client.send(&request).await?;
            if cli.json {
                print_json(out, &raw)?;
            } else {
                writeln!(
                    out,
                    "{} ({} v{}, {})",
                    raw["taskId"].as_str().unwrap_or("?"),
                    args.workflow,
                    raw["workflowVersion"],
                    raw["processState"].as_str().unwrap_or("Pending")
                )?;
            }
            Ok(exit::OK)
        }
        Command::Console(_) => Ok(exit::USAGE),
        Command::Bulk(args) => bulk(client, cli.json, args, out, err).await,
        Command::Workflow(WorkflowCommand::Validate(args)) => validate(cli.json, args, out),
        Command::Workflow(WorkflowCommand::Apply(args)) => {
            apply(client, cli.json, args, out, err).await
        }
        Command::Workflow(WorkflowCommand::List) => {
            let (list, raw): (WorkflowList, Value) = fetch(client, &Request::Workflows).await?;
            print_answer(out, cli.json, &raw, || render_workflows(&list))?;
            Ok(exit::OK)
        }
        Command::Workflow(WorkflowCommand::Show(WorkflowShowArgs { name, version })) => {
            let request = Request::Workflow {
                name,
                version: *version,
            };
            let (view, _): (crate::api::DefinitionView, Value) = fetch(client, &request).await?;
            let text = if cli.json {
                render_definition_json(&view).map_err(|e| e.to_string())
            } else {
                render_definition_yaml(&view).map_err(|e| e.to_string())
            };
            let context = describe(&request, &client.url(&request)?);
            let text = text.map_err(|e| ClientError::Decode {
                context,
                message: format!("cannot write the definition: {e}"),
            })?;
            out.write_all(text.as_bytes())?;
            Ok(exit::OK)
        }
        Command::Service(ServiceCommand::Check(args)) => {
            service_check(cli.json, args, out, err).await
        }
        Command::Service(ServiceCommand::Pause(a) | ServiceCommand::Resume(a)) => {
            let pause = matches!(&cli.command, Command::Service(ServiceCommand::Pause(_)));
            let request = Request::ServiceAction {
                name: &a.name,
                pause,
                reason: a.reason.as_deref(),
            };
            let raw = client.send(&request).await?;
            if cli.json {
                print_json(out, &raw)?;
            } else {
                let changed = raw["changed"].as_bool().unwrap_or(true);
                let state = raw["breaker"]["state"].as_str().unwrap_or("?");
                let woken = match raw["woken"].as_u64() {
                    Some(1) => "; 1 waiting task woken".to_owned(),
                    Some(n) if n > 0 => format!("; {n} waiting tasks woken"),
                    _ => String::new(),
                };
                writeln!(
                    out,
                    "{} {}{}{woken}",
                    a.name,
                    state,
                    if changed { "" } else { " (already)" }
                )?;
            }
            Ok(exit::OK)
        }
        Command::Service(ServiceCommand::List) => {
            let (list, raw): (ServiceList, Value) = fetch(client, &Request::Services).await?;
            print_answer(out, cli.json, &raw, || render_services(&list))?;
            Ok(exit::OK)
        }
        Command::Schedule(command) => schedule(client, cli.json, command, out, err).await,
    }
}

/// `schedule list|apply|pause|resume|delete`.
async fn schedule(
    client: &Client,
    json: bool,
    command: &ScheduleCommand,
    out: &mut (dyn Write + Send),
    err: &mut (dyn Write + Send),
) -> Result<i32, Failure> {
    let line = |s: &Value| {
        format!(
            "{:<24} {:<20} {:<24} {:<16} {:<5} {}",
            clean(s["name"].as_str().unwrap_or("?"), 24),
            clean(s["workflow"].as_str().unwrap_or("?"), 20),
            clean(s["expression"].as_str().unwrap_or("?"), 24),
            clean(s["timezone"].as_str().unwrap_or("UTC"), 16),
            clean(s["overlap"].as_str().unwrap_or("skip"), 5),
            match s["nextRun"].as_str() {
                _ if s["paused"] == true => "paused".to_owned(),
                Some(t) => clean(t, 40),
                None => "none".to_owned(),
            }
        )
    };
    let (request, raw) = match command {
        ScheduleCommand::List => {
            let raw = client.send(&Request::Schedules).await?;
            if json {
                print_json(out, &raw)?;
            } else {
                writeln!(out, "{}", schedule_header())?;
                for s in raw["schedules"].as_array().into_iter().flatten() {
                    writeln!(out, "{}", line(s))?;
                }
            }
            return Ok(exit::OK);
        }
        ScheduleCommand::Apply(args) => {
            let mut failed = false;
            let mut defs = vec![];
            for file in crate::definitions::read_paths(&args.paths) {
                let format = sas::domain::workflow::Format::of_path(&file.name);
                let parsed = match (file.text, format) {
                    (Ok(text), Some(format)) => sas::domain::workflow::parse_value(&text, format)
                        .and_then(sas::domain::workflow::parse_schedules),
                    (Err(why), _) => Err(sas::domain::DefinitionError::one("", why)),
                    (_, None) => Err(sas::domain::DefinitionError::one(
                        "",
                        "not a .yaml, .yml or .json file",
                    )),
                };
                match parsed {
                    Ok(doc) => defs.extend(doc.schedules),
                    Err(e) => {
                        failed = true;
                        for p in &e.0 {
                            writeln!(err, "{}", problem_line(&file.name, p))?;
                        }
                    }
                }
            }
            if failed {
                return Ok(exit::INVALID);
            }
            for def in &defs {
                let body = serde_json::to_value(def).unwrap_or_default();
                let raw = client
                    .send(&Request::PutSchedule {
                        name: &def.name,
                        body: &body,
                    })
                    .await?;
                if json {
                    print_json(out, &raw)?;
                } else {
                    let verb = if raw["created"] == true {
                        "published"
                    } else {
                        "unchanged"
                    };
                    writeln!(out, "{verb} schedule {} v{}", def.name, raw["version"])?;
                }
            }
            return Ok(exit::OK);
        }
        ScheduleCommand::Pause(NameArg { name }) | ScheduleCommand::Resume(NameArg { name }) => {
            let pause = matches!(command, ScheduleCommand::Pause(_));
            let raw = client
                .send(&Request::ScheduleAction { name, pause })
                .await?;
            (name, raw)
        }
        ScheduleCommand::Delete(NameArg { name }) => {
            let raw = client.send(&Request::DeleteSchedule { name }).await?;
            if json {
                print_json(out, &raw)?;
            } else {
                writeln!(out, "deleted schedule {name}")?;
            }
            return Ok(exit::OK);
        }
    };
    if json {
        print_json(out, &raw)?;
    } else {
        let _ = request;
        writeln!(out, "{}\n{}", schedule_header(), line(&raw))?;
    }
    Ok(exit::OK)
}

/// The header of `schedule list`'s table, and of the row `schedule pause` and `resume` print.
fn schedule_header() -> String {
    format!(
        "{:<24} {:<20} {:<24} {:<16} {:<5} NEXT RUN",
        "NAME", "WORKFLOW", "EXPRESSION", "TIME ZONE", "OVERLAP"
    )
}

/// `workflow validate`: the report on `out`; 1 if any file has a problem.
fn validate(json: bool, args: &FilesArgs, out: &mut (dyn Write + Send)) -> Result<i32, Failure> {
    let validation = validate_paths(&args.paths);
    print_answer(out, json, &validation.to_json(), || validation.render())?;
    Ok(if validation.is_valid() {
        exit::OK
    } else {
        exit::INVALID
    })
}

/// `service check`: the report on `out`; 5 if a check does not hold.
async fn service_check(
    json: bool,
    args: &CheckArgs,
    out: &mut (dyn Write + Send),
    err: &mut (dyn Write + Send),
) -> Result<i32, Failure> {
    let input = match &args.input {
        None => Value::Object(Default::default()),
        Some(path) => match std::fs::read_to_string(path)
            .map_err(|e| e.to_string())
            .and_then(|t| serde_json::from_str(&t).map_err(|e| e.to_string()))
        {
            Ok(v) => v,
            Err(e) => {
                let _ = writeln!(err, "error: --input {}: {e}", path.display());
                return Ok(exit::USAGE);
            }
        },
    };
    let remote: Box<dyn sas::ports::RemoteService> = match (&args.url, &args.function) {
        (Some(url), _) => {
            let target = sas::domain::workflow::HttpTarget {
                base_url: url.to_string(),
                headers: Default::default(),
                auth: None,
                actions: Default::default(),
                statuses: Default::default(),
            };
            let credentials = Arc::new(sas::remote::CachedCredentials::new(
                Arc::new(sas::remote::MemoryCredentials::default()),
                sas::remote::DEFAULT_CACHE_TTL,
                Arc::new(sas::ports::SystemClock),
            ));
            let made = sas::remote::http_client()
                .map_err(|e| e.to_string())
                .and_then(|client| sas::remote::HttpRemote::new(client, &target, credentials));
            match made {
                Ok(remote) => Box::new(remote),
                Err(e) => {
                    let _ = writeln!(err, "error: --url {url}: {e}");
                    return Ok(exit::USAGE);
                }
            }
        }
        (None, Some(function)) => {
            let target = sas::domain::workflow::LambdaTarget {
                function: function.clone(),
                refusals: args.refusal.clone(),
            };
            let client = aws_sdk_lambda::Client::new(&sas::aws::sdk_config().await);
            Box::new(sas::remote::LambdaRemote::new(client, &target))
        }
        (None, None) => {
            let _ = writeln!(err, "error: give --url or --function");
            return Ok(exit::USAGE);
        }
    };
    let target = args
        .url
        .as_ref()
        .map(Url::to_string)
        .or_else(|| args.function.clone())
        .unwrap_or_default();
    let plan = Plan {
        timeout: Duration::from_millis(args.timeout_ms),
        give_up: Duration::from_millis(args.give_up_ms),
        settle: Duration::from_millis(args.settle_ms),
        ..Plan::new(&args.action, &args.undo, input)
    };
    let report = run_checks(remote.as_ref(), &plan, &target).await;
    let raw = serde_json::to_value(&report).map_err(io::Error::other)?;
    print_answer(out, json, &raw, || report.render())?;
    Ok(if report.broken() {
        exit::CONTRACT
    } else {
        exit::OK
    })
}

/// `workflow apply`: validates, then sends the plan one call at a time, stopping at the first
/// error (what was published before it stays published).
async fn apply(
    client: &Client,
    json: bool,
    args: &FilesArgs,
    out: &mut (dyn Write + Send),
    err: &mut (dyn Write + Send),
) -> Result<i32, Failure> {
    let validation = validate_paths(&args.paths);
    let Some(plan) = validation.plan() else {
        out.flush()?;
        for line in validation.problem_lines() {
            let _ = writeln!(err, "{line}");
        }
        let _ = writeln!(
            err,
            "error: invalid definitions: nothing was published (see `sasctl workflow validate`)"
        );
        return Ok(exit::INVALID);
    };
    let mut answers = vec![];
    for step in &plan {
        let request = step.request();
        let (published, mut raw): (Published, Value) = match fetch(client, &request).await {
            Ok(answer) => answer,
            Err(e) => {
                if json && !answers.is_empty() {
                    print_json(out, &serde_json::json!({ "published": answers }))?;
                }
                out.flush()?;
                if let ClientError::Api { problems, .. } = &e {
                    for p in problems {
                        let p = sas::domain::workflow::Problem {
                            at: p.at.clone(),
                            message: p.message.clone(),
                        };
                        let _ = writeln!(err, "{}", problem_line(&step.file, &p));
                    }
                }
                let _ = writeln!(
                    err,
                    "{}",
                    clean(
                        &format!(
                            "{}: {} {} was not published",
                            step.file, step.kind, step.name
                        ),
                        usize::MAX
                    )
                );
                return Err(e.into());
            }
        };
        if json {
            if let Some(o) = raw.as_object_mut() {
                o.insert("kind".into(), step.kind.to_string().into());
                o.insert("file".into(), step.file.clone().into());
            }
            answers.push(raw);
        } else {
            let verb = if published.created {
                "published"
            } else {
                "unchanged"
            };
            writeln!(
                out,
                "{verb} {} {} v{}",
                step.kind,
                clean(&published.name, usize::MAX),
                published.version
            )?;
        }
    }
    if json {
        print_json(out, &serde_json::json!({ "published": answers }))?;
    }
    Ok(exit::OK)
}

/// Sends a request and decodes its answer, keeping the raw JSON for `--json`.
async fn fetch<T: serde::de::DeserializeOwned>(
    client: &Client,
    request: &Request<'_>,
) -> Result<(T, Value), ClientError> {
    let raw = client.send(request).await?;
    let typed = decode(&describe(request, &client.url(request)?), &raw)?;
    Ok((typed, raw))
}

/// Writes an answer: `raw` as JSON with `--json`, else its rendered text.
fn print_answer(
    out: &mut (dyn Write + Send),
    json: bool,
    raw: &Value,
    text: impl FnOnce() -> String,
) -> io::Result<()> {
    if json {
        print_json(out, raw)
    } else {
        out.write_all(text().as_bytes())
    }
}

fn print_json(out: &mut (dyn Write + Send), raw: &Value) -> io::Result<()> {
    let text = serde_json::to_string_pretty(raw).map_err(io::Error::other)?;
    writeln!(out, "{text}")
}

/// An action with a body (`route` under the task: `retry-with-input`, `compensate-from`).
async fn act_with(
    client: &Client,
    json: bool,
    id: &str,
    route: &'static str,
    body: &Value,
    out: &mut (dyn Write + Send),
) -> Result<i32, Failure> {
    act(client, json, &Request::ActWith { id, route, body }, out).await
}

async fn act(
    client: &Client,
    json: bool,
    request: &Request<'_>,
    out: &mut (dyn Write + Send),
) -> Result<i32, Failure> {
    let (view, raw): (TaskView, Value) = fetch(client, request).await?;
    print_answer(out, json, &raw, || render_confirmation(&view))?;
    Ok(exit::OK)
}

async fn list(
    client: &Client,
    cli: &Cli,
    args: &ListArgs,
    out: &mut (dyn Write + Send),
) -> Result<i32, Failure> {
    let json = cli.json;
    let workflow = args
        .workflow
        .as_deref()
        .map(|w| format!(" --workflow {}", shell_quote(w)))
        .unwrap_or_default();
    let search = [("key", &args.key), ("from", &args.from), ("to", &args.to)]
        .into_iter()
        .filter_map(|(flag, v)| v.as_ref().map(|v| format!(" --{flag} {}", shell_quote(v))))
        .collect::<String>();
    let hint = |state: Option<&ProcessState>, cursor: Option<&str>| {
        let cursor = cursor
            .map(|c| format!(" --cursor {}", shell_quote(c)))
            .unwrap_or_default();
        let state = state.map(|s| format!(" --state {s}")).unwrap_or_default();
        format!(
            "sasctl{} list{search}{state}{workflow} --limit {}{cursor}",
            global_flags(cli),
            args.limit,
        )
    };
    if let Some(key) = &args.key {
        // A search: one list, in every state unless --state narrows it.
        let (page, raw_tasks, cursor) = pages(client, args.state.as_ref(), args).await?;
        let raw = serde_json::json!({ "tasks": raw_tasks, "nextCursor": cursor });
        print_answer(out, json, &raw, || {
            let mut text = if page.tasks.is_empty() {
                format!("no tasks found by {key}\n")
            } else {
                render_list(&page)
            };
            if let Some(c) = &cursor {
                text.push_str(&format!("more: {}\n", hint(args.state.as_ref(), Some(c))));
            }
            text
        })?;
        return Ok(exit::OK);
    }
    let Some(state) = &args.state else {
        // Every state: one page of each (or every page, with --all), newest first together.
        let mut page = ListPage::default();
        let mut raw_tasks = Vec::new();
        let mut more = Vec::new();
        for state in crate::api::KNOWN_STATES.iter() {
            let (next, raw, cursor) = pages(client, Some(state), args).await?;
            page.tasks.extend(next.tasks);
            raw_tasks.extend(raw);
            if let Some(c) = cursor {
                more.push(hint(Some(state), Some(&c)));
            }
        }
        page.tasks.sort_by_key(|t| std::cmp::Reverse(t.updated_at));
        let raw = serde_json::json!({ "tasks": raw_tasks, "nextCursor": null });
        print_answer(out, json, &raw, || {
            let mut text = if page.tasks.is_empty() {
                "no tasks in any state\n".to_owned()
            } else {
                render_list(&page)
            };
            for m in &more {
                text.push_str(&format!("more: {m}\n"));
            }
            text
        })?;
        return Ok(exit::OK);
    };
    let (page, raw_tasks, cursor) = pages(client, Some(state), args).await?;
    let raw = serde_json::json!({ "tasks": raw_tasks, "nextCursor": cursor });
    print_answer(out, json, &raw, || {
        let mut text = if page.tasks.is_empty() {
            format!("no tasks in {state}\n")
        } else {
            render_list(&page)
        };
        if let Some(c) = &cursor {
            text.push_str(&format!("more: {}\n", hint(Some(state), Some(c))));
        }
        text
    })?;
    Ok(exit::OK)
}

/// The tasks `list` shows of one state: one page from `--cursor`, or with `--all` every page
/// from there. Returns them, their raw JSON, and the cursor of the next page (none with
/// `--all`).
async fn pages(
    client: &Client,
    state: Option<&ProcessState>,
    args: &ListArgs,
) -> Result<(ListPage, Vec<Value>, Option<String>), Failure> {
    let mut cursor = args.cursor.clone();
    let mut seen = HashSet::new();
    let mut page = ListPage::default();
    let mut raw_tasks = Vec::new();
    loop {
        let request = Request::List {
            state,
            key: args.key.as_deref(),
            from: args.from.as_deref(),
            to: args.to.as_deref(),
            workflow: args.workflow.as_deref(),
            limit: Some(args.limit),
            cursor: cursor.as_deref(),
        };
        let (next, raw): (ListPage, Value) = fetch(client, &request).await?;
        if let Some(tasks) = raw.get("tasks").and_then(Value::as_array) {
            raw_tasks.extend(tasks.iter().cloned());
        }
        page.tasks.extend(next.tasks);
        if !args.all {
            return Ok((page, raw_tasks, next.next_cursor));
        }
        match next.next_cursor {
            Some(c) => {
                if !seen.insert(c.clone()) {
                    return Err(ClientError::Decode {
                        context: describe(&request, &client.url(&request)?),
                        message: format!("the server repeated cursor {c:?}"),
                    }
                    .into());
                }
                cursor = Some(c);
            }
            None => return Ok((page, raw_tasks, None)),
        }
    }
}

/// The global flags of `cli` as a command line repeats them (each with a leading space):
/// the endpoint unless it is the default, `--sign` unless it is `auto`.
fn global_flags(cli: &Cli) -> String {
    let mut flags = String::new();
    if let Some(stack) = &cli.stack {
        flags.push_str(&format!(" --stack {}", shell_quote(stack)));
    } else if cli.endpoint.as_str().trim_end_matches('/') != DEFAULT_ENDPOINT {
        flags.push_str(&format!(
            " --endpoint {}",
            shell_quote(cli.endpoint.as_str())
        ));
    }
    match cli.sign {
        Sign::Auto => {}
        Sign::Always => flags.push_str(" --sign always"),
        Sign::Never => flags.push_str(" --sign never"),
    }
    flags
}

/// Quotes a cursor for a POSIX shell if it holds anything beyond a safe set.
fn shell_quote(s: &str) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || "-_.=+/:,@%".contains(c);
    if !s.is_empty() && s.chars().all(safe) {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

async fn watch(
    client: &Client,
    json: bool,
    args: &WatchArgs,
    out: &mut (dyn Write + Send),
    err: &mut (dyn Write + Send),
) -> Result<i32, Failure> {
    let timeout = Duration::from_secs(args.timeout_secs);
    let interval = Duration::from_millis(args.interval_ms);
    let deadline = tokio::time::Instant::now() + timeout;
    let request = Request::Show {
        id: &args.id,
        elements_from: None,
    };
    // It may wait long (a callback step, a paused service): say so, on stderr.
    let until = match &args.until_waiting {
        Some(step) => format!("until it is terminal or {step} waits"),
        None => "until it is terminal".to_owned(),
    };
    let _ = writeln!(
        err,
        "watching task {} {until} (every {} ms, at most {} s; Ctrl-C stops watching, not the task)",
        args.id, args.interval_ms, args.timeout_secs
    );
    let mut last: Option<(ProcessState, Option<String>, Option<u32>)> = None;
    let mut last_state = None;
    loop {
        let Ok(answer) = tokio::time::timeout_at(deadline, fetch(client, &request)).await else {
            break;
        };
        let (view, raw): (TaskView, Value) = answer?;
        let key = (
            view.process_state.clone(),
            view.current_step.clone(),
            view.failure_count,
        );
        if last.as_ref() != Some(&key) {
            print_answer(out, json, &raw, || render_watch_line(&view))?;
            out.flush()?;
            last = Some(key);
        }
        if view.process_state.is_terminal() {
            if !json {
                out.write_all(render_confirmation(&view).as_bytes())?;
            }
            return Ok(exit::OK);
        }
        if let Some(step) = &args.until_waiting
            && raw["steps"].as_array().is_some_and(|steps| {
                steps
                    .iter()
                    .any(|s| s["name"] == step.as_str() && s["status"] == "Waiting")
            })
        {
            if !json {
                writeln!(out, "task {} waits at {step}", args.id)?;
            }
            return Ok(exit::OK);
        }
        last_state = Some(view.process_state);
        if tokio::time::Instant::now() + interval >= deadline {
            break;
        }
        tokio::time::sleep(interval).await;
    }
    out.flush()?;
    let state = last_state.map_or_else(|| "unknown".to_owned(), |s| s.to_string());
    let _ = writeln!(
        err,
        "error: timeout: task {} is not terminal after {}s (last state: {state})",
        args.id, args.timeout_secs
    );
    Ok(exit::TIMEOUT)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("sasctl").chain(args.iter().copied()))
    }

    /// `compensate --from STEP` undoes STEP too: its help says so.
    #[test]
    fn compensate_from_says_it_undoes_the_step_too() {
        let mut cli = Cli::command();
        let help = cli
            .find_subcommand_mut("compensate")
            .expect("compensate")
            .render_long_help()
            .to_string();
        assert!(help.contains("STEP itself is undone"), "{help}");
        assert!(help.contains("it is undone too"), "{help}");
    }

    /// `sasctl --help` names what each command group does: its line names every subcommand
    /// of the group.
    #[test]
    fn each_groups_help_line_names_its_subcommands() {
        let cli = Cli::command();
        for group in cli.get_subcommands().filter(|c| c.has_subcommands()) {
            let about = group.get_about().map(|a| a.to_string()).unwrap_or_default();
            for sub in group.get_subcommands().map(|c| c.get_name()) {
                if sub == "help" {
                    continue;
                }
                assert!(
                    about
                        .split(|c: char| !c.is_alphanumeric())
                        .any(|w| w == sub),
                    "`sasctl --help` says of {}: {about:?}, which does not name {sub}",
                    group.get_name()
                );
            }
        }
    }

    #[test]
    fn every_json_flag_takes_json_or_a_file_alike() -> TestResult {
        let dir = std::env::temp_dir().join(format!("sasctl-json-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir)?;
        let file = dir.join("input.json");
        std::fs::write(&file, r#"{"a": 1}"#)?;
        let path = file.to_str().ok_or("a utf-8 path")?;
        let at = format!("@{path}");
        for flags in [
            &["submit", "w", "--input"][..],
            &["retry", "t1", "--input"],
            &["skip", "t1", "--reason", "r", "--result"],
        ] {
            for value in [r#"{"a": 1}"#, at.as_str()] {
                let cli = parse(&[flags, &[value]].concat())?;
                let got = match cli.command {
                    Command::Submit(a) => a.input,
                    Command::Retry(a) => a.input.ok_or("an input")?,
                    Command::Skip(a) => a.result.ok_or("a result")?,
                    other => return Err(format!("{other:?}").into()),
                };
                assert_eq!(got, serde_json::json!({"a": 1}), "{flags:?} {value}");
            }
            // A bare file name is not JSON: the error says how to give a file.
            let e = parse(&[flags, &[path]].concat()).err().ok_or("refused")?;
            assert!(
                e.to_string()
                    .contains(&format!("(to read the file, give @{path})")),
                "{e}"
            );
        }
        // `--note` is resolve's old name of `--reason`.
        for flag in ["--reason", "--note"] {
            assert_eq!(
                parse(&["resolve", "t1", flag, "by hand"])?.command,
                Command::Resolve(ResolveArgs {
                    id: "t1".into(),
                    reason: "by hand".into()
                })
            );
        }
        std::fs::remove_dir_all(&dir)?;
        Ok(())
    }

    #[test]
    fn clap_definition_is_valid() {
        Cli::command().debug_assert();
    }

    #[test]
    fn list_defaults() -> TestResult {
        let cli = parse(&["list"])?;
        assert_eq!(
            cli.command,
            Command::List(ListArgs {
                state: None,
                key: None,
                from: None,
                to: None,
                workflow: None,
                limit: 50,
                cursor: None,
                all: false,
            })
        );
        assert!(!cli.json);
        if std::env::var_os("SAS_ENDPOINT").is_none() {
            assert_eq!(cli.endpoint.as_str(), "http://127.0.0.1:3000/operator");
        }
        Ok(())
    }

    #[test]
    fn list_options_and_global_flags_anywhere() -> TestResult {
        let cli = parse(&[
            "list",
            "--state",
            "compensationfailed",
            "--workflow",
            "loan-application",
            "--limit",
            "100",
            "--cursor",
            "abc",
            "--all",
            "--json",
            "--endpoint",
            "https://api.example.com/prod",
        ])?;
        assert_eq!(
            cli.command,
            Command::List(ListArgs {
                state: Some(ProcessState::CompensationFailed),
                key: None,
                from: None,
                to: None,
                workflow: Some("loan-application".into()),
                limit: 100,
                cursor: Some("abc".into()),
                all: true,
            })
        );
        assert!(cli.json);
        assert_eq!(cli.endpoint.as_str(), "https://api.example.com/prod");
        Ok(())
    }

    #[test]
    fn list_searches_by_key_within_a_time() -> TestResult {
        let cli = parse(&[
            "list",
            "--key",
            "customerId:c-77",
            "--from",
            "2026-11-30T00:00:00Z",
            "--to",
            "2026-12-01T00:00:00+01:00",
        ])?;
        let Command::List(args) = cli.command else {
            return Err("not list".into());
        };
        assert_eq!(args.key.as_deref(), Some("customerId:c-77"));
        assert_eq!(args.from.as_deref(), Some("2026-11-30T00:00:00Z"));
        assert_eq!(args.to.as_deref(), Some("2026-12-01T00:00:00+01:00"));
        assert_eq!(args.state, None);
        Ok(())
    }

    #[test]
    fn bad_arguments_are_usage_errors() {
        for args in [
            &["list", "--limit", "0"][..],
            &["list", "--limit", "101"],
            &["list", "--state", "Bogus"],
            &["list", "--cursor", ""],
            &["list", "--key", "customerId"],
            &["list", "--key", "1x:y"],
            &["list", "--from", "2026-11-30T00:00:00Z"],
            &["list", "--key", "a:b", "--to", "yesterday"],
            &["list", "--workflow", " "],
            &["workflow"],
            &["workflow", "validate"],
            &["workflow", "apply"],
            &["workflow", "show"],
            &["workflow", "show", ".."],
            &["workflow", "show", "w", "--version", "0"],
            &["workflow", "show", "w", "--version", "x"],
            &["workflow", "frobnicate"],
            &["service"],
            &["service", "show", "x"],
            &["show"],
            &["show", "  "],
            &["show", ".."],
            &["--endpoint", "not a url", "show", "x"],
            &["--endpoint", "ftp://example.com", "show", "x"],
            &["watch", "x", "--interval-ms", "1"],
            &["watch", "x", "--timeout-secs", "0"],
            &["cancel", "x", "--reason", ""],
            &["frobnicate"],
            &[],
        ] {
            match parse(args) {
                Ok(cli) => panic!("{args:?} parsed: {cli:?}"),
                Err(e) => assert_eq!(e.exit_code(), exit::USAGE, "{args:?}: {e}"),
            }
        }
    }

    #[test]
    fn task_commands() -> TestResult {
        assert_eq!(
            parse(&["show", " 3f2a "])?.command,
            Command::Show(ShowArgs {
                id: "3f2a".into(),
                elements_from: None
            })
        );
        assert_eq!(
            parse(&["show", "3f2a", "--elements-from", "200"])?.command,
            Command::Show(ShowArgs {
                id: "3f2a".into(),
                elements_from: Some(200)
            })
        );
        let act = |reason: Option<&str>| ActArgs {
            id: "t1".into(),
            reason: reason.map(str::to_owned),
        };
        let retry = |reason: Option<&str>, input: Option<Value>| {
            Command::Retry(RetryArgs {
                id: "t1".into(),
                reason: reason.map(str::to_owned),
                input,
            })
        };
        assert_eq!(parse(&["retry", "t1"])?.command, retry(None, None));
        assert_eq!(
            parse(&["retry", "t1", "--reason", "address fixed"])?.command,
            retry(Some("address fixed"), None)
        );
        assert_eq!(
            parse(&["retry", "t1", "--input", r#"{"a": 1}"#])?.command,
            retry(None, Some(serde_json::json!({"a": 1})))
        );
        assert_eq!(
            parse(&["compensate", "t1", "--from", "reserve"])?.command,
            Command::Compensate(CompensateArgs {
                id: "t1".into(),
                reason: None,
                from: Some("reserve".into())
            })
        );
        assert_eq!(
            parse(&["cancel", "t1"])?.command,
            Command::Cancel(act(None))
        );
        assert_eq!(
            parse(&["cancel", "t1", "--reason", "customer asked"])?.command,
            Command::Cancel(act(Some("customer asked")))
        );
        assert_eq!(
            parse(&["resolve", "t1", "--note", "refunded by hand"])?.command,
            Command::Resolve(ResolveArgs {
                id: "t1".into(),
                reason: "refunded by hand".into()
            })
        );
        assert!(parse(&["resolve", "t1"]).is_err(), "a resolve needs a note");
        assert!(parse(&["resolve", "t1", "--note", " "]).is_err());
        assert_eq!(
            parse(&["watch", "t1"])?.command,
            Command::Watch(WatchArgs {
                id: "t1".into(),
                interval_ms: 500,
                timeout_secs: 300,
                until_waiting: None
            })
        );
        assert_eq!(
            parse(&[
                "watch",
                "t1",
                "--interval-ms",
                "50",
                "--timeout-secs",
                "5",
                "--until-waiting",
                "cooling-off"
            ])?
            .command,
            Command::Watch(WatchArgs {
                id: "t1".into(),
                interval_ms: 50,
                timeout_secs: 5,
                until_waiting: Some("cooling-off".into())
            })
        );
        Ok(())
    }

    #[test]
    fn workflow_and_service_commands() -> TestResult {
        assert_eq!(
            parse(&["workflow", "validate", "workflows", "extra/one.yaml"])?.command,
            Command::Workflow(WorkflowCommand::Validate(FilesArgs {
                paths: vec!["workflows".into(), "extra/one.yaml".into()]
            }))
        );
        assert_eq!(
            parse(&["workflow", "apply", "workflows"])?.command,
            Command::Workflow(WorkflowCommand::Apply(FilesArgs {
                paths: vec!["workflows".into()]
            }))
        );
        assert_eq!(
            parse(&["workflow", "list"])?.command,
            Command::Workflow(WorkflowCommand::List)
        );
        assert_eq!(
            parse(&["workflow", "show", "loan-application"])?.command,
            Command::Workflow(WorkflowCommand::Show(WorkflowShowArgs {
                name: "loan-application".into(),
                version: None
            }))
        );
        let cli = parse(&["workflow", "show", "w", "--version", "3", "--json"])?;
        assert!(cli.json);
        assert_eq!(
            cli.command,
            Command::Workflow(WorkflowCommand::Show(WorkflowShowArgs {
                name: "w".into(),
                version: Some(3)
            }))
        );
        assert_eq!(
            parse(&["service", "list"])?.command,
            Command::Service(ServiceCommand::List)
        );
        Ok(())
    }

    #[test]
    fn help_documents_exit_codes() {
        let help = Cli::command().render_long_help().to_string();
        for needle in [
            "Exit codes:",
            "3  transport error",
            "SAS_ENDPOINT",
            "--json",
            "workflow validate",
        ] {
            assert!(help.contains(needle), "{needle} missing from:\n{help}");
        }
    }

    #[test]
    fn shell_quoting() {
        assert_eq!(shell_quote("eyJrIjoxfQ=="), "eyJrIjoxfQ==");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
    }

    /// Runs a command line against an endpoint nothing listens on (loopback port 9, discard).
    async fn unreachable(
        args: &[&str],
    ) -> Result<(i32, String, String), Box<dyn std::error::Error>> {
        let mut full = vec!["--endpoint", "http://127.0.0.1:9"];
        full.extend_from_slice(args);
        let cli = parse(&full)?;
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = run_with(cli, &mut out, &mut err).await?;
        Ok((code, String::from_utf8(out)?, String::from_utf8(err)?))
    }

    #[tokio::test]
    async fn unreachable_endpoint_exits_3() -> TestResult {
        for args in [
            &["list"][..],
            &["list", "--all", "--json", "--workflow", "w"],
            &["show", "t1"],
            &["retry", "t1"],
            &["compensate", "t1"],
            &["cancel", "t1", "--reason", "r"],
            &["watch", "t1", "--timeout-secs", "30"],
        ] {
            let (code, out, err) = unreachable(args).await?;
            assert_eq!(code, exit::TRANSPORT, "{args:?}: {err}");
            if args.contains(&"--json") {
                // Under --json the error is the one JSON document on stdout.
                assert_eq!(err, "", "{args:?}");
                let doc: serde_json::Value = serde_json::from_str(&out)?;
                let error = sas::api::error::code_and_message(&doc);
                assert!(
                    error.is_some_and(|(code, m)| code == "transport"
                        && m.starts_with("cannot reach http://127.0.0.1:9/tasks")),
                    "{doc}"
                );
                continue;
            }
            assert_eq!(out, "", "{args:?}");
            // `watch` first says that it waits, and for how long.
            let err = match err.split_once('\n') {
                Some((first, rest)) if args[0] == "watch" => {
                    assert_eq!(
                        first,
                        "watching task t1 until it is terminal (every 500 ms, at most 30 s; Ctrl-C stops watching, not the task)"
                    );
                    rest.to_owned()
                }
                _ => err,
            };
            assert!(
                err.starts_with("error: cannot reach http://127.0.0.1:9/tasks"),
                "{args:?}: {err}"
            );
        }
        for (args, path) in [
            (&["workflow", "list"][..], "/workflows"),
            (&["workflow", "show", "w"], "/workflows/w"),
            (
                &["workflow", "show", "w", "--version", "2"],
                "/workflows/w/versions/2",
            ),
            (&["service", "list"], "/services"),
        ] {
            let (code, out, err) = unreachable(args).await?;
            assert_eq!(code, exit::TRANSPORT, "{args:?}: {err}");
            assert_eq!(out, "", "{args:?}");
            assert!(
                err.starts_with(&format!("error: cannot reach http://127.0.0.1:9{path}:")),
                "{args:?}: {err}"
            );
        }
        Ok(())
    }

    #[tokio::test]
    async fn validate_runs_offline_and_exits_1_on_a_problem() -> TestResult {
        use crate::definitions::tests::{BAD, GOOD, SERVICES, TempDir};
        let dir = TempDir::new("cli-validate")?;
        let services = dir.write("services.yaml", SERVICES)?;
        let good = dir.write("good.yaml", GOOD)?;
        let (s, g) = (services.display(), good.display());
        let (code, out, err) =
            unreachable(&["workflow", "validate", &s.to_string(), &g.to_string()]).await?;
        assert_eq!(code, exit::OK, "{out}{err}");
        assert_eq!(
            out,
            format!("{s}: ok (2 services)\n{g}: ok (workflow transfer, 2 steps)\n")
        );
        assert_eq!(err, "");

        let bad = dir.write("bad.yaml", BAD)?;
        let (code, out, _) =
            unreachable(&["workflow", "validate", &dir.0.display().to_string()]).await?;
        assert_eq!(code, exit::INVALID, "{out}");
        assert!(
            out.contains(&format!(
                "{}: at /steps/0/service: unknown service \"fax\"",
                bad.display()
            )),
            "{out}"
        );

        let (code, out, _) =
            unreachable(&["--json", "workflow", "validate", &g.to_string()]).await?;
        assert_eq!(code, exit::INVALID);
        let report: Value = serde_json::from_str(&out)?;
        assert_eq!(report["valid"], serde_json::json!(false));
        assert_eq!(report["files"][0]["problems"][0]["at"], "/steps/0/service");
        Ok(())
    }

    #[tokio::test]
    async fn apply_sends_nothing_when_a_file_is_invalid() -> TestResult {
        use crate::definitions::tests::{BAD, SERVICES, TempDir};
        let dir = TempDir::new("cli-apply")?;
        dir.write("services.yaml", SERVICES)?;
        // Valid files reach for the endpoint, services first (nothing listens: exit 3).
        let (code, out, err) =
            unreachable(&["workflow", "apply", &dir.0.display().to_string()]).await?;
        assert_eq!(code, exit::TRANSPORT, "{err}");
        assert_eq!(out, "");
        assert!(
            err.contains("error: cannot reach http://127.0.0.1:9/services/bank:"),
            "{err}"
        );
        // An invalid file: exit 1 before any call (no transport error).
        let bad = dir.write("bad.yaml", BAD)?;
        let (code, out, err) =
            unreachable(&["workflow", "apply", &dir.0.display().to_string()]).await?;
        assert_eq!(code, exit::INVALID, "{err}");
        assert_eq!(out, "");
        assert!(
            err.starts_with(&format!("{}: at /steps/0/", bad.display())),
            "{err}"
        );
        assert!(err.contains("nothing was published"), "{err}");
        assert!(err.contains("unknown service \"fax\""), "{err}");
        assert!(!err.contains("cannot reach"), "{err}");
        Ok(())
    }

    #[tokio::test]
    async fn run_writes_errors_to_stderr() -> TestResult {
        let cli = parse(&["--endpoint", "http://127.0.0.1:9", "show", "t1"])?;
        let mut out = Vec::new();
        assert_eq!(run(cli, &mut out).await?, exit::TRANSPORT);
        assert!(out.is_empty());
        Ok(())
    }
}
