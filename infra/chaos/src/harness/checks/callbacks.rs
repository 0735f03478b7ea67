//! The callback contract kept: a callback a service posted and sas took (202) or called stale
//! (409) is never waited out by its step.

use sas::remote::PostedCallback;
use sas::{StateRecord, StepStatus, Workflow};
use std::collections::HashMap;

/// The callback steps of `r` that timed out waiting for their callback ("no callback by")
/// after their service had posted it, and never took it: the step did not end Done. sas lost
/// a callback it had taken (202), or called it stale (409) while the step still waited. (A
/// callback held up in a stalled queue may arrive after such a timeout: it completes the step
/// then, which is no violation.)
pub(super) fn ignored_callbacks(
    r: &StateRecord,
    workflow: &Workflow,
    posted: &HashMap<String, PostedCallback>,
) -> Vec<String> {
    let mut out = Vec::new();
    for (i, s) in r.steps.iter().enumerate() {
        let Some(step) = workflow.step(i) else {
            continue;
        };
        let key = sas::messages::idempotency_key(r.task_id, &step.name, &step.action, s.generation);
        // A callback sas refused as malformed (400: an oversized result, say) is the service's
        // to mend; one it took (202) or called stale (409) is sas's to keep.
        let Some(c) = posted
            .get(&key)
            .filter(|c| matches!(c.status, Some(202 | 409)) && s.status != StepStatus::Done)
        else {
            continue;
        };
        let waited = r.history.iter().find(|h| {
            h.step.as_deref() == Some(s.name.as_str())
                && h.reason.contains("no callback by")
                && h.at > c.at + chrono::Duration::seconds(1)
        });
        if let Some(h) = waited {
            out.push(format!(
                "{} {}: callback posted at {} (answered {:?}), then {:?} at {}, and the step ended {}",
                r.task_id, s.name, c.at, c.status, h.reason, h.at, s.status
            ));
        }
    }
    out
}
