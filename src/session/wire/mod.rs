//! The frames of a session over a socket: how a worker that cannot map the
//! table registers through a reaper's listener, and what the listener
//! answers.
//!
//! Every frame is a 4-byte big-endian length `L` (of what follows, at least
//! 1 and at most [`MAX_FRAME`]), a 1-byte type, and `L - 1` bytes of payload
//! laid out as the type says. Integers are big-endian; a text is a length
//! (1 byte, or 2 for the token and messages) then UTF-8. A frame whose
//! payload is longer or shorter than its type's layout, a type that is not
//! known, a text that is not UTF-8 or longer than its limit, and a frame
//! over the cap are refused with a [`WireError`] naming what was expected
//! and what was found; the side that reads one closes the connection.
//!
//! Every frame's layout is declared once, below (`frames!`): the
//! [`Frame`] enum, its encoding, its decoding and the table in
//! `docs/sessions.md` ([`Frame::layout_table`]) all come from that one
//! declaration. A field added to a frame is one line there, plus its value
//! in the round-trip test; a field added to an existing frame goes last,
//! marked with the protocol version that added it, so a peer of the
//! previous version is still served.

use crate::event::Reason;
use crate::table::layout::{INFO_MAX, LABEL_MAX};

mod declare;
mod error;
mod fields;
use declare::{describe, frames, read_field};
pub use error::WireError;
pub use fields::Reclaim;
use fields::{
    Bytes16, Field, Flag, MaybeReclaim, Reader, ReasonCode, ReasonOrNone, Text, Writer, U16, U32,
    U64, U8,
};

/// The protocol version a `Hello` and a `Welcome` carry.
pub const VERSION: u16 = 4;

/// The oldest version a listener serves (and the last a client falls back
/// to, one version at a time): 2. What version 3 added, a version-2 peer
/// does without: a listener writes its `Refused` without the reason code
/// (its message still names it), and a client of a version-2 listener
/// reads an eviction it refused as `disconnected`. What version 4 added
/// (a `unix:` session's shared region), a peer of 2 or 3 does without: its
/// beats travel as frames, and its death is seen when its socket closes.
pub const OLDEST_SERVED: u16 = 2;

/// The version that added a `unix:` session's shared region (`region_bytes`
/// of a `Welcome`, its memfd passed with it).
pub const REGION_SINCE: u16 = 4;

/// The version that added `Heard` (every peer served today has it).
pub const HEARD_SINCE: u16 = 2;

/// The version that added the reason code of a `Refused`.
pub const REFUSED_REASON_SINCE: u16 = 3;

/// Whether a peer speaking `version` is served.
pub fn is_served(version: u16) -> bool {
    (OLDEST_SERVED..=VERSION).contains(&version)
}

/// The largest frame, length prefix excluded.
pub const MAX_FRAME: usize = 4096;

/// The longest token.
pub const TOKEN_MAX: usize = 256;

/// The longest host name a client reports.
pub const HOST_MAX: usize = 255;

/// The longest message of a `Refused`.
pub const MESSAGE_MAX: usize = 1024;

/// The longest `Answer`.
pub const ANSWER_MAX: usize = 4000;

impl Kind {
    /// The codes of [`Kind::CODES`] as runs: "1 to 5 or 129 to 135".
    fn codes_text() -> String {
        let mut runs: Vec<(u8, u8)> = Vec::new();
        for &code in Kind::CODES {
            match runs.last_mut() {
                Some((_, last)) if last.checked_add(1) == Some(code) => *last = code,
                _ => runs.push((code, code)),
            }
        }
        let runs: Vec<String> = runs
            .iter()
            .map(|&(first, last)| match first == last {
                true => format!("{first}"),
                false => format!("{first} to {last}"),
            })
            .collect();
        runs.join(" or ")
    }
}

frames! {
    /// The client's first frame: who it is and what it proves.
    Hello = 1, "hello", "client → server, first" {
        /// The client's protocol version.
        version: u16 = U16,
        /// The instance id to register.
        instance_id: u64 = U64,
        /// The client's pid, as it sees it (reported, never trusted).
        pid: u32 = U32,
        /// The listener's token (may be empty).
        token: Vec<u8> = Bytes16<TOKEN_MAX>,
        /// The registration's label.
        label: String = Text<1, LABEL_MAX>,
        /// The client's host name, as it reports it.
        host: String = Text<1, HOST_MAX>,
        /// A registration to take back after a reconnect.
        reclaim: Option<Reclaim> = MaybeReclaim,
    }
    /// What changed on the client since its last beat.
    Beat = 2, "beat", "client → server" {
        /// Heartbeats counted by the client.
        heartbeats: u64 = U64,
        /// How long before this frame the client's last heartbeat was, in
        /// microseconds of its own clock: the server dates the heartbeat
        /// back by as much, so a session's silence counts from its last
        /// heartbeat, not from when the sender thread forwarded it.
        since_ping_us: u64 = U64,
        /// Whether the engine has work in flight.
        busy: bool = Flag,
        /// Steps of progress counted by the client.
        steps: u64 = U64,
    }
    /// A clean deregistration.
    Bye = 3, "bye", "client → server" {}
    /// A question about the table that registers nothing (`status`,
    /// `probe` over an address).
    Ask = 4, "ask", "client → server, first and only" {
        /// The client's protocol version.
        version: u16 = U16,
        /// The listener's token (may be empty).
        token: Vec<u8> = Bytes16<TOKEN_MAX>,
        /// The instance whose registrations to include (0: none).
        instance_id: u64 = U64,
    }
    /// A clear of the table (its clear handlers run; registrations are
    /// untouched) or, with `reset`, a reset (every registration ends
    /// `cleared` first), asked for by a process that cannot map it.
    Clear = 5, "clear", "client → server, first and only" {
        /// The client's protocol version.
        version: u16 = U16,
        /// The listener's token (may be empty).
        token: Vec<u8> = Bytes16<TOKEN_MAX>,
        /// A reset rather than a clear.
        reset: bool = Flag,
        /// How long the client waits for it, in milliseconds.
        wait_ms: u64 = U64,
    }
    /// The registration was made (or taken back).
    Welcome = 129, "welcome", "server → client" {
        /// The server's protocol version.
        version: u16 = U16,
        /// The registration's slot.
        slot: u32 = U32,
        /// The slot's generation.
        generation: u32 = U32,
        /// What a reconnecting client proves the registration with.
        secret: u64 = U64,
        /// The table's reap timeout, in milliseconds.
        reap_timeout_ms: u64 = U64,
        /// The reaper's boot token.
        boot_token: u64 = U64,
        /// The size of the region whose memfd came with this frame (over
        /// `unix:` only, `SCM_RIGHTS`): the client beats there, and its
        /// death word is there; 0: no region, beats travel as frames.
        region_bytes: u64 = U64 [since REGION_SINCE],
    }
    /// What the client asked for was refused: a result code, why, and for
    /// an ended registration the reason it ended.
    Refused = 130, "refused", "server → client" {
        /// The result code (as the C ABI's `livereg_result`).
        code: u8 = U8,
        /// Why, in a line.
        message: String = Text<2, MESSAGE_MAX>,
        /// Why the registration ended, for an `EVICTED` refusal.
        reason: Option<Reason> = ReasonOrNone [since REFUSED_REASON_SINCE],
    }
    /// The registration ended; the client's next ping hears why.
    Ended = 131, "ended", "server → client" {
        /// Why it ended.
        reason: Reason = ReasonCode,
    }
    /// The server's info area: just before `Welcome` (if not empty), and
    /// whenever it changes.
    Info = 132, "info", "server → client" {
        /// Its bytes.
        bytes: Vec<u8> = Bytes16<INFO_MAX>,
    }
    /// The answer to an `Ask`: the table's status as JSON, with only the
    /// registrations of the instance asked about.
    Answer = 133, "answer", "server → client" {
        /// The JSON text.
        json: String = Text<2, ANSWER_MAX>,
    }
    /// The `Clear` asked for was carried out.
    Done = 134, "done", "server → client" {}
    /// The listener holds the session and hears its client: sent every
    /// `T/4`, so a client learns within about `T` when nobody hears it.
    Heard = 135, "heard", "server → client" {}
}

impl Frame {
    /// The frame's name, for a log line (never its contents: a `Hello`
    /// carries a token).
    pub fn name(&self) -> &'static str {
        self.kind().name()
    }

    /// The frame's bytes, length prefix included, in today's protocol.
    ///
    /// # Panics
    ///
    /// If a text or byte field is over its limit: a frame is built by this
    /// crate from values it checked.
    pub fn encode(&self) -> Vec<u8> {
        self.encode_for(VERSION)
    }

    /// The frame's bytes as a peer of protocol `version` reads them: the
    /// fields a later version added are left out.
    ///
    /// # Panics
    ///
    /// As [`Frame::encode`].
    pub fn encode_for(&self, version: u16) -> Vec<u8> {
        let mut out = Writer(vec![0; 4]);
        out.u8(self.kind() as u8);
        self.put_payload(version, &mut out);
        let length = (out.0.len() - 4) as u32;
        out.0[..4].copy_from_slice(&length.to_be_bytes());
        out.0
    }

    /// The first frame in `buffer`, with how many bytes it took; `None` if
    /// the buffer does not yet hold a whole frame.
    ///
    /// # Errors
    ///
    /// [`WireError`] naming what was expected and what was found.
    pub fn decode(buffer: &[u8]) -> Result<Option<(Frame, usize)>, WireError> {
        let Some(prefix) = buffer.get(..4) else {
            return Ok(None);
        };
        let length = u32::from_be_bytes(prefix.try_into().expect("4 bytes"));
        if length == 0 || length as usize > MAX_FRAME {
            return Err(WireError::Length {
                max: MAX_FRAME,
                found: length,
            });
        }
        let Some(body) = buffer.get(4..4 + length as usize) else {
            return Ok(None);
        };
        let (code, payload) = (body[0], &body[1..]);
        let kind = Kind::from_code(code).ok_or_else(|| WireError::Type {
            expected: Kind::codes_text(),
            found: code,
        })?;
        let mut input = Reader::new(kind.name(), payload);
        let frame = Frame::get_payload(kind, &mut input)?;
        input.end()?;
        Ok(Some((frame, 4 + length as usize)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every_kind() -> Vec<Frame> {
        vec![
            Frame::Hello {
                version: VERSION,
                instance_id: u64::MAX,
                pid: 7,
                token: vec![0xAB; TOKEN_MAX],
                label: "é".repeat(23),
                host: "node-17".into(),
                reclaim: Some(Reclaim {
                    slot: 3,
                    generation: 9,
                    secret: 0xDEAD_BEEF,
                }),
            },
            Frame::Hello {
                version: VERSION,
                instance_id: 1,
                pid: 1,
                token: Vec::new(),
                label: String::new(),
                host: String::new(),
                reclaim: None,
            },
            Frame::Beat {
                heartbeats: 12,
                since_ping_us: 1_500,
                busy: true,
                steps: 40,
            },
            Frame::Bye {},
            Frame::Welcome {
                version: VERSION,
                slot: 3,
                generation: 9,
                secret: 1,
                reap_timeout_ms: 10_000,
                boot_token: 2,
                region_bytes: 8192,
            },
            Frame::Refused {
                code: 3,
                message: "instance 7 is registered and alive".into(),
                reason: None,
            },
            Frame::Refused {
                code: 1,
                message: "instance 7 is no longer registered".into(),
                reason: Some(Reason::Timeout),
            },
            Frame::Ended {
                reason: Reason::Stalled,
            },
            Frame::Info {
                bytes: vec![1; INFO_MAX],
            },
            Frame::Ask {
                version: VERSION,
                token: b"t".to_vec(),
                instance_id: 7,
            },
            Frame::Answer {
                json: "{}".repeat(ANSWER_MAX / 2),
            },
            Frame::Clear {
                version: VERSION,
                token: b"t".to_vec(),
                reset: true,
                wait_ms: 5000,
            },
            Frame::Done {},
            Frame::Heard {},
        ]
    }

    #[test]
    fn every_frame_decodes_to_itself_whole_and_not_before() {
        for frame in every_kind() {
            let bytes = frame.encode();
            assert!(bytes.len() - 4 <= MAX_FRAME);
            for cut in 0..bytes.len() {
                assert_eq!(
                    Frame::decode(&bytes[..cut]),
                    Ok(None),
                    "{frame:?} cut at {cut}"
                );
            }
            let mut two = bytes.clone();
            two.extend_from_slice(&Frame::Bye {}.encode());
            assert_eq!(Frame::decode(&two), Ok(Some((frame.clone(), bytes.len()))));
        }
    }

    #[test]
    fn the_round_trip_covers_every_frame_type() {
        let mut codes: Vec<u8> = every_kind().iter().map(|f| f.kind() as u8).collect();
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes, Kind::CODES);
    }

    #[test]
    fn a_field_a_later_version_added_is_left_out_for_an_older_peer_and_read_as_none() {
        let refused = Frame::Refused {
            code: 1,
            message: "gone".into(),
            reason: Some(Reason::Stalled),
        };
        let old = refused.encode_for(REFUSED_REASON_SINCE - 1);
        assert_eq!(old.len() + 1, refused.encode().len());
        let (back, _) = Frame::decode(&old).unwrap().unwrap();
        assert_eq!(
            back,
            Frame::Refused {
                code: 1,
                message: "gone".into(),
                reason: None,
            }
        );
        let (back, _) = Frame::decode(&refused.encode()).unwrap().unwrap();
        assert_eq!(back, refused);
    }

    #[test]
    fn a_welcome_to_a_peer_before_regions_has_none() {
        let welcome = Frame::Welcome {
            version: REGION_SINCE - 1,
            slot: 1,
            generation: 2,
            secret: 3,
            reap_timeout_ms: 4,
            boot_token: 5,
            region_bytes: 8192,
        };
        let old = welcome.encode_for(REGION_SINCE - 1);
        assert_eq!(old.len() + 8, welcome.encode().len());
        let (back, _) = Frame::decode(&old).unwrap().unwrap();
        assert!(matches!(back, Frame::Welcome { region_bytes: 0, .. }));
    }

    #[test]
    #[cfg_attr(miri, ignore)] // reads files: Miri's isolation has no file system
    fn the_layout_table_in_the_docs_is_the_declarations() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/sessions.md");
        let docs = std::fs::read_to_string(path).unwrap();
        let table = Frame::layout_table();
        assert!(
            docs.contains(&table),
            "docs/sessions.md must hold the frame layouts as declared; paste:\n{table}"
        );
    }

    #[test]
    fn bad_frames_are_refused_naming_what_was_expected() {
        let refused = |bytes: &[u8]| Frame::decode(bytes).unwrap_err().to_string();
        assert_eq!(
            refused(&[0, 0, 0x10, 1]),
            "frame length: expected 1 to 4096 bytes, found 4097"
        );
        assert_eq!(
            refused(&[0, 0, 0, 0]),
            "frame length: expected 1 to 4096 bytes, found 0"
        );
        assert_eq!(
            refused(&[0, 0, 0, 1, 9]),
            "frame type: expected 1 to 5 or 129 to 135, found 9"
        );
        assert_eq!(
            refused(&[0, 0, 0, 2, 3, 0]),
            "bye frame: expected the end of the frame, found 1 more bytes"
        );
        let mut beat = Frame::Beat {
            heartbeats: 1,
            since_ping_us: 0,
            busy: false,
            steps: 0,
        }
        .encode();
        beat[21] = 2; // the busy flag, after the prefix, the type and two 8-byte counts
        assert_eq!(
            refused(&beat),
            "beat frame: expected a flag (0 or 1), found 2"
        );
        assert!(refused(&[0, 0, 0, 2, 131, 9]).contains("expected a reason"));
        assert!(refused(&[0, 0, 0, 5, 1, 0, 1, 0, 0]).contains("hello frame: expected"));
    }

    #[test]
    fn a_label_over_47_bytes_or_not_utf8_is_refused() {
        let hello = |label: &[u8]| {
            let mut body = vec![1, 0, 1];
            body.extend_from_slice(&7u64.to_be_bytes());
            body.extend_from_slice(&1u32.to_be_bytes());
            body.extend_from_slice(&[0, 0]); // no token
            body.push(label.len() as u8);
            body.extend_from_slice(label);
            body.extend_from_slice(&[0, 0]); // no host, no reclaim
            let mut framed = (body.len() as u32).to_be_bytes().to_vec();
            framed.extend_from_slice(&body);
            Frame::decode(&framed)
        };
        assert!(hello(b"gpu0").unwrap().is_some());
        let long = hello(&[b'x'; 48]).unwrap_err().to_string();
        assert_eq!(
            long,
            "hello frame: expected a text of at most 47 bytes, found 48"
        );
        let bad = hello(&[0xFF, 0xFE]).unwrap_err().to_string();
        assert!(bad.starts_with("hello frame: expected UTF-8 text"), "{bad}");
    }

    #[test]
    #[cfg_attr(miri, ignore)] // reads files: Miri's isolation has no file system
    fn the_fuzz_corpus_seeds_are_whole_frames() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/fuzz/corpus/session_frames");
        let mut seeds = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let bytes = std::fs::read(entry.unwrap().path()).unwrap();
            let mut rest = &bytes[..];
            while !rest.is_empty() {
                let (frame, used) = Frame::decode(rest).unwrap().expect("a whole frame");
                let bytes = &rest[..used];
                assert!(frame.encode() == bytes || frame.encode_for(OLDEST_SERVED) == bytes);
                rest = &rest[used..];
            }
            seeds += 1;
        }
        assert!(seeds >= 8, "{seeds} seeds");
    }
}
