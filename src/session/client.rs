//! The client of a session: `connect` registers through a reaper's listener
//! and returns an ordinary [`Worker`]. Its heartbeats, busy marks and
//! progress go to a slot in this process's own memory (the same code as a
//! local registration: no system call, no lock); a sender thread forwards
//! what changed and hears the reaper's eviction notice, which it writes
//! into that slot, so the next heartbeat returns `Evicted` with the reason.

use super::address::Address;
use super::sender::{Dialed, Link};
use super::stream::{send, Inbox, Received, Stream};
use super::tls::TlsClient;
use super::wire::{Frame, Reclaim, VERSION};
use crate::error::{Error, Result};
use crate::status::Status;
use crate::table::{Table, TableOptions};
use crate::worker::Worker;
use std::net::{TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

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
/// mapped table, and cost the same. A sender thread forwards them to the
/// reaper several times per reap timeout; if the connection breaks, it
/// reconnects with backoff and takes the same registration back (the
/// heartbeats go on meanwhile); if it cannot within the reap timeout, the
/// next heartbeat returns `Evicted` (reason `disconnected`).
///
/// # Errors
///
/// - [`Error::InvalidArgument`]: a bad address, instance id 0, a bad label.
/// - What the listener refused with: [`Error::Exists`] (the id is live),
///   [`Error::Permission`] (a wrong token), [`Error::Full`],
///   [`Error::Busy`] (the id's previous drop is pending), …
/// - [`Error::Timeout`]: no answer within the connect timeout.
/// - [`Error::Io`]: the connection failed or closed before an answer.
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
        .drop_wait(Duration::ZERO)
        .register()?;
    let timeout = options.connect_timeout.unwrap_or(DEFAULT_CONNECT_TIMEOUT);
    let hello = Hello {
        tls: tls_for(&address, options)?,
        address,
        instance_id,
        label: label.to_owned(),
        token: options.token.clone().unwrap_or_default(),
        timeout,
    };
    let dialed = hello.dial(None)?;
    let link = Link::start(hello, dialed, &worker)?;
    Ok(worker.with_session(link))
}

/// The status of the table behind the listener at `address`, with only
/// the registrations of `instance` (none if `None`): what `status` and
/// `probe` show for a process that cannot map the table. Registers nothing.
///
/// # Errors
///
/// As [`connect`]: a bad address, a refused token, no answer in time, a
/// failed connection.
pub fn remote_status(
    address: &str,
    instance: Option<u64>,
    options: &ConnectOptions,
) -> Result<Status> {
    let parsed = Address::parse(address)?;
    let timeout = options.connect_timeout.unwrap_or(DEFAULT_CONNECT_TIMEOUT);
    let tls = tls_for(&parsed, options)?;
    let mut stream = open(&parsed, timeout, tls.as_ref())?;
    let io = |step: &str, e: std::io::Error| Error::Io {
        context: format!("session {address}: {step}"),
        source: e,
    };
    let ask = Frame::Ask {
        version: VERSION,
        token: options.token.clone().unwrap_or_default(),
        instance_id: instance.unwrap_or(0),
    };
    stream
        .set_read_timeout(Some(timeout))
        .map_err(|e| io("set a read timeout", e))?;
    send(&mut stream, &ask).map_err(|e| io("ask", e))?;
    let mut inbox = Inbox::default();
    loop {
        let (frames, closed) = match inbox.receive(&mut stream) {
            Ok(Received::Frames(frames)) => (frames, false),
            Ok(Received::Closed(frames)) => (frames, true),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                return Err(Error::Timeout(format!(
                    "session {address}: no answer within {timeout:?}"
                )))
            }
            Err(e) => return Err(io("read the answer", e)),
        };
        match frames.into_iter().next() {
            Some(Frame::Answer { json }) => {
                return serde_json::from_str(&json).map_err(|e| {
                    Error::Incompatible(format!(
                        "session {address}: the answer is not a status: {e}"
                    ))
                })
            }
            Some(Frame::Refused { code, message }) => return Err(refused(code, message, 0)),
            Some(other) => {
                return Err(Error::Incompatible(format!(
                    "session {address}: expected an answer, found {other:?}"
                )))
            }
            None if closed => {
                return Err(io(
                    "read the answer",
                    std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "closed without an answer",
                    ),
                ))
            }
            None => {}
        }
    }
}

/// Everything needed to say hello again after a reconnect.
pub(crate) struct Hello {
    pub address: Address,
    /// The client's TLS configuration, for a `tls://` address.
    pub tls: Option<Arc<rustls::ClientConfig>>,
    pub instance_id: u64,
    pub label: String,
    pub token: Vec<u8>,
    pub timeout: Duration,
}

impl Hello {
    /// Connects, says hello (reclaiming `reclaim` if given) and reads the
    /// answer.
    pub(crate) fn dial(&self, reclaim: Option<Reclaim>) -> Result<Dialed> {
        let deadline = Instant::now() + self.timeout;
        let mut stream = open(&self.address, self.timeout, self.tls.as_ref())?;
        let io = |step: &str, e: std::io::Error| Error::Io {
            context: format!("session {}: {step}", self.address),
            source: e,
        };
        stream
            .set_write_timeout(Some(self.timeout))
            .map_err(|e| io("set a write timeout", e))?;
        let frame = Frame::Hello {
            version: VERSION,
            instance_id: self.instance_id,
            pid: std::process::id(),
            token: self.token.clone(),
            label: self.label.clone(),
            host: host_name(),
            reclaim,
        };
        send(&mut stream, &frame).map_err(|e| match self.address {
            // The TLS handshake runs with the first write.
            Address::Tls(_) => Error::Permission(format!(
                "session {}: TLS handshake failed: {e} (is it a tls:// listener whose certificate chains to the CA given?)",
                self.address
            )),
            _ => io("send hello", e),
        })?;
        let mut inbox = Inbox::default();
        let mut info = None;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Timeout(format!(
                    "session {}: no answer to hello within {:?}",
                    self.address, self.timeout
                )));
            }
            stream
                .set_read_timeout(Some(left))
                .map_err(|e| io("set a read timeout", e))?;
            let (frames, closed) = match inbox.receive(&mut stream) {
                Ok(Received::Frames(frames)) => (frames, false),
                Ok(Received::Closed(frames)) => (frames, true),
                Err(e) if is_frame_error(&e) => {
                    return Err(Error::Incompatible(format!(
                        "session {}: the listener's answer is not a livereg frame ({e}); is it a livereg listener, speaking TLS?",
                        self.address
                    )))
                }
                Err(e) if matches!(self.address, Address::Tls(_)) => {
                    // rustls: an alert from the listener (a client
                    // certificate it refused), or a record that is not TLS.
                    return Err(Error::Permission(format!(
                        "session {}: TLS handshake failed: {e}",
                        self.address
                    )));
                }
                Err(e) => return Err(io("read the answer", e)),
            };
            for frame in frames {
                match frame {
                    // The info area comes first, so a welcomed client has it.
                    Frame::Info { bytes } => info = Some(bytes),
                    Frame::Welcome {
                        slot,
                        generation,
                        secret,
                        reap_timeout_ms,
                        ..
                    } => {
                        return Ok(Dialed {
                            stream,
                            inbox,
                            reclaim: Reclaim {
                                slot,
                                generation,
                                secret,
                            },
                            reap_timeout: Duration::from_millis(reap_timeout_ms.max(1)),
                            info,
                        });
                    }
                    Frame::Refused { code, message } => {
                        return Err(refused(code, message, self.instance_id))
                    }
                    other => {
                        return Err(Error::Incompatible(format!(
                            "session {}: expected welcome or refused, found {other:?}",
                            self.address
                        )))
                    }
                }
            }
            if closed {
                return Err(io(
                    "read the answer",
                    std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "the listener closed the connection without an answer",
                    ),
                ));
            }
        }
    }
}

/// Whether a read failed because the bytes were not a frame (rather than
/// TLS or the socket).
fn is_frame_error(e: &std::io::Error) -> bool {
    e.get_ref()
        .is_some_and(|inner| inner.downcast_ref::<super::wire::WireError>().is_some())
}

/// The TLS configuration a connection to `address` uses: required for
/// `tls://`, refused for a plaintext address (never a silent fallback).
fn tls_for(
    address: &Address,
    options: &ConnectOptions,
) -> Result<Option<Arc<rustls::ClientConfig>>> {
    match (address, &options.tls) {
        (Address::Tls(_), Some(tls)) => Ok(Some(super::tls::client_config(tls)?)),
        (Address::Tls(_), None) => Err(Error::InvalidArgument(format!(
            "session {address}: a tls:// address needs the CA that signed the listener's certificate (tls_ca), found none"
        ))),
        (_, Some(_)) => Err(Error::InvalidArgument(format!(
            "session {address}: a TLS CA was given for a plaintext address, expected tls://HOST:PORT"
        ))),
        (_, None) => Ok(None),
    }
}

/// Opens a connection to `address` within `timeout` (TLS with `tls`).
fn open(
    address: &Address,
    timeout: Duration,
    tls: Option<&Arc<rustls::ClientConfig>>,
) -> Result<Stream> {
    let io = |e: std::io::Error| Error::Io {
        context: format!("session {address}: connect"),
        source: e,
    };
    match address {
        Address::Unix(path) => Ok(Stream::Unix(UnixStream::connect(path).map_err(io)?)),
        Address::Tcp(endpoint) => Ok(Stream::Tcp(dial_tcp(endpoint, timeout).map_err(io)?)),
        Address::Tls(endpoint) => {
            let config = tls.cloned().ok_or_else(|| {
                Error::InvalidArgument(format!("session {address}: no TLS configuration"))
            })?;
            let name = super::tls::server_name(endpoint)?;
            let connection = rustls::ClientConnection::new(config, name)
                .map_err(|e| Error::InvalidArgument(format!("session {address}: TLS: {e}")))?;
            let socket = dial_tcp(endpoint, timeout).map_err(io)?;
            Ok(Stream::TlsClient(Box::new(rustls::StreamOwned::new(
                connection, socket,
            ))))
        }
    }
}

/// A TCP connection to the first address `endpoint` resolves to that answers.
fn dial_tcp(endpoint: &str, timeout: Duration) -> std::io::Result<TcpStream> {
    let mut last = None;
    for resolved in endpoint.to_socket_addrs()? {
        match TcpStream::connect_timeout(&resolved, timeout) {
            Ok(stream) => {
                let _ = stream.set_nodelay(true);
                return Ok(stream);
            }
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "the host resolves to no address",
        )
    }))
}

/// The error a listener's `Refused` stands for.
pub(crate) fn refused(code: u8, message: String, instance_id: u64) -> Error {
    match code {
        1 => Error::Evicted {
            instance_id,
            reason: Some(crate::event::Reason::Disconnected),
        },
        2 => Error::Full(message),
        3 => Error::Exists(message),
        4 => Error::NotFound(message),
        5 => Error::InvalidArgument(message),
        6 => Error::Incompatible(message),
        7 => Error::Corrupt(message),
        8 => Error::Permission(message),
        9 => Error::Timeout(message),
        10 => Error::NoReaper(message),
        11 => Error::Busy(message),
        _ => Error::Io {
            context: "the listener refused the session".into(),
            source: std::io::Error::other(message),
        },
    }
}

/// This host's name, as the client reports it.
fn host_name() -> String {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let name = name.trim();
    let mut end = name.len().min(super::wire::HOST_MAX);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    name[..end].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_refusal_code_maps_to_its_error() {
        for code in 1..=13u8 {
            let error = refused(code, "why".into(), 7);
            let expected = if code == 13 { 12 } else { u32::from(code) };
            assert_eq!(error.code(), expected, "{code}");
        }
    }
}
