//! The supervisor Lambda: an EventBridge schedule (one sweep of the due index per invocation)
//! and the deadline-timer queue (SQS, partial batch responses). A sweep with failed recoveries
//! returns an error, so the Errors metric and its alarm see it; the records stay due and the
//! next sweep retries them.

use lambda_runtime::{Error, LambdaEvent, run, service_fn};
use sas::config;
use sas::handlers::supervisor::{self, Invocation, SupervisorDeps};

#[tokio::main]
async fn main() -> Result<(), Error> {
    sas::telemetry::init();
    let sdk = sas::aws::sdk_config().await;
    let lease_ttl = chrono::Duration::seconds(config::parsed("LEASE_SECONDS", 150i64)?);
    let ports = config::task_ports(&sdk)?;
    let deps = SupervisorDeps {
        // The end of a wait claims its next step here, as the scheduler would.
        dispatch: config::lent_outlets(&ports)?,
        ports,
        sweep: config::sweep_settings(lease_ttl)?,
        timer_queue_url: config::optional("TIMER_QUEUE_URL"),
        dead_letter_url: config::optional("DEAD_LETTER_QUEUE_URL"),
        // One id per execution environment: the owner of the shard leases it takes.
        instance_id: config::instance_id(),
        lease_ttl,
    };
    let deps = &deps;
    run(service_fn(
        move |event: LambdaEvent<serde_json::Value>| async move {
            let out = supervisor::invoke(deps, event.payload).await?;
            if let Invocation::Sweep(report) = &out
                && report.errors > 0
            {
                return Err(Error::from(format!(
                    "{} recoveries failed: {report:?}",
                    report.errors
                )));
            }
            Ok::<Invocation, Error>(out)
        },
    ))
    .await
}
