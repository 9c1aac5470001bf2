//! The deployment recipe and the manifests agree on what they build and
//! run. (Every `livereg` command line in `deploy/` is parsed by the CLI's
//! own parser in the binary's tests, `cli/src/deploy_lines.rs`;
//! the manifests' schema is validated offline by `.ci/manifests`.)

use std::path::Path;

/// One image the manifests name: its recipe, the script its build stage
/// runs (and CI runs), and its name without the tag.
struct Image {
    recipe: &'static str,
    build: &'static str,
    name: &'static str,
}

const IMAGES: [Image; 2] = [
    Image {
        recipe: "deploy/Dockerfile",
        build: "deploy/build-release.sh",
        name: "ghcr.io/livereg/livereg",
    },
    Image {
        recipe: "deploy/engine-example/Dockerfile",
        build: "deploy/engine-example/build.sh",
        name: "ghcr.io/livereg/engine-example",
    },
];

/// Each image recipe builds what the manifests run: its build stage is the
/// script CI runs (the `livereg` command with the `tls` feature the
/// engines' `tls://` needs; the engine's also the Python wheel), it runs as
/// the manifests' non-root user, its version label is this crate's version,
/// and every manifest names the image at that version.
#[test]
fn the_image_recipes_and_the_manifests_agree_on_the_build_and_the_version() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let version = env!("CARGO_PKG_VERSION");
    let read = |path: &str| std::fs::read_to_string(root.join(path)).unwrap();
    for image in IMAGES {
        let recipe = read(image.recipe);
        assert!(
            recipe.contains(&format!("RUN {} /out", image.build)),
            "{}: the build stage must run the script CI runs, {}",
            image.recipe,
            image.build
        );
        assert!(
            recipe.contains(&format!("org.opencontainers.image.version=\"{version}\"")),
            "{}: the image's version label is not {version}",
            image.recipe
        );
        assert!(
            recipe.contains("USER 65532:65532"),
            "{}: the image runs as root",
            image.recipe
        );
        let mut named = 0;
        for entry in std::fs::read_dir(root.join("deploy/kubernetes")).unwrap() {
            let path = entry.unwrap().path();
            let text = std::fs::read_to_string(&path).unwrap();
            let prefix = format!("image: {}:", image.name);
            for tag in text
                .lines()
                .filter_map(|line| line.trim().strip_prefix(prefix.as_str()))
            {
                assert_eq!(tag.trim(), version, "{}", path.display());
                named += 1;
            }
        }
        assert!(named >= 1, "no manifest names {}", image.name);
    }
    let release = read("deploy/build-release.sh");
    assert!(release.contains("--features tls") && release.contains("--locked"));
    let engine = read("deploy/engine-example/build.sh");
    assert!(
        engine.contains("deploy/build-release.sh")
            && engine.contains("maturin\" build --quiet --release --locked")
    );
}

/// The node-local path: the unix socket the reaper listens on is the
/// address the engine registers and is probed at, in the node directory
/// both pods mount (hostPath; the engine read-only, as connecting needs no
/// write permission on the directory), which the reaper's init container
/// hands to the user both run as; the TLS listener stays beside it.
#[test]
fn the_engine_dials_the_unix_socket_the_reaper_listens_on_in_the_directory_both_mount() {
    const SOCKET: &str = "/run/livereg/kv.sock";
    const DIR: &str = "/run/livereg";
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let read = |path: &str| std::fs::read_to_string(root.join(path)).unwrap();
    // The trimmed lines of a manifest, comments and list markers dropped.
    let lines = |text: &str| -> Vec<String> {
        text.lines()
            .map(|line| line.trim().trim_start_matches("- ").to_owned())
            .filter(|line| !line.starts_with('#'))
            .collect()
    };
    // The line after each line equal to `line`.
    let after = |lines: &[String], line: &str| -> Vec<String> {
        lines
            .windows(2)
            .filter(|pair| pair[0] == line)
            .map(|pair| pair[1].clone())
            .collect()
    };
    let reaper = lines(&read("deploy/kubernetes/reaper-daemonset.yaml"));
    let engine = lines(&read("deploy/kubernetes/engine-deployment.yaml"));
    for (name, manifest) in [("reaper", &reaper), ("engine", &engine)] {
        assert!(
            after(manifest, "hostPath:")
                .iter()
                .any(|line| line == &format!("path: {DIR}")),
            "the {name} does not mount the node's {DIR}"
        );
        assert!(
            manifest.contains(&format!("mountPath: {DIR}")),
            "the {name} mounts {DIR} elsewhere"
        );
    }
    assert!(reaper.contains(&format!("--listen unix:{SOCKET} --socket-mode 660")));
    assert!(reaper.contains(&"--listen tls://0.0.0.0:7071".to_owned()));
    assert!(
        reaper
            .iter()
            .any(|line| line.contains(&format!("chown 65532:65532 {DIR}"))),
        "the reaper (65532) cannot bind in the directory kubelet made root's"
    );
    assert!(
        reaper
            .iter()
            .any(|line| line.starts_with(r#"add: ["CHOWN", "FOWNER"]"#)),
        "the init container cannot chmod the directory once it is 65532's (its second run)"
    );
    assert_eq!(
        after(&engine, "name: LIVEREG_ADDRESS"),
        [format!("value: unix:{SOCKET}")],
        "the engine registers elsewhere"
    );
    assert_eq!(
        after(&engine, "probe"),
        [format!("unix:{SOCKET}")],
        "the engine is probed elsewhere"
    );
    assert_eq!(
        after(&engine, &format!("mountPath: {DIR}")),
        ["readOnly: true"],
        "the engine mounts the reaper's directory writable"
    );
    assert!(
        engine.contains(&"runAsGroup: 65532  # the socket's group (mode 0660)".to_owned()),
        "the engine is not in the socket's group"
    );
}
