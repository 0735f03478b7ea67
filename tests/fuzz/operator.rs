//! The operator's actions on a task (`POST /tasks/{id}/{action}`) and their bodies.

use super::*;

pub(crate) const ACTIONS: [&str; 5] = ["retry", "compensate", "cancel", "resolve", "skip"];

pub(crate) fn action() -> BoxedStrategy<String> {
    prop_oneof![
        8 => prop::sample::select(ACTIONS.to_vec()).prop_map(str::to_owned),
        1 => prop_oneof![Just("RETRY"), Just("approve"), Just("cancel "), Just("")]
            .prop_map(str::to_owned),
        1 => junk(),
    ]
    .boxed()
}

/// `GET /tasks/{id}`, the operator's actions and list.
pub(crate) fn operator_request() -> BoxedStrategy<Req> {
    let action_body = prop_oneof![
        3 => Just(BodySpec::Empty),
        1 => "[ \t\r\n]{1,4}".prop_map(BodySpec::Whitespace),
        1 => positional(),
        1 => body(),
    ];
    let plain = |method: Method, path: PathSpec, body: BodySpec| Req {
        method,
        path,
        ct: CtSpec::Absent,
        key: KeySpec::Absent,
        reply: ReplySpec::Absent,
        body,
    };
    prop_oneof![
        id_seg().prop_map(move |id| plain(
            Method::GET,
            PathSpec::Task {
                id,
                trailing: false,
                query: None,
            },
            BodySpec::Empty
        )),
        (id_seg(), action(), action_body).prop_map(move |(id, action, body)| plain(
            Method::POST,
            PathSpec::Action {
                id,
                action,
                trailing: false,
            },
            body
        )),
        prop::collection::vec(param(), 0..4).prop_map(move |params| plain(
            Method::GET,
            PathSpec::Tasks {
                trailing: false,
                query: Some(QuerySpec::Params(params)),
            },
            BodySpec::Empty
        )),
    ]
    .boxed()
}

/// The error code an operator action's body gets, if it is refused: none, or
/// `{"reason": string|null}` with a reason of at most 500 characters, is accepted (a resolve
/// and a skip need the reason; a skip may add `result`).
pub(crate) fn action_body_error(body: &[u8], action: &str) -> Option<&'static str> {
    // A resolve and a skip need a reason; a skip may carry the step's result.
    let needs_reason = matches!(action, "resolve" | "skip");
    if body.iter().all(u8::is_ascii_whitespace) {
        return needs_reason.then_some("validation_failed");
    }
    match serde_json::from_slice::<Value>(body) {
        Err(_) => Some("invalid_json"),
        Ok(Value::Object(m)) => {
            let known = |k: &str, v: &Value| {
                (k == "reason" && (v.is_string() || v.is_null()))
                    || (k == "result" && action == "skip")
            };
            let reason = m.get("reason").and_then(Value::as_str);
            let too_long = reason.is_some_and(|r| r.chars().count() > api::MAX_REASON_CHARS);
            let missing = needs_reason && reason.is_none_or(|r| r.trim().is_empty());
            let too_large = m
                .get("result")
                .is_some_and(|v| v.to_string().len() > sas::domain::task::MAX_RESULT_BYTES);
            if !m.iter().all(|(k, v)| known(k, v)) {
                Some("invalid_request")
            } else if too_long || missing || too_large {
                Some("validation_failed")
            } else {
                None
            }
        }
        Ok(_) => Some("invalid_request"),
    }
}
