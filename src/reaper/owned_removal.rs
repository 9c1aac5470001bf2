//! The files a process owned, removed once it has ended, on a thread of
//! the reaper's own (`livereg-owned`), never on the scan's path: each scan
//! asks for a round and takes what the rounds so far removed, without
//! waiting, so a directory on a hung file system stalls only this thread.
//!
//! A round is `table/owned_sweep.rs`'s: bounded work over the records,
//! which anyone who may write the table may write; this thread logs at
//! most [`LINES_PER_SECOND`] of its refusals and [`REMOVALS_PER_SECOND`]
//! of its removals a second. A reaper killed in
//! the middle of a round leaves the rest declared, and the next reaper
//! removes it (a file already gone is no error).

use crate::os::lock;
use crate::session::limited_log::Limiter;
use crate::table::memory::TableMemory;
use crate::table::owned_sweep::{self, Swept};
use std::fs::File;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// The most refusals logged a second (each with how many were held back).
const LINES_PER_SECOND: u64 = 5;
/// The most removals logged a second: each is a real removal, but a
/// writer of the table can make many.
const REMOVALS_PER_SECOND: u64 = 50;
/// How long a reaper's drop waits for the thread before leaving it (one
/// stuck on a hung file system) to end with the process.
const STOP_WAIT: Duration = Duration::from_secs(1);

/// The owned-file removal thread of a reaper.
pub(crate) struct OwnedRemover {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    /// The fork epoch it was started in: a forked child has no such
    /// thread, and its copy touches nothing of the parent's (its lock may
    /// have been held at the fork).
    epoch: u64,
}

#[derive(Default)]
struct Asked {
    /// A round is asked for and not yet begun.
    round: bool,
    stop: bool,
    ended: bool,
    /// What rounds removed, not yet taken by a scan.
    removed: Vec<PathBuf>,
}

#[derive(Default)]
struct Shared {
    asked: Mutex<Asked>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Asked> {
        self.asked.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl OwnedRemover {
    /// Starts the thread for `memory`'s table; `None` for a table without
    /// owned-file records, or when the thread or its descriptor cannot be
    /// had (no file is removed then, and none wrongly).
    pub(crate) fn start(memory: Arc<TableMemory>) -> Option<OwnedRemover> {
        // A description of its own, holding no lock: the owner locks of
        // every process, this one's included, show as held by another.
        let locks = lock::reopen(memory.owned.as_ref()?.file()).ok()?;
        let shared = Arc::new(Shared::default());
        let ours = shared.clone();
        let thread = std::thread::Builder::new()
            .name("livereg-owned".into())
            .spawn(move || serve(&memory, &locks, &ours))
            .ok()?;
        Some(OwnedRemover {
            shared,
            thread: Some(thread),
            epoch: crate::os::fork::install(),
        })
    }

    /// Asks for a round (one already asked and not begun counts) and
    /// returns what the rounds removed since the last call.
    pub(crate) fn ask(&self) -> Vec<PathBuf> {
        let mut asked = self.shared.lock();
        asked.round = true;
        self.shared.changed.notify_all();
        std::mem::take(&mut asked.removed)
    }
}

impl Drop for OwnedRemover {
    fn drop(&mut self) {
        if self.epoch != crate::os::fork::epoch() {
            std::mem::forget(self.thread.take());
            return;
        }
        let mut asked = self.shared.lock();
        asked.stop = true;
        self.shared.changed.notify_all();
        let (asked, _) = self
            .shared
            .changed
            .wait_timeout_while(asked, STOP_WAIT, |asked| !asked.ended)
            .unwrap_or_else(|p| p.into_inner());
        if asked.ended {
            drop(asked);
            if let Some(thread) = self.thread.take() {
                let _ = thread.join();
            }
        }
    }
}

fn serve(memory: &TableMemory, locks: &File, shared: &Shared) {
    let log = Limiter::per_second(LINES_PER_SECOND);
    let removals = Limiter::per_second(REMOVALS_PER_SECOND);
    loop {
        {
            let mut asked = shared.lock();
            while !asked.round && !asked.stop {
                asked = shared.changed.wait(asked).unwrap_or_else(|p| p.into_inner());
            }
            if asked.stop {
                asked.ended = true;
                shared.changed.notify_all();
                return;
            }
            asked.round = false;
        }
        let Some(records) = memory.owned_records() else {
            continue;
        };
        let table = &memory.name;
        owned_sweep::round(records, locks, &mut |swept| match swept {
            Swept::Removed {
                path,
                size,
                held: bytes_held,
                pid,
            } => {
                if let Some(held_back) = removals.admit() {
                    log::info!(
                        "table '{table}': removed {} ({size} bytes, {bytes_held} held), owned by pid {pid}, which has ended{}",
                        path.display(),
                        held(held_back)
                    );
                }
                shared.lock().removed.push(path);
            }
            Swept::Refused { pid, why } => {
                if let Some(held_back) = log.admit() {
                    log::warn!(
                        "table '{table}': a file owned by pid {pid} is left in place: {why}{}",
                        held(held_back)
                    );
                }
            }
            Swept::Unreadable(e) => {
                if let Some(held_back) = log.admit() {
                    log::warn!(
                        "table '{table}': its owned-file records cannot be read whole ({e}): nothing removed this round{}",
                        held(held_back)
                    );
                }
            }
        });
    }
}

/// The tail of a log line after others like it were held back.
fn held(held_back: u64) -> String {
    match held_back {
        0 => String::new(),
        n => format!(" ({n} lines like it held back)"),
    }
}

