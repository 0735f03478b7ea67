//! The chaos harness of sas: seeded remote faults, crash points after every write, and
//! messaging faults, over tasks of the two example workflows and a third with a choice and a condition, with a report of what must never
//! happen (lost tasks, doubled or wrong net effects, locked terminal records, invalid records,
//! alerts that do not match failures). `sas-chaos` is the command; `tests/chaos.rs` runs a
//! smaller seeded run on the AWS adapters against the emulator.

pub mod cases;
pub mod failpoints;
pub mod harness;
pub mod operator;

pub use cases::{
    GroupDeadlines, GroupDeadlinesReport, HotGate, HotGateReport, OverlappingRuns,
    OverlappingRunsReport, deadlines_at_groups, hot_gate, overlapping_runs,
};
pub use failpoints::{Chaos, Plan, Recorder, wrap};
pub use harness::{
    Config, DistributedCase, DistributedReport, ForEachCases, ForEachReport, ORDER_TRIAGE,
    REQUIRED_POINTS, Report, ServiceCounts, ServiceLimit, StepFailures, SubWorkflowReport,
    WORKFLOWS, WorkflowCounts, input, run, run_distributed_case, run_for_each_cases, run_in_memory,
    run_sub_workflow_case, workflow_of,
};
pub use operator::{OperatorLog, OperatorPlan};
