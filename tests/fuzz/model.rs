//! The model: what the test knows so far (tasks, keys, cursors, definitions), against which
//! each answer is checked.

use super::*;

/// What the test knows so far: the tasks created, the keys used, the cursors returned, and the
/// definitions published.
pub(crate) struct Model {
    pub(crate) created: Vec<TaskId>,
    pub(crate) created_set: HashSet<TaskId>,
    /// Key → (the request it was first accepted with; the task).
    pub(crate) keys: HashMap<String, (Value, TaskId)>,
    pub(crate) cursors: Vec<String>,
    /// Every version of every definition, as stored (normalized).
    pub(crate) catalog: BTreeMap<(Kind, String), Vec<Value>>,
    /// The deployment's policy, under every workflow (what validation uses).
    pub(crate) policy: sas::Policy,
}

impl Model {
    pub(crate) fn new(policy: sas::Policy) -> Self {
        let mut catalog = BTreeMap::new();
        for s in examples::services() {
            let body = serde_json::to_value(&s).expect("a service serializes");
            catalog.insert((Kind::Service, s.name.clone()), vec![body]);
        }
        for text in [
            examples::ECOMMERCE_ORDER,
            examples::LOAN_APPLICATION,
            examples::ORDER_TRIAGE,
        ] {
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

    pub(crate) fn latest(&self, kind: Kind, name: &str) -> Option<(u32, &Value)> {
        self.catalog
            .get(&(kind, name.to_owned()))
            .and_then(|v| v.last().map(|b| (v.len() as u32, b)))
    }

    pub(crate) fn services(&self) -> BTreeSet<String> {
        self.catalog
            .keys()
            .filter(|(k, _)| *k == Kind::Service)
            .map(|(_, n)| n.clone())
            .collect()
    }

    /// The newest version of workflow `name`, compiled: the oracle for its inputs.
    pub(crate) fn workflow(&self, name: &str) -> Option<(u32, Workflow)> {
        let (v, body) = self.latest(Kind::Workflow, name)?;
        let w = Workflow::from_value(body.clone(), None, &self.policy)
            .expect("a published workflow compiles");
        Some((v, w))
    }

    pub(crate) fn resolve(&self, id: &IdSeg) -> (String, ResolvedId) {
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

pub(crate) fn name_of(seg: &NameSeg, pool: &[&str]) -> String {
    match seg {
        NameSeg::Pool(i) => pool[i % pool.len()].to_owned(),
        NameSeg::Junk(s) => s.clone(),
    }
}

/// What a path's `{taskId}` turned out to be.
#[derive(Debug, Clone, Copy)]
pub(crate) enum ResolvedId {
    /// A task's id (in any spelling the UUID parser takes).
    Known(TaskId),
    /// A UUID no task has.
    Unknown,
    /// Not a UUID, and a single segment.
    NotUuid,
    Unpredictable,
}

/// A single path segment that routing sees as such.
pub(crate) fn plain(s: &str) -> bool {
    !s.is_empty() && !s.contains(['/', '?'])
}
