//! `DropEvent`: a registration that ended, as drop callbacks and scans see it.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

/// A registration that ended.
#[pyclass(frozen, module = "livereg", name = "DropEvent")]
pub struct DropEvent {
    /// The instance id it was registered with.
    #[pyo3(get)]
    instance_id: u64,
    /// Its slot index.
    #[pyo3(get)]
    slot: u32,
    /// The slot's generation when it ended.
    #[pyo3(get)]
    generation: u32,
    /// The registering pid, in its own PID namespace.
    #[pyo3(get)]
    pid: u32,
    /// Its label (may be empty).
    #[pyo3(get)]
    label: String,
    /// When it registered, on its own monotonic clock.
    #[pyo3(get)]
    registered_ns: u64,
    /// Its last heartbeat, or `None` if it never beat.
    #[pyo3(get)]
    last_heartbeat_ns: Option<u64>,
    /// How long it had been silent when it ended.
    #[pyo3(get)]
    silent_ns: u64,
    /// Whether a session's client held it (registered through a listener):
    /// its pid is in the client's own PID namespace.
    #[pyo3(get)]
    remote: bool,
    /// Whether this is a `dying` event: its process began to exit (its drop
    /// follows once it has ended).
    #[pyo3(get)]
    dying: bool,
    reason: u8,
}

impl From<&livereg::DropEvent> for DropEvent {
    fn from(event: &livereg::DropEvent) -> Self {
        DropEvent {
            instance_id: event.instance_id,
            slot: event.slot,
            generation: event.generation,
            pid: event.pid,
            label: event.label.clone(),
            registered_ns: event.registered_ns,
            last_heartbeat_ns: event.last_heartbeat_ns,
            silent_ns: u64::try_from(event.silent_for.as_nanos()).unwrap_or(u64::MAX),
            remote: event.remote,
            dying: false,
            reason: event.reason as u8,
        }
    }
}

impl DropEvent {
    /// `event` as a `dying` event.
    pub fn dying(event: &livereg::DropEvent) -> DropEvent {
        DropEvent {
            dying: true,
            ..DropEvent::from(event)
        }
    }
}

/// `livereg.Reason`, the enum the package defines in Python.
pub(crate) fn reason_enum(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    static REASON: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    REASON
        .get_or_try_init(py, || {
            Ok::<_, PyErr>(py.import("livereg._reason")?.getattr("Reason")?.unbind())
        })
        .map(|reason| reason.bind(py))
}

#[pymethods]
impl DropEvent {
    /// Why it ended, a `livereg.Reason`.
    #[getter]
    fn reason<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        reason_enum(py)?.call1((self.reason,))
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let reason = self.reason(py)?.getattr("name")?.extract::<String>()?;
        let dying = if self.dying { ", dying=True" } else { "" };
        Ok(format!(
            "DropEvent(instance_id={}, reason={reason}, pid={}, label={:?}, slot={}{dying})",
            self.instance_id, self.pid, self.label, self.slot
        ))
    }
}
