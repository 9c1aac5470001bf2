//! The slot state machine, over a plain `&Slot` so that `loom` can check it.
//!
//! Two words carry a registration's life:
//!
//! - `state = generation << 32 | phase`, phase one of [`FREE`], [`CLAIMING`],
//!   [`LIVE`]. A registrant claims a free slot with a compare-and-swap
//!   `FREE(g) → CLAIMING(g)`, writes its fields, and publishes `LIVE(g)`. The
//!   reaper releases an ended registration with `LIVE(g) → FREE(g + 1)`, so a
//!   handle from generation `g` never matches the next owner.
//! - `beat = tag << 48 | time`, where `tag` is the generation's low 16 bits and
//!   `time` is a [`Stamp`]: the owner's clock in microseconds (rounded up, so a
//!   slot never looks older than it is) modulo [`STAMP_PERIOD_US`] (plus one,
//!   so never 0), so that every clock value keeps beating; `0` before the first heartbeat, or
//!   `ENDED | reason` once the registration has ended.
//!
//! Every change to whether a registration is alive is one compare-and-swap on
//! `beat`: a heartbeat replaces a time with a later one; the reaper, a
//! deregistration, a clear or a replacement replace the time the reaper judged
//! with an end marker. So a heartbeat that races an eviction either lands first
//! (the reaper's CAS fails: the beat is counted) or finds the marker (the worker
//! is told it was evicted). The tag, plus a check of the full generation in
//! `state`, keeps a stale handle's CAS from landing on a later owner.
//!
//! An ended registration stays `LIVE` with an end marker until the reaper has
//! run its drop handlers and releases it; a reaper that dies in between leaves
//! it so, and the next reaper runs the drop again.

use crate::event::Reason;
use crate::sync::Ordering::{AcqRel, Acquire, Relaxed, Release};
use crate::table::layout::{Slot, BUSY, BUSY_PERIOD, PROGRESS_STEP, STALL_MARK};

/// Phase of a slot nobody holds.
pub(crate) const FREE: u32 = 0;
/// Phase of a slot a registrant is filling in.
pub(crate) const CLAIMING: u32 = 1;
/// Phase of a published registration (possibly ended, awaiting its drop).
pub(crate) const LIVE: u32 = 2;

const TIME_BITS: u32 = 48;
const TIME_MASK: u64 = (1 << TIME_BITS) - 1;
/// Times at or above this are end markers; the low byte is the reason.
const ENDED: u64 = TIME_MASK & !0xFF;
/// Number of distinct stamps (`1..=STAMP_PERIOD_US`), a power of two so that
/// wrapping is a mask: a clock's microseconds wrap around this period (~4.5
/// years), so a stamp is read relative to a nearby time of the same clock
/// ([`Stamp::ns_near`]). Stamps stay below the end markers.
pub(crate) const STAMP_PERIOD_US: u64 = 1 << 47;
const STAMP_MASK: u64 = STAMP_PERIOD_US - 1;
const _: () = assert!(STAMP_PERIOD_US < ENDED);

/// Packs a state word.
pub(crate) fn state_word(generation: u32, phase: u32) -> u64 {
    (u64::from(generation) << 32) | u64::from(phase)
}

/// Splits a state word into `(generation, phase)`.
pub(crate) fn split_state(word: u64) -> (u32, u32) {
    ((word >> 32) as u32, word as u32)
}

fn tag(generation: u32) -> u64 {
    u64::from(generation as u16) << TIME_BITS
}

/// A heartbeat time as a beat word holds it: the owner's clock in
/// microseconds, wrapped into `1..=STAMP_PERIOD_US`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Stamp(u64);

impl Stamp {
    /// The stamp of clock reading `now_ns`, rounded up to the microsecond.
    #[cfg(any(test, loom))]
    pub(crate) fn of(now_ns: u64) -> Stamp {
        Stamp::of_micros(now_ns.div_ceil(1_000))
    }

    /// The stamp of a clock reading already in (rounded-up) microseconds.
    #[inline]
    pub(crate) fn of_micros(micros: u64) -> Stamp {
        Stamp((micros & STAMP_MASK) + 1)
    }

    /// The clock reading, in nanoseconds, that this stamp stands for among
    /// those within half a period (~2.2 years) of `reference_ns`, a reading
    /// of the same clock.
    pub(crate) fn ns_near(self, reference_ns: u64) -> u64 {
        let reference = reference_ns / 1_000;
        let behind = reference.wrapping_sub(self.0 - 1) & STAMP_MASK;
        let micros = if behind <= STAMP_PERIOD_US / 2 {
            reference.saturating_sub(behind)
        } else {
            reference + (STAMP_PERIOD_US - behind)
        };
        micros.saturating_mul(1_000)
    }

    /// Whether this stamp is later than `other` (serial-number order: the
    /// nearer way round the period).
    #[inline]
    fn is_after(self, other: Stamp) -> bool {
        let ahead = self.0.wrapping_sub(other.0) & STAMP_MASK;
        ahead != 0 && ahead < STAMP_PERIOD_US / 2
    }
}

/// What a beat word says about its registration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Beat {
    /// Registered, no heartbeat yet.
    Never,
    /// Last heartbeat at this stamp of the owner's clock.
    At(Stamp),
    /// Ended, for this reason (`None`: a marker no writer of ours produces).
    Ended(Option<Reason>),
}

/// Decodes a beat word.
#[inline]
pub(crate) fn decode_beat(word: u64) -> Beat {
    match word & TIME_MASK {
        0 => Beat::Never,
        t if t >= ENDED => Beat::Ended(Reason::from_code(t as u8)),
        t => Beat::At(Stamp(t)),
    }
}

fn beat_word(generation: u32, stamp: Stamp) -> u64 {
    tag(generation) | stamp.0
}

fn ended_word(generation: u32, reason: Reason) -> u64 {
    tag(generation) | ENDED | reason as u64
}

/// Why an operation through a handle was refused: its registration is over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Gone {
    /// The registration ended for this reason and awaits (or is in) its drop.
    Ended(Option<Reason>),
    /// The slot was released; it may belong to someone else now.
    Reused,
}

/// Claims `slot` if it is free: `FREE(g) → CLAIMING(g)`; returns `g`.
pub(crate) fn try_claim(slot: &Slot) -> Option<u32> {
    let word = slot.state.load(Relaxed);
    let (generation, phase) = split_state(word);
    if phase != FREE {
        return None;
    }
    slot.state
        .compare_exchange(word, state_word(generation, CLAIMING), Acquire, Relaxed)
        .ok()
        .map(|_| generation)
}

/// Gives back a claim without publishing it: `CLAIMING(g) → FREE(g + 1)`.
/// Returns false if the slot was not in that state.
pub(crate) fn abandon_claim(slot: &Slot, generation: u32) -> bool {
    slot.state
        .compare_exchange(
            state_word(generation, CLAIMING),
            state_word(generation.wrapping_add(1), FREE),
            Release,
            Relaxed,
        )
        .is_ok()
}

/// What a registrant writes into its claimed slot.
pub(crate) struct SlotFields<'a> {
    pub instance_id: u64,
    pub label: &'a str,
    pub pid: u32,
    pub process_start: u64,
    pub registered_ns: u64,
    /// Identity of the registrant's clock ([`crate::Clock::identity`]).
    pub clock_id: u64,
    /// Initial [`Slot::flags`].
    pub flags: u32,
}

/// Fills a slot claimed as generation `generation` and publishes it `LIVE`.
pub(crate) fn publish(slot: &Slot, generation: u32, registration: &SlotFields<'_>) {
    slot.instance_id.store(registration.instance_id, Relaxed);
    slot.pid.store(registration.pid, Relaxed);
    slot.process_start
        .store(registration.process_start, Relaxed);
    slot.registered_ns
        .store(registration.registered_ns, Relaxed);
    slot.clock_id.store(registration.clock_id, Relaxed);
    slot.progress.store(0, Relaxed);
    slot.beats.store(0, Relaxed);
    slot.flags.store(registration.flags, Relaxed);
    slot.store_label(registration.label);
    slot.beat.store(tag(generation), Relaxed);
    // Release: a reader that sees LIVE(g) sees every field above.
    slot.state.store(state_word(generation, LIVE), Release);
}

/// Checks that the handle's generation still owns the slot, then replaces
/// the current beat word with `next(current)` by a CAS, retrying (with a new
/// `next`) if the word moved; no CAS when `next` keeps the word.
#[inline]
fn update_beat(slot: &Slot, generation: u32, next: impl Fn(u64) -> u64) -> Result<(), Gone> {
    owned(slot, generation)?;
    let mut current = slot.beat.load(Relaxed);
    loop {
        if !beat_matches(current, generation) {
            return Err(Gone::Reused);
        }
        if let Beat::Ended(reason) = decode_beat(current) {
            return Err(Gone::Ended(reason));
        }
        let wanted = next(current);
        if wanted == current {
            // Nothing to write (a beat within the stamp the word already
            // holds, as coarse stamps are for a tick): the load above is the
            // heartbeat, live at that moment, and an eviction after it judged
            // this very stamp.
            return Ok(());
        }
        // Release on success: pairs with the reaper's acquire of `beat`.
        match slot
            .beat
            .compare_exchange_weak(current, wanted, AcqRel, Relaxed)
        {
            Ok(_) => return Ok(()),
            Err(actual) => current = actual,
        }
    }
}

/// Why a handle of `generation` no longer owns its slot, whose state word is
/// `state`. The reaper releases a slot in the same scan that ends it, so an
/// owner usually finds it already `FREE(g + 1)`; until a next owner publishes,
/// the beat word still holds this generation's end marker, and its reason is
/// the one the owner hears.
fn released(slot: &Slot, generation: u32, state: u64) -> Gone {
    let (now, phase) = split_state(state);
    if now != generation.wrapping_add(1) || phase == LIVE {
        return Gone::Reused;
    }
    // Acquire on `state` above: a claimant's beat store of the next tag, made
    // after its claim, is either seen here or the old marker still stands.
    let word = slot.beat.load(Acquire);
    match decode_beat(word) {
        Beat::Ended(reason) if beat_matches(word, generation) => Gone::Ended(reason),
        _ => Gone::Reused,
    }
}

/// A heartbeat at `now_ns` through a handle of generation `generation`.
#[cfg(any(test, loom))]
pub(crate) fn beat(slot: &Slot, generation: u32, now_ns: u64) -> Result<(), Gone> {
    beat_at(slot, generation, Stamp::of(now_ns))
}

/// [`beat`] with the stamp already made.
#[inline]
pub(crate) fn beat_at(slot: &Slot, generation: u32, stamp: Stamp) -> Result<(), Gone> {
    update_beat(slot, generation, |current| match decode_beat(current) {
        Beat::At(last) if !stamp.is_after(last) => current,
        _ => beat_word(generation, stamp),
    })
}

/// Ends the registration of generation `generation` for `reason`, whatever its
/// last heartbeat (deregistration, clear, replacement). The word it replaces
/// is kept in `final_beat` first, so whoever sees the end marker also sees
/// the last heartbeat.
pub(crate) fn end(slot: &Slot, generation: u32, reason: Reason) -> Result<(), Gone> {
    update_beat(slot, generation, |last| {
        slot.final_beat.store(last, Relaxed);
        ended_word(generation, reason)
    })
}

/// Fails unless the slot still holds the handle's generation, published.
#[inline]
fn owned(slot: &Slot, generation: u32) -> Result<(), Gone> {
    let state = slot.state.load(Acquire);
    if state == state_word(generation, LIVE) {
        Ok(())
    } else {
        Err(released(slot, generation, state))
    }
}

/// Fails if the handle's registration is over (released, reused or ended).
pub(crate) fn still_live(slot: &Slot, generation: u32) -> Result<(), Gone> {
    owned(slot, generation)?;
    let word = slot.beat.load(Acquire);
    if !beat_matches(word, generation) {
        return Err(Gone::Reused);
    }
    match decode_beat(word) {
        Beat::Ended(reason) => Err(Gone::Ended(reason)),
        _ => Ok(()),
    }
}

/// One step of progress through a handle of `generation`: one atomic add.
/// A step that lands after the reaper marked the registration stalled is
/// refused (the worker hears `Stalled`); one that lands before makes the
/// reaper's mark fail: counted. (A handle that is stale by a whole
/// registration adds to the next owner's count at worst; it never ends it.)
///
/// Only the state word is checked first (the hot path stays one load and one
/// add): a registration ended but not yet released still counts the step;
/// its worker hears `Evicted` at its next heartbeat, or here once released.
#[inline]
pub(crate) fn progress(slot: &Slot, generation: u32) -> Result<(), Gone> {
    progress_by(slot, generation, 1)
}

/// `steps` steps of progress at once (a session's listener forwarding what
/// its client counted), as [`progress`].
#[inline]
pub(crate) fn progress_by(slot: &Slot, generation: u32, steps: u64) -> Result<(), Gone> {
    owned(slot, generation)?;
    // AcqRel: pairs with the reaper's mark, a compare-and-swap on this word.
    let before = slot
        .progress
        .fetch_add(steps.wrapping_mul(PROGRESS_STEP), AcqRel);
    stalled(before)
}

/// Marks the registration busy or idle; like [`progress`], refused once the
/// reaper marked it stalled.
///
/// Becoming busy (from idle) also flips [`BUSY_PERIOD`], so the word always
/// changes: a worker that went idle and busy again between two scans would
/// otherwise leave the very word the reaper last saw, and its new busy
/// period would be timed from the old one (a stall declared early). Setting
/// busy while busy changes nothing.
pub(crate) fn set_busy(slot: &Slot, generation: u32, busy: bool) -> Result<(), Gone> {
    still_live(slot, generation)?;
    let before = if busy {
        // AcqRel on success: pairs with the reaper's mark, as in `progress`.
        let become_busy =
            |word: u64| (word & (BUSY | STALL_MARK) == 0).then_some(word ^ BUSY_PERIOD | BUSY);
        match slot.progress.fetch_update(AcqRel, Acquire, become_busy) {
            Ok(before) | Err(before) => before,
        }
    } else {
        slot.progress.fetch_and(!BUSY, AcqRel)
    };
    stalled(before)
}

#[inline]
fn stalled(word: u64) -> Result<(), Gone> {
    if word & STALL_MARK != 0 {
        Err(Gone::Ended(Some(Reason::Stalled)))
    } else {
        Ok(())
    }
}

/// The reaper's stall verdict: marks the progress word only if it is still
/// `judged` (busy, unchanged for the progress timeout). False when a step of
/// progress (or a change to idle) got there first: it counts.
pub(crate) fn mark_stalled(slot: &Slot, judged: u64) -> bool {
    slot.progress
        .compare_exchange(judged, judged | STALL_MARK, AcqRel, Relaxed)
        .is_ok()
}

/// The reaper's eviction: ends the registration only if its beat word is still
/// `judged`, the value the verdict was made on. Returns the word found instead
/// when a heartbeat (or another ending) got there first.
pub(crate) fn evict(slot: &Slot, generation: u32, judged: u64, reason: Reason) -> Result<(), u64> {
    slot.final_beat.store(judged, Relaxed);
    slot.beat
        .compare_exchange(judged, ended_word(generation, reason), AcqRel, Acquire)
        .map(|_| ())
}

/// The last heartbeat of an ended registration, as its ender recorded it.
pub(crate) fn final_beat(slot: &Slot) -> Beat {
    decode_beat(slot.final_beat.load(Acquire))
}

/// Frees an ended registration after its drop: `LIVE(g) → FREE(g + 1)`.
/// Returns false if the slot was not in that state.
pub(crate) fn release(slot: &Slot, generation: u32) -> bool {
    slot.state
        .compare_exchange(
            state_word(generation, LIVE),
            state_word(generation.wrapping_add(1), FREE),
            AcqRel,
            Relaxed,
        )
        .is_ok()
}

/// What a progress word says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Progress {
    /// Whether the worker has work in flight.
    pub busy: bool,
    /// The steps of progress counted.
    pub steps: u64,
}

/// Reads a progress word (`steps << 1 | busy`, beside the busy period and
/// the stall mark).
pub(crate) fn decode_progress(word: u64) -> Progress {
    Progress {
        busy: word & BUSY != 0,
        steps: (word & !(STALL_MARK | BUSY_PERIOD)) / PROGRESS_STEP,
    }
}

/// Whether a beat word belongs to generation `generation`.
pub(crate) fn beat_matches(word: u64, generation: u32) -> bool {
    word & !TIME_MASK == tag(generation)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn slot() -> Box<Slot> {
        // SAFETY:
        // - `Slot` is made only of atomic integers, for which all-zero bytes
        //   are a valid value (a FREE slot of generation 0).
        unsafe { Box::new(std::mem::zeroed()) }
    }

    fn registration() -> SlotFields<'static> {
        SlotFields {
            instance_id: 7,
            label: "gpu0",
            pid: 1,
            process_start: 0,
            registered_ns: 10,
            clock_id: 1,
            flags: 0,
        }
    }

    fn live_slot() -> (Box<Slot>, u32) {
        let slot = slot();
        let generation = try_claim(&slot).expect("a zeroed slot is free");
        publish(&slot, generation, &registration());
        (slot, generation)
    }

    #[test]
    fn claim_takes_a_free_slot_once() {
        let slot = slot();
        assert_eq!(try_claim(&slot), Some(0));
        assert_eq!(try_claim(&slot), None);
    }

    #[test]
    fn published_slot_starts_never_beaten() {
        let (slot, _) = live_slot();
        assert_eq!(decode_beat(slot.beat.load(Relaxed)), Beat::Never);
        assert_eq!(slot.load_label(), "gpu0");
    }

    #[test]
    fn beat_is_rounded_up_to_the_microsecond() {
        let (slot, generation) = live_slot();
        beat(&slot, generation, 1_000_001).unwrap();
        assert_eq!(
            decode_beat(slot.beat.load(Relaxed)),
            Beat::At(Stamp::of(1_001_000))
        );
    }

    #[test]
    fn every_clock_value_keeps_beating_past_the_stamp_period() {
        let (slot, generation) = live_slot();
        let period_ns = STAMP_PERIOD_US * 1_000;
        let mut words = Vec::new();
        // Beats a second apart from just before one period to well past two.
        for second in 0..5 {
            let now = period_ns - 2_000_000_000 + second * 1_000_000_000;
            beat(&slot, generation, now).unwrap();
            words.push(slot.beat.load(Relaxed));
            let Beat::At(stamp) = decode_beat(slot.beat.load(Relaxed)) else {
                panic!("not a beat")
            };
            assert_eq!(stamp.ns_near(now), now.div_ceil(1_000) * 1_000);
        }
        // And at the very end of a 64-bit clock.
        let (slot, generation) = live_slot();
        for back in [3, 2, 1, 0] {
            beat(&slot, generation, u64::MAX - back * 1_000_000_000).unwrap();
            words.push(slot.beat.load(Relaxed));
        }
        words.dedup();
        assert_eq!(words.len(), 9, "every beat changed the word");
    }

    #[test]
    fn a_stamp_reads_back_near_a_reference_either_side() {
        let stamp = Stamp::of(5_000_000_000);
        assert_eq!(stamp.ns_near(4_000_000_000), 5_000_000_000);
        assert_eq!(stamp.ns_near(9_000_000_000), 5_000_000_000);
        assert_eq!(stamp.ns_near(0), 5_000_000_000);
    }

    #[test]
    fn beat_never_moves_time_backwards() {
        let (slot, generation) = live_slot();
        beat(&slot, generation, 5_000).unwrap();
        beat(&slot, generation, 3_000).unwrap();
        assert_eq!(
            decode_beat(slot.beat.load(Relaxed)),
            Beat::At(Stamp::of(5_000))
        );
    }

    #[test]
    fn eviction_on_a_judged_word_wins_over_a_later_beat() {
        let (slot, generation) = live_slot();
        let judged = slot.beat.load(Relaxed);
        evict(&slot, generation, judged, Reason::Timeout).unwrap();
        assert_eq!(
            beat(&slot, generation, 9_000),
            Err(Gone::Ended(Some(Reason::Timeout)))
        );
        assert_eq!(final_beat(&slot), Beat::Never);
    }

    #[test]
    fn ending_keeps_the_last_heartbeat() {
        let (slot, generation) = live_slot();
        beat(&slot, generation, 7_000).unwrap();
        end(&slot, generation, Reason::Deregistered).unwrap();
        assert_eq!(final_beat(&slot), Beat::At(Stamp::of(7_000)));
        assert_eq!(
            decode_beat(slot.beat.load(Relaxed)),
            Beat::Ended(Some(Reason::Deregistered))
        );
    }

    #[test]
    fn beat_before_eviction_makes_the_eviction_fail() {
        let (slot, generation) = live_slot();
        let judged = slot.beat.load(Relaxed);
        beat(&slot, generation, 9_000).unwrap();
        assert!(evict(&slot, generation, judged, Reason::Timeout).is_err());
        assert_eq!(
            decode_beat(slot.beat.load(Relaxed)),
            Beat::At(Stamp::of(9_000))
        );
    }

    #[test]
    fn stale_generation_cannot_touch_the_next_owner() {
        let (slot, old) = live_slot();
        end(&slot, old, Reason::Deregistered).unwrap();
        assert!(release(&slot, old));
        let new = try_claim(&slot).unwrap();
        publish(&slot, new, &registration());
        let before = slot.beat.load(Relaxed);
        assert_eq!(beat(&slot, old, 50_000), Err(Gone::Reused));
        assert_eq!(end(&slot, old, Reason::Deregistered), Err(Gone::Reused));
        assert_eq!(slot.beat.load(Relaxed), before);
    }

    #[test]
    fn a_released_registration_still_reports_why_it_ended() {
        let (slot, generation) = live_slot();
        let judged = slot.beat.load(Relaxed);
        evict(&slot, generation, judged, Reason::Timeout).unwrap();
        assert!(release(&slot, generation));
        assert_eq!(
            beat(&slot, generation, 9_000),
            Err(Gone::Ended(Some(Reason::Timeout)))
        );
        let next = try_claim(&slot).unwrap();
        publish(&slot, next, &registration());
        assert_eq!(beat(&slot, generation, 9_000), Err(Gone::Reused));
    }

    #[test]
    fn release_needs_the_matching_generation() {
        let (slot, generation) = live_slot();
        assert!(!release(&slot, generation + 1));
        assert!(release(&slot, generation));
        assert!(!release(&slot, generation));
    }

    #[test]
    fn abandoned_claim_bumps_the_generation() {
        let slot = slot();
        let generation = try_claim(&slot).unwrap();
        assert!(abandon_claim(&slot, generation));
        assert_eq!(try_claim(&slot), Some(generation + 1));
    }
}
