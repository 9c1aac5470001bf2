//! Connecting to etcd: the one place the publisher and the cluster read
//! make a client, so how to reach etcd (endpoints, deadlines, and later TLS
//! and credentials) is decided once.

use etcd_client::{Client, ConnectOptions};
use std::time::Duration;

/// A client for `endpoints`: the connection, and every request on it, time
/// out after `timeout`.
///
/// # Errors
///
/// The client's error when no endpoint answers.
pub(super) async fn connect(
    endpoints: &[String],
    timeout: Duration,
) -> Result<Client, etcd_client::Error> {
    let options = ConnectOptions::new()
        .with_connect_timeout(timeout)
        .with_timeout(timeout);
    Client::connect(endpoints, Some(options)).await
}
