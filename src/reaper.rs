//! The reaper: scans the slots, ends what went silent or whose process exited,
//! runs the drop handlers, then frees the slots.

use crate::clock::{monotonic_ns, Clock};
use crate::error::Result;
use crate::event::{DropEvent, Reason};
use crate::exit_watch::ExitWatcher;
use crate::layout::Slot;
use crate::os::lock;
use crate::protocol::{self, Beat, Gone, CLAIMING, FREE, LIVE};
use crate::sync::Ordering::{AcqRel, Acquire, Relaxed, Release};
use crate::table::{Inner, ReaperRole, Table};
use std::cell::RefCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Duration;

/// What a failing handler returns.
pub type HandlerError = Box<dyn std::error::Error + Send + Sync>;
type DropHandler = Box<dyn FnMut(&DropEvent) -> Result<(), HandlerError> + Send>;
type ClearHandler = Box<dyn FnMut() -> Result<(), HandlerError> + Send>;

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
}

impl Table {
    /// Starts configuring this table's reaper; it reads time from this
    /// handle's clock.
    pub fn reaper(&self) -> ReaperBuilder {
        ReaperBuilder {
            table: self.clone(),
            drop_handlers: Vec::new(),
            clear_handlers: Vec::new(),
        }
    }
}

impl ReaperBuilder {
    /// Adds a drop-state handler, called once for every registration that
    /// ends. A handler that returns an error or panics is counted and logged
    /// in [`Status::handler_failures`](crate::Status); the others still run.
    pub fn on_drop<F>(mut self, handler: F) -> Self
    where
        F: FnMut(&DropEvent) -> Result<(), HandlerError> + Send + 'static,
    {
        self.drop_handlers.push(Box::new(handler));
        self
    }

    /// Adds a clear handler, called once per completed clear, after the drop
    /// handlers of the registrations the clear ended.
    pub fn on_clear<F>(mut self, handler: F) -> Self
    where
        F: FnMut() -> Result<(), HandlerError> + Send + 'static,
    {
        self.clear_handlers.push(Box::new(handler));
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
    /// - [`Error::Busy`](crate::Error::Busy): another reaper holds the table
    ///   (in any process, or through another handle in this one).
    /// - [`Error::Io`](crate::Error::Io): the lock could not be taken.
    pub fn build(self) -> Result<Reaper> {
        let inner = &self.table.inner;
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
        inner.announce_settled();
        // Shared tables: watch registered processes through pidfds, so an
        // exit wakes the reaper at once and live watched processes need no
        // lock check per scan (without pidfd support, locks catch every exit).
        let watcher = match role.lock {
            Some(_) => ExitWatcher::start(inner.clone()).ok(),
            None => None,
        };
        Ok(Reaper {
            seen: vec![Seen::NONE; inner.capacity as usize],
            timeout_ns: header.reap_timeout_ns.load(Relaxed),
            grace_ns: header.registration_grace_ns.load(Relaxed),
            clock_id: self.table.clock.identity(),
            table: self.table,
            role,
            drop_handlers: self.drop_handlers,
            clear_handlers: self.clear_handlers,
            watcher,
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
}

impl Seen {
    /// An impossible beat word (generation tag 0xFFFF with an unknown end
    /// marker), so the first real word always counts as new.
    const NONE: Seen = Seen {
        word: u64::MAX,
        first_seen: 0,
    };
}

/// The outcome of one scan.
#[derive(Debug, Default)]
pub struct ScanReport {
    /// The registrations that ended, as their handlers saw them.
    pub ended: Vec<DropEvent>,
    /// Handlers that failed or panicked in this scan.
    pub handler_failures: u32,
    /// Slots whose contents no writer of ours produces, skipped.
    pub corrupt_slots: u32,
    /// Whether this scan carried out a clear.
    pub cleared: bool,
}

/// The one reaper of a table: holds the reaper role until dropped.
pub struct Reaper {
    table: Table,
    role: ReaperRole,
    drop_handlers: Vec<DropHandler>,
    clear_handlers: Vec<ClearHandler>,
    seen: Vec<Seen>,
    timeout_ns: u64,
    grace_ns: u64,
    /// The identity of the clock this reaper reads: only stamps of that
    /// clock are trusted.
    clock_id: u64,
    /// Watches registered processes through pidfds (shared tables).
    watcher: Option<ExitWatcher>,
}

impl Reaper {
    /// One scan at time `now_ns` (on the table clock): carries out a pending
    /// clear, ends every registration that has been silent for its budget or
    /// whose process has exited, and every one already ended (deregistered,
    /// replaced, or left by a reaper that died mid-drop); runs the drop
    /// handlers outside any lock; then frees those slots.
    ///
    /// # Errors
    ///
    /// - [`Error::Corrupt`](crate::Error::Corrupt) if the object was
    ///   truncated (checked before any slot is read; nothing is done then).
    /// - [`Error::Busy`](crate::Error::Busy) in a forked child: the role
    ///   stays the parent's.
    pub fn scan_once(&mut self, now_ns: u64) -> Result<ScanReport> {
        let started = monotonic_ns();
        let inner = self.table.inner.clone();
        if !self.role.held_here() {
            return Err(crate::Error::Busy(format!(
                "table '{}': this reaper was inherited through fork: the role is the parent's; build a reaper in the child",
                inner.name
            )));
        }
        inner.check_size()?;
        let header = inner.header();
        header.reaper_heartbeat_ns.store(now_ns, Release);
        if let Some(watcher) = &mut self.watcher {
            watcher.collect_fired();
        }
        let clear_ticket = header.clear_requested.load(Acquire);
        let served = header
            .clear_completed
            .load(Acquire)
            .max(header.clear_expired.load(Acquire));
        let clearing = clear_ticket > served;
        let mut report = ScanReport {
            cleared: clearing,
            ..ScanReport::default()
        };

        for index in 0..inner.capacity {
            let slot = inner.slot(index);
            let (generation, phase) = protocol::split_state(slot.state.load(Acquire));
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
            match self.judge(index, slot, generation, now_ns, clearing) {
                Verdict::Keep => {}
                Verdict::Corrupt => report.corrupt_slots += 1,
                Verdict::Ended(reason, silent_ns) => {
                    report
                        .ended
                        .push(drop_event(slot, index, generation, reason, silent_ns));
                }
            }
        }

        for event in &report.ended {
            report.handler_failures += self.run_drop_handlers(event);
        }
        for event in &report.ended {
            if let Some(watcher) = &mut self.watcher {
                watcher.forget(event.slot);
            }
            if protocol::release(inner.slot(event.slot), event.generation) {
                header.ended[event.reason.index()].fetch_add(1, Relaxed);
            } else {
                report.corrupt_slots += 1;
            }
        }
        if clearing {
            report.handler_failures += self.run_clear_handlers();
            header.clear_completed.fetch_max(clear_ticket, AcqRel);
        }

        header.scans.fetch_add(1, Relaxed);
        header
            .handler_failures
            .fetch_add(u64::from(report.handler_failures), Relaxed);
        header
            .corrupt_slots
            .store(u64::from(report.corrupt_slots), Relaxed);
        header
            .last_scan_duration_ns
            .store(monotonic_ns().saturating_sub(started), Relaxed);
        if !report.ended.is_empty() || clearing {
            inner.announce_settled();
        }
        Ok(report)
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

    /// The boot token this reaper wrote when it took the table.
    pub fn boot_token(&self) -> u64 {
        self.table.inner.header().boot_token.load(Acquire)
    }

    /// Decides one `LIVE` slot's fate and, if it ends, makes it so.
    fn judge(
        &mut self,
        index: u32,
        slot: &Slot,
        generation: u32,
        now_ns: u64,
        clearing: bool,
    ) -> Verdict {
        let word = slot.beat.load(Acquire);
        if !protocol::beat_matches(word, generation) {
            return Verdict::Corrupt;
        }
        let (signal_ns, budget, timed_reason) = match protocol::decode_beat(word) {
            Beat::Ended(Some(reason)) => return Verdict::Ended(reason, 0),
            Beat::Ended(None) => return Verdict::Corrupt,
            Beat::Never => (
                slot.registered_ns.load(Relaxed),
                self.grace_ns,
                Reason::Grace,
            ),
            Beat::At(stamp) => (stamp.ns_near(now_ns), self.timeout_ns, Reason::Timeout),
        };
        if clearing {
            return match protocol::end(slot, generation, Reason::Cleared) {
                Ok(()) => Verdict::Ended(Reason::Cleared, 0),
                Err(Gone::Ended(Some(reason))) => Verdict::Ended(reason, 0),
                Err(_) => Verdict::Corrupt,
            };
        }
        let own_clock =
            self.clock_id != Clock::UNKNOWN && slot.clock_id.load(Relaxed) == self.clock_id;
        let last_signal = self.last_signal(index, word, own_clock.then_some(signal_ns), now_ns);
        let silent_ns = now_ns.saturating_sub(last_signal);
        let check_lock = match &mut self.watcher {
            Some(watcher) => watcher.needs_lock_check(index, generation, slot),
            None => true,
        };
        let reason = if check_lock && self.process_exited(index, generation) {
            Reason::ProcessExited
        } else if self.timeout_ns > 0 && silent_ns >= budget {
            timed_reason
        } else {
            return Verdict::Keep;
        };
        match protocol::evict(slot, generation, word, reason) {
            Ok(()) => Verdict::Ended(reason, silent_ns),
            Err(found) => match protocol::decode_beat(found) {
                // A deregistration (or another ending) got there first.
                Beat::Ended(Some(reason)) => Verdict::Ended(reason, silent_ns),
                // A heartbeat landed between our read and our CAS: it counts.
                _ => Verdict::Keep,
            },
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
            *seen = Seen {
                word,
                first_seen: now_ns,
            };
        }
        match own_stamp {
            Some(stamp) => stamp.min(now_ns),
            None => seen.first_seen,
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

    fn run_drop_handlers(&mut self, event: &DropEvent) -> u32 {
        let _inside = InsideHandlers::enter(&self.table.inner);
        let mut failures = 0;
        for handler in &mut self.drop_handlers {
            if let Err(cause) = isolate(|| handler(event)) {
                failures += 1;
                log::warn!(
                    "table '{}': drop handler failed for instance {} ({}): {cause}",
                    self.table.inner.name,
                    event.instance_id,
                    event.reason
                );
            }
        }
        failures
    }

    fn run_clear_handlers(&mut self) -> u32 {
        let _inside = InsideHandlers::enter(&self.table.inner);
        let mut failures = 0;
        for handler in &mut self.clear_handlers {
            if let Err(cause) = isolate(handler) {
                failures += 1;
                log::warn!(
                    "table '{}': clear handler failed: {cause}",
                    self.table.inner.name
                );
            }
        }
        failures
    }

    /// The scan interval of this reaper's table.
    pub(crate) fn interval(&self) -> Duration {
        Duration::from_nanos(self.timeout_ns / 4)
    }
}

thread_local! {
    /// The table whose reaper's handlers this thread is running, if any.
    static INSIDE_HANDLERS: RefCell<Option<Arc<Inner>>> = const { RefCell::new(None) };
}

/// Marks this thread as running the handlers of a table's reaper, until dropped.
struct InsideHandlers;

impl InsideHandlers {
    fn enter(inner: &Arc<Inner>) -> InsideHandlers {
        INSIDE_HANDLERS.with(|inside| *inside.borrow_mut() = Some(inner.clone()));
        InsideHandlers
    }
}

impl Drop for InsideHandlers {
    fn drop(&mut self) {
        INSIDE_HANDLERS.with(|inside| *inside.borrow_mut() = None);
    }
}

/// Refuses `what` when called from a handler of this table's reaper: it
/// would wait for the reaper, which waits for the handler.
///
/// # Errors
///
/// [`Error::Busy`](crate::Error::Busy) naming the call, inside a handler.
pub(crate) fn refuse_inside_handler(inner: &Arc<Inner>, what: &str) -> Result<()> {
    let inside = INSIDE_HANDLERS.with(|inside| {
        inside.borrow().as_ref().is_some_and(|running| {
            Arc::ptr_eq(running, inner)
                || (running.file().is_some()
                    && inner.file().is_some()
                    && running.name == inner.name)
        })
    });
    if inside {
        Err(crate::Error::Busy(format!(
            "table '{}': cannot {what} from inside a handler of its reaper: the reaper waits for the handler to return",
            inner.name
        )))
    } else {
        Ok(())
    }
}

/// Runs a handler, turning an error or a panic into a message.
fn isolate(handler: impl FnOnce() -> Result<(), HandlerError>) -> Result<(), String> {
    match catch_unwind(AssertUnwindSafe(handler)) {
        Ok(Ok(())) => Ok(()),
        Ok(Err(error)) => Err(error.to_string()),
        Err(panic) => Err(panic_message(&*panic)),
    }
}

/// What a caught panic says.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    match panic.downcast_ref::<&str>() {
        Some(message) => format!("panicked: {message}"),
        None => match panic.downcast_ref::<String>() {
            Some(message) => format!("panicked: {message}"),
            None => "panicked".to_owned(),
        },
    }
}

enum Verdict {
    Keep,
    Corrupt,
    Ended(Reason, u64),
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
        label: slot.load_label(),
        registered_ns,
        last_heartbeat_ns,
        silent_for: Duration::from_nanos(silent_ns),
    }
}
