//! [`DynamoStore`]: the client, the table, its shards; the indexes' names; the two calls every
//! kind of item makes (`read_item`, `put_if`).

use super::item::{Item, s, unavailable};
use crate::domain::StateRecord;
use crate::ports::StoreError;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::operation::put_item::builders::PutItemFluentBuilder;
use aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder;
use aws_sdk_dynamodb::types::ReturnValuesOnConditionCheckFailure;

/// The name of the sparse GSI the supervisor queries.
pub const DUE_INDEX: &str = "due-index";
/// The name of the GSI the operator's list queries (`StateShard` S, `StateSince` N): sparse, it
/// holds the records [`StateRecord::listed_by_state`](crate::domain::StateRecord::listed_by_state).
pub const STATE_INDEX: &str = "state-index";
/// The attributes `state-index` projects besides its keys (as the template declares it): the
/// task's workflow (the list's filter), and `TaskId`, which only records written before the key
/// alone carried the task's id have (the list reads the id from the key; changing a GSI's
/// projection would replace the index). Neither changes in a task's life, and the index's sort
/// key `StateSince` changes only with the state: a write within a state costs the index
/// nothing.
pub const STATE_INDEX_PROJECTION: [&str; 2] = ["TaskId", "Workflow"];
/// The name of the GSI a caller's list queries (`CallerShard` S, `CreatedAt` N, keys only).
pub const CALLER_INDEX: &str = "caller-shard-index";
/// The index of search key slot `slot` (`key-index-1`..): keyed on the task item's
/// `Key<slot + 1>` (`name#value`) and `CreatedAt`, projecting [`KEY_INDEX_PROJECTION`]; sparse
/// (a task without a key in that slot makes no entry).
pub fn key_index(slot: usize) -> String {
    format!("key-index-{}", slot + 1)
}
/// What the key indexes project besides their keys: the filters of a search.
pub const KEY_INDEX_PROJECTION: [&str; 2] = ["Workflow", "Caller"];
/// How long a lease or slot item outlives its holding (the table's TTL attribute `ExpiresAt`
/// deletes it). An idempotency key's is [`crate::ports::IDEMPOTENCY_KEY_TTL`].
pub(super) const KEY_TTL_SECONDS: i64 = 24 * 3600;

#[derive(Debug, Clone)]
pub struct DynamoStore {
    pub(super) client: Client,
    pub(super) table: String,
    pub(super) shards: u32,
    /// How long a final task is kept (`None`: for good).
    pub(super) retention: Option<chrono::Duration>,
    /// How many partitions of `caller-shard-index` a caller's tasks spread over.
    pub(super) caller_shards: u32,
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

    /// When a record's items expire, for a final record ([`StateRecord::expires_at`]).
    pub(super) fn expiry(&self, r: &StateRecord) -> Option<i64> {
        r.expires_at(self.retention).map(|at| at.timestamp())
    }
}

impl DynamoStore {
    /// A strongly consistent `GetItem` of (`pk`, `sk`).
    pub(super) async fn read_item(&self, pk: String, sk: &str) -> Result<Option<Item>, StoreError> {
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

    /// Sends a conditional `UpdateItem`: `true` if it was written, `false` if its condition
    /// failed.
    pub(super) async fn update_if(req: UpdateItemFluentBuilder) -> Result<bool, StoreError> {
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

    /// Sends a conditional `PutItem` of `item` (`req` holds it and its condition): `true` if it
    /// was written, `false` if its condition failed against another writer's item. An ambiguous
    /// write (its answer lost after DynamoDB applied it, then the SDK's retry of the same
    /// request failing its condition against that write) is told apart by the item DynamoDB
    /// returns on the failure: the item as this request wrote it is this request's own write.
    /// `item` must make this request's write unique (a random `WriteId`, a holder's own id).
    pub(super) async fn put_if_own(
        req: PutItemFluentBuilder,
        item: &Item,
    ) -> Result<bool, StoreError> {
        match req
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await
        {
            Ok(_) => Ok(true),
            Err(e) => match e.as_service_error() {
                Some(PutItemError::ConditionalCheckFailedException(c)) => {
                    Ok(c.item() == Some(item))
                }
                _ => Err(unavailable(&e)),
            },
        }
    }

    /// Sends a conditional `PutItem`: `true` if it was written, `false` if its condition failed.
    pub(super) async fn put_if(req: PutItemFluentBuilder) -> Result<bool, StoreError> {
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
