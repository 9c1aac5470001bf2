//! `livereg rm NAME`

use crate::support::outcome::Outcome;
use livereg::Table;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    /// Table name.
    name: String,
}

pub fn run(args: Args) -> Outcome {
    Table::unlink(&args.name)?;
    Ok(ExitCode::SUCCESS)
}
