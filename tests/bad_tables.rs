//! Corrupted, foreign, truncated and hostile tables: each gives its own clear
//! error, never a panic; a scan over garbage slots keeps working.

mod common;

use common::{options, unique_name, TempTable, UnlinkOnDrop};
use livereg::{
    header_offsets, Error, RegistrationState, Table, TableOptions, HEADER_SIZE, SLOT_SIZE,
};
use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;

fn path(name: &str) -> String {
    format!("/dev/shm/{name}")
}

fn at(offset: usize) -> u64 {
    offset as u64
}

/// Creates a valid table, then writes `bytes` at `offset` of its object.
fn tampered(tag: &str, offset: u64, bytes: &[u8]) -> TempTable {
    let temp = TempTable::new(tag, &options());
    let file = OpenOptions::new()
        .write(true)
        .open(path(&temp.name))
        .unwrap();
    file.write_all_at(bytes, offset).unwrap();
    temp
}

fn open_error(name: &str) -> Error {
    match Table::open(name) {
        Ok(_) => panic!("table '{name}' opened despite being bad"),
        Err(error) => error,
    }
}

#[test]
fn wrong_magic_is_not_a_livereg_table() {
    let temp = tampered("magic", at(header_offsets::MAGIC), b"NOTOURS!");
    match open_error(&temp.name) {
        Error::Corrupt(message) => assert!(
            message.contains("not a livereg table") && message.contains("expected"),
            "{message}"
        ),
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

#[test]
fn another_major_version_is_incompatible() {
    let temp = tampered(
        "major",
        at(header_offsets::VERSION_MAJOR),
        &2u32.to_le_bytes(),
    );
    match open_error(&temp.name) {
        Error::Incompatible(message) => assert!(
            message.contains(&format!(
                "layout version 2.{}, this build reads 1.x",
                livereg::VERSION_MINOR
            )),
            "{message}"
        ),
        other => panic!("expected Incompatible, got {other:?}"),
    }
}

#[test]
fn another_slot_size_is_incompatible() {
    let temp = tampered(
        "slot-size",
        at(header_offsets::SLOT_SIZE),
        &64u32.to_le_bytes(),
    );
    match open_error(&temp.name) {
        Error::Incompatible(message) => assert!(
            message.contains("slot size 64, this build expects 128"),
            "{message}"
        ),
        other => panic!("expected Incompatible, got {other:?}"),
    }
}

#[test]
fn size_not_matching_the_capacity_is_corrupt() {
    let temp = tampered(
        "capacity",
        at(header_offsets::CAPACITY),
        &9u32.to_le_bytes(),
    );
    match open_error(&temp.name) {
        Error::Corrupt(message) => {
            let expected = livereg::table_size(9);
            assert!(
                message.contains(&format!("expected {expected}")),
                "{message}"
            )
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

#[test]
fn truncated_object_is_corrupt() {
    let temp = TempTable::new("truncated", &options());
    OpenOptions::new()
        .write(true)
        .open(path(&temp.name))
        .unwrap()
        .set_len(100)
        .unwrap();
    match open_error(&temp.name) {
        Error::Corrupt(message) => assert!(
            message.contains("truncated: the object has 100 bytes"),
            "{message}"
        ),
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

#[test]
fn object_cut_inside_the_slots_is_corrupt() {
    let temp = TempTable::new("cut", &options());
    let cut = (HEADER_SIZE + 3 * SLOT_SIZE) as u64;
    OpenOptions::new()
        .write(true)
        .open(path(&temp.name))
        .unwrap()
        .set_len(cut)
        .unwrap();
    match open_error(&temp.name) {
        Error::Corrupt(message) => assert!(
            message.contains(&format!("object is {cut} bytes")),
            "{message}"
        ),
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

#[test]
fn header_never_marked_ready_fails_after_a_short_wait() {
    let temp = tampered("not-ready", at(header_offsets::READY), &0u32.to_le_bytes());
    let started = std::time::Instant::now();
    match open_error(&temp.name) {
        Error::Corrupt(message) => assert!(message.contains("not marked ready"), "{message}"),
        other => panic!("expected Corrupt, got {other:?}"),
    }
    assert!(
        started.elapsed() >= std::time::Duration::from_millis(900),
        "it waited for the creator"
    );
}

#[test]
fn missing_table_is_not_found() {
    assert!(matches!(
        Table::open(&unique_name("missing")),
        Err(Error::NotFound(_))
    ));
}

#[test]
fn existing_table_cannot_be_created_again() {
    let temp = TempTable::new("twice", &options());
    match Table::create(&temp.name, &options()) {
        Err(Error::Exists { message, .. }) => assert!(message.contains(&temp.name), "{message}"),
        other => panic!("expected Exists, got {:?}", other.map(|_| ())),
    }
    Table::open(&temp.name).expect("the first table is untouched");
}

#[test]
fn foreign_file_of_random_bytes_is_refused() {
    let name = unique_name("foreign");
    let _guard = UnlinkOnDrop(name.clone());
    let bytes: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(path(&name), bytes).unwrap();
    assert!(matches!(open_error(&name), Error::Corrupt(_)));
}

/// A small deterministic generator (xorshift64*), so failures replay.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

#[test]
fn scan_over_garbage_slots_reports_them_and_keeps_working() {
    let temp = TempTable::new(
        "garbage",
        &TableOptions {
            capacity: 64,
            ..options()
        },
    );
    let file = OpenOptions::new()
        .write(true)
        .open(path(&temp.name))
        .unwrap();
    let mut rng = Rng(0x5EED);
    // Slots 0..8 stay clean for real registrations; the rest is noise.
    let noise: Vec<u8> = (0..56 * SLOT_SIZE).map(|_| rng.next() as u8).collect();
    file.write_all_at(&noise, (HEADER_SIZE + 8 * SLOT_SIZE) as u64)
        .unwrap();

    let table = Table::open(&temp.name).unwrap();
    let worker = table.register(1, "real").unwrap();
    let mut reaper = table.reaper().build().unwrap();
    let first = reaper.scan().unwrap();
    assert!(first.corrupt_slots > 0, "garbage slots are reported");
    for _ in 0..5 {
        reaper.scan().unwrap();
    }
    worker
        .heartbeat()
        .expect("a real registration is untouched by garbage around it");
    let status = table.status().unwrap();
    assert!(status.corrupt_slots > 0);
    assert!(status
        .registrations
        .iter()
        .any(|r| r.instance_id == 1 && r.state == RegistrationState::Live));
}

#[test]
fn random_bytes_anywhere_never_panic() {
    let mut rng = Rng(0xC0FFEE);
    let temp = TempTable::new(
        "hostile",
        &TableOptions {
            capacity: 4,
            ..options()
        },
    );
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path(&temp.name))
        .unwrap();
    let size = (HEADER_SIZE + 4 * SLOT_SIZE) as u64;
    let mut pristine = vec![0u8; size as usize];
    file.read_exact_at(&mut pristine, 0).unwrap();
    for round in 0..300 {
        file.write_all_at(&pristine, 0).unwrap();
        // Keep the header's identity most of the time so the slots get exercised.
        let from = if round % 4 == 0 { 0 } else { 32 };
        for _ in 0..(1 + rng.next() % 16) {
            let at = from + rng.next() % (size - from);
            file.write_all_at(&[rng.next() as u8], at).unwrap();
        }
        if let Ok(table) = Table::open(&temp.name) {
            let _ = table.status();
            if let Ok(mut reaper) = table.reaper().build() {
                reaper.scan().unwrap();
                reaper.scan().unwrap();
            }
            let _ = table.register(7, "probe").map(|w| w.heartbeat());
            let _ = table.status();
        }
    }
}

#[test]
fn a_table_truncated_under_open_handles_is_refused_not_faulted_on() {
    let temp = TempTable::new("truncated-live", &options());
    let mut reaper = temp.table.reaper().build().unwrap();
    let worker = temp.table.register(1, "w").unwrap();
    reaper.scan().unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(format!("/dev/shm/{}", temp.name))
        .unwrap()
        .set_len(0)
        .unwrap();
    let shrank = |what: &str, result: Result<(), Error>| match result {
        Err(Error::Corrupt(message)) => assert!(
            message.contains("shrank to 0 bytes") && message.contains("truncated"),
            "{what}: {message}"
        ),
        other => panic!("{what}: expected Corrupt, got {other:?}"),
    };
    shrank("scan", reaper.scan().map(drop));
    shrank("status", temp.table.status().map(drop));
    shrank("register", temp.table.register(2, "w").map(drop));
    shrank("deregister", worker.deregister());
}

/// Found by `cargo fuzz` (`.ci/fuzz`): hostile per-reason counters summed
/// into `ended_total` overflowed.
#[test]
fn counters_at_their_maximum_do_not_overflow_status() {
    // The first two of `Header::ended`, at their maximum.
    let temp = tampered("counters", at(header_offsets::ENDED), &[0xFF; 16]);
    let status = Table::open(&temp.name).unwrap().status().unwrap();
    assert_eq!(status.ended_total, u64::MAX);
}

/// The death words' file (`NAME.dying`) truncated under open handles is
/// never touched again: registering, scanning and status go on (the
/// registration without a death word), nothing faults.
#[test]
fn a_death_words_file_truncated_under_open_handles_is_left_alone() {
    let temp = TempTable::new("dying-truncated", &options());
    let mut reaper = temp.table.reaper().build().unwrap();
    let first = temp.table.register(1, "w").unwrap();
    reaper.scan().unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(format!("/dev/shm/{}.dying", temp.name))
        .unwrap()
        .set_len(0)
        .unwrap();
    let second = temp.table.register(2, "w").unwrap();
    let report = reaper.scan().unwrap();
    assert!(report.dying.is_empty() && report.ended.is_empty());
    assert_eq!(temp.table.status().unwrap().tracked_instances, 2);
    first.deregister().unwrap();
    second.deregister().unwrap();
    assert_eq!(reaper.scan().unwrap().ended.len(), 2);
}

/// A death words' file replaced by a symbolic link (to a file of the
/// attacker's choosing) or by a file of the wrong size is not used: the
/// table opens, registers and reaps as one without death words, and the
/// link's target is untouched.
#[test]
fn a_planted_death_words_file_is_ignored_and_its_target_untouched() {
    let temp = TempTable::new("dying-planted", &options());
    let dying = format!("/dev/shm/{}.dying", temp.name);
    let target =
        std::env::temp_dir().join(format!("livereg-planted-target-{}", std::process::id()));
    std::fs::write(&target, vec![7u8; 4096]).unwrap();
    for plant in ["link", "size"] {
        std::fs::remove_file(&dying).unwrap();
        match plant {
            "link" => std::os::unix::fs::symlink(&target, &dying).unwrap(),
            _ => std::fs::write(&dying, [0u8; 100]).unwrap(),
        }
        let table = Table::open(&temp.name).unwrap();
        let worker = table.register(3, "w").unwrap();
        let mut reaper = table.reaper().build().unwrap();
        assert!(reaper.scan().unwrap().dying.is_empty());
        worker.deregister().unwrap();
        assert_eq!(reaper.scan().unwrap().ended.len(), 1, "{plant}");
    }
    assert_eq!(std::fs::read(&target).unwrap(), vec![7u8; 4096]);
    std::fs::remove_file(&target).unwrap();
}
