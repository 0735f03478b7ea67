//! Retry timing, pure: callers pass the randomness in. (The circuit breaker is in `breaker.rs`.)

use chrono::Duration;

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
}
