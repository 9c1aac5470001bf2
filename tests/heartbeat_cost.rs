//! The heartbeat path makes no system call and no allocation: a million
//! beats, run under `strace -f -c`, add no system calls over zero beats, and a
//! counting allocator sees no allocation during them.

mod common;

use common::TempTable;
use std::alloc::{GlobalAlloc, Layout, System};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards every call to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const BEATS: u64 = 1_000_000;

/// Not a test: beats `LIVEREG_HELPER_BEATS` times on the named table, run
/// under strace by `a_million_heartbeats_make_no_system_call`.
#[test]
#[ignore = "helper process, run under strace by the test below"]
fn helper_beats() {
    let name = std::env::var("LIVEREG_HELPER_TABLE").expect("run by the test below");
    let beats: u64 = std::env::var("LIVEREG_HELPER_BEATS")
        .unwrap()
        .parse()
        .unwrap();
    let table = livereg::Table::open(&name).unwrap();
    let worker = table.register(beats + 1, "beats").unwrap();
    // The process's death thread claims its word just after the first
    // registration (allocating, calling the kernel): not the beats' doing.
    while !table
        .status()
        .unwrap()
        .registrations
        .iter()
        .any(|r| r.death_word)
    {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    // (and then parks: let it get there.)
    std::thread::sleep(std::time::Duration::from_millis(100));
    worker.heartbeat().unwrap();
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    for _ in 0..beats {
        worker.heartbeat().unwrap();
    }
    let allocations = ALLOCATIONS.load(Ordering::Relaxed) - before;
    worker.deregister().unwrap();
    assert_eq!(allocations, 0, "the heartbeat allocated");
}

/// Total system calls of the helper making `beats` heartbeats.
fn syscalls(table: &str, beats: u64) -> u64 {
    let report =
        std::env::temp_dir().join(format!("livereg-strace-{}-{beats}", std::process::id()));
    let output = Command::new("strace")
        .args(["-f", "-c", "-o"])
        .arg(&report)
        .arg(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "helper_beats", "--test-threads=1"])
        .env("LIVEREG_HELPER_TABLE", table)
        .env("LIVEREG_HELPER_BEATS", beats.to_string())
        .output()
        .expect("strace is installed (.ci/run installs it)");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stdout)
    );
    let summary = std::fs::read_to_string(&report).unwrap();
    let _ = std::fs::remove_file(&report);
    let total = summary
        .lines()
        .find(|l| l.trim_end().ends_with("total"))
        .expect("strace summary");
    // "100.00    0.001234           1      1234        12 total": calls is the
    // 4th column.
    total.split_whitespace().nth(3).unwrap().parse().unwrap()
}

#[test]
fn a_million_heartbeats_make_no_system_call_and_no_allocation() {
    let temp = TempTable::new("syscalls", &common::options());
    let idle = syscalls(&temp.name, 0);
    let busy = syscalls(&temp.name, BEATS);
    // Everything around the loop is the same in both runs; a call per beat
    // would add a million.
    assert!(
        busy < idle + 100,
        "{BEATS} beats made {} more system calls than none ({idle})",
        busy - idle.min(busy)
    );
}
