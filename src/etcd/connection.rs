//! Connecting to etcd: the one place the publisher, the cluster read and
//! the watch make a client, so how to reach etcd (endpoints, deadlines,
//! TLS and credentials) is decided once.
//!
//! A client talks to **one** member: the endpoints are tried in turn from
//! a random one, and the first that answers is kept. (A client balanced
//! over every endpoint sends some requests to a member that is down, so a
//! reconnect made of several requests fails more often than not while a
//! member is away: hosts retried for a minute after an etcd leader was
//! killed.) When that member goes, the connection breaks and the next
//! connect finds another; the random start spreads hosts over the members.

use super::options::EtcdOptions;
use etcd_client::{Certificate, Client, ConnectOptions, Identity, TlsOptions};
use std::time::Duration;

/// A client of the first member of `options`' endpoints (from a random one)
/// that answers, over TLS and as its user where they say so: the
/// connection, and every request on it, time out after `timeout`.
///
/// # Errors
///
/// The last member's error when none answers (unreachable, a certificate
/// that does not verify, refused credentials).
pub(super) async fn connect(
    options: &EtcdOptions,
    timeout: Duration,
) -> Result<Client, etcd_client::Error> {
    let count = options.endpoints.len();
    let first = crate::os::random::random_u64().unwrap_or(0) as usize % count.max(1);
    let mut last_error = etcd_client::Error::InvalidArgs("no etcd endpoint".into());
    for endpoint in options.endpoints.iter().cycle().skip(first).take(count) {
        match connect_one(options, endpoint, timeout).await {
            Ok(client) => return Ok(client),
            Err(error) => last_error = error,
        }
    }
    Err(last_error)
}

/// A client of `endpoint` once it has answered a status request (with
/// credentials, its authentication).
async fn connect_one(
    options: &EtcdOptions,
    endpoint: &str,
    timeout: Duration,
) -> Result<Client, etcd_client::Error> {
    // Every request and stream says it needs a leader (etcd's `hasleader`
    // metadata): a member cut off from its leader refuses requests, and
    // cancels watches, rather than answering from its own store, which
    // misses what the majority commits.
    let mut connect = ConnectOptions::new()
        .with_connect_timeout(timeout)
        .with_timeout(timeout)
        .with_require_leader(true);
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
    let mut client = Client::connect([endpoint], Some(connect)).await?;
    client.status().await?;
    Ok(client)
}
