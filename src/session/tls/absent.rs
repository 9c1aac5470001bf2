//! A build without the `tls` feature: nothing TLS can be made, and the one
//! line that says so also says how to get a build that can.

use super::given::{TlsClient, TlsServer};
use crate::error::{Error, Result};
use crate::session::stream::Stream;
use std::net::TcpStream;

/// No listener TLS in this build: never made.
#[derive(Clone)]
pub(crate) enum ServerConfig {}

/// No client TLS in this build: never made.
#[derive(Clone)]
pub(crate) enum ClientConfig {}

fn not_built_in() -> Error {
    Error::InvalidArgument(
        "tls:// needs TLS, which this livereg was built without: build it with the cargo feature `tls` (`cargo install --path cli --features tls` from a livereg checkout, `cargo build -p livereg-ffi --features tls`); the Python wheel and the deploy image have it".into(),
    )
}

/// # Errors
///
/// Always: this build has no TLS.
pub(crate) fn server_config(_tls: &TlsServer) -> Result<ServerConfig> {
    Err(not_built_in())
}

/// # Errors
///
/// Always: this build has no TLS.
pub(crate) fn client_config(_tls: &TlsClient) -> Result<ClientConfig> {
    Err(not_built_in())
}

pub(crate) fn accept(config: &ServerConfig, _socket: TcpStream) -> std::io::Result<Stream> {
    match *config {}
}

pub(crate) fn connect(
    config: &ClientConfig,
    _endpoint: &str,
    _socket: TcpStream,
) -> Result<Stream> {
    match *config {}
}
