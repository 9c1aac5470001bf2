//! A connection's handshake: whether its client may speak (its source not
//! held back, its version served, its token), then the registration made
//! or taken back, or a question answered, a clear asked for; refusals are
//! told and counted.

use super::held::{HeldRegion, LastHeard};
use super::printable::printable;
use super::records::Record;
use super::refusals::SessionRefusals;
use super::served::{Connection, Gate, Holding, Next, Requested};
use crate::error::{Error, Result};
use crate::event::Reason;
use crate::session::server::limited_log::limited_log;
use crate::session::stream::{send_for, Stream};
use crate::session::wire::{
    is_served, Frame, Reclaim, ANSWER_MAX, HOST_MAX, MESSAGE_MAX, OLDEST_SERVED, REGION_SINCE,
    VERSION,
};
use crate::sync::Ordering::{Acquire, Relaxed};
use crate::table::layout::FLAG_REMOTE;
use crate::table::layout::LABEL_MAX;
use crate::table::protocol::{self, Gone, LIVE};
use crate::table::region::SharedRegion;
use crate::text::prefix_within;
use std::sync::Arc;
use std::time::{Duration, Instant};

impl Connection {
    /// The handshake: checks the version and the token, then registers or
    /// reclaims, answering `Welcome` or `Refused`.
    pub(super) fn greet(&mut self, gate: &Gate, hello: Frame) -> Next {
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
        self.version = version.clamp(OLDEST_SERVED, VERSION);
        if let Err(refusal) = self.admit(gate, version, &token) {
            return self.refuse(&gate.refusals, &refusal);
        }
        let reclaiming = reclaim.is_some();
        let outcome = match reclaim {
            Some(reclaim) => self.reclaim(gate, instance_id, reclaim),
            None => self.register(gate, instance_id, pid, &label, &host),
        };
        match outcome {
            Ok((mut holding, secret)) => {
                let (slot, generation) = (holding.index, holding.generation);
                let region = self.region_for(gate, slot, generation, reclaiming);
                holding.region = region.clone();
                self.holding = Some(holding);
                // The info first: a client that reads its welcome has it.
                if self.send_info(&gate.table) != Next::KeepOpen {
                    return Next::Close(Some(Reason::Disconnected));
                }
                let welcome = Frame::Welcome {
                    version,
                    slot,
                    generation,
                    secret,
                    reap_timeout_ms: gate.table.reap_timeout().as_millis() as u64,
                    boot_token: gate.table.memory.header().boot_token.load(Acquire),
                    region_bytes: region.as_ref().map_or(0, |held| held.region.size()),
                };
                if self.send_welcome(&welcome, region.as_deref()).is_err() {
                    return Next::Close(Some(Reason::Disconnected));
                }
                self.told = Instant::now();
                Next::KeepOpen
            }
            // Busy past admission is no peer held back: the registration is
            // still held by the client's previous connection (it reconnected
            // first, as after a pause) or the table's registration lock is
            // taken; the client tries again. Not counted as a refusal.
            Err(refusal @ Error::Busy { .. }) => self.tell_refused(&refusal),
            Err(refusal) => self.refuse(&gate.refusals, &refusal),
        }
    }

    /// The region registration `(slot, generation)` beats in, for a client
    /// of protocol 4 over `unix:`: a new one for a new registration (none
    /// when the listener's regions are as many as the table's slots, or
    /// none can be made: then the session beats with frames), the one it
    /// had for a registration taken back (none if this reaper made none:
    /// it was another's; none if its client beat with frames instead).
    fn region_for(
        &self,
        gate: &Gate,
        slot: u32,
        generation: u32,
        reclaiming: bool,
    ) -> Option<Arc<HeldRegion>> {
        if self.version < REGION_SINCE || !matches!(self.stream, Stream::Unix(_)) {
            return None;
        }
        if reclaiming {
            // (Not one its client gave up for frames: nobody reads it.)
            return gate
                .held
                .region(slot, generation)
                .filter(|held| held.beats_in_region.load(Relaxed));
        }
        let most = gate.table.capacity() as usize;
        match SharedRegion::create() {
            Ok(region) => {
                let shared = gate.held.share_region(slot, generation, most, region)?;
                // Ended since it was made (a reset): the reaper forgot its
                // region as it saw the end, before this one was shared,
                // and would keep it for good, for a slot soon another's.
                // (Looked at after sharing: an end seen later forgets it.)
                if protocol::still_live(gate.table.memory.slot(slot), generation).is_err() {
                    gate.held.forget_region(slot, generation);
                    return None;
                }
                Some(shared)
            }
            Err(e) => {
                limited_log!(
                    log::Level::Warn,
                    "table '{}': cannot make a session's region ({e}): it beats with frames",
                    gate.table.name()
                );
                None
            }
        }
    }

    /// Sends the welcome, with the region's memfd attached if it has one.
    fn send_welcome(&mut self, welcome: &Frame, region: Option<&HeldRegion>) -> std::io::Result<()> {
        let (Some(held), Stream::Unix(socket)) = (region, &self.stream) else {
            return send_for(&mut self.stream, welcome, self.version);
        };
        let bytes = welcome.encode_for(self.version);
        let sent = crate::os::socket::send_with_fd(socket, &bytes, held.region.file())?;
        let mut socket: &std::os::unix::net::UnixStream = socket;
        std::io::Write::write_all(&mut socket, &bytes[sent..])
    }

    /// Answers a question with the table's status (the registrations of
    /// `instance_id` only), then closes.
    pub(super) fn answer(
        &mut self,
        gate: &Gate,
        version: u16,
        token: &[u8],
        instance_id: u64,
    ) -> Next {
        self.version = version.clamp(OLDEST_SERVED, VERSION);
        let json = self
            .admit(gate, version, token)
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
                let _ = send_for(&mut self.stream, &Frame::Answer { json }, self.version);
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
    pub(super) fn clear(
        &mut self,
        gate: &Gate,
        version: u16,
        token: &[u8],
        reset: bool,
        wait: Duration,
    ) -> Next {
        self.version = version.clamp(OLDEST_SERVED, VERSION);
        match self
            .admit(gate, version, token)
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

    /// Refuses what the client asked: counts it in `refusals`, then tells
    /// the client why.
    fn refuse(&mut self, refusals: &SessionRefusals, refusal: &Error) -> Next {
        refusals.refused(refusal.code());
        if self.refusing.is_some() {
            // A source held back answered wrong: told once its wait is over.
            return Next::KeepOpen;
        }
        self.tell_refused(refusal)
    }

    /// Tells the client why not (a wrong token is logged), then closes.
    pub(super) fn tell_refused(&mut self, refusal: &Error) -> Next {
        if matches!(refusal, Error::Permission(_)) {
            limited_log!(
                log::Level::Warn,
                "refused a session from {}: wrong or missing token",
                self.peer
            );
        }
        let message = prefix_within(&refusal.to_string(), MESSAGE_MAX).to_owned();
        let reason = match refusal {
            Error::Evicted { reason, .. } => *reason,
            _ => None,
        };
        let refused = Frame::Refused {
            code: refusal.code() as u8,
            message,
            reason,
        };
        let _ = send_for(&mut self.stream, &refused, self.version);
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
        crate::worker::registration::check_label(label)?;
        if gate.held.count() >= table.capacity() as usize {
            return Err(Error::Full {
                message: format!(
                    "table '{}': this listener already holds {} sessions, the table's capacity",
                    table.name(),
                    table.capacity()
                ),
                capacity: Some(table.capacity()),
            });
        }
        let records = gate
            .held
            .records(table)
            .map_err(|e| Error::os(table.name(), "open the sessions' records", e))?;
        let secret = crate::os::random::random_u64()
            .map_err(|e| Error::os(table.name(), "draw a session secret", e))?;
        let label = prefix_within(&printable(label), LABEL_MAX).to_owned();
        let crate::worker::registration::Placed { index, generation } = table
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
                return Err(ended.evicted(instance_id))
            }
            (false, _) => return Err(gone()),
            (true, Err(gone_now)) => return Err(gone_now.evicted(instance_id)),
            (true, Ok(())) => {}
        }
        let Some(heard) =
            gate.held
                .hold_if_free(claim.slot, claim.generation, table.clock.now_ns())
        else {
            return Err(Error::busy(format!(
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
}

impl Connection {
    /// Whether a client may speak: its protocol version, its token. The
    /// token is compared first, in constant time, whatever its source did:
    /// the right one is admitted at once, so guessers sharing an address
    /// (a node, a NAT, a pod network) lock out nobody. A wrong one counts
    /// against its source; once the source failed a few times, the answer
    /// to each further wrong one is held until its wait is over
    /// ([`Connection::refusing`], told by `settle`): what is slowed is
    /// wrong answers.
    fn admit(&mut self, gate: &Gate, version: u16, token: &[u8]) -> Result<()> {
        if !is_served(version) {
            return Err(Error::Incompatible(format!(
                "session protocol version {version}, this reaper speaks {OLDEST_SERVED} to {VERSION}: upgrade the {}",
                if version > VERSION { "reaper" } else { "client" }
            )));
        }
        let Some(expected) = gate.token.as_deref() else {
            return Ok(());
        };
        if same_secret(expected, token) {
            return Ok(());
        }
        let now = Instant::now();
        let mut penalties = gate.penalties.borrow_mut();
        let held_back = penalties.wait(self.source, now).is_some();
        penalties.failed(self.source, now);
        let Some(wait) = penalties.wait(self.source, now).filter(|_| held_back) else {
            return Err(Error::Permission(
                "wrong or missing token: the listener's token file says who may connect".into(),
            ));
        };
        let message = format!(
            "too many failed handshakes from {}, and a wrong or missing token: answered after {} ms",
            self.source,
            wait.as_millis().max(1)
        );
        self.refusing = Some((now + wait, Error::busy(message.clone())));
        Err(Error::busy(message))
    }
}

impl Holding {
    fn new(index: u32, generation: u32, heard: LastHeard) -> Holding {
        Holding {
            index,
            generation,
            heard,
            heartbeats: 0,
            steps: Some(0),
            busy: false,
            region: None,
        }
    }

    /// A registration taken back: busy as its slot says, and the client's
    /// step count to be learnt from its first beat.
    fn reclaimed(
        index: u32,
        generation: u32,
        heard: LastHeard,
        slot: &crate::table::layout::Slot,
    ) -> Holding {
        Holding {
            steps: None,
            busy: slot.progress.load(Relaxed) & crate::table::layout::BUSY != 0,
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
