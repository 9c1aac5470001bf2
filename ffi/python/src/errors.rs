//! The exception classes: `livereg.Error` and one subclass per result code,
//! made at import from the core crate's `RESULT_CODES` (`<title>Error`, with
//! its `code`), so that a new code is one line there.

use livereg::RESULT_CODES;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;
use std::ffi::CString;

/// The classes by code; index 0 (`OK`) holds the base class `Error`.
static CLASSES: PyOnceLock<Vec<Py<PyType>>> = PyOnceLock::new();

/// The base class `Error` (in the place of `OK`).
pub const BASE: u32 = livereg::codes::LIVEREG_OK;

fn c_string(text: String) -> CString {
    CString::new(text).unwrap_or_default()
}

/// Makes the classes and adds them to the module.
pub fn add(module: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = module.py();
    let base = PyErr::new_type(
        py,
        c"livereg.Error",
        Some(c"A livereg failure: `code` is the C result, the message says why."),
        Some(&py.get_type::<PyException>()),
        None,
    )?;
    base.bind(py).setattr("code", -1)?;
    module.add("Error", base.bind(py))?;
    let mut classes = vec![base.clone_ref(py)];
    let builtins = py.import("builtins")?;
    for code in &RESULT_CODES[1..] {
        let name = format!("{}Error", code.title);
        let doc = format!("{} (LIVEREG_{}, {})", code.meaning, code.name, code.value);
        let builtin = (!code.builtin.is_empty()).then_some(code.builtin);
        let class: Py<PyType> = match builtin {
            // Also the builtin that fits, so `except TimeoutError` (or
            // `ValueError`, `FileNotFoundError`…) catches it.
            Some(builtin) => {
                let namespace = pyo3::types::PyDict::new(py);
                namespace.set_item("__doc__", &doc)?;
                namespace.set_item("__module__", "livereg")?;
                let bases = (base.bind(py), builtins.getattr(builtin)?);
                builtins
                    .getattr("type")?
                    .call1((name.as_str(), bases, namespace))?
                    .cast_into::<PyType>()?
                    .unbind()
            }
            None => PyErr::new_type(
                py,
                &c_string(format!("livereg.{name}")),
                Some(&c_string(doc)),
                Some(base.bind(py)),
                None,
            )?,
        };
        class.bind(py).setattr("code", code.value)?;
        for field in fields_of(code.value) {
            // Unknown until an exception says it.
            class.bind(py).setattr(*field, py.None())?;
        }
        module.add(name.as_str(), class.bind(py))?;
        classes.push(class);
    }
    let _ = CLASSES.set(py, classes);
    Ok(())
}

/// The fields an exception of result code `code` carries, as the library's
/// error does: a caller acts on them without reading the message.
fn fields_of(code: u32) -> &'static [&'static str] {
    use livereg::codes::*;
    match code {
        LIVEREG_EVICTED => &["reason"],
        LIVEREG_EXISTS => &["registered"],
        LIVEREG_FULL => &["capacity"],
        LIVEREG_BUSY => &["pending_drop"],
        _ => &[],
    }
}

fn class(py: Python<'_>, code: u32) -> Bound<'_, PyType> {
    let classes = CLASSES
        .get(py)
        .expect("the module made its exception classes");
    let index = usize::try_from(code).unwrap_or(0);
    classes.get(index).unwrap_or(&classes[0]).bind(py).clone()
}

/// The exception of result code `code` with `message`.
pub fn new(code: u32, message: String) -> PyErr {
    Python::attach(|py| PyErr::from_type(class(py, code), message))
}

/// Whether `error` is the exception of result code `code`.
pub fn is(py: Python<'_>, error: &PyErr, code: u32) -> bool {
    error.is_instance(py, class(py, code).as_any())
}

/// `result`, with an `EvictedError` taken as success (leaving a `with`
/// block of a registration that had already ended).
pub fn unless_evicted(py: Python<'_>, result: PyResult<()>) -> PyResult<()> {
    match result {
        Err(error) if is(py, &error, livereg::codes::LIVEREG_EVICTED) => Ok(()),
        other => other,
    }
}

/// The exception for a library error, with the library's message and its
/// fields (an `EvictedError`'s `reason`, an `ExistsError`'s `registered`
/// `(instance_id, pid)`, a `FullError`'s `capacity`, a `BusyError`'s
/// `pending_drop`), each `None` when the library does not know it.
pub fn raise(error: livereg::Error) -> PyErr {
    let raised = new(error.code(), error.to_string());
    Python::attach(|py| {
        let value = raised.value(py);
        let _ = match &error {
            livereg::Error::Evicted {
                reason: Some(reason),
                ..
            } => crate::event::reason_enum(py)
                .and_then(|e| e.call1((*reason as u8,)))
                .and_then(|reason| value.setattr("reason", reason)),
            livereg::Error::Exists {
                registered: Some(registered),
                ..
            } => value.setattr("registered", *registered),
            livereg::Error::Full {
                capacity: Some(capacity),
                ..
            } => value.setattr("capacity", *capacity),
            livereg::Error::Busy {
                pending_drop: Some(instance_id),
                ..
            } => value.setattr("pending_drop", *instance_id),
            _ => Ok(()),
        };
    });
    raised
}

/// Converts a library result.
pub trait OrRaise<T> {
    /// The value, or the matching exception.
    fn or_raise(self) -> PyResult<T>;
}

impl<T> OrRaise<T> for livereg::Result<T> {
    fn or_raise(self) -> PyResult<T> {
        self.map_err(raise)
    }
}
