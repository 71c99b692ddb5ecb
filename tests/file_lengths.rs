//! No Rust source file in `pmd/`, `ffi/` or `apps/` is longer than 800 lines, so that a file
//! keeps to one concern a reader can hold. The bindings bindgen writes (`ffi/sdk/v*.rs`) are
//! generated, not read, and are left out.

use std::fs;
use std::path::{Path, PathBuf};

const MAX_LINES: usize = 800;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = e.expect("directory entry").path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if path.is_dir() {
            if name != "target" && !name.starts_with('.') {
                rust_files(&path, out);
            }
        } else if name.ends_with(".rs") {
            out.push(path);
        }
    }
}

fn generated(rel: &Path) -> bool {
    rel.starts_with("ffi/sdk")
        && rel
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with('v'))
}

#[test]
fn no_source_file_is_over_800_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for top in ["pmd", "ffi", "apps"] {
        rust_files(&root.join(top), &mut files);
    }
    assert!(
        files.len() > 100,
        "found only {} source files under pmd/, ffi/ and apps/",
        files.len()
    );
    let mut long: Vec<String> = files
        .iter()
        .filter_map(|p| {
            let rel = p.strip_prefix(root).expect("under the root");
            if generated(rel) {
                return None;
            }
            let n = fs::read_to_string(p).expect("readable").lines().count();
            (n > MAX_LINES).then(|| format!("{} ({n} lines)", rel.display()))
        })
        .collect();
    long.sort();
    assert!(
        long.is_empty(),
        "source files over {MAX_LINES} lines; split them by concern:\n  {}",
        long.join("\n  ")
    );
}
