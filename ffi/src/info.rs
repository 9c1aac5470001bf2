//! The server-published info area from C.

use crate::boundary::{copy_out, guard, null, output};
use crate::table::{borrow, livereg_table};
use crate::types::livereg_result;
use std::ffi::c_void;

/// `livereg_set_info(table, data, len)`: publishes `len` bytes (at most
/// 1,024); `data` may be NULL when `len` is 0.
///
/// # Safety
///
/// `table` is a live handle; `data` is readable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn livereg_set_info(
    table: *const livereg_table,
    data: *const c_void,
    len: usize,
) -> livereg_result {
    guard(|| {
        // SAFETY: the handle rule (`handle`), this function's `# Safety`.
        let table = unsafe { borrow(table) }?;
        let bytes: &[u8] = if len == 0 {
            &[]
        } else if data.is_null() {
            return Err(null("data"));
        } else {
            // SAFETY: `data` is not NULL (checked above), and by this
            // function's `# Safety` readable for `len` bytes for the call.
            unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) }
        };
        table.set_info(bytes)
    })
}

/// `livereg_get_info(table, buf, cap, len)`: copies the published bytes into
/// `buf` and their number into `*len`. With `cap` too small, copies nothing,
/// sets `*len` to the size needed and returns `LIVEREG_INVALID_ARGUMENT`.
///
/// # Safety
///
/// `table` is a live handle; `buf` is writable for `cap` bytes (or NULL with
/// `cap` 0); `len` is writable.
#[no_mangle]
pub unsafe extern "C" fn livereg_get_info(
    table: *const livereg_table,
    buf: *mut c_void,
    cap: usize,
    len: *mut usize,
) -> livereg_result {
    guard(|| {
        // SAFETY: the handle rule (`handle`), this function's `# Safety`.
        let table = unsafe { borrow(table) }?;
        // SAFETY: the output rule (`output`), this function's `# Safety`.
        let len = unsafe { output(len, "len") }?;
        let info = table.info()?;
        *len = info.len();
        // SAFETY: the buffer rule (`copy_out`), this function's `# Safety`.
        unsafe { copy_out(&info, buf.cast::<u8>(), cap, "the info") }
    })
}
