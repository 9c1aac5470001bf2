//! `fork` after registering: the child shares the parent's descriptors, yet
//! must neither keep a dead parent's registration alive nor act as its owner.

mod common;

use common::TempTable;
use livereg::{Error, ExitDetection, Reason, RegistrationState, Table};
use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

/// Not a test: the parent process of the tests below, run in a child process.
/// It registers instances 1 and 3, forks, and both sides report on stdout.
/// The child never touches its copy of 1 (as a child that never runs
/// destructors), beats through its copy of 3 and drops it.
#[test]
#[ignore = "helper process, run by the fork tests"]
fn helper_registers_then_forks() {
    let name = std::env::var("LIVEREG_HELPER_TABLE").expect("run by the fork tests");
    let table = Table::open(&name).unwrap();
    let worker = table.register(1, "parent").unwrap();
    let other = table.register(3, "parent too").unwrap();
    worker.heartbeat().unwrap();
    // SAFETY:
    // - the child only uses this thread's state and then loops or exits; the
    //   harness's other threads are idle at this point.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let inherited = match other.heartbeat() {
            Err(Error::Evicted { .. }) => "refused",
            _ => "ACCEPTED",
        };
        std::mem::forget(worker);
        drop(other);
        let own = table.register(2, "child").map(|w| {
            let ok = w.heartbeat().is_ok();
            std::mem::forget(w);
            ok
        });
        println!(
            "child {} inherited-heartbeat {inherited} own-registration {own:?}",
            std::process::id()
        );
        loop {
            std::thread::sleep(Duration::from_secs(1));
        }
    }
    println!("parent {}", std::process::id());
    loop {
        let _ = worker.heartbeat();
        let _ = other.heartbeat();
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn forked_child_neither_keeps_a_dead_parent_alive_nor_acts_as_it() {
    let temp = TempTable::new("fork", &common::long_options());
    let (_reaper, events) = common::reaper_with_channel(&temp.table);
    let mut helper = common::spawn_helper("helper_registers_then_forks", &temp.name);
    let mut lines = BufReader::new(helper.stdout.take().unwrap()).lines();
    let (mut parent, mut child) = (None, None);
    while parent.is_none() || child.is_none() {
        let line = lines.next().expect("helper output").unwrap();
        if let Some(at) = line.find("parent ") {
            parent = Some(line[at + 7..].trim().parse::<i32>().unwrap());
        }
        if let Some(at) = line.find("child ") {
            child = Some(line[at..].to_owned());
        }
    }
    let (parent, child) = (parent.unwrap(), child.unwrap());
    let child_pid: i32 = child.split_whitespace().nth(1).unwrap().parse().unwrap();
    struct Kill(i32);
    impl Drop for Kill {
        fn drop(&mut self) {
            // SAFETY: `kill` has no memory effects.
            unsafe { libc::kill(self.0, libc::SIGKILL) };
        }
    }
    let _child_guard = Kill(child_pid);

    assert!(child.contains("inherited-heartbeat refused"), "{child}");
    assert!(child.contains("own-registration Ok(true)"), "{child}");
    std::thread::sleep(Duration::from_millis(200));
    let status = temp.table.status().unwrap();
    let live: Vec<u64> = status
        .registrations
        .iter()
        .filter(|r| r.state == RegistrationState::Live)
        .map(|r| r.instance_id)
        .collect();
    assert!(
        live.contains(&1) && live.contains(&2) && live.contains(&3),
        "the child's copies left the parent's registrations alone: {live:?}"
    );
    assert!(events.try_recv().is_err(), "nothing ended yet");

    // SAFETY: `kill` has no memory effects.
    unsafe { libc::kill(parent, libc::SIGKILL) };
    let _ = helper.wait();
    // The 30 s timeout cannot pass this; the next scan (7.5 s) can.
    let mut ended: Vec<(u64, Reason)> = (0..2)
        .map(|_| {
            events
                .recv_timeout(Duration::from_secs(12))
                .expect("the dead parent's registrations are dropped")
        })
        .map(|(event, _)| (event.instance_id, event.reason))
        .collect();
    ended.sort_by_key(|(id, _)| *id);
    assert_eq!(
        ended,
        vec![(1, Reason::ProcessExited), (3, Reason::ProcessExited)]
    );
    // SAFETY: signal 0 only checks that the process exists.
    assert_eq!(
        unsafe { libc::kill(child_pid, 0) },
        0,
        "the child is still alive"
    );
}

/// Not a test: a server process that reaps, registers instance 1 and forks;
/// the child drops its inherited reaper (as a C++ destructor at `exit()`
/// would) and registers instance 2 as itself.
#[test]
#[ignore = "helper process, run by the fork tests"]
fn helper_reaps_then_forks() {
    let name = std::env::var("LIVEREG_HELPER_TABLE").expect("run by the fork tests");
    let table = Table::open(&name).unwrap();
    let reaper = table.reaper().spawn().unwrap();
    let worker = table.register(1, "parent").unwrap();
    // SAFETY:
    // - the child only uses this thread's state and then loops; the
    //   harness's other threads are idle at this point.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        drop(reaper);
        std::mem::forget(worker);
        let own = table.register(2, "child").unwrap();
        println!("child {}", std::process::id());
        loop {
            let _ = own.heartbeat();
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    println!("parent {}", std::process::id());
    loop {
        let _ = worker.heartbeat();
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn forked_child_of_a_reaper_leaves_it_alone_and_registers_as_itself() {
    let temp = TempTable::new("fork-reaper", &common::long_options());
    let mut helper = common::spawn_helper("helper_reaps_then_forks", &temp.name);
    let mut lines = BufReader::new(helper.stdout.take().unwrap()).lines();
    let (mut parent, mut child) = (None, None);
    while parent.is_none() || child.is_none() {
        let line = lines.next().expect("helper output").unwrap();
        let pid = |at: usize| {
            line[at..]
                .split_whitespace()
                .nth(1)
                .unwrap()
                .parse::<i32>()
                .unwrap()
        };
        if let Some(at) = line.find("parent ") {
            parent = Some(pid(at));
        }
        if let Some(at) = line.find("child ") {
            child = Some(pid(at));
        }
    }
    let (parent, child) = (parent.unwrap(), child.unwrap());
    struct Kill(i32);
    impl Drop for Kill {
        fn drop(&mut self) {
            // SAFETY: `kill` has no memory effects.
            unsafe { libc::kill(self.0, libc::SIGKILL) };
        }
    }
    let _guards = (Kill(child), Kill(parent));
    // The parent's reaper verified the child as itself (its own start time)
    // and watches it through a pidfd.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let status = temp.table.status().unwrap();
        let watched = status
            .registrations
            .iter()
            .any(|r| r.instance_id == 2 && r.exit_detection == ExitDetection::PidfdAndLock);
        if watched {
            assert_eq!(
                status.reaper_pid as i32, parent,
                "the child zeroed the reaper pid"
            );
            assert!(status.reaper_alive);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the child was never pidfd-watched: {status:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // The parent's exit watcher still runs: the child's death is seen at once
    // (a scan of the 30 s timeout would take 7.5 s).
    // SAFETY: `kill` has no memory effects.
    unsafe { libc::kill(child, libc::SIGKILL) };
    let deadline = Instant::now() + Duration::from_secs(3);
    while temp.table.status().unwrap().ended[&Reason::ProcessExited] == 0 {
        assert!(
            Instant::now() < deadline,
            "the child's exit was not seen at once"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = helper.kill();
    let _ = helper.wait();
}
