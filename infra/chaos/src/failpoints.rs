//! Failpoints around the ports, an interceptor ([`Faults`]) over [`sas_local::intercept`]:
//! after a write succeeds, it may report a failure instead, which is what the handler sees when its process dies right after that write (its
//! message is not acknowledged, its remaining effects never happen). Every write the code makes
//! goes through here under a name (`create`, `put:<transition>`, `lease`, `send:<queue>`,
//! `publish:<detail-type>`): the named crash points. The queue wrapper also duplicates, delays
//! (so reorders) and drops (deadline timers only) messages.

use async_trait::async_trait;
use sas::domain::{Condition, StateRecord, TaskId};
use sas::ports::{CreateOutcome, Guarded, ReceivedMessage, StateStore};
use sas::remote::seeded_unit;
use sas_local::Ports;
use sas_local::intercept::{Call, Failure, Intercepted, Interceptor, Next, Reply, answer, nothing};
use sas_local::provision::Resources;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
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
    /// AWS's rough edges, each a switch (0 or `None`: off; [`Plan::every_switch`] turns them on):
    /// share of state-store writes whose response is lost after they were applied, so the
    /// SDK's retry of the same request answers (and fails its condition unless the store reads
    /// back).
    pub lost_response_rate: f64,
    /// Share of writes, sends and publishes refused with a throttling error before they happen.
    pub throttle_rate: f64,
    /// A slow, bursty work queue: it stalls for this long (a scheduler that is throttled or
    /// behind) once every four times this long, from 1 s into the run; every work message
    /// sent during a stall is delivered in a burst when it ends (spread over a second).
    pub slow_work_queue: Option<Duration>,
    /// Share of received batches that time out: the handler works on them, but its Lambda
    /// dies before the event source mapping deletes anything, so the whole batch comes back
    /// after the visibility timeout.
    pub batch_timeout_rate: f64,
    /// The event bus is down (every publish fails) for this long, from 2 s into the run and
    /// again every four times this long: notices stay owed while their tasks move on, and
    /// operators act on tasks whose alerts have not gone out.
    pub bus_outage: Option<Duration>,
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
            lost_response_rate: 0.0,
            throttle_rate: 0.0,
            slow_work_queue: None,
            batch_timeout_rate: 0.0,
            bus_outage: None,
        }
    }

    /// Turns every rough edge of AWS on; `pickup` is the run's pickup timeout. The work queue
    /// stalls for 3 times it: a backlog that re-enqueues at a fixed period answer with 3
    /// messages per waiting task, and growing delays with 2. (`sas-chaos --stall-pickups N`
    /// makes it longer.)
    pub fn every_switch(&mut self, pickup: Duration) {
        self.lost_response_rate = 0.02;
        self.throttle_rate = 0.01;
        self.slow_work_queue = Some(pickup * 3);
        self.batch_timeout_rate = 0.02;
        self.bus_outage = Some(Duration::from_secs(2));
    }

    /// Whether the bus is down `since` the run started.
    pub fn bus_down(&self, since: Duration) -> bool {
        let Some(outage) = self.bus_outage.filter(|o| !o.is_zero()) else {
            return false;
        };
        let Some(into) = since.checked_sub(BUS_OUTAGE_FROM) else {
            return false;
        };
        into.as_nanos() % (outage * 4).as_nanos() < outage.as_nanos()
    }
}

/// Counts of every crash point: how often it was reached, and how often it crashed.
#[derive(Debug, Default)]
pub struct Recorder {
    points: Mutex<BTreeMap<String, (u64, u64)>>,
    /// Events the bus accepted: (detail-type, task id, notice id).
    published: Mutex<Vec<(String, String, String)>>,
    /// Notice ids the records owed (from every applied write's outbox): task id → ids.
    owed: Mutex<BTreeMap<String, BTreeSet<String>>>,
    /// Task id → the (attempt, count) of every re-enqueue after a missed pickup deadline.
    requeues: Mutex<BTreeMap<String, BTreeSet<(u64, u32)>>>,
    /// forEach elements never sent yet re-enqueued after a missed pickup deadline (an element
    /// waiting for room has none): `{task} {step}#{k}`.
    pub waiting_requeued: Mutex<BTreeSet<String>>,
    /// Writes that were applied but reported to the writer as a lost race (after a lost
    /// response): each one is a violation.
    pub misreported: Mutex<Vec<String>>,
    /// Messages over SQS's size limit and records over DynamoDB's, refused as AWS would: each
    /// one is a violation (a service's answer reached them uncapped).
    pub too_large: Mutex<Vec<String>>,
    /// Task id → (version, settled) of its newest applied write: settled is terminal with no
    /// notice owed. How the run sees progress without reading the store.
    latest: Mutex<HashMap<TaskId, (u64, bool)>>,
    sent: AtomicU64,
    duplicated: AtomicU64,
    delayed: AtomicU64,
    timers_lost: AtomicU64,
    /// Rough edges injected: lost responses, throttles, slowed work messages, timed-out
    /// batches.
    pub lost_responses: AtomicU64,
    pub throttled: AtomicU64,
    pub slowed: AtomicU64,
    pub batches_timed_out: AtomicU64,
    /// Publishes refused while the bus was down.
    pub bus_refused: AtomicU64,
    /// Applied writes whose SDK retry came after another writer had moved the record on
    /// (reported to their writer as lost races: inherent, see `Chaos::retried`).
    pub overtaken: AtomicU64,
    /// The tasks those writes were of: a writer that reads such a task again may meet its own
    /// write as another's (an event's delivery then answers `duplicate`, having taken it).
    pub overtaken_tasks: Mutex<HashSet<TaskId>>,
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
                    .filter(|(t, _, _)| t == detail_type)
                    .map(|(_, id, _)| id.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The distinct notices of `detail_type` on the bus, per task: task id → (notice id →
    /// deliveries). At least once means a notice may be delivered twice; a task failing once
    /// must still have one notice id.
    pub fn notices(&self, detail_type: &str) -> BTreeMap<String, BTreeMap<String, u32>> {
        let mut out: BTreeMap<String, BTreeMap<String, u32>> = BTreeMap::new();
        if let Ok(p) = self.published.lock() {
            for (t, task, id) in p.iter().filter(|(t, _, _)| t == detail_type) {
                let _ = t;
                *out.entry(task.clone())
                    .or_default()
                    .entry(id.clone())
                    .or_default() += 1;
            }
        }
        out
    }

    /// The notice ids of `status` the records owed, per task.
    pub fn owed(&self, status: &str) -> BTreeMap<String, BTreeSet<String>> {
        let suffix = format!(":{status}");
        self.owed
            .lock()
            .map(|o| {
                o.iter()
                    .map(|(task, ids)| {
                        let ids: BTreeSet<String> = ids
                            .iter()
                            .filter(|i| i.ends_with(&suffix))
                            .cloned()
                            .collect();
                        (task.clone(), ids)
                    })
                    .filter(|(_, ids)| !ids.is_empty())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Task id → (re-enqueues after a missed pickup deadline, the longest run of them
    /// between two claims).
    pub fn requeues(&self) -> BTreeMap<String, (usize, u32)> {
        self.requeues
            .lock()
            .map(|r| {
                r.iter()
                    .map(|(t, set)| {
                        let longest = set.iter().map(|(_, n)| *n).max().unwrap_or(0);
                        (t.clone(), (set.len(), longest))
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// How many tasks are settled (terminal, no notice owed) by their newest applied write.
    pub fn settled(&self) -> usize {
        self.latest
            .lock()
            .map(|l| l.values().filter(|(_, settled)| *settled).count())
            .unwrap_or(0)
    }

    /// Notes what an applied write of `record` owes and whether it re-enqueued the task.
    fn applied(&self, record: &StateRecord) {
        if let Ok(mut latest) = self.latest.lock() {
            let settled = record.process_state.is_terminal() && !record.notice_pending();
            let entry = latest.entry(record.task_id).or_insert((0, false));
            if record.version >= entry.0 {
                *entry = (record.version, settled);
            }
        }
        let task = record.task_id.to_string();
        if let Ok(mut owed) = self.owed.lock() {
            let ids = owed.entry(task.clone()).or_default();
            for o in &record.outbox {
                ids.insert(format!("{task}:{}:{}", o.sequence, o.status.as_str()));
            }
        }
        if let Some(f) = &record.fanout {
            for (b, br) in f.branches.iter().enumerate() {
                let Some((e, k)) = f.each_of(b) else {
                    continue;
                };
                let step = &record.steps[e.step];
                let unsent = step.elements.get(k).is_some_and(|el| !el.sent);
                if br.requeues > 0
                    && unsent
                    && let Ok(mut w) = self.waiting_requeued.lock()
                {
                    w.insert(format!("{task} {}#{k}", step.name));
                }
            }
        }
        if record.requeues > 0
            && let Ok(mut r) = self.requeues.lock()
        {
            // Each re-enqueue writes a new (attempt, count): a claim bumps the attempt and
            // resets the count. Other writes (and retries) repeat a pair already seen.
            r.entry(task)
                .or_default()
                .insert((record.attempt, record.requeues));
        }
    }

    /// (lost responses, throttles, slowed work messages, timed-out batches) injected.
    pub fn edges(&self) -> (u64, u64, u64, u64) {
        (
            self.lost_responses.load(Ordering::Relaxed),
            self.throttled.load(Ordering::Relaxed),
            self.slowed.load(Ordering::Relaxed),
            self.batches_timed_out.load(Ordering::Relaxed),
        )
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
    calls: AtomicU64,
    /// When the run started (the bus outages are timed from it).
    started: std::time::Instant,
}

/// When the first bus outage starts.
pub const BUS_OUTAGE_FROM: Duration = Duration::from_secs(2);

impl Chaos {
    pub fn new(plan: Plan) -> Arc<Self> {
        Arc::new(Self {
            plan,
            recorder: Arc::default(),
            calls: AtomicU64::new(0),
            started: std::time::Instant::now(),
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

    /// Whether this call is refused with a throttling error (before it happens).
    fn throttle(&self, what: &str, subject: &str) -> bool {
        self.strike(Strike::Throttle, what, subject)
    }

    /// Whether the response of this applied write is lost (the SDK then retries it).
    fn lose_response(&self, what: &str, subject: &str) -> bool {
        self.strike(Strike::LoseResponse, what, subject)
    }

    /// Whether `fault` strikes this call (one more call counted either way), at its rate in
    /// the plan; a strike is counted in the recorder.
    fn strike(&self, fault: Strike, what: &str, subject: &str) -> bool {
        let (name, rate, struck) = match fault {
            Strike::Throttle => (
                "throttle",
                self.plan.throttle_rate,
                &self.recorder.throttled,
            ),
            Strike::LoseResponse => (
                "lose",
                self.plan.lost_response_rate,
                &self.recorder.lost_responses,
            ),
        };
        let n = self.calls.fetch_add(1, Ordering::Relaxed);
        let hit = rate > 0.0 && self.roll(&format!("{name} {what}"), subject, n, rate);
        if hit {
            struck.fetch_add(1, Ordering::Relaxed);
        }
        hit
    }

    /// The SDK's retry of an applied write of `record` answered `result`; `now` is the record
    /// as stored after it. A conflict while the record still is what the write made is an
    /// applied write reported as a lost race (the read-back must see it). A conflict after
    /// another writer moved the record on is the ambiguity no read-back resolves (the writer
    /// cannot tell its write from a rival's at that version): it is counted, not a violation,
    /// and is safe because every writer treats a lost race by reading again.
    fn retried<T, E: Failure>(
        &self,
        what: &str,
        record: &StateRecord,
        result: &Result<T, E>,
        now: Option<&StateRecord>,
    ) {
        if !result
            .as_ref()
            .err()
            .is_some_and(Failure::is_condition_failed)
        {
            return;
        }
        if now == Some(record) {
            if let Ok(mut m) = self.recorder.misreported.lock() {
                m.push(format!("{what} of {}", record.task_id));
            }
        } else {
            self.recorder.overtaken.fetch_add(1, Ordering::Relaxed);
            if let Ok(mut tasks) = self.recorder.overtaken_tasks.lock() {
                tasks.insert(record.task_id);
            }
        }
    }
}

fn throttled(what: &str) -> String {
    format!("chaos: ThrottlingException on {what} (nothing happened)")
}

fn crashed(point: &str) -> String {
    format!("chaos: the writer died right after {point}")
}

/// The transition a state-record write makes, as a crash point name.
fn put_point(record: &StateRecord, condition: &Condition) -> String {
    format!("put:{}", sas::domain::write_label(record, condition))
}

/// SQS's largest message body, in bytes.
pub const SQS_MAX_MESSAGE: usize = 256 * 1024;
/// DynamoDB's largest item, in bytes (a record's JSON stands in for its item).
pub const DYNAMODB_MAX_ITEM: usize = 400 * 1024;

impl Recorder {
    /// Whether `bytes` is over `limit`; if so, records `what` as a violation.
    fn over(&self, what: impl FnOnce() -> String, bytes: usize, limit: usize) -> bool {
        if bytes <= limit {
            return false;
        }
        if let Ok(mut v) = self.too_large.lock() {
            v.push(format!("{} ({bytes} bytes, at most {limit})", what()));
        }
        true
    }

    /// Refuses, as DynamoDB would, a record over its item limit.
    fn check_record<E: Failure>(&self, record: &StateRecord) -> Result<(), E> {
        let bytes = serde_json::to_vec(record).map_or(0, |j| j.len());
        if self.over(
            || format!("record of {}", record.task_id),
            bytes,
            DYNAMODB_MAX_ITEM,
        ) {
            return Err(E::rejected(format!(
                "ValidationException: item size {bytes} has exceeded the maximum allowed size"
            )));
        }
        Ok(())
    }
}

/// The failpoints: an [`Interceptor`] that wraps the store, the queues and the bus (see
/// [`wrap`]) and decides, from the plan's seed, what each call meets.
pub struct Faults {
    pub chaos: Arc<Chaos>,
    /// The store, unwrapped: read back after an SDK retry met a conflict.
    store: Arc<dyn StateStore>,
    /// Queue URL → role (`work`, `replies`, `timers`, `agent`, `dlq`).
    pub roles: BTreeMap<String, &'static str>,
    counter: AtomicU64,
    /// Receipt handles of batches that timed out: their deletes never happen.
    timed_out: Mutex<BTreeSet<String>>,
    /// When the run started (the slow work queue's stalls are timed from it).
    started: std::time::Instant,
}

/// When a slow work queue first stalls, into the run.
pub const STALL_FROM: Duration = Duration::from_secs(1);

/// Wraps `ports` with the failpoints of `chaos`. The catalog is passed through: it is written
/// once, before the run, and only read after.
pub fn wrap(ports: Ports, chaos: &Arc<Chaos>) -> Ports {
    let faults = Arc::new(Faults::new(
        chaos.clone(),
        ports.store.clone(),
        &ports.resources,
    ));
    Ports {
        store: Arc::new(Intercepted::new(ports.store, faults.clone())),
        catalog: ports.catalog,
        queue: Arc::new(Intercepted::new(ports.queue, faults.clone())),
        events: Arc::new(Intercepted::new(ports.events, faults)),
        // Passed through: the failpoints do not reach the payloads yet.
        payloads: ports.payloads,
        resources: ports.resources,
        memory: ports.memory,
    }
}

impl Faults {
    pub fn new(chaos: Arc<Chaos>, store: Arc<dyn StateStore>, resources: &Resources) -> Self {
        Self {
            chaos,
            store,
            roles: resources.queue_roles(),
            counter: AtomicU64::new(0),
            timed_out: Mutex::default(),
            started: std::time::Instant::now(),
        }
    }

    /// Judges the SDK's retry of an applied write of `record` (see [`Chaos::retried`]),
    /// reading the stored record only when the retry met a conflict.
    async fn after_retry<T, E: Failure>(
        &self,
        what: &str,
        record: &StateRecord,
        again: &Result<T, E>,
    ) {
        let now = match again {
            Err(e) if e.is_condition_failed() => {
                self.store.get_state(record.task_id).await.ok().flatten()
            }
            _ => None,
        };
        self.chaos.retried(what, record, again, now.as_ref());
    }

    /// A write of a state record (`create`, `put`, `put_with_input`): refused as DynamoDB
    /// would if too large (not a new input's), throttled, applied; its response maybe lost (the
    /// SDK retries it); then the writer maybe dies (not after a new input).
    async fn write<'a, R: Reply, E: Failure>(
        &self,
        call: Call<'a>,
        next: &Next<'a, R, E>,
    ) -> Result<R, E> {
        let (what, subject, record, check, point) = match call {
            Call::Create(new) => (
                "create",
                new.task.id,
                new.record,
                true,
                Some("create".to_owned()),
            ),
            Call::PutAs {
                put: Guarded { record, condition },
                ..
            } => {
                let point = put_point(record, condition);
                ("put", record.task_id, record, true, Some(point))
            }
            Call::PutWithInput {
                put: Guarded { record, .. },
                ..
            } => ("put_with_input", record.task_id, record, false, None),
            _ => return next.run(call).await,
        };
        let subject = subject.to_string();
        if check {
            self.chaos.recorder.check_record::<E>(record)?;
        }
        if self.chaos.throttle(what, &subject) {
            return Err(E::unavailable(throttled(what)));
        }
        let mut out = next.run(call).await?;
        // A create that found its key taken wrote nothing.
        let applied = answer::<CreateOutcome, _>(&out).is_none_or(|o| *o == CreateOutcome::Created);
        if !applied {
            return Ok(out);
        }
        self.chaos.recorder.applied(record);
        if self.chaos.lose_response(what, &subject) {
            // The SDK's retry: the same request again.
            let again = next.run(call).await;
            self.after_retry(what, record, &again).await;
            out = again?;
        }
        let applied = answer::<CreateOutcome, _>(&out).is_none_or(|o| *o == CreateOutcome::Created);
        if let Some(point) = point.filter(|_| applied)
            && self.chaos.crash(&point, &subject)
        {
            return Err(E::unavailable(crashed(&point)));
        }
        Ok(out)
    }

    async fn send<'a, R: Reply, E: Failure>(
        &self,
        call: Call<'a>,
        next: Next<'a, R, E>,
    ) -> Result<R, E> {
        // A grouped send (a FIFO queue's) meets the same faults but the delay: it has no
        // delay of its own to stretch, and its order within its group is what it is sent for.
        let (queue_url, body, delay, group) = match call {
            Call::Send {
                queue_url,
                body,
                delay,
                group,
            } => (queue_url, body, Some(delay), group),
            Call::SendGrouped(message) => (message.queue_url, message.body, None, None),
            _ => return next.run(call).await,
        };
        let role = self.roles.get(queue_url).copied().unwrap_or("client");
        let task = task_of(body);
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let r = &self.chaos.recorder;
        r.sent.fetch_add(1, Ordering::Relaxed);
        let p = &self.chaos.plan;
        if r.over(
            || format!("{role} message for task {task:?}"),
            body.len(),
            SQS_MAX_MESSAGE,
        ) {
            return Err(E::rejected(format!(
                "InvalidParameterValue: message must be shorter than {SQS_MAX_MESSAGE} bytes"
            )));
        }
        if self.chaos.throttle(&format!("send:{role}"), &task) {
            return Err(E::unavailable(throttled(&format!("send:{role}"))));
        }
        if role == "timers" && self.chaos.roll("lose-timer", &task, n, p.lose_timer_rate) {
            r.timers_lost.fetch_add(1, Ordering::Relaxed);
            if let Some(sent) = nothing() {
                return Ok(sent);
            }
        }
        let send = match delay {
            Some(delay) => Call::Send {
                queue_url,
                body,
                delay: self.delay(role, &task, n, delay),
                group,
            },
            None => call,
        };
        let mut out = next.run(send).await?;
        if self.chaos.roll("duplicate", &task, n, p.duplicate_rate) {
            r.duplicated.fetch_add(1, Ordering::Relaxed);
            out = next.run(send).await?;
        }
        let point = format!("send:{role}");
        if self.chaos.crash(&point, &task) {
            return Err(E::unavailable(crashed(&point)));
        }
        Ok(out)
    }

    /// How long a plain send is held back: `delay`, stretched to the end of a work-queue
    /// stall, and maybe by a random extra delay (which reorders messages).
    fn delay(&self, role: &str, task: &str, n: u64, delay: Duration) -> Duration {
        let r = &self.chaos.recorder;
        let p = &self.chaos.plan;
        let mut delay = delay;
        if let Some(stall) = p.slow_work_queue
            && role == "work"
            && !stall.is_zero()
        {
            // Where the message lands in the stall cycle: inside a stall, it waits for its end.
            let since = self.started.elapsed().saturating_sub(STALL_FROM);
            let into = Duration::from_nanos((since.as_nanos() % (stall * 4).as_nanos()) as u64);
            if self.started.elapsed() >= STALL_FROM && into < stall {
                r.slowed.fetch_add(1, Ordering::Relaxed);
                let spread =
                    Duration::from_secs(1).mul_f64(seeded_unit(p.seed, &["burst", task], n));
                delay = delay.max(stall - into + spread);
            }
        }
        if self.chaos.roll("delay", task, n, p.delay_rate) {
            r.delayed.fetch_add(1, Ordering::Relaxed);
            delay += p
                .max_extra_delay
                .mul_f64(seeded_unit(p.seed, &["delay-by", task], n));
        }
        delay
    }
}

/// A fault that strikes a call at random, at its rate in the plan.
#[derive(Debug, Clone, Copy)]
enum Strike {
    /// The call is refused with a throttling error before it happens.
    Throttle,
    /// The applied write's response is lost.
    LoseResponse,
}

fn task_of(body: &str) -> String {
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["taskId"].as_str().map(str::to_owned))
        .unwrap_or_default()
}

#[async_trait]
impl Interceptor for Faults {
    async fn around<'a, R: Reply, E: Failure>(&'a self, next: Next<'a, R, E>) -> Result<R, E> {
        let call = next.call();
        match call {
            Call::Create(_) | Call::PutAs { .. } | Call::PutWithInput { .. } => {
                self.write(call, &next).await
            }
            Call::ForgetTask { record } => {
                // A purge deleted the task's objects, and its supervisor dies before deleting
                // its items: the record stays due, for the next sweep.
                let point = "delete:objects";
                if self.chaos.crash(point, &record.task_id.to_string()) {
                    return Err(E::unavailable(crashed(point)));
                }
                next.run(call).await
            }
            Call::AcquireLease(claim) => {
                let got = next.run(call).await?;
                if answer::<bool, _>(&got) == Some(&true) && self.chaos.crash("lease", claim.owner)
                {
                    return Err(E::unavailable(crashed("lease")));
                }
                Ok(got)
            }
            Call::Send { .. } | Call::SendGrouped(_) => self.send(call, next).await,
            Call::Receive(_) => {
                let got = next.run(call).await?;
                let p = &self.chaos.plan;
                if let Some(got) = answer::<Vec<ReceivedMessage>, _>(&got)
                    && let Some(m) = got.first()
                    && p.batch_timeout_rate > 0.0
                    && seeded_unit(
                        p.seed,
                        &["batch-timeout", &m.message_id],
                        u64::from(m.receive_count),
                    ) < p.batch_timeout_rate
                {
                    // The Lambda that gets this batch times out: its work happens (or part of
                    // it), its deletes do not.
                    self.chaos
                        .recorder
                        .batches_timed_out
                        .fetch_add(1, Ordering::Relaxed);
                    if let Ok(mut t) = self.timed_out.lock() {
                        t.extend(got.iter().map(|m| m.receipt_handle.clone()));
                    }
                }
                Ok(got)
            }
            Call::Delete { receipt_handle, .. } => {
                let timed_out = self
                    .timed_out
                    .lock()
                    .map(|mut t| t.remove(receipt_handle))
                    .unwrap_or(false);
                if timed_out && let Some(deleted) = nothing() {
                    return Ok(deleted);
                }
                next.run(call).await
            }
            Call::PublishEvent {
                detail_type,
                detail,
            } => {
                // The bus records what it accepted.
                let task = detail["taskId"].as_str().unwrap_or_default().to_owned();
                if self.chaos.plan.bus_down(self.chaos.started.elapsed()) {
                    self.chaos
                        .recorder
                        .bus_refused
                        .fetch_add(1, Ordering::Relaxed);
                    return Err(E::unavailable(format!(
                        "chaos: the event bus is down (publish:{detail_type} refused)"
                    )));
                }
                if self
                    .chaos
                    .throttle(&format!("publish:{detail_type}"), &task)
                {
                    return Err(E::unavailable(throttled(&format!("publish:{detail_type}"))));
                }
                let out = next.run(call).await?;
                let id = detail["id"].as_str().unwrap_or_default().to_owned();
                if let Ok(mut p) = self.chaos.recorder.published.lock() {
                    p.push((detail_type.to_owned(), task.clone(), id));
                }
                let point = format!("publish:{detail_type}");
                if self.chaos.crash(&point, &task) {
                    return Err(E::unavailable(crashed(&point)));
                }
                Ok(out)
            }
            // Reads, and the writes no failpoint stands after (leases given up, breakers, rate
            // limits, retention), pass through.
            _ => next.run(call).await,
        }
    }
}
