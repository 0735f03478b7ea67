//! The submission Lambda (API Gateway HTTP API): `POST /orders`, `GET /orders/{orderId}`
//! and the operator API (`GET /orders?state=`, `POST /orders/{orderId}/retry|compensate|cancel`).
//! Reads its configuration, builds its clients once, hands requests to
//! `sas::handlers::submission::handle`.

use lambda_http::{Body, Error, Request, Response, run, service_fn};
use sas::handlers::submission::{self, SubmissionDeps};
use sas::{Workflow, config};
use std::sync::Arc;

#[tokio::main]
async fn main() -> Result<(), Error> {
    sas::telemetry::init();
    let sdk = sas::aws::sdk_config().await;
    let deps = SubmissionDeps {
        store: Arc::new(config::dynamo_store(&sdk)?),
        queue: Arc::new(config::sqs_queue(&sdk)),
        events: Arc::new(config::event_bus(&sdk)?),
        clock: Arc::new(sas::ports::SystemClock),
        workflow: Arc::new(Workflow::ecommerce()),
        policy: config::policy()?,
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
