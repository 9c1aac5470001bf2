//! What `std` does not say about sockets: a Unix peer's credentials, a
//! listening socket's backlog, and descriptors passed over a Unix socket.

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

/// `SO_PASSRIGHTS` (Linux 6.16): its value in `asm-generic/socket.h`, or
/// SPARC's own.
#[cfg(not(target_arch = "sparc64"))]
const SO_PASSRIGHTS: libc::c_int = 83;
#[cfg(target_arch = "sparc64")]
const SO_PASSRIGHTS: libc::c_int = 0x5c;

/// `setsockopt(socket, SOL_SOCKET, SO_PASSRIGHTS, 0)`: a peer's `sendmsg`
/// with descriptors (`SCM_RIGHTS`) to this Unix socket, or to one it
/// accepts (they inherit it), fails with `EPERM`. The descriptors a peer
/// sends are otherwise this process's to close as it reads or closes the
/// socket, and closing one can block for as long as its sender chose (a
/// TCP socket lingering behind a full window): no peer of a listener may
/// hand it one.
///
/// # Errors
///
/// What `setsockopt` returned (`ENOPROTOOPT` before Linux 6.16).
pub(crate) fn refuse_passed_descriptors(socket: &impl AsRawFd) -> io::Result<()> {
    let off: libc::c_int = 0;
    // SAFETY: `off` is a readable c_int for the length given.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_PASSRIGHTS,
            (&off as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    check(rc.into()).map(drop)
}

/// `sendmsg(socket, bytes, SCM_RIGHTS [fd])`: sends `bytes` on a Unix
/// stream socket with a copy of the descriptor `fd` attached (the peer
/// receives it with the first of these bytes it reads with
/// [`receive_with_fd`]). Returns how many bytes were sent (the rest,
/// if any, is the caller's to write; the descriptor went with the first).
///
/// # Errors
///
/// What `sendmsg` returned (`EAGAIN` on a full non-blocking socket, with
/// nothing sent).
pub(crate) fn send_with_fd(
    socket: &impl AsRawFd,
    bytes: &[u8],
    fd: &impl AsRawFd,
) -> io::Result<usize> {
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    // Room for one descriptor, aligned as a cmsghdr.
    let mut control = [0u64; 8];
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<libc::c_int>() as u32) } as usize;
    assert!(space <= std::mem::size_of_val(&control), "one descriptor's control");
    // SAFETY: an all-zero msghdr is a valid empty one.
    let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
    message.msg_iov = &mut iov;
    message.msg_iovlen = 1;
    message.msg_control = control.as_mut_ptr().cast();
    message.msg_controllen = space as _;
    // SAFETY:
    // - `message.msg_control` points at `space` writable, aligned bytes, so
    //   CMSG_FIRSTHDR returns a header inside them;
    // - CMSG_DATA of that header has room for one c_int (CMSG_LEN below).
    unsafe {
        let header = libc::CMSG_FIRSTHDR(&message);
        (*header).cmsg_level = libc::SOL_SOCKET;
        (*header).cmsg_type = libc::SCM_RIGHTS;
        (*header).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<libc::c_int>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(header).cast::<libc::c_int>(), fd.as_raw_fd());
    }
    // SAFETY: `message` names `bytes` (read only) and the control above,
    // both live for the call.
    let sent = unsafe { libc::sendmsg(socket.as_raw_fd(), &message, libc::MSG_NOSIGNAL) };
    check(sent as libc::c_long).map(|n| n as usize)
}

/// `recvmsg(socket, buf, MSG_CMSG_CLOEXEC)` on a Unix stream socket: the
/// bytes read, and the first descriptor that came with them if any (further
/// ones, which no livereg peer sends, are closed).
///
/// # Errors
///
/// What `recvmsg` returned.
pub(crate) fn receive_with_fd(
    socket: &impl AsRawFd,
    buf: &mut [u8],
) -> io::Result<(usize, Option<std::os::fd::OwnedFd>)> {
    use std::os::fd::FromRawFd;
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut control = [0u64; 16];
    // SAFETY: an all-zero msghdr is a valid empty one.
    let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
    message.msg_iov = &mut iov;
    message.msg_iovlen = 1;
    message.msg_control = control.as_mut_ptr().cast();
    message.msg_controllen = std::mem::size_of_val(&control) as _;
    // SAFETY: `message` names `buf` and `control`, writable for their
    // lengths and live for the call.
    let read = unsafe { libc::recvmsg(socket.as_raw_fd(), &mut message, libc::MSG_CMSG_CLOEXEC) };
    let read = check(read as libc::c_long)? as usize;
    let mut first = None;
    // SAFETY:
    // - the kernel filled `msg_controllen` bytes of `control` with cmsg
    //   headers, which CMSG_FIRSTHDR/CMSG_NXTHDR walk within those bytes;
    // - an SCM_RIGHTS header's data holds (len - CMSG_LEN(0)) / 4
    //   descriptors, each now open in this process and owned by no one
    //   else: each becomes an OwnedFd exactly once.
    unsafe {
        let mut header = libc::CMSG_FIRSTHDR(&message);
        while !header.is_null() {
            if (*header).cmsg_level == libc::SOL_SOCKET && (*header).cmsg_type == libc::SCM_RIGHTS
            {
                let data = libc::CMSG_DATA(header).cast::<libc::c_int>();
                let count = ((*header).cmsg_len as usize - libc::CMSG_LEN(0) as usize)
                    / std::mem::size_of::<libc::c_int>();
                for i in 0..count {
                    let fd = std::os::fd::OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i)));
                    if first.is_none() {
                        first = Some(fd);
                    }
                }
            }
            header = libc::CMSG_NXTHDR(&message, header);
        }
    }
    Ok((read, first))
}
