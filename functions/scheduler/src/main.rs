//! The scheduler Lambda (SQS: the work queue and the reply queue, partial batch responses).

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use lambda_runtime::{Error, LambdaEvent, run, service_fn};
use sas::config;
use sas::handlers::scheduler::{self, SchedulerDeps};
use std::sync::Arc;

#[tokio::main]
async fn main() -> Result<(), Error> {
    sas::telemetry::init();
    let sdk = sas::aws::sdk_config().await;
    let instance = std::env::var("AWS_LAMBDA_LOG_STREAM_NAME").unwrap_or_else(|_| "local".into());
    let store = Arc::new(config::dynamo_store(&sdk)?);
    let clock: Arc<dyn sas::ports::Clock> = Arc::new(sas::ports::SystemClock);
    let deps = SchedulerDeps {
        metrics: sas::metrics::Metrics::from_env(),
        definitions: Arc::new(config::definitions(store.clone(), clock.clone())?),
        store,
        queue: Arc::new(config::sqs_queue(&sdk)),
        events: Arc::new(config::event_bus(&sdk)?),
        clock,
        agent_queue_url: config::required("AGENT_QUEUE_URL")?,
        reply_queue_url: config::required("REPLY_QUEUE_URL")?,
        work_queue_url: config::required("WORK_QUEUE_URL")?,
        // `DEADLINE_TIMERS=false`: no timers; the sweep alone finds deadlines.
        timer_queue_url: config::parsed("DEADLINE_TIMERS", true)?
            .then(|| config::optional("TIMER_QUEUE_URL"))
            .flatten(),
        dead_letter_url: config::optional("DEAD_LETTER_QUEUE_URL"),
        // One id per execution environment: `LockedBy` tells which one holds a claim.
        instance_id: format!("{instance}/{}", uuid::Uuid::new_v4()),
        callback_base_url: config::optional("CALLBACK_BASE_URL"),
    };
    let deps = &deps;
    run(service_fn(move |event: LambdaEvent<SqsEvent>| async move {
        Ok::<SqsBatchResponse, Error>(scheduler::handle(deps, event.payload).await)
    }))
    .await
}
