//! A registrant's death seen as it begins: a thread waits (`futex_waitv`)
//! on the death words of the processes registered in the table (one word
//! per process, however many registrations it holds; see
//! `table/death_words.rs`) and wakes the reaper the moment the kernel marks
//! one `OWNER_DIED`, at the start of the process's exit; the scan then
//! reports its registrations dying. The pidfd and lock exit watch stays:
//! it says when the process has ended, and it is all there is where a
//! process has no death word (a table made before them, a kernel or
//! seccomp profile without `set_robust_list`, a session). Where
//! `futex_waitv` is refused (Linux before 5.16), the thread ends and scans
//! still find marked words at their own pace.

use crate::os::robust::{self, Waited, WAITV_MAX};
use crate::sync::Ordering::{Acquire, Release};
use crate::table::death_protocol;
use crate::table::memory::TableMemory;
use std::collections::HashSet;
use std::sync::atomic::AtomicU32;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// How long the thread sleeps at most between looks at the words (new
/// processes wake it at once through the table's wake word).
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// The death watch thread of a reaper.
pub(crate) struct DeathWatch {
    stop: Arc<AtomicU32>,
    thread: Option<JoinHandle<()>>,
}

impl DeathWatch {
    /// Starts watching `memory`'s death words; `None` for a table without
    /// them, or a thread that could not start.
    pub(crate) fn start(memory: Arc<TableMemory>) -> Option<DeathWatch> {
        memory.death_words.as_ref()?;
        let stop = Arc::new(AtomicU32::new(0));
        let stopped = stop.clone();
        let thread = std::thread::Builder::new()
            .name("livereg-dying".into())
            .spawn(move || watch(&memory, &stopped))
            .ok()?;
        Some(DeathWatch {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for DeathWatch {
    fn drop(&mut self) {
        self.stop.store(1, Release);
        // A private word: only this process's thread waits on it.
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
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Waits on every live process word (with `WAITERS` set, so the kernel
/// wakes the waiter when it marks it), the table's wake word (a process
/// that registers or leaves bumps it) and the stop word; wakes the reaper
/// once for each word found marked.
fn watch(memory: &TableMemory, stop: &AtomicU32) {
    let mut told: HashSet<u32> = HashSet::new();
    while stop.load(Acquire) == 0 {
        // Nothing truncated under the table's handles is touched: the
        // watch ends, and scans (which check too) go on without it.
        let Some(words) = memory.death_words() else {
            return;
        };
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
        for index in 0..words.capacity() {
            let word = &words.process(index).word;
            if death_protocol::is_marked(word) {
                marked |= told.insert(index);
                continue;
            }
            // Free, or alive (again: a word given back may be claimed by
            // the next process between two looks): its marking is news.
            told.remove(&index);
            if word.load(Acquire) == 0 || waited.len() == WAITV_MAX {
                continue; // (past the most one wait takes: the scans' pace)
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
