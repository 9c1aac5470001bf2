//! Who wakes a caller-driven reaper: anything that makes a scan due before
//! its time. Registrations, deregistrations, replacements and clear requests,
//! from any process, bump the futex word `wake` in the header; the exit
//! watcher bumps it too when a watched process exits. A futex cannot be
//! polled, so a forwarding thread waits on it and makes an eventfd readable:
//! the descriptor an epoll loop or asyncio waits on, with the time to the
//! next periodic scan as its timeout.

use crate::clock::{deadline_after, time_left};
use crate::error::Result;
use crate::os::fork;
use crate::os::{eventfd, futex};
use crate::sync::Ordering::{Acquire, Release};
use crate::table::memory::TableMemory;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// How often the forwarder looks at its stop flag and the table's size when
/// nothing wakes it.
const FORWARDER_TICK: Duration = Duration::from_millis(100);

/// Longest sleep between looks at a condition the reaper settles: a waiter
/// also notices a reaper that died (which announces nothing) this soon.
const SETTLED_RECHECK: Duration = Duration::from_millis(50);

impl TableMemory {
    /// Wakes a sleeping reaper.
    pub fn wake_reaper(&self) {
        // The word is in the header: a truncated table has none to bump (and
        // its reaper finds the truncation at its next size check anyway).
        if self.check_size().is_err() {
            return;
        }
        let header = self.header();
        header.wake.fetch_add(1, Release);
        futex::wake_all(&header.wake);
    }

    /// The wake word now, to sleep on after a scan (see
    /// [`TableMemory::sleep_until_woken`]).
    ///
    /// # Errors
    ///
    /// `Error::Corrupt` if the table was truncated (the word is in its header).
    pub fn wake_word(&self) -> Result<u32> {
        self.check_size()?;
        Ok(self.header().wake.load(Acquire))
    }

    /// The reaper thread's sleep: until `due()` is zero, the wake word has
    /// moved past `seen` (a registration, deregistration, clear request or
    /// watched exit since), or `stop` is set.
    ///
    /// # Errors
    ///
    /// `Error::Corrupt` if the table was truncated while it slept.
    pub fn sleep_until_woken(
        &self,
        seen: u32,
        due: impl Fn() -> Duration,
        stop: &AtomicBool,
    ) -> Result<()> {
        let wake = &self.header().wake;
        loop {
            let left = due();
            if stop.load(Ordering::Acquire) || left.is_zero() {
                return Ok(());
            }
            self.check_size()?;
            if wake.load(Acquire) != seen {
                return Ok(());
            }
            futex::wait(wake, seen, left);
        }
    }

    /// Tells waiters that slots were released or a clear completed.
    pub fn announce_settled(&self) {
        let header = self.header();
        header.settled.fetch_add(1, Release);
        futex::wake_all(&header.settled);
    }

    /// Waits up to `wait` for `done()`, rechecking whenever the reaper
    /// announces progress. Returns whether `done()` held.
    pub fn wait_settled(&self, wait: Duration, mut done: impl FnMut() -> bool) -> bool {
        let settled = &self.header().settled;
        let deadline = deadline_after(wait);
        loop {
            let seen = settled.load(Acquire);
            if done() {
                return true;
            }
            let left = time_left(deadline);
            if left.is_zero() {
                return false;
            }
            futex::wait(settled, seen, left.min(SETTLED_RECHECK));
        }
    }
}

/// An eventfd readable whenever the table's wake word changed since the
/// reaper last drained it.
pub(crate) struct WakeFd {
    event: Arc<OwnedFd>,
    stop: Arc<AtomicBool>,
    memory: Arc<TableMemory>,
    forwarder: Option<JoinHandle<()>>,
    fork_epoch: u64,
}

impl WakeFd {
    /// Creates the eventfd and starts the thread that forwards the table's
    /// wake-ups to it.
    pub(crate) fn start(inner: Arc<TableMemory>) -> std::io::Result<WakeFd> {
        let event = Arc::new(eventfd::event_nonblocking()?);
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
            memory: inner,
            forwarder: Some(forwarder),
            fork_epoch: fork::install(),
        })
    }

    /// Consumes the pending wake-ups (the scan about to run answers them).
    pub(crate) fn drain(&self) {
        eventfd::drain(&self.event);
    }
}

/// Waits on the wake word, from the value `seen`, and signals `event` at each
/// change, until `stop`.
/// A truncated table has no wake word any more: one last signal makes the
/// reaper scan (and report it), and the thread ends.
fn forward(inner: &TableMemory, mut seen: u32, event: &OwnedFd, stop: &AtomicBool) {
    let wake = &inner.header().wake;
    while !stop.load(Ordering::Acquire) {
        futex::wait(wake, seen, FORWARDER_TICK);
        if inner.check_size().is_err() {
            eventfd::signal(event);
            return;
        }
        let now = wake.load(Acquire);
        if now != seen {
            seen = now;
            eventfd::signal(event);
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
        if self.memory.check_size().is_ok() {
            futex::wake_all(&self.memory.header().wake);
        }
        let _ = forwarder.join();
    }
}
