//! The two reapers: `Reaper`, a library thread scanning on its own, and
//! `DrivenReaper`, the reaper role held for a loop of the caller's (asyncio,
//! `selectors`) that scans when the reaper's descriptor is readable or its
//! next scan is due.

use crate::errors::{self, OrRaise};
use crate::event::DropEvent;
use crate::exiting::{self, Slot};
use livereg::codes::{LIVEREG_BUSY, LIVEREG_INVALID_ARGUMENT};
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A running reaper thread: `stop()` it, or use it as a context manager.
/// Callbacks run on library threads, attached to the interpreter only while
/// they run; several may run at once when one is slow.
#[pyclass(frozen, module = "livereg", name = "Reaper")]
pub struct Reaper {
    thread: Arc<Slot>,
    table: String,
}

impl Reaper {
    pub fn new(thread: livereg::ReaperThread) -> Reaper {
        let table = thread.table().name().to_owned();
        let thread = Arc::new(Mutex::new(Some(thread)));
        exiting::track(&thread);
        Reaper { thread, table }
    }
}

#[pymethods]
impl Reaper {
    /// Stops the thread after its current scan; waits for running callbacks.
    /// Raises `BusyError` when called from one of its own callbacks (which it
    /// would wait for): the reaper then stops once that callback returns.
    fn stop(&self, py: Python<'_>) -> PyResult<()> {
        let taken = lock(&self.thread).take();
        match taken {
            Some(thread) => py.detach(move || thread.stop()).or_raise(),
            None => Ok(()),
        }
    }

    /// Whether the thread still scans. Raises the error that ended it if it
    /// stopped on its own (the table was truncated under it).
    fn check(&self) -> PyResult<bool> {
        let mut guard = lock(&self.thread);
        match guard.as_mut() {
            Some(thread) => thread.check().map(|()| thread.is_running()).or_raise(),
            None => Ok(false),
        }
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) -> PyResult<()> {
        self.stop(py)
    }

    fn __repr__(&self) -> String {
        let state = if lock(&self.thread).is_some() {
            "running"
        } else {
            "stopped"
        };
        format!("Reaper(table={:?}, {state})", self.table)
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        let taken = lock(&self.thread).take();
        if let Some(thread) = taken {
            // Collected while running: stop it without holding the
            // interpreter, which its callbacks may be waiting for.
            Python::attach(|py| py.detach(move || drop(thread.stop())));
        }
    }
}

/// The table's reaper role, scanning only when told: wait until `fileno()` is
/// readable or `next_scan_in()` seconds pass, then `scan()`. `events()` does
/// that on the running asyncio loop.
#[pyclass(frozen, module = "livereg", name = "DrivenReaper")]
pub struct DrivenReaper {
    reaper: Mutex<Option<livereg::Reaper>>,
    fd: RawFd,
    table: String,
    /// The thread scanning now (0: none), to refuse a re-entrant call from a
    /// callback instead of waiting for itself.
    scanning: AtomicU64,
}

fn thread_id() -> u64 {
    // The address of a thread-local identifies its thread while it lives.
    thread_local!(static MARK: u8 = const { 0 });
    MARK.with(|mark| std::ptr::from_ref(mark) as u64)
}

impl DrivenReaper {
    pub fn new(reaper: livereg::Reaper) -> DrivenReaper {
        DrivenReaper {
            fd: reaper.as_raw_fd(),
            table: reaper.table().name().to_owned(),
            reaper: Mutex::new(Some(reaper)),
            scanning: AtomicU64::new(0),
        }
    }

    /// Runs `call` on the live reaper, detached from the interpreter (a scan
    /// on another thread may need it for its callbacks).
    fn with_live<T: Send>(
        &self,
        py: Python<'_>,
        what: &str,
        call: impl FnOnce(&mut Option<livereg::Reaper>) -> PyResult<T> + Send,
    ) -> PyResult<T> {
        if self.scanning.load(Ordering::Acquire) == thread_id() {
            return Err(errors::new(LIVEREG_BUSY, format!(
                "table '{}': cannot {what} from inside this reaper's own scan (a callback); return from the callback first",
                self.table
            )));
        }
        py.detach(|| call(&mut lock(&self.reaper)))
    }

    /// One scan now, on this thread (the GIL released), as the library
    /// reports it.
    fn scan_report(&self, py: Python<'_>) -> PyResult<livereg::ScanReport> {
        self.with_live(py, "scan", |reaper| {
            let reaper = reaper.as_mut().ok_or_else(|| self.stopped_error())?;
            self.scanning.store(thread_id(), Ordering::Release);
            let report = reaper.scan();
            self.scanning.store(0, Ordering::Release);
            report.or_raise()
        })
    }

    fn stopped_error(&self) -> PyErr {
        errors::new(
            LIVEREG_INVALID_ARGUMENT,
            format!(
                "table '{}': this reaper was stopped; acquire it again",
                self.table
            ),
        )
    }
}

#[pymethods]
impl DrivenReaper {
    /// A descriptor that becomes readable when a scan is due early (a watched
    /// process exited, a registration ended, a clear was requested).
    fn fileno(&self, py: Python<'_>) -> PyResult<RawFd> {
        self.with_live(py, "read the descriptor", |reaper| match reaper {
            Some(_) => Ok(self.fd),
            None => Err(self.stopped_error()),
        })
    }

    /// Seconds until the next periodic scan is due (0.0: now).
    fn next_scan_in(&self, py: Python<'_>) -> PyResult<f64> {
        self.with_live(py, "ask for the next scan", |reaper| match reaper {
            Some(reaper) => Ok(reaper.next_scan_in().as_secs_f64()),
            None => Err(self.stopped_error()),
        })
    }

    /// One scan now: ends what went silent or exited, runs the callbacks on
    /// this thread, and returns the registrations that ended.
    fn scan(&self, py: Python<'_>) -> PyResult<Vec<DropEvent>> {
        let report = self.scan_report(py)?;
        Ok(report.ended.iter().map(DropEvent::from).collect())
    }

    /// One scan now, as `scan()`, returning the registrations found dying
    /// (events with `dying` set) before those that ended: what `events()`
    /// yields.
    fn scan_all(&self, py: Python<'_>) -> PyResult<Vec<DropEvent>> {
        let report = self.scan_report(py)?;
        let dying = report.dying.iter().map(DropEvent::dying);
        Ok(dying
            .chain(report.ended.iter().map(DropEvent::from))
            .collect())
    }

    /// Gives the reaper role back (another reaper may take it).
    fn stop(&self, py: Python<'_>) -> PyResult<()> {
        self.with_live(py, "stop the reaper", |reaper| {
            drop(reaper.take());
            Ok(())
        })
    }

    /// Whether `stop()` gave the role back.
    #[getter]
    fn stopped(&self) -> bool {
        // Never waits: a scan holds the lock, and a scanning reaper is held.
        match self.reaper.try_lock() {
            Ok(reaper) => reaper.is_none(),
            Err(_) => false,
        }
    }

    /// An async iterator over the drops, driving the scans on the running
    /// asyncio loop: `async for event in reaper.events(): ...`.
    fn events<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        slf.py()
            .import("livereg._aio")?
            .call_method1("events", (slf,))
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) -> PyResult<()> {
        self.stop(py)
    }

    fn __repr__(&self) -> String {
        // Never waits: a scan holds the lock, detached from the interpreter.
        let state = match self.reaper.try_lock() {
            Ok(reaper) if reaper.is_some() => "held",
            Ok(_) => "stopped",
            Err(_) => "scanning",
        };
        format!("DrivenReaper(table={:?}, {state})", self.table)
    }
}
