//! Why a registration ended, and the event its drop handlers receive.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::Duration;

/// The one list of reasons, in value order: `(value, variant, C identifier,
/// name, meaning)` for each. It hands every row to `$callback!`, which is how
/// [`Reason`] here and the C ABI's `livereg_reason` enum are made; the C
/// header is checked against it by the C library's tests.
#[doc(hidden)]
#[macro_export]
macro_rules! reason_list {
    ($callback:ident) => {
        $callback! {
            (1, Timeout, LIVEREG_REASON_TIMEOUT, "timeout",
                "It had beaten at least once and then stayed silent for `reap_timeout`."),
            (2, Grace, LIVEREG_REASON_GRACE, "grace",
                "It registered, never beat, and stayed silent for `registration_grace`."),
            (3, ProcessExited, LIVEREG_REASON_PROCESS_EXITED, "process_exited",
                "Its process exited (or was killed) while registered."),
            (4, Deregistered, LIVEREG_REASON_DEREGISTERED, "deregistered",
                "The worker deregistered: a clean exit."),
            (5, Cleared, LIVEREG_REASON_CLEARED, "cleared",
                "A reset ended every registration."),
            (6, Replaced, LIVEREG_REASON_REPLACED, "replaced",
                "A new registration of the same instance id replaced it."),
            (7, Stalled, LIVEREG_REASON_STALLED, "stalled",
                "It was busy and made no progress for the table's `progress_timeout` (its heartbeat may have gone on: the engine is stuck, not dead)."),
            (8, Disconnected, LIVEREG_REASON_DISCONNECTED, "disconnected",
                "A session's connection closed without a deregistration (its client process died or the connection was cut), or its client did not come back within `reap_timeout` after the reaper restarted."),
        }
    };
}

macro_rules! reason_enum {
    ($(($value:literal, $variant:ident, $c:ident, $name:literal, $meaning:literal)),* $(,)?) => {
        /// Why a registration ended. The numeric values are part of the table
        /// format and of the C ABI (`LIVEREG_REASON_*`).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(rename_all = "snake_case")]
        #[repr(u8)]
        pub enum Reason {
            $(#[doc = $meaning] $variant = $value,)*
        }

        impl Reason {
            /// Every reason, in numeric order.
            pub const ALL: [Reason; [$($value),*].len()] = [$(Reason::$variant),*];

            /// The lower-case name used by the CLI, JSON and hook environment
            /// (`timeout`, `grace`, `process_exited`, …).
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Reason::$variant => $name,)*
                }
            }
        }
    };
}

reason_list!(reason_enum);

impl Reason {
    /// Whether the reaper ended the registration against its registrant's
    /// will (silence, exit, stall), rather than the registrant or a
    /// requester (deregistration, clear, replacement).
    pub fn is_eviction(self) -> bool {
        // Exhaustive: a new reason does not compile until it is placed.
        match self {
            Reason::Timeout
            | Reason::Grace
            | Reason::ProcessExited
            | Reason::Stalled
            | Reason::Disconnected => true,
            Reason::Deregistered | Reason::Cleared | Reason::Replaced => false,
        }
    }

    /// The reason with numeric value `code`, if there is one.
    pub fn from_code(code: u8) -> Option<Reason> {
        Reason::ALL.into_iter().find(|r| *r as u8 == code)
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
    /// The process id it registered with, in the registrant's PID namespace;
    /// for a session (`remote`), the pid its client claimed, which nothing
    /// verified.
    pub pid: u32,
    /// Whether it was a session's (registered through a listener): its
    /// `pid` is the client's claim, its host's, not this host's.
    pub remote: bool,
    /// Its label (empty if none).
    pub label: String,
    /// The registrant's monotonic clock at registration, in nanoseconds.
    pub registered_ns: u64,
    /// Its last heartbeat on its own monotonic clock, or `None` if it never beat.
    pub last_heartbeat_ns: Option<u64>,
    /// How long it had been silent when the reaper ended it, as the reaper
    /// judged it (zero for deregistrations, clears and replacements). A
    /// `timeout` another party ended (a session's listener, a reaper that
    /// died before its drop) is measured the same way, on this reaper's
    /// clock, from its last beat, or from its registration if it never beat;
    /// where its last beat is on a clock this reaper cannot read (a worker in
    /// another time namespace) and this reaper saw none of its beat words,
    /// the reap timeout: the least silence that ending needed.
    pub silent_for: Duration,
}
