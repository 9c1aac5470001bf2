//! An `epoll(7)` set: one thread waits on many descriptors at once (pidfds,
//! the close watch, a stop event).

use super::raw::check;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// The most entries one [`Epoll::wait`] returns.
pub(crate) const WAIT_MAX: usize = 64;
/// An entry that fired.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ready {
    /// The key it was added with.
    pub key: u64,
    /// Whether its peer closed (or the descriptor failed): what is left to
    /// read ends with the close.
    pub hung_up: bool,
}

const HUNG_UP: u32 = (libc::EPOLLRDHUP | libc::EPOLLHUP | libc::EPOLLERR) as u32;

/// An epoll set whose entries fire once ([`Epoll::add`]), for as long as
/// their descriptor is readable ([`Epoll::add_level`]) or whenever data
/// arrives ([`Epoll::add_edge`]).
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
        self.insert(fd, key, libc::EPOLLIN | libc::EPOLLONESHOT)
    }

    /// `epoll_ctl(EPOLL_CTL_ADD, fd, {EPOLLIN, key})`: an entry that fires
    /// for as long as `fd` is readable (its reader drains it).
    pub(crate) fn add_level(&self, fd: &impl AsRawFd, key: u64) -> io::Result<()> {
        self.insert(fd, key, libc::EPOLLIN)
    }

    /// `epoll_ctl(EPOLL_CTL_ADD, fd, {EPOLLIN | EPOLLRDHUP | EPOLLET, key})`:
    /// an entry that fires when data arrives, for a reader that reads until
    /// a read comes up short (the socket is then empty of data; what arrives
    /// later fires again) — or, when the peer closed ([`Ready::hung_up`]),
    /// until a read returns nothing: the close may have come with the data
    /// of the same wake-up and will fire no more. Cheaper than
    /// [`Epoll::add_level`]: a drained socket is not polled once more at the
    /// next wait.
    pub(crate) fn add_edge(&self, fd: &impl AsRawFd, key: u64) -> io::Result<()> {
        self.insert(fd, key, libc::EPOLLIN | libc::EPOLLRDHUP | libc::EPOLLET)
    }

    /// `epoll_ctl(EPOLL_CTL_DEL, fd)`: `fd` no longer fires.
    pub(crate) fn remove(&self, fd: &impl AsRawFd) -> io::Result<()> {
        let mut event = libc::epoll_event { events: 0, u64: 0 };
        // SAFETY: both descriptors are open; `event` is valid for the call
        // (ignored by EPOLL_CTL_DEL, but kernels before 2.6.9 read it).
        let rc = unsafe {
            libc::epoll_ctl(
                self.0.as_raw_fd(),
                libc::EPOLL_CTL_DEL,
                fd.as_raw_fd(),
                &mut event,
            )
        };
        check(rc.into()).map(drop)
    }

    fn insert(&self, fd: &impl AsRawFd, key: u64, events: libc::c_int) -> io::Result<()> {
        let mut event = libc::epoll_event {
            events: events as u32,
            u64: key,
        };
        // SAFETY: both descriptors are open; `event` is valid for the call.
        let rc = unsafe {
            libc::epoll_ctl(
                self.0.as_raw_fd(),
                libc::EPOLL_CTL_ADD,
                fd.as_raw_fd(),
                &mut event,
            )
        };
        check(rc.into()).map(drop)
    }

    /// `epoll_wait`: blocks until an entry fires, or `timeout` (if any)
    /// passes; returns the entries that fired (none on a timeout), at most
    /// [`WAIT_MAX`]: a full batch may leave others ready. The timeout is
    /// rounded up to the millisecond: a wait rounded down would end before
    /// its deadline, and a caller waiting for that deadline would spin
    /// through its last fraction of a millisecond.
    pub(crate) fn wait(&self, timeout: Option<std::time::Duration>) -> io::Result<Vec<Ready>> {
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; WAIT_MAX];
        let timeout_ms = timeout.map_or(-1, |t| {
            i32::try_from(t.as_nanos().div_ceil(1_000_000)).unwrap_or(i32::MAX)
        });
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
            Ok(n) => Ok(events[..n as usize]
                .iter()
                .map(|e| Ready {
                    key: e.u64,
                    hung_up: e.events & HUNG_UP != 0,
                })
                .collect()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg_attr(miri, ignore)] // an epoll of eventfds: Miri has no such objects
    fn a_wait_returns_at_most_a_batch_and_the_rest_at_the_next() {
        let epoll = Epoll::new().unwrap();
        let ready: Vec<_> = (0..100)
            .map(|_| crate::os::eventfd::event_nonblocking().unwrap())
            .collect();
        for (key, event) in ready.iter().enumerate() {
            epoll.add_level(event, key as u64).unwrap();
            crate::os::eventfd::signal(event);
        }
        let first = epoll.wait(Some(std::time::Duration::ZERO)).unwrap();
        assert_eq!(first.len(), WAIT_MAX, "a full batch: more may be ready");
        for fired in &first {
            crate::os::eventfd::drain(&ready[fired.key as usize]);
        }
        let rest = epoll.wait(Some(std::time::Duration::ZERO)).unwrap();
        assert_eq!(rest.len(), 100 - WAIT_MAX);
    }

    #[test]
    #[cfg_attr(miri, ignore)] // an epoll: Miri has no such objects
    fn a_wait_of_a_fraction_of_a_millisecond_lasts_its_whole_timeout() {
        let epoll = Epoll::new().unwrap();
        for micros in [300, 2_500] {
            let timeout = std::time::Duration::from_micros(micros);
            let started = std::time::Instant::now();
            assert!(epoll.wait(Some(timeout)).unwrap().is_empty());
            assert!(started.elapsed() >= timeout, "{timeout:?}: {:?}", started.elapsed());
        }
    }
}
