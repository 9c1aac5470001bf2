//! Running the drop and clear handlers, then freeing the slots of the
//! registrations they were for: inline on the scanning thread (a reaper the
//! caller drives), or on a thread of their own (a reaper thread), so that a
//! slow handler delays only its own registration's slot, never a scan.

use crate::error::Result;
use crate::event::DropEvent;
use crate::fork;
use crate::protocol;
use crate::sync::Ordering::{AcqRel, Relaxed};
use crate::table::Inner;
use std::cell::RefCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// What a failing handler returns.
pub type HandlerError = Box<dyn std::error::Error + Send + Sync>;
pub(crate) type DropHandler = Box<dyn FnMut(&DropEvent) -> Result<(), HandlerError> + Send>;
pub(crate) type ClearHandler = Box<dyn FnMut() -> Result<(), HandlerError> + Send>;

/// How long a handler may run before it is logged and counted as overdue.
pub const HANDLER_DEADLINE: Duration = Duration::from_secs(30);

/// The handlers of one reaper, and what they need to finish a drop.
pub(crate) struct Handlers {
    pub inner: Arc<Inner>,
    pub drop_handlers: Vec<DropHandler>,
    pub clear_handlers: Vec<ClearHandler>,
    pub running: Arc<Running>,
}

/// What the handlers are doing now, for the overdue check.
#[derive(Default)]
pub(crate) struct Running {
    /// Monotonic start of the running job (ns), 0 when idle.
    since_ns: AtomicU64,
    /// Jobs started, and the last one counted as overdue.
    started: AtomicU64,
    counted: AtomicU64,
    what: Mutex<String>,
    deadline_ns: AtomicU64,
}

impl Running {
    pub(crate) fn new(deadline: Duration) -> Running {
        let running = Running::default();
        running
            .deadline_ns
            .store(crate::clock::duration_ns(deadline), Relaxed);
        running
    }

    fn begin(&self, what: String) {
        *self.what.lock().unwrap_or_else(|p| p.into_inner()) = what;
        self.started.fetch_add(1, Relaxed);
        self.since_ns
            .store(crate::clock::monotonic_ns(), Ordering::Release);
    }

    fn end(&self, inner: &Inner) {
        self.check_overdue(inner);
        self.since_ns.store(0, Ordering::Release);
    }

    /// Counts and logs, once per job, a job running past the deadline.
    pub(crate) fn check_overdue(&self, inner: &Inner) {
        let since = self.since_ns.load(Ordering::Acquire);
        let deadline = self.deadline_ns.load(Relaxed);
        if since == 0 || crate::clock::monotonic_ns().saturating_sub(since) <= deadline {
            return;
        }
        let job = self.started.load(Relaxed);
        if self.counted.swap(job, AcqRel) == job {
            return;
        }
        inner.header().handlers_overdue.fetch_add(1, Relaxed);
        log::warn!(
            "table '{}': a handler for {} has run for over {:?}; its slot stays held until it returns",
            inner.name,
            self.what.lock().unwrap_or_else(|p| p.into_inner()),
            Duration::from_nanos(deadline)
        );
    }
}

impl Handlers {
    /// Runs every drop handler for `event`, then frees its slot and counts
    /// the ending. Returns the handlers that failed.
    pub(crate) fn drop_registration(&mut self, event: &DropEvent) -> u32 {
        let inner = self.inner.clone();
        self.running.begin(format!(
            "instance {} ({}, slot {})",
            event.instance_id, event.reason, event.slot
        ));
        let mut failures = 0;
        {
            let _inside = InsideHandlers::enter(&inner);
            for handler in &mut self.drop_handlers {
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
        self.running.end(&inner);
        let header = inner.header();
        if protocol::release(inner.slot(event.slot), event.generation) {
            header.ended[event.reason.index()].fetch_add(1, Relaxed);
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

    /// Runs the clear handlers, then marks clear `ticket` completed.
    pub(crate) fn complete_clear(&mut self, ticket: u64) -> u32 {
        let inner = self.inner.clone();
        self.running.begin("a clear".to_owned());
        let mut failures = 0;
        {
            let _inside = InsideHandlers::enter(&inner);
            for handler in &mut self.clear_handlers {
                if let Err(cause) = isolate(handler) {
                    failures += 1;
                    log::warn!("table '{}': clear handler failed: {cause}", inner.name);
                }
            }
        }
        self.running.end(&inner);
        let header = inner.header();
        header
            .handler_failures
            .fetch_add(u64::from(failures), Relaxed);
        header.clear_completed.fetch_max(ticket, AcqRel);
        inner.announce_settled();
        failures
    }
}

/// A drop or a clear completion, queued for the handler thread.
pub(crate) enum Job {
    Drop(DropEvent),
    Clear(u64),
}

/// The handlers on a thread of their own, fed in order.
pub(crate) struct HandlerThread {
    jobs: Option<mpsc::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
    fork_epoch: u64,
}

impl HandlerThread {
    pub(crate) fn start(mut handlers: Handlers) -> std::io::Result<HandlerThread> {
        let (jobs, queue) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("livereg-handlers".into())
            .spawn(move || {
                for job in queue {
                    match job {
                        Job::Drop(event) => handlers.drop_registration(&event),
                        Job::Clear(ticket) => handlers.complete_clear(ticket),
                    };
                }
            })?;
        Ok(HandlerThread {
            jobs: Some(jobs),
            thread: Some(thread),
            fork_epoch: fork::install(),
        })
    }

    pub(crate) fn send(&self, job: Job) {
        if let Some(jobs) = &self.jobs {
            // The thread lives as long as the sender: the send cannot fail.
            let _ = jobs.send(job);
        }
    }
}

impl Drop for HandlerThread {
    /// Lets the queued jobs finish, then joins the thread (so the reaper role
    /// is given back only once every drop it started has run).
    fn drop(&mut self) {
        self.jobs = None;
        let Some(thread) = self.thread.take() else {
            return;
        };
        if self.fork_epoch != fork::epoch() || thread.thread().id() == std::thread::current().id() {
            // A forked child's copy (the thread is the parent's), or the
            // handler thread itself: nothing to wait for here.
            std::mem::forget(thread);
            return;
        }
        let _ = thread.join();
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
