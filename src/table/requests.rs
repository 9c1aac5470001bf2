//! What any process asks of a table's reaper, without RPC: whether one is
//! alive (and whether it stopped scanning), its boot token, and a clear or
//! a reset waited for with a deadline.
//!
//! A clear is a ticket: the requester adds one to `clear_requested` and
//! waits until the reaper's `clear_completed` reaches it. Requests made
//! while one is pending share the reaper's next pass. A reset is a clear
//! that also ends every registration: its requester adds one to
//! `reset_requested` *before* taking its ticket, so a reaper that sees the
//! ticket sees the reset too.

use crate::clock::{duration_ns, Clock};
use crate::error::{Error, Result};
use crate::sync::Ordering::{AcqRel, Acquire, Relaxed};
use crate::table::handle::Table;
use std::time::Duration;

/// What a requester asks the reaper to do.
#[derive(Clone, Copy)]
enum Request {
    /// Run the clear handlers; registrations are untouched.
    Clear,
    /// End every registration (`Cleared`), then run the clear handlers.
    Reset,
}

impl Request {
    fn verb(self) -> &'static str {
        match self {
            Request::Clear => "clear",
            Request::Reset => "reset",
        }
    }
}

impl Table {
    /// Whether a reaper holds the table: decided by the kernel's reaper lock,
    /// which its holder keeps while it lives (however long its handlers run)
    /// and the kernel drops when it dies. Never by comparing clocks.
    pub fn reaper_alive(&self) -> bool {
        self.memory.reaper_role_taken()
    }

    /// Whether a live reaper has not scanned for two scan intervals: stuck
    /// in a handler, or stopped. A diagnostic only (it compares the reaper's
    /// clock with this handle's), false where the two clocks differ.
    pub fn reaper_stalled(&self) -> bool {
        let header = self.memory.header();
        let clock_id = self.clock.identity();
        if clock_id == Clock::UNKNOWN
            || header.reaper_clock_id.load(Relaxed) != clock_id
            || !self.reaper_alive()
        {
            return false;
        }
        let age = self
            .clock
            .now_ns()
            .saturating_sub(header.reaper_heartbeat_ns.load(Acquire));
        age > duration_ns(self.scan_interval() * 2)
    }

    /// The boot token of the live reaper: it changes whenever a reaper
    /// (re)starts, so a worker that sees a new one knows the server restarted
    /// and may register again. The shared-memory form of a "ping".
    ///
    /// # Errors
    ///
    /// [`Error::NoReaper`] when no reaper is alive.
    pub fn probe(&self) -> Result<u64> {
        if self.reaper_alive() {
            Ok(self.memory.header().boot_token.load(Acquire))
        } else {
            Err(self.memory.no_reaper())
        }
    }

    /// Asks the reaper to run its clear handlers once (the server clears
    /// its stored cache) and waits up to `wait` for them to return.
    /// Registrations are untouched: workers keep their state and keep
    /// beating. Requests made while one is pending share it; a clear is
    /// serialised with scans.
    ///
    /// # Errors
    ///
    /// - [`Error::NoReaper`]: no reaper is alive (then nothing is
    ///   requested), or it died before carrying the clear out (the request
    ///   then expires: a later reaper does not act on it).
    /// - [`Error::Timeout`]: the clear did not complete within `wait`.
    /// - [`Error::Busy`]: called from a handler of this table's reaper, which
    ///   cannot scan while it waits.
    ///
    /// # Examples
    ///
    /// ```
    /// use livereg::{Table, TableOptions};
    /// use std::sync::atomic::{AtomicU32, Ordering};
    /// use std::sync::Arc;
    /// use std::time::Duration;
    ///
    /// let table = Table::in_memory(&TableOptions::default())?;
    /// let clears = Arc::new(AtomicU32::new(0));
    /// let counted = clears.clone();
    /// let reaper = table
    ///     .reaper()
    ///     .on_clear(move || {
    ///         counted.fetch_add(1, Ordering::SeqCst);
    ///         Ok(())
    ///     })
    ///     .spawn()?;
    /// let worker = table.register(7, "gpu0")?;
    /// table.clear(Duration::from_secs(5))?;
    /// assert_eq!(clears.load(Ordering::SeqCst), 1);
    /// worker.heartbeat()?; // still registered
    /// reaper.stop()?;
    /// # Ok::<(), livereg::Error>(())
    /// ```
    pub fn clear(&self, wait: Duration) -> Result<()> {
        self.request(Request::Clear, wait)
    }

    /// A clear that also ends every current registration, reason
    /// [`Cleared`](crate::Reason::Cleared): their drop handlers run, then
    /// the clear handlers, before this returns; each worker hears
    /// [`Evicted`](crate::Error::Evicted) at its next heartbeat and
    /// registers again. For a server that lost its per-worker state.
    ///
    /// # Errors
    ///
    /// As [`Table::clear`].
    pub fn reset(&self, wait: Duration) -> Result<()> {
        self.request(Request::Reset, wait)
    }

    fn request(&self, request: Request, wait: Duration) -> Result<()> {
        crate::table::inside_handlers::refuse_inside_handler(
            &self.memory,
            &format!("{} the table", request.verb()),
        )?;
        let ticket = self.submit(request)?;
        let mut outcome = None;
        self.memory.wait_settled(wait, || {
            outcome = ticket.outcome(self);
            outcome.is_some()
        });
        outcome.unwrap_or_else(|| Err(ticket.timed_out(self, wait)))
    }

    /// Asks the reaper for a clear (or, with `reset`, a reset) without
    /// waiting: what a listener does for a session's request, polling the
    /// ticket's [`outcome`](Ticket::outcome) on its own loop.
    ///
    /// # Errors
    ///
    /// [`Error::NoReaper`] when no reaper is alive (nothing is requested).
    pub(crate) fn request_clear(&self, reset: bool) -> Result<Ticket> {
        self.submit(if reset {
            Request::Reset
        } else {
            Request::Clear
        })
    }

    fn submit(&self, request: Request) -> Result<Ticket> {
        if !self.reaper_alive() {
            return Err(self.memory.no_reaper());
        }
        let header = self.memory.header();
        if let Request::Reset = request {
            header.reset_requested.fetch_add(1, AcqRel);
        }
        let number = header.clear_requested.fetch_add(1, AcqRel) + 1;
        self.memory.wake_reaper();
        Ok(Ticket { request, number })
    }
}

/// A clear or reset asked for and not yet known to be carried out.
#[derive(Clone, Copy)]
pub(crate) struct Ticket {
    request: Request,
    /// Done once the reaper's `clear_completed` reaches it.
    number: u64,
}

impl Ticket {
    /// `Ok` once the reaper carried the request out, `Err(NoReaper)` if it
    /// died first, `None` while it is pending.
    pub(crate) fn outcome(&self, table: &Table) -> Option<Result<()>> {
        let header = table.memory.header();
        if header.clear_completed.load(Acquire) >= self.number {
            Some(Ok(()))
        } else if header.clear_expired.load(Acquire) >= self.number || !table.reaper_alive() {
            Some(Err(Error::NoReaper(format!(
                "table '{}': the reaper died before completing the {}; the request expired",
                table.memory.name,
                self.request.verb()
            ))))
        } else {
            None
        }
    }

    /// The error of a request not carried out within `wait`.
    pub(crate) fn timed_out(&self, table: &Table, wait: Duration) -> Error {
        Error::Timeout(format!(
            "table '{}': the {} was not completed within {wait:?} (reaper pid {})",
            table.memory.name,
            self.request.verb(),
            table.memory.header().reaper_pid.load(Relaxed)
        ))
    }
}
