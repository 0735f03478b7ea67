//! `sas-local`: the four functions in one process.
//!
//! - `sas-local` (or `sas-local serve`): publishes the definitions of a folder (`--workflows`,
//!   default `workflows/`), serves the HTTP API on 127.0.0.1:3000, polls the queues as Lambda's
//!   event-source mappings would, runs the supervisor every second, with simulated services.
//!   In-memory by default; `--aws` uses the AWS adapters at `AWS_ENDPOINT_URL`.
//! - `sas-local demo`: the same system on an ephemeral port, N tasks of the example workflows
//!   submitted over HTTP with faults on, a progress bar and a summary (processed, compensated,
//!   recovered, lost, doubled effects).
//! - `sas-local timer-lag`: measures how long after their time waits due at once end.
//! - `sas-local recovery-lag`: measures how long after a deadline a step is dispatched again,
//!   with deadline timers and with the sweep alone.

use anyhow::{Context, bail};
use clap::{Args, Parser, Subcommand};
use futures::StreamExt;
use indicatif::{ProgressBar, ProgressStyle};
use sas::ports::{Clock, SystemClock};
use sas::remote::Faults;
use sas_local::{Backend, Settings, System};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(
    name = "sas-local",
    version,
    about = "Run the sas functions locally: in memory by default, or on AWS APIs"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    opts: Opts,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the HTTP API and run the scheduler, agents and supervisor (the default).
    Serve {
        /// Address of the HTTP API.
        #[arg(long, default_value = "127.0.0.1:3000", env = "SAS_LISTEN")]
        listen: SocketAddr,
        /// Another host name the HTTP API answers to (repeatable); besides it, only
        /// `localhost`, loopback addresses and the listen address (against DNS rebinding).
        #[arg(long = "allow-host", env = "SAS_ALLOW_HOSTS", value_delimiter = ',')]
        allow_hosts: Vec<String>,
        #[command(flatten)]
        auth: AuthOpts,
        /// First make example tasks in every state (Processed, Refused, Error, Resolved,
        /// CompensationFailed, ...; the Pending one starts an hour later), to look around the
        /// console at /console.
        #[arg(long, env = "SAS_SHOWCASE")]
        showcase: bool,
        /// Keep the tasks, their history and the published definitions in this folder (an
        /// SQLite file, made if missing) across restarts; the queues stay in memory and the
        /// supervisor recovers what they held. Default: everything in memory.
        #[arg(long, value_name = "DIR", env = "SAS_DATA")]
        data: Option<std::path::PathBuf>,
    },
    /// Print a JWT for the task API in `--auth jwt` mode, signed by the local issuer.
    Token {
        /// The caller (`sub`).
        #[arg(long)]
        sub: String,
        /// Scopes to grant (repeatable).
        #[arg(long = "scope")]
        scopes: Vec<String>,
        /// How long it is valid (e.g. `1h`, `15m`).
        #[arg(long, default_value = "1h")]
        ttl: humantime::Duration,
        #[command(flatten)]
        issuer: IssuerOpts,
    },
    /// Submit tasks of the example workflows (e-commerce orders and loan applications, taking
    /// turns) through the HTTP API with faults on and print a summary.
    Demo {
        /// How many tasks to submit.
        #[arg(long, default_value_t = 1000)]
        tasks: usize,
        /// Requests in flight at once.
        #[arg(long, default_value_t = 32)]
        concurrency: usize,
        /// Give up waiting for tasks to finish after this many seconds.
        #[arg(long, default_value_t = 300)]
        timeout_secs: u64,
        /// Run without injected faults.
        #[arg(long)]
        no_faults: bool,
    },
    /// Measure recovery lag (a step's deadline passed → the step dispatched again), with
    /// deadline timers and with the sweep alone; prints a markdown table.
    RecoveryLag {
        /// Tasks whose first step overruns its deadline.
        #[arg(long, default_value_t = 200)]
        tasks: usize,
        /// The sweep's interval in the sweep-only run, in milliseconds.
        #[arg(long, default_value_t = 1000)]
        sweep_ms: u64,
    },
    /// Measure timer lag (a wait's time → the wait ended) for waits all due at once: short ones
    /// (their timers armed as they began) and 20-minute ones (armed by the sweep's look-ahead);
    /// prints a markdown table.
    TimerLag {
        /// Waits due at the same instant.
        #[arg(long, default_value_t = 1000)]
        waits: usize,
    },
}

/// How the local task API authenticates, as a deployed stack's `ApiAuth` does.
#[derive(Args, Clone)]
struct AuthOpts {
    /// `none` (every request is the caller `anonymous`), `iam` (SigV4, checked against
    /// `--users`) or `jwt` (bearer tokens of the local issuer; `sas-local token` makes them).
    #[arg(long, default_value = "none", env = "SAS_AUTH")]
    auth: sas::auth::AuthMode,
    /// Local IAM users: a JSON list of `{"accessKeyId", "secretAccessKey", "arn"}`. Needed by
    /// `--auth iam`; when given, the operator API (`/operator`) needs SigV4 too.
    #[arg(long, env = "SAS_USERS")]
    users: Option<std::path::PathBuf>,
    /// Scopes of which a token needs one to start or cancel tasks (`--auth jwt`).
    #[arg(long = "write-scope", env = "SAS_WRITE_SCOPES", value_delimiter = ',')]
    write_scopes: Vec<String>,
    /// Scopes of which a token needs one to read tasks (`--auth jwt`).
    #[arg(long = "read-scope", env = "SAS_READ_SCOPES", value_delimiter = ',')]
    read_scopes: Vec<String>,
    /// Requests a second each caller may make to the task API (0: no limit), as the
    /// template's CallerRatePerSecond; over it, 429 with Retry-After. Default:
    /// `CALLER_RATE_PER_SECOND`, else no limit.
    #[arg(long)]
    caller_rate: Option<f64>,
    /// Requests each caller may make at once before `--caller-rate` applies (default:
    /// `CALLER_BURST`, else 100).
    #[arg(long)]
    caller_burst: Option<u32>,
    #[command(flatten)]
    issuer: IssuerOpts,
}

/// The local JWT issuer.
#[derive(Args, Clone)]
struct IssuerOpts {
    /// Where the local issuer's key pair is kept (made on first use).
    #[arg(long, default_value = ".sas-local/issuer.json", env = "SAS_ISSUER")]
    issuer_file: std::path::PathBuf,
    /// The tokens' audience.
    #[arg(long, default_value = "sas-local", env = "SAS_AUDIENCE")]
    audience: String,
}

const LOCAL_ISSUER: &str = "https://sas-local.invalid/issuer";

fn region() -> String {
    std::env::var("AWS_REGION")
        .or_else(|_| std::env::var("AWS_DEFAULT_REGION"))
        .unwrap_or_else(|_| "us-east-1".into())
}

/// The task API's and the operator API's local authorizers.
fn local_auth(
    opts: &AuthOpts,
) -> anyhow::Result<(sas_local::auth::LocalAuth, sas_local::auth::LocalAuth)> {
    use sas::auth::AuthMode;
    use sas_local::auth::{JwtCheck, LocalAuth, SigV4Check, TestIssuer};
    let iam = match &opts.users {
        Some(path) => Some(LocalAuth::Iam(Arc::new(SigV4Check::from_file(path)?))),
        None => None,
    };
    let api = match opts.auth {
        AuthMode::None => LocalAuth::None,
        AuthMode::Iam => iam
            .clone()
            .context("--auth iam needs --users FILE (the local access keys)")?,
        AuthMode::Jwt => {
            let issuer = TestIssuer::load_or_create(&opts.issuer.issuer_file, LOCAL_ISSUER)?;
            LocalAuth::Jwt(Arc::new(
                JwtCheck::new(
                    issuer.issuer.clone(),
                    vec![opts.issuer.audience.clone()],
                    issuer.jwks().clone(),
                )
                .with_scopes(opts.write_scopes.clone(), opts.read_scopes.clone()),
            ))
        }
    };
    Ok((api, iam.unwrap_or(LocalAuth::None)))
}

#[derive(Args)]
struct Opts {
    /// Use the AWS adapters (DynamoDB, SQS, EventBridge) at AWS_ENDPOINT_URL, creating the
    /// table, queues and bus if missing.
    #[arg(long, global = true, env = "SAS_AWS")]
    aws: bool,
    /// Name prefix of the AWS resources.
    #[arg(long, global = true, default_value = "sas-local", env = "SAS_PREFIX")]
    prefix: String,
    /// A folder of definitions (workflows and services, YAML or JSON) to publish at start.
    /// Default: `workflows/` if there is one here, else the examples built in.
    #[arg(long, global = true, env = "SAS_WORKFLOWS")]
    workflows: Option<std::path::PathBuf>,
    /// Share of calls to every simulated service failing transiently.
    #[arg(long, global = true, env = "SAS_TRANSIENT_RATE")]
    transient_rate: Option<f64>,
    /// Share of steps a remote service refuses for good.
    #[arg(long, global = true, env = "SAS_PERMANENT_RATE")]
    permanent_rate: Option<f64>,
    /// Share of calls whose effect happens but whose response is lost.
    #[arg(long, global = true, env = "SAS_LOST_RESPONSE_RATE")]
    lost_response_rate: Option<f64>,
    /// Latency of every remote call, in milliseconds.
    #[arg(long, global = true, env = "SAS_LATENCY_MS")]
    latency_ms: Option<u64>,
    /// The `--outage-service` is down from this many seconds after start...
    #[arg(long, global = true, env = "SAS_OUTAGE_AFTER_SECS")]
    outage_after_secs: Option<u64>,
    /// ...for this many seconds.
    #[arg(long, global = true, env = "SAS_OUTAGE_SECS")]
    outage_secs: Option<u64>,
    /// The service the outage takes down.
    #[arg(
        long,
        global = true,
        default_value = "payment",
        env = "SAS_OUTAGE_SERVICE"
    )]
    outage_service: String,
    /// Deadline of each step, in seconds (default: `STEP_TIMEOUT_SECONDS`, else 5).
    #[arg(long, global = true)]
    step_timeout_secs: Option<f64>,
    /// Expired deadlines before a task fails for good (a workflow's steps may set their own;
    /// default: `FAILURE_THRESHOLD`, else 3).
    #[arg(long, global = true)]
    failure_threshold: Option<u32>,
    /// The only Secrets Manager secrets and SSM parameters services' credentials are read
    /// from (names under it), as the template's SecretsPrefix lets the deployed agent read.
    #[arg(long, global = true, env = "SAS_SECRETS_PREFIX", default_value = sas_local::LOCAL_SECRETS_PREFIX)]
    secrets_prefix: String,
    /// How often the supervisor sweeps, in milliseconds.
    #[arg(
        long,
        global = true,
        default_value_t = 1000,
        env = "SUPERVISOR_INTERVAL_MS"
    )]
    supervisor_interval_ms: u64,
}

/// The demo's fault mix: every kind of fault, often enough to show each recovery path.
fn demo_faults() -> Faults {
    Faults {
        latency: Duration::from_millis(2),
        transient_rate: 0.2,
        permanent_rate: 0.005,
        lost_response_rate: 0.05,
        ..Faults::default()
    }
}

/// The settings from the functions' variables (local defaults for what is unset), then the
/// flags.
fn settings(
    opts: &Opts,
    base_faults: Faults,
    outage_default: Option<(u64, u64)>,
) -> anyhow::Result<Settings> {
    let vars = sas::config::Vars::Process;
    let mut s = Settings::from_vars(&vars)?;
    if let Some(secs) = opts.step_timeout_secs {
        let ms = (secs * 1000.0) as i64;
        s.policy.step_timeout = chrono::Duration::milliseconds(ms);
        if !vars.is_set("PICKUP_TIMEOUT_SECONDS") {
            s.policy.pickup_timeout = chrono::Duration::milliseconds(ms * 2);
        }
    }
    if let Some(n) = opts.failure_threshold {
        s.policy.failure_threshold = n.max(1);
    }
    sas::remote::check_prefix(&opts.secrets_prefix).map_err(anyhow::Error::msg)?;
    s.secrets_prefix = Some(opts.secrets_prefix.clone());
    s.supervisor_interval = Duration::from_millis(opts.supervisor_interval_ms.max(10));
    let faults = Faults {
        latency: opts
            .latency_ms
            .map_or(base_faults.latency, Duration::from_millis),
        transient_rate: opts.transient_rate.unwrap_or(base_faults.transient_rate),
        permanent_rate: opts.permanent_rate.unwrap_or(base_faults.permanent_rate),
        lost_response_rate: opts
            .lost_response_rate
            .unwrap_or(base_faults.lost_response_rate),
        ..Faults::default()
    };
    let now = SystemClock.now();
    let outage = match (opts.outage_after_secs, opts.outage_secs) {
        (Some(a), Some(l)) => Some((a, l)),
        (None, None) => outage_default,
        _ => None,
    }
    .map(|(after, len)| {
        let from = now + chrono::Duration::seconds(after as i64);
        (from, from + chrono::Duration::seconds(len as i64))
    });
    s.default_faults = faults.clone();
    if outage.is_some() {
        s.faults
            .insert(opts.outage_service.clone(), Faults { outage, ..faults });
    }
    s.definitions = match &opts.workflows {
        Some(dir) => sas::catalog::read_folder(dir).unwrap_or_default(),
        None => match sas::catalog::read_folder(std::path::Path::new("workflows")) {
            Ok(files) if !files.is_empty() => files,
            _ => sas::catalog::example_files(),
        },
    };
    Ok(s)
}

/// The effective settings, by the functions' variable names (`*`: from the environment), a few
/// a line.
fn describe(settings: &Settings) -> String {
    let vars = sas::config::Vars::Process;
    let mut out = String::from(
        "settings (the functions' variables; * set in the environment, else sas-local's default):",
    );
    let mut line = String::new();
    for (name, value) in settings.describe() {
        let star = if vars.is_set(name) { "*" } else { "" };
        let item = format!(" {name}={value}{star}");
        if line.len() + item.len() > 96 {
            out.push_str(&format!("\n {line}"));
            line.clear();
        }
        line.push_str(&item);
    }
    out.push_str(&format!(
        "\n {line}\n secrets and parameters read only under {:?}",
        settings.secrets_prefix.as_deref().unwrap_or("")
    ));
    out
}

/// The AWS configuration real services are reached with (credentials, Lambda): the SDK's,
/// with the region from the environment or the profile, else `us-east-1`, never asked of
/// instance metadata (whose failure on a laptop the SDK logs as warnings at every start).
async fn local_sdk_config() -> aws_config::SdkConfig {
    use aws_config::meta::region::RegionProviderChain;
    let region = RegionProviderChain::first_try(
        aws_config::environment::EnvironmentVariableRegionProvider::new(),
    )
    .or_else(aws_config::profile::ProfileFileRegionProvider::new())
    .or_else(aws_config::Region::new(region()));
    aws_config::defaults(aws_config::BehaviorVersion::latest())
        .region(region)
        .load()
        .await
}

async fn backend(opts: &Opts) -> Backend {
    if opts.aws {
        Backend::Aws {
            config: Box::new(sas::aws::sdk_config().await),
            prefix: opts.prefix.clone(),
        }
    } else {
        Backend::Memory
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = parse_args(std::env::args_os().collect()).unwrap_or_else(|e| e.exit());
    let command = match cli.command {
        Some(c) => c,
        None => Cli::parse_from(["sas-local", "serve"])
            .command
            .context("the default command")?,
    };
    match command {
        Command::Serve {
            listen,
            allow_hosts,
            auth,
            showcase,
            data,
        } => {
            sas::telemetry::init();
            let how = Serve {
                listen,
                allow_hosts,
                showcase,
                data,
            };
            serve(&cli.opts, how, &auth).await
        }
        Command::Token {
            sub,
            scopes,
            ttl,
            issuer,
        } => {
            let local =
                sas_local::auth::TestIssuer::load_or_create(&issuer.issuer_file, LOCAL_ISSUER)?;
            let scopes: Vec<&str> = scopes.iter().map(String::as_str).collect();
            let ttl = chrono::Duration::from_std(*ttl)?;
            println!(
                "{}",
                local.token(&sub, &issuer.audience, &scopes, chrono::Utc::now(), ttl)?
            );
            Ok(())
        }
        Command::Demo {
            tasks,
            concurrency,
            timeout_secs,
            no_faults,
        } => {
            // The progress bars and the summary are the demo's output; only errors are logged.
            sas::telemetry::init_with_default("error");
            let (faults, outage) = if no_faults {
                (Faults::default(), None)
            } else {
                (demo_faults(), Some((0, 3)))
            };
            let mut opts = cli.opts;
            if !no_faults
                && opts.step_timeout_secs.is_none()
                && !sas::config::Vars::Process.is_set("STEP_TIMEOUT_SECONDS")
            {
                opts.step_timeout_secs = Some(2.0);
            }
            demo(&opts, faults, outage, tasks, concurrency, timeout_secs).await
        }
        Command::RecoveryLag { tasks, sweep_ms } => {
            sas::telemetry::init_with_default("error");
            print!("{}", sas_local::lag::table(tasks, sweep_ms).await?);
            Ok(())
        }
        Command::TimerLag { waits } => {
            sas::telemetry::init_with_default("error");
            print!("{}", sas_local::lag::timer_table(waits).await?);
            Ok(())
        }
    }
}

/// Where and how `serve` runs (its flags besides authentication).
struct Serve {
    listen: SocketAddr,
    allow_hosts: Vec<String>,
    showcase: bool,
    data: Option<std::path::PathBuf>,
}

async fn serve(opts: &Opts, how: Serve, auth: &AuthOpts) -> anyhow::Result<()> {
    let Serve {
        listen,
        allow_hosts,
        showcase,
        data,
    } = how;
    if data.is_some() && opts.aws {
        bail!("--data keeps the local store in a folder and --aws uses DynamoDB: give one of them");
    }
    if let Some(dir) = &opts.workflows {
        sas::catalog::read_folder(dir)
            .with_context(|| format!("reading the definitions in {}", dir.display()))?;
    }
    // Without authentication anyone who reaches the port is every caller and the operator:
    // only this machine may.
    if auth.auth == sas::auth::AuthMode::None && !listen.ip().is_loopback() {
        bail!(
            "--auth none serves only a loopback address (not {listen}): give --auth iam or jwt (with --users) to listen there"
        );
    }
    let mut settings = settings(opts, Faults::default(), None)?;
    settings.allowed_hosts = allow_hosts;
    (settings.api_auth, settings.operator_auth) = local_auth(auth)?;
    if auth.caller_rate.is_some() || auth.caller_burst.is_some() {
        let per_second = auth
            .caller_rate
            .or(settings.rate_limit.map(|r| r.per_second))
            .unwrap_or(0.0);
        let burst = auth
            .caller_burst
            .or(settings.rate_limit.map(|r| r.burst))
            .unwrap_or(100);
        settings.rate_limit = (per_second > 0.0).then_some(sas::domain::rate::RateLimit {
            per_second,
            burst: burst.max(1),
        });
    }
    println!("{}", describe(&settings));
    // Services declared as real ones reach them as the agent does: credentials from Secrets
    // Manager or SSM and Lambda functions, through this environment's AWS configuration.
    let sdk = local_sdk_config().await;
    settings.credentials = Arc::new(sas::aws::AwsCredentials::from_config(&sdk));
    settings.lambda = Some(sas::aws::lambda_client(&sdk));
    let backend = match &data {
        Some(dir) => Backend::Data(dir.clone()),
        None => backend(opts).await,
    };
    let mut system = System::new(backend, settings, Arc::new(SystemClock))
        .await
        .context("building the system")?;
    let bound = system
        .serve(listen)
        .await
        .map_err(|e| listen_error(e, listen))?;
    if showcase {
        let made = sas_local::showcase::tasks_in_every_state(&system)
            .await
            .context("making the showcase's tasks (it needs the example workflows)")?;
        let count: usize = made.values().map(Vec::len).sum();
        println!(
            "showcase: {count} example tasks in every state; the console: http://{bound}/console"
        );
    }
    system.start();
    let workflows: Vec<String> = system
        .definitions
        .catalog()
        .entries(sas::ports::Kind::Workflow)
        .await?
        .into_iter()
        .map(|e| format!("{} v{}", e.name, e.latest))
        .collect();
    let published = if workflows.is_empty() {
        format!(
            "no workflow: {} holds no workflow definition (.yaml, .yml or .json; sasctl workflow apply publishes some)",
            opts.workflows
                .as_deref()
                .unwrap_or(std::path::Path::new("workflows"))
                .display()
        )
    } else {
        workflows.join(", ")
    };
    let example = try_it(
        &auth.auth,
        &auth.issuer.issuer_file,
        &bound.to_string(),
        workflows.iter().any(|w| w.starts_with("loan-application ")),
    );
    let how = match auth.auth {
        sas::auth::AuthMode::None => {
            "no authentication (--auth none): every request is the caller `anonymous`".to_owned()
        }
        sas::auth::AuthMode::Iam => "SigV4 (--auth iam) with the keys in --users".to_owned(),
        sas::auth::AuthMode::Jwt => format!(
            "bearer JWTs (--auth jwt) of the local issuer ({})",
            auth.issuer.issuer_file.display()
        ),
    };
    println!(
        "task API: {how}; operator API: http://{bound}/operator ({})",
        match (&auth.auth, auth.users.is_some()) {
            (_, true) => "SigV4 with the keys in --users",
            (sas::auth::AuthMode::None, false) => "no authentication",
            (_, false) => "closed: give --users to open it with SigV4",
        }
    );
    println!(
        "sas is running ({}) on http://{bound} with {}\n{example}Ctrl-C stops it.",
        match &data {
            _ if opts.aws => "AWS adapters".to_owned(),
            Some(dir) => format!(
                "kept in {}",
                dir.join(sas_local::sqlite::DATA_FILE).display()
            ),
            None => "in memory".to_owned(),
        },
        published
    );
    tokio::signal::ctrl_c().await?;
    system.shutdown().await;
    Ok(())
}

/// The banner's commands to try: start a task (a loan, if published) and read the caller's
/// tasks, each authenticated as `auth` wants (signed under `iam`, with a token of the local
/// issuer under `jwt`): a command the banner suggests works as printed.
fn try_it(
    auth: &sas::auth::AuthMode,
    issuer_file: &std::path::Path,
    bound: &str,
    loan: bool,
) -> String {
    use sas::auth::AuthMode;
    let with = match auth {
        AuthMode::None => String::new(),
        AuthMode::Iam => format!(
            " --aws-sigv4 aws:amz:{}:execute-api --user \"$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY\"",
            region()
        ),
        AuthMode::Jwt => format!(
            " -H \"authorization: Bearer $(sas-local token --sub alice --issuer-file {})\"",
            issuer_file.display()
        ),
    };
    let keys = match auth {
        AuthMode::Iam => {
            "  (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY: the keys of a user in --users)\n"
        }
        _ => "",
    };
    let start = if loan {
        format!(
            "  curl -s{with} -XPOST http://{bound}/workflows/loan-application/tasks -H 'content-type: application/json' \\\n    -d '{{\"applicantId\":\"a-1\",\"amount\":25000,\"currency\":\"EUR\"}}'\n"
        )
    } else {
        format!(
            "  curl -s{with} -XPOST http://{bound}/workflows/<workflow>/tasks -H 'content-type: application/json' -d '<input>'\n"
        )
    };
    format!("{keys}{start}  curl -s{with} http://{bound}/tasks\n")
}

/// Why the HTTP API cannot listen on `listen`, naming the address and the flag that moves it.
fn listen_error(e: anyhow::Error, listen: SocketAddr) -> anyhow::Error {
    let in_use = e
        .downcast_ref::<std::io::Error>()
        .is_some_and(|io| io.kind() == std::io::ErrorKind::AddrInUse);
    if in_use {
        anyhow::anyhow!(
            "{listen} is already in use (another sas-local?): stop it, or serve on another address with --listen ADDR (env SAS_LISTEN), e.g. sas-local serve --listen 127.0.0.1:3001"
        )
    } else {
        e.context(format!(
            "cannot listen on {listen} (--listen ADDR, env SAS_LISTEN)"
        ))
    }
}

/// The command line, with `serve`'s flags taken without `serve` (the default subcommand),
/// and a flag of another subcommand named with that subcommand.
fn parse_args(args: Vec<std::ffi::OsString>) -> Result<Cli, clap::Error> {
    use clap::CommandFactory;
    let e = match Cli::try_parse_from(&args) {
        Ok(cli) => return Ok(cli),
        Err(e) => e,
    };
    if e.kind() != clap::error::ErrorKind::UnknownArgument {
        return Err(e);
    }
    let command = Cli::command();
    let names: Vec<&str> = command.get_subcommands().map(|c| c.get_name()).collect();
    let named = args
        .iter()
        .skip(1)
        .any(|a| a.to_str().is_some_and(|a| names.contains(&a)));
    if !named {
        // No subcommand: the flags may be serve's.
        let mut with_serve = args.clone();
        with_serve.insert(1.min(args.len()), "serve".into());
        if let Ok(cli) = Cli::try_parse_from(&with_serve) {
            return Ok(cli);
        }
    }
    let flag = match e.get(clap::error::ContextKind::InvalidArg) {
        Some(clap::error::ContextValue::String(f)) => f.split('=').next().unwrap_or(f).to_owned(),
        _ => return Err(e),
    };
    let owner = command.get_subcommands().find(|c| {
        c.get_arguments()
            .any(|a| a.get_long().is_some_and(|l| format!("--{l}") == flag))
    });
    match owner {
        Some(sub) => {
            let mut command = Cli::command();
            Err(command.error(
                clap::error::ErrorKind::UnknownArgument,
                format!(
                    "{flag} is a flag of `sas-local {0}`: give it after the subcommand, as in `sas-local {0} {flag} ...`",
                    sub.get_name()
                ),
            ))
        }
        None => Err(e),
    }
}

/// A progress bar labelled `label`, ending with `stats` (indicatif template keys).
fn progress(len: usize, label: &'static str, stats: &str) -> anyhow::Result<ProgressBar> {
    let style = ProgressStyle::with_template(&format!(
        "{{msg:>10}} [{{bar:40}}] {{pos}}/{{len}} ({stats})"
    ))
    .map_err(|e| anyhow::anyhow!("{e}"))?
    .progress_chars("=> ");
    let bar = ProgressBar::new(len as u64);
    bar.set_style(style);
    bar.set_message(label);
    Ok(bar)
}

#[derive(Default)]
struct Tally {
    processed: usize,
    compensated: usize,
    refused: usize,
    compensation_failed: usize,
    error: usize,
    retried: usize,
    /// Task id → final state.
    finals: HashMap<String, String>,
    /// Task id → the steps its workflow can undo.
    undoable: HashMap<String, Vec<String>>,
}

/// The demo's applicant signs loan `id` at once: the e-sign webhook's `contract-signed`, kept
/// for the signature step, under one `Event-Id` (so a retry is harmless). Contention (`409
/// conflict`) is tried again; a loan that ended before its signature (its credit check refused,
/// under the demo's faults) refuses the event (`409 event_refused`), which is its outcome.
async fn sign(
    http: &reqwest::Client,
    base: &str,
    id: &str,
    i: usize,
    signer: &serde_json::Value,
) -> anyhow::Result<()> {
    for attempt in 0..10u64 {
        let resp = http
            .post(format!("{base}/tasks/{id}/events/contract-signed"))
            .header("event-id", format!("demo-sign-{i}"))
            .json(&serde_json::json!({ "signedBy": signer }))
            .send()
            .await;
        let Ok(resp) = resp else {
            tokio::time::sleep(Duration::from_millis(20 * (attempt + 1))).await;
            continue;
        };
        let status = resp.status();
        if status.is_success() {
            return Ok(());
        }
        let v: serde_json::Value = resp.json().await.unwrap_or_default();
        match v["error"]["code"].as_str() {
            Some("event_refused") => return Ok(()),
            Some("conflict") => {}
            _ if status.is_server_error() => {}
            _ => bail!("contract-signed answered {status}: {v}"),
        }
        tokio::time::sleep(Duration::from_millis(20 * (attempt + 1))).await;
    }
    bail!("contract-signed for {id} kept meeting contention")
}

async fn demo(
    opts: &Opts,
    faults: Faults,
    outage: Option<(u64, u64)>,
    n: usize,
    concurrency: usize,
    timeout_secs: u64,
) -> anyhow::Result<()> {
    let settings = settings(opts, faults, outage)?;
    let mut system = System::new(backend(opts).await, settings, Arc::new(SystemClock)).await?;
    let addr = system.serve(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
    system.start();
    let base = format!("http://{addr}");
    let http = reqwest::Client::new();
    let started = Instant::now();

    let bar = progress(n, "submitted", "{per_sec}, {elapsed}")?;
    let submitted: Vec<anyhow::Result<String>> = futures::stream::iter(0..n)
        .map(|i| {
            let (http, base, bar) = (http.clone(), base.clone(), bar.clone());
            async move {
                let (workflow, body) = if i % 2 == 0 {
                    (
                        "ecommerce-order",
                        serde_json::json!({
                            "customerId": format!("demo-{}", i % 97),
                            "items": [{"sku": format!("SKU-{}", i % 13), "quantity": 1 + i % 5}],
                        }),
                    )
                } else {
                    (
                        "loan-application",
                        serde_json::json!({
                            "applicantId": format!("applicant-{}", i % 89),
                            "amount": 1000 * (1 + i % 50),
                            "currency": "EUR",
                        }),
                    )
                };
                let resp = http
                    .post(format!("{base}/workflows/{workflow}/tasks"))
                    .header("idempotency-key", format!("demo-{i}"))
                    .json(&body)
                    .send()
                    .await?;
                bar.inc(1);
                let status = resp.status();
                let v: serde_json::Value = resp.json().await?;
                if status != reqwest::StatusCode::ACCEPTED {
                    bail!("submission answered {status}: {v}");
                }
                let id = v["taskId"]
                    .as_str()
                    .map(str::to_owned)
                    .context("no taskId in the answer")?;
                if workflow == "loan-application" {
                    sign(&http, &base, &id, i, &body["applicantId"]).await?;
                }
                Ok(id)
            }
        })
        .buffer_unordered(concurrency.max(1))
        .collect()
        .await;
    bar.finish();
    let mut pending: Vec<String> = Vec::with_capacity(n);
    let mut rejected = 0;
    for s in submitted {
        match s {
            Ok(id) => pending.push(id),
            Err(e) => {
                rejected += 1;
                eprintln!("submission failed: {e:#}");
            }
        }
    }
    let accepted = pending.len();

    let bar = progress(accepted, "finished", "{elapsed}")?;
    let mut tally = Tally::default();
    let deadline = Instant::now() + Duration::from_secs(timeout_secs);
    while !pending.is_empty() && Instant::now() < deadline {
        let states: Vec<(String, Option<serde_json::Value>)> = futures::stream::iter(pending)
            .map(|id| {
                let (http, base) = (http.clone(), base.clone());
                async move {
                    // The operator view: the caller's hides the history's reasons.
                    let v = match http.get(format!("{base}/operator/tasks/{id}")).send().await {
                        Ok(r) if r.status().is_success() => r.json().await.ok(),
                        _ => None,
                    };
                    (id, v)
                }
            })
            .buffer_unordered(concurrency.max(1))
            .collect()
            .await;
        pending = Vec::new();
        for (id, v) in states {
            let state = v.as_ref().and_then(|v| v["processState"].as_str());
            // Recovered at least once: a deadline expired, or an open circuit deferred a step.
            let recovered = v
                .as_ref()
                .and_then(|v| v["history"].as_array())
                .is_some_and(|h| {
                    h.iter().any(|e| {
                        e["reason"].as_str().is_some_and(|r| {
                            r.starts_with("timed out") || r.starts_with("deferred")
                        })
                    })
                });
            let cooling_off = v
                .as_ref()
                .and_then(|v| v["steps"].as_array())
                .is_some_and(|steps| {
                    steps
                        .iter()
                        .any(|s| s["name"] == "cooling-off" && s["status"] == "Waiting")
                });
            if cooling_off {
                // The applicant waives the loan's 14-day cooling-off (an operator's wake, in
                // its history); a refusal (it ended meanwhile) changes nothing.
                let _ = http
                    .post(format!("{base}/operator/tasks/{id}/wake"))
                    .json(&serde_json::json!({"reason": "the demo's applicant waived the cooling-off"}))
                    .send()
                    .await;
            }
            let counter = match state {
                Some("Processed") => &mut tally.processed,
                Some("Compensated") => &mut tally.compensated,
                Some("Refused") => &mut tally.refused,
                Some("CompensationFailed") => &mut tally.compensation_failed,
                Some("Error") => &mut tally.error,
                _ => {
                    pending.push(id);
                    continue;
                }
            };
            *counter += 1;
            tally.retried += usize::from(recovered);
            let undoable: Vec<String> = v
                .as_ref()
                .and_then(|v| v["steps"].as_array())
                .map(|steps| {
                    steps
                        .iter()
                        .filter(|s| s["undoable"] == true)
                        .filter_map(|s| s["name"].as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default();
            tally
                .finals
                .insert(id.clone(), state.unwrap_or_default().to_owned());
            tally.undoable.insert(id, undoable);
            bar.inc(1);
        }
        if !pending.is_empty() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    bar.finish();
    let elapsed = started.elapsed();

    // Exactly once: every idempotency key took effect at most once on its service, and each
    // step's net effect is 1 for a Processed task and 0 for a compensated one (a step its
    // workflow cannot undo stays at 1).
    let mut duplicate_effects = 0;
    let mut wrong_net = 0;
    let mut transient = 0;
    for (_, sim) in system.services.all() {
        let stats = sim.stats();
        transient += stats.transient_faults;
        duplicate_effects += stats.effects.values().filter(|&&c| c > 1).count();
        for (key, net) in stats.net {
            let mut parts = key.split(':');
            let (task, step) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
            let undoable = tally
                .undoable
                .get(task)
                .is_some_and(|u| u.iter().any(|s| s == step));
            let want = match tally.finals.get(task).map(String::as_str) {
                Some("Processed") => 1,
                Some("Compensated" | "Refused") if undoable => 0,
                _ => continue,
            };
            if net != want {
                eprintln!("task {task}: {key} nets {net}, not {want}");
                wrong_net += 1;
            }
        }
    }
    let dead_letters = match &system.memory {
        Some((_, queues, _)) => queues.depth(&system.resources.dead_letter_url).visible,
        None => 0,
    };
    system.shutdown().await;

    let lost = pending.len() + rejected;
    println!(
        "tasks: {n} submitted, {accepted} accepted | processed: {} | compensated: {} | refused: {} | compensation failed: {} | in Error: {} | recovered: {} (expired deadlines or deferred by an open circuit), {transient} transient faults retried by agents | lost: {lost} | duplicate effects: {duplicate_effects} | wrong net effects: {wrong_net} | dead letters: {dead_letters} | elapsed: {:.1}s | {:.0} tasks/s",
        tally.processed,
        tally.compensated,
        tally.refused,
        tally.compensation_failed,
        tally.error,
        tally.retried,
        elapsed.as_secs_f64(),
        accepted as f64 / elapsed.as_secs_f64().max(1e-9),
    );
    if lost > 0 || duplicate_effects > 0 || wrong_net > 0 {
        bail!(
            "{lost} tasks lost, {duplicate_effects} duplicate effects, {wrong_net} wrong net effects"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        parse_args(args.iter().map(Into::into).collect())
    }

    #[test]
    fn serves_flags_work_without_serve_and_others_name_their_subcommand() {
        let cli = parse(&[
            "sas-local",
            "--workflows",
            "w",
            "--listen",
            "127.0.0.1:3001",
        ])
        .expect("serve's flags without serve");
        assert!(matches!(
            cli.command,
            Some(Command::Serve { listen, .. }) if listen.port() == 3001
        ));
        assert_eq!(cli.opts.workflows, Some("w".into()));
        let e = parse(&["sas-local", "--tasks", "10"])
            .err()
            .expect("a demo flag without demo");
        assert!(
            e.to_string()
                .contains("--tasks is a flag of `sas-local demo`: give it after the subcommand"),
            "{e}"
        );
        let e = parse(&["sas-local", "demo", "--listen", "127.0.0.1:1"])
            .err()
            .expect("a serve flag after demo");
        assert!(
            e.to_string()
                .contains("--listen is a flag of `sas-local serve`"),
            "{e}"
        );
    }

    #[test]
    fn data_is_a_flag_of_serve_and_memory_the_default() {
        let cli = parse(&["sas-local", "--data", "d"]).expect("--data without serve");
        assert!(matches!(
            cli.command,
            Some(Command::Serve { data: Some(ref d), .. }) if d == std::path::Path::new("d")
        ));
        let cli = parse(&["sas-local", "serve"]).expect("serve");
        assert!(matches!(
            cli.command,
            Some(Command::Serve { data: None, .. })
        ));
        let e = parse(&["sas-local", "demo", "--data", "d"])
            .err()
            .expect("a serve flag after demo");
        assert!(
            e.to_string()
                .contains("--data is a flag of `sas-local serve`"),
            "{e}"
        );
    }

    /// The flags whose default is a function's variable, read with the functions' parsers
    /// ([`Settings::from_vars`]) rather than by clap: the flag, else the variable.
    const FROM_FUNCTIONS_VARS: &[(&str, &str)] = &[
        ("step-timeout-secs", "STEP_TIMEOUT_SECONDS"),
        ("failure-threshold", "FAILURE_THRESHOLD"),
        ("caller-rate", "CALLER_RATE_PER_SECOND"),
        ("caller-burst", "CALLER_BURST"),
    ];

    /// Every setting of `sas-local serve` comes from its flag or its variable, and
    /// docs/local.md's table names both.
    #[test]
    fn every_setting_comes_from_its_flag_or_its_variable() {
        use clap::CommandFactory;
        let cli = Cli::command();
        let serve = cli.find_subcommand("serve").expect("serve");
        let read = Settings::default().describe();
        let doc = include_str!("../../../docs/local.md");
        let mut seen = 0;
        for arg in cli.get_arguments().chain(serve.get_arguments()) {
            let Some(flag) = arg.get_long() else { continue };
            if matches!(flag, "help" | "version") {
                continue;
            }
            seen += 1;
            let var = match arg.get_env() {
                Some(v) => v.to_string_lossy().into_owned(),
                None => {
                    let (_, var) = FROM_FUNCTIONS_VARS
                        .iter()
                        .find(|(f, _)| *f == flag)
                        .unwrap_or_else(|| panic!("--{flag} has no variable"));
                    assert!(read.iter().any(|(n, _)| n == var), "{var} is read");
                    let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
                    assert!(help.contains(&format!("`{var}`")), "--{flag}: {help}");
                    (*var).to_owned()
                }
            };
            let names = |l: &&str| {
                l.split('|').nth(1).is_some_and(|first| {
                    first.contains(&format!("`--{flag} ")) || first.contains(&format!("`--{flag}`"))
                })
            };
            let row = doc
                .lines()
                .find(names)
                .unwrap_or_else(|| panic!("docs/local.md's flags table has no --{flag}"));
            assert!(
                row.contains(&format!("`{var}`")),
                "docs/local.md: --{flag} names {var}: {row}"
            );
        }
        assert!(seen > 20, "{seen} flags");
    }

    /// Under `--auth iam` or `jwt` the banner's commands carry their credentials: an unsigned
    /// `curl` would answer 401.
    #[test]
    fn the_banners_commands_authenticate_as_the_api_wants() {
        use sas::auth::AuthMode;
        let file = std::path::Path::new(".sas-local/issuer.json");
        for (mode, with) in [
            (AuthMode::Iam, "--aws-sigv4 aws:amz:"),
            (AuthMode::Jwt, "authorization: Bearer $(sas-local token"),
        ] {
            for loan in [true, false] {
                let text = try_it(&mode, file, "127.0.0.1:3000", loan);
                let curls: Vec<&str> = text.lines().filter(|l| l.contains("curl ")).collect();
                assert_eq!(curls.len(), 2, "{text}");
                for line in curls {
                    assert!(line.contains(with), "{mode:?}: {line}");
                }
            }
        }
        let open = try_it(&AuthMode::None, file, "127.0.0.1:3000", true);
        assert!(
            !open.contains("--aws-sigv4") && !open.contains("Bearer"),
            "{open}"
        );
        assert!(open.contains("/workflows/loan-application/tasks"), "{open}");
    }

    #[test]
    fn a_busy_address_names_itself_and_the_flag() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
        let addr = taken.local_addr().expect("its address");
        let e = std::net::TcpListener::bind(addr).expect_err("in use");
        let message = listen_error(e.into(), addr).to_string();
        assert!(
            message.starts_with(&format!("{addr} is already in use"))
                && message.contains("--listen"),
            "{message}"
        );
    }
}
