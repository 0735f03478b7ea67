//! Services that are AWS Lambda functions: `Invoke` (RequestResponse) with the call as the
//! payload. The function's answer is the result; a function error whose `errorType` the
//! service declares a refusal is a business refusal, any other is transient; the Lambda API's
//! own errors are transient (throttling, service and network faults) or misconfigured (not
//! found, access denied, a bad request).

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
    let what = format!("lambda {code_str} (HTTP {status}): {message}");
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
        let parsed: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let field = |name: &str| parsed.get(name).and_then(Value::as_str).map(str::to_owned);
        let error_type = field("errorType");
        let message = field("errorMessage")
            .unwrap_or_else(|| String::from_utf8_lossy(body).chars().take(200).collect());
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
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(Value::Null);
        }
        // As over HTTP: an answer that is not JSON is kept as a string.
        Ok(serde_json::from_slice(body)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(body).into_owned())))
    }
}
