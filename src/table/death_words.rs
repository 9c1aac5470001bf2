//! The death words: a file beside a shared table (`NAME.dying`, the
//! table's owner and mode) with one word per registering process and one
//! record per slot. A process claims a free word with its first
//! registration in the table, hands it to the kernel on the robust list of
//! a thread of its own (`worker/death_thread.rs`), and records in each of
//! its slots which word is its process's. When the process begins to die,
//! the kernel sets `OWNER_DIED` in the word before it tears anything down,
//! and the reaper, waiting on the word (`reaper/death_watch.rs`), reports
//! every registration of that process `dying` at once.
//!
//! A file of its own rather than more of the table: the table's layout
//! stays what every build on either side of it reads, and a table made
//! before it (no file) has no death words (its processes are seen once they
//! have ended, as always). Heap tables have none: a process dying takes
//! their reaper with it.
//!
//! Layout: a 128-byte header (magic `LRDY`, the capacity), `capacity`
//! process words of 16 bytes, then `capacity` slot records of 16 bytes.

use crate::os::robust::RobustList;
use crate::table::death_protocol;
use crate::sync::{AtomicU32, AtomicU64};
use memmap2::{MmapOptions, MmapRaw};
use crate::table::side_file;
use std::fs::File;
use std::path::{Path, PathBuf};

const MAGIC: u32 = u32::from_le_bytes(*b"LRDY");
/// The bytes before the process words.
pub(crate) const HEADER: usize = 128;

/// One registering process's word.
#[repr(C, align(16))]
pub(crate) struct ProcessWord {
    /// The futex word: 0 while free; the id of the process's death thread
    /// while the process holds it, with `OWNER_DIED` once the kernel began
    /// ending that thread's process, and `WAITERS` while a reaper waits.
    pub word: AtomicU32,
    /// The process's id in its own PID namespace, for the status.
    pub pid: AtomicU32,
    reserved: AtomicU64,
}

/// Which process word speaks for a slot's registration.
#[repr(C, align(16))]
pub(crate) struct SlotRecord {
    /// `(word index + 1) << 32 | generation`: the registration of that
    /// slot generation belongs to the process of that word; 0: none.
    pub owner: AtomicU64,
    /// When (a reaper's clock, nanoseconds, at least 1) a reaper reported
    /// this registration dying; 0 until then. Written once, so it is
    /// reported once whatever reaper sees it.
    pub dying_seen_ns: AtomicU64,
}

#[cfg(not(loom))]
const _: () = {
    assert!(std::mem::size_of::<ProcessWord>() == 16);
    assert!(std::mem::size_of::<SlotRecord>() == 16);
};

/// This process's hold on one of a table's process words: the word (once
/// its thread has claimed it), how many of this process's registrations it
/// speaks for and which of them wait for the word, and the thread that
/// owns it. Kept by the table's memory, edited by the worker side; the
/// thread lingers, parked and holding no word, between a process's last
/// registration and its next, and ends when the memory is dropped.
pub(crate) struct Listing {
    /// The fork epoch it was made in: a forked child holds none of it.
    pub epoch: u64,
    /// The claimed word; `None` while no registration is counted, until the
    /// thread has claimed one, or when none was free.
    pub word: Option<u32>,
    pub registrations: usize,
    /// Registrations (slot, generation) made before the word was claimed:
    /// their records are written when it is, if their slots still hold
    /// them (one that ends before leaves the list).
    pub waiting: Vec<(u32, u32)>,
    /// The thread's robust list and its end, shared with the thread.
    pub lifeline: std::sync::Arc<Lifeline>,
    /// The thread, to wake when there is a word to claim or it is to end.
    pub thread: std::thread::Thread,
}

/// What a death thread shares with the worker side: its robust list (freed
/// once both have let go, the thread after switching to another list),
/// whether the kernel refused it, and whether the thread is to end.
pub(crate) struct Lifeline {
    pub list: RobustList,
    pub refused: std::sync::atomic::AtomicBool,
    pub ended: std::sync::atomic::AtomicBool,
    /// A test's hold on the thread's claims: while set, it claims nothing
    /// (so a test orders a claim after other steps).
    #[cfg(test)]
    pub hold_claims: std::sync::atomic::AtomicBool,
}

impl Lifeline {
    /// An empty list, not refused, not ended.
    pub(crate) fn new() -> std::sync::Arc<Lifeline> {
        let lifeline = std::sync::Arc::new(Lifeline {
            list: RobustList::unlinked(),
            refused: std::sync::atomic::AtomicBool::new(false),
            ended: std::sync::atomic::AtomicBool::new(false),
            #[cfg(test)]
            hold_claims: std::sync::atomic::AtomicBool::new(false),
        });
        lifeline.list.empty();
        lifeline
    }
}

impl Drop for Listing {
    /// The table memory is gone: its thread ends (a forked child's copy
    /// names a thread this process does not have, and is left alone).
    fn drop(&mut self) {
        if self.epoch == crate::os::fork::epoch() {
            self.lifeline
                .ended
                .store(true, std::sync::atomic::Ordering::Release);
            self.thread.unpark();
        }
    }
}

/// A table's death words, mapped.
pub(crate) struct DeathWords {
    map: MmapRaw,
    file: File,
    capacity: u32,
}

// SAFETY:
// - the mapping lives as long as `DeathWords`, and every byte of it is
//   accessed through atomics, so sharing it between threads is race free.
unsafe impl Send for DeathWords {}
// SAFETY: as above.
unsafe impl Sync for DeathWords {}

impl DeathWords {
    /// Makes the file beside a new table at `table` (replacing a stale one a
    /// removed table of the same name left), with the table's `mode`.
    pub(crate) fn create(table: &Path, capacity: u32, mode: u32) -> std::io::Result<DeathWords> {
        let file = side_file::create(&beside(table), size(capacity), mode)?;
        let words = Self::map(file, capacity)?;
        words.header(1).store(capacity, crate::sync::Ordering::Relaxed);
        words
            .header(0)
            .store(MAGIC, crate::sync::Ordering::Release);
        Ok(words)
    }

    /// The death words beside the table at `table`, if a build that makes
    /// them made the table: `None` when the file is absent, is not a
    /// regular file of the table's owner, or is not what `capacity` needs
    /// (then nothing of it is touched, and this process's registrations are
    /// seen once they have ended).
    pub(crate) fn open(table: &Path, table_file: &File, capacity: u32) -> Option<DeathWords> {
        let file = side_file::open(&beside(table), table_file, size(capacity))?;
        let words = Self::map(file, capacity).ok()?;
        let acquire = crate::sync::Ordering::Acquire;
        let made = words.header(0).load(acquire) == MAGIC
            && words.header(1).load(crate::sync::Ordering::Relaxed) == capacity;
        made.then_some(words)
    }

    /// One process word and one slot record at `offset` (page aligned) of
    /// a session's region (`table/region.rs`): the words of the one table
    /// its client's registrations are in, made the same way.
    pub(crate) fn in_region(file: File, offset: u64) -> std::io::Result<DeathWords> {
        let map = MmapOptions::new()
            .offset(offset)
            .len(size(1))
            .map_raw(&file)?;
        let words = DeathWords {
            map,
            file,
            capacity: 1,
        };
        words.header(1).store(1, crate::sync::Ordering::Relaxed);
        words
            .header(0)
            .store(MAGIC, crate::sync::Ordering::Release);
        Ok(words)
    }

    fn map(file: File, capacity: u32) -> std::io::Result<DeathWords> {
        let map = MmapOptions::new().len(size(capacity)).map_raw(&file)?;
        Ok(DeathWords {
            map,
            file,
            capacity,
        })
    }

    /// Whether the file is still whole: one truncated under this handle (by
    /// a hostile or careless process) is never touched (its pages would
    /// fault).
    pub(crate) fn intact(&self) -> bool {
        self.file
            .metadata()
            .is_ok_and(|meta| meta.len() >= size(self.capacity) as u64)
    }

    /// Word `index` of the file's header.
    fn header(&self, index: usize) -> &AtomicU32 {
        // SAFETY: the map is at least HEADER bytes, page aligned; the
        // header's words are atomics.
        unsafe { &*self.map.as_ptr().cast::<AtomicU32>().add(index) }
    }

    /// How many process words (and slot records) there are.
    pub(crate) fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Process word `index`.
    ///
    /// # Panics
    ///
    /// If `index` is not below the capacity.
    pub(crate) fn process(&self, index: u32) -> &ProcessWord {
        assert!(index < self.capacity, "process word {index} of {}", self.capacity);
        // SAFETY:
        // - the map holds `capacity` process words after the header, 16-byte
        //   aligned (the map is page aligned, the header 128 bytes);
        // - `ProcessWord` is made of atomics, so shared access is race free.
        unsafe {
            &*self
                .map
                .as_ptr()
                .add(HEADER + index as usize * 16)
                .cast::<ProcessWord>()
        }
    }

    /// Slot `index`'s record.
    ///
    /// # Panics
    ///
    /// If `index` is not below the capacity.
    pub(crate) fn slot(&self, index: u32) -> &SlotRecord {
        assert!(index < self.capacity, "slot record {index} of {}", self.capacity);
        let start = HEADER + self.capacity as usize * 16;
        // SAFETY: as for `process`, in the records that follow the words.
        unsafe {
            &*self
                .map
                .as_ptr()
                .add(start + index as usize * 16)
                .cast::<SlotRecord>()
        }
    }

    /// The process word that speaks for slot `index`'s registration of
    /// `generation`, if its process recorded one.
    pub(crate) fn owner_of(&self, index: u32, generation: u32) -> Option<&ProcessWord> {
        self.owner_word_of(index, generation).map(|(_, word)| word)
    }

    /// [`DeathWords::owner_of`] with the process word's index, both from one
    /// load of the slot's record (a writer of the table may change it between
    /// two).
    pub(crate) fn owner_word_of(&self, index: u32, generation: u32) -> Option<(u32, &ProcessWord)> {
        let owner = self
            .slot(index)
            .owner
            .load(crate::sync::Ordering::Acquire);
        let word = (owner >> 32) as u32;
        (owner as u32 == generation && word != 0 && word <= self.capacity)
            .then(|| (word - 1, self.process(word - 1)))
    }
}

impl DeathWords {
    /// Whether slot `index`'s registration of `generation` is dying: the
    /// kernel marked its process's word, or (a session's) its reaper
    /// recorded it dying.
    pub(crate) fn is_dying(&self, index: u32, generation: u32) -> bool {
        self.owner_of(index, generation)
            .is_some_and(|process| death_protocol::is_marked(&process.word))
            || self.session_dying(index, generation)
    }

    /// Records slot `index`'s session registration of `generation` dying,
    /// as its reaper saw it in the region its client beats in (the word is
    /// there, not here): its record names no process word (`owner` is the
    /// generation alone) and says when.
    pub(crate) fn record_session_dying(&self, index: u32, generation: u32, now_ns: u64) {
        let record = self.slot(index);
        record
            .dying_seen_ns
            .store(now_ns.max(1), crate::sync::Ordering::Release);
        record
            .owner
            .store(u64::from(generation), crate::sync::Ordering::Release);
    }

    /// Whether [`DeathWords::record_session_dying`] recorded slot
    /// `index`'s registration of `generation`.
    fn session_dying(&self, index: u32, generation: u32) -> bool {
        let record = self.slot(index);
        record.owner.load(crate::sync::Ordering::Acquire) == u64::from(generation)
            && record.dying_seen_ns.load(crate::sync::Ordering::Acquire) != 0
    }
}

/// The file's size for `capacity` slots.
pub(crate) fn size(capacity: u32) -> usize {
    HEADER + capacity as usize * 32
}

/// The death words' file beside a table's (`NAME.dying`): removed with the
/// table.
pub(crate) fn beside(table: &Path) -> PathBuf {
    let mut path = table.as_os_str().to_owned();
    path.push(".dying");
    PathBuf::from(path)
}
