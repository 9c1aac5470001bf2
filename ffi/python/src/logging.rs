//! The library's `log` records, routed to `logging.getLogger("livereg")`.
//!
//! A record is never delivered on the thread that logs it: the library's
//! threads (a reaper's scan, a listener, a session's sender) would need the
//! interpreter for each record, and a thread that holds the interpreter
//! while it waits for one of them (dropping a reaper joins its listener)
//! would never get it back. They queue the record instead (bounded; what
//! does not fit is counted and said later), and one thread of this module
//! delivers the queue under the interpreter.

use crate::exiting;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::OnceLock;

/// Records waiting for the delivering thread at most.
const QUEUE_MAX: usize = 4096;

/// Queues each record for the delivering thread; once the interpreter is
/// exiting, writes it to stderr.
struct PythonLogger {
    queue: OnceLock<SyncSender<(log::Level, String)>>,
    /// Records that found the queue full since the last delivered.
    dropped: AtomicU64,
}

static LOGGER: PythonLogger = PythonLogger {
    queue: OnceLock::new(),
    dropped: AtomicU64::new(0),
};

/// Installs the bridge (once per process; a second `log` logger installed by
/// someone else wins, and is left alone).
pub fn install() {
    if log::set_logger(&LOGGER).is_err() {
        return;
    }
    let (queue, records) = sync_channel(QUEUE_MAX);
    let started = std::thread::Builder::new()
        .name("livereg-log".into())
        .spawn(move || deliver(&records));
    if started.is_ok() {
        let _ = LOGGER.queue.set(queue);
    }
    log::set_max_level(log::LevelFilter::Info);
}

/// The delivering thread: each record to Python's `logging`, under the
/// interpreter; never joined, so nothing waits for it.
fn deliver(records: &Receiver<(log::Level, String)>) {
    while let Ok((level, message)) = records.recv() {
        let _delivering = exiting::delivering();
        if exiting::started() {
            eprintln!("livereg: {message}");
            continue;
        }
        let dropped = LOGGER.dropped.swap(0, Relaxed);
        Python::attach(|py| {
            let Ok(logger) = logger(py) else {
                return;
            };
            if dropped > 0 {
                let note = format!("{dropped} log records were dropped: the queue was full");
                let _ = logger.call_method1("log", (30, "%s", note));
            }
            let _ = logger.call_method1("log", (python_level(level), "%s", message));
        });
    }
}

fn logger(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    static LOGGER: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    LOGGER
        .get_or_try_init(py, || {
            Ok::<_, PyErr>(
                py.import("logging")?
                    .call_method1("getLogger", ("livereg",))?
                    .unbind(),
            )
        })
        .map(|logger| logger.bind(py))
}

/// Python's level number for a `log` level.
fn python_level(level: log::Level) -> u32 {
    match level {
        log::Level::Error => 40,
        log::Level::Warn => 30,
        log::Level::Info => 20,
        log::Level::Debug => 10,
        log::Level::Trace => 5,
    }
}

impl log::Log for PythonLogger {
    fn enabled(&self, _metadata: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        let message = record.args().to_string();
        let Some(queue) = self.queue.get().filter(|_| !exiting::started()) else {
            eprintln!("livereg: {message}");
            return;
        };
        match queue.try_send((record.level(), message)) {
            Ok(()) => {}
            Err(TrySendError::Full { .. }) => {
                self.dropped.fetch_add(1, Relaxed);
            }
            Err(TrySendError::Disconnected((_, message))) => eprintln!("livereg: {message}"),
        }
    }

    fn flush(&self) {}
}

/// Logs `error` with its traceback at ERROR.
pub fn exception(py: Python<'_>, message: &str, error: &PyErr) {
    let Ok(logger) = logger(py) else {
        error.print(py);
        return;
    };
    let kwargs = pyo3::types::PyDict::new(py);
    let logged = kwargs
        .set_item("exc_info", error.value(py))
        .and_then(|()| logger.call_method("error", ("%s", message), Some(&kwargs)));
    if logged.is_err() {
        error.print(py);
    }
}
