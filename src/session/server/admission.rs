//! Admission: which connections a listener accepts, and when it pauses.
//! Connections that have proven nothing are a bounded pool whose oldest is
//! closed for a newcomer only after its grace; accepting pauses while none
//! has had it, and while descriptors are short.

use super::listener::{ListenLoop, Paused, ACCEPT, FIRST_CONNECTION};
use super::penalties::Source;
use super::served::Connection;
use crate::session::server::limited_log::limited_log;
use crate::session::stream::Stream;
use std::io::ErrorKind;
use std::time::{Duration, Instant};

/// Connections that have not yet proven anything (no `Hello` accepted)
/// that a listener keeps beside the sessions it holds. A newcomer over it
/// closes the oldest of them once that one had [`GREETING_GRACE`]; until
/// then newcomers wait in the kernel's backlog. So a client that says hello
/// within the grace of being accepted always gets in, however many idle
/// connections a peer holds open.
pub const GREETING_MAX: usize = 64;

/// How long a connection, once accepted, is sure to stay open for its
/// `Hello` to arrive, whatever newer connections come: a client sends it
/// right after its connect, but a busy host may run the client's next
/// write some milliseconds after the listener accepted it. While all
/// [`GREETING_MAX`] greeting connections are younger, the listener stops
/// accepting (at most this long): under a flood of idle connections it
/// admits [`GREETING_MAX`] per grace, in the order they connected.
pub const GREETING_GRACE: Duration = Duration::from_millis(100);

/// Connections accepted per turn of the listener; the others wait in the
/// backlog while the accepted ones' greetings are read.
const ACCEPTS_PER_TURN: usize = 16;

/// After `accept` fails for want of descriptors, the listener stops
/// accepting this long, doubling while it lasts, up to [`LONGEST_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(10);
const LONGEST_PAUSE: Duration = Duration::from_secs(1);

impl ListenLoop {
    /// Accepts up to [`ACCEPTS_PER_TURN`] connections, reading each one's
    /// greeting at once (a client sends it with its connect).
    pub(super) fn accept_some(&mut self) {
        self.urgent = true;
        for _ in 0..ACCEPTS_PER_TURN {
            if let Err(until) = self.make_greeting_room() {
                return self.pause_accepting(until, Paused::Greetings);
            }
            match self.acceptor.accept() {
                Ok((stream, peer, source)) => {
                    self.last_pause = Duration::ZERO;
                    self.take(stream, peer, source);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                    return self.out_of_descriptors(&e);
                }
                Err(e) => {
                    limited_log!(
                        log::Level::Warn,
                        "table '{}': cannot accept a session: {e}",
                        self.gate.table.name()
                    );
                    return;
                }
            }
        }
    }

    /// Out of descriptors: stops accepting for a while (the listening
    /// socket would be ready, and fail, in a loop) and closes the oldest
    /// greeting connection, so a descriptor is free when accepting resumes.
    pub(super) fn out_of_descriptors(&mut self, error: &std::io::Error) {
        let pause = (self.last_pause * 2).clamp(FIRST_PAUSE, LONGEST_PAUSE);
        self.last_pause = pause;
        self.pause_accepting(Instant::now() + pause, Paused::Descriptors);
        self.close_oldest_greeting();
        limited_log!(
            log::Level::Warn,
            "table '{}': cannot accept a session: {error}; accepting paused for {pause:?} ({} connections open)",
            self.gate.table.name(),
            self.connections.iter().flatten().count()
        );
    }

    /// Stops polling the listening socket until `until` (newcomers wait in
    /// the kernel's backlog).
    pub(super) fn pause_accepting(&mut self, until: Instant, why: Paused) {
        if self.epoll.remove(&self.acceptor).is_err() {
            std::thread::sleep(until.saturating_duration_since(Instant::now()));
            return;
        }
        self.accept_paused = Some((until, why));
    }

    /// Accepting resumes when its pause is over, or, paused for want of
    /// room among the greeting connections, as soon as one moved on.
    pub(super) fn resume_accepting(&mut self) {
        let Some((until, why)) = self.accept_paused else {
            return;
        };
        let room = why == Paused::Greetings && {
            self.forget_moved_on();
            self.greeting.len() < GREETING_MAX
        };
        if (room || Instant::now() >= until) && self.epoll.add_level(&self.acceptor, ACCEPT).is_ok()
        {
            self.accept_paused = None;
        }
    }

    /// Makes room for one more greeting connection: below [`GREETING_MAX`]
    /// there is; at it, the oldest is closed if it had its
    /// [`GREETING_GRACE`]. `Err`: none had, and when the oldest will have.
    pub(super) fn make_greeting_room(&mut self) -> std::result::Result<(), Instant> {
        if self.greeting.len() < GREETING_MAX {
            return Ok(());
        }
        self.forget_moved_on();
        while self.greeting.len() >= GREETING_MAX {
            let Some(&(entry, _)) = self.greeting.front() else {
                break;
            };
            let graced = self.connections[entry]
                .as_ref()
                .map_or(Instant::now(), |oldest| oldest.opened + GREETING_GRACE);
            if Instant::now() < graced {
                return Err(graced);
            }
            self.close_oldest_greeting();
        }
        Ok(())
    }

    /// Drops from the greeting queue the connections that said hello or
    /// were closed.
    pub(super) fn forget_moved_on(&mut self) {
        let connections = &self.connections;
        self.greeting
            .retain(|&(entry, serial)| is_greeting(connections, entry, serial));
    }

    /// Serves a new connection (room was made for it among the greeting
    /// ones): its greeting is read if it came.
    pub(super) fn take(&mut self, stream: Stream, peer: String, source: Source) {
        if stream.set_nonblocking(true).is_err() {
            return;
        }
        let entry = match self.connections.iter().position(Option::is_none) {
            Some(free) => free,
            None => {
                self.connections.push(None);
                self.connections.len() - 1
            }
        };
        let key = entry as u64 + FIRST_CONNECTION;
        let added = if stream.short_read_drains() {
            self.epoll.add_edge(&stream, key)
        } else {
            self.epoll.add_level(&stream, key)
        };
        if added.is_err() {
            return;
        }
        let serial = self.next_serial;
        self.next_serial += 1;
        self.connections[entry] = Some(Connection::new(stream, peer, source, serial));
        self.greeting.push_back((entry, serial));
        self.on_readable(entry);
    }

    /// Closes the connection that has been greeting longest.
    pub(super) fn close_oldest_greeting(&mut self) {
        while let Some((entry, serial)) = self.greeting.pop_front() {
            if is_greeting(&self.connections, entry, serial) {
                if let Some(served) = &self.connections[entry] {
                    limited_log!(
                        log::Level::Debug,
                        "session from {}: closed unheard to make room for a newer connection ({GREETING_MAX} were greeting)",
                        served.peer
                    );
                }
                self.close(entry, None);
                return;
            }
        }
    }
}

/// Whether `entry` is still the connection `serial`, and still greeting.
fn is_greeting(connections: &[Option<Connection>], entry: usize, serial: u64) -> bool {
    connections
        .get(entry)
        .and_then(Option::as_ref)
        .is_some_and(|served| served.serial == serial && served.is_greeting())
}
