//! Why bytes are not a frame, naming what was expected and what was found.

/// Why bytes are not a frame.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The length prefix says more than the largest frame, or 0.
    #[error("frame length: expected 1 to {max} bytes, found {found}")]
    Length {
        /// The largest frame.
        max: usize,
        /// The length found.
        found: u32,
    },
    /// A type no side sends.
    #[error("frame type: expected {expected}, found {found}")]
    Type {
        /// The types there are ("1 to 5 or 129 to 135").
        expected: String,
        /// The type found.
        found: u8,
    },
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
