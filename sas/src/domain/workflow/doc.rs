//! Definition files as written: a workflow or a list of services, in YAML or JSON, parsed and
//! checked against the published schema (`workflows/schema.json`).

use super::super::problem::{DefinitionError, Problem};
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
    pub defaults: Option<SettingsDoc>,
    pub steps: Vec<StepDoc>,
}

/// One step, as written.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StepDoc {
    pub name: String,
    pub description: Option<String>,
    pub service: String,
    pub action: Option<String>,
    pub input: Option<Value>,
    pub undo: Option<UndoDoc>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pivot: bool,
    pub timeout: Option<String>,
    pub start_within: Option<String>,
    pub retry: Option<RetryDoc>,
    pub callback: Option<CallbackDoc>,
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
}

struct Schemas {
    workflow: jsonschema::Validator,
    services: jsonschema::Validator,
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
