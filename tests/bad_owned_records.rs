//! A hostile or broken `NAME.owned`: records forged by anyone who may write
//! the table never make the reaper remove a file outside its rules, a file
//! of the wrong size is never used, one cut short (even while the reaper
//! reads it) never faults it, the allowed directories come only from a
//! file the table's owner alone may write, and hostile records cost a
//! round a bounded amount of work.

mod common;
#[path = "common/owned_forgery.rs"]
mod owned_forgery;

use common::{long_options, unique_name, TempTable};
use livereg::{Error, OwnedFilesStatus, Reaper, Table, TableOptions};
use owned_forgery::{file_at, file_record, forge, owner_at, owner_record};
use std::fs::OpenOptions;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The records' file of `temp`'s table.
fn records_path(temp: &TempTable) -> PathBuf {
    owned_forgery::records_path(&temp.name)
}

/// Owner record `owner` held by a root process (pid 1, uid 0, no groups)
/// that has no lock: ended, as the reaper sees it.
fn forge_ended_owner(temp: &TempTable, owner: u64) {
    forge(&temp.name, owner_at(owner), &owner_record(0, &[]));
}

/// File record `file` of owner `owner` (see [`file_record`]).
fn forge_file(temp: &TempTable, owner: u64, file: u64, dir: u32, name: &[u8], like: &Path) {
    forge(
        &temp.name,
        file_at(owner, file),
        &file_record(dir, name, like),
    );
}

/// What `table` says of its owned files.
fn owned_in(table: &Table) -> OwnedFilesStatus {
    table.status().unwrap().owned_files.unwrap()
}

/// Scans until `done` holds of the owned files (the reaper's thread
/// removes and refuses between scans).
fn scan_until(reaper: &mut Reaper, done: impl Fn(&OwnedFilesStatus) -> bool) -> OwnedFilesStatus {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        reaper.scan().unwrap();
        let owned = owned_in(reaper.table());
        if done(&owned) {
            return owned;
        }
        assert!(Instant::now() < deadline, "never settled: {owned:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A file in /dev/shm, removed on drop.
struct ShmFile(PathBuf);

impl Drop for ShmFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn forged_records_never_reach_past_their_directory_or_their_file() {
    let temp = TempTable::new("owned-forged", &long_options());
    let victim = ShmFile(Path::new("/dev/shm").join(unique_name("victim")));
    std::fs::write(&victim.0, b"keep me").unwrap();
    let elsewhere = std::env::temp_dir().join(unique_name("elsewhere"));
    std::fs::write(&elsewhere, b"keep me too").unwrap();
    forge_ended_owner(&temp, 3);
    // A name with a slash, '..', '.', an empty name, a directory index no
    // creator allowed, each with a real file's identity.
    let upward = format!("../{}", elsewhere.display());
    forge_file(&temp, 3, 0, 0, upward.as_bytes(), &elsewhere);
    forge_file(&temp, 3, 1, 0, b"..", &victim.0);
    forge_file(&temp, 3, 2, 0, b".", &victim.0);
    forge_file(&temp, 3, 3, 0, b"", &victim.0);
    forge_file(&temp, 3, 4, 9, b"x", &victim.0);
    // The victim's own name with another file's identity.
    let victim_name = victim.0.file_name().unwrap().as_encoded_bytes();
    forge_file(&temp, 3, 5, 0, victim_name, &elsewhere);
    let mut reaper = temp.table.reaper().build().unwrap();
    let owned = scan_until(&mut reaper, |owned| owned.owners.is_empty());
    assert!(reaper.scan().unwrap().removed_files.is_empty());
    assert_eq!(std::fs::read(&victim.0).unwrap(), b"keep me");
    assert_eq!(std::fs::read(&elsewhere).unwrap(), b"keep me too");
    assert_eq!((owned.removed_total, owned.refused_total), (0, 6));
    let _ = std::fs::remove_file(&elsewhere);
}

#[test]
fn records_planted_as_a_link_or_of_the_wrong_size_are_ignored_and_declaring_is_refused() {
    let temp = TempTable::new("owned-planted", &long_options());
    let target = std::env::temp_dir().join(unique_name("owned-planted-target"));
    std::fs::write(&target, vec![7u8; 4096]).unwrap();
    for plant in ["link", "size"] {
        std::fs::remove_file(records_path(&temp)).unwrap();
        match plant {
            "link" => std::os::unix::fs::symlink(&target, records_path(&temp)).unwrap(),
            _ => std::fs::write(records_path(&temp), b"not records").unwrap(),
        }
        let table = Table::open(&temp.name).unwrap();
        assert!(table.status().unwrap().owned_files.is_none(), "{plant}");
        match table.own_file("/dev/shm/anything") {
            Err(Error::Incompatible(message)) => {
                let found = match plant {
                    "link" => "is a symbolic link",
                    _ => "a regular file of 11 bytes",
                };
                assert!(
                    message.contains("owned-file records")
                        && message.contains(records_path(&temp).to_str().unwrap())
                        && message.contains(found),
                    "{plant}: {message}"
                );
            }
            other => panic!("expected Incompatible, got {other:?}"),
        }
        let mut reaper = table.reaper().build().unwrap();
        for _ in 0..3 {
            assert!(reaper.scan().unwrap().removed_files.is_empty());
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    assert_eq!(std::fs::read(&target).unwrap(), vec![7u8; 4096]);
    std::fs::remove_file(&target).unwrap();
}

#[test]
fn records_truncated_under_a_handle_are_never_touched() {
    let temp = TempTable::new("owned-truncated", &long_options());
    let file = OpenOptions::new()
        .write(true)
        .open(records_path(&temp))
        .unwrap();
    file.set_len(100).unwrap();
    assert!(matches!(
        temp.table.own_file("/dev/shm/anything"),
        Err(Error::Corrupt(_))
    ));
    assert!(temp.table.status().unwrap().owned_files.is_none());
    let mut reaper = temp.table.reaper().build().unwrap();
    assert!(reaper.scan().unwrap().removed_files.is_empty());
}

/// A directory in the temporary directory (on disk), removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str, mode: u32) -> TempDir {
        let dir = TempDir(std::env::temp_dir().join(unique_name(tag)));
        std::fs::create_dir(&dir.0).unwrap();
        std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(mode)).unwrap();
        dir
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The allowed directories' file of `temp`'s table.
fn dirs_path(temp: &TempTable) -> PathBuf {
    PathBuf::from(format!("/dev/shm/{}.owned-dirs", temp.name))
}

#[test]
fn allowed_directories_are_believed_only_from_a_file_the_table_owner_alone_may_write() {
    let temp = TempTable::new("owned-dirs-planted", &long_options());
    let elsewhere = TempDir::new("owned-elsewhere", 0o755);
    let victim = elsewhere.0.join("precious");
    std::fs::write(&victim, b"keep me").unwrap();
    let widened = format!(
        "livereg owned-file directories 1\n/dev/shm\n{}\n",
        elsewhere.0.display()
    );
    let decoy = elsewhere.0.join("decoy");
    std::fs::write(&decoy, &widened).unwrap();
    let plants = [
        ("another user's", "belongs to uid 65534"),
        ("group-writable", "may be written by its group or others"),
        ("link", "symbolic link"),
        ("malformed", "does not start"),
    ];
    for (plant, expected) in plants {
        let path = dirs_path(&temp);
        std::fs::remove_file(&path).unwrap();
        match plant {
            "another user's" => {
                std::fs::write(&path, &widened).unwrap();
                std::os::unix::fs::lchown(&path, Some(65_534), None).unwrap();
            }
            "group-writable" => {
                std::fs::write(&path, &widened).unwrap();
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o664)).unwrap();
            }
            "link" => std::os::unix::fs::symlink(&decoy, &path).unwrap(),
            _ => std::fs::write(&path, elsewhere.0.as_os_str().as_encoded_bytes()).unwrap(),
        }
        let table = Table::open(&temp.name).unwrap();
        let owned = owned_in(&table);
        assert!(owned.dirs.is_empty(), "{plant}: {owned:?}");
        let refused = owned.dirs_refused.clone().unwrap_or_default();
        assert!(refused.contains(expected), "{plant}: {refused}");
        match table.own_file(&victim) {
            Err(Error::InvalidArgument(message)) => {
                assert!(message.contains(expected), "{plant}: {message}")
            }
            other => panic!("{plant}: expected InvalidArgument, got {other:?}"),
        }
        // A record naming the victim in the directory the plant would add.
        forge_ended_owner(&temp, 0);
        forge_file(&temp, 0, 0, 1, b"precious", &victim);
        let mut reaper = table.reaper().build().unwrap();
        let owned = scan_until(&mut reaper, |owned| owned.owners.is_empty());
        assert_eq!(owned.removed_total, 0, "{plant}");
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep me", "{plant}");
    }
}

/// `bytes` as a `printf` format writing exactly them (octal escapes).
fn printf_bytes(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("\\{b:03o}")).collect()
}

#[test]
fn a_group_writer_of_a_root_table_can_neither_widen_its_directories_nor_have_a_file_removed_there()
{
    // Root's table, mode 660, group 65534; root's directory the creator
    // never allowed, with root's file in it.
    let options = TableOptions {
        mode: 0o660,
        ..long_options()
    };
    let temp = TempTable::new("owned-group-writer", &options);
    for side in ["", ".owned", ".owned-dirs"] {
        let path = format!("/dev/shm/{}{side}", temp.name);
        std::os::unix::fs::chown(path, None, Some(65_534)).unwrap();
    }
    let dir = TempDir::new("owned-roots", 0o755);
    let victim = dir.0.join("precious");
    std::fs::write(&victim, b"keep me").unwrap();
    // As uid 65534 in the table's group: append the directory to the
    // allowed ones, or remove their file to make another; then plant an
    // ended root owner naming the victim in every directory index.
    let mut script = format!(
        "echo {dir} >> {dirs} 2>/dev/null && echo widened; rm -f {dirs} 2>/dev/null && echo removed; ",
        dir = dir.0.display(),
        dirs = dirs_path(&temp).display()
    );
    let mut writes = vec![(owner_at(0), owner_record(0, &[]))];
    for index in 0..4 {
        writes.push((
            file_at(0, index),
            file_record(index as u32, b"precious", &victim),
        ));
    }
    for (offset, bytes) in &writes {
        script += &format!(
            "printf '{}' | dd of={} bs=1 seek={offset} conv=notrunc status=none || echo refused; ",
            printf_bytes(bytes),
            records_path(&temp).display()
        );
    }
    let out = std::process::Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "sh",
            "-c",
            &script,
        ])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(
        !said.contains("widened") && !said.contains("removed"),
        "{said}"
    );
    assert!(
        !said.contains("refused"),
        "the records are the group's to write: {said}"
    );
    let mut reaper = temp.table.reaper().build().unwrap();
    let owned = scan_until(&mut reaper, |owned| owned.owners.is_empty());
    assert_eq!(owned.dirs, vec![PathBuf::from("/dev/shm")]);
    assert_eq!(owned.removed_total, 0);
    assert_eq!(std::fs::read(&victim).unwrap(), b"keep me");
}

/// Every owner record ended and every file record naming `name` in
/// `/dev/shm` with the identity of `like` (another file: each removal is
/// refused after a look), as one buffer from the first owner record on.
fn hostile_records(name: &[u8], like: &Path) -> Vec<u8> {
    let mut bytes = vec![0u8; (file_at(256, 0) - owner_at(0)) as usize];
    let file = file_record(0, name, like);
    for owner in 0..256 {
        let at = (owner_at(owner) - owner_at(0)) as usize;
        let record = owner_record(0, &[]);
        bytes[at..at + record.len()].copy_from_slice(&record);
        for slot in 0..64 {
            let at = (file_at(owner, slot) - owner_at(0)) as usize;
            bytes[at..at + file.len()].copy_from_slice(&file);
        }
    }
    bytes
}

#[test]
fn a_writer_cutting_the_records_short_while_the_reaper_reads_them_never_faults_it() {
    let temp = TempTable::new("owned-cut", &long_options());
    let victim = ShmFile(Path::new("/dev/shm").join(unique_name("owned-cut-victim")));
    std::fs::write(&victim.0, b"keep me").unwrap();
    let other = ShmFile(Path::new("/dev/shm").join(unique_name("owned-cut-other")));
    std::fs::write(&other.0, b"other").unwrap();
    let planted = hostile_records(victim.0.file_name().unwrap().as_encoded_bytes(), &other.0);
    let records = OpenOptions::new()
        .write(true)
        .open(records_path(&temp))
        .unwrap();
    let full = records.metadata().unwrap().len();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let cutter = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut cuts = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                use std::os::unix::fs::FileExt;
                records.write_all_at(&planted, owner_at(0)).unwrap();
                std::thread::sleep(Duration::from_millis(2));
                records.set_len(100).unwrap();
                std::thread::sleep(Duration::from_millis(1));
                records.set_len(full).unwrap();
                cuts += 1;
            }
            cuts
        })
    };
    let mut reaper = temp.table.reaper().build().unwrap();
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        reaper.scan().unwrap();
        let _ = temp.table.status().unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let cuts = cutter.join().unwrap();
    assert!(cuts > 10, "the records were cut short {cuts} times");
    assert_eq!(std::fs::read(&victim.0).unwrap(), b"keep me");
    let owned = scan_until(&mut reaper, |owned| owned.owners.is_empty());
    assert!(owned.refused_total > 0, "the reaper looked: {owned:?}");
}

#[test]
fn hostile_records_cost_a_round_at_most_its_budget_and_the_rest_waits_for_later_rounds() {
    let temp = TempTable::new("owned-budget", &long_options());
    let victim = ShmFile(Path::new("/dev/shm").join(unique_name("owned-budget-victim")));
    std::fs::write(&victim.0, b"keep me").unwrap();
    let other = ShmFile(Path::new("/dev/shm").join(unique_name("owned-budget-other")));
    std::fs::write(&other.0, b"other").unwrap();
    forge(
        &temp.name,
        owner_at(0),
        &hostile_records(victim.0.file_name().unwrap().as_encoded_bytes(), &other.0),
    );
    let mut reaper = temp.table.reaper().build().unwrap();
    reaper.scan().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while owned_in(&temp.table).refused_total == 0 {
        assert!(Instant::now() < deadline, "no round ran");
        std::thread::sleep(Duration::from_millis(5));
    }
    // No scan asked for another round: one round's work, and no more.
    std::thread::sleep(Duration::from_millis(200));
    let owned = owned_in(&temp.table);
    assert_eq!(owned.refused_total, 256, "one round's budget");
    assert_eq!(owned.owners.len(), 256 - 4);
    // Each later scan asks for one more round, until all are refused.
    let owned = scan_until(&mut reaper, |owned| owned.owners.is_empty());
    assert_eq!(owned.refused_total, 256 * 64);
    assert_eq!(std::fs::read(&victim.0).unwrap(), b"keep me");
}
