//! The circuit breaker of one remote service, shared by every agent instance: a versioned record
//! in the state store that moves only by conditional writes. Closed counts consecutive transient
//! faults; at the threshold it opens until a cooldown passes; then a budget of probe calls
//! (half-open) decides: a success closes it, a fault opens it again. A probe whose caller died
//! does not wedge it: once the probe window passes, a new budget is handed out.

use chrono::{DateTime, Duration, Utc};

/// The knobs of a breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerPolicy {
    /// Consecutive transient faults that open the breaker.
    pub threshold: u32,
    /// How long it stays open before probes are allowed.
    pub cooldown: Duration,
    /// Probe calls allowed per half-open window.
    pub probes: u32,
    /// How long a half-open window lasts before a new probe budget is handed out.
    pub probe_window: Duration,
    /// Pause the service automatically once its breaker has stayed open this long (a failed
    /// probe past it writes `Paused` instead of `Open`): its steps keep waiting, no more probes
    /// go out, and an operator resumes it. `None`: never.
    pub pause_after: Option<Duration>,
    /// How long an agent instance may reuse the breaker it last read or wrote instead of
    /// reading it again before each call (`BREAKER_CACHE_MS`; zero: read every time). See
    /// docs/guarantees.md, "A stale breaker is safe", for why a stale read is safe.
    pub read_cache: Duration,
}

impl Default for BreakerPolicy {
    fn default() -> Self {
        Self {
            threshold: 5,
            cooldown: Duration::seconds(5),
            probes: 1,
            probe_window: Duration::seconds(10),
            pause_after: None,
            read_cache: Duration::seconds(1),
        }
    }
}

/// Where the breaker is. (Serialized tagged by `state`, for stores that keep it as JSON.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "state", rename_all = "camelCase")]
pub enum BreakerState {
    Closed {
        failures: u32,
    },
    Open {
        until: DateTime<Utc>,
    },
    HalfOpen {
        probes_left: u32,
        until: DateTime<Utc>,
    },
    /// An operator paused the service: no call goes out and its steps wait (deferred, no
    /// failure counted) until an operator resumes it. Nothing an agent sees moves it.
    Paused {
        since: DateTime<Utc>,
    },
}

/// How long a step of a paused service waits before it looks again.
pub const PAUSE_RECHECK: Duration = Duration::seconds(60);

/// How the deferral of a step of the paused service `service` starts (its `lastError` reads
/// `<step>: service <name> paused by <who> (since <when>)`): what a resume looks for.
pub fn paused_by(service: &str) -> String {
    format!("service {service} paused by")
}

/// How long a call of a service capped by the deployment's share (it declares no concurrency
/// of its own) may take and still count as fast. A call out longer takes its slot of the share
/// then, if it went without one, and marks the service slow ([`Pace`]). A second: a call that
/// holds an agent longer is what the share is for; the services a task calls on its happy path
/// answer well within it, and take no slot.
pub const SLOW_CALL: Duration = Duration::seconds(1);

/// How long a fast mark lasts (a call renews it once half of it is spent), and how long a
/// service stays slow after a call outlived [`SLOW_CALL`].
pub const PACE_SPELL: Duration = Duration::minutes(5);

/// How a service capped by the share has answered lately, kept beside its breaker and read
/// with it. A service is presumed slow: each call takes a slot of the share, as every call of a
/// service with declared limits takes one of its limit. A call that ends within [`SLOW_CALL`],
/// [`PACE_SPELL`] after the last call that outlived it, marks the service fast until
/// [`PACE_SPELL`] on; while it is fast, its calls take no slot. A call that outlives
/// [`SLOW_CALL`] ends the mark. So a fast service costs no slot writes, and the share still
/// caps a slow one: beyond it go at most the calls begun while it was still marked fast (within
/// one [`SLOW_CALL`], plus each agent's breaker read cache, of its first slow call), and each
/// of those counts against the share once it outlives [`SLOW_CALL`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Pace {
    /// Until when its calls take no slot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fast_until: Option<DateTime<Utc>>,
    /// When a call last outlived [`SLOW_CALL`] (as its agent saw it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slow_at: Option<DateTime<Utc>>,
}

/// A write of a service's [`Pace`]; the store applies it as [`Pace::apply`] says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PaceMark {
    /// Fast until `until`: written only if no call outlived [`SLOW_CALL`] after `calm_since`
    /// and the stored mark ends earlier.
    Fast {
        until: DateTime<Utc>,
        calm_since: DateTime<Utc>,
    },
    /// A call outlived [`SLOW_CALL`] at `at`: the fast mark ends; written only if no later
    /// slow call is stored.
    Slow { at: DateTime<Utc> },
}

impl Pace {
    /// Whether the calls at `now` take no slot of the share.
    pub fn is_fast(&self, now: DateTime<Utc>) -> bool {
        self.fast_until.is_some_and(|until| now < until)
    }

    /// What to write after a call at `now` that ended within [`SLOW_CALL`] (`slow` false) or
    /// outlived it, given this pace as the agent last read it. `None`: nothing new to say (a
    /// fast mark with more than half its spell to run, a slow mark written lately).
    pub fn after_call(&self, now: DateTime<Utc>, slow: bool) -> Option<PaceMark> {
        if slow {
            let lately = self.slow_at.is_some_and(|at| now - at < PACE_SPELL / 2);
            return (self.is_fast(now) || !lately).then_some(PaceMark::Slow { at: now });
        }
        let calm_since = now - PACE_SPELL;
        if self.slow_at.is_some_and(|at| at > calm_since) {
            return None;
        }
        let until = now + PACE_SPELL;
        self.fast_until
            .is_none_or(|u| u - now < PACE_SPELL / 2)
            .then_some(PaceMark::Fast { until, calm_since })
    }

    /// The pace once `mark` is applied to it; `None`: the mark's condition fails (a later mark
    /// is stored, or a slow call came after `calm_since`) and nothing is written.
    pub fn apply(&self, mark: PaceMark) -> Option<Pace> {
        match mark {
            PaceMark::Fast { until, calm_since } => {
                let calm = self.slow_at.is_none_or(|at| at <= calm_since);
                let later = self.fast_until.is_none_or(|u| u < until);
                (calm && later).then_some(Pace {
                    fast_until: Some(until),
                    ..*self
                })
            }
            PaceMark::Slow { at } => self.slow_at.is_none_or(|s| s < at).then_some(Pace {
                fast_until: None,
                slow_at: Some(at),
            }),
        }
    }
}

/// The stored breaker of the service `name`. `version` 0: not stored yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BreakerRecord {
    pub name: String,
    pub state: BreakerState,
    pub version: u64,
    /// Who paused the service and why (`principal: reason`), while it is paused.
    pub note: Option<String>,
    /// Since when the breaker has been open without closing in between (through its probes'
    /// half-open windows); `None` while closed.
    pub open_since: Option<DateTime<Utc>>,
    /// While closed, the tasks whose misconfigured answers (401, 403, 404...) are counted in
    /// `failures` since it last closed clean: such an answer may be about one request (a path
    /// built from its input), so each task counts once ([`BreakerRecord::on_misconfigured`]).
    /// At most `threshold` entries: opening clears it.
    pub fault_keys: Vec<String>,
    /// How the service has answered lately: stored apart from the breaker's moves (a move
    /// neither writes nor checks it) and read with them.
    pub pace: Pace,
}

/// What a caller may do now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Closed: call.
    Call,
    /// Write this record (taking one probe from the budget); if the write wins, call.
    Probe(BreakerRecord),
    /// Do not call before `retry_at`.
    Reject { retry_at: DateTime<Utc> },
}

impl BreakerRecord {
    /// A closed breaker that was never stored.
    pub fn closed(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            state: BreakerState::Closed { failures: 0 },
            version: 0,
            note: None,
            open_since: None,
            fault_keys: Vec::new(),
            pace: Pace::default(),
        }
    }

    fn to(&self, state: BreakerState) -> Self {
        Self {
            name: self.name.clone(),
            state,
            version: self.version + 1,
            note: None,
            open_since: match state {
                BreakerState::Closed { .. } => None,
                _ => self.open_since,
            },
            fault_keys: match state {
                BreakerState::Closed { failures } if failures > 0 => self.fault_keys.clone(),
                _ => Vec::new(),
            },
            pace: self.pace,
        }
    }

    pub fn is_paused(&self) -> bool {
        matches!(self.state, BreakerState::Paused { .. })
    }

    /// An operator pauses the service at `now`; `None` if it is paused already.
    pub fn pause(&self, now: DateTime<Utc>, note: String) -> Option<Self> {
        (!self.is_paused()).then(|| Self {
            note: Some(note),
            ..self.to(BreakerState::Paused { since: now })
        })
    }

    /// An operator resumes a paused service: closed, with a clean count. `None` if it is not
    /// paused.
    pub fn resume(&self) -> Option<Self> {
        self.is_paused()
            .then(|| self.to(BreakerState::Closed { failures: 0 }))
    }

    pub fn is_closed(&self) -> bool {
        matches!(self.state, BreakerState::Closed { .. })
    }

    /// Whether a call may go out at `now`.
    pub fn decide(&self, now: DateTime<Utc>, p: &BreakerPolicy) -> Decision {
        let fresh_budget = || {
            Decision::Probe(self.to(BreakerState::HalfOpen {
                probes_left: p.probes.max(1) - 1,
                until: now + p.probe_window,
            }))
        };
        match self.state {
            BreakerState::Closed { .. } => Decision::Call,
            BreakerState::Open { until } if now < until => Decision::Reject { retry_at: until },
            BreakerState::Open { .. } => fresh_budget(),
            BreakerState::HalfOpen { until, .. } if now >= until => fresh_budget(),
            BreakerState::HalfOpen {
                probes_left: 0,
                until,
            } => Decision::Reject { retry_at: until },
            BreakerState::HalfOpen { probes_left, until } => {
                Decision::Probe(self.to(BreakerState::HalfOpen {
                    probes_left: probes_left - 1,
                    until,
                }))
            }
            BreakerState::Paused { .. } => Decision::Reject {
                retry_at: now + PAUSE_RECHECK,
            },
        }
    }

    /// A healthy answer (a success, or a permanent refusal): closes the breaker. `None`: no
    /// write needed.
    pub fn on_success(&self) -> Option<Self> {
        (self.state != BreakerState::Closed { failures: 0 } && !self.is_paused())
            .then(|| self.to(BreakerState::Closed { failures: 0 }))
    }

    /// A misconfigured answer (401, 403, 404, another 4xx the mapping does not refuse) to a
    /// call of task `task` at `now`. It may say the service is misconfigured (every task gets
    /// it) or only that this task's request is wrong (a lookup of an id that does not exist):
    /// while closed it counts once per task, so one task's retries never open the breaker and
    /// defer every other task of the service; `threshold` distinct tasks in a row do. On a
    /// probe (half-open) it reopens the breaker like any fault. `None`: no write needed.
    pub fn on_misconfigured(
        &self,
        now: DateTime<Utc>,
        task: &str,
        p: &BreakerPolicy,
    ) -> Option<Self> {
        if !self.is_closed() {
            return self.on_fault(now, p);
        }
        if self.fault_keys.iter().any(|k| k == task) {
            return None;
        }
        let mut next = self.on_fault(now, p)?;
        if next.is_closed() {
            next.fault_keys.push(task.to_owned());
        }
        Some(next)
    }

    /// A transient fault at `now`. `None`: no write needed (already open).
    pub fn on_fault(&self, now: DateTime<Utc>, p: &BreakerPolicy) -> Option<Self> {
        let open = BreakerState::Open {
            until: now + p.cooldown,
        };
        match self.state {
            BreakerState::Closed { failures } if failures + 1 < p.threshold.max(1) => {
                Some(self.to(BreakerState::Closed {
                    failures: failures + 1,
                }))
            }
            BreakerState::Closed { .. } => Some(Self {
                open_since: Some(now),
                ..self.to(open)
            }),
            BreakerState::HalfOpen { .. } => {
                let since = self.open_since.unwrap_or(now);
                if p.pause_after.is_some_and(|d| now - since >= d) {
                    Some(Self {
                        note: Some(format!(
                            "sas: open since {}, paused automatically",
                            since.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                        )),
                        open_since: Some(since),
                        ..self.to(BreakerState::Paused { since: now })
                    })
                } else {
                    Some(Self {
                        open_since: Some(since),
                        ..self.to(open)
                    })
                }
            }
            BreakerState::Open { .. } | BreakerState::Paused { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p() -> BreakerPolicy {
        BreakerPolicy {
            pause_after: None,
            threshold: 3,
            cooldown: Duration::seconds(10),
            probes: 1,
            probe_window: Duration::seconds(5),
            read_cache: Duration::zero(),
        }
    }

    fn step(r: &mut BreakerRecord, f: impl FnOnce(&BreakerRecord) -> Option<BreakerRecord>) {
        if let Some(n) = f(r) {
            assert_eq!(n.version, r.version + 1, "every write bumps the version");
            *r = n;
        }
    }

    /// The record after the probe `b` sends at `at` (a decision other than a probe fails).
    fn probe(b: &BreakerRecord, at: DateTime<Utc>, p: &BreakerPolicy) -> BreakerRecord {
        match b.decide(at, p) {
            Decision::Probe(probe) => probe,
            other => panic!("a probe at {at}, not {other:?}"),
        }
    }

    #[test]
    fn opens_at_the_threshold_rejects_then_probes_and_closes() {
        let t = Utc::now();
        let mut b = BreakerRecord::closed("payment");
        for _ in 0..2 {
            step(&mut b, |b| b.on_fault(t, &p()));
            assert_eq!(b.decide(t, &p()), Decision::Call);
        }
        step(&mut b, |b| b.on_fault(t, &p()));
        let open_until = t + Duration::seconds(10);
        assert_eq!(b.state, BreakerState::Open { until: open_until });
        assert_eq!(b.on_fault(t, &p()), None, "already open");
        assert_eq!(
            b.decide(t + Duration::seconds(9), &p()),
            Decision::Reject {
                retry_at: open_until
            }
        );
        let later = open_until + Duration::seconds(1);
        b = probe(&b, later, &p());
        assert!(
            matches!(b.decide(later, &p()), Decision::Reject { .. }),
            "one probe per window"
        );
        step(&mut b, |b| b.on_success());
        assert!(b.is_closed());
        assert_eq!(b.on_success(), None, "closed and clean: no write");
    }

    #[test]
    fn misconfigured_answers_count_once_per_task() {
        let t = Utc::now();
        let mut b = BreakerRecord::closed("accounts");
        // One task's 404s, however many: one failure, no opening.
        for _ in 0..10 {
            step(&mut b, |b| b.on_misconfigured(t, "task-a", &p()));
        }
        assert_eq!(b.state, BreakerState::Closed { failures: 1 });
        assert_eq!(b.fault_keys, ["task-a"]);
        // A success of another task closes it clean and forgets the task.
        step(&mut b, |b| b.on_success());
        assert_eq!(
            (b.state, b.fault_keys.len()),
            (BreakerState::Closed { failures: 0 }, 0)
        );
        // A transient fault still counts each time, and keeps the tasks counted.
        step(&mut b, |b| b.on_misconfigured(t, "task-a", &p()));
        step(&mut b, |b| b.on_fault(t, &p()));
        assert_eq!(b.state, BreakerState::Closed { failures: 2 });
        assert_eq!(b.on_misconfigured(t, "task-a", &p()), None);
        // Three distinct tasks in a row (the threshold): the service is misconfigured.
        step(&mut b, |b| b.on_misconfigured(t, "task-b", &p()));
        assert!(matches!(b.state, BreakerState::Open { .. }), "{b:?}");
        assert!(b.fault_keys.is_empty(), "opening clears the tasks");
        // A failed probe reopens it, whoever's it was.
        let later = t + Duration::seconds(11);
        b = probe(&b, later, &p());
        step(&mut b, |b| b.on_misconfigured(later, "task-a", &p()));
        assert!(matches!(b.state, BreakerState::Open { .. }), "{b:?}");
    }

    #[test]
    fn a_paused_service_takes_no_call_and_only_an_operator_resumes_it() {
        let t = Utc::now();
        let mut b = BreakerRecord::closed("core-banking");
        step(&mut b, |b| b.on_fault(t, &p()));
        step(&mut b, |b| b.pause(t, "arn:ops: bank maintenance".into()));
        assert_eq!(b.state, BreakerState::Paused { since: t });
        assert_eq!(b.note.as_deref(), Some("arn:ops: bank maintenance"));
        assert_eq!(b.pause(t, "again".into()), None, "paused already");
        for later in [t, t + Duration::days(3)] {
            assert_eq!(
                b.decide(later, &p()),
                Decision::Reject {
                    retry_at: later + PAUSE_RECHECK
                },
                "no probe however long it waits"
            );
        }
        assert_eq!(b.on_success(), None, "a late answer does not resume it");
        assert_eq!(b.on_fault(t, &p()), None);
        step(&mut b, |b| b.resume());
        assert_eq!(b.state, BreakerState::Closed { failures: 0 });
        assert_eq!(b.note, None);
        assert_eq!(b.resume(), None, "not paused");
        assert_eq!(b.decide(t, &p()), Decision::Call);
    }

    #[test]
    fn a_breaker_open_longer_than_pause_after_pauses_at_its_next_failed_probe() {
        let t = Utc::now();
        let policy = BreakerPolicy {
            pause_after: Some(Duration::seconds(30)),
            ..p()
        };
        let mut b = BreakerRecord::closed("core-banking");
        for _ in 0..3 {
            step(&mut b, |b| b.on_fault(t, &policy));
        }
        assert_eq!(b.open_since, Some(t));
        // A failed probe before the limit reopens it, keeping when it first opened.
        let t1 = t + Duration::seconds(11);
        b = probe(&b, t1, &policy);
        step(&mut b, |b| b.on_fault(t1, &policy));
        assert!(matches!(b.state, BreakerState::Open { .. }));
        assert_eq!(b.open_since, Some(t));
        // Past the limit, the next failed probe pauses it, with sas's note.
        let t2 = t + Duration::seconds(31);
        b = probe(&b, t2, &policy);
        step(&mut b, |b| b.on_fault(t2, &policy));
        assert_eq!(b.state, BreakerState::Paused { since: t2 });
        assert!(
            b.note
                .as_deref()
                .is_some_and(|n| n.starts_with("sas: open since"))
        );
        assert!(matches!(
            b.decide(t2 + Duration::days(1), &policy),
            Decision::Reject { .. }
        ));
        step(&mut b, |b| b.resume());
        assert_eq!(
            (b.state, b.open_since),
            (BreakerState::Closed { failures: 0 }, None)
        );
        // Without the setting, the same history only reopens it.
        let mut open = BreakerRecord::closed("x");
        for _ in 0..3 {
            step(&mut open, |b| b.on_fault(t, &p()));
        }
        let Decision::Probe(probe) = open.decide(t2, &p()) else {
            panic!("probe")
        };
        open = probe;
        step(&mut open, |b| b.on_fault(t2, &p()));
        assert!(matches!(open.state, BreakerState::Open { .. }));
    }

    #[test]
    fn a_failed_probe_reopens_and_a_lost_probe_gets_a_new_budget() {
        let t = Utc::now();
        let mut b = BreakerRecord::closed("inventory");
        for _ in 0..3 {
            step(&mut b, |b| b.on_fault(t, &p()));
        }
        let t1 = t + Duration::seconds(11);
        b = probe(&b, t1, &p());
        step(&mut b, |b| b.on_fault(t1, &p()));
        assert!(matches!(b.state, BreakerState::Open { .. }));
        let t2 = t1 + Duration::seconds(11);
        b = probe(&b, t2, &p());
        // The prober died: after the window a new probe goes out.
        assert!(matches!(b.decide(t2, &p()), Decision::Reject { .. }));
        assert!(matches!(
            b.decide(t2 + Duration::seconds(6), &p()),
            Decision::Probe(_)
        ));
    }

    #[test]
    fn a_service_is_presumed_slow_until_a_call_ends_within_slow_call() {
        let t = Utc::now();
        let pace = Pace::default();
        assert!(!pace.is_fast(t), "never marked: every call takes a slot");
        let mark = pace
            .after_call(t, false)
            .expect("a fast call marks it fast");
        let fast = pace.apply(mark).expect("nothing stored contradicts it");
        assert_eq!(fast.fast_until, Some(t + PACE_SPELL));
        assert!(fast.is_fast(t + PACE_SPELL - Duration::milliseconds(1)));
        assert!(!fast.is_fast(t + PACE_SPELL), "the mark runs out");
        assert_eq!(
            fast.after_call(t + PACE_SPELL / 2 - Duration::seconds(1), false),
            None,
            "more than half the spell to run: no write"
        );
        let renew = fast
            .after_call(t + PACE_SPELL / 2 + Duration::seconds(1), false)
            .expect("half spent: renewed");
        assert_eq!(
            fast.apply(renew).and_then(|p| p.fast_until),
            Some(t + PACE_SPELL / 2 + Duration::seconds(1) + PACE_SPELL)
        );
        assert_eq!(fast.apply(mark), None, "a mark never moves back");
    }

    #[test]
    fn a_slow_call_ends_the_mark_and_keeps_the_service_slow_for_a_spell() {
        let t = Utc::now();
        let fast = Pace {
            fast_until: Some(t + PACE_SPELL),
            slow_at: None,
        };
        let slow = fast
            .apply(fast.after_call(t, true).expect("a slow call is written"))
            .expect("no later slow call stored");
        assert_eq!(
            slow,
            Pace {
                fast_until: None,
                slow_at: Some(t)
            }
        );
        assert_eq!(
            slow.after_call(t + Duration::seconds(10), true),
            None,
            "slow and said so lately: no write per slow call"
        );
        assert!(
            slow.after_call(t + PACE_SPELL / 2, true).is_some(),
            "a slow mark half a spell old is renewed"
        );
        assert_eq!(
            slow.after_call(t + PACE_SPELL - Duration::seconds(1), false),
            None,
            "within a spell of a slow call, a fast one marks nothing"
        );
        // A fast mark computed from a stale read (before the slow call) is refused.
        let stale = PaceMark::Fast {
            until: t + PACE_SPELL * 2,
            calm_since: t - Duration::seconds(1),
        };
        assert_eq!(slow.apply(stale), None);
        assert_eq!(
            slow.apply(PaceMark::Slow {
                at: t - Duration::seconds(1)
            }),
            None,
            "an earlier slow call is not written over a later one"
        );
        let calm = slow
            .after_call(t + PACE_SPELL, false)
            .expect("a spell after the slow call, fast again");
        assert!(slow.apply(calm).is_some_and(|p| p.is_fast(t + PACE_SPELL)));
    }

    #[test]
    fn a_move_of_the_breaker_keeps_its_pace() {
        let t = Utc::now();
        let mut b = BreakerRecord::closed("payment");
        b.pace.fast_until = Some(t + PACE_SPELL);
        let moved = b.on_fault(t, &p()).expect("a fault is written");
        assert_eq!(moved.pace, b.pace);
    }
}
