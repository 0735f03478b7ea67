//! Test support: the emulator connection, systems wired to it or to memory, and the contract
//! suite that both the in-memory and the AWS adapters must pass.

pub mod contract;
pub mod template;

use aws_config::{BehaviorVersion, Region};
use sas::OrderId;
use sas::aws::provision;
use sas::local::{Backend, Settings, System};
use sas::ports::{Clock, OffsetClock};
use sas::{Backoff, Policy};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

/// The emulator's endpoint, from `SAS_TEST_ENDPOINT` (set by `infra/test.sh`). Tests that need
/// it fail loudly without it, and refuse anything but a loopback address: tests never reach
/// real AWS.
pub fn endpoint() -> String {
    let ep = std::env::var("SAS_TEST_ENDPOINT").unwrap_or_else(|_| {
        panic!(
            "SAS_TEST_ENDPOINT is not set: these tests need the AWS API emulator; run ./infra/test.sh"
        )
    });
    let url = url_host(&ep);
    assert!(
        matches!(url.as_str(), "127.0.0.1" | "localhost" | "[::1]"),
        "SAS_TEST_ENDPOINT must be a loopback address, not {ep}"
    );
    ep
}

fn url_host(ep: &str) -> String {
    ep.split("://")
        .nth(1)
        .unwrap_or(ep)
        .split(['/', ':'])
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// SDK configuration for the emulator: dummy credentials, us-east-1, the loopback endpoint.
pub async fn sdk_config() -> aws_config::SdkConfig {
    aws_config::defaults(BehaviorVersion::latest())
        .endpoint_url(endpoint())
        .region(Region::new("us-east-1"))
        .credentials_provider(aws_sdk_dynamodb::config::Credentials::new(
            "test",
            "test",
            None,
            None,
            "sas-tests",
        ))
        .load()
        .await
}

/// A resource-name prefix unique to one test run of one test.
pub fn unique(name: &str) -> String {
    let id = uuid::Uuid::new_v4().simple().to_string();
    format!("t-{name}-{}", &id[..8])
}

/// Settings for step-by-step tests: long deadlines (tests move the clock instead of waiting),
/// no retry delay (so re-enqueued work is visible at once), quick agent backoff.
pub fn manual_settings() -> Settings {
    Settings {
        policy: Policy {
            step_timeout: chrono::Duration::seconds(30),
            pickup_timeout: chrono::Duration::seconds(60),
            failure_threshold: 3,
            retry_base_delay: chrono::Duration::zero(),
            retry_max_delay: chrono::Duration::zero(),
            auto_compensate: true,
            cooldown: chrono::Duration::zero(),
            max_rounds: 0,
        },
        backoff: Backoff {
            base: chrono::Duration::milliseconds(5),
            cap: chrono::Duration::milliseconds(50),
        },
        ..Settings::default()
    }
}

/// A system on the emulator with a clock the test can move, on its own copy of the
/// resources `template.yaml` defines (named with a unique stage).
pub async fn aws_system(name: &str, settings: Settings) -> (System, Arc<OffsetClock>) {
    let clock = Arc::new(OffsetClock::default());
    let config = sdk_config().await;
    let stack = template::provision(&config, &unique(name)).await;
    let backend = Backend::Existing {
        config: Box::new(config),
        resources: Box::new(stack.resources),
    };
    let system = System::new(backend, settings, clock.clone() as Arc<dyn Clock>)
        .await
        .expect("system builds on the emulator");
    (system, clock)
}

/// A fresh queue on the emulator subscribed to the system's bus for the given detail types.
pub async fn subscribe(system: &System, detail_types: &[&str]) -> String {
    let config = sdk_config().await;
    let sqs = aws_sdk_sqs::Client::new(&config);
    let name = unique("events");
    let url = provision::create_queue(&sqs, &name, None, Default::default())
        .await
        .expect("queue");
    provision::route_to_queue(
        &config,
        &system.resources.bus_name,
        &name,
        detail_types,
        &url,
    )
    .await
    .expect("rule");
    url
}

/// Receives and deletes every message a queue holds now (bodies, in arrival order as far as
/// SQS tells).
pub async fn drain(system: &System, url: &str) -> Vec<String> {
    let mut out = Vec::new();
    loop {
        let got = system
            .queue
            .receive(url, 10, Duration::ZERO)
            .await
            .expect("receive");
        if got.is_empty() {
            return out;
        }
        for m in got {
            system
                .queue
                .delete(url, &m.receipt_handle)
                .await
                .expect("delete");
            out.push(m.body);
        }
    }
}

/// How many items the system's table holds (tests own their table, so a scan is fine here).
pub async fn item_count(system: &System) -> i32 {
    let ddb = aws_sdk_dynamodb::Client::new(&sdk_config().await);
    ddb.scan()
        .table_name(&system.resources.table)
        .select(aws_sdk_dynamodb::types::Select::Count)
        .send()
        .await
        .expect("scan")
        .count()
}

/// Pumps the scheduler and agents until nothing moves, up to `rounds` turns.
pub async fn pump_until_quiet(system: &System, rounds: usize) {
    for _ in 0..rounds {
        let moved = system.pump_scheduler().await.expect("scheduler poll")
            + system.pump_agents().await.expect("agent poll");
        if moved == 0 {
            return;
        }
    }
}

/// A valid order request body.
pub fn order_body() -> Value {
    json!({"customerId": "c-42", "items": [{"sku": "SKU-1", "quantity": 2}]})
}

/// Submits through the submission handler with the request API Gateway would send.
pub async fn submit(system: &System, key: Option<&str>, body: &Value) -> (u16, Value) {
    let mut headers = http::HeaderMap::new();
    headers.insert(
        "content-type",
        http::HeaderValue::from_static("application/json"),
    );
    if let Some(k) = key {
        headers.insert(
            "idempotency-key",
            http::HeaderValue::from_str(k).expect("header"),
        );
    }
    let resp = sas::handlers::submission::handle(
        &system.submission,
        &http::Method::POST,
        "/orders",
        &headers,
        body.to_string().as_bytes(),
    )
    .await;
    let status = resp.status().as_u16();
    (
        status,
        serde_json::from_str(resp.body()).expect("JSON body"),
    )
}

/// Submits a valid order and returns its id (asserting the 202).
pub async fn submit_ok(system: &System) -> OrderId {
    let (status, body) = submit(system, None, &order_body()).await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["processState"], "Pending");
    body["orderId"]
        .as_str()
        .expect("orderId")
        .parse()
        .expect("uuid")
}

/// The order's state record (it must exist).
pub async fn state(system: &System, id: OrderId) -> sas::StateRecord {
    system
        .store
        .get_state(id)
        .await
        .expect("read")
        .expect("record exists")
}

/// The JSON messages a queue receives within about five seconds, until there are `n`.
pub async fn wait_for_messages(system: &System, url: &str, n: usize) -> Vec<Value> {
    let mut got = Vec::new();
    for _ in 0..50 {
        got.extend(
            drain(system, url)
                .await
                .iter()
                .map(|b| serde_json::from_str::<Value>(b).expect("JSON")),
        );
        if got.len() >= n {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    got
}
