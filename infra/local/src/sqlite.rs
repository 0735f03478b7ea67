//! The state store and the catalog in one SQLite file: what `sas-local --data DIR` keeps
//! across restarts (the queues and the event bus stay in memory; see docs/local.md).
//!
//! One table per kind of item, keyed as the DynamoDB table's items are (`sas::aws`'s layout):
//!
//! | table             | key                      | DynamoDB item        |
//! |-------------------|--------------------------|----------------------|
//! | `tasks`           | `id`                     | `TASK#<id>` `TASK`   |
//! | `states`          | `id`                     | `TASK#<id>` `STATE`  |
//! | `idempotency_keys`| `key`                    | `IDEM#...` `IDEM`    |
//! | `schedule_runs`   | `schedule`               | `CURRENT#<schedule>` |
//! | `leases`          | `name`                   | `LEASE#<name>`       |
//! | `breakers`        | `name`                   | `BREAKER#<name>`     |
//! | `rate_limits`     | `key`                    | `RATE#<key>`         |
//! | `slots`           | `key`, `holder`          | `SLOTS#<key>`        |
//! | `definitions`     | `kind`, `name`, `version`| `<KIND>#<name>` `V#` |
//!
//! A task, a state record and a breaker are kept whole as JSON (the domain's serde form, plus
//! the state record's `callback_key`, which that form never shows); the other columns are what
//! the indexes read: the state list's (`process_state`, `since_ms`; empty for a record the
//! list leaves out, [`StateRecord::listed_by_state`]), the caller list's
//! (`caller`, `created_ms`) and the sparse due index's (`due_shard`, `due_ns`, set only for a
//! record with a due key). Every write runs in one transaction that first reads the row it
//! replaces and checks the write's condition on it (for a state record,
//! [`Condition::holds`](sas::domain::Condition::holds)), as the memory store does under its
//! lock and DynamoDB does with a condition expression. Reads are strongly consistent,
//! indexes included.
//!
//! One connection, behind a lock, each call on a blocking thread. The file is opened in WAL
//! mode with `synchronous=NORMAL` (a commit survives the process being killed; a power loss
//! may lose the last commits, never the file's consistency) and in exclusive locking mode: a
//! second process on the same file is refused at open.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use rusqlite::{Connection, OptionalExtension, Transaction, TransactionBehavior, params};
use sas::domain::rate::{Admission, Decision as RateDecision};
use sas::domain::{
    BreakerRecord, BreakerState, Caller, Condition, Pace, PaceMark, StateRecord, Task, TaskId,
};
use sas::ports::{
    Breakers, Catalog, Count, CreateOutcome, CurrentRun, Cursor, DefinitionRef, DueEntry, DueIndex,
    DueQuery, Entry, GateAdmission, GateAnswer, GatePlace, GateState, Gates, Guarded,
    IdempotencyRecord, InState, KeyQuery, Kind, LeaseClaim, Leases, NewTask, Page, Paging,
    Publication, Published, RateLimits, RateRequest, SlotAnswer, SlotRequest, Slots, StoreError,
    Stored, Summary, TaskLists, TaskStore, canonical,
};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The file a data folder keeps its store in.
pub const DATA_FILE: &str = "sas.sqlite3";

/// The layout this code reads and writes (`PRAGMA user_version`).
const SCHEMA_VERSION: i64 = 1;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS tasks (
    id TEXT PRIMARY KEY,
    caller TEXT NOT NULL,
    created_ms INTEGER NOT NULL,
    body TEXT NOT NULL,
    expires_ms INTEGER
);
CREATE INDEX IF NOT EXISTS tasks_by_caller ON tasks (caller, created_ms DESC, id);
CREATE TABLE IF NOT EXISTS gate_holders (
    gate TEXT NOT NULL,
    task_id TEXT NOT NULL,
    PRIMARY KEY (gate, task_id)
);
CREATE TABLE IF NOT EXISTS gate_line (
    gate TEXT NOT NULL,
    created_ms INTEGER NOT NULL,
    task_id TEXT NOT NULL,
    PRIMARY KEY (gate, created_ms, task_id)
);
CREATE TABLE IF NOT EXISTS task_keys (
    key TEXT NOT NULL,
    task_id TEXT NOT NULL,
    created_ms INTEGER NOT NULL,
    PRIMARY KEY (key, task_id)
);
CREATE INDEX IF NOT EXISTS task_keys_by_time ON task_keys (key, created_ms DESC, task_id);
CREATE TABLE IF NOT EXISTS states (
    id TEXT PRIMARY KEY,
    body TEXT NOT NULL,
    callback_key TEXT NOT NULL,
    write_id INTEGER,
    process_state TEXT NOT NULL,
    workflow TEXT NOT NULL,
    since_ms INTEGER NOT NULL,
    due_shard INTEGER,
    due_ns INTEGER
);
CREATE INDEX IF NOT EXISTS states_by_state ON states (process_state, since_ms DESC, id);
CREATE INDEX IF NOT EXISTS states_due ON states (due_shard, due_ns, id) WHERE due_ns IS NOT NULL;
CREATE TABLE IF NOT EXISTS idempotency_keys (
    key TEXT PRIMARY KEY,
    request_hash TEXT NOT NULL,
    task_id TEXT NOT NULL,
    created_ns INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS schedule_runs (
    schedule TEXT PRIMARY KEY,
    task_id TEXT NOT NULL,
    run_ns INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS leases (
    name TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    until_ns INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS breakers (
    name TEXT PRIMARY KEY,
    version INTEGER NOT NULL,
    body TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS paces (
    name TEXT PRIMARY KEY,
    body TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS rate_limits (
    key TEXT PRIMARY KEY,
    tat_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS slots (
    key TEXT NOT NULL,
    holder TEXT NOT NULL,
    until_ms INTEGER NOT NULL,
    PRIMARY KEY (key, holder)
);
CREATE TABLE IF NOT EXISTS definitions (
    kind TEXT NOT NULL,
    name TEXT NOT NULL,
    version INTEGER NOT NULL,
    body TEXT NOT NULL,
    canonical TEXT NOT NULL,
    published_ns INTEGER NOT NULL,
    PRIMARY KEY (kind, name, version)
);
";

/// Why a data folder could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("cannot create the data folder {path}: {source}")]
    Folder {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{path} is in use by another process (another sas-local with --data on this folder?): stop it, or give another --data DIR"
    )]
    InUse { path: PathBuf },
    #[error(
        "{path} was written by another version of sas-local (layout {found}, this one reads {SCHEMA_VERSION}): give another --data DIR"
    )]
    Layout { path: PathBuf, found: i64 },
    #[error("cannot delete what expired in {path}: {source}")]
    Purge { path: PathBuf, source: StoreError },
    #[error("cannot open {path}: {source}")]
    Sqlite {
        path: PathBuf,
        source: rusqlite::Error,
    },
}

/// The state store and catalog in an SQLite file (see the module's documentation).
#[derive(Clone)]
pub struct SqliteStore {
    conn: Arc<Mutex<Connection>>,
    shards: u32,
    /// How long a final task is kept (`None`: for good).
    retention: Option<chrono::Duration>,
    path: PathBuf,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.path)
            .field("shards", &self.shards)
            .finish()
    }
}

impl SqliteStore {
    /// Opens (creating it and its folder if missing) the store of the data folder `dir`, with
    /// a due index of `shards` shards, and deletes the tasks whose retention ran out.
    pub fn open(
        dir: &Path,
        shards: u32,
        retention: Option<chrono::Duration>,
    ) -> Result<Self, OpenError> {
        std::fs::create_dir_all(dir).map_err(|source| OpenError::Folder {
            path: dir.to_owned(),
            source,
        })?;
        let path = dir.join(DATA_FILE);
        let sqlite = |source| OpenError::Sqlite {
            path: path.clone(),
            source,
        };
        let mut conn = Connection::open(&path).map_err(sqlite)?;
        // Exclusive: the lock taken by the first write below is held until the connection
        // closes, so a second process on this file fails here rather than racing this one
        // with queues of its own.
        let setup = conn
            .pragma_update(None, "locking_mode", "EXCLUSIVE")
            .and_then(|()| conn.pragma_update(None, "journal_mode", "WAL"))
            .and_then(|()| conn.pragma_update(None, "synchronous", "NORMAL"))
            .and_then(|()| conn.busy_timeout(std::time::Duration::from_secs(2)));
        if let Err(e) = setup {
            return Err(in_use(&path, e));
        }
        let found: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .map_err(|e| in_use(&path, e))?;
        if found != 0 && found != SCHEMA_VERSION {
            return Err(OpenError::Layout { path, found });
        }
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| in_use(&path, e))?;
        tx.execute_batch(SCHEMA).map_err(sqlite)?;
        tx.pragma_update(None, "user_version", SCHEMA_VERSION)
            .map_err(sqlite)?;
        purge_expired(&tx, Utc::now()).map_err(|e| OpenError::Purge {
            path: path.clone(),
            source: e,
        })?;
        tx.commit().map_err(sqlite)?;
        Ok(Self {
            conn: Arc::new(Mutex::new(conn)),
            shards: shards.max(1),
            retention,
            path,
        })
    }

    /// The file the store is kept in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `f` in one immediate transaction on a blocking thread, committing what it wrote if
    /// it returns `Ok`.
    async fn write<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Transaction<'_>) -> Result<T, StoreError> + Send + 'static,
    {
        self.in_transaction(TransactionBehavior::Immediate, true, f)
            .await
    }

    /// Runs the reads of `f` on a blocking thread (one transaction: a consistent snapshot).
    async fn read<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Transaction<'_>) -> Result<T, StoreError> + Send + 'static,
    {
        self.in_transaction(TransactionBehavior::Deferred, false, f)
            .await
    }

    /// Runs `f` in one transaction of `behavior` on a blocking thread (the connection is
    /// shared); commits what it wrote if `commit` and `f` returns `Ok`, else rolls it back.
    async fn in_transaction<T, F>(
        &self,
        behavior: TransactionBehavior,
        commit: bool,
        f: F,
    ) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Transaction<'_>) -> Result<T, StoreError> + Send + 'static,
    {
        let conn = self.conn.clone();
        tokio::task::spawn_blocking(move || {
            let mut conn = conn
                .lock()
                .map_err(|_| StoreError::Unavailable("sqlite store lock poisoned".into()))?;
            let tx = conn.transaction_with_behavior(behavior).map_err(db)?;
            let out = f(&tx)?;
            if commit {
                tx.commit().map_err(db)?;
            }
            Ok(out)
        })
        .await
        .map_err(|e| StoreError::Unavailable(format!("sqlite store call failed: {e}")))?
    }
}

fn in_use(path: &Path, e: rusqlite::Error) -> OpenError {
    match e.sqlite_error_code() {
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked) => {
            OpenError::InUse {
                path: path.to_owned(),
            }
        }
        _ => OpenError::Sqlite {
            path: path.to_owned(),
            source: e,
        },
    }
}

/// Deletes the tasks (task, state record) whose retention ran out by `now`, and the
/// idempotency keys past their expiry or whose task is gone, as DynamoDB's TTL does some time
/// after `ExpiresAt`.
fn purge_expired(tx: &Transaction<'_>, now: DateTime<Utc>) -> Result<(), StoreError> {
    let ms = now.timestamp_millis();
    tx.execute(
        "DELETE FROM states WHERE id IN (SELECT id FROM tasks WHERE expires_ms <= ?1)",
        params![ms],
    )
    .map_err(db)?;
    tx.execute(
        "DELETE FROM task_keys WHERE task_id IN (SELECT id FROM tasks WHERE expires_ms <= ?1)",
        params![ms],
    )
    .map_err(db)?;
    tx.execute("DELETE FROM tasks WHERE expires_ms <= ?1", params![ms])
        .map_err(db)?;
    tx.execute(
        "DELETE FROM idempotency_keys WHERE created_ns <= ?1
         OR task_id NOT IN (SELECT id FROM tasks)",
        params![ns(now - sas::ports::IDEMPOTENCY_KEY_TTL)?],
    )
    .map_err(db)?;
    Ok(())
}

fn db(e: rusqlite::Error) -> StoreError {
    StoreError::Unavailable(format!("sqlite: {e}"))
}

fn corrupt(what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("{what}: {e}"))
}

fn to_json<T: Serialize>(v: &T) -> Result<String, StoreError> {
    serde_json::to_string(v).map_err(|e| StoreError::Rejected(format!("not serializable: {e}")))
}

fn from_json<T: for<'de> Deserialize<'de>>(what: &str, text: &str) -> Result<T, StoreError> {
    serde_json::from_str(text).map_err(|e| corrupt(what, e))
}

/// A time in nanoseconds (exact), for the columns whose order or comparison must match the
/// memory store's.
fn ns(t: DateTime<Utc>) -> Result<i64, StoreError> {
    t.timestamp_nanos_opt()
        .ok_or_else(|| StoreError::Rejected(format!("{t} is out of the store's range")))
}

fn from_ns(n: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_nanos(n)
}

fn parse_id(what: &str, s: &str) -> Result<TaskId, StoreError> {
    s.parse().map_err(|e| corrupt(what, e))
}

/// The `process_state` of a record the state list leaves out
/// ([`StateRecord::listed_by_state`]): no state's list reads it. (The column is the list's key
/// only; the record's own state is in its body.)
const UNLISTED: &str = "";

/// A state record as a row.
struct StateRow {
    body: String,
    callback_key: String,
    process_state: &'static str,
    workflow: String,
    since_ms: i64,
    due_shard: Option<i64>,
    due_ns: Option<i64>,
}

impl StateRow {
    fn of(r: &StateRecord, shards: u32) -> Result<Self, StoreError> {
        let due_ns = r.due_key.map(ns).transpose()?;
        Ok(Self {
            body: to_json(r)?,
            callback_key: r.callback_key.clone(),
            // The state list's key: none for a record it leaves out.
            process_state: if r.listed_by_state() {
                r.process_state.as_str()
            } else {
                UNLISTED
            },
            workflow: r.workflow.clone(),
            // The state list's order (`StateRecord::listed_since`).
            since_ms: r.listed_since().timestamp_millis(),
            due_shard: due_ns.map(|_| i64::from(r.due_shard(shards))),
            due_ns,
        })
    }
}

/// Inserts or replaces the state record `r` (its `write_id` left as it was unless given).
fn write_state(
    tx: &Transaction<'_>,
    id: &str,
    row: &StateRow,
    write: Option<u64>,
) -> Result<(), StoreError> {
    tx.execute(
        "INSERT INTO states (id, body, callback_key, write_id, process_state, workflow, since_ms, due_shard, due_ns)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
         ON CONFLICT (id) DO UPDATE SET body = ?2, callback_key = ?3,
             write_id = COALESCE(?4, write_id), process_state = ?5, workflow = ?6,
             since_ms = ?7, due_shard = ?8, due_ns = ?9",
        params![
            id,
            row.body,
            row.callback_key,
            // The request id, its bits as SQLite's signed integer.
            write.map(|w| w as i64),
            row.process_state,
            row.workflow,
            row.since_ms,
            row.due_shard,
            row.due_ns
        ],
    )
    .map_err(db)?;
    Ok(())
}

/// The stored state record of `id` and the request that wrote it last.
fn read_state(
    tx: &Transaction<'_>,
    id: &str,
) -> Result<Option<(StateRecord, Option<u64>)>, StoreError> {
    let row = tx
        .query_row(
            "SELECT body, callback_key, write_id FROM states WHERE id = ?1",
            params![id],
            |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, Option<i64>>(2)?,
                ))
            },
        )
        .optional()
        .map_err(db)?;
    row.map(|(body, key, write)| {
        let mut record: StateRecord = from_json("state record", &body)?;
        record.callback_key = key;
        Ok((record, write.map(|w| w as u64)))
    })
    .transpose()
}

fn read_task(tx: &Transaction<'_>, id: &str) -> Result<Option<Task>, StoreError> {
    tx.query_row("SELECT body FROM tasks WHERE id = ?1", params![id], |r| {
        r.get::<_, String>(0)
    })
    .optional()
    .map_err(db)?
    .map(|body| from_json("task", &body))
    .transpose()
}

/// Schedule `schedule`'s current task, if it has one.
fn read_run(tx: &Transaction<'_>, schedule: &str) -> Result<Option<CurrentRun>, StoreError> {
    tx.query_row(
        "SELECT task_id, run_ns FROM schedule_runs WHERE schedule = ?1",
        params![schedule],
        |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)),
    )
    .optional()
    .map_err(db)?
    .map(|(id, run)| {
        Ok(CurrentRun {
            task_id: parse_id("schedule run", &id)?,
            run_at: from_ns(run),
        })
    })
    .transpose()
}

fn write_task(tx: &Transaction<'_>, task: &Task) -> Result<(), StoreError> {
    tx.execute(
        "INSERT INTO tasks (id, caller, created_ms, body) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (id) DO UPDATE SET body = ?4",
        params![
            task.id.to_string(),
            task.caller.as_str(),
            task.created_at.timestamp_millis(),
            to_json(task)?
        ],
    )
    .map_err(db)?;
    Ok(())
}

/// Summaries of the state records a query returns (its first column: the body).
fn summaries(
    tx: &Transaction<'_>,
    sql: &str,
    args: &[&dyn rusqlite::ToSql],
) -> Result<Vec<Summary>, StoreError> {
    let mut stmt = tx.prepare(sql).map_err(db)?;
    let bodies = stmt
        .query_map(args, |r| r.get::<_, String>(0))
        .map_err(db)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(db)?;
    bodies
        .iter()
        .map(|b| from_json::<StateRecord>("state record", b).map(|r| Summary::of(&r)))
        .collect()
}

/// The rows of the state list `of` (with `workflow = ?2` when it names one), after `after`.
fn state_filter(of: &InState<'_>) -> &'static str {
    if of.workflow.is_some() {
        "process_state = ?1 AND workflow = ?2"
    } else {
        "process_state = ?1 AND ?2 IS NULL"
    }
}

#[async_trait]
impl TaskStore for SqliteStore {
    async fn create(&self, new: NewTask<'_>) -> Result<CreateOutcome, StoreError> {
        let task = new.task.clone();
        let record = new.record.clone();
        let key = new.key.cloned();
        let turn = new.turn.map(|t| (t.schedule.to_owned(), t.run_at, t.after));
        let gate = new
            .gate
            .map(|g| (g.gate.to_owned(), g.created_at.timestamp_millis()));
        let row = StateRow::of(&record, self.shards)?;
        self.write(move |tx| {
            let id = task.id.to_string();
            let state_id = record.task_id.to_string();
            // The read-back of an ambiguous create (a retry of one that was applied): the
            // task and its record already are these, so this request created them.
            let stored_task = read_task(tx, &id)?;
            let stored_state = read_state(tx, &state_id)?.map(|(r, _)| r);
            if stored_task.as_ref() == Some(&task) && stored_state.as_ref() == Some(&record) {
                return Ok(CreateOutcome::Created);
            }
            if let Some(k) = &key {
                let existing = tx
                    .query_row(
                        "SELECT request_hash, task_id, created_ns FROM idempotency_keys WHERE key = ?1",
                        params![k.key],
                        |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get::<_, i64>(2)?)),
                    )
                    .optional()
                    .map_err(db)?;
                if let Some((request_hash, task_id, created)) = existing {
                    let first = IdempotencyRecord {
                        key: k.key.clone(),
                        request_hash,
                        task_id: parse_id("idempotency key", &task_id)?,
                        created_at: from_ns(created),
                    };
                    // A key counts until it expires, and while its task exists (see
                    // `TaskStore::create`): else the new one replaces it below.
                    if !first.expired(k.created_at)
                        && read_task(tx, &first.task_id.to_string())?.is_some()
                    {
                        return Ok(CreateOutcome::KeyExists(first));
                    }
                }
            }
            // As the DynamoDB store: the schedule's current task is still the one the run
            // read (keeps "a schedule's current task is replaced only by a run that read it").
            if let Some((schedule, _, after)) = &turn
                && read_run(tx, schedule)?.map(|c| c.task_id) != *after
            {
                return Ok(CreateOutcome::TurnTaken);
            }
            // The task and its record must not exist yet: a task id names one task.
            if stored_task.is_some() || stored_state.is_some() {
                return Err(StoreError::ConditionFailed);
            }
            write_task(tx, &task)?;
            // Its place in line at its gate, in the same transaction.
            if let Some((gate, created_ms)) = &gate {
                tx.execute(
                    "INSERT INTO gate_line (gate, created_ms, task_id) VALUES (?1, ?2, ?3)",
                    params![gate, created_ms, id],
                )
                .map_err(db)?;
            }
            // Its search keys, in the same transaction: a task is found by each from the
            // moment it exists.
            for k in &task.keys {
                tx.execute(
                    "INSERT INTO task_keys (key, task_id, created_ms) VALUES (?1, ?2, ?3)",
                    params![k.key.index_value(), id, task.created_at.timestamp_millis()],
                )
                .map_err(db)?;
            }
            write_state(tx, &state_id, &row, None)?;
            if let Some(k) = &key {
                tx.execute(
                    "INSERT OR REPLACE INTO idempotency_keys (key, request_hash, task_id, created_ns) VALUES (?1, ?2, ?3, ?4)",
                    params![k.key, k.request_hash, k.task_id.to_string(), ns(k.created_at)?],
                )
                .map_err(db)?;
            }
            if let Some((schedule, run_at, _)) = &turn {
                tx.execute(
                    "INSERT INTO schedule_runs (schedule, task_id, run_ns) VALUES (?1, ?2, ?3)
                     ON CONFLICT (schedule) DO UPDATE SET task_id = excluded.task_id, run_ns = excluded.run_ns",
                    params![schedule, id, ns(*run_at)?],
                )
                .map_err(db)?;
            }
            Ok(CreateOutcome::Created)
        })
        .await
    }

    async fn current_run(&self, schedule: &str) -> Result<Option<CurrentRun>, StoreError> {
        let schedule = schedule.to_owned();
        self.read(move |tx| read_run(tx, &schedule)).await
    }

    async fn get(&self, id: TaskId) -> Result<Option<(Task, StateRecord)>, StoreError> {
        self.read(move |tx| {
            let id = id.to_string();
            Ok(match (read_task(tx, &id)?, read_state(tx, &id)?) {
                (Some(t), Some((r, _))) => Some((t, r)),
                _ => None,
            })
        })
        .await
    }

    async fn get_state(&self, id: TaskId) -> Result<Option<StateRecord>, StoreError> {
        self.read(move |tx| Ok(read_state(tx, &id.to_string())?.map(|(r, _)| r)))
            .await
    }

    async fn put_as(&self, put: Guarded<'_>, write: u64) -> Result<(), StoreError> {
        let record = put.record.clone();
        let condition: Condition = put.condition.clone();
        let row = StateRow::of(&record, self.shards)?;
        self.write(move |tx| {
            let id = record.task_id.to_string();
            let stored = read_state(tx, &id)?;
            let current = stored.as_ref().map(|(r, _)| r);
            // The write's condition (the transition's invariant: the version it read, and its
            // guards) on the stored record, in the transaction that writes.
            if !condition.holds(current) {
                // The read-back of an ambiguous write: the record already is what this
                // request wrote, so it was applied; anything else (a rival's record, however
                // alike) is a lost race.
                let mine = stored
                    .as_ref()
                    .is_some_and(|(r, w)| *w == Some(write) && *r == record);
                return if mine {
                    Ok(())
                } else {
                    Err(StoreError::ConditionFailed)
                };
            }
            write_state(tx, &id, &row, Some(write))
        })
        .await
    }

    async fn put_with_input(&self, put: Guarded<'_>, task: &Task) -> Result<(), StoreError> {
        let record = put.record.clone();
        let condition = put.condition.clone();
        let task = task.clone();
        let row = StateRow::of(&record, self.shards)?;
        self.write(move |tx| {
            let id = record.task_id.to_string();
            let stored_task = read_task(tx, &id)?;
            let current = read_state(tx, &id)?.map(|(r, _)| r);
            // As the DynamoDB store: the task at the revision before, and the record's
            // condition; both or neither.
            let follows = stored_task
                .as_ref()
                .is_some_and(|t| t.input_revision + 1 == task.input_revision);
            if !follows || !condition.holds(current.as_ref()) {
                // The read-back: the record already is this one, input and all.
                let applied =
                    current.as_ref() == Some(&record) && stored_task.as_ref() == Some(&task);
                return if applied {
                    Ok(())
                } else {
                    Err(StoreError::ConditionFailed)
                };
            }
            if let Some(mut stored) = stored_task {
                stored.input = task.input.clone();
                stored.input_ref = task.input_ref.clone();
                stored.input_revision = task.input_revision;
                stored.earlier_inputs = task.earlier_inputs.clone();
                write_task(tx, &stored)?;
            }
            write_state(tx, &id, &row, None)
        })
        .await
    }

    async fn expire_task(&self, record: &StateRecord) -> Result<(), StoreError> {
        let Some(at) = record.expires_at(self.retention) else {
            return Ok(());
        };
        let at = at.timestamp_millis();
        let id = record.task_id.to_string();
        self.write(move |tx| {
            tx.execute(
                "UPDATE tasks SET expires_ms = ?2 WHERE id = ?1",
                params![id, at],
            )
            .map_err(db)?;
            Ok(())
        })
        .await
    }

    fn retention(&self) -> Option<chrono::Duration> {
        self.retention
    }

    async fn forget_task(&self, record: &StateRecord) -> Result<(), StoreError> {
        let id = record.task_id.to_string();
        let version = record.version;
        self.write(move |tx| {
            match read_state(tx, &id)? {
                None => return Ok(()),
                Some((stored, _)) if stored.version != version => {
                    return Err(StoreError::ConditionFailed);
                }
                Some(_) => {}
            }
            tx.execute("DELETE FROM states WHERE id = ?1", params![id])
                .map_err(db)?;
            tx.execute("DELETE FROM task_keys WHERE task_id = ?1", params![id])
                .map_err(db)?;
            tx.execute("DELETE FROM tasks WHERE id = ?1", params![id])
                .map_err(db)?;
            Ok(())
        })
        .await
    }
}

/// A gate's holders, sorted, and its line in order.
type GateRows = (Vec<TaskId>, Vec<sas::domain::gate::InLine>);

fn read_gate(tx: &Transaction<'_>, gate: &str) -> Result<GateRows, StoreError> {
    let mut stmt = tx
        .prepare("SELECT task_id FROM gate_holders WHERE gate = ?1 ORDER BY task_id")
        .map_err(db)?;
    let holders = stmt
        .query_map(params![gate], |r| r.get::<_, String>(0))
        .map_err(db)?
        .map(|id| parse_id("gate holder", &id.map_err(db)?))
        .collect::<Result<Vec<_>, _>>()?;
    let mut stmt = tx
        .prepare("SELECT created_ms, task_id FROM gate_line WHERE gate = ?1 ORDER BY created_ms, task_id")
        .map_err(db)?;
    let line = stmt
        .query_map(params![gate], |r| {
            Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?))
        })
        .map_err(db)?
        .map(|row| {
            let (ms, id) = row.map_err(db)?;
            Ok((ms, parse_id("gate entry", &id)?))
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    Ok((holders, line))
}

fn gate_state(holders: Vec<TaskId>, line: &[(i64, TaskId)], me: (i64, TaskId)) -> GateState {
    GateState {
        holders,
        ahead: line.iter().position(|p| *p == me).map(|at| at as u32),
    }
}

#[async_trait]
impl Gates for SqliteStore {
    async fn enter(&self, a: GateAdmission<'_>) -> Result<GateAnswer, StoreError> {
        let gate = a.place.gate.to_owned();
        let me = (a.place.created_at.timestamp_millis(), a.place.task_id);
        let limit = a.place.limit;
        let record = a.put.record.clone();
        let condition: Condition = a.put.condition.clone();
        let row = StateRow::of(&record, self.shards)?;
        self.write(move |tx| {
            let (holders, line) = read_gate(tx, &gate)?;
            let at = line.iter().position(|p| *p == me);
            if !at.is_some_and(|at| sas::domain::gate::admits(holders.len(), at, limit)) {
                return Ok(GateAnswer::Waiting(gate_state(holders, &line, me)));
            }
            // As the DynamoDB store's transaction: the record's condition, then all or nothing.
            let id = record.task_id.to_string();
            let current = read_state(tx, &id)?;
            if !condition.holds(current.as_ref().map(|(r, _)| r)) {
                return Err(StoreError::ConditionFailed);
            }
            tx.execute(
                "DELETE FROM gate_line WHERE gate = ?1 AND created_ms = ?2 AND task_id = ?3",
                params![gate, me.0, me.1.to_string()],
            )
            .map_err(db)?;
            tx.execute(
                "INSERT INTO gate_holders (gate, task_id) VALUES (?1, ?2)",
                params![gate, me.1.to_string()],
            )
            .map_err(db)?;
            write_state(tx, &id, &row, Some(rand::random()))?;
            Ok(GateAnswer::Admitted)
        })
        .await
    }

    async fn leave(&self, place: GatePlace<'_>) -> Result<Vec<TaskId>, StoreError> {
        let gate = place.gate.to_owned();
        let me = (place.created_at.timestamp_millis(), place.task_id);
        let limit = place.limit;
        self.write(move |tx| {
            tx.execute(
                "DELETE FROM gate_holders WHERE gate = ?1 AND task_id = ?2",
                params![gate, me.1.to_string()],
            )
            .map_err(db)?;
            tx.execute(
                "DELETE FROM gate_line WHERE gate = ?1 AND created_ms = ?2 AND task_id = ?3",
                params![gate, me.0, me.1.to_string()],
            )
            .map_err(db)?;
            let (holders, line) = read_gate(tx, &gate)?;
            Ok(sas::domain::gate::next_in_line(holders.len(), &line, limit))
        })
        .await
    }

    async fn gate_state(&self, place: GatePlace<'_>) -> Result<GateState, StoreError> {
        let gate = place.gate.to_owned();
        let me = (place.created_at.timestamp_millis(), place.task_id);
        self.read(move |tx| {
            let (holders, line) = read_gate(tx, &gate)?;
            Ok(gate_state(holders, &line, me))
        })
        .await
    }
}

#[async_trait]
impl TaskLists for SqliteStore {
    async fn list(&self, of: InState<'_>, page: Paging<'_>) -> Result<Page, StoreError> {
        let limit = page.limit.max(1);
        let state = of.state.as_str();
        let workflow = of.workflow.map(str::to_owned);
        let filter = state_filter(&of);
        let after = page.after.map(|c| (c.at_ms, c.task_id.to_string()));
        self.read(move |tx| {
            // The list's order (`StateRecord::listed_since`), newest first, ties by id.
            let (at, id) = after.unwrap_or((i64::MAX, String::new()));
            let rows = summaries(
                tx,
                &format!(
                    "SELECT body FROM states WHERE {filter}
                     AND (since_ms < ?3 OR (since_ms = ?3 AND id > ?4))
                     ORDER BY since_ms DESC, id ASC LIMIT ?5"
                ),
                &[&state, &workflow, &at, &id, &((limit + 1) as i64)],
            )?;
            Ok(Page::newest_first(rows, limit, false))
        })
        .await
    }

    async fn count(&self, of: InState<'_>, cap: u64) -> Result<Count, StoreError> {
        let state = of.state.as_str();
        let workflow = of.workflow.map(str::to_owned);
        let filter = state_filter(&of);
        self.read(move |tx| {
            let n: i64 = tx
                .query_row(
                    &format!("SELECT COUNT(*) FROM (SELECT 1 FROM states WHERE {filter} LIMIT ?3)"),
                    params![
                        state,
                        workflow,
                        cap.saturating_add(1).min(i64::MAX as u64) as i64
                    ],
                    |r| r.get(0),
                )
                .map_err(db)?;
            let n = n as u64;
            Ok(Count {
                count: n.min(cap),
                capped: n > cap,
            })
        })
        .await
    }

    async fn list_by_caller(&self, caller: &Caller, page: Paging<'_>) -> Result<Page, StoreError> {
        let limit = page.limit.clamp(1, 100);
        let caller = caller.as_str().to_owned();
        let after = page.after.map(|c| (c.at_ms, c.task_id.to_string()));
        self.read(move |tx| {
            // The caller index's order: creation, newest first, ties by id.
            let (at, id) = after.unwrap_or((i64::MAX, String::new()));
            let mut stmt = tx
                .prepare(
                    "SELECT t.id, t.created_ms, s.body FROM tasks t JOIN states s ON s.id = t.id
                     WHERE t.caller = ?1 AND (t.created_ms < ?2 OR (t.created_ms = ?2 AND t.id > ?3))
                     ORDER BY t.created_ms DESC, t.id ASC LIMIT ?4",
                )
                .map_err(db)?;
            let rows = stmt
                .query_map(params![caller, at, id, limit as i64], |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, i64>(1)?,
                        r.get::<_, String>(2)?,
                    ))
                })
                .map_err(db)?
                .collect::<Result<Vec<_>, _>>()
                .map_err(db)?;
            let mut items = Vec::with_capacity(rows.len());
            let mut next = None;
            for (id, created_ms, body) in &rows {
                let record: StateRecord = from_json("state record", body)?;
                items.push(Summary::of(&record));
                next = Some(Cursor::at(*created_ms, parse_id("task", id)?));
            }
            if items.len() < limit {
                next = None;
            }
            Ok(Page { items, next })
        })
        .await
    }

    async fn list_by_key(&self, q: KeyQuery<'_>, page: Paging<'_>) -> Result<Page, StoreError> {
        let limit = page.limit.clamp(1, 100);
        let key = q.key.index_value();
        let caller = q.caller.map(|c| c.as_str().to_owned());
        let workflow = q.workflow.map(str::to_owned);
        let state = q.state;
        let from = q.from.map_or(i64::MIN, |f| f.timestamp_millis());
        let to = q.to.map_or(i64::MAX, |t| t.timestamp_millis());
        let after = page.after.map(|c| (c.at_ms, c.task_id.to_string()));
        self.read(move |tx| {
            // The key's order: creation, newest first, ties by id.
            let (at, id) = after.unwrap_or((i64::MAX, String::new()));
            let mut stmt = tx
                .prepare(
                    "SELECT k.task_id, k.created_ms, t.body, s.body FROM task_keys k
                     JOIN tasks t ON t.id = k.task_id JOIN states s ON s.id = k.task_id
                     WHERE k.key = ?1 AND k.created_ms >= ?2 AND k.created_ms < ?3
                     AND (k.created_ms < ?4 OR (k.created_ms = ?4 AND k.task_id > ?5))
                     ORDER BY k.created_ms DESC, k.task_id ASC",
                )
                .map_err(db)?;
            let rows = stmt
                .query_map(params![key, from, to, at, id], |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, i64>(1)?,
                        r.get::<_, String>(2)?,
                        r.get::<_, String>(3)?,
                    ))
                })
                .map_err(db)?;
            let mut items = Vec::new();
            let mut next = None;
            for row in rows {
                let (id, created_ms, task, body) = row.map_err(db)?;
                let task: Task = from_json("task", &task)?;
                let record: StateRecord = from_json("state record", &body)?;
                let wanted = caller.as_deref().is_none_or(|c| task.caller.as_str() == c)
                    && workflow.as_deref().is_none_or(|w| task.workflow == w)
                    && state.is_none_or(|s| record.process_state == s);
                if !wanted {
                    continue;
                }
                if items.len() == limit {
                    break;
                }
                items.push(Summary::of(&record));
                next = Some(Cursor::at(created_ms, parse_id("task", &id)?));
            }
            if items.len() < limit {
                next = None;
            }
            Ok(Page { items, next })
        })
        .await
    }
}

#[async_trait]
impl DueIndex for SqliteStore {
    async fn due(&self, q: DueQuery<'_>) -> Result<Vec<DueEntry>, StoreError> {
        let shard = i64::from(q.shard);
        let now = ns(q.now)?;
        let limit = q.limit as i64;
        let after = q
            .after
            .map(|a| Ok::<_, StoreError>((ns(a.due_at)?, a.task_id.to_string())))
            .transpose()?;
        self.read(move |tx| {
            let (at, id) = after.unwrap_or((i64::MIN, String::new()));
            let mut stmt = tx
                .prepare(
                    "SELECT due_ns, id FROM states
                     WHERE due_shard = ?1 AND due_ns IS NOT NULL AND due_ns <= ?2
                       AND (due_ns > ?3 OR (due_ns = ?3 AND id > ?4))
                     ORDER BY due_ns ASC, id ASC LIMIT ?5",
                )
                .map_err(db)?;
            let rows = stmt
                .query_map(params![shard, now, at, id, limit], |r| {
                    Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?))
                })
                .map_err(db)?
                .collect::<Result<Vec<_>, _>>()
                .map_err(db)?;
            rows.into_iter()
                .map(|(due, id)| {
                    Ok(DueEntry {
                        due_at: from_ns(due),
                        task_id: parse_id("due entry", &id)?,
                    })
                })
                .collect()
        })
        .await
    }

    fn due_shards(&self) -> u32 {
        self.shards
    }
}

#[async_trait]
impl Leases for SqliteStore {
    async fn acquire_lease(&self, claim: LeaseClaim<'_>) -> Result<bool, StoreError> {
        let (name, owner) = (claim.name.to_owned(), claim.owner.to_owned());
        let (now, until) = (ns(claim.now)?, ns(claim.until())?);
        self.write(move |tx| {
            let held = tx
                .query_row(
                    "SELECT owner, until_ns FROM leases WHERE name = ?1",
                    params![name],
                    |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)),
                )
                .optional()
                .map_err(db)?;
            // One holder at a time: taken only if free, expired, or already the owner's.
            let free = held.is_none_or(|(o, held_until)| held_until <= now || o == owner);
            if free {
                tx.execute(
                    "INSERT INTO leases (name, owner, until_ns) VALUES (?1, ?2, ?3)
                     ON CONFLICT (name) DO UPDATE SET owner = ?2, until_ns = ?3",
                    params![name, owner, until],
                )
                .map_err(db)?;
            }
            Ok(free)
        })
        .await
    }

    async fn release_lease(&self, name: &str, owner: &str) -> Result<(), StoreError> {
        let (name, owner) = (name.to_owned(), owner.to_owned());
        self.write(move |tx| {
            // Only the holder gives it up.
            tx.execute(
                "DELETE FROM leases WHERE name = ?1 AND owner = ?2",
                params![name, owner],
            )
            .map_err(db)?;
            Ok(())
        })
        .await
    }
}

/// The pace of service `name` as stored, if marked.
fn stored_pace(tx: &Transaction<'_>, name: &str) -> Result<Option<Pace>, StoreError> {
    tx.query_row(
        "SELECT body FROM paces WHERE name = ?1",
        params![name],
        |r| r.get::<_, String>(0),
    )
    .optional()
    .map_err(db)?
    .map(|body| from_json("pace", &body))
    .transpose()
}

/// A breaker as stored (the domain's [`BreakerRecord`] has no serde form).
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct BreakerRow {
    state: BreakerState,
    note: Option<String>,
    open_since: Option<DateTime<Utc>>,
    #[serde(default)]
    fault_keys: Vec<String>,
}

impl BreakerRow {
    fn of(b: &BreakerRecord) -> Self {
        Self {
            state: b.state,
            note: b.note.clone(),
            open_since: b.open_since,
            fault_keys: b.fault_keys.clone(),
        }
    }

    fn into_record(self, name: String, version: u64) -> BreakerRecord {
        BreakerRecord {
            name,
            version,
            state: self.state,
            note: self.note,
            open_since: self.open_since,
            fault_keys: self.fault_keys,
            pace: Pace::default(),
        }
    }
}

#[async_trait]
impl Breakers for SqliteStore {
    async fn get_breaker(&self, name: &str) -> Result<Option<BreakerRecord>, StoreError> {
        let name = name.to_owned();
        self.read(move |tx| {
            let row = tx
                .query_row(
                    "SELECT version, body FROM breakers WHERE name = ?1",
                    params![name],
                    |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?)),
                )
                .optional()
                .map_err(db)?;
            let pace = stored_pace(tx, &name)?;
            let record = match row {
                Some((version, body)) => {
                    let row: BreakerRow = from_json("breaker", &body)?;
                    row.into_record(name.clone(), version as u64)
                }
                None if pace.is_some() => BreakerRecord::closed(&name),
                None => return Ok(None),
            };
            Ok(Some(BreakerRecord {
                pace: pace.unwrap_or_default(),
                ..record
            }))
        })
        .await
    }

    async fn put_breaker(&self, record: &BreakerRecord) -> Result<bool, StoreError> {
        let name = record.name.clone();
        let version = record.version;
        let body = to_json(&BreakerRow::of(record))?;
        self.write(move |tx| {
            let stored: i64 = tx
                .query_row(
                    "SELECT version FROM breakers WHERE name = ?1",
                    params![name],
                    |r| r.get(0),
                )
                .optional()
                .map_err(db)?
                .unwrap_or(0);
            // One version at a time: written only over the version before it.
            if stored as u64 + 1 != version {
                return Ok(false);
            }
            tx.execute(
                "INSERT INTO breakers (name, version, body) VALUES (?1, ?2, ?3)
                 ON CONFLICT (name) DO UPDATE SET version = ?2, body = ?3",
                params![name, version as i64, body],
            )
            .map_err(db)?;
            Ok(true)
        })
        .await
    }

    async fn mark_pace(&self, name: &str, mark: PaceMark) -> Result<bool, StoreError> {
        let name = name.to_owned();
        self.write(move |tx| {
            let stored = stored_pace(tx, &name)?;
            // As the domain applies it, against the pace read in this transaction.
            let Some(pace) = stored.unwrap_or_default().apply(mark) else {
                return Ok(false);
            };
            tx.execute(
                "INSERT INTO paces (name, body) VALUES (?1, ?2)
                 ON CONFLICT (name) DO UPDATE SET body = ?2",
                params![name, to_json(&pace)?],
            )
            .map_err(db)?;
            Ok(true)
        })
        .await
    }
}

#[async_trait]
impl RateLimits for SqliteStore {
    async fn admit(&self, ask: RateRequest<'_>) -> Result<Admission, StoreError> {
        let key = ask.key.to_owned();
        let limit = *ask.limit;
        let now = ask.now.timestamp_millis();
        self.write(move |tx| {
            let tat: Option<i64> = tx
                .query_row(
                    "SELECT tat_ms FROM rate_limits WHERE key = ?1",
                    params![key],
                    |r| r.get(0),
                )
                .optional()
                .map_err(db)?;
            // GCRA on the theoretical arrival time read in this transaction.
            match limit.decide(tat, now) {
                RateDecision::Admit { tat_ms } => {
                    tx.execute(
                        "INSERT INTO rate_limits (key, tat_ms) VALUES (?1, ?2)
                         ON CONFLICT (key) DO UPDATE SET tat_ms = ?2",
                        params![key, tat_ms],
                    )
                    .map_err(db)?;
                    Ok(Admission::Admitted)
                }
                RateDecision::Refuse { retry_after } => Ok(Admission::Limited { retry_after }),
            }
        })
        .await
    }
}

#[async_trait]
impl Slots for SqliteStore {
    async fn take_slot(&self, ask: SlotRequest<'_>) -> Result<SlotAnswer, StoreError> {
        use sas::domain::limits::{SlotDecision, take_slot};
        let (key, holder) = (ask.key.to_owned(), ask.holder.to_owned());
        let (limit, now, until) = (
            ask.limit,
            ask.now.timestamp_millis(),
            ask.until.timestamp_millis(),
        );
        self.write(move |tx| {
            let held: Vec<(String, i64)> = {
                let mut q = tx
                    .prepare("SELECT holder, until_ms FROM slots WHERE key = ?1")
                    .map_err(db)?;
                let rows = q
                    .query_map(params![key], |r| Ok((r.get(0)?, r.get(1)?)))
                    .map_err(db)?;
                rows.collect::<Result<_, _>>().map_err(db)?
            };
            // The leases read in this transaction decide, as the DynamoDB item's map does.
            match take_slot(held.iter().map(|(h, u)| (h.as_str(), *u)), limit, now) {
                SlotDecision::Take => {
                    tx.execute(
                        "DELETE FROM slots WHERE key = ?1 AND until_ms <= ?2",
                        params![key, now],
                    )
                    .map_err(db)?;
                    tx.execute(
                        "INSERT OR REPLACE INTO slots (key, holder, until_ms) VALUES (?1, ?2, ?3)",
                        params![key, holder, until],
                    )
                    .map_err(db)?;
                    Ok(SlotAnswer::Taken)
                }
                SlotDecision::Full { next_free_ms } => Ok(SlotAnswer::Full {
                    next_free: chrono::DateTime::from_timestamp_millis(next_free_ms)
                        .unwrap_or_default(),
                }),
            }
        })
        .await
    }

    async fn free_slot(&self, key: &str, holder: &str) -> Result<(), StoreError> {
        let (key, holder) = (key.to_owned(), holder.to_owned());
        self.write(move |tx| {
            tx.execute(
                "DELETE FROM slots WHERE key = ?1 AND holder = ?2",
                params![key, holder],
            )
            .map_err(db)?;
            Ok(())
        })
        .await
    }

    async fn slots_held(
        &self,
        key: &str,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<u32, StoreError> {
        let key = key.to_owned();
        let now = now.timestamp_millis();
        self.read(move |tx| {
            tx.query_row(
                "SELECT COUNT(*) FROM slots WHERE key = ?1 AND until_ms > ?2",
                params![key, now],
                |r| r.get::<_, u32>(0),
            )
            .map_err(db)
        })
        .await
    }
}

#[async_trait]
impl Catalog for SqliteStore {
    async fn publish(&self, p: Publication<'_>) -> Result<Published, StoreError> {
        let kind = p.kind.as_str();
        let name = p.name.to_owned();
        let text = canonical(p.body);
        let body = p.body.to_string();
        let at = ns(p.now)?;
        self.write(move |tx| {
            let latest = tx
                .query_row(
                    "SELECT version, canonical FROM definitions WHERE kind = ?1 AND name = ?2
                     ORDER BY version DESC LIMIT 1",
                    params![kind, name],
                    |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?)),
                )
                .optional()
                .map_err(db)?;
            if let Some((version, latest_text)) = &latest
                && *latest_text == text
            {
                return Ok(Published {
                    version: *version as u32,
                    created: false,
                });
            }
            // Versions are dense and written once: the next one after the newest, in the
            // transaction that read it.
            let version = latest.map_or(1, |(v, _)| v + 1);
            tx.execute(
                "INSERT INTO definitions (kind, name, version, body, canonical, published_ns)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![kind, name, version, body, text, at],
            )
            .map_err(db)?;
            Ok(Published {
                version: version as u32,
                created: true,
            })
        })
        .await
    }

    async fn definition(&self, wanted: DefinitionRef<'_>) -> Result<Option<Stored>, StoreError> {
        let kind = wanted.kind;
        let name = wanted.name.to_owned();
        let version = wanted.version;
        self.read(move |tx| {
            let row = match version {
                None => tx.query_row(
                    "SELECT version, body, published_ns FROM definitions WHERE kind = ?1 AND name = ?2
                     ORDER BY version DESC LIMIT 1",
                    params![kind.as_str(), name],
                    |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?, r.get::<_, i64>(2)?)),
                ),
                Some(v) => tx.query_row(
                    "SELECT version, body, published_ns FROM definitions
                     WHERE kind = ?1 AND name = ?2 AND version = ?3",
                    params![kind.as_str(), name, i64::from(v)],
                    |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?, r.get::<_, i64>(2)?)),
                ),
            }
            .optional()
            .map_err(db)?;
            row.map(|(version, body, published)| {
                Ok(Stored {
                    kind,
                    name: name.clone(),
                    version: version as u32,
                    body: from_json("definition", &body)?,
                    published_at: from_ns(published),
                })
            })
            .transpose()
        })
        .await
    }

    async fn entries(&self, kind: Kind) -> Result<Vec<Entry>, StoreError> {
        self.read(move |tx| {
            let mut stmt = tx
                .prepare(
                    "SELECT name, MAX(version) FROM definitions WHERE kind = ?1
                     GROUP BY name ORDER BY name",
                )
                .map_err(db)?;
            let rows = stmt
                .query_map(params![kind.as_str()], |r| {
                    Ok(Entry {
                        name: r.get(0)?,
                        latest: r.get::<_, i64>(1)? as u32,
                    })
                })
                .map_err(db)?
                .collect::<Result<Vec<_>, _>>()
                .map_err(db)?;
            Ok(rows)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_folder_in_use_or_of_another_layout_is_refused_by_name() {
        let dir = tempfile::tempdir().expect("a folder");
        let first = SqliteStore::open(dir.path(), 4, None).expect("the first opens");
        let second = SqliteStore::open(dir.path(), 4, None).expect_err("the second is refused");
        assert!(
            matches!(&second, OpenError::InUse { path } if path == first.path()),
            "{second}"
        );
        assert!(second.to_string().contains("--data"), "{second}");
        drop(first);
        let again = SqliteStore::open(dir.path(), 4, None).expect("free once the first closed");
        drop(again);

        let conn = Connection::open(dir.path().join(DATA_FILE)).expect("the file");
        conn.pragma_update(None, "user_version", 99)
            .expect("a layout");
        drop(conn);
        let e = SqliteStore::open(dir.path(), 4, None).expect_err("another layout");
        assert!(matches!(e, OpenError::Layout { found: 99, .. }), "{e}");
    }

    /// `sas-local --data` kept every key for good: one whose task expired at its retention
    /// then pointed at nothing, and a request reusing it answered `500` "inconsistent store".
    #[test]
    fn keys_past_their_expiry_or_whose_task_is_gone_are_deleted_at_open() {
        let dir = tempfile::tempdir().expect("a folder");
        drop(SqliteStore::open(dir.path(), 4, None).expect("made"));
        let now = Utc::now();
        let conn = Connection::open(dir.path().join(DATA_FILE)).expect("the file");
        for (id, expires) in [("gone", Some(now.timestamp_millis() - 1)), ("kept", None)] {
            conn.execute(
                "INSERT INTO tasks (id, caller, created_ms, body, expires_ms) VALUES (?1, 'c', 0, '{}', ?2)",
                params![id, expires],
            )
            .expect("a task");
        }
        let day = sas::ports::IDEMPOTENCY_KEY_TTL;
        for (key, task, created) in [
            ("expired", "kept", now - day - chrono::Duration::seconds(1)),
            ("orphan", "gone", now),
            ("fresh", "kept", now - day + chrono::Duration::hours(1)),
        ] {
            conn.execute(
                "INSERT INTO idempotency_keys (key, request_hash, task_id, created_ns) VALUES (?1, 'h', ?2, ?3)",
                params![key, task, ns(created).expect("in range")],
            )
            .expect("a key");
        }
        drop(conn);
        drop(SqliteStore::open(dir.path(), 4, None).expect("reopened"));
        let conn = Connection::open(dir.path().join(DATA_FILE)).expect("the file");
        let mut stmt = conn
            .prepare("SELECT key FROM idempotency_keys ORDER BY key")
            .expect("a query");
        let keys: Vec<String> = stmt
            .query_map([], |r| r.get(0))
            .expect("rows")
            .collect::<Result<_, _>>()
            .expect("keys");
        assert_eq!(keys, ["fresh"]);
    }

    #[test]
    fn tasks_past_their_retention_are_deleted_at_open() {
        let dir = tempfile::tempdir().expect("a folder");
        drop(SqliteStore::open(dir.path(), 4, None).expect("made"));
        let now = Utc::now().timestamp_millis();
        let conn = Connection::open(dir.path().join(DATA_FILE)).expect("the file");
        for (id, expires) in [
            ("old", Some(now - 1)),
            ("kept", Some(now + 60_000)),
            ("open", None),
        ] {
            conn.execute(
                "INSERT INTO tasks (id, caller, created_ms, body, expires_ms) VALUES (?1, 'c', 0, '{}', ?2)",
                params![id, expires],
            )
            .expect("a task");
            conn.execute(
                "INSERT INTO states (id, body, callback_key, process_state, workflow, since_ms) VALUES (?1, '{}', '', 'Processed', 'w', 0)",
                params![id],
            )
            .expect("its record");
        }
        drop(conn);
        drop(SqliteStore::open(dir.path(), 4, None).expect("reopened"));
        let conn = Connection::open(dir.path().join(DATA_FILE)).expect("the file");
        for table in ["tasks", "states"] {
            let mut stmt = conn
                .prepare(&format!("SELECT id FROM {table} ORDER BY id"))
                .expect("a query");
            let ids: Vec<String> = stmt
                .query_map([], |r| r.get(0))
                .expect("rows")
                .collect::<Result<_, _>>()
                .expect("ids");
            assert_eq!(ids, ["kept", "open"], "{table}");
        }
    }
}
