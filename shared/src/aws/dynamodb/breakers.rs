//! [`Breakers`] on DynamoDB: items `BREAKER#<name>`, sort keys `BREAKER` (the breaker) and
//! `PACE` (the service's pace).

use super::item::*;
use super::store::*;
use crate::domain::breaker::PACE_SPELL;
use crate::domain::{BreakerRecord, BreakerState, Pace, PaceMark};
use crate::ports::Breakers;
use crate::ports::StoreError;
use async_trait::async_trait;
use aws_sdk_dynamodb::types::AttributeValue;
use std::collections::HashMap;

#[async_trait]
impl Breakers for DynamoStore {
    async fn get_breaker(&self, name: &str) -> Result<Option<BreakerRecord>, StoreError> {
        self.read_breaker(name, true).await
    }
    async fn peek_breaker(&self, name: &str) -> Result<Option<BreakerRecord>, StoreError> {
        self.read_breaker(name, false).await
    }

    async fn put_breaker(&self, record: &BreakerRecord) -> Result<bool, StoreError> {
        let mut item = HashMap::from([
            ("pk".to_owned(), s(format!("BREAKER#{}", record.name))),
            ("sk".to_owned(), s("BREAKER")),
            ("Version".to_owned(), n(record.version)),
        ]);
        let (state, extra): (&str, Vec<(&str, AttributeValue)>) = match record.state {
            BreakerState::Closed { failures } => ("Closed", vec![("Failures", n(failures))]),
            BreakerState::Open { until } => ("Open", vec![("Until", ms(until))]),
            BreakerState::HalfOpen { probes_left, until } => (
                "HalfOpen",
                vec![("ProbesLeft", n(probes_left)), ("Until", ms(until))],
            ),
            BreakerState::Paused { since } => ("Paused", vec![("Since", ms(since))]),
        };
        if let Some(note) = &record.note {
            item.insert("Note".to_owned(), s(note));
        }
        if let Some(since) = record.open_since {
            item.insert("OpenSince".to_owned(), ms(since));
        }
        if !record.fault_keys.is_empty() {
            item.insert(
                "FaultKeys".to_owned(),
                AttributeValue::L(record.fault_keys.iter().map(s).collect()),
            );
        }
        item.insert("State".to_owned(), s(state));
        for (k, v) in extra {
            item.insert(k.to_owned(), v);
        }
        // This write's own id: a write whose answer was lost is told from a rival's identical
        // move of the breaker (two agents handed the same probe) by it.
        item.insert(
            "WriteId".to_owned(),
            s(format!("{:016x}", rand::random::<u64>())),
        );
        // Condition: the version this write was computed from - keeps "every agent's move of
        // the breaker starts from the breaker as it is" (a probe is handed out once).
        let req = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item.clone()));
        let req = if record.version <= 1 {
            req.condition_expression("attribute_not_exists(pk)")
        } else {
            req.condition_expression("Version = :v")
                .expression_attribute_values(":v", n(record.version - 1))
        };
        Self::put_if_own(req, &item).await
    }

    async fn mark_pace(&self, name: &str, mark: PaceMark) -> Result<bool, StoreError> {
        let req = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("pk", s(format!("BREAKER#{name}")))
            .key("sk", s("PACE"));
        // The item goes a day after its last mark: a service no longer called is presumed
        // slow again, as one never called.
        let req = match mark {
            // Condition: no call outlived SLOW_CALL after `calm_since`, and the stored mark
            // ends earlier - keeps "a service is fast only a spell after its last slow call"
            // and "a fast mark never moves back" (a mark from a stale read fails). A lost
            // answer, retried, fails against its own write: the agent reads the pace again.
            PaceMark::Fast { until, calm_since } => req
                .update_expression("SET FastUntil = :until, ExpiresAt = :e")
                .condition_expression(
                    "(attribute_not_exists(SlowAt) OR SlowAt <= :calm) \
                     AND (attribute_not_exists(FastUntil) OR FastUntil < :until)",
                )
                .expression_attribute_values(":until", ms(until))
                .expression_attribute_values(":calm", ms(calm_since))
                .expression_attribute_values(":e", n(until.timestamp() + KEY_TTL_SECONDS)),
            // Condition: no later slow call stored - keeps "the slow mark moves only forward"
            // (an agent's late report never hides a later one's).
            PaceMark::Slow { at } => req
                .update_expression("SET SlowAt = :at, ExpiresAt = :e REMOVE FastUntil")
                .condition_expression("attribute_not_exists(SlowAt) OR SlowAt < :at")
                .expression_attribute_values(":at", ms(at))
                .expression_attribute_values(
                    ":e",
                    n((at + PACE_SPELL).timestamp() + KEY_TTL_SECONDS),
                ),
        };
        Self::update_if(req).await
    }
}

impl DynamoStore {
    /// The breaker (`BREAKER`) and the service's pace (`PACE`) share a partition: one query
    /// reads both, at the price of one small read (half of it eventually consistent).
    async fn read_breaker(
        &self,
        name: &str,
        consistent: bool,
    ) -> Result<Option<BreakerRecord>, StoreError> {
        let out = self
            .client
            .query()
            .table_name(&self.table)
            .key_condition_expression("pk = :pk")
            .expression_attribute_values(":pk", s(format!("BREAKER#{name}")))
            .consistent_read(consistent)
            .send()
            .await
            .map_err(|e| unavailable(&e))?;
        let of = |sk: &str| {
            out.items().iter().find(|i| {
                i.get("sk")
                    .and_then(|v| v.as_s().ok())
                    .is_some_and(|v| v == sk)
            })
        };
        let pace = match of("PACE") {
            Some(item) => Some(Pace {
                fast_until: opt_n(item, "FastUntil")?.map(time).transpose()?,
                slow_at: opt_n(item, "SlowAt")?.map(time).transpose()?,
            }),
            None => None,
        };
        let Some(item) = of("BREAKER") else {
            return Ok(pace.map(|pace| BreakerRecord {
                pace,
                ..BreakerRecord::closed(name)
            }));
        };
        let state = match get_s(item, "State")? {
            "Closed" => BreakerState::Closed {
                failures: get_n(item, "Failures")?,
            },
            "Open" => BreakerState::Open {
                until: time(get_n(item, "Until")?)?,
            },
            "Paused" => BreakerState::Paused {
                since: time(get_n(item, "Since")?)?,
            },
            "HalfOpen" => BreakerState::HalfOpen {
                probes_left: get_n(item, "ProbesLeft")?,
                until: time(get_n(item, "Until")?)?,
            },
            other => return Err(corrupt(format!("unknown breaker state {other:?}"))),
        };
        Ok(Some(BreakerRecord {
            name: name.to_owned(),
            state,
            version: get_n(item, "Version")?,
            note: item.get("Note").and_then(|v| v.as_s().ok()).cloned(),
            open_since: match item.get("OpenSince") {
                Some(_) => Some(time(get_n(item, "OpenSince")?)?),
                None => None,
            },
            fault_keys: match item.get("FaultKeys") {
                Some(v) => v
                    .as_l()
                    .map_err(|_| corrupt("FaultKeys is not a list"))?
                    .iter()
                    .map(|k| {
                        k.as_s()
                            .cloned()
                            .map_err(|_| corrupt("FaultKeys holds a non-string"))
                    })
                    .collect::<Result<_, _>>()?,
                None => Vec::new(),
            },
            pace: pace.unwrap_or_default(),
        }))
    }
}
