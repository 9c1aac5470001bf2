//! Sessions from Python: `livereg.connect` registers through a reaper's
//! listener; reapers take `listen=` addresses.

use crate::errors::{self, OrRaise, INVALID_ARGUMENT};
use crate::worker::Worker;
use livereg::{Address, ConnectOptions, ReaperBuilder};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};
use std::time::Duration;

/// Registers `instance_id` through the reaper listening at `address`
/// (`"unix:/PATH"` or `"tcp://HOST:PORT"`) and returns a `Worker` that pings
/// as fast as a local one (its sender thread forwards the pings). `token`
/// (str or bytes) is required by `tcp://` listeners; `timeout` bounds the
/// connection and the answer, in seconds.
#[pyfunction]
#[pyo3(signature = (address, instance_id, label="", token=None, timeout=2.0))]
pub fn connect(
    py: Python<'_>,
    address: &str,
    instance_id: u64,
    label: &str,
    token: Option<&Bound<'_, PyAny>>,
    timeout: f64,
) -> PyResult<Worker> {
    if !(timeout.is_finite() && timeout > 0.0) {
        return Err(errors::new(
            INVALID_ARGUMENT,
            format!("timeout {timeout}, expected a positive number of seconds"),
        ));
    }
    let options = ConnectOptions {
        token: token.map(token_bytes).transpose()?,
        connect_timeout: Some(Duration::from_secs_f64(timeout)),
    };
    let (address, label) = (address.to_owned(), label.to_owned());
    py.detach(move || livereg::connect(&address, instance_id, &label, &options))
        .map(Worker::new)
        .or_raise()
}

/// A token given as `str` (its UTF-8) or `bytes`.
pub fn token_bytes(token: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    if let Ok(text) = token.cast::<PyString>() {
        return Ok(text.extract::<String>()?.into_bytes());
    }
    if let Ok(bytes) = token.cast::<PyBytes>() {
        return Ok(bytes.as_bytes().to_vec());
    }
    Err(errors::new(
        INVALID_ARGUMENT,
        format!(
            "token of type {}, expected str or bytes",
            token.get_type().name()?
        ),
    ))
}

/// Adds a listener per address to a reaper being built.
pub fn listen(
    mut builder: ReaperBuilder,
    addresses: Vec<String>,
    token: Option<&Bound<'_, PyAny>>,
) -> PyResult<ReaperBuilder> {
    let token = token.map(token_bytes).transpose()?;
    for address in addresses {
        builder = builder.listen(Address::parse(&address).or_raise()?, token.clone());
    }
    Ok(builder)
}
