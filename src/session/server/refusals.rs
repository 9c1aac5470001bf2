//! Sessions a reaper's listeners refused, counted by result code: a wrong
//! token (`PERMISSION`), a source waiting after failed handshakes (`BUSY`),
//! another protocol version (`INCOMPATIBLE`), a full table (`FULL`)… For a
//! server's metrics, beside its table's.

use crate::error::RESULT_CODES;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

/// The counts of one reaper's refusals; clones count into the same.
///
/// # Examples
///
/// ```
/// use livereg::{Table, TableOptions};
///
/// let table = Table::in_memory(&TableOptions::default())?;
/// let reaper = table.reaper().spawn()?;
/// let refusals = reaper.session_refusals();
/// assert_eq!(refusals.count("PERMISSION"), 0);
/// # Ok::<(), livereg::Error>(())
/// ```
#[derive(Clone, Debug, Default)]
pub struct SessionRefusals(Arc<[AtomicU64; RESULT_CODES.len()]>);

impl SessionRefusals {
    /// Counts one refusal answered with result code `code`.
    pub(crate) fn refused(&self, code: u32) {
        if let Some(count) = self.0.get(code as usize) {
            count.fetch_add(1, Relaxed);
        }
    }

    /// Refusals with result code `name` (`"PERMISSION"`, as
    /// [`ResultCode::name`](crate::ResultCode::name)); 0 for a name no code has.
    pub fn count(&self, name: &str) -> u64 {
        RESULT_CODES
            .iter()
            .position(|code| code.name == name)
            .map_or(0, |index| self.0[index].load(Relaxed))
    }

    /// `(result code name, refusals)` for every code refused at least once,
    /// and for `PERMISSION` and `BUSY` (what an attack on a listener shows
    /// as) always, in code order.
    pub fn by_code(&self) -> Vec<(&'static str, u64)> {
        RESULT_CODES
            .iter()
            .zip(self.0.iter())
            .map(|(code, count)| (code.name, count.load(Relaxed)))
            .filter(|(name, count)| *count > 0 || matches!(*name, "PERMISSION" | "BUSY"))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    #[test]
    fn refusals_are_counted_by_the_code_the_client_was_told() {
        let refusals = SessionRefusals::default();
        let counted = refusals.clone();
        counted.refused(Error::Permission(String::new()).code());
        counted.refused(Error::Permission(String::new()).code());
        counted.refused(Error::full(String::new()).code());
        counted.refused(9999); // no such code: not counted, no panic
        assert_eq!(refusals.count("PERMISSION"), 2);
        assert_eq!(refusals.count("NOT_A_CODE"), 0);
        assert_eq!(
            refusals.by_code(),
            vec![("FULL", 1), ("PERMISSION", 2), ("BUSY", 0)]
        );
    }
}
