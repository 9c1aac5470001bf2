//! `livereg clear NAME|ADDRESS [--wait D] [--reset]`

use crate::support::duration;
use crate::support::outcome::Outcome;
use crate::support::target::SessionArgs;
use livereg::{Address, Reason, Status, Table};
use std::process::ExitCode;
use std::time::Duration;

#[derive(clap::Args)]
pub struct Args {
    /// Table name, or a reaper's listener (`unix:PATH`, `tcp://HOST:PORT`,
    /// `tls://HOST:PORT`) from a container that cannot map the table.
    name: String,
    /// How long to wait for the reaper to complete the clear.
    #[arg(long, value_parser = duration::parse, default_value = "5s")]
    wait: Duration,
    /// Also end every registration (reason cleared): their drop handlers
    /// run, workers are told they were evicted and register again.
    #[arg(long)]
    reset: bool,
    #[command(flatten)]
    session: SessionArgs,
}

/// The table, opened or reached through its reaper's listener.
enum Target {
    Table(Table),
    Listener(String, livereg::ConnectOptions),
}

impl Target {
    fn request(&self, reset: bool, wait: Duration) -> livereg::Result<()> {
        match (self, reset) {
            (Target::Table(table), false) => table.clear(wait),
            (Target::Table(table), true) => table.reset(wait),
            (Target::Listener(address, options), false) => {
                livereg::remote_clear(address, wait, options)
            }
            (Target::Listener(address, options), true) => {
                livereg::remote_reset(address, wait, options)
            }
        }
    }

    fn status(&self) -> livereg::Result<Status> {
        match self {
            Target::Table(table) => table.status(),
            Target::Listener(address, options) => livereg::remote_status(address, None, options),
        }
    }
}

pub fn run(args: Args) -> Outcome {
    let target = if Address::is_address(&args.name) {
        Target::Listener(args.name.clone(), args.session.options()?)
    } else {
        Target::Table(Table::open(&args.name)?)
    };
    let table = &target.status()?.table;
    if !args.reset {
        target.request(false, args.wait)?;
        out!("cleared table '{table}': the clear handlers ran, registrations untouched");
        return Ok(ExitCode::SUCCESS);
    }
    let before = target.status()?.ended[&Reason::Cleared];
    target.request(true, args.wait)?;
    let ended = target.status()?.ended[&Reason::Cleared] - before;
    out!("reset table '{table}': {ended} registrations ended, then the clear handlers ran");
    Ok(ExitCode::SUCCESS)
}
