//! Definition files on disk: finding them, checking them offline (`sasctl workflow validate`)
//! and the publish plan of `sasctl workflow apply`.
//!
//! Files are parsed and checked with the library the services themselves use
//! (`sas::domain::workflow`), so what passes here passes the API's own checks, except for one
//! difference: the services a workflow may name are the ones declared in the same set of files,
//! not the ones already published.

use crate::client::Request;
use crate::render::clean;
use sas::Policy;
use sas::domain::workflow::{
    Document, Format, Problem, ServiceDef, Workflow, parse_document, parse_value,
};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};

/// The JSON Schema of definition files, which a folder of definitions usually holds beside
/// them: never a definition itself.
pub const SCHEMA_FILE: &str = "schema.json";

/// One file given to `validate` or `apply`, as read from disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceFile {
    /// The path as shown in messages (a folder's entries are the folder joined with the name).
    pub name: String,
    /// The text, or why it could not be had.
    pub text: Result<String, String>,
}

/// Whether a file name is a definition file: `.yaml`, `.yml` or `.json`, but not
/// `schema.json`.
pub fn is_definition_file(path: &Path) -> bool {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
    name.as_deref() != Some(SCHEMA_FILE) && Format::of_path(&path.to_string_lossy()).is_some()
}

/// Reads the definition files named by `paths`: a file is read as given (it must end in
/// `.yaml`, `.yml` or `.json`; `schema.json` is skipped), a folder contributes its definition
/// files (not its subfolders), sorted by name. A file reached twice is read once. What cannot
/// be read is returned as a [`SourceFile`] holding the reason, so that it is reported like any
/// other problem.
pub fn read_paths(paths: &[PathBuf]) -> Vec<SourceFile> {
    let mut out = vec![];
    let mut seen = HashSet::new();
    let mut add = |path: &Path, out: &mut Vec<SourceFile>| {
        let key = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned());
        if seen.insert(key) {
            out.push(SourceFile {
                name: path.display().to_string(),
                text: std::fs::read_to_string(path).map_err(|e| format!("cannot read: {e}")),
            });
        }
    };
    for path in paths {
        let unreadable = |message: String| SourceFile {
            name: path.display().to_string(),
            text: Err(message),
        };
        let meta = match std::fs::metadata(path) {
            Ok(meta) => meta,
            Err(e) => {
                out.push(unreadable(format!("cannot read: {e}")));
                continue;
            }
        };
        if !meta.is_dir() {
            if is_definition_file(path) {
                add(path, &mut out);
            } else if path.file_name().is_none_or(|n| n != SCHEMA_FILE) {
                out.push(unreadable(
                    "not a definition file: the name must end in .yaml, .yml or .json".into(),
                ));
            }
            continue;
        }
        let entries = match std::fs::read_dir(path) {
            Ok(entries) => entries,
            Err(e) => {
                out.push(unreadable(format!("cannot read the folder: {e}")));
                continue;
            }
        };
        let mut files = vec![];
        for entry in entries {
            match entry {
                Ok(entry) => {
                    let file = entry.path();
                    if file.is_file() && is_definition_file(&file) {
                        files.push(file);
                    }
                }
                Err(e) => out.push(unreadable(format!("cannot read the folder: {e}"))),
            }
        }
        if files.is_empty() {
            out.push(unreadable(
                "no definition files (.yaml, .yml or .json) in this folder".into(),
            ));
        }
        files.sort();
        for file in files {
            add(&file, &mut out);
        }
    }
    out
}

/// What a valid file holds.
#[derive(Debug, Clone)]
pub enum Checked {
    /// A workflow, compiled, and its definition as JSON (the body `apply` sends).
    Workflow {
        workflow: Box<Workflow>,
        body: Value,
    },
    /// A list of services, each with its JSON (the body `apply` sends).
    Services(Vec<(ServiceDef, Value)>),
}

/// The check of one file: what it holds, or its problems.
#[derive(Debug, Clone)]
pub struct FileCheck {
    pub file: String,
    pub outcome: Result<Checked, Vec<Problem>>,
}

impl FileCheck {
    fn invalid(file: &str, problems: Vec<Problem>) -> Self {
        Self {
            file: file.to_owned(),
            outcome: Err(problems),
        }
    }
}

/// The check of a set of files, each in its place on the command line.
#[derive(Debug, Clone, Default)]
pub struct Validation {
    pub files: Vec<FileCheck>,
}

fn problem(at: impl Into<String>, message: impl Into<String>) -> Problem {
    Problem {
        at: at.into(),
        message: message.into(),
    }
}

/// One problem as one line: `FILE: at POINTER: message` (`FILE: message` for the whole file).
/// A message over several lines (a parser's error with a quoted snippet) keeps its first line;
/// control characters are replaced.
pub fn problem_line(file: &str, p: &Problem) -> String {
    let message = p.message.lines().next().unwrap_or_default().trim_end();
    let p = Problem {
        at: p.at.clone(),
        message: message.to_owned(),
    };
    clean(&format!("{file}: {p}"), usize::MAX)
}

/// Sorts problems by their place in the document: pointers compared segment by segment,
/// numbers as numbers (`/steps/2` before `/steps/10`); the whole file's first.
fn sort_problems(problems: &mut [Problem]) {
    fn key(at: &str) -> Vec<(u64, String)> {
        at.split('/')
            .skip(1)
            .map(|seg| match seg.parse::<u64>() {
                Ok(n) => (n, String::new()),
                Err(_) => (u64::MAX, seg.to_owned()),
            })
            .collect()
    }
    problems.sort_by_cached_key(|p| key(&p.at));
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// Checks definition files together: each must parse (YAML or JSON, by its name) and match the
/// definition schema; a service is declared once across all files; a workflow is defined once,
/// passes every check of the library (step names, input mappings that refer only to earlier
/// steps, durations, the pivot) under the default policy, and names only services that the
/// files declare.
pub fn check(files: &[SourceFile]) -> Validation {
    enum Parsed {
        Workflow(Box<sas::domain::workflow::WorkflowDoc>, Value),
        Services(Vec<(ServiceDef, Value)>),
    }
    let mut parsed: Vec<(String, Result<Parsed, Vec<Problem>>)> = vec![];
    for f in files {
        let outcome = match &f.text {
            Err(reason) => Err(vec![problem("", reason.clone())]),
            Ok(text) => match Format::of_path(&f.name) {
                None => Err(vec![problem(
                    "",
                    "not a definition file: the name must end in .yaml, .yml or .json",
                )]),
                Some(format) => parse_value(text, format)
                    .and_then(|value| Ok((parse_document(value.clone())?, value)))
                    .map_err(|e| e.0)
                    .and_then(|(document, value)| match document {
                        Document::Workflow(doc) => Ok(Parsed::Workflow(Box::new(doc), value)),
                        Document::Services(doc) => doc
                            .services
                            .into_iter()
                            .enumerate()
                            .map(|(i, s)| match serde_json::to_value(&s) {
                                Ok(body) => Ok((s, body)),
                                Err(e) => {
                                    Err(vec![problem(format!("/services/{i}"), e.to_string())])
                                }
                            })
                            .collect::<Result<Vec<_>, _>>()
                            .map(Parsed::Services),
                        Document::Schedules(_) => Err(vec![problem(
                            "",
                            "a schedules file: apply it with `sasctl schedule apply`",
                        )]),
                    }),
            },
        };
        parsed.push((f.name.clone(), outcome));
    }

    // Every service the files declare, and where first.
    let mut declared: BTreeMap<String, String> = BTreeMap::new();
    let mut workflows_seen: BTreeMap<String, String> = BTreeMap::new();
    let mut checks = vec![];
    let mut pending_workflows = vec![];
    for (file, outcome) in parsed {
        match outcome {
            Err(problems) => checks.push(FileCheck::invalid(&file, problems)),
            Ok(Parsed::Services(services)) => {
                let mut problems = vec![];
                for (i, (s, _)) in services.iter().enumerate() {
                    match declared.get(&s.name) {
                        Some(first) => problems.push(problem(
                            format!("/services/{i}/name"),
                            format!("service {:?} is already declared in {first}", s.name),
                        )),
                        None => {
                            declared.insert(s.name.clone(), file.clone());
                        }
                    }
                }
                checks.push(if problems.is_empty() {
                    FileCheck {
                        file,
                        outcome: Ok(Checked::Services(services)),
                    }
                } else {
                    FileCheck::invalid(&file, problems)
                });
            }
            Ok(Parsed::Workflow(doc, value)) => {
                let mut problems = vec![];
                match workflows_seen.get(&doc.name) {
                    Some(first) => problems.push(problem(
                        "/name",
                        format!("workflow {:?} is already defined in {first}", doc.name),
                    )),
                    None => {
                        workflows_seen.insert(doc.name.clone(), file.clone());
                    }
                }
                // A placeholder, replaced once every file's services are known.
                pending_workflows.push((checks.len(), doc, value, problems));
                checks.push(FileCheck::invalid(&file, vec![]));
            }
        }
    }

    let known: BTreeSet<String> = declared.keys().cloned().collect();
    let policy = Policy::default();
    for (index, doc, value, mut problems) in pending_workflows {
        for (at, service) in doc.services_used() {
            if !known.contains(service) {
                let message = if known.is_empty() {
                    format!(
                        "unknown service {service:?}: none of the files declares services (give the services file too)"
                    )
                } else {
                    format!(
                        "unknown service {service:?}: no file declares it (declared: {})",
                        known.iter().cloned().collect::<Vec<_>>().join(", ")
                    )
                };
                problems.push(problem(at, message));
            }
        }
        // Services were checked above, against the files.
        checks[index].outcome = match (*doc).validate(None, &policy) {
            Ok(workflow) if problems.is_empty() => Ok(Checked::Workflow {
                workflow: Box::new(workflow),
                body: value,
            }),
            Ok(_) => Err(problems),
            Err(e) => {
                problems.extend(e.0);
                sort_problems(&mut problems);
                Err(problems)
            }
        };
    }
    Validation { files: checks }
}

/// Reads and checks the files named by `paths` ([`read_paths`], then [`check`]).
pub fn validate_paths(paths: &[PathBuf]) -> Validation {
    check(&read_paths(paths))
}

/// What `apply` publishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Service,
    Workflow,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Service => "service",
            Self::Workflow => "workflow",
        })
    }
}

/// One `PUT` of the publish plan.
#[derive(Debug, Clone, PartialEq)]
pub struct Publish {
    pub kind: Kind,
    pub name: String,
    /// The JSON sent: one service, or a workflow's definition.
    pub body: Value,
    /// The file it comes from.
    pub file: String,
}

impl Publish {
    /// The API call: `PUT /services/{name}` or `PUT /workflows/{name}`.
    pub fn request(&self) -> Request<'_> {
        match self.kind {
            Kind::Service => Request::PutService {
                name: &self.name,
                body: &self.body,
            },
            Kind::Workflow => Request::PutWorkflow {
                name: &self.name,
                body: &self.body,
            },
        }
    }
}

impl Validation {
    /// No file has a problem (and there is at least one file).
    pub fn is_valid(&self) -> bool {
        !self.files.is_empty() && self.files.iter().all(|f| f.outcome.is_ok())
    }

    /// Every problem, one line each: `FILE: at POINTER: message` (`FILE: message` for the
    /// whole file), control characters replaced.
    pub fn problem_lines(&self) -> Vec<String> {
        let mut lines = vec![];
        for f in &self.files {
            if let Err(problems) = &f.outcome {
                lines.extend(problems.iter().map(|p| problem_line(&f.file, p)));
            }
        }
        lines
    }

    /// The report of `validate`: for each file in turn, its problems (one line each) or
    /// `FILE: ok (workflow NAME, N steps)` / `FILE: ok (N services)`.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for f in &self.files {
            match &f.outcome {
                Ok(checked) => {
                    let what = match checked {
                        Checked::Workflow { workflow, .. } => format!(
                            "workflow {}, {}",
                            workflow.name,
                            plural(workflow.steps.len(), "step", "steps")
                        ),
                        Checked::Services(services) => {
                            plural(services.len(), "service", "services")
                        }
                    };
                    out.push_str(&clean(&format!("{}: ok ({what})", f.file), usize::MAX));
                    out.push('\n');
                }
                Err(problems) => {
                    for p in problems {
                        out.push_str(&problem_line(&f.file, p));
                        out.push('\n');
                    }
                }
            }
        }
        if self.files.is_empty() {
            out.push_str("no definition files\n");
        }
        out
    }

    /// The report as JSON: `{"valid", "files": [{"file", "ok", "workflow"?, "steps"?,
    /// "services"?, "problems"?}]}`.
    pub fn to_json(&self) -> Value {
        let files: Vec<Value> = self
            .files
            .iter()
            .map(|f| match &f.outcome {
                Ok(Checked::Workflow { workflow, .. }) => json!({
                    "file": f.file, "ok": true,
                    "workflow": workflow.name, "steps": workflow.steps.len(),
                }),
                Ok(Checked::Services(services)) => json!({
                    "file": f.file, "ok": true,
                    "services": services.iter().map(|(s, _)| &s.name).collect::<Vec<_>>(),
                }),
                Err(problems) => json!({"file": f.file, "ok": false, "problems": problems}),
            })
            .collect();
        json!({"valid": self.is_valid(), "files": files})
    }

    /// What `apply` sends, in this sequence: every service (file by file, as declared), then
    /// every workflow (a workflow is checked against the services already published). `None`
    /// if any file has a problem: nothing is sent then.
    pub fn plan(&self) -> Option<Vec<Publish>> {
        if !self.is_valid() {
            return None;
        }
        let mut services = vec![];
        let mut workflows = vec![];
        for f in &self.files {
            match &f.outcome {
                Ok(Checked::Services(list)) => {
                    services.extend(list.iter().map(|(s, body)| Publish {
                        kind: Kind::Service,
                        name: s.name.clone(),
                        body: body.clone(),
                        file: f.file.clone(),
                    }));
                }
                Ok(Checked::Workflow { workflow, body }) => workflows.push(Publish {
                    kind: Kind::Workflow,
                    name: workflow.name.clone(),
                    body: body.clone(),
                    file: f.file.clone(),
                }),
                Err(_) => return None,
            }
        }
        services.extend(workflows);
        Some(services)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A fresh folder under the system's temporary folder, removed when dropped.
    pub(crate) struct TempDir(pub(crate) PathBuf);

    impl TempDir {
        pub(crate) fn new(tag: &str) -> std::io::Result<Self> {
            // Each test uses its own tag; the process id keeps parallel runs apart.
            let dir = std::env::temp_dir().join(format!("sasctl-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir)?;
            Ok(Self(dir))
        }

        pub(crate) fn write(&self, name: &str, text: &str) -> std::io::Result<PathBuf> {
            let path = self.0.join(name);
            std::fs::write(&path, text)?;
            Ok(path)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    pub(crate) const SERVICES: &str = "\
services:
  - name: bank
    target: {type: simulated}
  - name: mail
    description: Sends letters.
    target: {type: http, baseUrl: 'https://mail.example.com'}
";

    pub(crate) const GOOD: &str = "\
name: transfer
steps:
  - name: hold
    service: bank
    input: {amount: $.input.amount}
    undo: {action: release}
  - name: notify
    service: mail
    input: {hold: \"$.steps['hold'].result.id\"}
";

    /// `notify` reads `hold`'s result before `hold` runs, and names a service nobody declares.
    pub(crate) const BAD: &str = "\
name: broken
steps:
  - name: notify
    service: fax
    input: {hold: \"$.steps['hold'].result.id\"}
  - name: hold
    service: bank
";

    fn source(name: &str, text: &str) -> SourceFile {
        SourceFile {
            name: name.into(),
            text: Ok(text.into()),
        }
    }

    #[test]
    fn a_folder_of_good_definitions_is_ok() -> std::io::Result<()> {
        let dir = TempDir::new("good")?;
        dir.write("services.yaml", SERVICES)?;
        dir.write("transfer.yml", GOOD)?;
        dir.write("schema.json", "this is not a definition")?;
        dir.write("README.md", "# not read")?;
        let v = validate_paths(std::slice::from_ref(&dir.0));
        let d = dir.0.display();
        assert!(v.is_valid(), "{}", v.render());
        assert_eq!(
            v.render(),
            format!(
                "{d}/services.yaml: ok (2 services)\n{d}/transfer.yml: ok (workflow transfer, 2 steps)\n"
            )
        );
        assert!(v.problem_lines().is_empty());
        assert_eq!(v.to_json()["valid"], json!(true));
        assert_eq!(v.to_json()["files"][0]["services"], json!(["bank", "mail"]));
        Ok(())
    }

    #[test]
    fn validate_catches_an_unknown_service_and_a_forward_reference() -> std::io::Result<()> {
        let dir = TempDir::new("bad")?;
        dir.write("services.yaml", SERVICES)?;
        dir.write("broken.yaml", BAD)?;
        let v = validate_paths(std::slice::from_ref(&dir.0));
        assert!(!v.is_valid());
        assert!(v.plan().is_none(), "nothing is sent");
        let file = format!("{}/broken.yaml", dir.0.display());
        let lines = v.problem_lines();
        assert!(
            lines.contains(&format!(
                "{file}: at /steps/0/service: unknown service \"fax\": no file declares it (declared: bank, mail)"
            )),
            "{lines:#?}"
        );
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with(&format!("{file}: at /steps/0/input")) && l.contains("hold")),
            "the forward reference is reported at the mapping: {lines:#?}"
        );
        assert!(lines.iter().all(|l| l.starts_with(&file)), "{lines:#?}");
        // Sorted by pointer, whichever check found them.
        assert!(lines[0].contains("at /steps/0/input/hold"), "{lines:#?}");
        assert!(lines[1].contains("at /steps/0/service"), "{lines:#?}");
        // The good file is still reported ok, beside the bad one.
        assert!(v.render().contains("services.yaml: ok (2 services)\n"));
        assert_eq!(v.to_json()["valid"], json!(false));
        Ok(())
    }

    /// A workflow with groups and every mistake `validate` must name at its place: a reference
    /// into a sibling branch, a condition that does not parse, a forEach over what is not an
    /// array, a pivot inside a group, and an unknown service inside a case.
    const GROUPED: &str = "\
name: trip
input:
  type: object
  properties:
    travellers: {type: array}
    fare: {type: string}
steps:
  - name: book
    parallel:
      - steps:
          - {name: flight, service: bank, pivot: true}
      - steps:
          - name: hotel
            service: bank
            input: {seat: \"$.steps['flight'].result.seat\"}
  - name: fare
    choice:
      - when: input.fare ==
        steps: [{name: lounge, service: fax}]
  - name: insure
    service: mail
    forEach: $.input.fare
";

    #[test]
    fn validate_names_the_mistakes_of_groups_at_their_places() {
        let v = check(&[
            source("services.yaml", SERVICES),
            source("trip.yaml", GROUPED),
        ]);
        assert!(!v.is_valid());
        let lines = v.problem_lines();
        let at = |pointer: &str, says: &str| {
            assert!(
                lines
                    .iter()
                    .any(|l| l.starts_with(&format!("trip.yaml: at {pointer}: "))
                        && l.contains(says)),
                "{pointer} {says:?}: {lines:#?}"
            );
        };
        at("/steps/0/parallel/0/steps/0/pivot", "not of a group");
        at(
            "/steps/0/parallel/1/steps/0/input/seat",
            "a branch cannot read a sibling's",
        );
        at("/steps/1/choice/0/when", "not a CEL expression");
        at(
            "/steps/1/choice/0/steps/0/service",
            "unknown service \"fax\"",
        );
        at(
            "/steps/2/forEach",
            "is typed \"string\" by the input schema",
        );
    }

    #[test]
    fn a_workflow_without_the_services_file_names_unknown_services() {
        let v = check(&[source("transfer.yaml", GOOD)]);
        let lines = v.problem_lines();
        assert_eq!(lines.len(), 2, "{lines:#?}");
        assert!(
            lines[0].starts_with("transfer.yaml: at /steps/0/service: unknown service \"bank\": none of the files declares services"),
            "{lines:#?}"
        );
        assert!(lines[1].starts_with("transfer.yaml: at /steps/1/service:"));
    }

    #[test]
    fn unreadable_and_malformed_files_are_problems() -> std::io::Result<()> {
        let dir = TempDir::new("odd")?;
        let missing = dir.0.join("missing.yaml");
        let text = dir.write("notes.txt", "hello")?;
        let empty = dir.0.join("empty");
        std::fs::create_dir_all(&empty)?;
        let schema = dir.write("schema.json", "{}")?;
        let files = read_paths(&[missing.clone(), text, empty, schema]);
        assert_eq!(files.len(), 3, "schema.json is skipped: {files:?}");
        assert!(files.iter().all(|f| f.text.is_err()), "{files:?}");

        let v = check(&[
            source("a.yaml", "name: [unclosed"),
            source("b.json", "{\"name\": 1, \"steps\": []}"),
            source("c.yaml", "- just a list"),
        ]);
        let lines = v.problem_lines();
        assert!(lines[0].starts_with("a.yaml: not YAML"), "{lines:#?}");
        // The parser's quoted snippet is left out of the line.
        assert!(!lines[0].contains("-->"), "{lines:#?}");
        assert!(
            lines.iter().any(|l| l.starts_with("b.json: at /name")),
            "{lines:#?}"
        );
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("c.yaml: a definition is an object")),
            "{lines:#?}"
        );
        assert!(lines.iter().all(|l| !l.contains('\n')));
        assert!(!v.is_valid());
        assert!(!Validation::default().is_valid(), "no files is not valid");
        Ok(())
    }

    #[test]
    fn problems_sort_by_their_place() {
        let mut problems: Vec<Problem> = [
            "/steps/10/input",
            "/steps/2/service",
            "",
            "/name",
            "/steps/2",
        ]
        .iter()
        .map(|at| problem(*at, "m"))
        .collect();
        sort_problems(&mut problems);
        let sorted: Vec<&str> = problems.iter().map(|p| p.at.as_str()).collect();
        assert_eq!(
            sorted,
            [
                "",
                "/name",
                "/steps/2",
                "/steps/2/service",
                "/steps/10/input"
            ]
        );
        assert_eq!(
            problem_line("f.yaml", &problem("/x", "first\n  --> snippet")),
            "f.yaml: at /x: first"
        );
        assert_eq!(
            problem_line("f.yaml", &problem("", "whole\tfile")),
            "f.yaml: whole file"
        );
    }

    #[test]
    fn a_file_reached_twice_is_read_once() -> std::io::Result<()> {
        let dir = TempDir::new("twice")?;
        let services = dir.write("services.yaml", SERVICES)?;
        let files = read_paths(&[dir.0.clone(), services]);
        assert_eq!(files.len(), 1, "{files:?}");
        Ok(())
    }

    #[test]
    fn duplicates_across_files_are_problems() {
        let v = check(&[
            source("one.yaml", SERVICES),
            source(
                "two.yaml",
                "services:\n  - name: bank\n    target: {type: simulated}\n",
            ),
            source("w1.yaml", GOOD),
            source("w2.yaml", GOOD),
        ]);
        let lines = v.problem_lines();
        assert_eq!(
            lines,
            [
                "two.yaml: at /services/0/name: service \"bank\" is already declared in one.yaml",
                "w2.yaml: at /name: workflow \"transfer\" is already defined in w1.yaml",
            ]
        );
    }

    #[test]
    fn apply_sends_services_before_workflows() -> Result<(), Box<dyn std::error::Error>> {
        // The workflow file comes first on the command line; its services are still sent first.
        let v = check(&[
            source("transfer.yaml", GOOD),
            source(
                "services.json",
                &serde_json::to_string(&parse_value(SERVICES, Format::Yaml)?)?,
            ),
        ]);
        let plan = v.plan().ok_or("valid")?;
        let steps: Vec<(Kind, &str, &str)> = plan
            .iter()
            .map(|p| (p.kind, p.name.as_str(), p.file.as_str()))
            .collect();
        assert_eq!(
            steps,
            [
                (Kind::Service, "bank", "services.json"),
                (Kind::Service, "mail", "services.json"),
                (Kind::Workflow, "transfer", "transfer.yaml"),
            ]
        );
        // Each service goes alone, as JSON; the workflow as its whole definition.
        assert_eq!(
            plan[1].body,
            json!({"name": "mail", "description": "Sends letters.",
                   "target": {"type": "http", "baseUrl": "https://mail.example.com"}})
        );
        assert_eq!(plan[2].body, parse_value(GOOD, Format::Yaml)?);
        let calls: Vec<(&str, String)> = plan
            .iter()
            .map(|p| {
                let r = p.request();
                let path = match r {
                    Request::PutService { name, .. } => format!("/services/{name}"),
                    Request::PutWorkflow { name, .. } => format!("/workflows/{name}"),
                    other => format!("{other:?}"),
                };
                (r.method(), path)
            })
            .collect();
        assert_eq!(
            calls,
            [
                ("PUT", "/services/bank".to_owned()),
                ("PUT", "/services/mail".to_owned()),
                ("PUT", "/workflows/transfer".to_owned()),
            ]
        );
        Ok(())
    }

    #[test]
    fn the_shipped_examples_are_valid() {
        use sas::domain::workflow::examples::{ECOMMERCE_ORDER, LOAN_APPLICATION, SERVICES};
        let v = check(&[
            source("ecommerce-order.yaml", ECOMMERCE_ORDER),
            source("loan-application.yaml", LOAN_APPLICATION),
            source("services.yaml", SERVICES),
        ]);
        assert_eq!(
            v.render(),
            "ecommerce-order.yaml: ok (workflow ecommerce-order, 3 steps)\n\
             loan-application.yaml: ok (workflow loan-application, 6 steps)\n\
             services.yaml: ok (6 services)\n"
        );
        let plan = v.plan().unwrap_or_default();
        assert_eq!(plan.len(), 8);
        assert!(plan[..6].iter().all(|p| p.kind == Kind::Service));
    }
}
