//! A listener's socket: bound (a `unix:` one never reachable with a mode
//! wider than its own, a stale one from a dead listener removed), made
//! non-blocking, and each accepted connection described by where it comes
//! from (its credentials, its address) and wrapped in TLS if so configured.

use super::penalties::Source;
use crate::error::{Error, Result};
use crate::os::socket;
use crate::session::address::Address;
use crate::session::stream::Stream;
use crate::session::tls;
use std::net::TcpListener;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
/// A bound, non-blocking listening socket (TCP with TLS when it has a
/// server configuration).
pub(super) enum Acceptor {
    Unix(UnixListener),
    Tcp(TcpListener, Option<tls::ServerConfig>),
}

impl Acceptor {
    /// Binds `address` (a `unix:` socket with `socket_mode`), serving TLS
    /// with `tls`.
    pub(super) fn bind(
        address: &Address,
        socket_mode: u32,
        tls: Option<tls::ServerConfig>,
    ) -> Result<Acceptor> {
        let io = |step: &str, e: std::io::Error| Error::Io {
            context: format!("listener {address}: {step}"),
            source: e,
        };
        let acceptor = match address {
            Address::Unix(path) => {
                remove_stale_socket(address, path)?;
                let listener = bind_with_mode(path, socket_mode).map_err(|e| io("bind", e))?;
                // Before Linux 6.16 a client may still send descriptors:
                // the listener drops them unread (`docs/sessions.md`).
                if let Err(e) = socket::refuse_passed_descriptors(&listener) {
                    log::debug!("listener {address}: descriptors from clients not refused: {e}");
                }
                Acceptor::Unix(listener)
            }
            Address::Tcp(endpoint) | Address::Tls(endpoint) => {
                let listener = TcpListener::bind(endpoint).map_err(|e| io("bind", e))?;
                socket::widen_backlog(&listener).map_err(|e| io("listen", e))?;
                Acceptor::Tcp(listener, tls)
            }
        };
        match &acceptor {
            Acceptor::Unix(l) => l.set_nonblocking(true),
            Acceptor::Tcp(l, _) => l.set_nonblocking(true),
        }
        .map_err(|e| io("make it non-blocking", e))?;
        Ok(acceptor)
    }

    /// The next pending connection, with how the peer is described and
    /// where it comes from.
    pub(super) fn accept(&self) -> std::io::Result<(Stream, String, Source)> {
        match self {
            Acceptor::Unix(l) => {
                let (stream, _) = l.accept()?;
                let (peer, source) = match socket::peer_credentials(&stream) {
                    Ok((pid, uid, gid)) => (
                        format!("unix pid={pid} uid={uid} gid={gid}"),
                        Source::Uid(uid),
                    ),
                    Err(_) => ("unix".to_owned(), Source::Unknown),
                };
                Ok((Stream::Unix(stream), peer, source))
            }
            Acceptor::Tcp(l, None) => {
                let (stream, peer) = l.accept()?;
                let _ = stream.set_nodelay(true);
                Ok((
                    Stream::Tcp(stream),
                    format!("tcp {peer}"),
                    Source::Ip(peer.ip()),
                ))
            }
            Acceptor::Tcp(l, Some(config)) => {
                let (stream, peer) = l.accept()?;
                let _ = stream.set_nodelay(true);
                // The handshake runs as the client's bytes arrive (the
                // stream is non-blocking), within the greeting deadline.
                Ok((
                    tls::accept(config, stream)?,
                    format!("tls {peer}"),
                    Source::Ip(peer.ip()),
                ))
            }
        }
    }
}

impl AsRawFd for Acceptor {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            Acceptor::Unix(l) => l.as_raw_fd(),
            Acceptor::Tcp(l, _) => l.as_raw_fd(),
        }
    }
}

/// Binds a Unix socket at `path` that is never reachable with a mode wider
/// than `mode`: it is bound inside a fresh directory only its owner may
/// enter, given its mode there, then renamed into place.
fn bind_with_mode(path: &std::path::Path, mode: u32) -> std::io::Result<UnixListener> {
    let parent = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => std::path::Path::new("."),
    };
    let file_name = path.file_name().unwrap_or_default().to_string_lossy();
    let private = parent.join(format!(
        ".{file_name}.{}.{:x}",
        std::process::id(),
        crate::os::random::random_u64()?
    ));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&private)
        .map_err(|e| std::io::Error::new(e.kind(), format!("make {}: {e}", private.display())))?;
    let inside = private.join("socket");
    let bound = UnixListener::bind(&inside).and_then(|listener| {
        std::fs::set_permissions(&inside, std::fs::Permissions::from_mode(mode))?;
        std::fs::rename(&inside, path)?;
        Ok(listener)
    });
    let _ = std::fs::remove_file(&inside);
    let _ = std::fs::remove_dir(&private);
    bound
}

/// A socket left at `path` by a listener that died is removed; one that
/// answers belongs to a live listener: refused.
fn remove_stale_socket(address: &Address, path: &std::path::Path) -> Result<()> {
    let Ok(metadata) = std::fs::symlink_metadata(path) else {
        return Ok(());
    };
    if !metadata.file_type().is_socket() {
        return Err(Error::InvalidArgument(format!(
            "listener {address}: {} exists and is not a socket, expected a free path",
            path.display()
        )));
    }
    if UnixStream::connect(path).is_ok() {
        return Err(Error::busy(format!(
            "listener {address}: another listener is serving it"
        )));
    }
    std::fs::remove_file(path).map_err(|e| Error::Io {
        context: format!("listener {address}: remove the stale socket"),
        source: e,
    })
}
