//! What the definition's tests share: the example services, and helpers that parse a
//! workflow or a service and return its problems.

pub(super) use super::super::policy::Policy;
pub(super) use super::super::problem::{DefinitionError, Problem};
pub(super) use super::*;
pub(super) use serde_json::{Value, json};
pub(super) use std::collections::BTreeSet;

/// The head of a workflow definition, its steps to follow.
pub(super) const BASE: &str = "name: w\nsteps:\n";

pub(super) fn services() -> BTreeSet<String> {
    let doc = parse_services(
        parse_value(examples::SERVICES, Format::Yaml).expect("services.yaml parses"),
    )
    .expect("services.yaml is valid");
    doc.services.into_iter().map(|s| s.name).collect()
}

pub(super) fn workflow(text: &str) -> Result<Workflow, DefinitionError> {
    let value = parse_value(text, Format::Yaml)?;
    Workflow::from_value(value, Some(&services()), &Policy::default())
}

pub(super) fn problems(text: &str) -> Vec<Problem> {
    workflow(text).expect_err("invalid").0
}

/// The first problem of the workflow `text` is at `pointer` and its message says `says`.
pub(super) fn assert_first_problem(text: &str, pointer: &str, says: &str) {
    let p = problems(text);
    assert_eq!(p[0].at, pointer);
    assert!(p[0].message.contains(says), "{p:?}");
}

pub(super) fn service_problems_of(target: Value) -> Vec<Problem> {
    parse_services(json!({"services": [{"name": "bank", "target": target}]}))
        .expect_err("invalid")
        .0
}

pub(super) fn at(problems: &[Problem], pointer: &str) -> bool {
    problems.iter().any(|p| p.at == pointer)
}

pub(super) fn input_problems(schema: Value) -> Vec<Problem> {
    Workflow::from_value(
        json!({"name": "w", "input": schema, "steps": [{"name": "a", "service": "inventory"}]}),
        None,
        &Policy::default(),
    )
    .expect_err("a hostile input schema is refused")
    .0
}
