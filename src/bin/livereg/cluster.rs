//! Beyond one host: `livereg reap … --etcd ENDPOINTS` publishes the table,
//! `livereg status --cluster --etcd ENDPOINTS` shows every host's.

use crate::{duration, status, Outcome};
use livereg::etcd::{ClusterStatus, EndSink, EtcdOptions, Publisher, DEFAULT_PREFIX};
use livereg::{DropEvent, Table};
use std::process::ExitCode;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// `livereg reap`'s etcd options.
#[derive(clap::Args)]
pub struct PublishArgs {
    /// Publish the table's live registrations to etcd at these endpoints
    /// (comma-separated host:port or URLs), under one lease kept alive at
    /// TTL/3: `<prefix>/<host>/<table>/<instance_id>` → JSON. An outage
    /// never stops reaping; keys are rewritten when etcd returns.
    #[arg(long, value_name = "ENDPOINTS")]
    etcd: Option<String>,
    /// Key prefix.
    #[arg(long, default_value = DEFAULT_PREFIX, requires = "etcd")]
    etcd_prefix: String,
    /// This host's name in the keys (default: the hostname); unique per
    /// cluster.
    #[arg(long, requires = "etcd")]
    host: Option<String>,
    /// Lease TTL: a dead host's keys vanish this long after its last
    /// keep-alive (whole seconds; etcd's minimum is 2s).
    #[arg(long, value_parser = duration::parse, default_value = "10s", requires = "etcd")]
    etcd_ttl: Duration,
}

/// Where a reaper's drop handler sends end reasons: empty until the
/// publisher starts (it starts once the reaper holds the table).
#[derive(Clone, Default)]
pub struct Ends(Arc<OnceLock<EndSink>>);

impl Ends {
    pub fn ended(&self, event: &DropEvent) {
        if let Some(sink) = self.0.get() {
            sink.ended(event);
        }
    }
}

impl PublishArgs {
    /// The publishing options if `--etcd` was given, checked.
    pub fn options(&self) -> Result<Option<EtcdOptions>, String> {
        let Some(endpoints) = &self.etcd else {
            return Ok(None);
        };
        let mut options = EtcdOptions::new(EtcdOptions::split_endpoints(endpoints));
        options.prefix.clone_from(&self.etcd_prefix);
        if let Some(host) = &self.host {
            options.host.clone_from(host);
        }
        options.ttl = self.etcd_ttl;
        options.validate().map_err(|e| e.to_string())?;
        Ok(Some(options))
    }
}

impl Ends {
    /// Starts publishing `table`; its end reasons come through these ends.
    pub fn publish(&self, table: &Table, options: EtcdOptions) -> Result<Publisher, String> {
        let publisher = Publisher::start(table, options).map_err(|e| e.to_string())?;
        let _ = self.0.set(publisher.sink());
        Ok(publisher)
    }
}

/// `livereg status --cluster`'s options.
#[derive(clap::Args)]
pub struct ClusterArgs {
    /// Show every host's registrations from etcd instead of one table.
    #[arg(long, requires = "etcd", conflicts_with_all = ["name", "watch"])]
    cluster: bool,
    /// etcd endpoints (comma-separated host:port or URLs).
    #[arg(long, value_name = "ENDPOINTS", requires = "cluster")]
    etcd: Option<String>,
    /// Key prefix.
    #[arg(long, default_value = DEFAULT_PREFIX, requires = "cluster")]
    etcd_prefix: String,
}

impl ClusterArgs {
    pub fn wanted(&self) -> bool {
        self.cluster
    }

    /// Prints every host's registrations, as text or JSON.
    pub fn show(&self, json: bool) -> Outcome {
        let endpoints = EtcdOptions::split_endpoints(self.etcd.as_deref().unwrap_or_default());
        let cluster = ClusterStatus::fetch(&endpoints, &self.etcd_prefix)?;
        if json {
            out!("{}", serde_json::to_string_pretty(&cluster)?);
        } else {
            out!("{}", render(&cluster).trim_end());
        }
        Ok(ExitCode::SUCCESS)
    }
}

/// The human view: per host its lease, then per table its registrations.
fn render(cluster: &ClusterStatus) -> String {
    let live: usize = cluster.hosts.iter().map(|h| h.live).sum();
    let mut out = format!(
        "etcd {}/: {} host{}, {live} live registration{}{}\n",
        cluster.prefix,
        cluster.hosts.len(),
        plural(cluster.hosts.len()),
        plural(live),
        match cluster.foreign_keys {
            0 => String::new(),
            n => format!(" ({n} other keys under the prefix ignored)"),
        }
    );
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    for host in &cluster.hosts {
        out += &format!(
            "\nhost {}: {} live, lease TTL left {}\n",
            host.host,
            host.live,
            ttl(host.lease_ttl_seconds)
        );
        for table in &host.tables {
            out += &format!(
                "  table '{}' (lease {}, TTL left {})\n",
                table.table,
                table.lease,
                ttl(table.lease_ttl_seconds)
            );
            out += &format!(
                "    {:>12}  {:<20}  {:>8}  {:>5}  {:>12}  {:<18}\n",
                "INSTANCE", "LABEL", "PID", "SLOT", "REGISTERED", "BOOT TOKEN"
            );
            for r in &table.registrations {
                out += &format!(
                    "    {:>12}  {:<20}  {:>8}  {:>5}  {:>12}  {:#018x}\n",
                    r.instance_id,
                    r.label,
                    r.pid,
                    r.slot,
                    format!("{} ago", status::age(now - r.registered_unix_seconds)),
                    r.boot_token
                );
            }
        }
    }
    if cluster.hosts.is_empty() {
        out += "(no host publishes under this prefix)\n";
    }
    out
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

fn ttl(seconds: Option<i64>) -> String {
    match seconds {
        Some(s) => format!("{s}s"),
        None => "none (expired)".to_owned(),
    }
}
