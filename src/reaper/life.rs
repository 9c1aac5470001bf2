//! The reaper's life word held (see `table/reaper_life.rs`): a small
//! thread of the reaper's process takes the table's life word with its own
//! thread id and hands it to the kernel on its robust list, so that when
//! the process begins to die the kernel marks the word `OWNER_DIED` before
//! tearing anything down, and every process waiting on the table's reaper
//! is woken. A thread of its own, not the one that built the reaper: that
//! thread may end while the reaper serves (a caller-driven reaper moved to
//! another thread), and the reaper must never be reported dying while its
//! process runs.
//!
//! Started once the reaper holds the role and has written its boot token:
//! the thread frees a word a dead reaper left marked (the state then reads
//! `Serving` from the role), writes the token and pid, takes the word and
//! announces the change. Dropped after the role is released (the
//! [`Reaper`](super::Reaper)'s field order), it gives the word back and
//! announces again: waiters then read `Absent`. Where the kernel or a
//! seccomp profile refuses `set_robust_list`, the word stays free and the
//! state is read from the role (never `Dying`). A table of an earlier
//! layout has no life word and no thread is started.

use crate::os::robust::{self, RobustList};
use crate::sync::Ordering::{AcqRel, Acquire, Relaxed, Release};
use crate::os::futex;
use crate::table::death_protocol::{OWNER_DIED, TID_MASK, WAITERS};
use crate::table::layout::REAPER_LIFE_SINCE_MINOR;
use crate::table::memory::TableMemory;
use crate::table::reaper_life::{self, announce};
use std::sync::atomic::AtomicBool;
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// The life thread's stack: it makes a few system calls and parks.
const LIFE_THREAD_STACK: usize = 64 * 1024;

/// How long building a reaper waits for its life thread to take the word.
const TAKE_WAIT: Duration = Duration::from_secs(1);

/// The reaper's hold on its table's life word, given back when dropped.
pub(crate) struct LifeHold {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    /// The fork epoch it was started in: a forked child has no such
    /// thread, and its copy leaves the parent's word alone.
    epoch: u64,
}

impl LifeHold {
    /// Starts the life thread of a reaper that holds `memory`'s role and
    /// has written its boot token and pid, and waits (a bounded time) for
    /// it to take the word; `None` for a table without a life word or a
    /// thread that could not start.
    pub(crate) fn start(memory: &Arc<TableMemory>) -> Option<LifeHold> {
        if memory.minor < REAPER_LIFE_SINCE_MINOR || memory.check_size().is_err() {
            return None;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let (taken, took) = mpsc::channel();
        let (held, stopping) = (memory.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("livereg-life".into())
            .stack_size(LIFE_THREAD_STACK)
            .spawn(move || hold(&held, &stopping, &taken))
            .ok()?;
        let _ = took.recv_timeout(TAKE_WAIT);
        Some(LifeHold {
            stop,
            thread: Some(thread),
            epoch: crate::os::fork::install(),
        })
    }
}

impl Drop for LifeHold {
    fn drop(&mut self) {
        if self.epoch != crate::os::fork::epoch() {
            std::mem::forget(self.thread.take());
            return;
        }
        self.stop.store(true, Release);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}

/// On the life thread: takes the word, parks until told to stop, gives it
/// back.
fn hold(memory: &TableMemory, stop: &AtomicBool, taken: &mpsc::Sender<()>) {
    let list = RobustList::new();
    // SAFETY:
    // - `list` is boxed and lives until this thread has switched to the
    //   process's empty list below (the function's end);
    // - it is well formed: empty, or its one entry.
    let robust = unsafe { robust::set_robust_list(&list) }.is_ok();
    let header = memory.header();
    let life = &header.reaper_life;
    // A dead reaper's mark is cleared first: until this reaper takes the
    // word, readers find it free and read `Serving` from the role (with the
    // boot token this reaper already wrote).
    let left = life.load(Acquire);
    if left & OWNER_DIED != 0 {
        let _ = life.compare_exchange(left, 0, AcqRel, Relaxed);
    }
    announce(&header.reaper_life_changes);
    let mut own = None;
    if robust {
        header
            .reaper_life_token
            .store(header.boot_token.load(Acquire), Relaxed);
        header
            .reaper_life_pid
            .store(header.reaper_pid.load(Relaxed), Relaxed);
        let tid = robust::thread_id();
        // Named pending before the word is taken: a death from here on
        // marks it (the kernel reads the entry at `list_op_pending`).
        list.futex_offset
            .store(life.as_ptr() as isize - list.entry() as isize, Release);
        list.list_op_pending.store(list.entry(), Release);
        // The role is this reaper's: whatever a stopping one left (it gives
        // the word back only if it still holds its own value) is replaced.
        let previous = life.swap(tid, AcqRel);
        list.entry.store(list.head(), Release);
        list.next.store(list.entry(), Release);
        list.list_op_pending.store(0, Release);
        own = Some(tid);
        announce(&header.reaper_life_changes);
        if previous & WAITERS != 0 {
            futex::wake_all(life);
        }
    }
    let _ = taken.send(());
    while !stop.load(Acquire) {
        std::thread::park();
    }
    // A table truncated under the reaper is not touched (its header is
    // gone); the list is emptied all the same.
    let whole = memory.check_size().is_ok();
    if let Some(tid) = own {
        list.list_op_pending.store(list.entry(), Release);
        list.empty();
        if whole {
            let value = life.load(Acquire);
            if reaper_life::is_live(value) && value & TID_MASK == tid {
                let _ = life.compare_exchange(value, 0, AcqRel, Relaxed);
            }
        }
        list.list_op_pending.store(0, Release);
    }
    if whole {
        // The role is already given back: woken waiters read `Absent`.
        announce(&header.reaper_life_changes);
        futex::wake_all(life);
    }
    if robust {
        // SAFETY: `robust::empty_list` is a leaked, empty list that lives
        // for the whole process; `list` may then be freed.
        let _ = unsafe { robust::set_robust_list(robust::empty_list()) };
    }
}
