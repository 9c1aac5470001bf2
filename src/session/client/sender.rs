//! The sender thread of a session's client: forwards what the worker's own
//! slot says (heartbeats, busy, progress) to the listener several times per
//! reap timeout (unless the listener reads that slot itself, in the region
//! it shared), delivers the listener's notices (an ending, the info area)
//! and reconnects after a break.

use super::dial::{Dialed, Dialer};
use super::server_state::ServerState;
use crate::table::reaper_life::ReaperState;
use crate::clock::{Stamps, STAMP_LAG_TICKS};
use crate::error::Error;
use crate::event::Reason;
use crate::os::{eventfd, poll};
use crate::absence::absence_threshold;
use crate::session::stream::{send, Received};
use crate::session::timing::{forward_interval, SILENT_TIMEOUTS_MAX};
use crate::table::region::Pulse;
use crate::session::wire::{Frame, HEARD_SINCE};
use crate::sync::Ordering::{Acquire, Relaxed};
use crate::table::handle::Table;
use crate::table::layout::Slot;
use crate::table::protocol::{self, Beat};
use crate::worker::nature::Nature;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The first wait before a reconnect; doubled after each failure, up to a
/// forward interval.
const FIRST_BACKOFF: Duration = Duration::from_millis(10);

/// How long a deregistration waits for the sender to say goodbye.
const BYE_WAIT: Duration = Duration::from_secs(2);

/// What the worker handle and its sender thread share.
struct Shared {
    /// Set by the handle when it deregisters (or is dropped).
    finishing: AtomicBool,
    /// Wakes the sender thread at once.
    wake: OwnedFd,
    /// The server's info area, as last delivered.
    info: Mutex<Vec<u8>>,
    /// The reaper's state: serving while connected, absent between.
    server: ServerState,
}

/// The worker handle's end of its session.
pub(crate) struct SessionLink {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    /// The registration's slot and generation in the reaper's table.
    pub slot: u32,
    pub generation: u32,
    /// The reaper's table's reap timeout, as the listener said.
    pub reap_timeout: Duration,
    /// How to reach the listener again, for a clear.
    listener: Dialer,
    /// The worker's private slot its sender forwards: (slot, generation).
    private: (Table, u32, u32),
}

impl SessionLink {
    /// Starts the sender thread for `worker`'s private slot over `dialed`.
    pub(crate) fn start(
        dialer: Dialer,
        dialed: Dialed,
        worker: &crate::worker::handle::Worker,
    ) -> crate::error::Result<SessionLink> {
        let shared = Arc::new(Shared {
            finishing: AtomicBool::new(false),
            wake: eventfd::event_nonblocking().map_err(|e| crate::error::Error::Io {
                context: format!("session {}: make the sender's wake-up", dialer.address),
                source: e,
            })?,
            info: Mutex::new(dialed.info.clone().unwrap_or_default()),
            server: ServerState::serving(dialed.boot_token),
        });
        let (slot, generation) = (dialed.reclaim.slot, dialed.reclaim.generation);
        let reap_timeout = dialed.reap_timeout;
        let mut sender = Sender {
            dialer: dialer.clone(),
            shared: shared.clone(),
            table: worker.pinged_table().clone(),
            index: worker.local_slot(),
            generation: worker.local_generation(),
            region: dialed.region.as_ref().and_then(identity),
            pulse: dialed.region.as_ref().and_then(|r| Pulse::of(r).ok()),
            listener_pulse: 0,
            reads_slot: false,
            dialed,
            heard: Instant::now(),
        };
        sender.reads_slot = sender.listener_reads_slot();
        let thread = std::thread::Builder::new()
            .name("livereg-session".into())
            .spawn(move || sender.run())
            .map_err(|e| crate::error::Error::Io {
                context: "start the session's sender thread".into(),
                source: e,
            })?;
        Ok(SessionLink {
            shared,
            thread: Some(thread),
            slot,
            generation,
            reap_timeout,
            listener: dialer,
            private: (
                worker.pinged_table().clone(),
                worker.local_slot(),
                worker.local_generation(),
            ),
        })
    }
}

impl Nature for SessionLink {
    fn slot(&self) -> u32 {
        self.slot
    }

    fn generation(&self) -> u32 {
        self.generation
    }

    fn reap_timeout(&self) -> Duration {
        self.reap_timeout
    }

    /// The registration is in the reaper's table, which this process
    /// does not map.
    fn table(&self) -> Option<&Table> {
        None
    }

    /// As the listener last delivered it.
    fn info(&self) -> crate::error::Result<Vec<u8>> {
        Ok(self
            .shared
            .info
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone())
    }

    /// Through a connection of its own to the listener (same address,
    /// token and TLS). A reset ended this registration on the reaper's
    /// side; the private slot says so before this returns, not when the
    /// listener's notice arrives.
    fn request_clear(&self, reset: bool, wait: Duration) -> crate::error::Result<()> {
        self.listener.request_clear(reset, wait)?;
        if reset {
            let (table, index, generation) = &self.private;
            let _ = protocol::end(table.memory.slot(*index), *generation, Reason::Cleared);
        }
        Ok(())
    }

    /// Serving while connected (with the welcoming reaper's token), absent
    /// from the connection's close until a listener welcomes it again.
    fn reaper_state(&self) -> ReaperState {
        self.shared.server.get()
    }

    fn wait_reaper_state(&self, known: ReaperState, wait: Duration) -> ReaperState {
        self.shared.server.wait(known, wait)
    }

    /// Tells the sender the worker deregistered (its slot says so) and
    /// waits, a bounded time, for it to say goodbye.
    fn finish(&mut self) {
        self.shared.finishing.store(true, Relaxed);
        eventfd::signal(&self.shared.wake);
        if let Some(thread) = self.thread.take() {
            let deadline = Instant::now() + BYE_WAIT;
            while !thread.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            if thread.is_finished() {
                let _ = thread.join();
            }
        }
    }
}

/// The sender thread's state.
struct Sender {
    dialer: Dialer,
    shared: Arc<Shared>,
    /// The worker's private table and its slot there.
    table: Table,
    index: u32,
    generation: u32,
    dialed: Dialed,
    /// When the listener was last heard from (any frame, or the welcome).
    heard: Instant,
    /// The region the worker beats in, if its listener shared one (its
    /// device and inode): while a connection's listener reads that very
    /// region, nothing is forwarded.
    region: Option<(u64, u64)>,
    /// Its listener's pulse in that region.
    pulse: Option<Pulse>,
    /// That pulse as last seen: a change is the client heard (the reaper
    /// bumps it as it pulls the region; no `Heard` is sent).
    listener_pulse: u64,
    /// Whether the current connection's listener reads the worker's slot
    /// in that region (set with each connection).
    reads_slot: bool,
}

/// A region's identity: its device and inode.
fn identity(region: &std::fs::File) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    region.metadata().ok().map(|meta| (meta.dev(), meta.ino()))
}

/// Why a connection's service ended.
enum ConnectionEnd {
    /// The worker deregistered (goodbye said) or its registration ended.
    Done,
    /// The connection broke: reconnect.
    Broken,
}

impl Sender {
    fn slot(&self) -> &Slot {
        self.table.memory.slot(self.index)
    }

    /// Whether the listener of this connection reads the worker's slot in
    /// the region it shared: then its beats are not forwarded. (A listener
    /// that shares another, after a reaper's restart, or none, gets beats
    /// as frames, and a listener that reads a region stops reading it at
    /// the first beat frame.)
    fn listener_reads_slot(&self) -> bool {
        self.region.is_some()
            && self.pulse.is_some()
            && self.dialed.region.as_ref().and_then(identity) == self.region
    }

    /// Goes on over a new connection.
    fn connected(&mut self, dialed: Dialed) {
        self.dialed = dialed;
        self.reads_slot = self.listener_reads_slot();
    }

    fn run(&mut self) {
        loop {
            match self.run_connection() {
                ConnectionEnd::Done => {
                    self.shared.server.set(ReaperState::Absent);
                    return;
                }
                ConnectionEnd::Broken => {
                    self.shared.server.set(ReaperState::Absent);
                    if !self.reconnect() {
                        return;
                    }
                    self.shared.server.set(ReaperState::Serving {
                        boot_token: self.dialed.boot_token,
                        pid: 0,
                    });
                }
            }
        }
    }

    /// How often it forwards (or, while it beats in a region, looks at its
    /// listener's pulse there): every `T/8`.
    fn interval(&self) -> Duration {
        forward_interval(self.dialed.reap_timeout)
    }

    /// Runs the current connection until it breaks or the session is over.
    fn run_connection(&mut self) -> ConnectionEnd {
        let interval = self.interval();
        let mut next_forward = Instant::now();
        self.heard = Instant::now();
        let away = absence_threshold(self.dialed.reap_timeout);
        let mut ran = Instant::now();
        loop {
            // A gap in this thread's own running (its process stopped, its
            // host frozen) is no silence of the listener's: it counts anew.
            if ran.elapsed() > away {
                self.heard = Instant::now();
            }
            ran = Instant::now();
            if self.shared.finishing.load(Relaxed) || self.ended_here().is_some() {
                return self.goodbye();
            }
            if Instant::now() >= next_forward {
                // What the listener sent comes first: after this process
                // was stopped, an `Ended` (or a `Heard`) may wait in the
                // socket, and is read before a beat is written to a closed
                // connection or the listener is judged unheard.
                if let Some(outcome) = self.receive() {
                    return outcome;
                }
                match &self.pulse {
                    Some(pulse) if self.reads_slot => {
                        let listener = pulse.listener();
                        if listener != self.listener_pulse {
                            self.listener_pulse = listener;
                            self.heard = Instant::now();
                        }
                    }
                    _ => {
                        if self.forward().is_err() {
                            return ConnectionEnd::Broken;
                        }
                    }
                }
                if let Some(outcome) = self.unheard() {
                    return outcome;
                }
                next_forward += interval;
                if next_forward < Instant::now() {
                    next_forward = Instant::now() + interval;
                }
            }
            let wait = next_forward.saturating_duration_since(Instant::now());
            let fds = [self.dialed.stream.as_raw_fd(), self.shared.wake.as_raw_fd()];
            let Ok(ready) = poll::readable(&fds, wait) else {
                return ConnectionEnd::Broken;
            };
            if ready[1] {
                eventfd::drain(&self.shared.wake);
            }
            if ready[0] {
                if let Some(outcome) = self.receive() {
                    return outcome;
                }
            }
        }
    }

    /// Reads the listener's frames: an ending is written into the worker's
    /// slot (its next heartbeat hears it), the info area is kept.
    fn receive(&mut self) -> Option<ConnectionEnd> {
        let _ = self.dialed.stream.set_nonblocking(true);
        let received = self.dialed.inbox.receive(&mut self.dialed.stream);
        let _ = self.dialed.stream.set_nonblocking(false);
        let (frames, closed) = match received {
            Ok(Received::Frames(frames)) => (frames, false),
            Ok(Received::Closed(frames)) => (frames, true),
            Err(_) => return Some(ConnectionEnd::Broken),
        };
        if !frames.is_empty() {
            self.heard = Instant::now();
        }
        for frame in frames {
            match frame {
                Frame::Heard {} => {}
                Frame::Ended { reason } => {
                    self.end_here(reason);
                    return Some(ConnectionEnd::Done);
                }
                Frame::Info { bytes } => {
                    *self.shared.info.lock().unwrap_or_else(|p| p.into_inner()) = bytes;
                }
                other => {
                    log::debug!(
                        "session {}: unexpected {} frame: reconnecting",
                        self.dialer.address,
                        other.name()
                    );
                    return Some(ConnectionEnd::Broken);
                }
            }
        }
        closed.then_some(ConnectionEnd::Broken)
    }

    /// Sends a beat: what the slot says now, changed or not (an unchanged
    /// one tells the listener how long the engine has been silent).
    fn forward(&mut self) -> std::io::Result<()> {
        let slot = self.slot();
        let heartbeats = slot.beats.load(Relaxed);
        let protocol::Progress { busy, steps } =
            protocol::decode_progress(slot.progress.load(Relaxed));
        let since_ping_us = match protocol::decode_beat(slot.beat.load(Acquire)) {
            Beat::At(stamp) => {
                let stamps = self.table.memory.stamps;
                let clock_now = self.table.clock.stamp_micros(stamps);
                let beat_us = stamp.ns_near(clock_now * 1_000) / 1_000;
                // A coarse stamp may lag its heartbeat by up to
                // STAMP_LAG_TICKS ticks (as the reaper allows locally): the
                // age is told that much shorter, so the listener never
                // dates a heartbeat earlier than it was.
                let lag_us = match stamps {
                    Stamps::Coarse { resolution_ns } => {
                        resolution_ns * u64::from(STAMP_LAG_TICKS) / 1_000
                    }
                    Stamps::Precise => 0,
                };
                clock_now.saturating_sub(beat_us).saturating_sub(lag_us)
            }
            _ => 0,
        };
        send(
            &mut self.dialed.stream,
            &Frame::Beat {
                heartbeats,
                since_ping_us,
                busy,
                steps,
            },
        )?;
        Ok(())
    }

    /// When the listener has said nothing for `T` (it sends `Heard` every
    /// `T/4`), the path may be black-holed (a partition drops everything
    /// and closes nothing): tries to reclaim over a new connection, keeping
    /// the old one until that succeeds, since a stopped listener that
    /// resumes reads the old one's beats. A refusal other than "held
    /// already" is the registration's end; after [`SILENT_TIMEOUTS_MAX`]
    /// timeouts unheard the client gives it up (`disconnected`).
    fn unheard(&mut self) -> Option<ConnectionEnd> {
        let timeout = self.dialed.reap_timeout;
        let silent = self.heard.elapsed();
        if silent < timeout || self.dialed.version < HEARD_SINCE {
            return None; // a listener of protocol 1 sends no `Heard`
        }
        if silent >= timeout * SILENT_TIMEOUTS_MAX {
            log::warn!(
                "session {}: the listener was not heard for {silent:?}: the registration is over",
                self.dialer.address
            );
            self.end_here(Reason::Disconnected);
            return Some(ConnectionEnd::Done);
        }
        match self
            .dialer
            .dial_within(Some(self.dialed.reclaim), self.interval())
        {
            Ok(dialed) => {
                log::warn!(
                    "session {}: the listener was not heard for {silent:?}: reconnected",
                    self.dialer.address
                );
                if let Some(info) = &dialed.info {
                    *self.shared.info.lock().unwrap_or_else(|p| p.into_inner()) = info.clone();
                }
                self.connected(dialed);
                self.heard = Instant::now();
                None
            }
            Err(Error::Io { .. } | Error::Timeout(_) | Error::Busy { .. }) => None,
            Err(refusal) => {
                log::warn!(
                    "session {}: the listener was not heard for {silent:?}; reclaim refused: {refusal}",
                    self.dialer.address
                );
                self.end_here(ended_for(&refusal));
                Some(ConnectionEnd::Done)
            }
        }
    }

    /// The reason the worker's own slot ended for, if it has.
    fn ended_here(&self) -> Option<Reason> {
        match protocol::decode_beat(self.slot().beat.load(Acquire)) {
            Beat::Ended(reason) => Some(reason.unwrap_or(Reason::Disconnected)),
            _ => None,
        }
    }

    /// Ends the worker's own slot: its next heartbeat returns `Evicted`.
    fn end_here(&self, reason: Reason) {
        let _ = protocol::end(self.slot(), self.generation, reason);
    }

    /// The worker deregistered: forwards its last beats, then says bye.
    fn goodbye(&mut self) -> ConnectionEnd {
        if self.ended_here() == Some(Reason::Deregistered) {
            if !self.reads_slot {
                let _ = self.forward();
            }
            let _ = send(&mut self.dialed.stream, &Frame::Bye {});
        }
        self.dialed.stream.shutdown();
        ConnectionEnd::Done
    }

    /// After a break: reconnects with backoff and reclaims the
    /// registration. False (the worker's slot ended `Disconnected`) if the
    /// listener refused, or no listener took it back within the reap
    /// timeout; false too if the worker deregistered meanwhile.
    ///
    /// The outage is the time this thread ran without reaching a listener:
    /// a step that overran what it may take by more than the absence
    /// threshold was a gap in its own running (its process stopped, its
    /// host frozen), no listener's absence, and the outage counts anew from
    /// its end, as [`Sender::run_connection`] counts silence.
    fn reconnect(&mut self) -> bool {
        let mut lost = Instant::now();
        let away = absence_threshold(self.dialed.reap_timeout);
        let overran = |started: Instant, may_take: Duration| started.elapsed() > may_take + away;
        let mut backoff = FIRST_BACKOFF;
        log::warn!(
            "session {}: connection lost, reconnecting",
            self.dialer.address
        );
        loop {
            if self.shared.finishing.load(Relaxed) || self.ended_here().is_some() {
                return false;
            }
            if lost.elapsed() >= self.dialed.reap_timeout {
                log::warn!(
                    "session {}: no listener took the registration back within {:?}: it is over",
                    self.dialer.address,
                    self.dialed.reap_timeout
                );
                self.end_here(Reason::Disconnected);
                return false;
            }
            let waited = Instant::now();
            let _ = poll::readable(&[self.shared.wake.as_raw_fd()], backoff);
            if overran(waited, backoff) {
                lost = Instant::now();
            }
            let dialing = Instant::now();
            let dialed = self.dialer.dial(Some(self.dialed.reclaim));
            if overran(dialing, self.dialer.timeout) {
                lost = Instant::now();
            }
            match dialed {
                Ok(dialed) => {
                    log::info!("session {}: reconnected", self.dialer.address);
                    if let Some(info) = &dialed.info {
                        *self.shared.info.lock().unwrap_or_else(|p| p.into_inner()) = info.clone();
                    }
                    self.connected(dialed);
                    return true;
                }
                Err(Error::Io { .. } | Error::Timeout(_) | Error::Busy { .. }) => {
                    backoff = (backoff * 2).min(self.interval());
                }
                Err(refusal) => {
                    log::warn!(
                        "session {}: reclaim refused: {refusal}",
                        self.dialer.address
                    );
                    self.end_here(ended_for(&refusal));
                    return false;
                }
            }
        }
    }
}

/// Why a registration whose reclaim was refused ended: the reason the
/// listener gave for an ended one, else `Disconnected` (the client lost it).
fn ended_for(refusal: &Error) -> Reason {
    match refusal {
        Error::Evicted {
            reason: Some(reason),
            ..
        } => *reason,
        _ => Reason::Disconnected,
    }
}
