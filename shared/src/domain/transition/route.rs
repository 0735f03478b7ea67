//! Where a task goes next: the conditions between the step just passed and the next one to run.
//!
//! A [`Router`] is asked when the cursor moves onto a step that was never sent (a step done,
//! or the first claim of a step): from there it decides, in the order written, every group that
//! starts at the cursor (its `when`, then a choice's cases: the first that holds runs) and the
//! step's own `when`, skipping what does not run, until it finds a step to run or the end. A
//! decision is kept in the record ([`Decision`]) and never taken again; a step that was sent is
//! never skipped (it may have taken effect). [`TaskRouter`] decides on a task's input and
//! results; [`Linear`] decides nothing (workflows without conditions, and tests).

use super::super::context::context;
use super::super::mapping::Mapping;
use super::super::state::MAX_RESULTS_BYTES;
use super::super::state::{Decision, StateRecord, StepStatus};
use super::super::task::Task;
use super::super::when::When;
use super::super::workflow::{Group, GroupKind, MAX_ELEMENTS, Tolerated, Wait, Workflow};
use chrono::{DateTime, Utc};

/// Where the cursor goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// The step to run next (the number of steps: none, every step is passed).
    pub next: usize,
    /// The steps decided not to run on the way.
    pub skipped: Vec<usize>,
    /// The groups decided on the way.
    pub decisions: Vec<Decision>,
}

/// A condition that could not be decided: step `step` fails with `error`
/// (`condition_failed: ...`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteError {
    pub step: usize,
    pub route: Route,
    pub error: String,
}

/// Decides where a task goes from step `from` (see the module's comment), up to the end of
/// the line the record walks ([`StateRecord::end`]: a branch ends at its last step). On the
/// main line it stops at a parallel group that runs: its branches route themselves.
pub trait Router {
    fn route(&self, r: &StateRecord, from: usize) -> Result<Route, RouteError>;

    /// The parallel group step `at` belongs to, if any.
    fn parallel(&self, _at: usize) -> Option<Parallel> {
        None
    }

    /// If step `at` is a forEach step: its run over the list its query selects on `r` (or why
    /// it cannot run: the query selects no list, or too long a one).
    fn for_each(&self, _r: &StateRecord, _at: usize) -> Option<Result<EachPlan, String>> {
        None
    }

    /// The events step `at` waits for, if it is a wait for events.
    fn events(&self, _at: usize) -> &[String] {
        &[]
    }

    /// If step `at` is a wait step: when it is done, reached on `r` at `now` (or why that
    /// cannot be known: its `waitUntil` selects no RFC 3339 time; a wait for an event: the
    /// most it waits).
    fn wait_until(
        &self,
        _r: &StateRecord,
        _at: usize,
        _now: DateTime<Utc>,
    ) -> Option<Result<DateTime<Utc>, String>> {
        None
    }
}

/// A forEach step's run: how many elements, at most how many out at once, how many refusals
/// it tolerates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EachPlan {
    pub elements: usize,
    pub max_concurrency: u32,
    pub tolerated: u32,
}

/// A parallel group: its name, its steps, and each branch's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parallel {
    pub name: String,
    pub span: std::ops::Range<usize>,
    pub branches: Vec<std::ops::Range<usize>>,
}

/// Decides nothing: the next step that is not already Skipped.
pub struct Linear;

impl Router for Linear {
    fn route(&self, r: &StateRecord, from: usize) -> Result<Route, RouteError> {
        Ok(Route {
            next: r.next_not_skipped(from),
            skipped: vec![],
            decisions: vec![],
        })
    }
}

/// Decides on one task's input and results, by its workflow's conditions.
pub struct TaskRouter<'a> {
    pub workflow: &'a Workflow,
    pub task: &'a Task,
}

impl TaskRouter<'_> {
    /// Whether group `g` is decided by the line `r` walks: on the main line, a group in no
    /// parallel group's branch; in a branch, a group in that branch. (A branch's first group
    /// starts where its parallel group does, and the next branch's where this one ends.)
    fn on_this_line(&self, g: &Group, r: &StateRecord) -> bool {
        let groups = &self.workflow.groups;
        let mut parent = g.parent;
        let mut branch = None;
        while let Some((gi, arm)) = parent {
            let Some(outer) = groups.get(gi) else { break };
            if let GroupKind::Parallel { arms } = &outer.kind {
                branch = arms.get(arm).map(|a| a.span.clone());
                break;
            }
            parent = outer.parent;
        }
        match r.branch() {
            None => branch.is_none(),
            Some(b) => branch == Some(b.start..b.end),
        }
    }
}

impl Router for TaskRouter<'_> {
    fn parallel(&self, at: usize) -> Option<Parallel> {
        self.workflow.groups.iter().find_map(|g| match &g.kind {
            GroupKind::Parallel { arms } if g.span.contains(&at) => Some(Parallel {
                name: g.name.clone(),
                span: g.span.clone(),
                branches: arms.iter().map(|a| a.span.clone()).collect(),
            }),
            _ => None,
        })
    }

    fn wait_until(
        &self,
        r: &StateRecord,
        at: usize,
        now: DateTime<Utc>,
    ) -> Option<Result<DateTime<Utc>, String>> {
        Some(match self.workflow.steps.get(at)?.wait.as_ref()? {
            Wait::For(d) => Ok(now + *d),
            Wait::Until(m) => wait_until(self.workflow, self.task, r, at, m),
            Wait::Event { within, .. } => Ok(now + *within),
        })
    }

    fn events(&self, at: usize) -> &[String] {
        self.workflow
            .steps
            .get(at)
            .and_then(|s| s.wait.as_ref())
            .map_or(&[], |w| w.events())
    }

    fn for_each(&self, r: &StateRecord, at: usize) -> Option<Result<EachPlan, String>> {
        let step = self.workflow.steps.get(at)?;
        let each = step.for_each.as_ref()?;
        Some(
            elements(self.workflow, self.task, r, at).map(|list| EachPlan {
                elements: list.len(),
                max_concurrency: each.max_concurrency,
                tolerated: match each.tolerated {
                    Tolerated::Count(n) => n,
                    Tolerated::Percent(pc) => {
                        u32::try_from(list.len() * pc as usize / 100).unwrap_or(u32::MAX)
                    }
                },
            }),
        )
    }

    fn route(&self, r: &StateRecord, from: usize) -> Result<Route, RouteError> {
        let w = self.workflow;
        if r.element().is_some() {
            // An element of a forEach step: the main line routed to the step.
            return Linear.route(r, from);
        }
        if w.groups.is_empty() && w.steps.iter().all(|s| s.when.is_none()) {
            // Nothing to decide (a linear workflow): no context to build.
            return Linear.route(r, from);
        }
        let n = r.end().min(w.steps.len());
        // On the main line, a parallel group that runs is where the route ends (its branches
        // route themselves); a branch routes inside its group.
        let main_line = r.branch().is_none();
        // The record as decided so far: later conditions read earlier decisions (a choice's
        // result).
        let mut seen = r.clone();
        let mut route = Route {
            next: n,
            skipped: vec![],
            decisions: vec![],
        };
        let mut j = from;
        loop {
            for (gi, g) in w.groups.iter().enumerate() {
                if g.span.start != j
                    || seen.decisions.iter().any(|d| d.group == g.name)
                    || !self.on_this_line(g, r)
                {
                    continue;
                }
                // One context for the group's conditions (its own and its cases').
                let ctx = context(w, self.task, &seen, j.min(n.saturating_sub(1)));
                let holds = |when: &When| decide(when, ctx.as_ref());
                let fail = |route: Route, error: String| RouteError {
                    step: j,
                    route,
                    error,
                };
                let group_runs = match &g.when {
                    None => true,
                    Some(when) => match holds(when) {
                        Ok(b) => b,
                        Err(e) => return Err(fail(route, e)),
                    },
                };
                let arm = match (&g.kind, group_runs) {
                    (_, false) => None,
                    (GroupKind::Parallel { .. }, true) => None,
                    (GroupKind::Choice { arms }, true) => {
                        let mut taken = None;
                        for (k, a) in arms.iter().enumerate() {
                            let hit = match &a.when {
                                None => true,
                                Some(when) => match holds(when) {
                                    Ok(b) => b,
                                    Err(e) => return Err(fail(route, e)),
                                },
                            };
                            if hit {
                                taken = Some(k);
                                break;
                            }
                        }
                        taken
                    }
                };
                let otherwise = match (&g.kind, arm) {
                    (GroupKind::Choice { arms }, Some(k)) => arms[k].when.is_none(),
                    _ => false,
                };
                let decision = Decision {
                    group: g.name.clone(),
                    arm,
                    otherwise,
                    skipped: !group_runs,
                    parallel: group_runs && matches!(g.kind, GroupKind::Parallel { .. }),
                };
                seen.decisions.push(decision.clone());
                route.decisions.push(decision);
                // What does not run: the whole group, or the arms of a choice not taken.
                let mut off: Vec<std::ops::Range<usize>> = vec![];
                match (&g.kind, group_runs) {
                    (_, false) => off.push(g.span.clone()),
                    (GroupKind::Choice { arms }, true) => off.extend(
                        arms.iter()
                            .enumerate()
                            .filter(|(k, _)| Some(*k) != arm)
                            .map(|(_, a)| a.span.clone()),
                    ),
                    (GroupKind::Parallel { .. }, true) => {}
                }
                for span in off {
                    for s in span.clone() {
                        if s < n && !seen.steps[s].sent {
                            seen.steps[s].status = StepStatus::Skipped;
                            route.skipped.push(s);
                        }
                    }
                    // The groups inside what does not run are decided with it.
                    for inner in w.groups.iter().skip(gi + 1) {
                        let inside = inner.span.start >= span.start
                            && inner.span.end <= span.end
                            && inner.depth > g.depth;
                        if inside && !seen.decisions.iter().any(|d| d.group == inner.name) {
                            let d = Decision {
                                group: inner.name.clone(),
                                arm: None,
                                otherwise: false,
                                skipped: true,
                                parallel: false,
                            };
                            seen.decisions.push(d.clone());
                            route.decisions.push(d);
                        }
                    }
                }
            }
            if j >= n {
                route.next = n;
                return Ok(route);
            }
            let fans_out = |g: &super::super::workflow::Group| {
                g.span.start == j
                    && matches!(g.kind, GroupKind::Parallel { .. })
                    && seen
                        .decisions
                        .iter()
                        .any(|d| d.group == g.name && !d.skipped)
            };
            if main_line && w.groups.iter().any(fans_out) {
                route.next = j;
                return Ok(route);
            }
            let step = &seen.steps[j];
            if step.sent {
                route.next = j;
                return Ok(route);
            }
            if step.status == StepStatus::Skipped {
                j += 1;
                continue;
            }
            if let Some(when) = &w.steps[j].when {
                match decide(when, context(w, self.task, &seen, j).as_ref()) {
                    Ok(true) => {}
                    Ok(false) => {
                        seen.steps[j].status = StepStatus::Skipped;
                        route.skipped.push(j);
                        j += 1;
                        continue;
                    }
                    Err(error) => {
                        return Err(RouteError {
                            step: j,
                            route,
                            error,
                        });
                    }
                }
            }
            route.next = j;
            return Ok(route);
        }
    }
}

/// The list forEach step `at` runs over, selected on `r` (its query, on the step's context).
pub fn elements(
    w: &Workflow,
    task: &Task,
    r: &StateRecord,
    at: usize,
) -> Result<Vec<serde_json::Value>, String> {
    let Some(each) = w.steps.get(at).and_then(|s| s.for_each.as_ref()) else {
        return Err("not a forEach step".into());
    };
    let ctx = context(w, task, r, at).ok_or("the task's input is not kept")?;
    match each.items.render(&ctx, MAX_RESULTS_BYTES) {
        Ok(serde_json::Value::Array(list)) if list.len() <= MAX_ELEMENTS => Ok(list),
        Ok(serde_json::Value::Array(list)) => Err(format!(
            "input_mapping_failed: forEach: the list has {} elements (at most {MAX_ELEMENTS})",
            list.len()
        )),
        Ok(other) => Err(format!(
            "input_mapping_failed: forEach: the query selects {}, not a list",
            kind_of(&other)
        )),
        Err(e) => Err(format!("input_mapping_failed: forEach: {e}")),
    }
}

/// The time wait step `at` waits until: what its `waitUntil` renders on `r`, an RFC 3339 time.
fn wait_until(
    w: &Workflow,
    task: &Task,
    r: &StateRecord,
    at: usize,
    until: &Mapping,
) -> Result<DateTime<Utc>, String> {
    let ctx = context(w, task, r, at).ok_or("the task's input is not kept")?;
    match until.render(&ctx, MAX_RESULTS_BYTES) {
        Ok(serde_json::Value::String(t)) => DateTime::parse_from_rfc3339(&t)
            .map(|t| t.with_timezone(&Utc))
            .map_err(|e| {
                format!("input_mapping_failed: waitUntil: {t:?} is not an RFC 3339 time ({e})")
            }),
        Ok(other) => Err(format!(
            "input_mapping_failed: waitUntil: the query selects {}, not an RFC 3339 time",
            kind_of(&other)
        )),
        Err(e) => Err(format!("input_mapping_failed: waitUntil: {e}")),
    }
}

fn kind_of(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "a list",
        serde_json::Value::Object(_) => "an object",
    }
}

/// Whether `when` holds on `ctx`, the context of the step it stands before (`None`: the task
/// no longer has the input that step runs with); the error is the step's `condition_failed`.
fn decide(when: &When, ctx: Option<&serde_json::Value>) -> Result<bool, String> {
    let ctx = ctx.ok_or_else(|| "condition_failed: the task's input is not kept".to_owned())?;
    when.holds(ctx).map_err(|e| e.to_string())
}

/// Applies what `route` decided to the record being written: the decisions, and the skipped
/// steps.
pub(super) fn take(n: &mut StateRecord, route: &Route) {
    n.decisions.extend(route.decisions.iter().cloned());
    for &s in &route.skipped {
        if let Some(step) = n.steps.get_mut(s) {
            step.status = StepStatus::Skipped;
        }
    }
}

/// A task of `r`'s workflow on `input`, for the tests' routers.
#[cfg(test)]
pub(super) fn test_task(r: &StateRecord, input: serde_json::Value) -> Task {
    Task {
        input_ref: None,
        id: r.task_id,
        workflow: r.workflow.clone(),
        workflow_version: r.workflow_version,
        input,
        input_revision: 0,
        earlier_inputs: vec![],
        reply_queue_url: None,
        created_at: r.created_at,
        caller: crate::domain::Caller::new("tests").expect("a caller"),
        keys: vec![],
    }
}

#[cfg(test)]
mod tests {
    use super::super::testkit::*;
    use super::test_task as task;
    use crate::domain::state::{Decision, NoticeKind, ProcessState, StepStatus};
    use serde_json::{Value, json};

    /// A loan: a credit check, a review by amount and score (a choice with results, its second
    /// case holding a choice of its own), a notice only on request, the payout.
    const LOAN: &str = r#"name: loan
steps:
  - name: credit-check
    service: credit-bureau
  - name: review
    choice:
      - when: input.amount > 10000
        steps:
          - {name: manual-review, service: core-banking}
        result: "$.steps['manual-review'].result.decision"
      - when: steps['credit-check'].result.score < 600
        steps:
          - name: second
            choice:
              - when: input.amount > 5000
                steps: [{name: committee, service: core-banking}]
            otherwise:
              steps: [{name: clerk, service: core-banking}]
        result: declined
    otherwise:
      result: approved
  - name: notify
    service: e-sign
    when: input.notify
  - name: payout
    service: core-banking
    input: {decision: "$.steps['review'].result"}
"#;

    fn loan() -> Workflow {
        let v =
            crate::domain::workflow::parse_value(LOAN, crate::domain::Format::Yaml).expect("yaml");
        Workflow::from_value(v, None, &base())
            .expect("valid")
            .with_version(1)
    }

    fn score(n: i64) -> StepOutcome {
        StepOutcome::Succeeded {
            result: Some(json!({"score": n}).to_string()),
        }
    }

    /// Runs a task of the loan on `input`, the credit check answering `credit`, every other
    /// step succeeding with `{"decision": "ok"}`: the record at its end, and the steps called.
    fn run(input: Value, credit: i64) -> (StateRecord, Vec<String>) {
        let w = loan();
        let p = w.policies();
        let now = t0();
        let mut r = record(&w, now);
        let task = task(&r, input);
        let router = TaskRouter {
            workflow: &w,
            task: &task,
        };
        let mut called = vec![];
        apply_with(&mut r, &p, |r| claim(r, "s", now, &p, &router));
        while r.process_state == ProcessState::Processing {
            let i = r.step_index;
            called.push(r.steps[i].name.clone());
            let answer = if i == 0 {
                score(credit)
            } else {
                StepOutcome::Succeeded {
                    result: Some(json!({"decision": "ok"}).to_string()),
                }
            };
            apply_with(&mut r, &p, |r| {
                apply_reply(r, r.attempt, i, false, &answer, now, &p, &router)
            });
        }
        (r, called)
    }

    fn decisions(r: &StateRecord) -> Vec<(&str, Option<usize>, bool)> {
        r.decisions
            .iter()
            .map(|d: &Decision| (d.group.as_str(), d.arm, d.skipped))
            .collect()
    }

    #[test]
    fn the_first_case_that_holds_runs_and_the_others_are_skipped() {
        let (r, called) = run(json!({"amount": 20000, "notify": false}), 700);
        assert_eq!(r.process_state, ProcessState::Processed, "{r:?}");
        assert_eq!(called, ["credit-check", "manual-review", "payout"]);
        assert_eq!(
            decisions(&r),
            [("review", Some(0), false), ("second", None, true)],
            "the choice inside a case not taken is decided with it"
        );
        let skipped: Vec<_> = r
            .steps
            .iter()
            .filter(|s| s.status == StepStatus::Skipped)
            .map(|s| s.name.as_str())
            .collect();
        assert_eq!(skipped, ["committee", "clerk", "notify"]);
        assert!(
            r.steps
                .iter()
                .all(|s| s.status != StepStatus::Skipped || !s.sent)
        );
        assert_eq!(r.owed(), [NoticeKind::Processed]);
    }

    #[test]
    fn each_step_names_its_place_among_the_groups() {
        let w = loan();
        let places: Vec<_> = (0..w.steps.len()).map(|i| w.place(i)).collect();
        assert_eq!(
            places,
            [
                None,
                Some("review › case 0".to_owned()),
                Some("review › case 1 › second › case 0".to_owned()),
                Some("review › case 1 › second › otherwise".to_owned()),
                None,
                None,
            ]
        );
    }

    #[test]
    fn otherwise_runs_when_no_case_holds_and_a_nested_choice_decides_in_turn() {
        let (r, called) = run(json!({"amount": 100, "notify": true}), 700);
        assert_eq!(called, ["credit-check", "notify", "payout"]);
        assert_eq!(
            decisions(&r),
            [("review", Some(2), false), ("second", None, true)]
        );
        let (r, called) = run(json!({"amount": 8000, "notify": false}), 500);
        assert_eq!(called, ["credit-check", "committee", "payout"]);
        assert_eq!(
            decisions(&r),
            [("review", Some(1), false), ("second", Some(0), false)]
        );
        let (_, called) = run(json!({"amount": 10, "notify": false}), 500);
        assert_eq!(called, ["credit-check", "clerk", "payout"]);
    }

    #[test]
    fn the_payout_reads_the_result_of_the_case_that_ran() {
        let w = loan();
        let (r, _) = run(json!({"amount": 100, "notify": false}), 700);
        let t = task(&r, json!({"amount": 100, "notify": false}));
        let ctx = crate::domain::context::context(&w, &t, &r, 5).expect("context");
        assert_eq!(ctx["steps"]["review"]["result"], json!("approved"));
        let body = w.steps[5].input.render(&ctx, 1024).expect("renders");
        assert_eq!(body, json!({"decision": "approved"}));
        let (r, _) = run(json!({"amount": 20000, "notify": false}), 700);
        let ctx = crate::domain::context::context(&w, &t, &r, 5).expect("context");
        assert_eq!(ctx["steps"]["review"]["result"], json!("ok"));
    }

    #[test]
    fn a_condition_that_cannot_be_decided_fails_its_step_and_undoes_what_ran() {
        // `notify` is missing from the input: its condition fails at run time.
        let (r, called) = run(json!({"amount": 100}), 700);
        assert_eq!(called, ["credit-check"]);
        assert_eq!(r.process_state, ProcessState::Compensated, "{r:?}");
        let notify = &r.steps[4];
        assert_eq!(
            (notify.name.as_str(), notify.status),
            ("notify", StepStatus::Failed)
        );
        let error = r.last_error.as_deref().unwrap_or_default();
        assert!(
            error.starts_with("notify: condition_failed: input.notify: "),
            "{error}"
        );
        assert_eq!(r.owed(), [NoticeKind::Failed, NoticeKind::Compensated]);
    }

    #[test]
    fn a_claim_routes_a_first_step_that_does_not_run_and_may_end_the_task() {
        let v = json!({"name": "w", "steps": [
            {"name": "a", "service": "s", "when": "input.go"},
            {"name": "b", "service": "s", "when": "input.go"}
        ]});
        let w = Workflow::from_value(v, None, &base()).expect("valid");
        let p = w.policies();
        let now = t0();
        let mut r = record(&w, now);
        let t = task(&r, json!({"go": false}));
        let router = TaskRouter {
            workflow: &w,
            task: &t,
        };
        let effects = apply_with(&mut r, &p, |r| claim(r, "s", now, &p, &router)).effects;
        assert_eq!(r.process_state, ProcessState::Processed);
        assert_eq!(effects, [Effect::DeliverNotice], "nothing is sent");
        assert!(r.steps.iter().all(|s| s.status == StepStatus::Skipped));
    }
}

#[cfg(test)]
mod operator_tests {
    use super::super::testkit::*;
    use super::test_task as task;
    use crate::domain::state::{ProcessState, StepStatus};
    use serde_json::json;

    /// A check, a notice only on request, a choice between two payouts.
    const W: &str = r#"name: w
steps:
  - {name: check, service: s}
  - {name: notify, service: s, when: input.notify}
  - name: payout
    choice:
      - when: input.amount > 100
        steps: [{name: big, service: s}]
    otherwise:
      steps: [{name: small, service: s}]
"#;

    fn w() -> Workflow {
        let v = crate::domain::workflow::parse_value(W, crate::domain::Format::Yaml).expect("yaml");
        Workflow::from_value(v, None, &base()).expect("valid")
    }

    fn statuses(r: &StateRecord) -> Vec<StepStatus> {
        r.steps.iter().map(|s| s.status).collect()
    }

    #[test]
    fn a_retry_on_a_mended_input_decides_the_condition_again() {
        let (w, now) = (w(), t0());
        let p = with(|p| p.auto_compensate = false);
        let mut r = record(&w, now);
        // `notify` is missing: the condition cannot be decided, the task stops in Error.
        let t = task(&r, json!({"amount": 5}));
        let router = TaskRouter {
            workflow: &w,
            task: &t,
        };
        apply_with(&mut r, &p, |r| claim(r, "s", now, &p, &router));
        apply_with(&mut r, &p, |r| {
            apply_reply(r, r.attempt, 0, false, &ok(), now, &p, &router)
        });
        assert_eq!(r.process_state, ProcessState::Error);
        assert_eq!((r.step_index, r.steps[1].status), (1, StepStatus::Failed));
        // The operator retries on a mended input: the claim decides again, and skips it.
        apply_with(&mut r, &p, |r| {
            retry_with_input(r, &ops(Some("notify given")), now, &p, 1)
        });
        let t = task(&r, json!({"amount": 5, "notify": false}));
        let router = TaskRouter {
            workflow: &w,
            task: &t,
        };
        apply_with(&mut r, &p, |r| claim(r, "s", now, &p, &router));
        assert_eq!(r.steps[r.step_index].name, "small", "{r:?}");
        assert_eq!(
            statuses(&r),
            [
                StepStatus::Done,
                StepStatus::Skipped,
                StepStatus::Skipped,
                StepStatus::Running
            ]
        );
        apply_with(&mut r, &p, |r| {
            apply_reply(r, r.attempt, 3, false, &ok(), now, &p, &router)
        });
        assert_eq!(r.process_state, ProcessState::Processed);
        assert_eq!(r.decisions.len(), 1);
    }

    #[test]
    fn a_skip_by_the_operator_leaves_the_way_on_to_the_claim() {
        let (w, now) = (w(), t0());
        let p = with(|p| p.auto_compensate = false);
        let mut r = record(&w, now);
        let t = task(&r, json!({"amount": 500, "notify": true}));
        let router = TaskRouter {
            workflow: &w,
            task: &t,
        };
        apply_with(&mut r, &p, |r| claim(r, "s", now, &p, &router));
        apply_with(&mut r, &p, |r| {
            apply_reply(r, r.attempt, 0, false, &ok(), now, &p, &router)
        });
        // The notice is refused for good; the operator skips it.
        apply_with(&mut r, &p, |r| {
            apply_reply(r, r.attempt, 1, false, &refused(), now, &p, &router)
        });
        assert_eq!(r.process_state, ProcessState::Error);
        apply_with(&mut r, &p, |r| {
            skip(r, &ops(Some("sent by hand")), now, &p, None)
        });
        assert_eq!((r.process_state, r.step_index), (ProcessState::Pending, 2));
        assert!(r.decisions.is_empty(), "the choice is not decided yet");
        apply_with(&mut r, &p, |r| claim(r, "s", now, &p, &router));
        assert_eq!(r.steps[r.step_index].name, "big");
        assert_eq!(r.decisions[0].arm, Some(0));
        assert_eq!(r.steps[3].status, StepStatus::Skipped);
    }
}
