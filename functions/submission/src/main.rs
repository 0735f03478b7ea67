//! The submission Lambda (API Gateway HTTP API): `POST /workflows/{name}/tasks`,
//! `GET /tasks/{taskId}`, and with `OPERATOR_API=true` the operator API (`GET /tasks?state=`,
//! `POST /tasks/{taskId}/retry|compensate|cancel`, reading and publishing workflows and
//! services).
//! Reads its configuration, builds its clients once, hands requests to
//! `sas::handlers::submission::handle`.

use lambda_http::{Body, Error, Request, Response, run, service_fn};
use sas::config;
use sas::handlers::submission::{self, SubmissionDeps};
use std::sync::Arc;

#[tokio::main]
async fn main() -> Result<(), Error> {
    sas::telemetry::init();
    let sdk = sas::aws::sdk_config().await;
    let store = Arc::new(config::dynamo_store(&sdk)?);
    let clock: Arc<dyn sas::ports::Clock> = Arc::new(sas::ports::SystemClock);
    let deps = SubmissionDeps {
        definitions: Arc::new(config::definitions(store.clone(), clock.clone())?),
        store,
        queue: Arc::new(config::sqs_queue(&sdk)),
        events: Arc::new(config::event_bus(&sdk)?),
        clock,
        work_queue_url: config::required("WORK_QUEUE_URL")?,
        // The template deploys this binary twice: the public API, and the operator API
        // (OPERATOR_API=true) behind IAM authorization.
        operator_api: config::parsed("OPERATOR_API", false)?,
    };
    let deps = &deps;
    run(service_fn(move |req: Request| async move {
        let resp = submission::handle(
            deps,
            req.method(),
            req.uri()
                .path_and_query()
                .map_or(req.uri().path(), |p| p.as_str()),
            req.headers(),
            req.body().as_ref(),
        )
        .await;
        Ok::<Response<Body>, Error>(resp.map(Body::from))
    }))
    .await
}
