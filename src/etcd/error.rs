//! What can go wrong talking to etcd, each error on one line with its
//! causes.

use std::time::Duration;

/// What can go wrong talking to etcd.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EtcdError {
    /// An option broke the contract (empty endpoint list, a host with `/`).
    #[error("{0}")]
    InvalidOptions(String),
    /// etcd refused or did not answer (the message follows the client
    /// error's causes, e.g. why a certificate did not verify).
    #[error("etcd at {endpoints}: {context}: {}", causes(source))]
    Etcd {
        /// The endpoints asked.
        endpoints: String,
        /// What was being done.
        context: String,
        /// The client's error.
        #[source]
        source: etcd_client::Error,
    },
    /// etcd did not answer in time.
    #[error("etcd at {endpoints}: {context}: no answer within {timeout:?}")]
    Timeout {
        /// The endpoints asked.
        endpoints: String,
        /// What was being done.
        context: String,
        /// How long it waited.
        timeout: Duration,
    },
    /// etcd ended or canceled a watch (it is opened again on the next
    /// read).
    #[error("etcd at {endpoints}: {why}")]
    WatchBroke {
        /// The endpoints asked.
        endpoints: String,
        /// What etcd did.
        why: String,
    },
    /// The publisher is stopping: it sends no more requests.
    #[error("the etcd publisher is stopping")]
    Stopped,
    /// The table could not be read.
    #[error(transparent)]
    Table(#[from] crate::error::Error),
    /// The publisher's thread or runtime could not start.
    #[error("etcd publisher: {0}")]
    Io(#[from] std::io::Error),
}

/// An error and its causes on one line (`a: b: c`), without repeats.
fn causes(error: &dyn std::error::Error) -> String {
    let mut line = error.to_string();
    let mut next = error.source();
    while let Some(cause) = next {
        let text = cause.to_string();
        if !line.contains(&text) {
            line = format!("{line}: {text}");
        }
        next = cause.source();
    }
    line
}
