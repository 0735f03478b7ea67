//! The simulated services over HTTP: [`router`] serves a [`SimulatedService`] with the
//! contract [`sas::remote::HttpRemote`] speaks, so that tests and the local runner can put a
//! simulated service behind a real HTTP target.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use sas::ports::{RemoteCall, RemoteFault, RemoteService};
use sas::remote::{IDEMPOTENCY_HEADER, STEP_HEADER, SimulatedService, TASK_HEADER, UNDOES_HEADER};
use std::sync::Arc;
use std::time::Duration;

/// Serves a [`SimulatedService`] over HTTP with the contract [`sas::remote::HttpRemote`] speaks: 200 on
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
            step: header(STEP_HEADER).unwrap_or("step").to_owned(),
            action,
            idempotency_key: key.to_owned(),
            task_id,
            undoes: header(UNDOES_HEADER).map(str::to_owned),
            input: body.0,
            deadline: chrono::Utc::now() + chrono::Duration::seconds(30),
            callback: None,
            limit_keys: Default::default(),
        };
        match service.call(&call, Duration::from_secs(30)).await {
            Ok(v) => axum::Json(v).into_response(),
            Err(RemoteFault::Transient(e)) => (StatusCode::SERVICE_UNAVAILABLE, e).into_response(),
            Err(e @ (RemoteFault::CircuitOpen { .. } | RemoteFault::Limited { .. })) => {
                (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response()
            }
            Err(e @ RemoteFault::TooLarge(_)) => {
                (StatusCode::BAD_GATEWAY, e.to_string()).into_response()
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
    use sas::domain::TaskId;
    use sas::domain::workflow::HttpTarget;
    use sas::ports::SystemClock;
    use sas::remote::{CachedCredentials, Faults, HttpRemote, MemoryCredentials, http_client};
    use serde_json::json;

    fn none() -> Arc<CachedCredentials> {
        Arc::new(CachedCredentials::new(
            Arc::new(MemoryCredentials::default()),
            chrono::Duration::seconds(300),
            Arc::new(SystemClock),
        ))
    }

    fn target(v: serde_json::Value) -> HttpTarget {
        serde_json::from_value(v).expect("an HTTP target")
    }

    async fn serve(service: Arc<SimulatedService>) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().expect("addr");
        let app = axum::Router::new().nest("/v1", router(service));
        tokio::spawn(async move { axum::serve(listener, app).await });
        // No trailing slash: the client must keep the `/v1` segment.
        format!("http://{addr}/v1")
    }

    #[tokio::test]
    async fn http_client_speaks_to_the_simulated_service() {
        let sim = Arc::new(SimulatedService::new(
            "payment",
            Faults::default(),
            Arc::new(SystemClock),
        ));
        let remote = HttpRemote::new(
            http_client().expect("client"),
            &target(json!({"baseUrl": serve(sim.clone()).await})),
            none(),
        )
        .expect("remote");
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
            limit_keys: Default::default(),
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
