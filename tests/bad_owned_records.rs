//! A hostile or broken `NAME.owned`: records forged by anyone who may write
//! the table never make the reaper remove a file outside its rules, and a
//! file of the wrong size, or truncated under a handle, is never touched.

mod common;

use common::{long_options, unique_name, TempTable};
use livereg::{Error, Table};
use std::fs::OpenOptions;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

const OWNERS_AT: u64 = 4096;
const FILES_AT: u64 = OWNERS_AT + 256 * 64;

/// The records' file of `temp`'s table.
fn records_path(temp: &TempTable) -> PathBuf {
    PathBuf::from(format!("/dev/shm/{}.owned", temp.name))
}

/// Writes `bytes` at `offset` of the records.
fn forge(temp: &TempTable, offset: u64, bytes: &[u8]) {
    let file = OpenOptions::new()
        .write(true)
        .open(records_path(temp))
        .unwrap();
    file.write_all_at(bytes, offset).unwrap();
}

/// Owner record `owner` held by a root process (pid 1) that has no lock:
/// ended, as the reaper sees it.
fn forge_ended_owner(temp: &TempTable, owner: u64) {
    let mut record = Vec::new();
    for word in [1u32, 1, 0, 1] {
        record.extend(word.to_le_bytes());
    }
    forge(temp, OWNERS_AT + owner * 64, &record);
}

/// File record `file` of owner `owner`: declared, in directory `dir`,
/// naming `name` with the identity of `like`.
fn forge_file(temp: &TempTable, owner: u64, file: u64, dir: u32, name: &[u8], like: &Path) {
    let meta = like.metadata().unwrap();
    let mut record = Vec::new();
    record.extend(1u32.to_le_bytes());
    record.extend(dir.to_le_bytes());
    record.extend(meta.dev().to_le_bytes());
    record.extend(meta.ino().to_le_bytes());
    record.push(name.len() as u8);
    record.extend(name);
    forge(temp, FILES_AT + (owner * 64 + file) * 288, &record);
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
    assert!(reaper.scan().unwrap().removed_files.is_empty());
    assert_eq!(std::fs::read(&victim.0).unwrap(), b"keep me");
    assert_eq!(std::fs::read(&elsewhere).unwrap(), b"keep me too");
    let owned = temp.table.status().unwrap().owned_files.unwrap();
    assert_eq!((owned.removed_total, owned.refused_total), (0, 6));
    assert!(owned.owners.is_empty(), "the forged record freed");
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
            Err(Error::Incompatible(message)) => assert!(message.contains("owned-file records")),
            other => panic!("expected Incompatible, got {other:?}"),
        }
        let mut reaper = table.reaper().build().unwrap();
        assert!(reaper.scan().unwrap().removed_files.is_empty());
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
