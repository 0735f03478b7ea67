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
    /// The record's task is a child its parent undoes as a unit, for the parent's undo attempt
    /// `attempt` (`undo_as_unit`).
    UndoAsUnit(u8),
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
        1 => (0u8..4).prop_map(Ev::UndoAsUnit),
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
        children in proptest::bool::ANY,
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
            // Every step a sub-workflow's (with callbacks): its undo is accepted, then
            // answered by the child's end, within its timeout.
            p.undo_timeout = children.then_some(Duration::seconds(300));
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
                            limited: None,
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
                Ev::Delivered => notice_delivered(&r, now, None),
                Ev::Retry => retry(&r, &ops(None), now, &p),
                Ev::Compensate => compensate(&r, &ops(None), now, &p),
                Ev::Cancel => cancel(&r, &ops(Some("test")), now, &p),
                Ev::UndoAsUnit(a) => undo_as_unit(&r, u64::from(a), now, &p),
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

/// The second property: workflows with a parallel group (and, in a second draw mode, a forEach
/// step and choices), routed by their real conditions, under any interleaving of events about
/// their branches and elements, checked against a model of what the runtime must do (written
/// here from the semantics, without the transitions' helpers). Their steps may be callback
/// steps and sub-workflow steps, whose answers come later.
mod parallel {
    use super::super::route::test_task;
    use super::super::testkit::*;
    use super::super::waiting::deliver;
    use crate::domain::inbox::Delivery;
    use crate::domain::state::{NoticeKind, ProcessState, StepStatus};
    use crate::domain::task::Task;
    use proptest::prelude::*;
    use serde_json::{Map, Value, json};
    use std::collections::HashSet;

    /// One drawn step: with or without an undo, with or without a condition (`when:
    /// input.gK`, the boolean drawn in the task's input).
    #[derive(Debug, Clone)]
    struct StepDraw {
        undo: bool,
        when: Option<bool>,
        /// A wait step of this many seconds (it calls no service, has no undo).
        wait: Option<u8>,
        /// ...that waits for the event named after it (`ev-<name>`), at most that long.
        event: bool,
        /// How its service answers (a step that is not a wait).
        call: Call,
    }

    /// How a step's service answers: at once; or it accepts the request first and answers
    /// later by a callback, within the step's `timeout` (this many seconds) from the
    /// acceptance (`callback: {timeout}`); or it is a sub-workflow step (`workflow: child`,
    /// `timeout`): to its parent a callback step whose call starts the child task and whose
    /// callback is the child's end, always undone (the child's compensation, its undo, is
    /// accepted first, then answered by the child's end); or it is a distributed forEach step
    /// over `input.items` (`distributed: true`, on the main line only; its `timeout`, this many
    /// seconds, bounds the agent's attempt that starts its run): to its parent a callback step
    /// whose call starts its run and whose callback is the run's end, within the run's 24 hours
    /// whatever its `timeout`, undone as a unit if it has an undo (accepted, then answered by
    /// the run's end), its elements, `maxConcurrency` and tolerance the run's own.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Call {
        Plain,
        Callback(u8),
        Child(u8),
        Run(u8),
    }

    impl Call {
        /// The callback timeout: how long the step waits for its callback once accepted.
        fn timeout(self) -> Option<Duration> {
            match self {
                Self::Plain => None,
                Self::Callback(s) | Self::Child(s) => Some(Duration::seconds(i64::from(s))),
                Self::Run(_) => Some(Duration::hours(crate::domain::workflow::RUN_TIMEOUT_HOURS)),
            }
        }

        /// Its call starts a record of sas's own (a child task, a run), whose end answers the
        /// step, and whose undo (its compensation) is accepted, then answered by that end.
        fn starts(self) -> bool {
            matches!(self, Self::Child(_) | Self::Run(_))
        }
    }

    /// How a step's service answers, a sub-workflow step or distributed forEach step with
    /// weight `starts` (of 8 for the others); on the main line (`main`) it may be a distributed
    /// forEach step (not in a parallel group's branch: validation refuses it there).
    fn call(main: bool, starts: u32) -> impl Strategy<Value = Call> {
        prop_oneof![
            6 => Just(Call::Plain),
            2 => (2u8..=20).prop_map(Call::Callback),
            starts => (2u8..=20).prop_map(Call::Child),
            if main { starts } else { 0 } => (2u8..=20).prop_map(Call::Run),
        ]
    }

    /// A drawn forEach step over `input.items`: with or without an undo and a condition, its
    /// `maxConcurrency` and `toleratedRefusals`.
    #[derive(Debug, Clone)]
    struct EachDraw {
        undo: bool,
        when: Option<bool>,
        max: u32,
        tolerated: u32,
    }

    /// A drawn choice: its cases (the drawn value of each case's `when: input.gK`, and its
    /// items), perhaps `otherwise`, perhaps a condition on the whole choice.
    #[derive(Debug, Clone)]
    struct ChoiceDraw {
        when: Option<bool>,
        cases: Vec<(bool, Vec<Item>)>,
        otherwise: Option<Vec<Item>>,
    }

    impl ChoiceDraw {
        /// The arms in the order the workflow lays out their steps: the cases, then
        /// `otherwise`.
        fn arms(&self) -> impl Iterator<Item = &Vec<Item>> {
            self.cases
                .iter()
                .map(|(_, a)| a)
                .chain(self.otherwise.iter())
        }

        fn arms_mut(&mut self) -> impl Iterator<Item = &mut Vec<Item>> {
            self.cases
                .iter_mut()
                .map(|(_, a)| a)
                .chain(self.otherwise.iter_mut())
        }

        /// The arm that runs: the first case that holds, else `otherwise` (if any).
        fn taken(&self) -> Option<usize> {
            self.cases
                .iter()
                .position(|(w, _)| *w)
                .or(self.otherwise.as_ref().map(|_| self.cases.len()))
        }
    }

    /// An entry of a line of steps.
    #[derive(Debug, Clone)]
    enum Item {
        Step(StepDraw),
        Each(EachDraw),
        Choice(ChoiceDraw),
    }

    /// A drawn workflow: a main line before a parallel group of 2-4 branches (perhaps with a
    /// condition on the whole group), and a main line after it; `items` elements in the
    /// task's `input.items` (for a forEach step).
    #[derive(Debug, Clone)]
    struct Draw {
        before: Vec<Item>,
        branches: Vec<Vec<Item>>,
        after: Vec<Item>,
        group_when: Option<bool>,
        items: usize,
        /// When the task is undone, what the first undo it accepted (a child's compensation,
        /// a run's undos) started fails to undo itself, and refuses that undo after accepting
        /// it.
        refuse_accepted_undo: bool,
    }

    fn step_draw(main: bool, starts: u32) -> impl Strategy<Value = StepDraw> {
        (
            proptest::bool::ANY,
            proptest::option::weighted(0.3, proptest::bool::ANY),
            proptest::option::weighted(0.12, 1u8..=40),
            proptest::bool::weighted(0.5),
            call(main, starts),
        )
            .prop_map(|(undo, when, wait, event, call)| StepDraw {
                undo,
                when,
                wait,
                event,
                call,
            })
    }

    /// A line of steps: the main line's (`main`) or a branch's.
    fn steps(r: std::ops::RangeInclusive<usize>, main: bool) -> impl Strategy<Value = Vec<Item>> {
        steps_of(r, main, 2)
    }

    /// A line of steps, sub-workflow steps and distributed forEach steps with weight `starts`.
    fn steps_of(
        r: std::ops::RangeInclusive<usize>,
        main: bool,
        starts: u32,
    ) -> impl Strategy<Value = Vec<Item>> {
        proptest::collection::vec(step_draw(main, starts).prop_map(Item::Step), r)
    }

    /// The first mode: 0-2 steps, a parallel group of 2-4 branches of 1-3 steps, 0-2 steps.
    fn draw() -> impl Strategy<Value = Draw> {
        (
            steps(0..=2, true),
            proptest::collection::vec(steps(1..=3, false), 2..=4),
            steps(0..=2, true),
            proptest::option::weighted(0.15, proptest::bool::ANY),
        )
            .prop_map(|(before, branches, after, group_when)| Draw {
                before,
                branches,
                after,
                group_when,
                items: 0,
                refuse_accepted_undo: false,
            })
    }

    /// The third mode: the first's, mostly sub-workflow steps and (on the main line, which
    /// comes first more often) distributed forEach steps over 0-3 items.
    fn draw_starts() -> impl Strategy<Value = Draw> {
        (
            steps_of(1..=3, true, 8),
            proptest::collection::vec(steps_of(1..=2, false, 8), 2..=3),
            steps_of(0..=2, true, 8),
            proptest::option::weighted(0.1, proptest::bool::ANY),
            0usize..=3,
            proptest::bool::weighted(0.3),
        )
            .prop_map(
                |(before, branches, after, group_when, items, refuse_accepted_undo)| Draw {
                    before,
                    branches,
                    after,
                    group_when,
                    items,
                    refuse_accepted_undo,
                },
            )
    }

    /// A choice of 1-3 cases of 0-2 steps, perhaps an `otherwise` of 0-1 step, at least one
    /// step in all (a choice runs at least one step in one of its arms); on the main line
    /// (`main`) or in a branch.
    fn choice_draw(main: bool) -> impl Strategy<Value = ChoiceDraw> {
        (
            proptest::option::weighted(0.2, proptest::bool::ANY),
            proptest::collection::vec((proptest::bool::weighted(0.4), steps(0..=2, main)), 1..=3),
            proptest::option::weighted(0.6, steps(0..=1, main)),
        )
            .prop_map(|(when, mut cases, otherwise)| {
                if cases.iter().all(|(_, a)| a.is_empty())
                    && otherwise.as_ref().is_none_or(Vec::is_empty)
                {
                    cases[0].1.push(Item::Step(StepDraw {
                        undo: true,
                        when: None,
                        wait: None,
                        event: false,
                        call: Call::Plain,
                    }));
                }
                ChoiceDraw {
                    when,
                    cases,
                    otherwise,
                }
            })
    }

    fn each_draw() -> impl Strategy<Value = EachDraw> {
        (
            proptest::bool::weighted(0.7),
            proptest::option::weighted(0.15, proptest::bool::ANY),
            1u32..=3,
            0u32..=2,
        )
            .prop_map(|(undo, when, max, tolerated)| EachDraw {
                undo,
                when,
                max,
                tolerated,
            })
    }

    /// The second mode: the first's lines, a choice in some branches (at a drawn place),
    /// perhaps a choice on the main line (before or after the group), and a forEach step over
    /// 0-6 items on the main line: before or after the group, or in a case of the main line's
    /// choice.
    fn draw_each() -> impl Strategy<Value = Draw> {
        let branch = (
            steps(1..=2, false),
            proptest::option::weighted(0.35, (choice_draw(false), 0usize..3)),
        )
            .prop_map(|(mut items, choice)| {
                if let Some((c, at)) = choice {
                    let at = at.min(items.len());
                    items.insert(at, Item::Choice(c));
                }
                items
            });
        (
            (
                steps(0..=2, true),
                proptest::collection::vec(branch, 2..=4),
                steps(0..=2, true),
                proptest::option::weighted(0.15, proptest::bool::ANY),
            ),
            (
                proptest::option::weighted(
                    0.5,
                    (choice_draw(true), proptest::bool::ANY, 0usize..3),
                ),
                each_draw(),
                // Before the group (reached soonest), after it, in a case of the choice, in a
                // branch of the group (in a case of its choice, if it has one).
                prop_oneof![3 => Just(0u8), 2 => Just(1), 2 => Just(2), 3 => Just(3), 1 => Just(4)],
                // Its place on its line: first (reached soonest) or later; the arm it is in.
                prop_oneof![2 => Just(0usize), 1 => 1usize..4],
                0usize..4,
                0usize..=6,
            ),
        )
            .prop_map(
                |(
                    (mut before, mut branches, mut after, group_when),
                    (choice, each, place, at, arm, items),
                )| {
                    let mut each = Some(Item::Each(each));
                    if place >= 3 {
                        // The forEach in a branch: its line, or an arm of its choice.
                        let n = branches.len();
                        let line = &mut branches[arm % n];
                        let choice = line
                            .iter()
                            .position(|item| matches!(item, Item::Choice(_)) && place == 4);
                        let line = match choice.map(|c| &mut line[c]) {
                            Some(Item::Choice(c)) => c.arms_mut().next().expect("an arm"),
                            _ => line,
                        };
                        let k = at.min(line.len());
                        line.insert(k, each.take().expect("one forEach"));
                    }
                    let choice = choice.map(|(mut c, before_group, pos)| {
                        if place == 2 {
                            // The forEach in an arm of the choice.
                            let n = c.arms().count();
                            if let Some(arm) = c.arms_mut().nth(arm % n) {
                                let k = at.min(arm.len());
                                arm.insert(k, each.take().expect("one forEach"));
                            }
                        }
                        (Item::Choice(c), before_group, pos)
                    });
                    let line = |before_group: bool| if before_group { 0 } else { 1 };
                    let mut lines = [&mut before, &mut after];
                    if let Some(e) = each.take().filter(|_| place < 3) {
                        let l = &mut lines[line(place != 1)];
                        let k = at.min(l.len());
                        l.insert(k, e);
                    }
                    if let Some((c, before_group, pos)) = choice {
                        let l = &mut lines[line(before_group)];
                        let k = pos.min(l.len());
                        l.insert(k, c);
                    }
                    Draw {
                        before,
                        branches,
                        after,
                        group_when,
                        items,
                        refuse_accepted_undo: false,
                    }
                },
            )
    }

    impl Draw {
        /// The definition (JSON, as a YAML document reads) and the task's input.
        fn definition(&self) -> (Value, Value) {
            fn cond(input: &mut Map<String, Value>, b: bool) -> Value {
                let key = format!("g{}", input.len());
                input.insert(key.clone(), json!(b));
                json!(format!("input.{key}"))
            }
            /// The steps of `items`, named `s0`, `s1`, ... in the order the workflow lays
            /// them out.
            fn line(
                items: &[Item],
                input: &mut Map<String, Value>,
                names: &mut usize,
            ) -> Vec<Value> {
                let mut out = vec![];
                for item in items {
                    let name = format!("s{names}");
                    *names += 1;
                    let mut v = json!({"name": name, "service": "s"});
                    let (undo, when) = match item {
                        Item::Step(StepDraw {
                            when,
                            wait: Some(secs),
                            event,
                            ..
                        }) => {
                            v = if *event {
                                json!({"name": name, "waitFor": format!("ev-{name}"), "within": format!("{secs}s")})
                            } else {
                                json!({"name": name, "wait": format!("{secs}s")})
                            };
                            (false, *when)
                        }
                        Item::Step(StepDraw {
                            when,
                            call: Call::Child(secs),
                            ..
                        }) => {
                            // Its undo is its own: the child's compensation.
                            v = json!({"name": name, "workflow": "child", "timeout": format!("{secs}s")});
                            (false, *when)
                        }
                        Item::Step(StepDraw {
                            undo,
                            when,
                            call: Call::Run(secs),
                            ..
                        }) => {
                            // Its concurrency and tolerance are its run's (any will do here).
                            v["forEach"] = json!("$.input.items");
                            v["distributed"] = json!(true);
                            v["maxConcurrency"] = json!(u32::from(*secs) * 50);
                            v["toleratedRefusals"] = json!(u32::from(*secs) % 3);
                            v["timeout"] = json!(format!("{secs}s"));
                            (*undo, *when)
                        }
                        Item::Step(s) => {
                            if let Call::Callback(secs) = s.call {
                                v["callback"] = json!({"timeout": format!("{secs}s")});
                            }
                            (s.undo, s.when)
                        }
                        Item::Each(e) => {
                            v["forEach"] = json!("$.input.items");
                            v["maxConcurrency"] = json!(e.max);
                            v["toleratedRefusals"] = json!(e.tolerated);
                            (e.undo, e.when)
                        }
                        Item::Choice(c) => {
                            let name = format!("choice-{name}");
                            let cases: Vec<Value> = c
                                .cases
                                .iter()
                                .map(|(w, arm)| {
                                    let when = cond(input, *w);
                                    json!({"when": when, "steps": line(arm, input, names)})
                                })
                                .collect();
                            let mut v = json!({"name": name, "choice": cases});
                            if let Some(arm) = &c.otherwise {
                                v["otherwise"] = json!({"steps": line(arm, input, names)});
                            }
                            if let Some(b) = c.when {
                                v["when"] = cond(input, b);
                            }
                            out.push(v);
                            continue;
                        }
                    };
                    if undo {
                        v["undo"] = json!({"action": format!("undo-{name}")});
                    }
                    if let Some(b) = when {
                        v["when"] = cond(input, b);
                    }
                    out.push(v);
                }
                out
            }
            let mut input = Map::new();
            let mut names = 0;
            let mut steps = line(&self.before, &mut input, &mut names);
            let branches: Vec<Value> = self
                .branches
                .iter()
                .enumerate()
                .map(|(b, br)| {
                    json!({"name": format!("arm-{b}"), "steps": line(br, &mut input, &mut names)})
                })
                .collect();
            let mut group = json!({"name": "group", "parallel": branches});
            if let Some(b) = self.group_when {
                group["when"] = cond(&mut input, b);
            }
            steps.push(group);
            steps.extend(line(&self.after, &mut input, &mut names));
            input.insert("items".into(), json!((0..self.items).collect::<Vec<_>>()));
            (json!({"name": "fan", "steps": steps}), Value::Object(input))
        }
    }

    #[derive(Debug, Clone)]
    enum Ev {
        Claim,
        /// An answer to the `pick`-th step, element or undo out: 0 success, 1 refusal, 2
        /// failure, 3 timed out, 4 deferred, 5 accepted (its answer comes later: by a callback
        /// for a step, as a reply for a sub-workflow or distributed forEach step's undo), 6
        /// faulted (an answer too large to keep: it took effect).
        Reply {
            pick: u8,
            outcome: u8,
        },
        /// A reply that must be stale: 0 an older attempt, 1 the next step, 2 the step before,
        /// 3 the other direction (undo or step), 4 a duplicate of the last reply applied.
        Stale {
            pick: u8,
            how: u8,
        },
        Advance(u16),
        Expire(u8),
        /// Time passes to the deadline of the `pick`-th step, element or undo out (an accepted
        /// step's: its callback timeout from the acceptance), and the supervisor finds it due.
        Due(u8),
        Delivered,
        Cancel,
        Retry,
        Skip,
        Compensate,
        /// A named event for the `pick`-th wait for events (its name), under a new `Event-Id`
        /// or (`repeat`) the last one sent.
        Event {
            pick: u8,
            repeat: bool,
        },
        /// A callback (0 success, 1 refusal, 2 failure: a callback carries no failure; 6 faulted:
        /// a child or run that ended CompensationFailed, or a result too large to keep) for the
        /// `pick`-th step a line of the record is at (out, handed back, or the one the task
        /// failed at; mostly one at a callback step), under `how`: 0 its key's generation; or
        /// one that must be stale: 1 another generation (an older one, or one not issued yet),
        /// 2 a step no line is at, 3 a duplicate of the last callback applied.
        Callback {
            pick: u8,
            outcome: u8,
            how: u8,
        },
    }

    /// How an event is applied: as usual; computed and dropped (the writer crashed before its
    /// write); computed from the copy of the record kept by `Keep` (a late writer); or the copy
    /// is taken.
    #[derive(Debug, Clone, Copy)]
    enum Mode {
        Normal,
        Dropped,
        Late,
        Keep,
    }

    /// The events, answers refused (a business outcome) with weight `refusals` (of 10), callbacks
    /// faulted with weight `faulted` (of 9).
    fn ev(refusals: u32, faulted: u32) -> impl Strategy<Value = Ev> {
        prop_oneof![
            4 => Just(Ev::Claim),
            8 => (0u8..4, prop_oneof![5 => Just(0u8), refusals => Just(1), 1 => Just(2), 2 => Just(3), 1 => Just(4), 3 => Just(5), 1 => Just(6)])
                .prop_map(|(pick, outcome)| Ev::Reply { pick, outcome }),
            4 => (
                0u8..4,
                prop_oneof![6 => Just(0u8), refusals => Just(1), 1 => Just(2), faulted => Just(6)],
                prop_oneof![6 => Just(0u8), 1 => Just(1), 1 => Just(2), 1 => Just(3)],
            )
                .prop_map(|(pick, outcome, how)| Ev::Callback { pick, outcome, how }),
            2 => (0u8..4, 0u8..5).prop_map(|(pick, how)| Ev::Stale { pick, how }),
            3 => (0u16..15).prop_map(Ev::Advance),
            2 => (0u8..10).prop_map(Ev::Expire),
            1 => (0u8..4).prop_map(Ev::Due),
            1 => Just(Ev::Delivered),
            1 => Just(Ev::Cancel),
            1 => Just(Ev::Retry),
            1 => Just(Ev::Skip),
            1 => Just(Ev::Compensate),
            3 => (0u8..4, proptest::bool::weighted(0.2))
                .prop_map(|(pick, repeat)| Ev::Event { pick, repeat }),
        ]
    }

    fn mode() -> impl Strategy<Value = Mode> {
        prop_oneof![
            12 => Just(Mode::Normal),
            1 => Just(Mode::Dropped),
            1 => Just(Mode::Late),
            1 => Just(Mode::Keep),
        ]
    }

    /// A step, element or undo out, as the record shows it: what a reply must name (the step
    /// and attempt; the element, for the model).
    #[derive(Debug, Clone, Copy)]
    struct Out {
        step: usize,
        /// The element of a forEach step (out, or whose undo is out).
        element: Option<usize>,
        attempt: u64,
        undo: bool,
        deadline: Option<DateTime<Utc>>,
    }

    impl Out {
        /// The unit the model keeps for it: (step, element; 0 for a step).
        fn unit(&self) -> (usize, usize) {
            (self.step, self.element.unwrap_or(0))
        }
    }

    fn outs(r: &StateRecord) -> Vec<Out> {
        if let Some(f) = &r.fanout {
            return f
                .branches
                .iter()
                .enumerate()
                .filter(|(_, b)| b.is_out())
                .map(|(k, b)| Out {
                    step: b.step_index,
                    element: f.each_of(k).map(|(_, k)| k),
                    attempt: b.attempt,
                    undo: false,
                    deadline: b.complete_by,
                })
                .collect();
        }
        let out = |undo| Out {
            step: r.step_index,
            element: if undo {
                r.undo_element(r.step_index)
            } else {
                None
            },
            attempt: r.attempt,
            undo,
            deadline: r.complete_by,
        };
        match r.process_state {
            ProcessState::Processing => vec![out(false)],
            ProcessState::Compensating if r.locked_by.is_some() => vec![out(true)],
            _ => vec![],
        }
    }

    /// The steps the lines of record `r` are at: each branch's (not an element's) while a
    /// group runs, else the main line's. A callback for any other step is stale.
    fn lines_at(r: &StateRecord) -> Vec<usize> {
        match &r.fanout {
            Some(f) => f
                .branches
                .iter()
                .enumerate()
                .filter(|(b, br)| f.each_of(*b).is_none() && br.step_index < br.end)
                .map(|(_, br)| br.step_index)
                .collect(),
            None => (r.step_index < r.steps.len())
                .then_some(r.step_index)
                .into_iter()
                .collect(),
        }
    }

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Outcome {
        Success,
        Refusal,
        Failure,
        TimedOut,
        Deferred,
        /// Accepted: the answer comes later.
        Accepted,
        /// It took effect, but its answer cannot be kept (`result_too_large`), or (a callback
        /// from sas itself) the child or run it started ended CompensationFailed: the task
        /// fails, and compensation undoes it.
        Faulted,
    }

    impl Outcome {
        fn of(k: u8) -> Self {
            match k {
                1 => Self::Refusal,
                2 => Self::Failure,
                3 => Self::TimedOut,
                4 => Self::Deferred,
                5 => Self::Accepted,
                6 => Self::Faulted,
                _ => Self::Success,
            }
        }

        /// The reply: an element's success carries its result, `{"e": k}`.
        fn reply(self, o: &Out, now: DateTime<Utc>) -> StepOutcome {
            match self {
                Self::Success => match o.element.filter(|_| !o.undo) {
                    Some(k) => StepOutcome::Succeeded {
                        result: Some(json!({ "e": k }).to_string()),
                    },
                    None => ok(),
                },
                Self::Refusal => declined(),
                Self::Failure => refused(),
                Self::TimedOut => StepOutcome::TimedOut {
                    error: "spent".into(),
                },
                Self::Deferred => StepOutcome::Deferred {
                    until: now + Duration::seconds(20),
                    misconfigured: None,
                    paused: None,
                    limited: None,
                },
                Self::Accepted => StepOutcome::Accepted,
                Self::Faulted => StepOutcome::Faulted {
                    error: "drawn: faulted".into(),
                },
            }
        }
    }

    /// What an accepted event was, for the model.
    #[derive(Debug, Clone, Copy)]
    enum Act {
        Claim,
        Reply(Out, Outcome),
        Expire,
        Delivered,
        Cancel,
        Retry,
        Skip,
        Compensate,
        /// A reply that must be rejected.
        Stale,
        /// A named event delivered: the wait for it (its step), and its `Event-Id`'s number.
        Event(usize, usize),
        /// A callback for a step (its unit), under the step's key generation (this one), with
        /// its outcome (a success or a refusal).
        Callback((usize, usize), u32, Outcome),
    }

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum EventWant {
        Ends,
        Kept,
        Refused,
    }

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Kind {
        Refused,
        Failed,
    }

    /// What the model knows of one unit: a step, or an element of a forEach step.
    #[derive(Debug, Clone)]
    struct Unit {
        /// The failure counter it counts against (see `Model::new`).
        line: usize,
        /// Sent, and not sent back unsent by an operator's retry of a refused step.
        sent: bool,
        /// Its last answer was a refusal or a failure: it had no effect.
        no_effect: bool,
        /// An element refused within its step's tolerance: over, for good, with no effect.
        tolerated: bool,
        /// An element over (succeeded, or refused within the tolerance): never sent again.
        over: bool,
        /// The deadline of its latest attempt.
        deadline: Option<DateTime<Utc>>,
        /// The latest deadline of an attempt that ended without an answer (timed out,
        /// deferred, cancelled), since its last answer: its undo waits past it, and an element
        /// holds its place under `maxConcurrency` until that deadline and the undo wait.
        unsure: Option<DateTime<Utc>>,
        /// It went out at least once.
        went_out: bool,
        /// Out: sent, and since then not answered, past its deadline at an expiry, or
        /// cancelled.
        out: bool,
        /// Its service accepted its key (under any attempt: the key is the same for every
        /// attempt, and the service answers a copy with its first acceptance): it may have
        /// taken effect, and answers by callback; a sub-workflow step's child exists, which its
        /// undo reaches wherever it is.
        accepted: bool,
        /// The child task or run its key started ended CompensationFailed (it answered the step
        /// `Faulted`): it waits for an operator, and refuses the step's undo meanwhile
        /// (`child_needs_operator`, `run_needs_operator`).
        needs_operator: bool,
    }

    impl Unit {
        fn new(line: usize) -> Self {
            Self {
                line,
                sent: false,
                no_effect: false,
                tolerated: false,
                over: false,
                deadline: None,
                unsure: None,
                went_out: false,
                out: false,
                accepted: false,
                needs_operator: false,
            }
        }
    }

    /// A forEach step's run, as the model keeps it.
    #[derive(Debug, Clone)]
    struct EachModel {
        max: u32,
        tolerated: u32,
        /// Refusals counted against the tolerance.
        refused: u32,
    }

    #[derive(Debug, Clone)]
    struct StepModel {
        undoable: bool,
        /// Whether it runs, by its conditions (its own, its groups', its choice's case) on the
        /// drawn input.
        runs: bool,
        each: Option<EachModel>,
        /// A wait step: out from its timer to its time, then done (nothing answers it).
        wait: bool,
        /// A wait for its event (`ev-<name>`): done when it comes, failed at its time.
        event: Option<String>,
        /// One unit per element for a forEach step, else one.
        units: Vec<Unit>,
        /// How its service answers (a forEach step's and a wait's: at once).
        call: Call,
    }

    /// What the runtime must do, from the steps and elements that went out (the effects) and
    /// the outcomes fed: which may have taken effect, what stopped the task first, what an
    /// operator did.
    #[derive(Debug)]
    struct Model {
        steps: Vec<StepModel>,
        threshold: u32,
        auto: bool,
        undo_wait: Duration,
        /// The failure count of each line.
        counts: Vec<u32>,
        /// The first refusal or failure since the task last went on.
        first: Option<Kind>,
        /// A refusal happened (since the task last went on): compensation ends Refused.
        refusal: bool,
        /// No step may go out: a refusal or a failure, a cancel, a compensation.
        halted: bool,
        /// An operator's cancel or compensate started the compensation.
        by_operator: bool,
        /// An operator acted (cancel, retry, skip, compensate).
        operator: bool,
        /// An undo was refused, failed or timed out.
        undo_trouble: bool,
        /// The undos sent, in order: (step, element).
        undos: Vec<(usize, usize)>,
        /// The task's deadline, while it applies (an operator's retry or skip past it takes
        /// the task over).
        deadline: Option<DateTime<Utc>>,
        /// The events kept for waits not reached yet (the names, in order).
        kept: Vec<String>,
        /// The `Event-Id`s (their numbers) the task took.
        taken: HashSet<usize>,
        dispatched: HashSet<(usize, u64, bool)>,
        /// A late callback took the task out of Error (see `Model::revive`): the alert it owed
        /// then stays in its notices.
        late: bool,
        /// The elements of `input.items`.
        items: usize,
    }

    /// Builds the model's steps from the drawn lines, in the order the workflow lays them out.
    struct Walk {
        steps: Vec<StepModel>,
        lines: usize,
        items: usize,
    }

    impl Walk {
        fn line(&mut self) -> usize {
            self.lines += 1;
            self.lines - 1
        }

        /// The steps of `items`, which run if `runs`, on line `line` (the main line's or a
        /// branch's), whose count restarts after a group or a forEach step that ran.
        fn walk(&mut self, items: &[Item], runs: bool, line: &mut usize) {
            for item in items {
                match item {
                    Item::Step(s) => {
                        let u = Unit::new(*line);
                        self.steps.push(StepModel {
                            // A sub-workflow step is undone as a unit (no pivot is drawn); a
                            // distributed forEach step if it has an undo.
                            undoable: (s.undo || matches!(s.call, Call::Child(_)))
                                && s.wait.is_none(),
                            runs: runs && s.when.unwrap_or(true),
                            each: None,
                            wait: s.wait.is_some(),
                            event: (s.wait.is_some() && s.event)
                                .then(|| format!("ev-s{}", self.steps.len())),
                            units: vec![u],
                            call: if s.wait.is_some() {
                                Call::Plain
                            } else {
                                s.call
                            },
                        });
                    }
                    Item::Each(e) => {
                        let runs = runs && e.when.unwrap_or(true);
                        // Each element counts its failures apart.
                        let units = (0..self.items).map(|_| Unit::new(self.line())).collect();
                        self.steps.push(StepModel {
                            undoable: e.undo,
                            runs,
                            wait: false,
                            event: None,
                            each: Some(EachModel {
                                max: e.max,
                                tolerated: e.tolerated,
                                refused: 0,
                            }),
                            units,
                            call: Call::Plain,
                        });
                        if runs {
                            *line = self.line();
                        }
                    }
                    Item::Choice(c) => {
                        let runs = runs && c.when.unwrap_or(true);
                        let taken = c.taken();
                        for (k, arm) in c.arms().enumerate() {
                            self.walk(arm, runs && taken == Some(k), line);
                        }
                    }
                }
            }
        }
    }

    impl Model {
        fn new(d: &Draw, p: &Policy, auto: bool) -> Self {
            let mut w = Walk {
                steps: vec![],
                lines: 0,
                items: d.items,
            };
            let mut main = w.line();
            w.walk(&d.before, true, &mut main);
            let group_runs = d.group_when.unwrap_or(true);
            for br in &d.branches {
                let mut line = w.line();
                w.walk(br, group_runs, &mut line);
            }
            if group_runs {
                // The main line's count restarts after a group that ran.
                main = w.line();
            }
            w.walk(&d.after, true, &mut main);
            Self {
                steps: w.steps,
                threshold: p.failure_threshold,
                auto,
                undo_wait: p.undo_wait,
                counts: vec![0; w.lines],
                first: None,
                refusal: false,
                halted: false,
                by_operator: false,
                operator: false,
                undo_trouble: false,
                undos: vec![],
                deadline: None,
                kept: vec![],
                taken: HashSet::new(),
                dispatched: HashSet::new(),
                late: false,
                items: d.items,
            }
        }

        fn u(&mut self, (i, k): (usize, usize)) -> &mut Unit {
            &mut self.steps[i].units[k]
        }

        fn units(&self) -> impl Iterator<Item = ((usize, usize), &Unit)> {
            self.steps
                .iter()
                .enumerate()
                .flat_map(|(i, s)| s.units.iter().enumerate().map(move |(k, u)| ((i, k), u)))
        }

        /// The steps and elements that may have taken effect and have an undo, in order.
        fn to_undo(&self) -> Vec<(usize, usize)> {
            self.units()
                .filter(|((i, _), u)| self.steps[*i].undoable && u.sent && !u.no_effect)
                .map(|(at, _)| at)
                .collect()
        }

        /// The elements of forEach step `i` that hold a place under its `maxConcurrency` at
        /// `now`: out, or handed back (not over) while their last call may still be in flight.
        fn holding(&self, i: usize, now: DateTime<Utc>) -> Vec<usize> {
            (0..self.steps[i].units.len())
                .filter(|&k| {
                    let u = &self.steps[i].units[k];
                    u.out || (!u.over && u.unsure.is_some_and(|d| d + self.undo_wait > now))
                })
                .collect()
        }

        fn stop(&mut self, kind: Kind) {
            // The first failure decides: a refusal after a failure is not the task's.
            if *self.first.get_or_insert(kind) == Kind::Refused {
                self.refusal = true;
            }
            self.halted = true;
            // A wait has nothing in flight: it ends with the stop (to wait again if the task
            // goes on).
            for s in self.steps.iter_mut().filter(|s| s.wait) {
                for u in s.units.iter_mut().filter(|u| u.out) {
                    u.out = false;
                    u.sent = false;
                }
            }
        }

        /// Unit `at`'s attempt whose deadline is `until` ended without an answer: it may be
        /// in flight until then. Not a sub-workflow step its child accepted: that has nothing
        /// in flight, whatever its attempts before or after (its undo reaches the child
        /// wherever it is, and a copy of its request, under the same key, starts no second
        /// one), so its undo may go at once (the runtime may wait: in a group it does).
        fn unsure(&mut self, at: (usize, usize), until: Option<DateTime<Utc>>) {
            let child = self.steps[at.0].call.starts();
            let u = self.u(at);
            if !(child && u.accepted) {
                u.unsure = u.unsure.max(until);
            }
        }

        /// A unit's attempt came to nothing: counted, up to the failure.
        fn timed_out(&mut self, at: (usize, usize)) {
            if self.halted {
                return;
            }
            let line = self.u(at).line;
            let c = &mut self.counts[line];
            *c += 1;
            if *c >= self.threshold {
                self.stop(Kind::Failed);
            }
        }

        /// An operator's retry or skip: the task goes on, every step or element that was
        /// refused or failed (its key refused) goes out again as never sent (an element
        /// refused within the tolerance stays over). The refusals tolerated stay counted.
        fn goes_on(&mut self) {
            self.first = None;
            self.refusal = false;
            self.halted = false;
            self.counts.iter_mut().for_each(|c| *c = 0);
            for s in &mut self.steps {
                for u in &mut s.units {
                    if u.no_effect && !u.tolerated {
                        u.sent = false;
                        u.no_effect = false;
                        // (Sent again under a new key: a new child or run, if any.)
                        u.accepted = false;
                        u.needs_operator = false;
                    }
                }
            }
        }

        /// The callback of the step the task failed at (its attempts timed out waiting for it)
        /// came late: the failure was the wait for that outcome, so the task goes on as if it
        /// had not failed (the failure counts restart), its outcome then taken in as any.
        fn revive(&mut self) {
            self.first = None;
            self.refusal = false;
            self.halted = false;
            self.late = true;
            self.counts.iter_mut().for_each(|c| *c = 0);
        }

        /// Unit `at` was answered (by a reply or a callback) with `outcome`; `deadline`: that of
        /// the attempt answered.
        fn answered(
            &mut self,
            at: (usize, usize),
            outcome: Outcome,
            deadline: Option<DateTime<Utc>>,
        ) {
            self.u(at).out = false;
            match outcome {
                Outcome::Success => {
                    let u = self.u(at);
                    u.unsure = None;
                    u.over = true;
                    // The line's next step counts its own expired deadlines.
                    let line = u.line;
                    self.counts[line] = 0;
                }
                Outcome::Refusal | Outcome::Failure => {
                    let u = self.u(at);
                    u.no_effect = true;
                    u.unsure = None;
                    let halted = self.halted;
                    let within = self.steps[at.0].each.as_mut().filter(|e| {
                        outcome == Outcome::Refusal && !halted && e.refused < e.tolerated
                    });
                    if let Some(e) = within {
                        // A refusal within the tolerance: the element is over, the step goes
                        // on.
                        e.refused += 1;
                        let u = self.u(at);
                        u.tolerated = true;
                        u.over = true;
                    } else {
                        self.stop(if outcome == Outcome::Refusal {
                            Kind::Refused
                        } else {
                            Kind::Failed
                        });
                    }
                }
                Outcome::TimedOut => {
                    self.unsure(at, deadline);
                    self.timed_out(at);
                }
                Outcome::Deferred => self.unsure(at, deadline),
                Outcome::Faulted => {
                    // It took effect (it is undone), and the task fails.
                    let u = self.u(at);
                    u.no_effect = false;
                    u.unsure = None;
                    self.stop(Kind::Failed);
                }
                // (Taken in by `accept`: the unit stays out.)
                Outcome::Accepted => {}
            }
        }

        /// What delivering event number `id` for the wait of step `j` must do to record `r` at
        /// `now`: end that wait (it is out), be kept (the wait is still to come), or be refused
        /// (a repeat, too late, past the task's deadline, too many kept).
        fn expect_event(
            &self,
            j: usize,
            id: usize,
            r: &StateRecord,
            now: DateTime<Utc>,
        ) -> EventWant {
            let forward = matches!(
                r.process_state,
                ProcessState::Pending | ProcessState::Processing
            );
            let past_deadline = self.deadline.is_some_and(|d| d <= now);
            if self.taken.contains(&id) || !forward || past_deadline {
                EventWant::Refused
            } else if self.steps[j].units[0].out {
                EventWant::Ends
            } else if r.steps[j].status == StepStatus::Pending && !r.steps[j].sent {
                if self.kept.len() >= crate::domain::inbox::MAX_KEPT {
                    EventWant::Refused
                } else {
                    EventWant::Kept
                }
            } else {
                EventWant::Refused
            }
        }

        /// An operator sent the task on past its deadline: it no longer applies.
        fn taken_over(&mut self, now: DateTime<Utc>) {
            if self.deadline.is_some_and(|d| d <= now) {
                self.deadline = None;
            }
        }

        /// The unit whose undo the compensation stops at: the last, of those to undo, whose child
        /// or run waits for an operator (it refuses the undo).
        fn blocked(&self) -> Option<(usize, usize)> {
            self.to_undo()
                .into_iter()
                .filter(|&(i, k)| self.steps[i].units[k].needs_operator)
                .max()
        }

        /// What the task ends as, once quiet: as [`Model::ends`] says, but a compensation that
        /// reaches a step whose child or run waits for an operator ends CompensationFailed
        /// there.
        fn predict(&self) -> ProcessState {
            match self.ends() {
                ProcessState::Refused | ProcessState::Compensated if self.blocked().is_some() => {
                    ProcessState::CompensationFailed
                }
                s => s,
            }
        }

        /// What the task ends as, its undos all done.
        fn ends(&self) -> ProcessState {
            if self.by_operator {
                return if self.refusal {
                    ProcessState::Refused
                } else {
                    ProcessState::Compensated
                };
            }
            match self.first {
                None => ProcessState::Processed,
                Some(Kind::Refused) => ProcessState::Refused,
                // The first failure decides: a refusal in another branch after it does not
                // make the task Refused.
                Some(Kind::Failed) if self.auto => ProcessState::Compensated,
                Some(Kind::Failed) => ProcessState::Error,
            }
        }

        /// Takes in event `act`, accepted on `pre` at `now`, and the transition `t` it made:
        /// first what the event says, then what went out.
        fn accept(
            &mut self,
            pre: &StateRecord,
            act: Act,
            t: &Transition,
            now: DateTime<Utc>,
        ) -> Result<(), TestCaseError> {
            let past_deadline = pre.task_deadline_applies().is_some_and(|d| d <= now);
            match act {
                Act::Expire if past_deadline => {
                    prop_assert!(
                        self.deadline.is_some_and(|d| d <= now),
                        "the record's deadline {:?} is not the model's {:?}",
                        pre.deadline,
                        self.deadline
                    );
                    // Whatever is out timed out now (it may have taken effect, and may be in
                    // flight until its own deadline); the task fails.
                    let out: Vec<(usize, usize)> = self
                        .units()
                        .filter(|(_, u)| u.out)
                        .map(|(at, _)| at)
                        .collect();
                    for at in out {
                        self.u(at).out = false;
                        let d = self.u(at).deadline;
                        if !self.steps[at.0].wait {
                            self.unsure(at, d);
                        }
                    }
                    self.stop(Kind::Failed);
                }
                Act::Reply(o, Outcome::Accepted) if !o.undo => {
                    // Its service accepted it: it may have taken effect, and answers by
                    // callback within the step's timeout from now, its deadline now.
                    let at = o.unit();
                    let deadline = self.steps[at.0].call.timeout().map(|t| now + t);
                    let u = self.u(at);
                    u.accepted = true;
                    u.deadline = deadline;
                    if self.steps[at.0].call.starts() {
                        // (See `unsure`.)
                        self.u(at).unsure = None;
                    }
                    let record = outs(&t.record)
                        .into_iter()
                        .find(|o| !o.undo && o.unit() == at)
                        .and_then(|o| o.deadline);
                    prop_assert_eq!(record, deadline, "the deadline of {:?}, accepted", at);
                }
                Act::Reply(o, outcome) if !o.undo => self.answered(o.unit(), outcome, o.deadline),
                Act::Callback(at, _, outcome) => {
                    if pre.process_state == ProcessState::Error && pre.fanout.is_none() {
                        // The task failed at this step, waiting for this outcome. (A group that
                        // stopped takes the late outcome of a step handed back in a branch,
                        // and stays stopped: its failure was another's.)
                        self.revive();
                    }
                    if outcome == Outcome::Faulted && self.steps[at.0].call.starts() {
                        // (From sas: what the step started could not undo itself.)
                        self.u(at).needs_operator = true;
                    }
                    let deadline = self.u(at).deadline;
                    self.answered(at, outcome, deadline);
                }
                Act::Reply(_, outcome) => {
                    if matches!(
                        outcome,
                        Outcome::Refusal | Outcome::Failure | Outcome::TimedOut
                    ) {
                        self.undo_trouble = true;
                    }
                }
                Act::Expire => {
                    let due: Vec<(usize, usize)> = self
                        .units()
                        .filter(|(_, u)| u.out && u.deadline.is_some_and(|d| d <= now))
                        .map(|(at, _)| at)
                        .collect();
                    for at in due {
                        self.u(at).out = false;
                        if self.steps[at.0].event.is_some() {
                            // No event by its time: it failed, and the task with it.
                            self.stop(Kind::Failed);
                            continue;
                        }
                        if self.steps[at.0].wait {
                            // Its time came: done.
                            self.u(at).over = true;
                            continue;
                        }
                        let d = self.u(at).deadline;
                        self.unsure(at, d);
                        self.timed_out(at);
                    }
                    if outs(pre)
                        .iter()
                        .any(|o| o.undo && o.deadline.is_some_and(|d| d <= now))
                    {
                        self.undo_trouble = true;
                    }
                }
                Act::Cancel => {
                    let out: Vec<(usize, usize)> = self
                        .units()
                        .filter(|(_, u)| u.out)
                        .map(|(at, _)| at)
                        .collect();
                    for at in out {
                        self.u(at).out = false;
                        let d = self.u(at).deadline;
                        self.unsure(at, d);
                    }
                    self.operator = true;
                    self.by_operator = true;
                    self.halted = true;
                }
                Act::Compensate => {
                    self.operator = true;
                    if pre.process_state == ProcessState::Error {
                        self.by_operator = true;
                        self.halted = true;
                    }
                }
                Act::Retry => {
                    self.operator = true;
                    if pre.process_state == ProcessState::Error {
                        self.goes_on();
                        self.taken_over(now);
                    }
                }
                Act::Skip => {
                    self.operator = true;
                    // Done by hand: it took effect. (A forEach step is done as a whole: its
                    // elements stay as they ran, for their undos.)
                    if self.steps[pre.step_index].each.is_none() {
                        self.u((pre.step_index, 0)).no_effect = false;
                    }
                    // A step skipped after it timed out keeps its deadline: its undo still
                    // waits for the attempt that may be in flight.
                    self.goes_on();
                    self.taken_over(now);
                }
                Act::Event(j, id) => {
                    self.taken.insert(id);
                    let u = &mut self.steps[j].units[0];
                    if u.out {
                        u.out = false;
                        u.over = true;
                    } else if let Some(name) = self.steps[j].event.clone() {
                        self.kept.push(name);
                    }
                }
                Act::Claim | Act::Delivered | Act::Stale => {}
            }
            let r = &t.record;
            for e in &t.effects {
                let (at, attempt, undo, deadline) = match e {
                    Effect::SendStepRequest if r.process_state == ProcessState::Compensating => {
                        let i = r.step_index;
                        let k = r.undo_element(i);
                        prop_assert_eq!(
                            k.is_some(),
                            self.steps[i].each.is_some(),
                            "the undo of step {} names an element iff it is a forEach step",
                            i
                        );
                        ((i, k.unwrap_or(0)), r.attempt, true, r.complete_by)
                    }
                    Effect::SendStepRequest => {
                        prop_assert!(
                            self.steps[r.step_index].each.is_none(),
                            "forEach step {} sent as a whole",
                            r.step_index
                        );
                        ((r.step_index, 0), r.attempt, false, r.complete_by)
                    }
                    Effect::Timer { step, attempt, at } => {
                        prop_assert!(self.steps[*step].wait, "a timer for step {}, no wait", step);
                        prop_assert!(*at >= now, "a wait until {} set at {}", at, now);
                        ((*step, 0), *attempt, false, Some(*at))
                    }
                    Effect::SendBranchStep(b) => {
                        let f = r.fanout.as_ref().ok_or_else(|| {
                            TestCaseError::fail(format!("{e:?} without its group"))
                        })?;
                        let br = f.branches.get(*b).ok_or_else(|| {
                            TestCaseError::fail(format!("{e:?} without its branch"))
                        })?;
                        let k = f.each_of(*b).map_or(0, |(_, k)| k);
                        ((br.step_index, k), br.attempt, false, br.complete_by)
                    }
                    _ => continue,
                };
                let (i, k) = at;
                prop_assert!(
                    self.dispatched.insert((i, attempt, undo)),
                    "step {i} (undo: {undo}) sent twice under attempt {attempt}"
                );
                let wait = self.undo_wait;
                let step = &self.steps[i];
                let u = &step.units[k];
                if undo {
                    prop_assert!(
                        step.undoable && u.sent && !u.no_effect,
                        "the undo of {at:?}, which had no effect, went out"
                    );
                    if let Some(last) = self.undos.last() {
                        prop_assert!(*last >= at, "undo of {at:?} after the undo of {last:?}");
                    }
                    if let Some(d) = u.unsure {
                        prop_assert!(
                            now >= d + wait,
                            "the undo of {at:?} went out at {now}, before its step's deadline {d} and the wait"
                        );
                    }
                    self.undos.push(at);
                } else {
                    prop_assert_eq!(
                        matches!(e, Effect::Timer { .. }),
                        step.wait,
                        "step {} goes out with a timer iff it is a wait",
                        i
                    );
                    prop_assert!(!self.halted, "{at:?} went out while the task stops");
                    prop_assert!(
                        self.deadline.is_none_or(|d| now < d),
                        "{at:?} went out at {now}, past the task's deadline {:?}",
                        self.deadline
                    );
                    prop_assert!(step.runs, "step {i}, whose condition is false, went out");
                    prop_assert!(!u.over, "element {at:?}, over, went out again");
                    let later = step.call.timeout().is_some();
                    let u = self.u(at);
                    u.sent = true;
                    u.went_out = true;
                    u.out = true;
                    u.no_effect = false;
                    u.deadline = deadline;
                    if later {
                        // A callback step out again: the runtime waits only past this
                        // attempt's deadline, as if it were later than any before (it is for a
                        // step, not for an attempt accepted and handed back early, by a reply
                        // that timed out, before its callback deadline: that deadline is
                        // forgotten. An open question, not checked here).
                        u.unsure = None;
                    }
                }
            }
            // A wait for an event reached with its event kept ends at once, nothing armed.
            for j in 0..self.steps.len() {
                let Some(name) = self.steps[j].event.clone() else {
                    continue;
                };
                let ended = r.steps[j].status == StepStatus::Done
                    && pre.steps[j].status != StepStatus::Done
                    && !matches!(act, Act::Event(..) | Act::Skip);
                if ended {
                    let k = self.kept.iter().position(|n| *n == name);
                    prop_assert!(k.is_some(), "wait {} ended with no event kept for it", j);
                    if let Some(k) = k {
                        self.kept.remove(k);
                    }
                    let u = &mut self.steps[j].units[0];
                    u.sent = true;
                    u.went_out = true;
                    u.over = true;
                }
            }
            if !matches!(
                r.process_state,
                ProcessState::Pending | ProcessState::Processing
            ) {
                let out: Vec<(usize, usize)> = self
                    .units()
                    .filter(|(_, u)| u.out)
                    .map(|(at, _)| at)
                    .collect();
                prop_assert!(
                    out.is_empty(),
                    "{} while {:?} are out",
                    r.process_state,
                    out
                );
            }
            Ok(())
        }

        /// Checks a record the model took in at `now`: what is out is what the model sent and
        /// saw no end of; a forEach step running has no more elements holding a place than its
        /// `maxConcurrency` (out, or handed back while their last call may still be in flight:
        /// read from the record's branches and elements, and from the model), and counts the
        /// refusals the model counted.
        fn check(&self, r: &StateRecord, now: DateTime<Utc>) -> Result<(), TestCaseError> {
            let mut out: Vec<(usize, usize)> =
                outs(r).iter().filter(|o| !o.undo).map(Out::unit).collect();
            out.sort_unstable();
            let model: Vec<(usize, usize)> = self
                .units()
                .filter(|(_, u)| u.out)
                .map(|(at, _)| at)
                .collect();
            prop_assert_eq!(&out, &model, "out: record vs model");
            let Some(f) = r.fanout.as_ref() else {
                return Ok(());
            };
            for e in f.running() {
                let i = e.step;
                let m = self.steps[i].each.as_ref().ok_or_else(|| {
                    TestCaseError::fail(format!("step {i} runs as a forEach step"))
                })?;
                prop_assert_eq!(
                    (e.max_concurrency, e.tolerated, e.refused),
                    (m.max, m.tolerated, m.refused),
                    "the forEach step's run"
                );
                let elements = &r.steps[i].elements;
                let range = f.elements_of(e);
                prop_assert_eq!(elements.len(), range.len());
                let held: Vec<usize> = (0..range.len())
                    .filter(|&k| {
                        let (br, el) = (&f.branches[range.start + k], &elements[k]);
                        br.process_state == ProcessState::Processing
                            || (br.process_state == ProcessState::Pending
                                && el.sent
                                && el.sent_until.is_some_and(|t| t + self.undo_wait > now))
                    })
                    .collect();
                prop_assert!(
                    held.len() <= m.max as usize,
                    "elements {:?} of step {} hold a place, at most {} at once",
                    held,
                    i,
                    m.max
                );
                let holding = self.holding(i, now);
                prop_assert!(
                    holding.len() <= m.max as usize,
                    "the model's elements {:?} of step {} hold a place, at most {} at once",
                    holding,
                    i,
                    m.max
                );
                if f.stop.is_none() {
                    // (Once the group stops, an element stopped with its call in flight is in
                    // Error, no longer counted: nothing goes out until an operator resumes
                    // it, handed back.)
                    prop_assert_eq!(&held, &holding, "places of step {}: record vs model", i);
                }
            }
            Ok(())
        }
    }

    struct Run<'a> {
        w: &'a Workflow,
        task: &'a Task,
        p: Policies,
        now: DateTime<Utc>,
        r: StateRecord,
        kept: StateRecord,
        m: Model,
        /// The notices delivered, in order.
        notices: Vec<NoticeKind>,
        last_reply: Option<(u64, usize, bool)>,
        /// The last callback applied: its step, key generation and outcome.
        last_callback: Option<(usize, u32, Outcome)>,
        /// The `Event-Id`s sent, in order.
        event_ids: Vec<String>,
        /// The undos (attempt, step) `drive` had accepted, to answer next.
        undos_accepted: HashSet<(u64, usize)>,
        /// The draw's [`Draw::refuse_accepted_undo`].
        refuse_accepted_undo: bool,
    }

    impl<'a> Run<'a> {
        fn new(
            w: &'a Workflow,
            task: &'a Task,
            r: StateRecord,
            d: &Draw,
            p: Policies,
            auto: bool,
        ) -> Self {
            let now = r.created_at;
            let m = Model::new(d, p.at(0), auto);
            Self {
                w,
                task,
                m,
                p,
                now,
                kept: r.clone(),
                r,
                notices: vec![],
                last_reply: None,
                last_callback: None,
                event_ids: vec![],
                undos_accepted: HashSet::new(),
                refuse_accepted_undo: d.refuse_accepted_undo,
            }
        }

        /// The answer `outcome` to `o`: a distributed forEach step's success (its run's end, or
        /// at once for an empty list) carries its elements' results in order, `{"e": k}`.
        fn answer(&self, outcome: Outcome, o: &Out) -> StepOutcome {
            // (A stale callback may name a step past the last.)
            let call = self.m.steps.get(o.step).map(|s| s.call);
            match (outcome, call, o.undo) {
                (Outcome::Success, Some(Call::Run(_)), false) => StepOutcome::Succeeded {
                    result: Some(run_results(self.m.items).to_string()),
                },
                _ => outcome.reply(o, self.now),
            }
        }

        fn router(&self) -> TaskRouter<'_> {
            TaskRouter {
                workflow: self.w,
                task: self.task,
            }
        }

        /// Event `ev` on record `on`: what it is for the model, and the transition (`None`: the
        /// event has nothing to apply to).
        fn compute(
            &self,
            ev: &Ev,
            on: &StateRecord,
        ) -> Option<(Act, Result<Transition, Rejection>)> {
            let (p, now, router) = (&self.p, self.now, self.router());
            let outs = outs(on);
            let pick = |k: u8| outs.get(usize::from(k) % outs.len().max(1)).copied();
            let ops = ops(Some("test"));
            Some(match ev {
                Ev::Claim => (Act::Claim, claim(on, "s", now, p, &router)),
                Ev::Reply { pick: k, outcome } => {
                    let o = pick(*k)?;
                    let mut outcome = Outcome::of(*outcome);
                    // What the step started waits for an operator: sas refuses its undo (or
                    // its agent times out, or is deferred).
                    let needs_operator = o.undo
                        && self.m.steps[o.step].units[o.unit().1].needs_operator
                        && !matches!(outcome, Outcome::TimedOut | Outcome::Deferred);
                    if needs_operator {
                        outcome = Outcome::Refusal;
                    }
                    // Only a callback step (a sub-workflow or distributed forEach step's too)
                    // may be accepted, and of undos only theirs.
                    let call = self.m.steps[o.step].call;
                    let later = if o.undo {
                        call.starts()
                    } else {
                        call.timeout().is_some()
                    };
                    // Nothing answers a wait: a reply to one must be rejected.
                    let act =
                        if self.m.steps[o.step].wait || (outcome == Outcome::Accepted && !later) {
                            Act::Stale
                        } else {
                            Act::Reply(o, outcome)
                        };
                    let reply = if needs_operator {
                        needs_operator_refusal(call)
                    } else {
                        self.answer(outcome, &o)
                    };
                    (
                        act,
                        apply_reply(on, o.attempt, o.step, o.undo, &reply, now, p, &router),
                    )
                }
                Ev::Stale { pick: k, how } => {
                    let (attempt, step, undo) = match (how, pick(*k)) {
                        (4, _) => self.last_reply?,
                        (_, None) => return None,
                        (0, Some(o)) => (o.attempt.checked_sub(1)?, o.step, o.undo),
                        (1, Some(o)) => (o.attempt, o.step + 1, o.undo),
                        (2, Some(o)) => (o.attempt, o.step.checked_sub(1)?, o.undo),
                        (_, Some(o)) => (o.attempt, o.step, !o.undo),
                    };
                    // (An older attempt may be another element's, out: then it is not stale.)
                    if outs
                        .iter()
                        .any(|o| (o.attempt, o.step, o.undo) == (attempt, step, undo))
                    {
                        return None;
                    }
                    (
                        Act::Stale,
                        apply_reply(on, attempt, step, undo, &ok(), now, p, &router),
                    )
                }
                Ev::Callback {
                    pick: k,
                    outcome,
                    how,
                } => {
                    let (step, generation, outcome) = match how {
                        3 => self.last_callback?,
                        _ => {
                            let at = lines_at(on);
                            // Mostly a line at a callback step (a callback for another step is
                            // stale whatever its generation).
                            let later: Vec<usize> = at
                                .iter()
                                .copied()
                                .filter(|&j| self.m.steps[j].call.timeout().is_some())
                                .collect();
                            let of = if k % 4 == 3 || later.is_empty() {
                                &at
                            } else {
                                &later
                            };
                            let j = *of.get(usize::from(*k) % of.len().max(1))?;
                            let g = on.steps[j].generation;
                            let outcome = Outcome::of(*outcome);
                            match how {
                                1 => (j, g.checked_sub(1).unwrap_or(g + 1), outcome),
                                2 => {
                                    let j = if k % 2 == 0 { j + 1 } else { j.checked_sub(1)? };
                                    if at.contains(&j) {
                                        return None;
                                    }
                                    let g = on.steps.get(j).map_or(0, |s| s.generation);
                                    (j, g, outcome)
                                }
                                _ => (j, g, outcome),
                            }
                        }
                    };
                    // A callback carries a success or a refusal, for a callback step, under
                    // its key's generation, to the step a line is at (see `lines_at`), once.
                    let answers = self
                        .m
                        .steps
                        .get(step)
                        .is_some_and(|s| s.call.timeout().is_some());
                    // A `Faulted` answer repeated once an operator's retry sent its step out
                    // again under the same key (a faulted step took effect: it keeps its key) is
                    // no duplicate: what that key started is still as it answered (a child or
                    // run CompensationFailed), and its end, delivered again, says so again.
                    let repeated = *how == 3
                        && outcome == Outcome::Faulted
                        && on.steps.get(step).is_some_and(|s| {
                            s.generation == generation && s.status != StepStatus::Faulted
                        });
                    let act = if (*how == 0 || repeated)
                        && answers
                        && matches!(
                            outcome,
                            Outcome::Success | Outcome::Refusal | Outcome::Faulted
                        ) {
                        Act::Callback((step, 0), generation, outcome)
                    } else {
                        Act::Stale
                    };
                    let o = Out {
                        step,
                        element: None,
                        attempt: 0,
                        undo: false,
                        deadline: None,
                    };
                    (
                        act,
                        apply_callback(
                            on,
                            step,
                            generation,
                            &self.answer(outcome, &o),
                            now,
                            p,
                            &router,
                        ),
                    )
                }
                Ev::Advance(_) | Ev::Due(_) => return None,
                Ev::Event { pick, repeat } => {
                    let waits: Vec<usize> = (0..self.m.steps.len())
                        .filter(|i| self.m.steps[*i].event.is_some())
                        .collect();
                    let j = *waits.get(usize::from(*pick) % waits.len().max(1))?;
                    let id = match self.event_ids.len() {
                        n if *repeat && n > 0 => n - 1,
                        n => n,
                    };
                    let d = Delivery {
                        name: self.m.steps[j].event.clone()?,
                        id: Some(format!("id-{id}")),
                        payload: "{}".into(),
                    };
                    (Act::Event(j, id), deliver(on, &d, now, p, &router))
                }
                Ev::Expire(j) => (Act::Expire, expire(on, now, p, f64::from(*j) / 10.0)),
                Ev::Delivered => (Act::Delivered, notice_delivered(on, now, None)),
                Ev::Cancel => (Act::Cancel, cancel(on, &ops, now, p)),
                Ev::Retry => (Act::Retry, retry(on, &ops, now, p)),
                Ev::Skip => (Act::Skip, skip(on, &ops, now, p, None)),
                Ev::Compensate => (Act::Compensate, compensate(on, &ops, now, p)),
            })
        }

        /// Applies `t`, made by `act` on the current record: the checks of every transition,
        /// then the model takes it in and checks the new record.
        fn apply(&mut self, act: Act, t: Transition) -> Result<(), TestCaseError> {
            let r = &self.r;
            prop_assert!(
                t.condition.holds(Some(r)),
                "the condition fails on its source"
            );
            prop_assert!(
                !t.condition.holds(Some(&t.record)),
                "the condition holds on its result"
            );
            prop_assert!(t.record.attempt >= r.attempt, "the attempt went back");
            if let Err(e) = t.record.check(&self.p) {
                return Err(TestCaseError::fail(format!(
                    "{e} after {act:?}: {:?}\nfrom {r:?}\nto {:?}",
                    t.effects, t.record
                )));
            }
            // (Two lines may read the same: two elements' undos done at one instant.)
            let logged = t.record.history.len() > r.history.len()
                || t.record.history.last() != r.history.last();
            prop_assert!(
                logged || matches!(act, Act::Delivered),
                "no history line for {act:?} ({:?})",
                t.effects
            );
            if matches!(act, Act::Delivered) {
                self.notices.extend(r.owed());
            }
            if let Act::Reply(o, _) = act {
                self.last_reply = Some((o.attempt, o.step, o.undo));
            }
            if let Act::Callback((step, _), generation, outcome) = act {
                self.last_callback = Some((step, generation, outcome));
            }
            let pre = self.r.clone();
            self.m.accept(&pre, act, &t, self.now)?;
            self.m.check(&t.record, self.now).map_err(|e| {
                TestCaseError::fail(format!(
                    "{e}\nafter {act:?}: {:?}\nmodel: {:?}\nfrom {pre:?}\nto {:?}",
                    t.effects, self.m, t.record
                ))
            })?;
            self.r = t.record;
            Ok(())
        }

        fn event(&mut self, ev: &Ev, mode: Mode) -> Result<(), TestCaseError> {
            if let Ev::Advance(s) = ev {
                self.now += Duration::seconds(i64::from(*s));
                return Ok(());
            }
            if let Ev::Due(k) = ev {
                let outs = outs(&self.r);
                if let Some(d) = outs
                    .get(usize::from(*k) % outs.len().max(1))
                    .and_then(|o| o.deadline)
                {
                    self.now = self.now.max(d);
                }
                return self.event(&Ev::Expire(5), mode);
            }
            match mode {
                Mode::Keep => {
                    self.kept = self.r.clone();
                    Ok(())
                }
                Mode::Dropped => {
                    // Computed, then lost with its writer: nothing changes.
                    let _ = self.compute(ev, &self.r);
                    Ok(())
                }
                Mode::Late if self.kept.version != self.r.version => {
                    if let Some((act, Ok(t))) = self.compute(ev, &self.kept) {
                        prop_assert!(
                            !t.condition.holds(Some(&self.r)),
                            "{act:?} computed on version {} applies to version {}",
                            self.kept.version,
                            self.r.version
                        );
                    }
                    Ok(())
                }
                Mode::Late | Mode::Normal => {
                    let Some((act, out)) = self.compute(ev, &self.r) else {
                        return Ok(());
                    };
                    if let Act::Stale = act {
                        prop_assert!(out.is_err(), "a stale reply ({ev:?}) applies: {out:?}");
                        return Ok(());
                    }
                    if let Act::Callback((j, _), _, outcome) = act {
                        // On the main line, a callback under the step's key generation applies
                        // while the step is out, handed back for another attempt, or the one
                        // the task failed at waiting for it: whatever it says.
                        let r = &self.r;
                        let waits = r.fanout.is_none()
                            && r.step_index == j
                            && match (r.process_state, r.steps[j].status) {
                                (
                                    ProcessState::Processing,
                                    StepStatus::Running | StepStatus::Waiting,
                                )
                                | (ProcessState::Error, StepStatus::TimedOut) => true,
                                (ProcessState::Pending, StepStatus::Pending) => r.steps[j].sent,
                                _ => false,
                            };
                        prop_assert!(
                            out.is_ok() || !waits,
                            "a callback ({outcome:?}) for step {j}, which waits for it, is refused: {out:?}\n{r:?}"
                        );
                    }
                    if let Act::Event(j, id) = act {
                        if id == self.event_ids.len() {
                            self.event_ids.push(format!("id-{id}"));
                        }
                        let want = self.m.expect_event(j, id, &self.r, self.now);
                        match (&out, want) {
                            (Ok(t), EventWant::Ends) => prop_assert_eq!(
                                t.record.steps[j].status,
                                StepStatus::Done,
                                "the event ends wait {}",
                                j
                            ),
                            (Ok(t), EventWant::Kept) => prop_assert_eq!(
                                t.record.inbox.kept.len(),
                                self.r.inbox.kept.len() + 1,
                                "the event is kept for wait {}",
                                j
                            ),
                            (Err(_), EventWant::Refused) => {}
                            (out, want) => {
                                return Err(TestCaseError::fail(format!(
                                    "event {id} for wait {j}: want {want:?}, got {out:?}"
                                )));
                            }
                        }
                    }
                    match out {
                        Ok(t) => self.apply(act, t),
                        Err(_) => Ok(()),
                    }
                }
            }
        }

        /// Checks the record, quiet (ended, or waiting for an operator), against the model.
        fn quiet(&self) -> Result<(), TestCaseError> {
            let (r, m) = (&self.r, &self.m);
            let want = m.predict();
            prop_assert_eq!(r.process_state, want, "model: {:?}\nrecord: {:?}", m, r);
            // The steps and elements undone: an element's undo is its own.
            let mut undone = vec![];
            for (i, s) in r.steps.iter().enumerate() {
                if m.steps[i].each.is_some() {
                    undone.extend(
                        (0..s.elements.len())
                            .filter(|&k| s.elements[k].undo == Some(StepStatus::Done))
                            .map(|k| (i, k)),
                    );
                } else if s.undo == Some(StepStatus::Done) {
                    undone.push((i, 0));
                }
            }
            let expected = match want {
                ProcessState::Refused | ProcessState::Compensated => m.to_undo(),
                // The undos up to the one refused, last first.
                ProcessState::CompensationFailed => {
                    let blocked = m.blocked();
                    m.to_undo()
                        .into_iter()
                        .filter(|at| Some(*at) > blocked)
                        .collect()
                }
                _ => vec![],
            };
            prop_assert_eq!(&undone, &expected, "the undos that ran; model: {:?}", m);
            if let (ProcessState::CompensationFailed, Some((i, k))) = (want, m.blocked()) {
                // The task names the step whose undo was refused, and why.
                let unit = (r.step_index, r.undo_element(r.step_index).unwrap_or(0));
                prop_assert_eq!(unit, (i, k), "the undo refused");
                let error = r.last_error.as_deref().unwrap_or_default();
                let code = match m.steps[i].call {
                    Call::Run(_) => "run_needs_operator",
                    _ => "child_needs_operator",
                };
                let named = format!("undo of {}: {code}", r.steps[i].name);
                prop_assert!(error.contains(&named), "{:?} names no {:?}", error, named);
            }
            for (i, s) in r.steps.iter().enumerate() {
                if matches!(m.steps[i].call, Call::Run(_)) {
                    // Its elements are its run's, none in the task's record.
                    prop_assert!(s.elements.is_empty(), "distributed step {} has elements", i);
                }
            }
            if want == ProcessState::Processed {
                let results = r.results();
                for (i, s) in r.steps.iter().enumerate() {
                    let sm = &m.steps[i];
                    let status = if sm.runs {
                        StepStatus::Done
                    } else {
                        StepStatus::Skipped
                    };
                    prop_assert_eq!(s.status, status, "step {}", i);
                    if !sm.runs || m.operator {
                        // (An operator's skip settles a step, or a forEach step, by hand.)
                        continue;
                    }
                    // Done without being sent only by an operator's skip.
                    prop_assert!(
                        sm.units.iter().all(|u| u.went_out),
                        "step {i} done, never sent (or one of its elements)"
                    );
                    if matches!(sm.call, Call::Run(_)) {
                        // Its run's answer: its elements' results in order.
                        prop_assert_eq!(
                            &results[&s.name]["result"],
                            &run_results(m.items),
                            "the result of distributed forEach step {}",
                            i
                        );
                    }
                    if sm.each.is_some() {
                        // Each element done, or refused within the tolerance; the step's
                        // result, theirs in order (`null` for a refused one).
                        let mut list = vec![];
                        for (k, u) in sm.units.iter().enumerate() {
                            let (status, result) = if u.tolerated {
                                (StepStatus::Failed, Value::Null)
                            } else {
                                (StepStatus::Done, json!({ "e": k }))
                            };
                            prop_assert_eq!(s.elements[k].status, status, "element {}", k);
                            list.push(result);
                        }
                        prop_assert_eq!(
                            &results[&s.name]["result"],
                            &Value::Array(list),
                            "the result of forEach step {}",
                            i
                        );
                    }
                }
            }
            if !m.operator {
                let last = match want {
                    ProcessState::Processed => NoticeKind::Processed,
                    ProcessState::Refused => NoticeKind::Refused,
                    ProcessState::Compensated => NoticeKind::Compensated,
                    ProcessState::CompensationFailed => NoticeKind::CompensationFailed,
                    _ => NoticeKind::Failed,
                };
                prop_assert_eq!(self.notices.last(), Some(&last), "notices");
                if !m.late {
                    prop_assert_eq!(
                        self.notices.contains(&NoticeKind::Failed),
                        m.first == Some(Kind::Failed),
                        "the alert: {:?}",
                        self.notices
                    );
                }
            }
            Ok(())
        }

        /// Drives the task to its end: claims, answers every step, element or undo out with a
        /// success, lets time pass to what is due, delivers the notices; a task in Error is
        /// compensated by an operator, a failed compensation retried.
        fn drive(&mut self) -> Result<(), TestCaseError> {
            for _ in 0..1000 {
                if self.r.notice_pending() {
                    let t = notice_delivered(&self.r, self.now, None).expect("owed");
                    self.apply(Act::Delivered, t)?;
                    continue;
                }
                let ops = ops(Some("drive"));
                match self.r.process_state {
                    ProcessState::Processed | ProcessState::Compensated | ProcessState::Refused => {
                        return self.quiet();
                    }
                    ProcessState::Error => {
                        self.quiet()?;
                        let t = compensate(&self.r, &ops, self.now, &self.p)
                            .map_err(|e| TestCaseError::fail(format!("compensate: {e}")))?;
                        self.apply(Act::Compensate, t)?;
                        continue;
                    }
                    ProcessState::CompensationFailed
                        if self.m.blocked()
                            == Some((
                                self.r.step_index,
                                self.r.undo_element(self.r.step_index).unwrap_or(0),
                            ))
                            && self
                                .r
                                .last_error
                                .as_deref()
                                .is_some_and(|e| e.contains("_needs_operator")) =>
                    {
                        // Refused while its child or run waits for an operator: the task waits
                        // for one too.
                        return self.quiet();
                    }
                    ProcessState::CompensationFailed => {
                        prop_assert!(self.m.undo_trouble, "no undo failed: {:?}", self.r);
                        let t = retry(&self.r, &ops, self.now, &self.p)
                            .map_err(|e| TestCaseError::fail(format!("retry: {e}")))?;
                        self.apply(Act::Retry, t)?;
                        continue;
                    }
                    _ => {}
                }
                let out = outs(&self.r);
                let waits = |o: &&Out| !o.undo && self.m.steps[o.step].wait;
                if let Some(o) = out.iter().find(|o| !waits(o)).copied() {
                    let call = self.m.steps[o.step].call;
                    if !o.undo
                        && call.timeout().is_some()
                        && self.r.steps[o.step].status == StepStatus::Waiting
                    {
                        // A callback step its service accepted: it calls back (a child or run
                        // that ended CompensationFailed answers as it did: its answer delivered
                        // again).
                        let g = self.r.steps[o.step].generation;
                        let outcome = if self.m.steps[o.step].units[0].needs_operator {
                            Outcome::Faulted
                        } else {
                            Outcome::Success
                        };
                        let act = Act::Callback((o.step, 0), g, outcome);
                        let t = apply_callback(
                            &self.r,
                            o.step,
                            g,
                            &self.answer(outcome, &o),
                            self.now,
                            &self.p,
                            &self.router(),
                        )
                        .map_err(|e| TestCaseError::fail(format!("{act:?}: {e}")))?;
                        self.apply(act, t)?;
                        continue;
                    }
                    // Answered at once; but a callback step's service accepts it first, then
                    // calls back, and a sub-workflow (distributed forEach) step's undo is
                    // accepted (the child's compensation starts, or the run's undos), then its
                    // end answers; a child or run that waits for an operator refuses the undo.
                    let needs_operator =
                        o.undo && self.m.steps[o.step].units[o.unit().1].needs_operator;
                    // Drawn: what the undo it accepted started (the child's compensation, the
                    // run's undos) could not undo itself. It refuses the undo, and waits for an
                    // operator (it refuses the undo's retries outright).
                    let refused_after_accepting = !needs_operator
                        && o.undo
                        && call.starts()
                        && self.refuse_accepted_undo
                        && self.undos_accepted.contains(&(o.attempt, o.step));
                    if refused_after_accepting {
                        self.m.u(o.unit()).needs_operator = true;
                    }
                    let accepts = if o.undo {
                        !needs_operator
                            && call.starts()
                            && self.undos_accepted.insert((o.attempt, o.step))
                    } else {
                        call.timeout().is_some()
                    };
                    let outcome = if needs_operator || refused_after_accepting {
                        Outcome::Refusal
                    } else if accepts {
                        Outcome::Accepted
                    } else {
                        Outcome::Success
                    };
                    let reply = if needs_operator {
                        needs_operator_refusal(call)
                    } else if refused_after_accepting {
                        StepOutcome::Refused {
                            code: match call {
                                Call::Run(_) => "element_undo_failed",
                                _ => "child_undo_failed",
                            }
                            .into(),
                            message: "an undo of its own failed".into(),
                        }
                    } else {
                        self.answer(outcome, &o)
                    };
                    let act = Act::Reply(o, outcome);
                    let t = apply_reply(
                        &self.r,
                        o.attempt,
                        o.step,
                        o.undo,
                        &reply,
                        self.now,
                        &self.p,
                        &self.router(),
                    )
                    .map_err(|e| TestCaseError::fail(format!("{act:?}: {e}")))?;
                    self.apply(act, t)?;
                    continue;
                }
                if let Some(o) = out
                    .iter()
                    .find(|o| waits(o) && self.m.steps[o.step].event.is_some())
                {
                    if self
                        .r
                        .task_deadline_applies()
                        .is_some_and(|d| d <= self.now)
                    {
                        // Too late for the event: the supervisor fails the task.
                        let t = expire(&self.r, self.now, &self.p, 0.5)
                            .map_err(|e| TestCaseError::fail(format!("past the deadline: {e}")))?;
                        self.apply(Act::Expire, t)?;
                        continue;
                    }
                    // A wait for its event: the event comes.
                    let id = self.event_ids.len();
                    self.event_ids.push(format!("id-{id}"));
                    let d = Delivery {
                        name: self.m.steps[o.step].event.clone().unwrap_or_default(),
                        id: Some(format!("id-{id}")),
                        payload: "{}".into(),
                    };
                    let t = deliver(&self.r, &d, self.now, &self.p, &self.router())
                        .map_err(|e| TestCaseError::fail(format!("the event for {o:?}: {e}")))?;
                    self.apply(Act::Event(o.step, id), t)?;
                    continue;
                }
                if let Some(d) = out.iter().filter(waits).filter_map(|o| o.deadline).min() {
                    // Only waits are out: time passes to the first's time, which ends it.
                    self.now = self.now.max(d);
                    let t = expire(&self.r, self.now, &self.p, 0.5)
                        .map_err(|e| TestCaseError::fail(format!("a wait due at {d}: {e}")))?;
                    self.apply(Act::Expire, t)?;
                    continue;
                }
                match claim(&self.r, "s", self.now, &self.p, &self.router()) {
                    Ok(t) => self.apply(Act::Claim, t)?,
                    Err(Rejection::PastDeadline { .. }) => {
                        // The supervisor fails the task.
                        let t = expire(&self.r, self.now, &self.p, 0.5)
                            .map_err(|e| TestCaseError::fail(format!("past the deadline: {e}")))?;
                        self.apply(Act::Expire, t)?;
                    }
                    Err(Rejection::NotDue { due: Some(d) }) if d > self.now => self.now = d,
                    // Elements wait for a place under `maxConcurrency`, held by one handed
                    // back whose retry is not due yet: time passes.
                    Err(Rejection::NotDue { due: Some(_) })
                        if self
                            .r
                            .fanout
                            .as_ref()
                            .is_some_and(|f| f.running().next().is_some()) =>
                    {
                        self.now += Duration::seconds(1);
                    }
                    Err(Rejection::TooEarly { until }) => self.now = until,
                    Err(e) => {
                        return Err(TestCaseError::fail(format!("stuck: {e}\n{:?}", self.r)));
                    }
                }
            }
            Err(TestCaseError::fail(format!("no end: {:?}", self.r)))
        }
    }

    /// The result of a distributed forEach step over `items` elements, each answered `{"e": k}`.
    fn run_results(items: usize) -> Value {
        Value::Array((0..items).map(|k| json!({ "e": k })).collect())
    }

    /// sas's answer to the undo of a step whose child task (`child_needs_operator`) or run
    /// (`run_needs_operator`) ended CompensationFailed: refused, until an operator settles it.
    fn needs_operator_refusal(call: Call) -> StepOutcome {
        let (code, what) = match call {
            Call::Run(_) => ("run_needs_operator", "run"),
            _ => ("child_needs_operator", "child task"),
        };
        StepOutcome::Refused {
            code: code.into(),
            message: format!("the {what} is CompensationFailed: an operator settles it first"),
        }
    }

    /// The workflow of draw `d` (with a task deadline of `deadline` seconds), published over
    /// the deployment's policy `base`, and its task's input.
    fn publish(
        d: &Draw,
        base: &Policy,
        deadline: Option<u16>,
    ) -> Result<(Workflow, Value), TestCaseError> {
        let (mut definition, input) = d.definition();
        if let Some(s) = deadline {
            definition["deadline"] = json!(format!("{s}s"));
        }
        let w = Workflow::from_value(definition.clone(), None, base)
            .map_err(|e| TestCaseError::fail(format!("{e:?}\n{definition:#}")))?
            .with_version(1);
        Ok((w, input))
    }

    /// Runs `events` (operator actions only if `operators`), then drives the task to its end.
    fn run(
        d: &Draw,
        events: &[(Ev, Mode)],
        auto: bool,
        operators: bool,
        threshold: u32,
        deadline: Option<u16>,
    ) -> Result<(), TestCaseError> {
        let mut base = base();
        base.auto_compensate = auto;
        base.failure_threshold = threshold;
        let (w, input) = publish(d, &base, deadline)?;
        // The workflow's own: each step's (a wait step's says so).
        let p = w.policies();
        let r = record(&w, t0());
        let task = test_task(&r, input);
        let mut run = Run::new(&w, &task, r, d, p, auto);
        run.m.deadline = run.r.deadline;
        for (i, s) in w.steps.iter().enumerate() {
            let names = s
                .wait
                .as_ref()
                .map(|w| w.events().to_vec())
                .unwrap_or_default();
            prop_assert_eq!(
                names.is_empty(),
                run.m.steps[i].event.is_none(),
                "step {} a wait for an event",
                i
            );
            run.m.steps[i].event = names.first().cloned();
        }
        prop_assert_eq!(
            run.r.deadline,
            deadline.map(|s| run.r.created_at + Duration::seconds(i64::from(s)))
        );
        // The model lays the steps out as the workflow does.
        prop_assert_eq!(run.m.steps.len(), w.steps.len(), "the model's steps");
        for (i, s) in w.steps.iter().enumerate() {
            let call = run.m.steps[i].call;
            prop_assert_eq!(
                (
                    s.policy.callback.map(|c| c.timeout),
                    s.child.is_some(),
                    s.run.is_some()
                ),
                (
                    call.timeout(),
                    matches!(call, Call::Child(_)),
                    matches!(call, Call::Run(_))
                ),
                "step {} a callback step, a sub-workflow step, a distributed forEach step",
                i
            );
            if let Call::Run(secs) = call {
                // Its `timeout` bounds the agent's attempt that starts its run; the task keeps
                // none of its elements (no forEach of its own), and its undo, if any, is the
                // run's (waiting as long as the run may take).
                prop_assert_eq!(
                    (
                        s.policy.step_timeout,
                        s.for_each.is_none(),
                        s.policy.undo_timeout
                    ),
                    (Duration::seconds(i64::from(secs)), true, call.timeout()),
                    "distributed forEach step {}",
                    i
                );
                prop_assert_eq!(
                    s.undo.is_some(),
                    run.m.steps[i].undoable,
                    "step {}'s undo",
                    i
                );
            }
            prop_assert_eq!(
                s.policy.accepted_leaves_nothing_in_flight(),
                call.starts(),
                "step {}: its undo answers later",
                i
            );
            prop_assert_eq!(
                s.for_each.is_some(),
                run.m.steps[i].each.is_some(),
                "step {} a forEach step",
                i
            );
        }
        for (ev, mode) in events {
            let by_operator = matches!(ev, Ev::Cancel | Ev::Retry | Ev::Skip | Ev::Compensate);
            if by_operator && !operators {
                continue;
            }
            run.event(ev, *mode)?;
        }
        run.drive()
    }

    /// A step fails in one branch, then a step of another branch, out meanwhile, is refused:
    /// the first failure decides. The task failed (the alert is owed) and is compensated; it
    /// ends Compensated, not Refused (the state of a business refusal, "no operator alert").
    #[test]
    fn a_refusal_after_a_failure_does_not_make_the_task_refused() {
        let d = Draw {
            before: vec![],
            branches: vec![
                vec![Item::Step(StepDraw {
                    undo: false,
                    when: None,
                    wait: None,
                    event: false,
                    call: Call::Plain,
                })];
                2
            ],
            after: vec![],
            group_when: None,
            items: 0,
            refuse_accepted_undo: false,
        };
        let w = Workflow::from_value(d.definition().0, None, &base()).expect("valid");
        let p = policy();
        let now = t0();
        let mut r = record(&w, now);
        let task = test_task(&r, json!({}));
        let router = TaskRouter {
            workflow: &w,
            task: &task,
        };
        apply_with(&mut r, &p, |r| claim(r, "s", now, &p, &router));
        let [a, b] = [0, 1].map(|i| outs(&r)[i]);
        apply_with(&mut r, &p, |r| {
            apply_reply(r, a.attempt, a.step, false, &refused(), now, &p, &router)
        });
        apply_with(&mut r, &p, |r| {
            apply_reply(r, b.attempt, b.step, false, &declined(), now, &p, &router)
        });
        assert_eq!(r.owed(), [NoticeKind::Failed, NoticeKind::Compensated]);
        assert_eq!(r.process_state, ProcessState::Compensated);
    }

    /// An operator skips a step whose attempt timed out (it may still be in flight until its
    /// deadline): the step is Done and keeps that deadline, so a later compensation sends its
    /// undo `undo_wait` past it, not at once.
    #[test]
    fn a_skipped_step_that_timed_out_is_undone_after_its_deadline() {
        let p = with(|p| {
            p.auto_compensate = false;
            p.failure_threshold = 1;
        });
        let now = t0();
        let mut r = fresh(now);
        apply_with(&mut r, &p, |r| claim(r, "s", now, &p, &Linear));
        let deadline = r.complete_by.expect("out");
        let spent = StepOutcome::TimedOut {
            error: "spent".into(),
        };
        apply_with(&mut r, &p, |r| {
            apply_reply(r, 1, 0, false, &spent, now, &p, &Linear)
        });
        assert_eq!(r.process_state, ProcessState::Error);
        apply_with(&mut r, &p, |r| skip(r, &ops(None), now, &p, None));
        apply_with(&mut r, &p, |r| cancel(r, &ops(None), now, &p));
        assert_eq!(
            (r.process_state, r.step_index),
            (ProcessState::Compensating, 0)
        );
        assert_eq!(r.undo_after, Some(deadline + base().undo_wait));
    }

    /// A group stops at its task's deadline while a branch's callback step, handed back after
    /// its deadline, waits for a claim: the group's cursor is on that step, for the operator.
    /// Its callback then comes late: it is refused (it made the step the group stopped at
    /// Done: an invalid record), and the task is compensated as the model says.
    #[test]
    fn a_late_callback_for_the_step_a_stopped_group_is_at_is_refused() {
        let step = |call| {
            Item::Step(StepDraw {
                undo: false,
                when: None,
                wait: None,
                event: false,
                call,
            })
        };
        let d = Draw {
            before: vec![],
            branches: vec![
                vec![step(Call::Callback(2))],
                vec![
                    Item::Each(EachDraw {
                        undo: false,
                        when: None,
                        max: 1,
                        tolerated: 0,
                    }),
                    step(Call::Plain),
                ],
            ],
            after: vec![],
            group_when: None,
            items: 0,
            refuse_accepted_undo: false,
        };
        let events = [
            (Ev::Claim, Mode::Normal),
            (Ev::Advance(3), Mode::Normal),
            (Ev::Claim, Mode::Normal),
            (Ev::Due(1), Mode::Normal),
            (Ev::Advance(11), Mode::Normal),
            (Ev::Expire(0), Mode::Normal),
            (
                Ev::Callback {
                    pick: 0,
                    outcome: 0,
                    how: 0,
                },
                Mode::Normal,
            ),
        ];
        run(&d, &events, false, false, 2, Some(14)).expect("as the model says");
    }

    proptest! {
        /// Any interleaving of events about a parallel group's branches keeps the record
        /// valid, never sends a step once the task stops, sends each step under an attempt
        /// once; and the task then ends as the model says, having undone, last first, exactly
        /// the steps that may have taken effect. Steps may be callback steps, sub-workflow
        /// steps and (on the main line) distributed forEach steps (see `Call`): accepted,
        /// called back (a stale callback changes nothing; one for the step a task waits for
        /// applies), timed out while accepted, the undo of a sub-workflow or distributed step
        /// accepted then answered (once); any answer may be `Faulted` (see
        /// `children_and_runs_end_as_the_model_says`).
        #[test]
        fn parallel_groups_end_as_the_model_says(
            d in draw(),
            events in proptest::collection::vec((ev(1, 2), mode()), 0..60),
            auto in proptest::bool::ANY,
            operators in proptest::bool::weighted(0.4),
            threshold in 1u32..=3,
            deadline in proptest::option::weighted(0.25, 5u16..=240),
        ) {
            run(&d, &events, auto, operators, threshold, deadline)?;
        }

        /// The same with a forEach step over 0-6 items (before or after the group, or in a
        /// case of a choice) and choices on the main line and in branches, events fed to its
        /// elements too: besides the above, no more elements hold a place at once than the
        /// step's `maxConcurrency` (out, or handed back while their last call may be in
        /// flight), refusals within the tolerance end their element and the step goes on, one
        /// more stops it; every element that may have taken effect is undone, the highest
        /// step first and, within a forEach step, the highest element first; the step's result
        /// lists its elements' in order.
        #[test]
        fn for_each_steps_and_choices_end_as_the_model_says(
            d in draw_each(),
            events in proptest::collection::vec((ev(2, 2), mode()), 0..80),
            auto in proptest::bool::ANY,
            operators in proptest::bool::weighted(0.4),
            threshold in 1u32..=3,
            deadline in proptest::option::weighted(0.25, 5u16..=240),
        ) {
            run(&d, &events, auto, operators, threshold, deadline)?;
        }

        /// The same with mostly sub-workflow steps and distributed forEach steps (see `Call`),
        /// their ends often `Faulted` (what they started ended CompensationFailed): besides the
        /// above, a distributed forEach step waits for its run's end 24 hours whatever its
        /// `timeout`, keeps no element of its own, and is undone as a unit if it has an undo;
        /// a step answered `Faulted` fails the task and is undone, and while its child or run
        /// waits for an operator that undo is refused, so the task ends CompensationFailed at
        /// that step, having undone exactly the steps after it.
        #[test]
        fn children_and_runs_end_as_the_model_says(
            d in draw_starts(),
            events in proptest::collection::vec((ev(1, 5), mode()), 0..50),
            auto in proptest::bool::ANY,
            operators in proptest::bool::weighted(0.4),
            threshold in 1u32..=3,
            deadline in proptest::option::weighted(0.2, 5u16..=240),
        ) {
            run(&d, &events, auto, operators, threshold, deadline)?;
        }
    }
}
