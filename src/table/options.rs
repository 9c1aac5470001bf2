//! How a new table is made: its capacity, timeouts, mode and clock, each
//! checked before anything is created, and the clock its registrants will
//! stamp with decided from them.

use crate::clock::{duration_ns, StampClock, Stamps, MIN_TIMEOUT_TICKS};
use crate::error::{Error, Result};
use crate::os::clock::coarse_resolution_ns;
use crate::table::layout::{MAX_CAPACITY, SCANS_PER_TIMEOUT};
use crate::table::owned_dirs;
use crate::table::removal_rules::{MAX_DIRS, NAME_MAX};
use std::path::PathBuf;
use std::time::Duration;

/// The registration grace when none is given: this, or the reap timeout if
/// longer (a worker's first beat may come after a slow start).
pub const DEFAULT_REGISTRATION_GRACE: Duration = Duration::from_secs(30);

/// How a new table is made.
///
/// # Examples
///
/// ```
/// use livereg::TableOptions;
/// use std::time::Duration;
///
/// let options = TableOptions {
///     capacity: 64,
///     reap_timeout: Duration::from_secs(2),
///     registration_grace: Duration::from_secs(10),
///     ..TableOptions::default()
/// };
/// assert_eq!(options.mode, 0o600);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableOptions {
    /// Number of slots, 1 to 1,048,576.
    pub capacity: u32,
    /// Permission bits of the object (default `0o600`; `0o660` shares it with
    /// a group). The owner always needs read and write.
    pub mode: u32,
    /// Silence budget of a worker that has beaten at least once; zero disables
    /// reaping.
    pub reap_timeout: Duration,
    /// Silence budget of a worker that registered and never beat; at least
    /// `reap_timeout`.
    pub registration_grace: Duration,
    /// How long a busy worker may make no progress before it ends
    /// `Stalled`; zero (the default) turns the check off.
    /// At least one scan interval.
    pub progress_timeout: Duration,
    /// Which clock registrants stamp heartbeats with (default
    /// [`StampClock::Auto`]: the coarse one where the timeout allows).
    pub stamp_clock: StampClock,
    /// The directories where a process may own files the reaper removes
    /// once it has ended ([`Table::own_file`](crate::Table::own_file)):
    /// default `/dev/shm`; at most 4 absolute paths of at most 255 bytes,
    /// none of them holding `..`. Empty: no file may be owned.
    pub owned_dirs: Vec<PathBuf>,
}

impl Default for TableOptions {
    fn default() -> Self {
        TableOptions {
            capacity: 256,
            mode: 0o600,
            reap_timeout: Duration::from_secs(10),
            registration_grace: DEFAULT_REGISTRATION_GRACE,
            progress_timeout: Duration::ZERO,
            stamp_clock: StampClock::Auto,
            owned_dirs: vec![PathBuf::from("/dev/shm")],
        }
    }
}

impl TableOptions {
    pub(crate) fn validate(&self) -> Result<()> {
        let invalid = |message: String| Err(Error::InvalidArgument(message));
        if self.capacity == 0 || self.capacity > MAX_CAPACITY {
            return invalid(format!(
                "capacity {} is out of range, expected 1 to {MAX_CAPACITY}",
                self.capacity
            ));
        }
        if self.mode & !0o777 != 0 || self.mode & 0o600 != 0o600 {
            return invalid(format!(
                "mode {:o} is not usable, expected permission bits (at most 777) including owner read/write (600)",
                self.mode
            ));
        }
        let scan = self.reap_timeout / SCANS_PER_TIMEOUT;
        if !self.progress_timeout.is_zero()
            && (self.reap_timeout.is_zero() || self.progress_timeout < scan)
        {
            return invalid(format!(
                "progress timeout {:?} is below one scan interval ({scan:?}) or reaping is off, expected 0 (off) or at least {scan:?}",
                self.progress_timeout
            ));
        }
        if self.registration_grace < self.reap_timeout {
            return invalid(format!(
                "registration grace {:?} is shorter than the reap timeout {:?}, expected grace >= timeout",
                self.registration_grace, self.reap_timeout
            ));
        }
        if self.owned_dirs.len() > MAX_DIRS {
            return invalid(format!(
                "{} owned-file directories given, expected at most {MAX_DIRS}",
                self.owned_dirs.len()
            ));
        }
        for dir in &self.owned_dirs {
            if !owned_dirs::usable(dir) {
                return invalid(format!(
                    "owned-file directory '{}' is not usable, expected an absolute path of at most {NAME_MAX} bytes without '..', a newline or a NUL",
                    dir.display()
                ));
            }
        }
        if self.stamp_clock == StampClock::Coarse && self.stamps() == Stamps::Precise {
            return invalid(format!(
                "the coarse clock's resolution {:?} is more than 1/{MIN_TIMEOUT_TICKS} of the reap timeout {:?}, \
                 expected a timeout of at least {:?} (or the precise clock)",
                Duration::from_nanos(coarse_resolution_ns()),
                self.reap_timeout,
                Duration::from_nanos(coarse_resolution_ns()) * MIN_TIMEOUT_TICKS
            ));
        }
        Ok(())
    }

    /// How registrants of a table made with these options stamp.
    pub(crate) fn stamps(&self) -> Stamps {
        let resolution_ns = coarse_resolution_ns();
        let fits = resolution_ns > 0
            && resolution_ns.saturating_mul(u64::from(MIN_TIMEOUT_TICKS))
                <= duration_ns(self.reap_timeout);
        match self.stamp_clock {
            StampClock::Auto | StampClock::Coarse if fits => Stamps::Coarse { resolution_ns },
            _ => Stamps::Precise,
        }
    }
}
