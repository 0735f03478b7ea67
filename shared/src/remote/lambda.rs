//! Services that are AWS Lambda functions: `Invoke` (RequestResponse) with the call as the
//! payload. The function's answer is the result; a function error whose `errorType` the
//! service declares a refusal is a business refusal, any other is transient; the Lambda API's
//! own errors are transient (throttling, service and network faults) or misconfigured (not
//! found, access denied, a bad request).

use super::{MAX_ANSWER_BYTES, MAX_CODE_BYTES, MAX_TEXT_BYTES, cap};
use crate::domain::workflow::LambdaTarget;
use crate::ports::{RemoteCall, RemoteFault, RemoteService};
use async_trait::async_trait;
use aws_sdk_lambda::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_lambda::primitives::Blob;
use aws_sdk_lambda::types::InvocationType;
use serde_json::{Value, json};
use std::time::Duration;

/// The payload a function receives.
pub fn payload(call: &RemoteCall) -> Value {
    let mut p = json!({
        "taskId": call.task_id.to_string(),
        "step": call.step,
        "action": call.action,
        "idempotencyKey": call.idempotency_key,
        "input": call.input,
        "deadline": call.deadline.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
    });
    if let Some(undoes) = &call.undoes {
        p["undoes"] = json!(undoes);
    }
    if let Some(callback) = &call.callback {
        p["callback"] = json!({"token": callback.token, "url": callback.url});
    }
    p
}

/// How an error of the Lambda API (its code, and the HTTP status) is read: throttling, 5xx and
/// the `EC2*`, `ENI*` and `KMS*` errors (the function's network or keys, often passing) are
/// transient; anything else (not found, access denied, a bad request, other 4xx) needs an
/// operator.
pub fn api_fault(code: Option<&str>, status: u16, message: String) -> RemoteFault {
    let code_str = code.unwrap_or("unknown");
    let what = cap(
        &format!("lambda {code_str} (HTTP {status}): {message}"),
        MAX_TEXT_BYTES,
    );
    let transient = status == 429
        || status >= 500
        || matches!(
            code,
            Some("TooManyRequestsException" | "ThrottlingException" | "ServiceException")
        )
        || ["EC2", "ENI", "KMS"]
            .iter()
            .any(|p| code_str.starts_with(p));
    if transient {
        RemoteFault::Transient(what)
    } else {
        RemoteFault::Misconfigured(what)
    }
}

/// A service that is a Lambda function.
#[derive(Debug, Clone)]
pub struct LambdaRemote {
    client: aws_sdk_lambda::Client,
    function: String,
    refusals: Vec<String>,
}

impl LambdaRemote {
    pub fn new(client: aws_sdk_lambda::Client, target: &LambdaTarget) -> Self {
        Self {
            client,
            function: target.function.clone(),
            refusals: target.refusals.clone(),
        }
    }

    /// What a function error (`X-Amz-Function-Error`, with `{errorType, errorMessage}` as the
    /// payload) means.
    fn function_error(&self, kind: &str, body: &[u8]) -> RemoteFault {
        // The SDK hands the payload over whole (up to Lambda's 6 MB): keep only capped texts.
        let parsed: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let field = |name: &str| parsed.get(name).and_then(Value::as_str);
        let error_type = field("errorType").map(|t| cap(t, MAX_CODE_BYTES));
        let message = field("errorMessage").map_or_else(
            || {
                let head = &body[..body.len().min(MAX_TEXT_BYTES)];
                String::from_utf8_lossy(head).chars().take(200).collect()
            },
            |m| cap(m, MAX_TEXT_BYTES),
        );
        match error_type {
            Some(t) if self.refusals.contains(&t) => RemoteFault::Refused { code: t, message },
            t => RemoteFault::Transient(format!(
                "function {} failed ({kind}, {}): {message}",
                self.function,
                t.as_deref().unwrap_or("no errorType")
            )),
        }
    }
}

#[async_trait]
impl RemoteService for LambdaRemote {
    async fn call(&self, call: &RemoteCall, timeout: Duration) -> Result<Value, RemoteFault> {
        let body = serde_json::to_vec(&payload(call))
            .map_err(|e| RemoteFault::Misconfigured(format!("payload not serialised: {e}")))?;
        let sent = self
            .client
            .invoke()
            .function_name(&self.function)
            .invocation_type(InvocationType::RequestResponse)
            .payload(Blob::new(body))
            .send();
        let out = match tokio::time::timeout(timeout, sent).await {
            Err(_) => {
                return Err(RemoteFault::Transient(format!(
                    "function {} did not answer within {timeout:?}",
                    self.function
                )));
            }
            Ok(Err(SdkError::ServiceError(e))) => {
                let status = e.raw().status().as_u16();
                let err = e.err();
                return Err(api_fault(
                    err.code(),
                    status,
                    err.message().unwrap_or_default().to_owned(),
                ));
            }
            Ok(Err(e @ SdkError::ConstructionFailure(_))) => {
                return Err(RemoteFault::Misconfigured(format!(
                    "invoke of {} not built: {}",
                    self.function,
                    aws_sdk_lambda::error::DisplayErrorContext(&e)
                )));
            }
            Ok(Err(e)) => {
                return Err(RemoteFault::Transient(format!(
                    "invoke of {} failed: {}",
                    self.function,
                    aws_sdk_lambda::error::DisplayErrorContext(&e)
                )));
            }
            Ok(Ok(out)) => out,
        };
        let body = out.payload().map(Blob::as_ref).unwrap_or_default();
        if let Some(kind) = out.function_error() {
            return Err(self.function_error(kind, body));
        }
        if body.len() > MAX_ANSWER_BYTES {
            return Err(RemoteFault::TooLarge(format!(
                "function {} answered {} bytes (sas reads at most {MAX_ANSWER_BYTES})",
                self.function,
                body.len()
            )));
        }
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(Value::Null);
        }
        // As over HTTP: an answer that is not JSON is kept as a string.
        Ok(serde_json::from_slice(body)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(body).into_owned())))
    }
}

/// A Lambda client for a stand-in of the Invoke API at `endpoint` (tests): test credentials,
/// `us-east-1`, no retries.
#[cfg(any(test, feature = "testkit"))]
pub fn client_at(endpoint: &str) -> aws_sdk_lambda::Client {
    let conf = aws_sdk_lambda::Config::builder()
        .behavior_version(aws_sdk_lambda::config::BehaviorVersion::latest())
        .region(aws_sdk_lambda::config::Region::new("us-east-1"))
        .credentials_provider(aws_sdk_lambda::config::Credentials::new(
            "test", "test", None, None, "test",
        ))
        .endpoint_url(endpoint)
        .retry_config(aws_sdk_lambda::config::retry::RetryConfig::disabled())
        .build();
    aws_sdk_lambda::Client::from_conf(conf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::TaskId;
    use crate::ports::CallbackAddress;
    use axum::extract::{Path, State};
    use axum::http::{HeaderMap, StatusCode};
    use axum::response::IntoResponse;
    use std::sync::{Arc, Mutex};

    /// What the stub of the Invoke API saw: function name, invocation type, payload.
    type Seen = Arc<Mutex<Vec<(String, Option<String>, Value)>>>;

    /// A stub of `POST /2015-03-31/functions/{name}/invocations` answering as Lambda does: a
    /// function error is a 200 with `X-Amz-Function-Error` and `{errorMessage, errorType}`;
    /// an API error has its code in `x-amzn-ErrorType` and a JSON body.
    async fn stub() -> (Seen, String) {
        async fn invoke(
            State(seen): State<Seen>,
            Path(name): Path<String>,
            headers: HeaderMap,
            body: axum::body::Bytes,
        ) -> axum::response::Response {
            let payload: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let kind = headers
                .get("x-amz-invocation-type")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            seen.lock()
                .expect("lock")
                .push((name.clone(), kind, payload.clone()));
            let function_error = |body: Value| {
                (
                    StatusCode::OK,
                    [
                        ("x-amz-function-error", "Unhandled"),
                        ("x-amz-executed-version", "$LATEST"),
                    ],
                    body.to_string(),
                )
                    .into_response()
            };
            let api_error = |status: StatusCode, code: &'static str, body: Value| {
                (
                    status,
                    [
                        ("x-amzn-errortype", code),
                        ("content-type", "application/json"),
                    ],
                    body.to_string(),
                )
                    .into_response()
            };
            match name.as_str() {
                "sas-dev-svc-ok" => (
                    StatusCode::OK,
                    [("x-amz-executed-version", "$LATEST")],
                    json!({"score": 700, "got": payload["input"]}).to_string(),
                )
                    .into_response(),
                "sas-dev-svc-empty" => StatusCode::OK.into_response(),
                "sas-dev-svc-declines" => function_error(json!({
                    "errorMessage": "score too low",
                    "errorType": "CreditDeclined",
                    "stackTrace": ["at score (index.js:3)"],
                })),
                "sas-dev-svc-huge" => (
                    StatusCode::OK,
                    json!({"pad": "x".repeat(MAX_ANSWER_BYTES)}).to_string(),
                )
                    .into_response(),
                "sas-dev-svc-declines-loudly" => function_error(json!({
                    "errorMessage": "é".repeat(1 << 20),
                    "errorType": "CreditDeclined",
                })),
                "sas-dev-svc-crashes-loudly" => function_error(json!({
                    "errorMessage": "x".repeat(2 << 20),
                    "errorType": "T".repeat(1000),
                })),
                "sas-dev-svc-crashes" => function_error(json!({
                    "errorMessage": "Cannot read properties of undefined",
                    "errorType": "TypeError",
                })),
                "sas-dev-svc-timesout" => function_error(json!({
                    "errorMessage": "2030-01-01T00:00:00.000Z 1f2e Task timed out after 3.00 seconds",
                })),
                "sas-dev-svc-busy" => api_error(
                    StatusCode::TOO_MANY_REQUESTS,
                    "TooManyRequestsException",
                    json!({"Reason": "ReservedFunctionConcurrentInvocationLimitExceeded", "Type": "User", "message": "Rate Exceeded."}),
                ),
                "sas-dev-svc-broken" => api_error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "ServiceException",
                    json!({"Type": "Service", "message": "internal"}),
                ),
                "sas-dev-svc-eni" => api_error(
                    StatusCode::BAD_GATEWAY,
                    "ENILimitReachedException",
                    json!({"Type": "Server", "message": "ENI limit"}),
                ),
                "sas-dev-svc-denied" => api_error(
                    StatusCode::FORBIDDEN,
                    "AccessDeniedException",
                    json!({"Message": "not authorized to perform: lambda:InvokeFunction"}),
                ),
                _ => api_error(
                    StatusCode::NOT_FOUND,
                    "ResourceNotFoundException:http://internal.amazon.com/coral/com.amazonaws.awsgambit/",
                    json!({"Type": "User", "Message": format!("Function not found: arn:aws:lambda:us-east-1:123456789012:function:{name}")}),
                ),
            }
        }
        let seen: Seen = Arc::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().expect("addr");
        let app = axum::Router::new()
            .route(
                "/2015-03-31/functions/{name}/invocations",
                axum::routing::post(invoke),
            )
            .with_state(seen.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (seen, format!("http://{addr}"))
    }

    fn remote(endpoint: &str, function: &str) -> LambdaRemote {
        LambdaRemote::new(
            super::client_at(endpoint),
            &LambdaTarget {
                function: function.into(),
                refusals: vec!["CreditDeclined".into()],
            },
        )
    }

    fn call() -> RemoteCall {
        RemoteCall {
            service: "credit-bureau".into(),
            step: "score".into(),
            action: "score-applicant".into(),
            idempotency_key: "t:score:score-applicant".into(),
            task_id: TaskId::new_random(),
            undoes: None,
            input: json!({"applicant": "a1"}),
            deadline: chrono::DateTime::parse_from_rfc3339("2030-01-02T03:04:05.678Z")
                .expect("date")
                .with_timezone(&chrono::Utc),
            callback: None,
            limit_keys: Default::default(),
        }
    }

    const T: Duration = Duration::from_secs(10);

    #[tokio::test]
    async fn a_function_answer_is_the_result_and_the_payload_carries_the_call() {
        let (seen, endpoint) = stub().await;
        let c = call();
        let out = remote(&endpoint, "sas-dev-svc-ok")
            .call(&c, T)
            .await
            .expect("ok");
        assert_eq!(out, json!({"score": 700, "got": {"applicant": "a1"}}));
        let (name, kind, payload) = seen.lock().expect("lock")[0].clone();
        assert_eq!(name, "sas-dev-svc-ok");
        assert_eq!(kind.as_deref(), Some("RequestResponse"));
        assert_eq!(
            payload,
            json!({
                "taskId": c.task_id.to_string(),
                "step": "score",
                "action": "score-applicant",
                "idempotencyKey": "t:score:score-applicant",
                "input": {"applicant": "a1"},
                "deadline": "2030-01-02T03:04:05.678Z",
            })
        );
        let undo = RemoteCall {
            undoes: Some("t:score:x".into()),
            callback: Some(CallbackAddress {
                token: "tok".into(),
                url: "https://api.example/cb".into(),
            }),
            ..c
        };
        remote(&endpoint, "sas-dev-svc-ok")
            .call(&undo, T)
            .await
            .expect("ok");
        let payload = seen.lock().expect("lock")[1].2.clone();
        assert_eq!(payload["undoes"], json!("t:score:x"));
        assert_eq!(
            payload["callback"],
            json!({"token": "tok", "url": "https://api.example/cb"})
        );
        assert_eq!(
            remote(&endpoint, "sas-dev-svc-empty")
                .call(&call(), T)
                .await,
            Ok(Value::Null)
        );
    }

    #[tokio::test]
    async fn a_declared_function_error_is_a_refusal_and_any_other_is_transient() {
        let (_, endpoint) = stub().await;
        assert_eq!(
            remote(&endpoint, "sas-dev-svc-declines")
                .call(&call(), T)
                .await,
            Err(RemoteFault::Refused {
                code: "CreditDeclined".into(),
                message: "score too low".into()
            })
        );
        for f in ["sas-dev-svc-crashes", "sas-dev-svc-timesout"] {
            let out = remote(&endpoint, f).call(&call(), T).await;
            assert!(
                matches!(out, Err(RemoteFault::Transient(_))),
                "{f}: {out:?}"
            );
        }
    }

    /// The SDK hands over the whole payload (up to Lambda's 6 MB): a success over
    /// [`MAX_ANSWER_BYTES`] is too large to keep, and a function error's texts are capped.
    #[tokio::test]
    async fn a_huge_payload_is_too_large_and_huge_error_texts_are_capped() {
        let (_, endpoint) = stub().await;
        let out = remote(&endpoint, "sas-dev-svc-huge").call(&call(), T).await;
        assert!(matches!(&out, Err(RemoteFault::TooLarge(_))), "{out:?}");
        match remote(&endpoint, "sas-dev-svc-declines-loudly")
            .call(&call(), T)
            .await
        {
            Err(RemoteFault::Refused { code, message }) => {
                assert_eq!(code, "CreditDeclined");
                assert!(message.len() <= MAX_TEXT_BYTES, "{}", message.len());
                assert!(message.ends_with(crate::remote::CUT_MARKER), "{message}");
            }
            other => panic!("{other:?}"),
        }
        match remote(&endpoint, "sas-dev-svc-crashes-loudly")
            .call(&call(), T)
            .await
        {
            Err(RemoteFault::Transient(e)) => assert!(e.len() < 2 * MAX_TEXT_BYTES, "{}", e.len()),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn api_errors_are_transient_or_misconfigured() {
        let (_, endpoint) = stub().await;
        for f in ["sas-dev-svc-busy", "sas-dev-svc-broken", "sas-dev-svc-eni"] {
            let out = remote(&endpoint, f).call(&call(), T).await;
            assert!(
                matches!(out, Err(RemoteFault::Transient(_))),
                "{f}: {out:?}"
            );
        }
        for (f, says) in [
            ("sas-dev-svc-missing", "ResourceNotFoundException"),
            ("sas-dev-svc-denied", "AccessDenied"),
        ] {
            let out = remote(&endpoint, f).call(&call(), T).await;
            assert!(
                matches!(&out, Err(RemoteFault::Misconfigured(m)) if m.contains(says)),
                "{f}: {out:?}"
            );
        }
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let closed = format!("http://{}", listener.local_addr().expect("addr"));
        drop(listener);
        let out = remote(&closed, "sas-dev-svc-ok").call(&call(), T).await;
        assert!(matches!(out, Err(RemoteFault::Transient(_))), "{out:?}");
    }

    #[test]
    fn api_fault_table() {
        let transient = [
            (Some("TooManyRequestsException"), 429),
            (Some("KMSAccessDeniedException"), 502),
            (Some("EC2ThrottledException"), 502),
            (None, 503),
        ];
        let misconfigured = [
            (Some("InvalidRequestContentException"), 400),
            (Some("ResourceNotFoundException"), 404),
            (None, 413),
        ];
        for (code, status) in transient {
            let f = api_fault(code, status, String::new());
            assert!(
                matches!(f, RemoteFault::Transient(_)),
                "{code:?} {status}: {f:?}"
            );
        }
        for (code, status) in misconfigured {
            let f = api_fault(code, status, String::new());
            assert!(
                matches!(f, RemoteFault::Misconfigured(_)),
                "{code:?} {status}: {f:?}"
            );
        }
    }
}
