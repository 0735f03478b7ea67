//! Every command of README.md and `docs/*.md` runs as written, against a fresh `sas-local` the
//! document itself starts, with the current `sas-local` and `sasctl` on PATH; where a document
//! shows a command's output, the output is checked. A changed command, flag or route breaks
//! this test, not a newcomer.
//!
//! The convention is the fenced block's info string: its language, then tags.
//!
//! - ```` ```sh ````: commands, run as one bash script (`set -euo pipefail`) in the document's
//!   own empty folder (holding a copy of `workflows/`). The block fails on a non-zero exit, and
//!   when what it prints holds an API error (`{"error": {"code": …}}`) that the output shown
//!   after it does not show. The variables a block sets carry to the next command blocks, as
//!   in the reader's terminal (`TASK=$(…)` in one, `$TASK` in the next). A block that holds a
//!   task id (or the placeholder `<taskId>`) fails: the reader's task has another id, so a
//!   command must take it from a variable.
//! - ```` ```sh serve ````: starts `sas-local` (one command), in the background until the next
//!   `serve` block or the end of the document; the next block runs once it printed
//!   `sas is running`.
//! - ```` ```sh no-run=REASON ````: not run here, for one of [`NO_RUN`]'s reasons, which the
//!   document says in its own words.
//! - ```` ```LANG output ````: what the command block just before it prints (all of it, or the
//!   part shown: `…` stands for anything). Compared without whitespace, with ids and times
//!   standing for any id and time.
//! - ```` ```LANG file=PATH ````: a file the reader writes, written to PATH in the document's
//!   folder.
//!
//! Other blocks (JSON, YAML or text without a tag) are illustrations. What the test changes in a
//! command: `127.0.0.1:3000` becomes a free port (`SAS_LISTEN` and `SAS_ENDPOINT` tell
//! `sas-local` and `sasctl`); nothing else.

use pulldown_cmark::{CodeBlockKind, Event, Parser, Tag, TagEnd};
use regex::Regex;
use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::LazyLock;
use std::time::{Duration, Instant};

/// Why a command block may be left out, each with what the documents say instead.
const NO_RUN: &[(&str, &str)] = &[
    ("aws", "needs an AWS account or a deployed stack"),
    ("docker", "needs LocalStack, in Docker"),
    (
        "ci",
        "is CI's own step (the test command, the bench, building the release binaries)",
    ),
    (
        "long",
        "runs for minutes; a test runs a short version of it",
    ),
    ("live-service", "calls a live service of the reader's"),
];

/// The documents this test runs, each by its own `#[test]` below.
const DOCS: &[&str] = &[
    "README.md",
    "docs/api.md",
    "docs/capacity.md",
    "docs/code-map.md",
    "docs/configuration.md",
    "docs/deploying.md",
    "docs/guarantees.md",
    "docs/local.md",
    "docs/operating.md",
    "docs/services.md",
    "docs/testing.md",
    "docs/workflows.md",
];

/// The forms of a task id a command must not hold (any id: [`ID`]; and these).
const EXAMPLE_IDS: &[&str] = &["a065f4fc-…", "<taskId>"];

/// Around each command block: the variables earlier blocks set (`.vars`), and at its exit
/// those it set or changed, for the next.
const CARRY: &str = r#"__sas_vars_before=$(compgen -v)
if [ -f .vars ]; then source .vars; fi
__sas_save_vars() {
  local v
  for v in $(compgen -v); do
    case "$v" in __sas_*|BASH*|FUNCNAME|PIPESTATUS|LINENO|RANDOM|SECONDS|SRANDOM|EPOCH*|_) continue ;; esac
    if ! grep -qx "$v" <<<"$__sas_vars_before"; then declare -p "$v"; fi
  done >.vars.new 2>/dev/null && mv .vars.new .vars
}
trap __sas_save_vars EXIT
"#;

/// How long one block may run, and how long `sas-local` may take to start.
const BLOCK_TIMEOUT: Duration = Duration::from_secs(120);

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests package sits in the repository")
        .to_path_buf()
}

/// A fenced block of a document.
#[derive(Debug, Clone)]
struct Block {
    line: usize,
    lang: String,
    tags: Vec<String>,
    text: String,
}

impl Block {
    fn tag(&self, name: &str) -> bool {
        self.tags.iter().any(|t| t == name)
    }

    fn tag_value(&self, name: &str) -> Option<&str> {
        self.tags
            .iter()
            .find_map(|t| t.strip_prefix(name).and_then(|v| v.strip_prefix('=')))
    }

    fn is_command(&self) -> bool {
        matches!(self.lang.as_str(), "sh" | "bash" | "shell" | "console")
    }
}

fn blocks(text: &str) -> Vec<Block> {
    let mut out = vec![];
    let mut current: Option<Block> = None;
    for (event, range) in Parser::new(text).into_offset_iter() {
        match event {
            Event::Start(Tag::CodeBlock(CodeBlockKind::Fenced(info))) => {
                let mut words = info.split_whitespace().map(str::to_owned);
                current = Some(Block {
                    line: text[..range.start].lines().count() + 1,
                    lang: words.next().unwrap_or_default(),
                    tags: words.collect(),
                    text: String::new(),
                });
            }
            Event::Text(t) => {
                if let Some(b) = current.as_mut() {
                    b.text.push_str(&t);
                }
            }
            Event::End(TagEnd::CodeBlock) => out.extend(current.take()),
            _ => {}
        }
    }
    out
}

static ID: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}").expect("regex")
});
static TIME: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z").expect("regex"));
static API_ERROR: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r#""error"\s*:\s*\{\s*"code"\s*:\s*"([a-z_]+)""#).expect("regex"));

/// A text as the comparison sees it: ids and times replaced, no whitespace.
fn normalize(s: &str) -> String {
    let s = ID.replace_all(s, "<id>");
    let s = TIME.replace_all(&s, "<time>");
    s.chars().filter(|c| !c.is_whitespace()).collect()
}

/// Whether `actual` shows `expected`, where `…` in `expected` stands for anything. What is shown
/// starts at the start of a printed line and ends at the end of one, unless it starts or ends
/// with `…`: a shown line is all of its line (a list cut short does not pass).
fn shows(expected: &str, actual: &str) -> bool {
    // The printed text without whitespace, and where its lines start and end in it.
    let mut printed = String::new();
    let mut bounds = std::collections::HashSet::new();
    for line in actual.lines() {
        bounds.insert(printed.len());
        printed.push_str(&normalize(line));
        bounds.insert(printed.len());
    }
    let expected = normalize(expected);
    let parts: Vec<&str> = expected.split('…').collect();
    let last = parts.len() - 1;
    let mut from = 0;
    for (k, part) in parts.iter().enumerate() {
        if part.is_empty() {
            continue;
        }
        let found = printed[from..]
            .match_indices(part)
            .map(|(i, _)| from + i)
            .find(|&i| {
                (k != 0 || bounds.contains(&i)) && (k != last || bounds.contains(&(i + part.len())))
            });
        match found {
            Some(i) => from = i + part.len(),
            None => return false,
        }
    }
    true
}

/// A process group: a block's bash and whatever it started, ended together.
struct Group {
    child: Child,
    stdout: PathBuf,
    stderr: PathBuf,
}

impl Group {
    /// Runs `script` in `dir`; with `carry`, with the variables of the blocks before it, and
    /// keeping its own for those after it ([`CARRY`]).
    fn spawn(dir: &Path, env: &[(String, String)], script: &str, name: &str, carry: bool) -> Group {
        let path = dir.join(format!(".{name}.sh"));
        let carry = if carry { CARRY } else { "" };
        fs::write(&path, format!("set -euo pipefail\n{carry}{script}")).expect("writing a script");
        let stdout = dir.join(format!(".{name}.out"));
        let stderr = dir.join(format!(".{name}.err"));
        let child = Command::new("bash")
            .arg(&path)
            .current_dir(dir)
            .env_clear()
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(fs::File::create(&stdout).expect("stdout file"))
            .stderr(fs::File::create(&stderr).expect("stderr file"))
            .process_group(0)
            .spawn()
            .expect("bash runs");
        Group {
            child,
            stdout,
            stderr,
        }
    }

    fn output(&self) -> (String, String) {
        (
            fs::read_to_string(&self.stdout).unwrap_or_default(),
            fs::read_to_string(&self.stderr).unwrap_or_default(),
        )
    }

    /// Waits until the block exits (its status) or `until` holds of its stdout (`None`), for
    /// up to [`BLOCK_TIMEOUT`].
    fn wait(&mut self, until: impl Fn(&str) -> bool) -> Result<Option<i32>, String> {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("waiting on bash") {
                return Ok(Some(status.code().unwrap_or(-1)));
            }
            if until(&self.output().0) {
                return Ok(None);
            }
            if start.elapsed() > BLOCK_TIMEOUT {
                return Err(format!("still running after {BLOCK_TIMEOUT:?}"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        let pgid = self.child.id();
        let _ = Command::new("kill")
            .args(["-TERM", "--", &format!("-{pgid}")])
            .stderr(Stdio::null())
            .status();
        let _ = self.child.wait();
    }
}

/// Copies a folder's files (one level, as `workflows/` is).
fn copy_folder(from: &Path, to: &Path) {
    fs::create_dir_all(to).expect("creating a folder");
    for entry in fs::read_dir(from).expect("reading a folder") {
        let path = entry.expect("an entry").path();
        if path.is_file() {
            fs::copy(&path, to.join(path.file_name().expect("a name"))).expect("copying");
        }
    }
}

/// A folder with `sas-local` and `sasctl`: the binaries built from their main.rs in this
/// package, under their real names.
fn bin_dir() -> &'static Path {
    static DIR: LazyLock<tempfile::TempDir> = LazyLock::new(|| {
        let dir = tempfile::tempdir().expect("a temporary folder");
        for (name, exe) in [
            ("sas-local", env!("CARGO_BIN_EXE_doc-sas-local")),
            ("sasctl", env!("CARGO_BIN_EXE_doc-sasctl")),
        ] {
            std::os::unix::fs::symlink(exe, dir.path().join(name)).expect("a symlink");
        }
        dir
    });
    DIR.path()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// What running a document found: how many blocks ran, and each failure.
#[derive(Debug, Default)]
struct Report {
    ran: usize,
    outputs_checked: usize,
    not_run: usize,
    failures: Vec<String>,
}

/// Runs the command blocks of a Markdown text (`name` for the messages).
fn run_doc(name: &str, text: &str) -> Report {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let dir = dir.path();
    copy_folder(&root().join("workflows"), &dir.join("workflows"));
    let port = free_port();
    let address = format!("127.0.0.1:{port}");
    let env: Vec<(String, String)> = vec![
        (
            "PATH".into(),
            format!(
                "{}:{}",
                bin_dir().display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        ),
        ("HOME".into(), dir.display().to_string()),
        ("SAS_LISTEN".into(), address.clone()),
        ("SAS_ENDPOINT".into(), format!("http://{address}/operator")),
        // No instance metadata to ask for credentials on a CI runner.
        ("AWS_EC2_METADATA_DISABLED".into(), "true".into()),
        ("RUST_LOG".into(), "warn".into()),
    ];
    let mut report = Report::default();
    let mut server: Option<Group> = None;
    // The stdout of the last command block, with its place, for an output block after it.
    let mut last: Option<(usize, String)> = None;
    let all = blocks(text);
    for (i, block) in all.iter().enumerate() {
        let at = format!("{name}:{}", block.line);
        if let Some(path) = block.tag_value("file") {
            let path = dir.join(path);
            if let Some(parent) = path.parent() {
                fs::create_dir_all(parent).expect("a folder");
            }
            fs::write(&path, &block.text).expect("writing a file");
            continue;
        }
        if block.tag("output") {
            match last.take() {
                Some((_, out)) if shows(&block.text.replace("127.0.0.1:3000", &address), &out) => {
                    report.outputs_checked += 1
                }
                Some((from, out)) => report.failures.push(format!(
                    "{at}: the output shown is not what the block at line {from} printed:\n--- shown\n{}--- printed\n{out}",
                    block.text
                )),
                None => report.failures.push(format!(
                    "{at}: an output block that follows no command block"
                )),
            }
            continue;
        }
        if !block.is_command() {
            continue;
        }
        last = None;
        if let Some(reason) = block.tag_value("no-run") {
            if !NO_RUN.iter().any(|(r, _)| *r == reason) {
                report.failures.push(format!(
                    "{at}: no-run={reason} is not a known reason ({NO_RUN:?})"
                ));
            }
            report.not_run += 1;
            continue;
        }
        let script = block.text.replace("127.0.0.1:3000", &address);
        if let Some(id) = ID
            .find(&block.text)
            .map(|m| m.as_str())
            .or_else(|| EXAMPLE_IDS.iter().copied().find(|e| block.text.contains(e)))
        {
            report.failures.push(format!(
                "{at}: holds the task id {id}: the reader's task has another, so take it from a variable (TASK=$(…) in an earlier block)"
            ));
        }
        // The output block shown after this one, if any: the API errors it shows are expected.
        let shown = all
            .get(i + 1)
            .filter(|b| b.tag("output"))
            .map(|b| b.text.clone())
            .unwrap_or_default();
        report.ran += 1;
        let stdout = if block.tag("serve") {
            // One server at a time: the document stops the last one before it starts another.
            drop(server.take());
            let mut group =
                Group::spawn(dir, &env, &script, &format!("serve-{}", block.line), false);
            let result = group.wait(|out| out.contains("sas is running"));
            let (out, err) = group.output();
            match result {
                Ok(None) => {}
                Ok(Some(code)) => report.failures.push(format!(
                    "{at}: sas-local exited ({code}) before it served:\n{out}{err}"
                )),
                Err(e) => report
                    .failures
                    .push(format!("{at}: sas-local {e}:\n{out}{err}")),
            }
            server = Some(group);
            out
        } else {
            let mut group =
                Group::spawn(dir, &env, &script, &format!("block-{}", block.line), true);
            let result = group.wait(|_| false);
            let (out, err) = group.output();
            match result {
                Ok(Some(0)) => {}
                Ok(other) => report.failures.push(format!(
                    "{at}: exited {other:?}:\n--- script\n{script}--- stdout\n{out}--- stderr\n{err}"
                )),
                Err(e) => report.failures.push(format!(
                    "{at}: {e}:\n--- script\n{script}--- stdout\n{out}--- stderr\n{err}"
                )),
            }
            out
        };
        for code in API_ERROR.captures_iter(&stdout) {
            let code = &code[1];
            if !shown.contains(code) {
                report.failures.push(format!(
                    "{at}: answered the API error {code}, which the document does not show:\n{stdout}"
                ));
            }
        }
        last = Some((block.line, stdout));
    }
    drop(server);
    report
}

fn run(doc: &str) {
    let text = fs::read_to_string(root().join(doc)).expect("reading the document");
    let started = Instant::now();
    let report = run_doc(doc, &text);
    eprintln!(
        "{doc}: {} command blocks run, {} outputs checked, {} not run, in {:.1?}",
        report.ran,
        report.outputs_checked,
        report.not_run,
        started.elapsed()
    );
    assert!(
        report.failures.is_empty(),
        "{} of {doc}'s blocks do not work as written:\n\n{}",
        report.failures.len(),
        report.failures.join("\n\n")
    );
}

macro_rules! doc_tests {
    ($($name:ident => $doc:literal,)*) => {
        $(
            #[test]
            fn $name() {
                run($doc);
            }
        )*
        #[test]
        fn every_document_is_run() {
            let mut docs: Vec<String> = fs::read_dir(root().join("docs"))
                .expect("docs/")
                .map(|e| e.expect("an entry").path())
                .filter(|p| p.extension().is_some_and(|x| x == "md"))
                .map(|p| format!("docs/{}", p.file_name().expect("a name").to_string_lossy()))
                .collect();
            docs.push("README.md".into());
            docs.sort();
            let mut run: Vec<&str> = vec![$($doc),*];
            run.sort();
            assert_eq!(docs, run, "every document has its test here");
            assert_eq!(DOCS, run.as_slice());
        }
    };
}

doc_tests! {
    readme => "README.md",
    api => "docs/api.md",
    capacity => "docs/capacity.md",
    code_map => "docs/code-map.md",
    configuration => "docs/configuration.md",
    deploying => "docs/deploying.md",
    guarantees => "docs/guarantees.md",
    local => "docs/local.md",
    operating => "docs/operating.md",
    services => "docs/services.md",
    testing => "docs/testing.md",
    workflows => "docs/workflows.md",
}

/// The checker itself: a wrong route, a wrong shown output, a failing command and a hard-coded
/// task id each fail, and a right one passes; a variable carries to the next block.
#[test]
fn a_wrong_route_a_wrong_output_and_a_failing_command_fail() {
    let doc = "\
```sh serve
sas-local
```

```sh
curl -s http://127.0.0.1:3000/operator/workflows
```

```json output
{\"workflows\": […{\"latest\": 1, \"name\": \"loan-application\"}…]}
```

```sh
curl -s http://127.0.0.1:3000/operator/workflow
```

```sh
sasctl workflow list
```

```text output
NAME … LATEST
ecommerce-order … 7
```

```sh
sasctl no-such-command
```

```sh no-run=aws
sam deploy
```

```sh
TASK=$(curl -s -X POST http://127.0.0.1:3000/workflows/ecommerce-order/tasks \\
  -H 'Content-Type: application/json' \\
  -d '{\"customerId\":\"c-1\",\"items\":[{\"sku\":\"SKU-1\",\"quantity\":1}]}' | jq -r .taskId)
```

```sh
curl -s \"http://127.0.0.1:3000/tasks/$TASK\" | jq -r .workflow
```

```text output
ecommerce-order
```

```sh
curl -s -o /dev/null http://127.0.0.1:3000/tasks/a065f4fc-3b6c-47b3-93ea-9d453f6a3233
```
";
    let report = run_doc("planted", doc);
    assert_eq!((report.ran, report.not_run), (8, 1), "{report:#?}");
    assert_eq!(report.outputs_checked, 2, "{report:#?}");
    let failures = report.failures;
    assert_eq!(failures.len(), 4, "{failures:#?}");
    assert!(
        failures[3]
            .starts_with("planted:48: holds the task id a065f4fc-3b6c-47b3-93ea-9d453f6a3233"),
        "{failures:#?}"
    );
    assert!(
        failures[0].starts_with("planted:13: answered the API error route_not_found"),
        "{failures:#?}"
    );
    assert!(
        failures[1].starts_with("planted:21: the output shown is not what"),
        "{failures:#?}"
    );
    assert!(
        failures[2].starts_with("planted:26: exited Some(2)"),
        "{failures:#?}"
    );
}

#[test]
fn shown_output_matches_with_ellipses_ids_and_times() {
    let printed = "HTTP/1.1 202 Accepted\ncontent-type: application/json\ndate: x\n\n{\"taskId\":\"3e46174b-e296-449c-942f-1b7dcf602807\",\"at\":\"2026-01-02T03:04:05.123Z\"}";
    assert!(shows(
        "HTTP/1.1 202 Accepted\ncontent-type: application/json\n…\n{\"taskId\": \"a065f4fc-3b6c-47b3-93ea-9d453f6a3233\", \"at\": \"2025-11-23T17:53:31Z\"}",
        printed
    ));
    assert!(!shows("HTTP/1.1 201 Created", printed));
    assert!(!shows("{\"taskId\": 1}", printed));
    // A shown line is all of its line: a list cut short, or a line's middle, does not pass.
    let banner = "sas is running (in memory) on http://127.0.0.1:3000 with a v1, b v1, c v1\nCtrl-C stops it.";
    assert!(shows(banner, banner));
    assert!(!shows(
        "sas is running (in memory) on http://127.0.0.1:3000 with a v1, b v1",
        banner
    ));
    assert!(shows(
        "sas is running (in memory) on http://127.0.0.1:3000 with a v1, b v1…",
        banner
    ));
    assert!(!shows("running (in memory)", banner));
    assert!(shows("…running (in memory)…", banner));
    assert!(shows("…c v1 Ctrl-C stops it.", banner));
}
