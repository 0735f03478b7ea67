//! The AWS adapters: DynamoDB state store, SQS queues, EventBridge bus, the credentials of
//! services (Secrets Manager, SSM) and the Lambda client of Lambda services, all on the real SDK
//! clients. They honour `AWS_ENDPOINT_URL` (an emulator, LocalStack) through `aws-config`.

mod credentials;
mod dynamodb;
mod eventbridge;
mod sqs;

pub use credentials::{AwsCredentials, lambda_client};
pub use dynamodb::{
    CALLER_INDEX, DEFAULT_CALLER_SHARDS, DUE_INDEX, DynamoStore, STATE_INDEX,
    STATE_INDEX_PROJECTION,
};
#[cfg(any(test, feature = "testkit"))]
pub use dynamodb::{index_entry_sizes, item_size, state_record_size, stored_sizes};
pub use eventbridge::EventBridgeBus;
pub use sqs::SqsQueue;

/// Loads the SDK configuration from the environment (region, credentials, `AWS_ENDPOINT_URL`).
pub async fn sdk_config() -> aws_config::SdkConfig {
    aws_config::defaults(aws_config::BehaviorVersion::latest())
        .load()
        .await
}

/// Renders an SDK error with its service error's code and message (the `Display` of an
/// `SdkError` says only "service error").
pub fn describe<E, R>(e: &aws_sdk_dynamodb::error::SdkError<E, R>) -> String
where
    E: std::error::Error + 'static,
    R: std::fmt::Debug,
{
    match e {
        aws_sdk_dynamodb::error::SdkError::ServiceError(s) => format!("{}", s.err()),
        other => format!("{}", aws_sdk_dynamodb::error::DisplayErrorContext(other)),
    }
}
