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
//! The list is edited by the registering threads under the table memory's
//! lock, with `list_op_pending` naming the entry while it is linked or
//! unlinked, so a death in the middle of an edit is still reported. A
//! forked child inherits no death thread (the kernel gives it none, and
//! its copy of the listing is ignored), so it never marks its parent's word.
//! Where the kernel or a seccomp profile refuses `set_robust_list`, or every
//! word is taken, the registration has no death word: it is seen when it
//! has ended, as before. `LIVEREG_NO_DEATH_THREAD=1` turns it off.

use crate::os::fork;
use crate::os::robust::{self, RobustList};
use crate::sync::Ordering::{Relaxed, Release};
use crate::table::death_protocol;
use crate::table::death_words::Listing;
use crate::table::memory::TableMemory;
use std::sync::mpsc;

/// The environment variable that turns death threads off (`1`).
pub(crate) const OFF_ENV: &str = "LIVEREG_NO_DEATH_THREAD";

/// Counts one more registration of this process under its process word in
/// `memory`'s death words, starting the death thread and claiming a word
/// for the first. Returns the word's index, or `None` where the table has
/// no death words, they are turned off, or none could be had.
pub(crate) fn enlist(memory: &TableMemory) -> Option<u32> {
    let words = memory.death_words()?;
    let mut listing = memory
        .death_listing
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let epoch = fork::install();
    if let Some(held) = listing.as_mut().filter(|held| held.epoch == epoch) {
        held.registrations += 1;
        return Some(held.word);
    }
    if let Some(inherited) = listing.take() {
        // A forked child's copy: the thread and the word are the parent's.
        std::mem::forget(inherited);
    }
    if std::env::var_os(OFF_ENV).is_some_and(|v| v == "1") {
        return None;
    }
    let list = RobustList::new();
    let (stop, thread_id) = start(&list)?;
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
        *listing = Some(Listing {
            epoch,
            word: index,
            registrations: 1,
            list,
            stop,
        });
        return Some(index);
    }
    // Every word is taken: the thread ends, freeing its (empty) list.
    let _ = stop.send(list);
    None
}

/// Counts one registration fewer; with the last, gives the word back and
/// ends the thread. A forked child's call leaves the parent's alone.
pub(crate) fn leave(memory: &TableMemory) {
    if memory.death_words.is_none() {
        return;
    }
    let mut listing = memory
        .death_listing
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let Some(held) = listing.as_mut().filter(|held| held.epoch == fork::epoch()) else {
        return;
    };
    held.registrations -= 1;
    if held.registrations > 0 {
        return;
    }
    let Some(held) = listing.take() else {
        return;
    };
    let list = &held.list;
    list.list_op_pending.store(list.entry(), Release);
    list.next.store(list.head(), Release);
    // A file truncated under this handle is not touched: its word stays,
    // and the thread ends on an empty list, so nothing marks it.
    if let Some(words) = memory.death_words() {
        let process = words.process(held.word);
        if death_protocol::give_back(&process.word) {
            robust::wake_one(&process.word);
        }
    }
    list.list_op_pending.store(0, Release);
    // The thread frees the list once it has stopped reading it, and ends.
    let Listing { list, stop, .. } = held;
    let _ = stop.send(list);
}

/// Starts a death thread on `list`, returning its stop channel and its
/// thread id once it has made `list` its robust list.
fn start(list: &RobustList) -> Option<(mpsc::Sender<Box<RobustList>>, u32)> {
    let (stop, stopped) = mpsc::channel::<Box<RobustList>>();
    let (told, tid) = mpsc::channel::<Option<u32>>();
    let head = list.head();
    std::thread::Builder::new()
        .name("livereg-death".into())
        .spawn(move || {
            // SAFETY:
            // - `head` is the list `enlist` keeps, boxed, in the table
            //   memory's listing until `leave` hands it back here, where it
            //   is freed only after this thread switched to the empty list.
            // - The list is well formed: empty, or its one entry.
            let list = unsafe { &*(head as *const RobustList) };
            // SAFETY: as above; the list outlives its registration.
            let set = unsafe { robust::set_robust_list(list) };
            let set = set.is_ok();
            let _ = told.send(set.then(robust::thread_id));
            if !set {
                return;
            }
            let handed_back = stopped.recv();
            // SAFETY: `empty_list` is a leaked, empty list that lives for the
            // whole process.
            let _ = unsafe { robust::set_robust_list(empty_list()) };
            drop(handed_back);
        })
        .ok()?;
    let thread_id = tid.recv().ok().flatten()?;
    Some((stop, thread_id))
}

/// One empty robust list for the whole process, which a death thread
/// switches to before its own list's memory is freed.
fn empty_list() -> &'static RobustList {
    static EMPTY: std::sync::OnceLock<&'static RobustList> = std::sync::OnceLock::new();
    EMPTY.get_or_init(|| Box::leak(RobustList::new()))
}
