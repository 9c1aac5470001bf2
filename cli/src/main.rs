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

/// Who registers: the table, the instance id and its label (`run`, `worker`).
#[derive(clap::Args)]
pub struct Registrant {
    /// Table name, or a reaper's listener (`unix:PATH`, `tcp://HOST:PORT`).
    name: String,
    /// Instance id to register.
    #[arg(long)]
    instance: u64,
    /// Label.
    #[arg(long, default_value = "")]
    label: String,
    #[command(flatten)]
    token: target::SessionArgs,
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

// What the subcommands share.
mod support;
use support::{cluster, duration, etcd_args, logging, metrics_endpoint, notify, signals, target};
mod worker;

#[cfg(test)]
mod deploy_lines;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// A lock-free shared-memory liveness registry.
#[derive(Parser)]
#[command(name = "livereg", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    logging: logging::LogArgs,
}

#[derive(Subcommand)]
enum Command {
    /// Create a table (refuses an existing one).
    Create(create::Args),
    /// Run the reaper in the foreground.
    Reap(reap::Args),
    /// Show a table's registrations and its reaper.
    Status(status::Args),
    /// Exit 0 and print the boot token if a reaper is alive (with
    /// --instance N: exit 0 only if instance N is live and not stalled).
    Probe(probe::Args),
    /// Ask the reaper to run its clear handlers (--reset: end every
    /// registration first) and wait for it.
    Clear(clear::Args),
    /// Print the server-published info, or publish it with --set.
    Info(info::Args),
    /// Remove a table.
    Rm(rm::Args),
    /// Register on behalf of a program and beat while it runs.
    Run(run::Args),
    /// Show the whole system working: workers killed, hung, stopped, cleared.
    Demo(demo::Args),
    /// A worker process for the demo and the tests.
    #[command(hide = true)]
    Worker(worker::Args),
}

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

/// What a subcommand returns: its exit code, or an error printed on one line.
type Outcome = Result<ExitCode, Box<dyn std::error::Error>>;

#[cfg(test)]
mod tests {
    use super::Cli;
    use clap::CommandFactory;

    #[test]
    fn every_subcommand_is_a_well_formed_command_line() {
        // Unique names, consistent `requires`: what clap checks at parse
        // time, for every subcommand at once.
        Cli::command().debug_assert();
    }
}
