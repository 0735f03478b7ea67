//! Search keys: the business values a workflow declares to find its tasks by, each a query on
//! the task's input (`keys: {customerId: $.input.customerId}`). They are read once, when the
//! task starts, and kept with the task: a task is found by `name:value` (`customerId:c-77`)
//! whatever its state, across workflows that declare the same name.
//!
//! A workflow declares at most [`MAX_SEARCH_KEYS`]; each takes a **slot**, its name's place
//! among the workflow's key names in sorted order. A store indexes each slot on its own (in
//! DynamoDB a sparse index per slot, written with the task's item), so a search reads every
//! slot: a key's name need not take the same slot in every workflow.

use super::mapping::{Mapping, MappingScope};
use super::problem::{InputError, Problem};
use super::validation::ValidationError;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// The most search keys a workflow declares (and a store's key slots).
pub const MAX_SEARCH_KEYS: usize = 3;
/// The longest key value kept (UTF-8 bytes): an input's longer value refuses the task.
pub const MAX_KEY_VALUE_BYTES: usize = 256;
/// The longest key name.
pub const MAX_KEY_NAME_CHARS: usize = 64;

/// One search key's value: what a task is found by.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SearchKey {
    pub name: String,
    pub value: String,
}

/// Why a key name is not one: `None` if it is (a letter, then letters, digits and `_`, at
/// most [`MAX_KEY_NAME_CHARS`]).
pub fn name_problem(name: &str) -> Option<String> {
    let mut chars = name.chars();
    let ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && name.chars().count() <= MAX_KEY_NAME_CHARS;
    (!ok).then(|| {
        format!(
            "{name:?} is not a key name: a letter, then letters, digits and `_`, at most {MAX_KEY_NAME_CHARS}"
        )
    })
}

impl SearchKey {
    /// A key as a search names it: `name:value` (`customerId:c-77`; the value is everything
    /// after the first `:`). `field` names the request's field in the error.
    pub fn parse(text: &str, field: &str) -> Result<Self, ValidationError> {
        let Some((name, value)) = text.split_once(':') else {
            return Err(ValidationError::new(
                field,
                format!("{text:?} must be name:value, as in customerId:c-77"),
            ));
        };
        if let Some(problem) = name_problem(name) {
            return Err(ValidationError::new(field, problem));
        }
        if value.is_empty() || value.len() > MAX_KEY_VALUE_BYTES {
            return Err(ValidationError::new(
                field,
                format!("the value of {name} must be 1 to {MAX_KEY_VALUE_BYTES} bytes"),
            ));
        }
        Ok(Self {
            name: name.to_owned(),
            value: value.to_owned(),
        })
    }

    /// The key as an index holds it: `name#value` (a name has no `#`, so it splits back).
    pub fn index_value(&self) -> String {
        format!("{}#{}", self.name, self.value)
    }

    /// The key an index value holds ([`SearchKey::index_value`]).
    pub fn from_index_value(text: &str) -> Option<Self> {
        let (name, value) = text.split_once('#')?;
        (name_problem(name).is_none() && !value.is_empty()).then(|| Self {
            name: name.to_owned(),
            value: value.to_owned(),
        })
    }
}

impl std::fmt::Display for SearchKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.name, self.value)
    }
}

/// One of a task's search keys, in its slot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskKey {
    /// `0..MAX_SEARCH_KEYS`: the index it is kept in.
    pub slot: u8,
    #[serde(flatten)]
    pub key: SearchKey,
}

/// The keys a workflow declares, compiled, in slot order (their names sorted).
#[derive(Debug, Clone, Default)]
pub struct KeyDefs(Vec<(String, Mapping)>);

impl KeyDefs {
    /// Compiles a definition's `keys` (at `/keys`): each name a key name, each value one
    /// singular query on `$.input`; at most [`MAX_SEARCH_KEYS`].
    pub fn compile(
        written: Option<&BTreeMap<String, String>>,
        problems: &mut Vec<Problem>,
    ) -> Self {
        let Some(written) = written else {
            return Self::default();
        };
        if written.len() > MAX_SEARCH_KEYS {
            problems.push(Problem {
                at: "/keys".into(),
                message: format!("at most {MAX_SEARCH_KEYS} search keys ({})", written.len()),
            });
        }
        let mut defs = Vec::new();
        for (name, query) in written {
            let at = format!("/keys/{name}");
            if let Some(message) = name_problem(name) {
                problems.push(Problem { at, message });
                continue;
            }
            if !query.starts_with("$.input") && !query.starts_with("$['input']") {
                problems.push(Problem {
                    at,
                    message: format!(
                        "{query:?} must be a query on the task's input, as in $.input.{name}"
                    ),
                });
                continue;
            }
            let mapping = Mapping::compile(
                Value::String(query.clone()),
                &MappingScope::default(),
                &at,
                problems,
            );
            defs.push((name.clone(), mapping));
        }
        Self(defs)
    }

    /// The names declared, in slot order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|(n, _)| n.as_str())
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// A task's keys on its `input`: each key whose query finds a string, a number or a
    /// boolean (as its JSON text), in its slot; a key whose query finds nothing, `null` or `""`
    /// is left out (the task is not found by it). `Err` names each key whose value is an object
    /// or a list, or is over [`MAX_KEY_VALUE_BYTES`].
    pub fn read(&self, input: &Value) -> Result<Vec<TaskKey>, InputError> {
        let context = json!({ "input": input });
        let mut keys = Vec::new();
        let mut problems = Vec::new();
        for (slot, (name, mapping)) in self.0.iter().enumerate() {
            let source = match mapping {
                Mapping::Query { source, .. } => source.as_str(),
                _ => "",
            };
            let value = match scalar(mapping, &context) {
                Ok(Some(value)) => value,
                Ok(None) => continue,
                Err(why) => {
                    problems.push(Problem {
                        at: String::new(),
                        message: format!("search key {name} ({source}) {why}"),
                    });
                    continue;
                }
            };
            keys.push(TaskKey {
                slot: slot as u8,
                key: SearchKey {
                    name: name.clone(),
                    value,
                },
            });
        }
        if problems.is_empty() {
            Ok(keys)
        } else {
            Err(InputError(problems))
        }
    }
}

/// What `mapping` selects on `context` as a key's value: a string, or a number's or a
/// boolean's JSON text, of at most [`MAX_KEY_VALUE_BYTES`] (`None`: nothing, `null` or `""`);
/// `Err` says why another value is none.
fn scalar(mapping: &Mapping, context: &Value) -> Result<Option<String>, String> {
    // Lenient: a query that selects nothing gives `null`. Bounded: a value too large for a
    // key stops being copied at the bound.
    let value = match mapping.render_lenient(context, MAX_KEY_VALUE_BYTES + 2) {
        Ok(Value::String(s)) => s,
        Ok(Value::Number(n)) => n.to_string(),
        Ok(Value::Bool(b)) => b.to_string(),
        Ok(Value::Null) => return Ok(None),
        Ok(_) => {
            return Err("must be a string, a number or a boolean, not an object or a list".into());
        }
        Err(_) => return Err(format!("must be at most {MAX_KEY_VALUE_BYTES} bytes")),
    };
    if value.len() > MAX_KEY_VALUE_BYTES {
        return Err(format!("must be at most {MAX_KEY_VALUE_BYTES} bytes"));
    }
    Ok((!value.is_empty()).then_some(value))
}

/// The most tasks a concurrency limit lets hold one key value's gate at once.
pub const MAX_CONCURRENCY_LIMIT: u32 = 100;

/// A workflow's concurrency limit (`concurrency: {key: $.input.accountId, limit: 1}`): at most
/// `limit` of its tasks with one value of `key` run at once; the others wait in line, in the
/// order they were created.
#[derive(Debug, Clone)]
pub struct KeyLimit {
    /// The key's query, as written.
    pub source: String,
    mapping: Mapping,
    pub limit: u32,
}

impl KeyLimit {
    /// Compiles a definition's `concurrency` (at `/concurrency`): a query on the input, and a
    /// limit of 1 to [`MAX_CONCURRENCY_LIMIT`].
    pub fn compile(key: &str, limit: u32, problems: &mut Vec<Problem>) -> Option<Self> {
        let at = "/concurrency/key";
        if !key.starts_with("$.input") && !key.starts_with("$['input']") {
            problems.push(Problem {
                at: at.into(),
                message: format!(
                    "{key:?} must be a query on the task's input, as in $.input.accountId"
                ),
            });
            return None;
        }
        if !(1..=MAX_CONCURRENCY_LIMIT).contains(&limit) {
            problems.push(Problem {
                at: "/concurrency/limit".into(),
                message: format!("must be 1 to {MAX_CONCURRENCY_LIMIT} ({limit})"),
            });
            return None;
        }
        let mapping = Mapping::compile(
            Value::String(key.to_owned()),
            &MappingScope::default(),
            at,
            problems,
        );
        Some(Self {
            source: key.to_owned(),
            mapping,
            limit,
        })
    }

    /// The gate a task with `input` of workflow `workflow` takes its place at
    /// (`<workflow>#<value>`). `Err` when the input has no such value: a task that would
    /// escape the limit is refused.
    pub fn gate(&self, workflow: &str, input: &Value) -> Result<String, InputError> {
        let context = json!({ "input": input });
        let why = match scalar(&self.mapping, &context) {
            Ok(Some(value)) => return Ok(format!("{workflow}#{value}")),
            Ok(None) => {
                "selects nothing: every task of a workflow with a concurrency limit needs its key"
                    .to_owned()
            }
            Err(why) => why,
        };
        Err(InputError(vec![Problem {
            at: String::new(),
            message: format!("the concurrency key ({}) {why}", self.source),
        }]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defs(pairs: &[(&str, &str)]) -> (KeyDefs, Vec<Problem>) {
        let written: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let mut problems = vec![];
        let d = KeyDefs::compile(Some(&written), &mut problems);
        (d, problems)
    }

    #[test]
    fn keys_take_their_slots_by_name_and_read_scalars_from_the_input() {
        let (d, problems) = defs(&[
            ("orderId", "$.input.order.id"),
            ("customerId", "$.input.customerId"),
            ("vip", "$.input.vip"),
        ]);
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(
            d.names().collect::<Vec<_>>(),
            ["customerId", "orderId", "vip"]
        );
        let keys = d
            .read(&json!({"customerId": "c-77", "order": {"id": 1234}}))
            .unwrap();
        assert_eq!(
            keys,
            vec![
                TaskKey {
                    slot: 0,
                    key: SearchKey {
                        name: "customerId".into(),
                        value: "c-77".into()
                    }
                },
                TaskKey {
                    slot: 1,
                    key: SearchKey {
                        name: "orderId".into(),
                        value: "1234".into()
                    }
                },
            ]
        );
    }

    #[test]
    fn an_object_or_an_overlong_value_refuses_the_input_naming_its_key() {
        let (d, _) = defs(&[("customerId", "$.input.customer")]);
        let err = d.read(&json!({"customer": {"id": 1}})).unwrap_err();
        assert!(err.to_string().contains("search key customerId"), "{err}");
        let long = "x".repeat(MAX_KEY_VALUE_BYTES + 1);
        let err = d.read(&json!({ "customer": long })).unwrap_err();
        assert!(err.to_string().contains("at most 256 bytes"), "{err}");
        let exact = "é".repeat(MAX_KEY_VALUE_BYTES / 2);
        assert_eq!(d.read(&json!({ "customer": exact })).unwrap().len(), 1);
        assert!(d.read(&json!({"customer": ""})).unwrap().is_empty());
        assert!(d.read(&json!({"customer": null})).unwrap().is_empty());
    }

    #[test]
    fn a_definition_with_bad_keys_names_each_problem() {
        let (_, problems) = defs(&[
            ("a", "$.input.a"),
            ("b", "$.input.b"),
            ("c", "$.input.c"),
            ("d-1", "$.input.d"),
            ("e", "$.steps.x.result"),
        ]);
        let text: Vec<String> = problems.iter().map(ToString::to_string).collect();
        assert!(
            text.iter().any(|p| p.contains("at most 3 search keys")),
            "{text:?}"
        );
        assert!(
            text.iter().any(|p| p.starts_with("at /keys/d-1")),
            "{text:?}"
        );
        assert!(text.iter().any(|p| p.starts_with("at /keys/e")), "{text:?}");
    }

    #[test]
    fn a_concurrency_key_names_its_gate_and_refuses_an_input_without_it() {
        let mut problems = vec![];
        let k = KeyLimit::compile("$.input.account.id", 1, &mut problems).expect("compiles");
        assert!(problems.is_empty());
        assert_eq!(
            k.gate("ledger", &json!({"account": {"id": 77}})).unwrap(),
            "ledger#77"
        );
        let err = k.gate("ledger", &json!({"account": {}})).unwrap_err();
        assert!(err.to_string().contains("selects nothing"), "{err}");
        assert!(KeyLimit::compile("$.steps.a.result", 1, &mut problems).is_none());
        assert!(KeyLimit::compile("$.input.a", 0, &mut problems).is_none());
        assert_eq!(problems.len(), 2, "{problems:?}");
    }

    #[test]
    fn a_searched_key_parses_from_name_colon_value_and_round_trips_its_index_value() {
        let k = SearchKey::parse("customerId:c:77", "key").unwrap();
        assert_eq!(k.value, "c:77");
        assert_eq!(
            SearchKey::from_index_value(&k.index_value()),
            Some(k.clone())
        );
        assert_eq!(k.to_string(), "customerId:c:77");
        for bad in ["customerId", "customerId:", ":x", "1a:x", "a#b:x"] {
            let e = SearchKey::parse(bad, "key").unwrap_err();
            assert_eq!(e.field, "key", "{bad}");
        }
    }
}
