//! Hosts the four functions' handlers in one process, as Lambda would run them: the HTTP API
//! for submission (axum instead of API Gateway), event-source mappings that poll the queues and
//! hand SQS batches to the scheduler and agents (deleting what the partial batch response does
//! not report), and a timer that invokes the supervisor with scheduled events. The local runner
//! (`sas-local`) and the black-box tests use it, on in-memory adapters or on AWS APIs.

use crate::provision::{self, QueueSettings, Resources};
use crate::sqlite::SqliteStore;
use crate::{auth, guard};
use aws_lambda_events::event::eventbridge::EventBridgeEvent;
use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use sas::api::{self, ApiDeps, MAX_BODY_BYTES};
use sas::auth::Identity;
use sas::aws::{DynamoStore, EventBridgeBus, S3Payloads, SqsQueue};
use sas::catalog::{self, Definitions};
use sas::domain::task::ReplyQueues;
use sas::domain::{Backoff, BreakerPolicy, Policy};
use sas::handlers::TaskPorts;
use sas::handlers::agent::{self, AgentDeps};
use sas::handlers::scheduler::{self, SchedulerDeps};
use sas::handlers::supervisor::{self, SupervisorDeps, SweepReport};
use sas::memory::{
    FairShare, MemoryEventBus, MemoryPayloads, MemoryQueues, MemoryStore, QueueConfig,
};
use sas::messages::{ScheduledRun, SchedulerMessage};
use sas::ports::{
    Catalog, Clock, EventBus, Payloads, Queue, ReceiveRequest, ReceivedMessage, RemoteService,
    StateStore,
};
use sas::remote::{
    CachedCredentials, Connectors, Credentials, Faults, MemoryCredentials, Remotes,
    ScopedCredentials, SimulatedService,
};
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{error, info};

/// The in-memory adapters, kept typed so that tests and the demo can look inside.
pub type MemoryPorts = (Arc<MemoryStore>, Arc<MemoryQueues>, Arc<MemoryEventBus>);

/// The ports a [`System`] runs on, before it is built: [`ports`] makes them from a [`Backend`],
/// and a caller may wrap them (the chaos harness adds failpoints, the benchmark counts calls)
/// before [`System::from_ports`].
pub struct Ports {
    pub store: Arc<dyn StateStore>,
    pub catalog: Arc<dyn Catalog>,
    pub queue: Arc<dyn Queue>,
    pub events: Arc<dyn EventBus>,
    /// Where payloads too large for a task's items are kept.
    pub payloads: Arc<dyn Payloads>,
    pub resources: Resources,
    pub memory: Option<MemoryPorts>,
}

/// The AWS adapters on `resources`.
pub fn aws_ports(
    config: &aws_config::SdkConfig,
    resources: Resources,
    shards: u32,
    retention: Option<chrono::Duration>,
) -> Ports {
    aws_ports_from(
        AwsClients {
            dynamodb: aws_sdk_dynamodb::Client::new(config),
            sqs: aws_sdk_sqs::Client::new(config),
            eventbridge: aws_sdk_eventbridge::Client::new(config),
            s3: sas::aws::s3_client(config),
        },
        resources,
        shards,
        retention,
    )
}

/// The SDK clients the AWS ports use (a test may add interceptors to them).
pub struct AwsClients {
    pub dynamodb: aws_sdk_dynamodb::Client,
    pub sqs: aws_sdk_sqs::Client,
    pub eventbridge: aws_sdk_eventbridge::Client,
    /// For the payloads: path-style addressing on an emulator ([`sas::aws::s3_client`]).
    pub s3: aws_sdk_s3::Client,
}

/// The AWS adapters on `resources`, over the given clients.
pub fn aws_ports_from(
    clients: AwsClients,
    resources: Resources,
    shards: u32,
    retention: Option<chrono::Duration>,
) -> Ports {
    let store = Arc::new(
        DynamoStore::new(clients.dynamodb, &resources.table, shards).with_retention(retention),
    );
    let queue = Arc::new(SqsQueue::new(clients.sqs));
    let events = Arc::new(EventBridgeBus::new(
        clients.eventbridge,
        &resources.bus_name,
    ));
    let payloads = Arc::new(S3Payloads::new(clients.s3, &resources.payload_bucket));
    Ports {
        catalog: store.clone(),
        store,
        queue,
        events,
        payloads,
        resources,
        memory: None,
    }
}

/// Makes (and, for [`Backend::Aws`], provisions) the ports of `backend`.
pub async fn ports(backend: Backend, settings: &Settings) -> anyhow::Result<Ports> {
    // Visibility at least 6x the longest handler run, as for Lambda event sources.
    let visibility = settings.visibility_timeout.unwrap_or(Duration::from_secs(
        (settings.policy.step_timeout.num_seconds().max(5) * 6) as u64,
    ));
    Ok(match backend {
        Backend::Memory => {
            let store = Arc::new(
                MemoryStore::new(settings.due_shards)
                    .with_retention(settings.retention)
                    .with_index_lag(settings.index_lag),
            );
            let (queues, events, resources) = memory_queues(visibility, settings.fair_share);
            Ports {
                catalog: store.clone(),
                store: store.clone(),
                queue: queues.clone(),
                events: events.clone(),
                payloads: Arc::new(MemoryPayloads::new()),
                resources,
                memory: Some((store, queues, events)),
            }
        }
        Backend::Data(dir) => {
            let store = Arc::new(SqliteStore::open(
                &dir,
                settings.due_shards,
                settings.retention,
            )?);
            let (queues, events, resources) = memory_queues(visibility, settings.fair_share);
            Ports {
                catalog: store.clone(),
                store,
                queue: queues,
                events,
                // Beside the store: `DIR/payloads/`.
                payloads: Arc::new(crate::files::FilePayloads::under(&dir)),
                resources,
                memory: None,
            }
        }
        Backend::Aws { config, prefix } => {
            let queues = QueueSettings {
                visibility_timeout_secs: visibility.as_secs().max(1) as u32,
                max_receive_count: 5,
            };
            let resources = provision::provision(&config, &prefix, queues).await?;
            aws_ports(&config, resources, settings.due_shards, settings.retention)
        }
        Backend::Existing { config, resources } => {
            aws_ports(&config, *resources, settings.due_shards, settings.retention)
        }
    })
}

/// In-memory queues (work, replies, timers, agent, with a dead-letter queue) and event bus,
/// and the resources naming them.
fn memory_queues(
    visibility: Duration,
    fair: FairShare,
) -> (Arc<MemoryQueues>, Arc<MemoryEventBus>, Resources) {
    let queues = Arc::new(MemoryQueues::new());
    let events = Arc::new(MemoryEventBus::default());
    let dlq = queues.create_queue("dlq", QueueConfig::default());
    let q = |name: &str| {
        queues.create_queue(
            name,
            QueueConfig {
                visibility_timeout: visibility,
                max_receive_count: Some(5),
                dead_letter_url: Some(dlq.clone()),
                fifo: false,
                fair,
            },
        )
    };
    let resources = Resources {
        table: "memory".into(),
        work_queue_url: q("work"),
        reply_queue_url: q("replies"),
        timer_queue_url: q("timers"),
        agent_queue_url: q("agent"),
        urgent_work_queue_url: Some(q("work-urgent")),
        urgent_agent_queue_url: Some(q("agent-urgent")),
        dead_letter_url: dlq.clone(),
        agent_dead_letter_url: None,
        bus_name: "memory".into(),
        payload_bucket: "memory".into(),
        ends_queue_url: Some(queues.create_queue(
            "ends.fifo",
            QueueConfig {
                visibility_timeout: visibility,
                max_receive_count: Some(5),
                dead_letter_url: Some(queues.create_queue(
                    "ends-dlq.fifo",
                    QueueConfig {
                        fifo: true,
                        ..QueueConfig::default()
                    },
                )),
                fifo: true,
                fair: FairShare::default(),
            },
        )),
    };
    (queues, events, resources)
}

/// Where the ports point.
#[derive(Clone)]
pub enum Backend {
    /// In-memory adapters: no setup at all.
    Memory,
    /// The state store and catalog kept in this folder ([`SqliteStore`], `sas-local --data`),
    /// the queues and event bus in memory: a restart loses queued messages, and the
    /// supervisor's sweep of the due index recovers every task they were for.
    Data(std::path::PathBuf),
    /// The AWS adapters on whatever `config` points at (`AWS_ENDPOINT_URL`); resources named
    /// with `prefix` are created if missing.
    Aws {
        config: Box<aws_config::SdkConfig>,
        prefix: String,
    },
    /// The AWS adapters on resources that already exist (e.g. created from `template.yaml`).
    Existing {
        config: Box<aws_config::SdkConfig>,
        resources: Box<Resources>,
    },
}

/// How the local system behaves.
#[derive(Debug, Clone)]
pub struct Settings {
    pub policy: Policy,
    pub backoff: Backoff,
    pub due_shards: u32,
    /// Faults of each simulated service (by service name)...
    pub faults: HashMap<String, Faults>,
    /// ...and of every service not named there.
    pub default_faults: Faults,
    /// The definitions published when the system is built (file name, text): services and
    /// workflows. Default: the examples in `workflows/`.
    pub definitions: Vec<(String, String)>,
    /// How long the newest version of a workflow, and the services, are kept in memory (as
    /// `CATALOG_CACHE_SECONDS` in a deployment). Publishing through this system's API clears
    /// what it changed at once; another process's publication shows after this long.
    pub catalog_ttl: chrono::Duration,
    /// Pollers of the agent queue (Lambda scales agents out the same way).
    pub agent_concurrency: usize,
    /// The most calls in flight of a service that declares no `concurrency` (as
    /// `SERVICE_SHARE`; `None`: no cap).
    pub service_share: Option<u32>,
    /// Pollers per scheduler queue.
    pub scheduler_concurrency: usize,
    /// Pollers of each urgent lane's queue (the scheduler's and the agents'), beside the
    /// normal lane's (as the template's urgent mappings have a concurrency of their own).
    pub urgent_concurrency: usize,
    /// When the in-memory queues count a tenant noisy (default: as SQS fair queues do).
    pub fair_share: FairShare,
    /// How often the supervisor sweeps.
    pub supervisor_interval: Duration,
    /// Largest SQS batch handed to a handler.
    pub batch_size: u32,
    /// Long-poll wait of each receive.
    pub poll_wait: Duration,
    /// The agents' shared circuit breakers (one per service, in the state store).
    pub breaker: BreakerPolicy,
    /// Arm a deadline timer with every step request (off: only the sweep finds deadlines).
    pub deadline_timers: bool,
    /// Whether the task API claims a new task's first step and sends its request itself (as
    /// `DISPATCH_AT_SUBMISSION`; default true).
    pub dispatch_at_submission: bool,
    /// The queues' visibility timeout (memory, and queues `Backend::Aws` creates); default 6×
    /// the step timeout, as for Lambda event sources.
    pub visibility_timeout: Option<Duration>,
    /// The task API's address as callback steps' services see it (`sas-local` sets its listen
    /// address); the simulated services post their callbacks in process whatever it is.
    pub callback_base_url: String,
    /// How long a simulated service works on a callback step before it calls back.
    pub callback_delay: Duration,
    /// Where the simulated services record the callbacks they post (none: not recorded).
    pub callback_log: Option<sas::remote::CallbackLog>,
    /// Where HTTP services' credentials are read (default: none, in memory), and how long they
    /// are kept (as `CREDENTIALS_CACHE_SECONDS`).
    pub credentials: Arc<dyn Credentials>,
    pub credentials_ttl: chrono::Duration,
    /// The client Lambda services are invoked with (none: a Lambda service is misconfigured).
    pub lambda: Option<aws_sdk_lambda::Client>,
    /// How the task API authenticates (default none: every request is `anonymous`).
    pub api_auth: auth::LocalAuth,
    /// How the operator API (under `/operator`) authenticates (default none).
    pub operator_auth: auth::LocalAuth,
    /// The reply queues callers may name (default: the backend's queues named
    /// [`LOCAL_REPLY_PREFIX`]`*`).
    pub reply_queues: Option<ReplyQueues>,
    /// Each caller's allowance on the task API (default: none).
    pub rate_limit: Option<sas::domain::rate::RateLimit>,
    /// How long a final task is kept (as `RETENTION_DAYS`; default 90 days, `None`: for good).
    pub retention: Option<chrono::Duration>,
    /// In memory: the most a write takes to reach the indexes (`None`: at once), as
    /// DynamoDB's eventually consistent GSIs (see [`MemoryStore::with_index_lag`]).
    pub index_lag: Option<Duration>,
    /// The agent's longest service call (as `CALL_TIMEOUT_MS`).
    pub call_timeout: Duration,
    /// How the supervisor's sweep pages (as `SWEEP_*`) and its shard leases' TTL (as
    /// `LEASE_SECONDS`).
    pub sweep: supervisor::SweepSettings,
    pub lease_ttl: chrono::Duration,
    /// The only secrets and SSM parameters services' credentials may be read from (names under
    /// this prefix), as the template's `SecretsPrefix` lets the agent's role read (`None`: any).
    pub secrets_prefix: Option<String>,
    /// Host names the HTTP API answers besides loopback and its bound address.
    pub allowed_hosts: Vec<String>,
}

/// The name prefix of the reply queues the local runner allows by default.
pub const LOCAL_REPLY_PREFIX: &str = "sasreply-local--";

/// The default reply-queue pattern of a backend: its queues' URL base (that of the work queue)
/// and [`LOCAL_REPLY_PREFIX`].
pub fn local_reply_queues(work_queue_url: &str) -> ReplyQueues {
    let base = work_queue_url
        .rsplit_once('/')
        .map_or(work_queue_url, |(b, _)| b);
    ReplyQueues::parse(&format!("{base}/{LOCAL_REPLY_PREFIX}*")).unwrap_or_default()
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            policy: Policy {
                step_timeout: chrono::Duration::seconds(5),
                start_within: chrono::Duration::zero(),
                pickup_timeout: chrono::Duration::seconds(10),
                failure_threshold: 3,
                retry_base_delay: chrono::Duration::seconds(1),
                backoff_rate: 2.0,
                retry_max_delay: chrono::Duration::seconds(30),
                auto_compensate: true,
                cooldown: chrono::Duration::seconds(30),
                max_rounds: 0,
                callback: None,
                wait: false,
                event: false,
                // For the in-process harnesses (the chaos run, the benchmark), whose simulated
                // services commit within the call: a short wait. `sas-local` does not use it:
                // `from_vars` makes it CALL_TIMEOUT_MS + UNDO_MARGIN_SECONDS, as a stack does.
                undo_wait: chrono::Duration::seconds(2),
                undo_timeout: None,
                progress_events: false,
            },
            backoff: Backoff {
                base: chrono::Duration::milliseconds(20),
                cap: chrono::Duration::milliseconds(500),
            },
            due_shards: 4,
            faults: HashMap::new(),
            default_faults: Faults::default(),
            definitions: catalog::example_files(),
            catalog_ttl: chrono::Duration::seconds(5),
            agent_concurrency: 8,
            service_share: None,
            scheduler_concurrency: 2,
            urgent_concurrency: 1,
            fair_share: FairShare::default(),
            supervisor_interval: Duration::from_secs(1),
            batch_size: 10,
            poll_wait: Duration::from_secs(1),
            breaker: BreakerPolicy {
                threshold: 20,
                cooldown: chrono::Duration::milliseconds(500),
                probes: 1,
                probe_window: chrono::Duration::seconds(2),
                pause_after: None,
                // Shorter than the cooldown, so the cache is exercised and stays honest.
                read_cache: chrono::Duration::milliseconds(200),
            },
            deadline_timers: true,
            dispatch_at_submission: true,
            visibility_timeout: None,
            callback_base_url: "http://sas-local.invalid".into(),
            callback_delay: Duration::from_millis(50),
            callback_log: None,
            credentials: Arc::new(MemoryCredentials::default()),
            credentials_ttl: sas::remote::DEFAULT_CACHE_TTL,
            lambda: None,
            api_auth: auth::LocalAuth::None,
            operator_auth: auth::LocalAuth::None,
            reply_queues: None,
            rate_limit: None,
            retention: Some(chrono::Duration::days(90)),
            index_lag: None,
            call_timeout: Duration::from_secs(10),
            // Below the 30 s lease.
            sweep: supervisor::SweepSettings {
                budget: chrono::Duration::seconds(20),
                ..supervisor::SweepSettings::default()
            },
            lease_ttl: chrono::Duration::seconds(30),
            secrets_prefix: None,
            allowed_hosts: Vec::new(),
        }
    }
}

/// The secrets prefix `sas-local` applies unless told otherwise: the template's default
/// `SecretsPrefix` for its default stage (`sas/<Stage>/`, `dev`).
pub const LOCAL_SECRETS_PREFIX: &str = "sas/dev/";

/// `UNDO_MARGIN_SECONDS` in `sas-local` unless set: one process, one clock, no skew.
pub const LOCAL_UNDO_MARGIN: chrono::Duration = chrono::Duration::zero();

impl Settings {
    /// `sas-local`'s settings from the variables the functions read, parsed by the same
    /// functions ([`sas::config`]), with the local defaults ([`Settings::default`]) for what
    /// is unset; the undo wait is `CALL_TIMEOUT_MS` + `UNDO_MARGIN_SECONDS` (default
    /// [`LOCAL_UNDO_MARGIN`]) as in a stack, and credentials are read only under
    /// [`LOCAL_SECRETS_PREFIX`]. Resource names (`TABLE_NAME`, the queue URLs, ...) are not
    /// read: `sas-local` has its own.
    pub fn from_vars(vars: &sas::config::Vars) -> Result<Self, sas::config::ConfigError> {
        use sas::config;
        let d = Self::default();
        let call_timeout = config::call_timeout_in(vars, d.call_timeout)?;
        let policy = config::policy_in(
            vars,
            &config::PolicyDefaults {
                policy: d.policy.clone(),
                call_timeout: d.call_timeout,
                undo_margin: LOCAL_UNDO_MARGIN,
            },
        )?;
        let lease_ttl =
            chrono::Duration::seconds(vars.parsed("LEASE_SECONDS", d.lease_ttl.num_seconds())?);
        Ok(Self {
            policy,
            call_timeout,
            backoff: config::backoff_in(vars, d.backoff)?,
            breaker: config::breaker_in(vars, d.breaker)?,
            service_share: config::service_share_in(vars, d.service_share)?,
            catalog_ttl: config::catalog_ttl_in(vars, d.catalog_ttl)?,
            credentials_ttl: config::credentials_ttl_in(vars, d.credentials_ttl)?,
            retention: config::retention_in(vars, d.retention)?,
            // Off unless asked for (the flags or the variables).
            rate_limit: config::rate_limit_in(vars, 0.0, 100)?,
            due_shards: vars.parsed("DUE_SHARDS", d.due_shards)?.max(1),
            deadline_timers: vars.parsed("DEADLINE_TIMERS", d.deadline_timers)?,
            dispatch_at_submission: vars
                .parsed("DISPATCH_AT_SUBMISSION", d.dispatch_at_submission)?,
            reply_queues: config::reply_queues_in(vars)?,
            sweep: config::sweep_settings_in(vars, lease_ttl, d.sweep)?,
            lease_ttl,
            secrets_prefix: Some(LOCAL_SECRETS_PREFIX.to_owned()),
            ..d
        })
    }

    /// The effective values of the variables [`Settings::from_vars`] reads, by name, as
    /// `sas-local` prints them at start.
    pub fn describe(&self) -> Vec<(&'static str, String)> {
        let secs = |d: chrono::Duration| format!("{}", d.num_milliseconds() as f64 / 1000.0);
        let ms = |d: chrono::Duration| d.num_milliseconds().to_string();
        let p = &self.policy;
        let undo_margin =
            p.undo_wait - chrono::Duration::milliseconds(self.call_timeout.as_millis() as i64);
        vec![
            ("STEP_TIMEOUT_SECONDS", secs(p.step_timeout)),
            ("START_WITHIN_SECONDS", secs(p.start_within)),
            ("PICKUP_TIMEOUT_SECONDS", secs(p.pickup_timeout)),
            ("FAILURE_THRESHOLD", p.failure_threshold.to_string()),
            ("RETRY_BASE_DELAY_SECONDS", secs(p.retry_base_delay)),
            ("RETRY_BACKOFF_RATE", p.backoff_rate.to_string()),
            ("RETRY_MAX_DELAY_SECONDS", secs(p.retry_max_delay)),
            ("AUTO_COMPENSATE", p.auto_compensate.to_string()),
            ("COOLDOWN_SECONDS", secs(p.cooldown)),
            ("MAX_ROUNDS", p.max_rounds.to_string()),
            ("PROGRESS_EVENTS", p.progress_events.to_string()),
            ("CALL_TIMEOUT_MS", self.call_timeout.as_millis().to_string()),
            ("UNDO_MARGIN_SECONDS", secs(undo_margin)),
            ("BACKOFF_BASE_MS", ms(self.backoff.base)),
            ("BACKOFF_CAP_MS", ms(self.backoff.cap)),
            ("SERVICE_SHARE", self.service_share.unwrap_or(0).to_string()),
            ("BREAKER_THRESHOLD", self.breaker.threshold.to_string()),
            ("BREAKER_COOLDOWN_MS", ms(self.breaker.cooldown)),
            ("BREAKER_PROBES", self.breaker.probes.to_string()),
            ("BREAKER_PROBE_WINDOW_MS", ms(self.breaker.probe_window)),
            (
                "BREAKER_PAUSE_AFTER_SECONDS",
                self.breaker
                    .pause_after
                    .map_or(0, |d| d.num_seconds())
                    .to_string(),
            ),
            ("BREAKER_CACHE_MS", ms(self.breaker.read_cache)),
            ("CATALOG_CACHE_SECONDS", secs(self.catalog_ttl)),
            (
                "CREDENTIALS_CACHE_SECONDS",
                self.credentials_ttl.num_seconds().to_string(),
            ),
            (
                "RETENTION_DAYS",
                self.retention.map_or(0, |d| d.num_days()).to_string(),
            ),
            (
                "CALLER_RATE_PER_SECOND",
                self.rate_limit.map_or(0.0, |r| r.per_second).to_string(),
            ),
            (
                "CALLER_BURST",
                self.rate_limit.map_or(100, |r| r.burst).to_string(),
            ),
            ("DUE_SHARDS", self.due_shards.to_string()),
            ("DEADLINE_TIMERS", self.deadline_timers.to_string()),
            (
                "DISPATCH_AT_SUBMISSION",
                self.dispatch_at_submission.to_string(),
            ),
            ("SWEEP_PAGE_SIZE", self.sweep.page_size.to_string()),
            ("SWEEP_CONCURRENCY", self.sweep.concurrency.to_string()),
            ("SWEEP_BUDGET_SECONDS", secs(self.sweep.budget)),
            ("LEASE_SECONDS", self.lease_ttl.num_seconds().to_string()),
        ]
    }
}

/// Posts the simulated services' callbacks straight to the task API's handler, in process (the
/// URL's path is the route; its host is not used).
struct LocalCallbackSink(ApiDeps);

#[async_trait::async_trait]
impl sas::remote::CallbackSink for LocalCallbackSink {
    async fn post(&self, url: &str, body: &serde_json::Value) -> Result<u16, String> {
        let path = url::Url::parse(url)
            .map(|u| u.path().to_owned())
            .map_err(|e| e.to_string())?;
        // The callback route authenticates by its token, whoever posts.
        let answer = api::handle(
            &self.0,
            &Identity::Unauthenticated("a service's callback".into()),
            &http::Method::POST,
            &path,
            &http::HeaderMap::new(),
            body.to_string().as_bytes(),
        )
        .await;
        Ok(answer.status().as_u16())
    }
}

/// The simulated services of a system, made on first use with their faults from the settings.
#[derive(Clone)]
pub struct Simulated {
    faults: HashMap<String, Faults>,
    default_faults: Faults,
    clock: Arc<dyn Clock>,
    made: Arc<Mutex<HashMap<String, Arc<SimulatedService>>>>,
}

impl Simulated {
    /// The simulated service `name` (made now if it is not yet).
    pub fn get(&self, name: &str) -> Arc<SimulatedService> {
        let Ok(mut made) = self.made.lock() else {
            return Arc::new(SimulatedService::new(
                name,
                Faults::default(),
                self.clock.clone(),
            ));
        };
        made.entry(name.to_owned())
            .or_insert_with(|| {
                Arc::new(SimulatedService::new(
                    name,
                    self.faults
                        .get(name)
                        .unwrap_or(&self.default_faults)
                        .clone(),
                    self.clock.clone(),
                ))
            })
            .clone()
    }

    /// Every simulated service made so far, by name.
    pub fn all(&self) -> Vec<(String, Arc<SimulatedService>)> {
        let mut out: Vec<_> = self
            .made
            .lock()
            .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}

/// The four functions, wired to one backend, plus the simulated services.
pub struct System {
    /// The task API (a caller's own tasks).
    pub api: ApiDeps,
    /// The operator API (every task; routes under `/operator`).
    pub operator: ApiDeps,
    pub scheduler: SchedulerDeps,
    pub agent: AgentDeps,
    pub supervisor: SupervisorDeps,
    /// The simulated services (by service name).
    pub services: Simulated,
    /// The catalog, with what was read kept in memory (shared by the four functions here).
    pub definitions: Arc<Definitions>,
    pub resources: Resources,
    pub queue: Arc<dyn Queue>,
    pub store: Arc<dyn StateStore>,
    /// The in-memory adapters, when the backend is [`Backend::Memory`].
    pub memory: Option<MemoryPorts>,
    /// The EMF metrics every function here emitted (totals by dimensions).
    pub metrics: Arc<sas::metrics::Memory>,
    settings: Settings,
    /// Until when the schedules were looked at: the next look sends the runs after it.
    schedules_seen: Arc<Mutex<chrono::DateTime<chrono::Utc>>>,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl System {
    /// Builds the system (creating AWS resources if needed) without starting anything.
    pub async fn new(
        backend: Backend,
        settings: Settings,
        clock: Arc<dyn Clock>,
    ) -> anyhow::Result<Self> {
        let ports = ports(backend, &settings).await?;
        let files = settings.definitions.clone();
        let system = Self::from_ports(ports, settings, clock);
        system.publish(&files).await?;
        Ok(system)
    }

    /// Publishes definition files (file name, text): services first, then workflows.
    pub async fn publish(&self, files: &[(String, String)]) -> anyhow::Result<Vec<String>> {
        catalog::publish_files(&self.definitions, files).await
    }

    /// Builds the system on ports made (and perhaps wrapped) by the caller.
    pub fn from_ports(ports: Ports, settings: Settings, clock: Arc<dyn Clock>) -> Self {
        let Ports {
            store,
            catalog,
            queue,
            events,
            payloads,
            resources,
            memory,
        } = ports;
        // Payloads over the inline size in the payload store, their references in the items:
        // every function reads and writes tasks through this, as in the stack.
        // One cache of payloads per system, as one per function instance in the stack.
        let payloads: Arc<dyn sas::ports::Payloads> =
            Arc::new(sas::payloads::Cached::new(payloads));
        let definitions = Arc::new(
            Definitions::new(
                catalog,
                settings.policy.clone(),
                clock.clone(),
                settings.catalog_ttl,
            )
            .with_runs(resources.ends_queue_url.is_some()),
        );
        // (A JSON Lines result is read back only for a workflow whose queries read it.)
        let store: Arc<dyn StateStore> = Arc::new(
            sas::payloads::Offloading::new(store, payloads.clone(), clock.clone())
                .with_definitions(definitions.clone()),
        );
        let services = Simulated {
            faults: settings.faults.clone(),
            default_faults: settings.default_faults.clone(),
            clock: clock.clone(),
            made: Arc::new(Mutex::new(HashMap::new())),
        };
        let metrics_sink = Arc::new(sas::metrics::Memory::default());
        let metrics = sas::metrics::Metrics::new("sas/local", metrics_sink.clone());
        let ports = TaskPorts {
            metrics: metrics.clone(),
            store: store.clone(),
            queue: queue.clone(),
            events: events.clone(),
            clock: clock.clone(),
            definitions: definitions.clone(),
            work_queue_url: resources.work_queue_url.clone(),
            urgent_work_queue_url: resources.urgent_work_queue_url.clone(),
            payloads: payloads.clone(),
            ends_queue_url: resources.ends_queue_url.clone(),
            run_contexts: Default::default(),
        };
        let scheduler = SchedulerDeps {
            ports: ports.clone(),
            agent_queue_url: resources.agent_queue_url.clone(),
            urgent_agent_queue_url: resources.urgent_agent_queue_url.clone(),
            reply_queue_url: resources.reply_queue_url.clone(),
            timer_queue_url: settings
                .deadline_timers
                .then(|| resources.timer_queue_url.clone()),
            dead_letter_url: Some(resources.dead_letter_url.clone()),
            instance_id: format!("local-{}", uuid::Uuid::new_v4()),
            callback_base_url: Some(settings.callback_base_url.clone()),
        };
        let api = ApiDeps {
            // The task API claims first steps as the submission function does, with its own
            // instance id.
            dispatch: settings.dispatch_at_submission.then(|| {
                Arc::new(SchedulerDeps {
                    instance_id: format!("local-submission-{}", uuid::Uuid::new_v4()),
                    ..scheduler.clone()
                })
            }),
            ports: ports.clone(),
            operator_api: false,
            reply_queues: settings
                .reply_queues
                .clone()
                .unwrap_or_else(|| local_reply_queues(&resources.work_queue_url)),
            rate_limit: settings.rate_limit,
            // Schedules run in process, from the catalog (`System::run_schedules`).
            timetable: Arc::new(sas::ports::NoTimetable),
            service_share: settings.service_share,
        };
        let operator = ApiDeps {
            operator_api: true,
            dispatch: None,
            ..api.clone()
        };
        let factory = {
            let services = services.clone();
            let sink: Arc<dyn sas::remote::CallbackSink> = Arc::new(LocalCallbackSink(api.clone()));
            let delay = settings.callback_delay;
            let (clock, log) = (clock.clone(), settings.callback_log.clone());
            Arc::new(move |name: &str| {
                let completer = sas::remote::CallbackCompleter::new(
                    services.get(name),
                    sink.clone(),
                    delay,
                    clock.clone(),
                );
                Arc::new(match &log {
                    Some(log) => completer.with_log(log.clone()),
                    None => completer,
                }) as Arc<dyn RemoteService>
            })
        };
        let connectors = Connectors {
            // Building fails only if the TLS backend cannot start, which the default client
            // could not either.
            http: sas::remote::http_client().unwrap_or_else(|e| {
                error!(error = %e, "the HTTP client for services was not built");
                reqwest::Client::new()
            }),
            credentials: Arc::new(CachedCredentials::new(
                match &settings.secrets_prefix {
                    Some(prefix) => Arc::new(ScopedCredentials::new(
                        settings.credentials.clone(),
                        prefix.clone(),
                    )),
                    None => settings.credentials.clone(),
                },
                settings.credentials_ttl,
                clock.clone(),
            )),
            lambda: settings.lambda.clone(),
        };
        let agent = AgentDeps {
            metrics: metrics.clone(),
            name: "agent".into(),
            queue: queue.clone(),
            remotes: Arc::new(
                Remotes::new(
                    definitions.clone(),
                    store.clone(),
                    settings.breaker,
                    clock.clone(),
                    factory,
                    connectors,
                )
                .with_share(settings.service_share)
                .with_alerts(events.clone())
                .with_metrics(metrics.clone()),
            ),
            clock: clock.clone(),
            backoff: settings.backoff,
            call_timeout: settings.call_timeout,
            dead_letter_url: Some(
                resources
                    .agent_dead_letter_url
                    .clone()
                    .unwrap_or_else(|| resources.dead_letter_url.clone()),
            ),
            payloads,
            tasks: Some(Arc::new(ports.clone())),
            // A child task's first step claimed as it starts, as a deployed agent does.
            dispatch: Some(Arc::new(SchedulerDeps {
                instance_id: format!("local-agent-{}", uuid::Uuid::new_v4()),
                ..scheduler.clone()
            })),
        };
        let supervisor_dispatch = Arc::new(SchedulerDeps {
            instance_id: format!("local-supervisor-{}", uuid::Uuid::new_v4()),
            ..scheduler.clone()
        });
        let (shutdown, _) = watch::channel(false);
        Self {
            api,
            operator,
            scheduler,
            supervisor: SupervisorDeps {
                ports,
                // The sweep looks as far ahead as its interval, as in a deployment; not at all
                // without deadline timers (the sweep alone ends every deadline then).
                sweep: supervisor::SweepSettings {
                    look_ahead: if settings.deadline_timers {
                        chrono::Duration::from_std(settings.supervisor_interval)
                            .unwrap_or_else(|_| chrono::Duration::seconds(1))
                    } else {
                        chrono::Duration::zero()
                    },
                    ..settings.sweep
                },
                timer_queue_url: Some(resources.timer_queue_url.clone()),
                dead_letter_url: Some(resources.dead_letter_url.clone()),
                instance_id: format!("local-supervisor-{}", uuid::Uuid::new_v4()),
                lease_ttl: settings.lease_ttl,
                // The end of a wait claims its next step here, as a deployed supervisor does.
                dispatch: Some(supervisor_dispatch),
            },
            agent,
            services,
            definitions,
            resources,
            queue,
            store,
            memory,
            metrics: metrics_sink,
            settings,
            schedules_seen: Arc::new(Mutex::new(clock.now())),
            shutdown,
            tasks: Vec::new(),
        }
    }

    /// Starts the event-source mappings (queue pollers) and the supervisor's schedule.
    pub fn start(&mut self) {
        let s = &self.settings;
        let r = &self.resources;
        let scheduler_queues = [
            (r.work_queue_url.clone(), s.scheduler_concurrency),
            (r.reply_queue_url.clone(), s.scheduler_concurrency),
        ]
        .into_iter()
        .chain(
            r.ends_queue_url
                .clone()
                .map(|u| (u, s.scheduler_concurrency)),
        )
        .chain(
            r.urgent_work_queue_url
                .clone()
                .map(|u| (u, s.urgent_concurrency)),
        );
        let agent_queues = std::iter::once((r.agent_queue_url.clone(), s.agent_concurrency)).chain(
            r.urgent_agent_queue_url
                .clone()
                .map(|u| (u, s.urgent_concurrency)),
        );
        let (scheduler_queues, agent_queues): (Vec<_>, Vec<_>) =
            (scheduler_queues.collect(), agent_queues.collect());
        for (url, pollers) in scheduler_queues {
            for _ in 0..pollers.max(1) {
                let deps = self.scheduler.clone();
                self.tasks.push(self.mapping(url.clone(), move |ev| {
                    let deps = deps.clone();
                    async move { scheduler::handle(&deps, ev).await }
                }));
            }
        }
        for (url, pollers) in agent_queues {
            for _ in 0..pollers.max(1) {
                let deps = self.agent.clone();
                self.tasks.push(self.mapping(url.clone(), move |ev| {
                    let deps = deps.clone();
                    async move { agent::handle(&deps, ev).await }
                }));
            }
        }
        let deps = self.supervisor.clone();
        let timers = self.resources.timer_queue_url.clone();
        self.tasks.push(self.mapping(timers, move |ev| {
            let deps = deps.clone();
            async move { supervisor::handle_timers(&deps, ev).await }
        }));
        // The schedules' timer: a look every second, as EventBridge Scheduler keeps its times.
        let timetable = self.timetable();
        let mut stop = self.shutdown.subscribe();
        self.tasks.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => {
                        if let Err(e) = timetable.run().await {
                            error!(error = %e, "the schedules were not looked at");
                        }
                    }
                    _ = stop.changed() => return,
                }
            }
        }));
        let deps = self.supervisor.clone();
        let every = s.supervisor_interval;
        let mut stop = self.shutdown.subscribe();
        self.tasks.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => {
                        if let Err(e) = supervisor::handle(&deps, scheduled_event()).await {
                            error!(error = %e, "supervisor sweep failed");
                        }
                    }
                    _ = stop.changed() => return,
                }
            }
        }));
    }

    fn mapping<F, Fut>(&self, url: String, handler: F) -> JoinHandle<()>
    where
        F: Fn(SqsEvent) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = SqsBatchResponse> + Send,
    {
        let queue = self.queue.clone();
        let mut stop = self.shutdown.subscribe();
        let (batch, wait) = (self.settings.batch_size, self.settings.poll_wait);
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    r = poll_once(queue.as_ref(), &url, batch, wait, &handler) => {
                        if let Err(e) = r {
                            error!(queue = %url, error = %e, "poll failed");
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        }
                    }
                    _ = stop.changed() => return,
                }
            }
        })
    }

    /// Callback steps' services post their callbacks below `base`: the scheduler's requests
    /// and the first requests the task API sends at submission both carry it.
    pub fn call_back_at(&mut self, base: String) {
        self.scheduler.callback_base_url = Some(base);
        let rebuilt = |dispatch: &Arc<SchedulerDeps>| {
            Arc::new(SchedulerDeps {
                callback_base_url: self.scheduler.callback_base_url.clone(),
                ..(**dispatch).clone()
            })
        };
        self.api.dispatch = self.api.dispatch.as_ref().map(rebuilt);
        self.supervisor.dispatch = self.supervisor.dispatch.as_ref().map(rebuilt);
        self.agent.dispatch = self.agent.dispatch.as_ref().map(rebuilt);
    }

    /// Serves the submission HTTP API on `addr` until shutdown; returns the bound address,
    /// where callback steps' services then post their callbacks ([`System::call_back_at`]).
    pub async fn serve(&mut self, addr: SocketAddr) -> anyhow::Result<SocketAddr> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let bound = listener.local_addr()?;
        self.call_back_at(format!("http://{bound}"));
        let app = router(
            self.api.clone(),
            self.operator.clone(),
            self.settings.api_auth.clone(),
            self.settings.operator_auth.clone(),
            guard::Hosts::new(bound, &self.settings.allowed_hosts),
        );
        let mut stop = self.shutdown.subscribe();
        self.tasks.push(tokio::spawn(async move {
            let served = axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = stop.changed().await;
                })
                .await;
            if let Err(e) = served {
                error!(error = %e, "HTTP server failed");
            }
        }));
        info!(%bound, "submission API listening");
        Ok(bound)
    }

    /// One poll of `url` (a batch of up to 10, no wait), handed to `handler` like a Lambda
    /// invocation. Returns how many messages were handed to it.
    async fn pump<F, Fut>(&self, url: &str, handler: F) -> anyhow::Result<usize>
    where
        F: Fn(SqsEvent) -> Fut,
        Fut: Future<Output = SqsBatchResponse>,
    {
        poll_once(self.queue.as_ref(), url, 10, Duration::ZERO, &handler).await
    }

    /// One poll of the scheduler's queues, handled like a Lambda invocation. Returns how many
    /// messages were handed to the handler.
    pub async fn pump_scheduler(&self) -> anyhow::Result<usize> {
        let mut n = 0;
        for url in [
            self.resources.urgent_work_queue_url.as_ref(),
            Some(&self.resources.work_queue_url),
            Some(&self.resources.reply_queue_url),
            self.resources.ends_queue_url.as_ref(),
        ]
        .into_iter()
        .flatten()
        {
            n += self
                .pump(url, |ev| scheduler::handle(&self.scheduler, ev))
                .await?;
        }
        Ok(n)
    }

    /// One poll of the agent queues (the urgent lane's first).
    pub async fn pump_agents(&self) -> anyhow::Result<usize> {
        let mut n = 0;
        for url in [
            self.resources.urgent_agent_queue_url.as_ref(),
            Some(&self.resources.agent_queue_url),
        ]
        .into_iter()
        .flatten()
        {
            n += self.pump(url, |ev| agent::handle(&self.agent, ev)).await?;
        }
        Ok(n)
    }

    /// One poll of the deadline-timer queue, handled by the supervisor.
    pub async fn pump_timers(&self) -> anyhow::Result<usize> {
        self.pump(&self.resources.timer_queue_url, |ev| {
            supervisor::handle_timers(&self.supervisor, ev)
        })
        .await
    }

    /// Invokes the supervisor once, as its schedule would.
    pub async fn sweep(&self) -> anyhow::Result<SweepReport> {
        Ok(supervisor::handle(&self.supervisor, scheduled_event()).await?)
    }

    /// Looks at the schedules once: every run since the last look (the latest only, if several
    /// were missed) is sent to the work queue, as EventBridge Scheduler sends it on AWS; the
    /// scheduler starts its task. Returns the runs sent.
    pub async fn run_schedules(&self) -> anyhow::Result<Vec<ScheduledRun>> {
        self.timetable().run().await
    }

    fn timetable(&self) -> LocalTimetable {
        LocalTimetable {
            definitions: self.definitions.clone(),
            queue: self.queue.clone(),
            work_queue_url: self.resources.work_queue_url.clone(),
            clock: self.supervisor.ports.clock.clone(),
            seen: self.schedules_seen.clone(),
        }
    }

    /// Stops every background task and waits for them.
    pub async fn shutdown(mut self) {
        let _ = self.shutdown.send(true);
        for t in self.tasks.drain(..) {
            let _ = t.await;
        }
    }
}

/// `sas-local`'s EventBridge Scheduler: reads the schedules from the catalog and sends each run
/// to the work queue.
#[derive(Clone)]
struct LocalTimetable {
    definitions: Arc<Definitions>,
    queue: Arc<dyn Queue>,
    work_queue_url: String,
    clock: Arc<dyn Clock>,
    seen: Arc<Mutex<chrono::DateTime<chrono::Utc>>>,
}

impl LocalTimetable {
    async fn run(&self) -> anyhow::Result<Vec<ScheduledRun>> {
        let now = self.clock.now();
        let after = match self.seen.lock() {
            Ok(seen) => *seen,
            Err(_) => anyhow::bail!("the schedules' last look is poisoned"),
        };
        if now <= after {
            return Ok(vec![]);
        }
        let mut runs = vec![];
        for schedule in self.definitions.schedules().await? {
            if schedule.def.paused {
                continue;
            }
            if let Some(at) = schedule.latest_run(after, now) {
                let run = ScheduledRun {
                    schedule: schedule.name().to_owned(),
                    at,
                };
                let body = serde_json::to_string(&SchedulerMessage::Scheduled(run.clone()))?;
                self.queue
                    .send(&self.work_queue_url, &body, Duration::ZERO)
                    .await?;
                info!(schedule = %run.schedule, at = %run.at, "a schedule's run");
                runs.push(run);
            }
        }
        // Only once every run is sent: a failed look is made again, and a run sent twice starts
        // one task (its time is its idempotency key).
        if let Ok(mut seen) = self.seen.lock() {
            *seen = now.max(*seen);
        }
        Ok(runs)
    }
}

/// The two HTTP APIs as one axum router, as the deployed stack's HTTP API routes them: paths
/// under `/operator` go to the operator API, the rest to the task API, each after its
/// authorizer (`auth`, `operator_auth`) has named the caller. First, every request must be
/// addressed to `hosts` and pass the browser checks of [`guard::check`]; the operator API is
/// closed if the task API authenticates and it was given no authorizer
/// ([`auth::LocalAuth::for_operator`]).
pub fn router(
    api: ApiDeps,
    operator: ApiDeps,
    auth: auth::LocalAuth,
    operator_auth: auth::LocalAuth,
    hosts: guard::Hosts,
) -> axum::Router {
    #[derive(Clone)]
    struct Apis {
        api: ApiDeps,
        operator: ApiDeps,
        auth: auth::LocalAuth,
        operator_auth: auth::LocalAuth,
        hosts: guard::Hosts,
    }
    async fn any(
        axum::extract::State(apis): axum::extract::State<Arc<Apis>>,
        req: axum::extract::Request,
    ) -> axum::response::Response {
        let (parts, body) = req.into_parts();
        let bytes = match axum::body::to_bytes(body, MAX_BODY_BYTES).await {
            Ok(bytes) => bytes,
            Err(_) => return api::too_large().map(axum::body::Body::from),
        };
        if let Err(refused) = guard::check(
            &apis.hosts,
            &parts.method,
            &parts.uri,
            &parts.headers,
            &bytes,
        ) {
            return refused.map(axum::body::Body::from);
        }
        let path_and_query = parts
            .uri
            .path_and_query()
            .map_or(parts.uri.path(), |p| p.as_str());
        let path = parts.uri.path();
        // The console lives in the operator API; `/console` is its short address here.
        if path == "/console" || path.starts_with("/console/") {
            let target = format!("{}{path_and_query}", api::OPERATOR_PREFIX);
            let mut r = axum::response::Response::new(axum::body::Body::empty());
            *r.status_mut() = http::StatusCode::PERMANENT_REDIRECT;
            if let Ok(v) = http::HeaderValue::from_str(&target) {
                r.headers_mut().insert(http::header::LOCATION, v);
            }
            return r;
        }
        let to_operator =
            path == api::OPERATOR_PREFIX || path.starts_with(&format!("{}/", api::OPERATOR_PREFIX));
        let (deps, auth) = if to_operator {
            (&apis.operator, &apis.operator_auth)
        } else {
            (&apis.api, &apis.auth)
        };
        let identity = auth.identify(&parts.method, path_and_query, &parts.headers, &bytes);
        api::handle(
            deps,
            &identity,
            &parts.method,
            path_and_query,
            &parts.headers,
            &bytes,
        )
        .await
        .map(axum::body::Body::from)
    }
    axum::Router::new()
        .fallback(any)
        .layer(axum::extract::DefaultBodyLimit::disable())
        .with_state(Arc::new(Apis {
            api,
            operator,
            operator_auth: auth::LocalAuth::for_operator(&auth, operator_auth),
            auth,
            hosts,
        }))
}

/// The scheduled event EventBridge sends the supervisor.
pub fn scheduled_event() -> EventBridgeEvent<serde_json::Value> {
    let mut e = EventBridgeEvent::default();
    e.id = Some(uuid::Uuid::new_v4().to_string());
    e.detail_type = "Scheduled Event".into();
    e.source = "aws.events".into();
    e.time = Some(chrono::Utc::now());
    e.detail = serde_json::json!({});
    e
}

/// The SQS event Lambda builds from received messages.
pub fn sqs_event(messages: &[ReceivedMessage]) -> SqsEvent {
    let mut event = SqsEvent::default();
    event.records = messages
        .iter()
        .map(|m| {
            let mut r = SqsMessage::default();
            r.message_id = Some(m.message_id.clone());
            r.receipt_handle = Some(m.receipt_handle.clone());
            r.body = Some(m.body.clone());
            r.event_source = Some("aws:sqs".into());
            r.attributes.insert(
                "ApproximateReceiveCount".into(),
                m.receive_count.to_string(),
            );
            r
        })
        .collect();
    event
}

/// One turn of an event-source mapping: receive a batch, hand it to `handler`, delete every
/// message the partial batch response does not report as failed. Returns the batch size.
pub async fn poll_once<F, Fut>(
    queue: &dyn Queue,
    url: &str,
    batch: u32,
    wait: Duration,
    handler: &F,
) -> anyhow::Result<usize>
where
    F: Fn(SqsEvent) -> Fut,
    Fut: Future<Output = SqsBatchResponse>,
{
    let ask = ReceiveRequest {
        queue_url: url,
        max: batch,
        wait,
    };
    let messages = queue.receive(ask).await?;
    if messages.is_empty() {
        return Ok(0);
    }
    let response = handler(sqs_event(&messages)).await;
    let failed: HashSet<&str> = response
        .batch_item_failures
        .iter()
        .map(|f| f.item_identifier.as_str())
        .collect();
    for m in &messages {
        if !failed.contains(m.message_id.as_str()) {
            queue.delete(url, &m.receipt_handle).await?;
        }
    }
    Ok(messages.len())
}
