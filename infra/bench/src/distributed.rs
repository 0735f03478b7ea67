//! A distributed forEach (issue 42): one task whose step runs [`ELEMENTS`] elements,
//! [`AT_ONCE`] at once, each a record of its own, their ends applied by the step's run. In
//! memory, every store, queue, bus and S3 call taking [`crate::MODELED_CALL_MS`] and each
//! element's call [`EACH_MS`], with the bench's own event-source mappings (so that each
//! function's time is measured, as the cost model bills it). [`run`] measures it; [`table`]
//! writes its rows: the time against the floor, the conflicts per end, the write units and the
//! cost per element, and the largest item of the task, of the run and of an element.

use crate::counting::{Counts, Meter};
use crate::scenarios::{self, Scenario};
use sas::handlers::runs::{element_id, run_id};
use sas::messages::idempotency_key;
use sas::ports::{SystemClock, TaskStore};
use sas::remote::Faults;
use sas::{ProcessState, TaskId};
use sas_local::{Backend, Settings, System};
use serde_json::json;
use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The workflow: one distributed forEach step over the input's `items`.
pub const DISTRIBUTED: &str = "bench-distributed";
/// Its step (and so its action: a distributed forEach's run is called under the step's name).
const STEP: &str = "each";
/// Its service: the simulated service, without limits, in a deployment without the share
/// (`SERVICE_SHARE=0`): a service's own concurrency is at most 200, and the share (10 calls
/// at once by default) would hold the run to 10.
pub const WIDE: &str = "bench-wide";
/// The elements (the most a distributed forEach takes) and how many are out at once.
pub const ELEMENTS: usize = 10_000;
pub const AT_ONCE: usize = 500;
/// What each element's call takes.
pub const EACH_MS: u64 = crate::groups::EACH_MS;
/// The modeled round trip of every store, queue, bus and S3 call.
const CALL_MS: u64 = crate::MODELED_CALL_MS;

/// The bench's event-source mappings: pollers per queue and their batches. The agents' as the
/// template's (batches of 5), enough of them for every element out to be in a call at once
/// (Lambda scales them out); the scheduler's batches of 10 on each of its queues (the ends
/// queue is FIFO, grouped by run: one batch of a run's ends at a time, whatever the pollers).
const AGENT_POLLERS: usize = AT_ONCE / 5 + 28;
const AGENT_BATCH: u32 = 5;
const SCHEDULER_POLLERS: usize = 8;
const SCHEDULER_BATCH: u32 = 10;
const POLL_WAIT: Duration = Duration::from_millis(200);

/// The chunks the bench runs the list in, side by side: each element a record of its own,
/// and chunks of 20 elements a record (the list over `maxConcurrency`).
pub const CHUNKS: [u32; 2] = [1, 20];

/// The service and the workflow (its elements `chunk` to a record), as files to publish.
fn definitions(at_once: usize, chunk: u32) -> Vec<(String, String)> {
    let services = json!({"services": [{
        "name": WIDE, "description": "the bench's, wide",
        "target": {"type": "simulated"},
    }]});
    let workflow = json!({
        "name": DISTRIBUTED,
        "description": "One call per item, each item a record of its own, many at once.",
        "steps": [{
            "name": STEP, "service": WIDE, "forEach": "$.input.items",
            "distributed": true, "maxConcurrency": at_once, "chunk": chunk,
            "input": {"item": "$.element", "n": "$.index"},
            "undo": {"action": "undo-each", "input": {"id": format!("$.steps['{STEP}'].result.id"), "item": "$.element"}},
        }],
    });
    vec![
        ("bench-wide.json".into(), services.to_string()),
        (format!("{DISTRIBUTED}.json"), workflow.to_string()),
    ]
}

/// What one run measured.
#[derive(Debug, Clone)]
pub struct Distributed {
    pub elements: usize,
    pub at_once: usize,
    /// Elements a record keeps at most, as the step says (1: each its own).
    pub chunk: u32,
    /// Elements a record kept: at most `chunk`, and the list over `at_once`.
    pub chunk_used: u32,
    /// Submission to `Processed` (history timestamps), ms.
    pub ms: f64,
    /// The task's counts, as a scenario of the cost model (one task; its steps: the elements).
    pub scenario: Scenario,
    pub task: String,
    pub run: String,
    pub run_id: TaskId,
    /// The elements' record ids (the chunks', in chunks).
    pub element_ids: HashSet<String>,
}

/// Handler wall time and messages handled, by function.
#[derive(Default)]
struct Spent(Mutex<BTreeMap<&'static str, (f64, u64)>>);

impl Spent {
    fn add(&self, function: &'static str, took: Duration, messages: usize) {
        if let Ok(mut m) = self.0.lock() {
            let e = m.entry(function).or_default();
            e.0 += took.as_secs_f64();
            e.1 += messages as u64;
        }
    }
    /// The messages the scheduler and the agents have handled so far.
    fn handled(&self) -> u64 {
        self.0.lock().map_or(0, |m| {
            ["scheduler", "agent"]
                .iter()
                .filter_map(|f| m.get(f))
                .map(|e| e.1)
                .sum()
        })
    }
    fn take(&self) -> BTreeMap<&'static str, (f64, u64)> {
        self.0
            .lock()
            .map(|mut m| std::mem::take(&mut *m))
            .unwrap_or_default()
    }
}

/// An event-source mapping on `$url` handing its batches to `$handler` (a closure of the
/// event), each invocation's wall time and messages added to `$spent` under `$function`; it
/// stops when `$stop` changes. (A macro: the handlers' event types are `sas_local`'s.)
macro_rules! mapping {
    ($tasks:ident, $system:expr, $url:expr, $batch:expr, $function:expr, $spent:expr, $stop:expr, $handler:expr) => {{
        let queue = $system.queue.clone();
        let url: String = $url;
        let spent = $spent.clone();
        let mut stop = $stop.clone();
        let handler = $handler;
        $tasks.push(tokio::spawn(async move {
            loop {
                let started = Instant::now();
                tokio::select! {
                    r = sas_local::poll_once(queue.as_ref(), &url, $batch, POLL_WAIT, &handler) => match r {
                        Ok(0) => {}
                        Ok(n) => spent.add($function, started.elapsed(), n),
                        Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                    },
                    _ = stop.changed() => return,
                }
            }
        }));
    }};
}

/// One task of [`DISTRIBUTED`] over `elements` elements, `at_once` at once, in memory (see the
/// module's text), run until it is `Processed` with its notice out and nothing moves. Every
/// element's call must have taken effect once.
pub async fn run(elements: usize, at_once: usize, chunk: u32) -> anyhow::Result<Distributed> {
    let mut settings = Settings {
        poll_wait: POLL_WAIT,
        // As the emulator's scenarios (the template's defaults): 30 s to run a step, 60 s to
        // be claimed, 45 s to be picked up by an agent, no retry delay.
        ..Settings::default()
    };
    let step = chrono::Duration::seconds(30);
    settings.policy.step_timeout = step;
    settings.policy.pickup_timeout = step * 2;
    settings.policy.start_within = step * 3 / 2;
    settings.policy.retry_base_delay = chrono::Duration::zero();
    settings.policy.retry_max_delay = chrono::Duration::zero();
    settings.catalog_ttl = chrono::Duration::seconds(scenarios::CATALOG_TTL_SECONDS);
    settings.service_share = None;
    settings.rate_limit = Some(sas::domain::rate::RateLimit {
        per_second: 1e6,
        burst: 1_000_000,
    });
    settings.definitions = definitions(at_once, chunk);
    settings.faults.insert(
        WIDE.into(),
        Faults {
            latency: Duration::from_millis(EACH_MS),
            ..Faults::default()
        },
    );
    let meter = Arc::new(Meter::with_latency(Duration::from_millis(CALL_MS)));
    let p = scenarios::wrap(
        sas_local::ports(Backend::Memory, &settings).await?,
        &meter,
        settings.due_shards,
    );
    let (counted_store, payloads) = (p.store.clone(), p.payloads.clone());
    let files = settings.definitions.clone();
    let clock: Arc<dyn sas::ports::Clock> = Arc::new(SystemClock);
    let mut system = System::from_ports(p, settings, clock.clone());
    scenarios::cache_per_function(&mut system, &counted_store, &payloads, clock);
    system.publish(&files).await?;
    system.definitions.latest(DISTRIBUTED).await?;
    system.definitions.services().await?;
    let store: Arc<dyn TaskStore> = system
        .memory
        .as_ref()
        .map(|(store, _, _)| store.clone() as Arc<dyn TaskStore>)
        .ok_or_else(|| anyhow::anyhow!("no memory store"))?;
    meter.take();

    let spent = Arc::new(Spent::default());
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let mut tasks = Vec::new();
    let r = system.resources.clone();
    let scheduler_queues = [
        Some(r.work_queue_url.clone()),
        Some(r.reply_queue_url.clone()),
    ]
    .into_iter()
    .chain([r.ends_queue_url.clone()])
    .flatten();
    for url in scheduler_queues {
        for _ in 0..SCHEDULER_POLLERS {
            let deps = system.scheduler.clone();
            mapping!(
                tasks,
                system,
                url.clone(),
                SCHEDULER_BATCH,
                "scheduler",
                spent,
                stop,
                move |ev| {
                    let deps = deps.clone();
                    async move { sas::handlers::scheduler::handle(&deps, ev).await }
                }
            );
        }
    }
    for _ in 0..AGENT_POLLERS {
        let deps = system.agent.clone();
        mapping!(
            tasks,
            system,
            r.agent_queue_url.clone(),
            AGENT_BATCH,
            "agent",
            spent,
            stop,
            move |ev| {
                let deps = deps.clone();
                async move { sas::handlers::agent::handle(&deps, ev).await }
            }
        );
    }
    let deps = system.supervisor.clone();
    mapping!(
        tasks,
        system,
        r.timer_queue_url.clone(),
        SCHEDULER_BATCH,
        "supervisor",
        spent,
        stop,
        move |ev| {
            let deps = deps.clone();
            async move { sas::handlers::supervisor::handle_timers(&deps, ev).await }
        }
    );

    let started = Instant::now();
    let id = submit(&system, elements).await?;
    spent.add("submission", started.elapsed(), 1);
    let within = Duration::from_secs(900);
    let record = loop {
        let r = store
            .get_state(id)
            .await?
            .ok_or_else(|| anyhow::anyhow!("task {id} has no record"))?;
        if r.process_state.is_final() && !r.notice_pending() {
            break r;
        }
        anyhow::ensure!(
            started.elapsed() < within,
            "the distributed forEach still {} after {within:?}",
            r.process_state
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    anyhow::ensure!(
        record.process_state == ProcessState::Processed,
        "the distributed forEach ended {}: {:?}",
        record.process_state,
        record.last_error
    );
    let ms = crate::groups::processed_after_ms(&record)?;
    // Settled: no scheduler or agent message for a second. The deadline timers still due
    // then (each element's, its step's deadline after it went out) are not waited for: each
    // costs what a handled one did ([`scenario`]).
    let mut last = spent.handled();
    let mut still = 0;
    while still < 5 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = spent.handled();
        still = if now == last { still + 1 } else { 0 };
        last = now;
    }
    let _ = stop_tx.send(true);
    for t in tasks {
        let _ = t.await;
    }
    let counts = meter.take();
    let effects: BTreeMap<String, u32> = system
        .services
        .get(WIDE)
        .effects_for(&id.to_string())
        .into_iter()
        .collect();
    system.shutdown().await;
    let applied = effects
        .keys()
        .filter(|k| k.ends_with(&format!(":{STEP}")))
        .count();
    anyhow::ensure!(
        applied == elements && effects.values().all(|&n| n == 1),
        "{applied} of {elements} elements' calls took effect, not each once"
    );
    let run = run_id(&idempotency_key(id, STEP, STEP, 0));
    let chunk_used = store
        .get_state(run)
        .await?
        .and_then(|r| r.run.map(|s| s.ledger.chunk))
        .unwrap_or(1);
    let element_ids = (0..(elements as u32).div_ceil(chunk_used))
        .map(|k| element_id(run, k).to_string())
        .collect();
    let scenario = scenario(elements, counts, spent.take(), effects);
    Ok(Distributed {
        elements,
        at_once,
        chunk,
        chunk_used,
        ms,
        scenario,
        task: id.to_string(),
        run: run.to_string(),
        run_id: run,
        element_ids,
    })
}

/// The task's counts as a scenario of the cost model: one invocation per message (scheduler:
/// work, replies and ends; agent; supervisor: timers); each deadline timer still due when the
/// run settled costs what a handled one did (a read and an invocation, as the emulator's
/// scenarios count them).
fn scenario(
    elements: usize,
    mut counts: Counts,
    spent: BTreeMap<&'static str, (f64, u64)>,
    effects: BTreeMap<String, u32>,
) -> Scenario {
    let m = |k: &str| counts.messages.get(k).copied().unwrap_or(0);
    let timers = m("timers");
    let handled = spent.get("supervisor").map_or(0, |s| s.1);
    let pending = timers.saturating_sub(handled);
    *counts.calls.entry("DynamoDB GetItem".into()).or_default() += pending;
    counts.rru += pending as f64;
    let invocations = BTreeMap::from([
        ("submission", 1),
        ("scheduler", m("work") + m("replies") + m("ends")),
        ("agent", m("agent")),
        ("supervisor", timers),
    ]);
    let mut handler_seconds: BTreeMap<&'static str, f64> =
        spent.iter().map(|(f, (s, _))| (*f, *s)).collect();
    let per_timer = spent
        .get("supervisor")
        .map_or(0.0, |s| s.0 / s.1.max(1) as f64);
    *handler_seconds.entry("supervisor").or_default() += per_timer * pending as f64;
    Scenario {
        name: "distributed forEach",
        workflow: DISTRIBUTED,
        steps: elements,
        counts,
        invocations,
        // Not compared with Step Functions here.
        sfn_transitions: 0,
        callbacks: 0,
        final_state: ProcessState::Processed,
        handler_seconds,
        effects,
    }
}

/// Submits the task through the task API (no network): `elements` items in its input.
async fn submit(system: &System, elements: usize) -> anyhow::Result<TaskId> {
    let mut headers = http::HeaderMap::new();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    let input = json!({"items": (0..elements).map(|i| format!("item-{i:05}")).collect::<Vec<_>>()});
    let resp = sas::api::handle(
        &system.api,
        &sas::auth::Identity::anonymous(),
        &http::Method::POST,
        &format!("/workflows/{DISTRIBUTED}/tasks"),
        &headers,
        input.to_string().as_bytes(),
    )
    .await;
    let v: serde_json::Value = serde_json::from_str(resp.body())?;
    anyhow::ensure!(
        resp.status() == 202,
        "submission answered {}: {v}",
        resp.status()
    );
    Ok(v["taskId"].as_str().unwrap_or_default().parse()?)
}

impl Distributed {
    fn counts(&self) -> &Counts {
        &self.scenario.counts
    }
    fn messages(&self, role: &str) -> u64 {
        self.counts().messages.get(role).copied().unwrap_or(0)
    }
    /// The floor: as many waves of [`EACH_MS`] as the elements fill at [`AT_ONCE`].
    pub fn floor_ms(&self) -> f64 {
        (self.elements.div_ceil(self.at_once.max(1)) as u64 * EACH_MS) as f64
    }
    /// Ends sent to the run (one per element, or per chunk).
    pub fn ends(&self) -> u64 {
        self.messages("ends")
    }
    /// Step requests sent for the elements: every agent message but the run's own (the
    /// step's, which starts it).
    pub fn element_requests(&self) -> u64 {
        self.messages("agent").saturating_sub(1)
    }
    /// State-record writes whose condition failed, per end applied.
    pub fn conflicts_per_end(&self) -> f64 {
        self.counts().conflicts as f64 / self.ends().max(1) as f64
    }
    /// The writes of the task's record, of the run's, and of all the elements' together.
    pub fn by_kind(&self) -> [crate::counting::RecordWrites; 3] {
        let c = self.counts();
        let of = |id: &str| c.records.get(id).cloned().unwrap_or_default();
        let mut elements = crate::counting::RecordWrites::default();
        for (id, r) in &c.records {
            if self.element_ids.contains(id) {
                elements.writes += r.writes;
                elements.lost += r.lost;
                elements.wru += r.wru;
                elements.largest = elements.largest.max(r.largest);
                elements.task_item = elements.task_item.max(r.task_item);
            }
        }
        [of(&self.task), of(&self.run), elements]
    }
    /// Records written that are none of the task, the run and its elements.
    #[cfg(test)]
    pub fn other_records(&self) -> usize {
        self.counts()
            .records
            .keys()
            .filter(|id| **id != self.task && **id != self.run && !self.element_ids.contains(*id))
            .count()
    }
    /// Write units of the writes labelled `label` (slots, retention).
    fn wru_of(&self, label: &str) -> f64 {
        self.counts()
            .writes
            .iter()
            .filter(|w| w.label == label)
            .map(|w| w.total())
            .sum()
    }
}

/// The rows of a run, and what they show. `usd` gives a scenario's orchestration per task, one
/// message per invocation and with full batches.
pub fn table(d: &Distributed, usd: impl Fn(&Scenario) -> (f64, f64)) -> String {
    let n = d.elements as f64;
    let c = d.counts();
    let [task, run, elements] = d.by_kind();
    let (one, full) = usd(&d.scenario);
    let m = 1e6;
    let mut t = String::new();
    if d.chunk_used > 1 {
        let _ = write!(
            t,
            "**In chunks of {}** (`chunk: {}`; a chunk is at most the list over `maxConcurrency`): each record keeps {} elements and runs them one at a time as an in-record forEach, {} chunks out at once, and its one end reaches the run; where the text below says an element's record, read a chunk's.\n\n",
            d.chunk_used, d.chunk, d.chunk_used, d.at_once
        );
    }
    let _ = write!(
        t,
        "One task whose step is a distributed forEach (`{DISTRIBUTED}`: `distributed: true`) over {} elements, {} at once, each element a record of its own calling a service that takes {EACH_MS} ms (`{WIDE}`, without limits, in a deployment without the share, `SERVICE_SHARE=0`: a service's own concurrency is at most 200 and the share holds one without it to 10 calls at once, so no call takes a slot here); each element's end goes to the run through the FIFO ends queue, and the scheduler applies it to the run's ledger and opens the next element. In memory, every DynamoDB, SQS, EventBridge and S3 call taking {CALL_MS} ms; the bench's own event-source mappings ({SCHEDULER_POLLERS} scheduler pollers on each of the work, reply and ends queues, batches of {SCHEDULER_BATCH}; {AGENT_POLLERS} agent pollers, batches of {AGENT_BATCH}), each invocation's wall time measured for the cost model. The floor is {} waves of {EACH_MS} ms. *Conflicts*: state-record writes whose condition failed (on any record), per end the run applied; *created twice*: element records whose create found one there (an element opened twice). Write units and cost per element are the whole task's (its start, the run, every element's record and call, the slots, the ends, the answer, the releases) over its elements, priced as the cost table prices a task (one message per invocation, on demand; the ends queue at SQS FIFO's price); the handlers' times are wall times under the modeled calls, not the emulator's. Goals (issue 42): about 0 conflicts per end; at most $6.08 of orchestration per million elements (the in-record forEach's per-element cost when the goal was set: its table above, priced the same way); the task's item under 16 KB whatever the list's length. *Largest item*: the largest state record each wrote (the larger of the old and the new at each write, as billed); the task items (the input, or its reference in S3) are written once each, at the create, and are in the text below.\n\n| elements | at once | end-to-end | floor | over the floor | element requests | ends | conflicts | conflicts per end | created twice | WRU per element | orchestration per million elements | largest item: the task's | the run's | an element's |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        d.elements,
        d.at_once,
        d.elements.div_ceil(d.at_once.max(1)),
    );
    let _ = writeln!(
        t,
        "| {} | {} | {:.1} s | {:.1} s | ×{:.1} | {} | {} | {} | {:.3} | {} | {:.2} | ${:.2} | {} bytes | {} bytes | {} bytes |",
        d.elements,
        d.at_once,
        d.ms / 1e3,
        d.floor_ms() / 1e3,
        d.ms / d.floor_ms().max(1.0),
        d.element_requests(),
        d.ends(),
        c.conflicts,
        d.conflicts_per_end(),
        c.create_conflicts,
        c.wru / n,
        one * m / n,
        task.largest,
        run.largest,
        elements.largest,
    );
    let _ = write!(
        t,
        "\nPer element (the task's counts over its {} elements):\n\n| per element | |\n|---|---|\n",
        d.elements
    );
    let mut row = |label: &str, v: f64, digits: usize| {
        let _ = writeln!(t, "| {label} | {v:.digits$} |");
    };
    let slots = d.wru_of("slot");
    let retention = d.wru_of("retention");
    row("DynamoDB writes", c.dynamodb_writes() as f64 / n, 2);
    row("WRU: the elements' own items", elements.wru / n, 2);
    row("WRU: the run's record", run.wru / n, 2);
    row("WRU: the task's items", task.wru / n, 3);
    row("WRU: slots (none: no limits, no share)", slots / n + 0.0, 2);
    row(
        "WRU: retention (each task item as it ends)",
        retention / n,
        2,
    );
    row(
        "WRU: the rest",
        (c.wru - elements.wru - run.wru - task.wru - slots - retention) / n + 0.0,
        2,
    );
    row("WRU in all", c.wru / n, 2);
    row("DynamoDB read request units", c.rru / n, 2);
    row(
        "run-record writes (the ends applied)",
        run.writes as f64 / n,
        2,
    );
    row("SQS messages sent", c.call("SQS SendMessage") as f64 / n, 2);
    row(
        "Lambda invocations (one message each)",
        d.scenario.invocations.values().sum::<u64>() as f64 / n,
        2,
    );
    row(
        "S3 requests",
        c.calls
            .iter()
            .filter(|(k, _)| k.starts_with("S3"))
            .map(|(_, v)| *v as f64)
            .sum::<f64>()
            / n,
        4,
    );
    row(
        "orchestration, USD per million elements, one message per invocation",
        one * m / n,
        2,
    );
    row(
        "orchestration, USD per million elements, full batches",
        full * m / n,
        2,
    );
    let first = element_id(d.run_id, 0).to_string();
    let _ = write!(
        t,
        "\nThe writes of one {} (the first), in order, as the write-by-write table above:\n\n| # | write | item bytes | table | `due-index` | `state-index` | `caller-shard-index` | total |\n|---|---|---|---|---|---|---|---|\n",
        if d.chunk_used > 1 { "chunk" } else { "element" }
    );
    let mut sum = crate::counting::WriteUnits::default();
    for (i, w) in c.writes.iter().filter(|w| w.record == first).enumerate() {
        let _ = writeln!(
            t,
            "| {} | {} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} |",
            i + 1,
            w.label,
            w.item_bytes,
            w.table,
            w.due_index,
            w.state_index,
            w.caller_index,
            w.total()
        );
        sum.table += w.table;
        sum.due_index += w.due_index;
        sum.state_index += w.state_index;
        sum.caller_index += w.caller_index;
    }
    let _ = writeln!(
        t,
        "| | all writes | | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} |",
        sum.table,
        sum.due_index,
        sum.state_index,
        sum.caller_index,
        sum.total()
    );
    let _ = writeln!(
        t,
        "\nEvery element's call took effect once ({} keys). The run's record holds the ledger (a mark per element) and is rewritten whole by every write: {} bytes at its largest, {:.1} WRU a write on average; the task's record holds one step's state whatever the list's length, and the list and the step's result (every element's, in order) are kept in S3. Task items: the task's {} bytes (its input of {} items, kept by reference when over the inline size), the largest element's {} bytes. {} writes lost their condition: {} on the task's record, {} on the run's, {} on the elements'.",
        d.scenario.effects.len(),
        run.largest,
        run.wru / run.writes.max(1) as f64,
        task.task_item,
        d.elements,
        elements.task_item,
        c.conflicts,
        task.lost,
        run.lost,
        elements.lost.saturating_sub(c.create_conflicts),
    );
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small run ends as planned: every element called once, one end each, no element opened
    /// twice, the records told apart, and a table with its row.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_small_distributed_for_each_runs_and_is_tabled() {
        let d = run(60, 8, 1).await.expect("the run");
        assert_eq!(d.element_requests(), 60, "{:?}", d.counts().messages);
        assert_eq!(d.ends(), 60);
        assert_eq!(d.counts().create_conflicts, 0);
        assert_eq!(d.other_records(), 0, "{:?}", d.counts().records.keys());
        let [task, run, elements] = d.by_kind();
        // The run's record: its start, and one write per delivery of ends (up to 10 each),
        // never one per end.
        assert!(task.writes > 0 && elements.writes >= 60 * 2);
        assert!((7..60).contains(&run.writes), "{} run writes", run.writes);
        assert!(task.largest < 16 * 1024, "{}", task.largest);
        assert!(d.ms >= d.floor_ms(), "{} < {}", d.ms, d.floor_ms());
        let t = table(&d, |_| (1e-3, 1e-3));
        assert!(t.contains("\n| 60 | 8 | "), "{t}");
        assert!(t.contains("| WRU in all |"), "{t}");
        println!("{t}");
    }

    /// In chunks: every element called once, one end per chunk, a record per chunk, and fewer
    /// write units per element than each element a record of its own.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_run_in_chunks_ends_one_chunk_at_a_time_and_writes_less_per_element() {
        let alone = run(60, 8, 1).await.expect("the run");
        // (60 over 8 at once: chunks of 7, at most, so that every place is taken.)
        let d = run(60, 8, 10).await.expect("the run in chunks");
        assert_eq!(d.chunk_used, 7);
        assert_eq!(d.element_requests(), 60, "{:?}", d.counts().messages);
        assert_eq!(d.ends(), 9);
        assert_eq!(d.element_ids.len(), 9);
        assert_eq!(d.counts().create_conflicts, 0);
        assert_eq!(d.other_records(), 0, "{:?}", d.counts().records.keys());
        assert!(
            d.counts().wru < alone.counts().wru,
            "{} WRU in chunks, {} alone",
            d.counts().wru,
            alone.counts().wru
        );
        let t = table(&d, |_| (1e-3, 1e-3));
        assert!(t.contains("**In chunks of 7**"), "{t}");
        assert!(t.contains("The writes of one chunk"), "{t}");
    }
}
