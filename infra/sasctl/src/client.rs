//! A small typed client of the sas HTTP API.

use crate::api::{
    ApiProblem, DefinitionView, ErrorBody, ListPage, ProcessState, Published, ServiceList,
    TaskView, WorkflowList,
};
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::time::Duration;
use url::{Host, Url};

/// How long to wait for a TCP (and TLS) connection.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one request may take in all.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The API answered with an error status. `code` and `message` come from the
    /// `{"error": {...}}` body, or are made up from the status if the body has another shape.
    #[error("{code}: {message}")]
    Api {
        status: u16,
        code: String,
        message: String,
        /// Each problem of an `invalid_definition` or `validation_failed` answer, at its JSON
        /// pointer (empty for other errors).
        problems: Vec<ApiProblem>,
    },
    /// The endpoint could not be reached, or the connection failed mid-answer.
    #[error("cannot reach {url}: {}", innermost(source))]
    Transport {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    /// The API answered success with a body this client cannot read.
    #[error("unexpected answer to {context}: {message}")]
    Decode { context: String, message: String },
    /// The endpoint is not a usable http(s) base URL.
    #[error("invalid endpoint {0:?}: it must be an http:// or https:// URL with a host")]
    Endpoint(String),
    /// The request could not be signed (no credentials, no region).
    #[error("{0}")]
    Signing(String),
    /// `console` cannot listen where it was asked to.
    #[error("{0}")]
    Listen(String),
    /// `--stack`: the stack or its output cannot be read.
    #[error("{0}")]
    Stack(String),
}

/// The deepest cause of an error: the useful part of a reqwest error chain (e.g. "Connection
/// refused (os error 111)").
fn innermost(e: &reqwest::Error) -> String {
    let mut cur: &dyn std::error::Error = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

impl ClientError {
    /// The `sasctl` exit code for this error: [`crate::exit::API`] when the API answered,
    /// [`crate::exit::TRANSPORT`] when it could not be reached, [`crate::exit::USAGE`] for a bad
    /// endpoint.
    pub fn exit_code(&self) -> i32 {
        match self {
            Self::Api { .. } | Self::Decode { .. } => crate::exit::API,
            Self::Transport { .. } => crate::exit::TRANSPORT,
            Self::Endpoint(_) | Self::Signing(_) | Self::Listen(_) => crate::exit::USAGE,
            Self::Stack(_) => crate::exit::TRANSPORT,
        }
    }

    /// The error as `--json` prints it: `{"error": {"code", "message"}}` in the API's own
    /// shape (with `status` and `problems` when the API answered), so a script reads one
    /// document on stdout whatever happened.
    pub fn to_json(&self) -> Value {
        let (code, message) = match self {
            Self::Api { code, message, .. } => (code.as_str(), message.clone()),
            Self::Transport { .. } => ("transport", self.to_string()),
            Self::Decode { .. } => ("unexpected_answer", self.to_string()),
            Self::Endpoint(_) => ("invalid_endpoint", self.to_string()),
            Self::Signing(_) => ("signing", self.to_string()),
            Self::Listen(_) => ("listen", self.to_string()),
            Self::Stack(_) => ("stack", self.to_string()),
        };
        let mut error = serde_json::json!({"code": code, "message": message});
        if let Self::Api {
            status, problems, ..
        } = self
        {
            error["status"] = (*status).into();
            if !problems.is_empty() {
                error["problems"] = serde_json::to_value(problems).unwrap_or(Value::Null);
            }
        }
        serde_json::json!({ "error": error })
    }
}

/// One API call, for [`Client::send`] (which returns the raw JSON answer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request<'a> {
    /// `GET /tasks?state=..&workflow=..&limit=..&cursor=..`; with `key`, a search by key
    /// (`&key=name:value&from=..&to=..`, `state` then optional).
    List {
        state: Option<&'a ProcessState>,
        key: Option<&'a str>,
        from: Option<&'a str>,
        to: Option<&'a str>,
        workflow: Option<&'a str>,
        limit: Option<u32>,
        cursor: Option<&'a str>,
    },
    /// `GET /tasks/{id}` (`?elements_from=..`: a run's page of elements)
    Show {
        id: &'a str,
        elements_from: Option<u32>,
    },
    /// `POST /tasks/{id}/retry|compensate|cancel|resolve`, with `{"reason": ..}` if a
    /// reason is given (a resolve needs one).
    Act {
        id: &'a str,
        action: Action,
        reason: Option<&'a str>,
    },
    /// `GET /workflows`
    Workflows,
    /// `GET /workflows/{name}`, or `GET /workflows/{name}/versions/{v}` for one version.
    Workflow { name: &'a str, version: Option<u32> },
    /// `GET /services`
    Services,
    /// `PUT /services/{name}`, the body one service as JSON.
    PutService { name: &'a str, body: &'a Value },
    /// `PUT /workflows/{name}`, the body the workflow definition as JSON.
    PutWorkflow { name: &'a str, body: &'a Value },
    /// `POST /tasks/{id}/{route}` with a prepared body: `retry-with-input`
    /// (`{"reason", "input"}`), `compensate-from` (`{"reason", "fromStep"}`).
    ActWith {
        id: &'a str,
        route: &'static str,
        body: &'a Value,
    },
    /// `POST /tasks/{id}/skip`: the failed step done by hand, with its result.
    Skip {
        id: &'a str,
        reason: &'a str,
        result: Option<&'a Value>,
    },
    /// `POST /services/{name}/pause|resume`, with `{"reason": ..}` if given (a pause needs one).
    ServiceAction {
        name: &'a str,
        pause: bool,
        reason: Option<&'a str>,
    },
    /// `GET /schedules`
    Schedules,
    /// `PUT /schedules/{name}`, the body one schedule as JSON.
    PutSchedule { name: &'a str, body: &'a Value },
    /// `POST /schedules/{name}/pause|resume`.
    ScheduleAction { name: &'a str, pause: bool },
    /// `DELETE /schedules/{name}`.
    DeleteSchedule { name: &'a str },
    /// `POST /workflows/{name}/tasks`, the body the task's input, with an `Idempotency-Key`
    /// if given.
    Submit {
        workflow: &'a str,
        input: &'a Value,
        idempotency_key: Option<&'a str>,
        /// `Priority: urgent` (normal: no header).
        urgent: bool,
    },
}

impl Request<'_> {
    /// The HTTP method: `GET`, `POST`, `PUT` or `DELETE`.
    pub fn method(&self) -> &'static str {
        match self {
            Self::List { .. }
            | Self::Show { .. }
            | Self::Workflows
            | Self::Workflow { .. }
            | Self::Services
            | Self::Schedules => "GET",
            Self::Act { .. }
            | Self::ActWith { .. }
            | Self::Skip { .. }
            | Self::Submit { .. }
            | Self::ServiceAction { .. }
            | Self::ScheduleAction { .. } => "POST",
            Self::PutService { .. } | Self::PutWorkflow { .. } | Self::PutSchedule { .. } => "PUT",
            Self::DeleteSchedule { .. } => "DELETE",
        }
    }

    /// The JSON body sent, if any.
    fn body(&self) -> Option<Value> {
        match *self {
            Self::Act {
                reason: Some(reason),
                ..
            }
            | Self::ServiceAction {
                reason: Some(reason),
                ..
            } => Some(serde_json::json!({ "reason": reason })),
            Self::PutService { body, .. }
            | Self::PutWorkflow { body, .. }
            | Self::PutSchedule { body, .. } => Some(body.clone()),
            Self::Submit { input, .. } => Some(input.clone()),
            Self::ActWith { body, .. } => Some(body.clone()),
            Self::Skip { reason, result, .. } => {
                let mut body = serde_json::json!({ "reason": reason });
                if let Some(r) = result {
                    body["result"] = r.clone();
                }
                Some(body)
            }
            _ => None,
        }
    }

    /// The path segments under the base URL.
    fn segments(&self) -> Vec<String> {
        let own = |parts: &[&str]| parts.iter().map(|p| (*p).to_owned()).collect();
        match *self {
            Self::List { .. } => own(&["tasks"]),
            Self::Show { id, .. } => own(&["tasks", id]),
            Self::Act { id, action, .. } => own(&["tasks", id, action.as_str()]),
            Self::Workflows => own(&["workflows"]),
            Self::Workflow {
                name,
                version: None,
            } => own(&["workflows", name]),
            Self::Workflow {
                name,
                version: Some(v),
            } => own(&["workflows", name, "versions", &v.to_string()]),
            Self::Services => own(&["services"]),
            Self::PutService { name, .. } => own(&["services", name]),
            Self::PutWorkflow { name, .. } => own(&["workflows", name]),
            Self::Submit { workflow, .. } => own(&["workflows", workflow, "tasks"]),
            Self::Skip { id, .. } => own(&["tasks", id, "skip"]),
            Self::ActWith { id, route, .. } => own(&["tasks", id, route]),
            Self::ServiceAction { name, pause, .. } => {
                own(&["services", name, if pause { "pause" } else { "resume" }])
            }
            Self::Schedules => own(&["schedules"]),
            Self::PutSchedule { name, .. } | Self::DeleteSchedule { name } => {
                own(&["schedules", name])
            }
            Self::ScheduleAction { name, pause } => {
                own(&["schedules", name, if pause { "pause" } else { "resume" }])
            }
        }
    }
}

/// An operator's action on one task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// Process the task again from its failed step (or try its failed undo again).
    Retry,
    /// Undo the task's completed steps.
    Compensate,
    /// Stop a Pending or Processing task and undo what it did.
    Cancel,
    /// Close a failed task by hand (Error or CompensationFailed to Resolved), with a note.
    Resolve,
    /// End the waits a task is in now.
    Wake,
    /// Stop the branches still out of a parallel group a branch's failure stopped.
    StopBranches,
}

impl Action {
    /// The route's last segment, e.g. `retry`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Retry => "retry",
            Self::Compensate => "compensate",
            Self::Cancel => "cancel",
            Self::Resolve => "resolve",
            Self::Wake => "wake",
            Self::StopBranches => "stop-branches",
        }
    }
}

/// Decodes a raw answer into a typed one; `context` names the call in the error.
pub fn decode<T: DeserializeOwned>(context: &str, raw: &Value) -> Result<T, ClientError> {
    T::deserialize(raw).map_err(|e| ClientError::Decode {
        context: context.to_owned(),
        message: e.to_string(),
    })
}

/// A client of the sas HTTP API rooted at `base` (e.g. `http://127.0.0.1:3000`, or an API
/// Gateway stage URL such as `https://abc.execute-api.eu-west-1.amazonaws.com/prod`).
#[derive(Debug, Clone)]
pub struct Client {
    base: Url,
    http: reqwest::Client,
    /// Signs every request (SigV4, `execute-api`), for an IAM-authorized operator API.
    signer: Option<crate::sign::Signer>,
}

impl Client {
    /// A client with sasctl's timeouts. Proxies from the environment are honoured, except for
    /// loopback endpoints, which are always reached directly.
    pub fn new(base: Url) -> Result<Self, ClientError> {
        check_endpoint(&base)?;
        let mut builder = reqwest::Client::builder()
            .user_agent(concat!("sasctl/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(REQUEST_TIMEOUT);
        if is_loopback(&base) {
            builder = builder.no_proxy();
        }
        let http = builder.build().map_err(|source| ClientError::Transport {
            url: base.to_string(),
            source,
        })?;
        Ok(Self {
            base,
            http,
            signer: None,
        })
    }

    /// A client using a caller-built `reqwest::Client`.
    pub fn with_http(base: Url, http: reqwest::Client) -> Result<Self, ClientError> {
        check_endpoint(&base)?;
        Ok(Self {
            base,
            http,
            signer: None,
        })
    }

    /// The same client, signing every request with `signer`.
    pub fn signed(mut self, signer: crate::sign::Signer) -> Self {
        self.signer = Some(signer);
        self
    }

    /// The base URL.
    pub fn base(&self) -> &Url {
        &self.base
    }

    /// The full URL of a request.
    pub fn url(&self, request: &Request<'_>) -> Result<Url, ClientError> {
        let mut url = self.base.clone();
        url.set_query(None);
        url.set_fragment(None);
        url.path_segments_mut()
            .map_err(|()| ClientError::Endpoint(self.base.to_string()))?
            .pop_if_empty()
            .extend(request.segments());
        if let Request::List {
            state,
            key,
            from,
            to,
            workflow,
            limit,
            cursor,
        } = *request
        {
            let mut q = url.query_pairs_mut();
            if let Some(state) = state {
                q.append_pair("state", state.as_str());
            }
            for (name, value) in [("key", key), ("from", from), ("to", to)] {
                if let Some(value) = value {
                    q.append_pair(name, value);
                }
            }
            if let Some(workflow) = workflow {
                q.append_pair("workflow", workflow);
            }
            if let Some(limit) = limit {
                q.append_pair("limit", &limit.to_string());
            }
            if let Some(cursor) = cursor {
                q.append_pair("cursor", cursor);
            }
        }
        if let Request::Show {
            elements_from: Some(from),
            ..
        } = *request
        {
            url.query_pairs_mut()
                .append_pair("elements_from", &from.to_string());
        }
        Ok(url)
    }

    /// Makes one call and returns the raw JSON of a successful (2xx) answer.
    pub async fn send(&self, request: &Request<'_>) -> Result<Value, ClientError> {
        let url = self.url(request)?;
        let transport = |source| ClientError::Transport {
            url: url.to_string(),
            source,
        };
        let mut builder = match request.method() {
            "POST" => self.http.post(url.clone()),
            "PUT" => self.http.put(url.clone()),
            "DELETE" => self.http.delete(url.clone()),
            _ => self.http.get(url.clone()),
        };
        if let Some(body) = request.body() {
            builder = builder.json(&body);
        }
        if let Request::Submit {
            idempotency_key,
            urgent,
            ..
        } = request
        {
            if let Some(key) = idempotency_key {
                builder = builder.header("idempotency-key", *key);
            }
            if *urgent {
                builder = builder.header("priority", "urgent");
            }
        }
        let mut prepared = builder
            .header(reqwest::header::ACCEPT, "application/json")
            .build()
            .map_err(transport)?;
        if let Some(signer) = &self.signer {
            signer
                .sign(&mut prepared)
                .await
                .map_err(|e| ClientError::Signing(e.to_string()))?;
        }
        let response = self.http.execute(prepared).await.map_err(transport)?;
        let status = response.status();
        let body = response.bytes().await.map_err(transport)?;
        if !status.is_success() {
            let mut e = api_error(status, &body);
            if let ClientError::Api {
                status: 401,
                message,
                ..
            } = &mut e
            {
                message.push_str(&match &self.signer {
                    Some(signer) => format!(" ({})", signer.describe()),
                    None => " (sent unsigned: sasctl signs a loopback endpoint when AWS credentials are in the environment, AWS_ACCESS_KEY_ID or AWS_PROFILE, or with --sign always)".into(),
                });
            }
            return Err(e);
        }
        serde_json::from_slice(&body).map_err(|e| ClientError::Decode {
            context: describe(request, &url),
            message: e.to_string(),
        })
    }

    async fn call<T: DeserializeOwned>(&self, request: &Request<'_>) -> Result<T, ClientError> {
        let raw = self.send(request).await?;
        decode(&describe(request, &self.url(request)?), &raw)
    }

    /// One page of the tasks in `state`, of one workflow or of all.
    pub async fn list(
        &self,
        state: &ProcessState,
        workflow: Option<&str>,
        limit: Option<u32>,
        cursor: Option<&str>,
    ) -> Result<ListPage, ClientError> {
        self.call(&Request::List {
            state: Some(state),
            key: None,
            from: None,
            to: None,
            workflow,
            limit,
            cursor,
        })
        .await
    }

    /// One task, with its steps and history.
    pub async fn show(&self, id: &str) -> Result<TaskView, ClientError> {
        self.call(&Request::Show {
            id,
            elements_from: None,
        })
        .await
    }

    /// Asks for a task to be processed again from its failed step (or, when its compensation
    /// failed, for the failed undo to be tried again).
    pub async fn retry(&self, id: &str) -> Result<TaskView, ClientError> {
        self.act(id, Action::Retry, None).await
    }

    /// Asks for a task's completed steps to be undone.
    pub async fn compensate(&self, id: &str) -> Result<TaskView, ClientError> {
        self.act(id, Action::Compensate, None).await
    }

    /// Asks for a task to be cancelled.
    pub async fn cancel(&self, id: &str, reason: Option<&str>) -> Result<TaskView, ClientError> {
        self.act(id, Action::Cancel, reason).await
    }

    /// Closes a failed task by hand, with the note that says how it was settled.
    pub async fn resolve(&self, id: &str, note: &str) -> Result<TaskView, ClientError> {
        self.act(id, Action::Resolve, Some(note)).await
    }

    /// Any action, with the reason recorded in the task's history.
    pub async fn act(
        &self,
        id: &str,
        action: Action,
        reason: Option<&str>,
    ) -> Result<TaskView, ClientError> {
        self.call(&Request::Act { id, action, reason }).await
    }

    /// Every published workflow and its newest version.
    pub async fn workflows(&self) -> Result<WorkflowList, ClientError> {
        self.call(&Request::Workflows).await
    }

    /// One published workflow: its newest version, or `version`.
    pub async fn workflow(
        &self,
        name: &str,
        version: Option<u32>,
    ) -> Result<DefinitionView, ClientError> {
        self.call(&Request::Workflow { name, version }).await
    }

    /// Every published service and its newest version.
    pub async fn services(&self) -> Result<ServiceList, ClientError> {
        self.call(&Request::Services).await
    }

    /// Publishes one service (`body`: `{name, description?, target}`).
    pub async fn put_service(&self, name: &str, body: &Value) -> Result<Published, ClientError> {
        self.call(&Request::PutService { name, body }).await
    }

    /// Publishes a workflow definition (`body`: the definition as JSON).
    pub async fn put_workflow(&self, name: &str, body: &Value) -> Result<Published, ClientError> {
        self.call(&Request::PutWorkflow { name, body }).await
    }
}

/// "GET http://host/tasks/x": names a call in errors.
pub(crate) fn describe(request: &Request<'_>, url: &Url) -> String {
    format!("{} {url}", request.method())
}
fn check_endpoint(base: &Url) -> Result<(), ClientError> {
    if matches!(base.scheme(), "http" | "https") && base.host().is_some() {
        Ok(())
    } else {
        Err(ClientError::Endpoint(base.to_string()))
    }
}

fn is_loopback(url: &Url) -> bool {
    match url.host() {
        Some(Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(Host::Ipv4(a)) => a.is_loopback(),
        Some(Host::Ipv6(a)) => a.is_loopback(),
        None => false,
    }
}

/// The most of a non-JSON error body quoted in a message.
const MAX_QUOTED_BODY: usize = 200;

fn api_error(status: reqwest::StatusCode, body: &[u8]) -> ClientError {
    if let Ok(ErrorBody { error }) = serde_json::from_slice::<ErrorBody>(body) {
        return ClientError::Api {
            status: status.as_u16(),
            code: error.code,
            message: error.message,
            problems: error.problems,
        };
    }
    let reason = status.canonical_reason().unwrap_or("error");
    let text = crate::render::clean(String::from_utf8_lossy(body).trim(), MAX_QUOTED_BODY);
    let message = if text.is_empty() {
        format!("HTTP {} {reason}", status.as_u16())
    } else {
        format!("HTTP {} {reason}: {text}", status.as_u16())
    };
    ClientError::Api {
        status: status.as_u16(),
        code: format!("http_{}", status.as_u16()),
        message,
        problems: vec![],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(base: &str) -> Result<Client, Box<dyn std::error::Error>> {
        Ok(Client::new(Url::parse(base)?)?)
    }

    #[test]
    fn urls_encode_ids_and_keep_a_base_path() -> Result<(), Box<dyn std::error::Error>> {
        let c = client("http://127.0.0.1:3000")?;
        assert_eq!(
            c.url(&Request::Show {
                id: "a/b?c",
                elements_from: None
            })?
            .as_str(),
            "http://127.0.0.1:3000/tasks/a%2Fb%3Fc"
        );
        assert_eq!(
            c.url(&Request::Show {
                id: "r",
                elements_from: Some(100)
            })?
            .as_str(),
            "http://127.0.0.1:3000/tasks/r?elements_from=100"
        );
        let c = client("https://api.example.com/prod/?x=1#f")?;
        assert_eq!(
            c.url(&Request::Act {
                id: "t1",
                action: Action::Cancel,
                reason: None
            })?
            .as_str(),
            "https://api.example.com/prod/tasks/t1/cancel"
        );
        let state = ProcessState::CompensationFailed;
        let url = c.url(&Request::List {
            state: Some(&state),
            key: None,
            from: None,
            to: None,
            workflow: None,
            limit: Some(5),
            cursor: Some("a+b=/c"),
        })?;
        assert_eq!(
            url.as_str(),
            "https://api.example.com/prod/tasks?state=CompensationFailed&limit=5&cursor=a%2Bb%3D%2Fc"
        );
        let url = c.url(&Request::List {
            state: Some(&state),
            key: None,
            from: None,
            to: None,
            workflow: Some("loan application"),
            limit: None,
            cursor: None,
        })?;
        assert_eq!(
            url.as_str(),
            "https://api.example.com/prod/tasks?state=CompensationFailed&workflow=loan+application"
        );
        let url = c.url(&Request::List {
            state: None,
            key: Some("customerId:c 77&x"),
            from: Some("2026-11-30T00:00:00Z"),
            to: None,
            workflow: None,
            limit: None,
            cursor: None,
        })?;
        assert_eq!(
            url.as_str(),
            "https://api.example.com/prod/tasks?key=customerId%3Ac+77%26x&from=2026-11-30T00%3A00%3A00Z"
        );
        Ok(())
    }

    #[test]
    fn catalog_routes_and_methods() -> Result<(), Box<dyn std::error::Error>> {
        let c = client("http://127.0.0.1:3000/")?;
        let body = serde_json::json!({"name": "w"});
        let cases = [
            (Request::Workflows, "GET", "/workflows"),
            (Request::Services, "GET", "/services"),
            (
                Request::Workflow {
                    name: "w/x",
                    version: None,
                },
                "GET",
                "/workflows/w%2Fx",
            ),
            (
                Request::Workflow {
                    name: "w",
                    version: Some(3),
                },
                "GET",
                "/workflows/w/versions/3",
            ),
            (
                Request::PutService {
                    name: "payment",
                    body: &body,
                },
                "PUT",
                "/services/payment",
            ),
            (
                Request::PutWorkflow {
                    name: "w",
                    body: &body,
                },
                "PUT",
                "/workflows/w",
            ),
            (
                Request::Act {
                    id: "t",
                    action: Action::Retry,
                    reason: None,
                },
                "POST",
                "/tasks/t/retry",
            ),
            (
                Request::Act {
                    id: "t",
                    action: Action::Compensate,
                    reason: None,
                },
                "POST",
                "/tasks/t/compensate",
            ),
            (
                Request::Act {
                    id: "t",
                    action: Action::Resolve,
                    reason: Some("n"),
                },
                "POST",
                "/tasks/t/resolve",
            ),
        ];
        for (request, method, path) in cases {
            let url = c.url(&request)?;
            assert_eq!(request.method(), method, "{request:?}");
            assert_eq!(url.path(), path, "{request:?}");
            assert_eq!(
                describe(&request, &url),
                format!("{method} http://127.0.0.1:3000{path}")
            );
        }
        assert_eq!(
            Request::PutWorkflow {
                name: "w",
                body: &body
            }
            .body(),
            Some(body.clone())
        );
        assert_eq!(
            Request::Act {
                id: "t",
                action: Action::Resolve,
                reason: Some("r")
            }
            .body(),
            Some(serde_json::json!({"reason": "r"}))
        );
        assert_eq!(
            Request::Act {
                id: "t",
                action: Action::Retry,
                reason: None
            }
            .body(),
            None
        );
        assert_eq!(
            Request::Show {
                id: "t",
                elements_from: None
            }
            .body(),
            None
        );
        Ok(())
    }

    #[test]
    fn rejects_non_http_endpoints() -> Result<(), url::ParseError> {
        for bad in [
            "mailto:ops@example.com",
            "file:///tmp/x",
            "ftp://example.com",
        ] {
            let err = Client::new(Url::parse(bad)?).err();
            assert!(matches!(err, Some(ClientError::Endpoint(_))), "{bad}");
        }
        Ok(())
    }

    #[test]
    fn error_bodies_become_api_errors() {
        let e = api_error(
            reqwest::StatusCode::CONFLICT,
            br#"{"error":{"code":"conflict","message":"task is Processing"}}"#,
        );
        assert!(
            matches!(&e, ClientError::Api { status: 409, code, .. } if code == "conflict"),
            "{e:?}"
        );
        assert_eq!(e.to_string(), "conflict: task is Processing");
        assert_eq!(e.exit_code(), crate::exit::API);

        let e = api_error(
            reqwest::StatusCode::BAD_REQUEST,
            br#"{"error":{"code":"invalid_definition","message":"m","problems":[{"at":"/steps/1/input","message":"no such step"}]}}"#,
        );
        match &e {
            ClientError::Api { problems, .. } => {
                assert_eq!(problems.len(), 1);
                assert_eq!(problems[0].to_string(), "at /steps/1/input: no such step");
            }
            other => panic!("{other:?}"),
        }

        let e = api_error(
            reqwest::StatusCode::BAD_GATEWAY,
            b"<html>\nbad\tgateway</html>",
        );
        assert_eq!(
            e.to_string(),
            "http_502: HTTP 502 Bad Gateway: <html> bad gateway</html>"
        );
        let e = api_error(reqwest::StatusCode::SERVICE_UNAVAILABLE, b"");
        assert_eq!(e.to_string(), "http_503: HTTP 503 Service Unavailable");
    }
}
