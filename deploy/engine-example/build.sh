#!/usr/bin/env bash
# Builds what the engine example's image holds (deploy/engine-example/Dockerfile
# runs this script, and so does CI): the `livereg` command its liveness probe
# runs (deploy/build-release.sh: release, locked, with `tls`) and the Python
# package's wheel, with `tls`, which the engine registers through.
# Usage: deploy/engine-example/build.sh OUT   (OUT/livereg, OUT/wheels/*.whl)
set -euo pipefail
out=${1:?usage: deploy/engine-example/build.sh OUT}
root=$(cd "$(dirname "$0")/../.." && pwd)
"$root/deploy/build-release.sh" "$out"
venv=$(mktemp -d)
trap 'rm -rf "$venv"' EXIT
python3 -m venv "$venv"
"$venv/bin/pip" install -q "maturin>=1.9.4,<2"
"$venv/bin/maturin" build --quiet --release --locked \
  --manifest-path "$root/ffi/python/Cargo.toml" --out "$out/wheels"
ls "$out"/wheels/livereg-*.whl
