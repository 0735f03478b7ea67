//! Running one request and checking everything ([`step`]): the answer's shape, what it
//! wrote (nothing partial), idempotency, and what the documentation pins down for its route.

use super::*;

/// Everything the handler may change: the records, the messages queued, the events published,
/// the definitions.
#[derive(PartialEq, Debug)]
pub(crate) struct Snapshot {
    pub(crate) records: HashMap<TaskId, StateRecord>,
    pub(crate) queued: Vec<(String, usize)>,
    pub(crate) events: usize,
    pub(crate) catalog: BTreeMap<(Kind, String), Vec<Value>>,
}

pub(crate) async fn snapshot(system: &System) -> Snapshot {
    let (store, queues, bus) = system.memory.as_ref().expect("the memory backend");
    let r = &system.resources;
    let mut urls = vec![
        r.work_queue_url.clone(),
        r.reply_queue_url.clone(),
        r.timer_queue_url.clone(),
        r.agent_queue_url.clone(),
        r.dead_letter_url.clone(),
    ];
    urls.sort();
    urls.dedup();
    let mut catalog = BTreeMap::new();
    let c = system.definitions.catalog();
    for kind in [Kind::Workflow, Kind::Service] {
        for e in c.entries(kind).await.expect("entries") {
            let mut versions = vec![];
            for v in 1..=e.latest {
                let d = c
                    .definition(sas::ports::DefinitionRef::at(kind, &e.name, v))
                    .await
                    .expect("read")
                    .unwrap_or_else(|| panic!("{} v{v} is listed but missing", e.name));
                versions.push(d.body);
            }
            catalog.insert((kind, e.name), versions);
        }
    }
    Snapshot {
        records: store
            .all_states()
            .into_iter()
            .map(|r| (r.task_id, r))
            .collect(),
        queued: urls
            .into_iter()
            .map(|u| {
                let d = queues.depth(&u);
                (u, d.visible + d.invisible)
            })
            .collect(),
        events: bus.published().len(),
        catalog,
    }
}

pub(crate) fn queued(s: &Snapshot, url: &str) -> usize {
    s.queued
        .iter()
        .find(|(u, _)| u == url)
        .map_or(0, |(_, n)| *n)
}

/// Shortens a body for a failure message.
pub(crate) fn clip(s: &str) -> String {
    if s.len() <= 600 {
        s.to_owned()
    } else {
        let mut end = 600;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}… ({} bytes)", &s[..end], s.len())
    }
}

pub(crate) fn task_id(json: &Value) -> Option<TaskId> {
    json["taskId"].as_str().and_then(|s| s.parse().ok())
}

pub(crate) fn code_of(json: &Value) -> &str {
    json["error"]["code"].as_str().unwrap_or_default()
}

/// Every `error.problems[*]` has a non-empty message and an `at` that is a JSON pointer into
/// `doc`.
pub(crate) fn check_problems(json: &Value, doc: &Value, ctx: &str) -> Result<(), TestCaseError> {
    let problems = json["error"]["problems"].as_array();
    prop_assert!(
        problems.is_some_and(|p| !p.is_empty()),
        "no problems listed: {ctx}"
    );
    for p in problems.into_iter().flatten() {
        let at = p["at"].as_str();
        prop_assert!(at.is_some(), "a problem without `at`: {ctx}");
        let at = at.unwrap_or_default();
        prop_assert!(
            at.is_empty() || at.starts_with('/'),
            "`at` is no JSON pointer ({at:?}): {ctx}"
        );
        prop_assert!(
            doc.pointer(at).is_some(),
            "`at` {at:?} names nothing in the body: {ctx}"
        );
        prop_assert!(
            p["message"].as_str().is_some_and(|m| !m.is_empty()),
            "a problem without a message: {ctx}"
        );
    }
    Ok(())
}

/// What the answer must be for a route whose outcome the model can tell.
#[derive(Debug, PartialEq)]
pub(crate) enum Want {
    Status(StatusCode, &'static str),
    Created,
    /// A replay of this task.
    Replay(TaskId),
    /// Published: `(version, created)`.
    Published(u32, bool),
}

/// Sends one request and checks the answer and the store against the model.
pub(crate) async fn step(
    system: &System,
    model: &mut Model,
    req: &Req,
) -> Result<(), TestCaseError> {
    let r = render(req, model);
    let before = snapshot(system).await;
    prop_assert!(
        before.catalog == model.catalog,
        "the model's definitions are the store's"
    );
    // The answers the documentation pins down, decided on the state before the request.
    let submit_want = match &r.route {
        Route::Submit(name) => Some(expect_submit(model, name, &r)),
        _ => None,
    };
    let publish_want = match &r.route {
        Route::Publish(kind, name) => Some(expect_publish(model, *kind, name, &r)),
        _ => None,
    };
    // The operator API (it serves every route the model knows), as an operator.
    let resp = api::handle(
        &system.operator,
        &sas_blackbox::operator(),
        &r.method,
        &format!("{}{}", api::OPERATOR_PREFIX, r.path),
        &r.headers,
        &r.body,
    )
    .await;
    let status = resp.status();
    let ctx = format!(
        "{} {:?} {:?} body ({} bytes) {:?} -> {} {}",
        r.method,
        r.path,
        r.headers,
        r.body.len(),
        clip(&String::from_utf8_lossy(&r.body)),
        status,
        clip(resp.body())
    );

    // The answer's shape.
    prop_assert!(
        status.is_success() || status.is_client_error(),
        "neither 2xx nor 4xx: {ctx}"
    );
    let json: Value = match serde_json::from_str(resp.body()) {
        Ok(v) => v,
        Err(e) => return Err(TestCaseError::fail(format!("not JSON ({e}): {ctx}"))),
    };
    prop_assert!(json.is_object(), "not a JSON object: {ctx}");
    prop_assert_eq!(
        resp.headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok()),
        Some("application/json"),
        "content type: {}",
        ctx
    );
    let code = code_of(&json);
    if status.is_client_error() {
        prop_assert!(
            sas::api::ApiError::CODES.contains(&code),
            "error.code {code:?} is none of the documented codes: {ctx}"
        );
        prop_assert!(
            json["error"]["message"].is_string(),
            "no error.message: {ctx}"
        );
    }
    if status == StatusCode::METHOD_NOT_ALLOWED {
        prop_assert!(
            resp.headers().contains_key(http::header::ALLOW),
            "405 without Allow: {ctx}"
        );
    }
    prop_assert!(
        matches!(
            status,
            StatusCode::OK | StatusCode::CREATED | StatusCode::ACCEPTED
        ) || !status.is_success(),
        "an undocumented 2xx: {ctx}"
    );

    // What the answer did, and the model updated with it.
    let after = snapshot(system).await;
    let mut created_now = None;
    let mut operated = None;
    if status == StatusCode::ACCEPTED {
        let Some(id) = task_id(&json) else {
            return Err(TestCaseError::fail(format!("202 without a taskId: {ctx}")));
        };
        prop_assert!(
            json["processState"].is_string(),
            "202 without processState: {ctx}"
        );
        if resp.headers().get("idempotent-replayed").is_some() {
            prop_assert!(
                model.created_set.contains(&id),
                "a replay of no task: {ctx}"
            );
        } else if json.get("steps").is_some() {
            prop_assert!(
                model.created_set.contains(&id),
                "an action on no task: {ctx}"
            );
            operated = Some(id);
        } else {
            prop_assert_eq!(&r.method, &Method::POST, "created by a non-POST: {}", ctx);
            prop_assert!(
                !model.created_set.contains(&id),
                "a new task reuses an id: {ctx}"
            );
            prop_assert_eq!(json["processState"].as_str(), Some("Pending"), "{}", ctx);
            let name = json["workflow"].as_str().unwrap_or_default();
            let newest = model.latest(Kind::Workflow, name).map(|(v, _)| v);
            prop_assert!(newest.is_some(), "a task of no workflow: {ctx}");
            prop_assert_eq!(
                json["workflowVersion"].as_u64(),
                newest.map(u64::from),
                "a new task runs the newest version: {}",
                ctx
            );
            model.created.push(id);
            model.created_set.insert(id);
            created_now = Some(id);
        }
    }
    if status == StatusCode::OK
        && let Some(tasks) = json.get("tasks")
    {
        let tasks = tasks.as_array();
        prop_assert!(tasks.is_some(), "tasks is not an array: {ctx}");
        let next = &json["nextCursor"];
        prop_assert!(next.is_null() || next.is_string(), "nextCursor: {ctx}");
        if let Some(c) = next.as_str() {
            model.cursors.push(c.to_owned());
        }
        for t in tasks.into_iter().flatten() {
            let Some(id) = task_id(t) else {
                return Err(TestCaseError::fail(format!(
                    "a listed task without id: {ctx}"
                )));
            };
            let stored = after.records.get(&id);
            prop_assert_eq!(
                t["processState"].as_str(),
                stored.map(|r| r.process_state.as_str()),
                "listed state: {}",
                ctx
            );
            prop_assert_eq!(
                t["workflow"].as_str(),
                stored.map(|r| r.workflow.as_str()),
                "listed workflow: {}",
                ctx
            );
        }
    }
    let mut published = None;
    if status == StatusCode::CREATED {
        prop_assert_eq!(&r.method, &Method::PUT, "created by a non-PUT: {}", ctx);
        prop_assert_eq!(json["created"].as_bool(), Some(true), "{}", ctx);
        let name = json["name"].as_str().unwrap_or_default().to_owned();
        let version = json["version"].as_u64().unwrap_or_default();
        let kind = if r.path.starts_with("/workflows/") {
            Kind::Workflow
        } else {
            Kind::Service
        };
        published = Some((kind, name, version));
    }

    // Idempotency, whatever the path that got there: a key names one request and one task.
    let (store, _, _) = system.memory.as_ref().expect("the memory backend");
    if r.method == Method::POST
        && let Ok(Some(k)) = key_of(&r.headers)
    {
        if let Some(id) = created_now {
            prop_assert!(
                !model.keys.contains_key(&k),
                "a used key created a second task: {ctx}"
            );
            let (task, _) = store
                .get(id)
                .await
                .expect("the memory store answers")
                .unwrap_or_else(|| panic!("task {id} is stored"));
            let request = json!({"workflow": task.workflow, "input": task.input, "replyQueueUrl": task.reply_queue_url});
            model.keys.insert(k, (request, id));
        } else if status == StatusCode::ACCEPTED
            && resp.headers().get("idempotent-replayed").is_some()
        {
            prop_assert_eq!(
                model.keys.get(&k).map(|(_, id)| *id),
                task_id(&json),
                "a replay names the task its key created: {}",
                ctx
            );
        }
    }

    // Nothing partial: records, queues, events and definitions.
    match (created_now, operated, &published) {
        (Some(id), _, _) => {
            let mut rest = after.records.clone();
            let new = rest.remove(&id);
            prop_assert!(new.is_some(), "a 202 task without its record: {ctx}");
            prop_assert!(
                rest == before.records,
                "a creation changed other records: {ctx}"
            );
            let url = &system.resources.work_queue_url;
            prop_assert!(
                queued(&after, url) > queued(&before, url),
                "a new task without its work message: {ctx}"
            );
            prop_assert!(
                after.catalog == before.catalog,
                "a creation changed a definition: {ctx}"
            );
        }
        (None, Some(id), _) => {
            let mut a = after.records.clone();
            let mut b = before.records.clone();
            let changed = a.remove(&id);
            b.remove(&id);
            prop_assert!(a == b, "an action changed other records: {ctx}");
            let state = changed.map(|r| r.process_state.as_str());
            prop_assert_eq!(
                json["processState"].as_str(),
                state,
                "action's state: {}",
                ctx
            );
            prop_assert!(
                after.catalog == before.catalog,
                "an action changed a definition: {ctx}"
            );
        }
        (None, None, Some((kind, name, version))) => {
            prop_assert!(
                after.records == before.records
                    && after.queued == before.queued
                    && after.events == before.events,
                "a publication changed tasks, queues or events: {ctx}"
            );
            let mut a = after.catalog.clone();
            let mut b = before.catalog.clone();
            let key = (*kind, name.clone());
            let now = a.remove(&key).unwrap_or_default();
            let then = b.remove(&key).unwrap_or_default();
            prop_assert!(a == b, "a publication changed other definitions: {ctx}");
            prop_assert_eq!(now.len(), then.len() + 1, "one new version: {}", ctx);
            prop_assert_eq!(now.len() as u64, *version, "its number: {}", ctx);
            prop_assert!(
                now[..then.len()] == then[..],
                "an earlier version changed: {ctx}"
            );
            model.catalog.insert(key, now);
        }
        (None, None, None) => {
            prop_assert!(
                after == before,
                "an answer that is no 201 or 202 ({status}) changed records, queues, events or definitions: {ctx}"
            );
        }
    }
    prop_assert_eq!(
        after.records.len(),
        model.created.len(),
        "record count: {}",
        ctx
    );
    for (id, rec) in &after.records {
        prop_assert!(
            model.created_set.contains(id),
            "a record of no known task: {ctx}"
        );
        let w = system
            .definitions
            .workflow(&rec.workflow, rec.workflow_version)
            .await
            .expect("the catalog answers");
        let Some(w) = w else {
            return Err(TestCaseError::fail(format!(
                "record {id} runs an unpublished version: {ctx}"
            )));
        };
        if let Err(e) = rec.check(&w.policies()) {
            return Err(TestCaseError::fail(format!(
                "record {id} breaks {e:?}: {ctx}"
            )));
        }
    }
    for id in &model.created {
        let found = store.get(*id).await.expect("the memory store answers");
        prop_assert!(
            found.is_some(),
            "task {id} without its task or record: {ctx}"
        );
    }

    // What the documentation pins down for this route.
    match &r.route {
        Route::Submit(name) => {
            let (want, request) = submit_want.unwrap_or((Want::Created, None));
            match want {
                Want::Status(s, c) => {
                    prop_assert_eq!(status, s, "{}", ctx);
                    prop_assert_eq!(code, c, "{}", ctx);
                    if c == "validation_failed" {
                        check_problems(&json, &request.unwrap_or_default(), &ctx)?;
                    }
                }
                Want::Created => {
                    prop_assert!(
                        created_now.is_some(),
                        "a valid input must be accepted: {ctx}"
                    );
                    let id = created_now.unwrap_or_else(TaskId::new_random);
                    let (task, _) = store
                        .get(id)
                        .await
                        .expect("read")
                        .unwrap_or_else(|| panic!("task {id} is stored"));
                    let request = request.unwrap_or_default();
                    prop_assert_eq!(&task.input, &request["input"], "the stored input: {}", ctx);
                    prop_assert_eq!(
                        task.reply_queue_url.as_deref(),
                        request["replyQueueUrl"].as_str(),
                        "the stored reply queue: {}",
                        ctx
                    );
                    prop_assert_eq!(task.workflow.as_str(), name.as_str(), "{}", ctx);
                }
                Want::Replay(id) => {
                    prop_assert_eq!(
                        status,
                        StatusCode::ACCEPTED,
                        "a same-request replay: {}",
                        ctx
                    );
                    prop_assert!(resp.headers().get("idempotent-replayed").is_some(), "{ctx}");
                    prop_assert_eq!(
                        task_id(&json),
                        Some(id),
                        "a replay names the first task: {}",
                        ctx
                    );
                }
                Want::Published(..) => {}
            }
        }
        Route::Get(ResolvedId::Known(id)) => {
            prop_assert_eq!(status, StatusCode::OK, "{}", ctx);
            prop_assert_eq!(task_id(&json), Some(*id), "{}", ctx);
            let (task, rec) = store
                .get(*id)
                .await
                .expect("read")
                .unwrap_or_else(|| panic!("task {id} is stored"));
            prop_assert_eq!(&json["input"], &task.input, "{}", ctx);
            prop_assert_eq!(
                json["workflow"].as_str(),
                Some(task.workflow.as_str()),
                "{}",
                ctx
            );
            prop_assert_eq!(
                json["processState"].as_str(),
                Some(rec.process_state.as_str()),
                "{}",
                ctx
            );
            prop_assert_eq!(
                json["steps"].as_array().map(Vec::len),
                Some(rec.steps.len()),
                "{}",
                ctx
            );
        }
        Route::Get(ResolvedId::Unknown) => {
            prop_assert_eq!(status, StatusCode::NOT_FOUND, "{}", ctx);
            prop_assert_eq!(code, "task_not_found", "{}", ctx);
        }
        Route::Get(ResolvedId::NotUuid) | Route::Operate(ResolvedId::NotUuid, _) => {
            prop_assert_eq!(status, StatusCode::BAD_REQUEST, "{}", ctx);
            prop_assert_eq!(code, "invalid_task_id", "{}", ctx);
        }
        Route::Operate(ResolvedId::Unknown, action) => match action_body_error(&r.body, action) {
            Some(c) => {
                prop_assert_eq!(status, StatusCode::BAD_REQUEST, "{}", ctx);
                prop_assert_eq!(code, c, "{}", ctx);
            }
            None => {
                prop_assert_eq!(status, StatusCode::NOT_FOUND, "{}", ctx);
                prop_assert_eq!(code, "task_not_found", "{}", ctx);
            }
        },
        Route::Operate(ResolvedId::Known(id), action) => match action_body_error(&r.body, action) {
            Some(c) => {
                prop_assert_eq!(status, StatusCode::BAD_REQUEST, "{}", ctx);
                prop_assert_eq!(code, c, "{}", ctx);
            }
            None => {
                prop_assert!(
                    status == StatusCode::ACCEPTED || status == StatusCode::CONFLICT,
                    "an action on a task is 202 or 409: {ctx}"
                );
                if status == StatusCode::ACCEPTED {
                    prop_assert_eq!(operated, Some(*id), "{}", ctx);
                } else {
                    prop_assert_eq!(code, "conflict", "{}", ctx);
                    prop_assert_eq!(
                        json["processState"].as_str(),
                        before.records.get(id).map(|r| r.process_state.as_str()),
                        "409 names the state: {}",
                        ctx
                    );
                }
            }
        },
        Route::List(Some(Ok(filter))) => {
            prop_assert_eq!(status, StatusCode::OK, "{}", ctx);
            prop_assert!(json["tasks"].is_array(), "{ctx}");
            if let Some(w) = filter {
                for t in json["tasks"].as_array().into_iter().flatten() {
                    prop_assert_eq!(
                        t["workflow"].as_str(),
                        Some(w.as_str()),
                        "filtered: {}",
                        ctx
                    );
                }
            }
        }
        Route::List(Some(Err(expected))) => {
            prop_assert_eq!(status, StatusCode::BAD_REQUEST, "{}", ctx);
            prop_assert_eq!(code, *expected, "{}", ctx);
        }
        Route::Entries(kind) => {
            prop_assert_eq!(status, StatusCode::OK, "{}", ctx);
            let key = match kind {
                Kind::Workflow => "workflows",
                Kind::Service => "services",
                Kind::Schedule => "schedules",
            };
            let want: Vec<Value> = model
                .catalog
                .iter()
                .filter(|((k, _), _)| k == kind)
                .map(|((_, n), v)| match kind {
                    // No breaker is ever written here: each is closed, with no fault; no
                    // call is made, so none is in flight or waiting; the system has no share.
                    Kind::Service => {
                        let limits = v.last().map_or(Value::Null, |b| b["limits"].clone());
                        json!({"name": n, "latest": v.len(),
                            "breaker": {"state": "closed", "failures": 0},
                            "limits": limits, "share": null, "inFlight": 0, "waiting": 0})
                    }
                    Kind::Workflow | Kind::Schedule => json!({"name": n, "latest": v.len()}),
                })
                .collect();
            prop_assert_eq!(&json[key], &Value::Array(want), "{}", ctx);
        }
        Route::Definition(kind, name, version) => {
            let missing = match kind {
                Kind::Workflow => "workflow_not_found",
                Kind::Service => "service_not_found",
                Kind::Schedule => "schedule_not_found",
            };
            let versions = model.catalog.get(&(*kind, name.clone()));
            match version.as_ref().map(|v| v.parse::<u32>()) {
                Some(Err(_)) => {
                    prop_assert_eq!(status, StatusCode::BAD_REQUEST, "{}", ctx);
                    prop_assert_eq!(code, "invalid_version", "{}", ctx);
                }
                wanted => {
                    let v = match wanted {
                        Some(Ok(v)) => v,
                        _ => versions.map_or(0, |vs| vs.len() as u32),
                    };
                    let body = versions.and_then(|vs| vs.get((v as usize).wrapping_sub(1)));
                    match body {
                        Some(body) => {
                            prop_assert_eq!(status, StatusCode::OK, "{}", ctx);
                            prop_assert_eq!(
                                json["version"].as_u64(),
                                Some(u64::from(v)),
                                "{}",
                                ctx
                            );
                            prop_assert_eq!(json["name"].as_str(), Some(name.as_str()), "{}", ctx);
                            prop_assert_eq!(&json["definition"], body, "{}", ctx);
                        }
                        None => {
                            prop_assert_eq!(status, StatusCode::NOT_FOUND, "{}", ctx);
                            prop_assert_eq!(code, missing, "{}", ctx);
                        }
                    }
                }
            }
        }
        Route::Publish(kind, name) => {
            let (want, doc) = publish_want.unwrap_or((Want::Created, None));
            match want {
                Want::Status(s, c) => {
                    prop_assert_eq!(status, s, "{}", ctx);
                    prop_assert_eq!(code, c, "{}", ctx);
                    if c == "invalid_definition" {
                        check_problems(&json, &doc.unwrap_or_default(), &ctx)?;
                    }
                }
                Want::Published(version, created) => {
                    prop_assert_eq!(
                        status,
                        if created {
                            StatusCode::CREATED
                        } else {
                            StatusCode::OK
                        },
                        "{}",
                        ctx
                    );
                    prop_assert_eq!(
                        json["version"].as_u64(),
                        Some(u64::from(version)),
                        "{}",
                        ctx
                    );
                    prop_assert_eq!(json["created"].as_bool(), Some(created), "{}", ctx);
                    prop_assert_eq!(json["name"].as_str(), Some(name.as_str()), "{}", ctx);
                    let stored = after
                        .catalog
                        .get(&(*kind, name.clone()))
                        .and_then(|v| v.get(version as usize - 1));
                    prop_assert_eq!(
                        stored,
                        doc.as_ref(),
                        "the version holds the definition: {}",
                        ctx
                    );
                }
                Want::Created | Want::Replay(_) => {}
            }
        }
        Route::WrongMethod => {
            prop_assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "{}", ctx);
            prop_assert_eq!(code, "method_not_allowed", "{}", ctx);
        }
        Route::Unrouted => {
            prop_assert_eq!(status, StatusCode::NOT_FOUND, "{}", ctx);
            prop_assert_eq!(code, "route_not_found", "{}", ctx);
        }
        Route::Get(ResolvedId::Unpredictable)
        | Route::Operate(ResolvedId::Unpredictable, _)
        | Route::List(None)
        | Route::Other => {}
    }
    Ok(())
}
