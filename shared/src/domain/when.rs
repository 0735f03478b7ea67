//! Conditions: the `when` of a step, of a group, or of a choice's case. A condition is a CEL
//! expression (the `cel` crate: side-effect free, no I/O, bounded by what it reads) on the same
//! context as mappings, `{task: {id, workflow, version}, input, steps: {<step>: {result}}}`,
//! compiled once when the workflow is published.
//!
//! Publishing refuses an expression that does not parse, that is longer than
//! [`MAX_WHEN_BYTES`], that names a variable other than `task`, `input` and `steps`, or that
//! reads a step other than by name (`steps['check-credit']` or `steps.check`) or one that is not
//! certainly done before it (the [`MappingScope`] rules, the same as mappings'). `has(steps.x)`
//! may test any step of the workflow: that is how a condition asks whether a step that may have
//! been skipped ran. At run time an expression that fails (a missing field, a type error) or
//! gives something other than a boolean is a [`WhenError`]: the step fails clearly
//! (`condition_failed`, naming the expression), as a mapping that selects nothing does.

use super::mapping::MappingScope;
use super::problem::Problem;
use cel::common::ast::{Expr, IdedExpr, LiteralValue, operators};
use serde_json::Value;
use std::fmt;
use std::sync::Arc;

/// The longest condition accepted (bytes).
pub const MAX_WHEN_BYTES: usize = 1024;

/// The variables a condition may read.
const VARIABLES: [&str; 3] = ["task", "input", "steps"];

/// A compiled condition.
#[derive(Clone)]
pub struct When {
    source: String,
    program: Arc<cel::Program>,
}

impl fmt::Debug for When {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("When").field(&self.source).finish()
    }
}

impl PartialEq for When {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

/// A condition that could not be decided on a task.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("condition_failed: {expression}: {message}")]
pub struct WhenError {
    pub expression: String,
    pub message: String,
}

impl When {
    /// Compiles `source`, reporting what is wrong with it at `at` (its JSON pointer).
    pub fn compile(
        source: &str,
        scope: &MappingScope<'_>,
        at: &str,
        problems: &mut Vec<Problem>,
    ) -> Option<Self> {
        let mut problem = |message: String| {
            problems.push(Problem {
                at: at.to_owned(),
                message,
            })
        };
        if source.len() > MAX_WHEN_BYTES {
            problem(format!("a condition is at most {MAX_WHEN_BYTES} bytes"));
            return None;
        }
        let program = match cel::Program::compile(source) {
            Ok(p) => p,
            Err(e) => {
                let first = e.to_string();
                let first = first.lines().next().unwrap_or_default().to_owned();
                problem(format!("{source:?} is not a CEL expression: {first}"));
                return None;
            }
        };
        let mut found = vec![];
        references(program.expression(), &mut Vec::new(), &mut found);
        let mut ok = true;
        for r in found {
            let why = match r {
                Reference::Variable(v) => Some(format!(
                    "{source:?} reads {v:?}: a condition reads only task, input and steps"
                )),
                Reference::AnyStep => Some(format!(
                    "{source:?} reads steps without naming one: write steps['<step>'] or steps.<step>"
                )),
                Reference::Step { name, tested: true } => scope
                    .readable(&name)
                    .err()
                    .filter(|_| !scope.may_have_run(&name))
                    .map(|why| format!("{source:?} {why}")),
                Reference::Step {
                    name,
                    tested: false,
                } => scope
                    .readable(&name)
                    .err()
                    .map(|why| format!("{source:?} {why}")),
            };
            if let Some(why) = why {
                ok = false;
                problem(why);
            }
        }
        ok.then(|| Self {
            source: source.to_owned(),
            program: Arc::new(program),
        })
    }

    /// Whether the condition may read step `step`'s result (or test that it ran).
    pub fn reads_step(&self, step: &str) -> bool {
        let mut found = vec![];
        references(self.program.expression(), &mut Vec::new(), &mut found);
        found.iter().any(|r| match r {
            Reference::AnyStep => true,
            Reference::Step { name, .. } => name == step,
            Reference::Variable(_) => false,
        })
    }

    /// The expression as written.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether the condition holds on `context` (a mapping context).
    pub fn holds(&self, context: &Value) -> Result<bool, WhenError> {
        let error = |message: String| WhenError {
            expression: self.source.clone(),
            message,
        };
        let mut ctx = cel::Context::default();
        for name in VARIABLES {
            let value = cel::to_value(context.get(name).unwrap_or(&Value::Null))
                .map_err(|e| error(e.to_string()))?;
            ctx.add_variable_from_value(name, value);
        }
        match self.program.execute(&ctx) {
            Ok(cel::Value::Bool(b)) => Ok(b),
            Ok(other) => Err(error(format!(
                "gives {}, not a boolean",
                other.type_of().to_string().to_lowercase()
            ))),
            Err(e) => Err(error(e.to_string())),
        }
    }
}

/// What an expression reads.
#[derive(Debug, PartialEq)]
enum Reference {
    /// A variable that is not one of [`VARIABLES`] (nor bound by a macro).
    Variable(String),
    /// `steps` itself, or indexed by something other than a literal name.
    AnyStep,
    /// A step by name; `tested`: only under `has(...)`.
    Step { name: String, tested: bool },
}

/// Collects what `e` reads; `bound` holds the names macros bind around it.
fn references(e: &IdedExpr, bound: &mut Vec<String>, out: &mut Vec<Reference>) {
    match &e.expr {
        Expr::Ident(name) if name == "steps" && !bound.contains(name) => {
            out.push(Reference::AnyStep)
        }
        Expr::Ident(name) => {
            if !VARIABLES.contains(&name.as_str())
                && !bound.contains(name)
                && !name.starts_with('@')
            {
                out.push(Reference::Variable(name.clone()));
            }
        }
        Expr::Select(s) => match step_name(&s.operand, bound) {
            // `steps.x`: the step; `has(steps.x)` is a select with `test`.
            Some(()) => out.push(Reference::Step {
                name: s.field.clone(),
                tested: s.test,
            }),
            None => references(&s.operand, bound, out),
        },
        Expr::Call(c) => {
            let indexes_steps = (c.func_name == operators::INDEX
                || c.func_name == operators::OPT_INDEX)
                && c.args.len() == 2
                && step_name(&c.args[0], bound).is_some();
            if indexes_steps {
                match &c.args[1].expr {
                    Expr::Literal(LiteralValue::String(name)) => out.push(Reference::Step {
                        name: name.to_string(),
                        tested: c.func_name == operators::OPT_INDEX,
                    }),
                    _ => out.push(Reference::AnyStep),
                }
                return;
            }
            if let Some(t) = &c.target {
                references(t, bound, out);
            }
            for a in &c.args {
                references(a, bound, out);
            }
        }
        Expr::Comprehension(c) => {
            references(&c.iter_range, bound, out);
            let names = [Some(&c.iter_var), c.iter_var2.as_ref(), Some(&c.accu_var)];
            let before = bound.len();
            bound.extend(names.into_iter().flatten().cloned());
            for part in [&c.accu_init, &c.loop_cond, &c.loop_step, &c.result] {
                references(part, bound, out);
            }
            bound.truncate(before);
        }
        Expr::List(l) => {
            for item in &l.elements {
                references(item, bound, out);
            }
        }
        Expr::Map(m) => {
            for entry in &m.entries {
                if let cel::common::ast::EntryExpr::MapEntry(me) = &entry.expr {
                    references(&me.key, bound, out);
                    references(&me.value, bound, out);
                }
            }
        }
        Expr::Struct(s) => {
            for entry in &s.entries {
                if let cel::common::ast::EntryExpr::StructField(f) = &entry.expr {
                    references(&f.value, bound, out);
                }
            }
        }
        Expr::Literal(_) | Expr::Unspecified => {}
    }
}

/// `Some` if `e` is the `steps` variable (not a name a macro bound).
fn step_name(e: &IdedExpr, bound: &[String]) -> Option<()> {
    matches!(&e.expr, Expr::Ident(n) if n == "steps" && !bound.iter().any(|b| b == n)).then_some(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    type Pairs<'a> = &'a [(&'a str, &'a str)];

    fn compile(
        source: &str,
        certain: &[&str],
        maybe: Pairs<'_>,
        elsewhere: Pairs<'_>,
    ) -> Result<When, Vec<Problem>> {
        let steps: Vec<String> = certain.iter().map(|s| (*s).to_owned()).collect();
        let own = |v: Pairs<'_>| -> Vec<(String, String)> {
            v.iter()
                .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
                .collect()
        };
        let (maybe, elsewhere) = (own(maybe), own(elsewhere));
        let scope = MappingScope {
            steps: &steps,
            maybe: &maybe,
            elsewhere: &elsewhere,
            ..Default::default()
        };
        let mut problems = vec![];
        When::compile(source, &scope, "/steps/1/when", &mut problems).ok_or(problems)
    }

    #[test]
    fn a_condition_reads_the_input_and_earlier_results() {
        let w = compile(
            "input.amount > 10000 && steps['credit-check'].result.score >= 650",
            &["credit-check"],
            &[],
            &[],
        )
        .expect("compiles");
        let ctx = |amount: f64, score: i64| json!({"task": {"id": "t"}, "input": {"amount": amount}, "steps": {"credit-check": {"result": {"score": score}}}});
        assert_eq!(w.holds(&ctx(15000.5, 700)), Ok(true));
        assert_eq!(w.holds(&ctx(9000.0, 700)), Ok(false));
        assert_eq!(w.holds(&ctx(15000.0, 600)), Ok(false));
    }

    #[test]
    fn a_condition_that_fails_at_run_time_names_itself() {
        let w = compile("input.amount > 1", &[], &[], &[]).expect("compiles");
        let e = w.holds(&json!({"input": {}})).expect_err("no amount");
        assert_eq!(e.expression, "input.amount > 1");
        assert!(
            e.to_string()
                .starts_with("condition_failed: input.amount > 1: "),
            "{e}"
        );
        let w = compile("input.amount", &[], &[], &[]).expect("compiles");
        let e = w
            .holds(&json!({"input": {"amount": 3}}))
            .expect_err("not a boolean");
        assert!(e.message.contains("not a boolean"), "{e}");
    }

    #[test]
    fn publishing_refuses_what_a_condition_may_not_read() {
        let p = compile("input.amount >", &[], &[], &[]).expect_err("does not parse");
        assert_eq!(p[0].at, "/steps/1/when");
        assert!(p[0].message.contains("not a CEL expression"), "{p:?}");
        let p = compile("now > 3", &[], &[], &[]).expect_err("unknown variable");
        assert!(p[0].message.contains("reads \"now\""), "{p:?}");
        let p = compile("steps[input.k].result == 1", &[], &[], &[]).expect_err("any step");
        assert!(p[0].message.contains("without naming one"), "{p:?}");
        let p = compile("steps.later.result == 1", &["a"], &[], &[]).expect_err("not earlier");
        assert!(
            p[0].message.contains("not an earlier step (earlier: a)"),
            "{p:?}"
        );
        let p = compile(
            "steps['hotel'].result.ok",
            &[],
            &[],
            &[("hotel", "which is in a sibling branch")],
        )
        .expect_err("sibling");
        assert!(p[0].message.contains("sibling branch"), "{p:?}");
    }

    #[test]
    fn has_may_test_a_step_that_may_not_have_run_and_macros_bind_their_names() {
        let w = compile(
            "has(steps.review) && steps.review.result.ok",
            &[],
            &[("review", "which may be skipped")],
            &[],
        );
        assert!(w.is_err(), "reading it outside has() is refused");
        let w = compile(
            "has(steps.review)",
            &[],
            &[("review", "which may be skipped")],
            &[],
        )
        .expect("a test is allowed");
        let p = compile(
            "has(steps.hotel)",
            &[],
            &[],
            &[("hotel", "which is in a sibling branch")],
        )
        .expect_err("a sibling's progress is a race");
        assert!(p[0].message.contains("sibling"), "{p:?}");
        assert_eq!(w.holds(&json!({"steps": {}})), Ok(false));
        assert_eq!(
            w.holds(&json!({"steps": {"review": {"result": 1}}})),
            Ok(true)
        );
        let p = compile("has(steps.nowhere)", &[], &[], &[]).expect_err("unknown step");
        assert!(p[0].message.contains("not an earlier step"), "{p:?}");
        let w = compile("input.items.all(i, i.qty > 0)", &[], &[], &[]).expect("i is bound");
        assert_eq!(
            w.holds(&json!({"input": {"items": [{"qty": 1}, {"qty": 2}]}})),
            Ok(true)
        );
    }
}
