//! The two silence budgets, at their exact edges, on an injected clock.

mod common;

use common::{manual_setup, options, SECOND};
use livereg::{Error, Reason, Table, TableOptions};
use std::time::Duration;

/// The table's own budgets, in nanoseconds: (reap timeout, registration grace).
fn budgets(table: &Table) -> (u64, u64) {
    let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap();
    (ns(table.reap_timeout()), ns(table.registration_grace()))
}

#[test]
fn beaten_worker_is_kept_one_nanosecond_before_the_timeout() {
    let (table, clock, mut reaper, recorder) = manual_setup(&options());
    let (timeout, _) = budgets(&table);
    let worker = table.register(1, "w").unwrap();
    worker.heartbeat().unwrap();
    let beat_at = clock.now_ns();
    reaper.scan_once(beat_at + timeout - 1).unwrap();
    assert!(recorder.events().is_empty());
    clock.set(beat_at + timeout - 1);
    worker.heartbeat().unwrap();
}

#[test]
fn beaten_worker_is_evicted_at_the_timeout_on_the_next_scan() {
    let (table, clock, mut reaper, recorder) = manual_setup(&options());
    let (timeout, _) = budgets(&table);
    let worker = table.register(1, "w").unwrap();
    worker.heartbeat().unwrap();
    let beat_at = clock.now_ns();
    reaper.scan_once(beat_at + timeout - 1).unwrap();
    reaper.scan_once(beat_at + timeout).unwrap();
    assert_eq!(recorder.reasons(), vec![(1, Reason::Timeout)]);
    let event = &recorder.events()[0];
    assert_eq!(event.silent_for, table.reap_timeout());
    assert_eq!(event.last_heartbeat_ns, Some(beat_at));
}

#[test]
fn never_beaten_worker_is_judged_by_the_grace_not_the_timeout() {
    let (table, clock, mut reaper, recorder) = manual_setup(&options());
    let (timeout, grace) = budgets(&table);
    assert!(grace > timeout);
    let _worker = table.register(2, "w").unwrap();
    let registered_at = clock.now_ns();
    reaper.scan_once(registered_at + timeout).unwrap();
    reaper.scan_once(registered_at + grace - 1).unwrap();
    assert!(
        recorder.events().is_empty(),
        "evicted before the grace: {:?}",
        recorder.events()
    );
    reaper.scan_once(registered_at + grace).unwrap();
    assert_eq!(recorder.reasons(), vec![(2, Reason::Grace)]);
    assert_eq!(recorder.events()[0].last_heartbeat_ns, None);
}

#[test]
fn heartbeat_after_eviction_reports_evicted() {
    let (table, clock, mut reaper, _recorder) = manual_setup(&options());
    let worker = table.register(3, "w").unwrap();
    worker.heartbeat().unwrap();
    clock.advance(table.reap_timeout());
    reaper.scan_once(clock.now_ns()).unwrap();
    // The slot was released in the scan that evicted it; the worker still
    // hears why.
    match worker.heartbeat() {
        Err(Error::Evicted {
            instance_id: 3,
            reason,
        }) => assert_eq!(reason, Some(Reason::Timeout)),
        other => panic!("expected Evicted, got {other:?}"),
    }
}

#[test]
fn evicted_worker_can_register_again() {
    let (table, clock, mut reaper, _recorder) = manual_setup(&options());
    let worker = table.register(4, "w").unwrap();
    clock.advance(table.registration_grace());
    reaper.scan_once(clock.now_ns()).unwrap();
    assert!(worker.heartbeat().is_err());
    let again = table.register(4, "w").unwrap();
    again.heartbeat().unwrap();
    assert_eq!(table.status().unwrap().tracked_instances, 1);
}

#[test]
fn zero_timeout_disables_reaping() {
    let options = TableOptions {
        reap_timeout: Duration::ZERO,
        ..options()
    };
    let (table, clock, mut reaper, recorder) = manual_setup(&options);
    let worker = table.register(5, "w").unwrap();
    worker.heartbeat().unwrap();
    clock.advance(Duration::from_secs(3600));
    reaper.scan_once(clock.now_ns()).unwrap();
    assert!(recorder.events().is_empty());
    worker.heartbeat().unwrap();
    let thread = table.reaper().spawn().unwrap();
    assert!(!thread.is_running(), "no thread runs with reaping disabled");
    assert!(!table.status().unwrap().enabled);
}

#[test]
fn grace_shorter_than_timeout_is_refused() {
    let options = TableOptions {
        reap_timeout: Duration::from_secs(5),
        registration_grace: Duration::from_secs(4),
        ..TableOptions::default()
    };
    match Table::in_memory(&options) {
        Err(Error::InvalidArgument(message)) => {
            assert!(
                message.contains("grace") && message.contains(">= timeout"),
                "{message}"
            );
        }
        other => panic!("expected InvalidArgument, got {:?}", other.map(|_| ())),
    }
}

#[test]
fn a_heartbeat_just_before_the_edge_restarts_the_timeout() {
    // A scan one nanosecond before the edge keeps the worker; a heartbeat
    // then lands; the next scan, past the old edge, must judge the new word
    // and keep the worker. (The CAS race itself is in protocol's unit tests
    // and the loom models.)
    let (table, clock, mut reaper, recorder) = manual_setup(&options());
    let worker = table.register(6, "w").unwrap();
    worker.heartbeat().unwrap();
    clock.advance(table.reap_timeout() - Duration::from_nanos(1));
    reaper.scan_once(clock.now_ns()).unwrap();
    worker.heartbeat().unwrap();
    reaper.scan_once(clock.now_ns() + 1).unwrap();
    assert!(recorder.events().is_empty());
    worker.heartbeat().unwrap();
}

#[test]
fn stamps_from_another_clock_do_not_evict_a_beating_worker() {
    // A worker in another time namespace stamps from a clock far behind the
    // reaper's: it is judged by when its beats change, so it stays while it
    // beats and goes once it stops. (It registers after the reaper's first
    // scan, as workers of a running server do.)
    let (table, clock, mut reaper, recorder) = manual_setup(&options());
    reaper.scan_once(clock.now_ns()).unwrap();
    let foreign = livereg::Clock::manual(5 * SECOND);
    let worker = table.with_clock(foreign.clock()).register(7, "w").unwrap();
    for _ in 0..10 {
        foreign.advance(Duration::from_millis(250));
        worker.heartbeat().unwrap();
        clock.advance(Duration::from_millis(250));
        reaper.scan_once(clock.now_ns()).unwrap();
    }
    assert!(recorder.events().is_empty(), "{:?}", recorder.events());
    // Silent now: gone once the timeout has passed since its last change.
    clock.advance(2 * table.reap_timeout());
    reaper.scan_once(clock.now_ns()).unwrap();
    assert_eq!(recorder.reasons(), vec![(7, Reason::Timeout)]);
}
