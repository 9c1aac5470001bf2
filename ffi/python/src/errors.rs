//! The exception classes: `livereg.Error` and one subclass per result code,
//! each carrying `code` (the C ABI's `LIVEREG_*` value) and the library's
//! message.

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use registry::Error as LibError;

create_exception!(
    livereg,
    Error,
    PyException,
    "A livereg failure: `code` is the C result, the message says why."
);
create_exception!(
    livereg,
    EvictedError,
    Error,
    "The registration ended (LIVEREG_EVICTED, 1): register again."
);
create_exception!(
    livereg,
    FullError,
    Error,
    "Every slot of the table is taken (LIVEREG_FULL, 2)."
);
create_exception!(
    livereg,
    ExistsError,
    Error,
    "The table, or a live registration of that id, exists (LIVEREG_EXISTS, 3)."
);
create_exception!(
    livereg,
    NotFoundError,
    Error,
    "No table of that name (LIVEREG_NOT_FOUND, 4)."
);
create_exception!(
    livereg,
    InvalidArgumentError,
    Error,
    "An argument broke the contract (LIVEREG_INVALID_ARGUMENT, 5)."
);
create_exception!(
    livereg,
    IncompatibleError,
    Error,
    "The table was made by an incompatible layout (LIVEREG_INCOMPATIBLE, 6)."
);
create_exception!(
    livereg,
    CorruptError,
    Error,
    "The table's contents are impossible (LIVEREG_CORRUPT, 7)."
);
create_exception!(
    livereg,
    PermissionError,
    Error,
    "The OS refused access to the table (LIVEREG_PERMISSION, 8)."
);
create_exception!(
    livereg,
    TimeoutError,
    Error,
    "A deadline passed first (LIVEREG_TIMEOUT, 9)."
);
create_exception!(
    livereg,
    NoReaperError,
    Error,
    "No live reaper holds the table (LIVEREG_NO_REAPER, 10)."
);
create_exception!(
    livereg,
    BusyError,
    Error,
    "Another party holds what was asked for (LIVEREG_BUSY, 11)."
);
create_exception!(
    livereg,
    IOError,
    Error,
    "An OS call failed (LIVEREG_IO, 12)."
);
create_exception!(
    livereg,
    PanicError,
    Error,
    "A panic was caught at the boundary (LIVEREG_PANIC, 13)."
);

/// Adds the classes to the module, each with its `code`.
pub fn add(module: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = module.py();
    module.add("Error", py.get_type::<Error>())?;
    py.get_type::<Error>().setattr("code", -1)?;
    let classes = [
        ("EvictedError", py.get_type::<EvictedError>(), 1),
        ("FullError", py.get_type::<FullError>(), 2),
        ("ExistsError", py.get_type::<ExistsError>(), 3),
        ("NotFoundError", py.get_type::<NotFoundError>(), 4),
        (
            "InvalidArgumentError",
            py.get_type::<InvalidArgumentError>(),
            5,
        ),
        ("IncompatibleError", py.get_type::<IncompatibleError>(), 6),
        ("CorruptError", py.get_type::<CorruptError>(), 7),
        ("PermissionError", py.get_type::<PermissionError>(), 8),
        ("TimeoutError", py.get_type::<TimeoutError>(), 9),
        ("NoReaperError", py.get_type::<NoReaperError>(), 10),
        ("BusyError", py.get_type::<BusyError>(), 11),
        ("IOError", py.get_type::<IOError>(), 12),
        ("PanicError", py.get_type::<PanicError>(), 13),
    ];
    for (name, class, code) in classes {
        class.setattr("code", code)?;
        module.add(name, class)?;
    }
    Ok(())
}

/// The exception for a library error, with the library's message.
pub fn raise(error: LibError) -> PyErr {
    let message = error.to_string();
    match error {
        LibError::Evicted { .. } => EvictedError::new_err(message),
        LibError::Full(_) => FullError::new_err(message),
        LibError::Exists(_) => ExistsError::new_err(message),
        LibError::NotFound(_) => NotFoundError::new_err(message),
        LibError::InvalidArgument(_) => InvalidArgumentError::new_err(message),
        LibError::Incompatible(_) => IncompatibleError::new_err(message),
        LibError::Corrupt(_) => CorruptError::new_err(message),
        LibError::Permission(_) => PermissionError::new_err(message),
        LibError::Timeout(_) => TimeoutError::new_err(message),
        LibError::NoReaper(_) => NoReaperError::new_err(message),
        LibError::Busy(_) => BusyError::new_err(message),
        LibError::Io { .. } => IOError::new_err(message),
        LibError::Panic(_) => PanicError::new_err(message),
        _ => Error::new_err(message),
    }
}

/// Converts a library result.
pub trait OrRaise<T> {
    /// The value, or the matching exception.
    fn or_raise(self) -> PyResult<T>;
}

impl<T> OrRaise<T> for registry::Result<T> {
    fn or_raise(self) -> PyResult<T> {
        self.map_err(raise)
    }
}
