//! The reaper: handler isolation, exactly-once drops, clears, probe, one
//! reaper per table, and status.

mod common;

use common::{manual_setup, options, Recorder, TempTable};
use livereg::{Error, ReaperThread, Reason, Table, TableOptions};
use std::collections::HashSet;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

#[test]
fn panicking_and_failing_handlers_do_not_stop_the_others() {
    let table = Table::in_memory(&options()).unwrap();
    let recorder = Recorder::default();
    let mut reaper = table
        .reaper()
        .on_drop(|event| {
            if event.instance_id == 1 {
                panic!("handler bug")
            } else {
                Ok(())
            }
        })
        .on_drop(|_| Err("cannot free the buffer".into()))
        .on_drop(recorder.handler())
        .build()
        .unwrap();
    table.register(1, "a").unwrap().deregister().unwrap();
    table.register(2, "b").unwrap().deregister().unwrap();
    let report = reaper.scan().unwrap();
    assert_eq!(report.handler_failures, 3, "one panic and two errors");
    assert_eq!(
        recorder.reasons(),
        vec![(1, Reason::Deregistered), (2, Reason::Deregistered)]
    );
    let status = table.status().unwrap();
    assert_eq!(status.handler_failures, 3);
    assert_eq!(status.ended[&Reason::Deregistered], 2);
    assert!(
        status.registrations.is_empty(),
        "slots are freed despite the failures"
    );
}

#[test]
fn every_ended_registration_is_dropped_exactly_once() {
    let (table, clock, mut reaper, recorder) = manual_setup(&TableOptions {
        capacity: 16,
        ..options()
    });
    let mut expected = 0;
    let rounds = if cfg!(miri) { 3 } else { 20 };
    // Silent workers never beat nor deregister: kept here until the end.
    let mut silent = Vec::new();
    for round in 0..rounds {
        let keep = table.register(1000 + round, "beats").unwrap();
        let quit = table.register(2000 + round, "quits").unwrap();
        silent.push(table.register(3000 + round, "silent").unwrap());
        keep.heartbeat().unwrap();
        quit.deregister().unwrap();
        for _ in 0..8 {
            clock.advance(Duration::from_millis(250));
            reaper.scan_once(clock.now_ns()).unwrap();
            let _ = keep.heartbeat();
        }
        drop(keep);
        reaper.scan_once(clock.now_ns()).unwrap();
        expected += 3;
    }
    // The last silent registrations need their grace to pass.
    clock.advance(Duration::from_secs(3));
    reaper.scan_once(clock.now_ns()).unwrap();
    let events = recorder.events();
    assert_eq!(events.len(), expected);
    let unique: HashSet<(u32, u32)> = events.iter().map(|e| (e.slot, e.generation)).collect();
    assert_eq!(unique.len(), expected, "a registration was dropped twice");
    assert_eq!(table.status().unwrap().ended_total, expected as u64);
    assert!(table.status().unwrap().registrations.is_empty());
}

#[test]
fn handlers_run_outside_locks_and_before_the_slot_is_reused() {
    let table = Table::in_memory(&TableOptions {
        capacity: 1,
        ..options()
    })
    .unwrap();
    let seen = Arc::new(Mutex::new(None));
    let inside = seen.clone();
    let in_handler = table.clone();
    let mut reaper = table
        .reaper()
        .on_drop(move |_| {
            // Registering from a handler would deadlock if the scan held the
            // registration lock; the only slot is still held, so: Full.
            *inside.lock().unwrap() = Some(in_handler.register(2, "from handler").map(|_| ()));
            Ok(())
        })
        .build()
        .unwrap();
    table.register(1, "w").unwrap().deregister().unwrap();
    reaper.scan().unwrap();
    assert!(matches!(
        seen.lock().unwrap().take(),
        Some(Err(Error::Full { .. }))
    ));
    table.register(3, "after").unwrap();
}

/// A reaper on `table` counting its clears and recording its drops.
fn counting_reaper(table: &Table) -> (ReaperThread, Recorder, Arc<AtomicU32>) {
    let recorder = Recorder::default();
    let clears = Arc::new(AtomicU32::new(0));
    let counted = clears.clone();
    let reaper = table
        .reaper()
        .on_drop(recorder.handler())
        .on_clear(move || {
            counted.fetch_add(1, Ordering::SeqCst);
            Ok(())
        })
        .spawn()
        .unwrap();
    (reaper, recorder, clears)
}

#[test]
fn clear_runs_the_clear_handlers_once_and_leaves_every_registration() {
    let table = Table::in_memory(&options()).unwrap();
    let (reaper, recorder, clears) = counting_reaper(&table);
    let a = table.register(1, "a").unwrap();
    let b = table.register(2, "b").unwrap();
    a.heartbeat().unwrap();
    table.clear(Duration::from_secs(5)).unwrap();
    assert_eq!(clears.load(Ordering::SeqCst), 1);
    assert_eq!(recorder.reasons(), vec![], "a clear ends no registration");
    for worker in [&a, &b] {
        worker.heartbeat().unwrap();
    }
    let status = table.status().unwrap();
    assert_eq!((status.tracked_instances, status.ended_total), (2, 0));
    reaper.stop().unwrap();
}

#[test]
fn reset_ends_every_registration_then_runs_the_clear_handlers_once() {
    let table = Table::in_memory(&options()).unwrap();
    let (reaper, recorder, clears) = counting_reaper(&table);
    let a = table.register(1, "a").unwrap();
    let b = table.register(2, "b").unwrap();
    a.heartbeat().unwrap();
    table.reset(Duration::from_secs(5)).unwrap();
    assert_eq!(clears.load(Ordering::SeqCst), 1);
    let mut reasons = recorder.reasons();
    reasons.sort_by_key(|(id, _)| *id);
    assert_eq!(reasons, vec![(1, Reason::Cleared), (2, Reason::Cleared)]);
    for worker in [&a, &b] {
        assert!(matches!(
            worker.heartbeat(),
            Err(Error::Evicted {
                reason: Some(Reason::Cleared),
                ..
            })
        ));
    }
    let again = table.register(1, "a again").unwrap();
    again.heartbeat().unwrap();
    assert_eq!(table.status().unwrap().ended[&Reason::Cleared], 2);
    // A clear after the reset is a clear again.
    table.clear(Duration::from_secs(5)).unwrap();
    assert_eq!(clears.load(Ordering::SeqCst), 2);
    again.heartbeat().unwrap();
    reaper.stop().unwrap();
}

#[test]
fn a_reset_requested_to_a_reaper_that_died_expires_with_it() {
    let (table, clock, reaper, recorder) = manual_setup(&options());
    let _worker = table.register(1, "a").unwrap();
    std::thread::scope(|scope| {
        let request = scope.spawn(|| table.reset(Duration::from_secs(10)));
        while table.status().unwrap().clears_requested < 1 {
            std::thread::yield_now();
        }
        drop(reaper);
        assert!(matches!(request.join().unwrap(), Err(Error::NoReaper(_))));
    });
    // The next reaper does not act on the expired reset.
    let mut next = table.reaper().on_drop(recorder.handler()).build().unwrap();
    let report = next.scan_once(clock.now_ns()).unwrap();
    assert!(!report.reset && !report.cleared);
    assert_eq!(table.status().unwrap().tracked_instances, 1);
}

#[test]
fn concurrent_clear_requests_coalesce() {
    let (table, clock, recording_reaper, _recorder) = manual_setup(&options());
    drop(recording_reaper);
    let clears = Arc::new(AtomicU32::new(0));
    let counted = clears.clone();
    let mut reaper = table
        .reaper()
        .on_clear(move || {
            counted.fetch_add(1, Ordering::SeqCst);
            Ok(())
        })
        .build()
        .unwrap();
    reaper.scan_once(clock.now_ns()).unwrap();
    std::thread::scope(|scope| {
        let requests: Vec<_> = (0..3)
            .map(|_| scope.spawn(|| table.clear(Duration::from_secs(10))))
            .collect();
        while table.status().unwrap().clears_requested < 3 {
            std::thread::yield_now();
        }
        reaper.scan_once(clock.now_ns()).unwrap();
        for request in requests {
            request.join().unwrap().unwrap();
        }
    });
    assert_eq!(
        clears.load(Ordering::SeqCst),
        1,
        "three pending requests, one clear"
    );
}

#[test]
fn reset_with_an_unbounded_wait_completes() {
    let table = Table::in_memory(&options()).unwrap();
    let reaper = table.reaper().spawn().unwrap();
    let worker = table.register(1, "a").unwrap();
    table.reset(Duration::MAX).unwrap();
    assert!(worker.heartbeat().is_err());
    reaper.stop().unwrap();
}

#[test]
fn clear_and_probe_without_a_reaper_say_no_reaper() {
    let table = Table::in_memory(&options()).unwrap();
    assert!(matches!(
        table.clear(Duration::from_secs(1)),
        Err(Error::NoReaper(_))
    ));
    assert!(matches!(table.probe(), Err(Error::NoReaper(_))));
    assert_eq!(
        table.status().unwrap().clears_requested,
        0,
        "nothing was requested"
    );
}

#[test]
fn clear_times_out_when_the_reaper_does_not_scan() {
    let (table, _clock, _reaper, _recorder) = manual_setup(&options());
    match table.clear(Duration::from_millis(50)) {
        Err(Error::Timeout(message)) => assert!(message.contains("not completed"), "{message}"),
        other => panic!("expected Timeout, got {other:?}"),
    }
}

#[test]
fn probe_returns_a_boot_token_that_changes_when_a_reaper_restarts() {
    let (table, clock, reaper, _recorder) = manual_setup(&options());
    let first = table.probe().unwrap();
    assert_eq!(first, reaper.boot_token());
    drop(reaper);
    assert!(table.probe().is_err());
    let mut second = table.reaper().build().unwrap();
    second.scan_once(clock.now_ns()).unwrap();
    let token = table.probe().unwrap();
    assert_ne!(token, first);
    assert_ne!(token, 0);
}

#[test]
fn a_reaper_that_stops_scanning_is_alive_but_shows_as_stalled() {
    let (table, clock, mut reaper, _recorder) = manual_setup(&options());
    assert!(table.probe().is_ok());
    assert!(!table.status().unwrap().reaper_stalled);
    clock.advance(Duration::from_secs(10));
    // It still holds the reaper lock: alive, whatever the clocks say.
    assert!(table.probe().is_ok());
    assert!(table.status().unwrap().reaper_stalled);
    reaper.scan_once(clock.now_ns()).unwrap();
    assert!(!table.status().unwrap().reaper_stalled);
}

#[test]
fn second_reaper_is_refused_with_busy() {
    let (table, _clock, _reaper, _recorder) = manual_setup(&options());
    match table.reaper().build() {
        Err(Error::Busy { message, .. }) => {
            assert!(message.contains("another reaper"), "{message}")
        }
        other => panic!("expected Busy, got {:?}", other.map(|_| ())),
    }
}

#[test]
#[cfg_attr(miri, ignore = "needs /dev/shm and kernel locks")]
fn second_reaper_through_another_handle_in_this_process_is_refused() {
    let temp = TempTable::new("busy", &options());
    let _first = temp.table.reaper().build().unwrap();
    let other = Table::open(&temp.name).unwrap();
    assert!(matches!(other.reaper().build(), Err(Error::Busy { .. })));
    assert!(matches!(
        temp.table.reaper().build(),
        Err(Error::Busy { .. })
    ));
}

#[test]
fn status_has_the_reference_keys_and_more() {
    let (table, clock, mut reaper, _recorder) = manual_setup(&options());
    let worker = table.register(8, "gpu8").unwrap();
    worker.heartbeat().unwrap();
    clock.advance(Duration::from_millis(500));
    reaper.scan_once(clock.now_ns()).unwrap();
    let json = serde_json::to_value(table.status().unwrap()).unwrap();
    for key in [
        "enabled",
        "reap_timeout_seconds",
        "registration_grace_seconds",
        "tracked_instances",
        "capacity",
        "scan_interval_seconds",
        "reaper_alive",
        "boot_token",
        "ended",
        "handler_failures",
        "last_scan_seconds",
        "registrations",
    ] {
        assert!(json.get(key).is_some(), "missing {key} in {json}");
    }
    assert_eq!(json["enabled"], true);
    assert_eq!(json["reap_timeout_seconds"], 1.0);
    assert_eq!(json["registration_grace_seconds"], 3.0);
    assert_eq!(json["tracked_instances"], 1);
    assert_eq!(json["reaper_alive"], true);
    for reason in Reason::ALL {
        assert_eq!(json["ended"][reason.as_str()], 0);
    }
    let registration = &json["registrations"][0];
    assert_eq!(registration["instance_id"], 8);
    assert_eq!(registration["label"], "gpu8");
    assert_eq!(registration["pid"], std::process::id());
    assert_eq!(registration["heartbeats"], 1);
    assert_eq!(registration["last_heartbeat_age_seconds"], 0.5);
    assert_eq!(registration["state"], "live");
}

#[test]
#[cfg_attr(
    miri,
    ignore = "wall-clock deadlines: Miri's clock follows its interpreter"
)]
fn a_long_handler_delays_only_its_own_registration() {
    let table = Table::in_memory(&TableOptions {
        capacity: 4,
        reap_timeout: Duration::from_millis(100),
        registration_grace: Duration::from_millis(200),
        ..TableOptions::default()
    })
    .unwrap();
    let (release, released) = mpsc::channel::<()>();
    let released = Mutex::new(released);
    let (entered, handling) = mpsc::channel();
    let reaper = table
        .reaper()
        .handler_deadline(Duration::from_millis(500))
        .on_drop(move |event| {
            entered.send(event.instance_id)?;
            if event.instance_id == 1 {
                let released = released.lock().unwrap();
                released.recv_timeout(Duration::from_secs(20))?;
            }
            Ok(())
        })
        .spawn()
        .unwrap();
    let silent = table.register(2, "silent").unwrap();
    silent.heartbeat().unwrap();
    table.register(1, "old").unwrap().deregister().unwrap();
    assert_eq!(handling.recv_timeout(Duration::from_secs(5)).unwrap(), 1);
    let scans = table.status().unwrap().scans;
    // Longer than two scan intervals plus a second, and than the deadline.
    std::thread::sleep(Duration::from_millis(1200));
    let status = table.status().unwrap();
    assert!(table.probe().is_ok(), "a live reaper looked dead");
    assert!(
        status.scans > scans + 4,
        "scans stopped while a handler ran"
    );
    assert!(!status.reaper_stalled);
    assert_eq!(status.handlers_overdue, 1, "counted once, while it runs");
    // Another registration was evicted on time all the same, and its drop
    // ran beside the stuck one.
    assert!(matches!(
        silent.heartbeat(),
        Err(Error::Evicted {
            reason: Some(Reason::Timeout),
            ..
        })
    ));
    assert_eq!(handling.recv_timeout(Duration::from_secs(1)).unwrap(), 2);
    assert_eq!(status.ended[&Reason::Timeout], 1, "its slot was freed");
    // The id of the registration whose drop still runs does not come back.
    match table
        .registration(1)
        .wait(Duration::from_millis(100))
        .register()
    {
        Err(Error::Busy { message, .. }) => assert!(
            message.contains("drop is pending") && message.contains("not finished"),
            "{message}"
        ),
        other => panic!("expected Busy while the old drop runs, got {other:?}"),
    }
    // Once the drop returns, the id registers (the wait sees the release).
    release.send(()).unwrap();
    let again = table.register(1, "new").unwrap();
    again.deregister().unwrap();
    release.send(()).unwrap();
    reaper.stop().unwrap();
}

#[test]
fn a_handler_that_stops_its_own_reaper_gets_busy_and_the_reaper_stops_after() {
    let table = Table::in_memory(&options()).unwrap();
    let (sender, outcome) = mpsc::channel();
    let reaper = Arc::new(Mutex::new(None::<livereg::ReaperThread>));
    let inside = reaper.clone();
    *reaper.lock().unwrap() = Some(
        table
            .reaper()
            .on_drop(move |_| {
                let mine = inside.lock().unwrap().take();
                let stopped = mine.map(|reaper| reaper.stop());
                sender.send(stopped.map(|result| result.err()))?;
                Ok(())
            })
            .spawn()
            .unwrap(),
    );
    table.register(1, "a").unwrap().deregister().unwrap();
    let stopped = outcome.recv_timeout(Duration::from_secs(5)).unwrap();
    assert!(
        matches!(&stopped, Some(Some(Error::Busy { message: m, .. })) if m.contains("stop the reaper")),
        "{stopped:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while table.probe().is_ok() {
        assert!(Instant::now() < deadline, "the reaper never stopped");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn an_id_ended_under_a_reaper_that_died_waits_for_the_next_reapers_drop() {
    let (table, clock, reaper, recorder) = manual_setup(&options());
    table.register(1, "a").unwrap().deregister().unwrap();
    drop(reaper); // gone before it ran the drop
    match table
        .registration(1)
        .wait(Duration::from_millis(50))
        .register()
    {
        Err(Error::Busy { message, .. }) => {
            assert!(message.contains("no reaper is alive"), "{message}")
        }
        other => panic!("expected Busy, got {other:?}"),
    }
    let mut next = table.reaper().on_drop(recorder.handler()).build().unwrap();
    next.scan_once(clock.now_ns()).unwrap();
    assert_eq!(recorder.reasons(), vec![(1, Reason::Deregistered)]);
    table.register(1, "a").unwrap();
}

#[test]
fn handlers_that_would_wait_on_their_own_reaper_fail_at_once() {
    let table = Table::in_memory(&options()).unwrap();
    let inside = table.clone();
    let (sender, seen) = mpsc::channel();
    let mut reaper = table
        .reaper()
        .on_drop(move |event| {
            let started = Instant::now();
            let clear = inside.clear(Duration::from_secs(5));
            let register = inside.register(event.instance_id, "again");
            sender.send((clear.err(), register.err(), started.elapsed()))?;
            Ok(())
        })
        .build()
        .unwrap();
    table.register(1, "a").unwrap().deregister().unwrap();
    reaper.scan().unwrap();
    let (clear, register, took) = seen.recv().unwrap();
    assert!(
        matches!(&clear, Some(Error::Busy { message: m, .. }) if m.contains("inside a handler")),
        "{clear:?}"
    );
    assert!(
        matches!(&register, Some(Error::Busy { message: m, pending_drop: Some(1) }) if m.contains("handler of the reaper")),
        "{register:?}"
    );
    assert!(took < Duration::from_secs(1), "took {took:?}");
}

#[test]
fn a_clear_whose_reaper_dies_says_no_reaper_and_expires() {
    let (table, clock, reaper, recorder) = manual_setup(&options());
    let requester = table.clone();
    let waiting = std::thread::spawn(move || {
        let started = Instant::now();
        (requester.clear(Duration::from_secs(10)), started.elapsed())
    });
    while table.status().unwrap().clears_requested == 0 {
        std::thread::sleep(Duration::from_millis(1));
    }
    drop(reaper); // dies without scanning
    let (result, took) = waiting.join().unwrap();
    assert!(matches!(result, Err(Error::NoReaper(_))), "{result:?}");
    assert!(took < Duration::from_secs(5), "took {took:?}");
    // A later reaper does not carry out the stale request.
    let worker = table.register(1, "after").unwrap();
    let mut next = table.reaper().on_drop(recorder.handler()).build().unwrap();
    next.scan_once(clock.now_ns()).unwrap();
    assert!(recorder.events().is_empty(), "{:?}", recorder.events());
    worker.heartbeat().unwrap();
}
