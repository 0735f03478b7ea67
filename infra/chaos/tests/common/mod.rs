//! What every chaos run in the tests must show, shared by this package's tests and the
//! black-box suite's `tests/chaos.rs` (which includes this file by path).

/// Prints the run's table and asserts that it broke no invariant, that each workflow got its
/// share of the `tasks` (task `i` is of workflow `i % 4`) and took effect, and that tasks
/// with payloads were purged at their retention's end.
pub fn assert_clean(report: &sas_chaos::Report, tasks: usize) {
    println!("{}", report.table());
    let violations = report.violations();
    assert!(violations.is_empty(), "{violations:#?}\n{}", report.table());
    let n = sas_chaos::WORKFLOWS.len();
    for (k, name) in sas_chaos::WORKFLOWS.into_iter().enumerate() {
        let w = &report.workflows[name];
        let share = (tasks + n - 1 - k) / n;
        assert_eq!(w.accepted, share, "{name}\n{}", report.table());
        assert!(w.effects > 0, "{name} took no effect\n{}", report.table());
    }
    // One order in 8 keeps its input by reference: of a large run, some end final, and their
    // retention's end purged them (that nothing outlived it is a violation above; a small run
    // may have no such task end final).
    if tasks >= 500 {
        assert!(report.purged > 0, "no task purged\n{}", report.table());
    }
}
