//! A session's byte stream, over a Unix or a TCP socket (plain, or TLS on
//! either end), and the framing both ends read it with.

use crate::session::wire::{Frame, WireError, MAX_FRAME};
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;

/// A connected socket of either family, TLS on TCP as the listener's
/// server end or a client's end.
pub(crate) enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
    TlsServer(Box<rustls::StreamOwned<rustls::ServerConnection, TcpStream>>),
    TlsClient(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

/// The socket under a stream.
enum Socket<'a> {
    Unix(&'a UnixStream),
    Tcp(&'a TcpStream),
}

impl Stream {
    fn socket(&self) -> Socket<'_> {
        match self {
            Stream::Unix(s) => Socket::Unix(s),
            Stream::Tcp(s) => Socket::Tcp(s),
            Stream::TlsServer(s) => Socket::Tcp(&s.sock),
            Stream::TlsClient(s) => Socket::Tcp(&s.sock),
        }
    }

    pub(crate) fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        match self.socket() {
            Socket::Unix(s) => s.set_nonblocking(on),
            Socket::Tcp(s) => s.set_nonblocking(on),
        }
    }

    pub(crate) fn set_read_timeout(&self, timeout: Option<std::time::Duration>) -> io::Result<()> {
        match self.socket() {
            Socket::Unix(s) => s.set_read_timeout(timeout),
            Socket::Tcp(s) => s.set_read_timeout(timeout),
        }
    }

    pub(crate) fn set_write_timeout(&self, timeout: Option<std::time::Duration>) -> io::Result<()> {
        match self.socket() {
            Socket::Unix(s) => s.set_write_timeout(timeout),
            Socket::Tcp(s) => s.set_write_timeout(timeout),
        }
    }

    /// Whether a read that comes up short has emptied the socket. Not so
    /// under TLS: rustls takes the socket's bytes a record at a time and may
    /// leave some there while it hands out the plaintext it has.
    pub(crate) fn short_read_drains(&self) -> bool {
        matches!(self, Stream::Unix(_) | Stream::Tcp(_))
    }

    pub(crate) fn shutdown(&self) {
        let _ = match self.socket() {
            Socket::Unix(s) => s.shutdown(std::net::Shutdown::Both),
            Socket::Tcp(s) => s.shutdown(std::net::Shutdown::Both),
        };
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(buf),
            Stream::Tcp(s) => s.read(buf),
            Stream::TlsServer(s) => s.read(buf),
            Stream::TlsClient(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write(buf),
            Stream::Tcp(s) => s.write(buf),
            Stream::TlsServer(s) => s.write(buf),
            Stream::TlsClient(s) => s.write(buf),
        }
    }

    /// TLS ends push what rustls holds onto the socket.
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Unix(_) | Stream::Tcp(_) => Ok(()),
            Stream::TlsServer(s) => s.flush(),
            Stream::TlsClient(s) => s.flush(),
        }
    }
}

impl AsRawFd for Stream {
    fn as_raw_fd(&self) -> RawFd {
        match self.socket() {
            Socket::Unix(s) => s.as_raw_fd(),
            Socket::Tcp(s) => s.as_raw_fd(),
        }
    }
}

/// Bytes read from a stream and not yet taken as frames.
#[derive(Default)]
pub(crate) struct Inbox {
    bytes: Vec<u8>,
}

thread_local! {
    /// Where this thread's reads land, zeroed once and kept: a beat costs
    /// no allocation and no clearing, and a listener's thousand sessions
    /// share one buffer.
    static SCRATCH: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(vec![0; READ_SIZE]);
}

/// What one read takes at most: a whole frame of the largest size.
const READ_SIZE: usize = 4 + MAX_FRAME;

/// What a read from a stream gave.
pub(crate) enum Received {
    /// Whole frames (perhaps none yet).
    Frames(Vec<Frame>),
    /// The peer closed its end (after the frames it sent before).
    Closed(Vec<Frame>),
}

impl Inbox {
    /// Reads what `stream` has (once, or until it would block when
    /// non-blocking) and takes every whole frame.
    ///
    /// # Errors
    ///
    /// An I/O error other than `WouldBlock`, or a [`WireError`] as
    /// `InvalidData`: the connection is to be closed.
    pub(crate) fn receive(&mut self, stream: &mut impl Read) -> io::Result<Received> {
        let closed = SCRATCH.with(|scratch| self.read_all(stream, &mut scratch.borrow_mut()))?;
        let frames = self.take_frames().map_err(invalid)?;
        Ok(if closed {
            Received::Closed(frames)
        } else {
            Received::Frames(frames)
        })
    }

    /// Reads until the stream would block, closes, or gives less than a
    /// whole read: whether it closed.
    fn read_all(&mut self, stream: &mut impl Read, scratch: &mut [u8]) -> io::Result<bool> {
        loop {
            match stream.read(scratch) {
                Ok(0) => return Ok(true),
                Ok(n) => {
                    self.bytes.extend_from_slice(&scratch[..n]);
                    if n < scratch.len() {
                        return Ok(false);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) => return Err(e),
            }
        }
    }

    fn take_frames(&mut self) -> Result<Vec<Frame>, WireError> {
        let mut frames = Vec::new();
        let mut at = 0;
        while let Some((frame, used)) = Frame::decode(&self.bytes[at..])? {
            frames.push(frame);
            at += used;
        }
        self.bytes.drain(..at);
        Ok(frames)
    }
}

fn invalid(e: WireError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

/// Writes one frame whole. A non-blocking stream whose buffer is full
/// fails with `WouldBlock`: a peer that does not read is closed.
pub(crate) fn send(stream: &mut impl Write, frame: &Frame) -> io::Result<()> {
    stream.write_all(&frame.encode())?;
    stream.flush()
}
