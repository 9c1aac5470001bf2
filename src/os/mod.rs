//! The few Linux calls the table needs beyond `std`, one module per area.

pub(crate) mod futex;
pub(crate) mod inotify;
pub(crate) mod lock;
pub(crate) mod pidfd;
pub(crate) mod process;
