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

/// The second property: workflows with a parallel group, routed by their real conditions,
/// under any interleaving of events about their branches, checked against a model of what
/// the runtime must do (written here from the semantics, without the transitions' helpers).
mod parallel {
    use super::super::route::test_task;
    use super::super::testkit::*;
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
    }

    /// A drawn workflow: 0-2 steps, a parallel group of 2-4 branches of 1-3 steps (perhaps
    /// with a condition on the whole group), 0-2 steps.
    #[derive(Debug, Clone)]
    struct Draw {
        before: Vec<StepDraw>,
        branches: Vec<Vec<StepDraw>>,
        after: Vec<StepDraw>,
        group_when: Option<bool>,
    }

    fn step_draw() -> impl Strategy<Value = StepDraw> {
        (
            proptest::bool::ANY,
            proptest::option::weighted(0.3, proptest::bool::ANY),
        )
            .prop_map(|(undo, when)| StepDraw { undo, when })
    }

    fn draw() -> impl Strategy<Value = Draw> {
        let steps = |r: std::ops::RangeInclusive<usize>| proptest::collection::vec(step_draw(), r);
        (
            steps(0..=2),
            proptest::collection::vec(steps(1..=3), 2..=4),
            steps(0..=2),
            proptest::option::weighted(0.15, proptest::bool::ANY),
        )
            .prop_map(|(before, branches, after, group_when)| Draw {
                before,
                branches,
                after,
                group_when,
            })
    }

    impl Draw {
        /// The definition (JSON, as a YAML document reads) and the task's input.
        fn definition(&self) -> (Value, Value) {
            fn cond(input: &mut Map<String, Value>, b: bool) -> Value {
                let key = format!("g{}", input.len());
                input.insert(key.clone(), json!(b));
                json!(format!("input.{key}"))
            }
            let mut input = Map::new();
            let step = |name: String, s: &StepDraw, input: &mut Map<String, Value>| {
                let mut v = json!({"name": name, "service": "s"});
                if s.undo {
                    v["undo"] = json!({"action": format!("undo-{name}")});
                }
                if let Some(b) = s.when {
                    v["when"] = cond(input, b);
                }
                v
            };
            let mut steps: Vec<Value> = vec![];
            for (k, s) in self.before.iter().enumerate() {
                steps.push(step(format!("before-{k}"), s, &mut input));
            }
            let branches: Vec<Value> = self
                .branches
                .iter()
                .enumerate()
                .map(|(b, br)| {
                    let inner: Vec<Value> = br
                        .iter()
                        .enumerate()
                        .map(|(k, s)| step(format!("b{b}-{k}"), s, &mut input))
                        .collect();
                    json!({"name": format!("arm-{b}"), "steps": inner})
                })
                .collect();
            let mut group = json!({"name": "group", "parallel": branches});
            if let Some(b) = self.group_when {
                group["when"] = cond(&mut input, b);
            }
            steps.push(group);
            for (k, s) in self.after.iter().enumerate() {
                steps.push(step(format!("after-{k}"), s, &mut input));
            }
            (json!({"name": "fan", "steps": steps}), Value::Object(input))
        }
    }

    #[derive(Debug, Clone)]
    enum Ev {
        Claim,
        /// An answer to the `pick`-th step (or undo) out: 0 success, 1 refusal, 2 failure,
        /// 3 timed out, 4 deferred.
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
        Delivered,
        Cancel,
        Retry,
        Skip,
        Compensate,
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

    fn ev() -> impl Strategy<Value = Ev> {
        prop_oneof![
            4 => Just(Ev::Claim),
            8 => (0u8..4, prop_oneof![5 => Just(0u8), 1 => Just(1), 1 => Just(2), 2 => Just(3), 1 => Just(4)])
                .prop_map(|(pick, outcome)| Ev::Reply { pick, outcome }),
            2 => (0u8..4, 0u8..5).prop_map(|(pick, how)| Ev::Stale { pick, how }),
            3 => (0u16..15).prop_map(Ev::Advance),
            2 => (0u8..10).prop_map(Ev::Expire),
            1 => Just(Ev::Delivered),
            1 => Just(Ev::Cancel),
            1 => Just(Ev::Retry),
            1 => Just(Ev::Skip),
            1 => Just(Ev::Compensate),
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

    /// A step (or undo) out, as the record shows it: what a reply must name.
    #[derive(Debug, Clone, Copy)]
    struct Out {
        step: usize,
        attempt: u64,
        undo: bool,
        deadline: Option<DateTime<Utc>>,
    }

    fn outs(r: &StateRecord) -> Vec<Out> {
        if let Some(f) = &r.fanout {
            return f
                .branches
                .iter()
                .filter(|b| b.is_out())
                .map(|b| Out {
                    step: b.step_index,
                    attempt: b.attempt,
                    undo: false,
                    deadline: b.complete_by,
                })
                .collect();
        }
        let out = |undo| Out {
            step: r.step_index,
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

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Outcome {
        Success,
        Refusal,
        Failure,
        TimedOut,
        Deferred,
    }

    impl Outcome {
        fn of(k: u8) -> Self {
            match k {
                1 => Self::Refusal,
                2 => Self::Failure,
                3 => Self::TimedOut,
                4 => Self::Deferred,
                _ => Self::Success,
            }
        }

        fn reply(self, now: DateTime<Utc>) -> StepOutcome {
            match self {
                Self::Success => ok(),
                Self::Refusal => declined(),
                Self::Failure => refused(),
                Self::TimedOut => StepOutcome::TimedOut {
                    error: "spent".into(),
                },
                Self::Deferred => StepOutcome::Deferred {
                    until: now + Duration::seconds(20),
                    misconfigured: None,
                    paused: None,
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
    }

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Kind {
        Refused,
        Failed,
    }

    /// What the runtime must do, from the steps that went out (the effects) and the outcomes
    /// fed: which steps may have taken effect, what stopped the task first, what an operator
    /// did.
    #[derive(Debug)]
    struct Model {
        undoable: Vec<bool>,
        /// Whether each step runs, by its conditions on the drawn input.
        runs: Vec<bool>,
        /// The failure counter each step counts against (see `line`).
        line: Vec<usize>,
        threshold: u32,
        auto: bool,
        undo_wait: Duration,
        /// Sent, and not sent back unsent by an operator's retry of a refused step.
        sent: Vec<bool>,
        /// Its last answer was a refusal or a failure: it had no effect.
        no_effect: Vec<bool>,
        /// The deadline of its latest attempt.
        deadline: Vec<Option<DateTime<Utc>>>,
        /// The latest deadline of an attempt that ended without an answer (timed out,
        /// deferred, cancelled), since its last answer: its undo waits past it.
        unsure: Vec<Option<DateTime<Utc>>>,
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
        /// The undos sent, in order.
        undos: Vec<usize>,
        dispatched: HashSet<(usize, u64, bool)>,
        /// Every step that went out.
        went_out: Vec<bool>,
        /// Out: sent, and since then not answered, past its deadline at an expiry, or
        /// cancelled.
        out: Vec<bool>,
    }

    impl Model {
        fn new(d: &Draw, p: &Policy, auto: bool) -> Self {
            let (mut undoable, mut runs, mut line) = (vec![], vec![], vec![]);
            let group_runs = d.group_when.unwrap_or(true);
            for s in &d.before {
                undoable.push(s.undo);
                runs.push(s.when.unwrap_or(true));
                line.push(0);
            }
            for (b, br) in d.branches.iter().enumerate() {
                for s in br {
                    undoable.push(s.undo);
                    runs.push(group_runs && s.when.unwrap_or(true));
                    line.push(2 + b);
                }
            }
            for s in &d.after {
                undoable.push(s.undo);
                runs.push(s.when.unwrap_or(true));
                // The main line's count restarts after a group that ran.
                line.push(if group_runs { 1 } else { 0 });
            }
            let n = undoable.len();
            Self {
                undoable,
                runs,
                line,
                threshold: p.failure_threshold,
                auto,
                undo_wait: p.undo_wait,
                sent: vec![false; n],
                no_effect: vec![false; n],
                deadline: vec![None; n],
                unsure: vec![None; n],
                counts: vec![0; 2 + d.branches.len()],
                first: None,
                refusal: false,
                halted: false,
                by_operator: false,
                operator: false,
                undo_trouble: false,
                undos: vec![],
                dispatched: HashSet::new(),
                went_out: vec![false; n],
                out: vec![false; n],
            }
        }

        /// The steps that may have taken effect and have an undo.
        fn to_undo(&self) -> Vec<usize> {
            (0..self.undoable.len())
                .filter(|&i| self.undoable[i] && self.sent[i] && !self.no_effect[i])
                .collect()
        }

        fn stop(&mut self, kind: Kind) {
            // The first failure decides: a refusal after a failure is not the task's.
            if *self.first.get_or_insert(kind) == Kind::Refused {
                self.refusal = true;
            }
            self.halted = true;
        }

        fn unsure(&mut self, i: usize, until: Option<DateTime<Utc>>) {
            self.unsure[i] = self.unsure[i].max(until);
        }

        /// Step `i`'s attempt came to nothing: counted, up to the failure.
        fn timed_out(&mut self, i: usize) {
            if self.halted {
                return;
            }
            let c = &mut self.counts[self.line[i]];
            *c += 1;
            if *c >= self.threshold {
                self.stop(Kind::Failed);
            }
        }

        /// An operator's retry or skip: the task goes on, every step that was refused or failed
        /// (its key refused) goes out again as never sent.
        fn goes_on(&mut self) {
            self.first = None;
            self.refusal = false;
            self.halted = false;
            self.counts.iter_mut().for_each(|c| *c = 0);
            for i in 0..self.sent.len() {
                if self.no_effect[i] {
                    self.sent[i] = false;
                    self.no_effect[i] = false;
                }
            }
        }

        /// What the task ends as, once quiet.
        fn predict(&self) -> ProcessState {
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
            match act {
                Act::Reply(o, outcome) if !o.undo => {
                    let i = o.step;
                    self.out[i] = false;
                    match outcome {
                        Outcome::Success => self.unsure[i] = None,
                        Outcome::Refusal | Outcome::Failure => {
                            self.no_effect[i] = true;
                            self.unsure[i] = None;
                            self.stop(if outcome == Outcome::Refusal {
                                Kind::Refused
                            } else {
                                Kind::Failed
                            });
                        }
                        Outcome::TimedOut => {
                            self.unsure(i, o.deadline);
                            self.timed_out(i);
                        }
                        Outcome::Deferred => self.unsure(i, o.deadline),
                    }
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
                    for i in 0..self.out.len() {
                        if self.out[i] && self.deadline[i].is_some_and(|d| d <= now) {
                            self.out[i] = false;
                            self.unsure(i, self.deadline[i]);
                            self.timed_out(i);
                        }
                    }
                    if outs(pre)
                        .iter()
                        .any(|o| o.undo && o.deadline.is_some_and(|d| d <= now))
                    {
                        self.undo_trouble = true;
                    }
                }
                Act::Cancel => {
                    for i in 0..self.out.len() {
                        if std::mem::take(&mut self.out[i]) {
                            self.unsure(i, self.deadline[i]);
                        }
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
                    }
                }
                Act::Skip => {
                    self.operator = true;
                    // Done by hand: it took effect.
                    self.no_effect[pre.step_index] = false;
                    // A step skipped after it timed out keeps its deadline: its undo still
                    // waits for the attempt that may be in flight.
                    self.goes_on();
                }
                Act::Claim | Act::Delivered | Act::Stale => {}
            }
            let r = &t.record;
            for e in &t.effects {
                let (i, attempt, undo, deadline) = match e {
                    Effect::SendStepRequest => (
                        r.step_index,
                        r.attempt,
                        r.process_state == ProcessState::Compensating,
                        r.complete_by,
                    ),
                    Effect::SendBranchStep(b) => {
                        let br = r
                            .fanout
                            .as_ref()
                            .and_then(|f| f.branches.get(*b))
                            .ok_or_else(|| {
                                TestCaseError::fail(format!("{e:?} without its branch"))
                            })?;
                        (br.step_index, br.attempt, false, br.complete_by)
                    }
                    _ => continue,
                };
                prop_assert!(
                    self.dispatched.insert((i, attempt, undo)),
                    "step {i} (undo: {undo}) sent twice under attempt {attempt}"
                );
                if undo {
                    prop_assert!(
                        self.undoable[i] && self.sent[i] && !self.no_effect[i],
                        "the undo of step {i}, which had no effect, went out"
                    );
                    if let Some(last) = self.undos.last() {
                        prop_assert!(*last >= i, "undo of {i} after the undo of {last}");
                    }
                    if let Some(d) = self.unsure[i] {
                        prop_assert!(
                            now >= d + self.undo_wait,
                            "the undo of step {i} went out at {now}, before its step's deadline {d} and the wait"
                        );
                    }
                    self.undos.push(i);
                } else {
                    prop_assert!(!self.halted, "step {i} went out while the task stops");
                    prop_assert!(self.runs[i], "step {i}, whose condition is false, went out");
                    self.sent[i] = true;
                    self.went_out[i] = true;
                    self.out[i] = true;
                    self.no_effect[i] = false;
                    self.deadline[i] = deadline;
                }
            }
            if !matches!(
                r.process_state,
                ProcessState::Pending | ProcessState::Processing
            ) {
                let out: Vec<usize> = (0..self.out.len()).filter(|&i| self.out[i]).collect();
                prop_assert!(
                    out.is_empty(),
                    "{} while steps {:?} are out",
                    r.process_state,
                    out
                );
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
    }

    impl Run<'_> {
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
                    let outcome = Outcome::of(*outcome);
                    (
                        Act::Reply(o, outcome),
                        apply_reply(
                            on,
                            o.attempt,
                            o.step,
                            o.undo,
                            &outcome.reply(now),
                            now,
                            p,
                            &router,
                        ),
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
                    (
                        Act::Stale,
                        apply_reply(on, attempt, step, undo, &ok(), now, p, &router),
                    )
                }
                Ev::Advance(_) => return None,
                Ev::Expire(j) => (Act::Expire, expire(on, now, p, f64::from(*j) / 10.0)),
                Ev::Delivered => (Act::Delivered, notice_delivered(on, now)),
                Ev::Cancel => (Act::Cancel, cancel(on, &ops, now, p)),
                Ev::Retry => (Act::Retry, retry(on, &ops, now, p)),
                Ev::Skip => (Act::Skip, skip(on, &ops, now, p, None)),
                Ev::Compensate => (Act::Compensate, compensate(on, &ops, now, p)),
            })
        }

        /// Applies `t`, made by `act` on the current record: the checks of every transition,
        /// then the model takes it in.
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
            let logged = t.record.history.last() != r.history.last();
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
            let pre = self.r.clone();
            self.m.accept(&pre, act, &t, self.now)?;
            self.r = t.record;
            Ok(())
        }

        fn event(&mut self, ev: &Ev, mode: Mode) -> Result<(), TestCaseError> {
            if let Ev::Advance(s) = ev {
                self.now += Duration::seconds(i64::from(*s));
                return Ok(());
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
                    if let Ev::Stale { how, .. } = ev {
                        prop_assert!(out.is_err(), "a stale reply ({how}) applies: {out:?}");
                        return Ok(());
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
            let undone: Vec<usize> = (0..r.steps.len())
                .filter(|&i| r.steps[i].undo == Some(StepStatus::Done))
                .collect();
            let expected = match want {
                ProcessState::Refused | ProcessState::Compensated => m.to_undo(),
                _ => vec![],
            };
            prop_assert_eq!(&undone, &expected, "the undos that ran; model: {:?}", m);
            if want == ProcessState::Processed {
                for (i, s) in r.steps.iter().enumerate() {
                    let status = if m.runs[i] {
                        StepStatus::Done
                    } else {
                        StepStatus::Skipped
                    };
                    prop_assert_eq!(s.status, status, "step {}", i);
                    // Done without being sent only by an operator's skip.
                    prop_assert!(
                        m.went_out[i] || !m.runs[i] || m.operator,
                        "step {i} done, never sent"
                    );
                }
            }
            if !m.operator {
                let last = match want {
                    ProcessState::Processed => NoticeKind::Processed,
                    ProcessState::Refused => NoticeKind::Refused,
                    ProcessState::Compensated => NoticeKind::Compensated,
                    _ => NoticeKind::Failed,
                };
                prop_assert_eq!(self.notices.last(), Some(&last), "notices");
                prop_assert_eq!(
                    self.notices.contains(&NoticeKind::Failed),
                    m.first == Some(Kind::Failed),
                    "the alert: {:?}",
                    self.notices
                );
            }
            Ok(())
        }

        /// Drives the task to its end: claims, answers every step or undo out with a
        /// success, lets time pass to what is due, delivers the notices; a task in Error is
        /// compensated by an operator, a failed compensation retried.
        fn drive(&mut self) -> Result<(), TestCaseError> {
            for _ in 0..400 {
                if self.r.notice_pending() {
                    let t = notice_delivered(&self.r, self.now).expect("owed");
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
                    ProcessState::CompensationFailed => {
                        prop_assert!(self.m.undo_trouble, "no undo failed: {:?}", self.r);
                        let t = retry(&self.r, &ops, self.now, &self.p)
                            .map_err(|e| TestCaseError::fail(format!("retry: {e}")))?;
                        self.apply(Act::Retry, t)?;
                        continue;
                    }
                    _ => {}
                }
                if let Some(o) = outs(&self.r).first().copied() {
                    let t = apply_reply(
                        &self.r,
                        o.attempt,
                        o.step,
                        o.undo,
                        &ok(),
                        self.now,
                        &self.p,
                        &self.router(),
                    )
                    .map_err(|e| TestCaseError::fail(format!("answer {o:?}: {e}")))?;
                    self.apply(Act::Reply(o, Outcome::Success), t)?;
                    continue;
                }
                match claim(&self.r, "s", self.now, &self.p, &self.router()) {
                    Ok(t) => self.apply(Act::Claim, t)?,
                    Err(Rejection::NotDue { due: Some(d) }) if d > self.now => self.now = d,
                    Err(Rejection::TooEarly { until }) => self.now = until,
                    Err(e) => {
                        return Err(TestCaseError::fail(format!("stuck: {e}\n{:?}", self.r)));
                    }
                }
            }
            Err(TestCaseError::fail(format!("no end: {:?}", self.r)))
        }
    }

    /// A step fails in one branch, then a step of another branch, out meanwhile, is refused:
    /// the first failure decides. The task failed (the alert is owed) and is compensated; it
    /// ends Compensated, not Refused (the state of a business refusal, "no operator alert").
    #[test]
    fn a_refusal_after_a_failure_does_not_make_the_task_refused() {
        let d = Draw {
            before: vec![],
            branches: vec![
                vec![StepDraw {
                    undo: false,
                    when: None
                }];
                2
            ],
            after: vec![],
            group_when: None,
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

    proptest! {
        /// Any interleaving of events about a parallel group's branches keeps the record
        /// valid, never sends a step once the task stops, sends each step under an attempt
        /// once; and the task then ends as the model says, having undone, last first, exactly
        /// the steps that may have taken effect.
        #[test]
        fn parallel_groups_end_as_the_model_says(
            d in draw(),
            events in proptest::collection::vec((ev(), mode()), 0..60),
            auto in proptest::bool::ANY,
            operators in proptest::bool::weighted(0.4),
            threshold in 1u32..=3,
        ) {
            let (definition, input) = d.definition();
            let w = Workflow::from_value(definition, None, &base())
                .map_err(|e| TestCaseError::fail(format!("{e:?}")))?
                .with_version(1);
            let p = with(|p| {
                p.auto_compensate = auto;
                p.failure_threshold = threshold;
            });
            let now = t0();
            let r = record(&w, now);
            let task = test_task(&r, input);
            let mut run = Run {
                w: &w,
                task: &task,
                m: Model::new(&d, p.at(0), auto),
                p,
                now,
                kept: r.clone(),
                r,
                notices: vec![],
                last_reply: None,
            };
            for (ev, mode) in &events {
                let by_operator = matches!(ev, Ev::Cancel | Ev::Retry | Ev::Skip | Ev::Compensate);
                if by_operator && !operators {
                    continue;
                }
                run.event(ev, *mode)?;
            }
            run.drive()?;
        }
    }
}
