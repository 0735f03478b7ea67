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

/// The most requests a second one limiter item is meant to admit. Every request is one write
/// to its item (a refused one too: a conditional write that fails still costs a unit), and
/// DynamoDB takes 1,000 a second on one item; a caller allowed more than this has its
/// allowance split over [`RateLimit::shards`] items.
pub const PER_ITEM: f64 = 100.0;

impl RateLimit {
    /// How many items hold this allowance: one per [`PER_ITEM`] requests a second (at least
    /// one, at most 100).
    pub fn shards(&self) -> u32 {
        (self.per_second / PER_ITEM).ceil().clamp(1.0, 100.0) as u32
    }

    /// One shard's part of the allowance: the rate split evenly, the burst too (at least one
    /// each). Each request goes to one shard chosen at random, so over any second a caller is
    /// admitted about `per_second` (a sum of independent shares: within a few percent at a
    /// hundred requests a shard) and at most `burst` rounded up to a multiple of the shards at
    /// once.
    pub fn per_shard(&self) -> RateLimit {
        let shards = self.shards();
        RateLimit {
            per_second: self.per_second / f64::from(shards),
            burst: self.burst.div_ceil(shards).max(1),
        }
    }
}

/// The key of shard `shard` of a caller's allowance (`digest`: [`crate::domain::Caller::digest`]).
/// Shard 0 keeps the unsharded key, so a limit raised past [`PER_ITEM`] keeps its first item.
pub fn shard_key(digest: &str, shard: u32) -> String {
    if shard == 0 {
        digest.to_owned()
    } else {
        format!("{digest}#{shard}")
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

    #[test]
    fn a_limit_past_one_item_is_split_evenly_and_the_default_stays_on_one() {
        let default = RateLimit {
            per_second: 50.0,
            burst: 100,
        };
        assert_eq!(default.shards(), 1);
        assert_eq!(default.per_shard(), default);
        assert_eq!(shard_key("d", 0), "d");
        let big = RateLimit {
            per_second: 1000.0,
            burst: 2000,
        };
        assert_eq!(big.shards(), 10);
        assert_eq!(
            big.per_shard(),
            RateLimit {
                per_second: 100.0,
                burst: 200
            }
        );
        assert_eq!(shard_key("d", 3), "d#3");
        let odd = RateLimit {
            per_second: 250.0,
            burst: 5,
        };
        assert_eq!(odd.shards(), 3);
        assert_eq!(odd.per_shard().burst, 2);
    }

    #[test]
    fn a_sharded_limit_admits_about_its_rate_and_no_item_takes_more_than_its_share() {
        use rand::{Rng, SeedableRng};
        let limit = RateLimit {
            per_second: 1000.0,
            burst: 1000,
        };
        let part = limit.per_shard();
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut tats = vec![None; limit.shards() as usize];
        let mut per_item = vec![0u32; tats.len()];
        let mut admitted = 0u32;
        // 3,000 requests a second for 10 s, each to a random shard.
        for i in 0..30_000i64 {
            let now = i / 3;
            let shard = rng.random_range(0..tats.len());
            if let Decision::Admit { tat_ms } = part.decide(tats[shard], now) {
                tats[shard] = Some(tat_ms);
                admitted += 1;
                per_item[shard] += 1;
            }
        }
        // At most the rate over 10 s plus the burst; the shards' chance leaves a few percent.
        assert!(admitted <= 10_000 + 1000, "{admitted}");
        assert!(admitted >= 10_000 * 95 / 100, "{admitted}");
        for n in per_item {
            assert!(n <= 1000 + 100, "one item took {n}");
        }
    }

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
