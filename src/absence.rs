//! The observer's own absence. Silence is judged by the reaper and its
//! listeners, which run in one process; when that process did not run for
//! a while (stopped, starved, its host frozen, paused or migrated), the
//! silence it did not witness is no evidence: the registrants were most
//! likely frozen with it. Each observer notes a gap in its own running
//! ([`Absence::note_gap`]); from the end of the gap every live
//! registration's silence (and a busy one's want of progress) counts anew,
//! while exit detection (pidfds, lock tests, a session's socket closing)
//! stays exact.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// A gap in an observer's running longer than this, for reap timeout `T`,
/// is an absence: two scan intervals (`T/2`). A reaper scans every `T/4`
/// and a listener goes round its loop at least every `T/16`, so neither
/// comes near it while it runs.
pub(crate) fn absence_threshold(reap_timeout: Duration) -> Duration {
    reap_timeout / 2
}

/// When the observers last came back from an absence, shared by a reaper
/// and its listeners (on the table clock; 0: never away).
#[derive(Debug, Default)]
pub(crate) struct Absence {
    returned_ns: AtomicU64,
}

impl Absence {
    /// An observer ran at `now_ns`, and before that at `last_ns` (0: never):
    /// a gap over `threshold` is an absence, and silence before `now_ns`
    /// no longer counts. Returns the gap when it was one.
    pub(crate) fn note_gap(
        &self,
        last_ns: u64,
        now_ns: u64,
        threshold: Duration,
    ) -> Option<Duration> {
        let gap = Duration::from_nanos(now_ns.saturating_sub(last_ns));
        if last_ns == 0 || gap <= threshold {
            return None;
        }
        self.returned_ns.fetch_max(now_ns, Relaxed);
        Some(gap)
    }

    /// The earliest moment silence counts from: a registration last heard
    /// at `last_ns` has been silent, as far as the observers saw, since the
    /// later of that and their return.
    pub(crate) fn silent_since(&self, last_ns: u64) -> u64 {
        last_ns.max(self.returned_ns.load(Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: u64 = 1_000_000_000;

    #[test]
    fn a_gap_past_the_threshold_restarts_every_silence_at_the_return() {
        let absence = Absence::default();
        let threshold = absence_threshold(Duration::from_secs(1));
        assert_eq!(
            absence.note_gap(10 * SECOND, 10 * SECOND + SECOND / 2, threshold),
            None
        );
        assert_eq!(absence.silent_since(7 * SECOND), 7 * SECOND);
        assert_eq!(
            absence.note_gap(10 * SECOND, 13 * SECOND, threshold),
            Some(Duration::from_secs(3))
        );
        assert_eq!(absence.silent_since(7 * SECOND), 13 * SECOND);
        assert_eq!(absence.silent_since(14 * SECOND), 14 * SECOND);
    }

    #[test]
    fn the_first_run_is_no_gap_and_an_earlier_return_never_replaces_a_later_one() {
        let absence = Absence::default();
        assert_eq!(
            absence.note_gap(0, 50 * SECOND, Duration::from_millis(500)),
            None
        );
        assert_eq!(absence.silent_since(1), 1);
        absence.note_gap(10 * SECOND, 20 * SECOND, Duration::from_millis(500));
        absence.note_gap(5 * SECOND, 15 * SECOND, Duration::from_millis(500));
        assert_eq!(absence.silent_since(0), 20 * SECOND);
    }
}
