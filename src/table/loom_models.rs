//! The slot protocol, model-checked with loom: threads stand for processes,
//! slots live in ordinary memory, and every interleaving is explored.
//!
//! Run by `.ci/loom` (`RUSTFLAGS="--cfg loom" cargo test --release --lib loom`).
//! Invariants asserted throughout: a slot has at most one owner; each
//! registration ends exactly once; a stale handle never changes another
//! registration; no heartbeat is silently lost.

use crate::event::Reason;
use crate::sync::Ordering::{Acquire, Relaxed};
use crate::table::layout::Slot;
use crate::table::protocol::{self, Beat, Gone, SlotFields, Stamp, FREE, LIVE};
use loom::sync::{Arc, Mutex};
use loom::thread;

fn fields(instance_id: u64) -> SlotFields<'static> {
    SlotFields {
        instance_id,
        label: "w",
        pid: 1,
        process_start: 0,
        registered_ns: 1_000,
        clock_id: 1,
        flags: 0,
    }
}

/// A slot published for instance 1 and beaten at 2 µs; returns its generation.
fn live(slot: &Slot) -> u32 {
    let generation = protocol::try_claim(slot).expect("free");
    protocol::publish(slot, generation, &fields(1));
    protocol::beat(slot, generation, 2_000).unwrap();
    generation
}

fn beat_state(slot: &Slot) -> Beat {
    protocol::decode_beat(slot.beat.load(Acquire))
}

#[test]
fn heartbeat_racing_eviction_is_counted_or_refused() {
    loom::model(|| {
        let slot = Arc::new(Slot::new());
        let generation = live(&slot);
        let worker = {
            let slot = slot.clone();
            thread::spawn(move || protocol::beat(&slot, generation, 9_000))
        };
        // The reaper judged the word it read stale, and evicts on it.
        let judged = slot.beat.load(Acquire);
        let evicted = protocol::evict(&slot, generation, judged, Reason::Timeout);
        let beat = worker.join().unwrap();
        match (beat, evicted) {
            (Ok(()), Err(_)) => assert_eq!(beat_state(&slot), Beat::At(Stamp::of(9_000))),
            (Err(Gone::Ended(Some(Reason::Timeout))), Ok(())) => {
                assert_eq!(beat_state(&slot), Beat::Ended(Some(Reason::Timeout)))
            }
            // The reaper read the word after the beat: its verdict was made on
            // the new word, and the eviction of a fresh beat is the reaper's
            // choice, reported to the worker on its next beat.
            (Ok(()), Ok(())) => {
                assert_eq!(protocol::decode_beat(judged), Beat::At(Stamp::of(9_000)))
            }
            other => panic!("heartbeat lost or misapplied: {other:?}"),
        }
    });
}

#[test]
fn two_registrants_racing_for_the_last_slot_get_one_slot() {
    loom::model(|| {
        let slot = Arc::new(Slot::new());
        let other = {
            let slot = slot.clone();
            thread::spawn(move || protocol::try_claim(&slot))
        };
        let mine = protocol::try_claim(&slot);
        let theirs = other.join().unwrap();
        assert!(
            mine.is_some() != theirs.is_some(),
            "owners: {mine:?} {theirs:?}"
        );
    });
}

#[test]
fn two_registrations_of_one_id_have_one_winner() {
    // Uniqueness is checked and claimed under the registration lock (a mutex
    // in-process, a kernel lock across processes): find, then claim.
    loom::model(|| {
        let slots = Arc::new([Slot::new(), Slot::new()]);
        let lock = Arc::new(Mutex::new(()));
        let register = |slots: Arc<[Slot; 2]>, lock: Arc<Mutex<()>>| {
            let _guard = lock.lock().unwrap();
            let taken = slots.iter().any(|s| {
                protocol::split_state(s.state.load(Acquire)).1 == LIVE
                    && s.instance_id.load(Relaxed) == 7
            });
            if taken {
                return false;
            }
            let slot = slots
                .iter()
                .find_map(|s| protocol::try_claim(s).map(|g| (s, g)));
            let (slot, generation) = slot.expect("a free slot");
            protocol::publish(slot, generation, &fields(7));
            true
        };
        let other = {
            let (slots, lock) = (slots.clone(), lock.clone());
            thread::spawn(move || register(slots, lock))
        };
        let mine = register(slots.clone(), lock);
        let theirs = other.join().unwrap();
        assert!(mine != theirs, "winners: {mine} {theirs}");
    });
}

#[test]
fn deregistration_racing_eviction_ends_the_registration_once() {
    loom::model(|| {
        let slot = Arc::new(Slot::new());
        let generation = live(&slot);
        let judged = slot.beat.load(Acquire);
        let worker = {
            let slot = slot.clone();
            thread::spawn(move || protocol::end(&slot, generation, Reason::Deregistered))
        };
        let evicted = protocol::evict(&slot, generation, judged, Reason::Timeout);
        let deregistered = worker.join().unwrap();
        assert!(
            evicted.is_ok() != deregistered.is_ok(),
            "{evicted:?} {deregistered:?}"
        );
        let expected = if evicted.is_ok() {
            Reason::Timeout
        } else {
            Reason::Deregistered
        };
        assert_eq!(beat_state(&slot), Beat::Ended(Some(expected)));
    });
}

#[test]
fn stale_handle_never_touches_the_slot_s_next_owner() {
    loom::model(|| {
        let slot = Arc::new(Slot::new());
        let old = live(&slot);
        protocol::evict(&slot, old, slot.beat.load(Acquire), Reason::Timeout).unwrap();
        let stale = {
            let slot = slot.clone();
            thread::spawn(move || {
                (
                    protocol::beat(&slot, old, 50_000),
                    protocol::end(&slot, old, Reason::Deregistered),
                )
            })
        };
        // The reaper frees the slot; a new owner claims and publishes it.
        assert!(protocol::release(&slot, old));
        let new = protocol::try_claim(&slot).unwrap();
        protocol::publish(&slot, new, &fields(2));
        let (beat, end) = stale.join().unwrap();
        assert!(beat.is_err() && end.is_err(), "{beat:?} {end:?}");
        assert_ne!(new, old);
        assert!(protocol::beat_matches(slot.beat.load(Acquire), new));
        assert_eq!(
            beat_state(&slot),
            Beat::Never,
            "the stale handle changed the new owner"
        );
    });
}

#[test]
fn clear_heartbeat_and_registration_interleave_safely() {
    loom::model(|| {
        let slots = Arc::new([Slot::new(), Slot::new()]);
        let generation = live(&slots[0]);
        let beater = {
            let slots = slots.clone();
            thread::spawn(move || protocol::beat(&slots[0], generation, 9_000))
        };
        let registrant = {
            let slots = slots.clone();
            thread::spawn(move || {
                let g = protocol::try_claim(&slots[1]).unwrap();
                protocol::publish(&slots[1], g, &fields(2));
                g
            })
        };
        // The reaper's clear: end every LIVE registration.
        let mut cleared = 0;
        for slot in slots.iter() {
            let (g, phase) = protocol::split_state(slot.state.load(Acquire));
            if phase == LIVE && protocol::end(slot, g, Reason::Cleared).is_ok() {
                cleared += 1;
            }
        }
        let beat = beater.join().unwrap();
        let new = registrant.join().unwrap();
        assert_eq!(beat_state(&slots[0]), Beat::Ended(Some(Reason::Cleared)));
        if beat.is_err() {
            assert_eq!(beat, Err(Gone::Ended(Some(Reason::Cleared))));
        }
        // The new registration is either cleared whole or untouched.
        match beat_state(&slots[1]) {
            Beat::Ended(Some(Reason::Cleared)) => assert_eq!(cleared, 2),
            Beat::Never => assert_eq!(cleared, 1),
            other => panic!("registration half-cleared: {other:?}"),
        }
        assert!(protocol::beat_matches(slots[1].beat.load(Acquire), new));
    });
}

#[test]
fn crashed_registrant_and_crashed_reaper_leave_recoverable_slots() {
    loom::model(|| {
        let slot = Arc::new(Slot::new());
        // A registrant claims and dies before publishing (its thread stops).
        let crashed = {
            let slot = slot.clone();
            thread::spawn(move || protocol::try_claim(&slot).unwrap())
        };
        let generation = crashed.join().unwrap();
        // The reaper frees the orphaned claim; two reapers (one resumed after
        // a crash mid-drop) could race to free a slot: only one succeeds.
        let racer = {
            let slot = slot.clone();
            thread::spawn(move || protocol::abandon_claim(&slot, generation))
        };
        let mine = protocol::abandon_claim(&slot, generation);
        assert!(mine != racer.join().unwrap(), "freed twice or never");
        assert_eq!(
            protocol::split_state(slot.state.load(Acquire)),
            (generation + 1, FREE)
        );
        let next = live(&slot);
        protocol::end(&slot, next, Reason::Deregistered).unwrap();
        let reaper = {
            let slot = slot.clone();
            thread::spawn(move || protocol::release(&slot, next))
        };
        let released = protocol::release(&slot, next);
        assert!(
            released != reaper.join().unwrap(),
            "released twice or never"
        );
        assert_eq!(protocol::try_claim(&slot), Some(next + 1));
    });
}

#[test]
fn an_id_registers_again_only_after_its_drop_handlers_returned() {
    // Slot 0 holds instance 1, ended and awaiting its drop. The reaper's
    // handler frees what the server held for it, then releases the slot; a
    // registrant of the same id waits for the release (an id never comes back before its drop) and must
    // then see everything the handler did.
    loom::model(|| {
        let old = Arc::new(Slot::new());
        let generation = live(&old);
        protocol::end(&old, generation, Reason::Deregistered).unwrap();
        let freed = Arc::new(loom::sync::atomic::AtomicBool::new(false));
        let reaper = {
            let (old, freed) = (old.clone(), freed.clone());
            thread::spawn(move || {
                freed.store(true, Relaxed); // the handler's work
                assert!(protocol::release(&old, generation));
            })
        };
        // The registrant: a pending drop of its id blocks it (bounded here).
        let mut released = false;
        for _ in 0..2 {
            if old.state.load(Acquire) != protocol::state_word(generation, LIVE) {
                released = true;
                break;
            }
            thread::yield_now();
        }
        if released {
            assert!(
                freed.load(Relaxed),
                "registered again before the old drop's handlers finished"
            );
            let fresh = Slot::new();
            let g = protocol::try_claim(&fresh).unwrap();
            protocol::publish(&fresh, g, &fields(1));
        }
        reaper.join().unwrap();
    });
}

#[test]
fn a_heartbeat_across_the_stamp_wrap_races_eviction_safely() {
    // The last beat was stamped just before the stamp period wraps; the next
    // one just after it. Either the beat lands (the reaper's verdict fails,
    // the word changed) or the worker hears it was evicted.
    loom::model(|| {
        let slot = Arc::new(Slot::new());
        let generation = protocol::try_claim(&slot).expect("free");
        protocol::publish(&slot, generation, &fields(1));
        let period_ns = protocol::STAMP_PERIOD_US * 1_000;
        protocol::beat(&slot, generation, period_ns - 1_000).unwrap();
        let judged = slot.beat.load(Acquire);
        let worker = {
            let slot = slot.clone();
            thread::spawn(move || protocol::beat(&slot, generation, period_ns + 5_000))
        };
        let evicted = protocol::evict(&slot, generation, judged, Reason::Timeout);
        match (worker.join().unwrap(), evicted) {
            (Ok(()), Err(_)) => {
                assert_ne!(slot.beat.load(Acquire), judged, "the wrapped beat froze");
                assert_eq!(beat_state(&slot), Beat::At(Stamp::of(period_ns + 5_000)));
            }
            (Err(Gone::Ended(Some(Reason::Timeout))), Ok(())) => {}
            other => panic!("heartbeat lost or misapplied: {other:?}"),
        }
    });
}

#[test]
fn an_info_reader_never_sees_a_torn_value() {
    use crate::sync::AtomicU64;
    use crate::table::info;
    // Two words stand for the area: a writer replaces "AAAAAAAA"x2 (16
    // bytes) with "BBBB" (4 bytes) while a reader copies.
    loom::model(|| {
        let area = Arc::new((
            AtomicU64::new(0),
            AtomicU64::new(0),
            [AtomicU64::new(0), AtomicU64::new(0)],
        ));
        info::write(&area.0, &area.1, &area.2, &[b'A'; 16]);
        let writer = {
            let area = area.clone();
            thread::spawn(move || info::write(&area.0, &area.1, &area.2, b"BBBB"))
        };
        if let Ok(bytes) = info::try_read(&area.0, &area.1, &area.2) {
            assert!(bytes == [b'A'; 16] || bytes == b"BBBB", "torn: {bytes:?}");
        }
        writer.join().unwrap();
        assert_eq!(
            info::try_read(&area.0, &area.1, &area.2),
            Ok(b"BBBB".to_vec())
        );
    });
}

#[test]
fn progress_racing_a_stall_verdict_is_counted_or_refused() {
    // The reaper judged the busy word stalled; the worker makes a step at
    // the same time. Either the step lands first (the mark fails: counted)
    // or the mark does (the step is refused: the worker hears Stalled).
    loom::model(|| {
        let slot = Arc::new(Slot::new());
        let generation = live(&slot);
        protocol::set_busy(&slot, generation, true).unwrap();
        let judged = slot.progress.load(Acquire);
        let worker = {
            let slot = slot.clone();
            thread::spawn(move || protocol::progress(&slot, generation))
        };
        let marked = protocol::mark_stalled(&slot, judged);
        if marked {
            protocol::end(&slot, generation, Reason::Stalled).unwrap();
        }
        match (worker.join().unwrap(), marked) {
            (Ok(()), false) => assert_ne!(slot.progress.load(Acquire), judged),
            (Err(Gone::Ended(Some(Reason::Stalled))), true) => {}
            // The step landed after the whole ending: refused by the marker
            // or by the end marker, either way not counted as progress.
            (Err(Gone::Ended(Some(Reason::Stalled))), false) => {
                panic!("refused without a verdict")
            }
            other => panic!("a step was lost or a stall missed: {other:?}"),
        }
    });
}

mod death_word {
    //! The death word's protocol (`death_protocol.rs`): threads stand for a
    //! registering process, its kernel, reapers and the next process.

    use crate::event::Reason;
    use crate::sync::Ordering::Acquire;
    use crate::sync::{AtomicU32, AtomicU64};
    use crate::table::death_protocol::{self, OWNER_DIED, WAITERS};
    use crate::table::layout::Slot;
    use crate::table::protocol::{self, LIVE};
    use loom::sync::Arc;
    use loom::thread;

    const TID: u32 = 5;
    const NEXT: u32 = 9;

    /// A reaper that marked its wait on a word the process then gave back
    /// is always woken (the give-back saw `WAITERS`); the word is never
    /// marked dying, and the next process's claim is its own.
    #[test]
    fn a_word_given_back_under_a_waiting_reaper_wakes_it_and_is_never_marked() {
        loom::model(|| {
            let word = Arc::new(AtomicU32::new(0));
            assert!(death_protocol::claim(&word, TID));
            let reaper_word = word.clone();
            // Waiting on this process's word (not on the next's, which
            // may already hold it).
            let reaper = thread::spawn(move || {
                death_protocol::wait_on(&reaper_word)
                    .is_some_and(|expected| expected & death_protocol::TID_MASK == TID)
            });
            let woke = death_protocol::give_back(&word);
            let next_word = word.clone();
            let next = thread::spawn(move || death_protocol::claim(&next_word, NEXT));
            let waited = reaper.join().unwrap();
            let claimed = next.join().unwrap();
            assert!(!waited || woke, "a waiting reaper left unwoken");
            let value = word.load(Acquire);
            assert_eq!(value & OWNER_DIED, 0, "marked while no process died");
            assert!(claimed && value & !WAITERS == NEXT, "{value:#x}");
        });
    }

    /// The kernel marking the word at the owner's death keeps a reaper's
    /// `WAITERS` (so it wakes the reaper), and a free racing it never frees
    /// a word that was not marked.
    #[test]
    fn a_death_wakes_a_waiting_reaper_and_only_a_marked_word_is_freed() {
        loom::model(|| {
            let word = Arc::new(AtomicU32::new(0));
            assert!(death_protocol::claim(&word, TID));
            let reaper_word = word.clone();
            let reaper = thread::spawn(move || death_protocol::wait_on(&reaper_word).is_some());
            let freeing_word = word.clone();
            let freeing = thread::spawn(move || death_protocol::free_if_marked(&freeing_word));
            let woken = death_protocol::kernel_marks(&word, TID);
            let waited = reaper.join().unwrap();
            freeing.join().unwrap();
            assert!(
                !waited || woken,
                "a waiting reaper the kernel does not wake"
            );
            let value = word.load(Acquire);
            assert!(value == 0 || value & OWNER_DIED != 0, "{value:#x}");
        });
    }

    /// A death thread that claims its word late records a registration
    /// that waited for it while the reaper releases that (ended)
    /// registration's slot, the next process claims the slot, records its
    /// own registration there, and a reaper reports it dying: the next
    /// owner's record and report are what is left.
    #[test]
    fn a_late_record_never_takes_the_record_of_the_slots_next_owner() {
        const LATE: u64 = 1 << 32; // word 0, generation 0
        const STALE: u64 = 3 << 32 | 7; // an older registration's
        loom::model(|| {
            let slot = Arc::new(Slot::new());
            let generation = super::live(&slot);
            protocol::end(&slot, generation, Reason::Deregistered).unwrap();
            let record = Arc::new((AtomicU64::new(STALE), AtomicU64::new(5)));
            let (late_slot, late_record) = (slot.clone(), record.clone());
            let late = thread::spawn(move || {
                let (owner, seen) = &*late_record;
                death_protocol::record_if_held(owner, seen, LATE, || {
                    let state = late_slot.state.load(Acquire);
                    state == protocol::state_word(generation, LIVE)
                })
            });
            assert!(protocol::release(&slot, generation));
            let next = protocol::try_claim(&slot).expect("released");
            let next_owner = 2 << 32 | u64::from(next);
            let (owner, seen) = &*record;
            death_protocol::record(owner, seen, next_owner);
            assert!(death_protocol::report_once(seen, 50));
            late.join().unwrap();
            assert_eq!(owner.load(Acquire), next_owner);
            assert_eq!(seen.load(Acquire), 50);
        });
    }

    /// Two reapers (one taking over from the other) report a dying
    /// registration exactly once.
    #[test]
    fn two_reapers_report_a_dying_registration_once() {
        loom::model(|| {
            let seen = Arc::new(AtomicU64::new(0));
            let other = seen.clone();
            let first = thread::spawn(move || death_protocol::report_once(&other, 10));
            let second = death_protocol::report_once(&seen, 20);
            assert!(first.join().unwrap() ^ second);
        });
    }
}
