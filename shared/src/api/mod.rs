//! The HTTP APIs' front door. Framework-free: the Lambda (`functions/submission`) and the local runner
//! (`axum`) both adapt their requests to [`handle`], with the caller's [`Identity`] as the API's
//! authorizer established it. [`handle`] finds the route ([`routes`]), authenticates, applies
//! the caller's rate limit and hands the request on; every error is an [`ApiError`].
//!
//! **The task API** (`ApiDeps::operator_api` off; authenticated by IAM, a JWT, or
//! nothing, as deployed): `POST /workflows/{name}/tasks` starts a task of the newest version of
//! a workflow (idempotently per caller), `GET /tasks` lists the caller's tasks, `GET
//! /tasks/{taskId}` reports one of them, `POST /tasks/{taskId}/cancel` cancels one. A caller sees
//! only its own tasks (another's answers 404) and not sas's internals (lock holder, attempts,
//! raw errors unless the workflow has `publicErrors`). `POST /tasks/{taskId}/callbacks/{token}`
//! completes a callback step (see [`callback`]); its token is its credential.
//!
//! **The operator API** (on; every route under `/operator`, always behind IAM): `GET
//! /tasks?state=&workflow=` lists every caller's tasks by state through the state index;
//! `GET /tasks/{taskId}` shows everything; `POST /tasks/{taskId}/{action}` acts
//! on one ([`OperatorAction`]), recording who and why; `GET /workflows`, `GET|PUT /workflows/{name}`,
//! `GET /workflows/{name}/versions/{version}`, `GET /services` and `GET|PUT /services/{name}`
//! read and publish definitions; `/console` serves the [`console`].

pub mod callback;
pub mod catalog;
pub mod console;
pub mod deps;
pub mod error;
pub mod events;
pub mod graph;
pub mod operator;
pub mod request;
pub mod routes;
pub mod schedules;
pub mod tasks;
pub mod views;

pub use deps::ApiDeps;
pub use error::ApiError;
pub use operator::OperatorAction;
pub use request::{MAX_PAGE, MAX_REASON_CHARS};
pub use routes::OPERATOR_PREFIX;
pub use tasks::{IDEMPOTENCY_KEY, MAX_KEY_LEN, REPLY_QUEUE_URL};

use crate::auth::Identity;
use crate::domain::TaskId;
use crate::domain::rate::Admission;
use crate::ports::RateRequest;
use http::{HeaderMap, Method, Response};
use routes::{Target, Unrouted};
use serde_json::Value;
use tracing::{Instrument, error, info, info_span};

/// Largest accepted request body (a task's input is limited further, to
/// [`crate::domain::task::MAX_INPUT_BYTES`]; a definition and a callback by this).
pub const MAX_BODY_BYTES: usize = crate::domain::task::MAX_INPUT_BYTES + 64 * 1024;

/// The answer to a body over [`MAX_BODY_BYTES`] (also used by adapters that stop reading).
pub fn too_large() -> Response<String> {
    ApiError::PayloadTooLarge {
        limit: MAX_BODY_BYTES,
    }
    .response()
}

/// Routes and answers one request of `identity`.
pub async fn handle(
    deps: &ApiDeps,
    identity: &Identity,
    method: &Method,
    path_and_query: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Response<String> {
    let (path, query) = path_and_query
        .split_once('?')
        .unwrap_or((path_and_query, ""));
    let path = path.trim_end_matches('/');
    let op = deps.operator_api;
    let no_route = || {
        ApiError::RouteNotFound {
            method: method.to_string(),
            path: path.to_owned(),
        }
        .response()
    };
    let routed = if op {
        match path.strip_prefix(OPERATOR_PREFIX) {
            Some(rest) if rest.is_empty() || rest.starts_with('/') => rest,
            _ => return no_route(),
        }
    } else {
        path
    };
    let segments: Vec<&str> = routed.split('/').skip(1).collect();
    let route = match Target::parse(&segments, method, op) {
        Ok(Target::Api(route)) => route,
        // The callback route is the only one a credential in the path authenticates.
        Ok(Target::Callback { id, token }) => {
            let span = info_span!("callback", task_id = %id);
            return callback::callback(deps, id, token, body)
                .instrument(span)
                .await
                .unwrap_or_else(ApiError::response);
        }
        Ok(Target::Console { rest }) => {
            return match identity {
                Identity::Caller(caller) => {
                    let span = info_span!("console", caller = %caller, path = %routed);
                    console::page(deps, caller, method, rest, query, headers, body)
                        .instrument(span)
                        .await
                }
                Identity::Unauthenticated(why) => ApiError::Unauthenticated(format!(
                    "the console is part of the operator API: sign the request (sasctl console does): {why}"
                ))
                .response(),
            };
        }
        Err(Unrouted::NotFound) => return no_route(),
        Err(Unrouted::MethodNotAllowed(allow)) => {
            return ApiError::MethodNotAllowed {
                method: method.to_string(),
                path: path.to_owned(),
                allow,
            }
            .response();
        }
    };
    let caller = match identity {
        Identity::Caller(c) => c,
        Identity::Unauthenticated(why) => {
            info!(why = %why, "unauthenticated request");
            // The reason names what was wrong (a region, a date, a signature, an unknown key),
            // never a secret: what a caller needs to mend its request.
            return ApiError::Unauthenticated(format!(
                "this API needs authentication, a SigV4 signature or a bearer token as deployed: {why}"
            ))
            .response();
        }
    };
    // The caller is neither a secret nor personal data beyond a principal's name: operators
    // need it in every log line of the request.
    let span = info_span!("api", caller = %caller, operator = op);
    if !op && let Some(limit) = &deps.rate_limit {
        // A caller allowed more than one item takes is spread over several (no hot key):
        // each request is admitted by one, at random, against its share.
        let shard = rand::random_range(0..limit.shards());
        let key = crate::domain::rate::shard_key(&caller.digest(), shard);
        match deps
            .ports
            .store
            .admit(RateRequest {
                key: &key,
                limit: &limit.per_shard(),
                now: deps.ports.clock.now(),
            })
            .instrument(span.clone())
            .await
        {
            Ok(Admission::Admitted) => {}
            Ok(Admission::Limited { retry_after }) => {
                let seconds = (retry_after.num_milliseconds().max(1) + 999) / 1000;
                let _entered = span.enter();
                info!(retry_after_s = seconds, "caller over its rate limit");
                return ApiError::RateLimited {
                    per_second: limit.per_second,
                    burst: limit.burst,
                    retry_after_s: seconds,
                }
                .response();
            }
            // The limit protects the service; an unreadable limit item must not take the API
            // down with it (the request's own writes fail anyway if the table is down).
            Err(e) => error!(error = %e, "rate limit unavailable; request admitted"),
        }
    }
    let started = crate::xray::now_seconds();
    let resp = routes::answer(deps, caller, route, query, headers, body)
        .instrument(span)
        .await
        .unwrap_or_else(ApiError::response);
    // Traced: the request's subsegment names its task (from the path, or a new task's answer).
    let task = match segments.as_slice() {
        _ if !crate::xray::enabled() => None,
        ["tasks", id, ..] => id.parse::<TaskId>().ok().map(|id| id.to_string()),
        ["workflows", _, "tasks"] => serde_json::from_str::<Value>(resp.body())
            .ok()
            .and_then(|v| v["taskId"].as_str().map(str::to_owned)),
        _ => None,
    };
    if let Some(id) = task {
        crate::xray::record(
            if op { "operator" } else { "api" },
            started,
            &[("task_id", &id)],
        );
    }
    resp
}
