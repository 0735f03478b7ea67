//! [`TaskLists`] on DynamoDB: the operator's list (`state-index`) and a caller's list
//! (`caller-shard-index`), merged across their shards.

use super::item::*;
use super::records::*;
use super::store::*;
use crate::domain::Caller;
use crate::domain::keys::MAX_SEARCH_KEYS;
use crate::domain::{ProcessState, TaskId};
use crate::ports::StoreError;
use crate::ports::{Count, Cursor, InState, KeyQuery, Page, Paging, Summary, TaskLists};
use async_trait::async_trait;
use std::collections::HashMap;

#[async_trait]
impl TaskLists for DynamoStore {
    async fn list(&self, of: InState<'_>, page: Paging<'_>) -> Result<Page, StoreError> {
        let (state, workflow) = (of.state, of.workflow);
        let limit = page.limit.clamp(1, 1000);
        let parts = self.state_partitions(state);
        let mut items = Vec::new();
        let mut after = page.after.cloned();
        // `Pending` and `Processing` share their entries: a page of one of them reads the
        // rows of both until it holds `limit` of its own, a few rounds at most (then it is
        // short, with its cursor: a page may be).
        for _ in 0..LIST_ROUNDS {
            // The shards merged ([`DynamoStore::newest_first`]). The index projects only the
            // task's id and workflow: the page's summaries are then read from the state
            // records (one `BatchGetItem`), so a write within a state changes nothing in the
            // index.
            let (rows, next) = self
                .newest_first(
                    Partitions {
                        parts: parts.clone(),
                        sort: "StateSince",
                        filters: workflow.map(|w| ("Workflow", w)).into_iter().collect(),
                        lower: None,
                        upper: None,
                    },
                    Paging {
                        limit: limit - items.len(),
                        after: after.as_ref(),
                    },
                )
                .await?;
            let mut found = self.summaries(rows.iter().map(|(_, id)| *id)).await?;
            items.extend(rows.iter().filter_map(|(ms, id)| {
                let mut summary = found.remove(id)?;
                // The index lags the table: a record that has left the state since is left
                // out; one that left and came back is listed where the index has it.
                summary.since = time(*ms).ok()?;
                (summary.process_state == state).then_some(summary)
            }));
            after = next;
            if after.is_none() || items.len() >= limit {
                break;
            }
        }
        Ok(Page { items, next: after })
    }
    async fn count(&self, of: InState<'_>, cap: u64) -> Result<Count, StoreError> {
        // The state's own partitions, counted as they are: every state's, and an active
        // state's entries written before the two shared theirs.
        let mut total = 0u64;
        for shard in 0..self.shards {
            let key = per_state_shard_key(of.state, shard);
            total += self.count_partition(&key, of.workflow, cap - total).await?;
            if total > cap {
                return Ok(Count {
                    count: cap,
                    capped: true,
                });
            }
        }
        if of.state.is_active() {
            return self.count_active(of, cap, total).await;
        }
        Ok(Count {
            count: total,
            capped: false,
        })
    }
    async fn list_by_caller(&self, caller: &Caller, page: Paging<'_>) -> Result<Page, StoreError> {
        let page = Paging {
            limit: page.limit.clamp(1, 100),
            ..page
        };
        let parts = (0..self.caller_shards)
            .map(|shard| {
                (
                    CALLER_INDEX.into(),
                    "CallerShard".into(),
                    caller.index_key(shard),
                )
            })
            .collect();
        let (rows, next) = self
            .newest_first(
                Partitions {
                    parts,
                    sort: "CreatedAt",
                    filters: vec![],
                    lower: None,
                    upper: None,
                },
                page,
            )
            .await?;
        let mut found = self.summaries(rows.iter().map(|(_, id)| *id)).await?;
        // A task whose state record is gone (expired between the two reads) is left out.
        let items = rows.iter().filter_map(|(_, id)| found.remove(id)).collect();
        Ok(Page { items, next })
    }
    async fn list_by_key(&self, q: KeyQuery<'_>, page: Paging<'_>) -> Result<Page, StoreError> {
        let page = Paging {
            limit: page.limit.clamp(1, 100),
            ..page
        };
        // Every slot's index: a key's name may take another slot in another workflow.
        let value = q.key.index_value();
        let parts = (0..MAX_SEARCH_KEYS)
            .map(|slot| (key_index(slot), key_attribute(slot), value.clone()))
            .collect();
        let mut filters = Vec::new();
        if let Some(w) = q.workflow {
            filters.push(("Workflow", w));
        }
        if let Some(c) = q.caller {
            filters.push(("Caller", c.as_str()));
        }
        let (rows, next) = self
            .newest_first(
                Partitions {
                    parts,
                    sort: "CreatedAt",
                    filters,
                    lower: q.from.map(|f| f.timestamp_millis()),
                    // Created before `to`: at most its millisecond less one.
                    upper: q.to.map(|t| t.timestamp_millis() - 1),
                },
                page,
            )
            .await?;
        let mut found = self.summaries(rows.iter().map(|(_, id)| *id)).await?;
        // A task whose state record is gone (expired between the two reads) is left out, and
        // so is one not in the state asked for.
        let items = rows
            .iter()
            .filter_map(|(_, id)| found.remove(id))
            .filter(|s| q.state.is_none_or(|state| s.process_state == state))
            .collect();
        Ok(Page { items, next })
    }
}

/// The attributes of a state record a [`Summary`] is made of.
const SUMMARY_ATTRIBUTES: [&str; 10] = [
    "pk",
    "TaskId",
    "Workflow",
    "ProcessState",
    "CurrentStep",
    "FailureCount",
    "Attempt",
    "LastError",
    "UpdatedAt",
    "StateSince",
];

/// The GSI partitions a list merges: each `(index, hash attribute, value)` of `parts`, newest
/// `sort` first, within `lower..=upper` (ms) if given, with each of `filters` (an attribute
/// projected into the index, and its value).
struct Partitions<'a> {
    parts: Vec<(String, String, String)>,
    sort: &'static str,
    filters: Vec<(&'static str, &'a str)>,
    lower: Option<i64>,
    upper: Option<i64>,
}

impl DynamoStore {
    /// One page of the rows (sort key in ms, task id) of several partitions of one index as
    /// `page` asks (after `after`, at most `limit`): each partition's newest `limit` (and their ties) merged, newest first and ties
    /// by id, cut at `limit`, with the cursor after the last one if any partition has more. A
    /// partition is read from the cursor's time down (`sort <= t`). DynamoDB
    /// leaves rows with equal sort keys in no defined order, so a partition is read past its
    /// `limit` rows until its sort key changes: every row tied with its last one is taken, and
    /// the merge orders the ties by id. (Cut at `limit`, a partition could leave out a tied row
    /// whose id sorts before the page's last one, and the next page, starting after that id,
    /// would skip it.)
    async fn newest_first(
        &self,
        p: Partitions<'_>,
        page: Paging<'_>,
    ) -> Result<(Vec<(i64, TaskId)>, Option<Cursor>), StoreError> {
        let Paging { limit, after } = page;
        let mut rows: Vec<(i64, TaskId)> = Vec::new();
        let mut more = false;
        // The newest a row may be: the cursor's time (its ties are sorted out by id below),
        // or the range's upper bound.
        let upper = match (after.map(|c| c.at_ms), p.upper) {
            (Some(a), Some(u)) => Some(a.min(u)),
            (a, u) => a.or(u),
        };
        if let (Some(lo), Some(hi)) = (p.lower, upper)
            && lo > hi
        {
            return Ok((rows, None));
        }
        let filter = (!p.filters.is_empty()).then(|| {
            (0..p.filters.len())
                .map(|i| format!("#f{i} = :f{i}"))
                .collect::<Vec<_>>()
                .join(" AND ")
        });
        for (index, hash, value) in &p.parts {
            let mut start = None;
            let mut taken = 0;
            let mut last_ms = None;
            'partition: loop {
                // Past `limit`, only the boundary's ties are wanted: a few rows at a time.
                let want = if taken < limit { limit - taken } else { 25 };
                let mut query = self
                    .client
                    .query()
                    .table_name(&self.table)
                    .index_name(index)
                    .expression_attribute_names("#h", hash)
                    .expression_attribute_values(":k", s(value))
                    .scan_index_forward(false)
                    .limit(want as i32)
                    .set_exclusive_start_key(start.take());
                // (DynamoDB refuses a name or value the expression does not use.)
                query = match (p.lower, upper) {
                    (None, None) => query.key_condition_expression("#h = :k"),
                    (Some(lo), None) => query
                        .key_condition_expression("#h = :k AND #s >= :lo")
                        .expression_attribute_names("#s", p.sort)
                        .expression_attribute_values(":lo", n(lo)),
                    (None, Some(hi)) => query
                        .key_condition_expression("#h = :k AND #s <= :hi")
                        .expression_attribute_names("#s", p.sort)
                        .expression_attribute_values(":hi", n(hi)),
                    (Some(lo), Some(hi)) => query
                        .key_condition_expression("#h = :k AND #s BETWEEN :lo AND :hi")
                        .expression_attribute_names("#s", p.sort)
                        .expression_attribute_values(":lo", n(lo))
                        .expression_attribute_values(":hi", n(hi)),
                };
                if let Some(f) = &filter {
                    // A filter on projected attributes: the page may come back short, and the
                    // loop goes on from `LastEvaluatedKey` until it is full.
                    query = query.filter_expression(f);
                    for (i, (name, v)) in p.filters.iter().enumerate() {
                        query = query
                            .expression_attribute_names(format!("#f{i}"), *name)
                            .expression_attribute_values(format!(":f{i}"), s(*v));
                    }
                }
                let out = query.send().await.map_err(|e| unavailable(&e))?;
                for item in out.items() {
                    let id: TaskId = get_s(item, "pk")?
                        .strip_prefix("TASK#")
                        .ok_or_else(|| corrupt(format!("{index} item is not a task's")))?
                        .parse()
                        .map_err(|e: crate::domain::ValidationError| corrupt(e.to_string()))?;
                    let ms: i64 = get_n(item, p.sort)?;
                    if !after.is_none_or(|c| c.precedes(ms, id)) {
                        continue;
                    }
                    if taken >= limit && last_ms != Some(ms) {
                        // The first row after the boundary's ties: this partition has more.
                        more = true;
                        break 'partition;
                    }
                    taken += 1;
                    last_ms = Some(ms);
                    rows.push((ms, id));
                }
                match out.last_evaluated_key() {
                    Some(k) if !k.is_empty() => start = Some(k.clone()),
                    _ => break,
                }
            }
        }
        rows.sort_by_key(|(ms, id)| Cursor::order_key(*ms, *id));
        let more = more || rows.len() > limit;
        rows.truncate(limit);
        let next = more
            .then(|| rows.last().map(|(ms, id)| Cursor::at(*ms, *id)))
            .flatten();
        Ok((rows, next))
    }
}

/// How many rounds of rows a page of an active state reads at most ([`TaskLists::list`]).
const LIST_ROUNDS: usize = 5;

/// How many of the active states' shared entries a count reads at most, per unit of its cap:
/// past them, the count is the lower bound it has found (`capped`).
const ACTIVE_READS_PER_COUNTED: u64 = 4;

impl DynamoStore {
    /// The state index's partitions that hold the records in `state`: its shards, and for an
    /// active state its shards as written before the two shared them (a record not written
    /// since is still there).
    fn state_partitions(&self, state: ProcessState) -> Vec<(String, String, String)> {
        let mut keys: Vec<String> = (0..self.shards)
            .map(|shard| state_shard_key(state, shard))
            .collect();
        if state.is_active() {
            keys.extend((0..self.shards).map(|shard| per_state_shard_key(state, shard)));
        }
        keys.into_iter()
            .map(|key| (STATE_INDEX.into(), "StateShard".into(), key))
            .collect()
    }

    /// A query of the state-index partition `key` (of `workflow`'s tasks, if given).
    fn state_query(
        &self,
        key: &str,
        workflow: Option<&str>,
    ) -> aws_sdk_dynamodb::operation::query::builders::QueryFluentBuilder {
        let query = self
            .client
            .query()
            .table_name(&self.table)
            .index_name(STATE_INDEX)
            .key_condition_expression("StateShard = :k")
            .expression_attribute_values(":k", s(key));
        match workflow {
            Some(w) => query
                .filter_expression("Workflow = :w")
                .expression_attribute_values(":w", s(w)),
            None => query,
        }
    }

    /// The entries of one state-index partition (of a workflow), counted up to just past
    /// `cap`.
    async fn count_partition(
        &self,
        key: &str,
        workflow: Option<&str>,
        cap: u64,
    ) -> Result<u64, StoreError> {
        let mut total = 0u64;
        let mut start = None;
        loop {
            let out = self
                .state_query(key, workflow)
                .select(aws_sdk_dynamodb::types::Select::Count)
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(|e| unavailable(&e))?;
            total += out.count().max(0) as u64;
            if total > cap {
                return Ok(total);
            }
            match out.last_evaluated_key() {
                Some(k) if !k.is_empty() => start = Some(k.clone()),
                _ => return Ok(total),
            }
        }
    }

    /// [`TaskLists::count`] of `Pending` or `Processing` on from `total` (what their own
    /// partitions hold): their shared entries (`Active`) tell only that a task is active, so
    /// each one's record is read for its state, a hundred at a time. At most
    /// [`ACTIVE_READS_PER_COUNTED`] entries per unit of `cap` are read: past them, the count is
    /// a lower bound (`capped`).
    async fn count_active(
        &self,
        of: InState<'_>,
        cap: u64,
        mut total: u64,
    ) -> Result<Count, StoreError> {
        let (state, workflow) = (of.state, of.workflow);
        let capped = |count| Count {
            count,
            capped: true,
        };
        let budget = cap.saturating_mul(ACTIVE_READS_PER_COUNTED).max(100);
        let mut read = 0u64;
        for shard in 0..self.shards {
            let mut start = None;
            loop {
                let out = self
                    .state_query(&state_shard_key(state, shard), workflow)
                    .projection_expression("pk")
                    .limit(100)
                    .set_exclusive_start_key(start.take())
                    .send()
                    .await
                    .map_err(|e| unavailable(&e))?;
                let ids = out
                    .items()
                    .iter()
                    .map(state_task_id)
                    .collect::<Result<Vec<_>, _>>()?;
                read += ids.len() as u64;
                let found = self.summaries(ids.into_iter()).await?;
                total += found.values().filter(|s| s.process_state == state).count() as u64;
                if total > cap {
                    return Ok(capped(cap));
                }
                match out.last_evaluated_key() {
                    Some(k) if !k.is_empty() => start = Some(k.clone()),
                    _ => break,
                }
                if read >= budget {
                    return Ok(capped(total));
                }
            }
        }
        Ok(Count {
            count: total,
            capped: false,
        })
    }
}

impl DynamoStore {
    /// The summaries of the given tasks' state records (eventually consistent), by id.
    async fn summaries(
        &self,
        ids: impl Iterator<Item = TaskId>,
    ) -> Result<HashMap<TaskId, Summary>, StoreError> {
        use aws_sdk_dynamodb::types::KeysAndAttributes;
        let keys: Vec<Item> = ids
            .map(|id| {
                HashMap::from([
                    ("pk".to_owned(), s(task_pk(&id))),
                    ("sk".to_owned(), s("STATE")),
                ])
            })
            .collect();
        let mut found = HashMap::new();
        // The summary's attributes, by placeholder.
        let names: HashMap<String, String> = SUMMARY_ATTRIBUTES
            .iter()
            .enumerate()
            .map(|(i, a)| (format!("#a{i}"), (*a).to_owned()))
            .collect();
        let projection = names.keys().cloned().collect::<Vec<_>>().join(", ");
        // At most 100 keys a request.
        for chunk in keys.chunks(100) {
            let pending = Some(
                KeysAndAttributes::builder()
                    .set_keys(Some(chunk.to_vec()))
                    .projection_expression(projection.clone())
                    .set_expression_attribute_names(Some(names.clone()))
                    .build()
                    .map_err(|e| StoreError::Unavailable(e.to_string()))?,
            );
            self.batch_summaries(pending, &mut found).await?;
        }
        Ok(found)
    }

    /// One `BatchGetItem` of summaries, its unprocessed keys asked again.
    async fn batch_summaries(
        &self,
        mut pending: Option<aws_sdk_dynamodb::types::KeysAndAttributes>,
        found: &mut HashMap<TaskId, Summary>,
    ) -> Result<(), StoreError> {
        // Unprocessed keys (throttling) are asked again, a few times, then reported.
        for _ in 0..5 {
            let Some(request) = pending.take() else { break };
            let out = self
                .client
                .batch_get_item()
                .request_items(&self.table, request)
                .send()
                .await
                .map_err(|e| unavailable(&e))?;
            for item in out
                .responses()
                .and_then(|r| r.get(&self.table))
                .into_iter()
                .flatten()
            {
                let summary = parse_summary(item)?;
                found.insert(summary.task_id, summary);
            }
            pending = out
                .unprocessed_keys()
                .and_then(|u| u.get(&self.table))
                .filter(|k| !k.keys().is_empty())
                .cloned();
        }
        if pending.is_some() {
            return Err(StoreError::Unavailable(
                "state records left unread (throttled)".into(),
            ));
        }
        Ok(())
    }
}
