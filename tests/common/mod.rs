//! Helpers shared by the integration tests.
#![allow(dead_code)]

use livereg::{
    Clock, DropEvent, HandlerError, ManualClock, Reaper, ReaperThread, Table, TableOptions,
};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A table in /dev/shm with a name no other test uses, unlinked on drop.
pub struct TempTable {
    pub name: String,
    pub table: Table,
}

impl TempTable {
    pub fn new(tag: &str, options: &TableOptions) -> TempTable {
        let name = unique_name(tag);
        let table = Table::create(&name, options).expect("create a test table");
        TempTable { name, table }
    }
}

impl Drop for TempTable {
    fn drop(&mut self) {
        let _ = Table::unlink(&self.name);
    }
}

/// Unlinks a name on drop (for tables a test creates by other means).
pub struct UnlinkOnDrop(pub String);

impl Drop for UnlinkOnDrop {
    fn drop(&mut self) {
        let _ = Table::unlink(&self.0);
    }
}

pub fn unique_name(tag: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "livereg-test-{tag}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

pub const SECOND: u64 = 1_000_000_000;

/// Options with a 1 s timeout and a 3 s grace.
pub fn options() -> TableOptions {
    TableOptions {
        capacity: 8,
        reap_timeout: Duration::from_secs(1),
        registration_grace: Duration::from_secs(3),
        ..TableOptions::default()
    }
}

/// Records every drop event a reaper's handler sees.
#[derive(Clone, Default)]
pub struct Recorder(pub Arc<Mutex<Vec<DropEvent>>>);

impl Recorder {
    /// A drop handler that records into this recorder.
    pub fn handler(
        &self,
    ) -> impl Fn(&DropEvent) -> Result<(), HandlerError> + Send + Sync + 'static {
        let sink = self.0.clone();
        move |event| {
            sink.lock().unwrap().push(event.clone());
            Ok(())
        }
    }

    pub fn events(&self) -> Vec<DropEvent> {
        self.0.lock().unwrap().clone()
    }

    pub fn reasons(&self) -> Vec<(u64, livereg::Reason)> {
        self.events()
            .iter()
            .map(|e| (e.instance_id, e.reason))
            .collect()
    }
}

/// A heap table on a manual clock at 100 s, with a recording reaper.
pub fn manual_setup(options: &TableOptions) -> (Table, ManualClock, Reaper, Recorder) {
    let manual = Clock::manual(100 * SECOND);
    let table = Table::in_memory(options)
        .unwrap()
        .with_clock(manual.clock());
    let recorder = Recorder::default();
    let reaper = table.reaper().on_drop(recorder.handler()).build().unwrap();
    (table, manual, reaper, recorder)
}

/// Options with a 30 s timeout and grace: only exit detection (or an explicit
/// ending) can end a registration within a test's time.
pub fn long_options() -> TableOptions {
    TableOptions {
        reap_timeout: Duration::from_secs(30),
        registration_grace: Duration::from_secs(30),
        ..TableOptions::default()
    }
}

/// A reaper thread on `table` that sends each drop event, with the time it
/// was handled, to the returned channel.
pub fn reaper_with_channel(table: &Table) -> (ReaperThread, mpsc::Receiver<(DropEvent, Instant)>) {
    let (sender, events) = mpsc::channel();
    let reaper = table
        .reaper()
        .on_drop(move |event| Ok(sender.send((event.clone(), Instant::now()))?))
        .spawn()
        .unwrap();
    (reaper, events)
}

/// Runs the ignored test `helper` of this test binary in a child process, as a
/// helper acting on table `table` (`LIVEREG_HELPER_TABLE`), its stdout piped.
pub fn spawn_helper(helper: &str, table: &str) -> std::process::Child {
    std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            helper,
            "--nocapture",
            "--test-threads=1",
        ])
        .env("LIVEREG_HELPER_TABLE", table)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn the helper")
}

/// Takes the table's registration lock through a descriptor of this test's
/// own, as a registrant stopped in the middle of registering holds it;
/// released when the file is dropped.
pub fn hold_registration_lock(table: &str) -> std::fs::File {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/dev/shm/{table}"))
        .unwrap();
    // SAFETY: a zeroed `flock` is valid; the fields F_OFD_SETLK reads are set below.
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = libc::F_WRLCK as i16;
    lock.l_whence = libc::SEEK_SET as i16;
    lock.l_start = (1i64 << 40) - 2; // the registration lock's byte
    lock.l_len = 1;
    // SAFETY: `file` is open; `lock` is a valid flock with l_pid 0.
    let taken = unsafe {
        libc::fcntl(
            std::os::fd::AsRawFd::as_raw_fd(&file),
            libc::F_OFD_SETLK,
            &mut lock,
        )
    };
    assert_eq!(taken, 0, "{}", std::io::Error::last_os_error());
    file
}

/// Waits until instance `id`'s registration in `table` has its process's
/// death word (the death thread claims it just after the first
/// registration).
pub fn wait_for_death_word(table: &Table, id: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !table
        .status()
        .unwrap()
        .registrations
        .iter()
        .any(|r| r.instance_id == id && r.death_word)
    {
        assert!(Instant::now() < deadline, "no death word for {id}");
        std::thread::sleep(Duration::from_millis(2));
    }
}
