use super::SimulatedService;
use crate::ports::{RemoteCall, RemoteFault, RemoteService};
use async_trait::async_trait;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use std::sync::Arc;
use std::time::Duration;

/// The header that carries the idempotency key to the remote service.
pub const IDEMPOTENCY_HEADER: &str = "Idempotency-Key";
/// The header that names the task a call belongs to.
pub const TASK_HEADER: &str = "Sas-Task-Id";
/// The header that, on an undo, carries the idempotency key of the step it undoes.
pub const UNDOES_HEADER: &str = "Sas-Undoes";

/// A remote service over HTTP: `POST {base}/{action}` with the mapped input as the JSON body,
/// and the headers `Idempotency-Key`, `Sas-Task-Id` and (on an undo) `Sas-Undoes`. 2xx is
/// success; timeouts, connection errors, 408, 429 and 5xx are transient; any other status is
/// permanent.
#[derive(Debug, Clone)]
pub struct HttpRemote {
    client: reqwest::Client,
    base: url::Url,
}

impl HttpRemote {
    /// `base` is the service's root; a missing trailing `/` is added, so that `{base}/{action}`
    /// keeps every path segment of the base.
    pub fn new(client: reqwest::Client, mut base: url::Url) -> Self {
        if !base.path().ends_with('/') {
            let path = format!("{}/", base.path());
            base.set_path(&path);
        }
        Self { client, base }
    }
}

#[async_trait]
impl RemoteService for HttpRemote {
    async fn call(
        &self,
        call: &RemoteCall,
        timeout: Duration,
    ) -> Result<serde_json::Value, RemoteFault> {
        let url = self.base.join(&call.action).map_err(|e| {
            RemoteFault::Misconfigured(format!("bad action {:?}: {e}", call.action))
        })?;
        let mut req = self
            .client
            .post(url)
            .timeout(timeout)
            .header(IDEMPOTENCY_HEADER, &call.idempotency_key)
            .header(TASK_HEADER, call.task_id.to_string());
        if let Some(undoes) = &call.undoes {
            req = req.header(UNDOES_HEADER, undoes);
        }
        let resp = req
            .json(&call.input)
            .send()
            .await
            .map_err(|e| RemoteFault::Transient(format!("request failed: {e}")))?;
        let status = resp.status();
        let text = resp
            .text()
            .await
            .map_err(|e| RemoteFault::Transient(format!("reading the response failed: {e}")))?;
        if status.is_success() {
            return Ok(match serde_json::from_str(&text) {
                Ok(v) => v,
                Err(_) => serde_json::Value::String(text),
            });
        }
        let what = format!("{status}: {}", text.chars().take(200).collect::<String>());
        if status.is_server_error()
            || status == reqwest::StatusCode::TOO_MANY_REQUESTS
            || status == reqwest::StatusCode::REQUEST_TIMEOUT
        {
            Err(RemoteFault::Transient(what))
        } else {
            Err(RemoteFault::Refused {
                code: format!("http_{}", status.as_u16()),
                message: what,
            })
        }
    }
}

/// Serves a [`SimulatedService`] over HTTP with the contract [`HttpRemote`] speaks: 200 on
/// success, 503 on a transient fault, 422 on a permanent one, 400 without an idempotency key or
/// task id.
pub fn router(service: Arc<SimulatedService>) -> axum::Router {
    async fn handle(
        State(service): State<Arc<SimulatedService>>,
        Path(action): Path<String>,
        headers: HeaderMap,
        body: axum::Json<serde_json::Value>,
    ) -> axum::response::Response {
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        let Some(key) = header(IDEMPOTENCY_HEADER) else {
            return (StatusCode::BAD_REQUEST, "missing Idempotency-Key").into_response();
        };
        let Some(task_id) = header(TASK_HEADER).and_then(|t| t.parse().ok()) else {
            return (StatusCode::BAD_REQUEST, "missing or bad Sas-Task-Id").into_response();
        };
        let call = RemoteCall {
            service: service.name().to_owned(),
            step: "step".into(),
            action,
            idempotency_key: key.to_owned(),
            task_id,
            undoes: header(UNDOES_HEADER).map(str::to_owned),
            input: body.0,
            deadline: chrono::Utc::now() + chrono::Duration::seconds(30),
            callback: None,
        };
        match service.call(&call, Duration::from_secs(30)).await {
            Ok(v) => axum::Json(v).into_response(),
            Err(RemoteFault::Transient(e)) => (StatusCode::SERVICE_UNAVAILABLE, e).into_response(),
            Err(e @ RemoteFault::CircuitOpen { .. }) => {
                (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response()
            }
            Err(RemoteFault::InProgress(e)) => (StatusCode::CONFLICT, e).into_response(),
            Err(RemoteFault::Misconfigured(e)) => (StatusCode::UNAUTHORIZED, e).into_response(),
            Err(RemoteFault::Refused { code, message }) => (
                StatusCode::UNPROCESSABLE_ENTITY,
                axum::Json(serde_json::json!({"error": {"code": code, "message": message}})),
            )
                .into_response(),
        }
    }
    axum::Router::new()
        .route("/{action}", post(handle))
        .with_state(service)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::TaskId;
    use crate::ports::SystemClock;
    use crate::remote::Faults;

    async fn serve(service: Arc<SimulatedService>) -> url::Url {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().expect("addr");
        let app = axum::Router::new().nest("/v1", router(service));
        tokio::spawn(async move { axum::serve(listener, app).await });
        // No trailing slash: the client must keep the `/v1` segment.
        url::Url::parse(&format!("http://{addr}/v1")).expect("url")
    }

    #[tokio::test]
    async fn http_client_maps_statuses_and_sends_the_idempotency_key() {
        let sim = Arc::new(SimulatedService::new(
            "payment",
            Faults::default(),
            Arc::new(SystemClock),
        ));
        let remote = HttpRemote::new(reqwest::Client::new(), serve(sim.clone()).await);
        let call = RemoteCall {
            service: "payment".into(),
            step: "step".into(),
            action: "charge-payment".into(),
            idempotency_key: "o:charge-payment:charge-payment".into(),
            task_id: TaskId::new_random(),
            undoes: None,
            input: serde_json::json!({"items": [], "amount": 3}),
            deadline: chrono::Utc::now() + chrono::Duration::seconds(30),
            callback: None,
        };
        let first = remote
            .call(&call, Duration::from_secs(5))
            .await
            .expect("ok");
        let again = remote
            .call(&call, Duration::from_secs(5))
            .await
            .expect("ok");
        assert_eq!(first, again);
        assert_eq!(sim.stats().effects.get(&call.idempotency_key), Some(&1));
        assert_eq!(
            sim.stats().requests[0].input,
            call.input,
            "the body is the mapped input"
        );
        let undo = RemoteCall {
            action: "refund-payment".into(),
            idempotency_key: "o:charge-payment:refund-payment".into(),
            undoes: Some(call.idempotency_key.clone()),
            ..call.clone()
        };
        remote
            .call(&undo, Duration::from_secs(5))
            .await
            .expect("undo");
        assert_eq!(
            sim.stats().net.get(&call.idempotency_key),
            Some(&0),
            "Sas-Undoes reached it"
        );

        sim.set_faults(Faults {
            transient_rate: 1.0,
            ..Faults::default()
        });
        assert!(matches!(
            remote.call(&call, Duration::from_secs(5)).await,
            Err(RemoteFault::Transient(_))
        ));
        sim.set_faults(Faults {
            permanent_rate: 1.0,
            ..Faults::default()
        });
        let other = RemoteCall {
            idempotency_key: "other".into(),
            ..call.clone()
        };
        assert!(matches!(
            remote.call(&other, Duration::from_secs(5)).await,
            Err(RemoteFault::Refused { .. })
        ));
        sim.set_faults(Faults {
            latency: Duration::from_millis(500),
            ..Faults::default()
        });
        assert!(matches!(
            remote.call(&call, Duration::from_millis(50)).await,
            Err(RemoteFault::Transient(_))
        ));
    }
}
