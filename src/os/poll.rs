//! `poll(2)`: waiting on a few descriptors at once (a session client's
//! socket and its wake-up).

use super::raw::check;
use std::io;
use std::os::fd::RawFd;
use std::time::Duration;

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
