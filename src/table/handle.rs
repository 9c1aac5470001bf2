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
//! How a new one is made is [`TableOptions`] (`table_options.rs`). Behind a
//! handle is a [`TableMemory`] (`table_memory.rs`): the mapping (or a heap
//! block for tests), its name and size. Its kernel locks (reaper role, registration
//! lock) are in `locks.rs`; the futex words that wake the reaper and the
//! waiters of a clear are in `wake.rs`.

use crate::clock::{duration_ns, Clock, StampClock, Stamps, MIN_TIMEOUT_TICKS};
use crate::error::{Error, Result};
use crate::sync::Ordering::{Relaxed, Release};
use crate::table::layout::{
    object_size, table_size, Header, HEADER_SIZE, INFO_AREA_SIZE, INFO_SINCE_MINOR, MAGIC,
    MAX_CAPACITY, READY, SCANS_PER_TIMEOUT, SLOT_SIZE, STAMPS_COARSE, STAMPS_PRECISE,
    STAMP_CLOCK_SINCE_MINOR, VERSION_MAJOR, VERSION_MINOR,
};
use crate::table::death_thread;
use crate::table::death_words::{self, DeathWords};
use crate::table::owned_dirs;
use crate::table::owned_sweep;
use crate::table::owned_records::{self, OwnedRecords};
use crate::table::location;
use crate::table::memory::{Backing, TableMemory};
use crate::table::options::TableOptions;
use memmap2::MmapOptions;
use std::alloc::{self, Layout};
use std::fs::{File, OpenOptions, Permissions};
use std::os::unix::fs::{FileExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::ptr::NonNull;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long an opener waits for a creator to finish the header.
const READY_WAIT: Duration = Duration::from_secs(1);
/// How often an opener looks again for a creator's `ready` word: creating
/// takes microseconds, so a waiter rarely looks twice.
const READY_POLL: Duration = Duration::from_millis(2);

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
        Self::initialise(name, &path, file, options).inspect_err(|_| {
            let _ = std::fs::remove_file(&path);
            let _ = std::fs::remove_file(death_words::beside(&path));
            let _ = std::fs::remove_file(owned_records::beside(&path));
            let _ = std::fs::remove_file(owned_dirs::beside(&path));
        })
    }

    fn initialise(name: &str, path: &Path, file: File, options: &TableOptions) -> Result<Table> {
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
        let death_words = DeathWords::create(path, options.capacity, options.mode)
            .map_err(|e| Error::os(name, "create its death words", e))?;
        let owned = OwnedRecords::create(path, &options.owned_dirs, options.mode)
            .map_err(|e| Error::os(name, "create its owned-file records", e))?;
        let table = Table::from_memory(
            name,
            options.capacity,
            VERSION_MINOR,
            options.stamps(),
            Backing::Mapped { file, map },
            (Some(death_words), Some(owned)),
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
            (None, None),
        );
        table.write_header(options);
        Ok(table)
    }

    pub(crate) fn from_memory(
        name: &str,
        capacity: u32,
        minor: u32,
        stamps: Stamps,
        backing: Backing,
        (death_words, owned): (Option<DeathWords>, Option<OwnedRecords>),
    ) -> Table {
        let memory = TableMemory {
            name: name.to_owned(),
            capacity,
            minor,
            stamps,
            backing,
            registrations: Mutex::new(()),
            reaper_candidate: Mutex::new(None),
            death_words,
            death_listing: Mutex::new(None),
            owned,
            owner_hold: Mutex::new(None),
        };
        let memory = Arc::new(memory);
        death_thread::start_parked(&memory);
        Table {
            memory,
            clock: Clock::monotonic(),
        }
    }

    pub(crate) fn write_header(&self, options: &TableOptions) {
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
        let (clock, resolution_ns) = header_words(self.memory.stamps);
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
        // A shared-memory name is never a symbolic link (anyone may plant
        // one in /dev/shm); a path given with '/' is the caller's to choose.
        let no_follow = if name.contains('/') {
            0
        } else {
            libc::O_NOFOLLOW
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(no_follow)
            .open(&path)
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ELOOP) => Error::Permission(format!(
                    "table '{name}': {} is a symbolic link, expected the table itself: refusing to follow it",
                    path.display()
                )),
                _ => Error::os(name, "open", e),
            })?;
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
        let death_words = DeathWords::open(&path, &file, capacity);
        let owned = OwnedRecords::open(&path, &file);
        Ok(Table::from_memory(
            name,
            capacity,
            minor,
            stamps,
            Backing::Mapped { file, map },
            (death_words, owned),
        ))
    }

    /// Removes the table's name. Processes that have it open keep using it
    /// until they close it.
    ///
    /// Its owned-file records go with it: first the files of processes
    /// that have ended are removed (by the same rules as the reaper's);
    /// the declarations of processes still alive are dropped, and their
    /// files stay after they end (logged as a warning; `livereg status`
    /// lists them before: `owned_files.owners` not `ended`).
    ///
    /// # Errors
    ///
    /// [`Error::NotFound`], [`Error::Permission`], [`Error::InvalidArgument`]
    /// for a bad name, or [`Error::Io`].
    pub fn unlink(name: &str) -> Result<()> {
        let path = location::resolve(name)?;
        let live = owned_sweep::settle(&path, name);
        if !live.is_empty() {
            log::warn!(
                "table '{name}': removed while {} processes own files in it (pids {live:?}): their declarations go with it, and no reaper will remove those files once they end",
                live.len()
            );
        }
        std::fs::remove_file(&path).map_err(|e| Error::os(name, "unlink", e))?;
        // The sessions' records, the death words and the owned-file
        // records beside it, if made.
        let _ = std::fs::remove_file(location::sessions_beside(&path));
        let _ = std::fs::remove_file(death_words::beside(&path));
        let _ = std::fs::remove_file(owned_records::beside(&path));
        let _ = std::fs::remove_file(owned_dirs::beside(&path));
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
        self.memory.stamps.clock()
    }

    /// The resolution of the clock heartbeats stamp with: the coarse
    /// clock's tick, or zero for precise stamps. A silent registration is
    /// evicted between `reap_timeout` and `reap_timeout + scan_interval +`
    /// [`STAMP_LAG_TICKS`](crate::STAMP_LAG_TICKS)` × stamp_resolution` after
    /// its last heartbeat.
    pub fn stamp_resolution(&self) -> Duration {
        self.memory.stamps.resolution()
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
        let clock = header.stamp_clock.load(Relaxed);
        let resolution_ns = header.stamp_resolution_ns.load(Relaxed);
        match stamps_of_header_words(clock, resolution_ns) {
            Some(Stamps::Precise) => Stamps::Precise,
            Some(Stamps::Coarse { resolution_ns }) => {
                let most = timeout / u64::from(MIN_TIMEOUT_TICKS);
                if resolution_ns == 0 || resolution_ns > most {
                    return corrupt(format!(
                        "coarse stamp resolution {resolution_ns} ns, expected 1 to {most} ns \
                         (1/{MIN_TIMEOUT_TICKS} of the reap timeout {timeout} ns)"
                    ));
                }
                Stamps::Coarse { resolution_ns }
            }
            None => {
                return incompatible(format!(
                    "stamp clock {clock}, this build knows {STAMPS_PRECISE} (CLOCK_MONOTONIC) \
                     and {STAMPS_COARSE} (CLOCK_MONOTONIC_COARSE)"
                ))
            }
        }
    };
    Ok((capacity, minor, stamps))
}

/// The header's words for how registrants stamp: `(stamp_clock,
/// stamp_resolution_ns)`.
fn header_words(stamps: Stamps) -> (u32, u64) {
    match stamps {
        Stamps::Precise => (STAMPS_PRECISE, 0),
        Stamps::Coarse { resolution_ns } => (STAMPS_COARSE, resolution_ns),
    }
}

/// What the header's words say, if this build knows the clock (a coarse
/// one's resolution is checked by the opener).
fn stamps_of_header_words(clock: u32, resolution_ns: u64) -> Option<Stamps> {
    match clock {
        STAMPS_PRECISE => Some(Stamps::Precise),
        STAMPS_COARSE => Some(Stamps::Coarse { resolution_ns }),
        _ => None,
    }
}
