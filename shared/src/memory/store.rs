use crate::domain::rate::Admission;
use crate::domain::{BreakerRecord, Caller, StateRecord, Task, TaskId};
use crate::ports::{
    Breakers, Catalog, Count, CreateOutcome, CurrentRun, Cursor, DefinitionRef, DueEntry, DueIndex,
    DueQuery, Entry, GateAdmission, GateAnswer, GatePlace, GateState, Gates, Guarded,
    IdempotencyRecord, InState, KeyQuery, Kind, LeaseClaim, Leases, NewTask, Page, Paging,
    Publication, Published, RateLimits, RateRequest, SlotAnswer, SlotRequest, Slots, StoreError,
    Stored, Summary, TaskLists, TaskStore, canonical,
};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The state store in a `HashMap` behind one lock: every call is atomic, like a DynamoDB item
/// write or transaction.
#[derive(Debug)]
pub struct MemoryStore {
    shards: u32,
    inner: Mutex<Inner>,
    /// How long a final task is kept (`None`: for good).
    retention: Option<chrono::Duration>,
    /// The most a write may take to reach the indexes (`None`: at once). DynamoDB's GSIs are
    /// eventually consistent: a write reaches them some time later (usually well under a
    /// second), so a query right after a write may miss it or see the record as it was.
    index_lag: Option<Duration>,
}

#[derive(Debug, Default)]
struct Inner {
    tasks: HashMap<TaskId, Task>,
    states: HashMap<TaskId, StateRecord>,
    /// The request that wrote each record last (see [`TaskStore::put_as`]).
    writes: HashMap<TaskId, u64>,
    keys: HashMap<String, IdempotencyRecord>,
    /// Schedule name → its current task.
    runs: HashMap<String, CurrentRun>,
    /// Lease name → (owner, held until).
    leases: HashMap<String, (String, DateTime<Utc>)>,
    breakers: HashMap<String, BreakerRecord>,
    /// The services' paces, apart from their breakers (as the tables keep them).
    paces: HashMap<String, crate::domain::Pace>,
    /// Rate-limit key → its GCRA theoretical arrival time (ms).
    rates: HashMap<String, i64>,
    /// Slot key → holder → lease until (ms).
    slots: HashMap<String, HashMap<String, i64>>,
    /// Concurrency gate → its holders and its line.
    gates: HashMap<String, Gate>,
    /// Task → when its items expire (DynamoDB's TTL deletes them some time after; this store
    /// only records it, for tests).
    expiries: HashMap<TaskId, DateTime<Utc>>,
    /// (kind, name) → every published version, oldest first, with its canonical text.
    catalog: std::collections::BTreeMap<(Kind, String), Vec<(Stored, String)>>,
    /// With an index lag: what the indexes hold of each record, and the writes still on their
    /// way to them (in the order they were made, each with when it arrives).
    index: HashMap<TaskId, StateRecord>,
    in_flight: HashMap<TaskId, VecDeque<(Instant, StateRecord)>>,
}

/// A concurrency gate: who holds it, and who waits, in order.
#[derive(Debug, Default)]
struct Gate {
    holders: std::collections::BTreeSet<TaskId>,
    line: std::collections::BTreeSet<crate::domain::gate::InLine>,
}

impl Gate {
    /// `place`'s task in line, and how many wait before it (`None`: not in line).
    fn ahead(&self, place: &GatePlace<'_>) -> Option<u32> {
        let me = (place.created_at.timestamp_millis(), place.task_id);
        self.line
            .contains(&me)
            .then(|| self.line.range(..me).count() as u32)
    }

    fn state(&self, place: &GatePlace<'_>) -> GateState {
        GateState {
            holders: self.holders.iter().copied().collect(),
            ahead: self.ahead(place),
        }
    }
}

impl Inner {
    /// Writes `record` to the table; it reaches the indexes within `lag` (at once without
    /// one), never before an earlier write of the same record.
    fn write(&mut self, record: &StateRecord, lag: Option<Duration>) {
        self.states.insert(record.task_id, record.clone());
        let Some(lag) = lag else {
            return;
        };
        let queue = self.in_flight.entry(record.task_id).or_default();
        let mut at = Instant::now() + lag.mul_f64(rand::random::<f64>());
        if let Some((last, _)) = queue.back() {
            at = at.max(*last);
        }
        queue.push_back((at, record.clone()));
    }

    /// The records as the indexes hold them now: every record, or with a lag, the writes that
    /// have arrived.
    fn indexed(&mut self, lag: Option<Duration>) -> Box<dyn Iterator<Item = &StateRecord> + '_> {
        if lag.is_none() {
            return Box::new(self.states.values());
        }
        let now = Instant::now();
        for (id, queue) in &mut self.in_flight {
            while queue.front().is_some_and(|(at, _)| *at <= now) {
                if let Some((_, r)) = queue.pop_front() {
                    self.index.insert(*id, r);
                }
            }
        }
        self.in_flight.retain(|_, q| !q.is_empty());
        Box::new(self.index.values())
    }
}

impl Inner {
    /// The summaries of the records an index holds now: with an index lag, a task is in the
    /// caller and key indexes once its first write has arrived there, and its summary is the
    /// record as the index has it (an eventually consistent read, as the DynamoDB store's).
    fn indexed_summaries(&mut self, lag: Option<Duration>) -> HashMap<TaskId, Summary> {
        self.indexed(lag)
            .map(|r| (r.task_id, Summary::of(r)))
            .collect()
    }
}

impl MemoryStore {
    pub fn new(shards: u32) -> Self {
        Self {
            shards: shards.max(1),
            inner: Mutex::new(Inner::default()),
            retention: None,
            index_lag: None,
        }
    }

    /// Writes reach the indexes (`due`, `list`, `count`, `list_by_caller`) up to `lag` after
    /// they are made, each after its own random share of it, as DynamoDB's eventually
    /// consistent GSIs do; reads of a record by its key stay strongly consistent.
    pub fn with_index_lag(mut self, lag: Option<Duration>) -> Self {
        self.index_lag = lag.filter(|l| !l.is_zero());
        self
    }

    /// Final tasks expire this long after they got there (`None`: never).
    pub fn with_retention(mut self, retention: Option<chrono::Duration>) -> Self {
        self.retention = retention;
        self
    }

    /// When a task's items expire, if its retention clock started.
    pub fn expiry(&self, id: TaskId) -> Option<DateTime<Utc>> {
        self.lock().ok().and_then(|i| i.expiries.get(&id).copied())
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Inner>, StoreError> {
        self.inner
            .lock()
            .map_err(|_| StoreError::Unavailable("memory store lock poisoned".into()))
    }

    /// Every state record (for the local runner's summary and tests).
    pub fn all_states(&self) -> Vec<StateRecord> {
        self.lock()
            .map(|i| i.states.values().cloned().collect())
            .unwrap_or_default()
    }
}

#[async_trait]
impl TaskStore for MemoryStore {
    async fn create(&self, new: NewTask<'_>) -> Result<CreateOutcome, StoreError> {
        let NewTask {
            task,
            record,
            key,
            turn,
            gate,
        } = new;
        let mut inner = self.lock()?;
        // The read-back of an ambiguous create (a retry of one that was applied): the task
        // and its record already are these, so this request created them.
        if inner.tasks.get(&task.id) == Some(task)
            && inner.states.get(&record.task_id) == Some(record)
        {
            return Ok(CreateOutcome::Created);
        }
        // A key counts until it expires, and while its task exists (see `TaskStore::create`).
        if let Some(k) = key
            && let Some(existing) = inner.keys.get(&k.key)
            && !existing.expired(k.created_at)
            && inner.tasks.contains_key(&existing.task_id)
        {
            return Ok(CreateOutcome::KeyExists(existing.clone()));
        }
        // As the DynamoDB store: the schedule's current task is still the one the run read.
        if let Some(t) = turn
            && inner.runs.get(t.schedule).map(|c| c.task_id) != t.after
        {
            return Ok(CreateOutcome::TurnTaken);
        }
        if inner.tasks.contains_key(&task.id) || inner.states.contains_key(&record.task_id) {
            return Err(StoreError::ConditionFailed);
        }
        inner.tasks.insert(task.id, task.clone());
        inner.write(record, self.index_lag);
        if let Some(k) = key {
            inner.keys.insert(k.key.clone(), k.clone());
        }
        if let Some(g) = gate {
            let place = (g.created_at.timestamp_millis(), g.task_id);
            inner
                .gates
                .entry(g.gate.to_owned())
                .or_default()
                .line
                .insert(place);
        }
        if let Some(t) = turn {
            inner.runs.insert(
                t.schedule.to_owned(),
                CurrentRun {
                    task_id: task.id,
                    run_at: t.run_at,
                },
            );
        }
        Ok(CreateOutcome::Created)
    }
    async fn current_run(&self, schedule: &str) -> Result<Option<CurrentRun>, StoreError> {
        Ok(self.lock()?.runs.get(schedule).copied())
    }
    async fn get(&self, id: TaskId) -> Result<Option<(Task, StateRecord)>, StoreError> {
        let inner = self.lock()?;
        Ok(match (inner.tasks.get(&id), inner.states.get(&id)) {
            (Some(o), Some(s)) => Some((o.clone(), s.clone())),
            _ => None,
        })
    }
    async fn get_state(&self, id: TaskId) -> Result<Option<StateRecord>, StoreError> {
        Ok(self.lock()?.states.get(&id).cloned())
    }
    async fn put_as(&self, put: Guarded<'_>, write: u64) -> Result<(), StoreError> {
        let Guarded { record, condition } = put;
        let mut inner = self.lock()?;
        let current = inner.states.get(&record.task_id);
        if !condition.holds(current) {
            // The read-back of an ambiguous write (see the DynamoDB store): the record already
            // is what this request wrote, so it was applied; anything else (a rival's record,
            // however alike) is a lost race.
            let mine = inner.writes.get(&record.task_id) == Some(&write);
            return if mine && current == Some(record) {
                Ok(())
            } else {
                Err(StoreError::ConditionFailed)
            };
        }
        inner.write(record, self.index_lag);
        inner.writes.insert(record.task_id, write);
        Ok(())
    }
    async fn put_with_input(&self, put: Guarded<'_>, task: &Task) -> Result<(), StoreError> {
        let Guarded { record, condition } = put;
        let mut inner = self.lock()?;
        // As the DynamoDB store: the task at the revision before, and the record's condition.
        let follows = inner
            .tasks
            .get(&record.task_id)
            .is_some_and(|t| t.input_revision + 1 == task.input_revision);
        if !follows || !condition.holds(inner.states.get(&record.task_id)) {
            // The read-back (see `put`): the record already is this one, input and all.
            let applied = inner.states.get(&record.task_id) == Some(record)
                && inner.tasks.get(&record.task_id) == Some(task);
            return if applied {
                Ok(())
            } else {
                Err(StoreError::ConditionFailed)
            };
        }
        if let Some(stored) = inner.tasks.get_mut(&record.task_id) {
            stored.input = task.input.clone();
            stored.input_ref = task.input_ref.clone();
            stored.input_revision = task.input_revision;
            stored.earlier_inputs = task.earlier_inputs.clone();
        }
        inner.write(record, self.index_lag);
        Ok(())
    }
    async fn expire_task(&self, record: &StateRecord) -> Result<(), StoreError> {
        let mut inner = self.lock()?;
        if let Some(at) = record.expires_at(self.retention) {
            inner.expiries.insert(record.task_id, at);
        }
        Ok(())
    }
    fn retention(&self) -> Option<chrono::Duration> {
        self.retention
    }
    async fn forget_task(&self, record: &StateRecord) -> Result<(), StoreError> {
        let mut inner = self.lock()?;
        let id = record.task_id;
        match inner.states.get(&id) {
            None => return Ok(()),
            Some(stored) if stored.version != record.version => {
                return Err(StoreError::ConditionFailed);
            }
            Some(_) => {}
        }
        inner.states.remove(&id);
        inner.tasks.remove(&id);
        inner.writes.remove(&id);
        inner.expiries.remove(&id);
        inner.index.remove(&id);
        inner.in_flight.remove(&id);
        Ok(())
    }
}

#[async_trait]
impl TaskLists for MemoryStore {
    async fn list(&self, of: InState<'_>, page: Paging<'_>) -> Result<Page, StoreError> {
        let (limit, after) = (page.limit.max(1), page.after);
        let mut inner = self.lock()?;
        // The list's order (`StateRecord::listed_since`, the summary's `since`), descending
        // across shards, ties by id (which DynamoDB's index leaves unspecified and the
        // DynamoDB store sorts by too).
        let rows: Vec<Summary> = inner
            .indexed(self.index_lag)
            .filter(|r| of.holds(r))
            .map(Summary::of)
            .filter(|s| after.is_none_or(|c| c.precedes(s.since.timestamp_millis(), s.task_id)))
            .collect();
        Ok(Page::newest_first(rows, limit, false))
    }
    async fn count(&self, of: InState<'_>, cap: u64) -> Result<Count, StoreError> {
        let mut inner = self.lock()?;
        let n = inner
            .indexed(self.index_lag)
            .filter(|r| of.holds(r))
            .count() as u64;
        Ok(Count {
            count: n.min(cap),
            capped: n > cap,
        })
    }
    async fn list_by_caller(&self, caller: &Caller, page: Paging<'_>) -> Result<Page, StoreError> {
        let (limit, after) = (page.limit.clamp(1, 100), page.after);
        let mut inner = self.lock()?;
        let seen = inner.indexed_summaries(self.index_lag);
        // The caller index's order: CreatedAt descending, ties by id (as every list's).
        let key = |ms: i64, id: &TaskId| Cursor::order_key(ms, *id);
        let mut rows: Vec<_> = inner
            .tasks
            .values()
            .filter(|t| &t.caller == caller && seen.contains_key(&t.id))
            .map(|t| (key(t.created_at.timestamp_millis(), &t.id), t))
            .collect();
        rows.sort_by_key(|r| r.0);
        let start = after.map(|c| key(c.at_ms, &c.task_id));
        let mut items = Vec::new();
        let mut next = None;
        for (k, task) in rows {
            if start.as_ref().is_some_and(|s| k <= *s) {
                continue;
            }
            if items.len() == limit {
                break;
            }
            next = Some(Cursor {
                at_ms: task.created_at.timestamp_millis(),
                task_id: task.id,
            });
            if let Some(summary) = seen.get(&task.id) {
                items.push(summary.clone());
            }
        }
        if items.len() < limit {
            next = None;
        }
        Ok(Page { items, next })
    }
    async fn list_by_key(&self, q: KeyQuery<'_>, page: Paging<'_>) -> Result<Page, StoreError> {
        let (limit, after) = (page.limit.clamp(1, 100), page.after);
        let mut inner = self.lock()?;
        let seen = inner.indexed_summaries(self.index_lag);
        let key = |ms: i64, id: &TaskId| Cursor::order_key(ms, *id);
        let start = after.map(|c| key(c.at_ms, &c.task_id));
        let mut rows: Vec<_> = inner
            .tasks
            .values()
            .filter(|t| q.holds(t))
            .filter_map(|t| {
                let summary = seen.get(&t.id)?;
                q.state
                    .is_none_or(|s| summary.process_state == s)
                    .then(|| (key(t.created_at.timestamp_millis(), &t.id), t, summary))
            })
            .filter(|(k, _, _)| start.as_ref().is_none_or(|s| *k > *s))
            .collect();
        rows.sort_by_key(|r| r.0);
        let more = rows.len() > limit;
        rows.truncate(limit);
        let next = more
            .then(|| {
                rows.last()
                    .map(|(_, t, _)| Cursor::at(t.created_at.timestamp_millis(), t.id))
            })
            .flatten();
        let items = rows.into_iter().map(|(_, _, s)| s.clone()).collect();
        Ok(Page { items, next })
    }
}

#[async_trait]
impl Gates for MemoryStore {
    async fn enter(&self, a: GateAdmission<'_>) -> Result<GateAnswer, StoreError> {
        let GateAdmission { place, put, .. } = a;
        let mut inner = self.lock()?;
        let gate = inner.gates.entry(place.gate.to_owned()).or_default();
        let ahead = gate.ahead(&place);
        let admitted = ahead.is_some_and(|n| {
            crate::domain::gate::admits(gate.holders.len(), n as usize, place.limit)
        });
        if !admitted {
            return Ok(GateAnswer::Waiting(gate.state(&place)));
        }
        // Both or neither, as the DynamoDB store's transaction.
        if !put.condition.holds(inner.states.get(&put.record.task_id)) {
            return Err(StoreError::ConditionFailed);
        }
        let gate = inner.gates.entry(place.gate.to_owned()).or_default();
        gate.line
            .remove(&(place.created_at.timestamp_millis(), place.task_id));
        gate.holders.insert(place.task_id);
        inner.write(put.record, self.index_lag);
        inner.writes.insert(put.record.task_id, rand::random());
        Ok(GateAnswer::Admitted)
    }
    async fn leave(&self, place: GatePlace<'_>) -> Result<Vec<TaskId>, StoreError> {
        let mut inner = self.lock()?;
        let Some(gate) = inner.gates.get_mut(place.gate) else {
            return Ok(vec![]);
        };
        gate.holders.remove(&place.task_id);
        gate.line
            .remove(&(place.created_at.timestamp_millis(), place.task_id));
        let line: Vec<_> = gate.line.iter().copied().collect();
        let next = crate::domain::gate::next_in_line(gate.holders.len(), &line, place.limit);
        if gate.holders.is_empty() && gate.line.is_empty() {
            inner.gates.remove(place.gate);
        }
        Ok(next)
    }
    async fn gate_state(&self, place: GatePlace<'_>) -> Result<GateState, StoreError> {
        let inner = self.lock()?;
        Ok(inner
            .gates
            .get(place.gate)
            .map(|g| g.state(&place))
            .unwrap_or_default())
    }
}

#[async_trait]
impl DueIndex for MemoryStore {
    async fn due(&self, q: DueQuery<'_>) -> Result<Vec<DueEntry>, StoreError> {
        let DueQuery {
            shard,
            now,
            limit,
            after,
        } = q;
        let mut inner = self.lock()?;
        let mut due: Vec<_> = inner
            .indexed(self.index_lag)
            .filter(|r| r.due_shard(self.shards) == shard)
            .filter_map(|r| {
                r.due_key.filter(|d| *d <= now).map(|due_at| DueEntry {
                    due_at,
                    task_id: r.task_id,
                })
            })
            .filter(|e| after.is_none_or(|a| e > a))
            .collect();
        due.sort();
        due.truncate(limit);
        Ok(due)
    }
    fn due_shards(&self) -> u32 {
        self.shards
    }
}

#[async_trait]
impl Leases for MemoryStore {
    async fn acquire_lease(&self, claim: LeaseClaim<'_>) -> Result<bool, StoreError> {
        let mut inner = self.lock()?;
        let free = inner
            .leases
            .get(claim.name)
            .is_none_or(|(o, until)| *until <= claim.now || o == claim.owner);
        if free {
            let held = (claim.owner.to_owned(), claim.until());
            inner.leases.insert(claim.name.to_owned(), held);
        }
        Ok(free)
    }
    async fn release_lease(&self, name: &str, owner: &str) -> Result<(), StoreError> {
        let mut inner = self.lock()?;
        if inner.leases.get(name).is_some_and(|(o, _)| o == owner) {
            inner.leases.remove(name);
        }
        Ok(())
    }
}

#[async_trait]
impl Breakers for MemoryStore {
    async fn get_breaker(&self, name: &str) -> Result<Option<BreakerRecord>, StoreError> {
        let inner = self.lock()?;
        let pace = inner.paces.get(name).copied();
        let mut record = match inner.breakers.get(name) {
            Some(b) => b.clone(),
            None if pace.is_some() => BreakerRecord::closed(name),
            None => return Ok(None),
        };
        record.pace = pace.unwrap_or_default();
        Ok(Some(record))
    }
    async fn put_breaker(&self, record: &BreakerRecord) -> Result<bool, StoreError> {
        let mut inner = self.lock()?;
        let stored = inner.breakers.get(&record.name).map_or(0, |b| b.version);
        if stored + 1 != record.version {
            return Ok(false);
        }
        // The pace is kept apart: a move of the breaker neither writes nor checks it.
        let record = BreakerRecord {
            pace: Default::default(),
            ..record.clone()
        };
        inner.breakers.insert(record.name.clone(), record);
        Ok(true)
    }
    async fn mark_pace(
        &self,
        name: &str,
        mark: crate::domain::PaceMark,
    ) -> Result<bool, StoreError> {
        let mut inner = self.lock()?;
        let stored = inner.paces.get(name).copied().unwrap_or_default();
        match stored.apply(mark) {
            Some(pace) => {
                inner.paces.insert(name.to_owned(), pace);
                Ok(true)
            }
            None => Ok(false),
        }
    }
}

#[async_trait]
impl RateLimits for MemoryStore {
    async fn admit(&self, ask: RateRequest<'_>) -> Result<Admission, StoreError> {
        use crate::domain::rate::Decision;
        let RateRequest { key, limit, now } = ask;
        let mut inner = self.lock()?;
        match limit.decide(inner.rates.get(key).copied(), now.timestamp_millis()) {
            Decision::Admit { tat_ms } => {
                inner.rates.insert(key.to_owned(), tat_ms);
                Ok(Admission::Admitted)
            }
            Decision::Refuse { retry_after } => Ok(Admission::Limited { retry_after }),
        }
    }
}

#[async_trait]
impl Slots for MemoryStore {
    async fn take_slot(&self, ask: SlotRequest<'_>) -> Result<SlotAnswer, StoreError> {
        use crate::domain::limits::{SlotDecision, take_slot};
        let mut inner = self.lock()?;
        let now = ask.now.timestamp_millis();
        let held = inner.slots.entry(ask.key.to_owned()).or_default();
        match take_slot(held.iter().map(|(h, u)| (h.as_str(), *u)), ask.limit, now) {
            SlotDecision::Take => {
                held.retain(|_, until| *until > now);
                held.insert(ask.holder.to_owned(), ask.until.timestamp_millis());
                Ok(SlotAnswer::Taken)
            }
            SlotDecision::Full { next_free_ms } => Ok(SlotAnswer::Full {
                next_free: DateTime::from_timestamp_millis(next_free_ms).unwrap_or(ask.now),
            }),
        }
    }
    async fn free_slot(&self, key: &str, holder: &str) -> Result<(), StoreError> {
        if let Some(held) = self.lock()?.slots.get_mut(key) {
            held.remove(holder);
        }
        Ok(())
    }
    async fn slots_held(&self, key: &str, now: DateTime<Utc>) -> Result<u32, StoreError> {
        let now = now.timestamp_millis();
        Ok(self.lock()?.slots.get(key).map_or(0, |held| {
            held.values().filter(|until| **until > now).count() as u32
        }))
    }
}

#[async_trait]
impl Catalog for MemoryStore {
    async fn publish(&self, p: Publication<'_>) -> Result<Published, StoreError> {
        let (kind, name) = (p.kind, p.name);
        let text = canonical(p.body);
        let mut inner = self.lock()?;
        let versions = inner.catalog.entry((kind, name.to_owned())).or_default();
        if let Some((latest, latest_text)) = versions.last()
            && *latest_text == text
        {
            return Ok(Published {
                version: latest.version,
                created: false,
            });
        }
        let version = versions.len() as u32 + 1;
        versions.push((
            Stored {
                kind,
                name: name.to_owned(),
                version,
                body: p.body.clone(),
                published_at: p.now,
            },
            text,
        ));
        Ok(Published {
            version,
            created: true,
        })
    }

    async fn definition(&self, wanted: DefinitionRef<'_>) -> Result<Option<Stored>, StoreError> {
        let inner = self.lock()?;
        let Some(versions) = inner.catalog.get(&(wanted.kind, wanted.name.to_owned())) else {
            return Ok(None);
        };
        Ok(match wanted.version {
            None => versions.last(),
            Some(v) => versions.get((v as usize).wrapping_sub(1)),
        }
        .map(|(s, _)| s.clone()))
    }

    async fn entries(&self, kind: Kind) -> Result<Vec<Entry>, StoreError> {
        let inner = self.lock()?;
        Ok(inner
            .catalog
            .iter()
            .filter(|((k, _), _)| *k == kind)
            .map(|((_, name), versions)| Entry {
                name: name.clone(),
                latest: versions.len() as u32,
            })
            .collect())
    }
}
