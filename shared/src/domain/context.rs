//! What mappings and conditions read: `{task: {id, workflow, version}, input, steps: {<name>:
//! {result}}}`, where `steps` holds every step's kept result and the result of every choice
//! whose case declared one and has run.

use super::state::StateRecord;
use super::task::{MAX_RESULT_BYTES, Task};
use super::workflow::{GroupKind, Workflow};
use serde_json::{Value, json};

/// The context the mappings (and conditions) of step `i` read, where `input` is the task's
/// input the step ran with (see [`super::state::StepState::input_revision`]). `None` if the task
/// no longer has that input (a broken invariant).
pub fn context(workflow: &Workflow, task: &Task, record: &StateRecord, i: usize) -> Option<Value> {
    let revision = record.steps.get(i).and_then(|s| s.input_revision);
    let mut context = json!({
        "task": {"id": task.id, "workflow": task.workflow, "version": task.workflow_version},
        "input": task.input_of(revision)?,
        "steps": record.results(),
    });
    add_choice_results(workflow, record, &mut context);
    Some(context)
}

/// Adds the result of every choice that ran a case with a `result` whose steps are over, inner
/// choices before the ones around them and earlier ones first (a case's result may read either).
/// A result that cannot be built yet (its case is still running) is left out: the definition
/// lets nothing read it before it can be.
fn add_choice_results(workflow: &Workflow, record: &StateRecord, context: &mut Value) {
    let mut ran: Vec<_> = record
        .decisions
        .iter()
        .filter(|d| !d.skipped)
        .filter_map(|d| {
            let g = workflow.groups.iter().find(|g| g.name == d.group)?;
            let GroupKind::Choice { arms } = &g.kind else {
                return None;
            };
            let arm = arms.get(d.arm?)?;
            Some((g, arm.span.clone(), arm.result.as_ref()?))
        })
        .collect();
    ran.sort_by_key(|(g, _, _)| (g.span.end, std::cmp::Reverse(g.depth)));
    for (g, span, result) in ran {
        let over = record
            .steps
            .get(span)
            .is_some_and(|s| s.iter().all(|s| s.status.is_passed()));
        if !over {
            continue;
        }
        if let Ok(v) = result.render(context, MAX_RESULT_BYTES)
            && let Some(steps) = context.get_mut("steps").and_then(Value::as_object_mut)
        {
            steps.insert(g.name.clone(), json!({ "result": v }));
        }
    }
}
