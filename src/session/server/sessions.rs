//! The one seam between a reaper and its sessions: the reaper knows only
//! that a registration is remote, and asks this object how long it has
//! been silent and against what budget; this object owns the listeners
//! (started, added and stopped here) and what they share.

use super::held::{Held, HeldRegion, RegionsBySlot};
use super::listener::{ListenConfig, Listener};
use super::refusals::SessionRefusals;
use super::region_watch::RegionWatch;
use crate::clock::duration_ns;
use crate::error::Result;
use crate::event::Reason;
use crate::absence::Absence;
use crate::session::timing::{listener_stale_after, unheard_allowance, STALE_SCANS_MAX};
use crate::table::handle::Table;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};

/// A reaper's sessions: its listeners, which registrations they hold, and
/// whether they run.
pub(crate) struct Sessions {
    /// Stopped first when the last holder lets go (declared first).
    listeners: Mutex<Vec<Listener>>,
    table: Table,
    held: Arc<Held>,
    /// Handshakes its listeners refused.
    refusals: SessionRefusals,
    /// When the reaper started, on the table clock: a registration no
    /// connection holds (its client is away, perhaps reconnecting after a
    /// restart) has the reap timeout from then at least to be reclaimed.
    started_ns: u64,
    /// How many scans in a row found no listener going round its loop
    /// lately: from two on, the reaper judges held sessions' silence itself
    /// (one is not enough: after the process was stopped, the reaper may
    /// scan before the listener has run).
    stale_scans: AtomicU32,
    /// Waits on the death words of the regions shared with clients.
    region_watch: Mutex<Option<RegionWatch>>,
}

/// A remote registration's silence as its slot tells it: its last signal
/// (on the reaper's clock), the budget it is judged by, and the reason an
/// eviction would give.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SlotSilence {
    /// Whether its client's region was pulled into the slot this scan.
    pub pulled: bool,
    pub last_signal: u64,
    pub budget_ns: u64,
    pub timed_reason: Reason,
}

/// A remote registration's silence as the reaper is to judge it: since
/// when, against what budget, for what reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Judged {
    pub since_ns: u64,
    pub budget_ns: u64,
    pub reason: Reason,
}

impl Sessions {
    /// Starts a listener for each of `configs`, serving `table`'s sessions.
    ///
    /// # Errors
    ///
    /// As [`Listener::start`]; no listener is left running then.
    pub(crate) fn start(table: &Table, configs: Vec<ListenConfig>) -> Result<Arc<Sessions>> {
        let sessions = Arc::new(Sessions {
            listeners: Mutex::new(Vec::new()),
            table: table.clone(),
            held: Arc::new(Held::default()),
            refusals: SessionRefusals::default(),
            started_ns: table.clock.now_ns(),
            stale_scans: AtomicU32::new(0),
            region_watch: Mutex::new(None),
        });
        for config in configs {
            sessions.listen(config)?;
        }
        Ok(sessions)
    }

    /// Also serves sessions as `config` says, until [`Sessions::stop`].
    ///
    /// # Errors
    ///
    /// As [`Listener::start`].
    pub(crate) fn listen(&self, config: ListenConfig) -> Result<()> {
        if matches!(config.address, crate::session::address::Address::Unix(_)) {
            let mut watch = self
                .region_watch
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            if watch.is_none() {
                *watch = RegionWatch::start(self.table.clone(), self.held.clone());
            }
        }
        let listener = Listener::start(
            self.table.clone(),
            config,
            self.held.clone(),
            self.refusals.clone(),
        )?;
        self.listeners().push(listener);
        Ok(())
    }

    /// Up to when remote registration `(index, generation)`'s progress can
    /// be judged at `now_ns`: held by a connection, only up to what its
    /// listener has applied (after this process was stopped, the beats
    /// wait in the sockets until the listener reads them); else (when its
    /// region was pulled this scan, or no listener has run for two scans)
    /// `now_ns`.
    pub(crate) fn progress_known_until(
        &self,
        index: u32,
        generation: u32,
        pulled: bool,
        now_ns: u64,
    ) -> u64 {
        let listeners_run = self.stale_scans.load(Relaxed) < STALE_SCANS_MAX;
        if pulled || !listeners_run {
            return now_ns;
        }
        match self.held.heard(index, generation) {
            Some(_) => self.held.applied_until(now_ns),
            None => now_ns,
        }
    }

    /// Makes `by_slot` (the reaper's, read at each scan) again if the
    /// sessions' regions or holders changed since.
    pub(crate) fn refresh_regions(&self, by_slot: &mut RegionsBySlot) {
        self.held.refresh(by_slot, self.table.capacity());
    }

    /// At the reaper's scan: brings what the client of remote registration
    /// `(index, generation)` wrote in `region` into the slot (see
    /// `region_pull.rs`). Whether it did: the slot then says when its
    /// client last beat, and is judged as a table registration is.
    pub(crate) fn pull(&self, region: &HeldRegion, index: u32, generation: u32, now_ns: u64) -> bool {
        region.pull(&self.table, index, generation, now_ns).is_ok()
    }

    /// What the reaper and its listeners know of their own absences.
    pub(crate) fn absence(&self) -> &Absence {
        self.held.absence()
    }

    /// What its listeners refused, counted as they refuse.
    pub(crate) fn refusals(&self) -> SessionRefusals {
        self.refusals.clone()
    }

    /// Closes every listener and its connections; their registrations stay,
    /// for their clients to reclaim from the next reaper.
    pub(crate) fn stop(&self) {
        self.listeners().clear();
        drop(
            self.region_watch
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .take(),
        );
    }

    /// Whether the client beating in `region` began to die (the kernel
    /// marked its death word) and this is the first time it is asked:
    /// reported once.
    pub(crate) fn newly_dying(&self, region: &HeldRegion) -> bool {
        crate::table::death_protocol::is_marked(region.region.death_word())
            && !region.dying_reported.swap(true, Relaxed)
    }

    /// Remote registration `(index, generation)` ended: the region its
    /// client beat in is let go, and the listeners look at their sessions'
    /// ends at their next tick.
    pub(crate) fn ended(&self, index: u32, generation: u32) {
        self.held.forget_region(index, generation);
        self.held.note_ended();
    }

    /// At the start of each scan: whether the listeners run.
    pub(crate) fn scan_started(&self, now_ns: u64) {
        let stale_ns = duration_ns(listener_stale_after(self.table.reap_timeout()));
        let quiet_ns = now_ns.saturating_sub(self.held.listener_last_ran());
        if self.held.count() > 0 && quiet_ns > stale_ns {
            self.stale_scans.fetch_add(1, Relaxed);
        } else {
            self.stale_scans.store(0, Relaxed);
        }
    }

    /// How the reaper is to judge remote registration `(index,
    /// generation)`'s silence. Held by a connection whose client beats in
    /// a region pulled this scan, as a table registration (by the stamp
    /// its client wrote). Held by another connection, its listener ends it
    /// when the connection closes, when its client says its engine went
    /// silent, or when the client goes unheard: the listener has the last
    /// word on silence, since only it can read what the client sent (after
    /// this process was stopped, the beats wait in the sockets); the reaper
    /// backs it up only when no listener has run for two scans, timing the
    /// silence from when the client was last heard and allowing what the
    /// listener allows (its last pings may not have left a stopped
    /// process). Held by none, it awaits its client's reclaim, for the reap
    /// timeout (never the grace, even unbeaten) from its last beat or from
    /// this reaper's start, whichever is later; past it, its client did not
    /// come back (`disconnected`).
    pub(crate) fn judge_remote(
        &self,
        index: u32,
        generation: u32,
        slot: SlotSilence,
        now_ns: u64,
    ) -> Judged {
        let allowance = duration_ns(unheard_allowance(self.table.reap_timeout()));
        let absence = self.held.absence();
        let listeners_run = self.stale_scans.load(Relaxed) < STALE_SCANS_MAX;
        let timed = slot.timed_reason == Reason::Timeout;
        if slot.pulled {
            // Its stamp is its client's own, pulled this scan.
            return Judged {
                since_ns: slot.last_signal,
                budget_ns: slot.budget_ns,
                reason: slot.timed_reason,
            };
        }
        let (since_ns, budget_ns, reason) = match self.held.heard(index, generation) {
            Some(_) if timed && listeners_run => (now_ns, slot.budget_ns, slot.timed_reason),
            Some(heard_ns) if timed => (
                absence.silent_since(heard_ns),
                slot.budget_ns + allowance,
                slot.timed_reason,
            ),
            Some(_) => (
                slot.last_signal,
                slot.budget_ns + allowance,
                slot.timed_reason,
            ),
            // Its client's reclaim is awaited for the reap timeout, beaten
            // or not (the grace is for a first beat that a live connection
            // will bring; an unheld registration has none).
            None => (
                absence.silent_since(slot.last_signal.max(self.started_ns)),
                duration_ns(self.table.reap_timeout()),
                Reason::Disconnected,
            ),
        };
        Judged {
            since_ns,
            budget_ns,
            reason,
        }
    }

    fn listeners(&self) -> MutexGuard<'_, Vec<Listener>> {
        self.listeners
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
