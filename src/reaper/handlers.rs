//! Running the drop and clear handlers, then freeing the slots of the
//! registrations they were for: inline on the scanning thread (a reaper the
//! caller drives), or on a pool of handler threads (a reaper thread), where
//! each drop runs as soon as it is queued, beside any that are still running:
//! a slow handler delays only its own registration's slot, never a scan nor
//! another registration's drop.

use crate::error::Result;
use crate::event::DropEvent;
use crate::os::fork;
use crate::sync::Ordering::{AcqRel, Relaxed};
use crate::table::inside_handlers::InsideHandlers;
use crate::table::memory::TableMemory;
use crate::table::protocol;
use std::cell::Cell;
use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// What a failing handler returns.
pub type HandlerError = Box<dyn std::error::Error + Send + Sync>;
pub(crate) type DropHandler = Box<dyn Fn(&DropEvent) -> Result<(), HandlerError> + Send + Sync>;
pub(crate) type ClearHandler = Box<dyn Fn() -> Result<(), HandlerError> + Send + Sync>;

/// How long a handler may run before it is logged and counted as overdue.
pub const HANDLER_DEADLINE: Duration = Duration::from_secs(30);

/// How long an idle handler thread beyond the first waits for work.
const IDLE_THREAD_LINGER: Duration = Duration::from_secs(5);

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The handlers of one reaper, and what they need to finish a drop.
pub(crate) struct Handlers {
    pub memory: Arc<TableMemory>,
    pub drop_handlers: Vec<DropHandler>,
    pub dying_handlers: Vec<DropHandler>,
    pub clear_handlers: Vec<ClearHandler>,
    pub running: Running,
}

/// The jobs running now, for the overdue check.
pub(crate) struct Running {
    deadline_ns: u64,
    jobs: Mutex<HashMap<u64, RunningJob>>,
    next: Mutex<u64>,
}

struct RunningJob {
    since_ns: u64,
    what: String,
    counted: bool,
}

impl Running {
    pub(crate) fn new(deadline: Duration) -> Running {
        Running {
            deadline_ns: crate::clock::duration_ns(deadline),
            jobs: Mutex::new(HashMap::new()),
            next: Mutex::new(0),
        }
    }

    fn begin(&self, what: String) -> u64 {
        let id = {
            let mut next = lock(&self.next);
            *next += 1;
            *next
        };
        let job = RunningJob {
            since_ns: crate::os::clock::monotonic_ns(),
            what,
            counted: false,
        };
        lock(&self.jobs).insert(id, job);
        id
    }

    fn end(&self, id: u64, inner: &TableMemory) {
        self.check_overdue(inner);
        lock(&self.jobs).remove(&id);
    }

    /// Counts and logs, once per job, every job running past the deadline.
    pub(crate) fn check_overdue(&self, inner: &TableMemory) {
        let now = crate::os::clock::monotonic_ns();
        for job in lock(&self.jobs).values_mut() {
            if job.counted || now.saturating_sub(job.since_ns) <= self.deadline_ns {
                continue;
            }
            job.counted = true;
            inner.header().handlers_overdue.fetch_add(1, Relaxed);
            log::warn!(
                "table '{}': a handler for {} has run for over {:?}; its slot stays held until it returns",
                inner.name,
                job.what,
                Duration::from_nanos(self.deadline_ns)
            );
        }
    }
}

impl Handlers {
    /// Runs every drop handler for `event`, then frees its slot and counts
    /// the ending. Returns the handlers that failed.
    pub(crate) fn drop_registration(&self, event: &DropEvent) -> u32 {
        let inner = &self.memory;
        let job = self.running.begin(format!(
            "instance {} ({}, slot {})",
            event.instance_id, event.reason, event.slot
        ));
        let mut failures = 0;
        {
            let _inside = InsideHandlers::enter(inner);
            for handler in &self.drop_handlers {
                if let Err(cause) = isolate(|| handler(event)) {
                    failures += 1;
                    log::warn!(
                        "table '{}': drop handler failed for instance {} ({}): {cause}",
                        inner.name,
                        event.instance_id,
                        event.reason
                    );
                }
            }
        }
        self.running.end(job, inner);
        let header = inner.header();
        if protocol::release(inner.slot(event.slot), event.generation) {
            header.ended_counter(event.reason).fetch_add(1, Relaxed);
        } else {
            log::warn!(
                "table '{}': slot {} changed under its drop (generation {}): not freed",
                inner.name,
                event.slot,
                event.generation
            );
        }
        header
            .handler_failures
            .fetch_add(u64::from(failures), Relaxed);
        inner.announce_settled();
        failures
    }

    /// Runs every dying handler for `event` (its process began to die; the
    /// registration stays until it has ended). Returns the handlers that
    /// failed.
    pub(crate) fn report_dying(&self, event: &DropEvent) -> u32 {
        let inner = &self.memory;
        let job = self.running.begin(format!(
            "instance {} (dying, slot {})",
            event.instance_id, event.slot
        ));
        let mut failures = 0;
        {
            let _inside = InsideHandlers::enter(inner);
            for handler in &self.dying_handlers {
                if let Err(cause) = isolate(|| handler(event)) {
                    failures += 1;
                    log::warn!(
                        "table '{}': dying handler failed for instance {}: {cause}",
                        inner.name,
                        event.instance_id
                    );
                }
            }
        }
        self.running.end(job, inner);
        inner
            .header()
            .handler_failures
            .fetch_add(u64::from(failures), Relaxed);
        failures
    }

    /// Runs the clear handlers, then marks clear `ticket` completed.
    pub(crate) fn complete_clear(&self, ticket: u64) -> u32 {
        let inner = &self.memory;
        let job = self.running.begin("a clear".to_owned());
        let mut failures = 0;
        {
            let _inside = InsideHandlers::enter(inner);
            for handler in &self.clear_handlers {
                if let Err(cause) = isolate(handler) {
                    failures += 1;
                    log::warn!("table '{}': clear handler failed: {cause}", inner.name);
                }
            }
        }
        self.running.end(job, inner);
        let header = inner.header();
        header
            .handler_failures
            .fetch_add(u64::from(failures), Relaxed);
        header.clear_completed.fetch_max(ticket, AcqRel);
        inner.announce_settled();
        failures
    }
}

/// A drop or a clear completion, queued for the handler threads.
pub(crate) enum Job {
    Drop(DropEvent),
    /// A registration whose process began to die: its drop, queued after,
    /// waits for it.
    Dying(DropEvent),
    /// Runs once every drop queued before it has finished.
    Clear(u64),
}

/// Handler threads: a job starts as soon as it is queued, on an idle thread
/// or a new one, so a stuck handler never holds up the next drop.
pub(crate) struct HandlerPool {
    pool: Arc<Pool>,
    fork_epoch: u64,
}

struct Pool {
    handlers: Handlers,
    state: Mutex<PoolState>,
    /// Signalled when a job is queued or the pool closes.
    work: Condvar,
    /// Signalled when a job finishes or a thread leaves.
    done: Condvar,
}

#[derive(Default)]
struct PoolState {
    queue: VecDeque<(u64, Job)>,
    next: u64,
    /// Drops queued or running, by sequence number.
    drops: BTreeSet<u64>,
    /// The registrations (slot, generation) whose dying handlers are
    /// queued or running: their drops wait.
    dying: HashSet<(u32, u32)>,
    threads: usize,
    idle: usize,
    closed: bool,
}

thread_local! {
    /// Whether this thread is one of a pool's handler threads.
    static IN_POOL: Cell<bool> = const { Cell::new(false) };
}

impl HandlerPool {
    pub(crate) fn new(handlers: Handlers) -> HandlerPool {
        HandlerPool {
            pool: Arc::new(Pool {
                handlers,
                state: Mutex::new(PoolState::default()),
                work: Condvar::new(),
                done: Condvar::new(),
            }),
            fork_epoch: fork::install(),
        }
    }

    /// Queues `job`, starting a thread for it if none is idle.
    ///
    /// # Errors
    ///
    /// The OS error of starting a thread (the job then stays queued for the
    /// threads there are).
    pub(crate) fn send(&self, job: Job) -> std::io::Result<()> {
        let mut state = lock(&self.pool.state);
        let seq = state.next;
        state.next += 1;
        match &job {
            Job::Drop(_) => {
                state.drops.insert(seq);
            }
            Job::Dying(event) => {
                state.dying.insert((event.slot, event.generation));
            }
            Job::Clear(_) => {}
        }
        state.queue.push_back((seq, job));
        let start = state.idle < state.queue.len();
        if start {
            state.threads += 1;
        }
        drop(state);
        self.pool.work.notify_one();
        if start {
            let pool = self.pool.clone();
            let spawned = std::thread::Builder::new()
                .name("livereg-handlers".into())
                .spawn(move || pool.work());
            if let Err(e) = spawned {
                lock(&self.pool.state).threads -= 1;
                return Err(e);
            }
        }
        Ok(())
    }
}

impl Pool {
    fn work(&self) {
        IN_POOL.with(|in_pool| in_pool.set(true));
        let mut state = lock(&self.state);
        loop {
            if let Some((seq, job)) = state.queue.pop_front() {
                drop(state);
                self.run(seq, job);
                state = lock(&self.state);
                state.drops.remove(&seq);
                self.done.notify_all();
                continue;
            }
            if state.closed {
                break;
            }
            state.idle += 1;
            let (next, timeout) = self
                .work
                .wait_timeout(state, IDLE_THREAD_LINGER)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            state = next;
            state.idle -= 1;
            if timeout.timed_out() && state.queue.is_empty() && state.threads > 1 {
                break;
            }
        }
        state.threads -= 1;
        self.done.notify_all();
    }

    fn run(&self, seq: u64, job: Job) {
        match job {
            Job::Drop(event) => {
                let registration = (event.slot, event.generation);
                let mut state = lock(&self.state);
                while state.dying.contains(&registration) {
                    state = self
                        .done
                        .wait(state)
                        .unwrap_or_else(|poisoned| poisoned.into_inner());
                }
                drop(state);
                self.handlers.drop_registration(&event);
            }
            Job::Dying(event) => {
                self.handlers.report_dying(&event);
                lock(&self.state)
                    .dying
                    .remove(&(event.slot, event.generation));
            }
            Job::Clear(ticket) => {
                let mut state = lock(&self.state);
                while state.drops.first().is_some_and(|&first| first < seq) {
                    state = self
                        .done
                        .wait(state)
                        .unwrap_or_else(|poisoned| poisoned.into_inner());
                }
                drop(state);
                self.handlers.complete_clear(ticket);
            }
        }
    }
}

impl HandlerPool {
    /// Counts and logs handlers running past their deadline.
    pub(crate) fn check_overdue(&self) {
        self.pool
            .handlers
            .running
            .check_overdue(&self.pool.handlers.memory);
    }
}

impl Drop for HandlerPool {
    /// Lets the queued jobs finish, then waits for the threads to leave (so
    /// the reaper role is given back only once every drop it started ran).
    fn drop(&mut self) {
        let mut state = lock(&self.pool.state);
        state.closed = true;
        self.pool.work.notify_all();
        if self.fork_epoch != fork::epoch() || IN_POOL.with(Cell::get) {
            // A forked child's copy (the threads are the parent's), or a
            // handler thread itself: nothing to wait for here.
            return;
        }
        while state.threads > 0 {
            state = self
                .pool
                .done
                .wait(state)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
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
