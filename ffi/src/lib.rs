//! The C ABI of livereg, described for C readers by `include/livereg.h`.
//!
//! Conventions (the header repeats them): handles are opaque pointers owned
//! by the caller until passed to their `close`/`stop`/`deregister` function;
//! a NULL where a pointer is required gives `LIVEREG_INVALID_ARGUMENT`; every
//! fallible function returns a `livereg_result` and leaves a message for
//! `livereg_last_error()` on this thread; no panic crosses the boundary (it
//! becomes `LIVEREG_PANIC`).

#![allow(non_camel_case_types)]
#![deny(missing_docs)]

mod boundary;
#[cfg(test)]
mod header_check;
mod info;
mod metrics;
mod reaper;
mod session;
mod table;
mod types;
mod worker;

pub use boundary::{livereg_last_error, livereg_result_str};
pub use reaper::{livereg_reaper, livereg_reaper_scan, livereg_reaper_start, livereg_reaper_stop};
pub use session::{
    livereg_connect, livereg_connect_options, livereg_connect_options_default,
    livereg_reaper_listen, livereg_worker_get_info,
};
pub use table::{
    livereg_clear, livereg_close, livereg_create, livereg_get_stats, livereg_open,
    livereg_options_default, livereg_probe, livereg_table, livereg_unlink,
};
pub use types::{
    livereg_callbacks, livereg_drop_event, livereg_options, livereg_reason, livereg_result,
    livereg_stats,
};
pub use worker::{
    livereg_deregister, livereg_ping, livereg_register, livereg_worker, livereg_worker_clear,
    livereg_worker_reset,
};
