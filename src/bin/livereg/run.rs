//! `livereg run NAME --instance ID -- CMD ARGS...`: registers on behalf of a
//! program that cannot link the library.

use crate::{duration, signals, Outcome};
use livereg::{Error, Table, Worker};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, ExitCode};
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct Args {
    /// Table name.
    name: String,
    /// Instance id to register.
    #[arg(long)]
    instance: u64,
    /// Label.
    #[arg(long, default_value = "")]
    label: String,
    /// Time between heartbeats [default: a third of the table's timeout].
    #[arg(long, value_parser = duration::parse)]
    interval: Option<Duration>,
    /// The program and its arguments.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

pub fn run(args: Args) -> Outcome {
    signals::catch_termination();
    let table = Table::open(&args.name)?;
    let interval = args
        .interval
        .unwrap_or_else(|| (table.reap_timeout() / 3).max(Duration::from_millis(10)));
    let mut child = Command::new(&args.command[0])
        .args(&args.command[1..])
        .spawn()
        .map_err(|e| format!("cannot start '{}': {e}", args.command[0]))?;
    let pid = child.id();
    let register = || {
        table
            .registration(args.instance)
            .label(&args.label)
            .pid(pid)
            .register()
    };
    let mut worker = match register() {
        Ok(worker) => Some(worker),
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(e.into());
        }
    };
    let mut next_beat = Instant::now() + interval;
    let status = loop {
        if let Some(signal) = signals::take() {
            forward(&child, signal);
        }
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() >= next_beat {
            next_beat += interval;
            worker = beat(worker, &register, &args);
        }
        std::thread::sleep(interval.min(Duration::from_millis(20)));
    };
    if let Some(worker) = worker {
        let _ = worker.deregister();
    }
    let code = status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
    Ok(ExitCode::from(code as u8))
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
            note!("livereg run: instance {}: {e}", args.instance);
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
