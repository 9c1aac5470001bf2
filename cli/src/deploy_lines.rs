//! Every `livereg` command line in `deploy/` (the Kubernetes manifests'
//! shell lines and exec probes, the image recipes, their build scripts) is
//! parsed by this command's own argument parser, so a renamed flag, a
//! dropped subcommand or a value the parser refuses fails here, not in a
//! cluster.

use crate::command_line::Cli;
use clap::error::ErrorKind;
use clap::Parser;
use std::path::{Path, PathBuf};

/// A Dockerfile's `ENTRYPOINT` followed by its `CMD` (exec form, JSON
/// arrays), as the words of one command line.
fn exec_form(recipe: &str) -> Vec<String> {
    let array = |instruction: &str| -> Vec<String> {
        recipe
            .lines()
            .find_map(|line| line.trim().strip_prefix(instruction))
            .map(|array| serde_json::from_str(array).expect("an exec form: [\"…\", …]"))
            .unwrap_or_default()
    };
    let mut words = array("ENTRYPOINT ");
    words.extend(array("CMD "));
    words
}

/// The program word of a command line: `livereg`, or a path ending in it.
fn is_livereg(word: &str) -> bool {
    word.rsplit('/').next() == Some("livereg")
}

/// How a file holds its command lines.
#[derive(Clone, Copy, PartialEq)]
enum Form {
    /// YAML: a command runs on over folded lines and list items, to the
    /// next key.
    Yaml,
    /// A shell script, or a Dockerfile (its `RUN` lines are shell; its
    /// `ENTRYPOINT` and `CMD` one command line; its other instructions
    /// none): a line ends a command unless it ends in `\`.
    Shell,
}

/// A word as the reader sees it: its text and whether it stands where a
/// program would (a line's first word, after `;`, `||`, `exec`, a list
/// marker); `None` ends a command.
type Token = Option<(String, bool)>;

/// The tokens of one line.
fn tokens(line: &str, form: Form, out: &mut Vec<Token>) {
    let mut in_position = true;
    for raw in line.split_whitespace() {
        if in_position && (raw == "-" || raw == "exec") {
            continue;
        }
        let bare = raw.trim_matches(|c| "\"'[],\\".contains(c));
        let (bare, ends_after) = match bare.strip_suffix(';') {
            Some(before) => (before, true),
            None => (bare, false),
        };
        if matches!(bare, "||" | "&&" | "|" | "---") {
            out.push(None);
            in_position = true;
            continue;
        }
        if form == Form::Yaml && bare.ends_with(':') {
            // A key ends a command; the value on its line is no program.
            out.push(None);
            in_position = false;
            continue;
        }
        if !bare.is_empty() {
            out.push(Some((bare.to_owned(), in_position || raw.starts_with('['))));
        }
        in_position = ends_after;
        if ends_after {
            out.push(None);
        }
    }
}

/// The `livereg` command lines of `text`, each as its words after the
/// program (comments skipped).
fn command_lines(text: &str, form: Form) -> Vec<Vec<String>> {
    let mut words: Vec<Token> = Vec::new();
    let mut skipping = false;
    for line in text.lines().map(str::trim) {
        let continued = line.ends_with('\\');
        if line.starts_with('#') || std::mem::replace(&mut skipping, false) {
            skipping = continued && !line.starts_with('#');
            continue;
        }
        let mut line = line;
        if form == Form::Shell {
            let instruction = line.split_whitespace().next().unwrap_or_default();
            if instruction.len() > 2 && instruction.bytes().all(|b| b.is_ascii_uppercase()) {
                match instruction {
                    "RUN" => line = &line[3..],
                    "ENTRYPOINT" => {
                        let program = exec_form(text);
                        words.extend(
                            program
                                .into_iter()
                                .enumerate()
                                .map(|(i, w)| Some((w, i == 0))),
                        );
                        words.push(None);
                    }
                    _ => skipping = continued,
                }
                if instruction != "RUN" {
                    continue;
                }
            }
        }
        tokens(line, form, &mut words);
        if form == Form::Shell && !continued {
            words.push(None);
        }
    }
    let mut lines = Vec::new();
    let mut current: Option<Vec<String>> = None;
    for token in words {
        match (token, current.as_mut()) {
            (None, _) => lines.extend(current.take()),
            (Some((word, _)), Some(line)) => line.push(word),
            (Some((word, true)), None) if is_livereg(&word) => current = Some(Vec::new()),
            _ => {}
        }
    }
    lines.extend(current);
    lines
}

/// Every file under `dir`, depth first.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            found.extend(files(&path));
        } else {
            found.push(path);
        }
    }
    found
}

#[test]
fn every_livereg_command_line_in_deploy_parses() {
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
    let mut parsed = Vec::new();
    for path in files(&deploy) {
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        if path.extension().is_some_and(|ext| ext == "json") {
            continue; // the dashboard: queries, not command lines
        }
        let form = match path.extension().and_then(|ext| ext.to_str()) {
            Some("yaml" | "yml") => Form::Yaml,
            _ => Form::Shell,
        };
        for words in command_lines(&text, form) {
            let line = words.join(" ");
            match Cli::try_parse_from(std::iter::once("livereg".to_owned()).chain(words)) {
                Ok(_) => {}
                Err(e)
                    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => {}
                Err(e) => panic!(
                    "{}: `livereg {line}` is refused by the CLI:\n{e}",
                    path.display()
                ),
            }
            parsed.push(format!("{}: livereg {line}", path.display()));
        }
    }
    // The reaper's create and reap (on the node's unix: socket and over
    // TLS), the engine's probe on that socket, the image's default command
    // and its build's version check at least.
    assert!(
        parsed.len() >= 5,
        "only these command lines were found (is the reader still reading deploy/?):\n{}",
        parsed.join("\n")
    );
    for needed in [
        "livereg create kv",
        "livereg reap kv",
        "--listen unix:/run/livereg/kv.sock --socket-mode 660",
        "--listen tls://0.0.0.0:7071",
        "livereg probe unix:/run/livereg/kv.sock",
    ] {
        assert!(
            parsed.iter().any(|line| line.contains(needed)),
            "no `{needed}` line read from deploy/:\n{}",
            parsed.join("\n")
        );
    }
}

#[test]
fn the_reader_reads_folded_lines_list_items_scripts_and_recipes() {
    let manifest = "metadata:\n  namespace: livereg\n  labels: {}\nargs:\n  - >-\n    livereg create kv --timeout 1s || true;\n    exec livereg reap kv\n    --listen tls://0.0.0.0:7071\n  # livereg rm --gone\nports:\n    - livereg\n    - probe\n    - --instance\n    - \"7\"\n  periodSeconds: 5\n";
    assert_eq!(
        command_lines(manifest, Form::Yaml),
        vec![
            vec!["create", "kv", "--timeout", "1s"],
            vec!["reap", "kv", "--listen", "tls://0.0.0.0:7071"],
            vec!["probe", "--instance", "7"],
        ]
    );
    let script = "set -e\n\"$out/livereg\" --version\nlivereg status kv \\\n  --json\necho done\n";
    assert_eq!(
        command_lines(script, Form::Shell),
        vec![vec!["--version"], vec!["status", "kv", "--json"]]
    );
    let recipe = "FROM x\nLABEL a=\"livereg\" \\\n  b=\"/bin/livereg rm\"\nRUN livereg create kv; \\\n  livereg rm kv\nCOPY --from=build /out/livereg /usr/local/bin/livereg\nENTRYPOINT [\"/usr/local/bin/livereg\"]\nCMD [\"--help\"]\n";
    assert_eq!(
        command_lines(recipe, Form::Shell),
        vec![vec!["create", "kv"], vec!["rm", "kv"], vec!["--help"]]
    );
}

#[test]
fn a_flag_the_cli_lacks_is_refused() {
    let words = ["livereg", "reap", "kv", "--no-such-flag"];
    assert_eq!(
        Cli::try_parse_from(words).err().map(|e| e.kind()),
        Some(ErrorKind::UnknownArgument)
    );
}
