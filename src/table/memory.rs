//! The memory behind a table handle: a mapping (or, for tests and Miri, a
//! heap block), its name, capacity and layout minor, and typed views of its
//! header, slots, observations and info area.

use crate::clock::Stamps;
use crate::error::{Error, Result};
use crate::os::fork::LockDescriptor;
use crate::table::death_words::{DeathWords, Listing};
use crate::table::owned_records::{OwnedRecords, OwnerHold};
use crate::sync::AtomicU64;
use crate::table::layout::{
    object_size, observations_start, slots_end, Header, InfoArea, Slot, HEADER_SIZE,
    INFO_SINCE_MINOR, OBSERVATIONS_SINCE_MINOR, SLOT_SIZE,
};
use memmap2::MmapRaw;
use std::alloc::{self, Layout};
use std::fs::File;
use std::ptr::NonNull;
use std::sync::atomic::AtomicBool;
use std::sync::Mutex;

/// The memory behind a table handle.
pub(crate) struct TableMemory {
    pub name: String,
    pub capacity: u32,
    /// The layout's minor version (what the table holds beyond 1.0).
    pub minor: u32,
    /// How registrants stamp heartbeats: read once from the header, so a
    /// writer changing it later changes nothing.
    pub stamps: Stamps,
    pub(crate) backing: Backing,
    /// Serialises registrations of this process; the kernel lock orders them
    /// against other processes.
    pub(crate) registrations: Mutex<()>,
    /// The descriptor of this handle's last failed attempt at the reaper
    /// role, with the fork epoch it was opened in: kept for the next attempt
    /// (see `table_locks.rs`).
    pub(crate) reaper_candidate: Mutex<Option<(LockDescriptor, u64)>>,
    /// The death words beside a shared table, if it has them.
    pub(crate) death_words: Option<DeathWords>,
    /// This process's process word in them, while it has registrations.
    pub(crate) death_listing: Mutex<Option<Listing>>,
    /// The owned-file records beside a shared table, if it has them.
    pub(crate) owned: Option<OwnedRecords>,
    /// This process's owner record in them, once it has declared a file.
    pub(crate) owner_hold: Mutex<Option<OwnerHold>>,
}

pub(crate) enum Backing {
    /// A shared object or file, mapped.
    Mapped { file: File, map: MmapRaw },
    /// A session's region (`table/region.rs`): a sealed memfd its listener
    /// made, mapped; no file to lock (its size cannot change).
    Region { map: MmapRaw },
    /// Process-private memory, for tests (and Miri) that need no OS objects.
    Heap {
        base: NonNull<u8>,
        layout: Layout,
        reaper_taken: AtomicBool,
    },
}

// SAFETY:
// - the heap allocation is owned by `TableMemory` and freed only in its `Drop`;
// - every byte of it is accessed through atomics (`Header`, `Slot`), so shared
//   access from several threads is data-race free.
unsafe impl Send for TableMemory {}
// SAFETY: as above.
unsafe impl Sync for TableMemory {}

impl Drop for TableMemory {
    fn drop(&mut self) {
        let hold = self.owner_hold.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Some(hold) = hold.take() {
            hold.release(self.owned.as_ref().filter(|records| records.intact()));
        }
        if let Backing::Heap { base, layout, .. } = &self.backing {
            // SAFETY:
            // - `base` was returned by `alloc_zeroed(layout)` in `in_memory`
            //   and is freed exactly once, here.
            unsafe { alloc::dealloc(base.as_ptr(), *layout) };
        }
    }
}

impl TableMemory {
    #[inline]
    fn base(&self) -> *const u8 {
        match &self.backing {
            Backing::Mapped { map, .. } | Backing::Region { map } => map.as_ptr(),
            Backing::Heap { base, .. } => base.as_ptr(),
        }
    }

    pub fn header(&self) -> &Header {
        // SAFETY:
        // - the memory is at least `table_size(capacity)` bytes (validated at
        //   open, sized at create) and aligned to at least 128 bytes (a page
        //   for maps, `SLOT_SIZE` for the heap), so a `Header` fits at 0;
        // - it lives as long as `self`; all fields are atomics.
        unsafe { &*self.base().cast::<Header>() }
    }

    /// Slot `index`.
    ///
    /// # Panics
    ///
    /// If `index >= capacity`: indexes come from this handle's own counting
    /// or from handles it made, never from the table.
    #[inline]
    pub fn slot(&self, index: u32) -> &Slot {
        assert!(
            index < self.capacity,
            "slot {index} out of {}",
            self.capacity
        );
        // SAFETY:
        // - `index < capacity`, and the memory holds `capacity` slots after
        //   the header, each `SLOT_SIZE`-aligned (HEADER_SIZE is a multiple);
        // - it lives as long as `self`; all fields are atomics.
        unsafe {
            &*self
                .base()
                .add(HEADER_SIZE + index as usize * SLOT_SIZE)
                .cast::<Slot>()
        }
    }

    /// Checks that the object still has every byte of the table, before
    /// reading its slots: a process that can write the table can also
    /// truncate it, and touching a page past the end would fault (SIGBUS).
    /// A truncation racing the reads that follow this check is the remaining
    /// window (see docs/semantics.md, "Hostile peers").
    ///
    /// # Errors
    ///
    /// [`Error::Corrupt`] naming the size found and expected, or
    /// [`Error::Io`] if the object cannot be examined.
    pub fn check_size(&self) -> Result<()> {
        let Backing::Mapped { file, .. } = &self.backing else {
            return Ok(());
        };
        let size = file
            .metadata()
            .map_err(|e| Error::os(&self.name, "stat", e))?
            .len();
        let expected = object_size(self.capacity, self.minor) as u64;
        if size < expected {
            return Err(Error::Corrupt(format!(
                "table '{}': the object shrank to {size} bytes, expected {expected}: truncated by another process",
                self.name
            )));
        }
        Ok(())
    }

    /// The death words, if the table has them, both its object and their
    /// file are whole (nothing truncated under this handle is touched).
    pub fn death_words(&self) -> Option<&DeathWords> {
        self.check_size().ok()?;
        self.death_words.as_ref().filter(|words| words.intact())
    }

    /// The owned-file records, if present and whole (one truncated under
    /// this handle is never touched).
    pub fn owned_records(&self) -> Option<&OwnedRecords> {
        self.check_size().ok()?;
        self.owned.as_ref().filter(|records| records.intact())
    }

    /// The info area, in tables of layout 1.2 and later.
    pub fn info_area(&self) -> Option<&InfoArea> {
        if self.minor < INFO_SINCE_MINOR {
            return None;
        }
        // SAFETY:
        // - a table of layout 1.2 or later is `object_size` bytes (validated
        //   at open, sized at create), so an `InfoArea` fits after the slots,
        //   at an offset that is a multiple of 128 (its alignment);
        // - it lives as long as `self`; all fields are atomics.
        Some(unsafe { &*self.base().add(slots_end(self.capacity)).cast::<InfoArea>() })
    }

    /// The reaper's observation of slot `index`'s progress (layout 1.3):
    /// when, on the reaper's clock, its progress word last changed; 0 before
    /// a reaper saw it.
    pub fn progress_seen(&self, index: u32) -> Option<&AtomicU64> {
        if self.minor < OBSERVATIONS_SINCE_MINOR || index >= self.capacity {
            return None;
        }
        // SAFETY:
        // - a table of layout 1.3 or later is `object_size` bytes (validated
        //   at open, sized at create): one 8-byte word per slot fits from
        //   `observations_start`, which is a multiple of 128;
        // - `index < capacity`; the memory lives as long as `self`; atomics.
        Some(unsafe {
            &*self
                .base()
                .add(observations_start(self.capacity) + index as usize * 8)
                .cast::<AtomicU64>()
        })
    }

    /// The table's descriptor, when it is an OS object.
    pub fn file(&self) -> Option<&File> {
        match &self.backing {
            Backing::Mapped { file, .. } => Some(file),
            Backing::Region { .. } | Backing::Heap { .. } => None,
        }
    }

    /// The reaper-role flag of a heap table (a shared table's role is a
    /// kernel lock instead).
    pub fn heap_reaper_flag(&self) -> Option<&AtomicBool> {
        match &self.backing {
            Backing::Heap { reaper_taken, .. } => Some(reaper_taken),
            Backing::Mapped { .. } | Backing::Region { .. } => None,
        }
    }

    /// Serialises this process's registrations (the registration lock,
    /// `table_locks.rs`, orders them across processes).
    pub fn local_registrations(&self) -> &Mutex<()> {
        &self.registrations
    }

    pub fn no_reaper(&self) -> Error {
        Error::NoReaper(format!("table '{}': no reaper is alive", self.name))
    }
}
