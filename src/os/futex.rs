//! `futex(2)` on a word of the mapped table, shared between processes (no
//! `FUTEX_PRIVATE_FLAG`), so a deregistration or a clear request wakes a
//! sleeping reaper at once.

use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// `futex(word, FUTEX_WAIT, expected, timeout)`: sleeps while `*word ==
/// expected`, until woken or `timeout` passes. Spurious returns are allowed.
pub(crate) fn wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY:
    // - `word` is a live, 4-byte aligned atomic for the duration of the call;
    //   the kernel only reads it;
    // - `ts` is a valid `timespec` that outlives the call.
    // The result is ignored: timeout, wake-up, EAGAIN and EINTR all mean
    // "look again", which the caller does.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
        )
    };
}

/// `futex(word, FUTEX_WAKE, INT_MAX)`: wakes every waiter on `word`.
pub(crate) fn wake_all(word: &AtomicU32) {
    // SAFETY:
    // - `word` is a live, aligned atomic; FUTEX_WAKE does not access it.
    unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX) };
}
