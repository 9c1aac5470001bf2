//! A registrant's death seen as it begins: threads wait (`futex_waitv`)
//! on the death words of the processes registered in the table (one word
//! per process, however many registrations it holds; see
//! `table/death_words.rs`) and wake the reaper the moment the kernel marks
//! one `OWNER_DIED`, at the start of the process's exit; the scan then
//! reports its registrations dying. One call waits on at most 128 words,
//! two of them the thread's stop word and the table's wake word: each
//! thread watches a range of [`WORDS_PER_THREAD`] process words, the first
//! range from the start, and the first thread starts one more for each
//! further range once a process holds a word in it (they stay until the
//! reaper ends). The pidfd and lock exit watch stays: it says when the
//! process has ended, and it is all there is where a process has no death
//! word (a table made before them, a kernel or seccomp profile without
//! `set_robust_list`, a session over `tcp://`; a `unix:` session's word is
//! in its region, watched by `session/server/region_watch.rs`). Where
//! `futex_waitv` is refused (Linux before 5.16), or a thread cannot start,
//! scans still find marked words at their own pace.

use crate::os::robust::{self, Waited, WAITV_MAX};
use crate::sync::Ordering::{Acquire, Relaxed, Release};
use crate::table::death_protocol;
use crate::table::death_words::DeathWords;
use crate::table::memory::TableMemory;
use std::collections::HashSet;
use std::ops::Range;
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// How long a thread sleeps at most between looks at its words (new
/// processes wake it at once through the table's wake word).
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// The process words one thread waits on: all one `futex_waitv` takes but
/// the stop and wake words.
pub(crate) const WORDS_PER_THREAD: u32 = WAITV_MAX as u32 - 2;

/// The threads after the first, one per further range of words.
type More = Mutex<Vec<JoinHandle<()>>>;

/// The death watch threads of a reaper.
pub(crate) struct DeathWatch {
    stop: Arc<AtomicU32>,
    first: Option<JoinHandle<()>>,
    more: Arc<More>,
}

impl DeathWatch {
    /// Starts watching `memory`'s death words; `None` for a table without
    /// them, or a thread that could not start.
    pub(crate) fn start(memory: Arc<TableMemory>) -> Option<DeathWatch> {
        memory.death_words.as_ref()?;
        let stop = Arc::new(AtomicU32::new(0));
        let more = Arc::new(More::default());
        let first = spawn(memory, stop.clone(), 0, Some(more.clone()))?;
        Some(DeathWatch {
            stop,
            first: Some(first),
            more,
        })
    }
}

impl Drop for DeathWatch {
    fn drop(&mut self) {
        self.stop.store(1, Release);
        // A private word: only this process's threads wait on it.
        // SAFETY: `stop` is a live, aligned atomic; FUTEX_WAKE does not
        // access it.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                self.stop.as_ptr(),
                libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
                i32::MAX,
            )
        };
        // The first thread starts the others: once it has ended, they are
        // all in the list.
        if let Some(first) = self.first.take() {
            let _ = first.join();
        }
        let more = std::mem::take(&mut *self.more.lock().unwrap_or_else(|p| p.into_inner()));
        for thread in more {
            let _ = thread.join();
        }
    }
}

/// Starts the thread watching the range of words from `first` (and, given
/// `more`, starting the threads of further ranges).
fn spawn(
    memory: Arc<TableMemory>,
    stop: Arc<AtomicU32>,
    first: u32,
    more: Option<Arc<More>>,
) -> Option<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("livereg-dying".into())
        .spawn(move || watch(&memory, &stop, first, more.as_deref()))
        .ok()
}

/// Waits on every live process word of its range (with `WAITERS` set, so
/// the kernel wakes the waiter when it marks it), the table's wake word (a
/// process that registers or leaves bumps it) and the stop word; wakes the
/// reaper once for each word found marked. The first thread (given
/// `more`) also starts a thread for each further range a process holds a
/// word in.
fn watch(memory: &Arc<TableMemory>, stop: &Arc<AtomicU32>, first: u32, more: Option<&More>) {
    let mut told: HashSet<u32> = HashSet::new();
    while stop.load(Acquire) == 0 {
        // Nothing truncated under the table's handles is touched: the
        // watch ends, and scans (which check too) go on without it.
        let Some(words) = memory.death_words() else {
            return;
        };
        if let Some(more) = more {
            cover(memory, stop, words, more);
        }
        let wake = &memory.header().wake;
        let mut waited = vec![
            Waited {
                word: stop,
                expected: 0,
                shared: false,
            },
            Waited {
                word: wake,
                expected: wake.load(Acquire),
                shared: true,
            },
        ];
        let (mut marked, mut changed) = (false, false);
        for index in range(words, first) {
            let word = &words.process(index).word;
            if death_protocol::is_marked(word) {
                marked |= told.insert(index);
                continue;
            }
            // Free, or alive (again: a word given back may be claimed by
            // the next process between two looks): its marking is news.
            told.remove(&index);
            if word.load(Acquire) == 0 {
                continue;
            }
            match death_protocol::wait_on(word) {
                Some(expected) => waited.push(Waited {
                    word,
                    expected,
                    shared: true,
                }),
                None => changed = true, // marked or given back just now
            }
        }
        if marked {
            memory.wake_reaper();
        }
        if marked || changed {
            continue;
        }
        if robust::wait_any(&waited, LOOK_EVERY).is_err() {
            return;
        }
    }
}

/// The words of the range from `first`: [`WORDS_PER_THREAD`] of them, or
/// fewer at the end.
fn range(words: &DeathWords, first: u32) -> Range<u32> {
    first..first.saturating_add(WORDS_PER_THREAD).min(words.capacity())
}

/// Starts a thread for each range, past those watched, up to the last that
/// holds a word in use (words are claimed lowest first, so the ranges in
/// use are the first few). One that cannot start leaves its range to the
/// scans.
fn cover(memory: &Arc<TableMemory>, stop: &Arc<AtomicU32>, words: &DeathWords, more: &More) {
    let mut more = more.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let watched = |more: &Vec<JoinHandle<()>>| (more.len() as u32 + 1) * WORDS_PER_THREAD;
    let Some(last) = (watched(&more)..words.capacity())
        .rev()
        .find(|&index| words.process(index).word.load(Relaxed) != 0)
    else {
        return;
    };
    while watched(&more) <= last {
        match spawn(memory.clone(), stop.clone(), watched(&more), None) {
            Some(thread) => more.push(thread),
            None => return,
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::WORDS_PER_THREAD;
    use crate::table::death_protocol::WAITERS;
    use crate::table::handle::Table;
    use crate::table::options::TableOptions;
    use std::sync::atomic::Ordering::SeqCst;
    use std::time::{Duration, Instant};

    use crate::unit_tables::Named;

    #[test]
    #[cfg_attr(miri, ignore)] // a shared table: Miri's isolation has no /dev/shm
    fn every_word_in_use_is_waited_on_past_the_words_one_wait_takes() {
        let name = Named::new("death-watch");
        let options = TableOptions {
            capacity: 2 * WORDS_PER_THREAD + 10,
            ..TableOptions::default()
        };
        let table = Table::create(&name.0, &options).unwrap();
        // Each opening has a death thread and a word of its own: one
        // process, as the words see it.
        let processes = WORDS_PER_THREAD + 4;
        let openings: Vec<Table> = (0..processes)
            .map(|_| Table::open(&name.0).unwrap())
            .collect();
        let _workers: Vec<crate::Worker> = openings
            .iter()
            .enumerate()
            .map(|(id, opening)| opening.register(id as u64 + 1, "").unwrap())
            .collect();
        let words = table.memory.death_words().unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while (0..processes).any(|index| words.process(index).word.load(SeqCst) == 0) {
            assert!(Instant::now() < deadline, "not every word claimed");
            std::thread::sleep(Duration::from_millis(2));
        }
        let _reaper = table.reaper().build().unwrap();
        let unwaited = || {
            (0..processes)
                .filter(|&index| words.process(index).word.load(SeqCst) & WAITERS == 0)
                .collect::<Vec<_>>()
        };
        while !unwaited().is_empty() {
            assert!(
                Instant::now() < deadline,
                "words no reaper waits on: {:?}",
                unwaited()
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}
