//! The publisher: one lease (`lease.rs`), and one key per live registration
//! kept in step with the table (`mirror.rs`), from a thread beside the
//! reaper; its handles start and stop it and pass end reasons on.
//!
//! It never queues writes: each round compares a snapshot of the table with
//! what etcd holds and writes the difference, in transactions of up to 128
//! operations, so the newest state wins and an outage leaves nothing to
//! replay. The only queue is the end reasons the reaper's drop handler
//! passes on ([`EndSink`]), bounded, oldest dropped.

use super::error::EtcdError;
use super::mirror::Mirror;
use super::options::EtcdOptions;
use super::shared::{Ended, Shared, ENDS_QUEUE};
use crate::event::DropEvent;
use crate::os::fork;
use crate::table::handle::Table;
use crate::table::wake::WakeFd;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::Notify;

/// Publishes a table's live registrations to etcd until stopped (see the
/// [module](super)). Stopping revokes the lease: the keys go at once.
///
/// ```no_run
/// use livereg::etcd::{EtcdOptions, Publisher};
/// use livereg::Table;
///
/// let table = Table::open("kv-workers")?;
/// let publisher = Publisher::start(&table, EtcdOptions::new(["127.0.0.1:2379"]))?;
/// let ends = publisher.sink();
/// let reaper = table
///     .reaper()
///     .on_drop(move |event| {
///         ends.ended(event); // publish why it ended
///         Ok(())
///     })
///     .spawn()?;
/// // … serve …
/// reaper.stop()?;
/// publisher.stop();
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Publisher {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    fork_epoch: u64,
}

/// Passes end reasons from a drop handler to the publisher: cheap, never
/// blocks on etcd.
#[derive(Clone)]
pub struct EndSink(Arc<Shared>);

impl Publisher {
    /// Starts publishing `table` on a thread of its own. It connects in the
    /// background: an unreachable etcd is logged and retried, never fatal.
    ///
    /// # Errors
    ///
    /// - [`EtcdError::InvalidOptions`]: see [`EtcdOptions::validate`].
    /// - [`EtcdError::Table`]: the table was truncated.
    /// - [`EtcdError::Io`]: the thread, its runtime or its wake-up descriptor
    ///   could not be made.
    pub fn start(table: &Table, options: EtcdOptions) -> Result<Publisher, EtcdError> {
        options.validate()?;
        table.memory.check_size()?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let wake = WakeFd::start(table.memory.clone())?;
        let wake = {
            let _inside = runtime.enter();
            // SAFETY: a `WakeFd` owns its eventfd for its whole life and
            // always answers `as_raw_fd` with it; the `AsyncFd` owns the
            // `WakeFd`, so the descriptor outlives the registration.
            unsafe { AsyncFd::register_with_interest(wake, Interest::READABLE) }
                .map_err(std::io::Error::from)?
        };
        let shared = Arc::new(Shared {
            ends: Mutex::new(VecDeque::new()),
            notify: Notify::new(),
            stop: AtomicBool::new(false),
            connected: AtomicBool::new(false),
        });
        let mirror = Mirror::new(table, options, shared.clone());
        let thread = std::thread::Builder::new()
            .name("livereg-etcd".into())
            .spawn(move || runtime.block_on(mirror.run(wake)))?;
        Ok(Publisher {
            shared,
            thread: Some(thread),
            fork_epoch: fork::install(),
        })
    }

    /// A handle for the reaper's drop handler.
    pub fn sink(&self) -> EndSink {
        EndSink(self.shared.clone())
    }

    /// Whether it holds a lease on a reachable etcd now (as
    /// [`EndSink::is_connected`] tells a holder of its sink).
    pub fn is_connected(&self) -> bool {
        self.shared.connected.load(Ordering::Acquire)
    }

    /// Revokes the lease (its keys go at once, if etcd answers within 1 s;
    /// else they expire with it) and ends the thread. With etcd hung, it
    /// waits for the one request in flight (up to 3 s) and the revoke (1 s),
    /// never for the rest of a round.
    pub fn stop(mut self) {
        self.shut_down();
    }

    fn shut_down(&mut self) {
        let Some(thread) = self.thread.take() else {
            return;
        };
        if self.fork_epoch != fork::epoch() {
            // A forked child's copy: the thread is the parent's.
            std::mem::forget(thread);
            return;
        }
        self.shared.stop.store(true, Ordering::Release);
        self.shared.notify.notify_one();
        let _ = thread.join();
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.shut_down();
    }
}

impl EndSink {
    /// Whether the publisher it feeds holds a lease on a reachable etcd now
    /// (for a metrics endpoint that holds only the sink).
    pub fn is_connected(&self) -> bool {
        self.0.connected.load(Ordering::Acquire)
    }

    /// Records why a registration ended, for the last value of its key.
    pub fn ended(&self, event: &DropEvent) {
        let mut ends = self.0.ends.lock().unwrap_or_else(PoisonError::into_inner);
        if ends.len() == ENDS_QUEUE {
            ends.pop_front();
        }
        ends.push_back(Ended {
            instance_id: event.instance_id,
            slot: event.slot,
            generation: event.generation,
            reason: event.reason,
        });
        drop(ends);
        self.0.notify.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Reason;
    use std::time::Duration;

    fn ended(instance_id: u64) -> DropEvent {
        DropEvent {
            instance_id,
            slot: 0,
            generation: 0,
            reason: Reason::Timeout,
            pid: 1,
            remote: false,
            label: String::new(),
            registered_ns: 0,
            last_heartbeat_ns: None,
            silent_for: Duration::ZERO,
        }
    }

    #[test]
    fn the_end_queue_is_bounded_and_keeps_the_newest() {
        let shared = Arc::new(Shared {
            ends: Mutex::new(VecDeque::new()),
            notify: Notify::new(),
            stop: AtomicBool::new(false),
            connected: AtomicBool::new(false),
        });
        let sink = EndSink(shared.clone());
        for id in 0..ENDS_QUEUE as u64 + 10 {
            sink.ended(&ended(id));
        }
        let ends = shared.ends.lock().unwrap();
        assert_eq!(ends.len(), ENDS_QUEUE);
        assert_eq!(ends.front().map(|e| e.instance_id), Some(10));
        assert_eq!(
            ends.back().map(|e| e.instance_id),
            Some(ENDS_QUEUE as u64 + 9)
        );
    }
}
