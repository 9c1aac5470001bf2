//! Helpers shared by the integration tests.
#![allow(dead_code)]

use livereg::{Clock, DropEvent, ManualClock, Reaper, Table, TableOptions};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A table in /dev/shm with a name no other test uses, unlinked on drop.
pub struct TempTable {
    pub name: String,
    pub table: Table,
}

impl TempTable {
    pub fn new(tag: &str, options: &TableOptions) -> TempTable {
        let name = unique_name(tag);
        let table = Table::create(&name, options).expect("create a test table");
        TempTable { name, table }
    }
}

impl Drop for TempTable {
    fn drop(&mut self) {
        let _ = Table::unlink(&self.name);
    }
}

/// Unlinks a name on drop (for tables a test creates by other means).
pub struct UnlinkOnDrop(pub String);

impl Drop for UnlinkOnDrop {
    fn drop(&mut self) {
        let _ = Table::unlink(&self.0);
    }
}

pub fn unique_name(tag: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "livereg-test-{tag}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

pub const SECOND: u64 = 1_000_000_000;

/// Options with a 1 s timeout and a 3 s grace.
pub fn options() -> TableOptions {
    TableOptions {
        capacity: 8,
        reap_timeout: Duration::from_secs(1),
        registration_grace: Duration::from_secs(3),
        ..TableOptions::default()
    }
}

/// Records every drop event a reaper's handler sees.
#[derive(Clone, Default)]
pub struct Recorder(pub Arc<Mutex<Vec<DropEvent>>>);

impl Recorder {
    pub fn events(&self) -> Vec<DropEvent> {
        self.0.lock().unwrap().clone()
    }

    pub fn reasons(&self) -> Vec<(u64, livereg::Reason)> {
        self.events()
            .iter()
            .map(|e| (e.instance_id, e.reason))
            .collect()
    }
}

/// A heap table on a manual clock at 100 s, with a recording reaper.
pub fn manual_setup(options: &TableOptions) -> (Table, ManualClock, Reaper, Recorder) {
    let manual = Clock::manual(100 * SECOND);
    let table = Table::in_memory(options)
        .unwrap()
        .with_clock(manual.clock());
    let recorder = Recorder::default();
    let sink = recorder.clone();
    let reaper = table
        .reaper()
        .on_drop(move |event| {
            sink.0.lock().unwrap().push(event.clone());
            Ok(())
        })
        .build()
        .unwrap();
    (table, manual, reaper, recorder)
}
