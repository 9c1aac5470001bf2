//! Whether this thread runs the handlers of a table's reaper: a call that
//! would wait for that reaper (a clear, a registration waiting for a drop,
//! stopping it) is refused there, since the reaper waits for the handler.

use crate::error::Result;
use crate::table::memory::TableMemory;
use std::cell::RefCell;
use std::sync::Arc;

thread_local! {
    /// The table whose reaper's handlers this thread is running, if any.
    static INSIDE_HANDLERS: RefCell<Option<Arc<TableMemory>>> = const { RefCell::new(None) };
}

/// Marks this thread as running the handlers of a table's reaper, until dropped.
pub(crate) struct InsideHandlers;

impl InsideHandlers {
    pub(crate) fn enter(inner: &Arc<TableMemory>) -> InsideHandlers {
        INSIDE_HANDLERS.with(|inside| *inside.borrow_mut() = Some(inner.clone()));
        InsideHandlers
    }
}

impl Drop for InsideHandlers {
    fn drop(&mut self) {
        INSIDE_HANDLERS.with(|inside| *inside.borrow_mut() = None);
    }
}

/// Refuses `what` when called from a handler of this table's reaper: it
/// would wait for the reaper, which waits for the handler.
///
/// # Errors
///
/// [`Error::Busy`](crate::error::Error::Busy) naming the call, inside a handler.
pub(crate) fn refuse_inside_handler(inner: &Arc<TableMemory>, what: &str) -> Result<()> {
    let inside = INSIDE_HANDLERS.with(|inside| {
        inside.borrow().as_ref().is_some_and(|running| {
            Arc::ptr_eq(running, inner)
                || (running.file().is_some()
                    && inner.file().is_some()
                    && running.name == inner.name)
        })
    });
    if inside {
        Err(crate::error::Error::busy(format!(
            "table '{}': cannot {what} from inside a handler of its reaper: the reaper waits for the handler to return",
            inner.name
        )))
    } else {
        Ok(())
    }
}
