//! The etcd options `reap` and `status --cluster` share, parsed in every
//! build: a `livereg` built without etcd still names them, and refuses them
//! in one line saying how to get them.

use std::path::PathBuf;
use std::time::Duration;

/// Where etcd is, and how to reach it: TLS and credentials (the password
/// from a file or the environment, never from argv, which is public).
#[derive(clap::Args)]
pub struct EtcdArgs {
    /// etcd endpoints (comma-separated host:port or URLs; https:// needs
    /// --etcd-ca).
    #[arg(long, value_name = "ENDPOINTS")]
    pub etcd: Option<String>,
    /// Key prefix [default: /livereg].
    #[arg(long, value_name = "PREFIX", requires = "etcd")]
    pub etcd_prefix: Option<String>,
    /// TLS: the CA (PEM) etcd's certificate must verify against.
    #[arg(long, value_name = "FILE", requires = "etcd")]
    pub etcd_ca: Option<PathBuf>,
    /// Mutual TLS: this client's certificate (PEM), with --etcd-key.
    #[arg(long, value_name = "FILE", requires_all = ["etcd_ca", "etcd_key"])]
    pub etcd_cert: Option<PathBuf>,
    /// Mutual TLS: this client's private key (PEM), with --etcd-cert.
    #[arg(long, value_name = "FILE", requires_all = ["etcd_ca", "etcd_cert"])]
    pub etcd_key: Option<PathBuf>,
    /// etcd authentication: the user; its password comes from
    /// --etcd-password-file or LIVEREG_ETCD_PASSWORD.
    #[arg(long, value_name = "NAME", requires = "etcd")]
    pub etcd_user: Option<String>,
    /// The file holding --etcd-user's password (one line).
    #[arg(long, value_name = "FILE", requires = "etcd_user")]
    pub etcd_password_file: Option<PathBuf>,
}

/// The environment variable that may hold `--etcd-user`'s password.
#[cfg_attr(not(feature = "etcd"), allow(dead_code))]
pub const PASSWORD_ENV: &str = "LIVEREG_ETCD_PASSWORD";

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
    #[arg(long, value_parser = crate::support::duration::parse, requires = "etcd")]
    pub etcd_ttl: Option<Duration>,
}

/// What a `livereg` built without the `etcd` feature answers to `--etcd`.
#[cfg_attr(feature = "etcd", allow(dead_code))]
pub const MISSING: &str = "this livereg was built without etcd support (cargo feature `etcd`); \
build it in with `cargo install --path cli --features etcd` from a livereg checkout \
(the etcd client's build needs protoc: `apt-get install protobuf-compiler`)";
