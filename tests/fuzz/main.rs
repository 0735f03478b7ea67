//! Property tests of the HTTP API, black-box over `submission::handle` on the in-memory system
//! (nothing started: only the handler writes). Arbitrary requests go in, one at a time and in
//! sequences: methods; paths with junk, UUIDs in every spelling and the ids of tasks made
//! earlier; submissions to both example workflows, to one the case may publish and to unknown
//! ones; definitions (`PUT /workflows/{name}`, `PUT /services/{name}`), valid and broken;
//! query strings, content types, idempotency keys, reply queue URLs; bodies of every shape
//! (arbitrary bytes and JSON, mutated inputs, huge bodies). For every answer:
//!
//! - it is a 2xx or a 4xx, never a 5xx, with a JSON object body and `Content-Type:
//!   application/json`; a 4xx carries `error.code` (one of the documented codes) and
//!   `error.message`; a 405 an `Allow`; the only 2xx are 200, 201 and 202;
//! - a 202 names a task (`taskId`); a new task is `Pending`, of the newest version of its
//!   workflow, stored with its input, and its work message is queued;
//! - nothing is written partially: every task has its state record and every record its task,
//!   the record count is the number of distinct tasks created, every record passes `check`, a
//!   201 adds exactly one version of one definition, and any other answer that is not a 202
//!   changes no record, no queue, no event and no definition;
//! - idempotency: a key with the same request (workflow, input up to whitespace and key order,
//!   reply queue) gets the same `taskId`, with a different request a 409;
//! - (the operator API, as an operator: every route the model knows is served there);
//! - the task API's authentication: arbitrary `Authorization` headers (bytes, junk tokens, the
//!   local issuer's JWTs live, expired, for another audience or signed by another key, SigV4
//!   signatures by each caller's key, a wrong secret, at a skew, mangled, over another path)
//!   through the local runner's SigV4 and JWT authorizers name exactly the caller whose valid
//!   credentials were sent; anything else is a 401 that writes nothing; an authenticated caller
//!   reads its own task and gets 404 for another's, also for a cancel;
//! - the exact routes answer as documented: the submission's checks in order (size, media type,
//!   key, reply queue, JSON, workflow, input schema, with every problem's `at` a JSON pointer
//!   into the input), `GET /tasks/{id}`, the operator's actions and list (with its `workflow`
//!   filter), and the definitions' routes (201 for a new version, 200 for the same, 400 with
//!   problems for an invalid one, 404 for an unknown name or version).

use chrono::Utc;
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use sas::domain::task::{MAX_INPUT_BYTES, ReplyQueues};
use sas::domain::workflow::{self, MAX_DEFINITION_BYTES, examples};
use sas::handlers::submission::{self, MAX_BODY_BYTES, MAX_KEY_LEN};
use sas::local::{Settings, System};
use sas::ports::{Kind, StateStore};
use sas::{ProcessState, StateRecord, TaskId, Workflow};
use sas_blackbox::{ECOMMERCE, LOAN, memory_system};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use uuid::Uuid;

// ---------------------------------------------------------------------------------------------
// What a request is made of (kept symbolic, so that a failure shrinks and prints readably).
// ---------------------------------------------------------------------------------------------

/// How a UUID is spelled in a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum UuidForm {
    Lower,
    Upper,
    Simple,
    Braced,
    Urn,
}

impl UuidForm {
    fn render(self, u: Uuid) -> String {
        match self {
            Self::Lower => u.hyphenated().to_string(),
            Self::Upper => u.hyphenated().to_string().to_uppercase(),
            Self::Simple => u.simple().to_string(),
            Self::Braced => u.braced().to_string(),
            Self::Urn => u.urn().to_string(),
        }
    }
}

/// The `{taskId}` of a path.
#[derive(Debug, Clone)]
enum IdSeg {
    /// A task created earlier in the case (by index; a never-used UUID if none yet).
    Created(usize, UuidForm),
    /// Any UUID (almost surely no task's).
    Random(u128, UuidForm),
    Junk(String),
}

/// A workflow's or a service's `{name}` in a path.
#[derive(Debug, Clone)]
enum NameSeg {
    /// One of [`WORKFLOWS`] or [`SERVICES`], by index.
    Pool(usize),
    Junk(String),
}

/// A segment of a free-form path.
#[derive(Debug, Clone)]
enum Seg {
    Workflows,
    Services,
    Tasks,
    Versions,
    Name(NameSeg),
    Id(IdSeg),
    Action(String),
    Junk(String),
    Empty,
}

#[derive(Debug, Clone)]
enum CursorSpec {
    /// A `nextCursor` an earlier list answer returned (by index).
    Pool(usize),
    /// Hex of `version|shard|ms|uuid[|extra]`: well-formed only as `v1` without extra.
    Synth {
        version: String,
        shard: u32,
        ms: i64,
        id: u128,
        extra: Option<String>,
    },
    /// Never hex of a well-formed cursor.
    Junk(String),
}

#[derive(Debug, Clone)]
enum Param {
    State(String),
    Workflow(String),
    Limit(String),
    Cursor(CursorSpec),
    /// A name that is none of `state`, `workflow`, `limit`, `cursor`.
    Unknown(String, String),
}

#[derive(Debug, Clone)]
enum QuerySpec {
    /// Encoded with `application/x-www-form-urlencoded`, so each value arrives as generated.
    Params(Vec<Param>),
    /// Sent as is.
    Raw(String),
}

/// `workflows` or `services`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DefKind {
    Workflows,
    Services,
}

impl DefKind {
    fn kind(self) -> Kind {
        match self {
            Self::Workflows => Kind::Workflow,
            Self::Services => Kind::Service,
        }
    }
    fn segment(self) -> &'static str {
        match self {
            Self::Workflows => "workflows",
            Self::Services => "services",
        }
    }
}

#[derive(Debug, Clone)]
enum PathSpec {
    /// `/workflows/{name}/tasks`
    Submit {
        workflow: NameSeg,
        trailing: bool,
        query: Option<QuerySpec>,
    },
    /// `/tasks`
    Tasks {
        trailing: bool,
        query: Option<QuerySpec>,
    },
    /// `/tasks/{id}`
    Task {
        id: IdSeg,
        trailing: bool,
        query: Option<QuerySpec>,
    },
    /// `/tasks/{id}/{action}`
    Action {
        id: IdSeg,
        action: String,
        trailing: bool,
    },
    /// `/workflows` or `/services`
    Catalog { kind: DefKind, trailing: bool },
    /// `/workflows/{name}` or `/services/{name}`, or `/workflows/{name}/versions/{v}`
    Definition {
        kind: DefKind,
        name: NameSeg,
        version: Option<String>,
        trailing: bool,
    },
    Free {
        leading_slash: bool,
        segs: Vec<Seg>,
        query: Option<QuerySpec>,
    },
}

#[derive(Debug, Clone)]
enum CtSpec {
    Absent,
    Json,
    JsonCharset,
    Other(&'static str),
    /// Arbitrary bytes; no header if they are not a valid header value.
    Raw(Vec<u8>),
}

#[derive(Debug, Clone)]
enum KeySpec {
    Absent,
    /// One of a few keys, so that keys are reused.
    Pool(usize),
    Visible(String),
    /// `n` times `k` (valid up to 255).
    Repeat(usize),
    Raw(Vec<u8>),
}

/// The `Reply-Queue-Url` header.
#[derive(Debug, Clone)]
enum ReplySpec {
    Absent,
    Value(String),
    Raw(Vec<u8>),
}

#[derive(Debug, Clone, Copy)]
enum Field {
    CustomerId,
    Items,
    Sku,
    Quantity,
    ApplicantId,
    Amount,
    Currency,
    X,
}

/// A change to a valid input.
#[derive(Debug, Clone)]
enum Mutation {
    Remove(Field),
    Set(Field, Value),
    Extra {
        in_item: bool,
        name: String,
        value: Value,
    },
    ManyItems(usize),
}

/// How a (mutated) JSON value is turned into bytes.
#[derive(Debug, Clone)]
enum Encoding {
    Compact,
    Pretty,
    Truncate(usize),
    Insert(usize, u8),
    Twice,
}

/// A valid input, written in one of several equivalent ways.
#[derive(Debug, Clone, Copy)]
enum Style {
    Compact,
    Pretty,
    Reversed,
    Padded,
}

#[derive(Debug, Clone, Copy)]
enum BigKind {
    /// A valid order padded with spaces.
    PaddedInput,
    Garbage,
    /// `{"customerId": "xxx…", …}`
    LongString,
}

/// A workflow definition to start from.
#[derive(Debug, Clone, Copy)]
enum WfBase {
    Ecommerce,
    Loan,
    /// A small workflow of its own, `fuzz-a`, with an input schema `{x: integer >= 0}`.
    FuzzA,
}

/// A change to a workflow definition (most make it invalid).
#[derive(Debug, Clone)]
enum DefMutation {
    Description(usize),
    SetName(Value),
    Remove(&'static str),
    EmptySteps,
    StepService(String),
    StepName(Value),
    ExtraTop(String, Value),
    ExtraStep(String, Value),
    Timeout(String),
    ForwardRef,
    SecondPivot,
    UndoAfterPivot,
    InputSchema(Value),
    BigMapping(usize),
    ManySteps(usize),
    Retry(Value),
}

#[derive(Debug, Clone)]
enum TargetSpec {
    Simulated,
    Http(String),
    Junk(Value),
}

#[derive(Debug, Clone)]
enum DefSpec {
    Workflow(WfBase, Vec<DefMutation>),
    Service {
        name: usize,
        description: Option<usize>,
        target: TargetSpec,
        extra: Option<(String, Value)>,
    },
}

#[derive(Debug, Clone)]
enum BodySpec {
    Empty,
    Whitespace(String),
    Bytes(Vec<u8>),
    Json(Value),
    Input(usize, Vec<Mutation>, Encoding),
    /// One of the valid inputs (by index), styled.
    Pool(usize, Style),
    /// `{"reason": …}` (valid with a string or null and nothing else).
    Reason(Value, Option<(String, Value)>),
    /// Exactly `len` bytes.
    Big(BigKind, usize),
    /// A JSON array where an object is expected.
    Positional(Vec<Value>),
    Definition(DefSpec, Encoding),
}

#[derive(Debug, Clone)]
struct Req {
    method: Method,
    path: PathSpec,
    ct: CtSpec,
    key: KeySpec,
    reply: ReplySpec,
    body: BodySpec,
}

// ---------------------------------------------------------------------------------------------
// Strategies.
// ---------------------------------------------------------------------------------------------

const ACTIONS: [&str; 5] = ["retry", "compensate", "cancel", "resolve", "skip"];
const KEYS: [&str; 3] = ["key-0", "key-1", "key-2"];
/// Workflow names: the examples, one a case may publish, one never published.
const WORKFLOWS: [&str; 4] = [ECOMMERCE, LOAN, "fuzz-a", "gift-card"];
/// Service names: two examples, one a case may publish, one that is no valid name.
const SERVICES: [&str; 4] = ["inventory", "payment", "fuzz-svc", "Bad Name"];
const DESCRIPTIONS: [&str; 3] = ["first", "second", "a third one"];

/// Every error code the API documents.
const CODES: [&str; 26] = [
    "route_not_found",
    "method_not_allowed",
    "invalid_json",
    "invalid_request",
    "validation_failed",
    "input_too_large",
    "payload_too_large",
    "unsupported_media_type",
    "invalid_idempotency_key",
    "invalid_reply_queue_url",
    "idempotency_key_reused",
    "workflow_not_found",
    "service_not_found",
    "task_not_found",
    "invalid_task_id",
    "invalid_state",
    "invalid_limit",
    "invalid_cursor",
    "unknown_parameter",
    "missing_state",
    "invalid_version",
    "invalid_definition",
    "definition_too_large",
    "name_mismatch",
    "conflict",
    "store_unavailable",
];

fn method() -> BoxedStrategy<Method> {
    prop_oneof![
        4 => Just(Method::GET),
        4 => Just(Method::POST),
        2 => Just(Method::PUT),
        1 => Just(Method::DELETE),
        1 => Just(Method::PATCH),
        1 => Just(Method::HEAD),
        1 => "[A-Za-z0-9!#$%&'*+.^_`|~-]{1,10}"
            .prop_filter_map("a method token", |s| Method::from_bytes(s.as_bytes()).ok()),
    ]
    .boxed()
}

fn uuid_form() -> BoxedStrategy<UuidForm> {
    prop_oneof![
        6 => Just(UuidForm::Lower),
        1 => Just(UuidForm::Upper),
        1 => Just(UuidForm::Simple),
        1 => Just(UuidForm::Braced),
        1 => Just(UuidForm::Urn),
    ]
    .boxed()
}

/// Strings that a path segment or a parameter might carry.
fn junk() -> BoxedStrategy<String> {
    prop_oneof![
        "[a-zA-Z0-9._~-]{1,12}",
        Just("..".to_owned()),
        Just(".".to_owned()),
        Just(String::new()),
        Just("%2e%2e".to_owned()),
        Just("tasks%2F".to_owned()),
        Just("TASKS".to_owned()),
        Just("tasks ".to_owned()),
        Just("orders".to_owned()),
        "%[0-9A-Za-z]{0,2}",
        "%[0-9A-F]{2}%[0-9A-F]{2}",
        "\\PC{1,8}",
        ".{0,8}",
        "[0-9a-fA-F-]{30,40}",
    ]
    .boxed()
}

fn id_seg() -> BoxedStrategy<IdSeg> {
    prop_oneof![
        5 => (0usize..8, uuid_form()).prop_map(|(i, f)| IdSeg::Created(i, f)),
        2 => (any::<u128>(), uuid_form()).prop_map(|(n, f)| IdSeg::Random(n, f)),
        2 => junk().prop_map(IdSeg::Junk),
    ]
    .boxed()
}

fn name_seg() -> BoxedStrategy<NameSeg> {
    prop_oneof![
        6 => (0usize..4).prop_map(NameSeg::Pool),
        1 => junk().prop_map(NameSeg::Junk),
    ]
    .boxed()
}

fn action() -> BoxedStrategy<String> {
    prop_oneof![
        8 => prop::sample::select(ACTIONS.to_vec()).prop_map(str::to_owned),
        1 => prop_oneof![Just("RETRY"), Just("approve"), Just("cancel "), Just("")]
            .prop_map(str::to_owned),
        1 => junk(),
    ]
    .boxed()
}

fn cursor() -> BoxedStrategy<CursorSpec> {
    let version = prop_oneof![
        4 => Just("v1".to_owned()),
        1 => Just("v2".to_owned()),
        1 => Just("V1".to_owned()),
        1 => Just(String::new()),
    ];
    prop_oneof![
        3 => (0usize..4).prop_map(CursorSpec::Pool),
        2 => (
            version,
            any::<u32>(),
            any::<i64>(),
            any::<u128>(),
            prop::option::weighted(0.2, "[a-z0-9|]{0,6}")
        )
            .prop_map(|(version, shard, ms, id, extra)| CursorSpec::Synth {
                version,
                shard,
                ms,
                id,
                extra,
            }),
        2 => prop_oneof![
            "[g-z%+ ]{1,10}",
            "[0-9a-f]([0-9a-f]{2}){0,5}",
            "\\PC{0,8}",
        ]
        .prop_map(CursorSpec::Junk),
    ]
    .boxed()
}

fn state_value() -> BoxedStrategy<String> {
    let names: Vec<String> = ProcessState::ALL
        .iter()
        .map(|s| s.as_str().to_owned())
        .collect();
    prop_oneof![
        4 => prop::sample::select(names),
        1 => prop_oneof![
            Just("pending".to_owned()),
            Just("Error ".to_owned()),
            Just("PROCESSED".to_owned()),
            Just(String::new()),
        ],
        1 => "\\PC{0,10}",
    ]
    .boxed()
}

fn limit_value() -> BoxedStrategy<String> {
    prop_oneof![
        3 => "[0-9]{1,3}",
        1 => prop_oneof![
            Just("0"),
            Just("1"),
            Just("100"),
            Just("101"),
            Just("-1"),
            Just(""),
            Just("1.5"),
            Just("99999999999999999999999"),
        ]
        .prop_map(str::to_owned),
        1 => "\\PC{0,6}",
    ]
    .boxed()
}

fn param() -> BoxedStrategy<Param> {
    let unknown_name = prop_oneof![
        Just("State".to_owned()),
        Just("LIMIT".to_owned()),
        Just("Workflow".to_owned()),
        Just(String::new()),
        Just("state ".to_owned()),
        "[a-z_]{1,8}".prop_map(|s| format!("x{s}")),
    ];
    let workflow = prop_oneof![
        3 => prop::sample::select(WORKFLOWS.to_vec()).prop_map(str::to_owned),
        1 => junk(),
    ];
    prop_oneof![
        4 => state_value().prop_map(Param::State),
        2 => workflow.prop_map(Param::Workflow),
        2 => limit_value().prop_map(Param::Limit),
        2 => cursor().prop_map(Param::Cursor),
        1 => (unknown_name, junk()).prop_map(|(k, v)| Param::Unknown(k, v)),
    ]
    .boxed()
}

fn query() -> BoxedStrategy<QuerySpec> {
    prop_oneof![
        5 => prop::collection::vec(param(), 0..4).prop_map(QuerySpec::Params),
        1 => prop_oneof![".{0,20}", "([a-z]{0,5}=[%&=#+a-z0-9]{0,5}&?){0,4}"].prop_map(QuerySpec::Raw),
    ]
    .boxed()
}

fn def_kind() -> BoxedStrategy<DefKind> {
    prop_oneof![Just(DefKind::Workflows), Just(DefKind::Services)].boxed()
}

fn version_seg() -> BoxedStrategy<String> {
    prop_oneof![
        4 => (0u32..5).prop_map(|v| v.to_string()),
        1 => prop_oneof![Just("+1"), Just("01"), Just("-1"), Just("x"), Just(""), Just("4294967296")]
            .prop_map(str::to_owned),
        1 => junk(),
    ]
    .boxed()
}

fn seg() -> BoxedStrategy<Seg> {
    prop_oneof![
        2 => Just(Seg::Workflows),
        1 => Just(Seg::Services),
        2 => Just(Seg::Tasks),
        1 => Just(Seg::Versions),
        2 => name_seg().prop_map(Seg::Name),
        2 => id_seg().prop_map(Seg::Id),
        1 => action().prop_map(Seg::Action),
        2 => junk().prop_map(Seg::Junk),
        1 => Just(Seg::Empty),
    ]
    .boxed()
}

fn path() -> BoxedStrategy<PathSpec> {
    let trailing = || prop::bool::weighted(0.1);
    prop_oneof![
        3 => (name_seg(), trailing(), prop::option::weighted(0.1, query()))
            .prop_map(|(workflow, trailing, query)| PathSpec::Submit { workflow, trailing, query }),
        2 => (trailing(), prop::option::weighted(0.3, query()))
            .prop_map(|(trailing, query)| PathSpec::Tasks { trailing, query }),
        3 => (id_seg(), trailing(), prop::option::weighted(0.1, query()))
            .prop_map(|(id, trailing, query)| PathSpec::Task { id, trailing, query }),
        3 => (id_seg(), action(), trailing())
            .prop_map(|(id, action, trailing)| PathSpec::Action { id, action, trailing }),
        1 => (def_kind(), trailing()).prop_map(|(kind, trailing)| PathSpec::Catalog { kind, trailing }),
        2 => (def_kind(), name_seg(), prop::option::weighted(0.3, version_seg()), trailing())
            .prop_map(|(kind, name, version, trailing)| PathSpec::Definition { kind, name, version, trailing }),
        2 => (
            prop::bool::weighted(0.9),
            prop::collection::vec(seg(), 0..5),
            prop::option::weighted(0.3, query())
        )
            .prop_map(|(leading_slash, segs, query)| PathSpec::Free {
                leading_slash,
                segs,
                query,
            }),
    ]
    .boxed()
}

fn content_type() -> BoxedStrategy<CtSpec> {
    prop_oneof![
        4 => Just(CtSpec::Absent),
        4 => Just(CtSpec::Json),
        2 => Just(CtSpec::JsonCharset),
        2 => prop::sample::select(vec![
            "text/plain",
            "",
            "APPLICATION/JSON",
            "application/json;charset=utf-8",
            "application/jsonx",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            " application/json",
        ])
        .prop_map(CtSpec::Other),
        1 => prop::collection::vec(any::<u8>(), 0..24).prop_map(CtSpec::Raw),
    ]
    .boxed()
}

fn key() -> BoxedStrategy<KeySpec> {
    prop_oneof![
        4 => Just(KeySpec::Absent),
        5 => (0usize..KEYS.len()).prop_map(KeySpec::Pool),
        2 => "[!-~]{1,40}".prop_map(KeySpec::Visible),
        1 => prop::sample::select(vec![0usize, 1, 254, 255, 256, 1000]).prop_map(KeySpec::Repeat),
        1 => prop_oneof![
            Just(b"has space".to_vec()),
            Just(b"tab\there".to_vec()),
            Just("ключ".as_bytes().to_vec()),
            prop::collection::vec(any::<u8>(), 0..20),
        ]
        .prop_map(KeySpec::Raw),
    ]
    .boxed()
}

/// Strings of interesting lengths and characters.
fn long_string() -> BoxedStrategy<String> {
    let unit = prop::sample::select(vec![
        "a", "é", "😀", " ", "\u{0}", "\n", "\u{7f}", "-", "%41", "\u{200b}",
    ]);
    let n = prop_oneof![
        3 => prop::sample::select(vec![0usize, 1, 63, 64, 65, 127, 128, 129, 256]),
        1 => 0usize..2000,
        1 => Just(70_000usize),
    ];
    prop_oneof![
        3 => (unit, n).prop_map(|(u, n)| u.repeat(n)),
        1 => "\\PC{0,20}",
        1 => "[ \t]{0,3}c-[0-9]{1,3}[ \t]{0,3}",
    ]
    .boxed()
}

fn reply() -> BoxedStrategy<ReplySpec> {
    prop_oneof![
        8 => Just(ReplySpec::Absent),
        3 => prop::sample::select(vec![
            "memory://sas/sasreply-local--shop",
            "memory://sas/sasreply-local--a_2",
            "https://sqs.us-east-1.amazonaws.com/123456789012/sas-dev-client-shop",
            "http://localhost:4566/000000000000/q",
            "memory://sas/nowhere",
            "memory://sas/sasreply-local--",
            "ftp://example.com/q",
            "https://",
            "not a url",
            "",
        ])
        .prop_map(|s| ReplySpec::Value(s.to_owned())),
        1 => long_string().prop_map(|s| ReplySpec::Value(format!("https://example.com/{s}"))),
        1 => prop::collection::vec(any::<u8>(), 0..30).prop_map(ReplySpec::Raw),
    ]
    .boxed()
}

/// Arbitrary JSON values, nested.
fn arb_json() -> BoxedStrategy<Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_filter_map("finite", |f| serde_json::Number::from_f64(f)
            .map(Value::Number)),
        "\\PC{0,12}".prop_map(Value::from),
        ".{0,6}".prop_map(Value::from),
    ];
    let name = prop_oneof![
        3 => "[a-zA-Z]{0,10}",
        1 => prop::sample::select(vec![
            "customerId", "items", "sku", "quantity", "applicantId", "amount", "currency",
            "reason", "name", "steps", "service", "target", "type", "input",
        ])
        .prop_map(str::to_owned),
    ];
    leaf.prop_recursive(4, 48, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((name.clone(), inner), 0..6)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
    .boxed()
}

fn interesting_number() -> BoxedStrategy<Value> {
    prop_oneof![
        3 => prop::sample::select(vec![
            json!(0),
            json!(1),
            json!(2),
            json!(10_000),
            json!(10_001),
            json!(10_000_000),
            json!(10_000_000.5),
            json!(u32::MAX),
            json!(u64::MAX),
            json!(-1),
            json!(i64::MIN),
            json!(1.5),
            json!(2.0),
            json!(1e-9),
            json!(1e300),
            json!("2"),
            Value::Null,
        ]),
        1 => any::<i64>().prop_map(Value::from),
    ]
    .boxed()
}

fn field() -> BoxedStrategy<Field> {
    prop::sample::select(vec![
        Field::CustomerId,
        Field::Items,
        Field::Sku,
        Field::Quantity,
        Field::ApplicantId,
        Field::Amount,
        Field::Currency,
        Field::X,
    ])
    .boxed()
}

fn currency() -> BoxedStrategy<Value> {
    prop_oneof![
        prop::sample::select(vec!["EUR", "USD", "eur", "EURO", "", "€€€"]).prop_map(Value::from),
        "[A-Z]{3}".prop_map(Value::from),
    ]
    .boxed()
}

fn mutation() -> BoxedStrategy<Mutation> {
    prop_oneof![
        2 => field().prop_map(Mutation::Remove),
        2 => long_string().prop_map(|s| Mutation::Set(Field::CustomerId, Value::from(s))),
        2 => long_string().prop_map(|s| Mutation::Set(Field::Sku, Value::from(s))),
        2 => interesting_number().prop_map(|n| Mutation::Set(Field::Quantity, n)),
        2 => interesting_number().prop_map(|n| Mutation::Set(Field::Amount, n)),
        1 => currency().prop_map(|c| Mutation::Set(Field::Currency, c)),
        1 => interesting_number().prop_map(|n| Mutation::Set(Field::X, n)),
        2 => (field(), arb_json()).prop_map(|(f, v)| Mutation::Set(f, v)),
        1 => (any::<bool>(), "[a-zA-Z]{1,10}", arb_json())
            .prop_map(|(in_item, name, value)| Mutation::Extra { in_item, name, value }),
        1 => prop_oneof![0usize..=3, 99usize..=102, 0usize..=150].prop_map(Mutation::ManyItems),
    ]
    .boxed()
}

/// Changes of values only, each of the right JSON type: valid inputs or `validation_failed`.
fn value_mutation() -> BoxedStrategy<Mutation> {
    prop_oneof![
        long_string().prop_map(|s| Mutation::Set(Field::CustomerId, Value::from(s))),
        long_string().prop_map(|s| Mutation::Set(Field::Sku, Value::from(s))),
        long_string().prop_map(|s| Mutation::Set(Field::ApplicantId, Value::from(s))),
        prop_oneof![0u32..=3, 9_999u32..=10_001, any::<u32>()]
            .prop_map(|n| Mutation::Set(Field::Quantity, Value::from(n))),
        prop_oneof![
            (-2i64..=2).prop_map(Value::from),
            Just(json!(9_999_999.99)),
            Just(json!(10_000_000)),
            Just(json!(10_000_000.01)),
            Just(json!(0.01)),
        ]
        .prop_map(|n| Mutation::Set(Field::Amount, n)),
        currency().prop_map(|c| Mutation::Set(Field::Currency, c)),
        prop_oneof![0usize..=3, 99usize..=102].prop_map(Mutation::ManyItems),
    ]
    .boxed()
}

fn encoding() -> BoxedStrategy<Encoding> {
    prop_oneof![
        6 => Just(Encoding::Compact),
        2 => Just(Encoding::Pretty),
        1 => any::<usize>().prop_map(Encoding::Truncate),
        1 => (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Encoding::Insert(i, b)),
        1 => Just(Encoding::Twice),
    ]
    .boxed()
}

fn style() -> BoxedStrategy<Style> {
    prop::sample::select(vec![
        Style::Compact,
        Style::Pretty,
        Style::Reversed,
        Style::Padded,
    ])
    .boxed()
}

/// Arrays in the place of the objects: `["c-1", [["SKU-1", 2]]]`, `[null]`.
fn positional() -> BoxedStrategy<BodySpec> {
    let item = prop_oneof![
        Just(json!(["SKU-1", 2])),
        Just(json!({"sku": "SKU-1", "quantity": 2})),
    ];
    let tail = prop::collection::vec(prop_oneof![Just(Value::Null), Just(json!(1))], 0..3);
    prop_oneof![
        (prop::collection::vec(item, 1..3), tail).prop_map(|(items, tail)| {
            let mut v = vec![json!("c-1"), Value::Array(items)];
            v.extend(tail);
            BodySpec::Positional(v)
        }),
        prop::sample::select(vec![
            vec![Value::Null],
            vec![json!("why")],
            vec![],
            vec![json!(1)],
        ])
        .prop_map(BodySpec::Positional),
    ]
    .boxed()
}

fn def_mutation() -> BoxedStrategy<DefMutation> {
    prop_oneof![
        4 => (0usize..DESCRIPTIONS.len()).prop_map(DefMutation::Description),
        1 => prop_oneof![
            prop::sample::select(WORKFLOWS.to_vec()).prop_map(Value::from),
            Just(json!("Bad Name")),
            Just(json!(7)),
        ]
        .prop_map(DefMutation::SetName),
        1 => prop::sample::select(vec!["name", "steps", "input", "defaults", "description"])
            .prop_map(DefMutation::Remove),
        1 => Just(DefMutation::EmptySteps),
        1 => prop::sample::select(vec!["nowhere", "payment", "fuzz-svc", "Inventory"])
            .prop_map(|s| DefMutation::StepService(s.to_owned())),
        1 => prop_oneof![Just(json!("A!")), Just(json!("ok-name")), Just(json!(3))]
            .prop_map(DefMutation::StepName),
        1 => ("[a-z]{1,8}", arb_json()).prop_map(|(k, v)| DefMutation::ExtraTop(k, v)),
        1 => ("[a-z]{1,8}", arb_json()).prop_map(|(k, v)| DefMutation::ExtraStep(k, v)),
        1 => prop::sample::select(vec!["30s", "0s", "2h", "3 parsecs", "10m", "500ms", "1s"])
            .prop_map(|s| DefMutation::Timeout(s.to_owned())),
        1 => Just(DefMutation::ForwardRef),
        1 => Just(DefMutation::SecondPivot),
        1 => Just(DefMutation::UndoAfterPivot),
        1 => prop_oneof![
            Just(json!({"type": "objekt"})),
            Just(json!({"type": "object"})),
            Just(json!({"type": "object", "required": ["customerId"]})),
            Just(json!([1])),
            arb_json(),
        ]
        .prop_map(DefMutation::InputSchema),
        1 => prop_oneof![
            Just(workflow::MAX_DEFINITION_BYTES - 200),
            Just(workflow::MAX_DEFINITION_BYTES + 200),
            1usize..4096,
        ]
        .prop_map(DefMutation::BigMapping),
        1 => prop_oneof![Just(32usize), Just(33usize)].prop_map(DefMutation::ManySteps),
        1 => prop_oneof![
            Just(json!({"failureThreshold": 5})),
            Just(json!({"failureThreshold": 0})),
            Just(json!({"baseDelay": "10m", "maxDelay": "1m"})),
            Just(json!({"baseDelay": "2s", "backoffRate": 3})),
            Just(json!({"backoffRate": 11})),
            arb_json(),
        ]
        .prop_map(DefMutation::Retry),
    ]
    .boxed()
}

fn target() -> BoxedStrategy<TargetSpec> {
    prop_oneof![
        3 => Just(TargetSpec::Simulated),
        2 => prop::sample::select(vec![
            "https://bank.example",
            "http://127.0.0.1:9/x",
            "not a url",
            "",
        ])
        .prop_map(|s| TargetSpec::Http(s.to_owned())),
        1 => prop_oneof![
            Just(json!({"type": "ftp"})),
            Just(json!({"type": "http"})),
            Just(json!({"type": "simulated", "baseUrl": "https://x.example"})),
            arb_json(),
        ]
        .prop_map(TargetSpec::Junk),
    ]
    .boxed()
}

fn definition() -> BoxedStrategy<DefSpec> {
    let base = prop::sample::select(vec![WfBase::Ecommerce, WfBase::Loan, WfBase::FuzzA]);
    prop_oneof![
        3 => (base, prop::collection::vec(def_mutation(), 0..3))
            .prop_map(|(b, m)| DefSpec::Workflow(b, m)),
        2 => (
            0usize..SERVICES.len(),
            prop::option::weighted(0.5, 0usize..DESCRIPTIONS.len()),
            target(),
            prop::option::weighted(0.1, ("[a-z]{1,6}", arb_json()))
        )
            .prop_map(|(name, description, target, extra)| DefSpec::Service {
                name,
                description,
                target,
                extra,
            }),
    ]
    .boxed()
}

fn body() -> BoxedStrategy<BodySpec> {
    let big_len = prop_oneof![
        MAX_INPUT_BYTES - 1..=MAX_INPUT_BYTES + 1,
        MAX_BODY_BYTES - 1..=MAX_BODY_BYTES + 1,
        MAX_BODY_BYTES + 2..MAX_BODY_BYTES + 8192,
    ];
    let big_kind = prop::sample::select(vec![
        BigKind::PaddedInput,
        BigKind::Garbage,
        BigKind::LongString,
    ]);
    prop_oneof![
        2 => Just(BodySpec::Empty),
        1 => "[ \t\r\n]{1,4}".prop_map(BodySpec::Whitespace),
        2 => prop::collection::vec(any::<u8>(), 0..64).prop_map(BodySpec::Bytes),
        2 => arb_json().prop_map(BodySpec::Json),
        5 => (0usize..INPUTS, prop::collection::vec(mutation(), 0..4), encoding())
            .prop_map(|(i, m, e)| BodySpec::Input(i, m, e)),
        5 => (0usize..INPUTS, style()).prop_map(|(i, s)| BodySpec::Pool(i, s)),
        2 => (
            prop_oneof![
                3 => long_string().prop_map(Value::from),
                1 => Just(Value::Null),
                1 => arb_json(),
            ],
            prop::option::weighted(0.2, ("[a-z]{1,6}", arb_json()))
        )
            .prop_map(|(r, extra)| BodySpec::Reason(r, extra)),
        1 => (big_kind, big_len).prop_map(|(k, n)| BodySpec::Big(k, n)),
        1 => positional(),
        2 => (definition(), encoding()).prop_map(|(d, e)| BodySpec::Definition(d, e)),
    ]
    .boxed()
}

/// Any request at all.
fn arbitrary_request() -> BoxedStrategy<Req> {
    (method(), path(), content_type(), key(), reply(), body())
        .prop_map(|(method, path, ct, key, reply, body)| Req {
            method,
            path,
            ct,
            key,
            reply,
            body,
        })
        .boxed()
}

fn clean_ct() -> BoxedStrategy<CtSpec> {
    prop_oneof![
        6 => prop_oneof![Just(CtSpec::Absent), Just(CtSpec::Json), Just(CtSpec::JsonCharset)],
        1 => content_type(),
    ]
    .boxed()
}

/// `POST /workflows/{name}/tasks`, mostly with clean headers, pooled keys and valid or
/// mutated inputs.
fn submit_request() -> BoxedStrategy<Req> {
    let workflow = prop_oneof![
        4 => Just(NameSeg::Pool(0)),
        3 => Just(NameSeg::Pool(1)),
        2 => Just(NameSeg::Pool(2)),
        1 => Just(NameSeg::Pool(3)),
        1 => junk().prop_map(NameSeg::Junk),
    ];
    // Few distinct requests, so that keys are reused with the same request and with others.
    let own = || prop_oneof![3 => Just(0usize), 1 => 1usize..3];
    let key = prop_oneof![
        3 => Just(KeySpec::Absent),
        6 => (0usize..KEYS.len()).prop_map(KeySpec::Pool),
        1 => key(),
    ];
    // Mostly an input meant for the workflow named (a valid one, or a value changed).
    let body = prop_oneof![
        4 => (own(), style()).prop_map(|(i, s)| BodySpec::Pool(i, s)),
        2 => (
            own(),
            prop::collection::vec(value_mutation(), 1..3),
            prop_oneof![Just(Encoding::Compact), Just(Encoding::Pretty)]
        )
            .prop_map(|(i, m, e)| BodySpec::Input(i, m, e)),
        1 => (0usize..INPUTS, style()).prop_map(|(i, s)| BodySpec::Pool(i + INPUTS, s)),
        1 => positional(),
        2 => body(),
    ];
    let reply = prop_oneof![3 => Just(ReplySpec::Absent), 1 => reply()];
    (workflow, clean_ct(), key, reply, body)
        .prop_map(|(workflow, ct, key, reply, mut body)| {
            // Inputs 0..3 are the workflow's own: orders, loans, or fuzz-a's.
            let own = match &workflow {
                NameSeg::Pool(1) => 3,
                NameSeg::Pool(2) => 6,
                _ => 0,
            };
            match &mut body {
                BodySpec::Pool(i, _) | BodySpec::Input(i, _, _) => {
                    *i = if *i >= INPUTS { *i - INPUTS } else { own + *i };
                }
                _ => {}
            }
            (workflow, ct, key, reply, body)
        })
        .prop_map(|(workflow, ct, key, reply, body)| Req {
            method: Method::POST,
            path: PathSpec::Submit {
                workflow,
                trailing: false,
                query: None,
            },
            ct,
            key,
            reply,
            body,
        })
        .boxed()
}

/// `GET /tasks/{id}`, the operator's actions and list.
fn operator_request() -> BoxedStrategy<Req> {
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

/// The definitions' routes: reads, and `PUT`s of valid and broken definitions.
fn catalog_request() -> BoxedStrategy<Req> {
    let mutations = prop_oneof![
        2 => Just(vec![]),
        3 => prop::collection::vec(def_mutation(), 1..3),
    ];
    let base = prop::sample::select(vec![WfBase::Ecommerce, WfBase::Loan, WfBase::FuzzA]);
    let workflow = (base, mutations).prop_map(|(b, m)| DefSpec::Workflow(b, m));
    let service = (
        0usize..SERVICES.len(),
        prop::option::weighted(0.5, 0usize..DESCRIPTIONS.len()),
        target(),
        prop::option::weighted(0.1, ("[a-z]{1,6}", arb_json())),
    )
        .prop_map(|(name, description, target, extra)| DefSpec::Service {
            name,
            description,
            target,
            extra,
        });
    // Mostly to the route of the definition's own kind and name; sometimes elsewhere.
    let put = (
        prop_oneof![3 => workflow, 2 => service],
        prop::option::weighted(0.15, (def_kind(), name_seg())),
        prop_oneof![4 => Just(Encoding::Compact), 1 => encoding()],
        clean_ct(),
    )
        .prop_map(|(def, elsewhere, encoding, ct)| {
            let (kind, name) = elsewhere.unwrap_or(match &def {
                DefSpec::Workflow(base, _) => (
                    DefKind::Workflows,
                    NameSeg::Pool(match base {
                        WfBase::Ecommerce => 0,
                        WfBase::Loan => 1,
                        WfBase::FuzzA => 2,
                    }),
                ),
                DefSpec::Service { name, .. } => (DefKind::Services, NameSeg::Pool(*name)),
            });
            Req {
                method: Method::PUT,
                path: PathSpec::Definition {
                    kind,
                    name,
                    version: None,
                    trailing: false,
                },
                ct,
                key: KeySpec::Absent,
                reply: ReplySpec::Absent,
                body: BodySpec::Definition(def, encoding),
            }
        });
    let put_junk =
        (def_kind(), name_seg(), clean_ct(), body()).prop_map(|(kind, name, ct, body)| Req {
            method: Method::PUT,
            path: PathSpec::Definition {
                kind,
                name,
                version: None,
                trailing: false,
            },
            ct,
            key: KeySpec::Absent,
            reply: ReplySpec::Absent,
            body,
        });
    prop_oneof![
        5 => put,
        1 => put_junk,
        2 => (def_kind(), name_seg(), prop::option::weighted(0.4, version_seg())).prop_map(
            |(kind, name, version)| Req {
                method: Method::GET,
                path: PathSpec::Definition {
                    kind,
                    name,
                    version,
                    trailing: false,
                },
                ct: CtSpec::Absent,
                key: KeySpec::Absent,
                reply: ReplySpec::Absent,
                body: BodySpec::Empty,
            }
        ),
        1 => def_kind().prop_map(|kind| Req {
            method: Method::GET,
            path: PathSpec::Catalog {
                kind,
                trailing: false,
            },
            ct: CtSpec::Absent,
            key: KeySpec::Absent,
            reply: ReplySpec::Absent,
            body: BodySpec::Empty,
        }),
    ]
    .boxed()
}

fn request() -> BoxedStrategy<Req> {
    prop_oneof![
        4 => submit_request(),
        3 => operator_request(),
        2 => catalog_request(),
        3 => arbitrary_request(),
    ]
    .boxed()
}

// ---------------------------------------------------------------------------------------------
// The model: what the test knows so far, and what the API must answer.
// ---------------------------------------------------------------------------------------------

/// What the test knows so far: the tasks created, the keys used, the cursors returned, and the
/// definitions published.
struct Model {
    created: Vec<TaskId>,
    created_set: HashSet<TaskId>,
    /// Key → (the request it was first accepted with; the task).
    keys: HashMap<String, (Value, TaskId)>,
    cursors: Vec<String>,
    /// Every version of every definition, as stored (normalized).
    catalog: BTreeMap<(Kind, String), Vec<Value>>,
    /// The deployment's policy, under every workflow (what validation uses).
    policy: sas::Policy,
}

impl Model {
    fn new(policy: sas::Policy) -> Self {
        let mut catalog = BTreeMap::new();
        for s in examples::services() {
            let body = serde_json::to_value(&s).expect("a service serializes");
            catalog.insert((Kind::Service, s.name.clone()), vec![body]);
        }
        for text in [examples::ECOMMERCE_ORDER, examples::LOAN_APPLICATION] {
            let value = workflow::parse_value(text, workflow::Format::Yaml).expect("YAML");
            let doc = workflow::parse_workflow(value).expect("an example parses");
            let body = serde_json::to_value(&doc).expect("a workflow serializes");
            catalog.insert((Kind::Workflow, doc.name.clone()), vec![body]);
        }
        Self {
            created: vec![],
            created_set: HashSet::new(),
            keys: HashMap::new(),
            cursors: vec![],
            catalog,
            policy,
        }
    }

    fn latest(&self, kind: Kind, name: &str) -> Option<(u32, &Value)> {
        self.catalog
            .get(&(kind, name.to_owned()))
            .and_then(|v| v.last().map(|b| (v.len() as u32, b)))
    }

    fn services(&self) -> BTreeSet<String> {
        self.catalog
            .keys()
            .filter(|(k, _)| *k == Kind::Service)
            .map(|(_, n)| n.clone())
            .collect()
    }

    /// The newest version of workflow `name`, compiled: the oracle for its inputs.
    fn workflow(&self, name: &str) -> Option<(u32, Workflow)> {
        let (v, body) = self.latest(Kind::Workflow, name)?;
        let w = Workflow::from_value(body.clone(), None, &self.policy)
            .expect("a published workflow compiles");
        Some((v, w))
    }

    fn resolve(&self, id: &IdSeg) -> (String, ResolvedId) {
        match id {
            IdSeg::Created(i, form) => match self.created.get(i % self.created.len().max(1)) {
                Some(id) => (form.render(id.as_uuid()), ResolvedId::Known(*id)),
                // No task yet: a UUID no task has (v4 ids never have version 0).
                None => {
                    let u = Uuid::from_u128(0xdead_beef_0000_0000_0000_0000_0000_0000 + *i as u128);
                    (form.render(u), ResolvedId::Unknown)
                }
            },
            IdSeg::Random(n, form) => {
                let u = Uuid::from_u128(*n);
                let known = self
                    .created
                    .iter()
                    .find(|c| c.as_uuid() == u)
                    .map(|c| ResolvedId::Known(*c));
                (form.render(u), known.unwrap_or(ResolvedId::Unknown))
            }
            IdSeg::Junk(s) => {
                let r = match Uuid::parse_str(s) {
                    Ok(_) => ResolvedId::Unpredictable,
                    Err(_) if plain(s) => ResolvedId::NotUuid,
                    Err(_) => ResolvedId::Unpredictable,
                };
                (s.clone(), r)
            }
        }
    }
}

fn name_of(seg: &NameSeg, pool: &[&str]) -> String {
    match seg {
        NameSeg::Pool(i) => pool[i % pool.len()].to_owned(),
        NameSeg::Junk(s) => s.clone(),
    }
}

/// What a path's `{taskId}` turned out to be.
#[derive(Debug, Clone, Copy)]
enum ResolvedId {
    /// A task's id (in any spelling the UUID parser takes).
    Known(TaskId),
    /// A UUID no task has.
    Unknown,
    /// Not a UUID, and a single segment.
    NotUuid,
    Unpredictable,
}

/// A single path segment that routing sees as such.
fn plain(s: &str) -> bool {
    !s.is_empty() && !s.contains(['/', '?'])
}

/// The route of a request whose answer is pinned down.
#[derive(Debug)]
enum Route {
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

struct Rendered {
    method: Method,
    path: String,
    headers: HeaderMap,
    body: Vec<u8>,
    route: Route,
}

/// The number of inputs in [`pool_input`].
const INPUTS: usize = 8;

/// Valid inputs: orders, loans, and `fuzz-a`'s.
fn pool_input(i: usize) -> Value {
    match i % INPUTS {
        0 => json!({"customerId": "c-1", "items": [{"sku": "SKU-1", "quantity": 2}]}),
        1 => json!({"customerId": "c-2", "items": [
            {"sku": "SKU-2", "quantity": 1},
            {"sku": "SKU-3", "quantity": 5}
        ]}),
        2 => json!({"customerId": "c-1", "items": [{"sku": "SKU-1", "quantity": 3}]}),
        3 => json!({"applicantId": "a-1", "amount": 1000, "currency": "EUR"}),
        4 => json!({"applicantId": "a-2", "amount": 2500.5, "currency": "USD"}),
        5 => json!({"applicantId": "a-1", "amount": 10_000_000, "currency": "JPY"}),
        6 => json!({"x": 1}),
        _ => json!({"x": 0}),
    }
}

fn to_bytes(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).expect("a Value serializes")
}

/// An object with its keys written in reverse order (the same request).
fn reversed(v: &Value) -> String {
    match v {
        Value::Object(m) => {
            let fields: Vec<String> = m
                .iter()
                .rev()
                .map(|(k, v)| format!("{}:{}", Value::from(k.as_str()), reversed(v)))
                .collect();
            format!("{{{}}}", fields.join(","))
        }
        Value::Array(a) => {
            let items: Vec<String> = a.iter().map(reversed).collect();
            format!("[{}]", items.join(","))
        }
        other => other.to_string(),
    }
}

fn styled(v: &Value, style: Style) -> Vec<u8> {
    match style {
        Style::Compact => to_bytes(v),
        Style::Pretty => serde_json::to_vec_pretty(v).expect("a Value serializes"),
        Style::Reversed => reversed(v).into_bytes(),
        Style::Padded => format!(" \r\n\t{v}\n ").into_bytes(),
    }
}

fn encode(v: &Value, encoding: &Encoding) -> Vec<u8> {
    let compact = to_bytes(v);
    match encoding {
        Encoding::Compact => compact,
        Encoding::Pretty => serde_json::to_vec_pretty(v).expect("a Value serializes"),
        Encoding::Truncate(n) => compact[..n % (compact.len() + 1)].to_vec(),
        Encoding::Insert(at, b) => {
            let mut c = compact;
            let at = at % (c.len() + 1);
            c.insert(at, *b);
            c
        }
        Encoding::Twice => [compact.clone(), compact].concat(),
    }
}

fn field_name(f: Field) -> &'static str {
    match f {
        Field::CustomerId => "customerId",
        Field::Items => "items",
        Field::Sku => "sku",
        Field::Quantity => "quantity",
        Field::ApplicantId => "applicantId",
        Field::Amount => "amount",
        Field::Currency => "currency",
        Field::X => "x",
    }
}

/// The first line item, if `items` is still an array of objects.
fn first_item(
    top: &mut serde_json::Map<String, Value>,
) -> Option<&mut serde_json::Map<String, Value>> {
    top.get_mut("items")
        .and_then(Value::as_array_mut)
        .and_then(|a| a.first_mut())
        .and_then(Value::as_object_mut)
}

fn mutate(v: &mut Value, m: &Mutation) {
    let Some(top) = v.as_object_mut() else {
        return;
    };
    match m {
        Mutation::Remove(f @ (Field::Sku | Field::Quantity)) => {
            if let Some(item) = first_item(top) {
                item.remove(field_name(*f));
            }
        }
        Mutation::Remove(f) => {
            top.remove(field_name(*f));
        }
        Mutation::Set(f @ (Field::Sku | Field::Quantity), value) => {
            if let Some(item) = first_item(top) {
                item.insert(field_name(*f).to_owned(), value.clone());
            }
        }
        Mutation::Set(f, value) => {
            top.insert(field_name(*f).to_owned(), value.clone());
        }
        Mutation::Extra {
            in_item: true,
            name,
            value,
        } => {
            if let Some(item) = first_item(top) {
                item.insert(name.clone(), value.clone());
            }
        }
        Mutation::Extra { name, value, .. } => {
            top.insert(name.clone(), value.clone());
        }
        Mutation::ManyItems(n) => {
            let items = (0..*n)
                .map(|i| json!({"sku": format!("SKU-{i}"), "quantity": 1}))
                .collect();
            top.insert("items".into(), Value::Array(items));
        }
    }
}

/// `fuzz-a`: one step on `inventory`, with an undo.
fn fuzz_a() -> Value {
    json!({
        "name": "fuzz-a",
        "input": {
            "type": "object",
            "additionalProperties": false,
            "required": ["x"],
            "properties": {"x": {"type": "integer", "minimum": 0}}
        },
        "steps": [{
            "name": "one",
            "service": "inventory",
            "input": {"x": "$.input.x", "task": "$.task.id"},
            "undo": {"action": "undo-one"}
        }]
    })
}

fn example_value(text: &str) -> Value {
    workflow::parse_value(text, workflow::Format::Yaml).expect("an example parses")
}

fn def_mutate(v: &mut Value, m: &DefMutation) {
    let Some(top) = v.as_object_mut() else {
        return;
    };
    fn step0(
        top: &mut serde_json::Map<String, Value>,
    ) -> Option<&mut serde_json::Map<String, Value>> {
        top.get_mut("steps")
            .and_then(Value::as_array_mut)
            .and_then(|s| s.first_mut())
            .and_then(Value::as_object_mut)
    }
    fn steps(top: &mut serde_json::Map<String, Value>) -> Option<&mut Vec<Value>> {
        top.get_mut("steps").and_then(Value::as_array_mut)
    }
    match m {
        DefMutation::Description(i) => {
            top.insert(
                "description".into(),
                Value::from(DESCRIPTIONS[i % DESCRIPTIONS.len()]),
            );
        }
        DefMutation::SetName(n) => {
            top.insert("name".into(), n.clone());
        }
        DefMutation::Remove(k) => {
            top.remove(*k);
        }
        DefMutation::EmptySteps => {
            top.insert("steps".into(), json!([]));
        }
        DefMutation::StepService(s) => {
            if let Some(step) = step0(top) {
                step.insert("service".into(), Value::from(s.as_str()));
            }
        }
        DefMutation::StepName(n) => {
            if let Some(step) = step0(top) {
                step.insert("name".into(), n.clone());
            }
        }
        DefMutation::ExtraTop(k, val) => {
            top.insert(k.clone(), val.clone());
        }
        DefMutation::ExtraStep(k, val) => {
            if let Some(step) = step0(top) {
                step.insert(k.clone(), val.clone());
            }
        }
        DefMutation::Timeout(t) => {
            if let Some(step) = step0(top) {
                step.insert("timeout".into(), Value::from(t.as_str()));
            }
        }
        DefMutation::ForwardRef => {
            if let Some(step) = step0(top) {
                step.insert("input".into(), json!({"x": "$.steps['later'].result.id"}));
            }
            if let Some(all) = steps(top) {
                all.push(json!({"name": "later", "service": "inventory"}));
            }
        }
        DefMutation::SecondPivot => {
            if let Some(all) = steps(top) {
                for s in all.iter_mut().take(2) {
                    if let Some(o) = s.as_object_mut() {
                        o.insert("pivot".into(), Value::Bool(true));
                    }
                }
            }
        }
        DefMutation::UndoAfterPivot => {
            if let Some(all) = steps(top) {
                if let Some(o) = all.first_mut().and_then(Value::as_object_mut) {
                    o.insert("pivot".into(), Value::Bool(true));
                }
                all.push(json!({"name": "after", "service": "inventory", "undo": {"action": "un-after"}}));
            }
        }
        DefMutation::InputSchema(s) => {
            top.insert("input".into(), s.clone());
        }
        DefMutation::BigMapping(n) => {
            if let Some(step) = step0(top) {
                step.insert("input".into(), json!({"blob": "b".repeat(*n)}));
            }
        }
        DefMutation::ManySteps(n) => {
            let all: Vec<Value> = (0..*n)
                .map(|i| json!({"name": format!("s{i}"), "service": "inventory"}))
                .collect();
            top.insert("steps".into(), Value::Array(all));
        }
        DefMutation::Retry(r) => {
            if let Some(step) = step0(top) {
                step.insert("retry".into(), r.clone());
            }
        }
    }
}

fn render_definition(d: &DefSpec) -> Value {
    match d {
        DefSpec::Workflow(base, mutations) => {
            let mut v = match base {
                WfBase::Ecommerce => example_value(examples::ECOMMERCE_ORDER),
                WfBase::Loan => example_value(examples::LOAN_APPLICATION),
                WfBase::FuzzA => fuzz_a(),
            };
            for m in mutations {
                def_mutate(&mut v, m);
            }
            v
        }
        DefSpec::Service {
            name,
            description,
            target,
            extra,
        } => {
            let mut v = json!({
                "name": SERVICES[name % SERVICES.len()],
                "target": match target {
                    TargetSpec::Simulated => json!({"type": "simulated"}),
                    TargetSpec::Http(url) => json!({"type": "http", "baseUrl": url}),
                    TargetSpec::Junk(j) => j.clone(),
                },
            });
            if let Some(d) = description {
                v["description"] = Value::from(DESCRIPTIONS[d % DESCRIPTIONS.len()]);
            }
            if let Some((k, val)) = extra {
                v[k.as_str()] = val.clone();
            }
            v
        }
    }
}

fn render_body(spec: &BodySpec) -> Vec<u8> {
    match spec {
        BodySpec::Empty => Vec::new(),
        BodySpec::Whitespace(s) => s.clone().into_bytes(),
        BodySpec::Bytes(b) => b.clone(),
        BodySpec::Json(v) => to_bytes(v),
        BodySpec::Input(i, mutations, encoding) => {
            let mut v = pool_input(*i);
            for m in mutations {
                mutate(&mut v, m);
            }
            encode(&v, encoding)
        }
        BodySpec::Pool(i, style) => styled(&pool_input(*i), *style),
        BodySpec::Reason(reason, extra) => {
            let mut m = serde_json::Map::new();
            m.insert("reason".into(), reason.clone());
            if let Some((k, v)) = extra {
                m.insert(k.clone(), v.clone());
            }
            to_bytes(&Value::Object(m))
        }
        BodySpec::Positional(values) => to_bytes(&Value::Array(values.clone())),
        BodySpec::Big(kind, len) => {
            let mut b = match kind {
                BigKind::PaddedInput => to_bytes(&pool_input(0)),
                BigKind::Garbage => Vec::new(),
                BigKind::LongString => {
                    br#"{"items":[{"sku":"SKU-1","quantity":2}],"customerId":""#.to_vec()
                }
            };
            let tail: &[u8] = match kind {
                BigKind::LongString => br#""}"#,
                _ => b"",
            };
            let fill = match kind {
                BigKind::PaddedInput => b' ',
                _ => b'x',
            };
            let n = len.saturating_sub(b.len() + tail.len());
            b.extend(std::iter::repeat_n(fill, n));
            b.extend_from_slice(tail);
            b
        }
        BodySpec::Definition(d, encoding) => encode(&render_definition(d), encoding),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Renders a query; with the list's expected answer if it can be told.
fn render_query(
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

fn render(req: &Req, model: &Model) -> Rendered {
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
        headers.insert(submission::IDEMPOTENCY_KEY, v);
    }
    let reply: Option<Vec<u8>> = match &req.reply {
        ReplySpec::Absent => None,
        ReplySpec::Value(s) => Some(s.as_bytes().to_vec()),
        ReplySpec::Raw(b) => Some(b.clone()),
    };
    if let Some(v) = reply.and_then(|b| HeaderValue::from_bytes(&b).ok()) {
        headers.insert(submission::REPLY_QUEUE_URL, v);
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

/// The error code an operator action's body gets, if it is refused: none, or
/// `{"reason": string|null}` with a reason of at most 500 characters, is accepted (a resolve
/// and a skip need the reason; a skip may add `result`).
fn action_body_error(body: &[u8], action: &str) -> Option<&'static str> {
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
            let too_long = reason.is_some_and(|r| r.chars().count() > submission::MAX_REASON_CHARS);
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

/// The idempotency key as documented; `Err` if present and invalid.
fn key_of(headers: &HeaderMap) -> Result<Option<String>, ()> {
    match headers.get(submission::IDEMPOTENCY_KEY) {
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
fn reply_of(headers: &HeaderMap) -> Result<Option<String>, ()> {
    match headers.get(submission::REPLY_QUEUE_URL) {
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
fn json_content_type(headers: &HeaderMap) -> bool {
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

// ---------------------------------------------------------------------------------------------
// Running a request and checking everything.
// ---------------------------------------------------------------------------------------------

/// Everything the handler may change: the records, the messages queued, the events published,
/// the definitions.
#[derive(PartialEq, Debug)]
struct Snapshot {
    records: HashMap<TaskId, StateRecord>,
    queued: Vec<(String, usize)>,
    events: usize,
    catalog: BTreeMap<(Kind, String), Vec<Value>>,
}

async fn snapshot(system: &System) -> Snapshot {
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
                    .definition(kind, &e.name, Some(v))
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

fn queued(s: &Snapshot, url: &str) -> usize {
    s.queued
        .iter()
        .find(|(u, _)| u == url)
        .map_or(0, |(_, n)| *n)
}

/// Shortens a body for a failure message.
fn clip(s: &str) -> String {
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

fn task_id(json: &Value) -> Option<TaskId> {
    json["taskId"].as_str().and_then(|s| s.parse().ok())
}

fn code_of(json: &Value) -> &str {
    json["error"]["code"].as_str().unwrap_or_default()
}

/// Every `error.problems[*]` has a non-empty message and an `at` that is a JSON pointer into
/// `doc`.
fn check_problems(json: &Value, doc: &Value, ctx: &str) -> Result<(), TestCaseError> {
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
enum Want {
    Status(StatusCode, &'static str),
    Created,
    /// A replay of this task.
    Replay(TaskId),
    /// Published: `(version, created)`.
    Published(u32, bool),
}

/// `POST /workflows/{name}/tasks`: the checks in the handler's order.
fn expect_submit(model: &Model, name: &str, r: &Rendered) -> (Want, Option<Value>) {
    use StatusCode as S;
    if r.body.len() > MAX_INPUT_BYTES {
        return (Want::Status(S::PAYLOAD_TOO_LARGE, "input_too_large"), None);
    }
    if !json_content_type(&r.headers) {
        return (
            Want::Status(S::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type"),
            None,
        );
    }
    let Ok(key) = key_of(&r.headers) else {
        return (
            Want::Status(S::BAD_REQUEST, "invalid_idempotency_key"),
            None,
        );
    };
    let Ok(reply) = reply_of(&r.headers) else {
        return (
            Want::Status(S::BAD_REQUEST, "invalid_reply_queue_url"),
            None,
        );
    };
    let Ok(input) = serde_json::from_slice::<Value>(&r.body) else {
        return (Want::Status(S::BAD_REQUEST, "invalid_json"), None);
    };
    let Some((_, w)) = model.workflow(name) else {
        return (Want::Status(S::NOT_FOUND, "workflow_not_found"), None);
    };
    if w.check_input(&input).is_err() {
        return (
            Want::Status(S::BAD_REQUEST, "validation_failed"),
            Some(input),
        );
    }
    let request = json!({"workflow": name, "input": input, "replyQueueUrl": reply});
    match key.and_then(|k| model.keys.get(&k).cloned()) {
        None => (Want::Created, Some(request)),
        Some((first, id)) if first == request => (Want::Replay(id), Some(request)),
        Some(_) => (
            Want::Status(S::CONFLICT, "idempotency_key_reused"),
            Some(request),
        ),
    }
}

/// `PUT /workflows/{name}`, `PUT /services/{name}`: the checks in the handler's order, and
/// the body as it would be stored.
fn expect_publish(model: &Model, kind: Kind, name: &str, r: &Rendered) -> (Want, Option<Value>) {
    use StatusCode as S;
    if r.body.len() > MAX_DEFINITION_BYTES {
        return (
            Want::Status(S::PAYLOAD_TOO_LARGE, "definition_too_large"),
            None,
        );
    }
    if !json_content_type(&r.headers) {
        return (
            Want::Status(S::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type"),
            None,
        );
    }
    let Ok(value) = serde_json::from_slice::<Value>(&r.body) else {
        return (Want::Status(S::BAD_REQUEST, "invalid_json"), None);
    };
    if let Some(named) = value.get("name").and_then(Value::as_str)
        && named != name
    {
        return (Want::Status(S::BAD_REQUEST, "name_mismatch"), None);
    }
    let normalized = match kind {
        Kind::Workflow => {
            Workflow::from_value(value.clone(), Some(&model.services()), &model.policy)
                .map(|w| serde_json::to_value(&w.doc).expect("a workflow serializes"))
        }
        Kind::Service => workflow::parse_services(json!({ "services": [value.clone()] }))
            .map(|d| serde_json::to_value(&d.services[0]).expect("a service serializes")),
    };
    let Ok(normalized) = normalized else {
        return (
            Want::Status(S::BAD_REQUEST, "invalid_definition"),
            Some(value),
        );
    };
    let stored_name = normalized["name"].as_str().unwrap_or_default();
    match model.latest(kind, stored_name) {
        Some((v, latest)) if *latest == normalized => (Want::Published(v, false), Some(normalized)),
        Some((v, _)) => (Want::Published(v + 1, true), Some(normalized)),
        None => (Want::Published(1, true), Some(normalized)),
    }
}

/// Sends one request and checks the answer and the store against the model.
async fn step(system: &System, model: &mut Model, req: &Req) -> Result<(), TestCaseError> {
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
    let resp = submission::handle(
        &system.operator,
        &sas_blackbox::operator(),
        &r.method,
        &format!("{}{}", submission::OPERATOR_PREFIX, r.path),
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
            CODES.contains(&code),
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
            };
            let want: Vec<Value> = model
                .catalog
                .iter()
                .filter(|((k, _), _)| k == kind)
                .map(|((_, n), v)| match kind {
                    // No breaker is ever written here: each is closed, with no fault.
                    Kind::Service => json!({"name": n, "latest": v.len(),
                        "breaker": {"state": "closed", "failures": 0}}),
                    Kind::Workflow => json!({"name": n, "latest": v.len()}),
                })
                .collect();
            prop_assert_eq!(&json[key], &Value::Array(want), "{}", ctx);
        }
        Route::Definition(kind, name, version) => {
            let missing = match kind {
                Kind::Workflow => "workflow_not_found",
                Kind::Service => "service_not_found",
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

// ---------------------------------------------------------------------------------------------
// The properties.
// ---------------------------------------------------------------------------------------------

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

fn config(cases: u32) -> Config {
    Config {
        cases,
        // No regression files: this test writes nothing next to the sources.
        failure_persistence: None,
        ..Config::default()
    }
}

async fn new_system() -> (System, Model) {
    let system = memory_system(Settings::default()).await;
    let model = Model::new(system.definitions.policy().clone());
    (system, model)
}

fn submit(workflow: usize, key: Option<usize>, body: usize) -> Req {
    Req {
        method: Method::POST,
        path: PathSpec::Submit {
            workflow: NameSeg::Pool(workflow),
            trailing: false,
            query: None,
        },
        ct: CtSpec::Json,
        key: key.map_or(KeySpec::Absent, KeySpec::Pool),
        reply: ReplySpec::Absent,
        body: BodySpec::Pool(body, Style::Compact),
    }
}

/// Two orders (one under `key-0`), a loan, and a list cursor, made through the handler.
async fn seed(system: &System, model: &mut Model) -> Result<(), TestCaseError> {
    step(system, model, &submit(0, Some(0), 0)).await?;
    step(system, model, &submit(0, None, 1)).await?;
    step(system, model, &submit(1, None, 3)).await?;
    let list = Req {
        method: Method::GET,
        path: PathSpec::Tasks {
            trailing: false,
            query: Some(QuerySpec::Params(vec![
                Param::State("Pending".into()),
                Param::Limit("1".into()),
            ])),
        },
        ct: CtSpec::Absent,
        key: KeySpec::Absent,
        reply: ReplySpec::Absent,
        body: BodySpec::Empty,
    };
    step(system, model, &list).await?;
    prop_assert_eq!(model.created.len(), 3);
    prop_assert_eq!(
        model.cursors.len(),
        1,
        "a page of 1 of 3 tasks has a next cursor"
    );
    Ok(())
}

#[test]
fn any_single_request_answers_2xx_or_4xx_json_and_writes_nothing_partial() {
    let rt = runtime();
    let mut runner = TestRunner::new(config(1024));
    let result = runner.run(&request(), |req| {
        rt.block_on(async {
            let (system, mut model) = new_system().await;
            seed(&system, &mut model).await?;
            step(&system, &mut model, &req).await
        })
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

#[test]
fn request_sequences_keep_the_store_and_the_catalog_whole_and_replays_idempotent() {
    let rt = runtime();
    let mut runner = TestRunner::new(config(256));
    let result = runner.run(&prop::collection::vec(request(), 1..20), |reqs| {
        rt.block_on(async {
            let (system, mut model) = new_system().await;
            for req in &reqs {
                step(&system, &mut model, req).await?;
            }
            Ok(())
        })
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

#[test]
fn a_workflow_published_over_http_takes_new_tasks_and_the_running_ones_keep_their_version() {
    let rt = runtime();
    rt.block_on(async {
        let (system, mut model) = new_system().await;
        let put = |d: DefSpec| Req {
            method: Method::PUT,
            path: PathSpec::Definition {
                kind: DefKind::Workflows,
                name: NameSeg::Pool(2),
                version: None,
                trailing: false,
            },
            ct: CtSpec::Json,
            key: KeySpec::Absent,
            reply: ReplySpec::Absent,
            body: BodySpec::Definition(d, Encoding::Compact),
        };
        // fuzz-a is unknown, then published (201), then the same again (200).
        step(&system, &mut model, &submit(2, None, 6))
            .await
            .expect("404");
        assert!(model.created.is_empty());
        let v1 = DefSpec::Workflow(WfBase::FuzzA, vec![]);
        step(&system, &mut model, &put(v1.clone()))
            .await
            .expect("201");
        step(&system, &mut model, &put(v1)).await.expect("200");
        step(&system, &mut model, &submit(2, None, 6))
            .await
            .expect("202");
        let first = model.created[0];
        // A second version; the first task stays on version 1, a new one takes version 2.
        let v2 = DefSpec::Workflow(WfBase::FuzzA, vec![DefMutation::Description(1)]);
        step(&system, &mut model, &put(v2)).await.expect("201");
        step(&system, &mut model, &submit(2, None, 7))
            .await
            .expect("202");
        let second = model.created[1];
        let version = |id: TaskId| {
            let system = &system;
            async move {
                system
                    .store
                    .get_state(id)
                    .await
                    .expect("read")
                    .expect("stored")
                    .workflow_version
            }
        };
        assert_eq!(version(first).await, 1);
        assert_eq!(version(second).await, 2);
        assert_eq!(
            model.latest(Kind::Workflow, "fuzz-a").map(|(v, _)| v),
            Some(2)
        );
        // The same request under a key twice is one task; another request under it, a 409.
        step(&system, &mut model, &submit(2, Some(1), 6))
            .await
            .expect("202");
        step(&system, &mut model, &submit(2, Some(1), 6))
            .await
            .expect("replay");
        step(&system, &mut model, &submit(2, Some(1), 7))
            .await
            .expect("409");
        step(&system, &mut model, &submit(0, Some(1), 0))
            .await
            .expect("409");
        assert_eq!(model.created.len(), 3, "one task for the key");
        // An input fuzz-a's schema refuses, named by its pointer.
        let bad = Req {
            body: BodySpec::Input(
                6,
                vec![Mutation::Set(Field::X, json!(-1))],
                Encoding::Compact,
            ),
            ..submit(2, None, 6)
        };
        step(&system, &mut model, &bad).await.expect("400");
    });
}

// ---------------------------------------------------------------------------------------------
// The task API's authentication: arbitrary credentials, through the local runner's authorizers
// (SigV4 and JWT, the checks API Gateway makes in a stack) and then the handler.
// ---------------------------------------------------------------------------------------------

/// The credentials of a request.
#[derive(Debug, Clone)]
enum AuthSpec {
    Absent,
    /// Arbitrary bytes as the `Authorization` header.
    Raw(Vec<u8>),
    /// A token that is not one (any text after the scheme).
    Junk {
        scheme: String,
        token: String,
    },
    /// A JWT of the issuer (or another key), for a caller, for an audience, live or expired.
    Jwt {
        who: usize,
        scheme: String,
        expired: bool,
        other_key: bool,
        other_audience: bool,
    },
    /// A SigV4 signature by a caller's key (or a wrong secret), at some skew, perhaps mangled
    /// at one place, perhaps over another path than the one requested.
    SigV4 {
        who: usize,
        wrong_secret: bool,
        skew_minutes: i64,
        mangle: Option<usize>,
        other_path: bool,
    },
}

/// What the request asks for.
#[derive(Debug, Clone, Copy)]
enum AuthRoute {
    Submit,
    List,
    ReadOwn,
    ReadOther,
    CancelOther,
}

const CALLERS: [&str; 2] = ["alice", "bob"];

fn auth_spec() -> BoxedStrategy<AuthSpec> {
    let scheme = prop::sample::select(vec!["Bearer ", "bearer ", "Bearer  ", "Basic ", ""])
        .prop_map(str::to_owned);
    prop_oneof![
        2 => Just(AuthSpec::Absent),
        2 => prop::collection::vec(any::<u8>(), 0..80).prop_map(AuthSpec::Raw),
        2 => (scheme.clone(), "\\PC{0,60}").prop_map(|(scheme, token)| AuthSpec::Junk { scheme, token }),
        6 => (0..2usize, prop_oneof![4 => Just("Bearer ".to_owned()), 1 => scheme], any::<bool>(), prop::bool::weighted(0.2), prop::bool::weighted(0.2))
            .prop_map(|(who, scheme, expired, other_key, other_audience)| AuthSpec::Jwt { who, scheme, expired, other_key, other_audience }),
        6 => (0..2usize, prop::bool::weighted(0.2), prop_oneof![4 => Just(0i64), 1 => (-40i64..40).prop_filter("not at the 15-minute edge", |m| m.abs() != 15)], prop::option::weighted(0.2, 0..200usize), prop::bool::weighted(0.2))
            .prop_map(|(who, wrong_secret, skew_minutes, mangle, other_path)| AuthSpec::SigV4 { who, wrong_secret, skew_minutes, mangle, other_path }),
    ]
    .boxed()
}

fn auth_route() -> impl Strategy<Value = AuthRoute> {
    prop::sample::select(vec![
        AuthRoute::Submit,
        AuthRoute::List,
        AuthRoute::ReadOwn,
        AuthRoute::ReadOther,
        AuthRoute::CancelOther,
    ])
}

/// The fixture: a system whose task API has the given authorizer, and one task per caller.
struct AuthFixture {
    system: System,
    issuer: sas::local::auth::TestIssuer,
    stranger: sas::local::auth::TestIssuer,
    users: Vec<sas::local::auth::LocalUser>,
    /// (IAM mode, caller) → that caller's task.
    tasks: HashMap<(bool, usize), String>,
}

const FUZZ_ISSUER: &str = "https://issuer.fuzz.invalid";
const FUZZ_AUDIENCE: &str = "sas-fuzz";

async fn auth_fixture() -> AuthFixture {
    use sas::local::auth::{LocalUser, TestIssuer};
    let users: Vec<LocalUser> = CALLERS
        .iter()
        .map(|n| LocalUser {
            access_key_id: format!("AKIA{}", n.to_uppercase()),
            secret_access_key: format!("{n}-secret"),
            arn: format!("arn:aws:iam::123456789012:user/{n}"),
        })
        .collect();
    let system = memory_system(Settings::default()).await;
    // One task per caller as each mode names it: the IAM user's ARN, or the JWT's `sub`.
    let mut tasks = HashMap::new();
    for iam in [true, false] {
        for (n, name) in CALLERS.iter().enumerate() {
            let id = if iam {
                users[n].arn.clone()
            } else {
                name.to_string()
            };
            let caller = sas::Caller::from_iam_arn(&id).expect("caller");
            let mut headers = HeaderMap::new();
            headers.insert("content-type", HeaderValue::from_static("application/json"));
            let resp = submission::handle(
                &system.submission,
                &sas::auth::Identity::Caller(caller),
                &Method::POST,
                "/workflows/ecommerce-order/tasks",
                &headers,
                json!({"customerId": "c-1", "items": [{"sku": "S", "quantity": 1}]})
                    .to_string()
                    .as_bytes(),
            )
            .await;
            let body: Value = serde_json::from_str(resp.body()).expect("JSON");
            tasks.insert(
                (iam, n),
                body["taskId"].as_str().expect("taskId").to_owned(),
            );
        }
    }
    AuthFixture {
        system,
        issuer: TestIssuer::generate(FUZZ_ISSUER).expect("issuer"),
        stranger: TestIssuer::generate(FUZZ_ISSUER).expect("issuer"),
        users,
        tasks,
    }
}

/// The SigV4 headers of a request (signed over `signed_path`), as an SDK makes them.
fn sigv4(
    user: &sas::local::auth::LocalUser,
    secret: &str,
    method: &Method,
    signed_path: &str,
    body: &[u8],
    at: std::time::SystemTime,
) -> Vec<(String, String)> {
    use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
    let identity =
        aws_credential_types::Credentials::new(&user.access_key_id, secret, None, None, "fuzz")
            .into();
    let params = aws_sigv4::sign::v4::SigningParams::builder()
        .identity(&identity)
        .region("us-east-1")
        .name("execute-api")
        .time(at)
        .settings(SigningSettings::default())
        .build()
        .expect("params")
        .into();
    let url = format!("http://127.0.0.1:1{signed_path}");
    let request = SignableRequest::new(
        method.as_str(),
        &url,
        [("content-type", "application/json")].into_iter(),
        SignableBody::Bytes(body),
    )
    .expect("signable");
    let (instructions, _) = sign(request, &params).expect("signs").into_parts();
    instructions
        .headers()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// One authenticated request, checked: the authorizer names exactly the caller whose valid
/// credentials were sent (and no one otherwise); an unauthenticated request is a 401 that
/// writes nothing; an authenticated one never reaches another caller's task.
async fn auth_case(
    f: &AuthFixture,
    iam: bool,
    spec: &AuthSpec,
    route: AuthRoute,
) -> Result<(), TestCaseError> {
    use sas::local::auth::{JwtCheck, LocalAuth, SigV4Check};
    let auth = if iam {
        LocalAuth::Iam(std::sync::Arc::new(
            SigV4Check::new("us-east-1", f.users.clone()).expect("users"),
        ))
    } else {
        LocalAuth::Jwt(std::sync::Arc::new(JwtCheck::new(
            FUZZ_ISSUER,
            vec![FUZZ_AUDIENCE.into()],
            f.issuer.jwks().clone(),
        )))
    };
    let order = json!({"customerId": "c-2", "items": [{"sku": "S", "quantity": 1}]}).to_string();
    let (method, path, body): (Method, String, Vec<u8>) = match route {
        AuthRoute::Submit => (
            Method::POST,
            "/workflows/ecommerce-order/tasks".into(),
            order.into_bytes(),
        ),
        AuthRoute::List => (Method::GET, "/tasks".into(), vec![]),
        AuthRoute::ReadOwn | AuthRoute::ReadOther | AuthRoute::CancelOther => {
            // The task of the caller the credentials name (alice's if none), or the other's.
            let who = match spec {
                AuthSpec::Jwt { who, .. } | AuthSpec::SigV4 { who, .. } => *who,
                _ => 0,
            };
            let whose = if matches!(route, AuthRoute::ReadOwn) {
                who
            } else {
                1 - who
            };
            let id = &f.tasks[&(iam, whose)];
            if matches!(route, AuthRoute::CancelOther) {
                (Method::POST, format!("/tasks/{id}/cancel"), vec![])
            } else {
                (Method::GET, format!("/tasks/{id}"), vec![])
            }
        }
    };
    let mut headers = HeaderMap::new();
    headers.insert("host", HeaderValue::from_static("127.0.0.1:1"));
    headers.insert("content-type", HeaderValue::from_static("application/json"));
    let now = Utc::now();
    let hour = chrono::Duration::hours(1);
    let mut expect: Option<usize> = None;
    match spec {
        AuthSpec::Absent => {}
        AuthSpec::Raw(bytes) => {
            if let Ok(v) = HeaderValue::from_bytes(bytes) {
                headers.insert("authorization", v);
            }
        }
        AuthSpec::Junk { scheme, token } => {
            if let Ok(v) = HeaderValue::from_str(&format!("{scheme}{token}")) {
                headers.insert("authorization", v);
            }
        }
        AuthSpec::Jwt {
            who,
            scheme,
            expired,
            other_key,
            other_audience,
        } => {
            let issuer = if *other_key { &f.stranger } else { &f.issuer };
            let audience = if *other_audience {
                "another-api"
            } else {
                FUZZ_AUDIENCE
            };
            let token = issuer
                .token(
                    CALLERS[*who],
                    audience,
                    &[],
                    now,
                    if *expired { -hour } else { hour },
                )
                .expect("token");
            headers.insert(
                "authorization",
                HeaderValue::from_str(&format!("{scheme}{token}")).expect("header"),
            );
            if !iam
                && scheme.eq_ignore_ascii_case("Bearer ")
                && !expired
                && !other_key
                && !other_audience
            {
                expect = Some(*who);
            }
        }
        AuthSpec::SigV4 {
            who,
            wrong_secret,
            skew_minutes,
            mangle,
            other_path,
        } => {
            let user = &f.users[*who];
            let secret = if *wrong_secret {
                "guessed"
            } else {
                user.secret_access_key.as_str()
            };
            let at = std::time::SystemTime::from(now + chrono::Duration::minutes(*skew_minutes));
            let signed_path = if *other_path {
                "/tasks/elsewhere"
            } else {
                path.as_str()
            };
            for (k, v) in sigv4(user, secret, &method, signed_path, &body, at) {
                let mut v = v;
                if k == "authorization"
                    && let Some(i) = mangle
                {
                    // Change one character of the signature (its hex digits are at the end).
                    let pos = v.len() - 1 - (i % 64);
                    let c = v.as_bytes()[pos];
                    let swapped = if c == b'0' { '1' } else { '0' };
                    v.replace_range(pos..=pos, &swapped.to_string());
                }
                headers.insert(
                    http::HeaderName::from_bytes(k.as_bytes()).expect("name"),
                    HeaderValue::from_str(&v).expect("value"),
                );
            }
            if iam && !wrong_secret && skew_minutes.abs() <= 14 && mangle.is_none() && !other_path {
                expect = Some(*who);
            }
        }
    }
    let identity = auth.identify(&method, &path, &headers, &body);
    match (&identity, expect) {
        (sas::auth::Identity::Caller(c), Some(who)) => {
            let want = if iam {
                f.users[who].arn.as_str()
            } else {
                CALLERS[who]
            };
            prop_assert_eq!(c.as_str(), want, "{:?}", spec)
        }
        (sas::auth::Identity::Unauthenticated(_), None) => {}
        (got, want) => prop_assert!(false, "{spec:?} named {got:?}, expected caller {want:?}"),
    }
    let before = f.system.memory.as_ref().expect("memory").0.all_states();
    let resp = submission::handle(
        &f.system.submission,
        &identity,
        &method,
        &path,
        &headers,
        &body,
    )
    .await;
    let status = resp.status();
    prop_assert!(!status.is_server_error(), "{spec:?} {route:?}: {status}");
    let answer: Value = serde_json::from_str(resp.body())
        .map_err(|e| TestCaseError::fail(format!("not JSON ({e}): {}", resp.body())))?;
    match expect {
        None => {
            prop_assert_eq!(status, StatusCode::UNAUTHORIZED, "{:?}: {}", spec, answer);
            prop_assert_eq!(&answer["error"]["code"], "unauthenticated");
            let after = f.system.memory.as_ref().expect("memory").0.all_states();
            prop_assert_eq!(before, after, "a 401 writes nothing");
        }
        Some(_) => match route {
            AuthRoute::Submit => prop_assert_eq!(status, StatusCode::ACCEPTED, "{}", answer),
            AuthRoute::List | AuthRoute::ReadOwn => {
                prop_assert_eq!(status, StatusCode::OK, "{}", answer)
            }
            AuthRoute::ReadOther | AuthRoute::CancelOther => {
                prop_assert_eq!(status, StatusCode::NOT_FOUND, "{}", answer);
                prop_assert_eq!(&answer["error"]["code"], "task_not_found");
            }
        },
    }
    Ok(())
}

#[test]
fn credentials_name_exactly_their_caller_and_nothing_else_gets_through() {
    let rt = runtime();
    let fixture = rt.block_on(auth_fixture());
    let mut runner = TestRunner::new(config(512));
    let result = runner.run(
        &(any::<bool>(), auth_spec(), auth_route()),
        |(iam, spec, route)| rt.block_on(auth_case(&fixture, iam, &spec, route)),
    );
    if let Err(e) = result {
        panic!("{e}");
    }
}
