//! The reaper's own absence, on an injected clock: a scan due long ago (the
//! reaper was stopped, starved, its host frozen) counts no silence from
//! before it; every live registration has the timeout from the return, a
//! busy one its progress timeout.

mod common;

use common::{Recorder, SECOND};
use livereg::{Clock, ManualClock, Reaper, Reason, Table, TableOptions};
use std::time::Duration;

/// Timeout 1 s (scans every 250 ms, an absence past 500 ms), grace 3 s,
/// progress timeout 2 s.
fn setup() -> (Table, ManualClock, Reaper, Recorder) {
    let options = TableOptions {
        capacity: 8,
        reap_timeout: Duration::from_secs(1),
        registration_grace: Duration::from_secs(3),
        progress_timeout: Duration::from_secs(2),
        ..TableOptions::default()
    };
    let manual = Clock::manual(100 * SECOND);
    let table = Table::in_memory(&options)
        .unwrap()
        .with_clock(manual.clock());
    let recorder = Recorder::default();
    let reaper = table.reaper().on_drop(recorder.handler()).build().unwrap();
    (table, manual, reaper, recorder)
}

#[test]
fn after_an_absence_every_registration_has_the_timeout_from_the_return() {
    let (table, clock, mut reaper, recorder) = setup();
    let beaten = table.register(1, "beaten").unwrap();
    beaten.heartbeat().unwrap();
    let _never = table.register(2, "never beaten").unwrap();
    reaper.scan().unwrap();

    clock.advance(Duration::from_secs(30)); // frozen with its registrants
    let returned = clock.now_ns();
    reaper.scan().unwrap();
    assert!(recorder.events().is_empty(), "{:?}", recorder.reasons());

    // Scans every 250 ms from the return (no second absence).
    for _ in 0..3 {
        clock.advance(Duration::from_millis(250));
        reaper.scan().unwrap();
    }
    assert!(recorder.events().is_empty(), "{:?}", recorder.reasons());
    clock.advance(Duration::from_millis(250));
    assert_eq!(clock.now_ns(), returned + SECOND);
    reaper.scan().unwrap();
    assert_eq!(recorder.reasons(), vec![(1, Reason::Timeout)]);
    while clock.now_ns() < returned + 3 * SECOND {
        clock.advance(Duration::from_millis(250));
        reaper.scan().unwrap();
    }
    assert_eq!(
        recorder.reasons(),
        vec![(1, Reason::Timeout), (2, Reason::Grace)]
    );
}

#[test]
fn a_registrant_beating_after_the_return_is_kept() {
    let (table, clock, mut reaper, recorder) = setup();
    let worker = table.register(1, "w").unwrap();
    worker.heartbeat().unwrap();
    reaper.scan().unwrap();
    clock.advance(Duration::from_secs(3));
    reaper.scan().unwrap(); // the reaper is scheduled first
    clock.advance(Duration::from_millis(900));
    worker.heartbeat().unwrap(); // the worker 0.9 s later
    for _ in 0..8 {
        clock.advance(Duration::from_millis(250));
        worker.heartbeat().unwrap();
        reaper.scan().unwrap();
    }
    assert!(recorder.events().is_empty(), "{:?}", recorder.reasons());
}

#[test]
fn after_an_absence_a_busy_registration_has_its_progress_timeout_from_the_return() {
    let (table, clock, mut reaper, recorder) = setup();
    let worker = table.register(1, "busy").unwrap();
    worker.set_busy(true).unwrap();
    reaper.scan().unwrap();
    clock.advance(Duration::from_secs(10));
    let returned = clock.now_ns();
    worker.heartbeat().unwrap();
    reaper.scan().unwrap();
    assert!(recorder.events().is_empty(), "{:?}", recorder.reasons());
    while clock.now_ns() < returned + 2 * SECOND - 250_000_000 {
        clock.advance(Duration::from_millis(250));
        worker.heartbeat().unwrap();
        reaper.scan().unwrap();
    }
    assert!(
        recorder.events().is_empty(),
        "stalled before its progress timeout from the return"
    );
    clock.set(returned + 2 * SECOND);
    worker.heartbeat().unwrap();
    reaper.scan().unwrap();
    assert_eq!(recorder.reasons(), vec![(1, Reason::Stalled)]);
}

#[test]
fn scans_at_times_the_caller_gives_judge_as_told() {
    let (table, clock, mut reaper, recorder) = setup();
    let worker = table.register(1, "w").unwrap();
    worker.heartbeat().unwrap();
    let beat_at = clock.now_ns();
    reaper.scan_once(beat_at).unwrap();
    reaper.scan_once(beat_at + 5 * SECOND).unwrap();
    assert_eq!(recorder.reasons(), vec![(1, Reason::Timeout)]);
}
