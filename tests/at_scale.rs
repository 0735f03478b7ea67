//! Work at any size, end to end (issue 42's proof): a workflow the code has never seen, written
//! by the test and published through the operator API of a running system (the local runner's
//! code, served over HTTP). It opens a period, runs a sub-workflow (a settlement of two steps,
//! each with its undo), posts invoices read from an S3 object (JSON Lines) as a distributed
//! forEach, builds a 1 MB report and files it with the task's 1 MB quote. In memory at the
//! issue's size (5,000 invoices at `maxConcurrency: 200`, invoice 3,000 disputed, each invoice
//! a record of its own); on the stack's own resources on the emulator at a fiftieth of it, in
//! chunks (see [`ON_THE_EMULATOR`]).
//!
//! - A task reaches `Processed`: every invoice posted once, in its place in the step's result
//!   (JSON Lines by reference);
//!   the quote and the report reach the filing's body intact; the task's record stays small.
//! - A task whose list disputes an invoice reaches `Refused`: the undos are exactly the effects
//!   that were applied (the invoices posted before the run stopped, the child's two steps, the
//!   opened period), each once, and nothing stays applied.
//! - The service never sees more than `maxConcurrency` of a task's invoices at once.
//!
//! The service keeps the written contract: one outcome per idempotency key (the same answer to
//! a key asked again), an undo names what it undoes (`Sas-Undoes`).

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use sas_local::{Backend, Settings, System};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const MB: usize = 1024 * 1024;
/// How large a month-end is.
#[derive(Clone, Copy)]
struct Scale {
    invoices: usize,
    /// The invoice the second month's list disputes.
    refused_at: usize,
    /// The forEach's `maxConcurrency`.
    at_once: usize,
    /// The forEach's `chunk` (1: each invoice a record of its own).
    chunk: usize,
}

impl Scale {
    /// The invoices a record keeps: at most `chunk`, and the list over `maxConcurrency`.
    fn per_record(&self) -> usize {
        self.chunk.min(self.invoices / self.at_once).max(1)
    }
}

/// The size: in memory.
const FULL: Scale = Scale {
    invoices: 5_000,
    refused_at: 3_000,
    at_once: 200,
    chunk: 1,
};

/// On the emulator: moto's SQS answers a few dozen receives and deletes a second, and each
/// invoice takes a dozen queue calls forward and as many for its undo (500 invoices took
/// about 3 minutes a month there, with DynamoDB on DynamoDB Local; in chunks, 1,000 invoices
/// took 11 minutes for both months; at 5,000 and 200 at once moto served about 90 requests a
/// second, so calls outlived their 30 s timeout and the run stopped), so the emulator runs the
/// same test at a fiftieth of the size; the size itself is proven in memory. There the invoices
/// go in chunks of 5 (`chunk: 10`, at most the list over `maxConcurrency`): chunks on DynamoDB,
/// SQS and S3, where the IAM test runs a forEach of one record an element.
const ON_THE_EMULATOR: Scale = Scale {
    invoices: 100,
    refused_at: 60,
    at_once: 20,
    chunk: 10,
};

/// The emulator's size: [`ON_THE_EMULATOR`], or `SAS_AT_SCALE_INVOICES` invoices (the one at
/// three fifths of the list disputed, [`FULL`]'s `maxConcurrency`) for a longer run by hand.
fn on_the_emulator() -> Scale {
    match std::env::var("SAS_AT_SCALE_INVOICES")
        .ok()
        .and_then(|n| n.parse::<usize>().ok())
    {
        Some(invoices) if invoices >= 10 => Scale {
            invoices,
            refused_at: invoices * 3 / 5,
            at_once: FULL.at_once,
            chunk: ON_THE_EMULATOR.chunk,
        },
        _ => ON_THE_EMULATOR,
    }
}
/// Where the lists are kept (a team's own bucket, not the stack's).
const LISTS: &str = "month-end-lists";

/// What the test's service saw.
#[derive(Default)]
struct Books {
    /// Each key's first answer: a key asked again gets it again, and applies nothing.
    answers: HashMap<String, (u16, Value)>,
    /// Each forward key's effect: 1 applied, 0 undone.
    applied: BTreeMap<String, i32>,
    /// The keys undone, in order (each once, by its undo's own key).
    undone: Vec<String>,
    /// The bodies filed.
    filed: Vec<Value>,
    /// Invoices in flight now, and the most ever, per task.
    in_flight: HashMap<String, usize>,
    most_in_flight: HashMap<String, usize>,
}

type Shared = Arc<Mutex<Books>>;

fn report() -> String {
    "fedcba9876543210".repeat(MB / 16)
}

fn quote() -> Value {
    let lines: Vec<Value> = (0..8_000)
        .map(|i| json!({"sku": format!("sku-{i:05}"), "quantity": i % 9 + 1, "note": "q".repeat(100)}))
        .collect();
    json!({"customerId": "c-77", "lines": lines})
}

const UNDOS: [&str; 4] = ["reopen-period", "void", "refund", "void-invoice"];

async fn books_call(
    State(books): State<Shared>,
    Path(action): Path<String>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let Some(key) = header("idempotency-key") else {
        return (StatusCode::BAD_REQUEST, "no Idempotency-Key").into_response();
    };
    let task = key.split(':').next().unwrap_or_default().to_owned();
    let posting = action == "post-invoice";
    if posting {
        let mut b = books.lock().expect("lock");
        let now = {
            let n = b.in_flight.entry(task.clone()).or_default();
            *n += 1;
            *n
        };
        let most = b.most_in_flight.entry(task.clone()).or_default();
        *most = (*most).max(now);
    }
    // Posting takes a moment, so that invoices overlap at the service.
    if posting {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let mut b = books.lock().expect("lock");
    if posting && let Some(n) = b.in_flight.get_mut(&task) {
        *n -= 1;
    }
    if let Some((status, answer)) = b.answers.get(&key) {
        let status = StatusCode::from_u16(*status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        return (status, Json(answer.clone())).into_response();
    }
    let (status, answer) = if UNDOS.contains(&action.as_str()) {
        let Some(undoes) = header("sas-undoes") else {
            return (StatusCode::BAD_REQUEST, "an undo without Sas-Undoes").into_response();
        };
        if let Some(n) = b.applied.get_mut(&undoes) {
            *n -= 1;
        }
        b.undone.push(undoes);
        (200, json!({"undone": true}))
    } else if body["invoice"]["refuse"] == json!(true) {
        (
            422,
            json!({"error": {"code": "invoice_disputed", "message": "the customer disputes it"}}),
        )
    } else {
        b.applied.insert(key.clone(), 1);
        match action.as_str() {
            "build-report" => (200, json!({"id": key, "report": report()})),
            "file" => {
                b.filed.push(body.clone());
                (200, json!({"filed": true}))
            }
            _ => (200, json!({"id": key})),
        }
    };
    b.answers.insert(key, (status, answer.clone()));
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, Json(answer)).into_response()
}

async fn books() -> (String, Shared) {
    let books: Shared = Arc::default();
    let app = axum::Router::new()
        .route("/{action}", post(books_call))
        .with_state(books.clone())
        .layer(axum::extract::DefaultBodyLimit::max(16 * MB));
    (sas_blackbox::serve_loopback(app).await, books)
}

/// The settlement every month-end runs, and reuses: two steps, each with its undo.
fn settlement() -> Value {
    json!({
        "name": "settlement",
        "description": "A sub-process of the test's own",
        "defaults": {"timeout": "30s"},
        "steps": [
            {"name": "authorise", "service": "books", "input": {"period": "$.input.period"},
             "undo": {"action": "void"}},
            {"name": "capture", "service": "books", "input": {"authorisation": "$.steps.authorise.result.id"},
             "undo": {"action": "refund"}}
        ],
        "output": {"captured": "$.steps.capture.result.id"}
    })
}

fn month_end(at_once: usize, chunk: usize) -> Value {
    json!({
        "name": "month-end",
        "description": "Written by the test: never seen by the code",
        "input": {
            "type": "object",
            "required": ["period", "invoices"],
            "properties": {
                "period": {"type": "string"},
                "invoices": {"type": "string", "pattern": "^s3://"},
                "quote": {"type": "object"}
            }
        },
        "defaults": {"timeout": "30s"},
        "steps": [
            {"name": "open-period", "service": "books", "input": {"period": "$.input.period"},
             "undo": {"action": "reopen-period"}},
            {"name": "settle", "workflow": "settlement", "input": {"period": "$.input.period"}},
            {"name": "post", "service": "books", "action": "post-invoice",
             "forEach": "$.input.invoices", "distributed": true, "maxConcurrency": at_once,
             "chunk": chunk,
             "input": {"invoice": "$.element", "at": "$.index", "period": "$.input.period"},
             "undo": {"action": "void-invoice"}},
            {"name": "report", "service": "books", "action": "build-report",
             "input": {"settled": "$.steps.settle.result.captured"}},
            {"name": "file", "service": "books",
             "input": {"quote": "$.input.quote", "report": "$.steps.report.result.report"}}
        ]
    })
}

/// A list of invoices as JSON Lines; invoice `refuse` (if any) is disputed.
fn invoices(period: &str, n: usize, refuse: Option<usize>) -> Vec<u8> {
    let lines: Vec<String> = (0..n)
        .map(|i| {
            let mut v = json!({"number": format!("{period}-{i:05}"), "amount": i % 97 + 1});
            if Some(i) == refuse {
                v["refuse"] = json!(true);
            }
            v.to_string()
        })
        .collect();
    lines.join("\n").into_bytes()
}

async fn put(http: &reqwest::Client, url: String, body: &Value) {
    let r = http.put(&url).json(body).send().await.expect("PUT");
    let status = r.status().as_u16();
    let answer: Value = r.json().await.expect("JSON answer");
    assert!(status == 201 || status == 200, "{url}: {status} {answer}");
}

async fn publish(http: &reqwest::Client, base: &str, books_url: &str, scale: Scale) {
    let service = json!({"name": "books", "description": "the test's ledger",
        "target": {"type": "http", "baseUrl": books_url}});
    put(http, format!("{base}/services/books"), &service).await;
    put(http, format!("{base}/workflows/settlement"), &settlement()).await;
    put(
        http,
        format!("{base}/workflows/month-end"),
        &month_end(scale.at_once, scale.chunk),
    )
    .await;
}

async fn start(http: &reqwest::Client, base: &str, input: &Value) -> String {
    let r = http
        .post(format!("{base}/workflows/month-end/tasks"))
        .json(input)
        .send()
        .await
        .expect("POST");
    let status = r.status().as_u16();
    let answer: Value = r.json().await.expect("JSON answer");
    assert_eq!(status, 202, "{answer}");
    answer["taskId"].as_str().expect("taskId").to_owned()
}

/// Polls the task until it ends; its record as the store reads it (whole).
async fn ended(system: &System, id: &str, within: Duration) -> sas::StateRecord {
    let id: sas::TaskId = id.parse().expect("a task id");
    let until = Instant::now() + within;
    loop {
        let record = system.store.get_state(id).await.expect("reads");
        if let Some(r) = record.filter(|r| r.process_state.is_terminal()) {
            return r;
        }
        if Instant::now() > until {
            let r = system
                .store
                .get_state(id)
                .await
                .expect("reads")
                .expect("kept");
            let run = sas::handlers::runs::run_id(&sas::messages::idempotency_key(
                id,
                "post",
                "post-invoice",
                0,
            ));
            let run = system.store.get_state(run).await.expect("reads");
            panic!(
                "task {id} did not end in {within:?}: {} at step {}, {:?}; its run: {:?}",
                r.process_state,
                r.step_index,
                r.history.iter().rev().take(5).collect::<Vec<_>>(),
                run.map(|r| (
                    r.process_state,
                    r.run.map(|s| s.ledger.to_string()),
                    r.history.into_iter().rev().take(3).collect::<Vec<_>>()
                ))
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The keys of `task`'s own steps and elements, and of its child's.
fn keys_of<'a>(books: &'a Books, task: &str, child: &str) -> Vec<(&'a String, i32)> {
    books
        .applied
        .iter()
        .filter(|(k, _)| k.starts_with(&format!("{task}:")) || k.starts_with(&format!("{child}:")))
        .map(|(k, n)| (k, *n))
        .collect()
}

fn child_of(task: &str) -> String {
    let id: sas::TaskId = task.parse().expect("a task id");
    sas::handlers::children::child_id(&sas::messages::idempotency_key(
        id,
        "settle",
        "settlement",
        0,
    ))
    .to_string()
}

async fn month_end_at_scale(
    system: &System,
    base: &str,
    books: &Shared,
    lists: &str,
    scale: Scale,
    within: Duration,
) {
    let Scale {
        invoices: n,
        refused_at,
        at_once,
        ..
    } = scale;
    let per_record = scale.per_record();
    let http = reqwest::Client::new();

    // To Processed: 5,000 invoices, a 1 MB quote, a 1 MB report.
    let quote = quote();
    assert!(quote.to_string().len() > MB);
    let input = json!({"period": "2026-11", "invoices": format!("s3://{lists}/2026-11.jsonl"), "quote": quote});
    let id = start(&http, base, &input).await;
    let done = ended(system, &id, within).await;
    assert_eq!(
        done.process_state,
        sas::ProcessState::Processed,
        "{:?} {:?}",
        done.last_error,
        done.history
    );
    {
        let b = books.lock().expect("lock");
        let child = child_of(&id);
        let applied = keys_of(&b, &id, &child);
        let posted = applied.iter().filter(|(k, _)| k.contains(":post#")).count();
        assert_eq!(posted, n, "each invoice posted once");
        assert!(applied.iter().all(|(_, n)| *n == 1), "nothing undone");
        assert_eq!(
            applied.len(),
            n + 5,
            "the period, the child's two steps, the invoices, the report, the filing"
        );
        let most = b.most_in_flight.get(&id).copied().unwrap_or_default();
        assert!(
            (2..=at_once).contains(&most),
            "{most} invoices at once at the service"
        );
        // (Compared, never printed: megabytes.)
        assert_eq!(b.filed.len(), 1, "one filing");
        assert!(
            b.filed[0]["quote"] == quote,
            "the 1 MB input reached the body intact"
        );
        assert!(
            b.filed[0]["report"].as_str() == Some(report().as_str()),
            "the 1 MB result reached the body intact"
        );
    }
    // The step's result: each invoice's result in its place; past a message's inline size as
    // JSON Lines by reference, never read into the task's record (no query reads it).
    let step = &done.steps[2];
    let posted: Value = match &step.result_ref {
        Some(kept) if kept.lines.is_some() => {
            assert_eq!(step.result, None);
            assert_eq!(kept.lines.as_ref().map(|l| l.count), Some(n as u64));
            let body = system
                .scheduler
                .ports
                .payloads
                .get(kept)
                .await
                .expect("the step's results");
            sas::domain::payload::parse_lines(&body).expect("JSON Lines")
        }
        _ => {
            let text = step.result.as_deref().expect("a result");
            assert!(
                text.len() <= sas::domain::payload::SHOWN_WHOLE_BYTES,
                "{} bytes inline",
                text.len()
            );
            serde_json::from_str(text).expect("JSON")
        }
    };
    let posted = posted.as_array().expect("a list");
    assert_eq!(posted.len(), n);
    for k in [0, 1, refused_at - 1, n - 1] {
        assert_eq!(
            posted[k]["id"],
            json!(format!("{id}:post#{k}:post-invoice")),
            "invoice {k} in its place"
        );
    }

    // A list that refuses invoice 3,000: Refused, with exactly the undos of what took effect.
    let input = json!({"period": "2026-12", "invoices": format!("s3://{lists}/2026-12.jsonl")});
    let id = start(&http, base, &input).await;
    let refused = ended(system, &id, within).await;
    assert_eq!(
        refused.process_state,
        sas::ProcessState::Refused,
        "{:?} {:?}",
        refused.last_error,
        refused.history
    );
    assert_eq!(
        refused.refusal.as_ref().map(|r| r.code.as_str()),
        Some("elements_refused")
    );
    let b = books.lock().expect("lock");
    let child = child_of(&id);
    let applied = keys_of(&b, &id, &child);
    assert!(
        applied.iter().all(|(_, n)| *n == 0),
        "nothing stays applied"
    );
    let mut took_effect: Vec<&String> = applied.iter().map(|(k, _)| *k).collect();
    took_effect.sort();
    let mut undone: Vec<&String> = b
        .undone
        .iter()
        .filter(|k| k.starts_with(&format!("{id}:")) || k.starts_with(&format!("{child}:")))
        .collect();
    undone.sort();
    assert_eq!(
        undone, took_effect,
        "exactly the undos of what took effect, each once"
    );
    let posted = took_effect.iter().filter(|k| k.contains(":post#")).count();
    // The run stops at the refusal: what was out finishes, nothing opens after it. What was
    // out: up to `at_once` records when the refused invoice opened, and one more for each end
    // applied while the refusal travels to the run (a busy machine slows that: 3,202 were seen
    // once at 3,000 and 200 at once): half a window more is allowed, short of the list's end
    // at the full size. In chunks each record out finishes its invoices, and the refusal
    // reaches the run with its chunk's end.
    let first = refused_at / per_record * per_record;
    let window = (at_once + at_once / 2) * per_record;
    assert!(
        (first.saturating_sub(at_once * per_record)..(first + per_record + window).min(n))
            .contains(&posted),
        "{posted} invoices posted before the run stopped"
    );
    assert!(
        !took_effect
            .iter()
            .any(|k| **k == format!("{id}:post#{refused_at}:post-invoice")),
        "the disputed invoice took no effect"
    );
    assert_eq!(
        took_effect.len(),
        posted + 3,
        "the period and the child's two steps"
    );
    let most = b.most_in_flight.get(&id).copied().unwrap_or_default();
    assert!(most <= at_once, "{most} invoices at once at the service");
}

fn settings() -> Settings {
    Settings {
        definitions: vec![],
        agent_concurrency: 8,
        scheduler_concurrency: 4,
        ..Settings::default()
    }
}

async fn serve(mut system: System, books_url: &str, scale: Scale) -> (System, String) {
    let addr = sas_blackbox::serve_system(&mut system).await;
    system.start();
    let base = format!("http://{addr}/operator");
    publish(&reqwest::Client::new(), &base, books_url, scale).await;
    (system, base)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_month_end_of_5000_invoices_in_memory() {
    let (books_url, books) = books().await;
    let settings = settings();
    let mut ports = sas_local::ports(Backend::Memory, &settings)
        .await
        .expect("ports");
    let objects = Arc::new(sas::memory::MemoryPayloads::new());
    objects.put_object(
        LISTS,
        "2026-11.jsonl",
        invoices("2026-11", FULL.invoices, None),
    );
    objects.put_object(
        LISTS,
        "2026-12.jsonl",
        invoices("2026-12", FULL.invoices, Some(FULL.refused_at)),
    );
    ports.payloads = objects;
    let raw = ports.store.clone();
    let system = System::from_ports(ports, settings, Arc::new(sas::ports::SystemClock));
    let (system, base) = serve(system, &books_url, FULL).await;
    month_end_at_scale(
        &system,
        &base,
        &books,
        LISTS,
        FULL,
        Duration::from_secs(120),
    )
    .await;
    // The task's record as stored holds one step state for the forEach, whatever the list's
    // length, and its payloads by reference.
    let tasks = sas::ports::InState {
        state: sas::ProcessState::Processed,
        workflow: Some("month-end"),
    };
    let page = sas::ports::TaskLists::list(
        system.store.as_ref(),
        tasks,
        sas::ports::Paging {
            limit: 10,
            after: None,
        },
    )
    .await
    .expect("lists");
    assert_eq!(page.items.len(), 1);
    let stored = raw
        .get_state(page.items[0].task_id)
        .await
        .expect("reads")
        .expect("kept");
    let bytes = serde_json::to_vec(&stored).expect("json").len();
    assert!(bytes < 16 * 1024, "the task's record is {bytes} bytes");
    system.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_month_end_of_100_invoices_on_the_emulator() {
    let scale = on_the_emulator();
    let (books_url, books) = books().await;
    let config = sas_blackbox::sdk_config().await;
    let s3 = aws_sdk_s3::Client::from_conf(
        aws_sdk_s3::config::Builder::from(&config)
            .force_path_style(true)
            .build(),
    );
    let bucket = sas_blackbox::unique(LISTS);
    s3.create_bucket()
        .bucket(&bucket)
        .send()
        .await
        .expect("a bucket");
    for (key, body) in [
        ("2026-11.jsonl", invoices("2026-11", scale.invoices, None)),
        (
            "2026-12.jsonl",
            invoices("2026-12", scale.invoices, Some(scale.refused_at)),
        ),
    ] {
        s3.put_object()
            .bucket(&bucket)
            .key(key)
            .body(body.into())
            .send()
            .await
            .expect("a list");
    }
    let stack = sas_blackbox::template::provision(&config, &sas_blackbox::unique("scale")).await;
    let backend = Backend::Existing {
        config: Box::new(config),
        resources: Box::new(stack.resources),
    };
    let system = System::new(backend, settings(), Arc::new(sas::ports::SystemClock))
        .await
        .expect("a system on the emulator");
    let (system, base) = serve(system, &books_url, scale).await;
    month_end_at_scale(
        &system,
        &base,
        &books,
        &bucket,
        scale,
        // About a second an invoice on moto, for a run by hand at a larger size.
        Duration::from_secs(600.max(scale.invoices as u64 * 2)),
    )
    .await;
    system.shutdown().await;
}
