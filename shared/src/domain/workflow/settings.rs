//! A step's settings as written (timeout, start allowance, retry, callback) and how they apply
//! over the deployment's policy: durations parsed and held to their ranges.

use super::super::policy::{CallbackPolicy, Policy};
use super::super::problem::Problem;
use serde::{Deserialize, Serialize};

/// The shortest and longest step timeout: an agent works on one attempt within one Lambda
/// invocation (at most 15 minutes).
pub const MIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

pub const MAX_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

/// The longest a step's request may wait for an agent (`startWithin`).
pub const MAX_START_WITHIN: std::time::Duration = std::time::Duration::from_secs(3600);

/// The longest retry delay a definition may ask for.
pub const MAX_DELAY: std::time::Duration = std::time::Duration::from_secs(86_400);

/// The longest a wait step waits (`wait`, or `waitUntil` from when it is reached).
pub const MAX_WAIT: std::time::Duration = std::time::Duration::from_secs(366 * 86_400);

/// A wait's length (`wait`, `within`) or a task's `deadline` (at `here`, `what` naming it in
/// the problem): a duration from 1s to [`MAX_WAIT`].
pub(super) fn long_duration(
    here: &str,
    raw: &str,
    what: &str,
    problems: &mut Vec<Problem>,
) -> Option<chrono::Duration> {
    let why = format!("is out of range: {what} is 1s to 366d");
    duration_in(here, raw, MIN_TIMEOUT..=MAX_WAIT, &why, problems)
}

/// The longest a callback step may wait for its callback.
pub const MAX_CALLBACK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30 * 86_400);

/// Timeout and retry, as written (for one step, or as the workflow's defaults).
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SettingsDoc {
    pub timeout: Option<String>,
    pub start_within: Option<String>,
    pub retry: Option<RetryDoc>,
}

#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RetryDoc {
    pub failure_threshold: Option<u32>,
    pub base_delay: Option<String>,
    pub backoff_rate: Option<f64>,
    pub max_delay: Option<String>,
}

/// A callback step's wait, as written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CallbackDoc {
    pub timeout: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat: Option<String>,
}

fn duration(at: &str, raw: &str, problems: &mut Vec<Problem>) -> Option<std::time::Duration> {
    match humantime::parse_duration(raw.trim()) {
        Ok(d) => Some(d),
        Err(e) => {
            problems.push(Problem {
                at: at.to_owned(),
                message: format!("{raw:?} is not a duration ({e}); write e.g. 500ms, 30s, 5m, 1h"),
            });
            None
        }
    }
}

fn chrono(d: std::time::Duration) -> chrono::Duration {
    chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX)
}

/// `raw` (at `here`) as a duration within `range`; outside it, a problem "`raw` `why`".
fn duration_in(
    here: &str,
    raw: &str,
    range: std::ops::RangeInclusive<std::time::Duration>,
    why: &str,
    problems: &mut Vec<Problem>,
) -> Option<chrono::Duration> {
    let d = duration(here, raw, problems)?;
    if range.contains(&d) {
        Some(chrono(d))
    } else {
        problems.push(Problem {
            at: here.to_owned(),
            message: format!("{raw:?} {why}"),
        });
        None
    }
}

/// Applies `doc` (timeout, start allowance and retry as written) over `policy`, reporting
/// problems at `at`.
pub(super) fn apply_settings(
    policy: &mut Policy,
    at: &str,
    (timeout, start_within): (Option<&String>, Option<&String>),
    retry: Option<&RetryDoc>,
    problems: &mut Vec<Problem>,
) {
    if let Some(raw) = start_within {
        let here = format!("{at}/startWithin");
        let range = std::time::Duration::ZERO..=MAX_START_WITHIN;
        let why = "is out of range: a step's request may wait for an agent 0s to 1h";
        if let Some(d) = duration_in(&here, raw, range, why, problems) {
            policy.start_within = d;
        }
    }
    if let Some(raw) = timeout {
        let here = format!("{at}/timeout");
        let why = "is out of range: a step timeout is 1s to 10m (an agent works on one attempt within one Lambda invocation)";
        if let Some(d) = duration_in(&here, raw, MIN_TIMEOUT..=MAX_TIMEOUT, why, problems) {
            policy.step_timeout = d;
        }
    }
    let Some(retry) = retry else { return };
    let at = format!("{at}/retry");
    if let Some(n) = retry.failure_threshold {
        policy.failure_threshold = n;
    }
    if let Some(rate) = retry.backoff_rate {
        policy.backoff_rate = rate;
    }
    for (field, raw, slot) in [
        ("baseDelay", &retry.base_delay, &mut policy.retry_base_delay),
        ("maxDelay", &retry.max_delay, &mut policy.retry_max_delay),
    ] {
        let Some(raw) = raw else { continue };
        let here = format!("{at}/{field}");
        let range = std::time::Duration::ZERO..=MAX_DELAY;
        if let Some(d) = duration_in(
            &here,
            raw,
            range,
            "is over the longest delay, 1 day",
            problems,
        ) {
            *slot = d;
        }
    }
    if policy.retry_max_delay < policy.retry_base_delay {
        problems.push(Problem {
            at,
            message: "maxDelay is shorter than baseDelay".into(),
        });
    }
}

/// A callback step's wait, checked: a timeout of 1s to 30 days, a heartbeat no longer than it.
pub(super) fn callback_policy(
    at: &str,
    doc: &CallbackDoc,
    problems: &mut Vec<Problem>,
) -> Option<CallbackPolicy> {
    let here = format!("{at}/timeout");
    let timeout = duration(&here, &doc.timeout, problems)?;
    if timeout < MIN_TIMEOUT || timeout > MAX_CALLBACK_TIMEOUT {
        problems.push(Problem {
            at: here,
            message: format!(
                "{:?} is out of range: a callback timeout is 1s to 30d",
                doc.timeout
            ),
        });
        return None;
    }
    let heartbeat = match &doc.heartbeat {
        None => None,
        Some(raw) => {
            let here = format!("{at}/heartbeat");
            let h = duration(&here, raw, problems)?;
            if h < MIN_TIMEOUT || h > timeout {
                problems.push(Problem {
                    at: here,
                    message: format!(
                        "{raw:?} is out of range: a heartbeat interval is 1s to the callback timeout"
                    ),
                });
                return None;
            }
            Some(chrono(h))
        }
    };
    Some(CallbackPolicy {
        timeout: chrono(timeout),
        heartbeat,
    })
}

#[cfg(test)]
mod tests {
    use super::super::testkit::*;
    use super::*;

    #[test]
    fn durations_are_checked_for_range_and_form() {
        let p = problems(&format!(
            "{BASE}  - {{name: a, service: inventory, timeout: 2h}}\n  - {{name: b, service: inventory, timeout: 3 parsecs}}\n  - name: c\n    service: inventory\n    retry: {{baseDelay: 10m, maxDelay: 1m}}\n"
        ));
        let at: Vec<_> = p.iter().map(|p| p.at.as_str()).collect();
        assert_eq!(
            at,
            ["/steps/0/timeout", "/steps/1/timeout", "/steps/2/retry"]
        );
    }

    #[test]
    fn settings_fall_back_from_step_to_workflow_to_deployment() {
        let w = workflow(
            "name: w\ndefaults: {timeout: 20s, retry: {failureThreshold: 5}}\nsteps:\n  - {name: a, service: inventory, timeout: 3s, retry: {backoffRate: 3}}\n  - {name: b, service: inventory}\n",
        )
        .expect("valid");
        let d = Policy::default();
        let (a, b) = (&w.steps[0].policy, &w.steps[1].policy);
        assert_eq!(a.step_timeout, chrono::Duration::seconds(3));
        assert_eq!((a.failure_threshold, a.backoff_rate), (5, 3.0));
        assert_eq!(b.step_timeout, chrono::Duration::seconds(20));
        assert_eq!(b.backoff_rate, d.backoff_rate);
        assert_eq!(b.retry_base_delay, d.retry_base_delay);
    }

    #[test]
    fn a_start_allowance_falls_back_from_step_to_workflow_to_deployment_and_has_a_range() {
        let w = workflow(
            "name: w\ndefaults: {startWithin: 2m}\nsteps:\n  - {name: a, service: inventory, startWithin: 0s}\n  - {name: b, service: inventory}\n",
        )
        .expect("valid");
        assert_eq!(w.steps[0].policy.start_within, chrono::Duration::zero());
        assert_eq!(w.steps[1].policy.start_within, chrono::Duration::minutes(2));
        let plain =
            workflow("name: w\nsteps:\n  - {name: a, service: inventory}\n").expect("valid");
        assert_eq!(
            plain.steps[0].policy.start_within,
            Policy::default().start_within
        );
        let found =
            problems("name: w\nsteps:\n  - {name: a, service: inventory, startWithin: 2h}\n");
        assert!(
            found.iter().any(|p| p.at == "/steps/0/startWithin"),
            "{found:?}"
        );
    }
}
