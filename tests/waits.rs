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
    // Under the Event-Id the first task took: an id is the task's own, not a duplicate here.
    let (status, body) = send_event(
        &http,
        base,
        &id,
        "contract-declined",
        "sig-1",
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

/// A service sends an event with `events:PutEvents` only, to the stack's task-events bus (as a
/// webhook receiver would): the bus's rule puts it on the work queue and the task's wait ends
/// with it; the same event sent again changes nothing; one that can never be taken (the task
/// ended) goes to the scheduler's dead-letter queue with its reason.
async fn events_from_the_bus_end_their_waits(
    base: &str,
    stack: &sas_blackbox::template::Stack,
    slack: Duration,
) {
    let http = reqwest::Client::new();
    let config = sas_blackbox::sdk_config().await;
    let eb = aws_sdk_eventbridge::Client::new(&config);
    let put = |detail: Value| {
        let entry = aws_sdk_eventbridge::types::PutEventsRequestEntry::builder()
            .event_bus_name(&stack.task_events_bus)
            .source("esign.webhooks")
            .detail_type("TaskEvent")
            .detail(detail.to_string())
            .build();
        eb.put_events().entries(entry).send()
    };
    let id = start(&http, base, "signing", json!({})).await;
    until(&http, base, &id, Duration::from_secs(2) + slack, |v| {
        step(v, "signature")["status"] == "Waiting"
    })
    .await;
    let signed = json!({"taskId": id, "event": "contract-signed", "eventId": "envelope-7",
                        "payload": {"by": "eve"}});
    let out = put(signed.clone()).await.expect("PutEvents");
    assert_eq!(out.failed_entry_count(), 0);
    let done = until(&http, base, &id, slack, terminal).await;
    assert_eq!(done["processState"], "Processed", "{done}");
    assert_eq!(
        step(&done, "signature")["result"],
        json!({"event": "contract-signed", "payload": {"by": "eve"}}),
        "{done}"
    );
    // Again, under the same eventId: nothing changes, nothing goes to the dead-letter queue.
    put(signed).await.expect("PutEvents");
    // For the finished task: refused, so kept in the dead-letter queue with the reason.
    put(
        json!({"taskId": id, "event": "contract-declined", "eventId": "envelope-8",
               "payload": {"by": "eve"}}),
    )
    .await
    .expect("PutEvents");
    let sqs = aws_sdk_sqs::Client::new(&config);
    let by = Instant::now() + slack;
    let letters = loop {
        let got = sqs
            .receive_message()
            .queue_url(&stack.resources.dead_letter_url)
            .message_attribute_names("All")
            .max_number_of_messages(10)
            .wait_time_seconds(1)
            .send()
            .await
            .expect("receive");
        if !got.messages().is_empty() {
            break got.messages().to_vec();
        }
        assert!(Instant::now() < by, "nothing in the dead-letter queue");
    };
    assert_eq!(letters.len(), 1, "only the refused event: {letters:?}");
    assert!(letters[0].body().unwrap_or_default().contains("envelope-8"));
    let reason = letters[0]
        .message_attributes()
        .and_then(|a| a.get(sas::ports::DEAD_LETTER_REASON))
        .and_then(|a| a.string_value())
        .unwrap_or_default()
        .to_owned();
    assert!(reason.contains("contract-declined"), "{reason}");
    let after: Value = sas_blackbox::get_json(&http, &format!("{base}/tasks/{id}")).await;
    assert_eq!(after["processState"], "Processed", "unchanged: {after}");
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
        resources: Box::new(stack.resources.clone()),
    };
    let (system, base) = sas_blackbox::running_system(backend).await;
    waits_hold_a_task_until_their_time(&system, &base, Duration::from_secs(40)).await;
    a_deadline_fails_a_task_that_waits_too_long(&system, &base, Duration::from_secs(40)).await;
    events_end_their_waits(&system, &base, Duration::from_secs(40)).await;
    events_from_the_bus_end_their_waits(&base, &stack, Duration::from_secs(40)).await;
    a_delayed_start_runs_at_its_time(&system, &base, Duration::from_secs(40)).await;
    system.shutdown().await;
}

/// The tasks schedule `name` started, newest first: (id, process state, input).
async fn scheduled_tasks(system: &System, name: &str) -> Vec<(String, String, Value)> {
    let caller = sas::Caller::new(format!("arn:sas:schedule:{name}")).expect("caller");
    let page = system
        .store
        .list_by_caller(
            &caller,
            sas::ports::Paging {
                limit: 50,
                after: None,
            },
        )
        .await
        .expect("list");
    let mut out = vec![];
    for t in page.items {
        let (task, record) = system
            .store
            .get(t.task_id)
            .await
            .expect("read")
            .expect("the task");
        out.push((
            t.task_id.to_string(),
            record.process_state.as_str().to_owned(),
            task.input,
        ));
    }
    out
}

/// `PUT`s a JSON body to the operator API.
async fn operator_put(system: &System, path: &str, body: &Value) -> (u16, Value) {
    let mut headers = http::HeaderMap::new();
    headers.insert(
        "content-type",
        http::HeaderValue::from_static("application/json"),
    );
    let resp = sas::api::handle(
        &system.operator,
        &sas_blackbox::operator(),
        &http::Method::PUT,
        &format!("/operator{path}"),
        &headers,
        body.to_string().as_bytes(),
    )
    .await;
    let status = resp.status().as_u16();
    (status, serde_json::from_str(resp.body()).expect("JSON"))
}

/// The schedule's workflow (never seen by the code) and its service.
fn nightly_files() -> Vec<(String, String)> {
    vec![
        (
            "services.yaml".into(),
            "services:\n  - {name: books, target: {type: simulated}}\n".into(),
        ),
        (
            "close-books.yaml".into(),
            "name: close-books\ninput: {type: object, required: [ledger]}\nsteps:\n  - {name: close, service: books}\n".into(),
        ),
    ]
}

/// The schedule: 02:00 in Berlin every day (01:00 UTC in winter), one task at a time.
fn nightly() -> Value {
    json!({"name": "nightly", "workflow": "close-books", "input": {"ledger": "main"},
           "expression": "cron(0 2 * * ? *)", "timezone": "Europe/Berlin"})
}

/// A schedule's runs start tasks at its times, in its time zone: none before 02:00 Berlin, one
/// at it (with the schedule's input, as the schedule's own caller); the same run delivered twice
/// starts one task; a run while the previous task has not ended starts nothing (`overlap:
/// skip`); a paused schedule starts nothing, even if its timer fires; resumed, it does again;
/// deleted, never. `clock` is the system's.
async fn schedules_start_tasks_at_their_times(system: &System, clock: &sas::ports::OffsetClock) {
    use sas::ports::Clock;
    let one_am = |day: i64| {
        let now = clock.now();
        let d = (now + chrono::Duration::days(day)).date_naive();
        d.and_hms_opt(1, 0, 0).expect("a time").and_utc()
    };
    // A second past `t` (the clock's offset is kept to the millisecond).
    let go_to = |t: DateTime<Utc>| clock.advance(t - clock.now() + chrono::Duration::seconds(1));
    // The next 01:00 UTC is 02:00 in Berlin (November): 30 s before it, no run yet. (Today's,
    // if it is still ahead: tomorrow's would leave today's run between the start and it.)
    let first = match one_am(0) {
        today if today - chrono::Duration::seconds(30) > clock.now() => today,
        _ => one_am(1),
    };
    clock.advance(first - chrono::Duration::seconds(30) - clock.now());
    assert_eq!(system.run_schedules().await.expect("look"), vec![]);
    assert!(scheduled_tasks(system, "nightly").await.is_empty());
    clock.advance(chrono::Duration::seconds(31));
    let runs = system.run_schedules().await.expect("look");
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(runs[0].at, first, "on 02:00 Berlin to the second");
    // The scheduler starts the task and sends its step; no agent runs it yet.
    system.pump_scheduler().await.expect("poll");
    system.pump_scheduler().await.expect("poll");
    let tasks = scheduled_tasks(system, "nightly").await;
    assert_eq!(tasks.len(), 1, "{tasks:?}");
    assert_eq!(tasks[0].2, json!({"ledger": "main"}));
    // EventBridge Scheduler delivers at least once: the same run again starts nothing more.
    let again = serde_json::to_string(&sas::messages::SchedulerMessage::Scheduled(runs[0].clone()))
        .expect("JSON");
    system
        .queue
        .send(&system.resources.work_queue_url, &again, Duration::ZERO)
        .await
        .expect("send");
    system.pump_scheduler().await.expect("poll");
    assert_eq!(scheduled_tasks(system, "nightly").await.len(), 1);

    // The next night, with the first task still running (its step never answered): skipped.
    system.pump_scheduler().await.expect("poll");
    go_to(one_am(1));
    let runs = system.run_schedules().await.expect("look");
    assert_eq!(runs.len(), 1, "{runs:?} at {}", clock.now());
    system.pump_scheduler().await.expect("poll");
    let tasks = scheduled_tasks(system, "nightly").await;
    assert_eq!(tasks.len(), 1, "overlap skip: {tasks:?}");
    // Its step's deadline passed during the night: the supervisor sends it again, and it ends.
    system.sweep().await.expect("sweep");
    sas_blackbox::pump_until_quiet(system, 20).await;
    let tasks = scheduled_tasks(system, "nightly").await;
    assert_eq!(tasks[0].1, "Processed", "{tasks:?}");

    // Paused: no run, and a run its timer sends anyway starts nothing.
    let (status, body) = sas_blackbox::operator_post(system, "/schedules/nightly/pause", b"").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["paused"], true, "{body}");
    assert_eq!(body["nextRun"], Value::Null, "{body}");
    go_to(one_am(1));
    assert_eq!(system.run_schedules().await.expect("look"), vec![]);
    let late = sas::messages::ScheduledRun {
        schedule: "nightly".into(),
        at: clock.now(),
    };
    let late =
        serde_json::to_string(&sas::messages::SchedulerMessage::Scheduled(late)).expect("JSON");
    system
        .queue
        .send(&system.resources.work_queue_url, &late, Duration::ZERO)
        .await
        .expect("send");
    sas_blackbox::pump_until_quiet(system, 5).await;
    assert_eq!(scheduled_tasks(system, "nightly").await.len(), 1, "paused");

    // Resumed: the next night starts a task again; the list shows the run after it.
    let (status, body) =
        sas_blackbox::operator_post(system, "/schedules/nightly/resume", b"").await;
    assert_eq!(status, 200, "{body}");
    go_to(one_am(1));
    assert_eq!(system.run_schedules().await.expect("look").len(), 1);
    sas_blackbox::pump_until_quiet(system, 20).await;
    let tasks = scheduled_tasks(system, "nightly").await;
    assert_eq!(tasks.len(), 2, "{tasks:?}");
    let (status, list) =
        sas_blackbox::operator_call(system, http::Method::GET, "/schedules", b"").await;
    assert_eq!(status, 200, "{list}");
    assert_eq!(list["schedules"][0]["name"], "nightly", "{list}");
    assert_eq!(
        time(&list["schedules"][0]["nextRun"]),
        one_am(1),
        "the next run: {list}"
    );

    // The console lists it with its next run.
    let page = sas::api::handle(
        &system.operator,
        &sas_blackbox::operator(),
        &http::Method::GET,
        "/operator/console/schedules",
        &http::HeaderMap::new(),
        b"",
    )
    .await;
    assert_eq!(page.status().as_u16(), 200);
    let next = one_am(1).format("%Y-%m-%d 01:00:00Z").to_string();
    for shown in [
        "nightly",
        "close-books",
        "cron(0 2 * * ? *)",
        "Europe/Berlin",
        next.as_str(),
    ] {
        assert!(page.body().contains(shown), "{shown}: {}", page.body());
    }

    // Deleted: gone from the API, and no run any more.
    let (status, body) =
        sas_blackbox::operator_call(system, http::Method::DELETE, "/schedules/nightly", b"").await;
    assert_eq!(status, 200, "{body}");
    let (status, body) =
        sas_blackbox::operator_call(system, http::Method::GET, "/schedules/nightly", b"").await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("schedule_not_found"))
    );
    go_to(one_am(1));
    assert_eq!(system.run_schedules().await.expect("look"), vec![]);
}

/// In memory: the schedule is published with its workflow from one folder (as `sas-local
/// workflows/` does).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_in_memory() {
    let clock = std::sync::Arc::new(sas::ports::OffsetClock::default());
    let settings = sas_local::Settings {
        definitions: vec![],
        ..sas_blackbox::manual_settings()
    };
    let system = System::new(Backend::Memory, settings, clock.clone())
        .await
        .expect("builds");
    let mut files = nightly_files();
    files.push((
        "schedules.yaml".into(),
        serde_json::to_string(&json!({"schedules": [nightly()]})).expect("JSON"),
    ));
    files[2].0 = "schedules.json".into();
    let published = system.publish(&files).await.expect("publishes");
    assert!(
        published.contains(&"schedule nightly v1".to_owned()),
        "{published:?}"
    );
    schedules_start_tasks_at_their_times(&system, &clock).await;
}

/// On the emulator: the operator API publishes the schedule and sets its EventBridge Scheduler
/// schedule in the stack's group (expression, time zone, target and role as the template
/// says), disables it when paused and removes it when deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_on_the_emulator() {
    let config = sas_blackbox::sdk_config().await;
    let stack = sas_blackbox::template::provision(&config, &sas_blackbox::unique("sched")).await;
    let timetable = std::sync::Arc::new(stack.timetable(&config));
    let clock = std::sync::Arc::new(sas::ports::OffsetClock::default());
    let settings = sas_local::Settings {
        definitions: nightly_files(),
        ..sas_blackbox::manual_settings()
    };
    let backend = Backend::Existing {
        config: Box::new(config.clone()),
        resources: Box::new(stack.resources.clone()),
    };
    let mut system = System::new(backend, settings, clock.clone())
        .await
        .expect("builds");
    system.operator.timetable = timetable;
    // Refused with pointers: an unknown zone, a workflow's input it does not take.
    let mut bad = nightly();
    bad["timezone"] = json!("Mars/Olympus");
    bad["input"] = json!({"books": 1});
    let (status, body) = operator_put(&system, "/schedules/nightly", &bad).await;
    assert_eq!(status, 400, "{body}");
    let at: Vec<&str> = body["error"]["problems"]
        .as_array()
        .unwrap_or_else(|| panic!("{body}"))
        .iter()
        .filter_map(|p| p["at"].as_str())
        .collect();
    assert_eq!(at, ["/timezone"], "{body}");
    bad["timezone"] = json!("UTC");
    let (status, body) = operator_put(&system, "/schedules/nightly", &bad).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]["problems"][0]["at"]
            .as_str()
            .is_some_and(|a| a.starts_with("/input")),
        "{body}"
    );

    let (status, body) = operator_put(&system, "/schedules/nightly", &nightly()).await;
    assert_eq!(status, 201, "{body}");
    let scheduler = aws_sdk_scheduler::Client::new(&config);
    let get = || {
        scheduler
            .get_schedule()
            .group_name(&stack.schedule_group)
            .name("nightly")
            .send()
    };
    let s = get().await.expect("the schedule is on the emulator");
    assert_eq!(s.schedule_expression(), Some("cron(0 2 * * ? *)"));
    assert_eq!(s.schedule_expression_timezone(), Some("Europe/Berlin"));
    assert_eq!(s.state().map(|s| s.as_str()), Some("ENABLED"));
    let target = s.target().expect("a target");
    assert_eq!(
        target.arn(),
        stack.queue_arns["WorkQueue"],
        "the work queue"
    );
    assert_eq!(
        target.role_arn(),
        stack.schedule_role_arn,
        "the stack's schedule role"
    );
    let input: Value = serde_json::from_str(target.input().expect("input")).expect("JSON");
    assert_eq!(
        input,
        json!({"type": "scheduled", "schedule": "nightly", "at": "<aws.scheduler.scheduled-time>"})
    );
    // What Scheduler would send on the night is a scheduler message (its time filled in).
    let sent = target
        .input()
        .expect("input")
        .replace("<aws.scheduler.scheduled-time>", "2026-11-28T01:00:00Z");
    assert!(
        serde_json::from_str::<sas::messages::SchedulerMessage>(&sent).is_ok(),
        "{sent}"
    );

    // Paused: its timer is disabled; resumed: enabled again.
    for (action, state) in [("pause", "DISABLED"), ("resume", "ENABLED")] {
        let (status, body) =
            sas_blackbox::operator_post(&system, &format!("/schedules/nightly/{action}"), b"")
                .await;
        assert_eq!(status, 200, "{body}");
        let s = get().await.expect("the schedule");
        assert_eq!(s.state().map(|s| s.as_str()), Some(state), "{action}");
        assert_eq!(
            s.schedule_expression(),
            Some("cron(0 2 * * ? *)"),
            "{action}"
        );
    }
    schedules_start_tasks_at_their_times(&system, &clock).await;
    // Deleted at the end: the timer is gone.
    let gone = get().await.expect_err("deleted");
    assert!(
        gone.as_service_error()
            .is_some_and(|e| e.is_resource_not_found_exception()),
        "{gone:?}"
    );
}

/// A wait longer than SQS's 15-minute delay ends on the dot, not up to a sweep late: the sweep
/// before its time arms a deadline timer for it (the look-ahead, as far as the sweep's
/// interval), and the timer ends it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_wait_ends_on_the_dot_through_the_sweeps_look_ahead() {
    use sas::ports::Clock;
    let clock = std::sync::Arc::new(sas::ports::OffsetClock::default());
    let mut files = nightly_files();
    files.push((
        "long-wait.yaml".into(),
        "name: long-wait\nsteps:\n  - {name: hold, wait: 20m}\n  - {name: after, service: books}\n"
            .into(),
    ));
    let settings = sas_local::Settings {
        definitions: files,
        // A sweep a minute, looking a minute ahead (as deployed).
        supervisor_interval: Duration::from_secs(60),
        ..sas_blackbox::manual_settings()
    };
    let system = System::new(Backend::Memory, settings, clock.clone())
        .await
        .expect("builds");
    let id = sas_blackbox::submit_task(&system, "long-wait", &json!({})).await;
    system.pump_scheduler().await.expect("poll");
    let record = sas_blackbox::state(&system, id).await;
    assert_eq!(
        record.steps[0].status,
        sas::StepStatus::Waiting,
        "{record:?}"
    );
    let until = record.due_at().expect("the wait's time");
    // Nothing goes out for it before then: no timer can wait 20 minutes.
    assert_eq!(system.pump_timers().await.expect("poll"), 0);
    // The sweep 2 s before its time arms a timer for it; the timer ends the wait at its time.
    clock.advance(until - clock.now() - chrono::Duration::seconds(2));
    let report = system.sweep().await.expect("sweep");
    assert_eq!(report.armed, 1, "{report:?}");
    assert_eq!(
        system.pump_timers().await.expect("poll"),
        0,
        "not before its time"
    );
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(system.pump_timers().await.expect("poll"), 1);
    let record = sas_blackbox::state(&system, id).await;
    let hold = &record.steps[0];
    assert_eq!(hold.status, sas::StepStatus::Done, "{record:?}");
    let lag = hold.finished_at.expect("finished") - until;
    assert!(
        lag >= chrono::Duration::zero() && lag < chrono::Duration::seconds(2),
        "ended {lag} after its time"
    );
}

/// Every read a schedule's run makes (the schedule's current task, a record, a caller's list)
/// and its write take 50 ms: two runs handled at once both read before either writes.
struct SlowReads;

#[async_trait::async_trait]
impl sas_local::intercept::Interceptor for SlowReads {
    async fn around<'a, R: sas_local::intercept::Reply, E: sas_local::intercept::Failure>(
        &'a self,
        next: sas_local::intercept::Next<'a, R, E>,
    ) -> Result<R, E> {
        use sas_local::intercept::Call;
        if matches!(
            next.call(),
            Call::CurrentRun { .. }
                | Call::GetState { .. }
                | Call::ListByCaller { .. }
                | Call::Create(_)
        ) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        next.run(next.call()).await
    }
}

/// `overlap: skip` runs at most one task of a schedule at a time, whatever the timing: a
/// previous task that moved on after the run's time is still running (the run delivered again
/// is told apart by its key, not by times); a task in `Error` has not ended (an operator may
/// retry it) until it is resolved; and of two runs handled at once, one starts a task and the
/// other sees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlap_skip_runs_one_task_at_a_time_whatever_the_timing() {
    use sas::handlers::start::{RunOutcome, run_schedule};
    use sas::messages::ScheduledRun;
    use sas::ports::Clock;
    let clock = std::sync::Arc::new(sas::ports::OffsetClock::default());
    let mut settings = sas_local::Settings {
        definitions: vec![],
        ..sas_blackbox::manual_settings()
    };
    // A failure waits in Error for an operator.
    settings.policy.auto_compensate = false;
    let mut ports = sas_local::ports(Backend::Memory, &settings)
        .await
        .expect("ports");
    ports.store = std::sync::Arc::new(sas_local::intercept::Intercepted::new(
        ports.store,
        std::sync::Arc::new(SlowReads),
    ));
    let system = System::from_ports(ports, settings, clock.clone());
    let mut files = nightly_files();
    files.push((
        "broken.yaml".into(),
        // Its step's input selects nothing: the step fails, the task waits in Error.
        "name: close-broken\nsteps:\n  - {name: close, service: books, input: {x: $.input.missing}}\n".into(),
    ));
    let broken = json!({"name": "broken", "workflow": "close-broken",
        "expression": "cron(0 2 * * ? *)", "timezone": "Europe/Berlin"});
    files.push((
        "schedules.json".into(),
        serde_json::to_string(&json!({"schedules": [nightly(), broken]})).expect("JSON"),
    ));
    system.publish(&files).await.expect("publishes");
    let ports = &system.scheduler.ports;
    let run = |schedule: &str, at: DateTime<Utc>| ScheduledRun {
        schedule: schedule.into(),
        at,
    };
    let started = |o: &RunOutcome| match o {
        RunOutcome::Started(s) => Some((s.task_id, s.replayed)),
        RunOutcome::Skipped(_) => None,
    };

    // 1. The first night's task is claimed (it moves on) after the second night's time, whose
    //    run comes late: skipped, the first still runs. The first night's run again: its task.
    let t1 = clock.now();
    let first = run_schedule(ports, &run("nightly", t1)).await.expect("run");
    let (task1, replayed) = started(&first).expect("the first night starts its task");
    assert!(!replayed);
    clock.advance(chrono::Duration::minutes(2));
    system.pump_scheduler().await.expect("poll");
    let record = system
        .store
        .get_state(task1)
        .await
        .expect("read")
        .expect("task");
    assert!(
        record.since > t1 + chrono::Duration::minutes(1),
        "it moved on: {record:?}"
    );
    let late = run_schedule(ports, &run("nightly", t1 + chrono::Duration::minutes(1)))
        .await
        .expect("run");
    assert!(
        matches!(&late, RunOutcome::Skipped(why) if why.contains(&task1.to_string())),
        "the first night's task has not ended: {late:?}"
    );
    let again = run_schedule(ports, &run("nightly", t1)).await.expect("run");
    assert_eq!(
        started(&again),
        Some((task1, true)),
        "the run delivered again"
    );
    assert_eq!(scheduled_tasks(&system, "nightly").await.len(), 1);

    // 2. Two runs handled at once, the first task ended: one starts a task, the other skips.
    sas_blackbox::pump_until_quiet(&system, 20).await;
    let tasks = scheduled_tasks(&system, "nightly").await;
    assert_eq!(tasks[0].1, "Processed", "{tasks:?}");
    let (r3, r4) = (
        run("nightly", t1 + chrono::Duration::minutes(3)),
        run("nightly", t1 + chrono::Duration::minutes(4)),
    );
    let (a, b) = tokio::join!(run_schedule(ports, &r3), run_schedule(ports, &r4));
    let outcomes = [a.expect("run"), b.expect("run")];
    let new: Vec<_> = outcomes.iter().filter_map(started).collect();
    assert_eq!(new.len(), 1, "one run starts a task: {outcomes:?}");
    assert!(!new[0].1);
    assert_eq!(scheduled_tasks(&system, "nightly").await.len(), 2);

    // 3. A task in Error has not ended: the next run skips (and says why) until an operator
    //    resolves it.
    let failing = run_schedule(ports, &run("broken", t1)).await.expect("run");
    let (failed, _) = started(&failing).expect("starts");
    sas_blackbox::pump_until_quiet(&system, 20).await;
    let record = system
        .store
        .get_state(failed)
        .await
        .expect("read")
        .expect("task");
    assert_eq!(record.process_state, sas::ProcessState::Error, "{record:?}");
    let next = run_schedule(ports, &run("broken", t1 + chrono::Duration::minutes(1)))
        .await
        .expect("run");
    assert!(
        matches!(&next, RunOutcome::Skipped(why) if why.contains("Error") && why.contains("operator")),
        "{next:?}"
    );
    let (status, body) = sas_blackbox::operator_post(
        &system,
        &format!("/tasks/{failed}/resolve"),
        br#"{"reason": "closed by hand"}"#,
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let after = run_schedule(ports, &run("broken", t1 + chrono::Duration::minutes(2)))
        .await
        .expect("run");
    assert!(
        started(&after).is_some(),
        "resolved, it has ended: {after:?}"
    );
}
