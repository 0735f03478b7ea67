//! The state store and the catalog on DynamoDB: one table.
//!
//! | item            | `pk`               | `sk`          | written by                        |
//! |-----------------|--------------------|---------------|-----------------------------------|
//! | task            | `TASK#<id>`        | `TASK`        | submission (transaction)          |
//! | state record    | `TASK#<id>`        | `STATE`       | submission, scheduler, supervisor |
//! | idempotency key | `IDEM#<caller>#<key>` | `IDEM`     | submission (transaction)          |
//! | schedule's task | `CURRENT#<schedule>` | `CURRENT`   | scheduler (a run's transaction)   |
//! | lease           | `LEASE#<name>`     | `LEASE`       | supervisor                        |
//! | breaker         | `BREAKER#<name>`   | `BREAKER`     | agents                            |
//! | rate limit      | `RATE#<key>`       | `RATE`        | submission (a caller), agents (a service) |
//! | slots           | `SLOTS#<key>`      | `SLOTS`       | agents (a service's calls in flight) |
//! | definition      | `<KIND>#<name>`    | `V#<version>` | operator API (transaction)        |
//! | catalog         | `CATALOG#<KIND>`   | `CATALOG`     | operator API (transaction)        |
//!
//! `<KIND>` is `WORKFLOW` or `SERVICE`. A definition version is written once
//! (`attribute_not_exists`) and never changed; the catalog item maps each name to its newest
//! version and that version's canonical text.
//!
//! Each kind of item has its file, implementing its trait of [`crate::ports`]: `tasks.rs`
//! ([`TaskStore`](crate::ports::TaskStore)), `lists.rs` (the two list indexes), `due.rs`,
//! `leases.rs`, `breakers.rs`, `rate.rs`, `slots.rs`, `catalog.rs`. They share `store.rs` (the store, the
//! index names), `item.rs` (the attribute codec) and `records.rs` (task and state items).
//!
//! The sparse GSI `due-index` (`DueShard` S, `DueAt` N, keys only) holds exactly the state
//! records with a `DueAt`: non-terminal ones, and terminal ones that still owe a notice.
//! The GSI `caller-shard-index` (`CallerShard` S, `CreatedAt` N, keys only) holds the task
//! items (the only items with a `CallerShard`: the caller's digest and a shard of the task id,
//! [`Caller::index_key`]): a caller's tasks, newest first, merged from its shards. A task item
//! is written once, so the index costs one write per task; a distributed forEach's run and
//! elements make none (their caller is not listed: [`Caller::listed`]). `<caller>` in an idempotency key is the SHA-256 of
//! the caller id ([`crate::domain::Caller::digest`]): keys are scoped by caller.
//! The sparse GSIs `key-index-1` to `-3` (`Key<n>` S, `CreatedAt` N, projecting `Workflow` and
//! `Caller`) hold the task items with a search key in that slot (`name#value`): a search by
//! key queries the three and merges them as the lists do.

mod breakers;
mod catalog;
mod due;
mod gates;
mod item;
mod leases;
mod lists;
mod rate;
mod records;
mod slots;
mod store;
mod tasks;

#[cfg(any(test, feature = "testkit"))]
pub use item::item_size;
pub use records::key_attribute;
#[cfg(any(test, feature = "testkit"))]
pub use records::{index_entry_sizes, state_index_key, state_record_size, stored_sizes};
pub use store::{
    CALLER_INDEX, DEFAULT_CALLER_SHARDS, DUE_INDEX, DynamoStore, KEY_INDEX_PROJECTION, STATE_INDEX,
    STATE_INDEX_PROJECTION, key_index,
};
