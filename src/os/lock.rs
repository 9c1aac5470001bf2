//! Open-file-description byte-range locks (`fcntl(F_OFD_SETLK)`), which the
//! kernel drops when the last descriptor of the description closes, including
//! when the process holding it dies. See `fcntl(2)`, "Open file description
//! locks".
//!
//! The table uses single bytes far beyond the end of the object as lock words
//! (a lock may cover bytes that do not exist): one for the reaper role, one for
//! registrations, and one per registration, held by its owner: the byte of a
//! slot *and generation*, so an evicted owner that has not yet noticed (a
//! stopped process) never keeps the slot's next owner from taking its own.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

/// First lock byte of the registrations; see [`registration_lock`].
pub(crate) const SLOT_LOCKS: u64 = 1 << 40;
/// The reaper role's lock byte.
pub(crate) const REAPER_LOCK: u64 = SLOT_LOCKS - 1;
/// The registration lock byte.
pub(crate) const REGISTRATION_LOCK: u64 = SLOT_LOCKS - 2;

/// The lock byte of the registration in slot `index` with generation
/// `generation`: 65,536 bytes per slot, one per generation tag.
pub(crate) fn registration_lock(index: u32, generation: u32) -> u64 {
    SLOT_LOCKS + (u64::from(index) << 16) + u64::from(generation as u16)
}

fn flock(kind: i32, offset: u64) -> libc::flock {
    // SAFETY:
    // - `libc::flock` is a plain C struct of integers; all-zero is valid.
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = kind as libc::c_short;
    lock.l_whence = libc::SEEK_SET as libc::c_short;
    lock.l_start = offset as libc::off_t;
    lock.l_len = 1;
    lock
}

fn fcntl(file: &File, command: i32, lock: &mut libc::flock) -> io::Result<()> {
    // SAFETY:
    // - the descriptor is open for as long as `file` is borrowed;
    // - `lock` is a valid, writable `flock` (F_OFD_GETLK writes into it), and
    //   `l_pid` is zero as F_OFD_* commands require.
    let rc = unsafe { libc::fcntl(file.as_raw_fd(), command, lock as *mut libc::flock) };
    if rc == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// `fcntl(fd, F_OFD_SETLK, {F_WRLCK, offset, 1})`: takes the byte at
/// `offset` for this open file description without waiting. Returns false if
/// another description holds it.
pub(crate) fn try_lock(file: &File, offset: u64) -> io::Result<bool> {
    match fcntl(file, libc::F_OFD_SETLK, &mut flock(libc::F_WRLCK, offset)) {
        Ok(()) => Ok(true),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EACCES)) => Ok(false),
        Err(e) => Err(e),
    }
}

/// `fcntl(fd, F_OFD_SETLK, {F_UNLCK, offset, 1})`: gives the byte back.
pub(crate) fn unlock(file: &File, offset: u64) -> io::Result<()> {
    fcntl(file, libc::F_OFD_SETLK, &mut flock(libc::F_UNLCK, offset))
}

/// `fcntl(fd, F_OFD_GETLK, {F_WRLCK, offset, 1})`: whether an open file
/// description other than this one holds the byte at `offset`.
pub(crate) fn held_by_other(file: &File, offset: u64) -> io::Result<bool> {
    let mut lock = flock(libc::F_WRLCK, offset);
    fcntl(file, libc::F_OFD_GETLK, &mut lock)?;
    Ok(lock.l_type != libc::F_UNLCK as libc::c_short)
}

/// A new open file description of the same object as `file`, through
/// `/proc/self/fd`, so that its locks are its own (descriptors from `dup`
/// share their description, and with it their locks).
pub(crate) fn reopen(file: &File) -> io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/self/fd/{}", file.as_raw_fd()))
}

/// The single-byte locks at offsets in `range` that anyone holds on the
/// object behind `file`, read from `/proc/locks` in one pass: the whole
/// table's lock state for the cost of one read, where testing each byte
/// with `F_OFD_GETLK` walks the object's whole lock list every time.
/// Blocked waiters (`->` lines) hold nothing and are skipped.
pub(crate) fn held_in(
    file: &File,
    range: std::ops::Range<u64>,
) -> io::Result<std::collections::HashSet<u64>> {
    use std::os::unix::fs::MetadataExt;
    let meta = file.metadata()?;
    let object = format!(
        "{:02x}:{:02x}:{}",
        libc::major(meta.dev()),
        libc::minor(meta.dev()),
        meta.ino()
    );
    let text = std::fs::read_to_string("/proc/locks")?;
    let mut held = std::collections::HashSet::new();
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        if fields.nth(1) == Some("->") {
            continue;
        }
        let mut fields = fields.skip_while(|field| *field != object).skip(1);
        let (Some(start), Some(end)) = (fields.next(), fields.next()) else {
            continue;
        };
        if let (Ok(start), Ok(end)) = (start.parse::<u64>(), end.parse::<u64>()) {
            if start == end && range.contains(&start) {
                held.insert(start);
            }
        }
    }
    Ok(held)
}
