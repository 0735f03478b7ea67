//! Parallel groups and forEach steps. The bench's own workflows, written here and published
//! into every system the bench builds: a parallel group of three branches, the same three
//! steps in a line, and a forEach over [`ELEMENTS`] elements at [`MAX_CONCURRENCY`] (every step
//! undoable). [`parallel_vs_line`] times the first two with services that take 100, 200 and
//! 300 ms; [`for_each_race`] runs the forEach with several scheduler pollers, so that its
//! elements' replies race on the task's one record, and counts the writes that lose;
//! [`for_each_cost`] divides the forEach scenario's counts (see `scenarios::measure`) by its
//! elements; [`mb_cost`] sets the two steps passing a [`RESULT_BYTES`] result ([`MB`]) against
//! the same two steps passing a small one ([`PAIR`]).

use crate::counting::{Counts, LOST, Meter, WriteUnits};
use crate::scenarios::{self, Scenario};
use sas::ports::{RemoteCall, RemoteFault, RemoteService};
use sas::ports::{SystemClock, TaskStore};
use sas::remote::{Faults, SimulatedService};
use sas::{ProcessState, TaskId};
use sas_local::{Backend, Settings, System};
use serde_json::{Value, json};
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A parallel group of three branches, one step each.
pub const PARALLEL: &str = "bench-parallel";
/// The same three steps, one after the other.
pub const LINE: &str = "bench-line";
/// One forEach step over the input's `items`.
pub const FOR_EACH: &str = "bench-for-each";
/// The forEach's elements (the most a forEach takes) and how many are out at once.
pub const ELEMENTS: usize = 100;
pub const MAX_CONCURRENCY: usize = 10;
/// Two of the line's steps, one after the other: what a wait or an event between them adds to.
pub const PAIR: &str = "bench-pair";
/// [`PAIR`] with two search keys: what a key costs a task.
pub const KEYED: &str = "bench-keyed";
/// Two of the line's steps with a 14-day wait between them.
pub const WAIT: &str = "bench-wait";
/// How long [`WAIT`] waits.
pub const WAIT_DAYS: i64 = 14;
/// Two of the line's steps with a wait for a named event between them.
pub const EVENT: &str = "bench-event";
/// The bench's two steps on a service with limits (a slot and a token before each call).
pub const LIMITED: &str = "bench-limited";
/// That service: 10 calls at once, 100 a second (burst 10).
pub const METERED: &str = "bench-metered";
/// One of the line's steps as a workflow of its own, run as a child task by [`CHILD_PAIR`].
pub const CHILD: &str = "bench-child";
/// [`PAIR`] with its second step run as a sub-workflow ([`CHILD`]): what a child costs and
/// takes against the same step inline.
pub const CHILD_PAIR: &str = "bench-child-pair";
/// Two steps, the first's service ([`REPORT`]) answering a result of [`RESULT_BYTES`], the
/// second's request carrying it whole: what a large result passed on costs against [`PAIR`].
pub const MB: &str = "bench-mb";
/// [`MB`]'s first service: the simulated service, its answer padded to [`RESULT_BYTES`] (see
/// [`Reporting`]).
pub const REPORT: &str = "bench-report";
/// The size of [`REPORT`]'s result, serialized: 1 MiB. Under every limit on the way: a step's
/// result (`MAX_RESULT_BYTES`), what an agent reads of an answer (`MAX_ANSWER_BYTES`) and a
/// mapped request (`MAX_REQUEST_BYTES`); over the inline sizes of an item and a message, so
/// it is kept in the payload store (S3) and passed by reference.
pub const RESULT_BYTES: usize = 1024 * 1024;
/// The event [`EVENT`] waits for.
pub const EVENT_NAME: &str = "signed";
/// The three steps' services, with what each takes in the timed run.
pub const BRANCHES: [(&str, u64); 3] = [("bench-a", 100), ("bench-b", 200), ("bench-c", 300)];
/// The forEach's service, and what each element's call takes in the timed run.
pub const EACH: &str = "bench-each";
pub const EACH_MS: u64 = 100;

/// The bench's services and workflows, as files to publish (services first).
pub fn definitions() -> Vec<(String, String)> {
    let services: Vec<Value> = BRANCHES
        .iter()
        .map(|(name, _)| *name)
        .chain([EACH, REPORT])
        .map(|name| json!({"name": name, "description": "the bench's", "target": {"type": "simulated"}}))
        .collect();
    // The three steps, undoable as the e-commerce order's are.
    let step = |(service, _): &(&str, u64)| {
        let name = format!("step-{}", service.trim_start_matches("bench-"));
        json!({"name": name, "service": service, "input": {"customerId": "$.input.customerId"},
               "undo": {"action": "undo", "input": {"id": format!("$.steps['{name}'].result.id")}}})
    };
    let parallel = json!({
        "name": PARALLEL,
        "description": "Three branches of one step each, at once.",
        "steps": [{"name": "group", "parallel": BRANCHES.iter().map(|b| json!({
            "name": b.0.trim_start_matches("bench-"),
            "steps": [step(b)],
        })).collect::<Vec<_>>()}],
    });
    let line = json!({
        "name": LINE,
        "description": "The parallel group's three steps, one after the other.",
        "steps": BRANCHES.iter().map(step).collect::<Vec<_>>(),
    });
    let for_each = json!({
        "name": FOR_EACH,
        "description": "One call per item, a few at once.",
        "steps": [{
            "name": "each", "service": EACH, "forEach": "$.input.items",
            "maxConcurrency": MAX_CONCURRENCY,
            "input": {"item": "$.element", "n": "$.index"},
            "undo": {"action": "undo-each", "input": {"id": "$.steps['each'].result.id", "item": "$.element"}},
        }],
    });
    let mut services = services;
    services.push(
        json!({"name": METERED, "description": "the bench's, with limits",
        "target": {"type": "simulated"},
        "limits": {"concurrency": 10, "rate": {"perSecond": 100, "burst": 10}}}),
    );
    let mut files = vec![(
        "bench-services.json".to_owned(),
        json!({"services": services}),
    )];
    let metered = |name: &str| {
        json!({"name": name, "service": METERED, "input": {"customerId": "$.input.customerId"},
               "undo": {"action": "undo", "input": {"id": format!("$.steps['{name}'].result.id")}}})
    };
    let limited = json!({
        "name": LIMITED,
        "description": "Two steps, one after the other, on a service with limits.",
        "steps": [metered("first"), metered("second")],
    });
    let first_last = || {
        let steps: Vec<Value> = BRANCHES.iter().map(step).collect();
        (steps[0].clone(), steps[2].clone())
    };
    let (a, c) = first_last();
    let pair = json!({
        "name": PAIR,
        "description": "Two steps, one after the other.",
        "steps": [a, c],
    });
    let (a, c) = first_last();
    let keyed = json!({
        "name": KEYED,
        "description": "Two steps, one after the other; a task found by its customer and order.",
        "keys": {"customerId": "$.input.customerId", "orderId": "$.input.orderId"},
        "steps": [a, c],
    });
    let (a, c) = first_last();
    let wait = json!({
        "name": WAIT,
        "description": "Two steps, 14 days apart.",
        "steps": [a, {"name": "hold", "wait": format!("{WAIT_DAYS}d")}, c],
    });
    let (a, c) = first_last();
    let event = json!({
        "name": EVENT,
        "description": "Two steps, the second once an event came.",
        "steps": [a, {"name": "signature", "waitFor": EVENT_NAME, "within": "30d"}, c],
    });
    let (a, c) = first_last();
    let child = json!({
        "name": CHILD,
        "description": "The pair's second step, as a workflow of its own.",
        "steps": [c],
    });
    let child_pair = json!({
        "name": CHILD_PAIR,
        "description": "Two steps, the second run as a child task.",
        "steps": [a, {"name": "step-c", "workflow": CHILD, "input": {"customerId": "$.input.customerId"}}],
    });
    // The pair's first step on the service with the large answer; its second step's request
    // carries that answer whole (and the customer, as the pair's does).
    let (_, c) = first_last();
    let mut passed_on = c;
    passed_on["input"]["report"] = json!("$.steps['step-report'].result");
    let mb = json!({
        "name": MB,
        "description": "Two steps, the second's request carrying the first's 1 MiB result.",
        "steps": [
            step(&(REPORT, 0)),
            passed_on,
        ],
    });
    // The child first: publishing checks that a parent's child is known.
    for (name, w) in [
        (CHILD, child),
        (CHILD_PAIR, child_pair),
        (PARALLEL, parallel),
        (LINE, line),
        (FOR_EACH, for_each),
        (PAIR, pair),
        (KEYED, keyed),
        (WAIT, wait),
        (EVENT, event),
        (LIMITED, limited),
        (MB, mb),
    ] {
        files.push((format!("{name}.json"), w));
    }
    files.into_iter().map(|(f, v)| (f, v.to_string())).collect()
}

/// The input of a task of one of the bench's workflows (`None` for any other).
pub fn input(workflow: &str) -> Option<Value> {
    match workflow {
        PARALLEL | LINE | PAIR | WAIT | EVENT | LIMITED | CHILD | CHILD_PAIR | MB => {
            Some(json!({"customerId": "bench"}))
        }
        KEYED => Some(json!({"customerId": "bench", "orderId": "o-1"})),
        FOR_EACH => Some(json!({
            "items": (0..ELEMENTS).map(|i| format!("item-{i:03}")).collect::<Vec<_>>(),
        })),
        _ => None,
    }
}

/// [`REPORT`]'s service: the simulated service (which applies and counts its effects by key as
/// every other does), its success answered with a `report` string that brings it to
/// [`RESULT_BYTES`] of JSON. The simulated service has no such answer of its own.
pub struct Reporting(pub Arc<SimulatedService>);

#[async_trait::async_trait]
impl RemoteService for Reporting {
    async fn call(&self, call: &RemoteCall, timeout: Duration) -> Result<Value, RemoteFault> {
        let mut answer = self.0.call(call, timeout).await?;
        // An undo's answer is nobody's input: only a step's is padded.
        if call.undoes.is_none() {
            pad(&mut answer, RESULT_BYTES);
        }
        Ok(answer)
    }
}

/// `answer` (an object) with a `report` string that makes it `bytes` long serialized, if it
/// is shorter.
pub fn pad(answer: &mut Value, bytes: usize) {
    let Some(fields) = answer.as_object_mut() else {
        return;
    };
    fields.insert("report".into(), Value::String(String::new()));
    let short = bytes.saturating_sub(answer.to_string().len());
    answer["report"] = Value::String("r".repeat(short));
}

/// The simulated services' latencies of the timed runs.
fn latencies() -> Vec<(String, Faults)> {
    BRANCHES
        .iter()
        .copied()
        .chain([(EACH, EACH_MS)])
        .map(|(name, ms)| {
            let faults = Faults {
                latency: Duration::from_millis(ms),
                ..Faults::default()
            };
            (name.to_owned(), faults)
        })
        .collect()
}

/// A running in-memory system with the bench's workflows published, its services taking their
/// timed-run latencies, every store, queue and bus call taking `call_ms` and counted on the
/// meter returned, and `pollers` scheduler pollers on each of its queues; with the store
/// underneath, to watch tasks without counting.
async fn timed_system(
    pollers: usize,
    call_ms: u64,
) -> anyhow::Result<(System, Arc<Meter>, Arc<dyn TaskStore>)> {
    let mut settings = Settings {
        poll_wait: Duration::from_millis(200),
        scheduler_concurrency: pollers,
        ..Settings::default()
    };
    settings.definitions.extend(definitions());
    settings.faults.extend(latencies());
    settings.catalog_ttl = chrono::Duration::seconds(scenarios::CATALOG_TTL_SECONDS);
    let meter = Arc::new(Meter::with_latency(Duration::from_millis(call_ms)));
    let p = scenarios::wrap(
        sas_local::ports(Backend::Memory, &settings).await?,
        &meter,
        settings.due_shards,
    );
    let files = settings.definitions.clone();
    let mut system = System::from_ports(p, settings, Arc::new(SystemClock));
    system.publish(&files).await?;
    let store: Arc<dyn TaskStore> = system
        .memory
        .as_ref()
        .map(|(store, _, _)| store.clone())
        .ok_or_else(|| anyhow::anyhow!("no memory store"))?;
    system.start();
    meter.take();
    Ok((system, meter, store))
}

/// Submits one task of `workflow`, waits (at most `within`) until it is `Processed` with its
/// notice out, and gives its id and its time from submission to `Processed` (history
/// timestamps), in ms.
async fn one(
    system: &System,
    store: &dyn TaskStore,
    workflow: &str,
    within: Duration,
) -> anyhow::Result<(TaskId, f64)> {
    let id = crate::submit_burst(system, workflow, 1, 1)
        .await?
        .pop()
        .ok_or_else(|| anyhow::anyhow!("no task id"))?;
    let until = Instant::now() + within;
    loop {
        let r = store
            .get_state(id)
            .await?
            .ok_or_else(|| anyhow::anyhow!("task {id} has no record"))?;
        if r.process_state.is_final() && !r.notice_pending() {
            anyhow::ensure!(
                r.process_state == ProcessState::Processed,
                "{workflow} task {id} ended {}: {:?}",
                r.process_state,
                r.last_error
            );
            return Ok((id, processed_after_ms(&r)?));
        }
        anyhow::ensure!(
            Instant::now() < until,
            "{workflow} task {id} still {} after {within:?}",
            r.process_state
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The modeled round trip of every store, queue and bus call in the timed runs.
const CALL_MS: u64 = crate::MODELED_CALL_MS;

/// The parallel group against the same steps in a line: `tasks` tasks of each, one at a time,
/// in memory, the services taking 100, 200 and 300 ms and every store, queue and bus call
/// [`CALL_MS`]. Each row: (workflow, end-to-end times in ms, sorted).
pub async fn parallel_vs_line(tasks: usize) -> anyhow::Result<Vec<(&'static str, Vec<f64>)>> {
    one_at_a_time([PARALLEL, LINE], tasks).await
}

/// `tasks` tasks of each of `workflows`, one at a time, each workflow on a timed system of its
/// own. Each row: (workflow, end-to-end times in ms, sorted).
async fn one_at_a_time(
    workflows: [&'static str; 2],
    tasks: usize,
) -> anyhow::Result<Vec<(&'static str, Vec<f64>)>> {
    let mut out = Vec::new();
    for workflow in workflows {
        let (system, _, store) = timed_system(2, CALL_MS).await?;
        let mut times = Vec::new();
        for _ in 0..tasks.max(1) {
            let (_, ms) = one(&system, store.as_ref(), workflow, Duration::from_secs(30)).await?;
            times.push(ms);
        }
        system.shutdown().await;
        times.sort_by(f64::total_cmp);
        out.push((workflow, times));
    }
    Ok(out)
}

/// The pair's second step run as a child task against the same step inline: `tasks` tasks of
/// each, one at a time, as [`parallel_vs_line`]. Each row: (workflow, end-to-end times in ms,
/// sorted).
pub async fn child_vs_inline(tasks: usize) -> anyhow::Result<Vec<(&'static str, Vec<f64>)>> {
    one_at_a_time([PAIR, CHILD_PAIR], tasks).await
}

/// The child-vs-inline table: latency in memory, and (from the call table's scenarios, when
/// measured) the cost on the emulator.
pub fn child_table(
    rows: &[(&'static str, Vec<f64>)],
    scenarios: Option<&[Scenario]>,
    usd_per_task: impl Fn(&Scenario) -> f64,
) -> String {
    let tasks = rows.first().map_or(0, |r| r.1.len());
    let services: u64 = [BRANCHES[0].1, BRANCHES[2].1].iter().sum();
    let mut t = format!(
        "Two steps whose services take {} and {} ms ({services} ms in all), the second inline or run as a 1-step child task. In memory, every DynamoDB, SQS and EventBridge call taking {CALL_MS} ms; {tasks} tasks of each, one at a time; submission to `Processed`. Cost: the call table's `2 steps` and `2 steps, the second a 1-step child` columns.\n\n| workflow | the second step | end-to-end p50 | max | p50 over the services | orchestration, USD per million tasks |\n|---|---|---|---|---|---|\n",
        BRANCHES[0].1, BRANCHES[2].1
    );
    let cost = |w: &str| {
        scenarios
            .and_then(|ss| ss.iter().find(|s| s.workflow == w))
            .map(|s| usd_per_task(s) * 1e6)
    };
    let mut p50s = Vec::new();
    for (workflow, times) in rows {
        let p50 = crate::quantile(times, 0.5);
        p50s.push(p50);
        let _ = writeln!(
            t,
            "| `{workflow}` | {} | {p50:.0} ms | {:.0} ms | {:+.0} ms | {} |",
            if *workflow == PAIR {
                "inline"
            } else {
                "a child task"
            },
            crate::quantile(times, 1.0),
            p50 - services as f64,
            cost(workflow).map_or("-".into(), |c| format!("${c:.2}")),
        );
    }
    if let [inline, child] = p50s[..] {
        let _ = write!(
            t,
            "\nThe child adds {:.0} ms to the task (a task started, claimed, ended and its answer applied: about {:.0} modeled calls of {CALL_MS} ms)",
            child - inline,
            (child - inline) / CALL_MS as f64
        );
        match (cost(PAIR), cost(CHILD_PAIR)) {
            (Some(i), Some(c)) => {
                let _ = writeln!(
                    t,
                    " and ${:.2} per million tasks ({:+.0}%).",
                    c - i,
                    (c / i.max(1e-12) - 1.0) * 100.0
                );
            }
            _ => t.push_str(".\n"),
        }
    }
    t
}

/// The parallel-vs-line table, and what it shows.
pub fn parallel_table(rows: &[(&'static str, Vec<f64>)]) -> String {
    let sum: u64 = BRANCHES.iter().map(|b| b.1).sum();
    let slowest = BRANCHES.iter().map(|b| b.1).max().unwrap_or(0);
    let tasks = rows.first().map_or(0, |r| r.1.len());
    let mut t = format!(
        "Three steps whose services take {} ms: as a parallel group of three branches, and one after the other. In memory, every DynamoDB, SQS and EventBridge call taking {CALL_MS} ms; {tasks} tasks of each, one at a time; submission to `Processed` (history timestamps, ms resolution).\n\n| workflow | services | the slowest | their sum | end-to-end p50 | max | p50 over the slowest | p50 over the sum |\n|---|---|---|---|---|---|---|---|\n",
        BRANCHES
            .iter()
            .map(|b| b.1.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let mut p50s = Vec::new();
    for (workflow, times) in rows {
        let p50 = crate::quantile(times, 0.5);
        p50s.push(p50);
        let _ = writeln!(
            t,
            "| `{workflow}` | {} | {slowest} ms | {sum} ms | {p50:.0} ms | {:.0} ms | {:+.0} ms | {:+.0} ms |",
            if *workflow == PARALLEL {
                "at once"
            } else {
                "in a line"
            },
            crate::quantile(times, 1.0),
            p50 - slowest as f64,
            p50 - sum as f64,
        );
    }
    if let [parallel, line] = p50s[..] {
        let _ = writeln!(
            t,
            "\nThe group finishes in the time of its slowest branch plus {:.0} ms of orchestration, the line in the sum of its steps plus {:.0} ms: the group takes {:.0}% of the line's time.",
            parallel - slowest as f64,
            line - sum as f64,
            parallel / line.max(1e-9) * 100.0
        );
    }
    t
}

/// What the group costs against the line, from their scenarios in the call table.
pub fn group_cost(scenarios: &[Scenario], usd_per_task: impl Fn(&Scenario) -> f64) -> String {
    let find = |w: &str| scenarios.iter().find(|s| s.workflow == w);
    let (Some(p), Some(l)) = (find(PARALLEL), find(LINE)) else {
        return String::new();
    };
    let (up, ul) = (usd_per_task(p) * 1e6, usd_per_task(l) * 1e6);
    format!(
        "On the emulator (the call table's columns) the group costs {} DynamoDB writes, {:.0} WRU, {:.1} RRU and ${up:.2} of orchestration per million tasks, against the line's {}, {:.0}, {:.1} and ${ul:.2}: {:+.0}%.\n",
        p.counts.dynamodb_writes(),
        p.counts.wru,
        p.counts.rru,
        l.counts.dynamodb_writes(),
        l.counts.wru,
        l.counts.rru,
        (up / ul.max(1e-12) - 1.0) * 100.0
    )
}

/// What one task of [`MB`] costs against one of [`PAIR`] (the same two steps, a small result),
/// from their scenarios in the call table: the calls and bytes that differ, and the
/// orchestration by part, in USD per million tasks; the difference per MiB passed. `usd` gives
/// a scenario's orchestration, and of it S3's requests and S3's storage, per task.
pub fn mb_cost(scenarios: &[Scenario], usd: impl Fn(&Scenario) -> (f64, f64, f64)) -> String {
    let find = |w: &str| scenarios.iter().find(|s| s.workflow == w);
    let (Some(pair), Some(mb)) = (find(PAIR), find(MB)) else {
        return String::new();
    };
    let mib = RESULT_BYTES as f64 / (1u64 << 20) as f64;
    let mut t = format!(
        "The call table's `{}` column (`{MB}`: the pair's two steps, the first on a service answering {RESULT_BYTES} bytes of JSON, the second's request mapping that result whole) against its `{}` column (`{PAIR}`). The result is over the inline sizes of an item and of a message, so the agent keeps it in S3 and replies with its reference; the scheduler reads it, keeps only the reference in the state record, and sends the second request's body (the customer) with the result as a part by that reference, which the agent that kept it reads from its cache: the result is written and stored once. Each function has its own payload cache, as one warm instance of each. USD per million tasks, one message per invocation, on demand.\n\n| per task | `{PAIR}` | `{MB}` | added |\n|---|---|---|---|\n",
        mb.name, pair.name
    );
    let mut row = |label: &str, f: &dyn Fn(&Scenario) -> f64, digits: usize| {
        let (a, b) = (f(pair), f(mb));
        let _ = writeln!(
            t,
            "| {label} | {a:.digits$} | {b:.digits$} | {:+.digits$} |",
            b - a
        );
    };
    row("S3 PutObject", &|s| s.counts.call("S3 PutObject") as f64, 0);
    row("S3 GetObject", &|s| s.counts.call("S3 GetObject") as f64, 0);
    row("bytes stored in S3", &|s| s.counts.stored_bytes() as f64, 0);
    row(
        "SQS messages sent",
        &|s| s.counts.call("SQS SendMessage") as f64,
        0,
    );
    row("DynamoDB write request units", &|s| s.counts.wru, 0);
    row("DynamoDB read request units", &|s| s.counts.rru, 1);
    row(
        "largest item written, bytes",
        &|s| s.counts.largest_item() as f64,
        0,
    );
    row("EventBridge events", &|s| s.counts.events as f64, 0);
    let ms = |f: &'static str| {
        move |s: &Scenario| s.handler_seconds.get(f).copied().unwrap_or(0.0) * 1e3
    };
    row("handler time, ms: agent", &ms("agent"), 0);
    row("handler time, ms: scheduler", &ms("scheduler"), 0);
    let m = 1e6;
    row("orchestration: S3 requests, USD", &|s| usd(s).1 * m, 2);
    row("orchestration: S3 storage, USD", &|s| usd(s).2 * m, 2);
    row(
        "orchestration: the rest, USD",
        &|s| (usd(s).0 - usd(s).1 - usd(s).2) * m,
        2,
    );
    row("orchestration, USD", &|s| usd(s).0 * m, 2);
    let (p, b) = (usd(pair), usd(mb));
    let per_mib = (b.0 - p.0) * m / mib;
    let _ = writeln!(
        t,
        "\nA result of 1 MiB passed to a later step costs ${per_mib:.2} per million tasks more than a small one: ${per_mib:.2} per MiB passed (${:.2} per MB of 10^6 bytes), of which ${:.2} S3 requests, ${:.2} S3 storage until the task's retention ends (as the cost table) and ${:.2} the rest (the handlers' time with the payload, DynamoDB, SQS). Step Functions carries at most 256 KB between states: an equivalent state machine would keep the result in S3 too.",
        per_mib / 1.048_576,
        (b.1 - p.1) * m / mib,
        (b.2 - p.2) * m / mib,
        ((b.0 - b.1 - b.2) - (p.0 - p.1 - p.2)) * m / mib,
    );
    t
}

/// One forEach run with `pollers` scheduler pollers per queue.
#[derive(Debug, Clone)]
pub struct RaceRun {
    pub pollers: usize,
    pub counts: Counts,
    pub ms: f64,
}

impl RaceRun {
    /// Replies sent (one per element that answered, and per undo).
    pub fn replies(&self) -> u64 {
        self.counts.messages.get("replies").copied().unwrap_or(0)
    }
    /// Step requests sent to the agents (one per element, and one more per element sent again).
    pub fn requests(&self) -> u64 {
        self.counts.messages.get("agent").copied().unwrap_or(0)
    }
    /// State-record writes that failed their condition, per reply.
    pub fn conflicts_per_reply(&self) -> f64 {
        self.counts.conflicts as f64 / self.replies().max(1) as f64
    }
    /// The write units of the task's own writes (the sweep's leases left out).
    pub fn task_wru(&self) -> f64 {
        self.task_writes().map(WriteUnits::total).sum()
    }
    /// The write units of the state-record writes whose condition failed.
    pub fn lost_wru(&self) -> f64 {
        // (+ 0.0: an empty sum is -0.0, printed "-0".)
        self.task_writes()
            .filter(|w| w.label.ends_with(LOST))
            .map(WriteUnits::total)
            .sum::<f64>()
            + 0.0
    }
    fn task_writes(&self) -> impl Iterator<Item = &WriteUnits> {
        self.counts
            .writes
            .iter()
            .filter(|w| !w.label.starts_with("lease"))
    }
}

/// One forEach task over [`ELEMENTS`] elements at [`MAX_CONCURRENCY`] for each number of
/// scheduler pollers in `pollers`, in memory, every call taking [`CALL_MS`] and each element's
/// call [`EACH_MS`]: the replies of the elements out race on the task's record; the losers
/// read it again and are applied again. Each run must end `Processed` with every element's
/// call applied once.
pub async fn for_each_race(pollers: &[usize]) -> anyhow::Result<Vec<RaceRun>> {
    let mut out = Vec::new();
    for &n in pollers {
        let (system, meter, store) = timed_system(n, CALL_MS).await?;
        let (id, ms) = one(&system, store.as_ref(), FOR_EACH, Duration::from_secs(120)).await?;
        let effects = system.services.get(EACH).effects_for(&id.to_string());
        system.shutdown().await;
        anyhow::ensure!(
            effects.len() == ELEMENTS && effects.values().all(|&e| e == 1),
            "{} of {ELEMENTS} elements applied, not each once: {effects:?}",
            effects.len()
        );
        out.push(RaceRun {
            pollers: n,
            counts: meter.take(),
            ms,
        });
    }
    Ok(out)
}

/// The forEach race table, and what it shows.
pub fn race_table(runs: &[RaceRun]) -> String {
    let waves = ELEMENTS.div_ceil(MAX_CONCURRENCY);
    let mut t = format!(
        "One task whose forEach step calls a service ({EACH_MS} ms a call) for each of {ELEMENTS} elements, {MAX_CONCURRENCY} at once, in memory with every DynamoDB, SQS and EventBridge call taking {CALL_MS} ms, and 1 to {} scheduler pollers on each of the work and reply queues (each takes batches of up to 10, as a Lambda invocation does, and handles one task's messages of a batch one after another, different tasks' at once). The elements' replies meet on the task's one record: a reply whose conditional write loses reads the record again and is applied again, up to 4 tries; one that loses all 4 comes back with its message, or its element's deadline sends the element again (here {}s after it went out). *Conflicts*: state-record writes whose condition failed (each billed like any write). The sweep's lease writes are left out. The floor is {waves} waves of {EACH_MS} ms: {} ms.\n\n| scheduler pollers per queue | requests sent | replies | conflicts | conflicts per reply | state-record writes | their WRU | WRU of the writes that lost | largest item | end-to-end |\n|---|---|---|---|---|---|---|---|---|---|\n",
        runs.iter().map(|r| r.pollers).max().unwrap_or(1),
        Settings::default().policy.step_timeout.num_seconds(),
        waves as u64 * EACH_MS
    );
    for r in runs {
        let _ = writeln!(
            t,
            "| {} | {} | {} | {} | {:.2} | {} | {:.0} | {:.0} | {} bytes | {:.0} ms |",
            r.pollers,
            r.requests(),
            r.replies(),
            r.counts.conflicts,
            r.conflicts_per_reply(),
            r.counts.call("DynamoDB PutItem"),
            r.task_wru(),
            r.lost_wru(),
            r.counts.largest_item(),
            r.ms,
        );
    }
    let per_reply: Vec<f64> = runs.iter().map(RaceRun::conflicts_per_reply).collect();
    let lost: f64 = runs.iter().map(RaceRun::lost_wru).sum();
    let wru: f64 = runs.iter().map(RaceRun::task_wru).sum();
    let resent: u64 = runs
        .iter()
        .map(|r| r.requests().saturating_sub(ELEMENTS as u64))
        .sum();
    let floor = (waves as u64 * EACH_MS) as f64;
    let stretch =
        |f: fn(f64, f64) -> f64, from: f64| runs.iter().map(|r| r.ms / floor).fold(from, f);
    let _ = write!(
        t,
        "\nEach reply met {:.2} to {:.2} conflicts; the writes that lost took {:.0}% of the task's write units (each rewrites the whole record, {} bytes at the end). The task took {:.1} to {:.1} times the floor: the replies to one record are applied one at a time, and one that loses pauses, a little longer each time, before it reads again; {resent} element requests went out a second time over these runs, an element going out again only when its deadline passes, that is, when its reply lost all its tries.",
        per_reply.iter().copied().fold(f64::INFINITY, f64::min),
        per_reply.iter().copied().fold(0.0, f64::max),
        lost / wru.max(1e-9) * 100.0,
        runs.iter()
            .map(|r| r.counts.largest_item())
            .max()
            .unwrap_or(0),
        stretch(f64::min, f64::INFINITY),
        stretch(f64::max, 0.0),
    );
    t.push('\n');
    t
}

/// The forEach scenario's counts per element, beside the clean e-commerce order's per step.
pub fn for_each_cost(scenarios: &[Scenario], usd_per_task: impl Fn(&Scenario) -> f64) -> String {
    let Some(each) = scenarios.iter().find(|s| s.workflow == FOR_EACH) else {
        return String::new();
    };
    let order = scenarios.iter().find(|s| s.workflow == "ecommerce-order");
    let mut t = format!(
        "The forEach scenario of the call table (`{FOR_EACH}`: {ELEMENTS} elements, {MAX_CONCURRENCY} at once, on the emulator, one task's messages of a scheduler batch handled one after another) per element, beside the clean e-commerce order per step. Its conflicts are those of the sequential pumps of the emulator run (the race table above has them under concurrent pollers).\n\n| per | forEach task | forEach, per element | e-commerce order, per step |\n|---|---|---|---|\n"
    );
    let n = ELEMENTS as f64;
    let mut row = |label: &str, f: &dyn Fn(&Scenario) -> f64, digits: usize| {
        let o = order.map_or("-".into(), |o| {
            format!("{:.*}", digits, f(o) / o.steps.max(1) as f64)
        });
        let _ = writeln!(
            t,
            "| {label} | {:.*} | {:.*} | {o} |",
            digits,
            f(each),
            digits,
            f(each) / n
        );
    };
    let calls = |s: &Scenario| -> f64 {
        s.counts
            .calls
            .iter()
            .filter(|(k, _)| !k.starts_with("SQS"))
            .map(|(_, v)| *v as f64)
            .sum()
    };
    row("DynamoDB and EventBridge calls", &calls, 2);
    row(
        "SQS messages sent",
        &|s| s.counts.call("SQS SendMessage") as f64,
        2,
    );
    row("DynamoDB write request units", &|s| s.counts.wru, 2);
    row("DynamoDB read request units", &|s| s.counts.rru, 2);
    row(
        "Lambda invocations",
        &|s| s.invocations.values().sum::<u64>() as f64,
        2,
    );
    row(
        "conflicts (writes that lost)",
        &|s| s.counts.conflicts as f64,
        2,
    );
    row(
        "orchestration, USD per million",
        &|s| usd_per_task(s) * 1e6,
        2,
    );
    let applied = each.effects.keys().filter(|k| k.contains(":each#")).count();
    let _ = writeln!(
        t,
        "\nEvery element's call took effect once ({applied} keys, each applied once). The largest item the forEach task wrote: {} bytes (DynamoDB bills a write by the KB of the larger of the old and the new item; the e-commerce order's largest: {} bytes).",
        each.counts.largest_item(),
        order.map_or(0, |o| o.counts.largest_item())
    );
    t
}

/// How long task `r` took from its submission to `Processed`, in milliseconds (its history's
/// last line into `Processed`).
pub(crate) fn processed_after_ms(r: &sas::StateRecord) -> anyhow::Result<f64> {
    let at = r
        .history
        .iter()
        .rev()
        .find(|h| h.to == ProcessState::Processed)
        .map(|h| h.at)
        .ok_or_else(|| anyhow::anyhow!("task {} has no Processed line", r.task_id))?;
    Ok((at - r.created_at).num_microseconds().unwrap_or(0) as f64 / 1e3)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`REPORT`]'s answer is [`RESULT_BYTES`] of JSON with the simulated service's fields (its
    /// `id`, which the step's undo maps), and [`MB`]'s second step maps that result whole.
    #[test]
    fn the_report_is_a_mib_and_the_second_step_maps_it_whole() {
        let mut answer = json!({"id": "i-1", "service": REPORT, "action": "step-report"});
        pad(&mut answer, RESULT_BYTES);
        assert_eq!(answer.to_string().len(), RESULT_BYTES);
        assert_eq!(answer["id"], "i-1");
        let (_, mb) = definitions()
            .into_iter()
            .find(|(f, _)| *f == format!("{MB}.json"))
            .expect("the workflow");
        let mb: Value = serde_json::from_str(&mb).expect("json");
        assert_eq!(mb["steps"][0]["service"], REPORT);
        assert_eq!(
            mb["steps"][1]["input"]["report"],
            "$.steps['step-report'].result"
        );
        assert_eq!(input(MB), Some(json!({"customerId": "bench"})));
    }

    /// The timed runs end as planned: each task `Processed`, no sooner than its services
    /// answered (the latencies are applied), the forEach's elements each applied once (checked
    /// in [`for_each_race`]) and answered once each; the tables show every run.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_timed_runs_end_as_planned() {
        let rows = parallel_vs_line(1)
            .await
            .expect("the parallel and line runs");
        let slowest = BRANCHES.iter().map(|b| b.1).max().unwrap_or(0) as f64;
        let sum = BRANCHES.iter().map(|b| b.1).sum::<u64>() as f64;
        assert_eq!(rows.len(), 2);
        assert_eq!((rows[0].0, rows[1].0), (PARALLEL, LINE));
        assert!(rows[0].1[0] >= slowest, "{rows:?}");
        assert!(rows[1].1[0] >= sum, "{rows:?}");
        let table = parallel_table(&rows);
        assert!(
            table.contains(&format!("| `{PARALLEL}` |"))
                && table.contains(&format!("| `{LINE}` |")),
            "{table}"
        );
        // The child's task ends, and its step's service takes its time inside the parent's.
        let rows = child_vs_inline(1).await.expect("the child and inline runs");
        let services = (BRANCHES[0].1 + BRANCHES[2].1) as f64;
        assert_eq!((rows[0].0, rows[1].0), (PAIR, CHILD_PAIR));
        assert!(rows.iter().all(|r| r.1[0] >= services), "{rows:?}");
        let table = child_table(&rows, None, |_| 0.0);
        assert!(
            table.contains(&format!("| `{CHILD_PAIR}` | a child task |")),
            "{table}"
        );
        let runs = for_each_race(&[2]).await.expect("the forEach run");
        assert_eq!(runs.len(), 1);
        // One reply per request: at least one per element (an element whose reply lost every
        // try goes out again at its deadline).
        let requests = runs[0].counts.messages.get("agent").copied().unwrap_or(0);
        assert!(requests >= ELEMENTS as u64, "{:?}", runs[0].counts.messages);
        assert_eq!(runs[0].replies(), requests, "{:?}", runs[0].counts.messages);
        // Ten waves of a call each, at the least.
        let waves = ELEMENTS.div_ceil(MAX_CONCURRENCY) as f64;
        assert!(runs[0].ms >= waves * EACH_MS as f64, "{}", runs[0].ms);
        let table = race_table(&runs);
        assert!(table.contains("\n| 2 | "), "{table}");
        println!("{}\n{table}", parallel_table(&rows));
    }
}
