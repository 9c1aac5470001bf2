//! `livereg clear NAME [--wait D] [--reset]`

use crate::{duration, Outcome};
use livereg::{Reason, Table};
use std::process::ExitCode;
use std::time::Duration;

#[derive(clap::Args)]
pub struct Args {
    /// Table name.
    name: String,
    /// How long to wait for the reaper to complete the clear.
    #[arg(long, value_parser = duration::parse, default_value = "5s")]
    wait: Duration,
    /// Also end every registration (reason cleared): their drop handlers
    /// run, workers are told they were evicted and register again.
    #[arg(long)]
    reset: bool,
}

pub fn run(args: Args) -> Outcome {
    let table = Table::open(&args.name)?;
    if !args.reset {
        table.clear(args.wait)?;
        out!(
            "cleared table '{}': the clear handlers ran, registrations untouched",
            args.name
        );
        return Ok(ExitCode::SUCCESS);
    }
    let before = table.status()?.ended[&Reason::Cleared];
    table.reset(args.wait)?;
    let ended = table.status()?.ended[&Reason::Cleared] - before;
    out!(
        "reset table '{}': {ended} registrations ended, then the clear handlers ran",
        args.name
    );
    Ok(ExitCode::SUCCESS)
}
