//! The reaper's life, as every process that maps the table reads it and
//! waits on it: [`ReaperState`] — `Serving` (with its boot token and pid),
//! `Dying` (the kernel began ending the reaper's process), `Absent` (no
//! reaper holds the role).
//!
//! Two words of the header say it (layout 1.7). The life word is a robust
//! futex held by a thread of the serving reaper's process (see
//! `reaper/life.rs`): it holds that thread's id while the reaper serves;
//! when the process begins to die (SIGKILL, the OOM killer, a crash,
//! `exec`), the kernel sets `OWNER_DIED` in it at the very start of the
//! exit, before the process's memory and files are torn down, and wakes one
//! waiter; that waiter wakes every other one. A reaper that stops gives the
//! word back (0). The change count is bumped whenever a reaper takes or
//! gives back the word, so a waiter sleeps on both and is woken by either.
//!
//! What each state reads, in a few loads (the role's kernel lock is tested
//! only when the word says `OWNER_DIED` or is free, which no serving reaper
//! of this build leaves it):
//!
//! - a live word: `Serving`, with the token and pid its reaper wrote before
//!   taking it;
//! - `OWNER_DIED`: `Dying` while the dead reaper's lock is still held (the
//!   kernel has not finished; a new reaper cannot start before), `Absent`
//!   once it is released;
//! - 0: `Serving` (the header's boot token and pid) if a reaper holds the
//!   role — one of an earlier build, which never takes the word, or one
//!   starting, about to — else `Absent`.
//!
//! A table of an earlier layout has no life word: its state is read from
//! the role and the boot token alone (never `Dying`), and a wait looks
//! again every [`EARLIER_LAYOUT_LOOK`].

use crate::os::futex;
use crate::os::robust::{self, Waited};
use crate::sync::AtomicU32;
use crate::sync::Ordering::{Acquire, Relaxed};
use crate::table::death_protocol::{self, OWNER_DIED, TID_MASK};
use crate::table::layout::REAPER_LIFE_SINCE_MINOR;
use crate::table::handle::Table;
use crate::table::memory::TableMemory;
use std::time::{Duration, Instant};

/// The reaper's state, as a process that maps its table (or, over a
/// session, its client) knows it.
///
/// Two `Serving` states with the same boot token are the same reaper: a
/// new reaper is a new boot token, however fast the restart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReaperState {
    /// A reaper holds the table and serves.
    Serving {
        /// The reaper's boot token (new at every start).
        boot_token: u64,
        /// The reaper's pid, in its own PID namespace.
        pid: u32,
    },
    /// The reaper's process began to end: the kernel marked its life word
    /// at the start of its exit; it runs none of its code any more, and no
    /// new reaper can start before the kernel has finished.
    Dying {
        /// The dying reaper's boot token.
        boot_token: u64,
        /// Its pid, in its own PID namespace.
        pid: u32,
    },
    /// No reaper holds the table.
    Absent,
}

impl ReaperState {
    /// The state's name: `"serving"`, `"dying"` or `"absent"`.
    pub fn name(&self) -> &'static str {
        match self {
            ReaperState::Serving { .. } => "serving",
            ReaperState::Dying { .. } => "dying",
            ReaperState::Absent => "absent",
        }
    }

    /// The boot token of a serving or dying reaper (`None`: absent).
    pub fn boot_token(&self) -> Option<u64> {
        match self {
            ReaperState::Serving { boot_token, .. } | ReaperState::Dying { boot_token, .. } => {
                Some(*boot_token)
            }
            ReaperState::Absent => None,
        }
    }

    /// The pid of a serving or dying reaper (`None`: absent).
    pub fn pid(&self) -> Option<u32> {
        match self {
            ReaperState::Serving { pid, .. } | ReaperState::Dying { pid, .. } => Some(*pid),
            ReaperState::Absent => None,
        }
    }
}

impl std::fmt::Display for ReaperState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReaperState::Serving { boot_token, pid } | ReaperState::Dying { boot_token, pid } => {
                write!(f, "{} (pid {pid}, boot token {boot_token:#x})", self.name())
            }
            ReaperState::Absent => f.write_str("absent"),
        }
    }
}

/// How often a wait looks at a table of an earlier layout (no life word).
pub(crate) const EARLIER_LAYOUT_LOOK: Duration = Duration::from_millis(50);

/// How often a wait looks at the role while the reaper is dying: the
/// kernel's end of the process (its lock released) wakes no futex.
const DYING_LOOK: Duration = Duration::from_millis(10);

/// The longest a wait sleeps before it looks again anyway (a wake lost to
/// a waiter that died as it was woken costs at most this).
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// Whether `value`, read from the life word, is a serving reaper's.
pub(crate) fn is_live(value: u32) -> bool {
    value & OWNER_DIED == 0 && value & TID_MASK != 0
}

/// The state the words say, read consistently: the change count is the
/// same before and after the reads (a reaper starting or stopping between
/// them is read again; after a few tries, what was read stands).
fn read_words(memory: &TableMemory) -> ReaperState {
    let header = memory.header();
    let mut tries = 0;
    loop {
        let before = header.reaper_life_changes.load(Acquire);
        let life = header.reaper_life.load(Acquire);
        let boot_token = header.reaper_life_token.load(Relaxed);
        let pid = header.reaper_life_pid.load(Relaxed);
        let fresh = header.reaper_life_changes.load(Acquire) == before;
        tries += 1;
        if !fresh && tries < 4 {
            continue;
        }
        return if is_live(life) {
            ReaperState::Serving { boot_token, pid }
        } else if life & OWNER_DIED != 0 {
            match memory.reaper_role_taken() {
                true => ReaperState::Dying { boot_token, pid },
                false => ReaperState::Absent,
            }
        } else {
            from_the_role(memory)
        };
    }
}

/// The state without a life word: serving if a reaper holds the role.
fn from_the_role(memory: &TableMemory) -> ReaperState {
    let header = memory.header();
    match memory.reaper_role_taken() {
        true => ReaperState::Serving {
            boot_token: header.boot_token.load(Acquire),
            pid: header.reaper_pid.load(Relaxed),
        },
        false => ReaperState::Absent,
    }
}

impl TableMemory {
    /// Whether the table has the reaper's life word (layout 1.7 and later,
    /// its object whole).
    fn has_life_word(&self) -> bool {
        self.minor >= REAPER_LIFE_SINCE_MINOR && self.check_size().is_ok()
    }

    /// The reaper's state now.
    pub(crate) fn reaper_state(&self) -> ReaperState {
        if self.check_size().is_err() {
            // A truncated table's header is not touched.
            return ReaperState::Absent;
        }
        match self.has_life_word() {
            true => read_words(self),
            false => from_the_role(self),
        }
    }

    /// Waits up to `wait` for the reaper's state to differ from `known`;
    /// returns the state then (still `known` when the time ran out).
    pub(crate) fn wait_reaper_state(&self, known: ReaperState, wait: Duration) -> ReaperState {
        let deadline = Instant::now().checked_add(wait);
        loop {
            let life_word = self.has_life_word();
            let changes = life_word.then(|| self.header().reaper_life_changes.load(Acquire));
            let now = self.reaper_state();
            let left = match deadline {
                Some(deadline) => deadline.saturating_duration_since(Instant::now()),
                None => LOOK_EVERY,
            };
            if now != known || left.is_zero() {
                return now;
            }
            let Some(changes) = changes else {
                std::thread::sleep(left.min(EARLIER_LAYOUT_LOOK));
                continue;
            };
            let look = match now {
                ReaperState::Dying { .. } => DYING_LOOK,
                _ => LOOK_EVERY,
            };
            self.sleep_on_life(changes, left.min(look));
        }
    }

    /// Sleeps until the change count moves from `changes`, the kernel
    /// marks the life word, or `timeout` passes (spurious returns allowed).
    fn sleep_on_life(&self, changes: u32, timeout: Duration) {
        let header = self.header();
        let mut waited = vec![Waited {
            word: &header.reaper_life_changes,
            expected: changes,
            shared: true,
        }];
        let life = &header.reaper_life;
        if is_live(life.load(Acquire)) {
            // With `WAITERS` set, the kernel wakes a waiter when it marks
            // the word; `None`: it changed just now (look again).
            match death_protocol::wait_on(life) {
                Some(expected) => waited.push(Waited {
                    word: life,
                    expected,
                    shared: true,
                }),
                None => return,
            }
        }
        match robust::wait_any(&waited, timeout) {
            // The kernel wakes one waiter of a word it marks: that one
            // wakes the others (each process's waiters and watch thread).
            Ok(Some(1)) if death_protocol::is_marked(life) => futex::wake_all(life),
            Ok(_) => {}
            // No `futex_waitv` (Linux before 5.16): the change count alone,
            // and the life word looked at every `DYING_LOOK`.
            Err(_) => futex::wait(&header.reaper_life_changes, changes, timeout.min(DYING_LOOK)),
        }
    }
}

impl Table {
    /// The table's reaper now: [`ReaperState::Serving`] (its boot token
    /// and pid), [`ReaperState::Dying`] (the kernel began ending its
    /// process) or [`ReaperState::Absent`]. A few loads of the header; the
    /// reaper role's lock is tested only when no serving reaper holds the
    /// life word.
    ///
    /// # Examples
    ///
    /// ```
    /// use livereg::{ReaperState, Table, TableOptions};
    ///
    /// let table = Table::in_memory(&TableOptions::default())?;
    /// assert_eq!(table.reaper_state(), ReaperState::Absent);
    /// let reaper = table.reaper().build()?;
    /// assert_eq!(
    ///     table.reaper_state(),
    ///     ReaperState::Serving { boot_token: reaper.boot_token(), pid: std::process::id() }
    /// );
    /// drop(reaper);
    /// assert_eq!(table.reaper_state(), ReaperState::Absent);
    /// # Ok::<(), livereg::Error>(())
    /// ```
    pub fn reaper_state(&self) -> ReaperState {
        self.memory.reaper_state()
    }

    /// Waits up to `wait` for the reaper's state to differ from `known`
    /// (the state the caller last acted on), without polling: a futex
    /// wait on the header's life words, woken by the kernel when the
    /// reaper's process begins to die and by a reaper that starts or
    /// stops. Returns the state then — `known` again when `wait` ran out.
    /// While the reaper is dying, its end (`Absent`) is looked for every
    /// 10 ms; on a table of an earlier layout (no life word), every 50 ms.
    pub fn wait_reaper_state(&self, known: ReaperState, wait: Duration) -> ReaperState {
        self.memory.wait_reaper_state(known, wait)
    }
}

/// The count `changes` once more, and every waiter on it woken.
pub(crate) fn announce(changes: &AtomicU32) {
    changes.fetch_add(1, crate::sync::Ordering::Release);
    futex::wake_all(changes);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::death_protocol::WAITERS;

    #[test]
    fn only_a_thread_id_without_the_kernel_mark_is_a_serving_reaper() {
        assert!(is_live(42));
        assert!(is_live(42 | WAITERS));
        assert!(!is_live(0));
        assert!(!is_live(WAITERS));
        assert!(!is_live(OWNER_DIED));
        assert!(!is_live(OWNER_DIED | WAITERS));
    }

    #[test]
    fn a_state_names_itself_and_says_its_reaper() {
        let serving = ReaperState::Serving {
            boot_token: 0xab,
            pid: 7,
        };
        assert_eq!(serving.to_string(), "serving (pid 7, boot token 0xab)");
        assert_eq!((serving.boot_token(), serving.pid()), (Some(0xab), Some(7)));
        let dying = ReaperState::Dying {
            boot_token: 0xab,
            pid: 7,
        };
        assert_eq!(dying.name(), "dying");
        assert_ne!(serving, dying);
        assert_eq!(ReaperState::Absent.to_string(), "absent");
        assert_eq!(ReaperState::Absent.boot_token(), None);
    }
}
