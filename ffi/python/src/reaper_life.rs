//! The reaper's life between Rust and Python: `livereg.ReaperState` (a
//! frozen dataclass of `livereg._status`) made from and read back to
//! [`livereg::ReaperState`].

use crate::errors;
use livereg::codes::LIVEREG_INVALID_ARGUMENT;
use livereg::ReaperState;
use pyo3::prelude::*;

/// `state` as a `livereg.ReaperState`.
pub(crate) fn to_python<'py>(py: Python<'py>, state: ReaperState) -> PyResult<Bound<'py, PyAny>> {
    py.import("livereg._status")?
        .getattr("ReaperState")?
        .call1((state.name(), state.boot_token(), state.pid()))
}

/// A `livereg.ReaperState` (or anything with its three attributes) read
/// back.
pub(crate) fn from_python(known: &Bound<'_, PyAny>) -> PyResult<ReaperState> {
    let name: String = known.getattr("state")?.extract()?;
    let boot_token: Option<u64> = known.getattr("boot_token")?.extract()?;
    let pid: Option<u32> = known.getattr("pid")?.extract()?;
    let (boot_token, pid) = (boot_token.unwrap_or(0), pid.unwrap_or(0));
    match name.as_str() {
        "serving" => Ok(ReaperState::Serving { boot_token, pid }),
        "dying" => Ok(ReaperState::Dying { boot_token, pid }),
        "absent" => Ok(ReaperState::Absent),
        other => Err(errors::new(
            LIVEREG_INVALID_ARGUMENT,
            format!("a reaper state is 'serving', 'dying' or 'absent', got {other:?}"),
        )),
    }
}
