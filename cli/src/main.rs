//! `livereg`: operate tables, run a reaper, wrap programs, and the demo.

#[macro_use]
mod output {
    /// Prints a line to stdout, ignoring a closed pipe (`livereg status x |
    /// head`): output is best effort, cleanup is not.
    macro_rules! out {
        ($($arg:tt)*) => {{
            use std::io::Write as _;
            let mut stdout = std::io::stdout().lock();
            let _ = writeln!(stdout, $($arg)*);
            let _ = stdout.flush();
        }};
    }

    /// Prints a line to stderr, ignoring a closed pipe: a daemon whose log
    /// reader went away keeps reaping.
    macro_rules! note {
        ($($arg:tt)*) => {{
            use std::io::Write as _;
            let _ = writeln!(std::io::stderr().lock(), $($arg)*);
        }};
    }
}

// The subcommands, one file each.
mod clear;
mod create;
mod demo;
mod info;
mod probe;
mod reap;
mod rm;
mod run;
mod status;

mod worker;

// The command line, and what the subcommands share.
mod command_line;
mod support;

use command_line::{Cli, Command};
use support::logging;

#[cfg(test)]
mod deploy_lines;

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = Cli::parse();
    logging::install(&cli.logging);
    let result = match cli.command {
        Command::Create(args) => create::run(args),
        Command::Reap(args) => reap::run(args),
        Command::Status(args) => status::run(args),
        Command::Probe(args) => probe::run(args),
        Command::Clear(args) => clear::run(args),
        Command::Info(args) => info::run(args),
        Command::Rm(args) => rm::run(args),
        Command::Run(args) => run::run(args),
        Command::Demo(args) => demo::run(args),
        Command::Worker(args) => worker::run(args),
    };
    match result {
        Ok(code) => code,
        Err(error) => {
            note!("livereg: {error}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::command_line::Cli;
    use clap::CommandFactory;

    #[test]
    fn every_subcommand_is_a_well_formed_command_line() {
        // Unique names, consistent `requires`: what clap checks at parse
        // time, for every subcommand at once.
        Cli::command().debug_assert();
    }
}
