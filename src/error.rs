//! The one error type. Each variant is one C result code (`LIVEREG_*`), and
//! each message names what was expected and what was found.

use crate::event::Reason;
use std::io;

/// Everything that can go wrong, one variant per C result code.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The registration behind a worker handle has ended; register again.
    #[error("instance {instance_id} is no longer registered: {}", evicted_cause(*.reason))]
    Evicted {
        /// The instance id of the handle.
        instance_id: u64,
        /// Why it ended, when the slot still says so (`None` once reused).
        reason: Option<Reason>,
    },
    /// Every slot of the table is taken.
    #[error("{0}")]
    Full(String),
    /// A table of that name, or a live registration of that id, exists.
    #[error("{0}")]
    Exists(String),
    /// No table of that name.
    #[error("{0}")]
    NotFound(String),
    /// An argument broke the contract (name, id, label, options).
    #[error("{0}")]
    InvalidArgument(String),
    /// The table was made by an incompatible layout (version, slot size).
    #[error("{0}")]
    Incompatible(String),
    /// The table's contents are impossible (magic, sizes, unfinished header).
    #[error("{0}")]
    Corrupt(String),
    /// The OS refused access to the table.
    #[error("{0}")]
    Permission(String),
    /// A deadline passed before the operation completed.
    #[error("{0}")]
    Timeout(String),
    /// The operation needs a live reaper and none holds the table.
    #[error("{0}")]
    NoReaper(String),
    /// Another party holds what was asked for (the reaper role, the
    /// registration lock).
    #[error("{0}")]
    Busy(String),
    /// An OS call failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done, naming the table.
        context: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A panic was caught at a boundary (C ABI, handler isolation).
    #[error("{0}")]
    Panic(String),
}

fn evicted_cause(reason: Option<Reason>) -> String {
    match reason {
        Some(reason) => format!("it ended with reason '{reason}'"),
        None => "its slot was released and has been reused".to_owned(),
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Maps an OS error on table `table` during `step` to the variant a caller
    /// can act on (missing, exists, permission), keeping the OS text.
    pub(crate) fn os(table: &str, step: &str, source: io::Error) -> Error {
        let context = format!("table '{table}': {step}");
        match source.kind() {
            io::ErrorKind::NotFound => {
                Error::NotFound(format!("{context}: no such table ({source})"))
            }
            io::ErrorKind::AlreadyExists => {
                Error::Exists(format!("{context}: a table of that name already exists"))
            }
            io::ErrorKind::PermissionDenied => Error::Permission(format!("{context}: {source}")),
            _ => Error::Io { context, source },
        }
    }
}
