//! When the reaper tests registrations' locks (those no pidfd watches): in
//! rounds after a descriptor on the table was closed, on the first scan and
//! on a backstop. The tests themselves are in `lock_rounds.rs`.

use crate::reaper::exit_watch::CLOSE_RECHECK;
use crate::table::layout::SCANS_PER_TIMEOUT;

/// How long after a round for a close its second round is due: half the
/// exit watcher's [`CLOSE_RECHECK`] (the close was heard before this round
/// ran, and the watcher's wake-up for the second comes that long after it).
const RECHECK_AFTER_NS: u64 = CLOSE_RECHECK.as_nanos() as u64 / 2;

/// Every this many scans (four timeouts), the locks of registrations no
/// pidfd watches are tested even if no descriptor on the table was closed: a
/// safety net, should a close ever go unheard.
pub(super) const LOCK_BACKSTOP_SCANS: u32 = 4 * SCANS_PER_TIMEOUT;

/// From this many lock tests in a round, the next round reads every held
/// lock at once (`/proc/locks`) instead of testing each (`F_OFD_GETLK` walks
/// the object's whole lock list per test). Measured in BENCHMARKS.md.
const LOCK_SNAPSHOT_FROM: usize = 64;

/// The registering process of a registration, as its slot names it: pid and
/// start time in its own PID namespace, its clock's identity (its time
/// namespace) and its random tag (the upper bits of the slot's flags). A
/// process's death drops all its locks at once, so in a round one held lock
/// speaks for every registration of its process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct Registrant {
    pub(super) pid: u32,
    /// Its start time (0: unknown).
    pub(super) start: u64,
    pub(super) clock_id: u64,
    pub(super) tag: u32,
}

/// The lock tests of registrations no pidfd watches, round by round (the
/// reaper's schedule of lock rounds): a round
/// runs in a scan after a descriptor on the table was closed (a registrant
/// died, or let go), on the first scan, and on the backstop. In a round,
/// each registering process has one registration tested (its first); the
/// others are tested only if that one's lock is gone.
#[derive(Debug)]
pub(super) struct LockRounds {
    /// Whether this scan is a round.
    pub(super) round: bool,
    /// When the second round owed to the last close heard is due (reaper
    /// clock): the kernel tells of a close (`fsnotify_close`) just *before*
    /// it drops the file's locks (`locks_remove_file`), so the round at once
    /// may find a dying process's lock still held. The owed round is the
    /// first scan at or after this time (the exit watcher wakes the reaper
    /// [`CLOSE_RECHECK`] after the close for it); an unrelated scan before
    /// then does not pay it.
    pub(super) recheck_at: Option<u64>,
    /// This round's registering processes whose tested lock is held.
    pub(super) alive: std::collections::HashSet<Registrant>,
    /// Scans since the last round (`u32::MAX` before the first).
    pub(super) scans_since_round: u32,
    /// Tests made in this round.
    pub(super) tested: usize,
    /// Whether this round reads all held locks at once (decided from the
    /// last round's count).
    pub(super) use_snapshot: bool,
    /// The held locks, read at this round's first test.
    pub(super) snapshot: Option<std::collections::HashSet<u64>>,
}

impl Default for LockRounds {
    fn default() -> Self {
        LockRounds {
            round: false,
            recheck_at: None,
            alive: std::collections::HashSet::new(),
            scans_since_round: u32::MAX,
            tested: 0,
            use_snapshot: false,
            snapshot: None,
        }
    }
}

impl LockRounds {
    pub(super) fn start_scan(&mut self, locks_moved: bool, now_ns: u64) {
        let recheck_due = self.recheck_at.is_some_and(|at| now_ns >= at);
        if recheck_due {
            self.recheck_at = None;
        }
        if locks_moved {
            self.recheck_at = Some(now_ns.saturating_add(RECHECK_AFTER_NS));
        }
        self.round = locks_moved || recheck_due || self.scans_since_round >= LOCK_BACKSTOP_SCANS;
        self.alive.clear();
        if self.round {
            self.use_snapshot = self.tested >= LOCK_SNAPSHOT_FROM;
            self.tested = 0;
            self.scans_since_round = 0;
        } else {
            self.scans_since_round += 1;
        }
    }

    pub(super) fn end_scan(&mut self) {
        self.snapshot = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reaper::exit_watch::CLOSE_RECHECK;

    const MS: u64 = 1_000_000;

    #[test]
    fn a_close_owes_a_second_lock_round_by_time_not_by_scan_count() {
        let mut locks = LockRounds::default();
        locks.start_scan(false, 0); // the first scan is a round
        assert!(locks.round);
        locks.start_scan(true, 100 * MS); // a close heard: a round now…
        assert!(locks.round);
        // …an unrelated scan a moment later does not pay the owed one…
        locks.start_scan(false, 100 * MS + MS);
        assert!(!locks.round);
        // …the scan the watcher's wake-up brings does.
        locks.start_scan(false, 100 * MS + CLOSE_RECHECK.as_nanos() as u64);
        assert!(locks.round);
        // Paid: the next scans are not rounds until the next close.
        locks.start_scan(false, 200 * MS);
        assert!(!locks.round);
    }

    #[test]
    fn with_no_close_heard_locks_are_tested_on_the_backstop() {
        let mut locks = LockRounds::default();
        locks.start_scan(false, 0);
        let mut scans = 0;
        loop {
            scans += 1;
            locks.start_scan(false, scans * 250 * MS);
            if locks.round {
                break;
            }
        }
        assert_eq!(scans, u64::from(LOCK_BACKSTOP_SCANS) + 1);
    }
}
