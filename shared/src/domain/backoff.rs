//! Retry timing and the circuit breaker, pure: callers pass the time and the randomness in.

use chrono::{DateTime, Duration, Utc};

/// Exponential backoff with full jitter: the n-th retry waits a uniform random time in
/// `[0, min(cap, base * 2^n)]` (the AWS Architecture Blog's "full jitter").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub base: Duration,
    pub cap: Duration,
}

impl Backoff {
    /// The upper bound of the wait before retry number `retry` (0-based).
    pub fn ceiling(&self, retry: u32) -> Duration {
        let ms = self
            .base
            .num_milliseconds()
            .saturating_mul(1i64 << retry.min(30));
        Duration::milliseconds(ms.min(self.cap.num_milliseconds()))
    }

    /// The wait before retry number `retry`, given `unit` drawn uniformly from `[0, 1)`.
    pub fn delay(&self, retry: u32, unit: f64) -> Duration {
        let ceiling = self.ceiling(retry).num_milliseconds() as f64;
        Duration::milliseconds((ceiling * unit.clamp(0.0, 1.0)) as i64)
    }
}

/// A circuit breaker around one remote service: after `threshold` consecutive transient
/// faults it opens for `cooldown`, failing calls fast; then one trial call (half-open) decides
/// whether it closes again. A trial that never reports back (its caller was cancelled) does not
/// wedge the breaker: after another `cooldown` a new trial is let through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CircuitBreaker {
    threshold: u32,
    cooldown: Duration,
    state: Breaker,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Breaker {
    Closed { failures: u32 },
    Open { until: DateTime<Utc> },
    HalfOpen { trial_until: DateTime<Utc> },
}

impl CircuitBreaker {
    pub fn new(threshold: u32, cooldown: Duration) -> Self {
        Self {
            threshold: threshold.max(1),
            cooldown,
            state: Breaker::Closed { failures: 0 },
        }
    }

    /// Whether a call may go out now. An open breaker whose cooldown is over lets one trial
    /// call through.
    pub fn allow(&mut self, now: DateTime<Utc>) -> bool {
        match self.state {
            Breaker::Closed { .. } => true,
            Breaker::Open { until } | Breaker::HalfOpen { trial_until: until } if now >= until => {
                self.state = Breaker::HalfOpen {
                    trial_until: now + self.cooldown,
                };
                true
            }
            Breaker::Open { .. } | Breaker::HalfOpen { .. } => false,
        }
    }

    pub fn on_success(&mut self) {
        self.state = Breaker::Closed { failures: 0 };
    }

    /// Records a transient fault (permanent faults say nothing about the service's health).
    pub fn on_transient_fault(&mut self, now: DateTime<Utc>) {
        self.state = match self.state {
            Breaker::Closed { failures } if failures + 1 < self.threshold => Breaker::Closed {
                failures: failures + 1,
            },
            _ => Breaker::Open {
                until: now + self.cooldown,
            },
        };
    }

    pub fn is_open(&self) -> bool {
        !matches!(self.state, Breaker::Closed { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn ceiling_doubles_up_to_the_cap() {
        let b = Backoff {
            base: Duration::milliseconds(100),
            cap: Duration::milliseconds(1000),
        };
        let c: Vec<_> = (0..6).map(|n| b.ceiling(n).num_milliseconds()).collect();
        assert_eq!(c, [100, 200, 400, 800, 1000, 1000]);
    }

    proptest! {
        #[test]
        fn jittered_delay_stays_within_zero_and_the_ceiling(retry in 0u32..64, unit in 0.0f64..1.0) {
            let b = Backoff { base: Duration::milliseconds(50), cap: Duration::seconds(5) };
            let d = b.delay(retry, unit);
            prop_assert!(d >= Duration::zero());
            prop_assert!(d <= b.ceiling(retry));
        }
    }

    #[test]
    fn breaker_opens_after_threshold_then_half_opens_after_cooldown() {
        let t = Utc::now();
        let mut cb = CircuitBreaker::new(3, Duration::seconds(10));
        for _ in 0..2 {
            assert!(cb.allow(t));
            cb.on_transient_fault(t);
        }
        assert!(!cb.is_open());
        cb.on_transient_fault(t);
        assert!(cb.is_open());
        assert!(!cb.allow(t + Duration::seconds(9)));
        assert!(
            cb.allow(t + Duration::seconds(10)),
            "trial call after cooldown"
        );
        assert!(
            !cb.allow(t + Duration::seconds(10)),
            "only one trial at a time"
        );
        cb.on_transient_fault(t + Duration::seconds(10));
        assert!(!cb.allow(t + Duration::seconds(15)), "failed trial reopens");
        assert!(cb.allow(t + Duration::seconds(20)));
        cb.on_success();
        assert!(!cb.is_open());
        assert!(cb.allow(t + Duration::seconds(20)));
    }

    #[test]
    fn a_trial_that_never_reports_back_does_not_wedge_the_breaker() {
        let t = Utc::now();
        let mut cb = CircuitBreaker::new(1, Duration::seconds(10));
        cb.on_transient_fault(t);
        assert!(cb.allow(t + Duration::seconds(10)), "trial");
        // The trial's caller vanished: no on_success, no on_transient_fault.
        assert!(!cb.allow(t + Duration::seconds(19)));
        assert!(
            cb.allow(t + Duration::seconds(20)),
            "a new trial after another cooldown"
        );
    }
}
