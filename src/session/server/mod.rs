//! The server side of a session, run by a reaper: its listeners
//! (`sessions.rs`, one epoll thread each in `listener.rs`, its socket in
//! `acceptor.rs`, what it accepts and when in `admission.rs`), each connection
//! served (`served.rs`), the registrations they hold (`held.rs`) and their
//! records beside the table (`records.rs`); who is held back after failed
//! handshakes (`penalties.rs`), the regions shared with `unix:` clients
//! (what they beat there pulled into the table at each scan in
//! `region_pull.rs`, their death words waited on in `region_watch.rs`),
//! what was refused (`refusals.rs`), what a
//! peer reports made printable (`printable.rs`) and what it causes logged
//! at a bounded rate (`limited_log.rs`).

mod acceptor;
mod admission;
mod handshake;
mod held;
pub(crate) mod limited_log;
mod listener;
mod penalties;
mod printable;
mod records;
mod refusals;
mod region_pull;
mod region_watch;
mod served;
mod sessions;

pub(crate) use held::{HeldRegion, RegionsBySlot};
pub(crate) use limited_log::limited_log;
pub(crate) use listener::{ListenConfig, DEFAULT_SOCKET_MODE};
pub(crate) use records::{Record, Records};
pub use refusals::SessionRefusals;
pub(crate) use sessions::{Sessions, SlotSilence};
