//! A lock-free shared-memory liveness registry.
//!
//! Worker processes register in a [`Table`] mapped from `/dev/shm` and prove
//! they are alive by writing a timestamp into their own slot
//! ([`Worker::heartbeat`]: one clock read and one compare-and-swap, no system
//! call). A [`Reaper`] scans the slots every `reap_timeout / 4`, ends the
//! registrations that went silent or whose process exited, and calls drop
//! handlers so a server frees what it held for them.
//!
//! Time, in one form per idea: a span of time is a [`Duration`](std::time::Duration)
//! (a table's budgets `reap_timeout`, `registration_grace`,
//! `progress_timeout`; a call's bound on its own waiting, always named
//! `wait`: [`Registration::wait`], [`Table::clear`]); a point on a table's
//! clock is `u64` nanoseconds, named `*_ns` ([`DropEvent::registered_ns`],
//! [`Reaper::scan_once`]); the status snapshot, a JSON document, gives
//! seconds, named `*_seconds`.
//!
//! ```
//! use livereg::{Reason, Table, TableOptions};
//! use std::sync::mpsc;
//! use std::time::Duration;
//!
//! let name = format!("livereg-doc-lib-{}", std::process::id());
//! let options = TableOptions { reap_timeout: Duration::from_millis(200), ..TableOptions::default() };
//! let table = Table::create(&name, &options)?;
//!
//! // The server: a reaper whose handler frees a worker's resources.
//! let (freed, dropped) = mpsc::channel();
//! let reaper = table.reaper().on_drop(move |event| Ok(freed.send(event.clone())?)).spawn()?;
//!
//! // A worker (normally another process, opening the table by name).
//! let worker = Table::open(&name)?.register(7, "gpu0")?;
//! worker.heartbeat()?;
//! worker.deregister()?;
//!
//! let event = dropped.recv_timeout(Duration::from_secs(5)).unwrap();
//! assert_eq!((event.instance_id, event.reason), (7, Reason::Deregistered));
//! reaper.stop()?;
//! Table::unlink(&name)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(missing_docs)]
#![cfg_attr(loom, allow(dead_code))]

/// Declares items that need the OS (files, threads, clocks): left out of
/// the loom build, which model-checks the slot protocol in ordinary memory.
macro_rules! needs_the_os {
    ($($item:item)*) => {
        $(#[cfg(not(loom))] $item)*
    };
}

// The crate's rooms: the table (its format and slot protocol are also
// compiled into the loom models), the worker side, the reaper side, the
// observers (`status`), the sessions over a socket, the fleet (`etcd`) and
// the OS calls; beside them what every room shares (errors, events, the
// clock, an observer's own absence). Each folder's module doc says what it owns and what it may
// import; no file imports what its parent module defines.
mod event;
mod sync;
mod table;
mod text;

#[cfg(all(not(loom), feature = "etcd"))]
pub mod etcd;

needs_the_os! {
    mod absence;
    mod clock;
    mod error;
    mod os;
    mod reaper;
    mod session;
    mod status;
    mod worker;
    #[cfg(test)]
    mod unit_tables;
    pub use clock::{Clock, ManualClock, StampClock, MIN_TIMEOUT_TICKS, STAMP_LAG_TICKS};
    pub use error::{codes, Error, Result, ResultCode, RESULT_CODES};
    pub use os::clock::{coarse_resolution_ns, monotonic_coarse_ns, monotonic_ns};
    pub use reaper::{
        HandlerError, Reaper, ReaperBuilder, ReaperThread, ScanReport, HANDLER_DEADLINE,
    };
    pub use session::{
        connect, read_token_file, remote_clear, remote_reset, wire, Address,
        ConnectOptions, SessionRefusals, TlsClient, TlsServer, DEFAULT_CONNECT_TIMEOUT, TLS_BUILT_IN,
    };
    pub use status::{
        remote_status, ExitDetection, OwnedFilesStatus, OwnerStatus, ProcessMetrics,
        RegistrationState, RegistrationStatus, RemoteStatus, Status,
    };
    pub use table::{ReaperState, Table, TableOptions, DEFAULT_REGISTRATION_GRACE};
    pub use worker::{
        raise_in_this_thread, BeatThread, Busy, OnEnd, Registration, Worker, REGISTER_WAIT,
    };
}

pub use event::{DropEvent, Reason};

/// This build's release of livereg, as Cargo knows it (`"0.1.0"`): what the
/// C library and the Python package report at run time. Not the table
/// layout's version ([`VERSION_MAJOR`], [`VERSION_MINOR`]).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
#[doc(hidden)]
pub use table::layout::header_offsets;
pub use table::layout::{
    label_prefix, table_size, BEATS_PER_TIMEOUT, HEADER_SIZE, INFO_AREA_SIZE, INFO_MAX, LABEL_MAX,
    MAGIC, MAX_CAPACITY, SCANS_PER_TIMEOUT, SLOT_SIZE, VERSION_MAJOR, VERSION_MINOR,
};

#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
