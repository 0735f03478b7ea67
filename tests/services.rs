//! Services' credentials from the real Secrets Manager and SSM APIs (on the emulator, through
//! the real SDK clients), and a whole task run against HTTP services that demand them.

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use sas::ProcessState;
use sas::aws::AwsCredentials;
use sas::catalog;
use sas::domain::workflow::CredentialSource;
use sas::remote::Credentials;
use sas_blackbox::{
    manual_settings, pump_until_quiet, sdk_config, serve_loopback, state, submit_ok, unique,
};
use std::sync::{Arc, Mutex};

/// Stores `value` as the newest version of the existing secret `name`.
async fn rotate_secret(config: &aws_config::SdkConfig, name: &str, value: &str) {
    let secrets = aws_sdk_secretsmanager::Client::new(config);
    let rotation = secrets.put_secret_value().secret_id(name);
    rotation
        .secret_string(value)
        .send()
        .await
        .expect("rotate the secret");
}

#[tokio::test]
async fn secrets_and_parameters_are_read_with_the_real_clients() {
    let config = sdk_config().await;
    let secret = format!("sas/test/{}", unique("token"));
    sas_blackbox::put_secret(&config, &secret, "s3cret-value").await;
    let parameter = format!("/sas/test/{}", unique("key"));
    sas_blackbox::put_parameter(&config, &parameter, "p4ram-value").await;

    let creds = AwsCredentials::from_config(&config);
    let got = creds
        .read(&CredentialSource::Secret(secret.clone()))
        .await
        .expect("the secret");
    assert_eq!(got.expose(), "s3cret-value");
    assert_eq!(format!("{got:?}"), "***");
    let got = creds
        .read(&CredentialSource::Parameter(parameter.clone()))
        .await
        .expect("the parameter, decrypted");
    assert_eq!(got.expose(), "p4ram-value");

    for missing in [
        CredentialSource::Secret(format!("{secret}-missing")),
        CredentialSource::Parameter(format!("{parameter}-missing")),
    ] {
        let e = creds.read(&missing).await.expect_err("missing");
        assert_eq!(e.from, missing);
        let text = e.to_string();
        assert!(text.contains("-missing"), "names the source: {text}");
        assert!(
            !text.contains("s3cret") && !text.contains("p4ram"),
            "{text}"
        );
    }
}

/// The simulated services over HTTP, answering 401 unless `Authorization: Bearer <expected>`.
async fn guarded(expected: Arc<Mutex<String>>) -> String {
    async fn check(
        State(expected): State<Arc<Mutex<String>>>,
        req: Request,
        next: Next,
    ) -> Response {
        let want = format!("Bearer {}", expected.lock().expect("lock"));
        let got = req
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        if got != Some(want.as_str()) {
            return (StatusCode::UNAUTHORIZED, "bad token").into_response();
        }
        next.run(req).await
    }
    let app = sas_blackbox::simulated_services(&["inventory", "payment", "shipping"]);
    serve_loopback(app.layer(middleware::from_fn_with_state(expected, check))).await
}

#[tokio::test]
async fn a_task_runs_on_http_services_with_a_rotated_bearer_token() {
    let config = sdk_config().await;
    let secret = format!("sas/test/{}", unique("bearer"));
    sas_blackbox::put_secret(&config, &secret, "first").await;
    let expected = Arc::new(Mutex::new("first".to_owned()));
    let base = guarded(expected.clone()).await;
    let services: String = ["inventory", "payment", "shipping"]
        .iter()
        .map(|name| {
            format!(
                "  - name: {name}\n    target:\n      type: http\n      baseUrl: {base}/{name}\n      auth: {{type: bearer, secret: \"{secret}\"}}\n"
            )
        })
        .collect();
    let mut files = catalog::example_files();
    files[0].1 = format!("services:\n{services}");
    files.retain(|(name, _)| name != "loan-application.yaml" && name != "order-triage.yaml");
    let settings = sas_local::Settings {
        definitions: files,
        credentials: Arc::new(AwsCredentials::from_config(&config)),
        ..manual_settings()
    };
    let system = sas_blackbox::memory_system(settings).await;

    let first = submit_ok(&system).await;
    pump_until_quiet(&system, 30).await;
    let r = state(&system, first).await;
    assert_eq!(r.process_state, ProcessState::Processed, "{r:?}");

    // Rotated at the source and at the service: the kept token is refused once (401, not a
    // refusal: the task does not fail), dropped, and the new one read.
    rotate_secret(&config, &secret, "second").await;
    *expected.lock().expect("lock") = "second".to_owned();
    let second = submit_ok(&system).await;
    pump_until_quiet(&system, 30).await;
    let r = state(&system, second).await;
    assert_eq!(r.process_state, ProcessState::Processed, "{r:?}");
    system.shutdown().await;
}
