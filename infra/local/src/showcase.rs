//! Tasks in every state, for a look at the console (`sas-local serve --showcase`) and for its
//! browser test: the example workflows run against the simulated services with a refusal
//! planted where each state needs one, and an operator's resolve and cancels. Nothing here is
//! a shortcut: every task gets where it is through the API, the scheduler and the agents.

use crate::System;
use anyhow::{Context, anyhow, bail};
use http::{HeaderMap, Method};
use sas::api::{self, OPERATOR_PREFIX};
use sas::auth::Identity;
use sas::domain::{Caller, ProcessState, TaskId};
use sas::remote::Faults;
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// The principal the showcase's operator actions are recorded under.
pub const SHOWCASE_OPERATOR: &str = "arn:aws:iam::000000000000:user/showcase";

/// The example workflows' names (the showcase needs both).
const ORDER: &str = "ecommerce-order";
const LOAN: &str = "loan-application";

fn order() -> Value {
    json!({"customerId": "c-showcase", "items": [{"sku": "SKU-1", "quantity": 2}]})
}

fn loan() -> Value {
    json!({"applicantId": "a-showcase", "amount": 25000, "currency": "EUR"})
}

/// Makes tasks of the example workflows in every state and returns them by state. Needs a
/// system that is not started (it pumps by hand) with automatic compensation on; it leaves
/// every service without faults. The tasks left Processing and Compensating move on once the
/// system is started; the Pending one starts an hour after it was made.
pub async fn tasks_in_every_state(
    system: &System,
) -> anyhow::Result<BTreeMap<ProcessState, Vec<TaskId>>> {
    let mut made = BTreeMap::<ProcessState, Vec<TaskId>>::new();
    let set = |service: &str, refuse: &[&str]| {
        system.services.get(service).set_faults(Faults {
            refuse_actions: refuse.iter().map(|a| (*a).to_owned()).collect(),
            ..Faults::default()
        });
    };
    // Processed: two orders and a loan, nothing refused (the applicant signs, and waives the
    // 14-day cooling-off).
    let signed = signed_loan(system).await?;
    let mut ids = vec![
        submit(system, ORDER, order()).await?,
        submit(system, ORDER, order()).await?,
        signed,
    ];
    settle(system).await?;
    cool_off(system, &[signed]).await?;
    made.insert(ProcessState::Processed, std::mem::take(&mut ids));
    // Refused: the payment is declined and the stock released.
    set("payment", &["charge-payment"]);
    ids.push(submit(system, ORDER, order()).await?);
    settle(system).await?;
    made.insert(ProcessState::Refused, std::mem::take(&mut ids));
    // CompensationFailed: declined, and the stock cannot be released either.
    set("inventory", &["release-inventory"]);
    ids.push(submit(system, ORDER, order()).await?);
    settle(system).await?;
    made.insert(ProcessState::CompensationFailed, std::mem::take(&mut ids));
    set("payment", &[]);
    set("inventory", &[]);
    // Error: the disbursement is refused past the loan's pivot (the cooling-off is over), so
    // nothing is undone; one of the two is then resolved by hand.
    set("core-banking", &["disburse-funds"]);
    let failed = [signed_loan(system).await?, signed_loan(system).await?];
    settle(system).await?;
    cool_off(system, &failed).await?;
    set("core-banking", &[]);
    operate(
        system,
        failed[1],
        "resolve",
        "disbursed by hand from the back office",
    )
    .await?;
    made.insert(ProcessState::Error, vec![failed[0]]);
    made.insert(ProcessState::Resolved, vec![failed[1]]);
    // Compensated: an order cancelled before any step went out (it was to start in an hour).
    let cancelled = later(system).await?;
    operate(system, cancelled, "cancel", "ordered twice by mistake").await?;
    made.insert(ProcessState::Compensated, vec![cancelled]);
    // Compensating: an order cancelled while its payment is out (its undo waits for the
    // payment's deadline).
    let compensating = submit(system, ORDER, order()).await?;
    // Claimed by the task API (or, with DISPATCH_AT_SUBMISSION=false, by the scheduler here),
    // its reservation sent.
    system.pump_scheduler().await?;
    system.pump_agents().await?; // reserves
    system.pump_scheduler().await?; // applies it, sends the payment
    operate(system, compensating, "cancel", "customer called to cancel").await?;
    made.insert(ProcessState::Compensating, vec![compensating]);
    // Processing: claimed (as above), its first request out.
    let processing = submit(system, LOAN, loan()).await?;
    system.pump_scheduler().await?;
    made.insert(ProcessState::Processing, vec![processing]);
    // Pending: accepted, to start in an hour (`Start-At`), so it stays Pending once the
    // system runs.
    made.insert(ProcessState::Pending, vec![later(system).await?]);
    for (want, ids) in &made {
        for id in ids {
            let got = system
                .store
                .get_state(*id)
                .await?
                .map(|r| r.process_state)
                .ok_or_else(|| anyhow!("task {id} has no state record"))?;
            if got != *want {
                bail!("showcase task {id} is {got}, not {want}");
            }
        }
    }
    Ok(made)
}

/// Submits a task through the task API (as the local runner's anonymous caller).
async fn submit(system: &System, workflow: &str, input: Value) -> anyhow::Result<TaskId> {
    let resp = api::handle(
        &system.api,
        &Identity::anonymous(),
        &Method::POST,
        &format!("/workflows/{workflow}/tasks"),
        &HeaderMap::new(),
        input.to_string().as_bytes(),
    )
    .await;
    let body: Value = serde_json::from_str(resp.body()).context("submission answer")?;
    if resp.status() != http::StatusCode::ACCEPTED {
        bail!("submitting a {workflow} task: {} {body}", resp.status());
    }
    body["taskId"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow!("no taskId in {body}"))
}

/// Submits an order that starts an hour from now (`Start-At`): Pending until then.
async fn later(system: &System) -> anyhow::Result<TaskId> {
    let at = chrono::Utc::now() + chrono::Duration::hours(1);
    let mut headers = HeaderMap::new();
    headers.insert(
        "start-at",
        at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            .parse()
            .context("a Start-At header")?,
    );
    let resp = api::handle(
        &system.api,
        &Identity::anonymous(),
        &Method::POST,
        &format!("/workflows/{ORDER}/tasks"),
        &headers,
        order().to_string().as_bytes(),
    )
    .await;
    let body: Value = serde_json::from_str(resp.body()).context("submission answer")?;
    if resp.status() != http::StatusCode::ACCEPTED {
        bail!(
            "submitting a delayed {ORDER} task: {} {body}",
            resp.status()
        );
    }
    body["taskId"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow!("no taskId in {body}"))
}

/// Submits a loan and delivers its `contract-signed` event at once, as the e-sign webhook
/// would (kept for the signature step).
async fn signed_loan(system: &System) -> anyhow::Result<TaskId> {
    let id = submit(system, LOAN, loan()).await?;
    let resp = api::handle(
        &system.api,
        &Identity::anonymous(),
        &Method::POST,
        &format!("/tasks/{id}/events/contract-signed"),
        &HeaderMap::new(),
        json!({"signedBy": "a-showcase"}).to_string().as_bytes(),
    )
    .await;
    if resp.status() != http::StatusCode::ACCEPTED {
        bail!(
            "contract-signed for {id}: {} {}",
            resp.status(),
            resp.body()
        );
    }
    Ok(id)
}

/// The applicants waive their loans' cooling-off (an operator's `wake`), and the loans go on.
async fn cool_off(system: &System, loans: &[TaskId]) -> anyhow::Result<()> {
    for id in loans {
        operate(system, *id, "wake", "the applicant waived the cooling-off").await?;
    }
    settle(system).await
}

/// An operator action through the operator API, with its reason.
async fn operate(system: &System, id: TaskId, action: &str, reason: &str) -> anyhow::Result<()> {
    let caller = Caller::new(SHOWCASE_OPERATOR).map_err(|e| anyhow!("{e}"))?;
    let resp = api::handle(
        &system.operator,
        &Identity::Caller(caller),
        &Method::POST,
        &format!("{OPERATOR_PREFIX}/tasks/{id}/{action}"),
        &HeaderMap::new(),
        json!({ "reason": reason }).to_string().as_bytes(),
    )
    .await;
    if !resp.status().is_success() {
        bail!("{action} of {id}: {} {}", resp.status(), resp.body());
    }
    Ok(())
}

/// Pumps the scheduler and the agents until nothing moves for a few polls.
async fn settle(system: &System) -> anyhow::Result<()> {
    let mut idle = 0;
    for _ in 0..500 {
        let moved = system.pump_scheduler().await? + system.pump_agents().await?;
        if moved > 0 {
            idle = 0;
        } else if idle == 3 {
            return Ok(());
        } else {
            idle += 1;
            tokio::time::sleep(std::time::Duration::from_millis(40)).await;
        }
    }
    bail!("the showcase's tasks did not settle")
}
