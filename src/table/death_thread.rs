//! A process's death thread: a small library thread, started parked when
//! the process opens a shared table with death words, that owns the
//! process's word among the table's death words (see `death_words.rs`)
//! while the process has registrations there. Its robust list then holds
//! that one word; when the process begins to die (SIGKILL, a crash,
//! `exit`, `exec`), the kernel marks the word `OWNER_DIED` as the thread
//! exits, before the process's memory and files are torn down, and the
//! reaper sees the process dying. A thread of its own, not the one that
//! registered: a registration made from a thread that then ends must not
//! be reported dying.
//!
//! Started at open, not at the first registration, so that registering
//! never waits for a thread to start (most of what a first registration
//! would cost): the first registration wakes the thread and goes on; the
//! thread claims a free word and records it for every registration made so
//! far that still holds its slot (one that ended, however it ended, and
//! whose slot another process may hold now, is left out), and later ones
//! record it themselves. A death before that is seen
//! when it has ended, as before. The last deregistration gives the word
//! back and the thread sleeps again, holding nothing, until the next
//! registration or until the table's memory is dropped (its last handle
//! closed), when it ends. The list is edited under the table memory's
//! lock, with `list_op_pending` naming the entry while the word is taken
//! or given back, so a death in the middle of an edit is still reported. A
//! forked child inherits no death thread (the kernel gives it none, and
//! its copy of the listing is ignored; its first registration starts one),
//! so it never marks its parent's word. Where the kernel or a seccomp
//! profile refuses `set_robust_list`, or every word is taken, the
//! registrations have no death word. `LIVEREG_NO_DEATH_THREAD=1` turns it
//! off.

use crate::os::fork;
use crate::os::robust::{self, RobustList};
use crate::sync::Ordering::{Acquire, Relaxed, Release};
use crate::table::death_protocol;
use crate::table::death_words::{DeathWords, Lifeline, Listing};
use crate::table::memory::TableMemory;
use crate::table::protocol::{self, CLAIMING, LIVE};
use std::sync::{Arc, MutexGuard, Weak};
use std::thread::Thread;

/// The environment variable that turns death threads off (`1`).
pub(crate) const OFF_ENV: &str = "LIVEREG_NO_DEATH_THREAD";

/// The death thread's stack: it makes two system calls and waits.
const DEATH_THREAD_STACK: usize = 64 * 1024;

fn listing(memory: &TableMemory) -> MutexGuard<'_, Option<Listing>> {
    memory
        .death_listing
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Starts `memory`'s death thread for this process, parked and holding no
/// word, if the table has death words and they are not turned off.
pub(crate) fn start_parked(memory: &Arc<TableMemory>) {
    if memory.death_words.is_none() {
        return;
    }
    let mut held = listing(memory);
    if held.is_none() {
        *held = start_listing(memory, fork::install());
    }
}

/// A listing counting no registration, its thread started; `None` where
/// death threads are off or the thread cannot start.
fn start_listing(memory: &Arc<TableMemory>, epoch: u64) -> Option<Listing> {
    if std::env::var_os(OFF_ENV).is_some_and(|v| v == "1") {
        return None;
    }
    let lifeline = Lifeline::new();
    let thread = start(Arc::downgrade(memory), lifeline.clone())?;
    Some(Listing {
        epoch,
        word: None,
        registrations: 0,
        waiting: Vec::new(),
        lifeline,
        thread,
    })
}

/// Counts slot `index`'s registration of `generation` under this process's
/// word in `memory`'s death words (recorded now, or once the thread has
/// claimed the word), waking the thread to claim one with the process's
/// first registration (starting it in a forked child, which has none).
/// Returns whether it is counted (then [`leave`] it once it has ended):
/// not where the table has no death words or they are off.
pub(crate) fn enlist(memory: &Arc<TableMemory>, index: u32, generation: u32) -> bool {
    let Some(words) = memory.death_words() else {
        return false;
    };
    let mut held = listing(memory);
    let epoch = fork::install();
    if held.as_ref().is_some_and(|held| held.epoch != epoch) {
        // A forked child's copy: the thread and the word are the parent's.
        std::mem::forget(held.take());
        *held = start_listing(memory, epoch);
    }
    let Some(listing) = held.as_mut() else {
        return false;
    };
    listing.registrations += 1;
    match listing.word {
        Some(word) => record(words, word, index, generation),
        None if !listing.lifeline.refused.load(Relaxed) => {
            listing.waiting.push((index, generation));
            // Parked, or not yet claimed: there is a word to claim. Woken
            // once the lock is let go, which its claim takes.
            let thread = listing.thread.clone();
            drop(held);
            thread.unpark();
        }
        None => {}
    }
    true
}

/// Whether this process counts registrations under a word of `memory`'s.
pub(crate) fn is_listed(memory: &TableMemory) -> bool {
    memory.death_words.is_some()
        && listing(memory)
            .as_ref()
            .is_some_and(|held| held.epoch == fork::epoch() && held.registrations > 0)
}

/// Counts slot `index`'s registration of `generation` out (it has ended: a
/// word claimed from now on is not recorded for it); with the last, gives
/// the word back (the thread lingers with an empty list). A forked child's
/// call leaves the parent's alone.
pub(crate) fn leave(memory: &TableMemory, index: u32, generation: u32) {
    if memory.death_words.is_none() {
        return;
    }
    let mut held = listing(memory);
    let Some(listing) = held.as_mut().filter(|held| held.epoch == fork::epoch()) else {
        return;
    };
    listing.registrations = listing.registrations.saturating_sub(1);
    listing.waiting.retain(|&waiting| waiting != (index, generation));
    if listing.registrations > 0 {
        return;
    }
    listing.waiting.clear();
    let Some(word) = listing.word.take() else {
        return;
    };
    // A file truncated under this handle is not touched: the word stays,
    // and the list is emptied all the same, so the thread marks nothing.
    let list = &listing.lifeline.list;
    let process = memory.death_words().map(|words| words.process(word));
    list.list_op_pending.store(list.entry(), Release);
    list.empty();
    if let Some(process) = process {
        if death_protocol::give_back(&process.word) {
            robust::wake_one(&process.word);
        }
    }
    list.list_op_pending.store(0, Release);
}

/// Slot `index`'s registration of `generation` belongs to word `word`.
fn record(words: &DeathWords, word: u32, index: u32, generation: u32) {
    let record = words.slot(index);
    let owner = owner_value(word, generation);
    death_protocol::record(&record.owner, &record.dying_seen_ns, owner);
}

/// Slot `index`'s registration of `generation`, which waited for the word,
/// belongs to word `word`, if the slot still holds it: one evicted and
/// released before the claim may hold another process's registration now,
/// whose record stays. (A table truncated under this handle is not read:
/// nothing is recorded.)
fn record_waiting(memory: &TableMemory, words: &DeathWords, word: u32, index: u32, generation: u32) {
    let record = words.slot(index);
    let owner = owner_value(word, generation);
    death_protocol::record_if_held(&record.owner, &record.dying_seen_ns, owner, || {
        if memory.check_size().is_err() {
            return false;
        }
        let state = memory.slot(index).state.load(Acquire);
        matches!(protocol::split_state(state), (g, CLAIMING | LIVE) if g == generation)
    });
}

/// A slot record's `owner`: word `word`'s registration of `generation`.
fn owner_value(word: u32, generation: u32) -> u64 {
    u64::from(word + 1) << 32 | u64::from(generation)
}

/// Starts a death thread on `lifeline`'s list. Each time it is woken it
/// claims a word if registrations wait for one; it ends once the lifeline
/// is ended (or the table memory is gone).
fn start(memory: Weak<TableMemory>, lifeline: Arc<Lifeline>) -> Option<Thread> {
    let spawned = std::thread::Builder::new()
        .name("livereg-death".into())
        .stack_size(DEATH_THREAD_STACK)
        .spawn(move || {
            // SAFETY:
            // - this thread holds `lifeline` until it has switched to the
            //   process's empty list below, so the list outlives its use;
            // - the list is well formed: empty, or its one entry.
            if unsafe { robust::set_robust_list(&lifeline.list) }.is_err() {
                lifeline.refused.store(true, Release);
                return;
            }
            // Parked, allocating nothing, between claims.
            while !lifeline.ended.load(Acquire) {
                match memory.upgrade() {
                    Some(memory) => claim(&memory, &lifeline),
                    None => break,
                }
                std::thread::park();
            }
            // SAFETY: `empty_list` is a leaked, empty list that lives for the
            // whole process.
            let _ = unsafe { robust::set_robust_list(empty_list()) };
            drop(lifeline);
        })
        .ok()?;
    Some(spawned.thread().clone())
}

/// On the death thread: claims a free word for this thread, if
/// registrations wait for one, and records it for them.
fn claim(memory: &TableMemory, lifeline: &Arc<Lifeline>) {
    let mut held = listing(memory);
    let (Some(listing), Some(words)) = (held.as_mut(), memory.death_words()) else {
        return;
    };
    #[cfg(test)]
    if lifeline.hold_claims.load(Acquire) {
        return;
    }
    if !Arc::ptr_eq(&listing.lifeline, lifeline)
        || listing.word.is_some()
        || listing.waiting.is_empty()
    {
        return;
    }
    let list = &lifeline.list;
    let thread_id = robust::thread_id();
    for index in 0..words.capacity() {
        let process = words.process(index);
        if process.word.load(Relaxed) != 0 {
            continue;
        }
        // Named pending before the word is taken: a death from here on
        // marks it (the kernel reads the entry at `list_op_pending`).
        let offset = process.word.as_ptr() as isize - list.entry() as isize;
        list.futex_offset.store(offset, Release);
        list.list_op_pending.store(list.entry(), Release);
        if !death_protocol::claim(&process.word, thread_id) {
            list.list_op_pending.store(0, Release);
            continue;
        }
        process.pid.store(std::process::id(), Relaxed);
        list.entry.store(list.head(), Release);
        list.next.store(list.entry(), Release);
        list.list_op_pending.store(0, Release);
        listing.word = Some(index);
        for (slot, generation) in listing.waiting.drain(..) {
            record_waiting(memory, words, index, slot, generation);
        }
        // So the reaper's death watch waits on the word from now on.
        memory.wake_reaper();
        return;
    }
    // Every word is taken: these registrations have none (the next
    // registration wakes the thread to look again).
    listing.waiting.clear();
}

/// One empty robust list for the whole process, which a death thread
/// switches to before its own list's memory is freed.
fn empty_list() -> &'static RobustList {
    static EMPTY: std::sync::OnceLock<&'static RobustList> = std::sync::OnceLock::new();
    EMPTY.get_or_init(|| Box::leak(RobustList::new()))
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::listing;
    use crate::event::Reason;
    use crate::table::death_protocol::OWNER_DIED;
    use crate::table::protocol;
    use crate::Table;
    use crate::table::options::TableOptions;
    use crate::RegistrationState;
    use std::sync::atomic::Ordering::SeqCst;
    use std::time::{Duration, Instant};

    use crate::unit_tables::Named;

    /// Holds `table`'s death thread from claiming (`true`), or lets it go
    /// and wakes it.
    fn hold_claims(table: &Table, hold: bool) {
        let held = listing(&table.memory);
        let listing = held.as_ref().expect("a death thread");
        listing.lifeline.hold_claims.store(hold, SeqCst);
        listing.thread.unpark();
    }

    /// Waits until `table`'s death thread holds a word; returns it.
    fn claimed_word(table: &Table) -> u32 {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(word) = listing(&table.memory).as_ref().and_then(|l| l.word) {
                return word;
            }
            assert!(Instant::now() < deadline, "the death thread never claimed");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Instance `id`'s registration as `table`'s status shows it.
    fn shown(table: &Table, id: u64) -> crate::RegistrationStatus {
        let status = table.status().unwrap();
        let found = status.registrations.into_iter().find(|r| r.instance_id == id);
        found.expect("registered")
    }

    /// Registers two instances in a first opening of a table whose death
    /// thread claims nothing yet, ends the first in slot 0 with `end`, has
    /// a reaper drop it (slot 0 free again) and a second opening (its own
    /// death thread: another process, as the words see it) register in
    /// slot 0; then lets the first thread claim its word. The slot's next
    /// owner keeps its record: its process's death is seen as it begins.
    fn claim_after_the_end_and_reuse(case: &str, end: impl FnOnce(&Table, crate::Worker)) {
        let name = Named(format!("livereg-unit-claim-{case}-{}", std::process::id()));
        let first = Table::create(&name.0, &TableOptions::default()).unwrap();
        let second = Table::open(&name.0).unwrap();
        hold_claims(&first, true);
        let ended = first.register(1, "ended").unwrap();
        let _stays = first.register(2, "stays").unwrap();
        assert_eq!(ended.slot(), 0);
        end(&first, ended);
        let mut reaper = first.reaper().build().unwrap();
        reaper.scan().unwrap(); // its drop: slot 0 is free again
        let next = second.register(3, "next").unwrap();
        assert_eq!(next.slot(), 0, "the ended registration's slot, reused");
        let word = claimed_word(&second);
        assert!(shown(&first, 3).death_word);
        // The first process's thread claims its word now, after the end
        // and the reuse.
        hold_claims(&first, false);
        assert_ne!(claimed_word(&first), word);
        assert!(shown(&first, 2).death_word);
        assert!(shown(&first, 3).death_word, "the next owner's record taken");
        // The next owner's process begins to die (forged: it lives).
        let words = first.memory.death_words().unwrap();
        words.process(word).word.fetch_or(OWNER_DIED, SeqCst);
        assert_eq!(shown(&first, 3).state, RegistrationState::Dying);
        assert_eq!(shown(&first, 2).state, RegistrationState::Live);
        words.process(word).word.fetch_and(!OWNER_DIED, SeqCst);
        drop((next, reaper));
    }

    #[test]
    #[cfg_attr(miri, ignore)] // a shared table: Miri's isolation has no /dev/shm
    fn a_registration_deregistered_before_its_word_was_claimed_never_takes_its_slots_next_owners_record(
    ) {
        claim_after_the_end_and_reuse("deregistered", |_, ended| ended.deregister().unwrap());
    }

    #[test]
    #[cfg_attr(miri, ignore)] // a shared table: Miri's isolation has no /dev/shm
    fn a_registration_evicted_before_its_word_was_claimed_never_takes_its_slots_next_owners_record()
    {
        claim_after_the_end_and_reuse("evicted", |table, ended| {
            // Ended as a reaper ends it: its handle has not heard (it still
            // counts under the process's word).
            let slot = table.memory.slot(ended.slot());
            protocol::end(slot, ended.generation(), Reason::Cleared).unwrap();
            std::mem::forget(ended);
        });
    }
}
