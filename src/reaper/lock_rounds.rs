//! The lock tests a round makes (its schedule is `lock_schedule.rs`): one
//! registration of each registering process, the others only if that one's
//! lock is gone.

use super::lock_schedule::Registrant;
use super::role::Reaper;
use crate::os::lock;
use crate::sync::Ordering::{Acquire, Relaxed};
use crate::table::layout::{Slot, FLAG_PROXY, PROCESS_TAG_SHIFT};
use crate::table::protocol::{self, CLAIMING};

impl Reaper {
    /// In a round, whether a registration seen before this scan has lost its
    /// lock: not if another registration of its process was found holding
    /// its lock in this round; else tested (see [`Reaper::test_lock`]).
    /// Registrations on another's behalf, or whose process start is unknown,
    /// are always tested on their own.
    pub(super) fn lock_dropped(&mut self, index: u32, generation: u32, slot: &Slot) -> bool {
        let flags = slot.flags.load(Relaxed);
        let registrant = Registrant {
            pid: slot.pid.load(Relaxed),
            start: slot.process_start.load(Relaxed),
            clock_id: slot.clock_id.load(Relaxed),
            tag: flags >> PROCESS_TAG_SHIFT,
        };
        let grouped = flags & FLAG_PROXY == 0 && registrant.start != 0;
        if grouped && self.locks.alive.contains(&registrant) {
            return false;
        }
        let dropped = self.test_lock(index, generation);
        if grouped && !dropped {
            self.locks.alive.insert(registrant);
        }
        dropped
    }

    /// [`Reaper::process_exited`] for a registration seen before this scan,
    /// from the scan's snapshot of every held lock when it has one (a lock
    /// taken after the snapshot belongs to a registration first seen later,
    /// which is tested on its own).
    pub(super) fn test_lock(&mut self, index: u32, generation: u32) -> bool {
        self.locks.tested += 1;
        if self.locks.snapshot.is_none() && self.locks.use_snapshot {
            self.locks.use_snapshot = false;
            self.locks.snapshot =
                self.role.lock.as_ref().and_then(|file| {
                    lock::held_in(file, lock::SLOT_LOCKS..lock::SLOT_LOCKS << 1).ok()
                });
        }
        match &self.locks.snapshot {
            Some(held) => !held.contains(&lock::registration_lock(index, generation)),
            None => self.process_exited(index, generation),
        }
    }

    /// Whether the kernel has dropped the registration's exit-detection
    /// lock: its owner's process (every process sharing the owner's file
    /// description) is gone. Heap tables have no such lock.
    pub(super) fn process_exited(&self, index: u32, generation: u32) -> bool {
        match &self.role.lock {
            Some(file) => matches!(
                lock::held_by_other(file, lock::registration_lock(index, generation)),
                Ok(false)
            ),
            None => false,
        }
    }

    /// A slot left `CLAIMING` by a registrant that died mid-claim: nobody
    /// holds the registration lock, so nobody is claiming. Frees it.
    pub(super) fn free_orphaned_claim(&self, slot: &Slot, generation: u32) {
        if let Some(file) = &self.role.lock {
            if matches!(
                lock::held_by_other(file, lock::REGISTRATION_LOCK),
                Ok(false)
            ) && slot.state.load(Acquire) == protocol::state_word(generation, CLAIMING)
            {
                protocol::abandon_claim(slot, generation);
            }
        }
    }
}
