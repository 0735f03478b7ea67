//! The scheduler Lambda (SQS: the work queue and the reply queue, partial batch responses).

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use lambda_runtime::{Error, LambdaEvent, run, service_fn};
use sas::handlers::scheduler::{self, SchedulerDeps};
use sas::{Workflow, config};
use std::sync::Arc;

#[tokio::main]
async fn main() -> Result<(), Error> {
    sas::telemetry::init();
    let sdk = sas::aws::sdk_config().await;
    let instance = std::env::var("AWS_LAMBDA_LOG_STREAM_NAME").unwrap_or_else(|_| "local".into());
    let deps = SchedulerDeps {
        store: Arc::new(config::dynamo_store(&sdk)?),
        queue: Arc::new(config::sqs_queue(&sdk)),
        events: Arc::new(config::event_bus(&sdk)?),
        clock: Arc::new(sas::ports::SystemClock),
        workflow: Arc::new(Workflow::ecommerce()),
        policy: config::policy()?,
        agent_queues: config::agent_queues()?,
        reply_queue_url: config::required("REPLY_QUEUE_URL")?,
        work_queue_url: config::required("WORK_QUEUE_URL")?,
        timer_queue_url: config::optional("TIMER_QUEUE_URL"),
        dead_letter_url: config::optional("DEAD_LETTER_QUEUE_URL"),
        // One id per execution environment: `LockedBy` tells which one holds a claim.
        instance_id: format!("{instance}/{}", uuid::Uuid::new_v4()),
    };
    let deps = &deps;
    run(service_fn(move |event: LambdaEvent<SqsEvent>| async move {
        Ok::<SqsBatchResponse, Error>(scheduler::handle(deps, event.payload).await)
    }))
    .await
}
