//! A counting interceptor over the ports ([`sas_local::intercept`]): every AWS API call the
//! handlers make, by service and call, and the capacity DynamoDB bills for it (from the items'
//! sizes, by DynamoDB's rules); and [`CountedPayloads`], the same for the payload store (S3).
//! Queue receives and deletes are not counted here: in Lambda the event source mapping makes
//! them, and the cost model adds them per message.

use async_trait::async_trait;
use sas::aws::{index_entry_sizes, state_index_key, state_record_size, stored_sizes};
use sas::domain::TaskId;
use sas::domain::payload::PayloadRef;
use sas::domain::{StateRecord, Task};
use sas::ports::{Guarded, LeaseClaim, NewTask, PayloadError, Payloads, StateStore, Stored};
use sas_local::intercept::{Call, Failure, Interceptor, Next, Reply, answer};
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
    /// State-record writes whose condition failed (`ConditionFailed`): another write came
    /// between the handler's read and its write (e.g. two branches' replies racing on one
    /// record). Billed like any write, and counted in `writes` too.
    pub conflicts: u64,
    /// The payload objects written to S3, by name, with their bytes: what S3 stores (an
    /// object written again under its name replaces itself, so it is stored once).
    pub objects: BTreeMap<String, u64>,
    /// Creates whose condition (the record absent) failed: a record created twice (e.g. a
    /// distributed forEach's element opened again). Billed, and counted in `writes` too.
    pub create_conflicts: u64,
    /// Per record (a task's, a run's, an element's id): what its writes came to.
    pub records: BTreeMap<String, RecordWrites>,
}

/// What the writes of one record (its task item and its state record) came to.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RecordWrites {
    /// Writes (a create counted once), and of them those whose condition failed.
    pub writes: u64,
    pub lost: u64,
    /// Their write units, the indexes' included.
    pub wru: f64,
    /// The largest state record written (the larger of the old and the new at a put)...
    pub largest: usize,
    /// ...and its task item (the input, or its reference), written at its create.
    pub task_item: usize,
}

/// One DynamoDB write's bill: the write request units on the table's item and on each index
/// entry it added, moved or removed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WriteUnits {
    /// What the write did (`create`, a transition's name, `breaker`, ...).
    pub label: String,
    /// The record written (a task's, a run's or an element's id; empty for other items).
    pub record: String,
    /// The size of the item written (the larger of old and new, which is what DynamoDB bills).
    pub item_bytes: usize,
    pub table: f64,
    pub due_index: f64,
    pub state_index: f64,
    pub caller_index: f64,
    /// The key indexes' entries (one per search key of a task, written with its item).
    pub key_indexes: f64,
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
        self.table + self.due_index + self.state_index + self.caller_index + self.key_indexes
    }
}

impl Counts {
    /// These counts and `o`'s, as one task's.
    pub fn plus(mut self, o: Counts) -> Self {
        for (k, n) in o.calls {
            *self.calls.entry(k).or_default() += n;
        }
        for (k, n) in o.messages {
            *self.messages.entry(k).or_default() += n;
        }
        for (k, (w, r)) in o.keys {
            let e = self.keys.entry(k).or_default();
            e.0 += w;
            e.1 += r;
        }
        self.wru += o.wru;
        self.rru += o.rru;
        self.events += o.events;
        self.writes.extend(o.writes);
        self.conflicts += o.conflicts;
        self.objects.extend(o.objects);
        self.create_conflicts += o.create_conflicts;
        for (k, r) in o.records {
            let e = self.records.entry(k).or_default();
            e.writes += r.writes;
            e.lost += r.lost;
            e.wru += r.wru;
            e.largest = e.largest.max(r.largest);
            e.task_item = e.task_item.max(r.task_item);
        }
        self
    }

    /// The bytes of the payload objects written (each once).
    pub fn stored_bytes(&self) -> u64 {
        self.objects.values().sum()
    }

    pub fn call(&self, name: &str) -> u64 {
        self.calls.get(name).copied().unwrap_or(0)
    }
    pub fn dynamodb_writes(&self) -> u64 {
        ["DynamoDB PutItem", "DynamoDB TransactWriteItems"]
            .iter()
            .map(|c| self.call(c))
            .sum()
    }
    /// The largest item any write wrote (the larger of old and new, as billed), in bytes.
    pub fn largest_item(&self) -> usize {
        self.writes.iter().map(|w| w.item_bytes).max().unwrap_or(0)
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
            sum.key_indexes += w.key_indexes;
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
    fn record(&self, id: String, units: f64, bytes: usize, lost: bool) {
        self.add(|c| {
            let r = c.records.entry(id).or_default();
            r.writes += 1;
            r.lost += u64::from(lost);
            r.wru += units;
            r.largest = r.largest.max(bytes);
        });
    }
    pub fn take(&self) -> Counts {
        self.0
            .lock()
            .map(|mut c| std::mem::take(&mut *c))
            .unwrap_or_default()
    }
}

/// What a write's label ends with when its condition failed.
pub const LOST: &str = " (condition failed)";

fn units(bytes: usize, unit: usize) -> f64 {
    bytes.div_ceil(unit).max(1) as f64
}

/// The counter: an [`Interceptor`] that counts each call on `meter` before (or, for reads
/// billed by what they read, after) passing it on. Wrap the store, the catalog, the queues and
/// the bus with one (see `scenarios::wrap`).
pub struct Counter {
    pub meter: Arc<Meter>,
    /// The store it counts, unwrapped: a write's bill depends on the item it replaces, read
    /// from here (uncounted; the handlers never do).
    pub store: Arc<dyn StateStore>,
    pub shards: u32,
    /// Queue URL → role (`work`, `replies`, ...; any other queue is a `client`'s).
    pub roles: BTreeMap<String, &'static str>,
}

impl Counter {
    pub fn new(meter: Arc<Meter>, store: Arc<dyn StateStore>, shards: u32, r: &Resources) -> Self {
        Self {
            meter,
            store,
            shards,
            roles: r.queue_roles(),
        }
    }

    /// A create: one transaction of the task, its state record and its key.
    fn create(&self, new: NewTask<'_>) {
        let NewTask {
            task, record, key, ..
        } = new;
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
        if let (Some(state), Some((partition, _))) = (state, state_index_key(record, self.shards)) {
            self.meter
                .key(format!("state-index {partition}"), units(state, 1024), 0.0);
        }
        // The caller's partition of its tasks' index, as the DynamoDB store files it (a run's
        // and its elements' task items make no entry).
        let listed = task.caller.listed();
        if listed {
            let caller_shard =
                sas::domain::state::due_shard(&task.id, sas::aws::DEFAULT_CALLER_SHARDS);
            self.meter.key(
                format!("caller-shard-index {}", task.caller.index_key(caller_shard)),
                1.0,
                0.0,
            );
        }
        // Each search key's entry in its slot's index (its key, `CreatedAt` and two short
        // projected attributes: under 1 KB).
        for k in &task.keys {
            self.meter.key(
                format!("key-index-{} {}", k.slot + 1, k.key.index_value()),
                1.0,
                0.0,
            );
        }
        let w = WriteUnits {
            label: "create (task, state, key: a transaction)".into(),
            record: task.id.to_string(),
            item_bytes: o + r,
            table: 2.0 * (units(o, 1024) + units(r, 1024) + key_units),
            due_index: due.map_or(0.0, |d| units(d, 1024)),
            state_index: state.map_or(0.0, |s| units(s, 1024)),
            caller_index: if listed { 1.0 } else { 0.0 },
            key_indexes: task.keys.len() as f64,
        };
        self.meter.record(task.id.to_string(), w.total(), r, false);
        self.meter.add(|c| {
            if let Some(e) = c.records.get_mut(&task.id.to_string()) {
                e.task_item = e.task_item.max(o);
            }
        });
        self.meter.write(w);
    }

    /// A put of `record` over `old`, applied or not.
    fn put(&self, record: &StateRecord, old: Option<&StateRecord>, label: String, applied: bool) {
        let new_size = state_record_size(record, self.shards);
        let old_size = old.map_or(0, |o| state_record_size(o, self.shards));
        let mut w = WriteUnits {
            label,
            record: record.task_id.to_string(),
            item_bytes: new_size.max(old_size),
            table: units(new_size.max(old_size), 1024),
            ..WriteUnits::default()
        };
        if applied {
            let (new_due, new_state) = index_entry_sizes(record, self.shards);
            let (old_due, old_state) =
                old.map_or((None, None), |o| index_entry_sizes(o, self.shards));
            let due_moved = old.map(|o| o.due_key) != Some(record.due_key);
            w.due_index = match (old_due, new_due) {
                (Some(a), Some(b)) if due_moved => units(a, 1024) + units(b, 1024),
                (Some(_), Some(_)) => 0.0,
                (Some(a), None) | (None, Some(a)) => units(a, 1024),
                (None, None) => 0.0,
            };
            // The state index's entry moves (a delete and a put) when its key does, as the store
            // writes it (`StateShard`, `StateSince`: with the state, but not between `Pending`
            // and `Processing`); its projected attributes (id, workflow) never change.
            let key = |r: &StateRecord| state_index_key(r, self.shards);
            let state_moved = old.map(key) != Some(key(record));
            // An entry only for a record listed by state (a run's or an element's only while
            // it waits for an operator).
            let entry = |s: Option<usize>| s.map_or(0.0, |s| units(s, 1024));
            w.state_index = match old {
                Some(_) if state_moved => entry(old_state) + entry(new_state),
                Some(_) => 0.0,
                None => entry(new_state),
            };
            // By key: the item, its due shard, and the state index's old and new partitions.
            let shard = record.due_shard(self.shards);
            if w.due_index > 0.0 {
                self.meter
                    .key(format!("due-index due#{shard}"), w.due_index, 0.0);
            }
            if let Some(o) = old.filter(|_| w.state_index > 0.0) {
                for (r, size) in [(o, old_state), (record, new_state)] {
                    if let (Some((partition, _)), Some(_)) = (key(r), size) {
                        self.meter
                            .key(format!("state-index {partition}"), entry(size), 0.0);
                    }
                }
            }
        } else {
            w.label = format!("{}{LOST}", w.label);
        }
        self.meter
            .key(format!("TASK#<id>: {}", record.task_id), w.table, 0.0);
        self.meter.record(
            record.task_id.to_string(),
            w.total(),
            w.item_bytes,
            !applied,
        );
        self.meter.write(w);
    }
}

impl Counter {
    /// An update of slot item `key` holding `held` leases: its size by DynamoDB's rules (the
    /// keys, the expiry, and the `Held` map: per lease its holder's 16 characters, its end in
    /// ms as a number and a byte of the map's).
    fn slot_write(&self, key: &str, held: u32) {
        let bytes = SLOT_ITEM_BYTES + key.len() + held as usize * SLOT_LEASE_BYTES;
        let table = units(bytes, 1024);
        self.meter.write(WriteUnits {
            label: "slot".into(),
            item_bytes: bytes,
            table,
            ..WriteUnits::default()
        });
        self.meter.key(format!("SLOTS#{key}"), table, 0.0);
    }
}

/// A slot item's bytes besides its key and its leases: `pk` (`SLOTS#` and the key), `sk`
/// (`SLOTS`), the `Held` map's name and overhead, `ExpiresAt`.
const SLOT_ITEM_BYTES: usize = 2 + 6 + 2 + 5 + 4 + 3 + 9 + 6;
/// One lease in a slot item's `Held` map: the holder (16 hex digits), its end (a 13-digit
/// number: 8 bytes), a byte of the map's.
const SLOT_LEASE_BYTES: usize = 16 + 8 + 1;

#[async_trait]
impl Interceptor for Counter {
    async fn around<'a, R: Reply, E: Failure>(&'a self, next: Next<'a, R, E>) -> Result<R, E> {
        let call = next.call();
        let m = &self.meter;
        match call {
            Call::Create(new) => {
                m.call("DynamoDB TransactWriteItems");
                m.io().await;
                let id = new.task.id.to_string();
                self.create(new);
                let out = next.run(call).await;
                if out.as_ref().is_err_and(|e| e.is_condition_failed()) {
                    m.add(|c| {
                        c.create_conflicts += 1;
                        if let Some(r) = c.records.get_mut(&id) {
                            r.lost += 1;
                        }
                    });
                }
                out
            }
            Call::Get { id } => {
                m.call("DynamoDB Query");
                m.io().await;
                let out = next.run(call).await?;
                let size = answer::<Option<(Task, StateRecord)>, _>(&out)
                    .and_then(Option::as_ref)
                    .map_or(0, |(o, r)| {
                        let (a, b) = stored_sizes(o, r, self.shards);
                        a + b
                    });
                m.add(|c| c.rru += units(size, 4096));
                m.key(format!("TASK#<id>: {id}"), 0.0, units(size, 4096));
                Ok(out)
            }
            Call::CurrentRun { schedule } => {
                m.call("DynamoDB GetItem");
                m.io().await;
                m.add(|c| c.rru += 1.0);
                m.key(format!("CURRENT#: {schedule}"), 0.0, 1.0);
                next.run(call).await
            }
            Call::GetState { id } => {
                m.call("DynamoDB GetItem");
                m.io().await;
                let out = next.run(call).await?;
                m.add(|c| c.rru += 1.0);
                m.key(format!("TASK#<id>: {id}"), 0.0, 1.0);
                Ok(out)
            }
            Call::PutAs {
                put: Guarded { record, condition },
                ..
            } => {
                m.call("DynamoDB PutItem");
                m.io().await;
                // The bill depends on the item replaced: read it (uncounted; the handlers never do).
                let old = self.store.get_state(record.task_id).await.ok().flatten();
                let out = next.run(call).await;
                let label = sas::domain::write_label(record, condition);
                self.put(record, old.as_ref(), label, out.is_ok());
                if out.as_ref().is_err_and(|e| e.is_condition_failed()) {
                    m.add(|c| c.conflicts += 1);
                }
                out
            }
            Call::EnterGate(a) => {
                // A strongly consistent query of the gate (its head and the first in line),
                // then, if admitted, one transaction: the head, the entry left, the record.
                m.call("DynamoDB Query (gate)");
                m.add(|c| c.rru += 1.0);
                m.io().await;
                let old = self
                    .store
                    .get_state(a.put.record.task_id)
                    .await
                    .ok()
                    .flatten();
                let out = next.run(call).await;
                let admitted = match &out {
                    Ok(r) => matches!(
                        answer::<sas::ports::GateAnswer, _>(r),
                        Some(sas::ports::GateAnswer::Admitted)
                    ),
                    Err(_) => false,
                };
                if admitted {
                    m.call("DynamoDB TransactWriteItems (gate)");
                    let label = sas::domain::write_label(a.put.record, a.put.condition);
                    self.put(a.put.record, old.as_ref(), label, true);
                    // The transaction bills its record twice, and the head and the entry.
                    m.write(WriteUnits {
                        label: "gate: admitted (head, entry)".into(),
                        table: 4.0
                            + units(sas::aws::state_record_size(a.put.record, self.shards), 1024),
                        ..WriteUnits::default()
                    });
                    m.key(format!("GATE#{}", a.place.gate), 4.0, 1.0);
                }
                out
            }
            Call::LeaveGate(place) => {
                m.call("DynamoDB Query (gate)");
                m.call("DynamoDB TransactWriteItems (gate)");
                m.io().await;
                m.add(|c| c.rru += 1.0);
                m.write(WriteUnits {
                    label: "gate: left".into(),
                    table: 2.0,
                    ..WriteUnits::default()
                });
                m.key(format!("GATE#{}", place.gate), 2.0, 1.0);
                next.run(call).await
            }
            Call::GateState(place) => {
                m.call("DynamoDB Query (gate)");
                m.io().await;
                m.add(|c| c.rru += 1.0);
                m.key(format!("GATE#{}", place.gate), 0.0, 1.0);
                next.run(call).await
            }
            Call::Due(q) => {
                m.call("DynamoDB Query (due-index)");
                m.io().await;
                m.add(|c| c.rru += 0.5);
                m.key(format!("due-index due#{}", q.shard), 0.0, 0.5);
                next.run(call).await
            }
            Call::AcquireLease(LeaseClaim { name, .. }) | Call::ReleaseLease { name, .. } => {
                m.call("DynamoDB PutItem (lease)");
                m.io().await;
                m.write(WriteUnits::small(match call {
                    Call::AcquireLease(_) => "lease",
                    _ => "lease released",
                }));
                m.key(format!("LEASE#{name}"), 1.0, 0.0);
                next.run(call).await
            }
            Call::GetBreaker { name } => {
                // A strongly consistent Query of the breaker's partition: the breaker and the
                // service's pace, two small items, one read unit.
                m.call("DynamoDB Query (breaker)");
                m.io().await;
                m.add(|c| c.rru += 1.0);
                m.key(format!("BREAKER#{name}"), 0.0, 1.0);
                next.run(call).await
            }
            Call::PeekBreaker { name } => {
                // The same Query, eventually consistent: half a read unit.
                m.call("DynamoDB Query (breaker)");
                m.io().await;
                m.add(|c| c.rru += 0.5);
                m.key(format!("BREAKER#{name}"), 0.0, 0.5);
                next.run(call).await
            }
            Call::PutBreaker { record } => {
                m.call("DynamoDB PutItem (breaker)");
                m.io().await;
                m.write(WriteUnits::small("breaker"));
                m.key(format!("BREAKER#{}", record.name), 1.0, 0.0);
                next.run(call).await
            }
            Call::MarkPace { name, .. } => {
                // One conditional UpdateItem of the small pace item.
                m.call("DynamoDB UpdateItem (pace)");
                m.io().await;
                m.write(WriteUnits::small("pace"));
                m.key(format!("BREAKER#{name}"), 1.0, 0.0);
                next.run(call).await
            }
            Call::List { .. } | Call::Count { .. } => {
                m.call(match call {
                    Call::List { .. } => "DynamoDB Query (state-index)",
                    _ => "DynamoDB Query (state-index, count)",
                });
                m.io().await;
                m.add(|c| c.rru += 0.5);
                next.run(call).await
            }
            Call::PutWithInput { .. } => {
                m.call("DynamoDB TransactWriteItems (input + state)");
                next.run(call).await
            }
            Call::ExpireTask { record } => {
                // The DynamoDB store writes nothing for a record with no expiry yet (not final,
                // or held: a child or element its parent may still undo, released later).
                if record.expires_at(self.store.retention()).is_some() {
                    // An UpdateItem of the task item, billed on its size.
                    m.call("DynamoDB UpdateItem (retention)");
                    m.io().await;
                    m.write(WriteUnits {
                        record: record.task_id.to_string(),
                        ..WriteUnits::small("retention")
                    });
                }
                next.run(call).await
            }
            Call::ForgetTask { .. } => {
                // A transaction of two deletes (the task item, the state record): twice the
                // units of two writes, the state record billed on a small delete.
                m.call("DynamoDB TransactWriteItems (purge)");
                m.io().await;
                m.write(WriteUnits {
                    table: 4.0,
                    ..WriteUnits::small("purge")
                });
                next.run(call).await
            }
            Call::Admit(ask) => {
                // One conditional UpdateItem of a small item (the caller's TAT): 1 WRU.
                m.call("DynamoDB UpdateItem (rate limit)");
                m.io().await;
                m.write(WriteUnits::small("rate limit"));
                m.key(format!("RATE#{}", ask.key), 1.0, 0.0);
                next.run(call).await
            }
            Call::TakeSlot(ask) => {
                // One conditional UpdateItem of the key's lease map, billed on the larger of
                // the old and the new item: the map with the lease taken (a few leases: 1 WRU;
                // hundreds of calls in flight: more), or more when it is full (a cleanup, a
                // read of the old item).
                m.call("DynamoDB UpdateItem (slot)");
                m.io().await;
                let out = next.run(call).await;
                let held = self.store.slots_held(ask.key, ask.now).await.unwrap_or(0);
                self.slot_write(ask.key, held);
                out
            }
            Call::FreeSlot { key, .. } => {
                // Billed on the map before the lease is removed.
                m.call("DynamoDB UpdateItem (slot)");
                m.io().await;
                let held = self
                    .store
                    .slots_held(key, chrono::Utc::now())
                    .await
                    .unwrap_or(0);
                self.slot_write(key, held);
                next.run(call).await
            }
            Call::SlotsHeld { .. } => {
                m.call("DynamoDB GetItem (slots)");
                m.io().await;
                m.add(|c| c.rru += 0.5);
                next.run(call).await
            }
            Call::ListByKey { page, .. } => {
                // A Query of each key slot's index, then a BatchGetItem of the page's records.
                for _ in 0..sas::domain::keys::MAX_SEARCH_KEYS {
                    m.call("DynamoDB Query (key-index)");
                }
                m.call("DynamoDB BatchGetItem");
                m.io().await;
                m.add(|c| {
                    c.rru +=
                        0.5 * sas::domain::keys::MAX_SEARCH_KEYS as f64 + 0.5 * page.limit as f64
                });
                next.run(call).await
            }
            Call::ListByCaller { page, .. } => {
                // A Query of the caller index, then a BatchGetItem of the page's state records.
                m.call("DynamoDB Query (caller-shard-index)");
                m.call("DynamoDB BatchGetItem");
                m.io().await;
                m.add(|c| c.rru += 0.5 + 0.5 * page.limit as f64);
                next.run(call).await
            }
            // The catalog (in the same table): each read is one strongly consistent `GetItem`
            // of the catalog's head or of one definition version, each publish one transaction.
            Call::PublishDefinition(publication) => {
                m.call("DynamoDB TransactWriteItems (catalog)");
                m.io().await;
                let size = publication.body.to_string().len();
                m.add(|c| c.wru += 2.0 * (units(size, 1024) + 1.0));
                next.run(call).await
            }
            Call::Definition(wanted) => {
                // Without a version, the catalog's head is read first for the newest one.
                let reads = if wanted.version.is_some() { 1 } else { 2 };
                let out = next.run(call).await?;
                let size = answer::<Option<Stored>, _>(&out)
                    .and_then(Option::as_ref)
                    .map_or(0, |s| s.body.to_string().len());
                m.add(|c| {
                    *c.calls
                        .entry("DynamoDB GetItem (catalog)".into())
                        .or_default() += reads;
                    c.rru += (reads - 1) as f64 + units(size, 4096);
                });
                Ok(out)
            }
            Call::Entries { .. } => {
                m.call("DynamoDB GetItem (catalog)");
                m.io().await;
                m.add(|c| c.rru += 1.0);
                next.run(call).await
            }
            // The queues: sends only (see the module's note). A grouped send (a FIFO queue's)
            // is one `SendMessage` too, billed as a standard one.
            Call::Send {
                queue_url, body, ..
            }
            | Call::SendGrouped(sas::ports::GroupedMessage {
                queue_url, body, ..
            }) => {
                let role = self.roles.get(queue_url).copied().unwrap_or("client");
                let chunks = body.len().div_ceil(64 * 1024).max(1) as u64;
                m.add(|c| {
                    *c.calls.entry("SQS SendMessage".into()).or_default() += chunks;
                    *c.messages.entry(role.to_owned()).or_default() += 1;
                });
                m.io().await;
                next.run(call).await
            }
            Call::Receive(_) | Call::Delete { .. } => next.run(call).await,
            Call::PublishEvent { detail, .. } => {
                m.call("EventBridge PutEvents");
                m.io().await;
                let chunks = detail.to_string().len().div_ceil(64 * 1024).max(1) as u64;
                m.add(|c| c.events += chunks);
                next.run(call).await
            }
        }
    }
}

/// A payload store whose calls are counted on `meter` as the S3 adapter makes them: a put is a
/// PutObject, a get a GetObject, a task's purge a ListObjectsV2 and a DeleteObjects per 1,000
/// objects, one object's deletion a DeleteObject. Wrapped under the functions' payload caches
/// (see `scenarios::wrap`), so it counts the calls that reach S3.
pub struct CountedPayloads {
    pub meter: Arc<Meter>,
    pub inner: Arc<dyn Payloads>,
}

/// The most keys one ListObjectsV2 answers and one DeleteObjects takes.
const S3_PAGE: usize = 1000;

#[async_trait]
impl Payloads for CountedPayloads {
    async fn put(&self, task_id: TaskId, body: &[u8]) -> Result<PayloadRef, PayloadError> {
        self.meter.call("S3 PutObject");
        self.meter.io().await;
        let r = self.inner.put(task_id, body).await?;
        self.meter
            .add(|c| _ = c.objects.insert(r.key(), body.len() as u64));
        Ok(r)
    }

    async fn put_lines(
        &self,
        task_id: TaskId,
        lines: sas::ports::LineStream<'_>,
    ) -> Result<PayloadRef, PayloadError> {
        let r = self.inner.put_lines(task_id, lines).await?;
        // As the S3 adapter cuts it (the parts' count from its length, as near as a line).
        let (puts, parts) = sas::aws::lines_calls(r.bytes);
        self.meter.add(|c| {
            let mut add = |call: &str, n: usize| {
                if n > 0 {
                    *c.calls.entry(call.into()).or_default() += n as u64;
                }
            };
            add("S3 PutObject", puts);
            add("S3 CreateMultipartUpload", usize::from(parts > 0));
            add("S3 UploadPart", parts);
            add("S3 CompleteMultipartUpload", usize::from(parts > 0));
            _ = c.objects.insert(r.key(), r.bytes);
        });
        self.meter.io().await;
        Ok(r)
    }

    async fn get(&self, r: &PayloadRef) -> Result<Vec<u8>, PayloadError> {
        self.meter.call("S3 GetObject");
        self.meter.io().await;
        self.inner.get(r).await
    }

    async fn delete_task(&self, task_id: TaskId) -> Result<usize, PayloadError> {
        self.meter.io().await;
        let deleted = self.inner.delete_task(task_id).await?;
        let pages = deleted.div_ceil(S3_PAGE) as u64;
        self.meter.add(|c| {
            *c.calls.entry("S3 ListObjectsV2".into()).or_default() += pages.max(1);
            if pages > 0 {
                *c.calls.entry("S3 DeleteObjects".into()).or_default() += pages;
            }
        });
        Ok(deleted)
    }

    async fn delete(&self, r: &PayloadRef) -> Result<(), PayloadError> {
        self.meter.call("S3 DeleteObject");
        self.meter.io().await;
        self.inner.delete(r).await
    }

    async fn read_object(
        &self,
        location: &sas::domain::run::ObjectLocation,
        max_bytes: usize,
    ) -> Result<Vec<u8>, PayloadError> {
        self.meter.call("S3 GetObject");
        self.meter.io().await;
        self.inner.read_object(location, max_bytes).await
    }
}
