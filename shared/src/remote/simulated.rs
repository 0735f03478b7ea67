use crate::ports::{Clock, RemoteCall, RemoteFault, RemoteService};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use rand::Rng;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::task::JoinHandle;

/// The fault flags of a simulated service. [`Faults::default`] is a well-behaved service:
/// no faults, tombstones kept.
#[derive(Debug, Clone, PartialEq)]
pub struct Faults {
    /// Time each call takes.
    pub latency: Duration,
    /// Share of calls failing with a transient fault before any effect.
    pub transient_rate: f64,
    /// Share of idempotency keys refused for good (the same key is always refused again).
    pub permanent_rate: f64,
    /// Share of calls whose effect is applied but whose response is lost (a transient fault
    /// the caller cannot tell from the others): the reason idempotency keys exist.
    pub lost_response_rate: f64,
    /// While the clock is inside this window every call fails with a transient fault.
    pub outage: Option<(DateTime<Utc>, DateTime<Utc>)>,
    /// Actions (e.g. `arrange-shipping`, `release-inventory`) refused for every key.
    pub refuse_actions: Vec<String>,
    /// A JSON pointer (e.g. `/invoice/disputed`): a step call (not an undo) whose request holds
    /// `true` there is refused, whatever its key: a refusal the caller's data decides, so a
    /// test knows which elements are refused.
    pub refuse_marked: Option<String>,
    /// Share of calls that take `slow_latency` instead of `latency` (e.g. past the deadline).
    pub slow_rate: f64,
    pub slow_latency: Duration,
    /// Share of calls that outlast the caller's timeout and still commit: the caller sees a
    /// transient timeout at its `timeout`, and the effect is applied `slow_latency` after that,
    /// unless the key has an outcome by then (a retry committed it, or an undo left a
    /// tombstone: the late commit is then dropped). A key already answered is answered again
    /// at once, never late.
    pub late_commit_rate: f64,
    /// A call whose key's first call is still running (a late commit included) answers
    /// [`RemoteFault::InProgress`] (HTTP 409) instead of running a second time. Off: the second
    /// call runs, and the first to commit decides the key's outcome.
    pub in_progress: bool,
    /// While the clock is inside this window every call answers
    /// [`RemoteFault::Misconfigured`] (`401 ...`) with no effect: a rotated credential.
    pub unauthorized: Option<(DateTime<Utc>, DateTime<Utc>)>,
    /// An undo of a step key the service has no success for (never seen, or still running)
    /// records a tombstone: the step's key is refused from then on. `false` plants the bug of a
    /// service that forgets this: a late step then commits after its undo and leaks (counted
    /// in [`SimStats::leaked`]).
    pub tombstones: bool,
    /// Share of step keys (not undos) answered oversized, decided once per key: half of them
    /// refused with a message of [`OVERSIZED_BYTES`] (no effect), the others applied and
    /// answered with a result padded to that size (the effect took place). What an agent keeps
    /// of either must stay within the limits of a reply, a record and an event.
    pub oversized: f64,
    /// Decide every fault from this seed, the idempotency key and the call's number for that
    /// key, instead of at random: the same seed gives the same faults to the same calls,
    /// whatever the interleaving.
    pub seed: Option<u64>,
    /// A JSON pointer (e.g. `/account`): the calls in the service at once are also counted per
    /// the string their request holds there ([`SimStats::most_in_flight_by`]), what a per-key
    /// limit keeps.
    pub count_by: Option<String>,
}

impl Default for Faults {
    fn default() -> Self {
        Self {
            latency: Duration::ZERO,
            transient_rate: 0.0,
            permanent_rate: 0.0,
            lost_response_rate: 0.0,
            outage: None,
            refuse_actions: Vec::new(),
            refuse_marked: None,
            slow_rate: 0.0,
            slow_latency: Duration::ZERO,
            late_commit_rate: 0.0,
            in_progress: false,
            unauthorized: None,
            tombstones: true,
            oversized: 0.0,
            seed: None,
            count_by: None,
        }
    }
}

/// The size of an oversized answer's padding (see [`Faults::oversized`]): past the most an
/// agent reads of an answer ([`super::MAX_ANSWER_BYTES`]), so past every limit.
pub const OVERSIZED_BYTES: usize = super::MAX_ANSWER_BYTES + (1 << 20);

/// A number in [0, 1) from `seed`, `parts` and `n`: the seeded fault decisions.
pub fn seeded_unit(seed: u64, parts: &[&str], n: u64) -> f64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    seed.hash(&mut h);
    parts.hash(&mut h);
    n.hash(&mut h);
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

/// Counters of a simulated service.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SimStats {
    pub calls: u64,
    pub transient_faults: u64,
    pub permanent_faults: u64,
    /// Calls answered "in progress" (409): their key's first call was still running.
    pub in_progress_faults: u64,
    /// Calls answered "misconfigured" (401) inside the `unauthorized` window.
    pub misconfigured_faults: u64,
    /// Calls answered oversized (see [`Faults::oversized`]).
    pub oversized: u64,
    /// Calls that committed after their caller had timed out.
    pub late_commits: u64,
    /// Late commits dropped because the key had an outcome by then (a tombstone, or a retry
    /// that committed first).
    pub late_dropped: u64,
    /// Effects applied per idempotency key (steps and undos alike). A correct system applies
    /// each key once.
    pub effects: HashMap<String, u32>,
    /// The net effect per step key: +1 when the step applies, -1 when its undo reverses it. A
    /// Processed task nets 1 per step; a compensated one nets 0.
    pub net: HashMap<String, i32>,
    /// Step keys that took effect after an undo of them had succeeded: effects nothing will
    /// ever reverse. Always empty while tombstones are kept.
    pub leaked: Vec<String>,
    /// Keys in the order their effects were applied.
    pub applied: Vec<String>,
    /// The request of every applied effect, in order (what the mappings built).
    pub requests: Vec<Applied>,
    /// A forEach element's keys (`{task}:{step}#{k}:...`, steps and undos) that came with a
    /// body other than their first call's: one key must carry one request (a key stands for
    /// its element's place in the list it was made from).
    pub rebodied: Vec<String>,
    /// A forEach step's elements (keys `{task}:{step}#{k}:...`, by `{task}:{step}`): the most
    /// distinct elements being worked on at once (an element from the start of a call of its
    /// key to the key's first outcome, or to the end of its calls if none came; repeats of a
    /// key already answered are not work).
    pub most_elements_in_flight: HashMap<String, u32>,
    /// The most calls in the service at once (from a call's arrival to its answer), whatever
    /// their keys: what a concurrency limit keeps.
    pub most_calls_in_flight: u32,
    /// The most tasks whose calls were in the service at once, per value at
    /// [`Faults::count_by`] in their request: what a per-key limit (or a concurrency gate)
    /// keeps. A call does work from its start to its key's first outcome (a duplicate of its
    /// request still in a call, or a repeat answered later, is not work), and one task's calls
    /// count once.
    pub most_in_flight_by: HashMap<String, u32>,
    /// When each call arrived (ms), in order: what a rate limit keeps
    /// ([`SimStats::most_calls_in_any_second`]).
    pub arrivals_ms: Vec<i64>,
}

impl SimStats {
    /// The most calls that arrived within any one second (a sliding window over
    /// [`SimStats::arrivals_ms`]).
    pub fn most_calls_in_any_second(&self) -> usize {
        let mut t = self.arrivals_ms.clone();
        t.sort_unstable();
        let (mut most, mut first) = (0, 0);
        for (last, at) in t.iter().enumerate() {
            while t[first] <= at - 1000 {
                first += 1;
            }
            most = most.max(last + 1 - first);
        }
        most
    }
}

/// One applied call: its key, action and request body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    pub key: String,
    pub action: String,
    pub input: serde_json::Value,
}

type Outcome = Result<serde_json::Value, String>;

#[derive(Debug, Default)]
struct SimState {
    stats: SimStats,
    /// The outcome of every key seen, so a repeated key gets the first answer again.
    outcomes: HashMap<String, Outcome>,
    /// Calls seen per key (for seeded faults).
    calls_per_key: HashMap<String, u64>,
    /// Calls running per key (a pending late commit included).
    in_flight: HashMap<String, u32>,
    /// Step keys an undo succeeded for.
    undone: HashSet<String>,
    /// A forEach step's elements in calls now: `{task}:{step}` → element key → calls.
    elements_in_flight: HashMap<String, HashMap<String, u32>>,
    /// Calls in the service now.
    calls_now: u32,
    /// The keys whose calls do work now, per value at [`Faults::count_by`]: each key's task
    /// and calls (until the key's first outcome).
    working_by: HashMap<String, HashMap<String, (String, u32)>>,
    /// The first body of each element's key (see [`SimStats::rebodied`]).
    element_bodies: HashMap<String, serde_json::Value>,
}

/// A call in the service, from its arrival to its answer (see
/// [`SimStats::most_calls_in_flight`]).
struct Arrived(Arc<Mutex<SimState>>);

impl Arrived {
    fn at(state: &Arc<Mutex<SimState>>, now: DateTime<Utc>) -> Self {
        if let Ok(mut s) = state.lock() {
            s.calls_now += 1;
            s.stats.most_calls_in_flight = s.stats.most_calls_in_flight.max(s.calls_now);
            s.stats.arrivals_ms.push(now.timestamp_millis());
        }
        Self(state.clone())
    }
}

impl Drop for Arrived {
    fn drop(&mut self) {
        if let Ok(mut s) = self.0.lock() {
            s.calls_now = s.calls_now.saturating_sub(1);
        }
    }
}

/// A call doing work for its task under a value of [`Faults::count_by`], from its arrival to
/// its answer (see [`SimStats::most_in_flight_by`]).
struct Working {
    state: Arc<Mutex<SimState>>,
    value: String,
    key: String,
}

impl Working {
    fn start(state: &Arc<Mutex<SimState>>, value: String, key: &str, task: String) -> Self {
        if let Ok(mut s) = state.lock() {
            let keys = s.working_by.entry(value.clone()).or_default();
            keys.entry(key.to_owned()).or_insert((task, 0)).1 += 1;
            let tasks: HashSet<&String> = keys.values().map(|(t, _)| t).collect();
            let now = u32::try_from(tasks.len()).unwrap_or(u32::MAX);
            let most = s.stats.most_in_flight_by.entry(value.clone()).or_default();
            *most = (*most).max(now);
        }
        Self {
            state: state.clone(),
            value,
            key: key.to_owned(),
        }
    }
}

impl Drop for Working {
    fn drop(&mut self) {
        if let Ok(mut s) = self.state.lock()
            && let Some(keys) = s.working_by.get_mut(&self.value)
            && let Some((_, n)) = keys.get_mut(&self.key)
        {
            *n = n.saturating_sub(1);
            if *n == 0 {
                keys.remove(&self.key);
            }
        }
    }
}

/// A call of one of a forEach step's elements, from its start to its answer (see
/// [`SimStats::most_elements_in_flight`]).
struct ElementCall {
    state: Arc<Mutex<SimState>>,
    group: String,
    key: String,
}

impl ElementCall {
    /// The call of `key` starts, if it is an element's (`{task}:{step}#{k}:...`).
    fn start(state: &Arc<Mutex<SimState>>, key: &str) -> Option<Self> {
        let (group, _) = key.split_once('#')?;
        let mut s = state.lock().ok()?;
        let keys = s.elements_in_flight.entry(group.to_owned()).or_default();
        *keys.entry(key.to_owned()).or_default() += 1;
        let now = u32::try_from(keys.len()).unwrap_or(u32::MAX);
        let most = s
            .stats
            .most_elements_in_flight
            .entry(group.to_owned())
            .or_default();
        *most = (*most).max(now);
        Some(Self {
            state: state.clone(),
            group: group.to_owned(),
            key: key.to_owned(),
        })
    }
}

impl Drop for ElementCall {
    fn drop(&mut self) {
        if let Ok(mut s) = self.state.lock()
            && let Some(keys) = s.elements_in_flight.get_mut(&self.group)
        {
            if let Some(n) = keys.get_mut(&self.key) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    keys.remove(&self.key);
                }
            }
            if keys.is_empty() {
                s.elements_in_flight.remove(&self.group);
            }
        }
    }
}

impl SimState {
    /// Applies `call` unless its key has an outcome already; returns the key's outcome.
    fn commit(&mut self, name: &str, call: &RemoteCall, refuse: bool, tombstones: bool) -> Outcome {
        let key = &call.idempotency_key;
        if let Some(first) = self.outcomes.get(key) {
            return first.clone();
        }
        let outcome = if refuse {
            self.stats.permanent_faults += 1;
            Err(format!("{name} refused {}", call.action))
        } else {
            *self.stats.effects.entry(key.clone()).or_default() += 1;
            self.stats.applied.push(key.clone());
            self.stats.requests.push(Applied {
                key: key.clone(),
                action: call.action.clone(),
                input: call.input.clone(),
            });
            match &call.undoes {
                Some(step_key) => {
                    self.undone.insert(step_key.clone());
                    if matches!(self.outcomes.get(step_key), Some(Ok(_))) {
                        *self.stats.net.entry(step_key.clone()).or_default() -= 1;
                    } else if tombstones {
                        // Nothing to reverse (yet): refuse the step's key from now on.
                        self.outcomes
                            .insert(step_key.clone(), Err(format!("{step_key} already undone")));
                    }
                }
                None => {
                    if self.undone.contains(key) {
                        self.stats.leaked.push(key.clone());
                    }
                    *self.stats.net.entry(key.clone()).or_default() += 1;
                }
            }
            Ok(serde_json::json!({
                "id": uuid::Uuid::new_v4().to_string(),
                "service": name,
                "action": call.action,
            }))
        };
        self.outcomes.insert(key.clone(), outcome.clone());
        // An element's work is over at its key's first outcome: a duplicate of its request
        // still in a call (delivered twice, racing the first) is a repeat, not more work.
        if let Some((group, _)) = key.split_once('#')
            && let Some(keys) = self.elements_in_flight.get_mut(group)
        {
            keys.remove(key);
            if keys.is_empty() {
                self.elements_in_flight.remove(group);
            }
        }
        for keys in self.working_by.values_mut() {
            keys.remove(key);
        }
        outcome
    }
}

/// Marks a key in flight until dropped.
struct InFlight {
    state: Arc<Mutex<SimState>>,
    key: String,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Ok(mut s) = self.state.lock()
            && let Some(n) = s.in_flight.get_mut(&self.key)
        {
            *n = n.saturating_sub(1);
            if *n == 0 {
                s.in_flight.remove(&self.key);
            }
        }
    }
}

/// A remote service that lives in the process: it honours idempotency keys like a payment API
/// does (a repeated key returns the first outcome and applies nothing), and injects the faults
/// its [`Faults`] ask for.
///
/// A call that carries `undoes` (a step's key) is an undo: it reverses that step's
/// effect if it applied; if the step never reached the service (or is still running), the undo
/// leaves a tombstone and the step's key is refused from then on, so a step request still in
/// flight when its task is compensated can never take effect afterwards. Remote services used
/// with sas must offer the same guarantee; see `docs/services.md`.
pub struct SimulatedService {
    name: String,
    faults: Mutex<Faults>,
    clock: Arc<dyn Clock>,
    state: Arc<Mutex<SimState>>,
    /// Late commits not yet applied (see [`SimulatedService::settle`]).
    pending: Mutex<Vec<JoinHandle<()>>>,
}

impl SimulatedService {
    pub fn new(name: impl Into<String>, faults: Faults, clock: Arc<dyn Clock>) -> Self {
        Self {
            name: name.into(),
            faults: Mutex::new(faults),
            clock,
            state: Arc::new(Mutex::new(SimState::default())),
            pending: Mutex::new(Vec::new()),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn set_faults(&self, faults: Faults) {
        if let Ok(mut f) = self.faults.lock() {
            *f = faults;
        }
    }

    pub fn faults(&self) -> Faults {
        self.faults.lock().map(|f| f.clone()).unwrap_or_default()
    }

    pub fn stats(&self) -> SimStats {
        self.state
            .lock()
            .map(|s| s.stats.clone())
            .unwrap_or_default()
    }

    /// Waits until every late commit started so far has been applied (or dropped), so that
    /// [`SimulatedService::stats`] holds every effect the service will ever apply.
    pub async fn settle(&self) {
        loop {
            let handles: Vec<_> = self
                .pending
                .lock()
                .map(|mut p| std::mem::take(&mut *p))
                .unwrap_or_default();
            if handles.is_empty() {
                return;
            }
            for h in handles {
                if let Err(e) = h.await {
                    tracing::warn!(service = %self.name, error = %e, "late commit task failed");
                }
            }
        }
    }

    /// Effects applied for keys that start with `prefix` (e.g. a task id).
    pub fn effects_for(&self, prefix: &str) -> HashMap<String, u32> {
        self.stats()
            .effects
            .into_iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .collect()
    }

    fn with_state<T>(&self, f: impl FnOnce(&mut SimState) -> T) -> Result<T, RemoteFault> {
        self.state
            .lock()
            .map(|mut s| f(&mut s))
            .map_err(|_| RemoteFault::Transient("simulated service lock poisoned".into()))
    }

    /// Applies `call` `delay` from now, in the background, unless its key has an outcome by
    /// then; the key stays in flight until then.
    fn commit_late(
        &self,
        call: &RemoteCall,
        (refuse, tombstones): (bool, bool),
        delay: Duration,
        in_flight: InFlight,
    ) {
        let (state, name, call) = (self.state.clone(), self.name.clone(), call.clone());
        let task = tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            // Decided when the commit lands: an undo seen meanwhile left its tombstone (or not).
            let Ok(mut s) = state.lock() else { return };
            if s.outcomes.contains_key(&call.idempotency_key) {
                s.stats.late_dropped += 1;
            } else {
                s.stats.late_commits += 1;
                let _ = s.commit(&name, &call, refuse, tombstones);
            }
            drop(s);
            drop(in_flight);
        });
        if let Ok(mut p) = self.pending.lock() {
            p.retain(|h| !h.is_finished());
            p.push(task);
        }
    }
}

#[async_trait]
impl RemoteService for SimulatedService {
    async fn call(
        &self,
        call: &RemoteCall,
        timeout: Duration,
    ) -> Result<serde_json::Value, RemoteFault> {
        let faults = self.faults();
        let key = call.idempotency_key.as_str();
        let started = self.clock.now();
        let _arrived = Arrived::at(&self.state, started);

        let n = self.with_state(|s| {
            s.stats.calls += 1;
            if key.contains('#') {
                let first = s
                    .element_bodies
                    .entry(key.to_owned())
                    .or_insert_with(|| call.input.clone());
                if *first != call.input && !s.stats.rebodied.iter().any(|k| k == key) {
                    s.stats.rebodied.push(key.to_owned());
                }
            }
            let n = s.calls_per_key.entry(key.to_owned()).or_default();
            *n += 1;
            *n
        })?;
        if faults
            .unauthorized
            .is_some_and(|(from, to)| from <= started && started < to)
        {
            self.with_state(|s| s.stats.misconfigured_faults += 1)?;
            return Err(RemoteFault::Misconfigured(format!(
                "401 unauthorized: {} does not accept the credential",
                self.name
            )));
        }
        let (busy, answered) = self.with_state(|s| {
            let busy = s.in_flight.get(key).is_some_and(|n| *n > 0);
            if busy && faults.in_progress {
                s.stats.in_progress_faults += 1;
            } else {
                *s.in_flight.entry(key.to_owned()).or_default() += 1;
            }
            (busy, s.outcomes.contains_key(key))
        })?;
        if busy && faults.in_progress {
            return Err(RemoteFault::InProgress(format!(
                "409 conflict: {} is still processing {key}",
                self.name
            )));
        }
        // An element's call that does work (not a repeat answered from the key's first
        // outcome, as a duplicate delivery of a request is; not an undo, which compensation
        // sends one at a time) holds its place among the forEach step's calls.
        let _element = (call.undoes.is_none() && !answered)
            .then(|| ElementCall::start(&self.state, key))
            .flatten();
        let _working = faults
            .count_by
            .as_deref()
            .filter(|_| !answered)
            .and_then(|at| call.input.pointer(at))
            .and_then(|v| v.as_str())
            .map(|value| {
                Working::start(&self.state, value.to_owned(), key, call.task_id.to_string())
            });
        let in_flight = InFlight {
            state: self.state.clone(),
            key: key.to_owned(),
        };
        let roll = |salt: &str, rate: f64| match faults.seed {
            Some(seed) => seeded_unit(seed, &[salt, key], n) < rate,
            None => rand::rng().random_bool(rate.clamp(0.0, 1.0)),
        };
        let transient = roll("transient", faults.transient_rate);
        // A refusal is decided once per key: a refused key stays refused.
        let permanent = match faults.seed {
            Some(seed) => seeded_unit(seed, &["permanent", key], 0) < faults.permanent_rate,
            None => roll("permanent", faults.permanent_rate),
        };
        // Oversized is decided once per step key too (a refused key stays refused).
        let oversized = call.undoes.is_none()
            && seeded_unit(faults.seed.unwrap_or_default(), &["oversized", key], 0)
                < faults.oversized;
        let oversized_refusal = oversized
            && seeded_unit(
                faults.seed.unwrap_or_default(),
                &["oversized-refusal", key],
                0,
            ) < 0.5;
        let marked = call.undoes.is_none()
            && faults
                .refuse_marked
                .as_deref()
                .is_some_and(|at| call.input.pointer(at) == Some(&serde_json::Value::Bool(true)));
        let refuse = permanent
            || oversized_refusal
            || marked
            || faults.refuse_actions.contains(&call.action);
        let lost = roll("lost", faults.lost_response_rate);
        let in_outage = |now: DateTime<Utc>| {
            faults
                .outage
                .is_some_and(|(from, to)| from <= now && now < to)
        };
        if !answered && !in_outage(started) && roll("late", faults.late_commit_rate) {
            tokio::time::sleep(timeout).await;
            self.with_state(|s| s.stats.transient_faults += 1)?;
            self.commit_late(
                call,
                (refuse, faults.tombstones),
                faults.slow_latency,
                in_flight,
            );
            return Err(RemoteFault::Transient(format!(
                "{}: timed out (the call still commits later)",
                self.name
            )));
        }
        let latency = if roll("slow", faults.slow_rate) {
            faults.slow_latency
        } else {
            faults.latency
        };
        if latency > timeout {
            tokio::time::sleep(timeout).await;
            self.with_state(|s| s.stats.transient_faults += 1)?;
            return Err(RemoteFault::Transient(format!("{}: timed out", self.name)));
        }
        tokio::time::sleep(latency).await;
        let outage = in_outage(self.clock.now());
        if outage || transient {
            self.with_state(|s| s.stats.transient_faults += 1)?;
            let why = if outage {
                "outage"
            } else {
                "503 service unavailable"
            };
            return Err(RemoteFault::Transient(format!("{}: {why}", self.name)));
        }
        let outcome = self.with_state(|s| s.commit(&self.name, call, refuse, faults.tombstones))?;
        drop(in_flight);
        match outcome {
            Ok(_) if lost => {
                self.with_state(|s| s.stats.transient_faults += 1)?;
                Err(RemoteFault::Transient(format!(
                    "{}: response lost",
                    self.name
                )))
            }
            // The outcome kept per key stays small; the padding is added on the way out.
            Ok(mut v) if oversized => {
                self.with_state(|s| s.stats.oversized += 1)?;
                v["pad"] = serde_json::Value::String("x".repeat(OVERSIZED_BYTES));
                Ok(v)
            }
            Ok(v) => Ok(v),
            Err(e) if oversized_refusal => {
                self.with_state(|s| s.stats.oversized += 1)?;
                Err(RemoteFault::Refused {
                    code: "declined".into(),
                    message: format!("{e}: {}", "x".repeat(OVERSIZED_BYTES)),
                })
            }
            Err(e) => Err(RemoteFault::Refused {
                code: "declined".into(),
                message: e,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::TaskId;
    use crate::ports::SystemClock;

    fn undo(key: &str, undoes: &str) -> RemoteCall {
        RemoteCall {
            service: "payment".into(),
            step: "step".into(),
            action: "refund-payment".into(),
            idempotency_key: key.into(),
            task_id: TaskId::new_random(),
            undoes: Some(undoes.into()),
            input: serde_json::json!({}),
            deadline: chrono::Utc::now() + chrono::Duration::seconds(30),
            callback: None,
            limit_keys: Default::default(),
        }
    }

    #[tokio::test]
    async fn an_undo_reverses_its_step_once_and_an_undo_first_refuses_the_step() {
        let s = SimulatedService::new("payment", Faults::default(), Arc::new(SystemClock));
        let t = Duration::from_secs(1);
        s.call(&call("k1"), t).await.expect("step");
        s.call(&undo("u1", "k1"), t).await.expect("undo");
        s.call(&undo("u1", "k1"), t).await.expect("repeated undo");
        s.call(&undo("u2", "k2"), t)
            .await
            .expect("undo before the step");
        assert!(matches!(
            s.call(&call("k2"), t).await,
            Err(RemoteFault::Refused { .. })
        ));
        let st = s.stats();
        assert_eq!(st.net.get("k1"), Some(&0));
        assert_eq!(st.net.get("k2"), None);
        assert_eq!(st.effects.get("u1"), Some(&1));
        assert_eq!(st.applied, ["k1", "u1", "u2"]);
        s.set_faults(Faults {
            refuse_actions: vec!["charge-payment".into()],
            ..Faults::default()
        });
        assert!(matches!(
            s.call(&call("k3"), t).await,
            Err(RemoteFault::Refused { .. })
        ));
    }

    /// A window that opened a second ago and stays open for an hour.
    fn from_now_for_an_hour() -> (DateTime<Utc>, DateTime<Utc>) {
        let now = Utc::now();
        (
            now - chrono::Duration::seconds(1),
            now + chrono::Duration::hours(1),
        )
    }

    fn call(key: &str) -> RemoteCall {
        RemoteCall {
            service: "payment".into(),
            step: "step".into(),
            action: "charge-payment".into(),
            idempotency_key: key.into(),
            task_id: TaskId::new_random(),
            undoes: None,
            input: serde_json::json!({"n": key}),
            deadline: chrono::Utc::now() + chrono::Duration::seconds(30),
            callback: None,
            limit_keys: Default::default(),
        }
    }

    #[tokio::test]
    async fn oversized_keys_are_refused_hugely_or_applied_with_a_huge_result_every_time() {
        let s = SimulatedService::new(
            "payment",
            Faults {
                oversized: 1.0,
                seed: Some(3),
                ..Faults::default()
            },
            Arc::new(SystemClock),
        );
        let t = Duration::from_secs(1);
        let (mut refused, mut applied) = (0, 0);
        for i in 0..20 {
            let key = format!("k{i}");
            for _ in 0..2 {
                match s.call(&call(&key), t).await {
                    Err(RemoteFault::Refused { message, .. }) => {
                        assert!(message.len() > OVERSIZED_BYTES);
                        refused += 1;
                    }
                    Ok(v) => {
                        assert!(v.to_string().len() > OVERSIZED_BYTES);
                        applied += 1;
                    }
                    other => panic!("{other:?}"),
                }
            }
            assert!(s.stats().effects.get(&key).is_none_or(|n| *n == 1));
        }
        assert!(
            refused > 0 && applied > 0,
            "{refused} refused, {applied} applied"
        );
        assert_eq!(s.stats().oversized, 40);
        s.call(&undo("u1", "k0"), t)
            .await
            .expect("an undo is never oversized");
    }

    #[tokio::test]
    async fn a_repeated_key_applies_once_and_returns_the_first_answer() {
        let s = SimulatedService::new("payment", Faults::default(), Arc::new(SystemClock));
        let a = s
            .call(&call("k1"), Duration::from_secs(1))
            .await
            .expect("ok");
        let b = s
            .call(&call("k1"), Duration::from_secs(1))
            .await
            .expect("ok");
        assert_eq!(a, b);
        s.call(&call("k2"), Duration::from_secs(1))
            .await
            .expect("ok");
        let st = s.stats();
        assert_eq!(st.calls, 3);
        assert_eq!(st.effects.get("k1"), Some(&1));
        assert_eq!(st.effects.get("k2"), Some(&1));
    }

    #[tokio::test]
    async fn a_call_marked_in_its_request_is_refused_and_its_undo_is_not() {
        let s = SimulatedService::new(
            "ledger",
            Faults {
                refuse_marked: Some("/invoice/disputed".into()),
                ..Faults::default()
            },
            Arc::new(SystemClock),
        );
        let with = |key: &str, input: serde_json::Value| RemoteCall { input, ..call(key) };
        let marked = serde_json::json!({"invoice": {"id": 7, "disputed": true}});
        assert!(matches!(
            s.call(&with("k7", marked.clone()), Duration::from_secs(1))
                .await,
            Err(RemoteFault::Refused { .. })
        ));
        let plain = serde_json::json!({"invoice": {"id": 8, "disputed": false}});
        s.call(&with("k8", plain), Duration::from_secs(1))
            .await
            .expect("a request not marked goes through");
        // An undo carrying the marked body is not refused for it.
        let undo = RemoteCall {
            undoes: Some("k8".into()),
            ..with("k8-undo", marked)
        };
        s.call(&undo, Duration::from_secs(1))
            .await
            .expect("an undo is never refused by the mark");
        assert_eq!(s.stats().effects.get("k7"), None);
        assert_eq!(s.stats().net.get("k8"), Some(&0));
    }

    #[tokio::test]
    async fn a_lost_response_still_applies_its_effect_once() {
        let faults = Faults {
            lost_response_rate: 1.0,
            ..Faults::default()
        };
        let s = SimulatedService::new("payment", faults, Arc::new(SystemClock));
        for _ in 0..3 {
            let e = s.call(&call("k"), Duration::from_secs(1)).await;
            assert!(matches!(e, Err(RemoteFault::Transient(_))));
        }
        assert_eq!(s.stats().effects.get("k"), Some(&1));
    }

    #[tokio::test]
    async fn outages_latency_and_refusals_are_faults_of_their_kind() {
        let s = SimulatedService::new(
            "inventory",
            Faults {
                outage: Some(from_now_for_an_hour()),
                ..Faults::default()
            },
            Arc::new(SystemClock),
        );
        assert!(matches!(
            s.call(&call("k"), Duration::from_secs(1)).await,
            Err(RemoteFault::Transient(_))
        ));
        s.set_faults(Faults {
            latency: Duration::from_millis(50),
            ..Faults::default()
        });
        assert!(matches!(
            s.call(&call("k"), Duration::from_millis(10)).await,
            Err(RemoteFault::Transient(_))
        ));
        s.set_faults(Faults {
            permanent_rate: 1.0,
            ..Faults::default()
        });
        assert!(matches!(
            s.call(&call("k"), Duration::from_secs(1)).await,
            Err(RemoteFault::Refused { .. })
        ));
        s.set_faults(Faults::default());
        assert!(
            matches!(
                s.call(&call("k"), Duration::from_secs(1)).await,
                Err(RemoteFault::Refused { .. })
            ),
            "a refused key stays refused"
        );
        assert!(s.stats().effects.is_empty());
    }
    fn late(seed: Option<u64>) -> Faults {
        Faults {
            late_commit_rate: 1.0,
            in_progress: true,
            slow_latency: Duration::from_millis(30),
            seed,
            ..Faults::default()
        }
    }

    #[tokio::test]
    async fn a_late_call_times_out_then_commits_once_and_its_key_is_in_progress_meanwhile() {
        let s = SimulatedService::new("payment", late(Some(3)), Arc::new(SystemClock));
        let e = s.call(&call("k"), Duration::from_millis(5)).await;
        assert!(matches!(e, Err(RemoteFault::Transient(_))), "{e:?}");
        assert!(
            s.stats().effects.is_empty(),
            "not committed when the caller gives up"
        );
        let again = s.call(&call("k"), Duration::from_secs(1)).await;
        assert!(
            matches!(again, Err(RemoteFault::InProgress(_))),
            "{again:?}"
        );
        s.settle().await;
        let st = s.stats();
        assert_eq!(st.effects.get("k"), Some(&1));
        assert_eq!(st.net.get("k"), Some(&1));
        assert_eq!((st.late_commits, st.in_progress_faults), (1, 1));
        // Answered keys are answered at once (never late again), with the first outcome.
        let first = s
            .call(&call("k"), Duration::from_millis(5))
            .await
            .expect("the late outcome");
        let second = s
            .call(&call("k"), Duration::from_millis(5))
            .await
            .expect("again");
        assert_eq!(first, second);
        assert_eq!(s.stats().effects.get("k"), Some(&1));
    }

    #[tokio::test]
    async fn an_undo_during_a_late_call_wins_with_tombstones_and_leaks_without() {
        for tombstones in [true, false] {
            let s = SimulatedService::new("payment", late(None), Arc::new(SystemClock));
            let e = s.call(&call("k"), Duration::from_millis(5)).await;
            assert!(matches!(e, Err(RemoteFault::Transient(_))));
            // The undo arrives while the step is still running at the service.
            s.set_faults(Faults {
                tombstones,
                ..Faults::default()
            });
            s.call(&undo("u", "k"), Duration::from_secs(1))
                .await
                .expect("an undo of a running step succeeds");
            s.settle().await;
            let st = s.stats();
            let repeat = s.call(&call("k"), Duration::from_secs(1)).await;
            if tombstones {
                assert_eq!(st.net.get("k"), None, "the late commit was dropped");
                assert_eq!((st.late_commits, st.late_dropped), (0, 1));
                assert!(st.leaked.is_empty());
                assert!(matches!(repeat, Err(RemoteFault::Refused { .. })));
            } else {
                assert_eq!(
                    st.net.get("k"),
                    Some(&1),
                    "the step committed after its undo"
                );
                assert_eq!(st.leaked, ["k"]);
                assert!(repeat.is_ok());
            }
        }
    }

    #[tokio::test]
    async fn late_commits_are_decided_by_the_seed() {
        let run = |seed| async move {
            let s = SimulatedService::new(
                "payment",
                Faults {
                    late_commit_rate: 0.3,
                    ..late(Some(seed))
                },
                Arc::new(SystemClock),
            );
            let mut late = vec![];
            for i in 0..40 {
                let k = format!("k{i}");
                if s.call(&call(&k), Duration::from_millis(5)).await.is_err() {
                    late.push(k);
                }
            }
            s.settle().await;
            assert_eq!(s.stats().late_commits as usize, late.len());
            assert_eq!(
                s.stats().effects.len(),
                40,
                "every call commits, late or not"
            );
            late
        };
        let a = run(11).await;
        assert!(!a.is_empty() && a.len() < 40, "{a:?}");
        assert_eq!(a, run(11).await, "the same seed, the same late calls");
        assert_ne!(a, run(12).await);
    }

    #[tokio::test]
    async fn a_second_call_of_a_running_key_is_in_progress_or_waits_for_the_first_outcome() {
        for in_progress in [true, false] {
            let s = SimulatedService::new(
                "payment",
                Faults {
                    latency: Duration::from_millis(30),
                    in_progress,
                    ..Faults::default()
                },
                Arc::new(SystemClock),
            );
            let t = Duration::from_secs(1);
            let c = call("k");
            let (a, b) = tokio::join!(s.call(&c, t), s.call(&c, t));
            assert!(a.is_ok(), "{a:?}");
            if in_progress {
                assert!(matches!(b, Err(RemoteFault::InProgress(_))), "{b:?}");
                assert_eq!(s.stats().in_progress_faults, 1);
            } else {
                assert_eq!(a.ok(), b.ok(), "the first outcome, applied once");
            }
            assert_eq!(s.stats().effects.get("k"), Some(&1));
            // Once the first call is over the key is answered again.
            assert!(s.call(&c, t).await.is_ok(), "no longer in progress");
        }
    }

    #[tokio::test]
    async fn inside_the_unauthorized_window_every_call_is_misconfigured_with_no_effect() {
        let s = SimulatedService::new(
            "e-sign",
            Faults {
                unauthorized: Some(from_now_for_an_hour()),
                ..Faults::default()
            },
            Arc::new(SystemClock),
        );
        let t = Duration::from_secs(1);
        for c in [call("k"), undo("u", "k2")] {
            match s.call(&c, t).await {
                Err(RemoteFault::Misconfigured(m)) => assert!(m.starts_with("401"), "{m}"),
                other => panic!("not misconfigured: {other:?}"),
            }
        }
        let st = s.stats();
        assert!(st.effects.is_empty() && st.net.is_empty());
        assert_eq!(st.misconfigured_faults, 2);
        let now = Utc::now();
        s.set_faults(Faults {
            unauthorized: Some((
                now - chrono::Duration::hours(2),
                now - chrono::Duration::hours(1),
            )),
            ..Faults::default()
        });
        s.call(&call("k"), t).await.expect("after the window");
        // The undo seen in the window left no tombstone: the step is not refused.
        s.call(&call("k2"), t).await.expect("no tombstone");
    }

    #[tokio::test]
    async fn without_tombstones_an_undo_first_lets_the_step_commit_and_leak() {
        let s = SimulatedService::new(
            "payment",
            Faults {
                tombstones: false,
                ..Faults::default()
            },
            Arc::new(SystemClock),
        );
        let t = Duration::from_secs(1);
        s.call(&undo("u", "k"), t).await.expect("undo first");
        s.call(&call("k"), t)
            .await
            .expect("the planted bug: applied");
        let st = s.stats();
        assert_eq!(st.net.get("k"), Some(&1));
        assert_eq!(st.leaked, ["k"]);
        assert!(Faults::default().tombstones, "kept by default");
    }
}
