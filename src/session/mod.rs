//! Sessions: workers that cannot map the table (containers sharing no
//! `/dev/shm`, IPC or PID namespace with the reaper) register through a
//! reaper's listener over a socket, and the socket's closing is their death
//! signal.

mod address;
pub(crate) mod records;
mod stream;
pub mod wire;

pub use address::Address;
