//! The agent Lambda (SQS: the agent queue, partial batch responses). One function serves every
//! service: each step request names its service, whose target (HTTP, or the in-process
//! simulated service for demo stacks and smoke tests) comes from the catalog in the table
//! (`TABLE_NAME`, kept `CATALOG_CACHE_SECONDS`). Each service's circuit breaker is shared by all
//! the agent's instances through the table (`BREAKER_*`). HTTP services' credentials are read
//! from Secrets Manager or SSM and kept `CREDENTIALS_CACHE_SECONDS` (default 300); Lambda
//! services are invoked with the function's own role.

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use lambda_runtime::{Error, LambdaEvent, run, service_fn};
use sas::config;
use sas::handlers::agent::{self, AgentDeps};
use sas::ports::{Clock, RemoteService, SystemClock};
use sas::remote::{
    CallbackCompleter, CallbackSink, Connectors, Faults, HttpCallbackSink, Remotes,
    SimulatedService,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[tokio::main]
async fn main() -> Result<(), Error> {
    sas::telemetry::init();
    let sdk = sas::aws::sdk_config().await;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let store = Arc::new(config::dynamo_store(&sdk)?);
    let definitions = Arc::new(config::definitions(store.clone(), clock.clone())?);
    // A simulated service keeps its idempotency keys in this execution environment only: it is
    // for demo stacks and smoke tests, never for real work.
    let simulated: Arc<Mutex<HashMap<String, Arc<SimulatedService>>>> = Arc::default();
    let credentials_ttl = config::parsed("CREDENTIALS_CACHE_SECONDS", 300u32)?;
    let connectors = Connectors::new(
        Arc::new(sas::aws::AwsCredentials::from_config(&sdk)),
        chrono::Duration::seconds(i64::from(credentials_ttl)),
        clock.clone(),
        Some(sas::aws::lambda_client(&sdk)),
    )?;
    let callbacks: Arc<dyn CallbackSink> = Arc::new(HttpCallbackSink(connectors.http.clone()));
    let factory = {
        let clock = clock.clone();
        Arc::new(move |name: &str| -> Arc<dyn RemoteService> {
            let made = Arc::new(SimulatedService::new(
                name,
                Faults::default(),
                clock.clone(),
            ));
            let service: Arc<dyn RemoteService> = match simulated.lock() {
                Ok(mut m) => m.entry(name.to_owned()).or_insert(made).clone(),
                Err(_) => made,
            };
            // A simulated callback step calls back through the stack's own API.
            Arc::new(CallbackCompleter::new(
                service,
                callbacks.clone(),
                Duration::from_millis(200),
                clock.clone(),
            ))
        })
    };
    let tasks = config::task_ports(&sdk)?;
    let deps = AgentDeps {
        metrics: sas::metrics::Metrics::from_env(),
        name: config::optional("AGENT_NAME").unwrap_or_else(|| "agent".into()),
        queue: Arc::new(config::sqs_queue(&sdk)),
        remotes: Arc::new(
            Remotes::new(
                definitions,
                store,
                config::breaker()?,
                clock.clone(),
                factory,
                connectors,
            )
            .with_share(config::service_share()?)
            .with_alerts(Arc::new(config::event_bus(&sdk)?))
            .with_metrics(sas::metrics::Metrics::from_env()),
        ),
        clock,
        backoff: config::backoff()?,
        call_timeout: Duration::from_millis(config::parsed("CALL_TIMEOUT_MS", 10_000u64)?),
        dead_letter_url: config::optional("DEAD_LETTER_QUEUE_URL"),
        payloads: Arc::new(sas::payloads::Cached::new(Arc::new(config::payloads(
            &sdk,
        )?))),
        // A sub-workflow step's call starts its child task (as a submission does), and claims
        // its first step there.
        dispatch: config::lent_outlets(&tasks)?,
        tasks: Some(Arc::new(tasks)),
    };
    let deps = &deps;
    run(service_fn(move |event: LambdaEvent<SqsEvent>| async move {
        Ok::<SqsBatchResponse, Error>(agent::handle(deps, event.payload).await)
    }))
    .await
}
