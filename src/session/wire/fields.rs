//! The fields of a frame, written and read: fixed-width integers (big
//! endian), flags, and byte strings and text under a length prefix, each
//! read checked against its bound and naming what it expected.

use super::WireError;

/// Appends big-endian fields.
pub(super) struct Writer(pub(super) Vec<u8>);

impl Writer {
    pub(super) fn u8(&mut self, value: u8) {
        self.0.push(value);
    }
    pub(super) fn u16(&mut self, value: u16) {
        self.0.extend_from_slice(&value.to_be_bytes());
    }
    pub(super) fn u32(&mut self, value: u32) {
        self.0.extend_from_slice(&value.to_be_bytes());
    }
    pub(super) fn u64(&mut self, value: u64) {
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
        Ok(u16::from_be_bytes(self.take(2)?.try_into().expect("2")))
    }
    pub(super) fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_be_bytes(self.take(4)?.try_into().expect("4")))
    }
    pub(super) fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_be_bytes(self.take(8)?.try_into().expect("8")))
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

    /// The payload must end here.
    pub(super) fn end(&self) -> Result<(), WireError> {
        match self.payload.len() - self.at {
            0 => Ok(()),
            extra => Err(self.wrong("the end of the frame", format!("{extra} more bytes"))),
        }
    }
}
