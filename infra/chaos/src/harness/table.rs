//! The report as markdown tables ([`Report::table`]): the checks with what each must be, then
//! per workflow, latencies, per service, the failed steps, and the crash points.

use super::report::Report;
use sas::ProcessState;

/// The terminal states, in the order the tables show them.
const TERMINAL: [ProcessState; 6] = [
    ProcessState::Processed,
    ProcessState::Refused,
    ProcessState::Compensated,
    ProcessState::CompensationFailed,
    ProcessState::Error,
    ProcessState::Resolved,
];

impl Report {
    /// The report as markdown tables.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let mut row = |k: &str, v: String, must: &str| {
            out.push_str(&format!("| {k} | {v} | {must} |\n"));
        };
        row("tasks submitted", self.submitted.to_string(), "");
        row("tasks accepted", self.accepted.to_string(), "= submitted");
        for (state, n) in &self.states {
            row(&format!("final state {state}"), n.to_string(), "");
        }
        row(
            "slowest task (submission to last write)",
            format!("{:.1} s", self.slowest.as_secs_f64()),
            "",
        );
        row("lost", self.lost.len().to_string(), "0");
        if !self.waiting.is_empty() {
            row(
                "waiting for the service that is down",
                self.waiting.len().to_string(),
                "",
            );
        }
        for (what, n) in [
            ("keys applied more than once", self.doubled.len()),
            ("wrong net effects", self.wrong_net.len()),
            (
                "tasks off the path their input implies",
                self.off_path.len(),
            ),
            (
                "steps committed after their undo (leaked)",
                self.leaked.len(),
            ),
            ("terminal records still locked", self.locked_terminal.len()),
            ("records breaking an invariant", self.invalid.len()),
        ] {
            row(what, n.to_string(), "0");
        }
        row(
            "forEach steps past their maxConcurrency (most elements of one in calls at once)",
            format!(
                "{} ({})",
                self.over_concurrency.len(),
                self.most_elements_in_flight
            ),
            "0",
        );
        row(
            "failed tasks / distinct TaskFailed alerts (deliveries)",
            format!(
                "{} / {} ({})",
                self.failed, self.alerted, self.alert_deliveries
            ),
            "one alert per failure",
        );
        row(
            "re-enqueues after a missed pickup / tasks / most in a row for one task",
            format!(
                "{} / {} / {}",
                self.requeues, self.requeued_tasks, self.max_requeues
            ),
            &format!("most in a row <= {}", self.requeue_limit),
        );
        row(
            "applied writes reported as lost races (and, inherent, overtaken before the retry)",
            format!("{} ({})", self.misreported.len(), self.overtaken),
            "0",
        );
        let (lost, throttled, slowed, batches) = self.edges;
        row(
            "lost responses / throttles / slowed work messages / timed-out batches / publishes refused by a bus outage",
            format!(
                "{lost} / {throttled} / {slowed} / {batches} / {}",
                self.bus_refused
            ),
            "",
        );
        for (what, n) in [
            (
                "messages over SQS's 256 KB / records over DynamoDB's 400 KB",
                self.too_large.len(),
            ),
            (
                "notices on the bus not owed by a record, or owed and never published",
                self.notice_mismatch.len(),
            ),
        ] {
            row(what, n.to_string(), "0");
        }
        let answers: Vec<String> = self
            .events
            .iter()
            .map(|(a, n)| format!("{a} {n}"))
            .collect();
        row(
            "named events delivered, by answer",
            answers.join(", "),
            "each taken once",
        );
        for (what, n) in [
            ("named events mishandled", self.event_violations.len()),
            (
                "tasks gone on past their deadline",
                self.past_deadline.len(),
            ),
            ("tasks that outlived their retention", self.outlived.len()),
        ] {
            row(what, n.to_string(), "0");
        }
        row(
            "tasks with payloads purged at their retention's end",
            self.purged.to_string(),
            "",
        );
        row(
            "tasks failed by their deadline",
            self.deadline_failures.to_string(),
            "",
        );
        let (sent, dup, delayed, lost_timers) = self.messaging;
        row(
            "messages sent / duplicated / delayed / timers lost",
            format!("{sent} / {dup} / {delayed} / {lost_timers}"),
            "",
        );
        row("dead letters", self.dead_letters.to_string(), "");
        let (asked, applied, refused, unavailable) = self.operator;
        let by: Vec<String> = self
            .operator_actions
            .iter()
            .map(|(a, n)| format!("{a} {n}"))
            .collect();
        row(
            "operator actions asked / applied / refused (409) / answered 5xx",
            format!(
                "{asked} / {applied} / {refused} / {unavailable} ({})",
                by.join(", ")
            ),
            "",
        );
        row(
            "elapsed",
            format!("{:.1} s", self.elapsed.as_secs_f64()),
            "",
        );
        let mut t = format!("| check | value | must be |\n|---|---|---|\n{out}");
        t.push_str("\n| workflow | submitted | accepted |");
        for s in TERMINAL {
            t.push_str(&format!(" {s} |"));
        }
        t.push_str(" not terminal | failed / TaskFailed alerts | effects applied |\n|---|---|---|");
        t.push_str(&"---|".repeat(TERMINAL.len() + 3));
        t.push('\n');
        for (name, w) in &self.workflows {
            let terminal: usize = TERMINAL
                .iter()
                .map(|s| w.states.get(s.as_str()).copied().unwrap_or(0))
                .sum();
            t.push_str(&format!("| {name} | {} | {} |", w.submitted, w.accepted));
            for s in TERMINAL {
                t.push_str(&format!(
                    " {} |",
                    w.states.get(s.as_str()).copied().unwrap_or(0)
                ));
            }
            t.push_str(&format!(
                " {} | {} / {} | {} |\n",
                w.accepted - terminal.min(w.accepted),
                w.failed,
                w.alerted,
                w.effects
            ));
        }
        t.push_str(
            "\n| workflow | terminal tasks | p50 submission→terminal | p99 | max |\n|---|---|---|---|---|\n",
        );
        let ms =
            |v: Option<i64>| v.map_or("-".to_owned(), |v| format!("{:.2} s", v as f64 / 1000.0));
        for (name, w) in &self.workflows {
            t.push_str(&format!(
                "| {name} | {} | {} | {} | {} |\n",
                w.latencies_ms.len(),
                ms(w.latency_ms(0.5)),
                ms(w.latency_ms(0.99)),
                ms(w.latencies_ms.last().copied()),
            ));
        }
        t.push_str("\n| service | calls | transient | 409 in progress | 401 misconfigured | late commits | late commits dropped | oversized |\n|---|---|---|---|---|---|---|---|\n");
        for (name, c) in &self.services {
            t.push_str(&format!(
                "| {name} | {} | {} | {} | {} | {} | {} | {} |\n",
                c.calls,
                c.transient,
                c.in_progress,
                c.misconfigured,
                c.late_commits,
                c.late_dropped,
                c.oversized
            ));
        }
        t.push_str("\n| workflow | failed at step | refused | timed out | faulted | ended |\n|---|---|---|---|---|---|\n");
        for ((workflow, i, step), f) in &self.failed_steps {
            let ended: Vec<String> = f.ended.iter().map(|(s, n)| format!("{s} {n}")).collect();
            t.push_str(&format!(
                "| {workflow} | {} `{step}` | {} | {} | {} | {} |\n",
                i + 1,
                f.refused,
                f.timed_out,
                f.faulted,
                ended.join(", ")
            ));
        }
        t.push_str("\n| crash point | reached | crashed |\n|---|---|---|\n");
        for (p, (reached, crashed)) in &self.points {
            t.push_str(&format!("| `{p}` | {reached} | {crashed} |\n"));
        }
        t
    }
}
