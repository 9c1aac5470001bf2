//! The files processes own in a table (see `table/owning.rs`), as the
//! status shows them: the directories allowed, each owner with its count
//! and bytes, and what the reapers removed and refused.

use crate::os::same_file::{self, Found};
use crate::table::memory::TableMemory;
use crate::os::lock;
use crate::table::owned_records::{owner_lock, Counter, DECLARED, HELD};
use serde::{Deserialize, Serialize};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

/// The files processes own in a table: removed by the reaper once their
/// owner has ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnedFilesStatus {
    /// The directories owned files may be in (set at creation, in a file
    /// only the table's owner may write).
    pub dirs: Vec<PathBuf>,
    /// Why no directory is allowed, when that file was not believed (a
    /// link, another user's, writable by others, malformed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dirs_refused: Option<String>,
    /// Each process owning files now (or ended, its files not yet removed).
    pub owners: Vec<OwnerStatus>,
    /// Files the reapers removed, since creation.
    pub removed_total: u64,
    /// The bytes those files held (allocated, as `du` counts).
    pub freed_bytes_total: u64,
    /// Removals refused: the name held another file, a link, or a file of
    /// a user the rules exclude; the name was left alone.
    pub refused_total: u64,
}

/// One process owning files.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnerStatus {
    /// Its pid in its own PID namespace.
    pub pid: u32,
    /// How many files it owns.
    pub files: u32,
    /// Their size, as found now.
    pub bytes: u64,
    /// The bytes they hold (allocated), as found now.
    pub held_bytes: u64,
    /// Whether its process has ended (its lock is free): its files wait
    /// for the reaper's next round.
    #[serde(default)]
    pub ended: bool,
}

/// The owned files of `memory`'s table; `None` for a table without
/// owned-file records, or records cut short.
pub(crate) fn owned_files(memory: &TableMemory) -> Option<OwnedFilesStatus> {
    let records = memory.owned_records()?;
    let dirs: Vec<_> = records
        .dirs()
        .iter()
        .map(|dir| same_file::open_dir(dir).ok())
        .collect();
    let mut owners = Vec::new();
    for (index, owner) in (0u32..).zip(records.owners().ok()?) {
        if owner.state != HELD {
            continue;
        }
        let ended = lock::held_by_other(records.file(), owner_lock(index)).is_ok_and(|held| !held);
        let mut status = OwnerStatus {
            pid: owner.pid,
            files: 0,
            bytes: 0,
            held_bytes: 0,
            ended,
        };
        for record in records.files(index).ok()? {
            if record.state != DECLARED {
                continue;
            }
            status.files += 1;
            let dir = dirs.get(record.dir as usize).and_then(Option::as_ref);
            let found = dir.and_then(|dir| same_file::look(dir, OsStr::from_bytes(&record.name)).ok());
            if let Some(Found::File(identity)) = found {
                if (identity.dev, identity.ino) == (record.dev, record.ino) {
                    status.bytes += identity.size;
                    status.held_bytes += identity.held;
                }
            }
        }
        owners.push(status);
    }
    Some(OwnedFilesStatus {
        dirs: records.dirs().to_vec(),
        dirs_refused: records.dirs_refused().map(str::to_owned),
        owners,
        removed_total: records.counter(Counter::Removed).ok()?,
        freed_bytes_total: records.counter(Counter::BytesFreed).ok()?,
        refused_total: records.counter(Counter::Refused).ok()?,
    })
}
