//! For unit tests: a shared table with a name no other test uses, removed
//! on drop.

use crate::table::Table;

/// A shared table's name, unlinked (with the files beside it) on drop.
pub(crate) struct Named(pub String);

impl Named {
    /// `livereg-unit-{tag}-{pid}`.
    pub(crate) fn new(tag: &str) -> Named {
        Named(format!("livereg-unit-{tag}-{}", std::process::id()))
    }
}

impl Drop for Named {
    fn drop(&mut self) {
        let _ = Table::unlink(&self.0);
    }
}
