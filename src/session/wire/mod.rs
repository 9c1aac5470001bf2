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
//! | type | direction | payload |
//! |---|---|---|
//! | 1 `Hello` | client → server, first | version u16, instance id u64, pid u32, token (u16 + ≤ 256 bytes), label (u8 + ≤ 47 bytes), host (u8 + ≤ 255 bytes), reclaim flag u8, then if 1: slot u32, generation u32, secret u64 |
//! | 2 `Beat` | client → server | heartbeats u64, microseconds since the last heartbeat u64, busy u8 (0/1), progress steps u64 |
//! | 3 `Bye` | client → server | (none): a clean deregistration |
//! | 4 `Ask` | client → server, first and only | version u16, token (u16 + ≤ 256 bytes), instance id u64 (0: none): a question that registers nothing (`status`, `probe` over an address) |
//! | 5 `Clear` | client → server, first and only | version u16, token (u16 + ≤ 256 bytes), reset u8 (0/1), wait ms u64: a clear (or reset) of the table, answered `Done` once the reaper carried it out, or `Refused` |
//! | 129 `Welcome` | server → client | version u16, slot u32, generation u32, secret u64, reap timeout ms u64, boot token u64 |
//! | 130 `Refused` | server → client | result code u8, message (u16 + ≤ 1024 bytes) |
//! | 131 `Ended` | server → client | reason u8 (the registration ended: the next ping hears it) |
//! | 132 `Info` | server → client | the server's info area (u16 + ≤ 1024 bytes): just before `Welcome` (if not empty), and whenever it changes |
//! | 133 `Answer` | server → client | the table's status as JSON (u16 + ≤ 4000 bytes), with only the registrations of the instance asked about |
//! | 134 `Done` | server → client | (none): the `Clear` asked for was carried out |
//! | 135 `Heard` | server → client | (none): sent every `T/4` to a session the listener holds, so a client learns within about `T` when nobody hears it |

use crate::event::Reason;
use crate::layout::{INFO_MAX, LABEL_MAX};

mod fields;
use fields::{Reader, Writer};

/// The protocol version a `Hello` and a `Welcome` carry.
pub const VERSION: u16 = 2;

/// The oldest version a listener serves (and a client falls back to): the
/// previous one. What version 2 added, a version-1 peer does without: a
/// listener sends it no `Heard`, and a client of a version-1 listener
/// expects none.
pub const OLDEST_SERVED: u16 = VERSION - 1;

/// The version that added `Heard`.
pub const HEARD_SINCE: u16 = 2;

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

/// A registration a client held before its connection broke, and the secret
/// the server gave it at `Welcome`, to take it back after a reconnect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reclaim {
    /// The slot it held.
    pub slot: u32,
    /// That slot's generation.
    pub generation: u32,
    /// The secret of the `Welcome` that gave it.
    pub secret: u64,
}

/// Every frame type: its code on the wire and its name. Encoding and
/// decoding both go through this one list.
macro_rules! frame_kinds {
    ($($kind:ident = $code:literal, $name:literal;)*) => {
        /// A frame's type.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[repr(u8)]
        enum Kind {
            $($kind = $code,)*
        }

        impl Kind {
            /// Every type's code, in the list's order.
            const CODES: &'static [u8] = &[$($code),*];

            /// The type a code on the wire names, if any.
            fn from_code(code: u8) -> Option<Kind> {
                match code {
                    $($code => Some(Kind::$kind),)*
                    _ => None,
                }
            }

            fn name(self) -> &'static str {
                match self {
                    $(Kind::$kind => $name,)*
                }
            }
        }
    };
}

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

frame_kinds! {
    Hello = 1, "hello";
    Beat = 2, "beat";
    Bye = 3, "bye";
    Ask = 4, "ask";
    Clear = 5, "clear";
    Welcome = 129, "welcome";
    Refused = 130, "refused";
    Ended = 131, "ended";
    Info = 132, "info";
    Answer = 133, "answer";
    Done = 134, "done";
    Heard = 135, "heard";
}

/// One frame of a session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    /// The client's first frame: who it is and what it proves.
    Hello {
        /// The client's protocol version.
        version: u16,
        /// The instance id to register.
        instance_id: u64,
        /// The client's pid, as it sees it (reported, never trusted).
        pid: u32,
        /// The listener's token (may be empty).
        token: Vec<u8>,
        /// The registration's label.
        label: String,
        /// The client's host name, as it reports it.
        host: String,
        /// A registration to take back after a reconnect.
        reclaim: Option<Reclaim>,
    },
    /// What changed on the client since its last beat.
    Beat {
        /// Heartbeats counted by the client.
        heartbeats: u64,
        /// How long before this frame the client's last heartbeat was, in
        /// microseconds of its own clock: the server dates the heartbeat
        /// back by as much, so a session's silence counts from its last
        /// heartbeat, not from when the sender thread forwarded it.
        since_ping_us: u64,
        /// Whether the engine has work in flight.
        busy: bool,
        /// Steps of progress counted by the client.
        steps: u64,
    },
    /// A clean deregistration.
    Bye,
    /// A question about the table that registers nothing.
    Ask {
        /// The client's protocol version.
        version: u16,
        /// The listener's token (may be empty).
        token: Vec<u8>,
        /// The instance whose registrations to include (0: none).
        instance_id: u64,
    },
    /// A clear of the table (its clear handlers run; registrations are
    /// untouched) or, with `reset`, a reset (every registration ends
    /// `cleared` first), asked for by a process that cannot map it.
    Clear {
        /// The client's protocol version.
        version: u16,
        /// The listener's token (may be empty).
        token: Vec<u8>,
        /// A reset rather than a clear.
        reset: bool,
        /// How long the client waits for it, in milliseconds.
        wait_ms: u64,
    },
    /// The registration was made (or taken back).
    Welcome {
        /// The server's protocol version.
        version: u16,
        /// The registration's slot.
        slot: u32,
        /// The slot's generation.
        generation: u32,
        /// What a reconnecting client proves the registration with.
        secret: u64,
        /// The table's reap timeout, in milliseconds.
        reap_timeout_ms: u64,
        /// The reaper's boot token.
        boot_token: u64,
    },
    /// The registration was refused: a result code and why.
    Refused {
        /// The result code (as the C ABI's `livereg_result`).
        code: u8,
        /// Why, in a line.
        message: String,
    },
    /// The registration ended; the client's next ping hears why.
    Ended {
        /// Why it ended.
        reason: Reason,
    },
    /// The server's info area.
    Info {
        /// Its bytes.
        bytes: Vec<u8>,
    },
    /// The answer to an `Ask`: the table's status as JSON.
    Answer {
        /// The JSON text.
        json: String,
    },
    /// The `Clear` asked for was carried out.
    Done,
    /// The listener holds the session and hears its client.
    Heard,
}

/// Why bytes are not a frame.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The length prefix says more than [`MAX_FRAME`], or 0.
    #[error("frame length: expected 1 to {MAX_FRAME} bytes, found {0}")]
    Length(u32),
    /// A type no side sends.
    #[error("frame type: expected {expected}, found {0}", expected = Kind::codes_text())]
    Type(u8),
    /// The payload does not match its type's layout.
    #[error("{frame} frame: expected {expected}, found {found}")]
    Layout {
        /// The frame's type.
        frame: &'static str,
        /// What its layout needs.
        expected: String,
        /// What was there.
        found: String,
    },
}

impl Frame {
    fn kind(&self) -> Kind {
        match self {
            Frame::Hello { .. } => Kind::Hello,
            Frame::Beat { .. } => Kind::Beat,
            Frame::Bye => Kind::Bye,
            Frame::Ask { .. } => Kind::Ask,
            Frame::Clear { .. } => Kind::Clear,
            Frame::Welcome { .. } => Kind::Welcome,
            Frame::Refused { .. } => Kind::Refused,
            Frame::Ended { .. } => Kind::Ended,
            Frame::Info { .. } => Kind::Info,
            Frame::Answer { .. } => Kind::Answer,
            Frame::Done => Kind::Done,
            Frame::Heard => Kind::Heard,
        }
    }

    /// The frame's name, for a log line (never its contents: a `Hello`
    /// carries a token).
    pub fn name(&self) -> &'static str {
        self.kind().name()
    }

    /// The frame's bytes, length prefix included.
    ///
    /// # Panics
    ///
    /// If a text or byte field is over its limit: a frame is built by this
    /// crate from values it checked.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Writer(Vec::with_capacity(64));
        out.u8(self.kind() as u8);
        match self {
            Frame::Hello {
                version,
                instance_id,
                pid,
                token,
                label,
                host,
                reclaim,
            } => {
                out.u16(*version);
                out.u64(*instance_id);
                out.u32(*pid);
                out.bytes16(token, TOKEN_MAX);
                out.bytes8(label.as_bytes(), LABEL_MAX);
                out.bytes8(host.as_bytes(), HOST_MAX);
                match reclaim {
                    None => out.u8(0),
                    Some(reclaim) => {
                        out.u8(1);
                        out.u32(reclaim.slot);
                        out.u32(reclaim.generation);
                        out.u64(reclaim.secret);
                    }
                }
            }
            Frame::Beat {
                heartbeats,
                since_ping_us,
                busy,
                steps,
            } => {
                out.u64(*heartbeats);
                out.u64(*since_ping_us);
                out.u8(u8::from(*busy));
                out.u64(*steps);
            }
            Frame::Bye | Frame::Done | Frame::Heard => {}
            Frame::Ask {
                version,
                token,
                instance_id,
            } => {
                out.u16(*version);
                out.bytes16(token, TOKEN_MAX);
                out.u64(*instance_id);
            }
            Frame::Clear {
                version,
                token,
                reset,
                wait_ms,
            } => {
                out.u16(*version);
                out.bytes16(token, TOKEN_MAX);
                out.u8(u8::from(*reset));
                out.u64(*wait_ms);
            }
            Frame::Welcome {
                version,
                slot,
                generation,
                secret,
                reap_timeout_ms,
                boot_token,
            } => {
                out.u16(*version);
                out.u32(*slot);
                out.u32(*generation);
                out.u64(*secret);
                out.u64(*reap_timeout_ms);
                out.u64(*boot_token);
            }
            Frame::Refused { code, message } => {
                out.u8(*code);
                out.bytes16(message.as_bytes(), MESSAGE_MAX);
            }
            Frame::Ended { reason } => {
                out.u8(*reason as u8);
            }
            Frame::Info { bytes } => {
                out.bytes16(bytes, INFO_MAX);
            }
            Frame::Answer { json } => {
                out.bytes16(json.as_bytes(), ANSWER_MAX);
            }
        }
        let body = out.0;
        let mut framed = Vec::with_capacity(body.len() + 4);
        framed.extend_from_slice(&(body.len() as u32).to_be_bytes());
        framed.extend_from_slice(&body);
        framed
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
            return Err(WireError::Length(length));
        }
        let Some(body) = buffer.get(4..4 + length as usize) else {
            return Ok(None);
        };
        let (code, payload) = (body[0], &body[1..]);
        let kind = Kind::from_code(code).ok_or(WireError::Type(code))?;
        let name = kind.name();
        let frame = match kind {
            Kind::Hello => whole(name, payload, hello)?,
            Kind::Beat => whole(name, payload, |input| {
                Ok(Frame::Beat {
                    heartbeats: input.u64()?,
                    since_ping_us: input.u64()?,
                    busy: input.flag()?,
                    steps: input.u64()?,
                })
            })?,
            Kind::Bye => whole(name, payload, |_| Ok(Frame::Bye))?,
            Kind::Ask => whole(name, payload, |input| {
                Ok(Frame::Ask {
                    version: input.u16()?,
                    token: input.bytes16(TOKEN_MAX)?.to_vec(),
                    instance_id: input.u64()?,
                })
            })?,
            Kind::Clear => whole(name, payload, |input| {
                Ok(Frame::Clear {
                    version: input.u16()?,
                    token: input.bytes16(TOKEN_MAX)?.to_vec(),
                    reset: input.flag()?,
                    wait_ms: input.u64()?,
                })
            })?,
            Kind::Welcome => whole(name, payload, |input| {
                Ok(Frame::Welcome {
                    version: input.u16()?,
                    slot: input.u32()?,
                    generation: input.u32()?,
                    secret: input.u64()?,
                    reap_timeout_ms: input.u64()?,
                    boot_token: input.u64()?,
                })
            })?,
            Kind::Refused => whole(name, payload, |input| {
                Ok(Frame::Refused {
                    code: input.u8()?,
                    message: input.text16(MESSAGE_MAX)?,
                })
            })?,
            Kind::Ended => whole(name, payload, |input| {
                let code = input.u8()?;
                let reason = Reason::from_code(code).ok_or_else(|| {
                    input.wrong(
                        &format!("a reason (1 to {})", Reason::ALL.len()),
                        format!("{code}"),
                    )
                })?;
                Ok(Frame::Ended { reason })
            })?,
            Kind::Info => whole(name, payload, |input| {
                Ok(Frame::Info {
                    bytes: input.bytes16(INFO_MAX)?.to_vec(),
                })
            })?,
            Kind::Answer => whole(name, payload, |input| {
                Ok(Frame::Answer {
                    json: input.text16(ANSWER_MAX)?,
                })
            })?,
            Kind::Done => whole(name, payload, |_| Ok(Frame::Done))?,
            Kind::Heard => whole(name, payload, |_| Ok(Frame::Heard))?,
        };
        Ok(Some((frame, 4 + length as usize)))
    }
}

/// Parses one frame's payload with `parse`, which must take all of it.
fn whole<'a>(
    frame: &'static str,
    payload: &'a [u8],
    parse: impl FnOnce(&mut Reader<'a>) -> Result<Frame, WireError>,
) -> Result<Frame, WireError> {
    let mut input = Reader::new(frame, payload);
    let parsed = parse(&mut input)?;
    input.end()?;
    Ok(parsed)
}

fn hello(input: &mut Reader<'_>) -> Result<Frame, WireError> {
    let version = input.u16()?;
    let instance_id = input.u64()?;
    let pid = input.u32()?;
    let token = input.bytes16(TOKEN_MAX)?.to_vec();
    let label = input.text8(LABEL_MAX)?;
    let host = input.text8(HOST_MAX)?;
    let reclaim = match input.u8()? {
        0 => None,
        1 => Some(Reclaim {
            slot: input.u32()?,
            generation: input.u32()?,
            secret: input.u64()?,
        }),
        other => return Err(input.wrong("a reclaim flag (0 or 1)", format!("{other}"))),
    };
    Ok(Frame::Hello {
        version,
        instance_id,
        pid,
        token,
        label,
        host,
        reclaim,
    })
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
            Frame::Bye,
            Frame::Welcome {
                version: VERSION,
                slot: 3,
                generation: 9,
                secret: 1,
                reap_timeout_ms: 10_000,
                boot_token: 2,
            },
            Frame::Refused {
                code: 3,
                message: "instance 7 is registered and alive".into(),
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
            Frame::Done,
            Frame::Heard,
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
            two.extend_from_slice(&Frame::Bye.encode());
            assert_eq!(Frame::decode(&two), Ok(Some((frame.clone(), bytes.len()))));
        }
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
                assert_eq!(frame.encode(), rest[..used]);
                rest = &rest[used..];
            }
            seeds += 1;
        }
        assert!(seeds >= 8, "{seeds} seeds");
    }
}
