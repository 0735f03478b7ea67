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

/// Reads a required variable.
pub fn required(name: &'static str) -> Result<String, ConfigError> {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => Ok(v),
        _ => Err(ConfigError::Missing(name)),
    }
}

/// Reads an optional variable (empty counts as absent).
pub fn optional(name: &'static str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// Reads and parses an optional variable, with a default.
pub fn parsed<T: FromStr>(name: &'static str, default: T) -> Result<T, ConfigError>
where
    T::Err: std::fmt::Display,
{
    match optional(name) {
        None => Ok(default),
        Some(v) => v.trim().parse().map_err(|e: T::Err| ConfigError::Invalid {
            name,
            problem: e.to_string(),
        }),
    }
}

fn seconds(name: &'static str, default: f64) -> Result<chrono::Duration, ConfigError> {
    let s: f64 = parsed(name, default)?;
    if !(0.0..=86_400.0).contains(&s) {
        return Err(ConfigError::Invalid {
            name,
            problem: "must be between 0 and 86400 seconds".into(),
        });
    }
    Ok(chrono::Duration::milliseconds((s * 1000.0) as i64))
}

/// The deployment's default policy (each workflow's steps may set their own timeout and retry):
/// `STEP_TIMEOUT_SECONDS`, `START_WITHIN_SECONDS` (how long a step's request may wait for an
/// agent, default 0), `PICKUP_TIMEOUT_SECONDS`, `FAILURE_THRESHOLD`,
/// `RETRY_BASE_DELAY_SECONDS`, `RETRY_BACKOFF_RATE`, `RETRY_MAX_DELAY_SECONDS`,
/// `AUTO_COMPENSATE` (`true`/`false`), `COOLDOWN_SECONDS`, `MAX_ROUNDS`; and the undo wait of
/// a step that may still be in flight: `CALL_TIMEOUT_MS` (the agent's longest call, default
/// 10 000) + `UNDO_MARGIN_SECONDS` (clock skew, default 30).
pub fn policy() -> Result<Policy, ConfigError> {
    let d = Policy::default();
    let secs = |d: chrono::Duration| d.num_milliseconds() as f64 / 1000.0;
    let threshold: u32 = parsed("FAILURE_THRESHOLD", d.failure_threshold)?;
    if threshold == 0 {
        return Err(ConfigError::Invalid {
            name: "FAILURE_THRESHOLD",
            problem: "must be at least 1".into(),
        });
    }
    Ok(Policy {
        step_timeout: seconds("STEP_TIMEOUT_SECONDS", secs(d.step_timeout))?,
        start_within: seconds("START_WITHIN_SECONDS", secs(d.start_within))?,
        pickup_timeout: seconds("PICKUP_TIMEOUT_SECONDS", secs(d.pickup_timeout))?,
        failure_threshold: threshold,
        retry_base_delay: seconds("RETRY_BASE_DELAY_SECONDS", secs(d.retry_base_delay))?,
        backoff_rate: {
            let r: f64 = parsed("RETRY_BACKOFF_RATE", d.backoff_rate)?;
            if !(1.0..=10.0).contains(&r) {
                return Err(ConfigError::Invalid {
                    name: "RETRY_BACKOFF_RATE",
                    problem: "must be between 1 and 10".into(),
                });
            }
            r
        },
        retry_max_delay: seconds("RETRY_MAX_DELAY_SECONDS", secs(d.retry_max_delay))?,
        auto_compensate: parsed("AUTO_COMPENSATE", d.auto_compensate)?,
        cooldown: seconds("COOLDOWN_SECONDS", secs(d.cooldown))?,
        max_rounds: parsed("MAX_ROUNDS", d.max_rounds)?,
        callback: None,
        undo_wait: chrono::Duration::milliseconds(parsed("CALL_TIMEOUT_MS", 10_000i64)?)
            + seconds("UNDO_MARGIN_SECONDS", 30.0)?,
        progress_events: parsed("PROGRESS_EVENTS", d.progress_events)?,
    })
}

/// The agent's backoff: `BACKOFF_BASE_MS` (default 100), `BACKOFF_CAP_MS` (default 5000).
pub fn backoff() -> Result<Backoff, ConfigError> {
    Ok(Backoff {
        base: chrono::Duration::milliseconds(parsed("BACKOFF_BASE_MS", 100)?),
        cap: chrono::Duration::milliseconds(parsed("BACKOFF_CAP_MS", 5000)?),
    })
}

/// The shared circuit breaker: `BREAKER_THRESHOLD` (default 5 consecutive transient faults),
/// `BREAKER_COOLDOWN_MS` (default 5000), `BREAKER_PROBES` (default 1 per window),
/// `BREAKER_PROBE_WINDOW_MS` (default 10000), `BREAKER_CACHE_MS` (default 1000).
pub fn breaker() -> Result<crate::domain::BreakerPolicy, ConfigError> {
    let d = crate::domain::BreakerPolicy::default();
    Ok(crate::domain::BreakerPolicy {
        threshold: parsed("BREAKER_THRESHOLD", d.threshold)?.max(1),
        cooldown: chrono::Duration::milliseconds(parsed(
            "BREAKER_COOLDOWN_MS",
            d.cooldown.num_milliseconds(),
        )?),
        probes: parsed("BREAKER_PROBES", d.probes)?.max(1),
        probe_window: chrono::Duration::milliseconds(parsed(
            "BREAKER_PROBE_WINDOW_MS",
            d.probe_window.num_milliseconds(),
        )?),
        // 0 (the default): a service is paused only by hand.
        pause_after: match parsed("BREAKER_PAUSE_AFTER_SECONDS", 0i64)? {
            0 => None,
            s => Some(chrono::Duration::seconds(s.max(1))),
        },
        read_cache: chrono::Duration::milliseconds(
            parsed("BREAKER_CACHE_MS", d.read_cache.num_milliseconds())?.max(0),
        ),
    })
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
    let ttl = seconds("CATALOG_CACHE_SECONDS", 5.0)?;
    Ok(
        crate::catalog::Definitions::new(store, policy()?, clock, ttl).with_service_rules(
            crate::domain::workflow::ServiceRules {
                local_hosts: false,
                secrets_prefix: optional("SECRETS_PREFIX"),
            },
        ),
    )
}

/// The DynamoDB store from `TABLE_NAME` and `DUE_SHARDS` (default 16: see ARCHITECTURE.md,
/// "Load per key at 1,000 tasks a second").
pub fn dynamo_store(sdk: &aws_config::SdkConfig) -> Result<crate::aws::DynamoStore, ConfigError> {
    Ok(crate::aws::DynamoStore::new(
        aws_sdk_dynamodb::Client::new(sdk),
        required("TABLE_NAME")?,
        parsed("DUE_SHARDS", 16u32)?,
    )
    .with_caller_shards(parsed("CALLER_SHARDS", crate::aws::DEFAULT_CALLER_SHARDS)?)
    .with_retention(retention()?))
}

/// How long a final task is kept: `RETENTION_DAYS` (default 90; 0: for good).
pub fn retention() -> Result<Option<chrono::Duration>, ConfigError> {
    let days: u32 = parsed("RETENTION_DAYS", 90)?;
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
    match optional("REPLY_QUEUES") {
        None => Ok(crate::domain::task::ReplyQueues::none()),
        Some(spec) => {
            crate::domain::task::ReplyQueues::parse(&spec).map_err(|e| ConfigError::Invalid {
                name: "REPLY_QUEUES",
                problem: e.problem,
            })
        }
    }
}

/// Each caller's allowance on the task API: `CALLER_RATE_PER_SECOND` (default 50; 0: no
/// limit) and `CALLER_BURST` (default 100).
pub fn rate_limit() -> Result<Option<crate::domain::rate::RateLimit>, ConfigError> {
    let per_second: f64 = parsed("CALLER_RATE_PER_SECOND", 50.0)?;
    let burst: u32 = parsed("CALLER_BURST", 100)?;
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
    let d = crate::handlers::supervisor::SweepSettings::default();
    let page_size: usize = parsed("SWEEP_PAGE_SIZE", d.page_size)?;
    if !(1..=1000).contains(&page_size) {
        return Err(ConfigError::Invalid {
            name: "SWEEP_PAGE_SIZE",
            problem: "must be between 1 and 1000 (a due-index query's limit)".into(),
        });
    }
    let concurrency: usize = parsed("SWEEP_CONCURRENCY", d.concurrency)?;
    if !(1..=1000).contains(&concurrency) {
        return Err(ConfigError::Invalid {
            name: "SWEEP_CONCURRENCY",
            problem: "must be between 1 and 1000".into(),
        });
    }
    let budget = seconds("SWEEP_BUDGET_SECONDS", d.budget.num_seconds() as f64)?;
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
    })
}
