//! Plain-text rendering: aligned columns sized to their content, `-` for absent values, and
//! control characters in server-provided text replaced so they cannot garble the terminal.

use crate::api::{
    CatalogEntry, DefinitionView, ListPage, ServiceList, StepView, TaskSummary, TaskView,
    WorkflowList,
};
use chrono::{DateTime, SecondsFormat, Utc};
use sas::domain::workflow::WorkflowDoc;
use serde_json::Value;
use std::fmt::Write as _;

/// The widest `LAST ERROR` cell of [`render_list`], in characters, `…` included.
pub const LAST_ERROR_WIDTH: usize = 60;
/// The widest `REASON` cell of the history table and last error of a watch line.
pub const REASON_WIDTH: usize = 80;
/// The widest `input` of [`render_task`] (the whole input is in `--json`).
pub const INPUT_WIDTH: usize = 200;
/// The widest `RESULT` cell of the steps table.
pub const RESULT_WIDTH: usize = 40;
/// The stand-in for an absent value.
pub const NONE: &str = "-";

/// Replaces control characters (newlines, tabs, escapes) with spaces, then truncates to `max`
/// characters, ending with `…` when something was cut.
pub fn clean(s: &str, max: usize) -> String {
    let s: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    truncate(&s, max)
}

/// Truncates to at most `max` characters, the last one `…` when something was cut.
pub fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_owned();
    }
    let mut out: String = s.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// An optional cell: cleaned text, or `-`.
fn opt(s: Option<&str>, max: usize) -> String {
    match s {
        Some(s) if !s.trim().is_empty() => clean(s, max),
        _ => NONE.to_owned(),
    }
}

fn num<T: ToString>(n: Option<T>) -> String {
    n.map_or_else(|| NONE.to_owned(), |n| n.to_string())
}

/// An RFC 3339 UTC timestamp to the second, e.g. `2025-01-02T03:04:05Z`.
pub fn time(t: Option<&DateTime<Utc>>) -> String {
    t.map_or_else(
        || NONE.to_owned(),
        |t| t.to_rfc3339_opts(SecondsFormat::Secs, true),
    )
}

/// Column alignment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    Left,
    Right,
}

/// Lays out rows (the first is usually the header) in columns separated by two spaces, each as
/// wide as its widest cell; the last column is not padded, so no line has trailing spaces.
/// Cells are measured in characters. Missing cells count as empty.
pub fn table(rows: &[Vec<String>], align: &[Align]) -> String {
    let ncols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let mut widths = vec![0; ncols];
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (i, width) in widths.iter().enumerate() {
            let cell = row.get(i).map_or("", String::as_str);
            let pad = width - cell.chars().count();
            let last = i + 1 == ncols;
            if i > 0 {
                line.push_str("  ");
            }
            match align.get(i).copied().unwrap_or(Align::Left) {
                Align::Right => {
                    line.extend(std::iter::repeat_n(' ', pad));
                    line.push_str(cell);
                }
                Align::Left => {
                    line.push_str(cell);
                    if !last {
                        line.extend(std::iter::repeat_n(' ', pad));
                    }
                }
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn header(cells: &[&str]) -> Vec<String> {
    cells.iter().map(|c| (*c).to_owned()).collect()
}

fn summary_row(t: &TaskSummary) -> Vec<String> {
    vec![
        clean(&t.task_id, usize::MAX),
        opt(t.workflow.as_deref(), usize::MAX),
        clean(t.process_state.as_str(), usize::MAX),
        opt(t.step.as_deref(), usize::MAX),
        num(t.failure_count),
        time(t.updated_at.as_ref()),
        opt(t.last_error.as_deref(), LAST_ERROR_WIDTH),
    ]
}

/// A page of tasks as a table:
/// `TASK ID  WORKFLOW  STATE  STEP  FAILURES  UPDATED  LAST ERROR`, or `no tasks` when empty.
/// The next-page hint is left to the caller, which knows the command line.
pub fn render_list(page: &ListPage) -> String {
    if page.tasks.is_empty() {
        return "no tasks\n".to_owned();
    }
    let mut rows = vec![header(&[
        "TASK ID",
        "WORKFLOW",
        "STATE",
        "STEP",
        "FAILURES",
        "UPDATED",
        "LAST ERROR",
    ])];
    rows.extend(page.tasks.iter().map(summary_row));
    use Align::{Left, Right};
    table(&rows, &[Left, Left, Left, Left, Right, Left, Left])
}

/// Compact JSON, cleaned and truncated to `max` characters; `-` for none.
fn json_cell(v: Option<&Value>, max: usize) -> String {
    match v {
        None | Some(Value::Null) => NONE.to_owned(),
        Some(v) => clean(&v.to_string(), max),
    }
}

/// `name vN`, `name`, or `-`.
fn workflow_cell(name: Option<&str>, version: Option<u32>) -> String {
    match (opt(name, usize::MAX), version) {
        (name, Some(v)) if name != NONE => format!("{name} v{v}"),
        (name, _) => name,
    }
}

/// The UNDO cell of a step: the undo's status once compensation reached the step, `no undo`
/// when the workflow declares none (the step is never undone), `-` otherwise.
fn undo_cell(s: &StepView) -> String {
    match (&s.undo, s.undoable) {
        (Some(status), _) if !status.trim().is_empty() => clean(status, usize::MAX),
        (_, Some(false)) => "no undo".to_owned(),
        _ => NONE.to_owned(),
    }
}

/// A run's counts in a line: `40 of 100 done, 2 refused, 8 out` (the marks at zero left out);
/// in chunks, `4 of 10 chunks of 10 done, 2 elements refused, 1 out`.
fn run_counts(c: &sas::api::views::RunCounts) -> String {
    let chunk = c.chunk.filter(|k| *k > 1);
    let mut line = match chunk {
        Some(k) => format!("{} of {} chunks of {k} done", c.done, c.total.div_ceil(k)),
        None => format!("{} of {} done", c.done, c.total),
    };
    let refused = if chunk.is_some() {
        "elements refused"
    } else {
        "refused"
    };
    for (n, label) in [
        (c.refused, refused),
        (c.out, "out"),
        (c.undoing, "undoing"),
        (c.undone, "undone"),
        (c.undo_failed, "undo failed"),
    ] {
        if n > 0 {
            let _ = write!(line, ", {n} {label}");
        }
    }
    line
}

/// A run's page of elements: each one's index, record, mark and state, then where the next
/// page starts.
fn render_elements(out: &mut String, run_id: &str, run: &sas::api::views::RunView) {
    let _ = writeln!(out, "\nELEMENTS (from #{})", run.elements_from);
    if run.elements.is_empty() {
        out.push_str("(none)\n");
    } else {
        let mut rows = vec![header(&["#", "ELEMENT", "MARK", "STATE"])];
        rows.extend(run.elements.iter().map(|e| {
            vec![
                e.index.to_string(),
                clean(&e.task_id, usize::MAX),
                opt(e.mark.as_deref(), usize::MAX),
                opt(e.process_state.as_deref(), usize::MAX),
            ]
        }));
        out.push_str(&table(&rows, &[Align::Right]));
    }
    if let Some(next) = run.next_elements_from {
        let _ = writeln!(
            out,
            "more: sasctl show {} --elements-from {next}",
            clean(run_id, usize::MAX)
        );
    }
}

/// One task: a summary block, the steps table, then the history table.
pub fn render_task(t: &TaskView) -> String {
    let summary = [
        ("task", clean(&t.task_id, usize::MAX)),
        (
            "workflow",
            workflow_cell(t.workflow.as_deref(), t.workflow_version),
        ),
        ("state", clean(t.process_state.as_str(), usize::MAX)),
        ("step", opt(t.current_step.as_deref(), usize::MAX)),
        ("failures", num(t.failure_count)),
        ("attempt", num(t.attempt)),
        ("created", time(t.created_at.as_ref())),
        ("updated", time(t.updated_at.as_ref())),
        ("input", json_cell(t.input.as_ref(), INPUT_WIDTH)),
        // The full error: `show` is where an operator reads it.
        ("last error", opt(t.last_error.as_deref(), usize::MAX)),
    ]
    .into_iter()
    .chain((!t.priority.is_normal()).then(|| ("priority", clean(t.priority.as_str(), usize::MAX))))
    .chain((!t.keys.is_empty()).then(|| {
        let keys: Vec<String> = t.keys.iter().map(|(k, v)| format!("{k}:{v}")).collect();
        ("keys", clean(&keys.join(" "), usize::MAX))
    }))
    .chain(t.gate.as_ref().map(|g| {
        let mut text = format!("{} ({}, limit {})", g.gate, g.status, g.limit);
        if !g.holders.is_empty() {
            text.push_str(&format!("; held by {}", g.holders.join(", ")));
        }
        if let Some(n) = g.ahead {
            text.push_str(&format!("; {n} before it"));
        }
        ("gate", clean(&text, usize::MAX))
    }))
    .chain(
        t.parent
            .as_ref()
            .filter(|_| t.run.is_none() && t.element.is_none())
            .map(|p| {
                (
                    "parent",
                    format!(
                        "{} (step {})",
                        clean(&p.task_id, usize::MAX),
                        clean(&p.step, usize::MAX)
                    ),
                )
            }),
    )
    .chain(t.element.as_ref().map(|e| {
        (
            "element",
            format!(
                "#{}{} of run {} (task {}, step {})",
                e.index,
                e.first
                    .map(|f| format!(", a chunk from element #{f}"))
                    .unwrap_or_default(),
                clean(&e.run_id, usize::MAX),
                clean(&e.task_id, usize::MAX),
                clean(&e.step, usize::MAX)
            ),
        )
    }))
    .chain(t.run.as_ref().map(|r| {
        (
            "run of",
            format!(
                "{} (step {})",
                clean(&r.task_id, usize::MAX),
                clean(&r.step, usize::MAX)
            ),
        )
    }))
    .chain(t.run.as_ref().map(|r| ("elements", run_counts(&r.counts))))
    .chain(t.pivot.as_deref().map(|p| {
        let passed = if t.past_pivot == Some(true) {
            " (done: the task only goes forward)"
        } else {
            ""
        };
        ("pivot", format!("{}{passed}", clean(p, usize::MAX)))
    }))
    .map(|(k, v)| vec![format!("{k}:"), v])
    .collect::<Vec<_>>();
    let mut out = table(&summary, &[]);

    out.push_str("\nSTEPS\n");
    if t.steps.is_empty() {
        out.push_str("(none)\n");
    } else {
        // The groups' column only for a workflow that has groups.
        let grouped = t.steps.iter().any(|s| s.within.is_some());
        let mut head = vec!["#", "NAME"];
        if grouped {
            head.push("IN");
        }
        head.extend(["SERVICE", "STATUS", "UNDO", "RESULT"]);
        let mut rows = vec![header(&head)];
        rows.extend(t.steps.iter().enumerate().map(|(i, s)| {
            let current = t.current_step.as_deref() == Some(s.name.as_str());
            let marker = if current { ">" } else { "" };
            let service = match (&s.service, &s.action) {
                (Some(svc), Some(a)) => clean(&format!("{svc}.{a}"), usize::MAX),
                (svc, _) => opt(svc.as_deref(), usize::MAX),
            };
            let mut row = vec![format!("{marker}{}", i + 1), clean(&s.name, usize::MAX)];
            if grouped {
                row.push(opt(s.within.as_deref(), usize::MAX));
            }
            row.extend([
                service,
                clean(&s.status, usize::MAX),
                undo_cell(s),
                json_cell(s.result.as_ref(), RESULT_WIDTH),
            ]);
            row
        }));
        out.push_str(&table(&rows, &[Align::Right]));
        // In full: what an operator reconciles by hand.
        for (i, s) in t.steps.iter().enumerate() {
            let lines = [
                ("input", s.input.as_ref()),
                ("result", s.result.as_ref()),
                ("undo input", s.undo_input.as_ref()),
            ];
            let events: Vec<_> = t
                .history
                .iter()
                .filter(|h| h.step.as_deref() == Some(s.name.as_str()))
                .collect();
            let elements = s
                .elements
                .iter()
                .any(|e| e.input.is_some() || e.undo_input.is_some());
            if lines.iter().all(|(_, v)| v.is_none_or(Value::is_null))
                && events.is_empty()
                && !elements
                && s.child_task_id.is_none()
                && s.run.is_none()
            {
                continue;
            }
            let _ = writeln!(out, "\nstep {} {}", i + 1, clean(&s.name, usize::MAX));
            if let Some(child) = &s.child_task_id {
                let _ = writeln!(out, "  child task: {}", clean(child, usize::MAX));
            }
            if let Some(run) = &s.run {
                let state = run
                    .process_state
                    .as_deref()
                    .map(|st| format!(" ({})", clean(st, usize::MAX)))
                    .unwrap_or_default();
                let counts = run
                    .counts
                    .as_ref()
                    .map(|c| format!(": {}", run_counts(c)))
                    .unwrap_or_default();
                let _ = writeln!(
                    out,
                    "  run:        {}{state}{counts}",
                    clean(&run.task_id, usize::MAX)
                );
            }
            if let Some(at) = &s.finished_at {
                let _ = writeln!(
                    out,
                    "  finished:   {} (attempt {})",
                    time(Some(at)),
                    num(s.finished_attempt)
                );
            }
            for h in &events {
                let _ = writeln!(
                    out,
                    "  {} {} -> {}: {}",
                    time(Some(&h.at)),
                    opt(h.from.as_ref().map(|s| s.as_str()), usize::MAX),
                    clean(h.to.as_str(), usize::MAX),
                    opt(h.reason.as_deref(), usize::MAX)
                );
            }
            for (label, v) in lines {
                if let Some(v) = v.filter(|v| !v.is_null()) {
                    let _ = writeln!(
                        out,
                        "  {:<11} {}",
                        format!("{label}:"),
                        clean(&v.to_string(), usize::MAX)
                    );
                }
            }
            // A forEach step: each element's own request (its element and index mapped in).
            for (k, e) in s.elements.iter().enumerate() {
                for (label, v) in [("input", &e.input), ("undo input", &e.undo_input)] {
                    if let Some(v) = v {
                        let _ = writeln!(
                            out,
                            "  #{k:<3} {:<8} {label}: {}",
                            clean(&e.status, usize::MAX),
                            clean(&v.to_string(), usize::MAX)
                        );
                    }
                }
            }
        }
    }

    if let Some(run) = &t.run {
        render_elements(&mut out, &t.task_id, run);
    }

    if !t.decisions.is_empty() {
        out.push_str("\nGROUPS\n");
        let mut rows = vec![header(&["GROUP", "RAN"])];
        rows.extend(t.decisions.iter().map(|d| {
            let ran = match (d.skipped, d.otherwise, d.arm) {
                (true, _, _) => "skipped (its condition did not hold)".to_owned(),
                (false, false, None) if d.parallel => "every branch".to_owned(),
                (false, true, _) => "otherwise".to_owned(),
                (false, false, Some(k)) => format!("case {k}"),
                (false, false, None) => "no case held: nothing".to_owned(),
            };
            vec![clean(&d.group, usize::MAX), ran]
        }));
        out.push_str(&table(&rows, &[]));
    }

    let each: Vec<_> = t.steps.iter().filter(|s| !s.elements.is_empty()).collect();
    if !each.is_empty() {
        // A forEach step's elements: how many, by status, and by undo.
        out.push_str("\nELEMENTS\n");
        let mut rows = vec![header(&["STEP", "ELEMENTS", "STATUSES", "UNDOS"])];
        let tally = |of: Vec<&str>| {
            let mut counts: Vec<(String, usize)> = vec![];
            for s in of {
                match counts.iter_mut().find(|(k, _)| k == s) {
                    Some((_, n)) => *n += 1,
                    None => counts.push((s.to_owned(), 1)),
                }
            }
            if counts.is_empty() {
                "-".to_owned()
            } else {
                counts
                    .iter()
                    .map(|(k, n)| format!("{k} {n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        };
        rows.extend(each.iter().map(|s| {
            vec![
                clean(&s.name, usize::MAX),
                s.elements.len().to_string(),
                tally(s.elements.iter().map(|e| e.status.as_str()).collect()),
                tally(
                    s.elements
                        .iter()
                        .filter_map(|e| e.undo.as_deref())
                        .collect(),
                ),
            ]
        }));
        out.push_str(&table(&rows, &[]));
    }

    if !t.branches.is_empty() {
        out.push_str("\nBRANCHES\n");
        let mut rows = vec![header(&[
            "GROUP", "BRANCH", "STATE", "STEP", "ATTEMPT", "DEADLINE", "ERROR",
        ])];
        rows.extend(t.branches.iter().map(|b| {
            vec![
                clean(&b.group, usize::MAX),
                opt(b.branch.as_deref(), usize::MAX),
                clean(&b.state, usize::MAX),
                opt(b.step.as_deref(), usize::MAX),
                b.attempt.map_or("-".to_owned(), |a| a.to_string()),
                time(b.complete_by.as_ref()),
                opt(b.last_error.as_deref(), 80),
            ]
        }));
        out.push_str(&table(&rows, &[]));
    }

    out.push_str("\nHISTORY\n");
    if t.history.is_empty() {
        out.push_str("(none)\n");
    } else {
        let mut rows = vec![header(&[
            "AT", "FROM", "TO", "STEP", "ATTEMPT", "BY", "REASON",
        ])];
        rows.extend(t.history.iter().map(|h| {
            vec![
                time(Some(&h.at)),
                opt(h.from.as_ref().map(|s| s.as_str()), usize::MAX),
                clean(h.to.as_str(), usize::MAX),
                opt(h.step.as_deref(), usize::MAX),
                num(h.attempt),
                opt(h.by.as_deref(), usize::MAX),
                opt(h.reason.as_deref(), REASON_WIDTH),
            ]
        }));
        use Align::{Left, Right};
        out.push_str(&table(&rows, &[Left, Left, Left, Left, Right, Left, Left]));
    }
    out
}

/// The width of the state in a watch line: the longest documented state, CompensationFailed.
const STATE_WIDTH: usize = 18;

/// One `watch` line: `<updated>  <state>  step=<step>  failures=<n>  attempt=<n>[  error=<e>]`.
pub fn render_watch_line(t: &TaskView) -> String {
    let mut line = format!(
        "{}  {:<w$}  step={}  failures={}  attempt={}",
        time(t.updated_at.as_ref()),
        clean(t.process_state.as_str(), usize::MAX),
        opt(t.current_step.as_deref(), usize::MAX),
        num(t.failure_count),
        num(t.attempt),
        w = STATE_WIDTH,
    );
    if let Some(e) = t.last_error.as_deref().filter(|e| !e.trim().is_empty()) {
        let _ = write!(line, "  error={}", clean(e, REASON_WIDTH));
    }
    line.push('\n');
    line
}

/// The confirmation of an action or the end of a watch: `task <id>: <state>`.
pub fn render_confirmation(t: &TaskView) -> String {
    format!(
        "task {}: {}\n",
        clean(&t.task_id, usize::MAX),
        clean(t.process_state.as_str(), usize::MAX)
    )
}

fn render_entries(entries: &[CatalogEntry], none: &str) -> String {
    if entries.is_empty() {
        return format!("{none}\n");
    }
    let mut rows = vec![header(&["NAME", "LATEST"])];
    rows.extend(
        entries
            .iter()
            .map(|e| vec![clean(&e.name, usize::MAX), format!("v{}", e.latest)]),
    );
    table(&rows, &[])
}

/// `GET /workflows` as a table: `NAME  LATEST`, or `no workflows`.
pub fn render_workflows(list: &WorkflowList) -> String {
    render_entries(&list.workflows, "no workflows")
}

/// A service's limits in a cell: `5 at once, 20/s burst 5`, its actions' after `;`, the share
/// as `share 10 at once`, or `-`.
fn limits_cell(e: &crate::api::ServiceEntry) -> String {
    fn one(l: &serde_json::Value) -> Vec<String> {
        let mut parts = vec![];
        if let Some(c) = l["concurrency"].as_u64() {
            parts.push(format!("{c} at once"));
        }
        if let Some(r) = l["rate"]["perSecond"].as_f64() {
            let burst = l["rate"]["burst"].as_u64().unwrap_or(1);
            parts.push(format!("{r}/s burst {burst}"));
        }
        parts
    }
    let none = serde_json::Value::Null;
    let limits = e.limits.as_ref().unwrap_or(&none);
    let mut parts = one(limits);
    if let Some(share) = e.share {
        parts.insert(0, format!("share {share} at once"));
    }
    let mut cell = parts.join(", ");
    if let Some(actions) = limits["actions"].as_object() {
        for (action, l) in actions {
            let action = format!("{}: {}", clean(action, usize::MAX), one(l).join(", "));
            cell = if cell.is_empty() {
                action
            } else {
                format!("{cell}; {action}")
            };
        }
    }
    if cell.is_empty() {
        NONE.to_owned()
    } else {
        cell
    }
}

/// `GET /services` as a table: `NAME  LATEST  BREAKER  DETAIL  LIMITS  IN FLIGHT  WAITING`, or
/// `no services`.
pub fn render_services(list: &ServiceList) -> String {
    if list.services.is_empty() {
        return "no services\n".to_owned();
    }
    let mut rows = vec![header(&[
        "NAME",
        "LATEST",
        "BREAKER",
        "DETAIL",
        "LIMITS",
        "IN FLIGHT",
        "WAITING",
    ])];
    rows.extend(list.services.iter().map(|e| {
        let (state, detail) = match &e.breaker {
            None => (NONE.to_owned(), String::new()),
            Some(b) => {
                let detail = match b.state.as_str() {
                    "closed" => format!("{} consecutive faults", b.failures.unwrap_or(0)),
                    "paused" => format!(
                        "since {}: {}",
                        time(b.since.as_ref()),
                        opt(b.note.as_deref(), REASON_WIDTH)
                    ),
                    _ => format!("until {}", time(b.until.as_ref())),
                };
                (clean(&b.state, usize::MAX), detail)
            }
        };
        vec![
            clean(&e.name, usize::MAX),
            format!("v{}", e.latest),
            state,
            detail,
            limits_cell(e),
            e.in_flight
                .map_or_else(|| NONE.to_owned(), |n| n.to_string()),
            e.waiting.map_or_else(|| NONE.to_owned(), |n| n.to_string()),
        ]
    }));
    table(&rows, &[])
}

/// A published workflow's definition as pretty JSON (a definition file `workflow apply` reads
/// back), its fields laid out as in the definition format when this version knows it.
pub fn render_definition_json(d: &DefinitionView) -> Result<String, serde_json::Error> {
    let mut out = match serde_json::from_value::<WorkflowDoc>(d.definition.clone()) {
        Ok(doc) => serde_json::to_string_pretty(&doc)?,
        Err(_) => serde_json::to_string_pretty(&d.definition)?,
    };
    out.push('\n');
    Ok(out)
}

/// A published workflow as a YAML definition file, headed by a comment naming its version:
/// what `workflow apply` reads back. Fields keep the layout of the definition format (name,
/// description, input, defaults, steps) when the definition is one this version knows.
pub fn render_definition_yaml(d: &DefinitionView) -> Result<String, serde_saphyr::SerializeError> {
    let body = match serde_json::from_value::<WorkflowDoc>(d.definition.clone()) {
        Ok(doc) => serde_saphyr::to_string(&doc)?,
        Err(_) => serde_saphyr::to_string(&d.definition)?,
    };
    let mut out = format!("# {} v{}", clean(&d.name, usize::MAX), d.version);
    if let Some(at) = &d.published_at {
        let _ = write!(out, ", published {}", time(Some(at)));
    }
    out.push('\n');
    out.push_str(&body);
    if !out.ends_with('\n') {
        out.push('\n');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{HistoryEntry, ProcessState, StepView};
    use chrono::TimeZone;
    use serde_json::json;

    fn at(secs: u32) -> Option<DateTime<Utc>> {
        Utc.with_ymd_and_hms(2025, 1, 2, 3, 4, secs).single()
    }

    fn row(
        id: &str,
        state: ProcessState,
        step: Option<&str>,
        failures: Option<u32>,
    ) -> TaskSummary {
        TaskSummary {
            since: None,
            task_id: id.into(),
            workflow: Some("loan-application".into()),
            process_state: state,
            step: step.map(Into::into),
            failure_count: failures,
            attempt: Some(1),
            last_error: None,
            updated_at: at(5),
        }
    }

    #[test]
    fn list_columns_align_and_none_is_a_dash() {
        let mut long = row("task-2", ProcessState::CompensationFailed, None, Some(12));
        long.last_error = Some("core-banking refused".into());
        long.workflow = None;
        let page = ListPage {
            tasks: vec![
                row("t1", ProcessState::Error, Some("disburse-funds"), Some(2)),
                long,
            ],
            next_cursor: Some("c".into()),
        };
        let out = render_list(&page);
        let expected = "\
TASK ID  WORKFLOW          STATE               STEP            FAILURES  UPDATED               LAST ERROR
t1       loan-application  Error               disburse-funds         2  2025-01-02T03:04:05Z  -
task-2   -                 CompensationFailed  -                     12  2025-01-02T03:04:05Z  core-banking refused
";
        assert_eq!(out, expected);
        assert!(out.lines().all(|l| l == l.trim_end()), "no trailing spaces");
    }

    #[test]
    fn list_truncates_long_errors_and_cleans_control_characters() {
        let mut r = row("t1", ProcessState::Error, None, None);
        r.last_error = Some(format!("line one\nline\ttwo\u{1b}[31m {}", "x".repeat(200)));
        let out = render_list(&ListPage {
            tasks: vec![r],
            next_cursor: None,
        });
        let line = out.lines().nth(1).unwrap_or_default();
        let cell = line.rsplit("  ").next().unwrap_or_default();
        assert_eq!(cell.chars().count(), LAST_ERROR_WIDTH);
        assert!(cell.ends_with('…') && cell.starts_with("line one line two [31m"));
        assert!(!out.contains('\u{1b}'));
        assert!(
            line.contains("  -  "),
            "missing failure count is a dash: {line}"
        );
        assert_eq!(out.lines().count(), 2);
    }

    #[test]
    fn empty_list() {
        assert_eq!(render_list(&ListPage::default()), "no tasks\n");
    }

    #[test]
    fn truncate_counts_characters() {
        assert_eq!(truncate("héllo", 5), "héllo");
        assert_eq!(truncate("héllo wörld", 6), "héllo…");
        assert_eq!(truncate("abc", 0), "…");
        assert_eq!(clean("a\r\nb", 10), "a  b");
    }

    #[test]
    fn table_right_aligns_and_handles_ragged_rows() {
        let rows = vec![
            vec!["A".to_owned(), "N".to_owned(), "Z".to_owned()],
            vec!["long".to_owned(), "1".to_owned()],
            vec!["x".to_owned(), "100".to_owned(), "end".to_owned()],
        ];
        let out = table(&rows, &[Align::Left, Align::Right]);
        assert_eq!(out, "A       N  Z\nlong    1\nx     100  end\n");
    }

    fn step(name: &str, status: &str, undoable: Option<bool>, undo: Option<&str>) -> StepView {
        StepView {
            name: name.into(),
            status: status.into(),
            undoable,
            result: None,
            undo: undo.map(Into::into),
            ..StepView::default()
        }
    }

    fn view() -> TaskView {
        let mut check = step("check-credit", "Done", Some(false), None);
        check.result = Some(json!({"id": "cb-1", "service": "credit-bureau"}));
        let mut reserve = step("reserve-funds", "Done", Some(true), Some("Running"));
        reserve.service = Some("core-banking".into());
        reserve.action = Some("reserve".into());
        reserve.input = Some(json!({"amount": 500}));
        reserve.undo_input = Some(json!({"reservation": null}));
        reserve.finished_at = at(5);
        reserve.finished_attempt = Some(2);
        TaskView {
            caller: None,
            keys: Default::default(),
            gate: None,
            input_revision: None,
            earlier_inputs: vec![],
            reply_queue_url: None,
            locked_by: None,
            complete_by: None,
            round: None,
            since: None,
            deadline: None,
            start_at: None,
            priority: Default::default(),
            parent: None,
            run: None,
            element: None,
            task_id: "3f2a".into(),
            process_state: ProcessState::Compensating,
            workflow: Some("loan-application".into()),
            workflow_version: Some(2),
            input: Some(json!({"amount": 500, "applicantId": "a-1", "currency": "EUR"})),
            current_step: Some("reserve-funds".into()),
            failure_count: Some(2),
            attempt: Some(3),
            last_error: Some("core-banking refused".into()),
            refusal: None,
            created_at: at(1),
            updated_at: at(9),
            steps: vec![
                check,
                reserve,
                step("send-contract", "Failed", Some(true), None),
                step("disburse-funds", "Pending", None, None),
            ],
            decisions: vec![],
            branches: vec![],
            pivot: None,
            past_pivot: None,
            history: vec![
                HistoryEntry {
                    at: at(1).unwrap_or_default(),
                    from: None,
                    to: ProcessState::Pending,
                    step: None,
                    attempt: None,
                    reason: Some("submitted".into()),
                    by: None,
                },
                HistoryEntry {
                    at: at(2).unwrap_or_default(),
                    from: Some(ProcessState::Pending),
                    to: ProcessState::Processing,
                    step: Some("check-credit".into()),
                    attempt: Some(1),
                    reason: Some("claimed".into()),
                    by: None,
                },
                HistoryEntry {
                    at: at(8).unwrap_or_default(),
                    from: Some(ProcessState::Error),
                    to: ProcessState::Compensating,
                    step: Some("send-contract".into()),
                    attempt: Some(3),
                    reason: Some("operator compensate: customer withdrew".into()),
                    by: Some("arn:aws:iam::123456789012:user/ops".into()),
                },
            ],
        }
    }

    #[test]
    fn task_has_summary_steps_and_history() {
        let expected = r#"task:        3f2a
workflow:    loan-application v2
state:       Compensating
step:        reserve-funds
failures:    2
attempt:     3
created:     2025-01-02T03:04:01Z
updated:     2025-01-02T03:04:09Z
input:       {"amount":500,"applicantId":"a-1","currency":"EUR"}
last error:  core-banking refused

STEPS
 #  NAME            SERVICE               STATUS   UNDO     RESULT
 1  check-credit    -                     Done     no undo  {"id":"cb-1","service":"credit-bureau"}
>2  reserve-funds   core-banking.reserve  Done     Running  -
 3  send-contract   -                     Failed   -        -
 4  disburse-funds  -                     Pending  -        -

step 1 check-credit
  2025-01-02T03:04:02Z Pending -> Processing: claimed
  result:     {"id":"cb-1","service":"credit-bureau"}

step 2 reserve-funds
  finished:   2025-01-02T03:04:05Z (attempt 2)
  input:      {"amount":500}
  undo input: {"reservation":null}

step 3 send-contract
  2025-01-02T03:04:08Z Error -> Compensating: operator compensate: customer withdrew

HISTORY
AT                    FROM     TO            STEP           ATTEMPT  BY                                  REASON
2025-01-02T03:04:01Z  -        Pending       -                    -  -                                   submitted
2025-01-02T03:04:02Z  Pending  Processing    check-credit         1  -                                   claimed
2025-01-02T03:04:08Z  Error    Compensating  send-contract        3  arn:aws:iam::123456789012:user/ops  operator compensate: customer withdrew
"#;
        assert_eq!(render_task(&view()), expected);
    }

    #[test]
    fn skipped_steps_and_the_cases_that_ran_are_shown() {
        let mut v = view();
        v.steps[2].status = "Skipped".into();
        v.decisions = vec![
            sas::domain::state::Decision {
                group: "review".into(),
                arm: Some(1),
                otherwise: false,
                skipped: false,
                parallel: false,
            },
            sas::domain::state::Decision {
                group: "extras".into(),
                arm: None,
                otherwise: false,
                skipped: true,
                parallel: false,
            },
            sas::domain::state::Decision {
                group: "fees".into(),
                arm: Some(2),
                otherwise: true,
                skipped: false,
                parallel: false,
            },
            sas::domain::state::Decision {
                group: "checks".into(),
                arm: None,
                otherwise: false,
                skipped: false,
                parallel: true,
            },
        ];
        v.steps[1].elements = ["Done", "Done", "Failed"]
            .iter()
            .map(|st| sas::api::views::StepView {
                name: "reserve-funds".into(),
                status: (*st).into(),
                undo: (*st == "Done").then(|| "Done".to_owned()),
                ..Default::default()
            })
            .collect();
        v.branches = vec![sas::api::views::BranchView {
            group: "checks".into(),
            branch: Some("fraud".into()),
            state: "Processing".into(),
            step: Some("fraud-check".into()),
            attempt: Some(4),
            complete_by: None,
            last_error: None,
        }];
        let out = render_task(&v);
        assert!(
            out.contains(" 3  send-contract   -                     Skipped"),
            "{out}"
        );
        let groups = "\nGROUPS\nGROUP   RAN\nreview  case 1\nextras  skipped (its condition did not hold)\nfees    otherwise\nchecks  every branch\n\nELEMENTS\nSTEP           ELEMENTS  STATUSES          UNDOS\nreserve-funds  3         Done 2, Failed 1  Done 2\n\nBRANCHES\nGROUP   BRANCH  STATE       STEP         ATTEMPT  DEADLINE  ERROR\nchecks  fraud   Processing  fraud-check  4        -         -\n\nHISTORY";
        assert!(out.contains(groups), "{out}");
    }

    /// A forEach step's request is each element's own: `show` prints each one's input (its
    /// element mapped in), not the step's mapping without an element (`null`s).
    #[test]
    fn a_for_each_steps_elements_show_their_own_inputs() {
        let mut v = view();
        let mut pick = step("pick-items", "Done", Some(true), None);
        pick.elements = vec![
            StepView {
                input: Some(json!({"line": 0, "sku": "a"})),
                ..step("pick-items", "Done", Some(true), None)
            },
            StepView {
                input: Some(json!({"line": 1, "sku": "b"})),
                undo_input: Some(json!({"pick": "p1"})),
                ..step("pick-items", "Done", Some(true), Some("Done"))
            },
            step("pick-items", "Skipped", Some(true), None),
        ];
        v.steps.push(pick);
        let out = render_task(&v);
        assert!(
            out.contains("  #0   Done     input: {\"line\":0,\"sku\":\"a\"}\n"),
            "{out}"
        );
        assert!(
            out.contains("  #1   Done     undo input: {\"pick\":\"p1\"}\n"),
            "{out}"
        );
    }

    #[test]
    fn long_inputs_and_results_are_cut() {
        let mut v = view();
        v.input = Some(json!({"note": "x".repeat(500)}));
        v.steps[0].result = Some(json!({"id": "y".repeat(100)}));
        let out = render_task(&v);
        let input = out
            .lines()
            .find_map(|l| l.strip_prefix("input:       "))
            .unwrap_or_default();
        assert_eq!(input.chars().count(), INPUT_WIDTH);
        assert!(input.ends_with('…'), "{input}");
        let result = out
            .lines()
            .find(|l| l.contains("check-credit"))
            .and_then(|l| l.rsplit("  ").next())
            .unwrap_or_default();
        assert_eq!(result.chars().count(), RESULT_WIDTH, "{out}");
    }

    #[test]
    fn minimal_task_renders_dashes() {
        let t = TaskView {
            caller: None,
            keys: Default::default(),
            gate: None,
            input_revision: None,
            earlier_inputs: vec![],
            reply_queue_url: None,
            locked_by: None,
            complete_by: None,
            round: None,
            since: None,
            deadline: None,
            start_at: None,
            priority: Default::default(),
            parent: None,
            run: None,
            element: None,
            task_id: "t1".into(),
            process_state: ProcessState::Pending,
            workflow: None,
            workflow_version: Some(1),
            input: None,
            current_step: None,
            failure_count: None,
            attempt: None,
            last_error: None,
            refusal: None,
            created_at: None,
            updated_at: None,
            steps: vec![],
            decisions: vec![],
            branches: vec![],
            pivot: None,
            past_pivot: None,
            history: vec![],
        };
        let out = render_task(&t);
        assert!(out.contains("workflow:    -\n"), "{out}");
        assert!(out.contains("input:       -\n"), "{out}");
        assert!(out.contains("STEPS\n(none)\n\nHISTORY\n(none)\n"), "{out}");
        assert_eq!(
            render_watch_line(&t),
            "-  Pending             step=-  failures=-  attempt=-\n"
        );
        assert_eq!(render_confirmation(&t), "task t1: Pending\n");
    }

    #[test]
    fn a_task_waiting_at_its_gate_shows_its_keys_its_holder_and_its_place() {
        let mut t = view();
        t.keys = [("accountId".to_owned(), "a-77".to_owned())].into();
        t.gate = Some(sas::api::views::GateView {
            gate: "ledger#a-77".into(),
            limit: 1,
            status: "Parked".into(),
            holders: vec!["t-0".into()],
            ahead: Some(2),
        });
        t.priority = sas::domain::Priority::Urgent;
        let out = render_task(&t);
        assert!(out.contains("keys:        accountId:a-77\n"), "{out}");
        assert!(out.contains("priority:    urgent\n"), "{out}");
        t.priority = sas::domain::Priority::Normal;
        assert!(!render_task(&t).contains("priority"), "normal goes unsaid");
        assert!(
            out.contains("gate:        ledger#a-77 (Parked, limit 1); held by t-0; 2 before it\n"),
            "{out}"
        );
    }

    #[test]
    fn a_child_names_its_parent_and_a_sub_workflow_step_its_child() {
        let mut t = view();
        t.parent = Some(sas::api::views::ParentView {
            task_id: "p-1".into(),
            step: "pay".into(),
        });
        let mut pay = step("pay", "Waiting", Some(true), None);
        pay.child_task_id = Some("c-1".into());
        t.steps.push(pay);
        let out = render_task(&t);
        assert!(
            out.contains("parent:") && out.contains("p-1 (step pay)"),
            "{out}"
        );
        assert!(out.contains("\nstep 5 pay\n  child task: c-1\n"), "{out}");
        let plain = render_task(&view());
        assert!(
            !plain.contains("parent:") && !plain.contains("child task"),
            "{plain}"
        );
    }

    #[test]
    fn a_run_names_its_task_and_pages_its_elements_and_a_step_names_its_run() {
        use sas::api::views::{ElementRow, ElementView, RunCounts, RunLink, RunView};
        let counts = RunCounts {
            total: 300,
            opened: 120,
            done: 100,
            refused: 2,
            out: 18,
            ..RunCounts::default()
        };
        let mut t = view();
        let mut post = step("post", "Waiting", Some(true), None);
        post.run = Some(RunLink {
            task_id: "r-1".into(),
            process_state: Some("Processing".into()),
            counts: Some(counts),
        });
        t.steps.push(post);
        let out = render_task(&t);
        assert!(
            out.contains("\nstep 5 post\n  run:        r-1 (Processing): 100 of 300 done, 2 refused, 18 out\n"),
            "{out}"
        );
        // A run in chunks counts chunks, and refused elements.
        let chunks = RunCounts {
            total: 300,
            chunk: Some(25),
            opened: 6,
            done: 4,
            refused: 3,
            out: 2,
            ..RunCounts::default()
        };
        assert_eq!(
            run_counts(&chunks),
            "4 of 12 chunks of 25 done, 3 elements refused, 2 out"
        );

        let mut run = view();
        run.task_id = "r-1".into();
        run.parent = Some(sas::api::views::ParentView {
            task_id: "t-1".into(),
            step: "post".into(),
        });
        run.run = Some(RunView {
            task_id: "t-1".into(),
            step: "post".into(),
            step_index: 4,
            counts,
            stop: None,
            elements: vec![
                ElementRow {
                    index: 100,
                    task_id: "e-100".into(),
                    mark: Some("out".into()),
                    process_state: Some("Processing".into()),
                },
                ElementRow {
                    index: 120,
                    task_id: "e-120".into(),
                    mark: None,
                    process_state: None,
                },
            ],
            elements_from: 100,
            next_elements_from: Some(200),
        });
        let out = render_task(&run);
        assert!(
            out.contains("run of:") && out.contains("t-1 (step post)"),
            "{out}"
        );
        assert!(
            !out.contains("parent:"),
            "the run's task is named once: {out}"
        );
        assert!(out.contains("100 of 300 done, 2 refused, 18 out"), "{out}");
        assert!(out.contains("\nELEMENTS (from #100)\n"), "{out}");
        assert!(
            out.contains("e-100") && out.contains("out") && out.contains("e-120"),
            "{out}"
        );
        assert!(
            out.contains("more: sasctl show r-1 --elements-from 200\n"),
            "{out}"
        );

        let mut element = view();
        element.element = Some(ElementView {
            run_id: "r-1".into(),
            index: 7,
            task_id: "t-1".into(),
            step: "post".into(),
            first: None,
        });
        let out = render_task(&element);
        assert!(
            out.contains("element:") && out.contains("#7 of run r-1 (task t-1, step post)"),
            "{out}"
        );
        let plain = render_task(&view());
        assert!(
            !plain.contains("ELEMENTS")
                && !plain.contains("run of:")
                && !plain.contains("element:")
        );
    }

    #[test]
    fn watch_line_shows_the_error() {
        assert_eq!(
            render_watch_line(&view()),
            "2025-01-02T03:04:09Z  Compensating        step=reserve-funds  failures=2  attempt=3  error=core-banking refused\n"
        );
    }

    #[test]
    fn catalog_tables() {
        let list = WorkflowList {
            workflows: vec![
                CatalogEntry {
                    name: "ecommerce-order".into(),
                    latest: 1,
                },
                CatalogEntry {
                    name: "loan-application".into(),
                    latest: 12,
                },
            ],
        };
        assert_eq!(
            render_workflows(&list),
            "NAME              LATEST\necommerce-order   v1\nloan-application  v12\n"
        );
        assert_eq!(render_workflows(&WorkflowList::default()), "no workflows\n");
        assert_eq!(render_services(&ServiceList::default()), "no services\n");
    }

    #[test]
    fn services_show_their_limits_calls_in_flight_and_waiting() {
        let list: ServiceList = serde_json::from_value(json!({"services": [
            {"name": "bank", "latest": 2, "breaker": {"state": "closed", "failures": 0},
             "limits": {"concurrency": 5, "rate": {"perSecond": 20, "burst": 5},
                        "actions": {"transfer": {"concurrency": 2}}},
             "share": null, "inFlight": 5, "waiting": 37},
            {"name": "mail", "latest": 1, "breaker": {"state": "closed", "failures": 0},
             "limits": null, "share": 10, "inFlight": 0, "waiting": 0},
            {"name": "old", "latest": 1}
        ]}))
        .expect("a list");
        let text = render_services(&list);
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].contains("LIMITS")
                && lines[0].contains("IN FLIGHT")
                && lines[0].contains("WAITING"),
            "{text}"
        );
        let last = |line: &str, n: usize| {
            let words: Vec<&str> = line.split_whitespace().collect();
            words[words.len() - n..].join(" ")
        };
        assert!(
            lines[1].contains("5 at once, 20/s burst 5; transfer: 2 at once"),
            "{text}"
        );
        assert_eq!(last(lines[1], 2), "5 37", "{text}");
        assert!(lines[2].contains("share 10 at once"), "{text}");
        // A server that does not show limits: dashes.
        assert_eq!(last(lines[3], 3), "- - -", "{text}");
    }

    #[test]
    fn a_shown_definition_is_yaml_that_parses_back() -> Result<(), Box<dyn std::error::Error>> {
        use sas::domain::workflow::{Document, Format, parse_document, parse_value};
        let text = sas::domain::workflow::examples::LOAN_APPLICATION;
        let definition = parse_value(text, Format::Yaml)?;
        let d = DefinitionView {
            name: "loan-application".into(),
            version: 3,
            published_at: at(7),
            definition: definition.clone(),
        };
        let yaml = render_definition_yaml(&d)?;
        assert!(
            yaml.starts_with("# loan-application v3, published 2025-01-02T03:04:07Z\n"),
            "{yaml}"
        );
        // The definition's own layout: the name first, the steps last.
        let name = yaml.find("name: loan-application").unwrap_or(usize::MAX);
        let steps = yaml.find("\nsteps:").unwrap_or(0);
        assert!(name < steps, "{yaml}");
        let back = parse_document(parse_value(&yaml, Format::Yaml)?)?;
        assert!(matches!(back, Document::Workflow(_)), "{back:?}");
        assert_eq!(back, parse_document(definition)?);

        // A definition this version cannot read is still shown.
        let odd = DefinitionView {
            name: "w".into(),
            version: 1,
            published_at: None,
            definition: json!({"name": "w", "futureField": [1, 2]}),
        };
        let yaml = render_definition_yaml(&odd)?;
        assert!(yaml.starts_with("# w v1\n"), "{yaml}");
        assert_eq!(parse_value(&yaml, Format::Yaml)?, odd.definition);
        let text = render_definition_json(&odd)?;
        assert_eq!(serde_json::from_str::<Value>(&text)?, odd.definition);

        // JSON too parses back, the name first.
        let text = render_definition_json(&d)?;
        assert!(
            text.starts_with("{\n  \"name\": \"loan-application\""),
            "{text}"
        );
        let back = parse_document(parse_value(&text, Format::Json)?)?;
        assert_eq!(back, parse_document(d.definition.clone())?);
        Ok(())
    }
}
