//! The client side of a session: `connect` and the one-frame exchanges
//! (`connect.rs`), reaching a listener and saying hello (`dial.rs`), and the
//! sender thread that forwards a worker's beats (or, over a region its
//! listener reads, pulses there) and hears its listener
//! (`sender.rs`), and the reaper's state as the client knows it
//! (`server_state.rs`).

mod connect;
mod dial;
mod sender;
mod server_state;

pub(crate) use connect::ask_status;
pub use connect::{
    connect, remote_clear, remote_reset, ConnectOptions, DEFAULT_CONNECT_TIMEOUT,
};
