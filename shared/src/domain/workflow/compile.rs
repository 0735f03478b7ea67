//! [`WorkflowDoc::validate`]: checks what the schema cannot say and compiles the [`Workflow`].
//!
//! An entry of `steps` is a step, a choice or parallel branches; groups nest (at most
//! [`MAX_DEPTH`] deep) and hold at most [`MAX_STEPS`] steps in all. The steps are numbered in
//! the order they are written, depth first: that is their index in the state record, and a
//! group covers a contiguous range of them ([`Group::span`]).
//!
//! What a mapping or a condition may read is what is *certainly* done before it: an earlier
//! step without a `when` in the same sequence or an enclosing one, the steps of an earlier
//! parallel group (every branch is done when the group is), and an earlier choice whose every
//! case (and `otherwise`) declares its `result`. A step that a condition may skip, or that runs
//! in one case of a choice, may only be tested (`has(steps.x)` in a condition); a step of a
//! sibling branch cannot be read at all.

use super::super::mapping::{self, Mapping, MappingScope};
use super::super::policy::{CallbackPolicy, Policy};
use super::super::problem::{DefinitionError, Problem};
use super::super::when::When;
use super::definition::{
    Arm, CHILD_SERVICE, CHILD_TIMEOUT_HOURS, CHILD_UNDO_ACTION, Child, ForEach, Group, GroupKind,
    Limits, MAX_BRANCHES, MAX_CASES, MAX_CONCURRENCY, MAX_DEPTH, MAX_STEPS, RUN_SERVICE,
    RUN_TIMEOUT_HOURS, RUN_UNDO_ACTION, RunDef, Step, Tolerated, Undo, Wait, Workflow,
};
use super::doc::{StepDoc, WorkflowDoc};
use super::schema::compile_input;
use super::settings::{self, CallbackDoc, apply_settings, callback_policy};
use crate::domain::run::{MAX_CHUNK, MAX_RUN_CONCURRENCY};
use serde_json::Value;
use std::collections::BTreeSet;
use std::sync::Arc;

impl WorkflowDoc {
    /// Checks what the schema cannot and compiles the workflow: `services` says which service
    /// names exist (`None`: do not check), `policy` is the deployment's default policy.
    pub fn validate(
        self,
        services: Option<&BTreeSet<String>>,
        policy: &Policy,
    ) -> Result<Workflow, DefinitionError> {
        self.validate_with(services, policy, Limits::Publish)
    }

    pub(super) fn validate_with(
        self,
        services: Option<&BTreeSet<String>>,
        policy: &Policy,
        limits: Limits,
    ) -> Result<Workflow, DefinitionError> {
        self.compile(services, policy, limits)
    }

    fn compile(
        self,
        services: Option<&BTreeSet<String>>,
        policy: &Policy,
        limits: Limits,
    ) -> Result<Workflow, DefinitionError> {
        let mut problems = vec![];
        let input_schema = match &self.input {
            None => serde_json::json!({"type": "object"}),
            Some(s) => s.clone(),
        };
        let input_validator =
            compile_input(&input_schema, limits == Limits::Publish, &mut problems);
        let deadline = self.deadline.as_ref().and_then(|raw| {
            settings::long_duration("/deadline", raw, "a task's deadline", &mut problems)
        });
        let mut base = policy.clone();
        if let Some(d) = &self.defaults {
            apply_settings(
                &mut base,
                "/defaults",
                (d.timeout.as_ref(), d.start_within.as_ref()),
                d.retry.as_ref(),
                &mut problems,
            );
        }
        let mut c = Compiler {
            services,
            base,
            limits,
            problems,
            declared: vec![],
            steps: vec![],
            groups: vec![],
            pivot: None,
            input_schema: &input_schema,
            in_parallel: 0,
        };
        let end = c.sequence(&self.steps, "/steps", &Reach::default(), None, 0);
        // What the task answers: read when it ends Processed, so every step it may have run is
        // readable as at its end.
        let output = self.output.clone().map(|o| {
            let m = Mapping::compile(o, &end.scope(None, false), "/output", &mut c.problems);
            c.too_many(&m, "/output".into());
            m
        });
        let keys = crate::domain::keys::KeyDefs::compile(self.keys.as_ref(), &mut c.problems);
        let concurrency = self
            .concurrency
            .as_ref()
            .and_then(|k| crate::domain::keys::KeyLimit::compile(&k.key, k.limit, &mut c.problems));
        if c.steps.len() > MAX_STEPS {
            c.problem(
                "/steps",
                format!(
                    "at most {MAX_STEPS} steps in all, groups included ({})",
                    c.steps.len()
                ),
            );
        }
        let Compiler {
            problems,
            steps,
            groups,
            pivot,
            ..
        } = c;
        match input_validator {
            Some(v) if problems.is_empty() => Ok(Workflow {
                name: self.name.clone(),
                version: 0,
                description: self.description.clone(),
                input_schema: Arc::new(v),
                steps,
                groups,
                pivot,
                deadline,
                output,
                keys,
                concurrency,
                doc: self,
                element_views: Vec::new(),
            }
            .with_element_views()),
            _ => Err(DefinitionError(problems)),
        }
    }
}

/// What is readable at a point of the definition (see the module's comment).
#[derive(Debug, Clone, Default)]
struct Reach {
    /// Certainly done before this point.
    certain: Vec<String>,
    /// May be done (a condition may skip them, another case may have run): testable only.
    maybe: Vec<(String, String)>,
    /// Not readable here at all (a sibling branch, a parallel group's name).
    elsewhere: Vec<(String, String)>,
}

impl Reach {
    fn scope<'a>(&'a self, own: Option<&'a str>, element: bool) -> MappingScope<'a> {
        MappingScope {
            steps: &self.certain,
            own,
            maybe: &self.maybe,
            elsewhere: &self.elsewhere,
            element,
        }
    }

    /// What a sequence that started from `from` made certain or possible becomes possible
    /// only (`why`).
    fn demote(&mut self, inside: Reach, from: &Reach, why: &str) {
        for name in inside.certain.into_iter().skip(from.certain.len()) {
            self.maybe.push((name, why.to_owned()));
        }
        self.maybe
            .extend(inside.maybe.into_iter().skip(from.maybe.len()));
    }
}

/// Where a sequence stands: inside which arm of which group.
type Parent = Option<(usize, usize)>;

struct Compiler<'a> {
    services: Option<&'a BTreeSet<String>>,
    base: Policy,
    limits: Limits,
    problems: Vec<Problem>,
    /// Every step and group name so far, with its pointer.
    declared: Vec<(String, String)>,
    steps: Vec<Step>,
    groups: Vec<Group>,
    pivot: Option<usize>,
    input_schema: &'a Value,
    /// How many parallel groups the entry being compiled stands in (at most one runs).
    in_parallel: usize,
}

impl Compiler<'_> {
    fn problem(&mut self, at: impl Into<String>, message: impl Into<String>) {
        self.problems.push(Problem {
            at: at.into(),
            message: message.into(),
        });
    }

    fn declare(&mut self, name: &str, at: &str) {
        if let Some((_, first)) = self.declared.iter().find(|(n, _)| n == name) {
            let first = first.clone();
            self.problem(
                format!("{at}/name"),
                format!(
                    "{name:?} is declared twice (first at {first}): step and group names are unique"
                ),
            );
        }
        self.declared.push((name.to_owned(), at.to_owned()));
    }

    /// Compiles the entries of one sequence (the workflow's, a case's, a branch's) given what
    /// is readable before it; returns what is readable after it.
    fn sequence(
        &mut self,
        entries: &[StepDoc],
        at: &str,
        before: &Reach,
        parent: Parent,
        depth: usize,
    ) -> Reach {
        let mut reach = before.clone();
        for (i, e) in entries.iter().enumerate() {
            let here = format!("{at}/{i}");
            self.declare(&e.name, &here);
            let when = e.when.as_ref().and_then(|w| {
                When::compile(
                    w,
                    &reach.scope(None, false),
                    &format!("{here}/when"),
                    &mut self.problems,
                )
            });
            let waits = e.wait.is_some() || e.wait_until.is_some() || e.wait_for.is_some();
            let kinds = [
                e.service.is_some() || e.workflow.is_some(),
                waits,
                e.choice.is_some(),
                e.parallel.is_some(),
            ];
            if kinds.iter().filter(|k| **k).count() != 1 {
                self.problem(
                    here.clone(),
                    format!(
                        "entry {:?} must be exactly one of: a step (`service`), a sub-workflow (`workflow`), a wait (`wait` or `waitUntil`), a choice (`choice`) or parallel branches (`parallel`)",
                        e.name
                    ),
                );
                continue;
            }
            if e.service.is_none() && e.workflow.is_none() {
                self.not_on_a_group(e, &here, if waits { "a wait" } else { "a group" });
            }
            if waits {
                self.pivot_at(e, &here, depth);
                self.wait(e, &here, when, &mut reach, parent);
                continue;
            }
            if e.otherwise.is_some() && e.choice.is_none() {
                self.problem(format!("{here}/otherwise"), "only a choice has `otherwise`");
            }
            if e.workflow_version.is_some() && e.workflow.is_none() {
                self.problem(
                    format!("{here}/workflowVersion"),
                    "`workflowVersion` belongs to a sub-workflow step (`workflow`)",
                );
            }
            if e.service.is_some() && e.workflow.is_some() {
                self.problem(
                    format!("{here}/workflow"),
                    format!(
                        "entry {:?} names both a service and a workflow: a sub-workflow step calls no service of its own",
                        e.name
                    ),
                );
            } else if let Some(service) = &e.service {
                self.step(e, service, &here, when, &mut reach, parent, depth);
            } else if let Some(workflow) = &e.workflow {
                self.child_step(e, workflow, &here, when, &mut reach, parent, depth);
            } else if depth >= MAX_DEPTH {
                self.problem(
                    here.clone(),
                    format!("groups nest at most {MAX_DEPTH} deep"),
                );
            } else if let Some(cases) = &e.choice {
                self.choice(e, cases, &here, when, &mut reach, parent, depth);
            } else if let Some(branches) = &e.parallel {
                self.parallel(e, branches, &here, when, &mut reach, parent, depth);
            }
        }
        reach
    }

    /// Declares group `e` (its index, and the first step it will cover), before its arms are
    /// compiled: the steps inside name it as their parent.
    fn open_group(
        &mut self,
        e: &StepDoc,
        when: Option<When>,
        parent: Parent,
        depth: usize,
    ) -> (usize, usize) {
        let (index, start) = (self.groups.len(), self.steps.len());
        self.groups.push(Group {
            name: e.name.clone(),
            when,
            span: start..start,
            kind: GroupKind::Choice { arms: vec![] },
            parent,
            depth,
        });
        (index, start)
    }

    /// Completes group `index` once its arms are compiled: the steps it covers, and its kind.
    fn close_group(&mut self, index: usize, span: std::ops::Range<usize>, kind: GroupKind) {
        if let Some(g) = self.groups.get_mut(index) {
            g.span = span;
            g.kind = kind;
        }
    }

    /// A wait step (`wait` or `waitUntil`, not both): it calls no service; its result is the
    /// time it waited until.
    fn wait(
        &mut self,
        e: &StepDoc,
        here: &str,
        when: Option<When>,
        reach: &mut Reach,
        parent: Parent,
    ) {
        let kinds = [
            e.wait.is_some(),
            e.wait_until.is_some(),
            e.wait_for.is_some(),
        ];
        if kinds.iter().filter(|k| **k).count() > 1 {
            self.problem(
                here.to_owned(),
                "a wait step has one of `wait` (how long), `waitUntil` (until when) and `waitFor` (an event)",
            );
            return;
        }
        let for_event = ["within", "payload"];
        for (field, set) in for_event
            .iter()
            .zip([e.within.is_some(), e.payload.is_some()])
        {
            if set && e.wait_for.is_none() {
                self.problem(
                    format!("{here}/{field}"),
                    format!("`{field}` belongs to a wait for an event (`waitFor`)"),
                );
            }
        }
        if let Some(names) = &e.wait_for {
            let names: Vec<String> = match names {
                Value::String(n) => vec![n.clone()],
                Value::Array(a) => a
                    .iter()
                    .filter_map(|n| n.as_str().map(str::to_owned))
                    .collect(),
                _ => vec![],
            };
            let within = match &e.within {
                Some(raw) => settings::long_duration(
                    &format!("{here}/within"),
                    raw,
                    "a wait",
                    &mut self.problems,
                ),
                None => {
                    self.problem(
                        format!("{here}/within"),
                        "a wait for an event says how long it waits at most (`within`, e.g. 30d)",
                    );
                    None
                }
            };
            let payload = e.payload.as_ref().and_then(|schema| {
                let mut found = vec![];
                let v = compile_input(schema, self.limits == Limits::Publish, &mut found);
                self.problems.extend(found.into_iter().map(|p| Problem {
                    at: p.at.replacen("/input", &format!("{here}/payload"), 1),
                    message: p.message.replace("input schema", "payload schema"),
                }));
                v.map(Arc::new)
            });
            let wait = within.map(|within| Wait::Event {
                names,
                within,
                payload,
            });
            let mut policy = self.base.clone();
            policy.wait = true;
            policy.event = true;
            self.push_wait(e, here, when, reach, parent, wait, policy);
            return;
        }
        let wait = match (&e.wait, &e.wait_until) {
            (Some(_), Some(_)) => return,
            (Some(raw), None) => {
                settings::long_duration(&format!("{here}/wait"), raw, "a wait", &mut self.problems)
                    .map(Wait::For)
            }
            (None, Some(until)) => {
                let at = format!("{here}/waitUntil");
                if !until.starts_with('$') && chrono::DateTime::parse_from_rfc3339(until).is_err() {
                    self.problem(
                        at.clone(),
                        format!("{until:?} is neither an RFC 3339 time nor a query (`$...`)"),
                    );
                }
                Some(Wait::Until(Mapping::compile(
                    Value::String(until.clone()),
                    &reach.scope(None, false),
                    &at,
                    &mut self.problems,
                )))
            }
            (None, None) => None,
        };
        let mut policy = self.base.clone();
        policy.wait = true;
        self.push_wait(e, here, when, reach, parent, wait, policy);
    }

    /// Pushes wait step `e` (its `wait`, and the `policy` that says it is one).
    #[allow(clippy::too_many_arguments)]
    fn push_wait(
        &mut self,
        e: &StepDoc,
        here: &str,
        when: Option<When>,
        reach: &mut Reach,
        parent: Parent,
        wait: Option<Wait>,
        policy: Policy,
    ) {
        self.steps.push(Step {
            name: e.name.clone(),
            service: String::new(),
            action: String::new(),
            input: Mapping::compile(Value::Null, &reach.scope(None, false), here, &mut vec![]),
            undo: None,
            policy,
            when: when.clone(),
            for_each: None,
            wait,
            parent,
            child: None,
            run: None,
        });
        if e.when.is_some() {
            reach.maybe.push((
                e.name.clone(),
                "which may be skipped (its `when` may not hold): test it with has(steps.<name>) in a condition".into(),
            ));
        } else {
            reach.certain.push(e.name.clone());
        }
    }

    /// Makes `s` (about to be the next step) the pivot, if it asks to be and may: a step or a
    /// wait of the workflow's own sequence, that always runs, one call, the only one.
    fn pivot_at(&mut self, s: &StepDoc, at: &str, depth: usize) {
        if !s.pivot {
            return;
        }
        let index = self.steps.len();
        let why = if depth > 0 {
            Some("the pivot is a step of the workflow's own sequence, not of a group")
        } else if s.when.is_some() {
            Some("the pivot always runs: it cannot have a `when`")
        } else if s.for_each.is_some() {
            Some("the pivot is one call: it cannot be a forEach step")
        } else {
            None
        };
        match (why, self.pivot) {
            (Some(why), _) => self.problem(format!("{at}/pivot"), why),
            (None, Some(first)) => self.problem(
                format!("{at}/pivot"),
                format!("step {first} is already the pivot: a workflow has at most one"),
            ),
            (None, None) => self.pivot = Some(index),
        }
    }

    /// A group's (or a wait's: `what`) entry holds none of a step's fields.
    fn not_on_a_group(&mut self, e: &StepDoc, here: &str, what: &str) {
        let step_only = [
            ("action", e.action.is_some()),
            ("input", e.input.is_some()),
            ("undo", e.undo.is_some()),
            // A wait may be the pivot (once the event came, or the time passed: only forward).
            ("pivot", e.pivot && what != "a wait"),
            ("timeout", e.timeout.is_some()),
            ("startWithin", e.start_within.is_some()),
            ("retry", e.retry.is_some()),
            ("callback", e.callback.is_some()),
            ("forEach", e.for_each.is_some()),
            ("maxConcurrency", e.max_concurrency.is_some()),
            ("toleratedRefusals", e.tolerated_refusals.is_some()),
            ("distributed", e.distributed),
            ("chunk", e.chunk.is_some()),
        ];
        for (field, set) in step_only {
            if set {
                self.problem(
                    format!("{here}/{field}"),
                    format!("`{field}` belongs to a step that calls a service, not to {what}"),
                );
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn step(
        &mut self,
        s: &StepDoc,
        service: &str,
        at: &str,
        when: Option<When>,
        reach: &mut Reach,
        parent: Parent,
        depth: usize,
    ) {
        if let Some(known) = self.services
            && !known.contains(service)
        {
            self.problem(
                format!("{at}/service"),
                format!(
                    "unknown service {service:?} (known: {})",
                    known.iter().cloned().collect::<Vec<_>>().join(", ")
                ),
            );
        }
        if s.pivot {
            self.pivot_at(s, at, depth);
        } else if let (Some(p), Some(_)) = (self.pivot, &s.undo) {
            self.problem(
                format!("{at}/undo"),
                format!(
                    "step {:?} comes after the pivot (step {p}) and is never undone: remove its undo",
                    s.name
                ),
            );
        }
        let element = s.for_each.is_some();
        if s.distributed && !element {
            self.problem(
                format!("{at}/distributed"),
                "`distributed` belongs to a forEach step",
            );
        }
        let chunk = s.chunk.unwrap_or(1);
        if s.chunk.is_some() && !(s.distributed && element) {
            self.problem(
                format!("{at}/chunk"),
                "`chunk` belongs to a distributed forEach (`distributed: true`)",
            );
        } else if !(1..=MAX_CHUNK).contains(&chunk) {
            self.problem(
                format!("{at}/chunk"),
                format!("chunk is 1 to {MAX_CHUNK} elements a record"),
            );
        }
        let for_each = s.for_each.as_ref().map(|q| self.for_each(s, q, at, reach));
        let input = Mapping::compile(
            s.input.clone().unwrap_or_else(|| {
                Value::String(if element { "$.element" } else { "$.input" }.into())
            }),
            &reach.scope(None, element),
            &format!("{at}/input"),
            &mut self.problems,
        );
        let undo = s.undo.as_ref().map(|u| Undo {
            action: u.action.clone(),
            input: Mapping::compile(
                u.input
                    .clone()
                    .unwrap_or_else(|| Value::String(format!("$.steps['{}'].result", s.name))),
                &reach.scope(Some(&s.name), element),
                &format!("{at}/undo/input"),
                &mut self.problems,
            ),
        });
        self.too_many(&input, format!("{at}/input"));
        if let Some(u) = &undo {
            self.too_many(&u.input, format!("{at}/undo/input"));
        }
        let mut policy = self.base.clone();
        apply_settings(
            &mut policy,
            at,
            (s.timeout.as_ref(), s.start_within.as_ref()),
            s.retry.as_ref(),
            &mut self.problems,
        );
        if let Some(cb) = &s.callback {
            policy.callback = callback_policy(&format!("{at}/callback"), cb, &mut self.problems);
        }
        let step = Step {
            name: s.name.clone(),
            service: service.to_owned(),
            action: s.action.clone().unwrap_or_else(|| s.name.clone()),
            input,
            undo,
            policy,
            when: when.clone(),
            for_each,
            wait: None,
            parent,
            child: None,
            run: None,
        };
        let step = if s.distributed {
            self.distributed(step, chunk, at)
        } else {
            step
        };
        self.steps.push(step);
        if s.when.is_some() {
            reach.maybe.push((
                s.name.clone(),
                "which may be skipped (its `when` may not hold): test it with has(steps.<name>) in a condition, or read it through a choice's result".into(),
            ));
        } else {
            reach.certain.push(s.name.clone());
        }
    }

    /// A sub-workflow step: a callback step on [`CHILD_SERVICE`] whose call starts a task of
    /// `workflow` (a child of this one) and whose callback is that task's end. Its `timeout` is
    /// how long it waits for the child (the callback's, 1s to 30d; [`CHILD_TIMEOUT_HOURS`] if
    /// unset). Whether the workflow exists, and what it nests, the catalog checks when this
    /// one is published.
    #[allow(clippy::too_many_arguments)]
    fn child_step(
        &mut self,
        s: &StepDoc,
        workflow: &str,
        at: &str,
        when: Option<When>,
        reach: &mut Reach,
        parent: Parent,
        depth: usize,
    ) {
        let not_here = [
            (
                "action",
                s.action.is_some(),
                "its action is to start the workflow",
            ),
            (
                "undo",
                s.undo.is_some(),
                "a child is undone by its own steps' undos",
            ),
            (
                "callback",
                s.callback.is_some(),
                "its callback is the child's end: set `timeout`",
            ),
            (
                "forEach",
                s.for_each.is_some(),
                "a forEach over a sub-workflow is not supported",
            ),
            (
                "maxConcurrency",
                s.max_concurrency.is_some(),
                "it belongs to a forEach",
            ),
            (
                "toleratedRefusals",
                s.tolerated_refusals.is_some(),
                "it belongs to a forEach",
            ),
            ("distributed", s.distributed, "it belongs to a forEach"),
            (
                "chunk",
                s.chunk.is_some(),
                "it belongs to a distributed forEach",
            ),
        ];
        for (field, set, why) in not_here {
            if set {
                self.problem(
                    format!("{at}/{field}"),
                    format!("a sub-workflow step has no `{field}`: {why}"),
                );
            }
        }
        // Before the pivot, the step is undone as a unit (its child's own undos); after it,
        // nothing is undone.
        let undoable = !s.pivot && self.pivot.is_none();
        if s.pivot {
            self.pivot_at(s, at, depth);
        }
        let input = Mapping::compile(
            s.input
                .clone()
                .unwrap_or_else(|| Value::String("$.input".into())),
            &reach.scope(None, false),
            &format!("{at}/input"),
            &mut self.problems,
        );
        self.too_many(&input, format!("{at}/input"));
        let mut policy = self.base.clone();
        apply_settings(
            &mut policy,
            at,
            (None, s.start_within.as_ref()),
            s.retry.as_ref(),
            &mut self.problems,
        );
        policy.callback = match &s.timeout {
            None => Some(CallbackPolicy {
                timeout: chrono::Duration::hours(CHILD_TIMEOUT_HOURS),
                heartbeat: None,
            }),
            Some(raw) => callback_policy(
                at,
                &CallbackDoc {
                    timeout: raw.clone(),
                    heartbeat: None,
                },
                &mut self.problems,
            ),
        };
        // Its undo is the child's compensation: as long as the child may take.
        policy.undo_timeout = policy.callback.map(|c| c.timeout);
        self.steps.push(Step {
            name: s.name.clone(),
            service: CHILD_SERVICE.to_owned(),
            action: workflow.to_owned(),
            input,
            undo: undoable.then(|| Undo {
                action: CHILD_UNDO_ACTION.to_owned(),
                input: Mapping::compile(
                    Value::Null,
                    &reach.scope(None, false),
                    &format!("{at}/undo/input"),
                    &mut self.problems,
                ),
            }),
            policy,
            when: when.clone(),
            for_each: None,
            wait: None,
            parent,
            child: Some(Child {
                workflow: workflow.to_owned(),
                version: s.workflow_version,
            }),
            run: None,
        });
        if s.when.is_some() {
            reach.maybe.push((
                s.name.clone(),
                "which may be skipped (its `when` may not hold): test it with has(steps.<name>) in a condition, or read it through a choice's result".into(),
            ));
        } else {
            reach.certain.push(s.name.clone());
        }
    }

    fn too_many(&mut self, m: &Mapping, at: String) {
        if self.limits == Limits::Publish && m.queries() > mapping::MAX_QUERIES {
            self.problem(
                at,
                format!(
                    "{} queries: a mapping holds at most {}",
                    m.queries(),
                    mapping::MAX_QUERIES
                ),
            );
        }
    }

    /// A distributed forEach step (`step`, compiled as an ordinary forEach step): a callback
    /// step on [`RUN_SERVICE`] whose body is the list (or its S3 location) and whose callback
    /// is its run's end; `step` itself, less its forEach, is what each element runs. Not in a
    /// parallel group's branch: a branch's elements join its group's fan-out, in the record.
    fn distributed(&mut self, mut step: Step, chunk: u32, at: &str) -> Step {
        if self.in_parallel > 0 {
            self.problem(
                format!("{at}/distributed"),
                "a distributed forEach cannot be in a parallel group's branch (its elements would join the group's fan-out, in the task's record): put it before or after the group",
            );
        }
        let Some(each) = step.for_each.take() else {
            return step;
        };
        let mut policy = step.policy.clone();
        policy.callback = Some(CallbackPolicy {
            timeout: chrono::Duration::hours(RUN_TIMEOUT_HOURS),
            heartbeat: None,
        });
        // Its undo is the run's: every element's undo, each waiting its own step's deadline.
        policy.undo_timeout = policy.callback.map(|c| c.timeout);
        let undo = step.undo.as_ref().map(|_| Undo {
            action: RUN_UNDO_ACTION.to_owned(),
            input: Mapping::Literal(Value::Null),
        });
        let mut element = step.clone();
        element.parent = None;
        element.when = None;
        Step {
            service: RUN_SERVICE.to_owned(),
            action: step.name.clone(),
            input: each.items,
            undo,
            policy,
            run: Some(RunDef {
                max_concurrency: each.max_concurrency,
                tolerated: each.tolerated,
                chunk,
                element: Box::new(element),
            }),
            ..step
        }
    }

    /// A forEach step's list, concurrency and tolerance.
    fn for_each(&mut self, s: &StepDoc, query: &str, at: &str, reach: &Reach) -> ForEach {
        let here = format!("{at}/forEach");
        if s.callback.is_some() {
            self.problem(
                format!("{at}/callback"),
                "a forEach step cannot be a callback step: its elements' callbacks would share one address",
            );
        }
        let before = self.problems.len();
        let items = Mapping::compile(
            Value::String(query.to_owned()),
            &reach.scope(None, false),
            &here,
            &mut self.problems,
        );
        if self.problems.len() == before {
            match &items {
                Mapping::Query { source, .. } => {
                    if let Some(why) = not_an_array(source, self.input_schema, s.distributed) {
                        self.problem(here.clone(), format!("{source:?} {why}: forEach runs over an array"));
                    }
                }
                _ if s.distributed && query.starts_with("s3://") => {
                    if let Err(why) = crate::domain::run::ObjectLocation::parse(query) {
                        self.problem(here.clone(), why);
                    }
                }
                _ => self.problem(
                    here.clone(),
                    format!("{query:?} is not a query: forEach takes a JSONPath to an array, as in $.input.items"),
                ),
            }
        }
        let max_concurrency = s.max_concurrency.unwrap_or(DEFAULT_CONCURRENCY);
        let most = if s.distributed {
            MAX_RUN_CONCURRENCY
        } else {
            MAX_CONCURRENCY
        };
        if !(1..=most).contains(&max_concurrency) {
            self.problem(
                format!("{at}/maxConcurrency"),
                if s.distributed {
                    format!("maxConcurrency is 1 to {most} for a distributed forEach")
                } else {
                    format!("maxConcurrency is 1 to {most} (up to {MAX_RUN_CONCURRENCY} with `distributed`)")
                },
            );
        }
        let tolerated = match &s.tolerated_refusals {
            None => Tolerated::Count(0),
            Some(v) => tolerated(v).unwrap_or_else(|why| {
                self.problem(format!("{at}/toleratedRefusals"), why);
                Tolerated::Count(0)
            }),
        };
        ForEach {
            items,
            max_concurrency,
            tolerated,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn choice(
        &mut self,
        e: &StepDoc,
        cases: &[super::doc::CaseDoc],
        at: &str,
        when: Option<When>,
        reach: &mut Reach,
        parent: Parent,
        depth: usize,
    ) {
        if cases.is_empty() || cases.len() > MAX_CASES {
            self.problem(
                format!("{at}/choice"),
                format!("a choice has 1 to {MAX_CASES} cases"),
            );
        }
        let (index, start) = self.open_group(e, when, parent, depth);
        let mut arms = vec![];
        let mut after = reach.clone();
        let arm_docs = cases
            .iter()
            .map(|c| (Some(&c.when), &c.steps, &c.result))
            .chain(e.otherwise.iter().map(|o| (None, &o.steps, &o.result)));
        for (k, (case_when, steps, result)) in arm_docs.enumerate() {
            let here = if case_when.is_some() {
                format!("{at}/choice/{k}")
            } else {
                format!("{at}/otherwise")
            };
            let when = case_when.and_then(|w| {
                When::compile(
                    w,
                    &reach.scope(None, false),
                    &format!("{here}/when"),
                    &mut self.problems,
                )
            });
            let from = self.steps.len();
            let inside = self.sequence(
                steps,
                &format!("{here}/steps"),
                reach,
                Some((index, k)),
                depth + 1,
            );
            let result = result.as_ref().map(|r| {
                Mapping::compile(
                    r.clone(),
                    &inside.scope(None, false),
                    &format!("{here}/result"),
                    &mut self.problems,
                )
            });
            let why = format!(
                "which runs only in {} of choice {:?}: read the choice's result, as in $.steps['{}'].result",
                if case_when.is_some() {
                    format!("case {k}")
                } else {
                    "`otherwise`".into()
                },
                e.name,
                e.name
            );
            after.demote(inside, reach, &why);
            arms.push(Arm {
                name: None,
                when,
                span: from..self.steps.len(),
                result,
            });
        }
        let every_result = e.otherwise.is_some() && arms.iter().all(|a| a.result.is_some());
        if every_result && e.when.is_none() {
            after.certain.push(e.name.clone());
        } else {
            after.maybe.push((
                e.name.clone(),
                format!(
                    "whose result is known only if every case and `otherwise` declare one{}",
                    if e.when.is_some() {
                        " and the choice has no `when`"
                    } else {
                        ""
                    }
                ),
            ));
        }
        let end = self.steps.len();
        if start == end {
            // Its decision is kept on the step it stands before: it needs one.
            self.problem(
                format!("{at}/choice"),
                "a choice runs at least one step in one of its cases or `otherwise`",
            );
        }
        self.close_group(index, start..end, GroupKind::Choice { arms });
        *reach = after;
    }

    #[allow(clippy::too_many_arguments)]
    fn parallel(
        &mut self,
        e: &StepDoc,
        branches: &[super::doc::BranchDoc],
        at: &str,
        when: Option<When>,
        reach: &mut Reach,
        parent: Parent,
        depth: usize,
    ) {
        if !(2..=MAX_BRANCHES).contains(&branches.len()) {
            self.problem(
                format!("{at}/parallel"),
                format!("parallel groups have 2 to {MAX_BRANCHES} branches"),
            );
        }
        if self.in_parallel > 0 {
            self.problem(
                format!("{at}/parallel"),
                "a parallel group cannot stand in a branch of another: give the outer group more branches",
            );
        }
        self.in_parallel += 1;
        let (index, start) = self.open_group(e, when, parent, depth);
        let names: Vec<Vec<String>> = branches.iter().map(|b| names_in(&b.steps)).collect();
        let mut after = reach.clone();
        let mut arms = vec![];
        for (k, b) in branches.iter().enumerate() {
            let here = format!("{at}/parallel/{k}");
            let mut inner = reach.clone();
            for (other, list) in names.iter().enumerate().filter(|(o, _)| *o != k) {
                for n in list {
                    inner.elsewhere.push((
                        n.clone(),
                        format!(
                            "which is in branch {other} of {:?}: a branch cannot read a sibling's",
                            e.name
                        ),
                    ));
                }
            }
            let from = self.steps.len();
            let inside = self.sequence(
                &b.steps,
                &format!("{here}/steps"),
                &inner,
                Some((index, k)),
                depth + 1,
            );
            if e.when.is_some() {
                after.demote(
                    inside,
                    reach,
                    &format!("which runs only if the `when` of {:?} holds", e.name),
                );
            } else {
                after
                    .certain
                    .extend(inside.certain.into_iter().skip(reach.certain.len()));
                after
                    .maybe
                    .extend(inside.maybe.into_iter().skip(reach.maybe.len()));
            }
            arms.push(Arm {
                name: Some(b.name.clone().unwrap_or_else(|| format!("branch-{k}"))),
                when: None,
                span: from..self.steps.len(),
                result: None,
            });
        }
        after.elsewhere.push((
            e.name.clone(),
            "a parallel group, which has no result of its own: read its steps by name".into(),
        ));
        let end = self.steps.len();
        self.close_group(index, start..end, GroupKind::Parallel { arms });
        self.in_parallel -= 1;
        *reach = after;
    }
}

/// How many elements of a forEach step are out at once unless it says.
pub const DEFAULT_CONCURRENCY: u32 = 10;

/// Every step and group name in `entries`, nested ones included.
fn names_in(entries: &[StepDoc]) -> Vec<String> {
    let mut out = vec![];
    for e in entries {
        out.push(e.name.clone());
        for (_, steps) in e.sequences() {
            out.extend(names_in(steps));
        }
    }
    out
}

/// `toleratedRefusals` as written: a count, or a share `"10%"`.
fn tolerated(v: &Value) -> Result<Tolerated, String> {
    let bad = || format!("{v} is not a count or a share (as in 2 or \"10%\")");
    match v {
        Value::Number(n) => n
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(Tolerated::Count)
            .ok_or_else(bad),
        Value::String(s) => s
            .strip_suffix('%')
            .and_then(|p| p.trim().parse::<u32>().ok())
            .filter(|p| *p <= 100)
            .map(Tolerated::Percent)
            .ok_or_else(bad),
        _ => Err(bad()),
    }
}

/// Why the query `source` cannot select an array, if that is certain from the definition: a
/// task's metadata, the element's index, or a place the input schema types as something else.
fn not_an_array(source: &str, input_schema: &Value, or_a_location: bool) -> Option<String> {
    let query = jsonpath_rust::parser::parse_json_path(source).ok()?;
    let path = mapping::singular_path(&query)?;
    match path.first() {
        Some(Some("task")) => return Some("selects the task's metadata".into()),
        Some(Some("index")) => return Some("selects the element's index".into()),
        Some(Some("input")) => {}
        _ => return None,
    }
    let mut schema = input_schema;
    for segment in &path[1..] {
        schema = match segment {
            Some(name) => schema.get("properties")?.get(*name)?,
            None => schema.get("items")?,
        };
    }
    match schema.get("type")? {
        // A distributed forEach also reads its list from an S3 location (`s3://...`).
        Value::String(t) if or_a_location && t == "string" => None,
        Value::String(t) if t != "array" => Some(format!("is typed {t:?} by the input schema")),
        Value::Array(ts) if !ts.iter().any(|t| t == "array") => {
            Some("is not typed as an array by the input schema".into())
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::super::testkit::*;
    use super::Wait;

    /// A loan: a credit check, a review only above 10,000 (a choice with results), a conditional
    /// notice, and the payout.
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
          - {name: second-look, service: core-banking}
        result: declined
    otherwise:
      result: approved
  - name: notify
    service: e-sign
    when: has(steps.review) && input.notify
  - name: payout
    service: core-banking
    input: {decision: "$.steps['review'].result", score: "$.steps['credit-check'].result.score"}
"#;

    #[test]
    fn a_choice_with_results_and_a_condition_compile_into_spans() {
        let w = workflow(LOAN).expect("valid");
        let names: Vec<_> = w.steps.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "credit-check",
                "manual-review",
                "second-look",
                "notify",
                "payout"
            ]
        );
        assert_eq!(w.groups.len(), 1);
        let g = &w.groups[0];
        assert_eq!((g.name.as_str(), g.span.clone()), ("review", 1..3));
        let arms = g.kind.arms();
        let spans: Vec<_> = arms.iter().map(|a| a.span.clone()).collect();
        assert_eq!(
            spans,
            [1..2, 2..3, 3..3],
            "two cases and an empty otherwise"
        );
        assert!(arms[2].when.is_none() && arms.iter().all(|a| a.result.is_some()));
        assert_eq!(w.steps[1].parent, Some((0, 0)));
        assert_eq!(
            w.steps[3].when.as_ref().map(|c| c.source()),
            Some("has(steps.review) && input.notify")
        );
    }

    #[test]
    fn a_step_of_one_case_or_a_conditional_step_is_not_read_later() {
        let p = problems(&LOAN.replace(
            "decision: \"$.steps['review'].result\"",
            "decision: \"$.steps['manual-review'].result\"",
        ));
        assert_eq!(p[0].at, "/steps/3/input/decision");
        assert!(
            p[0].message
                .contains("runs only in case 0 of choice \"review\""),
            "{p:?}"
        );
        let p = problems(&LOAN.replace(
            "score: \"$.steps['credit-check'].result.score\"",
            "score: \"$.steps['notify'].result\"",
        ));
        assert_eq!(p[0].at, "/steps/3/input/score");
        assert!(p[0].message.contains("may be skipped"), "{p:?}");
        // Without a result in `otherwise`, the choice's result is not certain either.
        let p = problems(&LOAN.replace("    otherwise:\n      result: approved\n", ""));
        assert_eq!(p[0].at, "/steps/3/input/decision");
        assert!(p[0].message.contains("every case and `otherwise`"), "{p:?}");
    }

    #[test]
    fn a_condition_that_does_not_parse_is_named_with_its_pointer() {
        let p = problems(&LOAN.replace("input.amount > 10000", "input.amount >"));
        assert_eq!(p[0].at, "/steps/1/choice/0/when");
        assert!(p[0].message.contains("not a CEL expression"), "{p:?}");
        let p = problems(&LOAN.replace("has(steps.review) && input.notify", "steps.payout.ok"));
        assert_eq!(p[0].at, "/steps/2/when");
        assert!(p[0].message.contains("not an earlier step"), "{p:?}");
    }

    const TRIP: &str = r#"name: trip
input:
  type: object
  properties:
    travellers: {type: array}
    reference: {type: string}
steps:
  - name: book
    parallel:
      - name: air
        steps:
          - {name: flight, service: inventory}
      - steps:
          - {name: hotel, service: inventory}
          - name: breakfast
            service: inventory
            input: {room: "$.steps['hotel'].result.room"}
  - name: insure
    service: payment
    forEach: $.input.travellers
    maxConcurrency: 4
    input: {who: $.element, n: $.index, flight: "$.steps['flight'].result"}
"#;

    #[test]
    fn branches_read_their_own_steps_and_later_steps_read_every_branch() {
        let w = workflow(TRIP).expect("a valid trip");
        assert_eq!(w.steps.len(), 4);
        assert!(w.steps[3].for_each.is_some());
    }

    #[test]
    fn a_for_each_stands_in_a_branch_and_only_its_branch_and_later_steps_read_it() {
        let inside = TRIP.replace(
            "          - {name: flight, service: inventory}\n",
            "          - {name: flight, service: inventory, forEach: $.input.travellers, maxConcurrency: 2}\n",
        );
        let w = workflow(&inside).expect("a forEach in a branch is valid");
        let flight = w.steps.iter().find(|s| s.name == "flight").expect("flight");
        assert_eq!(flight.for_each.as_ref().map(|e| e.max_concurrency), Some(2));
        // A sibling branch still cannot read it.
        let sibling = inside.replace(
            "          - {name: hotel, service: inventory}\n",
            "          - {name: hotel, service: inventory, input: {f: \"$.steps['flight'].result\"}}\n",
        );
        assert!(
            problems(&sibling)
                .iter()
                .any(|p| p.at.starts_with("/steps/0/parallel/1/steps/0/input")),
            "{:?}",
            problems(&sibling)
        );
    }

    #[test]
    fn a_distributed_for_each_is_a_step_answered_by_its_run_and_its_elements_run_the_step() {
        let w = workflow(&TRIP.replace(
            "    maxConcurrency: 4\n",
            "    maxConcurrency: 1000\n    distributed: true\n    undo: {action: refund}\n",
        ))
        .expect("a distributed forEach after a group is valid");
        let insure = &w.steps[3];
        assert_eq!(insure.service, super::RUN_SERVICE);
        assert!(
            insure.for_each.is_none(),
            "the task runs no elements itself"
        );
        assert!(insure.policy.callback.is_some(), "answered by its run");
        assert_eq!(
            insure.undo.as_ref().map(|u| u.action.as_str()),
            Some("undo")
        );
        let run = insure.run.as_ref().expect("a run");
        assert_eq!(run.max_concurrency, 1000);
        assert_eq!(run.element.service, "payment");
        let view = w.element_view(3).expect("an element view");
        assert_eq!(view.steps.len(), 1);
        assert_eq!(view.steps[0].service, "payment");
        assert_eq!(
            view.steps[0].undo.as_ref().map(|u| u.action.as_str()),
            Some("refund")
        );
        assert!(view.groups.is_empty() && view.pivot.is_none());
        assert!(w.element_view(2).is_none(), "an ordinary step has none");
        // Without `distributed`, 1000 at once is refused, and says how to get it.
        let p = problems(&TRIP.replace("    maxConcurrency: 4\n", "    maxConcurrency: 1000\n"));
        assert_eq!(p[0].at, "/steps/1/maxConcurrency");
        assert!(p[0].message.contains("distributed"), "{p:?}");
        let p = problems(&TRIP.replace(
            "    maxConcurrency: 4\n",
            "    maxConcurrency: 1001\n    distributed: true\n",
        ));
        assert!(p.iter().any(|p| p.at == "/steps/1/maxConcurrency"), "{p:?}");
    }

    #[test]
    fn a_distributed_for_each_reads_an_s3_location_and_stays_out_of_parallel_branches() {
        let literal = TRIP.replace(
            "    forEach: $.input.travellers\n",
            "    forEach: s3://nightly-lists/travellers.jsonl\n    distributed: true\n",
        );
        let w = workflow(&literal).expect("a literal S3 location is valid");
        assert!(w.steps[3].run.is_some());
        let p = problems(&literal.replace("s3://nightly-lists/", "s3://Nightly/"));
        assert_eq!(p[0].at, "/steps/1/forEach");
        // A query typed string by the input schema may select a location.
        let typed = TRIP.replace(
            "    forEach: $.input.travellers\n",
            "    forEach: $.input.reference\n    distributed: true\n",
        );
        assert!(workflow(&typed).is_ok(), "{:?}", problems(&typed));
        assert!(
            !problems(&typed.replace("    distributed: true\n", "")).is_empty(),
            "an ordinary forEach runs over an array only"
        );
        let in_branch = TRIP.replace(
            "          - {name: flight, service: inventory}\n",
            "          - {name: flight, service: inventory, forEach: $.input.travellers, distributed: true}\n",
        );
        let p = problems(&in_branch);
        assert_eq!(p[0].at, "/steps/0/parallel/0/steps/0/distributed");
        assert!(p[0].message.contains("parallel group's branch"), "{p:?}");
        let alone = TRIP.replace(
            "          - {name: hotel, service: inventory}\n",
            "          - {name: hotel, service: inventory, distributed: true}\n",
        );
        assert!(
            problems(&alone)
                .iter()
                .any(|p| p.message.contains("belongs to a forEach")),
            "{:?}",
            problems(&alone)
        );
    }

    #[test]
    fn a_parallel_group_does_not_stand_in_a_branch_of_another() {
        let nested = TRIP.replace(
            "          - {name: flight, service: inventory}\n",
            "          - {name: flight, service: inventory}\n          - name: inner\n            parallel:\n              - steps: [{name: seat, service: inventory}]\n              - steps: [{name: meal, service: inventory}]\n",
        );
        let p = problems(&nested);
        assert!(
            p.iter()
                .any(|p| p.at == "/steps/0/parallel/0/steps/1/parallel"
                    && p.message.contains("cannot stand in a branch of another")),
            "{p:?}"
        );
        // In a choice in a branch, the same.
        let in_choice = TRIP.replace(
            "          - {name: flight, service: inventory}\n",
            "          - {name: flight, service: inventory}\n          - name: pick\n            choice:\n              - when: input.reference == 'x'\n                steps:\n                  - name: inner\n                    parallel:\n                      - steps: [{name: seat, service: inventory}]\n                      - steps: [{name: meal, service: inventory}]\n",
        );
        let p = problems(&in_choice);
        assert!(
            p.iter()
                .any(|p| p.message.contains("cannot stand in a branch of another")),
            "{p:?}"
        );
    }

    #[test]
    fn a_reference_into_a_sibling_branch_is_refused() {
        let p = problems(&TRIP.replace(
            "room: \"$.steps['hotel'].result.room\"",
            "seat: \"$.steps['flight'].result.seat\"",
        ));
        let sibling = p
            .iter()
            .find(|p| p.at == "/steps/0/parallel/1/steps/1/input/seat")
            .expect("named at its pointer");
        assert!(
            sibling
                .message
                .contains("branch 0 of \"book\": a branch cannot read a sibling's"),
            "{p:?}"
        );
        let p = problems(&TRIP.replace(
            "flight: \"$.steps['flight'].result\"",
            "book: \"$.steps['book'].result\"",
        ));
        assert!(
            p.iter().any(
                |p| p.at == "/steps/1/input/book" && p.message.contains("no result of its own")
            ),
            "{p:?}"
        );
    }

    #[test]
    fn a_for_each_over_what_is_not_an_array_is_refused() {
        for (query, says) in [
            ("$.task.id", "the task's metadata"),
            ("$.input.reference", "typed \"string\""),
            ("$.input.travellers[*]", "not a singular query"),
        ] {
            let p = problems(&TRIP.replace("$.input.travellers", query));
            assert!(
                p.iter()
                    .any(|p| p.at == "/steps/1/forEach" && p.message.contains(says)),
                "{query}: {p:?}"
            );
        }
        let p = problems(&TRIP.replace("n: $.index", "n: $.index.x"));
        assert!(p.iter().any(|p| p.at == "/steps/1/input/n"), "{p:?}");
        let p = problems(&TRIP.replace("maxConcurrency: 4", "maxConcurrency: 0"));
        assert!(p.iter().any(|p| p.at == "/steps/1/maxConcurrency"), "{p:?}");
    }

    #[test]
    fn a_pivot_stands_only_in_the_workflows_own_sequence_and_always_runs() {
        let p = problems(&TRIP.replace(
            "{name: flight, service: inventory}",
            "{name: flight, service: inventory, pivot: true}",
        ));
        assert!(
            p.iter().any(|p| p.at == "/steps/0/parallel/0/steps/0/pivot"
                && p.message.contains("not of a group")),
            "{p:?}"
        );
        let p = problems(&TRIP.replace("maxConcurrency: 4", "maxConcurrency: 4\n    pivot: true"));
        assert!(
            p.iter()
                .any(|p| p.at == "/steps/1/pivot" && p.message.contains("forEach")),
            "{p:?}"
        );
        let p = problems(&LOAN.replace(
            "    when: has(steps.review) && input.notify\n",
            "    when: input.notify\n    pivot: true\n",
        ));
        assert_eq!(p[0].at, "/steps/2/pivot");
        // A wait may be the pivot (once it is done, only forward), as a step of the sequence.
        let w = Workflow::from_value(
            serde_json::json!({"name": "w", "steps": [
                {"name": "a", "service": "inventory", "undo": {"action": "u"}},
                {"name": "signed", "waitFor": "signed", "within": "1d", "pivot": true},
                {"name": "b", "service": "inventory"}
            ]}),
            None,
            &crate::Policy::default(),
        )
        .expect("valid");
        assert_eq!(w.pivot, Some(1));
        let p = problems(&TRIP.replace(
            "{name: flight, service: inventory}",
            "{name: hold, wait: 1h, pivot: true}",
        ));
        assert!(
            p.iter()
                .any(|p| p.at.ends_with("/pivot") && p.message.contains("not of a group")),
            "{p:?}"
        );
    }

    #[test]
    fn an_entry_is_one_thing_and_groups_hold_no_step_fields() {
        let p = problems(&format!(
            "{BASE}  - name: a\n    service: inventory\n    parallel:\n      - steps: [{{name: b, service: inventory}}]\n      - steps: [{{name: c, service: inventory}}]\n"
        ));
        assert_eq!(p[0].at, "/steps/0");
        assert!(p[0].message.contains("exactly one of"), "{p:?}");
        let p =
            problems(&LOAN.replace("  - name: review\n", "  - name: review\n    timeout: 5s\n"));
        assert_eq!(p[0].at, "/steps/1/timeout");
        let p = problems(&LOAN.replace("name: second-look", "name: credit-check"));
        assert_eq!(p[0].at, "/steps/1/choice/1/steps/0/name");
        assert!(
            p[0].message.contains("declared twice (first at /steps/0)"),
            "{p:?}"
        );
    }

    #[test]
    fn groups_nest_at_most_three_deep() {
        let mut inner = "{name: leaf, service: inventory}".to_owned();
        for d in 0..4 {
            inner = format!("{{name: g{d}, choice: [{{when: \"true\", steps: [{inner}]}}]}}");
        }
        let p = problems(&format!("{BASE}  - {inner}\n"));
        assert_eq!(
            p[0].at, "/steps/0/choice/0/steps/0/choice/0/steps/0/choice/0/steps/0",
            "{p:?}"
        );
        assert!(p[0].message.contains("at most 3 deep"), "{p:?}");
    }

    #[test]
    fn a_wait_is_a_duration_or_a_time_and_nothing_of_a_call() {
        const WAITS: &str = r#"name: waits
steps:
  - {name: sign, service: inventory}
  - {name: cool-off, wait: 14d}
  - {name: until, waitUntil: $.input.at}
  - {name: fixed, waitUntil: "2027-01-01T09:00:00+01:00"}
  - {name: pay, service: payment, input: {after: "$.steps['cool-off'].result.until"}}
"#;
        let w = workflow(WAITS).expect("valid waits");
        assert!(matches!(w.steps[1].wait, Some(Wait::For(d)) if d == chrono::Duration::days(14)));
        assert!(matches!(w.steps[2].wait, Some(Wait::Until(_))));
        assert!(w.steps[1].policy.wait && !w.steps[0].policy.wait);
        assert_eq!(
            w.services(),
            ["inventory", "payment"],
            "a wait calls no service"
        );
        let at = |yaml: &str| problems(yaml).into_iter().map(|p| p.at).collect::<Vec<_>>();
        for (bad, pointer) in [
            (
                "{name: cool-off, wait: 14d, waitUntil: $.input.at}",
                "/steps/1",
            ),
            ("{name: cool-off, waitFor: signed}", "/steps/1/within"),
            ("{name: cool-off, wait: 1d, within: 1d}", "/steps/1/within"),
            (
                "{name: cool-off, waitFor: signed, within: 1d, payload: {type: 7}}",
                "/steps/1/payload/type",
            ),
            (
                "{name: cool-off, wait: 14d, service: inventory}",
                "/steps/1",
            ),
            (
                "{name: cool-off, wait: 14d, undo: {action: x}}",
                "/steps/1/undo",
            ),
            ("{name: cool-off, wait: 400d}", "/steps/1/wait"),
            ("{name: cool-off, wait: soon}", "/steps/1/wait"),
            (
                "{name: cool-off, waitUntil: tomorrow}",
                "/steps/1/waitUntil",
            ),
        ] {
            let yaml = WAITS.replace("{name: cool-off, wait: 14d}", bad);
            assert!(
                at(&yaml).contains(&pointer.to_owned()),
                "{bad}: {:?}",
                problems(&yaml)
            );
        }
    }
}
