//! The reaper's life as every process that maps the table reads it, in one
//! process: `Absent` until a reaper serves, `Serving` with its boot token
//! and pid, `Absent` again when it stops, a new token for a new reaper; a
//! waiter woken by each change without polling; never `Dying` while the
//! reaper's process runs (the thread that built it may end); a table of the
//! previous layout read from the role alone. Kills across processes are in
//! `cli/tests/server_state.rs` and the C test.

mod common;

use common::{long_options, TempTable};
use livereg::{ReaperState, Table};
use std::os::unix::fs::FileExt;
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn serving(reaper: &livereg::Reaper) -> ReaperState {
    ReaperState::Serving {
        boot_token: reaper.boot_token(),
        pid: std::process::id(),
    }
}

/// A thread waiting up to 10 s for `table`'s reaper to leave `known`:
/// what it saw, and when.
fn waiter(table: &Table, known: ReaperState) -> mpsc::Receiver<(ReaperState, Instant)> {
    let (saw, seen) = mpsc::channel();
    let table = table.clone();
    std::thread::spawn(move || {
        let now = table.wait_reaper_state(known, Duration::from_secs(10));
        let _ = saw.send((now, Instant::now()));
    });
    // Let it sleep in its wait (a waiter that starts late sees the change
    // at once, which proves less).
    std::thread::sleep(Duration::from_millis(50));
    seen
}

#[test]
fn a_reaper_serves_with_its_token_and_a_new_one_has_a_new_token() {
    let temp = TempTable::new("life-states", &long_options());
    let other = Table::open(&temp.name).unwrap();
    assert_eq!(other.reaper_state(), ReaperState::Absent);
    let first = temp.table.reaper().build().unwrap();
    assert_eq!(other.reaper_state(), serving(&first));
    let token = first.boot_token();
    drop(first);
    assert_eq!(other.reaper_state(), ReaperState::Absent);
    let second = temp.table.reaper().build().unwrap();
    let now = other.reaper_state();
    assert_eq!(now, serving(&second));
    assert_ne!(now.boot_token(), Some(token), "a new reaper, a new token");
    assert_eq!(now.name(), "serving");
}

#[test]
fn a_waiter_is_woken_when_the_reaper_stops_and_when_a_new_one_serves() {
    let temp = TempTable::new("life-wait", &long_options());
    let other = Table::open(&temp.name).unwrap();
    let reaper = temp.table.reaper().build().unwrap();
    let before = serving(&reaper);

    let seen = waiter(&other, before);
    let stopped = Instant::now();
    drop(reaper);
    let (now, at) = seen.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(now, ReaperState::Absent);
    // Woken by the reaper's giving back its word, not by a look at the
    // clock (those are a second apart).
    assert!(
        at - stopped < Duration::from_millis(500),
        "{:?}",
        at - stopped
    );

    let seen = waiter(&other, ReaperState::Absent);
    let started = Instant::now();
    let reaper = temp.table.reaper().build().unwrap();
    let (now, at) = seen.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(now, serving(&reaper));
    assert_ne!(now, before, "a new boot token");
    assert!(
        at - started < Duration::from_millis(500),
        "{:?}",
        at - started
    );
}

#[test]
fn a_wait_with_nothing_changing_returns_the_known_state_when_its_time_is_up() {
    let temp = TempTable::new("life-idle", &long_options());
    let reaper = temp.table.reaper().build().unwrap();
    let started = Instant::now();
    let now = temp
        .table
        .wait_reaper_state(serving(&reaper), Duration::from_millis(100));
    assert_eq!(now, serving(&reaper));
    assert!(started.elapsed() >= Duration::from_millis(100));
    // Knowing something else already: returns at once.
    let started = Instant::now();
    let now = temp
        .table
        .wait_reaper_state(ReaperState::Absent, Duration::from_secs(10));
    assert_eq!(now, serving(&reaper));
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn the_thread_that_built_the_reaper_may_end_and_the_reaper_still_serves() {
    let temp = TempTable::new("life-thread", &long_options());
    let table = temp.table.clone();
    let reaper = std::thread::spawn(move || table.reaper().build().unwrap())
        .join()
        .unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(temp.table.reaper_state(), serving(&reaper));
}

#[test]
fn a_table_of_the_previous_layout_is_read_from_the_role_alone() {
    let temp = TempTable::new("life-earlier", &long_options());
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(format!("/dev/shm/{}", temp.name))
        .unwrap();
    let minor = livereg::VERSION_MINOR - 1;
    file.write_all_at(&minor.to_le_bytes(), 12).unwrap();
    let table = Table::open(&temp.name).unwrap();
    assert_eq!(table.reaper_state(), ReaperState::Absent);
    let seen = waiter(&table, ReaperState::Absent);
    let reaper = table.reaper().build().unwrap();
    let (now, _) = seen.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(now, serving(&reaper), "seen by its looks at the role");
    drop(reaper);
    assert_eq!(table.reaper_state(), ReaperState::Absent);
}

#[test]
fn a_table_in_memory_says_its_reaper_too() {
    let table = Table::in_memory(&long_options()).unwrap();
    assert_eq!(table.reaper_state(), ReaperState::Absent);
    let reaper = table.reaper().build().unwrap();
    assert_eq!(table.reaper_state(), serving(&reaper));
    let seen = waiter(&table, serving(&reaper));
    drop(reaper);
    let (now, _) = seen.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(now, ReaperState::Absent);
}

#[test]
fn a_session_says_serving_while_connected_absent_when_closed_and_a_new_token_on_its_return() {
    let temp = TempTable::new("life-session", &long_options());
    let socket = format!("/tmp/{}.sock", common::unique_name("life-session"));
    let address = format!("unix:{socket}");
    let listening = |table: &Table| {
        table
            .reaper()
            .listen(livereg::Address::parse(&address).unwrap(), None)
            .spawn()
            .unwrap()
    };
    let reaper = listening(&temp.table);
    let first = temp.table.reaper_state();
    let worker = livereg::connect(&address, 3, "w", &livereg::ConnectOptions::default()).unwrap();
    let serving = ReaperState::Serving {
        boot_token: first.boot_token().unwrap(),
        pid: 0,
    };
    assert_eq!(worker.reaper_state(), serving, "the pid is not said");
    reaper.stop().unwrap();
    let now = worker.wait_reaper_state(serving, Duration::from_secs(10));
    assert_eq!(now, ReaperState::Absent, "the connection's close");
    let reaper = listening(&temp.table);
    let now = worker.wait_reaper_state(ReaperState::Absent, Duration::from_secs(10));
    assert_eq!(now.name(), "serving");
    assert_eq!(now.boot_token(), temp.table.reaper_state().boot_token());
    assert_ne!(now.boot_token(), first.boot_token(), "a new reaper");
    worker.deregister().unwrap();
    reaper.stop().unwrap();
    let _ = std::fs::remove_file(&socket);
}
