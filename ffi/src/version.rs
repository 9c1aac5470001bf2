//! What the library says it is: its version at run time, for a program to
//! compare with the header's `LIVEREG_VERSION_*` macros it was built with.

use std::ffi::c_char;

/// The library's version, `MAJOR.MINOR.PATCH`: the workspace's one version
/// (the root `Cargo.toml`), as the header's `LIVEREG_VERSION_STRING`.
pub(crate) const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The same, NUL-terminated, for C.
const VERSION_C: &str = concat!(env!("CARGO_PKG_VERSION"), "\0");

/// `(MAJOR << 16) | (MINOR << 8) | PATCH`, as the header's
/// `LIVEREG_VERSION_NUMBER`: ordered as the versions are.
pub(crate) const VERSION_NUMBER: u32 = {
    let major = parse(env!("CARGO_PKG_VERSION_MAJOR"));
    let minor = parse(env!("CARGO_PKG_VERSION_MINOR"));
    let patch = parse(env!("CARGO_PKG_VERSION_PATCH"));
    assert!(minor < 256 && patch < 256, "a version part over 255");
    (major << 16) | (minor << 8) | patch
};

/// A decimal version part, at compile time.
const fn parse(digits: &str) -> u32 {
    let bytes = digits.as_bytes();
    let mut value = 0;
    let mut at = 0;
    while at < bytes.len() {
        assert!(
            bytes[at].is_ascii_digit(),
            "a version part that is not a number"
        );
        value = value * 10 + (bytes[at] - b'0') as u32;
        at += 1;
    }
    value
}

/// `livereg_version()`: the library's version, `"MAJOR.MINOR.PATCH"`; a
/// static string, never NULL.
#[no_mangle]
pub extern "C" fn livereg_version() -> *const c_char {
    VERSION_C.as_ptr().cast()
}

/// `livereg_version_number()`: the library's version as
/// `(MAJOR << 16) | (MINOR << 8) | PATCH`, to compare with the header's
/// `LIVEREG_VERSION_NUMBER`.
#[no_mangle]
pub extern "C" fn livereg_version_number() -> u32 {
    VERSION_NUMBER
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    #[test]
    fn the_version_string_and_number_are_the_crate_version() {
        // SAFETY: `livereg_version` returns a static NUL-terminated string.
        let text = unsafe { CStr::from_ptr(livereg_version()) }
            .to_str()
            .unwrap();
        assert_eq!(text, env!("CARGO_PKG_VERSION"));
        let parts: Vec<u32> = text.split('.').map(|p| p.parse().unwrap()).collect();
        assert_eq!(
            livereg_version_number(),
            (parts[0] << 16) | (parts[1] << 8) | parts[2]
        );
    }
}
