//! The server's death seen by its engines, across real processes: a reaper
//! (`livereg reap`) SIGKILLed is seen `Dying` (or already `Absent`) by a
//! waiter in another process at the start of its exit, then `Absent`; a new reaper is seen
//! `Serving` with a new boot token; a reaper stopped with SIGSTOP is not
//! dying.

#[path = "../../tests/common/mod.rs"]
mod common;

#[path = "support/worker_process.rs"]
mod worker_process;

use common::{long_options, TempTable};
use livereg::{ReaperState, Table};
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};
use worker_process::WorkerProcess;

/// `livereg reap TABLE` in a child process, serving once this returns.
fn reaper_process(table: &Table) -> (WorkerProcess, ReaperState) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_livereg"));
    command.args(["reap", table.name()]);
    let reaper = WorkerProcess::spawn(&mut command);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now = table.reaper_state();
        if now.pid() == Some(reaper.child.id()) && now.name() == "serving" {
            return (reaper, now);
        }
        assert!(Instant::now() < deadline, "the reaper never served: {now}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A thread of this process waiting for the reaper to leave `known`.
fn waiter(table: &Table, known: ReaperState) -> mpsc::Receiver<(ReaperState, Instant)> {
    let (saw, seen) = mpsc::channel();
    let table = table.clone();
    std::thread::spawn(move || {
        let now = table.wait_reaper_state(known, Duration::from_secs(20));
        let _ = saw.send((now, Instant::now()));
    });
    std::thread::sleep(Duration::from_millis(50));
    seen
}

#[test]
fn a_sigkilled_reaper_is_seen_dying_then_absent_and_its_successor_serving_with_a_new_token() {
    let temp = TempTable::new("server-killed", &long_options());
    let engine = Table::open(&temp.name).unwrap();
    let (reaper, before) = reaper_process(&engine);
    let seen = waiter(&engine, before);
    let killed = Instant::now();
    reaper.signal(libc::SIGKILL);
    let (now, at) = seen.recv_timeout(Duration::from_secs(20)).unwrap();
    let after = at - killed;
    eprintln!("reaper SIGKILLed: {} after {after:?}", now.name());
    assert!(
        matches!(now, ReaperState::Dying { .. } | ReaperState::Absent),
        "{now}"
    );
    if let ReaperState::Dying { boot_token, pid } = now {
        assert_eq!(
            (Some(boot_token), Some(pid)),
            (before.boot_token(), before.pid())
        );
    }
    // Generous: the kernel marks the word in microseconds; a loaded
    // machine may take long to run the waiter.
    assert!(after < Duration::from_secs(2), "seen after {after:?}");
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut now = now;
    while now != ReaperState::Absent {
        assert!(Instant::now() < deadline, "still {now}");
        now = engine.wait_reaper_state(now, Duration::from_secs(1));
    }
    drop(reaper);

    let seen = waiter(&engine, ReaperState::Absent);
    let (_successor, serving) = reaper_process(&engine);
    let (now, _) = seen.recv_timeout(Duration::from_secs(20)).unwrap();
    assert_eq!(now.name(), "serving", "{now}");
    assert_ne!(
        now.boot_token(),
        before.boot_token(),
        "a new reaper, a new token"
    );
    assert_eq!(now.boot_token(), serving.boot_token());
}

#[test]
fn a_stopped_reaper_is_never_dying() {
    let temp = TempTable::new("server-stopped", &long_options());
    let engine = Table::open(&temp.name).unwrap();
    let (reaper, before) = reaper_process(&engine);
    let seen = waiter(&engine, before);
    reaper.signal(libc::SIGSTOP);
    assert!(
        seen.recv_timeout(Duration::from_millis(500)).is_err(),
        "a stopped reaper changed state"
    );
    assert_eq!(engine.reaper_state(), before);
    reaper.signal(libc::SIGCONT);
}
