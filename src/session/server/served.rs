//! One connection a listener serves: read as its client speaks (the
//! handshake is `handshake.rs`), then the registration it holds on its
//! client's behalf, fed by the client's beats, told when it ends.

use super::held::{Held, HeldRegion, LastHeard};
use super::penalties::{Penalties, Source};
use super::refusals::SessionRefusals;
use crate::event::Reason;
use crate::session::server::limited_log::limited_log;
use crate::session::stream::{send_for, Inbox, Received, Stream};
use crate::session::timing::unheard_allowance;
use crate::session::wire::{Frame, HEARD_SINCE, VERSION};
use crate::sync::Ordering::Relaxed;
use crate::table::handle::Table;
use crate::table::protocol::{self, Gone, Stamp};
use crate::table::requests::Ticket;
use std::cell::RefCell;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What the listener checks a greeting against, and where what it admits
/// goes.
pub(crate) struct Gate {
    pub table: Table,
    pub held: Arc<Held>,
    pub refusals: SessionRefusals,
    pub token: Option<Vec<u8>>,
    /// Failed handshakes by source: a source that failed often waits.
    pub penalties: RefCell<Penalties>,
}

/// A connection, greeting or holding.
pub(crate) struct Connection {
    pub stream: Stream,
    pub(super) inbox: Inbox,
    /// The peer, as the listener saw it (address or credentials).
    pub peer: String,
    /// Where it comes from (an IP address, a user id).
    pub(super) source: Source,
    /// Which connection of its listener it is (entries are reused).
    pub serial: u64,
    pub opened: Instant,
    pub holding: Option<Holding>,
    /// A clear the client asked for, until the reaper carries it out.
    pub(super) request: Option<Requested>,
    /// When the listener last sent the client anything.
    pub(super) told: Instant,
    /// The protocol version its client speaks (once it said hello).
    pub(super) version: u16,
    /// A wrong token from a source held back: its answer, and when it is
    /// given (a guesser waits for each wrong answer; the right token is
    /// never held).
    pub(super) refusing: Option<(Instant, crate::error::Error)>,
}

/// A clear a client waits for.
#[derive(Clone, Copy)]
pub(super) struct Requested {
    pub(super) ticket: Ticket,
    pub(super) at: Instant,
    pub(super) wait: Duration,
}

/// The registration a connection holds, and what its client last said.
#[derive(Clone, Debug)]
pub(crate) struct Holding {
    pub index: u32,
    pub generation: u32,
    /// When its client was last heard, shared with the reaper.
    pub(super) heard: LastHeard,
    pub(super) heartbeats: u64,
    /// The client's step count at its last beat (`None` after a reclaim,
    /// until its first: the count it resumes from is its own).
    pub(super) steps: Option<u64>,
    /// Busy or idle, as the slot holds it.
    pub(super) busy: bool,
    /// The region its client beats in (protocol 4 over `unix:`), pulled
    /// into the slot at the reaper's scans in place of beat frames.
    pub(super) region: Option<Arc<HeldRegion>>,
}

/// What is to become of a connection after it spoke.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Next {
    /// Keep it open.
    KeepOpen,
    /// Close it; end what it holds for this reason first (`None`: leave
    /// the registration as it is: deregistered, ended, or never made).
    Close(Option<Reason>),
}

impl Connection {
    pub(crate) fn new(stream: Stream, peer: String, source: Source, serial: u64) -> Connection {
        Connection {
            stream,
            inbox: Inbox::default(),
            peer,
            source,
            serial,
            opened: Instant::now(),
            holding: None,
            request: None,
            told: Instant::now(),
            version: VERSION,
            refusing: None,
        }
    }

    /// Whether it has proven nothing yet: no session, no clear asked for.
    pub(crate) fn is_greeting(&self) -> bool {
        self.holding.is_none() && self.request.is_none()
    }

    /// Its peer closed: the next read goes on to the close.
    pub(crate) fn note_hung_up(&mut self) {
        self.inbox.note_hung_up();
    }

    /// Whether its last read stopped at its budget, bytes perhaps left.
    pub(crate) fn more_unread(&self) -> bool {
        self.inbox.more()
    }

    /// Reads what the client sent and acts on each frame (a connection
    /// whose refusal is held has nothing more to say: read and dropped).
    pub(crate) fn on_readable(&mut self, gate: &Gate) -> Next {
        let (frames, closed) = match self.inbox.receive(&mut self.stream) {
            Ok(Received::Frames(frames)) => (frames, false),
            Ok(Received::Closed(frames)) => (frames, true),
            Err(e) => {
                limited_log!(
                    log::Level::Debug,
                    "session from {}: {e}: closing it",
                    self.peer
                );
                return Next::Close(Some(Reason::Disconnected));
            }
        };
        if self.refusing.is_some() {
            return if closed {
                Next::Close(None)
            } else {
                Next::KeepOpen
            };
        }
        for frame in frames {
            let next = match (&self.holding, frame) {
                (None, hello @ Frame::Hello { .. }) => self.greet(gate, hello),
                (
                    None,
                    Frame::Ask {
                        version,
                        token,
                        instance_id,
                    },
                ) => self.answer(gate, version, &token, instance_id),
                (
                    None,
                    Frame::Clear {
                        version,
                        token,
                        reset,
                        wait_ms,
                    },
                ) if self.request.is_none() => {
                    self.clear(gate, version, &token, reset, Duration::from_millis(wait_ms))
                }
                (
                    Some(_),
                    Frame::Beat {
                        heartbeats,
                        since_ping_us,
                        busy,
                        steps,
                    },
                ) => {
                    // A client that beats with frames does not beat in a
                    // region (it could not use it, or it is another's).
                    if let Some(holding) = self.holding.as_mut() {
                        if let Some(region) = holding.region.take() {
                            region.beats_in_region.store(false, Relaxed);
                            gate.held.note_changed();
                        }
                        holding.heard.at(gate.table.clock.now_ns());
                    }
                    self.beat(gate, heartbeats, since_ping_us, busy, steps)
                }
                (Some(holding), Frame::Bye {}) => {
                    let holding = holding.clone();
                    // Its last beats are in its region, if it has one.
                    if let Some(region) = &holding.region {
                        let now_ns = gate.table.clock.now_ns();
                        if region
                            .pull(&gate.table, holding.index, holding.generation, now_ns)
                            .is_err()
                        {
                            return Next::Close(None);
                        }
                    }
                    let slot = gate.table.memory.slot(holding.index);
                    let _ = protocol::end(slot, holding.generation, Reason::Deregistered);
                    gate.table.memory.wake_reaper();
                    Next::Close(None)
                }
                (_, other) => {
                    limited_log!(
                        log::Level::Debug,
                        "session from {}: unexpected {} frame: closing it",
                        self.peer,
                        other.name()
                    );
                    Next::Close(Some(Reason::Disconnected))
                }
            };
            if next != Next::KeepOpen {
                return next;
            }
        }
        if closed {
            Next::Close(Some(Reason::Disconnected))
        } else {
            Next::KeepOpen
        }
    }

    /// Whether the client waits for a clear, or for its held refusal.
    pub(crate) fn is_waiting(&self) -> bool {
        self.waits_for_clear() || self.refusing.is_some()
    }

    /// Whether the client waits for a clear (the listener looks often).
    pub(crate) fn waits_for_clear(&self) -> bool {
        self.request.is_some()
    }

    /// When its held refusal is to be told, if one is.
    pub(crate) fn refusal_due(&self) -> Option<Instant> {
        self.refusing.as_ref().map(|(at, _)| *at)
    }

    /// If the clear the client waits for is over (carried out, failed, or
    /// past its deadline), answers `Done` or `Refused` and closes; a held
    /// refusal is told once its time came.
    pub(crate) fn settle(&mut self, table: &Table) -> Next {
        if let Some((at, _)) = &self.refusing {
            if Instant::now() < *at {
                return Next::KeepOpen;
            }
            let (_, refusal) = self.refusing.take().expect("checked above");
            return self.tell_refused(&refusal);
        }
        let Some(Requested { ticket, at, wait }) = self.request else {
            return Next::KeepOpen;
        };
        let outcome = match ticket.outcome(table) {
            Some(outcome) => outcome,
            None if at.elapsed() >= wait => Err(ticket.timed_out(table, wait)),
            None => return Next::KeepOpen,
        };
        self.request = None;
        match outcome {
            Ok(()) => {
                let _ = send_for(&mut self.stream, &Frame::Done {}, self.version);
                Next::Close(None)
            }
            // (A clear that failed is no refused session: not counted.)
            Err(failure) => self.tell_refused(&failure),
        }
    }

    /// Applies a client's beat to the registration: a heartbeat dated back
    /// to when the client beat, busy or idle, the steps made since. A beat
    /// that says the engine has not beaten for the reap timeout (since the
    /// listener's return, if it was away) ends it `timeout` (its sender
    /// lives, its engine loop hung).
    fn beat(
        &mut self,
        gate: &Gate,
        heartbeats: u64,
        since_ping_us: u64,
        busy: bool,
        steps: u64,
    ) -> Next {
        let table = &gate.table;
        let Some(holding) = self.holding.as_mut() else {
            return Next::Close(None);
        };
        let slot = table.memory.slot(holding.index);
        let generation = holding.generation;
        let now_ns = table.clock.now_ns();
        // The engine's silence as the client reports it, from no earlier
        // than the listener's return from an absence (frozen with it).
        let pinged_ns = now_ns.saturating_sub(since_ping_us.saturating_mul(1_000));
        let silent_ns = now_ns.saturating_sub(gate.held.absence().silent_since(pinged_ns));
        if heartbeats > 0 && Duration::from_nanos(silent_ns) >= table.reap_timeout() {
            if protocol::end(slot, generation, Reason::Timeout).is_ok() {
                table.memory.wake_reaper();
            }
            return self.tell_ended(table);
        }
        let mut result = Ok(());
        if heartbeats != holding.heartbeats {
            holding.heartbeats = heartbeats;
            // A client cannot date a beat older than one timeout (it would
            // only evict itself) nor later than now.
            let age_us = since_ping_us.min(table.reap_timeout().as_micros() as u64);
            let now_us = now_ns.div_ceil(1_000);
            result = protocol::beat_at(
                slot,
                generation,
                Stamp::of_micros(now_us.saturating_sub(age_us)),
            );
            // Only while its own: once it ended, the slot may be
            // released and another's.
            if result.is_ok() {
                slot.beats.store(heartbeats, Relaxed);
            }
        }
        if result.is_ok() && holding.steps != Some(steps) {
            // At most 2^32 steps a beat: a hostile count cannot reach the
            // word's flag bits. The first beat after a reclaim counts as
            // one step (the client went on while it was away).
            let made = holding.steps.map_or(1, |before| {
                steps.wrapping_sub(before).min(u64::from(u32::MAX))
            });
            holding.steps = Some(steps);
            result = protocol::progress_by(slot, generation, made);
        }
        if result.is_ok() && busy != holding.busy {
            holding.busy = busy;
            result = protocol::set_busy(slot, generation, busy);
        }
        match result {
            Ok(()) => Next::KeepOpen,
            Err(_) => self.tell_ended(table),
        }
    }

    /// Whether its client beats in a region (the reaper pulls and judges
    /// it).
    pub(crate) fn beats_in_region(&self) -> bool {
        self.holding.as_ref().is_some_and(|h| h.region.is_some())
    }

    /// Whether its client has gone unheard for the reap timeout and the
    /// [`unheard_allowance`] by what the listener has read so far (never
    /// for a client that beats in a region: the reaper judges it by the
    /// stamps it writes there).
    pub(crate) fn seems_unheard(&self, gate: &Gate) -> bool {
        let table = &gate.table;
        self.holding.as_ref().is_some_and(|holding| {
            if holding.region.is_some() {
                return false;
            }
            let heard = gate.held.absence().silent_since(holding.heard.last());
            let unheard_ns = table.clock.now_ns().saturating_sub(heard);
            let budget = table.reap_timeout() + unheard_allowance(table.reap_timeout());
            Duration::from_nanos(unheard_ns) >= budget
        })
    }

    /// Sends `Heard` if the client was told nothing for `every` (a client
    /// of protocol 1 knows no `Heard`: it is sent none; a client that
    /// beats in a region hears the listener's pulse there instead).
    pub(crate) fn keep_told(&mut self, every: Duration) -> Next {
        let in_region = self.holding.as_ref().is_some_and(|h| h.region.is_some());
        if in_region || self.version < HEARD_SINCE || self.told.elapsed() < every {
            return Next::KeepOpen;
        }
        self.told = Instant::now();
        match send_for(&mut self.stream, &Frame::Heard {}, self.version) {
            Ok(()) => Next::KeepOpen,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Next::KeepOpen,
            Err(_) => Next::Close(Some(Reason::Disconnected)),
        }
    }

    /// If the held registration has ended (evicted, reset, replaced), tells
    /// the client why and closes; if its client has gone unheard for the
    /// reap timeout and the [`unheard_allowance`] (stopped, or its sender
    /// hung), ends it `timeout` first.
    pub(crate) fn check_ended(&mut self, gate: &Gate) -> Next {
        let table = &gate.table;
        let Some(holding) = &self.holding else {
            return Next::KeepOpen;
        };
        let slot = table.memory.slot(holding.index);
        if self.seems_unheard(gate)
            && protocol::end(slot, holding.generation, Reason::Timeout).is_ok()
        {
            table.memory.wake_reaper();
        }
        match protocol::still_live(slot, holding.generation) {
            Ok(()) => Next::KeepOpen,
            Err(_) => self.tell_ended(table),
        }
    }

    pub(crate) fn tell_ended(&mut self, table: &Table) -> Next {
        let Some(holding) = &self.holding else {
            return Next::Close(None);
        };
        let slot = table.memory.slot(holding.index);
        let reason = match protocol::still_live(slot, holding.generation) {
            Err(Gone::Ended(Some(reason))) => reason,
            _ => Reason::Disconnected,
        };
        let _ = send_for(&mut self.stream, &Frame::Ended { reason }, self.version);
        Next::Close(None)
    }

    /// Sends the table's info area, if it holds anything. Read once: while
    /// a writer is at work in it, nothing is sent now (its finishing
    /// changes the sequence, and every session gets it at the next tick).
    pub(crate) fn send_info(&mut self, table: &Table) -> Next {
        match table.info_now() {
            Ok(Some(bytes)) if bytes.is_empty() => Next::KeepOpen,
            Ok(Some(bytes)) => {
                match send_for(&mut self.stream, &Frame::Info { bytes }, self.version) {
                    Ok(()) => {
                        self.told = Instant::now();
                        Next::KeepOpen
                    }
                    Err(_) => Next::Close(Some(Reason::Disconnected)),
                }
            }
            Ok(None) | Err(_) => Next::KeepOpen,
        }
    }
}
