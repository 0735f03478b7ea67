//! Definition files as written: a workflow or a list of services, in YAML or JSON, parsed and
//! checked against the published schema (`workflows/schema.json`).

use super::super::problem::{DefinitionError, Problem};
use super::super::schedule::{Schedule, SchedulesDoc};
use super::schema::schema_problems;
use super::service::{ServicesDoc, service_problems};
use super::settings::{CallbackDoc, RetryDoc, SettingsDoc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeSet;
use std::sync::LazyLock;

/// The largest definition accepted (it is stored as one item, and travels in one request).
pub const MAX_DEFINITION_BYTES: usize = 128 * 1024;

/// The published JSON Schema of definition files.
pub const SCHEMA: &str = include_str!("../../../../workflows/schema.json");

/// How a definition is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Json,
    Yaml,
}

impl Format {
    /// From a file name: `.json` is JSON, `.yaml`/`.yml` YAML.
    pub fn of_path(path: &str) -> Option<Self> {
        let lower = path.to_ascii_lowercase();
        if lower.ends_with(".json") {
            Some(Self::Json)
        } else if lower.ends_with(".yaml") || lower.ends_with(".yml") {
            Some(Self::Yaml)
        } else {
            None
        }
    }
}

/// A workflow as written.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkflowDoc {
    pub name: String,
    pub description: Option<String>,
    /// Show a task's caller its steps' errors (off: only the operator API shows them).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub public_errors: bool,
    /// The JSON Schema of a task's input.
    pub input: Option<Value>,
    /// How long a task has, from its submission, to end: past it, it fails (`task_timeout`).
    pub deadline: Option<String>,
    pub defaults: Option<SettingsDoc>,
    pub steps: Vec<StepDoc>,
    /// What a task of this workflow answers when it ends `Processed` (a mapping on `{input,
    /// steps}`): the result of the parent's step when it runs as a sub-workflow.
    pub output: Option<Value>,
    /// The task's search keys: name → a query on its input (`customerId: $.input.customerId`),
    /// read when the task starts; a task is found by each (see [`crate::domain::keys`]).
    pub keys: Option<std::collections::BTreeMap<String, String>>,
    /// At most `limit` tasks with one value of `key` (a query on the input) run at once; the
    /// others wait in line, in the order they were created.
    pub concurrency: Option<ConcurrencyDoc>,
}

/// A workflow's `concurrency`, as written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConcurrencyDoc {
    pub key: String,
    pub limit: u32,
}

/// One entry of a workflow's `steps`, as written: a step (it names a `service`), a choice
/// (`choice`, and `otherwise`) or parallel branches (`parallel`). One flat shape, so that the
/// schema's messages stay precise; [`WorkflowDoc::validate`] checks that an entry is exactly one
/// of them and compiles it into its own type.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StepDoc {
    pub name: String,
    pub description: Option<String>,
    /// A CEL expression on `{task, input, steps}`: the entry runs only if it holds.
    pub when: Option<String>,
    pub service: Option<String>,
    pub action: Option<String>,
    /// A sub-workflow step: the published workflow whose task (a child of this one) it runs.
    pub workflow: Option<String>,
    /// A sub-workflow step: the child's version (absent: the latest published when the step
    /// starts).
    pub workflow_version: Option<u32>,
    pub input: Option<Value>,
    pub undo: Option<UndoDoc>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pivot: bool,
    pub timeout: Option<String>,
    pub start_within: Option<String>,
    pub retry: Option<RetryDoc>,
    pub callback: Option<CallbackDoc>,
    /// A wait step: how long it waits (`14d`).
    pub wait: Option<String>,
    /// A wait step: until when it waits, an RFC 3339 time or a singular JSONPath query that
    /// selects one (`$.input.payoutAt`).
    pub wait_until: Option<String>,
    /// A wait for a named event: its name, or the names of which the first to come ends it.
    pub wait_for: Option<Value>,
    /// A wait for a named event: how long it waits at most (past it, the step fails).
    pub within: Option<String>,
    /// A wait for a named event: the JSON Schema its payload must match.
    pub payload: Option<Value>,
    /// A singular JSONPath query selecting an array: the step runs once per element.
    pub for_each: Option<String>,
    pub max_concurrency: Option<u32>,
    /// A forEach step whose elements each run as a record of their own (up to 10,000, from
    /// the input, an earlier result or an S3 object), rather than in the task's record.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub distributed: bool,
    /// A distributed forEach's elements kept in one record (a chunk, 1 to 100; default 1).
    pub chunk: Option<u32>,
    /// How many refused elements a forEach step tolerates: a count, or a share (`"10%"`).
    pub tolerated_refusals: Option<Value>,
    /// The cases of a choice: the first whose `when` holds runs.
    pub choice: Option<Vec<CaseDoc>>,
    /// What a choice runs when no case holds.
    pub otherwise: Option<OtherwiseDoc>,
    /// Branches that run at once.
    pub parallel: Option<Vec<BranchDoc>>,
}

/// One case of a choice.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CaseDoc {
    pub when: String,
    #[serde(default)]
    pub steps: Vec<StepDoc>,
    /// The choice's result when this case ran (a mapping): what later steps read as
    /// `$.steps['<choice>'].result`.
    pub result: Option<Value>,
}

/// What a choice runs when no case holds.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OtherwiseDoc {
    #[serde(default)]
    pub steps: Vec<StepDoc>,
    pub result: Option<Value>,
}

/// One branch of a parallel group.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BranchDoc {
    pub name: Option<String>,
    pub steps: Vec<StepDoc>,
}

impl WorkflowDoc {
    /// Every step's service, with the JSON pointer of its `service` field, groups included.
    pub fn services_used(&self) -> Vec<(String, &str)> {
        let mut out = vec![];
        services_in(&self.steps, "/steps", &mut out);
        out
    }

    /// Every sub-workflow step's name, with the JSON pointer of its `workflow` field.
    pub fn workflows_used(&self) -> Vec<(String, &str)> {
        let mut out = vec![];
        workflows_in(&self.steps, "/steps", &mut out);
        out
    }
}

/// Every sub-workflow step's name, with the JSON pointer of its `workflow` field.
fn workflows_in<'a>(entries: &'a [StepDoc], at: &str, out: &mut Vec<(String, &'a str)>) {
    for (i, e) in entries.iter().enumerate() {
        let here = format!("{at}/{i}");
        if e.workflow.is_some() {
            out.push((format!("{here}/workflow"), e.name.as_str()));
        }
        for (below, steps) in e.sequences() {
            workflows_in(steps, &format!("{here}{below}"), out);
        }
    }
}

fn services_in<'a>(entries: &'a [StepDoc], at: &str, out: &mut Vec<(String, &'a str)>) {
    for (i, e) in entries.iter().enumerate() {
        let here = format!("{at}/{i}");
        if let Some(s) = &e.service {
            out.push((format!("{here}/service"), s));
        }
        for (below, steps) in e.sequences() {
            services_in(steps, &format!("{here}{below}"), out);
        }
    }
}

impl StepDoc {
    /// The sequences a group holds, in the order written (a choice's cases, then `otherwise`;
    /// a parallel group's branches), each with its JSON pointer below the entry's.
    pub fn sequences(&self) -> Vec<(String, &[StepDoc])> {
        let cases = self.choice.iter().flatten().enumerate();
        let branches = self.parallel.iter().flatten().enumerate();
        cases
            .map(|(c, case)| (format!("/choice/{c}/steps"), case.steps.as_slice()))
            .chain(
                self.otherwise
                    .iter()
                    .map(|o| ("/otherwise/steps".to_owned(), o.steps.as_slice())),
            )
            .chain(
                branches
                    .map(|(b, branch)| (format!("/parallel/{b}/steps"), branch.steps.as_slice())),
            )
            .collect()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UndoDoc {
    pub action: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Value>,
}

/// One definition file: a workflow or a list of services. (One per file read, never kept in
/// bulk: the variants' sizes do not matter.)
#[derive(Debug, Clone, PartialEq)]
#[allow(clippy::large_enum_variant)]
pub enum Document {
    Workflow(WorkflowDoc),
    Services(ServicesDoc),
    Schedules(SchedulesDoc),
}

struct Schemas {
    workflow: jsonschema::Validator,
    services: jsonschema::Validator,
    schedules: jsonschema::Validator,
}

fn compile(root: &Value, def: &str) -> jsonschema::Validator {
    let schema = serde_json::json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$defs": root["$defs"].clone(),
        "$ref": format!("#/$defs/{def}"),
    });
    // The schema is compiled into the binary and tested (`the_published_schema_compiles`):
    // a failure here is a build defect, not an input error.
    #[allow(clippy::expect_used)]
    jsonschema::validator_for(&schema).expect("workflows/schema.json compiles")
}

static SCHEMAS: LazyLock<Schemas> = LazyLock::new(|| {
    #[allow(clippy::expect_used)]
    let root: Value = serde_json::from_str(SCHEMA).expect("workflows/schema.json is JSON");
    Schemas {
        workflow: compile(&root, "workflow"),
        services: compile(&root, "services"),
        schedules: compile(&root, "schedules"),
    }
});

/// Parses a definition file's text (YAML or JSON) into a value, without checking its shape.
pub fn parse_value(text: &str, format: Format) -> Result<Value, DefinitionError> {
    if text.len() > MAX_DEFINITION_BYTES {
        return Err(DefinitionError::one(
            "",
            format!("the definition is over {MAX_DEFINITION_BYTES} bytes"),
        ));
    }
    match format {
        Format::Json => serde_json::from_str(text)
            .map_err(|e| DefinitionError::one("", format!("not JSON: {e}"))),
        Format::Yaml => serde_saphyr::from_str(text)
            .map_err(|e| DefinitionError::one("", format!("not YAML: {e}"))),
    }
}

/// Parses a definition (a workflow or a list of services) from a JSON value and checks its
/// shape against the published schema.
pub fn parse_document(value: Value) -> Result<Document, DefinitionError> {
    let Some(object) = value.as_object() else {
        return Err(DefinitionError::one(
            "",
            "a definition is an object: a workflow (with `steps`) or `services`",
        ));
    };
    if object.contains_key("services") && !object.contains_key("steps") {
        parse_services(value).map(Document::Services)
    } else if object.contains_key("schedules") && !object.contains_key("steps") {
        parse_schedules(value).map(Document::Schedules)
    } else {
        parse_workflow(value).map(Document::Workflow)
    }
}

/// Parses and shape-checks a workflow.
pub fn parse_workflow(value: Value) -> Result<WorkflowDoc, DefinitionError> {
    let problems = schema_problems(&SCHEMAS.workflow, &value);
    if !problems.is_empty() {
        return Err(DefinitionError(problems));
    }
    serde_json::from_value(value).map_err(|e| DefinitionError::one("", e.to_string()))
}

/// Parses and shape-checks a list of services (names must be unique).
pub fn parse_services(value: Value) -> Result<ServicesDoc, DefinitionError> {
    let problems = schema_problems(&SCHEMAS.services, &value);
    if !problems.is_empty() {
        return Err(DefinitionError(problems));
    }
    let doc: ServicesDoc =
        serde_json::from_value(value).map_err(|e| DefinitionError::one("", e.to_string()))?;
    let mut seen = BTreeSet::new();
    let mut problems = vec![];
    for (i, s) in doc.services.iter().enumerate() {
        if !seen.insert(s.name.as_str()) {
            problems.push(Problem {
                at: format!("/services/{i}/name"),
                message: format!("service {:?} is declared twice", s.name),
            });
        }
        service_problems(&format!("/services/{i}"), s, &mut problems);
    }
    if problems.is_empty() {
        Ok(doc)
    } else {
        Err(DefinitionError(problems))
    }
}

/// Parses and checks a list of schedules: its shape, unique names, each expression and time
/// zone. (Whether the workflow exists and takes the input is checked when it is published.)
pub fn parse_schedules(value: Value) -> Result<SchedulesDoc, DefinitionError> {
    let problems = schema_problems(&SCHEMAS.schedules, &value);
    if !problems.is_empty() {
        return Err(DefinitionError(problems));
    }
    let doc: SchedulesDoc =
        serde_json::from_value(value).map_err(|e| DefinitionError::one("", e.to_string()))?;
    let mut seen = BTreeSet::new();
    let mut problems = vec![];
    for (i, s) in doc.schedules.iter().enumerate() {
        let at = format!("/schedules/{i}");
        if !seen.insert(s.name.as_str()) {
            problems.push(Problem {
                at: format!("{at}/name"),
                message: format!("schedule {:?} is declared twice", s.name),
            });
        }
        if let Err(e) = Schedule::parse(s.clone(), chrono::DateTime::UNIX_EPOCH, &at) {
            problems.extend(e.0);
        }
    }
    if problems.is_empty() {
        Ok(doc)
    } else {
        Err(DefinitionError(problems))
    }
}

#[cfg(test)]
mod tests {
    use super::super::testkit::*;
    use super::*;

    #[test]
    fn the_published_schema_compiles() {
        LazyLock::force(&SCHEMAS);
        let root: Value = serde_json::from_str(SCHEMA).expect("JSON");
        jsonschema::meta::validate(&root).expect("a valid JSON Schema");
    }

    #[test]
    fn schema_errors_name_their_place() {
        let p = problems(&format!(
            "{BASE}  - {{name: a, service: inventory, colour: red}}\n"
        ));
        assert_eq!(p[0].at, "/steps/0", "{p:?}");
        assert!(p[0].message.contains("colour"), "{p:?}");
        let p = problems(&format!("{BASE}  - {{name: A!, service: inventory}}\n"));
        assert_eq!(p[0].at, "/steps/0/name", "{p:?}");
        let p = problems("name: w\nsteps: []\n");
        assert_eq!(p[0].at, "/steps", "{p:?}");
    }
}
