//! The attribute codec every kind of item shares (`s`, `n`, `get_s`, ...), an item's size as
//! DynamoDB bills it, and a failed call as a [`StoreError`].

use crate::domain::TaskId;
use crate::ports::StoreError;
use aws_sdk_dynamodb::types::AttributeValue;
use chrono::{DateTime, Utc};
use std::collections::HashMap;

pub(super) type Item = HashMap<String, AttributeValue>;

pub(super) fn task_pk(id: &TaskId) -> String {
    format!("TASK#{id}")
}

/// The key of schedule `name`'s current task (see [`crate::ports::CurrentRun`]).
/// A concurrency gate's items: its head (`GATE`) and its line (`Q#<ms>#<id>`).
pub(super) fn gate_pk(gate: &str) -> String {
    format!("GATE#{gate}")
}

/// A task's place in line: its creation time (13 digits of ms, so that the text sorts as the
/// time) and its id.
pub(super) fn gate_entry_sk(g: &crate::ports::GatePlace<'_>) -> String {
    format!(
        "Q#{:013}#{}",
        g.created_at.timestamp_millis().max(0),
        g.task_id
    )
}

pub(super) fn current_pk(name: &str) -> String {
    format!("CURRENT#{name}")
}

pub(super) fn s(v: impl Into<String>) -> AttributeValue {
    AttributeValue::S(v.into())
}

pub(super) fn n(v: impl ToString) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

pub(super) fn ms(t: DateTime<Utc>) -> AttributeValue {
    n(t.timestamp_millis())
}

pub(super) fn corrupt(what: impl Into<String>) -> StoreError {
    StoreError::Corrupt(what.into())
}

pub(super) fn get_s<'a>(item: &'a Item, k: &str) -> Result<&'a str, StoreError> {
    match item.get(k) {
        Some(AttributeValue::S(v)) => Ok(v),
        _ => Err(corrupt(format!("{k} missing or not a string"))),
    }
}

pub(super) fn opt_s(item: &Item, k: &str) -> Option<String> {
    match item.get(k) {
        Some(AttributeValue::S(v)) => Some(v.clone()),
        _ => None,
    }
}

pub(super) fn get_n<T: std::str::FromStr>(item: &Item, k: &str) -> Result<T, StoreError> {
    match item.get(k) {
        Some(AttributeValue::N(v)) => v
            .parse()
            .map_err(|_| corrupt(format!("{k} is not a valid number"))),
        _ => Err(corrupt(format!("{k} missing or not a number"))),
    }
}

pub(super) fn opt_n<T: std::str::FromStr>(item: &Item, k: &str) -> Result<Option<T>, StoreError> {
    if item.contains_key(k) {
        get_n(item, k).map(Some)
    } else {
        Ok(None)
    }
}

pub(super) fn time(millis: i64) -> Result<DateTime<Utc>, StoreError> {
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
pub(super) fn unavailable<E, R>(e: &aws_sdk_dynamodb::error::SdkError<E, R>) -> StoreError
where
    E: std::error::Error + aws_sdk_dynamodb::error::ProvideErrorMetadata + 'static,
    R: std::fmt::Debug,
{
    let code = e.as_service_error().and_then(|se| se.code());
    match code {
        Some(c) if NON_RETRYABLE.contains(&c) => {
            StoreError::Rejected(format!("{c}: {}", crate::aws::describe(e)))
        }
        _ => StoreError::Unavailable(crate::aws::describe(e)),
    }
}

/// Why DynamoDB cancelled a transaction: one reason per item, in the request's order (none for
/// any other error).
pub(super) fn cancellation_reasons<R>(
    e: &aws_sdk_dynamodb::error::SdkError<
        aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError,
        R,
    >,
) -> &[aws_sdk_dynamodb::types::CancellationReason] {
    use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError as E;
    match e.as_service_error() {
        Some(E::TransactionCanceledException(tc)) => tc.cancellation_reasons(),
        _ => &[],
    }
}

/// Whether a cancelled transaction's `reasons` include an item whose condition failed.
pub(super) fn any_condition_failed(
    reasons: &[aws_sdk_dynamodb::types::CancellationReason],
) -> bool {
    reasons
        .iter()
        .any(|r| r.code() == Some("ConditionalCheckFailed"))
}

pub(super) fn build_err(e: aws_sdk_dynamodb::error::BuildError) -> StoreError {
    StoreError::Unavailable(format!("request build: {e}"))
}
