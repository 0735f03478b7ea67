//! `sasctl bulk ACTION`: one action on every task of a state (of a workflow, updated in a time
//! range). A dry run by default: it counts and lists what it would touch; `--yes` applies the
//! action to each task, each its own conditional write recorded with who and why, so a task
//! that moved on meanwhile is a conflict, never a second action.

use crate::api::{ProcessState, TaskSummary};
use crate::client::{Action, Client, ClientError};
use chrono::{DateTime, Utc};
use futures::StreamExt;

/// What to act on.
#[derive(Debug, Clone)]
pub struct Selection {
    pub state: ProcessState,
    pub workflow: Option<String>,
    /// Only tasks updated at or after this instant.
    pub since: Option<DateTime<Utc>>,
    /// Only tasks updated before this instant.
    pub until: Option<DateTime<Utc>>,
}

impl Selection {
    fn holds(&self, t: &TaskSummary) -> bool {
        let at = t.updated_at;
        self.since.is_none_or(|s| at.is_some_and(|a| a >= s))
            && self.until.is_none_or(|u| at.is_some_and(|a| a < u))
    }
}

/// The tasks a selection holds now, newest first. Stops paging once the list (newest first)
/// is older than `since`.
pub async fn select(client: &Client, sel: &Selection) -> Result<Vec<TaskSummary>, ClientError> {
    let mut found = Vec::new();
    let mut cursor: Option<String> = None;
    let mut seen = std::collections::HashSet::new();
    loop {
        let page = client
            .list(
                &sel.state,
                sel.workflow.as_deref(),
                Some(100),
                cursor.as_deref(),
            )
            .await?;
        let mut older = false;
        for t in page.tasks {
            if sel
                .since
                .is_some_and(|s| t.updated_at.is_some_and(|a| a < s))
            {
                older = true;
                continue;
            }
            if t.process_state == sel.state && sel.holds(&t) && seen.insert(t.task_id.clone()) {
                found.push(t);
            }
        }
        match page.next_cursor {
            Some(c) if !older => cursor = Some(c),
            _ => return Ok(found),
        }
    }
}

/// How each task fared.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Tally {
    pub applied: Vec<String>,
    /// The task had moved on (409): not acted on.
    pub conflicts: Vec<String>,
    /// Any other error, with its message.
    pub failed: Vec<(String, String)>,
}

/// Applies `action` to each task, `concurrency` at a time.
pub async fn apply(
    client: &Client,
    tasks: &[TaskSummary],
    action: Action,
    reason: Option<&str>,
    concurrency: usize,
) -> Tally {
    let results: Vec<(String, Result<(), ClientError>)> =
        futures::stream::iter(tasks.iter().map(|t| async move {
            let r = client.act(&t.task_id, action, reason).await.map(|_| ());
            (t.task_id.clone(), r)
        }))
        .buffer_unordered(concurrency.max(1))
        .collect()
        .await;
    let mut tally = Tally::default();
    for (id, r) in results {
        match r {
            Ok(()) => tally.applied.push(id),
            Err(ClientError::Api { status: 409, .. }) => tally.conflicts.push(id),
            Err(e) => tally.failed.push((id, e.to_string())),
        }
    }
    tally.applied.sort();
    tally.conflicts.sort();
    tally.failed.sort();
    tally
}

/// An instant on the command line: RFC 3339, or a duration meaning that long ago (`2h`).
pub fn parse_instant(s: &str) -> Result<DateTime<Utc>, String> {
    if let Ok(t) = DateTime::parse_from_rfc3339(s) {
        return Ok(t.with_timezone(&Utc));
    }
    let ago = humantime::parse_duration(s)
        .map_err(|_| format!("{s:?} is neither an RFC 3339 time nor a duration (e.g. 2h, 30m)"))?;
    let ago = chrono::Duration::from_std(ago).map_err(|e| e.to_string())?;
    Ok(Utc::now() - ago)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants_are_times_or_durations_ago() {
        let t = parse_instant("2026-11-24T10:00:00Z").expect("rfc3339");
        assert_eq!(t.to_rfc3339(), "2026-11-24T10:00:00+00:00");
        let ago = parse_instant("2h").expect("duration");
        let want = Utc::now() - chrono::Duration::hours(2);
        assert!((ago - want).num_seconds().abs() <= 1);
        assert!(parse_instant("yesterday-ish").is_err());
    }

    #[test]
    fn a_selection_keeps_its_time_range() {
        let at = |s: &str| {
            DateTime::parse_from_rfc3339(s)
                .ok()
                .map(|t| t.with_timezone(&Utc))
        };
        let sel = Selection {
            state: ProcessState::Error,
            workflow: None,
            since: at("2026-11-24T10:00:00Z"),
            until: at("2026-11-24T11:00:00Z"),
        };
        let task = |updated: &str| TaskSummary {
            since: None,
            task_id: "t".into(),
            workflow: None,
            process_state: ProcessState::Error,
            step: None,
            failure_count: None,
            attempt: None,
            last_error: None,
            updated_at: at(updated),
        };
        assert!(
            sel.holds(&task("2026-11-24T10:00:00Z")),
            "since is inclusive"
        );
        assert!(sel.holds(&task("2026-11-24T10:59:59Z")));
        assert!(
            !sel.holds(&task("2026-11-24T11:00:00Z")),
            "until is exclusive"
        );
        assert!(!sel.holds(&task("2026-11-24T09:59:59Z")));
    }
}
