//! The supervisor Lambda (EventBridge schedule): one sweep of the due index per invocation.
//! An invocation with failed recoveries returns an error, so the Errors metric and its alarm
//! see it; the records stay due and the next sweep retries them.

use aws_lambda_events::event::eventbridge::EventBridgeEvent;
use lambda_runtime::{Error, LambdaEvent, run, service_fn};
use sas::config;
use sas::handlers::supervisor::{self, SupervisorDeps, SweepReport};
use std::sync::Arc;

#[tokio::main]
async fn main() -> Result<(), Error> {
    sas::telemetry::init();
    let sdk = sas::aws::sdk_config().await;
    let deps = SupervisorDeps {
        store: Arc::new(config::dynamo_store(&sdk)?),
        queue: Arc::new(config::sqs_queue(&sdk)),
        events: Arc::new(config::event_bus(&sdk)?),
        clock: Arc::new(sas::ports::SystemClock),
        policy: config::policy()?,
        work_queue_url: config::required("WORK_QUEUE_URL")?,
        batch_limit: config::parsed("SWEEP_BATCH_LIMIT", 100usize)?,
    };
    let deps = &deps;
    run(service_fn(
        move |event: LambdaEvent<EventBridgeEvent<serde_json::Value>>| async move {
            let report: SweepReport = supervisor::handle(deps, event.payload).await?;
            if report.errors > 0 {
                return Err(Error::from(format!(
                    "{} recoveries failed: {report:?}",
                    report.errors
                )));
            }
            Ok::<SweepReport, Error>(report)
        },
    ))
    .await
}
