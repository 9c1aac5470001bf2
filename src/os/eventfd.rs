//! `eventfd(2)`: the descriptors wake-ups travel through from one thread to
//! another.

use super::raw::check;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// `eventfd(0, EFD_CLOEXEC)`: a descriptor another thread can make readable.
pub(crate) fn event() -> io::Result<OwnedFd> {
    // SAFETY: no memory is passed; returns a new descriptor or -1.
    let fd = check(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) }.into())?;
    // SAFETY: a fresh descriptor, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Makes an eventfd readable.
pub(crate) fn signal(event: &OwnedFd) {
    let one: u64 = 1;
    // SAFETY: `one` is 8 readable bytes, as eventfd writes require.
    unsafe { libc::write(event.as_raw_fd(), (&one as *const u64).cast(), 8) };
}

/// `eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)`: a descriptor to poll, drained
/// without blocking.
pub(crate) fn event_nonblocking() -> io::Result<OwnedFd> {
    // SAFETY: no memory is passed; returns a new descriptor or -1.
    let fd = check(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) }.into())?;
    // SAFETY: a fresh descriptor, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Reads a non-blocking eventfd's counter back to zero (nothing to read is
/// fine).
pub(crate) fn drain(event: &OwnedFd) {
    let mut count: u64 = 0;
    // SAFETY: `count` is 8 writable bytes, as eventfd reads require.
    unsafe { libc::read(event.as_raw_fd(), (&mut count as *mut u64).cast(), 8) };
}
