//! The boundary: errors become result codes with a thread-local message, and
//! panics become `LIVEREG_PANIC`.

use crate::types::livereg_result::{self, *};
use registry::Error;
use std::cell::RefCell;
use std::ffi::{c_char, c_int, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// The code of an error; one code per variant.
pub(crate) fn code(error: &Error) -> livereg_result {
    match error {
        Error::Evicted { .. } => LIVEREG_EVICTED,
        Error::Full(_) => LIVEREG_FULL,
        Error::Exists(_) => LIVEREG_EXISTS,
        Error::NotFound(_) => LIVEREG_NOT_FOUND,
        Error::InvalidArgument(_) => LIVEREG_INVALID_ARGUMENT,
        Error::Incompatible(_) => LIVEREG_INCOMPATIBLE,
        Error::Corrupt(_) => LIVEREG_CORRUPT,
        Error::Permission(_) => LIVEREG_PERMISSION,
        Error::Timeout(_) => LIVEREG_TIMEOUT,
        Error::NoReaper(_) => LIVEREG_NO_REAPER,
        Error::Busy(_) => LIVEREG_BUSY,
        Error::Io { .. } => LIVEREG_IO,
        Error::Panic(_) => LIVEREG_PANIC,
        _ => LIVEREG_IO,
    }
}

fn remember(message: String) {
    let message = CString::new(message.replace('\0', "\\0")).unwrap_or_default();
    LAST_ERROR.with(|last| *last.borrow_mut() = message);
}

/// Runs `body` behind the boundary: `Ok` is `LIVEREG_OK`, an error its code
/// (and message), a panic `LIVEREG_PANIC`.
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

/// A required C string argument as UTF-8.
///
/// # Safety
///
/// `text` is NULL or points to a NUL-terminated string valid for the call.
pub(crate) unsafe fn text<'a>(text: *const c_char, argument: &str) -> Result<&'a str, Error> {
    if text.is_null() {
        return Err(null(argument));
    }
    // SAFETY: non-NULL and NUL-terminated, by this function's contract.
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
    // An int, not the enum: C may pass any value, and an out-of-range enum
    // would be undefined behaviour in Rust.
    let name: &'static CStr = match result {
        0 => c"LIVEREG_OK",
        1 => c"LIVEREG_EVICTED",
        2 => c"LIVEREG_FULL",
        3 => c"LIVEREG_EXISTS",
        4 => c"LIVEREG_NOT_FOUND",
        5 => c"LIVEREG_INVALID_ARGUMENT",
        6 => c"LIVEREG_INCOMPATIBLE",
        7 => c"LIVEREG_CORRUPT",
        8 => c"LIVEREG_PERMISSION",
        9 => c"LIVEREG_TIMEOUT",
        10 => c"LIVEREG_NO_REAPER",
        11 => c"LIVEREG_BUSY",
        12 => c"LIVEREG_IO",
        13 => c"LIVEREG_PANIC",
        _ => c"LIVEREG_UNKNOWN_RESULT",
    };
    name.as_ptr()
}
