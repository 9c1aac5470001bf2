//! The client of a session: `connect` registers through a reaper's listener
//! and returns an ordinary [`Worker`]. Its heartbeats, busy marks and
//! progress go to a slot (the same code as a local registration: no system
//! call, no lock): over `unix:` with a listener of protocol 4, in the region
//! the listener shared, which it reads itself; otherwise in this process's
//! own memory, and a sender thread forwards what changed. The sender hears
//! the reaper's eviction notice either way, and writes it into that slot,
//! so the next heartbeat returns `Evicted` with the reason.

use super::dial::{exchange, request_clear, tls_for, unexpected, Dialer};
use super::sender::SessionLink;
use crate::error::Result;
use crate::session::address::Address;
use crate::session::tls::TlsClient;
use crate::session::wire::{Frame, VERSION};
use crate::table::handle::Table;
use crate::table::options::TableOptions;
use crate::worker::handle::Worker;
use std::time::Duration;

/// How a session is opened.
#[derive(Clone, Default)]
pub struct ConnectOptions {
    /// The listener's token (`tcp://` listeners require one).
    pub token: Option<Vec<u8>>,
    /// How long to wait for the connection and the listener's answer
    /// (`None`: [`DEFAULT_CONNECT_TIMEOUT`]).
    pub connect_timeout: Option<Duration>,
    /// For `tls://` addresses (required there, refused elsewhere): the CA
    /// the listener's certificate must chain to, and this client's
    /// certificate if the listener requires one.
    pub tls: Option<TlsClient>,
}

impl std::fmt::Debug for ConnectOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectOptions")
            .field(
                "token",
                &self.token.as_ref().map(|t| format!("<{} bytes>", t.len())),
            )
            .field("connect_timeout", &self.connect_timeout)
            .field("tls", &self.tls)
            .finish()
    }
}

/// How long [`connect`] waits by default.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Registers `instance_id` through the listener at `address` (`unix:PATH` or
/// `tcp://HOST:PORT`) and returns its worker handle: `heartbeat`,
/// `set_busy`, `progress` and `deregister` work as for a registration in a
/// mapped table, and cost the same. Over `unix:` with a listener of
/// protocol 4, they land in a region the listener shared, which it reads
/// itself, and this process's death is seen as it begins (the reaper's
/// `on_dying`); otherwise a sender thread forwards them to the reaper
/// several times per reap timeout. If the connection breaks, the sender
/// reconnects with backoff and takes the same registration back (the
/// heartbeats go on meanwhile); if it cannot within the reap timeout, the
/// next heartbeat returns `Evicted` (reason `disconnected`).
///
/// # Errors
///
/// - [`Error::InvalidArgument`](crate::Error::InvalidArgument): a bad address, instance id 0, a bad label.
/// - What the listener refused with: [`Error::Exists`](crate::Error::Exists) (the id is live),
///   [`Error::Permission`](crate::Error::Permission) (a wrong token), [`Error::Full`](crate::Error::Full),
///   [`Error::Busy`](crate::Error::Busy) (the id's previous drop is pending), …
/// - [`Error::Timeout`](crate::Error::Timeout): no answer within the connect timeout.
/// - [`Error::Io`](crate::Error::Io): the connection failed or closed before an answer.
///
/// # Examples
///
/// ```
/// use livereg::{connect, Address, ConnectOptions, Table, TableOptions};
///
/// let table = Table::in_memory(&TableOptions::default())?;
/// let path = std::env::temp_dir().join(format!("livereg-doc-{}.sock", std::process::id()));
/// let address = Address::parse(&format!("unix:{}", path.display()))?;
/// let reaper = table.reaper().listen(address.clone(), None).spawn()?;
/// let worker = connect(&address.to_string(), 7, "gpu7", &ConnectOptions::default())?;
/// worker.heartbeat()?;
/// worker.deregister()?;
/// reaper.stop()?;
/// # Ok::<(), livereg::Error>(())
/// ```
pub fn connect(
    address: &str,
    instance_id: u64,
    label: &str,
    options: &ConnectOptions,
) -> Result<Worker> {
    let address = Address::parse(address)?;
    let private = Table::in_memory(&TableOptions {
        capacity: 1,
        ..TableOptions::default()
    })?;
    // Validates the id and label as a local registration would.
    let worker = private
        .registration(instance_id)
        .label(label)
        .wait(Duration::ZERO)
        .register()?;
    let timeout = options.connect_timeout.unwrap_or(DEFAULT_CONNECT_TIMEOUT);
    let dialer = Dialer {
        tls: tls_for(&address, options.tls.as_ref())?,
        address,
        instance_id,
        label: label.to_owned(),
        token: options.token.clone().unwrap_or_default(),
        timeout,
    };
    let mut dialed = dialer.dial(None)?;
    // A region shared (protocol 4 over `unix:`): the worker beats there
    // rather than in private memory, and its process's death word is there.
    let worker = match dialed.region.as_ref().map(std::fs::File::try_clone) {
        None => worker,
        Some(region) => {
            let in_region = region
                .map_err(|e| crate::error::Error::os("(session region)", "keep the region", e))
                .and_then(|region| Table::in_region(region, &TableOptions::default()))
                .and_then(|table| {
                    table
                        .registration(instance_id)
                        .label(label)
                        .wait(Duration::ZERO)
                        .register()
                });
            match in_region {
                Ok(in_region) => {
                    drop(worker.deregister());
                    in_region
                }
                Err(e) => {
                    // Beats go as frames instead; the listener stops
                    // reading the region at the first.
                    log::warn!(
                        "session {}: cannot use the shared region ({e}): beating with frames",
                        dialer.address
                    );
                    dialed.region = None;
                    worker
                }
            }
        }
    };
    let link = SessionLink::start(dialer, dialed, &worker)?;
    Ok(worker.with_session(Box::new(link)))
}

/// The status of the table behind the listener at `address` as it answers
/// it (JSON), with only the registrations of `instance` (none if `None`).
/// Registers nothing; [`remote_status`](crate::remote_status) reads it.
///
/// # Errors
///
/// As [`connect`]: a bad address, a refused token, no answer in time, a
/// failed connection.
pub(crate) fn ask_status(
    address: &str,
    instance: Option<u64>,
    options: &ConnectOptions,
) -> Result<String> {
    let ask = Frame::Ask {
        version: VERSION,
        token: options.token.clone().unwrap_or_default(),
        instance_id: instance.unwrap_or(0),
    };
    let parsed = Address::parse(address)?;
    let tls = tls_for(&parsed, options.tls.as_ref())?;
    let timeout = options.connect_timeout.unwrap_or(DEFAULT_CONNECT_TIMEOUT);
    match exchange(&parsed, tls.as_ref(), timeout, &ask, Duration::ZERO)? {
        Frame::Answer { json } => Ok(json),
        other => Err(unexpected(&parsed, "an answer", &other)),
    }
}

/// Asks the reaper behind the listener at `address` for a clear, as
/// [`Table::clear`] does for a process that maps the table: its clear
/// handlers run once (the server clears its stored cache), registrations
/// are untouched. Waits up to `wait` for them to return. Registers nothing.
///
/// # Errors
///
/// As [`Table::clear`] ([`Error::Timeout`](crate::Error::Timeout), [`Error::NoReaper`](crate::Error::NoReaper)), and as
/// [`connect`] for the connection (a bad address, a refused token, a
/// failed connection).
///
/// # Examples
///
/// ```
/// use livereg::{remote_clear, Address, ConnectOptions, Table, TableOptions};
/// use std::time::Duration;
///
/// let table = Table::in_memory(&TableOptions::default())?;
/// let path = std::env::temp_dir().join(format!("livereg-doc-clear-{}.sock", std::process::id()));
/// let address = format!("unix:{}", path.display());
/// let reaper = table
///     .reaper()
///     .on_clear(|| Ok(())) // the server clears its cache
///     .listen(Address::parse(&address)?, None)
///     .spawn()?;
/// remote_clear(&address, Duration::from_secs(5), &ConnectOptions::default())?;
/// reaper.stop()?;
/// # Ok::<(), livereg::Error>(())
/// ```
pub fn remote_clear(address: &str, wait: Duration, options: &ConnectOptions) -> Result<()> {
    request(address, false, wait, options)
}

/// A [`remote_clear`] that also ends every registration of the table
/// (reason `cleared`), as [`Table::reset`]: every worker, local or
/// through a session, hears `Evicted` at its next heartbeat.
///
/// # Errors
///
/// As [`remote_clear`].
pub fn remote_reset(address: &str, wait: Duration, options: &ConnectOptions) -> Result<()> {
    request(address, true, wait, options)
}

fn request(address: &str, reset: bool, wait: Duration, options: &ConnectOptions) -> Result<()> {
    let parsed = Address::parse(address)?;
    let tls = tls_for(&parsed, options.tls.as_ref())?;
    let token = options.token.clone().unwrap_or_default();
    let timeout = options.connect_timeout.unwrap_or(DEFAULT_CONNECT_TIMEOUT);
    request_clear(&parsed, tls.as_ref(), &token, timeout, reset, wait)
}
