//! The reaper: scans the slots, ends what went silent or whose process
//! exited, and hands the ended registrations to their drop handlers
//! ([`crate::handlers`]), which free the slots.

use crate::clock::{duration_ns, monotonic_ns, Clock, Stamps, STAMP_LAG_TICKS};
use crate::error::Result;
use crate::event::{DropEvent, Reason};
use crate::exit_watch::{ExitWatcher, LockCheck, CLOSE_RECHECK};
use crate::handlers::{
    ClearHandler, DropHandler, HandlerError, HandlerPool, Handlers, Job, Running, HANDLER_DEADLINE,
};
use crate::layout::{
    Slot, BUSY, FLAG_COARSE_STAMPS, FLAG_PROXY, FLAG_REMOTE, PROCESS_TAG_SHIFT, SCANS_PER_TIMEOUT,
};
use crate::locks::ReaperRole;
use crate::metrics;
use crate::os::lock;
use crate::protocol::{self, Beat, Gone, CLAIMING, FREE, LIVE};
use crate::session::held::Held;
use crate::session::listener::{ListenConfig, Listener, DEFAULT_SOCKET_MODE};
use crate::session::timing::unheard_allowance;
use crate::session::{Address, TlsServer};
use crate::sync::Ordering::{AcqRel, Acquire, Relaxed, Release};
use crate::table::Table;
use crate::wake::WakeFd;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::Arc;
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
    clear_handlers: Vec<ClearHandler>,
    handler_deadline: Duration,
    listens: Vec<ListenConfig>,
    socket_mode: u32,
    tls: Option<TlsServer>,
}

impl Table {
    /// Starts configuring this table's reaper; it reads time from this
    /// handle's clock.
    pub fn reaper(&self) -> ReaperBuilder {
        ReaperBuilder {
            table: self.clone(),
            drop_handlers: Vec::new(),
            clear_handlers: Vec::new(),
            handler_deadline: HANDLER_DEADLINE,
            listens: Vec::new(),
            socket_mode: DEFAULT_SOCKET_MODE,
            tls: None,
        }
    }
}

impl ReaperBuilder {
    /// Adds a drop-state handler, called once for every registration that
    /// ends. A handler that returns an error or panics is counted and logged
    /// in [`Status::handler_failures`](crate::status::Status); the others still run.
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
    /// [`Status::handlers_overdue`](crate::status::Status) (default
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
    pub fn build(self) -> Result<Reaper> {
        let inner = &self.table.memory;
        let role = inner.take_reaper_role()?;
        let header = inner.header();
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
        let wake = WakeFd::start(inner.clone()).map_err(|source| crate::error::Error::Io {
            context: format!(
                "table '{}': start the reaper's wake-up descriptor",
                inner.name
            ),
            source,
        })?;
        let held = Arc::new(Held::default());
        let started_ns = self.table.clock.now_ns();
        let (socket_mode, tls) = (self.socket_mode, self.tls);
        let listeners = self
            .listens
            .into_iter()
            .map(|config| {
                let config = ListenConfig {
                    socket_mode,
                    tls: tls.clone(),
                    ..config
                };
                Listener::start(self.table.clone(), config, held.clone())
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Reaper {
            listeners,
            held,
            seen: vec![Seen::NONE; inner.capacity as usize],
            timeout_ns: header.reap_timeout_ns.load(Relaxed),
            grace_ns: header.registration_grace_ns.load(Relaxed),
            progress_timeout_ns: header.progress_timeout_ns.load(Relaxed),
            clock_id: self.table.clock.identity(),
            in_flight: vec![0; inner.capacity as usize],
            clear_issued: 0,
            resets_served,
            handlers: Dispatch::Inline(Handlers {
                memory: inner.clone(),
                drop_handlers: self.drop_handlers,
                clear_handlers: self.clear_handlers,
                running: Running::new(self.handler_deadline),
            }),
            table: self.table,
            role,
            watcher,
            wake,
            last_scan_ns: None,
            started_ns,
            listener_stale_scans: 0,
            locks: LockTests::default(),
        })
    }
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

/// The reaper's memory of one slot's beat word: when, on its own clock, it
/// first saw the current value. A registration stamping with another clock (a
/// time namespace) is judged by this instead of by its stamps.
#[derive(Clone, Copy)]
struct Seen {
    word: u64,
    first_seen: u64,
    /// The progress word and generation last seen, and when (reaper clock)
    /// it was first seen so: the later of the last step and becoming busy.
    progress: u64,
    progress_generation: u32,
    progress_since: u64,
}

impl Seen {
    /// An impossible beat word (generation tag 0xFFFF with an unknown end
    /// marker), so the first real word always counts as new.
    const NONE: Seen = Seen {
        word: u64::MAX,
        first_seen: 0,
        progress: u64::MAX,
        progress_generation: 0,
        progress_since: 0,
    };
}

/// The outcome of one scan.
#[derive(Debug, Default)]
pub struct ScanReport {
    /// The registrations that ended, as their handlers saw them.
    pub ended: Vec<DropEvent>,
    /// Handlers that failed or panicked in this scan (when the handlers run
    /// on the scanning thread; a reaper thread's are counted in
    /// [`Status::handler_failures`](crate::status::Status) as they finish).
    pub handler_failures: u32,
    /// Slots whose contents no writer of ours produces, skipped.
    pub corrupt_slots: u32,
    /// Whether this scan carried out a clear (its clear handlers ran or are
    /// queued).
    pub cleared: bool,
    /// Whether the clear was a reset: this scan ended every registration.
    pub reset: bool,
}

/// Where the handlers run.
enum Dispatch {
    /// On the scanning thread, before the scan returns.
    Inline(Handlers),
    /// On handler threads; the scan only queues the drops.
    Pool(HandlerPool),
}

/// The one reaper of a table: holds the reaper role until dropped.
pub struct Reaper {
    /// Listeners serving sessions (first, so they stop before the role is
    /// given back).
    pub(crate) listeners: Vec<Listener>,
    /// Which session registrations this reaper's listeners hold.
    pub(crate) held: Arc<Held>,
    table: Table,
    role: ReaperRole,
    handlers: Dispatch,
    /// Per slot, `generation + 1` of an ended registration whose drop is
    /// queued on the handler thread (0: none): not to be queued again.
    in_flight: Vec<u32>,
    /// The last clear ticket queued on the handler thread.
    clear_issued: u64,
    /// The table's `reset_requested` count this reaper has carried out (or
    /// found expired when it started).
    resets_served: u64,
    seen: Vec<Seen>,
    timeout_ns: u64,
    grace_ns: u64,
    /// How long a busy registration may make no progress (0: not judged).
    progress_timeout_ns: u64,
    /// The identity of the clock this reaper reads: only stamps of that
    /// clock are trusted.
    clock_id: u64,
    /// Watches registered processes through pidfds (shared tables).
    watcher: Option<ExitWatcher>,
    /// Readable when a scan is due early.
    wake: WakeFd,
    /// When the last scan ran, on the table clock.
    last_scan_ns: Option<u64>,
    /// When this reaper started, on the table clock: a session registration
    /// no connection holds (its client is away, perhaps reconnecting after
    /// a restart) has the reap timeout from then at least to be reclaimed.
    started_ns: u64,
    /// How many scans in a row found no listener going round its loop
    /// lately: from two on, the reaper judges held sessions' silence itself
    /// (one is not enough: after the process was stopped, the reaper may
    /// scan before the listener has run).
    listener_stale_scans: u32,
    /// When this reaper tests the locks of registrations no pidfd watches.
    locks: LockTests,
}

/// How long after a round for a close its second round is due: half the
/// exit watcher's [`CLOSE_RECHECK`] (the close was heard before this round
/// ran, and the watcher's wake-up for the second comes that long after it).
const RECHECK_AFTER_NS: u64 = CLOSE_RECHECK.as_nanos() as u64 / 2;

/// Every this many scans (four timeouts), the locks of registrations no
/// pidfd watches are tested even if no descriptor on the table was closed: a
/// safety net, should a close ever go unheard.
const LOCK_BACKSTOP_SCANS: u32 = 4 * SCANS_PER_TIMEOUT;

/// From this many lock tests in a round, the next round reads every held
/// lock at once (`/proc/locks`) instead of testing each (`F_OFD_GETLK` walks
/// the object's whole lock list per test). Measured in BENCHMARKS.md.
const LOCK_SNAPSHOT_FROM: usize = 64;

/// The registering process of a registration, as its slot names it: pid and
/// start time in its own PID namespace, its clock's identity (its time
/// namespace) and its random tag (the upper bits of the slot's flags). A
/// process's death drops all its locks at once, so in a round one held lock
/// speaks for every registration of its process.
type Registrant = (u32, u64, u64, u32);

/// The lock tests of registrations no pidfd watches, round by round: a round
/// runs in a scan after a descriptor on the table was closed (a registrant
/// died, or let go), on the first scan, and on the backstop. In a round,
/// each registering process has one registration tested (its first); the
/// others are tested only if that one's lock is gone.
#[derive(Debug)]
struct LockTests {
    /// Whether this scan is a round.
    round: bool,
    /// When the second round owed to the last close heard is due (reaper
    /// clock): the kernel tells of a close (`fsnotify_close`) just *before*
    /// it drops the file's locks (`locks_remove_file`), so the round at once
    /// may find a dying process's lock still held. The owed round is the
    /// first scan at or after this time (the exit watcher wakes the reaper
    /// [`CLOSE_RECHECK`] after the close for it); an unrelated scan before
    /// then does not pay it.
    recheck_at: Option<u64>,
    /// This round's registering processes whose tested lock is held.
    alive: std::collections::HashSet<Registrant>,
    /// Scans since the last round (`u32::MAX` before the first).
    scans_since_round: u32,
    /// Tests made in this round.
    tested: usize,
    /// Whether this round reads all held locks at once (decided from the
    /// last round's count).
    use_snapshot: bool,
    /// The held locks, read at this round's first test.
    snapshot: Option<std::collections::HashSet<u64>>,
}

impl Default for LockTests {
    fn default() -> Self {
        LockTests {
            round: false,
            recheck_at: None,
            alive: std::collections::HashSet::new(),
            scans_since_round: u32::MAX,
            tested: 0,
            use_snapshot: false,
            snapshot: None,
        }
    }
}

impl LockTests {
    fn start_scan(&mut self, locks_moved: bool, now_ns: u64) {
        let recheck_due = self.recheck_at.is_some_and(|at| now_ns >= at);
        if recheck_due {
            self.recheck_at = None;
        }
        if locks_moved {
            self.recheck_at = Some(now_ns.saturating_add(RECHECK_AFTER_NS));
        }
        self.round = locks_moved || recheck_due || self.scans_since_round >= LOCK_BACKSTOP_SCANS;
        self.alive.clear();
        if self.round {
            self.use_snapshot = self.tested >= LOCK_SNAPSHOT_FROM;
            self.tested = 0;
            self.scans_since_round = 0;
        } else {
            self.scans_since_round += 1;
        }
    }

    fn end_scan(&mut self) {
        self.snapshot = None;
    }
}

impl Reaper {
    /// One scan at time `now_ns` (on the table clock): carries out a pending
    /// clear (a reset first ends every registration), ends every
    /// registration that has been silent for its budget or whose process has
    /// exited, and every one already ended (deregistered,
    /// replaced, or left by a reaper that died mid-drop); runs the drop
    /// handlers outside any lock; then frees those slots.
    ///
    /// # Errors
    ///
    /// - [`Error::Corrupt`](crate::error::Error::Corrupt) if the object was
    ///   truncated (checked before any slot is read; nothing is done then).
    /// - [`Error::Busy`](crate::error::Error::Busy) in a forked child: the role
    ///   stays the parent's.
    pub fn scan_once(&mut self, now_ns: u64) -> Result<ScanReport> {
        let started = monotonic_ns();
        self.begin_scan(now_ns)?;
        let clear = self.pending_clear();
        let mut report = ScanReport {
            cleared: clear.is_some(),
            reset: clear.is_some_and(|clear| clear.reset),
            ..ScanReport::default()
        };
        self.sweep(now_ns, &mut report);
        self.dispatch(&mut report, clear);
        self.finish_scan(&report, started);
        Ok(report)
    }

    /// Checks the role and the table's size, answers the wake-ups so far and
    /// beats the reaper's heartbeat; notes what the exit watcher saw.
    fn begin_scan(&mut self, now_ns: u64) -> Result<()> {
        let inner = &self.table.memory;
        if !self.role.held_here() {
            return Err(crate::error::Error::Busy(format!(
                "table '{}': this reaper was inherited through fork: the role is the parent's; build a reaper in the child",
                inner.name
            )));
        }
        inner.check_size()?;
        // This scan answers every wake-up so far.
        self.wake.drain();
        self.last_scan_ns = Some(now_ns);
        inner.header().reaper_heartbeat_ns.store(now_ns, Release);
        let listener_quiet_ns = now_ns.saturating_sub(self.held.listener_last_ran());
        if self.held.count() > 0 && listener_quiet_ns > (self.timeout_ns / 2).max(500_000_000) {
            self.listener_stale_scans = self.listener_stale_scans.saturating_add(1);
        } else {
            self.listener_stale_scans = 0;
        }
        if let Some(watcher) = &mut self.watcher {
            watcher.collect_fired();
        }
        // The first scan is a round too (`scans_since_round` starts at MAX).
        let moved = self
            .watcher
            .as_ref()
            .map_or(true, ExitWatcher::take_locks_moved);
        self.locks.start_scan(moved, now_ns);
        Ok(())
    }

    /// The clear this scan carries out, if one is requested and not yet
    /// served or queued; a reset if one was requested with it.
    fn pending_clear(&mut self) -> Option<PendingClear> {
        let header = self.table.memory.header();
        let ticket = header.clear_requested.load(Acquire);
        let served = header
            .clear_completed
            .load(Acquire)
            .max(header.clear_expired.load(Acquire));
        if ticket <= served.max(self.clear_issued) {
            return None;
        }
        // A reset's count is raised before its ticket: seen with the ticket.
        let resets = header.reset_requested.load(Acquire);
        let reset = resets > self.resets_served;
        self.resets_served = resets;
        Some(PendingClear { ticket, reset })
    }

    /// Judges every slot, recording what ended (and corrupt slots).
    fn sweep(&mut self, now_ns: u64, report: &mut ScanReport) {
        let inner = self.table.memory.clone();
        for index in 0..inner.capacity {
            let slot = inner.slot(index);
            let state = slot.state.load(Acquire);
            let (generation, phase) = protocol::split_state(state);
            let queued = &mut self.in_flight[index as usize];
            if *queued != 0 {
                if state == protocol::state_word(queued.wrapping_sub(1), LIVE) {
                    continue; // its drop is running on the handler thread
                }
                *queued = 0;
            }
            match phase {
                FREE => continue,
                LIVE => {}
                CLAIMING => {
                    self.free_orphaned_claim(slot, generation);
                    continue;
                }
                _ => {
                    report.corrupt_slots += 1;
                    continue;
                }
            }
            match self.judge(index, slot, generation, now_ns, report.reset) {
                Verdict::Keep => {}
                Verdict::Corrupt => report.corrupt_slots += 1,
                Verdict::Ended { reason, silent_ns } => {
                    let event = drop_event(slot, index, generation, reason, silent_ns);
                    log_ended(&inner.name, &event);
                    if reason.is_eviction() {
                        metrics::observe_eviction(inner.header(), silent_ns);
                    }
                    report.ended.push(event);
                }
            }
        }
    }

    /// Runs (inline) or queues (on the handler threads) the drops of what
    /// ended, then the clear's handlers.
    fn dispatch(&mut self, report: &mut ScanReport, clear: Option<PendingClear>) {
        if let Some(watcher) = &mut self.watcher {
            for event in &report.ended {
                watcher.forget(event.slot);
            }
        }
        let name = &self.table.memory.name;
        match &mut self.handlers {
            Dispatch::Inline(handlers) => {
                for event in &report.ended {
                    report.handler_failures += handlers.drop_registration(event);
                }
                if let Some(clear) = clear {
                    report.handler_failures += handlers.complete_clear(clear.ticket);
                }
            }
            Dispatch::Pool(pool) => {
                for event in &report.ended {
                    self.in_flight[event.slot as usize] = event.generation.wrapping_add(1);
                    queue(pool, Job::Drop(event.clone()), name);
                }
                if let Some(clear) = clear {
                    queue(pool, Job::Clear(clear.ticket), name);
                    self.clear_issued = clear.ticket;
                }
                pool.check_overdue();
            }
        }
    }

    /// Counts the scan and records its duration for status and metrics.
    fn finish_scan(&mut self, report: &ScanReport, started_ns: u64) {
        self.locks.end_scan();
        let header = self.table.memory.header();
        header.scans.fetch_add(1, Relaxed);
        header
            .corrupt_slots
            .store(u64::from(report.corrupt_slots), Relaxed);
        let duration_ns = monotonic_ns().saturating_sub(started_ns);
        header.last_scan_duration_ns.store(duration_ns, Relaxed);
        metrics::observe_scan(header, duration_ns);
    }

    /// One scan now, on the table's clock.
    ///
    /// # Errors
    ///
    /// As [`Reaper::scan_once`].
    pub fn scan(&mut self) -> Result<ScanReport> {
        self.scan_once(self.table.clock.now_ns())
    }

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
    /// (see [`ReaperBuilder::listen`]).
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidArgument`](crate::error::Error::InvalidArgument): a
    ///   `tcp://` address without a token.
    /// - [`Error::Busy`](crate::error::Error::Busy): another listener serves
    ///   that Unix socket.
    /// - [`Error::Io`](crate::error::Error::Io): binding failed.
    pub fn listen(&mut self, address: Address, token: Option<Vec<u8>>) -> Result<()> {
        let config = ListenConfig::new(address, token);
        self.listeners.push(Listener::start(
            self.table.clone(),
            config,
            self.held.clone(),
        )?);
        Ok(())
    }

    /// The boot token this reaper wrote when it took the table.
    pub fn boot_token(&self) -> u64 {
        self.table.memory.header().boot_token.load(Acquire)
    }

    /// One `LIVE` slot's fate this scan: observe it, [`decide`], then carry
    /// the decision out.
    fn judge(
        &mut self,
        index: u32,
        slot: &Slot,
        generation: u32,
        now_ns: u64,
        resetting: bool,
    ) -> Verdict {
        let word = slot.beat.load(Acquire);
        if !protocol::beat_matches(word, generation) {
            return Verdict::Corrupt;
        }
        let observed = self.observe(index, slot, generation, word, now_ns);
        match decide(observed, resetting, self.timeout_ns) {
            Decision::Corrupt => Verdict::Corrupt,
            Decision::Drop(reason) => Verdict::Ended {
                reason,
                silent_ns: self.silence_before_end(index, generation, reason, now_ns),
            },
            Decision::JudgeProgress => self.judge_progress(index, slot, generation, now_ns),
            Decision::Reset => match protocol::end(slot, generation, Reason::Cleared) {
                Ok(()) => Verdict::Ended {
                    reason: Reason::Cleared,
                    silent_ns: 0,
                },
                Err(Gone::Ended(Some(reason))) => Verdict::Ended {
                    reason,
                    silent_ns: 0,
                },
                Err(_) => Verdict::Corrupt,
            },
            Decision::Evict { reason, silent_ns } => {
                match protocol::evict(slot, generation, word, reason) {
                    Ok(()) => Verdict::Ended { reason, silent_ns },
                    Err(found) => match protocol::decode_beat(found) {
                        // A deregistration (or another ending) got there first.
                        Beat::Ended(Some(reason)) => Verdict::Ended { reason, silent_ns },
                        // A heartbeat landed between our read and our CAS: it counts.
                        _ => Verdict::Keep,
                    },
                }
            }
        }
    }

    /// What this scan sees of a `LIVE` slot whose beat word is `word`: its
    /// ending, or how long it has been silent (on this reaper's clock),
    /// against which budget, and whether its process is gone.
    fn observe(
        &mut self,
        index: u32,
        slot: &Slot,
        generation: u32,
        word: u64,
        now_ns: u64,
    ) -> Observed {
        let (signal_ns, budget_ns, timed_reason) = match protocol::decode_beat(word) {
            Beat::Ended(reason) => return Observed::Ended(reason),
            Beat::Never => (
                slot.registered_ns.load(Relaxed),
                self.grace_ns,
                Reason::Grace,
            ),
            Beat::At(stamp) => (
                stamp
                    .ns_near(now_ns)
                    .saturating_add(self.stamp_lag_ns(slot)),
                self.timeout_ns,
                Reason::Timeout,
            ),
        };
        let own_clock =
            self.clock_id != Clock::UNKNOWN && slot.clock_id.load(Relaxed) == self.clock_id;
        let last_signal = self.last_signal(index, word, own_clock.then_some(signal_ns), now_ns);
        if slot.flags.load(Relaxed) & FLAG_REMOTE != 0 {
            // A session's client: no lock or pidfd sees it exit. Held by a
            // connection, its listener ends it when the connection closes,
            // when its client says its engine went silent, or when the
            // client goes unheard: the listener has the last word on
            // silence, since only it can read what the client sent (after
            // this process was stopped, the beats wait in the sockets).
            // This scan backs it up only when no listener has run for two
            // scans, timing the silence from when the client was last heard
            // and allowing what the listener allows (its last pings may not
            // have left a stopped process). Held by none of this reaper's
            // connections, it awaits its client's reclaim, for the reap
            // timeout from its last beat or from this reaper's start,
            // whichever is later; past it, its client did not come back.
            let allowance = duration_ns(unheard_allowance(self.table.reap_timeout()));
            let listener_runs = self.listener_stale_scans < 2;
            let (since_ns, budget_ns, timed_reason) = match self.held.heard(index, generation) {
                Some(_) if timed_reason == Reason::Timeout && listener_runs => {
                    (now_ns, budget_ns, timed_reason)
                }
                Some(heard_ns) if timed_reason == Reason::Timeout => {
                    (heard_ns, budget_ns + allowance, timed_reason)
                }
                Some(_) => (last_signal, budget_ns + allowance, timed_reason),
                None => (
                    last_signal.max(self.started_ns),
                    budget_ns,
                    Reason::Disconnected,
                ),
            };
            return Observed::Live {
                silent_ns: now_ns.saturating_sub(since_ns),
                budget_ns,
                timed_reason,
                exited: false,
            };
        }
        let test = match &mut self.watcher {
            Some(watcher) => watcher.lock_check(index, generation, slot),
            None => LockCheck::Now,
        };
        let exited = match test {
            LockCheck::Never => false,
            LockCheck::Now => self.process_exited(index, generation),
            LockCheck::WhenLocksMoved => {
                self.locks.round && self.lock_dropped(index, generation, slot)
            }
        };
        Observed::Live {
            silent_ns: now_ns.saturating_sub(last_signal),
            budget_ns,
            timed_reason,
            exited,
        }
    }

    /// How long a registration that another party ended `timeout` (a
    /// listener, for a session's silence) had been silent: from the last
    /// beat this reaper saw of it. 0 for every other ending.
    fn silence_before_end(&self, index: u32, generation: u32, reason: Reason, now_ns: u64) -> u64 {
        let word = self.seen[index as usize].word;
        match protocol::decode_beat(word) {
            Beat::At(stamp)
                if reason == Reason::Timeout && protocol::beat_matches(word, generation) =>
            {
                now_ns.saturating_sub(stamp.ns_near(now_ns))
            }
            _ => 0,
        }
    }

    /// How far the slot's stamps may lag its heartbeats: [`STAMP_LAG_TICKS`]
    /// of the table's coarse resolution where the registrant says it stamps
    /// coarsely, so that `stamp + lag` is never before the heartbeat (and the
    /// eviction never early); zero for precise stamps.
    fn stamp_lag_ns(&self, slot: &Slot) -> u64 {
        match self.table.memory.stamps {
            Stamps::Coarse { resolution_ns }
                if slot.flags.load(Relaxed) & FLAG_COARSE_STAMPS != 0 =>
            {
                resolution_ns.saturating_mul(u64::from(STAMP_LAG_TICKS))
            }
            _ => 0,
        }
    }

    /// A live registration's progress: busy and unchanged for
    /// the progress timeout, on this reaper's clock from when it saw the word
    /// change, it ends `Stalled`. Idle never stalls.
    fn judge_progress(&mut self, index: u32, slot: &Slot, generation: u32, now_ns: u64) -> Verdict {
        if self.progress_timeout_ns == 0 {
            return Verdict::Keep;
        }
        let word = slot.progress.load(Acquire);
        let seen = &mut self.seen[index as usize];
        if seen.progress != word || seen.progress_generation != generation {
            seen.progress = word;
            seen.progress_generation = generation;
            seen.progress_since = now_ns;
            if let Some(observed) = self.table.memory.progress_seen(index) {
                observed.store(now_ns.max(1), Relaxed);
            }
        }
        let quiet_ns = now_ns.saturating_sub(seen.progress_since);
        if word & BUSY == 0 || quiet_ns < self.progress_timeout_ns {
            return Verdict::Keep;
        }
        if !protocol::mark_stalled(slot, word) {
            return Verdict::Keep; // a step (or going idle) got there first
        }
        match protocol::end(slot, generation, Reason::Stalled) {
            Ok(()) => Verdict::Ended {
                reason: Reason::Stalled,
                silent_ns: quiet_ns,
            },
            Err(Gone::Ended(Some(reason))) => Verdict::Ended {
                reason,
                silent_ns: quiet_ns,
            },
            Err(_) => Verdict::Corrupt,
        }
    }

    /// When the slot last signalled, on the reaper's clock. `own_stamp` is
    /// its last signal when the registrant stamps with the reaper's own clock
    /// (same identity), trusted on every scan, including a restarted
    /// reaper's first. Any other slot is judged by when this reaper first saw
    /// its current beat word: its real last signal came no later, so it is
    /// never evicted early, and at most one scan interval late.
    fn last_signal(&mut self, index: u32, word: u64, own_stamp: Option<u64>, now_ns: u64) -> u64 {
        let seen = &mut self.seen[index as usize];
        if seen.word != word {
            seen.word = word;
            seen.first_seen = now_ns;
        }
        match own_stamp {
            Some(stamp) => stamp.min(now_ns),
            None => seen.first_seen,
        }
    }

    /// In a round, whether a registration seen before this scan has lost its
    /// lock: not if another registration of its process was found holding
    /// its lock in this round; else tested (see [`Reaper::test_lock`]).
    /// Registrations on another's behalf, or whose process start is unknown,
    /// are always tested on their own.
    fn lock_dropped(&mut self, index: u32, generation: u32, slot: &Slot) -> bool {
        let flags = slot.flags.load(Relaxed);
        let registrant: Registrant = (
            slot.pid.load(Relaxed),
            slot.process_start.load(Relaxed),
            slot.clock_id.load(Relaxed),
            flags >> PROCESS_TAG_SHIFT,
        );
        let grouped = flags & FLAG_PROXY == 0 && registrant.1 != 0;
        if grouped && self.locks.alive.contains(&registrant) {
            return false;
        }
        let dropped = self.test_lock(index, generation);
        if grouped && !dropped {
            self.locks.alive.insert(registrant);
        }
        dropped
    }

    /// [`Reaper::process_exited`] for a registration seen before this scan,
    /// from the scan's snapshot of every held lock when it has one (a lock
    /// taken after the snapshot belongs to a registration first seen later,
    /// which is tested on its own).
    fn test_lock(&mut self, index: u32, generation: u32) -> bool {
        self.locks.tested += 1;
        if self.locks.snapshot.is_none() && self.locks.use_snapshot {
            self.locks.use_snapshot = false;
            self.locks.snapshot =
                self.role.lock.as_ref().and_then(|file| {
                    lock::held_in(file, lock::SLOT_LOCKS..lock::SLOT_LOCKS << 1).ok()
                });
        }
        match &self.locks.snapshot {
            Some(held) => !held.contains(&lock::registration_lock(index, generation)),
            None => self.process_exited(index, generation),
        }
    }

    /// Whether the kernel has dropped the registration's exit-detection
    /// lock: its owner's process (every process sharing the owner's file
    /// description) is gone. Heap tables have no such lock.
    fn process_exited(&self, index: u32, generation: u32) -> bool {
        match &self.role.lock {
            Some(file) => matches!(
                lock::held_by_other(file, lock::registration_lock(index, generation)),
                Ok(false)
            ),
            None => false,
        }
    }

    /// A slot left `CLAIMING` by a registrant that died mid-claim: nobody
    /// holds the registration lock, so nobody is claiming. Frees it.
    fn free_orphaned_claim(&self, slot: &Slot, generation: u32) {
        if let Some(file) = &self.role.lock {
            if matches!(
                lock::held_by_other(file, lock::REGISTRATION_LOCK),
                Ok(false)
            ) && slot.state.load(Acquire) == protocol::state_word(generation, CLAIMING)
            {
                protocol::abandon_claim(slot, generation);
            }
        }
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

/// Queues a job; a thread that cannot be started leaves it to the running
/// threads (logged: drops are then slower, never lost).
fn queue(pool: &HandlerPool, job: Job, table: &str) {
    if let Err(e) = pool.send(job) {
        log::warn!("table '{table}': cannot start a handler thread ({e}): the drop waits for a running one");
    }
}

/// What a scan decided about one slot.
enum Verdict {
    /// Alive: nothing to do.
    Keep,
    /// Contents no writer of ours produces: skipped, counted.
    Corrupt,
    /// It ended for `reason` after `silent_ns` of silence (0 for explicit
    /// endings).
    Ended { reason: Reason, silent_ns: u64 },
}

/// A clear a scan carries out: its ticket, and whether it is a reset.
#[derive(Clone, Copy)]
struct PendingClear {
    ticket: u64,
    reset: bool,
}

/// What one scan observed of a `LIVE` slot, as plain values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Observed {
    /// Its beat word says it ended, with the reason its ender recorded
    /// (`None`: a word no writer of ours produces).
    Ended(Option<Reason>),
    /// Not ended: silent for `silent_ns` (this reaper's clock) against
    /// `budget_ns` (the timeout, or the grace before a first beat, whose
    /// reason is `timed_reason`), and whether its process is gone.
    Live {
        silent_ns: u64,
        budget_ns: u64,
        timed_reason: Reason,
        exited: bool,
    },
}

/// A slot's fate, decided from plain values only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Decision {
    /// Ended by its registrant or a requester: run its drop.
    Drop(Reason),
    /// A reset ends it, whatever its beats.
    Reset,
    /// End it for `reason`, unless a heartbeat lands first (the eviction is
    /// a compare-and-swap on the word the decision was made on).
    Evict { reason: Reason, silent_ns: u64 },
    /// Alive; a busy worker's progress is judged next.
    JudgeProgress,
    /// Contents no writer of ours produces.
    Corrupt,
}

/// The verdict on one slot: an ending first, then a reset, a process gone,
/// silence past its budget (never when reaping is off); else alive.
fn decide(observed: Observed, resetting: bool, timeout_ns: u64) -> Decision {
    match observed {
        Observed::Ended(Some(reason)) => Decision::Drop(reason),
        Observed::Ended(None) => Decision::Corrupt,
        Observed::Live { .. } if resetting => Decision::Reset,
        Observed::Live {
            exited: true,
            silent_ns,
            ..
        } => Decision::Evict {
            reason: Reason::ProcessExited,
            silent_ns,
        },
        Observed::Live {
            silent_ns,
            budget_ns,
            timed_reason,
            ..
        } if timeout_ns > 0 && silent_ns >= budget_ns => Decision::Evict {
            reason: timed_reason,
            silent_ns,
        },
        Observed::Live { .. } => Decision::JudgeProgress,
    }
}

/// One line per ended registration, at info: what ended, whose, why, and
/// after how much silence (for the operator reading the reaper's log).
fn log_ended(table: &str, event: &DropEvent) {
    let label = if event.label.is_empty() {
        String::new()
    } else {
        format!("{}, ", event.label)
    };
    log::info!(
        "table '{table}': instance {} ({label}pid {}, slot {}) ended: {} after {:.3}s silent",
        event.instance_id,
        event.pid,
        event.slot,
        event.reason,
        event.silent_for.as_secs_f64()
    );
}

fn drop_event(
    slot: &Slot,
    index: u32,
    generation: u32,
    reason: Reason,
    silent_ns: u64,
) -> DropEvent {
    let registered_ns = slot.registered_ns.load(Relaxed);
    let last_heartbeat_ns = match protocol::final_beat(slot) {
        Beat::At(stamp) => Some(stamp.ns_near(registered_ns)),
        _ => None,
    };
    DropEvent {
        instance_id: slot.instance_id.load(Relaxed),
        slot: index,
        generation,
        reason,
        pid: slot.pid.load(Relaxed),
        remote: slot.flags.load(Relaxed) & FLAG_REMOTE != 0,
        label: slot.load_label(),
        registered_ns,
        last_heartbeat_ns,
        silent_for: Duration::from_nanos(silent_ns),
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

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn live(silent_ms: u64, budget_ms: u64, exited: bool) -> Observed {
        Observed::Live {
            silent_ns: silent_ms * MS,
            budget_ns: budget_ms * MS,
            timed_reason: Reason::Timeout,
            exited,
        }
    }

    #[test]
    fn silence_ends_a_registration_at_its_budget_never_before() {
        assert_eq!(
            decide(live(999, 1000, false), false, 1000 * MS),
            Decision::JudgeProgress
        );
        assert_eq!(
            decide(live(1000, 1000, false), false, 1000 * MS),
            Decision::Evict {
                reason: Reason::Timeout,
                silent_ns: 1000 * MS
            }
        );
    }

    #[test]
    fn a_gone_process_ends_at_once_and_reaping_off_ends_nothing_silent() {
        assert_eq!(
            decide(live(1, 1000, true), false, 1000 * MS),
            Decision::Evict {
                reason: Reason::ProcessExited,
                silent_ns: MS
            }
        );
        assert_eq!(
            decide(live(5000, 1000, false), false, 0),
            Decision::JudgeProgress
        );
    }

    #[test]
    fn an_ending_is_dropped_before_a_reset_and_a_reset_before_everything_else() {
        let deregistered = Observed::Ended(Some(Reason::Deregistered));
        assert_eq!(
            decide(deregistered, true, MS),
            Decision::Drop(Reason::Deregistered)
        );
        assert_eq!(decide(Observed::Ended(None), false, MS), Decision::Corrupt);
        assert_eq!(
            decide(live(0, 1000, true), true, 1000 * MS),
            Decision::Reset
        );
        assert_eq!(
            decide(live(5000, 1000, false), true, 1000 * MS),
            Decision::Reset
        );
    }

    #[test]
    fn a_close_owes_a_second_lock_round_by_time_not_by_scan_count() {
        let mut locks = LockTests::default();
        locks.start_scan(false, 0); // the first scan is a round
        assert!(locks.round);
        locks.start_scan(true, 100 * MS); // a close heard: a round now…
        assert!(locks.round);
        // …an unrelated scan a moment later does not pay the owed one…
        locks.start_scan(false, 100 * MS + MS);
        assert!(!locks.round);
        // …the scan the watcher's wake-up brings does.
        locks.start_scan(false, 100 * MS + CLOSE_RECHECK.as_nanos() as u64);
        assert!(locks.round);
        // Paid: the next scans are not rounds until the next close.
        locks.start_scan(false, 200 * MS);
        assert!(!locks.round);
    }

    #[test]
    fn with_no_close_heard_locks_are_tested_on_the_backstop() {
        let mut locks = LockTests::default();
        locks.start_scan(false, 0);
        let mut scans = 0;
        loop {
            scans += 1;
            locks.start_scan(false, scans * 250 * MS);
            if locks.round {
                break;
            }
        }
        assert_eq!(scans, u64::from(LOCK_BACKSTOP_SCANS) + 1);
    }
}
