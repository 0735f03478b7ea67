//! Callback steps for services that answer at once: the simulated services (and any
//! [`RemoteService`] wrapped here) take a callback step's request (answering faults and
//! refusals at once) and post its result to the step's callback URL a little later, as a real
//! asynchronous service (an e-sign provider whose customer signs) does.

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
/// to `inner` as usual; one with an address is performed at once (so a service that is down or
/// refuses answers so, as a real one would), and its outcome, the result, is posted to the
/// callback URL `delay` later (the signature that comes after the contract went out).
pub struct CallbackCompleter {
    inner: Arc<dyn RemoteService>,
    sink: Arc<dyn CallbackSink>,
    delay: Duration,
}

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
        let work = RemoteCall {
            callback: None,
            ..call.clone()
        };
        // Faults and refusals answer the request itself; a success is only an acceptance.
        let result = self.inner.call(&work, timeout).await?;
        let (sink, delay, key) = (self.sink.clone(), self.delay, work.idempotency_key);
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let body = json!({"status": "succeeded", "result": result});
            match sink.post(&address.url, &body).await {
                Ok(status) if status < 300 => {}
                Ok(status) => warn!(%key, status, "callback not accepted"),
                Err(e) => warn!(%key, error = %e, "callback not posted"),
            }
        });
        Ok(json!({"accepted": true}))
    }
}
