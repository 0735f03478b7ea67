//! The task API's authentication, black-box over HTTP on the local runner in each mode (`None`,
//! `IAM` with SigV4-signed requests, `JWT` with the local issuer's tokens), and through the
//! rendered template (each `ApiAuth` value gives the routes the authorization it names).
//!
//! In every authenticated mode: no credentials → 401; another caller's task → 404 (as if it
//! did not exist), also for a cancel; an operator sees it; the same `Idempotency-Key` from two
//! callers → two tasks; a forged or expired token → 401; a reply queue outside the pattern →
//! 400 and nothing written; the caller sees no internals; actions record who acted.

use chrono::Utc;
use reqwest::{Method, StatusCode};
use sas_blackbox::{manual_settings, memory_system, order_input, template};
use sas_local::auth::{JwtCheck, LocalAuth, LocalUser, SigV4Check, TestIssuer};
use sas_local::{LOCAL_REPLY_PREFIX, System};
use serde_json::{Value, json};
use std::sync::Arc;

const AUDIENCE: &str = "sas-tests";
const ISSUER: &str = "https://issuer.sas-tests.invalid";

fn user(name: &str) -> LocalUser {
    LocalUser {
        access_key_id: format!("AKIA{}", name.to_uppercase()),
        secret_access_key: format!("{name}-secret-{}", uuid::Uuid::new_v4()),
        arn: format!("arn:aws:iam::123456789012:user/{name}"),
    }
}

/// How a request proves who it is.
#[derive(Clone)]
enum Cred {
    Nothing,
    Sign(LocalUser),
    Bearer(String),
}

struct Api {
    base: String,
    http: reqwest::Client,
}

impl Api {
    async fn call(
        &self,
        cred: &Cred,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&Value>,
    ) -> (StatusCode, Value) {
        let url = format!("{}{path}", self.base);
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let mut all: Vec<(String, String)> = headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        if !body.is_empty() {
            all.push(("content-type".into(), "application/json".into()));
        }
        match cred {
            Cred::Nothing => {}
            Cred::Bearer(t) => all.push(("authorization".into(), format!("Bearer {t}"))),
            Cred::Sign(u) => all.extend(sign(u, method.as_str(), &url, &all, body.as_bytes())),
        }
        let mut req = self.http.request(method, &url).body(body);
        for (k, v) in &all {
            req = req.header(k, v);
        }
        let resp = req.send().await.expect("the API answers");
        let status = resp.status();
        let text = resp.text().await.expect("a body");
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    async fn get(&self, cred: &Cred, path: &str) -> (StatusCode, Value) {
        self.call(cred, Method::GET, path, &[], None).await
    }

    async fn post(
        &self,
        cred: &Cred,
        path: &str,
        headers: &[(&str, &str)],
        body: &Value,
    ) -> (StatusCode, Value) {
        self.call(cred, Method::POST, path, headers, Some(body))
            .await
    }
}

/// SigV4 headers for a request, as `awscurl` or an SDK would make them.
fn sign(
    u: &LocalUser,
    method: &str,
    url: &str,
    headers: &[(String, String)],
    body: &[u8],
) -> Vec<(String, String)> {
    let headers: Vec<(&str, &str)> = headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    sas_blackbox::sigv4_headers(
        (&u.access_key_id, &u.secret_access_key),
        method,
        url,
        &headers,
        body,
        std::time::SystemTime::now(),
    )
}

/// A memory system served on loopback with the given authorizers.
async fn serve(api: LocalAuth, operator: LocalAuth) -> (System, Api) {
    serve_limited(api, operator, None).await
}

/// A memory system served on loopback with the given authorizers and rate limit.
async fn serve_limited(
    api: LocalAuth,
    operator: LocalAuth,
    rate_limit: Option<sas::domain::rate::RateLimit>,
) -> (System, Api) {
    let mut settings = manual_settings();
    settings.api_auth = api;
    settings.operator_auth = operator;
    settings.rate_limit = rate_limit;
    let mut system = memory_system(settings).await;
    let addr = sas_blackbox::serve_system(&mut system).await;
    let api = Api {
        base: format!("http://{addr}"),
        http: reqwest::Client::new(),
    };
    (system, api)
}

/// How many tasks the (in-memory) system holds.
async fn task_items(system: &System) -> usize {
    system
        .memory
        .as_ref()
        .expect("memory backend")
        .0
        .all_states()
        .len()
}

/// A refusal: `want`, with the error code `code`.
fn assert_error(status: StatusCode, body: &Value, want: StatusCode, code: &str, what: &str) {
    assert_eq!(status, want, "{what}: {body}");
    assert_eq!(body["error"]["code"], code, "{body}");
}

/// A 401 with the code `unauthenticated`.
fn assert_unauthenticated((status, body): &(StatusCode, Value), what: &str) {
    assert_error(
        *status,
        body,
        StatusCode::UNAUTHORIZED,
        "unauthenticated",
        what,
    );
}

fn task_id(body: &Value) -> String {
    body["taskId"].as_str().expect("taskId").to_owned()
}

/// Everything every authenticated mode must hold, for callers `alice` and `bob` and an
/// operator (SigV4, always), on the served system.
async fn callers_are_kept_apart(system: &System, api: &Api, alice: Cred, bob: Cred, ops: Cred) {
    let order = order_input();
    let submit = "/workflows/ecommerce-order/tasks";
    // No credentials: 401 on every task route, nothing written.
    let before = task_items(system).await;
    for (method, path) in [
        (Method::POST, submit.to_owned()),
        (Method::GET, "/tasks".to_owned()),
        (Method::GET, format!("/tasks/{}", uuid::Uuid::new_v4())),
        (
            Method::POST,
            format!("/tasks/{}/cancel", uuid::Uuid::new_v4()),
        ),
        (Method::GET, "/operator/tasks?state=Pending".to_owned()),
    ] {
        let what = format!("{method} {path}");
        let answer = api.call(&Cred::Nothing, method, &path, &[], Some(&order));
        assert_unauthenticated(&answer.await, &what);
    }
    assert_eq!(
        task_items(system).await,
        before,
        "a refused request writes nothing"
    );

    // Alice's task: hers to read, not Bob's (404, exactly as for no task at all).
    let (status, created) = api
        .post(&alice, submit, &[("idempotency-key", "k-1")], &order)
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{created}");
    let id = task_id(&created);
    let (status, mine) = api.get(&alice, &format!("/tasks/{id}")).await;
    assert_eq!(status, StatusCode::OK, "{mine}");
    assert_eq!(mine["input"], order);
    for internal in [
        "lockedBy",
        "completeBy",
        "attempt",
        "failureCount",
        "round",
        "lastError",
    ] {
        assert!(
            mine.get(internal).is_none(),
            "a caller sees {internal}: {mine}"
        );
    }
    assert!(
        mine["history"]
            .as_array()
            .is_some_and(|h| h.iter().all(|e| e.get("reason").is_none())),
        "no raw reasons without publicErrors: {mine}"
    );
    let (status, theirs) = api.get(&bob, &format!("/tasks/{id}")).await;
    let (_, nothing) = api
        .get(&bob, &format!("/tasks/{}", uuid::Uuid::new_v4()))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{theirs}");
    assert_eq!(theirs["error"]["code"], nothing["error"]["code"]);
    // The operator sees it, with sas's internals and its caller.
    let (status, seen) = api.get(&ops, &format!("/operator/tasks/{id}")).await;
    assert_eq!(status, StatusCode::OK, "{seen}");
    assert_eq!(seen["taskId"], id.as_str());
    assert!(
        seen.get("lockedBy").is_some() && seen.get("attempt").is_some(),
        "{seen}"
    );
    assert!(
        seen["caller"].as_str().is_some_and(|c| !c.is_empty()),
        "{seen}"
    );

    // The same key from Bob is Bob's own: a second task. Alice's replay is her first task.
    let (status, bobs) = api
        .post(&bob, submit, &[("idempotency-key", "k-1")], &order)
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{bobs}");
    assert_ne!(task_id(&bobs), id, "another caller's key is not shared");
    let (status, again) = api
        .post(&alice, submit, &[("idempotency-key", "k-1")], &order)
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{again}");
    assert_eq!(task_id(&again), id, "a replay of alice's own key");

    // Lists: each caller's own tasks only.
    let (status, list) = api.get(&alice, "/tasks").await;
    assert_eq!(status, StatusCode::OK, "{list}");
    let ids: Vec<&str> = list["tasks"]
        .as_array()
        .expect("tasks")
        .iter()
        .filter_map(|t| t["taskId"].as_str())
        .collect();
    assert_eq!(ids, vec![id.as_str()], "{list}");

    // A reply queue outside the pattern: 400, nothing written; inside it: accepted.
    let before = task_items(system).await;
    for bad in [
        "https://sqs.us-east-1.amazonaws.com/123456789012/sas-dev-work".to_owned(),
        "memory://sas/work".to_owned(),
        format!("memory://sas/{LOCAL_REPLY_PREFIX}"),
    ] {
        let (status, body) = api
            .post(&alice, submit, &[("reply-queue-url", &bad)], &order)
            .await;
        let code = "invalid_reply_queue_url";
        assert_error(status, &body, StatusCode::BAD_REQUEST, code, &bad);
    }
    assert_eq!(
        task_items(system).await,
        before,
        "a refused reply queue writes nothing"
    );
    let good = format!("memory://sas/{LOCAL_REPLY_PREFIX}shop");
    let (status, body) = api
        .post(&alice, submit, &[("reply-queue-url", &good)], &order)
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");

    // Bob cannot cancel Alice's task (404); Alice can, and the history names her.
    let cancel = format!("/tasks/{id}/cancel");
    let why = json!({"reason": "ordered twice"});
    let (status, _) = api.post(&bob, &cancel, &[], &why).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, body) = api.post(&alice, &cancel, &[], &why).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let (_, seen) = api.get(&ops, &format!("/operator/tasks/{id}")).await;
    let last = seen["history"]
        .as_array()
        .and_then(|h| h.last())
        .cloned()
        .unwrap_or_default();
    assert_eq!(last["by"], seen["caller"], "{seen}");
    assert_eq!(last["reason"], "caller cancel: ordered twice", "{seen}");
    // ...and so does the cancel's event, as an operator's action names the operator.
    let bus = &system.memory.as_ref().expect("memory").2;
    let cancelled: Vec<Value> = bus
        .published()
        .into_iter()
        .filter(|(t, d)| t == "TaskCancelled" && d["taskId"] == id.as_str())
        .map(|(_, d)| d)
        .collect();
    assert_eq!(cancelled.len(), 1, "{cancelled:?}");
    assert_eq!(cancelled[0]["by"], seen["caller"], "{cancelled:?}");
    assert_eq!(cancelled[0]["reason"], "caller cancel: ordered twice");
    // An operator's retry of another task records the operator.
    let (_, other) = api
        .post(&bob, submit, &[("idempotency-key", "k-2")], &order)
        .await;
    let other = task_id(&other);
    let (status, body) = api
        .post(
            &ops,
            &format!("/operator/tasks/{other}/cancel"),
            &[],
            &json!({"reason": "fraud check"}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let last = body["history"]
        .as_array()
        .and_then(|h| h.last())
        .cloned()
        .unwrap_or_default();
    assert_eq!(last["reason"], "operator cancel: fraud check", "{body}");
    assert!(
        last["by"].as_str().is_some_and(|b| b != body["caller"]),
        "the operator, not the caller: {body}"
    );
}

#[tokio::test]
async fn iam_mode_checks_sigv4_and_keeps_callers_apart() {
    let (alice, bob, operator) = (user("alice"), user("bob"), user("operator"));
    let users = vec![alice.clone(), bob.clone(), operator.clone()];
    let check = LocalAuth::Iam(Arc::new(SigV4Check::new(users).expect("users")));
    let (system, api) = serve(check.clone(), check).await;
    callers_are_kept_apart(
        &system,
        &api,
        Cred::Sign(alice.clone()),
        Cred::Sign(bob),
        Cred::Sign(operator.clone()),
    )
    .await;
    // A signature with a wrong secret, or by an unknown key: 401, the body naming why (and
    // no secret).
    for (forged, why) in [
        (
            LocalUser {
                secret_access_key: "guessed".into(),
                ..alice.clone()
            },
            "the signature does not match",
        ),
        (user("mallory"), "unknown access key"),
    ] {
        let (status, body) = api.get(&Cred::Sign(forged), "/tasks").await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(why), "{body}");
        assert!(!message.contains("guessed"), "{body}");
    }
    // A caller's credentials are no operator's: the operator API needs its own principal,
    // and a bearer token means nothing to SigV4.
    let (status, _) = api.get(&Cred::Bearer("x.y.z".into()), "/tasks").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn jwt_mode_checks_tokens_and_keeps_callers_apart() {
    let issuer = TestIssuer::generate(ISSUER).expect("issuer");
    let jwt = LocalAuth::Jwt(Arc::new(JwtCheck::new(
        ISSUER,
        vec![AUDIENCE.into()],
        issuer.jwks().clone(),
    )));
    let operator = user("operator");
    let ops = LocalAuth::Iam(Arc::new(
        SigV4Check::new(vec![operator.clone()]).expect("users"),
    ));
    let (system, api) = serve(jwt, ops).await;
    let now = Utc::now();
    let hour = chrono::Duration::hours(1);
    let token = |sub: &str| issuer.token(sub, AUDIENCE, &[], now, hour).expect("token");
    callers_are_kept_apart(
        &system,
        &api,
        Cred::Bearer(token("alice")),
        Cred::Bearer(token("bob")),
        Cred::Sign(operator),
    )
    .await;
    // Expired, for another audience, signed by another key, or tampered with: 401.
    let stranger = TestIssuer::generate(ISSUER).expect("issuer");
    let good = token("alice");
    let mut parts: Vec<&str> = good.split('.').collect();
    let bob_claims = token("bob");
    parts[1] = bob_claims.split('.').nth(1).expect("payload");
    for bad in [
        issuer
            .token("alice", AUDIENCE, &[], now, -hour)
            .expect("token"),
        issuer
            .token("alice", "another-api", &[], now, hour)
            .expect("token"),
        stranger
            .token("alice", AUDIENCE, &[], now, hour)
            .expect("token"),
        parts.join("."),
        "not-a-jwt".into(),
    ] {
        let answer = api.get(&Cred::Bearer(bad), "/tasks").await;
        assert_unauthenticated(&answer, "a refused token");
    }
}

/// A schedule's tasks belong to `arn:sas:schedule:<name>`: a token whose subject (or client id)
/// has that form, however well signed, is refused (401, saying the id is reserved) on every
/// task route, so it can neither list nor read nor cancel the schedule's tasks, nor take a
/// run's idempotency key first; nothing is written, and the schedule's task is untouched.
#[tokio::test]
async fn a_token_whose_subject_is_a_schedule_is_refused() {
    let issuer = TestIssuer::generate(ISSUER).expect("issuer");
    let jwt = LocalAuth::Jwt(Arc::new(JwtCheck::new(
        ISSUER,
        vec![AUDIENCE.into()],
        issuer.jwks().clone(),
    )));
    let ops = LocalAuth::Iam(Arc::new(
        SigV4Check::new(vec![user("operator")]).expect("users"),
    ));
    let (system, api) = serve(jwt, ops).await;
    let order = order_input();
    // The schedule `nightly`'s task, as its run starts it (the run's time its key).
    let run_key = "2026-11-28T01:00:00Z";
    let scheduled = sas::handlers::start::start(
        &system.scheduler.ports,
        sas::handlers::start::StartRequest {
            caller: &sas::Caller::schedule("nightly").expect("caller"),
            workflow: "ecommerce-order",
            input: order.clone(),
            key: Some(run_key.into()),
            reply_queue_url: None,
            start_at: None,
            turn: None,
            child: None,
            priority: Default::default(),
            dispatch: None,
        },
    )
    .await
    .expect("the schedule's task")
    .task_id;
    let before = task_items(&system).await;
    let state = system.store.get_state(scheduled).await.expect("read");
    let now = Utc::now();
    let hour = chrono::Duration::hours(1);
    let by_sub = issuer
        .token("arn:sas:schedule:nightly", AUDIENCE, &[], now, hour)
        .expect("token");
    let cred = Cred::Bearer(by_sub);
    for (method, path, headers) in [
        (Method::GET, "/tasks".to_owned(), vec![]),
        (Method::GET, format!("/tasks/{scheduled}"), vec![]),
        (Method::POST, format!("/tasks/{scheduled}/cancel"), vec![]),
        (
            Method::POST,
            "/workflows/ecommerce-order/tasks".to_owned(),
            vec![("idempotency-key", run_key)],
        ),
    ] {
        let what = format!("{method} {path}");
        let answer = api.call(&cred, method, &path, &headers, Some(&order)).await;
        assert_unauthenticated(&answer, &what);
        let message = answer.1["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("arn:sas:schedule:nightly") && message.contains("reserved"),
            "{what}: the refusal says why: {message}"
        );
    }
    assert_eq!(task_items(&system).await, before, "nothing written");
    assert_eq!(
        system.store.get_state(scheduled).await.expect("read"),
        state,
        "the schedule's task is untouched"
    );
}

#[tokio::test]
async fn none_mode_is_one_anonymous_caller() {
    let (system, api) = serve(LocalAuth::None, LocalAuth::None).await;
    let order = order_input();
    let (status, created) = api
        .post(
            &Cred::Nothing,
            "/workflows/ecommerce-order/tasks",
            &[],
            &order,
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{created}");
    let id = task_id(&created);
    let (status, seen) = api.get(&Cred::Nothing, &format!("/tasks/{id}")).await;
    assert_eq!(status, StatusCode::OK, "{seen}");
    let (_, ops) = api
        .get(&Cred::Nothing, &format!("/operator/tasks/{id}"))
        .await;
    assert_eq!(ops["caller"], "anonymous", "{ops}");
    assert_eq!(task_items(&system).await, 1);
}

#[tokio::test]
async fn a_caller_over_its_rate_gets_429_with_retry_after_and_others_go_on() {
    let (alice, bob) = (user("alice"), user("bob"));
    let check = LocalAuth::Iam(Arc::new(
        SigV4Check::new(vec![alice.clone(), bob.clone()]).expect("users"),
    ));
    let limit = sas::domain::rate::RateLimit {
        per_second: 0.2,
        burst: 2,
    };
    let (_system, api) = serve_limited(check.clone(), check, Some(limit)).await;
    let (alice, bob) = (Cred::Sign(alice), Cred::Sign(bob));
    for _ in 0..2 {
        let (status, body) = api.get(&alice, "/tasks").await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    let resp = api
        .http
        .get(format!("{}/tasks", api.base))
        .headers(
            sign(
                match &alice {
                    Cred::Sign(u) => u,
                    _ => unreachable!(),
                },
                "GET",
                &format!("{}/tasks", api.base),
                &[],
                b"",
            )
            .into_iter()
            .map(|(k, v)| {
                (
                    reqwest::header::HeaderName::from_bytes(k.as_bytes()).expect("name"),
                    reqwest::header::HeaderValue::from_str(&v).expect("value"),
                )
            })
            .collect(),
        )
        .send()
        .await
        .expect("answers");
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    let wait: u64 = resp
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .expect("Retry-After in seconds");
    assert!(
        (1..=5).contains(&wait),
        "one interval of 5 s at most: {wait}"
    );
    let body: Value = resp.json().await.expect("JSON");
    assert_eq!(body["error"]["code"], "rate_limited", "{body}");
    // Another caller is not held back; an unauthenticated request is refused before counting.
    let (status, _) = api.get(&bob, "/tasks").await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = api.get(&Cred::Nothing, "/tasks").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

/// The rendered template, with its conditions evaluated for each `ApiAuth`.
#[test]
fn each_api_auth_value_gives_the_task_routes_its_authorization() {
    let t = template::Template::load();
    let task_routes = [
        "StartTaskRoute",
        "ListTasksRoute",
        "GetTaskRoute",
        "StepResultRoute",
        "CancelTaskRoute",
    ];
    for (mode, want) in [("IAM", "AWS_IAM"), ("JWT", "JWT"), ("None", "NONE")] {
        let params = [
            ("ApiAuth", mode),
            ("JwtIssuer", ISSUER),
            ("JwtWriteScopes", "tasks/write"),
        ];
        for route in task_routes {
            let props = t.evaluated_properties(route, &params);
            assert_eq!(props["AuthorizationType"], want, "{mode} {route}: {props}");
            assert_eq!(
                props.get("AuthorizerId").is_some(),
                mode == "JWT",
                "{mode} {route}: {props}"
            );
            let scoped = mode == "JWT" && matches!(route, "StartTaskRoute" | "CancelTaskRoute");
            assert_eq!(
                props.get("AuthorizationScopes").is_some(),
                scoped,
                "{mode} {route}: {props}"
            );
        }
        // The operator API is IAM whatever the mode; the callback route is the token's.
        assert_eq!(
            t.evaluated_properties("OperatorRoute", &params)["AuthorizationType"],
            "AWS_IAM"
        );
        assert_eq!(
            t.evaluated_properties("CallbackRoute", &params)["AuthorizationType"],
            "NONE"
        );
        assert_eq!(
            t.condition_holds("AuthJwt", &params),
            mode == "JWT",
            "the authorizer exists only for JWT"
        );
        assert_eq!(
            t.condition_holds("AuthNone", &params),
            mode == "None",
            "the stack warns exactly when it is open"
        );
    }
    // The warning output is there, under AuthNone; IAM is the default.
    assert_eq!(t.json["Outputs"]["ApiAuthWarning"]["Condition"], "AuthNone");
    assert_eq!(t.parameter_default("ApiAuth").as_deref(), Some("IAM"));
    assert_eq!(t.json["Resources"]["JwtAuthorizer"]["Condition"], "AuthJwt");
    // The access log names the caller.
    let format = t.evaluated_properties("HttpApiStage", &[])["AccessLogSettings"]["Format"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        format.contains("$context.identity.userArn")
            && format.contains("$context.authorizer.claims.sub"),
        "{format}"
    );
}
