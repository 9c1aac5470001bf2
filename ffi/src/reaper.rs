//! Reapers from C: a background thread, or one scan on the caller's thread.

use crate::boundary::{guard, guard_void, null};
use crate::table::{borrow, hand_out, livereg_table};
use crate::types::{livereg_callbacks, livereg_drop_event, livereg_result};
use registry::{label_prefix, DropEvent, ReaperBuilder, ReaperThread, Table, LABEL_MAX};
use std::ffi::c_char;

/// A running reaper thread (opaque to C).
pub struct livereg_reaper(ReaperThread);

/// The callbacks, movable to the reaper thread.
#[derive(Clone, Copy)]
struct Callbacks(livereg_callbacks);

// SAFETY:
// - the header documents that callbacks run on library threads, several at
//   once when one is slow, and that `userdata` must be usable from any of
//   them concurrently; C code that passes it accepts that.
unsafe impl Send for Callbacks {}
// SAFETY: as above.
unsafe impl Sync for Callbacks {}

impl Callbacks {
    fn on_drop(&self, event: &DropEvent) {
        if let Some(on_drop) = self.0.on_drop {
            let label = c_label(&event.label);
            let c_event = livereg_drop_event {
                instance_id: event.instance_id,
                slot: event.slot,
                generation: event.generation,
                reason: event.reason.into(),
                pid: event.pid,
                registered_ns: event.registered_ns,
                last_heartbeat_ns: event.last_heartbeat_ns.unwrap_or(0),
                silent_ns: event.silent_for.as_nanos() as u64,
                label,
            };
            // SAFETY:
            // - `on_drop` is a C function pointer supplied for this purpose;
            // - `c_event` outlives the call, as the header promises.
            unsafe { on_drop(self.0.userdata, &c_event) };
        }
    }

    fn on_clear(&self) {
        if let Some(on_clear) = self.0.on_clear {
            // SAFETY: a C function pointer supplied for this purpose.
            unsafe { on_clear(self.0.userdata) };
        }
    }
}

/// `label` as a NUL-terminated C string of whole UTF-8 characters.
fn c_label(label: &str) -> [c_char; LABEL_MAX + 1] {
    let mut bytes = [0 as c_char; LABEL_MAX + 1];
    for (to, from) in bytes.iter_mut().zip(label_prefix(label).bytes()) {
        *to = from as c_char;
    }
    bytes
}

fn builder(table: &Table, callbacks: Option<Callbacks>) -> ReaperBuilder {
    let builder = table.reaper();
    match callbacks {
        None => builder,
        Some(callbacks) => builder
            .on_drop(move |event| {
                callbacks.on_drop(event);
                Ok(())
            })
            .on_clear(move || {
                callbacks.on_clear();
                Ok(())
            }),
    }
}

/// `livereg_reaper_start(table, cb, out)`; `cb` may be NULL.
///
/// # Safety
///
/// `table` is a live handle; `cb` is NULL or readable; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn livereg_reaper_start(
    table: *const livereg_table,
    cb: *const livereg_callbacks,
    out: *mut *mut livereg_reaper,
) -> livereg_result {
    guard(|| {
        // SAFETY: by this function's contract.
        let table = unsafe { borrow(table) }?;
        if out.is_null() {
            return Err(null("out"));
        }
        // SAFETY: by this function's contract; `as_ref` handles NULL.
        let callbacks = unsafe { cb.as_ref() }.copied().map(Callbacks);
        hand_out(out, livereg_reaper(builder(table, callbacks).spawn()?))
    })
}

/// `livereg_reaper_scan(table, cb, ended)`: one scan on this thread;
/// `cb` and `ended` may be NULL.
///
/// # Safety
///
/// `table` is a live handle; `cb` is NULL or readable; `ended` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn livereg_reaper_scan(
    table: *const livereg_table,
    cb: *const livereg_callbacks,
    ended: *mut u32,
) -> livereg_result {
    guard(|| {
        // SAFETY: by this function's contract.
        let table = unsafe { borrow(table) }?;
        // SAFETY: by this function's contract; `as_ref` handles NULL.
        let callbacks = unsafe { cb.as_ref() }.copied().map(Callbacks);
        let report = builder(table, callbacks).build()?.scan()?;
        // SAFETY: by this function's contract; `as_mut` handles NULL.
        if let Some(ended) = unsafe { ended.as_mut() } {
            *ended = report.ended.len() as u32;
        }
        Ok(())
    })
}

/// `livereg_reaper_stop(reaper)`: stops the thread after its scan, gives up
/// the table, frees the handle (NULL is ignored).
///
/// # Safety
///
/// `reaper` is NULL or a handle not yet stopped; it is not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn livereg_reaper_stop(reaper: *mut livereg_reaper) {
    guard_void(|| {
        if !reaper.is_null() {
            // SAFETY: a handle from `hand_out`, stopped once, by contract.
            // From inside one of its callbacks the stop cannot wait: the
            // reaper then stops once the callback returns.
            let _ = unsafe { Box::from_raw(reaper) }.0.stop();
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    #[test]
    fn a_long_multibyte_label_reaches_c_as_whole_characters() {
        let label = "é".repeat(30);
        let c = c_label(&label);
        // SAFETY: `c_label` always leaves a NUL in the last byte.
        let seen = unsafe { CStr::from_ptr(c.as_ptr()) };
        assert_eq!(seen.to_str().expect("valid UTF-8"), "é".repeat(23));
    }
}
