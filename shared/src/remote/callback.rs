//! Callback steps for services that answer at once: the simulated services (and any
//! [`RemoteService`] wrapped here) take a callback step's request (answering faults and
//! refusals at once) and post its result to the step's callback URL a little later, as a real
//! asynchronous service (an e-sign provider whose customer signs) does.

use crate::ports::{CallbackAddress, Clock, RemoteCall, RemoteFault, RemoteService};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
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

/// One callback a [`CallbackCompleter`] posted: for which key, when, and what sas answered
/// (the last answer, after retries of 5xx and transport errors; `None`: never answered).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostedCallback {
    pub key: String,
    pub at: DateTime<Utc>,
    pub status: Option<u16>,
}

/// The callbacks a completer posted, for a test harness to check against the records.
pub type CallbackLog = Arc<Mutex<Vec<PostedCallback>>>;

/// How often a callback answered 5xx (or not at all) is posted again, and the first pause.
const CALLBACK_TRIES: u32 = 5;
const CALLBACK_RETRY_PAUSE: Duration = Duration::from_millis(100);

/// A service that completes callback steps by callback, keeping the service contract and
/// nothing more: a call without a callback address goes to `inner` as usual; one with an
/// address is performed at once (so a service that is down or refuses answers so, as a real
/// one would). The callback URL a key first arrived with is the one it is completed at: once a
/// call of the key is accepted (that call, or a later one if the first's answer was lost or
/// came too late for its caller), the outcome, the result, is posted there `delay` later (the
/// signature that comes after the contract went out), once. A repeated key answers the first
/// acceptance again and calls nothing back (the contract: a repeated key returns the first
/// outcome and starts nothing). A callback answered 5xx or not at all is posted again with
/// back-off; any other answer ends it.
pub struct CallbackCompleter {
    inner: Arc<dyn RemoteService>,
    sink: Arc<dyn CallbackSink>,
    delay: Duration,
    clock: Arc<dyn Clock>,
    /// Each key seen: the callback address it first arrived with, and whether its callback is
    /// posted (or on its way).
    keys: Mutex<HashMap<String, (CallbackAddress, bool)>>,
    log: Option<CallbackLog>,
}

impl CallbackCompleter {
    pub fn new(
        inner: Arc<dyn RemoteService>,
        sink: Arc<dyn CallbackSink>,
        delay: Duration,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self {
            inner,
            sink,
            delay,
            clock,
            keys: Mutex::new(HashMap::new()),
            log: None,
        }
    }

    /// Records every callback posted in `log`.
    pub fn with_log(mut self, log: CallbackLog) -> Self {
        self.log = Some(log);
        self
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
        let key = work.idempotency_key.clone();
        let first_address = |keys: &mut HashMap<String, (CallbackAddress, bool)>| {
            keys.entry(key.clone())
                .or_insert_with(|| (address.clone(), false))
                .0
                .clone()
        };
        if let Ok(mut keys) = self.keys.lock() {
            first_address(&mut keys);
        }
        // Faults and refusals answer the request itself; a success is only an acceptance.
        let result = self.inner.call(&work, timeout).await?;
        let address = match self.keys.lock() {
            Ok(mut keys) => {
                let address = first_address(&mut keys);
                match keys.get_mut(&key) {
                    Some((_, posted)) if !*posted => {
                        *posted = true;
                        Some(address)
                    }
                    _ => None,
                }
            }
            Err(_) => None,
        };
        let Some(address) = address else {
            // The first acceptance's callback is on its way (or went): answer it again.
            return Ok(json!({"accepted": true}));
        };
        let (sink, delay, clock, log) = (
            self.sink.clone(),
            self.delay,
            self.clock.clone(),
            self.log.clone(),
        );
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let body = json!({"status": "succeeded", "result": result});
            let mut status = None;
            let mut pause = CALLBACK_RETRY_PAUSE;
            for _ in 0..CALLBACK_TRIES {
                match sink.post(&address.url, &body).await {
                    Ok(s) if s < 500 => {
                        status = Some(s);
                        break;
                    }
                    Ok(s) => {
                        status = Some(s);
                        warn!(%key, status = s, "callback answered with a server error; posting it again");
                    }
                    Err(e) => warn!(%key, error = %e, "callback not posted; posting it again"),
                }
                tokio::time::sleep(pause).await;
                pause *= 2;
            }
            if status.is_none_or(|s| s >= 300) {
                warn!(%key, ?status, "callback not accepted");
            }
            if let Some(log) = log
                && let Ok(mut log) = log.lock()
            {
                log.push(PostedCallback {
                    key,
                    at: clock.now(),
                    status,
                });
            }
        });
        Ok(json!({"accepted": true}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TaskId;
    use crate::ports::SystemClock;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// Applies every key on its first call but loses that call's answer (a transient fault).
    struct LosesFirstAnswer(AtomicU32);

    #[async_trait]
    impl RemoteService for LosesFirstAnswer {
        async fn call(&self, _: &RemoteCall, _: Duration) -> Result<Value, RemoteFault> {
            if self.0.fetch_add(1, Ordering::SeqCst) == 0 {
                Err(RemoteFault::Transient("the answer was lost".into()))
            } else {
                Ok(json!({"contract": "c-1"}))
            }
        }
    }

    #[derive(Default)]
    struct Posts(Mutex<Vec<String>>);

    #[async_trait]
    impl CallbackSink for Posts {
        async fn post(&self, url: &str, _: &Value) -> Result<u16, String> {
            self.0
                .lock()
                .map_err(|e| e.to_string())?
                .push(url.to_owned());
            Ok(202)
        }
    }

    fn call(url: &str) -> RemoteCall {
        RemoteCall {
            service: "e-sign".into(),
            step: "send-contract".into(),
            action: "send".into(),
            idempotency_key: "k-1".into(),
            task_id: TaskId::new_random(),
            undoes: None,
            input: json!({}),
            deadline: chrono::Utc::now(),
            callback: Some(CallbackAddress {
                token: url.into(),
                url: url.into(),
            }),
            limit_keys: Default::default(),
        }
    }

    #[tokio::test]
    async fn a_key_is_called_back_once_at_the_url_it_first_arrived_with() {
        let posts = Arc::new(Posts::default());
        let log = CallbackLog::default();
        let completer = CallbackCompleter::new(
            Arc::new(LosesFirstAnswer(AtomicU32::new(0))),
            posts.clone(),
            Duration::from_millis(1),
            Arc::new(SystemClock),
        )
        .with_log(log.clone());
        let t = Duration::from_secs(1);
        assert!(completer.call(&call("/first"), t).await.is_err());
        assert_eq!(
            completer.call(&call("/second"), t).await,
            Ok(json!({"accepted": true}))
        );
        assert_eq!(
            completer.call(&call("/third"), t).await,
            Ok(json!({"accepted": true}))
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        let posted = posts.0.lock().expect("posts").clone();
        assert_eq!(posted, vec!["/first".to_owned()]);
        let logged = log.lock().expect("log").clone();
        assert_eq!(logged.len(), 1);
        assert_eq!(
            (logged[0].key.as_str(), logged[0].status),
            ("k-1", Some(202))
        );
    }
}
