//! Concurrency gates: at most `limit` tasks of one workflow with one value of its concurrency
//! key hold the gate at once; the others wait in line in the order they were created. The
//! rules every store applies to its gate items ([`crate::ports::Gates`]).

use super::TaskId;

/// A place in line: when the task was created (ms), then its id.
pub type InLine = (i64, TaskId);

/// How many may still be admitted: the room `holders` leave under `limit`.
pub fn room(holders: usize, limit: u32) -> usize {
    (limit as usize).saturating_sub(holders)
}

/// Whether a task with `ahead` tasks before it in line is admitted to a gate `holders` hold:
/// there is room, and it is among the first in line for that room.
pub fn admits(holders: usize, ahead: usize, limit: u32) -> bool {
    ahead < room(holders, limit)
}

/// The tasks now first in line (sorted, as a store keeps them) for the room left: those to
/// send on once a task left.
pub fn next_in_line(holders: usize, line: &[InLine], limit: u32) -> Vec<TaskId> {
    line.iter()
        .take(room(holders, limit))
        .map(|(_, id)| *id)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_in_line_are_admitted_while_there_is_room_and_no_one_jumps_the_line() {
        assert!(admits(0, 0, 1));
        assert!(!admits(1, 0, 1), "full");
        assert!(!admits(0, 1, 1), "another waits before it");
        assert!(admits(1, 1, 3), "two places left, one before it");
        assert!(!admits(1, 2, 3));
        assert!(!admits(4, 0, 3), "over a lowered limit: full");
        let line: Vec<InLine> = (0..4).map(|i| (i, TaskId::new_random())).collect();
        assert_eq!(next_in_line(1, &line, 3), vec![line[0].1, line[1].1]);
        assert!(next_in_line(3, &line, 3).is_empty());
    }
}
