//! Instant exit detection where the OS allows it: the reaper watches each
//! registered process through a pidfd, and a watcher thread wakes the reaper
//! the moment one exits, instead of at its next scan.
//!
//! A recorded pid is never trusted alone: it may belong to another PID
//! namespace (a container sharing `/dev/shm`), or have been reused. The reaper
//! opens a pidfd for it, then checks that the process it names started when the
//! registration says (`/proc/PID/stat`); only then does it watch. Otherwise the
//! registration relies on its lock alone, seen at the next scan.

use crate::fork;
use crate::layout::Slot;
use crate::os::{pidfd, process};
use crate::sync::Ordering::Relaxed;
use crate::table::Inner;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// Bit of [`Slot::flags`]: the reaper watches this registration's process
/// through a pidfd.
pub(crate) const FLAG_PIDFD: u32 = 1;
/// Bit of [`Slot::flags`], set by the registrant: the recorded pid is not the
/// registering process (a wrapper registered on its behalf), so its exit says
/// nothing about the registration's lock; only the lock counts.
pub(crate) const FLAG_PROXY: u32 = 2;

/// Key of the watcher's own stop event in the epoll set.
const STOP: u64 = u64::MAX;

/// What the reaper knows of one slot's watch.
enum Watch {
    /// Nothing tried for this generation yet.
    Unknown,
    /// Tried: not verifiable here (another namespace, a reused pid).
    Unwatchable(u32),
    /// Watching `generation` through `pidfd` (closed when replaced, which
    /// also removes it from the epoll set).
    Watching { generation: u32, _pidfd: OwnedFd },
    /// The pidfd of `generation` fired: its process exited.
    Fired(u32),
}

/// The watcher thread and the pidfds it waits on.
pub(crate) struct ExitWatcher {
    epoll: Arc<pidfd::Epoll>,
    stop: OwnedFd,
    thread: Option<JoinHandle<()>>,
    watches: Vec<Watch>,
    /// Slots whose pidfd fired, filled by the watcher thread.
    fired: Arc<Mutex<Vec<u32>>>,
    /// The fork epoch the thread was started in.
    fork_epoch: u64,
}

impl ExitWatcher {
    /// Starts the watcher thread for the table behind `inner`.
    pub(crate) fn start(inner: Arc<Inner>) -> std::io::Result<ExitWatcher> {
        let epoll = Arc::new(pidfd::Epoll::new()?);
        let stop = pidfd::event()?;
        epoll.add(&stop, STOP)?;
        let fired = Arc::new(Mutex::new(Vec::new()));
        let (waiting, report) = (epoll.clone(), fired.clone());
        let thread = std::thread::Builder::new()
            .name("livereg-exit-watch".into())
            .spawn(move || loop {
                match waiting.wait() {
                    Ok(keys) if keys.contains(&STOP) => return,
                    Ok(keys) if !keys.is_empty() => {
                        let mut fired = report
                            .lock()
                            .unwrap_or_else(|poisoned| poisoned.into_inner());
                        fired.extend(keys.iter().map(|&key| key as u32));
                        drop(fired);
                        inner.wake_reaper();
                    }
                    Ok(_) => {}
                    Err(_) => return,
                }
            })?;
        Ok(ExitWatcher {
            epoll,
            stop,
            thread: Some(thread),
            watches: Vec::new(),
            fired,
            fork_epoch: fork::install(),
        })
    }

    /// Takes note of the pidfds that fired since the last call.
    pub(crate) fn collect_fired(&mut self) {
        let fired = std::mem::take(
            &mut *self
                .fired
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        );
        for index in fired {
            if let Some(watch) = self.watches.get_mut(index as usize) {
                if let Watch::Watching { generation, .. } = *watch {
                    *watch = Watch::Fired(generation);
                }
            }
        }
    }

    /// Whether registration `(index, generation)` needs its lock checked this
    /// scan: not while a pidfd watches its live process (the pidfd will say
    /// when it exits), but once that pidfd fired, or when no pidfd can watch
    /// it. Starts watching it if it can.
    pub(crate) fn needs_lock_check(&mut self, index: u32, generation: u32, slot: &Slot) -> bool {
        let at = index as usize;
        if at >= self.watches.len() {
            self.watches.resize_with(at + 1, || Watch::Unknown);
        }
        match &self.watches[at] {
            Watch::Watching { generation: g, .. } if *g == generation => return false,
            Watch::Unwatchable(g) | Watch::Fired(g) if *g == generation => return true,
            _ => {}
        }
        let proxy = slot.flags.load(Relaxed) & FLAG_PROXY != 0;
        self.watches[at] = match self.open_verified(slot).filter(|_| !proxy) {
            Some(fd) if self.epoll.add(&fd, u64::from(index)).is_ok() => {
                slot.flags.fetch_or(FLAG_PIDFD, Relaxed);
                Watch::Watching {
                    generation,
                    _pidfd: fd,
                }
            }
            _ => Watch::Unwatchable(generation),
        };
        // Checked once now either way: the process may have exited before the
        // pidfd was opened (the open fails then) or after (it fires).
        true
    }

    /// Stops watching slot `index` (its registration ended).
    pub(crate) fn forget(&mut self, index: u32) {
        if let Some(watch) = self.watches.get_mut(index as usize) {
            *watch = Watch::Unknown;
        }
    }

    /// A pidfd for the slot's pid, if that pid names the registered process
    /// in this namespace (same start time, checked after opening, so the pid
    /// cannot be reused in between).
    fn open_verified(&self, slot: &Slot) -> Option<OwnedFd> {
        let (pid, started) = (slot.pid.load(Relaxed), slot.process_start.load(Relaxed));
        if pid == 0 || started == 0 {
            return None;
        }
        let fd = pidfd::open(pid).ok()?;
        (process::start_time(&pid.to_string()) == Some(started)).then_some(fd)
    }
}

impl Drop for ExitWatcher {
    fn drop(&mut self) {
        if self.fork_epoch != fork::epoch() {
            // A forked child's copy: the thread is the parent's (it does not
            // exist here), and so is the event its stop would be written to.
            std::mem::forget(self.thread.take());
            return;
        }
        pidfd::signal(&self.stop);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
