//! [`ApiError`]: every error answer of the HTTP API, each variant with its code, its status and
//! its message; and [`respond`], the JSON answer they and every success are sent as.
//!
//! The body is `{"error": {"code", "message"}}`, plus `problems` (each at a JSON pointer) for an
//! input or a definition that does not validate, and `processState` beside `error` for a
//! conflict on a task.

use crate::domain::ProcessState;
use crate::domain::workflow::Problem;
use http::{HeaderValue, Response, StatusCode, header};
use serde_json::json;

/// An answer of the API (a success, or an error turned into its answer by [`ApiError::response`]).
pub type Answer = Result<Response<String>, ApiError>;

/// Sends `body` as JSON with `status`. Objects go out with their keys in order (through
/// [`serde_json::Value`]), whatever the order of a struct's fields.
pub fn respond(status: StatusCode, body: &impl serde::Serialize) -> Response<String> {
    let text = serde_json::to_value(body)
        .map(|v| v.to_string())
        .unwrap_or_else(|e| {
            tracing::error!(error = %e, "an answer does not serialize");
            json!({"error": {"code": "internal", "message": "the answer does not serialize"}})
                .to_string()
        });
    let mut r = Response::new(text);
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// Why a request is refused, or could not be served. `code()` is the stable code clients read;
/// `Display` is the message.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ApiError {
    /// No route has this path (on this API).
    #[error("no route for {method} {path}")]
    RouteNotFound { method: String, path: String },
    /// The route exists, not with this method: answered with `Allow`.
    #[error("{method} is not allowed on {path}")]
    MethodNotAllowed {
        method: String,
        path: String,
        allow: &'static str,
    },
    /// No caller could be named (no signature, token or authorizer context), and why: the
    /// check's reason (a wrong signature, an unknown key, a stale date...), never a secret.
    #[error("{0}")]
    Unauthenticated(String),
    /// The caller is over its allowance: answered with `Retry-After`.
    #[error(
        "over this caller's limit of {per_second} requests a second (bursts of {burst}); retry after {retry_after_s} s"
    )]
    RateLimited {
        per_second: f64,
        burst: u32,
        retry_after_s: i64,
    },
    /// A body over what any route accepts.
    #[error("the body is over {limit} bytes, the most accepted")]
    PayloadTooLarge { limit: usize },
    /// A task input over its limit.
    #[error("the task input is {bytes} bytes; at most {limit} are accepted")]
    InputTooLarge { bytes: usize, limit: usize },
    /// A definition over its limit.
    #[error("the definition is {bytes} bytes; at most {limit} are accepted")]
    DefinitionTooLarge { bytes: usize, limit: usize },
    #[error("Content-Type must be application/json, not {0:?}")]
    UnsupportedMediaType(String),
    #[error("the body is not JSON: {0}")]
    InvalidJson(String),
    /// JSON of the wrong shape.
    #[error("{0}")]
    InvalidRequest(String),
    #[error("Idempotency-Key must be 1 to {max_len} visible ASCII characters")]
    InvalidIdempotencyKey { max_len: usize },
    #[error("{0}")]
    InvalidReplyQueueUrl(String),
    #[error("{0}")]
    InvalidTaskId(String),
    #[error("a version is a positive whole number")]
    InvalidVersion,
    #[error("{0}")]
    InvalidState(String),
    #[error("limit must be 1 to {max}")]
    InvalidLimit { max: usize },
    #[error("cursor is not one this API returned")]
    InvalidCursor,
    /// A query parameter the route does not take (`known`: the ones it does, listed).
    #[error("unknown query parameter {name:?} ({known})")]
    UnknownParameter { name: String, known: &'static str },
    #[error("state is required: one of {0}")]
    MissingState(String),
    /// A search by key's parameter that does not parse (`key`, `from`, `to`), named.
    #[error("{0}")]
    InvalidSearch(String),
    /// A request that does not hold (a missing or bad field), with the problems at their JSON
    /// pointers if there are several to name.
    #[error("{message}")]
    ValidationFailed {
        message: String,
        problems: Option<Vec<Problem>>,
    },
    /// A definition that does not validate (`problems`, unless there is nothing to point at).
    #[error("{message}")]
    InvalidDefinition {
        message: String,
        problems: Option<Vec<Problem>>,
    },
    #[error("the path names {path:?} but the definition's name is {}", match named { Some(n) => format!("{n:?}"), None => "missing".to_owned() })]
    NameMismatch { path: String, named: Option<String> },
    #[error("this Idempotency-Key was used with a different request body")]
    IdempotencyKeyReused,
    #[error("no task {0}")]
    TaskNotFound(crate::domain::TaskId),
    #[error("{0}")]
    WorkflowNotFound(String),
    #[error("{0}")]
    ServiceNotFound(String),
    #[error("{0}")]
    ScheduleNotFound(String),
    #[error("no such callback")]
    CallbackNotFound,
    /// The task has no such step, or the step has no result (yet).
    #[error("{0}")]
    ResultNotFound(String),
    #[error(
        "this step no longer waits for this callback: an earlier callback was applied, the step is being undone, it was retried under a new key, or the task moved on"
    )]
    StaleCallback,
    /// The task's workflow waits for no event of this name.
    #[error("{0}")]
    EventNotExpected(String),
    /// No step still to come waits for the event (the one that did passed, or the task ended),
    /// or the task keeps as many early events as it may.
    #[error("{message}")]
    EventRefused {
        message: String,
        process_state: ProcessState,
    },
    /// The state (of a task: `process_state`, sent beside the error) does not allow it, or moved
    /// on meanwhile.
    #[error("{message}")]
    Conflict {
        message: String,
        process_state: Option<ProcessState>,
    },
    /// The store could not be reached: retry.
    #[error("{0}")]
    StoreUnavailable(&'static str),
    /// The schedule is saved, but the deployment's timer (EventBridge Scheduler) did not take
    /// it: applying it again finishes the change.
    #[error("{0}")]
    TimetableUnavailable(String),
    #[error("{0}")]
    Internal(&'static str),
}

/// The `code` and `message` of an error body (`{"error": {"code", "message"}}`), for tests
/// that check an answer's error; `None` if `body` is not one.
#[cfg(any(test, feature = "testkit"))]
pub fn code_and_message(body: &serde_json::Value) -> Option<(&str, &str)> {
    let error = body.get("error")?;
    Some((
        error.get("code")?.as_str()?,
        error.get("message")?.as_str()?,
    ))
}

impl ApiError {
    /// Every code, in the order of the variants: what clients may see in `error.code`.
    pub const CODES: &'static [&'static str] = &[
        "route_not_found",
        "method_not_allowed",
        "unauthenticated",
        "rate_limited",
        "payload_too_large",
        "input_too_large",
        "definition_too_large",
        "unsupported_media_type",
        "invalid_json",
        "invalid_request",
        "invalid_idempotency_key",
        "invalid_reply_queue_url",
        "invalid_task_id",
        "invalid_version",
        "invalid_state",
        "invalid_limit",
        "invalid_cursor",
        "unknown_parameter",
        "missing_state",
        "invalid_search",
        "validation_failed",
        "invalid_definition",
        "name_mismatch",
        "idempotency_key_reused",
        "task_not_found",
        "workflow_not_found",
        "service_not_found",
        "schedule_not_found",
        "callback_not_found",
        "result_not_found",
        "stale_callback",
        "event_not_expected",
        "event_refused",
        "conflict",
        "store_unavailable",
        "timetable_unavailable",
        "internal",
    ];

    /// The code clients read in `error.code`: one of [`ApiError::CODES`].
    pub fn code(&self) -> &'static str {
        match self {
            Self::RouteNotFound { .. } => "route_not_found",
            Self::MethodNotAllowed { .. } => "method_not_allowed",
            Self::Unauthenticated(_) => "unauthenticated",
            Self::RateLimited { .. } => "rate_limited",
            Self::PayloadTooLarge { .. } => "payload_too_large",
            Self::InputTooLarge { .. } => "input_too_large",
            Self::DefinitionTooLarge { .. } => "definition_too_large",
            Self::UnsupportedMediaType(_) => "unsupported_media_type",
            Self::InvalidJson(_) => "invalid_json",
            Self::InvalidRequest(_) => "invalid_request",
            Self::InvalidIdempotencyKey { .. } => "invalid_idempotency_key",
            Self::InvalidReplyQueueUrl(_) => "invalid_reply_queue_url",
            Self::InvalidTaskId(_) => "invalid_task_id",
            Self::InvalidVersion => "invalid_version",
            Self::InvalidState(_) => "invalid_state",
            Self::InvalidLimit { .. } => "invalid_limit",
            Self::InvalidCursor => "invalid_cursor",
            Self::UnknownParameter { .. } => "unknown_parameter",
            Self::MissingState(_) => "missing_state",
            Self::InvalidSearch(_) => "invalid_search",
            Self::ValidationFailed { .. } => "validation_failed",
            Self::InvalidDefinition { .. } => "invalid_definition",
            Self::NameMismatch { .. } => "name_mismatch",
            Self::IdempotencyKeyReused => "idempotency_key_reused",
            Self::TaskNotFound(_) => "task_not_found",
            Self::WorkflowNotFound(_) => "workflow_not_found",
            Self::ServiceNotFound(_) => "service_not_found",
            Self::ScheduleNotFound(_) => "schedule_not_found",
            Self::CallbackNotFound => "callback_not_found",
            Self::ResultNotFound(_) => "result_not_found",
            Self::StaleCallback => "stale_callback",
            Self::EventNotExpected(_) => "event_not_expected",
            Self::EventRefused { .. } => "event_refused",
            Self::Conflict { .. } => "conflict",
            Self::StoreUnavailable(_) => "store_unavailable",
            Self::TimetableUnavailable(_) => "timetable_unavailable",
            Self::Internal(_) => "internal",
        }
    }

    /// The HTTP status of the answer.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::RouteNotFound { .. }
            | Self::TaskNotFound(_)
            | Self::WorkflowNotFound(_)
            | Self::ServiceNotFound(_)
            | Self::ScheduleNotFound(_)
            | Self::CallbackNotFound
            | Self::ResultNotFound(_)
            | Self::EventNotExpected(_) => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            Self::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
            Self::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            Self::PayloadTooLarge { .. }
            | Self::InputTooLarge { .. }
            | Self::DefinitionTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::InvalidJson(_)
            | Self::InvalidRequest(_)
            | Self::InvalidIdempotencyKey { .. }
            | Self::InvalidReplyQueueUrl(_)
            | Self::InvalidTaskId(_)
            | Self::InvalidVersion
            | Self::InvalidState(_)
            | Self::InvalidLimit { .. }
            | Self::InvalidCursor
            | Self::UnknownParameter { .. }
            | Self::MissingState(_)
            | Self::InvalidSearch(_)
            | Self::ValidationFailed { .. }
            | Self::InvalidDefinition { .. }
            | Self::NameMismatch { .. } => StatusCode::BAD_REQUEST,
            Self::IdempotencyKeyReused
            | Self::StaleCallback
            | Self::EventRefused { .. }
            | Self::Conflict { .. } => StatusCode::CONFLICT,
            Self::StoreUnavailable(_) | Self::TimetableUnavailable(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// `validation_failed` without problems to point at.
    pub fn validation(message: impl Into<String>) -> Self {
        Self::ValidationFailed {
            message: message.into(),
            problems: None,
        }
    }

    /// `store_unavailable` for a store (or queue) that failed: logged here, `retry later` to
    /// the client.
    pub fn unavailable(e: impl std::fmt::Display) -> Self {
        tracing::error!(error = %e, "the store is unavailable");
        Self::StoreUnavailable("retry later")
    }

    /// The answer: the body, the status and the headers the variant calls for.
    pub fn response(self) -> Response<String> {
        let mut error = json!({"code": self.code(), "message": self.to_string()});
        let mut body = serde_json::Map::new();
        match &self {
            Self::ValidationFailed {
                problems: Some(p), ..
            }
            | Self::InvalidDefinition {
                problems: Some(p), ..
            } => error["problems"] = json!(p),
            Self::Conflict {
                process_state: Some(s),
                ..
            }
            | Self::EventRefused {
                process_state: s, ..
            } => {
                body.insert("processState".into(), json!(s));
            }
            _ => {}
        }
        body.insert("error".into(), error);
        let mut r = respond(self.status(), &body);
        match self {
            Self::MethodNotAllowed { allow, .. } => {
                r.headers_mut()
                    .insert(header::ALLOW, HeaderValue::from_static(allow));
            }
            Self::RateLimited { retry_after_s, .. } => {
                r.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from(retry_after_s));
            }
            _ => {}
        }
        r
    }
}

/// A definition or service that cannot be read (`store_unavailable`) or does not validate
/// (`invalid_definition`, with its problems).
impl From<crate::catalog::CatalogError> for ApiError {
    fn from(e: crate::catalog::CatalogError) -> Self {
        match e {
            crate::catalog::CatalogError::Store(e) => Self::unavailable(e),
            crate::catalog::CatalogError::Invalid(d) => Self::InvalidDefinition {
                message: d.to_string(),
                problems: Some(d.0),
            },
        }
    }
}

impl From<ApiError> for Response<String> {
    fn from(e: ApiError) -> Self {
        e.response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_mismatch_shows_names_not_debug_structures() {
        let named = ApiError::NameMismatch {
            path: "a".into(),
            named: Some("customer-onboarding".into()),
        };
        assert_eq!(
            named.to_string(),
            "the path names \"a\" but the definition's name is \"customer-onboarding\""
        );
        let missing = ApiError::NameMismatch {
            path: "a".into(),
            named: None,
        };
        assert!(!missing.to_string().contains("None"), "{missing}");
    }

    /// One example of every variant, in the order of [`ApiError::CODES`].
    fn one_of_each() -> Vec<ApiError> {
        let s = || String::from("x");
        vec![
            ApiError::RouteNotFound {
                method: "GET".into(),
                path: "/x".into(),
            },
            ApiError::MethodNotAllowed {
                method: "PUT".into(),
                path: "/tasks".into(),
                allow: "GET",
            },
            ApiError::Unauthenticated("sign the request".into()),
            ApiError::RateLimited {
                per_second: 50.0,
                burst: 100,
                retry_after_s: 2,
            },
            ApiError::PayloadTooLarge { limit: 1 },
            ApiError::InputTooLarge { bytes: 2, limit: 1 },
            ApiError::DefinitionTooLarge { bytes: 2, limit: 1 },
            ApiError::UnsupportedMediaType(s()),
            ApiError::InvalidJson(s()),
            ApiError::InvalidRequest(s()),
            ApiError::InvalidIdempotencyKey { max_len: 255 },
            ApiError::InvalidReplyQueueUrl(s()),
            ApiError::InvalidTaskId(s()),
            ApiError::InvalidVersion,
            ApiError::InvalidState(s()),
            ApiError::InvalidLimit { max: 100 },
            ApiError::InvalidCursor,
            ApiError::UnknownParameter {
                name: s(),
                known: "limit",
            },
            ApiError::MissingState(s()),
            ApiError::InvalidSearch(s()),
            ApiError::validation("x"),
            ApiError::InvalidDefinition {
                message: s(),
                problems: Some(vec![]),
            },
            ApiError::NameMismatch {
                path: s(),
                named: None,
            },
            ApiError::IdempotencyKeyReused,
            ApiError::TaskNotFound(crate::domain::TaskId::new_random()),
            ApiError::WorkflowNotFound(s()),
            ApiError::ServiceNotFound(s()),
            ApiError::ScheduleNotFound(s()),
            ApiError::CallbackNotFound,
            ApiError::ResultNotFound(s()),
            ApiError::StaleCallback,
            ApiError::EventNotExpected(s()),
            ApiError::EventRefused {
                message: s(),
                process_state: ProcessState::Compensating,
            },
            ApiError::Conflict {
                message: s(),
                process_state: Some(ProcessState::Error),
            },
            ApiError::StoreUnavailable("retry later"),
            ApiError::TimetableUnavailable(s()),
            ApiError::Internal("x"),
        ]
    }

    #[test]
    fn every_code_is_listed_once_in_snake_case_and_answered_as_its_variant_says() {
        let all = one_of_each();
        let codes: Vec<&str> = all.iter().map(ApiError::code).collect();
        assert_eq!(codes, ApiError::CODES, "CODES lists every variant's code");
        let mut unique = codes.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), codes.len(), "a code is used twice: {codes:?}");
        for code in ApiError::CODES {
            let snake = !code.is_empty()
                && code.split('_').all(|w| {
                    !w.is_empty()
                        && w.bytes()
                            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
                });
            assert!(snake, "{code} is not snake_case");
        }
        for e in all {
            let (code, status, message) = (e.code(), e.status(), e.to_string());
            let r = e.response();
            assert_eq!(r.status(), status, "{code}");
            let body: serde_json::Value =
                serde_json::from_str(r.body()).unwrap_or(serde_json::Value::Null);
            assert_eq!(body["error"]["code"], code, "{body}");
            assert_eq!(body["error"]["message"], message.as_str(), "{body}");
            assert!(!message.is_empty(), "{code} has no message");
            assert!(
                status.is_client_error() || status.is_server_error(),
                "{code}: {status}"
            );
        }
    }

    #[test]
    fn representative_codes_have_the_statuses_the_api_docs_promise() {
        // docs/api.md: "404 route_not_found; 405 method_not_allowed with an Allow header;
        // 503 store_unavailable; 500 internal", "409 idempotency_key_reused",
        // "413 input_too_large", "415 unsupported_media_type", "429 rate_limited with
        // Retry-After", "409 conflict (with processState)".
        let status_of = |code: &str| {
            one_of_each()
                .into_iter()
                .find(|e| e.code() == code)
                .map(|e| e.status().as_u16())
        };
        for (code, status) in [
            ("route_not_found", 404),
            ("method_not_allowed", 405),
            ("unauthenticated", 401),
            ("rate_limited", 429),
            ("input_too_large", 413),
            ("unsupported_media_type", 415),
            ("validation_failed", 400),
            ("idempotency_key_reused", 409),
            ("stale_callback", 409),
            ("task_not_found", 404),
            ("store_unavailable", 503),
            ("internal", 500),
        ] {
            assert_eq!(status_of(code), Some(status), "{code}");
        }
        let r = ApiError::MethodNotAllowed {
            method: "PUT".into(),
            path: "/tasks".into(),
            allow: "GET",
        }
        .response();
        assert_eq!(r.headers()[header::ALLOW], "GET");
        let r = ApiError::RateLimited {
            per_second: 1.0,
            burst: 1,
            retry_after_s: 3,
        }
        .response();
        assert_eq!(r.headers()[header::RETRY_AFTER], "3");
        let r = ApiError::Conflict {
            message: "moved on".into(),
            process_state: Some(ProcessState::Error),
        }
        .response();
        let body: serde_json::Value =
            serde_json::from_str(r.body()).unwrap_or(serde_json::Value::Null);
        assert_eq!(body["processState"], "Error", "{body}");
    }
}
