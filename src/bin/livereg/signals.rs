//! SIGINT and SIGTERM as a flag the main loops poll.

use std::sync::atomic::{AtomicI32, Ordering};

static RECEIVED: AtomicI32 = AtomicI32::new(0);

extern "C" fn record(signal: libc::c_int) {
    RECEIVED.store(signal, Ordering::SeqCst);
}

/// Routes SIGINT and SIGTERM to [`take`] instead of killing the process.
pub fn catch_termination() {
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY:
        // - `record` only stores to an atomic, which is async-signal-safe;
        // - `signal` is a valid signal number for which a handler may be set.
        unsafe { libc::signal(signal, record as *const () as libc::sighandler_t) };
    }
}

/// The last termination signal received since the previous call, if any.
pub fn take() -> Option<i32> {
    match RECEIVED.swap(0, Ordering::SeqCst) {
        0 => None,
        signal => Some(signal),
    }
}
