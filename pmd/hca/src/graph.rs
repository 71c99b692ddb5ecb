//! The crate's modules import each other without a circle: a name two modules need lives below
//! both (`types.rs`, `error.rs`), so each module can be read, and tested, on top of the ones it
//! uses. This test reads the sources and fails with the circle it finds.
//!
//! An edge is a `crate::` path outside comments and outside a file's trailing test module; a
//! child module (`sq/bf.rs`) counts as its parent, and this test-only module is left out. A name the crate root re-exports
//! counts as its defining module; any other root name as the root, which uses every module.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

type Graph = BTreeMap<String, BTreeSet<String>>;

/// The source of `path` without comments and without its trailing test module (test-only
/// imports, such as a test of `shape` decoding WQEs with `send`, are no part of the crate).
fn code(path: &Path) -> String {
    let text = std::fs::read_to_string(path).expect("readable source");
    let text = text
        .split("\n#[cfg(test)]\nmod tests")
        .next()
        .unwrap_or_default();
    text.lines()
        .map(|l| l.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

fn ident(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The first names after each `crate::`: `crate::a::b` gives `a`, `crate::{a, b::c}` gives `a`
/// and `b`.
fn crate_names(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    for part in code.split("crate::").skip(1) {
        if let Some(group) = part.strip_prefix('{') {
            let mut depth = 0;
            let mut item = String::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        out.push(ident(item.trim()).to_string());
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                if depth == 0 {
                    item.push(c);
                }
            }
            out.push(ident(item.trim()).to_string());
        } else {
            out.push(ident(part).to_string());
        }
    }
    out.retain(|n| !n.is_empty() && n != "self");
    out
}

/// Names the root re-exports, by the module that defines them (`pub use m::{A, B};`).
fn reexports(lib: &str) -> BTreeMap<String, String> {
    let mut map = BTreeMap::new();
    for stmt in lib.split(';') {
        let Some(rest) = stmt.trim().strip_prefix("pub use ") else {
            continue;
        };
        let Some((module, names)) = rest.split_once("::") else {
            continue;
        };
        for n in names.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            if !n.is_empty() {
                map.insert(n.to_string(), module.trim().to_string());
            }
        }
    }
    map
}

fn graph(src: &Path) -> Graph {
    let this = module_path!().rsplit("::").next().expect("a module path");
    let mut files: BTreeMap<String, Vec<std::path::PathBuf>> = BTreeMap::new();
    for e in std::fs::read_dir(src).expect("src/ readable") {
        let p = e.expect("dir entry").path();
        let stem = p.file_stem().unwrap().to_string_lossy().into_owned();
        if p.is_dir() {
            for c in std::fs::read_dir(&p).expect("module dir readable") {
                files
                    .entry(stem.clone())
                    .or_default()
                    .push(c.unwrap().path());
            }
        } else if p.extension().is_some_and(|x| x == "rs") && stem != "lib" && stem != this {
            files.entry(stem).or_default().push(p);
        }
    }
    let roots = reexports(&code(&src.join("lib.rs")));
    let modules: BTreeSet<String> = files.keys().cloned().collect();
    let mut g = Graph::new();
    for (m, paths) in &files {
        let edges = g.entry(m.clone()).or_default();
        for p in paths {
            for n in crate_names(&code(p)) {
                let to = if modules.contains(&n) {
                    n
                } else {
                    roots.get(&n).cloned().unwrap_or_else(|| "lib".into())
                };
                if &to != m {
                    edges.insert(to);
                }
            }
        }
    }
    g.insert("lib".into(), modules);
    g
}

/// A circle of `g`, as the modules along it, if there is one.
fn circle(g: &Graph) -> Option<Vec<String>> {
    fn visit(g: &Graph, n: &str, path: &mut Vec<String>, done: &mut BTreeSet<String>) -> bool {
        if let Some(at) = path.iter().position(|p| p == n) {
            path.drain(..at);
            path.push(n.to_string());
            return true;
        }
        if done.contains(n) {
            return false;
        }
        path.push(n.to_string());
        for m in g.get(n).into_iter().flatten() {
            if visit(g, m, path, done) {
                return true;
            }
        }
        path.pop();
        done.insert(n.to_string());
        false
    }
    let mut done = BTreeSet::new();
    for n in g.keys() {
        let mut path = Vec::new();
        if visit(g, n, &mut path, &mut done) {
            return Some(path);
        }
    }
    None
}

#[test]
fn finds_a_circle_and_a_root_name() {
    let two: Graph = [("a", "b"), ("b", "a")]
        .iter()
        .map(|(f, t)| (f.to_string(), BTreeSet::from([t.to_string()])))
        .collect();
    assert_eq!(circle(&two).unwrap(), ["a", "b", "a"]);
    assert_eq!(
        crate_names("use crate::{a::X, b};\nlet y = crate::c::f();"),
        ["a", "b", "c"]
    );
    assert_eq!(reexports("pub use m::{A, B};\nuse x::C;")["B"], "m");
}

#[test]
fn module_graph_has_no_circle() {
    let g = graph(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    assert!(g.len() > 20, "read the modules of src/: {:?}", g.keys());
    if let Some(c) = circle(&g) {
        panic!("import circle: {}", c.join(" -> "));
    }
}
