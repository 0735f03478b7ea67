//! Least privilege, checked both ways: the template's IAM policies against the AWS calls each
//! function makes.
//!
//! Each function runs in its own `System` (its own catalog cache, as its own Lambda would) on
//! the emulator, over resources created from the template, with SDK clients whose interceptor
//! (`support/iam.rs`) records every request under the function's logical id. The flows cover
//! what each function does: submissions (with an idempotency key and its replay, a large
//! input's replay by a caller and by the operator, whose object is deleted again, a reply
//! queue, the rate limit, first steps claimed at submission in either lane), reads, a caller's
//! list and cancel, an unknown callback; claims,
//! replies and compensations; the agent's calls to a Lambda service, an HTTP service with a
//! Secrets Manager token and one with an SSM API key, and its breakers; the supervisor's sweep
//! (leases, an expired step, an owed outbox) and timers; the operator's list, reads,
//! publications, cancel and retry with a large input; a distributed forEach over a list in the
//! bucket the template's `ListBucketName` names (the run kept and started by the agent, an
//! element cancelled by the operator, who sends its end, the others' ends owed and sent by the
//! supervisor, then by the scheduler, which applies them, and the element that took effect
//! undone); poison messages to each dead-letter
//! queue; payloads over the inline sizes (a task's input over a message's inline size, its
//! step's body and its service's answer too: each written and read by the function that does
//! so, asserted per function, each with its own cache as its own Lambda instance). Then:
//!
//! - every recorded call is allowed by a statement of its function's role (action, resource,
//!   and `dynamodb:LeadingKeys` for table items);
//! - every action a statement allows, on each resource and leading-key pattern it names, is
//!   made by some call of that function, except the queue-consuming actions, which must instead
//!   belong to an event source mapping of that function on that queue.
//!
//! The table of calls is printed and written to `target/iam-calls.md`.

use http::{HeaderMap, HeaderValue, Method};
use sas::api;
use sas::catalog;
use sas::domain::payload::{INLINE_PAYLOAD_BYTES, MESSAGE_INLINE_BYTES};
use sas::ports::{Clock, OffsetClock};
use sas::remote::{Faults, SimulatedService};
use sas_blackbox::iam::{Call, ROLE, Recorder};
use sas_blackbox::{sdk_config, serve_loopback, template, unique};
use sas_local::{AwsClients, System, aws_ports_from};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

const SUBMISSION: &str = "SubmissionFunction";
const OPERATOR: &str = "OperatorFunction";
const SCHEDULER: &str = "SchedulerFunction";
const AGENT: &str = "AgentFunction";
const SUPERVISOR: &str = "SupervisorFunction";

/// A service as a Lambda function: a stub of the Invoke API answering every action at once.
async fn lambda_stub() -> String {
    async fn invoke(body: axum::body::Bytes) -> String {
        let p: Value = serde_json::from_slice(&body).unwrap_or_default();
        json!({"id": format!("{}-{}", p["action"].as_str().unwrap_or("x"), p["idempotencyKey"].as_str().unwrap_or("k"))}).to_string()
    }
    serve_loopback(axum::Router::new().route(
        "/2015-03-31/functions/{name}/invocations",
        axum::routing::post(invoke),
    ))
    .await
}

/// A service over HTTP answering every call with a result over a message's inline size.
async fn large_answers() -> String {
    async fn answer() -> axum::Json<Value> {
        axum::Json(json!({"report": "r".repeat(MESSAGE_INLINE_BYTES + 1024)}))
    }
    serve_loopback(axum::Router::new().fallback(answer)).await
}

struct Fixture {
    recorder: Recorder,
    config: aws_config::SdkConfig,
    stack: template::Stack,
    clock: Arc<OffsetClock>,
}

impl Fixture {
    /// The bucket a distributed forEach's list is read from: the template's ListBucketName.
    fn list_bucket(&self) -> String {
        format!("sas-{}-lists", self.stack.stage)
    }

    fn clients(&self, bus_endpoint: Option<&str>) -> AwsClients {
        let r = self.recorder.clone();
        let mut eventbridge =
            aws_sdk_eventbridge::config::Builder::from(&self.config).interceptor(r.clone());
        if let Some(e) = bus_endpoint {
            eventbridge = eventbridge
                .endpoint_url(e)
                .retry_config(aws_sdk_eventbridge::config::retry::RetryConfig::disabled());
        }
        AwsClients {
            dynamodb: aws_sdk_dynamodb::Client::from_conf(
                aws_sdk_dynamodb::config::Builder::from(&self.config)
                    .interceptor(r.clone())
                    .build(),
            ),
            sqs: aws_sdk_sqs::Client::from_conf(
                aws_sdk_sqs::config::Builder::from(&self.config)
                    .interceptor(r.clone())
                    .build(),
            ),
            eventbridge: aws_sdk_eventbridge::Client::from_conf(eventbridge.build()),
            s3: aws_sdk_s3::Client::from_conf(
                aws_sdk_s3::config::Builder::from(&self.config)
                    .force_path_style(true)
                    .interceptor(r.clone())
                    .build(),
            ),
        }
    }

    /// One function's system on the shared resources.
    fn system(&self, settings: sas_local::Settings, bus_endpoint: Option<&str>) -> System {
        let ports = aws_ports_from(
            self.clients(bus_endpoint),
            self.stack.resources.clone(),
            settings.due_shards,
            settings.retention,
        );
        System::from_ports(ports, settings, self.clock.clone() as Arc<dyn Clock>)
    }
}

/// [`call`] to the operator API, as the operator function, without extra headers.
async fn operator_api(system: &System, method: Method, path: &str, body: &Value) -> (u16, Value) {
    ROLE.scope(OPERATOR, call(system, true, method, path, &[], body))
        .await
}

/// [`call`] to the task API, as the submission function, without extra headers.
async fn task_api(system: &System, method: Method, path: &str, body: &Value) -> (u16, Value) {
    ROLE.scope(SUBMISSION, call(system, false, method, path, &[], body))
        .await
}

/// A `POST` of `body` to `path` on the operator API (`operator`) or the task API, in the
/// caller's role.
async fn post(system: &System, operator: bool, path: &str, body: &Value) -> (u16, Value) {
    call(system, operator, Method::POST, path, &[], body).await
}

/// A `GET` of `path` on the operator API (`operator`) or the task API, in the caller's role.
async fn get(system: &System, operator: bool, path: &str) -> (u16, Value) {
    call(system, operator, Method::GET, path, &[], &Value::Null).await
}

/// Sends `body` as it is to the queue at `url`.
async fn send_raw(sqs: &aws_sdk_sqs::Client, url: &str, body: impl Into<String>) {
    sqs.send_message()
        .queue_url(url)
        .message_body(body)
        .send()
        .await
        .expect("sent");
}

async fn call(
    system: &System,
    operator: bool,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: &Value,
) -> (u16, Value) {
    let mut map = HeaderMap::new();
    map.insert("content-type", HeaderValue::from_static("application/json"));
    for (k, v) in headers {
        map.insert(
            http::HeaderName::from_bytes(k.as_bytes()).expect("name"),
            HeaderValue::from_str(v).expect("value"),
        );
    }
    let (deps, who, path) = if operator {
        (
            &system.operator,
            sas_blackbox::operator(),
            format!("/operator{path}"),
        )
    } else {
        (
            &system.api,
            sas::auth::Identity::Caller(
                sas::Caller::new("arn:aws:iam::123456789012:role/shop").expect("caller"),
            ),
            path.to_owned(),
        )
    };
    let body = if body.is_null() {
        vec![]
    } else {
        body.to_string().into_bytes()
    };
    let resp = api::handle(deps, &who, &method, &path, &map, &body).await;
    let status = resp.status().as_u16();
    (
        status,
        serde_json::from_str(resp.body()).unwrap_or(Value::Null),
    )
}

/// Starts an order; its task id.
async fn submit(
    system: &System,
    operator: bool,
    headers: &[(&str, &str)],
    order: &Value,
) -> String {
    let (status, body) = call(
        system,
        operator,
        Method::POST,
        "/workflows/ecommerce-order/tasks",
        headers,
        order,
    )
    .await;
    assert_eq!(status, 202, "{body}");
    body["taskId"].as_str().expect("id").to_owned()
}

/// Submissions to the task API of `dispatching` (which claims first steps), under the
/// submission's role: an order in each lane, and a task whose first request cannot be built.
async fn first_steps_claimed_at_submission(dispatching: &System) {
    ROLE.scope(SUBMISSION, async {
        let order = json!({"customerId": "c-1", "items": [{"sku": "SKU-1", "quantity": 1}]});
        for (path, headers, body) in [
            ("/workflows/ecommerce-order/tasks", &[][..], &order),
            (
                "/workflows/ecommerce-order/tasks",
                &[("priority", "urgent")][..],
                &order,
            ),
            ("/workflows/iam-probe/tasks", &[][..], &json!({})),
        ] {
            let (status, body) = call(dispatching, false, Method::POST, path, headers, body).await;
            assert_eq!(status, 202, "{body}");
            assert_eq!(
                body["processState"], "Processing",
                "claimed at once: {body}"
            );
        }
    })
    .await;
}

/// Tasks of `workflow` submitted to the task API of `submitter` under the submission's role,
/// one in each lane.
async fn submit_each_lane(submitter: &System, workflow: &str) -> Vec<String> {
    let path = format!("/workflows/{workflow}/tasks");
    let mut waiting = vec![];
    for headers in [&[][..], &[("priority", "urgent")][..]] {
        let (status, body) = ROLE
            .scope(
                SUBMISSION,
                call(
                    submitter,
                    false,
                    Method::POST,
                    &path,
                    headers,
                    &json!({"customerId": "c-1"}),
                ),
            )
            .await;
        assert_eq!(status, 202, "{body}");
        waiting.push(body["taskId"].as_str().expect("id").to_owned());
    }
    waiting
}

/// Pumps the scheduler and the agent (each under its role) until nothing moves.
async fn pump(scheduler: &System, agent: &System) {
    let mut idle = 0;
    for _ in 0..60 {
        let moved = ROLE
            .scope(SCHEDULER, scheduler.pump_scheduler())
            .await
            .expect("scheduler")
            + ROLE.scope(AGENT, agent.pump_agents()).await.expect("agent");
        idle = if moved == 0 { idle + 1 } else { 0 };
        if idle >= 3 {
            return;
        }
    }
}

#[test]
fn every_call_is_granted_and_every_grant_is_used() {
    // The flows poll every function's handlers, nested as deep as a deployment never nests
    // them (the sweep's claim sends a step's request), in one future of an unoptimised build:
    // on a thread of their own with a larger stack than a test thread's 2 MiB, their future on
    // the heap.
    let flows = std::thread::Builder::new()
        .name("iam-flows".into())
        .stack_size(16 << 20)
        .spawn(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_stack_size(16 << 20)
                .enable_all()
                .build()
                .expect("a runtime")
                .block_on(Box::pin(
                    every_call_is_granted_and_every_grant_is_used_flows(),
                ))
        })
        .expect("a thread for the flows");
    if let Err(panic) = flows.join() {
        std::panic::resume_unwind(panic);
    }
}

async fn every_call_is_granted_and_every_grant_is_used_flows() {
    let config = sdk_config().await;
    let stage = unique("iam").replace("t-iam-", "iam");
    let stack = template::provision(&config, &stage).await;
    let f = Fixture {
        recorder: Recorder::losing_first_answers(),
        config: config.clone(),
        stack,
        clock: Arc::new(OffsetClock::default()),
    };
    let res = f.stack.resources.clone();

    // The services: inventory a Lambda function, payment an HTTP service with a bearer token in
    // Secrets Manager, shipping one with an API key in SSM (names under the stage's prefix).
    let secret = format!("sas/{stage}/payment-token");
    sas_blackbox::put_secret(&config, &secret, "t0ken").await;
    let parameter = format!("/sas/{stage}/shipping-key");
    sas_blackbox::put_parameter(&config, &parameter, "k3y").await;
    let clock: Arc<dyn Clock> = f.clock.clone();
    let payment = Arc::new(SimulatedService::new(
        "payment",
        Faults::default(),
        clock.clone(),
    ));
    let shipping = Arc::new(SimulatedService::new(
        "shipping",
        Faults::default(),
        clock.clone(),
    ));
    let payment_url = serve_loopback(sas_local::simulated::router(payment.clone())).await;
    let shipping_url = serve_loopback(sas_local::simulated::router(shipping.clone())).await;
    let lambda = lambda_stub().await;
    let archive_url = large_answers().await;
    let services = format!(
        r#"services:
  - name: inventory
    target: {{type: lambda, function: sas-{stage}--svc-inventory}}
  - name: payment
    target: {{type: http, baseUrl: "{payment_url}", auth: {{type: bearer, secret: "{secret}"}}}}
    limits: {{concurrency: 5, rate: {{perSecond: 100, burst: 10}}}}
  - name: shipping
    target: {{type: http, baseUrl: "{shipping_url}", auth: {{type: apiKey, header: X-Api-Key, parameter: "{parameter}"}}}}
  - name: archive
    target: {{type: http, baseUrl: "{archive_url}"}}
"#
    );
    let mut files = catalog::example_files();
    files.retain(|(name, _)| name == "ecommerce-order.yaml");
    files.insert(0, ("services.yaml".into(), services));

    let r = f.recorder.clone();
    let mut settings = sas_blackbox::manual_settings();
    settings.definitions = files.clone();
    settings.retention = Some(chrono::Duration::days(90));
    // As deployed: a service without limits of its own is capped by the share, its pace
    // marked on its breaker's partition.
    settings.service_share = Some(sas::config::DEFAULT_SERVICE_SHARE);
    // The stage's reply-queue pattern, on the emulator's queue URLs.
    let base = res.work_queue_url.rsplit_once('/').expect("a queue URL").0;
    settings.reply_queues = Some(
        sas::domain::task::ReplyQueues::parse(&format!("{base}/sasreply-{stage}--*"))
            .expect("pattern"),
    );
    settings.rate_limit = Some(sas::domain::rate::RateLimit {
        per_second: 1000.0,
        burst: 1000,
    });
    settings.credentials = Arc::new(sas::aws::AwsCredentials::new(
        aws_sdk_secretsmanager::Client::from_conf(
            aws_sdk_secretsmanager::config::Builder::from(&config)
                .interceptor(r.clone())
                .build(),
        ),
        aws_sdk_ssm::Client::from_conf(
            aws_sdk_ssm::config::Builder::from(&config)
                .interceptor(r.clone())
                .build(),
        ),
    ));
    settings.lambda = Some(aws_sdk_lambda::Client::from_conf(
        aws_sdk_lambda::config::Builder::from(&config)
            .endpoint_url(&lambda)
            .interceptor(r.clone())
            .build(),
    ));
    let submitter = f.system(settings.clone(), None);
    let mut operator = f.system(settings.clone(), None);
    operator.operator.timetable = Arc::new(sas::aws::SchedulerTimetable::new(
        aws_sdk_scheduler::Client::from_conf(
            aws_sdk_scheduler::config::Builder::from(&f.config)
                .interceptor(f.recorder.clone())
                .build(),
        ),
        f.stack.timetable_config(),
    ));
    let scheduler = f.system(settings.clone(), None);
    // A scheduler whose bus is down: a task's final notice stays owed, for the supervisor.
    let stalled = f.system(settings.clone(), Some("http://127.0.0.1:9"));
    // An agent whose breaker opens after two faults (and announces it on the bus).
    let mut agent_settings = settings.clone();
    agent_settings.breaker.threshold = 2;
    let agent = f.system(agent_settings, None);
    let mut supervisor = f.system(settings.clone(), None);
    // As deployed: the supervisor's poison goes to its own dead-letter queue.
    supervisor.supervisor.dead_letter_url =
        Some(f.stack.queue_urls["SupervisorDeadLetterQueue"].clone());

    // The operator publishes the definitions, then reads them back.
    ROLE.scope(OPERATOR, operator.publish(&files))
        .await
        .expect("published");
    ROLE.scope(OPERATOR, async {
        let reads = "/workflows /services /workflows/ecommerce-order \
            /workflows/ecommerce-order/versions/1 /services/payment \
            /counts /counts?workflow=ecommerce-order";
        for path in reads.split_whitespace() {
            let (status, body) = get(&operator, true, path).await;
            assert_eq!(status, 200, "{path}: {body}");
        }
        // An operator pauses a service and resumes it: a write of its breaker each.
        for (path, body) in [
            (
                "/services/shipping/pause",
                json!({"reason": "carrier maintenance"}),
            ),
            ("/services/shipping/resume", json!({})),
        ] {
            let (status, answer) = post(&operator, true, path, &body).await;
            assert_eq!(status, 200, "{path}: {answer}");
            assert_eq!(answer["changed"], true, "{answer}");
        }
    })
    .await;

    // A workflow whose step's input selects nothing: the scheduler refuses the step itself,
    // through the reply queue.
    let probe = json!({"name": "iam-probe", "steps": [
        {"name": "a", "service": "inventory", "input": {"x": "$.input.missing"}}
    ]});
    let (status, body) = operator_api(&operator, Method::PUT, "/workflows/iam-probe", &probe).await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = task_api(
        &submitter,
        Method::POST,
        "/workflows/iam-probe/tasks",
        &json!({}),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    // As deployed (`DispatchAtSubmission`): the task API claims a new task's first step and
    // sends its request itself, to either lane's agents, with its deadline timer; a request it
    // cannot build (the probe's) it refuses through the reply queue. (The submitter above runs
    // with it off, as `false` deploys the same role: every new task through the work queues.)
    let dispatching = f.system(
        sas_local::Settings {
            dispatch_at_submission: true,
            ..settings.clone()
        },
        None,
    );
    Box::pin(first_steps_claimed_at_submission(&dispatching)).await;
    // A large input under a key, and its replay, by a caller and by the operator: each
    // replay's input object (written before its transaction found the key taken) is deleted.
    let large = json!({"pad": "p".repeat(INLINE_PAYLOAD_BYTES + 100)});
    for (role, system, operator) in [(SUBMISSION, &submitter, false), (OPERATOR, &operator, true)] {
        let ids: Vec<String> = ROLE
            .scope(role, async {
                let mut ids = vec![];
                for _ in 0..2 {
                    let (status, body) = call(
                        system,
                        operator,
                        Method::POST,
                        "/workflows/iam-probe/tasks",
                        &[("idempotency-key", "k-large")],
                        &large,
                    )
                    .await;
                    assert_eq!(status, 202, "{body}");
                    ids.push(body["taskId"].as_str().expect("id").to_owned());
                }
                ids
            })
            .await;
        assert_eq!(ids[0], ids[1], "the replay names the first task");
        assert!(
            f.recorder
                .calls()
                .iter()
                .any(|c| c.role == role && c.action == "s3:DeleteObject"),
            "{role} deleted its replay's input object"
        );
    }

    let sqs = aws_sdk_sqs::Client::new(&config);
    let client_queue = sas_local::provision::create_queue(
        &sqs,
        &format!("sasreply-{stage}--shop"),
        None,
        Default::default(),
    )
    .await
    .expect("client queue");
    let order = json!({"customerId": "c-1", "items": [{"sku": "SKU-1", "quantity": 1}]});
    let keyed = [
        ("idempotency-key", "k-1"),
        ("reply-queue-url", client_queue.as_str()),
    ];
    let replying = [("reply-queue-url", client_queue.as_str())];
    // The urgent lane: its work queue (work, and the agent's replies) and agent queue
    // (`Priority: urgent`).
    let urgent = [
        ("reply-queue-url", client_queue.as_str()),
        ("priority", "urgent"),
    ];
    // A caller: an order under a key (replayed), a read, its list, an unknown callback.
    let first = ROLE
        .scope(SUBMISSION, submit(&submitter, false, &keyed, &order))
        .await;
    let again = ROLE
        .scope(SUBMISSION, submit(&submitter, false, &keyed, &order))
        .await;
    assert_eq!(first, again, "the replay names the first task");
    ROLE.scope(SUBMISSION, async {
        let (status, _) = get(&submitter, false, &format!("/tasks/{first}")).await;
        assert_eq!(status, 200);
        let (status, _) = get(&submitter, false, "/tasks").await;
        assert_eq!(status, 200);
        let unknown = uuid::Uuid::new_v4();
        let (status, _) = post(
            &submitter,
            false,
            &format!("/tasks/{unknown}/callbacks/x"),
            &json!({"status": "heartbeat"}),
        )
        .await;
        assert_eq!(status, 404);
    })
    .await;
    // The operator starts one too (under a key), and an early deadline timer is re-armed.
    ROLE.scope(OPERATOR, submit(&operator, true, &keyed, &order))
        .await;

    // Scheduler and agent run them, through an outage of payment: the agents count its
    // faults on its breaker until it opens (and announce that), and the step is deferred ...
    payment.set_faults(Faults {
        transient_rate: 1.0,
        ..Faults::default()
    });
    pump(&scheduler, &agent).await;
    payment.set_faults(Faults::default());
    tokio::time::sleep(std::time::Duration::from_millis(600)).await;
    pump(&scheduler, &agent).await;
    // ... and one refused at shipping and compensated, an urgent one: the submission sends its
    // work to the urgent lane, and the scheduler its steps and its compensation.
    shipping.set_faults(Faults {
        refuse_actions: vec!["arrange-shipping".to_owned()],
        ..Faults::default()
    });
    ROLE.scope(SUBMISSION, submit(&submitter, false, &urgent, &order))
        .await;
    pump(&scheduler, &agent).await;
    shipping.set_faults(Faults::default());

    // A task that failed past its pivot (shipping refused after the pivot step), and an
    // operator's retry on a new input: the input and the record in one transaction.
    let pivot = json!({"name": "iam-pivot", "steps": [
        {"name": "reserve", "service": "inventory", "pivot": true, "input": {"items": "$.input.items"}},
        {"name": "ship", "service": "shipping", "input": {"items": "$.input.items"}}
    ]});
    let (status, body) = operator_api(&operator, Method::PUT, "/workflows/iam-pivot", &pivot).await;
    assert_eq!(status, 201, "{body}");
    shipping.set_faults(Faults {
        refuse_actions: vec!["ship".to_owned()],
        ..Faults::default()
    });
    // An urgent one: the operator's retry sends its work to the urgent lane.
    let failed = ROLE
        .scope(SUBMISSION, async {
            let (status, body) = call(
                &submitter,
                false,
                Method::POST,
                "/workflows/iam-pivot/tasks",
                &[("priority", "urgent")],
                &order,
            )
            .await;
            assert_eq!(status, 202, "{body}");
            body["taskId"].as_str().expect("taskId").to_owned()
        })
        .await;
    pump(&scheduler, &agent).await;
    shipping.set_faults(Faults::default());
    // The new input is over the inline size: kept in the payload store by the operator.
    let mut fixed = order.clone();
    fixed["address"] = json!("a".repeat(INLINE_PAYLOAD_BYTES + 1024));
    let (status, body) = operator_api(
        &operator,
        Method::POST,
        &format!("/tasks/{failed}/retry-with-input"),
        &json!({"reason": "address fixed", "input": fixed}),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(
        s3_calls(&f, OPERATOR, "s3:PutObject", &failed),
        1,
        "the operator keeps the new input"
    );
    pump(&scheduler, &agent).await;

    // A caller's cancel, and an operator's, of tasks nothing was sent for: compensated at once.
    for (system, op, role) in [(&submitter, false, SUBMISSION), (&operator, true, OPERATOR)] {
        let id = ROLE
            .scope(SUBMISSION, submit(&submitter, false, &replying, &order))
            .await;
        ROLE.scope(role, async {
            if op {
                let (status, _) = get(system, true, "/tasks?state=Pending").await;
                assert_eq!(status, 200);
                let (status, _) = get(system, true, &format!("/tasks/{id}")).await;
                assert_eq!(status, 200);
            }
            // A search by key, on either API: a query of each key slot's index.
            let (status, body) = get(system, op, "/tasks?key=customerId:c-1").await;
            assert_eq!(status, 200, "{body}");
            let (status, body) = post(
                system,
                op,
                &format!("/tasks/{id}/cancel"),
                &json!({"reason": "test"}),
            )
            .await;
            assert_eq!(status, 202, "{body}");
        })
        .await;
    }
    // Drop the cancelled tasks' work messages.
    pump(&scheduler, &agent).await;

    // A sub-workflow: the agent starts the child task (its items and key, its first work
    // message); the child, run by the stalled scheduler, ends with its notice owed, which the
    // supervisor's sweep delivers below: its answer to the parent's step, on the reply queue.
    // The child's output (the parent's padding) is over a message's inline size: the
    // supervisor's answer keeps it in the payload bucket and sends its reference.
    // The parent's next step then fails, and its compensation undoes the child as a unit:
    // the agent reads the child and starts its compensation.
    for (name, doc) in [
        (
            "iam-child",
            // One child per account at a time: the agent takes its place in line, the
            // stalled scheduler admits it, and the supervisor's sweep (its final notice) makes
            // it leave.
            json!({"name": "iam-child", "concurrency": {"key": "$.input.account", "limit": 1},
                   "steps": [
                {"name": "hold", "service": "inventory", "undo": {"action": "release"}}
            ], "output": {"pad": "$.input.pad"}}),
        ),
        (
            "iam-parent",
            json!({"name": "iam-parent", "steps": [
                {"name": "pay", "workflow": "iam-child", "input": {"pad": "$.input.pad", "account": "acct"}},
                {"name": "after", "service": "inventory", "input": {"x": "$.input.missing"}}
            ]}),
        ),
    ] {
        let (status, body) =
            operator_api(&operator, Method::PUT, &format!("/workflows/{name}"), &doc).await;
        assert_eq!(status, 201, "{body}");
    }
    let (status, body) = task_api(
        &submitter,
        Method::POST,
        "/workflows/iam-parent/tasks",
        &json!({"pad": "p".repeat(sas::domain::payload::MESSAGE_INLINE_BYTES)}),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let parent: sas::TaskId = body["taskId"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("taskId");
    for _ in 0..20 {
        ROLE.scope(SCHEDULER, stalled.pump_scheduler())
            .await
            .expect("poll");
        ROLE.scope(AGENT, agent.pump_agents()).await.expect("poll");
    }
    let child = sas::handlers::children::child_id(&sas::messages::idempotency_key(
        parent,
        "pay",
        "iam-child",
        0,
    ));
    let r = ROLE
        .scope("test", sas_blackbox::state(&supervisor, child))
        .await;
    assert_eq!(r.process_state, sas::ProcessState::Processed, "{r:?}");
    assert!(!r.outbox.is_empty(), "its end is owed: {r:?}");

    // A child with no line to wait in, in each lane: the agent that starts it claims its first
    // step as it creates it and sends that step's request (to the agent queue of its lane) and
    // its deadline's timer, as the task API does at submission.
    for (name, doc) in [
        (
            "iam-free-child",
            json!({"name": "iam-free-child", "steps": [
                {"name": "one", "service": "inventory", "input": {"customerId": "$.input.customerId"}}
            ]}),
        ),
        (
            "iam-free-parent",
            json!({"name": "iam-free-parent", "steps": [
                {"name": "sub", "workflow": "iam-free-child", "input": {"customerId": "$.input.customerId"}}
            ]}),
        ),
    ] {
        let (status, body) =
            operator_api(&operator, Method::PUT, &format!("/workflows/{name}"), &doc).await;
        assert_eq!(status, 201, "{body}");
    }
    let parents = Box::pin(submit_each_lane(&submitter, "iam-free-parent")).await;
    let mut claimed = vec![];
    for _ in 0..10 {
        ROLE.scope(SCHEDULER, scheduler.pump_scheduler())
            .await
            .expect("poll");
        ROLE.scope(AGENT, agent.pump_agents()).await.expect("poll");
        for id in &parents {
            let child = sas::handlers::children::child_id(&sas::messages::idempotency_key(
                id.parse().expect("id"),
                "sub",
                "iam-free-child",
                0,
            ));
            let r = ROLE
                .scope("test", sas_blackbox::state(&supervisor, child))
                .await;
            if r.locked_by
                .as_deref()
                .is_some_and(|l| l.starts_with("local-agent-"))
                && !claimed.contains(&child)
            {
                claimed.push(child);
            }
        }
    }
    assert_eq!(
        claimed.len(),
        parents.len(),
        "each child's first step was claimed by the agent that started it"
    );
    pump(&scheduler, &agent).await;
    for id in &parents {
        let r = ROLE
            .scope(
                "test",
                sas_blackbox::state(&supervisor, id.parse().expect("id")),
            )
            .await;
        assert_eq!(r.process_state, sas::ProcessState::Processed, "{r:?}");
    }

    // A distributed forEach over a list in the bucket the deployment names (ListBucketName):
    // the agent reads the list and keeps it (under the run, in the payload bucket), stores the
    // run and opens its first elements (records and work messages). A scheduler whose ends
    // queue is down runs those elements: each ends with its end to the run owed, which the
    // supervisor's sweep below sends to the ends queue (grouped by run); then the scheduler
    // applies the ends, opens the last element, and the run answers the step. The next step
    // is refused, and the task's undo of the step undoes the run: the agent starts each
    // element's undo, and the scheduler sends their ends.
    let list_bucket = f.list_bucket();
    let lists = aws_sdk_s3::Client::from_conf(
        aws_sdk_s3::config::Builder::from(&config)
            .force_path_style(true)
            .build(),
    );
    lists
        .create_bucket()
        .bucket(&list_bucket)
        .send()
        .await
        .expect("the list bucket");
    let lines: Vec<String> = (0..3).map(|i| json!({"sku": i}).to_string()).collect();
    lists
        .put_object()
        .bucket(&list_bucket)
        .key("items.jsonl")
        .body(lines.join("\n").into_bytes().into())
        .send()
        .await
        .expect("the list");
    let runs = json!({"name": "iam-runs", "steps": [
        {"name": "post", "service": "inventory",
         "forEach": format!("s3://{list_bucket}/items.jsonl"), "distributed": true,
         "maxConcurrency": 2, "input": {"sku": "$.element"}, "undo": {"action": "release"}},
        {"name": "after", "service": "inventory", "input": {"x": "$.input.missing"}}
    ]});
    let (status, body) = operator_api(&operator, Method::PUT, "/workflows/iam-runs", &runs).await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = task_api(
        &submitter,
        Method::POST,
        "/workflows/iam-runs/tasks",
        &json!({}),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let distributed: sas::TaskId = body["taskId"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("taskId");
    let ends_down = {
        let mut ports = aws_ports_from(
            f.clients(None),
            f.stack.resources.clone(),
            settings.due_shards,
            settings.retention,
        );
        ports.queue = Arc::new(EndsDown(ports.queue));
        System::from_ports(ports, settings.clone(), f.clock.clone() as Arc<dyn Clock>)
    };
    // The task's step goes out, and the agent starts the run: its first two elements open.
    ROLE.scope(SCHEDULER, ends_down.pump_scheduler())
        .await
        .expect("poll");
    ROLE.scope(AGENT, agent.pump_agents()).await.expect("poll");
    // An operator cancels the first element before it is claimed: it ends at once, and the
    // operator sends its end (no effect: a refusal past the run's tolerance, which stops the
    // run and undoes the elements that took effect).
    let run = sas::handlers::runs::run_id(&sas::messages::idempotency_key(
        distributed,
        "post",
        "post",
        0,
    ));
    let first = sas::handlers::runs::element_id(run, 0);
    let (status, body) = operator_api(
        &operator,
        Method::POST,
        &format!("/tasks/{first}/cancel"),
        &json!({"reason": "test"}),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    for _ in 0..10 {
        ROLE.scope(SCHEDULER, ends_down.pump_scheduler())
            .await
            .expect("poll");
        ROLE.scope(AGENT, agent.pump_agents()).await.expect("poll");
    }
    let ends_sent = |role: &str| {
        f.recorder.calls().iter().any(|c| {
            c.role == role
                && c.action == "sqs:SendMessage"
                && f.stack.queue_urls.get("EndsQueue") == Some(&c.resource)
        })
    };
    assert!(ends_sent(OPERATOR), "the cancelled element's end sent");
    assert!(!ends_sent(SCHEDULER), "the other ends are owed");

    // A workflow with a concurrency limit: four tasks of one account, the first from the
    // operator, in line at its gate. The scheduler admits the first (the gate read, its head
    // written) and parks the rest; the operator reads a waiting task's place; it cancels the
    // first (holding the gate: its leave writes the head, and sends the second on) and the
    // third (waiting: its leave deletes its place); the scheduler admits and runs the second
    // (the head updated, its place deleted) and it leaves as it ends. An operator whose bus is
    // down cancels the fourth: its notice, and so its leave, stays owed for the sweep.
    let gated = json!({"name": "iam-gated", "concurrency": {"key": "$.input.account", "limit": 1},
        "steps": [{"name": "a", "service": "inventory", "input": {"customerId": "$.input.account"}}]});
    let (status, body) = operator_api(&operator, Method::PUT, "/workflows/iam-gated", &gated).await;
    assert_eq!(status, 201, "{body}");
    let account = json!({"account": "a-1"});
    let mut line = Vec::new();
    for (i, op) in [true, false, false, false].into_iter().enumerate() {
        let role = if op { OPERATOR } else { SUBMISSION };
        let system = if op { &operator } else { &submitter };
        let (status, body) = ROLE
            .scope(
                role,
                call(
                    system,
                    op,
                    Method::POST,
                    "/workflows/iam-gated/tasks",
                    &[],
                    &account,
                ),
            )
            .await;
        assert_eq!(status, 202, "task {i}: {body}");
        line.push(body["taskId"].as_str().expect("id").to_owned());
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    for _ in 0..10 {
        ROLE.scope(SCHEDULER, scheduler.pump_scheduler())
            .await
            .expect("poll");
    }
    let (status, view) = operator_api(
        &operator,
        Method::GET,
        &format!("/tasks/{}", line[2]),
        &Value::Null,
    )
    .await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["gate"]["status"], "Parked", "{view}");
    for id in [&line[0], &line[2]] {
        let (status, body) = operator_api(
            &operator,
            Method::POST,
            &format!("/tasks/{id}/cancel"),
            &json!({"reason": "test"}),
        )
        .await;
        assert_eq!(status, 202, "{body}");
    }
    let stalled_operator = f.system(settings.clone(), Some("http://127.0.0.1:9"));
    let (status, body) = operator_api(
        &stalled_operator,
        Method::POST,
        &format!("/tasks/{}/cancel", line[3]),
        &json!({"reason": "test"}),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    pump(&scheduler, &agent).await;
    let r = ROLE
        .scope(
            "test",
            sas_blackbox::state(&supervisor, line[1].parse().expect("id")),
        )
        .await;
    assert_eq!(
        r.process_state,
        sas::ProcessState::Processed,
        "{:?}",
        r.history
    );

    // A task run by the stalled scheduler: its final notice stays owed.
    let owed = ROLE
        .scope(SUBMISSION, submit(&submitter, false, &replying, &order))
        .await;
    for _ in 0..10 {
        ROLE.scope(SCHEDULER, stalled.pump_scheduler())
            .await
            .expect("poll");
        ROLE.scope(AGENT, agent.pump_agents()).await.expect("poll");
    }
    // Payloads over the inline sizes, each role's reads and writes under its own role and
    // with its own cache (one per process: what a role wrote it does not read back from S3).
    // A task whose input is over a message's inline size: the submission writes it; the
    // scheduler reads it and writes the first step's mapped body; the agent reads the body and
    // writes the service's answer, over a message's inline size too; the scheduler reads that
    // back (and keeps it in the record by the same reference). The task API's and the
    // operator's views read the result (and the operator's the input); the second step is
    // claimed and never run, and the supervisor's sweep reads the record whole to recover it.
    let large = json!({"name": "iam-large", "steps": [
        {"name": "fetch", "service": "archive", "input": {"note": "$.input.note"}},
        {"name": "then", "service": "inventory", "input": {"customerId": "$.input.customerId"}}
    ]});
    let (status, body) = operator_api(&operator, Method::PUT, "/workflows/iam-large", &large).await;
    assert_eq!(status, 201, "{body}");
    let big = json!({"customerId": "c-1", "note": "n".repeat(MESSAGE_INLINE_BYTES + 1024)});
    let (status, body) =
        task_api(&submitter, Method::POST, "/workflows/iam-large/tasks", &big).await;
    assert_eq!(status, 202, "{body}");
    let heavy = body["taskId"].as_str().expect("taskId").to_owned();
    let made = |role: &str, action: &str| s3_calls(&f, role, action, &heavy);
    assert_eq!(made(SUBMISSION, "s3:PutObject"), 1, "the input kept");
    ROLE.scope(SCHEDULER, scheduler.pump_scheduler())
        .await
        .expect("step sent");
    assert_eq!(made(SCHEDULER, "s3:GetObject"), 1, "the input read");
    assert_eq!(made(SCHEDULER, "s3:PutObject"), 1, "the step's body kept");
    ROLE.scope(AGENT, agent.pump_agents())
        .await
        .expect("called");
    assert_eq!(made(AGENT, "s3:GetObject"), 1, "the body read");
    assert_eq!(made(AGENT, "s3:PutObject"), 1, "the answer kept");
    ROLE.scope(SCHEDULER, scheduler.pump_scheduler())
        .await
        .expect("reply");
    assert_eq!(made(SCHEDULER, "s3:GetObject"), 2, "the answer read");
    assert_eq!(
        made(SCHEDULER, "s3:PutObject"),
        1,
        "the answer not kept twice"
    );
    let (status, body) = task_api(
        &submitter,
        Method::GET,
        &format!("/tasks/{heavy}"),
        &Value::Null,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(made(SUBMISSION, "s3:GetObject"), 1, "the result read");
    let (status, body) = operator_api(
        &operator,
        Method::GET,
        &format!("/tasks/{heavy}"),
        &Value::Null,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        made(OPERATOR, "s3:GetObject"),
        2,
        "the input and the result read"
    );

    // Waits whose end the supervisor's sweep below finds: it claims the step after each and
    // sends its request to the agents, in the task's lane.
    let wait = json!({"name": "iam-wait", "steps": [
        {"name": "pause", "wait": "1m"},
        {"name": "then", "service": "inventory", "input": {"customerId": "$.input.customerId"}}
    ]});
    let (status, body) = operator_api(&operator, Method::PUT, "/workflows/iam-wait", &wait).await;
    assert_eq!(status, 201, "{body}");
    let waiting = Box::pin(submit_each_lane(&submitter, "iam-wait")).await;

    // A step that expires: claimed, its agent never runs (and an urgent one's, which the
    // supervisor hands back to the urgent lane).
    let late = ROLE
        .scope(SUBMISSION, submit(&submitter, false, &[], &order))
        .await;
    ROLE.scope(
        SUBMISSION,
        submit(&submitter, false, &[("priority", "urgent")], &order),
    )
    .await;
    ROLE.scope(SCHEDULER, scheduler.pump_scheduler())
        .await
        .expect("claimed");
    // An early deadline timer (its deadline past SQS's longest delay): re-armed.
    let early = json!({"taskId": late, "attempt": 1, "stepIndex": 0,
        "completeBy": (f.clock.now() + chrono::Duration::hours(2)).to_rfc3339()});
    send_raw(&sqs, &res.timer_queue_url, early.to_string()).await;
    ROLE.scope(SUPERVISOR, supervisor.pump_timers())
        .await
        .expect("timers");
    // The supervisor's sweep: the owed notice delivered, the expired step handed back.
    f.clock.advance(chrono::Duration::minutes(30));
    ROLE.scope(SUPERVISOR, supervisor.sweep())
        .await
        .expect("sweep");
    assert_eq!(
        s3_calls(&f, SUPERVISOR, "s3:GetObject", &heavy),
        1,
        "the supervisor read the large task's result to recover its step"
    );
    let r = ROLE
        .scope(
            "test",
            sas_blackbox::state(&supervisor, owed.parse().expect("id")),
        )
        .await;
    assert!(
        r.outbox.is_empty(),
        "the supervisor delivered the owed notice: {r:?}"
    );
    for id in &waiting {
        let r = ROLE
            .scope(
                "test",
                sas_blackbox::state(&supervisor, id.parse().expect("id")),
            )
            .await;
        assert!(
            r.process_state == sas::ProcessState::Processing
                && r.step_index == 1
                && r.locked_by
                    .as_deref()
                    .is_some_and(|l| l.starts_with("local-supervisor-")),
            "the supervisor ended the wait and claimed the next step: {:#?}",
            r.history
        );
    }
    // The child's end answered its parent's step; the parent goes on, fails, and undoes the
    // child as a unit.
    pump(&scheduler, &agent).await;
    for (id, state) in [
        (parent, sas::ProcessState::Compensated),
        (child, sas::ProcessState::Compensated),
    ] {
        let r = ROLE
            .scope("test", sas_blackbox::state(&supervisor, id))
            .await;
        assert_eq!(r.process_state, state, "{:#?}", r.history);
    }

    // The run's owed ends were sent by the supervisor's sweep; the rest by the scheduler. The
    // element that took effect was undone, and the run refused the step.
    let second = sas::handlers::runs::element_id(run, 1);
    for (id, state) in [
        (first, sas::ProcessState::Compensated),
        (second, sas::ProcessState::Compensated),
        (distributed, sas::ProcessState::Refused),
    ] {
        let r = ROLE
            .scope("test", sas_blackbox::state(&supervisor, id))
            .await;
        assert_eq!(r.process_state, state, "{id}: {:#?}", r.history);
    }
    for role in [SUPERVISOR, SCHEDULER] {
        assert!(ends_sent(role), "{role} sent an end to the ends queue");
    }

    // A schedule: published (its timer created), run (one run losing a race to another, which
    // is then delivered again: Scheduler delivers at least once), paused (its timer disabled),
    // deleted (its timer removed).
    // Its input is over the inline size: the run that loses the race, and the run delivered
    // again, each delete the input object they wrote for a task not stored.
    let nightly = json!({"name": "iam-nightly", "workflow": "iam-probe",
        "expression": "cron(0 2 * * ? *)", "timezone": "Europe/Berlin",
        "input": {"pad": "n".repeat(INLINE_PAYLOAD_BYTES + 100)}});
    let (status, body) =
        operator_api(&operator, Method::PUT, "/schedules/iam-nightly", &nightly).await;
    assert_eq!(status, 201, "{body}");
    // The runs' times are hours before the test's clock, whatever the day. The first run (two
    // hours before) reads the schedule's current task (none), and as it writes its task, a
    // second run (an hour before) starts its own first: the first loses the race, reads the
    // current task again, and skips. The second run delivered again finds its idempotency key
    // taken and reads the key and the task back. (A fixed date reached some of these paths
    // only on some days; a race left to chance, on some runs.)
    let at = |hours: i64| f.clock.now() - chrono::Duration::hours(hours);
    let rival = sas::messages::ScheduledRun {
        schedule: "iam-nightly".into(),
        at: at(1),
    };
    let racing = {
        let mut ports = aws_ports_from(
            f.clients(None),
            f.stack.resources.clone(),
            settings.due_shards,
            settings.retention,
        );
        let race = Arc::new(Rival {
            ports: scheduler.scheduler.ports.clone(),
            run: rival.clone(),
            fired: std::sync::atomic::AtomicBool::new(false),
        });
        ports.store = Arc::new(sas_local::intercept::Intercepted::new(
            ports.store,
            race.clone(),
        ));
        (
            System::from_ports(ports, settings.clone(), f.clock.clone() as Arc<dyn Clock>),
            race,
        )
    };
    let first = json!({"type": "scheduled", "schedule": "iam-nightly",
        "at": at(2).to_rfc3339_opts(chrono::SecondsFormat::Secs, true)});
    send_raw(&sqs, &res.work_queue_url, first.to_string()).await;
    ROLE.scope(SCHEDULER, racing.0.pump_scheduler())
        .await
        .expect("run");
    assert!(
        racing.1.fired.load(std::sync::atomic::Ordering::SeqCst),
        "the rival run went first"
    );
    let current = ROLE
        .scope("test", scheduler.store.current_run("iam-nightly"))
        .await
        .expect("read")
        .expect("a current task");
    assert_eq!(
        current.run_at.timestamp(),
        rival.at.timestamp(),
        "the rival's task is current"
    );
    let again =
        serde_json::to_string(&sas::messages::SchedulerMessage::Scheduled(rival)).expect("JSON");
    send_raw(&sqs, &res.work_queue_url, again).await;
    ROLE.scope(SCHEDULER, scheduler.pump_scheduler())
        .await
        .expect("run");
    let (status, body) = ROLE
        .scope(
            OPERATOR,
            post(&operator, true, "/schedules/iam-nightly/pause", &json!({})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = operator_api(
        &operator,
        Method::DELETE,
        "/schedules/iam-nightly",
        &json!({}),
    )
    .await;
    assert_eq!(status, 200, "{body}");

    // A final task with payloads, at the end of its retention: the supervisor lists and
    // deletes its objects, then deletes its items (a transaction of two deletes).
    let kept = json!({"name": "iam-kept", "steps": [
        {"name": "fetch", "service": "archive", "input": {"note": "$.input.note"}}
    ]});
    let (status, body) = operator_api(&operator, Method::PUT, "/workflows/iam-kept", &kept).await;
    assert_eq!(status, 201, "{body}");
    let (status, body) =
        task_api(&submitter, Method::POST, "/workflows/iam-kept/tasks", &big).await;
    assert_eq!(status, 202, "{body}");
    let kept: sas::TaskId = body["taskId"]
        .as_str()
        .and_then(|id| id.parse().ok())
        .expect("taskId");
    for _ in 0..5 {
        ROLE.scope(SCHEDULER, scheduler.pump_scheduler())
            .await
            .expect("poll");
        ROLE.scope(AGENT, agent.pump_agents()).await.expect("poll");
    }
    let r = ROLE
        .scope("test", sas_blackbox::state(&supervisor, kept))
        .await;
    assert!(
        r.process_state == sas::ProcessState::Processed && r.purge_at.is_some(),
        "{:?} {:?}",
        r.process_state,
        r.purge_at
    );
    f.clock
        .advance(settings.retention.expect("a retention") + chrono::Duration::days(1));
    ROLE.scope(SUPERVISOR, supervisor.sweep())
        .await
        .expect("sweep");
    assert!(
        s3_calls(&f, SUPERVISOR, "s3:DeleteObject", &kept.to_string()) >= 2,
        "the input and the answer deleted"
    );
    assert!(
        ROLE.scope("test", supervisor.store.get_state(kept))
            .await
            .expect("read")
            .is_none(),
        "the task's items deleted"
    );

    // A distributed forEach's results past a part: the scheduler's JSON Lines write (what
    // `answer_task` makes when a run ends) goes up as a multipart upload, and one whose
    // source fails midway is aborted; so does the supervisor's, delivering a run's owed
    // answer. The flows above end no run with 8 MiB of answers, nor one whose write fails, so
    // the writes are made here with each function's own client.
    {
        use futures::StreamExt;
        use sas::ports::Payloads;
        let payloads = sas::aws::S3Payloads::new(f.clients(None).s3, &res.payload_bucket);
        let task = sas::TaskId::new_random();
        let part = sas::aws::PART_BYTES / 1024 + 1;
        let lines = |fail: bool| {
            futures::stream::iter((0..part + 2).map(move |i| {
                if fail && i == part + 1 {
                    Err(sas::ports::PayloadError::Unavailable(
                        "an element's record".into(),
                    ))
                } else {
                    Ok(vec![b'1'; 1023])
                }
            }))
            .boxed()
        };
        let kept = ROLE
            .scope(SCHEDULER, payloads.put_lines(task, lines(false)))
            .await
            .expect("kept in parts");
        assert_eq!(kept.lines.as_ref().map(|l| l.count), Some(part as u64 + 2));
        let failed = ROLE
            .scope(SCHEDULER, payloads.put_lines(task, lines(true)))
            .await;
        assert!(failed.is_err(), "{failed:?}");
        assert!(
            s3_calls(&f, SCHEDULER, "s3:AbortMultipartUpload", &task.to_string()) == 1,
            "the failed upload aborted"
        );
        let failed = ROLE
            .scope(SUPERVISOR, payloads.put_lines(task, lines(true)))
            .await;
        assert!(failed.is_err(), "{failed:?}");
        assert!(
            s3_calls(&f, SUPERVISOR, "s3:AbortMultipartUpload", &task.to_string()) == 1,
            "the supervisor's failed upload aborted"
        );
        ROLE.scope(SUPERVISOR, payloads.delete_task(task))
            .await
            .expect("deleted");
    }

    // Poison: one unreadable message on each consumer's queue.
    for url in [
        &res.work_queue_url,
        &res.agent_queue_url,
        &res.timer_queue_url,
    ] {
        send_raw(&sqs, url, "not json").await;
    }
    ROLE.scope(SCHEDULER, scheduler.pump_scheduler())
        .await
        .expect("poll");
    ROLE.scope(AGENT, agent.pump_agents()).await.expect("poll");
    ROLE.scope(SUPERVISOR, supervisor.pump_timers())
        .await
        .expect("poll");

    // Every function that writes the table met a lost answer (and its SDK's retry) on its
    // first write of each kind: the read-backs ran under its role.
    let lost = f.recorder.lost_answers();
    println!(
        "writes whose first answer was lost:\n  {}",
        Vec::from_iter(lost.iter().cloned()).join("\n  ")
    );
    for (role, write) in [
        (SUBMISSION, "TransactWriteItems"),
        (SCHEDULER, "PutItem"),
        (SCHEDULER, "TransactWriteItems"),
        (AGENT, "PutItem"),
        (AGENT, "UpdateItem"),
        (SUPERVISOR, "PutItem"),
        (OPERATOR, "PutItem"),
    ] {
        assert!(
            lost.iter()
                .any(|k| k.starts_with(&format!("{role} {write} "))),
            "no {write} of {role} lost its answer: {lost:?}"
        );
    }
    check(&f, &f.recorder.calls());
}

/// How many objects of task `task` the function `role` made `action` on.
fn s3_calls(f: &Fixture, role: &str, action: &str, task: &str) -> usize {
    let objects = format!(
        "arn:aws:s3:::{}/tasks/{task}/",
        f.stack.resources.payload_bucket
    );
    f.recorder
        .calls()
        .iter()
        .filter(|c| c.role == role && c.action == action && c.resource.starts_with(&objects))
        .count()
}

/// A queue whose FIFO sends fail (an ends queue that is down), without a request: an element's
/// end stays owed in its record.
struct EndsDown(Arc<dyn sas::ports::Queue>);

#[async_trait::async_trait]
impl sas::ports::Queue for EndsDown {
    async fn send(
        &self,
        queue_url: &str,
        body: &str,
        delay: std::time::Duration,
    ) -> Result<(), sas::ports::QueueError> {
        self.0.send(queue_url, body, delay).await
    }
    async fn receive(
        &self,
        ask: sas::ports::ReceiveRequest<'_>,
    ) -> Result<Vec<sas::ports::ReceivedMessage>, sas::ports::QueueError> {
        self.0.receive(ask).await
    }
    async fn delete(
        &self,
        queue_url: &str,
        receipt_handle: &str,
    ) -> Result<(), sas::ports::QueueError> {
        self.0.delete(queue_url, receipt_handle).await
    }
    async fn send_grouped(
        &self,
        _: sas::ports::GroupedMessage<'_>,
    ) -> Result<(), sas::ports::QueueError> {
        Err(sas::ports::QueueError("the ends queue is down".into()))
    }
    async fn send_fair(
        &self,
        message: sas::ports::FairMessage<'_>,
    ) -> Result<(), sas::ports::QueueError> {
        self.0.send_fair(message).await
    }
    async fn send_dead_letter(
        &self,
        letter: sas::ports::DeadLetter<'_>,
    ) -> Result<(), sas::ports::QueueError> {
        self.0.send_dead_letter(letter).await
    }
}

/// Around the first task a schedule's run writes: another run of the schedule (`run`, on
/// `ports`) starts its task first, so the write loses the race for the schedule's turn.
struct Rival {
    ports: sas::handlers::TaskPorts,
    run: sas::messages::ScheduledRun,
    fired: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl sas_local::intercept::Interceptor for Rival {
    async fn around<'a, R: sas_local::intercept::Reply, E: sas_local::intercept::Failure>(
        &'a self,
        next: sas_local::intercept::Next<'a, R, E>,
    ) -> Result<R, E> {
        if let sas_local::intercept::Call::Create(new) = next.call()
            && new.turn.is_some()
            && !self.fired.swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            let outcome = sas::handlers::start::run_schedule(&self.ports, &self.run).await;
            assert!(
                matches!(outcome, Ok(sas::handlers::start::RunOutcome::Started(_))),
                "the rival run starts its task: {outcome:?}"
            );
        }
        next.run(next.call()).await
    }
}

/// A resource as the grants name it: a logical id, an index, or a pattern's name.
fn resource_of_call(f: &Fixture, c: &Call) -> String {
    let res = &f.stack.resources;
    let stage = &f.stack.stage;
    let queues: HashMap<&str, &str> = f
        .stack
        .queue_urls
        .iter()
        .map(|(id, url)| (url.as_str(), id.as_str()))
        .collect();
    if c.resource == res.table {
        return "TasksTable".into();
    }
    if let Some(index) = c.resource.strip_prefix(&format!("{}/index/", res.table)) {
        return format!("TasksTable/index/{index}");
    }
    if let Some(id) = queues.get(c.resource.as_str()) {
        return (*id).to_owned();
    }
    if c.resource
        .rsplit('/')
        .next()
        .is_some_and(|q| q.starts_with(&format!("sasreply-{stage}--")))
    {
        return "client-queues".into();
    }
    if c.resource == res.bus_name {
        return "EventBus".into();
    }
    let lists = format!("arn:aws:s3:::{}", f.list_bucket());
    if c.resource == lists {
        return "ListBucket".into();
    }
    if c.resource.starts_with(&format!("{lists}/")) {
        return "ListBucket/*".into();
    }
    let bucket = format!("arn:aws:s3:::{}", res.payload_bucket);
    if c.resource == bucket {
        return "PayloadBucket".into();
    }
    if let Some(key) = c.resource.strip_prefix(&format!("{bucket}/")) {
        // An object, under the one pattern the grants name.
        return if template::iam_matches("tasks/*", key) {
            "PayloadBucket/tasks/*".into()
        } else {
            format!("PayloadBucket/{key}")
        };
    }
    if c.resource
        .starts_with(&format!("schedule/{}/", f.stack.schedule_group))
    {
        return "schedules".into();
    }
    if c.resource == f.stack.schedule_role_arn {
        return "ScheduleRole".into();
    }
    if c.resource.starts_with(&format!("sas-{stage}--svc-")) {
        return "service-functions".into();
    }
    let name = c.resource.trim_start_matches('/');
    if name.starts_with(&format!("sas/{stage}/")) {
        return if c.action.starts_with("ssm:") {
            "parameters"
        } else {
            "secrets"
        }
        .into();
    }
    format!("?{}", c.resource)
}

/// A statement's resource as the calls name it.
fn resource_of_grant(v: &Value) -> String {
    if let Some(a) = v["Fn::GetAtt"].as_array() {
        return a[0].as_str().unwrap_or_default().to_owned();
    }
    let sub = match &v["Fn::Sub"] {
        Value::String(s) => s.clone(),
        Value::Array(a) => a[0].as_str().unwrap_or_default().to_owned(),
        _ => return v.as_str().unwrap_or("?").to_owned(),
    };
    if let Some(index) = sub.strip_prefix("${TasksTable.Arn}/index/") {
        return format!("TasksTable/index/{index}");
    }
    if let Some(objects) = sub.strip_prefix("${PayloadBucket.Arn}/") {
        return format!("PayloadBucket/{objects}");
    }
    if sub.ends_with(":s3:::${ListBucketName}/*") {
        return "ListBucket/*".into();
    }
    if sub.ends_with(":s3:::${ListBucketName}") {
        return "ListBucket".into();
    }
    if sub.contains("sasreply-") {
        return "client-queues".into();
    }
    if sub.contains(":function:") {
        return "service-functions".into();
    }
    if sub.contains(":secret:") {
        return "secrets".into();
    }
    if sub.contains(":parameter/") {
        return "parameters".into();
    }
    if sub.contains(":schedule/") {
        return "schedules".into();
    }
    format!("?{sub}")
}

fn strings(v: &Value) -> Vec<String> {
    match v {
        Value::String(s) => vec![s.clone()],
        Value::Array(a) => a
            .iter()
            .filter_map(|x| x.as_str().map(str::to_owned))
            .collect(),
        _ => vec![],
    }
}

/// One grant: (actions, resources, leading-key patterns; none: any key; `s3:prefix`
/// patterns of a listing; none: any prefix).
struct Grant {
    actions: Vec<String>,
    resources: Vec<String>,
    keys: Option<Vec<String>>,
    prefixes: Option<Vec<String>>,
    sid: String,
}

fn grants(f: &Fixture, t: &template::Template, function: &str) -> Vec<Grant> {
    let role = t.properties(function, "AWS::Lambda::Function")["Role"]["Fn::GetAtt"][0]
        .as_str()
        .expect("a role")
        .to_owned();
    // As deployed with the test's list bucket (ListBucketName).
    let list_bucket = f.list_bucket();
    let props = t.evaluated_properties(&role, &[("ListBucketName", list_bucket.as_str())]);
    let mut out = Vec::new();
    for policy in props["Policies"].as_array().into_iter().flatten() {
        for s in policy["PolicyDocument"]["Statement"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let resources = match &s["Resource"] {
                Value::Array(a) => a.iter().map(resource_of_grant).collect(),
                other => vec![resource_of_grant(other)],
            };
            let keys = s["Condition"]["ForAllValues:StringLike"]["dynamodb:LeadingKeys"].clone();
            let prefixes = s["Condition"]["StringLike"]["s3:prefix"].clone();
            out.push(Grant {
                actions: strings(&s["Action"]),
                resources,
                keys: (!keys.is_null()).then(|| strings(&keys)),
                prefixes: (!prefixes.is_null()).then(|| strings(&prefixes)),
                sid: s["Sid"].as_str().unwrap_or("?").to_owned(),
            });
        }
    }
    out
}

fn key_allowed(patterns: &Option<Vec<String>>, key: &Option<String>) -> bool {
    match (patterns, key) {
        (None, _) => true,
        (Some(p), Some(k)) => p.iter().any(|p| p.trim_end_matches('*') == k),
        (Some(_), None) => false,
    }
}

/// Whether a listing's prefix (the call's `key`) meets a grant's `s3:prefix` condition (a
/// listing without a prefix does not).
fn prefix_allowed(g: &Grant, c: &Call) -> bool {
    match (&g.prefixes, &c.key) {
        (None, _) => true,
        (Some(p), Some(k)) if c.action == "s3:ListBucket" => {
            p.iter().any(|p| template::iam_matches(p, k))
        }
        _ => false,
    }
}

/// Queue-consuming actions: the event source mapping's, not the code's.
const CONSUME: [&str; 4] = [
    "sqs:ReceiveMessage",
    "sqs:DeleteMessage",
    "sqs:GetQueueAttributes",
    "sqs:ChangeMessageVisibility",
];

/// (a) of [`check`]: the calls no statement of their function's role allows.
fn ungranted(f: &Fixture, t: &template::Template, calls: &BTreeSet<Call>) -> Vec<String> {
    let functions = [SUBMISSION, OPERATOR, SCHEDULER, AGENT, SUPERVISOR];
    let mut problems = Vec::new();
    for c in calls {
        if !functions.contains(&c.role.as_str()) {
            problems.push(format!("a call outside any function: {c:?}"));
            continue;
        }
        let resource = resource_of_call(f, c);
        let ok = grants(f, t, &c.role).iter().any(|g| {
            g.actions.contains(&c.action)
                && g.resources.contains(&resource)
                && key_allowed(&g.keys, &c.key)
                && prefix_allowed(g, c)
        });
        if !ok {
            problems.push(format!(
                "{} makes {} on {resource} (key {:?}), which its role does not allow",
                c.role, c.action, c.key
            ));
        }
    }
    problems
}

/// The recorder names the payload store's S3 calls as IAM authorizes them (an object's ARN,
/// a listing as `s3:ListBucket` on the bucket with its prefix, `DeleteObjects` per key), and
/// the check holds them to the template's grants: the scheduler's write and read are granted,
/// and the supervisor's write (an owed answer it delivers), read, listing of a task's objects
/// and deletion (its purge); the supervisor's listing outside `tasks/` is not, nor the
/// scheduler's listing, nor the agent's deletion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payload_calls_are_recorded_and_held_to_the_grants() {
    use sas::ports::{PayloadError, Payloads};
    let config = sdk_config().await;
    let stage = unique("iam").replace("t-iam-", "s3");
    let stack = template::provision(&config, &stage).await;
    let f = Fixture {
        recorder: Recorder::default(),
        config,
        stack,
        clock: Arc::new(OffsetClock::default()),
    };
    // The payload store of every function, on the stack's bucket, without the process's cache
    // (which would answer the read of what it just wrote).
    let payloads = sas::aws::S3Payloads::new(f.clients(None).s3, &f.stack.resources.payload_bucket);
    let task = sas::TaskId::new_random();
    let r = ROLE
        .scope(SCHEDULER, async {
            let r = payloads.put(task, b"{\"big\":true}").await?;
            assert_eq!(payloads.get(&r).await?, b"{\"big\":true}");
            Ok::<_, PayloadError>(r)
        })
        .await
        .expect("written and read");
    let deleted = ROLE
        .scope(SUPERVISOR, payloads.delete_task(task))
        .await
        .expect("deleted");
    assert_eq!(deleted, 1);
    let bucket = &f.stack.resources.payload_bucket;
    let object = format!("arn:aws:s3:::{bucket}/{}", r.key());
    let call = |role: &str, action: &str, resource: &str, key: Option<&str>| Call {
        role: role.into(),
        action: action.into(),
        resource: resource.into(),
        key: key.map(str::to_owned),
    };
    let listing = |role: &str, prefix: &str| {
        call(
            role,
            "s3:ListBucket",
            &format!("arn:aws:s3:::{bucket}"),
            Some(prefix),
        )
    };
    let recorded = f.recorder.calls();
    assert_eq!(
        recorded,
        BTreeSet::from([
            call(SCHEDULER, "s3:PutObject", &object, None),
            call(SCHEDULER, "s3:GetObject", &object, None),
            listing(SUPERVISOR, "tasks/<task id>/"),
            call(SUPERVISOR, "s3:DeleteObject", &object, None),
        ])
    );
    let t = template::Template::load();
    let granted = BTreeSet::from([
        call(SCHEDULER, "s3:PutObject", &object, None),
        call(SCHEDULER, "s3:GetObject", &object, None),
        call(SUPERVISOR, "s3:GetObject", &object, None),
        call(SUPERVISOR, "s3:PutObject", &object, None),
        listing(SUPERVISOR, "tasks/<task id>/"),
        call(SUPERVISOR, "s3:DeleteObject", &object, None),
    ]);
    assert_eq!(ungranted(&f, &t, &granted), Vec::<String>::new());
    let refused = BTreeSet::from([
        call(
            SUPERVISOR,
            "s3:PutObject",
            "arn:aws:s3:::other/tasks/x",
            None,
        ),
        listing(SCHEDULER, "tasks/<task id>/"),
        listing(SUBMISSION, "tasks/<task id>/"),
        listing(SUPERVISOR, "other/"),
        call(AGENT, "s3:DeleteObject", &object, None),
    ]);
    assert_eq!(
        ungranted(&f, &t, &refused).len(),
        refused.len(),
        "{:#?}",
        ungranted(&f, &t, &refused)
    );
}

fn check(f: &Fixture, all: &BTreeSet<Call>) {
    let t = template::Template::load();
    // The test's own reads are no function's.
    let calls: BTreeSet<Call> = all.iter().filter(|c| c.role != "test").cloned().collect();
    let calls = &calls;
    let functions = [SUBMISSION, OPERATOR, SCHEDULER, AGENT, SUPERVISOR];
    // The table, for the note and ARCHITECTURE.md.
    let mut table: BTreeMap<(String, String, String), BTreeSet<String>> = BTreeMap::new();
    for c in calls {
        table
            .entry((c.role.clone(), c.action.clone(), resource_of_call(f, c)))
            .or_default()
            .insert(
                c.key
                    .clone()
                    .map(|k| format!("{k}*"))
                    .unwrap_or_else(|| "-".into()),
            );
    }
    let mut md =
        String::from("| Function | Action | Resource | Leading keys |\n|---|---|---|---|\n");
    for ((role, action, resource), keys) in &table {
        md.push_str(&format!(
            "| {role} | `{action}` | {resource} | {} |\n",
            keys.iter().cloned().collect::<Vec<_>>().join(", ")
        ));
    }
    println!("{md}");
    let _ = std::fs::create_dir_all("../target");
    let _ = std::fs::write("../target/iam-calls.md", &md);

    // (a) Every call is granted.
    let mut problems = ungranted(f, &t, calls);
    // (b) Every grant is used (per action, resource and key pattern).
    let mappings: BTreeSet<(String, String)> = t
        .of_type("AWS::Lambda::EventSourceMapping")
        .into_iter()
        .map(|m| {
            let p = t.properties(m, "AWS::Lambda::EventSourceMapping");
            (
                p["FunctionName"]["Ref"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                p["EventSourceArn"]["Fn::GetAtt"][0]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
        })
        .collect();
    for function in functions {
        for g in grants(f, &t, function) {
            for action in &g.actions {
                for resource in &g.resources {
                    if CONSUME.contains(&action.as_str()) {
                        if !mappings.contains(&(function.to_owned(), resource.clone())) {
                            problems.push(format!(
                                "{function} ({}) may {action} on {resource} without a mapping on it",
                                g.sid
                            ));
                        }
                        continue;
                    }
                    // The list bucket's listing is never called: it only makes a missing
                    // list's read answer NotFound (a refusal) rather than AccessDenied.
                    if action == "s3:ListBucket" && resource == "ListBucket" {
                        continue;
                    }
                    // The action is made on the resource (with a key the statement allows)...
                    let used = calls.iter().any(|c| {
                        c.role == function
                            && &c.action == action
                            && &resource_of_call(f, c) == resource
                            && key_allowed(&g.keys, &c.key)
                            && prefix_allowed(&g, c)
                    });
                    if !used {
                        problems.push(format!(
                            "{function} ({}) may {action} on {resource} but no call does",
                            g.sid
                        ));
                    }
                }
            }
            // ...and every leading-key pattern by some action of the statement.
            for key in g.keys.iter().flatten() {
                let prefix = key.trim_end_matches('*');
                let used = calls.iter().any(|c| {
                    c.role == function
                        && g.actions.contains(&c.action)
                        && c.key.as_deref() == Some(prefix)
                });
                if !used {
                    problems.push(format!(
                        "{function} ({}) names the leading keys {key} but no call uses them",
                        g.sid
                    ));
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}\n\n{md}", problems.join("\n"));
}

/// The documented submitter policy (docs/deploying.md) reaches the task routes and none of the
/// operator routes: the operator function skips a caller's rate limit, and its console and API
/// are the operators'.
/// Each route of the template becomes sample request ARNs (the operator's greedy path with
/// hostile samples that spell a task route inside it); the documented resources are matched
/// against them as IAM matches (`*` spans `/`).
#[test]
fn the_documented_submitter_policy_reaches_the_task_routes_and_no_operator_route() {
    let t = template::Template::load();
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/deploying.md"))
            .expect("docs/deploying.md");
    let section = readme
        .split("### Use the deployed API")
        .nth(1)
        .and_then(|s| s.split("\n### ").next())
        .expect("docs/deploying.md's section on the deployed task API");
    let documented: Vec<String> = section
        .match_indices("arn:aws:execute-api:")
        .map(|(at, _)| {
            let arn: String = section[at..]
                .chars()
                .take_while(|c| !matches!(c, '`' | '"' | ',' | ')' | ' ' | '\n'))
                .collect();
            arn.replace("<region>", "us-east-1")
                .replace("<account>", "123456789012")
                .replace("<api-id>", "abc123")
        })
        .collect();
    assert!(!documented.is_empty(), "no resource documented: {section}");

    let arn = |method: &str, path: &str| {
        format!("arn:aws:execute-api:us-east-1:123456789012:abc123/$default/{method}{path}")
    };
    const METHODS: [&str; 5] = ["GET", "POST", "PUT", "DELETE", "PATCH"];
    // Values for a route's parameters; the greedy one also spells task routes inside it.
    let proxy = [
        "tasks",
        "tasks/0f0c9d6e-1b1a-4c55-9a3e-3a3c1f3f2b10",
        "workflows/loan-application/tasks",
        "console",
        "console/tasks/x/retry",
        "console/x/POST/workflows/w/tasks",
        "console/GET/tasks",
        "console/GET/tasks/x",
        "console/x/POST/tasks/y/cancel",
        "services/s",
    ];
    let (mut task_routes, mut operator_routes) = (vec![], vec![]);
    for route in t.of_type("AWS::ApiGatewayV2::Route") {
        let p = t.properties(route, "AWS::ApiGatewayV2::Route");
        let key = p["RouteKey"].as_str().expect("a route key");
        let target = p["Target"]["Fn::Sub"].as_str().unwrap_or_default();
        let Some((method, path)) = key.split_once(' ') else {
            continue; // $default: no authorization, the task function's 404s
        };
        let paths: Vec<String> = if path.contains("{proxy+}") {
            proxy.iter().map(|x| path.replace("{proxy+}", x)).collect()
        } else {
            vec![
                path.replace("{name}", "loan-application")
                    .replace("{taskId}", "0f0c9d6e-1b1a-4c55-9a3e-3a3c1f3f2b10")
                    .replace("{token}", "tok")
                    .replace("{step}", "post"),
            ]
        };
        let methods: Vec<&str> = if method == "ANY" {
            METHODS.to_vec()
        } else {
            vec![method]
        };
        let arns = methods
            .iter()
            .flat_map(|m| paths.iter().map(move |x| arn(m, x)));
        if target.contains("OperatorApiIntegration") {
            operator_routes.extend(arns);
        } else if p["AuthorizationType"] != "NONE" {
            task_routes.extend(arns.map(|a| (key.to_owned(), a)));
        }
    }
    assert!(operator_routes.len() >= proxy.len(), "{operator_routes:?}");
    assert_eq!(task_routes.len(), 5, "{task_routes:?}");
    for op in &operator_routes {
        for d in &documented {
            assert!(
                !template::iam_matches(d, op),
                "the documented submitter resource {d} also allows the operator route {op}"
            );
        }
    }
    for (key, a) in &task_routes {
        assert!(
            documented.iter().any(|d| template::iam_matches(d, a)),
            "no documented resource allows {key} ({a}): {documented:?}"
        );
    }
}
