//! `livereg clear NAME`

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
}

pub fn run(args: Args) -> Outcome {
    let table = Table::open(&args.name)?;
    let before = table.status()?.ended[&Reason::Cleared];
    table.clear(args.wait)?;
    let cleared = table.status()?.ended[&Reason::Cleared] - before;
    out!(
        "cleared table '{}': {cleared} registrations ended",
        args.name
    );
    Ok(ExitCode::SUCCESS)
}
