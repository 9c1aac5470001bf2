//! Registering a worker, and the handle it beats through.

use crate::error::{Error, Result};
use crate::event::Reason;

use crate::clock::Stamps;
use crate::fork::{self, LockDescriptor};
use crate::layout::{
    Slot, FLAG_COARSE_STAMPS, FLAG_PROXY, FLAG_REMOTE, LABEL_MAX, PROCESS_TAG_SHIFT,
};
use crate::os::{lock, process};
use crate::protocol::{self, Beat, Gone, Stamp, LIVE};
use crate::sync::Ordering::{Acquire, Relaxed};
use crate::table::Table;
use std::fs::File;
use std::ptr::NonNull;
use std::sync::Mutex;
use std::time::Duration;

/// How long a registration waits, by default, for the drop of the same
/// instance id's previous registration (evicted, deregistered or replaced).
pub const PREVIOUS_DROP_WAIT: Duration = Duration::from_secs(5);

/// A registration being prepared: [`Table::registration`] makes one.
///
/// # Examples
///
/// ```
/// use livereg::{Table, TableOptions};
///
/// let table = Table::in_memory(&TableOptions::default())?;
/// let reaper = table.reaper().spawn()?;
/// let first = table.registration(7).label("gpu0").register()?;
/// // Registering a live id again is refused unless it replaces the old one;
/// // a replacement waits until the reaper has run the old one's drop.
/// assert!(table.register(7, "gpu0").is_err());
/// let second = table.registration(7).label("gpu0").replace(true).register()?;
/// assert!(first.heartbeat().is_err());
/// second.heartbeat()?;
/// reaper.stop()?;
/// # Ok::<(), livereg::Error>(())
/// ```
#[must_use = "a registration does nothing until `register` is called"]
pub struct Registration<'t> {
    table: &'t Table,
    instance_id: u64,
    label: &'t str,
    pid: u32,
    replace: bool,
    drop_wait: Duration,
    /// Made by a reaper's listener for a session's client: no exit lock
    /// (the client's socket is its death signal).
    remote: bool,
}

impl Table {
    /// Prepares a registration of `instance_id` (see [`Registration`]).
    pub fn registration(&self, instance_id: u64) -> Registration<'_> {
        Registration {
            table: self,
            instance_id,
            label: "",
            pid: std::process::id(),
            replace: false,
            drop_wait: PREVIOUS_DROP_WAIT,
            remote: false,
        }
    }

    /// Registers `instance_id` with `label`; shorthand for
    /// `self.registration(instance_id).label(label).register()`.
    ///
    /// # Errors
    ///
    /// As [`Registration::register`].
    pub fn register(&self, instance_id: u64, label: &str) -> Result<Worker> {
        self.registration(instance_id).label(label).register()
    }
}

impl<'t> Registration<'t> {
    /// A label of at most 47 bytes of UTF-8 shown in status and drop events.
    pub fn label(mut self, label: &'t str) -> Self {
        self.label = label;
        self
    }

    /// The process id to record (default: this process), e.g. the program a
    /// wrapper registers on behalf of. Exit detection follows the process
    /// holding the [`Worker`], whatever this says.
    pub fn pid(mut self, pid: u32) -> Self {
        self.pid = pid;
        self
    }

    /// If a live registration of the same id exists, end it (reason
    /// [`Replaced`](Reason::Replaced)) and take its place.
    pub fn replace(mut self, replace: bool) -> Self {
        self.replace = replace;
        self
    }

    /// How long to wait for the drop of this id's previous registration
    /// (default [`PREVIOUS_DROP_WAIT`], five seconds).
    pub fn drop_wait(mut self, wait: Duration) -> Self {
        self.drop_wait = wait;
        self
    }

    /// Claims a free slot and publishes the registration.
    ///
    /// An id never comes back before its drop: while a previous registration
    /// of the same id has ended and its drop handlers have not finished
    /// (under a live reaper, or left by one that died), the new registration
    /// waits for them, up to [`drop_wait`](Registration::drop_wait), so a
    /// server never frees state of the new registration.
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidArgument`]: instance id 0, a label over 47 bytes or
    ///   containing NUL.
    /// - [`Error::Exists`]: the id is registered and alive (and `replace` is off).
    /// - [`Error::Full`]: no slot is free.
    /// - [`Error::Busy`]: the previous registration's drop did not finish
    ///   within the wait (or this is a handler of the reaper that would run
    ///   it); or another process held the registration lock for over five
    ///   seconds.
    /// - [`Error::Corrupt`]: the object was truncated under this handle.
    /// - [`Error::Io`]: opening the slot's exit-detection lock failed.
    pub fn register(self) -> Result<Worker> {
        let lock_file = self.lock_descriptor()?;
        let placed = self.place(lock_file.as_deref())?;
        Ok(self.worker(placed, lock_file))
    }

    /// Registers a session's client on its behalf (flag `FLAG_REMOTE`): the slot holds no exit lock, and a previous
    /// registration's pending drop is not waited for (`Busy`).
    /// Returns `(slot, generation)`.
    pub(crate) fn register_remote(mut self) -> Result<(u32, u32)> {
        self.remote = true;
        self.drop_wait = Duration::ZERO;
        let lock_file = self.lock_descriptor()?;
        self.place(lock_file.as_deref())
    }

    /// A new open file description of the table, for the registration lock
    /// (and a local registration's exit lock); none for heap tables.
    fn lock_descriptor(&self) -> Result<Option<LockDescriptor>> {
        let inner = &self.table.memory;
        inner.file().map_or(Ok(None), |file| {
            let reopened = lock::reopen(file).map_err(|e| {
                Error::os(&inner.name, "open the registration's lock descriptor", e)
            })?;
            Ok(Some(LockDescriptor::new(reopened)))
        })
    }

    /// Validates, then claims a slot (waiting for this id's previous drop)
    /// and publishes the registration: `(slot, generation)`.
    fn place(&self, lock_file: Option<&File>) -> Result<(u32, u32)> {
        let table = self.table;
        let inner = &table.memory;
        if self.instance_id == 0 {
            return Err(Error::InvalidArgument(
                "instance id 0 is reserved, expected 1 or more".into(),
            ));
        }
        if self.label.contains('\0') {
            return Err(Error::InvalidArgument(format!(
                "label {:?} contains a NUL byte, expected text without NUL (it reaches C strings and hook environments)",
                self.label
            )));
        }
        if self.label.len() > LABEL_MAX {
            return Err(Error::InvalidArgument(format!(
                "label is {} bytes of UTF-8, expected at most {LABEL_MAX}",
                self.label.len()
            )));
        }
        inner.check_size()?;
        let deadline = crate::clock::deadline_after(self.drop_wait);
        loop {
            let guard = inner.lock_registrations(lock_file)?;
            let (index, generation) = match self.find_current() {
                None => {
                    let claimed = self.claim(lock_file.filter(|_| !self.remote))?;
                    drop(guard);
                    return Ok(claimed);
                }
                Some((index, generation, false)) if self.replace => {
                    let _ = protocol::end(inner.slot(index), generation, Reason::Replaced);
                    inner.wake_reaper();
                    (index, generation)
                }
                Some((index, _, false)) => {
                    return Err(Error::Exists(format!(
                        "table '{}': instance {} is already registered (slot {index}, pid {})",
                        inner.name,
                        self.instance_id,
                        inner.slot(index).pid.load(Relaxed)
                    )))
                }
                Some((index, generation, true)) => (index, generation),
            };
            drop(guard);
            let pending = |why: &str| {
                Error::Busy(format!(
                    "table '{}': instance {}'s previous registration (slot {index}) has ended and its drop is pending: {why}",
                    inner.name, self.instance_id
                ))
            };
            crate::handlers::refuse_inside_handler(inner, "register it again")
                .map_err(|_| pending("this is a handler of the reaper that runs that drop"))?;
            let slot = inner.slot(index);
            let released = inner.wait_settled(crate::clock::time_left(deadline), || {
                slot.state.load(Acquire) != protocol::state_word(generation, LIVE)
            });
            if !released {
                return Err(pending(&if table.reaper_alive() {
                    format!("the reaper has not finished it within {:?}", self.drop_wait)
                } else {
                    format!(
                        "no reaper is alive to run it (waited {:?}); the next reaper will",
                        self.drop_wait
                    )
                }));
            }
        }
    }

    /// The slot holding a registration of this id: `(index, generation,
    /// ended)`, a live one first, else one that ended and awaits its drop.
    /// Called under the registration lock.
    fn find_current(&self) -> Option<(u32, u32, bool)> {
        let inner = &self.table.memory;
        let mut pending = None;
        for index in 0..inner.capacity {
            let slot = inner.slot(index);
            let (generation, phase) = protocol::split_state(slot.state.load(Acquire));
            if phase != LIVE || slot.instance_id.load(Relaxed) != self.instance_id {
                continue;
            }
            match protocol::decode_beat(slot.beat.load(Acquire)) {
                Beat::Ended(_) => pending = pending.or(Some((index, generation, true))),
                _ => return Some((index, generation, false)),
            }
        }
        pending
    }

    /// Claims the first free slot whose exit-detection lock can be taken (a
    /// stale owner of the same generation tag, 65,536 reuses ago, might still
    /// hold it), fills it in and publishes it. Called under the registration
    /// lock.
    fn claim(&self, lock_file: Option<&File>) -> Result<(u32, u32)> {
        let table = self.table;
        let inner = &table.memory;
        for index in 0..inner.capacity {
            let slot = inner.slot(index);
            let Some(generation) = protocol::try_claim(slot) else {
                continue;
            };
            if let Some(file) = lock_file {
                match lock::try_lock(file, lock::registration_lock(index, generation)) {
                    Ok(true) => {}
                    Ok(false) => {
                        protocol::abandon_claim(slot, generation);
                        continue;
                    }
                    Err(e) => {
                        protocol::abandon_claim(slot, generation);
                        return Err(Error::os(&inner.name, "take the slot lock", e));
                    }
                }
            }
            let fields = if self.remote {
                protocol::SlotFields {
                    instance_id: self.instance_id,
                    label: self.label,
                    pid: self.pid,
                    process_start: 0,
                    registered_ns: table.clock.now_ns(),
                    clock_id: table.clock.identity(),
                    // The listener stamps its heartbeats with the precise clock.
                    flags: FLAG_REMOTE | FLAG_PROXY,
                }
            } else {
                protocol::SlotFields {
                    instance_id: self.instance_id,
                    label: self.label,
                    pid: self.pid,
                    process_start: if self.pid == std::process::id() {
                        process::own_start_time()
                    } else {
                        process::start_time(&self.pid.to_string()).unwrap_or(0)
                    },
                    registered_ns: table.clock.now_ns(),
                    clock_id: table.clock.identity(),
                    flags: if self.pid == std::process::id() {
                        0
                    } else {
                        FLAG_PROXY
                    } | if table.clock.stamps_lag(inner.stamps) {
                        FLAG_COARSE_STAMPS
                    } else {
                        0
                    } | process_tag() << PROCESS_TAG_SHIFT,
                }
            };
            protocol::publish(slot, generation, &fields);
            inner.header().registrations_total.fetch_add(1, Relaxed);
            // So that the reaper starts watching the process at once.
            inner.wake_reaper();
            return Ok((index, generation));
        }
        Err(Error::Full(format!(
            "table '{}' is full: all {} slots are taken",
            inner.name, inner.capacity
        )))
    }
}

impl Registration<'_> {
    /// The handle of a registration just published in `(index, generation)`.
    fn worker(&self, (index, generation): (u32, u32), lock_file: Option<LockDescriptor>) -> Worker {
        Worker {
            slot: NonNull::from(self.table.memory.slot(index)),
            stamps: self.table.memory.stamps,
            table: self.table.clone(),
            index,
            generation,
            instance_id: self.instance_id,
            lock: Mutex::new(lock_file),
            fork_epoch: fork::epoch(),
            finished: false,
            session: None,
        }
    }
}

/// A live registration: beat through it, deregister it, or drop it (which
/// deregisters).
///
/// The handle is `Send` and `Sync`; heartbeats from several threads are safe.
pub struct Worker {
    /// The slot, resolved once: the heartbeat's only memory besides the
    /// clock. Valid while `table` keeps the mapping.
    slot: NonNull<Slot>,
    /// How heartbeats stamp on this table (its header's choice).
    stamps: Stamps,
    table: Table,
    index: u32,
    generation: u32,
    instance_id: u64,
    /// The open file description holding the slot's exit-detection lock;
    /// closed as soon as the registration is known to have ended.
    lock: Mutex<Option<LockDescriptor>>,
    /// The fork epoch the handle was made in: a forked child's copy is not
    /// the registration's owner.
    fork_epoch: u64,
    finished: bool,
    /// A session's link to the reaper's listener, when this worker's slot
    /// is in this process's own memory and a sender thread forwards it.
    session: Option<Box<dyn Remote>>,
}

// SAFETY:
// - `slot` points into the mapping (or heap block) that `table` keeps alive
//   for as long as the handle exists, and `Slot` is made only of atomics, so
//   reading and writing it from any thread is data-race free; every other
//   field is `Send` and `Sync`.
unsafe impl Send for Worker {}
// SAFETY: as above.
unsafe impl Sync for Worker {}

impl Worker {
    /// The registration's slot.
    #[inline]
    fn own_slot(&self) -> &Slot {
        // SAFETY:
        // - `slot` came from `TableMemory::slot` of the memory `self.table`
        //   holds, which outlives `self`; `Slot` is all atomics.
        unsafe { self.slot.as_ref() }
    }

    /// Proves this worker alive: one clock read (the coarse clock where the
    /// table stamps with it, see [`StampClock`](crate::clock::StampClock)) and at
    /// most one compare-and-swap on its own slot (none when the slot already
    /// holds this stamp, as for every beat within a coarse tick), no system
    /// call, no allocation.
    ///
    /// # Errors
    ///
    /// [`Error::Evicted`] once the registration has ended (evicted, cleared,
    /// replaced): the heartbeat was not counted; register again.
    #[inline]
    pub fn heartbeat(&self) -> Result<()> {
        if self.fork_epoch != fork::epoch() {
            return Err(self.inherited());
        }
        let slot = self.own_slot();
        let stamp = Stamp::of_micros(self.table.clock.stamp_micros(self.stamps));
        match protocol::beat_at(slot, self.generation, stamp) {
            Ok(()) => {
                // Advisory count for status; a plain store on the owner's
                // own line (only the owner writes it).
                slot.beats
                    .store(slot.beats.load(Relaxed).wrapping_add(1), Relaxed);
                Ok(())
            }
            Err(gone) => Err(self.gone(gone)),
        }
    }

    /// Says whether the engine has work in flight: while busy,
    /// it must make [`progress`](Worker::progress) at least every
    /// `progress_timeout` of the table, or it ends `Stalled`. Idle, it never
    /// stalls, however long it waits.
    ///
    /// # Errors
    ///
    /// [`Error::Evicted`] once the registration has ended.
    pub fn set_busy(&self, busy: bool) -> Result<()> {
        if self.fork_epoch != fork::epoch() {
            return Err(self.inherited());
        }
        protocol::set_busy(self.own_slot(), self.generation, busy).map_err(|gone| self.gone(gone))
    }

    /// Busy until the returned guard is dropped (then idle).
    ///
    /// # Errors
    ///
    /// As [`Worker::set_busy`].
    ///
    /// # Examples
    ///
    /// ```
    /// use livereg::{Table, TableOptions};
    ///
    /// let table = Table::in_memory(&TableOptions::default())?;
    /// let worker = table.register(1, "gpu1")?;
    /// {
    ///     let _step = worker.busy()?;
    ///     for _batch in 0..3 {
    ///         worker.progress()?; // one step of the engine's loop
    ///     }
    /// }
    /// # Ok::<(), livereg::Error>(())
    /// ```
    pub fn busy(&self) -> Result<Busy<'_>> {
        self.set_busy(true)?;
        Ok(Busy { worker: self })
    }

    /// One step of progress: one atomic add on the worker's own slot, no
    /// clock read, no system call.
    ///
    /// # Errors
    ///
    /// [`Error::Evicted`] once the registration was ended for making no
    /// progress (reason [`Stalled`](Reason::Stalled)), or has ended and its
    /// drop ran. (Ended otherwise but not yet dropped, the step still counts:
    /// the next [`heartbeat`](Worker::heartbeat) says `Evicted`.)
    #[inline]
    pub fn progress(&self) -> Result<()> {
        if self.fork_epoch != fork::epoch() {
            return Err(self.inherited());
        }
        protocol::progress(self.own_slot(), self.generation).map_err(|gone| self.gone(gone))
    }

    /// Ends the registration cleanly (reason
    /// [`Deregistered`](Reason::Deregistered)); the reaper runs the drop
    /// handlers. Consumes the handle.
    ///
    /// # Errors
    ///
    /// [`Error::Evicted`] if it had already ended; it is gone either way.
    /// [`Error::Corrupt`] if the table was truncated (nothing is written).
    pub fn deregister(mut self) -> Result<()> {
        self.finish()
    }

    fn finish(&mut self) -> Result<()> {
        self.finished = true;
        if self.fork_epoch != fork::epoch() {
            return Err(self.inherited());
        }
        let inner = &self.table.memory;
        inner.check_size()?;
        let result = protocol::end(
            inner.slot(self.index),
            self.generation,
            Reason::Deregistered,
        );
        inner.wake_reaper();
        if let Some(session) = &mut self.session {
            session.finish();
        }
        match result {
            Ok(()) => {
                self.release_lock();
                Ok(())
            }
            Err(gone) => Err(self.gone(gone)),
        }
    }

    fn gone(&self, gone: Gone) -> Error {
        self.release_lock();
        let reason = match gone {
            Gone::Ended(reason) => reason,
            Gone::Reused => None,
        };
        Error::Evicted {
            instance_id: self.instance_id,
            reason,
        }
    }

    /// The handle was inherited through `fork`: the registration is the
    /// parent's, and this process must not touch it.
    fn inherited(&self) -> Error {
        self.release_lock();
        Error::Evicted {
            instance_id: self.instance_id,
            reason: None,
        }
    }

    fn release_lock(&self) {
        let mut lock = self
            .lock
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        *lock = None;
    }

    /// The registered instance id.
    pub fn instance_id(&self) -> u64 {
        self.instance_id
    }

    /// The slot this registration occupies (in the reaper's table, for a
    /// session).
    pub fn slot(&self) -> u32 {
        self.session.as_ref().map_or(self.index, |s| s.slot())
    }

    /// The slot's generation for this registration.
    pub fn generation(&self) -> u32 {
        self.session
            .as_ref()
            .map_or(self.generation, |s| s.generation())
    }

    /// The table this worker is registered in (for a session: the private
    /// one in this process that its sender thread forwards).
    pub fn table(&self) -> &Table {
        &self.table
    }

    /// The reap timeout of the table this worker is registered in (for a
    /// session: the reaper's table, as its listener said): beat well within
    /// it.
    pub fn reap_timeout(&self) -> Duration {
        self.session
            .as_ref()
            .map_or_else(|| self.table.reap_timeout(), |s| s.reap_timeout())
    }

    /// Whether this worker registered through a session ([`connect`](crate::connect)).
    pub fn is_remote(&self) -> bool {
        self.session.is_some()
    }

    /// The server's info area ([`Table::set_info`]): read from the table, or
    /// as the listener last delivered it to a session.
    ///
    /// # Errors
    ///
    /// As [`Table::info`] for a local worker; never for a session.
    pub fn info(&self) -> Result<Vec<u8>> {
        match &self.session {
            Some(session) => Ok(session.info()),
            None => self.table.info(),
        }
    }

    /// Asks the server for a clear of its stored cache, as
    /// [`Table::clear`] does, from the engine that holds this registration:
    /// on the table it is registered in, or, for a session, through the
    /// listener it connected to (a connection of its own, with the same
    /// address, token and TLS). Registrations are untouched; this worker
    /// keeps beating.
    ///
    /// # Errors
    ///
    /// As [`Table::clear`]; for a session also as
    /// [`remote_clear`](crate::remote_clear) (the listener unreachable or
    /// refusing).
    ///
    /// # Examples
    ///
    /// ```
    /// use livereg::{Table, TableOptions};
    /// use std::time::Duration;
    ///
    /// let table = Table::in_memory(&TableOptions::default())?;
    /// let reaper = table.reaper().on_clear(|| Ok(())).spawn()?;
    /// let worker = table.register(7, "gpu7")?;
    /// worker.clear(Duration::from_secs(5))?;
    /// worker.heartbeat()?; // still registered
    /// reaper.stop()?;
    /// # Ok::<(), livereg::Error>(())
    /// ```
    pub fn clear(&self, wait: Duration) -> Result<()> {
        match &self.session {
            Some(session) => session.request_clear(false, wait),
            None => self.table.clear(wait),
        }
    }

    /// Asks the server for a reset, as [`Table::reset`]: every registration
    /// of its table ends `cleared` (this one too: its next heartbeat returns
    /// [`Evicted`](Error::Evicted)), then its cache is cleared.
    ///
    /// # Errors
    ///
    /// As [`Worker::clear`].
    pub fn reset(&self, wait: Duration) -> Result<()> {
        match &self.session {
            Some(session) => {
                session.request_clear(true, wait)?;
                // The reset ended the registration on the reaper's side;
                // its slot here says so before this returns, not when the
                // listener's notice arrives.
                let slot = self.table.memory.slot(self.index);
                let _ = protocol::end(slot, self.generation, crate::event::Reason::Cleared);
                Ok(())
            }
            None => self.table.reset(wait),
        }
    }

    pub(crate) fn local_slot(&self) -> u32 {
        self.index
    }

    pub(crate) fn local_generation(&self) -> u32 {
        self.generation
    }

    pub(crate) fn with_session(mut self, link: Box<dyn Remote>) -> Worker {
        self.session = Some(link);
        self
    }
}

/// What a worker registered through a session holds besides its own slot:
/// the link its sender thread keeps to the reaper's listener (made by
/// `crate::session`).
pub(crate) trait Remote: Send + Sync {
    /// The registration's slot in the reaper's table.
    fn slot(&self) -> u32;
    /// That slot's generation.
    fn generation(&self) -> u32;
    /// The reaper's table's reap timeout.
    fn reap_timeout(&self) -> Duration;
    /// The server's info area as last delivered.
    fn info(&self) -> Vec<u8>;
    /// Asks the reaper for a clear (or reset) through its listener.
    fn request_clear(&self, reset: bool, wait: Duration) -> Result<()>;
    /// The worker deregistered (its slot says so): say goodbye, a bounded
    /// wait.
    fn finish(&mut self);
}

/// This process's 16-bit tag (see [`PROCESS_TAG_SHIFT`]): its PID
/// namespace's, so the reaper can tell whether the recorded pid is one it can
/// watch. A forked child in the same namespace shares it and is told apart by
/// its pid.
fn process_tag() -> u32 {
    crate::layout::namespace_tag(crate::os::process::pid_namespace())
}

impl Drop for Worker {
    fn drop(&mut self) {
        if !self.finished {
            let _ = self.finish();
        }
    }
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("table", &self.table.memory.name)
            .field("instance_id", &self.instance_id)
            .field("slot", &self.index)
            .field("generation", &self.generation)
            .finish()
    }
}

/// A worker marked busy; idle again when dropped. See [`Worker::busy`].
#[must_use = "the worker is idle again as soon as this guard is dropped"]
pub struct Busy<'w> {
    worker: &'w Worker,
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        let _ = self.worker.set_busy(false);
    }
}
