//! [`Slots`] on DynamoDB: items `SLOTS#<key>`, a map `Held` of holder → lease end (ms), moved by
//! conditional updates.

use super::item::*;
use super::store::*;
use crate::domain::limits::{SlotDecision, take_slot};
use crate::ports::{SlotAnswer, SlotRequest, Slots, StoreError};
use async_trait::async_trait;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValuesOnConditionCheckFailure};
use chrono::{DateTime, Utc};

/// The most expired leases one cleanup removes (each adds to the update's expression).
const PRUNE_AT_ONCE: usize = 25;

#[async_trait]
impl Slots for DynamoStore {
    async fn take_slot(&self, ask: SlotRequest<'_>) -> Result<SlotAnswer, StoreError> {
        let SlotRequest {
            key,
            limit,
            holder,
            now,
            until,
        } = ask;
        let pk = format!("SLOTS#{key}");
        let now_ms = now.timestamp_millis();
        // The item goes a day after its last lease ran out.
        let expires = n(until.timestamp() + KEY_TTL_SECONDS);
        for _ in 0..4 {
            // Condition: fewer than `limit` leases in the map (expired ones count until they
            // are removed) - keeps "at most `limit` calls of a key in flight", however many
            // agents take slots at once.
            let take = self
                .client
                .update_item()
                .table_name(&self.table)
                .key("pk", s(&pk))
                .key("sk", s("SLOTS"))
                .update_expression("SET Held.#h = :until, ExpiresAt = :e")
                .condition_expression("attribute_exists(Held) AND size(Held) < :n")
                .expression_attribute_names("#h", holder)
                .expression_attribute_values(":until", ms(until))
                .expression_attribute_values(":e", expires.clone())
                .expression_attribute_values(":n", n(limit))
                .return_values_on_condition_check_failure(
                    ReturnValuesOnConditionCheckFailure::AllOld,
                )
                .send()
                .await;
            let old = match take {
                Ok(_) => return Ok(SlotAnswer::Taken),
                Err(e) => match e.as_service_error() {
                    Some(UpdateItemError::ConditionalCheckFailedException(c)) => match c.item() {
                        Some(i) => Some(i.clone()),
                        // An emulator may leave the old item out of the answer: read it.
                        None => self.read_item(pk.clone(), "SLOTS").await?,
                    },
                    _ => return Err(unavailable(&e)),
                },
            };
            let held = match old.as_ref().and_then(|i| i.get("Held")) {
                Some(AttributeValue::M(m)) => leases(m)?,
                _ => {
                    // No item yet. Condition: still none - keeps "a first lease is written
                    // once" (a racing first holder sends this one round again).
                    let first = self
                        .client
                        .put_item()
                        .table_name(&self.table)
                        .item("pk", s(&pk))
                        .item("sk", s("SLOTS"))
                        .item(
                            "Held",
                            AttributeValue::M([(holder.to_owned(), ms(until))].into()),
                        )
                        .item("ExpiresAt", expires.clone())
                        .condition_expression("attribute_not_exists(pk)");
                    if Self::put_if(first).await? {
                        return Ok(SlotAnswer::Taken);
                    }
                    continue;
                }
            };
            // This call's own lease is in the map: a take (or a first lease) applied whose
            // answer was lost, met by the SDK's retry or by this loop's next round.
            if held
                .iter()
                .any(|(h, u)| h == holder && *u == until.timestamp_millis())
            {
                return Ok(SlotAnswer::Taken);
            }
            if let SlotDecision::Full { next_free_ms } =
                take_slot(held.iter().map(|(h, u)| (h.as_str(), *u)), limit, now_ms)
            {
                return Ok(SlotAnswer::Full {
                    next_free: time(next_free_ms)?,
                });
            }
            // Room once the leases that ran out are gone (agents that died mid-call, or a limit
            // lowered). Condition: each still holds the end seen - keeps "a lease is removed
            // only after it ran out" (a holder that renewed, or a racing cleanup, fails it).
            let expired: Vec<&(String, i64)> = held
                .iter()
                .filter(|(_, u)| *u <= now_ms)
                .take(PRUNE_AT_ONCE)
                .collect();
            if expired.is_empty() {
                // Room without a cleanup: the item changed after the failed take (read
                // anew, it has a free slot). Take again.
                continue;
            }
            let mut prune = self
                .client
                .update_item()
                .table_name(&self.table)
                .key("pk", s(&pk))
                .key("sk", s("SLOTS"));
            let (mut removes, mut conditions) = (vec![], vec![]);
            for (i, (h, u)) in expired.iter().enumerate() {
                removes.push(format!("Held.#x{i}"));
                conditions.push(format!("Held.#x{i} = :x{i}"));
                prune = prune
                    .expression_attribute_names(format!("#x{i}"), h)
                    .expression_attribute_values(format!(":x{i}"), n(u));
            }
            // A failed condition: another cleanup or holder came first; take again either way.
            Self::update_if(
                prune
                    .update_expression(format!("REMOVE {}", removes.join(", ")))
                    .condition_expression(conditions.join(" AND ")),
            )
            .await?;
        }
        // Four races lost in a row: as good as full; come back shortly.
        Ok(SlotAnswer::Full {
            next_free: now + chrono::Duration::milliseconds(100),
        })
    }

    async fn free_slot(&self, key: &str, holder: &str) -> Result<(), StoreError> {
        // Condition: the holder's lease is there - keeps "a release removes only its own
        // lease" (one removed as expired, or never written, is left alone: no item is made).
        let free = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("pk", s(format!("SLOTS#{key}")))
            .key("sk", s("SLOTS"))
            .update_expression("REMOVE Held.#h")
            .condition_expression("attribute_exists(Held.#h)")
            .expression_attribute_names("#h", holder);
        Self::update_if(free).await.map(|_| ())
    }

    async fn slots_held(&self, key: &str, now: DateTime<Utc>) -> Result<u32, StoreError> {
        let item = self.read_item(format!("SLOTS#{key}"), "SLOTS").await?;
        let now = now.timestamp_millis();
        Ok(match item.as_ref().and_then(|i| i.get("Held")) {
            Some(AttributeValue::M(m)) => {
                leases(m)?.iter().filter(|(_, u)| *u > now).count() as u32
            }
            _ => 0,
        })
    }
}

/// The leases of a `Held` map: (holder, end in ms).
fn leases(
    m: &std::collections::HashMap<String, AttributeValue>,
) -> Result<Vec<(String, i64)>, StoreError> {
    m.iter()
        .map(|(h, v)| match v {
            AttributeValue::N(x) => x
                .parse::<i64>()
                .map(|u| (h.clone(), u))
                .map_err(|_| corrupt(format!("slot lease {h:?}: {x:?} is not a time"))),
            _ => Err(corrupt(format!("slot lease {h:?} is not a number"))),
        })
        .collect()
}
