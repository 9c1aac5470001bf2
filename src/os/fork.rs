//! What a `fork` child inherits, and how it is kept from being confused with
//! its parent.
//!
//! A forked child inherits every descriptor, and with it a share of each open
//! file description and of the locks on it: a child would keep its parent's
//! registration lock (and reaper lock) held after the parent died, hiding the
//! parent's death. It also inherits copies of the parent's handles.
//!
//! So, once a process has a worker or a reaper, a `pthread_atfork` child
//! handler (1) points every inherited lock descriptor at `/dev/null` with
//! `dup2`, dropping the child's share of the description without touching the
//! parent's lock, and (2) advances a fork epoch, which makes inherited
//! [`Worker`](crate::worker::handle::Worker) handles report `Evicted` and leave the parent's
//! registration alone. A child registers cleanly by calling `register` itself.

use std::cell::UnsafeCell;
use std::fs::File;
use std::mem::ManuallyDrop;
use std::ops::Deref;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Once;

/// Advanced in every forked child: handles made before the fork are stale.
static EPOCH: AtomicU64 = AtomicU64::new(0);

/// The descriptors holding locks, guarded by a spin flag that the fork
/// handlers hold across `fork` (a mutex could not be taken in the child).
struct Descriptors {
    busy: AtomicBool,
    fds: UnsafeCell<Vec<RawFd>>,
}

// SAFETY:
// - `fds` is only accessed while `busy` is held (see `with`), so accesses
//   from different threads never overlap.
unsafe impl Sync for Descriptors {}

static DESCRIPTORS: Descriptors = Descriptors {
    busy: AtomicBool::new(false),
    fds: UnsafeCell::new(Vec::new()),
};

fn acquire() {
    while DESCRIPTORS.busy.swap(true, Ordering::Acquire) {
        std::hint::spin_loop();
    }
}

fn release() {
    DESCRIPTORS.busy.store(false, Ordering::Release);
}

fn with<R>(f: impl FnOnce(&mut Vec<RawFd>) -> R) -> R {
    acquire();
    // SAFETY: `busy` is held, so this is the only access (see `Descriptors`).
    let result = f(unsafe { &mut *DESCRIPTORS.fds.get() });
    release();
    result
}

extern "C" fn before_fork() {
    acquire();
}

extern "C" fn in_parent() {
    release();
}

extern "C" fn in_child() {
    EPOCH.fetch_add(1, Ordering::Relaxed);
    // SAFETY:
    // - only the forking thread exists in the child, and it holds `busy`
    //   (taken in `before_fork`), so this is the only access to `fds`;
    // - `open` and `dup2` are async-signal-safe, as a fork handler requires;
    //   nothing here allocates.
    unsafe {
        let fds = &*DESCRIPTORS.fds.get();
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
        if null >= 0 {
            for &fd in fds {
                libc::dup2(null, fd);
            }
            libc::close(null);
        }
    }
    // SAFETY: as above; `clear` neither allocates nor frees. The child's
    // list starts empty: its descriptors now point at /dev/null.
    unsafe { (*DESCRIPTORS.fds.get()).clear() };
    release();
}

/// The current fork epoch; a handle made in another epoch is not ours. It
/// advances only once [`install`] has run (every handle's maker runs it).
#[inline]
pub(crate) fn epoch() -> u64 {
    EPOCH.load(Ordering::Relaxed)
}

/// Installs the fork handlers (once per process), so that from now on every
/// forked child sees a new [`epoch`]; returns the current one.
pub(crate) fn install() -> u64 {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        // SAFETY:
        // - the three handlers are `extern "C"` functions valid for the life
        //   of the process, and do only what a fork handler may.
        unsafe { libc::pthread_atfork(Some(before_fork), Some(in_parent), Some(in_child)) };
    });
    epoch()
}

/// A fact about this process (its start time, its time namespace) computed
/// once per process: a forked child computes its own instead of inheriting
/// its parent's. Lock-free, so a child forked while another thread fills it
/// cannot deadlock.
pub(crate) struct PerProcess {
    /// `epoch + 1` of the process that computed `value`; 0 before.
    epoch: AtomicU64,
    value: AtomicU64,
}

impl PerProcess {
    pub(crate) const fn new() -> PerProcess {
        PerProcess {
            epoch: AtomicU64::new(0),
            value: AtomicU64::new(0),
        }
    }

    /// The value for this process, computing it with `compute` if this
    /// process has not yet (racing threads compute the same value).
    pub(crate) fn get(&self, compute: impl FnOnce() -> u64) -> u64 {
        let current = install() + 1;
        // Acquire: pairs with the release below, so `value` is this epoch's.
        if self.epoch.load(Ordering::Acquire) == current {
            return self.value.load(Ordering::Relaxed);
        }
        let value = compute();
        self.value.store(value, Ordering::Relaxed);
        self.epoch.store(current, Ordering::Release);
        value
    }
}

/// A descriptor that holds locks a forked child must not inherit.
pub(crate) struct LockDescriptor(ManuallyDrop<File>);

impl LockDescriptor {
    pub(crate) fn new(file: File) -> LockDescriptor {
        track(file.as_raw_fd());
        LockDescriptor(ManuallyDrop::new(file))
    }
}

impl Deref for LockDescriptor {
    type Target = File;

    fn deref(&self) -> &File {
        &self.0
    }
}

impl Drop for LockDescriptor {
    fn drop(&mut self) {
        // Untracked and closed under the flag the fork handlers hold: a fork
        // from another thread sees it either tracked (the child points it at
        // /dev/null) or closed, never open and untracked.
        with(|fds| {
            let fd = self.0.as_raw_fd();
            fds.retain(|&tracked| tracked != fd);
            // SAFETY: `self.0` is dropped here once, and never used again
            // (this is `drop`).
            unsafe { ManuallyDrop::drop(&mut self.0) };
        });
    }
}

fn track(fd: RawFd) {
    install();
    with(|fds| fds.push(fd));
}
