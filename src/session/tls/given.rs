//! What a listener and a client are given for TLS: the PEM files of their
//! certificates, keys and CAs.

use std::path::PathBuf;

/// A listener's TLS: its certificate chain and key (PEM files), and, to
/// require client certificates, the CA they must chain to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsServer {
    /// The listener's certificate chain (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
    /// If given, every client must present a certificate chaining to this
    /// CA (PEM); it may then connect without a token.
    pub client_ca: Option<PathBuf>,
}

/// A client's TLS: the CA the listener's certificate must chain to, and
/// optionally its own certificate and key (for a listener that requires
/// them).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsClient {
    /// The CA (PEM) the listener's certificate must chain to.
    pub ca: PathBuf,
    /// This client's certificate chain (PEM), with `key`.
    pub cert: Option<PathBuf>,
    /// This client's private key (PEM).
    pub key: Option<PathBuf>,
}
