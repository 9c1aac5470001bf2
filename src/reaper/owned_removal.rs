//! The files a process owned, removed once it has ended, on a thread of
//! the reaper's own (`livereg-owned`), never on the scan's path: each scan
//! asks for a round and takes what the rounds so far removed, without
//! waiting, so a directory on a hung file system stalls only this thread.
//!
//! A round reads the owner records (one `pread`), and each held record
//! whose lock no process holds any more (the kernel released it with the
//! process's last descriptor: it has ended or exec'd) has its declared
//! files removed, each only if its name, looked at without following links
//! in the allowed directory it was declared in, still holds the same file
//! and every rule of `table/removal_rules.rs` holds; then the record is
//! freed. Anyone who may write the table may write the records, so a round
//! does at most [`FILES_PER_ROUND`] files (the rest wait for the next
//! round) and logs at most [`LINES_PER_SECOND`] refusals a second. A
//! reaper killed in the middle leaves the rest declared, and the next
//! reaper removes it (a file already gone is no error).

use crate::os::lock;
use crate::os::same_file::{self, DirFacts, Removal};
use crate::session::limited_log::Limiter;
use crate::table::memory::TableMemory;
use crate::table::owned_records::{
    owner_lock, Counter, FileRecord, OwnedRecords, OwnerRecord, DECLARED, FREE, HELD, NAME_MAX,
};
use crate::table::removal_rules::{self, Declared, Declarer, RecordsTrust};
use std::ffi::OsStr;
use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// The most declared files one round looks at.
pub(crate) const FILES_PER_ROUND: u32 = 256;
/// The most refusals logged a second (each with how many were held back).
const LINES_PER_SECOND: u64 = 5;
/// How long a reaper's drop waits for the thread before leaving it (one
/// stuck on a hung file system) to end with the process.
const STOP_WAIT: Duration = Duration::from_secs(1);

/// The owned-file removal thread of a reaper.
pub(crate) struct OwnedRemover {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
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
        memory.owned.as_ref()?;
        // A description of its own, holding no lock: the owner locks of
        // every process, this one's included, show as held by another.
        let locks = lock::reopen(memory.file()?).ok()?;
        let shared = Arc::new(Shared::default());
        let ours = shared.clone();
        let thread = std::thread::Builder::new()
            .name("livereg-owned".into())
            .spawn(move || serve(&memory, &locks, &ours))
            .ok()?;
        Some(OwnedRemover {
            shared,
            thread: Some(thread),
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
        round(memory, locks, &log, shared);
    }
}

/// What a round counted, added to the records' counters once at its end.
#[derive(Default)]
struct Tally {
    removed: u64,
    freed: u64,
    refused: u64,
}

/// One round over the records of `memory`'s table. Each path removed is
/// handed to `shared` before its owner's record is freed, so a scan that
/// finds no owner left takes every path removed.
fn round(memory: &TableMemory, locks: &File, log: &Limiter, shared: &Shared) {
    let Some(records) = memory.owned_records() else {
        return;
    };
    let table = &memory.name;
    let owners = match records.owners() {
        Ok(owners) => owners,
        Err(e) => {
            if let Some(held_back) = log.admit() {
                log::warn!("table '{table}': its owned-file records cannot be read whole ({e}): nothing removed this round{}", held(held_back));
            }
            return;
        }
    };
    let mut round = Round {
        records,
        trust: records.trust(),
        table,
        dirs: vec![None; records.dirs().len()],
        log,
        tally: Tally::default(),
        shared,
    };
    let mut budget = FILES_PER_ROUND;
    'owners: for (index, owner) in (0u32..).zip(&owners) {
        if owner.state != HELD || lock::held_by_other(locks, owner_lock(index)).unwrap_or(true) {
            continue;
        }
        let Ok(files) = records.files(index) else {
            break;
        };
        for (slot, file) in (0u32..).zip(&files) {
            if file.state != DECLARED {
                continue;
            }
            if budget == 0 {
                break 'owners;
            }
            budget -= 1;
            round.remove_one(owner, file);
            let _ = records.set_file_state(index, slot, FREE);
        }
        let _ = records.set_owner_state(index, FREE);
    }
    let tally = &round.tally;
    let _ = records.add(Counter::Removed, tally.removed);
    let _ = records.add(Counter::BytesFreed, tally.freed);
    let _ = records.add(Counter::Refused, tally.refused);
}

/// An allowed directory opened to look in, with its facts; or why it
/// cannot be.
type OpenedDir = Result<Arc<(File, DirFacts)>, String>;

/// A round's state: the records, whom they may be believed for, the
/// allowed directories opened so far.
struct Round<'r> {
    records: &'r OwnedRecords,
    trust: RecordsTrust,
    table: &'r str,
    /// Per allowed directory: its handle and facts, or why it cannot be
    /// looked in; opened when a round first needs it.
    dirs: Vec<Option<OpenedDir>>,
    log: &'r Limiter,
    tally: Tally,
    shared: &'r Shared,
}

impl Round<'_> {
    /// Removes `file`, declared by `owner`, if every rule allows it.
    fn remove_one(&mut self, owner: &OwnerRecord, file: &FileRecord) {
        let pid = owner.pid;
        let name = OsStr::from_bytes(&file.name);
        if !plain_name(&file.name) {
            return self.refuse(pid, "its record holds no plain file name");
        }
        let Some(dir) = self.dir(file.dir) else {
            return self.refuse(pid, "its record names no allowed directory");
        };
        let dir = match dir {
            Ok(dir) => dir,
            Err(why) => return self.refuse(pid, &why),
        };
        let (handle, facts) = &*dir;
        let path = self.records.dirs()[file.dir as usize].join(name);
        let declarer = Declarer {
            uid: owner.uid,
            groups: &owner.groups,
        };
        let declared = Declared {
            dev: file.dev,
            ino: file.ino,
            born_ns: file.born_ns,
        };
        let trust = self.trust;
        let removal = same_file::remove_if_same(handle, name, |found| {
            removal_rules::same_file(&declared, found, facts)
                && removal_rules::owner_allows(trust, found.uid, &declarer)
                && removal_rules::directory_allows(facts, found.uid, &declarer)
        });
        match removal {
            Ok(Removal::Removed(identity)) => {
                self.tally.removed += 1;
                self.tally.freed = self.tally.freed.saturating_add(identity.held);
                log::info!(
                    "table '{}': removed {} ({} bytes, {} held), owned by pid {pid}, which has ended",
                    self.table,
                    path.display(),
                    identity.size,
                    identity.held
                );
                self.shared.lock().removed.push(path);
            }
            Ok(Removal::Missing) => {}
            Ok(Removal::Replaced) => self.refuse(
                pid,
                &format!(
                    "{} is no longer the file it declared, or the rules do not let uid {} remove it",
                    path.display(),
                    owner.uid
                ),
            ),
            Err(e) => self.refuse(pid, &format!("{}: {e}", path.display())),
        }
    }

    /// Allowed directory `index` opened, or why it cannot be; `None` for
    /// an index no creator allowed.
    fn dir(&mut self, index: u32) -> Option<OpenedDir> {
        let path = self.records.dirs().get(index as usize)?;
        let entry = self.dirs[index as usize].get_or_insert_with(|| {
            same_file::open_dir(path)
                .and_then(|handle| Ok((same_file::dir_facts(&handle)?, handle)))
                .map(|(facts, handle)| Arc::new((handle, facts)))
                .map_err(|e| format!("its directory {} cannot be looked in: {e}", path.display()))
        });
        Some(entry.clone())
    }

    fn refuse(&mut self, pid: u32, why: &str) {
        self.tally.refused += 1;
        if let Some(held_back) = self.log.admit() {
            log::warn!(
                "table '{}': a file owned by pid {pid} is left in place: {why}{}",
                self.table,
                held(held_back)
            );
        }
    }
}

/// The tail of a log line after others like it were held back.
fn held(held_back: u64) -> String {
    match held_back {
        0 => String::new(),
        n => format!(" ({n} lines like it held back)"),
    }
}

/// One path component: not empty, `.` or `..`, no `/`, at most
/// `NAME_MAX` bytes.
fn plain_name(name: &[u8]) -> bool {
    !name.is_empty()
        && name.len() <= NAME_MAX
        && name != b"."
        && name != b".."
        && !name.contains(&b'/')
        && !name.contains(&0)
}
