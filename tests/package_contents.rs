//! What `cargo package` packs of the library: what a user builds from (its
//! source, its benches, the README and the changelog), never the CI
//! scripts, the deployment files, the docs or the tests and their fixtures.

use std::process::Command;

#[test]
fn the_package_holds_only_what_a_user_builds_from() {
    let output = Command::new(env!("CARGO"))
        .args(["package", "--list", "--allow-dirty", "-p", "livereg"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let listed = String::from_utf8(output.stdout).unwrap();
    let files: Vec<&str> = listed.lines().collect();
    assert!(files.contains(&"src/lib.rs"), "{files:?}");
    assert!(files.contains(&"README.md"), "{files:?}");
    let packed_by_cargo = [
        "Cargo.toml",
        "Cargo.toml.orig",
        "Cargo.lock",
        ".cargo_vcs_info.json",
    ];
    let stray: Vec<&&str> = files
        .iter()
        .filter(|file| !packed_by_cargo.contains(file))
        .filter(|file| {
            let source = file.starts_with("src/") || file.starts_with("benches/");
            !source && !["README.md", "CHANGELOG.md"].contains(file)
        })
        .collect();
    assert!(stray.is_empty(), "packed beyond the source: {stray:?}");
}
