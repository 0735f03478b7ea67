//! Workflows and services as data: the definition files a team writes (YAML or JSON, checked
//! against the published `workflows/schema.json`), parsed once into types that cannot hold an
//! invalid definition.
//!
//! A file holds either one workflow (`name`, `description`, an `input` JSON Schema, `defaults`
//! and ordered `steps`) or a list of `services`. Parsing checks the shape against the schema;
//! [`WorkflowDoc::validate`] then checks what a schema cannot say: unique step names, mappings
//! that are RFC 9535 singular queries referring only to earlier steps, services that exist,
//! durations in range, one pivot at most and no undo after it. Every problem is reported with
//! the JSON pointer of its place.

use super::mapping::{Mapping, MappingScope};
use super::policy::{CallbackPolicy, Policies, Policy};
pub use super::problem::{DefinitionError, InputError, Problem};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::{Arc, LazyLock};

/// Most steps in one workflow (the state record keeps one entry per step).
pub const MAX_STEPS: usize = 32;
/// The largest definition accepted (it is stored as one item, and travels in one request).
pub const MAX_DEFINITION_BYTES: usize = 128 * 1024;
/// The shortest and longest step timeout: an agent works on one attempt within one Lambda
/// invocation (at most 15 minutes).
pub const MIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);
pub const MAX_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);
/// The longest a step's request may wait for an agent (`startWithin`).
pub const MAX_START_WITHIN: std::time::Duration = std::time::Duration::from_secs(3600);
/// The longest retry delay a definition may ask for.
pub const MAX_DELAY: std::time::Duration = std::time::Duration::from_secs(86_400);
/// The longest a callback step may wait for its callback.
pub const MAX_CALLBACK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30 * 86_400);

/// The most regular expressions (`pattern` values and `patternProperties` names) in one input
/// schema: each may run on every string (or key) of every task input.
pub const MAX_SCHEMA_PATTERNS: usize = 16;
/// The most keywords (object members, at any depth) in one input schema.
pub const MAX_SCHEMA_KEYWORDS: usize = 1000;
/// The deepest an input schema nests (objects and arrays).
pub const MAX_SCHEMA_DEPTH: usize = 32;

/// The most backtracking steps one match of an input schema's pattern may take (the engine's
/// default is 1,000,000): a pattern that needs more fails the input.
pub const SCHEMA_BACKTRACK_LIMIT: usize = 1_000;
/// The largest an input schema's pattern may compile to, in bytes.
pub const SCHEMA_REGEX_BYTES: usize = 256 * 1024;

/// What an input schema costs beyond the budget: every task input is checked against it, in
/// the submission function, so patterns (each may run on every string and key of a 64 KiB
/// input), keywords and nesting are capped when the workflow is published.
fn schema_budget_problems(schema: &Value) -> Vec<Problem> {
    #[derive(Default)]
    struct Cost {
        patterns: usize,
        keywords: usize,
        depth: usize,
    }
    fn walk(v: &Value, depth: usize, cost: &mut Cost) {
        cost.depth = cost.depth.max(depth);
        if depth > MAX_SCHEMA_DEPTH {
            return;
        }
        match v {
            Value::Object(m) => {
                cost.keywords += m.len();
                for (k, x) in m {
                    match (k.as_str(), x) {
                        ("pattern", Value::String(_)) => cost.patterns += 1,
                        ("patternProperties", Value::Object(p)) => cost.patterns += p.len(),
                        _ => {}
                    }
                    walk(x, depth + 1, cost);
                }
            }
            Value::Array(a) => a.iter().for_each(|x| walk(x, depth + 1, cost)),
            _ => {}
        }
    }
    let mut cost = Cost::default();
    walk(schema, 0, &mut cost);
    let mut problems = vec![];
    let mut over = |message: String| {
        problems.push(Problem {
            at: "/input".into(),
            message,
        })
    };
    if cost.patterns > MAX_SCHEMA_PATTERNS {
        over(format!(
            "{} patterns (pattern, patternProperties): at most {MAX_SCHEMA_PATTERNS}, each runs on every task input",
            cost.patterns
        ));
    }
    if cost.keywords > MAX_SCHEMA_KEYWORDS {
        over(format!(
            "{} keywords: at most {MAX_SCHEMA_KEYWORDS} in an input schema",
            cost.keywords
        ));
    }
    if cost.depth > MAX_SCHEMA_DEPTH {
        over(format!(
            "nested too deep: at most {MAX_SCHEMA_DEPTH} levels in an input schema"
        ));
    }
    problems
}

/// The published JSON Schema of definition files.
pub const SCHEMA: &str = include_str!("../../../workflows/schema.json");

/// How a definition is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Json,
    Yaml,
}

impl Format {
    /// From a file name: `.json` is JSON, `.yaml`/`.yml` YAML.
    pub fn of_path(path: &str) -> Option<Self> {
        let lower = path.to_ascii_lowercase();
        if lower.ends_with(".json") {
            Some(Self::Json)
        } else if lower.ends_with(".yaml") || lower.ends_with(".yml") {
            Some(Self::Yaml)
        } else {
            None
        }
    }
}

/// A workflow as written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkflowDoc {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Show a task's caller its steps' errors (off: only the operator API shows them).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub public_errors: bool,
    /// The JSON Schema of a task's input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub defaults: Option<SettingsDoc>,
    pub steps: Vec<StepDoc>,
}

/// Timeout and retry, as written (for one step, or as the workflow's defaults).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SettingsDoc {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_within: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetryDoc>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RetryDoc {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_threshold: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_delay: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff_rate: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_delay: Option<String>,
}

/// One step, as written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StepDoc {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    pub service: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub undo: Option<UndoDoc>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pivot: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_within: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetryDoc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback: Option<CallbackDoc>,
}

/// A callback step's wait, as written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CallbackDoc {
    pub timeout: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UndoDoc {
    pub action: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Value>,
}

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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AuthDef {
    #[serde(rename = "type")]
    pub scheme: AuthScheme,
    /// A Secrets Manager secret id or ARN.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    /// An SSM parameter name (read with decryption).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameter: Option<String>,
    /// The header that carries an `apiKey` (only for `apiKey`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
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
fn service_problems(at: &str, def: &ServiceDef, problems: &mut Vec<Problem>) {
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
    let Some(names) = super::mapping::singular_path(&query) else {
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

/// One definition file: a workflow or a list of services. (One per file read, never kept in
/// bulk: the variants' sizes do not matter.)
#[derive(Debug, Clone, PartialEq)]
#[allow(clippy::large_enum_variant)]
pub enum Document {
    Workflow(WorkflowDoc),
    Services(ServicesDoc),
}

struct Schemas {
    workflow: jsonschema::Validator,
    services: jsonschema::Validator,
}

fn compile(root: &Value, def: &str) -> jsonschema::Validator {
    let schema = serde_json::json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$defs": root["$defs"].clone(),
        "$ref": format!("#/$defs/{def}"),
    });
    // The schema is compiled into the binary and tested (`the_published_schema_compiles`):
    // a failure here is a build defect, not an input error.
    #[allow(clippy::expect_used)]
    jsonschema::validator_for(&schema).expect("workflows/schema.json compiles")
}

static SCHEMAS: LazyLock<Schemas> = LazyLock::new(|| {
    #[allow(clippy::expect_used)]
    let root: Value = serde_json::from_str(SCHEMA).expect("workflows/schema.json is JSON");
    Schemas {
        workflow: compile(&root, "workflow"),
        services: compile(&root, "services"),
    }
});

/// Checks `value` against a compiled schema, every problem at its pointer.
fn schema_problems(schema: &jsonschema::Validator, value: &Value) -> Vec<Problem> {
    schema
        .iter_errors(value)
        .map(|e| Problem {
            at: e.instance_path().to_string(),
            message: e.to_string(),
        })
        .collect()
}

/// Parses a definition file's text (YAML or JSON) into a value, without checking its shape.
pub fn parse_value(text: &str, format: Format) -> Result<Value, DefinitionError> {
    if text.len() > MAX_DEFINITION_BYTES {
        return Err(DefinitionError::one(
            "",
            format!("the definition is over {MAX_DEFINITION_BYTES} bytes"),
        ));
    }
    match format {
        Format::Json => serde_json::from_str(text)
            .map_err(|e| DefinitionError::one("", format!("not JSON: {e}"))),
        Format::Yaml => serde_saphyr::from_str(text)
            .map_err(|e| DefinitionError::one("", format!("not YAML: {e}"))),
    }
}

/// Parses a definition (a workflow or a list of services) from a JSON value and checks its
/// shape against the published schema.
pub fn parse_document(value: Value) -> Result<Document, DefinitionError> {
    let Some(object) = value.as_object() else {
        return Err(DefinitionError::one(
            "",
            "a definition is an object: a workflow (with `steps`) or `services`",
        ));
    };
    if object.contains_key("services") && !object.contains_key("steps") {
        parse_services(value).map(Document::Services)
    } else {
        parse_workflow(value).map(Document::Workflow)
    }
}

/// Parses and shape-checks a workflow.
pub fn parse_workflow(value: Value) -> Result<WorkflowDoc, DefinitionError> {
    let problems = schema_problems(&SCHEMAS.workflow, &value);
    if !problems.is_empty() {
        return Err(DefinitionError(problems));
    }
    serde_json::from_value(value).map_err(|e| DefinitionError::one("", e.to_string()))
}

/// Parses and shape-checks a list of services (names must be unique).
pub fn parse_services(value: Value) -> Result<ServicesDoc, DefinitionError> {
    let problems = schema_problems(&SCHEMAS.services, &value);
    if !problems.is_empty() {
        return Err(DefinitionError(problems));
    }
    let doc: ServicesDoc =
        serde_json::from_value(value).map_err(|e| DefinitionError::one("", e.to_string()))?;
    let mut seen = BTreeSet::new();
    let mut problems = vec![];
    for (i, s) in doc.services.iter().enumerate() {
        if !seen.insert(s.name.as_str()) {
            problems.push(Problem {
                at: format!("/services/{i}/name"),
                message: format!("service {:?} is declared twice", s.name),
            });
        }
        service_problems(&format!("/services/{i}"), s, &mut problems);
    }
    if problems.is_empty() {
        Ok(doc)
    } else {
        Err(DefinitionError(problems))
    }
}

fn duration(at: &str, raw: &str, problems: &mut Vec<Problem>) -> Option<std::time::Duration> {
    match humantime::parse_duration(raw.trim()) {
        Ok(d) => Some(d),
        Err(e) => {
            problems.push(Problem {
                at: at.to_owned(),
                message: format!("{raw:?} is not a duration ({e}); write e.g. 500ms, 30s, 5m, 1h"),
            });
            None
        }
    }
}

fn chrono(d: std::time::Duration) -> chrono::Duration {
    chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX)
}

/// `raw` (at `here`) as a duration within `range`; outside it, a problem "`raw` `why`".
fn duration_in(
    here: &str,
    raw: &str,
    range: std::ops::RangeInclusive<std::time::Duration>,
    why: &str,
    problems: &mut Vec<Problem>,
) -> Option<chrono::Duration> {
    let d = duration(here, raw, problems)?;
    if range.contains(&d) {
        Some(chrono(d))
    } else {
        problems.push(Problem {
            at: here.to_owned(),
            message: format!("{raw:?} {why}"),
        });
        None
    }
}

/// Applies `doc` (timeout, start allowance and retry as written) over `policy`, reporting
/// problems at `at`.
fn apply_settings(
    policy: &mut Policy,
    at: &str,
    (timeout, start_within): (Option<&String>, Option<&String>),
    retry: Option<&RetryDoc>,
    problems: &mut Vec<Problem>,
) {
    if let Some(raw) = start_within {
        let here = format!("{at}/startWithin");
        let range = std::time::Duration::ZERO..=MAX_START_WITHIN;
        let why = "is out of range: a step's request may wait for an agent 0s to 1h";
        if let Some(d) = duration_in(&here, raw, range, why, problems) {
            policy.start_within = d;
        }
    }
    if let Some(raw) = timeout {
        let here = format!("{at}/timeout");
        let why = "is out of range: a step timeout is 1s to 10m (an agent works on one attempt within one Lambda invocation)";
        if let Some(d) = duration_in(&here, raw, MIN_TIMEOUT..=MAX_TIMEOUT, why, problems) {
            policy.step_timeout = d;
        }
    }
    let Some(retry) = retry else { return };
    let at = format!("{at}/retry");
    if let Some(n) = retry.failure_threshold {
        policy.failure_threshold = n;
    }
    if let Some(rate) = retry.backoff_rate {
        policy.backoff_rate = rate;
    }
    for (field, raw, slot) in [
        ("baseDelay", &retry.base_delay, &mut policy.retry_base_delay),
        ("maxDelay", &retry.max_delay, &mut policy.retry_max_delay),
    ] {
        let Some(raw) = raw else { continue };
        let here = format!("{at}/{field}");
        let range = std::time::Duration::ZERO..=MAX_DELAY;
        if let Some(d) = duration_in(
            &here,
            raw,
            range,
            "is over the longest delay, 1 day",
            problems,
        ) {
            *slot = d;
        }
    }
    if policy.retry_max_delay < policy.retry_base_delay {
        problems.push(Problem {
            at,
            message: "maxDelay is shorter than baseDelay".into(),
        });
    }
}

/// A callback step's wait, checked: a timeout of 1s to 30 days, a heartbeat no longer than it.
fn callback_policy(
    at: &str,
    doc: &CallbackDoc,
    problems: &mut Vec<Problem>,
) -> Option<CallbackPolicy> {
    let here = format!("{at}/timeout");
    let timeout = duration(&here, &doc.timeout, problems)?;
    if timeout < MIN_TIMEOUT || timeout > MAX_CALLBACK_TIMEOUT {
        problems.push(Problem {
            at: here,
            message: format!(
                "{:?} is out of range: a callback timeout is 1s to 30d",
                doc.timeout
            ),
        });
        return None;
    }
    let heartbeat = match &doc.heartbeat {
        None => None,
        Some(raw) => {
            let here = format!("{at}/heartbeat");
            let h = duration(&here, raw, problems)?;
            if h < MIN_TIMEOUT || h > timeout {
                problems.push(Problem {
                    at: here,
                    message: format!(
                        "{raw:?} is out of range: a heartbeat interval is 1s to the callback timeout"
                    ),
                });
                return None;
            }
            Some(chrono(h))
        }
    };
    Some(CallbackPolicy {
        timeout: chrono(timeout),
        heartbeat,
    })
}

/// One step of a validated workflow.
#[derive(Debug, Clone)]
pub struct Step {
    pub name: String,
    pub service: String,
    pub action: String,
    /// Builds the request body.
    pub input: Mapping,
    pub undo: Option<Undo>,
    /// The deployment's policy with the workflow's defaults and the step's own settings over it.
    pub policy: Policy,
}

/// How a step is undone.
#[derive(Debug, Clone)]
pub struct Undo {
    pub action: String,
    pub input: Mapping,
}

/// A validated, published workflow: what the scheduler runs.
#[derive(Clone)]
pub struct Workflow {
    pub name: String,
    /// The published version (0 for a definition not published yet).
    pub version: u32,
    pub description: Option<String>,
    /// The definition as written (what the catalog stores and the API returns).
    pub doc: WorkflowDoc,
    input_schema: Arc<jsonschema::Validator>,
    pub steps: Vec<Step>,
    /// The index of the pivot step, if any.
    pub pivot: Option<usize>,
}

impl fmt::Debug for Workflow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Workflow")
            .field("name", &self.name)
            .field("version", &self.version)
            .field("steps", &self.steps)
            .field("pivot", &self.pivot)
            .finish_non_exhaustive()
    }
}

impl WorkflowDoc {
    /// Checks what the schema cannot and compiles the workflow: `services` says which service
    /// names exist (`None`: do not check), `policy` is the deployment's default policy.
    pub fn validate(
        self,
        services: Option<&BTreeSet<String>>,
        policy: &Policy,
    ) -> Result<Workflow, DefinitionError> {
        self.validate_with(services, policy, Limits::Publish)
    }

    fn validate_with(
        self,
        services: Option<&BTreeSet<String>>,
        policy: &Policy,
        limits: Limits,
    ) -> Result<Workflow, DefinitionError> {
        let mut problems = vec![];
        let input_schema = match &self.input {
            None => serde_json::json!({"type": "object"}),
            Some(s) => s.clone(),
        };
        let budget = match limits {
            Limits::Publish => schema_budget_problems(&input_schema),
            Limits::Stored => vec![],
        };
        let input_validator = match jsonschema::meta::validate(&input_schema) {
            _ if !budget.is_empty() => {
                problems.extend(budget);
                None
            }
            Err(e) => {
                problems.push(Problem {
                    at: format!("/input{}", e.instance_path()),
                    message: format!("not a valid JSON Schema: {e}"),
                });
                None
            }
            Ok(()) => match jsonschema::options()
                .with_pattern_options(
                    jsonschema::PatternOptions::fancy_regex()
                        .backtrack_limit(SCHEMA_BACKTRACK_LIMIT)
                        .size_limit(SCHEMA_REGEX_BYTES),
                )
                .build(&input_schema)
            {
                Ok(v) => Some(v),
                Err(e) => {
                    problems.push(Problem {
                        at: "/input".into(),
                        message: format!("the input schema does not compile: {e}"),
                    });
                    None
                }
            },
        };
        let mut base = policy.clone();
        if let Some(d) = &self.defaults {
            apply_settings(
                &mut base,
                "/defaults",
                (d.timeout.as_ref(), d.start_within.as_ref()),
                d.retry.as_ref(),
                &mut problems,
            );
        }
        let mut names: Vec<&str> = vec![];
        let mut steps = vec![];
        let mut pivot = None;
        for (i, s) in self.steps.iter().enumerate() {
            let at = format!("/steps/{i}");
            if names.contains(&s.name.as_str()) {
                problems.push(Problem {
                    at: format!("{at}/name"),
                    message: format!("step {:?} is declared twice: step names are unique", s.name),
                });
            }
            if let Some(known) = services
                && !known.contains(&s.service)
            {
                problems.push(Problem {
                    at: format!("{at}/service"),
                    message: format!(
                        "unknown service {:?} (known: {})",
                        s.service,
                        known.iter().cloned().collect::<Vec<_>>().join(", ")
                    ),
                });
            }
            if s.pivot {
                match pivot {
                    None => pivot = Some(i),
                    Some(first) => problems.push(Problem {
                        at: format!("{at}/pivot"),
                        message: format!(
                            "step {first} is already the pivot: a workflow has at most one"
                        ),
                    }),
                }
            } else if let (Some(p), Some(_)) = (pivot, &s.undo) {
                problems.push(Problem {
                    at: format!("{at}/undo"),
                    message: format!(
                        "step {:?} comes after the pivot (step {p}) and is never undone: remove its undo",
                        s.name
                    ),
                });
            }
            let earlier: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
            let too_many = |m: &Mapping, at: String, problems: &mut Vec<Problem>| {
                if limits == Limits::Publish && m.queries() > super::mapping::MAX_QUERIES {
                    problems.push(Problem {
                        at,
                        message: format!(
                            "{} queries: a mapping holds at most {}",
                            m.queries(),
                            super::mapping::MAX_QUERIES
                        ),
                    });
                }
            };
            let input = Mapping::compile(
                s.input
                    .clone()
                    .unwrap_or_else(|| Value::String("$.input".into())),
                &MappingScope {
                    steps: &earlier,
                    own: None,
                },
                &format!("{at}/input"),
                &mut problems,
            );
            let undo = s.undo.as_ref().map(|u| Undo {
                action: u.action.clone(),
                input: Mapping::compile(
                    u.input
                        .clone()
                        .unwrap_or_else(|| Value::String(format!("$.steps['{}'].result", s.name))),
                    &MappingScope {
                        steps: &earlier,
                        own: Some(&s.name),
                    },
                    &format!("{at}/undo/input"),
                    &mut problems,
                ),
            });
            too_many(&input, format!("{at}/input"), &mut problems);
            if let Some(u) = &undo {
                too_many(&u.input, format!("{at}/undo/input"), &mut problems);
            }
            let mut step_policy = base.clone();
            apply_settings(
                &mut step_policy,
                &at,
                (s.timeout.as_ref(), s.start_within.as_ref()),
                s.retry.as_ref(),
                &mut problems,
            );
            if let Some(cb) = &s.callback {
                step_policy.callback =
                    callback_policy(&format!("{at}/callback"), cb, &mut problems);
            }
            names.push(&s.name);
            steps.push(Step {
                name: s.name.clone(),
                service: s.service.clone(),
                action: s.action.clone().unwrap_or_else(|| s.name.clone()),
                input,
                undo,
                policy: step_policy,
            });
        }
        if steps.len() > MAX_STEPS {
            problems.push(Problem {
                at: "/steps".into(),
                message: format!("at most {MAX_STEPS} steps"),
            });
        }
        match input_validator {
            Some(v) if problems.is_empty() => Ok(Workflow {
                name: self.name.clone(),
                version: 0,
                description: self.description.clone(),
                input_schema: Arc::new(v),
                steps,
                pivot,
                doc: self,
            }),
            _ => Err(DefinitionError(problems)),
        }
    }
}

/// Which bounds a definition is held to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Limits {
    /// Those of today, for a definition being published (and any other check of one).
    Publish,
    /// None of the bounds on cost (schema budget, queries per mapping): a definition stored
    /// under the bounds of its day still loads, so the tasks running on it go on. Rendering
    /// and matching stay bounded at run time whatever the definition.
    Stored,
}

impl Workflow {
    /// Parses and validates a workflow from its JSON value.
    pub fn from_value(
        value: Value,
        services: Option<&BTreeSet<String>>,
        policy: &Policy,
    ) -> Result<Self, DefinitionError> {
        parse_workflow(value)?.validate(services, policy)
    }

    /// Parses and validates a workflow the catalog stored when it was published: as
    /// [`Workflow::from_value`] without the bounds on cost a definition is published under
    /// (see `Limits::Stored`).
    pub fn from_stored(value: Value, policy: &Policy) -> Result<Self, DefinitionError> {
        parse_workflow(value)?.validate_with(None, policy, Limits::Stored)
    }

    /// The same workflow, stamped with its published version.
    pub fn with_version(mut self, version: u32) -> Self {
        self.version = version;
        self
    }

    pub fn step(&self, index: usize) -> Option<&Step> {
        self.steps.get(index)
    }

    /// Checks a task's input against the workflow's input schema.
    pub fn check_input(&self, input: &Value) -> Result<(), InputError> {
        let problems = schema_problems(&self.input_schema, input);
        if problems.is_empty() {
            Ok(())
        } else {
            Err(InputError(problems))
        }
    }

    /// The policy of each step, in order.
    pub fn policies(&self) -> Policies {
        Policies::new(self.steps.iter().map(|s| s.policy.clone()).collect())
    }

    /// The distinct services this workflow uses, in step order.
    pub fn services(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for s in &self.steps {
            if !out.contains(&s.service.as_str()) {
                out.push(&s.service);
            }
        }
        out
    }
}

/// The definitions shipped in `workflows/` (the examples), compiled in for the tests, the
/// chaos harness and the bench. A deployment publishes its own; nothing at run time needs
/// these.
pub mod examples {
    use super::*;

    pub const ECOMMERCE_ORDER: &str = include_str!("../../../workflows/ecommerce-order.yaml");
    pub const LOAN_APPLICATION: &str = include_str!("../../../workflows/loan-application.yaml");
    pub const SERVICES: &str = include_str!("../../../workflows/services.yaml");

    /// The example services (all simulated).
    pub fn services() -> Vec<ServiceDef> {
        parse_value(SERVICES, Format::Yaml)
            .and_then(parse_services)
            .map(|d| d.services)
            .unwrap_or_default()
    }

    fn example(text: &str, policy: &Policy) -> Workflow {
        let names: BTreeSet<String> = services().into_iter().map(|s| s.name).collect();
        // The examples are compiled in and tested (`the_examples_are_valid`).
        #[allow(clippy::expect_used)]
        parse_value(text, Format::Yaml)
            .and_then(|v| Workflow::from_value(v, Some(&names), policy))
            .expect("the example workflows are valid")
            .with_version(1)
    }

    /// `workflows/ecommerce-order.yaml` over `policy`, as version 1.
    pub fn ecommerce_order(policy: &Policy) -> Workflow {
        example(ECOMMERCE_ORDER, policy)
    }

    /// `workflows/loan-application.yaml` over `policy`, as version 1.
    pub fn loan_application(policy: &Policy) -> Workflow {
        example(LOAN_APPLICATION, policy)
    }

    /// The shape of a made-up workflow: which steps have an undo, and the pivot.
    #[derive(Debug, Clone)]
    pub struct Shape {
        pub undos: Vec<bool>,
        pub pivot: Option<usize>,
    }

    /// A made-up workflow of `shape` on the service `inventory` (for property tests).
    pub fn synthetic(shape: &Shape, policy: &Policy) -> Workflow {
        let steps: Vec<Value> = shape
            .undos
            .iter()
            .enumerate()
            .map(|(i, undo)| {
                let mut step = serde_json::json!({"name": format!("s{i}"), "service": "inventory"});
                if *undo {
                    step["undo"] = serde_json::json!({"action": format!("undo-s{i}")});
                }
                if shape.pivot == Some(i) {
                    step["pivot"] = Value::Bool(true);
                }
                step
            })
            .collect();
        #[allow(clippy::expect_used)]
        Workflow::from_value(
            serde_json::json!({"name": "synthetic", "steps": steps}),
            None,
            policy,
        )
        .expect("a synthetic workflow is valid")
        .with_version(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn services() -> BTreeSet<String> {
        let doc = parse_services(
            parse_value(examples::SERVICES, Format::Yaml).expect("services.yaml parses"),
        )
        .expect("services.yaml is valid");
        doc.services.into_iter().map(|s| s.name).collect()
    }

    fn workflow(text: &str) -> Result<Workflow, DefinitionError> {
        let value = parse_value(text, Format::Yaml)?;
        Workflow::from_value(value, Some(&services()), &Policy::default())
    }

    fn problems(text: &str) -> Vec<Problem> {
        workflow(text).expect_err("invalid").0
    }

    #[test]
    fn the_published_schema_compiles() {
        LazyLock::force(&SCHEMAS);
        let root: Value = serde_json::from_str(SCHEMA).expect("JSON");
        jsonschema::meta::validate(&root).expect("a valid JSON Schema");
    }

    #[test]
    fn the_examples_are_valid() {
        let order = workflow(examples::ECOMMERCE_ORDER).expect("ecommerce-order.yaml");
        let names: Vec<_> = order.steps.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            ["reserve-inventory", "charge-payment", "arrange-shipping"]
        );
        assert!(order.steps.iter().all(|s| s.undo.is_some()));
        let loan = workflow(examples::LOAN_APPLICATION).expect("loan-application.yaml");
        assert!(
            loan.steps[0].undo.is_none(),
            "the credit check is read-only"
        );
        assert_eq!(loan.pivot, Some(2));
        assert_ne!(
            loan.steps[0].policy.step_timeout,
            loan.steps[1].policy.step_timeout
        );
        assert_eq!(loan.services(), ["credit-bureau", "core-banking", "e-sign"]);
        assert!(
            loan.steps[3].undo.is_none(),
            "nothing after the pivot is undone"
        );
    }

    #[test]
    fn inputs_are_checked_against_the_input_schema_with_pointers() {
        let loan = workflow(examples::LOAN_APPLICATION).expect("valid");
        loan.check_input(&json!({"applicantId": "a-1", "amount": 25000, "currency": "EUR"}))
            .expect("a valid application");
        let err = loan
            .check_input(&json!({"applicantId": "a-1", "amount": -5, "currency": "EUR"}))
            .expect_err("a negative amount");
        assert_eq!(err.0[0].at, "/amount");
        let err = loan
            .check_input(&json!({"applicantId": "a-1", "amount": 5}))
            .expect_err("no currency");
        assert!(err.to_string().contains("currency"), "{err}");
    }

    const BASE: &str = "name: w\nsteps:\n";

    #[test]
    fn a_duplicate_step_is_named() {
        let p = problems(&format!(
            "{BASE}  - {{name: a, service: inventory}}\n  - {{name: a, service: payment}}\n"
        ));
        assert_eq!(p[0].at, "/steps/1/name");
        assert!(p[0].message.contains("declared twice"), "{p:?}");
    }

    #[test]
    fn an_unknown_service_is_named() {
        let p = problems(&format!("{BASE}  - {{name: a, service: nowhere}}\n"));
        assert_eq!(p[0].at, "/steps/0/service");
        assert!(
            p[0].message.contains("unknown service \"nowhere\""),
            "{p:?}"
        );
    }

    #[test]
    fn a_forward_reference_is_named() {
        let p = problems(&format!(
            "{BASE}  - name: a\n    service: inventory\n    input: {{x: \"$.steps['b'].result.id\"}}\n  - {{name: b, service: payment}}\n"
        ));
        assert_eq!(p[0].at, "/steps/0/input/x");
        assert!(p[0].message.contains("not an earlier step"), "{p:?}");
    }

    #[test]
    fn a_dash_without_brackets_gets_a_hint() {
        let p = problems(&format!(
            "{BASE}  - {{name: check-it, service: inventory}}\n  - name: b\n    service: payment\n    input: {{s: $.steps.check-it.result}}\n"
        ));
        assert_eq!(p[0].at, "/steps/1/input/s");
        assert!(p[0].message.contains("$.steps['check-it'].result"), "{p:?}");
    }

    #[test]
    fn schema_errors_name_their_place() {
        let p = problems(&format!(
            "{BASE}  - {{name: a, service: inventory, colour: red}}\n"
        ));
        assert_eq!(p[0].at, "/steps/0", "{p:?}");
        assert!(p[0].message.contains("colour"), "{p:?}");
        let p = problems(&format!("{BASE}  - {{name: A!, service: inventory}}\n"));
        assert_eq!(p[0].at, "/steps/0/name", "{p:?}");
        let p = problems("name: w\nsteps: []\n");
        assert_eq!(p[0].at, "/steps", "{p:?}");
    }

    #[test]
    fn durations_are_checked_for_range_and_form() {
        let p = problems(&format!(
            "{BASE}  - {{name: a, service: inventory, timeout: 2h}}\n  - {{name: b, service: inventory, timeout: 3 parsecs}}\n  - name: c\n    service: inventory\n    retry: {{baseDelay: 10m, maxDelay: 1m}}\n"
        ));
        let at: Vec<_> = p.iter().map(|p| p.at.as_str()).collect();
        assert_eq!(
            at,
            ["/steps/0/timeout", "/steps/1/timeout", "/steps/2/retry"]
        );
    }

    #[test]
    fn pivots_are_unique_and_nothing_after_one_is_undone() {
        let p = problems(&format!(
            "{BASE}  - {{name: a, service: inventory, pivot: true}}\n  - {{name: b, service: inventory, pivot: true}}\n  - name: c\n    service: inventory\n    undo: {{action: un-c}}\n"
        ));
        let at: Vec<_> = p.iter().map(|p| p.at.as_str()).collect();
        assert_eq!(at, ["/steps/1/pivot", "/steps/2/undo"]);
    }

    #[test]
    fn an_undo_may_read_its_own_steps_result_but_a_step_may_not() {
        let ok = workflow(&format!(
            "{BASE}  - name: a\n    service: inventory\n    undo: {{action: un-a, input: {{id: \"$.steps['a'].result.id\"}}}}\n"
        ));
        assert!(ok.is_ok(), "{ok:?}");
        let p = problems(&format!(
            "{BASE}  - name: a\n    service: inventory\n    input: {{id: \"$.steps['a'].result.id\"}}\n"
        ));
        assert_eq!(p[0].at, "/steps/0/input/id");
    }

    #[test]
    fn a_bad_input_schema_is_rejected() {
        let p =
            problems("name: w\ninput: {type: objekt}\nsteps:\n  - {name: a, service: inventory}\n");
        assert!(p[0].at.starts_with("/input"), "{p:?}");
    }

    #[test]
    fn settings_fall_back_from_step_to_workflow_to_deployment() {
        let w = workflow(
            "name: w\ndefaults: {timeout: 20s, retry: {failureThreshold: 5}}\nsteps:\n  - {name: a, service: inventory, timeout: 3s, retry: {backoffRate: 3}}\n  - {name: b, service: inventory}\n",
        )
        .expect("valid");
        let d = Policy::default();
        let (a, b) = (&w.steps[0].policy, &w.steps[1].policy);
        assert_eq!(a.step_timeout, chrono::Duration::seconds(3));
        assert_eq!((a.failure_threshold, a.backoff_rate), (5, 3.0));
        assert_eq!(b.step_timeout, chrono::Duration::seconds(20));
        assert_eq!(b.backoff_rate, d.backoff_rate);
        assert_eq!(b.retry_base_delay, d.retry_base_delay);
    }

    #[test]
    fn a_start_allowance_falls_back_from_step_to_workflow_to_deployment_and_has_a_range() {
        let w = workflow(
            "name: w\ndefaults: {startWithin: 2m}\nsteps:\n  - {name: a, service: inventory, startWithin: 0s}\n  - {name: b, service: inventory}\n",
        )
        .expect("valid");
        assert_eq!(w.steps[0].policy.start_within, chrono::Duration::zero());
        assert_eq!(w.steps[1].policy.start_within, chrono::Duration::minutes(2));
        let plain =
            workflow("name: w\nsteps:\n  - {name: a, service: inventory}\n").expect("valid");
        assert_eq!(
            plain.steps[0].policy.start_within,
            Policy::default().start_within
        );
        let found =
            problems("name: w\nsteps:\n  - {name: a, service: inventory, startWithin: 2h}\n");
        assert!(
            found.iter().any(|p| p.at == "/steps/0/startWithin"),
            "{found:?}"
        );
    }

    fn service_problems_of(target: Value) -> Vec<Problem> {
        parse_services(json!({"services": [{"name": "bank", "target": target}]}))
            .expect_err("invalid")
            .0
    }

    fn at(problems: &[Problem], pointer: &str) -> bool {
        problems.iter().any(|p| p.at == pointer)
    }

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

    fn input_problems(schema: Value) -> Vec<Problem> {
        Workflow::from_value(
            json!({"name": "w", "input": schema, "steps": [{"name": "a", "service": "inventory"}]}),
            None,
            &Policy::default(),
        )
        .expect_err("a hostile input schema is refused")
        .0
    }

    /// Every task input is checked against its workflow's input schema, in the submission
    /// function: a schema that costs much per input (many patterns, each run on every string
    /// of a 64 KiB input; thousands of keywords; deep nesting) is refused when published.
    #[test]
    fn a_hostile_input_schema_is_refused_at_publish() {
        // Many patterns, on one property...
        let patterns: Vec<Value> = (0..MAX_SCHEMA_PATTERNS + 1)
            .map(|i| json!({"pattern": format!("^(?=(a|aa)*c){i}")}))
            .collect();
        let p = input_problems(json!({"type": "object", "properties": {"s": {"allOf": patterns}}}));
        assert!(
            p.iter()
                .any(|p| p.at == "/input" && p.message.contains("patterns")),
            "{p:?}"
        );
        // ...or as property name patterns.
        let names: serde_json::Map<String, Value> = (0..MAX_SCHEMA_PATTERNS + 1)
            .map(|i| (format!("^k{i}(a|b)*$"), json!({})))
            .collect();
        let p = input_problems(json!({"type": "object", "patternProperties": names}));
        assert!(
            p.iter()
                .any(|p| p.at == "/input" && p.message.contains("patterns")),
            "{p:?}"
        );
        // Many keywords.
        let properties: serde_json::Map<String, Value> = (0..MAX_SCHEMA_KEYWORDS)
            .map(|i| (format!("p{i}"), json!({"type": "string", "maxLength": 8})))
            .collect();
        let p = input_problems(json!({"type": "object", "properties": properties}));
        assert!(
            p.iter()
                .any(|p| p.at == "/input" && p.message.contains("keywords")),
            "{p:?}"
        );
        // Deep nesting.
        let mut deep = json!({"type": "string"});
        for _ in 0..MAX_SCHEMA_DEPTH {
            deep = json!({"type": "object", "properties": {"a": deep}});
        }
        let p = input_problems(deep);
        assert!(
            p.iter()
                .any(|p| p.at == "/input" && p.message.contains("deep")),
            "{p:?}"
        );
        // A pattern that compiles too large (here about 0.5 MB).
        let p = input_problems(json!({"type": "string", "pattern": "^x?.{0,20000}$"}));
        assert!(p.iter().any(|p| p.at == "/input"), "{p:?}");
        // A schema within the budget (every example's, and one at the limits) is accepted.
        let patterns: Vec<Value> = (0..MAX_SCHEMA_PATTERNS)
            .map(|i| json!({"pattern": format!("^x{i}")}))
            .collect();
        let w = Workflow::from_value(
            json!({"name": "w", "input": {"type": "object", "properties": {"s": {"anyOf": patterns}}},
                   "steps": [{"name": "a", "service": "inventory"}]}),
            None,
            &Policy::default(),
        )
        .expect("a schema at the limits");
        w.check_input(&json!({"s": "x7"}))
            .expect("matches one pattern");
        assert!(w.check_input(&json!({"s": "y"})).is_err());
    }

    #[test]
    fn a_stored_definition_over_todays_cost_bounds_still_loads() {
        let mut doc = parse_value(examples::ECOMMERCE_ORDER, Format::Yaml).expect("yaml");
        doc["steps"][0]["input"]["many"] = json!(vec!["$.input.customerId"; 300]);
        let names: BTreeSet<String> = examples::services().into_iter().map(|s| s.name).collect();
        let publish = Workflow::from_value(doc.clone(), Some(&names), &Policy::default());
        assert!(
            publish.is_err_and(|e| e.to_string().contains("at most 256")),
            "refused at publish"
        );
        Workflow::from_stored(doc, &Policy::default()).expect("a stored one loads");
    }
}
