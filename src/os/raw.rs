//! A raw system call's return value read as a result.

/// A raw system call's result: the error of `errno` when negative.
pub(super) fn check(rc: libc::c_long) -> std::io::Result<libc::c_long> {
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}
