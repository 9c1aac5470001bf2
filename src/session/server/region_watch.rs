//! Sessions' deaths seen as they begin: one thread waits (`futex_waitv`)
//! on the death words in the regions shared with `unix:` clients (see
//! `table/region.rs`) as the reaper's death watch waits on the table's,
//! and wakes the reaper when the kernel marks one: the scan then reports
//! that session's registration dying, before its socket's close ends it.
//!
//! The words are the clients' to write: a word a client forges marked
//! reports its own registration dying, once; a word it keeps changing
//! costs this thread a look a millisecond at most; a word no thread of it
//! holds is never marked. One wait takes at most 126 words: past that many
//! regions, the others' deaths are seen at the scans, and at their close.

use super::held::Held;
use crate::os::robust::{self, Waited, WAITV_MAX};
use crate::sync::Ordering::{Acquire, Release};
use crate::table::death_protocol;
use crate::table::handle::Table;
use std::collections::HashSet;
use std::sync::atomic::AtomicU32;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// How long the thread sleeps at most between looks.
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// How soon a word no death thread holds yet is looked at again, while
/// its region is new.
const UNCLAIMED_LOOK: Duration = Duration::from_millis(20);

/// How long after a region was shared its word is looked at often: its
/// client's death thread claims it just after the welcome (a word not
/// claimed by then is looked at every [`LOOK_EVERY`]).
const CLAIM_EXPECTED_WITHIN: Duration = Duration::from_secs(2);

/// The least time between two looks that did not wait (a word that
/// changed under the look, perhaps a client flipping it).
const LOOK_AGAIN_AFTER: Duration = Duration::from_millis(1);

/// The region watch of a reaper's sessions; stopped when dropped.
pub(crate) struct RegionWatch {
    stop: Arc<AtomicU32>,
    thread: Option<JoinHandle<()>>,
}

impl RegionWatch {
    /// Starts watching the death words of `held`'s regions, waking
    /// `table`'s reaper when one is marked; `None` if the thread cannot
    /// start (the scans still find marked words).
    pub(crate) fn start(table: Table, held: Arc<Held>) -> Option<RegionWatch> {
        let stop = Arc::new(AtomicU32::new(0));
        let stopping = stop.clone();
        let thread = std::thread::Builder::new()
            .name("livereg-dying".into())
            .spawn(move || watch(&table, &held, &stopping))
            .ok()?;
        Some(RegionWatch {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for RegionWatch {
    fn drop(&mut self) {
        self.stop.store(1, Release);
        crate::os::futex::wake_all(&self.stop);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn watch(table: &Table, held: &Held, stop: &AtomicU32) {
    // Regions (by registration) whose mark was told: told once.
    let mut told: HashSet<(u32, u32)> = HashSet::new();
    // Whether the last wait ended before its time (woken, or a word had
    // changed): a round that then finds nothing new rests first, so a
    // client waking or flipping its word cannot make this thread spin.
    let mut cut_short = false;
    // The regions as last listed, and at which change: listed again only
    // when they changed (a client flipping its word makes rounds come
    // often; none of them costs a list of every region).
    let (mut regions, mut listed_at) = (Vec::new(), None);
    while stop.load(Acquire) == 0 {
        let changed = held.regions_changed.load(Acquire);
        if listed_at != Some(changed) {
            regions = held.regions();
            listed_at = Some(changed);
            told.retain(|key| regions.iter().any(|(held, _)| held == key));
        }
        let mut waited = vec![
            Waited {
                word: stop,
                expected: 0,
                shared: true,
            },
            Waited {
                word: &held.regions_changed,
                expected: changed,
                shared: true,
            },
        ];
        let (mut marked, mut unsettled, mut unclaimed) = (false, false, false);
        for (key, region) in &regions {
            if told.contains(key) || waited.len() == WAITV_MAX {
                continue;
            }
            let word = region.region.death_word();
            if death_protocol::is_marked(word) {
                marked |= told.insert(*key);
                continue;
            }
            if word.load(Acquire) & death_protocol::TID_MASK == 0 {
                // No death thread holds it yet (looked at often while one
                // may be about to), or none will (turned off, refused).
                unclaimed |= region.shared_at.elapsed() < CLAIM_EXPECTED_WITHIN;
                continue;
            }
            match death_protocol::wait_on(word) {
                Some(expected) => waited.push(Waited {
                    word,
                    expected,
                    shared: true,
                }),
                None => unsettled = true,
            }
        }
        if marked {
            table.memory.wake_reaper();
            continue;
        }
        if unsettled || cut_short {
            std::thread::sleep(LOOK_AGAIN_AFTER);
            if unsettled {
                continue;
            }
        }
        // A word not yet claimed is looked at again soon: a client's
        // death thread claims it just after its welcome.
        let wait = if unclaimed { UNCLAIMED_LOOK } else { LOOK_EVERY };
        let waiting = std::time::Instant::now();
        match robust::wait_any(&waited, wait) {
            Ok(_) => cut_short = waiting.elapsed() < wait,
            // No futex_waitv (before Linux 5.16): look at a slower pace.
            Err(_) => std::thread::sleep(UNCLAIMED_LOOK),
        }
    }
}
