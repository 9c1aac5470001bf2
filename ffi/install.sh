#!/usr/bin/env bash
# Builds the release library and installs it under PREFIX:
#   PREFIX/include/livereg.h
#   PREFIX/lib/liblivereg.so, PREFIX/lib/liblivereg.a
#   PREFIX/lib/pkgconfig/livereg.pc
# after which `pkg-config --cflags --libs livereg` is all a C build needs
# (with PKG_CONFIG_PATH=PREFIX/lib/pkgconfig if PREFIX is not a system one).
# LIVEREG_FEATURES=tls builds it with tls:// sessions (rustls; not by default).
set -euo pipefail
prefix=${1:?usage: ffi/install.sh PREFIX}
mkdir -p "$prefix"
prefix=$(cd "$prefix" && pwd)
root=$(cd "$(dirname "$0")/.." && pwd)

features=()
if [ -n "${LIVEREG_FEATURES:-}" ]; then
  features=(--features "$LIVEREG_FEATURES")
fi
cargo build --release --quiet --manifest-path "$root/Cargo.toml" -p livereg-ffi "${features[@]}"
target=${CARGO_TARGET_DIR:-$root/target}
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/ffi/Cargo.toml" | head -1)

install -d "$prefix/include" "$prefix/lib/pkgconfig"
install -m 644 "$root/include/livereg.h" "$prefix/include/livereg.h"
install -m 755 "$target/release/liblivereg.so" "$prefix/lib/liblivereg.so"
install -m 644 "$target/release/liblivereg.a" "$prefix/lib/liblivereg.a"
cat > "$prefix/lib/pkgconfig/livereg.pc" <<PC
prefix=$prefix
includedir=\${prefix}/include
libdir=\${prefix}/lib

Name: livereg
Description: Lock-free shared-memory liveness registry
Version: $version
Cflags: -I\${includedir}
Libs: -L\${libdir} -Wl,-rpath,\${libdir} -llivereg
Libs.private: -lgcc_s -lutil -lrt -lpthread -lm -ldl -lc
PC
echo "installed livereg $version under $prefix"
