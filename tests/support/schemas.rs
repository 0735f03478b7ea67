//! The published schemas of what sas sends (`docs/schemas/`): each event's detail by its
//! detail-type (`events.schema.json#/$defs/<detail-type>`) and the reply-queue message. The
//! flow tests check every notice they receive against them ([`check_received`]).

use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::LazyLock;

fn load(name: &str) -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../docs/schemas")
        .join(name);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name} is not JSON: {e}"))
}

/// `events.schema.json` as published.
pub fn events_schema() -> Value {
    load("events.schema.json")
}

/// A validator of `root`'s definition `def` (formats asserted).
pub fn compile_def(root: &Value, pointer: &str) -> jsonschema::Validator {
    let mut schema = root.clone();
    if let Some(m) = schema.as_object_mut() {
        m.insert("$ref".into(), json!(pointer));
    }
    jsonschema::options()
        .should_validate_formats(true)
        .build(&schema)
        .unwrap_or_else(|e| panic!("{pointer} compiles: {e}"))
}

static EVENTS: LazyLock<BTreeMap<String, jsonschema::Validator>> = LazyLock::new(|| {
    let root = events_schema();
    let defs = root["$defs"]
        .as_object()
        .expect("events.schema.json has $defs");
    defs.keys()
        .map(|k| (k.clone(), compile_def(&root, &format!("#/$defs/{k}"))))
        .collect()
});

static REPLY: LazyLock<jsonschema::Validator> = LazyLock::new(|| {
    jsonschema::options()
        .should_validate_formats(true)
        .build(&load("reply-message.schema.json"))
        .expect("reply-message.schema.json compiles")
});

/// The problems of `instance` under `validator`, one a line (empty: it holds).
fn problems(validator: &jsonschema::Validator, instance: &Value) -> String {
    validator
        .iter_errors(instance)
        .map(|e| format!("  at {:?}: {e}", e.instance_path().to_string()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Panics unless `detail` matches the published schema of events of `detail_type`.
pub fn check_event_detail(detail_type: &str, detail: &Value) {
    let validator = EVENTS.get(detail_type).unwrap_or_else(|| {
        panic!("no schema in docs/schemas/events.schema.json for {detail_type}")
    });
    let p = problems(validator, detail);
    assert!(
        p.is_empty(),
        "a {detail_type} event does not match its schema:\n{p}\n{detail}"
    );
}

/// Panics unless `message` matches the reply-queue message's schema.
pub fn check_reply_message(message: &Value) {
    let p = problems(&REPLY, message);
    assert!(
        p.is_empty(),
        "a reply-queue message does not match its schema:\n{p}\n{message}"
    );
}

/// Checks a message a test received: an EventBridge event of `sas.tasks` (its detail, by its
/// detail-type), or else a task's reply-queue message.
pub fn check_received(message: &Value) {
    match message.get("detail-type").and_then(Value::as_str) {
        Some(detail_type) => {
            assert_eq!(message["source"], "sas.tasks", "{message}");
            check_event_detail(detail_type, &message["detail"]);
        }
        None => check_reply_message(message),
    }
}
