//! The owned-file records: a file beside a shared table (`NAME.owned`, the
//! table's owner and mode, made and removed with it) where a process that
//! maps the table declares files it made that must not outlive it, and
//! from which the reaper removes them once that process has ended (see
//! `owning.rs` and `reaper/owned_removal.rs`).
//!
//! Every process that may write the table may write this file, at any
//! time, any byte, and may truncate it. So it is never mapped: each
//! record is read into private memory (`pread`) and written back
//! (`pwrite`), a file cut short is a read that comes up short (an error,
//! never a fault), and nothing in it decides where a reaper may remove
//! (the allowed directories are in `owned_dirs.rs`, a file only the
//! table's owner may write).
//!
//! Layout (little-endian): a 64-byte header (magic `LRO2`, the counts,
//! the removal counters), then [`PROCESSES`] owner records of 64 bytes,
//! then [`FILES`] file records of 288 bytes for each owner. An owner
//! record is held by one live process: its holder keeps a lock on a byte
//! of this file (`os/lock.rs`, [`owner_lock`]; only the table's writers
//! may open it, [`writers_only`]) for as long as it lives, so the
//! lock's release is the kernel's word that it has ended; the lock is also
//! what makes a record its holder's alone to write while it lives. A table
//! made by an earlier build has no such file (or one of another magic),
//! and declaring there is refused.

use crate::os::fork::{self, LockDescriptor};
use crate::table::owned_dirs::{self, AllowedDirs};
use crate::table::removal_rules::{RecordsTrust, NAME_MAX};
use crate::table::side_file;
use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

const MAGIC: u32 = u32::from_le_bytes(*b"LRO2");
const HEADER: usize = 64;
/// How many processes may own files in one table at once.
pub const PROCESSES: u32 = 256;
/// How many files one process may own in one table.
pub const FILES: u32 = 64;
/// How many groups an owner record holds: the declarer's effective group
/// and its supplementary groups that own an allowed directory.
pub(crate) const GROUPS: usize = 12;
const OWNER_SIZE: usize = 64;
const FILE_SIZE: usize = 288;

/// An owner record's state: free, or held by a live (or not yet removed)
/// process.
pub(crate) const FREE: u32 = 0;
pub(crate) const HELD: u32 = 1;
/// A file record's state: declared (its fields written before).
pub(crate) const DECLARED: u32 = 1;

/// The records' permissions for a table of `mode`: a class that may not
/// write the table may not read the records either, so that no mere reader
/// can open them and hold an owner's lock (a read lock would keep an ended
/// owner looking alive, and its record taken).
pub(crate) fn writers_only(mode: u32) -> u32 {
    let mut kept = 0;
    for class in [6, 3, 0] {
        if mode >> class & 0o2 != 0 {
            kept |= mode & (0o7 << class);
        }
    }
    kept
}

/// The byte of the records' file locked by owner record `index`'s holder.
pub(crate) fn owner_lock(index: u32) -> u64 {
    (1 << 41) + u64::from(index)
}

/// The process holding an owner record: its state, its id in its own PID
/// namespace (for the status and the logs), its effective user and the
/// groups the directory rule needs, when it took the record.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct OwnerRecord {
    pub state: u32,
    pub pid: u32,
    pub uid: u32,
    pub groups: Vec<u32>,
}

impl OwnerRecord {
    // Bytes 0..16: state, pid, uid, the count of groups; then the groups.
    fn encode(&self) -> [u8; OWNER_SIZE] {
        let mut bytes = [0u8; OWNER_SIZE];
        let groups = &self.groups[..self.groups.len().min(GROUPS)];
        let words = [self.state, self.pid, self.uid, groups.len() as u32];
        for (at, word) in words.iter().chain(groups).enumerate() {
            bytes[at * 4..at * 4 + 4].copy_from_slice(&word.to_le_bytes());
        }
        bytes
    }

    fn decode(bytes: &[u8]) -> OwnerRecord {
        let word = |at: usize| u32::from_le_bytes(bytes[at * 4..at * 4 + 4].try_into().expect("4"));
        let count = (word(3) as usize).min(GROUPS);
        OwnerRecord {
            state: word(0),
            pid: word(1),
            uid: word(2),
            groups: (0..count).map(|g| word(4 + g)).collect(),
        }
    }
}

/// One owned file: the allowed directory it is in (an index into the
/// allowed directories), its name there, and its identity when it was
/// declared: device, inode, birth time (0: none).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct FileRecord {
    pub state: u32,
    pub dir: u32,
    pub dev: u64,
    pub ino: u64,
    pub born_ns: u64,
    pub name: Vec<u8>,
}

impl FileRecord {
    // Bytes 0..32: state, dir, dev, ino, birth time; 32: the name's
    // length; 33..288: the name.
    fn encode(&self) -> [u8; FILE_SIZE] {
        let mut bytes = [0u8; FILE_SIZE];
        bytes[0..4].copy_from_slice(&self.state.to_le_bytes());
        bytes[4..8].copy_from_slice(&self.dir.to_le_bytes());
        bytes[8..16].copy_from_slice(&self.dev.to_le_bytes());
        bytes[16..24].copy_from_slice(&self.ino.to_le_bytes());
        bytes[24..32].copy_from_slice(&self.born_ns.to_le_bytes());
        let len = self.name.len().min(NAME_MAX);
        bytes[32] = len as u8;
        bytes[33..33 + len].copy_from_slice(&self.name[..len]);
        bytes
    }

    fn decode(bytes: &[u8]) -> FileRecord {
        let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4"));
        let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8"));
        let len = usize::from(bytes[32]);
        FileRecord {
            state: u32_at(0),
            dir: u32_at(4),
            dev: u64_at(8),
            ino: u64_at(16),
            born_ns: u64_at(24),
            name: bytes[33..33 + len].to_vec(),
        }
    }
}

/// A table's owned-file records: the file, read and written by offset,
/// and the allowed directories.
pub(crate) struct OwnedRecords {
    file: File,
    dirs: AllowedDirs,
}

impl OwnedRecords {
    /// Makes the records beside the table at `table`, and the list of the
    /// directories it allows, `dirs` (checked by the caller: usable, at
    /// most [`MAX_DIRS`]).
    pub(crate) fn create(table: &Path, dirs: &[PathBuf], mode: u32) -> io::Result<OwnedRecords> {
        owned_dirs::write(table, dirs, mode)?;
        let file = side_file::create(&beside(table), size(), writers_only(mode))?;
        let mut header = [0u8; 12];
        header[4..8].copy_from_slice(&PROCESSES.to_le_bytes());
        header[8..12].copy_from_slice(&FILES.to_le_bytes());
        file.write_all_at(&header, 0)?;
        file.write_all_at(&MAGIC.to_le_bytes(), 0)?;
        Ok(OwnedRecords {
            file,
            dirs: AllowedDirs {
                dirs: dirs.to_vec(),
                refused: None,
            },
        })
    }

    /// The records beside the table at `table`, if a build that makes them
    /// made the table: `None` when the file is absent, is not a regular
    /// file of the table's owner, is not the size this build makes, or
    /// holds another format.
    pub(crate) fn open(table: &Path, table_file: &File) -> Option<OwnedRecords> {
        let file = side_file::open(&beside(table), table_file, size())?;
        let mut header = [0u8; 12];
        file.read_exact_at(&mut header, 0).ok()?;
        let word = |at: usize| u32::from_le_bytes(header[at..at + 4].try_into().expect("4"));
        if (word(0), word(4), word(8)) != (MAGIC, PROCESSES, FILES) {
            return None;
        }
        Some(OwnedRecords {
            file,
            dirs: owned_dirs::read(table, table_file),
        })
    }

    /// The records' file: its bytes hold the owner locks
    /// ([`owner_lock`]).
    pub(crate) fn file(&self) -> &File {
        &self.file
    }

    /// Whether the file is still whole (a declaration into one cut short
    /// is refused as corrupt).
    pub(crate) fn intact(&self) -> bool {
        self.file
            .metadata()
            .is_ok_and(|meta| meta.len() >= size() as u64)
    }

    /// Who could have written the records: their owner and mode.
    pub(crate) fn trust(&self) -> RecordsTrust {
        self.file.metadata().map_or(
            RecordsTrust {
                table_owner: u32::MAX,
                root_only: false,
            },
            |meta| RecordsTrust::of(meta.uid(), meta.permissions().mode()),
        )
    }

    /// The directories the table's creator allowed owned files in (none
    /// if their file was not believed: [`OwnedRecords::dirs_refused`]).
    pub(crate) fn dirs(&self) -> &[PathBuf] {
        &self.dirs.dirs
    }

    /// Why no directory is allowed, if their file was not believed.
    pub(crate) fn dirs_refused(&self) -> Option<&str> {
        self.dirs.refused.as_deref()
    }

    /// The header's counter `which`.
    ///
    /// # Errors
    ///
    /// The read's, a file cut short among them.
    pub(crate) fn counter(&self, which: Counter) -> io::Result<u64> {
        let mut word = [0u8; 8];
        self.file.read_exact_at(&mut word, counter_at(which))?;
        Ok(u64::from_le_bytes(word))
    }

    /// Adds `amount` to counter `which` (saturating). Only the reaper
    /// writes the counters.
    pub(crate) fn add(&self, which: Counter, amount: u64) -> io::Result<()> {
        let value = self.counter(which)?.saturating_add(amount);
        self.file.write_all_at(&value.to_le_bytes(), counter_at(which))
    }

    /// Every owner record, in one read.
    pub(crate) fn owners(&self) -> io::Result<Vec<OwnerRecord>> {
        let mut bytes = vec![0u8; PROCESSES as usize * OWNER_SIZE];
        self.file.read_exact_at(&mut bytes, HEADER as u64)?;
        Ok(bytes.chunks_exact(OWNER_SIZE).map(OwnerRecord::decode).collect())
    }

    /// Owner record `index`.
    pub(crate) fn owner(&self, index: u32) -> io::Result<OwnerRecord> {
        let mut bytes = [0u8; OWNER_SIZE];
        self.file.read_exact_at(&mut bytes, owner_at(index))?;
        Ok(OwnerRecord::decode(&bytes))
    }

    /// Writes owner record `index`.
    pub(crate) fn write_owner(&self, index: u32, record: &OwnerRecord) -> io::Result<()> {
        self.file.write_all_at(&record.encode(), owner_at(index))
    }

    /// Writes only the state of owner record `index`.
    pub(crate) fn set_owner_state(&self, index: u32, state: u32) -> io::Result<()> {
        self.file.write_all_at(&state.to_le_bytes(), owner_at(index))
    }

    /// Every file record of owner `owner`, in one read.
    pub(crate) fn files(&self, owner: u32) -> io::Result<Vec<FileRecord>> {
        let mut bytes = vec![0u8; FILES as usize * FILE_SIZE];
        self.file.read_exact_at(&mut bytes, file_at(owner, 0))?;
        Ok(bytes.chunks_exact(FILE_SIZE).map(FileRecord::decode).collect())
    }

    /// Writes file record `file` of owner `owner`, its state last.
    pub(crate) fn write_file(&self, owner: u32, file: u32, record: &FileRecord) -> io::Result<()> {
        let bytes = record.encode();
        let at = file_at(owner, file);
        self.file.write_all_at(&bytes[4..], at + 4)?;
        self.file.write_all_at(&bytes[..4], at)
    }

    /// Writes only the state of file record `file` of owner `owner`.
    pub(crate) fn set_file_state(&self, owner: u32, file: u32, state: u32) -> io::Result<()> {
        self.file.write_all_at(&state.to_le_bytes(), file_at(owner, file))
    }
}

/// Where owner record `index` is.
///
/// # Panics
///
/// If `index` is not below [`PROCESSES`].
fn owner_at(index: u32) -> u64 {
    assert!(index < PROCESSES, "owner record {index} of {PROCESSES}");
    (HEADER + index as usize * OWNER_SIZE) as u64
}

/// Where file record `file` of owner `owner` is.
///
/// # Panics
///
/// If either is out of range.
fn file_at(owner: u32, file: u32) -> u64 {
    assert!(owner < PROCESSES && file < FILES, "file record {owner}/{file}");
    let index = owner as usize * FILES as usize + file as usize;
    (HEADER + PROCESSES as usize * OWNER_SIZE + index * FILE_SIZE) as u64
}

fn counter_at(which: Counter) -> u64 {
    16 + 8 * which as u64
}

/// This process's owner record in a table's owned-file records: its index
/// and the descriptor whose lock says the process lives.
pub(crate) struct OwnerHold {
    pub epoch: u64,
    pub index: u32,
    pub lock: Option<LockDescriptor>,
}

impl Drop for OwnerHold {
    /// The handle is closed: with nothing owned, the record is given back;
    /// with files still owned, the lock stays held until the process ends.
    fn drop(&mut self) {
        if self.epoch != fork::epoch() {
            return;
        }
        if let Some(lock) = self.lock.take() {
            std::mem::forget(lock);
        }
    }
}

impl OwnerHold {
    /// Gives the record back if it owns nothing (then the lock goes with
    /// it); otherwise keeps the lock for the rest of the process's life.
    pub(crate) fn release(mut self, records: Option<&OwnedRecords>) {
        let owns_nothing = records.is_some_and(|records| {
            records
                .files(self.index)
                .is_ok_and(|files| files.iter().all(|f| f.state == FREE))
        });
        if owns_nothing && self.epoch == fork::epoch() {
            if let Some(records) = records {
                let _ = records.set_owner_state(self.index, FREE);
            }
            drop(self.lock.take());
        }
    }
}

/// The header's counters.
#[derive(Clone, Copy)]
pub(crate) enum Counter {
    Removed = 0,
    BytesFreed = 1,
    Refused = 2,
}

/// The file's size.
pub(crate) fn size() -> usize {
    HEADER + PROCESSES as usize * (OWNER_SIZE + FILES as usize * FILE_SIZE)
}

/// The records' file beside a table's (`NAME.owned`): removed with the
/// table.
pub(crate) fn beside(table: &Path) -> PathBuf {
    let mut path = table.as_os_str().to_owned();
    path.push(".owned");
    PathBuf::from(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_encode_and_decode_to_themselves() {
        let owner = OwnerRecord {
            state: HELD,
            pid: 42,
            uid: 1000,
            groups: vec![1000, 27],
        };
        assert_eq!(OwnerRecord::decode(&owner.encode()), owner);
        let file = FileRecord {
            state: DECLARED,
            dir: 1,
            dev: 0x2a,
            ino: 99,
            born_ns: 1_700_000_000_123_456_789,
            name: b"psm_0af3".to_vec(),
        };
        assert_eq!(FileRecord::decode(&file.encode()), file);
    }

    #[test]
    fn only_the_classes_that_may_write_the_table_may_open_its_records() {
        assert_eq!(writers_only(0o600), 0o600);
        assert_eq!(writers_only(0o644), 0o600);
        assert_eq!(writers_only(0o664), 0o660);
        assert_eq!(writers_only(0o640), 0o600);
        assert_eq!(writers_only(0o666), 0o666);
    }

    #[test]
    fn hostile_bytes_decode_within_their_bounds() {
        let owner = OwnerRecord::decode(&[0xff; OWNER_SIZE]);
        assert_eq!(owner.groups.len(), GROUPS);
        let file = FileRecord::decode(&[0xff; FILE_SIZE]);
        assert_eq!(file.name.len(), NAME_MAX);
    }
}
