//! A schedule's runs that overlap: `reconcile` (a pivot, then a step that a service may refuse:
//! the task then waits in `Error` for an operator) runs every "minute" under `overlap: skip`.
//! Each run is delivered one to three times (EventBridge Scheduler delivers at least once),
//! late and out of order, so copies of a run and the next runs are handled at once by several
//! scheduler pollers; the service is slow on some calls; an operator retries or resolves each
//! task in `Error` a little later (a retry that fails again waits again). The failpoints crash
//! writers after their writes and lose write responses.
//!
//! Checked at the end: no two of the schedule's tasks were ever not ended at once (a task is
//! not ended from its creation until it reaches `Processed`, `Compensated`, `Refused` or
//! `Resolved`: `Error` waits for the operator), each run started at most one task, and every
//! record keeps its invariants; and the run made overlaps likely (runs skipped, tasks in
//! `Error` acted on), else it proves nothing.

use super::world::{CaseWorld, ledger_services, plan, settings};
use sas::messages::{ScheduledRun, SchedulerMessage};
use sas::ports::{Paging, StateStore};
use sas::remote::{Faults, seeded_unit};
use sas::{Caller, ProcessState, StateRecord, TaskId};
use serde_json::json;
use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

/// The case's size.
#[derive(Debug, Clone)]
pub struct OverlappingRuns {
    pub seed: u64,
    /// Runs of the schedule, one every `every`.
    pub runs: usize,
    pub every: Duration,
    /// How long the run waits for every task to end once the last run is sent.
    pub patience: Duration,
}

impl OverlappingRuns {
    pub fn new(runs: usize, seed: u64) -> Self {
        Self {
            seed,
            runs,
            every: Duration::from_millis(150),
            patience: Duration::from_secs(60),
        }
    }
}

/// What the case saw.
#[derive(Debug, Default)]
pub struct OverlappingRunsReport {
    pub runs: usize,
    /// Deliveries sent (each run one to three times).
    pub deliveries: usize,
    pub tasks: usize,
    /// Tasks that waited in `Error` at least once, and the operator's actions on them.
    pub in_error: usize,
    pub retries: usize,
    pub resolves: usize,
    /// Final states of the tasks.
    pub states: BTreeMap<String, usize>,
    pub violations: Vec<String>,
}

impl OverlappingRunsReport {
    pub fn table(&self) -> String {
        format!(
            "overlapping runs: {} runs ({} deliveries), {} tasks started ({} skipped), {} in Error (operator: {} retries, {} resolves), states {:?}; violations: {}",
            self.runs,
            self.deliveries,
            self.tasks,
            self.runs.saturating_sub(self.tasks),
            self.in_error,
            self.retries,
            self.resolves,
            self.states,
            self.violations.len()
        )
    }
}

const SCHEDULE: &str = "reconcile-often";

fn files() -> Vec<(String, String)> {
    vec![
        ledger_services(),
        (
            "reconcile.yaml".into(),
            "name: reconcile\nsteps:\n  - {name: post, service: ledger, pivot: true}\n  - {name: settle, service: ledger}\n".into(),
        ),
        (
            "schedules.json".into(),
            json!({"schedules": [{"name": SCHEDULE, "workflow": "reconcile",
                "expression": "rate(1 minute)", "overlap": "skip"}]})
            .to_string(),
        ),
    ]
}

/// Runs the case.
pub async fn overlapping_runs(cfg: &OverlappingRuns) -> anyhow::Result<OverlappingRunsReport> {
    let ledger = Faults {
        latency: Duration::from_millis(5),
        // A quarter of the keys refused: a refused `settle` (past the pivot) waits in Error.
        permanent_rate: 0.25,
        slow_rate: 0.3,
        slow_latency: Duration::from_millis(150),
        seed: Some(cfg.seed),
        ..Faults::default()
    };
    let world =
        CaseWorld::start(settings(vec![("ledger", ledger)]), plan(cfg.seed), &files()).await?;
    let caller = Caller::schedule(SCHEDULE)?;
    let mut report = OverlappingRunsReport {
        runs: cfg.runs,
        ..Default::default()
    };
    let operator = Operator::default();
    let base = chrono::Utc::now();
    for k in 0..cfg.runs {
        let run = ScheduledRun {
            schedule: SCHEDULE.into(),
            at: chrono::DateTime::from_timestamp(base.timestamp() - base.timestamp() % 60, 0)
                .unwrap_or(base)
                + chrono::Duration::minutes(k as i64),
        };
        let body = serde_json::to_string(&SchedulerMessage::Scheduled(run))?;
        let copies = 1 + (seeded_unit(cfg.seed, &["copies"], k as u64) * 3.0) as u64;
        for c in 0..copies.min(3) {
            // Up to five runs' time late: copies meet the next runs at the pollers. The first
            // copies of runs 2j and 2j+1 go out together, at once.
            let late = match c {
                0 => cfg
                    .every
                    .mul_f64(seeded_unit(cfg.seed, &["pair"], k as u64 / 2)),
                _ => cfg
                    .every
                    .mul_f64(5.0 * seeded_unit(cfg.seed, &["late"], k as u64 * 4 + c)),
            };
            // Through the failpoints: a send may be throttled (not made) or "crash" after it
            // was made; either way the run goes on (Scheduler's deliveries are as unsure).
            let sent = world
                .system
                .queue
                .send(&world.system.resources.work_queue_url, &body, late)
                .await;
            if sent.is_ok() || sent.is_err_and(|e| e.0.contains("died")) {
                report.deliveries += 1;
            }
        }
        if k % 2 == 1 {
            operator.look(&world, &caller, cfg.seed).await;
            tokio::time::sleep(cfg.every * 2).await;
        }
    }
    // Until every task has ended (the operator resolves what fails three times), once the
    // last copies (up to five runs late) are in.
    let sent = Instant::now();
    let deadline = sent + cfg.patience;
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        operator.look(&world, &caller, cfg.seed).await;
        let records = records_of(world.system.store.as_ref(), &caller).await?;
        let settled =
            sent.elapsed() > cfg.every * 6 && records.iter().all(|r| r.process_state.is_final());
        if settled || Instant::now() > deadline {
            break;
        }
    }
    let records = records_of(world.system.store.as_ref(), &caller).await?;
    let policies = match world.system.definitions.latest("reconcile").await? {
        Some(w) => w.policies(),
        None => anyhow::bail!("the workflow is not published"),
    };
    world.shut_down().await;

    report.tasks = records.len();
    report.retries = operator.count("retry");
    report.resolves = operator.count("resolve");
    report.in_error = operator.seen();
    for r in &records {
        *report
            .states
            .entry(r.process_state.as_str().to_owned())
            .or_default() += 1;
        if let Err(e) = r.check(&policies) {
            report
                .violations
                .push(format!("task {}: invalid record: {e}", r.task_id));
        }
    }
    report.violations.extend(overlaps(&records));
    if report.tasks > report.runs {
        report
            .violations
            .push(format!("{} tasks from {} runs", report.tasks, report.runs));
    }
    Ok(report)
}

/// Every task of `caller` (its state record), oldest first.
async fn records_of(store: &dyn StateStore, caller: &Caller) -> anyhow::Result<Vec<StateRecord>> {
    let mut out = vec![];
    let mut after = None;
    loop {
        let page = store
            .list_by_caller(
                caller,
                Paging {
                    limit: 100,
                    after: after.as_ref(),
                },
            )
            .await?;
        for s in &page.items {
            if let Some(r) = store.get_state(s.task_id).await? {
                out.push(r);
            }
        }
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    out.sort_by_key(|r| (r.created_at, r.task_id));
    Ok(out)
}

/// The tasks that started while an earlier one had not ended: a task is not ended from its
/// creation until it enters a final state (`since`), for good if it never does.
fn overlaps(records: &[StateRecord]) -> Vec<String> {
    let mut out = vec![];
    // The task not ended the longest so far, and until when (`None`: still not ended).
    let mut open: Option<(TaskId, Option<chrono::DateTime<chrono::Utc>>)> = None;
    for r in records {
        if let Some((id, until)) = open
            && until.is_none_or(|u| r.created_at < u)
        {
            out.push(format!(
                "task {} started at {} while task {id} had not ended ({})",
                r.task_id,
                r.created_at,
                until.map_or("it never did".to_owned(), |u| format!("until {u}"))
            ));
        }
        let end = r.process_state.is_final().then_some(r.since);
        let later = match open {
            Some((_, None)) => false,
            Some((_, Some(u))) => end.is_none_or(|e| e > u),
            None => true,
        };
        if later {
            open = Some((r.task_id, end));
        }
    }
    out
}

/// The operator: at each look, every task of the schedule waiting in `Error` (or
/// `CompensationFailed`) is retried, or resolved once it was retried twice, some looks after
/// it was first seen there.
#[derive(Default)]
struct Operator {
    /// Task → (looks it has waited, actions applied so far).
    waiting: std::sync::Mutex<BTreeMap<TaskId, (u32, u32)>>,
    seen: std::sync::Mutex<HashSet<TaskId>>,
    counts: std::sync::Mutex<BTreeMap<&'static str, usize>>,
}

impl Operator {
    async fn look(&self, world: &CaseWorld, caller: &Caller, seed: u64) {
        let Ok(records) = records_of(world.system.store.as_ref(), caller).await else {
            return;
        };
        for r in records.iter().filter(|r| {
            matches!(
                r.process_state,
                ProcessState::Error | ProcessState::CompensationFailed
            )
        }) {
            if let Ok(mut seen) = self.seen.lock() {
                seen.insert(r.task_id);
            }
            let (looks, acted) = {
                let Ok(mut w) = self.waiting.lock() else {
                    return;
                };
                let e = w.entry(r.task_id).or_default();
                e.0 += 1;
                *e
            };
            // A few looks later (the next runs come meanwhile), as a person would.
            let wait = 2
                + (seeded_unit(seed, &["wait", &r.task_id.to_string()], acted.into()) * 4.0) as u32;
            if looks < wait {
                continue;
            }
            let action = if acted >= 2 { "resolve" } else { "retry" };
            let body = json!({"reason": format!("chaos operator: {action}")});
            let status = world
                .operator(&format!("/tasks/{}/{action}", r.task_id), &body)
                .await;
            if status == 202 {
                if let Ok(mut w) = self.waiting.lock() {
                    w.insert(r.task_id, (0, acted + 1));
                }
                if let Ok(mut c) = self.counts.lock() {
                    *c.entry(action).or_default() += 1;
                }
            }
        }
    }

    fn count(&self, action: &str) -> usize {
        self.counts
            .lock()
            .map(|c| c.get(action).copied().unwrap_or(0))
            .unwrap_or(0)
    }

    fn seen(&self) -> usize {
        self.seen.lock().map(|s| s.len()).unwrap_or(0)
    }
}
