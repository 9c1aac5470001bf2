//! The silence a scan reports for a registration another party ended
//! `timeout` (a session's listener; a reaper that died before its drop):
//! measured on this reaper's clock from the registration's last signal, a
//! beat or, if it never beat, its registration; the reap timeout where no
//! signal of it can be read on this clock.

use crate::clock::Clock;
use crate::event::Reason;
use crate::sync::Ordering::{Acquire, Relaxed};
use crate::table::layout::{Slot, FLAG_REMOTE};
use crate::table::protocol::{self, Beat};

use super::observe::Verdict;
use super::role::Reaper;

impl Reaper {
    /// How long a registration that another party ended `timeout` had been
    /// silent, at `now_ns` on this reaper's clock: from its last signal
    /// ([`Reaper::last_signal_before_end`]), or, where none can be read on
    /// this clock, the reap timeout (the least any ender of a `timeout`
    /// required). 0 for every other ending.
    pub(super) fn silence_before_end(
        &self,
        index: u32,
        slot: &Slot,
        generation: u32,
        reason: Reason,
        now_ns: u64,
    ) -> u64 {
        if reason != Reason::Timeout {
            return 0;
        }
        match self.last_signal_before_end(index, slot, generation, now_ns) {
            Some(signal_ns) => now_ns.saturating_sub(signal_ns),
            None => self.timeout_ns,
        }
    }

    /// The verdict on a registration another party ended (`found`) while
    /// this reaper was ending it as `decided`, after the silence it had
    /// measured: that measure if the endings are the same, else the
    /// silence `found` stands for ([`Reaper::silence_before_end`]: zero
    /// for a deregistration, never a measure made for another reason).
    pub(super) fn ended_first(
        &self,
        index: u32,
        slot: &Slot,
        generation: u32,
        found: Reason,
        decided: (Reason, u64),
        now_ns: u64,
    ) -> Verdict {
        let (decided, measured_ns) = decided;
        let silent_ns = if found == decided {
            measured_ns
        } else {
            self.silence_before_end(index, slot, generation, found, now_ns)
        };
        Verdict::Ended {
            reason: found,
            silent_ns,
        }
    }

    /// When, on this reaper's clock, an ended registration last signalled.
    /// Stamped on this clock (a session's, stamped by its listener; a
    /// worker in this time namespace): its last beat as this reaper saw it,
    /// else as its ender recorded it; if it never beat, its registration
    /// (as the grace counts it). Stamped on another clock (a worker in
    /// another time namespace), whose stamps this reaper cannot read: when
    /// this reaper first saw its last beat word, as a live one's silence is
    /// judged; `None` if it saw none of that registration (it started after
    /// the end: the reaper that ended it died before its drop).
    fn last_signal_before_end(
        &self,
        index: u32,
        slot: &Slot,
        generation: u32,
        now_ns: u64,
    ) -> Option<u64> {
        let seen = self.seen[index as usize];
        let seen_here = protocol::beat_matches(seen.word, generation);
        let on_own_clock = slot.flags.load(Relaxed) & FLAG_REMOTE != 0
            || (self.clock_id != Clock::UNKNOWN && slot.clock_id.load(Relaxed) == self.clock_id);
        if !on_own_clock {
            return seen_here.then_some(seen.first_seen);
        }
        let recorded = slot.final_beat.load(Acquire);
        let word = if seen_here && matches!(protocol::decode_beat(seen.word), Beat::At(_)) {
            seen.word
        } else if protocol::beat_matches(recorded, generation) {
            recorded
        } else if seen_here {
            seen.word
        } else {
            return None;
        };
        match protocol::decode_beat(word) {
            Beat::At(stamp) => Some(stamp.ns_near(now_ns)),
            Beat::Never => Some(slot.registered_ns.load(Relaxed)),
            Beat::Ended(_) => None,
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::Verdict;
    use crate::clock::Clock;
    use crate::event::{DropEvent, Reason};
    use crate::table::handle::Table;
    use crate::table::options::TableOptions;
    use crate::table::protocol;
    use std::sync::mpsc;
    use std::time::Duration;

    const SECOND: u64 = 1_000_000_000;

    /// A reaper on `table` whose drops arrive on the receiver.
    fn reaper_with_events(table: &Table) -> (crate::Reaper, mpsc::Receiver<DropEvent>) {
        let (sender, events) = mpsc::channel();
        let reaper = table
            .reaper()
            .on_drop(move |event| Ok(sender.send(event.clone())?))
            .build()
            .unwrap();
        (reaper, events)
    }

    #[test]
    fn a_timeout_ended_before_any_beat_reports_the_silence_since_registering() {
        // Its listener ends a session `timeout` whose client went unheard
        // (stopped) before a first beat reached it; the reaper that drops
        // it had scanned it, or (its listener's reaper died) had not.
        for scanned_before in [true, false] {
            let manual = Clock::manual(100 * SECOND);
            let table = Table::in_memory(&TableOptions::default())
                .unwrap()
                .with_clock(manual.clock());
            let worker = table.register(7, "never beat").unwrap();
            let registered_ns = manual.now_ns();
            let first = reaper_with_events(&table);
            let (mut reaper, events) = if scanned_before {
                let (mut reaper, events) = first;
                reaper.scan_once(registered_ns + SECOND).unwrap();
                (reaper, events)
            } else {
                drop(first);
                reaper_with_events(&table)
            };
            let slot = table.memory.slot(worker.slot());
            protocol::end(slot, worker.generation(), Reason::Timeout).unwrap();
            let silent = Duration::from_millis(1_600);
            reaper
                .scan_once(registered_ns + silent.as_nanos() as u64)
                .unwrap();
            let event = events.try_recv().expect("dropped at that scan");
            assert_eq!(
                (event.reason, event.silent_for),
                (Reason::Timeout, silent),
                "scanned before: {scanned_before}"
            );
        }
    }

    #[test]
    fn an_ending_found_in_place_of_the_reapers_reports_its_own_silence_not_the_reapers_measure() {
        let manual = Clock::manual(100 * SECOND);
        let table = Table::in_memory(&TableOptions::default())
            .unwrap()
            .with_clock(manual.clock());
        let (reaper, _events) = reaper_with_events(&table);
        let ended = |reason: Reason| {
            let worker = table.register(10 + reason as u64, "").unwrap();
            worker.heartbeat().unwrap();
            let slot = table.memory.slot(worker.slot());
            protocol::end(slot, worker.generation(), reason).unwrap();
            (worker.slot(), worker.generation(), manual.now_ns())
        };
        let silent = |verdict: Verdict| match verdict {
            Verdict::Ended { reason, silent_ns } => (reason, silent_ns),
            _ => panic!("not ended"),
        };
        let after = 2 * SECOND;
        // A deregistration under an eviction for silence: zero, as every
        // deregistration.
        let (index, generation, beat_ns) = ended(Reason::Deregistered);
        let slot = table.memory.slot(index);
        let verdict = reaper.ended_first(
            index,
            slot,
            generation,
            Reason::Deregistered,
            (Reason::Timeout, 5 * SECOND),
            beat_ns + after,
        );
        assert_eq!(silent(verdict), (Reason::Deregistered, 0));
        // A listener's timeout under a stall: the silence since its last
        // beat, not how long its progress stood still.
        let (index, generation, beat_ns) = ended(Reason::Timeout);
        let slot = table.memory.slot(index);
        let verdict = reaper.ended_first(
            index,
            slot,
            generation,
            Reason::Timeout,
            (Reason::Stalled, 9 * SECOND),
            beat_ns + after,
        );
        assert_eq!(silent(verdict), (Reason::Timeout, after));
        // The same ending: the reaper's own measure.
        let verdict = reaper.ended_first(
            index,
            slot,
            generation,
            Reason::Timeout,
            (Reason::Timeout, 3 * SECOND),
            beat_ns + after,
        );
        assert_eq!(silent(verdict), (Reason::Timeout, 3 * SECOND));
    }

    #[test]
    fn a_timeout_ended_elsewhere_on_another_clock_reports_the_silence_this_reaper_saw() {
        // A worker in a time namespace 300 s ahead of the reaper's: its
        // stamps are on a clock the reaper cannot read.
        let manual = Clock::manual(100 * SECOND);
        let table = Table::in_memory(&TableOptions::default())
            .unwrap()
            .with_clock(manual.clock());
        let ahead = Clock::manual(400 * SECOND);
        let worker = table.with_clock(ahead.clock()).register(8, "").unwrap();
        worker.heartbeat().unwrap();
        let (mut reaper, events) = reaper_with_events(&table);
        let first_seen = manual.now_ns();
        reaper.scan_once(first_seen).unwrap();
        let slot = table.memory.slot(worker.slot());
        protocol::end(slot, worker.generation(), Reason::Timeout).unwrap();
        let silent = Duration::from_millis(1_300);
        reaper
            .scan_once(first_seen + silent.as_nanos() as u64)
            .unwrap();
        let event = events.try_recv().expect("dropped at that scan");
        assert_eq!((event.reason, event.silent_for), (Reason::Timeout, silent));
    }
}
