//! Heartbeats stamped with the coarse clock (docs/semantics.md, "Time"): a stamp lags
//! its heartbeat, so the reaper adds `STAMP_LAG_TICKS` resolutions before
//! judging; a registration is never evicted before `reap_timeout` of real
//! silence, and at most `scan_interval + STAMP_LAG_TICKS × resolution` after.

mod common;

use common::{Recorder, TempTable, SECOND};
use livereg::{
    coarse_resolution_ns, monotonic_coarse_ns, monotonic_ns, Clock, Error, Reason, StampClock,
    Table, TableOptions, MIN_TIMEOUT_TICKS, STAMP_LAG_TICKS,
};
use std::time::{Duration, Instant};

/// A timeout the coarse clock may stamp for: at least 1 s, and at least
/// `MIN_TIMEOUT_TICKS` of this machine's ticks.
fn coarse_timeout() -> Duration {
    Duration::from_secs(1).max(Duration::from_nanos(
        coarse_resolution_ns() * u64::from(MIN_TIMEOUT_TICKS),
    ))
}

fn coarse_options(capacity: u32) -> TableOptions {
    TableOptions {
        capacity,
        reap_timeout: coarse_timeout(),
        registration_grace: coarse_timeout() * 2,
        stamp_clock: StampClock::Coarse,
        ..TableOptions::default()
    }
}

/// A small deterministic generator, seeded from the time (printed, so a
/// failure can be replayed with `LIVEREG_TEST_SEED`).
struct Rng(u64);

impl Rng {
    fn seeded() -> Rng {
        let seed = std::env::var("LIVEREG_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| monotonic_ns() | 1);
        eprintln!("LIVEREG_TEST_SEED={seed}");
        Rng(seed)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

#[test]
fn an_injected_coarse_clock_is_never_early_and_at_most_the_allowance_late() {
    let base = Table::in_memory(&coarse_options(512)).unwrap();
    assert_eq!(base.stamp_clock(), StampClock::Coarse);
    let resolution = u64::try_from(base.stamp_resolution().as_nanos()).unwrap();
    let timeout = u64::try_from(base.reap_timeout().as_nanos()).unwrap();
    let interval = timeout / 4;
    let allowance = resolution * u64::from(STAMP_LAG_TICKS);
    let manual = Clock::manual(100 * SECOND);
    // Workers stamp at the start of the current tick, lagging the time by
    // up to a resolution; the reaper reads the exact time.
    let workers = base.with_clock(manual.ticking_clock());
    let recorder = Recorder::default();
    let mut reaper = base
        .with_clock(manual.clock())
        .reaper()
        .on_drop(recorder.handler())
        .build()
        .unwrap();
    let mut rng = Rng::seeded();
    for id in 1..=200u64 {
        manual.advance(Duration::from_nanos(rng.below(3 * resolution)));
        let worker = workers.register(id, "w").unwrap();
        worker.heartbeat().unwrap();
        let beat_at = manual.now_ns();
        // The exact edge: the stamp (the tick's start, in whole microseconds
        // as a beat word holds it) plus the allowance, plus the timeout.
        let tick = beat_at - beat_at % resolution;
        let edge = tick.div_ceil(1_000) * 1_000 + allowance + timeout;
        assert!(edge >= beat_at + timeout, "edge {edge} before the timeout");
        assert!(edge <= beat_at + timeout + allowance);
        reaper.scan_once(edge - 1).unwrap();
        assert!(
            recorder.events().iter().all(|e| e.instance_id != id),
            "evicted one nanosecond before the edge (beat at {beat_at}, resolution {resolution})"
        );
        reaper.scan_once(edge).unwrap();
        let ended: Vec<_> = recorder
            .events()
            .into_iter()
            .filter(|e| e.instance_id == id)
            .collect();
        assert_eq!(ended.len(), 1, "not evicted at the edge");
        assert_eq!(ended[0].reason, Reason::Timeout);
        assert!(ended[0].silent_for <= Duration::from_nanos(timeout + allowance));
        manual.set(edge);

        // The same beat judged by scans every interval from a random phase:
        // evicted within [timeout, timeout + interval + allowance].
        let worker = workers.register(1_000 + id, "w").unwrap();
        worker.heartbeat().unwrap();
        let beat_at = manual.now_ns();
        let mut at = beat_at + rng.below(interval);
        let evicted_at = loop {
            reaper.scan_once(at).unwrap();
            if recorder
                .events()
                .iter()
                .any(|e| e.instance_id == 1_000 + id)
            {
                break at;
            }
            assert!(at < beat_at + 2 * timeout, "never evicted");
            at += interval;
        };
        assert!(evicted_at >= beat_at + timeout, "evicted early");
        assert!(
            evicted_at <= beat_at + timeout + interval + allowance,
            "evicted {} ns after the timeout, past the bound",
            evicted_at - beat_at - timeout
        );
        manual.set(evicted_at);
    }
}

#[test]
fn a_manual_clock_that_does_not_tick_stamps_exactly_on_a_coarse_table() {
    // A registrant whose stamps do not lag says so, and is judged exactly.
    let manual = Clock::manual(100 * SECOND);
    let table = Table::in_memory(&coarse_options(4))
        .unwrap()
        .with_clock(manual.clock());
    let recorder = Recorder::default();
    let mut reaper = table.reaper().on_drop(recorder.handler()).build().unwrap();
    let timeout = u64::try_from(table.reap_timeout().as_nanos()).unwrap();
    let worker = table.register(1, "w").unwrap();
    manual.advance(Duration::from_micros(123)); // (beat words hold microseconds)
    worker.heartbeat().unwrap();
    let beat_at = manual.now_ns();
    reaper.scan_once(beat_at + timeout - 1).unwrap();
    assert!(recorder.events().is_empty());
    reaper.scan_once(beat_at + timeout).unwrap();
    assert_eq!(recorder.reasons(), vec![(1, Reason::Timeout)]);
}

#[test]
fn the_real_coarse_clock_lags_by_less_than_the_allowance_at_many_phases() {
    // What the allowance stands on: a coarse reading taken after a precise
    // one is never more than STAMP_LAG_TICKS resolutions behind it.
    let resolution = coarse_resolution_ns();
    assert!(resolution > 0, "no coarse clock resolution");
    let allowance = resolution * u64::from(STAMP_LAG_TICKS);
    let mut rng = Rng::seeded();
    let mut worst = 0;
    for _ in 0..4_000 {
        let spin_until = monotonic_ns() + rng.below(resolution / 4);
        while monotonic_ns() < spin_until {}
        let precise = monotonic_ns();
        let coarse = monotonic_coarse_ns();
        assert!(coarse <= monotonic_ns(), "the coarse clock ran ahead");
        worst = worst.max(precise.saturating_sub(coarse));
    }
    assert!(
        worst < allowance,
        "the coarse clock lagged {worst} ns, past the allowance {allowance} ns"
    );
}

#[test]
fn real_coarse_stamps_are_evicted_after_the_timeout_never_before() {
    // Workers on the real coarse clock go silent at random phases of its
    // tick; the reaper thread must not drop any before `timeout` of real
    // silence (measured on the precise clock from the last beat's return).
    let options = TableOptions {
        capacity: 16,
        reap_timeout: coarse_timeout(),
        registration_grace: Duration::from_secs(10),
        ..TableOptions::default()
    };
    let temp = TempTable::new("coarse-real", &options);
    let table = &temp.table;
    assert_eq!(table.stamp_clock(), StampClock::Coarse, "Auto chose");
    let timeout = table.reap_timeout();
    let recorder = Recorder::default();
    let record = recorder.handler();
    let dropped_at = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let dropping = dropped_at.clone();
    let reaper = table
        .reaper()
        .on_drop(move |event| {
            dropping
                .lock()
                .unwrap()
                .push((event.instance_id, Instant::now()));
            record(event)
        })
        .spawn()
        .unwrap();
    let mut rng = Rng::seeded();
    let resolution = coarse_resolution_ns().max(1_000_000);
    let mut last_beats = Vec::new();
    for id in 1..=12u64 {
        let worker = table.register(id, "w").unwrap();
        std::thread::sleep(Duration::from_nanos(rng.below(resolution)));
        worker.heartbeat().unwrap();
        last_beats.push((id, Instant::now()));
        std::mem::forget(worker); // silent from here (no deregistration)
    }
    let deadline = Instant::now() + timeout * 3;
    while recorder.events().len() < last_beats.len() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let events = recorder.events();
    assert_eq!(
        events.len(),
        last_beats.len(),
        "not all evicted: {events:?}"
    );
    for event in &events {
        assert_eq!(event.reason, Reason::Timeout);
        // The drop handler ran no earlier than `timeout` after the beat
        // returned: the event's silence is at least the timeout.
        assert!(
            event.silent_for >= timeout,
            "instance {} judged silent for only {:?}",
            event.instance_id,
            event.silent_for
        );
    }
    // Measured by this test, not the reaper: from the return of each last
    // beat (after the beat itself) to its drop handler (after its eviction).
    let dropped_at = dropped_at.lock().unwrap().clone();
    for (id, beat_returned) in &last_beats {
        let (_, dropped) = dropped_at.iter().find(|(i, _)| i == id).unwrap();
        assert!(
            dropped.duration_since(*beat_returned) >= timeout,
            "instance {id} dropped {:?} after its last beat returned, before the timeout {timeout:?}",
            dropped.duration_since(*beat_returned)
        );
    }
    reaper.stop().unwrap();
}

#[test]
fn a_table_forced_to_the_precise_clock_stamps_exactly() {
    let options = TableOptions {
        stamp_clock: StampClock::Precise,
        ..coarse_options(4)
    };
    let temp = TempTable::new("precise", &options);
    assert_eq!(temp.table.stamp_clock(), StampClock::Precise);
    assert_eq!(temp.table.stamp_resolution(), Duration::ZERO);
    let status = temp.table.status().unwrap();
    assert_eq!(status.stamp_resolution_seconds, 0.0);
    // Another process's view: opened by name, the same clock.
    let opened = Table::open(&temp.name).unwrap();
    assert_eq!(opened.stamp_clock(), StampClock::Precise);
    let worker = opened.register(1, "w").unwrap();
    let before = monotonic_ns();
    worker.heartbeat().unwrap();
    let after = monotonic_ns();
    let read_from = monotonic_ns();
    let age_ns = opened.status().unwrap().registrations[0]
        .last_heartbeat_age_seconds
        .expect("same clock")
        * 1e9;
    let read_until = monotonic_ns();
    // Precise: the stamp lies within the call (rounded up to a microsecond,
    // and within the float's rounding); a coarse one would lie up to a tick
    // before it.
    let stamp_earliest = read_from as f64 - age_ns;
    let stamp_latest = read_until as f64 - age_ns;
    assert!(
        stamp_latest + 1.0 >= before as f64,
        "stamped {} ns before the call",
        before as f64 - stamp_latest
    );
    assert!(stamp_earliest <= (after + 1_000) as f64 + 1.0);
    worker.deregister().unwrap();
}

#[test]
fn auto_picks_the_coarse_clock_only_for_timeouts_of_enough_ticks() {
    let resolution = Duration::from_nanos(coarse_resolution_ns());
    let long = TableOptions {
        reap_timeout: resolution * MIN_TIMEOUT_TICKS,
        registration_grace: Duration::from_secs(60),
        ..TableOptions::default()
    };
    let table = Table::in_memory(&long).unwrap();
    assert_eq!(table.stamp_clock(), StampClock::Coarse);
    assert_eq!(table.stamp_resolution(), resolution);
    let short = TableOptions {
        reap_timeout: resolution * MIN_TIMEOUT_TICKS - Duration::from_nanos(1),
        ..long.clone()
    };
    assert_eq!(
        Table::in_memory(&short).unwrap().stamp_clock(),
        StampClock::Precise
    );
    let forced = TableOptions {
        stamp_clock: StampClock::Coarse,
        ..short
    };
    match Table::in_memory(&forced) {
        Err(Error::InvalidArgument(message)) => assert!(
            message.contains("coarse clock's resolution")
                && message.contains("expected a timeout of at least"),
            "{message}"
        ),
        Err(other) => panic!("expected InvalidArgument, got {other:?}"),
        Ok(_) => panic!("a coarse clock was accepted for a timeout of under 50 ticks"),
    }
}

#[test]
fn every_process_stamps_as_the_table_says() {
    let temp = TempTable::new("coarse-open", &coarse_options(4));
    let opened = Table::open(&temp.name).unwrap();
    assert_eq!(opened.stamp_clock(), StampClock::Coarse);
    assert_eq!(opened.stamp_resolution(), temp.table.stamp_resolution());
    let status = opened.status().unwrap();
    assert_eq!(
        status.stamp_resolution_seconds,
        temp.table.stamp_resolution().as_secs_f64()
    );
    let json = serde_json::to_value(&status).unwrap();
    assert_eq!(json["stamp_clock"], "coarse");
}
