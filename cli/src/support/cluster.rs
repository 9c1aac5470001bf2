//! Beyond one host: `livereg reap … --etcd ENDPOINTS` publishes the table,
//! `livereg status --cluster --etcd ENDPOINTS` shows every host's, and with
//! `--watch` follows them, one line per change.

use crate::support::duration::age;
use crate::support::etcd_args::{EtcdArgs, PublishArgs, PASSWORD_ENV};
use crate::support::outcome::Outcome;
use crate::support::signals;
use livereg::etcd::{
    ClusterChange, ClusterEvent, ClusterRecord, ClusterStatus, ClusterWatch, EndSink,
    EtcdCredentials, EtcdOptions, EtcdTls, Publisher, DEFAULT_PREFIX,
};
use livereg::{DropEvent, Table};
use std::io::Write;
use std::process::ExitCode;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Where a reaper's drop handler sends end reasons. The publisher starts
/// once the reaper holds the table, and the reaper's first scan may end
/// registrations before that: their reasons wait here (at most
/// [`EARLY_ENDS`]) and are handed over when the publisher starts.
#[derive(Clone, Default)]
pub struct Ends(Arc<EndsInner>);

#[derive(Default)]
struct EndsInner {
    sink: OnceLock<EndSink>,
    early: Mutex<Vec<DropEvent>>,
}

/// End reasons kept for a publisher that has not started yet.
const EARLY_ENDS: usize = 4096;

impl Ends {
    pub fn new() -> Ends {
        Ends::default()
    }

    pub fn ended(&self, event: &DropEvent) {
        let mut early = self.0.early.lock().unwrap_or_else(PoisonError::into_inner);
        match self.0.sink.get() {
            Some(sink) => sink.ended(event),
            None if early.len() < EARLY_ENDS => early.push(event.clone()),
            None => {}
        }
    }

    /// Whether the publisher holds a lease on a reachable etcd; `None` while
    /// none publishes.
    pub fn etcd_connected(&self) -> Option<bool> {
        self.0.sink.get().map(EndSink::is_connected)
    }

    /// Sends every end that came before the publisher to `sink`, and every
    /// later one straight there.
    fn hand_over(&self, sink: EndSink) {
        let mut early = self.0.early.lock().unwrap_or_else(PoisonError::into_inner);
        for event in early.drain(..) {
            sink.ended(&event);
        }
        let _ = self.0.sink.set(sink);
    }
}

/// `livereg reap --etcd …`'s checked options, before the reaper role is
/// taken.
pub struct Publishing(EtcdOptions);

/// A running publisher.
pub type Running = Publisher;

impl Publishing {
    /// The publishing options if `--etcd` was given, checked.
    pub fn checked(args: &PublishArgs) -> Result<Option<Publishing>, String> {
        if args.etcd.etcd.is_none() {
            return Ok(None);
        }
        let mut options = etcd_options(&args.etcd)?;
        if let Some(host) = &args.host {
            options.host.clone_from(host);
        }
        if let Some(ttl) = args.etcd_ttl {
            options.ttl = ttl;
        }
        options.validate().map_err(|e| e.to_string())?;
        Ok(Some(Publishing(options)))
    }

    /// Starts publishing `table`; its end reasons come through `ends`.
    pub fn start(self, table: &Table, ends: &Ends) -> Result<Running, String> {
        let publisher = Publisher::start(table, self.0).map_err(|e| e.to_string())?;
        ends.hand_over(publisher.sink());
        Ok(publisher)
    }
}

/// `livereg status --cluster`: prints every host's registrations, as text or
/// JSON.
pub fn show(args: &EtcdArgs, json: bool) -> Outcome {
    let cluster = ClusterStatus::fetch(&etcd_options(args)?)?;
    if json {
        out!("{}", serde_json::to_string_pretty(&cluster)?);
    } else {
        out!("{}", render(&cluster).trim_end());
    }
    Ok(ExitCode::SUCCESS)
}

/// How often `--watch` looks for Ctrl-C while no change comes.
const SIGNAL_POLL: Duration = Duration::from_millis(100);

/// `livereg status --cluster --watch`: the live registrations, then one
/// line per change (`--json`: one object per line) until SIGINT, SIGTERM
/// or a closed stdout. etcd going away is said once on stderr, and its
/// return; the watch resumes where it stopped.
pub fn follow(args: &EtcdArgs, json: bool) -> Outcome {
    signals::catch_termination();
    let mut fleet = ClusterWatch::start(&etcd_options(args)?)?;
    let mut lines = Vec::new();
    if !json {
        let hosts: std::collections::BTreeSet<&str> =
            fleet.live().map(|r| r.host.as_str()).collect();
        lines.push(format!(
            "{}  etcd {}/ at revision {}: {} host{}, {} live registration{} (Ctrl-C to stop)",
            time_of_day(),
            args.etcd_prefix
                .as_deref()
                .unwrap_or(DEFAULT_PREFIX)
                .trim_end_matches('/'),
            fleet.revision(),
            hosts.len(),
            plural(hosts.len()),
            fleet.live().count(),
            plural(fleet.live().count())
        ));
    }
    for record in fleet.live() {
        lines.push(if json {
            // Shaped as a change is: revision, event, record.
            format!(
                r#"{{"revision":{},"event":"live","record":{}}}"#,
                fleet.revision(),
                serde_json::to_string(record)?
            )
        } else {
            format!("{}  live        {}", time_of_day(), describe(record))
        });
    }
    if !print(&lines) {
        return Ok(ExitCode::SUCCESS);
    }
    let mut away = false;
    while signals::take().is_none() {
        let line = match fleet.next(SIGNAL_POLL) {
            Ok(None) => continue,
            Ok(Some(change)) => {
                if std::mem::take(&mut away) {
                    note!("etcd: following again from revision {}", fleet.revision());
                }
                if json {
                    serde_json::to_string(&change)?
                } else {
                    render_change(&change)
                }
            }
            Err(error) => {
                if !std::mem::replace(&mut away, true) {
                    note!("{error} (retrying; nothing is lost while away)");
                }
                continue;
            }
        };
        if !print(&[line]) {
            break;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Writes the lines to stdout; false once nobody reads it.
fn print(lines: &[String]) -> bool {
    let mut stdout = std::io::stdout().lock();
    lines.iter().all(|line| writeln!(stdout, "{line}").is_ok()) && stdout.flush().is_ok()
}

/// One change as a line: the time it was read, its revision, what happened.
fn render_change(change: &ClusterChange) -> String {
    let what = match &change.event {
        ClusterEvent::Registered { record } => format!("registered  {}", describe(record)),
        ClusterEvent::Ended { record } => format!(
            "ended       {}/{}/{}  {}",
            record.host,
            record.table,
            record.instance_id,
            record
                .ended
                .map_or("(no reason published)".to_owned(), |r| r.to_string())
        ),
        ClusterEvent::Dying { record } => format!(
            "dying       {}/{}/{}  (its process began to exit)",
            record.host, record.table, record.instance_id
        ),
        ClusterEvent::HostGone { host, records } => format!(
            "host gone   {host}  (its lease expired; {} registration{}: {})",
            records.len(),
            plural(records.len()),
            records
                .iter()
                .map(|r| format!("{}/{}", r.table, r.instance_id))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    format!("{}  rev {}  {what}", time_of_day(), change.revision)
}

/// `host/table/id  label 'L'  pid P  slot S gen G`.
fn describe(r: &ClusterRecord) -> String {
    format!(
        "{}/{}/{}  label '{}'  pid {}  slot {} gen {}",
        r.host, r.table, r.instance_id, r.label, r.pid, r.slot, r.generation
    )
}

/// The wall-clock time of day, UTC, `HH:MM:SS.mmm`.
fn time_of_day() -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let seconds = now.as_secs();
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        seconds / 3600 % 24,
        seconds / 60 % 60,
        seconds % 60,
        now.subsec_millis()
    )
}

/// How to reach etcd, from the shared options: endpoints, prefix, TLS
/// files and credentials (the password from its file or the environment).
fn etcd_options(args: &EtcdArgs) -> Result<EtcdOptions, String> {
    let endpoints = EtcdOptions::split_endpoints(args.etcd.as_deref().unwrap_or_default());
    let mut options = EtcdOptions::new(endpoints);
    options.prefix = args
        .etcd_prefix
        .clone()
        .unwrap_or_else(|| DEFAULT_PREFIX.to_owned());
    if let Some(ca) = &args.etcd_ca {
        let tls = EtcdTls::from_files(ca, args.etcd_cert.as_deref(), args.etcd_key.as_deref());
        options.tls = Some(tls.map_err(|e| e.to_string())?);
    }
    if let Some(user) = &args.etcd_user {
        options.credentials = Some(EtcdCredentials {
            user: user.clone(),
            password: password(args)?,
        });
    }
    options.validate().map_err(|e| e.to_string())?;
    Ok(options)
}

/// `--etcd-user`'s password: from `--etcd-password-file` (its first line),
/// else from the environment.
fn password(args: &EtcdArgs) -> Result<String, String> {
    match &args.etcd_password_file {
        Some(file) => std::fs::read_to_string(file)
            .map(|text| text.lines().next().unwrap_or_default().to_owned())
            .map_err(|e| format!("--etcd-password-file '{}': {e}", file.display())),
        None => std::env::var(PASSWORD_ENV).map_err(|_| {
            format!("--etcd-user: expected a password in --etcd-password-file or {PASSWORD_ENV}, found neither")
        }),
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
                    format!("{} ago", age(now - r.registered_unix_seconds)),
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
