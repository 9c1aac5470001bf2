//! The death word's protocol, each step one atomic operation on the word
//! (also compiled into the loom models, which check it): a process claims a
//! free word with its death thread's id and gives it back (waking a reaper
//! that waits); a reaper marks its wait (`WAITERS`, so the kernel wakes it
//! when it marks the word), reports a registration dying once, and frees a
//! word whose process has died. The kernel's own step at the owner's exit,
//! [`kernel_marks`], is modelled here for the checks.

use crate::sync::Ordering::{AcqRel, Acquire, Relaxed};
use crate::sync::{AtomicU32, AtomicU64};

/// The word's bit saying someone waits on it (the kernel wakes one).
pub(crate) const WAITERS: u32 = 0x8000_0000;
/// The word's bit the kernel sets when its owner thread exited.
pub(crate) const OWNER_DIED: u32 = 0x4000_0000;
/// The bits holding the owner thread's id.
pub(crate) const TID_MASK: u32 = !(WAITERS | OWNER_DIED);

/// Takes a free word for thread `tid`.
pub(crate) fn claim(word: &AtomicU32, tid: u32) -> bool {
    word.compare_exchange(0, tid, AcqRel, Relaxed).is_ok()
}

/// Gives the word back; whether a reaper waits on it (then wake it).
pub(crate) fn give_back(word: &AtomicU32) -> bool {
    word.swap(0, AcqRel) & WAITERS != 0
}

/// Marks a reaper's wait on a live word: the value to wait on, or `None`
/// when the word is free, marked, or changed under the call (look again).
pub(crate) fn wait_on(word: &AtomicU32) -> Option<u32> {
    let value = word.load(Acquire);
    if value & TID_MASK == 0 || value & OWNER_DIED != 0 {
        return None;
    }
    let waiting = value | WAITERS;
    match value == waiting {
        true => Some(waiting),
        false => word
            .compare_exchange(value, waiting, AcqRel, Relaxed)
            .ok()
            .map(|_| waiting),
    }
}

/// Whether the kernel marked the word: its process began to die.
pub(crate) fn is_marked(word: &AtomicU32) -> bool {
    word.load(Acquire) & OWNER_DIED != 0
}

/// Frees a word the kernel marked (its process has died and none of its
/// registrations is live): the next process may claim it.
pub(crate) fn free_if_marked(word: &AtomicU32) {
    let value = word.load(Acquire);
    if value & OWNER_DIED != 0 {
        let _ = word.compare_exchange(value, 0, AcqRel, Relaxed);
    }
}

/// Records a registration in its slot's record (`owner`, `seen`) while the
/// slot is its own (claimed, not yet published): the next reaper to read
/// `owner` sees `seen` cleared. Swaps rather than stores, so that a late
/// [`record_if_held`] of the slot's previous registration is ordered
/// wholly before or after it, as read-modify-writes of one word are.
pub(crate) fn record(owner: &AtomicU64, seen: &AtomicU64, value: u64) {
    seen.swap(0, AcqRel);
    owner.swap(value, AcqRel);
}

/// Records a registration that waited for its process's word, if its slot
/// still `holds` it (looked at after the record is read) and no other
/// registration's record was written since: a claim that comes after the
/// registration ended and its slot was taken again never overwrites the
/// next owner's record (nor clears when it was reported dying). Whether it
/// was written.
pub(crate) fn record_if_held(
    owner: &AtomicU64,
    seen: &AtomicU64,
    value: u64,
    holds: impl FnOnce() -> bool,
) -> bool {
    let (before, seen_before) = (owner.load(Acquire), seen.load(Acquire));
    if !holds() {
        return false;
    }
    seen.compare_exchange(seen_before, 0, AcqRel, Relaxed)
        .is_ok()
        && owner
            .compare_exchange(before, value, AcqRel, Relaxed)
            .is_ok()
}

/// Reports a registration dying, once across every reaper: whether this
/// call is the one (`seen`, the slot record's word, becomes `now_ns`).
pub(crate) fn report_once(seen: &AtomicU64, now_ns: u64) -> bool {
    seen.compare_exchange(0, now_ns.max(1), AcqRel, Relaxed)
        .is_ok()
}

/// What the kernel does to a robust word at the exit of thread `tid`
/// (`handle_futex_death`): marks it if `tid` owns it, keeping `WAITERS`;
/// whether a waiter is to be woken.
#[cfg(any(test, loom))]
pub(crate) fn kernel_marks(word: &AtomicU32, tid: u32) -> bool {
    let mut value = word.load(Acquire);
    loop {
        if value & TID_MASK != tid {
            return false;
        }
        let marked = (value & WAITERS) | OWNER_DIED;
        match word.compare_exchange(value, marked, AcqRel, Acquire) {
            Ok(_) => return marked & WAITERS != 0,
            Err(now) => value = now,
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_word_lives_from_claim_to_give_back_or_to_its_marking_and_freeing() {
        let word = AtomicU32::new(0);
        assert!(claim(&word, 7) && !claim(&word, 8), "one owner");
        assert_eq!(wait_on(&word), Some(7 | WAITERS));
        assert_eq!(wait_on(&word), Some(7 | WAITERS), "already waited on");
        assert!(!kernel_marks(&word, 8), "another thread's exit");
        assert!(!is_marked(&word));
        assert!(give_back(&word), "a waiter to wake");
        assert_eq!(wait_on(&word), None, "free");
        assert!(claim(&word, 9));
        assert_eq!(wait_on(&word), Some(9 | WAITERS));
        assert!(kernel_marks(&word, 9), "the waiter is woken");
        assert!(is_marked(&word) && wait_on(&word).is_none());
        free_if_marked(&word);
        assert_eq!(word.load(Acquire), 0);
        free_if_marked(&word);
        assert!(claim(&word, 10), "free for the next process");
    }

    #[test]
    fn a_waiting_registration_is_recorded_only_while_its_slot_holds_it() {
        let (owner, seen) = (AtomicU64::new(3 << 32 | 7), AtomicU64::new(5));
        assert!(!record_if_held(&owner, &seen, 1 << 32 | 8, || false));
        assert_eq!((owner.load(Acquire), seen.load(Acquire)), (3 << 32 | 7, 5));
        assert!(record_if_held(&owner, &seen, 1 << 32 | 8, || true));
        assert_eq!((owner.load(Acquire), seen.load(Acquire)), (1 << 32 | 8, 0));
        // Another record written between the look and the write wins.
        assert!(!record_if_held(&owner, &seen, 1 << 32 | 8, || {
            record(&owner, &seen, 2 << 32 | 9);
            true
        }));
        assert_eq!(owner.load(Acquire), 2 << 32 | 9);
    }

    #[test]
    fn a_dying_registration_is_reported_once() {
        let seen = AtomicU64::new(0);
        assert!(report_once(&seen, 0), "at time 0 too");
        assert!(!report_once(&seen, 5));
        assert_eq!(seen.load(Acquire), 1);
    }
}
