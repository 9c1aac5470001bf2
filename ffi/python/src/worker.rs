//! `Worker`: one registration, beating from Python at native speed.

use crate::errors::{self, OrRaise};
use livereg::codes::LIVEREG_EVICTED;
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// A registration: ping it, deregister it (or use it as a context manager).
/// Safe to share between threads.
#[pyclass(frozen, module = "livereg", name = "Worker")]
pub struct Worker {
    /// `None` once deregistered. Shared only while a clear is asked
    /// through it (outside the lock, so pings go on meanwhile).
    handle: Mutex<Option<Arc<livereg::Worker>>>,
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
            handle: Mutex::new(Some(Arc::new(worker))),
        }
    }

    fn handle(&self) -> MutexGuard<'_, Option<Arc<livereg::Worker>>> {
        self.handle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs `call` on the live handle, or raises `EvictedError` once it was
    /// deregistered here. The error becomes an exception only once the
    /// handle's lock is released: making it runs Python code (`Reason`),
    /// where the interpreter may hand the GIL to another thread, which would
    /// then wait on this lock while this thread waits for the GIL.
    fn with_live<T>(
        &self,
        call: impl FnOnce(&livereg::Worker) -> livereg::Result<T>,
    ) -> PyResult<T> {
        let result = match self.handle().as_ref() {
            Some(worker) => call(worker),
            None => return Err(self.deregistered()),
        };
        result.or_raise()
    }

    fn deregistered(&self) -> PyErr {
        errors::new(
            LIVEREG_EVICTED,
            format!(
                "instance {} is no longer registered: it was deregistered through this handle",
                self.instance_id
            ),
        )
    }

    /// Asks for a clear (or reset) through the handle, without holding the
    /// lock or the GIL while it waits.
    fn request(&self, py: Python<'_>, reset: bool, wait: Duration) -> PyResult<()> {
        let shared = self.handle().clone().ok_or_else(|| self.deregistered())?;
        py.detach(move || {
            if reset {
                shared.reset(wait)
            } else {
                shared.clear(wait)
            }
        })
        .or_raise()
    }
}

/// A worker collected while still registered deregisters; a session's
/// waits (a bounded time) for its sender thread to say goodbye, which may
/// be reconnecting: that wait never holds the interpreter.
impl Drop for Worker {
    fn drop(&mut self) {
        let Some(handle) = self.handle().take() else {
            return;
        };
        if crate::exiting::started() {
            return drop(handle);
        }
        Python::attach(|py| py.detach(move || drop(handle)));
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

    /// Beats every `interval` seconds from a native thread until the
    /// registration ends or the returned `BeatThread` is stopped: a hang
    /// that holds the GIL does not stop these beats, so it is judged by
    /// progress (`STALLED`), not taken for silence. If it ends `STALLED`,
    /// the thread raises `stall_signal` in itself (for a
    /// `faulthandler.register(stall_signal, file=..., all_threads=True)`,
    /// which dumps every thread's stack even while another holds the GIL),
    /// then copies `stall_report` (that file) to stderr, naming the frame
    /// where thread `step_thread` (a `threading.get_ident()`) hangs.
    #[pyo3(signature = (interval, stall_signal=None, stall_report=None, step_thread=None))]
    fn beat_in_background(
        &self,
        interval: f64,
        stall_signal: Option<i32>,
        stall_report: Option<String>,
        step_thread: Option<u64>,
    ) -> PyResult<crate::beat_thread::BeatThread> {
        let interval = crate::seconds::seconds(interval, "interval")?;
        let shared = self.handle().clone().ok_or_else(|| self.deregistered())?;
        let report = crate::beat_thread::StallReport {
            signal: stall_signal,
            file: stall_report,
            step_thread,
            instance_id: self.instance_id,
        };
        crate::beat_thread::BeatThread::start(&shared, interval, report)
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

    /// The server's reaper as this registration knows it, a
    /// `livereg.ReaperState`: as `Table.reaper_state` for a worker of a
    /// table; for a session, `"serving"` (the welcoming reaper's token, pid
    /// `0`) while connected and `"absent"` from the connection's close until
    /// a listener takes it back (never `"dying"`).
    #[getter]
    fn reaper_state<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let state = self.with_live(|worker| Ok(worker.reaper_state()))?;
        crate::reaper_life::to_python(py, state)
    }

    /// Waits (without the GIL, no polling) up to `timeout` seconds for the
    /// server's reaper to differ from `known`; the state then (`known` when
    /// the time ran out).
    fn wait_reaper_state<'py>(
        &self,
        py: Python<'py>,
        known: &Bound<'py, PyAny>,
        timeout: f64,
    ) -> PyResult<Bound<'py, PyAny>> {
        let known = crate::reaper_life::from_python(known)?;
        let wait = crate::seconds::seconds(timeout, "timeout")?;
        let shared = self.handle().clone().ok_or_else(|| self.deregistered())?;
        let now = py.detach(move || shared.wait_reaper_state(known, wait));
        crate::reaper_life::to_python(py, now)
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
            .is_some_and(|worker| worker.is_remote())
    }

    /// Asks the server for a clear of its stored cache (its clear
    /// handlers run once), from the engine holding this registration: on
    /// its table, or, for a session, through the listener it connected to.
    /// Registrations are untouched. Waits up to `timeout` seconds (`wait=`,
    /// its name in builds between releases, still works and warns). Raises
    /// `DeadlineExceededError`, `NoReaperError`, and for a session what `connect`
    /// raises for the connection.
    #[pyo3(signature = (timeout = 5.0, *, wait = None))]
    fn clear(&self, py: Python<'_>, timeout: f64, wait: Option<f64>) -> PyResult<()> {
        let timeout = crate::renamed::clear_timeout(py, timeout, wait)?;
        self.request(py, false, timeout)
    }

    /// As `clear`, a reset: every registration of the server's table ends
    /// `CLEARED` (this one too: its next `ping` raises `EvictedError`),
    /// then its cache is cleared.
    #[pyo3(signature = (timeout = 5.0, *, wait = None))]
    fn reset(&self, py: Python<'_>, timeout: f64, wait: Option<f64>) -> PyResult<()> {
        let timeout = crate::renamed::clear_timeout(py, timeout, wait)?;
        self.request(py, true, timeout)
    }

    /// Ends the registration cleanly. Raises `EvictedError` if it had
    /// already ended; the handle is released either way (after any clear
    /// asked through it returns).
    fn deregister(&self, py: Python<'_>) -> PyResult<()> {
        let Some(mut shared) = self.handle().take() else {
            return Ok(());
        };
        py.detach(move || loop {
            match Arc::try_unwrap(shared) {
                Ok(worker) => return worker.deregister(),
                Err(still_shared) => {
                    shared = still_shared;
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        })
        .or_raise()
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
