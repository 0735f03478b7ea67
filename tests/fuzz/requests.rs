//! What an HTTP request is made of, kept symbolic so that a failure shrinks and prints
//! readably: methods; paths with junk, UUIDs in every spelling and the ids of tasks made earlier;
//! query strings, content types, idempotency keys, reply queue URLs; and the strategies that
//! draw them ([`request`], [`arbitrary_request`]).

use super::*;

/// How a UUID is spelled in a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UuidForm {
    Lower,
    Upper,
    Simple,
    Braced,
    Urn,
}

impl UuidForm {
    pub(crate) fn render(self, u: Uuid) -> String {
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
pub(crate) enum IdSeg {
    /// A task created earlier in the case (by index; a never-used UUID if none yet).
    Created(usize, UuidForm),
    /// Any UUID (almost surely no task's).
    Random(u128, UuidForm),
    Junk(String),
}

/// A workflow's or a service's `{name}` in a path.
#[derive(Debug, Clone)]
pub(crate) enum NameSeg {
    /// One of [`WORKFLOWS`] or [`SERVICES`], by index.
    Pool(usize),
    Junk(String),
}

/// A segment of a free-form path.
#[derive(Debug, Clone)]
pub(crate) enum Seg {
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
pub(crate) enum CursorSpec {
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
pub(crate) enum Param {
    State(String),
    Workflow(String),
    Limit(String),
    Cursor(CursorSpec),
    /// A name that is none of `state`, `workflow`, `limit`, `cursor`.
    Unknown(String, String),
}

#[derive(Debug, Clone)]
pub(crate) enum QuerySpec {
    /// Encoded with `application/x-www-form-urlencoded`, so each value arrives as generated.
    Params(Vec<Param>),
    /// Sent as is.
    Raw(String),
}

#[derive(Debug, Clone)]
pub(crate) enum PathSpec {
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
pub(crate) enum CtSpec {
    Absent,
    Json,
    JsonCharset,
    Other(&'static str),
    /// Arbitrary bytes; no header if they are not a valid header value.
    Raw(Vec<u8>),
}

#[derive(Debug, Clone)]
pub(crate) enum KeySpec {
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
pub(crate) enum ReplySpec {
    Absent,
    Value(String),
    Raw(Vec<u8>),
}

#[derive(Debug, Clone)]
pub(crate) struct Req {
    pub(crate) method: Method,
    pub(crate) path: PathSpec,
    pub(crate) ct: CtSpec,
    pub(crate) key: KeySpec,
    pub(crate) reply: ReplySpec,
    pub(crate) body: BodySpec,
}

pub(crate) const KEYS: [&str; 3] = ["key-0", "key-1", "key-2"];

/// Workflow names: the examples, one a case may publish, one never published.
pub(crate) const WORKFLOWS: [&str; 4] = [ECOMMERCE, LOAN, "fuzz-a", "gift-card"];

pub(crate) fn method() -> BoxedStrategy<Method> {
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

pub(crate) fn uuid_form() -> BoxedStrategy<UuidForm> {
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
pub(crate) fn junk() -> BoxedStrategy<String> {
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

pub(crate) fn id_seg() -> BoxedStrategy<IdSeg> {
    prop_oneof![
        5 => (0usize..8, uuid_form()).prop_map(|(i, f)| IdSeg::Created(i, f)),
        2 => (any::<u128>(), uuid_form()).prop_map(|(n, f)| IdSeg::Random(n, f)),
        2 => junk().prop_map(IdSeg::Junk),
    ]
    .boxed()
}

pub(crate) fn name_seg() -> BoxedStrategy<NameSeg> {
    prop_oneof![
        6 => (0usize..4).prop_map(NameSeg::Pool),
        1 => junk().prop_map(NameSeg::Junk),
    ]
    .boxed()
}

pub(crate) fn cursor() -> BoxedStrategy<CursorSpec> {
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

pub(crate) fn state_value() -> BoxedStrategy<String> {
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

pub(crate) fn limit_value() -> BoxedStrategy<String> {
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

pub(crate) fn param() -> BoxedStrategy<Param> {
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

pub(crate) fn query() -> BoxedStrategy<QuerySpec> {
    prop_oneof![
        5 => prop::collection::vec(param(), 0..4).prop_map(QuerySpec::Params),
        1 => prop_oneof![".{0,20}", "([a-z]{0,5}=[%&=#+a-z0-9]{0,5}&?){0,4}"].prop_map(QuerySpec::Raw),
    ]
    .boxed()
}

pub(crate) fn version_seg() -> BoxedStrategy<String> {
    prop_oneof![
        4 => (0u32..5).prop_map(|v| v.to_string()),
        1 => prop_oneof![Just("+1"), Just("01"), Just("-1"), Just("x"), Just(""), Just("4294967296")]
            .prop_map(str::to_owned),
        1 => junk(),
    ]
    .boxed()
}

pub(crate) fn seg() -> BoxedStrategy<Seg> {
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

pub(crate) fn path() -> BoxedStrategy<PathSpec> {
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

pub(crate) fn content_type() -> BoxedStrategy<CtSpec> {
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

pub(crate) fn key() -> BoxedStrategy<KeySpec> {
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
pub(crate) fn long_string() -> BoxedStrategy<String> {
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

pub(crate) fn reply() -> BoxedStrategy<ReplySpec> {
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

/// Any request at all.
pub(crate) fn arbitrary_request() -> BoxedStrategy<Req> {
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

pub(crate) fn clean_ct() -> BoxedStrategy<CtSpec> {
    prop_oneof![
        6 => prop_oneof![Just(CtSpec::Absent), Just(CtSpec::Json), Just(CtSpec::JsonCharset)],
        1 => content_type(),
    ]
    .boxed()
}

pub(crate) fn request() -> BoxedStrategy<Req> {
    prop_oneof![
        4 => submit_request(),
        3 => operator_request(),
        2 => catalog_request(),
        3 => arbitrary_request(),
    ]
    .boxed()
}
