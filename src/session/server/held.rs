//! What a reaper shares with its listeners: which session registrations a
//! live connection holds, and when each client was last heard (the others
//! are waiting for their client to come back, and time out
//! `Disconnected`), and the records beside the table.

use super::records::Records;
use super::region_pull::Puller;
use crate::absence::Absence;
use crate::table::handle::Table;
use crate::table::protocol::Gone;
use crate::table::region::SharedRegion;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

/// Shared by a reaper and its listeners.
#[derive(Default)]
pub(crate) struct Held {
    /// `(slot, generation)` of every registration a connection holds, with
    /// when its client was last heard.
    holding: Mutex<HashMap<(u32, u32), LastHeard>>,
    records: OnceLock<Records>,
    /// When a listener last went round its loop (the latest of them), on
    /// the table's clock: the reaper leaves a held session's silence to its
    /// listener while the listener runs.
    listener_ran_ns: AtomicU64,
    /// When the reaper or a listener came back from not running.
    absence: Absence,
    /// Up to when the listeners have applied what their clients sent (the
    /// latest of them): a held session's progress is judged up to there.
    caught_up_ns: AtomicU64,
    /// The regions shared with `unix:` clients of protocol 4, by the
    /// registration `(slot, generation)` they beat for: kept from the
    /// welcome until the reaper has seen the registration end (after its
    /// connection closed: its death word says whether it died first), for
    /// the client's reclaim and the reaper's dying.
    regions: Mutex<HashMap<(u32, u32), Arc<HeldRegion>>>,
    /// Bumped (and woken) when a region is added or dropped: the region
    /// watch looks again.
    pub(crate) regions_changed: AtomicU32,
    /// Bumped when the reaper has seen a remote registration end: the
    /// listeners then look at every session's end at their next tick
    /// (otherwise every `T/4`: a session beating in a region costs a
    /// listener nothing between).
    ended: AtomicU64,
    /// Bumped whenever a registration is held or let go, or a region
    /// shared, dropped or no longer beaten in: the reaper's
    /// [`RegionsBySlot`] is made again only then.
    changes: AtomicU64,
}

/// The regions by slot, as the reaper reads them at each scan: made again
/// from [`Held`] only when it changed, so a scan finds a slot's region by
/// its index, with no lock and no hash.
#[derive(Default)]
pub(crate) struct RegionsBySlot {
    /// The [`Held::changes`] it was made at (`None`: never made).
    made_at: Option<u64>,
    slots: Vec<Option<SlotRegion>>,
}

/// The region of one slot's registration.
struct SlotRegion {
    generation: u32,
    region: Arc<HeldRegion>,
    /// Whether to pull it: a connection holds the registration, and its
    /// client beats in the region.
    pull: bool,
}

impl RegionsBySlot {
    /// The region shared for registration `(index, generation)`, and
    /// whether to pull it.
    pub(crate) fn get(&self, index: u32, generation: u32) -> Option<(&Arc<HeldRegion>, bool)> {
        match self.slots.get(index as usize) {
            Some(Some(slot)) if slot.generation == generation => Some((&slot.region, slot.pull)),
            _ => None,
        }
    }
}

/// A region shared with a session's client, and whether the reaper has
/// reported its registration dying (kept here, never in the region, which
/// is the client's to write).
pub(crate) struct HeldRegion {
    pub region: SharedRegion,
    pub dying_reported: AtomicBool,
    /// Whether its client beats there (cleared when it beats with frames
    /// instead: then nothing is pulled from it).
    pub beats_in_region: AtomicBool,
    /// Its pulls into the table (`region_pull.rs`).
    puller: Puller,
    /// When it was shared: its client's death thread claims its word just
    /// after, and the region watch looks for that claim often until then.
    pub shared_at: std::time::Instant,
}

impl HeldRegion {
    /// Brings what its client wrote there into registration `(index,
    /// generation)`'s slot of `table` (see `region_pull.rs`).
    ///
    /// # Errors
    ///
    /// [`Gone`] if the registration has ended (its slot left as it is).
    pub(crate) fn pull(
        &self,
        table: &Table,
        index: u32,
        generation: u32,
        now_ns: u64,
    ) -> Result<(), Gone> {
        self.puller
            .pull(&self.region, table, index, generation, now_ns)
    }
}

impl std::fmt::Debug for HeldRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldRegion")
            .field("beats_in_region", &self.beats_in_region)
            .field("dying_reported", &self.dying_reported)
            .finish_non_exhaustive()
    }
}

/// When a held registration's client was last heard (a frame), on the
/// table's clock: written by its connection at every frame without a lock,
/// read by the reaper.
#[derive(Clone, Debug)]
pub(crate) struct LastHeard(Arc<AtomicU64>);

impl LastHeard {
    fn new(now_ns: u64) -> LastHeard {
        LastHeard(Arc::new(AtomicU64::new(now_ns)))
    }

    /// The client was heard at `now_ns`.
    pub(crate) fn at(&self, now_ns: u64) {
        self.0.store(now_ns, Relaxed);
    }

    /// When the client was last heard.
    pub(crate) fn last(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

impl Held {
    /// When the client of registration `(index, generation)` was last
    /// heard, if a connection of this reaper holds it.
    pub(crate) fn heard(&self, index: u32, generation: u32) -> Option<u64> {
        self.lock().get(&(index, generation)).map(LastHeard::last)
    }

    /// Marks a registration just made held, its client heard at `now_ns`:
    /// the clock its connection keeps.
    pub(crate) fn hold(&self, index: u32, generation: u32, now_ns: u64) -> LastHeard {
        let heard = LastHeard::new(now_ns);
        self.lock().insert((index, generation), heard.clone());
        self.note_changed();
        heard
    }

    /// Marks a registration a client takes back held, as [`Held::hold`];
    /// `None` if a connection holds it already.
    pub(crate) fn hold_if_free(
        &self,
        index: u32,
        generation: u32,
        now_ns: u64,
    ) -> Option<LastHeard> {
        use std::collections::hash_map::Entry;
        let held = match self.lock().entry((index, generation)) {
            Entry::Occupied(_) => None,
            Entry::Vacant(entry) => Some(entry.insert(LastHeard::new(now_ns)).clone()),
        };
        self.note_changed();
        held
    }

    pub(crate) fn let_go(&self, index: u32, generation: u32) {
        self.lock().remove(&(index, generation));
        self.note_changed();
    }

    /// Something [`RegionsBySlot`] is made of changed.
    pub(crate) fn note_changed(&self) {
        self.changes.fetch_add(1, Relaxed);
    }

    /// Makes `by_slot` again if anything it is made of changed since.
    pub(crate) fn refresh(&self, by_slot: &mut RegionsBySlot, capacity: u32) {
        // Read first: a change during the making is seen at the next.
        let changes = self.changes.load(Relaxed);
        if by_slot.made_at == Some(changes) {
            return;
        }
        let holding = self.lock();
        let regions = self.regions_lock();
        by_slot.slots.clear();
        by_slot.slots.resize_with(capacity as usize, || None);
        for (&(index, generation), region) in regions.iter() {
            if let Some(entry) = by_slot.slots.get_mut(index as usize) {
                *entry = Some(SlotRegion {
                    generation,
                    region: region.clone(),
                    pull: holding.contains_key(&(index, generation))
                        && region.beats_in_region.load(Relaxed),
                });
            }
        }
        by_slot.made_at = Some(changes);
    }

    /// A listener went round its loop at `now_ns`; a gap since the last
    /// round of any listener past `threshold` is an absence (returned).
    pub(crate) fn listener_ran(&self, now_ns: u64, threshold: Duration) -> Option<Duration> {
        let last = self.listener_ran_ns.fetch_max(now_ns, Relaxed);
        self.absence.note_gap(last, now_ns, threshold)
    }

    /// A listener has applied everything its clients sent before `now_ns`.
    pub(crate) fn caught_up(&self, now_ns: u64) {
        self.caught_up_ns.fetch_max(now_ns, Relaxed);
    }

    /// Up to when a held registration's beats are surely applied: the
    /// listeners' latest catch-up, never later than `now_ns`.
    pub(crate) fn applied_until(&self, now_ns: u64) -> u64 {
        self.caught_up_ns.load(Relaxed).min(now_ns)
    }

    /// What the reaper and its listeners know of their own absences.
    pub(crate) fn absence(&self) -> &Absence {
        &self.absence
    }

    /// When a listener last went round its loop (0: never).
    pub(crate) fn listener_last_ran(&self) -> u64 {
        self.listener_ran_ns.load(Relaxed)
    }

    /// Shares `region` for registration `(index, generation)`; `None` (the
    /// session beats with frames) when regions are as many as `most`: a
    /// listener's regions are bounded by the table's capacity, one per
    /// registration.
    pub(crate) fn share_region(
        &self,
        index: u32,
        generation: u32,
        most: usize,
        region: SharedRegion,
    ) -> Option<Arc<HeldRegion>> {
        let held = Arc::new(HeldRegion {
            region,
            dying_reported: AtomicBool::new(false),
            beats_in_region: AtomicBool::new(true),
            puller: Puller::default(),
            shared_at: std::time::Instant::now(),
        });
        {
            let mut regions = self.regions_lock();
            if regions.len() >= most && !regions.contains_key(&(index, generation)) {
                return None;
            }
            regions.insert((index, generation), held.clone());
        }
        self.note_regions_changed();
        Some(held)
    }

    /// The region shared for registration `(index, generation)`, if any.
    pub(crate) fn region(&self, index: u32, generation: u32) -> Option<Arc<HeldRegion>> {
        self.regions_lock().get(&(index, generation)).cloned()
    }

    /// Every region shared now, with its registration.
    pub(crate) fn regions(&self) -> Vec<((u32, u32), Arc<HeldRegion>)> {
        self.regions_lock()
            .iter()
            .map(|(key, region)| (*key, region.clone()))
            .collect()
    }

    /// Drops the region of registration `(index, generation)`: it ended.
    pub(crate) fn forget_region(&self, index: u32, generation: u32) {
        if self.regions_lock().remove(&(index, generation)).is_some() {
            self.note_regions_changed();
        }
    }

    /// The reaper has seen a remote registration end.
    pub(crate) fn note_ended(&self) {
        self.ended.fetch_add(1, Relaxed);
    }

    /// How many times [`Held::note_ended`] was called: a change since a
    /// listener's last look is news of an end.
    pub(crate) fn ends_seen(&self) -> u64 {
        self.ended.load(Relaxed)
    }

    fn note_regions_changed(&self) {
        self.note_changed();
        self.regions_changed.fetch_add(1, Relaxed);
        crate::os::futex::wake_all(&self.regions_changed);
    }

    fn regions_lock(&self) -> MutexGuard<'_, HashMap<(u32, u32), Arc<HeldRegion>>> {
        self.regions
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// How many registrations connections hold.
    pub(crate) fn count(&self) -> usize {
        self.lock().len()
    }

    /// The table's session records, opened on first use.
    ///
    /// # Errors
    ///
    /// The file beside the table could not be opened or made.
    pub(crate) fn records(&self, table: &Table) -> std::io::Result<&Records> {
        if let Some(records) = self.records.get() {
            return Ok(records);
        }
        let opened = Records::open(table)?;
        Ok(self.records.get_or_init(|| opened))
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<(u32, u32), LastHeard>> {
        self.holding
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(all(test, not(miri)))]
mod tests {
    use super::*;

    #[test]
    fn regions_are_bounded_by_the_most_given_and_a_forgotten_one_frees_room() {
        let held = Held::default();
        let region = || SharedRegion::create().unwrap();
        assert!(held.share_region(0, 1, 2, region()).is_some());
        assert!(held.share_region(1, 1, 2, region()).is_some());
        assert!(held.share_region(2, 1, 2, region()).is_none(), "past the bound");
        assert!(held.region(2, 1).is_none());
        let changed = held.regions_changed.load(Relaxed);
        held.forget_region(0, 1);
        assert_ne!(held.regions_changed.load(Relaxed), changed, "the watch is told");
        assert!(held.region(0, 1).is_none());
        assert!(held.share_region(2, 1, 2, region()).is_some());
        assert_eq!(held.regions().len(), 2);
    }
}
