//! The files a process owned, removed once it has ended: at every scan,
//! each held owner record whose lock no process holds any more (the
//! kernel released it with the process's last descriptor: it has ended or
//! exec'd) has its declared files removed, each only if its name, looked
//! at without following links in the allowed directory it was declared
//! in, still holds the same file (device and inode) of an owner the rules
//! allow; then the record is freed. A reaper killed in the middle leaves
//! the rest declared, and the next reaper removes it (a file already gone
//! is no error).

use super::role::Reaper;
use crate::os::lock;
use crate::os::same_file::{self, Removal};
use crate::sync::Ordering::{AcqRel, Acquire, Relaxed};
use crate::table::owned_records::{
    owner_lock, Counter, OwnedRecords, OwnerRecord, DECLARED, FILES, FREE, HELD, NAME_MAX,
    PROCESSES,
};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

impl Reaper {
    /// Removes what every ended owner owned; returns the paths removed.
    pub(super) fn remove_owned_files(&self) -> Vec<PathBuf> {
        let memory = &self.table.memory;
        let (Some(records), Some(lock)) = (memory.owned_records(), &self.role.lock) else {
            return Vec::new();
        };
        let mut removed = Vec::new();
        for index in 0..PROCESSES {
            let owner = records.owner(index);
            if owner.state.load(Acquire) != HELD
                || lock::held_by_other(lock, owner_lock(index)).unwrap_or(true)
            {
                continue;
            }
            for file in 0..FILES {
                let path = remove_one(records, &memory.name, owner, index, file);
                removed.extend(path);
            }
            let _ = owner.state.compare_exchange(HELD, FREE, AcqRel, Relaxed);
        }
        removed
    }
}

/// Removes file record `file` of owner `index` if it is declared and
/// allowed; frees the record. Returns the path removed.
fn remove_one(
    records: &OwnedRecords,
    table: &str,
    owner: &OwnerRecord,
    index: u32,
    file: u32,
) -> Option<PathBuf> {
    let record = records.file(index, file);
    if record.state.load(Acquire) != DECLARED {
        return None;
    }
    let name_bytes = record.name.load();
    let name = OsStr::from_bytes(&name_bytes);
    let dir = records.dirs().get(record.dir.load(Relaxed) as usize);
    let pid = owner.pid.load(Relaxed);
    let refuse = |why: &str| {
        records.counter(Counter::Refused).fetch_add(1, Relaxed);
        log::warn!("table '{table}': a file owned by pid {pid} is left in place: {why}");
    };
    let outcome = match dir {
        None => {
            refuse("its record names no allowed directory");
            None
        }
        Some(_) if !plain_name(&name_bytes) => {
            refuse("its record holds no plain file name");
            None
        }
        Some(dir) => {
            let path = dir.join(name);
            let (dev, ino) = (record.dev.load(Relaxed), record.ino.load(Relaxed));
            let removal = same_file::open_dir(dir).and_then(|handle| {
                same_file::remove_if_same(&handle, name, dev, ino, |uid| {
                    records.may_remove(
                        uid,
                        owner.uid.load(Relaxed),
                        owner.privileged.load(Relaxed) == 1,
                    )
                })
            });
            match removal {
                Ok(Removal::Removed(identity)) => {
                    records.counter(Counter::Removed).fetch_add(1, Relaxed);
                    records
                        .counter(Counter::BytesFreed)
                        .fetch_add(identity.held, Relaxed);
                    log::info!(
                        "table '{table}': removed {} ({} bytes, {} held), owned by pid {pid}, which has ended",
                        path.display(),
                        identity.size,
                        identity.held
                    );
                    Some(path)
                }
                Ok(Removal::Missing) => None,
                Ok(Removal::Replaced) => {
                    refuse(&format!(
                        "{} is no longer the file it declared, or belongs to a user whose files the reaper may not remove",
                        path.display()
                    ));
                    None
                }
                Err(e) => {
                    refuse(&format!("{}: {e}", path.display()));
                    None
                }
            }
        }
    };
    record.state.store(FREE, Relaxed);
    outcome
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
