//! The table's bytes: header and slot `#[repr(C)]` types, the constants of the
//! format, and compile-time checks that the layout is what the format says.
//!
//! # Size and alignment
//!
//! A table is one header of [`HEADER_SIZE`] bytes followed by `capacity` slots
//! of [`SLOT_SIZE`] bytes. Slots are 128-byte aligned: two 64-byte lines, so
//! the adjacent-line prefetcher of current x86 cores never pulls a neighbour's
//! heartbeat into a worker's cache (the same choice as crossbeam's
//! `CachePadded`). The hot words a heartbeat touches (`state`, `beat`,
//! `beats`) share the first line; the label lives in the second.
//!
//! Every field is an atomic: any process mapping the table may write any byte
//! at any time, so even "plain" fields are read with atomic loads. That makes a
//! hostile writer a source of wrong values, never of undefined behaviour.

use crate::sync::{AtomicU32, AtomicU64, Ordering};

/// The first eight bytes of every table: `b"LIVEREG\0"` read as little-endian.
pub const MAGIC: u64 = u64::from_le_bytes(*b"LIVEREG\0");
/// Layout major version: a table with another major version is refused.
pub const VERSION_MAJOR: u32 = 1;
/// Layout minor version: additions that older readers may ignore (1: each
/// slot records its registrant's clock identity; 2: the info area after the
/// slots; 3: progress beside liveness; 4: the clock heartbeats stamp with;
/// 5: resets, PID-namespace process tags; 6: sessions' registrations; 7:
/// the reaper's life word).
pub const VERSION_MINOR: u32 = 7;
/// The first minor version with the reaper's life word.
pub(crate) const REAPER_LIFE_SINCE_MINOR: u32 = 7;
/// The first minor version that records the clock heartbeats stamp with.
pub(crate) const STAMP_CLOCK_SINCE_MINOR: u32 = 4;
/// The first minor version with an info area.
pub(crate) const INFO_SINCE_MINOR: u32 = 2;
/// Most bytes the info area holds.
pub const INFO_MAX: usize = 1024;
/// Bytes of the info area, after the slots.
pub const INFO_AREA_SIZE: usize = 1152;
/// Bytes of the header; slots start at this offset.
pub const HEADER_SIZE: usize = 512;
/// Bytes of one slot.
pub const SLOT_SIZE: usize = 128;
/// Longest label in UTF-8 bytes.
pub const LABEL_MAX: usize = 47;
/// Scans per reap timeout: a reaper scans every `reap_timeout /
/// SCANS_PER_TIMEOUT`, so a silent registration is evicted between `timeout`
/// and `timeout + timeout / SCANS_PER_TIMEOUT` after its last signal.
pub const SCANS_PER_TIMEOUT: u32 = 4;
/// Heartbeats per reap timeout a worker should send: beating every
/// `reap_timeout / BEATS_PER_TIMEOUT`, it survives two lost or late beats.
pub const BEATS_PER_TIMEOUT: u32 = 3;
/// Largest capacity a table may have (128 MiB of slots).
pub const MAX_CAPACITY: u32 = 1 << 20;

/// Upper bounds, in seconds, of the scan-duration histogram's buckets: a
/// heartbeat sweep of 1,024 slots takes ~5 µs, an exit-checked scan of 4,096
/// registrations up to a few milliseconds.
pub const SCAN_BUCKETS: [f64; 5] = [0.000_1, 0.001, 0.01, 0.1, 1.0];
/// Upper bounds, in seconds, of the eviction-silence histogram's buckets:
/// exits seen in milliseconds, timeouts of seconds to minutes.
pub const SILENCE_BUCKETS: [f64; 7] = [0.001, 0.01, 0.1, 1.0, 10.0, 60.0, 600.0];

/// Value of [`Header::ready`] once the creator finished writing the header.
pub(crate) const READY: u32 = 0x5245_4459; // "READY" truncated: never a zero page's value

/// Reasons counted in [`Header::ended`] (the first six; `Stalled`, added
/// in layout 1.3, is counted in [`Header::ended_stalled`]).
pub(crate) const REASONS: usize = 6;

/// The table header. Identity fields are written once by the creator before
/// `ready`; the rest is shared state of the reaper and the requesters of clears.
#[repr(C, align(128))]
pub(crate) struct Header {
    pub magic: AtomicU64,
    pub version_major: AtomicU32,
    pub version_minor: AtomicU32,
    pub header_size: AtomicU32,
    pub slot_size: AtomicU32,
    pub capacity: AtomicU32,
    /// [`READY`] once the header is complete (written last, release).
    pub ready: AtomicU32,
    pub reap_timeout_ns: AtomicU64,
    pub registration_grace_ns: AtomicU64,
    /// Pid of the reaper that holds the reaper lock, in its own namespace.
    pub reaper_pid: AtomicU32,
    /// Futex word: bumped by anyone who needs the reaper now.
    pub wake: AtomicU32,
    /// Futex word: bumped by the reaper after releasing slots or finishing a
    /// clear, for those waiting on either.
    pub settled: AtomicU32,
    /// Which clock registrants stamp heartbeats with: [`STAMPS_PRECISE`]
    /// (and before layout 1.4) or [`STAMPS_COARSE`].
    pub stamp_clock: AtomicU32,
    /// The reaper's clock at its last scan.
    pub reaper_heartbeat_ns: AtomicU64,
    /// Changes whenever a reaper (re)starts.
    pub boot_token: AtomicU64,
    pub clear_requested: AtomicU64,
    pub clear_completed: AtomicU64,
    /// Ended registrations by reason, indexed by `Reason as usize - 1`.
    pub ended: [AtomicU64; REASONS],
    pub handler_failures: AtomicU64,
    pub scans: AtomicU64,
    pub last_scan_duration_ns: AtomicU64,
    pub registrations_total: AtomicU64,
    pub corrupt_slots: AtomicU64,
    /// Clear requests up to this ticket expired unserved: the reaper they
    /// were made to died, and the next one started after them (layout 1.1).
    pub clear_expired: AtomicU64,
    /// Identity of the clock `reaper_heartbeat_ns` is read from (layout 1.1).
    pub reaper_clock_id: AtomicU64,
    /// Handlers that ran past their deadline (layout 1.1).
    pub handlers_overdue: AtomicU64,
    /// How long a busy registration may make no progress (layout 1.3; 0: off).
    pub progress_timeout_ns: AtomicU64,
    /// Registrations ended as `Stalled` (layout 1.3).
    pub ended_stalled: AtomicU64,
    /// With [`STAMPS_COARSE`]: the coarse clock's resolution (its tick), in
    /// nanoseconds; the reaper allows a stamp `STAMP_LAG_TICKS` of them
    /// behind its heartbeat (layout 1.4).
    pub stamp_resolution_ns: AtomicU64,
    /// Scan durations (layout 1.4): observations per bucket of
    /// [`SCAN_BUCKETS`] (not cumulative), the last for larger ones.
    pub scan_histogram: [AtomicU64; SCAN_BUCKETS.len() + 1],
    /// The sum of the scan durations observed, in nanoseconds.
    pub scan_sum_ns: AtomicU64,
    /// Silence at eviction (timeout, grace, process exit, stall; layout
    /// 1.4): observations per bucket of [`SILENCE_BUCKETS`], the last for
    /// larger ones.
    pub silence_histogram: [AtomicU64; SILENCE_BUCKETS.len() + 1],
    /// The sum of the silences observed, in nanoseconds.
    pub silence_sum_ns: AtomicU64,
    /// Resets requested (layout 1.5): a requester adds one here before it
    /// takes its clear ticket, so a reaper that sees the ticket sees the
    /// reset, and ends every registration before the clear handlers run.
    pub reset_requested: AtomicU64,
    /// Registrations ended as `Disconnected` (layout 1.6).
    pub ended_disconnected: AtomicU64,
    /// The reaper's life word (layout 1.7), a robust futex: the id of a
    /// thread of the serving reaper's process while it serves,
    /// `OWNER_DIED` once the kernel began ending that process, 0 when no
    /// reaper of this layout holds it; see [`crate::table::reaper_life`].
    pub reaper_life: AtomicU32,
    /// Futex word (layout 1.7): bumped whenever a reaper takes or gives
    /// back the life word, for those waiting on the reaper's state.
    pub reaper_life_changes: AtomicU32,
    /// The boot token of the reaper that holds (or held) the life word.
    pub reaper_life_token: AtomicU64,
    /// That reaper's pid, in its own namespace.
    pub reaper_life_pid: AtomicU32,
    reserved_life: AtomicU32,
    reserved: [AtomicU64; 14],
}

/// Byte offsets of header fields, named for tools and tests that read or
/// tamper with a table's bytes (the fields themselves are private).
#[doc(hidden)]
pub mod header_offsets {
    use super::Header;
    use std::mem::offset_of;

    /// `magic` (8 bytes).
    pub const MAGIC: usize = offset_of!(Header, magic);
    /// `version_major` (4 bytes).
    pub const VERSION_MAJOR: usize = offset_of!(Header, version_major);
    /// `slot_size` (4 bytes).
    pub const SLOT_SIZE: usize = offset_of!(Header, slot_size);
    /// `capacity` (4 bytes).
    pub const CAPACITY: usize = offset_of!(Header, capacity);
    /// `ready` (4 bytes).
    pub const READY: usize = offset_of!(Header, ready);
    /// `ended`: the first six per-reason counters (8 bytes each).
    pub const ENDED: usize = offset_of!(Header, ended);
    /// A slot's `flags` (4 bytes), from the slot's start.
    pub const SLOT_FLAGS: usize = offset_of!(super::Slot, flags);
}

/// One registration's cache-line pair.
#[repr(C, align(128))]
pub(crate) struct Slot {
    /// `generation << 32 | state`; see [`crate::table::protocol`].
    pub state: AtomicU64,
    /// `tag << 48 | time`: the heartbeat word; see [`crate::table::protocol`].
    pub beat: AtomicU64,
    /// Heartbeats counted by the owner (a plain store, for status only).
    pub beats: AtomicU64,
    pub instance_id: AtomicU64,
    /// The registrant's clock at registration, in nanoseconds.
    pub registered_ns: AtomicU64,
    /// Start time of `pid` in clock ticks since boot (`/proc/PID/stat` field
    /// 22), so a recorded pid is never trusted after it was reused.
    pub process_start: AtomicU64,
    /// The registered process's id in the registrant's PID namespace.
    pub pid: AtomicU32,
    pub flags: AtomicU32,
    /// The beat word an ender replaced with its end marker.
    pub final_beat: AtomicU64,
    /// Byte 0 is the label's length, bytes 1..=47 its UTF-8.
    pub label: [AtomicU64; 6],
    /// Identity of the clock the registrant stamps with (its time
    /// namespace; see [`crate::Clock::identity`]); 0 before layout 1.1.
    pub clock_id: AtomicU64,
    /// `steps << 1 | busy`, [`BUSY_PERIOD`] flipped at every becoming busy,
    /// and [`STALL_MARK`] once the
    /// reaper ends it for making no progress (layout 1.3); see
    /// [`crate::table::protocol::progress`].
    pub progress: AtomicU64,
}

// The format, checked at compile time (loom's atomics are larger: its build
// only model-checks the protocol and never maps a table).
#[cfg(not(loom))]
const _: () = {
    assert!(std::mem::size_of::<Header>() == HEADER_SIZE);
    assert!(std::mem::size_of::<Slot>() == SLOT_SIZE);
    assert!(std::mem::align_of::<Slot>() == SLOT_SIZE);
    assert!(HEADER_SIZE % SLOT_SIZE == 0);
    assert!(std::mem::size_of::<[AtomicU64; 6]>() == LABEL_MAX + 1);
    assert!(std::mem::size_of::<InfoArea>() == INFO_AREA_SIZE);
    assert!(INFO_AREA_SIZE % SLOT_SIZE == 0);
};

/// Bit of [`Slot::flags`]: the reaper watches this registration's process
/// through a pidfd.
pub(crate) const FLAG_PIDFD: u32 = 1;
/// Bit of [`Slot::flags`], set by the registrant: the recorded pid is not the
/// registering process (a wrapper registered on its behalf), so its exit says
/// nothing about the registration's lock; only the lock counts.
pub(crate) const FLAG_PROXY: u32 = 2;
/// Bit of [`Slot::flags`], set by the registrant: it stamps heartbeats with
/// the table's coarse clock, so the reaper adds `STAMP_LAG_TICKS` of the
/// table's resolution to its stamps (layout 1.4).
pub(crate) const FLAG_COARSE_STAMPS: u32 = 4;
/// Bit of [`Slot::flags`], set by a reaper's listener (layout 1.6): a
/// session's registration, held on its client's behalf. No lock or pidfd
/// can see its client exit: the listener ends it `Disconnected` when the
/// connection closes, and its silence is judged like any other.
pub(crate) const FLAG_REMOTE: u32 = 8;
/// Bit of [`Slot::flags`], kept by a reaper for a session's registration
/// whose client beats in a region and whose process's death word there is
/// held by its death thread: its death is seen as it begins (`status`
/// shows `death_word`). Older builds ignore it.
pub(crate) const FLAG_REGION_DEATH_WORD: u32 = 16;
/// Bits 16..32 of [`Slot::flags`], set by the registrant: the
/// [`namespace_tag`] of its PID namespace (layout 1.5; a random tag of its
/// process in 1.4), so that two processes with the same pid and start tick
/// in different PID namespaces (two containers' first processes, started
/// together) are told apart when the reaper tests one lock per process, and
/// the reaper watches a pid through a pidfd only if the registrant says it
/// lives in the reaper's own PID namespace (where that pid names it).
pub(crate) const PROCESS_TAG_SHIFT: u32 = 16;

/// A PID namespace's inode folded to the 16 bits of a slot's process tag.
pub(crate) fn namespace_tag(inode: u64) -> u32 {
    ((inode ^ inode >> 16 ^ inode >> 32 ^ inode >> 48) & 0xFFFF) as u32
}
/// [`Header::stamp_clock`]: heartbeats stamp `CLOCK_MONOTONIC`.
pub(crate) const STAMPS_PRECISE: u32 = 0;
/// [`Header::stamp_clock`]: heartbeats stamp `CLOCK_MONOTONIC_COARSE`.
pub(crate) const STAMPS_COARSE: u32 = 1;
/// Bit of [`Slot::progress`]: the engine has work in flight.
pub(crate) const BUSY: u64 = 1;
/// Bit of [`Slot::progress`]: the reaper judged the registration stalled on
/// the word below this bit; it is ending, and progress no longer counts.
pub(crate) const STALL_MARK: u64 = 1 << 63;
/// What one step of progress adds (the count lives above [`BUSY`], below
/// [`BUSY_PERIOD`]).
pub(crate) const PROGRESS_STEP: u64 = 2;
/// Bit of [`Slot::progress`], flipped each time the worker becomes busy
/// (layout 1.5): the word changes even when no step was made between an idle
/// and a busy that fell between two scans, so the reaper never times a new
/// busy period from an old one.
pub(crate) const BUSY_PERIOD: u64 = 1 << 62;

/// The first minor version with the reaper's observations area.
pub(crate) const OBSERVATIONS_SINCE_MINOR: u32 = 3;

/// Total bytes of a table of this layout with `capacity` slots: header,
/// slots, info area, the reaper's observations.
pub const fn table_size(capacity: u32) -> usize {
    object_size(capacity, VERSION_MINOR)
}

/// Bytes of the reaper's observations (layout 1.3): one word per slot, when
/// (on the reaper's clock) it saw the slot's progress word change, so that
/// any process can show the time since a worker's last progress.
pub(crate) const fn observations_size(capacity: u32) -> usize {
    (capacity as usize * 8).div_ceil(SLOT_SIZE) * SLOT_SIZE
}

/// Where the observations start.
pub(crate) const fn observations_start(capacity: u32) -> usize {
    slots_end(capacity) + INFO_AREA_SIZE
}

/// Where the slots end (and the info area of layout 1.2 starts).
pub(crate) const fn slots_end(capacity: u32) -> usize {
    HEADER_SIZE + capacity as usize * SLOT_SIZE
}

/// Bytes a table of layout `1.minor` with `capacity` slots must have.
pub(crate) const fn object_size(capacity: u32, minor: u32) -> usize {
    if minor >= OBSERVATIONS_SINCE_MINOR {
        observations_start(capacity) + observations_size(capacity)
    } else if minor >= INFO_SINCE_MINOR {
        slots_end(capacity) + INFO_AREA_SIZE
    } else {
        slots_end(capacity)
    }
}

/// The server-published info area (layout 1.2): a sequence lock over up to
/// [`INFO_MAX`] bytes; see [`crate::table::info`].
#[repr(C, align(128))]
pub(crate) struct InfoArea {
    /// Even when stable, odd while a writer is at work.
    pub sequence: AtomicU64,
    /// Bytes in use.
    pub len: AtomicU64,
    pub data: [AtomicU64; INFO_MAX / 8],
    reserved: [AtomicU64; 14],
}

#[cfg(not(loom))]
impl Header {
    /// The counter of registrations ended for `reason`.
    pub fn ended_counter(&self, reason: crate::event::Reason) -> &AtomicU64 {
        use crate::event::Reason;
        // Exhaustive: a new reason does not compile until it has a counter.
        match reason {
            Reason::Timeout
            | Reason::Grace
            | Reason::ProcessExited
            | Reason::Deregistered
            | Reason::Cleared
            | Reason::Replaced => &self.ended[reason.index()],
            Reason::Stalled => &self.ended_stalled,
            Reason::Disconnected => &self.ended_disconnected,
        }
    }
}

impl Slot {
    /// A free slot of generation 0, in ordinary memory (for the loom models).
    #[cfg(loom)]
    pub fn new() -> Slot {
        let word = || AtomicU64::new(0);
        Slot {
            state: word(),
            beat: word(),
            beats: word(),
            instance_id: word(),
            registered_ns: word(),
            process_start: word(),
            pid: AtomicU32::new(0),
            flags: AtomicU32::new(0),
            final_beat: word(),
            label: std::array::from_fn(|_| word()),
            clock_id: word(),
            progress: word(),
        }
    }

    /// Writes `label` (at most [`LABEL_MAX`] bytes, checked by the caller).
    pub fn store_label(&self, label: &str) {
        let mut bytes = [0u8; LABEL_MAX + 1];
        bytes[0] = label.len() as u8;
        bytes[1..=label.len()].copy_from_slice(label.as_bytes());
        for (word, chunk) in self.label.iter().zip(bytes.chunks_exact(8)) {
            let value = u64::from_le_bytes(chunk.try_into().expect("chunks of 8"));
            word.store(value, Ordering::Relaxed);
        }
    }

    /// Reads the label; an impossible length or invalid UTF-8 from a corrupted
    /// table is shown lossily rather than refused, and cut back to at most
    /// [`LABEL_MAX`] bytes of whole characters.
    pub fn load_label(&self) -> String {
        let mut bytes = [0u8; LABEL_MAX + 1];
        for (word, chunk) in self.label.iter().zip(bytes.chunks_exact_mut(8)) {
            chunk.copy_from_slice(&word.load(Ordering::Relaxed).to_le_bytes());
        }
        let len = usize::from(bytes[0]).min(LABEL_MAX);
        let shown = String::from_utf8_lossy(&bytes[1..=len]);
        label_prefix(&shown).to_owned()
    }
}

/// The longest prefix of `label` that has at most [`LABEL_MAX`] bytes and
/// ends on a character boundary.
///
/// # Examples
///
/// ```
/// let label = "é".repeat(30); // 60 bytes
/// assert_eq!(livereg::label_prefix(&label), "é".repeat(23));
/// ```
pub fn label_prefix(label: &str) -> &str {
    crate::text::prefix_within(label, LABEL_MAX)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_hostile_label_loads_as_whole_characters_within_the_limit() {
        // SAFETY:
        // - `Slot` is made only of atomic integers; all-zero bytes are valid.
        let slot: Box<Slot> = unsafe { Box::new(std::mem::zeroed()) };
        // Length 47, then 47 bytes that are not UTF-8: each shows as U+FFFD
        // (three bytes), 141 bytes before the cut.
        for (i, word) in slot.label.iter().enumerate() {
            let first = if i == 0 { 47 } else { 0xFF };
            word.store(
                u64::from_le_bytes([first, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF]),
                Ordering::Relaxed,
            );
        }
        let label = slot.load_label();
        assert!(label.len() <= LABEL_MAX, "{} bytes", label.len());
        assert_eq!(label, "\u{FFFD}".repeat(LABEL_MAX / 3));
    }
}
