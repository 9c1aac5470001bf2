//! A reaper's listener: one thread that accepts sessions on one address and
//! serves every connection through one epoll set (no thread per session).

use super::acceptor::Acceptor;
use super::held::Held;
use super::refusals::SessionRefusals;
use super::served::{Connection, Gate, Next};
use crate::error::{Error, Result};
use crate::event::Reason;
use crate::os::epoll::{Epoll, WAIT_MAX};
use crate::os::eventfd;
use crate::absence::absence_threshold;
use crate::session::address::Address;
use crate::session::server::limited_log::limited_log;
use crate::session::timing::{heard_interval, listener_tick, quiet_listener_tick};
use crate::session::tls::{self, TlsServer};
use crate::sync::Ordering::Acquire;
use crate::table::handle::Table;
use crate::table::protocol;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a connection may take to say `Hello`.
pub const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(2);

/// The default mode of a `unix:` listener's socket: its owner and group may
/// connect.
pub const DEFAULT_SOCKET_MODE: u32 = 0o660;

/// After a round of nothing but beats, the listener waits this long before
/// the next: with many sessions, beats arrive one by one (each client's
/// sender keeps its own time), and waking once per beat would cost the
/// thread a context switch each; gathered, one wake-up serves the beats of a
/// millisecond. A round with a connection, a greeting or a close does not
/// wait, and a new connection ends the wait (a hello is never held back by
/// others' beats); a close that comes during the wait is seen at most this
/// much later.
const GATHER: Duration = Duration::from_millis(5);

/// While a client waits for a clear, how often the listener looks whether
/// the reaper carried it out.
const CLEAR_POLL: Duration = Duration::from_millis(2);

/// How a listener is set up.
#[derive(Clone, Debug)]
pub(crate) struct ListenConfig {
    pub address: Address,
    /// What clients must present (required on `tcp://`).
    pub token: Option<Vec<u8>>,
    /// The mode of a `unix:` socket.
    pub socket_mode: u32,
    /// The certificate (and client CA) of a `tls://` listener.
    pub tls: Option<TlsServer>,
}

impl ListenConfig {
    /// A listener at `address` taking `token`, its socket of the default
    /// mode, no TLS.
    pub(crate) fn new(address: Address, token: Option<Vec<u8>>) -> ListenConfig {
        ListenConfig {
            address,
            token,
            socket_mode: DEFAULT_SOCKET_MODE,
            tls: None,
        }
    }
}

/// A running listener; stopped (its connections closed, their
/// registrations left for the clients to reclaim) when dropped.
pub(crate) struct Listener {
    address: Address,
    /// The fork epoch it was started in: a forked child's copy must not
    /// stop the parent's thread (the stop descriptor is shared) or remove
    /// its socket.
    fork_epoch: u64,
    stop: Arc<OwnedFd>,
    thread: Option<JoinHandle<()>>,
}

impl Listener {
    /// Binds `config.address` and starts serving sessions of `table`.
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidArgument`]: a `tcp://` address without a token, an
    ///   empty token.
    /// - [`Error::Busy`]: another listener serves the Unix socket.
    /// - [`Error::Io`]: the socket could not be bound or the thread started.
    pub(crate) fn start(
        table: Table,
        config: ListenConfig,
        held: Arc<Held>,
        refusals: SessionRefusals,
    ) -> Result<Listener> {
        let address = config.address.clone();
        if config.token.as_ref().is_some_and(Vec::is_empty) {
            return Err(Error::InvalidArgument(format!(
                "listener {address}: the token is empty, expected at least one byte"
            )));
        }
        let tls = match (&address, &config.tls) {
            (Address::Tls(_), Some(config)) => Some(tls::server_config(config)?),
            (Address::Tls(_), None) => {
                return Err(Error::InvalidArgument(format!(
                    "listener {address}: a tls:// listener needs a certificate and key (--tls-cert, --tls-key), found none"
                )))
            }
            _ => None,
        };
        let client_certificates = config
            .tls
            .as_ref()
            .is_some_and(|tls| tls.client_ca.is_some());
        if address.needs_token(client_certificates) && config.token.is_none() {
            return Err(Error::InvalidArgument(format!(
                "listener {address}: a network listener needs a token (--token-file or LIVEREG_TOKEN; on tls://, client certificates may replace it), expected one, found none"
            )));
        }

        if config
            .token
            .as_ref()
            .is_some_and(|t| t.len() > crate::session::wire::TOKEN_MAX)
        {
            return Err(Error::InvalidArgument(format!(
                "listener {address}: the token is over {} bytes",
                crate::session::wire::TOKEN_MAX
            )));
        }
        held.records(&table)
            .map_err(|e| Error::os(table.name(), "open the sessions' records", e))?;
        let acceptor = Acceptor::bind(&address, config.socket_mode, tls)?;
        let io = |e: std::io::Error| Error::Io {
            context: format!("listener {address}"),
            source: e,
        };
        let stop = Arc::new(eventfd::event_nonblocking().map_err(io)?);
        let epoll = Epoll::new().map_err(io)?;
        epoll.add_level(&*stop, STOP).map_err(io)?;
        epoll.add_level(&acceptor, ACCEPT).map_err(io)?;
        let nap = Epoll::new().map_err(io)?;
        nap.add_level(&*stop, STOP).map_err(io)?;
        nap.add_level(&acceptor, ACCEPT).map_err(io)?;
        let mut listen_loop = ListenLoop {
            gate: Gate {
                table,
                held,
                refusals,
                token: config.token,
                penalties: RefCell::default(),
            },
            acceptor,
            epoll,
            nap,
            connections: Vec::new(),
            greeting: VecDeque::new(),
            next_serial: 0,
            unread: Vec::new(),
            accept_paused: None,
            last_pause: Duration::ZERO,
            info_sequence: None,
            ends_seen: 0,
            next_look_at_all: Instant::now(),
            only_regions: false,
            urgent: false,
            clears_waited: false,
            refusals_due: None,
        };
        listen_loop.info_sequence = listen_loop.current_info_sequence();
        let thread = std::thread::Builder::new()
            .name("livereg-listen".into())
            .spawn(move || listen_loop.run())
            .map_err(io)?;
        log::info!("listening for sessions on {address}");
        Ok(Listener {
            address,
            fork_epoch: crate::os::fork::install(),
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if self.fork_epoch != crate::os::fork::epoch() {
            std::mem::forget(self.thread.take());
            return;
        }
        eventfd::signal(&self.stop);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        if let Address::Unix(path) = &self.address {
            let _ = std::fs::remove_file(path);
        }
    }
}

const STOP: u64 = 0;
pub(super) const ACCEPT: u64 = 1;
pub(super) const FIRST_CONNECTION: u64 = 2;

/// The listener thread's state.
pub(super) struct ListenLoop {
    /// The table, the sessions held, the token, refusals and penalties.
    pub(super) gate: Gate,
    pub(super) acceptor: Acceptor,
    pub(super) epoll: Epoll,
    /// What ends a [`GATHER`] nap early: a new connection, the stop.
    nap: Epoll,
    /// Connections by key - [`FIRST_CONNECTION`]; `None`: a free entry.
    pub(super) connections: Vec<Option<Connection>>,
    /// Connections still greeting, oldest first, as `(entry, serial)`
    /// (entries that moved on are dropped lazily).
    pub(super) greeting: VecDeque<(usize, u64)>,
    /// The serial of the next connection.
    pub(super) next_serial: u64,
    /// Connections whose last read stopped at its budget: read again next
    /// turn (no edge wakes the listener for what they still hold).
    pub(super) unread: Vec<usize>,
    /// While accepting is paused: until when, and why.
    pub(super) accept_paused: Option<(Instant, Paused)>,
    /// The length of the last pause, doubled by the next one while
    /// descriptors stay short.
    pub(super) last_pause: Duration,
    /// The info area's sequence last sent to the sessions.
    pub(super) info_sequence: Option<u64>,
    /// The reaper's count of ends seen at the last look at every session.
    pub(super) ends_seen: u64,
    /// When every session is looked at again (sessions that beat in a
    /// region are otherwise looked at only when the reaper saw an end).
    pub(super) next_look_at_all: Instant,
    /// Whether the last tick found only sessions that beat in a region:
    /// then the next comes at the slower [`quiet_listener_tick`].
    pub(super) only_regions: bool,
    /// Whether this round saw more than beats (a connection, a greeting, a
    /// close): then the next round does not wait.
    pub(super) urgent: bool,
    /// Whether a client waits for a clear: then the listener looks often.
    pub(super) clears_waited: bool,
    /// When the earliest held refusal is to be told (a source held back
    /// after failed handshakes): the listener wakes then, not before.
    pub(super) refusals_due: Option<Instant>,
}

impl ListenLoop {
    fn run(&mut self) {
        let tick = listener_tick(self.gate.table.reap_timeout());
        let quiet_tick = quiet_listener_tick(self.gate.table.reap_timeout());
        let mut next_tick = Instant::now() + tick;
        // Whether the last wait returned a full batch: others may be ready.
        let mut more_ready = false;
        loop {
            self.note_running();
            let mut wait = next_tick.saturating_duration_since(Instant::now());
            if self.clears_waited {
                wait = wait.min(CLEAR_POLL);
            }
            if let Some((until, _)) = self.accept_paused {
                wait = wait.min(until.saturating_duration_since(Instant::now()));
            }
            if let Some(due) = self.refusals_due {
                wait = wait.min(due.saturating_duration_since(Instant::now()));
            }
            if !self.unread.is_empty() || more_ready {
                wait = Duration::ZERO;
            }
            let fired = match self.epoll.wait(Some(wait)) {
                Ok(fired) => fired,
                Err(e) => {
                    limited_log!(
                        log::Level::Error,
                        "table '{}': the listener's epoll failed: {e}",
                        self.gate.table.name()
                    );
                    std::thread::sleep(tick);
                    Vec::new()
                }
            };
            // Before anything read or judged: the wait is where a frozen
            // listener resumes.
            let resumed_ns = self.note_running();
            more_ready = fired.len() == WAIT_MAX;
            let beats_only = !fired.is_empty() && self.unread.is_empty() && !more_ready;
            self.urgent = false;
            for entry in std::mem::take(&mut self.unread) {
                self.on_readable(entry);
            }
            for ready in fired {
                match ready.key {
                    STOP => return self.stop(),
                    ACCEPT => self.accept_some(),
                    key => {
                        let entry = (key - FIRST_CONNECTION) as usize;
                        if let (true, Some(Some(served))) =
                            (ready.hung_up, self.connections.get_mut(entry))
                        {
                            served.note_hung_up();
                        }
                        self.on_readable(entry);
                    }
                }
            }
            self.resume_accepting();
            if self.clears_waited || self.refusals_due.is_some_and(|due| due <= Instant::now()) {
                self.settle_waits();
            }
            if Instant::now() >= next_tick {
                self.tick();
                next_tick = Instant::now() + if self.only_regions { quiet_tick } else { tick };
            }
            if self.unread.is_empty() && !more_ready {
                // Everything its clients sent before `resumed_ns` is applied
                // (no read stopped at its budget, no batch left others ready).
                self.gate.held.caught_up(resumed_ns);
            }
            if beats_only && !self.urgent {
                if self.accept_paused.is_some() {
                    // Connections waiting to be accepted wait for the pause.
                    std::thread::sleep(GATHER);
                } else {
                    // A failed wait is a shorter nap: nothing to do about it.
                    let _ = self.nap.wait(Some(GATHER));
                }
            }
        }
    }

    pub(super) fn on_readable(&mut self, entry: usize) {
        let gate = &self.gate;
        let Some(Some(served)) = self.connections.get_mut(entry) else {
            return;
        };
        self.urgent |= served.holding.is_none();
        match served.on_readable(gate) {
            Next::Close(end) => {
                self.urgent = true;
                self.close(entry, end);
            }
            Next::KeepOpen => {
                self.clears_waited |= served.waits_for_clear();
                self.refusals_due = earliest(self.refusals_due, served.refusal_due());
                if served.more_unread() {
                    self.unread.push(entry);
                }
            }
        }
    }

    /// Answers the clients whose clear is over, and the held refusals whose
    /// time came; after a reset, tells every session at once whether it
    /// ended.
    fn settle_waits(&mut self) {
        self.clears_waited = false;
        self.refusals_due = None;
        let mut settled = false;
        for entry in 0..self.connections.len() {
            let Some(served) = self.connections[entry].as_mut() else {
                continue;
            };
            let cleared = served.waits_for_clear();
            match served.settle(&self.gate.table) {
                Next::Close(end) => {
                    settled |= cleared;
                    self.close(entry, end);
                }
                Next::KeepOpen => {
                    self.clears_waited |= served.waits_for_clear();
                    self.refusals_due = earliest(self.refusals_due, served.refusal_due());
                }
            }
        }
        if settled {
            // A reset ends every registration: each session hears it now,
            // not at the next tick.
            self.tick();
        }
    }

    /// Closes a connection; ends what it holds first if `end` says so.
    pub(super) fn close(&mut self, entry: usize, end: Option<Reason>) {
        let Some(served) = self.connections[entry].take() else {
            return;
        };
        if let Some(holding) = served.holding {
            if let Some(reason) = end {
                let slot = self.gate.table.memory.slot(holding.index);
                if protocol::end(slot, holding.generation, reason).is_ok() {
                    limited_log!(
                        log::Level::Debug,
                        "session from {} closed: {reason}",
                        served.peer
                    );
                }
            }
            self.gate.held.let_go(holding.index, holding.generation);
            if let Ok(records) = self.gate.held.records(&self.gate.table) {
                records.set_holder(holding.index, holding.generation, 0);
            }
            self.gate.table.memory.wake_reaper();
        }
        // Dropping the stream closes it and takes it out of the epoll set.
    }

    /// The info area's sequence now (odd while a writer is in it).
    fn current_info_sequence(&self) -> Option<u64> {
        self.gate
            .table
            .memory
            .info_area()
            .map(|area| area.sequence.load(Acquire))
    }

    /// The listener runs now: tells the reaper so, and notes an absence (a
    /// gap past [`absence_threshold`] since it last ran: its process was
    /// stopped or starved, its host frozen), from whose end sessions'
    /// silence counts.
    fn note_running(&mut self) -> u64 {
        let threshold = absence_threshold(self.gate.table.reap_timeout());
        let now_ns = self.gate.table.clock.now_ns();
        if let Some(gap) = self.gate.held.listener_ran(now_ns, threshold) {
            log::warn!(
                "table '{}': the listener did not run for {:.3}s (its process stopped or starved, or its host paused): sessions' silence counts from now",
                self.gate.table.name(),
                gap.as_secs_f64()
            );
        }
        now_ns
    }

    /// Every tick: greetings past their deadline are closed; a session
    /// whose client seems unheard past the reap timeout and its allowance
    /// is read first (its beats may wait in the socket: the listener was
    /// stopped, or busy), then ended `timeout` if still unheard; sessions
    /// whose registration ended are told; the others hear `Heard` every
    /// `T/4`, and a changed info area. A session whose client beats in a
    /// region (pulled and judged by the reaper) costs nothing here but
    /// when the reaper saw an end, every `T/4`, or for new info.
    fn tick(&mut self) {
        let sequence = self.current_info_sequence();
        let info_changed = sequence != self.info_sequence && sequence.is_some_and(|s| s % 2 == 0);
        if info_changed {
            self.info_sequence = sequence;
        }
        let heard_every = heard_interval(self.gate.table.reap_timeout());
        let ends = self.gate.held.ends_seen();
        let now = Instant::now();
        let look_at_all = ends != self.ends_seen || now >= self.next_look_at_all;
        if look_at_all {
            self.ends_seen = ends;
            self.next_look_at_all = now + heard_every;
        }
        self.only_regions = true;
        for entry in 0..self.connections.len() {
            let Some(served) = self.connections[entry].as_mut() else {
                continue;
            };
            self.only_regions &= served.beats_in_region();
            let next = if served.holding.is_none() {
                if served.opened.elapsed() >= HANDSHAKE_DEADLINE && !served.is_waiting() {
                    limited_log!(
                        log::Level::Debug,
                        "session from {}: no hello within {HANDSHAKE_DEADLINE:?}",
                        served.peer
                    );
                    Next::Close(None)
                } else {
                    Next::KeepOpen
                }
            } else if served.beats_in_region() && !look_at_all && !info_changed {
                Next::KeepOpen
            } else {
                let gate = &self.gate;
                let mut next = Next::KeepOpen;
                if served.seems_unheard(gate) {
                    next = served.on_readable(gate);
                }
                if next == Next::KeepOpen {
                    next = served.check_ended(gate);
                }
                if next == Next::KeepOpen && info_changed {
                    next = served.send_info(&self.gate.table);
                }
                if next == Next::KeepOpen {
                    next = served.keep_told(heard_every);
                }
                next
            };
            if let Next::Close(end) = next {
                self.close(entry, end);
            }
        }
    }

    /// Closes every connection, leaving their registrations to be reclaimed.
    fn stop(&mut self) {
        for entry in 0..self.connections.len() {
            self.close(entry, None);
        }
    }
}

/// Why the listener stopped accepting for a while.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Paused {
    /// `accept` failed for want of descriptors.
    Descriptors,
    /// Every greeting connection is within its grace.
    Greetings,
}

/// The earlier of two moments, either of which may be none.
fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}
