//! `livereg run NAME --instance ID -- CMD ARGS...`: registers on behalf of a
//! program that cannot link the library.
//!
//! The wrapper registers first (the program never starts if that fails) as
//! itself, and beats once at once: the program is alive when it starts. The
//! program is the wrapper's child and dies with it (`PR_SET_PDEATHSIG`), so the
//! wrapper's life bounds the program's and its exit is detected like any
//! registrant's. Every catchable terminating signal sent to the wrapper is
//! passed on once; those the terminal sends to the whole foreground group
//! already reached the program.

use crate::support::duration;
use crate::support::outcome::Outcome;
use crate::support::signals;
use crate::support::target::Registrant;
use crate::support::target::Target;
use livereg::{Error, Worker, BEATS_PER_TIMEOUT};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitCode};
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    who: Registrant,
    /// Time between heartbeats [default: a third of the table's timeout].
    #[arg(long, value_parser = duration::parse)]
    interval: Option<Duration>,
    /// Progress for a shell program: it is busy while PATH exists, and each
    /// change to PATH (`touch`, an appended line) is one step of progress.
    #[arg(long, value_name = "PATH")]
    progress_file: Option<std::path::PathBuf>,
    /// A file the program makes that must not outlive it (in /dev/shm, or
    /// another directory the table allows): owned by this wrapper once it
    /// exists (the name is followed: a file made anew under it is owned in
    /// place of the one before), and removed by the reaper once the wrapper
    /// has ended, which it does with the program. Repeatable.
    #[arg(long = "own", value_name = "PATH")]
    own: Vec<std::path::PathBuf>,
    /// The program and its arguments.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

/// Longest sleep between looks at the program and the signals.
const POLL: Duration = Duration::from_millis(20);

pub fn run(args: Args) -> Outcome {
    let target = Target::open(&args.who.name, &args.who.token)?;
    // A session's heartbeat is free (its sender thread forwards it): beat
    // often; on a table, a few times per timeout.
    let interval = args.interval.unwrap_or_else(|| {
        target
            .reap_timeout()
            .map_or(Duration::from_millis(100), |timeout| {
                (timeout / BEATS_PER_TIMEOUT).max(Duration::from_millis(10))
            })
    });
    let register = || {
        let worker = target.register(args.who.instance, &args.who.label)?;
        worker.heartbeat()?;
        Ok(worker)
    };
    let mut worker = Some(register()?);
    let mut owned = Owned::new(&target, args.own.clone())?;
    signals::catch_to_forward();
    let mut child = spawn(&args.command)?;
    let mut next_beat = Instant::now().checked_add(interval);
    let mut progress = args.progress_file.as_deref().map(ProgressFile::new);
    let status = loop {
        for signal in signals::take_to_forward() {
            forward(&child, signal);
        }
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if let (Some(file), Some(current)) = (&mut progress, &worker) {
            file.report(current);
        }
        owned.declare_made();
        if next_beat.is_some_and(|at| Instant::now() >= at) {
            next_beat = Instant::now().checked_add(interval);
            worker = beat(worker, &register, &args);
        }
        std::thread::sleep(interval.min(POLL));
    };
    // What the program made, or made anew, just before it ended is owned
    // too: removed once this wrapper has ended.
    owned.declare_made();
    if let Some(worker) = worker {
        let _ = worker.deregister();
    }
    let code = status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
    Ok(ExitCode::from(code as u8))
}

/// The `--own` paths, declared as they appear and again whenever the
/// name holds a new file (a program that removes and remakes its segment
/// owns the file made last).
struct Owned<'t> {
    table: Option<&'t livereg::Table>,
    paths: Vec<OwnedPath>,
}

/// One `--own` path and what was last done with the file at it.
struct OwnedPath {
    path: std::path::PathBuf,
    /// The file last declared or refused at the name (not followed).
    seen: Option<FileIdentity>,
    /// Whether a refusal was said (each path's is said once).
    refusal_said: bool,
}

/// What tells one file from the next made under the same name: its
/// device, inode and birth time (where the file system keeps one).
#[derive(Clone, Copy, PartialEq, Eq)]
struct FileIdentity {
    dev: u64,
    ino: u64,
    born: Option<std::time::SystemTime>,
}

impl FileIdentity {
    /// The file at `path` itself (a link is not followed), if any.
    fn at(path: &std::path::Path) -> Option<FileIdentity> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::symlink_metadata(path).ok()?;
        Some(FileIdentity {
            dev: meta.dev(),
            ino: meta.ino(),
            born: meta.created().ok(),
        })
    }
}

impl<'t> Owned<'t> {
    fn new(target: &'t Target, paths: Vec<std::path::PathBuf>) -> Result<Owned<'t>, String> {
        let table = match target {
            Target::Table(table) => Some(table),
            Target::Session { .. } if paths.is_empty() => None,
            Target::Session { .. } => {
                return Err("--own needs the table mapped: a session's files are in a /dev/shm its reaper does not share".into())
            }
        };
        let paths = paths
            .into_iter()
            .map(|path| OwnedPath {
                path,
                seen: None,
                refusal_said: false,
            })
            .collect();
        Ok(Owned { table, paths })
    }

    /// Declares each path whose name holds a file not yet declared: one
    /// just made, or made anew since (declaring a name again moves the
    /// declaration to the file it holds now). A refusal is said once a
    /// path.
    fn declare_made(&mut self) {
        let Some(table) = self.table else {
            return;
        };
        for owned in &mut self.paths {
            let Some(now) = FileIdentity::at(&owned.path) else {
                continue;
            };
            if owned.seen == Some(now) {
                continue;
            }
            match table.own_file(&owned.path) {
                Ok(()) => owned.seen = Some(now),
                // Gone again between the look and the declaration.
                Err(Error::NotFound(_)) => {}
                Err(e) => {
                    owned.seen = Some(now);
                    if !owned.refusal_said {
                        owned.refusal_said = true;
                        note!("livereg run: --own: {e}");
                    }
                }
            }
        }
    }
}

/// Starts the program as a child that dies with this process.
fn spawn(command: &[String]) -> Result<Child, String> {
    let wrapper = std::process::id();
    let mut program = Command::new(&command[0]);
    program.args(&command[1..]);
    // SAFETY:
    // - runs in the forked child before exec, and only makes the
    //   async-signal-safe calls `prctl`, `getppid` and `kill`.
    unsafe {
        program.pre_exec(move || {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            // The wrapper may have died before the line above took effect.
            if libc::getppid() as u32 != wrapper {
                libc::kill(libc::getpid(), libc::SIGKILL);
            }
            Ok(())
        })
    };
    program
        .spawn()
        .map_err(|e| format!("cannot start '{}': {e}", command[0]))
}

/// One heartbeat; after an eviction, registers again (trying again at the
/// next beat if that fails).
fn beat(
    worker: Option<Worker>,
    register: &impl Fn() -> Result<Worker, Error>,
    args: &Args,
) -> Option<Worker> {
    if let Some(current) = worker {
        match current.heartbeat() {
            Ok(()) => return Some(current),
            Err(e) => note!("livereg run: {e}; registering again"),
        }
    }
    match register() {
        Ok(worker) => Some(worker),
        Err(e) => {
            note!("livereg run: instance {}: {e}", args.who.instance);
            None
        }
    }
}

fn forward(child: &Child, signal: i32) {
    // SAFETY:
    // - `kill` has no memory effects; the pid is our own child, not yet
    //   reaped (try_wait has not returned its status), so it is not reused.
    unsafe { libc::kill(child.id() as libc::pid_t, signal) };
}

/// A file a shell program signals progress through: it exists while the
/// program is busy, and changes at each step.
struct ProgressFile<'p> {
    path: &'p std::path::Path,
    /// (busy, modification time, size) last reported, and to which
    /// registration (a new one starts idle).
    reported: Option<(bool, Option<std::time::SystemTime>, u64)>,
    registration: (u32, u32),
}

impl<'p> ProgressFile<'p> {
    fn new(path: &'p std::path::Path) -> Self {
        ProgressFile {
            path,
            reported: None,
            registration: (u32::MAX, 0),
        }
    }

    /// Passes a change of the file on as busy/idle and a step of progress.
    /// (An eviction is seen by the next heartbeat, which registers again.)
    fn report(&mut self, worker: &Worker) {
        let now = match std::fs::metadata(self.path) {
            Ok(meta) => (true, meta.modified().ok(), meta.len()),
            Err(_) => (false, None, 0),
        };
        let registration = (worker.slot(), worker.generation());
        if registration != self.registration {
            self.registration = registration;
            self.reported = None;
        }
        let before = self.reported.replace(now);
        if before.map_or(now.0, |(busy, ..)| busy != now.0) {
            let _ = worker.set_busy(now.0);
        }
        if now.0 && before.is_some_and(|b| b.0 && b != now) {
            let _ = worker.progress();
        }
    }
}
