//! Sealed anonymous memory (`memfd_create(2)`, `fcntl(2)` seals): what a
//! listener hands a session's client to share, whose size neither side can
//! change once it is sealed.

use super::raw::check;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};

/// `memfd_create(name, MFD_ALLOW_SEALING | MFD_CLOEXEC)`, sized to `size`
/// bytes (zeroed), then sealed with `F_SEAL_SHRINK | F_SEAL_GROW |
/// F_SEAL_SEAL`: whoever holds it may write its bytes, never truncate or
/// grow it, so a mapping of it never faults.
///
/// # Errors
///
/// What `memfd_create`, `ftruncate` or `fcntl(F_ADD_SEALS)` returned
/// (`ENOSYS` before Linux 3.17, `EMFILE`, `ENOMEM`).
pub(crate) fn create_sealed(name: &std::ffi::CStr, size: u64) -> io::Result<File> {
    // SAFETY: `name` is a NUL-terminated string the kernel only reads.
    let fd = unsafe {
        libc::memfd_create(name.as_ptr(), libc::MFD_ALLOW_SEALING | libc::MFD_CLOEXEC)
    };
    check(fd.into())?;
    // SAFETY: `fd` was just returned by memfd_create and is owned by no one
    // else.
    let file = unsafe { File::from_raw_fd(fd) };
    file.set_len(size)?;
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
    // SAFETY: F_ADD_SEALS on a descriptor we own; no memory is passed.
    let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) };
    check(rc.into())?;
    Ok(file)
}

/// `fcntl(fd, F_GET_SEALS)`: whether `file` is sealed against shrinking
/// and growing (a region whose size its holder could change is refused).
pub(crate) fn is_size_sealed(file: &File) -> bool {
    // SAFETY: F_GET_SEALS on a descriptor we own; no memory is passed.
    let seals = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GET_SEALS) };
    let wanted = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
    seals >= 0 && seals & wanted == wanted
}

#[cfg(all(test, not(miri)))]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_region_keeps_its_size_whatever_its_holder_asks() {
        let file = create_sealed(c"livereg-test", 8192).unwrap();
        assert_eq!(file.metadata().unwrap().len(), 8192);
        assert!(is_size_sealed(&file));
        assert!(file.set_len(4096).is_err(), "shrunk");
        assert!(file.set_len(16384).is_err(), "grown");
        assert_eq!(file.metadata().unwrap().len(), 8192);
    }
}
