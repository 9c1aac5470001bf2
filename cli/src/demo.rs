//! `livereg demo`: the whole system on a private table. Worker processes (this
//! binary in its hidden worker mode) register and beat; one is killed, one
//! hung, one exits cleanly; a clear runs the server's clear handler and leaves
//! the rest registered, a reset ends them and they come back, and the hung
//! one, resumed, learns it was evicted and registers again. Every ended
//! registration is checked against its expected reason and bound.

use crate::{duration, signals, Outcome};
use livereg::{DropEvent, Reason, Table, TableOptions};
use std::io::{BufRead, BufReader, IsTerminal, Write};
use std::process::{Child, ChildStdin, Command, ExitCode, Stdio};
use std::sync::mpsc::{self, Receiver, Sender};
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_millis(1000);
const GRACE: Duration = Duration::from_millis(2000);
const BEAT_EVERY: Duration = Duration::from_millis(200);
/// Slack for scheduling on a loaded 2-core machine, added to every bound.
const SLACK: Duration = Duration::from_millis(250);
/// How long a busy engine may make no progress.
const PROGRESS_TIMEOUT: Duration = Duration::from_millis(1000);

/// What a step of the story returns.
type Step = Result<(), Box<dyn std::error::Error>>;

/// How often the reaper scans.
fn scan_interval() -> Duration {
    TIMEOUT / livereg::SCANS_PER_TIMEOUT
}

/// The latest a silent worker is evicted: a timeout and a scan.
fn eviction_bound() -> Duration {
    TIMEOUT + scan_interval()
}

#[derive(clap::Args)]
pub struct Args {
    /// Number of worker processes (at least 4: killed, hung, clean, cleared).
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u64).range(4..=64))]
    workers: u64,
}

/// What the demo hears: drop events and clears from its reaper, lines from
/// its workers.
enum DemoEvent {
    Dropped(DropEvent),
    Cleared,
    Said(u64, String),
}

struct Worker {
    id: u64,
    child: Child,
    stdin: Option<ChildStdin>,
}

/// One line of the summary.
struct Check {
    scenario: String,
    instance: u64,
    expected: String,
    observed: String,
    took: Option<Duration>,
    bound: String,
    ok: bool,
}

struct Demo {
    table: Table,
    heard: Receiver<(DemoEvent, Instant)>,
    backlog: Vec<(DemoEvent, Instant)>,
    checks: Vec<Check>,
    fancy: bool,
    started: Instant,
    interrupted: bool,
}

/// Removes the private table however the demo ends.
struct Unlink(String);

impl Drop for Unlink {
    fn drop(&mut self) {
        let _ = Table::unlink(&self.0);
    }
}

pub fn run(args: Args) -> Outcome {
    signals::catch_termination();
    let name = format!("livereg-demo-{}", std::process::id());
    let options = TableOptions {
        capacity: 64,
        reap_timeout: TIMEOUT,
        registration_grace: GRACE,
        progress_timeout: PROGRESS_TIMEOUT,
        ..TableOptions::default()
    };
    let table = Table::create(&name, &options)?;
    let _unlink = Unlink(name.clone());
    let (tell, heard) = mpsc::channel();
    let from_reaper = tell.clone();
    let clears = tell.clone();
    let reaper = table
        .reaper()
        .on_drop(move |event| {
            Ok(from_reaper.send((DemoEvent::Dropped(event.clone()), Instant::now()))?)
        })
        .on_clear(move || Ok(clears.send((DemoEvent::Cleared, Instant::now()))?))
        .spawn()?;
    let mut demo = Demo {
        table,
        heard,
        backlog: Vec::new(),
        checks: Vec::new(),
        fancy: std::io::stdout().is_terminal(),
        started: Instant::now(),
        interrupted: false,
    };
    demo.say(&format!(
        "table '{name}': timeout {}, grace {}, reaper scans every {}; a silent worker is evicted within [{}, {}]",
        duration::show(TIMEOUT),
        duration::show(GRACE),
        duration::show(TIMEOUT / livereg::SCANS_PER_TIMEOUT),
        duration::show(TIMEOUT),
        duration::show(TIMEOUT + TIMEOUT / livereg::SCANS_PER_TIMEOUT)
    ));
    let mut workers: Vec<Worker> = (1..=args.workers)
        .map(|id| spawn_worker(&name, id, &tell, &[]))
        .collect::<Result<_, _>>()?;
    let result = demo.scenarios(&mut workers);
    for worker in &mut workers {
        let _ = worker.child.kill();
        let _ = worker.child.wait();
    }
    reaper.stop()?;
    result?;
    Ok(demo.summary())
}

fn spawn_worker(
    table: &str,
    id: u64,
    tell: &Sender<(DemoEvent, Instant)>,
    extra: &[&str],
) -> Result<Worker, Box<dyn std::error::Error>> {
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
    Ok(Worker { id, child, stdin })
}

fn signal(worker: &Worker, signal: i32) {
    // SAFETY:
    // - `kill` has no memory effects; the pid is our own child, which has not
    //   been waited for, so it cannot have been reused.
    unsafe { libc::kill(worker.child.id() as libc::pid_t, signal) };
}

impl Demo {
    fn say(&self, line: &str) {
        let at = self.started.elapsed().as_secs_f64();
        if self.fancy {
            out!("\x1b[2m{at:6.2}s\x1b[0m  {line}");
        } else {
            out!("{at:6.2}s  {line}");
        }
    }

    /// Waits up to `within` for something `wanted`, keeping the rest for later.
    fn wait_for(
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

    fn clear_progress(&self) {
        if self.fancy {
            let mut stdout = std::io::stdout().lock();
            let _ = write!(stdout, "\r\x1b[K");
            let _ = stdout.flush();
        }
    }

    fn dropped(&mut self, id: u64, within: Duration) -> Option<(DropEvent, Instant)> {
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

    fn said(&mut self, id: u64, prefix: &str, within: Duration) -> Option<Instant> {
        let found = self.wait_for(&format!("worker {id} to say '{prefix}'"), within, |heard| {
            matches!(heard, DemoEvent::Said(who, line) if *who == id && line.starts_with(prefix))
        });
        found.map(|(_, at)| at)
    }

    /// Records whether `id` ended with `expected` within `bound` of `since`.
    fn expect_drop(
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

    fn expect(
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

    /// A clear: the server's clear handler runs once, and the workers `kept`
    /// stay registered, beating.
    fn clear_keeps_workers(&mut self, kept: std::ops::RangeInclusive<u64>) -> Step {
        self.say("a clear is requested through the table: the server's clear handler runs; every worker keeps its registration.");
        let cleared_at = Instant::now();
        self.table.clear(Duration::from_secs(5))?;
        let handler = self
            .wait_for("the clear handler", Duration::from_secs(2), |heard| {
                matches!(heard, DemoEvent::Cleared)
            })
            .map(|(_, at)| at.saturating_duration_since(cleared_at));
        self.say(&format!(
            "  clear handler ran after {}; clear completed in {}",
            handler.map(duration::show).unwrap_or("never".into()),
            duration::show(cleared_at.elapsed())
        ));
        self.expect(
            "clear",
            0,
            "clear handler ran",
            handler,
            Duration::from_millis(5),
        );
        let live: Vec<u64> = self
            .table
            .status()?
            .registrations
            .iter()
            .map(|r| r.instance_id)
            .collect();
        for id in kept {
            let registered = live.contains(&id);
            self.say(&format!(
                "  worker {id} {}",
                if registered {
                    "is still registered"
                } else {
                    "LOST its registration"
                }
            ));
            self.expect(
                "clear keeps the worker",
                id,
                "still registered",
                registered.then_some(Duration::ZERO),
                Duration::ZERO,
            );
        }
        Ok(())
    }

    /// The story, step by step; each step checks what it showed.
    fn scenarios(&mut self, workers: &mut [Worker]) -> Step {
        self.start(workers)?;
        self.go_on()?;
        self.crash(workers)?;
        self.go_on()?;
        self.hang(workers)?;
        self.go_on()?;
        self.clean_exit(workers)?;
        self.go_on()?;
        self.clear_keeps_workers(4..=workers.len() as u64)?;
        self.go_on()?;
        self.reset_ends_workers(workers)?;
        self.go_on()?;
        self.resume_hung(workers)?;
        self.go_on()?;
        self.stall(workers)?;
        self.shutdown(workers)
    }

    /// Every worker registers and beats; a full timeout evicts none.
    fn start(&mut self, workers: &[Worker]) -> Step {
        self.say(&format!(
            "starting {} workers, each beating every {}",
            workers.len(),
            duration::show(BEAT_EVERY)
        ));
        for worker in workers.iter() {
            let id = worker.id;
            let at = self
                .said(id, "registered", Duration::from_secs(10))
                .ok_or(format!("worker {id} never registered"))?;
            let registered = at.saturating_duration_since(self.started);
            self.say(&format!(
                "  worker {id} (gpu{id}, pid {}) registered after {}",
                worker.child.id(),
                duration::show(registered)
            ));
        }
        std::thread::sleep(TIMEOUT);
        let status = self.table.status()?;
        self.say(&format!(
            "{} workers live and beating; nobody evicted after a full timeout",
            status.tracked_instances
        ));
        Ok(())
    }

    /// SIGKILL: the crash is seen at once (pidfd), at the next scan at worst.
    fn crash(&mut self, workers: &[Worker]) -> Step {
        let scan = scan_interval();
        self.say(
            "SIGKILL worker 1: a crash. Its pidfd wakes the reaper at once; its slot lock, dropped by the kernel, confirms it.",
        );
        let killed_at = Instant::now();
        signal(&workers[0], libc::SIGKILL);
        self.expect_drop(
            "killed (SIGKILL)",
            1,
            Reason::ProcessExited,
            killed_at,
            scan,
            &format!("next scan <= {}", duration::show(scan)),
        );
        Ok(())
    }

    /// SIGSTOP: a hang is evicted by the timeout, never before it.
    fn hang(&mut self, workers: &[Worker]) -> Step {
        let bound = eviction_bound();
        self.say("SIGSTOP worker 2: a hang. Alive, holding its lock, silent: only the timeout catches it.");
        let stopped_at = Instant::now();
        signal(&workers[1], libc::SIGSTOP);
        self.expect_drop(
            "hung (SIGSTOP)",
            2,
            Reason::Timeout,
            stopped_at,
            bound,
            &format!(
                "silent {}..{}",
                duration::show(TIMEOUT),
                duration::show(bound)
            ),
        );
        Ok(())
    }

    /// A clean exit deregisters and wakes the idle reaper.
    fn clean_exit(&mut self, workers: &mut [Worker]) -> Step {
        self.say("worker 3 exits cleanly: it deregisters, and the idle reaper is woken at once.");
        let closed_at = Instant::now();
        workers[2].stdin = None;
        self.expect_drop(
            "clean exit",
            3,
            Reason::Deregistered,
            closed_at,
            Duration::from_millis(5),
            "5ms (wake-up)",
        );
        Ok(())
    }

    /// A reset ends every registration; each worker hears it and comes back.
    fn reset_ends_workers(&mut self, workers: &[Worker]) -> Step {
        self.say("a reset is requested through the table: every live registration ends.");
        let cleared_at = Instant::now();
        self.table.reset(Duration::from_secs(5))?;
        self.say(&format!(
            "  reset completed in {}",
            duration::show(cleared_at.elapsed())
        ));
        for id in 4..=workers.len() as u64 {
            self.expect_drop(
                "reset",
                id,
                Reason::Cleared,
                cleared_at,
                Duration::from_millis(5),
                "5ms (wake-up)",
            );
        }
        for id in 4..=workers.len() as u64 {
            let back = self
                .said(id, "registered", TIMEOUT + SLACK)
                .map(|at| at.saturating_duration_since(cleared_at));
            self.say(&format!(
                "  worker {id} was told 'evicted' at its next beat and registered again after {}",
                back.map(duration::show).unwrap_or("never".into())
            ));
            self.expect("reset, came back", id, "registered again", back, BEAT_EVERY);
        }
        Ok(())
    }

    /// The hung worker, resumed, learns it was evicted and registers again.
    fn resume_hung(&mut self, workers: &[Worker]) -> Step {
        self.say("SIGCONT worker 2: its next heartbeat returns Evicted, so it registers again.");
        let resumed_at = Instant::now();
        signal(&workers[1], libc::SIGCONT);
        let told = self
            .said(2, "evicted", Duration::from_secs(2))
            .map(|at| at.saturating_duration_since(resumed_at));
        let back = self
            .said(2, "registered", Duration::from_secs(2))
            .map(|at| at.saturating_duration_since(resumed_at));
        self.say(&format!(
            "  worker 2 told 'evicted' after {}, registered again after {}",
            told.map(duration::show).unwrap_or("never".into()),
            back.map(duration::show).unwrap_or("never".into())
        ));
        self.expect(
            "hung, resumed, came back",
            2,
            "registered again",
            back,
            BEAT_EVERY,
        );
        Ok(())
    }

    /// A busy worker whose engine loop hangs (its heartbeat beats on) ends stalled.
    fn stall(&mut self, workers: &[Worker]) -> Step {
        let scan = scan_interval();
        let stuck_id = workers.len() as u64 + 1;
        let name = self.table.name().to_owned();
        self.say(&format!(
            "worker {stuck_id} starts busy, makes progress, and after 300ms its engine loop hangs while its heartbeat thread beats on."
        ));
        let (tell, heard) = mpsc::channel();
        let mut stuck = spawn_worker(
            &name,
            stuck_id,
            &tell,
            &["--busy", "--stall-after", "300ms"],
        )?;
        // Its last step is when the reaper's budget starts.
        let mut last_step = None;
        loop {
            match heard.recv_timeout(Duration::from_secs(5)) {
                Ok((DemoEvent::Said(_, line), at)) if line == "step" => last_step = Some(at),
                Ok((DemoEvent::Said(_, line), _)) if line == "hung" => break,
                Ok(_) => {}
                Err(_) => return Err("the stuck worker never hung".into()),
            }
        }
        let hang = last_step.ok_or("the stuck worker made no progress")?;
        self.expect_drop(
            "busy, no progress",
            stuck_id,
            Reason::Stalled,
            hang,
            PROGRESS_TIMEOUT + 2 * scan,
            &format!(
                "stuck {}..{}",
                duration::show(PROGRESS_TIMEOUT),
                duration::show(PROGRESS_TIMEOUT + 2 * scan)
            ),
        );
        let _ = stuck.child.kill();
        let _ = stuck.child.wait();
        drop(stuck.stdin.take());
        self.say(
            "the other workers never said they were busy: idle, they are never judged by progress, however long they wait.",
        );
        Ok(())
    }

    /// The survivors stop cleanly: each deregisters.
    fn shutdown(&mut self, workers: &mut [Worker]) -> Step {
        let live = self.table.status()?;
        self.say(&format!(
            "{} workers live again; stopping them cleanly",
            live.tracked_instances
        ));
        let survivors: Vec<u64> = std::iter::once(2).chain(4..=workers.len() as u64).collect();
        for worker in workers.iter_mut().filter(|w| survivors.contains(&w.id)) {
            worker.stdin = None;
        }
        let stopping = Instant::now();
        for id in survivors {
            self.expect_drop(
                "shutdown",
                id,
                Reason::Deregistered,
                stopping,
                Duration::from_millis(50),
                "50ms",
            );
        }
        Ok(())
    }

    /// Stops the scenarios once the demo was interrupted.
    fn go_on(&self) -> Result<(), Box<dyn std::error::Error>> {
        if self.interrupted {
            Err("interrupted".into())
        } else {
            Ok(())
        }
    }

    fn summary(&self) -> ExitCode {
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
