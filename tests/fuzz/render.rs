//! A symbolic request made concrete against what the model knows ([`render`]): its method,
//! path, headers and body, and the route whose answer the documentation pins down ([`Route`]).

use super::*;

/// The route of a request whose answer is pinned down.
#[derive(Debug)]
pub(crate) enum Route {
    Submit(String),
    Get(ResolvedId),
    /// An operator action: the task and the action's name.
    Operate(ResolvedId, String),
    /// `Ok` for 200 (with the `workflow` filter, if any), or the error code of the first bad
    /// parameter; `None`: not predicted.
    List(Option<Result<Option<String>, &'static str>>),
    Entries(Kind),
    Definition(Kind, String, Option<String>),
    Publish(Kind, String),
    /// A known path with a method it does not allow.
    WrongMethod,
    /// A path that is no route.
    Unrouted,
    Other,
}

pub(crate) struct Rendered {
    pub(crate) method: Method,
    pub(crate) path: String,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Vec<u8>,
    pub(crate) route: Route,
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Renders a query; with the list's expected answer if it can be told.
pub(crate) fn render_query(
    q: &QuerySpec,
    model: &Model,
) -> (String, Option<Result<Option<String>, &'static str>>) {
    match q {
        QuerySpec::Raw(s) => (s.clone(), None),
        QuerySpec::Params(params) => {
            let mut ser = url::form_urlencoded::Serializer::new(String::new());
            let mut expect: Option<Option<Result<Option<String>, &'static str>>> = None;
            let mut state = false;
            let mut filter: Option<String> = None;
            let mut decide = |e: Option<Result<Option<String>, &'static str>>| {
                if expect.is_none() {
                    expect = Some(e);
                }
            };
            for p in params {
                match p {
                    Param::State(s) => {
                        ser.append_pair("state", s);
                        if s.parse::<ProcessState>().is_ok() {
                            state = true;
                        } else {
                            decide(Some(Err("invalid_state")));
                        }
                    }
                    Param::Workflow(w) => {
                        ser.append_pair("workflow", w);
                        // The last one given counts.
                        filter = Some(w.clone());
                    }
                    Param::Limit(s) => {
                        ser.append_pair("limit", s);
                        if !s.parse::<usize>().is_ok_and(|n| (1..=100).contains(&n)) {
                            decide(Some(Err("invalid_limit")));
                        }
                    }
                    Param::Cursor(c) => {
                        let (token, verdict) = match c {
                            CursorSpec::Pool(i) if !model.cursors.is_empty() => {
                                (model.cursors[i % model.cursors.len()].clone(), Some(true))
                            }
                            CursorSpec::Pool(_) => ("zz".to_owned(), Some(false)),
                            CursorSpec::Synth {
                                version,
                                shard,
                                ms,
                                id,
                                extra,
                            } => {
                                let mut raw =
                                    format!("{version}|{shard}|{ms}|{}", Uuid::from_u128(*id));
                                if let Some(x) = extra {
                                    raw.push('|');
                                    raw.push_str(x);
                                }
                                // A well-formed cursor this API never returned: either answer.
                                let well_formed = version == "v1" && extra.is_none();
                                (hex(raw.as_bytes()), (!well_formed).then_some(false))
                            }
                            CursorSpec::Junk(s) => (s.clone(), Some(false)),
                        };
                        ser.append_pair("cursor", &token);
                        match verdict {
                            Some(true) => {}
                            Some(false) => decide(Some(Err("invalid_cursor"))),
                            None => decide(None),
                        }
                    }
                    Param::Unknown(k, v) => {
                        ser.append_pair(k, v);
                        decide(Some(Err("unknown_parameter")));
                    }
                }
            }
            let expect = match expect {
                Some(e) => e,
                None if state => Some(Ok(filter)),
                None => Some(Err("missing_state")),
            };
            (ser.finish(), expect)
        }
    }
}

pub(crate) fn render(req: &Req, model: &Model) -> Rendered {
    let mut headers = HeaderMap::new();
    let ct: Option<Vec<u8>> = match &req.ct {
        CtSpec::Absent => None,
        CtSpec::Json => Some(b"application/json".to_vec()),
        CtSpec::JsonCharset => Some(b"application/json; charset=utf-8".to_vec()),
        CtSpec::Other(s) => Some(s.as_bytes().to_vec()),
        CtSpec::Raw(b) => Some(b.clone()),
    };
    if let Some(v) = ct.and_then(|b| HeaderValue::from_bytes(&b).ok()) {
        headers.insert(http::header::CONTENT_TYPE, v);
    }
    let key: Option<Vec<u8>> = match &req.key {
        KeySpec::Absent => None,
        KeySpec::Pool(i) => Some(KEYS[i % KEYS.len()].as_bytes().to_vec()),
        KeySpec::Visible(s) => Some(s.as_bytes().to_vec()),
        KeySpec::Repeat(n) => Some(vec![b'k'; *n]),
        KeySpec::Raw(b) => Some(b.clone()),
    };
    if let Some(v) = key.and_then(|b| HeaderValue::from_bytes(&b).ok()) {
        headers.insert(api::IDEMPOTENCY_KEY, v);
    }
    let reply: Option<Vec<u8>> = match &req.reply {
        ReplySpec::Absent => None,
        ReplySpec::Value(s) => Some(s.as_bytes().to_vec()),
        ReplySpec::Raw(b) => Some(b.clone()),
    };
    if let Some(v) = reply.and_then(|b| HeaderValue::from_bytes(&b).ok()) {
        headers.insert(api::REPLY_QUEUE_URL, v);
    }
    let body = render_body(&req.body);
    let slash = |t: bool| if t { "/" } else { "" };
    let with_query = |p: String, q: &Option<QuerySpec>| match q {
        None => (p, None),
        Some(q) => {
            let (q, e) = render_query(q, model);
            (format!("{p}?{q}"), e)
        }
    };
    let m = &req.method;
    let (path, route) = match &req.path {
        PathSpec::Submit {
            workflow,
            trailing,
            query,
        } => {
            let name = name_of(workflow, &WORKFLOWS);
            let (path, _) = with_query(
                format!("/workflows/{name}/tasks{}", slash(*trailing)),
                query,
            );
            let route = if *trailing || query.is_some() || !plain(&name) {
                Route::Other
            } else if *m == Method::POST {
                Route::Submit(name)
            } else {
                Route::WrongMethod
            };
            (path, route)
        }
        PathSpec::Tasks { trailing, query } => {
            let (path, list) = with_query(format!("/tasks{}", slash(*trailing)), query);
            let route = match (m, trailing, query) {
                (_, true, _) => Route::Other,
                (&Method::GET, false, None) => Route::List(Some(Err("missing_state"))),
                (&Method::GET, false, Some(_)) => Route::List(list),
                _ => Route::WrongMethod,
            };
            (path, route)
        }
        PathSpec::Task {
            id,
            trailing,
            query,
        } => {
            let (seg, resolved) = model.resolve(id);
            let (path, _) = with_query(format!("/tasks/{seg}{}", slash(*trailing)), query);
            let route = if *trailing || query.is_some() || !plain(&seg) {
                Route::Other
            } else if *m == Method::GET {
                Route::Get(resolved)
            } else {
                Route::WrongMethod
            };
            (path, route)
        }
        PathSpec::Action {
            id,
            action,
            trailing,
        } => {
            let (seg, resolved) = model.resolve(id);
            let path = format!("/tasks/{seg}/{action}{}", slash(*trailing));
            let route = if *trailing || !plain(&seg) || !plain(action) {
                Route::Other
            } else if !ACTIONS.contains(&action.as_str()) {
                Route::Unrouted
            } else if *m == Method::POST {
                Route::Operate(resolved, action.clone())
            } else {
                Route::WrongMethod
            };
            (path, route)
        }
        PathSpec::Catalog { kind, trailing } => {
            let path = format!("/{}{}", kind.segment(), slash(*trailing));
            let route = if *trailing {
                Route::Other
            } else if *m == Method::GET {
                Route::Entries(kind.kind())
            } else {
                Route::WrongMethod
            };
            (path, route)
        }
        PathSpec::Definition {
            kind,
            name,
            version,
            trailing,
        } => {
            let pool: &[&str] = match kind {
                DefKind::Workflows => &WORKFLOWS,
                DefKind::Services => &SERVICES,
            };
            let name = name_of(name, pool);
            let tail = match version {
                Some(v) => format!("/versions/{v}"),
                None => String::new(),
            };
            let path = format!("/{}/{name}{tail}{}", kind.segment(), slash(*trailing));
            let plain_version = version.as_ref().is_none_or(|v| plain(v));
            let route = if *trailing || !plain(&name) || !plain_version {
                Route::Other
            } else {
                match (kind, version, m) {
                    (DefKind::Services, Some(_), _) => Route::Unrouted,
                    (_, Some(_), &Method::GET) => {
                        Route::Definition(kind.kind(), name, version.clone())
                    }
                    (_, Some(_), _) => Route::WrongMethod,
                    (_, None, &Method::GET) => Route::Definition(kind.kind(), name, None),
                    (_, None, &Method::PUT) => Route::Publish(kind.kind(), name),
                    (_, None, _) => Route::WrongMethod,
                }
            };
            (path, route)
        }
        PathSpec::Free {
            leading_slash,
            segs,
            query,
        } => {
            let parts: Vec<String> = segs
                .iter()
                .map(|s| match s {
                    Seg::Workflows => "workflows".to_owned(),
                    Seg::Services => "services".to_owned(),
                    Seg::Tasks => "tasks".to_owned(),
                    Seg::Versions => "versions".to_owned(),
                    Seg::Name(n) => name_of(n, &WORKFLOWS),
                    Seg::Id(id) => model.resolve(id).0,
                    Seg::Action(a) => a.clone(),
                    Seg::Junk(j) => j.clone(),
                    Seg::Empty => String::new(),
                })
                .collect();
            let p = format!(
                "{}{}",
                if *leading_slash { "/" } else { "" },
                parts.join("/")
            );
            let routed = ["workflows", "services", "tasks", "counts", "console"];
            let route = match (leading_slash, parts.first()) {
                (true, Some(first)) if plain(first) && !routed.contains(&first.as_str()) => {
                    Route::Unrouted
                }
                _ => Route::Other,
            };
            (with_query(p, query).0, route)
        }
    };
    Rendered {
        method: req.method.clone(),
        path,
        headers,
        body,
        route,
    }
}

/// The idempotency key as documented; `Err` if present and invalid.
pub(crate) fn key_of(headers: &HeaderMap) -> Result<Option<String>, ()> {
    match headers.get(api::IDEMPOTENCY_KEY) {
        None => Ok(None),
        Some(v) => {
            let b = v.as_bytes();
            if !b.is_empty() && b.len() <= MAX_KEY_LEN && b.iter().all(u8::is_ascii_graphic) {
                Ok(Some(String::from_utf8_lossy(b).into_owned()))
            } else {
                Err(())
            }
        }
    }
}

/// The reply queue URL header; `Err` if present and invalid.
pub(crate) fn reply_of(headers: &HeaderMap) -> Result<Option<String>, ()> {
    match headers.get(api::REPLY_QUEUE_URL) {
        None => Ok(None),
        // The local runner's default pattern on the memory backend.
        Some(v) => match v.to_str().ok().map(|u| {
            ReplyQueues::parse("memory://sas/sasreply-local--*")
                .expect("pattern")
                .check(u)
        }) {
            Some(Ok(u)) => Ok(Some(u)),
            _ => Err(()),
        },
    }
}

/// Whether the request's Content-Type is absent or `application/json` (media types are
/// case-insensitive; parameters are allowed).
pub(crate) fn json_content_type(headers: &HeaderMap) -> bool {
    headers.get(http::header::CONTENT_TYPE).is_none_or(|v| {
        v.to_str().is_ok_and(|ct| {
            ct.split(';')
                .next()
                .unwrap_or_default()
                .trim()
                .eq_ignore_ascii_case("application/json")
        })
    })
}
