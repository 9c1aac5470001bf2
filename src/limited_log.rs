//! Log lines a peer can cause, at most one a second per call site: a client
//! that misbehaves in a loop (wrong tokens, garbage, idle connections,
//! descriptor exhaustion) cannot flood the daemon's log. Each line that is
//! let through says how many like it were held back since the last.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// One call site's budget: the second it last logged in, and how many of
/// its lines were held back since.
pub(crate) struct Limiter {
    last_second: AtomicU64,
    held_back: AtomicU64,
}

impl Limiter {
    pub(crate) const fn new() -> Limiter {
        Limiter {
            last_second: AtomicU64::new(0),
            held_back: AtomicU64::new(0),
        }
    }

    /// `Some(held back since the last)` if a line may be logged now (the
    /// first of this second), `None` if it is to be held back.
    pub(crate) fn admit(&self) -> Option<u64> {
        self.admit_at(crate::clock::monotonic_ns() / 1_000_000_000 + 1)
    }

    fn admit_at(&self, second: u64) -> Option<u64> {
        let last = self.last_second.load(Relaxed);
        if second > last
            && self
                .last_second
                .compare_exchange(last, second, Relaxed, Relaxed)
                .is_ok()
        {
            Some(self.held_back.swap(0, Relaxed))
        } else {
            self.held_back.fetch_add(1, Relaxed);
            None
        }
    }
}

/// `log::log!` at most once a second from this call site, with how many
/// lines it held back: `limited_log!(log::Level::Warn, "refused {peer}")`.
macro_rules! limited_log {
    ($level:expr, $($arg:tt)+) => {{
        static LIMITER: $crate::limited_log::Limiter = $crate::limited_log::Limiter::new();
        if log::log_enabled!($level) {
            if let Some(held_back) = LIMITER.admit() {
                if held_back == 0 {
                    log::log!($level, $($arg)+);
                } else {
                    log::log!($level, "{} ({held_back} more like it not logged since the last)", format_args!($($arg)+));
                }
            }
        }
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
}
