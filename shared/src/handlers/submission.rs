//! Submission: the HTTP API. `POST /orders` accepts an order (idempotently), `GET
//! /orders/{orderId}` reports its state and history. The operator's routes (served only when
//! [`SubmissionDeps::operator_api`] is on; the template deploys them as a separate function
//! behind IAM authorization): `GET /orders?state=&limit=&cursor=` lists orders by state through
//! the state index, and `POST /orders/{orderId}/retry|compensate|cancel` act on one.
//! Framework-free: the Lambda (`lambda_http`) and the local runner (`axum`) both adapt their
//! requests to [`handle`].

use super::{Outlets, perform_no_step, publish_status, write};
use crate::domain::transition::{self, Rejection, Transition};
use crate::domain::{
    Order, OrderId, OrderRequest, Policy, ProcessState, StateRecord, Status, Workflow,
};
use crate::messages::{SchedulerMessage, WorkMessage};
use crate::ports::Cursor;
use crate::ports::{Clock, CreateOutcome, EventBus, IdempotencyRecord, Queue, StateStore};
use http::{HeaderMap, Method, Response, StatusCode};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use std::sync::Arc;
use std::time::Duration;
use tracing::{Instrument, error, info, info_span};

/// Largest accepted request body.
pub const MAX_BODY_BYTES: usize = 256 * 1024;
/// The idempotency header.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// Longest accepted idempotency key.
pub const MAX_KEY_LEN: usize = 255;

#[derive(Clone)]
pub struct SubmissionDeps {
    pub store: Arc<dyn StateStore>,
    pub queue: Arc<dyn Queue>,
    pub events: Arc<dyn EventBus>,
    pub clock: Arc<dyn Clock>,
    pub workflow: Arc<Workflow>,
    pub policy: Policy,
    pub work_queue_url: String,
    /// Serve the operator's routes (list, retry, compensate, cancel). Off on the public API.
    pub operator_api: bool,
}

/// The most orders one list page returns.
pub const MAX_PAGE: usize = 100;
/// The longest reason an operator may give for a cancel.
pub const MAX_REASON_CHARS: usize = 500;

/// An error answer: `{"error": {"code": ..., "message": ...}}`.
fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response<String> {
    respond(
        status,
        &json!({"error": {"code": code, "message": message.into()}}),
    )
}

fn respond(status: StatusCode, body: &Value) -> Response<String> {
    let mut r = Response::new(body.to_string());
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

/// Routes and answers one request.
pub async fn handle(
    deps: &SubmissionDeps,
    method: &Method,
    path_and_query: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Response<String> {
    let (path, query) = path_and_query
        .split_once('?')
        .unwrap_or((path_and_query, ""));
    let path = path.trim_end_matches('/');
    let segments: Vec<&str> = path.split('/').skip(1).collect();
    match (segments.as_slice(), method) {
        (["orders"], &Method::GET) if deps.operator_api => {
            let span = info_span!("list_orders");
            list(deps, query).instrument(span).await
        }
        (["orders", id, action], &Method::POST)
            if deps.operator_api && ["retry", "compensate", "cancel"].contains(action) =>
        {
            let span = info_span!("operator", order_id = %id, action = %action, attempt = tracing::field::Empty);
            operate(deps, id, action, body).instrument(span).await
        }
        (["orders"], &Method::POST) => {
            let span = info_span!("submit", order_id = tracing::field::Empty);
            submit(deps, headers, body).instrument(span).await
        }
        (["orders", id], &Method::GET) => {
            let span = info_span!("get_order", order_id = %id);
            get_order(deps, id).instrument(span).await
        }
        (["orders", _, action], _)
            if deps.operator_api && ["retry", "compensate", "cancel"].contains(action) =>
        {
            let mut r = error(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                format!("{method} is not allowed on {path}"),
            );
            r.headers_mut()
                .insert(http::header::ALLOW, http::HeaderValue::from_static("POST"));
            r
        }
        (["orders"], _) | (["orders", _], _) => {
            let mut r = error(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                format!("{method} is not allowed on {path}"),
            );
            let allow = match (segments.len(), deps.operator_api) {
                (1, true) => "GET, POST",
                (1, false) => "POST",
                _ => "GET",
            };
            r.headers_mut()
                .insert(http::header::ALLOW, http::HeaderValue::from_static(allow));
            r
        }
        _ => error(
            StatusCode::NOT_FOUND,
            "route_not_found",
            format!("no route for {method} {path}"),
        ),
    }
}

/// A malformed `Idempotency-Key` header.
struct InvalidKey;

fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, InvalidKey> {
    let Some(v) = headers.get(IDEMPOTENCY_KEY) else {
        return Ok(None);
    };
    let s = v.to_str().map_err(|_| InvalidKey)?;
    if s.is_empty() || s.len() > MAX_KEY_LEN || !s.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(InvalidKey);
    }
    Ok(Some(s.to_owned()))
}

/// The answer to a body over [`MAX_BODY_BYTES`] (also used by adapters that stop reading).
pub fn too_large() -> Response<String> {
    error(
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
        format!("the body is over {MAX_BODY_BYTES} bytes, the most accepted"),
    )
}

async fn submit(deps: &SubmissionDeps, headers: &HeaderMap, body: &[u8]) -> Response<String> {
    if body.len() > MAX_BODY_BYTES {
        return too_large();
    }
    if let Some(ct) = headers.get(http::header::CONTENT_TYPE) {
        let ct = ct.to_str().unwrap_or_default();
        // The media type, without parameters; media types are case-insensitive (RFC 9110).
        let media = ct.split(';').next().unwrap_or_default().trim();
        if !media.eq_ignore_ascii_case("application/json") {
            return error(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                format!("Content-Type must be application/json, not {ct:?}"),
            );
        }
    }
    let Ok(key) = idempotency_key(headers) else {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_idempotency_key",
            format!("Idempotency-Key must be 1 to {MAX_KEY_LEN} visible ASCII characters"),
        );
    };
    let request: OrderRequest = match json_object(body) {
        Ok(r) => r,
        Err(answer) => return *answer,
    };
    let parsed = match request.parse() {
        Ok(p) => p,
        Err(e) => return error(StatusCode::BAD_REQUEST, "validation_failed", e.to_string()),
    };
    let now = deps.clock.now();
    let id = OrderId::new_random();
    tracing::Span::current().record("order_id", tracing::field::display(id));
    let order = Order::new(id, parsed, crate::domain::state::to_millis(now));
    let record = StateRecord::new(
        id,
        &deps.workflow,
        order.reply_queue_url.clone(),
        now,
        now + deps.policy.pickup_timeout,
    );
    let key = key.map(|key| IdempotencyRecord {
        key,
        request_hash: request_hash(&request),
        order_id: id,
        created_at: order.created_at,
    });
    match deps.store.create(&order, &record, key.as_ref()).await {
        Ok(CreateOutcome::Created) => {}
        Ok(CreateOutcome::KeyExists(first)) => return replay(deps, key.as_ref(), first).await,
        Err(e) => {
            error!(error = %e, "could not store the order");
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                "store_unavailable",
                "the order could not be stored; retry with the same Idempotency-Key",
            );
        }
    }
    // Crash point: the order is stored but not yet enqueued. Its pickup deadline is in the due
    // index, so the supervisor re-enqueues it if this send never happens.
    publish_status(
        deps.queue.as_ref(),
        deps.events.as_ref(),
        &record,
        Status::Received,
    )
    .await;
    let work = SchedulerMessage::Work(WorkMessage::new(id));
    match serde_json::to_string(&work) {
        Ok(body) => {
            if let Err(e) = deps
                .queue
                .send(&deps.work_queue_url, &body, Duration::ZERO)
                .await
            {
                error!(error = %e, "order stored but not enqueued; the supervisor will pick it up");
            }
        }
        Err(e) => error!(error = %e, "work message does not serialize"),
    }
    info!("order accepted");
    respond(
        StatusCode::ACCEPTED,
        &json!({"orderId": id, "processState": record.process_state}),
    )
}

async fn replay(
    deps: &SubmissionDeps,
    key: Option<&IdempotencyRecord>,
    first: IdempotencyRecord,
) -> Response<String> {
    if key.map(|k| &k.request_hash) != Some(&first.request_hash) {
        return error(
            StatusCode::CONFLICT,
            "idempotency_key_reused",
            "this Idempotency-Key was used with a different request body",
        );
    }
    let state = match deps.store.get_state(first.order_id).await {
        Ok(Some(r)) => r.process_state,
        Ok(None) => {
            error!(order_id = %first.order_id, "idempotency key points to a missing order");
            return error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "inconsistent store",
            );
        }
        Err(e) => {
            error!(error = %e, "could not read the order");
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                "store_unavailable",
                "retry later",
            );
        }
    };
    info!(order_id = %first.order_id, "idempotent replay");
    let mut r = respond(
        StatusCode::ACCEPTED,
        &json!({"orderId": first.order_id, "processState": state}),
    );
    r.headers_mut().insert(
        "idempotent-replayed",
        http::HeaderValue::from_static("true"),
    );
    r
}

/// Parses a body that must be one JSON object of shape `T`: `invalid_json` if it is not JSON at
/// all, `invalid_request` if it is JSON of another shape (an array is not an object, although
/// serde would build a struct from one by position).
fn json_object<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, Box<Response<String>>> {
    // A full parse checks the syntax (and the UTF-8 of every string) before the shape, so a
    // body that is not JSON is named as such even when its shape is wrong early on.
    if let Err(e) = serde_json::from_slice::<serde_json::Value>(body) {
        return Err(Box::new(error(
            StatusCode::BAD_REQUEST,
            "invalid_json",
            format!("the body is not JSON: {e}"),
        )));
    }
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(Box::new(error(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "the body must be a JSON object",
        )));
    }
    serde_json::from_slice(body).map_err(|e| {
        Box::new(error(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            e.to_string(),
        ))
    })
}

/// SHA-256 of the request re-serialized: two bodies that differ only in whitespace or key order
/// are the same request.
fn request_hash(request: &OrderRequest) -> String {
    let canonical = serde_json::to_vec(request).unwrap_or_default();
    hex::encode(Sha256::digest(canonical))
}

async fn get_order(deps: &SubmissionDeps, id: &str) -> Response<String> {
    let id: OrderId = match id.parse() {
        Ok(id) => id,
        Err(e) => return error(StatusCode::BAD_REQUEST, "invalid_order_id", e.to_string()),
    };
    match deps.store.get(id).await {
        Ok(Some((order, record))) => respond(StatusCode::OK, &order_view(&order, &record)),
        Ok(None) => error(
            StatusCode::NOT_FOUND,
            "order_not_found",
            format!("no order {id}"),
        ),
        Err(e) => {
            error!(error = %e, "could not read the order");
            error(
                StatusCode::SERVICE_UNAVAILABLE,
                "store_unavailable",
                "retry later",
            )
        }
    }
}

fn unavailable(e: impl std::fmt::Display) -> Response<String> {
    error!(error = %e, "the store is unavailable");
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        "store_unavailable",
        "retry later",
    )
}

/// `GET /orders?state=Error&limit=50&cursor=...`
async fn list(deps: &SubmissionDeps, query: &str) -> Response<String> {
    let (mut state, mut limit, mut cursor) = (None, 50usize, None);
    for (k, v) in url::form_urlencoded::parse(query.as_bytes()) {
        match k.as_ref() {
            "state" => match v.parse::<ProcessState>() {
                Ok(s) => state = Some(s),
                Err(e) => return error(StatusCode::BAD_REQUEST, "invalid_state", e),
            },
            "limit" => match v.parse::<usize>() {
                Ok(n) if (1..=MAX_PAGE).contains(&n) => limit = n,
                _ => {
                    return error(
                        StatusCode::BAD_REQUEST,
                        "invalid_limit",
                        format!("limit must be 1 to {MAX_PAGE}"),
                    );
                }
            },
            "cursor" => match Cursor::decode(&v) {
                Some(c) => cursor = Some(c),
                None => {
                    return error(
                        StatusCode::BAD_REQUEST,
                        "invalid_cursor",
                        "cursor is not one this API returned",
                    );
                }
            },
            other => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "unknown_parameter",
                    format!("unknown query parameter {other:?} (state, limit, cursor)"),
                );
            }
        }
    }
    let Some(state) = state else {
        let names: Vec<_> = ProcessState::ALL.iter().map(|s| s.as_str()).collect();
        return error(
            StatusCode::BAD_REQUEST,
            "missing_state",
            format!("state is required: one of {}", names.join(", ")),
        );
    };
    match deps.store.list(state, limit, cursor.as_ref()).await {
        Ok(page) => respond(
            StatusCode::OK,
            &json!({"orders": page.items, "nextCursor": page.next.map(|c| c.encode())}),
        ),
        Err(e) => unavailable(e),
    }
}

/// `POST /orders/{id}/retry|compensate|cancel`: one conditional write, then its effects.
async fn operate(deps: &SubmissionDeps, id: &str, action: &str, body: &[u8]) -> Response<String> {
    let id: OrderId = match id.parse() {
        Ok(id) => id,
        Err(e) => return error(StatusCode::BAD_REQUEST, "invalid_order_id", e.to_string()),
    };
    let reason = if body.iter().all(u8::is_ascii_whitespace) {
        None
    } else {
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct ActionBody {
            reason: Option<String>,
        }
        match json_object::<ActionBody>(body) {
            Ok(ActionBody { reason: Some(r) }) if r.chars().count() > MAX_REASON_CHARS => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "validation_failed",
                    format!("reason is over {MAX_REASON_CHARS} characters"),
                );
            }
            Ok(b) => b.reason,
            Err(answer) => return *answer,
        }
    };
    let (order, record) = match deps.store.get(id).await {
        Ok(Some(found)) => found,
        Ok(None) => {
            return error(
                StatusCode::NOT_FOUND,
                "order_not_found",
                format!("no order {id}"),
            );
        }
        Err(e) => return unavailable(e),
    };
    let now = deps.clock.now();
    let t: Result<Transition, Rejection> = match action {
        "retry" => transition::retry(&record, now, &deps.policy),
        "compensate" => transition::compensate(&record, now, &deps.policy),
        _ => transition::cancel(
            &record,
            reason.as_deref().unwrap_or("cancelled by the operator"),
            now,
            &deps.policy,
        ),
    };
    let t = match t {
        Ok(t) => t,
        Err(why) => return conflict(&record, why.to_string()),
    };
    match write(deps.store.as_ref(), &t).await {
        Ok(true) => {}
        Ok(false) => {
            return conflict(
                &record,
                "the order changed meanwhile (another operator, or the order moved on); read it and try again".into(),
            );
        }
        Err(e) => return unavailable(e),
    }
    tracing::Span::current().record("attempt", t.record.attempt);
    info!(from = %record.process_state, to = %t.record.process_state, "operator action applied");
    let outlets = Outlets {
        store: deps.store.as_ref(),
        queue: deps.queue.as_ref(),
        events: deps.events.as_ref(),
        clock: deps.clock.as_ref(),
        work_queue_url: &deps.work_queue_url,
    };
    if let Err(e) = perform_no_step(&outlets, &t).await {
        // The write stands; the supervisor finishes what is owed (a lost work message is
        // re-enqueued at the pickup deadline, an undelivered notice at once).
        error!(error = %e, "operator action written, effects left to the supervisor");
    }
    respond(StatusCode::ACCEPTED, &order_view(&order, &t.record))
}

fn conflict(record: &StateRecord, message: String) -> Response<String> {
    respond(
        StatusCode::CONFLICT,
        &json!({"error": {"code": "conflict", "message": message}, "processState": record.process_state}),
    )
}

/// The JSON view of an order and its state record.
pub fn order_view(order: &Order, r: &StateRecord) -> Value {
    json!({
        "orderId": order.id,
        "customerId": order.customer_id,
        "items": order.items,
        "replyQueueUrl": order.reply_queue_url,
        "processState": r.process_state,
        "lockedBy": r.locked_by,
        "completeBy": r.complete_by,
        "failureCount": r.failure_count,
        "attempt": r.attempt,
        "currentStep": r.current_step(),
        "step": r.current_step(),
        "round": r.round,
        "steps": r.steps,
        "lastError": r.last_error,
        "history": r.history,
        "createdAt": r.created_at,
        "updatedAt": r.updated_at,
    })
}
