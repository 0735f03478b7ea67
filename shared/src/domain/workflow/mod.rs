//! Workflows and services as data: the definition files a team writes (YAML or JSON, checked
//! against the published `workflows/schema.json`), parsed once into types that cannot hold an
//! invalid definition.
//!
//! A file holds either one workflow (`name`, `description`, an `input` JSON Schema, `defaults`
//! and ordered `steps`) or a list of `services`. Parsing checks the shape against the schema;
//! [`WorkflowDoc::validate`] then checks what a schema cannot say: unique step names, mappings
//! that are RFC 9535 singular queries referring only to earlier steps, services that exist,
//! durations in range, one pivot at most and no undo after it. Every problem is reported with
//! the JSON pointer of its place.
//!
//! Modules: the files as written and their parsing (`doc`), the validated [`Workflow`]
//! (`definition`), services (`service`), the input schema (`schema`), step settings
//! (`settings`), and the shipped `examples` (tests and feature `testkit` only).

mod compile;
mod definition;
mod doc;
#[cfg(any(test, feature = "testkit"))]
pub mod examples;
mod schema;
mod service;
mod settings;
#[cfg(test)]
mod testkit;

pub use super::problem::{DefinitionError, InputError, Problem};
pub use compile::DEFAULT_CONCURRENCY;
pub use definition::{
    Arm, CHILD_SERVICE, CHILD_TIMEOUT_HOURS, Child, ForEach, Group, GroupKind, MAX_BRANCHES,
    MAX_CASES, MAX_CHILD_DEPTH, MAX_CONCURRENCY, MAX_DEPTH, MAX_ELEMENTS, MAX_STEPS, RUN_SERVICE,
    RUN_TIMEOUT_HOURS, RUN_UNDO_ACTION, RunDef, Step, Tolerated, Undo, Wait, Workflow,
};
pub use doc::{
    BranchDoc, CaseDoc, Document, Format, MAX_DEFINITION_BYTES, OtherwiseDoc, SCHEMA, StepDoc,
    UndoDoc, WorkflowDoc, parse_document, parse_schedules, parse_services, parse_value,
    parse_workflow,
};
pub use schema::{
    MAX_SCHEMA_DEPTH, MAX_SCHEMA_KEYWORDS, MAX_SCHEMA_PATTERNS, SCHEMA_BACKTRACK_LIMIT,
    SCHEMA_REGEX_BYTES,
};
pub use service::{
    ActionDef, AuthDef, AuthScheme, CredentialSource, HttpMethod, HttpTarget, LambdaTarget,
    PathPart, PathTemplate, RESERVED_HEADERS, ServiceDef, ServiceRules, ServicesDoc,
    StatusOverrides, Target, deployment_problems,
};
pub use settings::{
    CallbackDoc, MAX_CALLBACK_TIMEOUT, MAX_DELAY, MAX_START_WITHIN, MAX_TIMEOUT, MAX_WAIT,
    MIN_TIMEOUT, RetryDoc, SettingsDoc,
};
