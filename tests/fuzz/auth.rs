//! The task API's authentication: arbitrary credentials, through the local runner's authorizers
//! (SigV4 and JWT, the checks API Gateway makes in a stack) and then the handler.

use super::*;

/// The credentials of a request.
#[derive(Debug, Clone)]
enum AuthSpec {
    Absent,
    /// Arbitrary bytes as the `Authorization` header.
    Raw(Vec<u8>),
    /// A token that is not one (any text after the scheme).
    Junk {
        scheme: String,
        token: String,
    },
    /// A JWT of the issuer (or another key), for a caller, for an audience, live or expired.
    Jwt {
        who: usize,
        scheme: String,
        expired: bool,
        other_key: bool,
        other_audience: bool,
    },
    /// A SigV4 signature by a caller's key (or a wrong secret), at some skew, perhaps mangled
    /// at one place, perhaps over another path than the one requested.
    SigV4 {
        who: usize,
        wrong_secret: bool,
        skew_minutes: i64,
        mangle: Option<usize>,
        other_path: bool,
    },
}

/// What the request asks for.
#[derive(Debug, Clone, Copy)]
enum AuthRoute {
    Submit,
    List,
    ReadOwn,
    ReadOther,
    CancelOther,
}

const CALLERS: [&str; 2] = ["alice", "bob"];

fn auth_spec() -> BoxedStrategy<AuthSpec> {
    let scheme = prop::sample::select(vec!["Bearer ", "bearer ", "Bearer  ", "Basic ", ""])
        .prop_map(str::to_owned);
    prop_oneof![
        2 => Just(AuthSpec::Absent),
        2 => prop::collection::vec(any::<u8>(), 0..80).prop_map(AuthSpec::Raw),
        2 => (scheme.clone(), "\\PC{0,60}").prop_map(|(scheme, token)| AuthSpec::Junk { scheme, token }),
        6 => (0..2usize, prop_oneof![4 => Just("Bearer ".to_owned()), 1 => scheme], any::<bool>(), prop::bool::weighted(0.2), prop::bool::weighted(0.2))
            .prop_map(|(who, scheme, expired, other_key, other_audience)| AuthSpec::Jwt { who, scheme, expired, other_key, other_audience }),
        6 => (0..2usize, prop::bool::weighted(0.2), prop_oneof![4 => Just(0i64), 1 => (-40i64..40).prop_filter("not at the 15-minute edge", |m| m.abs() != 15)], prop::option::weighted(0.2, 0..200usize), prop::bool::weighted(0.2))
            .prop_map(|(who, wrong_secret, skew_minutes, mangle, other_path)| AuthSpec::SigV4 { who, wrong_secret, skew_minutes, mangle, other_path }),
    ]
    .boxed()
}

fn auth_route() -> impl Strategy<Value = AuthRoute> {
    prop::sample::select(vec![
        AuthRoute::Submit,
        AuthRoute::List,
        AuthRoute::ReadOwn,
        AuthRoute::ReadOther,
        AuthRoute::CancelOther,
    ])
}

/// The fixture: a system whose task API has the given authorizer, and one task per caller.
struct AuthFixture {
    system: System,
    issuer: sas_local::auth::TestIssuer,
    stranger: sas_local::auth::TestIssuer,
    users: Vec<sas_local::auth::LocalUser>,
    /// (IAM mode, caller) → that caller's task.
    tasks: HashMap<(bool, usize), String>,
}

const FUZZ_ISSUER: &str = "https://issuer.fuzz.invalid";

const FUZZ_AUDIENCE: &str = "sas-fuzz";

async fn auth_fixture() -> AuthFixture {
    use sas_local::auth::{LocalUser, TestIssuer};
    let users: Vec<LocalUser> = CALLERS
        .iter()
        .map(|n| LocalUser {
            access_key_id: format!("AKIA{}", n.to_uppercase()),
            secret_access_key: format!("{n}-secret"),
            arn: format!("arn:aws:iam::123456789012:user/{n}"),
        })
        .collect();
    let system = memory_system(Settings::default()).await;
    // One task per caller as each mode names it: the IAM user's ARN, or the JWT's `sub`.
    let mut tasks = HashMap::new();
    for iam in [true, false] {
        for (n, name) in CALLERS.iter().enumerate() {
            let id = if iam {
                users[n].arn.clone()
            } else {
                name.to_string()
            };
            let caller = sas::Caller::from_iam_arn(&id).expect("caller");
            let mut headers = HeaderMap::new();
            headers.insert("content-type", HeaderValue::from_static("application/json"));
            let resp = api::handle(
                &system.api,
                &sas::auth::Identity::Caller(caller),
                &Method::POST,
                "/workflows/ecommerce-order/tasks",
                &headers,
                json!({"customerId": "c-1", "items": [{"sku": "S", "quantity": 1}]})
                    .to_string()
                    .as_bytes(),
            )
            .await;
            let body: Value = serde_json::from_str(resp.body()).expect("JSON");
            tasks.insert(
                (iam, n),
                body["taskId"].as_str().expect("taskId").to_owned(),
            );
        }
    }
    AuthFixture {
        system,
        issuer: TestIssuer::generate(FUZZ_ISSUER).expect("issuer"),
        stranger: TestIssuer::generate(FUZZ_ISSUER).expect("issuer"),
        users,
        tasks,
    }
}

/// The SigV4 headers of a request (signed over `signed_path`), as an SDK makes them.
fn sigv4(
    user: &sas_local::auth::LocalUser,
    secret: &str,
    method: &Method,
    signed_path: &str,
    body: &[u8],
    at: std::time::SystemTime,
) -> Vec<(String, String)> {
    sas_blackbox::sigv4_headers(
        (&user.access_key_id, secret),
        method.as_str(),
        &format!("http://127.0.0.1:1{signed_path}"),
        &[("content-type", "application/json")],
        body,
        at,
    )
}

/// One authenticated request, checked: the authorizer names exactly the caller whose valid
/// credentials were sent (and no one otherwise); an unauthenticated request is a 401 that
/// writes nothing; an authenticated one never reaches another caller's task.
async fn auth_case(
    f: &AuthFixture,
    iam: bool,
    spec: &AuthSpec,
    route: AuthRoute,
) -> Result<(), TestCaseError> {
    use sas_local::auth::{JwtCheck, LocalAuth, SigV4Check};
    let auth = if iam {
        LocalAuth::Iam(std::sync::Arc::new(
            SigV4Check::new(f.users.clone()).expect("users"),
        ))
    } else {
        LocalAuth::Jwt(std::sync::Arc::new(JwtCheck::new(
            FUZZ_ISSUER,
            vec![FUZZ_AUDIENCE.into()],
            f.issuer.jwks().clone(),
        )))
    };
    let order = json!({"customerId": "c-2", "items": [{"sku": "S", "quantity": 1}]}).to_string();
    let (method, path, body): (Method, String, Vec<u8>) = match route {
        AuthRoute::Submit => (
            Method::POST,
            "/workflows/ecommerce-order/tasks".into(),
            order.into_bytes(),
        ),
        AuthRoute::List => (Method::GET, "/tasks".into(), vec![]),
        AuthRoute::ReadOwn | AuthRoute::ReadOther | AuthRoute::CancelOther => {
            // The task of the caller the credentials name (alice's if none), or the other's.
            let who = match spec {
                AuthSpec::Jwt { who, .. } | AuthSpec::SigV4 { who, .. } => *who,
                _ => 0,
            };
            let whose = if matches!(route, AuthRoute::ReadOwn) {
                who
            } else {
                1 - who
            };
            let id = &f.tasks[&(iam, whose)];
            if matches!(route, AuthRoute::CancelOther) {
                (Method::POST, format!("/tasks/{id}/cancel"), vec![])
            } else {
                (Method::GET, format!("/tasks/{id}"), vec![])
            }
        }
    };
    let mut headers = HeaderMap::new();
    headers.insert("host", HeaderValue::from_static("127.0.0.1:1"));
    headers.insert("content-type", HeaderValue::from_static("application/json"));
    let now = Utc::now();
    let hour = chrono::Duration::hours(1);
    let mut expect: Option<usize> = None;
    match spec {
        AuthSpec::Absent => {}
        AuthSpec::Raw(bytes) => {
            if let Ok(v) = HeaderValue::from_bytes(bytes) {
                headers.insert("authorization", v);
            }
        }
        AuthSpec::Junk { scheme, token } => {
            if let Ok(v) = HeaderValue::from_str(&format!("{scheme}{token}")) {
                headers.insert("authorization", v);
            }
        }
        AuthSpec::Jwt {
            who,
            scheme,
            expired,
            other_key,
            other_audience,
        } => {
            let issuer = if *other_key { &f.stranger } else { &f.issuer };
            let audience = if *other_audience {
                "another-api"
            } else {
                FUZZ_AUDIENCE
            };
            let token = issuer
                .token(
                    CALLERS[*who],
                    audience,
                    &[],
                    now,
                    if *expired { -hour } else { hour },
                )
                .expect("token");
            headers.insert(
                "authorization",
                HeaderValue::from_str(&format!("{scheme}{token}")).expect("header"),
            );
            if !iam
                && scheme.eq_ignore_ascii_case("Bearer ")
                && !expired
                && !other_key
                && !other_audience
            {
                expect = Some(*who);
            }
        }
        AuthSpec::SigV4 {
            who,
            wrong_secret,
            skew_minutes,
            mangle,
            other_path,
        } => {
            let user = &f.users[*who];
            let secret = if *wrong_secret {
                "guessed"
            } else {
                user.secret_access_key.as_str()
            };
            let at = std::time::SystemTime::from(now + chrono::Duration::minutes(*skew_minutes));
            let signed_path = if *other_path {
                "/tasks/elsewhere"
            } else {
                path.as_str()
            };
            for (k, v) in sigv4(user, secret, &method, signed_path, &body, at) {
                let mut v = v;
                if k == "authorization"
                    && let Some(i) = mangle
                {
                    // Change one character of the signature (its hex digits are at the end).
                    let pos = v.len() - 1 - (i % 64);
                    let c = v.as_bytes()[pos];
                    let swapped = if c == b'0' { '1' } else { '0' };
                    v.replace_range(pos..=pos, &swapped.to_string());
                }
                headers.insert(
                    http::HeaderName::from_bytes(k.as_bytes()).expect("name"),
                    HeaderValue::from_str(&v).expect("value"),
                );
            }
            if iam && !wrong_secret && skew_minutes.abs() <= 14 && mangle.is_none() && !other_path {
                expect = Some(*who);
            }
        }
    }
    let identity = auth.identify(&method, &path, &headers, &body);
    match (&identity, expect) {
        (sas::auth::Identity::Caller(c), Some(who)) => {
            let want = if iam {
                f.users[who].arn.as_str()
            } else {
                CALLERS[who]
            };
            prop_assert_eq!(c.as_str(), want, "{:?}", spec)
        }
        (sas::auth::Identity::Unauthenticated(_), None) => {}
        (got, want) => prop_assert!(false, "{spec:?} named {got:?}, expected caller {want:?}"),
    }
    let before = f.system.memory.as_ref().expect("memory").0.all_states();
    let resp = api::handle(&f.system.api, &identity, &method, &path, &headers, &body).await;
    let status = resp.status();
    prop_assert!(!status.is_server_error(), "{spec:?} {route:?}: {status}");
    let answer: Value = serde_json::from_str(resp.body())
        .map_err(|e| TestCaseError::fail(format!("not JSON ({e}): {}", resp.body())))?;
    match expect {
        None => {
            prop_assert_eq!(status, StatusCode::UNAUTHORIZED, "{:?}: {}", spec, answer);
            prop_assert_eq!(&answer["error"]["code"], "unauthenticated");
            let after = f.system.memory.as_ref().expect("memory").0.all_states();
            prop_assert_eq!(before, after, "a 401 writes nothing");
        }
        Some(_) => match route {
            AuthRoute::Submit => prop_assert_eq!(status, StatusCode::ACCEPTED, "{}", answer),
            AuthRoute::List | AuthRoute::ReadOwn => {
                prop_assert_eq!(status, StatusCode::OK, "{}", answer)
            }
            AuthRoute::ReadOther | AuthRoute::CancelOther => {
                prop_assert_eq!(status, StatusCode::NOT_FOUND, "{}", answer);
                prop_assert_eq!(&answer["error"]["code"], "task_not_found");
            }
        },
    }
    Ok(())
}

#[test]
fn credentials_name_exactly_their_caller_and_nothing_else_gets_through() {
    let rt = runtime();
    let fixture = rt.block_on(auth_fixture());
    let mut runner = TestRunner::new(config(512));
    let result = runner.run(
        &(any::<bool>(), auth_spec(), auth_route()),
        |(iam, spec, route)| rt.block_on(auth_case(&fixture, iam, &spec, route)),
    );
    if let Err(e) = result {
        panic!("{e}");
    }
}
