//! Connecting to a Unix stream socket within a time limit: `socket(2)` and
//! `connect(2)` without blocking. `std`'s `UnixStream::connect` blocks as
//! long as the listener's backlog stays full, and has no timeout.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// How long to wait before trying a full backlog again.
const RETRY: Duration = Duration::from_millis(5);

/// A connection to the socket at `path`, tried until `deadline` (`None`:
/// no limit) while the listener's backlog is full (`EAGAIN`); then
/// `TimedOut`.
///
/// # Errors
///
/// A path too long for `sockaddr_un`, the socket's own errors
/// (`ECONNREFUSED`, `ENOENT`, ...), or `TimedOut`.
pub(crate) fn connect_unix(path: &Path, deadline: Option<Instant>) -> io::Result<UnixStream> {
    // SAFETY: a zeroed `sockaddr_un` is valid (family and path set below).
    let mut address: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    address.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    if bytes.len() >= address.sun_path.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "socket path is {} bytes, expected at most {}",
                bytes.len(),
                address.sun_path.len() - 1
            ),
        ));
    }
    for (to, from) in address.sun_path.iter_mut().zip(bytes) {
        *to = *from as libc::c_char;
    }
    loop {
        // SAFETY: plain arguments; the result is checked before use.
        let fd = unsafe {
            libc::socket(
                libc::AF_UNIX,
                libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                0,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by `socket` and is owned by no one else.
        let socket = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: `address` is a valid `sockaddr_un` of the size given.
        let rc = unsafe {
            libc::connect(
                fd,
                std::ptr::addr_of!(address).cast(),
                std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
            )
        };
        if rc == 0 {
            let stream = UnixStream::from(socket);
            stream.set_nonblocking(false)?;
            return Ok(stream);
        }
        let error = io::Error::last_os_error();
        if error.raw_os_error() != Some(libc::EAGAIN) {
            return Err(error);
        }
        if deadline.is_some_and(|deadline| Instant::now() >= deadline) {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the listener's backlog stayed full",
            ));
        }
        std::thread::sleep(RETRY);
    }
}
