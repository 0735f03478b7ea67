//! Each order triage's steps against the path its input implies: an independent model of the
//! workflow's choice and condition in its parallel branches (`definitions::ORDER_TRIAGE`),
//! written apart from the scheduler's router. Checked, whatever the task's end: no step off its path was sent or
//! done, no step on it was skipped, the choice took the case the input says; and a Processed
//! task did every step of its path and skipped every other. And for every task no operator
//! touched: the run's definitions and inputs are well formed, so no step may fail for a mapping
//! that selects nothing or a condition that cannot be decided (an operator's skip without a
//! result may leave a later mapping nothing to select).

use super::Ending;
use crate::harness::load::input;
use crate::harness::report::Report;
use sas::{ProcessState, StepStatus};
use std::collections::BTreeSet;

/// The steps an order triage runs on `input`: by card above 500 (a credit check, then the
/// charge), else by invoice; the express booking only when asked for; the packing and its
/// labels always.
fn triage_path(input: &serde_json::Value) -> (BTreeSet<&'static str>, bool) {
    let by_card = input["amount"].as_i64().is_some_and(|a| a > 500);
    let mut path = BTreeSet::from([
        "reserve-inventory",
        "pick-items",
        "pack-order",
        "label-items",
        "arrange-shipping",
    ]);
    if by_card {
        path.extend(["check-credit", "charge-card"]);
    } else {
        path.insert("send-invoice");
    }
    if input["express"].as_bool() == Some(true) {
        path.insert("express-booking");
    }
    (path, by_card)
}

pub(super) fn check_paths(end: &Ending, report: &mut Report) {
    for (id, r) in end
        .finals
        .iter()
        .filter_map(|(id, r)| Some((id, r.as_ref()?)))
    {
        let broken = ["input_mapping_failed", "condition_failed"];
        let untouched = end.operator.applied_to(id).is_empty();
        if let Some(e) = r
            .last_error
            .as_deref()
            .filter(|e| untouched && broken.iter().any(|b| e.contains(b)))
        {
            report.off_path.push(format!(
                "{id} ({}, {}): failed on a well-formed definition: {e}",
                r.workflow, r.process_state
            ));
        }
        if r.workflow != "order-triage" {
            continue;
        }
        let Some(i) = end.indexes.get(id) else {
            continue;
        };
        let (path, by_card) = triage_path(&input(*i));
        let mut wrong = vec![];
        for s in &r.steps {
            let on = path.contains(s.name.as_str());
            let ran = s.sent || s.status == StepStatus::Done;
            if ran && !on {
                wrong.push(format!("{} ran off its path", s.name));
            }
            if on && s.status == StepStatus::Skipped {
                wrong.push(format!("{} was skipped on its path", s.name));
            }
            if r.process_state == ProcessState::Processed
                && (on != (s.status == StepStatus::Done) || on == (s.status == StepStatus::Skipped))
            {
                wrong.push(format!("{} is {} in a processed task", s.name, s.status));
            }
        }
        if let Some(d) = r.decisions.iter().find(|d| d.group == "payment")
            && (d.arm == Some(0)) != by_card
        {
            wrong.push(format!("the payment took {d:?}"));
        }
        if !wrong.is_empty() {
            report
                .off_path
                .push(format!("{id} ({}): {}", r.process_state, wrong.join("; ")));
        }
    }
}
