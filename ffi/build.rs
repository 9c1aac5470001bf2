//! Names the shared library for the dynamic linker: `liblivereg.so.1`, the
//! C ABI's major version (the header's `LIVEREG_ABI_MAJOR`). A program
//! linked against it asks for that name; a program linked before the
//! library had one asks for `liblivereg.so`, the link install.sh keeps.

/// The C ABI's major version: raised only by a change that breaks a
/// program built against an earlier header (then every such program must
/// be rebuilt, and finds no `liblivereg.so.<new>` until it is).
const ABI_MAJOR: u32 = 1;

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,liblivereg.so.{ABI_MAJOR}");
    println!("cargo:rustc-env=LIVEREG_ABI_MAJOR={ABI_MAJOR}");
    println!("cargo:rerun-if-changed=build.rs");
}
