//! The table: one shared-memory mapping of a header, an info area and the
//! slots, and everything that reads or writes it in place. Its format
//! (`layout.rs`) and the slot protocol (`protocol.rs`, `info.rs`) are also
//! compiled into the loom models, which check them in ordinary memory; the
//! rest needs the OS. It may import the shared types (errors, events, the
//! clock, `sync`) and the OS calls; the worker side, the reaper side, the
//! sessions and the status readers import it.
//!
//! - `layout.rs`: the header and slot format, offsets and sizes;
//! - `protocol.rs`: the slot protocol: claim, publish, beat, end, free;
//! - `death_protocol.rs`: the death word's steps (checked with loom too),
//!   `death_words.rs` the file they are in, `death_thread.rs` the thread
//!   that holds a process's word;
//! - `info.rs`: the info area's sequence lock;
//! - `handle.rs`: [`Table`]: create, open, unlink, validate;
//! - `options.rs`: [`TableOptions`];
//! - `owned_records.rs`: the file beside the table where processes declare
//!   the files they own, `owning.rs` the declaring ([`Table::own_file`]),
//!   `owned_dirs.rs` the directories the creator allowed (a file only the
//!   table's owner may write), `removal_rules.rs` whom a removal is for,
//!   `owned_sweep.rs` a round of removals;
//! - `memory.rs`: the mapping (a file or the heap) and its slots;
//! - `location.rs`: where a table lives (a name or a path);
//! - `locks.rs`: the reaper role and the registration lock;
//! - `reaper_life.rs`: the reaper's state (serving, dying, absent) as any
//!   process reads it and waits on it;
//! - `region.rs`: a session's region (one slot and its death word in a
//!   memfd a `unix:` listener shares with its client);
//! - `side_file.rs`: the files beside a shared table, made and opened;
//! - `requests.rs`: what any process asks of the reaper (clear, reset);
//! - `inside_handlers.rs`: such asks refused from the reaper's own handlers;
//! - `wake.rs`: who wakes a caller-driven reaper.

pub(crate) mod death_protocol;
pub(crate) mod info;
pub(crate) mod layout;
#[cfg(all(test, loom))]
mod loom_models;
pub(crate) mod protocol;

needs_the_os! {
    pub(crate) mod death_thread;
    pub(crate) mod death_words;
    pub(crate) mod handle;
    pub(crate) mod inside_handlers;
    pub(crate) mod location;
    pub(crate) mod locks;
    pub(crate) mod memory;
    pub(crate) mod options;
    pub(crate) mod owned_dirs;
    pub(crate) mod owned_records;
    pub(crate) mod owned_sweep;
    pub(crate) mod owning;
    pub(crate) mod reaper_life;
    pub(crate) mod region;
    pub(crate) mod removal_rules;
    pub(crate) mod requests;
    pub(crate) mod side_file;
    pub(crate) mod wake;
    pub use handle::Table;
    pub use options::{TableOptions, DEFAULT_REGISTRATION_GRACE};
    pub use reaper_life::ReaperState;
}
