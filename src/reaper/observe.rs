//! What a scan makes of one `LIVE` slot: observed as plain values, decided
//! by [`decide`] (pure), then carried out; its progress judged after.

use crate::clock::{Clock, Stamps, STAMP_LAG_TICKS};
use crate::event::Reason;
use crate::reaper::exit_watch::LockCheck;
use crate::session::SlotSilence;
use crate::sync::Ordering::{Acquire, Relaxed};
use crate::table::layout::{Slot, BUSY, FLAG_COARSE_STAMPS, FLAG_REMOTE};
use crate::table::protocol::{self, Beat, Gone};

use super::role::Reaper;

impl Reaper {
    /// One `LIVE` slot's fate this scan: observe it, [`decide`], then carry
    /// the decision out. `pulled`: a session's client beats in a region,
    /// just pulled into the slot (judged then as the table's own).
    pub(super) fn judge(
        &mut self,
        index: u32,
        slot: &Slot,
        generation: u32,
        now_ns: u64,
        resetting: bool,
        pulled: bool,
    ) -> Verdict {
        let word = slot.beat.load(Acquire);
        if !protocol::beat_matches(word, generation) {
            return Verdict::Corrupt;
        }
        let observed = self.observe(index, slot, generation, word, pulled, now_ns);
        match decide(observed, resetting, self.timeout_ns) {
            Decision::Corrupt => Verdict::Corrupt,
            Decision::Drop(reason) => Verdict::Ended {
                reason,
                silent_ns: self.silence_before_end(index, slot, generation, reason, now_ns),
            },
            Decision::JudgeProgress => self.judge_progress(index, slot, generation, pulled, now_ns),
            Decision::Reset => match protocol::end(slot, generation, Reason::Cleared) {
                Ok(()) => Verdict::Ended {
                    reason: Reason::Cleared,
                    silent_ns: 0,
                },
                // Ended by another party (a listener judging its session's
                // silence) between the look and the reset's end.
                Err(Gone::Ended(Some(found))) => {
                    self.ended_first(index, slot, generation, found, (Reason::Cleared, 0), now_ns)
                }
                Err(_) => Verdict::Corrupt,
            },
            Decision::Evict { reason, silent_ns } => {
                match protocol::evict(slot, generation, word, reason) {
                    Ok(()) => Verdict::Ended { reason, silent_ns },
                    Err(found) => match protocol::decode_beat(found) {
                        // A deregistration (or another ending) got there first.
                        Beat::Ended(Some(found)) => self.ended_first(
                            index,
                            slot,
                            generation,
                            found,
                            (reason, silent_ns),
                            now_ns,
                        ),
                        // A heartbeat landed between our read and our CAS: it counts.
                        _ => Verdict::Keep,
                    },
                }
            }
        }
    }

    /// What this scan sees of a `LIVE` slot whose beat word is `word`: its
    /// ending, or how long it has been silent (on this reaper's clock),
    /// against which budget, and whether its process is gone.
    fn observe(
        &mut self,
        index: u32,
        slot: &Slot,
        generation: u32,
        word: u64,
        pulled: bool,
        now_ns: u64,
    ) -> Observed {
        let (signal_ns, budget_ns, timed_reason) = match protocol::decode_beat(word) {
            Beat::Ended(reason) => return Observed::Ended(reason),
            Beat::Never => (
                slot.registered_ns.load(Relaxed),
                self.grace_ns,
                Reason::Grace,
            ),
            Beat::At(stamp) => (
                stamp
                    .ns_near(now_ns)
                    .saturating_add(self.stamp_lag_ns(slot)),
                self.timeout_ns,
                Reason::Timeout,
            ),
        };
        let own_clock =
            self.clock_id != Clock::UNKNOWN && slot.clock_id.load(Relaxed) == self.clock_id;
        let last_signal = self.last_signal(index, word, own_clock.then_some(signal_ns), now_ns);
        let last_signal = self.sessions.absence().silent_since(last_signal);
        if slot.flags.load(Relaxed) & FLAG_REMOTE != 0 {
            // A session's client: no lock or pidfd sees it exit; its
            // sessions say how to judge its silence.
            let silence = SlotSilence {
                pulled,
                last_signal,
                budget_ns,
                timed_reason,
            };
            let judged = self
                .sessions
                .judge_remote(index, generation, silence, now_ns);
            return Observed::Live {
                silent_ns: now_ns.saturating_sub(judged.since_ns),
                budget_ns: judged.budget_ns,
                timed_reason: judged.reason,
                exited: false,
            };
        }
        // A dying process's lock is tested at every scan: it is free once
        // the process has closed its files (it has ended), or at once after
        // an `exec` (which no pidfd sees).
        let dying = self.is_dying(index, generation);
        let test = match &mut self.watcher {
            _ if dying => LockCheck::Now,
            Some(watcher) => watcher.lock_check(index, generation, slot),
            None => LockCheck::Now,
        };
        let exited = match test {
            LockCheck::Never => false,
            LockCheck::Now => self.process_exited(index, generation),
            LockCheck::WhenLocksMoved => {
                self.locks.round && self.lock_dropped(index, generation, slot)
            }
        };
        Observed::Live {
            silent_ns: now_ns.saturating_sub(last_signal),
            budget_ns,
            timed_reason,
            exited,
        }
    }

    /// How far the slot's stamps may lag its heartbeats: [`STAMP_LAG_TICKS`]
    /// of the table's coarse resolution where the registrant says it stamps
    /// coarsely, so that `stamp + lag` is never before the heartbeat (and the
    /// eviction never early); zero for precise stamps.
    fn stamp_lag_ns(&self, slot: &Slot) -> u64 {
        match self.table.memory.stamps {
            Stamps::Coarse { resolution_ns }
                if slot.flags.load(Relaxed) & FLAG_COARSE_STAMPS != 0 =>
            {
                resolution_ns.saturating_mul(u64::from(STAMP_LAG_TICKS))
            }
            _ => 0,
        }
    }

    /// A live registration's progress: busy and unchanged for
    /// the progress timeout, on this reaper's clock from when it saw the word
    /// change, it ends `Stalled`. Idle never stalls.
    fn judge_progress(
        &mut self,
        index: u32,
        slot: &Slot,
        generation: u32,
        pulled: bool,
        now_ns: u64,
    ) -> Verdict {
        if self.progress_timeout_ns == 0 {
            return Verdict::Keep;
        }
        let word = slot.progress.load(Acquire);
        let seen = &mut self.seen[index as usize];
        if seen.progress != word || seen.progress_generation != generation {
            seen.progress = word;
            seen.progress_generation = generation;
            seen.progress_since = now_ns;
            if let Some(observed) = self.table.memory.progress_seen(index) {
                observed.store(now_ns.max(1), Relaxed);
            }
        }
        // A held session's beats may still wait in its socket: judged up to
        // what its listener has applied (a region's were pulled just now).
        let known_until = if slot.flags.load(Relaxed) & FLAG_REMOTE != 0 {
            self.sessions
                .progress_known_until(index, generation, pulled, now_ns)
        } else {
            now_ns
        };
        let since = self.sessions.absence().silent_since(seen.progress_since);
        let quiet_ns = known_until.saturating_sub(since);
        if word & BUSY == 0 || quiet_ns < self.progress_timeout_ns {
            return Verdict::Keep;
        }
        if !protocol::mark_stalled(slot, word) {
            return Verdict::Keep; // a step (or going idle) got there first
        }
        match protocol::end(slot, generation, Reason::Stalled) {
            Ok(()) => Verdict::Ended {
                reason: Reason::Stalled,
                silent_ns: quiet_ns,
            },
            // Ended by another party (a listener, a deregistration) between
            // the mark and the end.
            Err(Gone::Ended(Some(found))) => self.ended_first(
                index,
                slot,
                generation,
                found,
                (Reason::Stalled, quiet_ns),
                now_ns,
            ),
            Err(_) => Verdict::Corrupt,
        }
    }

    /// When the slot last signalled, on the reaper's clock. `own_stamp` is
    /// its last signal when the registrant stamps with the reaper's own clock
    /// (same identity), trusted on every scan, including a restarted
    /// reaper's first. Any other slot is judged by when this reaper first saw
    /// its current beat word: its real last signal came no later, so it is
    /// never evicted early, and at most one scan interval late.
    fn last_signal(&mut self, index: u32, word: u64, own_stamp: Option<u64>, now_ns: u64) -> u64 {
        let seen = &mut self.seen[index as usize];
        if seen.word != word {
            seen.word = word;
            seen.first_seen = now_ns;
        }
        match own_stamp {
            Some(stamp) => stamp.min(now_ns),
            None => seen.first_seen,
        }
    }
}

/// What a scan decided about one slot.
pub(super) enum Verdict {
    /// Alive: nothing to do.
    Keep,
    /// Contents no writer of ours produces: skipped, counted.
    Corrupt,
    /// It ended for `reason` after `silent_ns` of silence (0 for explicit
    /// endings).
    Ended { reason: Reason, silent_ns: u64 },
}

/// What one scan observed of a `LIVE` slot, as plain values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Observed {
    /// Its beat word says it ended, with the reason its ender recorded
    /// (`None`: a word no writer of ours produces).
    Ended(Option<Reason>),
    /// Not ended: silent for `silent_ns` (this reaper's clock) against
    /// `budget_ns` (the timeout, or the grace before a first beat, whose
    /// reason is `timed_reason`), and whether its process is gone.
    Live {
        silent_ns: u64,
        budget_ns: u64,
        timed_reason: Reason,
        exited: bool,
    },
}

/// A slot's fate, decided from plain values only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Decision {
    /// Ended by its registrant or a requester: run its drop.
    Drop(Reason),
    /// A reset ends it, whatever its beats.
    Reset,
    /// End it for `reason`, unless a heartbeat lands first (the eviction is
    /// a compare-and-swap on the word the decision was made on).
    Evict { reason: Reason, silent_ns: u64 },
    /// Alive; a busy worker's progress is judged next.
    JudgeProgress,
    /// Contents no writer of ours produces.
    Corrupt,
}

/// The verdict on one slot: an ending first, then a reset, a process gone,
/// silence past its budget (never when reaping is off); else alive.
fn decide(observed: Observed, resetting: bool, timeout_ns: u64) -> Decision {
    match observed {
        Observed::Ended(Some(reason)) => Decision::Drop(reason),
        Observed::Ended(None) => Decision::Corrupt,
        Observed::Live { .. } if resetting => Decision::Reset,
        Observed::Live {
            exited: true,
            silent_ns,
            ..
        } => Decision::Evict {
            reason: Reason::ProcessExited,
            silent_ns,
        },
        Observed::Live {
            silent_ns,
            budget_ns,
            timed_reason,
            ..
        } if timeout_ns > 0 && silent_ns >= budget_ns => Decision::Evict {
            reason: timed_reason,
            silent_ns,
        },
        Observed::Live { .. } => Decision::JudgeProgress,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn live(silent_ms: u64, budget_ms: u64, exited: bool) -> Observed {
        Observed::Live {
            silent_ns: silent_ms * MS,
            budget_ns: budget_ms * MS,
            timed_reason: Reason::Timeout,
            exited,
        }
    }

    #[test]
    fn silence_ends_a_registration_at_its_budget_never_before() {
        assert_eq!(
            decide(live(999, 1000, false), false, 1000 * MS),
            Decision::JudgeProgress
        );
        assert_eq!(
            decide(live(1000, 1000, false), false, 1000 * MS),
            Decision::Evict {
                reason: Reason::Timeout,
                silent_ns: 1000 * MS
            }
        );
    }

    #[test]
    fn a_gone_process_ends_at_once_and_reaping_off_ends_nothing_silent() {
        assert_eq!(
            decide(live(1, 1000, true), false, 1000 * MS),
            Decision::Evict {
                reason: Reason::ProcessExited,
                silent_ns: MS
            }
        );
        assert_eq!(
            decide(live(5000, 1000, false), false, 0),
            Decision::JudgeProgress
        );
    }

    #[test]
    fn an_ending_is_dropped_before_a_reset_and_a_reset_before_everything_else() {
        let deregistered = Observed::Ended(Some(Reason::Deregistered));
        assert_eq!(
            decide(deregistered, true, MS),
            Decision::Drop(Reason::Deregistered)
        );
        assert_eq!(decide(Observed::Ended(None), false, MS), Decision::Corrupt);
        assert_eq!(
            decide(live(0, 1000, true), true, 1000 * MS),
            Decision::Reset
        );
        assert_eq!(
            decide(live(5000, 1000, false), true, 1000 * MS),
            Decision::Reset
        );
    }
}
