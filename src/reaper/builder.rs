//! Setting a reaper up: its handlers, listeners and clock, then taking the
//! table's reaper role.

use super::lock_schedule::LockRounds;
use super::death_watch::DeathWatch;
use super::life::LifeHold;
use super::owned_removal::OwnedRemover;
use super::seen::Seen;
use super::role::{Dispatch, Reaper};
use crate::clock::Clock;
use crate::error::Result;
use crate::event::DropEvent;
use crate::reaper::exit_watch::ExitWatcher;
use crate::reaper::handlers::{
    ClearHandler, DropHandler, HandlerError, Handlers, Running, HANDLER_DEADLINE,
};
use crate::session::{RegionsBySlot, Sessions};
use crate::session::{Address, TlsServer};
use crate::session::{ListenConfig, DEFAULT_SOCKET_MODE};
use crate::sync::Ordering::{AcqRel, Acquire, Relaxed, Release};
use crate::table::handle::Table;
use crate::table::wake::WakeFd;
use std::time::Duration;

/// Configures a reaper: [`Table::reaper`] makes one.
///
/// # Examples
///
/// ```
/// use livereg::{Clock, Reason, Table, TableOptions};
/// use std::sync::mpsc;
/// use std::time::Duration;
///
/// let manual = Clock::manual(1_000_000_000);
/// let table = Table::in_memory(&TableOptions::default())?.with_clock(manual.clock());
/// let (sender, dropped) = mpsc::channel();
/// let mut reaper = table
///     .reaper()
///     .on_drop(move |event| Ok(sender.send((event.instance_id, event.reason))?))
///     .build()?;
/// let worker = table.register(5, "gpu5")?;
/// worker.heartbeat()?;
/// manual.advance(table.reap_timeout());
/// reaper.scan_once(manual.now_ns())?;
/// assert_eq!(dropped.try_recv().unwrap(), (5, Reason::Timeout));
/// assert!(worker.heartbeat().is_err());
/// # Ok::<(), livereg::Error>(())
/// ```
#[must_use = "a reaper builder does nothing until `build` or `spawn`"]
pub struct ReaperBuilder {
    table: Table,
    drop_handlers: Vec<DropHandler>,
    dying_handlers: Vec<DropHandler>,
    clear_handlers: Vec<ClearHandler>,
    handler_deadline: Duration,
    listens: Vec<ListenConfig>,
    socket_mode: u32,
    tls: Option<TlsServer>,
    progress_timeout: Option<Duration>,
}

impl Table {
    /// Starts configuring this table's reaper; it reads time from this
    /// handle's clock.
    pub fn reaper(&self) -> ReaperBuilder {
        ReaperBuilder {
            table: self.clone(),
            drop_handlers: Vec::new(),
            dying_handlers: Vec::new(),
            clear_handlers: Vec::new(),
            handler_deadline: HANDLER_DEADLINE,
            listens: Vec::new(),
            socket_mode: DEFAULT_SOCKET_MODE,
            tls: None,
            progress_timeout: None,
        }
    }
}

impl ReaperBuilder {
    /// Adds a drop-state handler, called once for every registration that
    /// ends. A handler that returns an error or panics is counted and logged
    /// in [`Status::handler_failures`](crate::status::report::Status); the others still run.
    ///
    /// On a reaper thread ([`ReaperBuilder::spawn`]) drops run on handler
    /// threads, several at once when a handler is slow: handlers are `Fn +
    /// Sync`.
    pub fn on_drop<F>(mut self, handler: F) -> Self
    where
        F: Fn(&DropEvent) -> Result<(), HandlerError> + Send + Sync + 'static,
    {
        self.drop_handlers.push(Box::new(handler));
        self
    }

    /// Adds a dying handler, called once for a registration whose process
    /// the kernel has begun to end (killed, crashed, exiting, `exec`ing): it
    /// runs no more of its own code, though until it has ended (its
    /// [`on_drop`](ReaperBuilder::on_drop), reason `ProcessExited`, after)
    /// a system call in flight or a device it drives may still write
    /// memory it shared. Within a millisecond of the kill whatever the
    /// process holds, where the table has death words and the registrant
    /// a death thread (see `docs/semantics.md`); never for a process that
    /// still runs. The event is the one its drop will carry.
    pub fn on_dying<F>(mut self, handler: F) -> Self
    where
        F: Fn(&DropEvent) -> Result<(), HandlerError> + Send + Sync + 'static,
    {
        self.dying_handlers.push(Box::new(handler));
        self
    }

    /// Adds a clear handler, called once per completed clear or reset (after
    /// the drop handlers of the registrations a reset ended): the server
    /// clears its stored cache here.
    pub fn on_clear<F>(mut self, handler: F) -> Self
    where
        F: Fn() -> Result<(), HandlerError> + Send + Sync + 'static,
    {
        self.clear_handlers.push(Box::new(handler));
        self
    }

    /// How long a handler may run before it is logged and counted in
    /// [`Status::handlers_overdue`](crate::status::report::Status) (default
    /// [`HANDLER_DEADLINE`], 30 s). It keeps running: its slot stays held
    /// until it returns.
    pub fn handler_deadline(mut self, deadline: Duration) -> Self {
        self.handler_deadline = deadline;
        self
    }

    /// Also serves sessions at `address` for the reaper's life: workers that
    /// cannot map the table ([`connect`](crate::connect)) register through
    /// it, and are reaped like any other. `token` is what clients must
    /// present (required on `tcp://`). Repeatable. A `unix:` socket is made
    /// mode 0660 unless [`socket_mode`](ReaperBuilder::socket_mode) says
    /// otherwise.
    pub fn listen(mut self, address: Address, token: Option<Vec<u8>>) -> Self {
        self.listens.push(ListenConfig::new(address, token));
        self
    }

    /// The certificate, key and (to require client certificates) client CA
    /// of this reaper's `tls://` listeners.
    pub fn tls(mut self, tls: TlsServer) -> Self {
        self.tls = Some(tls);
        self
    }

    /// The mode of the `unix:` sockets this reaper listens on (default
    /// 0660).
    pub fn socket_mode(mut self, mode: u32) -> Self {
        self.socket_mode = mode;
        self
    }

    /// Judges progress with `timeout` (zero: not at all) instead of the
    /// `progress_timeout` the table was created with: written into the
    /// table's header once this reaper holds the table, so every reader
    /// (`status`, the metrics) sees the value in force.
    pub fn progress_timeout(mut self, timeout: Duration) -> Self {
        self.progress_timeout = Some(timeout);
        self
    }

    /// Replaces the clock (by default the table handle's).
    pub fn clock(mut self, clock: Clock) -> Self {
        self.table = self.table.with_clock(clock);
        self
    }

    /// The table handle this builder was made from.
    pub(crate) fn table_handle(&self) -> Table {
        self.table.clone()
    }

    /// Takes the table's reaper role and returns a reaper that scans only when
    /// told ([`Reaper::scan_once`]).
    ///
    /// # Errors
    ///
    /// - [`Error::Busy`](crate::error::Error::Busy): another reaper holds the table
    ///   (in any process, or through another handle in this one).
    /// - [`Error::Io`](crate::error::Error::Io): the lock could not be taken.
    /// - [`Error::InvalidArgument`](crate::error::Error::InvalidArgument): a
    ///   [`progress_timeout`](ReaperBuilder::progress_timeout) below one scan
    ///   interval, or on a table whose reaping is off.
    pub fn build(self) -> Result<Reaper> {
        let inner = &self.table.memory;
        if let Some(timeout) = self.progress_timeout {
            check_progress_timeout(timeout, self.table.reap_timeout())?;
        }
        let role = inner.take_reaper_role()?;
        let header = inner.header();
        if let Some(timeout) = self.progress_timeout {
            header.progress_timeout_ns.store(
                u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX),
                Relaxed,
            );
        }
        let now = self.table.clock.now_ns();
        let previous = header.boot_token.load(Acquire);
        header
            .boot_token
            .store(next_boot_token(previous, now), Release);
        header.reaper_pid.store(std::process::id(), Relaxed);
        header
            .reaper_clock_id
            .store(self.table.clock.identity(), Relaxed);
        header.reaper_heartbeat_ns.store(now, Release);
        // Requests made to a reaper that died before serving them expire: a
        // requester was told `NoReaper`, and registrations made since must
        // not be ended by a stale request.
        header
            .clear_expired
            .fetch_max(header.clear_requested.load(Acquire), AcqRel);
        let resets_served = header.reset_requested.load(Acquire);
        inner.announce_settled();
        // Shared tables: watch registered processes through pidfds, so an
        // exit wakes the reaper at once and live watched processes need no
        // lock check per scan (without pidfd support, locks catch every exit).
        let watcher = match role.lock {
            Some(_) => ExitWatcher::start(inner.clone()).ok(),
            None => None,
        };
        // And through their death words, where the table has them, so a
        // process is seen as soon as it begins to die.
        let death_watch = DeathWatch::start(inner.clone());
        // And the files of processes that have ended, off the scan's path.
        let owned_remover = match role.lock {
            Some(_) => OwnedRemover::start(inner.clone()),
            None => None,
        };
        let wake = WakeFd::start(inner.clone()).map_err(|source| crate::error::Error::Io {
            context: format!(
                "table '{}': start the reaper's wake-up descriptor",
                inner.name
            ),
            source,
        })?;
        let (socket_mode, tls) = (self.socket_mode, self.tls);
        let configs = self
            .listens
            .into_iter()
            .map(|config| ListenConfig {
                socket_mode,
                tls: tls.clone(),
                ..config
            })
            .collect();
        let sessions = Sessions::start(&self.table, configs)?;
        // Last: once the reaper cannot fail to start, it says it serves.
        let life = LifeHold::start(inner);
        Ok(Reaper {
            sessions,
            seen: vec![Seen::NONE; inner.capacity as usize],
            timeout_ns: header.reap_timeout_ns.load(Relaxed),
            grace_ns: header.registration_grace_ns.load(Relaxed),
            progress_timeout_ns: header.progress_timeout_ns.load(Relaxed),
            clock_id: self.table.clock.identity(),
            in_flight: vec![0; inner.capacity as usize],
            regions: RegionsBySlot::default(),
            clear_issued: 0,
            resets_served,
            handlers: Dispatch::Inline(Handlers {
                memory: inner.clone(),
                drop_handlers: self.drop_handlers,
                dying_handlers: self.dying_handlers,
                clear_handlers: self.clear_handlers,
                running: Running::new(self.handler_deadline),
            }),
            table: self.table,
            role,
            _life: life,
            watcher,
            _death_watch: death_watch,
            owned_remover,
            death_words_whole: false,
            wake,
            last_scan_ns: None,
            locks: LockRounds::default(),
        })
    }
}

/// A progress timeout is zero (off) or at least one scan of a table that
/// reaps.
fn check_progress_timeout(timeout: Duration, reap_timeout: Duration) -> Result<()> {
    let scan = reap_timeout / crate::table::layout::SCANS_PER_TIMEOUT;
    if timeout.is_zero() || (!reap_timeout.is_zero() && timeout >= scan) {
        return Ok(());
    }
    Err(crate::error::Error::InvalidArgument(format!(
        "progress timeout {timeout:?} is below one scan interval ({scan:?}) or reaping is off, expected 0 (off) \
         or at least {scan:?}"
    )))
}

/// A boot token different from `previous` and from zero.
fn next_boot_token(previous: u64, now_ns: u64) -> u64 {
    // splitmix64 finaliser over time, pid and the previous token.
    let mut x = previous ^ now_ns ^ (u64::from(std::process::id()) << 32);
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^= x >> 31;
    if x == previous || x == 0 {
        previous.wrapping_add(1).max(1)
    } else {
        x
    }
}
