//! Search keys and per-key concurrency (issue 43): a never-seen workflow declares two keys;
//! its tasks are found by each of them through the operator API (every caller's tasks) and the
//! task API (the caller's own), newest first, narrowed by state, workflow and time. Another
//! declares a concurrency limit of 1 per account: one account's tasks run one at a time in the
//! order they were submitted, parked without a deadline while they wait, while other accounts'
//! run at once. On the in-memory system and on the stack's resources on the emulator.

use sas::TaskId;
use sas::auth::Identity;
use sas_blackbox::caller;
use sas_local::{Backend, System};
use serde_json::{Value, json};
use std::sync::Arc;

/// A workflow no example has: a ledger posting found by its account and its reference.
const POSTING: &str = r#"name: ledger-posting
input:
  type: object
  required: [account, reference]
  properties:
    account: {type: object, properties: {id: {}}}
    reference: {}
keys:
  accountId: $.input.account.id
  reference: $.input.reference
steps:
  - {name: post, service: ledger, input: {account: $.input.account.id}}
"#;

/// A ledger's batches: one account's at a time, found by account and batch.
const BATCH: &str = r#"name: ledger-batch
input:
  type: object
  required: [accountId, batchId]
keys:
  accountId: $.input.accountId
  batchId: $.input.batchId
concurrency: {key: $.input.accountId, limit: 1}
steps:
  - {name: debit, service: ledger, input: {account: $.input.accountId}}
  - {name: credit, service: ledger, input: {account: $.input.accountId}}
"#;

/// When the task's record first went to `to` (its history line's time).
fn first_at(r: &sas::StateRecord, to: sas::ProcessState) -> chrono::DateTime<chrono::Utc> {
    r.history
        .iter()
        .find(|h| h.to == to)
        .unwrap_or_else(|| panic!("never {to}: {:?}", r.history))
        .at
}

/// `n` batches of one account run one at a time, in the order submitted; five of other
/// accounts go meanwhile; while they wait, the operator's view shows each parked behind the
/// holder, with its place in line; every task is found by each of its keys.
async fn one_accounts_tasks_run_one_at_a_time_in_order(system: &System, n: usize) {
    sas_blackbox::publish_with_ledger(system, BATCH).await;
    let who = caller("ledger-app");
    let account = format!("a-{}", TaskId::new_random());
    let mut line = Vec::new();
    for i in 0..n {
        let input = json!({"accountId": account, "batchId": format!("{account}-b{i}")});
        line.push(submit_to(system, &who, "ledger-batch", input).await);
        // Apart in time: the line is the order submitted.
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    let mut others = Vec::new();
    for i in 0..5 {
        let input =
            json!({"accountId": format!("other-{i}-{account}"), "batchId": format!("x{i}")});
        others.push(submit_to(system, &who, "ledger-batch", input).await);
    }
    // Every work message once (no agent runs yet): the first of the line is admitted, the
    // rest park.
    for _ in 0..100 {
        if system.pump_scheduler().await.expect("scheduler") == 0 {
            break;
        }
    }
    let last = line[n - 1];
    let (status, view) =
        sas_blackbox::operator_call(system, http::Method::GET, &format!("/tasks/{last}"), b"")
            .await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["gate"]["status"], "Parked", "{view}");
    assert_eq!(
        view["gate"]["holders"],
        json!([line[0].to_string()]),
        "{view}"
    );
    assert_eq!(view["gate"]["ahead"], json!(n - 2), "{view}");
    assert!(
        view["completeBy"].is_null(),
        "parked with no deadline: {view}"
    );
    sas_blackbox::pump_until_quiet(system, 40 * n + 200).await;
    let mut records = Vec::new();
    for id in line.iter().chain(&others) {
        let r = sas_blackbox::state(system, *id).await;
        assert_eq!(
            r.process_state,
            sas::ProcessState::Processed,
            "{:?}",
            r.history
        );
        sas_blackbox::assert_valid(system, &r).await;
        records.push(r);
    }
    // One at a time, in the order submitted: each claimed once the one before it ended.
    for pair in records[..n].windows(2) {
        let (before, after) = (&pair[0], &pair[1]);
        assert!(
            first_at(after, sas::ProcessState::Processing)
                >= first_at(before, sas::ProcessState::Processed),
            "{} ran before {} ended",
            after.task_id,
            before.task_id
        );
    }
    // The other accounts did not wait for this one's line.
    let last_claimed = first_at(&records[n - 1], sas::ProcessState::Processing);
    for r in &records[n..] {
        assert!(
            first_at(r, sas::ProcessState::Processing) < last_claimed,
            "{:?}",
            r.history
        );
    }
    // Each task by each of its keys.
    let all = operator_search(system, &format!("key=accountId:{account}")).await;
    assert_eq!(all.len(), n);
    for (i, id) in line.iter().enumerate().step_by(7) {
        let found = operator_search(system, &format!("key=batchId:{account}-b{i}")).await;
        assert_eq!(found, vec![*id]);
    }
    // A task without the key is refused, naming it.
    let (status, body) = task_api(
        system,
        &who,
        http::Method::POST,
        "/workflows/ledger-batch/tasks",
        &json!({"accountId": null, "batchId": "b"}),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("concurrency key"),
        "{body}"
    );
}

async fn publish(system: &System) {
    sas_blackbox::publish_with_ledger(system, POSTING).await;
}

/// Calls the task API as `who`: the status and JSON body.
async fn task_api(
    system: &System,
    who: &Identity,
    method: http::Method,
    path: &str,
    body: &Value,
) -> (u16, Value) {
    let mut headers = http::HeaderMap::new();
    headers.insert(
        "content-type",
        http::HeaderValue::from_static("application/json"),
    );
    let body = if body.is_null() {
        vec![]
    } else {
        body.to_string().into_bytes()
    };
    let resp = sas::api::handle(&system.api, who, &method, path, &headers, &body).await;
    let status = resp.status().as_u16();
    (status, serde_json::from_str(resp.body()).expect("JSON"))
}

async fn submit(system: &System, who: &Identity, input: Value) -> TaskId {
    submit_to(system, who, "ledger-posting", input).await
}

/// Submits `input` to `workflow` as `who` (a `202`): the task's id.
async fn submit_to(system: &System, who: &Identity, workflow: &str, input: Value) -> TaskId {
    let (status, body) = task_api(
        system,
        who,
        http::Method::POST,
        &format!("/workflows/{workflow}/tasks"),
        &input,
    )
    .await;
    assert_eq!(status, 202, "{body}");
    body["taskId"].as_str().expect("id").parse().expect("uuid")
}

fn ids(page: &Value) -> Vec<TaskId> {
    page["tasks"]
        .as_array()
        .expect("tasks")
        .iter()
        .map(|t| t["taskId"].as_str().expect("id").parse().expect("uuid"))
        .collect()
}

/// Every page of an operator search (`query` without `cursor`), two tasks a page.
async fn operator_search(system: &System, query: &str) -> Vec<TaskId> {
    let mut seen = Vec::new();
    let mut cursor = String::new();
    for _ in 0..100 {
        let (status, page) = sas_blackbox::operator_call(
            system,
            http::Method::GET,
            &format!("/tasks?{query}&limit=2{cursor}"),
            b"",
        )
        .await;
        assert_eq!(status, 200, "{query}: {page}");
        seen.extend(ids(&page));
        match page["nextCursor"].as_str() {
            Some(c) => cursor = format!("&cursor={c}"),
            None => return seen,
        }
    }
    panic!("more than 100 pages");
}

/// Runs `check` until it holds or 10 s pass (the key indexes are eventually consistent).
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match check().await {
            Ok(()) => return,
            Err(e) if std::time::Instant::now() > deadline => panic!("{what}: {e}"),
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
        }
    }
}

async fn tasks_are_found_by_each_key(system: &System) {
    publish(system).await;
    let (alice, bob) = (caller("alice"), caller("bob"));
    let account = format!("a-{}", TaskId::new_random());
    let other = format!("a-{}", TaskId::new_random());
    // Submitted in order, a few ms apart: newest first is the reverse.
    let mut mine = Vec::new();
    let mut all = Vec::new();
    for (i, (who, acct)) in [
        (&alice, &account),
        (&bob, &account),
        (&alice, &other),
        (&alice, &account),
        (&bob, &account),
    ]
    .into_iter()
    .enumerate()
    {
        let id = submit(
            system,
            who,
            json!({"account": {"id": acct}, "reference": format!("r-{i}-{account}")}),
        )
        .await;
        if acct == &account {
            all.push(id);
            if who == &alice {
                mine.push(id);
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(3)).await;
    }
    all.reverse();
    mine.reverse();
    let by_account = format!("key=accountId:{account}");
    eventually("the operator's search by key", || async {
        let found = operator_search(system, &by_account).await;
        (found == all)
            .then_some(())
            .ok_or(format!("{found:?} != {all:?}"))
    })
    .await;
    // Each task by its other key, alone.
    for (i, id) in [(0, all[3]), (3, all[1])] {
        let found = operator_search(system, &format!("key=reference:r-{i}-{account}")).await;
        assert_eq!(found, vec![id], "by its reference");
    }
    // Narrowed: by state (all Pending until pumped), workflow, time.
    let pending = operator_search(system, &format!("{by_account}&state=Pending")).await;
    assert_eq!(pending, all);
    let done = operator_search(system, &format!("{by_account}&state=Processed")).await;
    assert!(done.is_empty(), "{done:?}");
    let none = operator_search(system, &format!("{by_account}&workflow=another")).await;
    assert!(none.is_empty(), "{none:?}");
    let future = operator_search(system, &format!("{by_account}&from=2999-01-01T00:00:00Z")).await;
    assert!(future.is_empty(), "{future:?}");
    let past = operator_search(system, &format!("{by_account}&to=2999-01-01T00:00:00Z")).await;
    assert_eq!(past, all);
    // The caller's own search sees its own tasks only.
    let (status, page) = task_api(
        system,
        &alice,
        http::Method::GET,
        &format!("/tasks?{by_account}"),
        &Value::Null,
    )
    .await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(ids(&page), mine, "alice's own");
    // A task's views show its keys.
    let (status, view) = task_api(
        system,
        &bob,
        http::Method::GET,
        &format!("/tasks/{}", all[0]),
        &Value::Null,
    )
    .await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["keys"]["accountId"], json!(account), "{view}");
    assert_eq!(
        view["keys"]["reference"],
        json!(format!("r-4-{account}")),
        "{view}"
    );
    // Once it ran, a search by state finds it there.
    sas_blackbox::pump_until_quiet(system, 30).await;
    eventually("a search in the state it ended in", || async {
        let done = operator_search(system, &format!("{by_account}&state=Processed")).await;
        (done == all).then_some(()).ok_or(format!("{done:?}"))
    })
    .await;
}

async fn bad_searches_and_keys_are_refused_by_name(system: &System) {
    publish(system).await;
    let alice = caller("alice");
    for (query, code) in [
        ("key=accountId", "invalid_search"),
        ("key=1x:y", "invalid_search"),
        ("key=accountId:a&from=yesterday", "invalid_search"),
        ("state=Pending&from=2026-01-01T00:00:00Z", "invalid_search"),
        ("key=accountId:a&sort=up", "unknown_parameter"),
    ] {
        let (status, body) =
            sas_blackbox::operator_call(system, http::Method::GET, &format!("/tasks?{query}"), b"")
                .await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (400, Some(code)),
            "{query}: {body}"
        );
    }
    // An input whose key is an object is refused, naming the key; nothing is written.
    let pending = || async {
        let (_, counts) =
            sas_blackbox::operator_call(system, http::Method::GET, "/counts", b"").await;
        counts["counts"]["Pending"]["count"].clone()
    };
    let before = pending().await;
    let (status, body) = task_api(
        system,
        &alice,
        http::Method::POST,
        "/workflows/ledger-posting/tasks",
        &json!({"account": {"id": {"nested": 1}}, "reference": "r"}),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("search key accountId"), "{body}");
    assert_eq!(pending().await, before, "nothing written");
    // Publishing refuses a key that is not a query on the input.
    let bad = POSTING.replace("$.input.reference", "$.steps.post.result");
    let refused = system
        .publish(&[("posting.yaml".into(), bad)])
        .await
        .expect_err("refused");
    assert!(refused.to_string().contains("/keys/reference"), "{refused}");
}

/// Runs `sasctl` with `argv` (its first word `sasctl`): its exit code and output.
async fn sasctl(argv: &[&str]) -> (i32, String) {
    let cli = <sasctl::Cli as clap::Parser>::try_parse_from(argv).expect("args");
    let mut out = Vec::new();
    let code = sasctl::run(cli, &mut out).await.expect("runs");
    (code, String::from_utf8(out).expect("utf-8"))
}

/// `sasctl list --key` finds the tasks of a key, a page at a time, its paging hint repeating
/// the search; `--json` answers the API's page.
async fn sasctl_finds_tasks_by_key(system: &mut System) {
    let addr = sas_blackbox::serve_system(system).await;
    let endpoint = format!("http://{addr}/operator");
    let who = caller("carol");
    let account = format!("a-{}", TaskId::new_random());
    let mut made = Vec::new();
    for i in 0..3 {
        let input = json!({"account": {"id": account}, "reference": format!("s-{i}")});
        made.push(submit(system, &who, input).await);
        tokio::time::sleep(std::time::Duration::from_millis(3)).await;
    }
    made.reverse();
    let key = format!("accountId:{account}");
    let base = ["sasctl", "--endpoint", endpoint.as_str(), "--sign", "never"];
    let mut first = base.to_vec();
    first.extend(["list", "--key", key.as_str(), "--limit", "2"]);
    let (code, shown) = sasctl(&first).await;
    assert_eq!(code, 0, "{shown}");
    assert!(shown.contains(&made[0].to_string()) && shown.contains(&made[1].to_string()));
    assert!(!shown.contains(&made[2].to_string()), "{shown}");
    let hint = shown
        .lines()
        .find_map(|l| l.strip_prefix("more: "))
        .unwrap_or_else(|| panic!("a paging hint: {shown}"));
    assert!(hint.contains(&format!("--key {key}")), "{hint}");
    let words: Vec<&str> = hint.split_whitespace().collect();
    let (code, rest) = sasctl(&words).await;
    assert_eq!(code, 0, "{rest}");
    assert!(rest.contains(&made[2].to_string()), "{rest}");
    let mut json = base.to_vec();
    json.extend([
        "--json",
        "list",
        "--key",
        key.as_str(),
        "--state",
        "Pending",
    ]);
    let (code, page) = sasctl(&json).await;
    assert_eq!(code, 0, "{page}");
    let page: Value = serde_json::from_str(&page).expect("JSON");
    assert_eq!(ids(&page), made);
    let (code, none) =
        sasctl(&[base.as_slice(), &["list", "--key", "accountId:nobody"]].concat()).await;
    assert_eq!(
        (code, none.trim()),
        (0, "no tasks found by accountId:nobody")
    );
    let shown = sasctl(&[base.as_slice(), &["show", &made[0].to_string()]].concat())
        .await
        .1;
    assert!(shown.contains(&format!("accountId:{account}")), "{shown}");
}

#[tokio::test]
async fn tasks_are_found_by_each_of_their_keys_in_memory() {
    let mut system = System::new(
        Backend::Memory,
        sas_blackbox::manual_settings(),
        Arc::new(sas::ports::SystemClock),
    )
    .await
    .expect("builds");
    tasks_are_found_by_each_key(&system).await;
    bad_searches_and_keys_are_refused_by_name(&system).await;
    sasctl_finds_tasks_by_key(&mut system).await;
}

#[tokio::test]
async fn one_accounts_tasks_run_one_at_a_time_in_memory() {
    let system = System::new(
        Backend::Memory,
        sas_blackbox::manual_settings(),
        Arc::new(sas::ports::SystemClock),
    )
    .await
    .expect("builds");
    one_accounts_tasks_run_one_at_a_time_in_order(&system, 50).await;
}

#[tokio::test]
async fn one_accounts_tasks_run_one_at_a_time_on_the_emulator() {
    let (system, _) = sas_blackbox::aws_system("gates", sas_blackbox::manual_settings()).await;
    one_accounts_tasks_run_one_at_a_time_in_order(&system, 50).await;
}

#[tokio::test]
async fn tasks_are_found_by_each_of_their_keys_on_the_emulator() {
    let (system, _) = sas_blackbox::aws_system("keys", sas_blackbox::manual_settings()).await;
    tasks_are_found_by_each_key(&system).await;
    bad_searches_and_keys_are_refused_by_name(&system).await;
}
