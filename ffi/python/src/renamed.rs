//! Keywords spelled two ways. The released spelling is the API and stays;
//! a spelling that builds between two releases used instead still works
//! until the next release, with a `DeprecationWarning` that names the
//! released one.

use crate::seconds::seconds;
use pyo3::exceptions::PyDeprecationWarning;
use pyo3::prelude::*;
use std::ffi::CString;
use std::time::Duration;

/// The value a caller gave for the keyword `name`: `given` (its released
/// spelling, or its default), unless it came under `renamed`, the spelling
/// of builds between releases (`renamed_value`), which warns.
///
/// # Errors
///
/// `TypeError` when `given` is not the default (`given_explicitly`) and
/// `renamed` was given as well: one value under two names. What a warning
/// filter raises for the `DeprecationWarning`.
pub(crate) fn keyword<T>(
    py: Python<'_>,
    name: &str,
    given: T,
    given_explicitly: bool,
    renamed: &str,
    renamed_value: Option<T>,
) -> PyResult<T> {
    let Some(value) = renamed_value else {
        return Ok(given);
    };
    if given_explicitly {
        return Err(pyo3::exceptions::PyTypeError::new_err(format!(
            "{name}= and {renamed}= are one argument: give {name}= only"
        )));
    }
    let message = CString::new(format!(
        "{renamed}= is deprecated and goes in the next release: use {name}="
    ))?;
    // Stack level 1: the warning names the caller's line (a native
    // function has no frame of its own).
    PyErr::warn(py, &py.get_type::<PyDeprecationWarning>(), &message, 1)?;
    Ok(value)
}

/// A clear's or a reset's bound when none is given, in seconds (their
/// signatures repeat it as a literal: Python shows a literal default).
const CLEAR_TIMEOUT: f64 = 5.0;

/// The bound of a clear or a reset: `timeout=` (its released name, also
/// the standard library's word for a bounded wait), or `wait=`.
///
/// # Errors
///
/// `InvalidArgumentError` for a negative, infinite or NaN number of
/// seconds; what [`keyword`] raises.
pub(crate) fn clear_timeout(py: Python<'_>, timeout: f64, wait: Option<f64>) -> PyResult<Duration> {
    #[allow(clippy::float_cmp)] // the default itself, not a computed value
    let given = timeout != CLEAR_TIMEOUT;
    let timeout = keyword(py, "timeout", timeout, given, "wait", wait)?;
    seconds(timeout, "timeout")
}
