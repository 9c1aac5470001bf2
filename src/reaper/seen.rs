//! What the reaper remembers of each slot between scans: when, on its own
//! clock, it first saw the slot's beat word and progress as they are.

/// The reaper's memory of one slot's beat word: when, on its own clock, it
/// first saw the current value. A registration stamping with another clock (a
/// time namespace) is judged by this instead of by its stamps.
#[derive(Clone, Copy)]
pub(super) struct Seen {
    pub(super) word: u64,
    pub(super) first_seen: u64,
    /// The progress word and generation last seen, and when (reaper clock)
    /// it was first seen so: the later of the last step and becoming busy.
    pub(super) progress: u64,
    pub(super) progress_generation: u32,
    pub(super) progress_since: u64,
}

impl Seen {
    /// An impossible beat word (generation tag 0xFFFF with an unknown end
    /// marker), so the first real word always counts as new.
    pub(super) const NONE: Seen = Seen {
        word: u64::MAX,
        first_seen: 0,
        progress: u64::MAX,
        progress_generation: 0,
        progress_since: 0,
    };
}
