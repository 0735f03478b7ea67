//! Request bodies, above all task inputs: valid ones of both example workflows written in
//! equivalent ways, mutated ones (fields removed or set to other values, extra fields, many
//! items), re-encoded or broken bytes, huge bodies; `POST /workflows/{name}/tasks` requests
//! ([`submit_request`]) and the answer a submission must get ([`expect_submit`]).

use super::*;

#[derive(Debug, Clone, Copy)]
pub(crate) enum Field {
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
pub(crate) enum Mutation {
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
pub(crate) enum Encoding {
    Compact,
    Pretty,
    Truncate(usize),
    Insert(usize, u8),
    Twice,
}

/// A valid input, written in one of several equivalent ways.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Style {
    Compact,
    Pretty,
    Reversed,
    Padded,
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum BigKind {
    /// A valid order padded with spaces.
    PaddedInput,
    Garbage,
    /// `{"customerId": "xxx…", …}`
    LongString,
}

#[derive(Debug, Clone)]
pub(crate) enum BodySpec {
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

/// Arbitrary JSON values, nested.
pub(crate) fn arb_json() -> BoxedStrategy<Value> {
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

pub(crate) fn interesting_number() -> BoxedStrategy<Value> {
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

pub(crate) fn field() -> BoxedStrategy<Field> {
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

pub(crate) fn currency() -> BoxedStrategy<Value> {
    prop_oneof![
        prop::sample::select(vec!["EUR", "USD", "eur", "EURO", "", "€€€"]).prop_map(Value::from),
        "[A-Z]{3}".prop_map(Value::from),
    ]
    .boxed()
}

pub(crate) fn mutation() -> BoxedStrategy<Mutation> {
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
pub(crate) fn value_mutation() -> BoxedStrategy<Mutation> {
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

pub(crate) fn encoding() -> BoxedStrategy<Encoding> {
    prop_oneof![
        6 => Just(Encoding::Compact),
        2 => Just(Encoding::Pretty),
        1 => any::<usize>().prop_map(Encoding::Truncate),
        1 => (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Encoding::Insert(i, b)),
        1 => Just(Encoding::Twice),
    ]
    .boxed()
}

pub(crate) fn style() -> BoxedStrategy<Style> {
    prop::sample::select(vec![
        Style::Compact,
        Style::Pretty,
        Style::Reversed,
        Style::Padded,
    ])
    .boxed()
}

/// Arrays in the place of the objects: `["c-1", [["SKU-1", 2]]]`, `[null]`.
pub(crate) fn positional() -> BoxedStrategy<BodySpec> {
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

pub(crate) fn body() -> BoxedStrategy<BodySpec> {
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

/// `POST /workflows/{name}/tasks`, mostly with clean headers, pooled keys and valid or
/// mutated inputs.
pub(crate) fn submit_request() -> BoxedStrategy<Req> {
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

/// The number of inputs in [`pool_input`].
pub(crate) const INPUTS: usize = 8;

/// Valid inputs: orders, loans, and `fuzz-a`'s.
pub(crate) fn pool_input(i: usize) -> Value {
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

pub(crate) fn to_bytes(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).expect("a Value serializes")
}

/// An object with its keys written in reverse order (the same request).
pub(crate) fn reversed(v: &Value) -> String {
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

pub(crate) fn styled(v: &Value, style: Style) -> Vec<u8> {
    match style {
        Style::Compact => to_bytes(v),
        Style::Pretty => serde_json::to_vec_pretty(v).expect("a Value serializes"),
        Style::Reversed => reversed(v).into_bytes(),
        Style::Padded => format!(" \r\n\t{v}\n ").into_bytes(),
    }
}

pub(crate) fn encode(v: &Value, encoding: &Encoding) -> Vec<u8> {
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

pub(crate) fn field_name(f: Field) -> &'static str {
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

/// The first element of `top[key]`, if that is still an array of objects.
pub(crate) fn first_object<'a>(
    top: &'a mut serde_json::Map<String, Value>,
    key: &str,
) -> Option<&'a mut serde_json::Map<String, Value>> {
    top.get_mut(key)
        .and_then(Value::as_array_mut)
        .and_then(|a| a.first_mut())
        .and_then(Value::as_object_mut)
}

/// The first line item, if `items` is still an array of objects.
pub(crate) fn first_item(
    top: &mut serde_json::Map<String, Value>,
) -> Option<&mut serde_json::Map<String, Value>> {
    first_object(top, "items")
}

pub(crate) fn mutate(v: &mut Value, m: &Mutation) {
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

pub(crate) fn render_body(spec: &BodySpec) -> Vec<u8> {
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

/// `POST /workflows/{name}/tasks`: the checks in the handler's order.
pub(crate) fn expect_submit(model: &Model, name: &str, r: &Rendered) -> (Want, Option<Value>) {
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
