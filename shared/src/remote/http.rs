//! Real services over HTTP: each action's method and path (a template over the call), static
//! headers, a credential read at run time, and the status mapping that says which answers are
//! refusals, which are worth retrying and which need an operator.

use super::credentials::{CachedCredentials, Secret};
use super::{MAX_ANSWER_BYTES, MAX_TEXT_BYTES, cap};
use crate::domain::workflow::{
    AuthScheme, CredentialSource, HttpMethod, HttpTarget, PathPart, PathTemplate, StatusOverrides,
};
use crate::ports::{RemoteCall, RemoteFault, RemoteService};
use async_trait::async_trait;
use percent_encoding::{AsciiSet, CONTROLS, utf8_percent_encode};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tracing::warn;

/// The header that carries the idempotency key to the remote service.
pub const IDEMPOTENCY_HEADER: &str = "Idempotency-Key";
/// The header that names the task a call belongs to.
pub const TASK_HEADER: &str = "Sas-Task-Id";
/// The header that names the step a call performs (or undoes).
pub const STEP_HEADER: &str = "Sas-Step";
/// The header that carries the step's deadline (RFC 3339, milliseconds, UTC).
pub const DEADLINE_HEADER: &str = "Sas-Deadline";
/// The header that, on an undo, carries the idempotency key of the step it undoes.
pub const UNDOES_HEADER: &str = "Sas-Undoes";
/// The headers that, on a callback step, say where and with what token to complete it.
pub const CALLBACK_URL_HEADER: &str = "Sas-Callback-Url";
pub const CALLBACK_TOKEN_HEADER: &str = "Sas-Callback-Token";

/// What a path segment must not hold as it is: everything but RFC 3986's unreserved
/// characters is percent-encoded, so a value is always exactly one segment.
const SEGMENT: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'$')
    .add(b'%')
    .add(b'&')
    .add(b'\'')
    .add(b'(')
    .add(b')')
    .add(b'*')
    .add(b'+')
    .add(b',')
    .add(b'/')
    .add(b':')
    .add(b';')
    .add(b'<')
    .add(b'=')
    .add(b'>')
    .add(b'?')
    .add(b'@')
    .add(b'[')
    .add(b'\\')
    .add(b']')
    .add(b'^')
    .add(b'`')
    .add(b'{')
    .add(b'|')
    .add(b'}');

/// The longest refusal code taken from a body.
const MAX_CODE_CHARS: usize = 64;
/// How much of a body a fault's message quotes.
const QUOTED_CHARS: usize = 200;

/// Builds the HTTP client for services: it never follows a redirect (a redirected POST would
/// become a GET), so a 3xx is seen, and read as a misconfiguration.
pub fn client() -> Result<reqwest::Client, reqwest::Error> {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
}

/// How an answer's status is read, before the body is looked at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusClass {
    Success,
    Transient,
    InProgress,
    Misconfigured,
    Refused,
}

/// The status mapping: 2xx success; 408, 425, 429 and 5xx transient; 409 in progress; 400 and
/// 422 refused; anything else (401, 403, 404, 405, other 4xx, 1xx, 3xx) misconfigured, so an
/// expired token or a wrong base path never refuses (and compensates) a task. A service's
/// `statuses` override the codes they name (never a 2xx: validation refuses that).
pub fn classify(status: u16, overrides: &StatusOverrides) -> StatusClass {
    if (200..=299).contains(&status) {
        return StatusClass::Success;
    }
    if overrides.refuse.contains(&status) {
        return StatusClass::Refused;
    }
    if overrides.transient.contains(&status) {
        return StatusClass::Transient;
    }
    if overrides.misconfigured.contains(&status) {
        return StatusClass::Misconfigured;
    }
    match status {
        408 | 425 | 429 | 500..=599 => StatusClass::Transient,
        409 => StatusClass::InProgress,
        400 | 422 => StatusClass::Refused,
        _ => StatusClass::Misconfigured,
    }
}

/// The outcome of an answer (`status`, body `text`): the result, or the fault. A refusal's
/// message is capped at [`MAX_TEXT_BYTES`]; the other faults quote the body's start.
pub fn outcome(status: u16, text: &str, overrides: &StatusOverrides) -> Result<Value, RemoteFault> {
    let quoted = || {
        format!(
            "HTTP {status}: {}",
            text.chars().take(QUOTED_CHARS).collect::<String>()
        )
    };
    match classify(status, overrides) {
        StatusClass::Success => Ok(if text.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
        }),
        StatusClass::Transient => Err(RemoteFault::Transient(quoted())),
        StatusClass::InProgress => Err(RemoteFault::InProgress(quoted())),
        StatusClass::Misconfigured => Err(RemoteFault::Misconfigured(quoted())),
        StatusClass::Refused => {
            let body: Option<Value> = serde_json::from_str(text).ok();
            let field = |name: &str| {
                body.as_ref().and_then(|b| {
                    b.get("error")
                        .and_then(|e| e.get(name))
                        .and_then(Value::as_str)
                        .or_else(|| b.get(name).and_then(Value::as_str))
                        .map(str::to_owned)
                })
            };
            let code = field("code")
                .filter(|c| !c.is_empty() && c.chars().count() <= MAX_CODE_CHARS)
                .unwrap_or_else(|| format!("http_{status}"));
            let message = field("message").map_or_else(
                || text.chars().take(QUOTED_CHARS).collect(),
                |m| cap(&m, MAX_TEXT_BYTES),
            );
            Err(RemoteFault::Refused { code, message })
        }
    }
}

/// Renders `template` on `context`: each placeholder's value (a string or a number) becomes
/// one percent-encoded path segment; anything else is a misconfiguration.
pub fn render_path(template: &PathTemplate, context: &Value) -> Result<String, RemoteFault> {
    let mut out = String::new();
    for part in &template.parts {
        match part {
            PathPart::Literal(text) => out.push_str(text),
            PathPart::Placeholder { source, query } => {
                let found = jsonpath_rust::query::js_path_process(query, context)
                    .ok()
                    .and_then(|refs| refs.into_iter().next())
                    .map(|r| r.val.clone());
                let raw = match found {
                    Some(Value::String(s)) => s,
                    Some(Value::Number(n)) => n.to_string(),
                    Some(other) => {
                        return Err(RemoteFault::Misconfigured(format!(
                            "path placeholder {{{source}}} selects {}, not a string or a number",
                            kind(&other)
                        )));
                    }
                    None => {
                        return Err(RemoteFault::Misconfigured(format!(
                            "path placeholder {{{source}}} selects nothing"
                        )));
                    }
                };
                out.extend(utf8_percent_encode(&raw, SEGMENT));
            }
        }
    }
    Ok(out)
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// How calls are authenticated.
#[derive(Debug, Clone)]
struct Auth {
    scheme: AuthScheme,
    source: CredentialSource,
    header: Option<http::HeaderName>,
}

/// A remote service over HTTP, as its [`HttpTarget`] declares: `{method} {baseUrl}{path}` for
/// a declared action, `POST {baseUrl}/{action}` otherwise, with the headers `Idempotency-Key`,
/// `Sas-Task-Id`, `Sas-Step`, `Sas-Deadline`, `Sas-Undoes` (undos), `Sas-Callback-Url` and
/// `Sas-Callback-Token` (callback steps), the static headers and the credential; the body is
/// the mapped input (none for GET and DELETE when it is null). Answers are read by
/// [`outcome`].
#[derive(Debug, Clone)]
pub struct HttpRemote {
    client: reqwest::Client,
    base: url::Url,
    headers: http::HeaderMap,
    auth: Option<Auth>,
    actions: HashMap<String, (HttpMethod, PathTemplate)>,
    statuses: StatusOverrides,
    credentials: Arc<CachedCredentials>,
}

impl HttpRemote {
    /// Compiles `target` (already validated at publish; the error says what is still wrong).
    /// `client` should not follow redirects ([`client`]).
    pub fn new(
        client: reqwest::Client,
        target: &HttpTarget,
        credentials: Arc<CachedCredentials>,
    ) -> Result<Self, String> {
        let base = url::Url::parse(&target.base_url)
            .map_err(|e| format!("baseUrl {:?}: {e}", target.base_url))?;
        let mut headers = http::HeaderMap::new();
        for (name, value) in &target.headers {
            let n = http::HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| format!("header {name:?}: not a header name"))?;
            let v = http::HeaderValue::from_str(value)
                .map_err(|_| format!("header {name:?}: not a header value"))?;
            headers.insert(n, v);
        }
        let auth = match &target.auth {
            None => None,
            Some(a) => Some(Auth {
                scheme: a.scheme,
                source: a
                    .source()
                    .ok_or("auth: give exactly one of `secret` or `parameter`")?,
                header: match (&a.header, a.scheme) {
                    (Some(h), AuthScheme::ApiKey) => Some(
                        http::HeaderName::from_bytes(h.as_bytes())
                            .map_err(|_| format!("auth header {h:?}: not a header name"))?,
                    ),
                    (None, AuthScheme::ApiKey) => {
                        return Err("auth: an apiKey needs its header".into());
                    }
                    _ => None,
                },
            }),
        };
        let mut actions = HashMap::new();
        for (name, a) in &target.actions {
            let template =
                PathTemplate::parse(&a.path).map_err(|e| format!("action {name:?}: {e}"))?;
            actions.insert(name.clone(), (a.method, template));
        }
        Ok(Self {
            client,
            base,
            headers,
            auth,
            actions,
            statuses: target.statuses.clone(),
            credentials,
        })
    }

    /// The method and URL of `call`.
    fn address(&self, call: &RemoteCall) -> Result<(HttpMethod, url::Url), RemoteFault> {
        let (method, path) = match self.actions.get(&call.action) {
            Some((method, template)) => {
                let context = serde_json::json!({
                    "input": call.input,
                    "task": {"id": call.task_id.to_string()},
                    "step": call.step,
                    "action": call.action,
                });
                (*method, render_path(template, &context)?)
            }
            None => (
                HttpMethod::Post,
                format!("/{}", utf8_percent_encode(&call.action, SEGMENT)),
            ),
        };
        let mut url = self.base.clone();
        let joined = format!("{}{path}", self.base.path().trim_end_matches('/'));
        url.set_path(&joined);
        Ok((method, url))
    }

    /// Adds the credential to `req`.
    async fn authorize(
        &self,
        auth: &Auth,
        req: reqwest::RequestBuilder,
    ) -> Result<reqwest::RequestBuilder, RemoteFault> {
        let secret: Secret = self
            .credentials
            .get(&auth.source)
            .await
            .map_err(|e| RemoteFault::Misconfigured(e.to_string()))?;
        let unusable =
            |what: &str| RemoteFault::Misconfigured(format!("credential {} {what}", auth.source));
        Ok(match (auth.scheme, &auth.header) {
            (AuthScheme::Bearer, _) => req.bearer_auth(secret.expose().trim()),
            (AuthScheme::ApiKey, Some(header)) => {
                let mut value = http::HeaderValue::from_str(secret.expose().trim())
                    .map_err(|_| unusable("is not a valid header value"))?;
                value.set_sensitive(true);
                req.header(header.clone(), value)
            }
            (AuthScheme::ApiKey, None) => return Err(unusable("has no header to go in")),
            (AuthScheme::Basic, _) => {
                #[derive(serde::Deserialize)]
                struct Basic {
                    username: String,
                    password: String,
                }
                let b: Basic = serde_json::from_str(secret.expose())
                    .map_err(|_| unusable("is not JSON {\"username\", \"password\"}"))?;
                req.basic_auth(b.username, Some(b.password))
            }
        })
    }
}

#[async_trait]
impl RemoteService for HttpRemote {
    async fn call(&self, call: &RemoteCall, timeout: Duration) -> Result<Value, RemoteFault> {
        let (method, url) = self.address(call)?;
        let m = match method {
            HttpMethod::Get => reqwest::Method::GET,
            HttpMethod::Post => reqwest::Method::POST,
            HttpMethod::Put => reqwest::Method::PUT,
            HttpMethod::Patch => reqwest::Method::PATCH,
            HttpMethod::Delete => reqwest::Method::DELETE,
        };
        let mut req = self
            .client
            .request(m, url)
            .timeout(timeout)
            .headers(self.headers.clone())
            .header(IDEMPOTENCY_HEADER, &call.idempotency_key)
            .header(TASK_HEADER, call.task_id.to_string())
            .header(STEP_HEADER, &call.step)
            .header(
                DEADLINE_HEADER,
                call.deadline
                    .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            );
        if let Some(undoes) = &call.undoes {
            req = req.header(UNDOES_HEADER, undoes);
        }
        if let Some(callback) = &call.callback {
            let mut token = http::HeaderValue::from_str(&callback.token).map_err(|_| {
                RemoteFault::Misconfigured("the callback token is not a header value".into())
            })?;
            token.set_sensitive(true);
            req = req
                .header(CALLBACK_URL_HEADER, &callback.url)
                .header(CALLBACK_TOKEN_HEADER, token);
        }
        let bodiless =
            matches!(method, HttpMethod::Get | HttpMethod::Delete) && call.input.is_null();
        if !bodiless {
            req = req.json(&call.input);
        }
        if let Some(auth) = &self.auth {
            req = self.authorize(auth, req).await?;
        }
        let resp = req.send().await.map_err(|e| {
            if e.is_builder() {
                RemoteFault::Misconfigured(format!("request not built: {e}"))
            } else {
                RemoteFault::Transient(format!("request failed: {e}"))
            }
        })?;
        let status = resp.status().as_u16();
        if matches!(status, 401 | 403)
            && let Some(auth) = &self.auth
        {
            // The credential may have been rotated: read it again on the next call.
            self.credentials.forget(&auth.source);
            warn!(service = %call.service, status, source = %auth.source, "credential refused; it will be read again");
        }
        let (body, more) = read_at_most(resp, MAX_ANSWER_BYTES)
            .await
            .map_err(|e| RemoteFault::Transient(format!("reading the response failed: {e}")))?;
        if more && classify(status, &self.statuses) == StatusClass::Success {
            warn!(service = %call.service, status, "the service's answer is over the limit; not read further");
            return Err(RemoteFault::TooLarge(format!(
                "HTTP {status}: the service's answer is over {MAX_ANSWER_BYTES} bytes"
            )));
        }
        outcome(status, &String::from_utf8_lossy(&body), &self.statuses)
    }
}

/// The first `limit` bytes of `resp`'s body, and whether it has more: read chunk by chunk and
/// no further than `limit` + 1 bytes, so an endless or huge answer costs bounded memory (the
/// connection is dropped with the rest unread).
pub async fn read_at_most(
    mut resp: reqwest::Response,
    limit: usize,
) -> Result<(Vec<u8>, bool), reqwest::Error> {
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await? {
        let room = limit + 1 - body.len();
        body.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if body.len() > limit {
            body.truncate(limit);
            return Ok((body, true));
        }
    }
    Ok((body, false))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::TaskId;
    use crate::ports::{CallbackAddress, OffsetClock};
    use crate::remote::credentials::{Credentials, MemoryCredentials};
    use axum::extract::State;
    use axum::http::{HeaderMap, StatusCode};
    use serde_json::json;
    use std::collections::VecDeque;
    use std::sync::Mutex;

    fn credentials(memory: Arc<MemoryCredentials>) -> Arc<CachedCredentials> {
        Arc::new(CachedCredentials::new(
            memory,
            chrono::Duration::seconds(300),
            Arc::new(OffsetClock::default()),
        ))
    }

    fn none() -> Arc<CachedCredentials> {
        credentials(Arc::new(MemoryCredentials::default()))
    }

    fn target(v: Value) -> HttpTarget {
        serde_json::from_value(v).expect("an HTTP target")
    }

    fn call(action: &str, input: Value) -> RemoteCall {
        RemoteCall {
            service: "bank".into(),
            step: "hold".into(),
            action: action.into(),
            idempotency_key: "t:hold:reserve-funds".into(),
            task_id: TaskId::new_random(),
            undoes: None,
            input,
            deadline: chrono::DateTime::parse_from_rfc3339("2030-01-02T03:04:05.678Z")
                .expect("date")
                .with_timezone(&chrono::Utc),
            callback: None,
            limit_keys: Default::default(),
        }
    }

    #[test]
    fn statuses_map_by_the_table() {
        use StatusClass::*;
        let none = StatusOverrides::default();
        let table = [
            (200, Success),
            (201, Success),
            (204, Success),
            (301, Misconfigured),
            (302, Misconfigured),
            (400, Refused),
            (401, Misconfigured),
            (402, Misconfigured),
            (403, Misconfigured),
            (404, Misconfigured),
            (405, Misconfigured),
            (408, Transient),
            (409, InProgress),
            (410, Misconfigured),
            (422, Refused),
            (425, Transient),
            (429, Transient),
            (451, Misconfigured),
            (500, Transient),
            (502, Transient),
            (503, Transient),
            (504, Transient),
            (599, Transient),
        ];
        for (status, class) in table {
            assert_eq!(classify(status, &none), class, "status {status}");
        }
        let overrides = StatusOverrides {
            refuse: vec![402, 404],
            transient: vec![403],
            misconfigured: vec![503, 422],
        };
        let table = [
            (402, Refused),
            (404, Refused),
            (403, Transient),
            (503, Misconfigured),
            (422, Misconfigured),
            (400, Refused),
            (500, Transient),
            (200, Success),
        ];
        for (status, class) in table {
            assert_eq!(
                classify(status, &overrides),
                class,
                "status {status} overridden"
            );
        }
    }

    #[test]
    fn answers_become_results_and_refusals() {
        let none = StatusOverrides::default();
        assert_eq!(outcome(200, r#"{"a":1}"#, &none), Ok(json!({"a": 1})));
        assert_eq!(outcome(200, "plain", &none), Ok(json!("plain")));
        assert_eq!(outcome(204, "", &none), Ok(Value::Null));
        assert_eq!(
            outcome(
                422,
                r#"{"error":{"code":"declined","message":"no funds"}}"#,
                &none
            ),
            Err(RemoteFault::Refused {
                code: "declined".into(),
                message: "no funds".into()
            })
        );
        assert_eq!(
            outcome(400, r#"{"code":"bad_iban","message":"IBAN"}"#, &none),
            Err(RemoteFault::Refused {
                code: "bad_iban".into(),
                message: "IBAN".into()
            })
        );
        let long = "x".repeat(65);
        assert_eq!(
            outcome(400, &json!({"code": long}).to_string(), &none),
            Err(RemoteFault::Refused {
                code: "http_400".into(),
                message: json!({"code": long}).to_string()
            }),
            "a code over 64 characters is not taken"
        );
        let long = json!({"error": {"code": "declined", "message": "é".repeat(20_000)}});
        match outcome(422, &long.to_string(), &none) {
            Err(RemoteFault::Refused { code, message }) => {
                assert_eq!(code, "declined", "a long message keeps its code");
                assert!(message.len() <= MAX_TEXT_BYTES, "{}", message.len());
                assert!(message.ends_with(super::super::CUT_MARKER), "{message}");
            }
            other => panic!("{other:?}"),
        }
        let text = "y".repeat(300);
        match outcome(422, &text, &none) {
            Err(RemoteFault::Refused { code, message }) => {
                assert_eq!(code, "http_422");
                assert_eq!(message.len(), 200);
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            outcome(409, "busy", &none),
            Err(RemoteFault::InProgress(m)) if m.contains("409")
        ));
    }

    #[test]
    fn path_templates_encode_one_segment_each() {
        let t = PathTemplate::parse("/holds/{$.input.hold}/by/{$.task.id}/{$.step}/{$.input.n}")
            .expect("template");
        let context = json!({
            "input": {"hold": "a/b c?d%", "n": 42},
            "task": {"id": "t1"},
            "step": "hold",
            "action": "release-funds",
        });
        assert_eq!(
            render_path(&t, &context).expect("rendered"),
            "/holds/a%2Fb%20c%3Fd%25/by/t1/hold/42"
        );
        let missing = render_path(&t, &json!({"input": {}, "task": {"id": "t"}, "step": "s"}));
        assert!(
            matches!(&missing, Err(RemoteFault::Misconfigured(m)) if m.contains("$.input.hold")),
            "{missing:?}"
        );
        let object = render_path(
            &PathTemplate::parse("/x/{$.input}").expect("template"),
            &json!({"input": {"a": 1}}),
        );
        assert!(
            matches!(object, Err(RemoteFault::Misconfigured(_))),
            "{object:?}"
        );
    }

    #[test]
    fn bad_path_templates_are_named() {
        for (path, says) in [
            ("holds", "must start with /"),
            ("/holds/{$.input.x", "not closed"),
            ("/holds/}", "without"),
            ("/holds/{$.steps.a.result}", "rooted at"),
            ("/holds/{$.input..x}", "singular"),
            ("/holds/{$.input[*]}", "singular"),
            ("/holds?x=1", "no query"),
            ("/holds/{input}", "JSONPath"),
        ] {
            let e = PathTemplate::parse(path).expect_err(path);
            assert!(e.contains(says), "{path}: {e}");
        }
        PathTemplate::parse("/a/{$.input['x}y']}").expect("a brace inside quotes");
    }

    /// One request as the recording server saw it.
    #[derive(Debug, Clone)]
    struct Seen {
        method: String,
        uri: String,
        headers: HeaderMap,
        body: String,
    }

    /// An answer: status, headers, body.
    type Answer = (u16, Vec<(&'static str, String)>, String);

    #[derive(Default)]
    struct Recorder {
        seen: Mutex<Vec<Seen>>,
        answers: Mutex<VecDeque<Answer>>,
    }

    impl Recorder {
        fn answer(&self, status: u16, body: &str) {
            self.answers
                .lock()
                .expect("lock")
                .push_back((status, vec![], body.into()));
        }
        fn seen(&self) -> Vec<Seen> {
            self.seen.lock().expect("lock").clone()
        }
        fn last(&self) -> Seen {
            self.seen().last().cloned().expect("a request")
        }
    }

    /// A server that records every request and answers from a queue (200 `{"ok":true}` when
    /// empty).
    async fn recorder() -> (Arc<Recorder>, String) {
        async fn any(
            State(rec): State<Arc<Recorder>>,
            req: axum::extract::Request,
        ) -> axum::response::Response {
            let (parts, body) = req.into_parts();
            let body = axum::body::to_bytes(body, 1 << 20)
                .await
                .unwrap_or_default();
            rec.seen.lock().expect("lock").push(Seen {
                method: parts.method.to_string(),
                uri: parts.uri.to_string(),
                headers: parts.headers,
                body: String::from_utf8_lossy(&body).into_owned(),
            });
            let next = rec.answers.lock().expect("lock").pop_front();
            let (status, headers, body) =
                next.unwrap_or((200, vec![], r#"{"ok":true}"#.to_owned()));
            let mut resp = axum::response::Response::builder()
                .status(StatusCode::from_u16(status).expect("status"));
            for (k, v) in headers {
                resp = resp.header(k, v);
            }
            resp.body(axum::body::Body::from(body)).expect("response")
        }
        let rec = Arc::new(Recorder::default());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().expect("addr");
        let app = axum::Router::new().fallback(any).with_state(rec.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (rec, format!("http://{addr}"))
    }

    fn header<'a>(seen: &'a Seen, name: &str) -> Option<&'a str> {
        seen.headers.get(name).and_then(|v| v.to_str().ok())
    }

    #[tokio::test]
    async fn declared_actions_use_their_method_and_templated_path() {
        let (rec, base) = recorder().await;
        let remote = HttpRemote::new(
            client().expect("client"),
            &target(json!({
                "baseUrl": format!("{base}/v1"),
                "headers": {"X-Client": "sas"},
                "actions": {
                    "reserve-funds": {"method": "POST", "path": "/holds"},
                    "release-funds": {"method": "DELETE", "path": "/holds/{$.input.hold}"},
                    "look": {"method": "GET", "path": "/holds/{$.input.hold}"},
                }
            })),
            none(),
        )
        .expect("remote");
        let reserve = call("reserve-funds", json!({"amount": 5}));
        remote
            .call(&reserve, Duration::from_secs(5))
            .await
            .expect("reserved");
        let seen = rec.last();
        assert_eq!(
            (seen.method.as_str(), seen.uri.as_str()),
            ("POST", "/v1/holds")
        );
        assert_eq!(
            serde_json::from_str::<Value>(&seen.body).ok(),
            Some(json!({"amount": 5}))
        );
        assert_eq!(header(&seen, "x-client"), Some("sas"));
        assert_eq!(header(&seen, "content-type"), Some("application/json"));
        assert_eq!(
            header(&seen, "idempotency-key"),
            Some("t:hold:reserve-funds")
        );
        assert_eq!(
            header(&seen, "sas-task-id"),
            Some(reserve.task_id.to_string().as_str())
        );
        assert_eq!(header(&seen, "sas-step"), Some("hold"));
        assert_eq!(
            header(&seen, "sas-deadline"),
            Some("2030-01-02T03:04:05.678Z")
        );
        assert_eq!(header(&seen, "sas-undoes"), None);
        assert_eq!(header(&seen, "sas-callback-url"), None);

        let release = RemoteCall {
            action: "release-funds".into(),
            undoes: Some("t:hold:reserve-funds".into()),
            callback: Some(CallbackAddress {
                token: "tok".into(),
                url: "https://api.example/tasks/t/callbacks/tok".into(),
            }),
            ..call("release-funds", json!({"hold": "h/1"}))
        };
        remote
            .call(&release, Duration::from_secs(5))
            .await
            .expect("released");
        let seen = rec.last();
        assert_eq!(
            (seen.method.as_str(), seen.uri.as_str()),
            ("DELETE", "/v1/holds/h%2F1")
        );
        assert_eq!(header(&seen, "sas-undoes"), Some("t:hold:reserve-funds"));
        assert_eq!(
            header(&seen, "sas-callback-url"),
            Some("https://api.example/tasks/t/callbacks/tok")
        );
        assert_eq!(header(&seen, "sas-callback-token"), Some("tok"));

        let mut look = call("look", json!({"hold": 7}));
        remote
            .call(&look, Duration::from_secs(5))
            .await
            .expect("ok");
        assert_eq!(rec.last().uri, "/v1/holds/7");
        assert_eq!(rec.last().method, "GET");
        look.input = Value::Null;
        let missing = remote.call(&look, Duration::from_secs(5)).await;
        assert!(
            matches!(missing, Err(RemoteFault::Misconfigured(_))),
            "{missing:?}"
        );
        assert_eq!(rec.seen().len(), 3, "no request without its path value");

        remote
            .call(&call("other action", Value::Null), Duration::from_secs(5))
            .await
            .expect("ok");
        let seen = rec.last();
        assert_eq!(
            (seen.method.as_str(), seen.uri.as_str()),
            ("POST", "/v1/other%20action")
        );
        assert_eq!(seen.body, "null", "a POST carries its input, even null");
    }

    #[tokio::test]
    async fn a_bodiless_delete_sends_no_body() {
        let (rec, base) = recorder().await;
        let remote = HttpRemote::new(
            client().expect("client"),
            &target(json!({
                "baseUrl": base,
                "actions": {"drop": {"method": "DELETE", "path": "/x/{$.task.id}"}}
            })),
            none(),
        )
        .expect("remote");
        let c = call("drop", Value::Null);
        remote.call(&c, Duration::from_secs(5)).await.expect("ok");
        let seen = rec.last();
        assert_eq!(seen.uri, format!("/x/{}", c.task_id));
        assert_eq!(seen.body, "");
        assert_eq!(header(&seen, "content-type"), None);
    }

    #[tokio::test]
    async fn each_auth_type_sends_its_header() {
        let (rec, base) = recorder().await;
        let memory = Arc::new(MemoryCredentials::default());
        memory.set(CredentialSource::Secret("sas/dev/token".into()), "tok-1\n");
        memory.set(CredentialSource::Parameter("/sas/dev/key".into()), "key-1");
        memory.set(
            CredentialSource::Secret("sas/dev/basic".into()),
            r#"{"username":"u","password":"p"}"#,
        );
        let creds = credentials(memory);
        let cases = [
            (
                json!({"type": "bearer", "secret": "sas/dev/token"}),
                "authorization",
                "Bearer tok-1",
            ),
            (
                json!({"type": "apiKey", "header": "X-Api-Key", "parameter": "/sas/dev/key"}),
                "x-api-key",
                "key-1",
            ),
            (
                json!({"type": "basic", "secret": "sas/dev/basic"}),
                "authorization",
                "Basic dTpw",
            ),
        ];
        for (auth, name, value) in cases {
            let remote = HttpRemote::new(
                client().expect("client"),
                &target(json!({"baseUrl": base, "auth": auth})),
                creds.clone(),
            )
            .expect("remote");
            remote
                .call(&call("go", json!({})), Duration::from_secs(5))
                .await
                .expect("ok");
            assert_eq!(header(&rec.last(), name), Some(value), "{auth}");
        }
        let remote = HttpRemote::new(
            client().expect("client"),
            &target(json!({"baseUrl": base, "auth": {"type": "bearer", "secret": "nowhere"}})),
            creds,
        )
        .expect("remote");
        let before = rec.seen().len();
        let fault = remote
            .call(&call("go", json!({})), Duration::from_secs(5))
            .await;
        assert!(
            matches!(&fault, Err(RemoteFault::Misconfigured(m)) if m.contains("nowhere")),
            "{fault:?}"
        );
        assert_eq!(rec.seen().len(), before, "no call without its credential");
    }

    #[tokio::test]
    async fn a_refused_credential_is_read_again() {
        let (rec, base) = recorder().await;
        let memory = Arc::new(MemoryCredentials::default());
        let source = CredentialSource::Secret("sas/dev/token".into());
        memory.set(source.clone(), "old");
        let remote = HttpRemote::new(
            client().expect("client"),
            &target(
                json!({"baseUrl": base, "auth": {"type": "bearer", "secret": "sas/dev/token"}}),
            ),
            credentials(memory.clone()),
        )
        .expect("remote");
        let c = call("go", json!({}));
        remote.call(&c, Duration::from_secs(5)).await.expect("ok");
        remote.call(&c, Duration::from_secs(5)).await.expect("ok");
        assert_eq!(memory.reads(), 1, "kept between calls");
        memory.set(source.clone(), "new");
        rec.answer(401, "token expired");
        let fault = remote.call(&c, Duration::from_secs(5)).await;
        assert!(
            matches!(fault, Err(RemoteFault::Misconfigured(_))),
            "{fault:?}"
        );
        assert_eq!(header(&rec.last(), "authorization"), Some("Bearer old"));
        remote.call(&c, Duration::from_secs(5)).await.expect("ok");
        assert_eq!(header(&rec.last(), "authorization"), Some("Bearer new"));
        assert_eq!(memory.reads(), 2);
        assert!(
            memory.read(&source).await.is_ok(),
            "the store still has the value"
        );
    }

    #[tokio::test]
    async fn every_status_class_is_mapped_and_no_redirect_is_followed() {
        let (rec, base) = recorder().await;
        let remote = HttpRemote::new(
            client().expect("client"),
            &target(json!({"baseUrl": base, "statuses": {"refuse": [402]}})),
            none(),
        )
        .expect("remote");
        let c = call("go", json!({}));
        let go = || remote.call(&c, Duration::from_secs(5));
        rec.answer(201, r#"{"id":"h1"}"#);
        assert_eq!(go().await, Ok(json!({"id": "h1"})));
        rec.answer(503, "down");
        assert!(matches!(go().await, Err(RemoteFault::Transient(_))));
        rec.answer(429, "slow down");
        assert!(matches!(go().await, Err(RemoteFault::Transient(_))));
        rec.answer(409, "in flight");
        assert!(matches!(go().await, Err(RemoteFault::InProgress(_))));
        rec.answer(404, "no such path");
        assert!(matches!(go().await, Err(RemoteFault::Misconfigured(_))));
        rec.answer(403, "forbidden");
        assert!(matches!(go().await, Err(RemoteFault::Misconfigured(_))));
        rec.answer(422, r#"{"error":{"code":"declined","message":"no"}}"#);
        assert_eq!(
            go().await,
            Err(RemoteFault::Refused {
                code: "declined".into(),
                message: "no".into()
            })
        );
        rec.answer(402, r#"{"code":"insufficient_funds"}"#);
        assert!(matches!(
            go().await,
            Err(RemoteFault::Refused { code, .. }) if code == "insufficient_funds"
        ));
        let before = rec.seen().len();
        rec.answers.lock().expect("lock").push_back((
            307,
            vec![("location", format!("{base}/elsewhere"))],
            String::new(),
        ));
        assert!(matches!(go().await, Err(RemoteFault::Misconfigured(_))));
        assert_eq!(
            rec.seen().len(),
            before + 1,
            "the redirect was not followed"
        );
        assert!(rec.seen().iter().all(|s| !s.uri.contains("elsewhere")));
    }

    #[tokio::test]
    async fn a_closed_port_or_a_slow_answer_is_transient() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        drop(listener);
        let remote = HttpRemote::new(
            client().expect("client"),
            &target(json!({"baseUrl": format!("http://{addr}")})),
            none(),
        )
        .expect("remote");
        assert!(matches!(
            remote
                .call(&call("go", json!({})), Duration::from_secs(5))
                .await,
            Err(RemoteFault::Transient(_))
        ));
    }
}
