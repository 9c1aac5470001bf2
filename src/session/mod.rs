//! Sessions: workers that cannot map the table (containers sharing no
//! `/dev/shm`, IPC or PID namespace with the reaper) register through a
//! reaper's listener over a socket, and the socket's closing is their death
//! signal.

mod address;
mod client;
mod dial;
mod held;
pub(crate) mod listener;
mod penalties;
mod printable;
mod refusals;
mod sender;
mod served;
mod sessions;
mod stream;
pub(crate) mod timing;
mod tls;
pub mod wire;

pub use address::Address;
pub use client::{
    connect, remote_clear, remote_reset, remote_status, ConnectOptions, DEFAULT_CONNECT_TIMEOUT,
};
pub use refusals::SessionRefusals;
pub(crate) use sessions::{Sessions, SlotSilence};
pub use tls::{TlsClient, TlsServer, TLS_BUILT_IN};
