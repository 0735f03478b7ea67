//! The contract of the ports: one suite, run against the in-memory adapters and against the
//! AWS adapters on the emulator (`tests/contract.rs`).

use chrono::{Duration as Span, Utc};
use sas::domain::keys::{SearchKey, TaskKey};
use sas::domain::state::to_millis;
use sas::domain::transition::{self, StepOutcome};
use sas::domain::workflow::examples;
use sas::ports::{
    Catalog, CreateOutcome, CurrentRun, Cursor, DefinitionRef, DueQuery, Entry, GateAdmission,
    GateAnswer, GatePlace, GateState, GroupedMessage, Guarded, IdempotencyRecord, InState,
    KeyQuery, Kind, LeaseClaim, NewTask, Paging, Publication, Published, Queue, RateRequest,
    ReceiveRequest, ReceivedMessage, StateStore, StoreError, Turn,
};
use sas::{Caller, Policies, Policy, ProcessState, StateRecord, Task, TaskId, Workflow};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

/// How long an index read may lag the writes before it: DynamoDB's GSIs are eventually
/// consistent (usually well under a second), and so is the memory store with an index lag.
const INDEX_SETTLE: Duration = Duration::from_secs(10);

/// Runs `$body` (an async block's contents returning `Result<T, String>`) until it returns
/// `Ok`, for up to [`INDEX_SETTLE`]: a check on an index holds once the writes before it have
/// reached the index, not necessarily at once. The last failure is the test's message.
macro_rules! eventually {
    ($what:expr, $body:block) => {{
        let deadline = std::time::Instant::now() + INDEX_SETTLE;
        loop {
            let result: Result<_, String> = async { $body }.await;
            match result {
                Ok(v) => break v,
                Err(_) if std::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(25)).await
                }
                Err(e) => panic!("{} (after {:?}): {e}", $what, INDEX_SETTLE),
            }
        }
    }};
}

/// `assert!` inside [`eventually!`]: a failed check is an `Err` to try again.
macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+));
        }
    };
}

/// A store error inside [`eventually!`].
fn err(e: StoreError) -> String {
    e.to_string()
}

/// Every page of `list(state, workflow)` at `limit` rows a page, in order, each cursor passed
/// through its opaque token and back; no page may be longer than `limit`.
async fn every_page(
    store: &dyn StateStore,
    state: ProcessState,
    workflow: Option<&str>,
    limit: usize,
) -> Result<Vec<sas::ports::Summary>, String> {
    let mut rows = Vec::new();
    let mut cursor = None;
    for _ in 0..1000 {
        let page = store
            .list(
                InState { state, workflow },
                Paging {
                    limit,
                    after: cursor.as_ref(),
                },
            )
            .await
            .map_err(err)?;
        ensure!(
            page.items.len() <= limit,
            "a page of {} rows (limit {limit})",
            page.items.len()
        );
        rows.extend(page.items);
        match page.next {
            Some(c) => {
                cursor = Some(
                    sas::ports::Cursor::decode(&c.encode())
                        .ok_or("a cursor that does not round-trip")?,
                )
            }
            None => return Ok(rows),
        }
    }
    Err("more than 1000 pages".into())
}

/// The workflow a test task runs: the e-commerce order example, or the loan application.
fn workflow(name: &str) -> Workflow {
    match name {
        "loan-application" => examples::loan_application(&Policy::default()),
        _ => examples::ecommerce_order(&Policy::default()),
    }
}

fn task_of(name: &str, now: chrono::DateTime<Utc>) -> Task {
    let input = match name {
        "loan-application" => json!({"applicantId": "a-1", "amount": 1250.5, "currency": "EUR"}),
        _ => json!({
            "customerId": "c-1",
            "items": [{"sku": "SKU-1", "quantity": 2}, {"sku": "B.2", "quantity": 1}]
        }),
    };
    Task {
        input_ref: None,
        id: TaskId::new_random(),
        workflow: name.to_owned(),
        workflow_version: 1,
        input,
        input_revision: 0,
        earlier_inputs: vec![],
        reply_queue_url: Some("http://127.0.0.1:1/queue/replies".into()),
        created_at: to_millis(now),
        caller: Caller::new("arn:aws:iam::123456789012:role/shop").expect("caller"),
        keys: vec![],
    }
}

/// A task of the e-commerce order example.
fn task(now: chrono::DateTime<Utc>) -> Task {
    task_of("ecommerce-order", now)
}

fn record(t: &Task, now: chrono::DateTime<Utc>, pickup: Span) -> StateRecord {
    let mut r = StateRecord::new(
        t.id,
        &workflow(&t.workflow),
        t.reply_queue_url.clone(),
        now,
        now + pickup,
    );
    // A task of another name runs the e-commerce steps under its own name.
    r.workflow = t.workflow.clone();
    r
}

fn uniform(p: &Policy) -> Policies {
    Policies::uniform(p.clone())
}

fn is_condition_failed<T: std::fmt::Debug>(r: Result<T, StoreError>) -> bool {
    matches!(r, Err(StoreError::ConditionFailed))
}

/// The default policy without automatic compensation: a failed task stays in Error.
fn manual() -> Policy {
    Policy {
        auto_compensate: false,
        ..Policy::default()
    }
}

/// The task and record stored under `id`, which must exist.
async fn stored(store: &dyn StateStore, id: TaskId) -> (Task, StateRecord) {
    store.get(id).await.expect("read").expect("found")
}

/// Creates `t` with its record `r`, which must be new.
async fn create_new(store: &dyn StateStore, t: &Task, r: &StateRecord) {
    assert_eq!(
        store.create(NewTask::new(t, r)).await.expect("create"),
        CreateOutcome::Created
    );
}

/// The whole state-store contract.
pub async fn store_contract(store: Arc<dyn StateStore>) {
    create_is_atomic_and_reads_back(store.as_ref()).await;
    idempotency_keys_name_one_task(store.as_ref()).await;
    an_expired_key_names_a_new_task(store.as_ref()).await;
    conditional_puts_keep_their_guards(store.as_ref()).await;
    due_index_is_sparse_sharded_and_ordered(store.as_ref()).await;
    state_index_pages_cover_each_record_once(store.as_ref()).await;
    leases_have_one_holder_until_they_expire(store.as_ref()).await;
    breakers_move_one_version_at_a_time(store.as_ref()).await;
    a_services_pace_moves_only_forward_beside_its_breaker(store.as_ref()).await;
    state_index_filters_by_workflow(store.as_ref()).await;
    state_index_counts(store.as_ref()).await;
    pending_and_processing_are_listed_apart_from_one_entry(store.as_ref()).await;
    a_new_input_lands_with_its_record_or_not_at_all(store.as_ref()).await;
    callers_list_their_own_tasks_newest_first(store.as_ref()).await;
    tasks_are_found_by_their_keys(store.as_ref()).await;
    rate_limits_admit_a_burst_then_the_rate(store.as_ref()).await;
    slots_have_at_most_their_limit_of_holders(store.clone()).await;
    ambiguous_writes_read_back(store.as_ref()).await;
    a_task_is_forgotten_only_at_the_version_read(store.as_ref()).await;
    ties_in_the_state_index_page_once_each(store.as_ref()).await;
    schedule_turns_have_one_winner(store.clone()).await;
    a_run_and_its_element_read_back(store.as_ref()).await;
    runs_and_elements_are_listed_only_while_they_need_an_operator(store.as_ref()).await;
    gates_admit_in_line_and_hand_over(store.as_ref()).await;
    racing_entries_to_a_gate_admit_up_to_its_limit(store.clone()).await;
    racing_claims_have_one_winner(store).await;
}

/// A distributed forEach's run keeps its ledger (one mark per element: 10,000 of them here)
/// and an element keeps which run and task it belongs to: both read back as written.
async fn a_run_and_its_element_read_back(store: &dyn StateStore) {
    use sas::domain::run::Run;
    use sas::domain::state::{ElementOf, ParentLink, RunState};
    let now = to_millis(Utc::now());
    let link = |element| ParentLink {
        task_id: TaskId::new_random(),
        step: "each".into(),
        step_index: 2,
        generation: 1,
        reply_queue_url: "https://sqs.example/replies".into(),
        depth: 1,
        undo_attempt: Some(4),
        released: false,
        element,
    };
    let o = task(now);
    let mut run = record(&o, now, Span::seconds(60));
    run.parent = Some(link(None));
    run.run = Some(RunState {
        list: None,
        context: Some(sas::domain::payload::PayloadRef::of(
            o.id,
            br#"{"input":{"period":"2026-11"}}"#,
        )),
        ledger: Run {
            total: 10_000,
            max_concurrency: 1_000,
            tolerated: 3,
            undoable: true,
            chunk: 1,
            refused: 0,
            marks: format!(
                "{}{}{}",
                "d".repeat(8_000),
                "f".repeat(1_000),
                "o".repeat(1_000)
            ),
            stop: None,
        },
    });
    create_new(store, &o, &run).await;
    assert_eq!(store.get_state(o.id).await.expect("read"), Some(run));
    let e = task(now);
    let mut element = record(&e, now, Span::seconds(60));
    element.parent = Some(link(Some(ElementOf {
        index: 9_999,
        task_id: TaskId::new_random(),
        step_index: 2,
        first: None,
    })));
    create_new(store, &e, &element).await;
    assert_eq!(store.get_state(e.id).await.expect("read"), Some(element));
}

/// What a record of [`runs_and_elements_are_listed_only_while_they_need_an_operator`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    Task,
    Run,
    Element,
}

/// A task of `workflow` and its record in `state`: an ordinary task's, a distributed forEach's
/// run's, or one of its elements'.
fn part_of(
    workflow: &str,
    part: Part,
    state: ProcessState,
    now: chrono::DateTime<Utc>,
) -> (Task, StateRecord) {
    use sas::domain::run::Run;
    use sas::domain::state::{ElementOf, ParentLink, RunState};
    let t = task_of(workflow, now);
    let mut r = record(&t, now, Span::seconds(60));
    r.process_state = state;
    let link = |element| ParentLink {
        task_id: TaskId::new_random(),
        step: "each".into(),
        step_index: 0,
        generation: 0,
        reply_queue_url: "https://sqs.example/replies".into(),
        depth: 1,
        undo_attempt: None,
        released: false,
        element,
    };
    match part {
        Part::Task => {}
        Part::Run => {
            r.parent = Some(link(None));
            r.run = Some(RunState {
                list: None,
                context: None,
                ledger: Run {
                    total: 3,
                    max_concurrency: 2,
                    tolerated: 0,
                    undoable: true,
                    chunk: 1,
                    refused: 0,
                    marks: "do".into(),
                    stop: None,
                },
            });
        }
        Part::Element => {
            r.parent = Some(link(Some(ElementOf {
                index: 1,
                task_id: TaskId::new_random(),
                step_index: 0,
                first: None,
            })));
        }
    }
    (t, r)
}

/// The ids the state list `state` of `workflow` reads, and what it counts.
async fn listed(
    store: &dyn StateStore,
    state: ProcessState,
    workflow: &str,
) -> Result<(std::collections::BTreeSet<TaskId>, u64), String> {
    let rows = every_page(store, state, Some(workflow), 2).await?;
    let count = store
        .count(
            InState {
                state,
                workflow: Some(workflow),
            },
            100,
        )
        .await
        .map_err(err)?;
    Ok((rows.iter().map(|s| s.task_id).collect(), count.count))
}

/// A distributed forEach's run and elements stay out of the state index (the operator's lists
/// and counts by state) but while they wait for an operator (`Error`, `CompensationFailed`):
/// a run of 10,000 elements puts no row into Processing. A task beside them is listed as ever.
/// A write that moves an element into Error adds it to the index; one moving it out removes it.
async fn runs_and_elements_are_listed_only_while_they_need_an_operator(store: &dyn StateStore) {
    let workflow = format!("distributed-{}", TaskId::new_random());
    let now = to_millis(Utc::now());
    let states = [
        ProcessState::Processing,
        ProcessState::Processed,
        ProcessState::Error,
        ProcessState::CompensationFailed,
    ];
    let mut expected = std::collections::BTreeMap::new();
    for state in states {
        let mut ids = std::collections::BTreeSet::new();
        for part in [Part::Task, Part::Run, Part::Element] {
            let (t, r) = part_of(&workflow, part, state, now);
            create_new(store, &t, &r).await;
            let needs_operator = matches!(
                state,
                ProcessState::Error | ProcessState::CompensationFailed
            );
            assert_eq!(r.listed_by_state(), part == Part::Task || needs_operator);
            if r.listed_by_state() {
                ids.insert(t.id);
            }
        }
        expected.insert(state, ids);
    }
    eventually!("runs and elements in the state index", {
        for (state, ids) in &expected {
            let (got, count) = listed(store, *state, &workflow).await?;
            ensure!(&got == ids, "{state}: listed {got:?}, expected {ids:?}");
            ensure!(count == ids.len() as u64, "{state}: counted {count}");
        }
        Ok(())
    });

    // An element's own writes move it into the index and out again.
    let p = &uniform(&manual());
    let (t, r) = part_of(&workflow, Part::Element, ProcessState::Pending, now);
    create_new(store, &t, &r).await;
    let c = transition::claim(&r, "s", now, p, &transition::Linear).expect("claim");
    store.put(&c.record, &c.condition).await.expect("claimed");
    let refused = StepOutcome::Failed {
        error: "refused".into(),
    };
    let f = transition::apply_reply(
        &c.record,
        1,
        0,
        false,
        &refused,
        now,
        p,
        &transition::Linear,
    )
    .expect("fails");
    assert_eq!(f.record.process_state, ProcessState::Error);
    store.put(&f.record, &f.condition).await.expect("failed");
    eventually!("an element in Error is listed", {
        let (got, count) = listed(store, ProcessState::Error, &workflow).await?;
        ensure!(got.contains(&t.id), "{got:?}");
        // The task, the run and the element in Error from above, and this one.
        ensure!(got.len() == 4 && count == 4, "{got:?}, counted {count}");
        let (pending, _) = listed(store, ProcessState::Pending, &workflow).await?;
        ensure!(pending.is_empty(), "{pending:?}");
        Ok(())
    });
    let actor = transition::Actor {
        by: "arn:aws:iam::123456789012:user/ops".into(),
        reason: None,
        operator: true,
    };
    let resolved = transition::resolve(&f.record, &actor, now).expect("resolves");
    store
        .put(&resolved.record, &resolved.condition)
        .await
        .expect("resolved");
    eventually!("a resolved element is listed nowhere", {
        let (errors, _) = listed(store, ProcessState::Error, &workflow).await?;
        ensure!(!errors.contains(&t.id), "{errors:?}");
        let (done, count) = listed(store, ProcessState::Resolved, &workflow).await?;
        ensure!(done.is_empty() && count == 0, "{done:?}");
        Ok(())
    });
}

/// A write whose response was lost is retried by the SDK and fails its condition against its
/// own first attempt: "the record already is what I wrote" is success, not a lost race. A
/// different write under the same condition is still a lost race.
async fn ambiguous_writes_read_back(store: &dyn StateStore) {
    let p = &uniform(&Policy::default());
    let now = to_millis(Utc::now());
    let o = task(now);
    let r = record(&o, now, Span::seconds(60));
    // The create, twice: one task, and the second call says Created too.
    create_new(store, &o, &r).await;
    assert_eq!(
        store.create(NewTask::new(&o, &r)).await.expect("its retry"),
        CreateOutcome::Created,
        "a retried create that was applied is a success"
    );
    let mut other = r.clone();
    other.callback_key = "another request's".into();
    assert!(
        is_condition_failed(store.create(NewTask::new(&o, &other)).await),
        "another create of the same id is a conflict"
    );
    assert_eq!(store.get_state(o.id).await.expect("read"), Some(r.clone()));
    // A pickup re-enqueue (with its count), then a claim, each twice.
    let due = r.complete_by.expect("pickup");
    let e = transition::expire(&r, due, p, 0.5).expect("due");
    assert_eq!(e.record.requeues, 1);
    // (The SDK's retry is the same request: `put_as` with the same id.)
    for _ in 0..2 {
        store
            .put_as(Guarded::new(&e.record, &e.condition), 7)
            .await
            .expect("applied, or already applied");
    }
    assert_eq!(
        store.get_state(o.id).await.expect("read"),
        Some(e.record.clone())
    );
    let c = transition::claim(&e.record, "s1", due, p, &transition::Linear).expect("claim");
    let rival = transition::claim(&e.record, "s2", due, p, &transition::Linear).expect("claim");
    store
        .put_as(Guarded::new(&c.record, &c.condition), 8)
        .await
        .expect("claim");
    store
        .put_as(Guarded::new(&c.record, &c.condition), 8)
        .await
        .expect("the claim's retry reads back as applied");
    // Another writer making the very same claim from the same version (the same record, byte
    // for byte) is another request: it lost the race, however alike the records.
    let twin = transition::claim(&e.record, "s1", due, p, &transition::Linear).expect("claim");
    assert_eq!(twin, c, "the same transition");
    assert!(
        is_condition_failed(
            store
                .put_as(Guarded::new(&twin.record, &twin.condition), 9)
                .await
        ),
        "an identical write by another request lost the race"
    );
    assert!(
        is_condition_failed(store.put(&twin.record, &twin.condition).await),
        "so does one by a plain put (a new request)"
    );
    assert!(
        is_condition_failed(store.put(&rival.record, &rival.condition).await),
        "a rival claim under the same condition lost the race"
    );
    let got = store.get_state(o.id).await.expect("read").expect("found");
    assert_eq!((got.locked_by.as_deref(), got.requeues), (Some("s1"), 0));
    // A new input with its record, twice; a different input under the same condition loses.
    let manual = manual();
    let failed = failed_record(store, "ecommerce-order", Utc::now(), &manual).await;
    let actor = transition::Actor {
        by: "arn:aws:iam::123456789012:user/ops".into(),
        reason: None,
        operator: true,
    };
    let t = transition::retry_with_input(&failed, &actor, Utc::now(), &uniform(&manual), 0)
        .expect("retries");
    let (before, _) = stored(store, failed.task_id).await;
    let patched = json!({"customerId": "c-3", "items": [{"sku": "SKU-3", "quantity": 3}]});
    let changed = before
        .with_new_input(patched.clone(), &t.record)
        .expect("fits");
    for _ in 0..2 {
        store
            .put_with_input(Guarded::new(&t.record, &t.condition), &changed)
            .await
            .expect("applied, or already applied");
    }
    let mut other = changed.clone();
    other.input["customerId"] = json!("c-4");
    let mut rival = t.record.clone();
    rival.history.pop();
    assert!(is_condition_failed(
        store
            .put_with_input(Guarded::new(&rival, &t.condition), &other)
            .await
    ));
    let (task, record) = stored(store, failed.task_id).await;
    assert_eq!((task.input.clone(), record), (patched, t.record));
    assert_eq!(task, changed, "the revision and the earlier inputs with it");
}

/// `put_with_input`: the task's input and its record change together, under the record's
/// condition; a stale condition or a missing task changes neither.
async fn a_new_input_lands_with_its_record_or_not_at_all(store: &dyn StateStore) {
    let manual = manual();
    let failed = failed_record(store, "ecommerce-order", Utc::now(), &manual).await;
    let p = uniform(&manual);
    let actor = transition::Actor {
        by: "arn:aws:iam::123456789012:user/ops".into(),
        reason: Some("new address".into()),
        operator: true,
    };
    let t = transition::retry_with_input(&failed, &actor, Utc::now(), &p, 0).expect("retries");
    let (before, _) = stored(store, failed.task_id).await;
    let input = json!({"customerId": "c-2", "items": [{"sku": "SKU-9", "quantity": 1}]});
    let patched = before
        .with_new_input(input.clone(), &t.record)
        .expect("fits");
    // A stale condition: nothing changes.
    let mut stale = t.clone();
    stale.condition = sas::domain::Condition::Matches {
        version: failed.version + 5,
        guards: vec![],
    };
    assert!(is_condition_failed(
        store
            .put_with_input(Guarded::new(&stale.record, &stale.condition), &patched)
            .await
    ));
    let (task, record) = stored(store, failed.task_id).await;
    assert_ne!(task.input, input);
    assert_eq!(record, failed);
    // A task at another revision than the one before: nothing changes either.
    let skipped = sas::domain::Task {
        input_revision: patched.input_revision + 1,
        ..patched.clone()
    };
    assert!(is_condition_failed(
        store
            .put_with_input(Guarded::new(&t.record, &t.condition), &skipped)
            .await
    ));
    assert_eq!(
        store
            .get(failed.task_id)
            .await
            .expect("read")
            .map(|(t, _)| t),
        Some(before.clone())
    );
    // The condition holds: both change.
    store
        .put_with_input(Guarded::new(&t.record, &t.condition), &patched)
        .await
        .expect("lands");
    let (task, record) = stored(store, failed.task_id).await;
    assert_eq!((task.clone(), record), (patched.clone(), t.record.clone()));
    // The first step failed: no step ran on the submitted input, which is not kept.
    assert_eq!((task.input_revision, task.earlier_inputs.len()), (1, 0));
    // A task that does not exist: refused, nothing written.
    let mut ghost = t.record.clone();
    ghost.task_id = TaskId::new_random();
    assert!(is_condition_failed(
        store
            .put_with_input(
                Guarded::new(&ghost, &sas::domain::Condition::Absent),
                &patched
            )
            .await
    ));
    assert_eq!(store.get_state(ghost.task_id).await.expect("read"), None);
}

/// GCRA per key: `burst` at once, then one per interval; keys do not share an allowance.
async fn rate_limits_admit_a_burst_then_the_rate(store: &dyn StateStore) {
    use sas::domain::rate::{Admission, RateLimit};
    let limit = RateLimit {
        per_second: 2.0,
        burst: 3,
    };
    let (alice, bob) = (
        format!("alice-{}", TaskId::new_random()),
        format!("bob-{}", TaskId::new_random()),
    );
    let t0 = to_millis(Utc::now());
    let admit = |key: &str, now| {
        let key = key.to_owned();
        async move {
            let ask = RateRequest {
                key: &key,
                limit: &limit,
                now,
            };
            store.admit(ask).await.expect("admit")
        }
    };
    for i in 0..3 {
        assert_eq!(
            admit(&alice, t0).await,
            Admission::Admitted,
            "request {i} of the burst"
        );
    }
    let refused = admit(&alice, t0).await;
    assert_eq!(
        refused,
        Admission::Limited {
            retry_after: Span::milliseconds(500)
        },
        "the fourth at once waits one interval"
    );
    assert_eq!(
        admit(&bob, t0).await,
        Admission::Admitted,
        "another caller has its own allowance"
    );
    // One interval later, one more; then none until the next.
    let later = t0 + Span::milliseconds(500);
    assert_eq!(admit(&alice, later).await, Admission::Admitted);
    assert!(matches!(
        admit(&alice, later).await,
        Admission::Limited { .. }
    ));
    // Idle long enough, the whole burst again.
    let idle = t0 + Span::seconds(60);
    for _ in 0..3 {
        assert_eq!(admit(&alice, idle).await, Admission::Admitted);
    }
}

/// A key's slots: at most `limit` unexpired leases, however many take at once; a freed or
/// expired lease makes room; a free of a lease not held (or twice) changes nothing.
async fn slots_have_at_most_their_limit_of_holders(store: Arc<dyn StateStore>) {
    use sas::ports::{SlotAnswer, SlotRequest};
    let key = format!("service#bank-{}", TaskId::new_random());
    let t0 = to_millis(Utc::now());
    let until = t0 + Span::seconds(30);
    // Twelve holders at once on three slots: three get one.
    let takes = (0..12).map(|i| {
        let (store, key) = (store.clone(), key.clone());
        async move {
            let holder = format!("h{i}");
            let ask = SlotRequest {
                key: &key,
                limit: 3,
                holder: &holder,
                now: t0,
                until,
            };
            (holder.clone(), store.take_slot(ask).await.expect("take"))
        }
    });
    let answers = futures::future::join_all(takes).await;
    let taken: Vec<&String> = answers
        .iter()
        .filter(|(_, a)| *a == SlotAnswer::Taken)
        .map(|(h, _)| h)
        .collect();
    assert_eq!(taken.len(), 3, "{answers:?}");
    for (_, a) in &answers {
        if let SlotAnswer::Full { next_free } = a {
            assert_eq!(*next_free, until, "full until the first lease runs out");
        }
    }
    assert_eq!(store.slots_held(&key, t0).await.expect("held"), 3);
    let ask = |holder: &'static str, now, limit| SlotRequest {
        key: &key,
        limit,
        holder,
        now,
        until: now + Span::seconds(30),
    };
    // A free of a lease never taken, or of another key, changes nothing.
    store.free_slot(&key, "nobody").await.expect("free");
    store
        .free_slot("service#other", taken[0])
        .await
        .expect("free");
    assert!(matches!(
        store.take_slot(ask("late", t0, 3)).await.expect("take"),
        SlotAnswer::Full { .. }
    ));
    // A freed slot is taken again (and a second free of it is a no-op).
    store.free_slot(&key, taken[0]).await.expect("free");
    store.free_slot(&key, taken[0]).await.expect("free again");
    assert_eq!(store.slots_held(&key, t0).await.expect("held"), 2);
    let second = t0 + Span::seconds(1);
    assert_eq!(
        store.take_slot(ask("late", second, 3)).await.expect("take"),
        SlotAnswer::Taken
    );
    assert!(matches!(
        store
            .take_slot(ask("later", second, 3))
            .await
            .expect("take"),
        SlotAnswer::Full { .. }
    ));
    // Past the leases' end (their holders died mid-call) every slot is free again.
    let after = until + Span::milliseconds(1);
    assert_eq!(
        store.slots_held(&key, after).await.expect("held"),
        1,
        "late's runs later"
    );
    for holder in ["a", "b"] {
        assert_eq!(
            store.take_slot(ask(holder, after, 3)).await.expect("take"),
            SlotAnswer::Taken,
            "{holder}"
        );
    }
    assert!(matches!(
        store.take_slot(ask("c", after, 3)).await.expect("take"),
        SlotAnswer::Full { .. }
    ));
}

/// The caller index: a caller's tasks only, newest first, in pages that cover each once.
async fn callers_list_their_own_tasks_newest_first(store: &dyn StateStore) {
    let alice = Caller::new(format!(
        "arn:aws:iam::123456789012:user/alice-{}",
        TaskId::new_random()
    ))
    .expect("caller");
    let bob = Caller::new(format!("bob-{}", TaskId::new_random())).expect("caller");
    let start = Utc::now();
    let mut mine = Vec::new();
    for (i, who) in [&alice, &bob, &alice, &alice, &bob].into_iter().enumerate() {
        let mut t = task(start + Span::seconds(i as i64));
        t.caller = who.clone();
        let r = record(&t, start, Span::seconds(30));
        create_new(store, &t, &r).await;
        if who == &alice {
            mine.push(t.id);
        }
    }
    mine.reverse();
    let first_page = |limit| Paging { limit, after: None };
    eventually!("the caller index", {
        let first = store
            .list_by_caller(&alice, first_page(2))
            .await
            .map_err(err)?;
        let ids: Vec<TaskId> = first.items.iter().map(|s| s.task_id).collect();
        ensure!(ids == mine[..2], "newest first, alice's only: {ids:?}");
        ensure!(
            first
                .items
                .iter()
                .all(|s| s.process_state == ProcessState::Pending),
            "{:?}",
            first.items
        );
        let Some(next) = first.next else {
            return Err("no cursor after a full page".into());
        };
        let second = store
            .list_by_caller(
                &alice,
                Paging {
                    limit: 2,
                    after: Some(&next),
                },
            )
            .await
            .map_err(err)?;
        let rest: Vec<TaskId> = second.items.iter().map(|s| s.task_id).collect();
        ensure!(rest == mine[2..], "the rest, once: {rest:?}");
        ensure!(second.next.is_none(), "{:?}", second.next);
        let bobs = store
            .list_by_caller(&bob, first_page(10))
            .await
            .map_err(err)?;
        ensure!(bobs.items.len() == 2, "{:?}", bobs.items);
        Ok(())
    });
    let nobody = Caller::new("nobody").expect("caller");
    let none = store
        .list_by_caller(&nobody, first_page(10))
        .await
        .expect("none");
    assert!(none.items.is_empty() && none.next.is_none());
    // The caller is stored with the task.
    let (t, _) = store.get(mine[0]).await.expect("get").expect("found");
    assert_eq!(t.caller, alice);

    // Nine tasks of one caller created in one millisecond (spread over the index's
    // partitions): pages of two list each once, ties in id order.
    let carol = Caller::new(format!("carol-{}", TaskId::new_random())).expect("caller");
    let mut tied = Vec::new();
    for _ in 0..9 {
        let mut t = task(start);
        t.caller = carol.clone();
        let r = record(&t, start, Span::seconds(30));
        store.create(NewTask::new(&t, &r)).await.expect("create");
        tied.push(t.id);
    }
    tied.sort();
    eventually!("tied tasks in the caller index", {
        let mut seen = Vec::new();
        let mut after = None;
        for _ in 0..20 {
            let page = store
                .list_by_caller(
                    &carol,
                    Paging {
                        limit: 2,
                        after: after.as_ref(),
                    },
                )
                .await
                .map_err(err)?;
            seen.extend(page.items.iter().map(|s| s.task_id));
            match page.next {
                Some(c) => after = Some(c),
                None => break,
            }
        }
        ensure!(seen == tied, "each tied task once, in id order: {seen:?}");
        Ok(())
    });
}

/// Every page of a search by `q`, `limit` rows a page, each cursor through its token and back.
async fn every_key_page(
    store: &dyn StateStore,
    q: KeyQuery<'_>,
    limit: usize,
) -> Result<Vec<TaskId>, String> {
    let mut seen = Vec::new();
    let mut after: Option<Cursor> = None;
    for _ in 0..50 {
        let page = store
            .list_by_key(
                q,
                Paging {
                    limit,
                    after: after.as_ref(),
                },
            )
            .await
            .map_err(err)?;
        ensure!(page.items.len() <= limit, "a page of {}", page.items.len());
        seen.extend(page.items.iter().map(|s| s.task_id));
        match page.next {
            Some(c) => after = Some(Cursor::decode(&c.encode()).ok_or("a cursor's token")?),
            None => return Ok(seen),
        }
    }
    Err("more than 50 pages".into())
}

/// A search key in `slot`.
fn key_in(slot: u8, name: &str, value: &str) -> TaskKey {
    TaskKey {
        slot,
        key: SearchKey {
            name: name.into(),
            value: value.into(),
        },
    }
}

/// Tasks are found by each of their keys, whatever slot holds it, newest first and each once
/// across pages (ties in one millisecond included), narrowed by caller, workflow, state and
/// creation time; a task's keys read back, and a forgotten task is found no more.
async fn tasks_are_found_by_their_keys(store: &dyn StateStore) {
    let value = format!("c-{}", TaskId::new_random());
    let wanted = SearchKey {
        name: "customerId".into(),
        value: value.clone(),
    };
    let alice = Caller::new(format!("alice-{}", TaskId::new_random())).expect("caller");
    let bob = Caller::new(format!("bob-{}", TaskId::new_random())).expect("caller");
    let start = to_millis(Utc::now());
    // (creation offset in ms, caller, workflow, slot of the key, the key's value)
    let plan = [
        (0, &alice, "ecommerce-order", 0, value.as_str()),
        (1000, &bob, "loan-application", 2, value.as_str()),
        (2000, &alice, "ecommerce-order", 1, value.as_str()),
        (2000, &alice, "ecommerce-order", 0, value.as_str()),
        (2000, &bob, "ecommerce-order", 0, value.as_str()),
        (3000, &alice, "ecommerce-order", 0, "another"),
    ];
    let mut made = Vec::new();
    for (ms, who, name, slot, v) in plan {
        let mut t = task_of(name, start + Span::milliseconds(ms));
        t.caller = who.clone();
        t.keys = vec![
            key_in(slot, "customerId", v),
            key_in((slot + 1) % 3, "orderId", &format!("o-{}", made.len())),
        ];
        // In slot order, as a workflow reads them.
        t.keys.sort_by_key(|k| k.slot);
        let r = record(&t, t.created_at, Span::seconds(30));
        create_new(store, &t, &r).await;
        made.push(t);
    }
    // Newest first, ties in one millisecond by id.
    let mut found: Vec<&Task> = made[..5].iter().collect();
    found.sort_by_key(|t| (std::cmp::Reverse(t.created_at), t.id));
    let ids = |f: &dyn Fn(&Task) -> bool| -> Vec<TaskId> {
        found.iter().filter(|t| f(t)).map(|t| t.id).collect()
    };
    let all = KeyQuery::new(&wanted);
    eventually!("the key indexes", {
        let seen = every_key_page(store, all, 2).await?;
        ensure!(
            seen == ids(&|_| true),
            "every task with the key, once: {seen:?}"
        );
        let alices = every_key_page(
            store,
            KeyQuery {
                caller: Some(&alice),
                ..all
            },
            10,
        )
        .await?;
        ensure!(
            alices == ids(&|t| t.caller == alice),
            "alice's only: {alices:?}"
        );
        let loans = every_key_page(
            store,
            KeyQuery {
                workflow: Some("loan-application"),
                ..all
            },
            10,
        )
        .await?;
        ensure!(
            loans == ids(&|t| t.workflow == "loan-application"),
            "{loans:?}"
        );
        let (from, to) = (start + Span::seconds(1), start + Span::seconds(2));
        let window = every_key_page(
            store,
            KeyQuery {
                from: Some(from),
                to: Some(to),
                ..all
            },
            10,
        )
        .await?;
        ensure!(
            window == ids(&|t| t.created_at >= from && t.created_at < to),
            "created in [from, to): {window:?}"
        );
        let pending = every_key_page(
            store,
            KeyQuery {
                state: Some(ProcessState::Pending),
                ..all
            },
            10,
        )
        .await?;
        ensure!(pending == ids(&|_| true), "{pending:?}");
        let processed = every_key_page(
            store,
            KeyQuery {
                state: Some(ProcessState::Processed),
                ..all
            },
            10,
        )
        .await?;
        ensure!(processed.is_empty(), "none is Processed: {processed:?}");
        let by_order = every_key_page(
            store,
            KeyQuery::new(&SearchKey {
                name: "orderId".into(),
                value: "o-1".into(),
            }),
            10,
        )
        .await?;
        ensure!(
            by_order == vec![made[1].id],
            "by its other key: {by_order:?}"
        );
        Ok(())
    });
    let (t, r) = stored(store, made[1].id).await;
    assert_eq!(t.keys, made[1].keys, "a task's keys read back");
    store.forget_task(&r).await.expect("forgotten");
    eventually!("a forgotten task's keys", {
        let seen = every_key_page(store, all, 10).await?;
        ensure!(!seen.contains(&made[1].id), "{seen:?}");
        ensure!(seen.len() == 4, "{seen:?}");
        Ok(())
    });
}

async fn leases_have_one_holder_until_they_expire(store: &dyn StateStore) {
    let name = format!("test#{}", TaskId::new_random());
    let now = to_millis(Utc::now());
    let ttl = Span::seconds(30);
    let key = name.as_str();
    let lease = |who: &'static str, after: i64| async move {
        store
            .acquire_lease(LeaseClaim {
                name: key,
                owner: who,
                now: now + Span::seconds(after),
                ttl,
            })
            .await
            .expect(who)
    };
    assert!(lease("a", 0).await);
    assert!(!lease("b", 0).await, "held by a");
    assert!(lease("a", 10).await, "the holder renews");
    assert!(!lease("b", 35).await, "the renewal moved the expiry");
    assert!(lease("b", 40).await, "an expired lease is taken over");
    store
        .release_lease(&name, "a")
        .await
        .expect("a's release is a no-op");
    assert!(!lease("a", 41).await);
    store.release_lease(&name, "b").await.expect("release");
    assert!(lease("a", 41).await);
}

/// Fails a fresh task of `workflow` at its first step (the service refuses it) at `at`, under
/// `p`.
async fn failed_record(
    store: &dyn StateStore,
    workflow: &str,
    at: chrono::DateTime<Utc>,
    p: &Policy,
) -> StateRecord {
    let p = &uniform(p);
    let o = task_of(workflow, at);
    let r = record(&o, at, Span::seconds(60));
    store.create(NewTask::new(&o, &r)).await.expect("create");
    let c = transition::claim(&r, "s", at, p, &transition::Linear).expect("claim");
    store
        .put(&c.record, &c.condition)
        .await
        .expect("claim lands");
    let refused = StepOutcome::Failed {
        error: "refused".into(),
    };
    let f = transition::apply_reply(&c.record, 1, 0, false, &refused, at, p, &transition::Linear)
        .expect("fail");
    store
        .put(&f.record, &f.condition)
        .await
        .expect("fail lands");
    assert_eq!(
        store.get_state(o.id).await.expect("read").as_ref(),
        Some(&f.record),
        "history, outbox and step details survive the round trip"
    );
    f.record
}

async fn state_index_pages_cover_each_record_once(store: &dyn StateStore) {
    let manual = manual();
    // A far past, so no other part of the suite has records at these instants.
    let base = Utc::now() - Span::days(400);
    let mut want = Vec::new();
    for i in 0..7 {
        want.push(
            failed_record(store, "ecommerce-order", base + Span::seconds(i), &manual)
                .await
                .task_id,
        );
    }
    // Records in other states stay out of the Error list.
    let compensated = failed_record(store, "ecommerce-order", base, &Policy::default()).await;
    assert_eq!(compensated.process_state, ProcessState::Compensated);
    eventually!("pages of the state index", {
        let rows = every_page(store, ProcessState::Error, None, 3).await?;
        for s in &rows {
            ensure!(s.process_state == ProcessState::Error, "{s:?}");
            if want.contains(&s.task_id) {
                ensure!(
                    s.workflow == "ecommerce-order"
                        && s.step.as_deref() == Some("reserve-inventory")
                        && s.attempt == 1
                        && s.last_error
                            .as_deref()
                            .is_some_and(|e| e.contains("refused")),
                    "{s:?}"
                );
            }
        }
        let seen: Vec<TaskId> = rows.iter().map(|s| s.task_id).collect();
        let mine: Vec<_> = seen.iter().filter(|id| want.contains(id)).collect();
        // Each Error record exactly once, newest first across every shard (the seven are in
        // at least two of the four shards).
        let newest_first: Vec<_> = want.iter().rev().collect();
        ensure!(
            mine == newest_first,
            "each Error record once, in UpdatedAt order, newest first: {seen:?}"
        );
        ensure!(!seen.contains(&compensated.task_id), "{seen:?}");
        Ok(())
    });
    assert!(sas::ports::Cursor::decode("not-a-cursor").is_none());
}

/// Records whose `UpdatedAt` is equal (many tasks failing in one millisecond) page once each, in
/// id order, however the index returns its ties: DynamoDB leaves rows with equal sort keys in
/// no defined order, and a page that cut a shard's ties short would skip some.
async fn ties_in_the_state_index_page_once_each(store: &dyn StateStore) {
    let manual = manual();
    let workflow = format!("tied-{}", TaskId::new_random());
    // One instant, far in the past and unlike any other record's in the suite.
    let at = to_millis(Utc::now() - Span::days(550) - Span::milliseconds(rand_ms()));
    let mut want = Vec::new();
    for _ in 0..12 {
        want.push(failed_record(store, &workflow, at, &manual).await.task_id);
    }
    want.sort();
    for filter in [Some(workflow.as_str()), None] {
        eventually!("tied records in the state index", {
            let seen: Vec<TaskId> = every_page(store, ProcessState::Error, filter, 2)
                .await?
                .iter()
                .map(|s| s.task_id)
                .filter(|id| want.contains(id))
                .collect();
            ensure!(
                seen == want,
                "each tied record once, ties in id order (workflow filter {filter:?}): {seen:?}"
            );
            Ok(())
        });
    }
}

/// Up to a day of random milliseconds, so that runs sharing a table do not tie with each other.
fn rand_ms() -> i64 {
    (uuid::Uuid::new_v4().as_u128() % 86_400_000) as i64
}

/// `count` counts the records in a state (of a workflow), exactly up to its cap.
async fn state_index_counts(store: &dyn StateStore) {
    let manual = manual();
    let workflow = format!("counted-{}", TaskId::new_random());
    let base = Utc::now() - Span::days(600);
    for i in 0..3 {
        failed_record(store, &workflow, base + Span::seconds(i), &manual).await;
    }
    eventually!("counts of the state index", {
        let workflow = Some(workflow.as_str());
        let count = |state, cap| store.count(InState { state, workflow }, cap);
        let got = |c: sas::ports::Count| (c.count, c.capped);
        let exact = got(count(ProcessState::Error, 10).await.map_err(err)?);
        ensure!(exact == (3, false), "{exact:?}");
        let at_cap = got(count(ProcessState::Error, 3).await.map_err(err)?);
        ensure!(at_cap == (3, false), "{at_cap:?}");
        let capped = got(count(ProcessState::Error, 2).await.map_err(err)?);
        ensure!(capped == (2, true), "{capped:?}");
        let other = got(count(ProcessState::Processed, 10).await.map_err(err)?);
        ensure!(other == (0, false), "{other:?}");
        let all = store
            .count(
                InState {
                    state: ProcessState::Error,
                    workflow: None,
                },
                1_000_000,
            )
            .await
            .map_err(err)?;
        ensure!(all.count >= 3 && !all.capped, "{all:?}");
        Ok(())
    });
}

/// `Pending` and `Processing` share one state-index entry per task, ordered by when it was
/// created (`StateRecord::listed_since`), so that a claim writes no index entry: each state's
/// list and count still holds exactly its own tasks, newest first, in pages of any size, even
/// where the other state's tasks come between them.
async fn pending_and_processing_are_listed_apart_from_one_entry(store: &dyn StateStore) {
    let workflow = format!("active-{}", TaskId::new_random());
    let base = to_millis(Utc::now()) - Span::days(300);
    let p = &uniform(&manual());
    let mut ids = Vec::new();
    for i in 0..7 {
        let mut t = task(base + Span::seconds(i));
        t.workflow = workflow.clone();
        let r = record(&t, base + Span::seconds(i), Span::seconds(60));
        create_new(store, &t, &r).await;
        // Every other one claimed, an hour later, newest first: the claims' order is not the
        // creations'.
        if i % 2 == 0 {
            let at = base + Span::hours(1) + Span::seconds(10 - i);
            let c = transition::claim(&r, "s", at, p, &transition::Linear).expect("claim");
            store.put(&c.record, &c.condition).await.expect("claimed");
        }
        ids.push(t.id);
    }
    let pending: Vec<TaskId> = [5, 3, 1].iter().map(|&i| ids[i]).collect();
    let processing: Vec<TaskId> = [6, 4, 2, 0].iter().map(|&i| ids[i]).collect();
    eventually!("the active states listed apart", {
        for (state, expected) in [
            (ProcessState::Pending, &pending),
            (ProcessState::Processing, &processing),
        ] {
            for limit in [1, 2, 10] {
                let rows = every_page(store, state, Some(&workflow), limit).await?;
                let got: Vec<TaskId> = rows.iter().map(|s| s.task_id).collect();
                ensure!(
                    &got == expected,
                    "{state} by {limit}: {got:?}, expected {expected:?}"
                );
                ensure!(
                    rows.iter().all(|s| s.process_state == state),
                    "{state}: {rows:?}"
                );
            }
            let count = |cap| {
                store.count(
                    InState {
                        state,
                        workflow: Some(&workflow),
                    },
                    cap,
                )
            };
            let exact = count(100).await.map_err(err)?;
            ensure!(
                (exact.count, exact.capped) == (expected.len() as u64, false),
                "{state}: {exact:?}"
            );
            let capped = count(2).await.map_err(err)?;
            ensure!(
                (capped.count, capped.capped) == (2, true),
                "{state}: {capped:?}"
            );
        }
        Ok(())
    });
    // Each record keeps the time it entered its own state.
    let (_, claimed) = stored(store, ids[0]).await;
    assert_eq!(claimed.process_state, ProcessState::Processing);
    assert_eq!(claimed.since, base + Span::hours(1) + Span::seconds(10));
    assert_eq!(claimed.listed_since(), claimed.created_at);
}

async fn create_is_atomic_and_reads_back(store: &dyn StateStore) {
    let now = Utc::now();
    // A loan: a fractional amount in the input, a pivot and a step without an undo in the
    // record, all of which must survive the round trip.
    let loan = task_of("loan-application", now);
    let lr = record(&loan, now, Span::seconds(60));
    assert_eq!(lr.pivot, Some(4));
    assert!(!lr.steps[0].undoable && lr.steps[1].undoable);
    create_new(store, &loan, &lr).await;
    assert_eq!(
        store.get(loan.id).await.expect("get"),
        Some((loan.clone(), lr.clone()))
    );
    let o = task(now);
    let r = record(&o, now, Span::seconds(60));
    create_new(store, &o, &r).await;
    assert_eq!(
        store.get(o.id).await.expect("get"),
        Some((o.clone(), r.clone()))
    );
    assert_eq!(
        store.get_state(o.id).await.expect("get_state"),
        Some(r.clone())
    );
    let mut again = r.clone();
    again.created_at += Span::milliseconds(1);
    assert!(
        is_condition_failed(store.create(NewTask::new(&o, &again)).await),
        "creating an existing task must fail (unless it is the same request's retry: see ambiguous_writes_read_back)"
    );
    assert_eq!(store.get(TaskId::new_random()).await.expect("get"), None);
    assert_eq!(
        store.get_state(TaskId::new_random()).await.expect("get"),
        None
    );
}

/// A purge's last write: a task's items go only while its record is at the version the purge
/// read; once gone, forgetting it again is no error. Its purge marks round-trip.
async fn a_task_is_forgotten_only_at_the_version_read(store: &dyn StateStore) {
    let now = to_millis(Utc::now());
    let o = task(now);
    let mut r = record(&o, now, Span::seconds(60));
    r.payloads = true;
    r.purge_at = Some(now + Span::days(1));
    create_new(store, &o, &r).await;
    assert_eq!(stored(store, o.id).await.1, r, "the purge marks round-trip");
    let mut moved = r.clone();
    moved.version += 1;
    assert!(
        is_condition_failed(store.forget_task(&moved).await),
        "a record at another version is not forgotten"
    );
    assert!(store.get(o.id).await.expect("get").is_some());
    store.forget_task(&r).await.expect("forgotten");
    assert_eq!(store.get(o.id).await.expect("get"), None);
    assert_eq!(store.get_state(o.id).await.expect("get_state"), None);
    store.forget_task(&r).await.expect("gone already: no error");
}

async fn idempotency_keys_name_one_task(store: &dyn StateStore) {
    let now = Utc::now();
    let key_name = format!("key-{}", uuid::Uuid::new_v4());
    let (o1, o2) = (task(now), task_of("loan-application", now));
    let key = |o: &Task, hash: &str| IdempotencyRecord {
        key: key_name.clone(),
        request_hash: hash.into(),
        task_id: o.id,
        created_at: to_millis(now),
    };
    let first = key(&o1, "h1");
    assert_eq!(
        store
            .create(NewTask {
                key: Some(&first),
                ..NewTask::new(&o1, &record(&o1, now, Span::seconds(60)))
            })
            .await
            .expect("create"),
        CreateOutcome::Created
    );
    let again = store
        .create(NewTask {
            key: Some(&key(&o2, "h2")),
            ..NewTask::new(&o2, &record(&o2, now, Span::seconds(60)))
        })
        .await
        .expect("create with a taken key");
    assert_eq!(again, CreateOutcome::KeyExists(first));
    assert_eq!(
        store.get(o2.id).await.expect("get"),
        None,
        "a taken key writes nothing"
    );
}

/// A key names its task until it expires (`IDEMPOTENCY_KEY_TTL`, before its task can): then
/// the same key starts a new task, as in DynamoDB once its TTL deleted the item (or before it
/// did: the TTL's deletion comes some time later), and names that one from then on.
async fn an_expired_key_names_a_new_task(store: &dyn StateStore) {
    let now = to_millis(Utc::now());
    let then = now - sas::ports::IDEMPOTENCY_KEY_TTL - Span::hours(1);
    let key_name = format!("key-{}", uuid::Uuid::new_v4());
    let key = |o: &Task, hash: &str, at| IdempotencyRecord {
        key: key_name.clone(),
        request_hash: hash.into(),
        task_id: o.id,
        created_at: at,
    };
    let create = |o: Task, k: IdempotencyRecord| async move {
        store
            .create(NewTask {
                key: Some(&k),
                ..NewTask::new(&o, &record(&o, o.created_at, Span::seconds(60)))
            })
            .await
            .expect("create")
    };
    let old = task(then);
    assert_eq!(
        create(old.clone(), key(&old, "h1", then)).await,
        CreateOutcome::Created
    );
    // Still taken an hour before it expires...
    let early = task(then + Span::hours(23));
    let first = key(&old, "h1", then);
    assert_eq!(
        create(early.clone(), key(&early, "h1", early.created_at)).await,
        CreateOutcome::KeyExists(first),
        "a key names its task until it expires"
    );
    // ...and free once it has: a new task, under the same key and even the same request.
    let new = task(now);
    let second = key(&new, "h1", now);
    assert_eq!(
        create(new.clone(), second.clone()).await,
        CreateOutcome::Created,
        "a key past its expiry starts a new task"
    );
    assert!(store.get(new.id).await.expect("get").is_some());
    let again = task(now);
    assert_eq!(
        create(again.clone(), key(&again, "h1", now)).await,
        CreateOutcome::KeyExists(second),
        "the key names the new task from then on"
    );
}

async fn conditional_puts_keep_their_guards(store: &dyn StateStore) {
    let policy = Policy::default();
    let p = uniform(&policy);
    let now = Utc::now();
    let o = task(now);
    let r = record(&o, now, Span::seconds(60));
    store.create(NewTask::new(&o, &r)).await.expect("create");

    let claim = transition::claim(&r, "s-1", now, &p, &transition::Linear).expect("claim");
    store
        .put_as(Guarded::new(&claim.record, &claim.condition), 1)
        .await
        .expect("claim lands");
    store.put_as(Guarded::new(&claim.record, &claim.condition), 1).await.expect(
        "the same request twice: the record already is that claim (a retry after a lost response)",
    );
    let rival = transition::claim(&r, "s-2", now, &p, &transition::Linear)
        .expect("claim from the stale read");
    assert!(is_condition_failed(
        store.put(&rival.record, &rival.condition).await
    ));

    let claimed = store.get_state(o.id).await.expect("read").expect("exists");
    assert_eq!(claimed, claim.record);
    assert_eq!(claimed.locked_by.as_deref(), Some("s-1"));

    // A reply for a wrong attempt is rejected by the domain; a write whose guard names the
    // wrong attempt is rejected by the store even at the right version.
    let reply = transition::apply_reply(
        &claimed,
        1,
        0,
        false,
        &StepOutcome::succeeded(),
        now,
        &p,
        &transition::Linear,
    )
    .expect("reply applies");
    let mut forged = reply.condition.clone();
    if let sas::Condition::Matches { guards, .. } = &mut forged {
        guards.push(sas::Guard::AttemptIs(7));
    }
    assert!(is_condition_failed(store.put(&reply.record, &forged).await));

    // Someone else writes meanwhile without changing any guarded field: the reply's guards all
    // still hold, but it was computed from a stale read and must not land.
    let mut bumped = claimed.clone();
    bumped.version += 1;
    let bare = sas::Condition::Matches {
        version: claimed.version,
        guards: vec![],
    };
    store.put(&bumped, &bare).await.expect("version bump lands");
    assert!(
        is_condition_failed(store.put(&reply.record, &reply.condition).await),
        "a write from a stale read must fail on the version alone"
    );
    let reply = transition::apply_reply(
        &bumped,
        1,
        0,
        false,
        &StepOutcome::succeeded(),
        now,
        &p,
        &transition::Linear,
    )
    .expect("reply applies to the fresh read");
    store
        .put(&reply.record, &reply.condition)
        .await
        .expect("reply lands");

    // Expiry: guarded on the deadline having passed.
    let later = now + policy.step_timeout + Span::seconds(1);
    let current = store.get_state(o.id).await.expect("read").expect("exists");
    let exp = transition::expire(&current, later, &p, 0.5).expect("expires later");
    let mut early = exp.condition.clone();
    if let sas::Condition::Matches { guards, .. } = &mut early {
        guards.push(sas::Guard::CompleteByAtOrBefore(now));
    }
    assert!(is_condition_failed(store.put(&exp.record, &early).await));
    store
        .put(&exp.record, &exp.condition)
        .await
        .expect("expiry lands");
    let back = store.get_state(o.id).await.expect("read").expect("exists");
    assert_eq!(back.process_state, ProcessState::Pending);
    assert_eq!(back.locked_by, None, "LockedBy is removed, not kept");
    assert_eq!(back.failure_count, 1);

    let missing = record(&task(now), now, Span::seconds(1));
    let c = transition::claim(&missing, "s", now, &p, &transition::Linear).expect("claim");
    assert!(is_condition_failed(
        store.put(&c.record, &c.condition).await
    ));
}

async fn due_index_is_sparse_sharded_and_ordered(store: &dyn StateStore) {
    let p = uniform(&Policy::default());
    let shards = store.due_shards();
    let now = Utc::now();
    // Records due in the past (at distinct instants), one not yet due, one terminal.
    let mut due = Vec::new();
    for i in 0..6 {
        let o = task(now);
        let r = record(&o, now - Span::hours(1), Span::seconds(i));
        store.create(NewTask::new(&o, &r)).await.expect("create");
        due.push(r);
    }
    let o = task(now);
    let future = record(&o, now, Span::hours(1));
    store
        .create(NewTask::new(&o, &future))
        .await
        .expect("create");
    let o = task(now);
    let mut done = record(&o, now - Span::hours(1), Span::seconds(0));
    store.create(NewTask::new(&o, &done)).await.expect("create");
    let c = transition::claim(&done, "s", now - Span::hours(1), &p, &transition::Linear)
        .expect("claim");
    store.put(&c.record, &c.condition).await.expect("claim");
    let f = transition::apply_reply(
        &c.record,
        1,
        0,
        false,
        &StepOutcome::Failed { error: "no".into() },
        now - Span::hours(1),
        &p,
        &transition::Linear,
    )
    .expect("fail");
    store
        .put(&f.record, &f.condition)
        .await
        .expect("fail lands");
    done = f.record;
    assert!(done.notice_pending());

    eventually!("the due index", {
        let mut found = Vec::new();
        for shard in 0..shards {
            let whole = DueQuery {
                shard,
                now,
                limit: 1000,
                after: None,
            };
            let entries = store.due(whole).await.map_err(err)?;
            let ids: Vec<TaskId> = entries.iter().map(|e| e.task_id).collect();
            // Paging: the entries after the first are the rest, in the same order.
            if let Some(first) = entries.first() {
                let rest = store
                    .due(DueQuery {
                        after: Some(first),
                        ..whole
                    })
                    .await
                    .map_err(err)?;
                ensure!(rest == entries[1..], "a page after an entry is the rest");
            }
            for id in &ids {
                let r = store.get_state(*id).await.map_err(err)?.expect("exists");
                ensure!(
                    r.due_shard(shards) == shard,
                    "a record shows in its own shard only"
                );
            }
            let times: Vec<_> = futures_times(store, &ids).await;
            ensure!(times.windows(2).all(|w| w[0] <= w[1]), "oldest first");
            found.extend(ids);
        }
        for r in &due {
            ensure!(found.contains(&r.task_id), "past-due record missing");
        }
        ensure!(
            !found.contains(&future.task_id),
            "a future deadline is not due"
        );
        ensure!(
            found.contains(&done.task_id),
            "a terminal record owing a notice is due"
        );
        Ok(())
    });

    let delivered = transition::notice_delivered(&done, now, None).expect("owed");
    store
        .put(&delivered.record, &delivered.condition)
        .await
        .expect("lands");
    let shard = done.due_shard(shards);
    eventually!("the due index after a delivery", {
        let ids: Vec<TaskId> = store
            .due(DueQuery {
                shard,
                now,
                limit: 1000,
                after: None,
            })
            .await
            .map_err(err)?
            .iter()
            .map(|e| e.task_id)
            .collect();
        ensure!(
            !ids.contains(&done.task_id),
            "a terminal record without a notice leaves the index"
        );
        let limited = store
            .due(DueQuery {
                shard: due[0].due_shard(shards),
                now,
                limit: 1,
                after: None,
            })
            .await
            .map_err(err)?;
        ensure!(limited.len() == 1, "limit is respected: {limited:?}");
        Ok(())
    });
}

async fn futures_times(store: &dyn StateStore, ids: &[TaskId]) -> Vec<chrono::DateTime<Utc>> {
    let mut out = Vec::new();
    for id in ids {
        let r = store.get_state(*id).await.expect("read").expect("exists");
        out.extend(r.due_key);
    }
    out
}

/// A schedule's run makes its task the schedule's current task in the task's own transaction,
/// if the current task is still the one the run read (none, at first): of runs that read the
/// same current task, one starts a task and the others write nothing (`TurnTaken`); a taken
/// idempotency key is answered first (the run delivered again), and a create retried after it
/// was applied reads back as `Created`.
async fn schedule_turns_have_one_winner(store: Arc<dyn StateStore>) {
    let now = to_millis(Utc::now());
    let schedule = format!("nightly-{}", uuid::Uuid::new_v4());
    let at = |minutes: i64| now + Span::minutes(minutes);
    let turn = |run_at, after| Turn {
        schedule: &schedule,
        run_at,
        after,
    };
    assert_eq!(store.current_run(&schedule).await.expect("read"), None);
    let (o1, o2) = (task(now), task(now));
    let (r1, r2) = (
        record(&o1, now, Span::seconds(60)),
        record(&o2, now, Span::seconds(60)),
    );
    let key = |o: &Task, name: &str| IdempotencyRecord {
        key: format!("{schedule}#{name}"),
        request_hash: "h".into(),
        task_id: o.id,
        created_at: now,
    };
    let k1 = key(&o1, "t1");
    let first = NewTask {
        key: Some(&k1),
        turn: Some(turn(at(1), None)),
        ..NewTask::new(&o1, &r1)
    };
    assert_eq!(
        store.create(first).await.expect("create"),
        CreateOutcome::Created
    );
    assert_eq!(
        store.create(first).await.expect("its retry"),
        CreateOutcome::Created,
        "a retried create that was applied is a success"
    );
    assert_eq!(
        store.current_run(&schedule).await.expect("read"),
        Some(CurrentRun {
            task_id: o1.id,
            run_at: at(1)
        })
    );
    // Another run that also read "no current task": it lost, and wrote nothing.
    let k2 = key(&o2, "t2");
    let stale = NewTask {
        key: Some(&k2),
        turn: Some(turn(at(2), None)),
        ..NewTask::new(&o2, &r2)
    };
    assert_eq!(
        store.create(stale).await.expect("create"),
        CreateOutcome::TurnTaken
    );
    assert_eq!(
        store.get(o2.id).await.expect("read"),
        None,
        "nothing written"
    );
    // The first run delivered again (its key taken) with a turn read long ago: its key answers.
    let again = NewTask {
        key: Some(&key(&o2, "t1")),
        turn: Some(turn(at(1), None)),
        ..NewTask::new(&o2, &r2)
    };
    assert_eq!(
        store.create(again).await.expect("create"),
        CreateOutcome::KeyExists(k1.clone())
    );
    // Eight runs that read the first task as current, at once: one starts its task.
    let mut racing = Vec::new();
    for i in 0..8 {
        let (store, schedule) = (store.clone(), schedule.clone());
        racing.push(tokio::spawn(async move {
            let now = to_millis(Utc::now());
            let o = task(now);
            let r = record(&o, now, Span::seconds(60));
            let new = NewTask {
                turn: Some(Turn {
                    schedule: &schedule,
                    run_at: now + Span::minutes(10 + i),
                    after: Some(o1.id),
                }),
                ..NewTask::new(&o, &r)
            };
            match store.create(new).await.expect("create") {
                CreateOutcome::Created => Some(o.id),
                CreateOutcome::TurnTaken => {
                    assert_eq!(
                        store.get(o.id).await.expect("read"),
                        None,
                        "nothing written"
                    );
                    None
                }
                other => panic!("{other:?}"),
            }
        }));
    }
    let mut winners = vec![];
    for t in racing {
        winners.extend(t.await.expect("task"));
    }
    assert_eq!(
        winners.len(),
        1,
        "exactly one of 8 racing runs starts a task"
    );
    let current = store
        .current_run(&schedule)
        .await
        .expect("read")
        .expect("one");
    assert_eq!(current.task_id, winners[0]);
    // Another schedule's turn is its own.
    assert_eq!(
        store
            .current_run(&format!("{schedule}-other"))
            .await
            .expect("read"),
        None
    );
}

/// Creates a task in line at `gate` (limit `limit`), created `ms` after `start`.
async fn in_line(
    store: &dyn StateStore,
    gate: &str,
    limit: u32,
    start: chrono::DateTime<Utc>,
    ms: i64,
) -> (Task, StateRecord) {
    let t = task(start + Span::milliseconds(ms));
    let r = record(&t, t.created_at, Span::seconds(60));
    let place = GatePlace {
        gate,
        task_id: t.id,
        created_at: t.created_at,
        limit,
    };
    let new = NewTask {
        gate: Some(place),
        ..NewTask::new(&t, &r)
    };
    assert_eq!(
        store.create(new).await.expect("create"),
        CreateOutcome::Created
    );
    (t, r)
}

fn place_of<'a>(gate: &'a str, t: &Task, limit: u32) -> GatePlace<'a> {
    GatePlace {
        gate,
        task_id: t.id,
        created_at: t.created_at,
        limit,
    }
}

/// `t`'s entry at `gate` with its claim: the answer, and whether the claim was written.
async fn enter(
    store: &dyn StateStore,
    gate: &str,
    limit: u32,
    t: &Task,
) -> Result<GateAnswer, StoreError> {
    let current = store.get_state(t.id).await.expect("read").expect("exists");
    let claim = transition::claim(
        &current,
        "gatekeeper",
        Utc::now(),
        &uniform(&Policy::default()),
        &transition::Linear,
    )
    .expect("claimable");
    store
        .enter(GateAdmission {
            place: place_of(gate, t, limit),
            put: Guarded::new(&claim.record, &claim.condition),
            now: Utc::now(),
        })
        .await
}

/// A gate admits the first in line while it has room, never one created after a task still
/// waiting; its record is written with the admission or not at all; a task that leaves (held,
/// or still waiting) names the tasks then first in line.
async fn gates_admit_in_line_and_hand_over(store: &dyn StateStore) {
    let gate = format!("ledger#a-{}", TaskId::new_random());
    let start = to_millis(Utc::now());
    let (a, _) = in_line(store, &gate, 1, start, 0).await;
    let (b, _) = in_line(store, &gate, 1, start, 1).await;
    let (c, _) = in_line(store, &gate, 1, start, 2).await;
    let waiting = |holders: Vec<TaskId>, ahead: u32| {
        GateAnswer::Waiting(GateState {
            holders,
            ahead: Some(ahead),
        })
    };
    // B may not go before A, however empty the gate.
    assert_eq!(
        enter(store, &gate, 1, &b).await.expect("b"),
        waiting(vec![], 1)
    );
    assert_eq!(stored(store, b.id).await.1.attempt, 0, "nothing written");
    assert_eq!(
        enter(store, &gate, 1, &a).await.expect("a"),
        GateAnswer::Admitted
    );
    assert_eq!(
        stored(store, a.id).await.1.attempt,
        1,
        "its claim written with it"
    );
    assert_eq!(
        enter(store, &gate, 1, &b).await.expect("b"),
        waiting(vec![a.id], 0)
    );
    let seen = store
        .gate_state(place_of(&gate, &c, 1))
        .await
        .expect("state");
    assert_eq!(
        seen,
        GateState {
            holders: vec![a.id],
            ahead: Some(1)
        }
    );
    // A leaves: B is first in line, and the gate has room for one.
    assert_eq!(
        store.leave(place_of(&gate, &a, 1)).await.expect("leave"),
        vec![b.id]
    );
    assert_eq!(
        store.leave(place_of(&gate, &a, 1)).await.expect("again"),
        vec![b.id],
        "idempotent"
    );
    // A record whose condition fails is no admission.
    let current = store.get_state(b.id).await.expect("read").expect("exists");
    let mut stale = transition::claim(
        &current,
        "late",
        Utc::now(),
        &uniform(&Policy::default()),
        &transition::Linear,
    )
    .expect("claimable");
    stale.record.version += 5;
    let r = store
        .enter(GateAdmission {
            place: place_of(&gate, &b, 1),
            put: Guarded::new(&stale.record, &guarded_at(current.version + 3)),
            now: Utc::now(),
        })
        .await;
    assert!(is_condition_failed(r), "a record that moved on");
    assert_eq!(
        enter(store, &gate, 1, &c).await.expect("c"),
        waiting(vec![], 1),
        "still after B"
    );
    assert_eq!(
        enter(store, &gate, 1, &b).await.expect("b"),
        GateAnswer::Admitted
    );
    // Deep in line (past what a leave reads of the line first), E and then D leave, as
    // cancelled tasks do: each its own place only.
    let (d, _) = in_line(store, &gate, 1, start, 3).await;
    let (e, _) = in_line(store, &gate, 1, start, 4).await;
    assert_eq!(
        store.leave(place_of(&gate, &e, 1)).await.expect("e leaves"),
        vec![]
    );
    let state = |t: &Task| store.gate_state(place_of(&gate, t, 1));
    assert_eq!(state(&e).await.expect("state").ahead, None, "e left");
    assert_eq!(state(&d).await.expect("state").ahead, Some(1), "d stays");
    assert_eq!(
        store.leave(place_of(&gate, &d, 1)).await.expect("d leaves"),
        vec![]
    );
    // C, waiting, leaves (cancelled): the gate, held by B, names no one.
    assert_eq!(
        store.leave(place_of(&gate, &c, 1)).await.expect("c leaves"),
        vec![]
    );
    assert_eq!(
        store
            .gate_state(place_of(&gate, &c, 1))
            .await
            .expect("state"),
        GateState {
            holders: vec![b.id],
            ahead: None
        }
    );
    assert_eq!(
        store.leave(place_of(&gate, &b, 1)).await.expect("b leaves"),
        vec![]
    );
    assert_eq!(
        store
            .gate_state(place_of(&gate, &b, 1))
            .await
            .expect("state"),
        GateState::default()
    );
}

/// An admission is written under the gate's head as its store read it (the contract of
/// [`sas::ports::Gates::enter`]): a head that moved between the read and the write (here a
/// holder left, through `plain`) fails the admission, `ConditionFailed`, and the next try,
/// reading the head again, admits. `racing` is the same store whose next write `paused` stops
/// at (see [`Pause`]) until this test has moved the head.
pub async fn an_admission_is_written_under_the_head_as_read(
    racing: Arc<dyn StateStore>,
    plain: &dyn StateStore,
    paused: &Pause,
) {
    let gate = format!("ledger#a-{}", TaskId::new_random());
    let limit = 2;
    let start = to_millis(Utc::now());
    let (h, _) = in_line(plain, &gate, limit, start, 0).await;
    let (a, _) = in_line(plain, &gate, limit, start, 1).await;
    assert_eq!(
        enter(plain, &gate, limit, &h).await.expect("h"),
        GateAnswer::Admitted
    );
    // A reads the head (H holds it, one place left, A first in line); its write stops.
    let reached = paused.arm();
    let entering = {
        let (racing, gate, a) = (racing.clone(), gate.clone(), a.clone());
        tokio::spawn(async move { enter(racing.as_ref(), &gate, limit, &a).await })
    };
    tokio::time::timeout(Duration::from_secs(30), reached)
        .await
        .expect("A's admission reached its write within 30 s")
        .expect("A's admission reached its write");
    // Meanwhile H leaves: the head moves.
    plain
        .leave(place_of(&gate, &h, limit))
        .await
        .expect("h leaves");
    paused.release();
    let first = entering.await.expect("the admission's task");
    assert!(
        matches!(first, Err(StoreError::ConditionFailed)),
        "an admission read before the head moved is not written: {first:?}"
    );
    assert_eq!(
        stored(plain, a.id).await.1.attempt,
        0,
        "A's claim was not written"
    );
    // Read again, A is admitted, alone.
    assert_eq!(
        enter(plain, &gate, limit, &a).await.expect("a"),
        GateAnswer::Admitted
    );
    assert_eq!(
        plain
            .gate_state(place_of(&gate, &a, limit))
            .await
            .expect("state")
            .holders,
        vec![a.id]
    );
}

/// Stops a store's next transaction before it is sent, until released: an SDK interceptor for
/// the DynamoDB store (see [`an_admission_is_written_under_the_head_as_read`]). Armed, the next
/// `TransactWriteItems` tells its arming that it got there, then waits for [`Pause::release`]
/// (in `block_in_place`: run the test on a multi-threaded runtime).
#[derive(Clone, Default)]
pub struct Pause(Arc<std::sync::Mutex<PauseState>>);

#[derive(Default)]
struct PauseState {
    reached: Option<tokio::sync::oneshot::Sender<()>>,
    release: Option<std::sync::mpsc::Receiver<()>>,
    go: Option<std::sync::mpsc::Sender<()>>,
}

impl std::fmt::Debug for Pause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Pause")
    }
}

impl Pause {
    /// Stops the next transaction: the answer says when it got there.
    pub fn arm(&self) -> tokio::sync::oneshot::Receiver<()> {
        let (reached, got_there) = tokio::sync::oneshot::channel();
        let (go, release) = std::sync::mpsc::channel();
        let mut s = self.0.lock().expect("pause");
        *s = PauseState {
            reached: Some(reached),
            release: Some(release),
            go: Some(go),
        };
        got_there
    }

    /// Lets the stopped transaction go on.
    pub fn release(&self) {
        if let Some(go) = self.0.lock().expect("pause").go.take() {
            let _ = go.send(());
        }
    }
}

impl aws_smithy_runtime_api::client::interceptors::Intercept for Pause {
    fn name(&self) -> &'static str {
        "contract-pause"
    }

    fn read_before_transmit(
        &self,
        _context: &aws_smithy_runtime_api::client::interceptors::context::BeforeTransmitInterceptorContextRef<'_>,
        _components: &aws_smithy_runtime_api::client::runtime_components::RuntimeComponents,
        cfg: &mut aws_smithy_types::config_bag::ConfigBag,
    ) -> Result<(), aws_smithy_runtime_api::box_error::BoxError> {
        let transaction = cfg
            .load::<aws_smithy_runtime_api::client::orchestrator::Metadata>()
            .is_some_and(|m| m.name() == "TransactWriteItems");
        if !transaction {
            return Ok(());
        }
        let (reached, release) = {
            let mut s = self.0.lock().expect("pause");
            (s.reached.take(), s.release.take())
        };
        if let (Some(reached), Some(release)) = (reached, release) {
            let _ = reached.send(());
            // Waited for off the runtime's worker (`block_in_place` hands its queued tasks to
            // another thread): a task this worker had woken, such as the HTTP connection the
            // test's own next call waits on, would otherwise be stuck behind the wait. Not
            // released in time, the transaction fails (a release after its write would prove
            // nothing).
            let waited = tokio::task::block_in_place(|| {
                release.recv_timeout(std::time::Duration::from_secs(120))
            });
            if waited.is_err() {
                return Err("the paused transaction was not released within 120 s".into());
            }
        }
        Ok(())
    }
}

/// The condition of a record at `version` (what a claim of it is written under).
fn guarded_at(version: u64) -> sas::domain::Condition {
    sas::domain::Condition::Matches {
        version,
        guards: vec![],
    }
}

/// Many tasks entering one gate at once, each from its own racer and trying again on a lost
/// race, until every task was admitted once and left: never more than the limit hold it, and
/// each is admitted in its turn.
async fn racing_entries_to_a_gate_admit_up_to_its_limit(store: Arc<dyn StateStore>) {
    let gate = format!("ledger#a-{}", TaskId::new_random());
    let limit = 2;
    let start = to_millis(Utc::now());
    let mut line = Vec::new();
    for i in 0..10 {
        line.push(in_line(store.as_ref(), &gate, limit, start, i).await.0);
    }
    let holding = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let most = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut racers = Vec::new();
    for t in line.clone() {
        let (store, gate) = (store.clone(), gate.clone());
        let (holding, most, order) = (holding.clone(), most.clone(), order.clone());
        racers.push(tokio::spawn(async move {
            for _ in 0..400 {
                match enter(store.as_ref(), &gate, limit, &t).await {
                    Ok(GateAnswer::Admitted) => {
                        let now = holding.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                        most.fetch_max(now, std::sync::atomic::Ordering::SeqCst);
                        order.lock().expect("order").push(t.id);
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        holding.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                        store
                            .leave(place_of(&gate, &t, limit))
                            .await
                            .expect("leave");
                        return;
                    }
                    Ok(GateAnswer::Waiting(_)) | Err(StoreError::ConditionFailed) => {
                        tokio::time::sleep(Duration::from_millis(5)).await
                    }
                    Err(e) => panic!("{e}"),
                }
            }
            panic!("{} never admitted", t.id);
        }));
    }
    for r in racers {
        r.await.expect("racer");
    }
    assert!(
        most.load(std::sync::atomic::Ordering::SeqCst) <= limit,
        "never over the limit"
    );
    let order = order.lock().expect("order").clone();
    let ids: Vec<TaskId> = line.iter().map(|t| t.id).collect();
    // Admitted in turn: each among the first `limit` still in line when admitted.
    for (i, id) in order.iter().enumerate() {
        let pos = ids.iter().position(|x| x == id).expect("known");
        assert!(
            pos < i + limit as usize,
            "{id} admitted {i}th from place {pos}: {order:?}"
        );
    }
}

async fn racing_claims_have_one_winner(store: Arc<dyn StateStore>) {
    let p = uniform(&Policy::default());
    let now = Utc::now();
    let o = task(now);
    let r = record(&o, now, Span::seconds(60));
    store.create(NewTask::new(&o, &r)).await.expect("create");
    let mut tasks = Vec::new();
    for i in 0..8 {
        let (store, p) = (store.clone(), p.clone());
        tasks.push(tokio::spawn(async move {
            let current = store.get_state(o.id).await.expect("read").expect("exists");
            let Ok(t) = transition::claim(
                &current,
                &format!("s-{i}"),
                Utc::now(),
                &p,
                &transition::Linear,
            ) else {
                return false;
            };
            match store.put(&t.record, &t.condition).await {
                Ok(()) => true,
                Err(StoreError::ConditionFailed) => false,
                Err(e) => panic!("unexpected store error {e}"),
            }
        }));
    }
    let mut winners = 0;
    for t in tasks {
        winners += usize::from(t.await.expect("task"));
    }
    assert_eq!(winners, 1, "exactly one of 8 racing claims wins");
    let r = store.get_state(o.id).await.expect("read").expect("exists");
    assert_eq!(r.attempt, 1);
}

/// The queue contract. `url` must have a 1 s visibility timeout and redrive to `dlq_url`
/// after 2 receives.
pub async fn queue_contract(queue: &dyn Queue, url: &str, dlq_url: &str) {
    let none = Duration::ZERO;
    // Send, receive, delete.
    queue.send(url, "one", none).await.expect("send");
    let got = queue
        .receive(ReceiveRequest {
            queue_url: url,
            max: 10,
            wait: Duration::from_secs(1),
        })
        .await
        .expect("receive");
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].body, "one");
    assert_eq!(got[0].receive_count, 1);
    queue
        .delete(url, &got[0].receipt_handle)
        .await
        .expect("delete");

    // A tenant's message (SQS fair queues: a group on a standard queue): delivered as any
    // other, after its delay.
    queue
        .send_fair(sas::ports::FairMessage {
            queue_url: url,
            group: Some("0123456789abcdef"),
            body: "fair",
            delay: Duration::from_secs(1),
        })
        .await
        .expect("a fair send");
    assert_nothing_visible(queue, url, "a delayed fair send").await;
    let fair = receive_within(queue, url, Duration::from_secs(5))
        .await
        .expect("the fair send delivered");
    assert_eq!(fair.body, "fair");
    queue
        .delete(url, &fair.receipt_handle)
        .await
        .expect("delete");

    // Delayed delivery.
    queue
        .send(url, "later", Duration::from_secs(1))
        .await
        .expect("send");
    assert_nothing_visible(queue, url, "delayed").await;
    let got = receive_within(queue, url, Duration::from_secs(5)).await;
    assert_eq!(got.map(|m| m.body).as_deref(), Some("later"));
    // Not deleted: it comes back after the visibility timeout, counted, then goes to the DLQ.
    assert_nothing_visible(queue, url, "in flight").await;
    let again = receive_within(queue, url, Duration::from_secs(5))
        .await
        .expect("redelivered");
    assert_eq!(again.body, "later");
    assert_eq!(again.receive_count, 2);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let _ = queue
        .receive(ReceiveRequest {
            queue_url: url,
            max: 10,
            wait: none,
        })
        .await
        .expect("receive");
    let dead = receive_within(queue, dlq_url, Duration::from_secs(5)).await;
    assert_eq!(
        dead.map(|m| m.body).as_deref(),
        Some("later"),
        "redriven to the DLQ"
    );
}

/// Nothing can be received from `url` right now.
async fn assert_nothing_visible(queue: &dyn Queue, url: &str, why: &str) {
    let got = queue
        .receive(ReceiveRequest::visible(url))
        .await
        .expect("receive");
    assert!(got.is_empty(), "{why}: got {got:?}");
}

async fn receive_within(
    queue: &dyn Queue,
    url: &str,
    within: Duration,
) -> Option<sas::ports::ReceivedMessage> {
    let until = tokio::time::Instant::now() + within;
    while tokio::time::Instant::now() < until {
        let mut got = queue
            .receive(ReceiveRequest {
                queue_url: url,
                max: 1,
                wait: Duration::from_secs(1),
            })
            .await
            .expect("receive");
        if let Some(m) = got.pop() {
            return Some(m);
        }
    }
    None
}

/// The FIFO queue contract ([`Queue::send_grouped`]). `url` must be a new FIFO queue with a
/// visibility timeout of 10 s or more (no message comes back on its own while this runs).
pub async fn fifo_queue_contract(queue: &dyn Queue, url: &str) {
    // (a) A group's messages arrive in send order, each deleted as it comes (a later one may
    // wait for an earlier one's delete).
    for end in ["a1", "a2", "a3"] {
        send_grouped(queue, url, "run-a", end, end).await;
    }
    assert_eq!(
        take(queue, url, 3).await,
        ["a1", "a2", "a3"],
        "in send order"
    );

    // (b) While a message of group A is in flight, no later message of A is delivered, and
    // group B's are.
    for end in ["a4", "a5"] {
        send_grouped(queue, url, "run-a", end, end).await;
    }
    let first = queue
        .receive(ReceiveRequest {
            queue_url: url,
            max: 1,
            wait: Duration::from_secs(1),
        })
        .await
        .expect("receive");
    assert_eq!(bodies(&first), ["a4"], "the group's first message");
    for end in ["b1", "b2"] {
        send_grouped(queue, url, "run-b", end, end).await;
    }
    assert_eq!(
        take(queue, url, 2).await,
        ["b1", "b2"],
        "another group's messages, and none of the held group's"
    );
    let held = queue
        .receive(ReceiveRequest {
            queue_url: url,
            max: 10,
            wait: Duration::from_secs(1),
        })
        .await
        .expect("receive");
    assert!(
        held.is_empty(),
        "a5 waits while a4 is in flight: got {held:?}"
    );

    // (c) Once the message in flight is deleted, its group's next one arrives.
    delete_all(queue, url, &first).await;
    assert_eq!(take(queue, url, 1).await, ["a5"], "the group goes on");

    // (d) A second send with a deduplication id sent before is dropped, whatever its body:
    // the queue compares ids.
    send_grouped(queue, url, "run-c", "c1", "c1").await;
    send_grouped(queue, url, "run-c", "c1", "c1, sent again").await;
    send_grouped(queue, url, "run-c", "c2", "c2").await;
    assert_eq!(
        take(queue, url, 2).await,
        ["c1", "c2"],
        "the duplicate is dropped"
    );
    assert_nothing_visible(queue, url, "after the duplicate").await;
}

/// Sends `dedup_id` again to `url` (a FIFO queue) after the message first sent with it was
/// received and deleted, and returns what the queue then delivers. SQS remembers the id for
/// [`sas::ports::DEDUP_WINDOW`] whether or not its message is gone: it delivers nothing.
pub async fn resend_after_delete(queue: &dyn Queue, url: &str) -> Vec<String> {
    send_grouped(queue, url, "run-d", "d1", "d1").await;
    assert_eq!(take(queue, url, 1).await, ["d1"]);
    send_grouped(queue, url, "run-d", "d1", "d1, retried late").await;
    let again = queue
        .receive(ReceiveRequest {
            queue_url: url,
            max: 10,
            wait: Duration::from_secs(1),
        })
        .await
        .expect("receive");
    delete_all(queue, url, &again).await;
    again.into_iter().map(|m| m.body).collect()
}

async fn send_grouped(queue: &dyn Queue, url: &str, group: &str, dedup_id: &str, body: &str) {
    queue
        .send_grouped(GroupedMessage {
            queue_url: url,
            group,
            dedup_id,
            body,
        })
        .await
        .expect("grouped send");
}

/// Receives from `url` until `count` messages came (or 10 s passed), deleting each batch as it
/// comes (a group's later message may wait for its earlier one's delete), and returns their
/// bodies in the order received.
async fn take(queue: &dyn Queue, url: &str, count: usize) -> Vec<String> {
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut taken = Vec::new();
    while taken.len() < count && tokio::time::Instant::now() < until {
        let got = queue
            .receive(ReceiveRequest {
                queue_url: url,
                max: 10,
                wait: Duration::from_secs(1),
            })
            .await
            .expect("receive");
        delete_all(queue, url, &got).await;
        taken.extend(got.into_iter().map(|m| m.body));
    }
    taken
}

async fn delete_all(queue: &dyn Queue, url: &str, got: &[ReceivedMessage]) {
    for m in got {
        queue.delete(url, &m.receipt_handle).await.expect("delete");
    }
}

fn bodies(got: &[ReceivedMessage]) -> Vec<&str> {
    got.iter().map(|m| m.body.as_str()).collect()
}

/// Writes `b` as the next version of its breaker, which must land and read back.
async fn put_breaker_anew(store: &dyn StateStore, b: &sas::domain::BreakerRecord, what: &str) {
    assert!(store.put_breaker(b).await.expect(what), "{what} lands");
    assert_eq!(
        store.get_breaker(&b.name).await.expect("read").as_ref(),
        Some(b),
        "{what} reads back"
    );
}

/// What [`put_breaker_anew`] wrote, as the eventually consistent read sees it in the end.
async fn peeked_in_the_end(store: &dyn StateStore, b: &sas::domain::BreakerRecord) {
    for _ in 0..100 {
        if store.peek_breaker(&b.name).await.expect("peek").as_ref() == Some(b) {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("the peek never sees {b:?}");
}

async fn breakers_move_one_version_at_a_time(store: &dyn StateStore) {
    use sas::domain::{BreakerRecord, BreakerState};
    let name = format!("svc-{}", TaskId::new_random());
    assert_eq!(store.get_breaker(&name).await.expect("read"), None);
    let closed = BreakerRecord::closed(&name);
    let p = sas::domain::BreakerPolicy::default();
    let one = closed
        .on_misconfigured(Utc::now(), "task-a", &p)
        .expect("a fault is written");
    // The tasks counted are kept.
    put_breaker_anew(store, &one, "the first write").await;
    assert!(
        !store.put_breaker(&one).await.expect("replay"),
        "a second writer from the same read loses"
    );
    let until = to_millis(Utc::now() + Span::seconds(5));
    let open = BreakerRecord {
        name: name.clone(),
        state: BreakerState::Open { until },
        version: 2,
        note: None,
        open_since: Some(until - Span::seconds(5)),
        fault_keys: vec![],
        pace: Default::default(),
    };
    put_breaker_anew(store, &open, "v2").await;
    let stale = BreakerRecord {
        version: 2,
        ..closed
    };
    assert!(!store.put_breaker(&stale).await.expect("stale"));
    let half = BreakerRecord {
        state: BreakerState::HalfOpen {
            probes_left: 0,
            until,
        },
        version: 3,
        ..open.clone()
    };
    put_breaker_anew(store, &half, "v3").await;
    // A pause keeps when and the operator's note; a resume clears both.
    let paused = half
        .pause(
            until,
            "arn:aws:iam::123456789012:user/ops: maintenance".into(),
        )
        .expect("pausable");
    put_breaker_anew(store, &paused, "v4").await;
    // The eventually consistent read is the same breaker, in the end.
    peeked_in_the_end(store, &paused).await;
    let resumed = paused.resume().expect("resumable");
    assert!(store.put_breaker(&resumed).await.expect("v5"));
    let read = store
        .get_breaker(&name)
        .await
        .expect("read")
        .expect("stored");
    assert_eq!(
        (read.state, read.note),
        (BreakerState::Closed { failures: 0 }, None)
    );
}

/// A service's pace: read with its breaker (a pace alone reads as a closed breaker never
/// moved), marked as [`sas::domain::Pace::apply`] allows, and kept by the breaker's moves.
async fn a_services_pace_moves_only_forward_beside_its_breaker(store: &dyn StateStore) {
    use sas::domain::breaker::PACE_SPELL;
    use sas::domain::{BreakerRecord, Pace, PaceMark};
    let name = format!("svc-{}", TaskId::new_random());
    let t = to_millis(Utc::now());
    let pace = || async {
        store
            .get_breaker(&name)
            .await
            .expect("read")
            .expect("a pace reads as a breaker")
    };
    let fast = PaceMark::Fast {
        until: t + PACE_SPELL,
        calm_since: t - PACE_SPELL,
    };
    assert!(store.mark_pace(&name, fast).await.expect("first mark"));
    let read = pace().await;
    assert_eq!(
        read,
        BreakerRecord {
            pace: Pace {
                fast_until: Some(t + PACE_SPELL),
                slow_at: None
            },
            ..BreakerRecord::closed(&name)
        }
    );
    assert!(
        !store.mark_pace(&name, fast).await.expect("replay"),
        "a mark ending no later is refused"
    );
    // A move of the breaker neither writes nor checks the pace.
    let moved = BreakerRecord {
        pace: Pace::default(),
        ..BreakerRecord::closed(&name)
            .on_fault(t, &sas::domain::BreakerPolicy::default())
            .expect("a fault is written")
    };
    assert!(store.put_breaker(&moved).await.expect("a move"));
    assert_eq!(pace().await.pace.fast_until, Some(t + PACE_SPELL));
    assert_eq!(pace().await.version, 1);
    let slow = PaceMark::Slow {
        at: t + Span::seconds(1),
    };
    assert!(store.mark_pace(&name, slow).await.expect("slow"));
    assert_eq!(
        pace().await.pace,
        Pace {
            fast_until: None,
            slow_at: Some(t + Span::seconds(1))
        }
    );
    assert!(
        !store
            .mark_pace(&name, PaceMark::Slow { at: t })
            .await
            .expect("an earlier slow call"),
        "the slow mark moves only forward"
    );
    let stale = PaceMark::Fast {
        until: t + PACE_SPELL * 2,
        calm_since: t,
    };
    assert!(
        !store.mark_pace(&name, stale).await.expect("stale"),
        "no fast mark within a spell of a slow call"
    );
    let calm = PaceMark::Fast {
        until: t + PACE_SPELL * 2,
        calm_since: t + Span::seconds(1),
    };
    assert!(store.mark_pace(&name, calm).await.expect("calm"));
    assert!(pace().await.pace.is_fast(t + PACE_SPELL));
}

/// `list(state, Some(workflow))` returns the records of that workflow only, each once, across
/// pages; a workflow with no records gives an empty last page.
async fn state_index_filters_by_workflow(store: &dyn StateStore) {
    let manual = manual();
    // Another far past, distinct from the other list test's instants.
    let base = Utc::now() - Span::days(500);
    let mut loans = Vec::new();
    let mut orders = Vec::new();
    for i in 0..4 {
        let at = base + Span::seconds(i);
        loans.push(
            failed_record(store, "loan-application", at, &manual)
                .await
                .task_id,
        );
        orders.push(
            failed_record(store, "ecommerce-order", at, &manual)
                .await
                .task_id,
        );
    }
    eventually!("the state index filtered by workflow", {
        let rows = every_page(store, ProcessState::Error, Some("loan-application"), 2).await?;
        for s in &rows {
            ensure!(
                s.workflow == "loan-application" && s.process_state == ProcessState::Error,
                "{s:?}"
            );
        }
        let seen: Vec<TaskId> = rows.iter().map(|s| s.task_id).collect();
        for id in &loans {
            ensure!(
                seen.iter().filter(|s| *s == id).count() == 1,
                "each loan in Error exactly once: {seen:?}"
            );
        }
        ensure!(
            orders.iter().all(|id| !seen.contains(id)),
            "no order among the loans"
        );
        // Unfiltered, both workflows show.
        let all: Vec<(TaskId, String)> = every_page(store, ProcessState::Error, None, 50)
            .await?
            .into_iter()
            .map(|s| (s.task_id, s.workflow))
            .collect();
        for (ids, name) in [(&loans, "loan-application"), (&orders, "ecommerce-order")] {
            for id in ids {
                ensure!(all.contains(&(*id, name.to_owned())), "{id} of {name}");
            }
        }
        Ok(())
    });
    let none = store
        .list(
            InState {
                state: ProcessState::Error,
                workflow: Some(&format!("no-such-workflow-{}", TaskId::new_random())),
            },
            Paging {
                limit: 10,
                after: None,
            },
        )
        .await
        .expect("list");
    assert!(none.items.is_empty(), "{none:?}");
    assert_eq!(none.next, None);
}

// ---------------------------------------------------------------------------------------------
// The catalog.
// ---------------------------------------------------------------------------------------------

/// The whole catalog contract.
pub async fn catalog_contract(catalog: Arc<dyn Catalog>) {
    versions_are_dense_and_never_change(catalog.as_ref()).await;
    kinds_are_separate(catalog.as_ref()).await;
    racing_publishers_get_distinct_versions(catalog).await;
}

fn fresh_name(prefix: &str) -> String {
    format!(
        "{prefix}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..10]
    )
}

/// Publishes `body` as `name`, which must succeed.
async fn publish(
    catalog: &dyn Catalog,
    kind: Kind,
    name: &str,
    body: &Value,
    at: chrono::DateTime<Utc>,
) -> Published {
    catalog
        .publish(Publication {
            kind,
            name,
            body,
            now: at,
        })
        .await
        .expect("publish")
}

/// One version of `name` (`None`: the newest), if there is one.
async fn version(
    catalog: &dyn Catalog,
    kind: Kind,
    name: &str,
    version: Option<u32>,
) -> Option<sas::ports::Stored> {
    let wanted = DefinitionRef {
        kind,
        name,
        version,
    };
    catalog.definition(wanted).await.expect("read")
}

/// A publication of the workflow `name`.
fn workflow_publication<'a>(
    name: &'a str,
    body: &'a Value,
    now: chrono::DateTime<Utc>,
) -> Publication<'a> {
    Publication {
        kind: Kind::Workflow,
        name,
        body,
        now,
    }
}

/// What a publish answers: the version, and whether it is new.
fn published(version: u32, created: bool) -> Published {
    Published { version, created }
}

fn definition_body(name: &str, description: &str) -> Value {
    json!({
        "name": name,
        "description": description,
        "steps": [{"name": "a", "service": "inventory", "input": {"x": "$.input.x"}}]
    })
}

async fn versions_are_dense_and_never_change(catalog: &dyn Catalog) {
    let name = fresh_name("w");
    let kind = Kind::Workflow;
    assert_eq!(version(catalog, kind, &name, None).await, None);
    assert_eq!(version(catalog, kind, &name, Some(1)).await, None);
    let t1 = to_millis(Utc::now() - Span::seconds(30));
    let v1 = definition_body(&name, "first");
    assert_eq!(
        publish(catalog, kind, &name, &v1, t1).await,
        published(1, true)
    );
    // The same definition (written with its keys in another order) is the same version.
    let reordered: Value = serde_json::from_str(&format!(
        r#"{{"steps": [{{"input": {{"x": "$.input.x"}}, "service": "inventory", "name": "a"}}], "description": "first", "name": "{name}"}}"#
    ))
    .expect("JSON");
    let t2 = to_millis(Utc::now() - Span::seconds(20));
    assert_eq!(
        publish(catalog, kind, &name, &reordered, t2).await,
        published(1, false)
    );
    let first = version(catalog, kind, &name, Some(1)).await.expect("v1");
    assert_eq!(
        (first.kind, first.name.as_str(), first.version),
        (kind, name.as_str(), 1)
    );
    assert_eq!(first.body, v1);
    assert_eq!(
        first.published_at, t1,
        "an identical publish changes nothing"
    );

    // A change is the next version; the newest is what `None` reads.
    let v2 = definition_body(&name, "second");
    assert_eq!(
        publish(catalog, kind, &name, &v2, t2).await,
        published(2, true)
    );
    let newest = version(catalog, kind, &name, None).await.expect("newest");
    assert_eq!((newest.version, &newest.body), (2, &v2));
    assert_eq!(newest.published_at, t2);
    // Going back to v1's body makes a new version: only the newest is compared.
    let t3 = to_millis(Utc::now() - Span::seconds(10));
    assert_eq!(
        publish(catalog, kind, &name, &v1, t3).await,
        published(3, true)
    );
    // A published version never changes.
    assert_eq!(
        version(catalog, kind, &name, Some(1)).await,
        Some(first.clone())
    );
    let second = version(catalog, kind, &name, Some(2)).await.expect("v2");
    assert_eq!(
        (second.version, &second.body, second.published_at),
        (2, &v2, t2)
    );
    assert_eq!(
        version(catalog, kind, &name, None)
            .await
            .map(|d| (d.version, d.body)),
        Some((3, v1.clone()))
    );
    for missing in [0, 4, u32::MAX] {
        assert_eq!(
            version(catalog, kind, &name, Some(missing)).await,
            None,
            "version {missing}"
        );
    }

    // Entries: every name once, with its newest version, by name.
    let other = fresh_name("a");
    publish(catalog, kind, &other, &definition_body(&other, "x"), t3).await;
    let entries = catalog.entries(kind).await.expect("entries");
    assert!(
        entries.windows(2).all(|w| w[0].name < w[1].name),
        "by name, each once: {entries:?}"
    );
    assert!(entries.contains(&Entry {
        name: name.clone(),
        latest: 3
    }));
    assert!(entries.contains(&Entry {
        name: other.clone(),
        latest: 1
    }));
}

async fn kinds_are_separate(catalog: &dyn Catalog) {
    let name = fresh_name("k");
    let now = to_millis(Utc::now());
    let workflow = definition_body(&name, "a workflow");
    let service = json!({"name": name, "target": {"type": "simulated"}});
    for body in [&workflow, &definition_body(&name, "again")] {
        publish(catalog, Kind::Workflow, &name, body, now).await;
    }
    assert_eq!(
        publish(catalog, Kind::Service, &name, &service, now).await,
        published(1, true),
        "a service's versions are its own"
    );
    assert_eq!(
        version(catalog, Kind::Service, &name, None)
            .await
            .map(|d| (d.kind, d.version, d.body)),
        Some((Kind::Service, 1, service))
    );
    assert_eq!(
        version(catalog, Kind::Workflow, &name, None)
            .await
            .map(|d| d.version),
        Some(2)
    );
    let services = catalog.entries(Kind::Service).await.expect("entries");
    assert!(services.contains(&Entry {
        name: name.clone(),
        latest: 1
    }));
    let workflows = catalog.entries(Kind::Workflow).await.expect("entries");
    assert!(workflows.contains(&Entry {
        name: name.clone(),
        latest: 2
    }));
}

async fn racing_publishers_get_distinct_versions(catalog: Arc<dyn Catalog>) {
    let name = fresh_name("race");
    let now = to_millis(Utc::now());
    // Different bodies at once: each gets its own version, and each version holds its body.
    let racers: Vec<_> = (0..4)
        .map(|i| {
            let (catalog, name) = (catalog.clone(), name.clone());
            let body = definition_body(&name, &format!("publisher {i}"));
            tokio::spawn(async move {
                let p = catalog
                    .publish(workflow_publication(&name, &body, now))
                    .await
                    .expect("a racing publish succeeds");
                (p, body)
            })
        })
        .collect();
    let mut got = Vec::new();
    for r in racers {
        got.push(r.await.expect("task"));
    }
    let mut versions: Vec<u32> = got.iter().map(|(p, _)| p.version).collect();
    versions.sort_unstable();
    assert_eq!(versions, [1, 2, 3, 4], "distinct, dense versions: {got:?}");
    assert!(got.iter().all(|(p, _)| p.created));
    for (p, body) in &got {
        let stored = catalog
            .definition(DefinitionRef::at(Kind::Workflow, &name, p.version))
            .await
            .expect("read")
            .expect("stored");
        assert_eq!(
            &stored.body, body,
            "version {} holds its publisher's body",
            p.version
        );
    }
    // The same new body at once: one version, created once.
    let same = definition_body(&name, "everyone");
    let racers: Vec<_> = (0..4)
        .map(|_| {
            let (catalog, name, body) = (catalog.clone(), name.clone(), same.clone());
            tokio::spawn(async move {
                catalog
                    .publish(workflow_publication(&name, &body, now))
                    .await
                    .expect("a racing publish succeeds")
            })
        })
        .collect();
    let mut same_got = Vec::new();
    for r in racers {
        same_got.push(r.await.expect("task"));
    }
    assert!(
        same_got.iter().all(|p| p.version == 5),
        "one version for one body: {same_got:?}"
    );
    assert_eq!(
        same_got.iter().filter(|p| p.created).count(),
        1,
        "{same_got:?}"
    );
    let entries = catalog.entries(Kind::Workflow).await.expect("entries");
    assert!(entries.contains(&Entry { name, latest: 5 }));
}
