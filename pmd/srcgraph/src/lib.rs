//! Test support: the modules of a crate import each other without a circle, so each can be
//! read, and tested, on top of the ones it uses. [`check`] reads a crate's `src/` and says
//! which circles it finds; each crate calls it from a unit test.
//!
//! An edge is a `crate::`, `super::` or `self::` path, or a path from a child module by its
//! bare name (`soft::Soft` in `hw/mod.rs`), outside comments and outside a file's
//! trailing test module (test-only imports are no part of the crate). A module is a file
//! (`a.rs`, `a/mod.rs`, `a/b.rs` is `a::b`), seen at a depth: at depth 1 a child module
//! counts as its top-level parent, at `usize::MAX` every file is a module of its own. A name the crate root re-exports counts as its defining
//! module; any other root name as the root, which uses every module.
#![forbid(unsafe_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Modules and the modules each uses, by name (`lib` is the crate root).
pub type Graph = BTreeMap<String, BTreeSet<String>>;

/// `text` without comments.
fn uncommented(text: &str) -> String {
    text.lines()
        .map(|l| l.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

/// `text` without its trailing test module (test-only imports, such as a test decoding with
/// a module above, are no part of the crate).
fn code(text: &str) -> &str {
    text.split("\n#[cfg(test)]\nmod tests")
        .next()
        .unwrap_or_default()
}

fn ident(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The paths of a use tree that starts at `s`: `a::b::C` gives `[a, b, C]`, `{a::X, b}` gives
/// `[a, X]` and `[b]`.
fn use_tree(s: &str) -> Vec<Vec<String>> {
    let s = s.trim_start();
    if let Some(group) = s.strip_prefix('{') {
        let mut out = Vec::new();
        let mut depth = 0;
        let mut start = 0;
        for (i, c) in group.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => {
                    out.extend(use_tree(&group[start..i]));
                    break;
                }
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    out.extend(use_tree(&group[start..i]));
                    start = i + 1;
                }
                _ => {}
            }
        }
        return out;
    }
    let head = ident(s);
    if head.is_empty() {
        return Vec::new();
    }
    let rest = &s[head.len()..];
    match rest.trim_start().strip_prefix("::") {
        Some(tail) => {
            let subs = use_tree(tail);
            if subs.is_empty() {
                return vec![vec![head.to_string()]];
            }
            subs.into_iter()
                .map(|mut p| {
                    p.insert(0, head.to_string());
                    p
                })
                .collect()
        }
        None => vec![vec![head.to_string()]],
    }
}

/// Every path in `code` that starts at `anchor` (`crate`, `super` or `self`), without the
/// anchor. `super::super::x` gives `[super, x]` for the anchor `super`.
fn paths(code: &str, anchor: &str) -> Vec<Vec<String>> {
    let pat = format!("{anchor}::");
    let mut out = Vec::new();
    for (at, _) in code.match_indices(&pat) {
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        // `super::super::x` is one path, found at its first `super`.
        if anchor == "super" && code[..at].ends_with("super::") {
            continue;
        }
        out.extend(use_tree(&code[at + pat.len()..]));
    }
    for p in &mut out {
        p.retain(|s| s != "self");
    }
    out.retain(|p| !p.is_empty());
    out
}

/// The statements that re-export (`pub use`, `pub(crate) use`, `pub(super) use`).
const REEXPORT: [&str; 3] = ["pub use ", "pub(crate) use ", "pub(super) use "];

/// Names a module re-exports (`pub use m::{A, B};`), by the path they come from as written
/// (`[m, A]`; `pub use other as o;` gives `[other]`).
fn reexports(code: &str) -> BTreeMap<String, Vec<String>> {
    let mut map = BTreeMap::new();
    for stmt in code.split(';') {
        let stmt = stmt.trim();
        let Some(rest) = REEXPORT.iter().find_map(|p| stmt.strip_prefix(p)) else {
            continue;
        };
        if let Some((from, to)) = rest.split_once(" as ") {
            let from = from.split("::").map(|s| s.trim().to_string()).collect();
            map.insert(ident(to.trim()).to_string(), from);
            continue;
        }
        for p in use_tree(rest) {
            if let Some(last) = p.last() {
                map.insert(last.clone(), p.clone());
            }
        }
    }
    map
}

/// `code` without its re-exports: passing a name on is no use of it.
fn without_reexports(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(at) = REEXPORT.iter().filter_map(|p| rest.find(p)).min() {
        out.push_str(&rest[..at]);
        rest = rest[at..].split_once(';').map_or("", |(_, r)| r);
    }
    out.push_str(rest);
    out
}

/// Macros a file exports at the crate root (`#[macro_export] macro_rules! m`).
fn exported_macros(code: &str) -> Vec<String> {
    code.split("#[macro_export]")
        .skip(1)
        .filter_map(|rest| rest.trim_start().strip_prefix("macro_rules!"))
        .map(|rest| ident(rest.trim_start()).to_string())
        .collect()
}

/// Child modules a file declares for tests only (`#[cfg(test)] mod tests;`).
fn test_modules(code: &str) -> Vec<String> {
    code.split("#[cfg(test)]")
        .skip(1)
        .filter_map(|rest| rest.trim_start().strip_prefix("mod "))
        .filter(|rest| ident(rest).len() < rest.len() && rest[ident(rest).len()..].starts_with(';'))
        .map(|rest| ident(rest).to_string())
        .collect()
}

/// The `.rs` files under `dir`, by module path (`a::b`); `mod.rs` names its directory.
fn files(dir: &Path, prefix: &[String], out: &mut BTreeMap<Vec<String>, PathBuf>) {
    for e in std::fs::read_dir(dir).expect("source directory readable") {
        let p = e.expect("dir entry").path();
        let stem = p.file_stem().unwrap().to_string_lossy().into_owned();
        let mut m = prefix.to_vec();
        if p.is_dir() {
            m.push(stem);
            files(&p, &m, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            if !(stem == "mod" || (prefix.is_empty() && stem == "lib")) {
                m.push(stem);
            }
            out.insert(m, p);
        }
    }
}

fn name(m: &[String], depth: usize) -> String {
    if m.is_empty() {
        "lib".into()
    } else {
        m[..m.len().min(depth)].join("::")
    }
}

/// The module graph of the crate whose sources are in `src`, modules seen at `depth`.
pub fn graph(src: &Path, depth: usize) -> Graph {
    assert!(depth > 0, "depth 1 or more");
    let mut all = BTreeMap::new();
    files(src, &[], &mut all);
    let full: BTreeMap<Vec<String>, String> = all
        .iter()
        .map(|(m, p)| {
            let text = std::fs::read_to_string(p).expect("readable source");
            (m.clone(), uncommented(&text))
        })
        .collect();
    let text: BTreeMap<Vec<String>, &str> =
        full.iter().map(|(m, t)| (m.clone(), code(t))).collect();
    // Test-only modules are no part of the crate.
    let tests: Vec<Vec<String>> = full
        .iter()
        .flat_map(|(m, t)| {
            test_modules(t).into_iter().map(move |c| {
                let mut m = m.clone();
                m.push(c);
                m
            })
        })
        .collect();
    all.retain(|m, _| !tests.iter().any(|t| m.starts_with(t)));
    let modules: BTreeSet<Vec<String>> = all.keys().cloned().collect();
    let root = Vec::new();
    // Names passed on by each module, by where they come from as written; exported macros are
    // the root's names.
    let mut rex: BTreeMap<Vec<String>, BTreeMap<String, Vec<String>>> = modules
        .iter()
        .map(|m| (m.clone(), reexports(text[m])))
        .collect();
    for (m, t) in &text {
        for mac in exported_macros(t) {
            let mut from = vec!["crate".to_string()];
            from.extend(m.iter().cloned());
            from.push(mac.clone());
            rex.entry(root.clone()).or_default().insert(mac, from);
        }
    }
    let mut g = Graph::new();
    for m in all.keys() {
        let from = name(m, depth);
        let text = without_reexports(text[m]);
        let mut anchors = vec!["crate", "super", "self"];
        let children: Vec<&String> = modules
            .iter()
            .filter(|c| c.len() == m.len() + 1 && c.starts_with(m))
            .map(|c| c.last().expect("a child has a name"))
            .collect();
        anchors.extend(children.iter().map(|c| c.as_str()));
        let edges = g.entry(from.clone()).or_default();
        for anchor in anchors {
            for p in paths(&text, anchor) {
                let mut written = vec![anchor.to_string()];
                written.extend(p);
                let Some(to) = resolve(&modules, &rex, m, &written, 0) else {
                    continue;
                };
                let to = name(&to, depth);
                if to != from {
                    edges.insert(to);
                }
            }
        }
    }
    let every: BTreeSet<String> = g.keys().filter(|k| *k != "lib").cloned().collect();
    g.entry("lib".into()).or_default().extend(every);
    g
}

/// The path `written` in module `m`, from the crate root; `None` for another crate's.
fn absolute(
    modules: &BTreeSet<Vec<String>>,
    m: &[String],
    written: &[String],
) -> Option<Vec<String>> {
    let first = written.first()?;
    let mut child = m.to_vec();
    child.push(first.clone());
    Some(match first.as_str() {
        "crate" => written[1..].to_vec(),
        "self" => m.iter().chain(&written[1..]).cloned().collect(),
        "super" => {
            let ups = written.iter().take_while(|s| *s == "super").count();
            let base = &m[..m.len().saturating_sub(ups)];
            base.iter().chain(&written[ups..]).cloned().collect()
        }
        _ if modules.contains(&child) => m.iter().chain(written).cloned().collect(),
        _ => return None,
    })
}

/// The module the path `written` in `m` names: the longest prefix that is a module, unless the
/// name after it is one that module re-exports (then the module it comes from); a name of
/// the root that is not re-exported is the root's. `None` for another crate's name.
fn resolve(
    modules: &BTreeSet<Vec<String>>,
    rex: &BTreeMap<Vec<String>, BTreeMap<String, Vec<String>>>,
    m: &[String],
    written: &[String],
    hops: usize,
) -> Option<Vec<String>> {
    let t = absolute(modules, m, written)?;
    let known = (0..=t.len())
        .rev()
        .find(|&n| modules.contains(&t[..n]))
        .unwrap_or(0);
    let owner = &t[..known];
    if let Some(from) = t.get(known).and_then(|n| rex.get(owner)?.get(n)) {
        // A chain of re-exports is short; a loop of them is no module's.
        if hops < 8 {
            let mut from = from.clone();
            from.extend(t[known + 1..].iter().cloned());
            return resolve(modules, rex, owner, &from, hops + 1);
        }
    }
    Some(owner.to_vec())
}

/// The strongly connected parts of `g` with more than one module (each holds a circle).
pub fn knots(g: &Graph) -> Vec<BTreeSet<String>> {
    // Tarjan's algorithm, recursive: module graphs are small.
    struct T<'g> {
        g: &'g Graph,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on: BTreeSet<&'g str>,
        out: Vec<BTreeSet<String>>,
    }
    fn visit<'g>(t: &mut T<'g>, n: &'g str) {
        let i = t.index.len();
        t.index.insert(n, i);
        t.low.insert(n, i);
        t.stack.push(n);
        t.on.insert(n);
        for m in t.g.get(n).into_iter().flatten() {
            let m = m.as_str();
            if !t.index.contains_key(m) {
                visit(t, m);
                let l = t.low[m].min(t.low[n]);
                t.low.insert(n, l);
            } else if t.on.contains(m) {
                let l = t.index[m].min(t.low[n]);
                t.low.insert(n, l);
            }
        }
        if t.low[n] == t.index[n] {
            let mut part = BTreeSet::new();
            while let Some(m) = t.stack.pop() {
                t.on.remove(m);
                part.insert(m.to_string());
                if m == n {
                    break;
                }
            }
            if part.len() > 1 {
                t.out.push(part);
            }
        }
    }
    let mut t = T {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for n in g.keys() {
        if !t.index.contains_key(n.as_str()) {
            visit(&mut t, n);
        }
    }
    t.out.sort();
    t.out
}

/// One circle through the modules of `knot`, as the modules along it (first = last).
pub fn circle_in(g: &Graph, knot: &BTreeSet<String>) -> Vec<String> {
    let start = knot.first().expect("a non-empty knot").clone();
    // Breadth-first from `start` back to it, inside the knot.
    let mut prev: BTreeMap<String, String> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([start.clone()]);
    while let Some(n) = queue.pop_front() {
        for m in g
            .get(&n)
            .into_iter()
            .flatten()
            .filter(|m| knot.contains(*m))
        {
            if *m == start {
                let mut path = vec![start.clone(), n.clone()];
                let mut at = n.clone();
                while let Some(p) = prev.get(&at) {
                    path.push(p.clone());
                    at = p.clone();
                }
                path.reverse();
                if path.len() > 2 && path[0] == path[1] {
                    path.remove(0);
                }
                return path;
            }
            if !prev.contains_key(m) && *m != start {
                prev.insert(m.clone(), n.clone());
                queue.push_back(m.clone());
            }
        }
    }
    unreachable!("a knot holds a circle")
}

/// Checks the crate in `src` (modules at `depth`): every knot must be one of `allowed` (each
/// given as its modules), and every allowed one must still be there, so that the list is
/// shortened when a circle goes. Returns the modules read, or what is wrong.
pub fn check(src: &Path, depth: usize, allowed: &[&[&str]]) -> Result<usize, String> {
    let g = graph(src, depth);
    let allowed: Vec<BTreeSet<String>> = allowed
        .iter()
        .map(|k| k.iter().map(|s| s.to_string()).collect())
        .collect();
    let found = knots(&g);
    let mut wrong = Vec::new();
    for k in found.iter().filter(|k| !allowed.contains(k)) {
        wrong.push(format!("import circle: {}", circle_in(&g, k).join(" -> ")));
    }
    for k in allowed.iter().filter(|k| !found.contains(k)) {
        wrong.push(format!(
            "allowed circle {k:?} is gone: take it off the list"
        ));
    }
    if wrong.is_empty() {
        Ok(g.len())
    } else {
        Err(wrong.join("\n"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(edges: &[(&str, &str)]) -> Graph {
        let mut g = Graph::new();
        for (f, t) in edges {
            g.entry(f.to_string()).or_default().insert(t.to_string());
            g.entry(t.to_string()).or_default();
        }
        g
    }

    #[test]
    fn finds_knots_and_a_circle_in_each() {
        let two = g(&[("a", "b"), ("b", "a"), ("b", "c")]);
        let k = knots(&two);
        assert_eq!(k, [BTreeSet::from(["a".to_string(), "b".to_string()])]);
        assert_eq!(circle_in(&two, &k[0]), ["a", "b", "a"]);
        let three = g(&[("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")]);
        assert_eq!(circle_in(&three, &knots(&three)[0]), ["a", "b", "c", "a"]);
        assert!(knots(&g(&[("a", "b"), ("b", "c"), ("a", "c")])).is_empty());
    }

    #[test]
    fn reads_paths_and_root_names() {
        let code = "use crate::{a::X, b::{c::Y, Z}};\nlet y = crate::c::f(); mycrate::d;";
        assert_eq!(
            paths(code, "crate"),
            [
                vec!["a", "X"],
                vec!["b", "c", "Y"],
                vec!["b", "Z"],
                vec!["c", "f"]
            ]
        );
        assert_eq!(
            paths("super::super::x::Y", "super"),
            [vec!["super", "x", "Y"]]
        );
        let r = reexports("pub use m::{A, B};\nuse x::C;\npub use other as o;");
        assert_eq!(r["B"], ["m", "B"]);
        assert!(!r.contains_key("C"));
        assert_eq!(r["o"], ["other"]);
        assert_eq!(
            without_reexports("use a::X;\npub use b::Y;\nfn f() {}"),
            "use a::X;\n\nfn f() {}"
        );
        assert_eq!(
            exported_macros("#[macro_export]\nmacro_rules! say {"),
            ["say"]
        );
        assert_eq!(
            test_modules("#[cfg(test)]\nmod t;\n#[cfg(test)]\nmod u {"),
            ["t"]
        );
    }

    #[test]
    fn reads_a_crate_at_each_depth() {
        let src = std::env::temp_dir().join(format!("srcgraph-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&src);
        std::fs::create_dir_all(src.join("a")).unwrap();
        let put = |p: &str, s: &str| std::fs::write(src.join(p), s).unwrap();
        put(
            "lib.rs",
            "mod a;\nmod b;\npub use b::B;\n#[cfg(test)]\nmod t;\nfn f() {}\n",
        );
        put("t.rs", "use crate::f;\n");
        put(
            "a/mod.rs",
            "mod x;\nmod y;\npub use y::Q;\nfn g() { y::h() }\n",
        );
        put("a/x.rs", "use super::y::Y;\nuse crate::B;\n");
        put("a/y.rs", "// crate::a::x\n");
        put(
            "b.rs",
            "use crate::a::Q;\n#[cfg(test)]\nmod tests {\n use crate::a::x; }\n",
        );
        let one = graph(&src, 1);
        let set = |s: &[&str]| s.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
        assert_eq!(one["a"], set(&["b"]));
        assert_eq!(one["b"], set(&["a"]));
        assert_eq!(one["lib"].len(), 2, "the test-only module left out");
        let two = graph(&src, 2);
        assert_eq!(two["a"], set(&["a::y"]), "a child by its bare name");
        assert_eq!(two["a::x"], set(&["a::y", "b"]));
        assert!(two["a::y"].is_empty(), "comments are no use");
        assert_eq!(two["b"], set(&["a::y"]), "a re-exported name by its module");
        assert!(check(&src, 2, &[]).is_ok());
        let e = check(&src, 1, &[]).unwrap_err();
        assert!(e.contains("import circle: a -> b -> a"), "{e}");
        assert_eq!(check(&src, 1, &[&["a", "b"]]), Ok(3));
        let e = check(&src, 2, &[&["a", "b"]]).unwrap_err();
        assert!(e.contains("is gone"), "{e}");
        std::fs::remove_dir_all(&src).unwrap();
    }
}
