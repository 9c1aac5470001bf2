//! Reapers from C: one handle that holds the reaper role for its life,
//! driven by the caller's event loop (`acquire`, `scan`, `fd`,
//! `next_scan_ms`) or scanning on library threads (`start`).

use crate::boundary::{guard, guard_value, guard_void};
use crate::boundary::{hand_out, handle, output, take_back, Handle};
use crate::sized::{read_in, SizedStruct};
use crate::table::{borrow, livereg_table};
use crate::types::{livereg_callbacks, livereg_drop_event, livereg_result};
use livereg::{label_prefix, DropEvent, Reaper, ReaperBuilder, ReaperThread, Table, LABEL_MAX};
use std::cell::Cell;
use std::ffi::c_int;
use std::ffi::{c_char, c_void};
use std::os::fd::AsRawFd;
use std::sync::Mutex;

thread_local! {
    /// The driven reaper whose scan this thread is running (0: none): its
    /// callbacks run inside that scan, on this thread.
    static SCANNING: Cell<usize> = const { Cell::new(0) };
}

/// Whether this thread is inside a scan of `reaper`: called from one of its
/// own callbacks, where waiting on it would hang and freeing it would pull
/// it from under the scan.
pub(crate) fn inside_own_scan(reaper: *const livereg_reaper) -> bool {
    !reaper.is_null() && SCANNING.with(|scanning| scanning.get() == reaper as usize)
}

/// Marks this thread as scanning `reaper` until dropped (restoring what it
/// was scanning before: a callback may drive another table's reaper).
struct Scanning(usize);

impl Scanning {
    fn enter(reaper: *const livereg_reaper) -> Scanning {
        Scanning(SCANNING.with(|scanning| scanning.replace(reaper as usize)))
    }
}

impl Drop for Scanning {
    fn drop(&mut self) {
        SCANNING.with(|scanning| scanning.set(self.0));
    }
}

/// The refusal of a call that would wait on, or free, the reaper whose
/// callback makes it.
pub(crate) fn reentered(call: &str) -> livereg::Error {
    livereg::Error::busy(format!(
        "{call}: called from this reaper's own callback, inside its scan; \
         call it after livereg_reaper_scan returns"
    ))
}

/// A reaper (opaque to C): the role, one boot token, one exit watcher and
/// one memory of the slots for the handle's whole life.
pub enum livereg_reaper {
    /// Driven by the caller: scans when told.
    Driven {
        /// The reaper; scans and `next_scan_ms` take turns.
        reaper: Box<Mutex<Reaper>>,
        /// Its wake descriptor, open for the handle's life.
        fd: c_int,
    },
    /// Scanning on a library thread.
    Thread(ReaperThread),
}

impl Handle for livereg_reaper {
    const NAME: &'static str = "reaper";
}

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
        call(self.0.on_drop, self.0.userdata, event);
    }

    fn on_dying(&self, event: &DropEvent) {
        call(self.0.on_dying, self.0.userdata, event);
    }

    fn on_clear(&self) {
        if let Some(on_clear) = self.0.on_clear {
            // SAFETY: a C function pointer supplied for this purpose.
            unsafe { on_clear(self.0.userdata) };
        }
    }
}

/// A C event callback, if given, with `event` as C sees it.
type EventCallback = unsafe extern "C" fn(*mut c_void, *const livereg_drop_event);

fn call(callback: Option<EventCallback>, userdata: *mut c_void, event: &DropEvent) {
    if let Some(callback) = callback {
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
            remote: u32::from(event.remote),
        };
        // SAFETY:
        // - `callback` is a C function pointer supplied for this purpose;
        // - `c_event` outlives the call, as the header promises.
        unsafe { callback(userdata, &c_event) };
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
            .on_dying(move |event| {
                callbacks.on_dying(event);
                Ok(())
            })
            .on_clear(move || {
                callbacks.on_clear();
                Ok(())
            }),
    }
}

/// The shared part of the reaper entry points: checks the arguments (the
/// callbacks as a struct of `cb_size` bytes), builds the reaper with
/// `make`, hands it out.
///
/// # Safety
///
/// `table` is NULL or a live handle; `cb` is NULL or readable for `cb_size`
/// bytes; `out` is NULL or writable for one handle pointer.
unsafe fn new_reaper(
    table: *const livereg_table,
    cb: *const livereg_callbacks,
    cb_size: usize,
    out: *mut *mut livereg_reaper,
    make: impl FnOnce(ReaperBuilder) -> Result<livereg_reaper, livereg::Error>,
) -> livereg_result {
    guard(|| {
        // SAFETY: the output rule (`output`), this function's `# Safety`.
        let out = unsafe { output(out, "out") }?;
        // SAFETY: the handle rule (`handle`), this function's `# Safety`.
        let table = unsafe { borrow(table) }?;
        // SAFETY: `cb` is NULL or readable for `cb_size` bytes (this
        // function's `# Safety`), as `read_in` requires.
        let callbacks = unsafe { read_in(cb, cb_size) }?.map(Callbacks);
        hand_out(out, make(builder(table, callbacks))?);
        Ok(())
    })
}

/// Makes a reaper the caller drives.
fn driven_reaper(builder: ReaperBuilder) -> Result<livereg_reaper, livereg::Error> {
    let reaper = builder.build()?;
    let fd = reaper.as_raw_fd();
    Ok(livereg_reaper::Driven {
        reaper: Box::new(Mutex::new(reaper)),
        fd,
    })
}

/// Makes a reaper that scans on library threads.
fn thread_reaper(builder: ReaperBuilder) -> Result<livereg_reaper, livereg::Error> {
    Ok(livereg_reaper::Thread(builder.spawn()?))
}

/// `livereg_reaper_acquire_sized(table, cb, cb_size, out)`: takes the
/// reaper role for a handle the caller drives; `cb` (a struct of `cb_size`
/// bytes) may be NULL.
///
/// # Safety
///
/// `table` is a live handle; `cb` is NULL or readable for `cb_size` bytes;
/// `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn livereg_reaper_acquire_sized(
    table: *const livereg_table,
    cb: *const livereg_callbacks,
    cb_size: usize,
    out: *mut *mut livereg_reaper,
) -> livereg_result {
    // SAFETY: this function's `# Safety` is `new_reaper`'s.
    unsafe { new_reaper(table, cb, cb_size, out, driven_reaper) }
}

/// The size of the callbacks the plain entry points read: the three words
/// of the releases before `on_dying`, or, where the process's environment
/// has `LIVEREG_LEGACY_CALLBACKS_HAVE_ON_DYING=1` (set for a program built
/// against a header that had `on_dying` but no sizes, never for an older
/// one), the four words with `on_dying`.
fn legacy_callbacks_size() -> usize {
    if std::env::var_os("LIVEREG_LEGACY_CALLBACKS_HAVE_ON_DYING").is_some_and(|v| v == "1") {
        std::mem::size_of::<livereg_callbacks>()
    } else {
        livereg_callbacks::LEGACY_SIZE
    }
}

/// `livereg_reaper_acquire(table, cb, out)`, as programs built before sizes
/// travelled call it: reads the three words of the callbacks before
/// `on_dying` (a program of those releases has something else past them),
/// or four where the environment says the program's struct has `on_dying`
/// ([`legacy_callbacks_size`]).
///
/// # Safety
///
/// `table` is a live handle; `cb` is NULL or readable for those words;
/// `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn livereg_reaper_acquire(
    table: *const livereg_table,
    cb: *const livereg_callbacks,
    out: *mut *mut livereg_reaper,
) -> livereg_result {
    let size = legacy_callbacks_size();
    // SAFETY: this function's `# Safety` is `new_reaper`'s (with the
    // environment's word for a program whose struct has `on_dying`).
    unsafe { new_reaper(table, cb, size, out, driven_reaper) }
}

/// `livereg_reaper_start_sized(table, cb, cb_size, out)`; `cb` (a struct of
/// `cb_size` bytes) may be NULL.
///
/// # Safety
///
/// `table` is a live handle; `cb` is NULL or readable for `cb_size` bytes;
/// `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn livereg_reaper_start_sized(
    table: *const livereg_table,
    cb: *const livereg_callbacks,
    cb_size: usize,
    out: *mut *mut livereg_reaper,
) -> livereg_result {
    // SAFETY: this function's `# Safety` is `new_reaper`'s.
    unsafe { new_reaper(table, cb, cb_size, out, thread_reaper) }
}

/// `livereg_reaper_start(table, cb, out)`, as programs built before sizes
/// travelled call it: the callbacks as `livereg_reaper_acquire` reads them.
///
/// # Safety
///
/// `table` is a live handle; `cb` is NULL or readable for those words;
/// `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn livereg_reaper_start(
    table: *const livereg_table,
    cb: *const livereg_callbacks,
    out: *mut *mut livereg_reaper,
) -> livereg_result {
    let size = legacy_callbacks_size();
    // SAFETY: this function's `# Safety` is `new_reaper`'s (with the
    // environment's word for a program whose struct has `on_dying`).
    unsafe { new_reaper(table, cb, size, out, thread_reaper) }
}

/// The driven reaper behind a handle, or why there is none.
///
/// # Safety
///
/// `reaper` is NULL or a live handle.
unsafe fn driven<'a>(reaper: *const livereg_reaper) -> Result<&'a Mutex<Reaper>, livereg::Error> {
    // SAFETY: the handle rule (`handle`), this function's `# Safety`.
    match unsafe { handle(reaper) }? {
        livereg_reaper::Driven { reaper, .. } => Ok(reaper),
        livereg_reaper::Thread(_) => Err(livereg::Error::InvalidArgument(
            "this reaper scans on its own thread (livereg_reaper_start), expected one from livereg_reaper_acquire"
                .into(),
        )),
    }
}

/// `livereg_reaper_scan(reaper, ended)`: one scan on this thread; `ended`
/// may be NULL.
///
/// # Safety
///
/// `reaper` is a live handle; `ended` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn livereg_reaper_scan(
    reaper: *const livereg_reaper,
    ended: *mut u32,
) -> livereg_result {
    guard(|| {
        if inside_own_scan(reaper) {
            return Err(reentered("livereg_reaper_scan"));
        }
        let _scanning = Scanning::enter(reaper);
        // SAFETY: `reaper` is NULL or a handle not yet stopped (this function's `# Safety`), as
        // `driven` requires.
        let driven = unsafe { driven(reaper) }?;
        let report = driven
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .scan()?;
        // SAFETY: `ended` is NULL (`as_mut` gives `None`) or writable for one `uint32_t` (this
        // function's `# Safety`).
        if let Some(ended) = unsafe { ended.as_mut() } {
            *ended = u32::try_from(report.ended.len()).unwrap_or(u32::MAX);
        }
        Ok(())
    })
}

/// `livereg_reaper_fd(reaper)`: the wake descriptor of a driven reaper, -1
/// for NULL or a reaper thread.
///
/// # Safety
///
/// `reaper` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn livereg_reaper_fd(reaper: *const livereg_reaper) -> c_int {
    guard_value(-1, || {
        // SAFETY: the handle rule (`handle`), this function's `# Safety`.
        match unsafe { handle(reaper) } {
            Ok(livereg_reaper::Driven { fd, .. }) => *fd,
            _ => -1,
        }
    })
}

/// `livereg_reaper_next_scan_ms(reaper)`: milliseconds (rounded up) until
/// the next periodic scan of a driven reaper is due; 0 for NULL, a reaper
/// thread, or a call from the reaper's own callback (its scan is running).
///
/// # Safety
///
/// `reaper` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn livereg_reaper_next_scan_ms(reaper: *const livereg_reaper) -> u64 {
    if inside_own_scan(reaper) {
        return 0;
    }
    guard_value(0, || {
        // SAFETY: the handle rule (`handle`), this function's `# Safety`.
        match unsafe { driven(reaper) } {
            Ok(reaper) => {
                let due = reaper
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .next_scan_in();
                u64::try_from(due.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
            }
            Err(_) => 0,
        }
    })
}

/// `livereg_reaper_stop(reaper)`: stops the thread after its scan, gives up
/// the table, frees the handle (NULL is ignored). From a driven reaper's own
/// callback it does nothing (the handle stays valid) and says so in
/// `livereg_last_error`.
///
/// # Safety
///
/// `reaper` is NULL or a handle not yet stopped; it is not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn livereg_reaper_stop(reaper: *mut livereg_reaper) {
    if inside_own_scan(reaper) {
        let _ = guard(|| Err(reentered("livereg_reaper_stop")));
        return;
    }
    guard_void(|| {
        // SAFETY: the free rule (`take_back`), this function's `# Safety`.
        match unsafe { take_back(reaper) } {
            // From inside one of its callbacks the stop cannot wait: the
            // reaper then stops once the callback returns.
            Some(livereg_reaper::Thread(thread)) => {
                let _ = thread.stop();
            }
            Some(livereg_reaper::Driven { reaper, .. }) => drop(reaper),
            None => {}
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
