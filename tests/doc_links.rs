//! Every relative link in `README.md` and `doc/*.md` leads somewhere: the file or directory it
//! names exists, and a `#anchor` names a heading of the markdown page it points to (anchors as
//! GitHub makes them from the heading's text). Links with a scheme (`https:`, `mailto:`) are not
//! followed; links inside code blocks and code spans are not links.

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};

/// The pages checked: the README and every markdown page of `doc/`, by path from `root`.
fn pages(root: &Path) -> Vec<PathBuf> {
    let mut v = vec![PathBuf::from("README.md")];
    let mut docs: Vec<PathBuf> = fs::read_dir(root.join("doc"))
        .expect("doc/ is readable")
        .map(|e| e.expect("doc/ entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .map(|p| p.strip_prefix(root).expect("under the root").to_path_buf())
        .collect();
    docs.sort();
    v.extend(docs);
    v
}

/// The lines of a markdown page that are prose: fenced and indented code blocks left out, and
/// code spans blanked, so that only real links remain.
fn prose_lines(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fence: Option<String> = None;
    let mut prev_blank = true;
    let mut in_indented = false;
    for line in text.lines() {
        let trimmed = line.trim_start();
        if let Some(f) = &fence {
            if trimmed.starts_with(f.as_str()) {
                fence = None;
            }
            prev_blank = false;
            continue;
        }
        if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
            fence = Some(trimmed[..3].to_string());
            prev_blank = false;
            continue;
        }
        let indent = line.len() - trimmed.len();
        let list_item = trimmed.starts_with("- ")
            || trimmed.starts_with("* ")
            || trimmed
                .split_once(". ")
                .is_some_and(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        if !trimmed.is_empty() && indent >= 4 && !list_item && (prev_blank || in_indented) {
            in_indented = true;
            prev_blank = false;
            continue;
        }
        if !trimmed.is_empty() {
            in_indented = false;
        }
        prev_blank = trimmed.is_empty();
        out.push(strip_code_spans(line));
    }
    out
}

/// `line` with every code span (a run of backticks up to a run of the same length) removed.
fn strip_code_spans(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(start) = rest.find('`') {
        out.push_str(&rest[..start]);
        let after = &rest[start..];
        let run = after.bytes().take_while(|&b| b == b'`').count();
        let ticks = &after[..run];
        match after[run..].find(ticks) {
            Some(end) => rest = &after[run + end + run..],
            None => {
                // An unmatched run is literal text.
                out.push_str(ticks);
                rest = &after[run..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// The link targets of one prose line: inline links and images `[text](target "title")` and
/// reference definitions `[name]: target`.
fn link_targets(line: &str) -> Vec<String> {
    let mut v = Vec::new();
    let t = line.trim_start();
    if let Some(def) = t.strip_prefix('[') {
        if let Some((label, target)) = def.split_once("]:") {
            if !label.is_empty() && !label.contains(']') {
                if let Some(target) = target.split_whitespace().next() {
                    v.push(target.trim_matches(['<', '>']).to_string());
                }
                return v;
            }
        }
    }
    let mut rest = line;
    while let Some(i) = rest.find("](") {
        let after = &rest[i + 2..];
        let Some(end) = after.find(')') else { break };
        let target = after[..end].trim();
        let target = target.split_once(" \"").map_or(target, |(t, _)| t);
        v.push(target.trim_matches(['<', '>']).to_string());
        rest = &after[end + 1..];
    }
    v
}

/// The anchor GitHub gives a heading: its text without markup, lower case, with everything but
/// letters, digits, `-`, `_` and spaces dropped and spaces made `-`.
fn slug(heading: &str) -> String {
    // Link syntax keeps its text only: `[text](url)` -> `text`.
    let mut text = String::new();
    let mut rest = heading;
    while let Some(i) = rest.find("](") {
        text.push_str(&rest[..i]);
        let after = &rest[i + 2..];
        rest = after.find(')').map_or("", |e| &after[e + 1..]);
    }
    text.push_str(rest);
    text.chars()
        .filter(|&c| c.is_alphanumeric() || c == '-' || c == '_' || c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .flat_map(char::to_lowercase)
        .collect()
}

/// The anchors of a markdown page's headings, a repeated one numbered `-1`, `-2`... as GitHub
/// does.
fn anchors(text: &str) -> HashSet<String> {
    let mut seen = HashSet::new();
    for line in prose_lines_keep_code_spans(text) {
        let t = line.trim_start();
        let level = t.bytes().take_while(|&b| b == b'#').count();
        if level == 0 || level > 6 || !t[level..].starts_with(' ') {
            continue;
        }
        let base = slug(t[level..].trim().trim_end_matches('#').trim());
        let mut a = base.clone();
        let mut n = 0;
        while seen.contains(&a) {
            n += 1;
            a = format!("{base}-{n}");
        }
        seen.insert(a);
    }
    seen
}

/// Like [`prose_lines`], but code spans kept (a heading's code span is part of its anchor).
fn prose_lines_keep_code_spans(text: &str) -> Vec<String> {
    let mut fence: Option<String> = None;
    let mut out = Vec::new();
    for line in text.lines() {
        let trimmed = line.trim_start();
        if let Some(f) = &fence {
            if trimmed.starts_with(f.as_str()) {
                fence = None;
            }
            continue;
        }
        if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
            fence = Some(trimmed[..3].to_string());
            continue;
        }
        // Headings are never indented code: four spaces before `#` make code, not a heading.
        if line.starts_with("    ") {
            continue;
        }
        out.push(line.to_string());
    }
    out
}

/// Checks every relative link of `pages` (paths from `root`); one message per broken link,
/// naming the page, the link and what is missing.
fn broken_links(root: &Path, pages: &[PathBuf]) -> Vec<String> {
    let mut problems = Vec::new();
    for page in pages {
        let text = match fs::read_to_string(root.join(page)) {
            Ok(t) => t,
            Err(e) => {
                problems.push(format!("{}: cannot be read: {e}", page.display()));
                continue;
            }
        };
        let dir = page.parent().unwrap_or(Path::new(""));
        for (n, line) in prose_lines_numbered(&text) {
            for target in link_targets(&line) {
                if target.is_empty() {
                    problems.push(format!("{}:{n}: a link with no target", page.display()));
                    continue;
                }
                if target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                let (path, anchor) = match target.split_once('#') {
                    Some((p, a)) => (p, Some(a)),
                    None => (target.as_str(), None),
                };
                let file = if path.is_empty() {
                    page.clone()
                } else {
                    normalize(&dir.join(path))
                };
                let on_disk = root.join(&file);
                if !on_disk.exists() {
                    problems.push(format!(
                        "{}:{n}: link `{target}`: {} does not exist",
                        page.display(),
                        file.display()
                    ));
                    continue;
                }
                let Some(anchor) = anchor else { continue };
                if file.extension() != Some(std::ffi::OsStr::new("md")) {
                    problems.push(format!(
                        "{}:{n}: link `{target}`: {} is not a markdown page, so it has no anchor `{anchor}`",
                        page.display(),
                        file.display()
                    ));
                    continue;
                }
                let target_text = fs::read_to_string(&on_disk).unwrap_or_default();
                if !anchors(&target_text).contains(anchor) {
                    problems.push(format!(
                        "{}:{n}: link `{target}`: {} has no heading with anchor `#{anchor}`",
                        page.display(),
                        file.display()
                    ));
                }
            }
        }
    }
    problems
}

/// [`prose_lines`] with each line's number in the page (1-based).
fn prose_lines_numbered(text: &str) -> Vec<(usize, String)> {
    // prose_lines drops lines; number them by matching against the page's own lines in order.
    let prose = prose_lines(text);
    let mut out = Vec::with_capacity(prose.len());
    let mut lines = text.lines().enumerate();
    for p in prose {
        for (i, l) in lines.by_ref() {
            if strip_code_spans(l) == p {
                out.push((i + 1, p));
                break;
            }
        }
    }
    out
}

/// `a/b/../c` -> `a/c`, `./a` -> `a`, without touching the file system.
fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir => {
                if !out.pop() {
                    out.push("..");
                }
            }
            other => out.push(other),
        }
    }
    out
}

#[test]
fn every_relative_link_of_the_readme_and_the_manual_leads_somewhere() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let pages = pages(root);
    assert!(
        pages.len() > 1,
        "no markdown pages in doc/ besides the README"
    );
    let problems = broken_links(root, &pages);
    assert!(
        problems.is_empty(),
        "{} broken link(s):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn a_broken_link_or_anchor_is_reported_with_page_link_and_what_is_missing() {
    let root = std::env::temp_dir().join(format!("mlx4rs-doc-links-{}", std::process::id()));
    let _ = fs::remove_dir_all(&root);
    fs::create_dir_all(root.join("doc")).unwrap();
    fs::write(
        root.join("README.md"),
        "# Top\n\n[fine](doc/a.md#a-heading) [gone](doc/missing.md) \
         [`code`](doc/a.md#no-such-heading)\n\n    [in code](nowhere.md)\n\n`[span](nowhere.md)`\n",
    )
    .unwrap();
    fs::write(
        root.join("doc/a.md"),
        "# A `heading`\n\n[back](../README.md#top) [self](#a-heading) [web](https://example.org/x)\n",
    )
    .unwrap();
    let problems = broken_links(&root, &pages(&root));
    fs::remove_dir_all(&root).unwrap();
    assert_eq!(
        problems,
        [
            "README.md:3: link `doc/missing.md`: doc/missing.md does not exist",
            "README.md:3: link `doc/a.md#no-such-heading`: doc/a.md has no heading with anchor \
             `#no-such-heading`",
        ]
    );
}

#[test]
fn anchors_follow_github() {
    let a = anchors(
        "# The xstat names Open vSwitch 3.1 reads (lib/netdev-dpdk.c)\n## DPDK's C mlx4\n\
         ## Measuring with `scripts/pktgen.sh`\n## Fixed\n### Fixed\n    # not a heading\n",
    );
    for want in [
        "the-xstat-names-open-vswitch-31-reads-libnetdev-dpdkc",
        "dpdks-c-mlx4",
        "measuring-with-scriptspktgensh",
        "fixed",
        "fixed-1",
    ] {
        assert!(a.contains(want), "{want} not among {a:?}");
    }
    assert_eq!(a.len(), 5, "{a:?}");
}
