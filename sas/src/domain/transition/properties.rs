//! The transitions' property: no sequence of events breaks an invariant of the record.

use super::testkit::*;
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Ev {
    Claim(u8),
    Reply {
        attempt_back: u8,
        step_shift: i8,
        undo: bool,
        /// 0: failed, 1: deferred (circuit open), 2: refused (a business outcome),
        /// 3: accepted (callback), 4: heartbeat, otherwise succeeded.
        kind: u8,
    },
    /// A service's callback for the current step (shifted), under its key's generation
    /// (less `generation_back`); `kind` as for replies.
    Callback {
        generation_back: u8,
        step_shift: i8,
        kind: u8,
    },
    Advance(u16),
    Expire(u8),
    Delivered,
    Retry,
    Compensate,
    Cancel,
}

fn ev() -> impl Strategy<Value = Ev> {
    prop_oneof![
        3 => (0u8..3).prop_map(Ev::Claim),
        5 => (0u8..2, -1i8..2, proptest::bool::weighted(0.2), 0u8..13)
            .prop_map(|(a, s, undo, kind)| Ev::Reply { attempt_back: a, step_shift: s, undo, kind }),
        2 => (0u8..2, -1i8..2, 0u8..6)
            .prop_map(|(g, s, kind)| Ev::Callback { generation_back: g, step_shift: s, kind }),
        2 => (0u16..40).prop_map(Ev::Advance),
        2 => (0u8..10).prop_map(Ev::Expire),
        1 => Just(Ev::Delivered),
        1 => Just(Ev::Retry),
        1 => Just(Ev::Compensate),
        1 => Just(Ev::Cancel),
    ]
}

/// A workflow of 1 to 8 steps, each with or without an undo, perhaps with a pivot.
fn shape() -> impl Strategy<Value = examples::Shape> {
    proptest::collection::vec(proptest::bool::ANY, 1..=8).prop_flat_map(|undos| {
        let n = undos.len();
        (Just(undos), proptest::option::of(0..n)).prop_map(|(undos, pivot)| {
            // Nothing after the pivot has an undo (validation refuses it).
            let undos = undos
                .iter()
                .enumerate()
                .map(|(i, u)| *u && pivot.is_none_or(|p| i <= p))
                .collect();
            examples::Shape { undos, pivot }
        })
    })
}

/// What each step's condition gives, drawn: it runs, it is skipped, or it cannot be decided.
#[derive(Debug, Clone, Copy)]
enum Gate {
    Run,
    Skip,
    Fail,
}

fn gate() -> impl Strategy<Value = Gate> {
    prop_oneof![6 => Just(Gate::Run), 3 => Just(Gate::Skip), 1 => Just(Gate::Fail)]
}

/// A router that decides each step by a drawn table (the real conditions are tested in
/// `route`): what the transitions do with skipped steps and undecidable conditions, under any
/// interleaving.
struct Table(Vec<Gate>);

impl Router for Table {
    fn route(&self, r: &StateRecord, from: usize) -> Result<Route, RouteError> {
        let mut route = Route {
            next: r.steps.len(),
            skipped: vec![],
            decisions: vec![],
        };
        for j in from..r.steps.len() {
            let step = &r.steps[j];
            if step.sent {
                route.next = j;
                return Ok(route);
            }
            if step.status == crate::domain::StepStatus::Skipped {
                continue;
            }
            match self.0.get(j).copied().unwrap_or(Gate::Run) {
                Gate::Run => {
                    route.next = j;
                    return Ok(route);
                }
                Gate::Skip => route.skipped.push(j),
                Gate::Fail => {
                    return Err(RouteError {
                        step: j,
                        route,
                        error: "condition_failed: drawn".into(),
                    });
                }
            }
        }
        Ok(route)
    }
}

proptest! {
    /// No sequence of events reaches an invalid record, every accepted transition's
    /// condition holds on the record it came from and fails on the record it produced, the
    /// fencing attempt never goes back, and every transition leaves a history line.
    #[test]
    fn no_event_sequence_breaks_an_invariant(
        events in proptest::collection::vec(ev(), 0..80),
        shape in shape(),
        auto in proptest::bool::ANY,
        rounds in 0u32..2,
        callbacks in proptest::bool::ANY,
        start_within in 0i64..30,
        gates in proptest::collection::vec(gate(), 8),
    ) {
        let router = Table(gates);
        let p = with(|p| {
            p.auto_compensate = auto;
            p.max_rounds = rounds;
            p.start_within = Duration::seconds(start_within);
            // Every step a callback step (Accepted then applies; otherwise it is refused).
            p.callback = callbacks.then_some(CallbackPolicy {
                timeout: Duration::seconds(100),
                heartbeat: Some(Duration::seconds(30)),
            });
        });
        let mut now = t0();
        let w = examples::synthetic(&shape, &base());
        let mut r = record(&w, now);
        for e in events {
            let out = match e {
                Ev::Claim(i) => claim(&r, &format!("s-{i}"), now, &p, &router),
                Ev::Reply { attempt_back, step_shift, undo, kind } => {
                    let outcome = match kind {
                        0 => refused(),
                        1 => StepOutcome::Deferred {
                            until: now + Duration::seconds(20),
                            misconfigured: None,
                            paused: None,
                        },
                        2 => declined(),
                        3 => StepOutcome::Accepted,
                        4 => StepOutcome::Heartbeat,
                        5 => StepOutcome::TimedOut { error: "spent".into() },
                        _ => StepOutcome::succeeded(),
                    };
                    let step = (r.step_index as i64 + step_shift as i64).max(0) as usize;
                    apply_reply(&r, r.attempt.saturating_sub(attempt_back as u64), step, undo, &outcome, now, &p, &router)
                }
                Ev::Callback { generation_back, step_shift, kind } => {
                    let outcome = match kind {
                        0 => declined(),
                        1 => StepOutcome::Heartbeat,
                        _ => StepOutcome::Succeeded { result: Some("{\"id\":1}".into()) },
                    };
                    let step = (r.step_index as i64 + step_shift as i64).max(0) as usize;
                    let generation = r.steps.get(step).map_or(0, |s| s.generation);
                    apply_callback(&r, step, generation.saturating_sub(u32::from(generation_back)), &outcome, now, &p, &router)
                }
                Ev::Advance(s) => { now += Duration::seconds(s as i64); continue; }
                Ev::Expire(j) => expire(&r, now, &p, f64::from(j) / 10.0),
                Ev::Delivered => notice_delivered(&r, now),
                Ev::Retry => retry(&r, &ops(None), now, &p),
                Ev::Compensate => compensate(&r, &ops(None), now, &p),
                Ev::Cancel => cancel(&r, &ops(Some("test")), now, &p),
            };
            if let Ok(t) = out {
                prop_assert!(t.condition.holds(Some(&r)));
                prop_assert!(!t.condition.holds(Some(&t.record)));
                prop_assert!(t.record.attempt >= r.attempt);
                if let Err(e) = t.record.check(&p) {
                    return Err(TestCaseError::fail(format!("{e} after {:?} from {:?} to {:?}", t.effects, r, t.record)));
                }
                let logged = t.record.history.last() != r.history.last() || t.effects.is_empty();
                prop_assert!(logged, "no history line for {:?}", t.effects);
                r = t.record;
            }
        }
    }
}
