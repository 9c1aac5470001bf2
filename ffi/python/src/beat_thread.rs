//! `Worker.beat_in_background`: beats from a native thread, which a hang
//! holding the GIL does not stop, and a stall's stacks in the log.

use crate::errors::OrRaise;
use livereg::Reason;
use pyo3::prelude::*;
use std::io::{Read, Write};
use std::sync::{Arc, Mutex};

/// The most of a stack dump copied to stderr.
const REPORT_MAX: u64 = 256 * 1024;

/// What a stalled registration reports, in the beat thread (the GIL may be
/// held by the hung thread: nothing here touches Python).
pub(crate) struct StallReport {
    /// Raised in the beat thread: a `faulthandler.register`ed handler
    /// dumps every thread's Python stack into `file`.
    pub signal: Option<i32>,
    /// The file the handler dumps into; copied to stderr.
    pub file: Option<String>,
    /// The thread that runs the engine's steps (`threading.get_ident()`).
    pub step_thread: Option<u64>,
    pub instance_id: u64,
}

impl StallReport {
    /// Dumps and logs the stacks if the registration ended `Stalled`.
    pub(crate) fn on_end(self, reason: Option<Reason>) {
        if reason != Some(Reason::Stalled) {
            return;
        }
        if let Some(signal) = self.signal {
            if let Err(error) = livereg::raise_in_this_thread(signal) {
                log::warn!("instance {}: no stack dump: {error}", self.instance_id);
            }
        }
        let dump = self.file.as_deref().map(read_bounded).unwrap_or_default();
        let hung = self
            .step_thread
            .and_then(|thread| hung_frame(&dump, thread))
            .map_or_else(
                || "its stacks follow".to_string(),
                |frame| format!("its step hangs in {}", frame.trim()),
            );
        let mut stderr = std::io::stderr().lock();
        let _ = writeln!(
            stderr,
            "livereg: instance {} (pid {}) stalled: busy with no progress for the table's progress timeout; {hung}",
            self.instance_id,
            std::process::id()
        );
        let _ = stderr.write_all(dump.as_bytes());
        let _ = stderr.flush();
    }
}

fn read_bounded(path: &str) -> String {
    let mut text = String::new();
    if let Ok(file) = std::fs::File::open(path) {
        let _ = file.take(REPORT_MAX).read_to_string(&mut text);
    }
    text
}

/// The innermost frame of `thread` in a `faulthandler` dump: the first
/// `File` line after the thread's heading (`Thread 0x…` or `Current thread
/// 0x…`).
fn hung_frame(dump: &str, thread: u64) -> Option<&str> {
    let heading = format!("thread 0x{thread:016x}");
    let mut lines = dump.lines();
    lines.find(|line| {
        line.to_ascii_lowercase().starts_with(&heading)
            || line
                .to_ascii_lowercase()
                .starts_with(&format!("current {heading}"))
    })?;
    lines
        .take_while(|line| !line.is_empty())
        .find(|line| line.trim_start().starts_with("File "))
}

/// Beats a registration from a native thread: `Worker.beat_in_background`.
#[pyclass(frozen, module = "livereg", name = "BeatThread")]
pub struct BeatThread {
    thread: Mutex<Option<livereg::BeatThread>>,
}

impl BeatThread {
    pub(crate) fn start(
        worker: &Arc<livereg::Worker>,
        interval: std::time::Duration,
        report: StallReport,
    ) -> PyResult<BeatThread> {
        let on_end: livereg::OnEnd = Box::new(move |reason| report.on_end(reason));
        let thread = livereg::BeatThread::start(worker, interval, Some(on_end)).or_raise()?;
        Ok(BeatThread {
            thread: Mutex::new(Some(thread)),
        })
    }
}

#[pymethods]
impl BeatThread {
    /// Stops the beats (waits at most one interval).
    fn stop(&self, py: Python<'_>) {
        let thread = self
            .thread
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        if let Some(thread) = thread {
            py.detach(move || thread.stop());
        }
    }
}
