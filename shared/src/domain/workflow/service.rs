//! Services as data: where a workflow's steps are sent (an HTTP API or a Lambda function), how
//! they authenticate, and the checks of a service definition (its shape, and what a deployment
//! allows).

use super::super::mapping;
use super::super::problem::Problem;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// A file of services, as written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServicesDoc {
    pub services: Vec<ServiceDef>,
}

/// A service: what performs steps, and where its agent sends the calls.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServiceDef {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    pub target: Target,
    /// Calls in flight and calls a second the service takes (every agent keeps them together).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<crate::domain::limits::ServiceLimits>,
}

/// Where a service's calls go.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum Target {
    /// The in-process simulated service (demo stacks and tests).
    Simulated,
    /// An HTTP service.
    Http(HttpTarget),
    /// An AWS Lambda function, invoked synchronously.
    Lambda(LambdaTarget),
}

/// An HTTP service: `{method} {baseUrl}{path}` per action (default `POST {baseUrl}/{action}`),
/// with static headers, a credential read at run time, and overrides of the status mapping.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HttpTarget {
    pub base_url: String,
    /// Static headers sent on every call (never secrets: those go in `auth`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<AuthDef>,
    /// How each action is called; an action not listed is `POST {baseUrl}/{action}`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub actions: BTreeMap<String, ActionDef>,
    #[serde(default, skip_serializing_if = "StatusOverrides::is_empty")]
    pub statuses: StatusOverrides,
}

/// How an HTTP service authenticates a call. The credential is read at run time from Secrets
/// Manager (`secret`) or SSM Parameter Store (`parameter`): never written in a definition.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AuthDef {
    #[serde(rename = "type")]
    pub scheme: AuthScheme,
    /// A Secrets Manager secret id or ARN.
    pub secret: Option<String>,
    /// An SSM parameter name (read with decryption).
    pub parameter: Option<String>,
    /// The header that carries an `apiKey` (only for `apiKey`).
    pub header: Option<String>,
}

/// `bearer`: `Authorization: Bearer <credential>`; `apiKey`: `<header>: <credential>`;
/// `basic`: `Authorization: Basic`, from a credential that is JSON `{"username","password"}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum AuthScheme {
    Bearer,
    ApiKey,
    Basic,
}

/// Where a credential is read from.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CredentialSource {
    /// A Secrets Manager secret id or ARN.
    Secret(String),
    /// An SSM parameter name.
    Parameter(String),
}

impl fmt::Display for CredentialSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Secret(id) => write!(f, "secret {id:?}"),
            Self::Parameter(name) => write!(f, "parameter {name:?}"),
        }
    }
}

impl AuthDef {
    /// Where the credential is read from (`None` if both or neither are given, which
    /// validation refuses).
    pub fn source(&self) -> Option<CredentialSource> {
        match (&self.secret, &self.parameter) {
            (Some(s), None) => Some(CredentialSource::Secret(s.clone())),
            (None, Some(p)) => Some(CredentialSource::Parameter(p.clone())),
            _ => None,
        }
    }
}

/// How one action of an HTTP service is called.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ActionDef {
    pub method: HttpMethod,
    /// Appended to `baseUrl`'s path; `{...}` placeholders are singular JSONPath queries on
    /// `{input, task: {id}, step, action}`.
    pub path: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum HttpMethod {
    Get,
    Post,
    Put,
    Patch,
    Delete,
}

impl HttpMethod {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Get => "GET",
            Self::Post => "POST",
            Self::Put => "PUT",
            Self::Patch => "PATCH",
            Self::Delete => "DELETE",
        }
    }
}

/// Status codes a service wants read otherwise than by default.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StatusOverrides {
    /// Business refusals (`Refused`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refuse: Vec<u16>,
    /// Worth retrying (`Transient`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub transient: Vec<u16>,
    /// An operator must act (`Misconfigured`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub misconfigured: Vec<u16>,
}

impl StatusOverrides {
    pub fn is_empty(&self) -> bool {
        self.refuse.is_empty() && self.transient.is_empty() && self.misconfigured.is_empty()
    }
}

/// An AWS Lambda function: `Invoke` (RequestResponse) with the call as the payload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LambdaTarget {
    /// A function name or ARN (optionally with a version or alias).
    pub function: String,
    /// The `errorType`s of the function's errors that are business refusals; any other
    /// function error is transient.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refusals: Vec<String>,
}

/// The headers sas sets itself on every HTTP call: a service's static headers may not set them.
pub const RESERVED_HEADERS: &[&str] = &[
    "authorization",
    "content-type",
    "idempotency-key",
    "sas-task-id",
    "sas-step",
    "sas-deadline",
    "sas-undoes",
    "sas-callback-url",
    "sas-callback-token",
];

/// Whether `host` is the loopback (`localhost`, `127.0.0.0/8`, `::1`), the only hosts a service
/// may be reached on over plain `http`.
fn is_loopback(url: &url::Url) -> bool {
    match url.host() {
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    }
}

/// What a service definition must hold beyond its shape: a usable base URL, valid headers
/// (none that sas sets), one credential source, path templates that compile, and status
/// overrides that do not contradict each other.
pub(super) fn service_problems(at: &str, def: &ServiceDef, problems: &mut Vec<Problem>) {
    if let Some(limits) = &def.limits {
        crate::domain::limits::problems(&format!("{at}/limits"), limits, problems);
    }
    let Target::Http(http) = &def.target else {
        return;
    };
    let at = format!("{at}/target");
    let mut problem = |at: String, message: String| problems.push(Problem { at, message });
    match url::Url::parse(&http.base_url) {
        Err(e) => problem(format!("{at}/baseUrl"), format!("not a URL: {e}")),
        Ok(u) if u.scheme() == "https" => {}
        Ok(u) if u.scheme() == "http" && is_loopback(&u) => {}
        Ok(u) if u.scheme() == "http" => problem(
            format!("{at}/baseUrl"),
            "https is required (plain http only for localhost, 127.0.0.0/8 and ::1)".into(),
        ),
        Ok(u) => problem(
            format!("{at}/baseUrl"),
            format!("scheme {:?}: use https", u.scheme()),
        ),
    }
    if let Ok(u) = url::Url::parse(&http.base_url)
        && (u.query().is_some() || u.fragment().is_some())
    {
        problem(
            format!("{at}/baseUrl"),
            "a base URL has no query or fragment".into(),
        );
    }
    if let Ok(u) = url::Url::parse(&http.base_url)
        && (!u.username().is_empty() || u.password().is_some())
    {
        problem(
            format!("{at}/baseUrl"),
            "a base URL carries no user or password (user:pass@): credentials go in `auth`, read from Secrets Manager or SSM".into(),
        );
    }
    for (name, value) in &http.headers {
        let here = format!("{at}/headers/{}", pointer_token(name));
        match http::HeaderName::from_bytes(name.as_bytes()) {
            Err(_) => problem(here.clone(), format!("{name:?} is not a header name")),
            Ok(h) if RESERVED_HEADERS.contains(&h.as_str()) => problem(
                here.clone(),
                format!("{name:?} is set by sas (credentials go in `auth`)"),
            ),
            Ok(_) => {}
        }
        if http::HeaderValue::from_str(value).is_err() {
            problem(here, "not a valid header value".into());
        }
    }
    if let Some(auth) = &http.auth {
        let here = format!("{at}/auth");
        if auth.source().is_none() {
            problem(
                here.clone(),
                "give exactly one of `secret` (Secrets Manager) or `parameter` (SSM)".into(),
            );
        }
        match (auth.scheme, &auth.header) {
            (AuthScheme::ApiKey, None) => {
                problem(here.clone(), "an apiKey needs its `header`".into())
            }
            (AuthScheme::ApiKey, Some(h)) => match http::HeaderName::from_bytes(h.as_bytes()) {
                Err(_) => problem(
                    format!("{here}/header"),
                    format!("{h:?} is not a header name"),
                ),
                Ok(n)
                    if RESERVED_HEADERS.contains(&n.as_str())
                        && n != http::header::AUTHORIZATION =>
                {
                    problem(format!("{here}/header"), format!("{h:?} is set by sas"))
                }
                Ok(_) => {}
            },
            (_, Some(_)) => problem(
                format!("{here}/header"),
                "only an apiKey takes a `header`".into(),
            ),
            (_, None) => {}
        }
    }
    for (action, a) in &http.actions {
        let here = format!("{at}/actions/{}/path", pointer_token(action));
        if let Err(message) = PathTemplate::parse(&a.path) {
            problem(here, message);
        }
    }
    let lists = [
        ("refuse", &http.statuses.refuse),
        ("transient", &http.statuses.transient),
        ("misconfigured", &http.statuses.misconfigured),
    ];
    let mut seen: BTreeMap<u16, &str> = BTreeMap::new();
    for (list, codes) in lists {
        for (i, code) in codes.iter().enumerate() {
            let here = format!("{at}/statuses/{list}/{i}");
            if !(100..=599).contains(code) {
                problem(here, format!("{code} is not an HTTP status (100-599)"));
            } else if (200..=299).contains(code) {
                problem(here, format!("{code}: a 2xx is always a success"));
            } else if let Some(other) = seen.insert(*code, list) {
                problem(here, format!("{code} is also in `{other}`"));
            }
        }
    }
}

/// What one deployment allows a service beyond what [`parse_services`] checks everywhere.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceRules {
    /// Services on this machine: loopback and link-local hosts (`localhost`, `127.0.0.0/8`,
    /// `::1`, `169.254.0.0/16`, `fe80::/10`). The local runner and the tests run their services
    /// there; in a deployed function the loopback is the Lambda Runtime API's and link-local
    /// holds the platform's endpoints, so a deployment refuses them (the default).
    pub local_hosts: bool,
    /// Where the agent may read credentials (`SecretsPrefix`): when set, a service may use only
    /// the secrets and parameters under `<prefix><service name>/`, so no publisher can pair
    /// another service's credential with a base URL of its own.
    pub secrets_prefix: Option<String>,
}

impl ServiceRules {
    /// The local runner's and the tests': services may run on this machine; no credential
    /// prefix.
    pub fn local() -> Self {
        Self {
            local_hosts: true,
            secrets_prefix: None,
        }
    }
}

/// Whether `url`'s host is this machine or its link: `localhost` (and `*.localhost`), the
/// loopback, link-local and unspecified addresses (IPv4, IPv6, and IPv4 mapped into IPv6).
fn is_local_host(url: &url::Url) -> bool {
    fn v4(ip: std::net::Ipv4Addr) -> bool {
        ip.is_loopback() || ip.is_link_local() || ip.is_unspecified()
    }
    match url.host() {
        Some(url::Host::Domain(d)) => {
            let d = d.trim_end_matches('.').to_ascii_lowercase();
            d == "localhost" || d.ends_with(".localhost")
        }
        Some(url::Host::Ipv4(ip)) => v4(ip),
        Some(url::Host::Ipv6(ip)) => {
            ip.is_loopback()
                || ip.is_unspecified()
                || (ip.segments()[0] & 0xffc0) == 0xfe80
                || ip.to_ipv4_mapped().is_some_and(v4)
        }
        None => false,
    }
}

/// The name of a credential, whether given as a name or an ARN (a secret's ARN ends in its
/// name and a random suffix; a parameter's name may start with `/`).
fn credential_name(source: &CredentialSource) -> &str {
    match source {
        CredentialSource::Secret(id) => id.split_once(":secret:").map_or(id.as_str(), |(_, n)| n),
        CredentialSource::Parameter(p) => p
            .split_once(":parameter/")
            .map_or(p.as_str(), |(_, n)| n)
            .trim_start_matches('/'),
    }
}

/// What `rules` refuse in the service `def` (at `at`, e.g. `/services/0`), beyond what
/// [`parse_services`] refuses everywhere.
pub fn deployment_problems(at: &str, def: &ServiceDef, rules: &ServiceRules) -> Vec<Problem> {
    let mut problems = vec![];
    let Target::Http(http) = &def.target else {
        return problems;
    };
    let at = format!("{at}/target");
    if !rules.local_hosts
        && let Ok(u) = url::Url::parse(&http.base_url)
        && is_local_host(&u)
    {
        problems.push(Problem {
            at: format!("{at}/baseUrl"),
            message: format!(
                "{:?} is the function's own machine (loopback or link-local), where the Lambda runtime listens: give the service's own address",
                u.host_str().unwrap_or_default()
            ),
        });
    }
    if let (Some(prefix), Some(auth)) = (&rules.secrets_prefix, &http.auth)
        && let Some(source) = auth.source()
    {
        let name = credential_name(&source);
        let own = format!("{prefix}{}/", def.name);
        if !name.starts_with(&own) || name.split('/').any(|s| s == "." || s == "..") {
            let field = match source {
                CredentialSource::Secret(_) => "secret",
                CredentialSource::Parameter(_) => "parameter",
            };
            problems.push(Problem {
                at: format!("{at}/auth/{field}"),
                message: format!(
                    "{name:?} is not under {own}: a service reads only the credentials under its own name"
                ),
            });
        }
    }
    problems
}

/// A compiled `path` of an HTTP action: literal text and `{...}` placeholders, each an RFC 9535
/// singular query rooted at `$.input`, `$.task.id`, `$.step` or `$.action`.
#[derive(Debug, Clone, PartialEq)]
pub struct PathTemplate {
    pub parts: Vec<PathPart>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum PathPart {
    Literal(String),
    Placeholder {
        source: String,
        query: jsonpath_rust::parser::model::JpQuery,
    },
}

impl PathTemplate {
    /// Compiles `path`; the error says what is wrong.
    pub fn parse(path: &str) -> Result<Self, String> {
        if !path.starts_with('/') {
            return Err(format!("{path:?} must start with /"));
        }
        let mut parts = vec![];
        let mut literal = String::new();
        let mut chars = path.chars();
        while let Some(c) = chars.next() {
            match c {
                '{' => {
                    // Up to the first `}` outside quotes.
                    let mut source = String::new();
                    let mut quote: Option<char> = None;
                    let mut closed = false;
                    for c in chars.by_ref() {
                        match (quote, c) {
                            (None, '}') => {
                                closed = true;
                                break;
                            }
                            (None, '\'' | '"') => quote = Some(c),
                            (Some(q), c) if c == q => quote = None,
                            _ => {}
                        }
                        source.push(c);
                    }
                    if !closed {
                        return Err(format!("{path:?}: a `{{` is not closed"));
                    }
                    let query = placeholder_query(&source)?;
                    if !literal.is_empty() {
                        parts.push(PathPart::Literal(std::mem::take(&mut literal)));
                    }
                    parts.push(PathPart::Placeholder { source, query });
                }
                '}' => return Err(format!("{path:?}: a `}}` without its `{{`")),
                '?' | '#' => {
                    return Err(format!("{path:?}: a path has no query or fragment"));
                }
                c => literal.push(c),
            }
        }
        if !literal.is_empty() {
            parts.push(PathPart::Literal(literal));
        }
        Ok(Self { parts })
    }
}

fn placeholder_query(source: &str) -> Result<jsonpath_rust::parser::model::JpQuery, String> {
    let query = jsonpath_rust::parser::parse_json_path(source).map_err(|e| {
        format!(
            "{{{source}}} is not an RFC 9535 JSONPath: {}",
            e.to_string().lines().next().unwrap_or_default()
        )
    })?;
    let Some(names) = mapping::singular_path(&query) else {
        return Err(format!(
            "{{{source}}} is not a singular query: use names and indexes only"
        ));
    };
    match names.as_slice() {
        [Some("input"), ..] | [Some("task"), Some("id")] | [Some("step")] | [Some("action")] => {
            Ok(query)
        }
        _ => Err(format!(
            "{{{source}}} must be rooted at $.input, $.task.id, $.step or $.action"
        )),
    }
}

/// A key as one JSON pointer token.
fn pointer_token(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

#[cfg(test)]
mod tests {
    use super::super::testkit::*;
    use super::*;
    use serde_json::json;

    #[test]
    fn a_full_http_service_and_a_lambda_service_parse() {
        let doc = parse_value(
            r#"
services:
  - name: core-banking
    target:
      type: http
      baseUrl: https://bank.example/v1
      headers: {X-Client: sas}
      auth: {type: bearer, secret: sas/dev/core-banking/token}
      actions:
        reserve-funds: {method: POST, path: /holds}
        release-funds: {method: DELETE, path: "/holds/{$.input.hold}"}
      statuses: {refuse: [402], transient: [], misconfigured: []}
  - name: keyed
    target:
      type: http
      baseUrl: http://127.0.0.1:8080
      auth: {type: apiKey, header: X-Api-Key, parameter: /sas/dev/keyed/key}
  - name: credit-bureau
    target: {type: lambda, function: sas-dev--svc-credit-bureau, refusals: [CreditDeclined]}
  - name: by-arn
    target: {type: lambda, function: "arn:aws:lambda:eu-west-1:123456789012:function:f:live"}
  - name: e-sign
    target: {type: simulated}
"#,
            Format::Yaml,
        )
        .and_then(parse_services)
        .expect("valid");
        let Target::Http(bank) = &doc.services[0].target else {
            panic!("http: {:?}", doc.services[0].target);
        };
        assert_eq!(bank.actions["release-funds"].method, HttpMethod::Delete);
        assert_eq!(
            bank.auth.as_ref().and_then(AuthDef::source),
            Some(CredentialSource::Secret(
                "sas/dev/core-banking/token".into()
            ))
        );
        assert_eq!(bank.statuses.refuse, vec![402]);
        assert!(
            matches!(&doc.services[2].target, Target::Lambda(l) if l.refusals == ["CreditDeclined"])
        );
        // What is published reads back the same.
        let again: ServicesDoc =
            serde_json::from_value(serde_json::to_value(&doc).expect("json")).expect("parses");
        assert_eq!(again, doc);
    }

    #[test]
    fn http_targets_are_checked_with_pointers() {
        let p = service_problems_of(json!({"type": "http", "baseUrl": "http://bank.example"}));
        assert!(at(&p, "/services/0/target/baseUrl"), "{p:?}");
        for ok in [
            "http://localhost:1",
            "http://127.0.0.2",
            "http://[::1]:80",
            "https://x.example",
        ] {
            parse_services(
                json!({"services": [{"name": "b", "target": {"type": "http", "baseUrl": ok}}]}),
            )
            .unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        let p = service_problems_of(json!({"type": "http", "baseUrl": "https://"}));
        assert!(at(&p, "/services/0/target/baseUrl"), "{p:?}");
        let p = service_problems_of(json!({
            "type": "http", "baseUrl": "https://b.example",
            "headers": {"Authorization": "Bearer x", "Bad Name": "v", "X-Ok": "line\nbreak", "Sas-Step": "s"}
        }));
        assert!(at(&p, "/services/0/target/headers/Authorization"), "{p:?}");
        assert!(at(&p, "/services/0/target/headers/Bad Name"), "{p:?}");
        assert!(at(&p, "/services/0/target/headers/X-Ok"), "{p:?}");
        assert!(at(&p, "/services/0/target/headers/Sas-Step"), "{p:?}");
        let p = service_problems_of(json!({
            "type": "http", "baseUrl": "https://b.example",
            "actions": {
                "a": {"method": "POST", "path": "/x/{$.steps.s.result.id}"},
                "b": {"method": "GET", "path": "/x/{$.input..id}"},
                "c": {"method": "PUT", "path": "/x/{$.task.workflow}"},
            }
        }));
        assert!(at(&p, "/services/0/target/actions/a/path"), "{p:?}");
        assert!(at(&p, "/services/0/target/actions/b/path"), "{p:?}");
        assert!(at(&p, "/services/0/target/actions/c/path"), "{p:?}");
        let p = service_problems_of(json!({
            "type": "http", "baseUrl": "https://b.example",
            "actions": {"a": {"method": "HEAD", "path": "/x"}, "b": {"method": "GET", "path": "x"}}
        }));
        assert!(at(&p, "/services/0/target/actions/a/method"), "{p:?}");
        assert!(at(&p, "/services/0/target/actions/b/path"), "{p:?}");
        let p = service_problems_of(json!({
            "type": "http", "baseUrl": "https://b.example",
            "statuses": {"refuse": [402, 404], "transient": [404, 201], "misconfigured": [600]}
        }));
        assert!(
            at(&p, "/services/0/target/statuses/misconfigured/0"),
            "{p:?}"
        );
        let p = service_problems_of(json!({
            "type": "http", "baseUrl": "https://b.example",
            "statuses": {"refuse": [402, 404], "transient": [404, 201]}
        }));
        assert!(
            at(&p, "/services/0/target/statuses/transient/0"),
            "in two lists: {p:?}"
        );
        assert!(
            at(&p, "/services/0/target/statuses/transient/1"),
            "a 2xx: {p:?}"
        );
        assert!(!at(&p, "/services/0/target/statuses/refuse/1"), "{p:?}");
    }

    #[test]
    fn auth_needs_one_source_and_an_api_key_its_header() {
        let http =
            |auth: Value| json!({"type": "http", "baseUrl": "https://b.example", "auth": auth});
        for auth in [
            json!({"type": "bearer"}),
            json!({"type": "bearer", "secret": "s", "parameter": "/p"}),
            json!({"type": "apiKey", "secret": "s"}),
            json!({"type": "basic", "secret": "s", "header": "X-Key"}),
            json!({"type": "apiKey", "secret": "s", "header": "Bad Header"}),
            json!({"type": "oauth", "secret": "s"}),
        ] {
            let p = service_problems_of(http(auth.clone()));
            assert!(
                p.iter()
                    .all(|p| p.at.starts_with("/services/0/target/auth")),
                "{auth}: {p:?}"
            );
            assert!(!p.is_empty(), "{auth}");
        }
        parse_services(json!({"services": [{"name": "b", "target": http(json!({"type": "apiKey", "header": "X-Key", "parameter": "/p"}))}]}))
            .expect("an apiKey from SSM");
    }

    #[test]
    fn lambda_functions_are_names_or_arns() {
        for bad in [
            "",
            "has space",
            "arn:aws:lambda:us-east-1:12345:function:f",
            &"f".repeat(65),
            "a:b:c",
        ] {
            let p = service_problems_of(json!({"type": "lambda", "function": bad}));
            assert!(at(&p, "/services/0/target/function"), "{bad:?}: {p:?}");
        }
        for good in [
            "f",
            "sas-dev--svc-credit_bureau",
            "f:live",
            "f:$LATEST",
            "arn:aws:lambda:us-east-1:123456789012:function:f",
            "arn:aws-cn:lambda:cn-north-1:123456789012:function:f:3",
        ] {
            parse_services(json!({"services": [{"name": "b", "target": {"type": "lambda", "function": good}}]}))
                .unwrap_or_else(|e| panic!("{good}: {e}"));
        }
        let p =
            service_problems_of(json!({"type": "lambda", "function": "f", "baseUrl": "https://x"}));
        assert!(!p.is_empty());
    }

    #[test]
    fn services_files_parse_and_reject_duplicates() {
        let doc = parse_document(json!({"services": [
            {"name": "a", "target": {"type": "simulated"}},
            {"name": "a", "target": {"type": "http", "baseUrl": "https://a.example"}}
        ]}))
        .expect_err("duplicate");
        assert_eq!(doc.0[0].at, "/services/1/name");
        let bad = parse_document(json!({"services": [{"name": "a", "target": {"type": "ftp"}}]}))
            .expect_err("unknown target");
        assert!(bad.0[0].at.starts_with("/services/0/target"), "{bad:?}");
    }

    #[test]
    fn a_base_url_with_credentials_is_refused() {
        for url in [
            "https://user:pass@bank.example/v1",
            "https://user@bank.example",
            "http://u:p@127.0.0.1:8080",
        ] {
            let p = service_problems_of(json!({"type": "http", "baseUrl": url}));
            assert!(
                p.iter()
                    .any(|p| p.at == "/services/0/target/baseUrl" && p.message.contains("auth")),
                "{url}: {p:?}"
            );
        }
    }
}
