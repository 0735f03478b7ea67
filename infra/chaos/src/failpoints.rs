//! Failpoints around the ports: after a write succeeds, the wrapper may report a failure
//! instead, which is what the handler sees when its process dies right after that write (its
//! message is not acknowledged, its remaining effects never happen). Every write the code makes
//! goes through here under a name (`create`, `put:<transition>`, `lease`, `send:<queue>`,
//! `publish:<detail-type>`): the named crash points. The queue wrapper also duplicates, delays
//! (so reorders) and drops (deadline timers only) messages.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sas::aws::provision::Resources;
use sas::domain::{BreakerRecord, Condition, Guard, ProcessState, StateRecord, Task, TaskId};
use sas::ports::{
    CreateOutcome, Cursor, EventBus, IdempotencyRecord, Page, PublishError, Queue, QueueError,
    ReceivedMessage, StateStore, StoreError,
};
use sas::remote::seeded_unit;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What to inject, all decided from `seed`.
#[derive(Debug, Clone)]
pub struct Plan {
    pub seed: u64,
    /// Share of writes after which the writer "dies".
    pub crash_rate: f64,
    /// The first this-many occurrences of every crash point crash, so every point the run
    /// reaches is exercised at least once.
    pub crash_first: u64,
    /// Share of sent messages delivered twice.
    pub duplicate_rate: f64,
    /// Share of sent messages held back by up to `max_extra_delay` (reordering them).
    pub delay_rate: f64,
    pub max_extra_delay: Duration,
    /// Share of deadline timers lost.
    pub lose_timer_rate: f64,
}

impl Plan {
    pub fn new(seed: u64) -> Self {
        Self {
            seed,
            crash_rate: 0.02,
            crash_first: 2,
            duplicate_rate: 0.03,
            delay_rate: 0.05,
            max_extra_delay: Duration::from_millis(300),
            lose_timer_rate: 0.1,
        }
    }
}

/// Counts of every crash point: how often it was reached, and how often it crashed.
#[derive(Debug, Default)]
pub struct Recorder {
    points: Mutex<BTreeMap<String, (u64, u64)>>,
    /// Events the bus accepted: (detail-type, task id).
    published: Mutex<Vec<(String, String)>>,
    sent: AtomicU64,
    duplicated: AtomicU64,
    delayed: AtomicU64,
    timers_lost: AtomicU64,
}

impl Recorder {
    pub fn points(&self) -> BTreeMap<String, (u64, u64)> {
        self.points.lock().map(|p| p.clone()).unwrap_or_default()
    }

    /// Tasks with an event of `detail_type` on the bus (`TaskFailed`: the operator alerts).
    pub fn published(&self, detail_type: &str) -> BTreeSet<String> {
        self.published
            .lock()
            .map(|p| {
                p.iter()
                    .filter(|(t, _)| t == detail_type)
                    .map(|(_, id)| id.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Tasks with a `TaskFailed` event on the bus (the operator alerts).
    pub fn alerted(&self) -> BTreeSet<String> {
        self.published("TaskFailed")
    }

    pub fn messaging(&self) -> (u64, u64, u64, u64) {
        (
            self.sent.load(Ordering::Relaxed),
            self.duplicated.load(Ordering::Relaxed),
            self.delayed.load(Ordering::Relaxed),
            self.timers_lost.load(Ordering::Relaxed),
        )
    }
}

/// The failpoint decisions, shared by the wrappers.
#[derive(Debug)]
pub struct Chaos {
    pub plan: Plan,
    pub recorder: Arc<Recorder>,
}

impl Chaos {
    pub fn new(plan: Plan) -> Arc<Self> {
        Arc::new(Self {
            plan,
            recorder: Arc::default(),
        })
    }

    /// Records that `point` was reached for `subject`; whether the writer dies now.
    fn crash(&self, point: &str, subject: &str) -> bool {
        let Ok(mut points) = self.recorder.points.lock() else {
            return false;
        };
        let entry = points.entry(point.to_owned()).or_default();
        entry.0 += 1;
        let die = entry.0 <= self.plan.crash_first
            || seeded_unit(self.plan.seed, &["crash", point, subject], entry.0)
                < self.plan.crash_rate;
        if die {
            entry.1 += 1;
        }
        die
    }

    fn roll(&self, what: &str, subject: &str, n: u64, rate: f64) -> bool {
        seeded_unit(self.plan.seed, &[what, subject], n) < rate
    }
}

fn crashed(point: &str) -> String {
    format!("chaos: the writer died right after {point}")
}

/// The transition a state-record write makes, as a crash point name.
fn put_point(record: &StateRecord, condition: &Condition) -> String {
    let clears_outbox = record.outbox.is_empty()
        && matches!(condition, Condition::Matches { guards, .. } if guards.contains(&Guard::NoticePending));
    if clears_outbox {
        return "put:outbox cleared".into();
    }
    let reason = record.history.last().map_or("", |h| h.reason.as_str());
    let head = reason.split(':').next().unwrap_or(reason);
    let name: String = head
        .chars()
        .map(|c| if c.is_ascii_digit() { '#' } else { c })
        .collect();
    format!("put:{}", name.trim())
}

/// The state store with failpoints after every write.
pub struct ChaosStore {
    pub inner: Arc<dyn StateStore>,
    pub chaos: Arc<Chaos>,
}

#[async_trait]
impl StateStore for ChaosStore {
    async fn create(
        &self,
        task: &Task,
        record: &StateRecord,
        key: Option<&IdempotencyRecord>,
    ) -> Result<CreateOutcome, StoreError> {
        let out = self.inner.create(task, record, key).await?;
        if out == CreateOutcome::Created && self.chaos.crash("create", &task.id.to_string()) {
            return Err(StoreError::Unavailable(crashed("create")));
        }
        Ok(out)
    }
    async fn get(&self, id: TaskId) -> Result<Option<(Task, StateRecord)>, StoreError> {
        self.inner.get(id).await
    }
    async fn get_state(&self, id: TaskId) -> Result<Option<StateRecord>, StoreError> {
        self.inner.get_state(id).await
    }
    async fn put(&self, record: &StateRecord, condition: &Condition) -> Result<(), StoreError> {
        self.inner.put(record, condition).await?;
        let point = put_point(record, condition);
        if self.chaos.crash(&point, &record.task_id.to_string()) {
            return Err(StoreError::Unavailable(crashed(&point)));
        }
        Ok(())
    }
    async fn due(
        &self,
        shard: u32,
        now: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<TaskId>, StoreError> {
        self.inner.due(shard, now, limit).await
    }
    fn due_shards(&self) -> u32 {
        self.inner.due_shards()
    }
    async fn acquire_lease(
        &self,
        name: &str,
        owner: &str,
        now: DateTime<Utc>,
        ttl: chrono::Duration,
    ) -> Result<bool, StoreError> {
        let got = self.inner.acquire_lease(name, owner, now, ttl).await?;
        if got && self.chaos.crash("lease", owner) {
            return Err(StoreError::Unavailable(crashed("lease")));
        }
        Ok(got)
    }
    async fn release_lease(&self, name: &str, owner: &str) -> Result<(), StoreError> {
        self.inner.release_lease(name, owner).await
    }
    async fn get_breaker(&self, name: &str) -> Result<Option<BreakerRecord>, StoreError> {
        self.inner.get_breaker(name).await
    }
    async fn put_breaker(&self, record: &BreakerRecord) -> Result<bool, StoreError> {
        self.inner.put_breaker(record).await
    }
    async fn list(
        &self,
        state: ProcessState,
        workflow: Option<&str>,
        limit: usize,
        after: Option<&Cursor>,
    ) -> Result<Page, StoreError> {
        self.inner.list(state, workflow, limit, after).await
    }
    async fn put_with_input(
        &self,
        record: &StateRecord,
        condition: &sas::domain::Condition,
        input: &serde_json::Value,
    ) -> Result<(), StoreError> {
        self.inner.put_with_input(record, condition, input).await
    }
    async fn count(
        &self,
        state: ProcessState,
        workflow: Option<&str>,
        cap: u64,
    ) -> Result<sas::ports::Count, StoreError> {
        self.inner.count(state, workflow, cap).await
    }
    async fn expire_task(&self, record: &StateRecord) -> Result<(), StoreError> {
        self.inner.expire_task(record).await
    }
    async fn admit(
        &self,
        key: &str,
        limit: &sas::domain::rate::RateLimit,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<sas::domain::rate::Admission, StoreError> {
        self.inner.admit(key, limit, now).await
    }
    async fn list_by_caller(
        &self,
        caller: &sas::Caller,
        limit: usize,
        after: Option<&Cursor>,
    ) -> Result<Page, StoreError> {
        self.inner.list_by_caller(caller, limit, after).await
    }
}

/// The queues with failpoints after every send, and messaging faults.
pub struct ChaosQueue {
    pub inner: Arc<dyn Queue>,
    pub chaos: Arc<Chaos>,
    /// Queue URL → role (`work`, `replies`, `timers`, `agent`, `dlq`).
    pub roles: BTreeMap<String, &'static str>,
    counter: AtomicU64,
}

impl ChaosQueue {
    pub fn new(inner: Arc<dyn Queue>, chaos: Arc<Chaos>, resources: &Resources) -> Self {
        Self {
            inner,
            chaos,
            roles: resources.queue_roles(),
            counter: AtomicU64::new(0),
        }
    }
}

fn task_of(body: &str) -> String {
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["taskId"].as_str().map(str::to_owned))
        .unwrap_or_default()
}

#[async_trait]
impl Queue for ChaosQueue {
    async fn send(&self, queue_url: &str, body: &str, delay: Duration) -> Result<(), QueueError> {
        let role = self.roles.get(queue_url).copied().unwrap_or("client");
        let task = task_of(body);
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let r = &self.chaos.recorder;
        r.sent.fetch_add(1, Ordering::Relaxed);
        let p = &self.chaos.plan;
        if role == "timers" && self.chaos.roll("lose-timer", &task, n, p.lose_timer_rate) {
            r.timers_lost.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        let mut delay = delay;
        if self.chaos.roll("delay", &task, n, p.delay_rate) {
            r.delayed.fetch_add(1, Ordering::Relaxed);
            delay += p
                .max_extra_delay
                .mul_f64(seeded_unit(p.seed, &["delay-by", &task], n));
        }
        self.inner.send(queue_url, body, delay).await?;
        if self.chaos.roll("duplicate", &task, n, p.duplicate_rate) {
            r.duplicated.fetch_add(1, Ordering::Relaxed);
            self.inner.send(queue_url, body, delay).await?;
        }
        let point = format!("send:{role}");
        if self.chaos.crash(&point, &task) {
            return Err(QueueError(crashed(&point)));
        }
        Ok(())
    }
    async fn receive(
        &self,
        queue_url: &str,
        max: u32,
        wait: Duration,
    ) -> Result<Vec<ReceivedMessage>, QueueError> {
        self.inner.receive(queue_url, max, wait).await
    }
    async fn delete(&self, queue_url: &str, receipt_handle: &str) -> Result<(), QueueError> {
        self.inner.delete(queue_url, receipt_handle).await
    }
}

/// The event bus with failpoints after every publish; it records what the bus accepted.
pub struct ChaosBus {
    pub inner: Arc<dyn EventBus>,
    pub chaos: Arc<Chaos>,
}

#[async_trait]
impl EventBus for ChaosBus {
    async fn publish(
        &self,
        detail_type: &str,
        detail: &serde_json::Value,
    ) -> Result<(), PublishError> {
        self.inner.publish(detail_type, detail).await?;
        let task = detail["taskId"].as_str().unwrap_or_default().to_owned();
        if let Ok(mut p) = self.chaos.recorder.published.lock() {
            p.push((detail_type.to_owned(), task.clone()));
        }
        let point = format!("publish:{detail_type}");
        if self.chaos.crash(&point, &task) {
            return Err(PublishError(crashed(&point)));
        }
        Ok(())
    }
}
