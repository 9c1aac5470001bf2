//! The reaper side: scans the slots, ends what went silent or whose process
//! exited, and hands the ended registrations to their drop handlers, which
//! free the slots. It may import the table, the sessions' server side, the
//! OS calls and the shared types (errors, events, the clock); nothing
//! imports it but the status readers and the crate root.
//!
//! - `role.rs`: [`Reaper`], the role held and driven by its caller;
//! - `builder.rs`: [`ReaperBuilder`], taking the role;
//! - `scan.rs`: one scan, from its start to its figures;
//! - `observe.rs`: one live slot observed, decided, carried out;
//! - `lock_rounds.rs`: when locks are tested, and the tests;
//! - `exit_watch.rs`: a registrant's exit seen the moment it happens;
//! - `handlers.rs`: the drop and clear handlers run, the slots freed;
//! - `absence.rs`: the observer's own absence, so its silence is no evidence;
//! - `thread.rs`: [`ReaperThread`], a reaper on a thread of its own.

pub(crate) mod absence;
mod builder;
pub(crate) mod exit_watch;
pub(crate) mod handlers;
mod lock_rounds;
mod observe;
pub(crate) mod role;
mod scan;
mod thread;

pub use builder::ReaperBuilder;
pub use handlers::{HandlerError, HANDLER_DEADLINE};
pub use role::{Reaper, ScanReport};
pub use thread::ReaperThread;
