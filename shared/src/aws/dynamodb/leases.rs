//! [`Leases`] on DynamoDB: items `LEASE#<name>`.

use super::item::*;
use super::store::*;
use crate::ports::StoreError;
use crate::ports::{LeaseClaim, Leases};
use async_trait::async_trait;
use aws_sdk_dynamodb::operation::put_item::builders::PutItemFluentBuilder;
use chrono::Utc;

#[async_trait]
impl Leases for DynamoStore {
    async fn acquire_lease(&self, claim: LeaseClaim<'_>) -> Result<bool, StoreError> {
        let LeaseClaim {
            name, owner, now, ..
        } = claim;
        let until = claim.until();
        // Condition: no lease, an expired one, or our own - keeps "at most one holder at a time".
        let req = self
            .lease_put(name, owner)
            .item("LeaseUntil", ms(until))
            // The table's TTL removes leases nobody renews.
            .item("ExpiresAt", n(until.timestamp() + KEY_TTL_SECONDS))
            .condition_expression("attribute_not_exists(pk) OR LeaseUntil <= :now OR #owner = :me")
            .expression_attribute_values(":now", ms(now));
        Self::put_if(req).await
    }
    async fn release_lease(&self, name: &str, owner: &str) -> Result<(), StoreError> {
        // Condition: still ours - a lease another supervisor took over is left alone.
        let req = self
            .lease_put(name, owner)
            .item("LeaseUntil", n(0))
            .item("ExpiresAt", n(Utc::now().timestamp() + KEY_TTL_SECONDS))
            .condition_expression("#owner = :me");
        Self::put_if(req).await.map(|_| ())
    }
}

impl DynamoStore {
    /// A put of the lease `name` held by `owner`, with `#owner` and `:me` (the owner) for its
    /// condition; the caller adds the lease's times and the condition itself.
    fn lease_put(&self, name: &str, owner: &str) -> PutItemFluentBuilder {
        self.client
            .put_item()
            .table_name(&self.table)
            .item("pk", s(format!("LEASE#{name}")))
            .item("sk", s("LEASE"))
            .item("Owner", s(owner))
            .expression_attribute_names("#owner", "Owner")
            .expression_attribute_values(":me", s(owner))
    }
}
