//! What a worker is by nature: a slot of a table this process maps
//! ([`Local`]), or a registration in a reaper's table reached through its
//! listener (the session's client side implements [`Nature`] for its link).
//! The handle asks its nature; it never asks which nature it has.

use crate::error::Result;
use crate::table::handle::Table;
use crate::table::reaper_life::ReaperState;
use std::time::Duration;

/// How a worker's registration answers what depends on where it lives.
pub(crate) trait Nature: Send + Sync {
    /// The registration's slot (in the reaper's table, for a session).
    fn slot(&self) -> u32;
    /// That slot's generation.
    fn generation(&self) -> u32;
    /// The table the registration is in, if this process maps it.
    fn table(&self) -> Option<&Table>;
    /// The reap timeout of the table the registration is in.
    fn reap_timeout(&self) -> Duration;
    /// The server's info area.
    fn info(&self) -> Result<Vec<u8>>;
    /// Asks the reaper for a clear (`reset`: a reset) and waits for it.
    fn request_clear(&self, reset: bool, wait: Duration) -> Result<()>;
    /// The reaper's state, as this registration can know it.
    fn reaper_state(&self) -> ReaperState;
    /// Waits up to `wait` for the reaper's state to differ from `known`.
    fn wait_reaper_state(&self, known: ReaperState, wait: Duration) -> ReaperState;
    /// The worker deregistered (its slot says so): anything to say
    /// goodbye, within a bounded wait.
    fn finish(&mut self);
}

/// A registration in a table this process maps.
pub(crate) struct Local {
    pub(crate) table: Table,
    pub(crate) index: u32,
    pub(crate) generation: u32,
}

impl Nature for Local {
    fn slot(&self) -> u32 {
        self.index
    }

    fn generation(&self) -> u32 {
        self.generation
    }

    fn table(&self) -> Option<&Table> {
        Some(&self.table)
    }

    fn reap_timeout(&self) -> Duration {
        self.table.reap_timeout()
    }

    fn info(&self) -> Result<Vec<u8>> {
        self.table.info()
    }

    fn request_clear(&self, reset: bool, wait: Duration) -> Result<()> {
        match reset {
            true => self.table.reset(wait),
            false => self.table.clear(wait),
        }
    }

    fn reaper_state(&self) -> ReaperState {
        self.table.reaper_state()
    }

    fn wait_reaper_state(&self, known: ReaperState, wait: Duration) -> ReaperState {
        self.table.wait_reaper_state(known, wait)
    }

    fn finish(&mut self) {}
}
