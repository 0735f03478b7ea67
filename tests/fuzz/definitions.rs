//! Workflow and service definitions, valid and broken (`PUT /workflows/{name}`,
//! `PUT /services/{name}`), the definitions' routes ([`catalog_request`]), the answer a
//! publication must get ([`expect_publish`]), and a workflow published over HTTP while tasks
//! of its earlier version run.

use super::*;

/// `workflows` or `services`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DefKind {
    Workflows,
    Services,
}

impl DefKind {
    pub(crate) fn kind(self) -> Kind {
        match self {
            Self::Workflows => Kind::Workflow,
            Self::Services => Kind::Service,
        }
    }
    pub(crate) fn segment(self) -> &'static str {
        match self {
            Self::Workflows => "workflows",
            Self::Services => "services",
        }
    }
}

/// A workflow definition to start from.
#[derive(Debug, Clone, Copy)]
pub(crate) enum WfBase {
    Ecommerce,
    Loan,
    /// A small workflow of its own, `fuzz-a`, with an input schema `{x: integer >= 0}`.
    FuzzA,
}

/// A change to a workflow definition (most make it invalid).
#[derive(Debug, Clone)]
pub(crate) enum DefMutation {
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
pub(crate) enum TargetSpec {
    Simulated,
    Http(String),
    Junk(Value),
}

#[derive(Debug, Clone)]
pub(crate) enum DefSpec {
    Workflow(WfBase, Vec<DefMutation>),
    Service {
        name: usize,
        description: Option<usize>,
        target: TargetSpec,
        extra: Option<(String, Value)>,
    },
}

/// Service names: two examples, one a case may publish, one that is no valid name.
pub(crate) const SERVICES: [&str; 4] = ["inventory", "payment", "fuzz-svc", "Bad Name"];

pub(crate) const DESCRIPTIONS: [&str; 3] = ["first", "second", "a third one"];

pub(crate) fn def_kind() -> BoxedStrategy<DefKind> {
    prop_oneof![Just(DefKind::Workflows), Just(DefKind::Services)].boxed()
}

pub(crate) fn def_mutation() -> BoxedStrategy<DefMutation> {
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

pub(crate) fn target() -> BoxedStrategy<TargetSpec> {
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

pub(crate) fn definition() -> BoxedStrategy<DefSpec> {
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

/// The definitions' routes: reads, and `PUT`s of valid and broken definitions.
pub(crate) fn catalog_request() -> BoxedStrategy<Req> {
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
            at_definition(
                Method::PUT,
                (kind, name, None),
                ct,
                BodySpec::Definition(def, encoding),
            )
        });
    let put_junk =
        (def_kind(), name_seg(), clean_ct(), body()).prop_map(|(kind, name, ct, body)| {
            at_definition(Method::PUT, (kind, name, None), ct, body)
        });
    prop_oneof![
        5 => put,
        1 => put_junk,
        2 => (def_kind(), name_seg(), prop::option::weighted(0.4, version_seg())).prop_map(
            |at| at_definition(Method::GET, at, CtSpec::Absent, BodySpec::Empty)
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

/// A request with no key and no reply header to a definition's route (`kind`, `name`, `version`;
/// no trailing slash).
fn at_definition(
    method: Method,
    (kind, name, version): (DefKind, NameSeg, Option<String>),
    ct: CtSpec,
    body: BodySpec,
) -> Req {
    Req {
        method,
        path: PathSpec::Definition {
            kind,
            name,
            version,
            trailing: false,
        },
        ct,
        key: KeySpec::Absent,
        reply: ReplySpec::Absent,
        body,
    }
}

/// `fuzz-a`: one step on `inventory`, with an undo.
pub(crate) fn fuzz_a() -> Value {
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

pub(crate) fn example_value(text: &str) -> Value {
    workflow::parse_value(text, workflow::Format::Yaml).expect("an example parses")
}

pub(crate) fn def_mutate(v: &mut Value, m: &DefMutation) {
    let Some(top) = v.as_object_mut() else {
        return;
    };
    fn step0(
        top: &mut serde_json::Map<String, Value>,
    ) -> Option<&mut serde_json::Map<String, Value>> {
        first_object(top, "steps")
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

pub(crate) fn render_definition(d: &DefSpec) -> Value {
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

/// `PUT /workflows/{name}`, `PUT /services/{name}`: the checks in the handler's order, and
/// the body as it would be stored.
pub(crate) fn expect_publish(
    model: &Model,
    kind: Kind,
    name: &str,
    r: &Rendered,
) -> (Want, Option<Value>) {
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
        Kind::Schedule => unreachable!("the fuzzer publishes workflows and services only"),
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

#[test]
fn a_workflow_published_over_http_takes_new_tasks_and_the_running_ones_keep_their_version() {
    let rt = runtime();
    rt.block_on(async {
        let (system, mut model) = new_system().await;
        let put = |d: DefSpec| {
            at_definition(
                Method::PUT,
                (DefKind::Workflows, NameSeg::Pool(2), None),
                CtSpec::Json,
                BodySpec::Definition(d, Encoding::Compact),
            )
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
        for (request, want) in [
            (submit(2, Some(1), 6), "202"),
            (submit(2, Some(1), 6), "replay"),
            (submit(2, Some(1), 7), "409"),
            (submit(0, Some(1), 0), "409"),
        ] {
            step(&system, &mut model, &request).await.expect(want);
        }
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
