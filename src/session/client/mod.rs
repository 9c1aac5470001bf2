//! The client side of a session: `connect` and the one-frame exchanges
//! (`connect.rs`), reaching a listener and saying hello (`dial.rs`), and the
//! sender thread that forwards a worker's beats and hears its listener
//! (`sender.rs`).

mod connect;
mod dial;
mod sender;

pub(crate) use connect::ask_status;
pub use connect::{
    connect, remote_clear, remote_reset, ConnectOptions, DEFAULT_CONNECT_TIMEOUT,
};
