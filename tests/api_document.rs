//! `docs/openapi.yaml` is the HTTP API's contract: it names exactly the routes the router serves
//! (`sas::api::routes::ROUTES`, which the router's own test proves complete), every error code
//! `ApiError` has, the statuses every operation can answer, and the views' JSON
//! (`shared/src/api/testdata`) matches its schemas. `docs/schemas/events.schema.json` has a schema
//! for every notice sas publishes, and a notice of each kind matches it. Schemathesis holds a
//! running server to the same document (`infra/contract/run.sh`).

use sas::api::ApiError;
use sas::api::routes::ROUTES;
use sas::domain::NoticeKind;
use sas::messages::TaskNotice;
use sas_blackbox::schemas::{check_event_detail, compile_def, events_schema};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::path::PathBuf;

const METHODS: [&str; 8] = [
    "get", "put", "post", "delete", "patch", "head", "options", "trace",
];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn document() -> Value {
    serde_saphyr::from_str(&read("docs/openapi.yaml")).expect("docs/openapi.yaml is YAML")
}

/// Every operation of the document: (METHOD, path, operation).
fn operations(doc: &Value) -> Vec<(String, String, Value)> {
    let paths = doc["paths"].as_object().expect("paths");
    let mut out = Vec::new();
    for (path, item) in paths {
        for m in METHODS {
            if let Some(op) = item.get(m) {
                out.push((m.to_uppercase(), path.clone(), op.clone()));
            }
        }
    }
    out
}

/// What the routes and the document disagree on, as lines (empty: they agree).
fn route_mismatches(doc: &Value, routes: &[(&str, &str)]) -> Vec<String> {
    let served: BTreeSet<(String, String)> = routes
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    let documented: BTreeSet<(String, String)> = operations(doc)
        .into_iter()
        .map(|(m, p, _)| (m, p))
        .collect();
    let mut out: Vec<String> = served
        .difference(&documented)
        .map(|(m, p)| format!("served, not in docs/openapi.yaml: {m} {p}"))
        .collect();
    out.extend(
        documented
            .difference(&served)
            .map(|(m, p)| format!("in docs/openapi.yaml, not served: {m} {p}")),
    );
    out
}

fn served() -> Vec<(&'static str, &'static str)> {
    ROUTES.iter().map(|(_, m, p)| (*m, *p)).collect()
}

#[test]
fn the_document_names_every_route_served_and_no_other() {
    let doc = document();
    assert!(
        doc["openapi"]
            .as_str()
            .is_some_and(|v| v.starts_with("3.1")),
        "OpenAPI 3.1"
    );
    let mismatches = route_mismatches(&doc, &served());
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
    // The console's HTML pages are not part of the contract.
    assert!(
        doc["paths"]
            .as_object()
            .expect("paths")
            .keys()
            .all(|p| !p.starts_with("/operator/console")),
        "the console is left out"
    );
}

#[test]
fn a_route_missing_from_the_document_or_one_not_served_is_reported() {
    let doc = document();
    let mut routes = served();
    routes.push(("PATCH", "/tasks/{taskId}"));
    routes.retain(|r| *r != ("GET", "/operator/counts"));
    let mismatches = route_mismatches(&doc, &routes);
    assert_eq!(
        mismatches,
        [
            "served, not in docs/openapi.yaml: PATCH /tasks/{taskId}",
            "in docs/openapi.yaml, not served: GET /operator/counts",
        ]
    );
}

/// A value as text, its `$ref`s resolved one level (to find a parameter's `in`).
fn text_of(v: &Value) -> String {
    let doc = document();
    let resolve = |p: &Value| match p.get("$ref").and_then(Value::as_str) {
        Some(r) => doc
            .pointer(r.trim_start_matches('#'))
            .cloned()
            .unwrap_or(Value::Null),
        None => p.clone(),
    };
    match v.as_array() {
        Some(ps) => ps
            .iter()
            .map(|p| format!("in: {}", resolve(p)["in"].as_str().unwrap_or_default()))
            .collect::<Vec<_>>()
            .join("\n"),
        None => String::new(),
    }
}

#[test]
fn every_operation_documents_its_answers_and_security() {
    let doc = document();
    let mut ids = BTreeSet::new();
    for (method, path, op) in operations(&doc) {
        let at = format!("{method} {path}");
        let id = op["operationId"].as_str().expect("operationId");
        assert!(ids.insert(id.to_owned()), "{at}: operationId {id} twice");
        let responses = op["responses"]
            .as_object()
            .unwrap_or_else(|| panic!("{at}"));
        assert!(
            responses.keys().any(|s| s.starts_with('2')),
            "{at}: no success"
        );
        let callback = path.contains("/callbacks/");
        // Every answer carries JSON: an error body, or the success's schema.
        for (status, r) in responses {
            let r = match r.get("$ref").and_then(Value::as_str) {
                Some(pointer) => doc
                    .pointer(pointer.trim_start_matches('#'))
                    .unwrap_or_else(|| panic!("{at} {status}: {pointer} resolves")),
                None => r,
            };
            assert!(
                r["content"]["application/json"]["schema"].is_object(),
                "{at} {status}: a JSON schema"
            );
        }
        // Authenticated, except the callback (its token is the credential); the operator
        // API is SigV4 only.
        let security = op.get("security").unwrap_or(&doc["security"]);
        let schemes: BTreeSet<&str> = security
            .as_array()
            .expect("security")
            .iter()
            .filter_map(|s| s.as_object())
            .flat_map(|s| s.keys().map(String::as_str))
            .collect();
        if callback {
            assert!(schemes.is_empty(), "{at}: the token is the credential");
        } else if path.starts_with("/operator") {
            assert_eq!(schemes, BTreeSet::from(["sigv4"]), "{at}");
            for s in ["401", "403"] {
                assert!(responses.contains_key(s), "{at}: {s}");
            }
        } else {
            assert_eq!(schemes, BTreeSet::from(["jwt", "sigv4"]), "{at}");
            for s in ["401", "403", "429"] {
                assert!(responses.contains_key(s), "{at}: {s}");
            }
        }
        for s in ["413", "503"] {
            assert!(responses.contains_key(s), "{at}: {s}");
        }
        // A body is read (sas-local refuses one without a JSON Content-Type); a body, a query
        // or a task id or version in the path can be malformed.
        let body = op.get("requestBody").is_some();
        if body {
            assert!(responses.contains_key("415"), "{at}: 415");
        }
        let query = text_of(&op["parameters"]).contains("in: query");
        if body || query || path.contains("{taskId}") || path.contains("{version}") {
            assert!(responses.contains_key("400"), "{at}: 400");
        }
    }
    let schemes = &doc["components"]["securitySchemes"];
    assert_eq!(schemes["jwt"]["scheme"], "bearer");
    assert_eq!(schemes["sigv4"]["x-amazon-apigateway-authtype"], "awsSigv4");
    // The headers a client sends and reads.
    let text = read("docs/openapi.yaml");
    for header in [
        "Idempotency-Key",
        "Reply-Queue-Url",
        "Start-At",
        "Priority",
        "Event-Id",
        "Retry-After",
        "idempotent-replayed",
    ] {
        assert!(
            text.contains(&format!("{header}:")) || text.contains(&format!("name: {header}")),
            "{header}"
        );
    }
}

/// The keys of `v` (outside examples) that hold a space: a YAML flow mapping split a sentence
/// at its comma (`{description: a, b}` is two keys).
fn sentence_keys(v: &Value, at: &str, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                if k == "example" || k == "examples" {
                    continue;
                }
                if k.contains(' ') {
                    out.push(format!("{at}: {k:?}"));
                }
                sentence_keys(x, &format!("{at}/{k}"), out);
            }
        }
        Value::Array(xs) => xs.iter().for_each(|x| sentence_keys(x, at, out)),
        _ => {}
    }
}

#[test]
fn no_description_was_split_into_keys() {
    let mut found = Vec::new();
    sentence_keys(&document(), "", &mut found);
    assert!(found.is_empty(), "quote these descriptions: {found:?}");
    let mut planted = Vec::new();
    let split: Value =
        serde_saphyr::from_str("result: {description: The result, any JSON}").expect("YAML");
    sentence_keys(&split, "", &mut planted);
    assert_eq!(planted, ["/result: \"any JSON\""]);
}

#[test]
fn the_error_codes_are_apierrors() {
    let doc = document();
    let codes: BTreeSet<&str> =
        doc["components"]["schemas"]["Error"]["properties"]["error"]["properties"]["code"]["enum"]
            .as_array()
            .expect("the codes")
            .iter()
            .map(|c| c.as_str().expect("a code"))
            .collect();
    // sas-local's own guard (infra/local/src/guard.rs) adds two.
    let local = ["misdirected_request", "cross_origin"];
    let guard = read("infra/local/src/guard.rs");
    for code in local {
        assert!(
            guard.contains(&format!("\"{code}\"")),
            "{code} is sas-local's"
        );
    }
    let expected: BTreeSet<&str> = ApiError::CODES.iter().copied().chain(local).collect();
    assert_eq!(codes, expected);
}

/// A validator of the document's schema `name` (`#/components/schemas/name`).
fn component(doc: &Value, name: &str) -> jsonschema::Validator {
    let root = json!({"components": doc["components"]});
    compile_def(&root, &format!("#/components/schemas/{name}"))
}

#[test]
fn the_views_match_their_schemas() {
    let doc = document();
    let caller = component(&doc, "CallerTaskView");
    let operator = component(&doc, "TaskView");
    let dir = repo().join("shared/src/api/testdata");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).expect("testdata") {
        let path = entry.expect("entry").path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        let validator = if name.ends_with(".caller.json") || name.ends_with(".caller-public.json") {
            &caller
        } else if name.ends_with(".operator.json") || name.ends_with(".operator-workflow.json") {
            &operator
        } else {
            continue;
        };
        let view: Value =
            serde_json::from_str(&std::fs::read_to_string(&path).expect("read")).expect("JSON");
        let problems: Vec<String> = validator
            .iter_errors(&view)
            .map(|e| e.to_string())
            .collect();
        assert!(problems.is_empty(), "{name}: {problems:?}");
        checked += 1;
    }
    assert!(checked >= 8, "the views' testdata moved: {checked}");
    // And a view that breaks its schema is refused.
    let mut bad: Value =
        serde_json::from_str(&read("shared/src/api/testdata/new.caller.json")).expect("JSON");
    bad["processState"] = json!("Finished");
    assert!(!caller.is_valid(&bad));
}

fn notice(status: NoticeKind) -> TaskNotice {
    let task_id: sas::TaskId = "0b6d3f9e-2c51-4a8e-9f1d-7a3c5e2b9d40".parse().expect("id");
    let refused = status == NoticeKind::Refused;
    serde_json::from_value(json!({
        "id": format!("{task_id}:7:{}", status.as_str()),
        "taskId": task_id,
        "workflow": "loan-application",
        "workflowVersion": 1,
        "status": status,
        "processState": "Processing",
        "step": "reserve-funds",
        "attempt": 2,
        "failureCount": 1,
        "lastError": "reserve-funds: 503",
        "refusal": refused.then(|| json!({"step": "check-credit", "code": "declined", "message": "no"})),
        "sequence": 7,
        "at": "2026-11-23T17:53:56.101Z",
    }))
    .expect("a notice")
}

#[test]
fn every_notice_has_its_event_schema_and_matches_it() {
    let defs: BTreeSet<String> = events_schema()["$defs"]
        .as_object()
        .expect("$defs")
        .keys()
        .cloned()
        .collect();
    for status in NoticeKind::ALL {
        let n = notice(status);
        let detail_type = n.detail_type();
        assert!(defs.contains(detail_type), "no schema for {detail_type}");
        check_event_detail(detail_type, &serde_json::to_value(&n).expect("JSON"));
    }
    for other in [sas::remote::SERVICE_UNAVAILABLE, "TaskEvent"] {
        assert!(defs.contains(other), "no schema for {other}");
    }
    check_event_detail(
        "ServiceUnavailable",
        &json!({"service": "payment", "kind": "unavailable", "error": "503", "openUntil": "2026-11-23T17:53:56.101Z"}),
    );
}

#[test]
#[should_panic(expected = "does not match its schema")]
fn a_notice_of_another_kind_is_refused() {
    let n = serde_json::to_value(notice(NoticeKind::Processed)).expect("JSON");
    check_event_detail("TaskFailed", &n);
}

/// A distributed forEach's records in the operator's view, as the document describes them: a
/// run (its task, counts and a page of elements) and an element (its run and task). A run's
/// page of more than 100 elements breaks it.
#[test]
fn a_runs_and_an_elements_views_match_the_schema() {
    use sas::domain::run::Run;
    use sas::domain::state::{ElementOf, ParentLink, RunState};
    use sas::{Caller, StateRecord, Task, TaskId};
    let operator = component(&document(), "TaskView");
    let w = sas::domain::workflow::examples::ecommerce_order(&sas::Policy::default());
    let now = chrono::Utc::now();
    let task = Task {
        input_ref: None,
        id: TaskId::new_random(),
        workflow: w.name.clone(),
        workflow_version: w.version,
        input: json!({"customerId": "c", "items": [{"sku": "a", "quantity": 1}]}),
        input_revision: 0,
        earlier_inputs: vec![],
        reply_queue_url: None,
        created_at: now,
        caller: Caller::run(&TaskId::new_random()),
        keys: vec![],
    };
    let link = |element| ParentLink {
        task_id: TaskId::new_random(),
        step: "post".into(),
        step_index: 1,
        generation: 0,
        reply_queue_url: "https://sqs.example/q".into(),
        depth: 1,
        undo_attempt: None,
        released: false,
        element,
    };
    let mut run = StateRecord::new(task.id, &w, None, now, now);
    run.parent = Some(link(None));
    run.run = Some(RunState {
        list: None,
        context: None,
        ledger: Run {
            total: 500,
            max_concurrency: 10,
            tolerated: 0,
            undoable: true,
            chunk: 1,
            refused: 0,
            marks: format!("{}{}", "d".repeat(150), "o".repeat(10)),
            stop: Some(sas::domain::run::RunStop::Refused),
        },
    });
    let mut element = StateRecord::new(task.id, &w, None, now, now);
    element.parent = Some(link(Some(ElementOf {
        index: 3,
        task_id: TaskId::new_random(),
        step_index: 1,
        first: None,
    })));
    for (what, record) in [("run", &run), ("element", &element)] {
        let view = serde_json::to_value(sas::api::views::TaskView::of(&task, record, Some(&w)))
            .expect("JSON");
        assert!(view.get(what).is_some(), "{view}");
        let problems: Vec<String> = operator.iter_errors(&view).map(|e| e.to_string()).collect();
        assert!(problems.is_empty(), "{what}: {problems:?}");
    }
    let mut view =
        serde_json::to_value(sas::api::views::TaskView::of(&task, &run, None)).expect("JSON");
    let first = view["run"]["elements"][0].clone();
    if let Some(elements) = view["run"]["elements"].as_array_mut() {
        elements.push(first);
    }
    assert!(!operator.is_valid(&view), "101 elements on a page");
}
