//! `Table` and the module functions `create`, `open` and `unlink`.

use crate::callbacks;
use crate::errors::{self, OrRaise};
use crate::reaper::{DrivenReaper, Reaper};
use crate::renamed;
use crate::seconds::seconds;
use crate::session;
use crate::worker::Worker;
use livereg::codes::LIVEREG_INVALID_ARGUMENT;
use livereg::{StampClock, TableOptions};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyString, PyTuple};
use std::sync::Mutex;

/// An open table: `close()` it, or use it as a context manager. Workers and
/// reapers made from it keep the mapping alive after it is closed.
#[pyclass(frozen, module = "livereg", name = "Table")]
pub struct Table {
    handle: Mutex<Option<livereg::Table>>,
    /// The name it was created or opened with.
    #[pyo3(get)]
    name: String,
}

impl Table {
    /// The status as `livereg status --json` writes it, parsed to a dict.
    fn snapshot<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let table = self.live()?;
        let status = py.detach(move || table.status()).or_raise()?;
        let json = serde_json::to_string(&status).map_err(|error| {
            errors::new(
                errors::BASE,
                format!("status could not be serialised: {error}"),
            )
        })?;
        py.import("json")?.call_method1("loads", (json,))
    }

    fn new(table: livereg::Table) -> Table {
        Table {
            name: table.name().to_owned(),
            handle: Mutex::new(Some(table)),
        }
    }

    /// A handle to the open table (cheap: shares the mapping).
    fn live(&self) -> PyResult<livereg::Table> {
        self.handle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
            .ok_or_else(|| {
                errors::new(
                    LIVEREG_INVALID_ARGUMENT,
                    format!("table '{}' is closed", self.name),
                )
            })
    }

    /// The reaper `start_reaper` and `acquire_reaper` make: these
    /// callbacks, serving sessions where `listening` says.
    fn reaper_builder(
        &self,
        on_drop: Option<Py<PyAny>>,
        on_clear: Option<Py<PyAny>>,
        on_dying: Option<Py<PyAny>>,
        listening: session::Listening,
    ) -> PyResult<livereg::ReaperBuilder> {
        let builder = callbacks::attach(self.live()?.reaper(), on_drop, on_clear, on_dying);
        session::listen(builder, listening)
    }
}

#[pymethods]
impl Table {
    /// Registers `instance_id` (not 0) with a label of at most 47 bytes.
    /// Waits (without the GIL) at most `drop_wait` seconds in all (default
    /// 5) for the registration lock another process holds and a pending drop
    /// of the same id, then raises `BusyError`; with `replace`, ends a live
    /// registration of that id first. (`wait=`, its name in builds between
    /// releases, still works and warns.)
    #[pyo3(signature = (instance_id, label=None, replace=false, drop_wait=None, *, wait=None))]
    fn register(
        &self,
        py: Python<'_>,
        instance_id: u64,
        label: Option<String>,
        replace: bool,
        drop_wait: Option<f64>,
        wait: Option<f64>,
    ) -> PyResult<Worker> {
        let table = self.live()?;
        let given = drop_wait.is_some();
        let drop_wait =
            renamed::keyword(py, "drop_wait", drop_wait, given, "wait", wait.map(Some))?;
        let drop_wait = drop_wait.map(|w| seconds(w, "drop_wait")).transpose()?;
        let worker = py.detach(move || {
            let mut registration = table.registration(instance_id).replace(replace);
            if let Some(wait) = drop_wait {
                registration = registration.wait(wait);
            }
            if let Some(label) = &label {
                registration = registration.label(label);
            }
            registration.register()
        });
        worker.map(Worker::new).or_raise()
    }

    /// Asks the reaper to run its clear handlers once and waits up to
    /// `timeout` seconds (without the GIL). Registrations are untouched.
    /// (`wait=`, its name in builds between releases, still works and
    /// warns.)
    #[pyo3(signature = (timeout=5.0, *, wait=None))]
    fn clear(&self, py: Python<'_>, timeout: f64, wait: Option<f64>) -> PyResult<()> {
        let table = self.live()?;
        let timeout = renamed::clear_timeout(py, timeout, wait)?;
        py.detach(move || table.clear(timeout)).or_raise()
    }

    /// A clear that first ends every registration (reason `CLEARED`): their
    /// drop handlers, then the clear handlers, run before it returns.
    #[pyo3(signature = (timeout=5.0, *, wait=None))]
    fn reset(&self, py: Python<'_>, timeout: f64, wait: Option<f64>) -> PyResult<()> {
        let table = self.live()?;
        let timeout = renamed::clear_timeout(py, timeout, wait)?;
        py.detach(move || table.reset(timeout)).or_raise()
    }

    /// Declares that this process owns the file at `path` (one it made
    /// that must not outlive it): the reaper removes it once this process
    /// has ended, and never while it lives. A regular file directly in a
    /// directory the table allows (default `/dev/shm`), of this process's
    /// user; never a link. Raises `InvalidArgumentError`, `NotFoundError`,
    /// `PermissionError` or `FullError` naming the path and the rule.
    fn own_file(&self, py: Python<'_>, path: std::path::PathBuf) -> PyResult<()> {
        let table = self.live()?;
        py.detach(move || table.own_file(&path)).or_raise()
    }

    /// Forgets a declaration of [`own_file`]'s (the file stays): whether
    /// this process owned it.
    fn disown_file(&self, py: Python<'_>, path: std::path::PathBuf) -> PyResult<bool> {
        let table = self.live()?;
        py.detach(move || table.disown_file(&path)).or_raise()
    }

    /// The live reaper's boot token (changes whenever a reaper starts), or
    /// `None` if no reaper holds the table.
    fn probe(&self) -> PyResult<Option<u64>> {
        match self.live()?.probe() {
            Ok(token) => Ok(Some(token)),
            Err(livereg::Error::NoReaper(_)) => Ok(None),
            Err(error) => Err(errors::raise(error)),
        }
    }

    /// The table's reaper now, a `livereg.ReaperState`: `state` is
    /// `"serving"` (with its `boot_token` and `pid`), `"dying"` (its process
    /// began to end: the kernel marked its life word at the start of its
    /// exit) or `"absent"`. A few loads of the table's header.
    #[getter]
    fn reaper_state<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let table = self.live()?;
        crate::reaper_life::to_python(py, table.reaper_state())
    }

    /// Waits (without the GIL, no polling) up to `timeout` seconds for the
    /// reaper's state to differ from `known` (the state last acted on);
    /// returns the state then, equal to `known` when the time ran out.
    fn wait_reaper_state<'py>(
        &self,
        py: Python<'py>,
        known: &Bound<'py, PyAny>,
        timeout: f64,
    ) -> PyResult<Bound<'py, PyAny>> {
        let table = self.live()?;
        let known = crate::reaper_life::from_python(known)?;
        let wait = seconds(timeout, "timeout")?;
        let now = py.detach(move || table.wait_reaper_state(known, wait));
        crate::reaper_life::to_python(py, now)
    }

    /// A snapshot as a `livereg.Status` (typed: every key of `livereg
    /// status --json` as an attribute, `registrations` a list of
    /// `livereg.RegistrationStatus`).
    fn status<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let snapshot = self.snapshot(py)?;
        py.import("livereg._status")?
            .getattr("Status")?
            .call_method1("from_dict", (snapshot,))
    }

    /// The table's metrics in the OpenMetrics text format (ending in
    /// `# EOF`), for a server's own `/metrics` endpoint.
    fn metrics_text(&self, py: Python<'_>) -> PyResult<String> {
        let table = self.live()?;
        py.detach(move || table.metrics_text()).or_raise()
    }

    /// The snapshot as a plain dict without the per-registration list: the
    /// reference's `worker_liveness` keys (`enabled`, `reap_timeout_seconds`,
    /// `registration_grace_seconds`, `tracked_instances`), the reaper's
    /// health and counters; what a health endpoint returns as JSON.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let status = self.snapshot(py)?;
        status.cast::<PyDict>()?.del_item("registrations")?;
        py.import("livereg._status")?
            .getattr("Stats")?
            .call1((status,))
    }

    /// Number of slots.
    #[getter]
    fn capacity(&self) -> PyResult<u32> {
        Ok(self.live()?.capacity())
    }

    /// Silence budget of a worker that has beaten, in seconds (0: reaping off).
    #[getter]
    fn reap_timeout(&self) -> PyResult<f64> {
        Ok(self.live()?.reap_timeout().as_secs_f64())
    }

    /// Silence budget of a worker that never beat, in seconds.
    #[getter]
    fn registration_grace(&self) -> PyResult<f64> {
        Ok(self.live()?.registration_grace().as_secs_f64())
    }

    /// How long a busy worker may make no progress, in seconds (0: off).
    #[getter]
    fn progress_timeout(&self) -> PyResult<f64> {
        Ok(self.live()?.progress_timeout().as_secs_f64())
    }

    /// Publishes `value` (bytes, or text as UTF-8; at most 1,024 bytes) for
    /// workers to read with `info()`, without RPC.
    fn set_info(&self, value: &Bound<'_, PyAny>) -> PyResult<()> {
        let table = self.live()?;
        if let Ok(text) = value.cast::<PyString>() {
            return table.set_info(text.to_cow()?.as_bytes()).or_raise();
        }
        let bytes: Vec<u8> = value.extract().map_err(|_| {
            errors::new(
                LIVEREG_INVALID_ARGUMENT,
                format!(
                    "info must be bytes or str, got {}",
                    value
                        .get_type()
                        .name()
                        .map(|n| n.to_string())
                        .unwrap_or_default()
                ),
            )
        })?;
        table.set_info(&bytes).or_raise()
    }

    /// The bytes last published with `set_info` (a consistent copy).
    fn info<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let bytes = self.live()?.info().or_raise()?;
        Ok(PyBytes::new(py, &bytes))
    }

    /// Starts this table's reaper thread. Raises `BusyError` if another
    /// reaper holds the table. With a zero reap timeout nothing is started.
    /// `listen` addresses (`"unix:/PATH"`, `"tcp://HOST:PORT"`) also serve
    /// workers that cannot map the table (`livereg.connect`), for the
    /// reaper's life; `token` (str or bytes) is what they must present
    /// (required for `tcp://`). `tls://` addresses take `tls_cert` and
    /// `tls_key` (PEM files), and `tls_client_ca` to require client
    /// certificates (which may then replace the token).
    #[pyo3(signature = (on_drop=None, on_clear=None, on_dying=None, **serving))]
    fn start_reaper(
        &self,
        py: Python<'_>,
        on_drop: Option<Py<PyAny>>,
        on_clear: Option<Py<PyAny>>,
        on_dying: Option<Py<PyAny>>,
        serving: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Reaper> {
        let listening = session::Listening::from_keywords(serving)?;
        let builder = self.reaper_builder(on_drop, on_clear, on_dying, listening)?;
        py.detach(move || builder.spawn())
            .map(Reaper::new)
            .or_raise()
    }

    /// Takes this table's reaper role for a loop of yours (see
    /// `DrivenReaper`); callbacks run inside `scan()`. Raises `BusyError` if
    /// another reaper holds the table. `listen`, `token` and the TLS files
    /// as for `start_reaper`.
    #[pyo3(signature = (on_drop=None, on_clear=None, on_dying=None, **serving))]
    fn acquire_reaper(
        &self,
        py: Python<'_>,
        on_drop: Option<Py<PyAny>>,
        on_clear: Option<Py<PyAny>>,
        on_dying: Option<Py<PyAny>>,
        serving: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<DrivenReaper> {
        let listening = session::Listening::from_keywords(serving)?;
        let builder = self.reaper_builder(on_drop, on_clear, on_dying, listening)?;
        py.detach(move || builder.build())
            .map(DrivenReaper::new)
            .or_raise()
    }

    /// Closes this handle (workers and reapers made from it stay valid).
    fn close(&self) {
        let taken = self
            .handle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        drop(taken);
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, _exc: &Bound<'_, PyTuple>) {
        self.close();
    }

    fn __repr__(&self) -> String {
        format!("Table(name={:?})", self.name)
    }
}

/// Creates table `name` exclusively. `registration_grace` defaults to the
/// larger of 30 s and `reap_timeout`; `progress_timeout` (0: off) is how long
/// a busy worker may make no progress before it ends `STALLED`; `clock`
/// ("auto", "precise" or "coarse") is the clock heartbeats stamp with;
/// `owned_dirs` (default `["/dev/shm"]`) the directories where processes
/// may own files the reaper removes once they have ended.
#[pyfunction]
#[pyo3(signature = (name, capacity=256, reap_timeout=10.0, registration_grace=None, mode=0o600, progress_timeout=0.0, clock="auto", owned_dirs=None))]
#[allow(clippy::too_many_arguments)] // Python keyword arguments, each with a default
pub fn create(
    py: Python<'_>,
    name: &str,
    capacity: u32,
    reap_timeout: f64,
    registration_grace: Option<f64>,
    mode: u32,
    progress_timeout: f64,
    clock: &str,
    owned_dirs: Option<Vec<std::path::PathBuf>>,
) -> PyResult<Table> {
    let stamp_clock = match clock {
        "auto" => StampClock::Auto,
        "precise" => StampClock::Precise,
        "coarse" => StampClock::Coarse,
        other => {
            return Err(errors::new(
                LIVEREG_INVALID_ARGUMENT,
                format!("clock {other:?}, expected \"auto\", \"precise\" or \"coarse\""),
            ))
        }
    };
    let options = TableOptions {
        capacity,
        mode,
        reap_timeout: seconds(reap_timeout, "reap_timeout")?,
        registration_grace: seconds(
            registration_grace
                .unwrap_or(reap_timeout.max(livereg::DEFAULT_REGISTRATION_GRACE.as_secs_f64())),
            "registration_grace",
        )?,
        progress_timeout: seconds(progress_timeout, "progress_timeout")?,
        stamp_clock,
        owned_dirs: owned_dirs.unwrap_or_else(|| TableOptions::default().owned_dirs),
    };
    py.detach(|| livereg::Table::create(name, &options))
        .map(Table::new)
        .or_raise()
}

/// Opens and validates an existing table.
#[pyfunction]
pub fn open(py: Python<'_>, name: &str) -> PyResult<Table> {
    py.detach(|| livereg::Table::open(name))
        .map(Table::new)
        .or_raise()
}

/// Removes the table's name (handles stay valid until closed).
#[pyfunction]
pub fn unlink(name: &str) -> PyResult<()> {
    livereg::Table::unlink(name).or_raise()
}
