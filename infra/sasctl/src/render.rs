//! Plain-text rendering: aligned columns sized to their content, `-` for absent values, and
//! control characters in server-provided text replaced so they cannot garble the terminal.

use crate::api::{ListPage, OrderSummary, OrderView};
use chrono::{DateTime, SecondsFormat, Utc};
use std::fmt::Write as _;

/// The widest `LAST ERROR` cell of [`render_list`], in characters, `…` included.
pub const LAST_ERROR_WIDTH: usize = 60;
/// The widest `REASON` cell of the history table and last error of a watch line.
pub const REASON_WIDTH: usize = 80;
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

fn summary_row(o: &OrderSummary) -> Vec<String> {
    vec![
        clean(&o.order_id, usize::MAX),
        clean(o.process_state.as_str(), usize::MAX),
        opt(o.step.as_deref(), usize::MAX),
        num(o.failure_count),
        time(o.updated_at.as_ref()),
        opt(o.last_error.as_deref(), LAST_ERROR_WIDTH),
    ]
}

/// A page of orders as a table:
/// `ORDER ID  STATE  STEP  FAILURES  UPDATED  LAST ERROR`, or `no orders` when empty.
/// The next-page hint is left to the caller, which knows the command line.
pub fn render_list(page: &ListPage) -> String {
    if page.orders.is_empty() {
        return "no orders\n".to_owned();
    }
    let mut rows = vec![header(&[
        "ORDER ID",
        "STATE",
        "STEP",
        "FAILURES",
        "UPDATED",
        "LAST ERROR",
    ])];
    rows.extend(page.orders.iter().map(summary_row));
    use Align::{Left, Right};
    table(&rows, &[Left, Left, Left, Right, Left, Left])
}

/// One order: a summary block, the steps table, then the history table.
pub fn render_order(o: &OrderView) -> String {
    let items = if o.items.is_empty() {
        NONE.to_owned()
    } else {
        o.items
            .iter()
            .map(|i| format!("{} x{}", clean(&i.sku, usize::MAX), i.quantity))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let summary = [
        ("order", clean(&o.order_id, usize::MAX)),
        ("customer", opt(o.customer_id.as_deref(), usize::MAX)),
        ("state", clean(o.process_state.as_str(), usize::MAX)),
        ("step", opt(o.step.as_deref(), usize::MAX)),
        ("failures", num(o.failure_count)),
        ("attempt", num(o.attempt)),
        ("created", time(o.created_at.as_ref())),
        ("updated", time(o.updated_at.as_ref())),
        ("items", items),
        // The full error: `show` is where an operator reads it.
        ("last error", opt(o.last_error.as_deref(), usize::MAX)),
    ]
    .into_iter()
    .map(|(k, v)| vec![format!("{k}:"), v])
    .collect::<Vec<_>>();
    let mut out = table(&summary, &[]);

    out.push_str("\nSTEPS\n");
    if o.steps.is_empty() {
        out.push_str("(none)\n");
    } else {
        let mut rows = vec![header(&["#", "NAME", "STATUS", "UNDO"])];
        rows.extend(o.steps.iter().enumerate().map(|(i, s)| {
            let current = o.step.as_deref() == Some(s.name.as_str());
            let marker = if current { ">" } else { "" };
            vec![
                format!("{marker}{}", i + 1),
                clean(&s.name, usize::MAX),
                clean(&s.status, usize::MAX),
                opt(s.undo.as_deref(), usize::MAX),
            ]
        }));
        out.push_str(&table(&rows, &[Align::Right]));
    }

    out.push_str("\nHISTORY\n");
    if o.history.is_empty() {
        out.push_str("(none)\n");
    } else {
        let mut rows = vec![header(&["AT", "FROM", "TO", "STEP", "ATTEMPT", "REASON"])];
        rows.extend(o.history.iter().map(|h| {
            vec![
                time(Some(&h.at)),
                opt(h.from.as_ref().map(|s| s.as_str()), usize::MAX),
                clean(h.to.as_str(), usize::MAX),
                opt(h.step.as_deref(), usize::MAX),
                num(h.attempt),
                opt(h.reason.as_deref(), REASON_WIDTH),
            ]
        }));
        use Align::{Left, Right};
        out.push_str(&table(&rows, &[Left, Left, Left, Left, Right, Left]));
    }
    out
}

/// The width of the state in a watch line: the longest documented state, CompensationFailed.
const STATE_WIDTH: usize = 18;

/// One `watch` line: `<updated>  <state>  step=<step>  failures=<n>  attempt=<n>[  error=<e>]`.
pub fn render_watch_line(o: &OrderView) -> String {
    let mut line = format!(
        "{}  {:<w$}  step={}  failures={}  attempt={}",
        time(o.updated_at.as_ref()),
        clean(o.process_state.as_str(), usize::MAX),
        opt(o.step.as_deref(), usize::MAX),
        num(o.failure_count),
        num(o.attempt),
        w = STATE_WIDTH,
    );
    if let Some(e) = o.last_error.as_deref().filter(|e| !e.trim().is_empty()) {
        let _ = write!(line, "  error={}", clean(e, REASON_WIDTH));
    }
    line.push('\n');
    line
}

/// The confirmation of an action or the end of a watch: `order <id>: <state>`.
pub fn render_confirmation(o: &OrderView) -> String {
    format!(
        "order {}: {}\n",
        clean(&o.order_id, usize::MAX),
        clean(o.process_state.as_str(), usize::MAX)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{HistoryEntry, Item, ProcessState, StepView};
    use chrono::TimeZone;

    fn at(secs: u32) -> Option<DateTime<Utc>> {
        Utc.with_ymd_and_hms(2025, 1, 2, 3, 4, secs).single()
    }

    fn row(
        id: &str,
        state: ProcessState,
        step: Option<&str>,
        failures: Option<u32>,
    ) -> OrderSummary {
        OrderSummary {
            order_id: id.into(),
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
        let mut long = row("order-2", ProcessState::CompensationFailed, None, Some(12));
        long.last_error = Some("payment declined".into());
        let page = ListPage {
            orders: vec![
                row("o1", ProcessState::Error, Some("charge-payment"), Some(2)),
                long,
            ],
            next_cursor: Some("c".into()),
        };
        let out = render_list(&page);
        let expected = "\
ORDER ID  STATE               STEP            FAILURES  UPDATED               LAST ERROR
o1        Error               charge-payment         2  2025-01-02T03:04:05Z  -
order-2   CompensationFailed  -                     12  2025-01-02T03:04:05Z  payment declined
";
        assert_eq!(out, expected);
        assert!(out.lines().all(|l| l == l.trim_end()), "no trailing spaces");
    }

    #[test]
    fn list_truncates_long_errors_and_cleans_control_characters() {
        let mut r = row("o1", ProcessState::Error, None, None);
        r.last_error = Some(format!("line one\nline\ttwo\u{1b}[31m {}", "x".repeat(200)));
        let out = render_list(&ListPage {
            orders: vec![r],
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
        assert_eq!(render_list(&ListPage::default()), "no orders\n");
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

    fn view() -> OrderView {
        OrderView {
            order_id: "3f2a".into(),
            process_state: ProcessState::Error,
            customer_id: Some("cust-1".into()),
            items: vec![
                Item {
                    sku: "SKU-1".into(),
                    quantity: 2,
                },
                Item {
                    sku: "SKU-2".into(),
                    quantity: 1,
                },
            ],
            step: Some("charge-payment".into()),
            failure_count: Some(2),
            attempt: Some(3),
            last_error: Some("card declined".into()),
            created_at: at(1),
            updated_at: at(9),
            steps: vec![
                StepView {
                    name: "reserve-inventory".into(),
                    status: "Done".into(),
                    undo: None,
                },
                StepView {
                    name: "charge-payment".into(),
                    status: "Failed".into(),
                    undo: Some("Running".into()),
                },
            ],
            history: vec![
                HistoryEntry {
                    at: at(1).unwrap_or_default(),
                    from: None,
                    to: ProcessState::Pending,
                    step: None,
                    attempt: None,
                    reason: Some("submitted".into()),
                },
                HistoryEntry {
                    at: at(2).unwrap_or_default(),
                    from: Some(ProcessState::Pending),
                    to: ProcessState::Processing,
                    step: Some("reserve-inventory".into()),
                    attempt: Some(1),
                    reason: Some("claimed".into()),
                },
            ],
        }
    }

    #[test]
    fn order_has_summary_steps_and_history() {
        let expected = "\
order:       3f2a
customer:    cust-1
state:       Error
step:        charge-payment
failures:    2
attempt:     3
created:     2025-01-02T03:04:01Z
updated:     2025-01-02T03:04:09Z
items:       SKU-1 x2, SKU-2 x1
last error:  card declined

STEPS
 #  NAME               STATUS  UNDO
 1  reserve-inventory  Done    -
>2  charge-payment     Failed  Running

HISTORY
AT                    FROM     TO          STEP               ATTEMPT  REASON
2025-01-02T03:04:01Z  -        Pending     -                        -  submitted
2025-01-02T03:04:02Z  Pending  Processing  reserve-inventory        1  claimed
";
        assert_eq!(render_order(&view()), expected);
    }

    #[test]
    fn minimal_order_renders_dashes() {
        let o = OrderView {
            order_id: "o1".into(),
            process_state: ProcessState::Pending,
            customer_id: None,
            items: vec![],
            step: None,
            failure_count: None,
            attempt: None,
            last_error: None,
            created_at: None,
            updated_at: None,
            steps: vec![],
            history: vec![],
        };
        let out = render_order(&o);
        assert!(out.contains("customer:    -\n"), "{out}");
        assert!(out.contains("STEPS\n(none)\n\nHISTORY\n(none)\n"), "{out}");
        assert_eq!(
            render_watch_line(&o),
            "-  Pending             step=-  failures=-  attempt=-\n"
        );
        assert_eq!(render_confirmation(&o), "order o1: Pending\n");
    }

    #[test]
    fn watch_line_shows_the_error() {
        assert_eq!(
            render_watch_line(&view()),
            "2025-01-02T03:04:09Z  Error               step=charge-payment  failures=2  attempt=3  error=card declined\n"
        );
    }
}
