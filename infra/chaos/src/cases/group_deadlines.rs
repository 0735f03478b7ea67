//! Task deadlines at parallel groups: `split-order` holds stock on one branch and books then
//! confirms a carrier on the other, then notifies, all within a 1 s task deadline (the shortest a workflow may have). The
//! carrier is paused for the first half of the tasks (its steps are deferred: when the
//! deadline passes, no branch may be out, one done and the other waiting) and slow on some
//! calls for the second (its step is out at the deadline). Failures wait in `Error`; an
//! operator skips the failed step with a result given by hand, or retries the task, up to
//! three times, then resolves it. The failpoints crash writers after their writes and lose
//! write responses.
//!
//! Checked at the end: every record keeps its invariants ([`sas::StateRecord::check`]), every
//! task ended, and no step that was done when the operator acted was rewritten (its status and
//! its result, what its undo reads, are as they were); and the run made the case happen
//! (deadlines passed, skips and retries applied), else it proves nothing.

use super::world::{CaseWorld, plan, settings};
use sas::remote::{Faults, seeded_unit};
use sas::{ProcessState, StateRecord, StepStatus, TaskId};
use serde_json::json;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The case's size.
#[derive(Debug, Clone)]
pub struct GroupDeadlines {
    pub seed: u64,
    pub tasks: usize,
    pub patience: Duration,
}

impl GroupDeadlines {
    pub fn new(tasks: usize, seed: u64) -> Self {
        Self {
            seed,
            tasks,
            patience: Duration::from_secs(60),
        }
    }
}

/// What the case saw.
#[derive(Debug, Default)]
pub struct GroupDeadlinesReport {
    pub tasks: usize,
    /// Tasks failed by their deadline (at least once).
    pub timed_out: usize,
    pub skips: usize,
    pub retries: usize,
    pub resolves: usize,
    pub states: BTreeMap<String, usize>,
    pub violations: Vec<String>,
}

impl GroupDeadlinesReport {
    pub fn table(&self) -> String {
        format!(
            "deadlines at groups: {} tasks, {} failed by their deadline (operator: {} skips, {} retries, {} resolves), states {:?}; violations: {}",
            self.tasks,
            self.timed_out,
            self.skips,
            self.retries,
            self.resolves,
            self.states,
            self.violations.len()
        )
    }
}

const WORKFLOW: &str = r#"name: split-order
deadline: 1s
steps:
  - name: both
    parallel:
      - steps:
          - {name: hold, service: stock, undo: {action: release}}
      - steps:
          - {name: book, service: carrier, undo: {action: unbook}}
          - {name: confirm, service: stock}
  - {name: notify, service: stock}
"#;

fn files() -> Vec<(String, String)> {
    vec![
        (
            "services.yaml".into(),
            "services:\n  - {name: stock, target: {type: simulated}}\n  - {name: carrier, target: {type: simulated}}\n".into(),
        ),
        ("split-order.yaml".into(), WORKFLOW.into()),
    ]
}

/// A step done when the operator acted on a task: (task, step index, its result).
type Done = (TaskId, usize, Option<String>);

/// Runs the case.
pub async fn deadlines_at_groups(cfg: &GroupDeadlines) -> anyhow::Result<GroupDeadlinesReport> {
    let fast = Faults {
        latency: Duration::from_millis(5),
        seed: Some(cfg.seed),
        ..Faults::default()
    };
    let carrier = Faults {
        slow_rate: 0.3,
        slow_latency: Duration::from_millis(1200),
        ..fast.clone()
    };
    let world = CaseWorld::start(
        settings(vec![("stock", fast), ("carrier", carrier)]),
        plan(cfg.seed),
        &files(),
    )
    .await?;
    let http = reqwest::Client::new();
    let mut report = GroupDeadlinesReport::default();
    let mut ids = vec![];
    let pause = json!({"reason": "chaos: carrier down"});
    let status = world.operator("/services/carrier/pause", &pause).await;
    anyhow::ensure!(status == 200, "pause answered {status}");
    for k in 0..cfg.tasks {
        if k == cfg.tasks / 2 {
            // Every task so far has passed its deadline with its booking deferred.
            tokio::time::sleep(Duration::from_millis(1500)).await;
            let status = world.operator("/services/carrier/resume", &json!({})).await;
            anyhow::ensure!(status == 200, "resume answered {status}");
        }
        let url = format!("{}/workflows/split-order/tasks", world.base);
        // A crash after the submission's write answers 5xx: the same key gets the same task.
        let mut answer = None;
        for _ in 0..10 {
            let sent = http
                .post(&url)
                .header("idempotency-key", format!("order-{k}"))
                .json(&json!({}))
                .send()
                .await;
            if let Ok(r) = sent
                && r.status().as_u16() == 202
            {
                answer = r.json::<serde_json::Value>().await.ok();
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        match answer.and_then(|a| a["taskId"].as_str().and_then(|s| s.parse().ok())) {
            Some(id) => ids.push(id),
            None => report
                .violations
                .push(format!("order {k} was not accepted")),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut operator = Operator::default();
    let deadline = Instant::now() + cfg.patience;
    loop {
        let mut all_ended = true;
        for id in &ids {
            let Ok(Some(r)) = world.system.store.get_state(*id).await else {
                all_ended = false;
                continue;
            };
            if !r.process_state.is_final() {
                all_ended = false;
            }
            if r.process_state == ProcessState::Error {
                operator.act(&world, &r, cfg.seed).await;
            }
        }
        if all_ended || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let policies = match world.system.definitions.latest("split-order").await? {
        Some(w) => w.policies(),
        None => anyhow::bail!("the workflow is not published"),
    };
    let mut records: BTreeMap<TaskId, StateRecord> = BTreeMap::new();
    for id in &ids {
        if let Some(r) = world.system.store.get_state(*id).await? {
            records.insert(*id, r);
        }
    }
    world.shut_down().await;

    report.tasks = ids.len();
    report.skips = operator.count("skip");
    report.retries = operator.count("retry");
    report.resolves = operator.count("resolve");
    for id in &ids {
        let Some(r) = records.get(id) else {
            report.violations.push(format!("task {id} is lost"));
            continue;
        };
        *report
            .states
            .entry(r.process_state.as_str().to_owned())
            .or_default() += 1;
        if !r.process_state.is_final() {
            report
                .violations
                .push(format!("task {id} did not end: {}", r.process_state));
        }
        if let Err(e) = r.check(&policies) {
            report
                .violations
                .push(format!("task {id}: invalid record: {e}"));
        }
        if r.history
            .iter()
            .any(|h| h.reason.contains("deadline passed"))
            || operator.timed_out.contains(id)
        {
            report.timed_out += 1;
        }
    }
    for (id, i, result) in &operator.done {
        let Some(r) = records.get(id) else {
            continue;
        };
        let step = &r.steps[*i];
        if step.status != StepStatus::Done || &step.result != result {
            report.violations.push(format!(
                "task {id}: step {} was done (result {result:?}) when the operator acted, and is now {} (result {:?})",
                step.name, step.status, step.result
            ));
        }
    }
    Ok(report)
}

/// The operator: each task waiting in `Error` is skipped (its failed step given a result by
/// hand) or retried, at random; after three actions (or six tries: the API may refuse one) it
/// is resolved. What was done when they acted is kept, to check nothing rewrote it.
#[derive(Default)]
struct Operator {
    acted: BTreeMap<TaskId, u32>,
    tries: BTreeMap<TaskId, u32>,
    counts: BTreeMap<&'static str, usize>,
    done: Vec<Done>,
    timed_out: std::collections::HashSet<TaskId>,
}

impl Operator {
    async fn act(&mut self, world: &CaseWorld, r: &StateRecord, seed: u64) {
        let n = self.acted.get(&r.task_id).copied().unwrap_or(0);
        // Every try counts for the draw: an action the API refuses for this record (a skip
        // with no failed step to skip, say) is followed by another draw, not the same one
        // forever; after six tries, the task is resolved.
        let tries = self.tries.entry(r.task_id).or_default();
        *tries += 1;
        let tries = *tries;
        if r.last_error
            .as_deref()
            .is_some_and(|e| e.starts_with("task_timeout"))
        {
            self.timed_out.insert(r.task_id);
        }
        let action = if n >= 3 || tries > 6 {
            "resolve"
        } else if seeded_unit(seed, &["skip", &r.task_id.to_string()], tries.into()) < 0.5 {
            "skip"
        } else {
            "retry"
        };
        let body = match action {
            "skip" => json!({"reason": "chaos: done by hand", "result": {"byHand": n}}),
            _ => json!({"reason": format!("chaos: {action}")}),
        };
        let status = world
            .operator(&format!("/tasks/{}/{action}", r.task_id), &body)
            .await;
        if status == 202 {
            *self.acted.entry(r.task_id).or_default() += 1;
            *self.counts.entry(action).or_default() += 1;
            if action != "resolve" {
                self.done.extend(
                    r.steps
                        .iter()
                        .enumerate()
                        .filter(|(_, s)| s.status == StepStatus::Done)
                        .map(|(i, s)| (r.task_id, i, s.result.clone())),
                );
            }
        }
    }

    fn count(&self, action: &str) -> usize {
        self.counts.get(action).copied().unwrap_or(0)
    }
}
