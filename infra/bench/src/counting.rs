//! Counting wrappers around the ports: every AWS API call the handlers make, by service and
//! call, and the capacity DynamoDB bills for it (from the items' sizes, by DynamoDB's rules).
//! Queue receives and deletes are not counted here: in Lambda the event source mapping makes
//! them, and the cost model adds them per message.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sas::aws::{index_entry_sizes, state_record_size, stored_sizes};
use sas::domain::{BreakerRecord, Condition, ProcessState, StateRecord, Task, TaskId};
use sas::ports::{
    Catalog, CreateOutcome, Cursor, DueEntry, Entry, EventBus, IdempotencyRecord, Kind, Page,
    PublishError, Published, Queue, QueueError, ReceivedMessage, StateStore, StoreError, Stored,
};
use sas_local::provision::Resources;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What was counted.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Counts {
    /// "Service Call" → calls.
    pub calls: BTreeMap<String, u64>,
    /// DynamoDB write and read request units (on-demand).
    pub wru: f64,
    pub rru: f64,
    /// Messages sent, by the queue's role (`work`, `replies`, `timers`, `agent`, `client`).
    pub messages: BTreeMap<String, u64>,
    /// EventBridge events (64 KB chunks).
    pub events: u64,
    /// Every DynamoDB write, in order, with what it billed where.
    pub writes: Vec<WriteUnits>,
    /// Partition key (an item's `pk`, or a GSI's partition key value, named by its index) →
    /// the write and read units it took: what a hot key would show.
    pub keys: BTreeMap<String, (f64, f64)>,
}

/// One DynamoDB write's bill: the write request units on the table's item and on each index
/// entry it added, moved or removed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WriteUnits {
    /// What the write did (`create`, a transition's name, `breaker`, ...).
    pub label: String,
    /// The size of the item written (the larger of old and new, which is what DynamoDB bills).
    pub item_bytes: usize,
    pub table: f64,
    pub due_index: f64,
    pub state_index: f64,
    pub caller_index: f64,
}

impl WriteUnits {
    fn small(label: &str) -> Self {
        Self {
            label: label.to_owned(),
            item_bytes: 0,
            table: 1.0,
            ..Self::default()
        }
    }
    pub fn total(&self) -> f64 {
        self.table + self.due_index + self.state_index + self.caller_index
    }
}

impl Counts {
    pub fn call(&self, name: &str) -> u64 {
        self.calls.get(name).copied().unwrap_or(0)
    }
    pub fn dynamodb_writes(&self) -> u64 {
        ["DynamoDB PutItem", "DynamoDB TransactWriteItems"]
            .iter()
            .map(|c| self.call(c))
            .sum()
    }
    pub fn has_scan(&self) -> bool {
        self.calls.keys().any(|k| k.contains("Scan"))
    }
    /// The write units billed on the table's items and on each index, summed over the writes.
    pub fn wru_by_place(&self) -> WriteUnits {
        let mut sum = WriteUnits {
            label: "all writes".into(),
            ..WriteUnits::default()
        };
        for w in &self.writes {
            sum.table += w.table;
            sum.due_index += w.due_index;
            sum.state_index += w.state_index;
            sum.caller_index += w.caller_index;
        }
        sum
    }
}

/// The shared counter; with a latency, every counted call also waits that long (a modeled
/// round trip, for runs that measure time rather than count calls).
#[derive(Debug, Default)]
pub struct Meter(Mutex<Counts>, std::sync::OnceLock<Duration>);

impl Meter {
    /// A meter whose counted calls each take `latency`.
    pub fn with_latency(latency: Duration) -> Self {
        let m = Self::default();
        let _ = m.1.set(latency);
        m
    }
    /// The modeled round trip of one call (nothing without a latency).
    async fn io(&self) {
        if let Some(d) = self.1.get() {
            tokio::time::sleep(*d).await;
        }
    }
    fn add(&self, f: impl FnOnce(&mut Counts)) {
        if let Ok(mut c) = self.0.lock() {
            f(&mut c);
        }
    }
    fn call(&self, name: &str) {
        self.add(|c| *c.calls.entry(name.to_owned()).or_default() += 1);
    }
    fn key(&self, key: String, wru: f64, rru: f64) {
        self.add(|c| {
            let k = c.keys.entry(key).or_default();
            k.0 += wru;
            k.1 += rru;
        });
    }
    fn write(&self, w: WriteUnits) {
        self.add(|c| {
            c.wru += w.total();
            c.writes.push(w);
        });
    }
    pub fn take(&self) -> Counts {
        self.0
            .lock()
            .map(|mut c| std::mem::take(&mut *c))
            .unwrap_or_default()
    }
}

fn units(bytes: usize, unit: usize) -> f64 {
    bytes.div_ceil(unit).max(1) as f64
}

/// The state store, counted.
pub struct CountingStore {
    pub inner: Arc<dyn StateStore>,
    pub meter: Arc<Meter>,
    pub shards: u32,
}

#[async_trait]
impl StateStore for CountingStore {
    async fn create(
        &self,
        task: &Task,
        record: &StateRecord,
        key: Option<&IdempotencyRecord>,
    ) -> Result<CreateOutcome, StoreError> {
        self.meter.call("DynamoDB TransactWriteItems");
        self.meter.io().await;
        let (o, r) = stored_sizes(task, record, self.shards);
        let (due, state) = index_entry_sizes(record, self.shards);
        let key_units = if key.is_some() { 1.0 } else { 0.0 };
        // Transactions bill twice per item on the table; index entries once (the caller
        // index's entry of the task item: its keys, under 1 KB).
        let shard = record.due_shard(self.shards);
        self.meter.key(
            format!("TASK#<id>: {}", task.id),
            2.0 * (units(o, 1024) + units(r, 1024)),
            0.0,
        );
        if let Some(k) = key {
            self.meter.key(format!("IDEM#: {}", k.key), 2.0, 0.0);
        }
        if let Some(d) = due {
            self.meter
                .key(format!("due-index due#{shard}"), units(d, 1024), 0.0);
        }
        self.meter.key(
            format!("state-index {}#{shard}", record.process_state),
            units(state, 1024),
            0.0,
        );
        // The caller's partition of its tasks' index, as the DynamoDB store files it.
        let caller_shard = sas::domain::state::due_shard(&task.id, sas::aws::DEFAULT_CALLER_SHARDS);
        self.meter.key(
            format!("caller-shard-index {}", task.caller.index_key(caller_shard)),
            1.0,
            0.0,
        );
        self.meter.write(WriteUnits {
            label: "create (task, state, key: a transaction)".into(),
            item_bytes: o + r,
            table: 2.0 * (units(o, 1024) + units(r, 1024) + key_units),
            due_index: due.map_or(0.0, |d| units(d, 1024)),
            state_index: units(state, 1024),
            caller_index: 1.0,
        });
        self.inner.create(task, record, key).await
    }
    async fn get(&self, id: TaskId) -> Result<Option<(Task, StateRecord)>, StoreError> {
        self.meter.call("DynamoDB Query");
        self.meter.io().await;
        let out = self.inner.get(id).await?;
        let size = out.as_ref().map_or(0, |(o, r)| {
            let (a, b) = stored_sizes(o, r, self.shards);
            a + b
        });
        self.meter.add(|c| c.rru += units(size, 4096));
        self.meter
            .key(format!("TASK#<id>: {id}"), 0.0, units(size, 4096));
        Ok(out)
    }
    async fn get_state(&self, id: TaskId) -> Result<Option<StateRecord>, StoreError> {
        self.meter.call("DynamoDB GetItem");
        self.meter.io().await;
        let out = self.inner.get_state(id).await?;
        self.meter.add(|c| c.rru += 1.0);
        self.meter.key(format!("TASK#<id>: {id}"), 0.0, 1.0);
        Ok(out)
    }
    async fn put_as(
        &self,
        record: &StateRecord,
        condition: &Condition,
        write: u64,
    ) -> Result<(), StoreError> {
        self.meter.call("DynamoDB PutItem");
        self.meter.io().await;
        // The bill depends on the item replaced: read it (uncounted; the handlers never do).
        let old = self.inner.get_state(record.task_id).await.ok().flatten();
        let out = self.inner.put_as(record, condition, write).await;
        let new_size = state_record_size(record, self.shards);
        let old_size = old
            .as_ref()
            .map_or(0, |o| state_record_size(o, self.shards));
        let mut w = WriteUnits {
            label: sas::domain::write_label(record, condition),
            item_bytes: new_size.max(old_size),
            table: units(new_size.max(old_size), 1024),
            ..WriteUnits::default()
        };
        if out.is_ok() {
            let (new_due, new_state) = index_entry_sizes(record, self.shards);
            let (old_due, old_state) = old
                .as_ref()
                .map_or((None, 0), |o| index_entry_sizes(o, self.shards));
            let due_moved = old.as_ref().map(|o| o.due_key) != Some(record.due_key);
            w.due_index = match (old_due, new_due) {
                (Some(a), Some(b)) if due_moved => units(a, 1024) + units(b, 1024),
                (Some(_), Some(_)) => 0.0,
                (Some(a), None) | (None, Some(a)) => units(a, 1024),
                (None, None) => 0.0,
            };
            // The state index's keys (`StateShard`, `StateSince`) change only with the state: then
            // a delete and a put; its projected attributes (id, workflow) never change.
            let state_moved = old.as_ref().map(|o| (o.process_state, o.since))
                != Some((record.process_state, record.since));
            w.state_index = match &old {
                Some(_) if state_moved => units(old_state, 1024) + units(new_state, 1024),
                Some(_) => 0.0,
                None => units(new_state, 1024),
            };
            // By key: the item, its due shard, and the state index's old and new partitions.
            let shard = record.due_shard(self.shards);
            if w.due_index > 0.0 {
                self.meter
                    .key(format!("due-index due#{shard}"), w.due_index, 0.0);
            }
            if let Some(o) = old.as_ref().filter(|_| w.state_index > 0.0) {
                self.meter.key(
                    format!("state-index {}#{shard}", o.process_state),
                    units(old_state, 1024),
                    0.0,
                );
                self.meter.key(
                    format!("state-index {}#{shard}", record.process_state),
                    units(new_state, 1024),
                    0.0,
                );
            }
        } else {
            w.label = format!("{} (condition failed)", w.label);
        }
        self.meter
            .key(format!("TASK#<id>: {}", record.task_id), w.table, 0.0);
        self.meter.write(w);
        out
    }
    async fn due(
        &self,
        shard: u32,
        now: DateTime<Utc>,
        limit: usize,
        after: Option<&DueEntry>,
    ) -> Result<Vec<DueEntry>, StoreError> {
        self.meter.call("DynamoDB Query (due-index)");
        self.meter.io().await;
        self.meter.add(|c| c.rru += 0.5);
        self.meter.key(format!("due-index due#{shard}"), 0.0, 0.5);
        self.inner.due(shard, now, limit, after).await
    }
    fn due_shards(&self) -> u32 {
        self.inner.due_shards()
    }
    async fn acquire_lease(
        &self,
        name: &str,
        owner: &str,
        now: DateTime<Utc>,
        ttl: chrono::Duration,
    ) -> Result<bool, StoreError> {
        self.meter.call("DynamoDB PutItem (lease)");
        self.meter.io().await;
        self.meter.write(WriteUnits::small("lease"));
        self.meter.key(format!("LEASE#{name}"), 1.0, 0.0);
        self.inner.acquire_lease(name, owner, now, ttl).await
    }
    async fn release_lease(&self, name: &str, owner: &str) -> Result<(), StoreError> {
        self.meter.call("DynamoDB PutItem (lease)");
        self.meter.io().await;
        self.meter.write(WriteUnits::small("lease released"));
        self.meter.key(format!("LEASE#{name}"), 1.0, 0.0);
        self.inner.release_lease(name, owner).await
    }
    async fn get_breaker(&self, name: &str) -> Result<Option<BreakerRecord>, StoreError> {
        self.meter.call("DynamoDB GetItem (breaker)");
        self.meter.io().await;
        self.meter.add(|c| c.rru += 1.0);
        self.meter.key(format!("BREAKER#{name}"), 0.0, 1.0);
        self.inner.get_breaker(name).await
    }
    async fn put_breaker(&self, record: &BreakerRecord) -> Result<bool, StoreError> {
        self.meter.call("DynamoDB PutItem (breaker)");
        self.meter.io().await;
        self.meter.write(WriteUnits::small("breaker"));
        self.meter.key(format!("BREAKER#{}", record.name), 1.0, 0.0);
        self.inner.put_breaker(record).await
    }
    async fn list(
        &self,
        state: ProcessState,
        workflow: Option<&str>,
        limit: usize,
        after: Option<&Cursor>,
    ) -> Result<Page, StoreError> {
        self.meter.call("DynamoDB Query (state-index)");
        self.meter.io().await;
        self.meter.add(|c| c.rru += 0.5);
        self.inner.list(state, workflow, limit, after).await
    }
    async fn put_with_input(
        &self,
        record: &StateRecord,
        condition: &sas::domain::Condition,
        task: &Task,
    ) -> Result<(), StoreError> {
        self.meter
            .call("DynamoDB TransactWriteItems (input + state)");
        self.inner.put_with_input(record, condition, task).await
    }
    async fn count(
        &self,
        state: ProcessState,
        workflow: Option<&str>,
        cap: u64,
    ) -> Result<sas::ports::Count, StoreError> {
        self.meter.call("DynamoDB Query (state-index, count)");
        self.meter.io().await;
        self.meter.add(|c| c.rru += 0.5);
        self.inner.count(state, workflow, cap).await
    }
    async fn expire_task(&self, record: &StateRecord) -> Result<(), StoreError> {
        if record.process_state.is_final() {
            // An UpdateItem of the task item, billed on its size.
            self.meter.call("DynamoDB UpdateItem (retention)");
            self.meter.io().await;
            self.meter.write(WriteUnits::small("retention"));
        }
        self.inner.expire_task(record).await
    }
    async fn admit(
        &self,
        key: &str,
        limit: &sas::domain::rate::RateLimit,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<sas::domain::rate::Admission, StoreError> {
        // One conditional UpdateItem of a small item (the caller's TAT): 1 WRU.
        self.meter.call("DynamoDB UpdateItem (rate limit)");
        self.meter.io().await;
        self.meter.write(WriteUnits::small("rate limit"));
        self.meter.key(format!("RATE#{key}"), 1.0, 0.0);
        self.inner.admit(key, limit, now).await
    }
    async fn list_by_caller(
        &self,
        caller: &sas::Caller,
        limit: usize,
        after: Option<&Cursor>,
    ) -> Result<Page, StoreError> {
        // A Query of the caller index, then a BatchGetItem of the page's state records.
        self.meter.call("DynamoDB Query (caller-shard-index)");
        self.meter.call("DynamoDB BatchGetItem");
        self.meter.io().await;
        self.meter.add(|c| c.rru += 0.5 + 0.5 * limit as f64);
        self.inner.list_by_caller(caller, limit, after).await
    }
}

/// The catalog (in the same table), counted: each read is one strongly consistent `GetItem`
/// of the catalog's head or of one definition version, each publish one transaction.
pub struct CountingCatalog {
    pub inner: Arc<dyn Catalog>,
    pub meter: Arc<Meter>,
}

#[async_trait]
impl Catalog for CountingCatalog {
    async fn publish(
        &self,
        kind: Kind,
        name: &str,
        body: &serde_json::Value,
        now: DateTime<Utc>,
    ) -> Result<Published, StoreError> {
        self.meter.call("DynamoDB TransactWriteItems (catalog)");
        self.meter.io().await;
        let size = body.to_string().len();
        self.meter.add(|c| c.wru += 2.0 * (units(size, 1024) + 1.0));
        self.inner.publish(kind, name, body, now).await
    }
    async fn definition(
        &self,
        kind: Kind,
        name: &str,
        version: Option<u32>,
    ) -> Result<Option<Stored>, StoreError> {
        // Without a version, the catalog's head is read first for the newest one.
        let reads = if version.is_some() { 1 } else { 2 };
        let out = self.inner.definition(kind, name, version).await?;
        let size = out.as_ref().map_or(0, |s| s.body.to_string().len());
        self.meter.add(|c| {
            *c.calls
                .entry("DynamoDB GetItem (catalog)".into())
                .or_default() += reads;
            c.rru += (reads - 1) as f64 + units(size, 4096);
        });
        Ok(out)
    }
    async fn entries(&self, kind: Kind) -> Result<Vec<Entry>, StoreError> {
        self.meter.call("DynamoDB GetItem (catalog)");
        self.meter.io().await;
        self.meter.add(|c| c.rru += 1.0);
        self.inner.entries(kind).await
    }
}

/// The queues, counted (sends only; see the module's note).
pub struct CountingQueue {
    pub inner: Arc<dyn Queue>,
    pub meter: Arc<Meter>,
    pub roles: BTreeMap<String, &'static str>,
}

impl CountingQueue {
    pub fn new(inner: Arc<dyn Queue>, meter: Arc<Meter>, r: &Resources) -> Self {
        Self {
            inner,
            meter,
            roles: r.queue_roles(),
        }
    }
}

#[async_trait]
impl Queue for CountingQueue {
    async fn send(&self, queue_url: &str, body: &str, delay: Duration) -> Result<(), QueueError> {
        let role = self.roles.get(queue_url).copied().unwrap_or("client");
        let chunks = body.len().div_ceil(64 * 1024).max(1) as u64;
        self.meter.add(|c| {
            *c.calls.entry("SQS SendMessage".into()).or_default() += chunks;
            *c.messages.entry(role.to_owned()).or_default() += 1;
        });
        self.meter.io().await;
        self.inner.send(queue_url, body, delay).await
    }
    async fn receive(
        &self,
        queue_url: &str,
        max: u32,
        wait: Duration,
    ) -> Result<Vec<ReceivedMessage>, QueueError> {
        self.inner.receive(queue_url, max, wait).await
    }
    async fn delete(&self, queue_url: &str, receipt_handle: &str) -> Result<(), QueueError> {
        self.inner.delete(queue_url, receipt_handle).await
    }
}

/// The bus, counted.
pub struct CountingBus {
    pub inner: Arc<dyn EventBus>,
    pub meter: Arc<Meter>,
}

#[async_trait]
impl EventBus for CountingBus {
    async fn publish(
        &self,
        detail_type: &str,
        detail: &serde_json::Value,
    ) -> Result<(), PublishError> {
        self.meter.call("EventBridge PutEvents");
        self.meter.io().await;
        let chunks = detail.to_string().len().div_ceil(64 * 1024).max(1) as u64;
        self.meter.add(|c| c.events += chunks);
        self.inner.publish(detail_type, detail).await
    }
}
