//! The service contract's OpenAPI file (`docs/service-openapi.yaml`) and page
//! (`docs/services.md`) name every header the client sends and every status class it reads,
//! so that neither drifts silently from the code.

use serde_json::Value;
use std::collections::BTreeSet;
use std::path::PathBuf;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The headers sas sends (decided), and every `..._HEADER` constant in the remote clients'
/// source (`pub const X_HEADER: &str = "Name";`), so that a header added in code must be
/// documented.
fn headers() -> BTreeSet<String> {
    let mut out: BTreeSet<String> = [
        "Idempotency-Key",
        "Sas-Task-Id",
        "Sas-Step",
        "Sas-Deadline",
        "Sas-Undoes",
        "Sas-Callback-Url",
        "Sas-Callback-Token",
    ]
    .map(str::to_owned)
    .into();
    out.extend(
        [
            sas::remote::IDEMPOTENCY_HEADER,
            sas::remote::TASK_HEADER,
            sas::remote::STEP_HEADER,
            sas::remote::DEADLINE_HEADER,
            sas::remote::UNDOES_HEADER,
            sas::remote::CALLBACK_URL_HEADER,
            sas::remote::CALLBACK_TOKEN_HEADER,
        ]
        .map(str::to_owned),
    );
    let dir = repo().join("shared/src/remote");
    let mut found = 0;
    for entry in std::fs::read_dir(&dir).expect("shared/src/remote") {
        let path = entry.expect("entry").path();
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("source");
        for line in text.lines() {
            let line = line.trim();
            if let Some(rest) = line.strip_prefix("pub const ")
                && let Some((name, value)) = rest.split_once(": &str = \"")
                && name.ends_with("_HEADER")
            {
                let value = value.trim_end_matches("\";");
                out.insert(value.to_owned());
                found += 1;
            }
        }
    }
    assert!(found >= 3, "the header constants moved: found {found}");
    out
}

fn openapi() -> Value {
    serde_saphyr::from_str(&read("docs/service-openapi.yaml")).expect("the OpenAPI file is YAML")
}

#[test]
fn the_openapi_file_names_every_header_and_status_the_client_uses() {
    let doc = openapi();
    assert!(
        doc["openapi"]
            .as_str()
            .is_some_and(|v| v.starts_with("3.1")),
        "OpenAPI 3.1"
    );
    let op = &doc["paths"]["/{action}"]["post"];
    let documented: BTreeSet<String> = op["parameters"]
        .as_array()
        .expect("parameters")
        .iter()
        .filter(|p| p["in"] == "header")
        .map(|p| p["name"].as_str().expect("name").to_owned())
        .collect();
    let missing: Vec<_> = headers().difference(&documented).cloned().collect();
    assert!(
        missing.is_empty(),
        "headers not in the OpenAPI file: {missing:?}"
    );
    for required in ["Idempotency-Key", "Sas-Task-Id", "Sas-Step", "Sas-Deadline"] {
        let p = op["parameters"]
            .as_array()
            .and_then(|ps| ps.iter().find(|p| p["name"] == required))
            .expect("documented");
        assert_eq!(p["required"], true, "{required} is sent on every call");
    }

    let responses = op["responses"].as_object().expect("responses");
    for status in [
        "2XX", "400", "422", "409", "408", "425", "429", "5XX", "401", "403", "404", "default",
    ] {
        assert!(
            responses.contains_key(status),
            "status {status} not described"
        );
    }
    let refusal = &doc["components"]["schemas"]["Error"]["properties"]["error"];
    assert_eq!(refusal["required"], serde_json::json!(["code", "message"]));

    let callback = &op["callbacks"]["outcome"]["{$request.header.Sas-Callback-Url}"]["post"];
    let statuses: BTreeSet<&str> = callback["responses"]
        .as_object()
        .expect("callback responses")
        .keys()
        .map(String::as_str)
        .collect();
    for s in ["202", "409", "404"] {
        assert!(statuses.contains(s), "callback status {s} not described");
    }
    let kinds: BTreeSet<&str> = doc["components"]["schemas"]["Callback"]["oneOf"]
        .as_array()
        .expect("callback bodies")
        .iter()
        .filter_map(|b| b["properties"]["status"]["const"].as_str())
        .collect();
    assert_eq!(
        kinds,
        BTreeSet::from(["heartbeat", "refused", "succeeded"]),
        "callback bodies"
    );
}

#[test]
fn the_contract_page_names_every_header_and_stays_short() {
    let page = read("docs/services.md");
    for h in headers() {
        assert!(
            page.contains(&format!("`{h}")),
            "docs/services.md misses {h}"
        );
    }
    for word in [
        "UNDO_MARGIN_SECONDS",
        "tombstone",
        "409",
        "90 days",
        "sasctl service check",
        "/tasks/{id}/callbacks/{token}",
        "idempotencyKey",
        "errorType",
    ] {
        assert!(page.contains(word), "docs/services.md misses {word}");
    }
    let lines = page.lines().count();
    assert!(lines <= 250, "docs/services.md has {lines} lines");
}
