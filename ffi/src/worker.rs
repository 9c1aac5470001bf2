//! Workers from C: register, ping, deregister, and a clear asked by the
//! engine holding one.

use crate::boundary::{guard, handle, null, text, Handle};
use crate::boundary::{hand_out, output, take_back};
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
        // SAFETY: the output rule (`output`), this function's `# Safety`.
        let out = unsafe { output(out, "out") }?;
        // SAFETY: the handle rule (`handle`), this function's `# Safety`.
        let table = unsafe { borrow(table) }?;
        let label = if label.is_null() {
            ""
        } else {
            // SAFETY: the string rule (`text`), this function's `# Safety`.
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
        // SAFETY: the handle rule (`handle`), this function\'s `# Safety`.
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
        // SAFETY: the handle rule (`handle`), this function\'s `# Safety`.
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
        // SAFETY: the handle rule (`handle`), this function\'s `# Safety`.
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
        // SAFETY: the free rule (`take_back`), this function's `# Safety`.
        let worker = unsafe { take_back(worker) }.ok_or_else(|| null("worker"))?;
        worker.0.deregister()
    })
}

/// `livereg_worker_clear(worker, wait_ms)`: asks the server for a clear
/// from the engine holding `worker`: on its table, or through the listener
/// of its session.
///
/// # Safety
///
/// `worker` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn livereg_worker_clear(
    worker: *const livereg_worker,
    wait_ms: u64,
) -> livereg_result {
    guard(|| {
        // SAFETY: the handle rule (`handle`), this function\'s `# Safety`.
        let worker = unsafe { handle(worker) }?;
        worker.0.clear(Duration::from_millis(wait_ms))
    })
}

/// `livereg_worker_reset(worker, wait_ms)`: as `livereg_worker_clear`,
/// a reset.
///
/// # Safety
///
/// `worker` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn livereg_worker_reset(
    worker: *const livereg_worker,
    wait_ms: u64,
) -> livereg_result {
    guard(|| {
        // SAFETY: the handle rule (`handle`), this function\'s `# Safety`.
        let worker = unsafe { handle(worker) }?;
        worker.0.reset(Duration::from_millis(wait_ms))
    })
}
