//! How to reach etcd: endpoints, prefix, host name, lease TTL, TLS and
//! credentials, checked before the first request.

use super::error::EtcdError;
use super::record;
use crate::os::hostname::hostname;
use std::time::Duration;

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "/livereg";

/// The default lease TTL: a dead host's keys vanish this long after its last
/// keep-alive.
pub const DEFAULT_TTL: Duration = Duration::from_secs(10);

/// Where and as whom to publish.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdOptions {
    /// etcd client endpoints, e.g. `http://10.0.0.5:2379` or, with
    /// [`tls`](EtcdOptions::tls), `https://10.0.0.5:2379` (a bare
    /// `host:port` means `http://`, or `https://` with TLS).
    pub endpoints: Vec<String>,
    /// The key prefix (default `/livereg`); a trailing `/` is ignored.
    pub prefix: String,
    /// This host's name in the keys (default: the hostname). Must be unique
    /// in the cluster.
    pub host: String,
    /// The lease TTL, in whole seconds (rounded up; etcd may raise it to its
    /// minimum, 2 s by default).
    pub ttl: Duration,
    /// TLS: the CA etcd's certificate must verify against, and for mutual
    /// TLS this client's certificate. `None`: plaintext (`http://` only).
    pub tls: Option<EtcdTls>,
    /// etcd authentication (a user of etcd's RBAC), if etcd asks for it.
    pub credentials: Option<EtcdCredentials>,
}

/// TLS to etcd, as PEM read from files (see [`EtcdTls::from_files`]).
/// Its `Debug` never prints the private key.
#[derive(Clone, PartialEq, Eq)]
pub struct EtcdTls {
    /// The CA certificate(s) etcd's certificate must verify against.
    pub ca_pem: Vec<u8>,
    /// This client's certificate and private key, for etcd's
    /// `--client-cert-auth`.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for EtcdTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdTls")
            .field("ca_pem", &format_args!("<{} bytes>", self.ca_pem.len()))
            .field(
                "identity",
                &self.identity.as_ref().map(|_| "<certificate and key>"),
            )
            .finish()
    }
}

impl EtcdTls {
    /// Reads the CA and, for mutual TLS, the client certificate and key.
    ///
    /// # Errors
    ///
    /// [`EtcdError::InvalidOptions`] naming the file that could not be read
    /// or holds no PEM, or a certificate given without its key (or the
    /// reverse).
    pub fn from_files(
        ca: &std::path::Path,
        cert: Option<&std::path::Path>,
        key: Option<&std::path::Path>,
    ) -> Result<EtcdTls, EtcdError> {
        let identity =
            match (cert, key) {
                (Some(cert), Some(key)) => {
                    Some((read_pem("certificate", cert)?, read_pem("key", key)?))
                }
                (None, None) => None,
                (Some(_), None) | (None, Some(_)) => return Err(EtcdError::InvalidOptions(
                    "etcd client certificate: expected both a certificate and its key, found one"
                        .into(),
                )),
            };
        Ok(EtcdTls {
            ca_pem: read_pem("CA", ca)?,
            identity,
        })
    }
}

/// A PEM file's bytes, refused in one line if unreadable or not PEM.
fn read_pem(what: &str, path: &std::path::Path) -> Result<Vec<u8>, EtcdError> {
    let bytes = std::fs::read(path)
        .map_err(|e| EtcdError::InvalidOptions(format!("etcd {what} '{}': {e}", path.display())))?;
    if !bytes.windows(10).any(|w| w == b"-----BEGIN") {
        return Err(EtcdError::InvalidOptions(format!(
            "etcd {what} '{}': expected PEM (-----BEGIN …), found none",
            path.display()
        )));
    }
    Ok(bytes)
}

/// A user of etcd's authentication. The password is never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct EtcdCredentials {
    /// The etcd user.
    pub user: String,
    /// Its password.
    pub password: String,
}

impl std::fmt::Debug for EtcdCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdCredentials")
            .field("user", &self.user)
            .field("password", &"<hidden>")
            .finish()
    }
}

impl EtcdOptions {
    /// Options for `endpoints` with the default prefix, this machine's
    /// hostname and a 10 s TTL.
    pub fn new<S: Into<String>>(endpoints: impl IntoIterator<Item = S>) -> EtcdOptions {
        EtcdOptions {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            prefix: DEFAULT_PREFIX.to_owned(),
            host: hostname(),
            ttl: DEFAULT_TTL,
            tls: None,
            credentials: None,
        }
    }

    /// Splits a comma-separated endpoint list (`--etcd a:2379,b:2379`).
    pub fn split_endpoints(list: &str) -> Vec<String> {
        list.split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(str::to_owned)
            .collect()
    }

    /// Checks the options.
    ///
    /// # Errors
    ///
    /// [`EtcdError::InvalidOptions`] naming the option and what it held.
    pub fn validate(&self) -> Result<(), EtcdError> {
        check_endpoints(&self.endpoints, self.tls.is_some())?;
        record::check_component("host", &self.host)?;
        if self.ttl.is_zero() {
            return Err(EtcdError::InvalidOptions(
                "etcd lease TTL: expected at least 1s, found 0".into(),
            ));
        }
        Ok(())
    }

    /// The endpoints as one string, for messages.
    pub(crate) fn endpoint_list(&self) -> String {
        self.endpoints.join(",")
    }
}

/// Endpoints must be present and agree with the TLS setting: `https://`
/// needs a CA to verify etcd against, and with TLS configured a `http://`
/// endpoint is refused: never a silent fallback to plaintext.
pub(crate) fn check_endpoints(endpoints: &[String], tls: bool) -> Result<(), EtcdError> {
    if endpoints.is_empty() {
        return Err(EtcdError::InvalidOptions(
            "etcd endpoints: expected at least one (host:port), found none".into(),
        ));
    }
    if !tls {
        if let Some(secure) = endpoints.iter().find(|e| e.starts_with("https://")) {
            return Err(EtcdError::InvalidOptions(format!(
                "etcd endpoint '{secure}': https:// needs a CA to verify etcd against (--etcd-ca FILE)"
            )));
        }
    } else if let Some(plain) = endpoints.iter().find(|e| e.starts_with("http://")) {
        return Err(EtcdError::InvalidOptions(format!(
            "etcd endpoint '{plain}': plaintext, but TLS is configured: use https:// (or host:port)"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_output_never_shows_a_private_key_or_a_password() {
        let mut options = EtcdOptions::new(["https://127.0.0.1:2379"]);
        options.tls = Some(EtcdTls {
            ca_pem: b"-----BEGIN CERTIFICATE-----".to_vec(),
            identity: Some((b"CERT".to_vec(), b"PRIVATE-KEY-BYTES".to_vec())),
        });
        options.credentials = Some(EtcdCredentials {
            user: "livereg".into(),
            password: "hunter2".into(),
        });
        let shown = format!("{options:?}");
        assert!(shown.contains("livereg"), "{shown}");
        assert!(
            !shown.contains("PRIVATE-KEY-BYTES") && !shown.contains("hunter2"),
            "{shown}"
        );
    }
}
