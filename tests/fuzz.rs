//! Property tests of the HTTP API, black-box over `submission::handle` on the in-memory system
//! (nothing started: only the handler writes). Arbitrary requests (methods, paths with junk,
//! UUIDs and the ids of orders made earlier, query strings, content types, idempotency keys,
//! arbitrary bytes and JSON, mutated order bodies, bodies over 256 KiB) go in, one at a time
//! and in sequences. For every answer:
//!
//! - it is a 2xx or a 4xx, never a 5xx, with a JSON object body and `Content-Type:
//!   application/json`; a 4xx carries `error.code` and `error.message`; a 405 an `Allow`;
//! - a 202 names an order (`orderId`); a new order is `Pending` and its work message is queued;
//! - nothing is written partially: every order has its state record and every record its order,
//!   the record count is the number of distinct orders created, every record passes `check`, and
//!   an answer other than 202 changes no record, no queue and no event;
//! - idempotency: a key with the same request (up to whitespace and key order) gets the same
//!   `orderId`, with a different request a 409;
//! - the exact routes answer as the README says (`GET /orders/{id}`, the operator actions, the
//!   list's parameters, 413 over 256 KiB, the body's error codes).

use http::{HeaderMap, HeaderValue, Method, StatusCode};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use sas::handlers::submission::{self, MAX_BODY_BYTES, MAX_KEY_LEN};
use sas::local::{Backend, Settings, System};
use sas::ports::{StateStore, SystemClock};
use sas::{OrderId, OrderRequest, ProcessState, StateRecord};
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
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

/// The `{orderId}` of a path.
#[derive(Debug, Clone)]
enum IdSeg {
    /// An order created earlier in the case (by index; a never-used UUID if none yet).
    Created(usize, UuidForm),
    /// Any UUID (almost surely no order's).
    Random(u128, UuidForm),
    Junk(String),
}

/// A segment of a free-form path.
#[derive(Debug, Clone)]
enum Seg {
    Orders,
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
    Limit(String),
    Cursor(CursorSpec),
    /// A name that is none of `state`, `limit`, `cursor`.
    Unknown(String, String),
}

#[derive(Debug, Clone)]
enum QuerySpec {
    /// Encoded with `application/x-www-form-urlencoded`, so each value arrives as generated.
    Params(Vec<Param>),
    /// Sent as is.
    Raw(String),
}

#[derive(Debug, Clone)]
enum PathSpec {
    /// `/orders`
    Root {
        trailing: bool,
        query: Option<QuerySpec>,
    },
    /// `/orders/{id}`
    Order {
        id: IdSeg,
        trailing: bool,
        query: Option<QuerySpec>,
    },
    /// `/orders/{id}/{action}`
    Action {
        id: IdSeg,
        action: String,
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

#[derive(Debug, Clone, Copy)]
enum Field {
    CustomerId,
    Items,
    Sku,
    Quantity,
    ReplyQueueUrl,
}

/// A change to the valid order body.
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

/// How the (mutated) order body is turned into bytes.
#[derive(Debug, Clone)]
enum Encoding {
    Compact,
    Pretty,
    Truncate(usize),
    Insert(usize, u8),
    Twice,
}

/// A valid order body, written in one of several equivalent ways.
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
    PaddedOrder,
    Garbage,
    /// `{"customerId": "xxx…", …}`
    LongString,
}

#[derive(Debug, Clone)]
enum BodySpec {
    Empty,
    Whitespace(String),
    Bytes(Vec<u8>),
    Json(Value),
    Order(Vec<Mutation>, Encoding),
    /// One of a few valid order requests (by index), styled.
    Pool(usize, Style),
    /// `{"reason": …}` (valid with a string or null and nothing else).
    Reason(Value, Option<(String, Value)>),
    /// Exactly `len` bytes.
    Big(BigKind, usize),
    /// A JSON array where an object is expected: an order or an action's body by position.
    Positional(Vec<Value>),
}

#[derive(Debug, Clone)]
struct Req {
    method: Method,
    path: PathSpec,
    ct: CtSpec,
    key: KeySpec,
    body: BodySpec,
}

// ---------------------------------------------------------------------------------------------
// Strategies.
// ---------------------------------------------------------------------------------------------

const ACTIONS: [&str; 3] = ["retry", "compensate", "cancel"];
const KEYS: [&str; 3] = ["key-0", "key-1", "key-2"];

fn method() -> BoxedStrategy<Method> {
    prop_oneof![
        4 => Just(Method::GET),
        4 => Just(Method::POST),
        1 => Just(Method::PUT),
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
        Just("orders%2F".to_owned()),
        Just("ORDERS".to_owned()),
        Just("orders ".to_owned()),
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
        Just(String::new()),
        Just("state ".to_owned()),
        "[a-z_]{1,8}".prop_map(|s| format!("x{s}")),
    ];
    prop_oneof![
        4 => state_value().prop_map(Param::State),
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

fn seg() -> BoxedStrategy<Seg> {
    prop_oneof![
        3 => Just(Seg::Orders),
        2 => id_seg().prop_map(Seg::Id),
        1 => action().prop_map(Seg::Action),
        2 => junk().prop_map(Seg::Junk),
        1 => Just(Seg::Empty),
    ]
    .boxed()
}

fn path() -> BoxedStrategy<PathSpec> {
    let trailing = prop::bool::weighted(0.1);
    prop_oneof![
        3 => (trailing, prop::option::weighted(0.2, query()))
            .prop_map(|(trailing, query)| PathSpec::Root { trailing, query }),
        3 => (id_seg(), trailing, prop::option::weighted(0.1, query()))
            .prop_map(|(id, trailing, query)| PathSpec::Order { id, trailing, query }),
        3 => (id_seg(), action(), trailing)
            .prop_map(|(id, action, trailing)| PathSpec::Action { id, action, trailing }),
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
        1 => prop::sample::select(vec!["customerId", "items", "sku", "quantity", "replyQueueUrl", "reason"])
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

fn interesting_number() -> BoxedStrategy<Value> {
    prop_oneof![
        3 => prop::sample::select(vec![
            json!(0),
            json!(1),
            json!(2),
            json!(10_000),
            json!(10_001),
            json!(u32::MAX),
            json!(u64::from(u32::MAX) + 1),
            json!(u64::MAX),
            json!(-1),
            json!(i64::MIN),
            json!(1.5),
            json!(2.0),
            json!(1e300),
            json!("2"),
            Value::Null,
        ]),
        1 => any::<i64>().prop_map(Value::from),
    ]
    .boxed()
}

fn reply_url() -> BoxedStrategy<Value> {
    prop_oneof![reply_url_string(), arb_json()].boxed()
}

fn reply_url_string() -> BoxedStrategy<Value> {
    prop_oneof![
        prop::sample::select(vec![
            "https://sqs.us-east-1.amazonaws.com/123456789012/sas-dev-client-shop",
            "http://localhost:4566/000000000000/q",
            "memory://sas/work",
            "memory://sas/nowhere",
            "ftp://example.com/q",
            "https://",
            "not a url",
            "",
        ])
        .prop_map(Value::from),
        long_string().prop_map(|s| Value::from(format!("https://example.com/{s}"))),
    ]
    .boxed()
}

fn field() -> BoxedStrategy<Field> {
    prop::sample::select(vec![
        Field::CustomerId,
        Field::Items,
        Field::Sku,
        Field::Quantity,
        Field::ReplyQueueUrl,
    ])
    .boxed()
}

fn mutation() -> BoxedStrategy<Mutation> {
    prop_oneof![
        2 => field().prop_map(Mutation::Remove),
        2 => long_string().prop_map(|s| Mutation::Set(Field::CustomerId, Value::from(s))),
        2 => long_string().prop_map(|s| Mutation::Set(Field::Sku, Value::from(s))),
        2 => interesting_number().prop_map(|n| Mutation::Set(Field::Quantity, n)),
        1 => reply_url().prop_map(|u| Mutation::Set(Field::ReplyQueueUrl, u)),
        2 => (field(), arb_json()).prop_map(|(f, v)| Mutation::Set(f, v)),
        1 => (any::<bool>(), "[a-zA-Z]{1,10}", arb_json())
            .prop_map(|(in_item, name, value)| Mutation::Extra { in_item, name, value }),
        1 => prop_oneof![0usize..=3, 99usize..=102, 0usize..=150].prop_map(Mutation::ManyItems),
    ]
    .boxed()
}

/// Changes of values only, each of the right JSON type: valid orders or `validation_failed`.
fn value_mutation() -> BoxedStrategy<Mutation> {
    prop_oneof![
        long_string().prop_map(|s| Mutation::Set(Field::CustomerId, Value::from(s))),
        long_string().prop_map(|s| Mutation::Set(Field::Sku, Value::from(s))),
        prop_oneof![0u32..=3, 9_999u32..=10_001, any::<u32>()]
            .prop_map(|n| Mutation::Set(Field::Quantity, Value::from(n))),
        reply_url_string().prop_map(|u| Mutation::Set(Field::ReplyQueueUrl, u)),
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

/// Arrays in the place of the objects: `["c-1", [["SKU-1", 2]]]`, `[null]`. The README's
/// bodies are objects: these have the wrong shape.
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

fn body() -> BoxedStrategy<BodySpec> {
    let big_len = prop_oneof![
        MAX_BODY_BYTES - 1..=MAX_BODY_BYTES + 1,
        MAX_BODY_BYTES + 2..MAX_BODY_BYTES + 8192,
    ];
    let big_kind = prop::sample::select(vec![
        BigKind::PaddedOrder,
        BigKind::Garbage,
        BigKind::LongString,
    ]);
    prop_oneof![
        2 => Just(BodySpec::Empty),
        1 => "[ \t\r\n]{1,4}".prop_map(BodySpec::Whitespace),
        2 => prop::collection::vec(any::<u8>(), 0..64).prop_map(BodySpec::Bytes),
        2 => arb_json().prop_map(BodySpec::Json),
        5 => (prop::collection::vec(mutation(), 0..4), encoding())
            .prop_map(|(m, e)| BodySpec::Order(m, e)),
        5 => (0usize..3, style()).prop_map(|(i, s)| BodySpec::Pool(i, s)),
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
    ]
    .boxed()
}

/// Any request at all.
fn arbitrary_request() -> BoxedStrategy<Req> {
    (method(), path(), content_type(), key(), body())
        .prop_map(|(method, path, ct, key, body)| Req {
            method,
            path,
            ct,
            key,
            body,
        })
        .boxed()
}

/// `POST /orders`, mostly with clean headers, pooled keys and valid or mutated bodies.
fn submit_request() -> BoxedStrategy<Req> {
    let ct = prop_oneof![
        6 => prop_oneof![Just(CtSpec::Absent), Just(CtSpec::Json), Just(CtSpec::JsonCharset)],
        1 => content_type(),
    ];
    let key = prop_oneof![
        3 => Just(KeySpec::Absent),
        6 => (0usize..KEYS.len()).prop_map(KeySpec::Pool),
        1 => key(),
    ];
    let body = prop_oneof![
        4 => (0usize..3, style()).prop_map(|(i, s)| BodySpec::Pool(i, s)),
        2 => (
            prop::collection::vec(value_mutation(), 1..3),
            prop_oneof![Just(Encoding::Compact), Just(Encoding::Pretty)]
        )
            .prop_map(|(m, e)| BodySpec::Order(m, e)),
        1 => positional(),
        2 => body(),
    ];
    (ct, key, body)
        .prop_map(|(ct, key, body)| Req {
            method: Method::POST,
            path: PathSpec::Root {
                trailing: false,
                query: None,
            },
            ct,
            key,
            body,
        })
        .boxed()
}

/// `GET /orders/{id}`, the operator's actions and list.
fn operator_request() -> BoxedStrategy<Req> {
    let action_body = prop_oneof![
        3 => Just(BodySpec::Empty),
        1 => "[ \t\r\n]{1,4}".prop_map(BodySpec::Whitespace),
        1 => positional(),
        1 => body(),
    ];
    prop_oneof![
        id_seg().prop_map(|id| Req {
            method: Method::GET,
            path: PathSpec::Order {
                id,
                trailing: false,
                query: None,
            },
            ct: CtSpec::Absent,
            key: KeySpec::Absent,
            body: BodySpec::Empty,
        }),
        (id_seg(), action(), action_body).prop_map(|(id, action, body)| Req {
            method: Method::POST,
            path: PathSpec::Action {
                id,
                action,
                trailing: false,
            },
            ct: CtSpec::Absent,
            key: KeySpec::Absent,
            body,
        }),
        prop::collection::vec(param(), 0..4).prop_map(|params| Req {
            method: Method::GET,
            path: PathSpec::Root {
                trailing: false,
                query: Some(QuerySpec::Params(params)),
            },
            ct: CtSpec::Absent,
            key: KeySpec::Absent,
            body: BodySpec::Empty,
        }),
    ]
    .boxed()
}

fn request() -> BoxedStrategy<Req> {
    prop_oneof![
        4 => submit_request(),
        3 => operator_request(),
        3 => arbitrary_request(),
    ]
    .boxed()
}

// ---------------------------------------------------------------------------------------------
// Rendering a request, and what the README says its answer must be.
// ---------------------------------------------------------------------------------------------

/// What the test knows so far: the orders created, the keys used, the cursors returned.
#[derive(Default)]
struct Model {
    created: Vec<OrderId>,
    created_set: HashSet<OrderId>,
    /// Key → (the request it was first accepted with, re-serialized; the order).
    keys: HashMap<String, (Value, OrderId)>,
    cursors: Vec<String>,
}

impl Model {
    fn resolve(&self, id: &IdSeg) -> (String, ResolvedId) {
        match id {
            IdSeg::Created(i, form) => match self.created.get(i % self.created.len().max(1)) {
                Some(id) => (
                    form.render(id.as_uuid()),
                    ResolvedId::Known(*id, *form == UuidForm::Lower),
                ),
                // No order yet: a UUID no order has (v4 ids never have version 0).
                None => {
                    let u = Uuid::from_u128(0xdead_beef_0000_0000_0000_0000_0000_0000 + *i as u128);
                    (
                        form.render(u),
                        ResolvedId::Unknown(*form == UuidForm::Lower),
                    )
                }
            },
            IdSeg::Random(n, form) => {
                let u = Uuid::from_u128(*n);
                let known = self
                    .created
                    .iter()
                    .find(|c| c.as_uuid() == u)
                    .map(|c| ResolvedId::Known(*c, *form == UuidForm::Lower));
                (
                    form.render(u),
                    known.unwrap_or(ResolvedId::Unknown(*form == UuidForm::Lower)),
                )
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

/// What a path's `{orderId}` turned out to be.
#[derive(Debug, Clone, Copy)]
enum ResolvedId {
    /// An order's id; `true` if in canonical form.
    Known(OrderId, bool),
    /// A UUID no order has; `true` if in canonical form.
    Unknown(bool),
    /// Not a UUID, and a single segment.
    NotUuid,
    Unpredictable,
}

/// A single path segment that routing sees as such.
fn plain(s: &str) -> bool {
    !s.is_empty() && !s.contains(['/', '?'])
}

/// The route of a request whose answer the README pins down.
#[derive(Debug)]
enum Route {
    Submit,
    Get(ResolvedId),
    Operate(ResolvedId, bool),
    /// `Ok` for 200, or the error code of the first bad parameter; `None`: not predicted.
    List(Option<Result<(), &'static str>>),
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

fn pool_request(i: usize) -> Value {
    match i % 3 {
        0 => json!({"customerId": "c-1", "items": [{"sku": "SKU-1", "quantity": 2}]}),
        1 => json!({"customerId": "c-2", "items": [
            {"sku": "SKU-2", "quantity": 1},
            {"sku": "SKU-3", "quantity": 5}
        ]}),
        _ => json!({
            "customerId": "c-1",
            "items": [{"sku": "SKU-1", "quantity": 3}],
            "replyQueueUrl": "https://sqs.us-east-1.amazonaws.com/123456789012/sas-dev-client-shop"
        }),
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

fn styled(i: usize, style: Style) -> Vec<u8> {
    let v = pool_request(i);
    match style {
        Style::Compact => to_bytes(&v),
        Style::Pretty => serde_json::to_vec_pretty(&v).expect("a Value serializes"),
        Style::Reversed => reversed(&v).into_bytes(),
        Style::Padded => format!(" \r\n\t{v}\n ").into_bytes(),
    }
}

fn field_name(f: Field) -> &'static str {
    match f {
        Field::CustomerId => "customerId",
        Field::Items => "items",
        Field::Sku => "sku",
        Field::Quantity => "quantity",
        Field::ReplyQueueUrl => "replyQueueUrl",
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

fn render_body(spec: &BodySpec) -> Vec<u8> {
    match spec {
        BodySpec::Empty => Vec::new(),
        BodySpec::Whitespace(s) => s.clone().into_bytes(),
        BodySpec::Bytes(b) => b.clone(),
        BodySpec::Json(v) => to_bytes(v),
        BodySpec::Order(mutations, encoding) => {
            let mut v = pool_request(0);
            for m in mutations {
                mutate(&mut v, m);
            }
            let compact = to_bytes(&v);
            match encoding {
                Encoding::Compact => compact,
                Encoding::Pretty => serde_json::to_vec_pretty(&v).expect("a Value serializes"),
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
        BodySpec::Pool(i, style) => styled(*i, *style),
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
                BigKind::PaddedOrder => to_bytes(&pool_request(0)),
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
                BigKind::PaddedOrder => b' ',
                _ => b'x',
            };
            let n = len.saturating_sub(b.len() + tail.len());
            b.extend(std::iter::repeat_n(fill, n));
            b.extend_from_slice(tail);
            b
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Renders a query; with the list's expected answer if it can be told.
fn render_query(q: &QuerySpec, model: &Model) -> (String, Option<Result<(), &'static str>>) {
    match q {
        QuerySpec::Raw(s) => (s.clone(), None),
        QuerySpec::Params(params) => {
            let mut ser = url::form_urlencoded::Serializer::new(String::new());
            let mut expect: Option<Option<Result<(), &'static str>>> = None;
            let mut state = false;
            let mut decide = |e: Option<Result<(), &'static str>>| {
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
                None if state => Some(Ok(())),
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
        PathSpec::Root { trailing, query } => {
            let (path, list) = with_query(format!("/orders{}", slash(*trailing)), query);
            let route = match (m, trailing, query) {
                (_, true, _) => Route::Other,
                (&Method::POST, false, None) => Route::Submit,
                (&Method::GET, false, None) => Route::List(Some(Err("missing_state"))),
                (&Method::GET, false, Some(_)) => Route::List(list),
                (&Method::POST, false, Some(_)) => Route::Other,
                _ => Route::WrongMethod,
            };
            (path, route)
        }
        PathSpec::Order {
            id,
            trailing,
            query,
        } => {
            let (seg, resolved) = model.resolve(id);
            let (path, _) = with_query(format!("/orders/{seg}{}", slash(*trailing)), query);
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
            let path = format!("/orders/{seg}/{action}{}", slash(*trailing));
            let route = if *trailing || !plain(&seg) || !plain(action) {
                Route::Other
            } else if !ACTIONS.contains(&action.as_str()) {
                Route::Unrouted
            } else if *m == Method::POST {
                Route::Operate(resolved, action_body_ok(&body))
            } else {
                Route::WrongMethod
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
                    Seg::Orders => "orders".to_owned(),
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
            let route = match (leading_slash, parts.first()) {
                (true, Some(first)) if plain(first) && first != "orders" => Route::Unrouted,
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

/// An operator action's body the README accepts: none, or `{"reason": string|null}` with a
/// reason of at most 500 characters.
fn action_body_ok(body: &[u8]) -> bool {
    action_body_error(body).is_none()
}

/// The error code the README gives for an operator action's body, if it is refused.
fn action_body_error(body: &[u8]) -> Option<&'static str> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return None;
    }
    match serde_json::from_slice::<Value>(body) {
        Err(_) => Some("invalid_json"),
        Ok(Value::Object(m)) => {
            if !m
                .iter()
                .all(|(k, v)| k == "reason" && (v.is_string() || v.is_null()))
            {
                Some("invalid_request")
            } else if m
                .get("reason")
                .and_then(Value::as_str)
                .is_some_and(|r| r.chars().count() > submission::MAX_REASON_CHARS)
            {
                Some("validation_failed")
            } else {
                None
            }
        }
        Ok(_) => Some("invalid_request"),
    }
}

/// The idempotency key as the README defines a valid one; `Err` if present and invalid.
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

/// Everything the handler may change: the records, the messages queued, the events published.
#[derive(PartialEq)]
struct Snapshot {
    records: HashMap<OrderId, StateRecord>,
    queued: Vec<(String, usize)>,
    events: usize,
}

fn snapshot(system: &System) -> Snapshot {
    let (store, queues, bus) = system.memory.as_ref().expect("the memory backend");
    let r = &system.resources;
    let mut urls = vec![
        r.work_queue_url.clone(),
        r.reply_queue_url.clone(),
        r.timer_queue_url.clone(),
        r.dead_letter_url.clone(),
    ];
    urls.extend(r.agent_queue_urls.values().cloned());
    urls.sort();
    Snapshot {
        records: store
            .all_states()
            .into_iter()
            .map(|r| (r.order_id, r))
            .collect(),
        queued: urls
            .into_iter()
            .map(|u| {
                let d = queues.depth(&u);
                (u, d.visible + d.invisible)
            })
            .collect(),
        events: bus.published().len(),
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

fn order_id(json: &Value) -> Option<OrderId> {
    json["orderId"].as_str().and_then(|s| s.parse().ok())
}

fn code_of(json: &Value) -> &str {
    json["error"]["code"].as_str().unwrap_or_default()
}

/// Sends one request and checks the answer and the store against the model.
async fn step(system: &System, model: &mut Model, req: &Req) -> Result<(), TestCaseError> {
    let r = render(req, model);
    let before = snapshot(system);
    let resp =
        submission::handle(&system.submission, &r.method, &r.path, &r.headers, &r.body).await;
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
    if status.is_client_error() {
        prop_assert!(
            json["error"]["code"]
                .as_str()
                .is_some_and(|c| !c.is_empty()),
            "no error.code: {ctx}"
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
        matches!(status, StatusCode::OK | StatusCode::ACCEPTED) || !status.is_success(),
        "an undocumented 2xx: {ctx}"
    );
    let code = code_of(&json);

    // What the answer did, and the model updated with it.
    let after = snapshot(system);
    let threshold = system.submission.policy.failure_threshold;
    let mut created_now = None;
    let mut operated = None;
    if status == StatusCode::ACCEPTED {
        let id: Option<OrderId> = json["orderId"].as_str().and_then(|s| s.parse().ok());
        let Some(id) = id else {
            return Err(TestCaseError::fail(format!(
                "202 without an orderId: {ctx}"
            )));
        };
        prop_assert!(
            json["processState"].is_string(),
            "202 without processState: {ctx}"
        );
        if resp.headers().get("idempotent-replayed").is_some() {
            prop_assert!(
                model.created_set.contains(&id),
                "a replay of no order: {ctx}"
            );
        } else if json.get("customerId").is_some() {
            prop_assert!(
                model.created_set.contains(&id),
                "an action on no order: {ctx}"
            );
            operated = Some(id);
        } else {
            prop_assert_eq!(&r.method, &Method::POST, "created by a non-POST: {}", ctx);
            prop_assert!(
                !model.created_set.contains(&id),
                "a new order reuses an id: {ctx}"
            );
            prop_assert_eq!(json["processState"].as_str(), Some("Pending"), "{}", ctx);
            model.created.push(id);
            model.created_set.insert(id);
            created_now = Some(id);
        }
    }
    if status == StatusCode::OK {
        if let Some(orders) = json.get("orders") {
            let orders = orders.as_array();
            prop_assert!(orders.is_some(), "orders is not an array: {ctx}");
            let next = &json["nextCursor"];
            prop_assert!(next.is_null() || next.is_string(), "nextCursor: {ctx}");
            if let Some(c) = next.as_str() {
                model.cursors.push(c.to_owned());
            }
            for o in orders.into_iter().flatten() {
                let id: Option<OrderId> = o["orderId"].as_str().and_then(|s| s.parse().ok());
                let Some(id) = id else {
                    return Err(TestCaseError::fail(format!(
                        "a listed order without id: {ctx}"
                    )));
                };
                let stored = after.records.get(&id).map(|r| r.process_state.as_str());
                prop_assert_eq!(o["processState"].as_str(), stored, "listed state: {}", ctx);
            }
        } else {
            let id: Option<OrderId> = json["orderId"].as_str().and_then(|s| s.parse().ok());
            let Some(id) = id else {
                return Err(TestCaseError::fail(format!(
                    "a 200 that is neither list nor order: {ctx}"
                )));
            };
            let stored = after.records.get(&id).map(|r| r.process_state.as_str());
            prop_assert_eq!(
                json["processState"].as_str(),
                stored,
                "order's state: {}",
                ctx
            );
        }
    }

    // Idempotency, whatever the path that got there: a key names one request and one order.
    if r.method == Method::POST && operated.is_none() {
        let request = order_request(&r.body);
        if let (Ok(Some(k)), Some(c)) = (key_of(&r.headers), request.as_ref().map(canonical_form)) {
            match (status, model.keys.get(&k).cloned()) {
                (StatusCode::ACCEPTED, None) => {
                    prop_assert!(
                        created_now.is_some(),
                        "a replay of a key never accepted: {ctx}"
                    );
                    if let Some(id) = created_now {
                        model.keys.insert(k, (c, id));
                    }
                }
                (StatusCode::ACCEPTED, Some((first, id))) => {
                    prop_assert!(
                        created_now.is_none(),
                        "a used key created a second order: {ctx}"
                    );
                    prop_assert!(
                        first == c,
                        "a key reused with another request got 202: {ctx}"
                    );
                    prop_assert_eq!(
                        order_id(&json),
                        Some(id),
                        "a replay names another order: {}",
                        ctx
                    );
                }
                (StatusCode::CONFLICT, first) if code == "idempotency_key_reused" => {
                    prop_assert!(
                        first.is_some_and(|(f, _)| f != c),
                        "409 without a different earlier request under this key: {ctx}"
                    );
                }
                _ => {}
            }
        }
    }

    // Nothing partial: records, queues and events.
    match (created_now, operated) {
        (Some(id), _) => {
            let mut rest = after.records.clone();
            let new = rest.remove(&id);
            prop_assert!(new.is_some(), "a 202 order without its record: {ctx}");
            prop_assert!(
                rest == before.records,
                "a creation changed other records: {ctx}"
            );
            let url = &system.resources.work_queue_url;
            prop_assert!(
                queued(&after, url) > queued(&before, url),
                "a new order without its work message: {ctx}"
            );
        }
        (None, Some(id)) => {
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
        }
        (None, None) => {
            prop_assert!(
                after == before,
                "an answer that is no 202 ({status}) changed records, queues or events: {ctx}"
            );
        }
    }
    let (store, _, _) = system.memory.as_ref().expect("the memory backend");
    prop_assert_eq!(
        after.records.len(),
        model.created.len(),
        "record count: {}",
        ctx
    );
    for (id, rec) in &after.records {
        prop_assert!(
            model.created_set.contains(id),
            "a record of no known order: {ctx}"
        );
        if let Err(e) = rec.check(threshold) {
            return Err(TestCaseError::fail(format!(
                "record {id} breaks {e:?}: {ctx}"
            )));
        }
    }
    for id in &model.created {
        let found = store.get(*id).await.expect("the memory store answers");
        prop_assert!(
            found.is_some(),
            "order {id} without its order or record: {ctx}"
        );
    }

    // What the README pins down for this route.
    match &r.route {
        Route::Submit => check_submit(model, &r, status, &json, created_now, &ctx)?,
        Route::Get(ResolvedId::Known(id, canonical)) => {
            if !canonical && status == StatusCode::BAD_REQUEST {
                prop_assert_eq!(code, "invalid_order_id", "{}", ctx);
            } else {
                prop_assert_eq!(status, StatusCode::OK, "{}", ctx);
                prop_assert_eq!(order_id(&json), Some(*id), "{}", ctx);
            }
        }
        Route::Get(ResolvedId::Unknown(canonical))
        | Route::Operate(ResolvedId::Unknown(canonical), true) => {
            if !canonical && status == StatusCode::BAD_REQUEST {
                prop_assert_eq!(code, "invalid_order_id", "{}", ctx);
            } else {
                prop_assert_eq!(status, StatusCode::NOT_FOUND, "{}", ctx);
                prop_assert_eq!(code, "order_not_found", "{}", ctx);
            }
        }
        Route::Get(ResolvedId::NotUuid) | Route::Operate(ResolvedId::NotUuid, true) => {
            prop_assert_eq!(status, StatusCode::BAD_REQUEST, "{}", ctx);
            prop_assert_eq!(code, "invalid_order_id", "{}", ctx);
        }
        Route::Operate(ResolvedId::Known(id, canonical), body_ok) => {
            if !canonical && status == StatusCode::BAD_REQUEST && code == "invalid_order_id" {
                // A non-canonical spelling may be refused.
            } else if *body_ok {
                prop_assert!(
                    status == StatusCode::ACCEPTED || status == StatusCode::CONFLICT,
                    "an action on an order is 202 or 409: {ctx}"
                );
                if status == StatusCode::ACCEPTED {
                    prop_assert_eq!(operated, Some(*id), "{}", ctx);
                } else {
                    prop_assert_eq!(code, "conflict", "{}", ctx);
                    prop_assert!(
                        json["processState"].is_string(),
                        "409 without processState: {ctx}"
                    );
                }
            } else {
                prop_assert_eq!(status, StatusCode::BAD_REQUEST, "{}", ctx);
                prop_assert_eq!(Some(code), action_body_error(&r.body), "{}", ctx);
            }
        }
        Route::List(Some(Ok(()))) => {
            prop_assert_eq!(status, StatusCode::OK, "{}", ctx);
            prop_assert!(json["orders"].is_array(), "{ctx}");
        }
        Route::List(Some(Err(expected))) => {
            prop_assert_eq!(status, StatusCode::BAD_REQUEST, "{}", ctx);
            prop_assert_eq!(code, *expected, "{}", ctx);
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
        | Route::Operate(..)
        | Route::List(None)
        | Route::Other => {}
    }
    Ok(())
}

/// The body as an order request (before validation), if it is one.
/// The README's order body is a JSON object: serde would also take a struct from an array.
fn order_request(body: &[u8]) -> Option<OrderRequest> {
    if body.len() > MAX_BODY_BYTES
        || !serde_json::from_slice::<Value>(body).is_ok_and(|v| v.is_object())
    {
        return None;
    }
    serde_json::from_slice(body).ok()
}

/// A request re-serialized: equal for bodies that differ only in whitespace or key order.
fn canonical_form(request: &OrderRequest) -> Value {
    serde_json::to_value(request).expect("a request serializes")
}

/// `POST /orders`: the body's error codes, 413, the key's rules and idempotent replays.
fn check_submit(
    model: &Model,
    r: &Rendered,
    status: StatusCode,
    json: &Value,
    created_now: Option<OrderId>,
    ctx: &str,
) -> Result<(), TestCaseError> {
    let code = code_of(json);
    let key = key_of(&r.headers);
    let over = r.body.len() > MAX_BODY_BYTES;
    let request = order_request(&r.body);
    let canonical = request.as_ref().map(canonical_form);
    let valid = request.as_ref().is_some_and(|q| q.parse().is_ok());
    if status == StatusCode::ACCEPTED {
        prop_assert!(
            valid,
            "accepted a body that is no valid order request (a JSON object): {ctx}"
        );
    }
    if over {
        if key.is_ok() {
            prop_assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{}", ctx);
            prop_assert_eq!(code, "payload_too_large", "{}", ctx);
        }
        return Ok(());
    }
    // The checks in the handler's order: size, media type, key, body.
    if !json_content_type(&r.headers) {
        prop_assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{}", ctx);
        prop_assert_eq!(code, "unsupported_media_type", "{}", ctx);
        return Ok(());
    }
    match (&key, &canonical, valid) {
        (Err(()), Some(_), true) => {
            prop_assert_eq!(status, StatusCode::BAD_REQUEST, "{}", ctx);
            prop_assert_eq!(code, "invalid_idempotency_key", "{}", ctx);
        }
        (Ok(None), _, true) => {
            prop_assert!(
                created_now.is_some(),
                "a valid order without a key must be created: {ctx}"
            );
        }
        (Ok(Some(_)), Some(_), true) if created_now.is_some() => {}
        (Ok(Some(k)), Some(c), true) => match model.keys.get(k) {
            Some((first, _)) if first == c => {
                prop_assert_eq!(
                    status,
                    StatusCode::ACCEPTED,
                    "a same-request replay: {}",
                    ctx
                );
            }
            Some(_) => {
                prop_assert_eq!(status, StatusCode::CONFLICT, "a key reused: {}", ctx);
            }
            None => {
                return Err(TestCaseError::fail(format!(
                    "a valid order under a new key must be created: {ctx}"
                )));
            }
        },
        (Ok(_), None, _) => {
            prop_assert_eq!(status, StatusCode::BAD_REQUEST, "{}", ctx);
            if serde_json::from_slice::<Value>(&r.body).is_ok() {
                prop_assert_eq!(code, "invalid_request", "JSON of the wrong shape: {}", ctx);
            } else {
                prop_assert_eq!(code, "invalid_json", "not JSON: {}", ctx);
            }
        }
        (Ok(_), Some(_), false) => {
            prop_assert_eq!(status, StatusCode::BAD_REQUEST, "{}", ctx);
            prop_assert_eq!(code, "validation_failed", "{}", ctx);
        }
        _ => {}
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

async fn new_system() -> System {
    System::new(Backend::Memory, Settings::default(), Arc::new(SystemClock))
        .await
        .expect("an in-memory system builds")
}

fn submit(key: Option<usize>, body: usize) -> Req {
    Req {
        method: Method::POST,
        path: PathSpec::Root {
            trailing: false,
            query: None,
        },
        ct: CtSpec::Json,
        key: key.map_or(KeySpec::Absent, KeySpec::Pool),
        body: BodySpec::Pool(body, Style::Compact),
    }
}

/// Two orders (one under `key-0`) and a list cursor, made through the handler.
async fn seed(system: &System, model: &mut Model) -> Result<(), TestCaseError> {
    step(system, model, &submit(Some(0), 0)).await?;
    step(system, model, &submit(None, 1)).await?;
    let list = Req {
        method: Method::GET,
        path: PathSpec::Root {
            trailing: false,
            query: Some(QuerySpec::Params(vec![
                Param::State("Pending".into()),
                Param::Limit("1".into()),
            ])),
        },
        ct: CtSpec::Absent,
        key: KeySpec::Absent,
        body: BodySpec::Empty,
    };
    step(system, model, &list).await?;
    prop_assert_eq!(model.created.len(), 2);
    prop_assert_eq!(
        model.cursors.len(),
        1,
        "a page of 1 of 2 orders has a next cursor"
    );
    Ok(())
}

#[test]
fn any_single_request_answers_2xx_or_4xx_json_and_writes_nothing_partial() {
    let rt = runtime();
    let mut runner = TestRunner::new(config(1024));
    let result = runner.run(&request(), |req| {
        rt.block_on(async {
            let system = new_system().await;
            let mut model = Model::default();
            seed(&system, &mut model).await?;
            step(&system, &mut model, &req).await
        })
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

#[test]
fn request_sequences_keep_the_store_whole_and_replays_idempotent() {
    let rt = runtime();
    let mut runner = TestRunner::new(config(256));
    let result = runner.run(&prop::collection::vec(request(), 1..20), |reqs| {
        rt.block_on(async {
            let system = new_system().await;
            let mut model = Model::default();
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
