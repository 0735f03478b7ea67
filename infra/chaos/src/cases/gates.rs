//! A hot key at a concurrency gate: `posting` runs one task at a time per account
//! (`concurrency: {key: $.input.account, limit: 1}`). Most tasks are one account's, submitted
//! a few at a time while others' go too; its service is slow on some calls and refuses some
//! (a refusal before the pivot ends the task `Refused`; after it, the task waits in `Error`,
//! holding the gate, for an operator who retries it or, the third time, resolves it). The failpoints crash writers after their writes (an admission, a
//! park, a leave), lose write responses and duplicate and delay messages.
//!
//! Checked at the end: every record keeps its invariants; every task ended (none stuck in line
//! after its holder ended); the hot account's tasks ran one at a time (never two of them in the
//! service at once, measured there) and in the order they were submitted (each claimed after
//! the one before it, once that one ended); its gate is empty; and the run made the line real
//! (tasks waited, the operator acted), else it proves nothing. A submission the failpoints
//! throttle or crash is sent again under its idempotency key, as a caller does.

use super::world::{CaseWorld, ledger_services, plan, settings};
use sas::auth::Identity;
use sas::ports::GatePlace;
use sas::remote::{Faults, seeded_unit};
use sas::{Caller, ProcessState, StateRecord, TaskId};
use serde_json::json;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The case's size.
#[derive(Debug, Clone)]
pub struct HotGate {
    pub seed: u64,
    /// The hot account's tasks, and the others'.
    pub hot: usize,
    pub others: usize,
    pub patience: Duration,
}

impl HotGate {
    pub fn new(hot: usize, others: usize, seed: u64) -> Self {
        Self {
            seed,
            hot,
            others,
            patience: Duration::from_secs(90),
        }
    }
}

/// What the case saw.
#[derive(Debug, Default)]
pub struct HotGateReport {
    pub tasks: usize,
    /// Hot tasks claimed after the one before them ended: they waited in line.
    pub waited: usize,
    pub retries: usize,
    pub resolves: usize,
    pub states: BTreeMap<String, usize>,
    pub violations: Vec<String>,
}

impl HotGateReport {
    pub fn table(&self) -> String {
        format!(
            "a hot gate: {} tasks, {} waited in line (operator: {} retries, {} resolves), states {:?}; violations: {}",
            self.tasks,
            self.waited,
            self.retries,
            self.resolves,
            self.states,
            self.violations.len()
        )
    }
}

const HOT: &str = "acct-hot";

fn files() -> Vec<(String, String)> {
    vec![
        ledger_services(),
        (
            "posting.yaml".into(),
            "name: posting\nconcurrency: {key: $.input.account, limit: 1}\nsteps:\n  - {name: post, service: ledger, pivot: true, input: {account: $.input.account}}\n  - {name: settle, service: ledger, input: {account: $.input.account}}\n".into(),
        ),
    ]
}

/// When `r` first went to `to`.
fn first_at(r: &StateRecord, to: ProcessState) -> Option<chrono::DateTime<chrono::Utc>> {
    r.history.iter().find(|h| h.to == to).map(|h| h.at)
}

/// A task's record, read again while the failpoints throttle the read.
async fn read_state(world: &CaseWorld, id: TaskId) -> anyhow::Result<Option<StateRecord>> {
    let mut last = None;
    for _ in 0..10 {
        match world.system.store.get_state(id).await {
            Ok(r) => return Ok(r),
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Err(last.map_or_else(|| anyhow::anyhow!("unread"), Into::into))
}

/// Runs the case.
pub async fn hot_gate(cfg: &HotGate) -> anyhow::Result<HotGateReport> {
    let ledger = Faults {
        latency: Duration::from_millis(5),
        permanent_rate: 0.15,
        slow_rate: 0.3,
        slow_latency: Duration::from_millis(150),
        seed: Some(cfg.seed),
        // Calls at once per account, measured.
        count_by: Some("/account".into()),
        ..Faults::default()
    };
    let world =
        CaseWorld::start(settings(vec![("ledger", ledger)]), plan(cfg.seed), &files()).await?;
    let who = Identity::Caller(Caller::new("ledger-app")?);
    let mut headers = http::HeaderMap::new();
    headers.insert(
        "content-type",
        http::HeaderValue::from_static("application/json"),
    );
    // The hot account's tasks in the order submitted, and every task.
    let (mut hot, mut all) = (Vec::new(), Vec::new());
    let total = cfg.hot + cfg.others;
    for k in 0..total {
        let others_left = cfg.others.saturating_sub(all.len() - hot.len());
        let is_hot = others_left == 0
            || hot.len() < cfg.hot
                && seeded_unit(cfg.seed, &["hot"], k as u64) >= cfg.others as f64 / total as f64;
        let account = if is_hot {
            HOT.to_owned()
        } else {
            format!("acct-{k}")
        };
        let body = json!({ "account": account }).to_string();
        // A throttled or crashed submission is sent again under its key, as a caller does:
        // one whose task was stored before the crash gets that task (a task no caller knows
        // of would wait in Error, holding the gate, for an operator this case does not play).
        let mut headers = headers.clone();
        headers.insert(
            "idempotency-key",
            http::HeaderValue::from_str(&format!("posting-{k}"))?,
        );
        let mut id = None;
        for _ in 0..20 {
            let resp = sas::api::handle(
                &world.system.api,
                &who,
                &http::Method::POST,
                "/workflows/posting/tasks",
                &headers,
                body.as_bytes(),
            )
            .await;
            let answer: serde_json::Value = serde_json::from_str(resp.body()).unwrap_or_default();
            id = answer["taskId"]
                .as_str()
                .and_then(|s| s.parse::<TaskId>().ok());
            if id.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let Some(id) = id else {
            anyhow::bail!("submission {k} never answered");
        };
        if is_hot {
            hot.push(id);
        }
        all.push(id);
        // A few at a time: some arrive while the gate is held, some while it is free.
        if k % 3 == 2 {
            tokio::time::sleep(Duration::from_millis(40)).await;
        }
    }
    // Until every task has ended; the operator retries what waits in Error, and resolves it
    // the third time.
    let mut acted: BTreeMap<TaskId, u32> = BTreeMap::new();
    let (mut retries, mut resolves) = (0, 0);
    let deadline = Instant::now() + cfg.patience;
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut ended = true;
        for id in &all {
            let Ok(Some(r)) = world.system.store.get_state(*id).await else {
                // A read the failpoints throttled: look again next time.
                ended = false;
                continue;
            };
            // Ended, and its final notice out: its leave of the gate goes with it.
            ended &= r.process_state.is_final() && !r.notice_pending();
            if r.process_state == ProcessState::Error {
                let n = acted.entry(*id).or_default();
                let action = if *n >= 2 { "resolve" } else { "retry" };
                let body = json!({"reason": format!("chaos operator: {action}")});
                if world
                    .operator(&format!("/tasks/{id}/{action}"), &body)
                    .await
                    == 202
                {
                    *n += 1;
                    if action == "retry" {
                        retries += 1;
                    } else {
                        resolves += 1;
                    }
                }
            }
        }
        if ended || Instant::now() > deadline {
            break;
        }
    }
    let mut records = BTreeMap::new();
    for id in &all {
        if let Some(r) = read_state(&world, *id).await? {
            records.insert(*id, r);
        }
    }
    let policies = match world.system.definitions.latest("posting").await? {
        Some(w) => w.policies(),
        None => anyhow::bail!("the workflow is not published"),
    };
    let gate = match hot.last().and_then(|id| records.get(id)) {
        Some(last) => {
            let place = GatePlace {
                gate: &format!("posting#{HOT}"),
                task_id: last.task_id,
                created_at: last.created_at,
                limit: 1,
            };
            let mut seen = None;
            for _ in 0..10 {
                if let Ok(g) = world.system.store.gate_state(place).await {
                    seen = Some(g);
                    break;
                }
            }
            seen
        }
        None => None,
    };
    let ledger_stats = world.system.services.get("ledger").stats();
    world.shut_down().await;

    let mut report = HotGateReport {
        tasks: all.len(),
        retries,
        resolves,
        ..Default::default()
    };
    for r in records.values() {
        *report
            .states
            .entry(r.process_state.as_str().to_owned())
            .or_default() += 1;
        if let Err(e) = r.check(&policies) {
            report
                .violations
                .push(format!("task {}: invalid record: {e}", r.task_id));
        }
        if !r.process_state.is_final() {
            report.violations.push(format!(
                "task {} never ended ({}; gate {:?})",
                r.task_id, r.process_state, r.gate
            ));
        }
    }
    // One at a time, measured at the service: never two hot tasks' calls in it at once (a
    // task's repeated calls count once). The records' times cannot say it: a claim is stamped
    // when its handler began, a store round trip or a lost race before its admission.
    let at_once = ledger_stats
        .most_in_flight_by
        .get(HOT)
        .copied()
        .unwrap_or(0);
    if at_once > 1 {
        report.violations.push(format!(
            "{at_once} hot tasks' calls were in the service at once"
        ));
    }
    // In the order submitted: each hot task claimed after the one before it, and only once
    // that one has ended.
    for pair in hot.windows(2) {
        let (Some(before), Some(after)) = (records.get(&pair[0]), records.get(&pair[1])) else {
            continue;
        };
        let claimed = first_at(after, ProcessState::Processing);
        let claimed_before = first_at(before, ProcessState::Processing);
        let ended = before.process_state.is_final().then_some(before.since);
        match (claimed, claimed_before, ended) {
            (Some(c), Some(b), _) if c < b => report.violations.push(format!(
                "task {} claimed at {c}, before task {} submitted before it (claimed at {b})",
                after.task_id, before.task_id
            )),
            (Some(c), _, None) => report.violations.push(format!(
                "task {} claimed at {c} while task {} never ended",
                after.task_id, before.task_id
            )),
            (Some(c), _, Some(e)) if c >= e && after.created_at < e => report.waited += 1,
            _ => {}
        }
    }
    if let Some(g) = gate
        && (!g.holders.is_empty() || g.ahead.is_some())
    {
        report
            .violations
            .push(format!("the hot gate is not empty at the end: {g:?}"));
    }
    Ok(report)
}
