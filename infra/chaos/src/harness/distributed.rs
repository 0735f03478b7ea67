//! The distributed forEach case (issue 42), on the run's world (its failpoints, its services'
//! faults, several supervisors), with automatic compensation and no operator but the
//! sub-workflow case's (who resolves a child waiting for one): `month-end` tasks open a period
//! (undone by closing it), pay through a child task (`settle-payment`, the sub-workflow case's),
//! post their invoices as a distributed forEach (`elements` for `month-end`, `others` for its
//! variants; each undone by a void), then file. Three variants, so that every path is taken whatever the random task ids make of
//! the seeded faults:
//!
//! - `month-end`: the ledger refuses (or faults) a few invoices, within the tolerance: the run
//!   ends `Processed`, the task too;
//! - `month-end-returned`: the same, but the filing is refused: the task is undone after its run
//!   ended `Processed`, and the run undoes every element that took effect (an element's undo
//!   refused now and then leaves the run and the task `CompensationFailed`);
//! - `month-end-strict`: the clearing house refuses every disputed invoice (the list marks
//!   [`DISPUTED`] of them, past the tolerance of 2) and faults a few more with oversized answers:
//!   the run stops, its elements out finish, the ones that took effect are undone, and the step
//!   is refused (the task compensates: `Refused`);
//! - `month-end-chunked`: the returned variant with its elements in chunks of [`CHUNK`]: an
//!   element faulted fails its chunk (undone by itself, every element counted refused), the run
//!   ends `Processed`, then the task undoes it chunk by chunk, each chunk its elements.
//!
//! Which path each variant takes is decided by the case's data (the disputed invoices, the
//! refused filing, the returned variant's wider tolerance), not by where the seeded faults fall
//! on the random task ids: every run of the case takes all three.
//!
//! Checked, once every task, child, run and element settled:
//!
//! - each task ended, its child agrees with it (as in the sub-workflow case), and its run's end
//!   with its own: a `Processed` task has a `Processed` run with every element opened and no
//!   more refused than tolerated; an undone task a run that is undone or refused (or none); a
//!   run `CompensationFailed` only under a task `CompensationFailed`; the run is released once
//!   its task ended for good;
//! - each element's (or chunk's) record agrees with its mark in the run's ledger (`d` Processed,
//!   `f` ended with no effect, `x` undone, `!` its undo refused), nothing is out or undoing in an
//!   ended run, no record exists past the ones the ledger opened, and none is left running
//!   (orphaned);
//! - at the services: no key applied twice; each element's net effect is its mark's (`d` and
//!   `!`: 1, the others 0; in a chunk, its own state's within the chunk's), so a `Processed` task
//!   nets 1 for each element that went through and an undone one 0 for each but those whose undo
//!   was refused; no effect under a key that no
//!   step of a task, a child or an element has; the task's other steps as their final state
//!   says; and never more of a run's elements in calls at once than its `maxConcurrency`
//!   (measured at the service: distinct elements of the task's step in a call at once);
//! - after the retention (the clock moved past it, the sweeps purging), no item and no payload
//!   object is left of a final task, of its run (its kept list and context) or of its elements.

use super::checks::effects;
use super::config::Config;
use super::for_each::{submit, until};
use super::report::Report;
use super::sub_workflows::{agree, history, settle_checkout, settled_child};
use super::world::World;
use crate::operator::{Operator, OperatorPlan};
use sas::domain::run::{Mark, RunStop};
use sas::handlers::runs::{element_id, run_id};
use sas::messages::idempotency_key;
use sas::ports::StateStore;
use sas::{ProcessState, StateRecord, TaskId, Workflow};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The case's services: `ledger` refuses few invoices, `clearing` many.
const LEDGER: &str = "ledger";
const CLEARING: &str = "clearing";
/// The filing action the shipping service refuses (the `returned` variant's).
const FILE_LATE: &str = "file-late";

/// The case's workflow: open, pay (a child), post (distributed), file. Its variants are made
/// from it by [`workflows`].
const MONTH_END: &str = r#"
name: month-end
description: Open the period, settle the payment, post every invoice, file.
input:
  type: object
  required: [amount, invoices]
  properties:
    amount: {type: integer}
    invoices: {type: array}
steps:
  - name: open
    service: core-banking
    action: open-period
    undo: {action: close-period}
  - name: pay
    workflow: settle-payment
    input: {amount: $.input.amount}
  - name: post
    service: ledger
    action: post-invoice
    forEach: $.input.invoices
    distributed: true
    maxConcurrency: MAX_CONCURRENCY
    toleratedRefusals: "1%"
    input: {invoice: $.element, at: $.index}
    undo:
      action: void-invoice
      input: {posted: "$.steps['post'].result.id", invoice: $.element}
  - name: file
    service: shipping
    action: file-report
    input: {receipt: $.steps.pay.result.receipt}
"#;

/// The step of [`MONTH_END`] that is the distributed forEach.
const POST: usize = 2;

/// The case's workflows (name, YAML): [`MONTH_END`] and its two variants, each run at
/// `maxConcurrency` [`MAX_CONCURRENCY`].
pub(super) fn workflows() -> Vec<(String, String)> {
    let base = MONTH_END.replace("MAX_CONCURRENCY", &MAX_CONCURRENCY.to_string());
    let returned = base
        .replace("name: month-end\n", "name: month-end-returned\n")
        .replace("action: file-report", &format!("action: {FILE_LATE}"));
    let strict = base
        .replace("name: month-end\n", "name: month-end-strict\n")
        .replace("service: ledger", &format!("service: {CLEARING}"))
        .replace("toleratedRefusals: \"1%\"", "toleratedRefusals: 2");
    // The returned run must end Processed before its task undoes it: room for the ledger's
    // seeded refusals (about one invoice in 800), whatever keys they fall on.
    let returned = returned.replace("toleratedRefusals: \"1%\"", "toleratedRefusals: \"10%\"");
    // In chunks: a faulted element counts its whole chunk refused, so room for a few chunks;
    // at most a tenth of the list at once, so that chunks are whole (a chunk is at most the
    // list spread over `maxConcurrency`).
    let chunked = returned
        .replace("name: month-end-returned\n", "name: month-end-chunked\n")
        .replace(
            &format!("maxConcurrency: {MAX_CONCURRENCY}\n"),
            "maxConcurrency: 10\n",
        )
        .replace(
            "    distributed: true\n",
            &format!("    distributed: true\n    chunk: {CHUNK}\n"),
        )
        .replace("toleratedRefusals: \"10%\"", "toleratedRefusals: \"30%\"");
    vec![
        ("month-end".into(), base),
        ("month-end-returned".into(), returned),
        ("month-end-strict".into(), strict),
        ("month-end-chunked".into(), chunked),
    ]
}

/// The chunked variant's elements to a record.
pub const CHUNK: u32 = 10;

/// The strict variant's invoices the clearing house refuses (marked `disputed`): past its
/// tolerance of 2, spread over the list so that the run stops with elements out and others
/// already taken effect.
pub const DISPUTED: [usize; 4] = [11, 37, 52, 88];

/// Where a disputed invoice is marked in an element's request (`input: {invoice: $.element}`).
const DISPUTED_AT: &str = "/invoice/disputed";

/// The agents working at once (the agent Lambda's concurrency) in this case.
const AGENTS: usize = 32;

/// The most elements of a run out at once.
pub const MAX_CONCURRENCY: u32 = 100;

/// Adds the case's services to a services file (simulated, like the examples').
pub(super) fn add_services(services: &mut Value) {
    if let Some(list) = services.get_mut("services").and_then(Value::as_array_mut) {
        for (name, what) in [
            (LEDGER, "Posts and voids invoices."),
            (CLEARING, "Clears invoices; strict."),
        ] {
            list.push(json!({"name": name, "description": what, "target": {"type": "simulated"}}));
        }
    }
}

/// How many tasks of each variant, and how long their lists are.
#[derive(Debug, Clone, Copy)]
pub struct DistributedCase {
    /// `month-end` tasks: Processed, a few elements refused within the tolerance.
    pub processed: usize,
    /// `month-end-returned` tasks: undone after their run ended Processed.
    pub returned: usize,
    /// `month-end-strict` tasks: their run stops past the tolerance and undoes itself.
    pub stopped: usize,
    /// `month-end-chunked` tasks: in chunks, undone after their run ended Processed.
    pub chunked: usize,
    /// Elements in each `month-end` task's list (the issue's 1,000).
    pub elements: usize,
    /// Elements in each other task's list (undone, or stopped early: their work is the undos).
    pub others: usize,
}

/// What the case found (`violations`, each a line) and counted.
#[derive(Debug, Default)]
pub struct DistributedReport {
    pub violations: Vec<String>,
    /// The tasks' final states, their runs', and the children's.
    pub tasks: BTreeMap<String, usize>,
    pub runs: BTreeMap<String, usize>,
    pub children: BTreeMap<String, usize>,
    /// Elements opened (records made), over every run.
    pub opened: usize,
    /// Element marks over every run (`d`, `f`, `x`, `!`...).
    pub marks: BTreeMap<char, usize>,
    /// Runs that stopped past their tolerance and undid the elements that took effect.
    pub stopped_and_undone: usize,
    /// Runs that ended Processed, then were undone by their task.
    pub undone_after_processed: usize,
    /// The most elements of one run in calls at once, at the service, and the cap.
    pub most_in_flight: u32,
    pub max_concurrency: u32,
    /// Final tasks, runs and elements with payloads purged at their retention's end.
    pub purged: usize,
    /// From the first submission until every task settled.
    pub took: Duration,
    /// The story of each task that did not take its variant's path (its history and its run's),
    /// for the report when the paths' counts are not the case's.
    pub off_path: Vec<String>,
}

/// Runs the case on fresh in-memory adapters under `cfg`'s faults and failpoints, then checks it.
pub async fn run_distributed_case(
    cfg: &Config,
    case: DistributedCase,
) -> anyhow::Result<DistributedReport> {
    if case.stopped > 0 && case.others <= DISPUTED[2] {
        anyhow::bail!(
            "a strict list of {} invoices holds fewer than 3 disputed ones: its run never stops",
            case.others
        );
    }
    let mut cfg = cfg.clone();
    cfg.distributed_case = true;
    cfg.operator = None;
    // A run has up to `maxConcurrency` elements out: more agents than the run's twelve, so
    // that they are worked on at once (the Lambda's concurrency, not a limit of the case).
    cfg.settings.agent_concurrency = cfg.settings.agent_concurrency.max(AGENTS);
    let seed = cfg.seed;
    for (service, f) in cfg.settings.faults.iter_mut() {
        // Every service commits late now and then (its effect lands after the caller gave up).
        f.late_commit_rate = 0.01;
        // Refusals come from the case's services and the refused filing alone: the variants
        // then take the paths they are for, whatever the random task ids make of the seed.
        f.permanent_rate = 0.0;
        if service == "shipping" {
            f.refuse_actions = vec![FILE_LATE.into()];
        }
    }
    for (i, (service, permanent, oversized)) in [
        // A few invoices refused (one in 500 faulted or refused: within the 1% tolerated), and
        // now and then an undo: a run undone may end CompensationFailed.
        (LEDGER, 0.0003, 0.002),
        // The disputed invoices refused (past the 2 tolerated), and one in 50 faulted or
        // refused by an oversized answer; an undo is never refused, so the stop undoes cleanly.
        (CLEARING, 0.0, 0.02),
    ]
    .into_iter()
    .enumerate()
    {
        cfg.settings.faults.insert(
            service.into(),
            sas::remote::Faults {
                // Long enough that a run's calls overlap at the service: its cap is measured.
                latency: Duration::from_millis(25),
                transient_rate: 0.1,
                permanent_rate: permanent,
                lost_response_rate: 0.03,
                slow_rate: 0.01,
                slow_latency: Duration::from_secs(4),
                late_commit_rate: 0.01,
                oversized,
                refuse_marked: (service == CLEARING).then(|| DISPUTED_AT.into()),
                seed: Some(seed.wrapping_add(100 + i as u64)),
                ..sas::remote::Faults::default()
            },
        );
    }
    let ports = sas_local::ports(sas_local::Backend::Memory, &cfg.settings).await?;
    let mut world = World::set_up(ports, &cfg).await?;
    let http = reqwest::Client::new();
    let patience = cfg.patience;
    let store = world.system.store.clone();
    let mut out = DistributedReport {
        max_concurrency: MAX_CONCURRENCY,
        ..DistributedReport::default()
    };
    let definitions = world.system.definitions.clone();
    let mut variants: HashMap<&str, Arc<Workflow>> = HashMap::new();
    for name in [
        "month-end",
        "month-end-returned",
        "month-end-strict",
        "month-end-chunked",
    ] {
        let Some(w) = definitions.workflow(name, 1).await? else {
            anyhow::bail!("{name} is not published");
        };
        variants.insert(name, w);
    }
    let Some(payment) = definitions.workflow("settle-payment", 1).await? else {
        anyhow::bail!("settle-payment is not published");
    };
    let operator = Arc::new(Operator::new(
        world.base.clone(),
        store.clone(),
        OperatorPlan::default(),
        seed,
    ));

    let plan: Vec<&str> = std::iter::repeat_n("month-end", case.processed)
        .chain(std::iter::repeat_n("month-end-returned", case.returned))
        .chain(std::iter::repeat_n("month-end-strict", case.stopped))
        .chain(std::iter::repeat_n("month-end-chunked", case.chunked))
        .collect();
    let started = Instant::now();
    let submitted: Arc<Submitted> = Arc::default();
    let runs = plan.iter().enumerate().map(|(i, name)| {
        let (http, base, operator) = (http.clone(), world.base.clone(), operator.clone());
        let submitted = submitted.clone();
        let workflow = variants[name].clone();
        let n = if *name == "month-end" {
            case.elements
        } else {
            case.others
        };
        let strict = *name == "month-end-strict";
        let invoices: Vec<Value> = (0..n)
            .map(|k| {
                let disputed = strict && DISPUTED.contains(&k);
                json!({"invoice": format!("inv-{i}-{k}"), "disputed": disputed})
            })
            .collect();
        async move {
            let input = json!({"amount": i + 1, "invoices": invoices});
            let key = format!("month-end-{seed}-{i}");
            let id = submit(&http, &base, name, &key, &input).await?;
            if let Ok(mut s) = submitted.lock() {
                s.push((id, workflow.clone()));
            }
            match settle_checkout(&operator, &workflow, id, patience).await {
                Ok(r) => Ok((r, workflow)),
                Err(e) => {
                    let run = run_of(&*operator.store, &workflow, id).await;
                    Err(format!("{e}\n{}", run_story(&*operator.store, run).await))
                }
            }
        }
    });
    let done = std::sync::atomic::AtomicBool::new(false);
    let (outcomes, ()) = tokio::join!(
        async {
            let outcomes = futures::future::join_all(runs).await;
            done.store(true, std::sync::atomic::Ordering::Relaxed);
            outcomes
        },
        show_progress(&*store, &submitted, &done, started)
    );
    let mut tasks = vec![];
    for outcome in outcomes {
        match outcome {
            Ok(r) => tasks.push(r),
            Err(e) => out.violations.push(e),
        }
    }
    out.took = started.elapsed();

    // Every record the retention must purge, once all is checked.
    let mut finals: HashMap<TaskId, Option<StateRecord>> = HashMap::new();
    let mut children = vec![];
    let mut elements: Vec<(TaskId, Arc<Workflow>, Vec<StateRecord>)> = vec![];
    for (task, workflow) in &tasks {
        *out.tasks.entry(task.process_state.to_string()).or_default() += 1;
        if !on_path(task) {
            let run = run_id_of(task, workflow);
            out.off_path.push(format!(
                "{} ({}) {}\n{}\n{}",
                task.task_id,
                task.workflow,
                task.process_state,
                history("  ", task).join("\n"),
                run_story(&*store, run).await
            ));
        }
        finals.insert(task.task_id, Some(task.clone()));
        match settled_child(&*store, task, workflow, patience).await {
            Ok(Some(child)) => {
                *out.children
                    .entry(child.process_state.to_string())
                    .or_default() += 1;
                out.violations.extend(agree(task, &child));
                // (A child its parent still holds has no retention yet.)
                if !child.held_by_parent() {
                    finals.insert(child.task_id, Some(child.clone()));
                }
                children.push(child);
            }
            Ok(None) => {
                if task.process_state == ProcessState::Processed {
                    out.violations
                        .push(format!("{}: Processed without a child", task.task_id));
                }
            }
            Err(e) => out.violations.push(format!(
                "{e}\nits parent {} ({}):\n{}",
                task.process_state,
                task.workflow,
                history("  ", task).join("\n")
            )),
        }
        match check_run(&*store, task, workflow, patience, &mut out).await {
            Ok(Some((run, records))) => {
                finals.insert(run.task_id, Some(run));
                for e in records.iter().filter(|e| e.payloads) {
                    finals.insert(e.task_id, Some(e.clone()));
                }
                elements.push((task.task_id, workflow.clone(), records));
            }
            Ok(None) => {}
            Err(e) => out.violations.push(e),
        }
    }

    // The retention's end: nothing of a final task, run or element is left.
    let (purged, outlived) = world.end_retention(&cfg, &finals).await;
    out.purged = purged;
    out.violations.extend(
        outlived
            .into_iter()
            .map(|o| format!("outlived its retention: {o}")),
    );
    let payloads = world.system.supervisor.ports.payloads.clone();
    for (_, _, records) in &elements {
        for e in records.iter().filter(|e| e.process_state.is_final()) {
            match payloads.delete_task(e.task_id).await {
                Ok(0) => {}
                Ok(n) => out.violations.push(format!(
                    "element {}: {n} objects after its retention",
                    e.task_id
                )),
                Err(e) => out.violations.push(format!("objects unlisted: {e}")),
            }
        }
    }

    world.stop_supervisors().await;
    let left = world.shut_down().await;
    let mut report = Report::default();
    let books = effects::tally_services(&left.services, &mut report).await;
    let mut known = BTreeSet::new();
    for (task, workflow) in &tasks {
        effects::check_net_effects(
            &task.task_id,
            &task.workflow,
            task,
            workflow,
            &books,
            &[],
            &mut known,
            &mut report,
        );
        let group = format!("{}:{}", task.task_id, workflow.steps[POST].name);
        let most = books.elements_in_flight.get(&group).copied().unwrap_or(0);
        out.most_in_flight = out.most_in_flight.max(most);
        let cap = workflow.steps[POST]
            .run
            .as_ref()
            .map_or(MAX_CONCURRENCY, |r| r.max_concurrency);
        if most > cap {
            out.violations.push(format!(
                "{} ({}): {most} elements in calls at once at the service, maxConcurrency {cap}",
                task.task_id, task.workflow
            ));
        }
    }
    for child in &children {
        effects::check_net_effects(
            &child.task_id,
            &child.workflow,
            child,
            &payment,
            &books,
            &[],
            &mut known,
            &mut report,
        );
    }
    for (task, workflow, records) in &elements {
        check_element_effects(*task, workflow, records, &books, &mut known, &mut out);
    }
    effects::check_no_stray_keys(&books, &known, &mut report);
    for (what, list) in [
        ("applied twice", &report.doubled),
        ("leaked", &report.leaked),
        ("wrong body", &report.wrong_bodies),
        ("wrong net effect", &report.wrong_net),
    ] {
        out.violations
            .extend(list.iter().map(|l| format!("{what}: {l}")));
    }
    let recorder = &left.chaos.recorder;
    for (what, list) in [
        ("misreported", &recorder.misreported),
        ("over AWS's limits", &recorder.too_large),
    ] {
        let list = list.lock().map(|l| l.clone()).unwrap_or_default();
        out.violations
            .extend(list.into_iter().map(|l| format!("{what}: {l}")));
    }
    Ok(out)
}

/// Whether `task` ended as its variant is for: `month-end` Processed, the others undone.
fn on_path(task: &StateRecord) -> bool {
    let undone = matches!(
        task.process_state,
        ProcessState::Refused | ProcessState::Compensated
    );
    match task.workflow.as_str() {
        "month-end" => task.process_state == ProcessState::Processed,
        _ => undone,
    }
}

/// The tasks submitted so far, with their workflows.
type Submitted = std::sync::Mutex<Vec<(TaskId, Arc<Workflow>)>>;

/// With `SAS_CHAOS_PROGRESS` set: every 5 s while the tasks of `submitted` run, each task's
/// state and its run's ledger, on stderr (to see where a slow run spends its time).
async fn show_progress(
    store: &dyn StateStore,
    submitted: &Submitted,
    done: &std::sync::atomic::AtomicBool,
    started: Instant,
) {
    if std::env::var_os("SAS_CHAOS_PROGRESS").is_none() {
        return;
    }
    let mut last = Instant::now();
    while !done.load(std::sync::atomic::Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(250)).await;
        if last.elapsed() < Duration::from_secs(5) {
            continue;
        }
        last = Instant::now();
        let tasks = submitted.lock().map(|s| s.clone()).unwrap_or_default();
        for (id, workflow) in &tasks {
            let task = match store.get_state(*id).await {
                Ok(Some(t)) => format!("{} v{}", t.process_state, t.version),
                other => format!("{other:?}"),
            };
            let run = run_of(store, workflow, *id).await;
            let run = match store.get_state(run).await {
                Ok(Some(r)) => format!(
                    "{} v{} {}",
                    r.process_state,
                    r.version,
                    r.run
                        .as_ref()
                        .map_or_else(String::new, |s| s.ledger.to_string())
                ),
                other => format!("{other:?}"),
            };
            eprintln!(
                "{:>5.1}s {id} {}: {task}; run {run}",
                started.elapsed().as_secs_f64(),
                workflow.name
            );
        }
    }
}

/// Task `task`'s run once it settled (its elements too), checked against the task and its
/// elements against its ledger; `None`: the step never started one (it must not have).
async fn check_run(
    store: &dyn StateStore,
    task: &StateRecord,
    workflow: &Workflow,
    patience: Duration,
    out: &mut DistributedReport,
) -> Result<Option<(StateRecord, Vec<StateRecord>)>, String> {
    use ProcessState as P;
    let id = run_id_of(task, workflow);
    let (t, tid) = (task.process_state, task.task_id);
    match store.get_state(id).await {
        Ok(None) => {
            if t == P::Processed {
                out.violations
                    .push(format!("{tid}: Processed without a run"));
            }
            return Ok(None);
        }
        Ok(Some(_)) => {}
        Err(e) => return Err(format!("run {id}: unreadable: {e}")),
    }
    let settled = until(store, id, patience, |r| {
        r.process_state.is_terminal()
            && !r.notice_pending()
            && !(t.is_final() && r.held_by_parent())
    })
    .await;
    let run = match settled {
        Ok(run) => run,
        Err(e) => {
            return Err(format!(
                "run of {tid} ({t}): {e} (orphaned)\n{}",
                run_story(store, id).await
            ));
        }
    };
    *out.runs.entry(run.process_state.to_string()).or_default() += 1;
    let Some(state) = &run.run else {
        return Err(format!("run {id} of {tid} has no ledger"));
    };
    let ledger = &state.ledger;
    let r = run.process_state;
    let fine = match t {
        P::Processed => r == P::Processed,
        P::Compensated | P::Refused => matches!(r, P::Compensated | P::Refused),
        // The run's undo refused, or the child's (the run then undone).
        P::CompensationFailed => matches!(r, P::CompensationFailed | P::Compensated | P::Refused),
        _ => false,
    };
    if !fine || (r == P::CompensationFailed && t != P::CompensationFailed) {
        out.violations.push(format!(
            "{tid} ({}): task {t}, its run {id} {r} ({ledger})",
            task.workflow
        ));
    }
    if run.parent.as_ref().map(|l| l.task_id) != Some(tid) {
        out.violations
            .push(format!("run {id}: names {:?}, not {tid}", run.parent));
    }
    let opened = ledger.marks.len() as u32;
    let count = |m: Mark| ledger.count(m);
    let wrong = |why: &str| {
        format!(
            "run {id} of {tid} ({}, {r}): {why} ({ledger})",
            task.workflow
        )
    };
    if count(Mark::Out) + count(Mark::Undoing) > 0 {
        out.violations.push(wrong("ended with elements out"));
    }
    match r {
        P::Processed if opened != ledger.units() || ledger.refused() > ledger.tolerated => {
            out.violations
                .push(wrong("Processed, but not every element went through"));
        }
        P::Compensated | P::Refused if count(Mark::Done) + count(Mark::UndoFailed) > 0 => {
            out.violations
                .push(wrong("undone, but elements keep their effect"));
        }
        P::CompensationFailed if count(Mark::UndoFailed) == 0 => {
            out.violations
                .push(wrong("CompensationFailed with no undo refused"));
        }
        _ => {}
    }
    for c in ledger.marks.chars() {
        *out.marks.entry(c).or_default() += 1;
    }
    out.opened += opened as usize;
    match ledger.stop {
        Some(RunStop::Refused) if count(Mark::Undone) > 0 => out.stopped_and_undone += 1,
        Some(RunStop::Undo) => out.undone_after_processed += 1,
        _ => {}
    }
    let records = check_elements(store, &run, task, patience, out).await;
    Ok(Some((run, records)))
}

/// Each element of `run` (ended) against its mark; none past the ledger's end. The elements'
/// records, as read once they settled.
async fn check_elements(
    store: &dyn StateStore,
    run: &StateRecord,
    task: &StateRecord,
    patience: Duration,
    out: &mut DistributedReport,
) -> Vec<StateRecord> {
    use ProcessState as P;
    let Some(ledger) = run.run.as_ref().map(|s| &s.ledger) else {
        return vec![];
    };
    let mut records = vec![];
    let final_task = task.process_state.is_final();
    for k in 0..ledger.units() {
        let id = element_id(run.task_id, k);
        let Some(mark) = ledger.mark(k) else {
            // Never opened: no record.
            if !matches!(store.get_state(id).await, Ok(None)) {
                out.violations.push(format!(
                    "run {}: element {k} exists, past the {} the ledger opened",
                    run.task_id,
                    ledger.marks.len()
                ));
            }
            continue;
        };
        let settled = |e: &StateRecord| {
            e.process_state.is_terminal()
                && !e.notice_pending()
                && !(final_task && e.held_by_parent())
        };
        let e = match store.get_state(id).await {
            Ok(Some(e)) if settled(&e) => e,
            Ok(None) => {
                out.violations.push(format!(
                    "run {}: element {k} marked {mark:?} has no record",
                    run.task_id
                ));
                continue;
            }
            _ => match until(store, id, patience / 4, settled).await {
                Ok(e) => e,
                Err(why) => {
                    out.violations.push(format!(
                        "run {} ({}): element {k} not settled (orphaned): {why}",
                        run.task_id, run.process_state
                    ));
                    continue;
                }
            },
        };
        let undone = e.parent.as_ref().is_some_and(|l| l.undo_attempt.is_some());
        let s = e.process_state;
        let fine = match mark {
            Mark::Done => s == P::Processed && !undone,
            Mark::Failed => matches!(s, P::Refused | P::Compensated | P::Resolved) && !undone,
            Mark::Undone => matches!(s, P::Compensated | P::Refused) && undone,
            Mark::UndoFailed => matches!(s, P::CompensationFailed | P::Resolved) && undone,
            Mark::Out | Mark::Undoing => false,
        };
        let names = e.parent.as_ref().and_then(|l| l.element.as_ref());
        if !fine
            || names.map(|el| (el.index, el.task_id)) != Some((k, task.task_id))
            || e.parent.as_ref().map(|l| l.task_id) != Some(run.task_id)
        {
            out.violations.push(format!(
                "run {} ({}): element {k} marked {mark:?}, its record {s} (undone as a unit: {undone}, parent {:?})",
                run.task_id, run.process_state, e.parent
            ));
        }
        records.push(e);
    }
    records
}

/// Each element's keys (its step's and its undo's, under their generations) are known, and its
/// net effect at the service is its mark's: `d` and `!` (its undo refused) 1, the others 0.
fn check_element_effects(
    task: TaskId,
    workflow: &Workflow,
    records: &[StateRecord],
    books: &effects::Effects,
    known: &mut BTreeSet<String>,
    out: &mut DistributedReport,
) {
    let step = &workflow.steps[POST];
    let Some(def) = &step.run else {
        out.violations
            .push(format!("{task}: step {POST} is no distributed forEach"));
        return;
    };
    let element = &def.element;
    for e in records {
        let Some(of) = e.parent.as_ref().and_then(|l| l.element.as_ref()) else {
            continue;
        };
        let k = of.index;
        let Some(state) = e.steps.first() else {
            continue;
        };
        if of.first.is_some() {
            check_chunk_effects(task, step, element, e, of, books, known, out);
            continue;
        }
        let key = known_keys(task, step, element, k, state, known);
        use ProcessState as P;
        let undone = e.parent.as_ref().is_some_and(|l| l.undo_attempt.is_some());
        let want: &[i32] = match (e.process_state, undone) {
            (P::Processed, false) => &[1],
            // Its undo refused: its effect stays.
            (P::CompensationFailed, true) => &[1],
            (P::Refused | P::Compensated, _) => &[0],
            // Settled by an operator, or not ended: not sas's books to add up.
            _ => continue,
        };
        let got = books.net.get(&key).copied().unwrap_or(0);
        if !want.contains(&got) {
            out.violations.push(format!(
                "element {} ({key}): nets {got}, not {want:?} (its record {}, undone as a unit: {undone}, step {}{})",
                e.task_id,
                e.process_state,
                state.status,
                state.undo.map(|u| format!(", undo {u}")).unwrap_or_default()
            ));
        }
    }
}

/// Element `k`'s keys (its step's and its undo's, under the generations of `state`, its own)
/// added to `known`; its step's key.
fn known_keys(
    task: TaskId,
    step: &sas::domain::workflow::Step,
    element: &sas::domain::workflow::Step,
    k: u32,
    state: &sas::domain::state::StepState,
    known: &mut BTreeSet<String>,
) -> String {
    let unit = format!("{}#{k}", step.name);
    let key = idempotency_key(task, &unit, &element.action, state.generation);
    known.insert(key.clone());
    if let Some(undo) = &element.undo {
        known.insert(idempotency_key(
            task,
            &unit,
            &undo.action,
            state.undo_generation,
        ));
    }
    key
}

/// Each element of chunk record `e` (`of`): its keys known, and its net effect its own state's
/// within the chunk's: a chunk `Processed` nets 1 for each element done and 0 for each refused;
/// one undone (or failed and undone by itself) 0 for each; one whose undo of an element was
/// refused 1 for that element, 0 for those undone.
#[allow(clippy::too_many_arguments)]
fn check_chunk_effects(
    task: TaskId,
    step: &sas::domain::workflow::Step,
    element: &sas::domain::workflow::Step,
    e: &StateRecord,
    of: &sas::domain::state::ElementOf,
    books: &effects::Effects,
    known: &mut BTreeSet<String>,
    out: &mut DistributedReport,
) {
    use ProcessState as P;
    use sas::StepStatus as S;
    let elements = e.steps.first().map_or(&[][..], |s| &s.elements[..]);
    for (j, el) in elements.iter().enumerate() {
        let key = known_keys(task, step, element, of.element_index(j), el, known);
        let want: &[i32] = match (e.process_state, el.status, el.undo) {
            (_, S::Failed, _) | (_, S::Pending, _) => &[0],
            (_, _, Some(S::Done)) => &[0],
            (P::Processed, S::Done, None) => &[1],
            (P::Refused | P::Compensated, _, _) => &[0],
            (P::CompensationFailed, S::Done, Some(S::Failed)) => &[1],
            // Settled by an operator, an outcome unknown to sas (timed out): not its books.
            _ => continue,
        };
        let got = books.net.get(&key).copied().unwrap_or(0);
        if !want.contains(&got) {
            out.violations.push(format!(
                "chunk {} element {j} ({key}): nets {got}, not {want:?} (the chunk {}, the element {}{})",
                e.task_id,
                e.process_state,
                el.status,
                el.undo.map(|u| format!(", undo {u}")).unwrap_or_default()
            ));
        }
    }
}

/// The run task `task`'s distributed step starts (under its key's current generation).
fn run_id_of(task: &StateRecord, workflow: &Workflow) -> TaskId {
    let step = &workflow.steps[POST];
    let generation = task.steps.get(POST).map_or(0, |s| s.generation);
    run_id(&idempotency_key(
        task.task_id,
        &step.name,
        &step.action,
        generation,
    ))
}

/// The run of task `id`, as its record reads now (under its first key if it is unreadable).
async fn run_of(store: &dyn StateStore, workflow: &Workflow, id: TaskId) -> TaskId {
    match store.get_state(id).await {
        Ok(Some(task)) => run_id_of(&task, workflow),
        _ => {
            let step = &workflow.steps[POST];
            run_id(&idempotency_key(id, &step.name, &step.action, 0))
        }
    }
}

/// A run's ledger and history, and the elements it has out, as they can be read now (for the
/// report).
async fn run_story(store: &dyn StateStore, id: TaskId) -> String {
    let Ok(Some(r)) = store.get_state(id).await else {
        return format!("run {id}: unreadable");
    };
    let mut lines = vec![format!(
        "run {id} {} v{} {}",
        r.process_state,
        r.version,
        r.run.as_ref().map_or_else(String::new, |s| format!(
            "{} [{}]",
            s.ledger, s.ledger.marks
        ))
    )];
    lines.extend(history("  ", &r).into_iter().rev().take(10).rev());
    let marks = r
        .run
        .as_ref()
        .map(|s| s.ledger.marks.clone())
        .unwrap_or_default();
    for (k, c) in marks
        .char_indices()
        .filter(|(_, c)| matches!(c, 'o' | 'u'))
        .take(5)
    {
        let e = element_id(id, k as u32);
        match store.get_state(e).await {
            Ok(Some(e)) => {
                if c == 'u' && e.process_state == ProcessState::Processed {
                    // The ledger undoes it, but its undo never began: nothing asks for it again
                    // before the run's check (`RUN_RECHECK`, 5 minutes). A defect of sas's, named.
                    lines.push(format!(
                        "  UNDO LOST: element {k} marked undoing, its record Processed with no undo begun"
                    ));
                }
                lines.push(format!(
                    "  element {k} ({c}) {} {} v{} steps {:?} undo {:?} outbox {}",
                    e.task_id,
                    e.process_state,
                    e.version,
                    e.steps.iter().map(|s| s.status).collect::<Vec<_>>(),
                    e.steps.iter().map(|s| s.undo).collect::<Vec<_>>(),
                    e.notice_pending()
                ));
                lines.extend(history("    ", &e));
            }
            other => lines.push(format!("  element {k} ({c}): {other:?}")),
        }
    }
    lines.join("\n")
}
