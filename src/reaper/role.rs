//! The reaper role held: [`Reaper`], a reaper the caller drives (its
//! scans, its handlers, its listeners), with what it remembers of each slot
//! and how it dispatches drops.

use super::lock_schedule::LockRounds;
use super::death_watch::DeathWatch;
use super::life::LifeHold;
use super::owned_removal::OwnedRemover;
use super::seen::Seen;
use crate::error::Result;
use crate::event::DropEvent;
use crate::reaper::exit_watch::ExitWatcher;
use crate::reaper::handlers::{HandlerPool, Handlers};
use crate::session::Address;
use crate::session::ListenConfig;
use crate::session::{RegionsBySlot, Sessions};
use crate::sync::Ordering::Acquire;
use crate::table::handle::Table;
use crate::table::layout::SCANS_PER_TIMEOUT;
use crate::table::locks::ReaperRole;
use crate::table::wake::WakeFd;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

/// The outcome of one scan.
#[derive(Debug, Default)]
pub struct ScanReport {
    /// The registrations that ended, as their handlers saw them.
    pub ended: Vec<DropEvent>,
    /// The registrations found dying (their process began to exit), as
    /// their dying handlers saw them.
    pub dying: Vec<DropEvent>,
    /// Handlers that failed or panicked in this scan (when the handlers run
    /// on the scanning thread; a reaper thread's are counted in
    /// [`Status::handler_failures`](crate::status::report::Status) as they finish).
    pub handler_failures: u32,
    /// Slots whose contents no writer of ours produces, skipped.
    pub corrupt_slots: u32,
    /// Whether this scan carried out a clear (its clear handlers ran or are
    /// queued).
    pub cleared: bool,
    /// Whether the clear was a reset: this scan ended every registration.
    pub reset: bool,
    /// The files removed since the previous scan: owned by processes that
    /// have ended ([`Table::own_file`](crate::Table::own_file)). They are
    /// removed on a thread of the reaper's, which each scan asks for a
    /// round without waiting for it: a file is reported by the scan after
    /// the round that removed it.
    pub removed_files: Vec<std::path::PathBuf>,
}

/// Where the handlers run.
pub(super) enum Dispatch {
    /// On the scanning thread, before the scan returns.
    Inline(Handlers),
    /// On handler threads; the scan only queues the drops.
    Pool(HandlerPool),
}

/// The one reaper of a table: holds the reaper role until dropped.
pub struct Reaper {
    /// Its sessions: the listeners (first, so they stop before the role
    /// is given back) and what the reaper asks about remote registrations.
    pub(crate) sessions: Arc<Sessions>,
    pub(super) table: Table,
    pub(super) role: ReaperRole,
    /// The reaper's life word held: dropped after the role is released,
    /// so that waiters woken by its giving back read `Absent`.
    pub(super) _life: Option<LifeHold>,
    pub(super) handlers: Dispatch,
    /// Per slot, `generation + 1` of an ended registration whose drop is
    /// queued on the handler thread (0: none): not to be queued again.
    pub(super) in_flight: Vec<u32>,
    /// The regions of its sessions' clients, by slot (made again when
    /// they change).
    pub(super) regions: RegionsBySlot,
    /// The last clear ticket queued on the handler thread.
    pub(super) clear_issued: u64,
    /// The table's `reset_requested` count this reaper has carried out (or
    /// found expired when it started).
    pub(super) resets_served: u64,
    pub(super) seen: Vec<Seen>,
    pub(super) timeout_ns: u64,
    pub(super) grace_ns: u64,
    /// How long a busy registration may make no progress (0: not judged).
    pub(super) progress_timeout_ns: u64,
    /// The identity of the clock this reaper reads: only stamps of that
    /// clock are trusted.
    pub(super) clock_id: u64,
    /// Watches registered processes through pidfds (shared tables).
    pub(super) watcher: Option<ExitWatcher>,
    /// Waits on the registering processes' death words (shared tables that
    /// have them).
    pub(super) _death_watch: Option<DeathWatch>,
    /// Removes the files of processes that have ended (shared tables with
    /// owned-file records).
    pub(super) owned_remover: Option<OwnedRemover>,
    /// Whether this scan may read the death words (present and whole,
    /// checked as the scan begins).
    pub(super) death_words_whole: bool,
    /// Readable when a scan is due early.
    pub(super) wake: WakeFd,
    /// When the last scan ran, on the table clock.
    pub(super) last_scan_ns: Option<u64>,
    /// When this reaper tests the locks of registrations no pidfd watches.
    pub(super) locks: LockRounds,
}

impl Reaper {
    /// The table this reaper holds.
    pub fn table(&self) -> &Table {
        &self.table
    }

    /// How long until the next periodic scan is due (zero before the first,
    /// never more than a scan interval). With [`AsFd`], the whole of driving
    /// a reaper from an event loop: wait until the descriptor is readable or
    /// this much time has passed, then [`scan`](Reaper::scan).
    pub fn next_scan_in(&self) -> Duration {
        let interval = self.timeout_ns / u64::from(SCANS_PER_TIMEOUT);
        let left = match self.last_scan_ns {
            Some(last) => (last.saturating_add(interval)).saturating_sub(self.table.clock.now_ns()),
            None => 0,
        };
        Duration::from_nanos(left.min(interval))
    }

    /// Also serves sessions at `address` from now on, for the reaper's life
    /// (see [`ReaperBuilder::listen`](super::ReaperBuilder::listen)).
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidArgument`](crate::error::Error::InvalidArgument): a
    ///   `tcp://` address without a token.
    /// - [`Error::Busy`](crate::error::Error::Busy): another listener serves
    ///   that Unix socket.
    /// - [`Error::Io`](crate::error::Error::Io): binding failed.
    pub fn listen(&self, address: Address, token: Option<Vec<u8>>) -> Result<()> {
        self.sessions.listen(ListenConfig::new(address, token))
    }

    /// The sessions its listeners refused, by result code (counted as they
    /// refuse; the handle stays valid after the reaper stops): for
    /// [`Table::metrics_text_with`].
    pub fn session_refusals(&self) -> crate::session::SessionRefusals {
        self.sessions.refusals()
    }

    /// The boot token this reaper wrote when it took the table.
    pub fn boot_token(&self) -> u64 {
        self.table.memory.header().boot_token.load(Acquire)
    }

    /// Moves the handlers to handler threads: scans then only queue drops,
    /// and a slow handler delays only its own registration's slot.
    pub(crate) fn with_handler_threads(mut self) -> Reaper {
        if let Dispatch::Inline(handlers) = self.handlers {
            self.handlers = Dispatch::Pool(HandlerPool::new(handlers));
        }
        self
    }
}

/// The wake descriptor: readable when a scan is due before
/// [`Reaper::next_scan_in`] (a watched process exited, a registration ended
/// or was made, a clear was requested). A scan consumes it.
///
/// # Examples
///
/// ```
/// use livereg::{Table, TableOptions};
/// use std::os::fd::AsRawFd;
///
/// let table = Table::in_memory(&TableOptions::default())?;
/// let mut reaper = table.reaper().build()?;
/// table.register(1, "gpu1")?.deregister()?;
/// let mut ready = libc::pollfd { fd: reaper.as_raw_fd(), events: libc::POLLIN, revents: 0 };
/// let timeout = reaper.next_scan_in().as_millis() as i32;
/// // SAFETY: one valid pollfd.
/// unsafe { libc::poll(&mut ready, 1, 1_000.max(timeout)) };
/// assert_eq!(reaper.scan()?.ended.len(), 1);
/// # Ok::<(), livereg::Error>(())
/// ```
impl AsFd for Reaper {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.wake.as_fd()
    }
}

impl AsRawFd for Reaper {
    fn as_raw_fd(&self) -> RawFd {
        self.wake.as_raw_fd()
    }
}
