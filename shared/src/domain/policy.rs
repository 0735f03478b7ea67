//! The settings of a workflow's steps: how long a step may take, how often and when it is
//! retried, whether a failed task is compensated at once, and the callback a step may wait for.
//! A workflow's definition sets them ([`super::workflow`]); the transitions read them.

use chrono::{DateTime, Duration, Utc};

/// The knobs of the pattern. Defaults are production-sized; tests and the local runner shrink
/// the durations.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// How long an agent has for one step once it has picked the request up (start to close).
    pub step_timeout: Duration,
    /// How long a step's request may wait in its agent's queue before an agent picks it up
    /// (schedule to start): the step's deadline is its dispatch + this + `step_timeout`, and
    /// the agent itself stops `step_timeout` after it started. A backlog in front of the agents
    /// (more requests than they serve) then makes steps late, not failed, for up to this long.
    /// The price: a request lost outright (an agent that dies without its message coming back)
    /// is recovered this much later.
    pub start_within: Duration,
    /// How long a Pending record may wait for a scheduler before the supervisor re-enqueues it.
    pub pickup_timeout: Duration,
    /// Expired deadlines after which the task is failed for good (or, with extended waits left,
    /// cools down first).
    pub failure_threshold: u32,
    /// Delay before the first retry; multiplied by `backoff_rate` with every failure (with
    /// jitter).
    pub retry_base_delay: Duration,
    /// What each further retry multiplies the delay by (at least 1).
    pub backoff_rate: f64,
    /// Upper bound on the retry delay.
    pub retry_max_delay: Duration,
    /// On failure, undo the steps that may have taken effect at once (`true`), or leave the
    /// task in Error for the operator (`false`).
    pub auto_compensate: bool,
    /// Extended wait: how long to cool down when `FailureCount` reaches the threshold before one
    /// more round of retries...
    pub cooldown: Duration,
    /// ...and how many such rounds a task gets before it fails (0: none).
    pub max_rounds: u32,
    /// A callback step: the service accepts the request and completes the step later.
    pub callback: Option<CallbackPolicy>,
    /// A wait step: it calls no service; its deadline is the time it waits for, and passing
    /// it completes the step (see `transition::running::expire`).
    pub wait: bool,
    /// A wait for a named event: its deadline is how long it waits at most, and passing it
    /// fails the step (`event_timeout`); an event delivered ends it.
    pub event: bool,
    /// How long after the deadline of a step that may still be in flight (timed out or
    /// cancelled) its undo waits: the longest call an agent may still make plus a clock-skew
    /// margin (`CALL_TIMEOUT_MS` + `UNDO_MARGIN_SECONDS`).
    pub undo_wait: Duration,
    /// How long an undo may wait once its agent accepted it, for an undo that answers later: a
    /// sub-workflow step's undo is its child's compensation, a task of its own, given the
    /// step's callback timeout. Until the agent accepts it, an undo has the step's own
    /// deadline ([`Policy::dispatch_deadline`]), so a lost request is sent again as soon as
    /// any other step's would be.
    pub undo_timeout: Option<Duration>,
    /// Publish the progress statuses of the happy path (`TaskReceived`, `TaskStepCompleted`)
    /// to the event bus (`PROGRESS_EVENTS`). Off by default: they are most of a clean task's
    /// events (3 of 4 for a clean e-commerce order, at $1 per million each) and serve dashboards,
    /// not the pattern. A task's reply queue gets them either way (its submitter asked for them).
    pub progress_events: bool,
}

/// How long a callback step may wait for its callback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallbackPolicy {
    /// From the service's acceptance to the callback, at most.
    pub timeout: Duration,
    /// The longest gap between heartbeats, if the step takes them: a silent step times out
    /// sooner than `timeout`.
    pub heartbeat: Option<Duration>,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            step_timeout: Duration::seconds(60),
            start_within: Duration::zero(),
            pickup_timeout: Duration::seconds(120),
            failure_threshold: 3,
            retry_base_delay: Duration::seconds(5),
            backoff_rate: 2.0,
            retry_max_delay: Duration::seconds(900),
            auto_compensate: true,
            cooldown: Duration::minutes(30),
            max_rounds: 0,
            callback: None,
            wait: false,
            event: false,
            undo_wait: Duration::seconds(40),
            undo_timeout: None,
            progress_events: false,
        }
    }
}

impl Policy {
    /// The deadline of a step (or undo) dispatched at `now`: the time its request may wait for
    /// an agent and the time the agent may take.
    pub fn dispatch_deadline(&self, now: DateTime<Utc>) -> DateTime<Utc> {
        now + self.start_within + self.step_timeout
    }

    /// Whether the step, once its agent accepted it, has nothing left in flight: what it
    /// started (a sub-workflow step's child task) is reached by its undo wherever it is, and a
    /// copy of its request starts nothing new. So a cancel need not wait past its deadline.
    pub fn accepted_leaves_nothing_in_flight(&self) -> bool {
        self.undo_timeout.is_some()
    }

    /// The delay before the retry that follows the `failures`-th failure: exponential
    /// (`base × rate^(failures-1)`), capped, with "equal jitter" (a uniform wait in `[d/2, d]`
    /// for the exponential `d`), so delays still grow while retries of many tasks failing
    /// together spread out. `jitter` in [0, 1).
    pub fn retry_delay(&self, failures: u32, jitter: f64) -> Duration {
        let exp = failures.saturating_sub(1).min(60) as i32;
        let cap = self.retry_max_delay.num_milliseconds();
        let grown =
            self.retry_base_delay.num_milliseconds() as f64 * self.backoff_rate.max(1.0).powi(exp);
        let ms = if grown.is_finite() && grown < cap as f64 {
            grown as i64
        } else {
            cap
        };
        let half = ms / 2;
        Duration::milliseconds(half + ((ms - half) as f64 * jitter.clamp(0.0, 1.0)) as i64)
    }

    /// The delay of the `requeues`-th re-enqueue in a row of a task whose pickup deadline
    /// passed unclaimed (counting from 1). The first goes at once: its work message was most
    /// likely lost. Later ones mean the work queue has a backlog longer than the pickup timeout
    /// (a throttled or failing scheduler): each waits twice as long as the one before
    /// (`pickup_timeout × 2^(n-2)`, equal jitter, capped at the larger of the pickup timeout
    /// and [`MAX_REQUEUE_DELAY`]), so a backlog of length `B` costs about `log2(B / pickup)`
    /// extra messages per task instead of `B / pickup`, and the extra messages do not feed
    /// the backlog they wait behind.
    pub fn requeue_delay(&self, requeues: u32, jitter: f64) -> Duration {
        if requeues <= 1 {
            return Duration::zero();
        }
        let pickup = self.pickup_timeout.num_milliseconds().max(1);
        let cap = pickup.max(MAX_REQUEUE_DELAY.num_milliseconds());
        let ms = pickup
            .checked_mul(1_i64 << (requeues - 2).min(40))
            .map_or(cap, |d| d.min(cap));
        let half = ms / 2;
        Duration::milliseconds(half + ((ms - half) as f64 * jitter.clamp(0.0, 1.0)) as i64)
    }
}

/// The longest wait between two re-enqueues of a task nobody picks up (unless its pickup
/// timeout is longer): the longest delay SQS gives a message.
pub const MAX_REQUEUE_DELAY: Duration = Duration::minutes(15);

/// The policy of every step of a workflow (the deployment's, with the workflow's defaults and
/// each step's own settings over it).
#[derive(Debug, Clone, PartialEq)]
pub struct Policies {
    steps: Vec<Policy>,
    fallback: Policy,
}

impl Policies {
    pub fn new(steps: Vec<Policy>) -> Self {
        Self {
            fallback: steps.last().cloned().unwrap_or_default(),
            steps,
        }
    }

    /// The same policy for every step.
    pub fn uniform(p: Policy) -> Self {
        Self {
            steps: vec![],
            fallback: p,
        }
    }

    /// The policy of step `i` (the task-wide fields, such as `auto_compensate` and
    /// `pickup_timeout`, are the same in every step's).
    pub fn at(&self, i: usize) -> &Policy {
        self.steps.get(i).unwrap_or(&self.fallback)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_delay_grows_with_equal_jitter_and_is_capped() {
        // A second at first, doubled with every failure, at most 8 seconds.
        let p = Policies::uniform(Policy {
            retry_base_delay: Duration::seconds(1),
            backoff_rate: 2.0,
            retry_max_delay: Duration::seconds(8),
            ..Policy::default()
        });
        for (n, full) in [(1, 1000), (2, 2000), (3, 4000), (4, 8000), (5, 8000)] {
            assert_eq!(p.at(0).retry_delay(n, 0.0).num_milliseconds(), full / 2);
            assert_eq!(p.at(0).retry_delay(n, 1.0).num_milliseconds(), full);
            let mid = p.at(0).retry_delay(n, 0.5).num_milliseconds();
            assert!(full / 2 < mid && mid < full);
        }
    }
}
