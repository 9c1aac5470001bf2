//! Instant exit detection where the OS allows it: the reaper watches each
//! registered process through a pidfd, and a watcher thread wakes the reaper
//! the moment one exits, instead of at its next scan.
//!
//! A recorded pid is never trusted alone: it may belong to another PID
//! namespace (a container sharing `/dev/shm`), or have been reused. The reaper
//! watches it only if the registration's process tag says the registrant lives
//! in the reaper's own PID namespace, and only after opening a pidfd for it
//! and checking that the process it names started when the registration says
//! (`/proc/PID/stat`). Otherwise the
//! registration relies on its lock: every registrant holds the lock through a
//! descriptor of its own on the table, which the kernel closes when it dies,
//! in any namespace. The watcher also waits on an inotify watch for those
//! closes (`os/inotify.rs`), so such a death wakes the reaper at once too; and
//! the reaper tests locks only after a close (or on a slow backstop), not at
//! every scan.

use crate::os::fork;
use crate::os::inotify::CloseWatch;
use crate::os::{epoll, eventfd, pidfd, process};
use crate::sync::Ordering::Relaxed;
use crate::table::layout::{namespace_tag, Slot, FLAG_PIDFD, FLAG_PROXY, PROCESS_TAG_SHIFT};
use crate::table::memory::TableMemory;
use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// Key of the watcher's own stop event in the epoll set.
const STOP: u64 = u64::MAX;
/// Key of the inotify watch for closes of the table's written descriptors.
const CLOSED: u64 = u64::MAX - 1;

/// Whether a registration's lock is to be tested in this scan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LockCheck {
    /// Not while a pidfd watches its live process: the pidfd says when.
    Never,
    /// Now: first seen (its process may have died before it could be
    /// watched), or its pidfd fired.
    Now,
    /// Only when locks may have moved: a descriptor on the table was closed
    /// since the last test (a registrant died or let go), or closes are not
    /// watched here.
    WhenLocksMoved,
}

/// A process as a registration names it: its pid and its start time, so a
/// reused pid is another process.
type ProcessId = (u32, u64);

/// What the reaper knows of one slot's watch.
enum Watch {
    /// Nothing tried for this generation yet.
    Unknown,
    /// Tried: not verifiable here (another namespace, a reused pid, a proxy
    /// registration, or no descriptor to spare).
    Unwatchable(u32),
    /// `generation`'s process is watched through the shared pidfd of `process`.
    Watching { generation: u32, process: ProcessId },
}

/// One watched process: its pidfd (closed when the last registration of the
/// process ends, which also removes it from the epoll set), its epoll key,
/// and how many registrations use it.
struct Watched {
    _pidfd: OwnedFd,
    key: u64,
    users: u32,
    exited: bool,
}

/// The watcher thread and the pidfds it waits on: one per registered
/// process, however many registrations it holds, so the reaper's descriptors
/// grow with processes, not registrations.
pub(crate) struct ExitWatcher {
    epoll: Arc<epoll::Epoll>,
    stop: OwnedFd,
    thread: Option<JoinHandle<()>>,
    watches: Vec<Watch>,
    processes: HashMap<ProcessId, Watched>,
    /// The process behind each epoll key.
    keys: HashMap<u64, ProcessId>,
    next_key: u64,
    /// Whether running short of descriptors was already logged.
    warned: bool,
    /// Epoll keys of the pidfds that fired, filled by the watcher thread.
    fired: Arc<Mutex<Vec<u64>>>,
    /// The fork epoch the thread was started in.
    fork_epoch: u64,
    /// Set by the watcher thread when a written descriptor on the table was
    /// closed; `None` where closes cannot be watched (every scan tests locks).
    closed: Option<Arc<AtomicBool>>,
}

/// The watcher thread: waits on the pidfds, the close watch and the stop
/// descriptor; records what fired and wakes the reaper. After a close, it
/// wakes the reaper once more [`CLOSE_RECHECK`] later, for the second lock
/// round the close is owed.
fn watch_loop(
    epoll: &epoll::Epoll,
    fired: &Mutex<Vec<u64>>,
    watch: Option<CloseWatch>,
    closed: Option<Arc<AtomicBool>>,
    inner: &TableMemory,
) {
    let mut recheck = false;
    loop {
        let keys: Vec<u64> = match epoll.wait(recheck.then_some(CLOSE_RECHECK)) {
            Ok(ready) => ready.iter().map(|r| r.key).collect(),
            Err(_) => return,
        };
        if keys.contains(&STOP) {
            return;
        }
        if keys.is_empty() {
            if recheck {
                // The reaper owes the close a second round (see
                // `LockTests::owed`): have it now rather than at the next scan.
                recheck = false;
                inner.wake_reaper();
            }
            continue;
        }
        let mut exited = keys;
        if exited.contains(&CLOSED) {
            exited.retain(|key| *key != CLOSED);
            if let (Some(watch), Some(closed)) = (&watch, &closed) {
                watch.drain();
                closed.store(true, Ordering::Release);
                recheck = true;
            }
        }
        fired
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .extend(exited);
        inner.wake_reaper();
    }
}

/// How long after a close the watcher wakes the reaper for a second lock
/// round: time for the closing process to drop the file's locks.
pub(crate) const CLOSE_RECHECK: std::time::Duration = std::time::Duration::from_millis(5);

impl ExitWatcher {
    /// Starts the watcher thread for the table behind `inner`.
    pub(crate) fn start(inner: Arc<TableMemory>) -> std::io::Result<ExitWatcher> {
        let epoll = Arc::new(epoll::Epoll::new()?);
        let stop = eventfd::event()?;
        epoll.add(&stop, STOP)?;
        let watch = inner
            .file()
            .and_then(|file| CloseWatch::new(file).ok())
            .filter(|watch| epoll.add_level(watch, CLOSED).is_ok());
        let closed = watch.as_ref().map(|_| Arc::new(AtomicBool::new(false)));
        let fired = Arc::new(Mutex::new(Vec::new()));
        let (waiting, report, closing) = (epoll.clone(), fired.clone(), closed.clone());
        let thread = std::thread::Builder::new()
            .name("livereg-exit-watch".into())
            .spawn(move || watch_loop(&waiting, &report, watch, closing, &inner))?;
        Ok(ExitWatcher {
            epoll,
            stop,
            thread: Some(thread),
            watches: Vec::new(),
            processes: HashMap::new(),
            keys: HashMap::new(),
            next_key: 0,
            warned: false,
            fired,
            fork_epoch: fork::install(),
            closed,
        })
    }

    /// Whether locks may have moved since the last call: a written
    /// descriptor on the table was closed, or closes are not watched.
    pub(crate) fn take_locks_moved(&self) -> bool {
        match &self.closed {
            Some(closed) => closed.swap(false, Ordering::AcqRel),
            None => true,
        }
    }

    /// Takes note of the pidfds that fired since the last call.
    pub(crate) fn collect_fired(&mut self) {
        let fired = std::mem::take(
            &mut *self
                .fired
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        );
        for key in fired {
            if let Some(watched) = self.keys.get(&key).and_then(|p| self.processes.get_mut(p)) {
                watched.exited = true;
            }
        }
    }

    /// When registration `(index, generation)` needs its lock tested: not
    /// while a pidfd watches its live process (the pidfd will say when it
    /// exits), now once that pidfd fired or when first seen, and whenever
    /// locks moved when no pidfd can watch it. Starts watching it if it can.
    pub(crate) fn lock_check(&mut self, index: u32, generation: u32, slot: &Slot) -> LockCheck {
        let at = index as usize;
        if at >= self.watches.len() {
            self.watches.resize_with(at + 1, || Watch::Unknown);
        }
        match &self.watches[at] {
            Watch::Watching {
                generation: g,
                process,
            } if *g == generation => {
                let exited = self.processes.get(process).map_or(true, |w| w.exited);
                return if exited {
                    LockCheck::Now
                } else {
                    LockCheck::Never
                };
            }
            Watch::Unwatchable(g) if *g == generation => return LockCheck::WhenLocksMoved,
            _ => {}
        }
        self.forget(index);
        let flags = slot.flags.load(Relaxed);
        let proxy = flags & FLAG_PROXY != 0;
        // The pid means the registrant only in the namespace it was read in:
        // watched only if the registrant says that namespace is ours.
        let ours = flags >> PROCESS_TAG_SHIFT == namespace_tag(process::pid_namespace());
        let process = (slot.pid.load(Relaxed), slot.process_start.load(Relaxed));
        self.watches[at] = if !proxy && ours && self.watch(process) {
            slot.flags.fetch_or(FLAG_PIDFD, Relaxed);
            Watch::Watching {
                generation,
                process,
            }
        } else {
            Watch::Unwatchable(generation)
        };
        // Checked once now either way: the process may have exited before the
        // pidfd was opened (the open fails then) or after (it fires).
        LockCheck::Now
    }

    /// Adds a user to `process`'s pidfd, opening it if it is the first.
    /// False if it cannot be watched from here.
    fn watch(&mut self, process: ProcessId) -> bool {
        if let Some(watched) = self.processes.get_mut(&process) {
            watched.users += 1;
            return true;
        }
        let pidfd = match open_verified(process) {
            Ok(Some(pidfd)) => pidfd,
            Ok(None) => return false,
            Err(e) => {
                self.short_of_descriptors(&e);
                return false;
            }
        };
        let key = self.next_key;
        if let Err(e) = self.epoll.add(&pidfd, key) {
            self.short_of_descriptors(&e);
            return false;
        }
        self.next_key += 1;
        self.keys.insert(key, process);
        self.processes.insert(
            process,
            Watched {
                _pidfd: pidfd,
                key,
                users: 1,
                exited: false,
            },
        );
        true
    }

    /// Logs, once, that exit detection falls back to the lock check.
    fn short_of_descriptors(&mut self, error: &std::io::Error) {
        if !self.warned {
            self.warned = true;
            log::warn!(
                "cannot watch more processes through pidfds ({error}): their exits are seen at the next scan \
                 by the lock check instead (raise the open-files limit to restore instant detection)"
            );
        }
    }

    /// Stops watching slot `index` (its registration ended), closing its
    /// process's pidfd if it was the last registration of that process.
    pub(crate) fn forget(&mut self, index: u32) {
        let Some(watch) = self.watches.get_mut(index as usize) else {
            return;
        };
        if let Watch::Watching { process, .. } = std::mem::replace(watch, Watch::Unknown) {
            if let Some(watched) = self.processes.get_mut(&process) {
                watched.users -= 1;
                if watched.users == 0 {
                    let key = watched.key;
                    self.processes.remove(&process);
                    self.keys.remove(&key);
                }
            }
        }
    }
}

/// A pidfd for `process` if its pid names that process in this namespace
/// (same start time, checked after opening, so the pid cannot be reused in
/// between); `None` if it does not or is gone; an error if no descriptor
/// could be had (`EMFILE`, `ENFILE`).
fn open_verified((pid, started): ProcessId) -> std::io::Result<Option<OwnedFd>> {
    if pid == 0 || started == 0 {
        return Ok(None);
    }
    let short = |e: &std::io::Error| matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE));
    let fd = match pidfd::open(pid) {
        Ok(fd) => fd,
        Err(e) if short(&e) => return Err(e),
        Err(_) => return Ok(None),
    };
    match process::read_start_time(&pid.to_string()) {
        Ok(found) => Ok((found == started).then_some(fd)),
        Err(e) if short(&e) => Err(e),
        Err(_) => Ok(None),
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
        eventfd::signal(&self.stop);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
