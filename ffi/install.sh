#!/usr/bin/env bash
# Builds the release library and installs it under PREFIX:
#   PREFIX/include/livereg.h
#   PREFIX/lib/liblivereg.so, PREFIX/lib/liblivereg.a
#   PREFIX/lib/pkgconfig/livereg.pc
#   PREFIX/lib/cmake/livereg/livereg-config.cmake (+ its version file)
# after which `pkg-config --cflags --libs livereg` is all a C build needs
# (with PKG_CONFIG_PATH=PREFIX/lib/pkgconfig if PREFIX is not a system one),
# and `find_package(livereg CONFIG REQUIRED)` all a CMake one does (with
# CMAKE_PREFIX_PATH=PREFIX): targets livereg::livereg (the shared library)
# and livereg::livereg_static. The CMake package finds its files from where
# it stands, so the prefix may be moved after installing.
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

install -d "$prefix/include" "$prefix/lib/pkgconfig" "$prefix/lib/cmake/livereg"
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
cat > "$prefix/lib/cmake/livereg/livereg-config.cmake" <<'CMAKE'
# livereg's CMake package (written by ffi/install.sh). Relocatable: every
# path is found from this file's own folder, PREFIX/lib/cmake/livereg.
#   find_package(livereg CONFIG REQUIRED)
#   target_link_libraries(engine PRIVATE livereg::livereg)         # liblivereg.so
#   target_link_libraries(engine PRIVATE livereg::livereg_static)  # liblivereg.a
get_filename_component(_livereg_prefix "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
foreach(_livereg_file include/livereg.h lib/liblivereg.so lib/liblivereg.a)
  if(NOT EXISTS "${_livereg_prefix}/${_livereg_file}")
    set(livereg_FOUND FALSE)
    set(livereg_NOT_FOUND_MESSAGE "expected ${_livereg_prefix}/${_livereg_file}, found none: install with ffi/install.sh PREFIX")
    return()
  endif()
endforeach()
if(NOT TARGET livereg::livereg)
  add_library(livereg::livereg SHARED IMPORTED)
  set_target_properties(livereg::livereg PROPERTIES
    IMPORTED_LOCATION "${_livereg_prefix}/lib/liblivereg.so"
    IMPORTED_NO_SONAME TRUE
    INTERFACE_INCLUDE_DIRECTORIES "${_livereg_prefix}/include")
endif()
if(NOT TARGET livereg::livereg_static)
  add_library(livereg::livereg_static STATIC IMPORTED)
  # What the Rust standard library in the archive needs from the system.
  set_target_properties(livereg::livereg_static PROPERTIES
    IMPORTED_LOCATION "${_livereg_prefix}/lib/liblivereg.a"
    INTERFACE_INCLUDE_DIRECTORIES "${_livereg_prefix}/include"
    INTERFACE_LINK_LIBRARIES "gcc_s;util;rt;pthread;m;dl;c")
endif()
unset(_livereg_file)
unset(_livereg_prefix)
CMAKE
cat > "$prefix/lib/cmake/livereg/livereg-config-version.cmake" <<CMAKE
# livereg $version: 0.x releases are compatible within one minor version.
set(PACKAGE_VERSION "$version")
if(PACKAGE_FIND_VERSION VERSION_GREATER PACKAGE_VERSION)
  set(PACKAGE_VERSION_COMPATIBLE FALSE)
elseif(NOT PACKAGE_FIND_VERSION_MAJOR STREQUAL "${version%%.*}")
  set(PACKAGE_VERSION_COMPATIBLE FALSE)
elseif("${version%%.*}" STREQUAL "0" AND NOT PACKAGE_FIND_VERSION_MINOR STREQUAL "$(echo "$version" | cut -d. -f2)")
  set(PACKAGE_VERSION_COMPATIBLE FALSE)
else()
  set(PACKAGE_VERSION_COMPATIBLE TRUE)
  if(PACKAGE_FIND_VERSION STREQUAL PACKAGE_VERSION)
    set(PACKAGE_VERSION_EXACT TRUE)
  endif()
endif()
CMAKE
echo "installed livereg $version under $prefix"
