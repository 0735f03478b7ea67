//! [`RateLimits`] on DynamoDB: items `RATE#<key>`, GCRA by conditional updates.

use super::item::*;
use super::store::*;
use crate::domain::rate::{Admission, Decision};
use crate::ports::StoreError;
use crate::ports::{RateLimits, RateRequest};
use async_trait::async_trait;
use aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder;
use aws_sdk_dynamodb::types::ReturnValuesOnConditionCheckFailure;

#[async_trait]
impl RateLimits for DynamoStore {
    async fn admit(&self, ask: RateRequest<'_>) -> Result<Admission, StoreError> {
        let RateRequest { key, limit, now } = ask;
        let now_ms = now.timestamp_millis();
        let pk = format!("RATE#{key}");
        // An idle caller's item goes an hour after its bucket refilled.
        let expires = |tat_ms: i64| n(tat_ms / 1000 + 3600);
        for _ in 0..4 {
            // A busy caller: its TAT is between now and now + tolerance. Condition: the TAT
            // is where it was when this admission was decided - keeps "at most `burst` + rate
            // × t requests of one caller are admitted in any t", however many functions admit
            // at once (one conditional write per request, no read).
            let busy = self
                .rate_update(&pk, now_ms)
                .update_expression("SET Tat = Tat + :i, ExpiresAt = :e")
                .condition_expression("Tat BETWEEN :now AND :max")
                .expression_attribute_values(":i", n(limit.interval_ms()))
                .expression_attribute_values(":max", n(now_ms + limit.tolerance_ms()))
                .expression_attribute_values(":e", expires(now_ms + limit.tolerance_ms()))
                .return_values_on_condition_check_failure(
                    ReturnValuesOnConditionCheckFailure::AllOld,
                )
                .send()
                .await;
            let old = match busy {
                Ok(_) => return Ok(Admission::Admitted),
                Err(e) => match e.as_service_error() {
                    Some(se) if se.is_conditional_check_failed_exception() => {
                        let item = match &se {
                            aws_sdk_dynamodb::operation::update_item::UpdateItemError::ConditionalCheckFailedException(c) => c.item().cloned(),
                            _ => None,
                        };
                        // Without the old item in the answer (an emulator may leave it out),
                        // read it.
                        let item = match item {
                            Some(i) => Some(i),
                            None => self.read_item(pk.clone(), "RATE").await?,
                        };
                        match item {
                            Some(i) => opt_n::<i64>(&i, "Tat")?,
                            None => None,
                        }
                    }
                    _ => return Err(unavailable(&e)),
                },
            };
            let tat_ms = match limit.decide(old, now_ms) {
                Decision::Refuse { retry_after } => return Ok(Admission::Limited { retry_after }),
                Decision::Admit { tat_ms } => tat_ms,
            };
            // A new or idle caller: no TAT, or one in the past. Condition: still so - a racing
            // admission that moved it first sends this one round again.
            let idle = self
                .rate_update(&pk, now_ms)
                .update_expression("SET Tat = :t, ExpiresAt = :e")
                .condition_expression("attribute_not_exists(Tat) OR Tat < :now")
                .expression_attribute_values(":t", n(tat_ms))
                .expression_attribute_values(":e", expires(tat_ms));
            if Self::update_if(idle).await? {
                return Ok(Admission::Admitted);
            }
        }
        // Four races lost in a row: the caller is sending as fast as the item can be written.
        Ok(Admission::Limited {
            retry_after: chrono::Duration::milliseconds(limit.interval_ms()),
        })
    }
}

impl DynamoStore {
    /// An update of the rate item `pk`, with `:now` (`now_ms`) for its condition; the caller
    /// adds the update and the condition.
    fn rate_update(&self, pk: &str, now_ms: i64) -> UpdateItemFluentBuilder {
        self.client
            .update_item()
            .table_name(&self.table)
            .key("pk", s(pk))
            .key("sk", s("RATE"))
            .expression_attribute_values(":now", n(now_ms))
    }
}
