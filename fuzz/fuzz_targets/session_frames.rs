//! Any bytes a peer may send on a session's socket, through the frame
//! decoder: a frame, "not yet whole", or an error naming what was expected;
//! never a panic. A decoded frame encodes back to the bytes it came from,
//! in today's protocol or the previous one (whose frames lack the fields
//! today's added).
#![no_main]

use libfuzzer_sys::fuzz_target;
use livereg::wire::{Frame, OLDEST_SERVED};

fuzz_target!(|data: &[u8]| {
    let mut rest = data;
    while let Ok(Some((frame, used))) = Frame::decode(rest) {
        let bytes = &rest[..used];
        assert!(
            frame.encode() == bytes || frame.encode_for(OLDEST_SERVED) == bytes,
            "{frame:?}"
        );
        rest = &rest[used..];
    }
});
