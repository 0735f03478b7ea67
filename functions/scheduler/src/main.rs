//! The scheduler Lambda (SQS: the work queue and the reply queue, partial batch responses).

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use lambda_runtime::{Error, LambdaEvent, run, service_fn};
use sas::config;
use sas::handlers::scheduler::{self, SchedulerDeps};

#[tokio::main]
async fn main() -> Result<(), Error> {
    sas::telemetry::init();
    let sdk = sas::aws::sdk_config().await;
    let deps = SchedulerDeps {
        ports: config::task_ports(&sdk)?,
        agent_queue_url: config::required("AGENT_QUEUE_URL")?,
        urgent_agent_queue_url: config::optional("URGENT_AGENT_QUEUE_URL"),
        reply_queue_url: config::required("REPLY_QUEUE_URL")?,
        // `DEADLINE_TIMERS=false`: no timers; the sweep alone finds deadlines.
        timer_queue_url: config::parsed("DEADLINE_TIMERS", true)?
            .then(|| config::optional("TIMER_QUEUE_URL"))
            .flatten(),
        dead_letter_url: config::optional("DEAD_LETTER_QUEUE_URL"),
        // One id per execution environment: `LockedBy` tells which one holds a claim.
        instance_id: config::instance_id(),
        callback_base_url: config::optional("CALLBACK_BASE_URL"),
    };
    let deps = &deps;
    run(service_fn(move |event: LambdaEvent<SqsEvent>| async move {
        Ok::<SqsBatchResponse, Error>(scheduler::handle(deps, event.payload).await)
    }))
    .await
}
