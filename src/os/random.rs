//! `getrandom(2)`: random bytes from the kernel, for secrets and names.

use super::raw::check;
use std::io;

/// Eight random bytes from the kernel (`getrandom(2)`).
pub(crate) fn random_u64() -> io::Result<u64> {
    let mut bytes = [0u8; 8];
    let mut filled = 0;
    while filled < bytes.len() {
        // SAFETY: the rest of `bytes` is writable for the length passed.
        let rc = unsafe {
            libc::getrandom(bytes[filled..].as_mut_ptr().cast(), bytes.len() - filled, 0)
        };
        match check(rc as libc::c_long) {
            Ok(n) => filled += n as usize,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(u64::from_ne_bytes(bytes))
}
