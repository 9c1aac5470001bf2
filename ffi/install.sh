#!/usr/bin/env bash
# Builds the release library and installs it under PREFIX:
#   PREFIX/include/livereg.h
#   PREFIX/lib/liblivereg.so.N (the library, named by its SONAME: N is the C
#     ABI's major version), PREFIX/lib/liblivereg.so (the link a build and
#     a program linked before the library had a SONAME find), liblivereg.a
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
# livereg's one version: the root Cargo.toml's [workspace.package].
version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' "$root/Cargo.toml")
[ -n "$version" ] || { echo "no [workspace.package] version in $root/Cargo.toml" >&2; exit 1; }
# The name the library gives itself (ffi/build.rs): what programs linked
# against it ask the dynamic linker for.
soname=$(readelf -d "$target/release/liblivereg.so" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
case "$soname" in
  liblivereg.so.[0-9]*) ;;
  *) echo "$target/release/liblivereg.so: expected a SONAME liblivereg.so.N, found '$soname'" >&2; exit 1 ;;
esac

install -d "$prefix/include" "$prefix/lib/pkgconfig" "$prefix/lib/cmake/livereg"
install -m 644 "$root/include/livereg.h" "$prefix/include/livereg.h"
rm -f "$prefix/lib/liblivereg.so"
install -m 755 "$target/release/liblivereg.so" "$prefix/lib/$soname"
ln -s "$soname" "$prefix/lib/liblivereg.so"
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
cat > "$prefix/lib/cmake/livereg/livereg-config.cmake" <<CMAKE_HEAD
# The library's SONAME, as ffi/install.sh found it.
set(_livereg_soname "$soname")
CMAKE_HEAD
cat >> "$prefix/lib/cmake/livereg/livereg-config.cmake" <<'CMAKE'
# livereg's CMake package (written by ffi/install.sh). Relocatable: every
# path is found from this file's own folder, PREFIX/lib/cmake/livereg.
#   find_package(livereg CONFIG REQUIRED)
#   target_link_libraries(engine PRIVATE livereg::livereg)         # liblivereg.so.N
#   target_link_libraries(engine PRIVATE livereg::livereg_static)  # liblivereg.a
get_filename_component(_livereg_prefix "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
foreach(_livereg_file include/livereg.h lib/${_livereg_soname} lib/liblivereg.a)
  if(NOT EXISTS "${_livereg_prefix}/${_livereg_file}")
    set(livereg_FOUND FALSE)
    set(livereg_NOT_FOUND_MESSAGE "expected ${_livereg_prefix}/${_livereg_file}, found none: install with ffi/install.sh PREFIX")
    return()
  endif()
endforeach()
if(NOT TARGET livereg::livereg)
  add_library(livereg::livereg SHARED IMPORTED)
  set_target_properties(livereg::livereg PROPERTIES
    IMPORTED_LOCATION "${_livereg_prefix}/lib/${_livereg_soname}"
    IMPORTED_SONAME "${_livereg_soname}"
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
unset(_livereg_soname)
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
echo "installed livereg $version ($soname) under $prefix"
