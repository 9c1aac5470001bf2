//! Coverage-guided fuzzing of everything that reads a table another process
//! may have written: open/validate, status, scans (twice, the second after
//! every budget passed) and a registration. Any input must give a table or a
//! clear error; a panic, a hang or an out-of-bounds access is a finding.
//!
//! Run by `.ci/fuzz SECONDS`; seeds (real tables) in `corpus/hostile_table`.

#![no_main]

use libfuzzer_sys::fuzz_target;
use livereg::{Clock, Table, HEADER_SIZE};
use std::os::unix::fs::FileExt;
use std::time::Duration;

/// Offset and value of the header's `ready` word: an input without it would
/// only make `open` wait a second for a creator that never comes.
const READY_AT: usize = 28;
const READY: [u8; 4] = 0x5245_4459u32.to_le_bytes();

fuzz_target!(|bytes: &[u8]| {
    // Shorter objects are refused as truncated after that same wait.
    if bytes.len() < HEADER_SIZE {
        return;
    }
    let mut table_bytes = bytes.to_vec();
    table_bytes[READY_AT..READY_AT + 4].copy_from_slice(&READY);
    let path = format!("/dev/shm/livereg-fuzz-{}", std::process::id());
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .expect("a scratch object in /dev/shm");
    file.write_all_at(&table_bytes, 0).expect("write the input");
    let Ok(table) = Table::open(&path) else {
        return;
    };
    let manual = Clock::manual(1_000_000_000_000);
    let table = table.with_clock(manual.clock());
    let _ = table.status();
    if let Ok(mut reaper) = table.reaper().on_drop(|_| Ok(())).build() {
        let _ = reaper.scan();
        manual.advance(Duration::from_secs(3600));
        let _ = reaper.scan();
    }
    let _ = table.register(7, "fuzz").map(|worker| worker.heartbeat());
    let _ = table.status();
});
