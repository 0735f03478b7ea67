//! Configuration from the environment, as the Lambda functions receive it.

use crate::domain::{Backoff, Policy};
use std::str::FromStr;
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("environment variable {0} is required")]
    Missing(&'static str),
    #[error("environment variable {name} is invalid: {problem}")]
    Invalid { name: &'static str, problem: String },
}

/// Where the variables are read: the process's environment (the Lambdas), or a given set
/// (`sas-local` reads the process's too; tests give theirs). Empty counts as absent.
#[derive(Debug, Clone, Default)]
pub enum Vars {
    #[default]
    Process,
    Given(std::collections::HashMap<String, String>),
}

impl Vars {
    /// A given set of variables.
    pub fn given<K: Into<String>, V: Into<String>>(
        pairs: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        Self::Given(
            pairs
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        )
    }

    /// The value of `name`, if set and not blank.
    pub fn get(&self, name: &str) -> Option<String> {
        match self {
            Self::Process => std::env::var(name).ok(),
            Self::Given(m) => m.get(name).cloned(),
        }
        .filter(|v| !v.trim().is_empty())
    }

    /// Whether `name` is set (not blank).
    pub fn is_set(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// Reads and parses an optional variable, with a default.
    pub fn parsed<T: FromStr>(&self, name: &'static str, default: T) -> Result<T, ConfigError>
    where
        T::Err: std::fmt::Display,
    {
        match self.get(name) {
            None => Ok(default),
            Some(v) => v.trim().parse().map_err(|e: T::Err| ConfigError::Invalid {
                name,
                problem: e.to_string(),
            }),
        }
    }

    /// Reads decimal seconds (0 to 86400), with a default.
    pub fn seconds(
        &self,
        name: &'static str,
        default: chrono::Duration,
    ) -> Result<chrono::Duration, ConfigError> {
        let s: f64 = self.parsed(name, default.num_milliseconds() as f64 / 1000.0)?;
        if !(0.0..=86_400.0).contains(&s) {
            return Err(ConfigError::Invalid {
                name,
                problem: "must be between 0 and 86400 seconds".into(),
            });
        }
        Ok(chrono::Duration::milliseconds((s * 1000.0) as i64))
    }
}

/// Reads a required variable.
pub fn required(name: &'static str) -> Result<String, ConfigError> {
    Vars::Process.get(name).ok_or(ConfigError::Missing(name))
}

/// Reads an optional variable (empty counts as absent).
pub fn optional(name: &'static str) -> Option<String> {
    Vars::Process.get(name)
}

/// Reads and parses an optional variable, with a default.
pub fn parsed<T: FromStr>(name: &'static str, default: T) -> Result<T, ConfigError>
where
    T::Err: std::fmt::Display,
{
    Vars::Process.parsed(name, default)
}

/// The defaults of what [`policy_in`] reads: a deployment's ([`PolicyDefaults::default`]) or
/// `sas-local`'s.
#[derive(Debug, Clone)]
pub struct PolicyDefaults {
    /// Every field but `undo_wait`, which is `call_timeout` + `undo_margin`.
    pub policy: Policy,
    /// `CALL_TIMEOUT_MS`'s default.
    pub call_timeout: std::time::Duration,
    /// `UNDO_MARGIN_SECONDS`'s default.
    pub undo_margin: chrono::Duration,
}

impl Default for PolicyDefaults {
    fn default() -> Self {
        Self {
            policy: Policy::default(),
            call_timeout: std::time::Duration::from_millis(10_000),
            undo_margin: chrono::Duration::seconds(30),
        }
    }
}

/// The deployment's default policy (each workflow's steps may set their own timeout and retry):
/// `STEP_TIMEOUT_SECONDS`, `START_WITHIN_SECONDS` (how long a step's request may wait for an
/// agent, default 0), `PICKUP_TIMEOUT_SECONDS`, `FAILURE_THRESHOLD`,
/// `RETRY_BASE_DELAY_SECONDS`, `RETRY_BACKOFF_RATE`, `RETRY_MAX_DELAY_SECONDS`,
/// `AUTO_COMPENSATE` (`true`/`false`), `COOLDOWN_SECONDS`, `MAX_ROUNDS`; and the undo wait of
/// a step that may still be in flight: `CALL_TIMEOUT_MS` (the agent's longest call, default
/// 10 000) + `UNDO_MARGIN_SECONDS` (clock skew, default 30).
pub fn policy() -> Result<Policy, ConfigError> {
    policy_in(&Vars::Process, &PolicyDefaults::default())
}

/// [`policy`] from `vars`, with `defaults` for what is unset.
pub fn policy_in(vars: &Vars, defaults: &PolicyDefaults) -> Result<Policy, ConfigError> {
    let d = &defaults.policy;
    let threshold: u32 = vars.parsed("FAILURE_THRESHOLD", d.failure_threshold)?;
    if threshold == 0 {
        return Err(ConfigError::Invalid {
            name: "FAILURE_THRESHOLD",
            problem: "must be at least 1".into(),
        });
    }
    let call_timeout = call_timeout_in(vars, defaults.call_timeout)?;
    Ok(Policy {
        step_timeout: vars.seconds("STEP_TIMEOUT_SECONDS", d.step_timeout)?,
        start_within: vars.seconds("START_WITHIN_SECONDS", d.start_within)?,
        pickup_timeout: vars.seconds("PICKUP_TIMEOUT_SECONDS", d.pickup_timeout)?,
        failure_threshold: threshold,
        retry_base_delay: vars.seconds("RETRY_BASE_DELAY_SECONDS", d.retry_base_delay)?,
        backoff_rate: {
            let r: f64 = vars.parsed("RETRY_BACKOFF_RATE", d.backoff_rate)?;
            if !(1.0..=10.0).contains(&r) {
                return Err(ConfigError::Invalid {
                    name: "RETRY_BACKOFF_RATE",
                    problem: "must be between 1 and 10".into(),
                });
            }
            r
        },
        retry_max_delay: vars.seconds("RETRY_MAX_DELAY_SECONDS", d.retry_max_delay)?,
        auto_compensate: vars.parsed("AUTO_COMPENSATE", d.auto_compensate)?,
        cooldown: vars.seconds("COOLDOWN_SECONDS", d.cooldown)?,
        max_rounds: vars.parsed("MAX_ROUNDS", d.max_rounds)?,
        callback: None,
        wait: false,
        event: false,
        undo_wait: chrono::Duration::milliseconds(call_timeout.as_millis() as i64)
            + vars.seconds("UNDO_MARGIN_SECONDS", defaults.undo_margin)?,
        undo_timeout: None,
        progress_events: vars.parsed("PROGRESS_EVENTS", d.progress_events)?,
    })
}

/// The agent's longest service call, `CALL_TIMEOUT_MS` (the time left before the step's
/// deadline bounds each call too).
pub fn call_timeout_in(
    vars: &Vars,
    default: std::time::Duration,
) -> Result<std::time::Duration, ConfigError> {
    let ms: u64 = vars.parsed("CALL_TIMEOUT_MS", default.as_millis() as u64)?;
    Ok(std::time::Duration::from_millis(ms))
}

/// The agent's backoff: `BACKOFF_BASE_MS` (default 100), `BACKOFF_CAP_MS` (default 5000).
pub fn backoff() -> Result<Backoff, ConfigError> {
    backoff_in(
        &Vars::Process,
        Backoff {
            base: chrono::Duration::milliseconds(100),
            cap: chrono::Duration::milliseconds(5000),
        },
    )
}

/// [`backoff`] from `vars`, with `d` for what is unset.
pub fn backoff_in(vars: &Vars, d: Backoff) -> Result<Backoff, ConfigError> {
    Ok(Backoff {
        base: chrono::Duration::milliseconds(
            vars.parsed("BACKOFF_BASE_MS", d.base.num_milliseconds())?,
        ),
        cap: chrono::Duration::milliseconds(
            vars.parsed("BACKOFF_CAP_MS", d.cap.num_milliseconds())?,
        ),
    })
}

/// The most calls in flight of a service that declares no `concurrency`: `SERVICE_SHARE`
/// (default 10; 0: no cap).
pub fn service_share() -> Result<Option<u32>, ConfigError> {
    service_share_in(&Vars::Process, Some(DEFAULT_SERVICE_SHARE))
}

/// The deployment's default [`service_share`].
pub const DEFAULT_SERVICE_SHARE: u32 = 10;

/// [`service_share`] from `vars`, with `d` when unset.
pub fn service_share_in(vars: &Vars, d: Option<u32>) -> Result<Option<u32>, ConfigError> {
    let share: u32 = vars.parsed("SERVICE_SHARE", d.unwrap_or(0))?;
    Ok((share > 0).then_some(share))
}

/// The shared circuit breaker: `BREAKER_THRESHOLD` (default 5 consecutive transient faults),
/// `BREAKER_COOLDOWN_MS` (default 5000), `BREAKER_PROBES` (default 1 per window),
/// `BREAKER_PROBE_WINDOW_MS` (default 10000), `BREAKER_CACHE_MS` (default 1000).
pub fn breaker() -> Result<crate::domain::BreakerPolicy, ConfigError> {
    breaker_in(&Vars::Process, crate::domain::BreakerPolicy::default())
}

/// [`breaker`] from `vars`, with `d` for what is unset.
pub fn breaker_in(
    vars: &Vars,
    d: crate::domain::BreakerPolicy,
) -> Result<crate::domain::BreakerPolicy, ConfigError> {
    Ok(crate::domain::BreakerPolicy {
        threshold: vars.parsed("BREAKER_THRESHOLD", d.threshold)?.max(1),
        cooldown: chrono::Duration::milliseconds(
            vars.parsed("BREAKER_COOLDOWN_MS", d.cooldown.num_milliseconds())?,
        ),
        probes: vars.parsed("BREAKER_PROBES", d.probes)?.max(1),
        probe_window: chrono::Duration::milliseconds(
            vars.parsed("BREAKER_PROBE_WINDOW_MS", d.probe_window.num_milliseconds())?,
        ),
        // 0 (the default): a service is paused only by hand.
        pause_after: match vars.parsed(
            "BREAKER_PAUSE_AFTER_SECONDS",
            d.pause_after.map_or(0, |p| p.num_seconds()),
        )? {
            0 => None,
            s => Some(chrono::Duration::seconds(s.max(1))),
        },
        read_cache: chrono::Duration::milliseconds(
            vars.parsed("BREAKER_CACHE_MS", d.read_cache.num_milliseconds())?
                .max(0),
        ),
    })
}

/// How long a function keeps the newest version of a workflow, and the services, before
/// reading them again: `CATALOG_CACHE_SECONDS`.
pub fn catalog_ttl_in(vars: &Vars, d: chrono::Duration) -> Result<chrono::Duration, ConfigError> {
    vars.seconds("CATALOG_CACHE_SECONDS", d)
}

/// How long the agent keeps a service's credential: `CREDENTIALS_CACHE_SECONDS` (whole
/// seconds).
pub fn credentials_ttl_in(
    vars: &Vars,
    d: chrono::Duration,
) -> Result<chrono::Duration, ConfigError> {
    let s: u32 = vars.parsed("CREDENTIALS_CACHE_SECONDS", d.num_seconds().max(0) as u32)?;
    Ok(chrono::Duration::seconds(i64::from(s)))
}

/// The catalog over the DynamoDB store, with the deployment's policy under every workflow and
/// `CATALOG_CACHE_SECONDS` (default 5): how long a function keeps the newest version of a
/// workflow, and the services, before reading them again. A deployed function publishes no
/// service on its own machine (loopback, link-local), and with `SECRETS_PREFIX` (the
/// operator function's) none that reads credentials outside `<prefix><service name>/`.
pub fn definitions(
    store: Arc<crate::aws::DynamoStore>,
    clock: Arc<dyn crate::ports::Clock>,
) -> Result<crate::catalog::Definitions, ConfigError> {
    let ttl = catalog_ttl_in(&Vars::Process, chrono::Duration::seconds(5))?;
    Ok(
        crate::catalog::Definitions::new(store, policy()?, clock, ttl)
            .with_service_rules(crate::domain::workflow::ServiceRules {
                local_hosts: false,
                secrets_prefix: optional("SECRETS_PREFIX"),
            })
            .with_runs(optional("ENDS_QUEUE_URL").is_some()),
    )
}

/// The DynamoDB store from `TABLE_NAME` and `DUE_SHARDS` (default 16: see docs/capacity.md,
/// "Load per key").
pub fn dynamo_store(sdk: &aws_config::SdkConfig) -> Result<crate::aws::DynamoStore, ConfigError> {
    Ok(crate::aws::DynamoStore::new(
        aws_sdk_dynamodb::Client::new(sdk),
        required("TABLE_NAME")?,
        parsed("DUE_SHARDS", 16u32)?,
    )
    .with_caller_shards(parsed("CALLER_SHARDS", crate::aws::DEFAULT_CALLER_SHARDS)?)
    .with_retention(retention()?))
}

/// What the API, scheduler and supervisor functions share ([`crate::handlers::TaskPorts`]):
/// the [`dynamo_store`], SQS, the [`event_bus`], the [`payloads`], the system clock, the
/// [`definitions`] over the store, `WORK_QUEUE_URL` (and the urgent lane's,
/// `URGENT_WORK_QUEUE_URL`) and the EMF metrics.
pub fn task_ports(sdk: &aws_config::SdkConfig) -> Result<crate::handlers::TaskPorts, ConfigError> {
    let store = Arc::new(dynamo_store(sdk)?);
    let clock: Arc<dyn crate::ports::Clock> = Arc::new(crate::ports::SystemClock);
    // One cache of payloads for the process: what a function read or wrote once it neither
    // reads nor writes again.
    let payloads: Arc<dyn crate::ports::Payloads> =
        Arc::new(crate::payloads::Cached::new(Arc::new(payloads(sdk)?)));
    let definitions = Arc::new(definitions(store.clone(), clock.clone())?);
    Ok(crate::handlers::TaskPorts {
        metrics: crate::metrics::Metrics::from_env(),
        definitions: definitions.clone(),
        // Payloads over the inline size in the bucket, their references in the items (a JSON
        // Lines result read back only for a workflow whose queries read it).
        store: Arc::new(
            crate::payloads::Offloading::new(store, payloads.clone(), clock.clone())
                .with_definitions(definitions),
        ),
        queue: Arc::new(sqs_queue(sdk)),
        events: Arc::new(event_bus(sdk)?),
        clock,
        work_queue_url: required("WORK_QUEUE_URL")?,
        urgent_work_queue_url: optional("URGENT_WORK_QUEUE_URL"),
        payloads,
        ends_queue_url: optional("ENDS_QUEUE_URL"),
        run_contexts: Default::default(),
    })
}

/// What the scheduler sends with, over `ports`: the agents' queues (`AGENT_QUEUE_URL`, the
/// urgent lane's `URGENT_AGENT_QUEUE_URL`), `REPLY_QUEUE_URL`, the deadline timers'
/// `TIMER_QUEUE_URL` (none with `DEADLINE_TIMERS=false`: the sweep finds every deadline),
/// `DEAD_LETTER_QUEUE_URL`, `CALLBACK_BASE_URL` and a new [`instance_id`] for `LockedBy`. The
/// scheduler's, and the task API's for the first steps it claims.
pub fn scheduler_deps(
    ports: crate::handlers::TaskPorts,
) -> Result<crate::handlers::scheduler::SchedulerDeps, ConfigError> {
    Ok(crate::handlers::scheduler::SchedulerDeps {
        ports,
        agent_queue_url: required("AGENT_QUEUE_URL")?,
        urgent_agent_queue_url: optional("URGENT_AGENT_QUEUE_URL"),
        reply_queue_url: required("REPLY_QUEUE_URL")?,
        timer_queue_url: parsed("DEADLINE_TIMERS", true)?
            .then(|| optional("TIMER_QUEUE_URL"))
            .flatten(),
        dead_letter_url: optional("DEAD_LETTER_QUEUE_URL"),
        // One id per execution environment: `LockedBy` tells which one holds a claim.
        instance_id: instance_id(),
        callback_base_url: optional("CALLBACK_BASE_URL"),
    })
}

/// The task API's first-step claims (see [`crate::api::ApiDeps::dispatch`]):
/// `DISPATCH_AT_SUBMISSION` (default true) with the [`scheduler_deps`] variables; `None` when
/// it is false.
pub fn dispatch(
    ports: &crate::handlers::TaskPorts,
) -> Result<Option<Arc<crate::handlers::scheduler::SchedulerDeps>>, ConfigError> {
    if !parsed("DISPATCH_AT_SUBMISSION", true)? {
        return Ok(None);
    }
    Ok(Some(Arc::new(scheduler_deps(ports.clone())?)))
}

/// The scheduler's outlets lent to another function that claims steps: the supervisor's claims
/// of the step the end of a wait sends a task on to
/// ([`crate::handlers::supervisor::SupervisorDeps::dispatch`]), the agent's of a child task's
/// first step ([`crate::handlers::agent::AgentDeps::dispatch`]). With the [`scheduler_deps`]
/// variables, when `AGENT_QUEUE_URL` is set; `None` (the work message) when it is not.
pub fn lent_outlets(
    ports: &crate::handlers::TaskPorts,
) -> Result<Option<Arc<crate::handlers::scheduler::SchedulerDeps>>, ConfigError> {
    if optional("AGENT_QUEUE_URL").is_none() {
        return Ok(None);
    }
    Ok(Some(Arc::new(scheduler_deps(ports.clone())?)))
}

/// The payload store: the S3 bucket `PAYLOAD_BUCKET`.
pub fn payloads(sdk: &aws_config::SdkConfig) -> Result<crate::aws::S3Payloads, ConfigError> {
    payloads_in(&Vars::Process, sdk)
}

/// [`payloads`] from `vars`.
pub fn payloads_in(
    vars: &Vars,
    sdk: &aws_config::SdkConfig,
) -> Result<crate::aws::S3Payloads, ConfigError> {
    let bucket = vars
        .get("PAYLOAD_BUCKET")
        .ok_or(ConfigError::Missing("PAYLOAD_BUCKET"))?;
    Ok(crate::aws::S3Payloads::from_config(sdk, bucket))
}

/// The timers of schedules: EventBridge Scheduler in the group `SCHEDULE_GROUP`, each run sent
/// to `WORK_QUEUE_ARN` with the role `SCHEDULE_ROLE_ARN` (runs it could not deliver go to
/// `DEAD_LETTER_QUEUE_ARN`, if set). The operator API sets them when a schedule is published.
pub fn timetable(
    sdk: &aws_config::SdkConfig,
) -> Result<crate::aws::SchedulerTimetable, ConfigError> {
    Ok(crate::aws::SchedulerTimetable::new(
        aws_sdk_scheduler::Client::new(sdk),
        crate::aws::TimetableConfig {
            group: required("SCHEDULE_GROUP")?,
            work_queue_arn: required("WORK_QUEUE_ARN")?,
            role_arn: required("SCHEDULE_ROLE_ARN")?,
            dead_letter_arn: optional("DEAD_LETTER_QUEUE_ARN"),
        },
    ))
}

/// One id per execution environment: a scheduler's `LockedBy`, a supervisor's shard leases.
/// In Lambda, its log stream's own id (what follows `]` in `AWS_LAMBDA_LOG_STREAM_NAME`: one
/// stream per environment, so it finds the holder's logs) and 8 random hex digits (a runtime
/// started again in the same environment is another holder); `local/` and a UUID elsewhere.
/// Short: a claimed record holds it, and every write bills the record by the KB.
pub fn instance_id() -> String {
    instance_id_in(std::env::var("AWS_LAMBDA_LOG_STREAM_NAME").ok().as_deref())
}

fn instance_id_in(log_stream: Option<&str>) -> String {
    let random = uuid::Uuid::new_v4().simple().to_string();
    match log_stream {
        Some(stream) => {
            let id = stream.rsplit(']').next().unwrap_or(stream);
            format!("{id}/{}", &random[..8])
        }
        None => format!("local/{random}"),
    }
}

/// How long a final task is kept: `RETENTION_DAYS` (default 90; 0: for good).
pub fn retention() -> Result<Option<chrono::Duration>, ConfigError> {
    retention_in(&Vars::Process, Some(chrono::Duration::days(90)))
}

/// [`retention`] from `vars`, with `d` if unset.
pub fn retention_in(
    vars: &Vars,
    d: Option<chrono::Duration>,
) -> Result<Option<chrono::Duration>, ConfigError> {
    let days: u32 = vars.parsed("RETENTION_DAYS", d.map_or(0, |d| d.num_days() as u32))?;
    if days > 36_500 {
        return Err(ConfigError::Invalid {
            name: "RETENTION_DAYS",
            problem: "must be 0 (keep) to 36500".into(),
        });
    }
    Ok((days > 0).then(|| chrono::Duration::days(i64::from(days))))
}

/// The EventBridge bus from `EVENT_BUS_NAME`.
pub fn event_bus(sdk: &aws_config::SdkConfig) -> Result<crate::aws::EventBridgeBus, ConfigError> {
    Ok(crate::aws::EventBridgeBus::new(
        aws_sdk_eventbridge::Client::new(sdk),
        required("EVENT_BUS_NAME")?,
    ))
}

/// The SQS client.
pub fn sqs_queue(sdk: &aws_config::SdkConfig) -> crate::aws::SqsQueue {
    crate::aws::SqsQueue::new(aws_sdk_sqs::Client::new(sdk))
}

/// The reply queues a task's caller may name (`REPLY_QUEUES`: comma-separated queue URL
/// patterns ending in `*`; absent: none).
pub fn reply_queues() -> Result<crate::domain::task::ReplyQueues, ConfigError> {
    Ok(reply_queues_in(&Vars::Process)?.unwrap_or_else(crate::domain::task::ReplyQueues::none))
}

/// [`reply_queues`] from `vars` (`None`: unset).
pub fn reply_queues_in(
    vars: &Vars,
) -> Result<Option<crate::domain::task::ReplyQueues>, ConfigError> {
    match vars.get("REPLY_QUEUES") {
        None => Ok(None),
        Some(spec) => crate::domain::task::ReplyQueues::parse(&spec)
            .map(Some)
            .map_err(|e| ConfigError::Invalid {
                name: "REPLY_QUEUES",
                problem: e.problem,
            }),
    }
}

/// Each caller's allowance on the task API: `CALLER_RATE_PER_SECOND` (default 50; 0: no
/// limit) and `CALLER_BURST` (default 100).
pub fn rate_limit() -> Result<Option<crate::domain::rate::RateLimit>, ConfigError> {
    rate_limit_in(&Vars::Process, 50.0, 100)
}

/// [`rate_limit`] from `vars`, with `per_second` and `burst` if unset.
pub fn rate_limit_in(
    vars: &Vars,
    per_second: f64,
    burst: u32,
) -> Result<Option<crate::domain::rate::RateLimit>, ConfigError> {
    let per_second: f64 = vars.parsed("CALLER_RATE_PER_SECOND", per_second)?;
    let burst: u32 = vars.parsed("CALLER_BURST", burst)?;
    if !(0.0..=100_000.0).contains(&per_second) || burst == 0 {
        return Err(ConfigError::Invalid {
            name: "CALLER_RATE_PER_SECOND",
            problem: "the rate must be 0 to 100000 a second and the burst at least 1".into(),
        });
    }
    Ok((per_second > 0.0).then_some(crate::domain::rate::RateLimit { per_second, burst }))
}

/// The supervisor's sweep: `SWEEP_PAGE_SIZE` (due-index entries per query, default 100),
/// `SWEEP_CONCURRENCY` (recoveries in flight, default 32) and `SWEEP_BUDGET_SECONDS` (how long
/// one sweep pages, default 60), which must stay below `lease` (the shard lease's TTL, itself
/// above the function's timeout): a sweep ends before its leases could pass to another.
pub fn sweep_settings(
    lease: chrono::Duration,
) -> Result<crate::handlers::supervisor::SweepSettings, ConfigError> {
    sweep_settings_in(
        &Vars::Process,
        lease,
        crate::handlers::supervisor::SweepSettings::default(),
    )
}

/// [`sweep_settings`] from `vars`, with `d` for what is unset.
pub fn sweep_settings_in(
    vars: &Vars,
    lease: chrono::Duration,
    d: crate::handlers::supervisor::SweepSettings,
) -> Result<crate::handlers::supervisor::SweepSettings, ConfigError> {
    let page_size: usize = vars.parsed("SWEEP_PAGE_SIZE", d.page_size)?;
    if !(1..=1000).contains(&page_size) {
        return Err(ConfigError::Invalid {
            name: "SWEEP_PAGE_SIZE",
            problem: "must be between 1 and 1000 (a due-index query's limit)".into(),
        });
    }
    let concurrency: usize = vars.parsed("SWEEP_CONCURRENCY", d.concurrency)?;
    if !(1..=1000).contains(&concurrency) {
        return Err(ConfigError::Invalid {
            name: "SWEEP_CONCURRENCY",
            problem: "must be between 1 and 1000".into(),
        });
    }
    let budget = vars.seconds("SWEEP_BUDGET_SECONDS", d.budget)?;
    let look_ahead = vars.seconds("SWEEP_LOOK_AHEAD_SECONDS", d.look_ahead)?;
    if look_ahead < chrono::Duration::zero() || look_ahead > chrono::Duration::minutes(15) {
        return Err(ConfigError::Invalid {
            name: "SWEEP_LOOK_AHEAD_SECONDS",
            problem: "must be 0 (off) to 900 (a timer's longest delay): the sweep's interval"
                .into(),
        });
    }
    if budget >= lease || budget <= chrono::Duration::zero() {
        return Err(ConfigError::Invalid {
            name: "SWEEP_BUDGET_SECONDS",
            problem: format!(
                "must be above 0 and below the shard lease ({} s)",
                lease.num_seconds()
            ),
        });
    }
    Ok(crate::handlers::supervisor::SweepSettings {
        page_size,
        concurrency,
        budget,
        look_ahead,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_instance_id_is_the_log_streams_id_and_a_random_suffix() {
        let stream = "2026/12/02/[$LATEST]0123456789abcdef0123456789abcdef";
        let (a, b) = (instance_id_in(Some(stream)), instance_id_in(Some(stream)));
        assert!(a.starts_with("0123456789abcdef0123456789abcdef/"), "{a}");
        assert_eq!(a.len(), 41, "{a}");
        assert_ne!(a, b, "a runtime started again is another holder");
        let local = instance_id_in(None);
        assert!(local.starts_with("local/") && local.len() == 38, "{local}");
    }

    #[test]
    fn the_payload_bucket_is_required_and_named_when_missing() {
        let sdk = aws_config::SdkConfig::builder()
            .behavior_version(aws_config::BehaviorVersion::latest())
            .build();
        let missing = payloads_in(&Vars::given([("TABLE_NAME", "t")]), &sdk)
            .err()
            .map(|e| e.to_string());
        assert_eq!(
            missing.as_deref(),
            Some("environment variable PAYLOAD_BUCKET is required")
        );
        let blank = payloads_in(&Vars::given([("PAYLOAD_BUCKET", " ")]), &sdk);
        assert!(blank.is_err(), "blank counts as absent");
        let s3 = payloads_in(&Vars::given([("PAYLOAD_BUCKET", "b")]), &sdk).expect("a bucket");
        assert_eq!(s3.bucket(), "b");
    }
}
