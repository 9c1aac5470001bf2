//! The owned-file records: a file beside a shared table (`NAME.owned`, the
//! table's owner and mode, made and removed with it) where a process that
//! maps the table declares files it made that must not outlive it, and
//! from which the reaper removes them once that process has ended (see
//! `owning.rs` and `reaper/owned_removal.rs`).
//!
//! Layout: a 4,096-byte header (magic `LROW`, the counts, the removal
//! counters, the directories the table's creator allowed), then
//! [`PROCESSES`] owner records of 64 bytes, then [`FILES`] file records of
//! 288 bytes for each owner. An owner record is held by one live process:
//! its holder keeps a lock on the table (`os/lock.rs`, [`owner_lock`]) for
//! as long as it lives, so the lock's release is the kernel's word that it
//! has ended. A table made by an earlier build has no such file, and
//! declaring there is refused.

use crate::sync::Ordering::{Acquire, Relaxed, Release};
use crate::sync::{AtomicU32, AtomicU64};
use memmap2::{MmapOptions, MmapRaw};
use std::ffi::OsString;
use crate::os::fork::{self, LockDescriptor};
use crate::table::side_file;
use std::fs::File;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

const MAGIC: u32 = u32::from_le_bytes(*b"LROW");
const HEADER: usize = 4096;
/// How many processes may own files in one table at once.
pub const PROCESSES: u32 = 256;
/// How many files one process may own in one table.
pub const FILES: u32 = 64;
/// How many directories a table's creator may allow.
pub const MAX_DIRS: usize = 4;
/// The longest name of an owned file or an allowed directory, in bytes
/// (`NAME_MAX`; a directory's whole path).
pub const NAME_MAX: usize = 255;
const OWNER_SIZE: usize = 64;
const FILE_SIZE: usize = 288;
/// Where the allowed directories start in the header.
const DIRS_AT: usize = 128;

/// An owner record's state: free, or held by a live (or not yet removed)
/// process.
pub(crate) const FREE: u32 = 0;
pub(crate) const HELD: u32 = 1;
/// A file record's state: declared (its fields written before).
pub(crate) const DECLARED: u32 = 1;

/// The byte of the table locked by owner record `index`'s holder.
pub(crate) fn owner_lock(index: u32) -> u64 {
    (1 << 41) + u64::from(index)
}

/// A name of at most [`NAME_MAX`] bytes, stored in atomic words (a length
/// byte, then the bytes).
#[repr(C, align(8))]
pub(crate) struct StoredName {
    words: [AtomicU64; 33],
}

impl StoredName {
    pub(crate) fn store(&self, name: &[u8]) {
        let mut bytes = [0u8; 33 * 8];
        let len = name.len().min(NAME_MAX);
        bytes[0] = len as u8;
        bytes[1..=len].copy_from_slice(&name[..len]);
        for (word, chunk) in self.words.iter().zip(bytes.chunks_exact(8)) {
            word.store(
                u64::from_le_bytes(chunk.try_into().expect("chunks of 8")),
                Relaxed,
            );
        }
    }

    pub(crate) fn load(&self) -> Vec<u8> {
        let mut bytes = [0u8; 33 * 8];
        for (word, chunk) in self.words.iter().zip(bytes.chunks_exact_mut(8)) {
            chunk.copy_from_slice(&word.load(Relaxed).to_le_bytes());
        }
        let len = usize::from(bytes[0]);
        bytes[1..=len].to_vec()
    }
}

/// The process holding an owner record.
#[repr(C, align(8))]
pub(crate) struct OwnerRecord {
    pub state: AtomicU32,
    /// Its id in its own PID namespace, for the status and the logs.
    pub pid: AtomicU32,
    /// Its effective user when it took the record.
    pub uid: AtomicU32,
    /// 1 if it was privileged (root) then: it may own another user's files.
    pub privileged: AtomicU32,
    reserved: [AtomicU64; 6],
}

/// One owned file: the allowed directory it is in, its name there, and
/// its identity when it was declared.
#[repr(C, align(8))]
pub(crate) struct FileRecord {
    pub state: AtomicU32,
    /// Index of the allowed directory.
    pub dir: AtomicU32,
    pub dev: AtomicU64,
    pub ino: AtomicU64,
    pub name: StoredName,
}

#[cfg(not(loom))]
const _: () = {
    assert!(std::mem::size_of::<OwnerRecord>() == OWNER_SIZE);
    assert!(std::mem::size_of::<FileRecord>() == FILE_SIZE);
};

/// A table's owned-file records, mapped.
pub(crate) struct OwnedRecords {
    map: MmapRaw,
    file: File,
    dirs: Vec<PathBuf>,
}

// SAFETY:
// - the mapping lives as long as `OwnedRecords`, and every byte of it is
//   accessed through atomics, so sharing it between threads is race free.
unsafe impl Send for OwnedRecords {}
// SAFETY: as above.
unsafe impl Sync for OwnedRecords {}

impl OwnedRecords {
    /// Makes the records beside the table at `table`, allowing `dirs`
    /// (checked by the caller: absolute, at most [`MAX_DIRS`] of at most
    /// [`NAME_MAX`] bytes).
    pub(crate) fn create(table: &Path, dirs: &[PathBuf], mode: u32) -> std::io::Result<OwnedRecords> {
        let file = side_file::create(&beside(table), size(), mode)?;
        let records = Self::map(file, Vec::new())?;
        records.header(1).store(PROCESSES, Relaxed);
        records.header(2).store(FILES, Relaxed);
        records.header(3).store(dirs.len() as u32, Relaxed);
        for (index, dir) in dirs.iter().enumerate() {
            records.dir_name(index).store(dir.as_os_str().as_bytes());
        }
        records.header(0).store(MAGIC, Release);
        Ok(OwnedRecords {
            dirs: dirs.to_vec(),
            ..records
        })
    }

    /// The records beside the table at `table`, if a build that makes them
    /// made the table: `None` when the file is absent, is not a regular
    /// file of the table's owner, or is not the size this build makes.
    pub(crate) fn open(table: &Path, table_file: &File) -> Option<OwnedRecords> {
        let file = side_file::open(&beside(table), table_file, size())?;
        let records = Self::map(file, Vec::new()).ok()?;
        let made = records.header(0).load(Acquire) == MAGIC
            && records.header(1).load(Relaxed) == PROCESSES
            && records.header(2).load(Relaxed) == FILES;
        let count = records.header(3).load(Relaxed) as usize;
        if !made || count > MAX_DIRS {
            return None;
        }
        let dirs = (0..count)
            .map(|index| PathBuf::from(OsString::from_vec(records.dir_name(index).load())))
            .collect();
        Some(OwnedRecords { dirs, ..records })
    }

    fn map(file: File, dirs: Vec<PathBuf>) -> std::io::Result<OwnedRecords> {
        let map = MmapOptions::new().len(size()).map_raw(&file)?;
        Ok(OwnedRecords { map, file, dirs })
    }

    /// Whether the file is still whole: one truncated under this handle is
    /// never touched (its pages would fault).
    pub(crate) fn intact(&self) -> bool {
        self.file
            .metadata()
            .is_ok_and(|meta| meta.len() >= size() as u64)
    }

    /// The file's own metadata (its owner and mode are the table's).
    pub(crate) fn metadata(&self) -> Option<std::fs::Metadata> {
        self.file.metadata().ok()
    }

    /// Whether the reaper may remove a file of `uid` that a process of
    /// `declarer` (root: `privileged`) declared: a file of the table's
    /// owner declared by its owner; any user's only where no one but root
    /// could have written the records (a root-owned table no one else may
    /// write), so that no writer of the table can name another user's file.
    pub(crate) fn may_remove(&self, uid: u32, declarer: u32, privileged: bool) -> bool {
        let (owner, mode) = self
            .metadata()
            .map_or((u32::MAX, 0o777), |m| (m.uid(), m.permissions().mode()));
        match owner == 0 && mode & 0o022 == 0 {
            true => uid == declarer || privileged,
            false => uid == declarer && uid == owner,
        }
    }

    /// The directories the table's creator allowed owned files in.
    pub(crate) fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }

    fn header(&self, index: usize) -> &AtomicU32 {
        // SAFETY: the map is at least HEADER bytes, page aligned; the
        // header's words are atomics.
        unsafe { &*self.map.as_ptr().cast::<AtomicU32>().add(index) }
    }

    /// The header's counters: files removed, bytes they held, removals
    /// refused (a file no longer the one declared).
    pub(crate) fn counter(&self, which: Counter) -> &AtomicU64 {
        // SAFETY: bytes 16..40 of the header are three aligned u64 atomics.
        unsafe { &*self.map.as_ptr().add(16 + 8 * which as usize).cast::<AtomicU64>() }
    }

    fn dir_name(&self, index: usize) -> &StoredName {
        assert!(index < MAX_DIRS);
        // SAFETY: the header holds MAX_DIRS names of 264 bytes from byte
        // 128 (128 + 4 × 264 < 4096), 8-byte aligned, made of atomics.
        unsafe {
            &*self
                .map
                .as_ptr()
                .add(DIRS_AT + index * std::mem::size_of::<StoredName>())
                .cast::<StoredName>()
        }
    }

    /// Owner record `index`.
    ///
    /// # Panics
    ///
    /// If `index` is not below [`PROCESSES`].
    pub(crate) fn owner(&self, index: u32) -> &OwnerRecord {
        assert!(index < PROCESSES, "owner record {index} of {PROCESSES}");
        // SAFETY: the map holds PROCESSES owner records after the header,
        // 64-byte aligned, made of atomics.
        unsafe {
            &*self
                .map
                .as_ptr()
                .add(HEADER + index as usize * OWNER_SIZE)
                .cast::<OwnerRecord>()
        }
    }

    /// File record `file` of owner `owner`.
    ///
    /// # Panics
    ///
    /// If either is out of range.
    pub(crate) fn file(&self, owner: u32, file: u32) -> &FileRecord {
        assert!(owner < PROCESSES && file < FILES, "file record {owner}/{file}");
        let index = owner as usize * FILES as usize + file as usize;
        // SAFETY: the map holds PROCESSES × FILES file records after the
        // owner records, 8-byte aligned, made of atomics.
        unsafe {
            &*self
                .map
                .as_ptr()
                .add(HEADER + PROCESSES as usize * OWNER_SIZE + index * FILE_SIZE)
                .cast::<FileRecord>()
        }
    }
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
            (0..FILES).all(|f| records.file(self.index, f).state.load(Acquire) == FREE)
        });
        if owns_nothing && self.epoch == fork::epoch() {
            if let Some(records) = records {
                records.owner(self.index).state.store(FREE, Release);
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
fn size() -> usize {
    HEADER + PROCESSES as usize * (OWNER_SIZE + FILES as usize * FILE_SIZE)
}

/// The records' file beside a table's (`NAME.owned`): removed with the
/// table.
pub(crate) fn beside(table: &Path) -> PathBuf {
    let mut path = table.as_os_str().to_owned();
    path.push(".owned");
    PathBuf::from(path)
}
