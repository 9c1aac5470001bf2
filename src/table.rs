//! Create, open, validate and unlink a table: the one place that maps memory.
//!
//! [`Table`] is one type whose methods live beside the idea they serve:
//!
//! | methods | file |
//! |---|---|
//! | `create`, `in_memory`, `open`, `unlink`, `with_clock`, `clock`, `stamp_clock`, `stamp_resolution`, `name`, `capacity`, the timeouts, `scan_interval`, `scans` | `table.rs` |
//! | `reaper_alive`, `reaper_stalled`, `probe`, `clear`, `reset` (requests of the reaper) | `requests.rs` |
//! | `registration`, `register` | `registration.rs` |
//! | `reaper` (the builder) | `reaper/builder.rs` |
//! | `status` | `status.rs` |
//! | `set_info`, `info` | `info.rs` |
//! | `metrics_text` | `metrics.rs` |
//!
//! Behind a handle is a [`TableMemory`]: the mapping (or a heap block for
//! tests), its name and size. Its kernel locks (reaper role, registration
//! lock) are in `table_locks.rs`; the futex words that wake the reaper and the
//! waiters of a clear are in `wake.rs`.

use crate::clock::{
    coarse_resolution_ns, duration_ns, Clock, StampClock, Stamps, MIN_TIMEOUT_TICKS,
};
use crate::error::{Error, Result};
use crate::fork::LockDescriptor;
use crate::layout::{
    object_size, observations_start, slots_end, table_size, Header, InfoArea, Slot, HEADER_SIZE,
    INFO_AREA_SIZE, INFO_SINCE_MINOR, MAGIC, MAX_CAPACITY, OBSERVATIONS_SINCE_MINOR, READY,
    SCANS_PER_TIMEOUT, SLOT_SIZE, STAMPS_COARSE, STAMPS_PRECISE, STAMP_CLOCK_SINCE_MINOR,
    VERSION_MAJOR, VERSION_MINOR,
};
use crate::location;
use crate::sync::AtomicU64;
use crate::sync::Ordering::{Relaxed, Release};
use memmap2::{MmapOptions, MmapRaw};
use std::alloc::{self, Layout};
use std::fs::{File, OpenOptions, Permissions};
use std::os::unix::fs::{FileExt, OpenOptionsExt, PermissionsExt};
use std::ptr::NonNull;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long an opener waits for a creator to finish the header.
const READY_WAIT: Duration = Duration::from_secs(1);
/// How often an opener looks again for a creator's `ready` word: creating
/// takes microseconds, so a waiter rarely looks twice.
const READY_POLL: Duration = Duration::from_millis(2);

/// The registration grace when none is given: this, or the reap timeout if
/// longer (a worker's first beat may come after a slow start).
pub const DEFAULT_REGISTRATION_GRACE: Duration = Duration::from_secs(30);

/// How a new table is made.
///
/// # Examples
///
/// ```
/// use livereg::TableOptions;
/// use std::time::Duration;
///
/// let options = TableOptions {
///     capacity: 64,
///     reap_timeout: Duration::from_secs(2),
///     registration_grace: Duration::from_secs(10),
///     ..TableOptions::default()
/// };
/// assert_eq!(options.mode, 0o600);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableOptions {
    /// Number of slots, 1 to 1,048,576.
    pub capacity: u32,
    /// Permission bits of the object (default `0o600`; `0o660` shares it with
    /// a group). The owner always needs read and write.
    pub mode: u32,
    /// Silence budget of a worker that has beaten at least once; zero disables
    /// reaping.
    pub reap_timeout: Duration,
    /// Silence budget of a worker that registered and never beat; at least
    /// `reap_timeout`.
    pub registration_grace: Duration,
    /// How long a busy worker may make no progress before it ends
    /// `Stalled`; zero (the default) turns the check off.
    /// At least one scan interval.
    pub progress_timeout: Duration,
    /// Which clock registrants stamp heartbeats with (default
    /// [`StampClock::Auto`]: the coarse one where the timeout allows).
    pub stamp_clock: StampClock,
}

impl Default for TableOptions {
    fn default() -> Self {
        TableOptions {
            capacity: 256,
            mode: 0o600,
            reap_timeout: Duration::from_secs(10),
            registration_grace: DEFAULT_REGISTRATION_GRACE,
            progress_timeout: Duration::ZERO,
            stamp_clock: StampClock::Auto,
        }
    }
}

impl TableOptions {
    fn validate(&self) -> Result<()> {
        let invalid = |message: String| Err(Error::InvalidArgument(message));
        if self.capacity == 0 || self.capacity > MAX_CAPACITY {
            return invalid(format!(
                "capacity {} is out of range, expected 1 to {MAX_CAPACITY}",
                self.capacity
            ));
        }
        if self.mode & !0o777 != 0 || self.mode & 0o600 != 0o600 {
            return invalid(format!(
                "mode {:o} is not usable, expected permission bits (at most 777) including owner read/write (600)",
                self.mode
            ));
        }
        let scan = self.reap_timeout / SCANS_PER_TIMEOUT;
        if !self.progress_timeout.is_zero()
            && (self.reap_timeout.is_zero() || self.progress_timeout < scan)
        {
            return invalid(format!(
                "progress timeout {:?} is below one scan interval ({scan:?}) or reaping is off, expected 0 (off) or at least {scan:?}",
                self.progress_timeout
            ));
        }
        if self.registration_grace < self.reap_timeout {
            return invalid(format!(
                "registration grace {:?} is shorter than the reap timeout {:?}, expected grace >= timeout",
                self.registration_grace, self.reap_timeout
            ));
        }
        if self.stamp_clock == StampClock::Coarse && self.stamps() == Stamps::Precise {
            return invalid(format!(
                "the coarse clock's resolution {:?} is more than 1/{MIN_TIMEOUT_TICKS} of the reap timeout {:?}, \
                 expected a timeout of at least {:?} (or the precise clock)",
                Duration::from_nanos(coarse_resolution_ns()),
                self.reap_timeout,
                Duration::from_nanos(coarse_resolution_ns()) * MIN_TIMEOUT_TICKS
            ));
        }
        Ok(())
    }

    /// How registrants of a table made with these options stamp.
    fn stamps(&self) -> Stamps {
        let resolution_ns = coarse_resolution_ns();
        let fits = resolution_ns > 0
            && resolution_ns.saturating_mul(u64::from(MIN_TIMEOUT_TICKS))
                <= duration_ns(self.reap_timeout);
        match self.stamp_clock {
            StampClock::Auto | StampClock::Coarse if fits => Stamps::Coarse { resolution_ns },
            _ => Stamps::Precise,
        }
    }
}

/// A handle to a table. Cheap to clone; clones share the mapping.
///
/// All processes that open the same name share one table. The table outlives
/// every handle: only [`Table::unlink`] removes it.
///
/// # Examples
///
/// ```
/// use livereg::{Table, TableOptions};
///
/// let name = format!("livereg-doc-table-{}", std::process::id());
/// let table = Table::create(&name, &TableOptions::default())?;
/// let worker = table.register(42, "gpu0")?;
/// worker.heartbeat()?;
/// assert_eq!(table.status()?.tracked_instances, 1);
/// worker.deregister()?;
/// Table::unlink(&name)?;
/// # Ok::<(), livereg::Error>(())
/// ```
#[derive(Clone)]
pub struct Table {
    pub(crate) memory: Arc<TableMemory>,
    pub(crate) clock: Clock,
}

/// The memory behind a table handle.
pub(crate) struct TableMemory {
    pub name: String,
    pub capacity: u32,
    /// The layout's minor version (what the table holds beyond 1.0).
    pub minor: u32,
    /// How registrants stamp heartbeats: read once from the header, so a
    /// writer changing it later changes nothing.
    pub stamps: Stamps,
    backing: Backing,
    /// Serialises registrations of this process; the kernel lock orders them
    /// against other processes.
    registrations: Mutex<()>,
    /// The descriptor of this handle's last failed attempt at the reaper
    /// role, with the fork epoch it was opened in: kept for the next attempt
    /// (see `table_locks.rs`).
    pub(crate) reaper_candidate: Mutex<Option<(LockDescriptor, u64)>>,
}

enum Backing {
    /// A shared object or file, mapped.
    Mapped { file: File, map: MmapRaw },
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
        if let Backing::Heap { base, layout, .. } = &self.backing {
            // SAFETY:
            // - `base` was returned by `alloc_zeroed(layout)` in `in_memory`
            //   and is freed exactly once, here.
            unsafe { alloc::dealloc(base.as_ptr(), *layout) };
        }
    }
}

impl Table {
    /// Creates a table exclusively (`O_CREAT | O_EXCL`) with the options'
    /// mode, sized for `capacity` slots, and marks it ready.
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidArgument`]: a bad name or options.
    /// - [`Error::Exists`]: a table of that name exists.
    /// - [`Error::Permission`]: the OS refused to create it.
    /// - [`Error::Io`]: another OS failure; nothing is left behind.
    pub fn create(name: &str, options: &TableOptions) -> Result<Table> {
        options.validate()?;
        let path = location::resolve(name)?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(options.mode)
            .open(&path)
            .map_err(|e| Error::os(name, "create", e))?;
        Self::initialise(name, file, options).inspect_err(|_| {
            let _ = std::fs::remove_file(&path);
        })
    }

    fn initialise(name: &str, file: File, options: &TableOptions) -> Result<Table> {
        let size = table_size(options.capacity);
        // The umask may have cleared bits of the mode; make it exactly what
        // was asked before anyone can see the table ready.
        file.set_permissions(Permissions::from_mode(options.mode))
            .map_err(|e| Error::os(name, "set permissions", e))?;
        file.set_len(size as u64)
            .map_err(|e| Error::os(name, "size the object", e))?;
        let map = MmapOptions::new()
            .len(size)
            .map_raw(&file)
            .map_err(|e| Error::os(name, "map", e))?;
        let table = Table::from_memory(
            name,
            options.capacity,
            VERSION_MINOR,
            options.stamps(),
            Backing::Mapped { file, map },
        );
        table.write_header(options);
        Ok(table)
    }

    /// A table in this process's heap, for tests that need no OS objects.
    /// Exit detection and kernel locks are absent; everything else behaves as
    /// a shared table.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for bad options.
    pub fn in_memory(options: &TableOptions) -> Result<Table> {
        options.validate()?;
        let layout = Layout::from_size_align(table_size(options.capacity), SLOT_SIZE)
            .map_err(|e| Error::InvalidArgument(format!("capacity {}: {e}", options.capacity)))?;
        // SAFETY:
        // - `layout` has a non-zero size (at least the header).
        let base = NonNull::new(unsafe { alloc::alloc_zeroed(layout) })
            .unwrap_or_else(|| alloc::handle_alloc_error(layout));
        let memory = Backing::Heap {
            base,
            layout,
            reaper_taken: AtomicBool::new(false),
        };
        let table = Table::from_memory(
            "(in memory)",
            options.capacity,
            VERSION_MINOR,
            options.stamps(),
            memory,
        );
        table.write_header(options);
        Ok(table)
    }

    fn from_memory(
        name: &str,
        capacity: u32,
        minor: u32,
        stamps: Stamps,
        backing: Backing,
    ) -> Table {
        let memory = TableMemory {
            name: name.to_owned(),
            capacity,
            minor,
            stamps,
            backing,
            registrations: Mutex::new(()),
            reaper_candidate: Mutex::new(None),
        };
        Table {
            memory: Arc::new(memory),
            clock: Clock::monotonic(),
        }
    }

    fn write_header(&self, options: &TableOptions) {
        let header = self.memory.header();
        header.magic.store(MAGIC, Relaxed);
        header.version_major.store(VERSION_MAJOR, Relaxed);
        header.version_minor.store(VERSION_MINOR, Relaxed);
        header.header_size.store(HEADER_SIZE as u32, Relaxed);
        header.slot_size.store(SLOT_SIZE as u32, Relaxed);
        header.capacity.store(options.capacity, Relaxed);
        header
            .reap_timeout_ns
            .store(duration_ns(options.reap_timeout), Relaxed);
        header
            .registration_grace_ns
            .store(duration_ns(options.registration_grace), Relaxed);
        header
            .progress_timeout_ns
            .store(duration_ns(options.progress_timeout), Relaxed);
        let (clock, resolution_ns) = match self.memory.stamps {
            Stamps::Precise => (STAMPS_PRECISE, 0),
            Stamps::Coarse { resolution_ns } => (STAMPS_COARSE, resolution_ns),
        };
        header.stamp_clock.store(clock, Relaxed);
        header.stamp_resolution_ns.store(resolution_ns, Relaxed);
        // Release: an opener that reads READY sees every field above.
        header.ready.store(READY, Release);
    }

    /// Opens an existing table and validates it before touching any slot:
    /// magic, layout version, header and slot size, and that the object's size
    /// is exactly header + capacity × slot size. If its creator has not
    /// finished, waits up to a second for it.
    ///
    /// # Errors
    ///
    /// - [`Error::NotFound`]: no such table.
    /// - [`Error::Permission`]: the OS refused access (its mode, its owner).
    /// - [`Error::Incompatible`]: another layout version or slot size.
    /// - [`Error::Corrupt`]: not a livereg table, a size that does not match,
    ///   a truncated object, or a header never finished.
    /// - [`Error::InvalidArgument`]: a bad name.
    pub fn open(name: &str) -> Result<Table> {
        let path = location::resolve(name)?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| Error::os(name, "open", e))?;
        let size = wait_until_ready(name, &file)?;
        let corrupt = |detail: String| Error::Corrupt(format!("table '{name}': {detail}"));
        let mapped_len = usize::try_from(size)
            .map_err(|_| corrupt(format!("size {size} bytes is not mappable")))?;
        let map = MmapOptions::new()
            .len(mapped_len)
            .map_raw(&file)
            .map_err(|e| Error::os(name, "map", e))?;
        // SAFETY:
        // - the map is at least HEADER_SIZE bytes (checked by
        //   `wait_until_ready`) and page-aligned, so it holds a `Header`;
        // - `Header` is made of atomics, so shared access is race-free.
        let header = unsafe { &*map.as_ptr().cast::<Header>() };
        let (capacity, minor, stamps) = validate(name, header, size)?;
        Ok(Table::from_memory(
            name,
            capacity,
            minor,
            stamps,
            Backing::Mapped { file, map },
        ))
    }

    /// Removes the table's name. Processes that have it open keep using it
    /// until they close it.
    ///
    /// # Errors
    ///
    /// [`Error::NotFound`], [`Error::Permission`], [`Error::InvalidArgument`]
    /// for a bad name, or [`Error::Io`].
    pub fn unlink(name: &str) -> Result<()> {
        let path = location::resolve(name)?;
        std::fs::remove_file(&path).map_err(|e| Error::os(name, "unlink", e))?;
        // The sessions' records beside it, if a listener made them.
        let _ = std::fs::remove_file(location::sessions_beside(&path));
        Ok(())
    }

    /// This handle, reading time from `clock` for heartbeats, probes, status
    /// and the reapers it builds. Tests use [`Clock::manual`].
    pub fn with_clock(&self, clock: Clock) -> Table {
        Table {
            memory: self.memory.clone(),
            clock,
        }
    }

    /// The clock this handle reads.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// The clock this table's registrants stamp heartbeats with:
    /// [`StampClock::Precise`] or [`StampClock::Coarse`] (never `Auto`: the
    /// creator decided).
    pub fn stamp_clock(&self) -> StampClock {
        match self.memory.stamps {
            Stamps::Precise => StampClock::Precise,
            Stamps::Coarse { .. } => StampClock::Coarse,
        }
    }

    /// The resolution of the clock heartbeats stamp with: the coarse
    /// clock's tick, or zero for precise stamps. A silent registration is
    /// evicted between `reap_timeout` and `reap_timeout + scan_interval +`
    /// [`STAMP_LAG_TICKS`](crate::STAMP_LAG_TICKS)` × stamp_resolution` after
    /// its last heartbeat.
    pub fn stamp_resolution(&self) -> Duration {
        match self.memory.stamps {
            Stamps::Precise => Duration::ZERO,
            Stamps::Coarse { resolution_ns } => Duration::from_nanos(resolution_ns),
        }
    }

    /// The name the table was opened by.
    pub fn name(&self) -> &str {
        &self.memory.name
    }

    /// The file behind a shared table (none for a heap table).
    pub(crate) fn path(&self) -> Option<std::path::PathBuf> {
        self.memory.file()?;
        location::resolve(&self.memory.name).ok()
    }

    /// Number of slots.
    pub fn capacity(&self) -> u32 {
        self.memory.capacity
    }

    /// The silence budget of workers that have beaten; zero if reaping is off.
    pub fn reap_timeout(&self) -> Duration {
        Duration::from_nanos(self.memory.header().reap_timeout_ns.load(Relaxed))
    }

    /// The silence budget of workers that never beat.
    pub fn registration_grace(&self) -> Duration {
        Duration::from_nanos(self.memory.header().registration_grace_ns.load(Relaxed))
    }

    /// How long a busy worker may make no progress (zero: not judged).
    pub fn progress_timeout(&self) -> Duration {
        Duration::from_nanos(self.memory.header().progress_timeout_ns.load(Relaxed))
    }

    /// How often a reaper scans: a quarter of the reap timeout.
    pub fn scan_interval(&self) -> Duration {
        self.reap_timeout() / SCANS_PER_TIMEOUT
    }

    /// Scans done by every reaper of this table since its creation: one
    /// atomic load, for a supervisor that watches the reaper make progress
    /// (`status` reads the same counter with everything else).
    pub fn scans(&self) -> u64 {
        self.memory.header().scans.load(Relaxed)
    }
}

/// Waits until the creator marks the header ready; returns the object's size.
fn wait_until_ready(name: &str, file: &File) -> Result<u64> {
    let corrupt = |detail: String| Error::Corrupt(format!("table '{name}': {detail}"));
    let started = Instant::now();
    loop {
        let size = file
            .metadata()
            .map_err(|e| Error::os(name, "stat", e))?
            .len();
        let mut bytes = [0u8; HEADER_SIZE];
        let header_read = size >= HEADER_SIZE as u64 && file.read_exact_at(&mut bytes, 0).is_ok();
        let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        let magic = word(0);
        if header_read && magic != 0 {
            check_magic(name, magic)?;
        }
        let at = std::mem::offset_of!(Header, ready);
        let ready = u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
        if header_read && ready == READY {
            return Ok(size);
        }
        if started.elapsed() >= READY_WAIT {
            return Err(if size < HEADER_SIZE as u64 {
                corrupt(format!(
                    "truncated: the object has {size} bytes, a table needs at least {HEADER_SIZE}"
                ))
            } else {
                corrupt(format!(
                    "header not marked ready after {READY_WAIT:?} (ready word {ready:#x}, expected {READY:#x}): \
                     its creator may have died while creating it"
                ))
            });
        }
        std::thread::sleep(READY_POLL);
    }
}

/// Whether the first word is livereg's magic.
fn check_magic(name: &str, magic: u64) -> Result<()> {
    if magic == MAGIC {
        return Ok(());
    }
    Err(Error::Corrupt(format!(
        "table '{name}': not a livereg table: magic {magic:#018x}, expected {MAGIC:#018x}"
    )))
}

/// Checks a ready header against the object's size; returns the capacity,
/// the layout's minor version and how its registrants stamp heartbeats.
fn validate(name: &str, header: &Header, size: u64) -> Result<(u32, u32, Stamps)> {
    let incompatible =
        |detail: String| Err(Error::Incompatible(format!("table '{name}': {detail}")));
    let corrupt = |detail: String| Err(Error::Corrupt(format!("table '{name}': {detail}")));
    check_magic(name, header.magic.load(Relaxed))?;
    let major = header.version_major.load(Relaxed);
    if major != VERSION_MAJOR {
        let minor = header.version_minor.load(Relaxed);
        return incompatible(format!(
            "layout version {major}.{minor}, this build reads {VERSION_MAJOR}.x"
        ));
    }
    let header_size = header.header_size.load(Relaxed);
    if header_size as usize != HEADER_SIZE {
        return incompatible(format!(
            "header size {header_size}, this build expects {HEADER_SIZE}"
        ));
    }
    let slot_size = header.slot_size.load(Relaxed);
    if slot_size as usize != SLOT_SIZE {
        return incompatible(format!(
            "slot size {slot_size}, this build expects {SLOT_SIZE}"
        ));
    }
    let capacity = header.capacity.load(Relaxed);
    if capacity == 0 || capacity > MAX_CAPACITY {
        return corrupt(format!("capacity {capacity}, expected 1 to {MAX_CAPACITY}"));
    }
    let minor = header.version_minor.load(Relaxed);
    let expected = object_size(capacity, minor) as u64;
    if size != expected {
        let info = if minor >= INFO_SINCE_MINOR {
            format!(" + {INFO_AREA_SIZE} of info")
        } else {
            String::new()
        };
        return corrupt(format!(
            "object is {size} bytes, expected {expected} ({HEADER_SIZE} + {capacity} slots x {SLOT_SIZE}{info}, layout 1.{minor})"
        ));
    }
    let timeout = header.reap_timeout_ns.load(Relaxed);
    let grace = header.registration_grace_ns.load(Relaxed);
    if grace < timeout {
        return corrupt(format!(
            "registration grace {grace} ns is shorter than the reap timeout {timeout} ns"
        ));
    }
    let stamps = if minor < STAMP_CLOCK_SINCE_MINOR {
        Stamps::Precise
    } else {
        match header.stamp_clock.load(Relaxed) {
            STAMPS_PRECISE => Stamps::Precise,
            STAMPS_COARSE => {
                let resolution_ns = header.stamp_resolution_ns.load(Relaxed);
                let most = timeout / u64::from(MIN_TIMEOUT_TICKS);
                if resolution_ns == 0 || resolution_ns > most {
                    return corrupt(format!(
                        "coarse stamp resolution {resolution_ns} ns, expected 1 to {most} ns \
                         (1/{MIN_TIMEOUT_TICKS} of the reap timeout {timeout} ns)"
                    ));
                }
                Stamps::Coarse { resolution_ns }
            }
            other => {
                return incompatible(format!(
                    "stamp clock {other}, this build knows {STAMPS_PRECISE} (CLOCK_MONOTONIC) \
                     and {STAMPS_COARSE} (CLOCK_MONOTONIC_COARSE)"
                ))
            }
        }
    };
    Ok((capacity, minor, stamps))
}

impl TableMemory {
    #[inline]
    fn base(&self) -> *const u8 {
        match &self.backing {
            Backing::Mapped { map, .. } => map.as_ptr(),
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
            Backing::Heap { .. } => None,
        }
    }

    /// The reaper-role flag of a heap table (a shared table's role is a
    /// kernel lock instead).
    pub fn heap_reaper_flag(&self) -> Option<&AtomicBool> {
        match &self.backing {
            Backing::Heap { reaper_taken, .. } => Some(reaper_taken),
            Backing::Mapped { .. } => None,
        }
    }

    /// Serialises this process's registrations (see `locks`).
    pub fn local_registrations(&self) -> &Mutex<()> {
        &self.registrations
    }

    pub fn no_reaper(&self) -> Error {
        Error::NoReaper(format!("table '{}': no reaper is alive", self.name))
    }
}
