//! The Kubernetes manifests in `deploy/kubernetes/` run `livereg` commands:
//! every flag they pass must exist (`livereg SUBCOMMAND --help` lists it).
//! Their schema is validated offline by `.ci/manifests`.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

/// `(subcommand, flag)` for every `livereg SUBCOMMAND … --flag` in `text`
/// (comments skipped; YAML list items and folded lines read as words).
fn livereg_flags(text: &str) -> BTreeSet<(String, String)> {
    let words: Vec<String> = text
        .lines()
        .filter(|line| !line.trim_start().starts_with('#'))
        .flat_map(|line| line.split_whitespace())
        .map(|word| word.trim_matches(|c| "\"',;[]".contains(c)).to_owned())
        .filter(|word| word != "-")
        .collect();
    let mut found = BTreeSet::new();
    let mut subcommand: Option<String> = None;
    for (i, word) in words.iter().enumerate() {
        if word == "livereg" || word.ends_with("bin/livereg") {
            // A subcommand is a plain word (`namespace: livereg` is
            // followed by a key, `labels:`).
            subcommand = words
                .get(i + 1)
                .filter(|next| !next.is_empty() && next.chars().all(|c| c.is_ascii_lowercase()))
                .cloned();
        } else if let (Some(sub), Some(flag)) = (&subcommand, word.strip_prefix("--")) {
            if flag.starts_with(|c: char| c.is_ascii_lowercase()) {
                found.insert((sub.clone(), format!("--{flag}")));
            }
        } else if word == "||" || word == "exec" || word == "---" {
            subcommand = None;
        }
    }
    found
}

#[test]
fn every_livereg_flag_in_the_manifests_exists() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        for (subcommand, flag) in livereg_flags(&text) {
            let help = Command::new(env!("CARGO_BIN_EXE_livereg"))
                .args([subcommand.as_str(), "--help"])
                .output()
                .unwrap();
            assert!(
                help.status.success(),
                "{}: livereg {subcommand}: no such subcommand",
                path.display()
            );
            let help = String::from_utf8_lossy(&help.stdout);
            assert!(
                help.contains(&flag),
                "{}: livereg {subcommand} has no {flag}",
                path.display()
            );
            checked += 1;
        }
    }
    // reap: listen, token-file, tls-cert, tls-key, metrics-addr; create:
    // capacity, timeout, grace; probe: instance, token-file, tls-ca.
    assert!(
        checked >= 11,
        "only {checked} flags found: is the parser still reading the manifests?"
    );
}

#[test]
fn the_flag_reader_reads_folded_lines_and_list_items() {
    let text = "metadata:\n  namespace: livereg\n  labels: {}\nargs:\n  - >-\n    livereg reap kv --listen tls://0.0.0.0:7071;\n  # livereg rm --gone\n    - livereg\n    - probe\n    - --instance\n";
    let found = livereg_flags(text);
    assert!(found.contains(&("reap".into(), "--listen".into())));
    assert!(found.contains(&("probe".into(), "--instance".into())));
    assert!(!found.iter().any(|(_, flag)| flag == "--gone"));
    assert_eq!(found.len(), 2, "{found:?}");
}

/// The image recipe builds what the manifests run: its build stage is the
/// script CI runs (`deploy/build-release.sh`, with the `tls` feature the
/// engines' `tls://` needs), its version label is this crate's version, and
/// every manifest names the image at that version.
#[test]
fn the_image_recipe_and_the_manifests_agree_on_the_build_and_the_version() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let version = env!("CARGO_PKG_VERSION");
    let dockerfile = std::fs::read_to_string(root.join("deploy/Dockerfile")).unwrap();
    assert!(
        dockerfile.contains("RUN deploy/build-release.sh /out"),
        "the build stage must run the script CI runs"
    );
    assert!(
        dockerfile.contains(&format!("org.opencontainers.image.version=\"{version}\"")),
        "the image's version label is not {version}"
    );
    assert!(
        dockerfile.contains("USER 65532:65532"),
        "the image runs as root"
    );
    let script = std::fs::read_to_string(root.join("deploy/build-release.sh")).unwrap();
    assert!(script.contains("--features tls") && script.contains("--locked"));
    let mut images = 0;
    for entry in std::fs::read_dir(root.join("deploy/kubernetes")).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        for image in text
            .lines()
            .filter_map(|line| line.trim().strip_prefix("image: ghcr.io/livereg/livereg:"))
        {
            assert_eq!(image.trim(), version, "{}", path.display());
            images += 1;
        }
    }
    assert!(images >= 1, "no manifest names the livereg image");
}
