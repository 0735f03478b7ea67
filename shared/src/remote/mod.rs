//! Remote services as agents see them: the simulated service (in-process, with fault flags,
//! counting effects per idempotency key), the HTTP client and the Lambda invoker for real ones
//! (with the credentials HTTP services need), and a circuit breaker that wraps each.

mod callback;
mod credentials;
mod http;
mod lambda;
mod simulated;

pub use self::http::{
    CALLBACK_TOKEN_HEADER, CALLBACK_URL_HEADER, DEADLINE_HEADER, HttpRemote, IDEMPOTENCY_HEADER,
    STEP_HEADER, StatusClass, TASK_HEADER, UNDOES_HEADER, classify, client as http_client, outcome,
    render_path, router,
};
pub use callback::{CallbackCompleter, CallbackSink, HttpCallbackSink};
pub use credentials::{
    CachedCredentials, CredentialError, Credentials, DEFAULT_CACHE_TTL, MemoryCredentials, Secret,
};
pub use lambda::{LambdaRemote, api_fault, payload as lambda_payload};
pub use simulated::{Applied, Faults, SimStats, SimulatedService, seeded_unit};

use crate::catalog::{CatalogError, Definitions};
use crate::domain::{BreakerPolicy, BreakerRecord, BreakerState, Decision, Target};
use crate::ports::{Clock, EventBus, RemoteCall, RemoteFault, RemoteService, StateStore};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tracing::{error, info, warn};

/// Makes the simulated service of a name (the local runner hands out its own, with faults).
pub type SimulatedFactory = Arc<dyn Fn(&str) -> Arc<dyn RemoteService> + Send + Sync>;

/// Why no remote could be had for a service.
#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    #[error("service {0:?} is not in the catalog")]
    Unknown(String),
    #[error("service {service:?} is misconfigured: {problem}")]
    Misconfigured { service: String, problem: String },
    #[error(transparent)]
    Catalog(#[from] CatalogError),
}

/// The remote of every service an agent calls: built from the service's definition in the
/// catalog on first use (and again when the definition changes), behind the service's shared
/// circuit breaker.
pub struct Remotes {
    definitions: Arc<Definitions>,
    store: Arc<dyn StateStore>,
    breaker: BreakerPolicy,
    clock: Arc<dyn Clock>,
    connectors: Connectors,
    simulated: SimulatedFactory,
    built: Mutex<HashMap<String, Built>>,
    alerts: Option<Arc<dyn EventBus>>,
    metrics: crate::metrics::Metrics,
}

/// What real targets are reached with: the HTTP client (which must not follow redirects: see
/// [`http_client`]), the credentials of HTTP services, and the Lambda client (none: a Lambda
/// target is misconfigured in this process).
#[derive(Debug, Clone)]
pub struct Connectors {
    pub http: reqwest::Client,
    pub credentials: Arc<CachedCredentials>,
    pub lambda: Option<aws_sdk_lambda::Client>,
}

impl Connectors {
    /// An HTTP client that does not follow redirects, `credentials` kept for `ttl`, and
    /// `lambda`.
    pub fn new(
        credentials: Arc<dyn Credentials>,
        ttl: chrono::Duration,
        clock: Arc<dyn Clock>,
        lambda: Option<aws_sdk_lambda::Client>,
    ) -> Result<Self, reqwest::Error> {
        Ok(Self {
            http: http_client()?,
            credentials: Arc::new(CachedCredentials::new(credentials, ttl, clock)),
            lambda,
        })
    }
}

/// A service's remote and the target it was built for.
type Built = (Target, Arc<dyn RemoteService>);

impl Remotes {
    pub fn new(
        definitions: Arc<Definitions>,
        store: Arc<dyn StateStore>,
        breaker: BreakerPolicy,
        clock: Arc<dyn Clock>,
        simulated: SimulatedFactory,
        connectors: Connectors,
    ) -> Self {
        Self {
            definitions,
            store,
            breaker,
            clock,
            connectors,
            simulated,
            built: Mutex::new(HashMap::new()),
            alerts: None,
            metrics: crate::metrics::Metrics::off(),
        }
    }

    /// Counts each breaker transition this process's writes make (`BreakerTransitions`).
    pub fn with_metrics(mut self, metrics: crate::metrics::Metrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// Publishes the operator alert `ServiceUnavailable` on `bus` whenever a service's breaker
    /// opens.
    pub fn with_alerts(mut self, bus: Arc<dyn EventBus>) -> Self {
        self.alerts = Some(bus);
        self
    }

    /// The remote of `service`, behind its breaker.
    pub async fn get(&self, service: &str) -> Result<Arc<dyn RemoteService>, LookupError> {
        let services = self.definitions.services().await?;
        let def = services
            .get(service)
            .ok_or_else(|| LookupError::Unknown(service.to_owned()))?;
        if let Some((target, remote)) = self.built.lock().ok().and_then(|m| m.get(service).cloned())
            && target == def.target
        {
            return Ok(remote);
        }
        let inner: Arc<dyn RemoteService> = match &def.target {
            Target::Simulated => (self.simulated)(service),
            Target::Http(target) => Arc::new(
                HttpRemote::new(
                    self.connectors.http.clone(),
                    target,
                    self.connectors.credentials.clone(),
                )
                .map_err(|problem| LookupError::Misconfigured {
                    service: service.to_owned(),
                    problem,
                })?,
            ),
            Target::Lambda(target) => match &self.connectors.lambda {
                Some(client) => Arc::new(LambdaRemote::new(client.clone(), target)),
                None => {
                    return Err(LookupError::Misconfigured {
                        service: service.to_owned(),
                        problem: "this process has no Lambda client".into(),
                    });
                }
            },
        };
        let mut breaker = SharedBreaker::new(
            service,
            inner,
            self.store.clone(),
            self.breaker,
            self.clock.clone(),
        );
        breaker.alerts = self.alerts.clone();
        breaker.metrics = self.metrics.clone();
        let remote: Arc<dyn RemoteService> = Arc::new(breaker);
        if let Ok(mut m) = self.built.lock() {
            m.insert(service.to_owned(), (def.target.clone(), remote.clone()));
        }
        Ok(remote)
    }
}

/// A remote service behind its shared circuit breaker (a [`BreakerRecord`] in the state store,
/// moved by conditional writes, so every agent instance sees the same breaker). While it is
/// open no call is made and the call fails with [`RemoteFault::CircuitOpen`]; the agent then
/// waits or defers the step instead of hammering a service that is down. If the store cannot be
/// read the call goes ahead (the breaker protects the service; it must not stop work when the
/// store hiccups).
pub struct SharedBreaker {
    name: String,
    inner: Arc<dyn RemoteService>,
    store: Arc<dyn StateStore>,
    policy: BreakerPolicy,
    clock: Arc<dyn Clock>,
    /// Where the opening of the breaker is announced (`ServiceUnavailable`), if anywhere.
    pub alerts: Option<Arc<dyn EventBus>>,
    /// Where its transitions are counted.
    pub metrics: crate::metrics::Metrics,
}

/// The detail-type of the alert published when a service's breaker opens.
pub const SERVICE_UNAVAILABLE: &str = "ServiceUnavailable";

impl SharedBreaker {
    pub fn new(
        name: impl Into<String>,
        inner: Arc<dyn RemoteService>,
        store: Arc<dyn StateStore>,
        policy: BreakerPolicy,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self {
            name: name.into(),
            inner,
            store,
            policy,
            clock,
            alerts: None,
            metrics: crate::metrics::Metrics::off(),
        }
    }

    /// Counts a transition this agent's write made.
    fn count_transition(&self, to: &BreakerState) {
        let to = match to {
            BreakerState::Closed { .. } => "closed",
            BreakerState::Open { .. } => "open",
            BreakerState::HalfOpen { .. } => "half-open",
            BreakerState::Paused { .. } => "paused",
        };
        self.metrics.count(
            "BreakerTransitions",
            &[("Service", self.name.as_str()), ("To", to)],
        );
    }

    /// Announces that this agent's write opened the breaker (one alert per opening: only one
    /// agent's conditional write moves it), with the fault that tipped it over.
    async fn alert_opened(&self, until: DateTime<Utc>, fault: Option<&RemoteFault>) {
        let Some(bus) = &self.alerts else { return };
        let kind = match fault {
            Some(RemoteFault::Misconfigured(_)) => "misconfigured",
            _ => "unavailable",
        };
        let error: String = fault
            .map(|f| f.to_string())
            .unwrap_or_default()
            .chars()
            .take(300)
            .collect();
        let detail = serde_json::json!({
            "service": self.name,
            "kind": kind,
            "error": error,
            "openUntil": until.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        });
        if let Err(e) = bus.publish(SERVICE_UNAVAILABLE, &detail).await {
            warn!(service = %self.name, error = %e, "ServiceUnavailable alert not published");
        }
    }

    /// Announces that this agent's write paused the service automatically (its breaker stayed
    /// open past `pause_after`): an operator must resume it.
    async fn alert_paused(&self, note: &str) {
        let Some(bus) = &self.alerts else { return };
        let detail = serde_json::json!({
            "service": self.name,
            "kind": "paused",
            "error": note,
        });
        if let Err(e) = bus.publish(SERVICE_UNAVAILABLE, &detail).await {
            warn!(service = %self.name, error = %e, "ServiceUnavailable alert not published");
        }
    }

    async fn current(&self) -> Option<BreakerRecord> {
        match self.store.get_breaker(&self.name).await {
            Ok(b) => Some(b.unwrap_or_else(|| BreakerRecord::closed(&self.name))),
            Err(e) => {
                warn!(service = %self.name, error = %e, "circuit breaker unreadable; calling anyway");
                None
            }
        }
    }

    /// Records the call's outcome; on a lost race, once more from a fresh read.
    async fn record(&self, mut base: BreakerRecord, fault: Option<&RemoteFault>) {
        let healthy = fault.is_none();
        for _ in 0..2 {
            let next = if healthy {
                base.on_success()
            } else {
                base.on_fault(self.clock.now(), &self.policy)
            };
            let Some(next) = next else { return };
            match self.store.put_breaker(&next).await {
                Ok(true) => {
                    if std::mem::discriminant(&next.state) != std::mem::discriminant(&base.state) {
                        self.count_transition(&next.state);
                    }
                    if next.is_closed() != base.is_closed() {
                        info!(service = %self.name, state = ?next.state, "circuit breaker moved");
                    }
                    if next.is_paused() && !base.is_paused() {
                        error!(service = %self.name, note = ?next.note, "service paused automatically: operator alert");
                        self.alert_paused(next.note.as_deref().unwrap_or_default())
                            .await;
                    }
                    if let (true, BreakerState::Open { until }) = (base.is_closed(), &next.state) {
                        error!(service = %self.name, %until, error = ?fault.map(ToString::to_string), "circuit breaker opened: operator alert");
                        self.alert_opened(*until, fault).await;
                    }
                    return;
                }
                Ok(false) => match self.current().await {
                    Some(fresh) => base = fresh,
                    None => return,
                },
                Err(e) => {
                    warn!(service = %self.name, error = %e, "circuit breaker not updated");
                    return;
                }
            }
        }
    }
}

#[async_trait]
impl RemoteService for SharedBreaker {
    async fn call(
        &self,
        call: &RemoteCall,
        timeout: Duration,
    ) -> Result<serde_json::Value, RemoteFault> {
        let now = self.clock.now();
        let Some(current) = self.current().await else {
            return self.inner.call(call, timeout).await;
        };
        let base = match current.decide(now, &self.policy) {
            Decision::Call => current,
            Decision::Reject { retry_at } => {
                return Err(RemoteFault::CircuitOpen { until: retry_at });
            }
            // Condition (the version): one agent wins each probe of the budget.
            Decision::Probe(next) => match self.store.put_breaker(&next).await {
                Ok(true) => {
                    info!(service = %self.name, "circuit half-open: probing");
                    self.count_transition(&next.state);
                    next
                }
                Ok(false) => {
                    return Err(RemoteFault::CircuitOpen {
                        until: now + self.policy.probe_window,
                    });
                }
                Err(e) => {
                    warn!(service = %self.name, error = %e, "probe not recorded; calling anyway");
                    current
                }
            },
        };
        let out = self.inner.call(call, timeout).await;
        let fault = out.as_ref().err().filter(|f| f.is_unhealthy());
        self.record(base, fault).await;
        out
    }
}
