//! The documentation holds together: every relative link in the README and
//! in `docs/` names a file that exists, every page in `docs/` is reachable
//! from the README, and the README stays a short read.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The Markdown pages: the README, the top-level notes and `docs/*.md`.
fn pages() -> Vec<PathBuf> {
    let mut pages: Vec<PathBuf> = ["README.md", "BENCHMARKS.md", "CHANGELOG.md"]
        .iter()
        .map(|name| root().join(name))
        .collect();
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("docs/")
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

/// The targets of `[text](target)` links outside code blocks.
fn links(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut in_code = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            found.push(after[..end].to_owned());
            rest = &after[end..];
        }
    }
    found
}

fn is_local(target: &str) -> bool {
    !(target.starts_with("http://") || target.starts_with("https://") || target.starts_with('#'))
}

#[test]
fn every_relative_link_names_a_file_that_exists() {
    let mut broken = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        let base = page.parent().unwrap_or(Path::new("."));
        for target in links(&text).into_iter().filter(|t| is_local(t)) {
            let file = target.split('#').next().unwrap_or_default();
            if !base.join(file).exists() {
                broken.push(format!("{}: {target}", page.display()));
            }
        }
    }
    assert!(broken.is_empty(), "broken links: {broken:#?}");
}

#[test]
fn every_page_in_docs_is_reachable_from_the_readme() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let linked = links(&readme);
    for page in pages()
        .into_iter()
        .filter(|p| p.parent().unwrap().ends_with("docs"))
    {
        let name = format!("docs/{}", page.file_name().unwrap().to_string_lossy());
        assert!(
            linked
                .iter()
                .any(|target| target.split('#').next() == Some(name.as_str())),
            "{name} is not linked from README.md"
        );
    }
}

#[test]
fn the_readme_stays_a_five_minute_read() {
    let lines = std::fs::read_to_string(root().join("README.md"))
        .unwrap()
        .lines()
        .count();
    assert!(
        lines <= 250,
        "README.md has {lines} lines; move detail to docs/"
    );
}

/// docs/architecture.md names the code as it is: every path it gives
/// (`src/…`, `ffi/…`, `include/…`) exists, and every file name it lists for
/// a folder (`src/session/`: `wire.rs`, `tls/`…) is in that folder.
#[test]
fn architecture_names_only_files_that_exist() {
    let text = std::fs::read_to_string(root().join("docs/architecture.md")).unwrap();
    let mut missing = Vec::new();
    for line in text.lines().filter(|line| line.starts_with('|')) {
        let cells: Vec<&str> = line.split('|').collect();
        let ticked = |cell: &str| -> Vec<String> {
            cell.split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_owned)
                .collect()
        };
        let folders: Vec<String> = cells
            .get(2)
            .map(|cell| ticked(cell))
            .unwrap_or_default()
            .into_iter()
            .filter(|path| path.ends_with('/') || path.ends_with(".rs") || path.ends_with(".h"))
            .collect();
        for path in &folders {
            if !root().join(path).exists() {
                missing.push(path.clone());
            }
        }
        let Some(folder) = folders.iter().find(|path| path.ends_with('/')) else {
            continue;
        };
        for name in ticked(cells.get(3).copied().unwrap_or_default()) {
            let is_file = name.ends_with(".rs") && !name.contains(' ');
            let is_folder = name.ends_with('/') && !name.contains(' ') && !name.contains(':');
            if (is_file || is_folder) && !root().join(folder).join(&name).exists() {
                missing.push(format!("{folder}{name}"));
            }
        }
    }
    for path in ticked_paths(&text) {
        if !root().join(&path).exists() {
            missing.push(path);
        }
    }
    assert!(
        missing.is_empty(),
        "docs/architecture.md names what does not exist: {missing:?}"
    );
}

/// Every backticked `src/…`, `ffi/…` or `include/…` path in `text`.
fn ticked_paths(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|t| {
            (t.starts_with("src/") || t.starts_with("ffi/") || t.starts_with("include/"))
                && !t.contains(' ')
        })
        .map(str::to_owned)
        .collect()
}
