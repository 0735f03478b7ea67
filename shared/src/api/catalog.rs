//! The operator API's catalog routes: `GET /workflows`, `GET|PUT /workflows/{name}`, `GET
//! /workflows/{name}/versions/{version}`, `GET /services` (with each service's breaker), `GET|PUT
//! /services/{name}`, and `POST /services/{name}/pause|resume` ([`ServiceAction`]).

use super::deps::ApiDeps;
use super::error::{Answer, ApiError, respond};
use super::request::{action_body, json_body};
use crate::catalog::CatalogError;
use crate::domain::transition;
use crate::domain::workflow::{self, MAX_DEFINITION_BYTES, ServiceDef};
use crate::domain::{BreakerRecord, Caller, ProcessState};
use crate::ports::{DefinitionRef, InState, Kind, Paging};
use http::{HeaderMap, StatusCode};
use serde_json::{Value, json};
use tracing::{info, warn};

/// What an operator may do to a service: the last segment of `POST /services/{name}/{action}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServiceAction {
    /// Stop every call to the service (its steps wait); a reason is required.
    Pause,
    /// Let the calls go again.
    Resume,
}

impl ServiceAction {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "pause" => Some(Self::Pause),
            "resume" => Some(Self::Resume),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pause => "pause",
            Self::Resume => "resume",
        }
    }
}

/// The catalog's word for a definition's kind.
fn not_found(kind: Kind, message: String) -> ApiError {
    match kind {
        Kind::Workflow => ApiError::WorkflowNotFound(message),
        Kind::Service => ApiError::ServiceNotFound(message),
        Kind::Schedule => ApiError::ScheduleNotFound(message),
    }
}

/// `GET /services`: every service, its newest version, its circuit breaker and its limits:
/// as declared (`limits`; without a `concurrency`, the deployment's `share` caps its calls in
/// flight), its calls in flight now (`inFlight`, the slots held) and its steps waiting on a
/// limit or on its pause (`waiting`: Pending tasks whose last try it turned away, or its pause
/// deferred, counted up to [`WAITING_CAP`]).
pub(super) async fn services(deps: &ApiDeps) -> Answer {
    let entries = deps
        .ports
        .definitions
        .catalog()
        .entries(Kind::Service)
        .await
        .map_err(ApiError::unavailable)?;
    let defs = deps
        .ports
        .definitions
        .services()
        .await
        .map_err(|e| ApiError::unavailable(e.to_string()))?;
    let now = deps.ports.clock.now();
    let store = &deps.ports.store;
    let looks = entries.iter().map(|e| async move {
        let key = crate::domain::limits::service_key(&e.name, None);
        (
            store.get_breaker(&e.name).await,
            store.slots_held(&key, now).await,
        )
    });
    let (looks, waiting) =
        futures::join!(futures::future::join_all(looks), waiting_on_limits(deps));
    let waiting = waiting?;
    let mut services = Vec::with_capacity(entries.len());
    for (entry, (breaker, in_flight)) in entries.iter().zip(looks) {
        let breaker = breaker_view(breaker.map_err(ApiError::unavailable)?.as_ref());
        let limits = defs.get(&entry.name).and_then(|d| d.limits.clone());
        let share = match &limits {
            Some(l) if l.concurrency.is_some() => None,
            _ => deps.service_share,
        };
        services.push(json!({
            "name": entry.name,
            "latest": entry.latest,
            "breaker": breaker,
            "limits": limits,
            "share": share,
            "inFlight": in_flight.map_err(ApiError::unavailable)?,
            "waiting": waiting.get(entry.name.as_str()).copied().unwrap_or(0),
        }));
    }
    Ok(respond(StatusCode::OK, &json!({ "services": services })))
}

/// The most Pending tasks [`services`] reads to count the steps waiting on a limit.
pub const WAITING_CAP: usize = 1000;

/// Per service, the Pending tasks whose last try its limits turned away (their last error
/// names the service's limiter key) or its pause deferred, among the newest [`WAITING_CAP`]
/// Pending tasks.
async fn waiting_on_limits(
    deps: &ApiDeps,
) -> Result<std::collections::HashMap<String, u32>, ApiError> {
    use crate::ports::{InState, Paging};
    let mut counts = std::collections::HashMap::new();
    let (mut after, mut read) = (None, 0);
    loop {
        let page = deps
            .ports
            .store
            .list(
                InState {
                    state: crate::domain::ProcessState::Pending,
                    workflow: None,
                },
                Paging {
                    limit: 100,
                    after: after.as_ref(),
                },
            )
            .await
            .map_err(ApiError::unavailable)?;
        read += page.items.len();
        for s in &page.items {
            if let Some(service) = s.last_error.as_deref().and_then(waiting_service) {
                *counts.entry(service.to_owned()).or_insert(0) += 1;
            }
        }
        match page.next {
            Some(next) if read < WAITING_CAP => after = Some(next),
            _ => return Ok(counts),
        }
    }
}

/// The service a step's last error says turned it away (`...: service#<name>[#<action>] over
/// its limit of ...`).
/// The service a Pending task's last error says it waits on: one whose limits turned it away,
/// or one paused (`…: service NAME paused by WHO: …`, the deferral's reason).
fn waiting_service(error: &str) -> Option<&str> {
    limited_service(error).or_else(|| paused_service(error))
}

/// The service a deferral by a pause names (`transition::deferred`, from the agent's
/// `RemoteFault::CircuitOpen { paused }`).
fn paused_service(error: &str) -> Option<&str> {
    let (_, rest) = error.split_once("service ")?;
    let (name, _) = rest.split_once(" paused by ")?;
    (!name.is_empty() && !name.contains(' ')).then_some(name)
}

fn limited_service(error: &str) -> Option<&str> {
    let (head, _) = error.split_once(" over its limit of ")?;
    let key = head.rsplit_once("service#")?.1;
    Some(key.split('#').next().unwrap_or(key))
}

/// A breaker as the API shows it: `closed` with its count of consecutive faults, `open` until
/// when, `half-open` with its probes left, `paused` since when, by whom and why.
fn breaker_view(b: Option<&BreakerRecord>) -> Value {
    use crate::domain::BreakerState as B;
    match b.map(|b| (b.state, b.note.as_deref())) {
        None => json!({"state": "closed", "failures": 0}),
        Some((B::Closed { failures }, _)) => json!({"state": "closed", "failures": failures}),
        Some((B::Open { until }, _)) => json!({"state": "open", "until": until}),
        Some((B::HalfOpen { probes_left, until }, _)) => {
            json!({"state": "half-open", "probesLeft": probes_left, "until": until})
        }
        Some((B::Paused { since }, note)) => {
            json!({"state": "paused", "since": since, "note": note})
        }
    }
}

/// `POST /services/{name}/pause|resume`: an operator stops every call to a service (its steps
/// wait, deferred, and nothing fails) or lets them go again. A conditional write of the
/// service's breaker, retried on a lost race with an agent's move of it.
pub(super) async fn pause_or_resume(
    deps: &ApiDeps,
    caller: &Caller,
    name: &str,
    action: ServiceAction,
    body: &[u8],
) -> Answer {
    #[derive(serde::Deserialize, Default)]
    #[serde(deny_unknown_fields)]
    struct PauseBody {
        reason: Option<String>,
    }
    let reason = action_body(body, |b: &PauseBody| b.reason.as_ref())?
        .reason
        .filter(|r| !r.trim().is_empty());
    let pausing = action == ServiceAction::Pause;
    let Some(reason) = reason.or_else(|| (!pausing).then(String::new)) else {
        return Err(ApiError::validation(
            "reason is required to pause a service: say why its steps wait",
        ));
    };
    if !deps.ports.definitions.services().await?.contains_key(name) {
        return Err(ApiError::ServiceNotFound(format!(
            "no service {name:?} is published"
        )));
    }
    for _ in 0..5 {
        let current = deps
            .ports
            .store
            .get_breaker(name)
            .await
            .map_err(ApiError::unavailable)?
            .unwrap_or_else(|| BreakerRecord::closed(name));
        let next = if pausing {
            current.pause(deps.ports.clock.now(), format!("{caller}: {reason}"))
        } else {
            current.resume()
        };
        let Some(next) = next else {
            return Ok(respond(
                StatusCode::OK,
                &json!({"name": name, "breaker": breaker_view(Some(&current)), "changed": false}),
            ));
        };
        // Condition (in put_breaker): the version read - keeps "a pause or resume starts from
        // the breaker as it is": an agent's move in between makes this read again.
        if deps
            .ports
            .store
            .put_breaker(&next)
            .await
            .map_err(ApiError::unavailable)?
        {
            let action = action.as_str();
            info!(service = %name, action, by = %caller, %reason, "service {action}d");
            let mut answer =
                json!({"name": name, "breaker": breaker_view(Some(&next)), "changed": true});
            if !pausing {
                answer["woken"] = json!(wake_paused_tasks(deps, name).await);
            }
            return Ok(respond(StatusCode::OK, &answer));
        }
    }
    Err(ApiError::Conflict {
        message: "the service's breaker kept moving; try again".into(),
        process_state: None,
    })
}

/// The most tasks a resume reads to wake those waiting (it reads the Pending, Compensating and
/// Processing lists for them); the others look again within
/// [`crate::domain::breaker::PAUSE_RECHECK`].
const MAX_WOKEN: usize = 1000;

/// Wakes the tasks with a step waiting for `service` since it was paused (deferred with its
/// pause as their last error), wherever the step stands: on the main line, in a parallel
/// group's branch, as a forEach element. Each is made claimable now
/// ([`transition::resumed`], a conditional write) and gets a work message, so it goes on
/// within seconds of the resume instead of at its next look. Best effort: the resume took
/// effect whatever this does (a task not woken looks again by itself), so a failure is
/// logged, not answered. The tasks woken.
///
/// Where to look: a step deferred on the main line makes its task Pending (Compensating for
/// an undo) with the pause as its last error; a step in a group's branch may leave its task
/// Processing (a sibling out) or show a sibling's error, so every task of a workflow that
/// calls the service, Pending or Processing, is read. A distributed forEach's elements are in
/// no such list ([`crate::domain::StateRecord::listed_by_state`]): one deferred by the pause
/// looks again by itself, at its retry.
async fn wake_paused_tasks(deps: &ApiDeps, service: &str) -> usize {
    let mark = crate::domain::breaker::paused_by(service);
    let ports = &deps.ports;
    let users = match workflows_calling(deps, service).await {
        Ok(users) => users,
        Err(e) => {
            warn!(service, error = %e, "workflows not read; only tasks that say they wait are woken");
            Default::default()
        }
    };
    let mut lists = vec![
        (ProcessState::Pending, None),
        (ProcessState::Compensating, None),
    ];
    lists.extend(
        users
            .iter()
            .map(|w| (ProcessState::Processing, Some(w.as_str()))),
    );
    let (mut woken, mut read) = (0, 0);
    for (state, workflow) in lists {
        let mut after = None;
        loop {
            let of = InState { state, workflow };
            let paging = Paging {
                limit: 100,
                after: after.as_ref(),
            };
            let page = match ports.store.list(of, paging).await {
                Ok(page) => page,
                Err(e) => {
                    warn!(service, error = %e, "waiting tasks not woken; they look again by themselves");
                    return woken;
                }
            };
            read += page.items.len();
            for s in &page.items {
                let says = s.last_error.as_deref().is_some_and(|e| e.contains(&mark));
                let may = state != ProcessState::Compensating && users.contains(&s.workflow);
                if (says || may) && wake_one(deps, service, s.task_id).await {
                    woken += 1;
                }
            }
            match page.next {
                Some(next) if read < MAX_WOKEN => after = Some(next),
                _ => break,
            }
        }
        if read >= MAX_WOKEN {
            break;
        }
    }
    woken
}

/// The workflows whose newest version has a step on `service`.
async fn workflows_calling(
    deps: &ApiDeps,
    service: &str,
) -> Result<std::collections::BTreeSet<String>, CatalogError> {
    let definitions = &deps.ports.definitions;
    let mut users = std::collections::BTreeSet::new();
    for e in definitions.catalog().entries(Kind::Workflow).await? {
        if let Some(w) = definitions.latest(&e.name).await?
            && w.steps.iter().any(|s| s.service == service)
        {
            users.insert(e.name);
        }
    }
    Ok(users)
}

/// Makes the steps of task `id` deferred for `service`'s pause claimable now, and enqueues its
/// work message: whether any were (a lost race with another write reads the task again).
async fn wake_one(deps: &ApiDeps, service: &str, id: crate::TaskId) -> bool {
    let ports = &deps.ports;
    for _ in 0..3 {
        let record = match ports.store.get_state(id).await {
            Ok(Some(r)) => r,
            Ok(None) => return false,
            Err(e) => {
                warn!(service, task_id = %id, error = %e, "waiting task not woken");
                return false;
            }
        };
        let workflow = match crate::handlers::workflow_of(&ports.definitions, &record).await {
            Ok(w) => w,
            Err(e) => {
                warn!(service, task_id = %id, error = %e, "waiting task not woken");
                return false;
            }
        };
        let now = ports.clock.now();
        let Ok(t) = transition::resumed(&record, service, now, &workflow.policies()) else {
            return false;
        };
        // Condition (the transition's): the version read - a claim or reply in between makes
        // this read again.
        match crate::handlers::write(ports.store.as_ref(), &t).await {
            Ok(true) => {
                if let Err(e) = crate::handlers::perform_no_step(&ports.outlets(), &t).await {
                    // Written: the task is due now, and the supervisor's sweep sends it on.
                    warn!(service, task_id = %id, error = %e, "woken task not enqueued");
                }
                return true;
            }
            Ok(false) => continue,
            Err(e) => {
                warn!(service, task_id = %id, error = %e, "waiting task not woken");
                return false;
            }
        }
    }
    false
}

/// `GET /workflows`, `GET /services`: every name and its newest version.
pub(super) async fn entries(deps: &ApiDeps, kind: Kind) -> Answer {
    let entries = deps
        .ports
        .definitions
        .catalog()
        .entries(kind)
        .await
        .map_err(ApiError::unavailable)?;
    let key = match kind {
        Kind::Workflow => "workflows",
        Kind::Service => "services",
        Kind::Schedule => "schedules",
    };
    Ok(respond(StatusCode::OK, &json!({ key: entries })))
}

/// `GET /workflows/{name}[/versions/{v}]`, `GET /services/{name}`.
pub(super) async fn definition(
    deps: &ApiDeps,
    kind: Kind,
    name: &str,
    version: Option<u32>,
) -> Answer {
    match deps
        .ports
        .definitions
        .catalog()
        .definition(DefinitionRef {
            kind,
            name,
            version,
        })
        .await
        .map_err(ApiError::unavailable)?
    {
        Some(d) => Ok(respond(
            StatusCode::OK,
            &json!({"name": d.name, "version": d.version, "publishedAt": d.published_at, "definition": d.body}),
        )),
        None => Err(not_found(
            kind,
            match version {
                Some(v) => format!("no version {v} of {name:?}"),
                None => format!("nothing published as {name:?}"),
            },
        )),
    }
}

/// A definition's body: JSON, and (if it names itself) named as the path says.
pub(super) fn definition_body(
    path_name: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Value, ApiError> {
    if body.len() > MAX_DEFINITION_BYTES {
        return Err(ApiError::DefinitionTooLarge {
            bytes: body.len(),
            limit: MAX_DEFINITION_BYTES,
        });
    }
    let value = json_body(headers, body)?;
    let named = value.get("name").and_then(Value::as_str);
    if named.is_some() && named != Some(path_name) {
        return Err(ApiError::NameMismatch {
            path: path_name.to_owned(),
            named: named.map(str::to_owned),
        });
    }
    Ok(value)
}

pub(super) fn published(name: &str, p: crate::ports::Published) -> http::Response<String> {
    respond(
        if p.created {
            StatusCode::CREATED
        } else {
            StatusCode::OK
        },
        &json!({"name": name, "version": p.version, "created": p.created}),
    )
}

/// `PUT /workflows/{name}`: publishes a new version (201), or answers the newest one if the
/// definition is the same (200). A running task stays on the version it started with.
pub(super) async fn publish_workflow(
    deps: &ApiDeps,
    name: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Answer {
    let value = definition_body(name, headers, body)?;
    let (p, w) = deps.ports.definitions.publish_workflow(value).await?;
    info!(
        version = p.version,
        created = p.created,
        "workflow published"
    );
    Ok(published(&w.name, p))
}

/// `PUT /services/{name}`: publishes a service (201), or answers its newest version if the
/// definition is the same (200).
pub(super) async fn publish_service(
    deps: &ApiDeps,
    name: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Answer {
    let value = definition_body(name, headers, body)?;
    // The problems are at /services/0/...: point them at the body.
    let in_body = |e: workflow::DefinitionError| {
        let problems: Vec<_> =
            e.0.into_iter()
                .map(|p| workflow::Problem {
                    at: p.at.trim_start_matches("/services/0").to_owned(),
                    message: p.message,
                })
                .collect();
        ApiError::from(CatalogError::Invalid(workflow::DefinitionError(problems)))
    };
    let doc = workflow::parse_services(json!({ "services": [value] })).map_err(in_body)?;
    let Some(service): Option<&ServiceDef> = doc.services.first() else {
        return Err(ApiError::InvalidDefinition {
            message: "no service given".into(),
            problems: None,
        });
    };
    match deps.ports.definitions.publish_services(&doc).await {
        Ok(mut out) => match out.pop() {
            Some((_, p)) => {
                info!(
                    version = p.version,
                    created = p.created,
                    "service published"
                );
                Ok(published(&service.name, p))
            }
            None => Err(ApiError::Internal("nothing published")),
        },
        Err(CatalogError::Invalid(e)) => Err(in_body(e)),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::{limited_service, waiting_service};

    /// `GET /services` counts a task waiting on a paused service among its `waiting`.
    #[test]
    fn a_wait_on_a_pause_names_its_service() {
        let e = "reserve-funds: service core-banking paused by arn:aws:iam::1:user/ops: bank maintenance (since 2026-01-01T00:00:00Z)";
        assert_eq!(waiting_service(e), Some("core-banking"));
        let e = "charge: service#bank over its limit of 2 calls in flight";
        assert_eq!(waiting_service(e), Some("bank"));
        assert_eq!(waiting_service("charge: HTTP 500 from the service"), None);
    }

    #[test]
    fn a_wait_on_a_limit_names_its_service() {
        let e = "charge: service#bank#transfer over its limit of 2 calls in flight";
        assert_eq!(limited_service(e), Some("bank"));
        let e = "undo of charge: service#bank over its limit of 20 calls a second";
        assert_eq!(limited_service(e), Some("bank"));
        assert_eq!(
            limited_service("charge: circuit open until 2026-01-01T00:00:00Z"),
            None
        );
    }
}
