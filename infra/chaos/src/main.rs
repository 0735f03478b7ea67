//! `sas-chaos --tasks 10000 --seed 7`: a chaos run in memory (or, with `--aws`, on the AWS
//! adapters at `AWS_ENDPOINT_URL`): tasks of e-commerce orders, loan applications and
//! order triages (a choice and a condition) in turn. Prints the report as markdown and exits non-zero if any guarantee
//! broke.

use clap::Parser;
use sas_chaos::{Config, run};
use sas_local::{Backend, ports};
use std::time::Duration;

#[derive(Parser)]
#[command(
    version,
    about = "Chaos run of sas: seeded faults and crashes; checks nothing is lost or done twice"
)]
struct Cli {
    /// Tasks to submit (e-commerce orders, loan applications and order triages, in turn).
    #[arg(long, default_value_t = 2000)]
    tasks: usize,
    /// The seed of every fault decision.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Supervisors sweeping at once.
    #[arg(long, default_value_t = 6)]
    supervisors: usize,
    /// Seconds the run waits for a task to settle before it gives up (it goes on as long as
    /// tasks keep settling).
    #[arg(long, default_value_t = 60)]
    patience_secs: u64,
    /// At most this many tasks in flight (submitted, not yet settled) at once; 0: no limit.
    #[arg(long, default_value_t = 0)]
    window: usize,
    /// Nobody acts at the operator API during the run (by default an operator retries,
    /// skips, resolves and compensates some waiting tasks, and cancels 2% of tasks).
    #[arg(long)]
    no_operator: bool,
    /// Share of writes after which the writer dies.
    #[arg(long, default_value_t = 0.02)]
    crash_rate: f64,
    /// Submissions per second at most (0: unpaced).
    #[arg(long, default_value_t = 500)]
    rate: u32,
    /// Run on the AWS adapters at AWS_ENDPOINT_URL (resources named with --prefix are created).
    #[arg(long)]
    aws: bool,
    #[arg(long, default_value = "sas-chaos")]
    prefix: String,
    /// Services behave like ordinary real ones: late commits (past the caller's timeout), 409
    /// while a key is in flight, a 401 window of 3 s in the middle of the submissions.
    #[arg(long)]
    realistic: bool,
    /// Services keep no tombstone for an undo of a step they have not committed (a planted
    /// bug: with --realistic, late steps then leak).
    #[arg(long)]
    no_tombstones: bool,
    /// Services answer this share of step keys oversized: half refused with a message of
    /// megabytes, half applied with a result of megabytes (e.g. `--oversized 0.05`).
    #[arg(long, value_name = "RATE")]
    oversized: Option<f64>,
    /// Take this service down for the whole run (repeatable), e.g. `--down e-sign`.
    #[arg(long, value_name = "SERVICE")]
    down: Vec<String>,
    /// Turn on every rough edge of AWS: lost write responses (the SDK's retry answers),
    /// throttling, a slow and bursty work queue, Lambda timeouts that return a whole batch.
    #[arg(long)]
    every_switch: bool,
    /// Failures wait in Error for the operator (`AUTO_COMPENSATE=false`) instead of
    /// compensating on their own, so the operator's compensations apply before the pivot too.
    #[arg(long)]
    manual_compensation: bool,
    /// Stall the work queue for this many pickup timeouts (once every four stalls; with
    /// --every-switch the default is 4), to show re-enqueues stay proportional to tasks.
    #[arg(long, value_name = "PICKUPS")]
    stall_pickups: Option<u32>,
    /// Overload: for this many seconds, submit three times the tasks a second the agents serve
    /// (no faults, crashes or operator; replaces --tasks and --rate). Every task must end
    /// Processed: late, not failed.
    #[arg(long, value_name = "SECONDS")]
    overload: Option<u64>,
    /// How long a step's request may wait for an agent (START_WITHIN_SECONDS; with --overload,
    /// three times its seconds by default; 0 plants "the deadline runs while the request
    /// waits").
    #[arg(long, value_name = "SECONDS")]
    start_within: Option<u64>,
    /// Give a service limits, `SERVICE[:CONCURRENCY:PER_SECOND:BURST]` (default 5:20:5), e.g.
    /// `--limit payment`: every submission at once, services without business faults and no
    /// operator; the service's own count of calls at once and in any second must keep them,
    /// and every task of a workflow without a deadline of its own must end Processed.
    #[arg(long, value_name = "SERVICE")]
    limit: Vec<String>,
}

/// `SERVICE[:CONCURRENCY:PER_SECOND:BURST]`.
fn parse_limit(text: &str) -> anyhow::Result<sas_chaos::ServiceLimit> {
    let mut parts = text.split(':');
    let service = parts.next().unwrap_or_default();
    let service = sas::domain::workflow::examples::services()
        .into_iter()
        .map(|s| s.name)
        .find(|n| n == service)
        .ok_or_else(|| anyhow::anyhow!("no service {service:?} in the examples"))?;
    let mut n = |default: u32| -> anyhow::Result<u32> {
        Ok(match parts.next() {
            Some(p) => p.parse()?,
            None => default,
        })
    };
    Ok(sas_chaos::ServiceLimit {
        service: Box::leak(service.into_boxed_str()),
        concurrency: n(5)?,
        per_second: n(20)?,
        burst: n(5)?,
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    sas::telemetry::init_with_default("off");
    let cli = Cli::parse();
    let mut cfg = Config::new(cli.tasks, cli.seed);
    cfg.supervisors = cli.supervisors;
    cfg.patience = Duration::from_secs(cli.patience_secs);
    cfg.window = (cli.window > 0).then_some(cli.window);
    if cli.no_operator {
        cfg.operator = None;
    }
    cfg.plan.crash_rate = cli.crash_rate;
    cfg.rate = (cli.rate > 0).then_some(cli.rate);
    if cli.realistic {
        cfg.realistic();
    }
    if cli.no_tombstones {
        cfg.without_tombstones();
    }
    if let Some(rate) = cli.oversized {
        cfg.oversized(rate);
    }
    let pickup = cfg.settings.policy.pickup_timeout.to_std()?;
    if cli.every_switch {
        cfg.every_switch();
    }
    if cli.manual_compensation {
        cfg.manual_compensation();
    }
    if let Some(n) = cli.stall_pickups {
        cfg.plan.slow_work_queue = (n > 0).then(|| pickup * n);
    }
    if let Some(seconds) = cli.overload {
        let within = cli.start_within.unwrap_or(3 * seconds);
        cfg.overload(seconds, chrono::Duration::seconds(within as i64));
    } else if let Some(within) = cli.start_within {
        cfg.settings.policy.start_within = chrono::Duration::seconds(within as i64);
    }
    for service in &cli.down {
        cfg.down(service)?;
    }
    for limit in &cli.limit {
        cfg.limit(parse_limit(limit)?);
    }
    let backend = if cli.aws {
        Backend::Aws {
            config: Box::new(sas::aws::sdk_config().await),
            prefix: cli.prefix,
        }
    } else {
        Backend::Memory
    };
    let p = ports(backend, &cfg.settings).await?;
    let report = run(p, &cfg).await?;
    println!("{}", report.table());
    if cli.overload.is_some() {
        // Late, not failed: every task Processed, none failed, none compensated.
        let processed = report.states.get("Processed").copied().unwrap_or(0);
        println!(
            "overload: {} tasks at {} a second; {processed} Processed, {} failed, slowest {:.1} s",
            report.accepted,
            cfg.rate.unwrap_or(0),
            report.failed,
            report.slowest.as_secs_f64()
        );
        if processed != report.accepted || report.failed > 0 {
            anyhow::bail!("overload: tasks failed or were compensated instead of finishing late");
        }
    }
    if !cfg.limits.is_empty() {
        for l in &cfg.limits {
            let s = report.services.get(l.service).cloned().unwrap_or_default();
            println!(
                "limits: {} ({} at once, {}/s burst {}): {} calls, at most {} at once, {} in a second",
                l.service,
                l.concurrency,
                l.per_second,
                l.burst,
                s.calls,
                s.most_in_flight,
                s.most_in_a_second
            );
        }
        let unfinished: Vec<String> = report
            .workflows
            .iter()
            .filter(|(name, _)| !["agreement", "loan-application"].contains(&name.as_str()))
            .filter(|(_, w)| w.states.get("Processed").copied() != Some(w.accepted))
            .map(|(name, w)| format!("{name}: {:?}", w.states))
            .collect();
        if !unfinished.is_empty() {
            anyhow::bail!("limits: tasks did not all end Processed: {unfinished:?}");
        }
    }
    let violations = report.violations();
    if violations.is_empty() {
        println!("chaos run clean: seed {}, {} tasks", cli.seed, cfg.tasks);
        Ok(())
    } else {
        for v in &violations {
            eprintln!("VIOLATION: {v}");
        }
        anyhow::bail!("{} guarantee(s) broken", violations.len())
    }
}
