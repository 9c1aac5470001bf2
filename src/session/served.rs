//! One connection a listener serves: its handshake, then the registration
//! it holds on its client's behalf, fed by the client's beats.

use super::held::{Heard, Held};
use super::penalties::{Penalties, Source};
use super::printable::printable;
use super::refusals::SessionRefusals;
use super::stream::{send, Inbox, Received, Stream};
use super::timing::unheard_allowance;
use super::wire::{
    is_served, Frame, Reclaim, ANSWER_MAX, HEARD_SINCE, HOST_MAX, MESSAGE_MAX, OLDEST_SERVED,
    VERSION,
};
use crate::error::{Error, Result};
use crate::event::Reason;
use crate::layout::FLAG_REMOTE;
use crate::layout::LABEL_MAX;
use crate::limited_log::limited_log;
use crate::protocol::{self, Gone, Stamp, LIVE};
use crate::records::Record;
use crate::requests::Ticket;
use crate::sync::Ordering::{Acquire, Relaxed};
use crate::table::Table;
use crate::text::prefix_within;
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
    inbox: Inbox,
    /// The peer, as the listener saw it (address or credentials).
    pub peer: String,
    /// Where it comes from (an IP address, a user id).
    source: Source,
    /// Which connection of its listener it is (entries are reused).
    pub serial: u64,
    pub opened: Instant,
    pub holding: Option<Holding>,
    /// A clear the client asked for, until the reaper carries it out.
    request: Option<Requested>,
    /// When the listener last sent the client anything.
    told: Instant,
    /// The protocol version its client speaks (once it said hello).
    version: u16,
}

/// A clear a client waits for.
#[derive(Clone, Copy)]
struct Requested {
    ticket: Ticket,
    at: Instant,
    wait: Duration,
}

/// The registration a connection holds, and what its client last said.
#[derive(Clone, Debug)]
pub(crate) struct Holding {
    pub index: u32,
    pub generation: u32,
    /// When its client was last heard, shared with the reaper.
    heard: Heard,
    heartbeats: u64,
    /// The client's step count at its last beat (`None` after a reclaim,
    /// until its first: the count it resumes from is its own).
    steps: Option<u64>,
    /// Busy or idle, as the slot holds it.
    busy: bool,
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

    /// Reads what the client sent and acts on each frame.
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
                ) => self.beat(gate, heartbeats, since_ping_us, busy, steps),
                (Some(holding), Frame::Bye) => {
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

    /// The handshake: checks the version and the token, then registers or
    /// reclaims, answering `Welcome` or `Refused`.
    fn greet(&mut self, gate: &Gate, hello: Frame) -> Next {
        let Frame::Hello {
            version,
            instance_id,
            pid,
            token,
            label,
            host,
            reclaim,
        } = hello
        else {
            return Next::Close(None);
        };
        if let Err(refusal) = admit(gate, self.source, version, &token) {
            return self.refuse(&gate.refusals, &refusal);
        }
        let outcome = match reclaim {
            Some(reclaim) => self.reclaim(gate, instance_id, reclaim),
            None => self.register(gate, instance_id, pid, &label, &host),
        };
        match outcome {
            Ok((holding, secret)) => {
                let (slot, generation) = (holding.index, holding.generation);
                self.holding = Some(holding);
                // The info first: a client that reads its welcome has it.
                if self.send_info(&gate.table) != Next::KeepOpen {
                    return Next::Close(Some(Reason::Disconnected));
                }
                self.version = version;
                let welcome = Frame::Welcome {
                    version,
                    slot,
                    generation,
                    secret,
                    reap_timeout_ms: gate.table.reap_timeout().as_millis() as u64,
                    boot_token: gate.table.memory.header().boot_token.load(Acquire),
                };
                if send(&mut self.stream, &welcome).is_err() {
                    return Next::Close(Some(Reason::Disconnected));
                }
                self.told = Instant::now();
                Next::KeepOpen
            }
            // Busy past admission is no peer held back: the registration is
            // still held by the client's previous connection (it reconnected
            // first, as after a pause) or the table's registration lock is
            // taken; the client tries again. Not counted as a refusal.
            Err(refusal @ Error::Busy(_)) => self.tell_refused(&refusal),
            Err(refusal) => self.refuse(&gate.refusals, &refusal),
        }
    }

    /// Answers a question with the table's status (the registrations of
    /// `instance_id` only), then closes.
    fn answer(&mut self, gate: &Gate, version: u16, token: &[u8], instance_id: u64) -> Next {
        let json = admit(gate, self.source, version, token)
            .and_then(|()| gate.table.status())
            .and_then(|mut status| {
                status
                    .registrations
                    .retain(|r| r.instance_id == instance_id && instance_id != 0);
                serde_json::to_string(&status).map_err(|e| Error::Io {
                    context: "encode the status".into(),
                    source: e.into(),
                })
            });
        match json {
            Ok(json) if json.len() <= ANSWER_MAX => {
                let _ = send(&mut self.stream, &Frame::Answer { json });
                Next::Close(None)
            }
            Ok(json) => self.refuse(
                &gate.refusals,
                &Error::InvalidArgument(format!(
                    "the status is {} bytes, over the {ANSWER_MAX} an answer holds",
                    json.len()
                )),
            ),
            Err(refusal) => self.refuse(&gate.refusals, &refusal),
        }
    }

    /// Asks the reaper for the clear (or reset) the client wants; the
    /// listener answers once it is carried out ([`Connection::settle`]).
    fn clear(
        &mut self,
        gate: &Gate,
        version: u16,
        token: &[u8],
        reset: bool,
        wait: Duration,
    ) -> Next {
        match admit(gate, self.source, version, token)
            .and_then(|()| gate.table.request_clear(reset))
        {
            Ok(ticket) => {
                self.request = Some(Requested {
                    ticket,
                    at: Instant::now(),
                    wait,
                });
                Next::KeepOpen
            }
            Err(refusal) => self.refuse(&gate.refusals, &refusal),
        }
    }

    /// Whether the client waits for a clear.
    pub(crate) fn is_waiting(&self) -> bool {
        self.request.is_some()
    }

    /// If the clear the client waits for is over (carried out, failed, or
    /// past its deadline), answers `Done` or `Refused` and closes.
    pub(crate) fn settle(&mut self, table: &Table) -> Next {
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
                let _ = send(&mut self.stream, &Frame::Done);
                Next::Close(None)
            }
            // (A clear that failed is no refused session: not counted.)
            Err(failure) => self.tell_refused(&failure),
        }
    }

    /// Refuses what the client asked: counts it in `refusals`, then tells
    /// the client why.
    fn refuse(&mut self, refusals: &SessionRefusals, refusal: &Error) -> Next {
        refusals.refused(refusal.code());
        self.tell_refused(refusal)
    }

    /// Tells the client why not (a wrong token is logged), then closes.
    fn tell_refused(&mut self, refusal: &Error) -> Next {
        if matches!(refusal, Error::Permission(_)) {
            limited_log!(
                log::Level::Warn,
                "refused a session from {}: wrong or missing token",
                self.peer
            );
        }
        let message = prefix_within(&refusal.to_string(), MESSAGE_MAX).to_owned();
        let _ = send(
            &mut self.stream,
            &Frame::Refused {
                code: refusal.code() as u8,
                message,
            },
        );
        Next::Close(None)
    }

    fn register(
        &mut self,
        gate: &Gate,
        instance_id: u64,
        pid: u32,
        label: &str,
        host: &str,
    ) -> Result<(Holding, u64)> {
        let table = &gate.table;
        crate::registration::check_label(label)?;
        if gate.held.count() >= table.capacity() as usize {
            return Err(Error::Full(format!(
                "table '{}': this listener already holds {} sessions, the table's capacity",
                table.name(),
                table.capacity()
            )));
        }
        let records = gate
            .held
            .records(table)
            .map_err(|e| Error::os(table.name(), "open the sessions' records", e))?;
        let secret = crate::os::socket::random_u64()
            .map_err(|e| Error::os(table.name(), "draw a session secret", e))?;
        let label = prefix_within(&printable(label), LABEL_MAX).to_owned();
        let crate::registration::Placed { index, generation } = table
            .registration(instance_id)
            .label(&label)
            .pid(pid)
            .register_remote()?;
        let record = Record {
            generation,
            instance_id,
            secret,
            peer: self.peer.clone(),
            host: prefix_within(&printable(host), HOST_MAX).to_owned(),
            holder: table.memory.header().boot_token.load(Acquire),
        };
        if let Err(e) = records.write(index, &record) {
            // Not reclaimable after a restart, but served: say so.
            log::warn!(
                "table '{}': cannot record session {index}: {e}",
                table.name()
            );
        }
        let heard = gate.held.hold(index, generation, table.clock.now_ns());
        Ok((Holding::new(index, generation, heard), secret))
    }

    /// Takes back a registration this client held before its connection
    /// broke (a restart, a cut), proven by the secret of its `Welcome`.
    fn reclaim(&mut self, gate: &Gate, instance_id: u64, claim: Reclaim) -> Result<(Holding, u64)> {
        let table = &gate.table;
        // Whatever is wrong with a reclaim, the client hears its
        // registration is over, and may register again.
        let gone = || Error::Evicted {
            instance_id,
            reason: Some(Reason::Disconnected),
        };
        if claim.slot >= table.capacity() {
            return Err(gone());
        }
        let slot = table.memory.slot(claim.slot);
        let live = slot.state.load(Acquire) == protocol::state_word(claim.generation, LIVE)
            && slot.flags.load(Relaxed) & FLAG_REMOTE != 0
            && slot.instance_id.load(Relaxed) == instance_id;
        let record = gate
            .held
            .records(table)
            .ok()
            .and_then(|r| r.read(claim.slot));
        let proven = record.is_some_and(|record| {
            record.generation == claim.generation
                && record.instance_id == instance_id
                && same_secret(&record.secret.to_ne_bytes(), &claim.secret.to_ne_bytes())
        });
        if !proven {
            return Err(gone());
        }
        match (live, protocol::still_live(slot, claim.generation)) {
            // Ended while its client was away: the client hears why.
            (_, Err(ended @ Gone::Ended(Some(_)))) => {
                return Err(Error::from_gone(instance_id, ended))
            }
            (false, _) => return Err(gone()),
            (true, Err(gone_now)) => return Err(Error::from_gone(instance_id, gone_now)),
            (true, Ok(())) => {}
        }
        let Some(heard) =
            gate.held
                .hold_if_free(claim.slot, claim.generation, table.clock.now_ns())
        else {
            return Err(Error::Busy(format!(
                "instance {instance_id}'s registration is held by another connection"
            )));
        };
        if let Ok(records) = gate.held.records(table) {
            let holder = table.memory.header().boot_token.load(Acquire);
            records.set_holder(claim.slot, claim.generation, holder);
        }
        let holding = Holding::reclaimed(claim.slot, claim.generation, heard, slot);
        Ok((holding, claim.secret))
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
        holding.heard.at(now_ns);
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
            slot.beats.store(heartbeats, Relaxed);
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

    /// Whether its client has gone unheard for the reap timeout and the
    /// [`unheard_allowance`] by what the listener has read so far.
    pub(crate) fn seems_unheard(&self, gate: &Gate) -> bool {
        let table = &gate.table;
        self.holding.as_ref().is_some_and(|holding| {
            let heard = gate.held.absence().silent_since(holding.heard.last());
            let unheard_ns = table.clock.now_ns().saturating_sub(heard);
            let budget = table.reap_timeout() + unheard_allowance(table.reap_timeout());
            Duration::from_nanos(unheard_ns) >= budget
        })
    }

    /// Sends `Heard` if the client was told nothing for `every` (a client
    /// of protocol 1 knows no `Heard`: it is sent none).
    pub(crate) fn keep_told(&mut self, every: Duration) -> Next {
        if self.version < HEARD_SINCE || self.told.elapsed() < every {
            return Next::KeepOpen;
        }
        self.told = Instant::now();
        match send(&mut self.stream, &Frame::Heard) {
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
        let _ = send(&mut self.stream, &Frame::Ended { reason });
        Next::Close(None)
    }

    /// Sends the table's info area, if it holds anything. Read once: while
    /// a writer is at work in it, nothing is sent now (its finishing
    /// changes the sequence, and every session gets it at the next tick).
    pub(crate) fn send_info(&mut self, table: &Table) -> Next {
        match table.info_now() {
            Ok(Some(bytes)) if bytes.is_empty() => Next::KeepOpen,
            Ok(Some(bytes)) => match send(&mut self.stream, &Frame::Info { bytes }) {
                Ok(()) => {
                    self.told = Instant::now();
                    Next::KeepOpen
                }
                Err(_) => Next::Close(Some(Reason::Disconnected)),
            },
            Ok(None) | Err(_) => Next::KeepOpen,
        }
    }
}

/// Whether a client may speak: its source not waiting after failed
/// handshakes, its protocol version, its token.
fn admit(gate: &Gate, source: Source, version: u16, token: &[u8]) -> Result<()> {
    let now = Instant::now();
    if let Some(wait) = gate.penalties.borrow().wait(source, now) {
        return Err(Error::Busy(format!(
            "too many failed handshakes from {source}: try again in {} ms",
            wait.as_millis().max(1)
        )));
    }
    if !is_served(version) {
        return Err(Error::Incompatible(format!(
            "session protocol version {version}, this reaper speaks {OLDEST_SERVED} to {VERSION}: upgrade the {}",
            if version > VERSION { "reaper" } else { "client" }
        )));
    }
    if gate
        .token
        .as_deref()
        .is_some_and(|expected| !same_secret(expected, token))
    {
        gate.penalties.borrow_mut().failed(source, now);
        return Err(Error::Permission(
            "wrong or missing token: the listener's token file says who may connect".into(),
        ));
    }
    Ok(())
}

impl Holding {
    fn new(index: u32, generation: u32, heard: Heard) -> Holding {
        Holding {
            index,
            generation,
            heard,
            heartbeats: 0,
            steps: Some(0),
            busy: false,
        }
    }

    /// A registration taken back: busy as its slot says, and the client's
    /// step count to be learnt from its first beat.
    fn reclaimed(index: u32, generation: u32, heard: Heard, slot: &crate::layout::Slot) -> Holding {
        Holding {
            steps: None,
            busy: slot.progress.load(Relaxed) & crate::layout::BUSY != 0,
            ..Holding::new(index, generation, heard)
        }
    }
}

/// Compares two secrets in time that depends only on their lengths.
pub(crate) fn same_secret(expected: &[u8], given: &[u8]) -> bool {
    let mut difference = (expected.len() ^ given.len()) as u64;
    for i in 0..expected.len().max(given.len()) {
        let a = expected.get(i).copied().unwrap_or(0);
        let b = given.get(i).copied().unwrap_or(0);
        difference |= u64::from(std::hint::black_box(a ^ b));
    }
    difference == 0
}

#[cfg(test)]
mod tests {
    use super::same_secret;

    #[test]
    fn secrets_match_only_when_equal_whatever_their_lengths() {
        assert!(same_secret(b"s3cret", b"s3cret"));
        assert!(same_secret(b"", b""));
        for other in [&b"s3creT"[..], b"s3cre", b"s3cret\0", b""] {
            assert!(!same_secret(b"s3cret", other), "{other:?}");
        }
    }
}
