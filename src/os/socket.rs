//! What `std` does not say about sockets: a Unix peer's credentials and a
//! listening socket's backlog.

use super::raw::check;
use std::io;
use std::os::fd::AsRawFd;

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
