//! `sasctl` signs its requests with SigV4, and an IAM-authorized operator API accepts them:
//! the local runner's operator API with local users (the check API Gateway makes in a stack).

use aws_credential_types::Credentials;
use aws_credential_types::provider::SharedCredentialsProvider;
use sas::local::auth::{LocalAuth, LocalUser, SigV4Check};
use sas::local::{Backend, Settings, System};
use sasctl::sign::Signer;
use sasctl::{Client, ClientError, ProcessState};
use std::sync::Arc;

fn signer(user: &LocalUser) -> Signer {
    Signer::new(
        SharedCredentialsProvider::new(Credentials::new(
            &user.access_key_id,
            &user.secret_access_key,
            None,
            None,
            "test",
        )),
        "us-east-1",
    )
}

#[tokio::test]
async fn a_signed_sasctl_reaches_an_iam_operator_api_and_an_unsigned_one_does_not() {
    // The CLI path signs with the environment's credentials (the test command exports
    // AWS_ACCESS_KEY_ID=test, AWS_SECRET_ACCESS_KEY=test, AWS_REGION=us-east-1).
    let env_user = LocalUser {
        access_key_id: std::env::var("AWS_ACCESS_KEY_ID").unwrap_or_else(|_| "test".into()),
        secret_access_key: std::env::var("AWS_SECRET_ACCESS_KEY").unwrap_or_else(|_| "test".into()),
        arn: "arn:aws:iam::123456789012:user/operator".into(),
    };
    let ops = LocalAuth::Iam(Arc::new(
        SigV4Check::new("us-east-1", vec![env_user.clone()]).expect("users"),
    ));
    let settings = Settings {
        operator_auth: ops,
        ..Settings::default()
    };
    let mut system = System::new(Backend::Memory, settings, Arc::new(sas::ports::SystemClock))
        .await
        .expect("system");
    let addr = system
        .serve("127.0.0.1:0".parse().expect("addr"))
        .await
        .expect("serves");
    let base: url::Url = format!("http://{addr}/operator").parse().expect("url");

    let signed = Client::new(base.clone())
        .expect("client")
        .signed(signer(&env_user));
    let page = signed
        .list(&ProcessState::Pending, None, Some(5), None)
        .await
        .expect("a signed request is accepted");
    assert!(page.tasks.is_empty());

    let unsigned = Client::new(base.clone()).expect("client");
    let refused = unsigned
        .list(&ProcessState::Pending, None, None, None)
        .await;
    assert!(
        matches!(refused, Err(ClientError::Api { status: 401, ref code, .. }) if code == "unauthenticated"),
        "{refused:?}"
    );
    let forged = Client::new(base.clone())
        .expect("client")
        .signed(signer(&LocalUser {
            secret_access_key: "guessed".into(),
            ..env_user.clone()
        }));
    assert!(matches!(
        forged.list(&ProcessState::Pending, None, None, None).await,
        Err(ClientError::Api { status: 401, .. })
    ));

    // The command line: `--sign always` signs with the environment's credentials; the
    // default (`auto`) does not sign a loopback endpoint.
    use clap::Parser;
    let run = |sign: &'static str| {
        let base = base.to_string();
        async move {
            let cli = sasctl::Cli::try_parse_from([
                "sasctl",
                "--endpoint",
                &base,
                "--sign",
                sign,
                "workflow",
                "list",
            ])
            .expect("args");
            let (mut out, mut err) = (Vec::new(), Vec::new());
            let code = sasctl::cli::run_with(cli, &mut out, &mut err)
                .await
                .expect("runs");
            (
                code,
                String::from_utf8_lossy(&out).into_owned() + &String::from_utf8_lossy(&err),
            )
        }
    };
    let (code, text) = run("always").await;
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("ecommerce-order"), "{text}");
    let (code, text) = run("auto").await;
    assert_eq!(code, 1, "unsigned to an IAM API: {text}");
    assert!(text.contains("unauthenticated"), "{text}");
}
