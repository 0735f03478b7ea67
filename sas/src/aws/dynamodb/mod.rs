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
//! Each kind of item has its file, implementing its trait of [`crate::ports`]: `tasks.rs`
//! ([`TaskStore`](crate::ports::TaskStore)), `lists.rs` (the two list indexes), `due.rs`,
//! `leases.rs`, `breakers.rs`, `rate.rs`, `catalog.rs`; `records.rs` is the codec of task and
//! state items.
//!
//! The sparse GSI `due-index` (`DueShard` S, `DueAt` N, keys only) holds exactly the state
//! records with a `DueAt`: non-terminal ones, and terminal ones that still owe a notice.
//! The GSI `caller-shard-index` (`CallerShard` S, `CreatedAt` N, keys only) holds the task
//! items (the only items with a `CallerShard`: the caller's digest and a shard of the task id,
//! [`Caller::index_key`]): a caller's tasks, newest first, merged from its shards. A task item
//! is written once, so the index costs one write per task. `<caller>` in an idempotency key is the SHA-256 of
//! the caller id ([`crate::domain::Caller::digest`]): keys are scoped by caller.

mod breakers;
mod catalog;
mod due;
mod leases;
mod lists;
mod rate;
mod records;
mod tasks;

use records::*;
#[cfg(any(test, feature = "testkit"))]
pub use records::{index_entry_sizes, state_record_size, stored_sizes};

use crate::domain::{StateRecord, TaskId};
use crate::ports::StoreError;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::operation::put_item::builders::PutItemFluentBuilder;
use aws_sdk_dynamodb::types::AttributeValue;
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
}
