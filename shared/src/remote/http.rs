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

/// A remote service over HTTP: `POST {base}/{action}` with a JSON body and an
/// `Idempotency-Key` header. 2xx is success; timeouts, connection errors, 408, 429 and 5xx are
/// transient; any other status is permanent.
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
        let url = self
            .base
            .join(&call.action)
            .map_err(|e| RemoteFault::Permanent(format!("bad action {:?}: {e}", call.action)))?;
        let body = serde_json::json!({"orderId": call.order_id, "payload": call.payload});
        let resp = self
            .client
            .post(url)
            .timeout(timeout)
            .header(IDEMPOTENCY_HEADER, &call.idempotency_key)
            .json(&body)
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
            Err(RemoteFault::Permanent(what))
        }
    }
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct CallBody {
    order_id: crate::domain::OrderId,
    #[serde(default)]
    payload: serde_json::Value,
}

/// Serves a [`SimulatedService`] over HTTP with the contract [`HttpRemote`] speaks: 200 on
/// success, 503 on a transient fault, 422 on a permanent one, 400 without an idempotency key.
pub fn router(service: Arc<SimulatedService>) -> axum::Router {
    async fn handle(
        State(service): State<Arc<SimulatedService>>,
        Path(action): Path<String>,
        headers: HeaderMap,
        body: axum::Json<CallBody>,
    ) -> axum::response::Response {
        let Some(key) = headers
            .get(IDEMPOTENCY_HEADER)
            .and_then(|v| v.to_str().ok())
        else {
            return (StatusCode::BAD_REQUEST, "missing Idempotency-Key").into_response();
        };
        let call = RemoteCall {
            action,
            idempotency_key: key.to_owned(),
            order_id: body.order_id,
            payload: body.0.payload,
        };
        match service.call(&call, Duration::from_secs(30)).await {
            Ok(v) => axum::Json(v).into_response(),
            Err(RemoteFault::Transient(e)) => (StatusCode::SERVICE_UNAVAILABLE, e).into_response(),
            Err(e @ RemoteFault::CircuitOpen { .. }) => {
                (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response()
            }
            Err(RemoteFault::Permanent(e)) => (StatusCode::UNPROCESSABLE_ENTITY, e).into_response(),
        }
    }
    axum::Router::new()
        .route("/{action}", post(handle))
        .with_state(service)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::OrderId;
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
            action: "charge-payment".into(),
            idempotency_key: "o:charge-payment:charge-payment".into(),
            order_id: OrderId::new_random(),
            payload: serde_json::json!({"items": []}),
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
            Err(RemoteFault::Permanent(_))
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
