//! Bad input gets a clear 4xx JSON error and writes nothing; poison messages are logged,
//! acknowledged and moved to the dead-letter queue. On the emulator, over HTTP.

use sas_blackbox::{aws_system, drain, item_count, manual_settings};
use serde_json::{Value, json};
use std::time::Duration;

/// Method, path, body, content type, expected status, expected error code.
type Case<'a> = (&'a str, &'a str, String, Option<&'a str>, u16, &'a str);

#[tokio::test]
async fn every_bad_request_gets_a_4xx_json_error_and_writes_nothing() {
    let (mut system, _clock) = aws_system("badinput", manual_settings()).await;
    let addr = system
        .serve("127.0.0.1:0".parse().expect("addr"))
        .await
        .expect("serve");
    let base = format!("http://{addr}");
    let http = reqwest::Client::new();
    let big = "x".repeat(300 * 1024);
    let cases: Vec<Case> = vec![
        ("POST", "/orders", "{not json".into(), None, 400, "invalid_json"),
        ("POST", "/orders", "".into(), None, 400, "invalid_json"),
        ("POST", "/orders", json!({"items": [{"sku": "A", "quantity": 1}]}).to_string(), None, 400, "invalid_request"),
        ("POST", "/orders", json!({"customerId": 5, "items": []}).to_string(), None, 400, "invalid_request"),
        ("POST", "/orders", json!({"customerId": "c", "items": [{"sku": "A", "quantity": -1}]}).to_string(), None, 400, "invalid_request"),
        ("POST", "/orders", json!({"customerId": "c", "items": [], "extra": 1}).to_string(), None, 400, "invalid_request"),
        ("POST", "/orders", json!({"customerId": "c", "items": [{"sku": "A", "quantity": 0}]}).to_string(), None, 400, "validation_failed"),
        ("POST", "/orders", json!({"customerId": "c", "items": []}).to_string(), None, 400, "validation_failed"),
        ("POST", "/orders", json!({"customerId": "", "items": [{"sku": "A", "quantity": 1}]}).to_string(), None, 400, "validation_failed"),
        ("POST", "/orders", json!({"customerId": "c", "items": [{"sku": "A B", "quantity": 1}]}).to_string(), None, 400, "validation_failed"),
        ("POST", "/orders", json!({"customerId": "c", "items": [{"sku": "A", "quantity": 1}], "replyQueueUrl": "not a url"}).to_string(), None, 400, "validation_failed"),
        ("POST", "/orders", json!({"customerId": big, "items": []}).to_string(), None, 413, "payload_too_large"),
        ("POST", "/orders", json!({"customerId": "c", "items": [{"sku": "A", "quantity": 1}]}).to_string(), Some("text/plain"), 415, "unsupported_media_type"),
        ("GET", "/orders/not-a-uuid", String::new(), None, 400, "invalid_order_id"),
        ("GET", "/orders/6a1f3e0c-8d5b-4c1e-9f2a-3b4c5d6e7f80", String::new(), None, 404, "order_not_found"),
        ("GET", "/nowhere", String::new(), None, 404, "route_not_found"),
        ("DELETE", "/orders", String::new(), None, 405, "method_not_allowed"),
        ("PUT", "/orders/6a1f3e0c-8d5b-4c1e-9f2a-3b4c5d6e7f80", String::new(), None, 405, "method_not_allowed"),
    ];
    for (method, path, body, content_type, status, code) in cases {
        let mut req = http
            .request(method.parse().expect("method"), format!("{base}{path}"))
            .body(body.clone());
        req = req.header("content-type", content_type.unwrap_or("application/json"));
        let resp = req.send().await.expect("request");
        let got = resp.status().as_u16();
        let json: Value = resp.json().await.expect("a JSON error body");
        assert_eq!(got, status, "{method} {path}: {json}");
        assert_eq!(json["error"]["code"], code, "{method} {path}: {json}");
        assert!(
            json["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{method} {path}: {json}"
        );
    }
    // A bad idempotency key, on an otherwise good request.
    let resp = http
        .post(format!("{base}/orders"))
        .header("idempotency-key", "has space")
        .json(&json!({"customerId": "c", "items": [{"sku": "A", "quantity": 1}]}))
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status(), 400);
    assert_eq!(
        item_count(&system).await,
        0,
        "no bad request wrote anything"
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
    let poison = [
        (
            res.work_queue_url.clone(),
            "{\"type\":\"work\",\"orderId\":42}".to_owned(),
        ),
        (res.work_queue_url.clone(), "not json at all".to_owned()),
        (
            res.work_queue_url.clone(),
            json!({"type": "work", "orderId": "6a1f3e0c-8d5b-4c1e-9f2a-3b4c5d6e7f80"}).to_string(),
        ),
        (
            res.reply_queue_url.clone(),
            json!({"type": "reply"}).to_string(),
        ),
        (res.agent_queue_urls["payment"].clone(), "[]".to_owned()),
    ];
    for (url, body) in &poison {
        system
            .queue
            .send(url, body, Duration::ZERO)
            .await
            .expect("send");
    }
    assert_eq!(system.pump_scheduler().await.expect("poll"), 4);
    assert_eq!(system.pump_agents().await.expect("poll"), 1);
    let mut dead = drain(&system, &res.dead_letter_url).await;
    dead.extend(drain(&system, &res.agent_dead_letter_urls["payment"]).await);
    dead.sort();
    let mut sent: Vec<String> = poison.iter().map(|(_, b)| b.clone()).collect();
    sent.sort();
    assert_eq!(dead, sent, "every poison message is in the DLQ, unchanged");
    // Acknowledged: nothing comes back to the source queues, even after the visibility timeout.
    assert!(drain(&system, &res.work_queue_url).await.is_empty());
    assert!(drain(&system, &res.reply_queue_url).await.is_empty());
    assert_eq!(item_count(&system).await, 0);
}
