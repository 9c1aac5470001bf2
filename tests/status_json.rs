//! `status --json` is a contract with dashboards: the same table gives the
//! same bytes. A fixture table on a manual clock (every time, pid and count
//! fixed but the pid, the boot token and the measured scan time, which are
//! masked) is compared with the JSON committed in `tests/fixtures/status.json`.
//! Regenerate it only for a deliberate format change (and say so in the
//! changelog): `LIVEREG_WRITE_FIXTURE=1 cargo test --test status_json`.

use livereg::{Clock, StampClock, Table, TableOptions};
use std::time::Duration;

fn fixture_table() -> (Table, livereg::ManualClock) {
    let manual = Clock::manual(1_000_000_000);
    let options = TableOptions {
        capacity: 6,
        reap_timeout: Duration::from_secs(2),
        registration_grace: Duration::from_secs(4),
        progress_timeout: Duration::from_secs(1),
        // Fixed, not `Auto`: the coarse clock's resolution is the machine's.
        stamp_clock: StampClock::Precise,
        ..TableOptions::default()
    };
    let table = Table::in_memory(&options)
        .unwrap()
        .with_clock(manual.clock());
    (table, manual)
}

fn status_json() -> String {
    let (table, manual) = fixture_table();
    let mut reaper = table.reaper().build().unwrap();
    let beating = table
        .registration(1)
        .label("gpu0")
        .pid(101)
        .register()
        .unwrap();
    let silent = table
        .registration(2)
        .label("gpu1")
        .pid(102)
        .register()
        .unwrap();
    let busy = table
        .registration(3)
        .label("busy")
        .pid(103)
        .register()
        .unwrap();
    let never = table.registration(4).pid(104).register().unwrap();
    let leaving = table
        .registration(5)
        .label("leaving")
        .pid(105)
        .register()
        .unwrap();
    silent.heartbeat().unwrap();
    busy.set_busy(true).unwrap();
    for _ in 0..3 {
        busy.progress().unwrap();
    }
    manual.advance(Duration::from_millis(500));
    reaper.scan_once(manual.now_ns()).unwrap();
    manual.advance(Duration::from_millis(2_000));
    beating.heartbeat().unwrap();
    busy.heartbeat().unwrap();
    busy.progress().unwrap();
    // `silent` has been quiet for 2 s: this scan ends it.
    let report = reaper.scan_once(manual.now_ns()).unwrap();
    assert_eq!(report.ended.len(), 1);
    // A deregistration not yet scanned: listed as `ending`.
    leaving.deregister().unwrap();
    manual.advance(Duration::from_millis(250));
    let json = serde_json::to_string_pretty(&table.status().unwrap()).unwrap();
    drop((beating, busy, never, reaper));
    // The values no clock fixes: this process's pid, the reaper's boot token
    // (random by design), and how long the last scan really took.
    json.lines()
        .map(|line| match line.split_once(": ") {
            Some(("  \"reaper_pid\"", _)) => "  \"reaper_pid\": 0,".to_owned(),
            Some(("  \"boot_token\"", _)) => "  \"boot_token\": 0,".to_owned(),
            Some(("  \"last_scan_seconds\"", _)) => "  \"last_scan_seconds\": 0.0,".to_owned(),
            _ => line.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn status_json_is_byte_identical_for_the_fixture_table() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/status.json");
    let json = status_json();
    if std::env::var_os("LIVEREG_WRITE_FIXTURE").is_some() {
        std::fs::write(path, &json).unwrap();
    }
    let expected = std::fs::read_to_string(path).unwrap();
    assert_eq!(json, expected, "status JSON changed for the fixture table");
}
