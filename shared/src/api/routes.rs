//! The route table: a method and a path (below [`OPERATOR_PREFIX`] on the operator API) to the
//! [`Target`] that answers it, in one place ([`Target::parse`]), and [`answer`], which hands an
//! authenticated request's route to its handler.

use super::catalog::{self, ServiceAction};
use super::deps::ApiDeps;
use super::error::{Answer, ApiError};
use super::operator::{self, OperatorAction};
use super::tasks;
use crate::domain::Caller;
use crate::ports::Kind;
use http::{HeaderMap, Method};
use tracing::{Instrument, info_span};

/// The path every operator route starts with.
pub const OPERATOR_PREFIX: &str = "/operator";

/// Which HTTP API serves a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// The task API (callers, and services' callbacks).
    Task,
    /// The operator API: its paths start with [`OPERATOR_PREFIX`].
    Operator,
}

/// Every route either API serves, as `(api, method, path)` with the path's variable segments
/// in braces, as `docs/openapi.yaml` names them; the console (any method under
/// `/operator/console`, HTML) is left out. [`Target::parse`] is the router; its test proves
/// this list is exactly what it serves, and a test of the document compares its paths to it.
pub const ROUTES: &[(Api, &str, &str)] = &[
    (Api::Task, "POST", "/workflows/{name}/tasks"),
    (Api::Task, "GET", "/tasks"),
    (Api::Task, "GET", "/tasks/{taskId}"),
    (Api::Task, "GET", "/tasks/{taskId}/steps/{step}/result"),
    (Api::Task, "POST", "/tasks/{taskId}/cancel"),
    (Api::Task, "POST", "/tasks/{taskId}/events/{name}"),
    (Api::Task, "POST", "/tasks/{taskId}/callbacks/{token}"),
    (Api::Operator, "POST", "/operator/workflows/{name}/tasks"),
    (Api::Operator, "GET", "/operator/tasks"),
    (Api::Operator, "GET", "/operator/tasks/{taskId}"),
    (
        Api::Operator,
        "GET",
        "/operator/tasks/{taskId}/steps/{step}/result",
    ),
    (
        Api::Operator,
        "POST",
        "/operator/tasks/{taskId}/events/{name}",
    ),
    (Api::Operator, "POST", "/operator/tasks/{taskId}/retry"),
    (
        Api::Operator,
        "POST",
        "/operator/tasks/{taskId}/retry-with-input",
    ),
    (Api::Operator, "POST", "/operator/tasks/{taskId}/compensate"),
    (
        Api::Operator,
        "POST",
        "/operator/tasks/{taskId}/compensate-from",
    ),
    (Api::Operator, "POST", "/operator/tasks/{taskId}/cancel"),
    (Api::Operator, "POST", "/operator/tasks/{taskId}/resolve"),
    (Api::Operator, "POST", "/operator/tasks/{taskId}/skip"),
    (Api::Operator, "POST", "/operator/tasks/{taskId}/wake"),
    (
        Api::Operator,
        "POST",
        "/operator/tasks/{taskId}/stop-branches",
    ),
    (Api::Operator, "GET", "/operator/counts"),
    (Api::Operator, "GET", "/operator/workflows"),
    (Api::Operator, "GET", "/operator/workflows/{name}"),
    (Api::Operator, "PUT", "/operator/workflows/{name}"),
    (
        Api::Operator,
        "GET",
        "/operator/workflows/{name}/versions/{version}",
    ),
    (Api::Operator, "GET", "/operator/services"),
    (Api::Operator, "GET", "/operator/services/{name}"),
    (Api::Operator, "PUT", "/operator/services/{name}"),
    (Api::Operator, "POST", "/operator/services/{name}/pause"),
    (Api::Operator, "POST", "/operator/services/{name}/resume"),
    (Api::Operator, "GET", "/operator/schedules"),
    (Api::Operator, "GET", "/operator/schedules/{name}"),
    (Api::Operator, "PUT", "/operator/schedules/{name}"),
    (Api::Operator, "DELETE", "/operator/schedules/{name}"),
    (Api::Operator, "POST", "/operator/schedules/{name}/pause"),
    (Api::Operator, "POST", "/operator/schedules/{name}/resume"),
];

/// What a request asks for. `'a`: the path's segments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route<'a> {
    /// `POST /workflows/{name}/tasks`.
    Submit {
        workflow: &'a str,
    },
    /// `GET /tasks` on the operator API: by state.
    ListTasks,
    /// `GET /tasks` on the task API: the caller's own.
    ListMyTasks,
    /// `GET /tasks/{id}`.
    GetTask {
        id: &'a str,
    },
    /// `GET /tasks/{id}/steps/{step}/result`: the step's result whole.
    StepResult {
        id: &'a str,
        step: &'a str,
    },
    /// `POST /tasks/{id}/{action}` (on the task API, `cancel` only).
    Act {
        id: &'a str,
        action: OperatorAction,
    },
    /// `POST /tasks/{id}/events/{name}`.
    Event {
        id: &'a str,
        name: &'a str,
    },
    /// `GET /counts`.
    Counts,
    /// `GET /workflows`, `GET /services` (with their breakers).
    Workflows,
    Services,
    /// `GET /workflows/{name}`, `GET /services/{name}`, `GET /workflows/{name}/versions/{v}`
    /// (`version`: as given, checked when answered).
    Definition {
        kind: Kind,
        name: &'a str,
        version: Option<&'a str>,
    },
    /// `PUT /workflows/{name}`, `PUT /services/{name}`.
    Publish {
        kind: Kind,
        name: &'a str,
    },
    /// `POST /services/{name}/pause|resume`.
    PauseOrResume {
        name: &'a str,
        action: ServiceAction,
    },
    /// `GET /schedules`.
    Schedules,
    /// `GET|PUT|DELETE /schedules/{name}`.
    Schedule {
        name: &'a str,
        method: ScheduleMethod,
    },
    /// `POST /schedules/{name}/pause|resume`.
    ScheduleAction {
        name: &'a str,
        action: ServiceAction,
    },
}

/// What `/schedules/{name}` is asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScheduleMethod {
    Get,
    Put,
    Delete,
}

/// Who answers a request: the front door itself (before authentication), or the API's
/// handler of a [`Route`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target<'a> {
    /// `POST /tasks/{id}/callbacks/{token}` (task API): the token is the credential.
    Callback { id: &'a str, token: &'a str },
    /// `/console/...` (operator API, any method): the console's pages, `rest` the path below.
    Console { rest: &'a [&'a str] },
    /// A route of the task or operator API.
    Api(Route<'a>),
}

/// Why a request has no route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unrouted {
    /// No such path.
    NotFound,
    /// The path exists with these methods only.
    MethodNotAllowed(&'static str),
}

impl<'a> Target<'a> {
    /// The target of `method` on `segments` (the path below the API's root, split at `/`),
    /// on the operator API if `operator`.
    pub fn parse(
        segments: &'a [&'a str],
        method: &Method,
        operator: bool,
    ) -> Result<Self, Unrouted> {
        use Route::*;
        let put = method == Method::PUT;
        let op = operator;
        let (allow, target): (&'static str, Target<'a>) = match segments {
            ["console", rest @ ..] if op => return Ok(Target::Console { rest }),
            ["tasks", id, "callbacks", token] if !op => ("POST", Target::Callback { id, token }),
            ["workflows", workflow, "tasks"] => ("POST", Target::Api(Submit { workflow })),
            ["tasks"] if op => ("GET", Target::Api(ListTasks)),
            ["tasks"] => ("GET", Target::Api(ListMyTasks)),
            ["tasks", id] => ("GET", Target::Api(GetTask { id })),
            ["tasks", id, "events", name] => ("POST", Target::Api(Event { id, name })),
            ["tasks", id, "steps", step, "result"] => ("GET", Target::Api(StepResult { id, step })),
            ["tasks", id, "cancel"] if !op => (
                "POST",
                Target::Api(Act {
                    id,
                    action: OperatorAction::Cancel,
                }),
            ),
            ["tasks", id, action] if op => match action.parse() {
                Ok(action) => ("POST", Target::Api(Act { id, action })),
                Err(_) => return Err(Unrouted::NotFound),
            },
            ["counts"] if op => ("GET", Target::Api(Counts)),
            ["workflows"] if op => ("GET", Target::Api(Workflows)),
            ["services"] if op => ("GET", Target::Api(Services)),
            [kind @ ("workflows" | "services"), name] if op => {
                let kind = if *kind == "workflows" {
                    Kind::Workflow
                } else {
                    Kind::Service
                };
                let route = if put {
                    Publish { kind, name }
                } else {
                    Definition {
                        kind,
                        name,
                        version: None,
                    }
                };
                ("GET, PUT", Target::Api(route))
            }
            ["services", name, action] if op => match ServiceAction::parse(action) {
                Some(action) => ("POST", Target::Api(PauseOrResume { name, action })),
                None => return Err(Unrouted::NotFound),
            },
            ["schedules"] if op => ("GET", Target::Api(Schedules)),
            ["schedules", name] if op => {
                let method = match *method {
                    Method::PUT => ScheduleMethod::Put,
                    Method::DELETE => ScheduleMethod::Delete,
                    _ => ScheduleMethod::Get,
                };
                ("GET, PUT, DELETE", Target::Api(Schedule { name, method }))
            }
            ["schedules", name, action] if op => match ServiceAction::parse(action) {
                Some(action) => ("POST", Target::Api(ScheduleAction { name, action })),
                None => return Err(Unrouted::NotFound),
            },
            ["workflows", name, "versions", v] if op => (
                "GET",
                Target::Api(Definition {
                    kind: Kind::Workflow,
                    name,
                    version: Some(v),
                }),
            ),
            _ => return Err(Unrouted::NotFound),
        };
        if allow.split(", ").any(|m| m == method.as_str()) {
            Ok(target)
        } else {
            Err(Unrouted::MethodNotAllowed(allow))
        }
    }
}

/// Answers an authenticated request on a route of the task or operator API (not a callback or
/// a console page: the front door answers those). The console calls it in process for the data
/// of its pages.
pub(crate) async fn answer(
    deps: &ApiDeps,
    caller: &Caller,
    route: Route<'_>,
    query: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Answer {
    match route {
        Route::Submit { workflow } => {
            let span = info_span!("submit", workflow = %workflow, task_id = tracing::field::Empty);
            tasks::submit(deps, caller, workflow, headers, body)
                .instrument(span)
                .await
        }
        Route::ListTasks => {
            operator::list(deps, query)
                .instrument(info_span!("list_tasks"))
                .await
        }
        Route::ListMyTasks => {
            tasks::list_mine(deps, caller, query)
                .instrument(info_span!("list_my_tasks"))
                .await
        }
        Route::GetTask { id } => {
            let span = info_span!("get_task", task_id = %id);
            tasks::get_task(deps, caller, id, query)
                .instrument(span)
                .await
        }
        Route::StepResult { id, step } => {
            let span = info_span!("step_result", task_id = %id, step = %step);
            tasks::step_result(deps, caller, id, step)
                .instrument(span)
                .await
        }
        Route::Act { id, action } => {
            let span = info_span!("act", task_id = %id, action = %action, workflow = tracing::field::Empty, attempt = tracing::field::Empty);
            operator::act(deps, caller, id, action, body)
                .instrument(span)
                .await
        }
        Route::Event { id, name } => {
            let span = info_span!("event", task_id = %id, event = %name);
            super::events::deliver(deps, caller, id, name, headers, body)
                .instrument(span)
                .await
        }
        Route::Counts => operator::counts(deps, query).await,
        Route::Workflows => catalog::entries(deps, Kind::Workflow).await,
        Route::Services => catalog::services(deps).await,
        Route::Definition {
            kind,
            name,
            version,
        } => {
            let version = match version.map(str::parse::<u32>) {
                None => None,
                Some(Ok(v)) => Some(v),
                Some(Err(_)) => return Err(ApiError::InvalidVersion),
            };
            catalog::definition(deps, kind, name, version).await
        }
        Route::PauseOrResume { name, action } => {
            let span = info_span!("service_action", service = %name, action = %action.as_str());
            catalog::pause_or_resume(deps, caller, name, action, body)
                .instrument(span)
                .await
        }
        Route::Publish {
            kind: Kind::Workflow,
            name,
        } => {
            let span = info_span!("publish_workflow", workflow = %name);
            catalog::publish_workflow(deps, name, headers, body)
                .instrument(span)
                .await
        }
        Route::Schedules => super::schedules::list(deps).await,
        Route::Schedule { name, method } => {
            let span = info_span!("schedule", schedule = %name);
            match method {
                ScheduleMethod::Get => super::schedules::get(deps, name).instrument(span).await,
                ScheduleMethod::Put => {
                    super::schedules::apply(deps, name, headers, body)
                        .instrument(span)
                        .await
                }
                ScheduleMethod::Delete => {
                    super::schedules::delete(deps, caller, name)
                        .instrument(span)
                        .await
                }
            }
        }
        Route::ScheduleAction { name, action } => {
            let span = info_span!("schedule_action", schedule = %name, action = %action.as_str());
            super::schedules::pause_or_resume(deps, caller, name, action)
                .instrument(span)
                .await
        }
        Route::Publish {
            kind: Kind::Schedule,
            name,
        } => {
            let span = info_span!("schedule", schedule = %name);
            super::schedules::apply(deps, name, headers, body)
                .instrument(span)
                .await
        }
        Route::Publish {
            kind: Kind::Service,
            name,
        } => {
            let span = info_span!("publish_service", service = %name);
            catalog::publish_service(deps, name, headers, body)
                .instrument(span)
                .await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(method: Method, path: &str, op: bool) -> Result<String, Unrouted> {
        let segments: Vec<&str> = path.split('/').skip(1).collect();
        Target::parse(&segments, &method, op).map(|r| format!("{r:?}"))
    }

    /// Whether `segments` (below the API's root) match `template`'s (a `{...}` matches any).
    fn matches(template: &str, segments: &[&str]) -> bool {
        let t: Vec<&str> = template.split('/').skip(1).collect();
        t.len() == segments.len()
            && t.iter()
                .zip(segments)
                .all(|(t, s)| t.starts_with('{') || t == s)
    }

    /// Every path of up to five segments over a vocabulary of every literal the router and
    /// `ROUTES` use (this file's lowercase string literals, the actions' names) and a variable
    /// value, on each API and method: the router serves it exactly when `ROUTES` names it.
    #[test]
    fn routes_lists_exactly_what_the_router_serves() {
        let mut words: std::collections::BTreeSet<&str> = ["x"].into();
        let source = include_str!("routes.rs");
        for literal in source.split('"').skip(1).step_by(2) {
            if !literal.is_empty() && literal.bytes().all(|b| b.is_ascii_lowercase() || b == b'-') {
                words.insert(literal);
            }
        }
        words.extend(OperatorAction::ALL.map(OperatorAction::as_str));
        words.extend([
            ServiceAction::Pause.as_str(),
            ServiceAction::Resume.as_str(),
        ]);
        for (_, _, path) in ROUTES {
            words.extend(
                path.split('/')
                    .filter(|s| !s.is_empty() && !s.starts_with('{')),
            );
        }
        let words: Vec<&str> = words.into_iter().collect();
        let methods = [
            Method::GET,
            Method::PUT,
            Method::POST,
            Method::DELETE,
            Method::PATCH,
        ];
        let mut served = std::collections::BTreeSet::new();
        let mut path: Vec<&str> = Vec::new();
        // Depth first over the paths, each API at each node.
        fn visit<'w>(
            words: &[&'w str],
            path: &mut Vec<&'w str>,
            methods: &[Method],
            served: &mut std::collections::BTreeSet<(usize, &'static str, &'static str)>,
        ) {
            for (api, op) in [(Api::Task, false), (Api::Operator, true)] {
                if matches!(
                    Target::parse(path, &Method::GET, op),
                    Err(Unrouted::NotFound) | Ok(Target::Console { .. })
                ) {
                    continue;
                }
                for method in methods {
                    let routed = Target::parse(path, method, op).is_ok();
                    let full: Vec<&str> = match api {
                        Api::Task => path.clone(),
                        Api::Operator => std::iter::once("operator")
                            .chain(path.iter().copied())
                            .collect(),
                    };
                    let listed = ROUTES.iter().enumerate().find(|(_, (a, m, t))| {
                        *a == api && *m == method.as_str() && matches(t, &full)
                    });
                    assert_eq!(
                        routed,
                        listed.is_some(),
                        "{method} /{} on the {api:?} API: served {routed}, listed {listed:?}",
                        full.join("/")
                    );
                    if let Some((i, (_, m, t))) = listed {
                        served.insert((i, *m, *t));
                    }
                }
            }
            if path.len() < 5 {
                for w in words {
                    path.push(w);
                    visit(words, path, methods, served);
                    path.pop();
                }
            }
        }
        visit(&words, &mut path, &methods, &mut served);
        assert_eq!(served.len(), ROUTES.len(), "every listed route is served");
    }

    #[test]
    fn each_api_has_its_own_routes_and_methods() {
        use Unrouted::*;
        assert!(parse(Method::POST, "/tasks/t/cancel", false).is_ok());
        assert!(parse(Method::POST, "/tasks/t/retry", false) == Err(NotFound));
        assert!(parse(Method::POST, "/tasks/t/retry-with-input", true).is_ok());
        assert!(parse(Method::POST, "/tasks/t/bogus", true) == Err(NotFound));
        assert!(parse(Method::POST, "/tasks/t/callbacks/k", true) == Err(NotFound));
        assert_eq!(
            parse(Method::GET, "/tasks/t/callbacks/k", false),
            Err(MethodNotAllowed("POST"))
        );
        assert_eq!(
            parse(Method::DELETE, "/workflows/w", true),
            Err(MethodNotAllowed("GET, PUT"))
        );
        assert!(parse(Method::PUT, "/workflows/w", false) == Err(NotFound));
        assert!(parse(Method::DELETE, "/console/anything", true).is_ok());
        assert!(parse(Method::GET, "/console", false) == Err(NotFound));
        assert!(parse(Method::POST, "/services/s/resume", true).is_ok());
        assert!(parse(Method::POST, "/services/s/stop", true) == Err(NotFound));
        assert!(parse(Method::DELETE, "/schedules/s", true).is_ok());
        assert!(parse(Method::DELETE, "/schedules/s", false) == Err(NotFound));
        assert_eq!(
            parse(Method::POST, "/schedules/s", true),
            Err(MethodNotAllowed("GET, PUT, DELETE"))
        );
        assert!(parse(Method::POST, "/schedules/s/pause", true).is_ok());
    }
}
