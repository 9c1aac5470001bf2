//! Durations from Python: a number of seconds, checked.

use crate::errors;
use livereg::codes::LIVEREG_INVALID_ARGUMENT;
use pyo3::prelude::*;
use std::time::Duration;

/// `value` seconds, or `InvalidArgumentError` naming `what` if it is
/// negative, not finite or too large.
pub(crate) fn seconds(value: f64, what: &str) -> PyResult<Duration> {
    Duration::try_from_secs_f64(value).map_err(|_| {
        errors::new(
            LIVEREG_INVALID_ARGUMENT,
            format!("{what} must be a finite number of seconds >= 0, got {value}"),
        )
    })
}
