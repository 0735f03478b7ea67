//! The per-caller rate limit of the task API: GCRA (the generic cell rate algorithm, a token
//! bucket kept as one number).
//!
//! A caller's state is its theoretical arrival time `TAT`: when its bucket would be full again.
//! A request at `now` is admitted if `max(TAT, now) - now <= tolerance` (the bucket has a
//! token), and then `TAT = max(TAT, now) + interval`. `interval = 1 / rate`, `tolerance =
//! interval × (burst - 1)`: `burst` requests at once, then `rate` per second. One number per
//! caller means one conditional write per request and no read (see the stores).

use chrono::Duration;

/// A caller's allowance: `per_second` requests a second on average, `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    pub per_second: f64,
    pub burst: u32,
}

impl RateLimit {
    /// Time between two requests at the sustained rate, in milliseconds (at least 1).
    pub fn interval_ms(&self) -> i64 {
        ((1000.0 / self.per_second.max(0.001)).ceil() as i64).max(1)
    }

    /// How far ahead of `now` the TAT may be for a request to be admitted.
    pub fn tolerance_ms(&self) -> i64 {
        self.interval_ms() * i64::from(self.burst.max(1) - 1)
    }

    /// The decision for a request at `now_ms` with the stored `tat_ms` (absent: a new caller):
    /// admitted with the TAT to store, or refused with how long to wait.
    pub fn decide(&self, tat_ms: Option<i64>, now_ms: i64) -> Decision {
        let tat = tat_ms.unwrap_or(now_ms).max(now_ms);
        let ahead = tat - now_ms;
        if ahead <= self.tolerance_ms() {
            Decision::Admit {
                tat_ms: tat + self.interval_ms(),
            }
        } else {
            Decision::Refuse {
                retry_after: Duration::milliseconds(ahead - self.tolerance_ms()),
            }
        }
    }
}

/// What [`RateLimit::decide`] says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Admit { tat_ms: i64 },
    Refuse { retry_after: Duration },
}

/// What a store answers for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    Admitted,
    /// Over the limit: the next request would be admitted after this long.
    Limited {
        retry_after: Duration,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Replays requests at the given times (ms) through `decide`, keeping the TAT.
    fn admitted(limit: RateLimit, times: &[i64]) -> Vec<bool> {
        let mut tat = None;
        times
            .iter()
            .map(|&t| match limit.decide(tat, t) {
                Decision::Admit { tat_ms } => {
                    tat = Some(tat_ms);
                    true
                }
                Decision::Refuse { .. } => false,
            })
            .collect()
    }

    #[test]
    fn a_burst_then_the_rate() {
        let limit = RateLimit {
            per_second: 10.0,
            burst: 3,
        };
        // Five at once: three admitted. Then one every 100 ms is admitted.
        assert_eq!(
            admitted(limit, &[0, 0, 0, 0, 0]),
            vec![true, true, true, false, false]
        );
        let steady: Vec<i64> = (0..50).map(|i| i * 100).collect();
        assert!(admitted(limit, &steady).into_iter().all(|a| a));
        // Twice the rate for ten seconds: about half refused, never more than the allowance.
        let fast: Vec<i64> = (0..200).map(|i| i * 50).collect();
        let n = admitted(limit, &fast).into_iter().filter(|a| *a).count();
        assert!(
            (100..=103).contains(&n),
            "{n} admitted in 10 s at 10/s, burst 3"
        );
    }

    #[test]
    fn a_refusal_says_when_to_come_back() {
        let limit = RateLimit {
            per_second: 2.0,
            burst: 1,
        };
        let Decision::Admit { tat_ms } = limit.decide(None, 1_000) else {
            panic!("the first request is admitted")
        };
        assert_eq!(tat_ms, 1_500);
        assert_eq!(
            limit.decide(Some(tat_ms), 1_100),
            Decision::Refuse {
                retry_after: Duration::milliseconds(400)
            }
        );
        assert!(matches!(
            limit.decide(Some(tat_ms), 1_500),
            Decision::Admit { tat_ms: 2_000 }
        ));
        // An idle caller starts afresh: an old TAT is no credit.
        assert!(matches!(
            limit.decide(Some(0), 10_000),
            Decision::Admit { tat_ms: 10_500 }
        ));
    }
}
