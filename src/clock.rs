//! The monotonic clock every timestamp in a table is read from, the coarse
//! reading of it that heartbeats may stamp with, and a manual clock that
//! tests move by hand.

use crate::os;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

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
    /// A manual clock's time and identity, and whether its stamps tick (see
    /// [`ManualClock::ticking_clock`]).
    Manual(Arc<AtomicU64>, u64, Ticks),
}

/// Whether a manual clock's stamps follow a table's coarse resolution.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ticks {
    /// Stamps are the exact time, whatever the table says.
    Exact,
    /// On a table whose heartbeats stamp coarsely, stamps are the start of
    /// the current tick of the table's resolution, as `CLOCK_MONOTONIC_COARSE`.
    Coarse,
}

/// Which clock a new table's registrants stamp their heartbeats with
/// ([`TableOptions::stamp_clock`](crate::TableOptions::stamp_clock)).
///
/// The coarse clock costs a few nanoseconds where the precise one costs tens
/// (see BENCHMARKS.md), but a coarse stamp is older than the heartbeat, by up
/// to a tick of the kernel (its resolution, 4 ms at `HZ=250`) plus the tick's
/// own delay. The reaper adds [`STAMP_LAG_TICKS`] resolutions before judging,
/// so a registration is still never evicted before `reap_timeout` of real
/// silence; it may be up to that much later than on the precise clock.
///
/// # Examples
///
/// ```
/// use livereg::{StampClock, Table, TableOptions};
/// use std::time::Duration;
///
/// let options = TableOptions {
///     reap_timeout: Duration::from_millis(10),
///     registration_grace: Duration::from_secs(1),
///     ..TableOptions::default()
/// };
/// // A 10 ms timeout is too short for 4 ms ticks: `Auto` stamps precisely.
/// let table = Table::in_memory(&options)?;
/// assert_eq!(table.stamp_resolution(), Duration::ZERO);
/// # Ok::<(), livereg::Error>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StampClock {
    /// The coarse clock where the reap timeout is at least
    /// [`MIN_TIMEOUT_TICKS`] of its ticks, else the precise one.
    #[default]
    Auto,
    /// `CLOCK_MONOTONIC`: stamps are exact (every table of a layout
    /// before 1.4).
    Precise,
    /// `CLOCK_MONOTONIC_COARSE`; refused where the reap timeout is shorter
    /// than [`MIN_TIMEOUT_TICKS`] of its ticks.
    Coarse,
}

/// The coarse clock stamps a table's heartbeats only where the reap timeout
/// is at least this many of its ticks (800 ms at `HZ=250`): the
/// [`STAMP_LAG_TICKS`] it adds to the eviction bound then stay within 3% of
/// the timeout.
pub const MIN_TIMEOUT_TICKS: u32 = 200;

/// How many of its ticks (its resolution) a coarse stamp may lag the
/// heartbeat, as the reaper reckons: `CLOCK_MONOTONIC_COARSE` is the time the
/// kernel's timekeeping last advanced, which happens once a tick *when the
/// tick handler of the CPU keeping time runs*, so it lags by a tick plus that
/// handler's delay. Measured on this project's 2-vCPU VM (`clock_getres`
/// 4 ms): 4.4 ms idle, 4.6 ms with every CPU busy, 9.4 ms (2.35 ticks) while
/// CI ran beside, and once 16.04 ms (4.01 ticks) on a CI machine running the
/// whole test suite on 2 vCPUs; one tick would have judged a worker early,
/// and so, that once, would four. The kernel promises no bound (a CPU
/// stalled by a long VM exit lags longer), so this is a margin of half again
/// over the worst seen, checked by a test on every CI run.
pub const STAMP_LAG_TICKS: u32 = 6;

/// How a table's registrants stamp their heartbeats: the [`StampClock`] its
/// creator decided (never `Auto`) with the coarse clock's tick, recorded in
/// its header (layout 1.4) and followed by every process. The header's
/// words for it are the table's (`table/handle.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stamps {
    /// `CLOCK_MONOTONIC`: a stamp is the time of the heartbeat.
    Precise,
    /// `CLOCK_MONOTONIC_COARSE`: a stamp is the time at the last tick before
    /// the heartbeat, so the reaper judges it as `stamp + STAMP_LAG_TICKS ×
    /// resolution_ns`.
    Coarse { resolution_ns: u64 },
}

impl Stamps {
    /// The clock decided, as a choice would name it.
    pub(crate) fn clock(self) -> StampClock {
        match self {
            Stamps::Precise => StampClock::Precise,
            Stamps::Coarse { .. } => StampClock::Coarse,
        }
    }

    /// The stamps' resolution: the coarse clock's tick, or zero.
    pub(crate) fn resolution(self) -> Duration {
        match self {
            Stamps::Precise => Duration::ZERO,
            Stamps::Coarse { resolution_ns } => Duration::from_nanos(resolution_ns),
        }
    }
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
            Source::Monotonic => os::clock::monotonic_ns(),
            Source::Manual(now, ..) => now.load(Ordering::SeqCst),
        }
    }

    /// A heartbeat's stamp, in microseconds rounded up (what a beat word
    /// holds), on a table whose registrants stamp as `stamps` say: the coarse
    /// reading where the table asks for it (a few nanoseconds, no system
    /// call). The system clocks' seconds and nanoseconds are converted
    /// directly, without a 64-bit multiply and divide.
    #[inline]
    pub(crate) fn stamp_micros(&self, stamps: Stamps) -> u64 {
        match (&self.0, stamps) {
            (Source::Monotonic, Stamps::Coarse { .. }) => os::clock::monotonic_coarse_micros(),
            (Source::Monotonic, Stamps::Precise) => os::clock::monotonic_micros(),
            (Source::Manual(now, _, Ticks::Coarse), Stamps::Coarse { resolution_ns }) => {
                let now = now.load(Ordering::SeqCst);
                (now - now % resolution_ns.max(1)).div_ceil(1_000)
            }
            (Source::Manual(now, ..), _) => now.load(Ordering::SeqCst).div_ceil(1_000),
        }
    }

    /// Whether [`Clock::stamp_micros`] lags the time on such a table: then
    /// each registration says so (a slot flag), and the reaper adds
    /// [`STAMP_LAG_TICKS`] of the table's resolution to its stamps.
    pub(crate) fn stamps_lag(&self, stamps: Stamps) -> bool {
        matches!(
            (&self.0, stamps),
            (
                Source::Monotonic | Source::Manual(_, _, Ticks::Coarse),
                Stamps::Coarse { .. }
            )
        )
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
            Source::Manual(_, identity, _) => *identity,
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
        Clock(Source::Manual(self.0.clone(), self.1, Ticks::Exact))
    }

    /// A [`Clock`] reading this handle's time whose heartbeat stamps, on a
    /// table that stamps coarsely, lag it as `CLOCK_MONOTONIC_COARSE` lags
    /// `CLOCK_MONOTONIC`: each is the start of the current tick of the
    /// table's resolution. The same [`identity`](Clock::identity) as
    /// [`ManualClock::clock`], as the two system clocks share theirs.
    pub fn ticking_clock(&self) -> Clock {
        Clock(Source::Manual(self.0.clone(), self.1, Ticks::Coarse))
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

/// A duration in nanoseconds, saturating at `u64::MAX`.
pub(crate) fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The instant `wait` from now; `None` (never) if that is past what an
/// [`Instant`] can hold, as `Duration::MAX` is.
pub(crate) fn deadline_after(wait: Duration) -> Option<Instant> {
    Instant::now().checked_add(wait)
}

/// Time left until `deadline` (`None`: unbounded).
pub(crate) fn time_left(deadline: Option<Instant>) -> Duration {
    match deadline {
        Some(deadline) => deadline.saturating_duration_since(Instant::now()),
        None => Duration::MAX,
    }
}
