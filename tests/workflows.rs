//! Your own workflows, end to end: a workflow and services the code has never seen, written by
//! the test, published through the operator API of a running system (the local runner's code,
//! served over HTTP) in memory and on the emulator; tasks run through it to `Processed`, and
//! with a refusal at step 3 to `Refused` with exactly the undos the definition implies,
//! each with its mapped input. The same for a workflow with a condition and a choice, and for
//! one with a forEach over 20 parties at `maxConcurrency: 4`, three parallel branches and a
//! choice, refused inside a branch. A task started on version 1 finishes on version 1 after
//! version 2 is published mid-run. Bad definitions and bad inputs are refused with the place.

use sas::ports::{InState, Paging};
use sas::remote::Faults;
use sas_local::{Backend, System};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// Services the code has never seen.
fn services() -> Vec<Value> {
    ["policy-db", "ledger", "notifier"]
        .iter()
        .map(|n| json!({"name": n, "description": "made up by the test", "target": {"type": "simulated"}}))
        .collect()
}

/// A workflow the code has never seen: 4 steps, the first without an undo, results feeding
/// later inputs and undos.
fn claim_workflow(description: &str) -> Value {
    json!({
        "name": "insurance-claim",
        "description": description,
        "input": {
            "type": "object",
            "required": ["claimId", "policyNumber", "amount"],
            "additionalProperties": false,
            "properties": {
                "claimId": {"type": "string", "minLength": 1},
                "policyNumber": {"type": "string", "pattern": "^P-[0-9]+$"},
                "amount": {"type": "number", "exclusiveMinimum": 0}
            }
        },
        "defaults": {"timeout": "10s"},
        "steps": [
            {"name": "verify-policy", "service": "policy-db",
             "input": {"policy": "$.input.policyNumber"}},
            {"name": "open-claim", "service": "ledger",
             "input": {"claim": "$.input.claimId", "verification": "$.steps['verify-policy'].result.id"},
             "undo": {"action": "close-claim", "input": {"ledgerEntry": "$.steps['open-claim'].result.id"}}},
            {"name": "reserve-payout", "service": "ledger",
             "input": {"amount": "$.input.amount", "ledgerEntry": "$.steps['open-claim'].result.id"},
             "undo": {"action": "release-payout", "input": {"reservation": "$.steps['reserve-payout'].result.id"}}},
            {"name": "notify", "service": "notifier",
             "input": {"claim": "$.input.claimId", "reservation": "$.steps['reserve-payout'].result.id", "task": "$.task.id"},
             "undo": {"action": "retract-notice"}}
        ]
    })
}

async fn put(http: &reqwest::Client, url: String, body: &Value) -> (u16, Value) {
    let r = http.put(url).json(body).send().await.expect("PUT");
    let status = r.status().as_u16();
    (status, r.json().await.expect("JSON answer"))
}

async fn start(http: &reqwest::Client, base: &str, input: &Value) -> (u16, Value) {
    let r = http
        .post(format!("{base}/workflows/insurance-claim/tasks"))
        .json(input)
        .send()
        .await
        .expect("POST");
    let status = r.status().as_u16();
    (status, r.json().await.expect("JSON answer"))
}

/// Starts a claim with `input`, which must be accepted; the answer.
async fn accepted(http: &reqwest::Client, base: &str, input: &Value) -> Value {
    let (status, started) = start(http, base, input).await;
    assert_eq!(status, 202, "{started}");
    started
}

/// How many tasks are Pending.
async fn pending(system: &System) -> usize {
    let of = InState {
        state: sas::ProcessState::Pending,
        workflow: None,
    };
    let page = system.store.list(
        of,
        Paging {
            limit: 100,
            after: None,
        },
    );
    page.await.expect("list").items.len()
}

/// Polls the task until it is terminal.
async fn finished(http: &reqwest::Client, base: &str, id: &str, within: Duration) -> Value {
    let until = Instant::now() + within;
    loop {
        let v: Value = sas_blackbox::get_json(http, &format!("{base}/tasks/{id}")).await;
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
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn result_id(task: &Value, step: usize) -> Value {
    task["steps"][step]["result"]["id"].clone()
}

/// Every request a task's keys brought to a simulated service: (action, input).
fn requests(system: &System, service: &str, task: &str) -> Vec<(String, Value)> {
    sas_blackbox::requests(system, service, task)
}

async fn publish(http: &reqwest::Client, base: &str, workflow: &Value) -> (u16, Value) {
    for s in services() {
        let (status, body) = put(
            http,
            format!("{base}/services/{}", s["name"].as_str().unwrap_or_default()),
            &s,
        )
        .await;
        assert!(status == 201 || status == 200, "{status} {body}");
    }
    put(http, format!("{base}/workflows/insurance-claim"), workflow).await
}

async fn unseen_workflow_runs_and_compensates_exactly(
    system: &System,
    base: &str,
    within: Duration,
) {
    let http = reqwest::Client::new();
    let (status, body) = publish(&http, base, &claim_workflow("v1")).await;
    assert_eq!((status, body["version"].clone()), (201, json!(1)), "{body}");
    let (status, again) = publish(&http, base, &claim_workflow("v1")).await;
    assert_eq!(
        (status, again["created"].clone(), again["version"].clone()),
        (200, json!(false), json!(1))
    );

    // To Processed, each request built by its mapping.
    let input = json!({"claimId": "C-1", "policyNumber": "P-77", "amount": 1200.5});
    let started = accepted(&http, base, &input).await;
    assert_eq!(started["workflowVersion"], 1);
    let id = started["taskId"].as_str().expect("taskId").to_owned();
    let done = finished(&http, base, &id, within).await;
    assert_eq!(done["processState"], "Processed", "{done}");
    assert_eq!(
        requests(system, "policy-db", &id),
        [("verify-policy".to_owned(), json!({"policy": "P-77"}))]
    );
    assert_eq!(
        requests(system, "ledger", &id),
        [
            (
                "open-claim".to_owned(),
                json!({"claim": "C-1", "verification": result_id(&done, 0)})
            ),
            (
                "reserve-payout".to_owned(),
                json!({"amount": 1200.5, "ledgerEntry": result_id(&done, 1)})
            ),
        ]
    );
    assert_eq!(
        requests(system, "notifier", &id),
        [(
            "notify".to_owned(),
            json!({"claim": "C-1", "reservation": result_id(&done, 2), "task": id})
        )]
    );

    // A refusal at step 3: only open-claim is undone (verify-policy has no undo; the refused
    // reserve-payout had no effect), with its mapped input.
    system.services.get("ledger").set_faults(Faults {
        refuse_actions: vec!["reserve-payout".into()],
        ..Faults::default()
    });
    let input = json!({"claimId": "C-2", "policyNumber": "P-78", "amount": 5});
    let started = accepted(&http, base, &input).await;
    let id = started["taskId"].as_str().expect("taskId").to_owned();
    let done = finished(&http, base, &id, within).await;
    system.services.get("ledger").set_faults(Faults::default());
    assert_eq!(done["processState"], "Refused", "{done}");
    assert_eq!(
        requests(system, "ledger", &id),
        [
            (
                "open-claim".to_owned(),
                json!({"claim": "C-2", "verification": result_id(&done, 0)})
            ),
            (
                "close-claim".to_owned(),
                json!({"ledgerEntry": result_id(&done, 1)})
            ),
        ],
        "exactly one undo, with its mapped input"
    );
    assert_eq!(
        requests(system, "policy-db", &id).len(),
        1,
        "the check is never undone"
    );
    assert!(requests(system, "notifier", &id).is_empty());
    let statuses: Vec<_> = done["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .map(|s| (s["status"].clone(), s["undo"].clone()))
        .collect();
    assert_eq!(
        statuses,
        [
            (json!("Done"), Value::Null),
            (json!("Done"), json!("Done")),
            (json!("Failed"), Value::Null),
            (json!("Pending"), Value::Null),
        ]
    );
}

async fn a_running_task_finishes_on_its_version(system: &System, base: &str, within: Duration) {
    let http = reqwest::Client::new();
    // Hold the notifier so that the task is mid-run when version 2 is published.
    let notifier = system.services.get("notifier");
    notifier.set_faults(Faults {
        latency: Duration::from_millis(1500),
        ..Faults::default()
    });
    let input = json!({"claimId": "C-3", "policyNumber": "P-9", "amount": 7});
    let started = accepted(&http, base, &input).await;
    let v1_task = started["taskId"].as_str().expect("taskId").to_owned();
    let v1 = started["workflowVersion"].as_u64().expect("version");

    // Version 2: the notice step goes to the ledger under another action.
    let mut v2 = claim_workflow("v2");
    v2["steps"][3] = json!({"name": "notify", "service": "ledger", "action": "post-notice",
                            "input": {"claim": "$.input.claimId"}});
    let (status, body) = put(&http, format!("{base}/workflows/insurance-claim"), &v2).await;
    assert_eq!(status, 201, "{body}");
    let v2_version = body["version"].as_u64().expect("version");
    assert_eq!(v2_version, v1 + 1);
    notifier.set_faults(Faults::default());

    let (_, later) = start(
        &http,
        base,
        &json!({"claimId": "C-4", "policyNumber": "P-10", "amount": 8}),
    )
    .await;
    assert_eq!(
        later["workflowVersion"].as_u64(),
        Some(v2_version),
        "new tasks take the newest"
    );
    let later_task = later["taskId"].as_str().expect("taskId").to_owned();

    let done = finished(&http, base, &v1_task, within).await;
    assert_eq!(done["processState"], "Processed", "{done}");
    assert_eq!(done["workflowVersion"].as_u64(), Some(v1));
    assert_eq!(
        requests(system, "notifier", &v1_task).len(),
        1,
        "v1's notify went to the notifier"
    );
    assert!(
        requests(system, "ledger", &v1_task)
            .iter()
            .all(|(a, _)| a != "post-notice")
    );
    let done = finished(&http, base, &later_task, within).await;
    assert_eq!(done["processState"], "Processed", "{done}");
    assert!(requests(system, "notifier", &later_task).is_empty());
    assert!(
        requests(system, "ledger", &later_task)
            .iter()
            .any(|(a, _)| a == "post-notice")
    );

    // Both versions stay readable, unchanged.
    let old: Value = sas_blackbox::get_json(
        &http,
        &format!("{base}/workflows/insurance-claim/versions/{v1}"),
    )
    .await;
    assert_eq!(
        old["definition"]["steps"][3]["service"], "notifier",
        "{old}"
    );
}

async fn bad_definitions_and_inputs_name_the_place(system: &System, base: &str) {
    let http = reqwest::Client::new();
    let mut cases: Vec<(Value, &str, &str)> = vec![];
    let mut schema_error = claim_workflow("bad");
    schema_error["steps"][0]["colour"] = json!("red");
    cases.push((schema_error, "/steps/0", "colour"));
    let mut unknown = claim_workflow("bad");
    unknown["steps"][1]["service"] = json!("nowhere");
    cases.push((unknown, "/steps/1/service", "unknown service"));
    let mut forward = claim_workflow("bad");
    forward["steps"][1]["input"]["x"] = json!("$.steps['notify'].result.id");
    cases.push((forward, "/steps/1/input/x", "not an earlier step"));
    let mut duplicate = claim_workflow("bad");
    duplicate["steps"][2]["name"] = json!("open-claim");
    cases.push((duplicate, "/steps/2/name", "declared twice"));
    // Thousands of references to the input would make every render (and every operator read)
    // build megabytes: a mapping holds a bounded number of queries.
    let mut blow_up = claim_workflow("bad");
    blow_up["steps"][1]["input"]["x"] = json!(vec!["$.input"; 300]);
    cases.push((blow_up, "/steps/1/input", "at most 256"));
    for (definition, at, words) in cases {
        let (status, body) = put(
            &http,
            format!("{base}/workflows/insurance-claim"),
            &definition,
        )
        .await;
        assert_eq!(status, 400, "{body}");
        assert_eq!(body["error"]["code"], "invalid_definition", "{body}");
        let problems = body["error"]["problems"].as_array().expect("problems");
        assert!(
            problems
                .iter()
                .any(|p| p["at"] == at && p["message"].as_str().is_some_and(|m| m.contains(words))),
            "{at} / {words}: {body}"
        );
    }
    let listed: Value = sas_blackbox::get_json(&http, &format!("{base}/workflows")).await;
    let latest = listed["workflows"]
        .as_array()
        .expect("list")
        .iter()
        .find(|w| w["name"] == "insurance-claim")
        .map(|w| w["latest"].clone());
    assert_eq!(
        latest,
        Some(json!(2)),
        "no bad definition was published: {listed}"
    );

    let before = pending(system).await;
    for (input, pointer) in [
        (
            json!({"claimId": "C", "policyNumber": "X-1", "amount": 1}),
            "/policyNumber",
        ),
        (
            json!({"claimId": "C", "policyNumber": "P-1", "amount": -1}),
            "/amount",
        ),
        (
            json!({"claimId": "C", "policyNumber": "P-1", "amount": 1, "extra": true}),
            "",
        ),
    ] {
        let (status, body) = start(&http, base, &input).await;
        assert_eq!(status, 400, "{body}");
        assert_eq!(body["error"]["code"], "validation_failed");
        assert_eq!(body["error"]["problems"][0]["at"], pointer, "{body}");
    }
    let after = pending(system).await;
    assert_eq!(before, after, "a refused input writes nothing");
}

/// A workflow with a condition and a choice: a manual assessment only above 10,000 (whose
/// result the choice passes on, or `auto`), a notice only on request.
fn triage_workflow() -> Value {
    json!({
        "name": "claim-triage",
        "input": {
            "type": "object",
            "required": ["claimId", "amount", "notify"],
            "properties": {
                "claimId": {"type": "string"},
                "amount": {"type": "number"},
                "notify": {"type": "boolean"}
            }
        },
        "defaults": {"timeout": "10s"},
        "steps": [
            {"name": "verify-policy", "service": "policy-db", "input": {"claim": "$.input.claimId"}},
            {"name": "assess", "choice": [
                {"when": "input.amount > 10000",
                 "steps": [{"name": "manual-assessment", "service": "ledger",
                            "input": {"claim": "$.input.claimId", "amount": "$.input.amount"},
                            "undo": {"action": "withdraw-assessment",
                                     "input": {"assessment": "$.steps['manual-assessment'].result.id"}}}],
                 "result": "$.steps['manual-assessment'].result.id"}
            ], "otherwise": {"result": "auto"}},
            {"name": "notify", "service": "notifier", "when": "input.notify",
             "input": {"claim": "$.input.claimId", "assessment": "$.steps['assess'].result"}},
            {"name": "reserve-payout", "service": "ledger",
             "input": {"amount": "$.input.amount", "assessment": "$.steps['assess'].result"},
             "undo": {"action": "release-payout"}}
        ]
    })
}

/// Starts a task of `workflow` on `input` and waits for its end.
async fn run(
    http: &reqwest::Client,
    base: &str,
    workflow: &str,
    input: Value,
    within: Duration,
) -> Value {
    let r = http
        .post(format!("{base}/workflows/{workflow}/tasks"))
        .json(&input)
        .send()
        .await
        .expect("POST");
    assert_eq!(r.status().as_u16(), 202);
    let started: Value = r.json().await.expect("JSON");
    let id = started["taskId"].as_str().expect("taskId").to_owned();
    finished(http, base, &id, within).await
}

fn statuses(task: &Value) -> Vec<String> {
    task["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .map(|s| {
            format!(
                "{}={}",
                s["name"].as_str().unwrap_or("?"),
                s["status"].as_str().unwrap_or("?")
            )
        })
        .collect()
}

async fn conditions_and_a_choice_decide_what_runs(system: &System, base: &str, within: Duration) {
    let http = reqwest::Client::new();
    let (status, body) = put(
        &http,
        format!("{base}/workflows/claim-triage"),
        &triage_workflow(),
    )
    .await;
    assert_eq!(status, 201, "{body}");

    // Above 10,000 and asked to notify: the manual case runs, its result is the choice's.
    let done = run(
        &http,
        base,
        "claim-triage",
        json!({"claimId": "T-1", "amount": 20000, "notify": true}),
        within,
    )
    .await;
    let id = done["taskId"].as_str().expect("id").to_owned();
    assert_eq!(done["processState"], "Processed", "{done}");
    assert_eq!(
        done["decisions"],
        json!([{"group": "assess", "arm": 0}]),
        "{done}"
    );
    let assessment = done["steps"][1]["result"]["id"].clone();
    assert_eq!(
        requests(system, "ledger", &id),
        [
            (
                "manual-assessment".to_owned(),
                json!({"claim": "T-1", "amount": 20000})
            ),
            (
                "reserve-payout".to_owned(),
                json!({"amount": 20000, "assessment": assessment})
            ),
        ]
    );
    assert_eq!(
        requests(system, "notifier", &id),
        [(
            "notify".to_owned(),
            json!({"claim": "T-1", "assessment": assessment})
        )]
    );

    // Small and quiet: `otherwise` runs, nothing is called for the skipped steps.
    let done = run(
        &http,
        base,
        "claim-triage",
        json!({"claimId": "T-2", "amount": 50, "notify": false}),
        within,
    )
    .await;
    let id = done["taskId"].as_str().expect("id").to_owned();
    assert_eq!(done["processState"], "Processed", "{done}");
    assert_eq!(
        statuses(&done),
        [
            "verify-policy=Done",
            "manual-assessment=Skipped",
            "notify=Skipped",
            "reserve-payout=Done"
        ]
    );
    assert_eq!(
        done["decisions"],
        json!([{"group": "assess", "arm": 1, "otherwise": true}])
    );
    assert_eq!(
        requests(system, "ledger", &id),
        [(
            "reserve-payout".to_owned(),
            json!({"amount": 50, "assessment": "auto"})
        )]
    );
    assert!(requests(system, "notifier", &id).is_empty());

    // A refusal after the choice: exactly the case's step is undone, with its mapped input;
    // the skipped notice is never undone.
    system.services.get("ledger").set_faults(Faults {
        refuse_actions: vec!["reserve-payout".into()],
        ..Faults::default()
    });
    let done = run(
        &http,
        base,
        "claim-triage",
        json!({"claimId": "T-3", "amount": 12000, "notify": false}),
        within,
    )
    .await;
    system.services.get("ledger").set_faults(Faults::default());
    let id = done["taskId"].as_str().expect("id").to_owned();
    assert_eq!(done["processState"], "Refused", "{done}");
    let assessment = done["steps"][1]["result"]["id"].clone();
    assert_eq!(
        requests(system, "ledger", &id),
        [
            (
                "manual-assessment".to_owned(),
                json!({"claim": "T-3", "amount": 12000})
            ),
            (
                "withdraw-assessment".to_owned(),
                json!({"assessment": assessment})
            ),
        ]
    );
    assert!(requests(system, "notifier", &id).is_empty());
}

/// A workflow with a forEach (a notice to each of 20 parties, 4 at once), then three parallel
/// branches (the fraud check, the payout's reservation with a hold first, a notice only on
/// request), then a choice.
fn review_workflow() -> Value {
    json!({
        "name": "claim-review",
        "input": {
            "type": "object",
            "required": ["claimId", "amount", "notify", "parties"],
            "properties": {
                "claimId": {"type": "string"},
                "amount": {"type": "number"},
                "notify": {"type": "boolean"},
                "parties": {"type": "array", "items": {"type": "string"}}
            }
        },
        "defaults": {"timeout": "10s"},
        "steps": [
            {"name": "open-claim", "service": "ledger", "input": {"claim": "$.input.claimId"},
             "undo": {"action": "close-claim", "input": {"entry": "$.steps['open-claim'].result.id"}}},
            {"name": "tell-parties", "service": "notifier", "forEach": "$.input.parties", "maxConcurrency": 4,
             "input": {"party": "$.element", "n": "$.index", "claim": "$.input.claimId"},
             "undo": {"action": "untell", "input": {"notice": "$.steps['tell-parties'].result.id", "party": "$.element"}}},
            {"name": "checks", "parallel": [
                {"name": "fraud", "steps": [
                    {"name": "fraud-check", "service": "policy-db", "input": {"claim": "$.input.claimId"}}]},
                {"name": "money", "steps": [
                    {"name": "hold", "service": "ledger", "input": {"entry": "$.steps['open-claim'].result.id"},
                     "undo": {"action": "release-hold", "input": {"hold": "$.steps['hold'].result.id"}}},
                    {"name": "reserve-payout", "service": "ledger",
                     "input": {"amount": "$.input.amount", "hold": "$.steps['hold'].result.id"},
                     "undo": {"action": "release-payout", "input": {"reservation": "$.steps['reserve-payout'].result.id"}}}]},
                {"name": "notice", "steps": [
                    {"name": "draft-notice", "service": "notifier", "when": "input.notify",
                     "input": {"claim": "$.input.claimId"},
                     "undo": {"action": "retract-notice", "input": {"notice": "$.steps['draft-notice'].result.id"}}}]}
            ]},
            {"name": "assess", "choice": [
                {"when": "input.amount > 10000",
                 "steps": [{"name": "manual-assessment", "service": "policy-db",
                            "input": {"fraud": "$.steps['fraud-check'].result.id"}}],
                 "result": "$.steps['manual-assessment'].result.id"}
            ], "otherwise": {"result": "auto"}},
            {"name": "pay", "service": "ledger",
             "input": {"reservation": "$.steps['reserve-payout'].result.id", "assessment": "$.steps['assess'].result",
                       "told": "$.steps['tell-parties'].result[19].id"}}
        ]
    })
}

/// The 20 parties of a review.
fn parties() -> Vec<String> {
    (0..20).map(|k| format!("party-{k}")).collect()
}

/// The result id of the step named `name`.
fn result_of(task: &Value, name: &str) -> Value {
    task["steps"]
        .as_array()
        .and_then(|steps| steps.iter().find(|s| s["name"] == name))
        .map_or(Value::Null, |s| s["result"]["id"].clone())
}

async fn parallel_branches_run_and_undo_exactly(system: &System, base: &str, within: Duration) {
    let http = reqwest::Client::new();
    let (status, body) = put(
        &http,
        format!("{base}/workflows/claim-review"),
        &review_workflow(),
    )
    .await;
    assert_eq!(status, 201, "{body}");

    // Every branch runs; the steps after the group read each branch's results.
    let done = run(
        &http,
        base,
        "claim-review",
        json!({"claimId": "R-1", "amount": 20000, "notify": true, "parties": parties()}),
        within,
    )
    .await;
    let id = done["taskId"].as_str().expect("id").to_owned();
    assert_eq!(done["processState"], "Processed", "{done}");
    assert!(
        statuses(&done).iter().all(|s| s.ends_with("=Done")),
        "{done}"
    );
    // Every party told once, with its element and index; the step's result is their list.
    let mut inputs: Vec<Value> = requests(system, "notifier", &id)
        .into_iter()
        .filter(|(a, _)| a == "tell-parties")
        .map(|(_, i)| i)
        .collect();
    inputs.sort_by_key(|i| i["n"].as_u64());
    assert_eq!(
        inputs,
        (0..20)
            .map(|k| json!({"party": format!("party-{k}"), "n": k, "claim": "R-1"}))
            .collect::<Vec<_>>()
    );
    let results = done["steps"][1]["result"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(results.len(), 20, "{done}");
    let (entry, hold, reservation, fraud) = (
        result_of(&done, "open-claim"),
        result_of(&done, "hold"),
        result_of(&done, "reserve-payout"),
        result_of(&done, "fraud-check"),
    );
    assert_eq!(
        requests(system, "ledger", &id),
        [
            ("open-claim".to_owned(), json!({"claim": "R-1"})),
            ("hold".to_owned(), json!({"entry": entry})),
            (
                "reserve-payout".to_owned(),
                json!({"amount": 20000, "hold": hold})
            ),
            (
                "pay".to_owned(),
                json!({"reservation": reservation, "assessment": result_of(&done, "manual-assessment"),
                       "told": results[19]["id"]})
            ),
        ]
    );
    assert_eq!(
        requests(system, "policy-db", &id),
        [
            ("fraud-check".to_owned(), json!({"claim": "R-1"})),
            ("manual-assessment".to_owned(), json!({"fraud": fraud})),
        ]
    );
    assert_eq!(requests(system, "notifier", &id).len(), 21);

    // A refusal inside one branch: no step of any branch is sent after it; every step that
    // was called and has an undo is undone once, with its mapped input, last first; the
    // refused step and the steps never called are not.
    system.services.get("ledger").set_faults(Faults {
        refuse_actions: vec!["reserve-payout".into()],
        ..Faults::default()
    });
    let done = run(
        &http,
        base,
        "claim-review",
        json!({"claimId": "R-2", "amount": 500, "notify": true, "parties": parties()}),
        within,
    )
    .await;
    system.services.get("ledger").set_faults(Faults::default());
    let id = done["taskId"].as_str().expect("id").to_owned();
    assert_eq!(done["processState"], "Refused", "{done}");
    assert!(
        done["lastError"]
            .as_str()
            .is_some_and(|e| e.starts_with("reserve-payout: declined")),
        "{done}"
    );
    assert_eq!(
        done["decisions"],
        json!([{"group": "checks", "parallel": true}]),
        "the choice after the group is never reached"
    );
    let (entry, hold) = (result_of(&done, "open-claim"), result_of(&done, "hold"));
    assert_eq!(
        requests(system, "ledger", &id),
        [
            ("open-claim".to_owned(), json!({"claim": "R-2"})),
            ("hold".to_owned(), json!({"entry": entry})),
            // (The refused reservation took no effect: the service keeps no request of it.)
            ("release-hold".to_owned(), json!({"hold": hold})),
            ("close-claim".to_owned(), json!({"entry": entry})),
        ]
    );
    // The notice ran or not, as the branches raced: if it did, it is undone (before the hold:
    // its step comes later in the definition), else it was never sent. Every party told is
    // untold, with its notice and element, the last element first.
    let notices = requests(system, "notifier", &id);
    let drafts: Vec<_> = notices
        .iter()
        .filter(|(a, _)| a.contains("notice"))
        .collect();
    match drafts.as_slice() {
        [] => assert!(
            statuses(&done).contains(&"draft-notice=Pending".to_owned()),
            "never sent: {done}"
        ),
        [(draft, _), (retract, input)] => {
            assert_eq!(
                (draft.as_str(), retract.as_str()),
                ("draft-notice", "retract-notice")
            );
            assert_eq!(input, &json!({"notice": result_of(&done, "draft-notice")}));
        }
        other => panic!("the notice's calls: {other:?}"),
    }
    let elements = done["steps"][1]["elements"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(elements.len(), 20, "{done}");
    let untold: Vec<Value> = notices
        .iter()
        .filter(|(a, _)| a == "untell")
        .map(|(_, i)| i.clone())
        .collect();
    assert_eq!(
        untold,
        (0..20)
            .rev()
            .map(|k| json!({"notice": elements[k]["result"]["id"], "party": format!("party-{k}")}))
            .collect::<Vec<_>>(),
        "{done}"
    );
    assert!(
        requests(system, "policy-db", &id)
            .iter()
            .all(|(action, _)| action == "fraud-check")
    );
    let history: Vec<&str> = done["history"]
        .as_array()
        .expect("history")
        .iter()
        .filter_map(|h| {
            h["step"].as_str().filter(|_| {
                h["reason"]
                    .as_str()
                    .unwrap_or_default()
                    .starts_with("undone")
            })
        })
        .collect();
    assert_eq!(history.last(), Some(&"open-claim"), "undone last: {done}");
}

async fn the_whole_story(backend: Backend, within: Duration) {
    let (system, base) = sas_blackbox::running_system(backend).await;
    unseen_workflow_runs_and_compensates_exactly(&system, &base, within).await;
    conditions_and_a_choice_decide_what_runs(&system, &base, within).await;
    parallel_branches_run_and_undo_exactly(&system, &base, within).await;
    a_running_task_finishes_on_its_version(&system, &base, within).await;
    bad_definitions_and_inputs_name_the_place(&system, &base).await;
    system.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unseen_workflow_in_memory() {
    the_whole_story(Backend::Memory, Duration::from_secs(30)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unseen_workflow_on_the_emulator() {
    let config = sas_blackbox::sdk_config().await;
    let stack = sas_blackbox::template::provision(&config, &sas_blackbox::unique("unseen")).await;
    let backend = Backend::Existing {
        config: Box::new(config),
        resources: Box::new(stack.resources),
    };
    the_whole_story(backend, Duration::from_secs(90)).await;
}
