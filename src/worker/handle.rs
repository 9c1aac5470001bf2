//! The handle a registered worker beats through: heartbeats, busy and
//! progress, its info, a clear asked through it, deregistration. Made by
//! `registration.rs`.

use crate::error::{Error, Result};
use crate::event::Reason;

use crate::clock::Stamps;
use crate::os::fork::{self, LockDescriptor};
use crate::sync::Ordering::Relaxed;
use crate::table::handle::Table;
use crate::table::layout::Slot;
use crate::table::reaper_life::ReaperState;
use crate::table::protocol::{self, Gone, Stamp};
use crate::table::death_thread;
use crate::worker::nature::{Local, Nature};
use std::ptr::NonNull;
use std::sync::atomic::AtomicBool;
use std::sync::Mutex;
use std::time::Duration;

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
    /// Whether this process's death word speaks for the registration (until
    /// it is known to have ended).
    death_word: AtomicBool,
    finished: bool,
    /// Where the registration lives: this slot's table, or the reaper's
    /// table through a session whose sender thread forwards this slot.
    nature: Box<dyn Nature>,
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
    /// The handle of a registration just published in slot `index` at
    /// `generation` (holding its exit lock through `lock_file`, if local).
    pub(crate) fn new(
        table: &Table,
        index: u32,
        generation: u32,
        instance_id: u64,
        lock_file: Option<LockDescriptor>,
    ) -> Worker {
        Worker {
            slot: NonNull::from(table.memory.slot(index)),
            stamps: table.memory.stamps,
            table: table.clone(),
            index,
            generation,
            instance_id,
            lock: Mutex::new(lock_file),
            fork_epoch: fork::epoch(),
            death_word: AtomicBool::new(death_thread::is_listed(&table.memory)),
            finished: false,
            nature: Box::new(Local {
                table: table.clone(),
                index,
                generation,
            }),
        }
    }

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
        self.nature.finish();
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
        gone.evicted(self.instance_id)
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

    /// The registration is known to have ended: its exit lock is closed
    /// and its process's death word no longer speaks for it.
    fn release_lock(&self) {
        let mut lock = self
            .lock
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        *lock = None;
        if self.death_word.swap(false, Relaxed) {
            death_thread::leave(&self.table.memory, self.index, self.generation);
        }
    }

    /// The registered instance id.
    pub fn instance_id(&self) -> u64 {
        self.instance_id
    }

    /// The slot this registration occupies (in the reaper's table, for a
    /// session).
    pub fn slot(&self) -> u32 {
        self.nature.slot()
    }

    /// The slot's generation for this registration.
    pub fn generation(&self) -> u32 {
        self.nature.generation()
    }

    /// The table this worker is registered in, where [`slot`](Worker::slot)
    /// is: `None` for a session, whose registration is in the reaper's
    /// table, reached through its listener.
    pub fn table(&self) -> Option<&Table> {
        self.nature.table()
    }

    /// The table this worker's pings land in: its own, or for a session
    /// the private one in this process that its sender thread forwards.
    pub(crate) fn pinged_table(&self) -> &Table {
        &self.table
    }

    /// The reap timeout of the table this worker is registered in (for a
    /// session: the reaper's table, as its listener said): beat well within
    /// it.
    pub fn reap_timeout(&self) -> Duration {
        self.nature.reap_timeout()
    }

    /// Whether this worker registered through a session ([`connect`](crate::connect)).
    pub fn is_remote(&self) -> bool {
        self.nature.table().is_none()
    }

    /// The server's info area ([`Table::set_info`]): read from the table, or
    /// as the listener last delivered it to a session.
    ///
    /// # Errors
    ///
    /// As [`Table::info`] for a local worker; never for a session.
    pub fn info(&self) -> Result<Vec<u8>> {
        self.nature.info()
    }

    /// The server's reaper, as this registration knows it: as
    /// [`Table::reaper_state`] for a local worker; for a session,
    /// `Serving` (the welcoming reaper's boot token; pid 0, not said over a
    /// session) while connected, and `Absent` from the connection's close
    /// until a listener takes the registration back (a new token: a new
    /// reaper). A session never says `Dying`.
    pub fn reaper_state(&self) -> ReaperState {
        self.nature.reaper_state()
    }

    /// Waits up to `wait`, without polling, for the server's reaper to
    /// differ from `known` ([`Worker::reaper_state`]); returns the state
    /// then (`known` when the time ran out). As
    /// [`Table::wait_reaper_state`] for a local worker.
    pub fn wait_reaper_state(&self, known: ReaperState, wait: Duration) -> ReaperState {
        self.nature.wait_reaper_state(known, wait)
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
        self.nature.request_clear(false, wait)
    }

    /// Asks the server for a reset, as [`Table::reset`]: every registration
    /// of its table ends `cleared` (this one too: its next heartbeat returns
    /// [`Evicted`](Error::Evicted)), then its cache is cleared.
    ///
    /// # Errors
    ///
    /// As [`Worker::clear`].
    pub fn reset(&self, wait: Duration) -> Result<()> {
        self.nature.request_clear(true, wait)
    }

    pub(crate) fn local_slot(&self) -> u32 {
        self.index
    }

    pub(crate) fn local_generation(&self) -> u32 {
        self.generation
    }

    /// This worker, registered through a session whose link forwards its
    /// slot to a reaper's listener.
    pub(crate) fn with_session(mut self, link: Box<dyn Nature>) -> Worker {
        self.nature = link;
        self
    }
}

impl Gone {
    /// The `Evicted` of instance `instance_id`, whose registration is gone
    /// so: with its reason if it ended, without once its slot was reused.
    pub(crate) fn evicted(self, instance_id: u64) -> Error {
        Error::Evicted {
            instance_id,
            reason: match self {
                Gone::Ended(reason) => reason,
                Gone::Reused => None,
            },
        }
    }
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
