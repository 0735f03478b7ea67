//! [`TaskStore`] on DynamoDB: tasks, their state records and idempotency keys.

use super::item::*;
use super::records::*;
use super::store::*;
use crate::domain::Task;
use crate::domain::{StateRecord, TaskId};
use crate::ports::StoreError;
use crate::ports::{
    CreateOutcome, CurrentRun, GatePlace, Guarded, IdempotencyRecord, NewTask, TaskStore, Turn,
};
use async_trait::async_trait;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{
    Delete, Put, ReturnValuesOnConditionCheckFailure, TransactWriteItem,
};
use std::collections::HashMap;

impl DynamoStore {
    /// A `Put` that must create its item (returning the item found on a conditional failure).
    fn create_put(&self, item: Item) -> Result<TransactWriteItem, StoreError> {
        let put = Put::builder()
            .table_name(&self.table)
            .set_item(Some(item))
            .condition_expression("attribute_not_exists(pk)")
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .build()
            .map_err(build_err)?;
        Ok(TransactWriteItem::builder().put(put).build())
    }

    /// The `Put` of a new idempotency key `k`: on absence, or over a key past its expiry (DynamoDB's
    /// TTL deletes an expired item some time later, so an expired key still stored is free).
    fn key_put(&self, k: &IdempotencyRecord) -> Result<TransactWriteItem, StoreError> {
        let item = HashMap::from([
            ("pk".to_owned(), s(format!("IDEM#{}", k.key))),
            ("sk".to_owned(), s("IDEM")),
            ("RequestHash".to_owned(), s(&k.request_hash)),
            ("TaskId".to_owned(), s(k.task_id.to_string())),
            ("CreatedAt".to_owned(), ms(k.created_at)),
            ("ExpiresAt".to_owned(), n(k.expires_at().timestamp())),
        ]);
        let put = Put::builder()
            .table_name(&self.table)
            .set_item(Some(item))
            .condition_expression("attribute_not_exists(pk) OR ExpiresAt <= :now")
            .expression_attribute_values(":now", n(k.created_at.timestamp()))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .build()
            .map_err(build_err)?;
        Ok(TransactWriteItem::builder().put(put).build())
    }

    /// The `Put` of schedule `turn.schedule`'s current task: `task_id`, started by the run at
    /// `turn.run_at`.
    fn turn_put(&self, turn: &Turn<'_>, task_id: TaskId) -> Result<TransactWriteItem, StoreError> {
        let put = Put::builder()
            .table_name(&self.table)
            .item("pk", s(current_pk(turn.schedule)))
            .item("sk", s("CURRENT"))
            .item("TaskId", s(task_id.to_string()))
            .item("RunAt", ms(turn.run_at));
        // Condition: the current task is still the one the run read (or there is none yet) -
        // keeps "a schedule's current task is replaced only by a run that read it": of two
        // runs that read the same current task, one starts a task and the other reads again
        // (under `overlap: skip`, at most one task of a schedule runs at a time).
        let put = match turn.after {
            None => put.condition_expression("attribute_not_exists(pk)"),
            Some(after) => put
                .condition_expression("TaskId = :after")
                .expression_attribute_values(":after", s(after.to_string())),
        };
        Ok(TransactWriteItem::builder()
            .put(put.build().map_err(build_err)?)
            .build())
    }

    async fn read_key(&self, key: &str) -> Result<Option<IdempotencyRecord>, StoreError> {
        let Some(item) = self.read_item(format!("IDEM#{key}"), "IDEM").await? else {
            return Ok(None);
        };
        let item = &item;
        Ok(Some(IdempotencyRecord {
            key: key.to_owned(),
            request_hash: get_s(item, "RequestHash")?.to_owned(),
            task_id: get_s(item, "TaskId")?
                .parse()
                .map_err(|e: crate::domain::ValidationError| corrupt(e.to_string()))?,
            created_at: time(get_n(item, "CreatedAt")?)?,
        }))
    }
}

/// A put of the state record `item` under the condition expression `e` (an [`Expr`]), on a
/// `PutItem` request or a transaction's `Put` (`builder`): the stored item comes back on a
/// conditional failure, for the read-back of an ambiguous write.
macro_rules! guarded_put {
    ($builder:expr, $table:expr, $item:expr, $e:expr) => {{
        let e = $e;
        $builder
            .table_name($table)
            .set_item(Some($item))
            .condition_expression(e.clauses.join(" AND "))
            .set_expression_attribute_names(Some(e.names))
            .set_expression_attribute_values((!e.values.is_empty()).then_some(e.values))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
    }};
}

impl DynamoStore {
    /// The transaction's `Put` of `put.record` under its condition (its expiry with it, as
    /// `put` writes it), and the item it writes: a conditional failure's read-back compares
    /// the stored item with it.
    pub(super) fn guarded_record_put(
        &self,
        put: Guarded<'_>,
    ) -> Result<(TransactWriteItem, Item), StoreError> {
        let mut item = state_item(put.record, self.shards);
        if let Some(at) = self.expiry(put.record) {
            item.insert("ExpiresAt".to_owned(), n(at));
        }
        let e = condition_expr(put.condition);
        let put = guarded_put!(Put::builder(), &self.table, item.clone(), e)
            .build()
            .map_err(build_err)?;
        Ok((TransactWriteItem::builder().put(put).build(), item))
    }

    /// The `Put` of a task's place in line at its gate (`GATE#<gate>`, `Q#<ms>#<id>`).
    fn gate_entry_put(&self, g: &GatePlace<'_>) -> Result<TransactWriteItem, StoreError> {
        let item = HashMap::from([
            ("pk".to_owned(), s(gate_pk(g.gate))),
            ("sk".to_owned(), s(gate_entry_sk(g))),
            ("TaskId".to_owned(), s(g.task_id.to_string())),
        ]);
        self.create_put(item)
    }
}

#[async_trait]
impl TaskStore for DynamoStore {
    async fn create(&self, new: NewTask<'_>) -> Result<CreateOutcome, StoreError> {
        let NewTask {
            task,
            record,
            key,
            turn,
            gate,
        } = new;
        // One transaction, the task and its record `attribute_not_exists(pk)`, the key absent
        // or expired: keeps "a task exists iff its state record exists" and "an idempotency
        // key names exactly one task until it expires" (its expiry comes before its task's);
        // for a schedule's run, its current task too (see `turn_put`).
        let mut writes = Vec::with_capacity(4);
        if let Some(k) = key {
            writes.push(self.key_put(k)?);
        }
        writes.push(self.create_put(task_item(task, self.caller_shards))?);
        let state = state_item(record, self.shards);
        writes.push(self.create_put(state.clone())?);
        let state_at = writes.len() - 1;
        if let Some(t) = &turn {
            writes.push(self.turn_put(t, task.id)?);
        }
        // Its place in line at its gate (condition: absent - keeps "a task waits in line
        // once, from its creation").
        if let Some(g) = &gate {
            writes.push(self.gate_entry_put(g)?);
        }
        let result = self
            .client
            .transact_write_items()
            .set_transact_items(Some(writes))
            // The task id is new for every submission and the same for the SDK's retries of
            // this one: DynamoDB answers a retry of a committed transaction with success (for
            // ten minutes) instead of a conflict. (Not the idempotency key: a client's retry
            // under the same key makes new items, which DynamoDB would refuse as an
            // IdempotentParameterMismatch; the key item already covers client retries.)
            .client_request_token(task.id.to_string())
            .send()
            .await;
        let err = match result {
            Ok(_) => return Ok(CreateOutcome::Created),
            Err(e) => e,
        };
        // The token (the task id) was used, within ten minutes, by a transaction with other
        // items: another request made this task id, so it exists and is not this request's.
        if matches!(
            err.as_service_error(),
            Some(TransactWriteItemsError::IdempotentParameterMismatchException(_))
        ) {
            return Err(StoreError::ConditionFailed);
        }
        let reasons = cancellation_reasons(&err);
        // The read-back, where no token helps (past its ten minutes, or on an emulator that
        // ignores it): the state record already is the one this request made (it holds this
        // request's random task id, callback key and times), so this request created it.
        if reasons.get(state_at).and_then(|r| r.item()) == Some(&state) {
            return Ok(CreateOutcome::Created);
        }
        let code = |at: usize| reasons.get(at).and_then(|r| r.code());
        let failed = |at: usize| code(at) == Some("ConditionalCheckFailed");
        let any_failed = any_condition_failed(reasons);
        match key {
            // A taken key first: the run delivered again is answered its own task.
            Some(k) if failed(0) => match self.read_key(&k.key).await? {
                Some(first) => Ok(CreateOutcome::KeyExists(first)),
                None => Err(StoreError::Unavailable(
                    "idempotency key vanished after a conflict".into(),
                )),
            },
            _ if turn.is_some() && failed(state_at + 1) => Ok(CreateOutcome::TurnTaken),
            // Another run's transaction on the schedule's current task at the same moment:
            // this one wrote nothing; the run reads the current task again.
            _ if turn.is_some() && code(state_at + 1) == Some("TransactionConflict") => {
                Ok(CreateOutcome::TurnTaken)
            }
            _ if any_failed => Err(StoreError::ConditionFailed),
            _ => Err(unavailable(&err)),
        }
    }
    async fn current_run(&self, schedule: &str) -> Result<Option<CurrentRun>, StoreError> {
        let Some(item) = self.read_item(current_pk(schedule), "CURRENT").await? else {
            return Ok(None);
        };
        Ok(Some(CurrentRun {
            task_id: get_s(&item, "TaskId")?
                .parse()
                .map_err(|e: crate::domain::ValidationError| corrupt(e.to_string()))?,
            run_at: time(get_n(&item, "RunAt")?)?,
        }))
    }
    async fn get(&self, id: TaskId) -> Result<Option<(Task, StateRecord)>, StoreError> {
        let out = self
            .client
            .query()
            .table_name(&self.table)
            .key_condition_expression("pk = :pk")
            .expression_attribute_values(":pk", s(task_pk(&id)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| unavailable(&e))?;
        let mut task = None;
        let mut state = None;
        for item in out.items() {
            match get_s(item, "sk")? {
                "TASK" => task = Some(parse_task(item)?),
                "STATE" => state = Some(parse_state(item)?),
                _ => {}
            }
        }
        Ok(task.zip(state))
    }
    async fn get_state(&self, id: TaskId) -> Result<Option<StateRecord>, StoreError> {
        self.read_item(task_pk(&id), "STATE")
            .await?
            .as_ref()
            .map(parse_state)
            .transpose()
    }
    async fn put_as(&self, put: Guarded<'_>, write: u64) -> Result<(), StoreError> {
        let Guarded { record, condition } = put;
        let e = condition_expr(condition);
        let mut item = state_item(record, self.shards);
        // The request's id, so the read-back below tells this request's write (its own retry)
        // from a rival's identical one.
        item.insert("WriteId".to_owned(), s(format!("{write:016x}")));
        // A final record expires with the retention (DynamoDB TTL on `ExpiresAt`).
        if let Some(at) = self.expiry(record) {
            item.insert("ExpiresAt".to_owned(), n(at));
        }
        // On a conditional failure DynamoDB returns the item as it is, at no extra cost: what
        // the read-back below needs.
        let result = guarded_put!(self.client.put_item(), &self.table, item.clone(), e)
            .send()
            .await;
        match result {
            Ok(_) => Ok(()),
            Err(err) => match err.as_service_error() {
                Some(PutItemError::ConditionalCheckFailedException(c)) => {
                    // An ambiguous write: the SDK retries a request whose response was lost
                    // (a timeout, a 5xx), and the retry fails its condition against the
                    // first attempt's own write. "The record already is what I wrote" (this
                    // item, `WriteId` and all) is success; anything else, a rival's identical
                    // transition included, is a lost race.
                    if c.item() == Some(&item) {
                        Ok(())
                    } else {
                        Err(StoreError::ConditionFailed)
                    }
                }
                _ => Err(unavailable(&err)),
            },
        }
    }
    async fn put_with_input(&self, put: Guarded<'_>, task: &Task) -> Result<(), StoreError> {
        let Guarded { record, condition } = put;
        // One transaction: the task's new input, its revision and the earlier inputs steps ran
        // with (condition: the task item exists at the revision before - keeps "an input is
        // replaced, never created, and each revision follows the one it replaces") and the
        // record under its own condition (keeps whatever invariant the transition's condition
        // names). Both or neither.
        let e = condition_expr(condition);
        let (set, was) = match task.input_revision.checked_sub(1) {
            Some(0) | None => ("attribute_exists(pk) AND attribute_not_exists(#rev)", None),
            Some(prev) => ("attribute_exists(pk) AND #rev = :prev", Some(prev)),
        };
        let mut update = aws_sdk_dynamodb::types::Update::builder()
            .table_name(&self.table)
            .key("pk", s(task_pk(&record.task_id)))
            .key("sk", s("TASK"))
            .condition_expression(set)
            .expression_attribute_names("#input", "Input")
            .expression_attribute_names("#rev", "InputRevision")
            .expression_attribute_names("#earlier", "EarlierInputs")
            .expression_attribute_names("#inputRef", "InputRef")
            .expression_attribute_values(":input", s(task.input.to_string()))
            .expression_attribute_values(":rev", n(task.input_revision));
        if let Some(prev) = was {
            update = update.expression_attribute_values(":prev", n(prev));
        }
        // The input's reference when it is kept outside the item, else none.
        let mut set = vec!["#input = :input", "#rev = :rev"];
        let mut remove = vec![];
        match &task.input_ref {
            Some(r) => {
                set.push("#inputRef = :inputRef");
                update = update.expression_attribute_values(
                    ":inputRef",
                    s(serde_json::to_string(r).unwrap_or_default()),
                );
            }
            None => remove.push("#inputRef"),
        }
        if task.earlier_inputs.is_empty() {
            remove.push("#earlier");
        } else {
            set.push("#earlier = :earlier");
            update = update.expression_attribute_values(":earlier", s(earlier_inputs(task)));
        }
        let expression = if remove.is_empty() {
            format!("SET {}", set.join(", "))
        } else {
            format!("SET {} REMOVE {}", set.join(", "), remove.join(", "))
        };
        let update = update
            .update_expression(expression)
            .build()
            .map_err(build_err)?;
        let mut item = state_item(record, self.shards);
        if let Some(at) = self.expiry(record) {
            item.insert("ExpiresAt".to_owned(), n(at));
        }
        let put = guarded_put!(Put::builder(), &self.table, item.clone(), e)
            .build()
            .map_err(build_err)?;
        let result = self
            .client
            .transact_write_items()
            .transact_items(TransactWriteItem::builder().update(update).build())
            .transact_items(TransactWriteItem::builder().put(put).build())
            // The same for the SDK's retries of this call: a retry of a committed transaction
            // succeeds instead of failing its conditions.
            .client_request_token(uuid::Uuid::new_v4().to_string())
            .send()
            .await;
        match result {
            Ok(_) => Ok(()),
            Err(err) => {
                let reasons = cancellation_reasons(&err);
                // The read-back (see `put`): the record already is the one this call wrote,
                // so the transaction committed, input and all.
                if reasons.last().and_then(|r| r.item()) == Some(&item) {
                    Ok(())
                } else if any_condition_failed(reasons) {
                    Err(StoreError::ConditionFailed)
                } else {
                    Err(unavailable(&err))
                }
            }
        }
    }
    async fn expire_task(&self, record: &StateRecord) -> Result<(), StoreError> {
        let Some(at) = self.expiry(record) else {
            return Ok(());
        };
        // Condition: the task item exists - keeps "an expiry never creates an item" (a task
        // whose items were already deleted is left alone).
        let out = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("pk", s(task_pk(&record.task_id)))
            .key("sk", s("TASK"))
            .update_expression("SET ExpiresAt = :at")
            .condition_expression("attribute_exists(pk)")
            .expression_attribute_values(":at", n(at));
        Self::update_if(out).await.map(|_| ())
    }

    fn retention(&self) -> Option<chrono::Duration> {
        self.retention
    }

    async fn forget_task(&self, record: &StateRecord) -> Result<(), StoreError> {
        let pk = task_pk(&record.task_id);
        // Condition: the record is gone or still at the version read - keeps "a task is
        // forgotten only as it was when its payloads were deleted" (its purge read it final;
        // nothing moves a final record, but the condition says so rather than assumes it).
        let state = Delete::builder()
            .table_name(&self.table)
            .key("pk", s(&pk))
            .key("sk", s("STATE"))
            .condition_expression("attribute_not_exists(pk) OR #v = :v")
            .expression_attribute_names("#v", "Version")
            .expression_attribute_values(":v", n(record.version))
            .build()
            .map_err(build_err)?;
        // No condition: the task item goes with its record (or is gone already).
        let task = Delete::builder()
            .table_name(&self.table)
            .key("pk", s(&pk))
            .key("sk", s("TASK"))
            .build()
            .map_err(build_err)?;
        let result = self
            .client
            .transact_write_items()
            .transact_items(TransactWriteItem::builder().delete(state).build())
            .transact_items(TransactWriteItem::builder().delete(task).build())
            // A retry of a committed transaction succeeds.
            .client_request_token(uuid::Uuid::new_v4().to_string())
            .send()
            .await;
        match result {
            Ok(_) => Ok(()),
            Err(err) if any_condition_failed(cancellation_reasons(&err)) => {
                Err(StoreError::ConditionFailed)
            }
            Err(err) => Err(unavailable(&err)),
        }
    }
}
