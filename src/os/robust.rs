//! Robust futexes (`set_robust_list(2)`, the kernel's
//! `Documentation/locking/robust-futexes.rst`) and `futex_waitv(2)`.
//!
//! A thread hands the kernel the head of a list of entries in its own
//! memory; each entry is at a fixed distance (`futex_offset`) from a 32-bit
//! word that holds the thread's id while it owns it. When the thread exits
//! for any reason, at the very start of its exit (before its address space
//! is torn down and its files closed), the kernel walks the list (at most
//! 2,048 entries, and the one named `list_op_pending`), sets
//! `OWNER_DIED` in every word still holding the thread's id, and wakes one
//! waiter of each word whose `WAITERS` bit is set (a shared futex: the
//! waiter waits without `FUTEX_PRIVATE_FLAG`, on a shared mapping).

use std::sync::atomic::{AtomicIsize, AtomicU32, AtomicUsize, Ordering};
use std::time::Duration;

/// The most words one `futex_waitv` call waits on (`FUTEX_WAITV_MAX`).
pub(crate) const WAITV_MAX: usize = 128;

/// `struct robust_list_head` followed by the one entry a death thread's
/// list ever holds: the list (circular through `next`), the distance from
/// an entry to its word, the entry being added or removed, and the entry.
/// Atomics, since a thread other than the list's owner edits it while the
/// kernel may read it (at the owner's exit); laid out as the kernel reads
/// the head.
#[repr(C)]
pub(crate) struct RobustList {
    pub next: AtomicUsize,
    pub futex_offset: AtomicIsize,
    pub list_op_pending: AtomicUsize,
    /// The entry: its `next` link.
    pub entry: AtomicUsize,
}

impl RobustList {
    /// An empty list (its `next` pointing at itself), boxed so that its
    /// address stays put.
    pub(crate) fn new() -> Box<RobustList> {
        let list = Box::new(RobustList::unlinked());
        list.empty();
        list
    }

    /// A list not yet linked to itself: [`RobustList::empty`] it once it
    /// is where it stays.
    pub(crate) fn unlinked() -> RobustList {
        RobustList {
            next: AtomicUsize::new(0),
            futex_offset: AtomicIsize::new(0),
            list_op_pending: AtomicUsize::new(0),
            entry: AtomicUsize::new(0),
        }
    }

    /// Empties the list: its `next` points at its head.
    pub(crate) fn empty(&self) {
        self.next.store(self.head(), Ordering::Release);
    }

    /// The head's address (what `next` holds when the list is empty).
    pub(crate) fn head(&self) -> usize {
        self as *const RobustList as usize
    }

    /// The entry's address.
    pub(crate) fn entry(&self) -> usize {
        &self.entry as *const AtomicUsize as usize
    }
}

/// One empty robust list for the whole process, which a thread switches to
/// before its own list's memory is freed.
pub(crate) fn empty_list() -> &'static RobustList {
    static EMPTY: std::sync::OnceLock<&'static RobustList> = std::sync::OnceLock::new();
    EMPTY.get_or_init(|| Box::leak(RobustList::new()))
}

/// `set_robust_list(list, sizeof head)`: `list` becomes the calling
/// thread's robust list, read by the kernel at the thread's exit.
///
/// # Safety
///
/// `list` must stay valid, and well formed, until the calling thread exits
/// or sets another list.
pub(crate) unsafe fn set_robust_list(list: &RobustList) -> std::io::Result<()> {
    // Miri runs no such system call: refused there, as a seccomp profile
    // may refuse it, and the callers go on without a robust list.
    if cfg!(miri) {
        return Err(std::io::Error::from(std::io::ErrorKind::Unsupported));
    }
    // SAFETY: the caller keeps `list` valid; the kernel only records it.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_set_robust_list,
            list.head(),
            3 * std::mem::size_of::<usize>(),
        )
    };
    match rc {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// `struct futex_waitv`.
#[repr(C)]
struct WaitV {
    val: u64,
    uaddr: u64,
    flags: u32,
    reserved: u32,
}

/// `FUTEX2_SIZE_U32`.
const SIZE_U32: u32 = 0x02;
/// `FUTEX2_PRIVATE`.
const PRIVATE: u32 = 128;

/// One word to wait on, while it holds `expected`; `shared` for a word of
/// a shared mapping (another process's thread may wake it).
pub(crate) struct Waited<'a> {
    pub word: &'a AtomicU32,
    pub expected: u32,
    pub shared: bool,
}

/// `futex_waitv(words, CLOCK_MONOTONIC, timeout)`: sleeps until one of
/// `words` (at most [`WAITV_MAX`]) is woken, one no longer holds its
/// expected value, or `timeout` passes. Returns the index of the woken
/// word, `None` for anything else (a changed value, a timeout, a signal):
/// the caller looks at every word again either way.
///
/// # Errors
///
/// `ENOSYS` (a kernel before 5.16, or a seccomp profile without it) and
/// `EINVAL` (too many words): the caller falls back to other means.
pub(crate) fn wait_any(words: &[Waited<'_>], timeout: Duration) -> std::io::Result<Option<usize>> {
    let waits: Vec<WaitV> = words
        .iter()
        .map(|w| WaitV {
            val: u64::from(w.expected),
            uaddr: w.word.as_ptr() as u64,
            flags: SIZE_U32 | if w.shared { 0 } else { PRIVATE },
            reserved: 0,
        })
        .collect();
    let mut deadline = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `deadline` is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut deadline) };
    let total = u128::from(deadline.tv_sec as u64) * 1_000_000_000
        + deadline.tv_nsec as u128
        + timeout.as_nanos().min(u128::from(u32::MAX) * 1_000_000_000);
    deadline.tv_sec = (total / 1_000_000_000) as libc::time_t;
    deadline.tv_nsec = (total % 1_000_000_000) as libc::c_long;
    // SAFETY:
    // - `waits` holds `waits.len()` valid entries, each naming a live,
    //   aligned 4-byte atomic the caller borrows for the call;
    // - `deadline` is a valid timespec; the kernel only reads both.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_futex_waitv,
            waits.as_ptr(),
            waits.len() as libc::c_uint,
            0 as libc::c_uint,
            &deadline as *const libc::timespec,
            libc::CLOCK_MONOTONIC,
        )
    };
    if rc >= 0 {
        return Ok(Some(rc as usize));
    }
    let error = std::io::Error::last_os_error();
    match error.raw_os_error() {
        Some(libc::EAGAIN | libc::ETIMEDOUT | libc::EINTR) => Ok(None),
        _ => Err(error),
    }
}

/// `futex(word, FUTEX_WAKE, 1)` on a shared word.
pub(crate) fn wake_one(word: &AtomicU32) {
    // SAFETY: `word` is a live, aligned atomic; FUTEX_WAKE does not access it.
    unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, 1) };
}

/// The calling thread's id, as its own PID namespace numbers it (what the
/// kernel compares a robust word with).
pub(crate) fn thread_id() -> u32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() as u32 }
}
