//! The etcd options `reap` and `status --cluster` share, parsed in every
//! build: a `livereg` built without etcd still names them, and refuses them
//! in one line saying how to get them.

use std::time::Duration;

/// Where etcd is.
#[derive(clap::Args)]
pub struct EtcdArgs {
    /// etcd endpoints (comma-separated host:port or URLs).
    #[arg(long, value_name = "ENDPOINTS")]
    pub etcd: Option<String>,
    /// Key prefix [default: /livereg].
    #[arg(long, value_name = "PREFIX", requires = "etcd")]
    pub etcd_prefix: Option<String>,
}

/// `livereg reap`'s publishing options: where, and as which host.
#[derive(clap::Args)]
pub struct PublishArgs {
    /// Publish the table's live registrations to etcd under one lease kept
    /// alive at TTL/3: `<prefix>/<host>/<table>/<instance_id>` → JSON. An
    /// outage never stops reaping; keys are rewritten when etcd returns.
    #[command(flatten)]
    pub etcd: EtcdArgs,
    /// This host's name in the keys (default: the hostname); unique per
    /// cluster.
    #[arg(long, requires = "etcd")]
    pub host: Option<String>,
    /// Lease TTL: a dead host's keys vanish this long after its last
    /// keep-alive (whole seconds; etcd's minimum is 2s) [default: 10s].
    #[arg(long, value_parser = crate::duration::parse, requires = "etcd")]
    pub etcd_ttl: Option<Duration>,
}

/// What a `livereg` built without the `etcd` feature answers to `--etcd`.
#[cfg_attr(feature = "etcd", allow(dead_code))]
pub const MISSING: &str = "this livereg was built without etcd support (cargo feature `etcd`); \
build it in with `cargo install --path . --features etcd` from a livereg checkout \
(the etcd client's build needs protoc: `apt-get install protobuf-compiler`)";
