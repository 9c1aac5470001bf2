//! Reaching a listener: a connection (Unix, TCP or TLS), the hello a
//! [`Dialer`] says and its answer, and what a refusal means; used by `connect`, by the sender
//! thread when it reconnects, and by the one-frame exchanges (`remote_status`,
//! `remote_clear`).

use crate::clock::{deadline_after, time_left};
use crate::error::{Error, Result};
use crate::event::Reason;
use crate::os::hostname::hostname;
use crate::session::address::Address;
use crate::session::stream::{send, Inbox, Received, Stream};
use crate::session::tls::{self, TlsClient};
use crate::session::wire::{
    Frame, Reclaim, HOST_MAX, OLDEST_SERVED, REFUSED_REASON_SINCE, REGION_SINCE, VERSION,
};
use crate::text::prefix_within;
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// A connection that said hello and was welcomed.
pub(crate) struct Dialed {
    pub stream: Stream,
    pub inbox: Inbox,
    pub reclaim: Reclaim,
    pub reap_timeout: Duration,
    pub info: Option<Vec<u8>>,
    /// The protocol version the listener welcomed this client in.
    pub version: u16,
    /// The boot token of the reaper whose listener welcomed it.
    pub boot_token: u64,
    /// The region the listener shared (protocol 4 over `unix:`): the memfd
    /// that came with the welcome, if the welcome said it has one.
    pub region: Option<std::fs::File>,
}

/// How to reach a listener and what to say to it: everything needed to say
/// hello again after a reconnect (or to ask the listener for a clear).
#[derive(Clone)]
pub(crate) struct Dialer {
    pub address: Address,
    /// The client's TLS configuration, for a `tls://` address.
    pub tls: Option<tls::ClientConfig>,
    pub instance_id: u64,
    pub label: String,
    pub token: Vec<u8>,
    pub timeout: Duration,
}

impl Dialer {
    /// Asks the listener for a clear (or, with `reset`, a reset) over a
    /// connection of its own, and waits up to `wait` for it.
    pub(crate) fn request_clear(&self, reset: bool, wait: Duration) -> Result<()> {
        request_clear(
            &self.address,
            self.tls.as_ref(),
            &self.token,
            self.timeout,
            reset,
            wait,
        )
    }

    /// Connects, says hello (reclaiming `reclaim` if given) and reads the
    /// answer.
    pub(crate) fn dial(&self, reclaim: Option<Reclaim>) -> Result<Dialed> {
        self.dial_within(reclaim, self.timeout)
    }

    /// [`Dialer::dial`], giving up after `timeout` rather than the
    /// client's connect timeout. A listener of an earlier protocol refuses
    /// today's version as incompatible: the client then says hello again in
    /// the version before, down to [`OLDEST_SERVED`]; a listener that
    /// refuses them all fails in one line naming the versions.
    pub(crate) fn dial_within(
        &self,
        reclaim: Option<Reclaim>,
        timeout: Duration,
    ) -> Result<Dialed> {
        let deadline = deadline_after(timeout);
        let mut refusals = Vec::new();
        for version in (OLDEST_SERVED..=VERSION).rev() {
            match self.dial_in(version, reclaim, time_left(deadline)) {
                Err(Error::Incompatible(refusal)) => refusals.push(refusal),
                other => return other,
            }
        }
        Err(Error::Incompatible(format!(
            "session {}: this client speaks session protocol {OLDEST_SERVED} to {VERSION}, and the listener refused every one ({}): upgrade the older side",
            self.address,
            refusals.join("; ")
        )))
    }

    /// One hello in protocol `version`, and its answer.
    fn dial_in(&self, version: u16, reclaim: Option<Reclaim>, timeout: Duration) -> Result<Dialed> {
        let deadline = deadline_after(timeout);
        let mut stream = open(&self.address, timeout, self.tls.as_ref())?;
        let io = |step: &str, e: std::io::Error| Error::Io {
            context: format!("session {}: {step}", self.address),
            source: e,
        };
        // Both ways bounded before the first byte: a TLS handshake (run by
        // the first write) reads the listener's answer, and a listener
        // that accepts and never answers (a stopped one: the kernel
        // completes the connection) must not hold it forever.
        stream
            .set_write_timeout(Some(timeout))
            .map_err(|e| io("set a write timeout", e))?;
        stream
            .set_read_timeout(Some(timeout))
            .map_err(|e| io("set a read timeout", e))?;
        let frame = Frame::Hello {
            version,
            instance_id: self.instance_id,
            pid: std::process::id(),
            token: self.token.clone(),
            label: self.label.clone(),
            host: prefix_within(&hostname(), HOST_MAX).to_owned(),
            reclaim,
        };
        send(&mut stream, &frame).map_err(|e| match e.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => Error::Timeout(format!(
                "session {}: no answer to hello within {timeout:?} (a listener that accepted and says nothing: stopped?)",
                self.address
            )),
            // The TLS handshake runs with the first write; what TLS itself
            // refused comes back as invalid data.
            std::io::ErrorKind::InvalidData if matches!(self.address, Address::Tls(_)) => {
                Error::Permission(format!(
                    "session {}: TLS handshake failed: {e} (is it a tls:// listener whose certificate chains to the CA given?)",
                    self.address
                ))
            }
            // A connection closed or reset during the handshake: an I/O
            // error (retried by a reconnecting client), named as the
            // handshake's.
            _ if matches!(self.address, Address::Tls(_)) => io(
                "TLS handshake failed (is it a tls:// listener whose certificate chains to the CA given?)",
                e,
            ),
            _ => io("send hello", e),
        })?;
        let mut inbox = Inbox::default();
        let mut info = None;
        // Over `unix:` in protocol 4, the welcome may bring a region's
        // memfd: every read of the answer takes the descriptors that come.
        let mut caught = None;
        loop {
            let left = time_left(deadline);
            if left.is_zero() {
                return Err(Error::Timeout(format!(
                    "session {}: no answer to hello within {timeout:?}",
                    self.address
                )));
            }
            stream
                .set_read_timeout(Some(left))
                .map_err(|e| io("set a read timeout", e))?;
            let received = match &stream {
                Stream::Unix(socket) if version >= REGION_SINCE => {
                    inbox.receive(&mut FdCatcher {
                        socket,
                        caught: &mut caught,
                    })
                }
                _ => inbox.receive(&mut stream),
            };
            let (frames, closed) = match received {
                Ok(Received::Frames(frames)) => (frames, false),
                Ok(Received::Closed(frames)) => (frames, true),
                Err(e) if is_frame_error(&e) => {
                    return Err(Error::Incompatible(format!(
                        "session {}: the listener's answer is not a livereg frame ({e}); is it a livereg listener, speaking TLS?",
                        self.address
                    )))
                }
                Err(e)
                    if matches!(self.address, Address::Tls(_))
                        && e.kind() == std::io::ErrorKind::InvalidData =>
                {
                    // TLS: an alert from the listener (a client
                    // certificate it refused), or a record that is not TLS.
                    return Err(Error::Permission(format!(
                        "session {}: TLS handshake failed: {e}",
                        self.address
                    )));
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(Error::Timeout(format!(
                        "session {}: no answer to hello within {timeout:?}",
                        self.address
                    )))
                }
                Err(e) => return Err(io("read the answer", e)),
            };
            for frame in frames {
                match frame {
                    // The info area comes first, so a welcomed client has it.
                    Frame::Info { bytes } => info = Some(bytes),
                    Frame::Welcome {
                        version,
                        slot,
                        generation,
                        secret,
                        reap_timeout_ms,
                        boot_token,
                        region_bytes,
                    } => {
                        let region = self.region(region_bytes, caught.take())?;
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
                            version,
                            boot_token,
                            region,
                        });
                    }
                    Frame::Refused {
                        code,
                        message,
                        reason,
                    } => {
                        return Err(Error::from_code(
                            code.into(),
                            message,
                            self.instance_id,
                            refused_reason(version, reason),
                        ))
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

impl Dialer {
    /// The region a welcome said it brought (`region_bytes` not 0), as the
    /// descriptor that came with it; none if it said none (a descriptor
    /// that came anyway is closed).
    ///
    /// # Errors
    ///
    /// [`Error::Incompatible`]: the welcome said it brought a region and
    /// no descriptor came (the client cannot beat where its listener reads).
    fn region(
        &self,
        region_bytes: u64,
        caught: Option<std::os::fd::OwnedFd>,
    ) -> Result<Option<std::fs::File>> {
        match (region_bytes, caught) {
            (0, _) => Ok(None),
            (_, Some(fd)) => Ok(Some(std::fs::File::from(fd))),
            (bytes, None) => Err(Error::Incompatible(format!(
                "session {}: the welcome announced a region of {bytes} bytes, and no descriptor came with it",
                self.address
            ))),
        }
    }
}

/// A Unix socket read with `recvmsg`, keeping the first descriptor that
/// comes (a region's memfd, with the welcome).
struct FdCatcher<'a> {
    socket: &'a std::os::unix::net::UnixStream,
    caught: &'a mut Option<std::os::fd::OwnedFd>,
}

impl std::io::Read for FdCatcher<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let (read, fd) = crate::os::socket::receive_with_fd(self.socket, buf)?;
        if self.caught.is_none() {
            *self.caught = fd;
        }
        Ok(read)
    }
}

/// Whether a listener's `INCOMPATIBLE` refusal is of the client's protocol
/// version: every listener has worded it "session protocol version N, ..."
/// since version 1.
/// The reason of a refusal to a hello of protocol `version`: the frame's
/// code, or `disconnected` from a listener of a protocol that sent none.
fn refused_reason(version: u16, reason: Option<Reason>) -> Option<Reason> {
    match version >= REFUSED_REASON_SINCE {
        true => reason,
        false => Some(Reason::Disconnected),
    }
}

/// Whether a read failed because the bytes were not a frame (rather than
/// TLS or the socket).
pub(crate) fn is_frame_error(e: &std::io::Error) -> bool {
    e.get_ref().is_some_and(|inner| {
        inner
            .downcast_ref::<crate::session::wire::WireError>()
            .is_some()
    })
}

/// The TLS configuration a connection to `address` uses: required for
/// `tls://`, refused for a plaintext address (never a silent fallback).
pub(crate) fn tls_for(
    address: &Address,
    tls: Option<&TlsClient>,
) -> Result<Option<tls::ClientConfig>> {
    match (address, tls) {
        (Address::Tls(_), Some(config)) => Ok(Some(tls::client_config(config)?)),
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
pub(crate) fn open(
    address: &Address,
    timeout: Duration,
    tls: Option<&tls::ClientConfig>,
) -> Result<Stream> {
    let io = |e: std::io::Error| Error::Io {
        context: format!("session {address}: connect"),
        source: e,
    };
    match address {
        Address::Unix(path) => {
            match crate::os::unix_connect::connect_unix(path.as_ref(), deadline_after(timeout)) {
                Ok(stream) => Ok(Stream::Unix(stream)),
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => Err(Error::Timeout(format!(
                    "session {address}: connect: not accepted within {timeout:?} ({e})"
                ))),
                Err(e) => Err(io(e)),
            }
        }
        Address::Tcp(endpoint) => Ok(Stream::Tcp(dial_tcp(endpoint, timeout).map_err(io)?)),
        Address::Tls(endpoint) => {
            let config = tls.ok_or_else(|| {
                Error::InvalidArgument(format!("session {address}: no TLS configuration"))
            })?;
            let socket = dial_tcp(endpoint, timeout).map_err(io)?;
            tls::connect(config, endpoint, socket)
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

/// Asks the listener at `address` for a clear (or, with `reset`, a reset)
/// and waits up to `wait` for the reaper to carry it out.
pub(crate) fn request_clear(
    address: &Address,
    tls: Option<&tls::ClientConfig>,
    token: &[u8],
    timeout: Duration,
    reset: bool,
    wait: Duration,
) -> Result<()> {
    let clear = Frame::Clear {
        version: VERSION,
        token: token.to_vec(),
        reset,
        wait_ms: u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
    };
    match exchange(address, tls, timeout, &clear, wait)? {
        Frame::Done {} => Ok(()),
        other => Err(unexpected(address, "done", &other)),
    }
}

/// The error of an answer that is not the one expected.
pub(crate) fn unexpected(address: &Address, expected: &str, found: &Frame) -> Error {
    Error::Incompatible(format!(
        "session {address}: expected {expected}, found {found:?}"
    ))
}

/// Sends `frame` as a connection's only frame and returns the listener's
/// one answer (a `Refused` as its error), waiting `timeout` to connect and
/// `timeout` plus `longer` in all for the answer, a second try in the
/// previous protocol's version included.
pub(crate) fn exchange(
    address: &Address,
    tls: Option<&tls::ClientConfig>,
    timeout: Duration,
    frame: &Frame,
    longer: Duration,
) -> Result<Frame> {
    let deadline = deadline_after(timeout.saturating_add(longer));
    match exchange_once(address, tls, timeout, frame, deadline) {
        // A listener of an earlier protocol: asked again in the oldest
        // version served, which every listener since version 2 takes.
        Err(Error::Incompatible(refusal)) => {
            let previous = match frame.clone() {
                Frame::Ask {
                    token, instance_id, ..
                } => Frame::Ask {
                    version: OLDEST_SERVED,
                    token,
                    instance_id,
                },
                Frame::Clear {
                    token,
                    reset,
                    wait_ms,
                    ..
                } => Frame::Clear {
                    version: OLDEST_SERVED,
                    token,
                    reset,
                    wait_ms,
                },
                _ => return Err(Error::Incompatible(refusal)),
            };
            let left = time_left(deadline);
            if left.is_zero() {
                return Err(Error::Timeout(format!(
                    "session {address}: no answer within {:?}",
                    timeout.saturating_add(longer)
                )));
            }
            exchange_once(address, tls, timeout.min(left), &previous, deadline)
        }
        other => other,
    }
}

/// [`exchange`] in the frame's own version, answered by `deadline`. A TLS
/// handshake (made with the first write) that does not end in time is a
/// timeout too.
fn exchange_once(
    address: &Address,
    tls: Option<&tls::ClientConfig>,
    timeout: Duration,
    frame: &Frame,
    deadline: Option<Instant>,
) -> Result<Frame> {
    let mut stream = open(address, timeout, tls)?;
    let io = |step: &str, e: std::io::Error| Error::Io {
        context: format!("session {address}: {step}"),
        source: e,
    };
    let answer_within = time_left(deadline).max(Duration::from_millis(1));
    stream
        .set_read_timeout(Some(answer_within))
        .map_err(|e| io("set a read timeout", e))?;
    stream
        .set_write_timeout(Some(answer_within))
        .map_err(|e| io("set a write timeout", e))?;
    send(&mut stream, frame).map_err(|e| match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => Error::Timeout(format!(
            "session {address}: the handshake did not end within {answer_within:?} ({e})"
        )),
        _ => io("send", e),
    })?;
    let mut inbox = Inbox::default();
    loop {
        let (frames, closed) = match inbox.receive(&mut stream) {
            Ok(Received::Frames(frames)) => (frames, false),
            Ok(Received::Closed(frames)) => (frames, true),
            Err(e) => return Err(io("read the answer", e)),
        };
        match frames.into_iter().next() {
            Some(Frame::Refused { code, message, .. }) => {
                return Err(Error::from_code(code.into(), message, 0, None))
            }
            Some(answer) => return Ok(answer),
            None if closed => {
                return Err(io(
                    "read the answer",
                    std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "closed without an answer",
                    ),
                ))
            }
            // (A read that timed out returns no frame.)
            None if time_left(deadline).is_zero() => {
                return Err(Error::Timeout(format!(
                    "session {address}: no answer within {answer_within:?}"
                )))
            }
            None => {}
        }
    }
}
