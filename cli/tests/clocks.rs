//! Clocks are compared only within one time namespace: a reaper
//! trusts stamps of its own clock on every scan, and judges any other
//! registration by when its beat word changed, never early. First on injected
//! clocks, then with workers in real Linux time namespaces.

#[path = "../../tests/common/mod.rs"]
mod common;

use common::{options, reaper_with_channel, Recorder, TempTable, SECOND};
use livereg::{Clock, Reason, Table, TableOptions};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A heap table, a worker handle on clock `worker` and a recording reaper on
/// clock `reaper` (two clocks of different identity).
fn two_clocks(
    worker_at: u64,
    reaper_at: u64,
) -> (
    Table,
    livereg::ManualClock,
    livereg::ManualClock,
    livereg::Reaper,
    Recorder,
) {
    let table = Table::in_memory(&options()).unwrap();
    let (worker_clock, reaper_clock) = (Clock::manual(worker_at), Clock::manual(reaper_at));
    let recorder = Recorder::default();
    let reaper = table
        .with_clock(reaper_clock.clock())
        .reaper()
        .on_drop(recorder.handler())
        .build()
        .unwrap();
    (
        table.with_clock(worker_clock.clock()),
        worker_clock,
        reaper_clock,
        reaper,
        recorder,
    )
}

#[test]
fn a_worker_whose_clock_lags_is_not_evicted_on_the_reapers_first_scan() {
    // The worker's clock is 300 s behind the reaper's (a container restored
    // from a checkpoint); it registered and beat before the reaper started.
    let (workers, worker_clock, reaper_clock, mut reaper, recorder) =
        two_clocks(100 * SECOND, 400 * SECOND);
    let worker = workers.register(1, "lagging").unwrap();
    worker.heartbeat().unwrap();
    reaper.scan_once(reaper_clock.now_ns()).unwrap();
    assert!(recorder.events().is_empty(), "{:?}", recorder.events());
    // It keeps beating: never evicted.
    for _ in 0..8 {
        worker_clock.advance(Duration::from_millis(250));
        reaper_clock.advance(Duration::from_millis(250));
        worker.heartbeat().unwrap();
        reaper.scan_once(reaper_clock.now_ns()).unwrap();
    }
    assert!(recorder.events().is_empty(), "{:?}", recorder.events());
}

#[test]
fn a_lag_under_one_scan_interval_never_evicts_early() {
    // 200 ms behind, less than the 250 ms scan interval of a 1 s timeout.
    let (workers, _worker_clock, reaper_clock, mut reaper, recorder) =
        two_clocks(10 * SECOND - 200_000_000, 10 * SECOND);
    let worker = workers.register(1, "lagging").unwrap();
    worker.heartbeat().unwrap();
    // Its last beat was at 10.0 s on the reaper's clock.
    reaper.scan_once(10 * SECOND).unwrap();
    reaper.scan_once(10 * SECOND + 800_000_000).unwrap();
    reaper.scan_once(11 * SECOND - 1).unwrap();
    assert!(
        recorder.events().is_empty(),
        "evicted early: {:?}",
        recorder.events()
    );
    reaper_clock.set(11 * SECOND);
    reaper.scan_once(11 * SECOND).unwrap();
    assert_eq!(recorder.reasons(), vec![(1, Reason::Timeout)]);
    assert!(recorder.events()[0].silent_for >= Duration::from_secs(1));
}

#[test]
fn a_silent_worker_whose_clock_runs_ahead_is_still_evicted() {
    let (workers, _worker_clock, reaper_clock, mut reaper, recorder) =
        two_clocks(900 * SECOND, 10 * SECOND);
    let worker = workers.register(1, "ahead").unwrap();
    worker.heartbeat().unwrap();
    reaper.scan_once(reaper_clock.now_ns()).unwrap();
    reaper
        .scan_once(reaper_clock.now_ns() + SECOND - 1)
        .unwrap();
    assert!(recorder.events().is_empty());
    reaper.scan_once(reaper_clock.now_ns() + SECOND).unwrap();
    assert_eq!(recorder.reasons(), vec![(1, Reason::Timeout)]);
}

#[test]
fn a_never_beaten_worker_on_another_clock_gets_its_whole_grace() {
    let (workers, _worker_clock, reaper_clock, mut reaper, recorder) =
        two_clocks(SECOND, 1_000 * SECOND);
    let _worker = workers.register(1, "silent").unwrap();
    let start = reaper_clock.now_ns();
    reaper.scan_once(start).unwrap();
    reaper.scan_once(start + 3 * SECOND - 1).unwrap();
    assert!(recorder.events().is_empty());
    reaper.scan_once(start + 3 * SECOND).unwrap();
    assert_eq!(recorder.reasons(), vec![(1, Reason::Grace)]);
}

/// Seconds of this machine's `CLOCK_MONOTONIC`: a time namespace cannot set
/// its clock below zero, so a lag must be shorter.
fn uptime_seconds() -> u64 {
    livereg::monotonic_ns() / SECOND
}

/// A CLI worker in a new time namespace whose monotonic clock is offset by
/// `offset` seconds, beating every 50 ms. `None` if the kernel refuses time
/// namespaces (the injected-clock tests above then carry the rule).
fn worker_in_time_namespace(table: &str, offset: i64) -> Option<Child> {
    let mut child = Command::new("unshare")
        .args(["--time", &format!("--monotonic={offset}"), "--fork"])
        .arg(env!("CARGO_BIN_EXE_livereg"))
        .args(["worker", table, "--instance", "1", "--interval", "50ms"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .ok()?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .ok()?;
    if !line.starts_with("registered") {
        let _ = child.kill();
        let output = child.wait_with_output().ok()?;
        eprintln!(
            "time namespaces refused here ({}); the injected-clock tests carry the rule",
            String::from_utf8_lossy(&output.stderr).trim()
        );
        return None;
    }
    Some(child)
}

fn signal(pid: u32, signal: i32) {
    // SAFETY: `kill` has no memory effects; the pid is a live test child's.
    unsafe { libc::kill(pid as libc::pid_t, signal) };
}

#[test]
fn workers_in_other_time_namespaces_are_kept_while_beating_and_evicted_when_stopped() {
    let timeout = Duration::from_millis(800);
    let lag = uptime_seconds().saturating_sub(2).min(300) as i64;
    assert!(
        lag >= 5,
        "uptime too short to lag a clock behind by more than the timeout"
    );
    for offset in [-lag, 300] {
        let temp = TempTable::new(
            "timens",
            &TableOptions {
                capacity: 4,
                reap_timeout: timeout,
                registration_grace: 2 * timeout,
                ..TableOptions::default()
            },
        );
        let Some(mut unshare) = worker_in_time_namespace(&temp.name, offset) else {
            return;
        };
        // The worker registered (and beats) before the reaper starts.
        std::thread::sleep(Duration::from_millis(200));
        let (reaper, drops) = reaper_with_channel(&temp.table);
        std::thread::sleep(3 * timeout);
        assert!(
            drops.try_recv().is_err(),
            "offset {offset}s: a beating worker was evicted"
        );
        let pid = temp.table.status().unwrap().registrations[0].pid;
        signal(pid, libc::SIGSTOP);
        let stopped = Instant::now();
        let (event, at) = drops
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("offset {offset}s: a stopped worker was never evicted"));
        let after = at - stopped;
        assert_eq!(event.reason, Reason::Timeout, "offset {offset}s");
        // Never early (less one beat interval before the stop); late by at
        // most two scan intervals, plus generous slack.
        assert!(
            after >= timeout - Duration::from_millis(60),
            "offset {offset}s: evicted after {after:?}"
        );
        assert!(
            after <= timeout + timeout / 2 + Duration::from_secs(2),
            "offset {offset}s: evicted after {after:?}"
        );
        signal(pid, libc::SIGKILL);
        let _ = unshare.wait();
        reaper.stop().unwrap();
    }
}
