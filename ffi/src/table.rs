//! Tables from C: create, open, close, unlink, stats, clear, probe.

use crate::boundary::{guard, guard_void, hand_out, handle, null, output, take_back, text, Handle};
use crate::sized::{read_in, write_out, SizedStruct};
use crate::types::{livereg_options, livereg_result, livereg_stats};
use livereg::{Reason, Table, TableOptions};
use std::ffi::c_char;
use std::time::Duration;

/// An open table (opaque to C).
pub struct livereg_table(pub(crate) Table);

impl Handle for livereg_table {
    const NAME: &'static str = "table";
}

/// The table behind a handle ([`handle`]).
///
/// # Safety
///
/// `table` is NULL or a handle from `livereg_create`/`livereg_open` not yet closed.
pub(crate) unsafe fn borrow<'a>(table: *const livereg_table) -> Result<&'a Table, livereg::Error> {
    // SAFETY: this function's `# Safety` is `handle`'s.
    unsafe { handle(table) }.map(|t| &t.0)
}

/// The defaults, as C sees them.
fn default_options() -> livereg_options {
    let defaults = TableOptions::default();
    livereg_options {
        capacity: defaults.capacity,
        mode: defaults.mode,
        reap_timeout_ms: defaults.reap_timeout.as_millis() as u64,
        registration_grace_ms: defaults.registration_grace.as_millis() as u64,
        progress_timeout_ms: defaults.progress_timeout.as_millis() as u64,
    }
}

/// `livereg_options_default_sized(out, size)`: the defaults in the caller's
/// struct of `size` bytes (the header's `livereg_options_default` passes
/// its `sizeof`).
///
/// # Safety
///
/// `out` is NULL (then nothing happens) or writable for `size` bytes.
#[no_mangle]
pub unsafe extern "C" fn livereg_options_default_sized(out: *mut livereg_options, size: usize) {
    // A size no header declared writes nothing; `livereg_last_error` says why.
    // SAFETY: `out` is NULL or writable for `size` bytes (this function's
    // `# Safety`), as `write_out` requires.
    let _ = guard(|| unsafe { write_out(out, size, &default_options()) });
}

/// `livereg_options_default(out)`, as programs built before sizes travelled
/// call it: writes the struct as they declared it.
///
/// # Safety
///
/// `out` is NULL (then nothing happens) or writable for the struct of the
/// oldest supported header.
#[no_mangle]
pub unsafe extern "C" fn livereg_options_default(out: *mut livereg_options) {
    // SAFETY: this function's `# Safety`, with that struct's size.
    unsafe { livereg_options_default_sized(out, livereg_options::LEGACY_SIZE) }
}

/// `livereg_create_sized(name, opts, opts_size, out)`.
///
/// # Safety
///
/// `name` is a NUL-terminated string; `opts` is NULL (defaults) or readable
/// for `opts_size` bytes; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn livereg_create_sized(
    name: *const c_char,
    opts: *const livereg_options,
    opts_size: usize,
    out: *mut *mut livereg_table,
) -> livereg_result {
    guard(|| {
        // SAFETY: the output rule (`output`), this function's `# Safety`.
        let out = unsafe { output(out, "out") }?;
        // SAFETY: the string rule (`text`), this function's `# Safety`.
        let name = unsafe { text(name, "name") }?;
        // SAFETY: `opts` is NULL or readable for `opts_size` bytes (this
        // function's `# Safety`), as `read_in` requires.
        let options = match unsafe { read_in(opts, opts_size) }? {
            Some(o) => TableOptions {
                capacity: o.capacity,
                mode: o.mode,
                reap_timeout: Duration::from_millis(o.reap_timeout_ms),
                registration_grace: Duration::from_millis(o.registration_grace_ms),
                progress_timeout: Duration::from_millis(o.progress_timeout_ms),
                // The C options keep their layout; a C creator stamps as
                // `StampClock::Auto` decides.
                ..TableOptions::default()
            },
            None => TableOptions::default(),
        };
        hand_out(out, livereg_table(Table::create(name, &options)?));
        Ok(())
    })
}

/// `livereg_create(name, opts, out)`, as programs built before sizes
/// travelled call it: reads the struct as they declared it.
///
/// # Safety
///
/// As `livereg_create_sized`, `opts` of the oldest supported header's size.
#[no_mangle]
pub unsafe extern "C" fn livereg_create(
    name: *const c_char,
    opts: *const livereg_options,
    out: *mut *mut livereg_table,
) -> livereg_result {
    // SAFETY: this function's `# Safety` is `livereg_create_sized`'s.
    unsafe { livereg_create_sized(name, opts, livereg_options::LEGACY_SIZE, out) }
}

/// `livereg_open(name, out)`.
///
/// # Safety
///
/// `name` is a NUL-terminated string; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn livereg_open(
    name: *const c_char,
    out: *mut *mut livereg_table,
) -> livereg_result {
    guard(|| {
        // SAFETY: the output rule (`output`), this function's `# Safety`.
        let out = unsafe { output(out, "out") }?;
        // SAFETY: the string rule (`text`), this function's `# Safety`.
        let name = unsafe { text(name, "name") }?;
        hand_out(out, livereg_table(Table::open(name)?));
        Ok(())
    })
}

/// `livereg_close(table)`: frees the handle (NULL is ignored). Workers and
/// reapers made from it stay valid.
///
/// # Safety
///
/// `table` is NULL or a handle not yet closed; it is not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn livereg_close(table: *mut livereg_table) {
    guard_void(|| {
        // SAFETY: the free rule (`take_back`), this function's `# Safety`.
        drop(unsafe { take_back(table) });
    })
}

/// `livereg_unlink(name)`.
///
/// # Safety
///
/// `name` is a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn livereg_unlink(name: *const c_char) -> livereg_result {
    // SAFETY: the string rule (`text`), this function's `# Safety`.
    guard(|| Table::unlink(unsafe { text(name, "name") }?))
}

/// `livereg_get_stats_sized(table, out, out_size)`: a snapshot into the
/// caller's struct of `out_size` bytes.
///
/// # Safety
///
/// `table` is a live handle; `out` is writable for `out_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn livereg_get_stats_sized(
    table: *const livereg_table,
    out: *mut livereg_stats,
    out_size: usize,
) -> livereg_result {
    guard(|| {
        // SAFETY: the handle rule (`handle`), this function's `# Safety`.
        let table = unsafe { borrow(table) }?;
        if out.is_null() {
            return Err(null("out"));
        }
        let status = table.status()?;
        let mut ended_by_reason = [0u64; crate::types::REASON_SLOTS];
        for reason in Reason::ALL {
            ended_by_reason[reason as usize] = status.ended[&reason];
        }
        let stats = livereg_stats {
            capacity: status.capacity,
            tracked_instances: status.tracked_instances as u32,
            reaper_alive: u32::from(status.reaper_alive),
            reaper_pid: status.reaper_pid,
            boot_token: status.boot_token,
            reap_timeout_ms: table.reap_timeout().as_millis() as u64,
            registration_grace_ms: table.registration_grace().as_millis() as u64,
            ended_total: status.ended_total,
            ended_by_reason,
            handler_failures: status.handler_failures,
            scans: status.scans,
        };
        // SAFETY: `out` is writable for `out_size` bytes (this function's
        // `# Safety`), as `write_out` requires.
        unsafe { write_out(out, out_size, &stats) }
    })
}

/// `livereg_get_stats(table, out)`, as programs built before sizes
/// travelled call it: writes the struct as they declared it.
///
/// # Safety
///
/// `table` is a live handle; `out` is writable for the struct of the oldest
/// supported header.
#[no_mangle]
pub unsafe extern "C" fn livereg_get_stats(
    table: *const livereg_table,
    out: *mut livereg_stats,
) -> livereg_result {
    // SAFETY: this function's `# Safety` is `livereg_get_stats_sized`'s.
    unsafe { livereg_get_stats_sized(table, out, livereg_stats::LEGACY_SIZE) }
}

/// `livereg_clear(table, wait_ms)`.
///
/// # Safety
///
/// `table` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn livereg_clear(
    table: *const livereg_table,
    wait_ms: u64,
) -> livereg_result {
    // SAFETY: the handle rule (`handle`), this function\'s `# Safety`.
    guard(|| unsafe { borrow(table) }?.clear(Duration::from_millis(wait_ms)))
}

/// `livereg_reset(table, wait_ms)`.
///
/// # Safety
///
/// `table` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn livereg_reset(
    table: *const livereg_table,
    wait_ms: u64,
) -> livereg_result {
    // SAFETY: the handle rule (`handle`), this function\'s `# Safety`.
    guard(|| unsafe { borrow(table) }?.reset(Duration::from_millis(wait_ms)))
}

/// `livereg_probe(table, boot_token)`.
///
/// # Safety
///
/// `table` is a live handle; `boot_token` is writable.
#[no_mangle]
pub unsafe extern "C" fn livereg_probe(
    table: *const livereg_table,
    boot_token: *mut u64,
) -> livereg_result {
    guard(|| {
        // SAFETY: the handle rule (`handle`), this function's `# Safety`.
        let table = unsafe { borrow(table) }?;
        // SAFETY: the output rule (`output`), this function's `# Safety`.
        let out = unsafe { output(boot_token, "boot_token") }?;
        *out = table.probe()?;
        Ok(())
    })
}

/// A path from C: its bytes as given (any encoding), never NULL.
///
/// # Safety
///
/// `path` is NULL or points to a NUL-terminated string valid for the call.
unsafe fn path_arg<'a>(path: *const c_char) -> Result<&'a std::path::Path, livereg::Error> {
    use std::os::unix::ffi::OsStrExt;
    if path.is_null() {
        return Err(crate::boundary::null("path"));
    }
    // SAFETY: not NULL (checked above); NUL-terminated and valid for the
    // call by this function's `# Safety`.
    let bytes = unsafe { std::ffi::CStr::from_ptr(path) }.to_bytes();
    Ok(std::path::Path::new(std::ffi::OsStr::from_bytes(bytes)))
}

/// `livereg_own_file(table, path)`.
///
/// # Safety
///
/// `table` is a live handle; `path` a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn livereg_own_file(
    table: *const livereg_table,
    path: *const c_char,
) -> livereg_result {
    guard(|| {
        // SAFETY: the handle rule (`handle`), this function's `# Safety`.
        let table = unsafe { borrow(table) }?;
        // SAFETY: this function's `# Safety`.
        table.own_file(unsafe { path_arg(path) }?)
    })
}

/// `livereg_disown_file(table, path)`.
///
/// # Safety
///
/// `table` is a live handle; `path` a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn livereg_disown_file(
    table: *const livereg_table,
    path: *const c_char,
) -> livereg_result {
    guard(|| {
        // SAFETY: the handle rule (`handle`), this function's `# Safety`.
        let table = unsafe { borrow(table) }?;
        // SAFETY: this function's `# Safety`.
        let path = unsafe { path_arg(path) }?;
        match table.disown_file(path)? {
            true => Ok(()),
            false => Err(livereg::Error::NotFound(format!(
                "'{}' is not owned by this process in this table",
                path.display()
            ))),
        }
    })
}
