//! The status of a table this process cannot map: asked of the reaper's
//! listener over a session, answered as the table's own status.

use crate::error::{Error, Result};
use crate::session::{ask_status, ConnectOptions};
use crate::status::report::Status;

/// The status of the table behind the listener at `address`, with only
/// the registrations of `instance` (none if `None`): what `status` and
/// `probe` show for a process that cannot map the table. Registers nothing.
///
/// # Errors
///
/// As [`connect`](crate::connect): a bad address, a refused token, no
/// answer in time, a failed connection; [`Error::Incompatible`] for an
/// answer that is not a status.
pub fn remote_status(
    address: &str,
    instance: Option<u64>,
    options: &ConnectOptions,
) -> Result<Status> {
    let json = ask_status(address, instance, options)?;
    serde_json::from_str(&json).map_err(|e| {
        Error::Incompatible(format!(
            "session {address}: the answer is not a status: {e}"
        ))
    })
}
