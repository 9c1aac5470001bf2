//! One scan: begin (the role, the size, the wake-ups), a pending clear,
//! the sweep over every slot, the drops handed to their handlers, the
//! scan's figures.

use super::observe::Verdict;
use super::owned_removal::OwnedRemover;
use super::role::{Dispatch, Reaper, ScanReport};
use crate::error::Result;
use crate::event::{DropEvent, Reason};
use crate::os::clock::monotonic_ns;
use crate::absence::absence_threshold;
use crate::reaper::exit_watch::ExitWatcher;
use crate::reaper::handlers::{HandlerPool, Job};
use crate::session::limited_log;
use crate::status::metrics;
use crate::sync::Ordering::{Acquire, Relaxed, Release};
use crate::table::layout::{Slot, FLAG_REGION_DEATH_WORD, FLAG_REMOTE};
use crate::table::protocol::{self, Beat, CLAIMING, FREE, LIVE};
use std::collections::HashSet;
use std::time::Duration;

impl Reaper {
    /// One scan at time `now_ns` (on the table clock): carries out a pending
    /// clear (a reset first ends every registration), ends every
    /// registration that has been silent for its budget or whose process has
    /// exited, and every one already ended (deregistered,
    /// replaced, or left by a reaper that died mid-drop); runs the drop
    /// handlers outside any lock; then frees those slots.
    ///
    /// # Errors
    ///
    /// - [`Error::Corrupt`](crate::error::Error::Corrupt) if the object was
    ///   truncated (checked before any slot is read; nothing is done then).
    /// - [`Error::Busy`](crate::error::Error::Busy) in a forked child: the role
    ///   stays the parent's.
    pub fn scan_once(&mut self, now_ns: u64) -> Result<ScanReport> {
        let started = monotonic_ns();
        self.begin_scan(now_ns)?;
        let clear = self.pending_clear();
        let mut report = ScanReport {
            cleared: clear.is_some(),
            reset: clear.is_some_and(|clear| clear.reset),
            ..ScanReport::default()
        };
        self.sweep(now_ns, &mut report);
        report.removed_files = self
            .owned_remover
            .as_ref()
            .map_or_else(Vec::new, OwnedRemover::ask);
        self.dispatch(&mut report, clear);
        self.finish_scan(&report, started);
        Ok(report)
    }

    /// Checks the role and the table's size, answers the wake-ups so far and
    /// beats the reaper's heartbeat; notes what the exit watcher saw.
    fn begin_scan(&mut self, now_ns: u64) -> Result<()> {
        let inner = &self.table.memory;
        if !self.role.held_here() {
            return Err(crate::error::Error::busy(format!(
                "table '{}': this reaper was inherited through fork: the role is the parent's; build a reaper in the child",
                inner.name
            )));
        }
        inner.check_size()?;
        self.death_words_whole = inner.death_words().is_some();
        // This scan answers every wake-up so far.
        self.wake.drain();
        self.last_scan_ns = Some(now_ns);
        inner.header().reaper_heartbeat_ns.store(now_ns, Release);
        self.sessions.scan_started(now_ns);
        if let Some(watcher) = &mut self.watcher {
            watcher.collect_fired();
        }
        // The first scan is a round too (`scans_since_round` starts at MAX).
        let moved = self
            .watcher
            .as_ref()
            .map_or(true, ExitWatcher::take_locks_moved);
        self.locks.start_scan(moved, now_ns);
        Ok(())
    }

    /// The clear this scan carries out, if one is requested and not yet
    /// served or queued; a reset if one was requested with it.
    fn pending_clear(&mut self) -> Option<PendingClear> {
        let header = self.table.memory.header();
        let ticket = header.clear_requested.load(Acquire);
        let served = header
            .clear_completed
            .load(Acquire)
            .max(header.clear_expired.load(Acquire));
        if ticket <= served.max(self.clear_issued) {
            return None;
        }
        // A reset's count is raised before its ticket: seen with the ticket.
        let resets = header.reset_requested.load(Acquire);
        let reset = resets > self.resets_served;
        self.resets_served = resets;
        Some(PendingClear { ticket, reset })
    }

    /// Judges every slot, recording what ended (and corrupt slots).
    fn sweep(&mut self, now_ns: u64, report: &mut ScanReport) {
        let inner = self.table.memory.clone();
        let marked_words = self.marked_words();
        let mut held_words = HashSet::new();
        self.sessions.refresh_regions(&mut self.regions);
        for index in 0..inner.capacity {
            let slot = inner.slot(index);
            let state = slot.state.load(Acquire);
            let (generation, phase) = protocol::split_state(state);
            let queued = &mut self.in_flight[index as usize];
            if *queued != 0 {
                if state == protocol::state_word(queued.wrapping_sub(1), LIVE) {
                    continue; // its drop is running on the handler thread
                }
                *queued = 0;
            }
            match phase {
                FREE => continue,
                LIVE => {}
                CLAIMING => {
                    self.free_orphaned_claim(slot, generation);
                    continue;
                }
                _ => {
                    report.corrupt_slots += 1;
                    continue;
                }
            }
            let flags = slot.flags.load(Relaxed);
            let remote = flags & FLAG_REMOTE != 0;
            // The region a session's client beats in, and whether to pull it.
            let region = remote
                .then(|| self.regions.get(index, generation))
                .flatten()
                .map(|(region, pull)| (region.clone(), pull));
            if region.is_none() && flags & FLAG_REGION_DEATH_WORD != 0 {
                // Noted by a reaper before this one: no region of this one
                // speaks for it, nothing sees its death as it begins.
                slot.flags.fetch_and(!FLAG_REGION_DEATH_WORD, Relaxed);
            }
            let dying = self
                .newly_dying(index, slot, generation, now_ns, &mut held_words)
                .or_else(|| {
                    let region = region.as_ref().map(|(region, _)| &**region);
                    self.newly_dying_session(index, slot, generation, now_ns, region)
                });
            if let Some(event) = dying {
                log_dying(&inner.name, &event);
                report.dying.push(event);
            }
            let pulled = region.is_some_and(|(region, pull)| {
                pull && self.sessions.pull(&region, index, generation, now_ns)
            });
            match self.judge(index, slot, generation, now_ns, report.reset, pulled) {
                Verdict::Keep => {}
                Verdict::Corrupt => report.corrupt_slots += 1,
                Verdict::Ended { reason, silent_ns } => {
                    let last_beat = protocol::final_beat(slot);
                    let event = drop_event(slot, index, generation, reason, silent_ns, last_beat);
                    log_ended(&inner.name, &event);
                    if remote {
                        self.sessions.ended(index, generation);
                    }
                    if reason.is_eviction() {
                        metrics::observe_eviction(inner.header(), silent_ns);
                    }
                    report.ended.push(event);
                }
            }
        }
        self.free_dead_words(&marked_words, &held_words);
    }

    /// Runs (inline) or queues (on the handler threads) the drops of what
    /// ended, then the clear's handlers.
    fn dispatch(&mut self, report: &mut ScanReport, clear: Option<PendingClear>) {
        if let Some(watcher) = &mut self.watcher {
            for event in &report.ended {
                watcher.forget(event.slot);
            }
        }
        let name = &self.table.memory.name;
        match &mut self.handlers {
            Dispatch::Inline(handlers) => {
                for event in &report.dying {
                    report.handler_failures += handlers.report_dying(event);
                }
                for event in &report.ended {
                    report.handler_failures += handlers.drop_registration(event);
                }
                if let Some(clear) = clear {
                    report.handler_failures += handlers.complete_clear(clear.ticket);
                }
            }
            Dispatch::Pool(pool) => {
                for event in &report.dying {
                    queue(pool, Job::Dying(event.clone()), name);
                }
                for event in &report.ended {
                    self.in_flight[event.slot as usize] = event.generation.wrapping_add(1);
                    queue(pool, Job::Drop(event.clone()), name);
                }
                if let Some(clear) = clear {
                    queue(pool, Job::Clear(clear.ticket), name);
                    self.clear_issued = clear.ticket;
                }
                pool.check_overdue();
            }
        }
    }

    /// Counts the scan and records its duration for status and metrics.
    fn finish_scan(&mut self, report: &ScanReport, started_ns: u64) {
        self.locks.end_scan();
        let header = self.table.memory.header();
        header.scans.fetch_add(1, Relaxed);
        header
            .corrupt_slots
            .store(u64::from(report.corrupt_slots), Relaxed);
        let duration_ns = monotonic_ns().saturating_sub(started_ns);
        header.last_scan_duration_ns.store(duration_ns, Relaxed);
        metrics::observe_scan(header, duration_ns);
    }

    /// One scan now, on the table's clock. A scan due more than `T/2`
    /// ago (this reaper did not run: stopped, starved, its host frozen)
    /// judges no silence before now: every live registration has the reap
    /// timeout from now (a busy one its progress timeout), while a process
    /// gone is still seen at once.
    ///
    /// # Errors
    ///
    /// As [`Reaper::scan_once`].
    pub fn scan(&mut self) -> Result<ScanReport> {
        let now_ns = self.table.clock.now_ns();
        let threshold = absence_threshold(Duration::from_nanos(self.timeout_ns));
        let last_ns = self.last_scan_ns.unwrap_or(0);
        if let Some(gap) = self.sessions.absence().note_gap(last_ns, now_ns, threshold) {
            log::warn!(
                "table '{}': the reaper did not run for {:.3}s (stopped or starved, or its host paused): silence before now is not counted; every live registration has {:?} from now",
                self.table.memory.name,
                gap.as_secs_f64(),
                Duration::from_nanos(self.timeout_ns)
            );
        }
        self.scan_once(now_ns)
    }
}

/// Queues a job; a thread that cannot be started leaves it to the running
/// threads (logged: drops are then slower, never lost).
fn queue(pool: &HandlerPool, job: Job, table: &str) {
    if let Err(e) = pool.send(job) {
        log::warn!("table '{table}': cannot start a handler thread ({e}): the drop waits for a running one");
    }
}

/// A clear a scan carries out: its ticket, and whether it is a reset.
#[derive(Clone, Copy)]
struct PendingClear {
    ticket: u64,
    reset: bool,
}

/// One line per ended registration, at info: what ended, whose, why, and
/// after how much silence (for the operator reading the reaper's log).
fn log_ended(table: &str, event: &DropEvent) {
    let label = if event.label.is_empty() {
        String::new()
    } else {
        format!("{}, ", event.label)
    };
    let line = format_args!(
        "table '{table}': instance {} ({label}pid {}, slot {}) ended: {} after {:.3}s silent",
        event.instance_id,
        event.pid,
        event.slot,
        event.reason,
        event.silent_for.as_secs_f64()
    );
    if event.remote {
        // A session can be opened and dropped in a loop by any peer the
        // listener lets in: a burst of lines a second, then a count.
        limited_log!(per_second: REMOTE_ENDINGS_LOGGED, log::Level::Info, "{line}");
    } else {
        log::info!("{line}");
    }
}

/// Lines a second about sessions' endings, past which they are counted.
const REMOTE_ENDINGS_LOGGED: u64 = 32;

fn log_dying(table: &str, event: &DropEvent) {
    let line = format_args!(
        "table '{table}': instance {} (pid {}, slot {}) dying: its process began to exit",
        event.instance_id, event.pid, event.slot
    );
    if event.remote {
        // A session's client may forge its death word, in a loop of
        // sessions: a burst of lines a second, then a count, as endings.
        limited_log!(per_second: REMOTE_DYINGS_LOGGED, log::Level::Info, "{line}");
    } else {
        log::info!("{line}");
    }
}

/// Lines a second about sessions' dying, past which they are counted.
const REMOTE_DYINGS_LOGGED: u64 = 32;

/// The event of slot `index`'s registration of `generation`, ending for
/// `reason` after `silent_ns`, whose last beat word said `last_beat`.
pub(super) fn drop_event(
    slot: &Slot,
    index: u32,
    generation: u32,
    reason: Reason,
    silent_ns: u64,
    last_beat: Beat,
) -> DropEvent {
    let registered_ns = slot.registered_ns.load(Relaxed);
    let last_heartbeat_ns = match last_beat {
        Beat::At(stamp) => Some(stamp.ns_near(registered_ns)),
        _ => None,
    };
    DropEvent {
        instance_id: slot.instance_id.load(Relaxed),
        slot: index,
        generation,
        reason,
        pid: slot.pid.load(Relaxed),
        remote: slot.flags.load(Relaxed) & FLAG_REMOTE != 0,
        label: slot.load_label(),
        registered_ns,
        last_heartbeat_ns,
        silent_for: Duration::from_nanos(silent_ns),
    }
}
