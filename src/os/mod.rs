//! The few Linux calls the table needs beyond `std`, one module per area.

pub(crate) mod epoll;
pub(crate) mod eventfd;
pub(crate) mod futex;
pub(crate) mod hostname;
pub(crate) mod inotify;
pub(crate) mod lock;
pub(crate) mod pidfd;
pub(crate) mod poll;
pub(crate) mod private_file;
pub(crate) mod process;
pub(crate) mod random;
pub(crate) mod signal;
pub(crate) mod socket;
pub(crate) mod unix_connect;

/// A raw system call's result: the error of `errno` when negative.
fn check(rc: libc::c_long) -> std::io::Result<libc::c_long> {
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}
