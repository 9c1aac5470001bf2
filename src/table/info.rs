//! The info area: up to [`INFO_MAX`](crate::INFO_MAX) bytes a server
//! publishes in its table (a chunk size, an address, a model name) that
//! workers read without RPC. A sequence lock: writers (serialised by the
//! caller) make the sequence odd, write, and make it even again; a reader
//! copies between two reads of an even, unchanged sequence, so it never
//! returns a torn or half-written value. Over plain words so `loom` checks it.

use crate::sync::{fence, AtomicU64, Ordering};

/// Why a read found no stable value.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Unsettled;

/// Writes `bytes` (at most `words.len() * 8`, checked by the caller). A
/// writer that died mid-write left the sequence odd; the next one finishes
/// the job.
pub(crate) fn write(sequence: &AtomicU64, len: &AtomicU64, words: &[AtomicU64], bytes: &[u8]) {
    let odd = sequence.load(Ordering::Relaxed) | 1;
    sequence.store(odd, Ordering::Relaxed);
    // Release fence: a reader that sees any word below also sees the odd
    // sequence (and so retries), never a half-written value as stable.
    fence(Ordering::Release);
    for (at, word) in words.iter().enumerate() {
        let mut chunk = [0u8; 8];
        let from = (at * 8).min(bytes.len());
        let to = (at * 8 + 8).min(bytes.len());
        chunk[..to - from].copy_from_slice(&bytes[from..to]);
        word.store(u64::from_le_bytes(chunk), Ordering::Relaxed);
    }
    len.store(bytes.len() as u64, Ordering::Relaxed);
    // Release: a reader that sees the even sequence sees every word above.
    sequence.store(odd.wrapping_add(1), Ordering::Release);
}

/// One attempt at a consistent copy; `Err` while a writer is at work.
pub(crate) fn try_read(
    sequence: &AtomicU64,
    len: &AtomicU64,
    words: &[AtomicU64],
) -> Result<Vec<u8>, Unsettled> {
    let before = sequence.load(Ordering::Acquire);
    if before & 1 == 1 {
        return Err(Unsettled);
    }
    let length = (len.load(Ordering::Relaxed) as usize).min(words.len() * 8);
    let mut bytes = Vec::with_capacity(words.len() * 8);
    for word in words {
        bytes.extend_from_slice(&word.load(Ordering::Relaxed).to_le_bytes());
    }
    // Acquire fence: the words above were read before the sequence below.
    fence(Ordering::Acquire);
    if sequence.load(Ordering::Relaxed) != before {
        return Err(Unsettled);
    }
    bytes.truncate(length);
    Ok(bytes)
}

#[cfg(not(loom))]
mod table {
    use super::{try_read, write};
    use crate::error::{Error, Result};
    use crate::os::fork::LockDescriptor;
    use crate::os::lock;
    use crate::table::handle::Table;
    use crate::table::layout::{InfoArea, INFO_MAX, INFO_SINCE_MINOR, VERSION_MINOR};
    use std::time::{Duration, Instant};

    /// How long a reader waits for a writer to finish.
    const READ_WAIT: Duration = Duration::from_secs(1);
    /// Spins before a reader sleeps: a write takes well under a microsecond.
    const READ_SPINS: u32 = 100;
    /// A reader's sleep between looks once spinning did not do.
    const READ_BACKOFF: Duration = Duration::from_millis(1);

    impl Table {
        /// Publishes `bytes` (at most [`INFO_MAX`], 1,024) in the table's info
        /// area, replacing what was there: configuration every worker reads
        /// with [`Table::info`], without RPC. Writers are serialised (across
        /// processes); readers never see a half-written value.
        ///
        /// # Errors
        ///
        /// - [`Error::InvalidArgument`]: more than 1,024 bytes.
        /// - [`Error::Incompatible`]: a table of layout 1.0 or 1.1 (no info area).
        /// - [`Error::Corrupt`]: the object was truncated.
        /// - [`Error::Busy`]: another writer held the table's writer lock for
        ///   over five seconds.
        ///
        /// # Examples
        ///
        /// ```
        /// use livereg::{Table, TableOptions};
        ///
        /// let table = Table::in_memory(&TableOptions::default())?;
        /// table.set_info(br#"{"chunk_size": 256}"#)?;
        /// assert_eq!(table.info()?, br#"{"chunk_size": 256}"#);
        /// # Ok::<(), livereg::Error>(())
        /// ```
        pub fn set_info(&self, bytes: &[u8]) -> Result<()> {
            if bytes.len() > INFO_MAX {
                return Err(Error::InvalidArgument(format!(
                    "info is {} bytes, expected at most {INFO_MAX}",
                    bytes.len()
                )));
            }
            let area = self.info_area()?;
            let inner = &self.memory;
            let own = match inner.file() {
                Some(file) => Some(LockDescriptor::new(lock::reopen(file).map_err(|e| {
                    Error::os(&inner.name, "open a descriptor for the writer lock", e)
                })?)),
                None => None,
            };
            let _writer = inner
                .lock_registrations(own.as_deref(), crate::table::locks::REGISTRATION_LOCK_WAIT)?;
            write(&area.sequence, &area.len, &area.data, bytes);
            Ok(())
        }

        /// The bytes last published with [`Table::set_info`] (empty if none), a
        /// consistent copy read without locks.
        ///
        /// # Errors
        ///
        /// - [`Error::Incompatible`]: a table of layout 1.0 or 1.1 (no info area).
        /// - [`Error::Corrupt`]: the object was truncated.
        /// - [`Error::Busy`]: a writer has not finished for a second (one that
        ///   died mid-write leaves the area so until the next `set_info`).
        pub fn info(&self) -> Result<Vec<u8>> {
            let area = self.info_area()?;
            let started = Instant::now();
            let mut attempts = 0u32;
            loop {
                if let Ok(bytes) = try_read(&area.sequence, &area.len, &area.data) {
                    return Ok(bytes);
                }
                if started.elapsed() >= READ_WAIT {
                    return Err(Error::busy(format!(
                        "table '{}': a writer of the info area has not finished for {READ_WAIT:?} \
                         (one that died mid-write leaves it so until the next set_info)",
                        self.memory.name
                    )));
                }
                attempts += 1;
                if attempts < READ_SPINS {
                    std::hint::spin_loop();
                } else {
                    std::thread::sleep(READ_BACKOFF);
                }
            }
        }

        /// The info area as it is now, read once: `None` while a writer is
        /// at work in it (a listener never waits on another process).
        ///
        /// # Errors
        ///
        /// As [`Table::info`], but never `Busy`.
        pub(crate) fn info_now(&self) -> Result<Option<Vec<u8>>> {
            let area = self.info_area()?;
            Ok(try_read(&area.sequence, &area.len, &area.data).ok())
        }

        fn info_area(&self) -> Result<&InfoArea> {
            self.memory.check_size()?;
            self.memory.info_area().ok_or_else(|| {
                Error::Incompatible(format!(
                    "table '{}': layout 1.{} has no info area, expected 1.{INFO_SINCE_MINOR} or later \
                     (this build creates 1.{VERSION_MINOR}; recreate the table to publish info)",
                    self.memory.name, self.memory.minor
                ))
            })
        }
    }
}
