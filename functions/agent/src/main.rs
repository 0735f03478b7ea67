//! An agent Lambda (SQS: one agent's request queue, partial batch responses). `AGENT_NAME`
//! names it; `REMOTE_BASE_URL` is its remote service, or `SIMULATED_REMOTE=true` uses the
//! in-process simulated service (demo stacks and smoke tests). Its circuit breaker is shared
//! by all its instances through the table (`TABLE_NAME`, `BREAKER_*`).

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use lambda_runtime::{Error, LambdaEvent, run, service_fn};
use sas::config;
use sas::handlers::agent::{self, AgentDeps};
use sas::ports::{Clock, RemoteService, SystemClock};
use sas::remote::{Faults, HttpRemote, SharedBreaker, SimulatedService};
use std::sync::Arc;
use std::time::Duration;

#[tokio::main]
async fn main() -> Result<(), Error> {
    sas::telemetry::init();
    let sdk = sas::aws::sdk_config().await;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let name = config::required("AGENT_NAME")?;
    let remote: Arc<dyn RemoteService> = if config::parsed("SIMULATED_REMOTE", false)? {
        Arc::new(SimulatedService::new(
            &name,
            Faults::default(),
            clock.clone(),
        ))
    } else {
        let base = url::Url::parse(&config::required("REMOTE_BASE_URL")?)?;
        Arc::new(HttpRemote::new(reqwest::Client::new(), base))
    };
    // The breaker is shared by every instance of this agent: it lives in the table.
    let remote = SharedBreaker::new(
        name.clone(),
        remote,
        Arc::new(config::dynamo_store(&sdk)?),
        config::breaker()?,
        clock.clone(),
    );
    let deps = AgentDeps {
        name,
        queue: Arc::new(config::sqs_queue(&sdk)),
        remote: Arc::new(remote),
        clock,
        backoff: config::backoff()?,
        call_timeout: Duration::from_millis(config::parsed("CALL_TIMEOUT_MS", 10_000u64)?),
        dead_letter_url: config::optional("DEAD_LETTER_QUEUE_URL"),
    };
    let deps = &deps;
    run(service_fn(move |event: LambdaEvent<SqsEvent>| async move {
        Ok::<SqsBatchResponse, Error>(agent::handle(deps, event.payload).await)
    }))
    .await
}
