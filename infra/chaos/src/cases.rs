//! Chaos cases beside the main run ([`crate::harness`]): each drives one construct that the
//! main run's workflows do not reach hard enough, on an in-memory system behind the
//! failpoints, and checks the guarantee it must keep (docs/guarantees.md):
//!
//! - `schedules`: [`overlapping_runs`], a schedule's runs delivered twice, late and at once
//!   while its tasks are slow and fail into `Error` for an operator: under `overlap: skip`,
//!   never two of its tasks not ended at once.
//! - `group_deadlines`: [`deadlines_at_groups`], tasks of a parallel group with a tight task
//!   deadline, one branch's service paused or slow: every record keeps its invariants, and an
//!   operator's skip or retry never rewrites a step that was done.
//!
//! - `gates`: [`hot_gate`], one account's tasks at a concurrency gate of 1 while its service
//!   is slow and refuses some: one at a time, in the order submitted, none stuck in line.
//!
//! `world` is what both share: the system, its failpoints and the operator API.

mod gates;
mod group_deadlines;
mod schedules;
mod world;

pub use gates::{HotGate, HotGateReport, hot_gate};
pub use group_deadlines::{GroupDeadlines, GroupDeadlinesReport, deadlines_at_groups};
pub use schedules::{OverlappingRuns, OverlappingRunsReport, overlapping_runs};
