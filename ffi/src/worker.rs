//! Workers from C: register, ping, deregister, and a clear asked by the
//! engine holding one.

use crate::boundary::{guard, handle, null, text, Handle};
use crate::boundary::{hand_out, output};
use crate::table::{borrow, livereg_table};
use crate::types::livereg_result;
use livereg::Worker;
use std::ffi::{c_char, c_int};
use std::time::Duration;

/// A registration (opaque to C).
pub struct livereg_worker(pub(crate) Worker);

impl Handle for livereg_worker {
    const NAME: &'static str = "worker";
}

/// `livereg_register(table, instance_id, label, out)`; `label` may be NULL.
///
/// # Safety
///
/// `table` is a live handle; `label` is NULL or a NUL-terminated string;
/// `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn livereg_register(
    table: *const livereg_table,
    instance_id: u64,
    label: *const c_char,
    out: *mut *mut livereg_worker,
) -> livereg_result {
    guard(|| {
        // SAFETY: `out` is NULL or writable for one handle pointer for the
        // call (this function's `# Safety`), as `output` requires.
        let out = unsafe { output(out, "out") }?;
        // SAFETY: `table` is NULL or an open handle (this function's `# Safety`), as `borrow`
        // requires.
        let table = unsafe { borrow(table) }?;
        let label = if label.is_null() {
            ""
        } else {
            // SAFETY: `label` is a NUL-terminated string valid for the call (this function's `#
            // Safety`), as `text` requires.
            unsafe { text(label, "label") }?
        };
        hand_out(out, livereg_worker(table.register(instance_id, label)?));
        Ok(())
    })
}

/// `livereg_ping(worker)`: `LIVEREG_OK` or `LIVEREG_EVICTED`.
///
/// # Safety
///
/// `worker` is a handle from `livereg_register` not yet deregistered.
#[no_mangle]
pub unsafe extern "C" fn livereg_ping(worker: *const livereg_worker) -> livereg_result {
    guard(|| {
        // SAFETY: `worker` is NULL or a handle not yet deregistered (this
        // function's `# Safety`), as `handle` requires.
        let worker = unsafe { handle(worker) }?;
        worker.0.heartbeat()
    })
}

/// `livereg_set_busy(worker, busy)`: `LIVEREG_OK` or `LIVEREG_EVICTED`.
///
/// # Safety
///
/// `worker` is a handle from `livereg_register` not yet deregistered.
#[no_mangle]
pub unsafe extern "C" fn livereg_set_busy(
    worker: *const livereg_worker,
    busy: c_int,
) -> livereg_result {
    guard(|| {
        // SAFETY: `worker` is NULL or a handle not yet deregistered (this
        // function's `# Safety`), as `handle` requires.
        let worker = unsafe { handle(worker) }?;
        worker.0.set_busy(busy != 0)
    })
}

/// `livereg_progress(worker)`: one step; `LIVEREG_OK` or `LIVEREG_EVICTED`.
///
/// # Safety
///
/// `worker` is a handle from `livereg_register` not yet deregistered.
#[no_mangle]
pub unsafe extern "C" fn livereg_progress(worker: *const livereg_worker) -> livereg_result {
    guard(|| {
        // SAFETY: `worker` is NULL or a handle not yet deregistered (this
        // function's `# Safety`), as `handle` requires.
        let worker = unsafe { handle(worker) }?;
        worker.0.progress()
    })
}

/// `livereg_deregister(worker)`: ends the registration and frees the handle;
/// `LIVEREG_EVICTED` if it had already ended.
///
/// # Safety
///
/// `worker` is a handle not yet deregistered; it is not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn livereg_deregister(worker: *mut livereg_worker) -> livereg_result {
    guard(|| {
        if worker.is_null() {
            return Err(null("worker"));
        }
        // SAFETY: not NULL (checked above), and by this function's `# Safety`
        // a box from `hand_out` that C gives back exactly once, here.
        let worker = unsafe { Box::from_raw(worker) };
        worker.0.deregister()
    })
}

/// `livereg_worker_clear(worker, timeout_ms)`: asks the server for a clear
/// from the engine holding `worker`: on its table, or through the listener
/// of its session.
///
/// # Safety
///
/// `worker` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn livereg_worker_clear(
    worker: *const livereg_worker,
    timeout_ms: u64,
) -> livereg_result {
    guard(|| {
        // SAFETY: `worker` is NULL or a handle not yet deregistered (this
        // function's `# Safety`), as `handle` requires.
        let worker = unsafe { handle(worker) }?;
        worker.0.clear(Duration::from_millis(timeout_ms))
    })
}

/// `livereg_worker_reset(worker, timeout_ms)`: as `livereg_worker_clear`,
/// a reset.
///
/// # Safety
///
/// `worker` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn livereg_worker_reset(
    worker: *const livereg_worker,
    timeout_ms: u64,
) -> livereg_result {
    guard(|| {
        // SAFETY: `worker` is NULL or a handle not yet deregistered (this
        // function's `# Safety`), as `handle` requires.
        let worker = unsafe { handle(worker) }?;
        worker.0.reset(Duration::from_millis(timeout_ms))
    })
}
