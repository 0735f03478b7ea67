//! A schedule: tasks of a workflow started with a fixed input at the times of a cron or rate
//! expression, read in a named time zone. The expression is EventBridge Scheduler's own syntax,
//! so the deployment hands it to Scheduler unchanged and `sas-local` reads it the same way
//! ([`Schedule::latest_run`]).

use super::problem::{DefinitionError, Problem};
use chrono::{DateTime, SubsecRound, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::fmt;
use std::str::FromStr;

/// A schedule as written and stored (one version in the catalog).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScheduleDef {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The workflow whose newest version each run starts.
    pub workflow: String,
    /// Every run's task input.
    #[serde(default = "empty_object")]
    pub input: Value,
    /// `cron(minutes hours day-of-month month day-of-week year)` or `rate(N unit)`.
    pub expression: String,
    /// An IANA time zone name.
    #[serde(default = "utc")]
    pub timezone: String,
    #[serde(default)]
    pub overlap: Overlap,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
}

fn empty_object() -> Value {
    Value::Object(serde_json::Map::new())
}

fn utc() -> String {
    "UTC".to_owned()
}

/// A file of schedules (`schedules: [...]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchedulesDoc {
    pub schedules: Vec<ScheduleDef>,
}

/// What a run does while the schedule's previous task has not ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Overlap {
    /// The run starts nothing (the default: a nightly job never runs twice at once).
    #[default]
    Skip,
    /// Every run starts a task.
    Allow,
}

/// When a schedule runs.
#[derive(Debug, Clone)]
enum Times {
    Cron(Box<croner::Cron>),
    /// Every `period`, counted from `since` (when this version was published).
    Rate(chrono::Duration),
}

/// A schedule whose expression and time zone were read: what runs it.
#[derive(Debug, Clone)]
pub struct Schedule {
    pub def: ScheduleDef,
    times: Times,
    zone: chrono_tz::Tz,
    /// When this version was published: a rate counts its periods from here.
    pub since: DateTime<Utc>,
}

impl PartialEq for Schedule {
    fn eq(&self, other: &Self) -> bool {
        self.def == other.def && self.since == other.since
    }
}

/// The shortest period of a rate, as EventBridge Scheduler allows it.
const MIN_RATE_MINUTES: i64 = 1;

impl Schedule {
    /// Reads `def`'s expression and time zone (`since`: when this version was published).
    /// Problems are reported at `at` + the field's pointer.
    pub fn parse(
        def: ScheduleDef,
        since: DateTime<Utc>,
        at: &str,
    ) -> Result<Self, DefinitionError> {
        let mut problems = vec![];
        let zone = chrono_tz::Tz::from_str(&def.timezone).map_err(|_| Problem {
            at: format!("{at}/timezone"),
            message: format!(
                "{:?} is not an IANA time zone (e.g. Europe/Berlin, UTC)",
                def.timezone
            ),
        });
        let times = parse_expression(&def.expression).map_err(|message| Problem {
            at: format!("{at}/expression"),
            message,
        });
        if !def.input.is_object() {
            problems.push(Problem {
                at: format!("{at}/input"),
                message: "a task's input is a JSON object".into(),
            });
        }
        match (zone, times) {
            (Ok(zone), Ok(times)) if problems.is_empty() => Ok(Self {
                def,
                times,
                zone,
                since,
            }),
            (zone, times) => {
                problems.extend(zone.err());
                problems.extend(times.err());
                Err(DefinitionError(problems))
            }
        }
    }

    pub fn name(&self) -> &str {
        &self.def.name
    }

    /// The first run after `t` (`None`: none is left, e.g. a cron's years are over).
    pub fn next_run(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match &self.times {
            Times::Cron(cron) => cron
                .find_next_occurrence(&t.trunc_subsecs(0).with_timezone(&self.zone), false)
                .ok()
                .map(|d| d.with_timezone(&Utc)),
            Times::Rate(period) => {
                let periods = if t < self.since {
                    0
                } else {
                    (t - self.since).num_milliseconds() / period.num_milliseconds()
                };
                Some(self.since + *period * i32::try_from(periods + 1).ok()?)
            }
        }
    }

    /// The latest run in `(after, until]`, if any: what a runner that last looked at `after`
    /// fires now. Runs missed in between are not made up (EventBridge Scheduler does not
    /// either), so a runner that was down starts one task, not a burst.
    pub fn latest_run(&self, after: DateTime<Utc>, until: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let run = match &self.times {
            Times::Cron(cron) => cron
                .find_previous_occurrence(&until.trunc_subsecs(0).with_timezone(&self.zone), true)
                .ok()
                .map(|d| d.with_timezone(&Utc))?,
            Times::Rate(period) => {
                if until < self.since + *period {
                    return None;
                }
                let periods = (until - self.since).num_milliseconds() / period.num_milliseconds();
                self.since + *period * i32::try_from(periods).ok()?
            }
        };
        (run > after && run <= until).then_some(run)
    }
}

/// Reads `cron(...)` or `rate(...)` as EventBridge Scheduler does.
fn parse_expression(expression: &str) -> Result<Times, String> {
    let inner = |prefix: &str| {
        expression
            .strip_prefix(prefix)
            .and_then(|s| s.strip_suffix(')'))
            .map(str::trim)
    };
    if let Some(fields) = inner("cron(") {
        parse_cron(fields).map(|c| Times::Cron(Box::new(c)))
    } else if let Some(rate) = inner("rate(") {
        parse_rate(rate).map(Times::Rate)
    } else if expression.starts_with("at(") {
        Err("a one-time run is a delayed start: submit the task with a Start-At header".into())
    } else {
        Err("`cron(minutes hours day-of-month month day-of-week year)` or `rate(N unit)`".into())
    }
}

/// Six fields, as Scheduler reads them: minutes, hours, day of month, month, day of week
/// (1-7 = SUN-SAT, or the names), year; one of the two day fields is `?`.
fn parse_cron(fields: &str) -> Result<croner::Cron, String> {
    let parts: Vec<&str> = fields.split_whitespace().collect();
    if parts.len() != 6 {
        return Err(format!(
            "a cron expression has six fields (minutes hours day-of-month month day-of-week year), not {}",
            parts.len()
        ));
    }
    if (parts[2] == "?") == (parts[4] == "?") {
        return Err("one of day-of-month and day-of-week must be `?` (and only one)".into());
    }
    // croner reads seconds first: every run is on the minute.
    croner::parser::CronParser::builder()
        .seconds(croner::parser::Seconds::Required)
        .year(croner::parser::Year::Required)
        .alternative_weekdays(true)
        .build()
        .parse(&format!("0 {}", parts.join(" ")))
        .map_err(|e| format!("not a cron expression: {e}"))
}

/// `N minute[s]|hour[s]|day[s]`: the unit singular for 1, plural otherwise.
fn parse_rate(rate: &str) -> Result<chrono::Duration, String> {
    let bad = || {
        format!(
            "{rate:?}: a rate is `N minutes`, `N hours` or `N days` (`1 minute`, `1 hour`, `1 day`)"
        )
    };
    let (n, unit) = rate.split_once(' ').ok_or_else(bad)?;
    let n: i64 = n.parse().map_err(|_| bad())?;
    if !(1..=366 * 24 * 60).contains(&n) {
        return Err(bad());
    }
    let (singular, minutes) = match unit.trim() {
        "minute" => (true, 1),
        "minutes" => (false, 1),
        "hour" => (true, 60),
        "hours" => (false, 60),
        "day" => (true, 24 * 60),
        "days" => (false, 24 * 60),
        _ => return Err(bad()),
    };
    if singular != (n == 1) || n * minutes < MIN_RATE_MINUTES || n * minutes > 366 * 24 * 60 {
        return Err(bad());
    }
    Ok(chrono::Duration::minutes(n * minutes))
}

/// A schedule as the catalog keeps its newest version: live, or deleted (a tombstone version, so
/// the history of a name stays and a name can be used again).
#[derive(Debug, Clone, PartialEq)]
pub enum Stored {
    Live(ScheduleDef),
    Deleted,
}

impl Stored {
    /// The body of a deletion.
    pub fn tombstone(name: &str) -> Value {
        serde_json::json!({"name": name, "deleted": true})
    }

    /// Reads a stored body.
    pub fn from_body(body: Value) -> Result<Self, serde_json::Error> {
        if body.get("deleted") == Some(&Value::Bool(true)) {
            return Ok(Self::Deleted);
        }
        serde_json::from_value(body).map(Self::Live)
    }
}

impl fmt::Display for Overlap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Skip => "skip",
            Self::Allow => "allow",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schedule(expression: &str, timezone: &str) -> Result<Schedule, DefinitionError> {
        let def = ScheduleDef {
            name: "nightly".into(),
            description: None,
            workflow: "reconcile".into(),
            input: empty_object(),
            expression: expression.into(),
            timezone: timezone.into(),
            overlap: Overlap::Skip,
            paused: false,
        };
        Schedule::parse(def, utc_at("2026-11-01T00:00:30Z"), "/schedules/0")
    }

    fn utc_at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s)
            .expect("a time")
            .with_timezone(&Utc)
    }

    /// 02:00 in Berlin is 01:00 UTC in winter and 00:00 UTC in summer.
    #[test]
    fn a_cron_runs_in_its_time_zone_across_a_daylight_saving_change() {
        let s = schedule("cron(0 2 * * ? *)", "Europe/Berlin").expect("valid");
        assert_eq!(
            s.next_run(utc_at("2026-11-27T03:00:00Z")),
            Some(utc_at("2026-11-28T01:00:00Z"))
        );
        assert_eq!(
            s.next_run(utc_at("2027-06-01T03:00:00Z")),
            Some(utc_at("2027-06-02T00:00:00Z"))
        );
        // The runner's window: the latest run in (after, until], none when it holds no run.
        let t = utc_at("2026-11-28T01:00:00Z");
        assert_eq!(s.latest_run(t - chrono::Duration::seconds(1), t), Some(t));
        assert_eq!(s.latest_run(t, t + chrono::Duration::seconds(59)), None);
        // Down for three days: one run, the latest, not three.
        assert_eq!(
            s.latest_run(t, t + chrono::Duration::days(3)),
            Some(t + chrono::Duration::days(3))
        );
    }

    /// Day-of-week as Scheduler reads it: 1 is Sunday, 2-6 MON-FRI; names alike.
    #[test]
    fn day_of_week_counts_from_sunday_as_scheduler_does() {
        let weekdays = schedule("cron(30 9 ? * 2-6 *)", "UTC").expect("valid");
        // 2026-11-28 is a Saturday: the next run is Monday the 30th.
        assert_eq!(
            weekdays.next_run(utc_at("2026-11-27T10:00:00Z")),
            Some(utc_at("2026-11-30T09:30:00Z"))
        );
        let named = schedule("cron(30 9 ? * MON-FRI *)", "UTC").expect("valid");
        assert_eq!(
            named.next_run(utc_at("2026-11-27T10:00:00Z")),
            Some(utc_at("2026-11-30T09:30:00Z"))
        );
        let sunday = schedule("cron(0 12 ? * 1 *)", "UTC").expect("valid");
        assert_eq!(
            sunday.next_run(utc_at("2026-11-27T10:00:00Z")),
            Some(utc_at("2026-11-29T12:00:00Z"))
        );
        // The last day of the month, and a year that ends the schedule.
        let last = schedule("cron(0 0 L * ? 2026)", "UTC").expect("valid");
        assert_eq!(
            last.next_run(utc_at("2026-11-27T10:00:00Z")),
            Some(utc_at("2026-11-30T00:00:00Z"))
        );
        assert_eq!(last.next_run(utc_at("2026-12-31T00:00:00Z")), None);
    }

    #[test]
    fn a_rate_counts_its_periods_from_its_publication() {
        let s = schedule("rate(15 minutes)", "UTC").expect("valid");
        let since = utc_at("2026-11-01T00:00:30Z");
        assert_eq!(
            s.next_run(since),
            Some(since + chrono::Duration::minutes(15))
        );
        assert_eq!(
            s.next_run(since + chrono::Duration::minutes(15)),
            Some(since + chrono::Duration::minutes(30))
        );
        assert_eq!(
            s.latest_run(since, since + chrono::Duration::minutes(14)),
            None
        );
        assert_eq!(
            s.latest_run(since, since + chrono::Duration::minutes(31)),
            Some(since + chrono::Duration::minutes(30))
        );
        assert!(schedule("rate(1 day)", "UTC").is_ok());
    }

    #[test]
    fn bad_expressions_and_zones_are_named() {
        for (expression, zone, at, says) in [
            ("cron(0 2 * * * *)", "UTC", "/expression", "must be `?`"),
            ("cron(0 2 ? * ? *)", "UTC", "/expression", "must be `?`"),
            ("cron(0 2 * * ?)", "UTC", "/expression", "six fields"),
            ("cron(0 25 * * ? *)", "UTC", "/expression", "not a cron"),
            ("rate(1 minutes)", "UTC", "/expression", "a rate is"),
            ("rate(5 minute)", "UTC", "/expression", "a rate is"),
            ("rate(0 hours)", "UTC", "/expression", "a rate is"),
            ("rate(2 weeks)", "UTC", "/expression", "a rate is"),
            ("at(2026-12-01T09:00:00)", "UTC", "/expression", "Start-At"),
            ("every day", "UTC", "/expression", "cron("),
            ("cron(0 2 * * ? *)", "Europe/Atlantis", "/timezone", "IANA"),
        ] {
            let e = schedule(expression, zone).expect_err(expression);
            assert_eq!(e.0[0].at, format!("/schedules/0{at}"), "{expression}");
            assert!(e.0[0].message.contains(says), "{expression}: {e:?}");
        }
    }

    #[test]
    fn a_deleted_schedule_is_a_tombstone() {
        assert_eq!(
            Stored::from_body(Stored::tombstone("nightly")).expect("reads"),
            Stored::Deleted
        );
        let live = serde_json::json!({"name": "n", "workflow": "w", "expression": "rate(1 day)"});
        match Stored::from_body(live).expect("reads") {
            Stored::Live(def) => {
                assert_eq!(def.timezone, "UTC");
                assert_eq!(def.overlap, Overlap::Skip);
                assert_eq!(def.input, empty_object());
            }
            other => panic!("{other:?}"),
        }
    }
}
