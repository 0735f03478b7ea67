//! [`DueIndex`] on DynamoDB: the sparse `due-index`, by shard.

use super::item::*;
use super::records::*;
use super::store::*;
use crate::ports::StoreError;
use crate::ports::{DueEntry, DueIndex, DueQuery};
use async_trait::async_trait;
use std::collections::HashMap;

#[async_trait]
impl DueIndex for DynamoStore {
    async fn due(&self, q: DueQuery<'_>) -> Result<Vec<DueEntry>, StoreError> {
        let shard = q.shard;
        // Where the previous page ended: the index's keys and the table's, as DynamoDB's own
        // `LastEvaluatedKey` of that entry would be (same shard, so never a foreign key).
        let start = q.after.map(|a| {
            HashMap::from([
                ("DueShard".to_owned(), s(shard_key(shard))),
                ("DueAt".to_owned(), ms(a.due_at)),
                ("pk".to_owned(), s(task_pk(&a.task_id))),
                ("sk".to_owned(), s("STATE")),
            ])
        });
        let out = self
            .client
            .query()
            .table_name(&self.table)
            .index_name(DUE_INDEX)
            .key_condition_expression("DueShard = :shard AND DueAt <= :now")
            .expression_attribute_values(":shard", s(shard_key(shard)))
            .expression_attribute_values(":now", ms(q.now))
            .set_exclusive_start_key(start)
            .limit(q.limit.clamp(1, 1000) as i32)
            .send()
            .await
            .map_err(|e| unavailable(&e))?;
        out.items()
            .iter()
            .map(|item| {
                Ok(DueEntry {
                    task_id: get_s(item, "pk")?
                        .strip_prefix("TASK#")
                        .ok_or_else(|| corrupt("due-index item without a task key"))?
                        .parse()
                        .map_err(|e: crate::domain::ValidationError| corrupt(e.to_string()))?,
                    due_at: time(get_n(item, "DueAt")?)?,
                })
            })
            .collect()
    }
    fn due_shards(&self) -> u32 {
        self.shards
    }
}
