//! `livereg reap NAME [--on-drop CMD] [--standby]`

use crate::{duration, signals, Outcome};
use livereg::{DropEvent, Error, ReaperThread, Table};
use std::process::{Command, ExitCode};
use std::sync::mpsc;
use std::time::Duration;

#[derive(clap::Args)]
pub struct Args {
    /// Table name.
    name: String,
    /// Shell command run (`sh -c`) once per ended registration, with
    /// LIVEREG_INSTANCE_ID, LIVEREG_REASON, LIVEREG_PID, LIVEREG_LABEL,
    /// LIVEREG_SLOT and LIVEREG_GENERATION in its environment.
    #[arg(long)]
    on_drop: Option<String>,
    /// If another reaper holds the table, wait and take over when it dies.
    #[arg(long)]
    standby: bool,
}

pub fn run(args: Args) -> Outcome {
    signals::catch_termination();
    raise_open_files_limit();
    let table = Table::open(&args.name)?;
    if table.reap_timeout().is_zero() {
        return Err(format!(
            "table '{}': reaping is disabled (its reap timeout is 0)",
            args.name
        )
        .into());
    }
    let (hooks, queue) = mpsc::channel::<DropEvent>();
    let hook_thread = args
        .on_drop
        .clone()
        .map(|command| std::thread::spawn(move || run_hooks(&command, queue)));
    let Some(mut reaper) = take_role(&table, &args, hooks)? else {
        return Ok(ExitCode::SUCCESS);
    };
    note!(
        "livereg: table '{}': reaping (timeout {}, grace {}, scan every {}, boot token {:#018x})",
        args.name,
        duration::show(table.reap_timeout()),
        duration::show(table.registration_grace()),
        duration::show(table.scan_interval()),
        table.status()?.boot_token
    );
    while signals::take().is_none() {
        reaper.check()?;
        std::thread::sleep(Duration::from_millis(50));
    }
    reaper.stop()?;
    if let Some(thread) = hook_thread {
        let _ = thread.join();
    }
    note!("livereg: table '{}': reaper stopped", args.name);
    Ok(ExitCode::SUCCESS)
}

/// Starts the reaper, or (with `--standby`) waits for the role until a
/// termination signal. `None` means a signal came first.
fn take_role(
    table: &Table,
    args: &Args,
    hooks: mpsc::Sender<DropEvent>,
) -> Result<Option<ReaperThread>, Error> {
    let mut announced = false;
    loop {
        let sender = hooks.clone();
        let name = args.name.clone();
        let hooked = args.on_drop.is_some();
        let attempt = table
            .reaper()
            .on_drop(move |event| {
                log(&name, event);
                if hooked {
                    sender.send(event.clone())?;
                }
                Ok(())
            })
            .spawn();
        match attempt {
            Err(Error::Busy(message)) if args.standby => {
                if !announced {
                    note!("livereg: {message}; standing by to take over");
                    announced = true;
                }
                if signals::take().is_some() {
                    return Ok(None);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(Error::Busy(message)) => {
                return Err(Error::Busy(format!(
                    "{message} (use --standby to wait and take over)"
                )))
            }
            other => return other.map(Some),
        }
    }
}

fn log(table: &str, event: &DropEvent) {
    note!(
        "livereg: table '{table}': instance {} ({}pid {}, slot {}) ended: {} after {} silent",
        event.instance_id,
        if event.label.is_empty() {
            String::new()
        } else {
            format!("{}, ", event.label)
        },
        event.pid,
        event.slot,
        event.reason,
        duration::show(event.silent_for)
    );
}

/// Runs the hook once per event, in order, off the reaper's thread: a slow or
/// failing hook delays only later hooks, never a scan.
fn run_hooks(command: &str, queue: mpsc::Receiver<DropEvent>) {
    for event in queue {
        let status = Command::new("sh")
            .arg("-c")
            .arg(command)
            .env("LIVEREG_INSTANCE_ID", event.instance_id.to_string())
            .env("LIVEREG_REASON", event.reason.as_str())
            .env("LIVEREG_PID", event.pid.to_string())
            .env("LIVEREG_LABEL", &event.label)
            .env("LIVEREG_SLOT", event.slot.to_string())
            .env("LIVEREG_GENERATION", event.generation.to_string())
            .status();
        match status {
            Ok(status) if status.success() => {}
            Ok(status) => note!(
                "livereg: --on-drop hook for instance {} {status}",
                event.instance_id
            ),
            Err(e) => note!(
                "livereg: --on-drop hook for instance {} did not start: {e}",
                event.instance_id
            ),
        }
    }
}

/// Raises the soft limit on open files to the hard limit: the reaper holds a
/// pidfd per registered process. Falls back quietly: running short only
/// delays exit detection to the next scan.
fn raise_open_files_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid, writable `rlimit` for both calls.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max
        {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}
