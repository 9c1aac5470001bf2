//! Bounded resources: a reaper's descriptors grow with the
//! registering processes, not with registrations, and running short of them
//! degrades exit detection to the next scan, never to an error.

#[path = "../../tests/common/mod.rs"]
mod common;

use common::TempTable;
use livereg::{ExitDetection, Reason, Table, TableOptions};
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Not a test: a worker process holding `LIVEREG_HELPER_COUNT` registrations
/// from id `LIVEREG_HELPER_BASE` on, beating them all until killed.
#[test]
#[ignore = "helper process, run by the descriptor tests"]
fn helper_registers_many() {
    let name = std::env::var("LIVEREG_HELPER_TABLE").expect("run by the descriptor tests");
    let var = |key: &str| std::env::var(key).unwrap().parse::<u64>().unwrap();
    let (base, count) = (var("LIVEREG_HELPER_BASE"), var("LIVEREG_HELPER_COUNT"));
    let table = Table::open(&name).unwrap();
    let workers: Vec<_> = (base..base + count)
        .map(|id| table.register(id, "many").unwrap())
        .collect();
    println!("registered {count}");
    loop {
        for worker in &workers {
            let _ = worker.heartbeat();
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Processes killed on drop.
struct Processes(Vec<Child>);

impl Drop for Processes {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn spawn_registrant(table: &str, base: u64, count: u64) -> Child {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "helper_registers_many",
            "--nocapture",
        ])
        .env("LIVEREG_HELPER_TABLE", table)
        .env("LIVEREG_HELPER_BASE", base.to_string())
        .env("LIVEREG_HELPER_COUNT", count.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let registered = lines.find(|line| line.as_ref().is_ok_and(|l| l.contains("registered")));
    assert!(registered.is_some(), "the registrant did not register");
    child
}

/// `livereg reap NAME` with its open-files limit (soft and hard) at `limit`,
/// and its log, read as it comes (a full pipe would stall the reaper).
fn reaper_limited_to(table: &str, limit: u32) -> (Child, Arc<Mutex<String>>) {
    let mut child = Command::new("prlimit")
        .arg(format!("--nofile={limit}:{limit}"))
        .arg(env!("CARGO_BIN_EXE_livereg"))
        .args(["reap", table])
        .stderr(Stdio::piped())
        .spawn()
        .expect("prlimit (util-linux) runs the reaper");
    let log = Arc::new(Mutex::new(String::new()));
    let (mut stderr, sink) = (child.stderr.take().unwrap(), log.clone());
    std::thread::spawn(move || {
        let mut chunk = [0u8; 4096];
        while let Ok(n @ 1..) = stderr.read(&mut chunk) {
            sink.lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&chunk[..n]));
        }
    });
    (child, log)
}

fn wait_until(what: &str, within: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_reaper_limited_to_256_descriptors_watches_2000_registrations_of_4_processes() {
    let temp = TempTable::new(
        "descriptors",
        &TableOptions {
            capacity: 2048,
            ..common::long_options()
        },
    );
    let (reaper, _log) = reaper_limited_to(&temp.name, 256);
    let pid = reaper.id();
    let mut processes = Processes(vec![reaper]);
    wait_until("the reaper", Duration::from_secs(10), || {
        temp.table.reaper_alive()
    });
    for i in 0..4 {
        processes
            .0
            .push(spawn_registrant(&temp.name, 1 + i * 500, 500));
    }
    wait_until(
        "every registration pidfd-watched",
        Duration::from_secs(30),
        || {
            let status = temp.table.status().unwrap();
            status.tracked_instances == 2000
                && status
                    .registrations
                    .iter()
                    .all(|r| r.exit_detection == ExitDetection::PidfdAndLock)
        },
    );
    let descriptors = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count();
    assert!(
        descriptors < 32,
        "the reaper holds {descriptors} descriptors"
    );
    // One process dies: its 500 registrations end at once (a scan of the
    // 30 s timeout would take 7.5 s).
    processes.0[1].kill().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let status = temp.table.status().unwrap();
        if status.ended[&Reason::ProcessExited] == 500 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the dead process's registrations: ended {:?}, tracked {}",
            status.ended,
            status.tracked_instances
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(temp.table.status().unwrap().tracked_instances, 1500);
}

#[test]
fn a_reaper_short_of_descriptors_falls_back_to_the_lock_check_with_a_warning() {
    let temp = TempTable::new(
        "few-descriptors",
        &TableOptions {
            capacity: 64,
            reap_timeout: Duration::from_secs(2),
            registration_grace: Duration::from_secs(4),
            ..TableOptions::default()
        },
    );
    let (reaper, log) = reaper_limited_to(&temp.name, 256);
    wait_until("the reaper", Duration::from_secs(10), || {
        temp.table.reaper_alive()
    });
    // Room for two descriptors more than it holds now (whatever it
    // inherited): the pidfds of two of the eight processes below.
    let held = std::fs::read_dir(format!("/proc/{}/fd", reaper.id()))
        .unwrap()
        .count();
    let lowered = Command::new("prlimit")
        .args(["--pid", &reaper.id().to_string()])
        .arg(format!("--nofile={}:{}", held + 2, held + 2))
        .status()
        .unwrap();
    assert!(lowered.success());
    let mut processes = Processes(vec![reaper]);
    for i in 0..8 {
        processes.0.push(spawn_registrant(&temp.name, 1 + i * 5, 5));
    }
    wait_until(
        "some registrations left to the lock",
        Duration::from_secs(10),
        || {
            let status = temp.table.status().unwrap();
            status.tracked_instances == 40
                && status
                    .registrations
                    .iter()
                    .any(|r| r.exit_detection == ExitDetection::Lock)
        },
    );
    for mut registrant in processes.0.drain(1..) {
        let _ = registrant.kill();
        let _ = registrant.wait();
    }
    // Every exit is still detected, at the next scan at the latest.
    wait_until("every registration ended", Duration::from_secs(5), || {
        temp.table.status().unwrap().ended[&Reason::ProcessExited] == 40
    });
    assert!(temp.table.reaper_alive(), "the reaper kept going");
    let log = log.lock().unwrap().clone();
    assert!(
        log.contains("cannot watch more processes through pidfds"),
        "{log}"
    );
    assert_eq!(
        log.matches("cannot watch more").count(),
        1,
        "warned once: {log}"
    );
}
