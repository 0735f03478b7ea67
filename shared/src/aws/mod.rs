//! The AWS adapters: DynamoDB state store, SQS queues, EventBridge bus, S3 payloads,
//! EventBridge Scheduler (the timers of schedules), the credentials of
//! services (Secrets Manager, SSM) and the Lambda client of Lambda services, all on the real SDK
//! clients. They honour `AWS_ENDPOINT_URL` (an emulator, LocalStack) through `aws-config`.

mod credentials;
mod dynamodb;
mod eventbridge;
mod s3;
mod sdk;
mod sqs;
mod timetable;

pub use credentials::{AwsCredentials, lambda_client};
pub use dynamodb::{
    CALLER_INDEX, DEFAULT_CALLER_SHARDS, DUE_INDEX, DynamoStore, KEY_INDEX_PROJECTION, STATE_INDEX,
    STATE_INDEX_PROJECTION, key_attribute, key_index,
};
#[cfg(any(test, feature = "testkit"))]
pub use dynamodb::{
    index_entry_sizes, item_size, state_index_key, state_record_size, stored_sizes,
};
pub use eventbridge::EventBridgeBus;
pub use s3::{PART_BYTES, S3Payloads, lines_calls, s3_client};
pub use sdk::{Described, describe, sdk_config};
pub use sqs::SqsQueue;
pub use timetable::{SchedulerTimetable, TimetableConfig};
