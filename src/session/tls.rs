//! TLS on sessions (`tls://HOST:PORT`): rustls with the ring provider (built
//! by `cc`: no cmake, no OpenSSL). The listener presents a certificate and
//! may require client certificates; a client verifies the listener against
//! a CA it is given (there is no fallback to plaintext, and no system trust
//! store: a session's CA is always named). TLS lives in the listener and in
//! the client's sender thread; a ping never touches it.

use crate::error::{Error, Result};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::path::{Path, PathBuf};
use std::sync::Arc;

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
pub(crate) fn server_config(tls: &TlsServer) -> Result<Arc<rustls::ServerConfig>> {
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
pub(crate) fn client_config(tls: &TlsClient) -> Result<Arc<rustls::ClientConfig>> {
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

/// The name a listener's certificate must carry: the host of `HOST:PORT`
/// (a DNS name or an IP address; brackets of IPv6 removed).
pub(crate) fn server_name(endpoint: &str) -> Result<ServerName<'static>> {
    let host = endpoint
        .rsplit_once(':')
        .map_or(endpoint, |(host, _)| host)
        .trim_start_matches('[')
        .trim_end_matches(']');
    ServerName::try_from(host.to_owned())
        .map_err(|e| Error::InvalidArgument(format!("TLS server name '{host}': {e}")))
}
