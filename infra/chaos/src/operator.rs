//! The operator of a chaos run: a person at the operator API while everything else runs. They
//! look at the tasks waiting for a person (the `Error` and `CompensationFailed` lists, read
//! through the state index like the console does) and act on some of them (retry, retry on a
//! new input, skip, resolve, compensate, compensate from the first step), and cancel some
//! tasks while they run. Every action goes through the real operator routes over HTTP; what
//! was applied is logged, so the run's checks can tell a failure settled by hand from one lost.

use sas::ports::StateStore;
use sas::remote::seeded_unit;
use sas::{ProcessState, StateRecord, StepStatus, TaskId};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How much the operator does.
#[derive(Debug, Clone, PartialEq)]
pub struct OperatorPlan {
    /// Chance that a task the operator finds waiting is acted on, at each look.
    pub act_rate: f64,
    /// Share of tasks cancelled while they run (a random moment within `cancel_within`).
    pub cancel_rate: f64,
    pub cancel_within: Duration,
    /// How often the operator looks at the lists.
    pub every: Duration,
    /// The most actions the operator applies to one task.
    pub per_task: usize,
}

impl Default for OperatorPlan {
    fn default() -> Self {
        Self {
            act_rate: 0.5,
            cancel_rate: 0.02,
            cancel_within: Duration::from_secs(3),
            every: Duration::from_millis(300),
            per_task: 3,
        }
    }
}

/// An action the operator API applied (answered 202, or, after a 5xx, found in the record's
/// history by its reason), with the record as the operator read it just before.
#[derive(Debug, Clone, PartialEq)]
pub struct Applied {
    pub action: &'static str,
    pub from: ProcessState,
    pub step: usize,
    pub step_status: StepStatus,
}

/// What the operator did.
#[derive(Debug, Default)]
pub struct OperatorLog {
    /// Task → the actions applied to it, in order.
    pub applied: Mutex<HashMap<TaskId, Vec<Applied>>>,
    /// Actions asked for, and those the API refused (409: the task was not in a state for it,
    /// or moved on meanwhile).
    pub asked: AtomicU64,
    pub refused: AtomicU64,
    /// Actions the API answered 5xx (a crash or a throttled write): read back, then retried.
    pub unavailable: AtomicU64,
}

impl OperatorLog {
    pub fn applied(&self) -> HashMap<TaskId, Vec<Applied>> {
        self.applied.lock().map(|a| a.clone()).unwrap_or_default()
    }

    fn count(&self, id: TaskId) -> usize {
        self.applied
            .lock()
            .map(|a| a.get(&id).map_or(0, Vec::len))
            .unwrap_or(0)
    }

    /// Applied actions per action name.
    pub fn by_action(&self) -> std::collections::BTreeMap<&'static str, usize> {
        let mut out = std::collections::BTreeMap::new();
        for actions in self.applied().values() {
            for a in actions {
                *out.entry(a.action).or_default() += 1;
            }
        }
        out
    }
}

/// The operator at `base` (the system's HTTP address).
pub struct Operator {
    pub http: reqwest::Client,
    pub base: String,
    pub store: Arc<dyn StateStore>,
    pub plan: OperatorPlan,
    pub seed: u64,
    pub log: Arc<OperatorLog>,
    /// Task → the index it was submitted as (its input for a retry on a new input).
    pub inputs: Mutex<HashMap<TaskId, usize>>,
    /// Task → the input its retry on a new input gives (else one from its index).
    pub new_inputs: Mutex<HashMap<TaskId, Value>>,
    /// Cancels scheduled and not yet asked for.
    pub pending: std::sync::atomic::AtomicUsize,
    calls: AtomicU64,
}

impl Operator {
    pub fn new(base: String, store: Arc<dyn StateStore>, plan: OperatorPlan, seed: u64) -> Self {
        Self {
            http: reqwest::Client::new(),
            base,
            store,
            plan,
            seed,
            log: Arc::default(),
            inputs: Mutex::default(),
            new_inputs: Mutex::default(),
            pending: std::sync::atomic::AtomicUsize::new(0),
            calls: AtomicU64::new(0),
        }
    }

    fn roll(&self, what: &str, subject: &str) -> f64 {
        let n = self.calls.fetch_add(1, Ordering::Relaxed);
        seeded_unit(self.seed, &["operator", what, subject], n)
    }

    /// Whether task `id` (submitted as index `i`) is to be cancelled, and after how long.
    pub fn cancel_after(&self, id: TaskId, i: usize) -> Option<Duration> {
        if let Ok(mut inputs) = self.inputs.lock() {
            inputs.insert(id, i);
        }
        let subject = id.to_string();
        (self.roll("cancel", &subject) < self.plan.cancel_rate)
            .then(|| self.plan.cancel_within.mul_f64(self.roll("when", &subject)))
    }

    /// Looks at the lists of tasks waiting for a person until `stop`, acting on some.
    pub async fn watch(&self, stop: &AtomicBool) {
        while !stop.load(Ordering::Relaxed) {
            for state in [ProcessState::Error, ProcessState::CompensationFailed] {
                for id in self.waiting(state).await {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    if self.log.count(id) >= self.plan.per_task
                        || self.roll("act", &id.to_string()) >= self.plan.act_rate
                    {
                        continue;
                    }
                    let action = self.choose(state, &id.to_string());
                    self.act(id, action).await;
                }
            }
            tokio::time::sleep(self.plan.every).await;
        }
    }

    /// The tasks in `state`, as the operator API lists them (the state index: eventually
    /// consistent, so a task may show after it moved on; the action then answers 409).
    async fn waiting(&self, state: ProcessState) -> Vec<TaskId> {
        let url = format!("{}/operator/tasks?state={state}&limit=100", self.base);
        let Ok(resp) = self.http.get(url).send().await else {
            return vec![];
        };
        let Ok(v) = resp.json::<Value>().await else {
            return vec![];
        };
        v["tasks"]
            .as_array()
            .map(|tasks| {
                tasks
                    .iter()
                    .filter_map(|t| t["taskId"].as_str()?.parse().ok())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// An action for a task waiting in `state` (some the API refuses for some tasks: a
    /// compensation past the pivot, a retry on a new input of a step that may have taken
    /// effect; those are asked too, and must answer 409 and change nothing).
    fn choose(&self, state: ProcessState, subject: &str) -> &'static str {
        let r = self.roll("choose", subject);
        match state {
            ProcessState::Error => match r {
                r if r < 0.35 => "retry",
                r if r < 0.55 => "skip",
                r if r < 0.70 => "resolve",
                r if r < 0.85 => "retry-with-input",
                r if r < 0.95 => "compensate",
                _ => "compensate-from",
            },
            _ => match r {
                r if r < 0.5 => "retry",
                r if r < 0.8 => "compensate",
                _ => "resolve",
            },
        }
    }

    /// Asks for `action` on task `id`, as a person would: a 5xx is read back (the write may
    /// have landed before the function died) and asked again.
    pub async fn act(&self, id: TaskId, action: &'static str) {
        let n = self.log.asked.fetch_add(1, Ordering::Relaxed);
        let token = format!("chaos operator #{n}");
        let Ok(Some(before)) = self.store.get_state(id).await else {
            return;
        };
        let body = self.body(action, &token, &before);
        let url = format!("{}/operator/tasks/{id}/{action}", self.base);
        for attempt in 0..10u64 {
            let status = match self.http.post(&url).json(&body).send().await {
                Ok(resp) => resp.status(),
                Err(_) => reqwest::StatusCode::SERVICE_UNAVAILABLE,
            };
            if status == reqwest::StatusCode::ACCEPTED {
                self.record(id, action, &before);
                return;
            }
            if status.is_client_error() {
                self.log.refused.fetch_add(1, Ordering::Relaxed);
                return;
            }
            self.log.unavailable.fetch_add(1, Ordering::Relaxed);
            // Did it land before the answer was lost? The reason is in the history if so.
            if let Ok(Some(now)) = self.store.get_state(id).await
                && now.history.iter().any(|h| h.reason.ends_with(&token))
            {
                self.record(id, action, &before);
                return;
            }
            tokio::time::sleep(Duration::from_millis(50 * (attempt + 1))).await;
        }
    }

    fn record(&self, id: TaskId, action: &'static str, before: &StateRecord) {
        let applied = Applied {
            action,
            from: before.process_state,
            step: before.step_index,
            step_status: before
                .steps
                .get(before.step_index)
                .map_or(StepStatus::Pending, |s| s.status),
        };
        if let Ok(mut log) = self.log.applied.lock() {
            log.entry(id).or_default().push(applied);
        }
    }

    fn body(&self, action: &str, token: &str, r: &StateRecord) -> Value {
        match action {
            "skip" => json!({"reason": token, "result": {"settledBy": "the chaos operator"}}),
            "retry-with-input" => {
                if let Some(input) = self
                    .new_inputs
                    .lock()
                    .ok()
                    .and_then(|m| m.get(&r.task_id).cloned())
                {
                    return json!({"reason": token, "input": input});
                }
                let i = self
                    .inputs
                    .lock()
                    .ok()
                    .and_then(|m| m.get(&r.task_id).copied())
                    .unwrap_or(0);
                // Another valid input of the same workflow (indexes of one parity share one).
                json!({"reason": token, "input": crate::harness::input(i + 2)})
            }
            "compensate-from" => json!({
                "reason": token,
                "fromStep": r.steps.first().map_or("", |s| s.name.as_str()),
            }),
            _ => json!({ "reason": token }),
        }
    }
}

/// The TaskFailed alerts a task's failures owe, given its final record and the operator's
/// applied actions on it: each action that took a task out of Error by retrying or skipping
/// its failed step, or by resolving it, settled one alerted failure; the final record shows
/// at most one more (`fails_now`: a step failed, not a refusal that compensated).
pub fn alerts_owed(fails_now: bool, r: &StateRecord, applied: &[Applied]) -> usize {
    let settled = applied
        .iter()
        .filter(|a| {
            a.from == ProcessState::Error
                && matches!(a.action, "retry" | "retry-with-input" | "skip" | "resolve")
        })
        .count();
    // A failure a late callback settled (the step failed waiting for it, then it came): the
    // task left Error by itself, with no operator's action.
    let revived = r
        .history
        .iter()
        .filter(|h| h.from == ProcessState::Error && h.to != ProcessState::Error && h.by.is_none())
        .count();
    // A task resolved from Error still shows the failed step the resolve settled.
    let resolved_from_error = r.process_state == ProcessState::Resolved
        && applied
            .last()
            .is_some_and(|a| a.action == "resolve" && a.from == ProcessState::Error);
    settled + revived + usize::from(fails_now && !resolved_from_error)
}
