//! Facts about processes read from `/proc`.

use crate::os::fork::PerProcess;
use std::os::unix::fs::MetadataExt;

/// This process's start time in clock ticks since boot (`/proc/self/stat`
/// field 22), or 0 if `/proc` is unreadable. With the pid, it names the
/// process uniquely: a reused pid has a later start time. A forked child
/// reads its own.
pub(crate) fn own_start_time() -> u64 {
    static START: PerProcess = PerProcess::new();
    START.get(|| start_time("self").unwrap_or(0))
}

/// The inode of this process's PID namespace (`/proc/self/ns/pid`), in
/// which its pid means it; 0 if unknown. A forked child reads its own.
pub(crate) fn pid_namespace() -> u64 {
    static NAMESPACE: PerProcess = PerProcess::new();
    NAMESPACE.get(|| {
        std::fs::metadata("/proc/self/ns/pid")
            .map(|meta| meta.ino())
            .unwrap_or(0)
    })
}

/// The inode of this process's time namespace (`/proc/self/ns/time`), which
/// names the `CLOCK_MONOTONIC` it reads: processes in one time namespace read
/// one clock. 0 if unknown (no `/proc`, or a kernel without time namespaces,
/// before Linux 5.6). A forked child reads its own (after `unshare(CLONE_NEWTIME)`
/// children live in another namespace than their parent).
pub(crate) fn time_namespace() -> u64 {
    static NAMESPACE: PerProcess = PerProcess::new();
    NAMESPACE.get(|| {
        std::fs::metadata("/proc/self/ns/time")
            .map(|meta| meta.ino())
            .unwrap_or(0)
    })
}

/// Field 22 of `/proc/PID/stat`, or `None` if the process is gone or the
/// file unreadable.
pub(crate) fn start_time(pid: &str) -> Option<u64> {
    read_start_time(pid).ok()
}

/// Field 22 of `/proc/PID/stat`. The command name (field 2) may contain
/// spaces and parentheses, so fields are counted after its last `)`.
///
/// # Errors
///
/// The error of reading the file (no such process, no descriptor to spare),
/// or `InvalidData` if it does not parse.
pub(crate) fn read_start_time(pid: &str) -> std::io::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let unparsable =
        || std::io::Error::new(std::io::ErrorKind::InvalidData, "unparsable /proc stat");
    let after_name = &stat[stat.rfind(')').ok_or_else(unparsable)? + 1..];
    after_name
        .split_whitespace()
        .nth(19)
        .and_then(|field| field.parse().ok())
        .ok_or_else(unparsable)
}

/// `geteuid()`, `getegid()` and `getgroups()`: this process's effective
/// user, and its effective group followed by its supplementary groups.
pub(crate) fn credentials() -> (u32, Vec<u32>) {
    // SAFETY: geteuid and getegid have no preconditions and cannot fail.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    // SAFETY: with a size of 0, getgroups only counts (no buffer written).
    let count = unsafe { libc::getgroups(0, std::ptr::null_mut()) }.max(0);
    let mut groups = vec![0 as libc::gid_t; count as usize];
    // SAFETY: `groups` has room for `count` entries, the size passed.
    let written = unsafe { libc::getgroups(count, groups.as_mut_ptr()) }.max(0);
    groups.truncate(written as usize);
    groups.retain(|&group| group != gid);
    groups.insert(0, gid);
    (uid, groups)
}
