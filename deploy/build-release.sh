#!/usr/bin/env bash
# Builds the `livereg` command as the deployment image ships it (release,
# the locked dependency versions, with the `tls` feature: engine pods reach
# the node's reaper over tls://) and copies it to OUT. The Dockerfile's build
# stage runs this script, and so does CI: the recipe cannot rot unseen.
# Usage: deploy/build-release.sh OUT
set -euo pipefail
out=${1:?usage: deploy/build-release.sh OUT}
root=$(cd "$(dirname "$0")/.." && pwd)
cargo build --release --locked --quiet --manifest-path "$root/Cargo.toml" -p livereg-cli --features tls --bin livereg
target=${CARGO_TARGET_DIR:-$root/target}
mkdir -p "$out"
install -m 755 "$target/release/livereg" "$out/livereg"
"$out/livereg" --version
