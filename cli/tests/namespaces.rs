//! The deployment of containers sharing `/dev/shm`: the reaper in one PID
//! namespace, workers in sibling ones (neither an ancestor of the other), so
//! no pidfd can be opened for them. Their deaths must still be seen at once
//! (the kernel closes their descriptors on the table, and the reaper hears
//! it), and live ones must never be dropped.

#[path = "../../tests/common/mod.rs"]
mod common;

use common::TempTable;
use livereg::{Reason, RegistrationState, Table, TableOptions};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `livereg ARGS` as pid 1 of a new PID namespace (killed with its
/// `unshare` parent, and on drop).
struct Namespaced(Child);

impl Namespaced {
    fn spawn(args: &[&str]) -> Namespaced {
        let child = Command::new("unshare")
            .args(["--pid", "--fork", "--kill-child"])
            .arg(env!("CARGO_BIN_EXE_livereg"))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn unshare");
        Namespaced(child)
    }

    /// The first line the program prints.
    fn first_line(&mut self) -> String {
        let stdout = self.0.stdout.as_mut().unwrap();
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).unwrap();
        line
    }

    /// The program's pid in this (the test's) namespace: `unshare`'s child.
    fn inner_pid(&self) -> libc::pid_t {
        let path = format!("/proc/{0}/task/{0}/children", self.0.id());
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let children = std::fs::read_to_string(&path).unwrap_or_default();
            if let Some(pid) = children.split_whitespace().next() {
                return pid.parse().unwrap();
            }
            assert!(Instant::now() < deadline, "unshare never forked");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Namespaced {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Whether PID namespaces can be made here (root, or user namespaces).
fn namespaces_available() -> bool {
    let probe = Command::new("unshare")
        .args(["--pid", "--fork", "--kill-child", "true"])
        .output();
    let ok = probe.as_ref().is_ok_and(|o| o.status.success());
    if !ok {
        println!(
            "LIMITATION: cannot create a PID namespace here (unshare --pid needs root or user namespaces): \
             {probe:?}; the lock-based detection is covered by the other tests"
        );
    }
    ok
}

fn live(table: &Table, instance_id: u64) -> bool {
    table
        .status()
        .unwrap()
        .registrations
        .iter()
        .any(|r| r.instance_id == instance_id && r.state == RegistrationState::Live)
}

/// A table whose scans are 2 s apart (so a drop within half a second came by
/// the wake-up), and its reaper in a PID namespace of its own.
fn table_with_a_namespaced_reaper(tag: &str) -> (TempTable, Namespaced) {
    let options = TableOptions {
        reap_timeout: Duration::from_secs(8),
        registration_grace: Duration::from_secs(8),
        ..TableOptions::default()
    };
    let temp = TempTable::new(tag, &options);
    let reaper = reaper_in_its_own_namespace(&temp);
    (temp, reaper)
}

fn reaper_in_its_own_namespace(temp: &TempTable) -> Namespaced {
    let reaper = Namespaced::spawn(&["reap", &temp.name]);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !temp.table.reaper_alive() {
        assert!(Instant::now() < deadline, "the reaper never started");
        std::thread::sleep(Duration::from_millis(5));
    }
    reaper
}

#[test]
fn a_sigkilled_worker_in_a_sibling_pid_namespace_is_dropped_at_once() {
    if !namespaces_available() {
        return;
    }
    let (temp, _reaper) = table_with_a_namespaced_reaper("sibling-kill");
    for instance in 1..=3u64 {
        let id = instance.to_string();
        let mut worker = Namespaced::spawn(&["worker", &temp.name, "--instance", &id]);
        assert!(worker.first_line().starts_with("registered"));
        let registration = temp
            .table
            .status()
            .unwrap()
            .registrations
            .into_iter()
            .find(|r| r.instance_id == instance)
            .unwrap();
        assert_eq!(registration.pid, 1, "the worker is pid 1 of its namespace");
        std::thread::sleep(Duration::from_millis(100));
        let killed = Instant::now();
        // SAFETY: `kill` has no memory effects; the pid is unshare's live child.
        unsafe { libc::kill(worker.inner_pid(), libc::SIGKILL) };
        while live(&temp.table, instance) {
            assert!(
                killed.elapsed() < Duration::from_millis(500),
                "instance {instance} still live {:?} after SIGKILL (the next scan is up to 2 s away)",
                killed.elapsed()
            );
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while temp.table.status().unwrap().ended[&Reason::ProcessExited] < 3 {
        assert!(
            Instant::now() < deadline,
            "{:?}",
            temp.table.status().unwrap().ended
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_live_worker_in_a_sibling_pid_namespace_is_never_dropped() {
    if !namespaces_available() {
        return;
    }
    let options = TableOptions {
        reap_timeout: Duration::from_millis(400),
        registration_grace: Duration::from_millis(800),
        ..TableOptions::default()
    };
    let temp = TempTable::new("sibling-live", &options);
    let _reaper = reaper_in_its_own_namespace(&temp);
    let mut worker = Namespaced::spawn(&[
        "worker",
        &temp.name,
        "--instance",
        "7",
        "--interval",
        "50ms",
    ]);
    assert!(worker.first_line().starts_with("registered"));
    // Registrations come and go beside it for five timeouts: every one that
    // goes closes a descriptor, and each close makes the reaper test locks.
    let started = Instant::now();
    let mut churn = 100;
    while started.elapsed() < Duration::from_secs(2) {
        temp.table
            .register(churn, "churn")
            .unwrap()
            .deregister()
            .unwrap();
        churn += 1;
        assert!(live(&temp.table, 7), "dropped while alive");
        std::thread::sleep(Duration::from_millis(20));
    }
    let status = temp.table.status().unwrap();
    assert_eq!(
        status.ended[&Reason::ProcessExited],
        0,
        "{:?}",
        status.ended
    );
    assert_eq!(status.ended[&Reason::Timeout], 0, "{:?}", status.ended);
}

#[test]
fn a_process_with_several_registrations_loses_them_all_at_once_and_only_its_own() {
    if !namespaces_available() {
        return;
    }
    // Two processes, each pid 1 of its own namespace and each holding four
    // registrations: a round tests one lock per process, so it must tell
    // them apart (pid, start time, clock and the process's random tag).
    let (temp, _reaper) = table_with_a_namespaced_reaper("sibling-several");
    let mut doomed = Namespaced::spawn(&["worker", &temp.name, "--instance", "10", "--also", "3"]);
    let mut kept = Namespaced::spawn(&["worker", &temp.name, "--instance", "20", "--also", "3"]);
    assert!(doomed.first_line().starts_with("registered"));
    assert!(kept.first_line().starts_with("registered"));
    let deadline = Instant::now() + Duration::from_secs(5);
    while temp.table.status().unwrap().tracked_instances < 8 {
        assert!(Instant::now() < deadline, "never registered all eight");
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(100));
    let killed = Instant::now();
    // SAFETY: `kill` has no memory effects; the pid is unshare's live child.
    unsafe { libc::kill(doomed.inner_pid(), libc::SIGKILL) };
    while (10..=13).any(|id| live(&temp.table, id)) {
        assert!(
            killed.elapsed() < Duration::from_millis(500),
            "still live {:?} after SIGKILL: {:?}",
            killed.elapsed(),
            (10..=13)
                .filter(|id| live(&temp.table, *id))
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_micros(200));
    }
    // More rounds (registrations coming and going), and the other process's
    // four stay.
    for churn in 100..110 {
        temp.table
            .register(churn, "churn")
            .unwrap()
            .deregister()
            .unwrap();
        std::thread::sleep(Duration::from_millis(20));
    }
    for id in 20..=23 {
        assert!(
            live(&temp.table, id),
            "instance {id} of the live process dropped"
        );
    }
    let status = temp.table.status().unwrap();
    assert_eq!(
        status.ended[&Reason::ProcessExited],
        4,
        "{:?}",
        status.ended
    );
}

/// A registrant from another PID namespace whose pid and start tick happen to
/// name a process of the reaper's own (here: this test process itself, as
/// its slot says, with the process tag of another namespace).
#[test]
fn a_pid_recorded_in_another_namespace_is_never_watched_through_a_pidfd() {
    use livereg::{header_offsets, ExitDetection, HEADER_SIZE, SLOT_SIZE};
    use std::os::unix::fs::FileExt;

    let temp = TempTable::new("ns-tag", &TableOptions::default());
    let mine = temp.table.register(1, "mine").unwrap();
    let theirs = temp.table.register(2, "from elsewhere").unwrap();
    let row = |id: u64| {
        let status = temp.table.status().unwrap();
        status
            .registrations
            .into_iter()
            .find(|r| r.instance_id == id)
            .unwrap()
    };
    let shm = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/dev/shm/{}", temp.name))
        .unwrap();
    let at = (HEADER_SIZE + row(2).slot as usize * SLOT_SIZE + header_offsets::SLOT_FLAGS) as u64;
    let mut flags = [0u8; 4];
    shm.read_exact_at(&mut flags, at).unwrap();
    let other_tag = (u32::from_ne_bytes(flags) >> 16) ^ 0x5a5a;
    let tampered = (u32::from_ne_bytes(flags) & 0xFFFF) | other_tag << 16;
    shm.write_all_at(&tampered.to_ne_bytes(), at).unwrap();

    let mut reaper = temp.table.reaper().build().unwrap();
    reaper.scan().unwrap();
    assert_eq!(row(1).exit_detection, ExitDetection::PidfdAndLock);
    assert_eq!(
        row(2).exit_detection,
        ExitDetection::Lock,
        "another namespace's pid"
    );
    drop((mine, theirs));
}

/// A reaper in its own time namespace (its monotonic clock 100,000 s ahead):
/// its heartbeat is a reading of another clock, so the status of a process
/// on this clock says nothing of its age rather than a wrong one.
#[test]
fn a_reaper_on_another_clock_has_no_heartbeat_age_here() {
    let temp = TempTable::new("timens-age", &TableOptions::default());
    let mut reaper = Command::new("unshare")
        .args(["--time", "--monotonic", "100000", "--fork", "--kill-child"])
        .arg(env!("CARGO_BIN_EXE_livereg"))
        .args(["reap", &temp.name])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn unshare --time");
    let deadline = Instant::now() + Duration::from_secs(5);
    while temp.table.status().unwrap().scans == 0 {
        assert!(Instant::now() < deadline, "the reaper never scanned");
        std::thread::sleep(Duration::from_millis(5));
    }
    let status = temp.table.status().unwrap();
    let _ = reaper.kill();
    let _ = reaper.wait();
    assert!(status.reaper_alive);
    assert_eq!(
        status.reaper_heartbeat_age_seconds, None,
        "an age read across clocks"
    );
}
