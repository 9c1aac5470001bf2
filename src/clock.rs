//! The monotonic clock every timestamp in a table is read from, and a manual
//! clock that tests move by hand.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A source of nanosecond timestamps: `CLOCK_MONOTONIC`, or a manual clock.
///
/// Every process reads `CLOCK_MONOTONIC`, which is system-wide (outside time
/// namespaces), so timestamps written by one process are comparable in another.
///
/// # Examples
///
/// ```
/// use livereg::Clock;
/// use std::time::Duration;
///
/// let manual = Clock::manual(1_000);
/// let clock = manual.clock();
/// manual.advance(Duration::from_nanos(500));
/// assert_eq!(clock.now_ns(), 1_500);
/// ```
#[derive(Clone, Debug, Default)]
pub struct Clock(Source);

#[derive(Clone, Debug, Default)]
enum Source {
    #[default]
    Monotonic,
    Manual(Arc<AtomicU64>),
}

impl Clock {
    /// The system's `CLOCK_MONOTONIC`.
    pub fn monotonic() -> Clock {
        Clock(Source::Monotonic)
    }

    /// A clock that stands at `start_ns` until moved through the returned handle.
    pub fn manual(start_ns: u64) -> ManualClock {
        ManualClock(Arc::new(AtomicU64::new(start_ns)))
    }

    /// Now, in nanoseconds.
    #[inline]
    pub fn now_ns(&self) -> u64 {
        match &self.0 {
            Source::Monotonic => monotonic_ns(),
            Source::Manual(now) => now.load(Ordering::SeqCst),
        }
    }
}

/// The handle that moves a manual [`Clock`].
#[derive(Clone, Debug)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    /// A [`Clock`] reading this handle's time.
    pub fn clock(&self) -> Clock {
        Clock(Source::Manual(self.0.clone()))
    }

    /// Moves the time forward by `by`.
    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(duration_ns(by), Ordering::SeqCst);
    }

    /// Sets the time to `now_ns`.
    pub fn set(&self, now_ns: u64) {
        self.0.store(now_ns, Ordering::SeqCst);
    }

    /// The current time.
    pub fn now_ns(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// `clock_gettime(CLOCK_MONOTONIC)` in nanoseconds: a vDSO read, no system call.
#[inline]
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY:
    // - `ts` is a valid, writable `timespec` for the duration of the call.
    // - CLOCK_MONOTONIC is supported on every Linux, so the call cannot fail;
    //   were it to, `ts` keeps its zero value and we return 0.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A duration in nanoseconds, saturating at `u64::MAX`.
pub(crate) fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}
