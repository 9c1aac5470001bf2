//! `pidfd_open(2)`, an `epoll(7)` set to wait on many pidfds at once (a pidfd
//! becomes readable when its process exits), and the eventfds that wake-ups
//! travel through.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

fn check(rc: libc::c_long) -> io::Result<libc::c_long> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

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

/// An epoll set whose entries fire once each (`EPOLLONESHOT`).
pub(crate) struct Epoll(OwnedFd);

impl Epoll {
    /// `epoll_create1(EPOLL_CLOEXEC)`.
    pub(crate) fn new() -> io::Result<Epoll> {
        // SAFETY: no memory is passed; returns a new descriptor or -1.
        let fd = check(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) }.into())?;
        // SAFETY: a fresh descriptor, owned by nobody else.
        Ok(Epoll(unsafe { OwnedFd::from_raw_fd(fd as RawFd) }))
    }

    /// `epoll_ctl(EPOLL_CTL_ADD, fd, {EPOLLIN | EPOLLONESHOT, key})`. The
    /// entry leaves the set when `fd` is closed.
    pub(crate) fn add(&self, fd: &impl AsRawFd, key: u64) -> io::Result<()> {
        let mut event = libc::epoll_event {
            events: (libc::EPOLLIN | libc::EPOLLONESHOT) as u32,
            u64: key,
        };
        // SAFETY: both descriptors are open; `event` is valid for the call.
        check(
            unsafe {
                libc::epoll_ctl(
                    self.0.as_raw_fd(),
                    libc::EPOLL_CTL_ADD,
                    fd.as_raw_fd(),
                    &mut event,
                )
            }
            .into(),
        )
        .map(drop)
    }

    /// `epoll_ctl(EPOLL_CTL_ADD, fd, {EPOLLIN, key})`: an entry that fires
    /// for as long as `fd` is readable (its reader drains it).
    pub(crate) fn add_level(&self, fd: &impl AsRawFd, key: u64) -> io::Result<()> {
        let mut event = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: key,
        };
        // SAFETY: both descriptors are open; `event` is valid for the call.
        check(
            unsafe {
                libc::epoll_ctl(
                    self.0.as_raw_fd(),
                    libc::EPOLL_CTL_ADD,
                    fd.as_raw_fd(),
                    &mut event,
                )
            }
            .into(),
        )
        .map(drop)
    }

    /// `epoll_wait`: blocks until an entry fires, or `timeout` (if any)
    /// passes; returns the keys that fired (none on a timeout).
    pub(crate) fn wait(&self, timeout: Option<std::time::Duration>) -> io::Result<Vec<u64>> {
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; 16];
        let timeout_ms = timeout.map_or(-1, |t| i32::try_from(t.as_millis()).unwrap_or(i32::MAX));
        // SAFETY: `events` is a writable array of the length passed.
        let n = unsafe {
            libc::epoll_wait(
                self.0.as_raw_fd(),
                events.as_mut_ptr(),
                events.len() as i32,
                timeout_ms,
            )
        };
        match check(n.into()) {
            Ok(n) => Ok(events[..n as usize].iter().map(|e| e.u64).collect()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }
}

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
