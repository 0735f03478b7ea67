//! The operator's console: its pages over HTTP on the local runner, with tasks in every state
//! (`sas_local::showcase`), and the same pages in a real browser (Playwright driving Debian's
//! headless Chromium; `infra/test.sh` installs both).

use sas::ProcessState;
use sas_blackbox::memory_system;
use sas_local::{Settings, System};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

/// A served system (not started: nothing moves unless a test moves it) with tasks in every
/// state.
async fn showcase() -> (System, SocketAddr, BTreeMap<ProcessState, Vec<sas::TaskId>>) {
    let mut system = memory_system(Settings::default()).await;
    let tasks = sas_local::showcase::tasks_in_every_state(&system)
        .await
        .expect("tasks in every state");
    let addr = sas_blackbox::serve_system(&mut system).await;
    (system, addr, tasks)
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client")
}

/// A form body with the field `reason`.
fn reason(text: &str) -> String {
    url::form_urlencoded::Serializer::new(String::new())
        .append_pair("reason", text)
        .finish()
}

/// Where a form comes from, as a browser says it for the console's own pages.
const SAME_ORIGIN: &[(&str, &str)] = &[("sec-fetch-site", "same-origin")];

/// POSTs the form `body` to `url` with `headers` besides its content type.
async fn post_form(url: &str, headers: &[(&str, &str)], body: String) -> reqwest::Response {
    let mut req = client()
        .post(url)
        .header("content-type", "application/x-www-form-urlencoded");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.body(body).send().await.expect("answers")
}

/// A form refused as a 400 whose page (the form shown again) says `why`.
async fn assert_shown_again(resp: reqwest::Response, why: &str) {
    assert_eq!(resp.status().as_u16(), 400);
    let page = resp.text().await.expect("body");
    assert!(page.contains(why), "{why}: {page}");
}

async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let resp = client()
        .get(format!("http://{addr}{path}"))
        .send()
        .await
        .expect("answers");
    let status = resp.status().as_u16();
    (status, resp.text().await.expect("body"))
}

#[tokio::test]
async fn the_console_lists_tasks_by_state_with_counts_and_shows_each_tasks_timeline() {
    let (system, addr, tasks) = showcase().await;
    // `/console` is the local runner's short address of the operator API's console.
    let resp = client()
        .get(format!("http://{addr}/console?state=Error"))
        .send()
        .await
        .expect("answers");
    assert_eq!(resp.status().as_u16(), 308);
    assert_eq!(
        resp.headers()["location"],
        "/operator/console?state=Error",
        "the query survives the redirect"
    );
    for state in ProcessState::ALL {
        let (status, page) = get(addr, &format!("/operator/console?state={state}")).await;
        assert_eq!(status, 200, "{page}");
        for id in &tasks[&state] {
            assert!(page.contains(&id.to_string()), "{state}: {id} listed");
        }
        // The other states' tasks are not on this state's page.
        for (other, ids) in &tasks {
            if *other != state {
                for id in ids {
                    assert!(
                        !page.contains(&id.to_string()),
                        "{state} lists {other} {id}"
                    );
                }
            }
        }
        // Each state's tab carries its count.
        for (s, ids) in &tasks {
            let tab = format!("{s} <span class=\"count\">{}</span>", ids.len());
            assert!(page.contains(&tab), "{state} page: tab {tab}");
        }
    }
    // Filtered by workflow: the loan in Error is there, no order is.
    let (_, loans) = get(
        addr,
        "/operator/console?state=Processed&workflow=loan-application",
    )
    .await;
    let (_, orders) = get(
        addr,
        "/operator/console?state=Processed&workflow=ecommerce-order",
    )
    .await;
    let processed = &tasks[&ProcessState::Processed];
    let in_page = |page: &str| {
        processed
            .iter()
            .filter(|id| page.contains(&id.to_string()))
            .count()
    };
    assert_eq!((in_page(&loans), in_page(&orders)), (1, 2));
    // A task's page: its steps as a timeline with inputs and results, and its history.
    let failed = tasks[&ProcessState::CompensationFailed][0];
    let (status, page) = get(addr, &format!("/operator/console/tasks/{failed}")).await;
    assert_eq!(status, 200);
    for want in [
        "<ol class=\"timeline\">",
        "inventory.reserve-inventory",
        "payment.charge-payment",
        "<summary>Input</summary>",
        "<summary>Result</summary>",
        "<summary>Undo input</summary>",
        "CompensationFailed",
        "/retry\"",
        "/resolve\"",
    ] {
        assert!(page.contains(want), "task page lacks {want:?}");
    }
    assert!(!page.contains("/cancel\""), "no cancel for a failed task");
    // Its path through its workflow's graph: the payment refused, the reservation's undo failed.
    assert!(
        page.contains("data-step=\"charge-payment\" data-status=\"Failed\""),
        "the task's graph"
    );
    // The resolved task's history names the operator and the note.
    let resolved = tasks[&ProcessState::Resolved][0];
    let (_, page) = get(addr, &format!("/operator/console/tasks/{resolved}")).await;
    assert!(page.contains("operator resolve: disbursed by hand from the back office"));
    assert!(page.contains(sas_local::showcase::SHOWCASE_OPERATOR));
    // Workflows and services.
    let (_, page) = get(addr, "/operator/console/workflows").await;
    assert!(page.contains("loan-application") && page.contains("ecommerce-order"));
    let (_, page) = get(addr, "/operator/console/workflows/loan-application").await;
    assert!(page.contains("(pivot)"), "the pivot step is marked");
    assert!(
        page.contains("<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"workflow-graph\"")
            && page.contains("data-step=\"disburse-funds\""),
        "the workflow's graph"
    );
    let (_, page) = get(addr, "/operator/console/services").await;
    assert!(page.contains("core-banking") && page.contains("badge ok\">closed"));
    assert!(
        page.contains("<th scope=\"col\">Limits</th>")
            && page.contains("<th scope=\"col\">In flight</th>"),
        "each service's limits and calls in flight"
    );
    let (status, page) = get(addr, "/operator/console/tasks/not-a-task").await;
    assert_eq!(status, 400, "{page}");
    drop(system);
}

/// Every task the showcase made is counted in the EMF metrics, by workflow (and per service for
/// the step calls), in documents CloudWatch can read.
#[tokio::test]
async fn the_showcase_is_counted_in_the_metrics() {
    let (system, _addr, tasks) = showcase().await;
    let m = &system.metrics;
    let order = ("Workflow", "ecommerce-order");
    let loan = ("Workflow", "loan-application");
    assert_eq!(m.sum("TasksAccepted", &[order]), 7.0);
    assert_eq!(m.sum("TasksAccepted", &[loan]), 4.0);
    let made: usize = tasks.values().map(Vec::len).sum();
    assert_eq!(m.sum("TasksAccepted", &[]), made as f64);
    assert_eq!(m.sum("TasksProcessed", &[order]), 2.0);
    assert_eq!(m.sum("TasksProcessed", &[loan]), 1.0);
    assert_eq!(m.sum("TasksRefused", &[order]), 1.0);
    assert_eq!(m.sum("TasksCompensationFailed", &[order]), 1.0);
    assert_eq!(
        m.sum("TasksFailed", &[loan]),
        2.0,
        "both loans reached Error"
    );
    assert_eq!(m.sum("TasksResolved", &[loan]), 1.0);
    assert_eq!(m.sum("TasksCompensated", &[order]), 1.0);
    assert_eq!(m.sum("PoisonMessages", &[]), 0.0);
    // Each step request's calls, per service: the payment was asked for by the two processed
    // orders, the refused one and the one whose undo failed (the cancelled order's payment
    // request was never picked up by an agent).
    let payment = ("Service", "payment");
    assert_eq!(m.sum("StepAttempts", &[order, payment]), 4.0);
    assert!(m.sum("StepLatency", &[order, payment]) >= 0.0);
    // Three loans got as far as the signature: the processed one and the two that failed.
    assert_eq!(m.sum("CallbackWaits", &[loan, ("Service", "e-sign")]), 3.0);
    for doc in system.metrics.documents() {
        assert_eq!(
            doc["_aws"]["CloudWatchMetrics"][0]["Namespace"],
            "sas/local"
        );
        assert!(
            doc["_aws"]["Timestamp"].as_i64().is_some_and(|t| t > 0),
            "{doc}"
        );
    }
}

#[tokio::test]
async fn a_console_action_needs_a_same_origin_form_and_moves_the_task() {
    let (system, addr, tasks) = showcase().await;
    let error = tasks[&ProcessState::Error][0];
    let url = format!("http://{addr}/operator/console/tasks/{error}/retry");
    // A cross-site form (another page's POST into the operator's console) is refused.
    for (header, value) in [
        ("sec-fetch-site", "cross-site"),
        ("origin", "https://evil.example"),
    ] {
        let resp = post_form(&url, &[(header, value)], reason("forged")).await;
        assert_eq!(resp.status().as_u16(), 403, "{header}: {value}");
    }
    // The console is for browsers, which say where a form comes from: a post saying nothing
    // (neither Sec-Fetch-Site nor Origin) is refused too.
    let resp = post_form(&url, &[], reason("no fetch metadata")).await;
    assert_eq!(resp.status().as_u16(), 403, "a post without fetch metadata");
    assert_eq!(
        sas_blackbox::state(&system, error).await.process_state,
        ProcessState::Error,
        "a refused form changes nothing"
    );
    // A resolve without its note is shown again with the API's reason.
    let resp = post_form(
        &format!("http://{addr}/operator/console/tasks/{error}/resolve"),
        SAME_ORIGIN,
        reason(" "),
    )
    .await;
    assert_shown_again(resp, "reason is required").await;
    // The console's own form: applied, then the browser is sent to the task's page.
    let resp = post_form(&url, SAME_ORIGIN, reason("core banking fixed the limit")).await;
    assert_eq!(resp.status().as_u16(), 303);
    let location = resp.headers()["location"]
        .to_str()
        .expect("ascii")
        .to_owned();
    assert_eq!(
        location,
        format!("/operator/console/tasks/{error}?done=retry")
    );
    let (_, page) = get(addr, &location).await;
    assert!(page.contains("Retry applied"), "{page}");
    let r = sas_blackbox::state(&system, error).await;
    assert_eq!(r.process_state, ProcessState::Pending);
    let last = r.history.last().expect("history");
    assert_eq!(last.reason, "operator retry: core banking fixed the limit");
    // Retrying again is a conflict, shown on the confirmation page.
    let resp = post_form(&url, SAME_ORIGIN, reason("again")).await;
    assert_eq!(resp.status().as_u16(), 409);
    assert!(resp.text().await.expect("body").contains("role=\"alert\""));
}

/// Skipping a failed step from the console: the result typed in the form is kept, a result
/// that is not JSON is shown back with the reason.
#[tokio::test]
async fn a_step_skipped_from_the_console_keeps_the_result_given() {
    let (system, addr, tasks) = showcase().await;
    let error = tasks[&ProcessState::Error][0];
    let url = format!("http://{addr}/operator/console/tasks/{error}/skip");
    let (status, page) = get(addr, &format!("/operator/console/tasks/{error}/skip")).await;
    assert_eq!(status, 200);
    assert!(page.contains("name=\"result\""), "{page}");
    let form = |result: &str| {
        url::form_urlencoded::Serializer::new(String::new())
            .append_pair("reason", "paid out from the back office")
            .append_pair("result", result)
            .finish()
    };
    let bad = post_form(&url, SAME_ORIGIN, form("{oops")).await;
    assert_shown_again(bad, "the result is not JSON").await;
    let ok = post_form(&url, SAME_ORIGIN, form(r#"{"transfer": "T-9"}"#)).await;
    assert_eq!(ok.status().as_u16(), 303);
    let r = sas_blackbox::state(&system, error).await;
    assert_eq!(r.process_state, ProcessState::Processed);
    assert_eq!(
        r.steps.last().and_then(|s| s.result.as_deref()),
        Some(r#"{"transfer":"T-9"}"#)
    );
}

/// A retry on a new input from the console's form: the input is checked and kept, the task
/// moves; a compensation form offers the earlier steps to start from.
#[tokio::test]
async fn a_retry_from_the_console_may_give_the_task_a_new_input() {
    let (system, addr, tasks) = showcase().await;
    let error = tasks[&ProcessState::Error][0];
    let (_, page) = get(addr, &format!("/operator/console/tasks/{error}/retry")).await;
    assert!(page.contains("name=\"input\""), "{page}");
    let (_, page) = get(addr, &format!("/operator/console/tasks/{error}/compensate")).await;
    assert!(page.contains("<option value=\"reserve-funds\">"), "{page}");
    let post = |input: &str| {
        let body = url::form_urlencoded::Serializer::new(String::new())
            .append_pair("reason", "amount lowered")
            .append_pair("input", input)
            .finish();
        client()
            .post(format!(
                "http://{addr}/operator/console/tasks/{error}/retry"
            ))
            .header("sec-fetch-site", "same-origin")
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body)
            .send()
    };
    let bad = post(r#"{"applicantId": "a-1"}"#).await.expect("answers");
    assert_eq!(bad.status().as_u16(), 400);
    assert!(bad.text().await.expect("body").contains("input schema"));
    let input = serde_json::json!({"applicantId": "a-showcase", "amount": 1000, "currency": "EUR"});
    let ok = post(&input.to_string()).await.expect("answers");
    assert_eq!(ok.status().as_u16(), 303);
    let (task, r) = sas_blackbox::task_and_state(&system, error).await;
    assert_eq!(
        (task.input, r.process_state),
        (input, ProcessState::Pending)
    );
}

/// The shipped `order-triage` (every construct: its items picked by a forEach, then the payment,
/// by card with a credit check above 500 or by invoice, and the packing, with an express
/// booking only when asked for, in parallel branches), published by the test.
fn triage_workflow() -> serde_json::Value {
    sas::domain::workflow::parse_value(sas_chaos::ORDER_TRIAGE, sas::Format::Yaml)
        .expect("the shipped order-triage is YAML")
}

/// Publishes `order-triage` again (it is built in: the same body is already its version 1)
/// and runs two of its tasks: one paid by invoice and sent express
/// (Processed), one paid by card without express whose shipping is refused (Refused: the
/// charge and the reservation undone). Returns their ids, in that order.
async fn triage_tasks(system: &System) -> [sas::TaskId; 2] {
    let (status, body) = sas_blackbox::operator_call(
        system,
        http::Method::PUT,
        "/workflows/order-triage",
        triage_workflow().to_string().as_bytes(),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["created"], false, "the built-in version: {body}");
    let input = |amount: u32, express: bool| {
        serde_json::json!({"customerId": "c-graph", "amount": amount, "express": express,
                           "items": ["SKU-1", "SKU-2", "SKU-3"]})
    };
    let processed = sas_blackbox::submit_task(system, "order-triage", &input(120, true)).await;
    sas_blackbox::pump_until_quiet(system, 500).await;
    system
        .services
        .get("shipping")
        .set_faults(sas_blackbox::refuse(&["arrange-shipping"]));
    let refused = sas_blackbox::submit_task(system, "order-triage", &input(900, false)).await;
    sas_blackbox::pump_until_quiet(system, 500).await;
    system
        .services
        .get("shipping")
        .set_faults(sas::remote::Faults::default());
    let states = [
        sas_blackbox::state(system, processed).await,
        sas_blackbox::state(system, refused).await,
    ];
    assert_eq!(
        states.each_ref().map(|r| r.process_state),
        [ProcessState::Processed, ProcessState::Refused]
    );
    [processed, refused]
}

/// Publishes a workflow with a search key (one task at a time per key value) and starts three
/// tasks, two of them with the key's value `a-browser`: the search the browser makes, `{"key",
/// "found"}` (newest first; the newest, urgent, waits at its gate behind the other).
async fn keyed_tasks(system: &System) -> serde_json::Value {
    let posting = "name: ledger-posting\nkeys: {accountId: $.input.accountId}\n\
                   concurrency: {key: $.input.accountId, limit: 1}\n\
                   steps:\n  - {name: post, service: payment, action: charge-payment}\n";
    system
        .publish(&[("posting.yaml".into(), posting.into())])
        .await
        .expect("publishes");
    let mut found = Vec::new();
    for (n, account) in ["a-browser", "a-other", "a-browser"]
        .into_iter()
        .enumerate()
    {
        let input = serde_json::json!({ "accountId": account });
        // The newest is urgent: the list and its page say so.
        let headers: &[(&str, &str)] = if n == 2 {
            &[("priority", "urgent")]
        } else {
            &[]
        };
        let (status, _, body) = sas_blackbox::post_task(
            system,
            "ledger-posting",
            headers,
            input.to_string().as_bytes(),
        )
        .await;
        assert_eq!(status, 202, "{body}");
        let id: sas::domain::TaskId = body["taskId"]
            .as_str()
            .and_then(|s| s.parse().ok())
            .expect("a task id");
        if account == "a-browser" {
            found.push(id.to_string());
        }
        // Apart in time: the newest is the last.
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    found.reverse();
    serde_json::json!({"key": "accountId:a-browser", "found": found})
}

/// `--showcase` makes a task in every state, and they are still there to look at once the
/// system runs: the Pending one starts an hour later, so no scheduler claims it meanwhile.
#[tokio::test]
async fn the_showcases_pending_task_stays_pending_once_the_system_runs() {
    let mut system = memory_system(Settings::default()).await;
    let tasks = sas_local::showcase::tasks_in_every_state(&system)
        .await
        .expect("tasks in every state");
    system.start();
    tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
    for id in &tasks[&ProcessState::Pending] {
        let r = sas_blackbox::state(&system, *id).await;
        assert_eq!(r.process_state, ProcessState::Pending, "{:?}", r.history);
    }
    system.shutdown().await;
}

/// The console in Debian's headless Chromium, driven by Playwright (`tests/browser/console.mjs`):
/// the list filters by workflow and state, a task's page shows its timeline, and a retry from
/// the page moves the task; a workflow with a choice and a condition is drawn as a graph, and
/// its tasks' pages draw their paths. Screenshots go to `target/console/`.
#[tokio::test]
async fn the_console_works_in_a_real_browser() {
    let mut system = memory_system(Settings::default()).await;
    let triage = triage_tasks(&system).await;
    let mut tasks = sas_local::showcase::tasks_in_every_state(&system)
        .await
        .expect("tasks in every state");
    tasks
        .entry(ProcessState::Processed)
        .or_default()
        .push(triage[0]);
    tasks
        .entry(ProcessState::Refused)
        .or_default()
        .push(triage[1]);
    let search = keyed_tasks(&system).await;
    let addr = sas_blackbox::serve_system(&mut system).await;
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let script = root.join("tests/browser/console.mjs");
    let shots = root.join("target/console");
    std::fs::create_dir_all(&shots).expect("screenshot folder");
    let chromium = std::env::var("SAS_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    let ids = serde_json::to_string(
        &tasks
            .iter()
            .map(|(s, ids)| (s.as_str(), ids))
            .collect::<BTreeMap<_, _>>(),
    )
    .expect("json");
    let out = tokio::process::Command::new("node")
        .arg(&script)
        .env("CONSOLE_URL", format!("http://{addr}/console"))
        .env("CONSOLE_TASKS", ids)
        .env(
            "CONSOLE_TRIAGE",
            serde_json::json!({"processed": triage[0].to_string(), "refused": triage[1].to_string()})
                .to_string(),
        )
        .env("CONSOLE_SEARCH", search.to_string())
        .env("CONSOLE_SHOTS", &shots)
        .env("CHROMIUM", &chromium)
        .env("NODE_PATH", root.join("tests/browser/node_modules"))
        .output()
        .await
        .unwrap_or_else(|e| {
            panic!(
                "node {}: {e} (infra/test.sh installs node's playwright-core and chromium)",
                script.display()
            )
        });
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the browser test failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    // What the browser did, checked on the store: the retried task moved.
    let retried = tasks[&ProcessState::Error][0];
    let r = sas_blackbox::state(&system, retried).await;
    assert_eq!(r.process_state, ProcessState::Pending, "{stdout}");
    assert!(
        r.history
            .last()
            .is_some_and(|h| h.reason == "operator retry: retried from the browser"),
        "{:?}",
        r.history.last()
    );
    for page in [
        "tasks", "task", "confirm", "retried", "services", "graph", "workflow",
    ] {
        let shot = format!("{page}.png");
        let meta = std::fs::metadata(shots.join(&shot)).expect(&shot);
        assert!(meta.len() > 1_000, "{shot} is an image");
    }
}
