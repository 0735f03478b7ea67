//! The command line: arguments ([`Cli`]) and the commands themselves ([`run`]).

use crate::api::{ListPage, OrderView, ProcessState};
use crate::client::{Client, ClientError, Request, decode, describe};
use crate::exit;
use crate::render::{render_confirmation, render_list, render_order, render_watch_line};
use clap::{Args, Parser, Subcommand};
use serde_json::Value;
use std::collections::HashSet;
use std::io::{self, Write};
use std::time::Duration;
use url::Url;

/// The endpoint used when neither `--endpoint` nor `SAS_ENDPOINT` is given.
pub const DEFAULT_ENDPOINT: &str = "http://127.0.0.1:3000";

const LONG_ABOUT: &str = "\
Operator CLI for sas: list orders by state, show an order's steps and history, retry, \
compensate or cancel an order, and watch an order until it reaches a terminal state.

It talks to the sas HTTP API only: the submission function behind API Gateway, or \
`cargo run -p sas-local` (http://127.0.0.1:3000).

Exit codes:
  0  success
  1  the API answered an error (printed to stderr as `error: <code>: <message>`),
     or an answer sasctl could not read
  2  usage error (bad arguments)
  3  transport error: the endpoint could not be reached
  4  watch: the timeout passed before the order reached a terminal state";

/// sasctl: operate sas orders over the HTTP API.
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

    /// Print the JSON the API returned (pretty) instead of tables.
    #[arg(long, global = true)]
    pub json: bool,

    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Clone, PartialEq, Eq, Subcommand)]
pub enum Command {
    /// List the orders in one state.
    List(ListArgs),
    /// Show one order: a summary, its steps, then its history.
    Show(IdArg),
    /// Process an order again from its failed step.
    Retry(IdArg),
    /// Undo an order's completed steps.
    Compensate(IdArg),
    /// Cancel an order.
    Cancel(CancelArgs),
    /// Follow an order until it is terminal, printing each change.
    ///
    /// Polls the order and prints a line whenever its state, step or failure count changes;
    /// exits 0 once it is terminal (Processed, Error, Compensated, CompensationFailed), 4 if
    /// the timeout passes first.
    Watch(WatchArgs),
}

/// `list` arguments.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct ListArgs {
    /// The state to list.
    #[arg(long, value_enum, ignore_case = true, default_value = "Error")]
    pub state: ProcessState,
    /// Orders per page (1 to 100).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub limit: u32,
    /// Start at this page (the `nextCursor` of a previous page).
    #[arg(long, value_parser = parse_non_empty)]
    pub cursor: Option<String>,
    /// Follow the cursor to the last page and print every order.
    #[arg(long)]
    pub all: bool,
}

/// An order id argument.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct IdArg {
    /// The order id.
    #[arg(value_parser = parse_id)]
    pub id: String,
}

/// `cancel` arguments.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct CancelArgs {
    /// The order id.
    #[arg(value_parser = parse_id)]
    pub id: String,
    /// Why the order is cancelled (recorded in its history).
    #[arg(long, value_parser = parse_non_empty)]
    pub reason: Option<String>,
}

/// `watch` arguments.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct WatchArgs {
    /// The order id.
    #[arg(value_parser = parse_id)]
    pub id: String,
    /// Time between polls, in milliseconds.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(10..))]
    pub interval_ms: u64,
    /// Give up (exit 4) if the order is not terminal after this many seconds.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..))]
    pub timeout_secs: u64,
}

fn parse_endpoint(s: &str) -> Result<Url, String> {
    let url = Url::parse(s).map_err(|e| format!("not a URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
        return Err("must be an http:// or https:// URL with a host".into());
    }
    Ok(url)
}

fn parse_id(s: &str) -> Result<String, String> {
    let s = s.trim();
    if s.is_empty() || s == "." || s == ".." {
        return Err("must be an order id".into());
    }
    Ok(s.to_owned())
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
    let result = match Client::new(cli.endpoint.clone()) {
        Ok(client) => dispatch(&client, &cli, out, err).await,
        Err(e) => Err(e.into()),
    };
    match result {
        Ok(code) => {
            out.flush()?;
            Ok(code)
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

async fn dispatch(
    client: &Client,
    cli: &Cli,
    out: &mut (dyn Write + Send),
    err: &mut (dyn Write + Send),
) -> Result<i32, Failure> {
    match &cli.command {
        Command::List(args) => list(client, cli.json, args, out).await,
        Command::Show(IdArg { id }) => {
            let (view, raw) = fetch(client, &Request::Show { id }).await?;
            if cli.json {
                print_json(out, &raw)?;
            } else {
                out.write_all(render_order(&view).as_bytes())?;
            }
            Ok(exit::OK)
        }
        Command::Retry(IdArg { id }) => act(client, cli.json, &Request::Retry { id }, out).await,
        Command::Compensate(IdArg { id }) => {
            act(client, cli.json, &Request::Compensate { id }, out).await
        }
        Command::Cancel(CancelArgs { id, reason }) => {
            let request = Request::Cancel {
                id,
                reason: reason.as_deref(),
            };
            act(client, cli.json, &request, out).await
        }
        Command::Watch(args) => watch(client, cli.json, args, out, err).await,
    }
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

fn print_json(out: &mut (dyn Write + Send), raw: &Value) -> io::Result<()> {
    let text = serde_json::to_string_pretty(raw).map_err(io::Error::other)?;
    writeln!(out, "{text}")
}

async fn act(
    client: &Client,
    json: bool,
    request: &Request<'_>,
    out: &mut (dyn Write + Send),
) -> Result<i32, Failure> {
    let (view, raw): (OrderView, Value) = fetch(client, request).await?;
    if json {
        print_json(out, &raw)?;
    } else {
        out.write_all(render_confirmation(&view).as_bytes())?;
    }
    Ok(exit::OK)
}

async fn list(
    client: &Client,
    json: bool,
    args: &ListArgs,
    out: &mut (dyn Write + Send),
) -> Result<i32, Failure> {
    let mut cursor = args.cursor.clone();
    let mut seen = HashSet::new();
    let mut page = ListPage::default();
    let mut raw_orders = Vec::new();
    loop {
        let request = Request::List {
            state: &args.state,
            limit: Some(args.limit),
            cursor: cursor.as_deref(),
        };
        let (next, raw): (ListPage, Value) = fetch(client, &request).await?;
        if !args.all {
            if json {
                print_json(out, &raw)?;
            } else {
                out.write_all(render_list(&next).as_bytes())?;
                if let Some(c) = &next.next_cursor {
                    writeln!(
                        out,
                        "more: sasctl list --state {} --limit {} --cursor {}",
                        args.state,
                        args.limit,
                        shell_quote(c)
                    )?;
                }
            }
            return Ok(exit::OK);
        }
        if let Some(orders) = raw.get("orders").and_then(Value::as_array) {
            raw_orders.extend(orders.iter().cloned());
        }
        page.orders.extend(next.orders);
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
            None => break,
        }
    }
    if json {
        print_json(
            out,
            &serde_json::json!({ "orders": raw_orders, "nextCursor": null }),
        )?;
    } else {
        out.write_all(render_list(&page).as_bytes())?;
    }
    Ok(exit::OK)
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
    let request = Request::Show { id: &args.id };
    let mut last: Option<(ProcessState, Option<String>, Option<u32>)> = None;
    let mut last_state = None;
    loop {
        let Ok(answer) = tokio::time::timeout_at(deadline, fetch(client, &request)).await else {
            break;
        };
        let (view, raw): (OrderView, Value) = answer?;
        let key = (
            view.process_state.clone(),
            view.step.clone(),
            view.failure_count,
        );
        if last.as_ref() != Some(&key) {
            if json {
                print_json(out, &raw)?;
            } else {
                out.write_all(render_watch_line(&view).as_bytes())?;
            }
            out.flush()?;
            last = Some(key);
        }
        if view.process_state.is_terminal() {
            if !json {
                out.write_all(render_confirmation(&view).as_bytes())?;
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
        "error: timeout: order {} is not terminal after {}s (last state: {state})",
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
                state: ProcessState::Error,
                limit: 50,
                cursor: None,
                all: false,
            })
        );
        assert!(!cli.json);
        if std::env::var_os("SAS_ENDPOINT").is_none() {
            assert_eq!(cli.endpoint.as_str(), "http://127.0.0.1:3000/");
        }
        Ok(())
    }

    #[test]
    fn list_options_and_global_flags_anywhere() -> TestResult {
        let cli = parse(&[
            "list",
            "--state",
            "compensationfailed",
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
                state: ProcessState::CompensationFailed,
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
    fn bad_arguments_are_usage_errors() {
        for args in [
            &["list", "--limit", "0"][..],
            &["list", "--limit", "101"],
            &["list", "--state", "Bogus"],
            &["list", "--cursor", ""],
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
    fn order_commands() -> TestResult {
        assert_eq!(
            parse(&["show", " 3f2a "])?.command,
            Command::Show(IdArg { id: "3f2a".into() })
        );
        assert_eq!(
            parse(&["retry", "o1"])?.command,
            Command::Retry(IdArg { id: "o1".into() })
        );
        assert_eq!(
            parse(&["compensate", "o1"])?.command,
            Command::Compensate(IdArg { id: "o1".into() })
        );
        assert_eq!(
            parse(&["cancel", "o1"])?.command,
            Command::Cancel(CancelArgs {
                id: "o1".into(),
                reason: None
            })
        );
        assert_eq!(
            parse(&["cancel", "o1", "--reason", "customer asked"])?.command,
            Command::Cancel(CancelArgs {
                id: "o1".into(),
                reason: Some("customer asked".into())
            })
        );
        assert_eq!(
            parse(&["watch", "o1"])?.command,
            Command::Watch(WatchArgs {
                id: "o1".into(),
                interval_ms: 500,
                timeout_secs: 300
            })
        );
        assert_eq!(
            parse(&["watch", "o1", "--interval-ms", "50", "--timeout-secs", "5"])?.command,
            Command::Watch(WatchArgs {
                id: "o1".into(),
                interval_ms: 50,
                timeout_secs: 5
            })
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
            &["list", "--all", "--json"],
            &["show", "o1"],
            &["retry", "o1"],
            &["compensate", "o1"],
            &["cancel", "o1", "--reason", "r"],
            &["watch", "o1", "--timeout-secs", "30"],
        ] {
            let (code, out, err) = unreachable(args).await?;
            assert_eq!(code, exit::TRANSPORT, "{args:?}: {err}");
            assert_eq!(out, "", "{args:?}");
            assert!(
                err.starts_with("error: cannot reach http://127.0.0.1:9/orders"),
                "{args:?}: {err}"
            );
        }
        Ok(())
    }

    #[tokio::test]
    async fn run_writes_errors_to_stderr() -> TestResult {
        let cli = parse(&["--endpoint", "http://127.0.0.1:9", "show", "o1"])?;
        let mut out = Vec::new();
        assert_eq!(run(cli, &mut out).await?, exit::TRANSPORT);
        assert!(out.is_empty());
        Ok(())
    }
}
