//! Sessions from Python: `livereg.connect` registers through a reaper's
//! listener, `livereg.remote_status` asks it; reapers take `listen=`
//! addresses.

use crate::errors::{self, OrRaise};
use crate::renamed;
use crate::seconds::seconds;
use crate::worker::Worker;
use livereg::codes::LIVEREG_INVALID_ARGUMENT;
use livereg::{Address, ConnectOptions, ReaperBuilder, TlsClient, TlsServer};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyString};
use std::path::PathBuf;
use std::time::Duration;

/// Whether `name` is a session address (`unix:`, `tcp://`, `tls://`)
/// rather than a table's name: the rule `livereg.connect` and the table
/// functions go by.
#[pyfunction]
pub fn is_address(name: &str) -> bool {
    livereg::Address::is_address(name)
}

/// The token in the file at `path`, read as every livereg client reads one:
/// its first line with the whitespace around it removed; refused
/// (`PermissionDeniedError`) if others can read the file, refused
/// (`InvalidArgumentError`) if the first line is empty or over 256 bytes.
#[pyfunction]
pub fn read_token_file(py: Python<'_>, path: PathBuf) -> PyResult<Py<PyBytes>> {
    let token = py
        .detach(move || livereg::read_token_file(&path))
        .or_raise()?;
    Ok(PyBytes::new(py, &token).unbind())
}

/// `connect`'s bound when none is given, in seconds (its signature repeats
/// it as a literal: Python shows a literal default).
const CONNECT_TIMEOUT: f64 = 2.0;

/// Registers `instance_id` through the reaper listening at `address`
/// (`"unix:/PATH"` or `"tcp://HOST:PORT"`) and returns a `Worker` that pings
/// as fast as a local one (over `unix:`, into memory the listener shares
/// and reads itself, so its death is seen as it begins; elsewhere its
/// sender thread forwards the pings). `token`
/// (str or bytes) is required by `tcp://` listeners; `timeout` bounds the
/// connection and the answer, in seconds (`connect_timeout=`, its name in
/// builds between releases, still works and warns). For `tls://HOST:PORT`, `tls_ca`
/// is the CA file the listener's certificate must chain to (required), and
/// `tls_cert`/`tls_key` this client's certificate for a listener that
/// requires one.
#[pyfunction]
#[pyo3(signature = (address, instance_id, label="", token=None, timeout=2.0, tls_ca=None, tls_cert=None, tls_key=None, *, connect_timeout=None))]
#[allow(clippy::too_many_arguments)] // Python keyword arguments, each with a default
pub fn connect(
    py: Python<'_>,
    address: &str,
    instance_id: u64,
    label: &str,
    token: Option<&Bound<'_, PyAny>>,
    timeout: f64,
    tls_ca: Option<PathBuf>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    connect_timeout: Option<f64>,
) -> PyResult<Worker> {
    #[allow(clippy::float_cmp)] // the default itself, not a computed value
    let given = timeout != CONNECT_TIMEOUT;
    let seconds_given = renamed::keyword(
        py,
        "timeout",
        timeout,
        given,
        "connect_timeout",
        connect_timeout,
    )?;
    let connect_timeout = positive_timeout(seconds_given)?;
    let options = client_options(token, connect_timeout, tls_ca, tls_cert, tls_key)?;
    let (address, label) = (address.to_owned(), label.to_owned());
    py.detach(move || livereg::connect(&address, instance_id, &label, &options))
        .map(Worker::new)
        .or_raise()
}

/// A `timeout=` in seconds, which must be positive (a session's connect
/// and answer cannot take no time at all).
fn positive_timeout(value: f64) -> PyResult<Duration> {
    let timeout = seconds(value, "timeout")?;
    if timeout.is_zero() {
        return Err(errors::new(
            LIVEREG_INVALID_ARGUMENT,
            format!("timeout {value}, expected a positive number of seconds"),
        ));
    }
    Ok(timeout)
}

/// The status of the table behind the listener at `address`, as a
/// `livereg.Status` (what `Table.status()` returns), with only the
/// registrations of `instance_id` (none for `None` or 0): what a process
/// that cannot map the table reads. One connection of its own that
/// registers nothing (an `Ask`), bounded by `timeout` seconds; `token` and
/// the TLS files as `connect` takes them. Raises as `connect` does for the
/// connection (`InvalidArgumentError` for a bad address or timeout,
/// `PermissionDeniedError` for a refused token or TLS handshake,
/// `DeadlineExceededError` for no answer in time, `SystemCallError` for a
/// failed connection), and `IncompatibleError` for an answer that is not a
/// status.
#[pyfunction]
#[pyo3(signature = (address, instance_id=None, token=None, timeout=2.0, tls_ca=None, tls_cert=None, tls_key=None))]
#[allow(clippy::too_many_arguments)] // Python keyword arguments, each with a default
pub fn remote_status<'py>(
    py: Python<'py>,
    address: &str,
    instance_id: Option<u64>,
    token: Option<&Bound<'_, PyAny>>,
    timeout: f64,
    tls_ca: Option<PathBuf>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
) -> PyResult<Bound<'py, PyAny>> {
    let options = client_options(token, positive_timeout(timeout)?, tls_ca, tls_cert, tls_key)?;
    let address = address.to_owned();
    let status = py
        .detach(move || livereg::remote_status(&address, instance_id, &options))
        .or_raise()?;
    let json = serde_json::to_string(&status).map_err(|error| {
        errors::new(
            errors::BASE,
            format!("status could not be serialised: {error}"),
        )
    })?;
    let snapshot = py.import("json")?.call_method1("loads", (json,))?;
    py.import("livereg._status")?
        .getattr("Status")?
        .call_method1("from_dict", (snapshot,))
}

/// A client's options from `connect`'s and `remote_status`'s keyword
/// arguments.
fn client_options(
    token: Option<&Bound<'_, PyAny>>,
    connect_timeout: Duration,
    tls_ca: Option<PathBuf>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
) -> PyResult<ConnectOptions> {
    Ok(ConnectOptions {
        token: token.map(token_bytes).transpose()?,
        connect_timeout: Some(connect_timeout),
        tls: tls_ca.map(|ca| TlsClient {
            ca,
            cert: tls_cert,
            key: tls_key,
        }),
    })
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
        LIVEREG_INVALID_ARGUMENT,
        format!(
            "token of type {}, expected str or bytes",
            token.get_type().name()?
        ),
    ))
}

/// What a reaper's listeners are given from Python: the keyword arguments
/// `start_reaper` and `acquire_reaper` share, declared here once (and in the
/// stub's `ServeOptions`).
#[derive(Default)]
pub struct Listening {
    pub addresses: Vec<String>,
    pub token: Option<Vec<u8>>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub tls_client_ca: Option<PathBuf>,
}

/// The keyword arguments `Listening` reads, in the order the docs give them.
const LISTENING_KEYWORDS: [&str; 5] = ["listen", "token", "tls_cert", "tls_key", "tls_client_ca"];

impl Listening {
    /// Reads `listen`, `token`, `tls_cert`, `tls_key` and `tls_client_ca`
    /// from keyword arguments (each optional; `None` as if absent); any
    /// other keyword is a `TypeError` naming it, as a Python signature
    /// would raise.
    pub fn from_keywords(keywords: Option<&Bound<'_, PyDict>>) -> PyResult<Listening> {
        let mut listening = Listening::default();
        let Some(keywords) = keywords else {
            return Ok(listening);
        };
        for (key, value) in keywords.iter() {
            let key: String = key.extract()?;
            if value.is_none() {
                continue;
            }
            match key.as_str() {
                "listen" => listening.addresses = value.extract()?,
                "token" => listening.token = Some(token_bytes(&value)?),
                "tls_cert" => listening.tls_cert = Some(value.extract()?),
                "tls_key" => listening.tls_key = Some(value.extract()?),
                "tls_client_ca" => listening.tls_client_ca = Some(value.extract()?),
                other => {
                    return Err(PyTypeError::new_err(format!(
                        "unexpected keyword argument '{other}', expected one of {}",
                        LISTENING_KEYWORDS.join(", ")
                    )))
                }
            }
        }
        Ok(listening)
    }
}

/// Adds a listener per address to a reaper being built, with the TLS of
/// its `tls://` ones.
pub fn listen(mut builder: ReaperBuilder, listening: Listening) -> PyResult<ReaperBuilder> {
    for address in listening.addresses {
        builder = builder.listen(
            Address::parse(&address).or_raise()?,
            listening.token.clone(),
        );
    }
    match (listening.tls_cert, listening.tls_key) {
        (Some(cert), Some(key)) => Ok(builder.tls(TlsServer {
            cert,
            key,
            client_ca: listening.tls_client_ca,
        })),
        (None, None) if listening.tls_client_ca.is_none() => Ok(builder),
        _ => Err(errors::new(
            LIVEREG_INVALID_ARGUMENT,
            "tls_cert and tls_key go together (and tls_client_ca needs them), expected both or neither".into(),
        )),
    }
}
