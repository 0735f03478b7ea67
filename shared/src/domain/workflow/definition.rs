//! A validated workflow: the [`Workflow`] the scheduler runs, its [`Step`]s (numbered depth
//! first, as written) and its [`Group`]s (choices and parallel branches, each over a contiguous
//! range of steps). `compile` builds it from the definition as written.

use super::super::mapping::Mapping;
use super::super::policy::{Policies, Policy};
use super::super::problem::{DefinitionError, InputError};
use super::super::when::When;
use super::doc::{WorkflowDoc, parse_workflow};
use super::schema::schema_problems;
use serde_json::Value;
use std::collections::BTreeSet;
use std::fmt;
use std::ops::Range;
use std::sync::Arc;

/// Most steps in one workflow, groups included (the state record keeps one entry per step).
pub const MAX_STEPS: usize = 32;
/// How deep groups nest (a group in a branch of a group in a case of a group).
pub const MAX_DEPTH: usize = 3;
/// Most branches of a parallel group.
pub const MAX_BRANCHES: usize = 10;
/// Most cases of a choice (`otherwise` aside).
pub const MAX_CASES: usize = 10;
/// The most elements a forEach step runs over.
pub const MAX_ELEMENTS: usize = 100;
/// The most elements of a forEach step out at once.
pub const MAX_CONCURRENCY: u32 = 100;
/// The service a sub-workflow step calls: sas itself, which starts the child task. Its name
/// cannot be a deployment's service's (a service's name has no dot).
pub const CHILD_SERVICE: &str = "sas.workflows";
/// How deep sub-workflows nest: a workflow's child's child's child, no further.
pub const MAX_CHILD_DEPTH: usize = 3;
/// How long a sub-workflow step waits for its child by default (its `timeout` sets it).
pub const CHILD_TIMEOUT_HOURS: i64 = 24;
/// The undo a sub-workflow step gets (before its workflow's pivot, if any): the child task is
/// undone as a unit, by its own steps' undos, last first.
pub const CHILD_UNDO_ACTION: &str = "undo";

/// The service a distributed forEach step calls: sas itself, which starts the step's run (see
/// [`crate::domain::run`]). Its name cannot be a deployment's service's (a service's name has
/// no dot).
pub const RUN_SERVICE: &str = "sas.forEach";
/// How long a distributed forEach step waits for its run (its run's limit, whatever the step's
/// `timeout`, which bounds only the agent's attempt that starts the run).
pub const RUN_TIMEOUT_HOURS: i64 = 24;
/// The undo a distributed forEach step gets when its elements have one: the run undoes every
/// element that took effect, each by its own undo, last first.
pub const RUN_UNDO_ACTION: &str = "undo";

/// One step of a validated workflow.
#[derive(Debug, Clone)]
pub struct Step {
    pub name: String,
    pub service: String,
    pub action: String,
    /// Builds the request body.
    pub input: Mapping,
    pub undo: Option<Undo>,
    /// The deployment's policy with the workflow's defaults and the step's own settings over it.
    pub policy: Policy,
    /// The step runs only if this holds; otherwise it is Skipped.
    pub when: Option<When>,
    /// The step runs once per element of a list.
    pub for_each: Option<ForEach>,
    /// A wait step: it calls no service (its `service` and `action` are empty); it is done once
    /// its time comes.
    pub wait: Option<Wait>,
    /// The group (its index in [`Workflow::groups`]) and arm the step is in, if any.
    pub parent: Option<(usize, usize)>,
    /// A sub-workflow step: the workflow its child task runs. Its `service` is
    /// [`CHILD_SERVICE`], its `action` the workflow's name, and it completes by callback: the
    /// child's end.
    pub child: Option<Child>,
    /// A distributed forEach step: its elements run outside the task's record, each a record
    /// of its own, through a run. Its `service` is [`RUN_SERVICE`], its input the list (or the
    /// S3 location of it), and it completes by callback: the run's end.
    pub run: Option<RunDef>,
}

/// How a distributed forEach step runs its elements.
#[derive(Debug, Clone)]
pub struct RunDef {
    /// The most elements out at once (up to [`crate::domain::run::MAX_RUN_CONCURRENCY`]).
    pub max_concurrency: u32,
    pub tolerated: Tolerated,
    /// Elements kept in one record (a chunk: an in-record forEach of them, see
    /// [`Workflow::chunk_view`]); 1: each element a record of its own.
    pub chunk: u32,
    /// The step each element runs, as written: its service, action, input (reading
    /// `$.element` and `$.index`), undo and policy.
    pub element: Box<Step>,
}

/// The workflow a sub-workflow step runs as a child task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Child {
    pub workflow: String,
    /// Pinned; `None`: the latest published when the step starts.
    pub version: Option<u32>,
}

/// How a step is undone.
#[derive(Debug, Clone)]
pub struct Undo {
    pub action: String,
    pub input: Mapping,
}

/// How long a wait step waits.
#[derive(Debug, Clone)]
pub enum Wait {
    /// This long from when the step is reached.
    For(chrono::Duration),
    /// Until the RFC 3339 time this mapping renders (a literal, or a query on the input or an
    /// earlier result).
    Until(Mapping),
    /// Until the first event of one of `names` is delivered (its payload matching `payload`),
    /// at most `within`: past it, the step fails.
    Event {
        names: Vec<String>,
        within: chrono::Duration,
        payload: Option<Arc<jsonschema::Validator>>,
    },
}

impl Wait {
    /// The events a wait for events waits for (none for a wait on time).
    pub fn events(&self) -> &[String] {
        match self {
            Self::Event { names, .. } => names,
            _ => &[],
        }
    }
}

impl Step {
    /// Whether the step's own mappings and condition (its input, its undo's, its forEach's
    /// items, its wait's time, a distributed forEach's element's) may read step `step`.
    fn reads_step(&self, step: &str) -> bool {
        let mut mappings = vec![&self.input];
        mappings.extend(self.undo.as_ref().map(|u| &u.input));
        mappings.extend(self.for_each.as_ref().map(|f| &f.items));
        if let Some(Wait::Until(m)) = &self.wait {
            mappings.push(m);
        }
        mappings.iter().any(|m| m.reads_step(step))
            || self.when.as_ref().is_some_and(|w| w.reads_step(step))
            // An element reads its own result under the step's name (the element view's one
            // step): never the step's own, its run's list of results.
            || self
                .run
                .as_ref()
                .is_some_and(|r| r.element.name != step && r.element.reads_step(step))
    }
}

impl Workflow {
    /// Whether any of the workflow's mappings or conditions may read step `step`'s result:
    /// a step's, a group's or a case's, a case's result, or the task's output. A JSON Lines
    /// result (a distributed forEach's, by reference) is read back for a record only when
    /// this holds ([`crate::payloads::Offloading`]).
    pub fn reads_result(&self, step: &str) -> bool {
        self.steps.iter().any(|s| s.reads_step(step))
            || self.groups.iter().any(|g| {
                g.when.as_ref().is_some_and(|w| w.reads_step(step))
                    || g.kind.arms().iter().any(|a| {
                        a.when.as_ref().is_some_and(|w| w.reads_step(step))
                            || a.result.as_ref().is_some_and(|m| m.reads_step(step))
                    })
            })
            || self.output.as_ref().is_some_and(|m| m.reads_step(step))
    }

    /// Every sub-workflow step, with the JSON pointer of its `workflow` field.
    pub fn children(&self) -> Vec<(&Step, String)> {
        self.doc
            .workflows_used()
            .into_iter()
            .filter_map(|(at, name)| {
                self.steps
                    .iter()
                    .find(|s| s.name == name && s.child.is_some())
                    .map(|s| (s, at))
            })
            .collect()
    }

    /// What element records of distributed forEach step `i` run: this workflow, with that
    /// step's element step as its only step (no group, no pivot, no output). Its claims,
    /// replies, retries, deadlines and undo are then a one-step task's.
    /// Made once per version ([`Workflow::with_version`]): every element's claim, reply and
    /// request reads it.
    pub fn element_view(&self, i: usize) -> Option<Arc<Workflow>> {
        self.element_views
            .iter()
            .find(|(at, _)| *at == i)
            .map(|(_, views)| views.element.clone())
    }

    /// What chunk records of distributed forEach step `i` run, when it keeps its elements in
    /// chunks ([`RunDef::chunk`] over 1): the element view, its one step a forEach over the
    /// chunk record's input (its elements, `$.input`) that tolerates every refusal (the run
    /// counts them), one element at a time: a reply never races another on the chunk's record,
    /// and the run keeps `maxConcurrency` chunks out. Its elements' mappings still read the
    /// task's context (the run's part of it), their element and their index in the whole list.
    pub fn chunk_view(&self, i: usize) -> Option<Arc<Workflow>> {
        self.element_views
            .iter()
            .find(|(at, _)| *at == i)
            .and_then(|(_, views)| views.chunk.clone())
    }

    /// The element views of this version's distributed forEach steps.
    pub(super) fn with_element_views(mut self) -> Self {
        self.element_views = Vec::new();
        let views = self
            .steps
            .iter()
            .enumerate()
            .filter_map(|(i, step)| {
                let run = step.run.as_ref()?;
                let mut element = (*run.element).clone();
                element.parent = None;
                element.when = None;
                let view = Workflow {
                    steps: vec![element.clone()],
                    groups: vec![],
                    pivot: None,
                    deadline: None,
                    output: None,
                    element_views: Vec::new(),
                    ..self.clone()
                };
                let chunk = (run.chunk > 1).then(|| {
                    let mut each = element;
                    let mut problems = vec![];
                    let items = Mapping::compile(
                        Value::String("$.input".into()),
                        &super::super::mapping::MappingScope::default(),
                        "",
                        &mut problems,
                    );
                    each.for_each = Some(ForEach {
                        items,
                        max_concurrency: 1,
                        tolerated: Tolerated::Percent(100),
                    });
                    Arc::new(Workflow {
                        steps: vec![each],
                        ..view.clone()
                    })
                });
                let views = ElementViews {
                    element: Arc::new(view),
                    chunk,
                };
                Some((i, views))
            })
            .collect();
        self.element_views = views;
        self
    }

    /// The first wait step for event `name`, if the workflow has one.
    pub fn event_step(&self, name: &str) -> Option<(usize, &Step)> {
        self.steps.iter().enumerate().find(|(_, s)| {
            s.wait
                .as_ref()
                .is_some_and(|w| w.events().iter().any(|n| n == name))
        })
    }
}

/// A forEach step's list and how it runs over it.
#[derive(Debug, Clone)]
pub struct ForEach {
    /// The query that selects the list.
    pub items: Mapping,
    /// The most elements out at once.
    pub max_concurrency: u32,
    /// How many refused elements the step tolerates.
    pub tolerated: Tolerated,
}

/// Refused elements a forEach step tolerates (Step Functions' `ToleratedFailureCount` and
/// `...Percentage`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tolerated {
    Count(u32),
    Percent(u32),
}

/// A choice or parallel branches: a contiguous range of steps.
#[derive(Debug, Clone)]
pub struct Group {
    pub name: String,
    /// The whole group runs only if this holds; otherwise every step in it is Skipped.
    pub when: Option<When>,
    /// The steps it covers (indexes into [`Workflow::steps`]).
    pub span: Range<usize>,
    pub kind: GroupKind,
    /// The group and arm around this one, if any.
    pub parent: Option<(usize, usize)>,
    /// 0 for a group in the workflow's own sequence.
    pub depth: usize,
}

#[derive(Debug, Clone)]
pub enum GroupKind {
    /// Exactly one arm runs: the first case whose `when` holds, else `otherwise` (the last arm,
    /// without a `when`) if there is one.
    Choice { arms: Vec<Arm> },
    /// Every arm (branch) runs, at once.
    Parallel { arms: Vec<Arm> },
}

impl GroupKind {
    pub fn arms(&self) -> &[Arm] {
        match self {
            Self::Choice { arms } | Self::Parallel { arms } => arms,
        }
    }
}

/// A case of a choice (or its `otherwise`), or a branch of a parallel group.
#[derive(Debug, Clone)]
pub struct Arm {
    /// A branch's name.
    pub name: Option<String>,
    /// A case's condition (`None`: `otherwise`, or a branch).
    pub when: Option<When>,
    pub span: Range<usize>,
    /// A case's result: what later steps read as the choice's.
    pub result: Option<Mapping>,
}

/// A validated, published workflow: what the scheduler runs.
#[derive(Clone)]
pub struct Workflow {
    pub name: String,
    /// The published version (0 for a definition not published yet).
    pub version: u32,
    pub description: Option<String>,
    /// The definition as written (what the catalog stores and the API returns).
    pub doc: WorkflowDoc,
    pub(super) input_schema: Arc<jsonschema::Validator>,
    /// Every step, depth first in the order written.
    pub steps: Vec<Step>,
    /// Every group, in the order written (an enclosing group before those inside it).
    pub groups: Vec<Group>,
    /// The index of the pivot step, if any.
    pub pivot: Option<usize>,
    /// How long a task has, from its submission, to end (see [`StateRecord::deadline`]).
    ///
    /// [`StateRecord::deadline`]: super::super::state::StateRecord::deadline
    pub deadline: Option<chrono::Duration>,
    /// What a task answers when it ends `Processed` (its parent step's result).
    pub output: Option<Mapping>,
    /// The task's search keys, in slot order.
    pub keys: crate::domain::keys::KeyDefs,
    /// At most so many tasks with one value of a key run at once.
    pub concurrency: Option<crate::domain::keys::KeyLimit>,
    /// What each distributed forEach step's elements run ([`Workflow::element_view`],
    /// [`Workflow::chunk_view`]).
    pub(super) element_views: Vec<(usize, ElementViews)>,
}

/// What a distributed forEach step's records run.
#[derive(Debug, Clone)]
pub(super) struct ElementViews {
    element: Arc<Workflow>,
    chunk: Option<Arc<Workflow>>,
}

impl Workflow {
    /// Where step `i` stands among the groups, outermost first, as people read it:
    /// `review › case 0`, `book › branch air › fare › otherwise`; `None` at the top.
    pub fn place(&self, i: usize) -> Option<String> {
        let mut parts = vec![];
        let mut at = self.steps.get(i)?.parent;
        while let Some((g, k)) = at {
            let group = self.groups.get(g)?;
            let arm = group.kind.arms().get(k)?;
            let label = match (&group.kind, &arm.name) {
                (GroupKind::Parallel { .. }, Some(name)) => format!("branch {name}"),
                (GroupKind::Parallel { .. }, None) => format!("branch {k}"),
                (GroupKind::Choice { .. }, _) if arm.when.is_none() => "otherwise".to_owned(),
                (GroupKind::Choice { .. }, _) => format!("case {k}"),
            };
            parts.push(format!("{} › {label}", group.name));
            at = group.parent;
        }
        parts.reverse();
        (!parts.is_empty()).then(|| parts.join(" › "))
    }
}

impl fmt::Debug for Workflow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Workflow")
            .field("name", &self.name)
            .field("version", &self.version)
            .field("steps", &self.steps)
            .field("groups", &self.groups)
            .field("pivot", &self.pivot)
            .finish_non_exhaustive()
    }
}

/// Which bounds a definition is held to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Limits {
    /// Those of today, for a definition being published (and any other check of one).
    Publish,
    /// None of the bounds on cost (schema budget, queries per mapping): a definition stored
    /// under the bounds of its day still loads, so the tasks running on it go on. Rendering
    /// and matching stay bounded at run time whatever the definition.
    Stored,
}

impl Workflow {
    /// Parses and validates a workflow from its JSON value.
    pub fn from_value(
        value: Value,
        services: Option<&BTreeSet<String>>,
        policy: &Policy,
    ) -> Result<Self, DefinitionError> {
        parse_workflow(value)?.validate(services, policy)
    }

    /// Parses and validates a workflow the catalog stored when it was published: as
    /// [`Workflow::from_value`] without the bounds on cost a definition is published under
    /// (see `Limits::Stored`).
    pub fn from_stored(value: Value, policy: &Policy) -> Result<Self, DefinitionError> {
        parse_workflow(value)?.validate_with(None, policy, Limits::Stored)
    }

    /// The same workflow, stamped with its published version.
    pub fn with_version(mut self, version: u32) -> Self {
        self.version = version;
        self.with_element_views()
    }

    pub fn step(&self, index: usize) -> Option<&Step> {
        self.steps.get(index)
    }

    /// Checks a task's input against the workflow's input schema.
    pub fn check_input(&self, input: &Value) -> Result<(), InputError> {
        let problems = schema_problems(&self.input_schema, input);
        if problems.is_empty() {
            Ok(())
        } else {
            Err(InputError(problems))
        }
    }

    /// The policy of each step, in order.
    pub fn policies(&self) -> Policies {
        Policies::new(self.steps.iter().map(|s| s.policy.clone()).collect())
    }

    /// The distinct services this workflow uses, in step order.
    pub fn services(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for s in &self.steps {
            if !s.service.is_empty() && !out.contains(&s.service.as_str()) {
                out.push(&s.service);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::super::testkit::*;

    #[test]
    fn a_workflow_reads_a_result_where_a_mapping_or_a_condition_names_its_step() {
        let w = workflow(
            r#"name: reads
steps:
  - name: a
    service: inventory
    input: {}
  - name: b
    service: payment
    input: {first: "$.steps.a.result[3]"}
  - name: c
    service: shipping
    when: "has(steps.b) && steps.b.result.ok"
    input: {}
  - name: d
    service: shipping
    input: {}
"#,
        )
        .expect("valid");
        assert!(w.reads_result("a"), "b's input reads an element of a's");
        assert!(w.reads_result("b"), "c's condition reads b's");
        assert!(!w.reads_result("c"), "nothing reads c's");
        assert!(!w.reads_result("d"));
        let output = workflow(
            r#"name: output
steps:
  - name: a
    service: inventory
    input: {}
  - name: b
    service: payment
    input: {}
output: {all: "$.steps.a.result"}
"#,
        )
        .expect("valid");
        assert!(output.reads_result("a"), "the task's output reads a's");
        assert!(!output.reads_result("b"));
    }

    #[test]
    fn a_distributed_steps_elements_reading_their_own_result_do_not_read_the_steps() {
        let w = workflow(
            r#"name: runs
input: {type: object, properties: {items: {type: array}}}
steps:
  - name: open
    service: inventory
    input: {}
  - name: post
    service: payment
    forEach: $.input.items
    distributed: true
    input: {invoice: $.element, period: "$.steps.open.result.id"}
    undo: {action: void, input: {posted: "$.steps['post'].result.id"}}
  - name: file
    service: shipping
    input: {}
"#,
        )
        .expect("valid");
        // In the element view `post` is the element's own step: its undo reads the element's
        // result, never the run's list of results.
        assert_eq!(w.element_view(1).expect("a view").steps[0].name, "post");
        assert!(!w.reads_result("post"), "no query reads the run's results");
        assert!(w.reads_result("open"), "the elements' input reads open's");
    }

    #[test]
    fn the_examples_are_valid() {
        let order = workflow(examples::ECOMMERCE_ORDER).expect("ecommerce-order.yaml");
        let names: Vec<_> = order.steps.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            ["reserve-inventory", "charge-payment", "arrange-shipping"]
        );
        assert!(order.steps.iter().all(|s| s.undo.is_some()));
        let loan = workflow(examples::LOAN_APPLICATION).expect("loan-application.yaml");
        assert!(
            loan.steps[0].undo.is_none(),
            "the credit check is read-only"
        );
        // The cooling-off (a wait) is the pivot: withdrawing before it ends undoes the loan.
        assert_eq!(loan.pivot, Some(4));
        assert_eq!(loan.steps[4].name, "cooling-off");
        assert!(
            loan.steps[2].policy.callback.is_some(),
            "send-contract calls back"
        );
        assert!(
            matches!(&loan.steps[3].wait, Some(super::Wait::Event { names, .. }) if names == &["contract-signed"]),
            "the signature is a named event"
        );
        assert_eq!(loan.deadline, Some(chrono::Duration::days(30)));
        assert_ne!(
            loan.steps[0].policy.step_timeout,
            loan.steps[1].policy.step_timeout
        );
        assert_eq!(loan.services(), ["credit-bureau", "core-banking", "e-sign"]);
        assert!(
            loan.steps[5].undo.is_none(),
            "nothing after the pivot is undone"
        );
        // Every construct, over the shipped services.
        let triage = workflow(examples::ORDER_TRIAGE).expect("order-triage.yaml");
        assert!(triage.steps[1].for_each.is_some(), "pick-items");
        let label = triage.steps.iter().position(|s| s.name == "label-items");
        assert!(
            label.is_some_and(|i| triage.steps[i].for_each.is_some()
                && triage.groups.iter().any(|g| g.span.contains(&i))),
            "a forEach in a branch"
        );
        let kinds: Vec<_> = triage
            .groups
            .iter()
            .map(|g| {
                (
                    g.name.as_str(),
                    matches!(g.kind, GroupKind::Parallel { .. }),
                )
            })
            .collect();
        assert_eq!(kinds, [("prepare", true), ("payment", false)]);
        assert!(
            triage.steps.iter().any(|s| s.when.is_some()),
            "express-booking"
        );
    }

    #[test]
    fn a_duplicate_step_is_named() {
        assert_first_problem(
            &format!(
                "{BASE}  - {{name: a, service: inventory}}\n  - {{name: a, service: payment}}\n"
            ),
            "/steps/1/name",
            "declared twice",
        );
    }

    #[test]
    fn an_unknown_service_is_named() {
        assert_first_problem(
            &format!("{BASE}  - {{name: a, service: nowhere}}\n"),
            "/steps/0/service",
            "unknown service \"nowhere\"",
        );
    }

    #[test]
    fn a_forward_reference_is_named() {
        assert_first_problem(
            &format!(
                "{BASE}  - name: a\n    service: inventory\n    input: {{x: \"$.steps['b'].result.id\"}}\n  - {{name: b, service: payment}}\n"
            ),
            "/steps/0/input/x",
            "not an earlier step",
        );
    }

    #[test]
    fn a_dash_without_brackets_gets_a_hint() {
        assert_first_problem(
            &format!(
                "{BASE}  - {{name: check-it, service: inventory}}\n  - name: b\n    service: payment\n    input: {{s: $.steps.check-it.result}}\n"
            ),
            "/steps/1/input/s",
            "$.steps['check-it'].result",
        );
    }

    #[test]
    fn pivots_are_unique_and_nothing_after_one_is_undone() {
        let p = problems(&format!(
            "{BASE}  - {{name: a, service: inventory, pivot: true}}\n  - {{name: b, service: inventory, pivot: true}}\n  - name: c\n    service: inventory\n    undo: {{action: un-c}}\n"
        ));
        let at: Vec<_> = p.iter().map(|p| p.at.as_str()).collect();
        assert_eq!(at, ["/steps/1/pivot", "/steps/2/undo"]);
    }

    #[test]
    fn an_undo_may_read_its_own_steps_result_but_a_step_may_not() {
        let ok = workflow(&format!(
            "{BASE}  - name: a\n    service: inventory\n    undo: {{action: un-a, input: {{id: \"$.steps['a'].result.id\"}}}}\n"
        ));
        assert!(ok.is_ok(), "{ok:?}");
        let p = problems(&format!(
            "{BASE}  - name: a\n    service: inventory\n    input: {{id: \"$.steps['a'].result.id\"}}\n"
        ));
        assert_eq!(p[0].at, "/steps/0/input/id");
    }
}
