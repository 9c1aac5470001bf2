//! The reaper's state as a session's client knows it: `Serving` with the
//! boot token its listener welcomed it with, from the welcome until the
//! connection closes (the server's end, as far as a client can tell: a
//! reaper SIGKILLed closes its sockets once the kernel has ended it), then
//! `Absent` until a listener welcomes it again (a new token: a new reaper).
//! The pid is not said over a session (0). Waiters sleep on a futex word
//! the sender thread bumps at each change.

use crate::os::futex;
use crate::sync::Ordering::{Acquire, Release};
use crate::table::reaper_life::ReaperState;
use std::sync::atomic::AtomicU32;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The state, and a futex word bumped at each change.
pub(crate) struct ServerState {
    state: Mutex<ReaperState>,
    changes: AtomicU32,
}

impl ServerState {
    /// Serving, with the welcome's `boot_token`.
    pub(crate) fn serving(boot_token: u64) -> ServerState {
        ServerState {
            state: Mutex::new(ReaperState::Serving { boot_token, pid: 0 }),
            changes: AtomicU32::new(0),
        }
    }

    /// The state now.
    pub(crate) fn get(&self) -> ReaperState {
        *self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sets the state; waiters are woken if it changed.
    pub(crate) fn set(&self, now: ReaperState) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if *state != now {
            *state = now;
            self.changes.fetch_add(1, Release);
            futex::wake_all(&self.changes);
        }
    }

    /// Waits up to `wait` for the state to differ from `known`; the state
    /// then.
    pub(crate) fn wait(&self, known: ReaperState, wait: Duration) -> ReaperState {
        let deadline = Instant::now().checked_add(wait);
        loop {
            let changes = self.changes.load(Acquire);
            let now = self.get();
            let left = deadline.map_or(Duration::from_secs(1), |deadline| {
                deadline.saturating_duration_since(Instant::now())
            });
            if now != known || left.is_zero() {
                return now;
            }
            futex::wait(&self.changes, changes, left.min(Duration::from_secs(1)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_waiter_is_woken_by_a_change_and_not_by_the_same_state_again() {
        let server = std::sync::Arc::new(ServerState::serving(7));
        let serving = ReaperState::Serving {
            boot_token: 7,
            pid: 0,
        };
        assert_eq!(server.get(), serving);
        let waiting = server.clone();
        let waiter = std::thread::spawn(move || waiting.wait(serving, Duration::from_secs(10)));
        std::thread::sleep(Duration::from_millis(20));
        server.set(serving);
        server.set(ReaperState::Absent);
        assert_eq!(waiter.join().unwrap(), ReaperState::Absent);
        assert_eq!(
            server.wait(ReaperState::Absent, Duration::from_millis(10)),
            ReaperState::Absent
        );
    }
}
