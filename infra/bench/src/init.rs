//! Cold-start init per function: each function's host binary started as Lambda starts a custom
//! runtime (its environment, a Runtime API on a loopback port), timed from the spawn to its
//! first `GET /2018-06-01/runtime/invocation/next`: the process's load and what its `main`
//! does before it serves. The bench builds nothing: it takes the folder of the release
//! binaries (`--functions-dir`) and says which ones are missing.

use anyhow::Context as _;
use std::io::{BufRead as _, BufReader, Read as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The Runtime API's path a runtime asks for its next invocation on.
pub const NEXT: &str = "/2018-06-01/runtime/invocation/next";

/// How long a function may take to ask for its first invocation before the run fails.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// One deployed function (a resource of `template.yaml`): the binary it runs, the `sam build`
/// folders its arm64 `bootstrap` may be in, and its own environment variables (dummy values;
/// `{endpoint}` stands for the loopback address every AWS endpoint points to).
pub struct Function {
    pub name: &'static str,
    pub binary: &'static str,
    pub sam_dirs: &'static [&'static str],
    pub vars: &'static [(&'static str, &'static str)],
}

/// The template's `Globals` variables, with its parameters' defaults (`Stage` is `bench`).
const GLOBALS: &[(&str, &str)] = &[
    ("RUST_LOG", "info"),
    ("METRICS_NAMESPACE", "sas/bench"),
    ("DUE_SHARDS", "16"),
    ("CALLER_SHARDS", "4"),
    ("FAILURE_THRESHOLD", "3"),
    ("STEP_TIMEOUT_SECONDS", "60"),
    ("START_WITHIN_SECONDS", "90"),
    ("PICKUP_TIMEOUT_SECONDS", "120"),
    ("RETRY_BASE_DELAY_SECONDS", "5"),
    ("RETRY_MAX_DELAY_SECONDS", "900"),
    ("AUTO_COMPENSATE", "true"),
    ("PROGRESS_EVENTS", "false"),
    ("COOLDOWN_SECONDS", "1800"),
    ("MAX_ROUNDS", "0"),
    ("CATALOG_CACHE_SECONDS", "5"),
    ("CALL_TIMEOUT_MS", "10000"),
    ("UNDO_MARGIN_SECONDS", "30"),
    ("RETENTION_DAYS", "90"),
];

const TABLE: (&str, &str) = ("TABLE_NAME", "sas-bench-tasks");
const BUCKET: (&str, &str) = ("PAYLOAD_BUCKET", "sas-bench-payloads");
const BUS: (&str, &str) = ("EVENT_BUS_NAME", "sas-bench");
const WORK: (&str, &str) = ("WORK_QUEUE_URL", "{endpoint}/000000000000/sas-bench-work");
const URGENT_WORK: (&str, &str) = (
    "URGENT_WORK_QUEUE_URL",
    "{endpoint}/000000000000/sas-bench-work-urgent",
);
const ENDS: (&str, &str) = ("ENDS_QUEUE_URL", "{endpoint}/000000000000/sas-bench-ends");
const TIMERS: (&str, &str) = (
    "TIMER_QUEUE_URL",
    "{endpoint}/000000000000/sas-bench-timers",
);
const REPLY_QUEUES: (&str, &str) = ("REPLY_QUEUES", "{endpoint}/000000000000/sasreply-bench--*");

/// The five functions of `template.yaml` (the task API and the operator API run one binary).
pub static FUNCTIONS: [Function; 5] = [
    Function {
        name: "SubmissionFunction",
        binary: "submission",
        sam_dirs: &["SubmissionFunction", "SubmissionFunction-Shared"],
        vars: &[
            TABLE,
            BUCKET,
            WORK,
            URGENT_WORK,
            BUS,
            ENDS,
            ("OPERATOR_API", "false"),
            ("API_AUTH", "IAM"),
            ("CALLER_RATE_PER_SECOND", "50"),
            ("CALLER_BURST", "100"),
            REPLY_QUEUES,
        ],
    },
    Function {
        name: "OperatorFunction",
        binary: "submission",
        sam_dirs: &[
            "OperatorFunction",
            "SubmissionFunction-Shared",
            "SubmissionFunction",
        ],
        vars: &[
            TABLE,
            BUCKET,
            WORK,
            URGENT_WORK,
            BUS,
            ENDS,
            ("OPERATOR_API", "true"),
            ("SERVICE_SHARE", "10"),
            ("SCHEDULE_GROUP", "sas-bench"),
            (
                "SCHEDULE_ROLE_ARN",
                "arn:aws:iam::000000000000:role/sas-bench-schedule",
            ),
            (
                "WORK_QUEUE_ARN",
                "arn:aws:sqs:us-east-1:000000000000:sas-bench-work",
            ),
            (
                "DEAD_LETTER_QUEUE_ARN",
                "arn:aws:sqs:us-east-1:000000000000:sas-bench-scheduler-dlq",
            ),
            ("SECRETS_PREFIX", "sas/bench/"),
            REPLY_QUEUES,
        ],
    },
    Function {
        name: "SchedulerFunction",
        binary: "scheduler",
        sam_dirs: &["SchedulerFunction"],
        vars: &[
            TABLE,
            BUCKET,
            BUS,
            (
                "REPLY_QUEUE_URL",
                "{endpoint}/000000000000/sas-bench-replies",
            ),
            WORK,
            URGENT_WORK,
            TIMERS,
            ("DEADLINE_TIMERS", "true"),
            ("AGENT_QUEUE_URL", "{endpoint}/000000000000/sas-bench-agent"),
            (
                "URGENT_AGENT_QUEUE_URL",
                "{endpoint}/000000000000/sas-bench-agent-urgent",
            ),
            (
                "DEAD_LETTER_QUEUE_URL",
                "{endpoint}/000000000000/sas-bench-scheduler-dlq",
            ),
            ENDS,
            ("CALLBACK_BASE_URL", "{endpoint}"),
        ],
    },
    Function {
        name: "AgentFunction",
        binary: "agent",
        sam_dirs: &["AgentFunction"],
        vars: &[
            (
                "DEAD_LETTER_QUEUE_URL",
                "{endpoint}/000000000000/sas-bench-agent-dlq",
            ),
            TABLE,
            BUCKET,
            ("BREAKER_THRESHOLD", "5"),
            ("BREAKER_COOLDOWN_MS", "5000"),
            ("BREAKER_PAUSE_AFTER_SECONDS", "0"),
            ("SERVICE_SHARE", "10"),
            ("CREDENTIALS_CACHE_SECONDS", "300"),
            BUS,
            WORK,
            URGENT_WORK,
            ENDS,
        ],
    },
    Function {
        name: "SupervisorFunction",
        binary: "supervisor",
        sam_dirs: &["SupervisorFunction"],
        vars: &[
            TABLE,
            BUCKET,
            BUS,
            WORK,
            URGENT_WORK,
            TIMERS,
            (
                "DEAD_LETTER_QUEUE_URL",
                "{endpoint}/000000000000/sas-bench-supervisor-dlq",
            ),
            ENDS,
            ("SWEEP_PAGE_SIZE", "100"),
            ("SWEEP_CONCURRENCY", "32"),
            ("SWEEP_BUDGET_SECONDS", "60"),
            ("SWEEP_LOOK_AHEAD_SECONDS", "60"),
            ("LEASE_SECONDS", "150"),
        ],
    },
];

/// The environment Lambda gives a custom runtime of `function` (and nothing of the bench's
/// own): the Runtime API at `api`, the function's identity and 256 MB, the region, dummy
/// credentials as environment variables (Lambda's come the same way), no instance metadata,
/// every AWS endpoint on `api` too (nothing may reach the network; a call before `/next`
/// would arrive there first and fail the run), then the template's `Globals` and the
/// function's own variables.
pub fn lambda_env(function: &Function, api: SocketAddr) -> Vec<(String, String)> {
    let endpoint = format!("http://{api}");
    let name = format!("sas-bench-{}", function.name);
    let lambda = [
        ("AWS_LAMBDA_RUNTIME_API", api.to_string()),
        ("AWS_LAMBDA_FUNCTION_NAME", name.clone()),
        ("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "256".into()),
        ("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST".into()),
        (
            "AWS_LAMBDA_LOG_STREAM_NAME",
            "2026/01/01/[$LATEST]0123456789abcdef".into(),
        ),
        ("AWS_LAMBDA_LOG_GROUP_NAME", format!("/aws/lambda/{name}")),
        ("AWS_LAMBDA_INITIALIZATION_TYPE", "on-demand".into()),
        ("AWS_EXECUTION_ENV", "AWS_Lambda_provided.al2023".into()),
        ("_HANDLER", "bootstrap".into()),
        ("AWS_REGION", "us-east-1".into()),
        ("AWS_DEFAULT_REGION", "us-east-1".into()),
        ("AWS_ACCESS_KEY_ID", "test".into()),
        ("AWS_SECRET_ACCESS_KEY", "test".into()),
        ("AWS_SESSION_TOKEN", "test".into()),
        ("AWS_EC2_METADATA_DISABLED", "true".into()),
        ("AWS_ENDPOINT_URL", endpoint.clone()),
        ("TZ", ":UTC".into()),
        ("LANG", "en_US.UTF-8".into()),
        ("PATH", "/usr/local/bin:/usr/bin:/bin".into()),
    ];
    lambda
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .chain(
            GLOBALS
                .iter()
                .chain(function.vars)
                .map(|(k, v)| ((*k).to_owned(), v.replace("{endpoint}", &endpoint))),
        )
        .collect()
}

/// The first request the stand-in Runtime API received: when its head had arrived, its
/// request line, and its connection (held open, so the runtime waits for an answer).
pub struct FirstRequest {
    pub at: Instant,
    pub line: String,
    _connection: TcpStream,
}

/// A stand-in Lambda Runtime API on a loopback port: a thread accepts one connection, reads
/// its request head and hands it over with the instant it arrived. It answers nothing.
pub struct RuntimeApi {
    addr: SocketAddr,
    first: mpsc::Receiver<std::io::Result<FirstRequest>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RuntimeApi {
    /// Listens on a free loopback port.
    pub fn start() -> anyhow::Result<Self> {
        let listener =
            TcpListener::bind(("127.0.0.1", 0)).context("binding the stand-in Runtime API")?;
        let addr = listener.local_addr().context("the Runtime API's address")?;
        let (tx, first) = mpsc::channel();
        let thread = std::thread::spawn(move || {
            let _ = tx.send(read_first_request(&listener));
        });
        Ok(Self {
            addr,
            first,
            thread: Some(thread),
        })
    }

    /// The address to give a runtime (`AWS_LAMBDA_RUNTIME_API`).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The first request, if it has come within `wait`.
    pub fn first_request(&self, wait: Duration) -> Option<std::io::Result<FirstRequest>> {
        match self.first.recv_timeout(wait) {
            Ok(r) => Some(r),
            Err(mpsc::RecvTimeoutError::Timeout) => None,
            Err(mpsc::RecvTimeoutError::Disconnected) => Some(Err(std::io::Error::other(
                "the Runtime API's thread ended without a request",
            ))),
        }
    }
}

impl Drop for RuntimeApi {
    /// Ends the listening thread: if no one connected, a connection of our own (closed at
    /// once) wakes it up.
    fn drop(&mut self) {
        if let Some(thread) = self.thread.take() {
            if !thread.is_finished() {
                let _ = TcpStream::connect(self.addr);
            }
            let _ = thread.join();
        }
    }
}

/// Accepts one connection on `listener` and reads its request head (to the blank line); the
/// instant is taken once the head is complete.
fn read_first_request(listener: &TcpListener) -> std::io::Result<FirstRequest> {
    let (connection, _) = listener.accept()?;
    connection.set_read_timeout(Some(START_TIMEOUT))?;
    let mut reader = BufReader::new(connection.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut header = String::new();
    loop {
        header.clear();
        if reader.read_line(&mut header)? == 0 || header == "\r\n" || header == "\n" {
            break;
        }
    }
    Ok(FirstRequest {
        at: Instant::now(),
        line: line.trim_end().to_owned(),
        _connection: connection,
    })
}

/// A started function, killed (and reaped) when dropped, whatever happened.
struct Running(Child);

impl Running {
    /// Kills the process and returns what it wrote (stdout, then stderr), for an error.
    fn kill_and_output(mut self) -> String {
        let _ = self.0.kill();
        let _ = self.0.wait();
        let mut out = String::new();
        if let Some(mut s) = self.0.stdout.take() {
            let _ = s.read_to_string(&mut out);
        }
        if let Some(mut s) = self.0.stderr.take() {
            let _ = s.read_to_string(&mut out);
        }
        out
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One cold start of `binary` as `function`: the time from its spawn to its first request
/// for an invocation on a fresh stand-in Runtime API. Fails, with what the process wrote,
/// if it exits first, asks for something else, or takes longer than 20 s.
pub fn cold_start(function: &Function, binary: &Path) -> anyhow::Result<Duration> {
    let api = RuntimeApi::start()?;
    let mut command = Command::new(binary);
    command
        .env_clear()
        .envs(lambda_env(function, api.addr()))
        .current_dir(binary.parent().unwrap_or(Path::new(".")))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let spawned = Instant::now();
    let mut child = Running(
        command
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?,
    );
    loop {
        match api.first_request(Duration::from_millis(20)) {
            Some(Ok(request)) => {
                let took = request.at.duration_since(spawned);
                let line = request.line.clone();
                if !line.starts_with(&format!("GET {NEXT} ")) {
                    let out = child.kill_and_output();
                    anyhow::bail!(
                        "{} asked {line:?} before asking for an invocation; it wrote:\n{out}",
                        function.name
                    );
                }
                drop(child);
                drop(request);
                return Ok(took);
            }
            Some(Err(e)) => {
                let out = child.kill_and_output();
                anyhow::bail!(
                    "{}: reading its first request: {e}; it wrote:\n{out}",
                    function.name
                );
            }
            None => {
                let exited = child
                    .0
                    .try_wait()
                    .with_context(|| format!("waiting for {}", binary.display()))?;
                if let Some(status) = exited {
                    let out = child.kill_and_output();
                    anyhow::bail!(
                        "{} ({}) exited ({status}) before asking for an invocation; it wrote:\n{out}",
                        function.name,
                        binary.display()
                    );
                }
                if spawned.elapsed() > START_TIMEOUT {
                    let out = child.kill_and_output();
                    anyhow::bail!(
                        "{} did not ask for an invocation within {START_TIMEOUT:?}; it wrote:\n{out}",
                        function.name
                    );
                }
            }
        }
    }
}

/// What one function's row shows: its cold starts (ms, sorted; none when its binary is
/// missing), the host binary's size and the arm64 `bootstrap`'s.
pub struct Row {
    pub function: &'static Function,
    pub starts_ms: Vec<f64>,
    pub host_bytes: Option<u64>,
    pub arm64_bytes: Option<u64>,
}

/// Measures every function whose binary is in `functions_dir`, `runs` cold starts each, one
/// after the other, and looks up the arm64 sizes in `sam_build`.
pub fn measure(functions_dir: &Path, sam_build: &Path, runs: usize) -> anyhow::Result<Vec<Row>> {
    anyhow::ensure!(runs > 0, "--init-runs must be at least 1");
    let mut rows = Vec::new();
    for function in &FUNCTIONS {
        let binary = functions_dir.join(function.binary);
        let host_bytes = std::fs::metadata(&binary).ok().map(|m| m.len());
        let mut starts_ms = Vec::new();
        if host_bytes.is_some() {
            eprintln!("  {} ({runs} cold starts)…", function.name);
            for _ in 0..runs {
                starts_ms.push(cold_start(function, &binary)?.as_secs_f64() * 1e3);
            }
            starts_ms.sort_by(f64::total_cmp);
        }
        let arm64_bytes = function
            .sam_dirs
            .iter()
            .find_map(|d| std::fs::metadata(sam_build.join(d).join("bootstrap")).ok())
            .map(|m| m.len());
        rows.push(Row {
            function,
            starts_ms,
            host_bytes,
            arm64_bytes,
        });
    }
    Ok(rows)
}

/// When the last `sam build` under `sam_build` was made (its newest `bootstrap`).
pub fn sam_built_at(sam_build: &Path) -> Option<chrono::DateTime<chrono::Utc>> {
    std::fs::read_dir(sam_build)
        .ok()?
        .flatten()
        .filter_map(|d| {
            std::fs::metadata(d.path().join("bootstrap"))
                .ok()?
                .modified()
                .ok()
        })
        .max()
        .map(chrono::DateTime::<chrono::Utc>::from)
}

/// The section's text: what was measured, the table, and what is missing.
pub fn report(
    rows: &[Row],
    runs: usize,
    functions_dir: &Path,
    sam_build: &Path,
    built: Option<chrono::DateTime<chrono::Utc>>,
) -> String {
    let arch = std::env::consts::ARCH;
    let mut out = format!(
        "Cold-start init per function: each function's binary built for this machine ({arch} Linux, `cargo build --release`: the Lambdas' release profile, opt-level s, fat LTO, stripped; not the arm64 build Lambda runs) started {runs} times as Lambda starts a custom runtime: its Lambda environment (256 MB, the region, credentials as environment variables, no instance metadata), the template's variables with dummy values, every endpoint on a loopback stand-in of the Runtime API. Timed from the spawn to its first `GET {NEXT}`: the process's start and load, the Tokio runtime, and what its `main` does before it serves (configuration, the SDK's configuration from the environment, every client, the runtime client's connection). Not included: Lambda's own sandbox start and code download (here the binary is in the page cache after the first run), the first invocation's work (credentials resolved, TLS connections opened on first use), and Lambda's CPU share (in proportion to memory: 1,769 MB is one vCPU, so 256 MB is a fraction of one, on Graviton).\n\n"
    );
    out.push_str("| function | binary | cold-start init p50 | max | host binary | arm64 bootstrap |\n|---|---|---|---|---|---|\n");
    let mib = |b: Option<u64>| {
        b.map_or("—".to_owned(), |b| {
            format!("{:.2} MiB", b as f64 / 1048576.0)
        })
    };
    for row in rows {
        let (p50, max) = if row.starts_ms.is_empty() {
            ("—".to_owned(), "—".to_owned())
        } else {
            (
                format!("{:.1} ms", sas_local::lag::quantile(&row.starts_ms, 0.5)),
                format!("{:.1} ms", sas_local::lag::quantile(&row.starts_ms, 1.0)),
            )
        };
        out.push_str(&format!(
            "| {} | `{}` | {p50} | {max} | {} | {} |\n",
            row.function.name,
            row.function.binary,
            mib(row.host_bytes),
            mib(row.arm64_bytes)
        ));
    }
    let mut missing: Vec<&str> = rows
        .iter()
        .filter(|r| r.host_bytes.is_none())
        .map(|r| r.function.binary)
        .collect();
    missing.dedup();
    if !missing.is_empty() {
        out.push_str(&format!(
            "\nNo {} in `{}`: build them first (`cargo build --release{}`) and pass their folder as `--functions-dir`.\n",
            missing
                .iter()
                .map(|b| format!("`{b}`"))
                .collect::<Vec<_>>()
                .join(", "),
            functions_dir.display(),
            missing
                .iter()
                .map(|b| format!(" -p {b}"))
                .collect::<String>()
        ));
    }
    match built {
        None => out.push_str(&format!(
            "\nNo `{}` here: run `./infra/test.sh` (its `sam build` step) first for the arm64 sizes.\n",
            sam_build.display()
        )),
        Some(t) => out.push_str(&format!(
            "\narm64 `bootstrap` sizes from the `sam build` made at {} (cargo-lambda, the same release profile); the task API and the operator API deploy one binary.\n",
            t.format("%Y-%m-%d %H:%M UTC")
        )),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    /// The stand-in Runtime API records a runtime's first request, its line and when its head
    /// arrived, and holds the connection open.
    #[test]
    fn the_runtime_api_records_the_first_request() {
        let api = RuntimeApi::start().expect("a listener");
        let before = Instant::now();
        let mut runtime = TcpStream::connect(api.addr()).expect("a connection");
        assert!(
            api.first_request(Duration::from_millis(50)).is_none(),
            "no request yet"
        );
        write!(
            runtime,
            "GET {NEXT} HTTP/1.1\r\nhost: {}\r\nuser-agent: test\r\n\r\n",
            api.addr()
        )
        .expect("a request");
        let first = api
            .first_request(Duration::from_secs(5))
            .expect("a request within 5 s")
            .expect("read");
        assert_eq!(first.line, format!("GET {NEXT} HTTP/1.1"));
        assert!(first.at > before);
        // Held open: nothing comes back while the runtime waits.
        runtime
            .set_read_timeout(Some(Duration::from_millis(50)))
            .expect("a timeout");
        let mut buf = [0u8; 1];
        let read = runtime.read(&mut buf);
        assert!(
            read.is_err(),
            "the connection stays open, unanswered: {read:?}"
        );
    }

    /// A Runtime API no one called ends its thread when dropped.
    #[test]
    fn an_unused_runtime_api_ends() {
        let api = RuntimeApi::start().expect("a listener");
        drop(api);
    }

    /// Every function gets the Lambda variables the runtime crate needs, and its own endpoints
    /// on the stand-in's loopback address.
    #[test]
    fn the_environment_is_lambdas_and_loopback() {
        let addr: SocketAddr = "127.0.0.1:9001".parse().expect("an address");
        for f in &FUNCTIONS {
            let env: std::collections::HashMap<_, _> = lambda_env(f, addr).into_iter().collect();
            for k in [
                "AWS_LAMBDA_FUNCTION_NAME",
                "AWS_LAMBDA_FUNCTION_MEMORY_SIZE",
                "AWS_LAMBDA_FUNCTION_VERSION",
                "TABLE_NAME",
                "PAYLOAD_BUCKET",
            ] {
                assert!(env.contains_key(k), "{}: {k}", f.name);
            }
            assert_eq!(env["AWS_LAMBDA_RUNTIME_API"], "127.0.0.1:9001");
            for (k, v) in &env {
                assert!(
                    !v.contains("{endpoint}") && !v.contains("amazonaws"),
                    "{}: {k}={v}",
                    f.name
                );
                if v.contains("://") {
                    assert!(
                        v.starts_with("http://127.0.0.1:9001"),
                        "{}: {k}={v}",
                        f.name
                    );
                }
            }
        }
    }
}
