//! Why a registration ended, and the event its drop handlers receive.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::Duration;

/// Why a registration ended. The numeric values are part of the table format
/// and of the C ABI (`LIVEREG_REASON_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[repr(u8)]
pub enum Reason {
    /// It had beaten at least once and then stayed silent for `reap_timeout`.
    Timeout = 1,
    /// It registered, never beat, and stayed silent for `registration_grace`.
    Grace = 2,
    /// Its process exited (or was killed) while registered.
    ProcessExited = 3,
    /// The worker deregistered: a clean exit.
    Deregistered = 4,
    /// A reset ended every registration.
    Cleared = 5,
    /// A new registration of the same instance id replaced it.
    Replaced = 6,
    /// It was busy and made no progress for the table's `progress_timeout`
    /// (its heartbeat may have gone on: the engine is stuck, not dead).
    Stalled = 7,
}

impl Reason {
    /// Every reason, in numeric order.
    pub const ALL: [Reason; 7] = [
        Reason::Timeout,
        Reason::Grace,
        Reason::ProcessExited,
        Reason::Deregistered,
        Reason::Cleared,
        Reason::Replaced,
        Reason::Stalled,
    ];

    /// Whether the reaper ended the registration against its registrant's
    /// will (silence, exit, stall), rather than the registrant or a
    /// requester (deregistration, clear, replacement).
    pub fn is_eviction(self) -> bool {
        // Exhaustive: a new reason does not compile until it is placed.
        match self {
            Reason::Timeout | Reason::Grace | Reason::ProcessExited | Reason::Stalled => true,
            Reason::Deregistered | Reason::Cleared | Reason::Replaced => false,
        }
    }

    /// The reason with numeric value `code`, if there is one.
    pub fn from_code(code: u8) -> Option<Reason> {
        Reason::ALL.into_iter().find(|r| *r as u8 == code)
    }

    /// The lower-case name used by the CLI, JSON and hook environment
    /// (`timeout`, `grace`, `process_exited`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Timeout => "timeout",
            Reason::Grace => "grace",
            Reason::ProcessExited => "process_exited",
            Reason::Deregistered => "deregistered",
            Reason::Cleared => "cleared",
            Reason::Replaced => "replaced",
            Reason::Stalled => "stalled",
        }
    }

    /// Index into per-reason counters.
    pub(crate) fn index(self) -> usize {
        self as usize - 1
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a drop handler learns about a registration that ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DropEvent {
    /// The worker's instance id.
    pub instance_id: u64,
    /// The slot it occupied.
    pub slot: u32,
    /// The slot's generation for this registration: with `slot`, it names the
    /// registration uniquely even after the instance id registers again.
    pub generation: u32,
    /// Why it ended.
    pub reason: Reason,
    /// The process id it registered with, in the registrant's PID namespace.
    pub pid: u32,
    /// Its label (empty if none).
    pub label: String,
    /// The registrant's monotonic clock at registration, in nanoseconds.
    pub registered_ns: u64,
    /// Its last heartbeat on its own monotonic clock, or `None` if it never beat.
    pub last_heartbeat_ns: Option<u64>,
    /// How long it had been silent when the reaper ended it, as the reaper
    /// judged it (zero for deregistrations, clears and replacements).
    pub silent_for: Duration,
}
