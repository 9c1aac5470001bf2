//! The boundary: errors become result codes with a thread-local message, and
//! panics become `LIVEREG_PANIC`; and the pointer rules, written once here
//! and named at each call (`// SAFETY: the handle rule (`handle`), …`):
//!
//! - **the handle rule** ([`handle`]): a handle argument is NULL or one this
//!   library handed out ([`hand_out`]) and not yet given back;
//! - **the free rule** ([`take_back`]): a free function's handle is NULL or
//!   such a handle, given back exactly once and not used afterwards;
//! - **the output rule** ([`output`]): an output argument is NULL or
//!   writable for one value for the call;
//! - **the buffer rule** ([`copy_out`]): a buffer is NULL or writable for
//!   the capacity passed with it;
//! - **the string rule** ([`text`]): a string is NULL or NUL-terminated and
//!   valid for the call.
//!
//! Every exported function states in its `# Safety` which of them its
//! arguments follow (the header states the same for C).

use crate::types::livereg_result::{self, *};
use livereg::{Error, RESULT_CODES};
use std::cell::RefCell;
use std::ffi::{c_char, c_int, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// The code of an error: the core crate's [`Error::code`].
pub(crate) fn code(error: &Error) -> livereg_result {
    livereg_result::from_value(error.code()).unwrap_or(LIVEREG_IO)
}

fn remember(message: String) {
    let message = CString::new(message.replace('\0', "\\0")).unwrap_or_default();
    LAST_ERROR.with(|last| *last.borrow_mut() = message);
}

/// Runs `body` behind the boundary: `Ok` is `LIVEREG_OK`, an error its code
/// (and message), a panic `LIVEREG_PANIC`.
#[inline]
pub(crate) fn guard(body: impl FnOnce() -> Result<(), Error>) -> livereg_result {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => LIVEREG_OK,
        Ok(Err(error)) => {
            let code = code(&error);
            remember(error.to_string());
            code
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            remember(format!(
                "panic inside liblivereg (a bug, please report it): {what}"
            ));
            LIVEREG_PANIC
        }
    }
}

/// Runs a function that returns a plain value behind the boundary: a panic
/// returns `fallback` (and says so in `livereg_last_error`).
pub(crate) fn guard_value<T>(fallback: T, body: impl FnOnce() -> T) -> T {
    let mut value = None;
    let _ = guard(|| {
        value = Some(body());
        Ok(())
    });
    value.unwrap_or(fallback)
}

/// Runs a function that returns nothing behind the boundary.
pub(crate) fn guard_void(body: impl FnOnce()) {
    let _ = guard(|| {
        body();
        Ok(())
    });
}

/// The error for a NULL where a pointer is required.
pub(crate) fn null(argument: &str) -> Error {
    Error::InvalidArgument(format!("{argument} is NULL, expected a valid pointer"))
}

/// The caller's output argument `out`, checked before anything else is
/// done: NULL is `LIVEREG_INVALID_ARGUMENT` naming `argument`.
///
/// # Safety
///
/// `out` is NULL or valid for writing one `T` for the duration of the call
/// (the header's rule for every output argument).
pub(crate) unsafe fn output<'a, T>(out: *mut T, argument: &str) -> Result<&'a mut T, Error> {
    // SAFETY: `out` is NULL (`as_mut` gives `None`) or valid for writing one
    // `T` for this call, as this function's `# Safety` requires.
    unsafe { out.as_mut() }.ok_or_else(|| null(argument))
}

/// Copies `bytes` whole into the caller's buffer `buf` of `cap` bytes; with
/// `cap` too small, copies nothing and fails naming `what` and the bytes it
/// needs. `buf` may be NULL when `bytes` is empty.
///
/// # Safety
///
/// `buf` is NULL or writable for `cap` bytes for the duration of the call.
pub(crate) unsafe fn copy_out(
    bytes: &[u8],
    buf: *mut u8,
    cap: usize,
    what: &str,
) -> Result<(), Error> {
    if bytes.len() > cap {
        return Err(Error::InvalidArgument(format!(
            "{what} needs {} bytes, the buffer has room for {cap}",
            bytes.len()
        )));
    }
    if bytes.is_empty() {
        return Ok(());
    }
    if buf.is_null() {
        return Err(null("buf"));
    }
    // SAFETY: `buf` is not NULL and, by this function's `# Safety`, writable
    // for `cap >= bytes.len()` bytes; it cannot overlap our own `bytes`.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf, bytes.len()) };
    Ok(())
}

/// A handle C holds (`livereg_table`, `livereg_worker`, `livereg_reaper`):
/// its name as a parameter, for the error a NULL one gets.
pub(crate) trait Handle {
    /// The parameter's name in the C API.
    const NAME: &'static str;
}

/// The handle `pointer` points to, as a reference for the call; NULL is an
/// `INVALID_ARGUMENT` naming the parameter.
///
/// This is the one place a handle pointer becomes a reference. It is sound
/// because of the contract every function taking a handle states in its
/// `# Safety`: the pointer is NULL or was handed out by [`hand_out`] (a
/// `Box` of this very type) and has not yet been given back to its free
/// function (`livereg_close`, `livereg_deregister`, `livereg_reaper_stop`),
/// so it is aligned, initialised and alive for the call; the library never
/// hands out `&mut` to it, so shared references may coexist.
///
/// # Safety
///
/// `pointer` is NULL or a handle of type `H` this library handed out and the
/// caller has not yet freed.
pub(crate) unsafe fn handle<'a, H: Handle>(pointer: *const H) -> Result<&'a H, Error> {
    // SAFETY: as this function's doc argues, from its `# Safety`.
    unsafe { pointer.as_ref() }.ok_or_else(|| null(H::NAME))
}

/// Moves `value` to the heap and writes the new handle through `out` (as
/// rustls-ffi's `set_boxed_mut_ptr`): the C caller owns it until it gives it
/// back to the matching free function.
pub(crate) fn hand_out<T>(out: &mut *mut T, value: T) {
    *out = Box::into_raw(Box::new(value));
}

/// A handle given back to its free function (`livereg_close`,
/// `livereg_deregister`, `livereg_reaper_stop`): the value [`hand_out`] boxed,
/// now the library's again; `None` for NULL.
///
/// This is the one place a handle's box is taken back. It is sound by the
/// contract each free function states in its `# Safety`: the pointer is NULL
/// or a handle [`hand_out`] made, given back exactly once and not used
/// afterwards, so no reference to it outlives this call.
///
/// # Safety
///
/// `pointer` is NULL or a handle of type `H` this library handed out, given
/// back exactly once.
pub(crate) unsafe fn take_back<H: Handle>(pointer: *mut H) -> Option<H> {
    if pointer.is_null() {
        return None;
    }
    // SAFETY: not NULL (checked above); as this function's doc argues, from
    // its `# Safety`: a box from `hand_out`, taken back once.
    Some(*unsafe { Box::from_raw(pointer) })
}

/// A required C string argument as UTF-8.
///
/// # Safety
///
/// `text` is NULL or points to a NUL-terminated string valid for the call.
pub(crate) unsafe fn text<'a>(text: *const c_char, argument: &str) -> Result<&'a str, Error> {
    if text.is_null() {
        return Err(null(argument));
    }
    // SAFETY: `text` is not NULL (checked above), so by this function's
    // `# Safety` it is NUL-terminated and valid for the call.
    let text = unsafe { CStr::from_ptr(text) };
    text.to_str()
        .map_err(|_| Error::InvalidArgument(format!("{argument} is not valid UTF-8")))
}

/// `livereg_last_error()`: the message of this thread's last failure ("" if
/// none). Valid until the next failing call on this thread.
#[no_mangle]
pub extern "C" fn livereg_last_error() -> *const c_char {
    LAST_ERROR.with(|last| last.borrow().as_ptr())
}

/// `livereg_result_str(r)`: a static name for a result code.
#[no_mangle]
pub extern "C" fn livereg_result_str(result: c_int) -> *const c_char {
    // Built once from the core crate's list; never freed, so the pointers
    // stay valid for the life of the process.
    static NAMES: OnceLock<Vec<CString>> = OnceLock::new();
    static UNKNOWN: &CStr = c"LIVEREG_UNKNOWN_RESULT";
    let names = NAMES.get_or_init(|| {
        RESULT_CODES
            .iter()
            .map(|code| CString::new(format!("LIVEREG_{}", code.name)).unwrap_or_default())
            .collect()
    });
    // An int, not the enum: C may pass any value, and an out-of-range enum
    // would be undefined behaviour in Rust.
    usize::try_from(result)
        .ok()
        .and_then(|index| names.get(index))
        .map_or(UNKNOWN.as_ptr(), |name| name.as_ptr())
}
