//! A validated workflow: [`WorkflowDoc::validate`] checks what the schema cannot say (unique
//! step names, mappings that are RFC 9535 singular queries referring only to earlier steps,
//! services that exist, settings in range, one pivot at most and no undo after it) and compiles
//! the [`Workflow`] the scheduler runs.

use super::super::mapping::{self, Mapping, MappingScope};
use super::super::policy::{Policies, Policy};
use super::super::problem::{DefinitionError, InputError, Problem};
use super::doc::{WorkflowDoc, parse_workflow};
use super::schema::{compile_input, schema_problems};
use super::settings::{apply_settings, callback_policy};
use serde_json::Value;
use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;

/// Most steps in one workflow (the state record keeps one entry per step).
pub const MAX_STEPS: usize = 32;

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
}

/// How a step is undone.
#[derive(Debug, Clone)]
pub struct Undo {
    pub action: String,
    pub input: Mapping,
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
    input_schema: Arc<jsonschema::Validator>,
    pub steps: Vec<Step>,
    /// The index of the pivot step, if any.
    pub pivot: Option<usize>,
}

impl fmt::Debug for Workflow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Workflow")
            .field("name", &self.name)
            .field("version", &self.version)
            .field("steps", &self.steps)
            .field("pivot", &self.pivot)
            .finish_non_exhaustive()
    }
}

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

    fn validate_with(
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
        let mut names: Vec<&str> = vec![];
        let mut steps = vec![];
        let mut pivot = None;
        for (i, s) in self.steps.iter().enumerate() {
            let at = format!("/steps/{i}");
            if names.contains(&s.name.as_str()) {
                problems.push(Problem {
                    at: format!("{at}/name"),
                    message: format!("step {:?} is declared twice: step names are unique", s.name),
                });
            }
            if let Some(known) = services
                && !known.contains(&s.service)
            {
                problems.push(Problem {
                    at: format!("{at}/service"),
                    message: format!(
                        "unknown service {:?} (known: {})",
                        s.service,
                        known.iter().cloned().collect::<Vec<_>>().join(", ")
                    ),
                });
            }
            if s.pivot {
                match pivot {
                    None => pivot = Some(i),
                    Some(first) => problems.push(Problem {
                        at: format!("{at}/pivot"),
                        message: format!(
                            "step {first} is already the pivot: a workflow has at most one"
                        ),
                    }),
                }
            } else if let (Some(p), Some(_)) = (pivot, &s.undo) {
                problems.push(Problem {
                    at: format!("{at}/undo"),
                    message: format!(
                        "step {:?} comes after the pivot (step {p}) and is never undone: remove its undo",
                        s.name
                    ),
                });
            }
            let earlier: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
            let too_many = |m: &Mapping, at: String, problems: &mut Vec<Problem>| {
                if limits == Limits::Publish && m.queries() > mapping::MAX_QUERIES {
                    problems.push(Problem {
                        at,
                        message: format!(
                            "{} queries: a mapping holds at most {}",
                            m.queries(),
                            mapping::MAX_QUERIES
                        ),
                    });
                }
            };
            let input = Mapping::compile(
                s.input
                    .clone()
                    .unwrap_or_else(|| Value::String("$.input".into())),
                &MappingScope {
                    steps: &earlier,
                    own: None,
                },
                &format!("{at}/input"),
                &mut problems,
            );
            let undo = s.undo.as_ref().map(|u| Undo {
                action: u.action.clone(),
                input: Mapping::compile(
                    u.input
                        .clone()
                        .unwrap_or_else(|| Value::String(format!("$.steps['{}'].result", s.name))),
                    &MappingScope {
                        steps: &earlier,
                        own: Some(&s.name),
                    },
                    &format!("{at}/undo/input"),
                    &mut problems,
                ),
            });
            too_many(&input, format!("{at}/input"), &mut problems);
            if let Some(u) = &undo {
                too_many(&u.input, format!("{at}/undo/input"), &mut problems);
            }
            let mut step_policy = base.clone();
            apply_settings(
                &mut step_policy,
                &at,
                (s.timeout.as_ref(), s.start_within.as_ref()),
                s.retry.as_ref(),
                &mut problems,
            );
            if let Some(cb) = &s.callback {
                step_policy.callback =
                    callback_policy(&format!("{at}/callback"), cb, &mut problems);
            }
            names.push(&s.name);
            steps.push(Step {
                name: s.name.clone(),
                service: s.service.clone(),
                action: s.action.clone().unwrap_or_else(|| s.name.clone()),
                input,
                undo,
                policy: step_policy,
            });
        }
        if steps.len() > MAX_STEPS {
            problems.push(Problem {
                at: "/steps".into(),
                message: format!("at most {MAX_STEPS} steps"),
            });
        }
        match input_validator {
            Some(v) if problems.is_empty() => Ok(Workflow {
                name: self.name.clone(),
                version: 0,
                description: self.description.clone(),
                input_schema: Arc::new(v),
                steps,
                pivot,
                doc: self,
            }),
            _ => Err(DefinitionError(problems)),
        }
    }
}

/// Which bounds a definition is held to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Limits {
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
        self
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
            if !out.contains(&s.service.as_str()) {
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
        assert_eq!(loan.pivot, Some(2));
        assert_ne!(
            loan.steps[0].policy.step_timeout,
            loan.steps[1].policy.step_timeout
        );
        assert_eq!(loan.services(), ["credit-bureau", "core-banking", "e-sign"]);
        assert!(
            loan.steps[3].undo.is_none(),
            "nothing after the pivot is undone"
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
