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
    // Rounded up: a wait rounded down ends before its deadline, and a
    // caller waiting for that deadline would spin through its last
    // fraction of a millisecond.
    let ms = i32::try_from(timeout.as_nanos().div_ceil(1_000_000)).unwrap_or(i32::MAX);
    // SAFETY: `polled` is a writable array of the length passed.
    let rc = unsafe { libc::poll(polled.as_mut_ptr(), polled.len() as libc::nfds_t, ms) };
    match check(rc.into()) {
        Ok(_) => Ok(polled.iter().map(|p| p.revents != 0).collect()),
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(vec![false; fds.len()]),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg_attr(miri, ignore)] // poll(2) on an eventfd: Miri has no such objects
    fn a_wait_of_a_fraction_of_a_millisecond_lasts_its_whole_timeout() {
        let event = crate::os::eventfd::event_nonblocking().unwrap();
        for timeout in [Duration::from_micros(300), Duration::from_micros(2_500)] {
            let started = std::time::Instant::now();
            let ready = readable(&[std::os::fd::AsRawFd::as_raw_fd(&event)], timeout).unwrap();
            assert_eq!(ready, [false]);
            assert!(started.elapsed() >= timeout, "{timeout:?}: {:?}", started.elapsed());
        }
    }
}
