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
mod reaper_life;
mod session;
mod sized;
mod table;
mod types;
mod version;
mod worker;

// No `pub use`: every C function is exported by its `#[no_mangle]`, from
// whichever module holds it; the header is the list (checked by
// `header_check.rs` against these sources).
