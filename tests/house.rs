//! The shape of the source, held: at most 8 files directly in `src/`, no
//! source file over 600 lines before its test module, and no import running
//! back up: inside `src/` (with `src/etcd/`) and `cli/src/`, no file imports
//! what one of its ancestor modules (a `mod.rs`, `lib.rs`, `main.rs`)
//! defines or re-exports. Read from the text of `use` lines and paths, as a
//! reviewer would.

use std::path::{Path, PathBuf};

const ROOTS: [&str; 2] = ["src", "cli/src"];
const MAX_TOP_FILES: usize = 8;
const MAX_LINES: usize = 600;

fn root(dir: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(dir)
}

fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            found.extend(sources(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
    found
}

/// The text before the file's test module (`#[cfg(...test...)]` then
/// `mod tests`).
fn before_tests(text: &str) -> &str {
    let lines: Vec<&str> = text.lines().collect();
    let mut at = 0;
    for (i, line) in lines.iter().enumerate() {
        let test_module = lines.get(i + 1).is_some_and(|l| l.starts_with("mod tests"));
        if line.starts_with("#[cfg(") && line.contains("test") && test_module {
            return &text[..at];
        }
        at += line.len() + 1;
    }
    text
}

/// A module's path (`["session", "wire"]`) from its file.
fn module_of(root: &Path, file: &Path) -> Vec<String> {
    let relative = file.strip_prefix(root).unwrap().with_extension("");
    let mut parts: Vec<String> = relative
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

fn is_module(root: &Path, path: &[String]) -> bool {
    if path.is_empty() {
        return true;
    }
    let base = root.join(path.join("/"));
    base.with_extension("rs").exists() || base.join("mod.rs").exists()
}

/// Every path a file names from `crate::` or `super::`, use trees expanded.
fn named_paths(code: &str) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    let mut statement: Option<String> = None;
    for line in code.lines() {
        let trimmed = line.trim_start();
        if statement.is_none() {
            let Some(at) = trimmed.find("use ") else {
                continue;
            };
            let visibility = &trimmed[..at];
            if !(visibility.is_empty() || visibility.starts_with("pub")) {
                continue;
            }
            statement = Some(trimmed[at + 4..].to_owned());
        } else if let Some(so_far) = statement.as_mut() {
            so_far.push_str(trimmed);
        }
        if let Some(whole) = statement.take_if(|s| s.contains(';')) {
            let tree = whole.split(';').next().unwrap().trim();
            expand(&mut paths, Vec::new(), tree);
        }
    }
    for start in ["crate::", "super::"] {
        let mut from = 0;
        while let Some(at) = code[from..].find(start) {
            let at = from + at;
            let before = code[..at].chars().last();
            if !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                let path: String = code[at..]
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                    .collect();
                paths.push(split(&path));
            }
            from = at + start.len();
        }
    }
    paths
}

fn split(path: &str) -> Vec<String> {
    path.split("::")
        .map(|p| p.split(" as ").next().unwrap().trim().to_owned())
        .filter(|p| !p.is_empty())
        .collect()
}

fn expand(paths: &mut Vec<Vec<String>>, prefix: Vec<String>, tree: &str) {
    let Some(open) = tree.find('{') else {
        let mut path = prefix;
        path.extend(split(tree));
        paths.push(path);
        return;
    };
    let mut prefix = prefix;
    prefix.extend(split(&tree[..open]));
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let (mut depth, mut part) = (0, String::new());
    for c in inner.chars().chain(std::iter::once(',')) {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                if !part.trim().is_empty() {
                    expand(paths, prefix.clone(), part.trim());
                }
                part.clear();
                continue;
            }
            _ => {}
        }
        part.push(c);
    }
}

/// Code without comments, and with `super::` inside inline modules (a
/// loom model, a nested test helper) left out: their parent is the file.
fn code_of(text: &str) -> String {
    let code: Vec<&str> = before_tests(text)
        .lines()
        .map(|line| line.split("//").next().unwrap())
        .collect();
    let mut out = String::new();
    let mut inline = false;
    for line in code {
        let trimmed = line.trim_start();
        let declares = ["mod ", "pub mod ", "pub(crate) mod "]
            .iter()
            .any(|start| trimmed.starts_with(start));
        if declares && trimmed.ends_with('{') {
            inline = true;
        }
        match inline {
            true => out.push_str(&line.replace("super::", "inline::")),
            false => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// Each import of a file that names an item its ancestor module defines.
fn upward_imports(root: &Path, file: &Path) -> Vec<String> {
    let me = module_of(root, file);
    let is_mod_file = matches!(
        file.file_stem().and_then(|s| s.to_str()),
        Some("mod" | "lib" | "main")
    );
    let text = std::fs::read_to_string(file).unwrap();
    let mut found = Vec::new();
    let mut paths = named_paths(&code_of(&text));
    paths.sort();
    paths.dedup();
    for path in paths {
        let (mut module, mut rest): (Vec<String>, &[String]) =
            match path.first().map(String::as_str) {
                Some("crate") => (Vec::new(), &path[1..]),
                Some("super") => {
                    let mut module = me.clone();
                    if !is_mod_file || !me.is_empty() {
                        module.pop();
                    }
                    let mut rest = &path[1..];
                    while rest.first().is_some_and(|p| p == "super") {
                        module.pop();
                        rest = &rest[1..];
                    }
                    (module, rest)
                }
                _ => continue,
            };
        while let Some(next) = rest.first() {
            let mut deeper = module.clone();
            deeper.push(next.clone());
            if next == "self" || !is_module(root, &deeper) {
                break;
            }
            module = deeper;
            rest = &rest[1..];
        }
        let item = rest.first().map(String::as_str);
        if matches!(item, None | Some("self" | "*")) {
            continue;
        }
        let ancestor = module.len() < me.len() && me[..module.len()] == module[..];
        let own_parent = is_mod_file && module == me;
        if ancestor && !own_parent {
            found.push(format!("{}: {}", file.display(), path.join("::")));
        }
    }
    found
}

#[test]
fn src_has_at_most_eight_files_beside_its_folders() {
    let files: Vec<String> = std::fs::read_dir(root("src"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .map(|p| p.display().to_string())
        .collect();
    assert!(files.len() <= MAX_TOP_FILES, "{files:#?}");
}

#[test]
fn no_source_file_is_over_600_lines_before_its_tests() {
    for dir in ROOTS {
        for file in sources(&root(dir)) {
            let text = std::fs::read_to_string(&file).unwrap();
            let lines = before_tests(&text).lines().count();
            assert!(lines <= MAX_LINES, "{}: {lines} lines", file.display());
        }
    }
}

#[test]
fn no_file_imports_what_its_parent_module_defines() {
    let mut found = Vec::new();
    for dir in ROOTS {
        let root = root(dir);
        for file in sources(&root) {
            found.extend(upward_imports(&root, &file));
        }
    }
    assert!(
        found.is_empty(),
        "imports running back up:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_check_sees_an_import_running_back_up() {
    let dir = std::env::temp_dir().join(format!("livereg-house-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("room")).unwrap();
    std::fs::write(dir.join("lib.rs"), "mod room;\npub struct Shared;\n").unwrap();
    std::fs::write(dir.join("room/mod.rs"), "mod inner;\npub struct Mine;\n").unwrap();
    std::fs::write(
        dir.join("room/inner.rs"),
        "use super::Mine;\nuse crate::{room::inner, Shared};\nfn f() -> crate::room::Mine { todo!() }\n",
    )
    .unwrap();
    let found = upward_imports(&dir, &dir.join("room/inner.rs"));
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(found.len(), 3, "{found:#?}");
}
