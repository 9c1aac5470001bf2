//! The kernel-held locks on a table: the reaper role (one reaper per table,
//! released by the kernel when its holder dies) and the registration lock
//! (one registrant claims a slot at a time, across processes). Slot locks,
//! held by each registrant on its own slot's byte, live in `worker/handle.rs` and
//! are checked by the reaper in `reaper/lock_rounds.rs`; the byte ranges are
//! in `os/lock.rs`.

use crate::error::{Error, Result};
use crate::os::fork::{self, LockDescriptor};
use crate::os::lock;
use crate::sync::Ordering::{AcqRel, Acquire, Relaxed, Release};
use crate::table::memory::TableMemory;
use std::fs::File;
use std::sync::{Arc, MutexGuard};
use std::time::{Duration, Instant};

/// How long a registrant waits for the registration lock.
pub(crate) const REGISTRATION_LOCK_WAIT: Duration = Duration::from_secs(5);
/// How often a registrant tries the registration lock again (a kernel lock
/// cannot be waited on with a timeout): held for microseconds per claim.
const REGISTRATION_LOCK_POLL: Duration = Duration::from_micros(200);

impl TableMemory {
    /// Whether some reaper holds this table's reaper role.
    pub fn reaper_role_taken(&self) -> bool {
        match (self.file(), self.heap_reaper_flag()) {
            (Some(file), _) => lock::held_by_other(file, lock::REAPER_LOCK).unwrap_or(false),
            (None, Some(taken)) => taken.load(Acquire),
            (None, None) => false,
        }
    }

    /// Takes the reaper role: on a shared table, a lock on a new open file
    /// description that the kernel drops when its holder dies.
    pub fn take_reaper_role(self: &Arc<Self>) -> Result<ReaperRole> {
        let busy = || {
            Error::busy(format!(
                "table '{}': another reaper (pid {}) is running",
                self.name,
                self.header().reaper_pid.load(Relaxed)
            ))
        };
        match (self.file(), self.heap_reaper_flag()) {
            (Some(file), _) => {
                // A failed attempt keeps its descriptor for the next one:
                // closing it would wake the active reaper's lock round (it
                // listens for closes on the table), so a standby polling for
                // the role would make the active reaper scan at every poll.
                let mut candidate = self
                    .reaper_candidate
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
                let epoch = fork::install();
                let own = match candidate.take() {
                    Some((descriptor, opened_in)) if opened_in == epoch => descriptor,
                    // (A forked child's copy is already /dev/null: dropping it
                    // closes nothing of the table's.)
                    _ => LockDescriptor::new(
                        lock::reopen(file)
                            .map_err(|e| Error::os(&self.name, "open for the reaper lock", e))?,
                    ),
                };
                match lock::try_lock(&own, lock::REAPER_LOCK) {
                    Ok(true) => Ok(ReaperRole {
                        memory: self.clone(),
                        lock: Some(own),
                        fork_epoch: epoch,
                    }),
                    Ok(false) => {
                        *candidate = Some((own, epoch));
                        Err(busy())
                    }
                    Err(e) => Err(Error::os(&self.name, "take the reaper lock", e)),
                }
            }
            (None, taken) => {
                if taken.is_some_and(|taken| taken.swap(true, AcqRel)) {
                    Err(busy())
                } else {
                    Ok(ReaperRole {
                        memory: self.clone(),
                        lock: None,
                        fork_epoch: fork::install(),
                    })
                }
            }
        }
    }

    /// Takes the registration lock: this process's mutex, then (on a shared
    /// table) the kernel lock through the registrant's own descriptor `file`,
    /// polling for up to `wait` ([`REGISTRATION_LOCK_WAIT`] for a
    /// registrant; zero for a listener, which must never wait on a lock
    /// another process holds). (Its own descriptor: a forked child shares
    /// the table's, and with it any lock taken through it.)
    ///
    /// The mutex is held only while the kernel lock is too: a registrant
    /// polling for a lock another process holds lets go of the mutex between
    /// its attempts, so a listener in the same process waits at most for
    /// another thread's claim in progress (microseconds), never for another
    /// process.
    pub fn lock_registrations<'a>(
        &'a self,
        file: Option<&'a File>,
        wait: Duration,
    ) -> Result<RegistrationGuard<'a>> {
        let started = Instant::now();
        loop {
            let local = self
                .local_registrations()
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let Some(file) = file else {
                return Ok(RegistrationGuard {
                    _local: local,
                    file: None,
                });
            };
            match lock::try_lock(file, lock::REGISTRATION_LOCK) {
                Ok(true) => {
                    return Ok(RegistrationGuard {
                        _local: local,
                        file: Some(file),
                    })
                }
                Ok(false) if started.elapsed() < wait => {
                    drop(local);
                    std::thread::sleep(REGISTRATION_LOCK_POLL);
                }
                Ok(false) => {
                    return Err(Error::busy(format!(
                        "table '{}': another process holds the registration lock (waited {wait:?}; \
                         stopped in the middle of registering?): try again",
                        self.name
                    )))
                }
                Err(e) => return Err(Error::os(&self.name, "take the registration lock", e)),
            }
        }
    }
}

/// The registration lock, released on drop.
pub(crate) struct RegistrationGuard<'a> {
    _local: MutexGuard<'a, ()>,
    file: Option<&'a File>,
}

impl Drop for RegistrationGuard<'_> {
    fn drop(&mut self) {
        if let Some(file) = self.file {
            let _ = lock::unlock(file, lock::REGISTRATION_LOCK);
        }
    }
}

/// The reaper role of a table, held until dropped.
pub(crate) struct ReaperRole {
    memory: Arc<TableMemory>,
    /// The role's own open file description: it holds the reaper lock, and
    /// checks slot locks (any other description's lock is "someone else's").
    pub lock: Option<LockDescriptor>,
    /// The fork epoch the role was taken in: a forked child's copy is not
    /// the role, and must leave the parent's reaper alone.
    fork_epoch: u64,
}

impl ReaperRole {
    /// Whether this is the process that took the role (not a forked child).
    pub fn held_here(&self) -> bool {
        self.fork_epoch == fork::epoch()
    }
}

impl Drop for ReaperRole {
    fn drop(&mut self) {
        if !self.held_here() {
            return;
        }
        // A truncated table has no header to write to any more.
        if self.memory.check_size().is_ok() {
            self.memory.header().reaper_pid.store(0, Relaxed);
        }
        if let Some(taken) = self.memory.heap_reaper_flag() {
            taken.store(false, Release);
        }
    }
}
