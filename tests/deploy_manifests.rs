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
