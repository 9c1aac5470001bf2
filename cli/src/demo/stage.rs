//! The demo's stage: its timing, the worker processes it starts, what it
//! hears from its reaper and workers, and the checks it keeps.

use crate::support::duration;
use crate::support::signals;
use livereg::{DropEvent, Reason, Table};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, ExitCode, Stdio};
use std::sync::mpsc::{self, Receiver, Sender};
use std::time::{Duration, Instant};

pub(super) const TIMEOUT: Duration = Duration::from_millis(1000);
pub(super) const GRACE: Duration = Duration::from_millis(2000);
pub(super) const BEAT_EVERY: Duration = Duration::from_millis(200);
/// Slack for scheduling on a loaded 2-core machine, added to every bound.
pub(super) const SLACK: Duration = Duration::from_millis(250);
/// How long a busy engine may make no progress.
pub(super) const PROGRESS_TIMEOUT: Duration = Duration::from_millis(1000);

/// What a step of the story returns.
pub(super) type Step = Result<(), Box<dyn std::error::Error>>;

/// How often the reaper scans.
pub(super) fn scan_interval() -> Duration {
    TIMEOUT / livereg::SCANS_PER_TIMEOUT
}

/// The latest a silent worker is evicted: a timeout and a scan.
pub(super) fn eviction_bound() -> Duration {
    TIMEOUT + scan_interval()
}

/// What the demo hears: drop events and clears from its reaper, lines from
/// its workers.
pub(super) enum DemoEvent {
    Dropped(DropEvent),
    Cleared,
    Said(u64, String),
}

/// A worker process the demo started (this binary in its hidden `worker`
/// mode), and the pipe it waits on.
pub(super) struct WorkerProcess {
    pub(super) id: u64,
    pub(super) child: Child,
    pub(super) stdin: Option<ChildStdin>,
}

/// One line of the summary.
pub(super) struct Check {
    pub(super) scenario: String,
    pub(super) instance: u64,
    pub(super) expected: String,
    pub(super) observed: String,
    pub(super) took: Option<Duration>,
    pub(super) bound: String,
    pub(super) ok: bool,
}

pub(super) struct Demo {
    pub(super) table: Table,
    pub(super) heard: Receiver<(DemoEvent, Instant)>,
    pub(super) backlog: Vec<(DemoEvent, Instant)>,
    pub(super) checks: Vec<Check>,
    pub(super) fancy: bool,
    pub(super) started: Instant,
    pub(super) interrupted: bool,
}

/// Removes the private table however the demo ends.
pub(super) struct Unlink(pub(super) String);

impl Drop for Unlink {
    fn drop(&mut self) {
        let _ = Table::unlink(&self.0);
    }
}

pub(super) fn spawn_worker(
    table: &str,
    id: u64,
    tell: &Sender<(DemoEvent, Instant)>,
    extra: &[&str],
) -> Result<WorkerProcess, Box<dyn std::error::Error>> {
    let mut child = Command::new(std::env::current_exe()?)
        .args([
            "worker",
            table,
            "--instance",
            &id.to_string(),
            "--label",
            &format!("gpu{id}"),
        ])
        .args([
            "--interval",
            &format!("{}ms", BEAT_EVERY.as_millis()),
            "--reregister",
            "--until-stdin-closes",
        ])
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let stdout = child.stdout.take().expect("piped stdout");
    let tell = tell.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tell
                .send((DemoEvent::Said(id, line), Instant::now()))
                .is_err()
            {
                break;
            }
        }
    });
    let stdin = child.stdin.take();
    Ok(WorkerProcess { id, child, stdin })
}

pub(super) fn signal(worker: &WorkerProcess, signal: i32) {
    // SAFETY:
    // - `kill` has no memory effects; the pid is our own child, which has not
    //   been waited for, so it cannot have been reused.
    unsafe { libc::kill(worker.child.id() as libc::pid_t, signal) };
}

impl Demo {
    pub(super) fn say(&self, line: &str) {
        let at = self.started.elapsed().as_secs_f64();
        if self.fancy {
            out!("\x1b[2m{at:6.2}s\x1b[0m  {line}");
        } else {
            out!("{at:6.2}s  {line}");
        }
    }

    /// Waits up to `within` for something `wanted`, keeping the rest for later.
    pub(super) fn wait_for(
        &mut self,
        what: &str,
        within: Duration,
        wanted: impl Fn(&DemoEvent) -> bool,
    ) -> Option<(DemoEvent, Instant)> {
        if let Some(at) = self.backlog.iter().position(|(heard, _)| wanted(heard)) {
            return Some(self.backlog.remove(at));
        }
        let deadline = Instant::now() + within;
        let waiting_since = Instant::now();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || self.interrupted {
                self.clear_progress();
                return None;
            }
            if signals::take().is_some() {
                self.interrupted = true;
                self.say("interrupted: stopping the workers and removing the table");
                continue;
            }
            if self.fancy {
                let mut stdout = std::io::stdout().lock();
                let _ = write!(
                    stdout,
                    "\r\x1b[K        ... waiting for {what} ({})",
                    duration::show(waiting_since.elapsed())
                );
                let _ = stdout.flush();
            }
            match self.heard.recv_timeout(left.min(Duration::from_millis(50))) {
                Ok(item) if wanted(&item.0) => {
                    self.clear_progress();
                    return Some(item);
                }
                Ok(item) => self.backlog.push(item),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => return None,
            }
        }
    }

    pub(super) fn clear_progress(&self) {
        if self.fancy {
            let mut stdout = std::io::stdout().lock();
            let _ = write!(stdout, "\r\x1b[K");
            let _ = stdout.flush();
        }
    }

    pub(super) fn dropped(&mut self, id: u64, within: Duration) -> Option<(DropEvent, Instant)> {
        let found = self.wait_for(
            &format!("instance {id} to be dropped"),
            within,
            |heard| matches!(heard, DemoEvent::Dropped(event) if event.instance_id == id),
        );
        match found {
            Some((DemoEvent::Dropped(event), at)) => Some((event, at)),
            _ => None,
        }
    }

    pub(super) fn said(&mut self, id: u64, prefix: &str, within: Duration) -> Option<Instant> {
        let found = self.wait_for(&format!("worker {id} to say '{prefix}'"), within, |heard| {
            matches!(heard, DemoEvent::Said(who, line) if *who == id && line.starts_with(prefix))
        });
        found.map(|(_, at)| at)
    }

    /// Records whether `id` ended with `expected` within `bound` of `since`.
    pub(super) fn expect_drop(
        &mut self,
        scenario: &str,
        id: u64,
        expected: Reason,
        since: Instant,
        bound: Duration,
        bound_text: &str,
    ) {
        let outcome = self.dropped(id, bound + SLACK + Duration::from_secs(2));
        let (observed, took, ok) = match &outcome {
            Some((event, at)) => {
                let took = at.saturating_duration_since(since);
                let in_bound = took <= bound + SLACK;
                let silence_ok = match expected {
                    Reason::Timeout => event.silent_for >= TIMEOUT,
                    Reason::Stalled => event.silent_for >= PROGRESS_TIMEOUT,
                    _ => true,
                };
                (
                    event.reason.to_string(),
                    Some(took),
                    event.reason == expected && in_bound && silence_ok,
                )
            }
            None => ("not detected".to_owned(), None, false),
        };
        let mark = if ok { "ok" } else { "UNEXPECTED" };
        let detail = match &outcome {
            Some((event, _)) => format!(
                "{} after {} (silent {}), bound {bound_text} (+{} slack): {mark}",
                event.reason,
                duration::show(took.unwrap_or_default()),
                duration::show(event.silent_for),
                duration::show(SLACK)
            ),
            None => format!(
                "not detected within {}: {mark}",
                duration::show(bound + SLACK)
            ),
        };
        self.say(&format!("  -> instance {id} dropped: {detail}"));
        self.checks.push(Check {
            scenario: scenario.to_owned(),
            instance: id,
            expected: expected.to_string(),
            observed,
            took,
            bound: bound_text.to_owned(),
            ok,
        });
    }

    pub(super) fn expect(
        &mut self,
        scenario: &str,
        instance: u64,
        expected: &str,
        observed: Option<Duration>,
        bound: Duration,
    ) {
        let ok = observed.is_some_and(|took| took <= bound + SLACK);
        self.checks.push(Check {
            scenario: scenario.to_owned(),
            instance,
            expected: expected.to_owned(),
            observed: if observed.is_some() {
                expected.to_owned()
            } else {
                "not seen".to_owned()
            },
            took: observed,
            bound: duration::show(bound),
            ok,
        });
    }

    /// Stops the scenarios once the demo was interrupted.
    pub(super) fn go_on(&self) -> Result<(), Box<dyn std::error::Error>> {
        if self.interrupted {
            Err("interrupted".into())
        } else {
            Ok(())
        }
    }

    pub(super) fn summary(&self) -> ExitCode {
        out!("");
        out!(
            "{:<26} {:>8}  {:<17} {:<17} {:>9}  {:<20} RESULT",
            "SCENARIO",
            "INSTANCE",
            "EXPECTED",
            "OBSERVED",
            "TOOK",
            "BOUND"
        );
        for check in &self.checks {
            out!(
                "{:<26} {:>8}  {:<17} {:<17} {:>9}  {:<20} {}",
                check.scenario,
                check.instance,
                check.expected,
                check.observed,
                check.took.map(duration::show).unwrap_or("-".into()),
                check.bound,
                if check.ok { "ok" } else { "FAILED" }
            );
        }
        let failed = self.checks.iter().filter(|c| !c.ok).count() + usize::from(self.interrupted);
        let status = match self.table.status() {
            Ok(status) => status,
            Err(error) => {
                note!("livereg demo: {error}");
                return ExitCode::FAILURE;
            }
        };
        out!(
            "(each bound is checked with {} of slack for scheduling on a loaded machine)",
            duration::show(SLACK)
        );
        out!("");
        out!(
            "{} checks, {failed} failed; ended by reason: {}; handler failures {}",
            self.checks.len(),
            status
                .ended
                .iter()
                .filter(|(_, n)| **n > 0)
                .map(|(r, n)| format!("{r} {n}"))
                .collect::<Vec<_>>()
                .join(", "),
            status.handler_failures
        );
        if failed == 0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        }
    }
}
