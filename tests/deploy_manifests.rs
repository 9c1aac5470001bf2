//! The deployment recipe and the manifests agree on what they build and
//! run. (Every `livereg` command line in `deploy/` is parsed by the CLI's
//! own parser in the binary's tests, `src/bin/livereg/deploy_lines.rs`;
//! the manifests' schema is validated offline by `.ci/manifests`.)

use std::path::Path;

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
