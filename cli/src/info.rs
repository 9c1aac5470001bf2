//! `livereg info NAME [--set VALUE]`: the bytes a server publishes in its
//! table for workers (a chunk size, an address), printed or replaced.

use crate::support::outcome::Outcome;
use livereg::Table;
use std::io::Write;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    /// Table name.
    name: String,
    /// Publish VALUE (at most 1,024 bytes, e.g. JSON) instead of printing.
    #[arg(long, value_name = "VALUE")]
    set: Option<String>,
}

pub fn run(args: Args) -> Outcome {
    let table = Table::open(&args.name)?;
    match args.set {
        Some(value) => table.set_info(value.as_bytes())?,
        None => {
            let info = table.info()?;
            let mut stdout = std::io::stdout().lock();
            let _ = stdout.write_all(&info);
            if !info.ends_with(b"\n") && !info.is_empty() {
                let _ = stdout.write_all(b"\n");
            }
            let _ = stdout.flush();
        }
    }
    Ok(ExitCode::SUCCESS)
}
