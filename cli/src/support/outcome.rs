//! What a subcommand returns.

use std::process::ExitCode;

/// What a subcommand returns: its exit code, or an error printed on one line.
pub type Outcome = Result<ExitCode, Box<dyn std::error::Error>>;
