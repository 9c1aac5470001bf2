//! What a reaper shares with its listeners: which session registrations a
//! live connection holds, and when each client was last heard (the others
//! are waiting for their client to come back, and time out
//! `Disconnected`), and the records beside the table.

use crate::records::Records;
use crate::table::Table;
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, OnceLock};

/// Shared by a reaper and its listeners.
#[derive(Default)]
pub(crate) struct Held {
    /// `(slot, generation)` of every registration a connection holds, with
    /// when its client was last heard (a frame), on the table's clock.
    holding: Mutex<HashMap<(u32, u32), u64>>,
    records: OnceLock<Records>,
}

impl Held {
    /// When the client of registration `(index, generation)` was last
    /// heard, if a connection of this reaper holds it.
    pub(crate) fn heard(&self, index: u32, generation: u32) -> Option<u64> {
        self.lock().get(&(index, generation)).copied()
    }

    /// Marks `(index, generation)` held, its client heard at `now_ns`;
    /// false if it already was held.
    pub(crate) fn hold(&self, index: u32, generation: u32, now_ns: u64) -> bool {
        use std::collections::hash_map::Entry;
        match self.lock().entry((index, generation)) {
            Entry::Occupied(_) => false,
            Entry::Vacant(entry) => {
                entry.insert(now_ns);
                true
            }
        }
    }

    /// The client of held registration `(index, generation)` was heard at
    /// `now_ns`.
    pub(crate) fn hear(&self, index: u32, generation: u32, now_ns: u64) {
        if let Some(heard) = self.lock().get_mut(&(index, generation)) {
            *heard = now_ns;
        }
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

    fn lock(&self) -> MutexGuard<'_, HashMap<(u32, u32), u64>> {
        self.holding
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
