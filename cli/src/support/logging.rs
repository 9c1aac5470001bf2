//! The CLI's logger: the library's records (evictions, handler failures) and
//! the daemon's own, on stderr, as text lines or JSON objects for log
//! shippers; level from `--log-level`, else `RUST_LOG`, else info.

use std::io::Write;
use std::time::{SystemTime, UNIX_EPOCH};

#[derive(clap::Args)]
pub struct LogArgs {
    /// Least severe records shown: error, warn, info, debug or trace
    /// [default: from RUST_LOG, else info].
    #[arg(long, global = true, value_parser = parse_level)]
    log_level: Option<log::LevelFilter>,
    /// `text` (`livereg: MESSAGE` lines) or `json` (one object per line:
    /// ts, level, target, message).
    #[arg(long, global = true, value_enum, default_value = "text")]
    log_format: Format,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Format {
    Text,
    Json,
}

fn parse_level(text: &str) -> Result<log::LevelFilter, String> {
    text.parse()
        .map_err(|_| format!("'{text}' is not a level, expected error, warn, info, debug or trace"))
}

/// The level `RUST_LOG` asks for: a bare level (`debug`) or a `livereg=`
/// directive among comma-separated ones; `None` if it names neither.
fn from_env(value: &str) -> Option<log::LevelFilter> {
    value.split(',').rev().find_map(|directive| {
        let level = match directive.split_once('=') {
            Some((target, level)) if target.trim().starts_with("livereg") => level,
            Some(_) => return None,
            None => directive,
        };
        level.trim().parse().ok()
    })
}

struct Stderr {
    level: log::LevelFilter,
    format: Format,
}

impl log::Log for Stderr {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= self.level
    }

    fn log(&self, record: &log::Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let line = match self.format {
            Format::Text => format!("livereg: {}", record.args()),
            Format::Json => {
                let ts = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0.0, |d| d.as_secs_f64());
                serde_json::json!({
                    "ts": ts,
                    "level": record.level().as_str(),
                    "target": record.target(),
                    "message": record.args().to_string(),
                })
                .to_string()
            }
        };
        // A daemon whose log reader went away keeps reaping.
        let _ = writeln!(std::io::stderr().lock(), "{line}");
    }

    fn flush(&self) {}
}

/// Installs the logger for this process.
pub fn install(args: &LogArgs) {
    let level = args
        .log_level
        .or_else(|| std::env::var("RUST_LOG").ok().as_deref().and_then(from_env))
        .unwrap_or(log::LevelFilter::Info);
    let logger = Box::new(Stderr {
        level,
        format: args.log_format,
    });
    if log::set_logger(Box::leak(logger)).is_ok() {
        log::set_max_level(level);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rust_log_names_a_level_or_a_livereg_directive() {
        assert_eq!(from_env("debug"), Some(log::LevelFilter::Debug));
        assert_eq!(
            from_env("hyper=warn,livereg=trace"),
            Some(log::LevelFilter::Trace)
        );
        assert_eq!(from_env("hyper=warn"), None);
        assert_eq!(from_env("nonsense"), None);
    }
}
