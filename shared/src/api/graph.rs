//! A workflow drawn as a graph: SVG rendered on the server (as Step Functions' console draws its
//! graph view), for the console's workflow and task pages.
//!
//! Steps are boxes from top to bottom between a start and an end. A choice is a diamond whose
//! cases stand side by side, each under its condition (and `otherwise`; a choice without one has
//! a lane where no case holds), joined again below; parallel branches stand side by side between
//! a fork bar and a join bar. A box says what marks its step: its service and action, its `when`,
//! its forEach (a stacked box, with its list and `maxConcurrency`), its undo, the pivot.
//!
//! With a task ([`TaskView`], the operator API's answer), every step is coloured by its status,
//! in the console badges' kinds ([`kind`]), and says its status in words with an icon (colour is
//! never the only signal); skipped steps and the cases not taken are greyed, and the edges the
//! task went along are drawn thick. Every text is escaped (maud), long ones are cut with their
//! whole text in a `<title>`. No script; the same input gives the same bytes.

use super::views::TaskView;
use crate::domain::mapping::Mapping;
use crate::domain::state::Decision;
use crate::domain::workflow::{GroupKind, Step, Wait, Workflow};
use maud::{Markup, html};
use std::collections::HashMap;
use std::ops::Range;

/// A step's box width.
const BOX_W: i32 = 232;
/// A text line's height.
const LINE: i32 = 16;
/// A box's height beyond its lines.
const BOX_PAD: i32 = 12;
/// Between two nodes of a sequence.
const GAP: i32 = 30;
/// Between two lanes of a group.
const LANE_GAP: i32 = 24;
/// The narrowest lane (an empty case still has one).
const LANE_MIN: i32 = 160;
/// A lane's label band (its case's condition, `otherwise`, its branch's name).
const LANE_HEAD: i32 = 30;
const DIAMOND_W: i32 = 168;
const DIAMOND_H: i32 = 56;
/// A parallel group's head: its name and the fork bar.
const FORK_H: i32 = 28;
const BAR_H: i32 = 6;
/// A group's join (a circle or a bar).
const JOIN_H: i32 = 12;
const TERMINAL_W: i32 = 76;
const TERMINAL_H: i32 = 26;
const MARGIN: i32 = 16;
/// An estimate of a character's width at the graph's 12px, to cut what would not fit.
const CHAR_W: i32 = 7;
/// A stacked (forEach) box's offset.
const STACK: i32 = 5;

/// A state's kind, as the console's badges colour it: `ok`, `bad`, `warn`, `done`, `busy`.
pub fn kind(state: &str) -> &'static str {
    match state {
        "Processed" | "Done" | "closed" => "ok",
        "Error" | "CompensationFailed" | "Failed" | "TimedOut" | "Faulted" | "open" => "bad",
        "Compensating" | "Compensated" | "Refused" | "Cancelled" | "half-open" | "paused" => "warn",
        "Resolved" | "Skipped" => "done",
        _ => "busy",
    }
}

/// A step status's icon, said next to its word.
fn icon(status: &str) -> &'static str {
    match status {
        "Done" => "✓",
        "Failed" => "✗",
        "TimedOut" => "⌛",
        "Cancelled" => "⊘",
        "Faulted" => "⚠",
        "Running" => "▶",
        "Waiting" => "‖",
        "Skipped" => "↷",
        _ => "○",
    }
}

/// The colour of a kind outside the console (the SVG alone); the console's stylesheet sets
/// its own, light or dark.
fn colour(kind: &str) -> &'static str {
    match kind {
        "ok" => "#1a7f37",
        "bad" => "#cf222e",
        "warn" => "#9a6700",
        "busy" => "#0b5cad",
        "done" => "#6e40c9",
        _ => "#59636e",
    }
}

const LINE_COLOUR: &str = "#afb8c1";
const TAKEN_COLOUR: &str = "#0b5cad";

/// The SVG of `workflow`; with `task`, the task's path through it.
pub fn render(workflow: &Workflow, task: Option<&TaskView>) -> String {
    let graph = Graph {
        w: workflow,
        path: task.map(|t| Path::of(workflow, t)),
    };
    graph.svg().into_string()
}

/// A node of a sequence: a step, or a group and its lanes.
enum Node {
    Step(usize),
    Group(usize, Vec<Lane>),
}

/// An arm of a group (`None`: the lane of a choice without `otherwise` where no case holds).
struct Lane {
    arm: Option<usize>,
    nodes: Vec<Node>,
}

/// The nodes of the sequence of steps `span` in `parent` (a group's arm, or the workflow's own
/// sequence): its steps, and its groups in their place.
fn sequence(w: &Workflow, parent: Option<(usize, usize)>, span: Range<usize>) -> Vec<Node> {
    let mut groups = w
        .groups
        .iter()
        .enumerate()
        .filter(|(_, g)| g.parent == parent)
        .peekable();
    let mut out = vec![];
    let mut i = span.start;
    loop {
        // A group starting here comes before the step here: an empty group at `i` was written
        // after step `i - 1` and before step `i`.
        match groups.peek() {
            Some(&(gi, g)) if g.span.start == i => {
                out.push(Node::Group(gi, lanes(w, gi)));
                i = g.span.end.max(i);
                groups.next();
            }
            _ if i < span.end => {
                out.push(Node::Step(i));
                i += 1;
            }
            _ => break,
        }
    }
    out
}

fn lanes(w: &Workflow, gi: usize) -> Vec<Lane> {
    let g = &w.groups[gi];
    let arms = g.kind.arms();
    let mut out: Vec<Lane> = arms
        .iter()
        .enumerate()
        .map(|(k, a)| Lane {
            arm: Some(k),
            nodes: sequence(w, Some((gi, k)), a.span.clone()),
        })
        .collect();
    let no_otherwise = arms.last().is_none_or(|a| a.when.is_some());
    if matches!(g.kind, GroupKind::Choice { .. }) && no_otherwise {
        out.push(Lane {
            arm: None,
            nodes: vec![],
        });
    }
    out
}

/// What a task did, by step and group name.
struct Path<'a> {
    status: HashMap<&'a str, &'a str>,
    undo: HashMap<&'a str, &'a str>,
    decisions: HashMap<&'a str, &'a Decision>,
    current: Option<&'a str>,
    /// Every step is done or skipped: the task went to the end.
    finished: bool,
}

impl<'a> Path<'a> {
    fn of(w: &Workflow, t: &'a TaskView) -> Self {
        let status: HashMap<&str, &str> = t
            .steps
            .iter()
            .map(|s| (s.name.as_str(), s.status.as_str()))
            .collect();
        let finished = w.steps.iter().all(|s| {
            matches!(
                status.get(s.name.as_str()).copied(),
                Some("Done" | "Skipped")
            )
        });
        Self {
            undo: t
                .steps
                .iter()
                .filter_map(|s| Some((s.name.as_str(), s.undo.as_deref()?)))
                .collect(),
            decisions: t.decisions.iter().map(|d| (d.group.as_str(), d)).collect(),
            current: t.current_step.as_deref(),
            finished,
            status,
        }
    }

    fn status(&self, step: &str) -> &'a str {
        self.status.get(step).copied().unwrap_or("Pending")
    }

    /// The task got to the step (a skipped step too: its condition was decided).
    fn reached_step(&self, step: &str) -> bool {
        self.status(step) != "Pending" || self.current == Some(step)
    }
}

struct Graph<'a> {
    w: &'a Workflow,
    path: Option<Path<'a>>,
}

/// One line of text in a box.
struct Text {
    text: String,
    class: &'static str,
}

impl Graph<'_> {
    fn step(&self, i: usize) -> &Step {
        &self.w.steps[i]
    }

    // ---- what the task did

    fn reached(&self, node: &Node) -> bool {
        let Some(p) = &self.path else { return false };
        match node {
            Node::Step(i) => p.reached_step(&self.step(*i).name),
            Node::Group(gi, _) => {
                let g = &self.w.groups[*gi];
                p.decisions.contains_key(g.name.as_str())
                    || self.w.steps[g.span.clone()]
                        .iter()
                        .any(|s| !matches!(p.status(&s.name), "Pending" | "Skipped"))
            }
        }
    }

    /// Whether the task went along the lane `arm` of group `gi` (`None` without a task).
    fn lane_taken(&self, gi: usize, arm: Option<usize>) -> Option<bool> {
        let p = self.path.as_ref()?;
        let g = &self.w.groups[gi];
        let d = p.decisions.get(g.name.as_str());
        Some(match &g.kind {
            GroupKind::Choice { .. } => d.is_some_and(|d| !d.skipped && d.arm == arm),
            GroupKind::Parallel { arms } => {
                d.is_some_and(|d| !d.skipped)
                    || arm.and_then(|k| arms.get(k)).is_some_and(|a| {
                        self.w.steps[a.span.clone()]
                            .iter()
                            .any(|s| !matches!(p.status(&s.name), "Pending" | "Skipped"))
                    })
            }
        })
    }

    /// A step's kind: its status's, `skip` for a skipped step, `todo` for one not reached,
    /// `plain` without a task.
    fn step_kind(&self, s: &Step) -> &'static str {
        match &self.path {
            None => "plain",
            Some(p) => match p.status(&s.name) {
                "Skipped" => "skip",
                "Pending" if p.current != Some(s.name.as_str()) => "todo",
                status => kind(status),
            },
        }
    }

    // ---- sizes

    fn lines(&self, i: usize) -> Vec<Text> {
        let s = self.step(i);
        let mut out = vec![
            Text {
                text: s.name.clone(),
                class: "name",
            },
            Text {
                text: match &s.wait {
                    Some(Wait::For(d)) => format!("wait {}", humantime_of(*d)),
                    Some(Wait::Until(m)) => format!("wait until {}", source(m)),
                    Some(Wait::Event { names, within, .. }) => {
                        format!(
                            "wait for {} (within {})",
                            names.join(" or "),
                            humantime_of(*within)
                        )
                    }
                    None => format!("{}.{}", s.service, s.action),
                },
                class: "meta",
            },
        ];
        if let Some(when) = &s.when {
            out.push(Text {
                text: format!("when {}", when.source()),
                class: "cond",
            });
        }
        if let Some(f) = &s.for_each {
            out.push(Text {
                text: format!("for each {}", source(&f.items)),
                class: "cond",
            });
            out.push(Text {
                text: format!("at most {} at once", f.max_concurrency),
                class: "meta",
            });
        }
        if self.w.pivot == Some(i) {
            out.push(Text {
                text: "◆ pivot".into(),
                class: "pivot-mark",
            });
        }
        if let Some(p) = &self.path {
            let status = p.status(&s.name);
            out.push(Text {
                text: format!("{} {status}", icon(status)),
                class: "status",
            });
        }
        if let Some(u) = &s.undo {
            out.push(Text {
                text: format!("↶ undo {}", u.action),
                class: "undo",
            });
            // How the undo went, once compensation reached the step.
            if let Some(state) = self.path.as_ref().and_then(|p| p.undo.get(s.name.as_str())) {
                out.push(Text {
                    text: format!("undo {} {state}", icon(state)),
                    class: "undo-status",
                });
            }
        }
        out
    }

    fn head_h(&self, gi: usize) -> i32 {
        let g = &self.w.groups[gi];
        let above = self.above(gi).len() as i32 * LINE;
        above
            + match g.kind {
                GroupKind::Choice { .. } => DIAMOND_H,
                GroupKind::Parallel { .. } => FORK_H,
            }
    }

    /// The lines above a group's head: its `when`, and whether the task skipped it.
    fn above(&self, gi: usize) -> Vec<String> {
        let g = &self.w.groups[gi];
        let mut out = vec![];
        if let Some(w) = &g.when {
            out.push(format!("when {}", w.source()));
        }
        if let Some(d) = self
            .path
            .as_ref()
            .and_then(|p| p.decisions.get(g.name.as_str()))
            && d.skipped
        {
            out.push(format!("{} Skipped", icon("Skipped")));
        }
        out
    }

    fn lane_w(&self, lane: &Lane) -> i32 {
        self.seq_size(&lane.nodes).0.max(LANE_MIN)
    }

    fn size(&self, node: &Node) -> (i32, i32) {
        match node {
            Node::Step(i) => {
                // A forEach step's stack stands out below and to the right of its box.
                let stack = if self.step(*i).for_each.is_some() {
                    2 * STACK
                } else {
                    0
                };
                (
                    BOX_W + stack,
                    BOX_PAD + LINE * self.lines(*i).len() as i32 + stack,
                )
            }
            Node::Group(gi, lanes) => self.group_size(*gi, lanes),
        }
    }

    fn group_size(&self, gi: usize, lanes: &[Lane]) -> (i32, i32) {
        let widths: i32 = lanes.iter().map(|l| self.lane_w(l)).sum();
        let w = widths + LANE_GAP * (lanes.len() as i32 - 1).max(0);
        let tallest = lanes
            .iter()
            .map(|l| self.seq_size(&l.nodes).1)
            .max()
            .unwrap_or(0);
        (
            w.max(DIAMOND_W),
            self.head_h(gi) + GAP + LANE_HEAD + tallest + GAP + JOIN_H,
        )
    }

    fn seq_size(&self, nodes: &[Node]) -> (i32, i32) {
        let sizes: Vec<_> = nodes.iter().map(|n| self.size(n)).collect();
        let w = sizes.iter().map(|s| s.0).max().unwrap_or(0);
        let h: i32 = sizes.iter().map(|s| s.1).sum::<i32>() + GAP * (sizes.len() as i32 - 1).max(0);
        (w, h)
    }

    /// Where an edge into the node ends, below its top.
    fn entry(&self, node: &Node) -> i32 {
        match node {
            Node::Step(_) => 0,
            Node::Group(gi, _) => self.above(*gi).len() as i32 * LINE,
        }
    }

    // ---- drawing

    fn svg(&self) -> Markup {
        let top = sequence(self.w, None, 0..self.w.steps.len());
        let (sw, sh) = self.seq_size(&top);
        let width = sw.max(TERMINAL_W) + 2 * MARGIN;
        let height = 2 * MARGIN + 2 * TERMINAL_H + 2 * GAP + sh;
        let cx = width / 2;
        let mut d = Draw::default();
        let started = self.path.is_some();
        let ended = self.path.as_ref().is_some_and(|p| p.finished);
        d.terminal(cx, MARGIN, "Start", "start", started);
        let seq_top = MARGIN + TERMINAL_H + GAP;
        let first_reached = top.first().is_some_and(|n| self.reached(n));
        let first_entry = top.first().map_or(0, |n| self.entry(n));
        d.edge(
            format!("M{cx} {} V{}", MARGIN + TERMINAL_H, seq_top + first_entry),
            first_reached || (top.is_empty() && ended),
            true,
        );
        self.draw_seq(&mut d, &top, cx, seq_top, true, ended);
        let end_top = seq_top + sh + GAP;
        if !top.is_empty() {
            d.edge(format!("M{cx} {} V{end_top}", seq_top + sh), ended, true);
        }
        d.terminal(cx, end_top, "End", "end", ended);
        let title = format!("Workflow {} v{} as a graph", self.w.name, self.w.version);
        let desc = self.describe();
        html! {
            svg xmlns="http://www.w3.org/2000/svg" class="workflow-graph" width=(width) height=(height)
                viewBox={ "0 0 " (width) " " (height) } role="img" aria-labelledby="graph-title graph-desc"
                font-family="system-ui, -apple-system, 'Segoe UI', sans-serif" font-size="12" {
                title id="graph-title" { (title) }
                desc id="graph-desc" { (desc) }
                defs {
                    @for (id, fill) in [("arrow", LINE_COLOUR), ("arrow-taken", TAKEN_COLOUR)] {
                        marker id=(id) class=(id) viewBox="0 0 10 10" refX="9" refY="5" markerUnits="userSpaceOnUse" markerWidth="9" markerHeight="9" orient="auto" {
                            path d="M0 0L10 5L0 10z" fill=(fill) {}
                        }
                    }
                }
                g class="edges" { @for e in &d.edges { (e) } }
                g class="nodes" { @for n in &d.nodes { (n) } }
            }
        }
    }

    /// What the graph shows, in words (for a screen reader: the graph is one image).
    fn describe(&self) -> String {
        let steps: Vec<String> = self
            .w
            .steps
            .iter()
            .map(|s| match &self.path {
                Some(p) => format!("{}: {}", s.name, p.status(&s.name)),
                None => s.name.clone(),
            })
            .collect();
        let groups: Vec<String> = self
            .w
            .groups
            .iter()
            .map(|g| {
                let what = match g.kind {
                    GroupKind::Choice { .. } => "a choice",
                    GroupKind::Parallel { .. } => "parallel branches",
                };
                let n = g.kind.arms().len();
                format!("{} is {what} of {n}", g.name)
            })
            .collect();
        let mut out = format!("Steps from top to bottom: {}.", steps.join(", "));
        if !groups.is_empty() {
            out.push_str(&format!(" Groups: {}.", groups.join(", ")));
        }
        out
    }

    /// Draws `nodes` from `y` down, centred on `cx`. `taken`: the task went along this sequence
    /// (or there is no task); `left`: the task went past its end.
    fn draw_seq(&self, d: &mut Draw, nodes: &[Node], cx: i32, y: i32, taken: bool, left: bool) {
        let mut y = y;
        for (k, node) in nodes.iter().enumerate() {
            let (_, h) = self.size(node);
            let next = nodes.get(k + 1);
            let node_left = match next {
                Some(n) => self.reached(n),
                None => left,
            };
            match node {
                Node::Step(i) => self.draw_step(d, *i, cx, y),
                Node::Group(gi, lanes) => self.draw_group(d, *gi, lanes, cx, y, taken, node_left),
            }
            if let Some(n) = next {
                d.edge(
                    format!("M{cx} {} V{}", y + h, y + h + GAP + self.entry(n)),
                    taken && self.reached(n),
                    true,
                );
            }
            y += h + GAP;
        }
    }

    fn draw_step(&self, d: &mut Draw, i: usize, cx: i32, y: i32) {
        let s = self.step(i);
        let lines = self.lines(i);
        let h = BOX_PAD + LINE * lines.len() as i32;
        let x = cx - BOX_W / 2;
        let k = self.step_kind(s);
        let status = self.path.as_ref().map(|p| p.status(&s.name));
        let undo = self
            .path
            .as_ref()
            .and_then(|p| p.undo.get(s.name.as_str()).copied());
        let chars = ((BOX_W - 16) / CHAR_W) as usize;
        let title: Vec<&str> = lines.iter().map(|l| l.text.as_str()).collect();
        let pivot = self.w.pivot == Some(i);
        d.nodes.push(html! {
            g class={ "node k-" (k) @if pivot { " pivot" } @if s.for_each.is_some() { " for-each" } }
                data-step=(s.name) data-status=[status] {
                title { (title.join("\n")) }
                @if s.for_each.is_some() {
                    @for off in [2 * STACK, STACK] {
                        rect class="stack" x=(x + off) y=(y + off) width=(BOX_W) height=(h) rx="6"
                            fill="#ffffff" stroke=(colour(k)) {}
                    }
                }
                rect class="box" x=(x) y=(y) width=(BOX_W) height=(h) rx="6" fill="#ffffff"
                    stroke=(colour(k)) stroke-width=(if pivot { "3" } else { "1.5" })
                    stroke-dasharray=[(k == "skip").then_some("5 3")] {}
                @for (n, l) in lines.iter().enumerate() {
                    @let undo_kind = (l.class == "undo-status").then(|| undo.map(kind)).flatten();
                    text class={ (l.class) @if let Some(u) = undo_kind { " u-" (u) } } x=(cx) y=(y + 6 + LINE * (n as i32 + 1) - 4) text-anchor="middle"
                        fill=(match (l.class, undo_kind) {
                            ("status", _) => colour(k),
                            (_, Some(u)) => colour(u),
                            ("name", _) => "#1b1f24",
                            _ => "#59636e",
                        })
                        font-weight=[matches!(l.class, "name" | "status" | "undo-status").then_some("600")] {
                        (fit(&l.text, chars))
                    }
                }
            }
        });
    }

    #[allow(clippy::too_many_arguments)]
    fn draw_group(
        &self,
        d: &mut Draw,
        gi: usize,
        lanes: &[Lane],
        cx: i32,
        y: i32,
        taken: bool,
        left: bool,
    ) {
        let g = &self.w.groups[gi];
        let (_, gh) = self.group_size(gi, lanes);
        let above = self.above(gi);
        let head_top = y + above.len() as i32 * LINE;
        let head_bottom = y + self.head_h(gi);
        let decision = self
            .path
            .as_ref()
            .and_then(|p| p.decisions.get(g.name.as_str()));
        let decided = match decision {
            None => None,
            Some(d) if d.skipped => Some("skipped".to_owned()),
            Some(d) => Some(match d.arm {
                Some(_) if d.otherwise => "otherwise".to_owned(),
                Some(k) => format!("case-{k}"),
                None if matches!(g.kind, GroupKind::Parallel { .. }) => "all".to_owned(),
                None => "none".to_owned(),
            }),
        };
        let k = match (&self.path, decision) {
            (None, _) => "plain",
            (Some(_), Some(d)) if d.skipped => "skip",
            (Some(_), Some(_)) => "ok",
            (Some(_), None) => "todo",
        };
        // The lanes, left to right.
        let widths: Vec<i32> = lanes.iter().map(|l| self.lane_w(l)).collect();
        let total: i32 = widths.iter().sum::<i32>() + LANE_GAP * (lanes.len() as i32 - 1).max(0);
        let mut x = cx - total / 2;
        let centres: Vec<i32> = widths
            .iter()
            .map(|w| {
                let c = x + w / 2;
                x += w + LANE_GAP;
                c
            })
            .collect();
        let lanes_top = head_bottom + GAP;
        let join_top = y + gh - JOIN_H;
        let join_y = join_top + JOIN_H / 2;
        let kind_word = match g.kind {
            GroupKind::Choice { .. } => "choice",
            GroupKind::Parallel { .. } => "parallel",
        };
        let mut title = format!("{kind_word} {}", g.name);
        for a in &above {
            title.push('\n');
            title.push_str(a);
        }
        d.nodes.push(html! {
            g class={ "group k-" (k) } data-group=(g.name) data-kind=(kind_word) data-decision=[decided] {
                title { (title) }
                @for (n, a) in above.iter().enumerate() {
                    text class=(if n == 0 && g.when.is_some() { "cond" } else { "status" }) x=(cx + 8) y=(y + LINE * (n as i32 + 1) - 4)
                        fill=(colour(k)) { (fit(a, 40)) }
                }
                @match g.kind {
                    GroupKind::Choice { .. } => {
                        @let (t, b, l, r, m) = (head_top, head_top + DIAMOND_H, cx - DIAMOND_W / 2, cx + DIAMOND_W / 2, head_top + DIAMOND_H / 2);
                        polygon class="box" points={ (cx) "," (t) " " (r) "," (m) " " (cx) "," (b) " " (l) "," (m) }
                            fill="#ffffff" stroke=(colour(k)) stroke-width="1.5" stroke-dasharray=[(k == "skip").then_some("5 3")] {}
                        text class="meta" x=(cx) y=(m - 5) text-anchor="middle" fill="#59636e" { "choice" }
                        text class="name" x=(cx) y=(m + 11) text-anchor="middle" font-weight="600" fill="#1b1f24" { (fit(&g.name, 18)) }
                        circle class="join" cx=(cx) cy=(join_y) r="5" fill="#ffffff" stroke=(colour(k)) stroke-width="1.5" {}
                    }
                    GroupKind::Parallel { .. } => {
                        @let (l, r) = (centres.first().copied().unwrap_or(cx) - 24, centres.last().copied().unwrap_or(cx) + 24);
                        text class="name" x=(cx) y=(head_top + 14) text-anchor="middle" font-weight="600" fill="#1b1f24" { "parallel · " (fit(&g.name, 24)) }
                        rect class="bar" x=(l) y=(head_bottom - BAR_H) width=(r - l) height=(BAR_H) rx="2" fill=(colour(k)) {}
                        rect class="bar" x=(l) y=(join_y - BAR_H / 2) width=(r - l) height=(BAR_H) rx="2" fill=(colour(k)) {}
                    }
                }
            }
        });
        let fork_y = head_bottom + GAP / 2;
        for (lane, &ax) in lanes.iter().zip(&centres) {
            let lane_taken = self.lane_taken(gi, lane.arm);
            let on = taken && lane_taken == Some(true);
            let (_, lh) = self.seq_size(&lane.nodes);
            let content_top = lanes_top + LANE_HEAD;
            let out = left && on;
            match lane.nodes.first() {
                Some(first) => {
                    d.edge(
                        format!(
                            "M{cx} {head_bottom} V{fork_y} H{ax} V{}",
                            content_top + self.entry(first)
                        ),
                        on,
                        true,
                    );
                    d.edge(
                        format!("M{ax} {} V{join_y} H{cx}", content_top + lh),
                        out,
                        false,
                    );
                }
                None => d.edge(
                    format!("M{cx} {head_bottom} V{fork_y} H{ax} V{join_y} H{cx}"),
                    out,
                    false,
                ),
            }
            let label = self.lane_label(gi, lane.arm);
            let chars = ((self.lane_w(lane) - 12) / CHAR_W) as usize;
            let shown = fit(&label, chars);
            let half = (shown.chars().count() as i32 * CHAR_W) / 2 + 6;
            d.nodes.push(html! {
                g class={ "lane" @match lane_taken { Some(true) => " taken", Some(false) => " untaken", None => "" } }
                    data-group=(g.name) data-arm=(lane.arm.map_or("none".to_owned(), |k| k.to_string()))
                    data-taken=[lane_taken.map(|t| t.to_string())] {
                    title { (label) }
                    rect class="label-bg" x=(ax - half) y=(lanes_top + 2) width=(2 * half) height=(LINE + 4) rx="4" fill="#ffffff" {}
                    text class="case" x=(ax) y=(lanes_top + LINE + 1) text-anchor="middle"
                        fill=(if lane_taken == Some(false) { "#8c959f" } else { "#1b1f24" }) font-style="italic" { (shown) }
                }
            });
            self.draw_seq(d, &lane.nodes, ax, content_top, on, out);
        }
    }

    /// A lane's label: its case's condition, `otherwise`, where no case holds, or its
    /// branch's name.
    fn lane_label(&self, gi: usize, arm: Option<usize>) -> String {
        let g = &self.w.groups[gi];
        let Some(k) = arm else {
            return "no case holds".into();
        };
        let a = &g.kind.arms()[k];
        match (&g.kind, &a.when, &a.name) {
            (GroupKind::Choice { .. }, Some(w), _) => format!("when {}", w.source()),
            (GroupKind::Choice { .. }, None, _) => "otherwise".into(),
            (GroupKind::Parallel { .. }, _, Some(n)) => n.clone(),
            (GroupKind::Parallel { .. }, _, None) => format!("branch-{k}"),
        }
    }
}

/// The graph's pieces, edges under nodes.
#[derive(Default)]
struct Draw {
    edges: Vec<Markup>,
    nodes: Vec<Markup>,
}

impl Draw {
    fn edge(&mut self, path: String, taken: bool, arrow: bool) {
        let marker = arrow.then_some(if taken {
            "url(#arrow-taken)"
        } else {
            "url(#arrow)"
        });
        self.edges.push(html! {
            path class={ "edge" @if taken { " taken" } } d=(path) fill="none"
                stroke=(if taken { TAKEN_COLOUR } else { LINE_COLOUR })
                stroke-width=(if taken { "3" } else { "1.5" }) marker-end=[marker] {}
        });
    }

    fn terminal(&mut self, cx: i32, y: i32, label: &str, class: &str, reached: bool) {
        let k = if reached { "ok" } else { "plain" };
        self.nodes.push(html! {
            g class={ "terminal " (class) @if reached { " reached" } } {
                rect class="box" x=(cx - TERMINAL_W / 2) y=(y) width=(TERMINAL_W) height=(TERMINAL_H)
                    rx=(TERMINAL_H / 2) fill="#ffffff" stroke=(colour(k)) stroke-width="1.5" {}
                text x=(cx) y=(y + TERMINAL_H / 2 + 4) text-anchor="middle" fill="#1b1f24" { (label) }
            }
        });
    }
}

/// A mapping's text: its query as written (a forEach's list).
/// A wait's length as written (`14days`, `1h 30m`).
fn humantime_of(d: chrono::Duration) -> String {
    d.to_std()
        .map(|d| humantime::format_duration(d).to_string())
        .unwrap_or_default()
}

fn source(m: &Mapping) -> String {
    match m {
        Mapping::Query { source, .. } => source.clone(),
        other => format!("{other:?}"),
    }
}

/// `text` cut to `chars` characters, with an ellipsis if cut.
fn fit(text: &str, chars: usize) -> String {
    if text.chars().count() <= chars {
        text.to_owned()
    } else {
        let mut out: String = text.chars().take(chars.saturating_sub(1)).collect();
        out.push('…');
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::policy::Policy;
    use crate::domain::workflow::{Format, parse_value, parse_workflow};
    use serde_json::{Value, json};
    use std::collections::BTreeMap;

    /// A choice with a case of two steps and an `otherwise`, a conditional step whose condition
    /// holds what must be escaped, undos and a pivot.
    const TRIAGE: &str = r#"name: triage
steps:
  - {name: reserve, service: inventory, undo: {action: release}}
  - name: payment
    choice:
      - when: "input.amount > 500"
        steps:
          - {name: check-credit, service: credit-bureau}
          - {name: charge-card, service: payment, action: charge, undo: {action: refund}}
    otherwise:
      steps:
        - {name: send-invoice, service: payment, action: invoice}
  - name: express
    service: shipping
    when: "input.note != '<b>&\"'"
  - {name: ship, service: shipping, pivot: true}
"#;

    /// Parallel branches (one named, one not) and a forEach step: compiled, though this
    /// version does not run them yet.
    const TRIP: &str = r#"name: trip
input:
  type: object
  properties:
    travellers: {type: array}
steps:
  - name: book
    parallel:
      - name: air
        steps:
          - {name: flight, service: inventory}
      - steps:
          - {name: hotel, service: inventory}
          - {name: breakfast, service: inventory}
  - name: insure
    service: payment
    forEach: $.input.travellers
    maxConcurrency: 4
    input: {who: $.element}
"#;

    fn workflow(text: &str) -> Workflow {
        let value = parse_value(text, Format::Yaml).expect("YAML");
        parse_workflow(value)
            .expect("a workflow")
            .validate(None, &Policy::default())
            .expect("valid")
    }

    fn task(steps: &[(&str, &str)], decisions: Value, current: Option<&str>) -> TaskView {
        serde_json::from_value(json!({
            "taskId": "t-1",
            "processState": "Processing",
            "currentStep": current,
            "steps": steps.iter().map(|(n, s)| json!({"name": n, "status": s})).collect::<Vec<_>>(),
            "decisions": decisions,
        }))
        .expect("a task view")
    }

    /// An element of the SVG: its name, attributes, own text, and parent.
    #[derive(Debug)]
    struct El {
        name: String,
        attrs: BTreeMap<String, String>,
        text: String,
        parent: Option<usize>,
    }

    fn unescape(s: &str) -> String {
        s.replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&quot;", "\"")
            .replace("&#39;", "'")
            .replace("&amp;", "&")
    }

    /// The SVG's elements, in document order; panics unless it is well-formed XML.
    fn parse(svg: &str) -> Vec<El> {
        use xmlparser::{ElementEnd, Token, Tokenizer};
        let mut out: Vec<El> = vec![];
        let mut open: Vec<usize> = vec![];
        for token in Tokenizer::from(svg) {
            match token.expect("well-formed XML") {
                Token::ElementStart { local, .. } => {
                    out.push(El {
                        name: local.to_string(),
                        attrs: BTreeMap::new(),
                        text: String::new(),
                        parent: open.last().copied(),
                    });
                    open.push(out.len() - 1);
                }
                Token::Attribute { local, value, .. } => {
                    let at = *open.last().expect("in an element");
                    let previous = out[at]
                        .attrs
                        .insert(local.to_string(), unescape(value.as_str()));
                    assert!(previous.is_none(), "attribute {local} twice");
                }
                Token::ElementEnd { end, .. } => match end {
                    ElementEnd::Open => {}
                    ElementEnd::Empty => {
                        open.pop();
                    }
                    ElementEnd::Close(_, local) => {
                        let at = open.pop().expect("a closing tag closes an element");
                        assert_eq!(out[at].name, local.as_str(), "tags nest");
                    }
                },
                Token::Text { text } => {
                    if let Some(&at) = open.last() {
                        out[at].text.push_str(&unescape(text.as_str()));
                    }
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        assert!(open.is_empty(), "every element is closed");
        assert_eq!(out[0].name, "svg");
        out
    }

    impl El {
        fn attr(&self, key: &str) -> &str {
            self.attrs.get(key).map(String::as_str).unwrap_or("")
        }
        fn classes(&self) -> Vec<&str> {
            self.attr("class").split_whitespace().collect()
        }
        fn num(&self, key: &str) -> i32 {
            self.attr(key).parse().expect(key)
        }
    }

    fn within(els: &[El], mut at: usize, ancestor: usize) -> bool {
        while let Some(p) = els[at].parent {
            if p == ancestor {
                return true;
            }
            at = p;
        }
        false
    }

    /// The elements inside `at`.
    fn inside(els: &[El], at: usize) -> Vec<&El> {
        (at + 1..els.len())
            .filter(|&i| within(els, i, at))
            .map(|i| &els[i])
            .collect()
    }

    /// The text of the `<text>` elements inside `at`, a line each (titles left out).
    fn lines(els: &[El], at: usize) -> Vec<String> {
        inside(els, at)
            .into_iter()
            .filter(|e| e.name == "text")
            .map(|e| e.text.clone())
            .collect()
    }

    fn step_node(els: &[El], name: &str) -> usize {
        let found: Vec<usize> = (0..els.len())
            .filter(|&i| els[i].attr("data-step") == name)
            .collect();
        assert_eq!(found.len(), 1, "one node for {name}");
        found[0]
    }

    fn lane(els: &[El], group: &str, arm: &str) -> usize {
        (0..els.len())
            .find(|&i| {
                els[i].classes().contains(&"lane")
                    && els[i].attr("data-group") == group
                    && els[i].attr("data-arm") == arm
            })
            .unwrap_or_else(|| panic!("a lane {arm} of {group}"))
    }

    /// The box of a step's node.
    fn step_box<'e>(els: &'e [El], name: &str) -> &'e El {
        let node = step_node(els, name);
        inside(els, node)
            .into_iter()
            .find(|e| e.classes().contains(&"box"))
            .expect("a box")
    }

    /// Where a path's drawing ends.
    fn end_of(d: &str) -> (i32, i32) {
        let (mut x, mut y) = (0, 0);
        let mut parts = d.split_whitespace();
        let mut first = true;
        while let Some(p) = parts.next() {
            let (cmd, n) = p.split_at(1);
            let n: i32 = n.parse().expect("a number");
            match cmd {
                "M" if first => {
                    x = n;
                    y = parts.next().expect("y").parse().expect("y");
                }
                "V" => y = n,
                "H" => x = n,
                _ => panic!("unexpected {p} in {d}"),
            }
            first = false;
        }
        (x, y)
    }

    fn edges(els: &[El]) -> Vec<&El> {
        els.iter()
            .filter(|e| e.classes().contains(&"edge"))
            .collect()
    }

    /// The edge that ends with an arrow at the top centre of `name`'s box.
    fn edge_into<'e>(els: &'e [El], name: &str) -> &'e El {
        let b = step_box(els, name);
        let top = (b.num("x") + b.num("width") / 2, b.num("y"));
        let into: Vec<&El> = edges(els)
            .into_iter()
            .filter(|e| !e.attr("marker-end").is_empty() && end_of(e.attr("d")) == top)
            .collect();
        assert_eq!(into.len(), 1, "one edge into {name}");
        into[0]
    }

    #[test]
    fn every_step_is_a_node_in_order_and_every_node_has_one_edge_in() {
        let w = workflow(TRIAGE);
        let els = parse(&render(&w, None));
        let names: Vec<&str> = els
            .iter()
            .filter_map(|e| e.attrs.get("data-step").map(String::as_str))
            .collect();
        assert_eq!(
            names,
            [
                "reserve",
                "check-credit",
                "charge-card",
                "send-invoice",
                "express",
                "ship"
            ]
        );
        // An arrow into every step, the choice and the end; a line out of each lane.
        let arrows = edges(&els)
            .into_iter()
            .filter(|e| !e.attr("marker-end").is_empty())
            .count();
        assert_eq!(arrows, w.steps.len() + w.groups.len() + 1);
        assert_eq!(edges(&els).len() - arrows, 2, "one line out of each lane");
        for s in &w.steps {
            edge_into(&els, &s.name);
        }
        // Without a task: no status, nothing taken.
        assert!(els.iter().all(|e| !e.attrs.contains_key("data-status")));
        assert!(edges(&els).iter().all(|e| !e.classes().contains(&"taken")));
        // The case's steps stand one under the other, the cases side by side.
        let (credit, card, invoice) = (
            step_box(&els, "check-credit"),
            step_box(&els, "charge-card"),
            step_box(&els, "send-invoice"),
        );
        assert_eq!(credit.num("x"), card.num("x"));
        assert!(card.num("y") > credit.num("y") + credit.num("height"));
        assert_eq!(credit.num("y"), invoice.num("y"));
        assert!(invoice.num("x") >= credit.num("x") + credit.num("width"));
        // The same workflow gives the same bytes.
        assert_eq!(render(&w, None), render(&w, None));
    }

    #[test]
    fn a_box_shows_its_steps_marks_and_a_choice_its_cases() {
        let w = workflow(TRIAGE);
        let svg = render(&w, None);
        assert!(
            svg.contains("when input.note != '&lt;b&gt;&amp;&quot;'") && !svg.contains("<b>"),
            "a condition's text is escaped"
        );
        let els = parse(&svg);
        let reserve = lines(&els, step_node(&els, "reserve"));
        assert_eq!(reserve, ["reserve", "inventory.reserve", "↶ undo release"]);
        let ship = step_node(&els, "ship");
        assert!(els[ship].classes().contains(&"pivot"));
        assert!(lines(&els, ship).iter().any(|l| l.starts_with("◆ pivot")));
        assert_eq!(step_box(&els, "ship").attr("stroke-width"), "3");
        let express = lines(&els, step_node(&els, "express"));
        assert_eq!(express[2], "when input.note != '<b>&\"'");
        let choice = els
            .iter()
            .position(|e| e.attr("data-group") == "payment" && e.classes().contains(&"group"))
            .expect("the choice");
        assert_eq!(els[choice].attr("data-kind"), "choice");
        assert!(inside(&els, choice).iter().any(|e| e.name == "polygon"));
        assert_eq!(
            lines(&els, lane(&els, "payment", "0")),
            ["when input.amount > 500"]
        );
        assert_eq!(lines(&els, lane(&els, "payment", "1")), ["otherwise"]);
        assert!(
            !els.iter().any(|e| e.attr("data-arm") == "none"),
            "a choice with otherwise has no lane where no case holds"
        );
    }

    #[test]
    fn a_tasks_steps_are_coloured_by_status_and_its_path_is_drawn() {
        let w = workflow(TRIAGE);
        let t = task(
            &[
                ("reserve", "Done"),
                ("check-credit", "Skipped"),
                ("charge-card", "Skipped"),
                ("send-invoice", "Done"),
                ("express", "Skipped"),
                ("ship", "Failed"),
            ],
            json!([{"group": "payment", "arm": 1, "otherwise": true}]),
            Some("ship"),
        );
        let els = parse(&render(&w, Some(&t)));
        for (name, status, kind, said) in [
            ("reserve", "Done", "ok", "✓ Done"),
            ("check-credit", "Skipped", "skip", "↷ Skipped"),
            ("send-invoice", "Done", "ok", "✓ Done"),
            ("express", "Skipped", "skip", "↷ Skipped"),
            ("ship", "Failed", "bad", "✗ Failed"),
        ] {
            let node = step_node(&els, name);
            assert_eq!(els[node].attr("data-status"), status, "{name}");
            assert!(
                els[node].classes().contains(&format!("k-{kind}").as_str()),
                "{name}: {:?}",
                els[node].classes()
            );
            let said_in_box = inside(&els, node)
                .into_iter()
                .find(|e| e.classes().contains(&"status"))
                .map(|e| e.text.clone());
            assert_eq!(said_in_box.as_deref(), Some(said), "{name}");
            // Outside the console the colour is the badge's.
            let b = step_box(&els, name);
            assert_eq!(b.attr("stroke"), colour(kind), "{name}");
            assert_eq!(
                b.attr("stroke-dasharray") == "5 3",
                kind == "skip",
                "{name}"
            );
        }
        // The case not taken is greyed, `otherwise` taken.
        let (case, otherwise) = (lane(&els, "payment", "0"), lane(&els, "payment", "1"));
        assert!(els[case].classes().contains(&"untaken"));
        assert_eq!(els[case].attr("data-taken"), "false");
        assert!(els[otherwise].classes().contains(&"taken"));
        // The path: into the invoice, not into the case not taken; into the skipped step (its
        // condition was decided) and the failed one; not to the end.
        let taken = |name: &str| edge_into(&els, name).classes().contains(&"taken");
        assert!(taken("reserve") && taken("send-invoice") && taken("express") && taken("ship"));
        assert!(!taken("check-credit") && !taken("charge-card"));
        let end = els
            .iter()
            .find(|e| e.classes().contains(&"end"))
            .expect("the end");
        assert!(!end.classes().contains(&"reached"));
        assert_eq!(
            edges(&els)
                .iter()
                .filter(|e| e.classes().contains(&"taken"))
                .count(),
            // start→reserve→choice→invoice, out of the otherwise lane, →express→ship.
            6
        );
    }

    #[test]
    fn steps_not_reached_wait_apart_from_the_current_one_and_undos_say_how_they_went() {
        let w = workflow(TRIAGE);
        let t = task(
            &[
                ("reserve", "Done"),
                ("check-credit", "Running"),
                ("charge-card", "Pending"),
                ("send-invoice", "Skipped"),
                ("express", "Pending"),
                ("ship", "Pending"),
            ],
            json!([{"group": "payment", "arm": 0}]),
            Some("check-credit"),
        );
        let mut t = t;
        t.steps[0].undo = Some("Failed".into());
        let els = parse(&render(&w, Some(&t)));
        let kind_of = |name: &str| {
            els[step_node(&els, name)]
                .classes()
                .into_iter()
                .find(|c| c.starts_with("k-"))
                .map(str::to_owned)
        };
        assert_eq!(kind_of("check-credit").as_deref(), Some("k-busy"));
        assert_eq!(kind_of("charge-card").as_deref(), Some("k-todo"));
        assert_eq!(kind_of("ship").as_deref(), Some("k-todo"));
        let reserve = step_node(&els, "reserve");
        assert_eq!(
            lines(&els, reserve)[2..],
            ["✓ Done", "↶ undo release", "undo ✗ Failed"]
        );
        let undo = inside(&els, reserve)
            .into_iter()
            .find(|e| e.classes().contains(&"undo-status"))
            .expect("the undo's status");
        assert!(undo.classes().contains(&"u-bad"));
        assert_eq!(undo.attr("fill"), colour("bad"));
        assert!(els[lane(&els, "payment", "0")].classes().contains(&"taken"));
        assert!(
            els[lane(&els, "payment", "1")]
                .classes()
                .contains(&"untaken")
        );
    }

    #[test]
    fn a_choice_without_otherwise_has_a_lane_where_no_case_holds() {
        let w = workflow(
            "name: w\nsteps:\n  - {name: a, service: s}\n  - name: c\n    choice:\n      - when: input.x\n        steps: [{name: b, service: s}]\n",
        );
        let t = task(
            &[("a", "Done"), ("b", "Skipped")],
            json!([{"group": "c"}]),
            None,
        );
        let els = parse(&render(&w, Some(&t)));
        let none = lane(&els, "c", "none");
        assert_eq!(lines(&els, none), ["no case holds"]);
        assert_eq!(els[none].attr("data-taken"), "true");
        assert_eq!(els[lane(&els, "c", "0")].attr("data-taken"), "false");
        let end = els
            .iter()
            .find(|e| e.classes().contains(&"end"))
            .expect("the end");
        assert!(
            end.classes().contains(&"reached"),
            "every step done or skipped"
        );
    }

    #[test]
    fn parallel_branches_stand_side_by_side_between_bars_and_a_for_each_is_stacked() {
        let w = workflow(TRIP);
        let els = parse(&render(&w, None));
        let group = els
            .iter()
            .position(|e| e.attr("data-group") == "book" && e.classes().contains(&"group"))
            .expect("the parallel group");
        assert_eq!(els[group].attr("data-kind"), "parallel");
        let bars = inside(&els, group)
            .into_iter()
            .filter(|e| e.classes().contains(&"bar"))
            .count();
        assert_eq!(bars, 2, "a fork bar and a join bar");
        assert_eq!(lines(&els, lane(&els, "book", "0")), ["air"]);
        assert_eq!(lines(&els, lane(&els, "book", "1")), ["branch-1"]);
        let (flight, hotel, breakfast) = (
            step_box(&els, "flight"),
            step_box(&els, "hotel"),
            step_box(&els, "breakfast"),
        );
        assert_eq!(flight.num("y"), hotel.num("y"), "branches start together");
        assert!(hotel.num("x") >= flight.num("x") + flight.num("width"));
        assert_eq!(hotel.num("x"), breakfast.num("x"));
        for s in &w.steps {
            edge_into(&els, &s.name);
        }
        let insure = step_node(&els, "insure");
        assert!(els[insure].classes().contains(&"for-each"));
        let stacked = inside(&els, insure)
            .into_iter()
            .filter(|e| e.classes().contains(&"stack"))
            .count();
        assert_eq!(stacked, 2);
        assert_eq!(
            lines(&els, insure)[2..],
            ["for each $.input.travellers", "at most 4 at once"]
        );
        // A task in the group: every branch is on its path.
        let t = task(
            &[
                ("flight", "Done"),
                ("hotel", "Done"),
                ("breakfast", "Running"),
                ("insure", "Pending"),
            ],
            json!([{"group": "book"}]),
            Some("breakfast"),
        );
        let els = parse(&render(&w, Some(&t)));
        for arm in ["0", "1"] {
            assert_eq!(els[lane(&els, "book", arm)].attr("data-taken"), "true");
        }
        let taken = |name: &str| edge_into(&els, name).classes().contains(&"taken");
        assert!(taken("flight") && taken("hotel") && taken("breakfast"));
        assert!(!taken("insure"), "the group is not done");
    }

    #[test]
    fn long_text_is_cut_with_the_whole_in_its_title() {
        let long = format!("input.note == '{}'", "x".repeat(80));
        let w = workflow(&format!(
            "name: w\nsteps:\n  - name: a\n    service: s\n    when: \"{long}\"\n"
        ));
        let els = parse(&render(&w, None));
        let node = step_node(&els, "a");
        let cut = &lines(&els, node)[2];
        assert!(cut.ends_with('…') && cut.chars().count() < 40, "{cut}");
        let title = inside(&els, node)
            .into_iter()
            .find(|e| e.name == "title")
            .expect("a title");
        assert!(title.text.contains(&long));
    }

    /// Compares `svg` with the file `testdata/name` (`UPDATE_GOLDEN=1` writes it
    /// again): what a change to the drawing changes is seen in review.
    fn assert_golden(svg: &str, name: &str) {
        let golden = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("src/api/testdata")
            .join(name);
        if std::env::var_os("UPDATE_GOLDEN").is_some() {
            std::fs::write(&golden, svg).expect("write the golden file");
        }
        let kept = std::fs::read_to_string(&golden).expect(name);
        assert_eq!(svg, kept, "{name}: UPDATE_GOLDEN=1 writes it again");
    }

    #[test]
    fn the_graphs_are_as_kept() {
        let w = workflow(TRIAGE);
        let t = task(
            &[
                ("reserve", "Done"),
                ("check-credit", "Done"),
                ("charge-card", "Done"),
                ("send-invoice", "Skipped"),
                ("express", "Skipped"),
                ("ship", "Running"),
            ],
            json!([{"group": "payment", "arm": 0}]),
            Some("ship"),
        );
        assert_golden(&render(&w, Some(&t)), "graph-triage.svg");
        assert_golden(&render(&workflow(TRIP), None), "graph-trip.svg");
    }
}
