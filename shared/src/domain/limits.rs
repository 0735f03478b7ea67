//! A service's limits: at most N calls in flight and at most R calls a second (with a burst),
//! for the whole service and optionally per action, kept together by every agent through the
//! state store.
//!
//! Calls in flight are **slots**: a call takes one of the key's N slots before it goes out, as
//! a lease that runs out at the call's own deadline (so an agent that dies mid-call frees its
//! slot by then), and gives it back when the call ends. The rate is GCRA
//! ([`super::rate`]) on the key's item. A call over a limit is not made: the step is handed
//! back with the time to try again ([`Over`]), a deferral like an open breaker's, which counts
//! no failure and holds no agent.

use super::problem::Problem;
use super::rate::RateLimit;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The most slots one key may have: its leases live in one item (about 40 bytes each, under
/// DynamoDB's 400 KB and within a few write units).
pub const MAX_CONCURRENCY: u32 = 200;
/// The highest rate a definition may ask for (a limiter item takes 1,000 writes a second; past
/// [`super::rate::PER_ITEM`] the allowance is split over several).
pub const MAX_PER_SECOND: f64 = 10_000.0;

/// `limits` of a service: for all its calls, and per action on top.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServiceLimits {
    /// At most this many calls of the service in flight at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u32>,
    /// At most `perSecond` calls of the service a second on average, `burst` at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<Rate>,
    /// Limits of one action's calls, kept besides the service's (a call takes both).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub actions: BTreeMap<String, Limit>,
    /// Limits of each tenant's calls (each caller's, or each value of a search key): its
    /// share of the service, kept besides the service's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_key: Option<PerKey>,
}

/// `perKey: {key, concurrency, rate}`: the limits each value of `key` has on its own. `key` is
/// `caller` (each caller of sas: a team, an application) or the name of a search key of the
/// calling task's workflow (each account, each customer). A call whose task has no value for
/// it passes the service's own limits only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PerKey {
    pub key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<Rate>,
}

/// The name under which a call's keys ([`CallKeys`]) hold its task's caller (its tenant).
pub const CALLER_KEY: &str = "caller";

/// The values a call may be limited by (`perKey`): its task's search keys by name, and its
/// caller's tenant under [`CALLER_KEY`].
pub type CallKeys = BTreeMap<String, String>;

/// One set of limits: calls in flight, calls a second.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Limit {
    /// At most this many calls in flight at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u32>,
    /// At most `perSecond` calls a second on average, `burst` at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<Rate>,
}

/// `rate: {perSecond, burst}`: `burst` (default 1: calls evenly spaced) at once, then
/// `perSecond`. Over any `t` seconds at most `burst + perSecond × t` calls go out.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Rate {
    pub per_second: f64,
    #[serde(default = "one")]
    pub burst: u32,
}

fn one() -> u32 {
    1
}

// A definition's rate is checked finite and positive before it is used (`problems`), and a
// definition compares equal to itself as published: `Eq` is sound for the values kept.
impl Eq for Rate {}

impl Rate {
    pub fn as_limit(&self) -> RateLimit {
        RateLimit {
            per_second: self.per_second,
            burst: self.burst,
        }
    }
}

/// What one limited call must pass: each key with its limit (the service's, then the action's).
#[derive(Debug, Clone, PartialEq)]
pub struct Gate {
    pub key: String,
    pub concurrency: Option<u32>,
    pub rate: Option<RateLimit>,
    /// `concurrency` is the deployment's share, not a limit the service declared: a call of a
    /// service its breaker marks fast takes no slot of it ([`super::breaker::Pace`]).
    pub shared: bool,
}

impl ServiceLimits {
    /// The service's own limit (all its calls).
    pub fn all(&self) -> Limit {
        Limit {
            concurrency: self.concurrency,
            rate: self.rate,
        }
    }

    /// The gates a call of `action` of `service` passes, in order (the service's first), with
    /// `share` as the service's concurrency when it declares none (the deployment's cap on the
    /// agents one service may hold; `None`: no cap).
    pub fn gates(
        this: Option<&Self>,
        service: &str,
        action: &str,
        share: Option<u32>,
        keys: &CallKeys,
    ) -> Vec<Gate> {
        let all = this.map(Self::all).unwrap_or_default();
        let mut gates = vec![];
        let concurrency = all.concurrency.or(share);
        if concurrency.is_some() || all.rate.is_some() {
            gates.push(Gate {
                key: service_key(service, None),
                concurrency,
                rate: all.rate.map(|r| r.as_limit()),
                shared: all.concurrency.is_none() && share.is_some(),
            });
        }
        if let Some(l) = this.and_then(|l| l.actions.get(action))
            && (l.concurrency.is_some() || l.rate.is_some())
        {
            gates.push(Gate {
                key: service_key(service, Some(action)),
                concurrency: l.concurrency,
                rate: l.rate.map(|r| r.as_limit()),
                shared: false,
            });
        }
        // The tenant's share: a gate of its own per value.
        if let Some(per) = this.and_then(|l| l.per_key.as_ref())
            && (per.concurrency.is_some() || per.rate.is_some())
            && let Some(value) = keys.get(&per.key)
        {
            gates.push(Gate {
                key: tenant_key(service, &per.key, value),
                concurrency: per.concurrency,
                rate: per.rate.map(|r| r.as_limit()),
                shared: false,
            });
        }
        gates
    }
}

/// The limiter key of one value of a service's `perKey`: `service#<name>@<key>#<digest>`, the
/// value's digest (SHA-256, 16 hex digits) so a long value makes no long key, and apart from
/// the action keys (`@` is no action's).
pub fn tenant_key(service: &str, key: &str, value: &str) -> String {
    use sha2::Digest;
    let digest = hex::encode(sha2::Sha256::digest(value.as_bytes()));
    format!("service#{service}@{key}#{}", &digest[..16])
}

/// The limiter key of a service (or one of its actions): `service#<name>[#<action>]`, apart
/// from the callers' keys (hex digests) in the same items.
pub fn service_key(service: &str, action: Option<&str>) -> String {
    match action {
        Some(a) => format!("service#{service}#{a}"),
        None => format!("service#{service}"),
    }
}

/// A call over one of its limits, and when to try it again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Over {
    pub key: String,
    /// `concurrency 5` or `rate 20/s`: which limit, for the history line.
    pub limit: String,
    /// A rate (else a concurrency) limit.
    pub rate: bool,
    pub retry_after: chrono::Duration,
}

/// What a slot store decides for one holder of `key`'s `limit` slots at `now_ms`, given the
/// leases held (holder, until): take one, or come back when the first lease runs out at the
/// latest (`next_free_ms`). Expired leases (until ≤ now) are free.
pub fn take_slot<'a>(
    held: impl IntoIterator<Item = (&'a str, i64)>,
    limit: u32,
    now_ms: i64,
) -> SlotDecision {
    let live: Vec<i64> = held
        .into_iter()
        .filter(|(_, until)| *until > now_ms)
        .map(|(_, until)| until)
        .collect();
    if (live.len() as u64) < u64::from(limit) {
        SlotDecision::Take
    } else {
        SlotDecision::Full {
            next_free_ms: live.into_iter().min().unwrap_or(now_ms),
        }
    }
}

/// What [`take_slot`] says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotDecision {
    Take,
    Full { next_free_ms: i64 },
}

/// The problems of `limits` at `at` (e.g. `/services/0/limits`).
pub fn problems(at: &str, limits: &ServiceLimits, problems: &mut Vec<Problem>) {
    let mut check = |at: String, l: &Limit| {
        if l.concurrency.is_none() && l.rate.is_none() {
            problems.push(Problem {
                at: at.clone(),
                message: "give `concurrency`, `rate` or both".into(),
            });
        }
        if let Some(c) = l.concurrency
            && !(1..=MAX_CONCURRENCY).contains(&c)
        {
            problems.push(Problem {
                at: format!("{at}/concurrency"),
                message: format!("{c}: at least 1, at most {MAX_CONCURRENCY} calls in flight"),
            });
        }
        if let Some(r) = l.rate {
            if !(r.per_second.is_finite() && r.per_second > 0.0 && r.per_second <= MAX_PER_SECOND) {
                problems.push(Problem {
                    at: format!("{at}/rate/perSecond"),
                    message: format!(
                        "{}: more than 0, at most {MAX_PER_SECOND} calls a second",
                        r.per_second
                    ),
                });
            }
            if !(1..=100_000).contains(&r.burst) {
                problems.push(Problem {
                    at: format!("{at}/rate/burst"),
                    message: format!("{}: at least 1, at most 100000 calls at once", r.burst),
                });
            }
        }
    };
    let all = limits.all();
    if all.concurrency.is_some()
        || all.rate.is_some()
        || (limits.actions.is_empty() && limits.per_key.is_none())
    {
        check(at.to_owned(), &all);
    }
    for (action, l) in &limits.actions {
        check(
            format!(
                "{at}/actions/{}",
                action.replace('~', "~0").replace('/', "~1")
            ),
            l,
        );
    }
    if let Some(per) = &limits.per_key {
        check(
            format!("{at}/perKey"),
            &Limit {
                concurrency: per.concurrency,
                rate: per.rate,
            },
        );
        if per.key != CALLER_KEY
            && let Some(why) = crate::domain::keys::name_problem(&per.key)
        {
            problems.push(Problem {
                at: format!("{at}/perKey/key"),
                message: format!("`{CALLER_KEY}`, or a search key's name: {why}"),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: serde_json::Value) -> ServiceLimits {
        serde_json::from_value(v).expect("limits parse")
    }

    #[test]
    fn a_call_passes_the_services_gate_then_its_actions() {
        let l = parse(json!({
            "concurrency": 5,
            "rate": {"perSecond": 20, "burst": 4},
            "actions": {"transfer": {"concurrency": 2}}
        }));
        let gates = ServiceLimits::gates(Some(&l), "bank", "transfer", Some(10), &CallKeys::new());
        assert_eq!(gates.len(), 2);
        assert_eq!(gates[0].key, "service#bank");
        assert_eq!(
            gates[0].concurrency,
            Some(5),
            "the service's own, not the share"
        );
        assert_eq!(
            gates[0].rate.map(|r| (r.per_second, r.burst)),
            Some((20.0, 4))
        );
        assert_eq!(gates[1].key, "service#bank#transfer");
        assert_eq!(gates[1].concurrency, Some(2));
        // Another action: the service's gate only.
        assert_eq!(
            ServiceLimits::gates(Some(&l), "bank", "hold", None, &CallKeys::new()).len(),
            1
        );
        // No limits: the share alone, or nothing at all.
        let shared = ServiceLimits::gates(None, "bank", "hold", Some(10), &CallKeys::new());
        assert_eq!(shared.len(), 1);
        assert_eq!((shared[0].concurrency, shared[0].rate), (Some(10), None));
        assert!(shared[0].shared, "the share, not a declared limit");
        assert!(!gates[0].shared && !gates[1].shared, "declared limits");
        assert!(ServiceLimits::gates(None, "bank", "hold", None, &CallKeys::new()).is_empty());
        // A rate alone keeps the share as the concurrency.
        let rated = parse(json!({"rate": {"perSecond": 2}}));
        let g = ServiceLimits::gates(Some(&rated), "bank", "hold", Some(10), &CallKeys::new());
        assert_eq!(g[0].concurrency, Some(10));
        assert!(g[0].shared, "its concurrency is the share");
        assert_eq!(g[0].rate.map(|r| r.burst), Some(1), "burst defaults to 1");
    }

    #[test]
    fn a_slot_is_free_below_the_limit_or_when_a_lease_ran_out() {
        assert_eq!(take_slot([], 1, 0), SlotDecision::Take);
        let held = [("a", 500), ("b", 300)];
        assert_eq!(take_slot(held, 3, 100), SlotDecision::Take);
        assert_eq!(
            take_slot(held, 2, 100),
            SlotDecision::Full { next_free_ms: 300 }
        );
        // b's lease ran out (its agent died mid-call): its slot is free.
        assert_eq!(take_slot(held, 2, 300), SlotDecision::Take);
    }

    #[test]
    fn a_tenant_passes_a_gate_of_its_own_besides_the_services() {
        let l = parse(json!({
            "concurrency": 10,
            "perKey": {"key": "accountId", "concurrency": 1, "rate": {"perSecond": 2}}
        }));
        let keys = |pairs: &[(&str, &str)]| -> CallKeys {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        let a = ServiceLimits::gates(
            Some(&l),
            "bank",
            "pay",
            None,
            &keys(&[("accountId", "a-1")]),
        );
        assert_eq!(a.len(), 2);
        assert_eq!(a[0].key, "service#bank");
        assert_eq!(a[1].key, tenant_key("bank", "accountId", "a-1"));
        assert!(
            a[1].key.starts_with("service#bank@accountId#"),
            "{}",
            a[1].key
        );
        assert_eq!(a[1].concurrency, Some(1));
        assert_eq!(a[1].rate.map(|r| r.per_second), Some(2.0));
        let b = ServiceLimits::gates(
            Some(&l),
            "bank",
            "pay",
            None,
            &keys(&[("accountId", "a-2")]),
        );
        assert_ne!(a[1].key, b[1].key, "each value its own gate");
        let none = ServiceLimits::gates(Some(&l), "bank", "pay", None, &keys(&[("other", "x")]));
        assert_eq!(
            none.len(),
            1,
            "no value for the key: the service's own limits only"
        );
        let callers = parse(json!({"perKey": {"key": "caller", "concurrency": 3}}));
        let c = ServiceLimits::gates(
            Some(&callers),
            "bank",
            "pay",
            None,
            &keys(&[(CALLER_KEY, "0a1b")]),
        );
        assert_eq!(c.len(), 1, "{c:?}");
        assert_eq!(c[0].concurrency, Some(3));
        let mut p = vec![];
        problems("/l", &callers, &mut p);
        assert!(p.is_empty(), "perKey alone is limits enough: {p:?}");
        let mut p = vec![];
        problems(
            "/l",
            &parse(json!({"perKey": {"key": "1st", "concurrency": 0}})),
            &mut p,
        );
        let at: Vec<&str> = p.iter().map(|p| p.at.as_str()).collect();
        assert_eq!(at, ["/l/perKey/concurrency", "/l/perKey/key"], "{p:?}");
    }

    #[test]
    fn limits_out_of_range_are_refused_with_their_field() {
        let mut p = vec![];
        let l = parse(json!({
            "concurrency": 0,
            "rate": {"perSecond": 0, "burst": 0},
            "actions": {"a/b": {}}
        }));
        problems("/services/0/limits", &l, &mut p);
        let at: Vec<&str> = p.iter().map(|p| p.at.as_str()).collect();
        assert_eq!(
            at,
            [
                "/services/0/limits/concurrency",
                "/services/0/limits/rate/perSecond",
                "/services/0/limits/rate/burst",
                "/services/0/limits/actions/a~1b",
            ]
        );
        let mut p = vec![];
        problems("/l", &parse(json!({})), &mut p);
        assert_eq!(p.len(), 1, "empty limits say what to give: {p:?}");
        let mut p = vec![];
        problems(
            "/l",
            &parse(json!({"concurrency": 5, "rate": {"perSecond": 0.5}})),
            &mut p,
        );
        assert!(p.is_empty(), "{p:?}");
        assert!(serde_json::from_value::<ServiceLimits>(json!({"concurency": 5})).is_err());
    }
}
