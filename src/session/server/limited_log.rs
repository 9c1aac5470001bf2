//! Log lines a peer can cause, at most one a second per call site (or a
//! given number, for lines an operator wants each of in a burst): a client
//! that misbehaves in a loop (wrong tokens, garbage, idle connections,
//! descriptor exhaustion, sessions opened and dropped) cannot flood the
//! daemon's log. The first line of a second says how many like it were held
//! back since.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// One call site's budget: lines a second, the second it last logged in,
/// how many it logged in it, and how many were held back since.
pub(crate) struct Limiter {
    per_second: u64,
    last_second: AtomicU64,
    used: AtomicU64,
    held_back: AtomicU64,
}

impl Limiter {
    /// One line a second.
    pub(crate) const fn new() -> Limiter {
        Limiter::per_second(1)
    }

    /// `per_second` lines a second (at least one).
    pub(crate) const fn per_second(per_second: u64) -> Limiter {
        Limiter {
            per_second: if per_second == 0 { 1 } else { per_second },
            last_second: AtomicU64::new(0),
            used: AtomicU64::new(0),
            held_back: AtomicU64::new(0),
        }
    }

    /// `Some(held back since the last second)` if a line may be logged now
    /// (the first of this second says how many; the others of its budget
    /// 0), `None` if it is to be held back.
    pub(crate) fn admit(&self) -> Option<u64> {
        self.admit_at(crate::os::clock::monotonic_ns() / 1_000_000_000 + 1)
    }

    fn admit_at(&self, second: u64) -> Option<u64> {
        let last = self.last_second.load(Relaxed);
        if second > last
            && self
                .last_second
                .compare_exchange(last, second, Relaxed, Relaxed)
                .is_ok()
        {
            self.used.store(1, Relaxed);
            Some(self.held_back.swap(0, Relaxed))
        } else if self.used.fetch_add(1, Relaxed) < self.per_second {
            Some(0)
        } else {
            self.held_back.fetch_add(1, Relaxed);
            None
        }
    }
}

/// `log::log!` at most once a second from this call site, with how many
/// lines it held back: `limited_log!(log::Level::Warn, "refused {peer}")`;
/// `limited_log!(per_second: 32, log::Level::Info, ...)` for a burst.
macro_rules! limited_log {
    (@with $limiter:ident, $level:expr, $($arg:tt)+) => {{
        if log::log_enabled!($level) {
            if let Some(held_back) = $limiter.admit() {
                if held_back == 0 {
                    log::log!($level, $($arg)+);
                } else {
                    log::log!($level, "{} ({held_back} more like it not logged since the last)", format_args!($($arg)+));
                }
            }
        }
    }};
    (per_second: $budget:expr, $level:expr, $($arg:tt)+) => {{
        static LIMITER: $crate::session::server::limited_log::Limiter =
            $crate::session::server::limited_log::Limiter::per_second($budget);
        $crate::session::server::limited_log::limited_log!(@with LIMITER, $level, $($arg)+)
    }};
    ($level:expr, $($arg:tt)+) => {{
        static LIMITER: $crate::session::server::limited_log::Limiter = $crate::session::server::limited_log::Limiter::new();
        $crate::session::server::limited_log::limited_log!(@with LIMITER, $level, $($arg)+)
    }};
}
pub(crate) use limited_log;

#[cfg(test)]
mod tests {
    use super::Limiter;

    #[test]
    fn one_line_a_second_then_the_count_held_back() {
        let limiter = Limiter::new();
        assert_eq!(limiter.admit_at(5), Some(0));
        for _ in 0..1000 {
            assert_eq!(limiter.admit_at(5), None);
        }
        assert_eq!(limiter.admit_at(6), Some(1000));
        assert_eq!(limiter.admit_at(6), None);
        assert_eq!(limiter.admit_at(9), Some(1));
    }

    #[test]
    fn a_budget_of_lines_a_second_then_the_count_held_back() {
        let limiter = Limiter::per_second(3);
        assert_eq!(limiter.admit_at(5), Some(0));
        assert_eq!(limiter.admit_at(5), Some(0));
        assert_eq!(limiter.admit_at(5), Some(0));
        for _ in 0..10 {
            assert_eq!(limiter.admit_at(5), None);
        }
        assert_eq!(limiter.admit_at(6), Some(10));
    }
}
