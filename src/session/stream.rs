//! A session's byte stream, over a Unix or a TCP socket (plain, or TLS on
//! either end), and the framing both ends read it with.

use crate::session::wire::{Frame, WireError, MAX_FRAME, VERSION};
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;

/// A connected socket of either family, TLS on TCP as the listener's
/// server end or a client's end.
pub(crate) enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
    #[cfg(feature = "tls")]
    TlsServer(Box<rustls::StreamOwned<rustls::ServerConnection, TcpStream>>),
    #[cfg(feature = "tls")]
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
            #[cfg(feature = "tls")]
            Stream::TlsServer(s) => Socket::Tcp(&s.sock),
            #[cfg(feature = "tls")]
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
            #[cfg(feature = "tls")]
            Stream::TlsServer(s) => s.read(buf),
            #[cfg(feature = "tls")]
            Stream::TlsClient(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write(buf),
            Stream::Tcp(s) => s.write(buf),
            #[cfg(feature = "tls")]
            Stream::TlsServer(s) => s.write(buf),
            #[cfg(feature = "tls")]
            Stream::TlsClient(s) => s.write(buf),
        }
    }

    /// TLS ends push what rustls holds onto the socket.
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Unix(_) | Stream::Tcp(_) => Ok(()),
            #[cfg(feature = "tls")]
            Stream::TlsServer(s) => s.flush(),
            #[cfg(feature = "tls")]
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

/// Bytes read from a stream and not yet taken as frames: never more than
/// one read and a part-frame, whatever the peer sends, since frames are
/// taken after every read and a length over the cap fails at once.
#[derive(Default)]
pub(crate) struct Inbox {
    bytes: Vec<u8>,
    /// Whether the last [`Inbox::receive`] stopped at its budget with the
    /// stream perhaps still holding bytes.
    more: bool,
    /// Whether the peer is known to have closed: reads go on past a short
    /// one, to the close.
    hung_up: bool,
}

thread_local! {
    /// Where this thread's reads land, zeroed once and kept: a beat costs
    /// no allocation and no clearing, and a listener's thousand sessions
    /// share one buffer.
    static SCRATCH: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(vec![0; READ_SIZE]);
}

/// What one read takes at most: a whole frame of the largest size.
const READ_SIZE: usize = 4 + MAX_FRAME;

/// How many reads one [`Inbox::receive`] makes at most: the work one
/// connection gets per wake-up of its reader, so a flooding peer cannot
/// starve the others (16 KiB, some 500 beats).
const READS_PER_RECEIVE: usize = 4;

/// What a read from a stream gave.
pub(crate) enum Received {
    /// Whole frames (perhaps none yet).
    Frames(Vec<Frame>),
    /// The peer closed its end (after the frames it sent before).
    Closed(Vec<Frame>),
}

impl Inbox {
    /// Reads what `stream` has (once, or when non-blocking until it would
    /// block or [`READS_PER_RECEIVE`] reads were made) and takes every
    /// whole frame, decoding after each read.
    ///
    /// # Errors
    ///
    /// An I/O error other than `WouldBlock`, or a [`WireError`] as
    /// `InvalidData`: the connection is to be closed.
    pub(crate) fn receive(&mut self, stream: &mut impl Read) -> io::Result<Received> {
        SCRATCH.with(|scratch| self.read_frames(stream, &mut scratch.borrow_mut()))
    }

    /// The peer closed (its reader's wake-up said so): from now on a
    /// receive reads on past a short read, until the read that returns
    /// nothing. An edge-triggered reader is woken once for the data and
    /// the close that followed it, and a short read alone would leave the
    /// close unseen.
    pub(crate) fn note_hung_up(&mut self) {
        self.hung_up = true;
    }

    /// Whether the last receive stopped at its budget: the stream may hold
    /// more, to be read at the next turn (an edge-triggered reader is not
    /// woken for it again).
    pub(crate) fn more(&self) -> bool {
        self.more
    }

    fn read_frames(&mut self, stream: &mut impl Read, scratch: &mut [u8]) -> io::Result<Received> {
        let mut frames = Vec::new();
        self.more = false;
        for read in 0..READS_PER_RECEIVE {
            match stream.read(scratch) {
                Ok(0) => return Ok(Received::Closed(frames)),
                Ok(n) => {
                    self.bytes.extend_from_slice(&scratch[..n]);
                    self.take_frames(&mut frames).map_err(invalid)?;
                    if n < scratch.len() && !self.hung_up {
                        break;
                    }
                    self.more = read + 1 == READS_PER_RECEIVE;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
        Ok(Received::Frames(frames))
    }

    fn take_frames(&mut self, frames: &mut Vec<Frame>) -> Result<(), WireError> {
        let mut at = 0;
        while let Some((frame, used)) = Frame::decode(&self.bytes[at..])? {
            frames.push(frame);
            at += used;
        }
        self.bytes.drain(..at);
        Ok(())
    }

    /// How many bytes wait for the rest of their frame.
    #[cfg(test)]
    fn buffered(&self) -> usize {
        self.bytes.len()
    }
}

fn invalid(e: WireError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

/// Writes one frame whole, in today's protocol. A non-blocking stream
/// whose buffer is full fails with `WouldBlock`: a peer that does not read
/// is closed.
pub(crate) fn send(stream: &mut impl Write, frame: &Frame) -> io::Result<()> {
    send_for(stream, frame, VERSION)
}

/// [`send`], to a peer of protocol `version` (a listener's answer to an
/// older client).
pub(crate) fn send_for(stream: &mut impl Write, frame: &Frame, version: u16) -> io::Result<()> {
    stream.write_all(&frame.encode_for(version))?;
    stream.flush()
}

#[cfg(test)]
mod tests {
    use super::{Inbox, Received, READS_PER_RECEIVE, READ_SIZE};
    use crate::session::wire::Frame;
    use std::io::{self, Read};

    /// A peer with an endless supply of the same bytes.
    struct Endless(Vec<u8>, usize);

    impl Read for Endless {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            for byte in buf.iter_mut() {
                *byte = self.0[self.1 % self.0.len()];
                self.1 += 1;
            }
            Ok(buf.len())
        }
    }

    #[test]
    fn garbage_fails_at_its_first_read_whatever_follows() {
        let mut peer = Endless(vec![0], 0);
        let mut inbox = Inbox::default();
        assert!(inbox.receive(&mut peer).is_err());
        assert_eq!(peer.1, READ_SIZE, "read once, then refused");
    }

    #[test]
    fn a_flood_of_frames_is_taken_a_budget_at_a_time_buffering_under_a_frame() {
        let mut peer = Endless(Frame::Bye {}.encode(), 0);
        let mut inbox = Inbox::default();
        for _ in 0..3 {
            let Ok(Received::Frames(frames)) = inbox.receive(&mut peer) else {
                panic!("frames expected");
            };
            assert_eq!(frames.len(), READS_PER_RECEIVE * READ_SIZE / 5);
            assert!(inbox.more(), "the budget ran out before the peer did");
            assert!(inbox.buffered() < READ_SIZE);
        }
        assert_eq!(peer.1, 3 * READS_PER_RECEIVE * READ_SIZE);
    }

    #[test]
    fn a_part_frame_waits_for_its_rest() {
        let bytes = Frame::Bye {}.encode();
        let mut inbox = Inbox::default();
        let Ok(Received::Frames(frames)) = inbox.receive(&mut &bytes[..3]) else {
            panic!("frames expected");
        };
        assert!(frames.is_empty() && !inbox.more());
        let Ok(Received::Frames(frames)) = inbox.receive(&mut &bytes[3..]) else {
            panic!("frames expected");
        };
        assert_eq!(frames, vec![Frame::Bye {}]);
    }

    #[test]
    fn a_close_behind_a_short_read_is_read_once_the_peer_hung_up() {
        let bytes = Frame::Bye {}.encode();
        let mut inbox = Inbox::default();
        let Ok(Received::Frames(frames)) = inbox.receive(&mut &bytes[..]) else {
            panic!("a short read is taken as all there is");
        };
        assert_eq!(frames, vec![Frame::Bye {}]);
        let mut inbox = Inbox::default();
        inbox.note_hung_up();
        let Ok(Received::Closed(frames)) = inbox.receive(&mut &bytes[..]) else {
            panic!("the close behind the frame is read");
        };
        assert_eq!(frames, vec![Frame::Bye {}]);
    }
}
