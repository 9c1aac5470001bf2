//! What a scan makes of the death words: a live registration whose
//! process's word the kernel marked is reported dying, once across every
//! reaper (the slot's record keeps when it was); a marked word none of
//! whose registrations is live any more is given back for the next process.

use super::role::Reaper;
use super::scan::drop_event;
use crate::event::{DropEvent, Reason};
use crate::session::HeldRegion;
use crate::sync::Ordering::Acquire;
use crate::table::death_protocol;
use crate::table::death_words::DeathWords;
use crate::table::layout::Slot;
use crate::table::protocol;
use std::collections::HashSet;

impl Reaper {
    /// The event of slot `index`'s registration of `generation` if its
    /// process began to die and no reaper reported it yet (it is reported
    /// now); notes a marked process word as one a live registration holds.
    pub(super) fn newly_dying(
        &self,
        index: u32,
        slot: &Slot,
        generation: u32,
        now_ns: u64,
        held: &mut HashSet<u32>,
    ) -> Option<DropEvent> {
        let words = self.death_words()?;
        let (word, process) = words.owner_word_of(index, generation)?;
        if !death_protocol::is_marked(&process.word) {
            return None;
        }
        // (Only marked words are noted: they are the ones to free, once no
        // live registration holds them; a live process costs the scan no
        // more than two loads.)
        held.insert(word);
        death_protocol::report_once(&words.slot(index).dying_seen_ns, now_ns)
            .then(|| dying_event(slot, index, generation))
    }

    /// The event of remote slot `index`'s registration of `generation` if
    /// its client began to die (the death word in the region it beats in
    /// is marked) and this reaper did not report it yet; recorded in the
    /// table's death words too, so that any status reader sees it dying.
    pub(super) fn newly_dying_session(
        &self,
        index: u32,
        slot: &Slot,
        generation: u32,
        now_ns: u64,
        region: Option<&HeldRegion>,
    ) -> Option<DropEvent> {
        if !region.is_some_and(|region| self.sessions.newly_dying(region)) {
            return None;
        }
        if let Some(words) = self.death_words() {
            words.record_session_dying(index, generation, now_ns);
        }
        Some(dying_event(slot, index, generation))
    }

    /// The table's death words, if this scan found them whole.
    fn death_words(&self) -> Option<&DeathWords> {
        self.table
            .memory
            .death_words
            .as_ref()
            .filter(|_| self.death_words_whole)
    }

    /// Whether slot `index`'s registration of `generation` is dying: its
    /// process's word is marked.
    pub(super) fn is_dying(&self, index: u32, generation: u32) -> bool {
        self.death_words()
            .is_some_and(|words| words.is_dying(index, generation))
    }

    /// The process words the kernel has marked, looked at before a sweep:
    /// the ones [`Reaper::free_dead_words`] may give back after it.
    pub(super) fn marked_words(&self) -> Vec<u32> {
        let Some(words) = self.death_words() else {
            return Vec::new();
        };
        (0..words.capacity())
            .filter(|&index| death_protocol::is_marked(&words.process(index).word))
            .collect()
    }

    /// Gives back each word of `marked` (marked before the sweep) that no
    /// live registration holds (`held`): its process has ended and its
    /// drops are done. A word marked during the sweep waits for the next
    /// one: the sweep may have looked at a registration of its process
    /// before the mark, and not noted it.
    pub(super) fn free_dead_words(&self, marked: &[u32], held: &HashSet<u32>) {
        let Some(words) = self.death_words() else {
            return;
        };
        for &index in marked.iter().filter(|index| !held.contains(index)) {
            death_protocol::free_if_marked(&words.process(index).word);
        }
    }
}

/// The event a dying registration's handlers get: the one its drop will
/// carry (reason `ProcessExited`), its last heartbeat as the slot says now.
fn dying_event(slot: &Slot, index: u32, generation: u32) -> DropEvent {
    let beat = protocol::decode_beat(slot.beat.load(Acquire));
    drop_event(slot, index, generation, Reason::ProcessExited, 0, beat)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use crate::table::death_protocol::OWNER_DIED;
    use crate::table::handle::Table;
    use crate::table::options::TableOptions;
    use std::collections::HashSet;
    use std::sync::atomic::Ordering::SeqCst;
    use std::time::{Duration, Instant};

    use crate::unit_tables::Named;

    #[test]
    #[cfg_attr(miri, ignore)] // a shared table: Miri's isolation has no /dev/shm
    fn a_word_marked_during_a_sweep_is_not_given_back_until_the_next() {
        let name = Named::new("dying");
        let table = Table::create(&name.0, &TableOptions::default()).unwrap();
        let _worker = table.register(1, "").unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !table.status().unwrap().registrations[0].death_word {
            assert!(Instant::now() < deadline, "the death thread never claimed");
            std::thread::sleep(Duration::from_millis(1));
        }
        let mut reaper = table.reaper().build().unwrap();
        reaper.death_words_whole = true; // as a scan finds them
        let words = table.memory.death_words().unwrap();
        let word = &words.owner_of(0, 0).expect("recorded").word;
        let before = reaper.marked_words();
        // The kernel's mark, as it lands while the sweep looks elsewhere
        // (forged: this process lives).
        word.fetch_or(OWNER_DIED, SeqCst);
        reaper.free_dead_words(&before, &HashSet::new());
        assert_ne!(word.load(SeqCst), 0, "given back under a live registration");
        reaper.free_dead_words(&reaper.marked_words(), &HashSet::new());
        assert_eq!(word.load(SeqCst), 0, "a word marked before the sweep, held by none");
    }
}
