//! Tasks: instances of a workflow. A task's input is any JSON value its workflow's input schema
//! accepts; it is stored once, beside the task's state record, and never changes.

use super::payload::PayloadRef;
pub use super::state::{MAX_RESULT_BYTES, MAX_RESULTS_BYTES};
use super::state::{StateRecord, is_zero};
pub use super::task_id::TaskId;
pub use super::validation::ValidationError;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// The largest task input accepted (serialized JSON). Over
/// [`INLINE_PAYLOAD_BYTES`](super::payload::INLINE_PAYLOAD_BYTES) it is kept by reference, so
/// the bound is the way in: the API's request reaches its function inside Lambda's 6 MB
/// invocation event, its quotes escaped (a JSON body in a JSON string), so 4 MiB leaves room.
pub const MAX_INPUT_BYTES: usize = 4 * 1024 * 1024;
/// The largest request body a mapping may build (serialized JSON): a step request carries it
/// by reference when it is large, and a Lambda service takes at most this.
pub const MAX_REQUEST_BYTES: usize = super::payload::MAX_PAYLOAD_BYTES;
/// Longest reply queue URL accepted (SQS URLs are far shorter).
pub const MAX_URL_LEN: usize = 1024;

/// Checks a reply queue URL (`Reply-Queue-Url`): an http(s) URL with a host.
pub fn parse_queue_url(u: &str) -> Result<String, ValidationError> {
    const FIELD: &str = "Reply-Queue-Url";
    if u.len() > MAX_URL_LEN {
        return Err(ValidationError::new(
            FIELD,
            format!("must be at most {MAX_URL_LEN} characters"),
        ));
    }
    let parsed = url::Url::parse(u)
        .map_err(|e| ValidationError::new(FIELD, format!("must be a URL ({e})")))?;
    if !matches!(parsed.scheme(), "https" | "http" | "memory") || parsed.host_str().is_none() {
        return Err(ValidationError::new(
            FIELD,
            "must be an http(s) queue URL with a host",
        ));
    }
    Ok(u.to_owned())
}

/// Where a task's status messages may go (`Reply-Queue-Url`): the deployment's allowed URL
/// patterns, each a queue URL whose name ends in `*` (the template's
/// `https://sqs.<region>.<suffix>/<account>/sasreply-<Stage>--*`). The account, the region and
/// a name prefix that no queue of a sas stack has (they all start `sas-`), and that no other
/// stage's prefix matches (a stage name has no `--`), so a caller can only name its own queues.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReplyQueues {
    patterns: Vec<String>,
}

/// The longest SQS queue name.
const MAX_QUEUE_NAME: usize = 80;

impl ReplyQueues {
    /// Patterns as the configuration gives them (comma-separated `...*`). A pattern without
    /// its trailing `*` is refused: it would allow exactly one queue, which is never meant.
    pub fn parse(spec: &str) -> Result<Self, ValidationError> {
        let patterns: Vec<String> = spec
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(|p| match p.strip_suffix('*') {
                Some(base) if base.contains("://") && !base.ends_with('/') => Ok(base.to_owned()),
                _ => Err(ValidationError::new(
                    "REPLY_QUEUES",
                    format!("{p:?} must be a queue URL ending in a name prefix and `*`"),
                )),
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { patterns })
    }

    /// No reply queue is allowed.
    pub fn none() -> Self {
        Self::default()
    }

    pub fn patterns(&self) -> impl Iterator<Item = String> + '_ {
        self.patterns.iter().map(|p| format!("{p}*"))
    }

    /// Checks `u` against the patterns: a URL that starts with one of them, followed by the
    /// rest of a standard queue's name (letters, digits, `-`, `_`; at most 80 characters in all).
    pub fn check(&self, u: &str) -> Result<String, ValidationError> {
        const FIELD: &str = "Reply-Queue-Url";
        let u = parse_queue_url(u)?;
        let allowed = self.patterns.iter().any(|base| {
            u.strip_prefix(base.as_str()).is_some_and(|rest| {
                let name_len = base.rsplit('/').next().map_or(0, str::len) + rest.len();
                !rest.is_empty()
                    && name_len <= MAX_QUEUE_NAME
                    && rest
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            })
        });
        if allowed {
            Ok(u)
        } else if self.patterns.is_empty() {
            Err(ValidationError::new(
                FIELD,
                "this deployment allows no reply queues",
            ))
        } else {
            Err(ValidationError::new(
                FIELD,
                format!(
                    "must be a standard queue matching {}",
                    self.patterns().collect::<Vec<_>>().join(" or ")
                ),
            ))
        }
    }
}

/// An accepted task, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Task {
    pub id: TaskId,
    pub workflow: String,
    pub workflow_version: u32,
    /// The input, as the workflow's input schema accepted it: the submitted one, or the one
    /// an operator's retry on a new input gave it.
    pub input: serde_json::Value,
    /// Where the input is kept when it is over [`INLINE_PAYLOAD_BYTES`]: stored, the task's
    /// item holds this reference and `input` is `null`; read back, both (see
    /// [`crate::payloads`]).
    ///
    /// [`INLINE_PAYLOAD_BYTES`]: super::payload::INLINE_PAYLOAD_BYTES
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_ref: Option<PayloadRef>,
    /// How many times an operator's retry replaced the input (0: the submitted one).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub input_revision: u32,
    /// The inputs replaced since that steps ran with: each such step, and its undo, keeps
    /// reading the input it ran with (see [`StepState::input_revision`]). Only revisions a step
    /// names are kept.
    ///
    /// [`StepState::input_revision`]: super::state::StepState::input_revision
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub earlier_inputs: Vec<EarlierInput>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_queue_url: Option<String>,
    pub created_at: DateTime<Utc>,
    /// Who started it: the only caller that may read, list or cancel it on the task API.
    pub caller: super::Caller,
    /// Its search keys, read from the input it started with ([`super::keys`]); kept as they
    /// were when an operator's retry replaces the input.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keys: Vec<super::keys::TaskKey>,
}

/// An input a task had before an operator's retry replaced it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EarlierInput {
    pub revision: u32,
    pub input: serde_json::Value,
    /// As [`Task::input_ref`], for this input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_ref: Option<PayloadRef>,
}

/// The most the inputs a task keeps for steps that ran with them may take together
/// in the task's item (inline, or their references), so the item stays far below DynamoDB's
/// 400 KB.
pub const MAX_EARLIER_INPUTS_BYTES: usize = 128 * 1024;

impl Task {
    /// Whether its input is past the inline size: kept by reference
    /// ([`crate::domain::payload`]).
    pub fn has_large_input(&self) -> bool {
        !crate::domain::payload::is_inline(self.input.to_string().len())
    }

    /// The input of `revision` (`None`: the current one), if the task still has it.
    pub fn input_of(&self, revision: Option<u32>) -> Option<&serde_json::Value> {
        match revision {
            None => Some(&self.input),
            Some(r) if r == self.input_revision => Some(&self.input),
            Some(r) => self
                .earlier_inputs
                .iter()
                .find(|e| e.revision == r)
                .map(|e| &e.input),
        }
    }

    /// The task once an operator's retry replaced its input with `input`, the steps of
    /// `record` (as the retry leaves them) naming the revisions they ran with: the replaced
    /// input is kept if a step names it, and any earlier input no step names is dropped.
    /// `Err` with the bytes the kept inputs would take when that is over
    /// [`MAX_EARLIER_INPUTS_BYTES`].
    pub fn with_new_input(
        &self,
        input: serde_json::Value,
        record: &StateRecord,
    ) -> Result<Task, usize> {
        let named = |r: u32| record.steps.iter().any(|s| s.input_revision == Some(r));
        let mut earlier: Vec<EarlierInput> = self
            .earlier_inputs
            .iter()
            .filter(|e| named(e.revision))
            .cloned()
            .collect();
        if named(self.input_revision) {
            earlier.push(EarlierInput {
                revision: self.input_revision,
                input: self.input.clone(),
                input_ref: self.input_ref.clone(),
            });
        }
        let bytes: usize = earlier
            .iter()
            .map(|e| super::payload::stored_bytes(e.input.to_string().len()))
            .sum();
        if bytes > MAX_EARLIER_INPUTS_BYTES {
            return Err(bytes);
        }
        Ok(Task {
            input,
            input_ref: None,
            input_revision: self.input_revision + 1,
            earlier_inputs: earlier,
            ..self.clone()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_input_keeps_the_inputs_steps_ran_with_and_drops_the_rest() {
        let w = super::super::workflow::examples::ecommerce_order(&Default::default());
        let now = Utc::now();
        let task = Task {
            input_ref: None,
            id: TaskId::new_random(),
            workflow: w.name.clone(),
            workflow_version: w.version,
            input: serde_json::json!({"items": ["A"]}),
            input_revision: 0,
            earlier_inputs: vec![],
            reply_queue_url: None,
            created_at: now,
            caller: super::super::Caller::anonymous(),
            keys: vec![],
        };
        let mut r = super::super::StateRecord::new(task.id, &w, None, now, now);
        // Nothing ran on the first input: it is not kept.
        let second = task
            .with_new_input(serde_json::json!({"items": ["B"]}), &r)
            .expect("fits");
        assert_eq!(second.input_revision, 1);
        assert!(second.earlier_inputs.is_empty());
        // The first step ran on the second input: kept, and found by its revision.
        r.steps[0].input_revision = Some(1);
        let third = second
            .with_new_input(serde_json::json!({"items": ["C"]}), &r)
            .expect("fits");
        assert_eq!(third.input_revision, 2);
        assert_eq!(
            third.input_of(Some(1)),
            Some(&serde_json::json!({"items": ["B"]}))
        );
        assert_eq!(
            third.input_of(None),
            Some(&serde_json::json!({"items": ["C"]}))
        );
        assert_eq!(third.input_of(Some(2)), third.input_of(None));
        assert_eq!(third.input_of(Some(0)), None, "never named: dropped");
        // A large input counts as its reference (it is kept outside the item): two of the
        // largest inputs are kept.
        let big = serde_json::json!({"blob": "x".repeat(MAX_INPUT_BYTES - 20)});
        let mut r2 = r.clone();
        r2.steps[1].input_revision = Some(2);
        let heavy = Task {
            input: big.clone(),
            earlier_inputs: vec![EarlierInput {
                input_ref: None,
                revision: 1,
                input: big.clone(),
            }],
            ..third.clone()
        };
        assert!(heavy.with_new_input(serde_json::json!({}), &r2).is_ok());

        // Over the bound in the item (inline inputs just under the inline size, one per step
        // of a long workflow): refused with the bytes they would take.
        let steps: Vec<String> = (0..20)
            .map(|i| format!("  - {{name: s{i}, service: s}}\n"))
            .collect();
        let yaml = format!("name: long\nsteps:\n{}", steps.concat());
        let v =
            super::super::workflow::parse_value(&yaml, super::super::Format::Yaml).expect("yaml");
        let long = super::super::Workflow::from_value(v, None, &Default::default())
            .expect("valid")
            .with_version(1);
        let mut r3 = super::super::StateRecord::new(task.id, &long, None, now, now);
        let inline = |k: usize| {
            let pad = super::super::payload::INLINE_PAYLOAD_BYTES - 40;
            serde_json::json!({"k": k, "pad": "p".repeat(pad)})
        };
        let mut many = Task {
            input: inline(20),
            input_revision: 20,
            earlier_inputs: vec![],
            ..task.clone()
        };
        for k in 1..20u32 {
            r3.steps[k as usize].input_revision = Some(k);
            many.earlier_inputs.push(EarlierInput {
                revision: k,
                input: inline(k as usize),
                input_ref: None,
            });
        }
        r3.steps[0].input_revision = Some(20);
        let err = many.with_new_input(serde_json::json!({}), &r3);
        assert!(
            matches!(err, Err(bytes) if bytes > MAX_EARLIER_INPUTS_BYTES),
            "{:?}",
            err.map(|_| ())
        );
    }

    #[test]
    fn reply_queues_must_match_the_deployments_pattern() {
        let allowed = ReplyQueues::parse(
            "https://sqs.eu-west-1.amazonaws.com/123456789012/sasreply-prod--*, https://eu-west-1.queue.amazonaws.com/123456789012/sasreply-prod--*",
        )
        .expect("patterns");
        for ok in [
            "https://sqs.eu-west-1.amazonaws.com/123456789012/sasreply-prod--shop",
            "https://eu-west-1.queue.amazonaws.com/123456789012/sasreply-prod--shop_2",
        ] {
            assert_eq!(allowed.check(ok), Ok(ok.to_owned()), "{ok}");
        }
        for bad in [
            // Another account, another region, the stack's own queues, another stage.
            "https://sqs.eu-west-1.amazonaws.com/210987654321/sasreply-prod--shop",
            "https://sqs.us-east-1.amazonaws.com/123456789012/sasreply-prod--shop",
            "https://sqs.eu-west-1.amazonaws.com/123456789012/sas-prod-work",
            "https://sqs.eu-west-1.amazonaws.com/123456789012/sasreply-prod-client--shop",
            "https://sqs.eu-west-1.amazonaws.com/123456789012/sasreply-prod--",
            "https://sqs.eu-west-1.amazonaws.com/123456789012/sasreply-prod--a/b",
            "https://sqs.eu-west-1.amazonaws.com/123456789012/sasreply-prod--q.fifo",
            "http://sqs.eu-west-1.amazonaws.com/123456789012/sasreply-prod--shop",
            &format!(
                "https://sqs.eu-west-1.amazonaws.com/123456789012/sasreply-prod--{}",
                "x".repeat(80)
            ),
        ] {
            let e = allowed.check(bad).expect_err(bad);
            assert_eq!(e.field, "Reply-Queue-Url");
        }
        assert!(
            ReplyQueues::none()
                .check("https://sqs.eu-west-1.amazonaws.com/1/q")
                .is_err()
        );
        assert!(ReplyQueues::parse("https://sqs.eu-west-1.amazonaws.com/1/q").is_err());
        assert!(ReplyQueues::parse("sasreply-*").is_err());
    }

    #[test]
    fn reply_queue_urls_need_a_scheme_and_host() {
        assert!(parse_queue_url("https://sqs.eu-west-1.amazonaws.com/1/q").is_ok());
        for bad in ["nope", "ftp://x/q", "https://", &"h".repeat(2000)] {
            assert!(parse_queue_url(bad).is_err(), "{bad}");
        }
    }
}
