//! Priority and fairness (issue 43): when the agents are the bottleneck, an urgent task goes
//! first through a lane of its own (its own queues and consumers), and within a lane callers
//! share fairly: the fair queues (a tenant per caller) deliver a quiet caller's step before a
//! noisy caller's backlog. On the running in-memory system (its pollers, as Lambda's event
//! source mappings: messages in flight while their handler runs), with a service slow enough
//! that the agents fall behind.
//!
//! The same burst with the fair share switched off (no tenant ever noisy) shows what the test
//! measures: the quiet caller's task then waits behind the whole backlog.
//!
//! And a tenant's share of a service (`perKey` limits): one account's calls at most one at a
//! time, measured at the service, while another account's go at once.

use sas::auth::Identity;
use sas::memory::FairShare;
use sas::{ProcessState, TaskId};
use sas_blackbox::caller;
use sas_local::System;
use serde_json::{Value, json};
use std::sync::Arc;

const POSTING: &str = r#"name: ledger-posting
steps:
  - {name: post, service: ledger}
"#;

/// The noisy caller's burst.
const BURST: usize = 60;

/// Publishes the ledger service and the posting workflow.
async fn publish(system: &System) {
    sas_blackbox::publish_with_ledger(system, POSTING).await;
}

/// Submits a posting as `who`, with `headers`: its id.
async fn submit(system: &System, who: &Identity, headers: &[(&str, &str)]) -> TaskId {
    submit_to(system, who, "ledger-posting", headers, &json!({})).await
}

/// Submits `input` to `workflow` as `who`, with `headers` (a `202`): the task's id.
async fn submit_to(
    system: &System,
    who: &Identity,
    workflow: &str,
    headers: &[(&str, &str)],
    input: &Value,
) -> TaskId {
    let (status, _, body) =
        sas_blackbox::post_task_as(system, who, workflow, headers, input.to_string().as_bytes())
            .await;
    assert_eq!(status, 202, "{body}");
    body["taskId"].as_str().expect("id").parse().expect("uuid")
}

/// When the task ended (its history's Processed line), once it has.
async fn ended_at(system: &System, id: TaskId) -> Option<chrono::DateTime<chrono::Utc>> {
    let r = system.store.get_state(id).await.expect("read")?;
    (r.process_state == ProcessState::Processed)
        .then(|| r.history.iter().find(|h| h.to == ProcessState::Processed))
        .flatten()
        .map(|h| h.at)
}

/// What one burst measured: how many of the noisy caller's tasks ended while the quiet
/// caller's waited (after it was submitted, before it ended), and while the urgent one did.
struct Burst {
    before_quiet: usize,
    before_urgent: usize,
}

/// How many of `ends` fall after `task`'s submission and before its end.
async fn passed(system: &System, task: TaskId, ends: &[chrono::DateTime<chrono::Utc>]) -> usize {
    let r = sas_blackbox::state(system, task).await;
    let end = ended_at(system, task).await.expect("it ended");
    ends.iter()
        .filter(|t| **t > r.created_at && **t < end)
        .count()
}

/// The noisy caller submits [`BURST`] postings at once; then the quiet caller submits one, and
/// the noisy caller one urgent posting. Three agents (and one of the urgent lane) call a
/// service that takes 60 ms a call.
async fn burst(fair_share: FairShare) -> Burst {
    let settings = sas_local::Settings {
        agent_concurrency: 3,
        urgent_concurrency: 1,
        batch_size: 2,
        poll_wait: std::time::Duration::from_millis(50),
        fair_share,
        default_faults: sas::remote::Faults {
            latency: std::time::Duration::from_millis(60),
            ..Default::default()
        },
        ..sas_blackbox::manual_settings()
    };
    let mut system = sas_blackbox::memory_system(settings).await;
    publish(&system).await;
    system.start();
    let (noisy, quiet) = (caller("backfill"), caller("checkout"));
    let mut backlog = Vec::new();
    for _ in 0..BURST {
        backlog.push(submit(&system, &noisy, &[]).await);
    }
    // The agents are busy with the burst's first steps (its tenant holds them all).
    tokio::time::sleep(std::time::Duration::from_millis(150)).await;
    let calm = submit(&system, &quiet, &[]).await;
    let urgent = submit(&system, &noisy, &[("priority", "urgent")]).await;
    let mut ends = Vec::new();
    for _ in 0..400 {
        ends.clear();
        for id in &backlog {
            ends.push(ended_at(&system, *id).await);
        }
        if ends.iter().all(Option::is_some)
            && ended_at(&system, calm).await.is_some()
            && ended_at(&system, urgent).await.is_some()
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let ends: Vec<_> = ends.into_iter().flatten().collect();
    assert_eq!(ends.len(), BURST, "the whole burst ends");
    let r = sas_blackbox::state(&system, urgent).await;
    assert_eq!(
        r.priority,
        sas::domain::Priority::Urgent,
        "kept on its record"
    );
    let waits = Burst {
        before_quiet: passed(&system, calm, &ends).await,
        before_urgent: passed(&system, urgent, &ends).await,
    };
    let left = ends.iter().filter(|t| **t > r.created_at).count();
    assert!(
        left >= BURST / 2,
        "a backlog was left to pass ({left} of {BURST} ended after the urgent task came)"
    );
    eprintln!(
        "burst: {} passed the quiet task, {} the urgent one, {left} after the urgent one came",
        waits.before_quiet, waits.before_urgent
    );
    system.shutdown().await;
    waits
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_callers_task_and_an_urgent_one_pass_a_noisy_callers_backlog() {
    // Noisy: at least 2 of the messages in flight (SQS counts 30, and Lambda's pollers hold
    // that many; three agents here hold 6).
    let fair = burst(FairShare {
        percent: 10,
        at_least: 2,
    })
    .await;
    assert!(
        fair.before_quiet < BURST / 4,
        "the quiet caller's task waited behind {} of the noisy caller's {BURST}",
        fair.before_quiet
    );
    assert!(
        fair.before_urgent < BURST / 4,
        "the urgent task waited behind {} of the backlog",
        fair.before_urgent
    );
    // No tenant ever noisy: one queue in the order sent, the quiet task behind the backlog;
    // the urgent lane still passes it.
    let unfair = burst(FairShare {
        percent: 100,
        at_least: usize::MAX,
    })
    .await;
    assert!(
        unfair.before_quiet > BURST / 2,
        "without fair sharing the quiet task waits behind the backlog ({} of {BURST})",
        unfair.before_quiet
    );
    assert!(unfair.before_urgent < BURST / 4, "{}", unfair.before_urgent);
}

#[tokio::test]
async fn an_unknown_priority_is_refused_naming_the_header() {
    let system = sas_blackbox::memory_system(sas_blackbox::manual_settings()).await;
    publish(&system).await;
    let mut map = http::HeaderMap::new();
    map.insert(
        "content-type",
        http::HeaderValue::from_static("application/json"),
    );
    map.insert("priority", http::HeaderValue::from_static("high"));
    let resp = sas::api::handle(
        &system.api,
        &caller("shop"),
        &http::Method::POST,
        "/workflows/ledger-posting/tasks",
        &map,
        b"{}",
    )
    .await;
    assert_eq!(resp.status(), 400);
    let body: Value = serde_json::from_str(resp.body()).expect("json");
    assert_eq!(body["error"]["code"], "invalid_request", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("Priority")),
        "{body}"
    );
    // An urgent task's view says so; a normal one's says nothing.
    let urgent = submit(&system, &caller("shop"), &[("priority", "urgent")]).await;
    let normal = submit(&system, &caller("shop"), &[]).await;
    for (id, want) in [(urgent, json!("urgent")), (normal, Value::Null)] {
        let (status, view) =
            sas_blackbox::operator_call(&system, http::Method::GET, &format!("/tasks/{id}"), b"")
                .await;
        assert_eq!(status, 200, "{view}");
        assert_eq!(view["priority"], want, "{view}");
    }
}

/// A bank that takes one call per account at a time, and a posting found by its account.
const BANK: &str = r#"services:
  - name: bank
    target: {type: simulated}
    limits: {concurrency: 10, perKey: {key: accountId, concurrency: 1}}
"#;

const TRANSFER: &str = r#"name: transfer
keys: {accountId: $.input.accountId}
steps:
  - {name: debit, service: bank, input: {account: $.input.accountId}}
  - {name: credit, service: bank, input: {account: $.input.accountId}}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_account_gets_its_share_of_a_service_and_waits_without_failing() {
    let mut faults = std::collections::HashMap::new();
    faults.insert(
        "bank".to_owned(),
        sas::remote::Faults {
            latency: std::time::Duration::from_millis(40),
            count_by: Some("/account".into()),
            ..Default::default()
        },
    );
    let settings = sas_local::Settings {
        agent_concurrency: 4,
        poll_wait: std::time::Duration::from_millis(50),
        faults,
        ..sas_blackbox::manual_settings()
    };
    let mut system = sas_blackbox::memory_system(settings).await;
    system
        .publish(&[
            ("services.yaml".into(), BANK.into()),
            ("transfer.yaml".into(), TRANSFER.into()),
        ])
        .await
        .expect("publishes");
    system.start();
    let who = caller("payments");
    let mut ids = Vec::new();
    for account in ["a-1", "a-2"] {
        for _ in 0..5 {
            let input = json!({ "accountId": account });
            ids.push(submit_to(&system, &who, "transfer", &[], &input).await);
        }
    }
    for _ in 0..300 {
        let mut done = 0;
        for id in &ids {
            done += usize::from(ended_at(&system, *id).await.is_some());
        }
        if done == ids.len() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    for id in &ids {
        let r = sas_blackbox::state(&system, *id).await;
        assert_eq!(r.process_state, ProcessState::Processed, "{:?}", r.history);
        assert_eq!(r.failure_count, 0, "a wait at a limit is no failure");
    }
    let stats = system.services.get("bank").stats();
    assert_eq!(
        stats.most_in_flight_by.get("a-1"),
        Some(&1),
        "one call of an account at a time: {:?}",
        stats.most_in_flight_by
    );
    assert_eq!(stats.most_in_flight_by.get("a-2"), Some(&1));
    assert!(
        stats.most_calls_in_flight >= 2,
        "the two accounts' calls went at once ({})",
        stats.most_calls_in_flight
    );
    system.shutdown().await;
}

/// Records the group of every message sent to one queue.
#[derive(Default)]
struct Groups {
    queue_url: std::sync::Mutex<String>,
    seen: std::sync::Mutex<Vec<Option<String>>>,
}

#[async_trait::async_trait]
impl sas_local::intercept::Interceptor for Groups {
    async fn around<'a, R: sas_local::intercept::Reply, E: sas_local::intercept::Failure>(
        &'a self,
        next: sas_local::intercept::Next<'a, R, E>,
    ) -> Result<R, E> {
        let call = next.call();
        if let sas_local::intercept::Call::Send {
            queue_url, group, ..
        } = call
            && self.queue_url.lock().is_ok_and(|u| *u == queue_url)
            && let Ok(mut seen) = self.seen.lock()
        {
            seen.push(group.map(str::to_owned));
        }
        next.run(call).await
    }
}

/// The groups of the messages sent to one of the in-memory system's queues (`queue`) while
/// a task of `team-a` and one of `team-b` run to their end, and the two callers' tenants.
async fn groups_sent_to(
    queue: impl Fn(&sas_local::provision::Resources) -> String,
) -> (Vec<Option<String>>, [Option<String>; 2]) {
    let settings = sas_local::Settings::default();
    let mut ports = sas_local::system::ports(sas_local::Backend::Memory, &settings)
        .await
        .expect("ports");
    let hook = Arc::new(Groups::default());
    *hook.queue_url.lock().expect("url") = queue(&ports.resources);
    ports.queue = Arc::new(sas_local::intercept::Intercepted::new(
        ports.queue.clone(),
        hook.clone(),
    ));
    let mut system = System::from_ports(ports, settings, Arc::new(sas::ports::SystemClock));
    publish(&system).await;
    system.start();
    let (a, b) = (caller("team-a"), caller("team-b"));
    let ids = [
        submit(&system, &a, &[]).await,
        submit(&system, &b, &[]).await,
    ];
    for id in ids {
        let mut done = false;
        for _ in 0..200 {
            if ended_at(&system, id).await.is_some() {
                done = true;
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(25)).await;
        }
        assert!(done, "{id} ended");
    }
    system.shutdown().await;
    let tenant = |who: &Identity| match who {
        Identity::Caller(c) => Some(sas::domain::lane::tenant(c)),
        _ => None,
    };
    let seen = hook.seen.lock().expect("seen").clone();
    (seen, [tenant(&a), tenant(&b)])
}

/// A step's reply goes to the reply queue in its task's tenant's group, as its request went to
/// the agents: one caller's replies do not hold back another's there either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_go_in_their_tasks_tenants_group() {
    let (mut seen, tenants) = groups_sent_to(|r| r.reply_queue_url.clone()).await;
    seen.sort();
    let mut wanted = tenants.to_vec();
    wanted.sort();
    assert_eq!(
        seen, wanted,
        "one reply per task, each in its caller's group"
    );
}

/// A step's deadline timer goes to the timer queue in its task's tenant's group: one caller's
/// timers do not hold back another's recoveries at the supervisor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadline_timers_go_in_their_tasks_tenants_group() {
    let (seen, tenants) = groups_sent_to(|r| r.timer_queue_url.clone()).await;
    assert!(!seen.is_empty(), "the claims armed timers");
    assert!(
        seen.iter().all(|g| tenants.contains(g) && g.is_some()),
        "every timer in its caller's group: {seen:?}"
    );
    for tenant in &tenants {
        assert!(
            seen.contains(tenant),
            "{tenant:?}'s task armed a timer: {seen:?}"
        );
    }
}
