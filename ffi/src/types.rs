//! The types shared with C, `#[repr(C)]`, field for field as in the header.

use livereg::Reason;
use std::ffi::{c_char, c_void};

/// Result of every fallible function. Values are stable.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum livereg_result {
    /// Success.
    LIVEREG_OK = 0,
    /// The worker's registration has ended; register again.
    LIVEREG_EVICTED = 1,
    /// No free slot.
    LIVEREG_FULL = 2,
    /// The table, or a live registration of the id, exists.
    LIVEREG_EXISTS = 3,
    /// No such table.
    LIVEREG_NOT_FOUND = 4,
    /// A NULL, a bad name, id 0, a long label, bad options.
    LIVEREG_INVALID_ARGUMENT = 5,
    /// Another layout version or slot size.
    LIVEREG_INCOMPATIBLE = 6,
    /// Impossible table contents.
    LIVEREG_CORRUPT = 7,
    /// The OS refused access.
    LIVEREG_PERMISSION = 8,
    /// A deadline passed.
    LIVEREG_TIMEOUT = 9,
    /// No reaper is alive.
    LIVEREG_NO_REAPER = 10,
    /// Another reaper holds the table, or the registration lock is stuck.
    LIVEREG_BUSY = 11,
    /// Another OS failure.
    LIVEREG_IO = 12,
    /// A panic was caught at the boundary.
    LIVEREG_PANIC = 13,
}

impl livereg_result {
    /// Every value, in order (checked against the core crate's
    /// `RESULT_CODES` and the header by the drift check).
    pub const ALL: [livereg_result; 14] = [
        livereg_result::LIVEREG_OK,
        livereg_result::LIVEREG_EVICTED,
        livereg_result::LIVEREG_FULL,
        livereg_result::LIVEREG_EXISTS,
        livereg_result::LIVEREG_NOT_FOUND,
        livereg_result::LIVEREG_INVALID_ARGUMENT,
        livereg_result::LIVEREG_INCOMPATIBLE,
        livereg_result::LIVEREG_CORRUPT,
        livereg_result::LIVEREG_PERMISSION,
        livereg_result::LIVEREG_TIMEOUT,
        livereg_result::LIVEREG_NO_REAPER,
        livereg_result::LIVEREG_BUSY,
        livereg_result::LIVEREG_IO,
        livereg_result::LIVEREG_PANIC,
    ];

    /// The result of value `value`, if there is one.
    pub fn from_value(value: u32) -> Option<livereg_result> {
        Self::ALL.get(usize::try_from(value).ok()?).copied()
    }
}

/// Why a registration ended.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum livereg_reason {
    /// Silent for the reap timeout after beating.
    LIVEREG_REASON_TIMEOUT = 1,
    /// Silent for the registration grace, never beat.
    LIVEREG_REASON_GRACE = 2,
    /// Its process exited.
    LIVEREG_REASON_PROCESS_EXITED = 3,
    /// It deregistered.
    LIVEREG_REASON_DEREGISTERED = 4,
    /// A clear ended it.
    LIVEREG_REASON_CLEARED = 5,
    /// A new registration of its id replaced it.
    LIVEREG_REASON_REPLACED = 6,
    /// Busy with no progress for the table's progress timeout.
    LIVEREG_REASON_STALLED = 7,
}

impl From<Reason> for livereg_reason {
    fn from(reason: Reason) -> Self {
        match reason {
            Reason::Timeout => livereg_reason::LIVEREG_REASON_TIMEOUT,
            Reason::Grace => livereg_reason::LIVEREG_REASON_GRACE,
            Reason::ProcessExited => livereg_reason::LIVEREG_REASON_PROCESS_EXITED,
            Reason::Deregistered => livereg_reason::LIVEREG_REASON_DEREGISTERED,
            Reason::Cleared => livereg_reason::LIVEREG_REASON_CLEARED,
            Reason::Replaced => livereg_reason::LIVEREG_REASON_REPLACED,
            Reason::Stalled => livereg_reason::LIVEREG_REASON_STALLED,
        }
    }
}

/// How `livereg_create` makes a table.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct livereg_options {
    /// Number of slots.
    pub capacity: u32,
    /// Permission bits (0600 by default).
    pub mode: u32,
    /// Silence budget after a heartbeat, in ms; 0 disables reaping.
    pub reap_timeout_ms: u64,
    /// Silence budget without a heartbeat, in ms; at least the timeout.
    pub registration_grace_ms: u64,
    /// How long a busy worker may make no progress, in ms; 0 (default) off.
    pub progress_timeout_ms: u64,
}

/// A snapshot of a table, filled by `livereg_get_stats`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct livereg_stats {
    /// Number of slots.
    pub capacity: u32,
    /// Live registrations.
    pub tracked_instances: u32,
    /// 1 if a reaper is alive.
    pub reaper_alive: u32,
    /// The reaper's pid (0: none recorded).
    pub reaper_pid: u32,
    /// Changes whenever a reaper (re)starts.
    pub boot_token: u64,
    /// Silence budget after a heartbeat, in ms.
    pub reap_timeout_ms: u64,
    /// Silence budget without a heartbeat, in ms.
    pub registration_grace_ms: u64,
    /// Ended registrations since creation.
    pub ended_total: u64,
    /// Ended registrations by reason, indexed by `livereg_reason` (0 unused).
    pub ended_by_reason: [u64; Reason::ALL.len() + 1],
    /// Handlers that failed, since creation.
    pub handler_failures: u64,
    /// Scans by all reapers.
    pub scans: u64,
}

/// What `on_drop` receives; valid only during the call.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct livereg_drop_event {
    /// The worker's instance id.
    pub instance_id: u64,
    /// The slot it occupied.
    pub slot: u32,
    /// The slot's generation for this registration.
    pub generation: u32,
    /// Why it ended.
    pub reason: livereg_reason,
    /// Its pid, in the registrant's PID namespace.
    pub pid: u32,
    /// Registration time, `CLOCK_MONOTONIC` ns of the registrant.
    pub registered_ns: u64,
    /// Last heartbeat, same clock; 0 if it never beat.
    pub last_heartbeat_ns: u64,
    /// Silence the reaper judged, in ns (0 for explicit endings).
    pub silent_ns: u64,
    /// The label, NUL-terminated.
    pub label: [c_char; livereg::LABEL_MAX + 1],
}

/// Callbacks of a reaper; either may be NULL.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct livereg_callbacks {
    /// Passed back to both callbacks.
    pub userdata: *mut c_void,
    /// Called once per ended registration, on the reaper's thread.
    pub on_drop:
        Option<unsafe extern "C" fn(userdata: *mut c_void, event: *const livereg_drop_event)>,
    /// Called once per completed clear, after its drops.
    pub on_clear: Option<unsafe extern "C" fn(userdata: *mut c_void)>,
}
