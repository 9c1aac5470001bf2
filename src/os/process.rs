//! Facts about processes read from `/proc`.

use std::sync::OnceLock;

/// This process's start time in clock ticks since boot (`/proc/self/stat`
/// field 22), or 0 if `/proc` is unreadable. With the pid, it names the
/// process uniquely: a reused pid has a later start time.
pub(crate) fn own_start_time() -> u64 {
    static START: OnceLock<u64> = OnceLock::new();
    *START.get_or_init(|| start_time("self").unwrap_or(0))
}

/// Field 22 of `/proc/PID/stat`. The command name (field 2) may contain
/// spaces and parentheses, so fields are counted after its last `)`.
pub(crate) fn start_time(pid: &str) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(19)?.parse().ok()
}
