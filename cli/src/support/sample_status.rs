//! A table's snapshot made of plain values, for the unit tests of what the
//! command decides from one (health, probes).

use livereg::{ExitDetection, Reason, RegistrationState, RegistrationStatus, StampClock, Status};

/// A table `t` with a 1 s timeout (scans every 250 ms), a 2 s progress
/// timeout, a live reaper that scanned 100 ms ago, and `registrations`.
pub fn status(registrations: Vec<RegistrationStatus>) -> Status {
    Status {
        table: "t".into(),
        enabled: true,
        reap_timeout_seconds: 1.0,
        registration_grace_seconds: 2.0,
        scan_interval_seconds: 0.25,
        progress_timeout_seconds: 2.0,
        stamp_clock: StampClock::Precise,
        stamp_resolution_seconds: 0.0,
        tracked_instances: registrations.len(),
        capacity: 8,
        reaper_alive: true,
        reaper_stalled: false,
        reaper_pid: 42,
        boot_token: 1,
        reaper_heartbeat_age_seconds: Some(0.1),
        scans: 10,
        last_scan_seconds: 0.0,
        ended: Reason::ALL.into_iter().map(|reason| (reason, 0)).collect(),
        ended_total: 0,
        handler_failures: 0,
        handlers_overdue: 0,
        corrupt_slots: 0,
        clears_requested: 0,
        clears_completed: 0,
        registrations,
        owned_files: None,
    }
}

/// Instance `instance_id`, live, idle, that beat 100 ms ago.
pub fn registration(instance_id: u64) -> RegistrationStatus {
    RegistrationStatus {
        slot: 0,
        generation: 0,
        instance_id,
        label: "gpu".into(),
        pid: 7,
        state: RegistrationState::Live,
        ended_reason: None,
        heartbeats: 3,
        busy: false,
        progress_steps: 0,
        last_progress_age_seconds: None,
        last_heartbeat_age_seconds: Some(0.1),
        registered_age_seconds: Some(5.0),
        exit_detection: ExitDetection::PidfdAndLock,
        death_word: false,
        remote: None,
    }
}
