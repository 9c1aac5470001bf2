//! Registering a worker: the builder, validating it, waiting for a
//! previous registration's drop, claiming and publishing a slot. The handle
//! it gives is in `handle.rs`.

use crate::error::{Error, Result};
use crate::event::Reason;

use crate::os::fork::LockDescriptor;
use crate::os::{lock, process};
use crate::sync::Ordering::{Acquire, Relaxed};
use crate::table::handle::Table;
use crate::table::layout::{
    FLAG_COARSE_STAMPS, FLAG_PROXY, FLAG_REMOTE, LABEL_MAX, PROCESS_TAG_SHIFT,
};
use crate::table::protocol::{self, Beat, LIVE};
use crate::table::death_thread;
use crate::worker::handle::Worker;
use std::fs::File;
use std::time::Duration;

/// Where a registration was published: its slot and that slot's generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Placed {
    pub index: u32,
    pub generation: u32,
}

/// A registration of the id being registered, as the registration lock
/// finds it: live, or ended with its drop still pending.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Current {
    Live(Placed),
    Ended(Placed),
}

/// How long [`Registration::register`] may wait in all, by default: for
/// another process's registration lock and for the drop of the same instance
/// id's previous registration (evicted, deregistered or replaced).
pub const REGISTER_WAIT: Duration = Duration::from_secs(5);

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
    wait: Duration,
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
            wait: REGISTER_WAIT,
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

    /// How long [`register`](Registration::register) may wait in all
    /// (default [`REGISTER_WAIT`], five seconds): for the registration lock
    /// another process holds, and for the drop of this id's previous
    /// registration. Zero: never wait (a held lock or a pending drop is
    /// [`Error::Busy`] at once).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// Claims a free slot and publishes the registration.
    ///
    /// An id never comes back before its drop: while a previous registration
    /// of the same id has ended and its drop handlers have not finished
    /// (under a live reaper, or left by one that died), the new registration
    /// waits for them, within [`wait`](Registration::wait), so a
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
    ///   it); or another process held the registration lock past the wait.
    /// - [`Error::Corrupt`]: the object was truncated under this handle.
    /// - [`Error::Io`]: opening the slot's exit-detection lock failed.
    pub fn register(self) -> Result<Worker> {
        let lock_file = self.lock_descriptor()?;
        let placed = self.place(lock_file.as_deref())?;
        Ok(self.worker(placed, lock_file))
    }

    /// Registers a session's client on its behalf (flag `FLAG_REMOTE`): the slot holds no exit lock, and a previous
    /// registration's pending drop is not waited for (`Busy`).
    /// Returns where it was placed.
    pub(crate) fn register_remote(mut self) -> Result<Placed> {
        self.remote = true;
        self.wait = Duration::ZERO;
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
    /// and publishes the registration.
    fn place(&self, lock_file: Option<&File>) -> Result<Placed> {
        let table = self.table;
        let inner = &table.memory;
        if self.instance_id == 0 {
            return Err(Error::InvalidArgument(
                "instance id 0 is reserved, expected 1 or more".into(),
            ));
        }
        check_label(self.label)?;
        inner.check_size()?;
        // One deadline for the whole call. A listener registering a
        // session's client never waits (its `wait` is zero): its client is
        // told `BUSY` and tries again.
        let deadline = crate::clock::deadline_after(self.wait);
        loop {
            let lock_wait = crate::clock::time_left(deadline);
            let guard = inner.lock_registrations(lock_file, lock_wait)?;
            let Placed { index, generation } = match self.find_current() {
                None => {
                    let claimed = self.claim(lock_file.filter(|_| !self.remote))?;
                    drop(guard);
                    return Ok(claimed);
                }
                Some(Current::Live(live)) if self.replace => {
                    let _ =
                        protocol::end(inner.slot(live.index), live.generation, Reason::Replaced);
                    inner.wake_reaper();
                    live
                }
                Some(Current::Live(Placed { index, .. })) => {
                    let pid = inner.slot(index).pid.load(Relaxed);
                    return Err(Error::Exists {
                        message: format!(
                            "table '{}': instance {} is already registered (slot {index}, pid {pid})",
                            inner.name, self.instance_id,
                        ),
                        registered: Some((self.instance_id, pid)),
                    });
                }
                Some(Current::Ended(ended)) => ended,
            };
            drop(guard);
            let pending = |why: &str| {
                Error::Busy {
                message: format!(
                    "table '{}': instance {}'s previous registration (slot {index}) has ended and its drop is pending: {why}",
                    inner.name, self.instance_id
                ),
                pending_drop: Some(self.instance_id),
            }
            };
            crate::table::inside_handlers::refuse_inside_handler(inner, "register it again")
                .map_err(|_| pending("this is a handler of the reaper that runs that drop"))?;
            let slot = inner.slot(index);
            let released = inner.wait_settled(crate::clock::time_left(deadline), || {
                slot.state.load(Acquire) != protocol::state_word(generation, LIVE)
            });
            if !released {
                return Err(pending(&if table.reaper_alive() {
                    format!("the reaper has not finished it within {:?}", self.wait)
                } else {
                    format!(
                        "no reaper is alive to run it (waited {:?}); the next reaper will",
                        self.wait
                    )
                }));
            }
        }
    }

    /// The slot holding a registration of this id: a live one first, else
    /// one that ended and awaits its drop. Called under the registration
    /// lock.
    fn find_current(&self) -> Option<Current> {
        let inner = &self.table.memory;
        let mut pending = None;
        for index in 0..inner.capacity {
            let slot = inner.slot(index);
            let (generation, phase) = protocol::split_state(slot.state.load(Acquire));
            if phase != LIVE || slot.instance_id.load(Relaxed) != self.instance_id {
                continue;
            }
            match protocol::decode_beat(slot.beat.load(Acquire)) {
                Beat::Ended(_) => {
                    pending = pending.or(Some(Current::Ended(Placed { index, generation })))
                }
                _ => return Some(Current::Live(Placed { index, generation })),
            }
        }
        pending
    }

    /// Claims the first free slot whose exit-detection lock can be taken (a
    /// stale owner of the same generation tag, 65,536 reuses ago, might still
    /// hold it), fills it in and publishes it. Called under the registration
    /// lock.
    fn claim(&self, lock_file: Option<&File>) -> Result<Placed> {
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
            if !self.remote {
                death_thread::enlist(inner, index, generation);
            }
            protocol::publish(slot, generation, &fields);
            inner.header().registrations_total.fetch_add(1, Relaxed);
            // So that the reaper starts watching the process at once.
            inner.wake_reaper();
            return Ok(Placed { index, generation });
        }
        Err(Error::Full {
            message: format!(
                "table '{}' is full: all {} slots are taken",
                inner.name, inner.capacity
            ),
            capacity: Some(inner.capacity),
        })
    }
}

impl Registration<'_> {
    /// The handle of a registration just published at `placed`.
    fn worker(&self, placed: Placed, lock_file: Option<LockDescriptor>) -> Worker {
        Worker::new(
            self.table,
            placed.index,
            placed.generation,
            self.instance_id,
            lock_file,
        )
    }
}

/// This process's 16-bit tag (see [`PROCESS_TAG_SHIFT`]): its PID
/// namespace's, so the reaper can tell whether the recorded pid is one it can
/// watch. A forked child in the same namespace shares it and is told apart by
/// its pid.
fn process_tag() -> u32 {
    crate::table::layout::namespace_tag(crate::os::process::pid_namespace())
}

/// Whether `label` can be a registration's: no NUL (it reaches C strings
/// and hook environments), at most [`LABEL_MAX`] bytes. The one rule for
/// every way in, a listener's greetings included.
///
/// # Errors
///
/// [`Error::InvalidArgument`] naming what was found.
pub(crate) fn check_label(label: &str) -> Result<()> {
    if label.contains('\0') {
        return Err(Error::InvalidArgument(format!(
            "label {label:?} contains a NUL byte, expected text without NUL (it reaches C strings and hook environments)"
        )));
    }
    if label.len() > LABEL_MAX {
        return Err(Error::InvalidArgument(format!(
            "label is {} bytes of UTF-8, expected at most {LABEL_MAX}",
            label.len()
        )));
    }
    Ok(())
}
