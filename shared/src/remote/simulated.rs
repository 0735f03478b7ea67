use crate::ports::{Clock, RemoteCall, RemoteFault, RemoteService};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use rand::Rng;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The fault flags of a simulated service.
#[derive(Debug, Clone, Default, PartialEq)]
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
    /// Share of calls that take `slow_latency` instead of `latency` (e.g. past the deadline).
    pub slow_rate: f64,
    pub slow_latency: Duration,
    /// Decide every fault from this seed, the idempotency key and the call's number for that
    /// key, instead of at random: the same seed gives the same faults to the same calls,
    /// whatever the interleaving.
    pub seed: Option<u64>,
}

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
    /// Effects applied per idempotency key (steps and undos alike). A correct system applies
    /// each key once.
    pub effects: HashMap<String, u32>,
    /// The net effect per step key: +1 when the step applies, -1 when its undo reverses it. A
    /// Processed task nets 1 per step; a compensated one nets 0.
    pub net: HashMap<String, i32>,
    /// Keys in the order their effects were applied.
    pub applied: Vec<String>,
    /// The request of every applied effect, in order (what the mappings built).
    pub requests: Vec<Applied>,
}

/// One applied call: its key, action and request body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    pub key: String,
    pub action: String,
    pub input: serde_json::Value,
}

#[derive(Debug, Default)]
struct SimState {
    stats: SimStats,
    /// The outcome of every key seen, so a repeated key gets the first answer again.
    outcomes: HashMap<String, Result<serde_json::Value, String>>,
    /// Calls seen per key (for seeded faults).
    calls_per_key: HashMap<String, u64>,
}

/// A remote service that lives in the process: it honours idempotency keys like a payment API
/// does (a repeated key returns the first outcome and applies nothing), and injects the faults
/// its [`Faults`] ask for.
///
/// A call that carries `undoes` (a step's key) is an undo: it reverses that step's
/// effect if it applied; if the step never reached the service, the undo leaves a tombstone and
/// the step's key is refused from then on, so a step request still in flight when its task is
/// compensated can never take effect afterwards. Remote services used with sas must offer the
/// same guarantee (cancel-before-capture); see ARCHITECTURE.md.
pub struct SimulatedService {
    name: String,
    faults: Mutex<Faults>,
    clock: Arc<dyn Clock>,
    state: Mutex<SimState>,
}

impl SimulatedService {
    pub fn new(name: impl Into<String>, faults: Faults, clock: Arc<dyn Clock>) -> Self {
        Self {
            name: name.into(),
            faults: Mutex::new(faults),
            clock,
            state: Mutex::new(SimState::default()),
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
}

#[async_trait]
impl RemoteService for SimulatedService {
    async fn call(
        &self,
        call: &RemoteCall,
        timeout: Duration,
    ) -> Result<serde_json::Value, RemoteFault> {
        let faults = self.faults();
        let n = self.with_state(|s| {
            s.stats.calls += 1;
            let n = s
                .calls_per_key
                .entry(call.idempotency_key.clone())
                .or_default();
            *n += 1;
            *n
        })?;
        let key = call.idempotency_key.as_str();
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
        let lost = roll("lost", faults.lost_response_rate);
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
        let now = self.clock.now();
        let in_outage = faults
            .outage
            .is_some_and(|(from, to)| from <= now && now < to);
        if in_outage || transient {
            self.with_state(|s| s.stats.transient_faults += 1)?;
            let why = if in_outage {
                "outage"
            } else {
                "503 service unavailable"
            };
            return Err(RemoteFault::Transient(format!("{}: {why}", self.name)));
        }
        let key = call.idempotency_key.clone();
        let undoes = call.undoes.clone();
        let refuse = permanent || faults.refuse_actions.contains(&call.action);
        let outcome = self.with_state(|s| {
            if let Some(first) = s.outcomes.get(&key) {
                return first.clone();
            }
            let outcome = if refuse {
                s.stats.permanent_faults += 1;
                Err(format!("{} refused {}", self.name, call.action))
            } else {
                *s.stats.effects.entry(key.clone()).or_default() += 1;
                s.stats.applied.push(key.clone());
                s.stats.requests.push(Applied {
                    key: key.clone(),
                    action: call.action.clone(),
                    input: call.input.clone(),
                });
                match &undoes {
                    Some(step_key) => {
                        if matches!(s.outcomes.get(step_key), Some(Ok(_))) {
                            *s.stats.net.entry(step_key.clone()).or_default() -= 1;
                        } else {
                            // Nothing to reverse: refuse the step's key from now on.
                            s.outcomes.insert(
                                step_key.clone(),
                                Err(format!("{} already undone", step_key)),
                            );
                        }
                    }
                    None => *s.stats.net.entry(key.clone()).or_default() += 1,
                }
                Ok(serde_json::json!({
                    "id": uuid::Uuid::new_v4().to_string(),
                    "service": self.name,
                    "action": call.action,
                }))
            };
            s.outcomes.insert(key.clone(), outcome.clone());
            outcome
        })?;
        match outcome {
            Ok(_) if lost => {
                self.with_state(|s| s.stats.transient_faults += 1)?;
                Err(RemoteFault::Transient(format!(
                    "{}: response lost",
                    self.name
                )))
            }
            Ok(v) => Ok(v),
            Err(e) => Err(RemoteFault::Refused {
                code: "refused".into(),
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
        }
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
        let now = Utc::now();
        let s = SimulatedService::new(
            "inventory",
            Faults {
                outage: Some((
                    now - chrono::Duration::seconds(1),
                    now + chrono::Duration::hours(1),
                )),
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
}
