//! What the table's slots have no room for, about each session's
//! registration (see `crate::session`): the secret its client reclaims it with after a reconnect,
//! the peer's address and the host the client reports. A file beside the
//! table (`NAME.sessions`, mode 0600: the secrets are the reaper's; opened
//! without following a link and refused if another user could have planted
//! or read it, as `os::private_file` checks), one
//! 128-byte record per slot, written by the listener and read by `status`;
//! it outlives a reaper's restart, so the next one can check reclaims.
//! Heap tables keep the records with their memory, where every reaper of
//! the table finds them.

use crate::os::private_file;
use crate::table::handle::Table;
use crate::table::memory::TableMemory;
use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::sync::Mutex;
use std::sync::{Arc, Weak};

const RECORD_SIZE: usize = 128;
const MAGIC: &[u8; 4] = b"LRSS";
/// The bytes of a peer's description a record keeps.
const PEER_MAX: usize = 63;
/// The bytes of a reported host a record keeps (a session's `Hello` may
/// carry more).
const HOST_KEPT: usize = 31;

/// One session registration's record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Record {
    pub generation: u32,
    pub instance_id: u64,
    pub secret: u64,
    /// The peer's address as the listener saw it (`tcp` peers) or its
    /// credentials (`unix` peers: `pid=… uid=… gid=…`).
    pub peer: String,
    /// The host name the client reported (shortened to 31 bytes).
    pub host: String,
    /// The boot token of the reaper whose listener holds the session (0:
    /// none; the client is away, and may come back to reclaim it).
    pub holder: u64,
}

impl Record {
    fn encode(&self) -> [u8; RECORD_SIZE] {
        let mut out = [0u8; RECORD_SIZE];
        out[0..4].copy_from_slice(MAGIC);
        out[4..8].copy_from_slice(&self.generation.to_le_bytes());
        out[8..16].copy_from_slice(&self.instance_id.to_le_bytes());
        out[16..24].copy_from_slice(&self.secret.to_le_bytes());
        put_text(&mut out[24..24 + 1 + PEER_MAX], &self.peer);
        out[88..96].copy_from_slice(&self.holder.to_le_bytes());
        put_text(&mut out[96..96 + 1 + HOST_KEPT], &self.host);
        out
    }

    fn decode(bytes: &[u8]) -> Option<Record> {
        if bytes.len() < RECORD_SIZE || &bytes[0..4] != MAGIC {
            return None;
        }
        let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8"));
        Some(Record {
            generation: u32::from_le_bytes(bytes[4..8].try_into().expect("4")),
            instance_id: word(8),
            secret: word(16),
            peer: get_text(&bytes[24..24 + 1 + PEER_MAX]),
            holder: word(88),
            host: get_text(&bytes[96..96 + 1 + HOST_KEPT]),
        })
    }
}

/// Writes `text`, cut at a character boundary to fit, as a length byte and
/// its UTF-8.
fn put_text(field: &mut [u8], text: &str) {
    let kept = crate::text::prefix_within(text, field.len() - 1);
    field[0] = kept.len() as u8;
    field[1..1 + kept.len()].copy_from_slice(kept.as_bytes());
}

/// Reads a length byte and UTF-8 (a hostile file gives at worst a wrong or
/// lossy text).
fn get_text(field: &[u8]) -> String {
    let len = usize::from(field[0]).min(field.len() - 1);
    String::from_utf8_lossy(&field[1..1 + len]).into_owned()
}

/// The records of one table.
pub(crate) enum Records {
    File(File),
    Heap(HeapRecords),
}

/// What heap tables keep where a mapped one has its file beside it, by
/// their memory: every reaper of such a table in this process reads what an
/// earlier one wrote; forgotten with the memory.
static HEAP_RECORDS: Mutex<Vec<(Weak<TableMemory>, HeapRecords)>> = Mutex::new(Vec::new());

/// A heap table's records, as the bytes a file would hold.
type HeapRecords = Arc<Mutex<Vec<u8>>>;

/// The records of the heap table whose memory is `memory`.
fn heap_records(memory: &Arc<TableMemory>) -> HeapRecords {
    let mut all = lock(&HEAP_RECORDS);
    all.retain(|(table, _)| table.strong_count() > 0);
    if let Some((_, records)) = all
        .iter()
        .find(|(table, _)| std::ptr::eq(table.as_ptr(), Arc::as_ptr(memory)))
    {
        return records.clone();
    }
    let records = Arc::new(Mutex::new(Vec::new()));
    all.push((Arc::downgrade(memory), records.clone()));
    records
}

impl Records {
    /// The records of `table`, created if missing (for a listener).
    pub(crate) fn open(table: &Table) -> std::io::Result<Records> {
        let Some(path) = table.path() else {
            return Ok(Records::Heap(heap_records(&table.memory)));
        };
        let file = private_file::open_or_create(&crate::table::location::sessions_beside(&path))?;
        Ok(Records::File(file))
    }

    /// Every record of a table's file, by slot (empty if there is none, it
    /// cannot be read, or it is not the table owner's own): for `status`.
    pub(crate) fn read_all(table: &Table) -> HashMap<u32, Record> {
        let (Some(path), Some(owner)) = (
            table.path(),
            table.memory.file().and_then(|f| f.metadata().ok()),
        ) else {
            return HashMap::new();
        };
        let beside = crate::table::location::sessions_beside(&path);
        let mut bytes = Vec::new();
        let read = private_file::open_owned_by(&beside, owner.uid())
            .and_then(|mut file| file.read_to_end(&mut bytes));
        if read.is_err() {
            return HashMap::new();
        }
        bytes
            .chunks(RECORD_SIZE)
            .enumerate()
            .filter_map(|(index, chunk)| Some((index as u32, Record::decode(chunk)?)))
            .collect()
    }

    pub(crate) fn write(&self, index: u32, record: &Record) -> std::io::Result<()> {
        match self {
            Records::File(file) => {
                file.write_all_at(&record.encode(), index as u64 * RECORD_SIZE as u64)
            }
            Records::Heap(records) => {
                let mut bytes = lock(records);
                let at = index as usize * RECORD_SIZE;
                if bytes.len() < at + RECORD_SIZE {
                    bytes.resize(at + RECORD_SIZE, 0);
                }
                bytes[at..at + RECORD_SIZE].copy_from_slice(&record.encode());
                Ok(())
            }
        }
    }

    /// Marks the record of `(index, generation)` held by the reaper of
    /// `holder` (0: by none), if it is that registration's.
    pub(crate) fn set_holder(&self, index: u32, generation: u32, holder: u64) {
        if let Some(mut record) = self.read(index).filter(|r| r.generation == generation) {
            record.holder = holder;
            let _ = self.write(index, &record);
        }
    }

    pub(crate) fn read(&self, index: u32) -> Option<Record> {
        match self {
            Records::File(file) => {
                let mut bytes = [0u8; RECORD_SIZE];
                file.read_exact_at(&mut bytes, index as u64 * RECORD_SIZE as u64)
                    .ok()?;
                Record::decode(&bytes)
            }
            Records::Heap(records) => {
                let bytes = lock(records);
                let at = index as usize * RECORD_SIZE;
                Record::decode(bytes.get(at..at + RECORD_SIZE)?)
            }
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_with_long_texts_cut_at_a_character() {
        let record = Record {
            generation: 7,
            instance_id: u64::MAX,
            secret: 0x1234_5678_9ABC_DEF0,
            peer: "tcp 10.0.0.1:40000".into(),
            host: "é".repeat(30),
            holder: 9,
        };
        let back = Record::decode(&record.encode()).unwrap();
        assert_eq!(back.host, "é".repeat(15));
        assert_eq!(
            back,
            Record {
                host: "é".repeat(15),
                ..record
            }
        );
        assert_eq!(Record::decode(&[0u8; RECORD_SIZE]), None);
        let mut hostile = [0xFFu8; RECORD_SIZE];
        hostile[..4].copy_from_slice(MAGIC);
        let read = Record::decode(&hostile).unwrap();
        assert!(read.peer.chars().count() <= PEER_MAX);
    }
}
