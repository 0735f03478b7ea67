//! `sas-bench`: the numbers behind BENCHMARKS.md. Run it with `./infra/bench.sh`, which starts
//! the emulator for the API-call counts and writes BENCHMARKS.md; or `cargo run --release -p
//! sas-bench -- --help`. Speed goals are reported here, never asserted in tests.

mod counting;
mod distributed;
mod fairness;
mod groups;
mod init;
mod prices;
mod scenarios;
mod search;
mod share;

use clap::Parser;
use sas::ports::SystemClock;
use sas_local::{Backend, Settings, System};
use scenarios::Scenario;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(version, about = "Benchmarks of sas; writes a markdown report")]
struct Cli {
    /// Tasks of each workflow for the in-memory throughput run.
    #[arg(long, default_value_t = 5000)]
    tasks: usize,
    /// Submissions in flight at once.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Tasks for the recovery-lag run.
    #[arg(long, default_value_t = 200)]
    lag_tasks: usize,
    /// Waits due at once in each timer-lag run.
    #[arg(long, default_value_t = 1000)]
    timer_waits: usize,
    /// Write the report here (otherwise it is only printed).
    #[arg(long)]
    write: Option<std::path::PathBuf>,
    /// Skip the API-call counts (they need an emulator at AWS_ENDPOINT_URL).
    #[arg(long)]
    no_emulator: bool,
    /// Clean e-commerce orders for the load-per-key run.
    #[arg(long, default_value_t = 2000)]
    key_load_tasks: usize,
    /// Overdue tasks one sweep recovers in the sweep-capacity run.
    #[arg(long, default_value_t = 2000)]
    sweep_tasks: usize,
    /// Tasks of each of the parallel group and the line, one at a time, for their times.
    #[arg(long, default_value_t = 5)]
    group_tasks: usize,
    /// Scheduler pollers per queue for the forEach race, one run each.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 4, 8])]
    race_pollers: Vec<usize>,
    /// Elements of the distributed forEach run, and how many at once.
    #[arg(long, default_value_t = distributed::ELEMENTS)]
    distributed_elements: usize,
    #[arg(long, default_value_t = distributed::AT_ONCE)]
    distributed_at_once: usize,
    /// Elements a record keeps, one run each (1: each element its own).
    #[arg(long, value_delimiter = ',', default_values_t = distributed::CHUNKS)]
    distributed_chunks: Vec<u32>,
    /// Run only this section and print it (`distributed`: the distributed forEach; `costs`:
    /// the API calls and the cost per million tasks, on the emulator; `fairness`: a noisy
    /// caller's burst; `search`: a search by key, on the emulator; `init`: each function's
    /// cold-start init and binary sizes); the report is written whole, so not with `--write`.
    #[arg(long, value_parser = ["distributed", "costs", "fairness", "search", "init"])]
    only: Option<String>,
    /// The table sizes of the search-by-key run (each adds to the last).
    #[arg(long, value_delimiter = ',', default_values_t = [1_000, 10_000, 100_000])]
    search_sizes: Vec<usize>,
    /// The noisy caller's burst in the fairness run.
    #[arg(long, default_value_t = 20_000)]
    fair_burst: usize,
    /// Where `sam build` left the bootstraps, for their sizes.
    #[arg(long, default_value = ".aws-sam/build")]
    sam_build: std::path::PathBuf,
    /// Where the functions' release binaries are (`cargo build --release -p agent -p scheduler
    /// -p submission -p supervisor`), for their cold-start init; the bench builds nothing.
    #[arg(long, default_value = "target/release")]
    functions_dir: std::path::PathBuf,
    /// Cold starts of each function.
    #[arg(long, default_value_t = 20)]
    init_runs: usize,
}

// Assumptions of the cost model (stated in the report).
const REMOTE_CALL_MS: f64 = 100.0;
const MEMORY_GB: f64 = 0.25;
const SFN_EXPRESS_GB: f64 = 0.0625;
/// Messages per invocation (and per receive and delete) when the queues are busy: the
/// scheduler's and the supervisor's mappings take batches of 10 (`template.yaml`).
const AT_LOAD_BATCH: f64 = 10.0;
/// How long a task's payload objects are stored: until its retention ends, the template's
/// `RetentionDays` default after it ends (its run is a rounding error beside that).
const PAYLOAD_RETENTION_DAYS: f64 = 90.0;
/// The hours of a month, as AWS's pricing calculator counts them (storage is billed by the
/// GB-month).
const HOURS_PER_MONTH: f64 = 730.0;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    sas::telemetry::init_with_default("off");
    let cli = Cli::parse();
    if let Some(only) = &cli.only {
        anyhow::ensure!(
            cli.write.is_none(),
            "--only prints one section; the report is written whole (leave out --only)"
        );
        if only == "costs" {
            let scenarios = emulator_scenarios().await?;
            print!(
                "## AWS API calls per task (on the emulator)\n\n{}\n## DynamoDB write units, write by write\n\n{}\n## Cost per million tasks\n\n{}\n### A 1 MiB result passed to a later step (on the emulator)\n\n{}",
                calls_table(&scenarios),
                writes_table(&scenarios),
                cost_table(&scenarios),
                groups::mb_cost(&scenarios, |s| {
                    let c = cost(s);
                    (c.orchestration, c.s3_requests, c.s3_storage)
                })
            );
        } else if only == "fairness" {
            print!("{}", fairness_section(&cli).await?);
        } else if only == "search" {
            print!("{}", search_section(&cli).await?);
        } else if only == "init" {
            print!("{}", init_section(&cli).await?);
        } else {
            print!("{}", distributed_section(&cli).await?);
        }
        return Ok(());
    }
    let mut md = String::new();
    writeln!(md, "# Benchmarks\n")?;
    writeln!(
        md,
        "Written by `sas-bench` (`./infra/bench.sh`) on {} on this machine: {}. Release build.\n",
        chrono::Utc::now().format("%Y-%m-%d"),
        machine()
    )?;

    eprintln!("throughput and latency in memory…");
    writeln!(md, "## Throughput and latency (in memory)\n")?;
    writeln!(
        md,
        "Tasks of each example workflow (e-commerce orders: 3 steps; loan applications: 3 steps, the contract's callback and the signature, an event delivered right after the submission), no faults, through the HTTP handler without a network; latency is submission to `Processed` (a loan: to the start of its 14-day cooling-off; history timestamps, ms resolution). For each workflow the first row is a burst (throughput); the second, one task in flight at a time (latency without queueing).\n"
    )?;
    writeln!(
        md,
        "| workflow | tasks | in flight | all processed in | throughput | latency p50 | latency p99 | latency max |\n|---|---|---|---|---|---|---|---|"
    )?;
    for workflow in WORKFLOWS {
        writeln!(
            md,
            "{}",
            throughput(workflow, cli.tasks, cli.concurrency).await?
        )?;
        writeln!(md, "{}", throughput(workflow, 200, 1).await?)?;
    }
    writeln!(md)?;

    eprintln!("services sharing the agents…");
    writeln!(md, "## Services that share the agents (in memory)\n")?;
    writeln!(md, "{}", share::table(200, 200).await?)?;

    let mut measured = None;
    if !cli.no_emulator {
        let scenarios = emulator_scenarios().await?;
        writeln!(md, "## AWS API calls per task (on the emulator)\n")?;
        writeln!(md, "{}", calls_table(&scenarios))?;
        writeln!(md, "## DynamoDB write units, write by write\n")?;
        writeln!(md, "{}", writes_table(&scenarios))?;
        writeln!(md, "## Cost per million tasks\n")?;
        writeln!(md, "{}", cost_table(&scenarios))?;
        writeln!(md, "## Waits and events\n")?;
        writeln!(md, "{}", waits_table(&scenarios))?;
        writeln!(md, "## Before and after\n")?;
        writeln!(md, "{}", before_after_table(&scenarios)?)?;
        measured = Some(scenarios);
    }

    eprintln!("parallel groups and forEach…");
    writeln!(md, "## Parallel groups and forEach\n")?;
    writeln!(
        md,
        "The bench's own workflows (written in `infra/bench/src/groups.rs`, published into each system the bench builds; their counts are columns of the call and cost tables above). In memory, each store, queue and bus call taking {MODELED_CALL_MS} ms.\n"
    )?;
    writeln!(md, "### A parallel group against a line\n")?;
    let rows = groups::parallel_vs_line(cli.group_tasks).await?;
    writeln!(md, "{}", groups::parallel_table(&rows))?;
    if let Some(scenarios) = &measured {
        writeln!(
            md,
            "{}",
            groups::group_cost(scenarios, |s| cost(s).orchestration)
        )?;
    }
    writeln!(md, "### A sub-workflow step against the same step inline\n")?;
    let rows = groups::child_vs_inline(cli.group_tasks).await?;
    writeln!(
        md,
        "{}",
        groups::child_table(&rows, measured.as_deref(), |s| cost(s).orchestration)
    )?;
    if let Some(scenarios) = &measured {
        writeln!(
            md,
            "### A 1 MiB result passed to a later step (on the emulator)\n"
        )?;
        writeln!(
            md,
            "{}",
            groups::mb_cost(scenarios, |s| {
                let c = cost(s);
                (c.orchestration, c.s3_requests, c.s3_storage)
            })
        )?;
    }
    writeln!(md, "### forEach: replies racing on one record\n")?;
    let runs = groups::for_each_race(&cli.race_pollers).await?;
    writeln!(md, "{}", groups::race_table(&runs))?;
    if let Some(scenarios) = &measured {
        writeln!(md, "### forEach: cost per element (on the emulator)\n")?;
        writeln!(
            md,
            "{}",
            groups::for_each_cost(scenarios, |s| cost(s).orchestration)
        )?;
    }

    md.push_str(&distributed_section(&cli).await?);

    md.push_str(&fairness_section(&cli).await?);

    eprintln!("sweep capacity…");
    writeln!(md, "## Sweep capacity (in memory, modeled latency)\n")?;
    writeln!(md, "{}", sweep_capacity(cli.sweep_tasks).await?)?;

    if !cli.no_emulator {
        md.push_str(&search_section(&cli).await?);
    }

    eprintln!("load per key…");
    writeln!(md, "## Load per key (in memory)\n")?;
    writeln!(md, "{}", key_load(cli.key_load_tasks).await?)?;

    eprintln!("recovery lag…");
    writeln!(
        md,
        "## Recovery lag (deadline passed → step dispatched again)\n"
    )?;
    writeln!(
        md,
        "In memory: {} tasks whose first step always overruns a 1 s deadline, submissions spread over 2 s, no retry delay.\n",
        cli.lag_tasks
    )?;
    writeln!(md, "{}", sas_local::lag::table(cli.lag_tasks, 1000).await?)?;

    eprintln!("timer lag…");
    writeln!(md, "## Timer lag\n")?;
    writeln!(
        md,
        "In memory: {} tasks whose wait steps all end at the same instant (a wait until a time in their input), the lag from that time to the wait's end; the deadline-timer queue polled as deployed. A wait of up to 15 minutes gets its timer when it begins; a longer one gets it from the last sweep before its time (`SWEEP_LOOK_AHEAD_SECONDS`, the sweep's interval); without the look-ahead it would end at the first sweep after its time, up to a sweep interval (60 s) late.\n",
        cli.timer_waits
    )?;
    writeln!(
        md,
        "{}",
        sas_local::lag::timer_table(cli.timer_waits).await?
    )?;

    md.push_str(&init_section(&cli).await?);

    print!("{md}");
    if let Some(path) = cli.write {
        std::fs::write(&path, &md)?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

/// The search-by-key section (see [`search`]), on the emulator.
async fn search_section(cli: &Cli) -> anyhow::Result<String> {
    eprintln!("a search by key on the emulator…");
    let config = sas::aws::sdk_config().await;
    // DynamoDB Local when `infra/bench.sh` started it (its indexes are real ones: moto scans
    // the table for a query of an index, and writes a few dozen tasks a second).
    let local = std::env::var("SAS_BENCH_DYNAMODB_LOCAL").ok();
    let rows = search::run(&config, local.as_deref(), &cli.search_sizes).await?;
    let engine = if local.is_some() {
        "DynamoDB Local"
    } else {
        "moto"
    };
    Ok(format!(
        "## A search by key (on the emulator)\n\n{}",
        search::table(&rows, engine)
    ))
}

/// The section of each function's cold-start init and binary sizes (see [`init_and_size`]).
async fn init_section(cli: &Cli) -> anyhow::Result<String> {
    eprintln!("cold-start init per function…");
    Ok(format!(
        "## Handler init and binary size\n\n{}\n",
        init_and_size(&cli.functions_dir, &cli.sam_build, cli.init_runs).await?
    ))
}

/// The noisy caller's section (see [`fairness`]).
async fn fairness_section(cli: &Cli) -> anyhow::Result<String> {
    eprintln!("a noisy caller's burst…");
    let run = fairness::run(cli.fair_burst).await?;
    Ok(format!(
        "## A noisy caller's burst (in memory, modeled latency)\n\n{}",
        fairness::table(&run)
    ))
}

/// The distributed forEach's section (see [`distributed`]).
async fn distributed_section(cli: &Cli) -> anyhow::Result<String> {
    let mut out = String::new();
    for &chunk in &cli.distributed_chunks {
        eprintln!("distributed forEach, chunks of {chunk}…");
        let d = distributed::run(cli.distributed_elements, cli.distributed_at_once, chunk).await?;
        out.push_str(&format!(
            "### A distributed forEach: {} elements, {} at once{} (in memory, modeled latency)\n\n{}\n",
            cli.distributed_elements,
            cli.distributed_at_once,
            if d.chunk_used > 1 {
                format!(", in chunks of {}", d.chunk_used)
            } else {
                String::new()
            },
            distributed::table(&d, |s| (
                cost(s).orchestration,
                cost_with(s, AT_LOAD_BATCH).orchestration
            ))
        ));
    }
    Ok(out)
}

/// The round trip each store, queue and bus call takes in the sweep-capacity run: DynamoDB's
/// and SQS's single-digit milliseconds within a region.
const MODELED_CALL_MS: u64 = 5;

/// What one sweep recovers: `tasks` orders submitted and never claimed, the clock moved past
/// their pickup deadline (no deadline timers), then one sweep over 16 shards, in memory with
/// every store, queue and bus call taking [`MODELED_CALL_MS`]. One recovery at a time (as the
/// sweep before issue 14 made them) against the current sweep (32 in flight, paged to the
/// end), and the current one with a poison record at the head of every shard.
async fn sweep_capacity(tasks: usize) -> anyhow::Result<String> {
    use sas::handlers::supervisor::SweepSettings;
    let mut out = format!(
        "{tasks} e-commerce orders never claimed, moved past their pickup deadline (deadline timers off), then one sweep of 16 due shards, in memory with every DynamoDB, SQS and EventBridge call taking {MODELED_CALL_MS} ms (a round trip within a region; the in-memory work itself is negligible). Every recovery reads the record, writes it conditionally and re-enqueues the task. *Needed*: at 1,000 tasks a second with 1% of deadlines missed, 600 recoveries a minute. Before issue 14 the sweep also stopped at 100 records a shard (400 a minute with 4 shards) and a record that always failed stayed at the head of its shard.\n\n| sweep | due read | recovered | errors | due-index queries | took | recoveries a second | in one 60 s budget |\n|---|---|---|---|---|---|---|---|\n"
    );
    let runs = [
        (
            "one recovery at a time",
            SweepSettings {
                concurrency: 1,
                ..SweepSettings::default()
            },
            false,
        ),
        (
            "32 in flight (the default), paged",
            SweepSettings::default(),
            false,
        ),
        (
            "32 in flight, a poison record heading every shard",
            SweepSettings::default(),
            true,
        ),
    ];
    for (label, sweep, poison) in runs {
        let mut settings = Settings {
            due_shards: 16,
            deadline_timers: false,
            ..Settings::default()
        };
        settings.policy.pickup_timeout = chrono::Duration::seconds(60);
        settings.catalog_ttl = chrono::Duration::seconds(scenarios::CATALOG_TTL_SECONDS);
        let meter = Arc::new(counting::Meter::with_latency(Duration::from_millis(
            MODELED_CALL_MS,
        )));
        let p = scenarios::wrap(
            sas_local::ports(Backend::Memory, &settings).await?,
            &meter,
            settings.due_shards,
        );
        let files = settings.definitions.clone();
        let clock = Arc::new(sas::ports::OffsetClock::default());
        let mut system = System::from_ports(p, settings, clock.clone());
        system.publish(&files).await?;
        system.supervisor.sweep = sweep;
        let ids = submit_burst(&system, "ecommerce-order", tasks, 64).await?;
        if poison {
            // One record per shard, the first submitted there, names a workflow version the
            // catalog never had: its recovery fails every time.
            let mut seen = std::collections::HashSet::new();
            for id in &ids {
                let Some(r) = system.store.get_state(*id).await? else {
                    continue;
                };
                if !seen.insert(r.due_shard(16)) {
                    continue;
                }
                let mut bad = r.clone();
                bad.workflow_version = 999;
                bad.version += 1;
                let condition = sas::domain::Condition::Matches {
                    version: r.version,
                    guards: vec![],
                };
                system.store.put(&bad, &condition).await?;
            }
        }
        clock.advance(chrono::Duration::seconds(61));
        let started = Instant::now();
        let report = system.sweep().await?;
        let took = started.elapsed().as_secs_f64();
        let recovered = report.requeued + report.retried + report.failed + report.notices;
        anyhow::ensure!(
            report.due == tasks && recovered + report.errors == tasks,
            "the sweep left records behind: {report:?}"
        );
        let rate = recovered as f64 / took.max(1e-9);
        writeln!(
            out,
            "| {label} | {} | {recovered} | {} | {} | {took:.1} s | {rate:.0} | {:.0} |",
            report.due,
            report.errors,
            report.pages,
            rate * 60.0,
        )?;
    }
    Ok(out)
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{cores} cores, {cpu}, {}", std::env::consts::ARCH)
}

fn quantile(v: &[f64], q: f64) -> f64 {
    sas_local::lag::quantile(v, q)
}

/// The workflows the throughput run measures.
const WORKFLOWS: [&str; 2] = ["ecommerce-order", "loan-application"];

/// Submits `tasks` tasks of `workflow` (an example workflow or one of the bench's, published
/// in `system`: see [`scenarios::input`]) as the anonymous caller through
/// the HTTP handler (no network), `in_flight` at a time; their ids, in order. Every
/// submission must be accepted (202).
async fn submit_burst(
    system: &System,
    workflow: &str,
    tasks: usize,
    in_flight: usize,
) -> anyhow::Result<Vec<sas::TaskId>> {
    let mut headers = http::HeaderMap::new();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    let body = scenarios::input(workflow).to_string();
    let path = format!("/workflows/{workflow}/tasks");
    let caller = sas::auth::Identity::anonymous();
    let mut ids = Vec::with_capacity(tasks);
    for chunk in (0..tasks).collect::<Vec<_>>().chunks(in_flight.max(1)) {
        let answers = futures::future::join_all(chunk.iter().map(|_| {
            sas::api::handle(
                &system.api,
                &caller,
                &http::Method::POST,
                &path,
                &headers,
                body.as_bytes(),
            )
        }))
        .await;
        let mut accepted = Vec::with_capacity(chunk.len());
        for a in answers {
            let v: serde_json::Value = serde_json::from_str(a.body())?;
            anyhow::ensure!(a.status() == 202, "submission answered {}: {v}", a.status());
            accepted.push(
                v["taskId"]
                    .as_str()
                    .unwrap_or_default()
                    .parse::<sas::TaskId>()?,
            );
        }
        if workflow == "loan-application" {
            // Each applicant signs at once (the e-sign webhook's event, kept for the step).
            let paths: Vec<String> = accepted
                .iter()
                .map(|id| format!("/tasks/{id}/events/contract-signed"))
                .collect();
            let signed = futures::future::join_all(paths.iter().map(|path| {
                sas::api::handle(
                    &system.api,
                    &caller,
                    &http::Method::POST,
                    path,
                    &headers,
                    br#"{"signedBy": "bench"}"#,
                )
            }))
            .await;
            for a in signed {
                anyhow::ensure!(a.status() == 202, "contract-signed answered {}", a.status());
            }
        }
        ids.extend(accepted);
    }
    Ok(ids)
}

/// Tasks of `workflow`, no faults, submitted through the HTTP handler (no network) with
/// `concurrency` in flight; latency is submission → Processed (a loan: → its cooling-off) from
/// each task's history.
async fn throughput(workflow: &str, tasks: usize, concurrency: usize) -> anyhow::Result<String> {
    let settings = Settings {
        poll_wait: Duration::from_millis(200),
        ..Settings::default()
    };
    let mut system = System::new(Backend::Memory, settings, Arc::new(SystemClock)).await?;
    system.start();
    let started = Instant::now();
    let ids = submit_burst(&system, workflow, tasks, concurrency).await?;
    let submitted = started.elapsed();
    let until = Instant::now() + Duration::from_secs(300);
    let mut latencies = Vec::new();
    // A loan is measured to its 14-day cooling-off (its last step's only wait): its history's
    // last line is then the wait's start.
    let reached = |r: &sas::StateRecord| {
        if workflow == "loan-application" {
            r.steps
                .iter()
                .any(|s| s.name == "cooling-off" && s.status == sas::StepStatus::Waiting)
        } else {
            r.process_state == sas::ProcessState::Processed
        }
    };
    loop {
        latencies.clear();
        let mut done = 0;
        for id in &ids {
            if let Some(r) = system.store.get_state(*id).await?
                && reached(&r)
            {
                done += 1;
                if let Some(last) = r.history.last() {
                    latencies.push(
                        (last.at - r.created_at).num_microseconds().unwrap_or(0) as f64 / 1e3,
                    );
                }
            }
        }
        if done == ids.len() || Instant::now() > until {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let elapsed = started.elapsed();
    system.shutdown().await;
    anyhow::ensure!(latencies.len() == ids.len(), "not every task finished");
    latencies.sort_by(f64::total_cmp);
    let _ = submitted;
    Ok(format!(
        "| {workflow} | {tasks} | {concurrency} | {:.2} s | {:.0} tasks/s | {:.0} ms | {:.0} ms | {:.0} ms |",
        elapsed.as_secs_f64(),
        tasks as f64 / elapsed.as_secs_f64(),
        quantile(&latencies, 0.5),
        quantile(&latencies, 0.99),
        quantile(&latencies, 1.0),
    ))
}

fn calls_table(scenarios: &[Scenario]) -> String {
    let mut names: Vec<String> = scenarios
        .iter()
        .flat_map(|s| s.counts.calls.keys().cloned())
        .collect();
    names.sort();
    names.dedup();
    let mut t = String::from(
        "Counted by wrappers around the adapters, each task on its own resources on moto. Queue receives and deletes are made by Lambda's event source mappings and are not counted here (the cost model adds one of each per consumed message). Lambda invocations assume one message per invocation (the upper bound). Catalog reads (workflow and service definitions, in the same table) are cached by every function for `CATALOG_CACHE_SECONDS` (5 s by default), which rounds to nothing per task under load: each scenario starts with warm caches, and a catalog row shows only if one was read anyway. S3 calls are the payload store's (payloads over the inline size kept by reference), counted under each function's own payload cache, as one warm instance of each function has: a payload one function wrote is read from S3 by the next. A deadline timer delivered after the scenario reads the record, and its payloads the first time.\n\n| call |",
    );
    for s in scenarios {
        t.push_str(&format!(" {} |", s.name));
    }
    t.push_str("\n|---|");
    t.push_str(&"---|".repeat(scenarios.len()));
    t.push('\n');
    let mut row = |label: &str, f: &dyn Fn(&Scenario) -> String| {
        t.push_str(&format!("| {label} |"));
        for s in scenarios {
            t.push_str(&format!(" {} |", f(s)));
        }
        t.push('\n');
    };
    row("workflow", &|s| format!("`{}`", s.workflow));
    row("steps", &|s| s.steps.to_string());
    row("final state", &|s| s.final_state.to_string());
    for n in &names {
        row(n, &|s| s.counts.call(n).to_string());
    }
    row("DynamoDB write request units", &|s| {
        format!("{:.0}", s.counts.wru)
    });
    row("WRU on the table's items", &|s| {
        format!("{:.0}", s.counts.wru_by_place().table)
    });
    row("WRU on `due-index`", &|s| {
        format!("{:.0}", s.counts.wru_by_place().due_index)
    });
    row("WRU on `state-index`", &|s| {
        format!("{:.0}", s.counts.wru_by_place().state_index)
    });
    row("WRU on `caller-shard-index`", &|s| {
        format!("{:.0}", s.counts.wru_by_place().caller_index)
    });
    row("WRU on `key-index-*`", &|s| {
        format!("{:.0}", s.counts.wru_by_place().key_indexes)
    });
    row("DynamoDB read request units", &|s| {
        format!("{:.1}", s.counts.rru)
    });
    row("DynamoDB writes per step", &|s| {
        format!(
            "{:.2}",
            s.counts.dynamodb_writes() as f64 / s.steps.max(1) as f64
        )
    });
    row("Scan calls", &|s| {
        if s.counts.has_scan() {
            "yes".into()
        } else {
            "0".into()
        }
    });
    for k in ["work", "replies", "agent", "timers", "client"] {
        row(&format!("messages to {k}"), &|s| {
            s.counts.messages.get(k).copied().unwrap_or(0).to_string()
        });
    }
    row("EventBridge events", &|s| s.counts.events.to_string());
    row("S3 bytes stored (payload objects)", &|s| {
        s.counts.stored_bytes().to_string()
    });
    for f in ["submission", "scheduler", "agent", "supervisor"] {
        row(&format!("Lambda invocations: {f}"), &|s| {
            s.invocations.get(f).copied().unwrap_or(0).to_string()
        });
    }
    row("Step Functions transitions (equivalent)", &|s| {
        s.sfn_transitions.to_string()
    });
    for f in ["submission", "scheduler", "agent", "supervisor"] {
        row(&format!("handler time, ms: {f}"), &|s| {
            format!(
                "{:.0}",
                s.handler_seconds.get(f).copied().unwrap_or(0.0) * 1e3
            )
        });
    }
    t
}

/// USD per task, by part.
struct Cost {
    /// Everything but the agents and the API (S3 included).
    orchestration: f64,
    /// Of which S3's requests, and its storage of the task's payloads until its retention ends.
    s3_requests: f64,
    s3_storage: f64,
    agents: f64,
    api: f64,
    sfn_standard: f64,
    sfn_express: f64,
}

fn cost(s: &Scenario) -> Cost {
    cost_with(s, 1.0)
}

/// How the table pays for its reads and writes (the template's `TableBillingMode`).
#[derive(Debug, Clone, Copy)]
enum Capacity {
    /// Per request unit.
    OnDemand,
    /// Per capacity-unit hour, auto scaling holding the capacity at `utilization` of what is
    /// provisioned: a unit consumed costs the unit-second's price over the utilization.
    Provisioned { utilization: f64 },
}

/// The utilization auto scaling holds a provisioned table at: the template's
/// `TableTargetUtilization` default. A steady load runs near it; a load that swings faster
/// than auto scaling follows runs below it, and costs more per unit.
const PROVISIONED_UTILIZATION: f64 = 0.70;

/// A provisioned table under a steady load, at [`PROVISIONED_UTILIZATION`].
const STEADY: Capacity = Capacity::Provisioned {
    utilization: PROVISIONED_UTILIZATION,
};

impl Capacity {
    /// USD per write request unit and per read request unit consumed.
    fn unit_prices(self) -> (f64, f64) {
        use prices::*;
        match self {
            Capacity::OnDemand => (DYNAMODB_WRU.usd, DYNAMODB_RRU.usd),
            Capacity::Provisioned { utilization } => (
                DYNAMODB_WCU_HOUR.usd / 3600.0 / utilization,
                DYNAMODB_RCU_HOUR.usd / 3600.0 / utilization,
            ),
        }
    }
}

/// The scenarios measured on the emulator at `AWS_ENDPOINT_URL` (loopback only).
async fn emulator_scenarios() -> anyhow::Result<Vec<Scenario>> {
    let endpoint = std::env::var("AWS_ENDPOINT_URL").unwrap_or_default();
    anyhow::ensure!(
        endpoint.starts_with("http://127.0.0.1") || endpoint.starts_with("http://localhost"),
        "the API-call counts run against an emulator on loopback: set AWS_ENDPOINT_URL (infra/bench.sh does), or pass --no-emulator"
    );
    eprintln!("API calls per task on the emulator…");
    let config = sas::aws::sdk_config().await;
    scenarios::measure(&scenarios::Target::Emulator(Box::new(config))).await
}

/// The cost with `batch` messages per invocation of every SQS-triggered function (and per
/// receive and per delete, which the event source mapping makes in batches): 1 is the upper
/// bound, one message per invocation; the template's mappings take up to 10 (the agent's 5),
/// which they fill when the queues are busy.
fn cost_with(s: &Scenario, batch: f64) -> Cost {
    cost_in(s, batch, Capacity::OnDemand)
}

/// [`cost_with`] on a table paying by `capacity`.
fn cost_in(s: &Scenario, batch: f64, capacity: Capacity) -> Cost {
    use prices::*;
    let (wru_usd, rru_usd) = capacity.unit_prices();
    let c = &s.counts;
    let inv = |f: &str| s.invocations.get(f).copied().unwrap_or(0) as f64;
    let secs = |f: &str| s.handler_seconds.get(f).copied().unwrap_or(0.0);
    // Lambda bills each invocation's duration rounded up to the millisecond; the measured time
    // is spread evenly over the function's invocations.
    let billed = |f: &str| {
        let n = inv(f);
        if n == 0.0 {
            0.0
        } else {
            n * ((secs(f) / n) * 1e3).ceil() / 1e3
        }
    };
    let orch_invocations = inv("submission") + (inv("scheduler") + inv("supervisor")) / batch;
    let orch_seconds = billed("submission") + billed("scheduler") + billed("supervisor");
    let consumed: u64 = ["work", "replies", "agent", "timers", "ends"]
        .iter()
        .map(|k| c.messages.get(*k).copied().unwrap_or(0))
        .sum();
    let agent_msgs = c.messages.get("agent").copied().unwrap_or(0) as f64;
    let sqs_requests = c.call("SQS SendMessage") as f64 + 2.0 * consumed as f64 / batch;
    // The agent's mapping takes at most 5 a batch.
    let per_message = 1.0 + 2.0 / batch.min(5.0);
    let agent_sqs = per_message * agent_msgs
        + c.messages.get("replies").copied().unwrap_or(0) as f64 * per_message;
    // The payloads kept by reference: S3's requests (a LIST billed as a PUT), and the objects
    // stored (GB of 2^30 bytes) for the task's retention.
    // A multipart upload's CreateMultipartUpload, UploadPart and CompleteMultipartUpload are
    // each billed as a PUT.
    let s3_requests = (c.call("S3 PutObject")
        + c.call("S3 ListObjectsV2")
        + c.call("S3 CreateMultipartUpload")
        + c.call("S3 UploadPart")
        + c.call("S3 CompleteMultipartUpload")) as f64
        * S3_PUT.usd
        + c.call("S3 GetObject") as f64 * S3_GET.usd;
    let s3_storage = c.stored_bytes() as f64 / (1u64 << 30) as f64 * PAYLOAD_RETENTION_DAYS * 24.0
        / HOURS_PER_MONTH
        * S3_STORAGE.usd;
    let orchestration = s3_requests
        + s3_storage
        + orch_invocations * LAMBDA_REQUEST.usd
        + orch_seconds * MEMORY_GB * LAMBDA_ARM_GB_SECOND.usd
        + c.wru * wru_usd
        + c.rru * rru_usd
        + (sqs_requests - agent_sqs) * SQS_REQUEST.usd
        // The ends queue (a distributed forEach's) is FIFO: its send, receive and delete are
        // billed at FIFO's price.
        + c.messages.get("ends").copied().unwrap_or(0) as f64
            * (1.0 + 2.0 / batch)
            * (SQS_FIFO_REQUEST.usd - SQS_REQUEST.usd)
        + c.events as f64 * EVENTBRIDGE_EVENT.usd
        // A callback reaches sas through the HTTP API (Step Functions' SendTaskSuccess is free).
        + s.callbacks as f64 * HTTP_API_REQUEST.usd;
    let agent_seconds = billed("agent") + inv("agent") * REMOTE_CALL_MS / 1e3;
    // The agents and their queues: the same work whichever orchestrator drives them.
    let agents = inv("agent") / batch.min(5.0) * LAMBDA_REQUEST.usd
        + agent_seconds * MEMORY_GB * LAMBDA_ARM_GB_SECOND.usd
        + agent_sqs * SQS_REQUEST.usd;
    let api = HTTP_API_REQUEST.usd;
    // Step Functions: the transitions, and the phase-ending events it would publish.
    let terminal_events = match s.final_state {
        sas::ProcessState::Processed | sas::ProcessState::Refused => 1.0,
        _ => 2.0,
    };
    let sfn_standard = s.sfn_transitions as f64 * SFN_STANDARD_TRANSITION.usd
        + terminal_events * EVENTBRIDGE_EVENT.usd;
    let express_seconds = ((agent_seconds + s.sfn_transitions as f64 * 0.01) * 10.0).ceil() / 10.0;
    let sfn_express = SFN_EXPRESS_REQUEST.usd
        + express_seconds * SFN_EXPRESS_GB * SFN_EXPRESS_GB_SECOND.usd
        + terminal_events * EVENTBRIDGE_EVENT.usd;
    Cost {
        orchestration,
        s3_requests,
        s3_storage,
        agents,
        api,
        sfn_standard,
        sfn_express,
    }
}

/// What a wait and a delivered event add to a task: the scenarios with them against the same
/// two steps alone (on the emulator, one message per invocation, on demand).
fn waits_table(scenarios: &[Scenario]) -> String {
    let of = |name: &str| scenarios.iter().find(|s| s.name == name).map(cost);
    let (Some(pair), Some(wait), Some(event)) = (
        of("2 steps"),
        of("2 steps, a 14-day wait between"),
        of("2 steps, an event between"),
    ) else {
        return "(the wait and event scenarios did not run)\n".into();
    };
    let days = groups::WAIT_DAYS as f64;
    let m = 1e6;
    let mut out = format!(
        "USD per million tasks, from the cost model above: what a {days}-day wait, and an event delivered through the task API, add to the same two steps (`2 steps`: ${:.2} sas orchestration, ${:.2} Step Functions Standard). Nothing runs while a task waits: no Lambda, no poll, no message re-armed; a wait costs what its end costs (the look-ahead's read and timer, the supervisor's invocation, the write), whatever its length, so per day it is that over the days waited. Step Functions bills a Wait state, and a task-token state, one transition each.\n\n| added | sas orchestration | per day of waiting | Step Functions Standard | per day of waiting |\n|---|---|---|---|---|\n",
        pair.orchestration * m,
        pair.sfn_standard * m
    );
    let wait_sas = (wait.orchestration - pair.orchestration) * m;
    let wait_sfn = (wait.sfn_standard - pair.sfn_standard) * m;
    out.push_str(&format!(
        "| a {days}-day wait | ${wait_sas:.2} | ${:.3} | ${wait_sfn:.2} | ${:.3} |\n",
        wait_sas / days,
        wait_sfn / days
    ));
    out.push_str(&format!(
        "| an event delivered (a waiting task) | ${:.2} | - | ${:.2} | - |\n",
        (event.orchestration - pair.orchestration) * m,
        (event.sfn_standard - pair.sfn_standard) * m
    ));
    out
}

/// Clean e-commerce orders through the in-memory system, every store call counted by the key it
/// lands on (an item's partition key, or a GSI partition): the write and read units each key
/// takes per task, and what that is at 1,000 tasks a second against DynamoDB's per-partition
/// limits (1,000 WCU, 3,000 RCU). Backs docs/capacity.md ("Load per key").
async fn key_load(tasks: usize) -> anyhow::Result<String> {
    // The deployed default's due shards (the template's `DueShards`), not the local runner's.
    let mut settings = Settings {
        poll_wait: Duration::from_millis(50),
        due_shards: 16,
        ..Settings::default()
    };
    // One caller, allowed 1,000 requests a second as a deployment serving it at that rate
    // would (its allowance then spreads over 10 items); a burst large enough that the run,
    // faster than that, is never held back.
    settings.rate_limit = Some(sas::domain::rate::RateLimit {
        per_second: 1000.0,
        burst: 1_000_000,
    });
    let meter = Arc::new(counting::Meter::default());
    let p = scenarios::wrap(
        sas_local::ports(Backend::Memory, &settings).await?,
        &meter,
        settings.due_shards,
    );
    let files = settings.definitions.clone();
    let shards = settings.due_shards;
    let mut system = System::from_ports(p, settings, Arc::new(SystemClock));
    system.publish(&files).await?;
    system.start();
    let ids = submit_burst(&system, "ecommerce-order", tasks, 64).await?;
    // The bench reads the uncounted memory store: its reads are not the system's.
    let store = system
        .memory
        .as_ref()
        .map(|(store, _, _)| store.clone())
        .ok_or_else(|| anyhow::anyhow!("no memory store"))?;
    let until = Instant::now() + Duration::from_secs(300);
    loop {
        let mut done = 0;
        for id in &ids {
            if let Some(r) = sas::ports::TaskStore::get_state(store.as_ref(), *id).await?
                && r.process_state == sas::ProcessState::Processed
                && !r.notice_pending()
            {
                done += 1;
            }
        }
        if done == ids.len() {
            break;
        }
        anyhow::ensure!(
            Instant::now() < until,
            "{done} of {} processed in 300 s",
            ids.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    system.shutdown().await;
    Ok(key_table(&meter.take(), tasks, shards))
}

/// The key-load table of a run of `tasks` tasks (see [`key_load`]).
fn key_table(c: &counting::Counts, tasks: usize, shards: u32) -> String {
    let n = tasks.max(1) as f64;
    // Per-task keys (one item per task or per idempotency key) are summed by kind: the table
    // shows one such key's share (a task's whole life, not a rate).
    let mut per_task: std::collections::BTreeMap<&str, (f64, f64, usize)> = Default::default();
    let mut shared = Vec::new();
    for (key, (w, r)) in &c.keys {
        match key.split_once(": ") {
            Some((kind, _)) => {
                let e = per_task.entry(kind).or_default();
                e.0 += w;
                e.1 += r;
                e.2 += 1;
            }
            None => shared.push((key.as_str(), *w, *r)),
        }
    }
    shared.sort_by(|a, b| b.1.total_cmp(&a.1));
    let mut t = format!(
        "{tasks} clean e-commerce orders through the in-memory system (one caller, `DUE_SHARDS={shards}`), every store call counted by the partition it lands on. Per task: the key's units over the run divided by the tasks; at 1,000 tasks a second: that times 1,000, against DynamoDB's per-partition 1,000 WCU and 3,000 RCU. Leases are written per sweep, not per task. Index reads (the sweep's queries) count 0.5 RRU a query.\n\n| key | WRU per task | RRU per task | WRU/s at 1,000 tasks/s | of 1,000 WCU | RRU/s | of 3,000 RCU |\n|---|---|---|---|---|---|---|\n"
    );
    for (kind, (w, r, keys)) in &per_task {
        let keys = (*keys).max(1) as f64;
        t.push_str(&format!(
            "| `{kind}` (one per task: a task's life) | {:.2} | {:.2} | - | - | - | - |\n",
            w / keys,
            r / keys
        ));
    }
    for (key, w, r) in shared {
        let (wps, rps) = (w / n * 1000.0, r / n * 1000.0);
        t.push_str(&format!(
            "| `{key}` | {:.3} | {:.3} | {wps:.0} | {:.0}% | {rps:.0} | {:.0}% |\n",
            w / n,
            r / n,
            wps / 10.0,
            rps / 30.0
        ));
    }
    t
}

/// Every DynamoDB write of the clean task of each workflow: what it billed on the item and on
/// each index, so that the WRU rows of the call table can be checked by hand.
fn writes_table(scenarios: &[Scenario]) -> String {
    let mut t = String::from(
        "The clean task of each workflow, and the parallel group beside the same steps in a line, every write in order: the item's size (the larger of the old and the new item: DynamoDB bills that, in 1 KB units; a transaction twice), and the units each index entry cost (an entry added or removed: 1 per KB; an entry whose key changed: a delete and a put; an entry whose keys and projected attributes did not change: nothing).\n",
    );
    // (A variant, "(no deadline timers)", writes what its scenario writes.)
    for s in scenarios.iter().filter(|s| {
        (s.name.starts_with("clean") && !s.name.contains(" ("))
            || s.workflow == groups::PARALLEL
            || s.workflow == groups::LINE
            || s.workflow == groups::PAIR
            || s.workflow == groups::KEYED
    }) {
        t.push_str(&format!(
            "\n`{}` ({}):\n\n| # | write | item bytes | table | `due-index` | `state-index` | `caller-shard-index` | `key-index-*` | total |\n|---|---|---|---|---|---|---|---|---|\n",
            s.workflow, s.name
        ));
        for (i, w) in s.counts.writes.iter().enumerate() {
            t.push_str(&format!(
                "| {} | {} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} |\n",
                i + 1,
                w.label,
                w.item_bytes,
                w.table,
                w.due_index,
                w.state_index,
                w.caller_index,
                w.key_indexes,
                w.total()
            ));
        }
        let sum = s.counts.wru_by_place();
        t.push_str(&format!(
            "| | all writes | | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} |\n",
            sum.table,
            sum.due_index,
            sum.state_index,
            sum.caller_index,
            sum.key_indexes,
            sum.total()
        ));
    }
    t
}

/// The scenarios added after the baseline was measured (the parallel group, the line and the
/// forEach): their before/after rows say `new`. Any other scenario must have a
/// baseline row.
const NEW_SCENARIOS: [&str; 10] = [
    "3 parallel branches",
    "the same 3 steps in a line",
    "forEach: 100 elements, 10 at once",
    "2 steps",
    scenarios::KEYED_SCENARIO,
    "2 steps, a 14-day wait between",
    "2 steps, an event between",
    "2 steps, a service with limits",
    "2 steps, the second a 1-step child",
    scenarios::MB_SCENARIO,
];

/// The figures of the baseline run (`infra/bench/baseline.json`, committed with the commit and
/// date they were measured at) beside this run's, scenario by scenario.
fn before_after_table(scenarios: &[Scenario]) -> anyhow::Result<String> {
    let baseline: serde_json::Value = serde_json::from_str(include_str!("../baseline.json"))?;
    let mut t = format!(
        "This run against the baseline measured on {} at `{}` ({}). Orchestration in USD per million tasks; the rest per task. `sas / Standard` is this run's orchestration against Step Functions Standard's.\n\n| task | orchestration before | now | change | WRU before | now | RRU before | now | events before | now | SQS sends before | now | sas / Standard |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        baseline["measured"].as_str().unwrap_or("?"),
        baseline["commit"].as_str().unwrap_or("?"),
        baseline["note"].as_str().unwrap_or_default(),
    );
    for s in scenarios {
        // A variant of a scenario ("clean e-commerce order (no deadline timers)") is measured
        // against the scenario's own baseline ("clean e-commerce order"): the same task before the
        // cost work.
        let b = match &baseline["scenarios"][s.name] {
            serde_json::Value::Null => {
                let base = s.name.split(" (").next().unwrap_or(s.name);
                &baseline["scenarios"][base]
            }
            b => b,
        };
        let f = |k: &str| b[k].as_f64();
        let c = cost(s);
        let now = c.orchestration * 1e6;
        if b.is_null() && NEW_SCENARIOS.contains(&s.name) {
            // Measured first after the baseline: nothing to compare with.
            t.push_str(&format!(
                "| {} | - | ${now:.2} | new | - | {:.0} | - | {:.1} | - | {} | - | {} | 1/{:.1} |\n",
                s.name,
                s.counts.wru,
                s.counts.rru,
                s.counts.events,
                s.counts.call("SQS SendMessage"),
                c.sfn_standard / c.orchestration,
            ));
            continue;
        }
        let (Some(usd), Some(wru), Some(rru), Some(events), Some(sends)) = (
            f("orchestration_usd"),
            f("wru"),
            f("rru"),
            f("events"),
            f("sqs_sends"),
        ) else {
            anyhow::bail!("baseline.json has no complete row for {:?}", s.name);
        };
        t.push_str(&format!(
            "| {} | ${usd:.2} | ${now:.2} | {:+.0}% | {wru:.0} | {:.0} | {rru:.1} | {:.1} | {events:.0} | {} | {sends:.0} | {} | 1/{:.1} |\n",
            s.name,
            (now / usd - 1.0) * 100.0,
            s.counts.wru,
            s.counts.rru,
            s.counts.events,
            s.counts.call("SQS SendMessage"),
            c.sfn_standard / c.orchestration,
        ));
    }
    Ok(t)
}

fn cost_table(scenarios: &[Scenario]) -> String {
    let m = 1e6;
    let (steady_wru, steady_rru) = STEADY.unit_prices();
    let mut t = format!(
        "USD per million tasks, us-east-1, on-demand, no free tier; prices checked {} (sources below). \
Lambda durations are the handlers' wall times measured on the emulator (in the table above; they include the poll's receive and delete, so they are an upper bound), billed per millisecond; the simulated remote services answer at once, so each agent invocation gets {REMOTE_CALL_MS} ms more for a real service's answer. Functions have {} MB; one message per invocation; each consumed message costs one receive and one delete. \
*Orchestration* is everything but the agents and the API: submission, scheduler and supervisor invocations, DynamoDB (with the GSI writes and the transaction's double charge), SQS, EventBridge, and S3 for payloads kept by reference (its requests, and the objects' storage until the task's retention ends, {PAYLOAD_RETENTION_DAYS:.0} days after it ends: the template's `RetentionDays` default). The Step Functions columns replace that with the state machine's transitions (the count is in the table above) and its events; the agents and the API cost the same either way and are added to every total. \
Fixed monthly costs are left out: the supervisor's schedule (43,200 invocations a month) and the event source mappings' empty long polls.\n\n\
| task | sas orchestration | Step Functions Standard | Step Functions Express | agents (both) | HTTP API (both) | sas total | Standard total | Express total |\n|---|---|---|---|---|---|---|---|---|\n",
        prices::CHECKED,
        (MEMORY_GB * 1024.0) as u32
    );
    for s in scenarios {
        let c = cost(s);
        t.push_str(&format!(
            "| {} | ${:.2} | ${:.2} | ${:.2} | ${:.2} | ${:.2} | ${:.2} | ${:.2} | ${:.2} |\n",
            s.name,
            c.orchestration * m,
            c.sfn_standard * m,
            c.sfn_express * m,
            c.agents * m,
            c.api * m,
            (c.orchestration + c.agents + c.api) * m,
            (c.sfn_standard + c.agents + c.api) * m,
            (c.sfn_express + c.agents + c.api) * m,
        ));
    }
    t.push_str(&format!(
        "\nUnder load the event source mappings fill their batches (up to 10 messages; the agent's 5), so the scheduler's and the supervisor's invocations and the queues' receives and deletes are shared by the batch (the sends, the writes and the events are not). With full batches of {AT_LOAD_BATCH}, on demand and, for a steady load, on provisioned capacity (`TableBillingMode=PROVISIONED`: auto scaling holds the table and each index at {:.0}% of their capacity, so a unit consumed costs the capacity-hour's price / 3,600 / {PROVISIONED_UTILIZATION}: ${:.3} per million writes against ${:.3} on demand, ${:.3} per million reads against ${:.3}):\n\n| task | sas orchestration, one message per invocation | sas orchestration, full batches | sas orchestration, full batches, provisioned | Step Functions Standard | sas / Standard, full batches | sas / Standard, full batches, provisioned |\n|---|---|---|---|---|---|---|\n",
        PROVISIONED_UTILIZATION * 100.0,
        steady_wru * m,
        prices::DYNAMODB_WRU.usd * m,
        steady_rru * m,
        prices::DYNAMODB_RRU.usd * m,
    ));
    for s in scenarios {
        let (one, full) = (cost(s), cost_with(s, AT_LOAD_BATCH));
        let steady = cost_in(s, AT_LOAD_BATCH, STEADY);
        t.push_str(&format!(
            "| {} | ${:.2} | ${:.2} | ${:.2} | ${:.2} | 1/{:.1} | 1/{:.1} |\n",
            s.name,
            one.orchestration * m,
            full.orchestration * m,
            steady.orchestration * m,
            one.sfn_standard * m,
            one.sfn_standard / full.orchestration,
            one.sfn_standard / steady.orchestration
        ));
    }
    t.push_str("\nPrices:\n\n| item | USD | per | source |\n|---|---|---|---|\n");
    for p in prices::ALL {
        t.push_str(&format!(
            "| {} | {:.10} | {} | {} |\n",
            p.item, p.usd, p.unit, p.source
        ));
    }
    t.push_str("\nThe equivalent Standard state machines, one per workflow. E-commerce order: `Reserve`, `Charge`, `Ship` (Task states that send the request with a task token and wait; `Retry` on timeout, `Catch` to the compensation), `NotifyProcessed` (EventBridge task), `Done` (Succeed): 5 transitions for a clean e-commerce order, one more per retried step; refused at the third step (a business outcome, no alert): `Reserve`, `Charge`, `Ship`, `Refund`, `Release`, `NotifyRefused`, `Failed`: 7. Loan application: `CheckCredit`, `ReserveFunds`, `SendContract` (`.waitForTaskToken`: the contract's delivery comes by callback), `Signature` (`.waitForTaskToken`: the e-sign webhook's `SendTaskSuccess`), `CoolingOff` (a Wait state of 14 days), `DisburseFunds`, `NotifyProcessed`, `Done`: 8 for a clean loan; refused at the contract: `CheckCredit`, `ReserveFunds`, `SendContract`, `ReleaseFunds` (the credit check has no undo), `NotifyRefused`, `Failed`: 6. The bench's own workflows: the parallel group is a Parallel state over three branches of one Task state each, `NotifyProcessed`, `Done`: 6; its line, three Task states, `NotifyProcessed`, `Done`: 5; the forEach an inline Map state (`MaxConcurrency` 10) whose 100 iterations run one Task state each, `NotifyProcessed`, `Done`: 103. Express is billed per request and per GB-second of the whole execution (64 MB, 100 ms increments) and cannot wait out an outage longer than its 5-minute limit.\n");
    t
}

/// Each function's cold-start init, measured on its host binary in `functions_dir` (see
/// [`init`]), beside its binary sizes: the host's and the arm64 `bootstrap` of the last `sam
/// build` in `sam_build`, if there is one.
async fn init_and_size(
    functions_dir: &std::path::Path,
    sam_build: &std::path::Path,
    runs: usize,
) -> anyhow::Result<String> {
    let (dir, build) = (functions_dir.to_owned(), sam_build.to_owned());
    // The starts are timed on threads of their own, away from this runtime's.
    let rows = tokio::task::spawn_blocking(move || init::measure(&dir, &build, runs))
        .await
        .map_err(|e| anyhow::anyhow!("the cold starts' thread: {e}"))??;
    Ok(init::report(
        &rows,
        runs,
        functions_dir,
        sam_build,
        init::sam_built_at(sam_build),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The load-per-key run adds up to the write-by-write table: a clean e-commerce order writes
    /// its due shard 2 WRU (its entry made at submission, removed once its notice is out) and its
    /// state-index partitions 3 (its `Active` entry made at submission, moved to `Processed` at
    /// its end: the claim moves none), one caller-shard-index entry, one rate-limit update; the
    /// shared keys are spread over the shards.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_load_per_key_adds_up_to_the_writes_of_a_clean_ecommerce_order() {
        let t = key_load(200).await.expect("the run");
        // The second column of the rows whose key starts with `prefix`.
        let column = |prefix: &str| -> Vec<f64> {
            t.lines()
                .filter(|l| l.starts_with(&format!("| `{prefix}")))
                .filter_map(|l| l.split('|').nth(2)?.trim().parse::<f64>().ok())
                .collect()
        };
        let per_task = |prefix: &str| -> f64 { column(prefix).iter().sum() };
        let due = per_task("due-index due#");
        assert!((1.5..=2.5).contains(&due), "due-index {due}:\n{t}");
        let state = per_task("state-index ");
        assert!((2.5..=3.5).contains(&state), "state-index {state}:\n{t}");
        assert!((per_task("caller-shard-index ") - 1.0).abs() < 1e-9, "{t}");
        // One caller's entries spread over its four partitions: none takes all of them.
        let caller_rows = column("caller-shard-index ");
        assert_eq!(caller_rows.len(), 4, "{t}");
        assert!(caller_rows.iter().all(|&w| w < 0.5), "{t}");
        assert!((per_task("RATE#") - 1.0).abs() < 1e-9, "{t}");
        // The allowance of 1,000 a second spread over ten items.
        let rate_rows = t.lines().filter(|l| l.starts_with("| `RATE#")).count();
        assert_eq!(rate_rows, 10, "{t}");
        assert!(t.contains("`TASK#<id>` (one per task"), "{t}");
        // Sixteen due shards share the load: none takes much more than its share.
        let due_rows = column("due-index due#");
        assert_eq!(due_rows.len(), 16, "{t}");
        assert!(due_rows.iter().all(|&w| w < 0.6), "{t}");
    }

    /// The tables of BENCHMARKS.md from the scenarios run in memory: one column (and one cost
    /// row) per scenario, both workflows, and totals that add up.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_call_and_cost_tables_cover_every_scenario_of_both_workflows() {
        let s = scenarios::measure(&scenarios::Target::Memory)
            .await
            .expect("the scenarios run");
        let calls = calls_table(&s);
        let header = calls
            .lines()
            .find(|l| l.starts_with("| call |"))
            .expect("a header");
        assert_eq!(header.matches('|').count(), s.len() + 2, "{header}");
        for row in [
            "| workflow |",
            "| steps | 3 | 4 |",
            "| DynamoDB writes per step |",
        ] {
            assert!(calls.contains(row), "{row} missing:\n{calls}");
        }
        assert!(calls.contains("`loan-application`") && calls.contains("`ecommerce-order`"));
        // The write-by-write table adds up to the call table's WRU.
        let writes = writes_table(&s);
        for sc in s
            .iter()
            .filter(|sc| sc.name.starts_with("clean") && !sc.name.contains(" ("))
        {
            let sum = sc.counts.wru_by_place().total();
            assert!(
                (sum - sc.counts.wru).abs() < 1e-9,
                "{}: {sum} vs {}",
                sc.name,
                sc.counts.wru
            );
            assert!(
                sc.counts.writes.len() >= 5,
                "{}: {:?}",
                sc.name,
                sc.counts.writes
            );
            assert!(
                writes.contains(&format!("`{}` ({})", sc.workflow, sc.name)),
                "{writes}"
            );
        }
        assert!(writes.contains(" | create (task, state, key"), "{writes}");
        println!("{writes}");
        let costs = cost_table(&s);
        assert!(costs.starts_with("USD per million tasks"), "{costs}");
        for sc in &s {
            let row = costs
                .lines()
                .find(|l| l.starts_with(&format!("| {} |", sc.name)))
                .unwrap_or_else(|| panic!("no cost row for {}:\n{costs}", sc.name));
            let usd: Vec<f64> = row
                .split('|')
                .filter_map(|c| c.trim().strip_prefix('$')?.parse().ok())
                .collect();
            assert_eq!(usd.len(), 8, "{row}");
            // sas total = orchestration + agents + API.
            assert!((usd[5] - (usd[0] + usd[3] + usd[4])).abs() < 0.02, "{row}");
            assert!(usd[0] > 0.0, "{row}");
        }
        // Every scenario but the new ones has its baseline row, and the change is computed
        // from both; a new one says so.
        let before_after = before_after_table(&s).expect("every scenario has a baseline");
        for sc in &s {
            let row = before_after
                .lines()
                .find(|l| l.starts_with(&format!("| {} |", sc.name)))
                .unwrap_or_else(|| panic!("no before/after row for {}:\n{before_after}", sc.name));
            let new = NEW_SCENARIOS.contains(&sc.name);
            assert_eq!(row.contains("| new |"), new, "{row}");
            assert!((row.contains('%') || new) && row.contains("1/"), "{row}");
        }
        assert!(
            s.iter()
                .filter(|sc| NEW_SCENARIOS.contains(&sc.name))
                .count()
                == NEW_SCENARIOS.len()
        );
        // Two search keys cost the pair two write units: one entry in a key index each.
        let of = |name: &str| {
            s.iter()
                .find(|sc| sc.name == name)
                .unwrap_or_else(|| panic!("no scenario {name}"))
        };
        let (pair, keyed) = (of("2 steps"), of(scenarios::KEYED_SCENARIO));
        assert_eq!(keyed.counts.wru_by_place().key_indexes, 2.0);
        assert_eq!(pair.counts.wru_by_place().key_indexes, 0.0);
        assert!(
            (keyed.counts.wru - pair.counts.wru - 2.0).abs() < 1e-9,
            "{} vs {}",
            keyed.counts.wru,
            pair.counts.wru
        );
        // What a wait and an event add: positive, and a day of waiting a fraction of a wait.
        let waits = waits_table(&s);
        let row = |start: &str| -> Vec<f64> {
            waits
                .lines()
                .find(|l| l.starts_with(start))
                .unwrap_or_else(|| panic!("no row {start}:\n{waits}"))
                .split('|')
                .filter_map(|c| c.trim().strip_prefix('$')?.parse().ok())
                .collect()
        };
        let wait = row("| a 14-day wait |");
        assert_eq!(wait.len(), 4, "{waits}");
        assert!(
            wait[0] > 0.0 && (wait[1] - wait[0] / 14.0).abs() < 0.01,
            "{waits}"
        );
        assert!(row("| an event delivered")[0] > 0.0, "{waits}");
        // The group against the line, and the forEach per element, from the same scenarios.
        let group = groups::group_cost(&s, |sc| cost(sc).orchestration);
        assert!(group.contains("against the line's"), "{group}");
        let each = groups::for_each_cost(&s, |sc| cost(sc).orchestration);
        let wru = each
            .lines()
            .find(|l| l.starts_with("| DynamoDB write request units |"))
            .unwrap_or_else(|| panic!("no WRU row:\n{each}"));
        let cells: Vec<f64> = wru
            .split('|')
            .filter_map(|c| c.trim().parse().ok())
            .collect();
        assert_eq!(cells.len(), 3, "{wru}");
        assert!(
            (cells[0] / groups::ELEMENTS as f64 - cells[1]).abs() < 0.01,
            "per element is per task / 100: {wru}"
        );
        assert!(each.contains("(100 keys, each applied once)"), "{each}");
        // The 1 MiB result against the pair: its S3 calls and storage are added, and cost; the
        // result is written and stored once (the second body names it as a part).
        let mb = groups::mb_cost(&s, |sc| {
            let c = cost(sc);
            (c.orchestration, c.s3_requests, c.s3_storage)
        });
        let added = |label: &str| -> f64 {
            mb.lines()
                .find(|l| l.starts_with(&format!("| {label} |")))
                .and_then(|l| l.split('|').nth(4)?.trim().parse().ok())
                .unwrap_or_else(|| panic!("no row {label}:\n{mb}"))
        };
        assert_eq!(added("S3 PutObject"), 1.0, "{mb}");
        assert_eq!(added("S3 GetObject"), 2.0, "{mb}");
        assert_eq!(
            added("bytes stored in S3"),
            groups::RESULT_BYTES as f64,
            "{mb}"
        );
        assert!(added("orchestration: S3 requests, USD") > 0.0, "{mb}");
        assert!(added("orchestration: S3 storage, USD") > 0.0, "{mb}");
        assert!(mb.contains("per MiB passed"), "{mb}");
        println!("{mb}");
        let pair = s
            .iter()
            .find(|sc| sc.workflow == groups::PAIR)
            .expect("the pair");
        let passed = s
            .iter()
            .find(|sc| sc.workflow == groups::MB)
            .expect("the MiB");
        assert!(cost(passed).orchestration > cost(pair).orchestration);
        assert_eq!((cost(pair).s3_requests, cost(pair).s3_storage), (0.0, 0.0));
        // Progress events are off by default: a clean e-commerce order publishes only
        // `TaskProcessed`.
        assert_eq!(s[0].name, "clean e-commerce order");
        assert_eq!(s[0].counts.events, 1, "{:?}", s[0].counts);
        let c = |i: usize| cost(&s[i]).orchestration;
        for sc in &s {
            assert!(
                cost_with(sc, AT_LOAD_BATCH).orchestration < cost(sc).orchestration,
                "full batches cost less: {}",
                sc.name
            );
        }
        assert!(costs.contains("full batches"), "{costs}");
        // Provisioned capacity at the template's target costs less per unit than on demand,
        // so less per task; at 10% utilization it would cost more.
        let idle = Capacity::Provisioned { utilization: 0.1 };
        for sc in &s {
            let on_demand = cost_with(sc, AT_LOAD_BATCH).orchestration;
            assert!(
                cost_in(sc, AT_LOAD_BATCH, STEADY).orchestration < on_demand,
                "{}",
                sc.name
            );
            assert!(
                cost_in(sc, AT_LOAD_BATCH, idle).orchestration > on_demand,
                "{}",
                sc.name
            );
        }
        assert!(costs.contains("provisioned"), "{costs}");
        assert!(
            c(3) > c(0),
            "a compensated order costs more than a clean one"
        );
        assert!(c(1) > c(0), "a 4-step loan costs more than a 3-step order");
        // The task API's claim of the first step saves the work message (its send, receive and
        // delete), a scheduler invocation and the claim's write.
        let by_scheduler = s
            .iter()
            .find(|sc| sc.name == "clean e-commerce order (claimed by the scheduler)")
            .expect("the variant");
        let work = |sc: &scenarios::Scenario| sc.counts.messages.get("work").copied().unwrap_or(0);
        assert_eq!((work(&s[0]), work(by_scheduler)), (0, 1));
        assert!(
            by_scheduler.counts.wru > s[0].counts.wru,
            "the claim's write"
        );
        assert!(cost(by_scheduler).orchestration > c(0));
    }
}
