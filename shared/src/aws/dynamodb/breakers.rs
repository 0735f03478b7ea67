//! [`Breakers`] on DynamoDB: items `BREAKER#<name>`.

use super::item::*;
use super::store::*;
use crate::domain::{BreakerRecord, BreakerState};
use crate::ports::Breakers;
use crate::ports::StoreError;
use async_trait::async_trait;
use aws_sdk_dynamodb::types::AttributeValue;
use std::collections::HashMap;

#[async_trait]
impl Breakers for DynamoStore {
    async fn get_breaker(&self, name: &str) -> Result<Option<BreakerRecord>, StoreError> {
        let Some(item) = self.read_item(format!("BREAKER#{name}"), "BREAKER").await? else {
            return Ok(None);
        };
        let item = &item;
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
        }))
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
}
