//! What a `unix:` client beats in its region, brought into the table: the
//! reaper pulls each region at its scan (every `T/4`, as it reads the
//! table's own slots) and the registration's slot then holds the client's
//! last heartbeat, busy bit and steps as a local registration's would. So
//! the listener reads nothing per beat, and a region session is judged as
//! a table registration is: by its stamp, never evicted before `T` of
//! silence and within `1.25 T`.
//!
//! Every word read is the client's to forge, and is bounded as a beat
//! frame's values are: a stamp is believed only when the client stamps
//! with this process's clock (one time namespace) and never later than
//! now (a client in another time namespace is dated by when a pull first
//! sees its beat count change, as the reaper dates a table registrant that
//! stamps with another clock: at most one scan late); at most 2^32 steps
//! count per pull; nothing read names another registration.

use crate::clock::{Clock, STAMP_LAG_TICKS};
use crate::sync::Ordering::Relaxed;
use crate::table::death_protocol;
use crate::table::handle::Table;
use crate::table::layout::{BUSY_PERIOD, FLAG_COARSE_STAMPS, FLAG_REGION_DEATH_WORD};
use crate::table::protocol::{self, Beat, Gone, Stamp};
use crate::table::region::SharedRegion;
use std::sync::Mutex;

/// What the last pull of a region found there: a change since is news.
#[derive(Debug, Default)]
struct Pulled {
    /// The beat counter.
    beats: u64,
    /// The step count (`None` until the first pull: a registration taken
    /// back counts one step then, its client went on while it was away).
    steps: Option<u64>,
    /// The busy bit and busy period.
    busy: bool,
    period: bool,
}

/// The pulls of one region: what the last found there, behind a lock
/// (the reaper pulls at its scans, a listener at its client's `Bye`).
#[derive(Debug, Default)]
pub(crate) struct Puller(Mutex<Pulled>);

impl Puller {
    /// Brings what the client wrote in `region` into registration
    /// `(index, generation)`'s slot of `table`, at `now_ns` on the table's
    /// clock, and bumps the listener's pulse (the client's sign that it is
    /// heard).
    ///
    /// # Errors
    ///
    /// [`Gone`] if the registration has ended (nothing is written to its
    /// slot then, not even [`FLAG_REGION_DEATH_WORD`]: the slot may be
    /// another's by now).
    pub(crate) fn pull(
        &self,
        region: &SharedRegion,
        table: &Table,
        index: u32,
        generation: u32,
        now_ns: u64,
    ) -> Result<(), Gone> {
        let from = region.slot();
        let slot = table.memory.slot(index);
        let beat = from.beat.load(Relaxed);
        let beats = from.beats.load(Relaxed);
        let progress = from.progress.load(Relaxed);
        let (clock_id, coarse) = (
            from.clock_id.load(Relaxed),
            from.flags.load(Relaxed) & FLAG_COARSE_STAMPS != 0,
        );
        let mut last = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let counted = beats != last.beats;
        last.beats = beats;
        let own_clock = clock_id != Clock::UNKNOWN && clock_id == table.clock.identity();
        let beat_ns = match protocol::decode_beat(beat) {
            // A coarse stamp is up to its lag older than the heartbeat:
            // dated that much later, so never early (and never after now).
            Beat::At(stamp) if own_clock => {
                let lag = if coarse {
                    crate::os::clock::coarse_resolution_ns()
                        .saturating_mul(u64::from(STAMP_LAG_TICKS))
                } else {
                    0
                };
                Some(stamp.ns_near(now_ns).saturating_add(lag).min(now_ns))
            }
            _ if counted => Some(now_ns),
            _ => None,
        };
        let mut result = protocol::still_live(slot, generation);
        let live = result.is_ok();
        if let (Ok(()), Some(ns)) = (result, beat_ns) {
            result = protocol::beat_at(slot, generation, Stamp::of_micros(ns.div_ceil(1_000)));
            slot.beats.store(beats, Relaxed);
        }
        let protocol::Progress { busy, steps } = protocol::decode_progress(progress);
        let period = progress & BUSY_PERIOD != 0;
        if result.is_ok() && last.steps != Some(steps) {
            let made = last.steps.map_or(1, |before| {
                steps.wrapping_sub(before).min(u64::from(u32::MAX))
            });
            last.steps = Some(steps);
            result = protocol::progress_by(slot, generation, made);
        }
        // A busy period that began since the last pull is a new one in the
        // slot too (idle, then busy again).
        let new_period = busy && last.busy && period != last.period;
        if result.is_ok() && (busy != last.busy || new_period) {
            if new_period {
                result = protocol::set_busy(slot, generation, false);
            }
            if result.is_ok() {
                result = protocol::set_busy(slot, generation, busy);
            }
            (last.busy, last.period) = (busy, period);
        }
        // Only while the registration is live: once it ended, its slot may
        // be released and another's (whose flag this is not).
        if live {
            note_death_word(region, slot);
        }
        region.listener_pulse().fetch_add(1, Relaxed);
        result
    }
}

/// Keeps the slot's [`FLAG_REGION_DEATH_WORD`] as the region's death word
/// says: held by a thread of the client, or not (for `status`; nothing is
/// judged by it).
fn note_death_word(region: &SharedRegion, slot: &crate::table::layout::Slot) {
    let held = region.death_word().load(Relaxed) & death_protocol::TID_MASK != 0;
    let flags = slot.flags.load(Relaxed);
    if held != (flags & FLAG_REGION_DEATH_WORD != 0) {
        if held {
            slot.flags.fetch_or(FLAG_REGION_DEATH_WORD, Relaxed);
        } else {
            slot.flags.fetch_and(!FLAG_REGION_DEATH_WORD, Relaxed);
        }
    }
}

#[cfg(all(test, not(miri)))]
mod tests {
    use super::*;
    use crate::table::options::TableOptions;
    use std::sync::atomic::Ordering::SeqCst;
    use std::time::Duration;

    /// A listener's table with one registration, and a region whose
    /// client's worker is registered and beats there.
    /// A region and its pulls, as a listener holds them.
    struct Held {
        region: SharedRegion,
        puller: Puller,
    }

    impl Held {
        fn new() -> Held {
            Held {
                region: SharedRegion::create().unwrap(),
                puller: Puller::default(),
            }
        }

        fn pull(&self, table: &Table, index: u32, generation: u32, now_ns: u64) -> Result<(), Gone> {
            self.puller.pull(&self.region, table, index, generation, now_ns)
        }
    }

    fn pair() -> (Table, crate::Worker, Held, Table, crate::Worker) {
        let options = TableOptions {
            stamp_clock: crate::StampClock::Precise,
            ..TableOptions::default()
        };
        let table = Table::in_memory(&options).unwrap();
        let held = table.register(1, "held").unwrap();
        let region = Held::new();
        let client = Table::in_region(region.region.file().try_clone().unwrap(), &options).unwrap();
        let worker = client.register(1, "client").unwrap();
        (table, held, region, client, worker)
    }

    fn stamp_of(table: &Table, worker: &crate::Worker, now_ns: u64) -> Option<u64> {
        match protocol::decode_beat(table.memory.slot(worker.slot()).beat.load(SeqCst)) {
            Beat::At(stamp) => Some(stamp.ns_near(now_ns)),
            _ => None,
        }
    }

    #[test]
    fn a_stamp_of_this_clock_is_taken_as_written_and_never_later_than_now() {
        let (table, held, region, _client, worker) = pair();
        worker.heartbeat().unwrap();
        let beat_ns = table.clock.now_ns();
        std::thread::sleep(Duration::from_millis(50));
        let now_ns = table.clock.now_ns();
        region.pull(&table, held.slot(), held.generation(), now_ns).unwrap();
        let stamp = stamp_of(&table, &held, now_ns).expect("a heartbeat");
        assert!(stamp <= beat_ns + 1_000, "the client's own time, not the pull's");
        assert_eq!(table.memory.slot(held.slot()).beats.load(SeqCst), 1);
        // A stamp forged an hour ahead is taken as now.
        let ahead = Stamp::of_micros((now_ns + 3_600_000_000_000) / 1_000);
        let slot = region.region.slot();
        protocol::beat_at(slot, worker.generation(), ahead).unwrap();
        let later_ns = table.clock.now_ns();
        region.pull(&table, held.slot(), held.generation(), later_ns).unwrap();
        let stamp = stamp_of(&table, &held, later_ns).unwrap();
        assert!(stamp <= later_ns + 1_000, "{stamp} after {later_ns}");
    }

    #[test]
    fn a_coarse_stamp_is_dated_its_lag_later_and_never_after_now() {
        let (table, held, region, _client, worker) = pair();
        let lag = crate::os::clock::coarse_resolution_ns() * u64::from(STAMP_LAG_TICKS);
        region.region.slot().flags.fetch_or(FLAG_COARSE_STAMPS, SeqCst);
        let before = table.clock.now_ns();
        worker.heartbeat().unwrap();
        // Pulled at once: the lag would reach past now.
        let now_ns = table.clock.now_ns();
        region.pull(&table, held.slot(), held.generation(), now_ns).unwrap();
        assert!(stamp_of(&table, &held, now_ns).unwrap() <= now_ns + 1_000);
        // Beaten again, pulled later: the stamp and its lag.
        std::thread::sleep(Duration::from_millis(10));
        let before_second = table.clock.now_ns();
        worker.heartbeat().unwrap();
        std::thread::sleep(Duration::from_nanos(lag) + Duration::from_millis(20));
        let now_ns = table.clock.now_ns();
        region.pull(&table, held.slot(), held.generation(), now_ns).unwrap();
        let stamp = stamp_of(&table, &held, now_ns).unwrap();
        assert!(stamp + 1_000 >= before_second + lag, "{stamp}: no lag added");
        assert!(stamp <= now_ns + 1_000 && before < stamp, "never after now");
    }

    #[test]
    fn a_client_of_another_clock_is_dated_when_its_beat_count_is_seen_to_change() {
        let (table, held, region, _client, worker) = pair();
        let slot = region.region.slot();
        worker.heartbeat().unwrap();
        slot.clock_id.store(Clock::UNKNOWN, SeqCst);
        // Whatever its stamp says (an hour back here), the pull's time.
        protocol::beat_at(slot, worker.generation(), Stamp::of_micros(1)).unwrap();
        let first_ns = table.clock.now_ns();
        region.pull(&table, held.slot(), held.generation(), first_ns).unwrap();
        let dated = stamp_of(&table, &held, first_ns).unwrap();
        assert!(dated + 1_000 >= first_ns, "dated at the pull");
        // No change since: no newer heartbeat.
        std::thread::sleep(Duration::from_millis(20));
        let second_ns = table.clock.now_ns();
        region.pull(&table, held.slot(), held.generation(), second_ns).unwrap();
        assert_eq!(stamp_of(&table, &held, second_ns), Some(dated));
        // A beat counted: dated at this pull.
        worker.heartbeat().unwrap();
        slot.clock_id.store(Clock::UNKNOWN, SeqCst);
        let third_ns = table.clock.now_ns();
        region.pull(&table, held.slot(), held.generation(), third_ns).unwrap();
        assert!(stamp_of(&table, &held, third_ns).unwrap() + 1_000 >= third_ns);
    }

    #[test]
    fn steps_busy_and_a_new_busy_period_reach_the_slot_bounded() {
        let (table, held, region, _client, worker) = pair();
        let (index, generation) = (held.slot(), held.generation());
        let progress = |table: &Table| table.memory.slot(index).progress.load(SeqCst);
        worker.set_busy(true).unwrap();
        region.pull(&table, index, generation, table.clock.now_ns()).unwrap();
        let busy = protocol::decode_progress(progress(&table));
        assert!(busy.busy);
        // Idle and busy again between two pulls: a new period in the slot.
        worker.set_busy(false).unwrap();
        worker.set_busy(true).unwrap();
        let before = progress(&table);
        region.pull(&table, index, generation, table.clock.now_ns()).unwrap();
        assert_ne!(progress(&table) & BUSY_PERIOD, before & BUSY_PERIOD);
        assert!(protocol::decode_progress(progress(&table)).busy);
        // A forged count far ahead adds at most 2^32 steps.
        let steps_before = protocol::decode_progress(progress(&table)).steps;
        region.region.slot().progress.store(u64::MAX >> 3 & !1, SeqCst);
        region.pull(&table, index, generation, table.clock.now_ns()).unwrap();
        let made = protocol::decode_progress(progress(&table)).steps - steps_before;
        assert!(made <= u64::from(u32::MAX), "{made}");
    }

    #[test]
    fn a_pull_for_a_registration_whose_slot_was_reused_leaves_the_new_owners_flags() {
        let options = TableOptions {
            capacity: 1,
            ..TableOptions::default()
        };
        let table = Table::in_memory(&options).unwrap();
        let gone = table.register(1, "gone").unwrap();
        let (index, generation) = (gone.slot(), gone.generation());
        let slot = table.memory.slot(index);
        protocol::end(slot, generation, crate::Reason::Timeout).unwrap();
        assert!(protocol::release(slot, generation));
        let next = table.register(2, "next").unwrap();
        assert_eq!(next.slot(), index, "the one slot, taken again");
        let region = Held::new();
        // The old client's word held (as its death thread holds it): the
        // new owner's slot must not say so.
        region.region.death_word().store(4242, SeqCst);
        assert!(region.pull(&table, index, generation, table.clock.now_ns()).is_err());
        assert_eq!(slot.flags.load(SeqCst) & FLAG_REGION_DEATH_WORD, 0);
        // Nor, once the new owner's own flag is set, clear it.
        slot.flags.fetch_or(FLAG_REGION_DEATH_WORD, SeqCst);
        region.region.death_word().store(0, SeqCst);
        assert!(region.pull(&table, index, generation, table.clock.now_ns()).is_err());
        assert_ne!(slot.flags.load(SeqCst) & FLAG_REGION_DEATH_WORD, 0);
        drop(next);
    }

    #[test]
    fn an_ended_registration_is_left_as_it_is() {
        let (table, held, region, _client, worker) = pair();
        worker.heartbeat().unwrap();
        let (index, generation) = (held.slot(), held.generation());
        protocol::end(table.memory.slot(index), generation, crate::Reason::Timeout).unwrap();
        let word = table.memory.slot(index).beat.load(SeqCst);
        assert!(region.pull(&table, index, generation, table.clock.now_ns()).is_err());
        assert_eq!(table.memory.slot(index).beat.load(SeqCst), word);
    }
}
