//! The reaper's life from C: its state now (`livereg_reaper_state`) and a
//! blocking wait for it to change (`livereg_reaper_wait`).

use crate::boundary::{guard, output};
use crate::table::{borrow, livereg_table};
use crate::types::livereg_result;
use livereg::{Error, ReaperState};
use std::time::Duration;

/// The reaper's state, as `livereg_reaper_state` writes it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum livereg_reaper_life {
    /// No reaper holds the table.
    LIVEREG_REAPER_ABSENT = 0,
    /// A reaper holds the table and serves.
    LIVEREG_REAPER_SERVING = 1,
    /// The reaper's process began to end (the kernel marked its life word).
    LIVEREG_REAPER_DYING = 2,
}

impl livereg_reaper_life {
    /// Every value, for the header check.
    #[cfg(test)]
    pub(crate) const ALL: [livereg_reaper_life; 3] = [
        livereg_reaper_life::LIVEREG_REAPER_ABSENT,
        livereg_reaper_life::LIVEREG_REAPER_SERVING,
        livereg_reaper_life::LIVEREG_REAPER_DYING,
    ];
}

/// The core crate's name of a state (`"serving"`, ...), for the header
/// check.
#[cfg(test)]
pub(crate) fn name(life: livereg_reaper_life) -> &'static str {
    let state = match life {
        livereg_reaper_life::LIVEREG_REAPER_ABSENT => ReaperState::Absent,
        livereg_reaper_life::LIVEREG_REAPER_SERVING => ReaperState::Serving {
            boot_token: 1,
            pid: 1,
        },
        livereg_reaper_life::LIVEREG_REAPER_DYING => ReaperState::Dying {
            boot_token: 1,
            pid: 1,
        },
    };
    assert_eq!(parts(state).0, life as u32);
    state.name()
}

/// `state`'s value, boot token and pid (0 and 0 when absent).
fn parts(state: ReaperState) -> (u32, u64, u32) {
    let life = match state {
        ReaperState::Serving { .. } => livereg_reaper_life::LIVEREG_REAPER_SERVING,
        ReaperState::Dying { .. } => livereg_reaper_life::LIVEREG_REAPER_DYING,
        ReaperState::Absent => livereg_reaper_life::LIVEREG_REAPER_ABSENT,
    };
    (
        life as u32,
        state.boot_token().unwrap_or(0),
        state.pid().unwrap_or(0),
    )
}

/// Writes `now` to the caller's outputs (`boot_token` and `pid` may be
/// NULL).
///
/// # Safety
///
/// `state` is NULL or writable; `boot_token` and `pid` are NULL or writable.
unsafe fn write(
    now: ReaperState,
    state: *mut u32,
    boot_token: *mut u64,
    pid: *mut u32,
) -> Result<(), Error> {
    let (life, token, process) = parts(now);
    // SAFETY: the output rule (`output`), this function's `# Safety`.
    *unsafe { output(state, "state") }? = life;
    // SAFETY: NULL (`as_mut` gives `None`) or writable, this function's
    // `# Safety`.
    if let Some(out) = unsafe { boot_token.as_mut() } {
        *out = token;
    }
    // SAFETY: as above.
    if let Some(out) = unsafe { pid.as_mut() } {
        *out = process;
    }
    Ok(())
}

/// `livereg_reaper_state(table, state, boot_token, pid)`.
///
/// # Safety
///
/// `table` is a live handle; `state` is writable; `boot_token` and `pid`
/// are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn livereg_reaper_state(
    table: *const livereg_table,
    state: *mut u32,
    boot_token: *mut u64,
    pid: *mut u32,
) -> livereg_result {
    guard(|| {
        // SAFETY: the handle rule (`handle`), this function's `# Safety`.
        let table = unsafe { borrow(table) }?;
        // SAFETY: this function's `# Safety`.
        unsafe { write(table.reaper_state(), state, boot_token, pid) }
    })
}

/// `livereg_reaper_wait(table, known_state, known_token, wait_ms, state,
/// boot_token, pid)`.
///
/// # Safety
///
/// `table` is a live handle; `state` is writable; `boot_token` and `pid`
/// are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn livereg_reaper_wait(
    table: *const livereg_table,
    known_state: u32,
    known_token: u64,
    wait_ms: u64,
    state: *mut u32,
    boot_token: *mut u64,
    pid: *mut u32,
) -> livereg_result {
    guard(|| {
        // SAFETY: the handle rule (`handle`), this function's `# Safety`.
        let table = unsafe { borrow(table) }?;
        if state.is_null() {
            return Err(crate::boundary::null("state"));
        }
        let now = table.reaper_state();
        let (life, token, _) = parts(now);
        let now = if (life, token) == (known_state, known_token) {
            table.wait_reaper_state(now, Duration::from_millis(wait_ms))
        } else {
            now
        };
        // SAFETY: this function's `# Safety`.
        unsafe { write(now, state, boot_token, pid) }?;
        let (life, token, _) = parts(now);
        if (life, token) == (known_state, known_token) {
            return Err(Error::Timeout(format!(
                "the reaper is still {now} after {wait_ms} ms"
            )));
        }
        Ok(())
    })
}
