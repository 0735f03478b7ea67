//! The item codec of tasks and state records: their items, the index keys a record carries,
//! the sizes DynamoDB bills, and a [`Condition`] as a condition expression.

use super::item::*;
#[cfg(any(test, feature = "testkit"))]
use super::store::{DEFAULT_CALLER_SHARDS, STATE_INDEX_PROJECTION};
use crate::domain::StateRecord;
use crate::domain::state::due_shard;
use crate::domain::{Caller, Condition, Guard, HistoryEntry, ProcessState, StepState, Task};
use crate::ports::StoreError;
use crate::ports::Summary;
use aws_sdk_dynamodb::types::AttributeValue;
use chrono::{DateTime, Utc};
use std::collections::HashMap;

pub(super) fn task_item(t: &Task, caller_shards: u32) -> Item {
    let mut item = HashMap::from([
        ("pk".to_owned(), s(task_pk(&t.id))),
        ("sk".to_owned(), s("TASK")),
        ("TaskId".to_owned(), s(t.id.to_string())),
        ("Workflow".to_owned(), s(&t.workflow)),
        ("WorkflowVersion".to_owned(), n(t.workflow_version)),
        ("Input".to_owned(), s(t.input.to_string())),
        ("CreatedAt".to_owned(), ms(t.created_at)),
        ("Caller".to_owned(), s(t.caller.as_str())),
    ]);
    // Only a listed caller's task makes an entry in `caller-shard-index` (a write unit each).
    if t.caller.listed() {
        item.insert(
            "CallerShard".to_owned(),
            s(t.caller.index_key(due_shard(&t.id, caller_shards))),
        );
    }
    if let Some(u) = &t.reply_queue_url {
        item.insert("ReplyQueueUrl".to_owned(), s(u));
    }
    // Each key makes an entry in its slot's `key-index-<n>` (a write unit each).
    for k in &t.keys {
        item.insert(key_attribute(k.slot.into()), s(k.key.index_value()));
    }
    if let Some(r) = &t.input_ref {
        item.insert("InputRef".to_owned(), s(payload_ref(r)));
    }
    if t.input_revision > 0 {
        item.insert("InputRevision".to_owned(), n(t.input_revision));
    }
    if !t.earlier_inputs.is_empty() {
        item.insert("EarlierInputs".to_owned(), s(earlier_inputs(t)));
    }
    item
}

/// A payload's reference as stored (a JSON object).
fn payload_ref(r: &crate::domain::PayloadRef) -> String {
    serde_json::to_string(r).unwrap_or_default()
}

fn parse_payload_ref(
    item: &Item,
    name: &str,
) -> Result<Option<crate::domain::PayloadRef>, StoreError> {
    opt_s(item, name)
        .map(|json| {
            serde_json::from_str(&json)
                .map_err(|e| corrupt(format!("{name} is not a payload reference: {e}")))
        })
        .transpose()
}

/// A task's earlier inputs as stored (`EarlierInputs`, a JSON array).
pub(super) fn earlier_inputs(t: &Task) -> String {
    serde_json::to_string(&t.earlier_inputs).unwrap_or_else(|_| "[]".into())
}

pub(super) fn parse_task(item: &Item) -> Result<Task, StoreError> {
    Ok(Task {
        id: get_s(item, "TaskId")?
            .parse()
            .map_err(|e: crate::domain::ValidationError| corrupt(e.to_string()))?,
        workflow: get_s(item, "Workflow")?.to_owned(),
        workflow_version: get_n(item, "WorkflowVersion")?,
        input: serde_json::from_str(get_s(item, "Input")?)
            .map_err(|e| corrupt(format!("Input is not JSON: {e}")))?,
        input_ref: parse_payload_ref(item, "InputRef")?,
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
        keys: parse_keys(item)?,
    })
}

/// The attribute that holds a task's key of slot `slot`, which the slot's index is keyed on.
pub fn key_attribute(slot: usize) -> String {
    format!("Key{}", slot + 1)
}

/// A task's search keys (`Key1`..`Key3`, each `name#value`).
fn parse_keys(item: &Item) -> Result<Vec<crate::domain::keys::TaskKey>, StoreError> {
    use crate::domain::keys::{MAX_SEARCH_KEYS, SearchKey, TaskKey};
    let mut keys = Vec::new();
    for slot in 0..MAX_SEARCH_KEYS {
        let name = key_attribute(slot);
        if let Some(text) = opt_s(item, &name) {
            let key = SearchKey::from_index_value(&text)
                .ok_or_else(|| corrupt(format!("{name} is not name#value")))?;
            keys.push(TaskKey {
                slot: slot as u8,
                key,
            });
        }
    }
    Ok(keys)
}

/// A record's steps and history, stored together deflated (`Body`, binary): they are most of
/// its size (a map per step with its kept result, a line per transition up to
/// [`MAX_HISTORY`]) and mostly repeated names and words, and every write bills the whole item
/// by the KB. No condition reads inside them. Written as lists of maps (`Steps`, `History`,
/// the layout before `Body`, still read) only if deflating fails.
///
/// [`MAX_HISTORY`]: crate::domain::state::MAX_HISTORY
/// A parallel group's (or forEach step's) branches ride in the body too: up to 100 cursors
/// of the same shape, which deflate well.
#[derive(serde::Serialize)]
pub(super) struct Body<'a> {
    steps: &'a [StepState],
    history: &'a [HistoryEntry],
    #[serde(skip_serializing_if = "Option::is_none")]
    fanout: Option<&'a crate::domain::state::Fanout>,
    #[serde(skip_serializing_if = "crate::domain::inbox::Inbox::is_empty")]
    inbox: &'a crate::domain::inbox::Inbox,
    #[serde(skip_serializing_if = "Option::is_none")]
    timer_at: Option<chrono::DateTime<chrono::Utc>>,
    #[serde(skip_serializing_if = "crate::domain::Priority::is_normal")]
    priority: crate::domain::Priority,
    #[serde(skip_serializing_if = "Option::is_none")]
    tenant: Option<&'a str>,
}

#[derive(serde::Deserialize)]
pub(super) struct OwnedBody {
    steps: Vec<StepState>,
    history: Vec<HistoryEntry>,
    #[serde(default)]
    fanout: Option<crate::domain::state::Fanout>,
    #[serde(default)]
    inbox: crate::domain::inbox::Inbox,
    #[serde(default)]
    timer_at: Option<chrono::DateTime<chrono::Utc>>,
    #[serde(default)]
    priority: crate::domain::Priority,
    #[serde(default)]
    tenant: Option<String>,
}

pub(super) fn pack_body(r: &StateRecord) -> Option<Vec<u8>> {
    let json = serde_json::to_vec(&Body {
        steps: &r.steps,
        history: &r.history,
        fanout: r.fanout.as_ref(),
        inbox: &r.inbox,
        timer_at: r.timer_at,
        priority: r.priority,
        tenant: r.tenant.as_deref(),
    })
    .ok()?;
    deflate_body(&json)
}

/// The first byte of a body deflated against [`BODY_DICTIONARY`]. A deflate stream starts
/// with its first block's header, and `0x06` is a block of the reserved type 3: no body
/// deflated without the dictionary (the layout before it, still read) starts with it.
const DICTIONARY_BODY: u8 = 0x06;

/// What a body deflates against: the names and words every record repeats, laid out as a
/// small record's body, so that even their first use in a body is a short back-reference
/// (about 120 bytes less on a loan's record, which keeps it under the 1 KB a write unit
/// bills). Stored bodies depend on these exact bytes: never change them (a test pins their
/// digest); a new dictionary takes a new first byte.
const BODY_DICTIONARY: &[u8] = br#"{"fanout":{"group":"","each":"","maxConcurrency":10,"tolerated":0,"refused":0,"elements":[],"branches":[{"start":0,"end":1,"processState":"Pending","stepIndex":0,"attempt":0,"lockedBy":"","completeBy":"}]},"inbox":{"kept":[{"payload":"resultRef":{"taskId":"","sha256":"","bytes":"sentUntil":"undo":"TimedOut","undo":"Failed","undo":"Running","undo":"Done","undoGeneration":1,"generation":1,"status":"Faulted","status":"Cancelled","status":"TimedOut","status":"Failed","waitingUntil":"","status":"Waiting","priority":"high","timed out; retry","misconfigured","the task's deadline passed","undone; every step undone","undone","refused","Compensating","Compensated","CompensationFailed","Error","Refused","Resolved","step done by its callback","step done; the group stops","event  came before it","event  kept for its step","accepted; waiting for its callback","waits until ","reason":"waited","{"steps":[{"name":"","status":"Pending"},{"name":"","status":"Running","sent":true},{"name":"","status":"Done","undoable":true,"finishedAttempt":1,"finishedAt":"","sent":true,"result":"{"id":""}],"history":[{"at":"","from":"Pending","to":"Pending","attempt":0,"reason":"received"},{"at":"","from":"Pending","to":"Processing","step":"","attempt":1,"reason":"claimed"},{"at":"","from":"Processing","to":"Processing","step":"","attempt":1,"reason":"step done"},{"at":"","from":"Processing","to":"Processed","step":"","attempt":1,"reason":"step done; every step done"}],"timer_at":"","tenant":""#;

/// `json` deflated against [`BODY_DICTIONARY`], after [`DICTIONARY_BODY`]. The dictionary is
/// deflated first and flushed to a byte boundary, and what it deflated to is dropped: what
/// follows refers back into it as a preset dictionary would (the deflate backend has none).
fn deflate_body(json: &[u8]) -> Option<Vec<u8>> {
    use flate2::{Compress, Compression, FlushCompress, Status};
    let mut z = Compress::new(Compression::best(), false);
    let mut out = Vec::with_capacity(BODY_DICTIONARY.len() + json.len() + 64);
    let status = z
        .compress_vec(BODY_DICTIONARY, &mut out, FlushCompress::Sync)
        .ok()?;
    if status != Status::Ok || z.total_in() != BODY_DICTIONARY.len() as u64 {
        return None;
    }
    let primed = out.len();
    loop {
        // Room for the rest: deflate grows incompressible input by a few bytes a block.
        out.reserve(json.len() + 64);
        let consumed = (z.total_in() as usize).saturating_sub(BODY_DICTIONARY.len());
        match z
            .compress_vec(&json[consumed..], &mut out, FlushCompress::Finish)
            .ok()?
        {
            Status::StreamEnd => break,
            Status::Ok | Status::BufError => continue,
        }
    }
    let mut body = Vec::with_capacity(out.len() - primed + 1);
    body.push(DICTIONARY_BODY);
    body.extend_from_slice(&out[primed..]);
    Some(body)
}

/// The most bytes a stored body may inflate to: far above what a record holds, so a corrupt
/// or hostile blob cannot exhaust memory.
pub(super) const MAX_BODY_BYTES: u64 = 4 << 20;

pub(super) fn unpack_body(bytes: &[u8]) -> Result<OwnedBody, StoreError> {
    let json = inflate_body(bytes)?;
    serde_json::from_slice(&json)
        .map_err(|e| corrupt(format!("Body is not steps and history: {e}")))
}

/// The JSON of a stored body: deflated against [`BODY_DICTIONARY`] (its first byte
/// [`DICTIONARY_BODY`]), or without (the layout before it). The dictionary goes back in front
/// as a stored block, so the two are one deflate stream; its bytes are then dropped.
fn inflate_body(bytes: &[u8]) -> Result<Vec<u8>, StoreError> {
    use std::io::Read;
    let (stream, skip) = match bytes.split_first() {
        Some((&DICTIONARY_BODY, rest)) => {
            let len = BODY_DICTIONARY.len() as u16;
            let mut stream = Vec::with_capacity(5 + BODY_DICTIONARY.len() + rest.len());
            // A stored block, not the last: its header bits, then LEN and NLEN.
            stream.push(0);
            stream.extend_from_slice(&len.to_le_bytes());
            stream.extend_from_slice(&(!len).to_le_bytes());
            stream.extend_from_slice(BODY_DICTIONARY);
            stream.extend_from_slice(rest);
            (std::borrow::Cow::Owned(stream), BODY_DICTIONARY.len())
        }
        _ => (std::borrow::Cow::Borrowed(bytes), 0),
    };
    let mut json = Vec::new();
    flate2::read::DeflateDecoder::new(stream.as_ref())
        .take(skip as u64 + MAX_BODY_BYTES + 1)
        .read_to_end(&mut json)
        .map_err(|e| corrupt(format!("Body does not inflate: {e}")))?;
    if !json.starts_with(&BODY_DICTIONARY[..skip]) {
        return Err(corrupt("Body does not inflate after its dictionary"));
    }
    json.drain(..skip);
    if json.len() as u64 > MAX_BODY_BYTES {
        return Err(corrupt("Body inflates past its limit"));
    }
    Ok(json)
}

pub(super) fn history_list(r: &StateRecord) -> AttributeValue {
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

pub(super) fn steps_list(r: &StateRecord) -> AttributeValue {
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
            if let Some(r) = &st.result_ref {
                m.insert("ResultRef".to_owned(), s(payload_ref(r)));
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
            if !st.elements.is_empty()
                && let Ok(json) = serde_json::to_string(&st.elements)
            {
                m.insert("Elements".to_owned(), s(json));
            }
            AttributeValue::M(m)
        })
        .collect();
    AttributeValue::L(steps)
}

pub(super) fn state_item(r: &StateRecord, shards: u32) -> Item {
    let listed_since = r.listed_since();
    let mut item = HashMap::from([
        // The task's id is the key's (`TASK#<id>`): no attribute of its own (a write is billed
        // by the KB, and the index entries carry the key anyway).
        ("pk".to_owned(), s(task_pk(&r.task_id))),
        ("sk".to_owned(), s("STATE")),
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
        ("Version".to_owned(), n(r.version)),
        ("CreatedAt".to_owned(), ms(r.created_at)),
        ("UpdatedAt".to_owned(), ms(r.updated_at)),
        // The state index's sort key (`StateRecord::listed_since`): changes with the state
        // only, and not between `Pending` and `Processing`.
        ("StateSince".to_owned(), ms(listed_since)),
    ]);
    // The record's own `since` where the index's sort key is not it (an active task's).
    if listed_since != r.since {
        item.insert("Since".to_owned(), ms(r.since));
    }
    // The state index (the operator's list), by state, newest first: sparse, its partition key
    // written only on a record it lists (`StateRecord::listed_by_state`). Every state-record
    // write puts the whole item, so a write that moves a run or an element into Error adds it
    // and the one moving it out removes it. `Pending` and `Processing` share one partition
    // (`Active`): a claim keeps the entry as it was, and costs the index nothing.
    if r.listed_by_state() {
        item.insert(
            "StateShard".to_owned(),
            s(state_shard_key(
                r.process_state,
                due_shard(&r.task_id, shards),
            )),
        );
    }
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
            // The layout before `Body`: the branches as their JSON text.
            if let Some(f) = &r.fanout
                && let Ok(json) = serde_json::to_string(f)
            {
                item.insert("Fanout".to_owned(), s(json));
            }
            if !r.inbox.is_empty()
                && let Ok(json) = serde_json::to_string(&r.inbox)
            {
                item.insert("Inbox".to_owned(), s(json));
            }
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
    // Small and read only with the record: its JSON text (absent while nothing is decided).
    if !r.decisions.is_empty()
        && let Ok(json) = serde_json::to_string(&r.decisions)
    {
        item.insert("Decisions".to_owned(), s(json));
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
    if let Some(d) = r.deadline {
        item.insert("Deadline".to_owned(), ms(d));
    }
    if let Some(s) = r.start_at {
        item.insert("StartAt".to_owned(), ms(s));
    }
    if r.payloads {
        item.insert("Payloads".to_owned(), AttributeValue::Bool(true));
    }
    if let Some(p) = r.purge_at {
        item.insert("PurgeAt".to_owned(), ms(p));
    }
    if let Some(p) = &r.parent
        && let Ok(json) = serde_json::to_string(p)
    {
        item.insert("Parent".to_owned(), s(json));
    }
    if let Some(g) = &r.gate
        && let Ok(json) = serde_json::to_string(g)
    {
        item.insert("Gate".to_owned(), s(json));
    }
    // A run's ledger (a distributed forEach): one byte per element opened.
    if let Some(run) = &r.run
        && let Ok(json) = serde_json::to_string(run)
    {
        item.insert("Run".to_owned(), s(json));
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

pub(super) fn shard_key(shard: u32) -> String {
    format!("due#{shard}")
}

/// The state index's partition key of a record in `state`: its state's and a shard, so that no
/// state's records all land on one GSI partition (every task passes through Processing), but one
/// for both active states (`Active#<shard>`).
pub(super) fn state_shard_key(state: ProcessState, shard: u32) -> String {
    if state.is_active() {
        format!("{ACTIVE}#{shard}")
    } else {
        per_state_shard_key(state, shard)
    }
}

/// The state index's partition name shared by `Pending` and `Processing`.
pub(super) const ACTIVE: &str = "Active";

/// The partition of `state`'s own (`<state>#<shard>`): every state's but the active ones', and
/// theirs as written before they shared one (a record not written since is still there, and
/// the lists read it).
pub(super) fn per_state_shard_key(state: ProcessState, shard: u32) -> String {
    format!("{state}#{shard}")
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

/// A record's state-index entry as the store writes it: its key (`StateShard`, `StateSince`),
/// `None` where the record is not in that index. An entry is written again (a delete and a put)
/// only when it changes.
#[cfg(any(test, feature = "testkit"))]
pub fn state_index_key(record: &StateRecord, shards: u32) -> Option<(String, i64)> {
    let item = state_item(record, shards);
    let shard = opt_s(&item, "StateShard")?;
    let since = opt_n::<i64>(&item, "StateSince").ok().flatten()?;
    Some((shard, since))
}

/// The size of a state record's entries in `due-index` and `state-index` (keys and projected
/// attributes), `None` where the record is not in that index.
#[cfg(any(test, feature = "testkit"))]
pub fn index_entry_sizes(record: &StateRecord, shards: u32) -> (Option<usize>, Option<usize>) {
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
    // Sparse: a record not listed by state (a run's, an element's) has no `StateShard`.
    let mut state_names = vec!["pk", "sk", "StateShard", "StateSince"];
    state_names.extend(STATE_INDEX_PROJECTION);
    let state = item.contains_key("StateShard").then(|| pick(&state_names));
    (due, state)
}

pub(super) fn parse_state(item: &Item) -> Result<StateRecord, StoreError> {
    let version: u64 = get_n(item, "Version")?;
    if let Some(body) = item.get("Body") {
        let AttributeValue::B(z) = body else {
            return Err(corrupt("Body is not binary"));
        };
        let body = unpack_body(z.as_ref())?;
        let mut r = record_of(item, version, body.steps, body.history)?;
        if body.fanout.is_some() {
            r.fanout = body.fanout;
        }
        r.inbox = body.inbox;
        r.timer_at = body.timer_at;
        r.priority = body.priority;
        r.tenant = body.tenant;
        return Ok(r);
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
                    result_ref: parse_payload_ref(m, "ResultRef")?,
                    loaded: None,
                    undo: opt_s(m, "Undo")
                        .map(|u| u.parse())
                        .transpose()
                        .map_err(corrupt)?,
                    undo_generation: opt_n(m, "UndoGeneration")?.unwrap_or(0),
                    waiting_until: opt_n(m, "WaitingUntil")?.map(time).transpose()?,
                    sent_until: opt_n(m, "SentUntil")?.map(time).transpose()?,
                    input_revision: opt_n(m, "InputRevision")?,
                    misconfigured: opt_n(m, "Misconfigured")?.unwrap_or(0),
                    elements: match opt_s(m, "Elements") {
                        Some(json) => serde_json::from_str(&json).map_err(|e| {
                            corrupt(format!("Elements is not a list of step states: {e}"))
                        })?,
                        None => vec![],
                    },
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
pub(super) fn record_of(
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
        task_id: state_task_id(item)?,
        workflow: get_s(item, "Workflow")?.to_owned(),
        workflow_version: get_n(item, "WorkflowVersion")?,
        pivot: opt_n(item, "Pivot")?,
        deadline: opt_n(item, "Deadline")?.map(time).transpose()?,
        start_at: opt_n(item, "StartAt")?.map(time).transpose()?,
        process_state: get_s(item, "ProcessState")?.parse().map_err(corrupt)?,
        locked_by: opt_s(item, "LockedBy"),
        complete_by: opt_n(item, "CompleteBy")?.map(time).transpose()?,
        // (In the body; a record in the older layout arms a timer per request.)
        timer_at: None,
        failure_count: get_n(item, "FailureCount")?,
        round: opt_n(item, "Round")?.unwrap_or(0),
        deferrals: opt_n(item, "Deferrals")?.unwrap_or(0),
        requeues: opt_n(item, "Requeues")?.unwrap_or(0),
        attempt: get_n(item, "Attempt")?,
        step_index: get_n(item, "StepIndex")?,
        steps,
        decisions: match opt_s(item, "Decisions") {
            Some(json) => serde_json::from_str(&json)
                .map_err(|e| corrupt(format!("Decisions is not a list of decisions: {e}")))?,
            None => vec![],
        },
        inbox: match opt_s(item, "Inbox") {
            Some(json) => serde_json::from_str(&json)
                .map_err(|e| corrupt(format!("Inbox is not a task's events: {e}")))?,
            None => Default::default(),
        },
        fanout: opt_s(item, "Fanout")
            .map(|json| {
                serde_json::from_str(&json)
                    .map_err(|e| corrupt(format!("Fanout is not a parallel group's state: {e}")))
            })
            .transpose()?,
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
        payloads: matches!(item.get("Payloads"), Some(AttributeValue::Bool(true))),
        purge_at: opt_n::<i64>(item, "PurgeAt")?.map(time).transpose()?,
        parent: opt_s(item, "Parent")
            .map(|json| {
                serde_json::from_str(&json)
                    .map_err(|e| corrupt(format!("Parent is not a parent step: {e}")))
            })
            .transpose()?,
        // (In the body.)
        priority: Default::default(),
        tenant: None,
        gate: opt_s(item, "Gate")
            .map(|json| {
                serde_json::from_str(&json)
                    .map_err(|e| corrupt(format!("Gate is not a place at a gate: {e}")))
            })
            .transpose()?,
        run: opt_s(item, "Run")
            .map(|json| {
                serde_json::from_str(&json)
                    .map_err(|e| corrupt(format!("Run is not a run's ledger: {e}")))
            })
            .transpose()?,
        due_key: opt_n::<i64>(item, "DueAt")?.map(time).transpose()?,
    })
}

/// When the record entered its state (`Since` where the index's sort key is not it, else
/// `StateSince`; a record written before either was stored: its last write).
pub(super) fn since(item: &Item) -> Result<DateTime<Utc>, StoreError> {
    match opt_n::<i64>(item, "Since")? {
        Some(ms) => time(ms),
        None => listed_since(item),
    }
}

/// The time the lists order the record by (`StateSince`: [`StateRecord::listed_since`]).
pub(super) fn listed_since(item: &Item) -> Result<DateTime<Utc>, StoreError> {
    match opt_n::<i64>(item, "StateSince")? {
        Some(ms) => time(ms),
        None => time(get_n(item, "UpdatedAt")?),
    }
}

/// A condition expression with its names and values.
#[derive(Debug, Default)]
pub(super) struct Expr {
    pub(super) clauses: Vec<String>,
    pub(super) names: HashMap<String, String>,
    pub(super) values: HashMap<String, AttributeValue>,
}

impl Expr {
    pub(super) fn name(&mut self, attr: &str) -> String {
        let placeholder = format!("#{attr}");
        self.names.insert(placeholder.clone(), attr.to_owned());
        placeholder
    }
    pub(super) fn value(&mut self, v: AttributeValue) -> String {
        let placeholder = format!(":v{}", self.values.len());
        self.values.insert(placeholder.clone(), v);
        placeholder
    }
    pub(super) fn cmp(&mut self, attr: &str, op: &str, v: AttributeValue) {
        let (k, v) = (self.name(attr), self.value(v));
        self.clauses.push(format!("{k} {op} {v}"));
    }
}

/// Translates a domain [`Condition`] to a DynamoDB condition expression: the same guards the
/// in-memory store checks with [`Condition::holds`].
pub(super) fn condition_expr(c: &Condition) -> Expr {
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

/// The task id of a state record's item: its key's (`TASK#<id>`), or the `TaskId` attribute of
/// a record written before the key alone carried it.
pub(super) fn state_task_id(item: &Item) -> Result<crate::domain::TaskId, StoreError> {
    let id = match item.get("TaskId") {
        Some(_) => get_s(item, "TaskId")?,
        None => get_s(item, "pk")?
            .strip_prefix("TASK#")
            .ok_or_else(|| corrupt("a state record's key is not TASK#<id>"))?,
    };
    id.parse()
        .map_err(|e: crate::domain::ValidationError| corrupt(e.to_string()))
}

pub(super) fn parse_summary(item: &Item) -> Result<Summary, StoreError> {
    Ok(Summary {
        task_id: state_task_id(item)?,
        workflow: get_s(item, "Workflow")?.to_owned(),
        process_state: get_s(item, "ProcessState")?.parse().map_err(corrupt)?,
        step: opt_s(item, "CurrentStep"),
        failure_count: get_n(item, "FailureCount")?,
        attempt: get_n(item, "Attempt")?,
        last_error: opt_s(item, "LastError"),
        updated_at: time(get_n(item, "UpdatedAt")?)?,
        since: listed_since(item)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::TaskId;
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
        let mut item = state_item(&r, 4);
        assert!(item.contains_key("DueShard") && item.contains_key("DueAt"));
        assert!(!item.contains_key("LockedBy"));
        assert_eq!(parse_state(&item).expect("parses"), r);
        // The id is the key's; a record written before carries it as `TaskId` too.
        assert!(!item.contains_key("TaskId"));
        item.insert("TaskId".into(), s(r.task_id.to_string()));
        assert_eq!(parse_state(&item).expect("parses"), r);
        assert_eq!(r.pivot, Some(4));
        // A task's deadline, when its workflow sets one.
        r.deadline = Some(now + chrono::Duration::days(30));
        r.start_at = Some(now + chrono::Duration::days(1));
        let item = state_item(&r, 4);
        assert!(item.contains_key("Deadline") && item.contains_key("StartAt"));
        assert_eq!(parse_state(&item).expect("parses"), r);
        assert!(!r.steps[0].undoable && r.steps[1].undoable);
        let task = Task {
            input_ref: None,
            id: r.task_id,
            workflow: r.workflow.clone(),
            workflow_version: 1,
            input: serde_json::json!({"amount": 12.5, "nested": {"a": [1, null]}}),
            input_revision: 0,
            earlier_inputs: vec![],
            reply_queue_url: None,
            created_at: now,
            caller: Caller::new("arn:aws:iam::123456789012:role/shop").expect("caller"),
            keys: vec![],
        };
        assert_eq!(parse_task(&task_item(&task, 4)).expect("parses"), task);

        r.process_state = ProcessState::Error;
        r.complete_by = None;
        r.due_key = None;
        let item = state_item(&r, 4);
        assert!(!item.contains_key("DueShard") && !item.contains_key("DueAt"));
        assert_eq!(parse_state(&item).expect("parses"), r);
    }

    /// A claim, and a return to `Pending`, leave the state-index entry's key and sort key as
    /// they were (DynamoDB writes no index entry), and the record's own `since` round-trips.
    #[test]
    fn a_claim_and_a_return_to_pending_keep_the_state_index_entry() {
        let created = crate::domain::state::to_millis(Utc::now());
        let pending = StateRecord::new(
            TaskId::new_random(),
            &examples::ecommerce_order(&crate::Policy::default()),
            None,
            created,
            created + chrono::Duration::seconds(5),
        );
        let entry = |r: &StateRecord| {
            let item = state_item(r, 4);
            (
                item.get("StateShard").cloned(),
                item.get("StateSince").cloned(),
            )
        };
        let at = |r: &StateRecord, state, later: i64| {
            let mut r = r.clone();
            r.process_state = state;
            r.since = created + chrono::Duration::seconds(later);
            r.updated_at = r.since;
            r.version += 1;
            r
        };
        let claimed = at(&pending, ProcessState::Processing, 1);
        let waiting = at(&claimed, ProcessState::Pending, 2);
        let done = at(&waiting, ProcessState::Processed, 3);
        let shard = due_shard(&pending.task_id, 4);
        assert_eq!(
            entry(&pending),
            (Some(s(format!("Active#{shard}"))), Some(ms(created)))
        );
        // The entry's key and sort key stay as they were: DynamoDB writes no index entry.
        assert_eq!(entry(&claimed), entry(&pending));
        assert_eq!(entry(&waiting), entry(&pending));
        // Each record's own `since` survives beside the entry's time.
        for r in [&pending, &claimed, &waiting, &done] {
            assert_eq!(parse_state(&state_item(r, 4)).expect("parses"), *r);
            let summary = parse_summary(&state_item(r, 4)).expect("summary");
            assert_eq!(summary.since, r.listed_since(), "{}", r.process_state);
        }
        assert!(!state_item(&pending, 4).contains_key("Since"));
        assert!(state_item(&claimed, 4).contains_key("Since"));
        // Out of the active states, the entry moves to the state's own partition, by its time.
        assert_eq!(
            entry(&done),
            (Some(s(format!("Processed#{shard}"))), Some(ms(done.since)))
        );
        assert!(!state_item(&done, 4).contains_key("Since"));
    }

    /// A distributed forEach's element carries the state index's key only in a state that needs
    /// an operator; a task always does. Read back, both are as written.
    #[test]
    fn an_element_is_in_the_state_index_only_while_it_needs_an_operator() {
        let now = crate::domain::state::to_millis(Utc::now());
        let task = StateRecord::new(
            TaskId::new_random(),
            &examples::ecommerce_order(&crate::Policy::default()),
            None,
            now,
            now + chrono::Duration::seconds(5),
        );
        let mut element = task.clone();
        element.parent = Some(crate::domain::state::ParentLink {
            task_id: TaskId::new_random(),
            step: "each".into(),
            step_index: 0,
            generation: 0,
            reply_queue_url: "https://sqs.example/q".into(),
            depth: 1,
            undo_attempt: None,
            released: false,
            element: Some(crate::domain::state::ElementOf {
                index: 7,
                task_id: TaskId::new_random(),
                step_index: 0,
                first: None,
            }),
        });
        for (state, listed) in [
            (ProcessState::Pending, false),
            (ProcessState::Error, true),
            (ProcessState::CompensationFailed, true),
            (ProcessState::Processed, false),
        ] {
            let mut e = element.clone();
            e.process_state = state;
            let item = state_item(&e, 4);
            assert_eq!(item.contains_key("StateShard"), listed, "{state}");
            assert!(item.contains_key("StateSince"), "kept: the record's since");
            assert_eq!(parse_state(&item).expect("parses"), e);
            let mut t = task.clone();
            t.process_state = state;
            assert!(state_item(&t, 4).contains_key("StateShard"), "{state}");
        }
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
        // So does a body deflated without the dictionary (the layout before it), which is
        // larger: the dictionary saves most of the first use of each name.
        let json = serde_json::to_vec(&Body {
            steps: &r.steps,
            history: &r.history,
            fanout: None,
            inbox: &r.inbox,
            timer_at: r.timer_at,
            priority: r.priority,
            tenant: r.tenant.as_deref(),
        })
        .expect("serializes");
        let mut z = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::best());
        std::io::Write::write_all(&mut z, &json).expect("deflates");
        let before = z.finish().expect("deflates");
        assert_ne!(before.first(), Some(&DICTIONARY_BODY));
        let mut old = item.clone();
        old.insert(
            "Body".into(),
            AttributeValue::B(aws_sdk_dynamodb::primitives::Blob::new(before.clone())),
        );
        assert_eq!(parse_state(&old).map_err(|e| e.to_string()), Ok(r.clone()));
        let now_body = deflate_body(&json).expect("deflates");
        assert_eq!(now_body.first(), Some(&DICTIONARY_BODY));
        assert!(
            now_body.len() + 60 < before.len(),
            "{} with the dictionary, {} without",
            now_body.len(),
            before.len()
        );
        // A dictionary body cut short is corrupt, not a shorter history.
        let mut cut = item.clone();
        cut.insert(
            "Body".into(),
            AttributeValue::B(aws_sdk_dynamodb::primitives::Blob::new(
                now_body[..now_body.len() / 2].to_vec(),
            )),
        );
        assert!(matches!(parse_state(&cut), Err(StoreError::Corrupt(_))));
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

    /// Stored bodies refer back into the dictionary's bytes: they never change (a new
    /// dictionary takes a new first byte, and this one is still read).
    #[test]
    fn the_body_dictionary_is_the_one_stored_bodies_were_deflated_against() {
        use sha2::Digest;
        let digest = sha2::Sha256::digest(BODY_DICTIONARY);
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "66d8b7910b8e9b8dcb3dc7508ab292c2ebf7dde3bc627dcb69538ff70221527b"
        );
        assert!(BODY_DICTIONARY.len() <= usize::from(u16::MAX));
    }
}
