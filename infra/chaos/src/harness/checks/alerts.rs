//! Alerts as a multiset: every failure is one `TaskFailed` alert, i.e. one notice id however
//! often it is delivered (at least once). A task the operator never touched fails at most
//! once; one they acted on owes what [`alerts_owed`] says.

use super::Ending;
use super::records::Outcomes;
use crate::harness::report::Report;
use crate::operator::alerts_owed;
use sas::TaskId;
use std::collections::{BTreeMap, HashMap};

/// Task → notice id → deliveries, of the `TaskFailed` alerts on the bus.
pub(super) type Alerts = BTreeMap<String, BTreeMap<String, u32>>;

/// Distinct alerts and their deliveries, in all and per workflow.
pub(super) fn count_alerts(
    alerts: &Alerts,
    ids: &HashMap<TaskId, &'static str>,
    report: &mut Report,
) {
    for (task, ids_of) in alerts {
        report.alerted += ids_of.len();
        report.alert_deliveries += ids_of.values().map(|n| *n as usize).sum::<usize>();
        if let Some(name) = task.parse::<TaskId>().ok().and_then(|t| ids.get(&t)) {
            report
                .workflows
                .entry((*name).to_owned())
                .or_default()
                .alerted += ids_of.len();
        }
    }
}

/// Each task has as many distinct alerts as failures its record and the operator's actions
/// owe; the failures in all.
pub(super) fn check_one_alert_per_failure(
    alerts: &Alerts,
    end: &Ending,
    outcomes: &Outcomes,
    report: &mut Report,
) -> usize {
    let mut failures = 0;
    for (id, r) in &end.finals {
        let task = id.to_string();
        let n = alerts.get(&task).map_or(0, BTreeMap::len);
        let by_hand = end.operator.applied_to(id);
        let want = match r {
            Some(r) => alerts_owed(outcomes.failed.contains(&task), r, by_hand),
            None => 0,
        };
        failures += want;
        if let Some(name) = end.ids.get(id) {
            report
                .workflows
                .entry((*name).to_owned())
                .or_default()
                .failed += want;
        }
        if n != want {
            report.alert_mismatch.push(format!(
                "{task}: {n} distinct TaskFailed alerts, {want} failure(s) by its record and the operator's actions {by_hand:?}"
            ));
        }
    }
    failures
}
