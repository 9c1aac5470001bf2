//! What `std` does not say about sockets: a Unix peer's credentials, a
//! listening socket's backlog, waiting on a few descriptors at once, and
//! random bytes for secrets.

use super::check;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

/// `SO_PEERCRED`: the connecting process's pid, uid and gid, as the kernel
/// recorded them at `connect` (the pid in the listener's PID namespace; 0 if
/// the peer's is not visible from it).
pub(crate) fn peer_credentials(socket: &impl AsRawFd) -> io::Result<(i32, u32, u32)> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` is writable for `len` bytes, which the call updates.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    check(rc.into())?;
    Ok((cred.pid, cred.uid, cred.gid))
}

/// `listen(2)` again on a listening socket, with the longest backlog the
/// host allows (`net.core.somaxconn`): `std` listens with 128 on TCP, past
/// which the kernel drops new connections' SYNs and their clients retry
/// only a second later.
pub(crate) fn widen_backlog(listener: &impl AsRawFd) -> io::Result<()> {
    // SAFETY: `listen` on a descriptor we own; the kernel caps the backlog
    // asked for at the host's limit.
    let rc = unsafe { libc::listen(listener.as_raw_fd(), libc::c_int::MAX) };
    check(rc.into()).map(drop)
}

/// `poll(2)` for readability of each of `fds`, up to `timeout`: which are
/// readable (or closed, or failed).
pub(crate) fn readable(fds: &[RawFd], timeout: Duration) -> io::Result<Vec<bool>> {
    let mut polled: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: `polled` is a writable array of the length passed.
    let rc = unsafe { libc::poll(polled.as_mut_ptr(), polled.len() as libc::nfds_t, ms) };
    match check(rc.into()) {
        Ok(_) => Ok(polled.iter().map(|p| p.revents != 0).collect()),
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(vec![false; fds.len()]),
        Err(e) => Err(e),
    }
}

/// Eight random bytes from the kernel (`getrandom(2)`).
pub(crate) fn random_u64() -> io::Result<u64> {
    let mut bytes = [0u8; 8];
    let mut filled = 0;
    while filled < bytes.len() {
        // SAFETY: the rest of `bytes` is writable for the length passed.
        let rc = unsafe {
            libc::getrandom(bytes[filled..].as_mut_ptr().cast(), bytes.len() - filled, 0)
        };
        match check(rc as libc::c_long) {
            Ok(n) => filled += n as usize,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(u64::from_ne_bytes(bytes))
}
