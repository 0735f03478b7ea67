//! Metrics in CloudWatch's embedded metric format (EMF): each observation is one JSON log line
//! on stdout that CloudWatch Logs turns into metrics, with no API call and no client in the
//! handler's path. Every metric goes out under its own dimensions (the workflow, the service)
//! and under the empty dimension set, so stack-wide totals and alarms need no workflow names.
//!
//! The metric names are the dashboard's and the alarms' (`template.yaml`):
//!
//! | Metric | Unit | Dimensions | Emitted by |
//! |---|---|---|---|
//! | `TasksAccepted` | Count | Workflow | submission, a new task |
//! | `TasksProcessed`, `TasksCompensated`, `TasksRefused`, `TasksFailed` (Error), `TasksCompensationFailed`, `TasksResolved` | Count | Workflow | the write that moved the task there |
//! | `StepLatency` | Milliseconds | Workflow, Service | agent, each step's calls (retries included) |
//! | `StepAttempts` | Count | Workflow, Service | agent, calls made for one step request |
//! | `Recoveries` | Count | Workflow, Cause (`timer`, `sweep`, `pickup`) | supervisor |
//! | `BreakerTransitions` | Count | Service, To (`open`, `half-open`, `closed`) | agent, the write that moved a breaker |
//! | `PoisonMessages` | Count | Function | any consumer, a message sent to its dead-letter queue |
//! | `CallbackWaits` | Count | Workflow, Service | scheduler, a step now waiting for its callback |
//! | `SweepsCompleted` | Count | (none) | supervisor, each sweep (its heartbeat) |
//! | `ScheduledRuns` | Count | Schedule, Outcome (`started`, `skipped`) | scheduler, a schedule's run |

use serde_json::{Map, Value, json};
use std::sync::{Arc, Mutex};

/// Every metric the handlers emit (the dashboard and the alarms may name only these).
pub const NAMES: [&str; 16] = [
    "TasksAccepted",
    "TasksProcessed",
    "TasksCompensated",
    "TasksRefused",
    "TasksFailed",
    "TasksCompensationFailed",
    "TasksResolved",
    "StepLatency",
    "StepAttempts",
    "Recoveries",
    "BreakerTransitions",
    "PoisonMessages",
    "CallbackWaits",
    "SweepsCompleted",
    "ScheduledRuns",
    "LimitedCalls",
];

/// A metric's unit, as EMF names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Count,
    Milliseconds,
}

impl Unit {
    fn as_str(self) -> &'static str {
        match self {
            Self::Count => "Count",
            Self::Milliseconds => "Milliseconds",
        }
    }
}

/// Where EMF documents go.
pub trait Sink: Send + Sync {
    fn write(&self, document: &Value);
}

/// Standard output, one document per line: the Lambda runtime ships it to CloudWatch Logs.
pub struct Stdout;

impl Sink for Stdout {
    fn write(&self, document: &Value) {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        // A metric lost to a closed stdout must not fail the handler.
        let _ = writeln!(out, "{document}");
    }
}

/// Keeps the totals of every metric by its dimensions, and the latest documents (the local
/// runner and tests read them). Bounded: totals grow with the dimensions' values, not with
/// time.
#[derive(Default)]
pub struct Memory {
    inner: Mutex<MemoryInner>,
}

#[derive(Default)]
struct MemoryInner {
    totals: std::collections::HashMap<(String, Vec<(String, String)>), f64>,
    recent: std::collections::VecDeque<Value>,
}

/// How many documents [`Memory`] keeps.
const RECENT: usize = 1000;

impl Memory {
    /// The latest documents, oldest first.
    pub fn documents(&self) -> Vec<Value> {
        self.inner
            .lock()
            .map(|i| i.recent.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// The total of metric `name` over every observation whose dimensions include all of
    /// `dims` (`&[]`: all of them).
    pub fn sum(&self, name: &str, dims: &[(&str, &str)]) -> f64 {
        let Ok(inner) = self.inner.lock() else {
            return 0.0;
        };
        inner
            .totals
            .iter()
            .filter(|((n, d), _)| {
                n == name
                    && dims
                        .iter()
                        .all(|(k, v)| d.iter().any(|(dk, dv)| dk == k && dv == v))
            })
            .map(|(_, v)| v)
            .sum()
    }
}

impl Sink for Memory {
    fn write(&self, document: &Value) {
        let Ok(mut inner) = self.inner.lock() else {
            return;
        };
        for directive in document["_aws"]["CloudWatchMetrics"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let keys: Vec<&str> = directive["Dimensions"][0]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            let dims: Vec<(String, String)> = keys
                .iter()
                .map(|k| {
                    (
                        (*k).to_owned(),
                        document[*k].as_str().unwrap_or("").to_owned(),
                    )
                })
                .collect();
            for m in directive["Metrics"].as_array().into_iter().flatten() {
                let name = m["Name"].as_str().unwrap_or("").to_owned();
                let value = document[&name].as_f64().unwrap_or(0.0);
                *inner.totals.entry((name, dims.clone())).or_default() += value;
            }
        }
        if inner.recent.len() == RECENT {
            inner.recent.pop_front();
        }
        inner.recent.push_back(document.clone());
    }
}

/// The metrics of one deployment: a namespace and a sink. Cheap to clone; `off` emits nothing.
#[derive(Clone)]
pub struct Metrics {
    namespace: String,
    sink: Option<Arc<dyn Sink>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("namespace", &self.namespace)
            .field("on", &self.sink.is_some())
            .finish()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::off()
    }
}

impl Metrics {
    pub fn new(namespace: impl Into<String>, sink: Arc<dyn Sink>) -> Self {
        Self {
            namespace: namespace.into(),
            sink: Some(sink),
        }
    }

    pub fn off() -> Self {
        Self {
            namespace: String::new(),
            sink: None,
        }
    }

    /// A Lambda function's metrics: to stdout under `METRICS_NAMESPACE`, or off when it is not
    /// set.
    pub fn from_env() -> Self {
        match std::env::var("METRICS_NAMESPACE") {
            Ok(ns) if !ns.trim().is_empty() => Self::new(ns, Arc::new(Stdout)),
            _ => Self::off(),
        }
    }

    /// Emits `metrics` (name, unit, value) under `dimensions` and under no dimensions.
    pub fn emit(&self, dimensions: &[(&str, &str)], metrics: &[(&str, Unit, f64)]) {
        debug_assert!(
            metrics.iter().all(|(name, _, _)| NAMES.contains(name)),
            "a metric missing from NAMES: {metrics:?}"
        );
        let Some(sink) = &self.sink else { return };
        let now = chrono::Utc::now().timestamp_millis();
        sink.write(&document(&self.namespace, now, dimensions, metrics));
    }

    /// One count of `name` for `workflow`.
    pub fn count(&self, name: &str, dims: &[(&str, &str)]) {
        self.emit(dims, &[(name, Unit::Count, 1.0)]);
    }
}

/// The EMF document for one observation at `timestamp_ms`.
pub fn document(
    namespace: &str,
    timestamp_ms: i64,
    dimensions: &[(&str, &str)],
    metrics: &[(&str, Unit, f64)],
) -> Value {
    let keys: Vec<&str> = dimensions.iter().map(|(k, _)| *k).collect();
    let sets = if keys.is_empty() {
        json!([[]])
    } else {
        json!([keys, []])
    };
    let definitions: Vec<Value> = metrics
        .iter()
        .map(|(name, unit, _)| json!({"Name": name, "Unit": unit.as_str()}))
        .collect();
    let mut root = Map::new();
    root.insert(
        "_aws".into(),
        json!({
            "Timestamp": timestamp_ms.max(0),
            "CloudWatchMetrics": [{
                "Namespace": namespace,
                "Dimensions": sets,
                "Metrics": definitions,
            }],
        }),
    );
    for (k, v) in dimensions {
        // A dimension value must be 1 to 1024 characters: an empty one would drop the metric.
        let v = if v.is_empty() { "-" } else { v };
        root.insert(
            (*k).to_owned(),
            Value::String(v.chars().take(1024).collect()),
        );
    }
    for (name, _, value) in metrics {
        root.insert((*name).to_owned(), json!(value));
    }
    Value::Object(root)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The structure the EMF specification requires (its "MUST"s), as a JSON Schema: the
    /// metadata, directives, dimension sets (at most 30 keys) and metric definitions (at most
    /// 100, with a known unit).
    const EMF_SCHEMA: &str = r#"{
      "type": "object",
      "required": ["_aws"],
      "properties": {
        "_aws": {
          "type": "object",
          "required": ["Timestamp", "CloudWatchMetrics"],
          "properties": {
            "Timestamp": {"type": "integer", "minimum": 0},
            "CloudWatchMetrics": {
              "type": "array",
              "items": {
                "type": "object",
                "required": ["Namespace", "Dimensions", "Metrics"],
                "additionalProperties": false,
                "properties": {
                  "Namespace": {"type": "string", "minLength": 1, "maxLength": 1024, "pattern": "\\S"},
                  "Dimensions": {
                    "type": "array",
                    "items": {"type": "array", "maxItems": 30,
                              "items": {"type": "string", "minLength": 1, "maxLength": 250}}
                  },
                  "Metrics": {
                    "type": "array", "maxItems": 100,
                    "items": {
                      "type": "object", "required": ["Name"], "additionalProperties": false,
                      "properties": {
                        "Name": {"type": "string", "minLength": 1, "maxLength": 1024},
                        "Unit": {"enum": ["Seconds", "Microseconds", "Milliseconds", "Bytes",
                          "Kilobytes", "Megabytes", "Gigabytes", "Terabytes", "Bits", "Kilobits",
                          "Megabits", "Gigabits", "Terabits", "Percent", "Count",
                          "Bytes/Second", "Kilobytes/Second", "Megabytes/Second",
                          "Gigabytes/Second", "Terabytes/Second", "Bits/Second",
                          "Kilobits/Second", "Megabits/Second", "Gigabits/Second",
                          "Terabits/Second", "Count/Second", "None"]},
                        "StorageResolution": {"enum": [1, 60]}
                      }
                    }
                  }
                }
              }
            }
          }
        }
      }
    }"#;

    /// The spec's other MUSTs: every dimension key a string member of the root (1 to 1024
    /// characters), every metric a number member.
    fn check(doc: &Value) -> Result<(), String> {
        let schema: Value = serde_json::from_str(EMF_SCHEMA).map_err(|e| e.to_string())?;
        let validator = jsonschema::validator_for(&schema).map_err(|e| e.to_string())?;
        if let Some(e) = validator.iter_errors(doc).next() {
            return Err(format!("{} at {}", e, e.instance_path()));
        }
        for directive in doc["_aws"]["CloudWatchMetrics"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let sets = directive["Dimensions"].as_array().into_iter().flatten();
            for key in sets.filter_map(Value::as_array).flatten() {
                let key = key.as_str().unwrap_or_default();
                match doc[key].as_str() {
                    Some(v) if (1..=1024).contains(&v.chars().count()) => {}
                    _ => return Err(format!("dimension {key} is not a 1-1024 character string")),
                }
            }
            for m in directive["Metrics"].as_array().into_iter().flatten() {
                let name = m["Name"].as_str().unwrap_or_default();
                if !doc[name].is_number() {
                    return Err(format!("metric {name} has no number value"));
                }
            }
        }
        Ok(())
    }

    #[test]
    fn documents_keep_the_emf_specification() {
        let d = document(
            "sas/dev",
            1_764_000_000_000,
            &[
                ("Workflow", "loan-application"),
                ("Service", "core-banking"),
            ],
            &[
                ("StepLatency", Unit::Milliseconds, 12.5),
                ("StepAttempts", Unit::Count, 2.0),
            ],
        );
        check(&d).expect("valid EMF");
        assert_eq!(
            d["_aws"]["CloudWatchMetrics"][0]["Dimensions"],
            json!([["Workflow", "Service"], []]),
            "per workflow and service, and stack-wide"
        );
        assert_eq!(
            (d["StepLatency"].as_f64(), d["Workflow"].as_str()),
            (Some(12.5), Some("loan-application"))
        );
        let bare = document("sas/dev", 1, &[], &[("SweepsCompleted", Unit::Count, 1.0)]);
        check(&bare).expect("valid EMF");
        assert_eq!(
            bare["_aws"]["CloudWatchMetrics"][0]["Dimensions"],
            json!([[]])
        );
        // An empty dimension value would make CloudWatch drop the metric: it is replaced.
        let empty = document(
            "sas/dev",
            1,
            &[("Workflow", "")],
            &[("TasksAccepted", Unit::Count, 1.0)],
        );
        check(&empty).expect("valid EMF");
    }

    #[test]
    fn the_checker_fails_documents_that_break_the_specification() {
        let good = document(
            "sas/dev",
            1,
            &[("Workflow", "w")],
            &[("TasksAccepted", Unit::Count, 1.0)],
        );
        let mut no_dimension_value = good.clone();
        no_dimension_value
            .as_object_mut()
            .map(|o| o.remove("Workflow"));
        let mut no_value = good.clone();
        no_value.as_object_mut().map(|o| o.remove("TasksAccepted"));
        let mut bad_unit = good.clone();
        bad_unit["_aws"]["CloudWatchMetrics"][0]["Metrics"][0]["Unit"] = json!("Widgets");
        let mut no_namespace = good.clone();
        no_namespace["_aws"]["CloudWatchMetrics"][0]["Namespace"] = json!("");
        for bad in [no_dimension_value, no_value, bad_unit, no_namespace] {
            assert!(check(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_memory_sink_sums_by_dimension_and_off_emits_nothing() {
        let sink = Arc::new(Memory::default());
        let m = Metrics::new("sas/test", sink.clone());
        m.count("TasksAccepted", &[("Workflow", "a")]);
        m.count("TasksAccepted", &[("Workflow", "a")]);
        m.count("TasksAccepted", &[("Workflow", "b")]);
        assert_eq!(sink.sum("TasksAccepted", &[("Workflow", "a")]), 2.0);
        assert_eq!(sink.sum("TasksAccepted", &[]), 3.0);
        Metrics::off().count("TasksAccepted", &[("Workflow", "a")]);
        assert_eq!(sink.documents().len(), 3);
    }
}
