//! Remote services as agents see them: the simulated service (in-process, with fault flags,
//! counting effects per idempotency key), the HTTP client for a real one, and a circuit
//! breaker that wraps either.

mod http;
mod simulated;

pub use self::http::{HttpRemote, router};
pub use simulated::{Faults, SimStats, SimulatedService};

use crate::domain::CircuitBreaker;
use crate::ports::{Clock, RemoteCall, RemoteFault, RemoteService};
use async_trait::async_trait;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A remote service behind a [`CircuitBreaker`]: while the breaker is open calls fail fast as
/// transient faults, so the agent's retry loop waits instead of hammering a service that is down.
pub struct Breakered {
    inner: Arc<dyn RemoteService>,
    breaker: Mutex<CircuitBreaker>,
    clock: Arc<dyn Clock>,
}

impl Breakered {
    pub fn new(
        inner: Arc<dyn RemoteService>,
        breaker: CircuitBreaker,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self {
            inner,
            breaker: Mutex::new(breaker),
            clock,
        }
    }

    fn with_breaker<T>(&self, f: impl FnOnce(&mut CircuitBreaker) -> T) -> Result<T, RemoteFault> {
        self.breaker
            .lock()
            .map(|mut b| f(&mut b))
            .map_err(|_| RemoteFault::Transient("circuit breaker lock poisoned".into()))
    }
}

#[async_trait]
impl RemoteService for Breakered {
    async fn call(
        &self,
        call: &RemoteCall,
        timeout: Duration,
    ) -> Result<serde_json::Value, RemoteFault> {
        let now = self.clock.now();
        if !self.with_breaker(|b| b.allow(now))? {
            return Err(RemoteFault::Transient("circuit open".into()));
        }
        let out = self.inner.call(call, timeout).await;
        let now = self.clock.now();
        match &out {
            Ok(_) | Err(RemoteFault::Permanent(_)) => self.with_breaker(|b| b.on_success())?,
            Err(RemoteFault::Transient(_)) => self.with_breaker(|b| b.on_transient_fault(now))?,
        }
        out
    }
}
