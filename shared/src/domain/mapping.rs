//! Input mappings: how a step's request body is built from the task's input and the results of
//! earlier steps.
//!
//! A mapping is any JSON value. A string that starts with `$` is an RFC 9535 JSONPath *singular
//! query* (names and indexes only: it selects at most one value), evaluated with `jsonpath-rust`
//! on the context `{task: {id, workflow, version}, input, steps: {<step>: {result}}}`; every
//! other value is copied as it is. A string starting with `$$` is a literal with one `$` less.

use super::problem::Problem;
use jsonpath_rust::parser::model::{JpQuery, Segment, Selector};
use serde_json::{Map, Value};

/// What a mapping (or a condition) may refer to: the steps certainly done before the one being
/// mapped, (for an undo) the step itself, and (in a forEach step) the element.
#[derive(Default)]
pub struct MappingScope<'a> {
    /// The steps certainly done before this point: their results are there.
    pub steps: &'a [String],
    /// For an undo: the step it undoes.
    pub own: Option<&'a str>,
    /// Steps that may or may not be done here (a condition may have skipped them, or another
    /// case of a choice ran), each with the reason: a mapping cannot read them, a condition may
    /// test them with `has(...)`.
    pub maybe: &'a [(String, String)],
    /// Steps of the workflow that cannot be read here at all, each with the reason (in a
    /// sibling branch, in a forEach...).
    pub elsewhere: &'a [(String, String)],
    /// In a forEach step's mappings: `$.element` and `$.index` are the element and its index.
    pub element: bool,
}

impl MappingScope<'_> {
    /// Whether `step` may have run before this point (a condition may test it).
    pub fn may_have_run(&self, step: &str) -> bool {
        self.readable(step).is_ok() || self.maybe.iter().any(|(s, _)| s == step)
    }

    /// Whether `step`'s result may be read here; else why not.
    pub fn readable(&self, step: &str) -> Result<(), String> {
        if self.steps.iter().any(|s| s == step) || self.own == Some(step) {
            return Ok(());
        }
        if let Some((_, why)) = self
            .maybe
            .iter()
            .chain(self.elsewhere)
            .find(|(s, _)| s == step)
        {
            return Err(format!("refers to {step:?}, {why}"));
        }
        Err(format!(
            "refers to {step:?}, which is not an earlier step{}",
            if self.steps.is_empty() {
                String::new()
            } else {
                format!(" (earlier: {})", self.steps.join(", "))
            }
        ))
    }
}

/// A compiled mapping.
#[derive(Debug, Clone, PartialEq)]
pub enum Mapping {
    Literal(Value),
    Query { source: String, query: JpQuery },
    Object(Vec<(String, Mapping)>),
    Array(Vec<Mapping>),
}

/// A mapping that cannot be evaluated on a task.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MappingError {
    /// A query selected nothing.
    #[error("input_mapping_failed: {query} (at {at}) selects nothing")]
    SelectsNothing { at: String, query: String },
    /// The body would be larger than `limit` bytes (serialized JSON): rendering stopped there,
    /// so a mapping that repeats a large value many times costs at most that much.
    #[error("request_too_large: the mapped input is over {limit} bytes")]
    TooLarge { limit: usize },
}

/// The most queries one mapping (a step's input, or its undo's) may hold: with the size bound
/// on rendering, what a definition can make every render cost.
pub const MAX_QUERIES: usize = 256;

/// Counts the bytes written, and fails once they pass `cap`: measures a value's JSON size
/// without writing it, and without reading past the cap.
struct Meter {
    bytes: usize,
    cap: usize,
}

impl std::io::Write for Meter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.bytes += buf.len();
        if self.bytes > self.cap {
            Err(std::io::Error::other("over the cap"))
        } else {
            Ok(buf.len())
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The serialized size of `v` if it is at most `cap` bytes.
fn json_len(v: &Value, cap: usize) -> Option<usize> {
    let mut meter = Meter { bytes: 0, cap };
    serde_json::to_writer(&mut meter, v)
        .ok()
        .map(|()| meter.bytes)
}

/// What is left of a render's byte budget.
struct Budget {
    left: usize,
    limit: usize,
}

impl Budget {
    /// Takes the size of `v` (plus `extra` bytes of punctuation and key) from the budget.
    fn take(&mut self, v: &Value, extra: usize) -> Result<(), MappingError> {
        let too_large = MappingError::TooLarge { limit: self.limit };
        let cap = self.left.checked_sub(extra).ok_or(too_large.clone())?;
        let n = json_len(v, cap).ok_or(too_large)?;
        self.left -= n + extra;
        Ok(())
    }
}

fn escape_pointer(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// The path of a singular query, one entry per segment: `Some(name)` for a name, `None` for
/// an index; `None` if any segment is not a name or an index (the query may select several
/// values).
pub(crate) fn singular_path(query: &JpQuery) -> Option<Vec<Option<&str>>> {
    query
        .segments
        .iter()
        .map(|segment| match segment {
            Segment::Selector(Selector::Name(n)) => Some(Some(n.as_str())),
            Segment::Selector(Selector::Index(_)) => Some(None),
            _ => None,
        })
        .collect()
}

/// The part of `context` that `mappings` read: each query's value, at its place (the whole
/// value where the query names an index, or ends), and nothing else. Rendered on it, the
/// mappings build what they build on the whole context, and fail where they fail there (a
/// query that selects nothing selects nothing in the part). A distributed forEach keeps this
/// once for its elements rather than each element reading its task's whole input.
pub fn part_read(context: &Value, mappings: &[&Mapping]) -> Value {
    let mut paths = Vec::new();
    for m in mappings {
        m.paths(&mut paths);
    }
    let mut part = Value::Object(Map::new());
    for path in paths {
        let (mut from, mut to) = (context, &mut part);
        for (i, name) in path.iter().enumerate() {
            // An index: the whole list is kept (the query picks its element).
            let Some(name) = name else {
                break;
            };
            let (Some(next), Value::Object(into)) = (from.get(*name), &mut *to) else {
                break;
            };
            let whole = path.get(i + 1).is_none_or(Option::is_none);
            if whole {
                into.insert((*name).to_owned(), next.clone());
                break;
            }
            from = next;
            to = into
                .entry((*name).to_owned())
                .or_insert_with(|| Value::Object(Map::new()));
        }
    }
    part
}

/// A hint for the most common mistake: a dashed name written with a dot.
fn dash_hint(source: &str) -> String {
    let mut out = String::from("$");
    for part in source
        .trim_start_matches('$')
        .split('.')
        .filter(|p| !p.is_empty())
    {
        if part.contains('-') && !part.contains('[') {
            out.push_str(&format!("['{part}']"));
        } else {
            out.push('.');
            out.push_str(part);
        }
    }
    out
}

impl Mapping {
    /// Compiles `value`, reporting every bad query at its JSON pointer under `at`.
    pub fn compile(
        value: Value,
        scope: &MappingScope<'_>,
        at: &str,
        problems: &mut Vec<Problem>,
    ) -> Self {
        match value {
            Value::String(s) if s.starts_with("$$") => Self::Literal(Value::String(s[1..].into())),
            Value::String(s) if s.starts_with('$') => match Self::query(&s, scope) {
                Ok(query) => Self::Query { source: s, query },
                Err(message) => {
                    problems.push(Problem {
                        at: at.to_owned(),
                        message,
                    });
                    Self::Literal(Value::Null)
                }
            },
            Value::Object(map) => Self::Object(
                map.into_iter()
                    .map(|(k, v)| {
                        let here = format!("{at}/{}", escape_pointer(&k));
                        (k, Self::compile(v, scope, &here, problems))
                    })
                    .collect(),
            ),
            Value::Array(items) => Self::Array(
                items
                    .into_iter()
                    .enumerate()
                    .map(|(i, v)| Self::compile(v, scope, &format!("{at}/{i}"), problems))
                    .collect(),
            ),
            other => Self::Literal(other),
        }
    }

    fn query(source: &str, scope: &MappingScope<'_>) -> Result<JpQuery, String> {
        let query = jsonpath_rust::parser::parse_json_path(source).map_err(|e| {
            let hint = dash_hint(source);
            if hint != source && jsonpath_rust::parser::parse_json_path(&hint).is_ok() {
                format!(
                    "{source:?} is not an RFC 9535 JSONPath: a name with a dash needs brackets, as in {hint}"
                )
            } else {
                format!(
                    "{source:?} is not an RFC 9535 JSONPath: {}",
                    e.to_string().lines().next().unwrap_or_default()
                )
            }
        })?;
        let Some(names) = singular_path(&query) else {
            return Err(format!(
                "{source:?} is not a singular query: use names and indexes only, so that it selects one value"
            ));
        };
        match names.as_slice() {
            [] => Err(format!(
                "{source:?} selects the whole context: start with $.input, $.steps or $.task"
            )),
            [Some("input"), ..] => Ok(query),
            [Some("task")] => Ok(query),
            [Some("task"), Some("id" | "workflow" | "version")] => Ok(query),
            [Some("task"), ..] => Err(format!(
                "{source:?}: a task has only id, workflow and version"
            )),
            [Some("element"), ..] | [Some("index")] if scope.element => Ok(query),
            [Some("element" | "index"), ..] => Err(format!(
                "{source:?}: only a forEach step's mappings have an element and its index"
            )),
            [Some("steps"), Some(step), rest @ ..] => {
                scope
                    .readable(step)
                    .map_err(|why| format!("{source:?} {why}"))?;
                match rest {
                    [] | [Some("result"), ..] => Ok(query),
                    _ => Err(format!(
                        "{source:?}: a step offers only its result, as in $.steps['{step}'].result"
                    )),
                }
            }
            _ => Err(format!(
                "{source:?} must start with $.input, $.steps['<step>'].result or $.task"
            )),
        }
    }

    /// Adds the path of each of the mapping's queries to `paths` (singular, as every query
    /// compiled is: `Some(name)` a name, `None` an index).
    fn paths<'a>(&'a self, paths: &mut Vec<Vec<Option<&'a str>>>) {
        match self {
            Self::Literal(_) => {}
            Self::Query { query, .. } => paths.extend(singular_path(query)),
            Self::Object(fields) => fields.iter().for_each(|(_, m)| m.paths(paths)),
            Self::Array(items) => items.iter().for_each(|m| m.paths(paths)),
        }
    }

    /// Whether one of the mapping's queries may read step `step`'s result: it names it under
    /// `$.steps`, or reads `$.steps` (or `$`) whole.
    pub fn reads_step(&self, step: &str) -> bool {
        let mut paths = Vec::new();
        self.paths(&mut paths);
        paths.iter().any(|p| match p.as_slice() {
            [] | [Some("steps")] => true,
            [Some("steps"), Some(name), ..] => *name == step,
            _ => false,
        })
    }

    /// How many queries the mapping holds.
    pub fn queries(&self) -> usize {
        match self {
            Self::Literal(_) => 0,
            Self::Query { .. } => 1,
            Self::Object(fields) => fields.iter().map(|(_, m)| m.queries()).sum(),
            Self::Array(items) => items.iter().map(Mapping::queries).sum(),
        }
    }

    /// Builds the value on `context`, at most `limit` bytes of it (serialized JSON). A query
    /// that selects nothing is an error (a step's result lacks a field the mapping needs),
    /// never a silent `null`.
    pub fn render(&self, context: &Value, limit: usize) -> Result<Value, MappingError> {
        let mut budget = Budget { left: limit, limit };
        self.render_at(context, "", false, &mut budget)
    }

    /// Builds the value on `context` (at most `limit` bytes of it), with `null` wherever a
    /// query selects nothing. For the undo of a step whose outcome is unknown (it timed out,
    /// was cancelled while it ran, or its answer could not be kept): the step may have taken
    /// effect but its result was never kept, and the service finds the step by the key it
    /// undoes (`Sas-Undoes`). Fails only with [`MappingError::TooLarge`].
    pub fn render_lenient(&self, context: &Value, limit: usize) -> Result<Value, MappingError> {
        let mut budget = Budget { left: limit, limit };
        self.render_at(context, "", true, &mut budget)
    }

    fn render_at(
        &self,
        context: &Value,
        at: &str,
        lenient: bool,
        budget: &mut Budget,
    ) -> Result<Value, MappingError> {
        Ok(match self {
            Self::Literal(v) => {
                budget.take(v, 0)?;
                v.clone()
            }
            Self::Query { source, query } => {
                let found = jsonpath_rust::query::js_path_process(query, context)
                    .ok()
                    .and_then(|refs| refs.into_iter().next())
                    .map(|r| r.val);
                match found {
                    Some(v) => {
                        // Measured before it is copied: a copy is what could blow up.
                        budget.take(v, 0)?;
                        v.clone()
                    }
                    None if lenient => Value::Null,
                    None => {
                        return Err(MappingError::SelectsNothing {
                            at: if at.is_empty() { "/".into() } else { at.into() },
                            query: source.clone(),
                        });
                    }
                }
            }
            Self::Object(fields) => {
                let mut out = Map::new();
                for (k, m) in fields {
                    // The key, its quotes, the colon and a comma.
                    budget.take(&Value::Null, k.len().saturating_sub(1))?;
                    let here = format!("{at}/{}", escape_pointer(k));
                    out.insert(k.clone(), m.render_at(context, &here, lenient, budget)?);
                }
                Value::Object(out)
            }
            Self::Array(items) => Value::Array(
                items
                    .iter()
                    .enumerate()
                    .map(|(i, m)| m.render_at(context, &format!("{at}/{i}"), lenient, budget))
                    .collect::<Result<_, _>>()?,
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_part_read_holds_what_the_queries_select_and_nothing_more() {
        let done = ["open".to_owned()];
        let scope = MappingScope {
            steps: &done,
            own: None,
            maybe: &[],
            elsewhere: &[],
            element: true,
        };
        let compile = |v: Value| {
            let mut problems = vec![];
            let m = Mapping::compile(v, &scope, "", &mut problems);
            assert!(problems.is_empty(), "{problems:?}");
            m
        };
        let context = json!({
            "task": {"id": "t", "workflow": "w", "version": 1},
            "input": {"period": "2026-11", "quote": {"lines": [1, 2, 3]}, "big": "x".repeat(1000),
                      "codes": ["a", "b", "c"]},
            "steps": {"open": {"result": {"id": "o-1", "other": "y".repeat(1000)}}}
        });
        let input = compile(json!({
            "period": "$.input.period",
            "code": "$.input.codes[1]",
            "opened": "$.steps.open.result.id",
            "task": "$.task.id",
            "literal": [1, "$$not a query"],
            "missing": "$.input.nowhere.deeper"
        }));
        let undo = compile(json!({"quote": "$.input.quote"}));
        let part = part_read(&context, &[&input, &undo]);
        assert_eq!(
            part,
            json!({
                "task": {"id": "t"},
                "input": {"period": "2026-11", "quote": {"lines": [1, 2, 3]}, "codes": ["a", "b", "c"]},
                "steps": {"open": {"result": {"id": "o-1"}}}
            })
        );
        // On the part, each mapping builds what it builds on the whole, and fails alike.
        let undo_only = part_read(&context, &[&undo]);
        assert_eq!(
            undo.render(&undo_only, 1 << 20),
            undo.render(&context, 1 << 20)
        );
        let without_missing = compile(json!({
            "period": "$.input.period",
            "code": "$.input.codes[1]",
            "opened": "$.steps.open.result.id"
        }));
        assert_eq!(
            without_missing.render(&part, 1 << 20),
            without_missing.render(&context, 1 << 20)
        );
        assert_eq!(
            input.render(&part, 1 << 20).map_err(|e| e.to_string()),
            input.render(&context, 1 << 20).map_err(|e| e.to_string())
        );
    }

    use super::*;
    use serde_json::json;

    fn compile(v: Value, steps: &[&str], own: Option<&str>) -> Result<Mapping, Vec<Problem>> {
        let steps: Vec<String> = steps.iter().map(|s| (*s).to_owned()).collect();
        let mut problems = vec![];
        let m = Mapping::compile(
            v,
            &MappingScope {
                steps: &steps,
                own,
                ..Default::default()
            },
            "",
            &mut problems,
        );
        if problems.is_empty() {
            Ok(m)
        } else {
            Err(problems)
        }
    }

    #[test]
    fn a_mapping_builds_the_body_from_input_and_earlier_results() {
        let m = compile(
            json!({
                "amount": "$.input.amount",
                "score": "$.steps['check-credit'].result.score",
                "first": "$.input.items[0].sku",
                "task": "$.task.id",
                "fixed": {"channel": "web", "tags": ["a", 1, null]},
                "dollar": "$$5"
            }),
            &["check-credit"],
            None,
        )
        .expect("compiles");
        let ctx = json!({
            "task": {"id": "t-1", "workflow": "w", "version": 1},
            "input": {"amount": 12, "items": [{"sku": "A"}]},
            "steps": {"check-credit": {"result": {"score": 710}}}
        });
        assert_eq!(
            m.render(&ctx, 1 << 20).expect("renders"),
            json!({"amount": 12, "score": 710, "first": "A", "task": "t-1",
                   "fixed": {"channel": "web", "tags": ["a", 1, null]}, "dollar": "$5"})
        );
    }

    #[test]
    fn a_query_that_selects_nothing_is_an_error_naming_its_place() {
        let m = compile(json!({"a": {"b": "$.input.missing"}}), &[], None).expect("compiles");
        let err = m
            .render(&json!({"input": {}}), 1 << 20)
            .expect_err("nothing there");
        assert_eq!(
            err,
            MappingError::SelectsNothing {
                at: "/a/b".into(),
                query: "$.input.missing".into()
            }
        );
        assert_eq!(
            m.render_lenient(&json!({"input": {}}), 1 << 20),
            Ok(json!({"a": {"b": null}}))
        );
    }

    #[test]
    fn rendering_stops_at_its_byte_limit_before_copying_more() {
        // A thousand references to a 64 KiB input would build 64 MB: it stops at the limit.
        let refs: Vec<Value> = (0..1000).map(|_| json!("$.input")).collect();
        let m = compile(Value::Array(refs), &[], None).expect("compiles");
        assert_eq!(m.queries(), 1000);
        let ctx = json!({"input": "x".repeat(64 * 1024)});
        let limit = 192 * 1024;
        assert_eq!(m.render(&ctx, limit), Err(MappingError::TooLarge { limit }));
        assert_eq!(
            m.render_lenient(&ctx, limit),
            Err(MappingError::TooLarge { limit })
        );
        // Within the limit it renders whole, and the budget is close to the real size.
        let small = json!({"input": "x".repeat(100)});
        let body = m.render(&small, limit).expect("fits");
        let size = body.to_string().len();
        assert!(size <= limit, "{size}");
        let tight = compile(json!({"key": "$.input", "list": ["$.input", 1]}), &[], None)
            .expect("compiles");
        let exact = tight
            .render(&small, 1 << 20)
            .expect("renders")
            .to_string()
            .len();
        assert!(
            tight.render(&small, exact).is_ok(),
            "the budget does not overcount"
        );
        assert!(
            tight.render(&small, exact - 150).is_err(),
            "nor undercount by more than punctuation"
        );
    }

    #[test]
    fn only_singular_queries_into_known_places_compile() {
        for bad in [
            "$.input[*]",
            "$..amount",
            "$.input[?@.x]",
            "$.steps['later'].result",
            "$.steps['a'].status",
            "$.task.secret",
            "$.other",
            "$",
            "$.input[",
        ] {
            assert!(compile(json!(bad), &["a"], None).is_err(), "{bad} compiled");
        }
        assert!(compile(json!("$.steps['a'].result"), &[], Some("a")).is_ok());
    }
}
