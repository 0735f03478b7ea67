//! The product crate's module graph has no cycle: no module of `shared/src` uses (through any chain
//! of modules) an item of its own. A module is a file (`a/b.rs` or `a/b/mod.rs`: `a::b`); what it
//! names of its own children counts, what it declares with `mod` does not.
//!
//! The graph is read from the sources: every path a file names that starts at `crate`, `super`
//! or `self` (in a `use` or inline), and every `use` of a child module, is an edge from the file's
//! module to the module that defines the item. A re-export (`pub use`) is followed to the module
//! that defines the item, and is itself an edge of the module that re-exports. Comments (so
//! intra-doc links) and string literals are skipped; a file's inline modules are part of it.
//! Test code (`#[cfg(test)] mod ...`, inline or a file) is left out: a test may drive a module
//! through the ones built on it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// A module of the crate, as its path below `crate` (`[]`: the crate root, `lib.rs`).
type Module = Vec<String>;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Ident(String),
    /// `::`
    Path,
    Punct(char),
}

/// The tokens of Rust source, without comments, string, char and lifetime literals.
fn tokens(src: &str) -> Vec<Token> {
    let c: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < c.len() {
        let ch = c[i];
        let next = c.get(i + 1).copied();
        if ch == '/' && next == Some('/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && next == Some('*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if ch == 'r' && (next == Some('"') || next == Some('#')) && {
            let mut j = i + 1;
            while c.get(j) == Some(&'#') {
                j += 1;
            }
            c.get(j) == Some(&'"')
        } {
            // A raw string: r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while c[j] == '#' {
                hashes += 1;
                j += 1;
            }
            j += 1;
            loop {
                if j >= c.len() {
                    break;
                }
                if c[j] == '"' && (0..hashes).all(|k| c.get(j + 1 + k) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            i = j;
        } else if ch == '"' {
            i += 1;
            while i < c.len() && c[i] != '"' {
                i += if c[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
        } else if ch == '\'' {
            // A char literal ('x', '\n', '\u{..}') or a lifetime ('a).
            if next == Some('\\') {
                i += 2;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if c.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                i += 1;
                while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                    i += 1;
                }
            }
        } else if ch.is_alphabetic() || ch == '_' {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            out.push(Token::Ident(c[start..i].iter().collect()));
        } else if ch == ':' && next == Some(':') {
            out.push(Token::Path);
            i += 2;
        } else if ch.is_whitespace() || ch.is_ascii_digit() {
            i += 1;
        } else {
            out.push(Token::Punct(ch));
            i += 1;
        }
    }
    out
}

fn is_ident(t: Option<&Token>, s: &str) -> bool {
    matches!(t, Some(Token::Ident(x)) if x == s)
}

/// Reads a path tree at `*i` (`a::b::{c, d::e as f}`), returning each leaf path with the name it
/// is imported as (its last segment, or its `as`).
fn path_tree(
    t: &[Token],
    i: &mut usize,
    prefix: Vec<String>,
    out: &mut Vec<(Vec<String>, String)>,
) {
    let mut path = prefix;
    loop {
        match t.get(*i) {
            Some(Token::Ident(s)) => {
                path.push(s.clone());
                *i += 1;
                if t.get(*i) == Some(&Token::Path) {
                    *i += 1;
                    continue;
                }
                let name = if is_ident(t.get(*i), "as") {
                    *i += 1;
                    let n = match t.get(*i) {
                        Some(Token::Ident(n)) => n.clone(),
                        _ => String::new(),
                    };
                    *i += 1;
                    n
                } else {
                    path.last().cloned().unwrap_or_default()
                };
                out.push((path, name));
                return;
            }
            Some(Token::Punct('{')) => {
                *i += 1;
                while !matches!(t.get(*i), None | Some(Token::Punct('}'))) {
                    if t.get(*i) == Some(&Token::Punct(',')) {
                        *i += 1;
                        continue;
                    }
                    path_tree(t, i, path.clone(), out);
                }
                *i += 1;
                return;
            }
            Some(Token::Punct('*')) => {
                *i += 1;
                out.push((path, "*".into()));
                return;
            }
            _ => {
                out.push((path, String::new()));
                return;
            }
        }
    }
}

/// What one file says: the paths it names (relative to the module they are named in) and its
/// re-exports.
struct FileInfo {
    module: Module,
    /// (the inline module the path is named in, below the file's module; the path).
    paths: Vec<(Vec<String>, Vec<String>)>,
    /// Re-exported name -> the path re-exported (relative to the file's module).
    reexports: BTreeMap<String, Vec<String>>,
    /// The paths of its public glob re-exports (`pub use a::*`), relative to the file's module.
    globs: Vec<Vec<String>>,
    /// The file modules it declares under `#[cfg(test)]`.
    test_children: BTreeSet<String>,
}

/// Whether the item at `t[i]` is under `#[cfg(test)]` (perhaps with `pub` between).
fn under_cfg_test(t: &[Token], i: usize) -> bool {
    let mut end = i;
    if end > 0 && is_ident(t.get(end - 1), "pub") {
        end -= 1;
    }
    let want = [
        Token::Punct('#'),
        Token::Punct('['),
        Token::Ident("cfg".into()),
        Token::Punct('('),
        Token::Ident("test".into()),
        Token::Punct(')'),
        Token::Punct(']'),
    ];
    end >= want.len() && t[end - want.len()..end] == want
}

/// The names of the inline modules open at this point, outermost first (`stack`: name, brace
/// depth, whether it is a test module); `None` inside a test module.
fn enclosing(stack: &[(String, usize, bool)]) -> Option<Vec<String>> {
    if stack.iter().any(|(_, _, test)| *test) {
        return None;
    }
    Some(stack.iter().map(|(n, _, _)| n.clone()).collect())
}

fn read_file(module: Module, src: &str) -> FileInfo {
    let t = tokens(src);
    let mut info = FileInfo {
        module,
        paths: vec![],
        reexports: BTreeMap::new(),
        globs: vec![],
        test_children: BTreeSet::new(),
    };
    // The inline modules open at `i`, with the brace depth they opened at and whether they are
    // test code.
    let mut stack: Vec<(String, usize, bool)> = vec![];
    let mut depth = 0usize;
    let mut i = 0;
    while i < t.len() {
        match &t[i] {
            Token::Punct('{') => {
                depth += 1;
                i += 1;
            }
            Token::Punct('}') => {
                depth = depth.saturating_sub(1);
                if stack.last().is_some_and(|(_, d, _)| *d == depth) {
                    stack.pop();
                }
                i += 1;
            }
            Token::Ident(k) if k == "mod" => {
                let test = under_cfg_test(&t, i) || stack.iter().any(|(_, _, test)| *test);
                match (t.get(i + 1), t.get(i + 2)) {
                    (Some(Token::Ident(name)), Some(Token::Punct('{'))) => {
                        stack.push((name.clone(), depth, test));
                        depth += 1;
                        i += 3;
                    }
                    (Some(Token::Ident(name)), Some(Token::Punct(';'))) if test => {
                        info.test_children.insert(name.clone());
                        i += 3;
                    }
                    _ => i += 1,
                }
            }
            Token::Ident(k) if k == "use" => {
                let public = is_ident(i.checked_sub(1).and_then(|p| t.get(p)), "pub")
                    || matches!(
                        i.checked_sub(1).and_then(|p| t.get(p)),
                        Some(Token::Punct(')'))
                    );
                i += 1;
                if t.get(i) == Some(&Token::Path) {
                    i += 1;
                }
                let mut leaves = vec![];
                path_tree(&t, &mut i, vec![], &mut leaves);
                let Some(inner) = enclosing(&stack) else {
                    continue;
                };
                for (path, name) in leaves {
                    if public && inner.is_empty() && name == "*" {
                        info.globs.push(path.clone());
                    } else if public && inner.is_empty() && !name.is_empty() {
                        info.reexports.insert(name, path.clone());
                    }
                    info.paths.push((inner.clone(), path));
                }
            }
            Token::Ident(k)
                if ["crate", "super", "self"].contains(&k.as_str())
                    && t.get(i + 1) == Some(&Token::Path)
                    && i.checked_sub(1).and_then(|p| t.get(p)) != Some(&Token::Path) =>
            {
                let mut leaves = vec![];
                path_tree(&t, &mut i, vec![], &mut leaves);
                let Some(inner) = enclosing(&stack) else {
                    continue;
                };
                for (path, _) in leaves {
                    info.paths.push((inner.clone(), path));
                }
            }
            _ => i += 1,
        }
    }
    info
}

/// The crate's module graph: module -> the modules it uses.
type Graph = BTreeMap<Module, BTreeSet<Module>>;

/// Builds the graph of the files given as (path below `src`, source).
fn graph(files: &[(String, String)]) -> Graph {
    let mut infos: BTreeMap<Module, FileInfo> = files
        .iter()
        .map(|(path, src)| {
            let mut m: Module = path
                .trim_end_matches(".rs")
                .split('/')
                .map(str::to_owned)
                .collect();
            if m.last().is_some_and(|s| s == "mod") || m == ["lib"] {
                m.pop();
            }
            (m.clone(), read_file(m, src))
        })
        .collect();
    // Test code is no part of the graph: drop the files declared `#[cfg(test)]`, and theirs.
    let tests: Vec<Module> = infos
        .values()
        .flat_map(|f| {
            f.test_children.iter().map(|c| {
                let mut m = f.module.clone();
                m.push(c.clone());
                m
            })
        })
        .collect();
    infos.retain(|m, _| !tests.iter().any(|t| m.starts_with(t)));
    let is_module = |m: &Module| infos.contains_key(m);
    // Resolves `path`, named in file module `at` (inside its inline modules `inner`), to the
    // module defining what it names; `None` outside the crate.
    fn resolve(
        infos: &BTreeMap<Module, FileInfo>,
        is_module: &dyn Fn(&Module) -> bool,
        at: &Module,
        inner: &[String],
        path: &[String],
        hops: usize,
    ) -> Option<Module> {
        if hops > 32 {
            return None;
        }
        let mut m = at.clone();
        let mut inner = inner.len();
        let mut rest = path;
        match rest.first().map(String::as_str) {
            Some("crate") => {
                rest = &rest[1..];
                m = vec![];
                inner = 0;
            }
            Some("self") => rest = &rest[1..],
            Some("super") => {
                while rest.first().is_some_and(|s| s == "super") {
                    if inner > 0 {
                        inner -= 1;
                    } else {
                        m.pop()?;
                    }
                    rest = &rest[1..];
                }
            }
            Some(first) => {
                let mut child = m.clone();
                child.push(first.to_owned());
                if !is_module(&child) {
                    // An external crate, or an item in scope.
                    return None;
                }
            }
            None => return None,
        }
        if inner > 0 {
            // Inside an inline module of the file: its items belong to the file.
            return Some(m);
        }
        while let Some(seg) = rest.first() {
            let mut child = m.clone();
            child.push(seg.clone());
            if is_module(&child) {
                m = child;
                rest = &rest[1..];
                continue;
            }
            let Some(file) = infos.get(&m) else { break };
            if let Some(target) = file.reexports.get(seg) {
                let mut full = target.clone();
                full.extend(rest[1..].iter().cloned());
                return resolve(infos, is_module, &m, &[], &full, hops + 1);
            }
            // A glob re-export: the first glob whose module names `seg` (a child or a
            // re-export) takes it; the module of the only glob takes any other name.
            let through = file.globs.iter().find_map(|glob| {
                let at = resolve(infos, is_module, &m, &[], glob, hops + 1)?;
                let mut child = at.clone();
                child.push(seg.clone());
                let names = is_module(&child)
                    || infos
                        .get(&at)
                        .is_some_and(|f| f.reexports.contains_key(seg));
                names.then_some(glob)
            });
            let glob = through.or(match file.globs.as_slice() {
                [only] => Some(only),
                _ => None,
            });
            if let Some(glob) = glob {
                let mut full = glob.clone();
                full.extend(rest.iter().cloned());
                return resolve(infos, is_module, &m, &[], &full, hops + 1);
            }
            break;
        }
        Some(m)
    }
    let mut g = Graph::new();
    for (m, info) in &infos {
        let edges = g.entry(m.clone()).or_default();
        for (inner, path) in &info.paths {
            if let Some(target) = resolve(&infos, &is_module, &info.module, inner, path, 0)
                && target != *m
            {
                edges.insert(target);
            }
        }
    }
    g
}

fn name(m: &Module) -> String {
    if m.is_empty() {
        "crate".into()
    } else {
        m.join("::")
    }
}

/// Every cycle a depth-first walk of `g` closes, as `a -> b -> a`.
fn cycles(g: &Graph) -> Vec<String> {
    fn walk(
        g: &Graph,
        m: &Module,
        on_path: &mut Vec<Module>,
        done: &mut BTreeSet<Module>,
        found: &mut Vec<String>,
    ) {
        if let Some(at) = on_path.iter().position(|p| p == m) {
            let mut cycle: Vec<String> = on_path[at..].iter().map(name).collect();
            cycle.push(name(m));
            found.push(cycle.join(" -> "));
            return;
        }
        if !done.insert(m.clone()) {
            return;
        }
        on_path.push(m.clone());
        for next in g.get(m).into_iter().flatten() {
            walk(g, next, on_path, done, found);
        }
        on_path.pop();
    }
    let mut found = vec![];
    let mut done = BTreeSet::new();
    for m in g.keys() {
        walk(g, m, &mut vec![], &mut done, &mut found);
    }
    found
}

/// The sources of `src`, as (path below it, text).
fn crate_sources() -> Vec<(String, String)> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<(String, String)>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .expect("src is readable")
            .map(|e| e.expect("a directory entry").path())
            .collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                walk(root, &path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path
                    .strip_prefix(root)
                    .expect("under src")
                    .to_string_lossy()
                    .replace('\\', "/");
                let src = std::fs::read_to_string(&path).expect("a readable source file");
                out.push((rel, src));
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = vec![];
    walk(&root, &root, &mut out);
    out
}

#[test]
fn no_module_of_the_product_crate_imports_itself() {
    let g = graph(&crate_sources());
    assert!(
        g.values().map(BTreeSet::len).sum::<usize>() >= 50,
        "the graph was read: {g:?}"
    );
    let found = cycles(&g);
    assert!(
        found.is_empty(),
        "import cycles in shared/src:\n  {}",
        found.join("\n  ")
    );
}

#[test]
fn a_cycle_through_any_kind_of_path_is_found() {
    // The fixtures are a crate whose root re-exports all of its `domain`, as sas's does.
    let files = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
        let mut out = vec![(
            "lib.rs".to_string(),
            "pub mod domain; pub use domain::*;".to_string(),
        )];
        out.extend(
            pairs
                .iter()
                .map(|(p, s)| (format!("domain/{p}"), s.to_string())),
        );
        out
    };
    let root = "pub mod a; pub mod b; pub mod c; pub use a::A; pub use c::{x::X, C as Sea};";
    // Through the root's re-export, from a test module, a grouped use and an inline path.
    let cases = [
        ("use super::b::B; pub struct A;", "use crate::A;", ""),
        (
            "pub struct A; fn f() { crate::domain::b::g(); }",
            "fn g() -> super::A { todo!() }",
            "",
        ),
        (
            "pub struct A; use super::{c::{C, x}};",
            "",
            "pub mod x; use crate::A;",
        ),
        (
            "pub struct A; mod inner { use super::super::b::B; }",
            "use crate::Sea;",
            "pub struct C; use super::a::A;",
        ),
        (
            "pub struct A; fn f() -> crate::X { todo!() }",
            "",
            "pub mod x;",
        ),
    ];
    for (n, (a, b, c)) in cases.iter().enumerate() {
        let mut srcs = files(&[("mod.rs", root), ("a.rs", a), ("b.rs", b), ("c/mod.rs", c)]);
        srcs.push((
            "domain/c/x.rs".into(),
            "use crate::domain::a::A; pub struct X;".into(),
        ));
        let found = cycles(&graph(&srcs));
        assert!(
            !found.is_empty(),
            "case {n}: no cycle found in {:?}",
            graph(&srcs)
        );
        assert!(
            found
                .iter()
                .all(|c| c.starts_with("domain::a") || c.contains("-> domain::a")),
            "case {n}: {found:?}"
        );
    }
    // Comments, strings, test code and `mod` declarations are no edges; a re-export is
    // followed.
    let clean = files(&[
        ("mod.rs", root),
        (
            "a.rs",
            "pub struct A; // use super::b::B;\n/// [`crate::C`]\nconst S: &str = \"crate::C\";\n#[cfg(test)] mod tests { use super::super::b::B; }\n#[cfg(test)] mod kit;",
        ),
        ("a/kit.rs", "use crate::domain::b::B;"),
        ("b.rs", "use crate::A; use super::Sea;"),
        ("c/mod.rs", "pub mod x; pub struct C;"),
        ("c/x.rs", "use super::C;"),
    ]);
    let g = graph(&clean);
    assert_eq!(cycles(&g), Vec::<String>::new(), "{g:?}");
    let module = |path: &str| -> Module { path.split("::").map(str::to_owned).collect() };
    let b = &g[&module("domain::b")];
    assert!(
        b.contains(&module("domain::a")) && b.contains(&module("domain::c")),
        "{g:?}"
    );
}
