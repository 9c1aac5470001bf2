//! The types shared with C, `#[repr(C)]`, field for field as in the header.

use crate::sized::SizedStruct;
use livereg::Reason;
use std::ffi::{c_char, c_void};
use std::mem::{offset_of, size_of};

macro_rules! c_results {
    ($(($value:literal, $c:ident, $name:literal, $title:literal, $builtin:literal, $meaning:literal)),* $(,)?) => {
        /// Result of every fallible function. Values are stable.
        #[repr(C)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum livereg_result {
            $(#[doc = $meaning] $c = $value,)*
        }

        impl livereg_result {
            /// Every value, in order.
            pub const ALL: [livereg_result; [$($value),*].len()] = [$(livereg_result::$c),*];
        }
    };
}

// The core crate's one list of result codes.
livereg::result_code_list!(c_results);

impl livereg_result {
    /// The result of value `value`, if there is one.
    pub fn from_value(value: u32) -> Option<livereg_result> {
        Self::ALL.get(usize::try_from(value).ok()?).copied()
    }
}

macro_rules! c_reasons {
    ($(($value:literal, $variant:ident, $c:ident, $name:literal, $meaning:literal)),* $(,)?) => {
        /// Why a registration ended.
        #[repr(C)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum livereg_reason {
            $(#[doc = $meaning] $c = $value,)*
        }

        impl From<Reason> for livereg_reason {
            fn from(reason: Reason) -> Self {
                match reason {
                    $(Reason::$variant => livereg_reason::$c,)*
                }
            }
        }
    };
}

// The core crate's one list of reasons.
livereg::reason_list!(c_reasons);

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

// SAFETY: integers only.
unsafe impl SizedStruct for livereg_options {
    const NAME: &'static str = "livereg_options";
    const SIZES: &'static [usize] = &[32];
    /// Unchanged since the oldest supported release.
    const LEGACY_SIZE: usize = 32;
}
const _: () = assert!(size_of::<livereg_options>() == 32);

/// Entries of `livereg_stats.ended_by_reason`.
pub const REASON_SLOTS: usize = 16;
const _: () = assert!(Reason::ALL.len() < REASON_SLOTS);

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
    /// Ended registrations by reason, indexed by `livereg_reason` (0 and
    /// values no reason has yet are 0): room for reasons to come without
    /// changing the struct again.
    pub ended_by_reason: [u64; REASON_SLOTS],
    /// Handlers that failed, since creation.
    pub handler_failures: u64,
    /// Scans by all reapers.
    pub scans: u64,
}

// SAFETY: integers and an array of them only.
unsafe impl SizedStruct for livereg_stats {
    const NAME: &'static str = "livereg_stats";
    const SIZES: &'static [usize] = &[192];
    /// Unchanged since the oldest supported release.
    const LEGACY_SIZE: usize = 192;
}
const _: () = assert!(size_of::<livereg_stats>() == 192);

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
    /// 1 if a session's client held it (through a listener), else 0.
    pub remote: u32,
}

/// Callbacks of a reaper; any may be NULL.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct livereg_callbacks {
    /// Passed back to every callback.
    pub userdata: *mut c_void,
    /// Called once per ended registration, on the reaper's thread.
    pub on_drop:
        Option<unsafe extern "C" fn(userdata: *mut c_void, event: *const livereg_drop_event)>,
    /// Called once per completed clear, after its drops.
    pub on_clear: Option<unsafe extern "C" fn(userdata: *mut c_void)>,
    /// Called once per registration whose process the kernel began to end,
    /// before its `on_drop`, with the same event.
    pub on_dying:
        Option<unsafe extern "C" fn(userdata: *mut c_void, event: *const livereg_drop_event)>,
}

// SAFETY: a raw pointer and optional function pointers only: all-zero is
// NULL everywhere.
unsafe impl SizedStruct for livereg_callbacks {
    const NAME: &'static str = "livereg_callbacks";
    /// Before `on_dying` (three words), and with it.
    const SIZES: &'static [usize] = &[24, 32];
    /// The three words of the releases before `on_dying`: a program built
    /// then has whatever follows its struct where `on_dying` now is. (The
    /// releases that added `on_dying` called the same plain entry points
    /// with four words; they cannot be told apart, and reading the fourth
    /// word of a three-word struct calls garbage: the plain entry points
    /// read three, and tell no program of dying.)
    const LEGACY_SIZE: usize = offset_of!(livereg_callbacks, on_dying);
}
const _: () = assert!(offset_of!(livereg_callbacks, on_dying) == 24);
const _: () = assert!(size_of::<livereg_callbacks>() == 32);
