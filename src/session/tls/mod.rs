//! TLS on sessions (`tls://HOST:PORT`). The listener presents a certificate
//! and may require client certificates; a client verifies the listener
//! against a CA it is given (there is no fallback to plaintext, and no
//! system trust store: a session's CA is always named). TLS lives in the
//! listener and in the client's sender thread; a ping never touches it.
//!
//! It is the cargo feature `tls` (rustls, with ring's C and assembly): the
//! library, the C library and the command build without it unless asked;
//! the Python wheel and the deployment image are built with it. Without it,
//! what TLS is given is still taken, and a `tls://` address fails in one
//! line that says how to get it.

use std::path::PathBuf;

#[cfg(not(feature = "tls"))]
mod absent;
#[cfg(feature = "tls")]
mod with_rustls;

#[cfg(not(feature = "tls"))]
pub(crate) use absent::{
    accept, client_config, connect, server_config, ClientConfig, ServerConfig,
};
#[cfg(feature = "tls")]
pub(crate) use with_rustls::{
    accept, client_config, connect, server_config, ClientConfig, ServerConfig,
};

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

/// Whether this build speaks TLS (the cargo feature `tls`).
pub const TLS_BUILT_IN: bool = cfg!(feature = "tls");
