//! forEach steps at their edges, end to end in memory (the local runner's code over HTTP): an
//! operator's retry on a new input leaves a forEach step's elements, and their undos, on the
//! list they ran with; a list far longer than its `maxConcurrency` runs one element after
//! another with no waiting element re-enqueued, and the operator's lines stay in the history.

use sas_local::{Backend, Settings, System};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A system in memory with nothing published, `settings` otherwise; its operator API's base.
async fn system(settings: Settings) -> (System, String) {
    let settings = Settings {
        definitions: vec![],
        ..settings
    };
    let mut system = System::new(Backend::Memory, settings, Arc::new(sas::ports::SystemClock))
        .await
        .expect("system builds");
    let addr = sas_blackbox::serve_system(&mut system).await;
    system.start();
    (system, format!("http://{addr}/operator"))
}

async fn send(http: &reqwest::Client, put: bool, url: String, body: &Value) -> (u16, Value) {
    let req = if put { http.put(url) } else { http.post(url) };
    let r = req.json(body).send().await.expect("HTTP");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// Publishes the `stock` service (simulated) and `workflow`.
async fn publish(http: &reqwest::Client, base: &str, workflow: &Value) {
    let service = json!({"name": "stock", "target": {"type": "simulated"}});
    let (status, body) = send(http, true, format!("{base}/services/stock"), &service).await;
    assert!(status == 201 || status == 200, "{status} {body}");
    let name = workflow["name"].as_str().expect("a name");
    let (status, body) = send(http, true, format!("{base}/workflows/{name}"), workflow).await;
    assert_eq!(status, 201, "{body}");
}

/// Polls task `id` until it is in `state` (or in a final state), within `within`.
async fn until_in(
    http: &reqwest::Client,
    base: &str,
    id: &str,
    state: &str,
    within: Duration,
) -> Value {
    let until = Instant::now() + within;
    loop {
        let v = sas_blackbox::get_json(http, &format!("{base}/tasks/{id}")).await;
        let now = v["processState"].as_str().unwrap_or_default();
        if now == state || ["Processed", "Compensated", "Refused", "Resolved"].contains(&now) {
            return v;
        }
        assert!(Instant::now() < until, "task {id} not {state}: {v}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Starts a task of `workflow` on `input`; its id.
async fn start(http: &reqwest::Client, base: &str, workflow: &str, input: &Value) -> String {
    let (status, body) = send(
        http,
        false,
        format!("{base}/workflows/{workflow}/tasks"),
        input,
    )
    .await;
    assert_eq!(status, 202, "{body}");
    body["taskId"].as_str().expect("an id").to_owned()
}

/// The operator's `action` on task `id`, which must be applied.
async fn act(http: &reqwest::Client, base: &str, id: &str, action: &str, body: &Value) {
    let (status, answer) = send(http, false, format!("{base}/tasks/{id}/{action}"), body).await;
    assert_eq!(status, 202, "{action}: {answer}");
}

/// Picks each item (two at once, each undone with its item), then ships from the dock: a task
/// without a dock fails there (its request cannot be built) and waits in Error.
fn restock() -> Value {
    json!({
        "name": "restock",
        "input": {"type": "object", "required": ["items"], "properties": {
            "items": {"type": "array", "items": {"type": "string"}},
            "dock": {"type": "string"}}},
        "defaults": {"timeout": "5s"},
        "steps": [
            {"name": "pick", "service": "stock", "action": "pick-item", "forEach": "$.input.items",
             "maxConcurrency": 2, "input": {"sku": "$.element"},
             "undo": {"action": "unpick-item", "input": {"sku": "$.element"}}},
            {"name": "ship", "service": "stock", "input": {"dock": "$.input.dock"}}
        ]
    })
}

/// (Issue 40, finding 2.) A forEach step picked A, B, C; the next step failed; the operator
/// retried it on a new input with X, Y, Z; it failed again and the operator compensated: the
/// service is asked to unpick C, B, A (the items picked), never X, Y, Z.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_retry_on_a_new_input_undoes_what_a_for_each_step_ran_with() {
    let mut settings = Settings::default();
    settings.policy.auto_compensate = false;
    let (system, base) = system(settings).await;
    let http = reqwest::Client::new();
    publish(&http, &base, &restock()).await;
    let within = Duration::from_secs(30);
    let id = start(&http, &base, "restock", &json!({"items": ["A", "B", "C"]})).await;
    let v = until_in(&http, &base, &id, "Error", within).await;
    assert_eq!(v["processState"], "Error", "{v}");
    let body = json!({"reason": "new items", "input": {"items": ["X", "Y", "Z"]}});
    act(&http, &base, &id, "retry-with-input", &body).await;
    // The retry is applied (Pending) before the task can fail again.
    let v = until_in(&http, &base, &id, "Error", within).await;
    assert_eq!(v["processState"], "Error", "{v}");
    act(
        &http,
        &base,
        &id,
        "compensate",
        &json!({"reason": "give up"}),
    )
    .await;
    let v = until_in(&http, &base, &id, "Compensated", within).await;
    assert_eq!(v["processState"], "Compensated", "{v}");
    let calls = sas_blackbox::requests(&system, "stock", &id);
    let mut picked: Vec<Value> = calls
        .iter()
        .filter(|(a, _)| a == "pick-item")
        .map(|(_, i)| i["sku"].clone())
        .collect();
    picked.sort_by_key(Value::to_string);
    assert_eq!(picked, [json!("A"), json!("B"), json!("C")]);
    let unpicked: Vec<Value> = calls
        .iter()
        .filter(|(a, _)| a == "unpick-item")
        .map(|(_, i)| i["sku"].clone())
        .collect();
    assert_eq!(
        unpicked,
        [json!("C"), json!("B"), json!("A")],
        "each element's undo carries the item it picked"
    );
    system.shutdown().await;
}

/// (Issue 40, finding 3.) 30 elements of about 100 ms at 1 at once, with a pickup timeout of
/// 1 s: each element goes out as the one before it ends (the run takes about the 3 s its calls
/// take, not minutes), no waiting element is re-enqueued, and the operator's retry before it
/// stays in the history (the waiting elements' lines pushed it out).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_long_for_each_at_one_at_once_takes_its_calls_time_and_keeps_the_operators_lines() {
    let mut settings = Settings::default();
    settings.policy.auto_compensate = false;
    settings.policy.pickup_timeout = chrono::Duration::seconds(1);
    settings.supervisor_interval = Duration::from_millis(100);
    settings.poll_wait = Duration::from_millis(50);
    let latency = Duration::from_millis(100);
    settings.default_faults = sas::remote::Faults {
        latency,
        ..Default::default()
    };
    let (system, base) = system(settings).await;
    let http = reqwest::Client::new();
    let workflow = json!({
        "name": "stocktake",
        "input": {"type": "object", "required": ["lots"], "properties": {
            "lots": {"type": "array", "items": {"type": "string"}}, "aisle": {"type": "string"}}},
        "defaults": {"timeout": "5s"},
        "steps": [
            {"name": "open", "service": "stock", "input": {"aisle": "$.input.aisle"}},
            {"name": "count", "service": "stock", "forEach": "$.input.lots", "maxConcurrency": 1,
             "input": {"lot": "$.element"}}
        ]
    });
    publish(&http, &base, &workflow).await;
    let lots: Vec<String> = (0..30).map(|k| format!("lot-{k}")).collect();
    // No aisle: the first step fails; the operator retries it with one.
    let id = start(&http, &base, "stocktake", &json!({ "lots": lots })).await;
    let within = Duration::from_secs(60);
    let v = until_in(&http, &base, &id, "Error", within).await;
    assert_eq!(v["processState"], "Error", "{v}");
    let started = Instant::now();
    let body = json!({"reason": "aisle given", "input": {"lots": lots, "aisle": "a-1"}});
    act(&http, &base, &id, "retry-with-input", &body).await;
    let v = until_in(&http, &base, &id, "Processed", within).await;
    let took = started.elapsed();
    assert_eq!(v["processState"], "Processed", "{v}");
    let floor = latency * 30;
    println!("30 elements at 1 at once: {took:?} (their calls: {floor:?})");
    assert!(
        took < floor * 2 + Duration::from_secs(3),
        "took {took:?}, its calls {floor:?}"
    );
    let history = v["history"].as_array().cloned().unwrap_or_default();
    let reasons: Vec<&str> = history
        .iter()
        .filter_map(|h| h["reason"].as_str())
        .collect();
    assert!(
        reasons.iter().all(|r| !r.contains("re-enqueued")),
        "a waiting element was re-enqueued: {reasons:#?}"
    );
    assert!(
        history.iter().any(|h| h["by"].is_string()
            && h["reason"]
                .as_str()
                .is_some_and(|r| r.contains("aisle given"))),
        "the operator's retry is in the history: {reasons:#?}"
    );
    system.shutdown().await;
}
