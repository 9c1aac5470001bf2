//! TLS with rustls and the ring provider (built by `cc`: no cmake, no
//! OpenSSL), in builds with the `tls` feature.

use super::given::{TlsClient, TlsServer};
use crate::error::{Error, Result};
use crate::session::stream::Stream;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::net::TcpStream;
use std::path::Path;
use std::sync::Arc;

/// A listener's TLS, ready to accept with.
pub(crate) type ServerConfig = Arc<rustls::ServerConfig>;

/// A client's TLS, ready to connect with.
pub(crate) type ClientConfig = Arc<rustls::ClientConfig>;

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn unreadable(what: &str, path: &Path, e: impl std::fmt::Display) -> Error {
    Error::InvalidArgument(format!(
        "TLS {what} {}: {e}, expected a readable PEM file",
        path.display()
    ))
}

fn certificates(what: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| unreadable(what, path, e))?
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| unreadable(what, path, e))?;
    if certs.is_empty() {
        return Err(unreadable(what, path, "no certificate in it"));
    }
    Ok(certs)
}

fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| unreadable("key", path, e))
}

fn roots(path: &Path) -> Result<rustls::RootCertStore> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in certificates("CA", path)? {
        roots.add(cert).map_err(|e| unreadable("CA", path, e))?;
    }
    Ok(roots)
}

fn refused(what: &str, e: rustls::Error) -> Error {
    Error::InvalidArgument(format!("TLS {what}: {e}"))
}

/// The listener's rustls configuration.
///
/// # Errors
///
/// [`Error::InvalidArgument`] naming the file that cannot be read or used.
pub(crate) fn server_config(tls: &TlsServer) -> Result<ServerConfig> {
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| refused("protocol versions", e))?;
    let builder = match &tls.client_ca {
        Some(ca) => {
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots(ca)?),
                provider(),
            )
            .build()
            .map_err(|e| unreadable("client CA", ca, e))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let config = builder
        .with_single_cert(
            certificates("certificate", &tls.cert)?,
            private_key(&tls.key)?,
        )
        .map_err(|e| {
            refused(
                &format!(
                    "certificate {} with key {}",
                    tls.cert.display(),
                    tls.key.display()
                ),
                e,
            )
        })?;
    Ok(Arc::new(config))
}

/// A client's rustls configuration.
///
/// # Errors
///
/// [`Error::InvalidArgument`] naming the file that cannot be read or used,
/// or a certificate given without its key.
pub(crate) fn client_config(tls: &TlsClient) -> Result<ClientConfig> {
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| refused("protocol versions", e))?
        .with_root_certificates(roots(&tls.ca)?);
    let config = match (&tls.cert, &tls.key) {
        (Some(cert), Some(key)) => builder
            .with_client_auth_cert(certificates("certificate", cert)?, private_key(key)?)
            .map_err(|e| refused(&format!("client certificate {}", cert.display()), e))?,
        (None, None) => builder.with_no_client_auth(),
        _ => {
            return Err(Error::InvalidArgument(
                "a TLS client certificate and its key go together, expected both or neither".into(),
            ))
        }
    };
    Ok(Arc::new(config))
}

/// The server end of a connection just accepted: the handshake runs as the
/// client's bytes arrive (the stream is non-blocking).
///
/// # Errors
///
/// rustls could not start a connection.
pub(crate) fn accept(config: &ServerConfig, socket: TcpStream) -> std::io::Result<Stream> {
    let connection = rustls::ServerConnection::new(config.clone())
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    Ok(Stream::TlsServer(Box::new(rustls::StreamOwned::new(
        connection, socket,
    ))))
}

/// The client end over `socket` to the listener at `endpoint` (whose
/// certificate must name its host); the handshake runs with the first
/// write.
///
/// # Errors
///
/// [`Error::InvalidArgument`]: the host is no server name, or rustls could
/// not start a connection.
pub(crate) fn connect(config: &ClientConfig, endpoint: &str, socket: TcpStream) -> Result<Stream> {
    let name = server_name(endpoint)?;
    let connection = rustls::ClientConnection::new(config.clone(), name)
        .map_err(|e| Error::InvalidArgument(format!("tls://{endpoint}: TLS: {e}")))?;
    Ok(Stream::TlsClient(Box::new(rustls::StreamOwned::new(
        connection, socket,
    ))))
}

/// The name a listener's certificate must carry: the host of `HOST:PORT`
/// (a DNS name or an IP address; brackets of IPv6 removed).
fn server_name(endpoint: &str) -> Result<ServerName<'static>> {
    let host = endpoint
        .rsplit_once(':')
        .map_or(endpoint, |(host, _)| host)
        .trim_start_matches('[')
        .trim_end_matches(']');
    ServerName::try_from(host.to_owned())
        .map_err(|e| Error::InvalidArgument(format!("TLS server name '{host}': {e}")))
}
