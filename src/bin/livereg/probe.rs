//! `livereg probe NAME`

use crate::Outcome;
use livereg::Table;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    /// Table name.
    name: String,
}

pub fn run(args: Args) -> Outcome {
    let token = Table::open(&args.name)?.probe()?;
    out!("{token:#018x}");
    Ok(ExitCode::SUCCESS)
}
