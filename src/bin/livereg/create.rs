//! `livereg create NAME`

use crate::{duration, Outcome};
use livereg::{Table, TableOptions, DEFAULT_REGISTRATION_GRACE};
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
    out!(
        "created table '{}': {} slots, timeout {}, grace {}{progress}, mode {:o}",
        args.name,
        table.capacity(),
        duration::show(table.reap_timeout()),
        duration::show(table.registration_grace()),
        options.mode
    );
    Ok(ExitCode::SUCCESS)
}
