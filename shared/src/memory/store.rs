use crate::domain::state::due_shard;
use crate::domain::{BreakerRecord, Condition, Order, OrderId, ProcessState, StateRecord};
use crate::ports::{
    CreateOutcome, Cursor, IdempotencyRecord, Page, StateStore, StoreError, Summary,
};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use std::collections::HashMap;
use std::sync::Mutex;

/// The state store in a `HashMap` behind one lock: every call is atomic, like a DynamoDB item
/// write or transaction.
#[derive(Debug)]
pub struct MemoryStore {
    shards: u32,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    orders: HashMap<OrderId, Order>,
    states: HashMap<OrderId, StateRecord>,
    keys: HashMap<String, IdempotencyRecord>,
    /// Lease name → (owner, held until).
    leases: HashMap<String, (String, DateTime<Utc>)>,
    breakers: HashMap<String, BreakerRecord>,
}

impl MemoryStore {
    pub fn new(shards: u32) -> Self {
        Self {
            shards: shards.max(1),
            inner: Mutex::new(Inner::default()),
        }
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
impl StateStore for MemoryStore {
    async fn create(
        &self,
        order: &Order,
        record: &StateRecord,
        key: Option<&IdempotencyRecord>,
    ) -> Result<CreateOutcome, StoreError> {
        let mut inner = self.lock()?;
        if let Some(k) = key
            && let Some(existing) = inner.keys.get(&k.key)
        {
            return Ok(CreateOutcome::KeyExists(existing.clone()));
        }
        if inner.orders.contains_key(&order.id) || inner.states.contains_key(&record.order_id) {
            return Err(StoreError::ConditionFailed);
        }
        inner.orders.insert(order.id, order.clone());
        inner.states.insert(record.order_id, record.clone());
        if let Some(k) = key {
            inner.keys.insert(k.key.clone(), k.clone());
        }
        Ok(CreateOutcome::Created)
    }

    async fn get(&self, id: OrderId) -> Result<Option<(Order, StateRecord)>, StoreError> {
        let inner = self.lock()?;
        Ok(match (inner.orders.get(&id), inner.states.get(&id)) {
            (Some(o), Some(s)) => Some((o.clone(), s.clone())),
            _ => None,
        })
    }

    async fn get_state(&self, id: OrderId) -> Result<Option<StateRecord>, StoreError> {
        Ok(self.lock()?.states.get(&id).cloned())
    }

    async fn put(&self, record: &StateRecord, condition: &Condition) -> Result<(), StoreError> {
        let mut inner = self.lock()?;
        if !condition.holds(inner.states.get(&record.order_id)) {
            return Err(StoreError::ConditionFailed);
        }
        inner.states.insert(record.order_id, record.clone());
        Ok(())
    }

    async fn due(
        &self,
        shard: u32,
        now: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<OrderId>, StoreError> {
        let inner = self.lock()?;
        let mut due: Vec<_> = inner
            .states
            .values()
            .filter(|r| r.due_shard(self.shards) == shard)
            .filter_map(|r| r.due_at().filter(|d| *d <= now).map(|d| (d, r.order_id)))
            .collect();
        due.sort();
        Ok(due.into_iter().take(limit).map(|(_, id)| id).collect())
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
        let mut inner = self.lock()?;
        let free = inner
            .leases
            .get(name)
            .is_none_or(|(o, until)| *until <= now || o == owner);
        if free {
            inner
                .leases
                .insert(name.to_owned(), (owner.to_owned(), now + ttl));
        }
        Ok(free)
    }

    async fn get_breaker(&self, name: &str) -> Result<Option<BreakerRecord>, StoreError> {
        Ok(self.lock()?.breakers.get(name).cloned())
    }

    async fn put_breaker(&self, record: &BreakerRecord) -> Result<bool, StoreError> {
        let mut inner = self.lock()?;
        let stored = inner.breakers.get(&record.name).map_or(0, |b| b.version);
        if stored + 1 != record.version {
            return Ok(false);
        }
        inner.breakers.insert(record.name.clone(), record.clone());
        Ok(true)
    }

    async fn release_lease(&self, name: &str, owner: &str) -> Result<(), StoreError> {
        let mut inner = self.lock()?;
        if inner.leases.get(name).is_some_and(|(o, _)| o == owner) {
            inner.leases.remove(name);
        }
        Ok(())
    }

    async fn list(
        &self,
        state: ProcessState,
        limit: usize,
        after: Option<&Cursor>,
    ) -> Result<Page, StoreError> {
        let limit = limit.max(1);
        let inner = self.lock()?;
        // The state index's order: shard ascending, then UpdatedAt descending (ties by id, which
        // DynamoDB leaves unspecified and this store fixes).
        let key = |shard: u32, ms: i64, id: &OrderId| (shard, std::cmp::Reverse(ms), *id);
        let mut rows: Vec<_> = inner
            .states
            .values()
            .filter(|r| r.process_state == state)
            .map(|r| {
                let shard = due_shard(&r.order_id, self.shards);
                (
                    key(shard, r.updated_at.timestamp_millis(), &r.order_id),
                    shard,
                    Summary::of(r),
                )
            })
            .collect();
        rows.sort_by_key(|r| r.0);
        let start = after.map(|c| key(c.shard, c.updated_at_ms, &c.order_id));
        let mut items = Vec::new();
        let mut next = None;
        for (k, shard, summary) in rows {
            if start.as_ref().is_some_and(|s| k <= *s) {
                continue;
            }
            if items.len() == limit {
                break;
            }
            next = Some(Cursor::after(shard, &summary));
            items.push(summary);
        }
        if items.len() < limit {
            next = None;
        }
        Ok(Page { items, next })
    }
}
