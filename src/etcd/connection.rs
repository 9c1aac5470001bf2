//! Connecting to etcd: the one place the publisher and the cluster read
//! make a client, so how to reach etcd (endpoints, deadlines, TLS and
//! credentials) is decided once.

use super::EtcdOptions;
use etcd_client::{Certificate, Client, ConnectOptions, Identity, TlsOptions};
use std::time::Duration;

/// A client for `options`' endpoints, over TLS and as its user where they
/// say so: the connection, and every request on it, time out after
/// `timeout`.
///
/// # Errors
///
/// The client's error when no endpoint answers, a certificate does not
/// verify, or etcd refuses the credentials.
pub(super) async fn connect(
    options: &EtcdOptions,
    timeout: Duration,
) -> Result<Client, etcd_client::Error> {
    let mut connect = ConnectOptions::new()
        .with_connect_timeout(timeout)
        .with_timeout(timeout);
    if let Some(tls) = &options.tls {
        let mut config = TlsOptions::new().ca_certificate(Certificate::from_pem(&tls.ca_pem));
        if let Some((cert, key)) = &tls.identity {
            config = config.identity(Identity::from_pem(cert, key));
        }
        connect = connect.with_tls(config);
    }
    if let Some(credentials) = &options.credentials {
        connect = connect.with_user(&credentials.user, &credentials.password);
    }
    Client::connect(&options.endpoints, Some(connect)).await
}
