//! The operator's console: server-rendered HTML pages under `/operator/console`, served by the
//! operator function (behind IAM, like every operator route) and by `sas-local`.
//!
//! Every page is built from the operator API's own answers (the same routes `sasctl` calls, in
//! process), so the console shows and does exactly what the API does: no second path to the
//! store. Pages are plain HTML from [`maud`] templates (escaped by construction, compiled into
//! the binary, no build step and no JavaScript); actions are forms with a confirmation page and
//! a reason, posted back and answered with a redirect (post/redirect/get).
//!
//! A form post must come from the console itself: its `Sec-Fetch-Site` must say `same-origin`.
//! The console is for browsers, and every current browser sends it; a post without it (a
//! script's, or a browser too old to say where the form comes from) is refused. `sasctl
//! console` also checks the `Host` of what it forwards.

use super::catalog::ServiceAction;
use super::deps::ApiDeps;
use super::error::ApiError;
use super::graph;
use super::operator::OperatorAction;
use super::request::MAX_REASON_CHARS;
use super::routes::{OPERATOR_PREFIX, Target, answer};
use super::views::TaskView;
use crate::domain::{Caller, Policy, ProcessState, Workflow};
use chrono::{DateTime, SecondsFormat, Utc};
use http::{HeaderMap, HeaderValue, Method, Response, StatusCode, header};
use maud::{DOCTYPE, Markup, PreEscaped, html};
use serde_json::{Value, json};

/// The console's path under the operator API.
pub const CONSOLE: &str = "/console";
/// Tasks per list page.
const PAGE: usize = 25;

const STYLE: &str = include_str!("console.css");

/// The console's root path (`/operator/console`).
pub fn root() -> String {
    format!("{OPERATOR_PREFIX}{CONSOLE}")
}

/// The operator actions the console offers (a retry on a new input and a compensation from a
/// step are options of retry and compensate).
const ACTIONS: [OperatorAction; 7] = [
    OperatorAction::Retry,
    OperatorAction::Compensate,
    OperatorAction::Cancel,
    OperatorAction::Resolve,
    OperatorAction::Skip,
    OperatorAction::Wake,
    OperatorAction::StopBranches,
];

/// The console's action named `name`, if it offers one.
fn console_action(name: &str) -> Option<OperatorAction> {
    name.parse().ok().filter(|a| ACTIONS.contains(a))
}

/// Answers one console request of an authenticated operator. `segments`: the path under the
/// console's root.
pub async fn page(
    deps: &ApiDeps,
    caller: &Caller,
    method: &Method,
    segments: &[&str],
    query: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Response<String> {
    let api = Api { deps, caller };
    match (segments, method) {
        ([] | [""], &Method::GET) => tasks(&api, query).await,
        (["style.css"], &Method::GET) => {
            let mut r = Response::new(STYLE.to_owned());
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/css; charset=utf-8"),
            );
            r.headers_mut().insert(
                header::CACHE_CONTROL,
                HeaderValue::from_static("max-age=300"),
            );
            r
        }
        (["tasks", id], &Method::GET) => task(&api, id, query).await,
        (["tasks", id, action], &Method::GET | &Method::POST) => match console_action(action) {
            None => not_found(),
            Some(action) if method == Method::GET => {
                confirm(&api, id, action, None, StatusCode::OK).await
            }
            Some(_) if !same_origin(headers) => cross_site(),
            Some(action) => act(&api, id, action, body).await,
        },
        (["workflows"], &Method::GET) => workflows(&api).await,
        (["workflows", name], &Method::GET) => workflow(&api, name, query).await,
        (["services"], &Method::GET) => services(&api, None, StatusCode::OK).await,
        (["schedules"], &Method::GET) => schedules(&api).await,
        (["services", name, action], &Method::POST) => match ServiceAction::parse(action) {
            None => not_found(),
            Some(_) if !same_origin(headers) => cross_site(),
            Some(action) => service_action(&api, name, action, body).await,
        },
        (_, &Method::GET | &Method::POST) => not_found(),
        _ => {
            let mut r = error_page(
                StatusCode::METHOD_NOT_ALLOWED,
                "Not allowed",
                "The console answers GET, and POST on its forms.",
            );
            r.headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static("GET, POST"));
            r
        }
    }
}

/// The answer to a page the console does not have.
fn not_found() -> Response<String> {
    error_page(
        StatusCode::NOT_FOUND,
        "Not found",
        "There is no such page in the console.",
    )
}

/// The answer to a form posted from elsewhere.
fn cross_site() -> Response<String> {
    error_page(
        StatusCode::FORBIDDEN,
        "Refused",
        "This form was not posted from the console itself (Sec-Fetch-Site is not same-origin, or missing).",
    )
}

/// Whether a form post says it comes from a page of the same origin. Without fetch metadata
/// it is refused, `Origin` or not: the console cannot tell its own forms from others then.
fn same_origin(headers: &HeaderMap) -> bool {
    headers
        .get("sec-fetch-site")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|site| site.eq_ignore_ascii_case("same-origin"))
}

/// The operator API, called in process as the console's operator.
struct Api<'a> {
    deps: &'a ApiDeps,
    caller: &'a Caller,
}

impl Api<'_> {
    async fn call(&self, method: Method, segments: &[&str], query: &str, body: &[u8]) -> Answer {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        let resp = match Target::parse(segments, &method, true) {
            Ok(Target::Api(route)) => answer(self.deps, self.caller, route, query, &headers, body)
                .await
                .unwrap_or_else(ApiError::response),
            _ => ApiError::RouteNotFound {
                method: method.to_string(),
                path: format!("/{}", segments.join("/")),
            }
            .response(),
        };
        let status = resp.status();
        let value = serde_json::from_str(resp.body()).unwrap_or(Value::Null);
        Answer { status, value }
    }

    async fn get(&self, segments: &[&str], query: &str) -> Answer {
        self.call(Method::GET, segments, query, b"").await
    }
}

/// An answer of the operator API.
struct Answer {
    status: StatusCode,
    value: Value,
}

impl Answer {
    fn ok(&self) -> bool {
        self.status.is_success()
    }

    /// The error page of an answer that is not a success.
    fn error_page(&self) -> Response<String> {
        let message = self.value["error"]["message"]
            .as_str()
            .unwrap_or("the operator API did not answer");
        let title = self.status.canonical_reason().unwrap_or("Error").to_owned();
        error_page(self.status, &title, message)
    }
}

fn text<'v>(v: &'v Value, key: &str) -> &'v str {
    v[key].as_str().unwrap_or("")
}

/// The list under `key` (empty if none).
fn items(v: &Value, key: &str) -> Vec<Value> {
    v[key].as_array().cloned().unwrap_or_default()
}

/// `2026-11-24 10:31:05Z` for an RFC 3339 time; `-` for none.
fn when(v: &Value) -> String {
    v.as_str()
        .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
        .map(|t| {
            t.with_timezone(&Utc)
                .to_rfc3339_opts(SecondsFormat::Secs, true)
                .replace('T', " ")
        })
        .unwrap_or_else(|| "-".to_owned())
}

fn pretty(v: &Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_default()
}

/// A form-encoded query's value of `key`.
fn param(query: &str, key: &str) -> Option<String> {
    url::form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.into_owned())
        .filter(|v| !v.is_empty())
}

/// A query string from pairs (values encoded).
fn query_of(pairs: &[(&str, &str)]) -> String {
    let mut q = url::form_urlencoded::Serializer::new(String::new());
    for (k, v) in pairs {
        if !v.is_empty() {
            q.append_pair(k, v);
        }
    }
    q.finish()
}

fn href(path: &str, pairs: &[(&str, &str)]) -> String {
    let q = query_of(pairs);
    let path = format!("{}{path}", root());
    if q.is_empty() {
        path
    } else {
        format!("{path}?{q}")
    }
}

/// What a path segment must escape (RFC 3986's path characters stay as they are).
const SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'/')
    .add(b'<')
    .add(b'>')
    .add(b'?')
    .add(b'`')
    .add(b'{')
    .add(b'}');

fn segment(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, SEGMENT).to_string()
}

/// A state's badge: its name, coloured by kind (the colour is never the only signal).
fn badge(state: &str) -> Markup {
    html! { span class={ "badge " (graph::kind(state)) } { (state) } }
}

/// The graph of a published definition (its version `version`), with the path of `task` (the
/// operator API's view of it) if given. The definition is compiled here, as the scheduler
/// compiles what it stored, to be drawn.
fn graph_of(definition: &Value, version: u64, task: Option<&Value>) -> Markup {
    let workflow = match Workflow::from_stored(definition.clone(), &Policy::default()) {
        Ok(w) => w.with_version(u32::try_from(version).unwrap_or(0)),
        Err(e) => return html! { p class="problem" { "The graph cannot be drawn: " (e) } },
    };
    let view = match task.map(|t| serde_json::from_value::<TaskView>(t.clone())) {
        Some(Err(e)) => {
            return html! { p class="problem" { "The task's path cannot be drawn: " (e) } };
        }
        other => other.and_then(Result::ok),
    };
    // The SVG is built by `graph::render`, which escapes every text it holds.
    html! {
        figure class="graph" {
            (PreEscaped(graph::render(&workflow, view.as_ref())))
            @if view.is_some() {
                figcaption { "Thick edges: the path the task took. Greyed, dashed: skipped steps; greyed labels: cases not taken." }
            }
        }
    }
}

/// The page frame: title, navigation (with the current section marked), content.
fn frame(title: &str, section: &str, content: Markup) -> Markup {
    let nav = [
        ("Tasks", "tasks", ""),
        ("Workflows", "workflows", "/workflows"),
        ("Services", "services", "/services"),
        ("Schedules", "schedules", "/schedules"),
    ];
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · sas console" }
                link rel="stylesheet" href={ (root()) "/style.css" };
            }
            body {
                a class="skip" href="#main" { "Skip to content" }
                header {
                    nav aria-label="Console" {
                        span class="brand" { "sas" }
                        @for (label, key, path) in nav {
                            @if key == section {
                                a href=(href(path, &[])) aria-current="page" { (label) }
                            } @else {
                                a href=(href(path, &[])) { (label) }
                            }
                        }
                    }
                }
                main id="main" { (content) }
            }
        }
    }
}

/// An HTML answer with the console's headers: no caching, no framing, nothing but its own
/// stylesheet loaded, forms posted only to itself.
fn html_response(status: StatusCode, markup: Markup) -> Response<String> {
    let mut r = Response::new(markup.into_string());
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    r
}

fn error_page(status: StatusCode, title: &str, message: &str) -> Response<String> {
    html_response(
        status,
        frame(
            title,
            "",
            html! {
                h1 { (title) }
                p role="alert" { (message) }
                p { a href=(href("", &[])) { "Back to the tasks" } }
            },
        ),
    )
}

fn redirect(location: &str) -> Response<String> {
    let mut r = html_response(
        StatusCode::SEE_OTHER,
        html! { a href=(location) { "Continue" } },
    );
    if let Ok(v) = HeaderValue::from_str(location) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    r
}

/// The task list: one state (default Error) of one workflow (or all), newest first, paged,
/// with each state's count as its tab.
async fn tasks(api: &Api<'_>, query: &str) -> Response<String> {
    let state = match param(query, "state") {
        None => ProcessState::Error,
        Some(s) => match s.parse::<ProcessState>() {
            Ok(s) => s,
            Err(e) => return error_page(StatusCode::BAD_REQUEST, "Bad request", &e),
        },
    };
    let workflow = param(query, "workflow").unwrap_or_default();
    let cursor = param(query, "cursor").unwrap_or_default();
    // A search by key (`key=name:value`): the tasks it finds in every state, newest first.
    let key = param(query, "key").unwrap_or_default();
    let searching = !key.is_empty();
    let limit = PAGE.to_string();
    let list = api
        .get(
            &["tasks"],
            &query_of(&[
                ("state", if searching { "" } else { state.as_str() }),
                ("key", &key),
                ("workflow", &workflow),
                ("limit", &limit),
                ("cursor", &cursor),
            ]),
        )
        .await;
    if !list.ok() {
        return list.error_page();
    }
    let counts = api
        .get(&["counts"], &query_of(&[("workflow", &workflow)]))
        .await;
    let workflows = api.get(&["workflows"], "").await;
    let names: Vec<&str> = workflows.value["workflows"]
        .as_array()
        .map(|a| a.iter().filter_map(|w| w["name"].as_str()).collect())
        .unwrap_or_default();
    let rows = items(&list.value, "tasks");
    let next = list.value["nextCursor"].as_str();
    let count_of = |s: ProcessState| -> String {
        let c = &counts.value["counts"][s.as_str()];
        match (c["count"].as_u64(), c["capped"].as_bool()) {
            (Some(n), Some(true)) => format!("{n}+"),
            (Some(n), _) => n.to_string(),
            _ => "?".to_owned(),
        }
    };
    let title = match (searching, workflow.is_empty()) {
        (true, true) => format!("Tasks found by {key}"),
        (true, false) => format!("Tasks of {workflow} found by {key}"),
        (false, true) => format!("{state} tasks"),
        (false, false) => format!("{state} tasks of {workflow}"),
    };
    // What a page link keeps: the search, or the state; the workflow either way.
    let here: Vec<(&str, &str)> = if searching {
        vec![("key", &key), ("workflow", &workflow)]
    } else {
        vec![("state", state.as_str()), ("workflow", &workflow)]
    };
    let next_page = |next: &str| {
        let mut pairs = here.clone();
        pairs.push(("cursor", next));
        href("", &pairs)
    };
    let content = html! {
        h1 { (title) }
        form class="search" role="search" method="get" action=(href("", &[])) {
            label for="key" { "Find by key" }
            input id="key" name="key" type="search" value=(key)
                placeholder="customerId:c-77" pattern="[A-Za-z][A-Za-z0-9_]*:.+"
                title="name:value, a search key its workflow declares";
            button type="submit" { "Find" }
        }
        form class="filter" method="get" action=(href("", &[])) {
            @if searching {
                input type="hidden" name="key" value=(key);
            } @else {
                input type="hidden" name="state" value=(state.as_str());
            }
            label for="workflow" { "Workflow" }
            select id="workflow" name="workflow" {
                option value="" selected[workflow.is_empty()] { "All workflows" }
                @for name in &names {
                    option value=(name) selected[*name == workflow] { (name) }
                }
            }
            button type="submit" { "Show" }
        }
        nav class="states" aria-label="States" {
            ul {
                @for s in ProcessState::ALL {
                    li {
                        a href=(href("", &[("state", s.as_str()), ("workflow", &workflow)]))
                            aria-current=[(s == state && !searching).then_some("page")] {
                            (s.as_str()) " " span class="count" { (count_of(s)) }
                        }
                    }
                }
            }
        }
        @if rows.is_empty() && searching {
            p class="empty" { "No task found by " (key) "." }
        } @else if rows.is_empty() {
            p class="empty" { "No " (state.as_str()) " tasks." }
        } @else {
            table class="tasks" {
                caption { (title) ", newest first" }
                thead { tr {
                    th scope="col" { "Task" } th scope="col" { "Workflow" }
                    @if searching { th scope="col" { "State" } }
                    th scope="col" { "Step" }
                    th scope="col" { "Failures" } th scope="col" { "Attempt" } th scope="col" { "Updated" }
                    th scope="col" { "Last error" }
                } }
                tbody {
                    @for t in &rows {
                        tr {
                            td { a class="id" href=(href(&format!("/tasks/{}", segment(text(t, "taskId"))), &[])) { (text(t, "taskId")) } }
                            td { (text(t, "workflow")) }
                            @if searching { td { (badge(text(t, "processState"))) } }
                            td { (t["step"].as_str().unwrap_or("-")) }
                            td class="num" { (t["failureCount"]) }
                            td class="num" { (t["attempt"]) }
                            td { time { (when(&t["updatedAt"])) } }
                            td class="error" { (t["lastError"].as_str().unwrap_or("")) }
                        }
                    }
                }
            }
        }
        nav class="pager" aria-label="Pages" {
            @if !cursor.is_empty() {
                a href=(href("", &here)) { "First page" }
            }
            @if let Some(next) = next {
                a rel="next" href=(next_page(next)) { "Next page" }
            }
        }
    };
    html_response(StatusCode::OK, frame(&title, "tasks", content))
}

/// What the task's waiting wait steps wait for: whether one waits for a time (an operator may
/// end it: `wake`), and the events the others wait for (only their event ends them). A wait
/// step's definition (found by name in `definition`) has `waitFor` for events.
fn waits_of(steps: &[Value], definition: Option<&Value>) -> (bool, Vec<String>) {
    fn find<'a>(v: &'a Value, name: &str) -> Option<&'a Value> {
        match v {
            Value::Object(o)
                if o.get("name").and_then(Value::as_str) == Some(name)
                    && ["wait", "waitUntil", "waitFor"]
                        .iter()
                        .any(|k| o.contains_key(*k)) =>
            {
                Some(v)
            }
            Value::Object(o) => o.values().find_map(|v| find(v, name)),
            Value::Array(a) => a.iter().find_map(|v| find(v, name)),
            _ => None,
        }
    }
    let mut timed = false;
    let mut events = vec![];
    for s in steps {
        if s["status"] != "Waiting" || !s["service"].is_null() {
            continue;
        }
        let name = s["name"].as_str().unwrap_or_default();
        match definition
            .and_then(|d| find(d, name))
            .map(|d| &d["waitFor"])
        {
            Some(Value::Array(names)) => {
                events.extend(names.iter().filter_map(Value::as_str).map(str::to_owned))
            }
            Some(Value::String(one)) => events.push(one.clone()),
            _ => timed = true,
        }
    }
    (timed, events)
}

/// The actions a task in `state` may take (the API decides; this only offers them).
/// The actions that apply to a task in `state`: past its pivot it only goes forward, so it
/// is neither cancelled nor compensated; one in a wait step (`waits`) may have it ended; one
/// whose parallel group a branch's failure stopped (`stopping`) may have the branches still
/// out stopped.
fn actions_for(
    state: &str,
    past_pivot: bool,
    waits: bool,
    stopping: bool,
) -> &'static [OperatorAction] {
    use OperatorAction::*;
    if stopping && state == "Processing" {
        return &[StopBranches];
    }
    match (state, past_pivot, waits) {
        ("Error", false, _) => &[Retry, Compensate, Skip, Resolve],
        ("Error", true, _) => &[Retry, Skip, Resolve],
        ("CompensationFailed", _, _) => &[Retry, Resolve],
        ("Processing", false, true) => &[Cancel, Wake],
        ("Processing", true, true) => &[Wake],
        ("Pending" | "Processing", false, _) => &[Cancel],
        _ => &[],
    }
}

fn action_label(action: OperatorAction) -> &'static str {
    match action {
        OperatorAction::Retry | OperatorAction::RetryWithInput => "Retry",
        OperatorAction::Compensate | OperatorAction::CompensateFrom => "Compensate",
        OperatorAction::Cancel => "Cancel",
        OperatorAction::Skip => "Skip step",
        OperatorAction::Resolve => "Resolve",
        OperatorAction::Wake => "End the wait",
        OperatorAction::StopBranches => "Stop the branches still out",
    }
}

/// What an action does, as the confirmation page says it.
fn action_help(action: OperatorAction) -> &'static str {
    match action {
        OperatorAction::Retry | OperatorAction::RetryWithInput => {
            "The failed step runs again (a step the service refused gets a new idempotency key); from CompensationFailed, the failed undo runs again."
        }
        OperatorAction::Compensate | OperatorAction::CompensateFrom => {
            "Every step that may have taken effect is undone, last first. A task past its pivot step cannot be compensated."
        }
        OperatorAction::Cancel => {
            "The task takes no further step; every step that may have taken effect is undone (a step still out is undone after its deadline)."
        }
        OperatorAction::Resolve | OperatorAction::Skip => {
            "The task is closed by hand, for good: nothing is sent to any service. Say how it was settled."
        }
        OperatorAction::Wake => {
            "The wait ends now, as at its time, and the task goes on with the next step."
        }
        OperatorAction::StopBranches => {
            "A branch failed (its alert went out): the steps still out in the other branches are given up now (each may have taken effect, so it is undone; one whose request may still be in flight is undone after its deadline), and the task is compensated (or stops in Error) at once instead of when they end."
        }
    }
}

/// A task: its summary, its actions, its steps as a timeline, and its history.
async fn task(api: &Api<'_>, id: &str, query: &str) -> Response<String> {
    // A run's page of elements: from `elements_from` (the API's own check refuses a bad one).
    let from = param(query, "elements_from").unwrap_or_default();
    let answer = api
        .get(&["tasks", id], &query_of(&[("elements_from", &from)]))
        .await;
    if !answer.ok() {
        return answer.error_page();
    }
    let t = &answer.value;
    let state = text(t, "processState");
    let task_id = text(t, "taskId");
    let history = items(t, "history");
    let steps = items(t, "steps");
    let current = t["currentStep"].as_str();
    let done = param(query, "done").and_then(|a| console_action(&a));
    // The definition of the version the task runs on, for its graph.
    let version = t["workflowVersion"].to_string();
    let definition = match t["workflow"].as_str() {
        Some(name) if t["workflowVersion"].is_u64() => {
            let answer = api
                .get(&["workflows", name, "versions", &version], "")
                .await;
            answer.ok().then(|| answer.value["definition"].clone())
        }
        _ => None,
    };
    let content = html! {
        h1 { "Task " span class="id" { (task_id) } " " (badge(state)) }
        @if let Some(a) = &done {
            p class="notice" role="status" { (action_label(*a)) " applied: the task is now " strong { (state) } "." }
        }
        dl class="summary" {
            dt { "Workflow" }
            dd { a href=(href(&format!("/workflows/{}", segment(text(t, "workflow"))), &[("version", &t["workflowVersion"].to_string())])) { (text(t, "workflow")) " v" (t["workflowVersion"]) } }
            dt { "State" } dd { (state) }
            dt { "Current step" } dd { (current.unwrap_or("-")) }
            dt { "Failures" } dd { (t["failureCount"]) }
            dt { "Attempt" } dd { (t["attempt"]) }
            dt { "Locked by" } dd { (t["lockedBy"].as_str().unwrap_or("-")) }
            dt { "Deadline" } dd { (when(&t["completeBy"])) }
            @if !t["deadline"].is_null() {
                dt { "Task deadline" } dd { (when(&t["deadline"])) }
            }
            dt { "Caller" } dd { (text(t, "caller")) }
            // Its lane: shown only when it is not the normal one (the view leaves that out).
            @if let Some(p) = t["priority"].as_str() {
                dt { "Priority" } dd { (p) " (its steps go through the " (p) " queues)" }
            }
            @if let Some(gate) = t["gate"].as_object() {
                dt { "Gate" }
                dd {
                    (gate.get("gate").and_then(|g| g.as_str()).unwrap_or("-"))
                    " (" (gate.get("status").and_then(|g| g.as_str()).unwrap_or("-"))
                    ", limit " (gate.get("limit").map(ToString::to_string).unwrap_or_default()) ")"
                    @if let Some(holders) = gate.get("holders").and_then(|h| h.as_array()).filter(|h| !h.is_empty()) {
                        "; held by "
                        @for h in holders {
                            @let id = h.as_str().unwrap_or_default();
                            a class="id" href=(href(&format!("/tasks/{}", segment(id)), &[])) { (id) } " "
                        }
                    }
                    @if let Some(n) = gate.get("ahead").and_then(|n| n.as_u64()) {
                        "; " (n) " before it"
                    }
                }
            }
            @if let Some(keys) = t["keys"].as_object().filter(|k| !k.is_empty()) {
                dt { "Keys" }
                dd {
                    @for (name, value) in keys {
                        @let found = format!("{name}:{}", value.as_str().unwrap_or_default());
                        a class="key" href=(href("", &[("key", &found)])) { (found) } " "
                    }
                }
            }
            @if let Some(e) = t["element"].as_object().filter(|e| e.contains_key("runId")) {
                // An element of a distributed forEach: its run, and the task it runs for.
                dt { (if e.contains_key("first") { "Chunk" } else { "Element" }) } dd { "#" (e["index"]) @if let Some(first) = e.get("first") { " (from element #" (first) ")" } " of run " a class="id" href=(href(&format!("/tasks/{}", segment(text(&t["element"], "runId"))), &[])) { (text(&t["element"], "runId")) } }
                dt { "Task" } dd { a class="id" href=(href(&format!("/tasks/{}", segment(text(&t["element"], "taskId"))), &[])) { (text(&t["element"], "taskId")) } " (step " (text(&t["element"], "step")) ")" }
            } @else if let Some(parent) = t["parent"]["taskId"].as_str() {
                dt { (if t["run"].is_object() { "Run of" } else { "Parent" }) } dd { a class="id" href=(href(&format!("/tasks/{}", segment(parent)), &[])) { (parent) } " (step " (text(&t["parent"], "step")) ")" }
            }
            dt { "Created" } dd { (when(&t["createdAt"])) }
            dt { "Updated" } dd { (when(&t["updatedAt"])) }
            @if let Some(e) = t["lastError"].as_str() {
                dt { "Last error" } dd class="error" { (e) }
            }
        }
        // A wait step waiting: `Waiting`, and no service. Only a wait for a time may be
        // ended; a wait for a named event ends with its event.
        @let (waits, events) = waits_of(&steps, definition.as_ref());
        @let branches = items(t, "branches");
        @let stopping = branches.iter().any(|b| b["state"] == "Error");
        @let actions = actions_for(state, t["pastPivot"] == json!(true), waits, stopping);
        @if !events.is_empty() {
            p class="notice" {
                "Waits for the event " (events.join(" or ")) ": only the event ends the wait. Deliver it with "
                code { "POST " (OPERATOR_PREFIX) "/tasks/" (task_id) "/events/" (events[0]) }
                " (its payload as the body; the task's caller may post it to /tasks/…/events/… too)."
            }
        }
        @if !actions.is_empty() {
            section aria-labelledby="actions" {
                h2 id="actions" { "Actions" }
                ul class="actions" {
                    @for a in actions {
                        li { a class="button" href=(href(&format!("/tasks/{}/{a}", segment(task_id)), &[])) { (action_label(*a)) "…" } }
                    }
                }
            }
        }
        @if let Some(definition) = &definition {
            section aria-labelledby="graph" {
                h2 id="graph" { "Graph" }
                (graph_of(definition, t["workflowVersion"].as_u64().unwrap_or(0), Some(t)))
            }
        }
        section aria-labelledby="steps" {
            h2 id="steps" { "Steps" }
            ol class="timeline" {
                @for s in &steps {
                    @let name = text(s, "name");
                    li class=[(current == Some(name)).then_some("current")] {
                        div class="step-head" {
                            strong { (name) }
                            @if let Some(within) = s["within"].as_str() { " " span class="muted within" { "in " (within) } }
                            @if t["pivot"].as_str() == Some(name) { " " span class="badge warn" title="once it is done the task only goes forward" { "pivot" } }
                            @if let (Some(svc), Some(action)) = (s["service"].as_str(), s["action"].as_str()) {
                                " " span class="service" { (svc) "." (action) }
                            }
                            " " (badge(text(s, "status")))
                            @if let Some(u) = s["undo"].as_str() { " undo " (badge(u)) }
                            @if s["undoable"] == json!(false) { " " span class="muted" { "no undo" } }
                        }
                        p class="step-facts" {
                            @if let Some(a) = s["finishedAttempt"].as_u64() { "finished under attempt " (a) " at " (when(&s["finishedAt"])) ". " }
                            @if current == Some(name) && !t["completeBy"].is_null() { "Deadline " (when(&t["completeBy"])) ". " }
                            @if !s["waitingUntil"].is_null() && s["service"].is_null() { "Waits until " (when(&s["waitingUntil"])) ". " }
                            @else if !s["waitingUntil"].is_null() { "Waits for its callback until " (when(&s["waitingUntil"])) ". " }
                            @if s["generation"].as_u64().is_some_and(|g| g > 0) { "Key generation " (s["generation"]) ". " }
                            @if let Some(child) = s["childTaskId"].as_str() { "Child task " a class="id" href=(href(&format!("/tasks/{}", segment(child)), &[])) { (child) } ". " }
                            @if let Some(run) = s["run"]["taskId"].as_str() {
                                "Run " a class="id" href=(href(&format!("/tasks/{}", segment(run)), &[])) { (run) }
                                @if let Some(state) = s["run"]["processState"].as_str() { " " (badge(state)) }
                                @if s["run"]["counts"].is_object() { ": " (run_counts(&s["run"]["counts"])) }
                                ". "
                            }
                        }
                        @if let Some(elements) = s["elements"].as_array().filter(|e| !e.is_empty()) {
                            // A forEach step: each element's status and undo, in order.
                            p class="elements" {
                                (elements.len()) " elements: "
                                @for (k, e) in elements.iter().enumerate() {
                                    span class="element" title={ "element " (k) } { "#" (k) " " (badge(text(e, "status"))) }
                                    @if let Some(u) = e["undo"].as_str() { " undo " (badge(u)) }
                                    " "
                                }
                            }
                        }
                        @for (label, key) in [("Input", "input"), ("Result", "result"), ("Undo input", "undoInput")] {
                            @if !s[key].is_null() {
                                details {
                                    summary { (label) }
                                    pre { (pretty(&s[key])) }
                                }
                            }
                        }
                        @let events: Vec<&Value> = history.iter().filter(|h| h["step"].as_str() == Some(name)).collect();
                        @if !events.is_empty() {
                            ul class="events" {
                                @for h in events {
                                    li { time { (when(&h["at"])) } " " (text(h, "from")) " → " (text(h, "to")) ": " (text(h, "reason"))
                                        @if let Some(by) = h["by"].as_str() { " (" (by) ")" } }
                                }
                            }
                        }
                    }
                }
            }
        }
        @if t["run"].is_object() {
            (run_section(&t["run"], task_id))
        }
        @if let Some(decisions) = t["decisions"].as_array().filter(|d| !d.is_empty()) {
            section aria-labelledby="groups" {
                h2 id="groups" { "Groups" }
                ul class="groups" {
                    @for d in decisions {
                        li { strong { (text(d, "group")) } ": "
                            @if d["skipped"] == json!(true) { "skipped (its condition did not hold)" }
                            @else if d["otherwise"] == json!(true) { "otherwise ran" }
                            @else if let Some(k) = d["arm"].as_u64() { "case " (k) " ran" }
                            @else if d["parallel"] == json!(true) { "every branch ran" }
                            @else { "no case held: nothing ran" }
                        }
                    }
                }
            }
        }
        section aria-labelledby="history" {
            h2 id="history" { "History" }
            table class="history" {
                thead { tr { th scope="col" { "At" } th scope="col" { "From" } th scope="col" { "To" } th scope="col" { "Step" } th scope="col" { "Attempt" } th scope="col" { "By" } th scope="col" { "Reason" } } }
                tbody {
                    @for h in &history {
                        tr {
                            td { time { (when(&h["at"])) } }
                            td { (text(h, "from")) } td { (text(h, "to")) }
                            td { (h["step"].as_str().unwrap_or("-")) }
                            td class="num" { (h["attempt"]) }
                            td { (h["by"].as_str().unwrap_or("sas")) }
                            td { (text(h, "reason")) }
                        }
                    }
                }
            }
        }
        section aria-labelledby="input" {
            h2 id="input" { "Input" }
            pre { (pretty(&t["input"])) }
        }
    };
    html_response(
        StatusCode::OK,
        frame(&format!("Task {task_id}"), "tasks", content),
    )
}

/// A run's counts in a line: `40 of 100 done, 2 refused, 8 out`, the marks at zero left out;
/// in chunks, `4 of 10 chunks of 10 done, 2 elements refused, 1 out`.
fn run_counts(c: &Value) -> String {
    let chunk = c["chunk"].as_u64().filter(|k| *k > 1);
    let mut line = match chunk {
        Some(k) => format!(
            "{} of {} chunks of {k} done",
            c["done"],
            c["total"].as_u64().unwrap_or(0).div_ceil(k)
        ),
        None => format!("{} of {} done", c["done"], c["total"]),
    };
    let refused = if chunk.is_some() {
        "elements refused"
    } else {
        "refused"
    };
    for (key, label) in [
        ("refused", refused),
        ("out", "out"),
        ("undoing", "undoing"),
        ("undone", "undone"),
        ("undoFailed", "undo failed"),
    ] {
        if c[key].as_u64().is_some_and(|n| n > 0) {
            line.push_str(&format!(", {} {label}", c[key]));
        }
    }
    line
}

/// A distributed forEach's run: its counts and one page of its elements, each a link, with the
/// next page's.
fn run_section(run: &Value, run_id: &str) -> Markup {
    let elements = items(run, "elements");
    let from = run["elementsFrom"].as_u64().unwrap_or(0);
    html! {
        section aria-labelledby="elements" {
            h2 id="elements" { "Elements" }
            p class="run-counts" { (run_counts(&run["counts"]))
                @if let Some(stop) = run["stop"].as_str() { " (stopped: " (stop) ")" } }
            @if !elements.is_empty() {
                table class="elements" {
                    thead { tr { th scope="col" { "#" } th scope="col" { "Element" } th scope="col" { "Mark" } th scope="col" { "State" } } }
                    tbody {
                        @for e in &elements {
                            tr {
                                td class="num" { (e["index"]) }
                                td { a class="id" href=(href(&format!("/tasks/{}", segment(text(e, "taskId"))), &[])) { (text(e, "taskId")) } }
                                td { (e["mark"].as_str().unwrap_or("not opened")) }
                                td { @if let Some(state) = e["processState"].as_str() { (badge(state)) } @else { "-" } }
                            }
                        }
                    }
                }
            }
            nav class="pager" {
                @if from > 0 {
                    a href=(href(&format!("/tasks/{}", segment(run_id)), &[("elements_from", &from.saturating_sub(u64::from(crate::api::views::ELEMENTS_PAGE)).to_string())])) { "← Earlier elements" }
                    " "
                }
                @if let Some(next) = run["nextElementsFrom"].as_u64() {
                    a href=(href(&format!("/tasks/{}", segment(run_id)), &[("elements_from", &next.to_string())])) { "Next elements →" }
                }
            }
        }
    }
}

/// The confirmation of an action: what it does, the reason asked for, and the button.
async fn confirm(
    api: &Api<'_>,
    id: &str,
    action: OperatorAction,
    problem: Option<&str>,
    status: StatusCode,
) -> Response<String> {
    let answer = api.get(&["tasks", id], "").await;
    if !answer.ok() {
        return answer.error_page();
    }
    let t = &answer.value;
    let task_id = text(t, "taskId");
    let label = action_label(action);
    let required = action.needs_reason();
    let content = html! {
        h1 { (label) " task " span class="id" { (task_id) } }
        p { "The task is " (badge(text(t, "processState"))) (t["currentStep"].as_str().map(|s| format!(" at step {s}")).unwrap_or_default()) "." }
        p { (action_help(action)) }
        @if let Some(p) = problem {
            p class="problem" role="alert" { (p) }
        }
        form method="post" action=(href(&format!("/tasks/{}/{action}", segment(task_id)), &[])) {
            label for="reason" { @if required { "How it was settled (required)" } @else { "Reason (recorded in the history)" } }
            textarea id="reason" name="reason" rows="3" maxlength=(MAX_REASON_CHARS) required[required] {}
            @if action == OperatorAction::Skip {
                label for="result" { "The step's result (JSON, optional)" }
                textarea id="result" name="result" rows="5" spellcheck="false" {}
            }
            @if action == OperatorAction::Retry && t["processState"] == json!("Error") {
                label for="input" { "A new input for the task (JSON, optional: only for a step that surely did not take effect)" }
                textarea id="input" name="input" rows="5" spellcheck="false" {}
            }
            @if action == OperatorAction::Compensate {
                @let current = t["currentStep"].as_str();
                @let names: Vec<&str> = t["steps"].as_array().into_iter().flatten()
                    .filter_map(|s| s["name"].as_str())
                    .take_while(|n| Some(*n) != current)
                    .collect();
                @if !names.is_empty() {
                    label for="fromStep" { "Start from" }
                    select id="fromStep" name="fromStep" {
                        option value="" { "the failed step (every step that may have taken effect)" }
                        @for n in names.iter().rev() {
                            option value=(n) { (n) " (later steps settled by hand)" }
                        }
                    }
                }
            }
            div class="buttons" {
                button type="submit" class="primary" { (label) " task" }
                a href=(href(&format!("/tasks/{}", segment(task_id)), &[])) { "Back" }
            }
        }
    };
    html_response(
        status,
        frame(&format!("{label} task {task_id}"), "tasks", content),
    )
}

/// Applies a confirmed action, then sends the browser to the task's page.
async fn act(api: &Api<'_>, id: &str, action: OperatorAction, body: &[u8]) -> Response<String> {
    let reason = url::form_urlencoded::parse(body)
        .find(|(k, _)| k == "reason")
        .map(|(_, v)| v.trim().to_owned())
        .filter(|v| !v.is_empty());
    let result = url::form_urlencoded::parse(body)
        .find(|(k, _)| k == "result")
        .map(|(_, v)| v.trim().to_owned())
        .filter(|v| !v.is_empty());
    let field = |name: &str| {
        url::form_urlencoded::parse(body)
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    };
    let mut payload = json!({});
    if let Some(r) = &reason {
        payload["reason"] = json!(r);
    }
    // A retry on a new input and a compensation from a step have routes of their own.
    let mut route = action;
    if let (OperatorAction::Retry, Some(text)) = (action, field("input")) {
        match serde_json::from_str::<Value>(&text) {
            Ok(v) => payload["input"] = v,
            Err(e) => {
                let problem = format!("the new input is not JSON: {e}");
                return confirm(api, id, action, Some(&problem), StatusCode::BAD_REQUEST).await;
            }
        }
        route = OperatorAction::RetryWithInput;
    }
    if let (OperatorAction::Compensate, Some(step)) = (action, field("fromStep")) {
        payload["fromStep"] = json!(step);
        route = OperatorAction::CompensateFrom;
    }
    if let Some(text) = result {
        match serde_json::from_str::<Value>(&text) {
            Ok(v) => payload["result"] = v,
            Err(e) => {
                let problem = format!("the result is not JSON: {e}");
                return confirm(api, id, action, Some(&problem), StatusCode::BAD_REQUEST).await;
            }
        }
    }
    let payload = payload.to_string();
    let answer = api
        .call(
            Method::POST,
            &["tasks", id, route.as_str()],
            "",
            payload.as_bytes(),
        )
        .await;
    if answer.status == StatusCode::NOT_FOUND {
        return answer.error_page();
    }
    if !answer.ok() {
        let message = answer.value["error"]["message"]
            .as_str()
            .unwrap_or("the operator API refused the action")
            .to_owned();
        return confirm(api, id, action, Some(&message), answer.status).await;
    }
    redirect(&href(
        &format!("/tasks/{}", segment(id)),
        &[("done", action.as_str())],
    ))
}

/// The published workflows and their newest versions.
async fn workflows(api: &Api<'_>) -> Response<String> {
    let answer = api.get(&["workflows"], "").await;
    if !answer.ok() {
        return answer.error_page();
    }
    let rows = items(&answer.value, "workflows");
    let content = html! {
        h1 { "Workflows" }
        table {
            caption { "Published workflows" }
            thead { tr { th scope="col" { "Workflow" } th scope="col" { "Newest version" } th scope="col" { "Tasks" } } }
            tbody {
                @for w in &rows {
                    @let name = text(w, "name");
                    tr {
                        td { a href=(href(&format!("/workflows/{}", segment(name)), &[])) { (name) } }
                        td class="num" { (w["latest"]) }
                        td { a href=(href("", &[("state", "Error"), ("workflow", name)])) { "failed" } " · "
                             a href=(href("", &[("state", "Processing"), ("workflow", name)])) { "running" } }
                    }
                }
            }
        }
    };
    html_response(StatusCode::OK, frame("Workflows", "workflows", content))
}

/// The schedules: what each starts, when (its expression in its time zone), and its next run.
async fn schedules(api: &Api<'_>) -> Response<String> {
    let answer = api.get(&["schedules"], "").await;
    if !answer.ok() {
        return answer.error_page();
    }
    let rows = items(&answer.value, "schedules");
    let content = html! {
        h1 { "Schedules" }
        @if rows.is_empty() {
            p { "No schedule is published (" code { "sasctl schedule apply FILE" } ")." }
        } @else {
            table {
                caption { "Published schedules" }
                thead { tr {
                    th scope="col" { "Schedule" } th scope="col" { "Workflow" }
                    th scope="col" { "Expression" } th scope="col" { "Time zone" }
                    th scope="col" { "Overlap" } th scope="col" { "Next run" }
                } }
                tbody {
                    @for s in &rows {
                        @let workflow = text(s, "workflow");
                        tr {
                            td { (text(s, "name")) }
                            td { a href=(href(&format!("/workflows/{}", segment(workflow)), &[])) { (workflow) } }
                            td { code { (text(s, "expression")) } }
                            td { (text(s, "timezone")) }
                            td { (text(s, "overlap")) }
                            td {
                                @if s["paused"] == true { (badge("paused")) }
                                @else if s["nextRun"].is_string() { (when(&s["nextRun"])) }
                                @else { "none" }
                            }
                        }
                    }
                }
            }
        }
    };
    html_response(StatusCode::OK, frame("Schedules", "schedules", content))
}

/// One workflow's definition (the newest, or `?version=N`), with links to every version.
async fn workflow(api: &Api<'_>, name: &str, query: &str) -> Response<String> {
    let version = param(query, "version").filter(|v| v.parse::<u32>().is_ok());
    let answer = match &version {
        Some(v) => api.get(&["workflows", name, "versions", v], "").await,
        None => api.get(&["workflows", name], "").await,
    };
    if !answer.ok() {
        return answer.error_page();
    }
    let v = &answer.value;
    let shown = v["version"].as_u64().unwrap_or(0);
    let latest = v["latest"].as_u64().unwrap_or(shown);
    let definition = &v["definition"];
    let steps = items(definition, "steps");
    let content = html! {
        h1 { "Workflow " (name) " v" (shown) }
        nav class="versions" aria-label="Versions" {
            "Versions: "
            @for n in 1..=latest {
                @let s = n.to_string();
                a href=(href(&format!("/workflows/{}", segment(name)), &[("version", &s)])) aria-current=[(n == shown).then_some("page")] { "v" (n) } " "
            }
        }
        @if let Some(d) = definition["description"].as_str() { p { (d) } }
        section aria-labelledby="graph" {
            h2 id="graph" { "Graph" }
            (graph_of(definition, shown, None))
        }
        table {
            caption { "Steps" }
            thead { tr { th scope="col" { "#" } th scope="col" { "Step" } th scope="col" { "Service" } th scope="col" { "Undo" } } }
            tbody {
                @for (i, s) in steps.iter().enumerate() {
                    tr {
                        td class="num" { (i + 1) }
                        td { (text(s, "name")) @if s["pivot"] == json!(true) { " " span class="muted" { "(pivot)" } } }
                        td { (text(s, "service")) @if let Some(a) = s["action"].as_str() { "." (a) } }
                        td { (s["undo"]["action"].as_str().unwrap_or("-")) }
                    }
                }
            }
        }
        details {
            summary { "Definition" }
            pre { (pretty(definition)) }
        }
        p { a href=(href("", &[("state", "Error"), ("workflow", name)])) { "Failed tasks of " (name) } }
    };
    html_response(
        StatusCode::OK,
        frame(&format!("Workflow {name}"), "workflows", content),
    )
}

/// The published services, each with its circuit breaker's state.
async fn services(api: &Api<'_>, problem: Option<&str>, status: StatusCode) -> Response<String> {
    let answer = api.get(&["services"], "").await;
    if !answer.ok() {
        return answer.error_page();
    }
    let rows = items(&answer.value, "services");
    let content = html! {
        h1 { "Services" }
        p { "Pausing a service stops every call to it: its tasks' steps wait (nothing fails) until it is resumed." }
        @if let Some(p) = problem {
            p class="problem" role="alert" { (p) }
        }
        table {
            caption { "Published services, their circuit breakers and their limits" }
            thead { tr { th scope="col" { "Service" } th scope="col" { "Newest version" } th scope="col" { "Breaker" } th scope="col" { "Detail" } th scope="col" { "Limits" } th scope="col" { "In flight" } th scope="col" { "Waiting" } th scope="col" { "Action" } } }
            tbody {
                @for s in &rows {
                    @let b = &s["breaker"];
                    @let name = text(s, "name");
                    @let paused = b["state"] == json!("paused");
                    tr {
                        td { (name) }
                        td class="num" { (s["latest"]) }
                        td { (badge(b["state"].as_str().unwrap_or("unknown"))) }
                        td {
                            @if let Some(f) = b["failures"].as_u64() { (f) " consecutive faults" }
                            @if !b["until"].is_null() { "until " (when(&b["until"])) }
                            @if let Some(p) = b["probesLeft"].as_u64() { ", " (p) " probes left" }
                            @if !b["since"].is_null() { "paused since " (when(&b["since"])) }
                            @if let Some(n) = b["note"].as_str() { ": " (n) }
                        }
                        td { (limits_text(s)) }
                        td class="num" { (s["inFlight"].as_u64().unwrap_or(0)) }
                        td class="num" { (s["waiting"].as_u64().unwrap_or(0)) }
                        td {
                            @let action = if paused { ServiceAction::Resume } else { ServiceAction::Pause };
                            form class="inline" method="post" action=(href(&format!("/services/{}/{}", segment(name), action.as_str()), &[])) {
                                @if !paused {
                                    label for={ "why-" (name) } class="visually-hidden" { "Why pause " (name) }
                                    input id={ "why-" (name) } name="reason" required placeholder="why (required)" maxlength=(MAX_REASON_CHARS);
                                }
                                button type="submit" { @if paused { "Resume" } @else { "Pause" } }
                            }
                        }
                    }
                }
            }
        }
    };
    html_response(status, frame("Services", "services", content))
}

/// A service's limits in words: `5 at once, 20/s (burst 5)`, per action after `;`, or the
/// deployment's share (`10 at once (share)`), or `none`.
fn limits_text(s: &Value) -> String {
    fn one(l: &Value) -> Vec<String> {
        let mut parts = vec![];
        if let Some(c) = l["concurrency"].as_u64() {
            parts.push(format!("{c} at once"));
        }
        if let Some(r) = l["rate"]["perSecond"].as_f64() {
            let burst = l["rate"]["burst"].as_u64().unwrap_or(1);
            parts.push(format!("{r}/s (burst {burst})"));
        }
        parts
    }
    let limits = &s["limits"];
    let mut parts = one(limits);
    if let Some(share) = s["share"].as_u64() {
        parts.insert(0, format!("{share} at once (share)"));
    }
    let mut text = parts.join(", ");
    if let Some(actions) = limits["actions"].as_object() {
        for (action, l) in actions {
            let action = format!("{action}: {}", one(l).join(", "));
            text = if text.is_empty() {
                action
            } else {
                format!("{text}; {action}")
            };
        }
    }
    if text.is_empty() {
        "none".to_owned()
    } else {
        text
    }
}

/// Pauses or resumes a service, then shows the services again.
async fn service_action(
    api: &Api<'_>,
    name: &str,
    action: ServiceAction,
    body: &[u8],
) -> Response<String> {
    let reason = url::form_urlencoded::parse(body)
        .find(|(k, _)| k == "reason")
        .map(|(_, v)| v.trim().to_owned())
        .filter(|v| !v.is_empty());
    let payload = match &reason {
        Some(r) => json!({ "reason": r }).to_string(),
        None => String::new(),
    };
    let answer = api
        .call(
            Method::POST,
            &["services", name, action.as_str()],
            "",
            payload.as_bytes(),
        )
        .await;
    if !answer.ok() {
        let message = answer.value["error"]["message"]
            .as_str()
            .unwrap_or("the operator API refused the action")
            .to_owned();
        return services(api, Some(&message), answer.status).await;
    }
    redirect(&href("/services", &[]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_past_its_pivot_is_offered_neither_cancel_nor_compensation() {
        use OperatorAction::*;
        assert_eq!(
            actions_for("Error", false, false, false),
            [Retry, Compensate, Skip, Resolve]
        );
        assert_eq!(
            actions_for("Error", true, false, false),
            [Retry, Skip, Resolve]
        );
        assert_eq!(actions_for("Processing", false, false, false), [Cancel]);
        assert!(actions_for("Processing", true, false, false).is_empty());
        assert!(actions_for("Processed", false, false, false).is_empty());
        // A wait may be ended, past the pivot too.
        assert_eq!(
            actions_for("Processing", false, true, false),
            [Cancel, Wake]
        );
        assert_eq!(actions_for("Processing", true, true, false), [Wake]);
        // A group a branch's failure stopped: its branches still out may be stopped.
        assert_eq!(actions_for("Processing", true, false, true), [StopBranches]);
        assert_eq!(
            actions_for("Error", false, false, true),
            [Retry, Compensate, Skip, Resolve]
        );
    }

    /// A wait for a time may be ended (`wake`); a wait for a named event is not offered it
    /// (the API answers 409): the page says to deliver the event.
    #[test]
    fn only_a_wait_for_a_time_is_offered_wake() {
        let definition = json!({"name": "loan", "steps": [
            {"name": "send", "service": "s"},
            {"name": "prepare", "parallel": [{"name": "a", "steps": [
                {"name": "signature", "waitFor": ["contract-signed"], "within": "7d"}]}]},
            {"name": "cooling-off", "wait": "14d"}]});
        let waiting = |name: &str| json!({"name": name, "status": "Waiting", "service": null});
        let called = json!({"name": "send", "status": "Waiting", "service": "s"});
        assert_eq!(
            waits_of(&[waiting("signature")], Some(&definition)),
            (false, vec!["contract-signed".to_owned()])
        );
        assert_eq!(
            waits_of(&[waiting("cooling-off")], Some(&definition)),
            (true, vec![])
        );
        assert_eq!(waits_of(&[called], Some(&definition)), (false, vec![]));
        let (waits, _) = waits_of(&[waiting("signature")], Some(&definition));
        assert!(!actions_for("Processing", false, waits, false).contains(&OperatorAction::Wake));
    }
}
