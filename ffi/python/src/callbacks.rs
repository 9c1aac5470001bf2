//! Python callables as the library's drop and clear handlers: each call
//! attaches to the interpreter only while it runs; an exception is logged on
//! `logging.getLogger("livereg")` and reported to the library as a handler
//! failure (counted in the table's `handler_failures`), never raised into the
//! reaper.

use crate::event::DropEvent;
use crate::exiting;
use crate::logging;
use livereg::{HandlerError, ReaperBuilder};
use pyo3::prelude::*;

/// Adds the callbacks that are given to `builder`.
pub fn attach(
    mut builder: ReaperBuilder,
    on_drop: Option<Py<PyAny>>,
    on_clear: Option<Py<PyAny>>,
    on_dying: Option<Py<PyAny>>,
) -> ReaperBuilder {
    if let Some(callback) = on_dying {
        builder = builder.on_dying(move |event| {
            let what = format!("on_dying for instance {}", event.instance_id);
            call(&what, |py| callback.call1(py, (DropEvent::dying(event),)))
        });
    }
    if let Some(callback) = on_drop {
        builder = builder.on_drop(move |event| {
            let what = format!(
                "on_drop for instance {} ({})",
                event.instance_id, event.reason
            );
            call(&what, |py| callback.call1(py, (DropEvent::from(event),)))
        });
    }
    if let Some(callback) = on_clear {
        builder = builder.on_clear(move || call("on_clear", |py| callback.call0(py)));
    }
    builder
}

fn call(
    what: &str,
    callback: impl FnOnce(Python<'_>) -> PyResult<Py<PyAny>>,
) -> Result<(), HandlerError> {
    if exiting::started() {
        return Err(format!("{what} was not called: the interpreter is exiting").into());
    }
    Python::attach(|py| match callback(py) {
        Ok(_) => Ok(()),
        Err(error) => {
            logging::exception(py, &format!("{what} raised"), &error);
            Err(format!("{what} raised {error}").into())
        }
    })
}
