//! The crash points a run must reach (a run that never crashed there proved nothing about
//! them).

use crate::harness::report::Report;

/// The crash points every run of a few hundred tasks reaches.
pub const REQUIRED_POINTS: [&str; 9] = [
    "create",
    "put:claimed",
    "put:step done",
    "put:outbox cleared",
    "send:work",
    "send:agent",
    "send:replies",
    "send:timers",
    "publish:TaskProcessed",
];

/// Every required crash point was reached (that each reached point also crashed is
/// [`Report::violations`]'s to tell).
pub(super) fn check_reached(report: &mut Report) {
    report.unreached = REQUIRED_POINTS
        .iter()
        .filter(|p| !report.points.contains_key(**p))
        .map(|p| p.to_string())
        .collect();
}
