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
    /// A manual clock's time and identity.
    Manual(Arc<AtomicU64>, u64),
}

/// Identities of manual clocks: far above any inode number, one per
/// [`Clock::manual`] call.
static NEXT_MANUAL: AtomicU64 = AtomicU64::new(1 << 63);

impl Clock {
    /// The system's `CLOCK_MONOTONIC`.
    pub fn monotonic() -> Clock {
        Clock(Source::Monotonic)
    }

    /// A clock that stands at `start_ns` until moved through the returned
    /// handle. Each call makes a clock of its own [`identity`](Clock::identity).
    pub fn manual(start_ns: u64) -> ManualClock {
        ManualClock(
            Arc::new(AtomicU64::new(start_ns)),
            NEXT_MANUAL.fetch_add(1, Ordering::Relaxed),
        )
    }

    /// Now, in nanoseconds.
    #[inline]
    pub fn now_ns(&self) -> u64 {
        match &self.0 {
            Source::Monotonic => monotonic_ns(),
            Source::Manual(now, _) => now.load(Ordering::SeqCst),
        }
    }

    /// Which clock this is: readings of two clocks compare only when their
    /// identities are equal and not [`Clock::UNKNOWN`]. For `CLOCK_MONOTONIC`
    /// it names the process's time namespace (processes in different time
    /// namespaces see offset clocks); each manual clock has its own.
    ///
    /// # Examples
    ///
    /// ```
    /// use livereg::Clock;
    ///
    /// assert_eq!(Clock::monotonic().identity(), Clock::monotonic().identity());
    /// let manual = Clock::manual(0);
    /// assert_eq!(manual.clock().identity(), manual.clock().identity());
    /// assert_ne!(manual.clock().identity(), Clock::manual(0).clock().identity());
    /// ```
    pub fn identity(&self) -> u64 {
        match &self.0 {
            Source::Monotonic => crate::os::process::time_namespace(),
            Source::Manual(_, identity) => *identity,
        }
    }

    /// The identity of a clock that could not be named: it compares equal
    /// to none, so its readings are never trusted by another process.
    pub const UNKNOWN: u64 = 0;
}

/// The handle that moves a manual [`Clock`].
#[derive(Clone, Debug)]
pub struct ManualClock(Arc<AtomicU64>, u64);

impl ManualClock {
    /// A [`Clock`] reading this handle's time.
    pub fn clock(&self) -> Clock {
        Clock(Source::Manual(self.0.clone(), self.1))
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
