//! The few Linux calls the table needs beyond `std`, one module per area.
//! It imports nothing of the crate; every room may import it.

pub(crate) mod clock;
pub(crate) mod epoll;
pub(crate) mod eventfd;
pub(crate) mod fork;
pub(crate) mod futex;
pub(crate) mod hostname;
pub(crate) mod inotify;
pub(crate) mod lock;
pub(crate) mod memfd;
pub(crate) mod pidfd;
pub(crate) mod poll;
pub(crate) mod private_file;
pub(crate) mod process;
pub(crate) mod random;
pub(crate) mod refused_file;
mod raw;
pub(crate) mod robust;
pub(crate) mod same_file;
pub(crate) mod signal;
pub(crate) mod thread_credentials;
pub(crate) mod socket;
pub(crate) mod unix_connect;
