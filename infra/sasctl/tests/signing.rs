//! `sasctl` signs its requests with SigV4, and an IAM-authorized operator API accepts them:
//! the local runner's operator API with local users (the check API Gateway makes in a stack).

use aws_credential_types::Credentials;
use aws_credential_types::provider::SharedCredentialsProvider;
use sas_local::auth::{LocalAuth, LocalUser, SigV4Check};
use sas_local::{Backend, Settings, System};
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

/// A memory system whose operator API accepts SigV4 requests by `user` only.
fn iam_operator_api(user: &LocalUser) -> Settings {
    let check = SigV4Check::new(vec![user.clone()]).expect("users");
    Settings {
        operator_auth: LocalAuth::Iam(Arc::new(check)),
        ..Settings::default()
    }
}

/// A memory system with `settings`, served on loopback; its address.
async fn served(settings: Settings) -> (System, std::net::SocketAddr) {
    let clock = Arc::new(sas::ports::SystemClock);
    let mut system = System::new(Backend::Memory, settings, clock)
        .await
        .expect("system");
    let addr = system
        .serve("127.0.0.1:0".parse().expect("addr"))
        .await
        .expect("serves");
    (system, addr)
}

/// Runs `sasctl` with the command line `argv`: its exit code, stdout and stderr.
async fn run_cli<T: Into<std::ffi::OsString> + Clone>(
    argv: impl IntoIterator<Item = T>,
) -> (i32, String, String) {
    use clap::Parser;
    let cli = sasctl::Cli::try_parse_from(argv).expect("args");
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = sasctl::cli::run_with(cli, &mut out, &mut err)
        .await
        .expect("runs");
    (
        code,
        String::from_utf8_lossy(&out).into_owned(),
        String::from_utf8_lossy(&err).into_owned(),
    )
}

/// `GET url`, which must answer.
async fn get(http: &reqwest::Client, url: String) -> reqwest::Response {
    http.get(url).send().await.expect("answers")
}

/// Starts an e-commerce order through the task API (as the anonymous local caller); its id.
async fn submit_order(system: &System) -> String {
    let resp = sas::api::handle(
        &system.api,
        &sas::auth::Identity::anonymous(),
        &http::Method::POST,
        "/workflows/ecommerce-order/tasks",
        &http::HeaderMap::new(),
        br#"{"customerId": "c-1", "items": [{"sku": "SKU-1", "quantity": 1}]}"#,
    )
    .await;
    assert_eq!(resp.status(), 202, "{}", resp.body());
    let body: serde_json::Value = serde_json::from_str(resp.body()).expect("json");
    body["taskId"].as_str().expect("taskId").to_owned()
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
    let (_system, addr) = served(iam_operator_api(&env_user)).await;
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
    // A 401 says what the request was signed with: the key id and region, never the secret.
    let refused = forged.list(&ProcessState::Pending, None, None, None).await;
    let Err(ClientError::Api {
        status: 401,
        message,
        ..
    }) = refused
    else {
        panic!("{refused:?}")
    };
    assert!(
        message.contains(&format!(
            "(signed (SigV4, execute-api, region us-east-1) with access key {} (from the AWS configuration",
            env_user.access_key_id
        )) && !message.contains("guessed"),
        "{message}"
    );

    // The command line: `--sign always` signs with the environment's credentials, and so does
    // the default (`auto`) on a loopback endpoint when the environment names them; `never`
    // does not, and its 401 says so.
    let run = |sign: &'static str| {
        let base = base.to_string();
        async move {
            let argv = ["sasctl", "--endpoint", &base, "--sign", sign];
            let (code, out, err) = run_cli(argv.into_iter().chain(["workflow", "list"])).await;
            (code, out + &err)
        }
    };
    let (code, text) = run("always").await;
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("ecommerce-order"), "{text}");
    assert!(
        std::env::var_os("AWS_ACCESS_KEY_ID").is_some(),
        "the test signs with the environment's credentials"
    );
    let (code, text) = run("auto").await;
    assert_eq!(code, 0, "{text}");
    let (code, text) = run("never").await;
    assert_eq!(code, 1, "unsigned to an IAM API: {text}");
    assert!(
        text.contains("unauthenticated") && text.contains("(sent unsigned: sasctl signs"),
        "{text}"
    );
}

/// `sasctl console` serves the console on loopback and signs what it forwards: the browser
/// needs no credentials, the IAM-only operator API gets signed requests.
#[tokio::test]
async fn the_console_proxy_signs_what_it_forwards_and_nothing_else() {
    let user = LocalUser {
        access_key_id: "AKIDCONSOLE".into(),
        secret_access_key: "console-secret".into(),
        arn: "arn:aws:iam::123456789012:user/console-operator".into(),
    };
    let (system, addr) = served(iam_operator_api(&user)).await;
    let endpoint: url::Url = format!("http://{addr}/operator").parse().expect("url");
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    // Unsigned, the console is the operator API's and refuses.
    let direct = get(&http, format!("http://{addr}/operator/console")).await;
    assert_eq!(direct.status().as_u16(), 401);

    let (bound, serving) = sasctl::console::bind(
        &endpoint,
        Some(signer(&user)),
        "127.0.0.1:0".parse().expect("addr"),
    )
    .await
    .expect("binds");
    let proxy = tokio::spawn(serving);
    let page = get(
        &http,
        format!("http://{bound}/operator/console?state=Pending"),
    )
    .await;
    assert_eq!(page.status().as_u16(), 200);
    assert_eq!(
        page.headers()["content-type"],
        "text/html; charset=utf-8",
        "the console's own headers come through"
    );
    assert!(page.headers().contains_key("content-security-policy"));
    assert!(page.text().await.expect("body").contains("Pending tasks"));
    // `/` is the console.
    let root = get(&http, format!("http://{bound}/")).await;
    assert_eq!(root.status().as_u16(), 303);
    assert_eq!(root.headers()["location"], "/operator/console");
    // Nothing but the console is forwarded: not the JSON API, not the task API.
    for path in [
        "/operator/tasks?state=Error",
        "/workflows/ecommerce-order/tasks",
    ] {
        let resp = get(&http, format!("http://{bound}{path}")).await;
        assert_eq!(resp.status().as_u16(), 404, "{path}");
    }
    // A page that reached the proxy under another host name (DNS rebinding) is refused.
    let rebound = http
        .get(format!("http://{bound}/operator/console"))
        .header("host", format!("evil.example:{}", bound.port()))
        .send()
        .await
        .expect("answers");
    assert_eq!(rebound.status().as_u16(), 403);
    // A form through the proxy: signed, applied, recorded under the signer's principal.
    let id = submit_order(&system).await;
    let cancel = http
        .post(format!("http://{bound}/operator/console/tasks/{id}/cancel"))
        .header("sec-fetch-site", "same-origin")
        .header("content-type", "application/x-www-form-urlencoded")
        .body("reason=from+the+proxy")
        .send()
        .await
        .expect("answers");
    assert_eq!(cancel.status().as_u16(), 303, "{:?}", cancel.text().await);
    let r = system
        .store
        .get_state(id.parse().expect("id"))
        .await
        .expect("read")
        .expect("record");
    let last = r.history.last().expect("history");
    assert_eq!(last.reason, "operator cancel: from the proxy");
    assert_eq!(last.by.as_deref(), Some(user.arn.as_str()));
    proxy.abort();
}

/// `sasctl submit` starts a task from a file, once per idempotency key.
#[tokio::test]
async fn sasctl_submit_starts_a_task_once_per_key() {
    let (system, addr) = served(Settings::default()).await;
    let dir = std::env::temp_dir().join(format!("sasctl-submit-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).expect("dir");
    let input = dir.join("order.json");
    std::fs::write(
        &input,
        r#"{"customerId": "c-9", "items": [{"sku": "SKU-9", "quantity": 3}]}"#,
    )
    .expect("write");
    let bad = dir.join("bad.json");
    std::fs::write(&bad, r#"{"customerId": ""}"#).expect("write");
    let endpoint = format!("http://{addr}/operator");
    let run = |file: std::path::PathBuf, key: &'static str| {
        let endpoint = endpoint.clone();
        async move {
            use clap::Parser;
            let cli = sasctl::Cli::try_parse_from([
                "sasctl",
                "--endpoint",
                &endpoint,
                "--json",
                "submit",
                "ecommerce-order",
                "--input",
                &format!("@{}", file.to_str().expect("utf-8 path")),
                "--idempotency-key",
                key,
            ])
            .expect("args");
            let mut out = Vec::new();
            let code = sasctl::run(cli, &mut out).await.expect("runs");
            let doc: serde_json::Value = serde_json::from_slice(&out).expect("one JSON document");
            (code, doc)
        }
    };
    let (code, first) = run(input.clone(), "order-9").await;
    assert_eq!(code, 0, "{first}");
    let (code, again) = run(input.clone(), "order-9").await;
    assert_eq!(code, 0, "{again}");
    assert_eq!(
        first["taskId"], again["taskId"],
        "the same key, the same task"
    );
    let id: sas::TaskId = first["taskId"].as_str().expect("id").parse().expect("id");
    let (task, _) = system.store.get(id).await.expect("read").expect("task");
    assert_eq!(task.input["items"][0]["sku"], "SKU-9");
    let (code, refused) = run(bad, "order-10").await;
    assert_eq!(code, 1, "{refused}");
    assert_eq!(refused["error"]["code"], "validation_failed", "{refused}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--stack NAME` finds the operator API in the stack's `OperatorApiUrl` output (here a stack
/// on the AWS API emulator whose output names a local runner), and the paging hints repeat it.
#[tokio::test]
async fn sasctl_finds_the_operator_api_in_the_stacks_outputs() {
    let (system, addr) = served(Settings::default()).await;
    for _ in 0..2 {
        submit_order(&system).await;
    }
    let config = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .load()
        .await;
    let cfn = aws_sdk_cloudformation::Client::new(&config);
    let stack = format!(
        "sas-stack-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let template = serde_json::json!({
        "Resources": {"Queue": {"Type": "AWS::SQS::Queue"}},
        "Outputs": {
            "OperatorApiUrl": {"Value": format!("http://{addr}/operator")},
            "ApiUrl": {"Value": format!("http://{addr}")}
        }
    });
    cfn.create_stack()
        .stack_name(&stack)
        .template_body(template.to_string())
        .send()
        .await
        .expect("stack created on the emulator");
    let found = sasctl::stack::operator_endpoint_with(&cfn, &stack)
        .await
        .expect("output read");
    assert_eq!(found.as_str(), format!("http://{addr}/operator"));

    let argv = |rest: &[&str]| {
        let mut v: Vec<String> = vec!["sasctl".into(), "--stack".into(), stack.clone()];
        v.extend(rest.iter().map(|s| (*s).to_owned()));
        v
    };
    let (code, out, err) = run_cli(argv(&["list", "--state", "Processing", "--limit", "1"])).await;
    assert_eq!(code, 0, "{err}");
    let hint = out
        .lines()
        .find_map(|l| l.strip_prefix("more: "))
        .unwrap_or_else(|| panic!("a paging hint: {out}"));
    assert!(
        hint.starts_with(&format!("sasctl --stack {stack} list --state Processing")),
        "{hint}"
    );
    // A stack that does not exist: a transport-class error naming it, JSON under --json.
    let no_stack = ["--json", "--stack", "no-such-stack", "workflow", "list"];
    let (code, out, err) = run_cli(["sasctl"].into_iter().chain(no_stack)).await;
    assert_eq!(code, 3, "{out}{err}");
    let doc: serde_json::Value = serde_json::from_str(&out).expect("one JSON document");
    let error = sas::api::error::code_and_message(&doc);
    assert!(
        error.is_some_and(|(code, m)| code == "stack" && m.contains("no-such-stack")),
        "{doc}"
    );
}
