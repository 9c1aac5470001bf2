//! Any bytes a peer may send on a session's socket, through the frame
//! decoder: a frame, "not yet whole", or an error naming what was expected;
//! never a panic. A decoded frame encodes back to the bytes it came from.
#![no_main]

use libfuzzer_sys::fuzz_target;
use livereg::wire::Frame;

fuzz_target!(|data: &[u8]| {
    let mut rest = data;
    while let Ok(Some((frame, used))) = Frame::decode(rest) {
        assert_eq!(frame.encode(), rest[..used], "{frame:?}");
        rest = &rest[used..];
    }
});
