//! A service's limits, end to end, in memory and on the emulator: services published with
//! `limits` through the operator API of a running system (the local runner's code, served over
//! HTTP). A burst of tasks on a service that takes 3 calls at once (fewer than the agents) and
//! 20 a second (2 and 8 on the slower emulator): the simulated service measures at most that
//! many calls in it at any moment and at most the rate + the burst in any one-second window,
//! and every task ends Processed with its effect applied once. Then a slow service (calls of
//! seconds, no limits of its own: the deployment's share caps it) busy with more tasks than
//! there are agents: another service's tasks go through as fast as on an idle system.

use sas::remote::Faults;
use sas_local::{Backend, Settings, System};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The services: `core-ledger` with `limits`, `archive` (slow), `notifier`.
fn services(limits: &Limits) -> Vec<Value> {
    vec![
        json!({"name": "core-ledger", "target": {"type": "simulated"},
               "limits": {"concurrency": limits.concurrency,
                          "rate": {"perSecond": limits.per_second, "burst": limits.burst}}}),
        json!({"name": "archive", "target": {"type": "simulated"}}),
        json!({"name": "notifier", "target": {"type": "simulated"}}),
    ]
}

/// A one-step workflow `name` on `service`.
fn one_step(name: &str, service: &str) -> Value {
    json!({
        "name": name,
        "input": {"type": "object"},
        "defaults": {"timeout": "20s"},
        "steps": [{"name": "call", "service": service}]
    })
}

async fn put(http: &reqwest::Client, url: String, body: &Value) {
    let r = http.put(&url).json(body).send().await.expect("PUT");
    let status = r.status().as_u16();
    let body: Value = r.json().await.expect("JSON answer");
    assert!(status == 200 || status == 201, "{url}: {status} {body}");
}

async fn start(http: &reqwest::Client, base: &str, workflow: &str) -> String {
    let r = http
        .post(format!("{base}/workflows/{workflow}/tasks"))
        .json(&json!({}))
        .send()
        .await
        .expect("POST");
    assert_eq!(r.status().as_u16(), 202);
    let v: Value = r.json().await.expect("JSON answer");
    v["taskId"].as_str().expect("a task id").to_owned()
}

/// Polls task `id` until it is final; the task.
async fn finished(http: &reqwest::Client, base: &str, id: &str, within: Duration) -> Value {
    let until = Instant::now() + within;
    loop {
        let v = sas_blackbox::get_json(http, &format!("{base}/tasks/{id}")).await;
        let state = v["processState"].as_str().unwrap_or_default();
        if [
            "Processed",
            "Compensated",
            "CompensationFailed",
            "Error",
            "Refused",
        ]
        .contains(&state)
        {
            return v;
        }
        assert!(Instant::now() < until, "task {id} did not finish: {v}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The limited service's limits.
struct Limits {
    concurrency: u32,
    per_second: u32,
    burst: u32,
}

/// The test's sizes: the limits, tasks in the burst, the slow service's latency, and the most
/// a task of another service may take while it is busy.
struct Sizes {
    limits: Limits,
    burst: usize,
    slow: Duration,
    quick: Duration,
    within: Duration,
}

async fn system(backend: Backend, sizes: &Sizes, share: Option<u32>) -> (System, String) {
    let settings = Settings {
        definitions: vec![],
        service_share: share,
        // Four agents taking one request each: four slow calls would hold them all.
        agent_concurrency: 4,
        batch_size: 1,
        faults: HashMap::from([
            (
                "core-ledger".to_owned(),
                Faults {
                    latency: Duration::from_millis(30),
                    ..Faults::default()
                },
            ),
            (
                "archive".to_owned(),
                Faults {
                    latency: sizes.slow,
                    ..Faults::default()
                },
            ),
        ]),
        ..Settings::default()
    };
    let mut system = System::new(backend, settings, Arc::new(sas::ports::SystemClock))
        .await
        .expect("system builds");
    let addr = sas_blackbox::serve_system(&mut system).await;
    system.start();
    let base = format!("http://{addr}/operator");
    let http = reqwest::Client::new();
    for s in services(&sizes.limits) {
        let name = s["name"].as_str().unwrap_or_default().to_owned();
        put(&http, format!("{base}/services/{name}"), &s).await;
    }
    for (w, s) in [
        ("transfer", "core-ledger"),
        ("archive-document", "archive"),
        ("notify", "notifier"),
    ] {
        put(&http, format!("{base}/workflows/{w}"), &one_step(w, s)).await;
    }
    (system, base)
}

/// A burst on the limited service: the limits hold at the service, and every task ends
/// Processed, its effect applied once.
async fn a_burst_keeps_the_limits(system: &System, base: &str, sizes: &Sizes) {
    let http = reqwest::Client::new();
    let starts = (0..sizes.burst).map(|_| start(&http, base, "transfer"));
    let started = Instant::now();
    let ids = futures::future::join_all(starts).await;
    let (mut limited, mut deferrals, mut slowest) = (0, 0, Duration::ZERO);
    for id in &ids {
        let task = finished(&http, base, id, sizes.within).await;
        assert_eq!(task["processState"], "Processed", "{task}");
        let waits = task["history"].as_array().map_or(0, |h| {
            h.iter()
                .filter(|e| e.to_string().contains("over its limit"))
                .count()
        });
        limited += usize::from(waits > 0);
        deferrals += waits;
        slowest = slowest.max(started.elapsed());
    }
    let stats = system.services.get("core-ledger").stats();
    let Limits {
        concurrency,
        per_second,
        burst,
    } = sizes.limits;
    assert!(
        stats.most_calls_in_flight <= concurrency,
        "{} calls at once in a service that takes {concurrency}",
        stats.most_calls_in_flight
    );
    let most = stats.most_calls_in_any_second();
    assert!(
        most <= (per_second + burst) as usize,
        "{most} calls in one second at {per_second}/s, burst {burst}"
    );
    assert!(
        limited > 0,
        "the burst went over the limits: some tasks waited"
    );
    // Each task's effect once: a step handed back was never called.
    for id in &ids {
        let effects = sas_blackbox::effects(system, "core-ledger", id.parse().expect("id"));
        assert_eq!(effects.values().sum::<u32>(), 1, "{id}: {effects:?}");
    }
    println!(
        "burst of {}: at most {} in flight, {most} in a second, {limited} tasks waited \
         ({deferrals} times in all), all Processed within {slowest:?}",
        sizes.burst, stats.most_calls_in_flight
    );
}

/// The slow service busy with twice as many tasks as there are agents; the most another
/// service's task took from its start to Processed meanwhile.
async fn quick_tasks_beside_a_slow_service(system: &System, base: &str, sizes: &Sizes) -> Duration {
    let http = reqwest::Client::new();
    let slow: Vec<String> =
        futures::future::join_all((0..8).map(|_| start(&http, base, "archive-document"))).await;
    tokio::time::sleep(sizes.slow / 4).await;
    let mut slowest = Duration::ZERO;
    for _ in 0..6 {
        let started = Instant::now();
        let id = start(&http, base, "notify").await;
        let task = finished(&http, base, &id, sizes.within).await;
        assert_eq!(task["processState"], "Processed", "{task}");
        slowest = slowest.max(started.elapsed());
    }
    for id in &slow {
        let task = finished(&http, base, id, sizes.within).await;
        assert_eq!(task["processState"], "Processed", "{task}");
    }
    let archive = system.services.get("archive").stats();
    println!(
        "beside the slow service: slowest quick task {slowest:?}; archive at most {} in flight",
        archive.most_calls_in_flight
    );
    slowest
}

async fn the_whole_story(backend: Backend, sizes: Sizes) {
    // The slow service is slow as the share counts it: its calls outlive SLOW_CALL, so it is
    // never marked fast and each call takes its slot.
    let slow_call = sas::domain::breaker::SLOW_CALL
        .to_std()
        .expect("a positive duration");
    assert!(sizes.slow > slow_call, "{:?}", sizes.slow);
    let (system, base) = system(backend, &sizes, Some(2)).await;
    a_burst_keeps_the_limits(&system, &base, &sizes).await;
    let slowest = quick_tasks_beside_a_slow_service(&system, &base, &sizes).await;
    let archive = system.services.get("archive").stats();
    assert!(
        archive.most_calls_in_flight <= 2,
        "the slow service held {} agents, over its share of 2",
        archive.most_calls_in_flight
    );
    assert!(
        slowest < sizes.quick,
        "a quick task took {slowest:?} beside the slow service (at most {:?})",
        sizes.quick
    );
    system.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn limits_hold_and_a_slow_service_delays_no_other_in_memory() {
    let sizes = Sizes {
        limits: Limits {
            concurrency: 3,
            per_second: 20,
            burst: 5,
        },
        burst: 120,
        slow: Duration::from_millis(1500),
        quick: Duration::from_millis(1000),
        within: Duration::from_secs(60),
    };
    the_whole_story(Backend::Memory, sizes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn limits_hold_and_a_slow_service_delays_no_other_on_the_emulator() {
    let config = sas_blackbox::sdk_config().await;
    let stack = sas_blackbox::template::provision(&config, &sas_blackbox::unique("limits")).await;
    let backend = Backend::Existing {
        config: Box::new(config),
        resources: Box::new(stack.resources),
    };
    // The emulator is slower: lower limits, so the burst goes over them. A quick task held
    // behind a slow call would take the slow call's 6 s and its own time; alone it takes well
    // under a second, up to 2.8 s on a loaded CI machine: 4.5 s tells the two apart.
    let sizes = Sizes {
        limits: Limits {
            concurrency: 2,
            per_second: 8,
            burst: 2,
        },
        burst: 40,
        slow: Duration::from_millis(6000),
        quick: Duration::from_millis(4500),
        within: Duration::from_secs(90),
    };
    the_whole_story(backend, sizes).await;
}
