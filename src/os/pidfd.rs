//! `pidfd_open(2)`: a descriptor for a process, readable once it exits.

use super::raw::check;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// `pidfd_open(pid, 0)`: a descriptor for process `pid` of this PID namespace.
pub(crate) fn open(pid: u32) -> io::Result<OwnedFd> {
    let pid = libc::pid_t::try_from(pid).map_err(|_| io::Error::from_raw_os_error(libc::ESRCH))?;
    // SAFETY:
    // - pidfd_open takes a pid and flags and returns a new descriptor or -1;
    //   no memory is passed.
    let fd = check(unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) })?;
    // SAFETY: a fresh descriptor the kernel just returned, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}
