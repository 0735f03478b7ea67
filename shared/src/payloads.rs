//! Payloads by reference, at the store's edge: [`Offloading`] wraps a state store so that what
//! it writes keeps every payload over the inline size ([`INLINE_PAYLOAD_BYTES`]) in the
//! [`Payloads`] store and only its [`PayloadRef`] in the task's items, and what it reads is
//! whole again. The domain and the handlers see whole values: a mapping or condition reads a
//! 1 MB result as if it were inline, and the domain budgets items by [`stored_bytes`].
//!
//! Which payloads: a task's input and the earlier inputs steps ran with, and each step's (and
//! forEach element's) result.
//!
//! The rule on a write: a payload's reference follows from its bytes alone, so the item
//! written is the same whoever writes it and however often (the ambiguous-write read-back
//! compares items). The object is written *before* the item that names it: a crash between the
//! two leaves an object no item names, under its task's prefix; never an item naming an object
//! that is not there.
//!
//! [`INLINE_PAYLOAD_BYTES`]: crate::domain::payload::INLINE_PAYLOAD_BYTES
//! [`stored_bytes`]: crate::domain::payload::stored_bytes

use crate::domain::payload::{MESSAGE_INLINE_BYTES, PayloadRef, is_inline};
use crate::domain::rate::Admission;
use crate::domain::run::ObjectLocation;
use crate::domain::state::StepState;
use crate::domain::transition::StepOutcome;
use crate::domain::{BreakerRecord, Caller, StateRecord, Task, TaskId};
use crate::messages::{BodyPart, StepReply, StepRequest};
use crate::ports::{
    Breakers, Clock, Count, CreateOutcome, CurrentRun, DueEntry, DueIndex, DueQuery, Guarded,
    InState, LeaseClaim, Leases, LineStream, NewTask, Page, Paging, PayloadError, Payloads,
    RateLimits, RateRequest, SlotAnswer, SlotRequest, Slots, StateStore, StoreError, TaskLists,
    TaskStore,
};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

/// The most bytes of payloads one process keeps read (a Lambda instance handles one task's
/// messages after another: a result read for one reply is read again for the next).
pub const CACHE_BYTES: usize = 64 * 1024 * 1024;

/// Payloads read or written lately, by object name: objects never change, so a cached one is
/// never stale. Oldest out first past [`CACHE_BYTES`].
#[derive(Default)]
struct Cache {
    bytes: usize,
    order: VecDeque<String>,
    kept: HashMap<String, Arc<Vec<u8>>>,
}

impl Cache {
    fn get(&self, key: &str) -> Option<Arc<Vec<u8>>> {
        self.kept.get(key).cloned()
    }

    /// Drops every object whose name starts with `prefix` (a task's, deleted).
    fn forget(&mut self, prefix: &str) {
        self.kept.retain(|k, _| !k.starts_with(prefix));
        self.order.retain(|k| !k.starts_with(prefix));
        self.bytes = self.kept.values().map(|b| b.len()).sum();
    }

    fn put(&mut self, key: String, body: Arc<Vec<u8>>) {
        if body.len() > CACHE_BYTES || self.kept.contains_key(&key) {
            return;
        }
        self.bytes += body.len();
        self.order.push_back(key.clone());
        self.kept.insert(key, body);
        while self.bytes > CACHE_BYTES {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            if let Some(b) = self.kept.remove(&oldest) {
                self.bytes -= b.len();
            }
        }
    }
}

/// A payload store that keeps what this process read or wrote lately ([`CACHE_BYTES`]), so
/// that a payload read once (a result, by the scheduler, from its reply) is neither read nor
/// written again by the same process. Objects are named by their bytes and never change, so
/// a kept one is never stale, and one known to be written need not be written again. One per
/// process, shared by [`Offloading`] and the functions' message helpers.
pub struct Cached {
    inner: Arc<dyn Payloads>,
    cache: Mutex<Cache>,
}

impl Cached {
    pub fn new(inner: Arc<dyn Payloads>) -> Self {
        Self {
            inner,
            cache: Mutex::default(),
        }
    }

    fn cached(&self, key: &str) -> Option<Arc<Vec<u8>>> {
        self.cache.lock().ok().and_then(|c| c.get(key))
    }

    fn remember(&self, key: String, body: Arc<Vec<u8>>) {
        if let Ok(mut c) = self.cache.lock() {
            c.put(key, body);
        }
    }
}

#[async_trait]
impl Payloads for Cached {
    async fn put(&self, task_id: TaskId, body: &[u8]) -> Result<PayloadRef, PayloadError> {
        let r = PayloadRef::of(task_id, body);
        if self.cached(&r.key()).is_some() {
            return Ok(r);
        }
        let kept = self.inner.put(task_id, body).await?;
        if kept != r {
            return Err(PayloadError::Corrupt(format!(
                "the payload store named {} as {}",
                r.key(),
                kept.key()
            )));
        }
        self.remember(r.key(), Arc::new(body.to_vec()));
        Ok(r)
    }

    async fn get(&self, r: &PayloadRef) -> Result<Vec<u8>, PayloadError> {
        let key = r.key();
        if let Some(b) = self.cached(&key) {
            return Ok(b.to_vec());
        }
        let body = self.inner.get(r).await?;
        self.remember(key, Arc::new(body.clone()));
        Ok(body)
    }

    async fn put_lines(
        &self,
        task_id: TaskId,
        lines: LineStream<'_>,
    ) -> Result<PayloadRef, PayloadError> {
        // Not kept: it was never whole here, and is read (whole) only by a query on it.
        self.inner.put_lines(task_id, lines).await
    }

    async fn read_url(
        &self,
        r: &PayloadRef,
        ttl: std::time::Duration,
    ) -> Result<Option<String>, PayloadError> {
        self.inner.read_url(r, ttl).await
    }

    async fn delete_task(&self, task_id: TaskId) -> Result<usize, PayloadError> {
        if let Ok(mut c) = self.cache.lock() {
            c.forget(&PayloadRef::prefix(task_id));
        }
        self.inner.delete_task(task_id).await
    }

    async fn delete(&self, r: &PayloadRef) -> Result<(), PayloadError> {
        if let Ok(mut c) = self.cache.lock() {
            c.forget(&r.key());
        }
        self.inner.delete(r).await
    }

    async fn read_object(
        &self,
        location: &ObjectLocation,
        max_bytes: usize,
    ) -> Result<Vec<u8>, PayloadError> {
        // Not cached: a user's object is named by its location, not its bytes, and may be
        // replaced under the same name; and a list is read once per run, not per message.
        self.inner.read_object(location, max_bytes).await
    }
}

/// A state store whose task items hold large payloads by reference (see the module's text).
pub struct Offloading {
    inner: Arc<dyn StateStore>,
    payloads: Arc<dyn Payloads>,
    clock: Arc<dyn Clock>,
    /// The workflows, to tell whether a JSON Lines result is read by a query (`None`: it is
    /// read back for every record, as if every query read it).
    definitions: Option<Arc<crate::catalog::Definitions>>,
}

impl Offloading {
    /// `payloads` should be the process's [`Cached`] store; `clock` tells a record whose
    /// retention ended (read as stored: see [`Offloading::whole_record`]).
    pub fn new(
        inner: Arc<dyn StateStore>,
        payloads: Arc<dyn Payloads>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self {
            inner,
            payloads,
            clock,
            definitions: None,
        }
    }

    /// Reads a JSON Lines result back for a record only if its workflow's mappings or
    /// conditions read that step ([`crate::Workflow::reads_result`]), as `definitions` say.
    pub fn with_definitions(mut self, definitions: Arc<crate::catalog::Definitions>) -> Self {
        self.definitions = Some(definitions);
        self
    }

    /// Whether step `step` of `record`'s workflow is read by one of its queries. A workflow
    /// that cannot be had says yes: reading more than needed is slower, never wrong.
    async fn read_by_queries(&self, record: &StateRecord, step: &str) -> bool {
        let Some(d) = &self.definitions else {
            return true;
        };
        match d.workflow(&record.workflow, record.workflow_version).await {
            Ok(Some(w)) => w.reads_result(step),
            _ => true,
        }
    }

    /// Keeps `text` (over the inline size) and answers its reference.
    async fn keep(&self, task: TaskId, text: &str) -> Result<PayloadRef, StoreError> {
        self.payloads
            .put(task, text.as_bytes())
            .await
            .map_err(store_error)
    }

    /// The text `r` names.
    async fn read(&self, r: &PayloadRef) -> Result<String, StoreError> {
        read_text(self.payloads.as_ref(), r).await
    }

    /// The task as stored: each input over the inline size kept, and referenced instead.
    async fn stored_task(&self, t: &Task) -> Result<Task, StoreError> {
        let mut t = t.clone();
        let text = t.input.to_string();
        let read = t.input_ref.take();
        if !is_inline(text.len()) {
            t.input_ref = Some(self.kept(t.id, &text, read).await?);
            t.input = serde_json::Value::Null;
        }
        for e in &mut t.earlier_inputs {
            let text = e.input.to_string();
            let read = e.input_ref.take();
            if !is_inline(text.len()) {
                e.input_ref = Some(self.kept(t.id, &text, read).await?);
                e.input = serde_json::Value::Null;
            }
        }
        Ok(t)
    }

    /// The record as stored: each result over the inline size kept, and referenced instead.
    async fn stored_record(&self, r: &StateRecord) -> Result<StateRecord, StoreError> {
        let mut r = r.clone();
        let id = r.task_id;
        for s in &mut r.steps {
            self.store_result(id, s).await?;
            for e in &mut s.elements {
                self.store_result(id, e).await?;
            }
        }
        for e in &mut r.inbox.kept {
            let read = e.payload_ref.take();
            if !is_inline(e.payload.len()) {
                e.payload_ref = Some(self.kept(id, &e.payload, read).await?);
                e.payload = String::new();
            }
        }
        // The domain marks a record with a large result ([`StateRecord::payloads`]); the edge
        // that keeps one says so too, whatever the caller's copy says.
        r.payloads |=
            r.steps.iter().any(|s| {
                s.result_ref.is_some() || s.elements.iter().any(|e| e.result_ref.is_some())
            }) || r.inbox.kept.iter().any(|e| e.payload_ref.is_some());
        Ok(r)
    }

    async fn store_result(&self, id: TaskId, s: &mut StepState) -> Result<(), StoreError> {
        // A JSON Lines result read back is never stored: its reference is.
        s.loaded = None;
        // A JSON Lines result stays its reference, unless a result was given since (by hand).
        if s.result.is_none() && s.result_ref.as_ref().is_some_and(|r| r.lines.is_some()) {
            return Ok(());
        }
        // The reference follows from the result alone: none without one, none for a small one.
        let read = s.result_ref.take().filter(|r| r.lines.is_none());
        if let Some(text) = &s.result
            && !is_inline(text.len())
        {
            s.result_ref = Some(self.kept(id, text, read).await?);
            s.result = None;
        }
        Ok(())
    }

    /// The reference of `text` (over the inline size): the one the item was read with if it
    /// still names these bytes (the object is there: it was read), else `text` kept now.
    async fn kept(
        &self,
        task: TaskId,
        text: &str,
        read: Option<PayloadRef>,
    ) -> Result<PayloadRef, StoreError> {
        let r = PayloadRef::of(task, text.as_bytes());
        if read.as_ref() == Some(&r) {
            return Ok(r);
        }
        self.keep(task, text).await
    }

    /// The task whole again: each referenced input read back.
    async fn whole_task(&self, mut t: Task) -> Result<Task, StoreError> {
        if let Some(r) = &t.input_ref {
            t.input = parse(&self.read(r).await?, r)?;
        }
        for e in &mut t.earlier_inputs {
            if let Some(r) = &e.input_ref {
                e.input = parse(&self.read(r).await?, r)?;
            }
        }
        Ok(t)
    }

    /// The record whole again: each referenced result read back. A record whose retention
    /// ended ([`StateRecord::purge_due`]) is answered as stored: it is read only to be purged,
    /// which needs none of its payloads (and may have deleted them already).
    async fn whole_record(&self, mut r: StateRecord) -> Result<StateRecord, StoreError> {
        if r.purge_due(self.clock.now()) {
            return Ok(r);
        }
        for i in 0..r.steps.len() {
            let lines = r.steps[i]
                .result_ref
                .as_ref()
                .filter(|p| p.lines.is_some() && r.steps[i].result.is_none())
                .cloned();
            if let Some(p) = lines
                && self.read_by_queries(&r, &r.steps[i].name).await
            {
                r.steps[i].loaded = Some(Arc::new(self.read_lines(&p).await?));
            }
            let s = &mut r.steps[i];
            self.whole_result(s).await?;
            for e in &mut s.elements {
                self.whole_result(e).await?;
            }
        }
        for e in &mut r.inbox.kept {
            if let Some(p) = &e.payload_ref
                && e.payload.is_empty()
            {
                e.payload = self.read(p).await?;
            }
        }
        Ok(r)
    }

    /// The array JSON Lines payload `r` holds.
    async fn read_lines(&self, r: &PayloadRef) -> Result<serde_json::Value, StoreError> {
        let body = self.payloads.get(r).await.map_err(store_error)?;
        crate::domain::payload::parse_lines(&body)
            .map_err(|e| StoreError::Corrupt(format!("payload {} is not JSON Lines: {e}", r.key())))
    }

    async fn whole_result(&self, s: &mut StepState) -> Result<(), StoreError> {
        // A JSON Lines result is never read back whole into `result` (see `whole_record`).
        if let Some(r) = &s.result_ref
            && r.lines.is_none()
            && s.result.is_none()
        {
            s.result = Some(self.read(r).await?);
        }
        Ok(())
    }
}

/// `reply` as sent: a success's result over [`MESSAGE_INLINE_BYTES`] kept in `payloads` and
/// referenced instead (written before the message that names it). A reply that carries a
/// reference already (a JSON Lines result, written as it was read) is sent as it is.
pub async fn packed_reply(
    payloads: &dyn Payloads,
    mut reply: StepReply,
) -> Result<StepReply, StoreError> {
    if let StepOutcome::Succeeded { result } = &mut reply.outcome
        && reply.result_ref.is_none()
        && let Some(text) = result
        && text.len() > MESSAGE_INLINE_BYTES
    {
        reply.result_ref = Some(
            payloads
                .put(reply.task_id, text.as_bytes())
                .await
                .map_err(store_error)?,
        );
        *result = None;
    }
    Ok(reply)
}

/// `reply` whole again: a result sent by reference read back into its outcome. A JSON Lines
/// result (a distributed forEach's) stays its reference: the scheduler keeps it as it is.
pub async fn unpacked_reply(
    payloads: &dyn Payloads,
    mut reply: StepReply,
) -> Result<StepReply, StoreError> {
    if reply.result_ref.as_ref().is_some_and(|r| r.lines.is_some()) {
        return Ok(reply);
    }
    if let Some(r) = reply.result_ref.take() {
        let text = read_text(payloads, &r).await?;
        reply.outcome = StepOutcome::Succeeded { result: Some(text) };
    }
    Ok(reply)
}

/// A step request's body as sent: inline when it is small; else, when what makes it large is
/// payloads the task keeps already (its input, a step's result), the body around them inline
/// and each of them by its reference ([`BodyPart`]), so a large result passed on is neither
/// written nor stored again; else the whole body kept in `payloads` and referenced.
pub struct PackedBody {
    /// The body inline, or `null` when it travels by reference; `None` when it travels in parts.
    pub input: Option<serde_json::Value>,
    pub input_ref: Option<PayloadRef>,
    pub parts: Vec<BodyPart>,
    /// With parts: the body around them (`None` when a part is the whole body).
    pub frame: Option<serde_json::Value>,
}

/// See [`PackedBody`]. A part is written before the request that names it (free when this
/// process read or wrote it: the payload store is [`Cached`]).
pub async fn packed_body(
    payloads: &dyn Payloads,
    task: &Task,
    record: &StateRecord,
    body: serde_json::Value,
) -> Result<PackedBody, StoreError> {
    let text = body.to_string();
    if text.len() <= MESSAGE_INLINE_BYTES {
        return Ok(PackedBody {
            input: Some(body),
            input_ref: None,
            parts: vec![],
            frame: None,
        });
    }
    let kept = kept_payloads(task, record);
    let mut body = body;
    let mut holes = vec![];
    carve(&mut body, String::new(), &kept, &mut holes);
    if !holes.is_empty() && body.to_string().len() <= MESSAGE_INLINE_BYTES {
        let mut parts = Vec::with_capacity(holes.len());
        let mut whole = false;
        for (at, k) in holes {
            let r = payloads
                .put(task.id, kept[k].1.as_bytes())
                .await
                .map_err(store_error)?;
            whole |= at.is_empty();
            parts.push(BodyPart { at, payload: r });
        }
        return Ok(PackedBody {
            input: None,
            input_ref: None,
            parts,
            frame: (!whole).then_some(body),
        });
    }
    let r = payloads
        .put(task.id, text.as_bytes())
        .await
        .map_err(store_error)?;
    Ok(PackedBody {
        input: Some(serde_json::Value::Null),
        input_ref: Some(r),
        parts: vec![],
        frame: None,
    })
}

/// The payloads `task` keeps by reference, each as its value and its kept text: its input and
/// every result (an element's too) over the inline size. JSON Lines results are not whole here.
fn kept_payloads(task: &Task, record: &StateRecord) -> Vec<(serde_json::Value, String)> {
    let mut kept: Vec<(serde_json::Value, String)> = vec![];
    let input = task.input.to_string();
    if !is_inline(input.len()) {
        kept.push((task.input.clone(), input));
    }
    let results = record
        .steps
        .iter()
        .flat_map(|s| std::iter::once(s).chain(s.elements.iter()))
        .filter_map(|s| s.result.as_deref())
        .filter(|t| !is_inline(t.len()));
    for text in results {
        // A result's text as the service sent it: kept under those bytes, put back as the
        // value they parse to (the value the mapping read).
        if kept.iter().any(|(_, t)| t == text) {
            continue;
        }
        if let Ok(v) = serde_json::from_str(text) {
            kept.push((v, text.to_owned()));
        }
    }
    kept
}

/// Replaces each value of `v` equal to a kept payload with `null`, noting where (a JSON
/// Pointer) and which; the first match from the top wins. Values of inline size are not
/// looked into: no kept payload is that small.
fn carve(
    v: &mut serde_json::Value,
    at: String,
    kept: &[(serde_json::Value, String)],
    holes: &mut Vec<(String, usize)>,
) {
    if let Some(k) = kept.iter().position(|(p, _)| p == v) {
        *v = serde_json::Value::Null;
        holes.push((at, k));
        return;
    }
    match v {
        serde_json::Value::Object(m) => {
            for (key, child) in m.iter_mut() {
                if large_value(child) {
                    let at = format!("{at}/{}", key.replace('~', "~0").replace('/', "~1"));
                    carve(child, at, kept, holes);
                }
            }
        }
        serde_json::Value::Array(a) => {
            for (i, child) in a.iter_mut().enumerate() {
                if large_value(child) {
                    carve(child, format!("{at}/{i}"), kept, holes);
                }
            }
        }
        _ => {}
    }
}

/// Whether `v` may hold a kept payload: a container or string over the inline size.
fn large_value(v: &serde_json::Value) -> bool {
    match v {
        serde_json::Value::Object(_) | serde_json::Value::Array(_) => {
            serde_json::to_vec(v).is_ok_and(|b| !is_inline(b.len()))
        }
        serde_json::Value::String(s) => !is_inline(s.len()),
        _ => false,
    }
}

/// A step request's body: the inline one, the one its reference names, or the inline one with
/// its parts put back where they were. A part that is not its task's, or has no place in the
/// body, makes the request corrupt.
pub async fn request_body(
    payloads: &dyn Payloads,
    request: &StepRequest,
) -> Result<serde_json::Value, StoreError> {
    if let Some(r) = &request.input_ref {
        return parse(&read_text(payloads, r).await?, r);
    }
    if request.input_parts.is_empty() {
        return Ok(request.input.clone().unwrap_or_default());
    }
    let mut body = request.input_frame.clone().unwrap_or_default();
    for part in &request.input_parts {
        let r = &part.payload;
        if r.task_id != request.task_id || r.lines.is_some() {
            return Err(StoreError::Corrupt(format!(
                "body part {} of task {} names payload {}",
                part.at,
                request.task_id,
                r.key()
            )));
        }
        let value = parse(&read_text(payloads, r).await?, r)?;
        let Some(place) = body.pointer_mut(&part.at) else {
            return Err(StoreError::Corrupt(format!(
                "body part {} of task {} has no place in its body",
                part.at, request.task_id
            )));
        };
        *place = value;
    }
    Ok(body)
}

/// The text `r` names.
async fn read_text(payloads: &dyn Payloads, r: &PayloadRef) -> Result<String, StoreError> {
    let body = payloads.get(r).await.map_err(store_error)?;
    String::from_utf8(body)
        .map_err(|_| StoreError::Corrupt(format!("payload {} is not UTF-8", r.key())))
}

fn parse(text: &str, r: &PayloadRef) -> Result<serde_json::Value, StoreError> {
    serde_json::from_str(text)
        .map_err(|e| StoreError::Corrupt(format!("payload {} is not JSON: {e}", r.key())))
}

/// A payload that cannot be read or kept, as the state store's error: a missing or changed
/// object is a corrupt task (never silently repaired); the rest as the payload store says.
pub fn store_error(e: PayloadError) -> StoreError {
    match e {
        // A payload of sas's own over its bound is as corrupt as a changed one.
        PayloadError::NotFound(_) | PayloadError::Corrupt(_) | PayloadError::TooLarge { .. } => {
            StoreError::Corrupt(e.to_string())
        }
        PayloadError::Unavailable(m) => StoreError::Unavailable(m),
        PayloadError::Rejected(m) => StoreError::Rejected(m),
    }
}

#[async_trait]
impl TaskStore for Offloading {
    async fn create(&self, new: NewTask<'_>) -> Result<CreateOutcome, StoreError> {
        let task = self.stored_task(new.task).await?;
        let mut record = self.stored_record(new.record).await?;
        record.payloads |= task.input_ref.is_some();
        let outcome = self
            .inner
            .create(NewTask {
                task: &task,
                record: &record,
                ..new
            })
            .await?;
        // The task was not stored (its key or turn belongs to another): the input object written
        // for it belongs to no task, and no purge would find it. (An error may hide a write that
        // took place: its object stays.) Crash point: dying before this delete leaves it.
        if let (CreateOutcome::KeyExists(_) | CreateOutcome::TurnTaken, Some(input)) =
            (&outcome, &task.input_ref)
            && let Err(e) = self.payloads.delete(input).await
        {
            tracing::warn!(error = %e, object = %input.key(), "the input object of a task not stored is left");
        }
        Ok(outcome)
    }

    async fn current_run(&self, schedule: &str) -> Result<Option<CurrentRun>, StoreError> {
        self.inner.current_run(schedule).await
    }

    async fn get(&self, id: TaskId) -> Result<Option<(Task, StateRecord)>, StoreError> {
        match self.inner.get(id).await? {
            Some((t, r)) => Ok(Some((
                self.whole_task(t).await?,
                self.whole_record(r).await?,
            ))),
            None => Ok(None),
        }
    }

    async fn get_state(&self, id: TaskId) -> Result<Option<StateRecord>, StoreError> {
        match self.inner.get_state(id).await? {
            Some(r) => Ok(Some(self.whole_record(r).await?)),
            None => Ok(None),
        }
    }

    async fn put_as(&self, put: Guarded<'_>, write: u64) -> Result<(), StoreError> {
        let record = self.stored_record(put.record).await?;
        self.inner
            .put_as(Guarded::new(&record, put.condition), write)
            .await
    }

    async fn put_with_input(&self, put: Guarded<'_>, task: &Task) -> Result<(), StoreError> {
        let mut record = self.stored_record(put.record).await?;
        let task = self.stored_task(task).await?;
        record.payloads |= task.input_ref.is_some();
        self.inner
            .put_with_input(Guarded::new(&record, put.condition), &task)
            .await
    }

    async fn expire_task(&self, record: &StateRecord) -> Result<(), StoreError> {
        // Only its state, times and id are read: its payloads need not be whole.
        self.inner.expire_task(record).await
    }

    fn retention(&self) -> Option<chrono::Duration> {
        self.inner.retention()
    }

    async fn forget_task(&self, record: &StateRecord) -> Result<(), StoreError> {
        // Only its id and version are read.
        self.inner.forget_task(record).await
    }
}

#[async_trait]
impl TaskLists for Offloading {
    async fn list(&self, of: InState<'_>, page: Paging<'_>) -> Result<Page, StoreError> {
        self.inner.list(of, page).await
    }
    async fn count(&self, of: InState<'_>, cap: u64) -> Result<Count, StoreError> {
        self.inner.count(of, cap).await
    }
    async fn list_by_caller(&self, caller: &Caller, page: Paging<'_>) -> Result<Page, StoreError> {
        self.inner.list_by_caller(caller, page).await
    }
    async fn list_by_key(
        &self,
        q: crate::ports::KeyQuery<'_>,
        page: Paging<'_>,
    ) -> Result<Page, StoreError> {
        self.inner.list_by_key(q, page).await
    }
}

#[async_trait]
impl crate::ports::Gates for Offloading {
    async fn enter(
        &self,
        a: crate::ports::GateAdmission<'_>,
    ) -> Result<crate::ports::GateAnswer, StoreError> {
        // The record as `put` writes it: its large payloads by reference.
        let record = self.stored_record(a.put.record).await?;
        self.inner
            .enter(crate::ports::GateAdmission {
                put: Guarded::new(&record, a.put.condition),
                ..a
            })
            .await
    }
    async fn leave(&self, place: crate::ports::GatePlace<'_>) -> Result<Vec<TaskId>, StoreError> {
        self.inner.leave(place).await
    }
    async fn gate_state(
        &self,
        place: crate::ports::GatePlace<'_>,
    ) -> Result<crate::ports::GateState, StoreError> {
        self.inner.gate_state(place).await
    }
}

#[async_trait]
impl DueIndex for Offloading {
    async fn due(&self, q: DueQuery<'_>) -> Result<Vec<DueEntry>, StoreError> {
        self.inner.due(q).await
    }
    fn due_shards(&self) -> u32 {
        self.inner.due_shards()
    }
}

#[async_trait]
impl Leases for Offloading {
    async fn acquire_lease(&self, claim: LeaseClaim<'_>) -> Result<bool, StoreError> {
        self.inner.acquire_lease(claim).await
    }
    async fn release_lease(&self, name: &str, owner: &str) -> Result<(), StoreError> {
        self.inner.release_lease(name, owner).await
    }
}

#[async_trait]
impl Breakers for Offloading {
    async fn get_breaker(&self, name: &str) -> Result<Option<BreakerRecord>, StoreError> {
        self.inner.get_breaker(name).await
    }
    async fn peek_breaker(&self, name: &str) -> Result<Option<BreakerRecord>, StoreError> {
        self.inner.peek_breaker(name).await
    }
    async fn put_breaker(&self, record: &BreakerRecord) -> Result<bool, StoreError> {
        self.inner.put_breaker(record).await
    }
    async fn mark_pace(
        &self,
        name: &str,
        mark: crate::domain::PaceMark,
    ) -> Result<bool, StoreError> {
        self.inner.mark_pace(name, mark).await
    }
}

#[async_trait]
impl RateLimits for Offloading {
    async fn admit(&self, ask: RateRequest<'_>) -> Result<Admission, StoreError> {
        self.inner.admit(ask).await
    }
}

#[async_trait]
impl Slots for Offloading {
    async fn take_slot(&self, ask: SlotRequest<'_>) -> Result<SlotAnswer, StoreError> {
        self.inner.take_slot(ask).await
    }
    async fn free_slot(&self, key: &str, holder: &str) -> Result<(), StoreError> {
        self.inner.free_slot(key, holder).await
    }
    async fn slots_held(&self, key: &str, now: DateTime<Utc>) -> Result<u32, StoreError> {
        self.inner.slots_held(key, now).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Condition;
    use crate::domain::payload::INLINE_PAYLOAD_BYTES;
    use crate::memory::MemoryStore;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Payloads in a map, counting the writes.
    #[derive(Default)]
    struct Objects {
        kept: Mutex<HashMap<String, Vec<u8>>>,
        puts: AtomicUsize,
    }

    #[async_trait]
    impl Payloads for Objects {
        async fn put(&self, task_id: TaskId, body: &[u8]) -> Result<PayloadRef, PayloadError> {
            self.puts.fetch_add(1, Ordering::SeqCst);
            let r = PayloadRef::of(task_id, body);
            self.kept
                .lock()
                .expect("lock")
                .insert(r.key(), body.to_vec());
            Ok(r)
        }
        async fn get(&self, r: &PayloadRef) -> Result<Vec<u8>, PayloadError> {
            self.kept
                .lock()
                .expect("lock")
                .get(&r.key())
                .cloned()
                .ok_or_else(|| PayloadError::NotFound(format!("payload {}", r.key())))
        }
        async fn put_lines(
            &self,
            task_id: TaskId,
            lines: LineStream<'_>,
        ) -> Result<PayloadRef, PayloadError> {
            use futures::TryStreamExt;
            self.puts.fetch_add(1, Ordering::SeqCst);
            let lines: Vec<Vec<u8>> = lines.try_collect().await?;
            let mut writer = crate::domain::payload::LinesWriter::new(task_id);
            let mut body = vec![];
            for l in &lines {
                writer.push(l, &mut body).expect("one line");
            }
            let r = writer.finish();
            self.kept.lock().expect("lock").insert(r.key(), body);
            Ok(r)
        }
        async fn delete_task(&self, task_id: TaskId) -> Result<usize, PayloadError> {
            let mut kept = self.kept.lock().expect("lock");
            let before = kept.len();
            kept.retain(|k, _| !k.starts_with(&PayloadRef::prefix(task_id)));
            Ok(before - kept.len())
        }
        async fn delete(&self, r: &PayloadRef) -> Result<(), PayloadError> {
            self.kept.lock().expect("lock").remove(&r.key());
            Ok(())
        }
        async fn read_object(
            &self,
            location: &ObjectLocation,
            _max_bytes: usize,
        ) -> Result<Vec<u8>, PayloadError> {
            // These tests keep payloads only: no user's object is ever there.
            Err(PayloadError::NotFound(format!("object {location}")))
        }
    }

    struct World {
        inner: Arc<MemoryStore>,
        objects: Arc<Objects>,
        store: Offloading,
        task: Task,
        record: StateRecord,
    }

    /// A task of the e-commerce example with an `input` of `input_bytes` (about), created.
    async fn world(input_bytes: usize) -> World {
        let w = crate::domain::workflow::examples::ecommerce_order(&Default::default());
        let now = Utc::now();
        let id = TaskId::new_random();
        let task = Task {
            id,
            workflow: w.name.clone(),
            workflow_version: w.version,
            input: serde_json::json!({"items": ["A"], "note": "n".repeat(input_bytes)}),
            input_ref: None,
            input_revision: 0,
            earlier_inputs: vec![],
            reply_queue_url: None,
            created_at: now,
            caller: Caller::anonymous(),
            keys: vec![],
        };
        let record = StateRecord::new(id, &w, None, now, now);
        let inner = Arc::new(MemoryStore::new(1));
        let objects = Arc::new(Objects::default());
        let store = Offloading::new(
            inner.clone(),
            Arc::new(Cached::new(objects.clone())),
            Arc::new(crate::ports::SystemClock),
        );
        assert_eq!(
            store
                .create(NewTask::new(&task, &record))
                .await
                .expect("creates"),
            CreateOutcome::Created
        );
        World {
            inner,
            objects,
            store,
            task,
            record,
        }
    }

    impl World {
        /// The task and its record as a handler reads them: whole.
        async fn whole(&self) -> (Task, StateRecord) {
            self.store
                .get(self.task.id)
                .await
                .expect("reads")
                .expect("stored")
        }

        /// Writes the record with step 0's result set to `result`, from the version stored.
        async fn put_result(&mut self, result: Option<String>) {
            let mut next = self.record.clone();
            next.steps[0].result = result;
            next.version += 1;
            let condition = Condition::on(&self.record, vec![]);
            self.store.put(&next, &condition).await.expect("writes");
            self.record = next;
        }
    }

    fn large(bytes: usize) -> String {
        serde_json::json!({"report": "r".repeat(bytes)}).to_string()
    }

    #[tokio::test]
    async fn a_replay_under_a_taken_key_leaves_no_object_of_the_task_not_stored() {
        let w = world(INLINE_PAYLOAD_BYTES + 10).await;
        // A task of the same large input under a key, then its replay (a new id, as the
        // submission draws one).
        let under_key = |w: &World| {
            let mut task = w.task.clone();
            task.id = TaskId::new_random();
            let record = StateRecord {
                task_id: task.id,
                ..w.record.clone()
            };
            let key = crate::ports::IdempotencyRecord {
                key: "caller#k-1".into(),
                request_hash: "h".into(),
                task_id: task.id,
                created_at: task.created_at,
            };
            (task, record, key)
        };
        let (first, first_record, first_key) = under_key(&w);
        let stored = w
            .store
            .create(NewTask {
                key: Some(&first_key),
                ..NewTask::new(&first, &first_record)
            })
            .await
            .expect("creates");
        assert_eq!(stored, CreateOutcome::Created);
        let (replay, replay_record, replay_key) = under_key(&w);
        let outcome = w
            .store
            .create(NewTask {
                key: Some(&replay_key),
                ..NewTask::new(&replay, &replay_record)
            })
            .await
            .expect("answers");
        assert!(
            matches!(&outcome, CreateOutcome::KeyExists(k) if k.task_id == first.id),
            "{outcome:?}"
        );
        let kept = w.objects.kept.lock().expect("lock");
        assert!(
            kept.keys()
                .all(|k| !k.starts_with(&PayloadRef::prefix(replay.id))),
            "the replay's input object is deleted: {:?}",
            kept.keys()
        );
        assert!(
            kept.keys()
                .any(|k| k.starts_with(&PayloadRef::prefix(first.id))),
            "the stored task's input is kept"
        );
    }

    #[tokio::test]
    async fn a_large_input_and_result_are_kept_by_reference_and_read_back_whole() {
        let mut w = world(INLINE_PAYLOAD_BYTES + 10).await;
        let (stored_task, _) = w
            .inner
            .get(w.task.id)
            .await
            .expect("reads")
            .expect("stored");
        assert_eq!(stored_task.input, serde_json::Value::Null);
        let input_ref = stored_task
            .input_ref
            .clone()
            .expect("the input by reference");
        assert_eq!(
            input_ref,
            PayloadRef::of(w.task.id, w.task.input.to_string().as_bytes())
        );

        let result = large(1024 * 1024);
        w.put_result(Some(result.clone())).await;
        let stored = w
            .inner
            .get_state(w.task.id)
            .await
            .expect("reads")
            .expect("stored");
        assert_eq!(
            stored.steps[0].result, None,
            "the record holds no 1 MB result"
        );
        let r = stored.steps[0].result_ref.clone().expect("a reference");
        assert_eq!(r.bytes, result.len() as u64);
        assert!(serde_json::to_string(&stored).expect("json").len() < 16 * 1024);

        let (task, record) = w
            .store
            .get(w.task.id)
            .await
            .expect("reads")
            .expect("stored");
        assert_eq!(task.input, w.task.input, "the input whole");
        assert_eq!(record.steps[0].result.as_deref(), Some(result.as_str()));
        assert_eq!(
            w.store
                .get_state(w.task.id)
                .await
                .expect("reads")
                .expect("stored")
                .steps[0]
                .result,
            Some(result)
        );
    }

    #[tokio::test]
    async fn a_small_payload_stays_inline_and_a_cleared_result_drops_its_reference() {
        let mut w = world(10).await;
        let (t, _) = w
            .inner
            .get(w.task.id)
            .await
            .expect("reads")
            .expect("stored");
        assert!(t.input_ref.is_none() && t.input == w.task.input);
        let small = large(INLINE_PAYLOAD_BYTES - 100);
        w.put_result(Some(small.clone())).await;
        let s = w.inner.get_state(w.task.id).await.expect("r").expect("s");
        assert_eq!(
            (s.steps[0].result.clone(), s.steps[0].result_ref.clone()),
            (Some(small), None)
        );

        w.put_result(Some(large(INLINE_PAYLOAD_BYTES))).await;
        // Read whole (the reference kept beside the result), then cleared: no reference left.
        w.record = w.store.get_state(w.task.id).await.expect("r").expect("s");
        assert!(w.record.steps[0].result_ref.is_some());
        w.put_result(None).await;
        let s = w.inner.get_state(w.task.id).await.expect("r").expect("s");
        assert_eq!(
            (s.steps[0].result.clone(), s.steps[0].result_ref.clone()),
            (None, None)
        );
        assert_eq!(
            w.objects.puts.load(Ordering::SeqCst),
            1,
            "one large payload written"
        );
    }

    #[tokio::test]
    async fn a_payload_is_written_once_however_often_its_record_is() {
        let mut w = world(10).await;
        let result = large(100 * 1024);
        for _ in 0..3 {
            w.put_result(Some(result.clone())).await;
        }
        // Another process (an empty cache) writes the same item, and the same object name.
        let other = Offloading::new(
            w.inner.clone(),
            Arc::new(Cached::new(w.objects.clone())),
            Arc::new(crate::ports::SystemClock),
        );
        let mut next = w.record.clone();
        next.version += 1;
        other
            .put(&next, &Condition::on(&w.record, vec![]))
            .await
            .expect("writes");
        assert_eq!(w.objects.puts.load(Ordering::SeqCst), 2);
        assert_eq!(w.objects.kept.lock().expect("lock").len(), 1);
        let read = other.get_state(w.task.id).await.expect("r").expect("s");
        assert_eq!(read.steps[0].result, Some(result));

        // A process with no cache at all (a supervisor whose cache dropped it) that read the
        // record whole writes it back without writing its object: the object is there.
        let bare = Offloading::new(
            w.inner.clone(),
            w.objects.clone(),
            Arc::new(crate::ports::SystemClock),
        );
        let seen = bare.get_state(w.task.id).await.expect("r").expect("s");
        let mut again = seen.clone();
        again.version += 1;
        bare.put(&again, &Condition::on(&seen, vec![]))
            .await
            .expect("writes");
        assert_eq!(
            w.objects.puts.load(Ordering::SeqCst),
            2,
            "no object written"
        );
    }

    /// A step whose result is JSON Lines keeps its reference in the record however often the
    /// record is read and written; read back, its array is in `loaded` (the mappings' result),
    /// never in `result`; a result given later (by hand) replaces it.
    #[tokio::test]
    async fn a_json_lines_result_stays_its_reference_and_is_read_back_only_as_the_array() {
        let mut w = world(10).await;
        let lines: Vec<Vec<u8>> = (0..500)
            .map(|k| {
                serde_json::json!({"k": k, "pad": "p".repeat(100)})
                    .to_string()
                    .into_bytes()
            })
            .collect();
        let stream = futures::stream::iter(lines.into_iter().map(Ok)).boxed();
        use futures::StreamExt;
        let r = w.objects.put_lines(w.task.id, stream).await.expect("kept");
        let mut next = w.record.clone();
        next.steps[0].result_ref = Some(r.clone());
        next.version += 1;
        w.store
            .put(&next, &Condition::on(&w.record, vec![]))
            .await
            .expect("writes");
        w.record = next;
        let stored = w.inner.get_state(w.task.id).await.expect("r").expect("s");
        assert_eq!(stored.steps[0].result_ref.as_ref(), Some(&r));
        assert_eq!(stored.steps[0].result, None);
        assert!(stored.payloads, "the task's retention deletes its objects");
        let read = w.store.get_state(w.task.id).await.expect("r").expect("s");
        assert_eq!(read.steps[0].result, None, "never read back whole as text");
        let array = read.steps[0].loaded.clone().expect("read for the queries");
        assert_eq!(array.as_array().map(Vec::len), Some(500));
        assert_eq!(array[499]["k"], 499);
        assert_eq!(
            read.results()["reserve-inventory"]["result"][3]["k"],
            3,
            "the mappings read the array"
        );
        assert_eq!(
            read.results_bytes(),
            r.stored_bytes(),
            "budgeted as its reference"
        );
        // Written back as read (with its array): the reference, and no object more.
        let puts = w.objects.puts.load(Ordering::SeqCst);
        let mut again = read.clone();
        again.version += 1;
        w.store
            .put(&again, &Condition::on(&read, vec![]))
            .await
            .expect("writes");
        let stored = w.inner.get_state(w.task.id).await.expect("r").expect("s");
        assert_eq!(
            (
                stored.steps[0].result_ref.as_ref(),
                stored.steps[0].loaded.as_ref()
            ),
            (Some(&r), None)
        );
        assert_eq!(w.objects.puts.load(Ordering::SeqCst), puts);
        w.record = again;
        // A result given by hand replaces it.
        w.put_result(Some("{\"by\":\"hand\"}".into())).await;
        let stored = w.inner.get_state(w.task.id).await.expect("r").expect("s");
        assert_eq!(
            (
                stored.steps[0].result.as_deref(),
                stored.steps[0].result_ref.as_ref()
            ),
            (Some("{\"by\":\"hand\"}"), None)
        );
    }

    #[tokio::test]
    async fn a_missing_payload_is_a_corrupt_task_never_an_empty_one() {
        let mut w = world(10).await;
        w.put_result(Some(large(20 * 1024))).await;
        w.objects.delete_task(w.task.id).await.expect("deletes");
        let fresh = Offloading::new(
            w.inner.clone(),
            Arc::new(Cached::new(w.objects.clone())),
            Arc::new(crate::ports::SystemClock),
        );
        assert!(matches!(
            fresh.get_state(w.task.id).await,
            Err(StoreError::Corrupt(m)) if m.contains("not found")
        ));
    }

    /// `body` packed for a request of `task`.
    async fn pack(
        payloads: &dyn Payloads,
        task: &Task,
        record: &StateRecord,
        body: serde_json::Value,
    ) -> PackedBody {
        packed_body(payloads, task, record, body)
            .await
            .expect("packs")
    }

    /// A step request of `w`'s task carrying `body` as packed.
    fn request_of(w: &World, body: PackedBody) -> StepRequest {
        let mut request: StepRequest = serde_json::from_value(serde_json::json!({
            "taskId": w.task.id,
            "workflow": w.task.workflow,
            "workflowVersion": w.task.workflow_version,
            "step": "report",
            "stepIndex": 1,
            "service": "reports",
            "action": "file",
            "attempt": 1,
            "completeBy": Utc::now(),
            "replyQueueUrl": "q",
            "input": null,
        }))
        .expect("a request");
        request.input = body.input;
        request.input_ref = body.input_ref;
        request.input_parts = body.parts;
        request.input_frame = body.frame;
        request
    }

    /// `request` as an agent reads it off the queue.
    fn sent(request: &StepRequest) -> (String, StepRequest) {
        let text = serde_json::to_string(request).expect("json");
        let read = serde_json::from_str(&text).expect("reads back");
        (text, read)
    }

    fn object_names(w: &World) -> Vec<String> {
        let mut names: Vec<String> = w
            .objects
            .kept
            .lock()
            .expect("lock")
            .keys()
            .cloned()
            .collect();
        names.sort();
        names
    }

    #[tokio::test]
    async fn a_large_result_passed_on_travels_as_a_part_and_is_not_kept_again() {
        let mut w = world(10).await;
        let result = large(1024 * 1024);
        w.put_result(Some(result.clone())).await;
        let (task, record) = w.whole().await;
        let value: serde_json::Value = serde_json::from_str(&result).expect("json");
        let kept = PayloadRef::of(w.task.id, result.as_bytes());
        // As the scheduler's process holds it: the result read from its reply.
        let payloads = Cached::new(w.objects.clone());
        payloads.get(&kept).await.expect("the result is kept");
        let names = object_names(&w);
        let puts = w.objects.puts.load(Ordering::SeqCst);

        let body = serde_json::json!({"orderId": "o-1", "a/b~c": value.clone()});
        let packed = pack(&payloads, &task, &record, body.clone()).await;
        assert_eq!(packed.input, None, "no whole body");
        assert_eq!(packed.input_ref, None, "no new object for the body");
        assert_eq!(
            packed.parts,
            vec![BodyPart {
                at: "/a~1b~0c".into(),
                payload: kept.clone()
            }]
        );
        assert_eq!(
            packed.frame,
            Some(serde_json::json!({"orderId": "o-1", "a/b~c": null}))
        );
        let request = request_of(&w, packed);
        let (text, read) = sent(&request);
        assert!(text.len() < 1024, "the message is small: {text}");
        assert!(
            !text.contains("\"input\""),
            "no input an older agent could read: {text}"
        );
        assert_eq!(
            request_body(&payloads, &read).await.expect("reads"),
            body,
            "the body whole again"
        );

        // The result as the whole body.
        let packed = pack(&payloads, &task, &record, value.clone()).await;
        assert_eq!((packed.parts.len(), packed.parts[0].at.as_str()), (1, ""));
        assert_eq!(packed.frame, None);
        let (_, read) = sent(&request_of(&w, packed));
        assert_eq!(request_body(&payloads, &read).await.expect("reads"), value);

        assert_eq!(object_names(&w), names, "no object written");
        assert_eq!(w.objects.puts.load(Ordering::SeqCst), puts, "no write made");
        // Older agents read `input` whole: a request in parts is one they cannot read.
        #[derive(serde::Deserialize)]
        #[allow(dead_code)]
        struct OlderRequest {
            input: serde_json::Value,
        }
        assert!(serde_json::from_str::<OlderRequest>(&text).is_err());
    }

    #[tokio::test]
    async fn a_large_body_of_new_bytes_is_kept_whole_and_a_small_one_travels_inline() {
        let mut w = world(INLINE_PAYLOAD_BYTES + 10).await;
        w.put_result(Some(large(20 * 1024))).await;
        let (task, record) = w.whole().await;
        let payloads = Cached::new(w.objects.clone());
        // Large, but neither the input nor a result: kept whole.
        let body = serde_json::json!({"summary": "s".repeat(MESSAGE_INLINE_BYTES)});
        let packed = pack(&payloads, &task, &record, body.clone()).await;
        assert!(packed.parts.is_empty());
        assert_eq!(packed.input, Some(serde_json::Value::Null));
        let r = packed.input_ref.clone().expect("by reference");
        assert_eq!(r, PayloadRef::of(w.task.id, body.to_string().as_bytes()));
        let (_, read) = sent(&request_of(&w, packed));
        assert_eq!(request_body(&payloads, &read).await.expect("reads"), body);

        // Large parts, but what is left is large too: kept whole.
        let body = serde_json::json!({
            "input": task.input.clone(),
            "summary": "s".repeat(MESSAGE_INLINE_BYTES),
        });
        let packed = pack(&payloads, &task, &record, body.clone()).await;
        assert!(packed.parts.is_empty() && packed.input_ref.is_some());

        // The task's input passed on, the body under the message's size: inline.
        let body = serde_json::json!({"input": task.input.clone()});
        let packed = pack(&payloads, &task, &record, body.clone()).await;
        assert_eq!((packed.input, packed.input_ref), (Some(body), None));
        assert!(packed.parts.is_empty());
    }

    #[tokio::test]
    async fn the_task_input_and_a_result_over_a_message_travel_as_two_parts() {
        let mut w = world(MESSAGE_INLINE_BYTES).await;
        let result = large(MESSAGE_INLINE_BYTES);
        w.put_result(Some(result.clone())).await;
        let (task, record) = w.whole().await;
        let payloads = Cached::new(w.objects.clone());
        let value: serde_json::Value = serde_json::from_str(&result).expect("json");
        let body = serde_json::json!({"order": task.input.clone(), "lines": [1, value.clone()]});
        let packed = pack(&payloads, &task, &record, body.clone()).await;
        let at: Vec<&str> = packed.parts.iter().map(|p| p.at.as_str()).collect();
        assert_eq!(at, ["/lines/1", "/order"]);
        let (_, read) = sent(&request_of(&w, packed));
        assert_eq!(request_body(&payloads, &read).await.expect("reads"), body);
    }

    #[tokio::test]
    async fn an_older_request_reads_as_sent_and_a_part_out_of_place_is_corrupt() {
        let mut w = world(10).await;
        let payloads = Cached::new(w.objects.clone());
        let older = request_of(
            &w,
            PackedBody {
                input: Some(serde_json::Value::Null),
                input_ref: None,
                parts: vec![],
                frame: None,
            },
        );
        let (_, read) = sent(&older);
        assert_eq!(
            request_body(&payloads, &read).await.expect("reads"),
            serde_json::Value::Null
        );

        let result = large(MESSAGE_INLINE_BYTES);
        w.put_result(Some(result.clone())).await;
        let own = PayloadRef::of(w.task.id, result.as_bytes());
        let parted = |at: &str, payload: PayloadRef| PackedBody {
            input: None,
            input_ref: None,
            parts: vec![BodyPart {
                at: at.into(),
                payload,
            }],
            frame: Some(serde_json::json!({"report": null})),
        };
        let (_, read) = sent(&request_of(&w, parted("/report", own.clone())));
        assert!(request_body(&payloads, &read).await.is_ok());
        // Another task's payload, though its bytes are there.
        let other = PayloadRef {
            task_id: TaskId::new_random(),
            ..own.clone()
        };
        let (_, read) = sent(&request_of(&w, parted("/report", other)));
        assert!(matches!(
            request_body(&payloads, &read).await,
            Err(StoreError::Corrupt(m)) if m.contains("names payload")
        ));
        // A place the frame does not have.
        let (_, read) = sent(&request_of(&w, parted("/summary/0", own)));
        assert!(matches!(
            request_body(&payloads, &read).await,
            Err(StoreError::Corrupt(m)) if m.contains("no place")
        ));
    }
}
