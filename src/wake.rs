//! Who wakes a caller-driven reaper: anything that makes a scan due before
//! its time. Registrations, deregistrations, replacements and clear requests,
//! from any process, bump the futex word `wake` in the header; the exit
//! watcher bumps it too when a watched process exits. A futex cannot be
//! polled, so a forwarding thread waits on it and makes an eventfd readable:
//! the descriptor an epoll loop or asyncio waits on, with the time to the
//! next periodic scan as its timeout.

use crate::fork;
use crate::os::{futex, pidfd};
use crate::sync::Ordering::Acquire;
use crate::table::Inner;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// How often the forwarder looks at its stop flag and the table's size when
/// nothing wakes it.
const FORWARDER_TICK: Duration = Duration::from_millis(100);

/// An eventfd readable whenever the table's wake word changed since the
/// reaper last drained it.
pub(crate) struct WakeFd {
    event: Arc<OwnedFd>,
    stop: Arc<AtomicBool>,
    inner: Arc<Inner>,
    forwarder: Option<JoinHandle<()>>,
    fork_epoch: u64,
}

impl WakeFd {
    /// Creates the eventfd and starts the thread that forwards the table's
    /// wake-ups to it.
    pub(crate) fn start(inner: Arc<Inner>) -> std::io::Result<WakeFd> {
        let event = Arc::new(pidfd::event_nonblocking()?);
        let stop = Arc::new(AtomicBool::new(false));
        let (signal, stopping, table) = (event.clone(), stop.clone(), inner.clone());
        // Read now, not when the thread first runs: a wake-up in between
        // would otherwise be taken for the starting point and lost.
        inner.check_size().map_err(std::io::Error::other)?;
        let seen = inner.header().wake.load(Acquire);
        let forwarder = std::thread::Builder::new()
            .name("livereg-wake".into())
            .spawn(move || forward(&table, seen, &signal, &stopping))?;
        Ok(WakeFd {
            event,
            stop,
            inner,
            forwarder: Some(forwarder),
            fork_epoch: fork::install(),
        })
    }

    /// Consumes the pending wake-ups (the scan about to run answers them).
    pub(crate) fn drain(&self) {
        pidfd::drain(&self.event);
    }
}

/// Waits on the wake word, from the value `seen`, and signals `event` at each
/// change, until `stop`.
/// A truncated table has no wake word any more: one last signal makes the
/// reaper scan (and report it), and the thread ends.
fn forward(inner: &Inner, mut seen: u32, event: &OwnedFd, stop: &AtomicBool) {
    let wake = &inner.header().wake;
    while !stop.load(Ordering::Acquire) {
        futex::wait(wake, seen, FORWARDER_TICK);
        if inner.check_size().is_err() {
            pidfd::signal(event);
            return;
        }
        let now = wake.load(Acquire);
        if now != seen {
            seen = now;
            pidfd::signal(event);
        }
    }
}

impl AsFd for WakeFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.event.as_fd()
    }
}

impl AsRawFd for WakeFd {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.event.as_raw_fd()
    }
}

impl Drop for WakeFd {
    fn drop(&mut self) {
        let Some(forwarder) = self.forwarder.take() else {
            return;
        };
        if self.fork_epoch != fork::epoch() {
            // A forked child's copy: the thread is the parent's.
            std::mem::forget(forwarder);
            return;
        }
        self.stop.store(true, Ordering::Release);
        if self.inner.check_size().is_ok() {
            futex::wake_all(&self.inner.header().wake);
        }
        let _ = forwarder.join();
    }
}
