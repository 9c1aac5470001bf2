//! `Worker`: one registration, beating from Python at native speed.

use crate::errors::{self, OrRaise, EVICTED};
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use std::sync::{Mutex, MutexGuard};

/// A registration: ping it, deregister it (or use it as a context manager).
/// Safe to share between threads.
#[pyclass(frozen, module = "livereg", name = "Worker")]
pub struct Worker {
    /// `None` once deregistered.
    handle: Mutex<Option<livereg::Worker>>,
    /// The instance id it was registered with.
    #[pyo3(get)]
    instance_id: u64,
    /// Its slot index.
    #[pyo3(get)]
    slot: u32,
}

impl Worker {
    pub fn new(worker: livereg::Worker) -> Worker {
        Worker {
            instance_id: worker.instance_id(),
            slot: worker.slot(),
            handle: Mutex::new(Some(worker)),
        }
    }

    fn handle(&self) -> MutexGuard<'_, Option<livereg::Worker>> {
        self.handle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs `call` on the live handle, or raises `EvictedError` once it was
    /// deregistered here.
    fn with_live<T>(
        &self,
        call: impl FnOnce(&livereg::Worker) -> livereg::Result<T>,
    ) -> PyResult<T> {
        match self.handle().as_ref() {
            Some(worker) => call(worker).or_raise(),
            None => Err(errors::new(
                EVICTED,
                format!(
                    "instance {} is no longer registered: it was deregistered through this handle",
                    self.instance_id
                ),
            )),
        }
    }
}

#[pymethods]
impl Worker {
    /// Heartbeat. Raises `EvictedError` once the registration ended.
    fn ping(&self) -> PyResult<()> {
        self.with_live(livereg::Worker::heartbeat)
    }

    /// One step of the engine's loop. Raises `EvictedError` once ended.
    fn progress(&self) -> PyResult<()> {
        self.with_live(livereg::Worker::progress)
    }

    /// Whether the engine has work in flight: while busy it must call
    /// `progress()` at least every `progress_timeout`.
    fn set_busy(&self, busy: bool) -> PyResult<()> {
        self.with_live(|worker| worker.set_busy(busy))
    }

    /// A context manager: busy inside the `with` block, idle after it.
    fn busy(slf: Py<Self>) -> BusyScope {
        BusyScope { worker: slf }
    }

    /// The server's info area: read from the table, or as the listener last
    /// delivered it to a session.
    fn info<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyBytes>> {
        let bytes = self.with_live(livereg::Worker::info)?;
        Ok(pyo3::types::PyBytes::new(py, &bytes))
    }

    /// The reap timeout of its table, in seconds (for a session: the
    /// reaper's table's): beat well within it.
    #[getter]
    fn reap_timeout(&self) -> f64 {
        self.handle()
            .as_ref()
            .map_or(0.0, |worker| worker.reap_timeout().as_secs_f64())
    }

    /// Whether it registered through a session (`livereg.connect`).
    #[getter]
    fn remote(&self) -> bool {
        self.handle()
            .as_ref()
            .is_some_and(livereg::Worker::is_remote)
    }

    /// Ends the registration cleanly. Raises `EvictedError` if it had
    /// already ended; the handle is released either way.
    fn deregister(&self, py: Python<'_>) -> PyResult<()> {
        let taken = self.handle().take();
        match taken {
            Some(worker) => py.detach(move || worker.deregister()).or_raise(),
            None => Ok(()),
        }
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) -> PyResult<()> {
        errors::unless_evicted(py, self.deregister(py))
    }

    fn __repr__(&self) -> String {
        let state = if self.handle().is_some() {
            "registered"
        } else {
            "deregistered"
        };
        format!(
            "Worker(instance_id={}, slot={}, {state})",
            self.instance_id, self.slot
        )
    }
}

/// `with worker.busy():` marks the worker busy for the block.
#[pyclass(frozen, module = "livereg", name = "BusyScope")]
pub struct BusyScope {
    worker: Py<Worker>,
}

#[pymethods]
impl BusyScope {
    fn __enter__(&self, py: Python<'_>) -> PyResult<Py<Worker>> {
        self.worker.get().set_busy(true)?;
        Ok(self.worker.clone_ref(py))
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) -> PyResult<()> {
        errors::unless_evicted(py, self.worker.get().set_busy(false))
    }
}
