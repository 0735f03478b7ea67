//! [`Gates`] on DynamoDB: a gate is the partition `GATE#<gate>`: its head (`GATE`: `Held`, the
//! holders' ids → when each was admitted, and `Version`) and one entry per task in line
//! (`Q#<ms>#<id>`, sorted as the tasks were created; the head sorts before them). One strongly
//! consistent query reads the head and the first of the line.

use super::item::*;
use super::store::*;
use crate::domain::TaskId;
use crate::domain::gate::{InLine, admits, next_in_line};
use crate::ports::{GateAdmission, GateAnswer, GatePlace, GateState, Gates, StoreError};
use async_trait::async_trait;
use aws_sdk_dynamodb::types::{Delete, Put, TransactWriteItem, Update};
use std::collections::HashMap;

/// A gate as read: its head's version (`None`: no head) and holders, and the first of its line.
struct Read {
    version: Option<u64>,
    holders: Vec<TaskId>,
    line: Vec<InLine>,
    /// The line may go on past what was read.
    more: bool,
}

impl DynamoStore {
    /// The head and the first `limit` in line (strongly consistent: the read a write's
    /// condition then checks).
    async fn read_gate(&self, gate: &str, limit: u32) -> Result<Read, StoreError> {
        let out = self
            .client
            .query()
            .table_name(&self.table)
            .key_condition_expression("pk = :pk")
            .expression_attribute_values(":pk", s(gate_pk(gate)))
            .consistent_read(true)
            .limit(limit.saturating_add(1) as i32)
            .send()
            .await
            .map_err(|e| unavailable(&e))?;
        let mut read = Read {
            version: None,
            holders: vec![],
            line: vec![],
            more: out.last_evaluated_key().is_some_and(|k| !k.is_empty()),
        };
        for item in out.items() {
            let sk = get_s(item, "sk")?;
            if sk == "GATE" {
                read.version = Some(get_n(item, "Version")?);
                if let Some(held) = item.get("Held").and_then(|h| h.as_m().ok()) {
                    for id in held.keys() {
                        read.holders.push(parse_id(id)?);
                    }
                }
            } else if let Some(rest) = sk.strip_prefix("Q#") {
                let (ms, id) = rest
                    .split_once('#')
                    .ok_or_else(|| corrupt(format!("gate entry {sk:?}")))?;
                let ms: i64 = ms
                    .parse()
                    .map_err(|_| corrupt(format!("gate entry {sk:?}")))?;
                read.line.push((ms, parse_id(id)?));
            }
        }
        read.holders.sort();
        Ok(read)
    }

    /// How many wait in line before `place`'s task (`None`: it is not in line).
    async fn ahead(&self, place: &GatePlace<'_>) -> Result<Option<u32>, StoreError> {
        let mine = gate_entry_sk(place);
        let mut count = 0u32;
        let mut found = false;
        let mut start = None;
        loop {
            let out = self
                .client
                .query()
                .table_name(&self.table)
                .key_condition_expression("pk = :pk AND sk BETWEEN :first AND :mine")
                .expression_attribute_values(":pk", s(gate_pk(place.gate)))
                .expression_attribute_values(":first", s("Q#"))
                .expression_attribute_values(":mine", s(&mine))
                .projection_expression("sk")
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(|e| unavailable(&e))?;
            for item in out.items() {
                if get_s(item, "sk")? == mine {
                    found = true;
                } else {
                    count += 1;
                }
            }
            match out.last_evaluated_key() {
                Some(k) if !k.is_empty() => start = Some(k.clone()),
                _ => break,
            }
        }
        Ok(found.then_some(count))
    }

    /// Whether `place`'s task has its entry in line (a strongly consistent query of that one
    /// key: the gate's partition is what a function may query).
    async fn in_line(&self, place: &GatePlace<'_>) -> Result<bool, StoreError> {
        let out = self
            .client
            .query()
            .table_name(&self.table)
            .key_condition_expression("pk = :pk AND sk = :mine")
            .expression_attribute_values(":pk", s(gate_pk(place.gate)))
            .expression_attribute_values(":mine", s(gate_entry_sk(place)))
            .consistent_read(true)
            .select(aws_sdk_dynamodb::types::Select::Count)
            .send()
            .await
            .map_err(|e| unavailable(&e))?;
        Ok(out.count() > 0)
    }

    /// The write of the head that admits `task` (`read.version`: the head as read).
    fn admit_head(
        &self,
        place: &GatePlace<'_>,
        read: &Read,
        now_ms: i64,
    ) -> Result<TransactWriteItem, StoreError> {
        let id = place.task_id.to_string();
        Ok(match read.version {
            // Condition: no head yet - keeps "a gate's holders change one admission or
            // leave at a time" (two first admissions: one writes the head).
            None => TransactWriteItem::builder()
                .put(
                    Put::builder()
                        .table_name(&self.table)
                        .item("pk", s(gate_pk(place.gate)))
                        .item("sk", s("GATE"))
                        .item(
                            "Held",
                            aws_sdk_dynamodb::types::AttributeValue::M(HashMap::from([(
                                id,
                                n(now_ms),
                            )])),
                        )
                        .item("Version", n(1))
                        .condition_expression("attribute_not_exists(pk)")
                        .build()
                        .map_err(build_err)?,
                )
                .build(),
            // Condition: the head as read - keeps "at most the limit hold the gate, and no
            // one is admitted before a task created earlier": the holders and the line's
            // first were read with it.
            Some(v) => TransactWriteItem::builder()
                .update(
                    Update::builder()
                        .table_name(&self.table)
                        .key("pk", s(gate_pk(place.gate)))
                        .key("sk", s("GATE"))
                        .update_expression("SET Held.#t = :now, Version = :next")
                        .condition_expression("Version = :v")
                        .expression_attribute_names("#t", id)
                        .expression_attribute_values(":now", n(now_ms))
                        .expression_attribute_values(":next", n(v + 1))
                        .expression_attribute_values(":v", n(v))
                        .build()
                        .map_err(build_err)?,
                )
                .build(),
        })
    }

    /// The delete of `place`'s entry in line (condition: it is there - keeps "a place in
    /// line is left once").
    fn entry_delete(&self, place: &GatePlace<'_>) -> Result<TransactWriteItem, StoreError> {
        Ok(TransactWriteItem::builder()
            .delete(
                Delete::builder()
                    .table_name(&self.table)
                    .key("pk", s(gate_pk(place.gate)))
                    .key("sk", s(gate_entry_sk(place)))
                    .condition_expression("attribute_exists(pk)")
                    .build()
                    .map_err(build_err)?,
            )
            .build())
    }

    /// Writes `items` in one transaction. A conditional failure or a conflict with another
    /// transaction is a lost race ([`StoreError::ConditionFailed`]), but where `written` is the
    /// last item's own write and the stored item already is it (an emulator that ignores the
    /// token, or a retry past its ten minutes): then the transaction committed.
    async fn transact(
        &self,
        items: Vec<TransactWriteItem>,
        written: Option<&Item>,
    ) -> Result<(), StoreError> {
        let result = self
            .client
            .transact_write_items()
            .set_transact_items(Some(items))
            // A retry of a committed transaction (the SDK's) succeeds.
            .client_request_token(uuid::Uuid::new_v4().to_string())
            .send()
            .await;
        let Err(err) = result else {
            return Ok(());
        };
        let reasons = cancellation_reasons(&err);
        if written.is_some() && reasons.last().and_then(|r| r.item()) == written {
            Ok(())
        } else if any_condition_failed(reasons)
            || reasons
                .iter()
                .any(|r| r.code() == Some("TransactionConflict"))
        {
            Err(StoreError::ConditionFailed)
        } else {
            Err(unavailable(&err))
        }
    }
}

/// How often a leave is tried against a gate that keeps changing (each admission and leave
/// moves its head) before the caller is told to come back.
const LEAVE_TRIES: u32 = 10;

fn parse_id(text: &str) -> Result<TaskId, StoreError> {
    text.parse()
        .map_err(|e: crate::domain::ValidationError| corrupt(e.to_string()))
}

#[async_trait]
impl Gates for DynamoStore {
    async fn enter(&self, a: GateAdmission<'_>) -> Result<GateAnswer, StoreError> {
        let GateAdmission { place, put, now } = a;
        let read = self.read_gate(place.gate, place.limit).await?;
        let me = (place.created_at.timestamp_millis(), place.task_id);
        let position = read.line.iter().position(|p| *p == me);
        let admitted = position.is_some_and(|at| admits(read.holders.len(), at, place.limit));
        if !admitted {
            let ahead = match position {
                Some(at) => Some(at as u32),
                None if read.more => self.ahead(&place).await?,
                None => None,
            };
            return Ok(GateAnswer::Waiting(GateState {
                holders: read.holders,
                ahead,
            }));
        }
        let head = self.admit_head(&place, &read, now.timestamp_millis())?;
        let (record, item) = self.guarded_record_put(put)?;
        // One transaction: the head (as read), the place in line left, the record (its
        // claim, under its own condition). Both or neither; the record read back (as
        // `put_with_input`'s) when the answer is lost.
        self.transact(vec![head, self.entry_delete(&place)?, record], Some(&item))
            .await?;
        Ok(GateAnswer::Admitted)
    }

    async fn leave(&self, place: GatePlace<'_>) -> Result<Vec<TaskId>, StoreError> {
        // The head, then the line: a holder's leave changes the head (under its version);
        // a waiting task's, its entry. Tried again on a lost race, after a short pause.
        for tried in 0..LEAVE_TRIES {
            if tried > 0 {
                let pause = rand::random_range(5..20) * u64::from(tried);
                tokio::time::sleep(std::time::Duration::from_millis(pause)).await;
            }
            let read = self
                .read_gate(place.gate, place.limit.saturating_add(1))
                .await?;
            let held = read.holders.contains(&place.task_id);
            let me = (place.created_at.timestamp_millis(), place.task_id);
            let mut writes = Vec::new();
            if held && let Some(v) = read.version {
                // Condition: the head as read - keeps "a gate's holders change one admission
                // or leave at a time".
                writes.push(
                    TransactWriteItem::builder()
                        .update(
                            Update::builder()
                                .table_name(&self.table)
                                .key("pk", s(gate_pk(place.gate)))
                                .key("sk", s("GATE"))
                                .update_expression("REMOVE Held.#t SET Version = :next")
                                .condition_expression("Version = :v")
                                .expression_attribute_names("#t", place.task_id.to_string())
                                .expression_attribute_values(":next", n(v + 1))
                                .expression_attribute_values(":v", n(v))
                                .build()
                                .map_err(build_err)?,
                        )
                        .build(),
                );
            }
            // Past the line's first read, its own entry looked up by its key (not counted up
            // to).
            let queued = read.line.contains(&me) || (read.more && self.in_line(&place).await?);
            if queued {
                writes.push(self.entry_delete(&place)?);
            }
            if !writes.is_empty() {
                match self.transact(writes, None).await {
                    Ok(()) => {}
                    Err(StoreError::ConditionFailed) => continue,
                    Err(e) => return Err(e),
                }
            }
            let holders = read.holders.len() - usize::from(held);
            let line: Vec<InLine> = read.line.into_iter().filter(|p| *p != me).collect();
            return Ok(next_in_line(holders, &line, place.limit));
        }
        Err(StoreError::Unavailable(
            "the gate kept changing while a task left it".into(),
        ))
    }

    async fn gate_state(&self, place: GatePlace<'_>) -> Result<GateState, StoreError> {
        let read = self.read_gate(place.gate, 0).await?;
        Ok(GateState {
            holders: read.holders,
            ahead: self.ahead(&place).await?,
        })
    }
}
