//! `inotify(7)` on one file, for one kind of event: a descriptor opened for
//! writing was closed (`IN_CLOSE_WRITE`). Every registrant holds such a
//! descriptor on the table (its lock's own open file description), and the
//! kernel closes it when the registrant dies, in whatever PID namespace: the
//! reaper hears of a death the moment it happens, without a pidfd.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// An inotify instance watching one file for closes of written descriptors.
pub(crate) struct CloseWatch(OwnedFd);

impl CloseWatch {
    /// Watches the object behind `file` (through `/proc/self/fd`, so the
    /// watch is on the very inode even if its name was replaced).
    pub(crate) fn new(file: &File) -> io::Result<CloseWatch> {
        // SAFETY: no memory is passed; returns a new descriptor or -1.
        let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC | libc::IN_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor the kernel just returned, owned by nobody else.
        let watch = CloseWatch(unsafe { OwnedFd::from_raw_fd(fd as RawFd) });
        let path = std::ffi::CString::new(format!("/proc/self/fd/{}", file.as_raw_fd()))
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: `path` is a NUL-terminated string valid for the call; the
        // inotify descriptor is open.
        let rc = unsafe {
            libc::inotify_add_watch(watch.0.as_raw_fd(), path.as_ptr(), libc::IN_CLOSE_WRITE)
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(watch)
    }

    /// Reads every pending event; whether there was any (an overflowed queue
    /// counts: it stands for events that were lost).
    pub(crate) fn drain(&self) -> bool {
        let mut buffer = [0u8; 4096];
        let mut any = false;
        loop {
            // SAFETY: `buffer` is writable for its length; the descriptor is
            // open and non-blocking.
            let n =
                unsafe { libc::read(self.0.as_raw_fd(), buffer.as_mut_ptr().cast(), buffer.len()) };
            if n <= 0 {
                return any;
            }
            any = true;
        }
    }
}

impl AsRawFd for CloseWatch {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}
