//! Registering: validation, unique ids, replacement, a full table, and stale
//! handles after their slot was reused.

mod common;

use common::{manual_setup, options, SECOND};
use livereg::{Error, Reason, Table, TableOptions, LABEL_MAX};
use std::time::Duration;

#[test]
fn instance_id_zero_is_refused() {
    let table = Table::in_memory(&options()).unwrap();
    match table.register(0, "w") {
        Err(Error::InvalidArgument(message)) => {
            assert!(message.contains("instance id 0"), "{message}")
        }
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

#[test]
fn label_of_47_bytes_is_kept_whole_and_48_is_refused() {
    let table = Table::in_memory(&options()).unwrap();
    let longest = "é".repeat(23) + "x"; // 47 bytes of UTF-8
    assert_eq!(longest.len(), LABEL_MAX);
    let worker = table.register(1, &longest).unwrap();
    assert_eq!(table.status().unwrap().registrations[0].label, longest);
    drop(worker);
    match table.register(2, &"é".repeat(24)) {
        Err(Error::InvalidArgument(message)) => {
            assert!(
                message.contains("48 bytes") && message.contains("at most 47"),
                "{message}"
            )
        }
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

#[test]
fn live_duplicate_id_is_refused_with_exists() {
    let table = Table::in_memory(&options()).unwrap();
    let _first = table.register(9, "a").unwrap();
    match table.register(9, "b") {
        Err(Error::Exists {
            message,
            registered,
        }) => {
            assert!(message.contains("instance 9"), "{message}");
            assert_eq!(registered, Some((9, std::process::id())), "{message}");
        }
        other => panic!("expected Exists, got {other:?}"),
    }
    assert_eq!(table.status().unwrap().tracked_instances, 1);
}

#[test]
fn full_table_is_refused_and_frees_up_after_a_deregistration() {
    let table = Table::in_memory(&TableOptions {
        capacity: 2,
        ..options()
    })
    .unwrap();
    let _a = table.register(1, "").unwrap();
    let b = table.register(2, "").unwrap();
    match table.register(3, "") {
        Err(Error::Full { message, capacity }) => {
            assert!(message.contains("all 2 slots"), "{message}");
            assert_eq!(capacity, Some(2));
        }
        other => panic!("expected Full, got {other:?}"),
    }
    // Deregistered, but its drop has not run: the slot is still taken.
    b.deregister().unwrap();
    assert!(matches!(table.register(3, ""), Err(Error::Full { .. })));
    let mut reaper = table.reaper().build().unwrap();
    reaper.scan().unwrap();
    table.register(3, "").unwrap();
}

#[test]
fn replace_ends_the_old_registration_first() {
    let table = Table::in_memory(&options()).unwrap();
    let recorder = common::Recorder::default();
    let reaper = table.reaper().on_drop(recorder.handler()).spawn().unwrap();
    let old = table.register(5, "old").unwrap();
    let new = table
        .registration(5)
        .label("new")
        .replace(true)
        .register()
        .unwrap();
    // The old registration's drop ran before the new one was published.
    assert_eq!(recorder.reasons(), vec![(5, Reason::Replaced)]);
    assert!(matches!(
        old.heartbeat(),
        Err(Error::Evicted { instance_id: 5, .. })
    ));
    new.heartbeat().unwrap();
    let status = table.status().unwrap();
    assert_eq!(status.tracked_instances, 1);
    assert_eq!(status.registrations[0].label, "new");
    reaper.stop().unwrap();
}

#[test]
fn stale_handle_after_slot_reuse_cannot_touch_the_new_owner() {
    let (table, clock, mut reaper, recorder) = manual_setup(&TableOptions {
        capacity: 1,
        ..options()
    });
    let stale = table.register(1, "old").unwrap();
    stale.heartbeat().unwrap();
    clock.advance(Duration::from_secs(1));
    reaper.scan_once(clock.now_ns()).unwrap();
    let owner = table.register(2, "new").unwrap();
    assert_eq!(
        owner.slot(),
        stale.slot(),
        "capacity 1: the slot was reused"
    );
    assert_ne!(owner.generation(), stale.generation());
    owner.heartbeat().unwrap();
    let before = table.status().unwrap().registrations[0].clone();

    clock.advance(Duration::from_millis(900));
    assert!(matches!(
        stale.heartbeat(),
        Err(Error::Evicted {
            instance_id: 1,
            reason: None
        })
    ));
    assert!(matches!(stale.deregister(), Err(Error::Evicted { .. })));

    let after = table.status().unwrap().registrations[0].clone();
    assert_eq!(
        (
            after.instance_id,
            after.heartbeats,
            after.last_heartbeat_age_seconds.unwrap()
        ),
        (2, before.heartbeats, 0.9),
        "the stale handle changed the new owner"
    );
    // The new owner's clock is untouched: it is still evicted on its own time.
    clock.advance(Duration::from_millis(100));
    reaper.scan_once(clock.now_ns()).unwrap();
    assert_eq!(
        recorder.reasons(),
        vec![(1, Reason::Timeout), (2, Reason::Timeout)]
    );
}

#[test]
fn dropping_a_worker_deregisters_it() {
    let (table, _clock, mut reaper, recorder) = manual_setup(&options());
    drop(table.register(3, "w").unwrap());
    reaper.scan().unwrap();
    assert_eq!(recorder.reasons(), vec![(3, Reason::Deregistered)]);
}

#[test]
fn deregister_after_eviction_reports_evicted_and_ends_nothing_else() {
    let (table, clock, mut reaper, recorder) = manual_setup(&options());
    let worker = table.register(4, "w").unwrap();
    clock.advance(Duration::from_secs(3));
    reaper.scan_once(clock.now_ns()).unwrap();
    assert!(matches!(
        worker.deregister(),
        Err(Error::Evicted { instance_id: 4, .. })
    ));
    reaper.scan_once(clock.now_ns() + SECOND).unwrap();
    assert_eq!(recorder.reasons(), vec![(4, Reason::Grace)]);
}

#[test]
fn concurrent_registrations_of_one_id_have_one_winner() {
    let table = Table::in_memory(&TableOptions {
        capacity: 64,
        ..options()
    })
    .unwrap();
    let rounds = if cfg!(miri) { 2 } else { 50 };
    let mut winners = Vec::new();
    for round in 1..=rounds {
        let barrier = std::sync::Barrier::new(4);
        let results: Vec<_> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..4)
                .map(|_| {
                    scope.spawn(|| {
                        barrier.wait();
                        table.register(round, "racer")
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let wins: Vec<bool> = results.iter().map(Result::is_ok).collect();
        // Winners stay registered while later rounds race.
        winners.extend(results.into_iter().flatten());
        assert_eq!(
            wins.iter().filter(|w| **w).count(),
            1,
            "round {round}: {wins:?}"
        );
    }
}

#[test]
fn a_label_with_nul_is_refused() {
    let table = Table::in_memory(&options()).unwrap();
    match table.register(1, "gpu\0x") {
        Err(Error::InvalidArgument(message)) => assert!(message.contains("NUL"), "{message}"),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

/// `wait` bounds the whole of `register()`: a registration lock another
/// process holds is waited for only as long, then `Busy` (and once the
/// lock is free, the same call shape registers).
#[test]
#[cfg_attr(miri, ignore)] // a shared table: Miri's isolation has no /dev/shm
fn the_wait_bounds_register_even_on_a_held_registration_lock() {
    let temp = common::TempTable::new("register-wait", &options());
    let register = || {
        temp.table
            .registration(3)
            .wait(Duration::from_millis(200))
            .register()
    };
    let held = common::hold_registration_lock(&temp.name);
    let started = std::time::Instant::now();
    let refused = register().unwrap_err();
    let took = started.elapsed();
    assert!(matches!(refused, Error::Busy { .. }), "{refused}");
    assert!(took >= Duration::from_millis(200), "{took:?}");
    assert!(
        took < Duration::from_secs(3),
        "not bounded by the wait: {took:?}"
    );
    drop(held);
    register().unwrap().deregister().unwrap();
}
