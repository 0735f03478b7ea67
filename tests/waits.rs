//! Time in a workflow, end to end: a workflow the code has never seen, with a wait of a
//! duration and a wait until a time read from the task's input, published to a running system
//! (the local runner's code over HTTP) in memory and on the emulator. The task waits with
//! nothing sent and nothing held, then goes on after each wait's time, the later steps reading
//! when it ended; a task cancelled while it waits undoes what was done at once (a wait has
//! nothing in flight), and an operator can end a wait early; a task past its workflow's deadline
//! fails, and what it did is undone. Named events: one sent early is kept and consumed when its
//! wait is reached, a repeat is harmless, a late one is refused. A delayed start (`Start-At`).

use chrono::{DateTime, Utc};
use sas_local::{Backend, System};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// The waits' workflow: a ledger entry, 2 s of settling, a wait until the input's `at`, then
/// the payout, which reads when the settling ended.
fn payout_workflow() -> Value {
    json!({
        "name": "timed-payout",
        "input": {"type": "object", "required": ["at"], "properties": {"at": {"type": "string"}}},
        "steps": [
            {"name": "open", "service": "ledger", "undo": {"action": "close"}},
            {"name": "settle", "wait": "2s"},
            {"name": "release", "waitUntil": "$.input.at"},
            {"name": "pay", "service": "ledger",
             "input": {"settled": "$.steps['settle'].result.until"}}
        ]
    })
}

async fn put(http: &reqwest::Client, url: String, body: &Value) -> u16 {
    http.put(url)
        .json(body)
        .send()
        .await
        .expect("PUT")
        .status()
        .as_u16()
}

/// Starts a task of `workflow` on `input`, which must be accepted; its id.
async fn start(http: &reqwest::Client, base: &str, workflow: &str, input: Value) -> String {
    let r = http
        .post(format!("{base}/workflows/{workflow}/tasks"))
        .json(&input)
        .send()
        .await
        .expect("POST");
    assert_eq!(r.status().as_u16(), 202);
    let v: Value = r.json().await.expect("JSON");
    v["taskId"].as_str().expect("taskId").to_owned()
}

/// Polls task `id` until `done` holds of it.
async fn until(
    http: &reqwest::Client,
    base: &str,
    id: &str,
    within: Duration,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let by = Instant::now() + within;
    loop {
        let v: Value = sas_blackbox::get_json(http, &format!("{base}/tasks/{id}")).await;
        if done(&v) {
            return v;
        }
        assert!(Instant::now() < by, "task {id}: {v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn step<'a>(task: &'a Value, name: &str) -> &'a Value {
    task["steps"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["name"] == name))
        .unwrap_or(&Value::Null)
}

fn time(v: &Value) -> DateTime<Utc> {
    v.as_str()
        .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
        .map(|t| t.with_timezone(&Utc))
        .unwrap_or_else(|| panic!("not a time: {v}"))
}

fn terminal(v: &Value) -> bool {
    [
        "Processed",
        "Compensated",
        "Refused",
        "Error",
        "CompensationFailed",
    ]
    .contains(&v["processState"].as_str().unwrap_or_default())
}

async fn waits_hold_a_task_until_their_time(system: &System, base: &str, slack: Duration) {
    let http = reqwest::Client::new();
    let service = json!({"name": "ledger", "target": {"type": "simulated"}});
    assert!([200, 201].contains(&put(&http, format!("{base}/services/ledger"), &service).await));
    assert_eq!(
        put(
            &http,
            format!("{base}/workflows/timed-payout"),
            &payout_workflow()
        )
        .await,
        201
    );

    // Two waits in a row: 2 s, then until 4 s after the start.
    let started = Utc::now();
    let at = started + chrono::Duration::seconds(4);
    let id = start(&http, base, "timed-payout", json!({"at": at.to_rfc3339()})).await;
    let waiting = until(&http, base, &id, slack, |v| {
        step(v, "settle")["status"] == "Waiting"
    })
    .await;
    assert_eq!(waiting["processState"], "Processing", "{waiting}");
    assert!(
        step(&waiting, "settle")["service"].is_null(),
        "a wait calls no service"
    );
    let done = until(&http, base, &id, Duration::from_secs(4) + slack, terminal).await;
    assert_eq!(done["processState"], "Processed", "{done}");
    let settled = time(&step(&done, "settle")["result"]["until"]);
    assert!(settled >= started + chrono::Duration::seconds(2), "{done}");
    assert_eq!(
        time(&step(&done, "release")["result"]["until"]),
        to_millis(at),
        "{done}"
    );
    // Nothing went out for the waits, and nothing before their time.
    let requests = sas_blackbox::requests(system, "ledger", &id);
    assert_eq!(
        requests,
        [
            ("open".to_owned(), json!({"at": at.to_rfc3339()})),
            (
                "pay".to_owned(),
                json!({"settled": step(&done, "settle")["result"]["until"]})
            ),
        ]
    );
    assert!(
        time(&step(&done, "pay")["finishedAt"]) >= to_millis(at),
        "{done}"
    );

    // Cancelled while it waits: the entry is closed at once, not after the wait.
    let id = start(
        &http,
        base,
        "timed-payout",
        json!({"at": (Utc::now() + chrono::Duration::days(30)).to_rfc3339()}),
    )
    .await;
    until(&http, base, &id, slack + Duration::from_secs(2), |v| {
        step(v, "release")["status"] == "Waiting"
    })
    .await;
    let r = http
        .post(format!("{base}/tasks/{id}/cancel"))
        .json(&json!({"reason": "no longer wanted"}))
        .send()
        .await
        .expect("POST cancel");
    assert_eq!(r.status().as_u16(), 202, "{:?}", r.text().await);
    let done = until(&http, base, &id, slack, terminal).await;
    assert_eq!(done["processState"], "Compensated", "{done}");
    assert_eq!(step(&done, "release")["status"], "Cancelled", "{done}");
    let actions: Vec<String> = sas_blackbox::requests(system, "ledger", &id)
        .into_iter()
        .map(|(a, _)| a)
        .collect();
    assert_eq!(actions, ["open", "close"]);

    // An operator ends a wait of a month now: the task goes on, and the history says who.
    let id = start(
        &http,
        base,
        "timed-payout",
        json!({"at": (Utc::now() + chrono::Duration::days(30)).to_rfc3339()}),
    )
    .await;
    until(&http, base, &id, slack + Duration::from_secs(2), |v| {
        step(v, "release")["status"] == "Waiting"
    })
    .await;
    let r = http
        .post(format!("{base}/tasks/{id}/wake"))
        .json(&json!({"reason": "approved early"}))
        .send()
        .await
        .expect("POST wake");
    assert_eq!(r.status().as_u16(), 202, "{:?}", r.text().await);
    let done = until(&http, base, &id, slack, terminal).await;
    assert_eq!(done["processState"], "Processed", "{done}");
    assert!(
        done["history"].as_array().is_some_and(|h| h
            .iter()
            .any(|l| l["reason"] == "operator wake: approved early")),
        "{done}"
    );
    // No wait left: a wake is a conflict.
    let r = http
        .post(format!("{base}/tasks/{id}/wake"))
        .send()
        .await
        .expect("POST wake");
    assert_eq!(r.status().as_u16(), 409);
}

/// A task with a deadline of 3 s that waits 30 s after its first step: the deadline fails it
/// (`task_timeout`), and the step is undone, once; the deadline shows in the caller's view too.
async fn a_deadline_fails_a_task_that_waits_too_long(system: &System, base: &str, slack: Duration) {
    let http = reqwest::Client::new();
    let workflow = json!({
        "name": "hurried",
        "deadline": "3s",
        "steps": [
            {"name": "hold", "service": "ledger", "undo": {"action": "release"}},
            {"name": "linger", "wait": "30s"},
            {"name": "pay", "service": "ledger"}
        ]
    });
    assert_eq!(
        put(&http, format!("{base}/workflows/hurried"), &workflow).await,
        201
    );
    let id = start(&http, base, "hurried", json!({})).await;
    let started = Utc::now();
    let done = until(&http, base, &id, Duration::from_secs(3) + slack, terminal).await;
    assert_eq!(done["processState"], "Compensated", "{done}");
    assert!(
        done["lastError"]
            .as_str()
            .is_some_and(|e| e.starts_with("task_timeout: the task's deadline")),
        "{done}"
    );
    let deadline = time(&done["deadline"]);
    assert!(deadline <= started + chrono::Duration::seconds(3), "{done}");
    assert_eq!(step(&done, "linger")["status"], "TimedOut", "{done}");
    assert_eq!(step(&done, "pay")["status"], "Pending", "{done}");
    let actions: Vec<String> = sas_blackbox::requests(system, "ledger", &id)
        .into_iter()
        .map(|(a, _)| a)
        .collect();
    assert_eq!(actions, ["hold", "release"], "{done}");
}

/// POSTs event `name` with `payload` (and `id` as its `Event-Id`) to task `id`: the status and
/// the answer.
async fn send_event(
    http: &reqwest::Client,
    base: &str,
    task: &str,
    name: &str,
    event_id: &str,
    payload: &Value,
) -> (u16, Value) {
    let r = http
        .post(format!("{base}/tasks/{task}/events/{name}"))
        .header("Event-Id", event_id)
        .json(payload)
        .send()
        .await
        .expect("POST event");
    let status = r.status().as_u16();
    (status, r.json().await.expect("JSON answer"))
}

/// A contract sent, then a wait for the first of two events (signed or declined) with a
/// payload schema, then the payout on who signed: an event sent before the wait is reached is
/// kept and ends it when it is; a repeat is harmless; a late one, another name's, an unknown
/// name and a bad payload are refused and change nothing.
async fn events_end_their_waits(system: &System, base: &str, slack: Duration) {
    let http = reqwest::Client::new();
    let workflow = json!({
        "name": "signing",
        "steps": [
            {"name": "send", "service": "ledger", "undo": {"action": "withdraw"}},
            {"name": "settle", "wait": "2s"},
            {"name": "signature", "waitFor": ["contract-signed", "contract-declined"],
             "within": "1h", "payload": {"type": "object", "required": ["by"]}},
            {"name": "pay", "service": "ledger",
             "input": {"by": "$.steps['signature'].result.payload.by"}}
        ]
    });
    assert_eq!(
        put(&http, format!("{base}/workflows/signing"), &workflow).await,
        201
    );
    let id = start(&http, base, "signing", json!({})).await;
    // Early (the task settles first): kept. Its repeat: harmless.
    let signed = json!({"by": "ann"});
    let (status, body) = send_event(&http, base, &id, "contract-signed", "sig-1", &signed).await;
    assert_eq!((status, &body["kept"]), (202, &json!(true)), "{body}");
    let (status, body) = send_event(&http, base, &id, "contract-signed", "sig-1", &signed).await;
    assert_eq!((status, &body["duplicate"]), (200, &json!(true)), "{body}");
    // Not what the step wants, and a name the workflow never waits for: refused.
    let (status, body) = send_event(
        &http,
        base,
        &id,
        "contract-signed",
        "sig-2",
        &json!({"who": 1}),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["problems"][0]["at"], "", "{body}");
    let (status, body) = send_event(&http, base, &id, "paid", "p-1", &json!({})).await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (404, &json!("event_not_expected"))
    );
    // The settling over, the wait takes the kept event at once.
    let done = until(&http, base, &id, Duration::from_secs(2) + slack, terminal).await;
    assert_eq!(done["processState"], "Processed", "{done}");
    assert_eq!(
        step(&done, "signature")["result"],
        json!({"event": "contract-signed", "payload": {"by": "ann"}}),
        "{done}"
    );
    let requests = sas_blackbox::requests(system, "ledger", &id);
    assert_eq!(
        requests.last(),
        Some(&("pay".to_owned(), json!({"by": "ann"})))
    );
    // Too late: the step that waited for it passed.
    let (status, body) = send_event(
        &http,
        base,
        &id,
        "contract-declined",
        "dec-1",
        &json!({"by": "bob"}),
    )
    .await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (409, &json!("event_refused")),
        "{body}"
    );

    // On time: a task waiting takes the event it waits for, whichever of the two.
    let id = start(&http, base, "signing", json!({})).await;
    until(&http, base, &id, Duration::from_secs(2) + slack, |v| {
        step(v, "signature")["status"] == "Waiting"
    })
    .await;
    let (status, body) = send_event(
        &http,
        base,
        &id,
        "contract-declined",
        "dec-2",
        &json!({"by": "bob"}),
    )
    .await;
    assert_eq!((status, &body["kept"]), (202, &json!(false)), "{body}");
    let done = until(&http, base, &id, slack, terminal).await;
    assert_eq!(
        step(&done, "signature")["result"]["event"],
        "contract-declined"
    );
}

/// A task submitted with `Start-At` 3 s ahead sends nothing before then and runs after; one
/// cancelled before its start ends with nothing sent; a start too far ahead is refused.
async fn a_delayed_start_runs_at_its_time(system: &System, base: &str, slack: Duration) {
    let http = reqwest::Client::new();
    let workflow = json!({"name": "later", "steps": [{"name": "ping", "service": "ledger"}]});
    assert_eq!(
        put(&http, format!("{base}/workflows/later"), &workflow).await,
        201
    );
    let submit = |start: DateTime<Utc>| {
        http.post(format!("{base}/workflows/later/tasks"))
            .header("Start-At", start.to_rfc3339())
            .json(&json!({"n": 1}))
            .send()
    };
    let start = Utc::now() + chrono::Duration::seconds(3);
    let r = submit(start).await.expect("POST");
    assert_eq!(r.status().as_u16(), 202);
    let v: Value = r.json().await.expect("JSON");
    let id = v["taskId"].as_str().expect("taskId").to_owned();
    let early: Value = sas_blackbox::get_json(&http, &format!("{base}/tasks/{id}")).await;
    assert_eq!(early["processState"], "Pending", "{early}");
    assert_eq!(time(&early["startAt"]), to_millis(start), "{early}");
    let done = until(&http, base, &id, Duration::from_secs(3) + slack, terminal).await;
    assert_eq!(done["processState"], "Processed", "{done}");
    assert!(
        time(&step(&done, "ping")["finishedAt"]) >= to_millis(start),
        "{done}"
    );

    // Cancelled before its start: nothing was sent, nothing is.
    let r = submit(Utc::now() + chrono::Duration::days(2))
        .await
        .expect("POST");
    let v: Value = r.json().await.expect("JSON");
    let id = v["taskId"].as_str().expect("taskId").to_owned();
    let r = http
        .post(format!("{base}/tasks/{id}/cancel"))
        .json(&json!({"reason": "not needed"}))
        .send()
        .await
        .expect("POST cancel");
    assert_eq!(r.status().as_u16(), 202);
    let done = until(&http, base, &id, slack, terminal).await;
    assert_eq!(done["processState"], "Compensated", "{done}");
    assert!(sas_blackbox::requests(system, "ledger", &id).is_empty());

    let r = submit(Utc::now() + chrono::Duration::days(400))
        .await
        .expect("POST");
    assert_eq!(r.status().as_u16(), 400);
}

fn to_millis(t: DateTime<Utc>) -> DateTime<Utc> {
    sas::domain::state::to_millis(t)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waits_in_memory() {
    let (system, base) = sas_blackbox::running_system(Backend::Memory).await;
    waits_hold_a_task_until_their_time(&system, &base, Duration::from_secs(10)).await;
    a_deadline_fails_a_task_that_waits_too_long(&system, &base, Duration::from_secs(10)).await;
    events_end_their_waits(&system, &base, Duration::from_secs(10)).await;
    a_delayed_start_runs_at_its_time(&system, &base, Duration::from_secs(10)).await;
    system.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waits_on_the_emulator() {
    let config = sas_blackbox::sdk_config().await;
    let stack = sas_blackbox::template::provision(&config, &sas_blackbox::unique("waits")).await;
    let backend = Backend::Existing {
        config: Box::new(config),
        resources: Box::new(stack.resources),
    };
    let (system, base) = sas_blackbox::running_system(backend).await;
    waits_hold_a_task_until_their_time(&system, &base, Duration::from_secs(40)).await;
    a_deadline_fails_a_task_that_waits_too_long(&system, &base, Duration::from_secs(40)).await;
    events_end_their_waits(&system, &base, Duration::from_secs(40)).await;
    a_delayed_start_runs_at_its_time(&system, &base, Duration::from_secs(40)).await;
    system.shutdown().await;
}
