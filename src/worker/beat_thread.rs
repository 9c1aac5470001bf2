//! A worker's heartbeats from a thread of their own: [`BeatThread`].
//!
//! An engine written in a language whose runtime can stop every thread it
//! runs (CPython: a C call that holds the GIL and never returns) cannot beat
//! from one of its own threads and still be told apart from a dead one. A
//! beat thread is a plain OS thread that runs none of that runtime's code:
//! such an engine keeps beating through the hang, so it is judged by its
//! progress (`Stalled`, with its stacks dumped) instead of timing out
//! silently.

use crate::error::{Error, Result};
use crate::event::Reason;
use crate::worker::handle::Worker;
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

/// What a beat thread does once it sees its registration end: called once,
/// in the beat thread, with the reason when the slot still says it.
pub type OnEnd = Box<dyn FnOnce(Option<Reason>) + Send>;

/// Beats a [`Worker`] every `interval` from a thread of its own until the
/// registration ends, the worker is dropped, or this is stopped or dropped.
///
/// It holds the worker weakly: dropping (or deregistering) the last
/// [`Arc`] ends the thread at its next beat.
///
/// # Examples
///
/// ```
/// use livereg::{BeatThread, Table, TableOptions};
/// use std::sync::Arc;
/// use std::time::Duration;
///
/// let table = Table::in_memory(&TableOptions::default())?;
/// let worker = Arc::new(table.register(1, "engine")?);
/// let beats = BeatThread::start(&worker, Duration::from_millis(5), None)?;
/// std::thread::sleep(Duration::from_millis(50)); // a frozen caller still beats
/// beats.stop();
/// # Ok::<(), livereg::Error>(())
/// ```
pub struct BeatThread {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

impl BeatThread {
    /// Starts beating `worker` every `interval` (at least 1 ms); `on_end`
    /// runs in the thread once it sees the registration ended.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a zero interval; [`Error::Io`] when
    /// the thread cannot be started.
    pub fn start(
        worker: &Arc<Worker>,
        interval: Duration,
        on_end: Option<OnEnd>,
    ) -> Result<BeatThread> {
        if interval.is_zero() {
            return Err(Error::InvalidArgument(
                "a beat thread's interval must be > 0, got 0".into(),
            ));
        }
        let interval = interval.max(Duration::from_millis(1));
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let weak = Arc::downgrade(worker);
        let stopping = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name(format!("livereg-beat-{}", worker.instance_id()))
            .spawn(move || beat_until_ended(&weak, interval, &stopping, on_end))
            .map_err(|source| Error::Io {
                context: format!(
                    "starting the beat thread of instance {}",
                    worker.instance_id()
                ),
                source,
            })?;
        Ok(BeatThread {
            stop,
            thread: Some(thread),
        })
    }

    /// Stops the thread and waits for it (at most one beat).
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        let (stopped, wake) = &*self.stop;
        *stopped
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = true;
        wake.notify_all();
        if let Some(thread) = self.thread.take() {
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
    }
}

impl Drop for BeatThread {
    fn drop(&mut self) {
        self.halt();
    }
}

fn beat_until_ended(
    worker: &Weak<Worker>,
    interval: Duration,
    stop: &(Mutex<bool>, Condvar),
    on_end: Option<OnEnd>,
) {
    let (stopped, wake) = stop;
    loop {
        let Some(worker) = worker.upgrade() else {
            return; // dropped or deregistered
        };
        let beat = worker.heartbeat();
        drop(worker);
        if let Err(error) = beat {
            if let (Error::Evicted { reason, .. }, Some(on_end)) = (error, on_end) {
                on_end(reason);
            }
            return;
        }
        let guard = stopped
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let (guard, _) = wake
            .wait_timeout_while(guard, interval, |stopped| !*stopped)
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if *guard {
            return;
        }
    }
}

/// Raises `signal` in the calling thread, for an [`OnEnd`] that has a
/// runtime's handler report (Python's `faulthandler.register` dumps every
/// thread's stack, even while another thread holds the GIL): the handler
/// has run when this returns.
///
/// # Errors
///
/// [`Error::Io`] for a signal number the kernel refuses.
pub fn raise_in_this_thread(signal: i32) -> Result<()> {
    crate::os::signal::raise_here(signal).map_err(|source| Error::Io {
        context: format!("raising signal {signal} in the beat thread"),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::handle::Table;
    use crate::table::options::TableOptions;
    use std::sync::mpsc;
    use std::time::Instant;

    fn table() -> Table {
        Table::in_memory(&TableOptions::default()).unwrap()
    }

    #[test]
    #[cfg_attr(miri, ignore)] // waits on a clock
    fn it_beats_while_the_caller_does_nothing() {
        let table = table();
        let worker = Arc::new(table.register(1, "engine").unwrap());
        let beats = BeatThread::start(&worker, Duration::from_millis(2), None).unwrap();
        let slot = table.status().unwrap().registrations[0].heartbeats;
        let deadline = Instant::now() + Duration::from_secs(10);
        while table.status().unwrap().registrations[0].heartbeats < slot + 3 {
            assert!(Instant::now() < deadline, "no beats from the thread");
            std::thread::sleep(Duration::from_millis(2));
        }
        beats.stop();
    }

    #[test]
    #[cfg_attr(miri, ignore)] // waits on a clock
    fn an_ended_registration_is_reported_once_with_its_reason_and_ends_the_thread() {
        let options = TableOptions {
            reap_timeout: Duration::from_millis(400),
            progress_timeout: Duration::from_millis(200),
            ..TableOptions::default()
        };
        let table = Table::in_memory(&options).unwrap();
        let reaper = table.reaper().spawn().unwrap();
        let worker = Arc::new(table.register(2, "engine").unwrap());
        worker.set_busy(true).unwrap(); // and never a step: it stalls
        let (told, heard) = mpsc::channel();
        let beats = BeatThread::start(
            &worker,
            Duration::from_millis(1),
            Some(Box::new(move |reason| told.send(reason).unwrap())),
        )
        .unwrap();
        let reason = heard.recv_timeout(Duration::from_secs(30)).unwrap();
        assert_eq!(reason, Some(Reason::Stalled));
        assert!(matches!(
            heard.recv_timeout(Duration::from_secs(1)),
            Err(mpsc::RecvTimeoutError::Disconnected) // the thread ended
        ));
        beats.stop();
        reaper.stop().unwrap();
    }

    #[test]
    #[cfg_attr(miri, ignore)] // waits on a clock
    fn dropping_the_worker_ends_the_thread_without_a_report() {
        let table = table();
        let worker = Arc::new(table.register(3, "engine").unwrap());
        let (told, heard) = mpsc::channel::<Option<Reason>>();
        let beats = BeatThread::start(
            &worker,
            Duration::from_millis(1),
            Some(Box::new(move |reason| told.send(reason).unwrap())),
        )
        .unwrap();
        drop(worker);
        assert!(matches!(
            heard.recv_timeout(Duration::from_secs(10)),
            Err(mpsc::RecvTimeoutError::Disconnected)
        ));
        beats.stop();
    }

    #[test]
    fn a_zero_interval_is_refused() {
        let table = table();
        let worker = Arc::new(table.register(4, "engine").unwrap());
        let error = BeatThread::start(&worker, Duration::ZERO, None)
            .err()
            .unwrap();
        assert!(error.to_string().contains("got 0"), "{error}");
    }
}
