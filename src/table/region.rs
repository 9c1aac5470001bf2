//! A session's region: the memory a `unix:` listener shares with one
//! client (a sealed memfd it makes and passes over the socket), holding a
//! table of one slot, where the client's worker beats exactly as in a
//! shared table, and that table's death words, where the client's death
//! thread holds its process's word exactly as in a shared table's. One slot
//! format and one death-word protocol, not a second.
//!
//! Layout (both ends compute it, never read it from the region):
//!
//! | offset | bytes | what |
//! |---|---|---|
//! | 0 | [`table_size`]`(1)`, rounded up to a page | a table of capacity 1 (header, slot 0, info area, observations) |
//! | [`Layout::death_offset`] | 176, rounded up to a page | its death words (a 128-byte header, process word 0, slot record 0), then 8 bytes reserved and the listener's pulse (8 bytes) |
//!
//! The listener's pulse is a count the reaper bumps each time it pulls
//! the client's beats from the region into the table (every `T/4`): the
//! client's sign that it is heard, in place of `Heard` frames.
//!
//! The client writes what it likes there; the reaper reads only slot 0's
//! beat word, beat counter, progress word, flags and clock identity, and
//! process word 0, at the offsets above, as numbers it bounds before using
//! them: never the header's sizes, never a pointer or an index (see
//! `docs/sessions.md`). It writes only its pulse and the `WAITERS` bit of
//! process word 0 (so that the kernel wakes it when it marks the word).

use crate::error::{Error, Result};
use crate::sync::{AtomicU32, AtomicU64};
use crate::table::death_words::{self, DeathWords};
use crate::table::handle::Table;
use crate::table::layout::{table_size, Slot, HEADER_SIZE, VERSION_MINOR};
use crate::table::memory::Backing;
use crate::table::options::TableOptions;
use memmap2::{MmapOptions, MmapRaw};
use std::fs::File;

/// Where the listener's pulse is in the region's second part: after the
/// death words and 8 reserved bytes.
const LISTENER_PULSE_OFFSET: usize = death_words::HEADER + 40;

/// Where a region's parts are, for this host's page size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    /// Where the death words start (a page boundary).
    pub death_offset: u64,
    /// The region's size.
    pub size: u64,
}

impl Layout {
    /// The layout on this host (the page size both ends share: one kernel).
    pub(crate) fn here() -> Layout {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
        let table = (table_size(1) as u64).div_ceil(page) * page;
        let words = (LISTENER_PULSE_OFFSET as u64 + 8).div_ceil(page) * page;
        Layout {
            death_offset: table,
            size: table + words,
        }
    }
}

impl Table {
    /// The client's side of a region its listener passed: a table of one
    /// slot over its first part (header written here, as a new table's),
    /// with death words over its second, so that a registration in it is
    /// beaten and watched as one in a shared table. `region` must be a
    /// sealed memfd of [`Layout::here`]'s size.
    ///
    /// # Errors
    ///
    /// [`Error::Incompatible`] if the region is not of that size or not
    /// sealed; [`Error::Io`] if it cannot be mapped.
    pub(crate) fn in_region(region: File, options: &TableOptions) -> Result<Table> {
        let layout = Layout::here();
        let size = region
            .metadata()
            .map_err(|e| Error::os("(session region)", "stat", e))?
            .len();
        if size != layout.size || !crate::os::memfd::is_size_sealed(&region) {
            return Err(Error::Incompatible(format!(
                "session region: expected a sealed memfd of {} bytes, found {size} bytes{}",
                layout.size,
                if crate::os::memfd::is_size_sealed(&region) {
                    ""
                } else {
                    ", unsealed"
                }
            )));
        }
        let map = MmapOptions::new()
            .len(table_size(1))
            .map_raw(&region)
            .map_err(|e| Error::os("(session region)", "map", e))?;
        let words = region
            .try_clone()
            .and_then(|file| DeathWords::in_region(file, layout.death_offset))
            .map_err(|e| Error::os("(session region)", "map its death words", e))?;
        let options = TableOptions {
            capacity: 1,
            ..options.clone()
        };
        let table = Table::from_memory(
            "(session region)",
            1,
            VERSION_MINOR,
            options.stamps(),
            Backing::Region { map },
            (Some(words), None),
        );
        table.write_header(&options);
        Ok(table)
    }
}

/// The listener's side of a region: made, sealed, mapped; what it reads of
/// it is in the table's formats at offsets it computes itself.
pub(crate) struct SharedRegion {
    file: File,
    map: MmapRaw,
    layout: Layout,
}

// SAFETY:
// - the mapping lives as long as the `SharedRegion`, is never shrunk (the
//   memfd is sealed), and is only accessed through atomics, so sharing it
//   between threads is race free whatever the client writes.
unsafe impl Send for SharedRegion {}
// SAFETY: as above.
unsafe impl Sync for SharedRegion {}

impl SharedRegion {
    /// Makes a region (zeroed, sealed against shrinking and growing) and
    /// maps it.
    ///
    /// # Errors
    ///
    /// As [`crate::os::memfd::create_sealed`], or the map failing.
    pub(crate) fn create() -> std::io::Result<SharedRegion> {
        let layout = Layout::here();
        let file = crate::os::memfd::create_sealed(c"livereg-session", layout.size)?;
        let map = MmapOptions::new()
            .len(layout.size as usize)
            .map_raw(&file)?;
        Ok(SharedRegion { file, map, layout })
    }

    /// The memfd, to pass to the client.
    pub(crate) fn file(&self) -> &File {
        &self.file
    }

    /// Its size in bytes.
    pub(crate) fn size(&self) -> u64 {
        self.layout.size
    }

    /// Slot 0 of the client's table: every word of it is the client's to
    /// write at any time.
    pub(crate) fn slot(&self) -> &Slot {
        // SAFETY:
        // - the map is `layout.size` bytes, at least `table_size(1)`, so slot
        //   0 (HEADER_SIZE .. HEADER_SIZE + SLOT_SIZE) is inside it, aligned
        //   (the map is page aligned, HEADER_SIZE a multiple of 128);
        // - `Slot` is made of atomics: any bytes are a valid value, and
        //   shared access (with the client's process too) is race free;
        // - it lives as long as `self` (the memfd is sealed: never shrunk).
        unsafe { &*self.map.as_ptr().add(HEADER_SIZE).cast::<Slot>() }
    }

    /// Process word 0 of the client's death words: the futex word its death
    /// thread holds (the kernel marks it `OWNER_DIED` as the client's
    /// process begins to exit), or anything the client wrote.
    pub(crate) fn death_word(&self) -> &AtomicU32 {
        let offset = self.layout.death_offset as usize + death_words::HEADER;
        // SAFETY:
        // - `death_offset + HEADER + 4` is within the map (`death_offset` +
        //   a page at least), 16-byte aligned (page + 128);
        // - an atomic: any value is valid, shared access race free;
        // - it lives as long as `self`.
        unsafe { &*self.map.as_ptr().add(offset).cast::<AtomicU32>() }
    }
}

impl SharedRegion {
    /// The listener's pulse: bumped at every pull of the region.
    pub(crate) fn listener_pulse(&self) -> &AtomicU64 {
        let offset = self.layout.death_offset as usize + LISTENER_PULSE_OFFSET;
        // SAFETY:
        // - `death_offset + LISTENER_PULSE_OFFSET + 8` is within the map (the
        //   second part is at least that long), 8-byte aligned (page + 168);
        // - an atomic: any value is valid, shared access race free;
        // - it lives as long as `self`.
        unsafe { &*self.map.as_ptr().add(offset).cast::<AtomicU64>() }
    }
}

/// The client's hold on its region's listener pulse, for its sender
/// thread.
pub(crate) struct Pulse {
    map: MmapRaw,
}

// SAFETY: as for `SharedRegion`: a mapping of a sealed memfd, read through
// one atomic only.
unsafe impl Send for Pulse {}

impl Pulse {
    /// Maps the pulse of `region` (the second part, where it is).
    ///
    /// # Errors
    ///
    /// The map failing.
    pub(crate) fn of(region: &File) -> std::io::Result<Pulse> {
        let layout = Layout::here();
        let map = MmapOptions::new()
            .offset(layout.death_offset)
            .len(LISTENER_PULSE_OFFSET + 8)
            .map_raw(region)?;
        Ok(Pulse { map })
    }

    /// The listener's pulse now: a change since the last look is the
    /// client heard.
    pub(crate) fn listener(&self) -> u64 {
        // SAFETY:
        // - the map is LISTENER_PULSE_OFFSET + 8 bytes, page aligned, so the
        //   8-byte atomic at LISTENER_PULSE_OFFSET (a multiple of 8) is
        //   inside it, aligned;
        // - an atomic: shared access (the listener's process too) is race
        //   free;
        // - the map lives as long as `self`.
        let pulse = unsafe {
            &*self
                .map
                .as_ptr()
                .add(LISTENER_PULSE_OFFSET)
                .cast::<AtomicU64>()
        };
        pulse.load(crate::sync::Ordering::Relaxed)
    }
}

#[cfg(all(test, not(miri)))]
mod tests {
    use super::*;
    use crate::table::death_protocol;
    use std::sync::atomic::Ordering::SeqCst;

    #[test]
    fn a_client_table_over_a_region_is_what_the_listener_reads() {
        let region = SharedRegion::create().unwrap();
        let table = Table::in_region(region.file().try_clone().unwrap(), &TableOptions::default())
            .unwrap();
        let worker = table.register(7, "w").unwrap();
        worker.heartbeat().unwrap();
        worker.heartbeat().unwrap();
        worker.set_busy(true).unwrap();
        assert_eq!(region.slot().beats.load(SeqCst), 2);
        assert_eq!(region.slot().instance_id.load(SeqCst), 7);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while region.death_word().load(SeqCst) & death_protocol::TID_MASK == 0 {
            assert!(std::time::Instant::now() < deadline, "no death word claimed");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(!death_protocol::is_marked(region.death_word()));
    }

    #[test]
    fn a_region_of_another_size_or_unsealed_is_refused() {
        let small = crate::os::memfd::create_sealed(c"t", 4096).unwrap();
        let plain = tempfile_of(Layout::here().size);
        for region in [small, plain] {
            assert!(matches!(
                Table::in_region(region, &TableOptions::default()),
                Err(Error::Incompatible(_))
            ));
        }
    }

    fn tempfile_of(size: u64) -> File {
        // An unsealed memfd: a memfd_create without sealing.
        // SAFETY: a NUL-terminated name; the descriptor is owned below.
        let fd = unsafe { libc::memfd_create(c"plain".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: a descriptor just made, owned by no one else.
        let file = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        file.set_len(size).unwrap();
        file
    }
}
