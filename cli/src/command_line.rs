//! The command line: every subcommand and the options they share.

use crate::support::logging::LogArgs;
use crate::{clear, create, demo, info, probe, reap, rm, run, status, worker};
use clap::{Parser, Subcommand};

/// A lock-free shared-memory liveness registry.
#[derive(Parser)]
#[command(name = "livereg", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    #[command(flatten)]
    pub logging: LogArgs,
}

#[derive(Subcommand)]
pub enum Command {
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
