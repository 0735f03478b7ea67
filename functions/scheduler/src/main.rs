//! The scheduler Lambda (SQS: the work queue and the reply queue, partial batch responses).

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use lambda_runtime::{Error, LambdaEvent, run, service_fn};
use sas::config;
use sas::handlers::scheduler;

#[tokio::main]
async fn main() -> Result<(), Error> {
    sas::telemetry::init();
    let sdk = sas::aws::sdk_config().await;
    let deps = config::scheduler_deps(config::task_ports(&sdk)?)?;
    let deps = &deps;
    run(service_fn(move |event: LambdaEvent<SqsEvent>| async move {
        Ok::<SqsBatchResponse, Error>(scheduler::handle(deps, event.payload).await)
    }))
    .await
}
