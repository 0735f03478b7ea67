//! [`Leases`] on DynamoDB: items `LEASE#<name>`.

use super::item::*;
use super::store::*;
use crate::ports::Leases;
use crate::ports::StoreError;
use async_trait::async_trait;
use chrono::{DateTime, Utc};

#[async_trait]
impl Leases for DynamoStore {
    async fn acquire_lease(
        &self,
        name: &str,
        owner: &str,
        now: DateTime<Utc>,
        ttl: chrono::Duration,
    ) -> Result<bool, StoreError> {
        let until = now + ttl;
        // Condition: no lease, an expired one, or our own - keeps "at most one holder at a time".
        let req = self
            .client
            .put_item()
            .table_name(&self.table)
            .item("pk", s(format!("LEASE#{name}")))
            .item("sk", s("LEASE"))
            .item("Owner", s(owner))
            .item("LeaseUntil", ms(until))
            // The table's TTL removes leases nobody renews.
            .item("ExpiresAt", n(until.timestamp() + KEY_TTL_SECONDS))
            .condition_expression("attribute_not_exists(pk) OR LeaseUntil <= :now OR #owner = :me")
            .expression_attribute_names("#owner", "Owner")
            .expression_attribute_values(":now", ms(now))
            .expression_attribute_values(":me", s(owner));
        Self::put_if(req).await
    }
    async fn release_lease(&self, name: &str, owner: &str) -> Result<(), StoreError> {
        // Condition: still ours - a lease another supervisor took over is left alone.
        let req = self
            .client
            .put_item()
            .table_name(&self.table)
            .item("pk", s(format!("LEASE#{name}")))
            .item("sk", s("LEASE"))
            .item("Owner", s(owner))
            .item("LeaseUntil", n(0))
            .item("ExpiresAt", n(Utc::now().timestamp() + KEY_TTL_SECONDS))
            .condition_expression("#owner = :me")
            .expression_attribute_names("#owner", "Owner")
            .expression_attribute_values(":me", s(owner));
        Self::put_if(req).await.map(|_| ())
    }
}
