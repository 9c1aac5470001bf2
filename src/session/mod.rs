//! Sessions: workers that cannot map the table (containers sharing no
//! `/dev/shm`, IPC or PID namespace with the reaper) register through a
//! reaper's listener over a socket, and the socket's closing is their death
//! signal. Over `unix:` (protocol 4), the listener also shares a region
//! with each client (`table/region.rs`: one slot and a death word, in the
//! table's formats), where the client beats and where its death is seen as
//! it begins.
//!
//! Two sides and what they share: `client/` (connect, the handshake as a
//! client makes it, the sender thread that forwards a worker's beats or
//! pulses in its region),
//! `server/` (the reaper's listeners, each connection served, the sessions
//! held, their records), and between them the address, the frames
//! (`wire`), a socket with its framing (`stream`), TLS and the schedules
//! (`timing`). The reaper and the rest of the crate name only what this
//! module re-exports. It may import the worker side (a session is a
//! worker's nature), the table, the OS calls and the shared types; the
//! reaper side and the observers import it.

mod address;
mod client;
pub(crate) mod server;
mod stream;
mod timing;
mod tls;
mod token_file;
#[doc(hidden)]
pub mod wire;

pub use address::Address;
pub(crate) use client::ask_status;
pub use client::{
    connect, remote_clear, remote_reset, ConnectOptions, DEFAULT_CONNECT_TIMEOUT,
};
pub(crate) use server::limited_log;
pub use server::SessionRefusals;
pub(crate) use server::{
    HeldRegion, ListenConfig, Record, Records, RegionsBySlot, Sessions, SlotSilence,
    DEFAULT_SOCKET_MODE,
};
pub use tls::{TlsClient, TlsServer, TLS_BUILT_IN};
pub use token_file::read_token_file;
