//! The fields of a frame, written and read: fixed-width integers (big
//! endian), flags, and byte strings and text under a length prefix, each
//! read checked against its bound and naming what it expected. Each kind of
//! field is one [`Field`]: how it is written, how it is read, and how the
//! layout table names it.

use super::error::WireError;
use crate::event::Reason;

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

/// One kind of field: the frame declaration names it beside the Rust type
/// it carries.
pub(super) trait Field {
    /// The Rust type the frame holds.
    type Value;
    /// Appends `value`.
    fn put(value: &Self::Value, out: &mut Writer);
    /// Reads one value.
    fn get(input: &mut Reader<'_>) -> Result<Self::Value, WireError>;
    /// How the layout table names it ("u16", "text (u8 + ≤ 47 bytes)").
    fn layout() -> String;
}

macro_rules! integer_fields {
    ($($codec:ident: $type:ty;)*) => {$(
        /// A big-endian integer.
        pub(super) struct $codec;
        impl Field for $codec {
            type Value = $type;
            fn put(value: &$type, out: &mut Writer) {
                out.0.extend_from_slice(&value.to_be_bytes());
            }
            fn get(input: &mut Reader<'_>) -> Result<$type, WireError> {
                let bytes = input.take(size_of::<$type>())?;
                Ok(<$type>::from_be_bytes(bytes.try_into().expect("its width")))
            }
            fn layout() -> String {
                stringify!($type).to_owned()
            }
        }
    )*};
}

integer_fields! {
    U8: u8;
    U16: u16;
    U32: u32;
    U64: u64;
}

/// A flag: one byte, 0 or 1.
pub(super) struct Flag;
impl Field for Flag {
    type Value = bool;
    fn put(value: &bool, out: &mut Writer) {
        out.0.push(u8::from(*value));
    }
    fn get(input: &mut Reader<'_>) -> Result<bool, WireError> {
        input.flag()
    }
    fn layout() -> String {
        "u8 (0/1)".to_owned()
    }
}

/// Bytes under a 2-byte length, at most `MAX`.
pub(super) struct Bytes16<const MAX: usize>;
impl<const MAX: usize> Field for Bytes16<MAX> {
    type Value = Vec<u8>;
    fn put(value: &Vec<u8>, out: &mut Writer) {
        out.bytes16(value, MAX);
    }
    fn get(input: &mut Reader<'_>) -> Result<Vec<u8>, WireError> {
        Ok(input.bytes16(MAX)?.to_vec())
    }
    fn layout() -> String {
        format!("(u16 + ≤ {MAX} bytes)")
    }
}

/// UTF-8 text under a `PREFIX`-byte length (1 or 2), at most `MAX` bytes.
pub(super) struct Text<const PREFIX: usize, const MAX: usize>;
impl<const PREFIX: usize, const MAX: usize> Field for Text<PREFIX, MAX> {
    type Value = String;
    fn put(value: &String, out: &mut Writer) {
        match PREFIX {
            1 => out.bytes8(value.as_bytes(), MAX),
            _ => out.bytes16(value.as_bytes(), MAX),
        }
    }
    fn get(input: &mut Reader<'_>) -> Result<String, WireError> {
        match PREFIX {
            1 => input.text8(MAX),
            _ => input.text16(MAX),
        }
    }
    fn layout() -> String {
        format!("text (u{} + ≤ {MAX} bytes)", PREFIX * 8)
    }
}

/// A reason a registration ended, as its code (1 to the last reason).
pub(super) struct ReasonCode;
impl Field for ReasonCode {
    type Value = Reason;
    fn put(value: &Reason, out: &mut Writer) {
        out.0.push(*value as u8);
    }
    fn get(input: &mut Reader<'_>) -> Result<Reason, WireError> {
        let code = input.u8()?;
        reason(input, code)
    }
    fn layout() -> String {
        format!("u8 (1 to {})", Reason::ALL.len())
    }
}

/// The reason of `code`, or an error naming the codes there are.
fn reason(input: &Reader<'_>, code: u8) -> Result<Reason, WireError> {
    Reason::from_code(code).ok_or_else(|| {
        input.wrong(
            &format!("a reason (1 to {})", Reason::ALL.len()),
            format!("{code}"),
        )
    })
}

/// A reason or none: its code, 0 for none.
pub(super) struct ReasonOrNone;
impl Field for ReasonOrNone {
    type Value = Option<Reason>;
    fn put(value: &Option<Reason>, out: &mut Writer) {
        out.0.push(value.map_or(0, |reason| reason as u8));
    }
    fn get(input: &mut Reader<'_>) -> Result<Option<Reason>, WireError> {
        match input.u8()? {
            0 => Ok(None),
            code => reason(input, code).map(Some),
        }
    }
    fn layout() -> String {
        format!("u8 (0: none, 1 to {})", Reason::ALL.len())
    }
}

/// A registration to take back, or none: a flag, then if 1 the slot, its
/// generation and the secret.
pub(super) struct MaybeReclaim;
impl Field for MaybeReclaim {
    type Value = Option<Reclaim>;
    fn put(value: &Option<Reclaim>, out: &mut Writer) {
        Flag::put(&value.is_some(), out);
        if let Some(reclaim) = value {
            U32::put(&reclaim.slot, out);
            U32::put(&reclaim.generation, out);
            U64::put(&reclaim.secret, out);
        }
    }
    fn get(input: &mut Reader<'_>) -> Result<Option<Reclaim>, WireError> {
        match input.u8()? {
            0 => Ok(None),
            1 => Ok(Some(Reclaim {
                slot: U32::get(input)?,
                generation: U32::get(input)?,
                secret: U64::get(input)?,
            })),
            other => Err(input.wrong("a reclaim flag (0 or 1)", format!("{other}"))),
        }
    }
    fn layout() -> String {
        "u8 (0/1), then if 1: slot u32, generation u32, secret u64".to_owned()
    }
}

/// Appends big-endian fields.
pub(super) struct Writer(pub(super) Vec<u8>);

impl Writer {
    pub(super) fn u8(&mut self, value: u8) {
        self.0.push(value);
    }
    pub(super) fn u16(&mut self, value: u16) {
        self.0.extend_from_slice(&value.to_be_bytes());
    }
    pub(super) fn bytes8(&mut self, bytes: &[u8], max: usize) {
        assert!(bytes.len() <= max.min(255), "a field over its limit");
        self.u8(bytes.len() as u8);
        self.0.extend_from_slice(bytes);
    }
    pub(super) fn bytes16(&mut self, bytes: &[u8], max: usize) {
        assert!(bytes.len() <= max, "a field over its limit");
        self.u16(bytes.len() as u16);
        self.0.extend_from_slice(bytes);
    }
}

/// Reads big-endian fields from one frame's payload, naming the frame in
/// its errors.
pub(super) struct Reader<'a> {
    frame: &'static str,
    payload: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    pub(super) fn new(frame: &'static str, payload: &'a [u8]) -> Reader<'a> {
        Reader {
            frame,
            payload,
            at: 0,
        }
    }

    pub(super) fn wrong(&self, expected: &str, found: String) -> WireError {
        WireError::Layout {
            frame: self.frame,
            expected: expected.to_owned(),
            found,
        }
    }

    pub(super) fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        let left = self.payload.len() - self.at;
        if n > left {
            return Err(self.wrong(
                &format!("{n} more bytes at offset {}", self.at),
                format!("{left}"),
            ));
        }
        let bytes = &self.payload[self.at..self.at + n];
        self.at += n;
        Ok(bytes)
    }

    pub(super) fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.take(1)?[0])
    }
    pub(super) fn u16(&mut self) -> Result<u16, WireError> {
        U16::get(self)
    }

    pub(super) fn flag(&mut self) -> Result<bool, WireError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(self.wrong("a flag (0 or 1)", format!("{other}"))),
        }
    }

    pub(super) fn bytes16(&mut self, max: usize) -> Result<&'a [u8], WireError> {
        let n = usize::from(self.u16()?);
        if n > max {
            return Err(self.wrong(&format!("at most {max} bytes"), format!("{n}")));
        }
        self.take(n)
    }

    pub(super) fn text(&mut self, n: usize, max: usize) -> Result<String, WireError> {
        if n > max {
            return Err(self.wrong(&format!("a text of at most {max} bytes"), format!("{n}")));
        }
        let bytes = self.take(n)?;
        std::str::from_utf8(bytes)
            .map(str::to_owned)
            .map_err(|e| self.wrong("UTF-8 text", e.to_string()))
    }

    pub(super) fn text8(&mut self, max: usize) -> Result<String, WireError> {
        let n = usize::from(self.u8()?);
        self.text(n, max)
    }

    pub(super) fn text16(&mut self, max: usize) -> Result<String, WireError> {
        let n = usize::from(self.u16()?);
        self.text(n, max)
    }

    /// Whether the payload has been read to its end.
    pub(super) fn is_empty(&self) -> bool {
        self.at == self.payload.len()
    }

    /// The payload must end here.
    pub(super) fn end(&self) -> Result<(), WireError> {
        match self.payload.len() - self.at {
            0 => Ok(()),
            extra => Err(self.wrong("the end of the frame", format!("{extra} more bytes"))),
        }
    }
}
