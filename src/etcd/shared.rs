//! What a publisher's handles and its thread share: the end reasons passed
//! on by the reaper's drop handler (bounded), the wake-up, the request to
//! stop, and whether etcd is connected.

use crate::event::Reason;
use std::collections::VecDeque;
use std::sync::atomic::AtomicBool;
use std::sync::Mutex;
use tokio::sync::Notify;

/// End reasons held for publishing; past this the oldest is dropped (its key
/// is still deleted, without a reason).
pub(super) const ENDS_QUEUE: usize = 4096;

/// What the publisher's thread shares with its handles.
pub(super) struct Shared {
    pub(super) ends: Mutex<VecDeque<Ended>>,
    pub(super) notify: Notify,
    pub(super) stop: AtomicBool,
    pub(super) connected: AtomicBool,
}

/// One ended registration, as the drop handler saw it.
pub(super) struct Ended {
    pub(super) instance_id: u64,
    pub(super) slot: u32,
    pub(super) generation: u32,
    pub(super) reason: Reason,
}
