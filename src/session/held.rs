//! What a reaper shares with its listeners: which session registrations a
//! live connection holds (the others are waiting for their client to come
//! back, and time out `Disconnected`), and the records beside the table.

use crate::records::Records;
use crate::table::Table;
use std::collections::HashSet;
use std::sync::{Mutex, MutexGuard, OnceLock};

/// Shared by a reaper and its listeners.
#[derive(Default)]
pub(crate) struct Held {
    /// `(slot, generation)` of every registration a connection holds.
    holding: Mutex<HashSet<(u32, u32)>>,
    records: OnceLock<Records>,
}

impl Held {
    /// Whether a connection of this reaper holds registration `(index,
    /// generation)`.
    pub(crate) fn holds(&self, index: u32, generation: u32) -> bool {
        self.lock().contains(&(index, generation))
    }

    /// Marks `(index, generation)` held; false if it already was.
    pub(crate) fn hold(&self, index: u32, generation: u32) -> bool {
        self.lock().insert((index, generation))
    }

    pub(crate) fn let_go(&self, index: u32, generation: u32) {
        self.lock().remove(&(index, generation));
    }

    /// How many registrations connections hold.
    pub(crate) fn count(&self) -> usize {
        self.lock().len()
    }

    /// The table's session records, opened on first use.
    ///
    /// # Errors
    ///
    /// The file beside the table could not be opened or made.
    pub(crate) fn records(&self, table: &Table) -> std::io::Result<&Records> {
        if let Some(records) = self.records.get() {
            return Ok(records);
        }
        let opened = Records::open(table)?;
        Ok(self.records.get_or_init(|| opened))
    }

    fn lock(&self) -> MutexGuard<'_, HashSet<(u32, u32)>> {
        self.holding
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
