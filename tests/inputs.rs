//! Bad input gets a clear 4xx JSON error and writes nothing; an input the workflow's schema
//! refuses is named by its JSON pointer; poison messages are logged, acknowledged and moved to
//! the dead-letter queue. On the emulator, over HTTP.

use sas_blackbox::{
    ECOMMERCE, LOAN, aws_system, drain, items_by_kind, manual_settings, task_items,
};
use serde_json::{Value, json};
use std::time::Duration;

/// One bad request and the answer it must get.
struct Case {
    method: &'static str,
    path: String,
    body: String,
    content_type: &'static str,
    headers: Vec<(&'static str, String)>,
    status: u16,
    code: &'static str,
    /// `validation_failed` and `invalid_definition`: the JSON pointer of the first problem.
    at: Option<&'static str>,
    /// A substring of the message (of the first problem's, if `at` is given).
    says: Option<&'static str>,
}

fn case(
    method: &'static str,
    path: &str,
    body: impl Into<String>,
    status: u16,
    code: &'static str,
) -> Case {
    Case {
        method,
        path: path.to_owned(),
        body: body.into(),
        content_type: "application/json",
        headers: vec![],
        status,
        code,
        at: None,
        says: None,
    }
}

/// `POST /workflows/{workflow}/tasks` with an input the workflow's schema refuses at `at`.
fn invalid(workflow: &str, input: Value, at: &'static str, says: &'static str) -> Case {
    Case {
        at: Some(at),
        says: Some(says),
        ..case(
            "POST",
            &format!("/workflows/{workflow}/tasks"),
            input.to_string(),
            400,
            "validation_failed",
        )
    }
}

fn tasks(workflow: &str) -> String {
    format!("/workflows/{workflow}/tasks")
}

#[tokio::test]
async fn every_bad_request_gets_a_4xx_json_error_and_writes_nothing() {
    let (mut system, _clock) = aws_system("badinput", manual_settings()).await;
    let addr = sas_blackbox::serve_system(&mut system).await;
    let base = format!("http://{addr}");
    let http = reqwest::Client::new();
    let catalog_before = items_by_kind(&system).await;
    let good = json!({"customerId": "c", "items": [{"sku": "A", "quantity": 1}]}).to_string();
    let unknown = "6a1f3e0c-8d5b-4c1e-9f2a-3b4c5d6e7f80";
    let order = tasks(ECOMMERCE);
    let cases: Vec<Case> =
        vec![
        case("POST", &order, "{not json", 400, "invalid_json"),
        case("POST", &order, "", 400, "invalid_json"),
        invalid(
            ECOMMERCE,
            json!({"customerId": "c", "items": [{"sku": "A", "quantity": 0}]}),
            "/items/0/quantity",
            "minimum",
        ),
        invalid(
            ECOMMERCE,
            json!({"customerId": "c", "items": [{"sku": "A", "quantity": -1}]}),
            "/items/0/quantity",
            "minimum",
        ),
        invalid(
            ECOMMERCE,
            json!({"customerId": "c", "items": [{"sku": "A", "quantity": 1.5}]}),
            "/items/0/quantity",
            "integer",
        ),
        invalid(
            ECOMMERCE,
            json!({"customerId": "c", "items": [{"sku": "A B", "quantity": 1}]}),
            "/items/0/sku",
            "A B",
        ),
        invalid(
            ECOMMERCE,
            json!({"customerId": "c", "items": [{"sku": "A", "quantity": 1}, {"sku": "B"}]}),
            "/items/1",
            "quantity",
        ),
        invalid(
            ECOMMERCE,
            json!({"customerId": "c", "items": []}),
            "/items",
            "[]",
        ),
        invalid(
            ECOMMERCE,
            json!({"customerId": "", "items": [{"sku": "A", "quantity": 1}]}),
            "/customerId",
            "\"\"",
        ),
        invalid(
            ECOMMERCE,
            json!({"customerId": 5, "items": [{"sku": "A", "quantity": 1}]}),
            "/customerId",
            "string",
        ),
        invalid(
            ECOMMERCE,
            json!({"items": [{"sku": "A", "quantity": 1}]}),
            "",
            "customerId",
        ),
        invalid(
            ECOMMERCE,
            json!({"customerId": "c", "items": [{"sku": "A", "quantity": 1}], "extra": 1}),
            "",
            "extra",
        ),
        invalid(ECOMMERCE, json!([{"customerId": "c"}]), "", "object"),
        invalid(
            LOAN,
            json!({"applicantId": "a-1", "amount": -5, "currency": "EUR"}),
            "/amount",
            "-5",
        ),
        invalid(
            LOAN,
            json!({"applicantId": "a-1", "amount": "100", "currency": "EUR"}),
            "/amount",
            "number",
        ),
        invalid(
            LOAN,
            json!({"applicantId": "a-1", "amount": 100, "currency": "eur"}),
            "/currency",
            "eur",
        ),
        invalid(
            LOAN,
            json!({"applicantId": "a-1", "amount": 100}),
            "",
            "currency",
        ),
        case(
            "POST",
            &order,
            json!({"customerId": "x".repeat(sas::domain::task::MAX_INPUT_BYTES), "items": []})
                .to_string(),
            413,
            "input_too_large",
        ),
        case(
            "POST",
            &order,
            "x".repeat(sas::api::MAX_BODY_BYTES + 1024),
            413,
            "payload_too_large",
        ),
        Case {
            content_type: "text/plain",
            ..case("POST", &order, good.clone(), 415, "unsupported_media_type")
        },
        Case {
            headers: vec![("idempotency-key", "has space".into())],
            ..case("POST", &order, good.clone(), 400, "invalid_idempotency_key")
        },
        Case {
            headers: vec![("reply-queue-url", "not a url".into())],
            ..case("POST", &order, good.clone(), 400, "invalid_reply_queue_url")
        },
        Case {
            headers: vec![("reply-queue-url", "ftp://example.com/q".into())],
            ..case("POST", &order, good.clone(), 400, "invalid_reply_queue_url")
        },
        case(
            "POST",
            &tasks("no-such-workflow"),
            good.clone(),
            404,
            "workflow_not_found",
        ),
        case("GET", "/tasks/not-a-uuid", "", 400, "invalid_task_id"),
        case(
            "GET",
            &format!("/tasks/{unknown}"),
            "",
            404,
            "task_not_found",
        ),
        case(
            "POST",
            &format!("/operator/tasks/{unknown}/retry"),
            "",
            404,
            "task_not_found",
        ),
        case(
            "POST",
            "/tasks/not-a-uuid/cancel",
            "",
            400,
            "invalid_task_id",
        ),
        case("GET", "/nowhere", "", 404, "route_not_found"),
        case("GET", "/orders", "", 404, "route_not_found"),
        case("DELETE", &order, "", 405, "method_not_allowed"),
        case(
            "PUT",
            &format!("/tasks/{unknown}"),
            "",
            405,
            "method_not_allowed",
        ),
        case("GET", "/operator/tasks", "", 400, "missing_state"),
        case("GET", "/operator/tasks?state=Done", "", 400, "invalid_state"),
        case("GET", "/tasks?state=Done", "", 400, "unknown_parameter"),
        case("GET", "/tasks?limit=0", "", 400, "invalid_limit"),
        case("POST", "/tasks/not-a-uuid/retry", "", 404, "route_not_found"),
        case("GET", "/operator", "", 404, "route_not_found"),
        case("GET", "/operatorx/tasks", "", 404, "route_not_found"),
        case(
            "GET",
            "/operator/workflows/no-such-workflow",
            "",
            404,
            "workflow_not_found",
        ),
        case(
            "GET",
            &format!("/operator/workflows/{ECOMMERCE}/versions/9"),
            "",
            404,
            "workflow_not_found",
        ),
        case(
            "GET",
            &format!("/operator/workflows/{ECOMMERCE}/versions/x"),
            "",
            400,
            "invalid_version",
        ),
        case(
            "GET",
            "/operator/services/no-such-service",
            "",
            404,
            "service_not_found",
        ),
        // Definitions that do not validate, each named by its place.
        Case {
            at: Some("/steps/0/service"),
            says: Some("nowhere"),
            ..case(
                "PUT",
                &format!("/operator/workflows/{ECOMMERCE}"),
                json!({"name": ECOMMERCE, "steps": [{"name": "a", "service": "nowhere"}]})
                    .to_string(),
                400,
                "invalid_definition",
            )
        },
        Case {
            at: Some("/steps/1/input/x"),
            says: Some("not an earlier step"),
            ..case(
                "PUT",
                "/operator/workflows/w",
                json!({"name": "w", "steps": [
                    {"name": "a", "service": "inventory"},
                    {"name": "b", "service": "payment", "input": {"x": "$.steps['c'].result.id"}},
                    {"name": "c", "service": "payment"}
                ]})
                .to_string(),
                400,
                "invalid_definition",
            )
        },
        case(
            "PUT",
            "/operator/workflows/other-name",
            json!({"name": ECOMMERCE, "steps": [{"name": "a", "service": "inventory"}]})
                .to_string(),
            400,
            "name_mismatch",
        ),
        case("PUT", "/operator/workflows/w", "{", 400, "invalid_json"),
        Case {
            // The target's kind is checked first, at its own pointer.
            at: Some("/target/type"),
            says: Some("lambda"),
            ..case(
                "PUT",
                "/operator/services/s",
                json!({"name": "s", "target": {"type": "ftp"}}).to_string(),
                400,
                "invalid_definition",
            )
        },
    ];
    for c in cases {
        let mut req = http
            .request(
                c.method.parse().expect("method"),
                format!("{base}{}", c.path),
            )
            .header("content-type", c.content_type)
            .body(c.body.clone());
        for (k, v) in &c.headers {
            req = req.header(*k, v);
        }
        let what = format!("{} {}", c.method, c.path);
        let resp = req.send().await.expect("request");
        let got = resp.status().as_u16();
        let json: Value = resp.json().await.expect("a JSON error body");
        assert_eq!(got, c.status, "{what}: {json}");
        assert_eq!(json["error"]["code"], c.code, "{what}: {json}");
        let message = json["error"]["message"].as_str().unwrap_or_default();
        assert!(!message.is_empty(), "{what}: {json}");
        match c.at {
            Some(at) => {
                let first = &json["error"]["problems"][0];
                assert_eq!(first["at"], at, "{what}: {json}");
                let says = first["message"].as_str().unwrap_or_default();
                assert!(!says.is_empty(), "{what}: {json}");
                if let Some(part) = c.says {
                    assert!(says.contains(part), "{what}: {says:?} names {part:?}");
                }
            }
            None => {
                if let Some(part) = c.says {
                    assert!(message.contains(part), "{what}: {message:?} names {part:?}");
                }
            }
        }
    }
    assert_eq!(task_items(&system).await, 0, "no bad request wrote a task");
    assert_eq!(
        items_by_kind(&system).await,
        catalog_before,
        "no bad definition was published"
    );
    assert!(
        drain(&system, &system.resources.work_queue_url)
            .await
            .is_empty()
    );
    system.shutdown().await;
}

#[tokio::test]
async fn poison_messages_are_acknowledged_and_moved_to_the_dead_letter_queue() {
    let (system, _clock) = aws_system("poison", manual_settings()).await;
    let res = &system.resources;
    let agent_dlq = res
        .agent_dead_letter_url
        .clone()
        .unwrap_or_else(|| res.dead_letter_url.clone());
    let poison = [
        (
            res.work_queue_url.clone(),
            "{\"type\":\"work\",\"taskId\":42}".to_owned(),
        ),
        (res.work_queue_url.clone(), "not json at all".to_owned()),
        (
            res.work_queue_url.clone(),
            json!({"type": "work", "taskId": "6a1f3e0c-8d5b-4c1e-9f2a-3b4c5d6e7f80"}).to_string(),
        ),
        (
            res.work_queue_url.clone(),
            json!({"type": "work", "orderId": "6a1f3e0c-8d5b-4c1e-9f2a-3b4c5d6e7f80"}).to_string(),
        ),
        (
            res.reply_queue_url.clone(),
            json!({"type": "reply"}).to_string(),
        ),
        (res.agent_queue_url.clone(), "[]".to_owned()),
        (
            res.agent_queue_url.clone(),
            json!({"taskId": "6a1f3e0c-8d5b-4c1e-9f2a-3b4c5d6e7f80", "step": "x"}).to_string(),
        ),
    ];
    for (url, body) in &poison {
        system
            .queue
            .send(url, body, Duration::ZERO)
            .await
            .expect("send");
    }
    assert_eq!(system.pump_scheduler().await.expect("poll"), 5);
    assert_eq!(system.pump_agents().await.expect("poll"), 2);
    let mut dead = drain(&system, &res.dead_letter_url).await;
    if agent_dlq != res.dead_letter_url {
        dead.extend(drain(&system, &agent_dlq).await);
    }
    dead.sort();
    let mut sent: Vec<String> = poison.iter().map(|(_, b)| b.clone()).collect();
    sent.sort();
    assert_eq!(dead, sent, "every poison message is in a DLQ, unchanged");
    // Acknowledged: nothing comes back to the source queues, even after the visibility timeout.
    assert!(drain(&system, &res.work_queue_url).await.is_empty());
    assert!(drain(&system, &res.reply_queue_url).await.is_empty());
    assert!(drain(&system, &res.agent_queue_url).await.is_empty());
    assert_eq!(task_items(&system).await, 0);
}
