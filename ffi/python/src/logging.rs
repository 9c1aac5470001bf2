//! The library's `log` records, routed to `logging.getLogger("livereg")`.

use crate::exiting;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

/// Forwards each record to Python's `logging` (attaching to the interpreter
/// for the call); once the interpreter is exiting, to stderr.
struct PythonLogger;

/// Installs the bridge (once per process; a second `log` logger installed by
/// someone else wins, and is left alone).
pub fn install() {
    if log::set_logger(&PythonLogger).is_ok() {
        log::set_max_level(log::LevelFilter::Info);
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
fn level(level: log::Level) -> u32 {
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
        if exiting::started() {
            eprintln!("livereg: {message}");
            return;
        }
        Python::attach(|py| {
            if let Ok(logger) = logger(py) {
                let _ = logger.call_method1("log", (level(record.level()), "%s", message));
            }
        });
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
