//! The reaper in a background thread: a scan every `timeout / 4`, and at once
//! when a deregistration, a replacement or a clear request wakes it.

use super::builder::ReaperBuilder;
use super::role::Reaper;
use crate::error::Result;
use crate::os::fork;
use crate::session::Address;
use crate::session::ListenConfig;
use crate::session::Sessions;
use crate::table::handle::Table;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// A reaper running in its own thread; stops (and gives up the table) when
/// stopped or dropped.
///
/// # Examples
///
/// ```
/// use livereg::{Table, TableOptions};
/// use std::time::Duration;
///
/// let table = Table::in_memory(&TableOptions::default())?;
/// let reaper = table.reaper().on_drop(|event| {
///     println!("free what instance {} held ({})", event.instance_id, event.reason);
///     Ok(())
/// }).spawn()?;
/// assert!(table.probe().is_ok());
/// table.register(1, "gpu1")?.deregister()?;
/// table.clear(Duration::from_secs(5))?;
/// reaper.stop()?;
/// assert!(table.probe().is_err());
/// # Ok::<(), livereg::Error>(())
/// ```
pub struct ReaperThread {
    /// Its sessions (listeners stopped first).
    sessions: Arc<Sessions>,
    table: Table,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<()>>>,
    /// The fork epoch the thread was started in.
    fork_epoch: u64,
}

impl ReaperBuilder {
    /// Takes the reaper role and starts scanning in a background thread named
    /// `livereg-reaper`. With a zero reap timeout reaping is disabled: no
    /// thread starts, no role is taken, and the handle reports
    /// [`ReaperThread::is_running`] false.
    ///
    /// # Errors
    ///
    /// As [`ReaperBuilder::build`], or [`Error::Io`](crate::error::Error::Io) if the
    /// thread cannot be spawned.
    pub fn spawn(self) -> Result<ReaperThread> {
        let table = self.table_handle();
        let stop = Arc::new(AtomicBool::new(false));
        if table.reap_timeout().is_zero() {
            return Ok(ReaperThread {
                sessions: Sessions::start(&table, Vec::new())?,
                table,
                stop,
                thread: None,
                fork_epoch: fork::install(),
            });
        }
        let mut reaper = self.build()?.with_handler_threads();
        let sessions = reaper.sessions.clone();
        let stopping = stop.clone();
        let thread = std::thread::Builder::new()
            .name("livereg-reaper".into())
            .spawn(move || run(&mut reaper, &stopping))
            .map_err(|source| crate::error::Error::Io {
                context: format!("table '{}': spawn the reaper thread", table.name()),
                source,
            })?;
        Ok(ReaperThread {
            sessions,
            table,
            stop,
            thread: Some(thread),
            fork_epoch: fork::install(),
        })
    }
}

/// Scans until stopped: whenever a scan is due, and at once when the table's
/// wake word changes (every wake-up bumps it: registrations, deregistrations,
/// clears, exits the watcher saw). Waiting on the futex directly spares the
/// thread the wake descriptor's extra hop. Ends early only if the table
/// cannot be scanned (truncated under it), with that error.
fn run(reaper: &mut Reaper, stop: &AtomicBool) -> Result<()> {
    let table = reaper.table().clone();
    while !stop.load(Ordering::Acquire) {
        let seen = table.memory.wake_word()?;
        reaper.scan()?;
        table
            .memory
            .sleep_until_woken(seen, || reaper.next_scan_in(), stop)?;
    }
    Ok(())
}

impl ReaperThread {
    /// Also serves sessions at `address` from now on, for the reaper's life
    /// (see [`ReaperBuilder::listen`]).
    ///
    /// # Errors
    ///
    /// As [`Reaper::listen`].
    pub fn listen(&self, address: Address, token: Option<Vec<u8>>) -> Result<()> {
        self.sessions.listen(ListenConfig::new(address, token))
    }

    /// The sessions its listeners refused, by result code (see
    /// [`Reaper::session_refusals`]).
    pub fn session_refusals(&self) -> crate::session::SessionRefusals {
        self.sessions.refusals()
    }

    /// Whether a scanning thread runs (false when reaping is disabled).
    pub fn is_running(&self) -> bool {
        self.thread.is_some()
    }

    /// Whether the scanning thread is still at work. It stops on its own
    /// only when the table cannot be scanned any more (truncated under it);
    /// a daemon checks this so that it cannot sleep on while nobody reaps.
    ///
    /// # Errors
    ///
    /// Once the thread has ended without being stopped (its role is then
    /// given back): the error that ended it ([`Error::Corrupt`](crate::error::Error::Corrupt)),
    /// or [`Error::Panic`](crate::error::Error::Panic) naming a panic.
    pub fn check(&mut self) -> Result<()> {
        match &self.thread {
            Some(thread) if thread.is_finished() => {}
            _ => return Ok(()),
        }
        let ended = |why: String| {
            crate::error::Error::Panic(format!(
                "table '{}': the reaper thread ended: {why}",
                self.table.name()
            ))
        };
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(Err(error))) => Err(error),
            Some(Err(panic)) => Err(ended(crate::reaper::handlers::panic_message(&*panic))),
            _ => Err(ended("it returned".to_owned())),
        }
    }

    /// The table this reaper holds.
    pub fn table(&self) -> &Table {
        &self.table
    }

    /// Stops the thread after its current scan, lets the drops it started
    /// finish, and gives up the table.
    ///
    /// # Errors
    ///
    /// [`Error::Busy`](crate::error::Error::Busy) when called from one of this
    /// reaper's own handlers, which the stop would wait for: the reaper is
    /// told to stop, and does once the handler has returned.
    pub fn stop(mut self) -> Result<()> {
        let inside =
            crate::table::inside_handlers::refuse_inside_handler(&self.table.memory, "stop the reaper");
        self.halt();
        inside
    }

    fn halt(&mut self) {
        // Listeners first: their clients reconnect to the next reaper.
        self.sessions.stop();
        if self.fork_epoch != fork::epoch() {
            // A forked child's copy: the scanning thread is the parent's and
            // does not exist here; waking or joining it would disturb the
            // parent's reaper (or wait forever).
            std::mem::forget(self.thread.take());
            return;
        }
        if crate::table::inside_handlers::refuse_inside_handler(&self.table.memory, "stop the reaper")
            .is_err()
        {
            // Called from one of its handlers: joining would wait for the
            // caller itself. Ask it to stop, and let it go.
            self.stop.store(true, Ordering::Release);
            self.table.memory.wake_reaper();
            self.thread = None;
            return;
        }
        if let Some(thread) = self.thread.take() {
            self.stop.store(true, Ordering::Release);
            self.table.memory.wake_reaper();
            let _ = thread.join();
        }
    }
}

impl Drop for ReaperThread {
    fn drop(&mut self) {
        self.halt();
    }
}
