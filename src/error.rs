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
    #[error("{message}")]
    Full {
        /// Why, naming the table and its capacity.
        message: String,
        /// The table's capacity, when this process knows it (a listener's
        /// refusal carries only its message).
        capacity: Option<u32>,
    },
    /// A table of that name, or a live registration of that id, exists.
    #[error("{message}")]
    Exists {
        /// Why, naming the table (and the registration).
        message: String,
        /// For a live registration: its instance id and the pid that holds
        /// it (the pid as the table records it).
        registered: Option<(u64, u32)>,
    },
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
    /// registration lock, a previous registration's pending drop).
    #[error("{message}")]
    Busy {
        /// Why, naming what is held.
        message: String,
        /// The instance id whose previous registration has ended and whose
        /// drop is still pending, when that is what holds it.
        pending_drop: Option<u64>,
    },
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

/// One stable result code: `LIVEREG_<name>` in C, the `code` of the Python
/// exception `<title>Error`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResultCode {
    /// The value, stable across releases.
    pub value: u32,
    /// The C name without its `LIVEREG_` prefix.
    pub name: &'static str,
    /// The Python exception's name without its `Error` suffix (empty for
    /// `OK`); never a builtin's (`PermissionError`, `TimeoutError`, `IOError`
    /// would shadow Python's own on `from livereg import *`).
    pub title: &'static str,
    /// The Python builtin exception it also derives, so `except
    /// TimeoutError` catches it (empty: none fits).
    pub builtin: &'static str,
    /// What it means, in a line.
    pub meaning: &'static str,
}

const fn code(
    value: u32,
    name: &'static str,
    title: &'static str,
    builtin: &'static str,
    meaning: &'static str,
) -> ResultCode {
    ResultCode {
        value,
        name,
        title,
        builtin,
        meaning,
    }
}

/// The one list of result codes, in value order: `(value, C identifier, C
/// name, Python title, Python builtin, meaning)` for each. It hands every row to
/// `$callback!`, which is how [`RESULT_CODES`] here and the C ABI's
/// `livereg_result` enum are made; the C header, which cannot be generated
/// by a macro, is checked against it by the C library's tests.
#[doc(hidden)]
#[macro_export]
macro_rules! result_code_list {
    ($callback:ident) => {
        $callback! {
            (0, LIVEREG_OK, "OK", "", "", "Success."),
            (1, LIVEREG_EVICTED, "EVICTED", "Evicted", "", "The registration ended: register again."),
            (2, LIVEREG_FULL, "FULL", "Full", "", "Every slot of the table is taken."),
            (3, LIVEREG_EXISTS, "EXISTS", "Exists", "FileExistsError", "The table, or a live registration of the id, exists."),
            (4, LIVEREG_NOT_FOUND, "NOT_FOUND", "NotFound", "FileNotFoundError", "No table of that name."),
            (5, LIVEREG_INVALID_ARGUMENT, "INVALID_ARGUMENT", "InvalidArgument", "ValueError", "An argument broke the contract."),
            (6, LIVEREG_INCOMPATIBLE, "INCOMPATIBLE", "Incompatible", "", "The table was made by an incompatible layout."),
            (7, LIVEREG_CORRUPT, "CORRUPT", "Corrupt", "", "The table's contents are impossible."),
            (8, LIVEREG_PERMISSION, "PERMISSION", "PermissionDenied", "PermissionError", "The OS refused access to the table."),
            (9, LIVEREG_TIMEOUT, "TIMEOUT", "DeadlineExceeded", "TimeoutError", "A deadline passed first."),
            (10, LIVEREG_NO_REAPER, "NO_REAPER", "NoReaper", "", "No live reaper holds the table."),
            (11, LIVEREG_BUSY, "BUSY", "Busy", "", "Another party holds what was asked for."),
            (12, LIVEREG_IO, "IO", "SystemCall", "OSError", "An OS call failed."),
            (13, LIVEREG_PANIC, "PANIC", "Panic", "", "A panic was caught at the boundary."),
        }
    };
}

macro_rules! result_codes_array {
    ($(($value:literal, $c:ident, $name:literal, $title:literal, $builtin:literal, $meaning:literal)),* $(,)?) => {
        /// Every result code, in value order (made from the one list,
        /// `result_code_list!`): the C header, the C ABI's
        /// `livereg_result_str` and the Python exception classes are derived
        /// from it, or checked against it.
        pub const RESULT_CODES: [ResultCode; [$($value),*].len()] =
            [$(code($value, $name, $title, $builtin, $meaning)),*];
    };
}

result_code_list!(result_codes_array);

macro_rules! result_code_values {
    ($(($value:literal, $c:ident, $name:literal, $title:literal, $builtin:literal, $meaning:literal)),* $(,)?) => {
        /// Each result code's value by its C name (made from the one list,
        /// `result_code_list!`).
        pub mod codes {
            $(
                #[doc = $meaning]
                pub const $c: u32 = $value;
            )*
        }
    };
}

result_code_list!(result_code_values);

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The stable result code of this error (an index into [`RESULT_CODES`]).
    pub fn code(&self) -> u32 {
        use codes::*;
        match self {
            Error::Evicted { .. } => LIVEREG_EVICTED,
            Error::Full { .. } => LIVEREG_FULL,
            Error::Exists { .. } => LIVEREG_EXISTS,
            Error::NotFound(_) => LIVEREG_NOT_FOUND,
            Error::InvalidArgument(_) => LIVEREG_INVALID_ARGUMENT,
            Error::Incompatible(_) => LIVEREG_INCOMPATIBLE,
            Error::Corrupt(_) => LIVEREG_CORRUPT,
            Error::Permission(_) => LIVEREG_PERMISSION,
            Error::Timeout(_) => LIVEREG_TIMEOUT,
            Error::NoReaper(_) => LIVEREG_NO_REAPER,
            Error::Busy { .. } => LIVEREG_BUSY,
            Error::Io { .. } => LIVEREG_IO,
            Error::Panic(_) => LIVEREG_PANIC,
        }
    }

    /// The error that result code `code` stands for, with the text another
    /// party gave for it (a listener's refusal): the inverse of
    /// [`Error::code`]. An `Evicted` is for `instance_id`, with the `reason`
    /// the party gave as a code (`None`: the slot was reused). `OK` and
    /// codes this build does not know are I/O errors naming the code.
    pub fn from_code(code: u32, text: String, instance_id: u64, reason: Option<Reason>) -> Error {
        use codes::*;
        match code {
            LIVEREG_EVICTED => Error::Evicted {
                instance_id,
                reason,
            },
            LIVEREG_FULL => Error::full(text),
            LIVEREG_EXISTS => Error::exists(text),
            LIVEREG_NOT_FOUND => Error::NotFound(text),
            LIVEREG_INVALID_ARGUMENT => Error::InvalidArgument(text),
            LIVEREG_INCOMPATIBLE => Error::Incompatible(text),
            LIVEREG_CORRUPT => Error::Corrupt(text),
            LIVEREG_PERMISSION => Error::Permission(text),
            LIVEREG_TIMEOUT => Error::Timeout(text),
            LIVEREG_NO_REAPER => Error::NoReaper(text),
            LIVEREG_BUSY => Error::busy(text),
            LIVEREG_PANIC => Error::Panic(text),
            LIVEREG_IO => Error::Io {
                context: "the other side failed".into(),
                source: io::Error::other(text),
            },
            other => Error::Io {
                context: format!("result code {other}, which this build does not know"),
                source: io::Error::other(text),
            },
        }
    }

    /// A `Full` with only its message (the capacity unknown here).
    pub fn full(message: String) -> Error {
        Error::Full {
            message,
            capacity: None,
        }
    }

    /// An `Exists` with only its message (a table, or a registration this
    /// process knows no more of).
    pub fn exists(message: String) -> Error {
        Error::Exists {
            message,
            registered: None,
        }
    }

    /// A `Busy` with only its message (no pending drop holds it).
    pub fn busy(message: String) -> Error {
        Error::Busy {
            message,
            pending_drop: None,
        }
    }

    /// Maps an OS error on table `table` during `step` to the variant a caller
    /// can act on (missing, exists, permission), keeping the OS text.
    pub(crate) fn os(table: &str, step: &str, source: io::Error) -> Error {
        let context = format!("table '{table}': {step}");
        match source.kind() {
            io::ErrorKind::NotFound => {
                Error::NotFound(format!("{context}: no such table ({source})"))
            }
            io::ErrorKind::AlreadyExists => {
                Error::exists(format!("{context}: a table of that name already exists"))
            }
            io::ErrorKind::PermissionDenied => Error::Permission(format!("{context}: {source}")),
            _ => Error::Io { context, source },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn result_codes_are_listed_in_value_order_and_every_variant_has_one() {
        for (index, code) in RESULT_CODES.iter().enumerate() {
            assert_eq!(code.value as usize, index, "{code:?}");
        }
        let samples = [
            Error::Evicted {
                instance_id: 1,
                reason: None,
            },
            Error::full(String::new()),
            Error::exists(String::new()),
            Error::NotFound(String::new()),
            Error::InvalidArgument(String::new()),
            Error::Incompatible(String::new()),
            Error::Corrupt(String::new()),
            Error::Permission(String::new()),
            Error::Timeout(String::new()),
            Error::NoReaper(String::new()),
            Error::busy(String::new()),
            Error::Io {
                context: String::new(),
                source: io::Error::other("x"),
            },
            Error::Panic(String::new()),
        ];
        let codes: Vec<u32> = samples.iter().map(Error::code).collect();
        assert_eq!(codes, (1..RESULT_CODES.len() as u32).collect::<Vec<_>>());
    }

    #[test]
    fn every_listed_code_comes_back_as_the_error_of_that_code() {
        for code in &RESULT_CODES[1..] {
            let error = Error::from_code(code.value, "why".into(), 7, None);
            assert_eq!(error.code(), code.value, "{code:?}");
            assert!(error.to_string().contains("why") || code.name == "EVICTED");
        }
        let evicted = Error::Evicted {
            instance_id: 7,
            reason: Some(Reason::Stalled),
        };
        let back = Error::from_code(
            evicted.code(),
            evicted.to_string(),
            7,
            Some(Reason::Stalled),
        );
        assert_eq!(back.to_string(), evicted.to_string());
        let unknown = Error::from_code(200, "why".into(), 7, None);
        assert!(unknown.to_string().contains("result code 200"), "{unknown}");
    }
}
