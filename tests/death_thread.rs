//! The death thread's life in one process (a test binary of its own: it
//! counts this process's threads): started, parked, by opening a shared
//! table, woken by registrations (one thread however often the process
//! registers again), ended when the table is closed; none where turned
//! off.

mod common;

use common::{long_options, wait_for_death_word, TempTable};
use livereg::Table;
use std::time::{Duration, Instant};

/// This process's threads named `livereg-death`.
fn death_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .filter(|name| name.trim() == "livereg-death")
        .count()
}

/// Waits until `death_threads()` is `count`.
fn until_threads(count: usize, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while death_threads() != count {
        assert!(
            Instant::now() < deadline,
            "{what}: {} threads",
            death_threads()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn one_thread_per_open_table_from_its_opening_until_it_is_closed() {
    let temp = TempTable::new("death-thread-life", &long_options());
    until_threads(1, "the creator's handle");
    let table = Table::open(&temp.name).unwrap();
    until_threads(2, "and the opened one's");
    for id in 1..=3 {
        let worker = table.register(id, "again").unwrap();
        wait_for_death_word(&table, id);
        until_threads(2, "no thread more for a registration");
        worker.deregister().unwrap();
        until_threads(2, "parked after the last deregistration");
    }
    drop(table);
    until_threads(1, "the opened table closed");
    // Turned off (read at open): no thread, and registrations without a word.
    std::env::set_var("LIVEREG_NO_DEATH_THREAD", "1");
    let off = Table::open(&temp.name).unwrap();
    std::env::remove_var("LIVEREG_NO_DEATH_THREAD");
    let worker = off.register(9, "off").unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(death_threads(), 1, "the creator's handle only");
    let status = off.status().unwrap();
    let registration = status.registrations.iter().find(|r| r.instance_id == 9);
    assert!(!registration.expect("registered").death_word);
    drop((worker, off));
    drop(temp);
    until_threads(0, "both closed");
}
