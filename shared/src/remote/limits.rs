//! A service's limits as an agent keeps them ([`crate::domain::limits`]): before each call, a
//! slot of each concurrency limit and a token of each rate, through the state store, so every
//! agent instance keeps them together. A call over a limit is not made
//! ([`RemoteFault::Limited`]): the agent hands the step back, to come again when a slot or a
//! token is due.

use crate::domain::breaker::SLOW_CALL;
use crate::domain::limits::{Gate, Over, ServiceLimits};
use crate::domain::rate::Admission;
use crate::ports::{
    Clock, LimitStore, RateRequest, RemoteCall, RemoteFault, RemoteService, SlotAnswer, SlotRequest,
};
use async_trait::async_trait;
use std::sync::Arc;
use std::time::Duration;
use tracing::warn;

/// A remote behind its service's limits.
pub struct LimitedRemote {
    service: String,
    inner: Arc<dyn RemoteService>,
    limits: Option<ServiceLimits>,
    /// The concurrency of a service that declares none (the deployment's share of the agents).
    share: Option<u32>,
    store: Arc<dyn LimitStore>,
    clock: Arc<dyn Clock>,
    metrics: crate::metrics::Metrics,
    /// Whether the service is fast ([`crate::domain::Pace`]), if anything says: without a
    /// pacer every call under the share takes a slot.
    pacer: Option<Arc<dyn Pacer>>,
}

/// What a service's breaker knows of its pace ([`crate::domain::Pace`]), read with it.
#[async_trait]
pub trait Pacer: Send + Sync {
    /// Whether the service's calls take no slot of the share now.
    async fn is_fast(&self) -> bool;
    /// A call under the share ended within [`SLOW_CALL`] (`slow` false) or has outlived it.
    async fn paced(&self, slow: bool);
}

impl LimitedRemote {
    pub fn new(
        service: impl Into<String>,
        inner: Arc<dyn RemoteService>,
        (limits, share): (Option<ServiceLimits>, Option<u32>),
        store: Arc<dyn LimitStore>,
        clock: Arc<dyn Clock>,
        metrics: crate::metrics::Metrics,
    ) -> Self {
        Self {
            service: service.into(),
            inner,
            limits,
            share,
            store,
            clock,
            metrics,
            pacer: None,
        }
    }

    /// Takes the slots of the share only while `pacer` says the service is slow.
    pub fn with_pacer(mut self, pacer: Arc<dyn Pacer>) -> Self {
        self.pacer = Some(pacer);
        self
    }

    /// Takes the share's slot for a call that went out without one and has outlived
    /// [`SLOW_CALL`], however many are held (the call is out already): the calls after it
    /// count it. `None` if the store failed (the call then holds no slot, as before).
    async fn take_late(&self, gate: &Gate, holder: &str, timeout: Duration) -> Option<String> {
        let now = self.clock.now();
        let ask = SlotRequest {
            key: &gate.key,
            limit: u32::MAX,
            holder,
            now,
            until: lease_end(now, timeout),
        };
        match self.store.take_slot(ask).await {
            Ok(SlotAnswer::Taken) => Some(gate.key.clone()),
            Ok(SlotAnswer::Full { .. }) => None,
            Err(e) => {
                warn!(error = %e, key = %gate.key, "a slow call's slot could not be taken");
                None
            }
        }
    }

    /// Takes a slot of each concurrency gate, then a token of each rate (a token is spent
    /// only on a call that goes out: a refused slot costs none); on the first refusal gives
    /// back the slots taken and says why. `Ok`: the slots held (to free after the call).
    async fn enter(
        &self,
        gates: &[Gate],
        holder: &str,
        timeout: Duration,
    ) -> Result<Vec<String>, Over> {
        let now = self.clock.now();
        let until = lease_end(now, timeout);
        let mut held = vec![];
        for gate in gates {
            let Some(limit) = gate.concurrency else {
                continue;
            };
            let ask = SlotRequest {
                key: &gate.key,
                limit,
                holder,
                now,
                until,
            };
            let retry_after = match self.store.take_slot(ask).await {
                Ok(SlotAnswer::Taken) => {
                    held.push(gate.key.clone());
                    continue;
                }
                // A slot usually frees well before the lease's end (the call's deadline):
                // come back soon, not then.
                Ok(SlotAnswer::Full { next_free }) => {
                    (next_free - now).clamp(chrono::Duration::zero(), SLOT_RECHECK)
                }
                // The store cannot be read: the limit protects the service and cannot be kept
                // now, so the call waits rather than goes out unlimited.
                Err(e) => {
                    warn!(error = %e, key = %gate.key, "the slot store failed; the call waits");
                    SLOT_RECHECK
                }
            };
            self.leave(&held, holder).await;
            return Err(Over {
                key: gate.key.clone(),
                limit: format!("{limit} calls in flight"),
                rate: false,
                retry_after,
            });
        }
        for gate in gates {
            let Some(rate) = gate.rate else {
                continue;
            };
            // A rate past one item's share is split over items: this call goes to one of them
            // at random, against its part (as a caller's allowance is).
            let key =
                crate::domain::rate::shard_key(&gate.key, rand::random_range(0..rate.shards()));
            let answer = self
                .store
                .admit(RateRequest {
                    key: &key,
                    limit: &rate.per_shard(),
                    now,
                })
                .await;
            let retry_after = match answer {
                Ok(Admission::Admitted) => continue,
                Ok(Admission::Limited { retry_after }) => retry_after,
                Err(e) => {
                    warn!(error = %e, key = %gate.key, "the rate store failed; the call waits");
                    SLOT_RECHECK
                }
            };
            self.leave(&held, holder).await;
            return Err(Over {
                key: gate.key.clone(),
                limit: format!("{} calls a second", rate.per_second),
                rate: true,
                retry_after,
            });
        }
        Ok(held)
    }

    /// Frees the slots of `keys` that `holder` took. A failure leaves the lease to run out at
    /// the call's deadline (the slot is lost until then, never doubled).
    async fn leave(&self, keys: &[String], holder: &str) {
        for key in keys {
            if let Err(e) = self.store.free_slot(key, holder).await {
                warn!(error = %e, %key, "a slot could not be freed; it frees at its lease's end");
            }
        }
    }
}

/// When the slot lease of a call made at `now` with `timeout` ends: at the call's deadline, so
/// an agent that dies mid-call frees its slot by then.
fn lease_end(
    now: chrono::DateTime<chrono::Utc>,
    timeout: Duration,
) -> chrono::DateTime<chrono::Utc> {
    now + chrono::Duration::from_std(timeout).unwrap_or(chrono::Duration::zero())
}

/// The longest a call over a concurrency limit waits before it asks again.
pub const SLOT_RECHECK: chrono::Duration = chrono::Duration::seconds(1);

#[async_trait]
impl RemoteService for LimitedRemote {
    async fn call(
        &self,
        call: &RemoteCall,
        timeout: Duration,
    ) -> Result<serde_json::Value, RemoteFault> {
        let gates = ServiceLimits::gates(
            self.limits.as_ref(),
            &self.service,
            &call.action,
            self.share,
            &call.limit_keys,
        );
        if gates.is_empty() {
            return self.inner.call(call, timeout).await;
        }
        // The share's gate, if the service declares no concurrency: its slot is taken only
        // while the service is not marked fast.
        let share = gates.iter().find(|g| g.shared).cloned();
        let pacer = self.pacer.as_ref().filter(|_| share.is_some());
        let fast = match pacer {
            Some(p) => p.is_fast().await,
            None => false,
        };
        let entered: Vec<Gate> = if fast {
            gates
                .iter()
                .map(|g| Gate {
                    concurrency: g.concurrency.filter(|_| !g.shared),
                    ..g.clone()
                })
                .collect()
        } else {
            gates
        };
        // One holder per call: its lease is its own.
        let holder = format!("{:016x}", rand::random::<u64>());
        let mut held = match self.enter(&entered, &holder, timeout).await {
            Ok(held) => held,
            Err(over) => {
                self.metrics.count(
                    "LimitedCalls",
                    &[
                        ("Service", self.service.as_str()),
                        ("Limit", if over.rate { "rate" } else { "concurrency" }),
                    ],
                );
                return Err(RemoteFault::Limited {
                    until: self.clock.now() + over.retry_after,
                    limit: format!("{} over its limit of {}", over.key, over.limit),
                });
            }
        };
        let (Some(pacer), Some(share)) = (pacer, share) else {
            let answer = self.inner.call(call, timeout).await;
            self.leave(&held, &holder).await;
            return answer;
        };
        let out = self.inner.call(call, timeout);
        tokio::pin!(out);
        let answer = tokio::select! {
            answer = &mut out => {
                // A call the breaker turned away says nothing of the service's pace.
                if !matches!(answer, Err(RemoteFault::CircuitOpen { .. })) {
                    pacer.paced(false).await;
                }
                answer
            }
            () = tokio::time::sleep(SLOW_CALL.to_std().unwrap_or_default()) => {
                if fast && let Some(key) = self.take_late(&share, &holder, timeout).await {
                    held.push(key);
                }
                pacer.paced(true).await;
                out.await
            }
        };
        self.leave(&held, &holder).await;
        answer
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::TaskId;
    use crate::memory::MemoryStore;
    use crate::ports::{Breakers, Slots, SystemClock};
    use std::sync::atomic::{AtomicU32, Ordering};

    /// A service that takes `latency` and counts the calls in it at once.
    struct Busy {
        latency: Duration,
        now: AtomicU32,
        most: AtomicU32,
        fail: bool,
    }

    #[async_trait]
    impl RemoteService for Busy {
        async fn call(
            &self,
            _: &RemoteCall,
            _: Duration,
        ) -> Result<serde_json::Value, RemoteFault> {
            let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
            self.most.fetch_max(n, Ordering::SeqCst);
            tokio::time::sleep(self.latency).await;
            self.now.fetch_sub(1, Ordering::SeqCst);
            if self.fail {
                Err(RemoteFault::Transient("503".into()))
            } else {
                Ok(serde_json::json!({}))
            }
        }
    }

    fn busy(latency: Duration, fail: bool) -> Arc<Busy> {
        Arc::new(Busy {
            latency,
            now: AtomicU32::new(0),
            most: AtomicU32::new(0),
            fail,
        })
    }

    fn call(action: &str) -> RemoteCall {
        RemoteCall {
            service: "bank".into(),
            step: "s".into(),
            action: action.into(),
            idempotency_key: "k".into(),
            task_id: TaskId::new_random(),
            undoes: None,
            input: serde_json::json!({}),
            deadline: chrono::Utc::now() + chrono::Duration::seconds(30),
            callback: None,
            limit_keys: Default::default(),
        }
    }

    /// A clock that moves only when told to.
    #[derive(Default)]
    struct StoppedClock(std::sync::Mutex<Option<chrono::DateTime<chrono::Utc>>>);

    impl StoppedClock {
        fn advance(&self, by: chrono::Duration) {
            let now = self.now();
            if let Ok(mut at) = self.0.lock() {
                *at = Some(now + by);
            }
        }
    }

    impl Clock for StoppedClock {
        fn now(&self) -> chrono::DateTime<chrono::Utc> {
            let Ok(mut at) = self.0.lock() else {
                return chrono::Utc::now();
            };
            *at.get_or_insert_with(chrono::Utc::now)
        }
    }

    fn limited(
        inner: Arc<Busy>,
        limits: serde_json::Value,
        share: Option<u32>,
        store: Arc<MemoryStore>,
        clock: Arc<dyn Clock>,
    ) -> Arc<LimitedRemote> {
        let limits = serde_json::from_value(limits).expect("limits");
        Arc::new(LimitedRemote::new(
            "bank",
            inner,
            (limits, share),
            store,
            clock,
            crate::metrics::Metrics::off(),
        ))
    }

    #[tokio::test]
    async fn at_most_the_limits_calls_are_in_the_service_and_the_rest_come_back_soon() {
        let store = Arc::new(MemoryStore::new(1));
        let service = busy(Duration::from_millis(200), false);
        let remote = limited(
            service.clone(),
            serde_json::json!({"concurrency": 3, "actions": {"transfer": {"concurrency": 1}}}),
            None,
            store.clone(),
            Arc::new(SystemClock),
        );
        let calls = (0..10).map(|_| {
            let remote = remote.clone();
            async move { remote.call(&call("hold"), Duration::from_secs(5)).await }
        });
        let answers = futures::future::join_all(calls).await;
        let made = answers.iter().filter(|a| a.is_ok()).count();
        assert_eq!(made, 3, "{answers:?}");
        assert_eq!(service.most.load(Ordering::SeqCst), 3);
        for a in &answers {
            if let Err(RemoteFault::Limited { until, limit }) = a {
                assert!(
                    limit.contains("service#bank over its limit of 3"),
                    "{limit}"
                );
                assert!(*until <= chrono::Utc::now() + SLOT_RECHECK, "{until}");
            } else {
                assert!(a.is_ok(), "{a:?}");
            }
        }
        // Every slot came back with its call.
        assert_eq!(
            store
                .slots_held("service#bank", chrono::Utc::now())
                .await
                .ok(),
            Some(0)
        );
        // An action's own limit on top of the service's: one `transfer` at a time.
        let transfers = (0..3).map(|_| {
            let remote = remote.clone();
            async move { remote.call(&call("transfer"), Duration::from_secs(5)).await }
        });
        let answers = futures::future::join_all(transfers).await;
        assert_eq!(
            answers.iter().filter(|a| a.is_ok()).count(),
            1,
            "{answers:?}"
        );
        // A failed call gives its slot back too.
        let failing = limited(
            busy(Duration::ZERO, true),
            serde_json::json!({"concurrency": 1}),
            None,
            store.clone(),
            Arc::new(SystemClock),
        );
        for _ in 0..3 {
            let a = failing.call(&call("hold"), Duration::from_secs(5)).await;
            assert!(matches!(a, Err(RemoteFault::Transient(_))), "{a:?}");
        }
    }

    #[tokio::test]
    async fn a_rate_admits_its_burst_then_says_when_and_a_dead_holders_slot_frees_at_its_deadline()
    {
        let store = Arc::new(MemoryStore::new(1));
        // Stopped: the rate's arithmetic is exact whatever the machine's load (on a running
        // clock, 300 calls that take longer than a token's interval are admitted more).
        let clock = Arc::new(StoppedClock::default());
        let remote = limited(
            busy(Duration::ZERO, false),
            serde_json::json!({"rate": {"perSecond": 10, "burst": 2}}),
            None,
            store.clone(),
            clock.clone(),
        );
        let hold = call("hold");
        assert!(remote.call(&hold, Duration::from_secs(1)).await.is_ok());
        assert!(remote.call(&hold, Duration::from_secs(1)).await.is_ok());
        let before = clock.now();
        match remote.call(&hold, Duration::from_secs(1)).await {
            Err(RemoteFault::Limited { until, limit }) => {
                assert!(limit.contains("10 calls a second"), "{limit}");
                let wait = until - before;
                assert!(
                    wait > chrono::Duration::zero() && wait <= chrono::Duration::milliseconds(200),
                    "{wait}"
                );
            }
            other => panic!("the third call at once is over the rate: {other:?}"),
        }
        clock.advance(chrono::Duration::milliseconds(100));
        assert!(remote.call(&hold, Duration::from_secs(1)).await.is_ok());
        // A rate past one item's share is split: 250/s over 3 items, a burst of 2 each, so 6
        // calls at once (one item alone would admit 2).
        let busy_store = Arc::new(MemoryStore::new(1));
        let big = limited(
            busy(Duration::ZERO, false),
            serde_json::json!({"rate": {"perSecond": 250, "burst": 5}}),
            None,
            busy_store,
            clock.clone(),
        );
        let mut admitted = 0;
        for _ in 0..300 {
            admitted += usize::from(big.call(&hold, Duration::from_secs(1)).await.is_ok());
        }
        assert_eq!(admitted, 6);
        // No limits declared: the deployment's share caps the calls in flight. A holder that
        // died mid-call (its lease taken, never freed) holds the slot until its deadline.
        let shared = limited(
            busy(Duration::ZERO, false),
            serde_json::Value::Null,
            Some(1),
            store.clone(),
            clock.clone(),
        );
        let dead = SlotRequest {
            key: "service#bank",
            limit: 1,
            holder: "dead",
            now: clock.now(),
            until: clock.now() + chrono::Duration::seconds(2),
        };
        assert_eq!(store.take_slot(dead).await.ok(), Some(SlotAnswer::Taken));
        assert!(matches!(
            shared.call(&hold, Duration::from_secs(1)).await,
            Err(RemoteFault::Limited { .. })
        ));
        clock.advance(chrono::Duration::seconds(2));
        assert!(shared.call(&hold, Duration::from_secs(1)).await.is_ok());
    }

    /// The slots of the share held now.
    async fn held(store: &MemoryStore) -> u32 {
        store
            .slots_held("service#bank", chrono::Utc::now())
            .await
            .expect("slots readable")
    }

    /// One agent's remote of `bank` (no limits of its own, a share of 2) over `inner`, behind
    /// its own breaker (and so its own read cache) on the shared `store`.
    fn agent(
        inner: Arc<Busy>,
        store: &Arc<MemoryStore>,
        clock: &Arc<StoppedClock>,
    ) -> Arc<LimitedRemote> {
        let breaker = Arc::new(crate::remote::SharedBreaker::new(
            "bank",
            inner,
            store.clone(),
            crate::domain::BreakerPolicy::default(),
            clock.clone(),
        ));
        Arc::new(
            LimitedRemote::new(
                "bank",
                breaker.clone(),
                (None, Some(2)),
                store.clone(),
                clock.clone(),
                crate::metrics::Metrics::off(),
            )
            .with_pacer(breaker),
        )
    }

    /// Starts a call of `remote`; its answer.
    fn start(
        remote: &Arc<LimitedRemote>,
    ) -> tokio::task::JoinHandle<Result<serde_json::Value, RemoteFault>> {
        let remote = remote.clone();
        tokio::spawn(async move { remote.call(&call("hold"), Duration::from_secs(30)).await })
    }

    #[tokio::test(start_paused = true)]
    async fn a_fast_services_calls_take_no_slot_of_the_share_and_a_slow_call_takes_its_own() {
        use crate::domain::breaker::{PACE_SPELL, SLOW_CALL};
        let store = Arc::new(MemoryStore::new(1));
        let clock = Arc::new(StoppedClock::default());
        let fast = agent(busy(Duration::from_millis(100), false), &store, &clock);
        let pace = || async {
            store
                .get_breaker("bank")
                .await
                .expect("readable")
                .map(|b| b.pace)
                .unwrap_or_default()
        };
        // Never marked: presumed slow, its call takes a slot; ended fast, it marks the service.
        let first = start(&fast);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(
            held(&store).await,
            1,
            "a service not known fast takes its slot"
        );
        assert!(first.await.expect("joined").is_ok());
        assert_eq!(pace().await.fast_until, Some(clock.now() + PACE_SPELL));
        let second = start(&fast);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(held(&store).await, 0, "a fast service's call takes no slot");
        assert!(second.await.expect("joined").is_ok());
        // The service turns slow: three calls begun while it is marked fast go out (over the
        // share of 2); each takes its slot once it outlives SLOW_CALL, and marks it slow.
        let slow_service = busy(Duration::from_secs(3), false);
        let slow = agent(slow_service.clone(), &store, &clock);
        let outs: Vec<_> = (0..3).map(|_| start(&slow)).collect();
        let slow_call = SLOW_CALL.to_std().expect("positive");
        tokio::time::sleep(slow_call - Duration::from_millis(100)).await;
        assert_eq!(held(&store).await, 0);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            held(&store).await,
            3,
            "each slow call counted against the share"
        );
        assert_eq!(pace().await.fast_until, None, "no longer fast");
        assert_eq!(pace().await.slow_at, Some(clock.now()));
        // Another agent's call now finds the share full: the slow calls count.
        let other = agent(busy(Duration::from_millis(100), false), &store, &clock);
        assert!(matches!(
            start(&other).await.expect("joined"),
            Err(RemoteFault::Limited { .. })
        ));
        for out in outs {
            assert!(out.await.expect("joined").is_ok());
        }
        assert_eq!(held(&store).await, 0, "every slot came back with its call");
        // Slow within the spell: a fast call takes its slot and marks nothing.
        let during = start(&other);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(held(&store).await, 1);
        assert!(during.await.expect("joined").is_ok());
        assert_eq!(pace().await.fast_until, None);
        // A spell on, a fast call marks it fast again.
        clock.advance(PACE_SPELL + chrono::Duration::seconds(1));
        assert!(start(&other).await.expect("joined").is_ok());
        assert!(pace().await.is_fast(clock.now()));
        assert_eq!(slow_service.most.load(Ordering::SeqCst), 3);
    }
}
