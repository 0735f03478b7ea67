//! The definitions shipped in `workflows/` (the examples), compiled in for this crate's tests
//! and, with the feature `testkit`, for the kit (the local runner, the chaos harness, the bench,
//! the black-box tests). A deployment publishes its own; no function needs these.

use super::super::policy::Policy;
use super::definition::Workflow;
use super::doc::{Format, parse_services, parse_value};
use super::service::ServiceDef;
use serde_json::Value;
use std::collections::BTreeSet;

pub const ECOMMERCE_ORDER: &str = include_str!("../../../../workflows/ecommerce-order.yaml");
pub const LOAN_APPLICATION: &str = include_str!("../../../../workflows/loan-application.yaml");
pub const SERVICES: &str = include_str!("../../../../workflows/services.yaml");
/// The example that uses every construct (a forEach, parallel branches, a choice, a
/// condition).
pub const ORDER_TRIAGE: &str = include_str!("../../../../workflows/order-triage.yaml");

/// The example services (all simulated).
pub fn services() -> Vec<ServiceDef> {
    parse_value(SERVICES, Format::Yaml)
        .and_then(parse_services)
        .map(|d| d.services)
        .unwrap_or_default()
}

fn example(text: &str, policy: &Policy) -> Workflow {
    let names: BTreeSet<String> = services().into_iter().map(|s| s.name).collect();
    // The examples are compiled in and tested (`the_examples_are_valid`).
    #[allow(clippy::expect_used)]
    parse_value(text, Format::Yaml)
        .and_then(|v| Workflow::from_value(v, Some(&names), policy))
        .expect("the example workflows are valid")
        .with_version(1)
}

/// `workflows/ecommerce-order.yaml` over `policy`, as version 1.
pub fn ecommerce_order(policy: &Policy) -> Workflow {
    example(ECOMMERCE_ORDER, policy)
}

/// `workflows/loan-application.yaml` over `policy`, as version 1.
pub fn loan_application(policy: &Policy) -> Workflow {
    example(LOAN_APPLICATION, policy)
}

/// The shape of a made-up workflow: which steps have an undo, and the pivot.
#[derive(Debug, Clone)]
pub struct Shape {
    pub undos: Vec<bool>,
    pub pivot: Option<usize>,
}

/// A made-up workflow of `shape` on the service `inventory` (for property tests).
pub fn synthetic(shape: &Shape, policy: &Policy) -> Workflow {
    let steps: Vec<Value> = shape
        .undos
        .iter()
        .enumerate()
        .map(|(i, undo)| {
            let mut step = serde_json::json!({"name": format!("s{i}"), "service": "inventory"});
            if *undo {
                step["undo"] = serde_json::json!({"action": format!("undo-s{i}")});
            }
            if shape.pivot == Some(i) {
                step["pivot"] = Value::Bool(true);
            }
            step
        })
        .collect();
    #[allow(clippy::expect_used)]
    Workflow::from_value(
        serde_json::json!({"name": "synthetic", "steps": steps}),
        None,
        policy,
    )
    .expect("a synthetic workflow is valid")
    .with_version(1)
}
