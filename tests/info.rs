//! The info area: what a server publishes, workers read without RPC, never
//! torn; tables of earlier layouts still open and say why they have none.

mod common;

use common::{options, TempTable};
use livereg::{Error, Table, INFO_MAX};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};

#[test]
fn info_round_trips_across_handles_and_is_bounded() {
    let temp = TempTable::new("info", &options());
    assert_eq!(temp.table.info().unwrap(), b"");
    temp.table.set_info(br#"{"chunk_size": 256}"#).unwrap();
    let reader = Table::open(&temp.name).unwrap();
    assert_eq!(reader.info().unwrap(), br#"{"chunk_size": 256}"#);
    reader.set_info(&[7u8; INFO_MAX]).unwrap();
    assert_eq!(temp.table.info().unwrap(), vec![7u8; INFO_MAX]);
    match temp.table.set_info(&[0u8; INFO_MAX + 1]) {
        Err(Error::InvalidArgument(message)) => {
            assert!(message.contains("at most 1024"), "{message}")
        }
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    assert_eq!(
        temp.table.info().unwrap(),
        vec![7u8; INFO_MAX],
        "nothing lost"
    );
}

#[test]
fn readers_never_see_a_torn_value_while_writers_replace_it() {
    let temp = TempTable::new("info-race", &options());
    let (long, short) = (vec![b'A'; 1000], vec![b'B'; 300]);
    temp.table.set_info(&long).unwrap();
    let done = AtomicBool::new(false);
    std::thread::scope(|scope| {
        for _ in 0..2 {
            scope.spawn(|| {
                for round in 0..500 {
                    let value = if round % 2 == 0 { &short } else { &long };
                    temp.table.set_info(value).unwrap();
                }
            });
        }
        let reader = scope.spawn(|| {
            let mut reads = 0;
            while !done.load(Ordering::Relaxed) {
                let seen = temp.table.info().unwrap();
                assert!(seen == long || seen == short, "torn: {} bytes", seen.len());
                reads += 1;
            }
            reads
        });
        std::thread::sleep(std::time::Duration::from_millis(300));
        done.store(true, Ordering::Relaxed);
        assert!(reader.join().unwrap() > 0);
    });
}

/// Rewrites a new table as one of layout `1.minor` without an info area.
fn as_older_layout(temp: &TempTable, minor: u32) {
    let file = with_minor(temp, minor);
    let slots_end = livereg::HEADER_SIZE + temp.table.capacity() as usize * livereg::SLOT_SIZE;
    file.set_len(slots_end as u64).unwrap();
}

#[test]
fn a_table_of_layout_1_2_opens_with_its_info_and_judges_no_progress() {
    let temp = TempTable::new("info-1-2", &options());
    temp.table.set_info(b"kept").unwrap();
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(format!("/dev/shm/{}", temp.name))
        .unwrap();
    file.write_all_at(&2u32.to_le_bytes(), 12).unwrap();
    let slots_end = livereg::HEADER_SIZE + temp.table.capacity() as usize * livereg::SLOT_SIZE;
    file.set_len((slots_end + livereg::INFO_AREA_SIZE) as u64)
        .unwrap();
    let table = Table::open(&temp.name).unwrap();
    assert_eq!(table.info().unwrap(), b"kept");
    let worker = table.register(1, "layout 1.2").unwrap();
    worker.set_busy(true).unwrap();
    worker.progress().unwrap();
    let status = table.status().unwrap();
    assert_eq!(status.registrations[0].last_progress_age_seconds, None);
    worker.deregister().unwrap();
}

#[test]
fn tables_of_layouts_1_0_and_1_1_open_and_say_they_have_no_info() {
    for minor in [0, 1] {
        let temp = TempTable::new("info-old", &options());
        as_older_layout(&temp, minor);
        let table = Table::open(&temp.name).unwrap();
        let worker = table.register(1, "old layout").unwrap();
        worker.heartbeat().unwrap();
        assert_eq!(table.status().unwrap().tracked_instances, 1);
        for result in [table.info().map(drop), table.set_info(b"x")] {
            match result {
                Err(Error::Incompatible(message)) => assert!(
                    message.contains(&format!("layout 1.{minor} has no info area"))
                        && message.contains("expected 1.2"),
                    "{message}"
                ),
                other => panic!("expected Incompatible, got {other:?}"),
            }
        }
        worker.deregister().unwrap();
    }
}

/// Rewrites a table's layout minor in place (its size unchanged); the file.
fn with_minor(temp: &TempTable, minor: u32) -> std::fs::File {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(format!("/dev/shm/{}", temp.name))
        .unwrap();
    file.write_all_at(&minor.to_le_bytes(), 12).unwrap();
    file
}

#[test]
fn tables_of_the_previous_and_the_next_layout_minor_open_and_keep_their_registrations() {
    for minor in [livereg::VERSION_MINOR - 1, livereg::VERSION_MINOR + 1] {
        let temp = TempTable::new("minor-skew", &options());
        temp.table.set_info(b"kept").unwrap();
        let held = temp.table.register(1, "before").unwrap();
        held.heartbeat().unwrap();
        drop(with_minor(&temp, minor));
        let table = Table::open(&temp.name).unwrap_or_else(|e| panic!("layout 1.{minor}: {e}"));
        assert_eq!(table.info().unwrap(), b"kept", "layout 1.{minor}");
        let status = table.status().unwrap();
        assert_eq!(status.registrations.len(), 1, "layout 1.{minor}");
        let worker = table.register(2, "after").unwrap();
        worker.heartbeat().unwrap();
        worker.deregister().unwrap();
        held.deregister().unwrap();
    }
}
