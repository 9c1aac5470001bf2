//! A registering process's death thread: a small library thread, started
//! with the process's first registration in a table and ended with its
//! last, that owns the process's word among the table's death words (see
//! `table/death_words.rs`). Its robust list holds that one word; when the
//! process begins to die (SIGKILL, a crash, `exit`, `exec`), the kernel
//! marks the word `OWNER_DIED` as the thread exits, before the process's
//! memory and files are torn down, and the reaper sees the process dying.
//! A thread of its own, not the one that registered: a registration made
//! from a thread that then ends must not be reported dying.
//!
//! The first registration does not wait for the thread: it starts it and
//! goes on (a thread's start is a scheduling delay on a busy machine); the
//! thread, once it runs, claims a free word and records it for every
//! registration made so far, and later ones record it themselves. A death
//! before that is seen when it has ended, as before. The list is edited
//! under the table memory's lock, with `list_op_pending` naming the entry
//! while the word is taken or given back, so a death in the middle of an
//! edit is still reported. A forked child inherits no death thread (the
//! kernel gives it none, and its copy of the listing is ignored), so it
//! never marks its parent's word. Where the kernel or a seccomp profile
//! refuses `set_robust_list`, or every word is taken, the registrations
//! have no death word. `LIVEREG_NO_DEATH_THREAD=1` turns it off.

use crate::os::fork;
use crate::os::robust::{self, RobustList};
use crate::sync::Ordering::{Relaxed, Release};
use crate::table::death_protocol;
use crate::table::death_words::{DeathWords, Listing};
use crate::table::memory::TableMemory;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::Thread;

/// The environment variable that turns death threads off (`1`).
pub(crate) const OFF_ENV: &str = "LIVEREG_NO_DEATH_THREAD";

/// The death thread's stack: it makes two system calls and waits.
const DEATH_THREAD_STACK: usize = 64 * 1024;

fn listing(memory: &TableMemory) -> MutexGuard<'_, Option<Listing>> {
    memory
        .death_listing
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Counts slot `index`'s registration of `generation` under this process's
/// word in `memory`'s death words (recorded now, or once the thread has
/// claimed the word), starting the thread with the process's first
/// registration. Returns whether it is counted (then [`leave`] it once it
/// has ended): not where the table has no death words or they are off.
pub(crate) fn enlist(memory: &Arc<TableMemory>, index: u32, generation: u32) -> bool {
    let Some(words) = memory.death_words() else {
        return false;
    };
    let mut held = listing(memory);
    let epoch = fork::install();
    if let Some(listing) = held.as_mut().filter(|held| held.epoch == epoch) {
        listing.registrations += 1;
        match listing.word {
            Some(word) => record(words, word, index, generation),
            None => listing.waiting.push((index, generation)),
        }
        return true;
    }
    if let Some(inherited) = held.take() {
        // A forked child's copy: the thread and the word are the parent's.
        std::mem::forget(inherited);
    }
    if std::env::var_os(OFF_ENV).is_some_and(|v| v == "1") {
        return false;
    }
    let list = RobustList::new();
    let handback = Arc::new(Mutex::new(None));
    let Some(thread) = start(memory.clone(), &list, handback.clone()) else {
        return false;
    };
    *held = Some(Listing {
        epoch,
        word: None,
        registrations: 1,
        waiting: vec![(index, generation)],
        list,
        handback,
        thread,
    });
    true
}

/// Whether this process counts registrations under a word of `memory`'s.
pub(crate) fn is_listed(memory: &TableMemory) -> bool {
    memory.death_words.is_some()
        && listing(memory)
            .as_ref()
            .is_some_and(|held| held.epoch == fork::epoch())
}

/// Counts one registration fewer; with the last, gives the word back and
/// ends the thread. A forked child's call leaves the parent's alone.
pub(crate) fn leave(memory: &TableMemory) {
    if memory.death_words.is_none() {
        return;
    }
    let mut held = listing(memory);
    let Some(listing) = held.as_mut().filter(|held| held.epoch == fork::epoch()) else {
        return;
    };
    listing.registrations -= 1;
    if listing.registrations > 0 {
        return;
    }
    let Some(Listing {
        word,
        list,
        handback,
        thread,
        ..
    }) = held.take()
    else {
        return;
    };
    if let Some(word) = word {
        // A file truncated under this handle is not touched: the word
        // stays, and the thread ends on an empty list, marking nothing.
        let process = memory.death_words().map(|words| words.process(word));
        list.list_op_pending.store(list.entry(), Release);
        list.next.store(list.head(), Release);
        if process.is_some_and(|process| death_protocol::give_back(&process.word)) {
            robust::wake_one(&process.expect("checked").word);
        }
        list.list_op_pending.store(0, Release);
    }
    // The thread frees the list once it has stopped reading it, and ends.
    *handback.lock().unwrap_or_else(|p| p.into_inner()) = Some(list);
    thread.unpark();
}

/// Slot `index`'s registration of `generation` belongs to word `word`.
fn record(words: &DeathWords, word: u32, index: u32, generation: u32) {
    let record = words.slot(index);
    record.dying_seen_ns.store(0, Relaxed);
    record
        .owner
        .store(u64::from(word + 1) << 32 | u64::from(generation), Release);
}

/// Starts a death thread on `list`; it ends once the list is handed back
/// through `handback` (and it is unparked).
fn start(
    memory: Arc<TableMemory>,
    list: &RobustList,
    handback: Arc<Mutex<Option<Box<RobustList>>>>,
) -> Option<Thread> {
    let head = list.head();
    let spawned = std::thread::Builder::new()
        .name("livereg-death".into())
        .stack_size(DEATH_THREAD_STACK)
        .spawn(move || {
            // SAFETY:
            // - `head` is the list the listing keeps, boxed, in the table
            //   memory until `leave` hands it back here, where it is freed
            //   only after this thread switched to the empty list.
            // - The list is well formed: empty, or its one entry.
            let list = unsafe { &*(head as *const RobustList) };
            // SAFETY: as above; the list outlives its use here.
            if unsafe { robust::set_robust_list(list) }.is_ok() {
                claim(&memory, list);
            }
            drop(memory);
            // Parked, allocating nothing, until the list comes back.
            let handed_back = loop {
                if let Some(list) = handback.lock().unwrap_or_else(|p| p.into_inner()).take() {
                    break list;
                }
                std::thread::park();
            };
            // SAFETY: `empty_list` is a leaked, empty list that lives for the
            // whole process.
            let _ = unsafe { robust::set_robust_list(empty_list()) };
            drop(handed_back);
        })
        .ok()?;
    Some(spawned.thread().clone())
}

/// On the death thread: claims a free word for this thread, if the
/// registrations still want one, and records it for those made so far.
fn claim(memory: &TableMemory, list: &RobustList) {
    let mut held = listing(memory);
    let (Some(listing), Some(words)) = (held.as_mut(), memory.death_words()) else {
        return;
    };
    if listing.list.head() != list.head() {
        return; // ended already, and perhaps started again
    }
    let thread_id = robust::thread_id();
    for index in 0..words.capacity() {
        let process = words.process(index);
        if process.word.load(Relaxed) != 0 {
            continue;
        }
        // Named pending before the word is taken: a death from here on
        // marks it (the kernel reads the entry at `list_op_pending`).
        let offset = process.word.as_ptr() as isize - list.entry() as isize;
        list.futex_offset.store(offset, Release);
        list.list_op_pending.store(list.entry(), Release);
        if !death_protocol::claim(&process.word, thread_id) {
            list.list_op_pending.store(0, Release);
            continue;
        }
        process.pid.store(std::process::id(), Relaxed);
        list.entry.store(list.head(), Release);
        list.next.store(list.entry(), Release);
        list.list_op_pending.store(0, Release);
        listing.word = Some(index);
        for (slot, generation) in listing.waiting.drain(..) {
            record(words, index, slot, generation);
        }
        // So the reaper's death watch waits on the word from now on.
        memory.wake_reaper();
        return;
    }
    // Every word is taken: these registrations have none.
    listing.waiting.clear();
}

/// One empty robust list for the whole process, which a death thread
/// switches to before its own list's memory is freed.
fn empty_list() -> &'static RobustList {
    static EMPTY: std::sync::OnceLock<&'static RobustList> = std::sync::OnceLock::new();
    EMPTY.get_or_init(|| Box::leak(RobustList::new()))
}
