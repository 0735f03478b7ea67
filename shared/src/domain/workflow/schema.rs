//! A workflow's input schema: compiled under bounds on its cost, and the check of a value
//! against a compiled schema, every problem at its JSON pointer.

use super::super::problem::Problem;
use serde_json::Value;

/// The most regular expressions (`pattern` values and `patternProperties` names) in one input
/// schema: each may run on every string (or key) of every task input.
pub const MAX_SCHEMA_PATTERNS: usize = 16;

/// The most keywords (object members, at any depth) in one input schema.
pub const MAX_SCHEMA_KEYWORDS: usize = 1000;

/// The deepest an input schema nests (objects and arrays).
pub const MAX_SCHEMA_DEPTH: usize = 32;

/// The most backtracking steps one match of an input schema's pattern may take (the engine's
/// default is 1,000,000): a pattern that needs more fails the input.
pub const SCHEMA_BACKTRACK_LIMIT: usize = 1_000;

/// The largest an input schema's pattern may compile to, in bytes.
pub const SCHEMA_REGEX_BYTES: usize = 256 * 1024;

/// What an input schema costs beyond the budget: every task input is checked against it, in
/// the submission function, so patterns (each may run on every string and key of a 64 KiB
/// input), keywords and nesting are capped when the workflow is published.
fn schema_budget_problems(schema: &Value) -> Vec<Problem> {
    #[derive(Default)]
    struct Cost {
        patterns: usize,
        keywords: usize,
        depth: usize,
    }
    fn walk(v: &Value, depth: usize, cost: &mut Cost) {
        cost.depth = cost.depth.max(depth);
        if depth > MAX_SCHEMA_DEPTH {
            return;
        }
        match v {
            Value::Object(m) => {
                cost.keywords += m.len();
                for (k, x) in m {
                    match (k.as_str(), x) {
                        ("pattern", Value::String(_)) => cost.patterns += 1,
                        ("patternProperties", Value::Object(p)) => cost.patterns += p.len(),
                        _ => {}
                    }
                    walk(x, depth + 1, cost);
                }
            }
            Value::Array(a) => a.iter().for_each(|x| walk(x, depth + 1, cost)),
            _ => {}
        }
    }
    let mut cost = Cost::default();
    walk(schema, 0, &mut cost);
    let mut problems = vec![];
    let mut over = |message: String| {
        problems.push(Problem {
            at: "/input".into(),
            message,
        })
    };
    if cost.patterns > MAX_SCHEMA_PATTERNS {
        over(format!(
            "{} patterns (pattern, patternProperties): at most {MAX_SCHEMA_PATTERNS}, each runs on every task input",
            cost.patterns
        ));
    }
    if cost.keywords > MAX_SCHEMA_KEYWORDS {
        over(format!(
            "{} keywords: at most {MAX_SCHEMA_KEYWORDS} in an input schema",
            cost.keywords
        ));
    }
    if cost.depth > MAX_SCHEMA_DEPTH {
        over(format!(
            "nested too deep: at most {MAX_SCHEMA_DEPTH} levels in an input schema"
        ));
    }
    problems
}

/// Compiles a workflow's input schema, its problems (at `/input`) into `problems`: with
/// `budget`, held to today's bounds on cost first (see [`MAX_SCHEMA_KEYWORDS`] and the others).
pub(super) fn compile_input(
    schema: &Value,
    budget: bool,
    problems: &mut Vec<Problem>,
) -> Option<jsonschema::Validator> {
    let over = if budget {
        schema_budget_problems(schema)
    } else {
        vec![]
    };
    match jsonschema::meta::validate(schema) {
        _ if !over.is_empty() => {
            problems.extend(over);
            None
        }
        Err(e) => {
            problems.push(Problem {
                at: format!("/input{}", e.instance_path()),
                message: format!("not a valid JSON Schema: {e}"),
            });
            None
        }
        Ok(()) => match jsonschema::options()
            .with_pattern_options(
                jsonschema::PatternOptions::fancy_regex()
                    .backtrack_limit(SCHEMA_BACKTRACK_LIMIT)
                    .size_limit(SCHEMA_REGEX_BYTES),
            )
            .build(schema)
        {
            Ok(v) => Some(v),
            Err(e) => {
                problems.push(Problem {
                    at: "/input".into(),
                    message: format!("the input schema does not compile: {e}"),
                });
                None
            }
        },
    }
}

/// Checks `value` against a compiled schema, every problem at its pointer.
pub(super) fn schema_problems(schema: &jsonschema::Validator, value: &Value) -> Vec<Problem> {
    schema
        .iter_errors(value)
        .map(|e| Problem {
            at: e.instance_path().to_string(),
            message: e.to_string(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::testkit::*;
    use super::*;
    use serde_json::json;

    #[test]
    fn inputs_are_checked_against_the_input_schema_with_pointers() {
        let loan = workflow(examples::LOAN_APPLICATION).expect("valid");
        loan.check_input(&json!({"applicantId": "a-1", "amount": 25000, "currency": "EUR"}))
            .expect("a valid application");
        let err = loan
            .check_input(&json!({"applicantId": "a-1", "amount": -5, "currency": "EUR"}))
            .expect_err("a negative amount");
        assert_eq!(err.0[0].at, "/amount");
        let err = loan
            .check_input(&json!({"applicantId": "a-1", "amount": 5}))
            .expect_err("no currency");
        assert!(err.to_string().contains("currency"), "{err}");
    }

    #[test]
    fn a_bad_input_schema_is_rejected() {
        let p =
            problems("name: w\ninput: {type: objekt}\nsteps:\n  - {name: a, service: inventory}\n");
        assert!(p[0].at.starts_with("/input"), "{p:?}");
    }

    /// Every task input is checked against its workflow's input schema, in the submission
    /// function: a schema that costs much per input (many patterns, each run on every string
    /// of a 64 KiB input; thousands of keywords; deep nesting) is refused when published.
    #[test]
    fn a_hostile_input_schema_is_refused_at_publish() {
        // Many patterns, on one property...
        let patterns: Vec<Value> = (0..MAX_SCHEMA_PATTERNS + 1)
            .map(|i| json!({"pattern": format!("^(?=(a|aa)*c){i}")}))
            .collect();
        let p = input_problems(json!({"type": "object", "properties": {"s": {"allOf": patterns}}}));
        assert!(
            p.iter()
                .any(|p| p.at == "/input" && p.message.contains("patterns")),
            "{p:?}"
        );
        // ...or as property name patterns.
        let names: serde_json::Map<String, Value> = (0..MAX_SCHEMA_PATTERNS + 1)
            .map(|i| (format!("^k{i}(a|b)*$"), json!({})))
            .collect();
        let p = input_problems(json!({"type": "object", "patternProperties": names}));
        assert!(
            p.iter()
                .any(|p| p.at == "/input" && p.message.contains("patterns")),
            "{p:?}"
        );
        // Many keywords.
        let properties: serde_json::Map<String, Value> = (0..MAX_SCHEMA_KEYWORDS)
            .map(|i| (format!("p{i}"), json!({"type": "string", "maxLength": 8})))
            .collect();
        let p = input_problems(json!({"type": "object", "properties": properties}));
        assert!(
            p.iter()
                .any(|p| p.at == "/input" && p.message.contains("keywords")),
            "{p:?}"
        );
        // Deep nesting.
        let mut deep = json!({"type": "string"});
        for _ in 0..MAX_SCHEMA_DEPTH {
            deep = json!({"type": "object", "properties": {"a": deep}});
        }
        let p = input_problems(deep);
        assert!(
            p.iter()
                .any(|p| p.at == "/input" && p.message.contains("deep")),
            "{p:?}"
        );
        // A pattern that compiles too large (here about 0.5 MB).
        let p = input_problems(json!({"type": "string", "pattern": "^x?.{0,20000}$"}));
        assert!(p.iter().any(|p| p.at == "/input"), "{p:?}");
        // A schema within the budget (every example's, and one at the limits) is accepted.
        let patterns: Vec<Value> = (0..MAX_SCHEMA_PATTERNS)
            .map(|i| json!({"pattern": format!("^x{i}")}))
            .collect();
        let w = Workflow::from_value(
            json!({"name": "w", "input": {"type": "object", "properties": {"s": {"anyOf": patterns}}},
                   "steps": [{"name": "a", "service": "inventory"}]}),
            None,
            &Policy::default(),
        )
        .expect("a schema at the limits");
        w.check_input(&json!({"s": "x7"}))
            .expect("matches one pattern");
        assert!(w.check_input(&json!({"s": "y"})).is_err());
    }

    #[test]
    fn a_stored_definition_over_todays_cost_bounds_still_loads() {
        let mut doc = parse_value(examples::ECOMMERCE_ORDER, Format::Yaml).expect("yaml");
        doc["steps"][0]["input"]["many"] = json!(vec!["$.input.customerId"; 300]);
        let names: BTreeSet<String> = examples::services().into_iter().map(|s| s.name).collect();
        let publish = Workflow::from_value(doc.clone(), Some(&names), &Policy::default());
        assert!(
            publish.is_err_and(|e| e.to_string().contains("at most 256")),
            "refused at publish"
        );
        Workflow::from_stored(doc, &Policy::default()).expect("a stored one loads");
    }
}
