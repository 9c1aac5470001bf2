//! Signals as flags the main loops poll: SIGINT and SIGTERM for the daemons,
//! and for `livereg run` every catchable terminating signal, to forward.

use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};

static RECEIVED: AtomicI32 = AtomicI32::new(0);

/// Bit `n` set: signal `n` was sent to this process and awaits forwarding.
static TO_FORWARD: AtomicU64 = AtomicU64::new(0);

/// The signals `livereg run` passes on to its program: every one whose
/// default action ends a process and that a process may catch (SIGPIPE aside:
/// the wrapper's own writes raise it).
pub const FORWARDED: [libc::c_int; 7] = [
    libc::SIGHUP,
    libc::SIGINT,
    libc::SIGQUIT,
    libc::SIGTERM,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGALRM,
];

extern "C" fn record(signal: libc::c_int) {
    RECEIVED.store(signal, Ordering::SeqCst);
}

extern "C" fn record_to_forward(
    signal: libc::c_int,
    info: *mut libc::siginfo_t,
    _context: *mut libc::c_void,
) {
    // SAFETY: the kernel passes a valid `siginfo_t` to SA_SIGINFO handlers.
    let code = unsafe { (*info).si_code };
    // A signal the terminal raised (Ctrl-C, Ctrl-\, hangup) went to the
    // whole foreground process group, the program included: passing it on
    // would deliver it twice.
    if code != libc::SI_KERNEL {
        TO_FORWARD.fetch_or(1 << signal, Ordering::SeqCst);
    }
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

/// Routes every signal of [`FORWARDED`] to [`take_to_forward`] instead of
/// ending the process.
pub fn catch_to_forward() {
    for signal in FORWARDED {
        // SAFETY:
        // - `action` is zero-initialised plain data, then filled in;
        // - `record_to_forward` reads the siginfo and stores to an atomic,
        //   both async-signal-safe;
        // - `signal` is a valid, catchable signal number.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = record_to_forward as *const () as libc::sighandler_t;
            action.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(signal, &action, std::ptr::null_mut());
        }
    }
}

/// The last termination signal received since the previous call, if any.
pub fn take() -> Option<i32> {
    match RECEIVED.swap(0, Ordering::SeqCst) {
        0 => None,
        signal => Some(signal),
    }
}

/// Whether a termination signal is waiting for [`take`] (left for it).
pub fn pending() -> bool {
    RECEIVED.load(Ordering::SeqCst) != 0
}

/// The signals received for forwarding since the previous call.
pub fn take_to_forward() -> impl Iterator<Item = libc::c_int> {
    let pending = TO_FORWARD.swap(0, Ordering::SeqCst);
    FORWARDED
        .into_iter()
        .filter(move |signal| pending & (1 << signal) != 0)
}
