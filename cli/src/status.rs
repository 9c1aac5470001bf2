//! `livereg status NAME [--json | --format F | --watch [D]]`, or
//! `livereg status --cluster --etcd ENDPOINTS [--json] [--watch]`

use crate::support::cluster;
use crate::support::duration::{self, age};
use crate::support::etcd_args::EtcdArgs;
use crate::support::outcome::Outcome;
use crate::support::signals;
use crate::support::target::SessionArgs;
use livereg::{Address, Reason, RegistrationState, RegistrationStatus, Status, Table};
use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

#[derive(clap::Args)]
pub struct Args {
    /// Table name, or a reaper's listener (`unix:PATH`, `tcp://HOST:PORT`)
    /// from a process that cannot map the table (the table's summary; its
    /// registrations are listed on the reaper's host).
    #[arg(required_unless_present = "cluster", conflicts_with = "etcd")]
    name: Option<String>,
    /// Print one JSON object instead of the table (as `--format json`;
    /// with `--cluster --watch`, one object per line).
    #[arg(long, conflicts_with = "format")]
    json: bool,
    /// `text` (the table), `json`, or `openmetrics` (for node_exporter's
    /// textfile collector; ends in `# EOF`).
    #[arg(long, value_enum, default_value = "text", conflicts_with = "watch")]
    format: Format,
    /// Redraw every D (default: the table's scan interval) until
    /// interrupted, marking registrations that ended since the last frame.
    /// With `--cluster`: follow etcd, one line per change as it comes.
    #[arg(long, value_name = "D", num_args = 0..=1, value_parser = duration::parse)]
    watch: Option<Option<Duration>>,
    /// Show every host's registrations from etcd instead of one table.
    #[arg(long, requires = "etcd")]
    cluster: bool,
    #[command(flatten)]
    token: SessionArgs,
    #[command(flatten)]
    etcd: EtcdArgs,
}

pub fn run(args: Args) -> Outcome {
    if args.cluster {
        if args.format == Format::Openmetrics {
            return Err("status --cluster: expected --format text or json, found openmetrics (metrics are per table: `livereg status NAME --format openmetrics` on each host)".into());
        }
        let json = args.json || args.format == Format::Json;
        return match args.watch {
            None => cluster::show(&args.etcd, json),
            Some(None) => cluster::follow(&args.etcd, json),
            Some(Some(_)) => Err("status --cluster --watch: follows each change as etcd tells it; expected no interval, found one".into()),
        };
    }
    if args.json && args.watch.is_some() {
        return Err("status --watch redraws the table on a terminal; expected --json only with --cluster --watch (one object per change) or without --watch".into());
    }
    let name = args.name.as_deref().unwrap_or_default();
    if Address::is_address(name) {
        return remote(name, &args);
    }
    let table = Table::open(name)?;
    if let Some(every) = args.watch {
        return watch(&table, every.unwrap_or_else(|| table.scan_interval()));
    }
    match (args.json, args.format) {
        (true, _) | (false, Format::Json) => {
            out!("{}", serde_json::to_string_pretty(&table.status()?)?)
        }
        (false, Format::Text) => out!("{}", render(&table.status()?).trim_end()),
        (false, Format::Openmetrics) => out!("{}", table.metrics_text()?.trim_end()),
    }
    Ok(ExitCode::SUCCESS)
}

/// `status ADDRESS`: the summary the listener answers with.
fn remote(address: &str, args: &Args) -> Outcome {
    if args.watch.is_some() || args.format == Format::Openmetrics {
        return Err(format!(
            "status {address}: over an address, expected text or --json (watch and metrics need the table: run them on the reaper's host)"
        )
        .into());
    }
    let options = args.token.options()?;
    let status = livereg::remote_status(address, None, &options)?;
    if args.json || args.format == Format::Json {
        out!("{}", serde_json::to_string_pretty(&status)?);
    } else {
        out!("{}", header(&status).trim_end());
        out!("(registrations are listed on the reaper's host: `livereg status TABLE` there, or `livereg probe {address} --instance N` for one)");
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Format {
    Text,
    Json,
    Openmetrics,
}

/// What a frame remembers of a registration to tell, in the next frame,
/// that it ended: its line's fields.
type Seen = BTreeMap<(u32, u32), (u64, String, u32)>;

/// Redraws the view every `every` until SIGINT or SIGTERM: the screen is
/// cleared, the frame's time and each reason's count since the last frame
/// head it, and registrations that ended since then are listed in bold red.
fn watch(table: &Table, every: Duration) -> Outcome {
    signals::catch_termination();
    let every = every.max(Duration::from_millis(10));
    let mut seen = Seen::new();
    let mut ended_before: Option<BTreeMap<Reason, u64>> = None;
    while signals::take().is_none() {
        let status = table.status()?;
        let live: Seen = status
            .registrations
            .iter()
            .filter(|r| r.state != RegistrationState::Ending)
            .map(|r| {
                (
                    (r.slot, r.generation),
                    (r.instance_id, r.label.clone(), r.pid),
                )
            })
            .collect();
        let mut frame = format!(
            "\x1b[H\x1b[2J{}  every {}  (Ctrl-C to stop)\n",
            wall_clock(),
            duration::show(every)
        );
        let counts: Vec<String> = status
            .ended
            .iter()
            .filter_map(|(reason, n)| {
                let before = ended_before.as_ref().map_or(*n, |b| b[reason]);
                (*n > before).then(|| format!("{reason} +{}", n - before))
            })
            .collect();
        if !counts.is_empty() {
            frame += &format!(
                "\x1b[1;31mended since the last frame: {}\x1b[0m\n",
                counts.join(", ")
            );
        }
        for (key, (instance, label, pid)) in &seen {
            if !live.contains_key(key) {
                frame += &format!(
                    "\x1b[1;31mENDED  instance {instance} ({label}{}pid {pid}, slot {})\x1b[0m\n",
                    if label.is_empty() { "" } else { ", " },
                    key.0
                );
            }
        }
        frame += "\n";
        frame += &render(&status);
        out!("{}", frame.trim_end());
        seen = live;
        ended_before = Some(status.ended);
        let next = Instant::now() + every;
        while let Some(left) = next.checked_duration_since(Instant::now()) {
            if signals::pending() {
                break;
            }
            std::thread::sleep(left.min(SIGNAL_POLL));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// How often `--watch` looks for Ctrl-C between frames.
const SIGNAL_POLL: Duration = Duration::from_millis(50);

/// The wall-clock time of day, UTC, `HH:MM:SS`.
fn wall_clock() -> String {
    let seconds = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format!(
        "{:02}:{:02}:{:02} UTC",
        seconds / 3600 % 24,
        seconds / 60 % 60,
        seconds % 60
    )
}

/// The human view: a header block, then one line per registration.
pub fn render(status: &Status) -> String {
    let mut out = header(status);
    out += &format!(
        "{:>5}  {:>12}  {:<20}  {:>8}  {:<22}  {:>10}  {:>10}  {:>10}  {:<16}\n",
        "SLOT", "INSTANCE", "LABEL", "PID", "STATE", "LAST BEAT", "BEATS", "REGISTERED", "PROGRESS"
    );
    for r in &status.registrations {
        out += &line(r);
    }
    if status.registrations.is_empty() {
        out += "(no registrations)\n";
    }
    if let Some(owned) = &status.owned_files {
        out += &owned_files(owned);
    }
    out
}

/// The files processes own: one line for the table, one per owner.
fn owned_files(owned: &livereg::OwnedFilesStatus) -> String {
    let dirs: Vec<String> = owned.dirs.iter().map(|d| d.display().to_string()).collect();
    let dirs = match (&owned.dirs_refused, dirs.is_empty()) {
        (Some(refused), _) => format!("none allowed: {refused}"),
        (None, true) => "none allowed".to_owned(),
        (None, false) => format!("in {}", dirs.join(", ")),
    };
    let mut out = format!(
        "\nowned files ({dirs}): {} removed ({} freed), {} refused\n",
        owned.removed_total,
        mib(owned.freed_bytes_total),
        owned.refused_total
    );
    for owner in &owned.owners {
        out += &format!(
            "  pid {:>8}: {} files, {} ({} held){}\n",
            owner.pid,
            owner.files,
            mib(owner.bytes),
            mib(owner.held_bytes),
            if owner.ended {
                ", ended: removed at the reaper's next round"
            } else {
                ""
            }
        );
    }
    out
}

/// Bytes, in MiB past one.
fn mib(bytes: u64) -> String {
    match bytes {
        0..1_048_576 => format!("{bytes} B"),
        _ => format!("{:.1} MiB", bytes as f64 / 1_048_576.0),
    }
}

/// The header block: the table's settings, its reaper, what ended.
fn header(status: &Status) -> String {
    let ended: Vec<String> = status
        .ended
        .iter()
        .map(|(reason, n)| format!("{reason} {n}"))
        .collect();
    let progress = if status.progress_timeout_seconds > 0.0 {
        format!(
            ", progress timeout {}",
            age(status.progress_timeout_seconds)
        )
    } else {
        String::new()
    };
    let stamps = if status.stamp_resolution_seconds > 0.0 {
        format!(
            ", beats on the coarse clock ({} ticks: evictions up to {} later)",
            age(status.stamp_resolution_seconds),
            age(status.stamp_resolution_seconds * f64::from(livereg::STAMP_LAG_TICKS))
        )
    } else {
        String::new()
    };
    let dying = status
        .registrations
        .iter()
        .filter(|r| r.state == RegistrationState::Dying)
        .count();
    let dying = match dying {
        0 => String::new(),
        n => format!(" ({n} dying: their processes are exiting)"),
    };
    format!(
        "table '{}': {}/{} slots live{dying}, timeout {}, grace {}{progress}, scan every {}{stamps}\n\
         reaper: {}\n\
         ended: {} (total {}), handler failures {}, handlers overdue {}, corrupt slots {}\n\n",
        status.table,
        status.tracked_instances,
        status.capacity,
        age(status.reap_timeout_seconds),
        age(status.registration_grace_seconds),
        age(status.scan_interval_seconds),
        reaper(status),
        ended.join(", "),
        status.ended_total,
        status.handler_failures,
        status.handlers_overdue,
        status.corrupt_slots,
    )
}

/// The reaper in a few words: alive, stalled, or none.
fn reaper(status: &Status) -> String {
    let last_scan = status
        .reaper_heartbeat_age_seconds
        .map_or("never".to_owned(), |seconds| {
            format!("{} ago", age(seconds))
        });
    if status.reaper_stalled {
        format!(
            "STALLED (pid {} holds the table but its last scan was {last_scan}: a handler stuck, or the process stopped)",
            status.reaper_pid,
        )
    } else if status.reaper_alive {
        format!(
            "alive (pid {}, boot token {:#018x}, last scan {last_scan})",
            status.reaper_pid, status.boot_token,
        )
    } else {
        format!("NONE ALIVE (registrations are not being reaped; last scan {last_scan})")
    }
}

/// One registration's line.
fn line(r: &RegistrationStatus) -> String {
    let state = match r.ended_reason {
        Some(reason) => format!("ending ({reason})"),
        None => r.state.as_str().to_owned(),
    };
    // Another time namespace's stamps have no age on this clock.
    let foreign = r.registered_age_seconds.is_none();
    let last = match r.last_heartbeat_age_seconds {
        Some(s) => format!("{} ago", age(s)),
        None if foreign && r.heartbeats > 0 => "other clock".into(),
        None => "never".into(),
    };
    let registered = r
        .registered_age_seconds
        .map(|s| format!("{} ago", age(s)))
        .unwrap_or_else(|| "other clock".into());
    let progress = match (r.busy, r.last_progress_age_seconds) {
        (false, _) => "idle".to_owned(),
        (true, Some(quiet)) => format!("busy, {} quiet", age(quiet)),
        (true, None) => "busy".to_owned(),
    };
    // A session: its connection, and the host its client reported.
    let remote = r.remote.as_ref().map_or(String::new(), |remote| {
        let away = if remote.connected {
            ""
        } else {
            ", away: reclaim pending"
        };
        format!(
            "  session from {} (host {}{away})",
            remote.peer, remote.host
        )
    });
    let row = format!(
        "{:>5}  {:>12}  {:<20}  {:>8}  {:<22}  {:>10}  {:>10}  {:>10}  {:<16}{remote}",
        r.slot, r.instance_id, r.label, r.pid, state, last, r.heartbeats, registered, progress,
    );
    row.trim_end().to_owned() + "\n"
}
