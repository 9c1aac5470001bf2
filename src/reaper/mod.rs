//! The reaper side: scans the slots, ends what went silent or whose process
//! exited, and hands the ended registrations to their drop handlers, which
//! free the slots. It may import the table, the sessions (their server
//! side), the observers, the OS calls and the shared types (errors, events,
//! the clock, absence); only the crate root imports it.
//!
//! - `role.rs`: [`Reaper`], the role held and driven by its caller;
//! - `builder.rs`: [`ReaperBuilder`], taking the role;
//! - `scan.rs`: one scan, from its start to its figures;
//! - `observe.rs`: one live slot observed, decided, carried out;
//! - `lock_schedule.rs`: when locks are tested; `lock_rounds.rs`: the tests;
//! - `seen.rs`: what the reaper remembers of each slot between scans;
//! - `silence.rs`: the silence reported for a `timeout` another party
//!   ended;
//! - `death_watch.rs`: a registrant's death seen as it begins (death words),
//!   `dying.rs`: what a scan makes of it;
//! - `exit_watch.rs`: a registrant's exit seen the moment it has ended;
//! - `owned_removal.rs`: the files an ended process owned, removed;
//! - `life.rs`: the reaper's own life word held, so that every process
//!   mapping the table knows at once when the reaper begins to die;
//! - `handlers.rs`: the drop and clear handlers run, the slots freed;
//! - `thread.rs`: [`ReaperThread`], a reaper on a thread of its own.

mod builder;
mod death_watch;
mod dying;
pub(crate) mod exit_watch;
pub(crate) mod handlers;
mod life;
mod lock_rounds;
mod lock_schedule;
mod observe;
mod owned_removal;
pub(crate) mod role;
mod scan;
mod seen;
mod silence;
mod thread;

pub use builder::ReaperBuilder;
pub use handlers::{HandlerError, HANDLER_DEADLINE};
pub use role::{Reaper, ScanReport};
pub use thread::ReaperThread;
