//! Interpreter exit: every reaper thread still running is stopped from an
//! `atexit` hook, while the interpreter can still run their callbacks to the
//! end; after it, nothing of ours attaches to the interpreter again.

use pyo3::prelude::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

static STARTED: AtomicBool = AtomicBool::new(false);

/// The running reaper threads, as their Python objects hold them.
pub type Slot = Mutex<Option<livereg::ReaperThread>>;
static RUNNING: Mutex<Vec<Weak<Slot>>> = Mutex::new(Vec::new());

/// Whether the exit hook has run.
pub fn started() -> bool {
    STARTED.load(Ordering::Acquire)
}

/// Remembers a reaper thread for the exit hook.
pub fn track(slot: &Arc<Slot>) {
    let mut running = RUNNING.lock().unwrap_or_else(|p| p.into_inner());
    running.retain(|weak| weak.strong_count() > 0);
    running.push(Arc::downgrade(slot));
}

/// The exit hook: stops every reaper thread (its running callbacks finish
/// first), without holding the interpreter while it waits.
#[pyfunction]
pub fn _stop_reapers_at_exit(py: Python<'_>) {
    let slots: Vec<Arc<Slot>> = {
        let mut running = RUNNING.lock().unwrap_or_else(|p| p.into_inner());
        running
            .drain(..)
            .filter_map(|weak| weak.upgrade())
            .collect()
    };
    py.detach(move || {
        for slot in slots {
            let taken = slot.lock().unwrap_or_else(|p| p.into_inner()).take();
            if let Some(thread) = taken {
                let _ = thread.stop();
            }
        }
        STARTED.store(true, Ordering::Release);
        // What a thread of ours began delivering before it could see the
        // flag ends before the interpreter does.
        drop(delivering());
    });
}

/// Held by a thread of ours while it delivers something to the interpreter
/// (the log thread, a record): the exit hook takes it once [`started`]
/// holds, so that nothing is being delivered as the interpreter ends.
static DELIVERING: Mutex<()> = Mutex::new(());

/// Holds off the exit hook's end while the guard lives; look at
/// [`started`] after taking it.
pub fn delivering() -> MutexGuard<'static, ()> {
    DELIVERING.lock().unwrap_or_else(|p| p.into_inner())
}
