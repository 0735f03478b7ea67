//! The API Lambda (API Gateway HTTP API), deployed twice: the task API
//! (`POST /workflows/{name}/tasks`, `GET /tasks`, `GET /tasks/{taskId}`,
//! `POST /tasks/{taskId}/cancel`, callbacks) behind the authorizer `API_AUTH` names (IAM, JWT or
//! None), and with `OPERATOR_API=true` the operator API under `/operator` (always IAM).
//! Reads its configuration, builds its clients once, takes the caller from the request
//! context the authorizer filled, and hands requests to `sas::api::handle`.

use lambda_http::request::RequestContext;
use lambda_http::{Body, Error, Request, RequestExt, Response, run, service_fn};
use sas::api::{self, ApiDeps};
use sas::auth::{self, AuthMode, Identity};
use sas::config;

#[tokio::main]
async fn main() -> Result<(), Error> {
    sas::telemetry::init();
    let sdk = sas::aws::sdk_config().await;
    let operator_api = config::parsed("OPERATOR_API", false)?;
    // The operator API is always behind IAM, whatever the task API uses.
    let mode: AuthMode = if operator_api {
        AuthMode::Iam
    } else {
        config::parsed("API_AUTH", AuthMode::Iam)?
    };
    let ports = config::task_ports(&sdk)?;
    let deps = ApiDeps {
        // The task API claims a new task's first step itself; the operator API starts none.
        dispatch: if operator_api {
            None
        } else {
            config::dispatch(&ports)?
        },
        ports,
        operator_api,
        reply_queues: config::reply_queues()?,
        rate_limit: config::rate_limit()?,
        service_share: config::service_share()?,
        // Only the operator API publishes schedules.
        timetable: if operator_api {
            std::sync::Arc::new(config::timetable(&sdk)?)
        } else {
            std::sync::Arc::new(sas::ports::NoTimetable)
        },
    };
    if mode == AuthMode::None {
        tracing::warn!("the task API runs without authentication (API_AUTH=None)");
    }
    let deps = &deps;
    run(service_fn(move |req: Request| async move {
        let identity = match req.request_context_ref() {
            Some(RequestContext::ApiGatewayV2(ctx)) => auth::from_api_gateway(mode, ctx),
            _ if mode == AuthMode::None => Identity::anonymous(),
            _ => Identity::Unauthenticated("not an HTTP API request".into()),
        };
        let resp = api::handle(
            deps,
            &identity,
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
