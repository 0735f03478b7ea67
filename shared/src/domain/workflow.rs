//! Workflows: an ordered list of steps, each handled by one remote service through one agent.

use serde::{Deserialize, Serialize};

/// One step of a workflow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepDef {
    /// The step's name, also the action the remote service performs (`reserve-inventory`).
    pub name: String,
    /// The agent (and so the request queue and remote service) that handles the step.
    pub agent: String,
    /// The action that undoes the step, for compensation (`release-inventory`).
    pub undo: String,
}

/// An ordered list of steps.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Workflow {
    pub name: String,
    pub steps: Vec<StepDef>,
}

impl Workflow {
    /// The project's example workflow: the e-commerce order.
    pub fn ecommerce() -> Self {
        let step = |name: &str, agent: &str, undo: &str| StepDef {
            name: name.to_owned(),
            agent: agent.to_owned(),
            undo: undo.to_owned(),
        };
        Self {
            name: "ecommerce-order".to_owned(),
            steps: vec![
                step("reserve-inventory", "inventory", "release-inventory"),
                step("charge-payment", "payment", "refund-payment"),
                step("arrange-shipping", "shipping", "cancel-shipping"),
            ],
        }
    }

    pub fn step(&self, index: usize) -> Option<&StepDef> {
        self.steps.get(index)
    }

    /// The distinct agents this workflow uses, in step order.
    pub fn agents(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for s in &self.steps {
            if !out.contains(&s.agent.as_str()) {
                out.push(&s.agent);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ecommerce_has_three_steps_each_with_an_undo() {
        let w = Workflow::ecommerce();
        let names: Vec<_> = w.steps.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            ["reserve-inventory", "charge-payment", "arrange-shipping"]
        );
        let undos: Vec<_> = w.steps.iter().map(|s| s.undo.as_str()).collect();
        assert_eq!(
            undos,
            ["release-inventory", "refund-payment", "cancel-shipping"]
        );
        assert_eq!(w.agents(), ["inventory", "payment", "shipping"]);
    }
}
