//! The worker side: what a registering process holds. Registering
//! (`registration.rs`), the handle it gets (`handle.rs`: [`Worker`], a slot
//! of a mapped table or a session through a listener, one behaviour per
//! nature), and a beat from a native thread (`beat_thread.rs`). It may
//! import the table, the OS calls and the shared types; the sessions'
//! client side imports it (its link is a worker's other nature), the reaper
//! side never does.

pub(crate) mod beat_thread;
pub(crate) mod handle;
pub(crate) mod nature;
pub(crate) mod registration;

pub use beat_thread::{raise_in_this_thread, BeatThread, OnEnd};
pub use handle::{Busy, Worker};
pub use registration::{Registration, REGISTER_WAIT};
