//! The docs stay a map that holds: every relative link of README.md, ARCHITECTURE.md,
//! BENCHMARKS.md and `docs/*.md` reaches a file that exists, and every `#anchor` a heading of
//! that file (GitHub's slugs); and the code map (`docs/code-map.md`) names every `.rs` file of
//! the crates' `src` folders, and no file that is gone.
//!
//! The code map's form: under a `###` heading whose first code span is a source folder
//! (`` ### `shared/src` ``), a file is named by a code span of its path from that folder
//! (`` `remote/lambda.rs` ``); anywhere in the map, a code span of its path from the repository
//! root (`` `functions/agent/src/main.rs` ``) names it too.

use pulldown_cmark::{Event, HeadingLevel, LinkType, Options, Parser, Tag, TagEnd};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests package sits in the repository")
        .to_path_buf()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// The Markdown files whose links are checked, relative to the repository root.
fn doc_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = ["README.md", "ARCHITECTURE.md", "BENCHMARKS.md"]
        .iter()
        .map(PathBuf::from)
        .collect();
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("docs/")
        .map(|e| e.expect("a docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .map(|p| PathBuf::from("docs").join(p.file_name().expect("a file name")))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

fn parser(text: &str) -> Parser<'_> {
    Parser::new_ext(
        text,
        Options::ENABLE_TABLES | Options::ENABLE_STRIKETHROUGH | Options::ENABLE_TASKLISTS,
    )
}

/// GitHub's anchor for a heading's text: lower case, punctuation other than `-` and `_`
/// dropped, each space a `-`.
fn slug(text: &str) -> String {
    text.trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// Each heading of a Markdown text, with its level and plain text (code spans included).
fn headings(text: &str) -> Vec<(HeadingLevel, String)> {
    let mut out = vec![];
    let mut current: Option<(HeadingLevel, String)> = None;
    for event in parser(text) {
        match event {
            Event::Start(Tag::Heading { level, .. }) => current = Some((level, String::new())),
            Event::End(TagEnd::Heading(_)) => out.extend(current.take()),
            Event::Text(t) | Event::Code(t) => {
                if let Some((_, s)) = current.as_mut() {
                    s.push_str(&t);
                }
            }
            _ => {}
        }
    }
    out
}

/// The anchors of a Markdown text's headings, numbered as GitHub numbers repeats (`-1`, ...).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for (_, h) in headings(text) {
        let base = slug(&h);
        let n = seen.entry(base.clone()).or_insert(0);
        out.insert(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    out
}

/// Every link and image destination of a Markdown text, autolinks and e-mail links aside.
fn links(text: &str) -> Vec<String> {
    parser(text)
        .filter_map(|event| match event {
            Event::Start(Tag::Link {
                link_type,
                dest_url,
                ..
            }) if !matches!(link_type, LinkType::Autolink | LinkType::Email) => {
                Some(dest_url.to_string())
            }
            Event::Start(Tag::Image { dest_url, .. }) => Some(dest_url.to_string()),
            _ => None,
        })
        .collect()
}

fn is_external(dest: &str) -> bool {
    dest.contains("://") || dest.starts_with("mailto:")
}

/// What is wrong with the links of the given Markdown files (paths from `root`).
fn broken_links(root: &Path, files: &[PathBuf]) -> Vec<String> {
    let mut problems = vec![];
    for file in files {
        let text = read(&root.join(file));
        let dir = file.parent().unwrap_or(Path::new(""));
        for dest in links(&text) {
            if is_external(&dest) {
                continue;
            }
            let (path, anchor) = match dest.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (dest.as_str(), None),
            };
            let target = if path.is_empty() {
                file.clone()
            } else {
                dir.join(path)
            };
            let on_disk = root.join(&target);
            if !on_disk.exists() {
                problems.push(format!(
                    "{}: `{dest}` points to {}, which does not exist",
                    file.display(),
                    target.display()
                ));
                continue;
            }
            let Some(anchor) = anchor else { continue };
            if on_disk.extension().is_none_or(|x| x != "md") {
                problems.push(format!(
                    "{}: `{dest}` has an anchor into a file that is not Markdown",
                    file.display()
                ));
                continue;
            }
            if !anchors(&read(&on_disk)).contains(anchor) {
                problems.push(format!(
                    "{}: `{dest}`: {} has no heading with the anchor #{anchor}",
                    file.display(),
                    target.display()
                ));
            }
        }
    }
    problems
}

/// The `.rs` files of every crate's `src` folder, as paths from `root` with `/` separators.
fn source_files(root: &Path) -> BTreeSet<String> {
    fn walk(dir: &Path, root: &Path, out: &mut BTreeSet<String>) {
        let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries {
            let path = entry.expect("a folder entry").path();
            if path.is_dir() {
                walk(&path, root, out);
            } else if path.extension().is_some_and(|x| x == "rs") {
                let rel = path.strip_prefix(root).expect("under the root");
                out.insert(rel.to_string_lossy().replace('\\', "/"));
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(&root.join("shared/src"), root, &mut out);
    for parent in ["functions", "infra"] {
        let crates = std::fs::read_dir(root.join(parent)).expect("a crates folder");
        for krate in crates {
            let src = krate.expect("a folder entry").path().join("src");
            if src.is_dir() {
                walk(&src, root, &mut out);
            }
        }
    }
    out
}

/// The `.rs` paths the code map (`docs/code-map.md`) names, from the repository root. A name under a
/// source folder's heading that is neither a path from that folder nor from the root is
/// returned as it is written, so it matches no file.
fn mapped_files(root: &Path, map: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut in_map = false;
    let mut heading: Option<(HeadingLevel, String)> = None;
    let mut folder: Option<String> = None;
    for event in parser(map) {
        match event {
            Event::Start(Tag::Heading { level, .. }) => heading = Some((level, String::new())),
            Event::Code(code) if heading.is_some() => {
                if let Some((_, text)) = heading.as_mut()
                    && text.is_empty()
                {
                    text.push_str(&code);
                }
            }
            Event::Text(t)
                if heading
                    .as_ref()
                    .is_some_and(|(l, _)| *l <= HeadingLevel::H2) =>
            {
                if let Some((_, text)) = heading.as_mut() {
                    text.push_str(&t);
                }
            }
            Event::End(TagEnd::Heading(_)) => {
                let (level, text) = heading.take().expect("a heading was open");
                match level {
                    HeadingLevel::H1 | HeadingLevel::H2 => {
                        in_map = text.trim() == "Code map";
                        folder = None;
                    }
                    HeadingLevel::H3 => {
                        let dir = text.trim_end_matches('/').to_string();
                        folder = (dir.ends_with("src") && root.join(&dir).is_dir()).then_some(dir);
                    }
                    _ => {}
                }
            }
            Event::Code(code) if in_map && code.ends_with(".rs") => {
                let code = code.trim_start_matches("./");
                let under_folder = folder.as_ref().map(|d| format!("{d}/{code}"));
                match under_folder {
                    Some(p) if root.join(&p).is_file() => out.insert(p),
                    _ => out.insert(code.to_string()),
                };
            }
            _ => {}
        }
    }
    out
}

#[test]
fn every_relative_link_and_anchor_of_the_docs_resolves() {
    let root = root();
    let problems = broken_links(&root, &doc_files());
    assert!(
        problems.is_empty(),
        "broken links:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_code_map_names_every_source_file_and_no_other() {
    let root = root();
    let sources = source_files(&root);
    assert!(
        sources.contains("shared/src/remote/lambda.rs"),
        "the walk finds the sources"
    );
    let mapped = mapped_files(&root, &read(&root.join("docs/code-map.md")));
    let missing: Vec<&String> = sources.difference(&mapped).collect();
    assert!(
        missing.is_empty(),
        "docs/code-map.md does not name: {missing:?}"
    );
    // Names in the map that are no source file (a file moved or removed, or a typo). Test and
    // support files (`tests/…`) may be named in passing, as long as they exist.
    let stale: Vec<&String> = mapped
        .difference(&sources)
        .filter(|p| !root.join(p).is_file())
        .collect();
    assert!(
        stale.is_empty(),
        "docs/code-map.md names files that do not exist: {stale:?}"
    );
}

#[test]
fn slugs_follow_githubs_rules() {
    assert_eq!(slug("Run it"), "run-it");
    assert_eq!(
        slug("Metrics, dashboard and alarms"),
        "metrics-dashboard-and-alarms"
    );
    assert_eq!(
        slug("sas/ (the product crate, imported as sas)"),
        "sas-the-product-crate-imported-as-sas"
    );
    assert_eq!(
        slug("Load per key at 1,000 tasks a second"),
        "load-per-key-at-1000-tasks-a-second"
    );
    assert_eq!(slug("snake_case and-dash"), "snake_case-and-dash");
    let text = "# A\n\n## Notes\n\n## Notes\n\n### `code` heading\n";
    let got = anchors(text);
    for a in ["a", "notes", "notes-1", "code-heading"] {
        assert!(got.contains(a), "{a} missing from {got:?}");
    }
}

#[test]
fn a_broken_link_or_anchor_is_reported() {
    let dir = std::env::temp_dir().join(format!("sas-docs-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("docs")).expect("a temporary folder");
    std::fs::write(dir.join("docs/b.md"), "# B\n\n## Real heading\n").expect("write b");
    std::fs::write(
        dir.join("a.md"),
        "# A\n\n[ok](docs/b.md#real-heading) [self](#a) [web](https://example.com/x#y)\n\
         [gone](docs/c.md) [bad anchor](docs/b.md#no-such) [bad self](#nope)\n",
    )
    .expect("write a");
    let problems = broken_links(&dir, &[PathBuf::from("a.md")]);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(problems.len(), 3, "{problems:#?}");
    assert!(problems[0].contains("docs/c.md"), "{problems:#?}");
    assert!(problems[1].contains("#no-such"), "{problems:#?}");
    assert!(problems[2].contains("#nope"), "{problems:#?}");
}

/// The values of an enum of `docs/openapi.yaml`'s components (`    Name:` … `enum: [...]`).
fn openapi_enum(name: &str) -> Vec<String> {
    let text = read(&root().join("docs/openapi.yaml"));
    let start = text
        .find(&format!("\n    {name}:\n"))
        .unwrap_or_else(|| panic!("openapi.yaml has no schema {name}"));
    let line = text[start..]
        .lines()
        .find_map(|l| l.trim().strip_prefix("enum: ["))
        .unwrap_or_else(|| panic!("{name} has no enum"));
    line.trim_end_matches(']')
        .split(',')
        .map(|v| v.trim().to_owned())
        .collect()
}

/// The text of a document's section, from its heading to the next heading of its level.
fn section(text: &str, heading: &str) -> String {
    let start = text
        .find(&format!("\n## {heading}\n"))
        .unwrap_or_else(|| panic!("no section {heading}"));
    let rest = &text[start + 4..];
    rest[..rest.find("\n## ").unwrap_or(rest.len())].to_owned()
}

/// api.md lists every state a task can be in and every status a step can have, as the API
/// document (held to the code by `tests/api_document.rs`) gives them.
#[test]
fn api_md_lists_every_process_state_and_step_status() {
    let reading = section(&read(&root().join("docs/api.md")), "Reading a task");
    for (kind, values) in [
        ("processState", openapi_enum("ProcessState")),
        ("step status", openapi_enum("StepStatus")),
    ] {
        assert!(values.len() > 5, "{kind}: {values:?}");
        for v in values {
            assert!(
                reading.contains(&format!("`{v}`")),
                "api.md's Reading a task does not name the {kind} `{v}`"
            );
        }
    }
}

/// What the views hold, api.md says: a field it names as the operator's or the caller's is in
/// that view's schema (closed: `tests/api_document.rs` holds the views to it).
#[test]
fn api_md_names_the_fields_each_view_has() {
    let openapi = read(&root().join("docs/openapi.yaml"));
    // A schema of the components: its line, then every line indented deeper.
    let fields = |view: &str| -> String {
        let mut lines = openapi.lines().skip_while(|l| *l != format!("    {view}:"));
        let head = lines.next().unwrap_or_else(|| panic!("no {view}"));
        let body: Vec<&str> = lines.take_while(|l| l.starts_with("     ")).collect();
        format!("{head}\n{}", body.join("\n"))
    };
    let caller = fields("CallerTaskView");
    let operator = fields("TaskView");
    for f in ["deadline:", "startAt:", "refusal:"] {
        assert!(caller.contains(f), "CallerTaskView has {f}");
        assert!(
            operator.contains(f),
            "TaskView has {f} (\"shows everything\")"
        );
    }
    assert!(!caller.contains("completeBy:"), "{caller}");
    let reading = section(&read(&root().join("docs/api.md")), "Reading a task");
    for f in ["`deadline`", "`startAt`", "`refusal`"] {
        assert!(reading.contains(f), "api.md's Reading a task names {f}");
    }
}

/// The idempotency keys the docs show are the keys services get: `{task}:{step}:{action}` at
/// generation 0 (no suffix), `…:g1` after an operator's retry of a refused call, and an
/// element's step `{step}#{index}` (services.md's examples and workflows.md's forEach).
#[test]
fn the_docs_idempotency_keys_are_the_codes() {
    use sas::messages::idempotency_key;
    let id: sas::TaskId = "3f2a8c1e-0d3b-4a57-9d0e-1b2c3d4e5f60"
        .parse()
        .expect("an id");
    let key = |step: &str, action: &str, generation: u32| {
        idempotency_key(id, step, action, generation).replace(&id.to_string(), "{task}")
    };
    let template = key("{step}", "{action}", 0);
    let element = key("{step}#{index}", "{action}", 0);
    let retried = key("{step}", "{action}", 1);
    assert_eq!(retried, format!("{template}:g1"));
    let services = read(&root().join("docs/services.md"));
    assert!(
        services.contains(&format!("`{template}`")),
        "services.md: {template}"
    );
    assert!(services.contains("`{step}#{index}`") && services.contains("`…:g1`"));
    // Its examples: the example task's key for reserve-funds' hold-funds.
    let example = idempotency_key(id, "reserve-funds", "hold-funds", 0)
        .replace("3f2a8c1e-0d3b-4a57-9d0e-1b2c3d4e5f60", "3f2a8c1e-...");
    let shown: Vec<&str> = services
        .lines()
        .filter(|l| l.contains("3f2a8c1e-...:"))
        .collect();
    assert!(shown.len() >= 3, "{shown:?}");
    for line in shown {
        assert!(
            line.contains(&format!("{example}\"")) || line.ends_with(&example),
            "services.md shows a key that is not {example}: {line}"
        );
    }
    let workflows = read(&root().join("docs/workflows.md"));
    assert!(
        workflows.contains(&format!("`{element}`")),
        "workflows.md's forEach key is not {element}"
    );
}
