//! The table's metrics (OpenMetrics text) from C, for a server that serves
//! its own `/metrics`.

use crate::boundary::{copy_out, guard, output};
use crate::table::{borrow, livereg_table};
use crate::types::livereg_result;
use std::ffi::c_char;

/// `livereg_metrics_text(table, buf, cap, len)`: writes the metrics text and
/// a terminating NUL into `buf`, its length (without the NUL) into `*len`.
/// With `cap` under `*len + 1`, writes nothing, sets `*len` and returns
/// `LIVEREG_INVALID_ARGUMENT` (so a first call with `cap` 0 asks the size).
///
/// # Safety
///
/// `table` is a live handle; `buf` is writable for `cap` bytes (or NULL with
/// `cap` 0); `len` is writable.
#[no_mangle]
pub unsafe extern "C" fn livereg_metrics_text(
    table: *const livereg_table,
    buf: *mut c_char,
    cap: usize,
    len: *mut usize,
) -> livereg_result {
    guard(|| {
        // SAFETY: the handle rule (`handle`), this function\'s `# Safety`.
        let table = unsafe { borrow(table) }?;
        // SAFETY: the output rule (`output`), this function's `# Safety`.
        let len = unsafe { output(len, "len") }?;
        let mut text = table.metrics_text()?.into_bytes();
        *len = text.len();
        text.push(0);
        // SAFETY: the buffer rule (`copy_out`), this function's `# Safety`.
        unsafe {
            copy_out(
                &text,
                buf.cast::<u8>(),
                cap,
                "the metrics text with its NUL",
            )
        }
    })
}
