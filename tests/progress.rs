//! Progress beside liveness, on an injected clock: a busy worker
//! that makes no progress ends `Stalled`; an idle one, or one that only
//! beats, never does.

mod common;

use common::{Recorder, SECOND};
use livereg::{Clock, Error, ManualClock, Reaper, Reason, Table, TableOptions, Worker};
use std::time::Duration;

/// Timeout 1 s (scans every 250 ms), grace 3 s, progress timeout 2 s.
fn options() -> TableOptions {
    TableOptions {
        capacity: 8,
        reap_timeout: Duration::from_secs(1),
        registration_grace: Duration::from_secs(3),
        progress_timeout: Duration::from_secs(2),
        ..TableOptions::default()
    }
}

fn setup() -> (Table, ManualClock, Reaper, Recorder) {
    let manual = Clock::manual(100 * SECOND);
    let table = Table::in_memory(&options())
        .unwrap()
        .with_clock(manual.clock());
    let recorder = Recorder::default();
    let reaper = table.reaper().on_drop(recorder.handler()).build().unwrap();
    (table, manual, reaper, recorder)
}

/// Advances in scan intervals for `for_ns`, beating (so liveness holds) and
/// calling `each` before every scan.
fn run(
    clock: &ManualClock,
    reaper: &mut Reaper,
    worker: &Worker,
    for_ns: u64,
    mut each: impl FnMut(),
) {
    let until = clock.now_ns() + for_ns;
    while clock.now_ns() < until {
        clock.advance(Duration::from_millis(250));
        let _ = worker.heartbeat();
        each();
        reaper.scan_once(clock.now_ns()).unwrap();
    }
}

#[test]
fn a_busy_worker_making_steady_progress_is_never_ended() {
    let (table, clock, mut reaper, recorder) = setup();
    let worker = table.register(1, "engine").unwrap();
    worker.set_busy(true).unwrap();
    run(&clock, &mut reaper, &worker, 20 * SECOND, || {
        worker.progress().unwrap()
    });
    assert!(recorder.events().is_empty(), "{:?}", recorder.events());
    let status = table.status().unwrap();
    assert!(status.registrations[0].busy);
    assert_eq!(status.registrations[0].progress_steps, 80);
}

#[test]
fn an_idle_worker_never_stalls_and_heartbeats_alone_never_stall() {
    let (table, clock, mut reaper, recorder) = setup();
    let idle = table.register(1, "idle").unwrap();
    let beating = table.register(2, "never says busy").unwrap();
    idle.set_busy(true).unwrap();
    idle.set_busy(false).unwrap();
    run(&clock, &mut reaper, &idle, 30 * SECOND, || {
        beating.heartbeat().unwrap()
    });
    assert!(recorder.events().is_empty(), "{:?}", recorder.events());
}

#[test]
fn a_busy_worker_without_progress_ends_stalled_within_its_bound() {
    let (table, clock, mut reaper, recorder) = setup();
    let worker = table.register(1, "stuck").unwrap();
    reaper.scan_once(clock.now_ns()).unwrap();
    worker.set_busy(true).unwrap();
    let busy_at = clock.now_ns();
    let interval = Duration::from_millis(250);
    let ended_after = loop {
        clock.advance(interval);
        let _ = worker.heartbeat();
        reaper.scan_once(clock.now_ns()).unwrap();
        if !recorder.events().is_empty() {
            break Duration::from_nanos(clock.now_ns() - busy_at);
        }
        assert!(clock.now_ns() - busy_at < 10 * SECOND, "never ended");
    };
    assert_eq!(recorder.reasons(), vec![(1, Reason::Stalled)]);
    let progress_timeout = Duration::from_secs(2);
    assert!(
        ended_after >= progress_timeout && ended_after <= progress_timeout + 2 * interval,
        "ended {ended_after:?} after going busy"
    );
    assert!(recorder.events()[0].silent_for >= progress_timeout);
    match worker.progress() {
        Err(Error::Evicted { reason, .. }) => assert_eq!(reason, Some(Reason::Stalled)),
        other => panic!("expected Evicted, got {other:?}"),
    }
    assert!(worker.heartbeat().is_err());
    assert_eq!(table.status().unwrap().ended[&Reason::Stalled], 1);
}

#[test]
fn becoming_busy_after_a_long_idle_time_is_not_ended_at_once() {
    let (table, clock, mut reaper, recorder) = setup();
    let worker = table.register(1, "waits").unwrap();
    run(&clock, &mut reaper, &worker, 60 * SECOND, || {});
    worker.set_busy(true).unwrap();
    run(&clock, &mut reaper, &worker, SECOND + SECOND / 2, || {});
    assert!(recorder.events().is_empty(), "{:?}", recorder.events());
    // An operator sees it slowing down before it is declared stalled.
    let seen = table.status().unwrap().registrations[0].clone();
    assert!(seen.busy);
    let quiet = seen.last_progress_age_seconds.expect("the reaper saw it");
    assert!((1.25..=1.5).contains(&quiet), "{quiet}");
    run(&clock, &mut reaper, &worker, SECOND, || {});
    assert_eq!(recorder.reasons(), vec![(1, Reason::Stalled)]);
}

#[test]
fn a_progress_timeout_below_one_scan_interval_is_refused() {
    for (timeout, progress) in [(1_000, 100), (0, 500)] {
        let options = TableOptions {
            reap_timeout: Duration::from_millis(timeout),
            registration_grace: Duration::from_secs(3),
            progress_timeout: Duration::from_millis(progress),
            ..TableOptions::default()
        };
        match Table::in_memory(&options) {
            Err(Error::InvalidArgument(message)) => {
                assert!(message.contains("progress timeout"), "{message}")
            }
            other => panic!("expected InvalidArgument, got {:?}", other.map(|_| ())),
        }
    }
}

#[test]
fn a_busy_period_is_timed_from_its_own_start_even_if_idle_and_busy_fell_between_two_scans() {
    let (table, clock, mut reaper, recorder) = setup();
    let worker = table.register(1, "engine").unwrap();
    worker.set_busy(true).unwrap();
    reaper.scan_once(clock.now_ns()).unwrap(); // sees it busy at 0
    clock.advance(Duration::from_millis(1800));
    worker.heartbeat().unwrap();
    worker.set_busy(false).unwrap(); // idle at 1.8 s,
    clock.advance(Duration::from_millis(100));
    worker.set_busy(true).unwrap(); // busy again at 1.9 s, no scan between
    clock.advance(Duration::from_millis(300));
    worker.heartbeat().unwrap();
    reaper.scan_once(clock.now_ns()).unwrap(); // 2.2 s: busy for 0.3 s only
    assert!(
        recorder.events().is_empty(),
        "stalled early: {:?}",
        recorder.events()
    );
    // It stalls a whole progress timeout after the reaper saw the change.
    run(&clock, &mut reaper, &worker, 2 * SECOND, || {});
    let reasons: Vec<Reason> = recorder.events().iter().map(|e| e.reason).collect();
    assert_eq!(reasons, vec![Reason::Stalled]);
    assert!(recorder.events()[0].silent_for >= Duration::from_secs(2));
}
