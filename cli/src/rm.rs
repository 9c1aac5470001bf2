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
    let alive: Vec<u32> = Table::open(&args.name)
        .ok()
        .and_then(|table| table.status().ok())
        .and_then(|status| status.owned_files)
        .map(|owned| {
            owned
                .owners
                .iter()
                .filter(|o| !o.ended)
                .map(|o| o.pid)
                .collect()
        })
        .unwrap_or_default();
    Table::unlink(&args.name)?;
    if !alive.is_empty() {
        note!(
            "livereg rm: {} live processes own files in table '{}' (pids {alive:?}): their declarations went with it, so no reaper will remove those files once they end; remove them then, or re-create the table only after those processes have ended",
            alive.len(),
            args.name
        );
    }
    Ok(ExitCode::SUCCESS)
}
