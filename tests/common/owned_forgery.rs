//! Owned-file records written by hand, as any process that may write a
//! table could write them: the layout of `NAME.owned` (owner records of 64
//! bytes after a 64-byte header, then 64 file records of 288 bytes per
//! owner), for the tests that forge what a declarer, or an attacker, wrote.
#![allow(dead_code)] // each test binary uses what it needs

use std::fs::OpenOptions;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

pub const OWNERS_AT: u64 = 64;
pub const OWNER_RECORD: u64 = 64;
pub const FILES_AT: u64 = OWNERS_AT + 256 * OWNER_RECORD;
pub const FILE_RECORD: u64 = 288;

/// The records' file of table `name`.
pub fn records_path(name: &str) -> PathBuf {
    PathBuf::from(format!("/dev/shm/{name}.owned"))
}

/// Where owner record `owner` is.
pub fn owner_at(owner: u64) -> u64 {
    OWNERS_AT + owner * OWNER_RECORD
}

/// Where file record `file` of owner `owner` is.
pub fn file_at(owner: u64, file: u64) -> u64 {
    FILES_AT + (owner * 64 + file) * FILE_RECORD
}

/// An owner record: held, pid 1, user `uid`, groups `groups`; no process
/// holds its lock, so the reaper takes its holder for ended.
pub fn owner_record(uid: u32, groups: &[u32]) -> Vec<u8> {
    [1u32, 1, uid, groups.len() as u32]
        .iter()
        .chain(groups)
        .flat_map(|word| word.to_le_bytes())
        .collect()
}

/// A file record: declared, in allowed directory `dir`, naming `name`
/// with the identity (device, inode, birth time) of the file at `like`.
pub fn file_record(dir: u32, name: &[u8], like: &Path) -> Vec<u8> {
    let meta = like.symlink_metadata().unwrap();
    let born = meta
        .created()
        .unwrap()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let mut record = Vec::new();
    record.extend(1u32.to_le_bytes());
    record.extend(dir.to_le_bytes());
    record.extend(meta.dev().to_le_bytes());
    record.extend(meta.ino().to_le_bytes());
    record.extend((born.as_nanos() as u64).to_le_bytes());
    record.push(name.len() as u8);
    record.extend(name);
    record
}

/// Writes `bytes` at `offset` of table `name`'s records.
pub fn forge(name: &str, offset: u64, bytes: &[u8]) {
    let file = OpenOptions::new()
        .write(true)
        .open(records_path(name))
        .unwrap();
    file.write_all_at(bytes, offset).unwrap();
}
