//! Callback steps for services that answer at once: the simulated services (and any
//! [`RemoteService`] wrapped here) accept a callback step's request, do the work a little
//! later, and report its outcome by posting to the step's callback URL, as a real asynchronous
//! service (an e-sign provider, a person approving) does.

use crate::ports::{RemoteCall, RemoteFault, RemoteService};
use async_trait::async_trait;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use tracing::warn;

/// Where a completed callback step's outcome is posted.
#[async_trait]
pub trait CallbackSink: Send + Sync {
    /// Posts `body` to the callback `url`; the answer's status, or why there was none.
    async fn post(&self, url: &str, body: &Value) -> Result<u16, String>;
}

/// Posts callbacks over HTTP (the deployed task API, or `sas-local` serving one).
pub struct HttpCallbackSink(pub reqwest::Client);

#[async_trait]
impl CallbackSink for HttpCallbackSink {
    async fn post(&self, url: &str, body: &Value) -> Result<u16, String> {
        self.0
            .post(url)
            .timeout(Duration::from_secs(10))
            .json(body)
            .send()
            .await
            .map(|r| r.status().as_u16())
            .map_err(|e| e.to_string())
    }
}

/// A service that completes callback steps by callback: a call without a callback address goes
/// to `inner` as usual; one with an address is accepted at once, performed `delay` later (its
/// transient faults retried a few times, as a service retries its own work), and its outcome
/// (the result, or the refusal) posted to the callback URL.
pub struct CallbackCompleter {
    inner: Arc<dyn RemoteService>,
    sink: Arc<dyn CallbackSink>,
    delay: Duration,
}

/// How often the completer tries the work before it gives up (the step then times out and is
/// retried under a new token).
const WORK_TRIES: u32 = 5;

impl CallbackCompleter {
    pub fn new(
        inner: Arc<dyn RemoteService>,
        sink: Arc<dyn CallbackSink>,
        delay: Duration,
    ) -> Self {
        Self { inner, sink, delay }
    }
}

#[async_trait]
impl RemoteService for CallbackCompleter {
    async fn call(&self, call: &RemoteCall, timeout: Duration) -> Result<Value, RemoteFault> {
        let Some(address) = call.callback.clone() else {
            return self.inner.call(call, timeout).await;
        };
        let (inner, sink, delay) = (self.inner.clone(), self.sink.clone(), self.delay);
        let work = RemoteCall {
            callback: None,
            ..call.clone()
        };
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let mut outcome = None;
            for attempt in 0..WORK_TRIES {
                match inner.call(&work, Duration::from_secs(30)).await {
                    Ok(result) => {
                        outcome = Some(json!({"status": "succeeded", "result": result}));
                        break;
                    }
                    Err(RemoteFault::Refused { code, message }) => {
                        outcome =
                            Some(json!({"status": "refused", "code": code, "message": message}));
                        break;
                    }
                    Err(e) => {
                        warn!(key = %work.idempotency_key, attempt, error = %e, "callback work failed; retrying");
                        tokio::time::sleep(Duration::from_millis(50 << attempt)).await;
                    }
                }
            }
            let Some(body) = outcome else {
                warn!(key = %work.idempotency_key, "callback work gave up: the step will time out");
                return;
            };
            match sink.post(&address.url, &body).await {
                Ok(status) if status < 300 => {}
                Ok(status) => {
                    warn!(key = %work.idempotency_key, status, "callback not accepted")
                }
                Err(e) => warn!(key = %work.idempotency_key, error = %e, "callback not posted"),
            }
        });
        Ok(json!({"accepted": true}))
    }
}
