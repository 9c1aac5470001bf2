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

#[cfg(not(feature = "tls"))]
mod absent;
mod given;
#[cfg(feature = "tls")]
mod with_rustls;

#[cfg(not(feature = "tls"))]
pub(crate) use absent::{
    accept, client_config, connect, server_config, ClientConfig, ServerConfig,
};
pub use given::{TlsClient, TlsServer};
#[cfg(feature = "tls")]
pub(crate) use with_rustls::{
    accept, client_config, connect, server_config, ClientConfig, ServerConfig,
};

/// Whether this build speaks TLS (the cargo feature `tls`).
pub const TLS_BUILT_IN: bool = cfg!(feature = "tls");
