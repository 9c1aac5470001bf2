//! `livereg create NAME`

use crate::support::duration;
use crate::support::outcome::Outcome;
use livereg::{StampClock, Table, TableOptions, DEFAULT_REGISTRATION_GRACE};
use std::process::ExitCode;
use std::time::Duration;

#[derive(clap::Args)]
pub struct Args {
    /// Table name (a /dev/shm name, or a path containing '/').
    name: String,
    /// Number of slots.
    #[arg(long, default_value_t = TableOptions::default().capacity)]
    capacity: u32,
    /// Silence budget of a worker that has beaten (0s disables reaping).
    #[arg(long, value_parser = duration::parse, default_value = "10s")]
    timeout: Duration,
    /// Silence budget of a worker that never beat [default: the larger of 30s and the timeout].
    #[arg(long, value_parser = duration::parse)]
    grace: Option<Duration>,
    /// How long a busy worker may make no progress before it ends `stalled`
    /// (0s, the default, turns the check off; else at least a quarter of the timeout).
    #[arg(long, value_parser = duration::parse, default_value = "0s")]
    progress_timeout: Duration,
    /// Permission bits, octal.
    #[arg(long, default_value = "600", value_parser = parse_mode)]
    mode: u32,
    /// The clock heartbeats stamp with: `coarse` (CLOCK_MONOTONIC_COARSE, a
    /// few ns; the reaper adds 4 of its ticks before judging, so evictions
    /// may come up to 16ms later at HZ=250), `precise` (CLOCK_MONOTONIC), or
    /// `auto`: coarse where the timeout is at least 200 ticks (800ms).
    #[arg(long, value_enum, default_value = "auto")]
    clock: ClockChoice,
    /// A directory where processes may own files the reaper removes once
    /// they have ended (`livereg run --own`, `livereg_own_file`); repeat
    /// for up to 4 [default: /dev/shm].
    #[arg(long = "own-dir", value_name = "DIR")]
    own_dirs: Vec<std::path::PathBuf>,
    /// Allow no directory: no process may own files in this table.
    #[arg(long, conflicts_with = "own_dirs")]
    no_own_dirs: bool,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum ClockChoice {
    Auto,
    Precise,
    Coarse,
}

impl From<ClockChoice> for StampClock {
    fn from(choice: ClockChoice) -> StampClock {
        match choice {
            ClockChoice::Auto => StampClock::Auto,
            ClockChoice::Precise => StampClock::Precise,
            ClockChoice::Coarse => StampClock::Coarse,
        }
    }
}

fn parse_mode(text: &str) -> Result<u32, String> {
    u32::from_str_radix(text, 8)
        .map_err(|_| format!("'{text}' is not an octal mode like 600 or 660"))
}

pub fn run(args: Args) -> Outcome {
    let options = TableOptions {
        capacity: args.capacity,
        mode: args.mode,
        reap_timeout: args.timeout,
        registration_grace: args
            .grace
            .unwrap_or(args.timeout.max(DEFAULT_REGISTRATION_GRACE)),
        progress_timeout: args.progress_timeout,
        stamp_clock: args.clock.into(),
        owned_dirs: match (args.no_own_dirs, args.own_dirs.is_empty()) {
            (true, _) => Vec::new(),
            (false, true) => TableOptions::default().owned_dirs,
            (false, false) => args.own_dirs,
        },
    };
    let table = Table::create(&args.name, &options)?;
    let progress = if table.progress_timeout().is_zero() {
        String::new()
    } else {
        format!(
            ", progress timeout {}",
            duration::show(table.progress_timeout())
        )
    };
    let stamps = match table.stamp_clock() {
        StampClock::Coarse => format!(
            "coarse clock ({} ticks)",
            duration::show(table.stamp_resolution())
        ),
        _ => "precise clock".to_owned(),
    };
    out!(
        "created table '{}': {} slots, timeout {}, grace {}{progress}, mode {:o}, heartbeats on the {stamps}",
        args.name,
        table.capacity(),
        duration::show(table.reap_timeout()),
        duration::show(table.registration_grace()),
        options.mode
    );
    Ok(ExitCode::SUCCESS)
}
