//! The operator API's schedule routes: `GET /schedules` (each with its next run), `GET|PUT|DELETE
//! /schedules/{name}`, `POST /schedules/{name}/pause|resume`. The catalog is written first (a
//! schedule's run reads it: a paused or deleted one starts nothing), then the deployment's timer
//! ([`crate::ports::Timetable`]) is set to match; if that fails the answer says so and applying
//! the same schedule again finishes the change.

use super::catalog::{ServiceAction, definition_body, published};
use super::deps::ApiDeps;
use super::error::{Answer, ApiError, respond};
use crate::catalog::CatalogError;
use crate::domain::Caller;
use crate::domain::schedule::{Schedule, ScheduleDef};
use crate::domain::workflow::DefinitionError;
use http::{HeaderMap, StatusCode};
use serde_json::{Value, json};
use tracing::{error, info};

/// A schedule as the API shows it: its definition, version and next run.
fn view(deps: &ApiDeps, s: &Schedule, version: Option<u32>) -> Value {
    let now = deps.ports.clock.now();
    let mut v = serde_json::to_value(&s.def).unwrap_or(Value::Null);
    v["overlap"] = json!(s.def.overlap);
    v["timezone"] = json!(s.def.timezone);
    v["paused"] = json!(s.def.paused);
    v["nextRun"] = json!(next_run_shown(s, now));
    if let Some(version) = version {
        v["version"] = json!(version);
    }
    v
}

/// A schedule's next run as the views show it: to the second (a rate counts its periods from
/// the publication's instant, whose fraction of a second is no one's business); `None` while
/// paused, or when none is left.
fn next_run_shown(s: &Schedule, now: chrono::DateTime<chrono::Utc>) -> Option<String> {
    use chrono::SubsecRound;
    let next = (!s.def.paused).then(|| s.next_run(now)).flatten()?;
    // Rounded up: the run is never shown before it happens.
    let shown = if next.trunc_subsecs(0) == next {
        next
    } else {
        next.trunc_subsecs(0) + chrono::Duration::seconds(1)
    };
    Some(shown.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
}

fn not_found(name: &str) -> ApiError {
    ApiError::ScheduleNotFound(format!("no schedule {name:?} is published"))
}

/// The schedule `name` as published now, or `404 schedule_not_found`.
async fn published_schedule(deps: &ApiDeps, name: &str) -> Result<Schedule, ApiError> {
    deps.ports
        .definitions
        .schedule(name)
        .await?
        .ok_or_else(|| not_found(name))
}

async fn timer_set(deps: &ApiDeps, schedule: &Schedule) -> Result<(), ApiError> {
    deps.timetable.put(schedule).await.map_err(|e| {
        error!(schedule = %schedule.name(), error = %e, "the schedule's timer was not set");
        ApiError::TimetableUnavailable(format!(
            "schedule {:?} is saved, but its timer was not set ({e}): apply it again",
            schedule.name()
        ))
    })
}

/// `GET /schedules`: every schedule, by name, with its next run (`null` while paused).
pub(super) async fn list(deps: &ApiDeps) -> Answer {
    let schedules = deps.ports.definitions.schedules().await?;
    let entries = deps
        .ports
        .definitions
        .catalog()
        .entries(crate::ports::Kind::Schedule)
        .await
        .map_err(ApiError::unavailable)?;
    let version = |name: &str| entries.iter().find(|e| e.name == name).map(|e| e.latest);
    let out: Vec<Value> = schedules
        .iter()
        .map(|s| view(deps, s, version(s.name())))
        .collect();
    Ok(respond(StatusCode::OK, &json!({ "schedules": out })))
}

/// `GET /schedules/{name}`.
pub(super) async fn get(deps: &ApiDeps, name: &str) -> Answer {
    let s = published_schedule(deps, name).await?;
    Ok(respond(StatusCode::OK, &view(deps, &s, None)))
}

/// `PUT /schedules/{name}`: publishes the schedule (201; 200 if unchanged) and sets its timer.
pub(super) async fn apply(deps: &ApiDeps, name: &str, headers: &HeaderMap, body: &[u8]) -> Answer {
    let value = definition_body(name, headers, body)?;
    let doc = crate::domain::workflow::parse_schedules(json!({ "schedules": [value] }))
        .map_err(in_body)?;
    let Some(def) = doc.schedules.into_iter().next() else {
        return Err(ApiError::Internal("nothing to publish"));
    };
    publish(deps, def, Publishing::Definition).await
}

/// Why a schedule is published: its definition (`201` for a new version) or an operator's
/// pause or resume (`200` either way, with `created` saying whether it changed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Publishing {
    Definition,
    Action,
}

/// Publishes `def` and sets its timer: `201` for a new version, `200` if unchanged (an action
/// answers `200` either way, with `changed`).
async fn publish(deps: &ApiDeps, def: ScheduleDef, why: Publishing) -> Answer {
    let (p, schedule) = match deps.ports.definitions.publish_schedule(def).await {
        Ok(done) => done,
        Err(CatalogError::Invalid(e)) => return Err(in_body(e)),
        Err(e) => return Err(e.into()),
    };
    info!(schedule = %schedule.name(), version = p.version, created = p.created, paused = schedule.def.paused, ?why, "schedule published");
    timer_set(deps, &schedule).await?;
    let mut r = published(schedule.name(), p);
    let mut body = view(deps, &schedule, Some(p.version));
    body["created"] = json!(p.created);
    *r.body_mut() = body.to_string();
    if why == Publishing::Action {
        *r.status_mut() = StatusCode::OK;
    }
    Ok(r)
}

/// Problems of a schedule given alone are at `/schedules/0/...`: point them at the body.
fn in_body(e: DefinitionError) -> ApiError {
    let problems: Vec<_> =
        e.0.into_iter()
            .map(|p| crate::domain::workflow::Problem {
                at: p.at.trim_start_matches("/schedules/0").to_owned(),
                message: p.message,
            })
            .collect();
    ApiError::from(CatalogError::Invalid(DefinitionError(problems)))
}

/// `POST /schedules/{name}/pause|resume`: a new version, paused or not (no run starts a task
/// while it is paused), and its timer disabled or enabled.
pub(super) async fn pause_or_resume(
    deps: &ApiDeps,
    caller: &Caller,
    name: &str,
    action: ServiceAction,
) -> Answer {
    let s = published_schedule(deps, name).await?;
    let def = ScheduleDef {
        paused: action == ServiceAction::Pause,
        ..s.def
    };
    info!(schedule = %name, by = %caller.as_str(), action = action.as_str(), "schedule action");
    publish(deps, def, Publishing::Action).await
}

/// `DELETE /schedules/{name}`: no run starts a task any more, and its timer is removed.
pub(super) async fn delete(deps: &ApiDeps, caller: &Caller, name: &str) -> Answer {
    let deleted = deps.ports.definitions.delete_schedule(name).await?;
    if deleted {
        info!(schedule = %name, by = %caller.as_str(), "schedule deleted");
    }
    // Removed again even if it was deleted before: a removal that failed then ends now.
    deps.timetable.remove(name).await.map_err(|e| {
        error!(schedule = %name, error = %e, "the schedule's timer was not removed");
        ApiError::TimetableUnavailable(format!(
            "schedule {name:?} is deleted (no run starts a task), but its timer was not removed ({e}): delete it again"
        ))
    })?;
    if !deleted {
        return Err(not_found(name));
    }
    Ok(respond(
        StatusCode::OK,
        &json!({"name": name, "deleted": true}),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `rate()` schedule published at an instant with nanoseconds shows its next run to the
    /// second (not before it); a cron's is at a whole second anyway.
    #[test]
    fn the_next_run_is_shown_to_the_second() {
        let since = chrono::DateTime::parse_from_rfc3339("2026-11-01T00:00:30.123456789Z")
            .expect("a time")
            .to_utc();
        let def = |expression: &str| -> ScheduleDef {
            serde_json::from_value(json!({"name": "n", "workflow": "w", "expression": expression}))
                .expect("a schedule")
        };
        let rate = Schedule::parse(def("rate(15 minutes)"), since, "").expect("valid");
        assert_eq!(
            next_run_shown(&rate, since).as_deref(),
            Some("2026-11-01T00:15:31Z")
        );
        let cron = Schedule::parse(def("cron(0 2 * * ? *)"), since, "").expect("valid");
        assert_eq!(
            next_run_shown(&cron, since).as_deref(),
            Some("2026-11-01T02:00:00Z")
        );
    }
}
