//! A reaper driven by the caller's own loop: one role, boot token and memory
//! for its whole life, a descriptor that wakes the loop when a scan is due
//! early, and `next_scan_in` as the loop's timeout.

#[path = "../../tests/common/mod.rs"]
mod common;

use common::{unique_name, TempTable, UnlinkOnDrop};
use livereg::{ExitDetection, Reaper, Reason, Table, TableOptions};
use std::io::{BufRead, BufReader};
use std::os::fd::AsRawFd;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn options(timeout: Duration) -> TableOptions {
    TableOptions {
        capacity: 8,
        reap_timeout: timeout,
        registration_grace: 2 * timeout,
        ..TableOptions::default()
    }
}

/// Waits as an event loop does: until the descriptor is readable or the
/// next scan is due. Returns whether the descriptor woke it.
fn wait(reaper: &Reaper, at_most: Duration) -> bool {
    let mut ready = libc::pollfd {
        fd: reaper.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let timeout = reaper.next_scan_in().min(at_most);
    // SAFETY: one valid pollfd, as the count says.
    let n = unsafe { libc::poll(&mut ready, 1, timeout.as_millis() as i32) };
    n == 1
}

/// Runs the loop until `done` or `within` passes; returns the drop events.
fn drive(
    reaper: &mut Reaper,
    within: Duration,
    mut done: impl FnMut(&[livereg::DropEvent]) -> bool,
) -> Vec<livereg::DropEvent> {
    let deadline = Instant::now() + within;
    let mut ended = Vec::new();
    while !done(&ended) {
        assert!(
            Instant::now() < deadline,
            "the loop did not finish: {ended:?}"
        );
        wait(reaper, Duration::from_millis(100));
        ended.extend(reaper.scan().unwrap().ended);
    }
    ended
}

/// Runs the loop for `period`; returns the drop events.
fn run_for(reaper: &mut Reaper, period: Duration) -> Vec<livereg::DropEvent> {
    let until = Instant::now() + period;
    let mut ended = Vec::new();
    while Instant::now() < until {
        wait(reaper, until.saturating_duration_since(Instant::now()));
        ended.extend(reaper.scan().unwrap().ended);
    }
    ended
}

fn livereg(args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_livereg"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn one_boot_token_across_scans_and_never_more_than_an_interval_to_wait() {
    let temp = TempTable::new("driven-token", &options(Duration::from_secs(2)));
    let mut reaper = temp.table.reaper().build().unwrap();
    assert_eq!(
        reaper.next_scan_in(),
        Duration::ZERO,
        "the first scan is due at once"
    );
    let token = temp.table.probe().unwrap();
    for _ in 0..100 {
        reaper.scan().unwrap();
        assert!(reaper.next_scan_in() <= Duration::from_millis(500));
        assert_eq!(temp.table.probe().unwrap(), token);
    }
    // Another process sees the same reaper between scans.
    let probed = livereg(&["probe", &temp.name]).wait_with_output().unwrap();
    assert!(probed.status.success());
    assert_eq!(
        String::from_utf8_lossy(&probed.stdout).trim(),
        format!("{token:#018x}")
    );
    // Another process cannot take the role meanwhile.
    let second = livereg(&["reap", &temp.name]).wait_with_output().unwrap();
    assert_eq!(second.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&second.stderr).contains("another reaper"));
}

#[test]
fn the_descriptor_wakes_the_loop_for_a_deregistration_a_kill_a_clear_and_a_reset() {
    // A long timeout: only a wake-up can end anything within the test.
    let temp = TempTable::new("driven-wake", &options(Duration::from_secs(30)));
    let mut reaper = temp.table.reaper().build().unwrap();
    reaper.scan().unwrap();

    // A deregistration in this process.
    let worker = temp.table.register(1, "quits").unwrap();
    reaper.scan().unwrap();
    let started = Instant::now();
    worker.deregister().unwrap();
    assert!(wait(&reaper, Duration::from_secs(5)), "no wake-up");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(reaper.scan().unwrap().ended[0].reason, Reason::Deregistered);

    // A SIGKILLed worker process (same PID namespace: its pidfd).
    let mut child = livereg(&[
        "worker",
        &temp.name,
        "--instance",
        "2",
        "--interval",
        "50ms",
    ]);
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert!(lines.next().unwrap().unwrap().starts_with("registered"));
    drive(&mut reaper, Duration::from_secs(5), |_| {
        temp.table.status().unwrap().registrations[0].exit_detection == ExitDetection::PidfdAndLock
    });
    while wait(&reaper, Duration::ZERO) {
        reaper.scan().unwrap();
    }
    let killed = Instant::now();
    child.kill().unwrap();
    let _ = child.wait();
    assert!(wait(&reaper, Duration::from_secs(5)), "no wake-up");
    assert!(
        killed.elapsed() < Duration::from_secs(1),
        "{:?}",
        killed.elapsed()
    );
    let ended = drive(&mut reaper, Duration::from_secs(5), |ended| {
        !ended.is_empty()
    });
    assert_eq!(
        (ended[0].instance_id, ended[0].reason),
        (2, Reason::ProcessExited)
    );

    // A clear requested by another process, completed between scans: the
    // registration stays.
    let _kept = temp.table.register(3, "cleared").unwrap();
    reaper.scan().unwrap();
    let mut clear = livereg(&["clear", &temp.name, "--wait", "10s"]);
    let mut cleared = None;
    let ended = drive(&mut reaper, Duration::from_secs(10), |_| {
        cleared = cleared.or_else(|| clear.try_wait().unwrap());
        cleared.is_some()
    });
    assert!(cleared.unwrap().success());
    assert!(ended.is_empty(), "a clear ends nothing: {ended:?}");
    // A reset, likewise: it ends the registration.
    let mut reset = livereg(&["clear", &temp.name, "--reset", "--wait", "10s"]);
    let ended = drive(&mut reaper, Duration::from_secs(10), |ended| {
        !ended.is_empty()
    });
    assert_eq!(
        (ended[0].instance_id, ended[0].reason),
        (3, Reason::Cleared)
    );
    assert!(reset.wait().unwrap().success());
}

#[test]
fn a_hung_worker_whose_clock_runs_ahead_is_evicted_within_its_bound() {
    let name = unique_name("driven-ahead");
    let _guard = UnlinkOnDrop(name.clone());
    let timeout = Duration::from_millis(800);
    let table = Table::create(&name, &options(timeout)).unwrap();
    let mut reaper = table.reaper().build().unwrap();
    let mut worker = match Command::new("unshare")
        .args(["--time", "--monotonic=300", "--fork", "--kill-child"])
        .arg(env!("CARGO_BIN_EXE_livereg"))
        .args(["worker", &name, "--instance", "4", "--interval", "50ms"])
        .stdout(Stdio::piped())
        .spawn()
    {
        Ok(child) => child,
        Err(e) => {
            eprintln!(
                "no unshare here ({e}); cli/tests/clocks.rs carries the rule on injected clocks"
            );
            return;
        }
    };
    let mut lines = BufReader::new(worker.stdout.take().unwrap()).lines();
    if !lines
        .next()
        .and_then(Result::ok)
        .is_some_and(|l| l.starts_with("registered"))
    {
        eprintln!(
            "time namespaces refused here; cli/tests/clocks.rs carries the rule on injected clocks"
        );
        return;
    }
    // Beating: kept across three timeouts.
    let kept = run_for(&mut reaper, 3 * timeout);
    assert!(kept.is_empty(), "a beating worker was evicted: {kept:?}");
    let pid = table.status().unwrap().registrations[0].pid;
    // SAFETY: `kill` has no memory effects; the pid is the test's worker's.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGSTOP) };
    let stopped = Instant::now();
    let ended = drive(&mut reaper, Duration::from_secs(10), |ended| {
        !ended.is_empty()
    });
    let after = stopped.elapsed();
    assert_eq!(ended[0].reason, Reason::Timeout);
    assert!(
        after >= timeout - Duration::from_millis(60),
        "evicted after {after:?}"
    );
    assert!(
        after <= timeout + timeout / 2 + Duration::from_secs(1),
        "evicted after {after:?}"
    );
    // SAFETY: as above.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
    let _ = worker.kill();
    let _ = worker.wait();
}

#[test]
fn a_wake_up_right_after_acquiring_is_not_lost() {
    // Found by the C and Python tests: the forwarding thread took its first
    // look at the wake word when it started running, after a registration
    // made right after `build`, and so never reported it.
    let temp = TempTable::new("driven-early", &options(Duration::from_secs(30)));
    for _ in 0..20 {
        let reaper = temp.table.reaper().build().unwrap();
        temp.table
            .register(1, "early")
            .unwrap()
            .deregister()
            .unwrap();
        let mut ready = libc::pollfd {
            fd: reaper.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, as the count says.
        let woken = unsafe { libc::poll(&mut ready, 1, 5_000) } == 1;
        assert!(woken, "the wake-up was lost");
        drop(reaper);
        // Another test's process spawn may hold a copy of the role's lock
        // descriptor until its exec (close-on-exec): the role comes back then.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let mut cleanup = loop {
            match temp.table.reaper().build() {
                Ok(reaper) => break reaper,
                Err(livereg::Error::Busy { .. }) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(1))
                }
                Err(e) => panic!("{e}"),
            }
        };
        cleanup.scan().unwrap();
    }
}
