//! `livereg worker NAME --instance ID` (hidden): a worker process for the demo
//! and the tests. It prints one line per event on stdout:
//! `registered SLOT GENERATION`, `evicted`, `deregistered`.

use crate::support::duration;
use crate::support::outcome::Outcome;
use crate::support::target::Registrant;
use crate::support::target::Target;
use livereg::{Error, Worker};
use std::io::Write;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    who: Registrant,
    /// Time between heartbeats.
    #[arg(long, value_parser = duration::parse, default_value = "100ms")]
    interval: Duration,
    /// Register again after being evicted (otherwise exit 3).
    #[arg(long)]
    reregister: bool,
    /// Deregister and exit 0 after this long.
    #[arg(long, value_parser = duration::parse)]
    exit_after: Option<Duration>,
    /// Register, then exit without ever beating or deregistering.
    #[arg(long)]
    never_beat: bool,
    /// Deregister and exit 0 when stdin closes.
    #[arg(long)]
    until_stdin_closes: bool,
    /// Busy from the start, one step of progress at every heartbeat.
    #[arg(long)]
    busy: bool,
    /// With --busy: the engine loop hangs after this long (no more progress)
    /// while the heartbeat goes on.
    #[arg(long, value_parser = duration::parse)]
    stall_after: Option<Duration>,
    /// After registering, fork a child that outlives this worker holding
    /// copies of its descriptors and handles (it prints `forked PID`): the
    /// registration must still end when this worker dies.
    #[arg(long)]
    fork_child: bool,
    /// Also hold this many more registrations from this process (instances
    /// ID+1 to ID+N, beating with the first; each prints `also SLOT
    /// GENERATION`): one process, several locks, as an engine serving
    /// several GPUs from one process.
    #[arg(long, default_value_t = 0)]
    also: u64,
    /// Register from a thread that then ends (the process lives on, beating
    /// from its main thread): its registration must never be seen dying.
    #[arg(long)]
    register_from_a_thread: bool,
    /// Before registering, hold this many MiB of memory, touched page by
    /// page (4 KiB pages, no huge pages): a worker as big as an engine,
    /// whose end the kernel takes long to finish (prints `holding MIB`).
    #[arg(long, default_value_t = 0)]
    hold_mib: u64,
    /// After registering, replace this process with `sleep 3600` (`exec`).
    #[arg(long)]
    exec_sleep: bool,
    /// After registering, own this file (it must exist): removed by the
    /// reaper once this worker has ended (prints `owned PATH`). Repeatable.
    #[arg(long = "own", value_name = "PATH")]
    own: Vec<std::path::PathBuf>,
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn register(target: &Target, args: &Args) -> Result<Worker, Error> {
    let worker = target.register(args.who.instance, &args.who.label)?;
    if args.busy {
        worker.set_busy(true)?;
    }
    say(&format!(
        "registered {} {}",
        worker.slot(),
        worker.generation()
    ));
    Ok(worker)
}

pub fn run(args: Args) -> Outcome {
    die_with_parent();
    let target = Target::open(&args.who.name, &args.who.token)?;
    let _held = hold(args.hold_mib);
    let mut worker = if args.register_from_a_thread {
        std::thread::scope(|scope| scope.spawn(|| register(&target, &args)).join())
            .map_err(|_| "the registering thread panicked")??
    } else {
        register(&target, &args)?
    };
    if let Target::Table(table) = &target {
        for path in &args.own {
            table.own_file(path)?;
            say(&format!("owned {}", path.display()));
        }
    }
    if args.exec_sleep {
        // Once its death thread holds the word (it starts just after the
        // first registration), so the exec is what ends it.
        if let Target::Table(table) = &target {
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline
                && !table.status()?.registrations.iter().any(|r| r.death_word)
            {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        let mut sleep = std::process::Command::new("sleep");
        sleep.arg("3600");
        return Err(std::os::unix::process::CommandExt::exec(&mut sleep).into());
    }
    let others = register_others(&target, &args)?;
    if args.never_beat {
        std::mem::forget(worker);
        loop {
            std::thread::park();
        }
    }
    if args.fork_child {
        fork_a_sleeper();
    }
    let started = Instant::now();
    let stdin_closed = watch_stdin(args.until_stdin_closes);
    let tick = args.interval.min(Duration::from_millis(1));
    let mut next_beat = started + args.interval;
    let mut said_hung = false;
    loop {
        std::thread::sleep(tick);
        let time_is_up = args
            .exit_after
            .is_some_and(|after| started.elapsed() >= after);
        if time_is_up || stdin_closed.load(Ordering::SeqCst) {
            worker.deregister()?;
            say("deregistered");
            return Ok(ExitCode::SUCCESS);
        }
        if Instant::now() < next_beat {
            continue;
        }
        next_beat = Instant::now() + args.interval;
        make_progress(&args, &worker, started, &mut said_hung);
        for other in &others {
            let _ = other.heartbeat();
        }
        if let Some(code) = beat(&target, &args, &mut worker)? {
            return Ok(code);
        }
    }
}

/// `--hold-mib`: that much memory, every 4 KiB page of it written, with huge
/// pages refused (so the kernel has every page to free at the end).
fn hold(mib: u64) -> Vec<u8> {
    if mib == 0 {
        return Vec::new();
    }
    let bytes = (mib as usize) << 20;
    let mut held: Vec<u8> = Vec::with_capacity(bytes);
    // SAFETY: advice on this process's own allocation; no memory effects.
    unsafe { libc::madvise(held.as_mut_ptr().cast(), bytes, libc::MADV_NOHUGEPAGE) };
    held.resize(bytes, 0);
    for page in held.chunks_mut(4096) {
        page[0] = 1;
    }
    say(&format!("holding {mib}"));
    held
}

/// If the demo or test that started this worker dies, so does the worker.
fn die_with_parent() {
    // SAFETY:
    // - PR_SET_PDEATHSIG takes a signal number and touches no memory.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
}

/// `--also N`: N more registrations of this process, beaten beside the first.
fn register_others(target: &Target, args: &Args) -> Result<Vec<Worker>, Error> {
    (1..=args.also)
        .map(|n| {
            let other = target.register(args.who.instance + n, &args.who.label)?;
            say(&format!("also {} {}", other.slot(), other.generation()));
            Ok(other)
        })
        .collect()
}

/// `--fork-child`: a child that sleeps until killed, holding copies of this
/// worker's descriptors.
fn fork_a_sleeper() {
    // SAFETY:
    // - the child only sleeps (async-signal-safe) until killed; it never
    //   returns into the worker's code or touches the inherited handle.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        loop {
            // SAFETY: `pause` has no memory effects.
            unsafe { libc::pause() };
        }
    }
    say(&format!("forked {pid}"));
}

/// Set once stdin closes (with `--until-stdin-closes`; never otherwise).
fn watch_stdin(watch: bool) -> Arc<AtomicBool> {
    let closed = Arc::new(AtomicBool::new(false));
    if watch {
        let closing = closed.clone();
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
            closing.store(true, Ordering::SeqCst);
        });
    }
    closed
}

/// `--busy`: one step of progress per beat, until `--stall-after` hangs the
/// engine loop (said once).
fn make_progress(args: &Args, worker: &Worker, started: Instant, said_hung: &mut bool) {
    if !args.busy {
        return;
    }
    let hung = args
        .stall_after
        .is_some_and(|after| started.elapsed() >= after);
    if !hung {
        let _ = worker.progress();
        if args.stall_after.is_some() {
            say("step");
        }
    } else if !*said_hung {
        say("hung");
        *said_hung = true;
    }
}

/// One heartbeat. Evicted: registers again with `--reregister`, else the
/// exit code 3.
fn beat(target: &Target, args: &Args, worker: &mut Worker) -> Result<Option<ExitCode>, Error> {
    match worker.heartbeat() {
        Ok(()) => Ok(None),
        Err(Error::Evicted { .. }) => {
            say("evicted");
            if !args.reregister {
                return Ok(Some(ExitCode::from(3)));
            }
            *worker = loop {
                match register(target, args) {
                    Ok(worker) => break worker,
                    // Live still, or its drop pending: try again.
                    Err(Error::Exists { .. } | Error::Busy { .. } | Error::Timeout(_)) => {
                        std::thread::sleep(args.interval)
                    }
                    Err(e) => return Err(e),
                }
            };
            Ok(None)
        }
        Err(e) => Err(e),
    }
}
