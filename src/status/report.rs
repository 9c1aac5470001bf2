//! A snapshot of a table for operators and dashboards, serialisable with serde.

use crate::clock::{Clock, StampClock};
use crate::event::Reason;
use crate::session::{Record, Records};
use crate::sync::Ordering::{Acquire, Relaxed};
use crate::table::handle::Table;
use crate::status::owned::{self, OwnedFilesStatus};
use crate::table::layout::{FLAG_PIDFD, FLAG_REGION_DEATH_WORD, FLAG_REMOTE, SCANS_PER_TIMEOUT};
use crate::table::protocol::{self, Beat, LIVE};
use serde::{Deserialize, Serialize};
use std::cell::OnceCell;
use std::collections::BTreeMap;
use std::collections::HashMap;

/// What a table holds and how its reaper is doing. Serialises to the keys of
/// the reference's `worker_liveness` (`enabled`, `reap_timeout_seconds`,
/// `registration_grace_seconds`, `tracked_instances`) and more.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Status {
    /// The table's name.
    pub table: String,
    /// Whether reaping is configured (a non-zero reap timeout).
    pub enabled: bool,
    /// Silence budget of workers that have beaten.
    pub reap_timeout_seconds: f64,
    /// Silence budget of workers that never beat.
    pub registration_grace_seconds: f64,
    /// How often the reaper scans.
    pub scan_interval_seconds: f64,
    /// How long a busy registration may make no progress (0: not judged).
    pub progress_timeout_seconds: f64,
    /// The clock heartbeats stamp with (`"precise"` or `"coarse"`).
    pub stamp_clock: StampClock,
    /// The coarse clock's resolution (0 for precise stamps): evictions come
    /// up to `STAMP_LAG_TICKS` times this much later than on the precise
    /// clock.
    pub stamp_resolution_seconds: f64,
    /// Live (not ended) registrations.
    pub tracked_instances: usize,
    /// Number of slots.
    pub capacity: u32,
    /// Whether a reaper holds the table (the kernel's reaper lock).
    pub reaper_alive: bool,
    /// Whether that reaper has not scanned for two scan intervals (stuck in a
    /// handler, or stopped); judged only on the reaper's own clock.
    pub reaper_stalled: bool,
    /// The reaper's pid in its own namespace (0: none recorded).
    pub reaper_pid: u32,
    /// Changes whenever a reaper (re)starts.
    pub boot_token: u64,
    /// Time since the reaper's last scan, on this handle's clock; `None`
    /// (`null`) if no reaper ever ran on the table, or if its clock is not
    /// this handle's (another time namespace: the readings don't compare).
    pub reaper_heartbeat_age_seconds: Option<f64>,
    /// Scans done by all reapers of this table.
    pub scans: u64,
    /// Duration of the last scan.
    pub last_scan_seconds: f64,
    /// Ended registrations by reason, since creation (serialised by name,
    /// `cleared` to `timeout`).
    #[serde(serialize_with = "by_reason_name")]
    pub ended: BTreeMap<Reason, u64>,
    /// The sum of `ended`.
    pub ended_total: u64,
    /// Drop and clear handlers that failed or panicked, since creation.
    pub handler_failures: u64,
    /// Handlers that ran past their deadline (30 s by default), since creation.
    pub handlers_overdue: u64,
    /// Slots the last scan found in a state no writer of ours produces.
    pub corrupt_slots: u64,
    /// Clears requested and completed, since creation.
    pub clears_requested: u64,
    /// Clears the reaper completed.
    pub clears_completed: u64,
    /// Every occupied slot.
    pub registrations: Vec<RegistrationStatus>,
    /// The files processes own, removed once they have ended; absent for
    /// a table made without owned-file records (an earlier build, a heap
    /// table).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owned_files: Option<OwnedFilesStatus>,
}

/// One occupied slot.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RegistrationStatus {
    /// Slot index.
    pub slot: u32,
    /// The slot's generation.
    pub generation: u32,
    /// Registered instance id.
    pub instance_id: u64,
    /// Label (may be empty).
    pub label: String,
    /// Registered pid, in the registrant's namespace.
    pub pid: u32,
    /// `live`, `dying` once its process began to exit, or `ending` while
    /// its drop is pending.
    pub state: RegistrationState,
    /// Why it ended, once it has.
    pub ended_reason: Option<Reason>,
    /// Heartbeats counted (advisory).
    pub heartbeats: u64,
    /// Whether the worker says it has work in flight.
    pub busy: bool,
    /// Steps of progress counted.
    pub progress_steps: u64,
    /// Time since the reaper saw its progress (or busy/idle) last change, on
    /// this handle's clock; `None` if no reaper judges progress, or its clock
    /// is not this handle's.
    pub last_progress_age_seconds: Option<f64>,
    /// Time since its last heartbeat, or `None` if it never beat or stamps
    /// with another clock than this handle's (another time namespace).
    pub last_heartbeat_age_seconds: Option<f64>,
    /// Time since it registered, or `None` if it stamps with another clock.
    pub registered_age_seconds: Option<f64>,
    /// How its process's exit is detected.
    pub exit_detection: ExitDetection,
    /// Whether its process's death word speaks for it: its death is seen
    /// as it begins (`dying`). For a session: its client beats in a region
    /// over `unix:` and holds its word there. Absent from the JSON while
    /// false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub death_word: bool,
    /// For a session's registration: who holds it, over which connection.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remote: Option<RemoteStatus>,
}

/// A session's registration, as its listener recorded it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteStatus {
    /// The peer as the listener saw it: `tcp ADDRESS:PORT`, or `unix
    /// pid=… uid=… gid=…` (the kernel's credentials of the connecting
    /// process; pid 0 if it lives in a PID namespace the listener cannot
    /// see).
    pub peer: String,
    /// The host name the client reported.
    pub host: String,
    /// Whether the running reaper's listener holds its connection (false:
    /// its client is away, and has until the timeout to come back).
    pub connected: bool,
}

/// Where a registration is in its life, as `status` shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RegistrationState {
    /// Registered and not ended.
    Live,
    /// Not ended, but its process has begun to exit (the kernel marked its
    /// death word): it runs no more of its code; `ending` once the reaper
    /// has seen it end.
    Dying,
    /// Ended; its drop is pending (the reaper has not finished it).
    Ending,
}

/// How a registration's process exit is detected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExitDetection {
    /// The reaper watches the process through a pidfd and wakes at once; the
    /// slot's kernel lock confirms.
    #[serde(rename = "pidfd+lock")]
    PidfdAndLock,
    /// A kernel-held lock, seen at the next scan: the process is in another
    /// PID namespace, or not yet verified.
    #[serde(rename = "lock")]
    Lock,
    /// None: a heap table (tests), where nothing dies.
    #[serde(rename = "none")]
    Nothing,
    /// A session: its connection's closing, seen by the listener at once.
    #[serde(rename = "connection")]
    Connection,
}

impl RegistrationState {
    /// The word `status` prints.
    pub fn as_str(self) -> &'static str {
        match self {
            RegistrationState::Live => "live",
            RegistrationState::Dying => "dying",
            RegistrationState::Ending => "ending",
        }
    }
}

impl ExitDetection {
    /// The word `status` prints.
    pub fn as_str(self) -> &'static str {
        match self {
            ExitDetection::PidfdAndLock => "pidfd+lock",
            ExitDetection::Lock => "lock",
            ExitDetection::Nothing => "none",
            ExitDetection::Connection => "connection",
        }
    }
}

/// Serialises counts keyed by reason as a map keyed by the reasons' names,
/// in name order (the order `status --json` has always had).
fn by_reason_name<S: serde::Serializer>(
    counts: &BTreeMap<Reason, u64>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    let by_name: BTreeMap<&str, u64> = counts
        .iter()
        .map(|(reason, count)| (reason.as_str(), *count))
        .collect();
    serializer.collect_map(by_name)
}

fn seconds(ns: u64) -> f64 {
    ns as f64 / 1e9
}

impl Table {
    /// A snapshot of the table. Slots in impossible states are counted in
    /// `corrupt_slots` by the reaper and left out here.
    ///
    /// # Errors
    ///
    /// [`Error::Corrupt`](crate::error::Error::Corrupt) if the object was truncated
    /// under this handle (its slots are not read then).
    pub fn status(&self) -> crate::error::Result<Status> {
        let inner = &self.memory;
        inner.check_size()?;
        let header = inner.header();
        let view = View {
            reaper_alive: self.reaper_alive(),
            now: self.clock.now_ns(),
            clock_id: self.clock.identity(),
            reaper_clock: self.clock.identity() != Clock::UNKNOWN
                && header.reaper_clock_id.load(Relaxed) == self.clock.identity(),
            shared: inner.file().is_some(),
            death_words: inner.death_words().is_some(),
        };
        let records = OnceCell::new();
        let registrations: Vec<RegistrationStatus> = (0..inner.capacity)
            .filter_map(|index| self.registration_status(index, &view, &records))
            .collect();
        let age = |then: u64| view.age(then);
        let ended: BTreeMap<Reason, u64> = Reason::ALL
            .into_iter()
            .map(|reason| (reason, header.ended_counter(reason).load(Relaxed)))
            .collect();
        let timeout_ns = header.reap_timeout_ns.load(Relaxed);
        Ok(Status {
            table: inner.name.clone(),
            enabled: timeout_ns > 0,
            reap_timeout_seconds: seconds(timeout_ns),
            registration_grace_seconds: seconds(header.registration_grace_ns.load(Relaxed)),
            scan_interval_seconds: seconds(timeout_ns / u64::from(SCANS_PER_TIMEOUT)),
            progress_timeout_seconds: seconds(header.progress_timeout_ns.load(Relaxed)),
            stamp_clock: self.stamp_clock(),
            stamp_resolution_seconds: self.stamp_resolution().as_secs_f64(),
            tracked_instances: registrations
                .iter()
                .filter(|r| r.state != RegistrationState::Ending)
                .count(),
            capacity: inner.capacity,
            reaper_alive: view.reaper_alive,
            reaper_stalled: self.reaper_stalled(),
            reaper_pid: header.reaper_pid.load(Relaxed),
            boot_token: header.boot_token.load(Acquire),
            // Every reaper writes a non-zero boot token when it starts; its
            // heartbeat is a reading of its own clock, comparable only on
            // the same one (another time namespace reads another clock).
            reaper_heartbeat_age_seconds: (header.boot_token.load(Acquire) != 0
                && view.reaper_clock)
                .then(|| age(header.reaper_heartbeat_ns.load(Acquire))),
            scans: header.scans.load(Relaxed),
            last_scan_seconds: seconds(header.last_scan_duration_ns.load(Relaxed)),
            // Counters are read from a table anyone may write: saturate.
            ended_total: ended.values().fold(0, |total, n| total.saturating_add(*n)),
            ended,
            handler_failures: header.handler_failures.load(Relaxed),
            handlers_overdue: header.handlers_overdue.load(Relaxed),
            corrupt_slots: header.corrupt_slots.load(Relaxed),
            clears_requested: header.clear_requested.load(Relaxed),
            clears_completed: header.clear_completed.load(Relaxed),
            registrations,
            owned_files: owned::owned_files(inner),
        })
    }
}

/// What a status read knows of its own handle: the time now, its clock's
/// identity, whether that is the reaper's clock, whether the table is shared.
struct View {
    /// Whether a reaper holds the table (a session is connected only then).
    reaper_alive: bool,
    now: u64,
    clock_id: u64,
    reaper_clock: bool,
    shared: bool,
    /// Whether the table's death words can be read (present and whole).
    death_words: bool,
}

impl View {
    fn age(&self, then: u64) -> f64 {
        seconds(self.now.saturating_sub(then))
    }
}

impl Table {
    /// Slot `index` as `status` shows it, if it holds a registration.
    fn registration_status(
        &self,
        index: u32,
        view: &View,
        records: &OnceCell<HashMap<u32, Record>>,
    ) -> Option<RegistrationStatus> {
        let inner = &self.memory;
        let slot = inner.slot(index);
        let (generation, phase) = protocol::split_state(slot.state.load(Acquire));
        let word = slot.beat.load(Acquire);
        if phase != LIVE || !protocol::beat_matches(word, generation) {
            return None;
        }
        let (last_beat, ended_reason) = match protocol::decode_beat(word) {
            Beat::Never => (None, None),
            Beat::At(stamp) => (Some(stamp), None),
            Beat::Ended(reason) => match protocol::final_beat(slot) {
                Beat::At(stamp) => (Some(stamp), reason),
                _ => (None, reason),
            },
        };
        // Ages on this handle's clock mean something only for registrants
        // that stamp with it (not another time namespace).
        let same_clock =
            view.clock_id != Clock::UNKNOWN && slot.clock_id.load(Relaxed) == view.clock_id;
        let progress = protocol::decode_progress(slot.progress.load(Relaxed));
        let remote = slot.flags.load(Relaxed) & FLAG_REMOTE != 0;
        Some(RegistrationStatus {
            slot: index,
            generation,
            instance_id: slot.instance_id.load(Relaxed),
            label: slot.load_label(),
            pid: slot.pid.load(Relaxed),
            state: if matches!(protocol::decode_beat(word), Beat::Ended(_)) {
                RegistrationState::Ending
            } else if view.death_words
                && inner
                    .death_words
                    .as_ref()
                    .is_some_and(|words| words.is_dying(index, generation))
            {
                RegistrationState::Dying
            } else {
                RegistrationState::Live
            },
            ended_reason,
            heartbeats: slot.beats.load(Relaxed),
            busy: progress.busy,
            progress_steps: progress.steps,
            last_progress_age_seconds: inner
                .progress_seen(index)
                .map(|seen| seen.load(Relaxed))
                .filter(|&seen| seen != 0 && view.reaper_clock)
                .map(|seen| view.age(seen)),
            last_heartbeat_age_seconds: last_beat
                .filter(|_| same_clock)
                .map(|stamp| view.age(stamp.ns_near(view.now))),
            registered_age_seconds: same_clock.then(|| view.age(slot.registered_ns.load(Relaxed))),
            exit_detection: match (view.shared, slot.flags.load(Relaxed) & FLAG_PIDFD != 0) {
                _ if remote => ExitDetection::Connection,
                (false, _) => ExitDetection::Nothing,
                (true, false) => ExitDetection::Lock,
                (true, true) => ExitDetection::PidfdAndLock,
            },
            // A session's client's word is in its region, which only the
            // reaper reads: it says so in the slot's flags.
            death_word: if remote {
                slot.flags.load(Relaxed) & FLAG_REGION_DEATH_WORD != 0
            } else {
                view.death_words
                    && inner
                        .death_words
                        .as_ref()
                        .is_some_and(|words| words.owner_of(index, generation).is_some())
            },
            remote: remote.then(|| {
                let record = records
                    .get_or_init(|| Records::read_all(self))
                    .get(&index)
                    .filter(|record| record.generation == generation);
                let boot_token = inner.header().boot_token.load(Acquire);
                RemoteStatus {
                    peer: record.map_or_else(String::new, |r| r.peer.clone()),
                    host: record.map_or_else(String::new, |r| r.host.clone()),
                    connected: view.reaper_alive
                        && record.is_some_and(|r| r.holder != 0 && r.holder == boot_token),
                }
            }),
        })
    }
}
