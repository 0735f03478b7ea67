//! The small traits the handlers talk to. Each has an AWS implementation ([`crate::aws`]) and
//! an in-memory one ([`crate::memory`]) that pass the same contract tests.

use crate::domain::rate::{Admission, RateLimit};
use crate::domain::run::ObjectLocation;
use crate::domain::{
    BreakerRecord, Caller, Condition, PayloadRef, ProcessState, StateRecord, Task, TaskId,
};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
#[cfg(any(test, feature = "testkit"))]
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The write's condition did not hold: someone else moved the record first.
    #[error("condition check failed")]
    ConditionFailed,
    /// The store could not be reached or refused the call; the caller may retry.
    #[error("state store unavailable: {0}")]
    Unavailable(String),
    /// A stored item does not parse: never silently repaired.
    #[error("corrupt item: {0}")]
    Corrupt(String),
    /// The store refused the request in a way no retry changes (a `ValidationException`,
    /// `AccessDeniedException`, a missing table): the message that asked for it is poison.
    #[error("the state store rejected the request: {0}")]
    Rejected(String),
}

/// What an `Idempotency-Key` maps to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyRecord {
    pub key: String,
    /// SHA-256 of the canonical request, to tell a replay from a reuse with another body.
    pub request_hash: String,
    pub task_id: TaskId,
    pub created_at: DateTime<Utc>,
}

/// How long an idempotency key names its task: in DynamoDB its item's `ExpiresAt` (the table's
/// TTL), which always comes before its task's own expiry (a final task is kept at least a day
/// after it ended).
pub const IDEMPOTENCY_KEY_TTL: chrono::Duration = chrono::Duration::hours(24);

impl IdempotencyRecord {
    /// When the key stops naming its task: from then a request with it starts a new task.
    pub fn expires_at(&self) -> DateTime<Utc> {
        self.created_at + IDEMPOTENCY_KEY_TTL
    }

    /// Whether the key has expired by `now` (a new request's time, the stores' clock for
    /// keys: DynamoDB's TTL deletes the item some time after, so a store never relies on that).
    pub fn expired(&self, now: DateTime<Utc>) -> bool {
        self.expires_at() <= now
    }
}

/// A state record to write and the condition the stored one must meet for it
/// ([`TaskStore::put_as`], [`TaskStore::put_with_input`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Guarded<'a> {
    pub record: &'a StateRecord,
    pub condition: &'a Condition,
}

impl<'a> Guarded<'a> {
    pub fn new(record: &'a StateRecord, condition: &'a Condition) -> Self {
        Self { record, condition }
    }
}

/// What [`TaskStore::create`] writes: a task, its first state record and, if the request had
/// one, its idempotency key; for a schedule's run, the schedule's new current task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NewTask<'a> {
    pub task: &'a Task,
    pub record: &'a StateRecord,
    pub key: Option<&'a IdempotencyRecord>,
    /// A schedule's run: the task becomes the schedule's current task, if the current task is
    /// still the one the run read.
    pub turn: Option<Turn<'a>>,
    /// A task of a workflow with a concurrency limit: its place in line at its gate, taken in
    /// the same transaction ([`Gates`]).
    pub gate: Option<GatePlace<'a>>,
}

impl<'a> NewTask<'a> {
    /// `task` and its first `record`, with no idempotency key.
    pub fn new(task: &'a Task, record: &'a StateRecord) -> Self {
        Self {
            task,
            record,
            key: None,
            turn: None,
            gate: None,
        }
    }
}

/// A task's place at a concurrency gate (items `GATE#<gate>`): the tasks of one workflow with
/// one value of its concurrency key, at most `limit` of them holding it at once, the others
/// waiting in line in the order they were created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GatePlace<'a> {
    /// The gate: the workflow's name and the key's value (`<workflow>#<value>`).
    pub gate: &'a str,
    pub task_id: TaskId,
    /// When the task was created: its place in line (ties by id).
    pub created_at: DateTime<Utc>,
    /// How many tasks may hold the gate at once.
    pub limit: u32,
}

impl<'a> GatePlace<'a> {
    /// The place of task `task_id` (created at `created_at`) at the gate its record holds.
    pub fn of(
        hold: &'a crate::domain::state::GateHold,
        task_id: TaskId,
        created_at: DateTime<Utc>,
    ) -> Self {
        Self {
            gate: &hold.gate,
            task_id,
            created_at,
            limit: hold.limit,
        }
    }
}

/// An admission at a gate ([`Gates::enter`]): the task's place, and the write of its record that
/// goes with it (its claim).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GateAdmission<'a> {
    pub place: GatePlace<'a>,
    pub put: Guarded<'a>,
    pub now: DateTime<Utc>,
}

/// What a gate answered an admission ([`Gates::enter`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GateAnswer {
    /// The task holds the gate now, and its record was written.
    Admitted,
    /// The gate is full, or tasks created before this one wait: nothing was written.
    Waiting(GateState),
}

/// A gate as one task sees it: who holds it, and how many wait before the task.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GateState {
    pub holders: Vec<TaskId>,
    /// The tasks in line before this one (`None`: it is not in line: it holds the gate, or
    /// left it).
    pub ahead: Option<u32>,
}

/// Concurrency gates (items `GATE#<gate>`): a head listing the holders, and one entry per task in
/// line. A place is taken when the task is created ([`NewTask::gate`]); a task is admitted
/// only while the gate has room and no task created before it waits, in the same transaction
/// as its record's write; it leaves (held or waiting) once, and the tasks then first in line
/// are named so that they can be sent on: the end of one hands the gate to the next, with no
/// polling.
#[async_trait]
pub trait Gates: Send + Sync {
    /// Admits `a.place`'s task and writes `a.put` (both or neither), if fewer than the limit
    /// hold the gate and the task is among the first in line for the room left. A record
    /// whose condition fails, or a gate that moved meanwhile, is
    /// [`StoreError::ConditionFailed`]: read again and try again.
    async fn enter(&self, a: GateAdmission<'_>) -> Result<GateAnswer, StoreError>;
    /// The task leaves the gate (it held it, or waited in line; idempotent): the tasks now
    /// first in line for the room left, in order.
    async fn leave(&self, place: GatePlace<'_>) -> Result<Vec<TaskId>, StoreError>;
    /// The gate as `place`'s task sees it (eventually consistent).
    async fn gate_state(&self, place: GatePlace<'_>) -> Result<GateState, StoreError>;
}

/// A schedule's current task (item `CURRENT#<schedule>`): the task its newest run started,
/// and that run's time (the run's idempotency key).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CurrentRun {
    pub task_id: TaskId,
    pub run_at: DateTime<Utc>,
}

/// A schedule's run taking its turn ([`NewTask::turn`]): the new task becomes `schedule`'s
/// current task (run at `run_at`) if the current task still is `after` (`None`: the schedule
/// has none yet). Two runs that read the same current task cannot both start one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Turn<'a> {
    pub schedule: &'a str,
    pub run_at: DateTime<Utc>,
    pub after: Option<TaskId>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreateOutcome {
    Created,
    /// The idempotency key is taken; nothing was written.
    KeyExists(IdempotencyRecord),
    /// The schedule's current task is no longer the one [`Turn::after`] names (another run
    /// started a task first), or another run's write of it met this one (DynamoDB's
    /// `TransactionConflict`); nothing was written, and the run reads the current task again.
    /// A taken key is answered first.
    TurnTaken,
}

/// The state store: every item the state table holds, one small trait per kind of item
/// ([`TaskStore`], [`TaskLists`], [`DueIndex`], [`Leases`], [`Breakers`], [`RateLimits`]), each
/// in its own file of [`crate::aws`]'s DynamoDB adapter. The handlers hold the whole of it; a
/// component that needs one kind takes the narrow trait (an `Arc<dyn StateStore>` upcasts).
pub trait StateStore: TaskStore + TaskLists + DueIndex + Leases + Gates + AgentStore {}

/// What an agent keeps of every service: its breaker, its rate items and its slots.
pub trait AgentStore: Breakers + LimitStore {}
impl<T: Breakers + LimitStore + ?Sized> AgentStore for T {}

/// What a service's limits are kept in: the rate items and the slot items.
pub trait LimitStore: RateLimits + Slots {}
impl<T: RateLimits + Slots + ?Sized> LimitStore for T {}

impl<T> StateStore for T where
    T: TaskStore + TaskLists + DueIndex + Leases + Gates + AgentStore + ?Sized
{
}

/// Tasks, their state records and idempotency keys (items `TASK#<id>` and `IDEM#<key>`).
#[async_trait]
pub trait TaskStore: Send + Sync {
    /// Writes the task, its state record and (if given) the idempotency key in one atomic
    /// transaction; each must not exist yet. A stored key counts only until it expires
    /// ([`IdempotencyRecord::expired`] at the new key's `created_at`) and while its task
    /// exists: then the new key replaces it, as if DynamoDB's TTL had deleted it. With a
    /// [`Turn`], the same transaction makes the task its schedule's current task, if the
    /// current task is still [`Turn::after`] ([`CreateOutcome::TurnTaken`] otherwise).
    async fn create(&self, new: NewTask<'_>) -> Result<CreateOutcome, StoreError>;
    /// Strongly consistent read of schedule `schedule`'s current task, if it has one.
    async fn current_run(&self, schedule: &str) -> Result<Option<CurrentRun>, StoreError>;
    /// Strongly consistent read of the task and its state record.
    async fn get(&self, id: TaskId) -> Result<Option<(Task, StateRecord)>, StoreError>;
    /// Strongly consistent read of the state record.
    async fn get_state(&self, id: TaskId) -> Result<Option<StateRecord>, StoreError>;
    /// Replaces the state record if `condition` holds, else [`StoreError::ConditionFailed`]:
    /// one write request with a new id (see [`TaskStore::put_as`]).
    async fn put(&self, record: &StateRecord, condition: &Condition) -> Result<(), StoreError> {
        self.put_as(Guarded::new(record, condition), rand::random())
            .await
    }
    /// [`TaskStore::put`] as the request `write`. A write whose response was lost is retried
    /// (by the SDK) as the same request, fails its condition against its own first attempt,
    /// and reads back: it succeeded if the stored record is this one *and was written by this
    /// request*. Two writers making the very same transition from the same version (two
    /// supervisors recovering one record in one millisecond) are two requests: one wins, the
    /// other gets a lost race, however alike their records.
    async fn put_as(&self, put: Guarded<'_>, write: u64) -> Result<(), StoreError>;
    /// Writes `put.record` under `put.condition` and, in the same transaction, gives its task the new
    /// input of `task` (an operator's retry on a patched input), with its revision and the
    /// earlier inputs steps ran with: both or neither. `ConditionFailed` when the record's
    /// condition does not hold (or the task item is gone, or at another revision than the one
    /// before `task`'s).
    async fn put_with_input(&self, put: Guarded<'_>, task: &Task) -> Result<(), StoreError>;
    /// Starts the retention clock of a task whose record is final
    /// ([`ProcessState::is_final`]): its items expire (DynamoDB TTL, `ExpiresAt`) the store's
    /// retention after the record's `updated_at`. Idempotent; a no-op for a record that is not
    /// final, or with no retention. The state record's own expiry is written with it by `put`.
    async fn expire_task(&self, record: &StateRecord) -> Result<(), StoreError>;
    /// How long a final task is kept (`None`: for good): what [`TaskStore::expire_task`] starts.
    fn retention(&self) -> Option<chrono::Duration>;
    /// Deletes task `record.task_id`'s items (its task item and state record) if its record is
    /// still at `record.version`: the end of its retention, once its payloads are deleted.
    /// `ConditionFailed` if the record moved on; `Ok` if it is gone already.
    async fn forget_task(&self, record: &StateRecord) -> Result<(), StoreError>;
}

/// The lists of tasks an operator and a caller read: the state index and the caller index
/// (read-only views of the items [`TaskStore`] writes).
#[async_trait]
pub trait TaskLists: Send + Sync {
    /// One page of the records `of` a state (and workflow), newest first (by `UpdatedAt`, ties
    /// by id) across every shard, as `page` asks (`next` is set when more may follow). Served
    /// by the state index, never a scan (a page reads up to `limit` entries of each shard);
    /// eventually consistent.
    async fn list(&self, of: InState<'_>, page: Paging<'_>) -> Result<Page, StoreError>;
    /// How many records are `of` a state (and workflow), counting up to `cap`. Served by the
    /// state index (a count query per shard, keys only); eventually consistent.
    async fn count(&self, of: InState<'_>, cap: u64) -> Result<Count, StoreError>;
    /// One page of `caller`'s tasks, newest first (by creation), as `page` asks (its cursor's
    /// `at_ms` is, here, the last task's creation time). Served by the caller index;
    /// eventually consistent.
    async fn list_by_caller(&self, caller: &Caller, page: Paging<'_>) -> Result<Page, StoreError>;
    /// One page of the tasks found by a search key, as `q` narrows them, newest first (by
    /// creation, ties by id; the cursor's `at_ms` is the last task's creation time). Served by
    /// the key indexes (one per key slot, merged), never a scan; eventually consistent. A
    /// state asked for is checked on the page's records, so a page may hold fewer than
    /// `limit` tasks while `next` says more may follow.
    async fn list_by_key(&self, q: KeyQuery<'_>, page: Paging<'_>) -> Result<Page, StoreError>;
}

/// Which tasks a search by key reads ([`TaskLists::list_by_key`]): those with `key`, and of
/// each filter given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyQuery<'a> {
    pub key: &'a crate::domain::keys::SearchKey,
    /// Only this caller's tasks (the task API's own search).
    pub caller: Option<&'a Caller>,
    pub workflow: Option<&'a str>,
    pub state: Option<ProcessState>,
    /// Created at or after this.
    pub from: Option<DateTime<Utc>>,
    /// Created before this.
    pub to: Option<DateTime<Utc>>,
}

impl<'a> KeyQuery<'a> {
    /// Every task with `key`.
    pub fn new(key: &'a crate::domain::keys::SearchKey) -> Self {
        Self {
            key,
            caller: None,
            workflow: None,
            state: None,
            from: None,
            to: None,
        }
    }

    /// Whether task `t` is one of those the search reads, its state aside ([`KeyQuery::state`]
    /// is checked on its record).
    pub fn holds(&self, t: &Task) -> bool {
        let ms = t.created_at.timestamp_millis();
        t.keys.iter().any(|k| &k.key == self.key)
            && self.caller.is_none_or(|c| &t.caller == c)
            && self.workflow.is_none_or(|w| t.workflow == w)
            && self.from.is_none_or(|f| ms >= f.timestamp_millis())
            && self.to.is_none_or(|to| ms < to.timestamp_millis())
    }
}

/// Which records a state list reads: those in `state`, of `workflow` if given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InState<'a> {
    pub state: ProcessState,
    pub workflow: Option<&'a str>,
}

impl InState<'_> {
    /// Whether `r` is one of the records this list reads: in the state index
    /// ([`StateRecord::listed_by_state`]), in `state`, of `workflow` if given.
    pub fn holds(&self, r: &StateRecord) -> bool {
        r.listed_by_state()
            && r.process_state == self.state
            && self.workflow.is_none_or(|w| r.workflow == w)
    }
}

/// Which page of a list to read: at most `limit` rows, starting strictly after `after`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Paging<'a> {
    pub limit: usize,
    pub after: Option<&'a Cursor>,
}

/// The due index the supervisor sweeps: the state records with a deadline, by shard.
#[async_trait]
pub trait DueIndex: Send + Sync {
    /// Records of due-index `q.shard` due at or before `q.now`, oldest first (by due key, ties
    /// by id), starting strictly after `q.after` (at most `q.limit`): a sweep pages past
    /// entries it could not recover instead of reading them again. Eventually consistent:
    /// callers re-read and write conditionally.
    async fn due(&self, q: DueQuery<'_>) -> Result<Vec<DueEntry>, StoreError>;
    /// How many shards the due index has.
    fn due_shards(&self) -> u32;
}

/// One page of a due-index shard: the entries of `shard` due at or before `now`, at most
/// `limit`, strictly after `after`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DueQuery<'a> {
    pub shard: u32,
    pub now: DateTime<Utc>,
    pub limit: usize,
    pub after: Option<&'a DueEntry>,
}

/// Named leases (items `LEASE#<name>`): one holder at a time.
#[async_trait]
pub trait Leases: Send + Sync {
    /// Takes (or renews) the lease `claim.name` for `claim.owner` until [`LeaseClaim::until`],
    /// if it is free, expired or already the owner's: a conditional write, so at most one
    /// owner holds it at a time (Leader Election). `false`: someone else holds it.
    async fn acquire_lease(&self, claim: LeaseClaim<'_>) -> Result<bool, StoreError>;
    /// Gives the lease up if `owner` still holds it (a no-op otherwise).
    async fn release_lease(&self, name: &str, owner: &str) -> Result<(), StoreError>;
}

/// A claim on the lease `name` by `owner` at `now`, for `ttl`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseClaim<'a> {
    pub name: &'a str,
    pub owner: &'a str,
    pub now: DateTime<Utc>,
    pub ttl: chrono::Duration,
}

impl LeaseClaim<'_> {
    /// When the lease, if taken, runs out.
    pub fn until(&self) -> DateTime<Utc> {
        self.now + self.ttl
    }
}

/// The services' shared circuit breakers (items `BREAKER#<name>`).
#[async_trait]
pub trait Breakers: Send + Sync {
    /// The shared circuit breaker of service `name`, if stored.
    async fn get_breaker(&self, name: &str) -> Result<Option<BreakerRecord>, StoreError>;
    /// The same as an eventually consistent read sees it: it may miss a write of the last
    /// second or so, at half the read's price. For the check before a call, which the read
    /// cache already lets lag; a decision that must see the latest write reads
    /// [`Breakers::get_breaker`]. Defaults to it.
    async fn peek_breaker(&self, name: &str) -> Result<Option<BreakerRecord>, StoreError> {
        self.get_breaker(name).await
    }
    /// Writes `record` if the stored breaker is still at `record.version - 1` (absent, for
    /// version 1). `false`: another agent moved it first.
    async fn put_breaker(&self, record: &BreakerRecord) -> Result<bool, StoreError>;
    /// Writes `mark` to the pace of service `name` (read with its breaker, written apart from
    /// it: a move of the breaker keeps it) if [`crate::domain::Pace::apply`] allows it against
    /// the pace stored. `false`: it does not (another agent wrote a later mark).
    async fn mark_pace(
        &self,
        name: &str,
        mark: crate::domain::PaceMark,
    ) -> Result<bool, StoreError>;
}

/// The callers' rate limits (items `RATE#<key>`).
#[async_trait]
pub trait RateLimits: Send + Sync {
    /// Admits one request of the rate-limited `ask.key` (a caller's digest) at `ask.now`, or
    /// says when the next one would be admitted: GCRA ([`crate::domain::rate`]) on one item
    /// per key.
    async fn admit(&self, ask: RateRequest<'_>) -> Result<Admission, StoreError>;
}

/// The services' concurrency limits (items `SLOTS#<key>`): leases on a key's slots.
#[async_trait]
pub trait Slots: Send + Sync {
    /// Takes one of `ask.limit` slots of `ask.key` for `ask.holder` until `ask.until`, if fewer
    /// than `limit` unexpired leases are held ([`crate::domain::limits::take_slot`]); otherwise
    /// says when the first one runs out. At most `limit` holders at any time, however many
    /// agents take slots at once.
    async fn take_slot(&self, ask: SlotRequest<'_>) -> Result<SlotAnswer, StoreError>;
    /// Gives back the slot `holder` took (a no-op if its lease ran out and was taken over).
    async fn free_slot(&self, key: &str, holder: &str) -> Result<(), StoreError>;
    /// The unexpired leases of `key` at `now` (the console's calls in flight).
    async fn slots_held(&self, key: &str, now: DateTime<Utc>) -> Result<u32, StoreError>;
}

/// One slot asked for: of `key`, under `limit`, by `holder` (unique per call), at `now`, until
/// `until` (the call's deadline: a dead holder's slot is free then).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotRequest<'a> {
    pub key: &'a str,
    pub limit: u32,
    pub holder: &'a str,
    pub now: DateTime<Utc>,
    pub until: DateTime<Utc>,
}

/// What [`Slots::take_slot`] answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotAnswer {
    Taken,
    /// Every slot is held; the first lease runs out at `next_free` (at the latest).
    Full {
        next_free: DateTime<Utc>,
    },
}

/// One request to admit under a rate limit: of `key` (a caller's digest), under `limit`, at
/// `now`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateRequest<'a> {
    pub key: &'a str,
    pub limit: &'a RateLimit,
    pub now: DateTime<Utc>,
}

/// One entry of the due index: a record and the due key it is filed under (at or before its
/// earliest deadline; see [`StateRecord::due_key`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DueEntry {
    pub due_at: DateTime<Utc>,
    pub task_id: TaskId,
}

/// The kinds of definitions the catalog keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Workflow,
    Service,
    Schedule,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Workflow => "WORKFLOW",
            Self::Service => "SERVICE",
            Self::Schedule => "SCHEDULE",
        }
    }
}

/// A definition as the catalog keeps it: immutable once published.
#[derive(Debug, Clone, PartialEq)]
pub struct Stored {
    pub kind: Kind,
    pub name: String,
    pub version: u32,
    pub body: serde_json::Value,
    pub published_at: DateTime<Utc>,
}

/// What [`Catalog::publish`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Published {
    pub version: u32,
    /// `false`: the body equals the latest version, which is returned instead.
    pub created: bool,
}

/// One name in the catalog and its newest version.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    pub name: String,
    pub latest: u32,
}

/// The canonical text of a definition (object keys sorted at every level), which its hash and
/// the "same as the latest" check use.
pub fn canonical(v: &serde_json::Value) -> String {
    fn sorted(v: &serde_json::Value) -> serde_json::Value {
        match v {
            serde_json::Value::Object(m) => {
                let mut keys: Vec<_> = m.keys().collect();
                keys.sort();
                let mut out = serde_json::Map::new();
                for k in keys {
                    out.insert(k.clone(), sorted(&m[k]));
                }
                serde_json::Value::Object(out)
            }
            serde_json::Value::Array(a) => serde_json::Value::Array(a.iter().map(sorted).collect()),
            other => other.clone(),
        }
    }
    sorted(v).to_string()
}

/// What to publish: `body` as the next version of the definition `name` of `kind`, at `now`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Publication<'a> {
    pub kind: Kind,
    pub name: &'a str,
    pub body: &'a Value,
    pub now: DateTime<Utc>,
}

/// Which definition to read: `version` of the definition `name` of `kind` (`None`: the newest).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DefinitionRef<'a> {
    pub kind: Kind,
    pub name: &'a str,
    pub version: Option<u32>,
}

impl<'a> DefinitionRef<'a> {
    /// The newest version of `name`.
    pub fn newest(kind: Kind, name: &'a str) -> Self {
        Self {
            kind,
            name,
            version: None,
        }
    }

    /// Version `version` of `name`.
    pub fn at(kind: Kind, name: &'a str, version: u32) -> Self {
        Self {
            kind,
            name,
            version: Some(version),
        }
    }
}

/// The catalog of published workflows and services: versioned, and each version immutable.
#[async_trait]
pub trait Catalog: Send + Sync {
    /// Publishes `body` as the next version of `name` (1 for a new name), unless it equals the
    /// newest version, which is then returned with `created: false`. Two publishers racing get
    /// distinct versions; a published version never changes.
    async fn publish(&self, p: Publication<'_>) -> Result<Published, StoreError>;
    /// One version of a definition (`None`: the newest).
    async fn definition(&self, wanted: DefinitionRef<'_>) -> Result<Option<Stored>, StoreError>;
    /// Every name of `kind` with its newest version, by name.
    async fn entries(&self, kind: Kind) -> Result<Vec<Entry>, StoreError>;
}

/// Why a payload could not be kept or read.
#[derive(Debug, thiserror::Error)]
pub enum PayloadError {
    /// No object under the reference (never written, or its task's retention deleted it), or
    /// no object or bucket where the user's location ([`Payloads::read_object`]) points. The
    /// text names what is missing: `payload <key>`, `object s3://b/k`, or `bucket b`.
    #[error("{0} not found")]
    NotFound(String),
    /// The object's bytes are not the ones its reference names: never silently used.
    #[error("payload {0} does not match its reference")]
    Corrupt(String),
    /// The store could not be reached or refused the call; the caller may retry.
    #[error("payload store unavailable: {0}")]
    Unavailable(String),
    /// The store refused the request in a way no retry changes (access denied, no bucket).
    #[error("the payload store rejected the request: {0}")]
    Rejected(String),
    /// An object the user names ([`Payloads::read_object`]) is larger than its reader takes:
    /// refused before it is read whole, so a huge list never fills a function's memory.
    #[error("object {location} is over {max} bytes")]
    TooLarge { location: String, max: usize },
}

/// The lines of a JSON Lines payload, in order: each one JSON value's text (compact: no line
/// break), or why the next could not be had (the write stops and keeps nothing).
pub type LineStream<'a> = futures::stream::BoxStream<'a, Result<Vec<u8>, PayloadError>>;

/// Where payloads too large for a task's items are kept ([`PayloadRef`]): the stack's S3
/// bucket, or memory or files under `sas-local`. Objects are immutable and named by their task
/// and their bytes' hash, so every write is idempotent and needs no condition: two writers of
/// one name write the same bytes. A JSON Lines payload ([`Payloads::put_lines`]) is the one
/// exception: named when its write begins, each write a new name (see
/// [`crate::domain::payload::Lines`]).
#[async_trait]
pub trait Payloads: Send + Sync {
    /// Keeps `body` as a payload of `task_id`; its reference. Writing the same bytes again
    /// answers the same reference.
    async fn put(&self, task_id: TaskId, body: &[u8]) -> Result<PayloadRef, PayloadError>;
    /// The bytes `r` names, checked against it ([`PayloadError::Corrupt`] otherwise).
    async fn get(&self, r: &PayloadRef) -> Result<Vec<u8>, PayloadError>;
    /// A URL that reads the object `r` names for `ttl`, without credentials of its own (S3's
    /// presigned GET), for a caller too far from the store to read it; `None` where objects
    /// have no such URL (memory, files): the caller is then answered the bytes. The URL is a
    /// credential until it expires: it is answered, never logged.
    async fn read_url(
        &self,
        _r: &PayloadRef,
        _ttl: std::time::Duration,
    ) -> Result<Option<String>, PayloadError> {
        Ok(None)
    }
    /// Keeps `lines` as a JSON Lines payload of `task_id` (each item one JSON value, compact,
    /// written as it comes, each followed by a line break: [`LinesWriter`]) and answers its
    /// reference, with its SHA-256, length and line count. The whole is never held: on S3 it
    /// goes up in parts. The object is named when the write begins, not by its bytes; it is
    /// complete and readable once this answers, and not before (a write that fails midway,
    /// or whose `lines` fail, leaves no object). No bound but the store's.
    ///
    /// [`LinesWriter`]: crate::domain::payload::LinesWriter
    async fn put_lines(
        &self,
        task_id: TaskId,
        lines: LineStream<'_>,
    ) -> Result<PayloadRef, PayloadError>;
    /// Deletes every payload of `task_id` (its retention passed); how many were deleted.
    /// Deleting none is no error.
    async fn delete_task(&self, task_id: TaskId) -> Result<usize, PayloadError>;
    /// Deletes the one payload `r` names: one written for a task that was then not stored (its
    /// caller's idempotency key or its schedule's turn was taken), which no purge would find.
    /// None there is no error.
    async fn delete(&self, r: &PayloadRef) -> Result<(), PayloadError>;
    /// The bytes of an object the user names (a distributed forEach's list): any bucket the
    /// deployment may read, not a payload of sas's own. Refuses an object over `max_bytes`
    /// ([`PayloadError::TooLarge`]) without reading it whole. A missing object or bucket is
    /// [`PayloadError::NotFound`] (its text says which), access denied is
    /// [`PayloadError::Rejected`], a transient fault [`PayloadError::Unavailable`]. sas's own
    /// payloads are never read this way: on S3 a location in the stack's bucket is `Rejected`
    /// (it holds every caller's payloads); memory and files keep the two apart.
    async fn read_object(
        &self,
        location: &ObjectLocation,
        max_bytes: usize,
    ) -> Result<Vec<u8>, PayloadError>;
}

/// Why the deployment's timer of a schedule could not be set or removed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TimetableError(pub String);

/// The deployment's timers of schedules: on AWS, an EventBridge Scheduler schedule each, in the
/// stack's schedule group, sending every run to the scheduler's work queue. The catalog is the
/// truth (a run checks it: a paused or deleted schedule starts nothing whatever its timer does);
/// this keeps the timers in step with it. `sas-local` runs its schedules from the catalog and
/// sets no timer ([`NoTimetable`]).
#[async_trait]
pub trait Timetable: Send + Sync {
    /// Creates or changes the timer of `schedule` (its expression, time zone, paused or not).
    async fn put(&self, schedule: &crate::domain::schedule::Schedule)
    -> Result<(), TimetableError>;
    /// Removes the timer of schedule `name` (none there: nothing to do).
    async fn remove(&self, name: &str) -> Result<(), TimetableError>;
}

/// No timers: the schedules are run in process from the catalog (`sas-local`).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoTimetable;

#[async_trait]
impl Timetable for NoTimetable {
    async fn put(&self, _: &crate::domain::schedule::Schedule) -> Result<(), TimetableError> {
        Ok(())
    }
    async fn remove(&self, _: &str) -> Result<(), TimetableError> {
        Ok(())
    }
}

/// What the operator's list shows of one record.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    pub task_id: TaskId,
    pub workflow: String,
    pub process_state: ProcessState,
    pub step: Option<String>,
    pub failure_count: u32,
    pub attempt: u64,
    pub last_error: Option<String>,
    pub updated_at: DateTime<Utc>,
    /// The state list's order ([`StateRecord::listed_since`]): when the task entered its
    /// state, or, while it is `Pending` or `Processing`, when it was created.
    pub since: DateTime<Utc>,
}

impl Summary {
    pub fn of(r: &StateRecord) -> Self {
        Self {
            task_id: r.task_id,
            workflow: r.workflow.clone(),
            process_state: r.process_state,
            step: r.current_step().map(str::to_owned),
            failure_count: r.failure_count,
            attempt: r.attempt,
            last_error: r.last_error.clone(),
            updated_at: r.updated_at,
            since: r.listed_since(),
        }
    }
}

/// A page of [`TaskLists::list`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    pub items: Vec<Summary>,
    pub next: Option<Cursor>,
}

impl Page {
    /// The newest `limit` of `rows` (in the list's order), with a cursor after the last one
    /// if more rows were left out or `more` may follow.
    pub fn newest_first(mut rows: Vec<Summary>, limit: usize, more: bool) -> Self {
        rows.sort_by_key(|s| Cursor::order_key(s.since.timestamp_millis(), s.task_id));
        let more = more || rows.len() > limit;
        rows.truncate(limit);
        let next = more.then(|| rows.last().map(Cursor::after)).flatten();
        Self { items: rows, next }
    }
}

/// Where a page ends: the last record returned (when it entered its state, or for a caller's
/// list its creation time, and its id); the next page starts strictly after it in the order
/// (time descending, then id ascending). Opaque to clients: [`Cursor::encode`] makes a hex
/// token, [`Cursor::decode`] refuses anything else.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    /// The list's sort time of the last row, in milliseconds.
    pub at_ms: i64,
    pub task_id: TaskId,
}

impl Cursor {
    /// The cursor after the row at (`at_ms`, `task_id`).
    pub fn at(at_ms: i64, task_id: TaskId) -> Self {
        Self { at_ms, task_id }
    }

    pub fn after(s: &Summary) -> Self {
        Self {
            at_ms: s.since.timestamp_millis(),
            task_id: s.task_id,
        }
    }

    /// The order of a list: newest first, ties by id.
    pub fn order_key(ms: i64, id: TaskId) -> (std::cmp::Reverse<i64>, TaskId) {
        (std::cmp::Reverse(ms), id)
    }

    /// Whether the row at (`ms`, `id`) comes after this cursor (belongs to a later page).
    pub fn precedes(&self, ms: i64, id: TaskId) -> bool {
        Self::order_key(ms, id) > Self::order_key(self.at_ms, self.task_id)
    }

    pub fn encode(&self) -> String {
        hex::encode(format!("v2|{}|{}", self.at_ms, self.task_id))
    }

    pub fn decode(token: &str) -> Option<Self> {
        let raw = String::from_utf8(hex::decode(token).ok()?).ok()?;
        let mut parts = raw.split('|');
        if parts.next()? != "v2" {
            return None;
        }
        let c = Self {
            at_ms: parts.next()?.parse().ok()?,
            task_id: parts.next()?.parse().ok()?,
        };
        parts.next().is_none().then_some(c)
    }
}

/// How many records are in a state: exact up to the cap asked for, else `at_least`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Count {
    pub count: u64,
    /// Counting stopped at the cap: there are at least `count`.
    pub capped: bool,
}

#[derive(Debug, thiserror::Error)]
#[error("queue error: {0}")]
pub struct QueueError(pub String);

/// A message as a consumer receives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceivedMessage {
    pub message_id: String,
    pub receipt_handle: String,
    pub body: String,
    pub receive_count: u32,
}

/// A message queue (SQS semantics: at-least-once, visibility timeout, delayed delivery).
#[async_trait]
pub trait Queue: Send + Sync {
    /// Sends `body` to a standard queue after `delay`: by default, a [`Queue::send_fair`] of no
    /// tenant (a queue whose fair send goes through its plain send overrides this).
    async fn send(&self, queue_url: &str, body: &str, delay: Duration) -> Result<(), QueueError> {
        self.send_fair(FairMessage {
            queue_url,
            group: None,
            body,
            delay,
        })
        .await
    }
    /// Receives up to `ask.max` messages, waiting up to `ask.wait` for the first.
    async fn receive(&self, ask: ReceiveRequest<'_>) -> Result<Vec<ReceivedMessage>, QueueError>;
    async fn delete(&self, queue_url: &str, receipt_handle: &str) -> Result<(), QueueError>;
    /// Sends `message` to a FIFO queue, in its group, now (a FIFO queue has no per-message
    /// delay). A queue that is not FIFO refuses it, as a FIFO queue refuses [`Queue::send`]
    /// (SQS: `MessageGroupId` is for FIFO queues only, and required there). The caller passes a
    /// group and a deduplication id that SQS takes: 1 to 128 characters of `A-Z a-z 0-9` and
    /// ASCII punctuation (``!"#$%&'()*+,-./:;<=>?@[\]^_`{|}~``); any other is an error, never
    /// rewritten (a hashed id would hide which run a group is). A send whose `dedup_id` was
    /// sent within [`DEDUP_WINDOW`] is accepted and dropped: what makes a retried send safe.
    async fn send_grouped(&self, message: GroupedMessage<'_>) -> Result<(), QueueError>;
    /// Sends `message` to a standard queue as its tenant's (SQS fair queues: a
    /// `MessageGroupId` on a standard queue), after its delay. When consumers fall behind,
    /// the queue delivers the messages of tenants with few in flight before a noisy tenant's
    /// backlog. A FIFO queue refuses it (a FIFO message takes a deduplication id and no
    /// delay); a message of no tenant is a plain [`Queue::send`]. The group follows
    /// [`Queue::send_grouped`]'s rules.
    async fn send_fair(&self, message: FairMessage<'_>) -> Result<(), QueueError>;
    /// Copies a poison message to a dead-letter queue with the reason it can never be
    /// processed (SQS: the message attribute `sas-reason`; the body stays as it was, so it can
    /// be redriven). By default, a plain send.
    async fn send_dead_letter(&self, letter: DeadLetter<'_>) -> Result<(), QueueError> {
        self.send(letter.queue_url, letter.body, Duration::ZERO)
            .await
    }
}

/// A receive from `queue_url`: up to `max` messages, waiting up to `wait` for the first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReceiveRequest<'a> {
    pub queue_url: &'a str,
    pub max: u32,
    pub wait: Duration,
}

impl<'a> ReceiveRequest<'a> {
    /// The messages visible on `queue_url` now: up to ten (SQS's most), without waiting.
    pub fn visible(queue_url: &'a str) -> Self {
        Self {
            queue_url,
            max: 10,
            wait: Duration::ZERO,
        }
    }
}

/// A message for a FIFO queue: delivered in order within its `group`, one group's messages
/// never in flight to two consumers at once, and a second send with the same `dedup_id` within
/// [`DEDUP_WINDOW`] dropped ([`Queue::send_grouped`]). One consumer at a time per group is what
/// lets each apply its messages to the group's shared item without racing another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupedMessage<'a> {
    pub queue_url: &'a str,
    /// SQS's `MessageGroupId`.
    pub group: &'a str,
    /// SQS's `MessageDeduplicationId`: the same id for a retry of the same message, another
    /// for another message (the queue compares ids, never bodies).
    pub dedup_id: &'a str,
    pub body: &'a str,
}

/// A tenant's message for a standard queue ([`Queue::send_fair`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FairMessage<'a> {
    pub queue_url: &'a str,
    /// SQS's `MessageGroupId` on a standard queue: the tenant (`None`: none).
    pub group: Option<&'a str>,
    pub body: &'a str,
    pub delay: Duration,
}

/// How long a FIFO queue remembers a deduplication id ([`GroupedMessage::dedup_id`]): SQS's
/// deduplication interval, 5 minutes. A retry later than that is delivered again.
pub const DEDUP_WINDOW: Duration = Duration::from_secs(5 * 60);

/// A poison message for the dead-letter queue `queue_url`: its `body`, as it was, and the
/// `reason` it can never be processed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeadLetter<'a> {
    pub queue_url: &'a str,
    pub body: &'a str,
    pub reason: &'a str,
}

/// The message attribute that carries a dead letter's reason.
pub const DEAD_LETTER_REASON: &str = "sas-reason";

#[derive(Debug, thiserror::Error)]
#[error("event bus error: {0}")]
pub struct PublishError(pub String);

/// The event bus (EventBridge).
#[async_trait]
pub trait EventBus: Send + Sync {
    async fn publish(&self, detail_type: &str, detail: &Value) -> Result<(), PublishError>;
}

/// One call an agent makes to a service.
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteCall {
    pub service: String,
    /// The step this call performs (or undoes).
    pub step: String,
    pub action: String,
    pub idempotency_key: String,
    pub task_id: TaskId,
    /// For an undo: the idempotency key of the step it undoes.
    pub undoes: Option<String>,
    /// The request body, built by the step's input mapping.
    pub input: serde_json::Value,
    /// When the step's deadline passes: no answer counts after it.
    pub deadline: DateTime<Utc>,
    /// For a callback step: where and with what token the service completes it later. A 2xx
    /// answer then means "accepted", not "done".
    pub callback: Option<CallbackAddress>,
    /// The values the service's per-key limits count this call under (the request's).
    pub limit_keys: crate::domain::limits::CallKeys,
}

/// Where a callback step's service completes the step: `POST {url}` (the task API's
/// `/tasks/{id}/callbacks/{token}`), once, within the step's callback timeout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CallbackAddress {
    pub token: String,
    pub url: String,
}

/// How a remote call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RemoteFault {
    /// Worth retrying: timeouts, connection errors, 408, 425, 429, 5xx.
    #[error("transient fault: {0}")]
    Transient(String),
    /// A call with the same idempotency key is still in progress at the service (409): the step
    /// may commit; retry the same key later. Transient, but never a refusal.
    #[error("in progress: {0}")]
    InProgress(String),
    /// The service is misconfigured (401, 403, 404 on its base path, a missing credential): an
    /// operator must act. Transient for the step (never a refusal), counted by the breaker.
    #[error("service misconfigured: {0}")]
    Misconfigured(String),
    /// The service refused the request for good, with a business outcome (`code`, e.g.
    /// `declined`) that a workflow can expect: the step had no effect.
    #[error("refused ({code}): {message}")]
    Refused { code: String, message: String },
    /// The service's shared circuit breaker is open: no call was made; try again at `until`.
    /// `paused`: an operator paused the service (`<service> paused by <who>: <why> (since
    /// <when>)`), so it opens only when one resumes it.
    #[error("{}", match paused { Some(p) => p.clone(), None => format!("circuit open until {until}") })]
    CircuitOpen {
        until: DateTime<Utc>,
        paused: Option<String>,
    },
    /// The call would go over one of the service's limits (`limit`: which, e.g. `service#bank
    /// over its limit of 5 calls in flight`): no call was made; try again at `until`. No
    /// failure of the service or the step.
    #[error("{limit}; try again at {until}")]
    Limited { until: DateTime<Utc>, limit: String },
    /// The service answered success with more than sas reads
    /// ([`crate::remote::MAX_ANSWER_BYTES`]): the step took effect, but its result cannot be
    /// kept (the agent reports it `Faulted`, `result_too_large`). A healthy answer for the
    /// breaker.
    #[error("answer too large: {0}")]
    TooLarge(String),
}

impl RemoteFault {
    /// Whether the fault says the service is unhealthy (counted by its circuit breaker).
    pub fn is_unhealthy(&self) -> bool {
        matches!(
            self,
            Self::Transient(_) | Self::Misconfigured(_) | Self::CircuitOpen { .. }
        )
    }
}

/// A remote service an agent wraps.
#[async_trait]
pub trait RemoteService: Send + Sync {
    /// Performs `call`, giving up after `timeout`.
    async fn call(
        &self,
        call: &RemoteCall,
        timeout: Duration,
    ) -> Result<serde_json::Value, RemoteFault>;
}

/// Where time comes from. Handlers never read the system clock directly, so tests can move it.
pub trait Clock: Send + Sync {
    fn now(&self) -> DateTime<Utc>;
}

/// The system clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// The system clock shifted by an adjustable offset: time still flows, and a test can jump
/// past a deadline instead of waiting for it. For tests and the bench (feature `testkit`).
#[cfg(any(test, feature = "testkit"))]
#[derive(Debug, Default)]
pub struct OffsetClock {
    offset_ms: AtomicI64,
}

#[cfg(any(test, feature = "testkit"))]
impl OffsetClock {
    pub fn advance(&self, by: chrono::Duration) {
        self.offset_ms
            .fetch_add(by.num_milliseconds(), Ordering::SeqCst);
    }
}

#[cfg(any(test, feature = "testkit"))]
impl Clock for OffsetClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now() + chrono::Duration::milliseconds(self.offset_ms.load(Ordering::SeqCst))
    }
}
