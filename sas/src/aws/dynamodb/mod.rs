//! The state store and the catalog on DynamoDB: one table.
//!
//! | item            | `pk`               | `sk`          | written by                        |
//! |-----------------|--------------------|---------------|-----------------------------------|
//! | task            | `TASK#<id>`        | `TASK`        | submission (transaction)          |
//! | state record    | `TASK#<id>`        | `STATE`       | submission, scheduler, supervisor |
//! | idempotency key | `IDEM#<caller>#<key>` | `IDEM`     | submission (transaction)          |
//! | lease           | `LEASE#<name>`     | `LEASE`       | supervisor                        |
//! | breaker         | `BREAKER#<name>`   | `BREAKER`     | agents                            |
//! | rate limit      | `RATE#<caller>`    | `RATE`        | submission (task API)             |
//! | definition      | `<KIND>#<name>`    | `V#<version>` | operator API (transaction)        |
//! | catalog         | `CATALOG#<KIND>`   | `CATALOG`     | operator API (transaction)        |
//!
//! `<KIND>` is `WORKFLOW` or `SERVICE`. A definition version is written once
//! (`attribute_not_exists`) and never changed; the catalog item maps each name to its newest
//! version and that version's canonical text.
//!
//! The sparse GSI `due-index` (`DueShard` S, `DueAt` N, keys only) holds exactly the state
//! records with a `DueAt`: non-terminal ones, and terminal ones that still owe a notice.
//! The GSI `caller-shard-index` (`CallerShard` S, `CreatedAt` N, keys only) holds the task
//! items (the only items with a `CallerShard`: the caller's digest and a shard of the task id,
//! [`Caller::index_key`]): a caller's tasks, newest first, merged from its shards. A task item
//! is written once, so the index costs one write per task. `<caller>` in an idempotency key is the SHA-256 of
//! the caller id ([`crate::domain::Caller::digest`]): keys are scoped by caller.

use crate::domain::state::due_shard;
use crate::domain::{
    BreakerRecord, BreakerState, Caller, Condition, Guard, HistoryEntry, ProcessState, StateRecord,
    StepState, Task, TaskId,
};
use crate::ports::{
    Catalog, Count, CreateOutcome, Cursor, DueEntry, Entry, IdempotencyRecord, Kind, Page,
    Published, StateStore, StoreError, Stored, Summary, canonical,
};
use async_trait::async_trait;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::operation::put_item::builders::PutItemFluentBuilder;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{
    AttributeValue, Put, ReturnValuesOnConditionCheckFailure, TransactWriteItem,
};
use chrono::{DateTime, Utc};
use std::collections::HashMap;

/// The name of the sparse GSI the supervisor queries.
pub const DUE_INDEX: &str = "due-index";
/// The name of the GSI the operator's list queries (`StateShard` S, `UpdatedAt` N).
pub const STATE_INDEX: &str = "state-index";
/// The attributes `state-index` projects besides its keys: the task's id (for the page's
/// summaries, read from the records) and its workflow (the list's filter). Neither changes in a
/// task's life, and the index's sort key `StateSince` changes only with the state: a write
/// within a state costs the index nothing.
pub const STATE_INDEX_PROJECTION: [&str; 2] = ["TaskId", "Workflow"];
/// The attributes of a state record a [`Summary`] is made of.
const SUMMARY_ATTRIBUTES: [&str; 9] = [
    "TaskId",
    "Workflow",
    "ProcessState",
    "CurrentStep",
    "FailureCount",
    "Attempt",
    "LastError",
    "UpdatedAt",
    "StateSince",
];
/// The name of the GSI a caller's list queries (`CallerShard` S, `CreatedAt` N, keys only).
pub const CALLER_INDEX: &str = "caller-shard-index";
/// How long an idempotency key is kept (the table's TTL attribute `ExpiresAt` deletes it).
const KEY_TTL_SECONDS: i64 = 24 * 3600;

type Item = HashMap<String, AttributeValue>;

#[derive(Debug, Clone)]
pub struct DynamoStore {
    client: Client,
    table: String,
    shards: u32,
    /// How long a final task is kept (`None`: for good).
    retention: Option<chrono::Duration>,
    /// How many partitions of `caller-shard-index` a caller's tasks spread over.
    caller_shards: u32,
}

/// Partitions of a caller's tasks in `caller-shard-index`, unless set otherwise: a caller
/// submitting 1,000 tasks a second writes 250 a second to each (a quarter of a partition's
/// limit), and its list reads four partitions.
pub const DEFAULT_CALLER_SHARDS: u32 = 4;

impl DynamoStore {
    pub fn new(client: Client, table: impl Into<String>, shards: u32) -> Self {
        Self {
            client,
            table: table.into(),
            shards: shards.max(1),
            retention: None,
            caller_shards: DEFAULT_CALLER_SHARDS,
        }
    }

    /// How many partitions of `caller-shard-index` a caller's tasks spread over. Raise it, never
    /// lower it: a list reads partitions `0..n`, so tasks filed under a higher one would drop
    /// out of their caller's list.
    pub fn with_caller_shards(mut self, shards: u32) -> Self {
        self.caller_shards = shards.max(1);
        self
    }

    /// Final tasks expire this long after they got there (`None`: never).
    pub fn with_retention(mut self, retention: Option<chrono::Duration>) -> Self {
        self.retention = retention;
        self
    }

    /// When a record's items expire: its last write plus the retention, for a final record.
    fn expiry(&self, r: &StateRecord) -> Option<i64> {
        let keep = self.retention?;
        r.process_state
            .is_final()
            .then(|| (r.updated_at + keep).timestamp())
    }
}

fn task_pk(id: &TaskId) -> String {
    format!("TASK#{id}")
}

fn s(v: impl Into<String>) -> AttributeValue {
    AttributeValue::S(v.into())
}

fn n(v: impl ToString) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

fn ms(t: DateTime<Utc>) -> AttributeValue {
    n(t.timestamp_millis())
}

fn corrupt(what: impl Into<String>) -> StoreError {
    StoreError::Corrupt(what.into())
}

fn get_s<'a>(item: &'a Item, k: &str) -> Result<&'a str, StoreError> {
    match item.get(k) {
        Some(AttributeValue::S(v)) => Ok(v),
        _ => Err(corrupt(format!("{k} missing or not a string"))),
    }
}

fn opt_s(item: &Item, k: &str) -> Option<String> {
    match item.get(k) {
        Some(AttributeValue::S(v)) => Some(v.clone()),
        _ => None,
    }
}

fn get_n<T: std::str::FromStr>(item: &Item, k: &str) -> Result<T, StoreError> {
    match item.get(k) {
        Some(AttributeValue::N(v)) => v
            .parse()
            .map_err(|_| corrupt(format!("{k} is not a valid number"))),
        _ => Err(corrupt(format!("{k} missing or not a number"))),
    }
}

fn opt_n<T: std::str::FromStr>(item: &Item, k: &str) -> Result<Option<T>, StoreError> {
    if item.contains_key(k) {
        get_n(item, k).map(Some)
    } else {
        Ok(None)
    }
}

fn time(millis: i64) -> Result<DateTime<Utc>, StoreError> {
    DateTime::from_timestamp_millis(millis).ok_or_else(|| corrupt("timestamp out of range"))
}

fn task_item(t: &Task, caller_shards: u32) -> Item {
    let mut item = HashMap::from([
        ("pk".to_owned(), s(task_pk(&t.id))),
        ("sk".to_owned(), s("TASK")),
        ("TaskId".to_owned(), s(t.id.to_string())),
        ("Workflow".to_owned(), s(&t.workflow)),
        ("WorkflowVersion".to_owned(), n(t.workflow_version)),
        ("Input".to_owned(), s(t.input.to_string())),
        ("CreatedAt".to_owned(), ms(t.created_at)),
        ("Caller".to_owned(), s(t.caller.as_str())),
        (
            "CallerShard".to_owned(),
            s(t.caller.index_key(due_shard(&t.id, caller_shards))),
        ),
    ]);
    if let Some(u) = &t.reply_queue_url {
        item.insert("ReplyQueueUrl".to_owned(), s(u));
    }
    if t.input_revision > 0 {
        item.insert("InputRevision".to_owned(), n(t.input_revision));
    }
    if !t.earlier_inputs.is_empty() {
        item.insert("EarlierInputs".to_owned(), s(earlier_inputs(t)));
    }
    item
}

/// A task's earlier inputs as stored (`EarlierInputs`, a JSON array).
fn earlier_inputs(t: &Task) -> String {
    serde_json::to_string(&t.earlier_inputs).unwrap_or_else(|_| "[]".into())
}

fn parse_task(item: &Item) -> Result<Task, StoreError> {
    Ok(Task {
        id: get_s(item, "TaskId")?
            .parse()
            .map_err(|e: crate::domain::ValidationError| corrupt(e.to_string()))?,
        workflow: get_s(item, "Workflow")?.to_owned(),
        workflow_version: get_n(item, "WorkflowVersion")?,
        input: serde_json::from_str(get_s(item, "Input")?)
            .map_err(|e| corrupt(format!("Input is not JSON: {e}")))?,
        input_revision: opt_n(item, "InputRevision")?.unwrap_or(0),
        earlier_inputs: match opt_s(item, "EarlierInputs") {
            Some(json) => serde_json::from_str(&json)
                .map_err(|e| corrupt(format!("EarlierInputs is not a list of inputs: {e}")))?,
            None => vec![],
        },
        reply_queue_url: opt_s(item, "ReplyQueueUrl"),
        created_at: time(get_n(item, "CreatedAt")?)?,
        // Tasks stored before callers were recorded belong to the anonymous caller.
        caller: match opt_s(item, "Caller") {
            Some(c) => Caller::new(c).map_err(|e| corrupt(format!("Caller: {e}")))?,
            None => Caller::anonymous(),
        },
    })
}

/// A record's steps and history, stored together deflated (`Body`, binary): they are most of
/// its size (a map per step with its kept result, a line per transition up to
/// [`MAX_HISTORY`]) and mostly repeated names and words, and every write bills the whole item
/// by the KB. No condition reads inside them. Written as lists of maps (`Steps`, `History`,
/// the layout before `Body`, still read) only if deflating fails.
///
/// [`MAX_HISTORY`]: crate::domain::state::MAX_HISTORY
#[derive(serde::Serialize)]
struct Body<'a> {
    steps: &'a [StepState],
    history: &'a [HistoryEntry],
}

#[derive(serde::Deserialize)]
struct OwnedBody {
    steps: Vec<StepState>,
    history: Vec<HistoryEntry>,
}

fn pack_body(r: &StateRecord) -> Option<Vec<u8>> {
    use std::io::Write;
    let json = serde_json::to_vec(&Body {
        steps: &r.steps,
        history: &r.history,
    })
    .ok()?;
    let mut z = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::best());
    z.write_all(&json).ok()?;
    z.finish().ok()
}

/// The most bytes a stored body may inflate to: far above what a record holds, so a corrupt
/// or hostile blob cannot exhaust memory.
const MAX_BODY_BYTES: u64 = 4 << 20;

fn unpack_body(bytes: &[u8]) -> Result<OwnedBody, StoreError> {
    use std::io::Read;
    let mut json = Vec::new();
    flate2::read::DeflateDecoder::new(bytes)
        .take(MAX_BODY_BYTES + 1)
        .read_to_end(&mut json)
        .map_err(|e| corrupt(format!("Body does not inflate: {e}")))?;
    if json.len() as u64 > MAX_BODY_BYTES {
        return Err(corrupt("Body inflates past its limit"));
    }
    serde_json::from_slice(&json)
        .map_err(|e| corrupt(format!("Body is not steps and history: {e}")))
}

fn history_list(r: &StateRecord) -> AttributeValue {
    let history = r
        .history
        .iter()
        .map(|h| {
            let mut m = HashMap::from([
                ("At".to_owned(), ms(h.at)),
                ("From".to_owned(), s(h.from.as_str())),
                ("To".to_owned(), s(h.to.as_str())),
                ("Attempt".to_owned(), n(h.attempt)),
                ("Reason".to_owned(), s(&h.reason)),
            ]);
            if let Some(st) = &h.step {
                m.insert("Step".to_owned(), s(st));
            }
            if let Some(by) = &h.by {
                m.insert("By".to_owned(), s(by));
            }
            AttributeValue::M(m)
        })
        .collect();
    AttributeValue::L(history)
}

fn steps_list(r: &StateRecord) -> AttributeValue {
    let steps = r
        .steps
        .iter()
        .map(|st| {
            let mut m = HashMap::from([
                ("Name".to_owned(), s(&st.name)),
                ("Status".to_owned(), s(st.status.as_str())),
            ]);
            if st.undoable {
                m.insert("Undoable".to_owned(), AttributeValue::Bool(true));
            }
            if let Some(a) = st.finished_attempt {
                m.insert("FinishedAttempt".to_owned(), n(a));
            }
            if let Some(t) = st.finished_at {
                m.insert("FinishedAt".to_owned(), ms(t));
            }
            if st.sent {
                m.insert("Sent".to_owned(), AttributeValue::Bool(true));
            }
            if st.generation > 0 {
                m.insert("Generation".to_owned(), n(st.generation));
            }
            if let Some(r) = &st.result {
                m.insert("Result".to_owned(), s(r));
            }
            if let Some(u) = st.undo {
                m.insert("Undo".to_owned(), s(u.as_str()));
            }
            if st.undo_generation > 0 {
                m.insert("UndoGeneration".to_owned(), n(st.undo_generation));
            }
            if let Some(t) = st.waiting_until {
                m.insert("WaitingUntil".to_owned(), ms(t));
            }
            if let Some(t) = st.sent_until {
                m.insert("SentUntil".to_owned(), ms(t));
            }
            if let Some(r) = st.input_revision {
                m.insert("InputRevision".to_owned(), n(r));
            }
            if st.misconfigured > 0 {
                m.insert("Misconfigured".to_owned(), n(st.misconfigured));
            }
            AttributeValue::M(m)
        })
        .collect();
    AttributeValue::L(steps)
}

fn state_item(r: &StateRecord, shards: u32) -> Item {
    let mut item = HashMap::from([
        ("pk".to_owned(), s(task_pk(&r.task_id))),
        ("sk".to_owned(), s("STATE")),
        ("TaskId".to_owned(), s(r.task_id.to_string())),
        ("Workflow".to_owned(), s(&r.workflow)),
        ("WorkflowVersion".to_owned(), n(r.workflow_version)),
        ("ProcessState".to_owned(), s(r.process_state.as_str())),
        ("FailureCount".to_owned(), n(r.failure_count)),
        ("Round".to_owned(), n(r.round)),
        ("Attempt".to_owned(), n(r.attempt)),
        ("StepIndex".to_owned(), n(r.step_index)),
        (
            "Outbox".to_owned(),
            AttributeValue::L(r.outbox.iter().map(|o| s(o.encode())).collect()),
        ),
        // The state index: every record, by state, newest first (the operator's list).
        (
            "StateShard".to_owned(),
            s(state_shard_key(
                r.process_state,
                due_shard(&r.task_id, shards),
            )),
        ),
        ("Version".to_owned(), n(r.version)),
        ("CreatedAt".to_owned(), ms(r.created_at)),
        ("UpdatedAt".to_owned(), ms(r.updated_at)),
        // The state index's sort key: changes with the state only.
        ("StateSince".to_owned(), ms(r.since)),
    ]);
    match pack_body(r) {
        Some(z) => {
            item.insert(
                "Body".to_owned(),
                AttributeValue::B(aws_sdk_dynamodb::primitives::Blob::new(z)),
            );
        }
        None => {
            item.insert("Steps".to_owned(), steps_list(r));
            item.insert("History".to_owned(), history_list(r));
        }
    }
    // Absent, not null: `attribute_not_exists(LockedBy)` is the "unlocked" test.
    if let Some(l) = &r.locked_by {
        item.insert("LockedBy".to_owned(), s(l));
    }
    if let Some(t) = r.complete_by {
        item.insert("CompleteBy".to_owned(), ms(t));
    }
    if let Some(e) = &r.last_error {
        item.insert("LastError".to_owned(), s(e));
    }
    if let Some(f) = &r.refusal {
        item.insert(
            "Refusal".to_owned(),
            AttributeValue::M(HashMap::from([
                ("Step".to_owned(), s(&f.step)),
                ("Code".to_owned(), s(&f.code)),
                ("Message".to_owned(), s(&f.message)),
            ])),
        );
    }
    if let Some(t) = r.undo_after {
        item.insert("UndoAfter".to_owned(), ms(t));
    }
    if r.deferrals > 0 {
        item.insert("Deferrals".to_owned(), n(r.deferrals));
    }
    if r.requeues > 0 {
        item.insert("Requeues".to_owned(), n(r.requeues));
    }
    if !r.callback_key.is_empty() {
        item.insert("CallbackKey".to_owned(), s(&r.callback_key));
    }
    if let Some(u) = &r.reply_queue_url {
        item.insert("ReplyQueueUrl".to_owned(), s(u));
    }
    if let Some(st) = r.current_step() {
        item.insert("CurrentStep".to_owned(), s(st));
    }
    if let Some(p) = r.pivot {
        item.insert("Pivot".to_owned(), n(p));
    }
    // The sparse index: only records the supervisor must look at carry its keys.
    if let Some(due) = r.due_key {
        item.insert(
            "DueShard".to_owned(),
            s(shard_key(due_shard(&r.task_id, shards))),
        );
        item.insert("DueAt".to_owned(), ms(due));
    }
    item
}

fn shard_key(shard: u32) -> String {
    format!("due#{shard}")
}

/// The state index's partition key: a state and a shard, so that no state's records all land on
/// one GSI partition (every task passes through Processing).
fn state_shard_key(state: ProcessState, shard: u32) -> String {
    format!("{state}#{shard}")
}

/// An item's size as DynamoDB counts it for capacity units: attribute names plus values
/// (strings in UTF-8 bytes, numbers about one byte per two significant digits plus one, 1 byte
/// for booleans, 3 bytes of overhead per list or map plus their elements). For the bench's
/// write units (feature `testkit`).
#[cfg(any(test, feature = "testkit"))]
pub fn item_size(item: &Item) -> usize {
    fn value(v: &AttributeValue) -> usize {
        match v {
            AttributeValue::S(s) => s.len(),
            AttributeValue::N(n) => {
                let digits = n.trim_start_matches('-').replace('.', "");
                let significant = digits.trim_start_matches('0').trim_end_matches('0').len();
                significant.div_ceil(2) + 1
            }
            AttributeValue::Bool(_) | AttributeValue::Null(_) => 1,
            AttributeValue::B(b) => b.as_ref().len(),
            AttributeValue::L(l) => 3 + l.iter().map(|e| 1 + value(e)).sum::<usize>(),
            AttributeValue::M(m) => {
                3 + m.iter().map(|(k, e)| 1 + k.len() + value(e)).sum::<usize>()
            }
            _ => 0,
        }
    }
    item.iter().map(|(k, v)| k.len() + value(v)).sum()
}

/// The stored size of a state record (see [`item_size`]).
#[cfg(any(test, feature = "testkit"))]
pub fn state_record_size(record: &StateRecord, shards: u32) -> usize {
    item_size(&state_item(record, shards))
}

/// The stored size of a state record and of its task item (see [`item_size`]).
#[cfg(any(test, feature = "testkit"))]
pub fn stored_sizes(task: &Task, record: &StateRecord, shards: u32) -> (usize, usize) {
    (
        item_size(&task_item(task, DEFAULT_CALLER_SHARDS)),
        item_size(&state_item(record, shards)),
    )
}

/// The size of a state record's entries in `due-index` and `state-index` (keys and projected
/// attributes), `None` where the record is not in that index.
#[cfg(any(test, feature = "testkit"))]
pub fn index_entry_sizes(record: &StateRecord, shards: u32) -> (Option<usize>, usize) {
    let item = state_item(record, shards);
    let pick = |names: &[&str]| -> usize {
        names
            .iter()
            .filter_map(|n| item.get(*n).map(|v| (n, v)))
            .map(|(n, v)| item_size(&HashMap::from([(n.to_string(), v.clone())])))
            .sum()
    };
    let due = item
        .contains_key("DueAt")
        .then(|| pick(&["pk", "sk", "DueShard", "DueAt"]));
    let mut state_names = vec!["pk", "sk", "StateShard", "StateSince"];
    state_names.extend(STATE_INDEX_PROJECTION);
    (due, pick(&state_names))
}

fn parse_state(item: &Item) -> Result<StateRecord, StoreError> {
    let version: u64 = get_n(item, "Version")?;
    if let Some(body) = item.get("Body") {
        let AttributeValue::B(z) = body else {
            return Err(corrupt("Body is not binary"));
        };
        let body = unpack_body(z.as_ref())?;
        return record_of(item, version, body.steps, body.history);
    }
    let steps = match item.get("Steps") {
        Some(AttributeValue::L(l)) => l
            .iter()
            .map(|v| match v {
                AttributeValue::M(m) => Ok(StepState {
                    name: get_s(m, "Name")?.to_owned(),
                    status: get_s(m, "Status")?.parse().map_err(corrupt)?,
                    undoable: matches!(m.get("Undoable"), Some(AttributeValue::Bool(true))),
                    finished_attempt: opt_n(m, "FinishedAttempt")?,
                    finished_at: opt_n(m, "FinishedAt")?.map(time).transpose()?,
                    sent: matches!(m.get("Sent"), Some(AttributeValue::Bool(true))),
                    generation: opt_n(m, "Generation")?.unwrap_or(0),
                    result: opt_s(m, "Result"),
                    undo: opt_s(m, "Undo")
                        .map(|u| u.parse())
                        .transpose()
                        .map_err(corrupt)?,
                    undo_generation: opt_n(m, "UndoGeneration")?.unwrap_or(0),
                    waiting_until: opt_n(m, "WaitingUntil")?.map(time).transpose()?,
                    sent_until: opt_n(m, "SentUntil")?.map(time).transpose()?,
                    input_revision: opt_n(m, "InputRevision")?,
                    misconfigured: opt_n(m, "Misconfigured")?.unwrap_or(0),
                }),
                _ => Err(corrupt("Steps holds a non-map")),
            })
            .collect::<Result<Vec<_>, _>>()?,
        _ => return Err(corrupt("Steps missing")),
    };
    let history = match item.get("History") {
        Some(AttributeValue::L(l)) => l
            .iter()
            .map(|v| match v {
                AttributeValue::M(m) => Ok(HistoryEntry {
                    at: time(get_n(m, "At")?)?,
                    from: get_s(m, "From")?.parse().map_err(corrupt)?,
                    to: get_s(m, "To")?.parse().map_err(corrupt)?,
                    step: opt_s(m, "Step"),
                    attempt: get_n(m, "Attempt")?,
                    reason: get_s(m, "Reason")?.to_owned(),
                    by: opt_s(m, "By"),
                }),
                _ => Err(corrupt("History holds a non-map")),
            })
            .collect::<Result<Vec<_>, _>>()?,
        None => vec![],
        _ => return Err(corrupt("History is not a list")),
    };
    record_of(item, version, steps, history)
}

/// The record of a state item whose steps and history were read.
fn record_of(
    item: &Item,
    version: u64,
    steps: Vec<StepState>,
    history: Vec<HistoryEntry>,
) -> Result<StateRecord, StoreError> {
    let outbox = match item.get("Outbox") {
        Some(AttributeValue::L(l)) => l
            .iter()
            .map(|v| match v {
                AttributeValue::S(st) => {
                    crate::domain::state::Owed::decode(st, version).map_err(corrupt)
                }
                _ => Err(corrupt("Outbox holds a non-string")),
            })
            .collect::<Result<Vec<_>, _>>()?,
        None => vec![],
        _ => return Err(corrupt("Outbox is not a list")),
    };
    Ok(StateRecord {
        task_id: get_s(item, "TaskId")?
            .parse()
            .map_err(|e: crate::domain::ValidationError| corrupt(e.to_string()))?,
        workflow: get_s(item, "Workflow")?.to_owned(),
        workflow_version: get_n(item, "WorkflowVersion")?,
        pivot: opt_n(item, "Pivot")?,
        process_state: get_s(item, "ProcessState")?.parse().map_err(corrupt)?,
        locked_by: opt_s(item, "LockedBy"),
        complete_by: opt_n(item, "CompleteBy")?.map(time).transpose()?,
        failure_count: get_n(item, "FailureCount")?,
        round: opt_n(item, "Round")?.unwrap_or(0),
        deferrals: opt_n(item, "Deferrals")?.unwrap_or(0),
        requeues: opt_n(item, "Requeues")?.unwrap_or(0),
        attempt: get_n(item, "Attempt")?,
        step_index: get_n(item, "StepIndex")?,
        steps,
        last_error: opt_s(item, "LastError"),
        refusal: match item.get("Refusal") {
            Some(AttributeValue::M(m)) => Some(crate::domain::state::Refusal {
                step: get_s(m, "Step")?.to_owned(),
                code: get_s(m, "Code")?.to_owned(),
                message: get_s(m, "Message")?.to_owned(),
            }),
            None => None,
            _ => return Err(corrupt("Refusal is not a map")),
        },
        undo_after: opt_n(item, "UndoAfter")?.map(time).transpose()?,
        callback_key: opt_s(item, "CallbackKey").unwrap_or_default(),
        outbox,
        reply_queue_url: opt_s(item, "ReplyQueueUrl"),
        history,
        version,
        created_at: time(get_n(item, "CreatedAt")?)?,
        updated_at: time(get_n(item, "UpdatedAt")?)?,
        since: since(item)?,
        due_key: opt_n::<i64>(item, "DueAt")?.map(time).transpose()?,
    })
}

/// When the record entered its state (`StateSince`; a record written before it was stored:
/// its last write).
fn since(item: &Item) -> Result<DateTime<Utc>, StoreError> {
    match opt_n::<i64>(item, "StateSince")? {
        Some(ms) => time(ms),
        None => time(get_n(item, "UpdatedAt")?),
    }
}

/// A condition expression with its names and values.
#[derive(Debug, Default)]
struct Expr {
    clauses: Vec<String>,
    names: HashMap<String, String>,
    values: HashMap<String, AttributeValue>,
}

impl Expr {
    fn name(&mut self, attr: &str) -> String {
        let placeholder = format!("#{attr}");
        self.names.insert(placeholder.clone(), attr.to_owned());
        placeholder
    }
    fn value(&mut self, v: AttributeValue) -> String {
        let placeholder = format!(":v{}", self.values.len());
        self.values.insert(placeholder.clone(), v);
        placeholder
    }
    fn cmp(&mut self, attr: &str, op: &str, v: AttributeValue) {
        let (k, v) = (self.name(attr), self.value(v));
        self.clauses.push(format!("{k} {op} {v}"));
    }
}

/// Translates a domain [`Condition`] to a DynamoDB condition expression: the same guards the
/// in-memory store checks with [`Condition::holds`].
fn condition_expr(c: &Condition) -> Expr {
    let mut e = Expr::default();
    match c {
        Condition::Absent => {
            let pk = e.name("pk");
            e.clauses.push(format!("attribute_not_exists({pk})"));
        }
        Condition::Matches { version, guards } => {
            e.cmp("Version", "=", n(version));
            for g in guards {
                match g {
                    Guard::StateIs(st) => e.cmp("ProcessState", "=", s(st.as_str())),
                    Guard::Unlocked => {
                        let k = e.name("LockedBy");
                        e.clauses.push(format!("attribute_not_exists({k})"));
                    }
                    Guard::AttemptIs(a) => e.cmp("Attempt", "=", n(a)),
                    Guard::StepIndexIs(i) => e.cmp("StepIndex", "=", n(i)),
                    Guard::CompleteByIs(t) => e.cmp("CompleteBy", "=", ms(*t)),
                    Guard::CompleteByAtOrBefore(t) => e.cmp("CompleteBy", "<=", ms(*t)),
                    Guard::NoticePending => {
                        let k = e.name("Outbox");
                        let v = e.value(n(0));
                        e.clauses.push(format!("size({k}) > {v}"));
                    }
                }
            }
        }
    }
    e
}

/// The error codes of DynamoDB answers that no retry changes: the request is malformed (an
/// item over 400 KB, a bad expression), the role may not make it, the table or index does not
/// exist, or the credentials are not valid. Throttling, 5xx, transaction conflicts and network
/// errors stay retryable.
pub const NON_RETRYABLE: [&str; 7] = [
    "ValidationException",
    "AccessDeniedException",
    "ResourceNotFoundException",
    "SerializationException",
    "UnrecognizedClientException",
    "MissingAuthenticationTokenException",
    "ItemCollectionSizeLimitExceededException",
];

/// A failed call as a [`StoreError`]: [`StoreError::Rejected`] if DynamoDB's answer can never
/// change ([`NON_RETRYABLE`]), else [`StoreError::Unavailable`].
fn unavailable<E, R>(e: &aws_sdk_dynamodb::error::SdkError<E, R>) -> StoreError
where
    E: std::error::Error + aws_sdk_dynamodb::error::ProvideErrorMetadata + 'static,
    R: std::fmt::Debug,
{
    let code = e.as_service_error().and_then(|se| se.code());
    match code {
        Some(c) if NON_RETRYABLE.contains(&c) => {
            StoreError::Rejected(format!("{c}: {}", super::describe(e)))
        }
        _ => StoreError::Unavailable(super::describe(e)),
    }
}

fn build_err(e: aws_sdk_dynamodb::error::BuildError) -> StoreError {
    StoreError::Unavailable(format!("request build: {e}"))
}

impl DynamoStore {
    /// A `Put` that must create its item (returning the item found on a conditional failure).
    fn create_put(&self, item: Item) -> Result<TransactWriteItem, StoreError> {
        let put = Put::builder()
            .table_name(&self.table)
            .set_item(Some(item))
            .condition_expression("attribute_not_exists(pk)")
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .build()
            .map_err(build_err)?;
        Ok(TransactWriteItem::builder().put(put).build())
    }

    /// A strongly consistent `GetItem` of (`pk`, `sk`).
    async fn read_item(&self, pk: String, sk: &str) -> Result<Option<Item>, StoreError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .key("pk", s(pk))
            .key("sk", s(sk))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| unavailable(&e))?;
        Ok(out.item().cloned())
    }

    /// Sends a conditional `PutItem`: `true` if it was written, `false` if its condition failed.
    async fn put_if(req: PutItemFluentBuilder) -> Result<bool, StoreError> {
        match req.send().await {
            Ok(_) => Ok(true),
            Err(e)
                if e.as_service_error()
                    .is_some_and(|se| se.is_conditional_check_failed_exception()) =>
            {
                Ok(false)
            }
            Err(e) => Err(unavailable(&e)),
        }
    }

    async fn read_key(&self, key: &str) -> Result<Option<IdempotencyRecord>, StoreError> {
        let Some(item) = self.read_item(format!("IDEM#{key}"), "IDEM").await? else {
            return Ok(None);
        };
        let item = &item;
        Ok(Some(IdempotencyRecord {
            key: key.to_owned(),
            request_hash: get_s(item, "RequestHash")?.to_owned(),
            task_id: get_s(item, "TaskId")?
                .parse()
                .map_err(|e: crate::domain::ValidationError| corrupt(e.to_string()))?,
            created_at: time(get_n(item, "CreatedAt")?)?,
        }))
    }
}

#[async_trait]
impl StateStore for DynamoStore {
    async fn create(
        &self,
        task: &Task,
        record: &StateRecord,
        key: Option<&IdempotencyRecord>,
    ) -> Result<CreateOutcome, StoreError> {
        // One transaction, every item `attribute_not_exists(pk)`: keeps "a task exists iff its
        // state record exists" and "an idempotency key names exactly one task".
        let mut writes = Vec::with_capacity(3);
        if let Some(k) = key {
            writes.push(self.create_put(HashMap::from([
                ("pk".to_owned(), s(format!("IDEM#{}", k.key))),
                ("sk".to_owned(), s("IDEM")),
                ("RequestHash".to_owned(), s(&k.request_hash)),
                ("TaskId".to_owned(), s(k.task_id.to_string())),
                ("CreatedAt".to_owned(), ms(k.created_at)),
                (
                    "ExpiresAt".to_owned(),
                    n(k.created_at.timestamp() + KEY_TTL_SECONDS),
                ),
            ]))?);
        }
        writes.push(self.create_put(task_item(task, self.caller_shards))?);
        let state = state_item(record, self.shards);
        writes.push(self.create_put(state.clone())?);
        let result = self
            .client
            .transact_write_items()
            .set_transact_items(Some(writes))
            // The task id is new for every submission and the same for the SDK's retries of
            // this one: DynamoDB answers a retry of a committed transaction with success (for
            // ten minutes) instead of a conflict. (Not the idempotency key: a client's retry
            // under the same key makes new items, which DynamoDB would refuse as an
            // IdempotentParameterMismatch; the key item already covers client retries.)
            .client_request_token(task.id.to_string())
            .send()
            .await;
        let err = match result {
            Ok(_) => return Ok(CreateOutcome::Created),
            Err(e) => e,
        };
        // The token (the task id) was used, within ten minutes, by a transaction with other
        // items: another request made this task id, so it exists and is not this request's.
        if matches!(
            err.as_service_error(),
            Some(TransactWriteItemsError::IdempotentParameterMismatchException(_))
        ) {
            return Err(StoreError::ConditionFailed);
        }
        let canceled = err.as_service_error().and_then(|se| match se {
            TransactWriteItemsError::TransactionCanceledException(tc) => Some(tc),
            _ => None,
        });
        // The read-back, where no token helps (past its ten minutes, or on an emulator that
        // ignores it): the state record already is the one this request made (it holds this
        // request's random task id, callback key and times), so this request created it.
        if canceled
            .and_then(|tc| tc.cancellation_reasons().last())
            .and_then(|r| r.item())
            == Some(&state)
        {
            return Ok(CreateOutcome::Created);
        }
        let key_taken = canceled.map(|tc| {
            let reasons = tc.cancellation_reasons();
            (
                key.is_some()
                    && reasons.first().and_then(|r| r.code()) == Some("ConditionalCheckFailed"),
                reasons
                    .iter()
                    .any(|r| r.code() == Some("ConditionalCheckFailed")),
            )
        });
        match (key, key_taken) {
            (Some(k), Some((true, _))) => match self.read_key(&k.key).await? {
                Some(first) => Ok(CreateOutcome::KeyExists(first)),
                None => Err(StoreError::Unavailable(
                    "idempotency key vanished after a conflict".into(),
                )),
            },
            (_, Some((false, true))) => Err(StoreError::ConditionFailed),
            _ => Err(unavailable(&err)),
        }
    }

    async fn get(&self, id: TaskId) -> Result<Option<(Task, StateRecord)>, StoreError> {
        let out = self
            .client
            .query()
            .table_name(&self.table)
            .key_condition_expression("pk = :pk")
            .expression_attribute_values(":pk", s(task_pk(&id)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| unavailable(&e))?;
        let mut task = None;
        let mut state = None;
        for item in out.items() {
            match get_s(item, "sk")? {
                "TASK" => task = Some(parse_task(item)?),
                "STATE" => state = Some(parse_state(item)?),
                _ => {}
            }
        }
        Ok(task.zip(state))
    }

    async fn get_state(&self, id: TaskId) -> Result<Option<StateRecord>, StoreError> {
        self.read_item(task_pk(&id), "STATE")
            .await?
            .as_ref()
            .map(parse_state)
            .transpose()
    }

    async fn put_as(
        &self,
        record: &StateRecord,
        condition: &Condition,
        write: u64,
    ) -> Result<(), StoreError> {
        let e = condition_expr(condition);
        let mut item = state_item(record, self.shards);
        // The request's id, so the read-back below tells this request's write (its own retry)
        // from a rival's identical one.
        item.insert("WriteId".to_owned(), s(format!("{write:016x}")));
        // A final record expires with the retention (DynamoDB TTL on `ExpiresAt`).
        if let Some(at) = self.expiry(record) {
            item.insert("ExpiresAt".to_owned(), n(at));
        }
        let result = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item.clone()))
            .condition_expression(e.clauses.join(" AND "))
            .set_expression_attribute_names(Some(e.names))
            .set_expression_attribute_values((!e.values.is_empty()).then_some(e.values))
            // On a conditional failure DynamoDB returns the item as it is, at no extra cost:
            // what the read-back below needs.
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match result {
            Ok(_) => Ok(()),
            Err(err) => match err.as_service_error() {
                Some(PutItemError::ConditionalCheckFailedException(c)) => {
                    // An ambiguous write: the SDK retries a request whose response was lost
                    // (a timeout, a 5xx), and the retry fails its condition against the
                    // first attempt's own write. "The record already is what I wrote" (this
                    // item, `WriteId` and all) is success; anything else, a rival's identical
                    // transition included, is a lost race.
                    if c.item() == Some(&item) {
                        Ok(())
                    } else {
                        Err(StoreError::ConditionFailed)
                    }
                }
                _ => Err(unavailable(&err)),
            },
        }
    }

    async fn put_with_input(
        &self,
        record: &StateRecord,
        condition: &Condition,
        task: &Task,
    ) -> Result<(), StoreError> {
        // One transaction: the task's new input, its revision and the earlier inputs steps ran
        // with (condition: the task item exists at the revision before - keeps "an input is
        // replaced, never created, and each revision follows the one it replaces") and the
        // record under its own condition (keeps whatever invariant the transition's condition
        // names). Both or neither.
        let e = condition_expr(condition);
        let (set, was) = match task.input_revision.checked_sub(1) {
            Some(0) | None => ("attribute_exists(pk) AND attribute_not_exists(#rev)", None),
            Some(prev) => ("attribute_exists(pk) AND #rev = :prev", Some(prev)),
        };
        let mut update = aws_sdk_dynamodb::types::Update::builder()
            .table_name(&self.table)
            .key("pk", s(task_pk(&record.task_id)))
            .key("sk", s("TASK"))
            .condition_expression(set)
            .expression_attribute_names("#input", "Input")
            .expression_attribute_names("#rev", "InputRevision")
            .expression_attribute_names("#earlier", "EarlierInputs")
            .expression_attribute_values(":input", s(task.input.to_string()))
            .expression_attribute_values(":rev", n(task.input_revision));
        if let Some(prev) = was {
            update = update.expression_attribute_values(":prev", n(prev));
        }
        let update = if task.earlier_inputs.is_empty() {
            update.update_expression("SET #input = :input, #rev = :rev REMOVE #earlier")
        } else {
            update
                .update_expression("SET #input = :input, #rev = :rev, #earlier = :earlier")
                .expression_attribute_values(":earlier", s(earlier_inputs(task)))
        }
        .build()
        .map_err(build_err)?;
        let mut item = state_item(record, self.shards);
        if let Some(at) = self.expiry(record) {
            item.insert("ExpiresAt".to_owned(), n(at));
        }
        let put = Put::builder()
            .table_name(&self.table)
            .set_item(Some(item.clone()))
            .condition_expression(e.clauses.join(" AND "))
            .set_expression_attribute_names(Some(e.names))
            .set_expression_attribute_values((!e.values.is_empty()).then_some(e.values))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .build()
            .map_err(build_err)?;
        let result = self
            .client
            .transact_write_items()
            .transact_items(TransactWriteItem::builder().update(update).build())
            .transact_items(TransactWriteItem::builder().put(put).build())
            // The same for the SDK's retries of this call: a retry of a committed transaction
            // succeeds instead of failing its conditions.
            .client_request_token(uuid::Uuid::new_v4().to_string())
            .send()
            .await;
        match result {
            Ok(_) => Ok(()),
            Err(err) => {
                let canceled = err.as_service_error().and_then(|se| match se {
                    TransactWriteItemsError::TransactionCanceledException(tc) => Some(tc),
                    _ => None,
                });
                let reasons = canceled.map(|tc| tc.cancellation_reasons()).unwrap_or(&[]);
                // The read-back (see `put`): the record already is the one this call wrote,
                // so the transaction committed, input and all.
                if reasons.last().and_then(|r| r.item()) == Some(&item) {
                    Ok(())
                } else if reasons
                    .iter()
                    .any(|r| r.code() == Some("ConditionalCheckFailed"))
                {
                    Err(StoreError::ConditionFailed)
                } else {
                    Err(unavailable(&err))
                }
            }
        }
    }

    async fn due(
        &self,
        shard: u32,
        now: DateTime<Utc>,
        limit: usize,
        after: Option<&DueEntry>,
    ) -> Result<Vec<DueEntry>, StoreError> {
        // Where the previous page ended: the index's keys and the table's, as DynamoDB's own
        // `LastEvaluatedKey` of that entry would be (same shard, so never a foreign key).
        let start = after.map(|a| {
            HashMap::from([
                ("DueShard".to_owned(), s(shard_key(shard))),
                ("DueAt".to_owned(), ms(a.due_at)),
                ("pk".to_owned(), s(task_pk(&a.task_id))),
                ("sk".to_owned(), s("STATE")),
            ])
        });
        let out = self
            .client
            .query()
            .table_name(&self.table)
            .index_name(DUE_INDEX)
            .key_condition_expression("DueShard = :shard AND DueAt <= :now")
            .expression_attribute_values(":shard", s(shard_key(shard)))
            .expression_attribute_values(":now", ms(now))
            .set_exclusive_start_key(start)
            .limit(limit.clamp(1, 1000) as i32)
            .send()
            .await
            .map_err(|e| unavailable(&e))?;
        out.items()
            .iter()
            .map(|item| {
                Ok(DueEntry {
                    task_id: get_s(item, "pk")?
                        .strip_prefix("TASK#")
                        .ok_or_else(|| corrupt("due-index item without a task key"))?
                        .parse()
                        .map_err(|e: crate::domain::ValidationError| corrupt(e.to_string()))?,
                    due_at: time(get_n(item, "DueAt")?)?,
                })
            })
            .collect()
    }

    fn due_shards(&self) -> u32 {
        self.shards
    }

    async fn acquire_lease(
        &self,
        name: &str,
        owner: &str,
        now: DateTime<Utc>,
        ttl: chrono::Duration,
    ) -> Result<bool, StoreError> {
        let until = now + ttl;
        // Condition: no lease, an expired one, or our own - keeps "at most one holder at a time".
        let req = self
            .client
            .put_item()
            .table_name(&self.table)
            .item("pk", s(format!("LEASE#{name}")))
            .item("sk", s("LEASE"))
            .item("Owner", s(owner))
            .item("LeaseUntil", ms(until))
            // The table's TTL removes leases nobody renews.
            .item("ExpiresAt", n(until.timestamp() + KEY_TTL_SECONDS))
            .condition_expression("attribute_not_exists(pk) OR LeaseUntil <= :now OR #owner = :me")
            .expression_attribute_names("#owner", "Owner")
            .expression_attribute_values(":now", ms(now))
            .expression_attribute_values(":me", s(owner));
        Self::put_if(req).await
    }

    async fn get_breaker(&self, name: &str) -> Result<Option<BreakerRecord>, StoreError> {
        let Some(item) = self.read_item(format!("BREAKER#{name}"), "BREAKER").await? else {
            return Ok(None);
        };
        let item = &item;
        let state = match get_s(item, "State")? {
            "Closed" => BreakerState::Closed {
                failures: get_n(item, "Failures")?,
            },
            "Open" => BreakerState::Open {
                until: time(get_n(item, "Until")?)?,
            },
            "Paused" => BreakerState::Paused {
                since: time(get_n(item, "Since")?)?,
            },
            "HalfOpen" => BreakerState::HalfOpen {
                probes_left: get_n(item, "ProbesLeft")?,
                until: time(get_n(item, "Until")?)?,
            },
            other => return Err(corrupt(format!("unknown breaker state {other:?}"))),
        };
        Ok(Some(BreakerRecord {
            name: name.to_owned(),
            state,
            version: get_n(item, "Version")?,
            note: item.get("Note").and_then(|v| v.as_s().ok()).cloned(),
            open_since: match item.get("OpenSince") {
                Some(_) => Some(time(get_n(item, "OpenSince")?)?),
                None => None,
            },
            fault_keys: match item.get("FaultKeys") {
                Some(v) => v
                    .as_l()
                    .map_err(|_| corrupt("FaultKeys is not a list"))?
                    .iter()
                    .map(|k| {
                        k.as_s()
                            .cloned()
                            .map_err(|_| corrupt("FaultKeys holds a non-string"))
                    })
                    .collect::<Result<_, _>>()?,
                None => Vec::new(),
            },
        }))
    }

    async fn put_breaker(&self, record: &BreakerRecord) -> Result<bool, StoreError> {
        let mut item = HashMap::from([
            ("pk".to_owned(), s(format!("BREAKER#{}", record.name))),
            ("sk".to_owned(), s("BREAKER")),
            ("Version".to_owned(), n(record.version)),
        ]);
        let (state, extra): (&str, Vec<(&str, AttributeValue)>) = match record.state {
            BreakerState::Closed { failures } => ("Closed", vec![("Failures", n(failures))]),
            BreakerState::Open { until } => ("Open", vec![("Until", ms(until))]),
            BreakerState::HalfOpen { probes_left, until } => (
                "HalfOpen",
                vec![("ProbesLeft", n(probes_left)), ("Until", ms(until))],
            ),
            BreakerState::Paused { since } => ("Paused", vec![("Since", ms(since))]),
        };
        if let Some(note) = &record.note {
            item.insert("Note".to_owned(), s(note));
        }
        if let Some(since) = record.open_since {
            item.insert("OpenSince".to_owned(), ms(since));
        }
        if !record.fault_keys.is_empty() {
            item.insert(
                "FaultKeys".to_owned(),
                AttributeValue::L(record.fault_keys.iter().map(s).collect()),
            );
        }
        item.insert("State".to_owned(), s(state));
        for (k, v) in extra {
            item.insert(k.to_owned(), v);
        }
        // Condition: the version this write was computed from - keeps "every agent's move of
        // the breaker starts from the breaker as it is" (a probe is handed out once).
        let req = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item));
        let req = if record.version <= 1 {
            req.condition_expression("attribute_not_exists(pk)")
        } else {
            req.condition_expression("Version = :v")
                .expression_attribute_values(":v", n(record.version - 1))
        };
        Self::put_if(req).await
    }

    async fn release_lease(&self, name: &str, owner: &str) -> Result<(), StoreError> {
        // Condition: still ours - a lease another supervisor took over is left alone.
        let req = self
            .client
            .put_item()
            .table_name(&self.table)
            .item("pk", s(format!("LEASE#{name}")))
            .item("sk", s("LEASE"))
            .item("Owner", s(owner))
            .item("LeaseUntil", n(0))
            .item("ExpiresAt", n(Utc::now().timestamp() + KEY_TTL_SECONDS))
            .condition_expression("#owner = :me")
            .expression_attribute_names("#owner", "Owner")
            .expression_attribute_values(":me", s(owner));
        Self::put_if(req).await.map(|_| ())
    }

    async fn list(
        &self,
        state: ProcessState,
        workflow: Option<&str>,
        limit: usize,
        after: Option<&Cursor>,
    ) -> Result<Page, StoreError> {
        let limit = limit.clamp(1, 1000);
        // The shards merged ([`DynamoStore::newest_first`]). The index projects only the task's
        // id and workflow: the page's summaries are then read from the state records (one
        // `BatchGetItem`), so a write within a state changes nothing in the index.
        let partitions = (0..self.shards)
            .map(|shard| state_shard_key(state, shard))
            .collect();
        let (rows, next) = self
            .newest_first(
                Partitions {
                    index: STATE_INDEX,
                    hash: "StateShard",
                    values: partitions,
                    sort: "StateSince",
                    workflow,
                },
                limit,
                after,
            )
            .await?;
        let mut found = self.summaries(rows.iter().map(|(_, id)| *id)).await?;
        let items = rows
            .iter()
            .filter_map(|(ms, id)| {
                let mut summary = found.remove(id)?;
                // The index lags the table: a record that has left the state since is left
                // out; one that left and came back is listed where the index has it.
                summary.since = time(*ms).ok()?;
                (summary.process_state == state).then_some(summary)
            })
            .collect();
        Ok(Page { items, next })
    }

    async fn count(
        &self,
        state: ProcessState,
        workflow: Option<&str>,
        cap: u64,
    ) -> Result<Count, StoreError> {
        let mut total = 0u64;
        for shard in 0..self.shards {
            let mut start = None;
            loop {
                let mut query = self
                    .client
                    .query()
                    .table_name(&self.table)
                    .index_name(STATE_INDEX)
                    .key_condition_expression("StateShard = :k")
                    .expression_attribute_values(":k", s(state_shard_key(state, shard)))
                    .select(aws_sdk_dynamodb::types::Select::Count)
                    .set_exclusive_start_key(start.take());
                if let Some(w) = workflow {
                    query = query
                        .filter_expression("Workflow = :w")
                        .expression_attribute_values(":w", s(w));
                }
                let out = query.send().await.map_err(|e| unavailable(&e))?;
                total += out.count().max(0) as u64;
                if total > cap {
                    return Ok(Count {
                        count: cap,
                        capped: true,
                    });
                }
                match out.last_evaluated_key() {
                    Some(k) if !k.is_empty() => start = Some(k.clone()),
                    _ => break,
                }
            }
        }
        Ok(Count {
            count: total,
            capped: false,
        })
    }

    async fn expire_task(&self, record: &StateRecord) -> Result<(), StoreError> {
        let Some(at) = self.expiry(record) else {
            return Ok(());
        };
        // Condition: the task item exists - keeps "an expiry never creates an item" (a task
        // whose items were already deleted is left alone).
        let out = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("pk", s(task_pk(&record.task_id)))
            .key("sk", s("TASK"))
            .update_expression("SET ExpiresAt = :at")
            .condition_expression("attribute_exists(pk)")
            .expression_attribute_values(":at", n(at))
            .send()
            .await;
        match out {
            Ok(_) => Ok(()),
            Err(e)
                if e.as_service_error()
                    .is_some_and(|se| se.is_conditional_check_failed_exception()) =>
            {
                Ok(())
            }
            Err(e) => Err(unavailable(&e)),
        }
    }

    async fn admit(
        &self,
        key: &str,
        limit: &crate::domain::rate::RateLimit,
        now: DateTime<Utc>,
    ) -> Result<crate::domain::rate::Admission, StoreError> {
        use crate::domain::rate::{Admission, Decision};
        let now_ms = now.timestamp_millis();
        let pk = format!("RATE#{key}");
        // An idle caller's item goes an hour after its bucket refilled.
        let expires = |tat_ms: i64| n(tat_ms / 1000 + 3600);
        for _ in 0..4 {
            // A busy caller: its TAT is between now and now + tolerance. Condition: the TAT
            // is where it was when this admission was decided - keeps "at most `burst` + rate
            // × t requests of one caller are admitted in any t", however many functions admit
            // at once (one conditional write per request, no read).
            let busy = self
                .client
                .update_item()
                .table_name(&self.table)
                .key("pk", s(&pk))
                .key("sk", s("RATE"))
                .update_expression("SET Tat = Tat + :i, ExpiresAt = :e")
                .condition_expression("Tat BETWEEN :now AND :max")
                .expression_attribute_values(":i", n(limit.interval_ms()))
                .expression_attribute_values(":now", n(now_ms))
                .expression_attribute_values(":max", n(now_ms + limit.tolerance_ms()))
                .expression_attribute_values(":e", expires(now_ms + limit.tolerance_ms()))
                .return_values_on_condition_check_failure(
                    ReturnValuesOnConditionCheckFailure::AllOld,
                )
                .send()
                .await;
            let old = match busy {
                Ok(_) => return Ok(Admission::Admitted),
                Err(e) => match e.as_service_error() {
                    Some(se) if se.is_conditional_check_failed_exception() => {
                        let item = match &se {
                            aws_sdk_dynamodb::operation::update_item::UpdateItemError::ConditionalCheckFailedException(c) => c.item().cloned(),
                            _ => None,
                        };
                        // Without the old item in the answer (an emulator may leave it out),
                        // read it.
                        let item = match item {
                            Some(i) => Some(i),
                            None => self.read_item(pk.clone(), "RATE").await?,
                        };
                        match item {
                            Some(i) => opt_n::<i64>(&i, "Tat")?,
                            None => None,
                        }
                    }
                    _ => return Err(unavailable(&e)),
                },
            };
            let tat_ms = match limit.decide(old, now_ms) {
                Decision::Refuse { retry_after } => return Ok(Admission::Limited { retry_after }),
                Decision::Admit { tat_ms } => tat_ms,
            };
            // A new or idle caller: no TAT, or one in the past. Condition: still so - a racing
            // admission that moved it first sends this one round again.
            let idle = self
                .client
                .update_item()
                .table_name(&self.table)
                .key("pk", s(&pk))
                .key("sk", s("RATE"))
                .update_expression("SET Tat = :t, ExpiresAt = :e")
                .condition_expression("attribute_not_exists(Tat) OR Tat < :now")
                .expression_attribute_values(":t", n(tat_ms))
                .expression_attribute_values(":now", n(now_ms))
                .expression_attribute_values(":e", expires(tat_ms))
                .send()
                .await;
            match idle {
                Ok(_) => return Ok(Admission::Admitted),
                Err(e)
                    if e.as_service_error()
                        .is_some_and(|se| se.is_conditional_check_failed_exception()) => {}
                Err(e) => return Err(unavailable(&e)),
            }
        }
        // Four races lost in a row: the caller is sending as fast as the item can be written.
        Ok(Admission::Limited {
            retry_after: chrono::Duration::milliseconds(limit.interval_ms()),
        })
    }

    async fn list_by_caller(
        &self,
        caller: &Caller,
        limit: usize,
        after: Option<&Cursor>,
    ) -> Result<Page, StoreError> {
        let limit = limit.clamp(1, 100);
        let partitions = (0..self.caller_shards)
            .map(|shard| caller.index_key(shard))
            .collect();
        let (rows, next) = self
            .newest_first(
                Partitions {
                    index: CALLER_INDEX,
                    hash: "CallerShard",
                    values: partitions,
                    sort: "CreatedAt",
                    workflow: None,
                },
                limit,
                after,
            )
            .await?;
        let mut found = self.summaries(rows.iter().map(|(_, id)| *id)).await?;
        // A task whose state record is gone (expired between the two reads) is left out.
        let items = rows.iter().filter_map(|(_, id)| found.remove(id)).collect();
        Ok(Page { items, next })
    }
}

/// The GSI partitions a list merges: `hash` = each of `values`, newest `sort` first.
struct Partitions<'a> {
    index: &'static str,
    hash: &'static str,
    values: Vec<String>,
    sort: &'static str,
    /// Only entries with this `Workflow` (a filter on a projected attribute).
    workflow: Option<&'a str>,
}

impl DynamoStore {
    /// One page of the rows (sort key in ms, task id) of several partitions of one index after
    /// `after`: each partition's newest `limit` (and their ties) merged, newest first and ties
    /// by id, cut at `limit`, with the cursor after the last one if any partition has more. A
    /// partition is read from the cursor's time down (`sort <= t`). DynamoDB
    /// leaves rows with equal sort keys in no defined order, so a partition is read past its
    /// `limit` rows until its sort key changes: every row tied with its last one is taken, and
    /// the merge orders the ties by id. (Cut at `limit`, a partition could leave out a tied row
    /// whose id sorts before the page's last one, and the next page, starting after that id,
    /// would skip it.)
    async fn newest_first(
        &self,
        p: Partitions<'_>,
        limit: usize,
        after: Option<&Cursor>,
    ) -> Result<(Vec<(i64, TaskId)>, Option<Cursor>), StoreError> {
        let mut rows: Vec<(i64, TaskId)> = Vec::new();
        let mut more = false;
        for value in &p.values {
            let mut start = None;
            let mut taken = 0;
            let mut last_ms = None;
            'partition: loop {
                // Past `limit`, only the boundary's ties are wanted: a few rows at a time.
                let want = if taken < limit { limit - taken } else { 25 };
                let mut query = self
                    .client
                    .query()
                    .table_name(&self.table)
                    .index_name(p.index)
                    .expression_attribute_names("#h", p.hash)
                    .expression_attribute_values(":k", s(value))
                    .scan_index_forward(false)
                    .limit(want as i32)
                    .set_exclusive_start_key(start.take());
                query = match after {
                    // (DynamoDB refuses a name or value the expression does not use.)
                    Some(c) => query
                        .key_condition_expression("#h = :k AND #s <= :t")
                        .expression_attribute_names("#s", p.sort)
                        .expression_attribute_values(":t", n(c.at_ms)),
                    None => query.key_condition_expression("#h = :k"),
                };
                if let Some(w) = p.workflow {
                    // A filter on the projected `Workflow`: the page may come back short, and
                    // the loop goes on from `LastEvaluatedKey` until it is full.
                    query = query
                        .filter_expression("Workflow = :w")
                        .expression_attribute_values(":w", s(w));
                }
                let out = query.send().await.map_err(|e| unavailable(&e))?;
                for item in out.items() {
                    let id: TaskId = get_s(item, "pk")?
                        .strip_prefix("TASK#")
                        .ok_or_else(|| corrupt(format!("{} item is not a task's", p.index)))?
                        .parse()
                        .map_err(|e: crate::domain::ValidationError| corrupt(e.to_string()))?;
                    let ms: i64 = get_n(item, p.sort)?;
                    if !after.is_none_or(|c| c.precedes(ms, id)) {
                        continue;
                    }
                    if taken >= limit && last_ms != Some(ms) {
                        // The first row after the boundary's ties: this partition has more.
                        more = true;
                        break 'partition;
                    }
                    taken += 1;
                    last_ms = Some(ms);
                    rows.push((ms, id));
                }
                match out.last_evaluated_key() {
                    Some(k) if !k.is_empty() => start = Some(k.clone()),
                    _ => break,
                }
            }
        }
        rows.sort_by_key(|(ms, id)| Cursor::order_key(*ms, *id));
        let more = more || rows.len() > limit;
        rows.truncate(limit);
        let next = more
            .then(|| rows.last().map(|(ms, id)| Cursor::at(*ms, *id)))
            .flatten();
        Ok((rows, next))
    }
}

impl DynamoStore {
    /// The summaries of the given tasks' state records (eventually consistent), by id.
    async fn summaries(
        &self,
        ids: impl Iterator<Item = TaskId>,
    ) -> Result<HashMap<TaskId, Summary>, StoreError> {
        use aws_sdk_dynamodb::types::KeysAndAttributes;
        let keys: Vec<Item> = ids
            .map(|id| {
                HashMap::from([
                    ("pk".to_owned(), s(task_pk(&id))),
                    ("sk".to_owned(), s("STATE")),
                ])
            })
            .collect();
        let mut found = HashMap::new();
        // The summary's attributes, by placeholder.
        let names: HashMap<String, String> = SUMMARY_ATTRIBUTES
            .iter()
            .enumerate()
            .map(|(i, a)| (format!("#a{i}"), (*a).to_owned()))
            .collect();
        let projection = names.keys().cloned().collect::<Vec<_>>().join(", ");
        // At most 100 keys a request.
        for chunk in keys.chunks(100) {
            let pending = Some(
                KeysAndAttributes::builder()
                    .set_keys(Some(chunk.to_vec()))
                    .projection_expression(projection.clone())
                    .set_expression_attribute_names(Some(names.clone()))
                    .build()
                    .map_err(|e| StoreError::Unavailable(e.to_string()))?,
            );
            self.batch_summaries(pending, &mut found).await?;
        }
        Ok(found)
    }

    /// One `BatchGetItem` of summaries, its unprocessed keys asked again.
    async fn batch_summaries(
        &self,
        mut pending: Option<aws_sdk_dynamodb::types::KeysAndAttributes>,
        found: &mut HashMap<TaskId, Summary>,
    ) -> Result<(), StoreError> {
        // Unprocessed keys (throttling) are asked again, a few times, then reported.
        for _ in 0..5 {
            let Some(request) = pending.take() else { break };
            let out = self
                .client
                .batch_get_item()
                .request_items(&self.table, request)
                .send()
                .await
                .map_err(|e| unavailable(&e))?;
            for item in out
                .responses()
                .and_then(|r| r.get(&self.table))
                .into_iter()
                .flatten()
            {
                let summary = parse_summary(item)?;
                found.insert(summary.task_id, summary);
            }
            pending = out
                .unprocessed_keys()
                .and_then(|u| u.get(&self.table))
                .filter(|k| !k.keys().is_empty())
                .cloned();
        }
        if pending.is_some() {
            return Err(StoreError::Unavailable(
                "state records left unread (throttled)".into(),
            ));
        }
        Ok(())
    }
}

fn definition_pk(kind: Kind, name: &str) -> String {
    format!("{}#{name}", kind.as_str())
}

fn version_sk(version: u32) -> String {
    format!("V#{version:010}")
}

fn catalog_pk(kind: Kind) -> String {
    format!("CATALOG#{}", kind.as_str())
}

fn text_hash(text: &str) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(text.as_bytes()))
}

/// The catalog item: name → newest version, and name → the hash of that version's text.
struct CatalogItem {
    revision: u64,
    latest: HashMap<String, u32>,
    hashes: HashMap<String, String>,
}

fn parse_catalog(item: &Item) -> Result<CatalogItem, StoreError> {
    let map = |k: &str| match item.get(k) {
        Some(AttributeValue::M(m)) => Ok(m.clone()),
        None => Ok(HashMap::new()),
        _ => Err(corrupt(format!("{k} is not a map"))),
    };
    let latest = map("Latest")?
        .into_iter()
        .map(|(name, v)| match v {
            AttributeValue::N(n) => n
                .parse()
                .map(|n| (name, n))
                .map_err(|_| corrupt("Latest holds a bad number")),
            _ => Err(corrupt("Latest holds a non-number")),
        })
        .collect::<Result<_, _>>()?;
    let hashes = map("Hashes")?
        .into_iter()
        .map(|(name, v)| match v {
            AttributeValue::S(h) => Ok((name, h)),
            _ => Err(corrupt("Hashes holds a non-string")),
        })
        .collect::<Result<_, _>>()?;
    Ok(CatalogItem {
        revision: get_n(item, "Revision")?,
        latest,
        hashes,
    })
}

fn parse_stored(kind: Kind, item: &Item) -> Result<Stored, StoreError> {
    Ok(Stored {
        kind,
        name: get_s(item, "Name")?.to_owned(),
        version: get_n(item, "Version")?,
        body: serde_json::from_str(get_s(item, "Body")?)
            .map_err(|e| corrupt(format!("Body is not JSON: {e}")))?,
        published_at: time(get_n(item, "PublishedAt")?)?,
    })
}

impl DynamoStore {
    async fn catalog(&self, kind: Kind) -> Result<Option<CatalogItem>, StoreError> {
        self.read_item(catalog_pk(kind), "CATALOG")
            .await?
            .as_ref()
            .map(parse_catalog)
            .transpose()
    }
}

#[async_trait]
impl Catalog for DynamoStore {
    async fn publish(
        &self,
        kind: Kind,
        name: &str,
        body: &serde_json::Value,
        now: DateTime<Utc>,
    ) -> Result<Published, StoreError> {
        let text = canonical(body);
        let hash = text_hash(&text);
        // Two publishers may race: the loser's transaction fails on the catalog's revision and
        // it tries again on the newer catalog.
        for _ in 0..8 {
            let current = self.catalog(kind).await?;
            let (revision, mut latest, mut hashes) = match current {
                Some(c) => (c.revision, c.latest, c.hashes),
                None => (0, HashMap::new(), HashMap::new()),
            };
            if let Some(v) = latest.get(name)
                && hashes.get(name) == Some(&hash)
            {
                return Ok(Published {
                    version: *v,
                    created: false,
                });
            }
            let version = latest.get(name).copied().unwrap_or(0) + 1;
            latest.insert(name.to_owned(), version);
            hashes.insert(name.to_owned(), hash.clone());
            // Condition: the version does not exist yet - keeps "a published version never
            // changes".
            let definition = Put::builder()
                .table_name(&self.table)
                .set_item(Some(HashMap::from([
                    ("pk".to_owned(), s(definition_pk(kind, name))),
                    ("sk".to_owned(), s(version_sk(version))),
                    ("Name".to_owned(), s(name)),
                    ("Version".to_owned(), n(version)),
                    ("Body".to_owned(), s(&text)),
                    ("PublishedAt".to_owned(), ms(now)),
                ])))
                .condition_expression("attribute_not_exists(pk)")
                .build()
                .map_err(build_err)?;
            // Condition: the catalog is still at the revision read - keeps "versions are dense
            // and the catalog's newest version of a name is stored".
            let mut catalog = Put::builder()
                .table_name(&self.table)
                .set_item(Some(HashMap::from([
                    ("pk".to_owned(), s(catalog_pk(kind))),
                    ("sk".to_owned(), s("CATALOG")),
                    ("Revision".to_owned(), n(revision + 1)),
                    (
                        "Latest".to_owned(),
                        AttributeValue::M(latest.into_iter().map(|(k, v)| (k, n(v))).collect()),
                    ),
                    (
                        "Hashes".to_owned(),
                        AttributeValue::M(hashes.into_iter().map(|(k, v)| (k, s(v))).collect()),
                    ),
                ])));
            catalog = if revision == 0 {
                catalog.condition_expression("attribute_not_exists(pk)")
            } else {
                catalog
                    .condition_expression("Revision = :r")
                    .expression_attribute_values(":r", n(revision))
            };
            let result = self
                .client
                .transact_write_items()
                .transact_items(TransactWriteItem::builder().put(definition).build())
                .transact_items(
                    TransactWriteItem::builder()
                        .put(catalog.build().map_err(build_err)?)
                        .build(),
                )
                .send()
                .await;
            match result {
                Ok(_) => {
                    return Ok(Published {
                        version,
                        created: true,
                    });
                }
                Err(e)
                    if e.as_service_error().is_some_and(|se| {
                        matches!(se, aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError::TransactionCanceledException(_))
                    }) =>
                {
                    continue;
                }
                Err(e) => return Err(unavailable(&e)),
            }
        }
        Err(StoreError::Unavailable(
            "the catalog kept changing; publish again".into(),
        ))
    }

    async fn definition(
        &self,
        kind: Kind,
        name: &str,
        version: Option<u32>,
    ) -> Result<Option<Stored>, StoreError> {
        let version = match version {
            Some(v) => v,
            None => match self
                .catalog(kind)
                .await?
                .and_then(|c| c.latest.get(name).copied())
            {
                Some(v) => v,
                None => return Ok(None),
            },
        };
        self.read_item(definition_pk(kind, name), &version_sk(version))
            .await?
            .as_ref()
            .map(|item| parse_stored(kind, item))
            .transpose()
    }

    async fn entries(&self, kind: Kind) -> Result<Vec<Entry>, StoreError> {
        let mut out: Vec<Entry> = self
            .catalog(kind)
            .await?
            .map(|c| {
                c.latest
                    .into_iter()
                    .map(|(name, latest)| Entry { name, latest })
                    .collect()
            })
            .unwrap_or_default();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }
}

fn parse_summary(item: &Item) -> Result<Summary, StoreError> {
    Ok(Summary {
        task_id: get_s(item, "TaskId")?
            .parse()
            .map_err(|e: crate::domain::ValidationError| corrupt(e.to_string()))?,
        workflow: get_s(item, "Workflow")?.to_owned(),
        process_state: get_s(item, "ProcessState")?.parse().map_err(corrupt)?,
        step: opt_s(item, "CurrentStep"),
        failure_count: get_n(item, "FailureCount")?,
        attempt: get_n(item, "Attempt")?,
        last_error: opt_s(item, "LastError"),
        updated_at: time(get_n(item, "UpdatedAt")?)?,
        since: since(item)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::workflow::examples;

    #[test]
    fn state_items_round_trip_and_carry_index_keys_only_when_due() {
        let now = crate::domain::state::to_millis(Utc::now());
        let mut r = StateRecord::new(
            TaskId::new_random(),
            &examples::loan_application(&crate::Policy::default()),
            Some("https://sqs.example/q".into()),
            now,
            now + chrono::Duration::seconds(5),
        );
        let item = state_item(&r, 4);
        assert!(item.contains_key("DueShard") && item.contains_key("DueAt"));
        assert!(!item.contains_key("LockedBy"));
        assert_eq!(parse_state(&item).expect("parses"), r);
        assert_eq!(r.pivot, Some(2));
        assert!(!r.steps[0].undoable && r.steps[1].undoable);
        let task = Task {
            id: r.task_id,
            workflow: r.workflow.clone(),
            workflow_version: 1,
            input: serde_json::json!({"amount": 12.5, "nested": {"a": [1, null]}}),
            input_revision: 0,
            earlier_inputs: vec![],
            reply_queue_url: None,
            created_at: now,
            caller: Caller::new("arn:aws:iam::123456789012:role/shop").expect("caller"),
        };
        assert_eq!(parse_task(&task_item(&task, 4)).expect("parses"), task);

        r.process_state = ProcessState::Error;
        r.complete_by = None;
        r.due_key = None;
        let item = state_item(&r, 4);
        assert!(!item.contains_key("DueShard") && !item.contains_key("DueAt"));
        assert_eq!(parse_state(&item).expect("parses"), r);
    }

    #[test]
    fn steps_and_history_are_stored_deflated_and_old_lists_still_read() {
        let now = crate::domain::state::to_millis(Utc::now());
        let mut r = StateRecord::new(
            TaskId::new_random(),
            &examples::ecommerce_order(&crate::Policy::default()),
            None,
            now,
            now + chrono::Duration::seconds(5),
        );
        r.steps[0].status = crate::domain::StepStatus::Done;
        r.steps[0].result = Some(r#"{"id":"res-123","items":[{"sku":"SKU-9"}]}"#.into());
        r.steps[0].finished_at = Some(now);
        r.steps[0].finished_attempt = Some(1);
        r.steps[1].sent = true;
        r.steps[1].status = crate::domain::StepStatus::Running;
        for i in 0..100u64 {
            r.history.push(HistoryEntry {
                at: now + chrono::Duration::milliseconds(i as i64),
                from: ProcessState::Processing,
                to: ProcessState::Processing,
                step: Some("charge-payment".into()),
                attempt: i,
                reason: format!("timed out; retry #{i} in 5s"),
                by: (i % 7 == 0).then(|| "arn:aws:iam::123456789012:role/ops".to_owned()),
            });
        }
        r.history.truncate(crate::domain::state::MAX_HISTORY);
        let item = state_item(&r, 4);
        assert!(matches!(item.get("Body"), Some(AttributeValue::B(_))));
        assert!(!item.contains_key("History") && !item.contains_key("Steps"));
        assert_eq!(parse_state(&item).expect("parses"), r);
        // 100 lines: about 12 KB as lists of maps, a fraction of it deflated.
        let mut plain = item.clone();
        plain.remove("Body");
        plain.insert("Steps".into(), steps_list(&r));
        plain.insert("History".into(), history_list(&r));
        assert!(
            item_size(&item) * 4 < item_size(&plain),
            "{} deflated, {} plain",
            item_size(&item),
            item_size(&plain)
        );
        // An item written before `Body` reads the same.
        assert_eq!(parse_state(&plain).expect("parses"), r);
        // A blob that is not a deflated body is a corrupt record, not a panic or an empty
        // history.
        let mut bad = item.clone();
        bad.insert(
            "Body".into(),
            AttributeValue::B(aws_sdk_dynamodb::primitives::Blob::new(
                b"not deflate".to_vec(),
            )),
        );
        assert!(matches!(parse_state(&bad), Err(StoreError::Corrupt(_))));
        // Nor is one that inflates past the limit (a deflate bomb: 5 MB of spaces).
        use std::io::Write;
        let mut z = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::best());
        z.write_all(&vec![b' '; 5 << 20]).expect("deflates");
        let bomb = z.finish().expect("deflates");
        assert!(bomb.len() < 64 * 1024);
        bad.insert(
            "Body".into(),
            AttributeValue::B(aws_sdk_dynamodb::primitives::Blob::new(bomb)),
        );
        match parse_state(&bad) {
            Err(StoreError::Corrupt(m)) => assert!(m.contains("limit"), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn conditions_name_every_guard() {
        let c = Condition::Matches {
            version: 3,
            guards: vec![Guard::StateIs(ProcessState::Pending), Guard::Unlocked],
        };
        let e = condition_expr(&c);
        assert_eq!(
            e.clauses,
            [
                "#Version = :v0",
                "#ProcessState = :v1",
                "attribute_not_exists(#LockedBy)"
            ]
        );
        assert_eq!(e.values.get(":v0"), Some(&n(3)));
    }
}
