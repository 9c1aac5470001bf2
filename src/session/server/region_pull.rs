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

use super::held::HeldRegion;
use crate::clock::{Clock, STAMP_LAG_TICKS};
use crate::sync::Ordering::Relaxed;
use crate::table::handle::Table;
use crate::table::layout::{BUSY_PERIOD, FLAG_COARSE_STAMPS};
use crate::table::protocol::{self, Beat, Gone, Stamp};

/// What the last pull of a region found there: a change since is news.
#[derive(Debug, Default)]
pub(crate) struct Pulled {
    /// The beat counter.
    beats: u64,
    /// The step count (`None` until the first pull: a registration taken
    /// back counts one step then, its client went on while it was away).
    steps: Option<u64>,
    /// The busy bit and busy period.
    busy: bool,
    period: bool,
}

impl HeldRegion {
    /// Brings what the client wrote in its region into registration
    /// `(index, generation)`'s slot of `table`, at `now_ns` on the table's
    /// clock, and bumps the listener's pulse (the client's sign that it is
    /// heard).
    ///
    /// # Errors
    ///
    /// [`Gone`] if the registration has ended (nothing is written then).
    pub(crate) fn pull(
        &self,
        table: &Table,
        index: u32,
        generation: u32,
        now_ns: u64,
    ) -> Result<(), Gone> {
        let from = self.region.slot();
        let slot = table.memory.slot(index);
        let beat = from.beat.load(Relaxed);
        let beats = from.beats.load(Relaxed);
        let progress = from.progress.load(Relaxed);
        let (clock_id, coarse) = (
            from.clock_id.load(Relaxed),
            from.flags.load(Relaxed) & FLAG_COARSE_STAMPS != 0,
        );
        let mut last = self
            .pulled
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
        self.region.listener_pulse().fetch_add(1, Relaxed);
        result
    }
}
